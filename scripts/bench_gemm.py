"""Benchmark the RepOps GEMM (fixed fma chain) against torch.matmul at the same thread count.

Usage: python scripts/bench_gemm.py [--sizes 256 512 1024 2048] [--shapes 32x256x256 ...] [--stored-b 32x512x256 ...]
       [--a-transposed 1024x512x64 ...]
       [--threads 1 2] [--isa avx512] [--tile MC KC NC] [--repeat 5] [--burst 3] [--settle-ms 20]
       [--baseline build/native/verde_repops_cpu_avx512_<key>]

Square FP32 GEMMs (--sizes n: n x n @ n x n), --shapes MxKxN: a Linear layer's x (M, K) @ W^T
with W (N, K), B a transposed view as nn.Linear passes it (a transformer's projections: few rows),
and --stored-b MxKxN: a (M, K) @ B (K, N) with B's rows contiguous, as the backward pass's dy @ W
has it (at most 64 rows: B read in place, gemm.cpp gemm_b_in_place), and --a-transposed MxKxN:
A^T @ B with A stored as (K, M) and B (K, N), a weight gradient x^T @ dy (dW^T of a Linear layer).
Best-of-N wall time (the machine is shared), measured round-robin in one process, in bursts of
--burst calls per function whose first call is not timed (see best_of). Per row: the ratio
repops / torch at the same thread count, and the CPU utilisation of each (process CPU time /
wall time over the timed calls: 2.0 = two cores busy throughout; not meaningful for calls of
tens of microseconds, below the process clock's resolution) and
the CPU time its threads burn in a 5 ms sleep right after one call (idle_cpu_ms); then
the speed-up from the smallest to each larger thread count. Prints the load average before the
run (figures taken on a busy machine are not comparable), tables and one JSON line. Goals
(issue #14): ratio <= 1.1 at 1024 and 2048, <= 1.5 at 256; speed-up 1 -> 2 threads >= 1.8 at
n >= 1024.

``--baseline DIR``: another build of the kernels (a folder of build/native, e.g. the one main's
sources built before a change: the folder name carries the sources' key), its bits checked equal
to this build's, then timed against this build in pairs (``paired_ratio``); per row
``vs_baseline`` = the median of this build / the baseline over the pairs, and its quartiles.
Two builds compared in one process meet the same machine state, which separate runs minutes
apart do not (torch's own times moved by 10% between runs); in pairs whose order alternates,
neither build always runs on the state the other left. The same build against itself measured
0.998-1.001, quartiles 0.989-1.009 (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from verde_chain.repops.backends.cpu import extension as cpu_ext
from verde_chain.repops.backends.registry import thread_count


def best_of(
    fns: list[Callable[[], object]], repeat: int, budget_s: float = 20.0, burst: int = 1, settle_s: float = 0.0
) -> list[tuple[float, float]]:
    """(best wall time, CPU utilisation) of each function, measured round-robin (shared machine:
    load from other processes then hits all of them alike). Utilisation is the process's CPU
    time over wall time summed over every timed call of that function.

    ``burst`` > 1: each round calls each function ``burst`` times in a row and times only the
    calls after the first. Another library's idle threads then have settled: after a call on
    2 threads, torch's OpenMP worker spins for milliseconds (~4 ms of CPU measured on the 2-core
    machine, issue #14) on the core the next function's threads need. ``settle_s``: before each
    burst, untimed calls are repeated until that much wall time has passed, as a 256^2 GEMM (~0.2 ms) ends
    before torch's worker stops spinning: at 2 threads three calls in a row still ran at their
    1-thread speed (1.0x speed-up, against 1.5x alone)."""
    for fn in fns:
        fn()  # warm-up (page faults, thread pool start, lazy init)
    best, spent = [float("inf")] * len(fns), 0.0
    wall, cpu = [0.0] * len(fns), [0.0] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            settle_end = time.perf_counter() + settle_s
            while burst > 1 and time.perf_counter() < settle_end:
                fn()  # untimed, before the burst: the other function's threads settle meanwhile
            for call in range(burst):
                c0, t0 = time.process_time(), time.perf_counter()
                fn()
                dt, dc = time.perf_counter() - t0, time.process_time() - c0
                spent += dt
                if call > 0 or burst == 1:
                    best[i] = min(best[i], dt)
                    wall[i], cpu[i] = wall[i] + dt, cpu[i] + dc
        if spent > budget_s:
            break
    return [(b, c / w) for b, c, w in zip(best, cpu, wall)]


def paired_ratio(this: Callable[[], object], base: Callable[[], object], rounds: int,
                 min_burst_s: float = 0.05) -> tuple[float, float, float]:
    """(median, lower and upper quartile) over ``rounds`` pairs of wall time(this) / wall
    time(base), the two taking turns and the order alternating pair by pair. Each time is a
    burst of calls after one untimed call, at least ``min_burst_s`` long (at least two calls)."""
    this()
    t0 = time.perf_counter()
    base()
    burst = max(2, int(min_burst_s / max(time.perf_counter() - t0, 1e-6)))

    def wall(fn: Callable[[], object]) -> float:
        fn()
        t0 = time.perf_counter()
        for _ in range(burst):
            fn()
        return time.perf_counter() - t0

    ratios = []
    for r in range(rounds):
        if r % 2 == 0:
            t_this = wall(this)
            t_base = wall(base)
        else:
            t_base = wall(base)
            t_this = wall(this)
        ratios.append(t_this / t_base)
    ratios.sort()
    return statistics.median(ratios), ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]


def idle_cpu_ms(fn: Callable[[], object], sleep_s: float = 0.005, calls: int = 5) -> float:
    """Process CPU time (ms) burnt while the caller sleeps ``sleep_s`` right after one call of
    ``fn``, averaged over ``calls``: threads left spinning by the call (torch's OpenMP workers,
    the pool's ~2 ms spin). CPU time, not wall time, so other processes' load barely enters it."""
    total = 0.0
    for _ in range(calls):
        fn()
        c0 = time.process_time()
        time.sleep(sleep_s)
        total += time.process_time() - c0
    return 1e3 * total / calls


def speedups(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Per size or shape, the speed-up of each thread count over the smallest one measured."""
    out = []
    for n in dict.fromkeys(r["n"] for r in rows):  # in the order measured
        at = {int(str(r["threads"])): r for r in rows if r["n"] == n}
        base = min(at)
        for t in sorted(at)[1:]:
            rep = float(str(at[base]["repops_ms"])) / float(str(at[t]["repops_ms"]))
            tor = float(str(at[base]["torch_ms"])) / float(str(at[t]["torch_ms"]))
            big_square = isinstance(n, int) and n >= 1024
            out.append({"n": n, "threads": f"{base}->{t}", "repops_speedup": round(rep, 2),
                        "torch_speedup": round(tor, 2), "repops_cpu": at[t]["repops_cpu"],
                        "goal": 1.8 if big_square and (base, t) == (1, 2) else None})
    return out


def positive(text: str) -> int:
    """An integer >= 1 (argparse type: one line, no traceback)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"want a whole number >= 1, got {text!r}")
    return int(text)


def shape(text: str) -> tuple[int, int, int]:
    """``MxKxN`` (argparse type)."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"a shape is MxKxN with positive integers, got {text!r}")
    m, k, n = (int(p) for p in parts)
    return m, k, n


def baseline_build(text: str) -> ModuleType:
    """A built RepOps CPU extension, given its build folder or its .so (argparse type)."""
    path = Path(text)
    so = path / f"{path.name}.so" if path.is_dir() else path
    name = so.name.split(".")[0]
    if not (so.is_file() and name.startswith("verde_repops_cpu_")):
        raise argparse.ArgumentTypeError(
            f"want a RepOps CPU build: a folder build/native/verde_repops_cpu_<isa>_<key> holding its .so, got {text!r}")
    spec = importlib.util.spec_from_file_location(name, so)
    if spec is None or spec.loader is None:
        raise argparse.ArgumentTypeError(f"{so} does not load as a RepOps CPU build")
    try:  # an extension is loaded (dlopen, its init function) by module_from_spec already
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as exc:
        raise argparse.ArgumentTypeError(f"{so} does not load as a RepOps CPU build: {exc}") from None
    if not hasattr(module, "matmul3"):
        raise argparse.ArgumentTypeError(f"{so} has no matmul3: not a RepOps CPU build")
    return module


def build_matmul(ext: ModuleType, a: torch.Tensor, b: torch.Tensor, threads: int,
                 tile: tuple[int, ...]) -> torch.Tensor:
    """``a @ b`` (two matrices) on a given build's kernel, as ``cpu_ext.matmul`` calls it."""
    return ext.matmul3(a.unsqueeze(0), b.unsqueeze(0), threads, *tile)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", type=positive, nargs="*", default=[256, 512, 1024, 2048])
    ap.add_argument("--shapes", type=shape, nargs="+", default=[], metavar="MxKxN",
                    help="x (M, K) @ W^T, W (N, K): a Linear layer's GEMM (no goal; ratios and speed-ups)")
    ap.add_argument("--stored-b", type=shape, nargs="+", default=[], metavar="MxKxN",
                    help="a (M, K) @ B (K, N), B's rows contiguous as stored: a layer's input gradient "
                         "dy @ W (no goal)")
    ap.add_argument("--a-transposed", type=shape, nargs="+", default=[], metavar="MxKxN",
                    help="A^T (M, K) @ B (K, N), A stored as (K, M): a weight gradient x^T @ dy (no goal)")
    ap.add_argument("--threads", type=thread_count, nargs="+", default=[1, 2])
    ap.add_argument("--isa", default=None, help=f"one of {cpu_ext.ISAS}; default: best available")
    ap.add_argument("--tile", type=positive, nargs=3, default=None, metavar=("MC", "KC", "NC"))
    ap.add_argument("--repeat", type=positive, default=5)
    ap.add_argument("--burst", type=positive, default=3,
                    help="calls per function per round, the first untimed (1: plain round-robin)")
    ap.add_argument("--settle-ms", type=float, default=20.0,
                    help="with --burst > 1, untimed calls before each burst last at least this long")
    ap.add_argument("--baseline", type=baseline_build, default=None, metavar="DIR",
                    help="another build (build/native/verde_repops_cpu_<isa>_<key>) timed against this one in pairs")
    args = ap.parse_args()
    if not args.sizes and not args.shapes and not args.stored_b and not args.a_transposed:
        ap.error("nothing to measure: give --sizes N ..., --shapes MxKxN ..., --stored-b MxKxN ... or "
                 "--a-transposed MxKxN ...")

    isa = args.isa or cpu_ext.best_isa()
    cpu_ext.extension(isa)  # build outside the timings
    print(f"load average before the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    rows = []
    gen = torch.Generator().manual_seed(0)
    cases: list[tuple[int | str, torch.Tensor, torch.Tensor]] = [
        (n, torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)) for n in args.sizes]
    cases += [(f"{m}x{k}x{n}", torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen).t())
              for m, k, n in args.shapes]
    cases += [(f"{m}x{k}x{n} B stored", torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen))
              for m, k, n in args.stored_b]
    cases += [(f"{m}x{k}x{n} A transposed", torch.randn(k, m, generator=gen).t(), torch.randn(k, n, generator=gen))
              for m, k, n in args.a_transposed]
    for n, a, b in cases:
        for t in args.threads:
            torch.set_num_threads(t)
            fns: list[Callable[[], object]] = [
                functools.partial(torch.matmul, a, b),
                functools.partial(cpu_ext.matmul, a, b, isa=isa, threads=t, tile=args.tile),
            ]
            if args.baseline is not None:
                # Both builds called the same way (the kernel straight, without matmul's checks in
                # Python, ~4% of a 256^2 call): the ratio is then the kernels' alone.
                tile = tuple(args.tile or cpu_ext.DEFAULT_TILE)
                this = functools.partial(build_matmul, cpu_ext.extension(isa), a, b, t, tile)
                base = functools.partial(build_matmul, args.baseline, a, b, t, tile)
                try:
                    base_out = base()
                except (TypeError, RuntimeError) as exc:
                    raise SystemExit(f"the baseline build's matmul3 cannot be called as this one's: {exc}") from None
                if not torch.equal(base_out.view(torch.int32), this().view(torch.int32)):
                    raise SystemExit(f"n={n} threads={t}: the baseline build's bits differ from this build's")
            (t_torch, cpu_torch), (t_rep, cpu_rep) = best_of(fns, args.repeat, burst=args.burst,
                                                          settle_s=args.settle_ms / 1e3)
            idle_torch, idle_rep = idle_cpu_ms(fns[0]), idle_cpu_ms(fns[1])
            flops = 2.0 * a.shape[0] * a.shape[1] * b.shape[1]
            rows.append(
                {
                    "n": n,
                    "threads": t,
                    "isa": isa,
                    "torch_ms": round(t_torch * 1e3, 4),
                    "repops_ms": round(t_rep * 1e3, 4),
                    "torch_gflops": round(flops / t_torch / 1e9, 1),
                    "repops_gflops": round(flops / t_rep / 1e9, 1),
                    "ratio": round(t_rep / t_torch, 3),
                    "goal": None if isinstance(n, str) else 1.5 if n <= 256 else 1.1,
                    "torch_cpu": round(cpu_torch, 2),
                    "repops_cpu": round(cpu_rep, 2),
                    "idle_cpu_ms_torch": round(idle_torch, 2),
                    "idle_cpu_ms_repops": round(idle_rep, 2),
                }
            )
            r = rows[-1]
            versus = ""
            if args.baseline is not None:
                med, lo, hi = paired_ratio(this, base, max(10, 4 * args.repeat))
                r["vs_baseline"], r["vs_baseline_quartiles"] = round(med, 3), [round(lo, 3), round(hi, 3)]
                versus = f"  this build / baseline {med:.3f} (quartiles {lo:.3f}-{hi:.3f})"
            goal = f"  (goal <= {r['goal']})" if r["goal"] else ""
            print(
                f"n={n!s:>5} threads={t} {isa:7s} torch {r['torch_ms']:9.4f} ms ({r['torch_gflops']:6.1f} GF/s)"
                f"  repops {r['repops_ms']:9.4f} ms ({r['repops_gflops']:6.1f} GF/s)  ratio {r['ratio']:.3f}"
                f"{goal}  CPU {r['torch_cpu']:.2f} / {r['repops_cpu']:.2f}"
                f"  idle CPU after a call {idle_torch:.2f} / {idle_rep:.2f} ms{versus}",
                flush=True,
            )
    ups = speedups(rows)
    for u in ups:
        goal = f"  (goal >= {u['goal']})" if u["goal"] else ""
        print(f"n={u['n']!s:>5} threads {u['threads']}: repops {u['repops_speedup']:.2f}x (CPU {u['repops_cpu']:.2f})"
              f"  torch {u['torch_speedup']:.2f}x{goal}")
    print(json.dumps({"gemm": rows, "speedup": ups, "load": os.getloadavg(), "torch_version": torch.__version__}))


if __name__ == "__main__":
    main()
