"""Lowering of the forward IR to RepOps primitive nodes, and reverse-mode differentiation.

Every IR op has a forward rule (primitive nodes from ``repops.library``) and a backward rule that
emits the primitive nodes of its vector-Jacobian product. Backward rules run in reverse
topological order; a value used several times gets its gradient contributions summed with ADD
nodes in the order they arrive (that order is fixed by the op order, so it is part of the graph).
Only gradients that reach a parameter are built.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from verde_chain.graph.builder import GraphBuilder, Ref
from verde_chain.graph.errors import NotDifferentiableError, ShapeMismatchError, UnsupportedModelError
from verde_chain.graph.ir import Model, OpNode
from verde_chain.repops import library
from verde_chain.repops.isa import Instr, Op
from verde_chain.repops.library import I, const

BIN_OP = {"add": Op.ADD, "sub": Op.SUB, "mul": Op.MUL, "div": Op.DIV}
# unary fns and whether their backward program reads the forward input x (else the output y)
UNARY_GRAD: dict[str, tuple[str, str]] = {
    "relu": ("relu_grad", "x"),
    "tanh": ("tanh_grad_y", "y"),
    "sigmoid": ("sigmoid_grad_y", "y"),
    "exp": ("exp_grad_y", "y"),
    "log": ("log_grad", "x"),
    "sqrt": ("sqrt_grad_y", "y"),
    "gelu_erf": ("gelu_erf_grad", "x"),
    "gelu_tanh": ("gelu_tanh_grad", "x"),
}
UNARY_FNS = sorted(set(UNARY_GRAD) | {"neg", "identity", "erf"})
TWO_OVER_SQRT_PI = 1.1283791670955126  # rounded to binary32 by CONST


@dataclass
class Saved:
    out: Ref
    extra: dict[str, Ref] = field(default_factory=dict)


# ======================================================================= forward rules


def forward(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    fn = _FORWARD.get(op.op)
    if fn is None:
        raise UnsupportedModelError(op.name or op.output, f"IR op {op.op!r} has no lowering", sorted(_FORWARD))
    return fn(b, op, ins)


def _fw_matmul(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    x, w = ins
    if len(x.shape) < 2 or len(w.shape) < 2:
        raise UnsupportedModelError(op.name, f"MatMul of rank {len(x.shape)} x {len(w.shape)}", "rank >= 2 operands")
    return Saved(b.node(library.matmul(x.shape, w.shape), x, w, label="matmul"))


def _fw_gemm(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    a = op.attrs
    c_shape = ins[2].shape if len(ins) > 2 else None
    desc = library.gemm(ins[0].shape, ins[1].shape, c_shape, a["alpha"], a["beta"], a["trans_a"], a["trans_b"])
    args = ins if (len(ins) > 2 and a["beta"] != 0.0) else ins[:2]
    return Saved(b.node(desc, *args, label="gemm"))


def _fw_binary(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    return Saved(b.binary(op.attrs["op"], ins[0], ins[1]))


def _scalar_code(kind: str, value: float, reverse: bool) -> list[Instr]:
    o = BIN_OP[kind]
    return [const(1, value), I(o, 0, 1, 0) if reverse else I(o, 0, 0, 1)]


def _fw_scalar(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    a = op.attrs
    return Saved(b.map(f"{a['op']}_const", _scalar_code(a["op"], a["value"], a["reverse"]), ins[0]))


def _fw_unary(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    fn = op.attrs["fn"]
    if fn not in UNARY_FNS:
        raise UnsupportedModelError(op.name, f"unary function {fn!r}", UNARY_FNS)
    return Saved(b.unary(fn, ins[0]))


def _fw_softmax(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    comp = (library.softmax if op.op == "softmax" else library.log_softmax)(ins[0].shape, op.attrs["axis"])
    return Saved(b.composite(comp, ins[0], label=op.op)[0])


def _fw_layer_norm(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    if len(ins) != 3:
        raise UnsupportedModelError(op.name, "LayerNormalization without scale and bias", "scale and bias inputs")
    comp = library.layer_norm(ins[0].shape, op.attrs["axis"], op.attrs["eps"], scale=True, bias=True)
    y, mean, istd = b.composite(comp, *ins, label="layer_norm")
    return Saved(y, {"mean": mean, "istd": istd})


def _fw_reduce(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    a = op.attrs
    return Saved(b.reduce(a["kind"], ins[0], a["axes"], a["keepdims"]))


def _fw_transpose(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    return Saved(b.node(library.transpose(ins[0].shape, op.attrs["perm"]), ins[0], label="transpose"))


def _fw_reshape(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    return Saved(b.view(ins[0], op.attrs["shape"]))


def _fw_gather(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    data, idx = ins
    return Saved(b.node(library.gather(data.shape, idx.shape, 0), data, idx, label="gather"))


_FORWARD: dict[str, Callable[[GraphBuilder, OpNode, list[Ref]], Saved]] = {
    "matmul": _fw_matmul,
    "gemm": _fw_gemm,
    "binary": _fw_binary,
    "scalar": _fw_scalar,
    "unary": _fw_unary,
    "softmax": _fw_softmax,
    "log_softmax": _fw_softmax,
    "layer_norm": _fw_layer_norm,
    "reduce": _fw_reduce,
    "transpose": _fw_transpose,
    "reshape": _fw_reshape,
    "gather": _fw_gather,
}


# ======================================================================= backward rules

Grads = list["Ref | None"]


def backward(b: GraphBuilder, op: OpNode, ins: list[Ref], saved: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    """Gradients w.r.t. each input of ``op`` (None where not needed)."""
    fn = _BACKWARD.get(op.op)
    if fn is None:
        raise NotDifferentiableError(f"{op.name or op.output}: no backward rule for IR op {op.op!r}", op=op.op)
    return fn(b, op, ins, saved, g, need)


def _mm(b: GraphBuilder, x: Ref, y: Ref, ta: bool = False, tb: bool = False) -> Ref:
    return b.node(library.matmul(x.shape, y.shape, ta, tb), x, y, label="matmul")


def _bw_matmul(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    x, w = ins
    out: Grads = [None, None]
    if need[0]:
        out[0] = b.unbroadcast(_mm(b, g, w, tb=True), x.shape)
    if need[1]:
        if len(w.shape) == 2 and len(x.shape) > 2:
            # batched activations times one matrix: one matmul over the flattened rows
            k, n = w.shape
            out[1] = _mm(b, b.view(x, (x.numel // k, k)), b.view(g, (g.numel // n, n)), ta=True)
        else:
            out[1] = b.unbroadcast(_mm(b, x, g, ta=True), w.shape)
    return out


def _scale(b: GraphBuilder, g: Ref, c: float) -> Ref:
    if c == 1.0:
        return g
    return b.map("scale", [const(1, c), I(Op.MUL, 0, 0, 1)], g)


def _bw_gemm(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    a = op.attrs
    ta, tb = a["trans_a"], a["trans_b"]
    A, B = ins[0], ins[1]
    out: Grads = [None] * len(ins)
    ga = _scale(b, g, a["alpha"]) if (need[0] or need[1]) else g
    if need[0]:
        out[0] = _mm(b, ga, B, tb=not tb) if not ta else _mm(b, B, ga, ta=tb, tb=True)
    if need[1]:
        out[1] = _mm(b, A, ga, ta=not ta) if not tb else _mm(b, ga, A, ta=True, tb=ta)
    if len(ins) > 2 and need[2] and a["beta"] != 0.0:
        out[2] = b.unbroadcast(_scale(b, g, a["beta"]), ins[2].shape)
    return out


def _bw_binary(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    x, y = ins
    kind = op.attrs["op"]
    out: Grads = [None, None]
    if kind == "add":
        ga, gb = (g if need[0] else None), (g if need[1] else None)
    elif kind == "sub":
        ga = g if need[0] else None
        gb = b.unary("neg", g) if need[1] else None
    elif kind == "mul":
        ga = b.binary("mul", g, y) if need[0] else None
        gb = b.binary("mul", g, x) if need[1] else None
    elif kind == "div":
        ga = b.binary("div", g, y) if need[0] else None
        # d(x/y)/dy = -(x/y)/y: inputs (g, out, y) -> -((g*out)/y)
        gb = (
            b.map("div_grad_b", [I(Op.MUL, 0, 0, 1), I(Op.DIV, 0, 0, 2), I(Op.NEG, 0, 0)], g, s.out, y)
            if need[1]
            else None
        )
    else:
        raise NotDifferentiableError(f"{op.name}: binary {kind!r} has no backward rule")
    if ga is not None:
        out[0] = b.unbroadcast(ga, x.shape)
    if gb is not None:
        out[1] = b.unbroadcast(gb, y.shape)
    return out


def _bw_scalar(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    kind, c, rev = op.attrs["op"], op.attrs["value"], op.attrs["reverse"]
    if kind == "add" or (kind == "sub" and not rev):
        return [g]
    if kind == "sub":
        return [b.unary("neg", g)]
    if kind == "mul":
        return [b.map("mul_const", [const(1, c), I(Op.MUL, 0, 0, 1)], g)]
    if not rev:  # x / c
        return [b.map("div_const", [const(1, c), I(Op.DIV, 0, 0, 1)], g)]
    # c / x: -(g * y) / x
    return [b.map("rdiv_grad", [I(Op.MUL, 0, 0, 1), I(Op.DIV, 0, 0, 2), I(Op.NEG, 0, 0)], g, s.out, ins[0])]


def _bw_unary(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    fn = op.attrs["fn"]
    if fn == "identity":
        return [g]
    if fn == "neg":
        return [b.unary("neg", g)]
    if fn == "erf":
        # erf'(x) = 2/sqrt(pi) * exp(-x*x): three nodes (the exp program clobbers registers)
        t = b.map("neg_square", [I(Op.MUL, 0, 0, 0), I(Op.NEG, 0, 0)], ins[0])
        e = b.unary("exp", t)
        return [b.map("erf_grad", [const(2, TWO_OVER_SQRT_PI), I(Op.MUL, 0, 0, 2), I(Op.MUL, 0, 0, 1)], e, g)]
    name, which = UNARY_GRAD[fn]
    src = ins[0] if which == "x" else s.out
    return [b.node(library.unary_grad(name, src.shape), src, g, label=name)]


def _bw_softmax(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    maker = library.softmax_backward if op.op == "softmax" else library.log_softmax_backward
    return [b.composite(maker(s.out.shape, op.attrs["axis"]), s.out, g, label=f"{op.op}_bwd")[0]]


def _bw_layer_norm(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    x, scale, _bias = ins
    comp = library.layer_norm_backward(x.shape, op.attrs["axis"])
    want = [i for i in range(3) if need[i]]
    res = b.composite(comp, x, scale, s.extra["mean"], s.extra["istd"], g, want=want, label="layer_norm_bwd")
    out: Grads = [None, None, None]
    for i, r in zip(want, res):
        out[i] = r
    return out


def _bw_reduce(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    kind = op.attrs["kind"]
    x = ins[0]
    axes = tuple(sorted(a % len(x.shape) for a in op.attrs["axes"]))
    keep = library.reduced_shape(x.shape, axes, True)
    gk = b.view(g, keep)
    if kind == "sum":
        return [b.node(library.expand(keep, x.shape), gk, label="expand")]
    if kind == "mean":
        k = math.prod(x.shape[a] for a in axes)
        return [b.map("mean_bwd", [const(1, float(k)), I(Op.DIV, 0, 0, 1)], gk, out_shape=x.shape)]
    raise NotDifferentiableError(f"{op.name}: reduce {kind!r} has no backward rule (sum, mean have)")


def _bw_transpose(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    perm = [p % len(ins[0].shape) for p in op.attrs["perm"]]
    inv = [perm.index(i) for i in range(len(perm))]
    return [b.node(library.transpose(g.shape, inv), g, label="transpose")]


def _bw_reshape(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    return [b.view(g, ins[0].shape)]


def _bw_gather(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    data, idx = ins
    if need[1]:
        raise NotDifferentiableError(f"{op.name}: no gradient flows into Gather indices")
    row = data.shape[1:]
    desc = library.scatter_add(idx.numel, row, data.shape[0])
    return [b.node(desc, b.view(g, (g.numel,)), b.view(idx, (idx.numel,)), label="scatter_add"), None]


_BACKWARD: dict[str, Callable[..., Grads]] = {
    "matmul": _bw_matmul,
    "gemm": _bw_gemm,
    "binary": _bw_binary,
    "scalar": _bw_scalar,
    "unary": _bw_unary,
    "softmax": _bw_softmax,
    "log_softmax": _bw_softmax,
    "layer_norm": _bw_layer_norm,
    "reduce": _bw_reduce,
    "transpose": _bw_transpose,
    "reshape": _bw_reshape,
    "gather": _bw_gather,
}


# ======================================================================= whole model


def lower_forward(b: GraphBuilder, model: Model, env: dict[str, Ref]) -> dict[str, Saved]:
    """Emit the forward nodes; ``env`` maps leaf names to Refs and is extended with op outputs."""
    saved: dict[str, Saved] = {}
    for op in model.ops:
        ins = [env[n] for n in op.inputs]
        sv = forward(b, op, ins)
        want = model.shape(op.output)
        if sv.out.shape != want:
            if math.prod(sv.out.shape) != math.prod(want):
                raise ShapeMismatchError(f"{op.name}: lowered shape {sv.out.shape}, model says {want}")
            sv.out = b.view(sv.out, want)
        env[op.output] = sv.out
        saved[op.output] = sv
    return saved


def differentiate(
    b: GraphBuilder, model: Model, env: dict[str, Ref], saved: dict[str, Saved], seeds: dict[str, Ref]
) -> dict[str, Ref]:
    """Reverse mode from ``seeds`` (value name -> gradient). Returns gradients of the params."""
    params = {v.name for v in model.params()}
    requires: set[str] = set(params)
    for op in model.ops:
        if any(n in requires for n in op.inputs):
            requires.add(op.output)
    grads: dict[str, Ref] = {}

    def accumulate(name: str, gr: Ref) -> None:
        have = grads.get(name)
        grads[name] = gr if have is None else b.binary("add", have, b.view(gr, have.shape))

    for name, gr in seeds.items():
        accumulate(name, gr)
    for op in reversed(model.ops):
        g = grads.get(op.output)
        if g is None or op.output not in requires:
            continue
        need = [n in requires for n in op.inputs]
        ins = [env[n] for n in op.inputs]
        res = backward(b, op, ins, saved[op.output], b.view(g, saved[op.output].out.shape), need)
        for n, r, nd in zip(op.inputs, res, need):
            if nd and r is not None:
                accumulate(n, b.view(r, env[n].shape))
    # parameters the loss does not depend on get no entry (torch leaves their .grad None and its
    # optimizers skip them; the training graph carries them unchanged)
    return {p: grads[p] for p in sorted(params, key=list(model.values).index) if p in grads}


def attrs_of(op: OpNode) -> dict[str, Any]:
    return dict(op.attrs)
