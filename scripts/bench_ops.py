"""Where a training step's time goes: RepOps (C++ backend) vs torch eager, per op family.

    .venv/bin/python scripts/bench_ops.py [--threads 1] [--steps 20] [--backend cpu] [--configs ...] [--json]

For the digits MLP, the tiny transformer block and digits-wide (the MLP at hidden 1024, batch
512; see bench_training.CONFIGS), forward + backward + optimizer:

* RepOps: every node of the training graph is timed inside the whole-step kernel (the C++
  ``StepPlan`` records each node's seconds; other backends are timed around each node call) and
  filed under a family by its graph label and its backend plan (see ``family_of_node``);
  "commitments + executor" is the rest of the step: Python around the kernel call, and the one
  committed step (the run's last) amortised over ``--steps`` plain steps.
* torch eager: the same model/loss/optimizer (``bench_training.torch_step_fn``), profiled with
  ``torch.profiler``; each aten op's self CPU time is filed under the same families by name
  (``family_of_aten``). Profiler times are scaled to the unprofiled median step time, and the
  part no op accounts for (autograd engine, Python) is reported as "framework".

Same thread count on both sides, both measured in this process; ratios are repops / torch.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_training import CONFIGS, median_time, torch_step_fn

from verde_chain.examples import EXAMPLES
from verde_chain.graph.backend import make_runner
from verde_chain.graph.structure import GraphNode
from verde_chain.repops.backends.cpu.backend import CpuBackend

FAMILIES = ("matmul", "elementwise/transcendental", "reductions", "softmax/layernorm/loss", "optimizer", "data movement")
_COMPOSITE = {"softmax", "softmax_bwd", "layer_norm", "layer_norm_bwd", "ce", "ce_bwd", "log_softmax", "nll"}
_OPTIMIZER = {"adamw", "adam", "sgd", "momentum"}
_MOVEMENT = ("batch:", "carry:", "fill", "transpose", "gather", "identity", "reshape", "slice", "expand", "copy")


def family_of_node(node: GraphNode, plan_kind: str) -> str:
    prefix = node.label.split("/", 1)[0] if "/" in node.label else ""
    if prefix in _OPTIMIZER:
        return "optimizer"
    if prefix in _COMPOSITE:
        return "softmax/layernorm/loss"
    if plan_kind == "dot":
        return "matmul"
    if node.label.startswith(_MOVEMENT):
        return "data movement"
    if node.desc.K > 1:
        return "reductions"
    return "elementwise/transcendental"


_ATEN_FAMILIES = [
    ("matmul", r"^aten::(mm|addmm|bmm|matmul|linear|dot|addmv|mv)$"),
    ("softmax/layernorm/loss", r"softmax|layer_norm|nll_loss|cross_entropy"),
    ("reductions", r"^aten::(sum|mean|amax|max|min|embedding_dense_backward|embedding_backward|index_add_|index_put_)"),
    ("data movement", (r"^aten::(copy_|clone|contiguous|transpose|t|view|reshape|_reshape_alias|expand|embedding|"
     r"index_select|empty.*|zeros.*|fill_|zero_|as_strided|_unsafe_view|detach|unsqueeze|squeeze|permute|"
     r"select|slice|resize_|ones_like|zeros_like|empty_like|full|new_.*|_to_copy|to|lift_fresh|alias|unbind|split)$")),
]


def family_of_aten(name: str) -> str:
    for fam, pat in _ATEN_FAMILIES:
        if re.search(pat, name):
            return fam
    return "elementwise/transcendental"


def repops_breakdown(config: str, steps: int, threads: int, backend: str) -> tuple[dict[str, float], float]:
    """(ms per step per family, ms per step total) for the RepOps executor."""
    example, kw = CONFIGS[config]
    job = EXAMPLES[example](steps=steps + 3, checkpoint_interval=0, **kw)
    runner = make_runner(backend, threads)
    graph = job.program.graph
    # plain steps, as a training run executes them between checkpoints (the last step of each
    # run() call is committed: "commitments + executor" holds that one commitment, amortised)
    run = job.make_run(None, 0, runner, steps + 3)
    run.run(until=3)  # warm-up (per-desc preparation, page faults)
    kernel = run.exec.step_kernel(run.keep)
    spent: dict[str, float] = collections.defaultdict(float)
    if kernel is not None:
        # the whole step runs in one C++ call, which times each node inside it
        kernel.node_times = np.zeros(len(graph.nodes))
    else:  # a backend without a whole-step kernel: time each node's call
        inner = run.exec.runner
        by_desc = {id(n.desc): n for n in graph.nodes}

        def timed(desc: Any, ins: list[np.ndarray]) -> np.ndarray:
            t0 = time.perf_counter()
            out = inner(desc, ins)
            spent[family_of_node(by_desc[id(desc)], "program")] += time.perf_counter() - t0
            return out

        run.exec.runner = timed
    t0 = time.perf_counter()
    run.run()
    wall = (time.perf_counter() - t0) / steps
    if kernel is not None:
        assert isinstance(runner, CpuBackend)
        for node, s in zip(graph.nodes, kernel.node_times):
            spent[family_of_node(node, runner.plan(node.desc).kind)] += float(s)
    fams = {f: 1e3 * spent[f] / steps for f in FAMILIES}
    fams["commitments + executor"] = 1e3 * wall - sum(fams.values())
    return fams, 1e3 * wall


def torch_breakdown(config: str, steps: int) -> tuple[dict[str, float], float]:
    """(ms per step per family, median ms per step) for plain torch eager."""
    example, kw = CONFIGS[config]
    job = EXAMPLES[example](steps=2, **kw)
    step = torch_step_fn(example, job)
    wall = median_time(step, steps)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    self_us: dict[str, float] = collections.defaultdict(float)
    opt_us = 0.0
    for ev in prof.key_averages():
        if ev.key.startswith("Optimizer.") or ev.key.startswith("Optimizer#"):
            opt_us += ev.cpu_time_total  # the optimizer's step, inclusive
            continue
        if ev.key.startswith("aten::") or ev.key.startswith("autograd::"):
            self_us[family_of_aten(ev.key)] += ev.self_cpu_time_total
    # ops inside the optimizer step were also filed above; take them out of their families
    # proportionally is not possible from key_averages, so the optimizer is timed on its own:
    measured = sum(self_us.values())
    fams = {f: 0.0 for f in FAMILIES}
    opt_ms = opt_us / 1e3 / steps
    scale = (1e3 * wall) / max(measured / 1e3 / steps + 1e-12, 1e3 * wall)  # never inflate
    for f, us in self_us.items():
        fams[f] += us / 1e3 / steps * scale
    fams["optimizer"] = opt_ms * scale
    # optimizer ops were counted in their aten families too: remove that share evenly
    excess = sum(fams[f] for f in FAMILIES) - 1e3 * wall
    if excess > 0:
        others = [f for f in FAMILIES if f != "optimizer"]
        tot = sum(fams[f] for f in others)
        for f in others:
            fams[f] -= excess * fams[f] / tot
    fams["framework (autograd, python)"] = max(0.0, 1e3 * wall - sum(fams[f] for f in FAMILIES))
    return fams, 1e3 * wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--backend", default="cpu")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    report = {}
    for ex in args.configs:
        rep, rep_total = repops_breakdown(ex, args.steps, args.threads, args.backend)
        tor, tor_total = torch_breakdown(ex, args.steps)
        print(f"== {ex}: forward + backward + optimizer, {args.threads} thread(s); ms per step")
        print(f"{'family':32s} {'repops':>9s} {'torch':>9s} {'ratio':>8s}")
        rows = []
        for f in [*FAMILIES, "commitments + executor", "framework (autograd, python)"]:
            r, t = rep.get(f, 0.0), tor.get(f, 0.0)
            ratio = r / t if t > 1e-3 else float("nan")
            rows.append({"family": f, "repops_ms": round(r, 3), "torch_ms": round(t, 3), "ratio": round(ratio, 2)})
            print(f"{f:32s} {r:9.3f} {t:9.3f} {ratio:8.2f}")
        print(f"{'total':32s} {rep_total:9.3f} {tor_total:9.3f} {rep_total / tor_total:8.2f}\n")
        report[ex] = {"rows": rows, "repops_ms": round(rep_total, 3), "torch_ms": round(tor_total, 3)}
    if args.json:
        print(json.dumps({"threads": args.threads, "torch": torch.__version__, "bench_ops": report}))


if __name__ == "__main__":
    main()
