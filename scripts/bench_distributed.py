"""Data-parallel training on W processes (gloo, one thread each): speed-up from 1 to 2 processes,
the share of a step spent in the collective, and the bytes per step per worker of each scheme.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_distributed.py [--rounds 3] [--steps 200]

Each job is an S = 2 digits MLP bundle; ``verde-chain train BUNDLE --workers W --threads 1`` is
run round-robin (W = 1, 2 once per round) and the best wall time of the training loop (``wall_s``:
no process start, no job build) is kept. W = 1 is the ordinary one-process run (the whole-step
kernel); W = 2 runs each rank's nodes one by one, then the tail (docs/distributed.md). The model
at the end is arithmetic over the job's gradient size P (floats), for S = W shards.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOBS = {"digits h=64 B=64": {"hidden": 64, "batch_size": 64}, "digits h=1024 B=256": {"hidden": 1024, "batch_size": 256}}


def run(bundle: Path, workers: int) -> dict:  # type: ignore[type-arg]
    cmd = [sys.executable, "-m", "verde_chain.cli", "train", str(bundle), "--workers", str(workers), "--threads", "1",
           "--checkpoint-interval", "0", "--json"]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(r.stdout.strip().splitlines()[-1])


class OneRank:
    """A collective of one rank: the sharded executor's node-by-node path with no communication."""

    rank, world = 0, 1

    def all_gather(self, buf):  # type: ignore[no-untyped-def]
        return [buf]

    def broadcast(self, buf, src=0):  # type: ignore[no-untyped-def]
        return buf


def node_by_node_ms(job, steps: int, rounds: int) -> float:  # type: ignore[no-untyped-def]
    """ms per step of the W = 2 ranks' way of running nodes (one by one), all shards in one process."""
    import time

    import torch

    from verde_chain.graph.backend import make_runner
    from verde_chain.graph.distributed import ShardedExecutor

    torch.set_num_threads(1)
    runner = make_runner("cpu", 1)
    best = float("inf")
    for _ in range(rounds):
        run = job.make_run(None, 0, runner, steps, executor=ShardedExecutor(job.program.graph, OneRank(), runner))
        t0 = time.perf_counter()
        run.run()
        best = min(best, (time.perf_counter() - t0) / steps * 1e3)
    return best


def model(p: int) -> list[str]:
    rows = ["| W = S | all-gather + fixed-order sum (ours) | ring all-reduce | ratio | reduce-scatter + fixed-order sum + all-gather | ratio |",
            "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for w in (2, 8, 16, 32, 64):
        ag = 4 * p * (w - 1)  # every rank receives the other W - 1 shards' gradients
        ring = 2 * 4 * p * (w - 1) / w  # reduce-scatter + all-gather, each (W-1)/W of the vector
        rs = 4 * p * (w - 1) / w + 4 * p * (w - 1) / w  # S/W shard slices in, the combined slices out
        rows.append(f"| {w} | {ag / 1e6:.2f} MB | {ring / 1e6:.3f} MB | {ag / ring:.1f}x | {rs / 1e6:.3f} MB | "
                    f"{rs / ring:.1f}x |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    a = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from verde_chain.examples.digits import digits_job
    from verde_chain.job import save_job

    print("load:", os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        for name, kw in JOBS.items():
            job = digits_job(steps=a.steps, shards=2, checkpoint_interval=0, **kw)
            bundle = save_job(job, Path(tmp) / name.replace(" ", "_")).parent
            p = sum(s.numel for s in job.program.graph.states if s.role == "param")
            best: dict[int, dict] = {}  # type: ignore[type-arg]
            for _ in range(a.rounds):
                for w in (1, 2):
                    s = run(bundle, w)
                    if w not in best or s["wall_s"] < best[w]["wall_s"]:
                        best[w] = s
            assert best[1]["final_commitment"] == best[2]["final_commitment"]
            one, two = best[1]["wall_s"] / a.steps * 1e3, best[2]["wall_s"] / a.steps * 1e3
            comm = best[2]["comm_s"] / best[2]["wall_s"]
            nbn = node_by_node_ms(job, a.steps, a.rounds)
            print(f"{name}: P = {p} params; ms/step W=1 {one:.3f}, W=2 {two:.3f} -> speed-up {one / two:.2f}x; "
                  f"W=2 communication {comm:.0%} of a step, {best[2]['comm_bytes'] / a.steps / 1e3:.1f} kB "
                  f"received per step by rank 0; both shards node by node in one process {nbn:.3f} ms/step")
            print("\n".join(model(p)))
    print("load:", os.getloadavg())


if __name__ == "__main__":
    main()
