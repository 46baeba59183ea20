"""The normalisation compositions alone: softmax, layer norm and RMSNorm, RepOps against torch eager.

    .venv/bin/python scripts/bench_norms.py [--threads 1] [--steps 30] [--rows 32 512] [--hidden 64 768]

Each composition reads ``x * a`` (``a`` a learned per-column scale, so the backward runs through
the whole composition to its input, as inside a transformer) and is trained with MSE and SGD: a
step is the composition's forward and full backward plus a few small nodes (the scale, the loss,
the updates):

* ``softmax``: ``softmax(x * a)`` over the last axis;
* ``layer_norm``: ``torch.nn.LayerNorm(hidden)`` (weight and bias) of ``x * a``;
* ``rms_norm``: Llama's RMSNorm as transformers writes it (``LlamaRMSNorm``:
  ``w * (h * rsqrt(mean(h^2) + eps))``) of ``h = x * a``, which the exporter writes as Pow,
  ReduceMean, Add, Sqrt, a division and Mul nodes.

The job is made with the user path (``job_from_torch``); RepOps' figure is the median plain step
of a run (the whole-step kernel, as between checkpoints), torch's the median eager step
(zero_grad, forward, MSE, backward, SGD step) of the same module on the same batch, at the same
thread count, in one process. Ratios are RepOps / torch (issue #16's goal: at most 1.5x).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_training import median_time

from verde_chain.graph.backend import make_runner
from verde_chain.graph.training import LossSpec, OptimizerSpec
from verde_chain.job import job_from_torch


class Scaled(torch.nn.Module):
    """``inner(x * a)``: a learned per-column scale in front of the composition."""

    def __init__(self, hidden: int, inner: torch.nn.Module | None = None) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.linspace(0.5, 1.5, hidden))
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * self.a
        return torch.softmax(h, dim=-1) if self.inner is None else self.inner(h)


class RMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm (fp32 throughout)."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def make_module(kind: str, hidden: int) -> torch.nn.Module:
    if kind == "softmax":
        return Scaled(hidden)
    return Scaled(hidden, torch.nn.LayerNorm(hidden) if kind == "layer_norm" else RMSNorm(hidden))


KINDS = ("softmax", "layer_norm", "rms_norm")


def one(kind: str, rows: int, hidden: int, steps: int, threads: int) -> tuple[float, float, int]:
    """(RepOps plain step, torch eager step, nodes per step) in seconds."""
    torch.manual_seed(0)
    gen = np.random.default_rng(0)
    x = gen.standard_normal((rows, hidden)).astype(np.float32)
    y = gen.standard_normal((rows, hidden)).astype(np.float32)
    module = make_module(kind, hidden)
    opt = OptimizerSpec("sgd", lr=0.01)
    job = job_from_torch(make_module(kind, hidden), torch.from_numpy(x), (x, y), steps=steps + 3,
                         loss=LossSpec("mse"), optimizer=opt, checkpoint_interval=0)
    run = job.make_run(None, 0, make_runner("cpu", threads), steps + 3)
    run.run()
    repops = statistics.median(log.wall_s for log in run.logs[3:] if log.commitment is None)

    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    sgd = torch.optim.SGD(module.parameters(), lr=opt.lr)

    def torch_step() -> None:
        sgd.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(module(xt), yt).backward()
        sgd.step()

    return repops, median_time(torch_step, max(steps, 20)), len(job.program.graph.nodes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rows", type=int, nargs="+", default=[32, 512], help="rows per batch, one size per shape")
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 768], help="hidden size, one per --rows entry")
    a = p.parse_args()
    if len(a.rows) != len(a.hidden) or a.threads < 1 or a.steps < 1:
        p.error("give one --hidden per --rows, and positive --threads and --steps")
    torch.set_num_threads(a.threads)
    print(f"composition alone (+ MSE, SGD), {a.threads} thread(s); ms per step, RepOps plain / torch eager")
    for rows, hidden in zip(a.rows, a.hidden):
        for kind in KINDS:
            rep, tor, nodes = one(kind, rows, hidden, a.steps, a.threads)
            print(f"{kind:11s} ({rows:4d}, {hidden:4d}) {nodes:3d} nodes   RepOps {rep * 1e3:8.3f}   "
                  f"torch {tor * 1e3:8.3f}   ratio {rep / tor:5.2f} (goal <= 1.5)")


if __name__ == "__main__":
    main()
