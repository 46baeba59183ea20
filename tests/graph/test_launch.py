"""The ``--workers`` launcher names the rank that was lost, not a rank that noticed the loss first."""

from __future__ import annotations

import sys

import pytest

from verde_chain.graph import launch as launch_mod
from verde_chain.graph.distributed import PEER_LOST_STATUS, WorkerLostError


def _ranks(body: str) -> list[str]:
    """A worker command: ``body`` runs with ``rank`` (int) bound, as each rank of the launch."""
    return [sys.executable, "-c", "import os, signal, sys, time\nrank = int(os.environ['RANK'])\n" + body]


def test_a_rank_that_noticed_the_loss_before_the_lost_rank_went_is_not_named() -> None:
    # rank 0 leaves as a rank does when its collective fails (PEER_LOST_STATUS) before the launcher
    # has seen rank 1 go; rank 1 is then killed: the launcher must name rank 1 and its signal
    body = (f"if rank == 0: sys.exit({PEER_LOST_STATUS})\n"
            "time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)\n")
    with pytest.raises(WorkerLostError) as e:
        launch_mod.launch(_ranks(body), 2, "resume: here")
    assert str(e.value).startswith("worker rank 1 (pid ") and str(e.value).endswith(
        ") was killed by signal SIGKILL; the run stopped. resume: here")


def test_the_lost_rank_is_named_when_it_and_a_noticing_rank_leave_together() -> None:
    # both ranks leave at about the same moment, often within one poll, where rank 0's noticed loss
    # comes first in rank order: the launcher still names rank 1
    body = (f"time.sleep(0.3)\nif rank == 0: sys.exit({PEER_LOST_STATUS})\n"
            "sys.exit(7)\n")
    with pytest.raises(WorkerLostError) as e:
        launch_mod.launch(_ranks(body), 2)
    assert " exited with status 7; the run stopped." in str(e.value) and str(e.value).startswith("worker rank 1 ")


def test_a_rank_that_hangs_after_a_loss_is_stopped_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch_mod, "GRACE_S", 1.0)
    body = f"if rank == 0: sys.exit({PEER_LOST_STATUS})\ntime.sleep(120)\n"
    with pytest.raises(WorkerLostError) as e:
        launch_mod.launch(_ranks(body), 2)
    assert str(e.value).startswith("worker rank 1 ") and " did not stop within 1 s of a lost peer;" in str(e.value)


def test_ranks_that_all_exit_zero_end_the_launch() -> None:
    launch_mod.launch(_ranks("sys.exit(0)\n"), 3)
