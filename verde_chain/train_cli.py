"""``verde-chain train <job file | example>``: run a training job with commitments.

``verde_chain/cli.py`` registers it with ``configure(parser)`` and ``run(args)``. The last line
with ``--json`` is one JSON object: final_commitment (0x hex), steps, wall_s, final_loss,
accuracy (digits, digits_cnn: test accuracy; else null), spec_hash, graph_root, c0, nodes,
checkpoint_interval.

The run commits only the steps it stores or publishes (checkpoint steps and the last step; see
``graph/executor.py``); ``commitments.json`` lists those. The checkpoint interval is
``--checkpoint-interval`` if given, else the job's own if it names one (> 0), else
``DEFAULT_CHECKPOINT_INTERVAL`` (100 steps; the example jobs are built with it, or with T if
that is shorter: the market refuses an interval above T).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from verde_chain.errors import VerdeError
from verde_chain.graph.backend import DEFAULT_BACKEND, THREADS_HELP, make_runner, set_threads, thread_count
from verde_chain.graph.executor import DEFAULT_CHECKPOINT_INTERVAL, StepLog, StepState
from verde_chain.job import Job, load_job, save_job


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="a job bundle (directory or job.json), or an example: "
                   "digits | transformer | digits_cnn | resnet18 | mobilenet_v2")
    p.add_argument("--steps", type=int, default=None, help="number of steps (examples: T of the job; bundles: stop early)")
    p.add_argument("--threads", type=thread_count, default=None, help=THREADS_HELP)
    p.add_argument("--checkpoint-interval", type=int, default=None,
                   help=f"store (and commit) the full state every N steps; default: the job's, else "
                   f"{DEFAULT_CHECKPOINT_INTERVAL}; 0 = only step 0 and the final step")
    p.add_argument("--out", type=Path, default=None, help="directory for checkpoints, commitments and the job bundle")
    p.add_argument("--resume", action="store_true", help="continue from the latest verified checkpoint in --out")
    p.add_argument("--backend", default=DEFAULT_BACKEND,
                   help="RepOps backend: cpu (C++ kernels; default, falls back to reference if it cannot build), "
                   "reference (numpy), cuda, or a registered one")
    p.add_argument("--json", action="store_true", help="print one JSON summary line at the end")


def job_of(args: argparse.Namespace) -> Job:
    """The job the arguments name: an example built with their steps and interval, or a bundle."""
    from verde_chain.examples import EXAMPLES

    if args.job in EXAMPLES:
        kw: dict[str, Any] = {}
        if args.steps is not None:
            kw["steps"] = args.steps
        if args.checkpoint_interval is not None:
            kw["checkpoint_interval"] = args.checkpoint_interval
        else:  # the market refuses a checkpoint interval above T
            steps = kw.get("steps", inspect.signature(EXAMPLES[args.job]).parameters["steps"].default)
            kw["checkpoint_interval"] = min(DEFAULT_CHECKPOINT_INTERVAL, steps)
        return EXAMPLES[args.job](**kw)
    return load_job(args.job)


def _bar(log: StepLog, total: int, t0: float) -> None:
    width = 30
    done = int(width * log.step / total)
    sys.stdout.write(
        f"\r[{'#' * done}{'.' * (width - done)}] step {log.step}/{total} loss {log.loss:.4f} "
        f"{time.perf_counter() - t0:6.1f}s"
    )
    sys.stdout.flush()


def _accuracy(job: Job, state: dict[str, np.ndarray]) -> float | None:
    if job.spec.name == "digits_cnn":
        from verde_chain.examples.vision import digits_cnn_accuracy

        return digits_cnn_accuracy(state)
    if job.spec.name != "digits-mlp":
        return None
    from verde_chain.examples.digits import digits_data, mlp_accuracy

    _, (Xt, yt) = digits_data()
    return mlp_accuracy(state, Xt, yt)


def run(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    job = job_of(args)
    steps = min(args.steps or job.spec.steps, job.spec.steps)
    if args.resume and args.out is None:
        raise VerdeError("--resume needs --out (the directory holding the checkpoints)")
    if args.out is not None and not args.resume:
        save_job(job, args.out / "job")
    interval = args.checkpoint_interval
    if interval is None:
        interval = job.spec.checkpoint_interval or DEFAULT_CHECKPOINT_INTERVAL
    if interval < 0:
        raise VerdeError(f"--checkpoint-interval must be >= 0, got {interval}")
    tr = job.make_run(args.out, interval, make_runner(args.backend, args.threads), job.spec.steps, fresh=not args.resume)
    if args.resume:
        start = tr.resume()
        if not args.json:
            print(f"resumed from the verified checkpoint of step {start}")
    tty = sys.stdout.isatty() and not args.json
    t0 = time.perf_counter()
    tr.run(until=steps, progress=(lambda log: _bar(log, steps, t0)) if tty else None)
    wall = time.perf_counter() - t0
    if tty:
        sys.stdout.write("\n")
    state = {s.name: tr.state.tensors[s.producer].reshape(s.shape) for s in job.program.graph.states}
    final = tr.logs[-1] if tr.logs else None
    assert isinstance(tr.state, StepState)  # run() always commits its last step; resume loads a committed one
    summary = {
        "final_commitment": "0x" + tr.state.commitment.hex(),
        "steps": tr.state.step,
        "wall_s": round(wall, 3),
        "final_loss": final.loss if final and final.loss == final.loss else None,  # NaN: inference
        "accuracy": _accuracy(job, state),
        "spec_hash": "0x" + job.spec.hash().hex(),
        "graph_root": "0x" + job.spec.graph_root.hex(),
        "c0": "0x" + job.spec.initial_commitment.hex(),
        "nodes": job.spec.num_nodes,
        "checkpoint_interval": interval,
    }
    if args.out is not None:
        (args.out / "commitments.json").write_text(
            json.dumps({str(k): "0x" + v.hex() for k, v in tr.commitments.computed().items()}, indent=1)
        )
    if args.json:
        print(json.dumps(summary))
    else:
        for k, v in summary.items():
            print(f"{k:>17}: {v}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="verde-chain train")
    configure(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
