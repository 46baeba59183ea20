"""``verde-chain job create``: a job bundle from a user's ONNX model and ``.npz`` data.

``verde_chain/cli.py`` registers the ``job`` command with ``configure(parser)`` and
``run(args)``; ``create`` is local (no chain), ``status`` and ``results`` read a market
(``verde_chain/agents/commands.py``).

``job create`` checks before it builds: every unsupported node of the model in one message,
then the data (NaN/inf samples, labels the loss cannot read, integers binary32 cannot hold),
each a named error on one line. Then it builds the training (or inference) program and every
commitment, and writes the bundle ``--out`` that ``verde-chain client --bundle`` posts. The
data file holds ``X`` (samples, first axis) and ``Y`` (labels or targets; an inference job
may leave it out); integer arrays (token ids, class labels) are converted exactly.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from verde_chain.graph.data import Dataset
from verde_chain.graph.errors import DataError, JobSpecError
from verde_chain.graph.executor import DEFAULT_CHECKPOINT_INTERVAL
from verde_chain.graph.training import LOSSES, OPTIMIZERS, LossSpec, OptimizerSpec
from verde_chain.job import Job, make_job, save_job


def configure(p: argparse.ArgumentParser) -> None:
    from verde_chain.agents.commands import job_status_args

    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    create_args(sub.add_parser("create", help="a job bundle from your ONNX model and .npz data (no chain)",
                               description="Check an ONNX model and .npz data (every problem named), build the job's "
                               "program and commitments, and write the bundle `verde-chain client --bundle` posts."))
    job_status_args(sub.add_parser("status", help="a job's spec, slots and disputes"))


def run(args: argparse.Namespace) -> int:
    if args.action == "create":
        return run_create(args)
    from verde_chain.agents.commands import run_job_status

    return run_job_status(args)


def create_args(p: argparse.ArgumentParser) -> None:
    d = OptimizerSpec()
    p.add_argument("--model", type=Path, required=True, help="the ONNX model (static shapes; its first input's first "
                   "dimension is the batch size)")
    p.add_argument("--data", type=Path, required=True,
                   help=".npz with X (samples) and Y (labels or targets; optional for --kind inference)")
    p.add_argument("--batch-size", type=int, default=None, help="samples per step (default: the model input's first "
                   "dimension, which it must equal)")
    p.add_argument("--steps", type=int, required=True, help="T: training steps, or inference batches")
    p.add_argument("--shards", type=int, default=1,
                   help="S micro-batch shards per step: the model's batch dimension is one shard, a step reads S "
                   "of them (batch size S x the model's), combined in a fixed order; `train --workers` runs them "
                   "on up to S processes")
    p.add_argument("--kind", choices=("train", "inference"), default="train")
    p.add_argument("--loss", choices=LOSSES, default="cross_entropy",
                   help="cross_entropy (integer class labels) or mse (targets of the output's shape)")
    p.add_argument("--ignore-index", type=int, default=None,
                   help="cross_entropy: a label value that counts for nothing (e.g. -100 for padding)")
    p.add_argument("--loss-output", default="", help="the model output the loss reads (default: the first)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=d.kind)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--momentum", type=float, default=d.momentum, help="sgd")
    p.add_argument("--nesterov", action="store_true", help="sgd with momentum")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--beta1", type=float, default=d.beta1, help="adam/adamw")
    p.add_argument("--beta2", type=float, default=d.beta2, help="adam/adamw")
    p.add_argument("--eps", type=float, default=d.eps, help="adam/adamw")
    p.add_argument("--checkpoint-interval", type=int, default=None,
                   help=f"trainers keep the state every N steps (default min({DEFAULT_CHECKPOINT_INTERVAL}, T))")
    p.add_argument("--seed", type=int, default=0, help="seed of the batch schedule")
    p.add_argument("--frozen", action="append", default=[], metavar="NAMES",
                   help="initializers that are not trained (comma-separated; repeatable), e.g. buffers")
    p.add_argument("--name", default=None, help="the job's name (default: the model file's stem)")
    p.add_argument("--out", type=Path, required=True, help="directory to write the bundle to")
    p.add_argument("--json", action="store_true", help="print one JSON line describing the bundle")


def read_npz(path: Path, kind: str, input_name: str = "x") -> Dataset:
    """X and Y of a ``.npz`` (Y optional for inference) as a ``Dataset`` (integers exact)."""
    if not path.is_file():
        raise DataError(f"no data file {path}; save one with np.savez({str(path)!r}, X=samples, Y=labels)",
                        tensor="X")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError) as exc:  # not a zip, pickled objects, truncated
        raise DataError(f"{path} is not a readable .npz ({exc}); save one with np.savez(path, X=..., Y=...)",
                        tensor="X") from exc
    for key in ("X", "Y") if kind == "train" else ("X",):
        if key not in arrays:
            raise DataError(f"{path} has no array {key!r} (it holds {sorted(arrays) or 'nothing'}); save it with "
                            "np.savez(path, X=samples, Y=labels)", tensor=key)
    return Dataset.from_arrays(arrays["X"], arrays.get("Y"), input_name)


def _model_batch_size(onnx_bytes: bytes) -> int | None:
    """The first dimension of the model's first graph input, if the file states one."""
    from verde_chain.graph.onnx_import import load_onnx

    proto = load_onnx(onnx_bytes)
    inits = {i.name for i in proto.graph.initializer}
    for inp in proto.graph.input:
        if inp.name not in inits:
            dims = inp.type.tensor_type.shape.dim
            return int(dims[0].dim_value) if dims and dims[0].dim_value > 0 else None
    return None


def create(args: argparse.Namespace) -> Job:
    """The job the arguments describe (checked, then built); nothing is written."""
    if not args.model.is_file():
        raise JobSpecError(f"no model file {args.model}; export one with torch.onnx.export or use job_from_torch")
    onnx_bytes = args.model.read_bytes()
    data = read_npz(args.data, args.kind)
    model_batch = _model_batch_size(onnx_bytes)
    batch_size = args.batch_size or (model_batch * args.shards if model_batch else None)
    if batch_size is None:
        raise JobSpecError(f"{args.model} has no fixed batch dimension; pass --batch-size (and export with fixed shapes)")
    interval = args.checkpoint_interval
    if interval is None:
        interval = min(DEFAULT_CHECKPOINT_INTERVAL, args.steps)
    frozen = tuple(n for item in args.frozen for n in item.split(",") if n)
    loss = LossSpec(args.loss, args.loss_output, args.ignore_index)
    opt = OptimizerSpec(args.optimizer, args.lr, args.momentum, args.nesterov, args.weight_decay, args.beta1,
                        args.beta2, args.eps)
    return make_job(args.name or args.model.stem, onnx_bytes, data, loss, opt, args.steps, batch_size, args.seed,
                    interval, frozen, kind=args.kind, shards=args.shards)


def describe(job: Job, out: Path) -> dict[str, Any]:
    s = job.spec
    return {
        "bundle": str(out), "name": s.name, "kind": s.kind, "steps": s.steps, "batch_size": s.batch_size,
        "samples": len(job.dataset), "nodes": s.num_nodes, "spec_hash": "0x" + s.hash().hex(),
        "graph_root": "0x" + s.graph_root.hex(), "c0": "0x" + s.initial_commitment.hex(),
        "batch_root": "0x" + s.batch_root.hex(),
    }


def run_create(args: argparse.Namespace) -> int:
    job = create(args)
    save_job(job, args.out)
    info = describe(job, args.out)
    if args.json:
        print(json.dumps(info, sort_keys=True))
    else:
        print(f"job bundle {args.out}: {job.spec.kind} job {job.spec.name!r}, {job.spec.steps} steps of "
              f"{job.spec.batch_size} samples ({len(job.dataset)} in the dataset), {job.spec.num_nodes} nodes per step")
        for k in ("spec_hash", "graph_root", "c0", "batch_root"):
            print(f"  {k:<10} {info[k]}")
        print(f"post it with: verde-chain client --bundle {args.out}")
    return 0
