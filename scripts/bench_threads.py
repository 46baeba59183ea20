"""Training-step scaling of the RepOps C++ backend from 1 to more threads, against torch eager.

    .venv/bin/python scripts/bench_threads.py [--configs digits-wide transformer digits_cnn resnet18 llama-h256]
                                              [--threads 1 2] [--steps 20] [--nodes 0] [--floating-ab]

Per example and thread count, in one process: the median plain step (the whole-step kernel, no
hashing: what a run does between checkpoints) with ``torch.set_num_threads`` and the backend's
count both set to that number, the process's CPU utilisation over those steps (CPU time / wall
time: 2.0 = two cores busy throughout), and the median step of the same model in plain torch
eager FP32 at the same count (``bench_training.torch_step_fn``, ``bench_lm.torch_step``, or the
vision twin below). The thread counts take turns (``measure``): blocks of BLOCK timed steps
after BLOCK_WARM untimed ones, RepOps then torch, the order rotated every round, so a slow
phase of a shared machine falls on every count alike. Then the speed-up over the smallest
thread count (goal >= 1.6x from 1 to 2 threads) and the ratio to torch at equal threads (goal
<= 1.5x), each the median of the quotients of steps in the same place of the same round, and
whether the final commitment C_T of the runs is the same at every thread count (it must be).
Prints the load average first and, per example, the CPU time the hypervisor took from this VM
during the timed rounds (``steal_s``, /proc/stat): figures from a busy machine do not compare.
``--nodes N`` also prints, per thread count, the N plan nodes that took longest (the whole-step
kernel's own per-node times, summed over the timed steps, ms per step) and the page faults per step.
``--floating-ab`` instead compares, per example at the largest thread count, plain steps with the
floating nodes (step_plan.cpp: small nodes that could wait many levels, run by pool workers in
their idle time) against every node in its level (``floating_ab``).
``--families N`` prints, per example, the N families (plan node kind and node label) with the
most wall time at the first thread count, beside the others: each level's wall time (the plan's
``level_times``) shared among its nodes by their own times, so a family's figures add up to the
plan's wall at every thread count; its nodes' own time (CPU time: side by side, nodes of one
level run at once), its work in threads' worth (the plan's estimate) and how its levels ran
(side by side or each node on all threads); then the plan's levels by how they ran.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling script bench_training
from bench_lm import torch_step as lm_torch_step
from bench_training import CONFIGS as TRAINING_CONFIGS
from bench_training import torch_step_fn

from verde_chain.examples import EXAMPLES
from verde_chain.examples.lm import LMConfig, lm_job
from verde_chain.examples.vision import input_shape, vision_module
from verde_chain.job import Job
from verde_chain.repops.backends.cpu.backend import CpuBackend
from verde_chain.repops.backends.cpu.step import PlanProfile

# name -> (the job of `steps` steps, its torch eager twin: a plain step of the same model, batch
# and optimizer). bench_training's configs; the CNNs of the vision issue (the digits CNN as
# shipped, resnet18 at batch 32 on 3x32x32 images) and the language model of the LM issue at
# hidden 256 (examples/lm.py LMConfig's other sizes: 2 layers, 4 heads, sequence 16, batch 2).
LM_H256 = LMConfig("llama", hidden=256)
VISION_BATCH = {"digits_cnn": 32, "resnet18": 32}
# measure's turns: each thread count runs BLOCK_WARM untimed and BLOCK timed steps at a time
BLOCK, BLOCK_WARM = 10, 5
OMP_SLEEP_S = 0.02  # before a block: torch's idle OpenMP workers stop spinning after a few ms


def rounds(steps: int) -> int:
    return -(-steps // BLOCK)


def _example(example: str, kw: dict[str, int]) -> tuple[Callable[[int], Job], Callable[[Job], Any]]:
    return (lambda steps: EXAMPLES[example](steps=steps, checkpoint_interval=0, **kw),
            lambda job: torch_step_fn(example, job))


def _vision(name: str) -> tuple[Callable[[int], Job], Callable[[Job], Any]]:
    return (lambda steps: EXAMPLES[name](steps=steps, checkpoint_interval=0, batch_size=VISION_BATCH[name]),
            lambda job: vision_torch_step(name, job))


def _lm(cfg: LMConfig) -> tuple[Callable[[int], Job], Callable[[Job], Any]]:
    return (lambda steps: lm_job(cfg, steps=steps, checkpoint_interval=0),
            lambda job: lm_torch_step(cfg, job.spec.optimizer.lr, job.spec.optimizer.weight_decay))


CONFIGS: dict[str, tuple[Callable[[int], Job], Callable[[Job], Any]]] = {
    **{name: _example(example, kw) for name, (example, kw) in TRAINING_CONFIGS.items()},
    "digits_cnn": _vision("digits_cnn"),
    "resnet18": _vision("resnet18"),
    "llama-h256": _lm(LM_H256),
}


def vision_torch_step(name: str, job: Job) -> Any:
    """The vision job's torch twin: same module, batch and optimizer."""
    model = vision_module(name)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(job.spec.batch_size, *input_shape(name), generator=gen)
    y = torch.randint(0, 10, (job.spec.batch_size,), generator=gen)
    o = job.spec.optimizer
    opt = torch.optim.SGD(model.parameters(), lr=o.lr, momentum=o.momentum)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


class Side:
    """One thread count's run of a config and its torch twin, stepped a block at a time so that
    the thread counts can take turns (``measure``)."""

    def __init__(self, config: str, threads: int, steps: int, nodes: int, families: int) -> None:
        make_job, make_torch_step = CONFIGS[config]
        self.config, self.threads, self.nodes = config, threads, nodes
        torch.set_num_threads(threads)
        # 3 warm-up steps, the blocks' steps (timed and untimed), C_T's step
        total = 3 + rounds(steps) * (BLOCK + BLOCK_WARM) + 1
        self.job = make_job(total)
        self.backend = CpuBackend(threads=threads)
        self.run = self.job.make_run(None, 0, self.backend, total)
        self.run.run(until=3)  # warm-up: preparation, compiled maps, the plan, first-touch of its buffers
        # every whole-step kernel the run has compiled (a plain step's keeps fewer outputs than C_0's)
        self.kernels = [k for k in self.run.exec._kernels.values() if k is not None]
        self.torch_fn = make_torch_step(self.job)
        for _ in range(3):
            self.torch_fn()
        self.walls: list[float] = []
        self.torch_walls: list[float] = []
        self.wall = self.cpu = 0.0
        self.faults = 0
        self.families = families
        self.profiled = 0  # plain steps since the node times were reset

    def _plain_step(self) -> None:
        run = self.run
        s = run.state.step + 1
        run.state = run.exec.run_plain(run.state, run.batches(s), keep=run.keep).state
        self.profiled += 1

    def block(self) -> None:
        """BLOCK_WARM + BLOCK plain RepOps steps (what a run does between checkpoints), then as
        many torch steps, after a pause in which torch's OpenMP workers stop spinning (they spin
        for milliseconds after a parallel region, on the cores this count's threads want); the
        first BLOCK_WARM steps of each kind are not timed (caches hold the other count's
        tensors, the pool's workers are asleep)."""
        torch.set_num_threads(self.threads)
        time.sleep(OMP_SLEEP_S)
        for _ in range(BLOCK_WARM):
            self._plain_step()
        if not self.walls:  # node times and profiles over the timed steps only
            for kernel in self.kernels:
                if self.nodes:
                    kernel.node_times = np.zeros(len(self.job.program.graph.nodes))
                if self.families:
                    kernel.profile()
            self.profiled = 0
        for _ in range(BLOCK):
            w0, c0, f0 = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            self._plain_step()
            w1, c1, f1 = time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            self.walls.append(w1 - w0)
            self.wall += w1 - w0
            self.cpu += c1 - c0
            self.faults += f1 - f0
        for _ in range(BLOCK_WARM):
            self.torch_fn()
        for _ in range(BLOCK):
            t0 = time.perf_counter()
            self.torch_fn()
            self.torch_walls.append(time.perf_counter() - t0)

    def finish(self, families: int) -> dict[str, Any]:
        """This side's figures, and its last step, committed (C_T)."""
        steps = len(self.walls)
        if self.nodes and self.kernels:
            print(f"{self.config} at {self.threads} threads, the {self.nodes} longest nodes (ms per step):")
            graph_nodes = self.job.program.graph.nodes
            node_times = sum(k.node_times for k in self.kernels)
            for i in np.argsort(-node_times)[:self.nodes]:
                desc = graph_nodes[i].desc
                path = "window" if desc.extended else self.backend.path(desc)
                print(f"  {1e3 * node_times[i] / self.profiled:8.3f}  {path:7s} {desc.label or '?'} "
                      f"{tuple(desc.out_shape)} K={desc.K}")
        profiles = [k.plan_profile for k in self.kernels if k.plan_profile is not None and k.plan_profile.runs]
        fams = family_times(self.job, profiles, self.threads) if families else None
        torch.set_num_threads(self.threads)
        final = self.run.run()
        return {
            "example": self.config,
            "threads": self.threads,
            "repops_ms/step": round(1e3 * statistics.median(self.walls), 2),
            "repops_cpu": round(self.cpu / self.wall, 2),
            "faults/step": round(self.faults / steps),
            "torch_ms/step": round(1e3 * statistics.median(self.torch_walls), 2),
            "_walls": self.walls,
            "_torch_walls": self.torch_walls,
            "_final": final,
            "_families": fams,
        }


def steal_seconds() -> float:
    """CPU time the hypervisor gave to others while this VM's CPUs wanted to run (/proc/stat)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def measure(config: str, threads: list[int], steps: int, nodes: int, families: int = 0) -> list[dict[str, Any]]:
    """Every thread count's plain steps taking turns, a block of steps each per round (the order
    rotated every round), so that whatever else the machine does in those seconds falls on every
    count alike; the speed-up and the ratio to torch are medians of the quotients of steps in
    the same place of the same round."""
    sides = [Side(config, t, steps, nodes, families) for t in threads]
    steal0 = steal_seconds()
    for r in range(rounds(steps)):
        for i in range(len(sides)):
            sides[(r + i) % len(sides)].block()
    steal = steal_seconds() - steal0
    per = [side.finish(families) for side in sides]
    base = per[0]
    for row in per:
        pair = zip(base["_walls"], row["_walls"])
        row["speedup"] = round(statistics.median(b / x for b, x in pair), 2)
        row["torch_speedup"] = round(statistics.median(b / x for b, x in zip(base["_torch_walls"], row["_torch_walls"])), 2)
        row["ratio/torch"] = round(statistics.median(x / t for x, t in zip(row["_walls"], row["_torch_walls"])), 2)
        row["same_C_T"] = row["_final"] == base["_final"]
        row["steal_s"] = round(steal, 2)
    return per


def floating_ab(config: str, threads: int, steps: int) -> dict[str, Any]:
    """Plain steps at ``threads`` threads with the floating nodes run in the pool's idle time
    (the default) and with every node in its level (``StepKernel.set_floating``), in one
    process, taking turns a block at a time (the order swapped every round): the median step of
    each and the median of the per-round quotients of their block medians (floating / levels)."""
    side = Side(config, threads, steps, 0, 0)
    walls: dict[bool, list[float]] = {True: [], False: []}
    ratios = []
    for r in range(rounds(steps)):
        med = {}
        for on in ((True, False) if r % 2 == 0 else (False, True)):
            for kernel in side.kernels:
                kernel.set_floating(on)
            for _ in range(BLOCK_WARM):
                side._plain_step()
            block = []
            for _ in range(BLOCK):
                t0 = time.perf_counter()
                side._plain_step()
                block.append(time.perf_counter() - t0)
            walls[on] += block
            med[on] = statistics.median(block)
        ratios.append(med[True] / med[False])
    for kernel in side.kernels:
        kernel.set_floating(True)
    return {"example": config, "threads": threads,
            "floating_nodes": sum(len(k.floating_nodes()) for k in side.kernels),
            "plan_nodes": sum(len(k._plan) for k in side.kernels),
            "floating_ms/step": round(1e3 * statistics.median(walls[True]), 3),
            "levels_ms/step": round(1e3 * statistics.median(walls[False]), 3),
            "floating/levels": round(statistics.median(ratios), 3),
            "quartiles": [round(q, 3) for q in statistics.quantiles(ratios, n=4)] if len(ratios) > 1 else None}


def family_times(job: Job, profiles: list[PlanProfile], threads: int) -> dict[str, Any]:
    """ms per step per family (plan node kind and node label): wall (each level's wall shared
    among its nodes by their own times; the floating nodes share the calling thread's wall at
    their deadlines), own (the nodes' own times), worth (threads' worth per node, the largest),
    side (levels run side by side / all), plus per level mode the wall (and the floating nodes'
    count and deadline wall)."""
    labels = [n.desc.label or "?" for n in job.program.graph.nodes]
    fam: dict[str, dict[str, float]] = {}
    modes = {"side by side": [0, 0.0], "node by node": [0, 0.0]}
    for p in profiles:
        # a floating node's wall: its share (by own time) of the calling thread's wall at the
        # floating nodes' deadlines; the others share their level's wall
        bound = ~p.floating
        per_level = np.zeros(len(p.level_s))
        np.add.at(per_level, p.level[bound], p.node_s[bound])
        float_own = float(p.node_s[p.floating].sum())
        if p.floating.any():
            m = modes.setdefault("floating", [0, 0.0])
            m[0] += int(p.floating.sum())
            m[1] += 1e3 * p.float_s / p.runs
        side = [p.side_by_side(lv, threads) for lv in range(len(p.level_s))]
        for lv, wall in enumerate(p.level_s):
            m = modes["side by side" if side[lv] else "node by node"]
            m[0] += 1
            m[1] += 1e3 * wall / p.runs
        for i, kind in enumerate(p.kinds):
            lv = int(p.level[i])
            if p.floating[i]:
                share = p.float_s * p.node_s[i] / float_own if float_own > 0 else 0.0
            else:
                share = p.level_s[lv] * p.node_s[i] / per_level[lv] if per_level[lv] > 0 else 0.0
            f = fam.setdefault(f"{kind} {labels[p.owner[i]]}", {"wall": 0.0, "own": 0.0, "worth": 0.0, "nodes": 0,
                                                               "side": 0})
            f["wall"] += 1e3 * share / p.runs
            f["own"] += 1e3 * p.node_s[i] / p.runs
            f["worth"] = max(f["worth"], float(p.worth[i]))
            f["nodes"] += 1
            f["side"] += int(side[lv])
    return {"families": fam, "levels": {k: (int(n), round(ms, 3)) for k, (n, ms) in modes.items()}}


def print_families(config: str, per: list[dict[str, Any]], top: int) -> None:
    fams = [r["_families"] for r in per]
    first = fams[0]["families"]
    print(f"{config}: per family, ms per step (wall: levels' wall shared by own time, floating nodes' the "
          "deadlines' wall; own: the nodes' own time)")
    head = " | ".join(f"wall {r['threads']}t | own {r['threads']}t" for r in per)
    print(f"  family | plan nodes | worth (threads) | side by side | {head} | wall speed-up")
    for name in sorted(first, key=lambda n: -first[n]["wall"])[:top]:
        cells = []
        for f in fams:
            got = f["families"].get(name, {"wall": 0.0, "own": 0.0})
            cells.append(f"{got['wall']:.3f} | {got['own']:.3f}")
        last = fams[-1]["families"].get(name, {"wall": 0.0})["wall"]
        up = first[name]["wall"] / last if last > 0 else float("nan")
        print(f"  {name} | {first[name]['nodes']} | {first[name]['worth']:.2f} | "
              f"{fams[-1]['families'].get(name, {'side': 0})['side']} | {' | '.join(cells)} | {up:.2f}x")
    for r, f in zip(per, fams):
        print(f"  levels at {r['threads']} threads (count, ms per step): {f['levels']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", default=["digits-wide", "transformer", "digits_cnn", "resnet18", "llama-h256"], choices=list(CONFIGS))
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--nodes", type=int, default=0, help="print the N longest plan nodes per thread count")
    p.add_argument("--families", type=int, default=0, help="print the N families with most wall time")
    p.add_argument("--floating-ab", action="store_true",
                   help="instead: at the largest thread count, floating nodes against every node in its level")
    args = p.parse_args()
    if min(args.threads) < 1 or args.steps < 1 or args.nodes < 0 or args.families < 0:
        p.error("--threads and --steps take counts of at least 1, --nodes and --families of at least 0")
    if args.floating_ab and max(args.threads) < 2:
        p.error("--floating-ab compares at the largest --threads count, which must be at least 2 "
                "(at 1 thread no node floats)")
    print(f"load average before the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    if args.floating_ab:
        ab = [floating_ab(config, max(args.threads), args.steps) for config in args.configs]
        for r in ab:
            print(" | ".join(f"{k} {v}" for k, v in r.items()), flush=True)
        print(json.dumps({"floating_ab": ab, "load": os.getloadavg(), "torch_version": torch.__version__}))
        return
    rows = []
    for config in args.configs:
        per = measure(config, args.threads, args.steps, args.nodes, args.families)
        for r in per:
            print(" | ".join(f"{k} {v}" for k, v in r.items() if not k.startswith("_")), flush=True)
        if args.families:
            print_families(config, per, args.families)
        rows += per
    print(json.dumps({"threads": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows],
                      "load": os.getloadavg(), "torch_version": torch.__version__}))


if __name__ == "__main__":
    main()
