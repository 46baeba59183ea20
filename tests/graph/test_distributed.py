"""Data-parallel runs on separate processes (gloo on localhost) give the one-process commitments."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
JOB = ["train", "digits", "--shards", "4", "--json"]


def _cli(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "verde_chain.cli", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _summary(args: list[str]) -> tuple[dict, int]:  # type: ignore[type-arg]
    p = _cli(args)
    out, err = p.communicate(timeout=900)
    assert p.returncode == 0, out[-2000:] + err[-2000:]
    return json.loads(out.strip().splitlines()[-1]), p.pid


def test_two_three_and_four_processes_equal_one_bit_for_bit() -> None:
    runs = {}
    for workers, threads in ((1, 1), (2, 1), (3, 2), (4, 1)):
        runs[workers] = _summary([*JOB, "--steps", "12", "--workers", str(workers), "--threads", str(threads)])
    finals = {w: s["final_commitment"] for w, (s, _) in runs.items()}
    assert len(set(finals.values())) == 1, finals
    for workers, (s, launcher) in runs.items():
        ws = s["workers"]
        assert [w["rank"] for w in ws] == list(range(workers))
        assert sum(w["shards"] for w in ws) == 4 and [w["first_shard"] for w in ws] == sorted(w["first_shard"] for w in ws)
        pids = {w["pid"] for w in ws}
        assert len(pids) == workers  # every rank its own process
        if workers > 1:  # ... started by the launcher, none of them the launcher itself
            assert launcher not in pids and os.getpid() not in pids
    # torchrun's processes are ranks alike (its environment; --workers is not needed)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
                        "verde_chain.cli", *JOB, "--steps", "12"], cwd=REPO, capture_output=True, text=True,
                       timeout=900, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    torchrun = json.loads(p.stdout.strip().splitlines()[-1])
    assert torchrun["final_commitment"] == finals[1] and len({w["pid"] for w in torchrun["workers"]}) == 2
    # and a different S is a different program
    other, _ = _summary(["train", "digits", "--shards", "2", "--json", "--steps", "12", "--workers", "2"])
    assert other["final_commitment"] != finals[1] and other["spec_hash"] != runs[1][0]["spec_hash"]


def test_more_workers_than_shards_is_one_line() -> None:
    p = _cli(["train", "digits", "--workers", "2", "--steps", "2"])
    out, err = p.communicate(timeout=300)
    assert p.returncode == 2 and out == ""
    assert err.strip().splitlines() == [(
        "verde-chain train: error: 2 workers for 1 shards: a job runs on 1 to 1 workers (its shards); create it with "
        "more shards (--shards) to use more workers")]


@pytest.mark.slow
def test_a_killed_worker_stops_the_run_which_resumes_with_any_number_of_workers(tmp_path: Path) -> None:
    args = [*JOB, "--steps", "400", "--checkpoint-interval", "10", "--threads", "1"]
    out = tmp_path / "run"
    p = _cli([*args, "--workers", "2", "--out", str(out)])
    assert p.stderr is not None
    started = p.stderr.readline()
    m = re.search(r"rank 1 pid (\d+)", started)
    assert m, started
    first = out / "checkpoints" / "step_00000010.json"
    while not first.exists() and p.poll() is None:
        time.sleep(0.02)
    os.kill(int(m.group(1)), signal.SIGKILL)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 2
    assert f"worker rank 1 (pid {m.group(1)}) was killed by signal SIGKILL; the run stopped" in err
    assert "--resume (any --workers)" in err
    stored = sorted(out.glob("checkpoints/step_*.json"))
    assert stored and stored[-1].name != "step_00000400.json"  # it stopped before the end
    want, _ = _summary(args)
    for workers in (1, 3):
        d = tmp_path / f"resume{workers}"
        shutil.copytree(out, d)
        got, _ = _summary([*args, "--out", str(d), "--resume", "--workers", str(workers)])
        assert got["final_commitment"] == want["final_commitment"]
