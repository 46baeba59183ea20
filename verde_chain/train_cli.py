"""``verde-chain train <job file | example>``: run a training job with commitments.

``verde_chain/cli.py`` registers it with ``configure(parser)`` and ``run(args)``. The last line
with ``--json`` is one JSON object: final_commitment (0x hex), steps, wall_s, final_loss,
accuracy (digits, digits_cnn: test accuracy; else null), spec_hash, graph_root, c0, nodes,
checkpoint_interval, shards (S of the job), comm_s and comm_bytes (rank 0's time in collectives
and bytes received from the other ranks; 0 in one process) and workers (per rank: rank, pid,
first_shard, shards).

``--workers W`` runs the job's S shards on W processes (``graph/distributed.py``, started by
``graph/launch.py``; under torchrun, its process group): the same commitments as one process.

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
import os
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
    p.add_argument("--shards", type=int, default=None,
                   help="examples: split each step's batch into S micro-batch shards (part of the job: moves its "
                   "commitments; bundles carry their own, set by `job create --shards`)")
    p.add_argument("--workers", type=int, default=1,
                   help="processes computing the shards (gloo; 1..S; never changes a bit). Under torchrun the "
                   "process group is torchrun's and this is ignored")


def job_of(args: argparse.Namespace) -> Job:
    """The job the arguments name: an example built with their steps and interval, or a bundle."""
    from verde_chain.examples import EXAMPLES

    if args.job in EXAMPLES:
        kw: dict[str, Any] = {}
        if args.steps is not None:
            kw["steps"] = args.steps
        shards = getattr(args, "shards", None)  # callers building a Namespace by hand may leave it out
        if shards is not None:
            if "shards" not in inspect.signature(EXAMPLES[args.job]).parameters:
                raise VerdeError(f"the {args.job} example has no --shards option")
            kw["shards"] = shards
        if args.checkpoint_interval is not None:
            kw["checkpoint_interval"] = args.checkpoint_interval
        else:  # the market refuses a checkpoint interval above T
            steps = kw.get("steps", inspect.signature(EXAMPLES[args.job]).parameters["steps"].default)
            kw["checkpoint_interval"] = min(DEFAULT_CHECKPOINT_INTERVAL, steps)
        return EXAMPLES[args.job](**kw)
    job = load_job(args.job)
    if getattr(args, "shards", None) not in (None, job.spec.shards):
        raise VerdeError(f"{args.job} has {job.spec.shards} shard(s); --shards only builds examples (re-create the "
                         "bundle with `verde-chain job create --shards S`)")
    return job


def _shards_named(args: argparse.Namespace) -> int:
    """S of the job the arguments name, without building it (the launcher's check)."""
    from verde_chain.examples import EXAMPLES

    if args.job in EXAMPLES or args.shards is not None:
        return args.shards or 1
    p = Path(args.job)
    try:
        return int(json.loads((p / "job.json" if p.is_dir() else p).read_text()).get("shards", 1))
    except (OSError, ValueError, AttributeError) as exc:
        raise VerdeError(f"{args.job}: not a job bundle ({type(exc).__name__}: {exc})") from exc


def _worker_argv(args: argparse.Namespace) -> list[str]:
    """The command each rank of ``--workers`` runs: this one, as a rank."""
    argv = [sys.executable, "-m", "verde_chain.cli", "train", str(args.job), "--backend", args.backend,
            "--workers", str(args.workers)]
    for flag, v in (("--steps", args.steps), ("--threads", args.threads), ("--shards", args.shards),
                    ("--checkpoint-interval", args.checkpoint_interval), ("--out", args.out)):
        if v is not None:
            argv += [flag, str(v)]
    return argv + [f for f, on in (("--resume", args.resume), ("--json", args.json)) if on]


def _launch(args: argparse.Namespace) -> int:
    from verde_chain.graph.distributed import shard_ranges
    from verde_chain.graph.launch import launch

    shard_ranges(_shards_named(args), args.workers)  # refuse W > S before starting anything
    hint = (f"Resume from its last checkpoint with the same command and --resume (any --workers): checkpoints in "
            f"{args.out}" if args.out is not None else "Pass --out DIR to keep checkpoints a run can resume from.")
    launch(_worker_argv(args), args.workers, hint)
    return 0


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
    from verde_chain.graph.distributed import PEER_LOST_STATUS, WorkerLostError, distributed_env

    if not distributed_env():
        return _run(args)
    try:
        return _run(args)
    except WorkerLostError as exc:
        # a rank that lost a peer leaves at once: tearing down the gloo group would abort the
        # interpreter (its threads still wait on the dead peer), hiding this one line
        print(f"verde-chain train: error: {exc}", file=sys.stderr, flush=True)
        os._exit(PEER_LOST_STATUS)


def _run(args: argparse.Namespace) -> int:
    from verde_chain.graph.distributed import (
        ShardedExecutor,
        TorchCollective,
        distributed_env,
        distributed_run,
        worker_info,
    )

    if args.workers < 1:
        raise VerdeError(f"--workers must be >= 1, got {args.workers}")
    if args.resume and args.out is None:
        raise VerdeError("--resume needs --out (the directory holding the checkpoints)")
    if args.workers > 1 and not distributed_env():
        return _launch(args)
    set_threads(args.threads)
    job = job_of(args)
    steps = min(args.steps or job.spec.steps, job.spec.steps)
    coll = TorchCollective(cuda=args.backend == "cuda") if distributed_env() else None
    rank0 = coll is None or coll.rank == 0
    if args.out is not None and not args.resume and rank0:
        save_job(job, args.out / "job")
    interval = args.checkpoint_interval
    if interval is None:
        interval = job.spec.checkpoint_interval or DEFAULT_CHECKPOINT_INTERVAL
    if interval < 0:
        raise VerdeError(f"--checkpoint-interval must be >= 0, got {interval}")
    runner = make_runner(args.backend, args.threads)
    executor = ShardedExecutor(job.program.graph, coll, runner) if coll is not None else None
    tr = job.make_run(args.out if rank0 else None, interval, runner, job.spec.steps, fresh=not args.resume,
                      executor=executor)
    if coll is not None:
        start = distributed_run(tr, coll, args.resume)
    elif args.resume:
        start = tr.resume()
    if args.resume and rank0 and not args.json:
        print(f"resumed from the verified checkpoint of step {start}")
    tty = sys.stdout.isatty() and not args.json and rank0
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
        "shards": job.spec.shards,
        "comm_s": round(executor.comm_s, 4) if executor is not None else 0.0,
        "comm_bytes": executor.comm_bytes if executor is not None else 0,
        "workers": worker_info(coll, job.spec.shards) if coll is not None else [
            {"rank": 0, "pid": os.getpid(), "first_shard": 0, "shards": job.spec.shards}],
    }
    if coll is not None:
        coll.close()
    if not rank0:
        return 0
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
