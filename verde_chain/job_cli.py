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
from verde_chain.job import Job, default_checkpoint_interval, make_job, save_job


def configure(p: argparse.ArgumentParser) -> None:
    from verde_chain.agents.commands import job_status_args

    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    create_args(sub.add_parser("create", help="a job bundle from your ONNX model and .npz data (no chain)",
                               description="Check an ONNX model and .npz data (every problem named), build the job's "
                               "program and commitments, and write the bundle `verde-chain client --bundle` posts."))
    job_status_args(sub.add_parser("status", help="a job's spec, slots and disputes"))
    results_args(sub.add_parser("results", help="a finalized job's accepted result and what it delivers, checked "
                                "against C_T", description="The accepted result of a finalized job and its "
                                "deliverable (an inference job's outputs, a training job's parameters), opened "
                                "against the accepted C_T; refused on any mismatch."))


def run(args: argparse.Namespace) -> int:
    if args.action == "create":
        return run_create(args)
    if args.action == "results":
        return run_results(args)
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
    interval = default_checkpoint_interval(args.steps) if args.checkpoint_interval is None else args.checkpoint_interval
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


def results_args(p: argparse.ArgumentParser) -> None:
    from verde_chain.agents.commands import DEFAULT_STATE, chain_args

    chain_args(p)
    p.add_argument("job_id", type=int)
    p.add_argument("--out", type=Path, default=None,
                   help="write the deliverable here (.npz: an inference job's outputs per model output, every "
                        "sample in X's order; a training job's parameters)")
    p.add_argument("--bundles", type=Path, default=None,
                   help=f"the job-bundle directory (default {DEFAULT_STATE}/bundles, the bots' default)")
    p.add_argument("--recompute", action="store_true",
                   help="re-execute the job here instead of reading the opening a trainer published")
    p.add_argument("--json", action="store_true", help="print one JSON line")


def run_results(args: argparse.Namespace) -> int:
    from verde_chain.agents.catalog import Bundles, check_against_chain
    from verde_chain.agents.commands import DEFAULT_STATE, connect_market
    from verde_chain.agents.errors import AgentError
    from verde_chain.chain.market_client import Market
    from verde_chain.market.types import ZERO32, JobStatus
    from verde_chain.results import ResultError, accepted_deliverable

    w3, artifacts, address = connect_market(args)
    market = Market.at(w3, artifacts, address)
    if not 1 <= args.job_id <= market.job_count():
        raise AgentError(f"no job {args.job_id} on market {address} (jobs: 1..{market.job_count()})")
    chain_job = market.job(args.job_id)
    if chain_job.status != JobStatus.FINALIZED:
        raise ResultError(f"job {args.job_id} is not finalized yet: no result is accepted before its challenge "
                          f"window ends (see `verde-chain job status {args.job_id}`)")
    accepted = chain_job.accepted_result
    if accepted == ZERO32:
        raise ResultError(f"job {args.job_id} was finalized with no accepted result (its reward went back to the "
                          "client)")
    bundles = Bundles(args.bundles or DEFAULT_STATE / "bundles")
    job = bundles.fetch(chain_job.terms.spec_hash)
    bad = check_against_chain(job, chain_job.terms)
    if bad:
        raise ResultError(f"the bundle {bundles.root / chain_job.terms.spec_hash.hex()} disagrees with job "
                          f"{args.job_id}'s {bad} on chain")
    published = None if args.recompute else bundles.result(job.spec.hash(), accepted)
    tensors = accepted_deliverable(job, accepted, published)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        np.savez(args.out, **tensors)
    how = "re-executed here" if published is None else "the published opening"
    info = {"job_id": args.job_id, "kind": job.spec.kind, "name": job.spec.name, "accepted_result": "0x" + accepted.hex(),
            "checked_by": "recompute" if published is None else "opening",
            "tensors": {k: list(v.shape) for k, v in tensors.items()}, "out": None if args.out is None else str(args.out)}
    if args.json:
        print(json.dumps(info, sort_keys=True))
        return 0
    what = "outputs" if job.spec.kind == "inference" else "trained parameters"
    print(f"job {args.job_id} ({job.spec.kind} job {job.spec.name!r}): accepted C_T 0x{accepted.hex()}")
    print(f"{what}, checked against it ({how}):")
    for k, v in tensors.items():
        print(f"  {k:<24} {tuple(v.shape)}")
    if args.out is not None:
        print(f"written to {args.out}")
    return 0
