"""One native build at a time per build directory, with a lock that cannot outlive its holder.

``torch.utils.cpp_extension.load`` guards a build directory with a lock FILE (``lock``, torch's
``FileBaton``): the first process creates it, the others poll until it disappears. A build that
is killed (Ctrl-C during the first compile, a CI timeout, an OOM kill) leaves the file behind,
and every later load of that extension then waits forever with no message. We take an OS lock
(``fcntl.flock``) on a sibling file around the whole load instead: the kernel drops it when its
holder dies, so a process holding it knows that no other verde_chain process is building here and
that any ``lock`` file it finds is stale.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

TORCH_BATON = "lock"
OS_LOCK = ".build.flock"


@contextmanager
def exclusive_build(build_dir: Path) -> Iterator[None]:
    """Hold ``build_dir``'s OS lock; remove a ``lock`` file a killed build left there."""
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / OS_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released by close, or by the kernel if we die
        try:
            (build_dir / TORCH_BATON).unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
