"""Forward model + loss + optimizer -> one training step as a committed graph of primitive nodes.

Node order (fixed, part of the graph root):

    1. batch unpack copies (one per batch field: model inputs, labels/targets, optimizer schedule)
    2. forward nodes (model op order)
    3. loss nodes, the constant seed gradient 1.0, the loss backward
    4. backward nodes (reverse op order; gradient sums in arrival order)
    5. optimizer nodes, parameter by parameter (in order of first use by the model ops)
    6. carry nodes (identity copies) of parameters the loss does not reach and of frozen
       constants, so every state tensor has a producer

With S > 1 micro-batch shards (``build_training_graph(..., shards=S)``, docs/distributed.md)
1-4 are repeated once per shard, and the shards' gradients (and losses) are combined in
ascending shard order by ``combine_desc`` nodes before 5.

The packed batch of a step holds, in field order: every model input, then ``labels`` (class ids
as float32 integers, cross-entropy) or ``targets`` (MSE), then for Adam/AdamW ``sched`` =
[fl32(lr / (1 - b1^t)), fl32(sqrt(1 - b2^t))] of that step t (exact, rounded once:
``repops.library.adam_constants``), then one keep-mask per training-mode Dropout (``mask``
values, in op order): mask j of step t is ``rng.dropout_keep(seed, stream=j, shape, ratio,
offset=(t-1)*numel)`` — Philox keyed by the job seed, counter (element + (t-1)*numel, j), so the
bits of any element of any step are reproducible alone. Carrying the step-dependent constants
and masks in the batch keeps ONE graph (one root) for every step; the masks are committed in the
batch root like the data, and a dispute opens them like any batch element.

Carried state a forward rule updates (batch norm's running mean and variance in training mode,
``GraphBuilder.update_state``) is produced by that rule's node instead of a carry copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from verde_chain.graph.autodiff import differentiate, lower_forward
from verde_chain.graph.builder import GraphBuilder, Ref
from verde_chain.graph.data import check_finite
from verde_chain.graph.errors import GraphError, IntegerRangeError, LabelRangeError, ShapeMismatchError
from verde_chain.graph.ir import EXACT_INT, Model
from verde_chain.graph.peephole import peephole as peephole_rewrite
from verde_chain.graph.structure import TrainingGraph
from verde_chain.repops import library, rng
from verde_chain.repops.isa import Op
from verde_chain.repops.library import I, const, load
from verde_chain.repops.library.shapes import Shape
from verde_chain.repops.program import InputMap, KernelDesc

LOSSES = ("cross_entropy", "mse")
OPTIMIZERS = ("sgd", "adam", "adamw")


@dataclass(frozen=True)
class LossSpec:
    kind: str = "cross_entropy"  # cross_entropy (integer labels, mean) | mse (mean)
    output: str = ""  # model output the loss reads ("" = the first output)
    # cross_entropy: labels equal to this contribute nothing and the mean is over the others
    # (next-token prediction marks the last position of every sequence so, as torch's -100)
    ignore_index: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in LOSSES:
            raise GraphError(f"loss {self.kind!r} not supported; supported: {LOSSES}")
        if self.ignore_index is not None and self.kind != "cross_entropy":
            raise GraphError("ignore_index is a cross_entropy option")

    @property
    def name(self) -> str:
        """The loss as the job spec states it: the kind, and its ignore index if it has one."""
        return self.kind if self.ignore_index is None else f"{self.kind}(ignore_index={self.ignore_index})"

    def check_targets(self, Y: np.ndarray, out_shape: Shape, output: str) -> None:
        """Refuse labels or targets this loss cannot read, before anything is built: the loss
        would otherwise train silently into NaN (a class id outside the scores reads nothing: the
        LOADIDX rule gives NaN) or on values it never meant. ``Y`` holds every sample's labels
        (cross-entropy: class ids of the scores ``out_shape[:-1]``, one batch being
        ``out_shape[0]`` samples) or targets (mse: ``out_shape[1:]`` per sample)."""
        per_sample = out_shape[1:-1] if self.kind == "cross_entropy" else out_shape[1:]
        if math.prod(Y.shape[1:]) != math.prod(per_sample):
            raise ShapeMismatchError(
                f"Y has {tuple(Y.shape[1:])} per sample, the {self.kind} loss on {output!r} {tuple(out_shape)} "
                f"reads {tuple(per_sample)} per sample", tensor="Y")
        check_finite("Y", Y)
        if self.kind != "cross_entropy":
            return
        classes = out_shape[-1]
        y = Y.reshape(-1).astype(np.float64)
        ok = (y == np.floor(y)) & (y >= 0) & (y < classes)
        if self.ignore_index is not None:
            ok |= y == self.ignore_index
        if not ok.all():
            i = int(np.argmin(ok))
            v = float(y[i])
            what = "not an integer class id" if v != np.floor(v) else f"outside [0, {classes})"
            allowed = f"class ids 0..{classes - 1}" + (
                f" or the ignore index {self.ignore_index}" if self.ignore_index is not None else "")
            raise LabelRangeError(
                f"label Y[{i}] = {v:g} is {what}: {self.name} over {output!r} has {classes} classes, so labels must "
                f"be {allowed}", tensor="Y", index=i, value=v)


@dataclass(frozen=True)
class OptimizerSpec:
    kind: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.0  # sgd
    nesterov: bool = False  # sgd
    weight_decay: float = 0.0
    beta1: float = 0.9  # adam / adamw
    beta2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.kind not in OPTIMIZERS:
            raise GraphError(f"optimizer {self.kind!r} not supported; supported: {OPTIMIZERS}")
        if self.kind == "sgd" and self.nesterov and self.momentum == 0.0:
            raise GraphError("nesterov SGD needs momentum > 0")

    @property
    def is_adam(self) -> bool:
        return self.kind in ("adam", "adamw")

    def schedule(self, t: int) -> np.ndarray:
        """Per-step constants carried in the batch (Adam/AdamW: [step_size_t, sqrt(1-b2^t)])."""
        if not self.is_adam:
            return np.zeros(0, dtype=np.float32)
        k = library.adam_constants(self.lr, self.beta1, self.beta2, 0.0, t)
        return np.array([k.step_size, k.bc2_sqrt], dtype=np.float32)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_integers(name: str, arr: np.ndarray) -> None:
    """Refuse integer data that binary32 cannot carry exactly, or that is negative."""
    a = np.asarray(arr, dtype=np.float64)
    bad = ~np.isfinite(a) | (a != np.floor(a)) | (a < 0) | (a >= EXACT_INT)
    if bad.any():
        i = int(np.argmax(bad.reshape(-1)))
        v = a.reshape(-1)[i]
        raise IntegerRangeError(f"integer input {name!r} holds {v!r} at flat index {i}: token ids must be integers "
                                "in [0, 2**24)", tensor=name, index=i, value=float(v))


def adam_param_desc(shape: tuple[int, ...], eps: float, decay: float) -> KernelDesc:
    """Adam parameter update reading the step-dependent constants from the ``sched`` tensor.

    Same instruction sequence as ``library.adam``'s ``adam_param`` node, with the two CONSTs that
    depend on t replaced by LOADs: inputs (p, m', v', sched[0], sched[1])::

        r5 = step_size_t, r6 = sqrt(1 - b2^t)
        denom = ADD(DIV(SQRT(v'), r6), eps);  p1 = decay != 1 ? MUL(p, decay) : p
        p' = SUB(p1, MUL(r5, DIV(m', denom)))
    """
    rank = len(shape)
    full = library.broadcast_map(shape, shape)
    s0 = InputMap(2, (0,) * rank, 0, 0)
    s1 = InputMap(2, (0,) * rank, 0, 1)
    # registers as in library.adam's adam_param (r0 = p, r1 = m', r2 = v', r3 the step, r4 the
    # CONSTs); the two loaded constants go to r5/r6, the first registers that program leaves free
    code = [
        load(0, 0),
        load(1, 1),
        load(2, 2),
        load(5, 3),  # r5 = step_size_t
        load(6, 4),  # r6 = sqrt(1 - b2^t)
        I(Op.SQRT, 3, 2),
        I(Op.DIV, 3, 3, 6),
        const(4, eps),
        I(Op.ADD, 3, 3, 4),  # r3 = denom
        I(Op.DIV, 3, 1, 3),
        I(Op.MUL, 3, 5, 3),  # r3 = step_size_t * m' / denom
    ]
    if decay != 1.0:
        code += [const(4, decay), I(Op.MUL, 0, 0, 4)]
    code += [I(Op.SUB, 0, 0, 3)]
    return KernelDesc(shape, 1, (full, full, full, s0, s1), tuple(code), label="adam_param")


@dataclass
class TrainingProgram:
    """A model with loss and optimizer, lowered to one committed training-step graph."""

    model: Model
    loss: LossSpec | None  # None: an inference program (forward graph only)
    optimizer: OptimizerSpec | None
    graph: TrainingGraph
    shards: int = 1  # S micro-batch shards (build_training_graph): the batch is split S ways

    def initial_state(self) -> dict[str, np.ndarray]:
        """Parameters and constants from the model; optimizer state zeros."""
        out: dict[str, np.ndarray] = {}
        for slot in self.graph.states:
            v = self.model.values.get(slot.name)
            if v is not None and v.data is not None:
                out[slot.name] = np.ascontiguousarray(v.data, dtype=np.float32).reshape(slot.shape)
            else:
                out[slot.name] = np.zeros(slot.shape, dtype=np.float32)
        return out

    def batch(
        self, step: int, inputs: dict[str, np.ndarray], target: np.ndarray | None = None, seed: int = 0
    ) -> np.ndarray:
        """The packed batch tensor of step ``step`` (1-based); inference ignores ``target``;
        ``seed`` (the job's) keys the dropout masks.

        Integer model inputs (token ids) travel as binary32 integers: each must be integral and in
        [0, 2**24), where binary32 holds it exactly (else :class:`IntegerRangeError`)."""
        for name, arr in inputs.items():
            if self.model.integer_inputs.get(name):
                check_integers(name, arr)
        S = self.shards
        if self.loss is not None and target is None:
            raise GraphError("a training batch needs its labels/targets")
        fields: dict[str, np.ndarray] = {}
        for k in range(S):  # shard k: samples k*b .. (k+1)*b - 1 of the step's batch
            part = {n: np.array_split(np.asarray(a), S)[k] for n, a in inputs.items()}
            if self.loss is not None:
                part[self.target_field] = np.array_split(np.asarray(target), S)[k]
            for j, (v, ratio) in enumerate(self.model.masks()):  # mask j of step t, shard k: counter block (t-1)*S + k
                part[v.name] = rng.dropout_keep(seed, j, v.shape, ratio, offset=((step - 1) * S + k) * v.numel)
            fields.update({shard_field(n, k, S): a for n, a in part.items()})
        if self.optimizer is not None and self.optimizer.is_adam:
            fields["sched"] = self.optimizer.schedule(step)
        if self.loss is None:  # inference: the row of the outputs buffers this step writes
            fields[OUTPUT_ROW_FIELD] = np.array([step - 1], dtype=np.float32)
        return self.graph.pack_batch(fields)

    @property
    def target_field(self) -> str:
        return "labels" if self.loss is not None and self.loss.kind == "cross_entropy" else "targets"


def _mask_fields(b: GraphBuilder, model: Model) -> dict[str, Ref]:
    """The batch fields of the dropout masks (declared after every other field)."""
    return {v.name: b.batch_field(v.name, v.shape) for v, _ in model.masks()}


def _state_producers(b: GraphBuilder, model: Model, skip: set[str]) -> dict[str, Ref]:
    """Producers of the state the optimizer does not write: a forward rule's update
    (``GraphBuilder.update_state``), else a carry copy."""
    out: dict[str, Ref] = {}
    for v in model.params() + model.consts():
        if v.name in skip:
            continue
        new = b.state_updates.get(v.name)
        out[v.name] = new if new is not None else b.node(
            library.map_unary("identity", v.shape), b.state(v.name, v.shape, "param" if v.role == "param" else "const"),
            label=f"carry:{v.name}")
    return out


def shard_field(name: str, shard: int, shards: int) -> str:
    """The batch field of shard ``shard``'s tensor ``name``: the plain name when S = 1 (today's
    layout), ``name#k`` when the batch is split into S > 1 micro-batch shards."""
    return name if shards == 1 else f"{name}#{shard}"


def combine_desc(shape: Shape, shards: int, label: str) -> KernelDesc:
    """The fixed-order combination of S shard values: ``((v_0 + v_1) + ... + v_{S-1}) / S``
    (ADD in ascending shard order, one DIV by S: the mean of the shards' means is the full
    batch's mean when the shards are equal-sized). One map node, so a dispute lands on it and
    the ScalarVM referees its S - 1 additions and the division like any other program."""
    prog = [load(0, 0)]
    for k in range(1, shards):
        prog += [load(1, k), I(Op.ADD, 0, 0, 1)]
    prog += [const(1, float(shards)), I(Op.DIV, 0, 0, 1)]
    maps = tuple(library.broadcast_map(shape, shape) for _ in range(shards))
    return KernelDesc(shape, 1, maps, tuple(prog), label=label)


@dataclass
class _Shard:
    """What one micro-batch shard's block of nodes hands to the combination."""

    loss: Ref
    out: Ref
    grads: dict[str, Ref]


def _shard_block(b: GraphBuilder, model: Model, loss: LossSpec, fields: dict[str, Ref], tgt: Ref,
                 early: Callable[[], None]) -> _Shard:
    """Unpack, forward, loss and backward of one micro-batch: (batch) nodes 1-4 of the module
    docstring. ``early`` runs after the unpacks (S = 1: the schedule's unpack, where it always was)."""
    out_name = loss.output or model.outputs[0]
    out_shape = model.shape(out_name)
    env: dict[str, Ref] = {n: b.unpack(r) for n, r in fields.items()}
    target = b.unpack(tgt)
    early()
    for v in model.params():
        env[v.name] = b.state(v.name, v.shape, "param")
    for v in model.consts():
        env[v.name] = b.state(v.name, v.shape, "const")
    saved = lower_forward(b, model, env)
    out = env[out_name]
    if loss.kind == "cross_entropy":
        n_rows, n_cls = math.prod(out_shape[:-1]), out_shape[-1]
        scores = b.view(out, (n_rows, n_cls))
        labels = b.view(target, (n_rows,))
        ign = loss.ignore_index
        ce = library.softmax_cross_entropy((n_rows, n_cls), "mean", ignore_index=ign)
        (loss_ref,) = b.composite(ce, scores, labels, want=[0], label="ce")
        seed = b.constant(1.0, ())
        (dscores,) = b.composite(
            library.softmax_cross_entropy_backward((n_rows, n_cls), "mean", ign), scores, labels, seed, label="ce_bwd"
        )
        dout = b.view(dscores, out_shape)
    else:
        diff = b.binary("sub", out, target)
        loss_ref = mse_loss(b, diff)
        n = float(math.prod(out_shape))
        dout = b.map("mse_bwd", [const(1, 2.0), I(Op.MUL, 0, 0, 1), const(1, n), I(Op.DIV, 0, 0, 1)], diff)  # (d*2)/N
    grads = differentiate(b, model, env, saved, {out_name: dout})
    return _Shard(loss_ref, out, grads)


def mse_loss(b: GraphBuilder, diff: Ref) -> Ref:
    """The MSE loss of ``diff`` = output - target: the mean of squares as two chains, each row's
    mean square along the last axis (the MUL/FMA dot order, / fl32(row length)), then the mean of
    those row values in row-major order (a 1-D ``diff`` is one row). One chain over all N
    elements would be one serial dependence (N rounding-latency steps on one lane of one
    thread): at 512 x 768 that was 0.45 ms, a third of a softmax-and-MSE step; the row chains
    run in vector lanes and on every thread, and the second chain is one add per row."""
    shape = diff.shape
    if len(shape) < 2:
        return b.reduce("meansq", diff, range(len(shape)), keepdims=False)
    rows = b.reduce("meansq", diff, (len(shape) - 1,), keepdims=False)
    return b.reduce("mean", rows, range(len(shape) - 1), keepdims=False)


def build_training_graph(model: Model, loss: LossSpec, optimizer: OptimizerSpec, shards: int = 1,
                         peephole: bool = True) -> TrainingProgram:
    """The training step over S = ``shards`` micro-batches of the model's batch each (S = 1: the
    graph of the module docstring, unchanged). For S > 1 the batch holds every shard's fields
    (``shard_field``), nodes 1-4 are repeated once per shard in shard order (shard k's block
    reads only its own fields, the parameters and its own nodes), and one ``combine_desc`` node
    per gradient (and one for the loss) sums the shards in ascending order before the
    optimizer: the result depends on S, never on which process computed which shard. Running
    statistics a forward rule updates follow shard 0 (as torch DDP's broadcast buffers).
    ``peephole``: fold single-use outputs into their reading ADD (graph/peephole.py; the same
    bits, fewer node outputs); False keeps the node list as autodiff wrote it."""
    if shards < 1:
        raise GraphError(f"shards must be >= 1, got {shards}")
    b = GraphBuilder()
    out_name = loss.output or model.outputs[0]
    if out_name not in model.values:
        raise GraphError(f"loss reads {out_name!r}, not a model value", value=out_name)
    out_shape = model.shape(out_name)
    if loss.kind == "cross_entropy" and len(out_shape) < 2:
        raise ShapeMismatchError(f"cross-entropy needs (..., classes) scores, {out_name} is {out_shape}")
    # 1. batch layout (every shard's inputs and labels/targets, the schedule, every shard's masks)
    per_shard: list[tuple[dict[str, Ref], Ref]] = []
    for k in range(shards):
        fields = {n: b.batch_field(shard_field(n, k, shards), model.shape(n)) for n in model.inputs}
        tgt_name = "labels" if loss.kind == "cross_entropy" else "targets"
        tgt_shape = out_shape[:-1] if loss.kind == "cross_entropy" else out_shape
        per_shard.append((fields, b.batch_field(shard_field(tgt_name, k, shards), tgt_shape)))
    sched = b.batch_field("sched", (2,)) if optimizer.is_adam else None
    for k, (fields, _) in enumerate(per_shard):
        fields.update({v.name: b.batch_field(shard_field(v.name, k, shards), v.shape) for v, _ in model.masks()})
    sched_ref: Ref | None = None

    def unpack_sched() -> None:
        nonlocal sched_ref
        if sched is not None and sched_ref is None:
            sched_ref = b.unpack(sched)

    # 2-4. forward, loss and backward of each shard
    blocks: list[tuple[int, int]] = []
    results: list[_Shard] = []
    for k, (fields, tgt) in enumerate(per_shard):
        if shards > 1:  # a shard's block reads no node of another (its equal nodes are its own)
            b.cse_barrier()
        start, kept = b.num_nodes, dict(b.state_updates)
        results.append(_shard_block(b, model, loss, fields, tgt, unpack_sched if shards == 1 else lambda: None))
        if k:
            b.state_updates = kept
        blocks.append((start, b.num_nodes))
    if shards > 1:  # nor is a node after the blocks (combination, optimizer) one of a block's
        b.cse_barrier()
    unpack_sched()
    if shards == 1:
        loss_ref, out, grads = results[0].loss, results[0].out, results[0].grads
        blocks = []
    else:
        loss_ref = b.node(combine_desc((), shards, "combine:loss"), *(r.loss for r in results), label="combine:loss")
        out = results[0].out
        grads = {}
        for name, g0 in results[0].grads.items():
            parts = [b.view(r.grads[name], g0.shape) for r in results]
            grads[name] = b.node(combine_desc(g0.shape, shards, f"combine:{name}"), *parts, label=f"combine:{name}")
    # 5. optimizer
    producers: dict[str, Ref] = {}
    o = optimizer
    env = {v.name: Ref("state", v.name, v.shape) for v in model.params()}
    for name, g in grads.items():
        p = env[name]
        shape = p.shape
        g = b.view(g, shape)
        if o.kind == "sgd":
            comp = library.sgd(shape, o.lr, o.momentum, 0.0, o.weight_decay, o.nesterov, first_step=False)
            if o.momentum == 0.0:
                (pn,) = b.composite(comp, p, g, p, want=[0], label="sgd")
            else:
                buf = b.state(f"{name}.momentum", shape, "opt")
                pn, bn = b.composite(comp, p, g, buf, label="sgd")
                producers[f"{name}.momentum"] = bn
        else:
            decoupled = o.kind == "adamw"
            comp = library.adam(shape, o.lr, 1, (o.beta1, o.beta2), o.eps, o.weight_decay, decoupled)
            m_ref = b.state(f"{name}.exp_avg", shape, "opt")
            v_ref = b.state(f"{name}.exp_avg_sq", shape, "opt")
            mn, vn = b.composite(comp, p, g, m_ref, v_ref, want=[1, 2], label=o.kind)
            decay = library.adam_constants(o.lr, o.beta1, o.beta2, o.weight_decay, 1).decay if decoupled else 1.0
            assert sched_ref is not None
            pn = b.node(adam_param_desc(shape, o.eps, decay), p, mn, vn, sched_ref, sched_ref, label=f"{o.kind}/adam_param")
            producers[f"{name}.exp_avg"] = mn
            producers[f"{name}.exp_avg_sq"] = vn
        producers[name] = pn
    # 6. carries of frozen constants (and of parameters the loss does not reach), or their updates
    producers.update(_state_producers(b, model, set(grads)))
    named = {"loss": loss_ref, "output": out}
    named.update({f"grad:{k}": g for k, g in grads.items() if g.kind == "node"})
    graph = b.finish(producers, named, tuple(blocks))
    if peephole:
        graph = peephole_rewrite(graph)
    return TrainingProgram(model, loss, optimizer, graph, shards)


OUTPUT_ROW_FIELD = "outputs:row"  # an inference batch's step index s - 1 (the buffer row it writes)


def outputs_buffer(name: str) -> str:
    """The state slot (and named node) of an inference job's buffer of every output ``name``."""
    return f"outputs:{name}"


def build_inference_graph(model: Model, steps: int) -> TrainingGraph:
    """Forward graph only (inference jobs): params/consts are carried state, and every model
    output has a committed outputs buffer (state ``outputs:NAME`` of shape (T, numel)) whose
    row s - 1 the step s writes (``library.write_row``), so C_T commits the predictions of every
    batch, not only the last one's. The batch is the model inputs, then ``outputs:row`` = s - 1."""
    b = GraphBuilder()
    fields = {n: b.batch_field(n, model.shape(n)) for n in model.inputs}
    fields.update(_mask_fields(b, model))
    row_field = b.batch_field(OUTPUT_ROW_FIELD, (1,))
    env: dict[str, Ref] = {n: b.unpack(r) for n, r in fields.items()}
    row = b.unpack(row_field)
    for v in model.params() + model.consts():
        env[v.name] = b.state(v.name, v.shape, "param" if v.role == "param" else "const")
    lower_forward(b, model, env)
    named = {f"output{i}" if i else "output": env[n] for i, n in enumerate(model.outputs)}
    for k, r in list(named.items()):
        if r.kind != "node":
            raise GraphError(f"model output {k} is not computed by a node")
    producers: dict[str, Ref] = {}
    for k, r in list(named.items()):
        slot = outputs_buffer(k)
        buf = b.state(slot, (steps, r.numel), "outputs")
        producers[slot] = named[slot] = b.node(
            library.write_row(steps, r.numel), buf, b.view(r, (r.numel,)), row, label=f"write:{k}")
    producers.update(_state_producers(b, model, set()))
    return b.finish(producers, named)


def build_inference_program(model: Model, steps: int) -> TrainingProgram:
    """An inference job's program: the forward graph, no loss, no optimizer, ``steps`` batches."""
    return TrainingProgram(model, None, None, build_inference_graph(model, steps))
