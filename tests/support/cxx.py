"""g++ syntax checks of the native sources, for tests that prove what a build would say without
building (a missing switch case, a flag an older torch's cpp_extension would not pass)."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from collections.abc import Sequence
from pathlib import Path

import pytest


def torch_includes() -> tuple[Path, ...]:
    """The header folders cpp_extension compiles an extension against: torch's and Python's."""
    from torch.utils import cpp_extension

    return (*[Path(p) for p in cpp_extension.include_paths()], Path(sysconfig.get_paths()["include"]))


def syntax_check(source: Path, flags: Sequence[str], includes: Sequence[Path] = (),
                 system: Sequence[Path] = ()) -> subprocess.CompletedProcess[str]:
    """``g++ -fsyntax-only <flags>`` on ``source``; ``system`` folders as system headers (their own
    warnings are not ours). Skips the test where there is no g++."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not installed")
    cmd = [gxx, "-fsyntax-only", *flags, *[f"-I{p}" for p in includes], *[f"-isystem{p}" for p in system],
           str(source)]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
