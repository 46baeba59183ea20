"""A build killed mid-way must not block later loads (torch's lock file outlives its holder)."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import textwrap
from pathlib import Path

from verde_chain.repops.backends.build_lock import OS_LOCK, TORCH_BATON, exclusive_build
from verde_chain.repops.backends.cpu import extension

REPO = Path(__file__).resolve().parents[2]


def test_a_stale_torch_lock_file_does_not_block_the_next_load() -> None:
    extension.extension("scalar")  # built (or found) once, so the child only loads
    # What a killed first build leaves: torch's baton file, with nobody left to remove it.
    baton = extension.build_dir("scalar") / TORCH_BATON
    baton.touch()
    child = textwrap.dedent("""
        from verde_chain.repops.backends.cpu import extension
        import torch
        x = torch.ones(3, 3)
        print(extension.matmul(x, x, isa="scalar")[0, 0].item())
    """)
    # Without the OS lock torch's loader polls the stale file forever: the timeout fails the test.
    out = subprocess.run([sys.executable, "-c", child], check=False, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "3.0"
    assert not baton.exists()


def test_the_os_lock_is_exclusive_and_dies_with_its_holder(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import time
            from pathlib import Path
            from verde_chain.repops.backends.build_lock import exclusive_build
            with exclusive_build(Path({str(tmp_path)!r})):
                print("held", flush=True)
                time.sleep(600)
        """)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with open(tmp_path / OS_LOCK, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                raise AssertionError("a second process took the build lock while the first held it")
            except BlockingIOError:
                pass
        holder.kill()  # a killed build: no finally block runs
        holder.wait()
        (tmp_path / TORCH_BATON).touch()
        with exclusive_build(tmp_path):  # returns at once: the kernel released the dead holder's lock
            assert not (tmp_path / TORCH_BATON).exists()
    finally:
        holder.kill()
