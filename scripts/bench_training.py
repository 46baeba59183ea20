"""Benchmark the training executor on the two example jobs.

Prints, per example: nodes per step, parameters, batch elements, seconds per step (execution
including tensor roots and node hashes), the share spent hashing, checkpoint save/load time and
the time to recompute one step commitment from the nearest checkpoint.

    .venv/bin/python scripts/bench_training.py [--steps 20] [--backend reference]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from verde_chain.commit import tensor
from verde_chain.examples import EXAMPLES
from verde_chain.graph.checkpoint import CheckpointStore
from verde_chain.graph.kernels import make_runner


def bench(name: str, steps: int, backend: str) -> dict[str, object]:
    job = EXAMPLES[name](steps=steps, checkpoint_interval=max(1, steps // 2))
    g = job.program.graph
    hashing = [0.0]
    orig = tensor.tensor_root

    def timed_root(t: object) -> bytes:
        t0 = time.perf_counter()
        try:
            return orig(t)
        finally:
            hashing[0] += time.perf_counter() - t0

    import verde_chain.graph.executor as ex

    ex.tensor_root = timed_root  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as d:
        run = job.make_run(Path(d), runner=make_runner(backend))
        t0 = time.perf_counter()
        run.run()
        wall = time.perf_counter() - t0
        ex.tensor_root = orig  # type: ignore[assignment]
        store = CheckpointStore(Path(d), g)
        t1 = time.perf_counter()
        store.save(run.state)
        save_s = time.perf_counter() - t1
        t1 = time.perf_counter()
        store.load(run.state.step)
        load_s = time.perf_counter() - t1
        t1 = time.perf_counter()
        run.commitment(steps)  # nearest checkpoint is steps/2 .. steps-1 away
        recompute_s = time.perf_counter() - t1
    return {
        "example": name,
        "nodes/step": len(g.nodes),
        "params": sum(s.numel for s in g.states if s.role == "param"),
        "batch elems": g.batch_numel,
        "s/step": round(wall / steps, 4),
        "hash share": f"{100 * hashing[0] / wall:.1f}%",
        "ckpt save s": round(save_s, 4),
        "ckpt load s": round(load_s, 4),
        "recompute C_T s": round(recompute_s, 3),
        "first loss": round(run.logs[0].loss, 4),
        "last loss": round(run.logs[-1].loss, 4),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--backend", default="reference")
    args = p.parse_args()
    rows = [bench(n, args.steps, args.backend) for n in ("digits", "transformer")]
    keys = list(rows[0])
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(str(r[k]) for k in keys))


if __name__ == "__main__":
    main()
