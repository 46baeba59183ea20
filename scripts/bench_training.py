"""Training-step cost of RepOps vs plain torch eager FP32, commitment share.

    .venv/bin/python scripts/bench_training.py [--threads 1] [--steps 30] [--backend cpu]
                                               [--interval 100]
                                               [--configs ...] [--json]

1. Step time, per example (digits MLP, tiny transformer, and digits-wide: the MLP with a
   1024-unit hidden layer and batch 512), same model, batch, optimizer and thread count, against
   a plain torch eager step (zero_grad, forward, cross-entropy, backward, optimizer.step):
   a plain RepOps step (kernels only: what a training run does between checkpoints), a committed
   step (kernels + every tensor root, node hash and C_s: a checkpoint step), and the amortised
   step of a ``--run-steps``-step run (default 1,000, a job's length: the end effects of the last
   checkpoint write are then those of a real job) as ``verde-chain train`` runs it (``run_ms/step``,
   ``ratio_run/torch``; goal <= 1.5x). Medians over ``--steps`` steps after warm-up, all measured
   in this process.
2. Commitment share at the default checkpoint interval (``--interval``, default
   ``DEFAULT_CHECKPOINT_INTERVAL`` = 100, what ``verde-chain train`` uses): time in tensor
   roots, node hashes, step commitments and checkpoint writes over that run. Goal <= 5%. A
   second table gives the same for ``--share-intervals`` (default 20 and 50).
(The dispute-time table, steps re-executed by a whole dispute by checkpoint interval, is measured
on chain by ``scripts/bench_reexec.py``.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import numpy as np
import torch

import verde_chain.graph.executor as ex
from verde_chain.examples import EXAMPLES
from verde_chain.graph.backend import make_runner
from verde_chain.graph.checkpoint import CheckpointStore
from verde_chain.job import Job

# name -> (example, job kwargs): the two examples as shipped, and a wider MLP whose nodes are big
# enough that per-node overhead no longer dominates
CONFIGS: dict[str, tuple[str, dict[str, int]]] = {
    "digits": ("digits", {}),
    "transformer": ("transformer", {}),
    "digits-wide": ("digits", {"hidden": 1024, "batch_size": 512}),
}


# ======================================================================= torch eager twins


def torch_step_fn(example: str, job: Job) -> Callable[[], None]:
    """A plain torch eager FP32 training step of the example's model, loss and optimizer."""
    from verde_chain.examples.digits import digits_module
    from verde_chain.examples.transformer import corpus_dataset, tiny_transformer

    gen = torch.Generator().manual_seed(0)
    if example == "digits":
        model = digits_module(job.program.graph.states[0].shape[0])
        x = torch.randn(job.spec.batch_size, 64, generator=gen)
        y = torch.randint(0, 10, (job.spec.batch_size,), generator=gen)
        o = job.spec.optimizer
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=o.lr, momentum=o.momentum)
        forward = lambda: torch.nn.functional.cross_entropy(model(x), y)
    else:
        _, vocab = corpus_dataset(16)
        b, ctx = job.spec.batch_size, 16
        model = tiny_transformer(len(vocab), ctx, b)
        x = torch.randint(0, len(vocab), (b, ctx), generator=gen)
        y = torch.randint(0, len(vocab), (b, ctx), generator=gen)
        o = job.spec.optimizer
        opt = torch.optim.AdamW(model.parameters(), lr=o.lr, weight_decay=o.weight_decay)
        forward = lambda: torch.nn.functional.cross_entropy(model(x).reshape(b * ctx, -1), y.reshape(-1))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        forward().backward()
        opt.step()

    return step


def median_time(fn: Callable[[], object], n: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ======================================================================= commitment accounting


class CommitTimer:
    """Wraps the executor's hashing functions and the checkpoint writes with timers."""

    # the executor's hashing entry points: tensor roots, then node hashes and C_s
    HASHING = ("tensor_root", "tensor_roots", "arena_roots", "node_hashes", "step_commitment")
    NODE_HASHING = ("node_hashes", "step_commitment")

    def __init__(self) -> None:
        self.roots_s = 0.0  # tensor roots (keccak Merkle trees of every node output)
        self.nodes_s = 0.0  # node hashes and step commitments
        self.ckpt_s = 0.0
        self._orig: dict[str, Any] = {}

    @property
    def hash_s(self) -> float:
        return self.roots_s + self.nodes_s

    def _wrap(self, fn: Callable[..., Any], field: str) -> Callable[..., Any]:
        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                setattr(self, field, getattr(self, field) + time.perf_counter() - t0)

        return timed

    def __enter__(self) -> Self:
        for name in self.HASHING:
            self._orig[name] = getattr(ex, name)
            setattr(ex, name, self._wrap(self._orig[name], "nodes_s" if name in self.NODE_HASHING else "roots_s"))
        # checkpoint writes run on a background thread: count what the training thread waits for
        for name in ("save", "save_async", "flush"):
            self._orig[name] = getattr(CheckpointStore, name)
        for name in ("save_async", "flush"):
            setattr(CheckpointStore, name, self._wrap(self._orig[name], "ckpt_s"))
        return self

    def __exit__(self, *exc: object) -> None:
        for name in self.HASHING:
            setattr(ex, name, self._orig[name])
        for name in ("save", "save_async", "flush"):
            setattr(CheckpointStore, name, self._orig[name])


def bench_example(
    config: str, steps: int, threads: int, backend: str, interval: int, share_intervals: tuple[int, ...] = (),
    run_steps: int = 1000,
) -> dict[str, Any]:
    example, kw = CONFIGS[config]
    job = EXAMPLES[example](steps=max(steps + 3, run_steps), **kw)
    runner = make_runner(backend, threads)
    # --- a plain step (kernels only: what the run does between checkpoints) and a committed step
    # (kernels + every tensor root, node hash and C_s: what it does at a checkpoint)
    plain = job.make_run(None, 0, runner, steps + 3)
    plain.run()
    plain_step = statistics.median(log.wall_s for log in plain.logs[3:] if log.commitment is None)
    full = job.make_run(None, 0, runner, steps + 3)
    full.commit_every = True
    hashed_until: list[float] = []
    with CommitTimer() as ct:
        full.run(progress=lambda log: hashed_until.append(ct.hash_s))
    committed_step = statistics.median(log.wall_s for log in full.logs[3:])
    hash_per_committed = statistics.median(np.diff([0.0, *hashed_until])[3:])
    torch_step = median_time(torch_step_fn(example, job), max(steps, 20))
    # --- runs of two checkpoint intervals as `verde-chain train` does them (disk writes included):
    # the commitment share and the amortised step time, at the default and the other intervals
    shares = {N: interval_run(job, runner, N, run_steps) for N in sorted({interval, *share_intervals})}
    wall, hash_s, ckpt_s = shares[interval]
    amortised = wall / run_steps
    return {
        "example": config,
        "threads": threads,
        "nodes/step": len(job.program.graph.nodes),
        "torch_ms/step": round(1e3 * torch_step, 2),
        "plain_ms/step": round(1e3 * plain_step, 2),
        "committed_ms/step": round(1e3 * committed_step, 2),
        "of which hashing ms": round(1e3 * hash_per_committed, 2),
        "ckpt_interval": interval,
        "run_ms/step": round(1e3 * amortised, 2),
        "ratio_run/torch": round(amortised / torch_step, 2),
        "ratio_plain/torch": round(plain_step / torch_step, 2),
        "ratio_every_step_committed/torch": round(committed_step / torch_step, 2),
        "commit_share_%": round(100 * (hash_s + ckpt_s) / wall, 1),
        "hash_share_%": round(100 * hash_s / wall, 1),
        "ckpt_write_share_%": round(100 * ckpt_s / wall, 1),
        "_shares": shares,
        "_run_steps": run_steps,
    }


def interval_run(job: Job, runner: Any, N: int, steps: int, keep_all: bool = True) -> tuple[float, float, float]:
    """(wall s, hashing s, checkpoint-write s) of steps 1..``steps`` at checkpoint interval N.
    ``keep_all``: the steps keep every node output, so a committed step's roots are taken by
    ``arena_roots``, which the timers see; on the shared layout a run uses by default
    (docs/training.md, "The step's memory") the plan hashes inside its C++ call, out of their
    reach, and the hashing time reads too low (the wall time is right either way)."""
    with tempfile.TemporaryDirectory() as d:
        run = job.make_run(Path(d), N, runner, steps)
        if keep_all:
            run.keep = None
        with CommitTimer() as ct:
            t0 = time.perf_counter()
            run.run()
            wall = time.perf_counter() - t0
    return wall, ct.hash_s, ct.ckpt_s


def share_table(per_example: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    intervals = sorted({N for r in per_example.values() for N in r["_shares"]})
    rows = []
    for N in intervals:
        row: dict[str, Any] = {"N": N}
        for name, r in per_example.items():
            wall, hash_s, ckpt_s = r["_shares"][N]
            row[f"{name}_commit_%"] = round(100 * (hash_s + ckpt_s) / wall, 1)
            row[f"{name}_hash_%"] = round(100 * hash_s / wall, 1)
            row[f"{name}_run/torch"] = round(wall / r["_run_steps"] / (r["torch_ms/step"] / 1e3), 2)
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    keys = [k for k in rows[0] if not k.startswith("_")]
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(str(r[k]) for k in keys))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--backend", default="cpu")
    p.add_argument("--interval", type=int, default=ex.DEFAULT_CHECKPOINT_INTERVAL,
                   help="checkpoint interval of the commitment-share run")
    p.add_argument("--run-steps", type=int, default=1000, help="steps of the runs that measure the commitment share")
    p.add_argument("--share-intervals", type=int, nargs="*", default=[20, 50],
                   help="further checkpoint intervals for the commitment-share table")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    per = {
        n: bench_example(
            n, args.steps, args.threads, args.backend, args.interval, tuple(args.share_intervals), args.run_steps
        )
        for n in args.configs
    }
    print(f"== step time vs torch eager ({args.backend}, {args.threads} thread(s), torch {torch.__version__})")
    print_table(list(per.values()))
    shares = share_table(per)
    print(f"\n== commitment share (hashing + checkpoint writes) of a {args.run_steps}-step run, by checkpoint interval N")
    print_table(shares)
    if args.json:
        out = {
            "steps": [{k: v for k, v in r.items() if not k.startswith("_")} for r in per.values()],
            "commit_share": shares,
        }
        print(json.dumps(out))


if __name__ == "__main__":
    main()
