"""What ``graph/fusion.py``'s ``fuse_batch_norm`` saves on a vision job, in one process.

    python scripts/bench_fusion.py --model mobilenet_v2 [--rounds 12] [--bytes-only]

Builds the job twice as ``bench_conv.py --step`` does (batch 32, SGD with momentum), once with
the rewrite and once without it (``import_onnx(fuse=...)`` runs every other rewrite either way),
and prints node-output bytes per node label for both; then runs the committed step
(``run_step``) and the plain step (``run_plain``) of the two graphs interleaved, ``--rounds``
times each on one thread, and prints min / median wall seconds. One JSON line at the end.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import statistics
import time
from typing import Any

import numpy as np

from verde_chain.examples.vision import VISION_MODELS


def _setup(name: str, fuse: bool) -> tuple[Any, ...]:
    from unittest import mock

    from verde_chain.examples import vision
    from verde_chain.graph import onnx_import
    from verde_chain.graph.executor import StepExecutor
    from verde_chain.repops.backends.cpu.backend import CpuBackend

    with mock.patch.object(onnx_import, "fuse_batch_norm", onnx_import.fuse_batch_norm if fuse else lambda m: 0):
        prog = vision.vision_job(name, steps=1, batch_size=32, samples=32).program
    r = np.random.default_rng(0)
    X = r.random((32, *vision.input_shape(name)), dtype=np.float32)
    data = prog.batch(1, {"x": X}, r.integers(0, 10, 32).astype(np.float32))
    ex = StepExecutor(prog.graph, CpuBackend(threads=1))
    return prog.graph, ex, ex.initial_state(prog.initial_state()), data


def _bytes(graph: Any) -> dict[str, int]:
    per: dict[str, int] = collections.Counter()
    for n in graph.nodes:
        per[n.label or n.desc.label] += 4 * math.prod(n.desc.out_shape)
    return dict(per)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mobilenet_v2", choices=VISION_MODELS)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--bytes-only", action="store_true", help="print the bytes table only")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    import torch

    torch.set_num_threads(1)
    runs = {label: _setup(args.model, fuse) for label, fuse in (("before", False), ("after", True))}
    sizes = {label: _bytes(r[0]) for label, r in runs.items()}
    print(f"{'label':44} {'MB before':>10} {'MB after':>10}")
    for lab in sorted(set(sizes["before"]) | set(sizes["after"]), key=lambda k: -sizes["before"].get(k, 0)):
        b, a = sizes["before"].get(lab, 0), sizes["after"].get(lab, 0)
        if max(a, b) >= 1e5:
            print(f"{lab:44} {b / 1e6:10.2f} {a / 1e6:10.2f}")
    out: dict[str, Any] = {"model": args.model, **{f"mb_{k}": round(sum(v.values()) / 1e6, 2) for k, v in sizes.items()},
                           **{f"nodes_{k}": len(r[0].nodes) for k, r in runs.items()}}
    if not args.bytes_only:
        times: dict[str, list[float]] = collections.defaultdict(list)
        for _, ex, st, data in runs.values():  # warm-up: scratch, page faults
            ex.run_step(st, data)
            ex.run_plain(st, data)
        for _ in range(args.rounds):
            for label, (_, ex, st, data) in runs.items():
                for kind, fn in (("committed", ex.run_step), ("plain", ex.run_plain)):
                    t0 = time.perf_counter()
                    fn(st, data)
                    times[f"{label}_{kind}"].append(time.perf_counter() - t0)
        for key, v in times.items():
            out[f"{key}_min_s"], out[f"{key}_median_s"] = round(min(v), 4), round(statistics.median(v), 4)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
