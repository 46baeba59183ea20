"""``--workers W`` on one host: start W processes of the same command as ranks of a gloo group.

Each worker gets torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT`` a free port), so a worker is exactly what torchrun
would start (across hosts, torchrun does this instead: docs/distributed.md). Rank 0 writes to
this process's stdout, the others' stdout is dropped; every rank's stderr is passed through.

A worker that dies stops the run: the others fail in their next collective and exit with
``PEER_LOST_STATUS``, this launcher stops whatever still runs and raises ``WorkerLostError``
naming the first rank that failed and how (signal or exit status), and where the run can resume
from. A rank that exited with ``PEER_LOST_STATUS`` only noticed the loss (it can leave before the
launcher has seen the lost rank go), so it is named only when no rank failed otherwise.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from verde_chain.graph.distributed import PEER_LOST_STATUS, WorkerLostError
from verde_chain.ports import free_port

GRACE_S = 20.0  # how long the other ranks get to notice a lost peer before they are stopped


def _how(rc: int) -> str:
    if rc < 0:
        try:
            return f"was killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with status {rc}"


def launch(cmd: Sequence[str], workers: int, resume_hint: str = "") -> None:
    """Run ``cmd`` (an argv) as ``workers`` ranks and wait for all of them; returns when every
    rank exited with status 0, else raises ``WorkerLostError``."""
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    for r in range(workers):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(workers), LOCAL_WORLD_SIZE=str(workers),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(list(cmd), env=env, stdout=None if r == 0 else subprocess.DEVNULL))
    print(f"started {workers} workers: " + ", ".join(f"rank {r} pid {p.pid}" for r, p in enumerate(procs)),
          file=sys.stderr, flush=True)
    cause: tuple[int, int] | None = None  # (rank, status) of the first rank that failed on its own
    deadline: float | None = None  # set by the first failure of any kind
    try:
        while any(p.poll() is None for p in procs):
            for r, p in enumerate(procs):
                rc = p.poll()
                if rc in (None, 0):
                    continue
                if deadline is None:
                    deadline = time.monotonic() + GRACE_S
                if cause is None and rc != PEER_LOST_STATUS:
                    cause = (r, rc)
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        stopped = set()  # ranks this launcher killed: still running at the deadline (or interrupted)
        for r, p in enumerate(procs):
            if p.poll() is None:
                p.kill()
                stopped.add(r)
            p.wait()
    if cause is None:  # the last ranks left between two polls, or every failure seen was a noticed loss:
        failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]  # by preference:
        cause = (next((f for f in failed if f[1] != PEER_LOST_STATUS and f[0] not in stopped), None)  # a lost rank,
                 or next((f for f in failed if f[0] in stopped), None)  # one that hung, one that noticed
                 or next(iter(failed), None))
    if cause is not None:
        r, rc = cause
        how = f"did not stop within {GRACE_S:.0f} s of a lost peer" if r in stopped else _how(rc)
        raise WorkerLostError(f"worker rank {r} (pid {procs[r].pid}) {how}; the run stopped. {resume_hint}".strip(),
                              rank=r, status=rc)
