"""Forward model + loss + optimizer -> one training step as a committed graph of primitive nodes.

Node order (fixed, part of the graph root):

    1. batch unpack copies (one per batch field: model inputs, labels/targets, optimizer schedule)
    2. forward nodes (model op order)
    3. loss nodes, the constant seed gradient 1.0, the loss backward
    4. backward nodes (reverse op order; gradient sums in arrival order)
    5. optimizer nodes, parameter by parameter (in order of first use by the model ops)
    6. carry nodes (identity copies) of parameters the loss does not reach and of frozen
       constants, so every state tensor has a producer

The packed batch of a step holds, in field order: every model input, then ``labels`` (class ids
as float32 integers, cross-entropy) or ``targets`` (MSE), then for Adam/AdamW ``sched`` =
[fl32(lr / (1 - b1^t)), fl32(sqrt(1 - b2^t))] of that step t (exact, rounded once:
``repops.library.adam_constants``). Carrying the step-dependent constants in the batch keeps ONE
graph (one root) for every step.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from verde_chain.graph.autodiff import differentiate, lower_forward
from verde_chain.graph.builder import GraphBuilder, Ref
from verde_chain.graph.errors import GraphError, ShapeMismatchError
from verde_chain.graph.ir import EXACT_INT, Model
from verde_chain.graph.structure import TrainingGraph
from verde_chain.repops import library
from verde_chain.repops.isa import Op
from verde_chain.repops.library import I, const, load
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
        v = a.reshape(-1)[int(np.argmax(bad.reshape(-1)))]
        raise ShapeMismatchError(f"integer input {name!r} holds {v!r}: token ids must be integers in [0, 2**24)",
                                 field=name)


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

    def batch(self, step: int, inputs: dict[str, np.ndarray], target: np.ndarray | None = None) -> np.ndarray:
        """The packed batch tensor of step ``step`` (1-based); inference ignores ``target``.

        Integer model inputs (token ids) travel as binary32 integers: each must be integral and in
        [0, 2**24), where binary32 holds it exactly (else :class:`ShapeMismatchError`)."""
        for name, arr in inputs.items():
            if self.model.integer_inputs.get(name):
                check_integers(name, arr)
        fields = dict(inputs)
        if self.loss is not None:
            if target is None:
                raise GraphError("a training batch needs its labels/targets")
            fields[self.target_field] = target
        if self.optimizer is not None and self.optimizer.is_adam:
            fields["sched"] = self.optimizer.schedule(step)
        return self.graph.pack_batch(fields)

    @property
    def target_field(self) -> str:
        return "labels" if self.loss is not None and self.loss.kind == "cross_entropy" else "targets"


def build_training_graph(model: Model, loss: LossSpec, optimizer: OptimizerSpec) -> TrainingProgram:
    b = GraphBuilder()
    out_name = loss.output or model.outputs[0]
    if out_name not in model.values:
        raise GraphError(f"loss reads {out_name!r}, not a model value", value=out_name)
    out_shape = model.shape(out_name)
    # 1. batch layout, then unpack copies
    fields: dict[str, Ref] = {n: b.batch_field(n, model.shape(n)) for n in model.inputs}
    if loss.kind == "cross_entropy":
        if len(out_shape) < 2:
            raise ShapeMismatchError(f"cross-entropy needs (..., classes) scores, {out_name} is {out_shape}")
        n_rows, n_cls = math.prod(out_shape[:-1]), out_shape[-1]
        tgt = b.batch_field("labels", out_shape[:-1])
    else:
        tgt = b.batch_field("targets", out_shape)
    sched = b.batch_field("sched", (2,)) if optimizer.is_adam else None
    env: dict[str, Ref] = {n: b.unpack(r) for n, r in fields.items()}
    target = b.unpack(tgt)
    sched_ref = b.unpack(sched) if sched is not None else None
    for v in model.params():
        env[v.name] = b.state(v.name, v.shape, "param")
    for v in model.consts():
        env[v.name] = b.state(v.name, v.shape, "const")
    # 2. forward
    saved = lower_forward(b, model, env)
    out = env[out_name]
    # 3. loss and its backward
    if loss.kind == "cross_entropy":
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
        loss_ref = b.reduce("meansq", diff, range(len(out_shape)), keepdims=False)
        n = float(math.prod(out_shape))
        dout = b.map("mse_bwd", [const(1, 2.0), I(Op.MUL, 0, 0, 1), const(1, n), I(Op.DIV, 0, 0, 1)], diff)  # (d*2)/N
    # 4. backward
    grads = differentiate(b, model, env, saved, {out_name: dout})
    # 5. optimizer
    producers: dict[str, Ref] = {}
    o = optimizer
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
    # 6. carries of frozen constants (and of parameters the loss does not reach)
    for v in model.params():
        if v.name not in grads:
            producers[v.name] = b.node(library.map_unary("identity", v.shape), env[v.name], label=f"carry:{v.name}")
    for v in model.consts():
        producers[v.name] = b.node(library.map_unary("identity", v.shape), env[v.name], label=f"carry:{v.name}")
    named = {"loss": loss_ref, "output": out}
    named.update({f"grad:{k}": g for k, g in grads.items() if g.kind == "node"})
    graph = b.finish(producers, named)
    return TrainingProgram(model, loss, optimizer, graph)


def build_inference_graph(model: Model) -> TrainingGraph:
    """Forward graph only (inference jobs): batch = model inputs; params/consts are carried state."""
    b = GraphBuilder()
    fields = {n: b.batch_field(n, model.shape(n)) for n in model.inputs}
    env: dict[str, Ref] = {n: b.unpack(r) for n, r in fields.items()}
    for v in model.params() + model.consts():
        env[v.name] = b.state(v.name, v.shape, "param" if v.role == "param" else "const")
    lower_forward(b, model, env)
    producers = {
        v.name: b.node(library.map_unary("identity", v.shape), env[v.name], label=f"carry:{v.name}")
        for v in model.params() + model.consts()
    }
    named = {f"output{i}" if i else "output": env[n] for i, n in enumerate(model.outputs)}
    for k, r in list(named.items()):
        if r.kind != "node":
            raise GraphError(f"model output {k} is not computed by a node")
    return b.finish(producers, named)


def build_inference_program(model: Model) -> TrainingProgram:
    """An inference job's program: the forward graph, no loss, no optimizer."""
    return TrainingProgram(model, None, None, build_inference_graph(model))
