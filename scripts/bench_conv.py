"""Benchmark the RepOps convolution (windowed GEMM, implicit im2col: kernels/cpu/conv.cpp)
against torch at the same thread count.

Usage: python scripts/bench_conv.py [--threads 1 2] [--isa avx512] [--repeat 5]
       [--shape N C H W M KH KW PAD STRIDE] [--step resnet18 --batch 32 [--profile | --nodes | --hashing]]
       [--tap-classes | --idle-hashing] [--families] [--step resnet18 --run STEPS [--interval N]]

Default: 64 -> 64 channels, 3x3, pad 1, stride 1 on 32x32, batch 32 (goal: forward <= 1.25x
``torch.nn.functional.conv2d``). For forward, grad-input and grad-weight, two RepOps figures:
the backend's whole call (``CpuBackend(desc, inputs)``: operand tables, kernel, reshape) and the
kernel alone (tables built once, the output's order written as the call does); torch: ``conv2d``
and ``aten.convolution_backward`` for each gradient alone. Best-of-N, round-robin in every
rotation of the order (``best_rotated``), with each one's minor page faults per call
(``FaultCounted``: torch's time swings with them). Prints a table and one JSON line. ``--step MODEL``:
instead, one committed training step of a vision job (``examples/vision.py``, SGD with
momentum) against torch eager's forward, backward and SGD step on the same module and batch. ``--step MODEL --profile``: where the plain step's time goes,
per node label (the whole-step plan's ``node_times``), beside torch's per-op self CPU time
(``torch.profiler``), same thread count. ``--step MODEL --hashing``: what committing costs the
whole-step plan, per layout (``full``: every output kept, hashed after the last level; ``shared``:
only the loss kept, outputs hashed between levels before their slots are reused): the plan run
plain and committed (``roots``), the committed run's seconds in its hash points
(``StepPlan.hash_seconds``), and, over the same outputs, one keccak tree
(``tensor_root`` of them all concatenated: the ideal) and ``tensor_roots`` of them as a list;
``overhead`` = committed - plain. ``--step MODEL --nodes``: per plan node of its
convolutions (windowed GEMM, permute): shape, M N K, ms and GF/s. ``--tap-classes`` (with
``--step MODEL`` alone or with ``--nodes``): the same step also with the windowed GEMM's tap
classes off (conv.cpp ``tap_class_gemm``, ``tap_class_choice``), the two taking turns in this
process. ``--idle-hashing`` (with ``--step MODEL`` alone or with ``--hashing``): the committed
step also with the outputs hashed at the hash points only, not in the pool's idle time
(step_plan.cpp ``IdleHashing``), taking turns; ``--hashing`` then also reports the share of the
hashing items that pool workers ran while levels ran, both paths' median committed run and the
median of their per-round time ratios (idle / hash points only: paired, so a slow phase of a
shared machine falls on both). ``--step MODEL --run STEPS [--interval N]``: a training run of
STEPS steps as ``verde-chain train`` runs it (``TrainingRun``: plain steps, committed steps at
the checkpoints every N steps, default ``DEFAULT_CHECKPOINT_INTERVAL``, and at the last; the
checkpoints written to a temporary store, overlapping the next steps) against STEPS torch eager
steps, after two warm-up steps each: the run is one ``run()`` call, and torch's steps take
their turns, RUN_BLOCK at a time, in its progress callback (their time taken off the run's);
per step wall time, ratio, CPU utilisation, and how many steps were committed. ``--families``: CPU time per call of the non-GEMM
window families on resnet18's shapes (batch 32), each new path beside the one it replaced, in
one process: max-pool backward in scatter form vs its two gathers and the interpreter, and the
channel statistics read k-major vs row-major (the layout before; its descriptor rebuilt here).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gemm import best_of, positive

from verde_chain.examples.vision import VISION_MODELS
from verde_chain.graph.executor import DEFAULT_CHECKPOINT_INTERVAL
from verde_chain.repops import library, windowed
from verde_chain.repops.backends.cpu import extension as cpu_ext
from verde_chain.repops.backends.cpu.backend import CpuBackend
from verde_chain.repops.backends.registry import thread_count
from verde_chain.repops.library import ConvGeometry


def _step_setup(name: str, batch: int, threads: int, isa: str) -> tuple[Any, ...]:
    """(executor, initial state, batch data, torch's step function) of one vision job."""
    from verde_chain.examples import vision
    from verde_chain.graph.executor import StepExecutor

    torch.set_num_threads(threads)
    job = vision.vision_job(name, steps=1, batch_size=batch, samples=batch)
    prog = job.program
    ex = StepExecutor(prog.graph, CpuBackend(isa=isa, threads=threads))
    X, Y = _batch_data(name, batch)
    data = prog.batch(1, {"x": X}, Y)
    # the state a step of a run reads: the previous step's, in the step kernel's own arena (the
    # initial state has none, and packing one, ~40 ms for resnet18, is what only a run's first
    # step does)
    state = ex.run_step(ex.initial_state(prog.initial_state()), data).state
    return ex, state, data, _torch_step(name, X, Y)


def _batch_data(name: str, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """One batch of random images and labels for the vision model ``name``."""
    from verde_chain.examples import vision

    r = np.random.default_rng(0)
    X = r.random((batch, *vision.input_shape(name)), dtype=np.float32)
    return X, r.integers(0, 10, batch).astype(np.float32)


def _torch_step(name: str, X: np.ndarray, Y: np.ndarray) -> Callable[[], None]:
    """torch eager's training step of the vision model ``name`` on (X, Y): SGD with momentum."""
    from verde_chain.examples import vision

    module = vision.vision_module(name).train()
    opt = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9)
    tx, ty = torch.from_numpy(X), torch.from_numpy(Y).long()

    def torch_step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(module(tx), ty).backward()
        opt.step()

    return torch_step


def bench_step(name: str, batch: int, threads: int, isa: str, repeat: int,
               tap_classes: bool = False, idle_hashing: bool = False) -> dict[str, object]:
    """torch eager's step against the committed step, best of ``repeat`` round-robin;
    ``tap_classes``: also the committed step with the windowed GEMM's tap classes off;
    ``idle_hashing``: also the committed step hashing at the hash points only."""
    ex, state, data, torch_step = _step_setup(name, batch, threads, isa)
    step = functools.partial(ex.run_step, state, data)
    fns = [torch_step, _with_tap_classes(isa, 0, step)]
    if tap_classes:
        fns.append(_with_tap_classes(isa, 2, step))
    if idle_hashing:
        fns.append(_with_idle_hashing(ex.step_kernel(), False, step))
    times = best_of(fns, repeat, budget_s=120.0)
    (t_torch, u_torch), (t_rep, u_rep) = times[0], times[1]
    row: dict[str, object] = {"model": name, "batch": batch, "threads": threads, "isa": isa, "torch_s": round(t_torch, 3),
                              "repops_committed_step_s": round(t_rep, 3), "ratio": round(t_rep / t_torch, 2),
                              "cpu_util_torch": round(u_torch, 2), "cpu_util_repops": round(u_rep, 2)}
    if tap_classes:
        row.update(one_gemm_committed_step_s=round(times[2][0], 3), one_gemm_ratio=round(times[2][0] / t_torch, 2))
    if idle_hashing:
        row.update(hash_points_only_committed_step_s=round(times[-1][0], 3),
                   hash_points_only_ratio=round(times[-1][0] / t_torch, 2),
                   cpu_util_hash_points_only=round(times[-1][1], 2))
    return row


RUN_BLOCK = 10  # --run: steps per turn of each side
OMP_SETTLE_S = 0.02  # --run: after torch's turn its idle OpenMP workers stop spinning (~5 ms) before the run's


def bench_run(name: str, batch: int, threads: int, isa: str, steps: int, interval: int) -> dict[str, object]:
    """A ``steps``-step training run of the vision job as ``verde-chain train`` runs it
    (checkpoints every ``interval`` steps on disk, committed steps there and at the last) against
    torch eager's steps on the same module and batch size, in turns of RUN_BLOCK steps."""
    from verde_chain.examples import vision

    torch.set_num_threads(threads)
    warm = 2
    job = vision.vision_job(name, steps=warm + steps, batch_size=batch, samples=max(256, 4 * batch))
    torch_step = _torch_step(name, *_batch_data(name, batch))
    torch_wall = torch_cpu = settle = 0.0

    def torch_turn(log: Any) -> None:  # after every RUN_BLOCK-th step of the run: torch's block
        nonlocal torch_wall, torch_cpu, settle
        if (log.step - warm) % RUN_BLOCK and log.step != warm + steps:
            return
        block = (log.step - warm - 1) % RUN_BLOCK + 1
        c0, t0 = time.process_time(), time.perf_counter()
        _repeat(torch_step, block)
        torch_wall += time.perf_counter() - t0
        torch_cpu += time.process_time() - c0
        t1 = time.perf_counter()
        time.sleep(OMP_SETTLE_S)
        settle += time.perf_counter() - t1  # neither side's

    with tempfile.TemporaryDirectory() as d:
        run = job.make_run(Path(d), interval, CpuBackend(isa=isa, threads=threads), warm + steps)
        run.run(until=warm)  # the plan's preparation, compiled maps, first touch of its buffers
        _repeat(torch_step, warm)
        c0, t0 = time.process_time(), time.perf_counter()
        run.run(progress=torch_turn)  # one call, as `verde-chain train` makes it
        wall = [torch_wall, time.perf_counter() - t0 - torch_wall - settle]
        cpu = [torch_cpu, time.process_time() - c0 - torch_cpu]
        committed = sum(1 for log in run.logs[warm:] if log.commitment is not None)
    return {"model": name, "batch": batch, "threads": threads, "isa": isa, "steps": steps, "interval": interval,
            "committed_steps": committed, "torch_s_per_step": round(wall[0] / steps, 4),
            "run_s_per_step": round(wall[1] / steps, 4), "ratio": round(wall[1] / wall[0], 2),
            "cpu_util_torch": round(cpu[0] / wall[0], 2), "cpu_util_run": round(cpu[1] / wall[1], 2)}


def _repeat(fn: Callable[[], object], times: int) -> None:
    for _ in range(times):
        fn()


def _timed(fn: Callable[[], object], into: list[float]) -> Callable[[], None]:
    """``fn``, each call's wall seconds appended to ``into``."""

    def run() -> None:
        t0 = time.perf_counter()
        fn()
        into.append(time.perf_counter() - t0)

    return run


def _with_idle_hashing(kernel: Any, on: bool, fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` run with the step kernel hashing in the pool's idle time (on) or at its hash
    points only (off)."""
    assert kernel is not None, "no whole-step kernel"

    def run() -> object:
        kernel.set_idle_hashing(on)
        try:
            return fn()
        finally:
            kernel.set_idle_hashing(True)

    return run


def profile_step(name: str, batch: int, threads: int, isa: str, repeat: int) -> dict[str, object]:
    """ms per plain step per node label (RepOps) and per aten op (torch, self CPU time), the
    best of ``repeat`` steps per label."""
    from torch.profiler import ProfilerActivity, profile

    ex, state, data, torch_step = _step_setup(name, batch, threads, isa)
    kernel = ex.step_kernel()
    assert kernel is not None, "no whole-step kernel"
    labels = [n.label for n in ex.graph.nodes]
    ex.run_plain(state, data)  # warm-up (scratch, page faults)
    best: dict[str, float] = {}
    for _ in range(repeat):
        kernel.node_times = np.zeros(len(labels))
        ex.run_plain(state, data)
        per: dict[str, float] = collections.defaultdict(float)
        for label, s in zip(labels, kernel.node_times):
            per[label] += float(s)
        for label, s in per.items():
            best[label] = min(best.get(label, float("inf")), s)
    kernel.node_times = None
    torch_step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeat):
            torch_step()
    ops = {ev.key: ev.self_cpu_time_total / 1e3 / repeat for ev in prof.key_averages() if ev.self_cpu_time_total > 0}
    rep = dict(sorted(((k, round(1e3 * v, 2)) for k, v in best.items()), key=lambda kv: -kv[1]))
    top = dict(sorted(((k, round(v, 2)) for k, v in ops.items()), key=lambda kv: -kv[1])[:25])
    return {"model": name, "batch": batch, "threads": threads, "isa": isa,
            "repops_plan_ms": round(sum(rep.values()), 1), "repops_ms": rep,
            "torch_self_ms": round(sum(ops.values()), 1), "torch_ms": top}


def hashing_step(name: str, batch: int, threads: int, isa: str, repeat: int,
                 idle_hashing: bool = False) -> dict[str, object]:
    """ms of the whole-step plan plain and committed, its hash points' seconds, and one tree /
    ``tensor_roots`` over the same outputs, best of ``repeat`` round-robin, per layout;
    ``idle_hashing``: also committed with the outputs hashed at the hash points only, and the
    share of hashing items that pool workers ran while levels ran."""
    from verde_chain.commit import native as commit_native

    ex, state, data, _ = _step_setup(name, batch, threads, isa)
    outputs = ex.run_plain(state, data).outputs
    flat = np.concatenate(outputs)
    row: dict[str, object] = {"model": name, "batch": batch, "threads": threads, "isa": isa,
                              "outputs_MB": round(flat.nbytes / 1e6, 1), "n_outputs": len(outputs)}
    tree, roots = best_of([functools.partial(commit_native.tensor_root, flat, threads),
                           functools.partial(commit_native.tensor_roots, outputs, threads)], repeat)
    row.update(one_tree_ms=round(1e3 * tree[0], 1), tensor_roots_ms=round(1e3 * roots[0], 1))
    batch_bits = ex._batch(data)
    for layout, keep in (("full", None), ("shared", frozenset({len(ex.graph.nodes) - 1}))):
        kernel = ex.step_kernel(keep)
        assert kernel is not None and kernel.hashes_outputs, "no whole-step kernel hashing in the plan"
        prev = kernel.pack(ex.run_step(state, data, keep=keep).state.tensors)
        rows = np.empty((len(ex.graph.nodes), 32), dtype=np.uint8)
        hash_s: list[float] = []

        overlapped: list[float] = []

        def committed(kernel: Any = kernel, prev: np.ndarray = prev, rows: np.ndarray = rows,
                      hash_s: list[float] = hash_s, overlapped: list[float] = overlapped) -> None:
            kernel.run(prev, batch_bits, rows)
            hash_s.append(kernel._plan.hash_seconds())
            done, total = kernel.idle_hashed()
            overlapped.append(done / total if total else 0.0)

        fns = [functools.partial(kernel.run, prev, batch_bits), committed]
        if idle_hashing:  # each committed call timed too: the two paths' times paired round by round
            calls: tuple[list[float], list[float]] = ([], [])
            fns = [fns[0], _timed(committed, calls[0]),
                   _timed(_with_idle_hashing(kernel, False, functools.partial(kernel.run, prev, batch_bits, rows)),
                          calls[1])]
        times = best_of(fns, repeat, budget_s=60.0)
        plain, comm = times[0], times[1]
        row[layout] = {"plain_ms": round(1e3 * plain[0], 1), "committed_ms": round(1e3 * comm[0], 1),
                       "overhead_ms": round(1e3 * (comm[0] - plain[0]), 1),
                       "hash_points_ms": round(1e3 * min(hash_s), 1),
                       "cpu_util_plain": round(plain[1], 2), "cpu_util_committed": round(comm[1], 2)}
        if idle_hashing:
            row[layout].update(committed_hash_points_only_ms=round(1e3 * times[2][0], 1),
                               cpu_util_hash_points_only=round(times[2][1], 2),
                               items_hashed_while_levels_ran=round(float(np.median(overlapped)), 2),
                               median_committed_ms=round(1e3 * float(np.median(calls[0])), 1),
                               median_hash_points_only_ms=round(1e3 * float(np.median(calls[1])), 1),
                               paired_median_ratio=round(float(np.median(np.divide(*calls))), 3))
    return row


def _with_tap_classes(isa: str, choice: int, fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` run with the windowed GEMM's tap classes chosen by cost (0) or never (2)."""
    ext = cpu_ext.extension(isa)

    def run() -> object:
        before = ext.tap_class_choice(choice)
        try:
            return fn()
        finally:
            ext.tap_class_choice(before)

    return run


def conv_nodes(name: str, batch: int, threads: int, isa: str, repeat: int,
               tap_classes: bool = False) -> dict[str, object]:
    """Per plan node of the convolutions (windowed GEMMs and their permutes) of the plain step:
    label, kind, output shape, the GEMM's M N K, ms (the plan's per node time, best of
    ``repeat`` steps) and GF/s (2*nb*M*N*K per second). ``tap_classes``: also ``ms_one_gemm``,
    the same node with the tap classes off (conv.cpp tap_class_gemm), the two taking turns step
    by step in this process."""
    ex, state, data, _ = _step_setup(name, batch, threads, isa)
    kernel = ex.step_kernel()
    assert kernel is not None, "no whole-step kernel"
    descs = [n.desc for n in ex.graph.nodes]
    prof = kernel.profile()
    ex.run_plain(state, data)  # warm-up
    choices = (0, 2) if tap_classes else (0,)
    best: dict[int, np.ndarray] = {}
    for _ in range(repeat):
        for choice in choices:
            prof.node_s[:] = 0
            _with_tap_classes(isa, choice, functools.partial(ex.run_plain, state, data))()
            best[choice] = prof.node_s.copy() if choice not in best else np.minimum(best[choice], prof.node_s)
    rows, total = [], dict.fromkeys(choices, 0.0)
    for i, (kind, owner) in enumerate(zip(prof.kinds, prof.owner)):
        desc = descs[owner]
        if kind not in ("window gemm", "permute") or not desc.label.startswith("conv"):
            continue
        for choice in choices:
            total[choice] += 1e3 * float(best[choice][i])
        row: dict[str, object] = {"node": i, "label": desc.label, "kind": kind, "out": list(desc.out_shape),
                                  "ms": round(1e3 * float(best[0][i]), 3)}
        if tap_classes:
            row["ms_one_gemm"] = round(1e3 * float(best[2][i]), 3)
        if kind == "window gemm":
            prep = ex.runner.windowed_prepare(desc)
            assert prep.operands is not None
            _, _, nb, M, N = prep.operands
            row.update(nb=nb, M=M, N=N, K=desc.K, gflops=round(2.0 * nb * M * N * desc.K / float(best[0][i]) / 1e9, 1))
        rows.append(row)
    out: dict[str, object] = {"model": name, "batch": batch, "threads": threads, "isa": isa, "nodes": rows,
                              "conv_ms": round(total[0], 2)}
    if tap_classes:
        out["conv_ms_one_gemm"] = round(total[2], 2)
    return out


def _cpu_best(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t)
    return best


def _row_major(desc: Any, be: CpuBackend) -> Callable[[list[np.ndarray]], object]:
    """The dewindowed path as it was before the k-major gathers (a fold still reads row-major):
    each windowed input gathered ``(R, K)``, the plain descriptor reading it with stride K per
    output, kstride 1."""
    from verde_chain.repops.library.shapes import c_strides
    from verde_chain.repops.program import InputMap, KernelDesc

    dw = windowed.dewindow_plan(desc)
    assert dw is not None
    rank, maps = len(desc.out_shape), []
    for t, m in enumerate(desc.inputs):
        if t not in dw.operands:
            maps.append(m)
            continue
        axes = tuple(d for d in range(rank) if windowed._depends(m, d))
        dims = (*[desc.out_shape[a] for a in axes], desc.K)
        st = c_strides(dims)
        maps.append(InputMap(int(np.prod(dims)), tuple(st[axes.index(d)] if d in axes else 0 for d in range(rank)),
                             kstride=1))
    plain = KernelDesc(desc.out_shape, desc.K, tuple(maps), desc.prologue, desc.body, desc.epilogue)

    def run(flat: list[np.ndarray]) -> object:
        data = [x if t not in dw.operands else
                cpu_ext.windowed_gather(dw.operands[t], x, be.isa, be.threads).numpy().reshape(-1).view(np.uint32)
                for t, x in enumerate(flat)]
        return be(plain, [d.view(np.float32) for d in data])

    return run


def families(threads: int, isa: str, repeat: int) -> dict[str, object]:
    """ms of CPU per call (best of ``repeat``), new path and the one it replaced, same process."""
    be = CpuBackend(isa=isa, threads=threads)
    r = np.random.default_rng(0)
    rows: dict[str, object] = {}
    g = ConvGeometry.make((32, 64, 16, 16), (3, 3), (2, 2), None, (1, 1, 1, 1))
    desc = library.max_pool_backward(g)
    out = (32, 64, *g.out_spatial)
    ins = [r.integers(0, 9, out).astype(np.float32), r.standard_normal(out, dtype=np.float32)]
    wp = be.windowed_prepare(desc)
    new = functools.partial(windowed.run, desc, ins, be._windowed_gemm, be, be._windowed_gather, wp,
                            pool_backward=be._pool_backward)
    old = functools.partial(windowed.run, desc, ins, be._windowed_gemm, be, be._windowed_gather, wp)
    assert (new().view(np.uint32) == old().view(np.uint32)).all()
    rows["max_pool_backward 32x64x16x16"] = (round(1e3 * _cpu_best(new, repeat), 2), round(1e3 * _cpu_best(old, repeat), 2))
    for xs in ((32, 64, 16, 16), (32, 128, 4, 4)):
        for desc in (library.channel_dot_xhat(xs), library.channel_centered_meansq(xs), library.channel_mean(xs)):
            ins = [r.standard_normal(m.numel, dtype=np.float32) for m in desc.inputs]
            flat = [x.view(np.uint32) for x in ins]
            now, before = functools.partial(be, desc, ins), functools.partial(_row_major(desc, be), flat)
            assert (np.asarray(before()).view(np.uint32) == now().view(np.uint32)).all()
            rows[f"{desc.label} {'x'.join(map(str, xs))}"] = (round(1e3 * _cpu_best(now, repeat), 2),
                                                             round(1e3 * _cpu_best(before, repeat), 2))
    return {"threads": threads, "isa": isa, "ms_cpu_new_vs_before": rows}


def keep_heap() -> None:
    """This process's glibc malloc keeps freed memory (mmap threshold 32 MiB, the most it takes;
    trim threshold 1 GiB): results of up to 32 MiB come from the heap and go back to it, never to
    the OS, so a call's result is no fresh pages. For comparing with torch at its best: its
    ``conv2d`` otherwise pays page faults in some processes (``FaultCounted``)."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # malloc.h
    if not (libc.mallopt(M_MMAP_THRESHOLD, 32 << 20) and libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)):
        raise SystemExit("--keep-heap: mallopt refused the thresholds (not glibc?)")


class FaultCounted:
    """A function that counts the process's minor page faults over its calls (getrusage around
    each call, about a microsecond). A result of megabytes dropped before the next call can come
    back as fresh pages when malloc has given the memory back to the OS: torch's ``conv2d`` paid
    6,000 faults a call in one process and none in another (2026-12-05), and its time with them."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn, self.calls, self.faults = fn, 0, 0

    def __call__(self) -> object:
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        out = self.fn()
        self.faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        self.calls += 1
        return out

    @property
    def per_call(self) -> float:
        return self.faults / max(1, self.calls)


def best_rotated(fns: list[Callable[[], object]], repeat: int) -> list[float]:
    """Best wall time of each function over ``best_of`` runs in every rotation of their order:
    in a fixed round-robin the function after torch's convolution always ran on the cache and
    memory state torch left (one call order measured the forward call 2.7 ms slower than the
    same kernel called right after it: CPU time, 01:21 UTC). Bursts of two, the first call
    untimed (``best_of``): after torch's call at 2 threads its OpenMP worker spins for ~5 ms on
    the core the next function's worker needs (at 2 threads the backend's whole call measured
    3.4-6 ms above the same kernel in single calls, 2026-12-02, and equal to it alone)."""
    n = len(fns)
    best = [float("inf")] * n
    for r in range(n):
        order = [(i + r) % n for i in range(n)]
        for i, (t, _) in zip(order, best_of([fns[i] for i in order], max(1, -(-repeat // n)), burst=2)):
            best[i] = min(best[i], t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=thread_count, nargs="+", default=[1, 2])
    ap.add_argument("--isa", default=None, help=f"one of {cpu_ext.ISAS}; default: best available")
    ap.add_argument("--repeat", type=positive, default=5)
    ap.add_argument("--shape", type=int, nargs=9, default=[32, 64, 32, 32, 64, 3, 3, 1, 1],
                    metavar=("N", "C", "H", "W", "M", "KH", "KW", "PAD", "STRIDE"))
    ap.add_argument("--step", default=None, choices=VISION_MODELS, help="a vision model: time a training step")
    ap.add_argument("--batch", type=positive, default=32)
    ap.add_argument("--profile", action="store_true", help="with --step: per node label / per aten op times")
    ap.add_argument("--nodes", action="store_true",
                    help="with --step: per conv plan node (GEMM, permute) its shape, M N K, ms and GF/s")
    ap.add_argument("--hashing", action="store_true",
                    help="with --step: the plan plain vs committed, its hash points, one keccak tree over the outputs")
    ap.add_argument("--families", action="store_true", help="pooling backward / channel statistics, new vs before")
    ap.add_argument("--tap-classes", action="store_true",
                    help="with --step [--nodes]: also with the windowed GEMM's tap classes off, taking turns")
    ap.add_argument("--idle-hashing", action="store_true",
                    help="with --step [--hashing]: also hashing at the hash points only, taking turns")
    ap.add_argument("--run", type=int, default=0, metavar="STEPS",
                    help="with --step: a training run of STEPS steps as `verde-chain train` runs it, against torch")
    ap.add_argument("--interval", type=int, default=DEFAULT_CHECKPOINT_INTERVAL,
                    help="with --run: the checkpoint interval (committed steps)")
    ap.add_argument("--keep-heap", action="store_true",
                    help="glibc keeps freed memory in its heap (mallopt): no side pays page faults for fresh results")
    args = ap.parse_args()
    if args.keep_heap:
        keep_heap()
    if args.run and (not args.step or args.nodes or args.profile or args.hashing or args.tap_classes
                     or args.idle_hashing):
        ap.error("--run STEPS takes --step MODEL alone")
    if args.run < 0 or args.interval < 1:
        ap.error("--run STEPS must be >= 1 and --interval >= 1")
    if args.interval != DEFAULT_CHECKPOINT_INTERVAL and not args.run:
        ap.error("--interval takes --run STEPS")
    if (args.nodes or args.profile or args.hashing) and not args.step:
        ap.error("--nodes, --profile and --hashing take a model: --step MODEL")
    if args.nodes + args.profile + args.hashing > 1:
        ap.error("one of --nodes, --profile, --hashing")
    if args.tap_classes and (not args.step or args.profile or args.hashing):
        ap.error("--tap-classes takes --step MODEL, alone or with --nodes")
    if args.idle_hashing and (not args.step or args.profile or args.nodes or args.tap_classes):
        ap.error("--idle-hashing takes --step MODEL, alone or with --hashing")
    n, c, h, w, m, kh, kw, pad, stride = args.shape
    if min(n, c, h, w, m, kh, kw, stride) < 1 or pad < 0 or h + 2 * pad < kh or w + 2 * pad < kw:
        ap.error(f"--shape {' '.join(map(str, args.shape))}: N C H W M KH KW STRIDE take counts of at least 1, "
                 "PAD at least 0, and the padded input must hold the kernel")
    isa = args.isa or cpu_ext.best_isa()
    cpu_ext.extension(isa)  # build outside the timings
    if args.families:
        for t in args.threads:
            print(json.dumps(families(t, isa, args.repeat)))
        return
    if args.step:
        for t in args.threads:
            if args.run:
                row = bench_run(args.step, args.batch, t, isa, args.run, args.interval)
            elif args.nodes:
                row = conv_nodes(args.step, args.batch, t, isa, args.repeat, tap_classes=args.tap_classes)
            elif args.profile:
                row = profile_step(args.step, args.batch, t, isa, args.repeat)
            elif args.hashing:
                row = hashing_step(args.step, args.batch, t, isa, args.repeat, idle_hashing=args.idle_hashing)
            else:
                row = bench_step(args.step, args.batch, t, isa, args.repeat, tap_classes=args.tap_classes,
                                 idle_hashing=args.idle_hashing)
            print(json.dumps(row))
        return
    g = ConvGeometry.make((n, c, h, w), (kh, kw), (stride, stride), None, (pad,) * 4)
    oh, ow = g.out_spatial
    r = np.random.default_rng(0)
    x = r.standard_normal((n, c, h, w), dtype=np.float32)
    wt = r.standard_normal((m, c, kh, kw), dtype=np.float32)
    dy = r.standard_normal((n, m, oh, ow), dtype=np.float32)
    tx, tw, tdy = (torch.from_numpy(a) for a in (x, wt, dy))
    kinds = {
        "forward": (library.convolution(g, wt.shape), [x, wt],
                    lambda: torch.nn.functional.conv2d(tx, tw, padding=pad, stride=stride)),
        "grad_input": (library.conv_grad_input(g, wt.shape), [dy, wt],
                       lambda: torch.ops.aten.convolution_backward(
                           tdy, tx, tw, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1, [True, False, False])),
        "grad_weight": (library.conv_grad_weight(g, wt.shape), [dy, x],
                        lambda: torch.ops.aten.convolution_backward(
                            tdy, tx, tw, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1, [False, True, False])),
    }
    rows = []
    for t in args.threads:
        torch.set_num_threads(t)
        be = CpuBackend(isa=isa, threads=t)
        for kind, (desc, ins, torch_fn) in kinds.items():
            plan = windowed.plan(desc)
            assert plan is not None, kind
            a, b, nb, M, N = windowed.gemm_operands(desc, plan)
            flat = [np.ascontiguousarray(v).reshape(-1).view(np.uint32) for v in ins]
            fns = [FaultCounted(f) for f in (
                torch_fn,
                functools.partial(be, desc, ins),
                functools.partial(cpu_ext.windowed_matmul, a, flat[plan.slot_a], b, flat[plan.slot_b], nb, M, N, isa, t,
                                  split=be.column_split(desc, plan)),
            )]  # fmt: skip
            t_torch, t_call, t_kernel = best_rotated(list(fns), args.repeat)
            faults = [round(f.per_call) for f in fns]
            flops = 2.0 * desc.numel * desc.K
            rows.append({"kind": kind, "threads": t, "isa": isa, "torch_ms": round(t_torch * 1e3, 2),
                         "repops_ms": round(t_call * 1e3, 2), "kernel_ms": round(t_kernel * 1e3, 2),
                         "repops_gflops": round(flops / t_call / 1e9, 1), "ratio": round(t_call / t_torch, 3),
                         "kernel_ratio": round(t_kernel / t_torch, 3), "torch_faults": faults[0],
                         "repops_faults": faults[1], "kernel_faults": faults[2]})
            row = rows[-1]
            print(f"{kind:12s} threads={t} torch {row['torch_ms']:8.2f} ms  repops {row['repops_ms']:8.2f} ms "
                  f"(kernel {row['kernel_ms']:8.2f} ms, {row['repops_gflops']} GF/s)  ratio {row['ratio']:.2f} "
                  f"(kernel {row['kernel_ratio']:.2f})  page faults a call: torch {faults[0]}, repops {faults[1]}, "
                  f"kernel {faults[2]}")
    print(json.dumps({"shape": args.shape, "rows": rows}))


if __name__ == "__main__":
    main()
