"""Typed, canonically hashed job specs and job bundles (spec + model + data) a client posts.

``JobSpec.encode()`` is Solidity's ``abi.encode`` of the fields in declaration order, with every
float as the uint32 bit pattern of its binary32 value (the value the kernels use) and bytes32
commitments as bytes32::

    (string name, string kind, bytes32 modelHash, bytes32 graphRoot, uint256 numNodes,
     bytes32 initialCommitment, bytes32 datasetRoot, bytes32 batchRoot,
     uint256 seed, uint256 batchSize, string loss, string lossOutput,
     (string kind, uint32 lr, uint32 momentum, bool nesterov, uint32 weightDecay,
      uint32 beta1, uint32 beta2, uint32 eps) optimizer,
     uint256 steps, uint256 checkpointInterval, string[] frozen)

A job split into S > 1 micro-batch shards (``shards``; ``graph/training.py``'s
``build_training_graph``) appends one more field, ``uint256 shards``; S = 1 is encoded without it,
so every spec of a one-shard job (all jobs before shards existed) keeps its bytes and hash. The
two encodings cannot be confused: the first head word of either is the offset of ``name``, the
size of the head (16 or 17 words).

``JobSpec.hash() = keccak256(encode())`` — the ``specHash`` posted on-chain next to graphRoot,
C_0 and batchRoot. A bundle directory holds ``job.json`` (the spec, hex for bytes),
``model.onnx`` and ``data.npz`` (X, Y); ``load_job`` rebuilds the training graph, the initial
state and every batch root from them and refuses the bundle unless all commitments match.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from eth_abi import encode as abi_encode

from verde_chain.commit import tensor_root
from verde_chain.commit.merkle import keccak256
from verde_chain.graph.backend import Runner
from verde_chain.graph.data import Dataset, batch_indices, batch_root_list, check_finite
from verde_chain.graph.errors import JobSpecError
from verde_chain.graph.executor import DEFAULT_CHECKPOINT_INTERVAL, StepExecutor, TrainingRun
from verde_chain.graph.ir import Model
from verde_chain.graph.onnx_import import export_torch, import_onnx
from verde_chain.graph.training import (
    LossSpec,
    OptimizerSpec,
    TrainingProgram,
    build_inference_program,
    build_training_graph,
    check_integers,
    outputs_buffer,
)
from verde_chain.repops.isa import f32_bits

SPEC_TYPES = [
    "string", "string", "bytes32", "bytes32", "uint256", "bytes32", "bytes32", "bytes32",
    "uint256", "uint256", "string", "string",
    "(string,uint32,uint32,bool,uint32,uint32,uint32,uint32)",
    "uint256", "uint256", "string[]",
]
BYTES_FIELDS = ("model_hash", "graph_root", "initial_commitment", "dataset_root", "batch_root")


@dataclass(frozen=True)
class JobSpec:
    name: str
    model_hash: bytes
    graph_root: bytes
    num_nodes: int
    initial_commitment: bytes
    dataset_root: bytes
    batch_root: bytes
    seed: int
    batch_size: int
    loss: LossSpec
    optimizer: OptimizerSpec
    steps: int
    checkpoint_interval: int
    frozen: tuple[str, ...] = ()
    kind: str = "train"
    shards: int = 1  # S micro-batch shards of batch_size / S samples each (module docstring)

    def __post_init__(self) -> None:
        for f in BYTES_FIELDS:
            if len(getattr(self, f)) != 32:
                raise JobSpecError(f"{f} must be 32 bytes", field=f)
        if self.steps < 1 or self.batch_size < 1 or self.checkpoint_interval < 0:
            raise JobSpecError("steps and batch_size must be >= 1, checkpoint_interval >= 0")
        if self.kind not in ("train", "inference"):
            raise JobSpecError(f"kind {self.kind!r} not in train/inference")
        check_shards(self.shards, self.batch_size, self.kind)

    def encode(self) -> bytes:
        o = self.optimizer
        opt = (o.kind, f32_bits(o.lr), f32_bits(o.momentum), o.nesterov, f32_bits(o.weight_decay),
               f32_bits(o.beta1), f32_bits(o.beta2), f32_bits(o.eps))
        fields = [
            self.name, self.kind, self.model_hash, self.graph_root, self.num_nodes, self.initial_commitment,
            self.dataset_root, self.batch_root, self.seed, self.batch_size, self.loss.name, self.loss.output,
            opt, self.steps, self.checkpoint_interval, list(self.frozen),
        ]
        if self.shards == 1:
            return abi_encode(SPEC_TYPES, fields)
        return abi_encode([*SPEC_TYPES, "uint256"], [*fields, self.shards])

    def hash(self) -> bytes:
        return keccak256(self.encode())

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name, "kind": self.kind, "num_nodes": self.num_nodes, "seed": self.seed,
            "batch_size": self.batch_size, "loss": asdict(self.loss), "optimizer": self.optimizer.to_dict(),
            "steps": self.steps, "checkpoint_interval": self.checkpoint_interval, "frozen": list(self.frozen),
        }
        if self.shards != 1:
            d["shards"] = self.shards
        for f in BYTES_FIELDS:
            d[f] = "0x" + getattr(self, f).hex()
        d["spec_hash"] = "0x" + self.hash().hex()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JobSpec:
        try:
            kw = {f: bytes.fromhex(str(d[f]).removeprefix("0x")) for f in BYTES_FIELDS}
            spec = cls(
                name=d["name"], kind=d.get("kind", "train"), num_nodes=int(d["num_nodes"]), seed=int(d["seed"]),
                batch_size=int(d["batch_size"]), loss=LossSpec(**d["loss"]), optimizer=OptimizerSpec(**d["optimizer"]),
                steps=int(d["steps"]), checkpoint_interval=int(d["checkpoint_interval"]),
                frozen=tuple(d.get("frozen", ())), shards=int(d.get("shards", 1)), **kw,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise JobSpecError(f"malformed job spec: {type(exc).__name__}: {exc}") from exc
        if "spec_hash" in d and d["spec_hash"] != "0x" + spec.hash().hex():
            raise JobSpecError("spec_hash does not match the spec's fields", stated=d["spec_hash"])
        return spec


@dataclass
class Job:
    """Everything a trainer needs: the spec and the objects its commitments are over."""

    spec: JobSpec
    program: TrainingProgram
    dataset: Dataset
    onnx_bytes: bytes
    init_state: dict[str, np.ndarray]
    _batch_cache: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def batch(self, step: int) -> np.ndarray:
        b = self._batch_cache.get(step)
        if b is None:
            n, bs = len(self.dataset), self.spec.batch_size
            if self.spec.kind == "inference":  # every sample once, in order (wrapping at the end)
                idx = ((step - 1) * bs + np.arange(bs)) % n
            else:
                idx = batch_indices(self.spec.seed, step, bs, n)
            inputs = {self.program.model.inputs[0]: self.dataset.X[idx]}
            b = self.program.batch(step, inputs, self.dataset.Y[idx], self.spec.seed)
            if len(self._batch_cache) > 256:
                self._batch_cache.clear()
            self._batch_cache[step] = b
        return b

    def batch_roots(self, steps: int | None = None) -> list[bytes]:
        return [tensor_root(self.batch(s)) for s in range(1, (steps or self.spec.steps) + 1)]

    def make_run(self, out_dir: str | Path | None = None, checkpoint_interval: int | None = None,
                 runner: Runner | None = None, steps: int | None = None, fresh: bool = True,
                 executor: StepExecutor | None = None) -> TrainingRun:
        interval = self.spec.checkpoint_interval if checkpoint_interval is None else checkpoint_interval
        return TrainingRun(self.program.graph, self.init_state, self.batch, steps or self.spec.steps, interval, out_dir,
                           runner, save_initial=fresh, executor=executor)


def check_shards(shards: int, batch_size: int, kind: str) -> None:
    """S micro-batch shards split a training batch into S equal parts."""
    if shards < 1:
        raise JobSpecError(f"shards must be >= 1, got {shards}", field="shards")
    if shards > 1 and kind != "train":
        raise JobSpecError("shards split a training batch; an inference job has one shard", field="shards")
    if batch_size % shards:
        raise JobSpecError(f"batch size {batch_size} does not split into {shards} equal shards", field="shards")


def check_job_inputs(model: Model, dataset: Dataset, loss: LossSpec, batch_size: int, kind: str, shards: int = 1) -> None:
    """Everything about the data that can be refused before a graph is built: the model's one
    input fits the samples (one micro-batch of ``batch_size / shards`` of them), X is finite (and
    integral ids where the model reads integers), and for training the labels/targets fit the
    loss (``LossSpec.check_targets``)."""
    check_shards(shards, batch_size, kind)
    if len(model.inputs) != 1:
        raise JobSpecError(f"jobs feed exactly one model input from the dataset, model has {model.inputs}")
    name = model.inputs[0]
    micro = batch_size // shards
    want = (micro,) + tuple(dataset.X.shape[1:])
    if model.shape(name) != want:
        split = f" ({shards} shards of {micro})" if shards > 1 else ""
        raise JobSpecError(f"model input {name!r} is {model.shape(name)}, dataset batches of {batch_size}{split} are "
                           f"{want}")
    check_finite("X", dataset.X)
    if model.integer_inputs.get(name):
        check_integers(name, dataset.X)
    if kind == "train":
        out = loss.output or model.outputs[0]
        if out not in model.values:
            raise JobSpecError(f"loss reads {out!r}, not a model value (outputs: {model.outputs})", field="loss")
        loss.check_targets(dataset.Y, model.shape(out), out)


def make_job(
    name: str, onnx_bytes: bytes, dataset: Dataset, loss: LossSpec, optimizer: OptimizerSpec, steps: int,
    batch_size: int, seed: int = 0, checkpoint_interval: int = 0, frozen: tuple[str, ...] = (),
    init_state: dict[str, np.ndarray] | None = None, kind: str = "train", batch_steps: int | None = None,
    shards: int = 1,
) -> Job:
    """The client side: check the model and data, build the graph and every commitment the spec
    names.

    Checks come first: every unsupported node of the model in one ``UnsupportedModelError``,
    then the data (``check_job_inputs``: ``NonFiniteDataError``, ``IntegerRangeError``,
    ``LabelRangeError``). ``kind="inference"``: the forward graph and its outputs buffers; batch s
    holds samples (s-1)*B .. s*B-1 of X (wrapping), Y is not read, ``loss``/``optimizer`` are
    recorded but unused. ``batch_steps`` (default all T) is how many batch roots are computed
    for ``batch_root`` (a loader that does not verify them computes one). ``shards`` S > 1 splits
    each step's ``batch_size`` samples into S micro-batches, the model's batch dimension (its
    input's first) being ``batch_size / S``: the result depends on S, not on how many processes
    run it (``graph/distributed.py``)."""
    if kind not in ("train", "inference"):
        raise JobSpecError(f"kind {kind!r} not in train/inference")
    if steps < 1 or batch_size < 1:
        raise JobSpecError(f"steps and batch size must be >= 1, got {steps} and {batch_size}")
    model = import_onnx(onnx_bytes, frozen)
    check_job_inputs(model, dataset, loss, batch_size, kind, shards)
    if kind == "inference":
        program = build_inference_program(model, steps)
    else:
        program = build_training_graph(model, loss, optimizer, shards)
    init = init_state if init_state is not None else program.initial_state()
    graph = program.graph
    placeholder = b"\x00" * 32
    spec = JobSpec(
        name=name, model_hash=keccak256(onnx_bytes), graph_root=graph.root(), num_nodes=len(graph.nodes),
        initial_commitment=graph.initial_commitment(init), dataset_root=dataset.root(), batch_root=placeholder,
        seed=seed, batch_size=batch_size, loss=loss, optimizer=optimizer, steps=steps,
        checkpoint_interval=checkpoint_interval, frozen=tuple(frozen), kind=kind, shards=shards,
    )
    job = Job(spec, program, dataset, onnx_bytes, init)
    job.spec = replace(spec, batch_root=batch_root_list(job.batch_roots(batch_steps)))
    return job


def job_from_torch(
    module: Any, example_input: Any, dataset: Dataset | tuple[Any, Any], *, steps: int, name: str = "model",
    loss: LossSpec | None = None, optimizer: OptimizerSpec | None = None, seed: int = 0,
    checkpoint_interval: int | None = None,
    frozen: tuple[str, ...] | None = None, kind: str = "train", input_name: str = "x", opset: int = 17,
    shards: int = 1,
) -> Job:
    """A job from a torch module: ``example_input`` fixes the shapes (its first dimension is the
    batch size) and dtype (an integer tensor makes an integer input: token ids); ``dataset`` is
    a ``Dataset`` or ``(X, Y)`` arrays of any numeric dtype (``Dataset.from_arrays``).

    A training job exports the module in training mode (``export_torch(training=True)``:
    Dropout and BatchNormalization keep their training semantics, or are refused by name if the
    importer cannot give them those); an inference job exports it in eval mode. With ``shards``
    S > 1 the example input is one micro-batch and a step reads S of them. ``frozen``
    (default: the module's buffers) names initializers that are not trained; the checkpoint
    interval defaults to ``default_checkpoint_interval(steps)``, as in ``verde-chain job create``."""
    data = dataset if isinstance(dataset, Dataset) else Dataset.from_arrays(*dataset, input_name=input_name)
    batch_size = int(example_input.shape[0]) * shards
    onnx_bytes = export_torch(module, example_input, [input_name], opset, training=kind == "train")
    names = tuple(n for n, _ in module.named_buffers()) if frozen is None else tuple(frozen)
    return make_job(name, onnx_bytes, data, loss or LossSpec(), optimizer or OptimizerSpec(), steps, batch_size, seed,
                    default_checkpoint_interval(steps) if checkpoint_interval is None else checkpoint_interval,
                    names, kind=kind, shards=shards)


def default_checkpoint_interval(steps: int) -> int:
    """Trainers keep the state every min(DEFAULT_CHECKPOINT_INTERVAL, T) steps unless a job says
    otherwise (the executor's docstring says why that interval)."""
    return min(DEFAULT_CHECKPOINT_INTERVAL, steps)


def inference_outputs(job: Job, state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """An inference job's outputs from a state holding its outputs buffers (the final state is
    what C_T commits): per model output, every step's outputs in step order, as
    ``(T * B, *per-sample shape)`` (samples (s-1)*B .. s*B-1 of X for step s, wrapping)."""
    if job.spec.kind != "inference":
        raise JobSpecError(f"job {job.spec.name!r} is a {job.spec.kind} job; only inference jobs have outputs")
    graph, out = job.program.graph, {}
    for key in (k for k in graph.named if not k.startswith("outputs:")):
        buf = np.asarray(state[outputs_buffer(key)], dtype=np.float32)
        shape = graph.shapes[key]
        out[key] = buf.reshape((job.spec.steps * shape[0],) + tuple(shape[1:]))
    return out


BUNDLE_FILES = ("job.json", "model.onnx", "data.npz", "init.npz")  # what save_job writes and load_job reads


def save_job(job: Job, directory: str | Path) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.onnx").write_bytes(job.onnx_bytes)
    np.savez(d / "data.npz", X=job.dataset.X, Y=job.dataset.Y)
    np.savez(d / "init.npz", **job.init_state)
    (d / "job.json").write_text(json.dumps(job.spec.to_json(), indent=1))
    return d / "job.json"


def load_job(path: str | Path, verify_batches: bool = True) -> Job:
    """Load a bundle (directory or its job.json) and check every commitment of the spec."""
    p = Path(path)
    d = p if p.is_dir() else p.parent
    jf = d / "job.json" if p.is_dir() else p
    try:
        raw = json.loads(jf.read_text())
        if not isinstance(raw, dict):
            raise JobSpecError(f"{jf}: not a job spec (a JSON object is expected); re-create the bundle with "
                               "`verde-chain job create`")
        spec = JobSpec.from_json(raw)
        onnx_bytes = (d / "model.onnx").read_bytes()
        with np.load(d / "data.npz", allow_pickle=False) as z:
            dataset = Dataset.from_arrays(z["X"], z["Y"])
        with np.load(d / "init.npz", allow_pickle=False) as z:
            init = {k: np.asarray(z[k], dtype=np.float32) for k in z.files}
    except json.JSONDecodeError as exc:
        raise JobSpecError(f"{jf} is not valid JSON ({exc}); re-create the bundle with `verde-chain job create`") from exc
    except (OSError, KeyError, ValueError) as exc:  # missing files, npz without X/Y, corrupt archives
        raise JobSpecError(f"{d}: incomplete or unreadable job bundle ({type(exc).__name__}: {exc}); re-create it "
                           "with `verde-chain job create`") from exc
    job = make_job(spec.name, onnx_bytes, dataset, spec.loss, spec.optimizer, spec.steps, spec.batch_size, spec.seed,
                   spec.checkpoint_interval, spec.frozen, init, spec.kind, None if verify_batches else 1, spec.shards)
    checks: list[tuple[str, bytes, Callable[[], bytes]]] = [
        ("model_hash", spec.model_hash, lambda: job.spec.model_hash),
        ("graph_root", spec.graph_root, lambda: job.spec.graph_root),
        ("initial_commitment", spec.initial_commitment, lambda: job.spec.initial_commitment),
        ("dataset_root", spec.dataset_root, lambda: job.spec.dataset_root),
    ]
    if verify_batches:
        checks.append(("batch_root", spec.batch_root, lambda: job.spec.batch_root))
    for name, want, got in checks:
        have = got()
        if have != want:
            raise JobSpecError(f"{jf}: {name} is 0x{want.hex()} but the bundle gives 0x{have.hex()}", field=name)
    job.spec = spec
    return job
