"""Running ``verde-chain`` as a user does (a subprocess) and checking how it refuses mistakes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, cwd: Path = REPO, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m verde_chain.cli ARGS`` with the repository on the path (from any directory)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "verde_chain.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, check=False, env=env)


def assert_refused(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    """A mistake answered the way the CLI promises: a non-zero status, no traceback, and ONE line
    on stderr that says each of ``needles``; returns that line."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stderr + r.stdout, r.stderr[-3000:]
    assert len(lines) == 1, r.stderr[-3000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]
