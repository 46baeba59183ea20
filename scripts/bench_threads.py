"""Training-step scaling of the RepOps C++ backend from 1 to more threads, against torch eager.

    .venv/bin/python scripts/bench_threads.py [--configs digits-wide transformer digits_cnn]
                                              [--threads 1 2] [--steps 20]

Per example and thread count, in one process: the median plain step (the whole-step kernel, no
hashing: what a run does between checkpoints) with ``torch.set_num_threads`` and the backend's
count both set to that number, the process's CPU utilisation over those steps (CPU time / wall
time: 2.0 = two cores busy throughout), and the median step of the same model in plain torch
eager FP32 at the same count (``bench_training.torch_step_fn``). Then the speed-up over the
smallest thread count (goal >= 1.6x from 1 to 2 threads) and the ratio to torch at equal threads
(goal <= 1.5x), and whether the final commitment C_T of the runs is the same at every thread
count (it must be). Prints the load average first: figures from a busy machine do not compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling script bench_training
from bench_training import CONFIGS as TRAINING_CONFIGS
from bench_training import median_time, torch_step_fn

from verde_chain.examples import EXAMPLES
from verde_chain.repops.backends.cpu.backend import CpuBackend

# the largest shipped jobs of each family: bench_training's configs plus the digits CNN
CONFIGS: dict[str, tuple[str, dict[str, int]]] = {**TRAINING_CONFIGS, "digits_cnn": ("digits_cnn", {})}


def torch_step(example: str, job: Any) -> Any:
    """bench_training's torch twin, and the digits CNN's (same module, batch and optimizer)."""
    if example != "digits_cnn":
        return torch_step_fn(example, job)
    from verde_chain.examples.vision import input_shape, vision_module

    model = vision_module(example)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(job.spec.batch_size, *input_shape(example), generator=gen)
    y = torch.randint(0, 10, (job.spec.batch_size,), generator=gen)
    o = job.spec.optimizer
    opt = torch.optim.SGD(model.parameters(), lr=o.lr, momentum=o.momentum)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def measure(config: str, threads: int, steps: int) -> dict[str, Any]:
    example, kw = CONFIGS[config]
    torch.set_num_threads(threads)
    job = EXAMPLES[example](steps=steps + 3, checkpoint_interval=0, **kw)
    run = job.make_run(None, 0, CpuBackend(threads=threads), steps + 3)
    cpu_at: list[tuple[float, float]] = []
    final = run.run(progress=lambda log: cpu_at.append((time.perf_counter(), time.process_time())))
    walls = [log.wall_s for log in run.logs[3:]]
    (w0, c0), (w1, c1) = cpu_at[2], cpu_at[-1]  # the timed steps: after the 3 warm-up steps
    return {
        "example": config,
        "threads": threads,
        "repops_ms/step": round(1e3 * statistics.median(walls), 2),
        "repops_cpu": round((c1 - c0) / (w1 - w0), 2),
        "torch_ms/step": round(1e3 * median_time(torch_step(example, job), max(steps, 20)), 2),
        "_final": final,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", default=["digits-wide", "transformer", "digits_cnn"], choices=list(CONFIGS))
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    print(f"load average before the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    rows = []
    for config in args.configs:
        per = [measure(config, t, args.steps) for t in args.threads]
        base = per[0]
        for r in per:
            r["speedup"] = round(base["repops_ms/step"] / r["repops_ms/step"], 2)
            r["torch_speedup"] = round(base["torch_ms/step"] / r["torch_ms/step"], 2)
            r["ratio/torch"] = round(r["repops_ms/step"] / r["torch_ms/step"], 2)
            r["same_C_T"] = r["_final"] == base["_final"]
            print(" | ".join(f"{k} {v}" for k, v in r.items() if not k.startswith("_")), flush=True)
        rows += per
    print(json.dumps({"threads": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
                      "load": os.getloadavg(), "torch_version": torch.__version__}))


if __name__ == "__main__":
    main()
