"""Elementwise IR ops: ``unary`` (relu, tanh, ..., gelu), ``binary`` (add sub mul div, numpy
broadcasting) and ``scalar`` (x op c, or c op x, with c a CONST immediate)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from verde_chain.graph.builder import GraphBuilder, Ref
from verde_chain.graph.errors import NotDifferentiableError, UnsupportedModelError
from verde_chain.graph.ir import OpNode
from verde_chain.graph.operators.registry import Grads, Saved, lowering, onnx_op, vjp
from verde_chain.repops import library
from verde_chain.repops.isa import Instr, Op
from verde_chain.repops.library import I, const

if TYPE_CHECKING:
    import onnx

    from verde_chain.graph.onnx_import import Importer

UNARY = {
    "Relu": "relu",
    "Tanh": "tanh",
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Erf": "erf",
    "Sigmoid": "sigmoid",
    "Neg": "neg",
}
BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}
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


# ----------------------------------------------------------------------- ONNX


@onnx_op(*UNARY)
def _import_unary(imp: Importer, node: onnx.NodeProto) -> None:
    imp.check_attrs(node, {})
    x = imp.float_input(node.input[0], node)
    imp.emit(node, "unary", [x], imp.shape(x), fn=UNARY[node.op_type])


@onnx_op("Gelu")
def _import_gelu(imp: Importer, node: onnx.NodeProto) -> None:
    a = imp.check_attrs(node, {"approximate": "none"})
    approx = a["approximate"].decode() if isinstance(a["approximate"], bytes) else a["approximate"]
    if approx not in ("none", "tanh"):
        raise UnsupportedModelError(imp.who(node), f"approximate={approx!r}", "none, tanh")
    x = imp.float_input(node.input[0], node)
    imp.emit(node, "unary", [x], imp.shape(x), fn="gelu_tanh" if approx == "tanh" else "gelu_erf")


@onnx_op(*BINARY)
def _import_binary(imp: Importer, node: onnx.NodeProto) -> None:
    """Folded at import when both operands are static; a ``scalar`` op when one is a
    one-element float constant; else a ``binary`` op."""
    imp.check_attrs(node, {})
    kind = BINARY[node.op_type]
    a, b = node.input[0], node.input[1]
    sa, sb = imp.is_static(a), imp.is_static(b)
    if sa and sb:
        xa, ya = imp.static[a], imp.static[b]
        ints = xa.dtype != np.float32 or ya.dtype != np.float32
        fold: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
            "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.floor_divide if ints else np.divide,
        }
        imp.static[node.output[0]] = fold[kind](xa, ya)
        return
    for side, (name, other, stat) in enumerate(((b, a, sb), (a, b, sa))):
        if stat and imp.static[name].size == 1 and imp.static[name].dtype == np.float32:
            xs = imp.float_input(other, node)
            value = float(imp.static[name].reshape(()))
            shape = imp.broadcast(imp.shape(xs), tuple(imp.static[name].shape), node)
            if shape != imp.shape(xs):
                raise UnsupportedModelError(imp.who(node), "a scalar constant that changes the rank")
            imp.emit(node, "scalar", [xs], shape, op=kind, value=value, reverse=bool(side))
            return
    xn, yn = imp.float_input(a, node), imp.float_input(b, node)
    imp.emit(node, "binary", [xn, yn], imp.broadcast(imp.shape(xn), imp.shape(yn), node), op=kind)


# ----------------------------------------------------------------------- forward


@lowering("unary")
def _fw_unary(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    fn = op.attrs["fn"]
    if fn not in UNARY_FNS:
        raise UnsupportedModelError(op.name, f"unary function {fn!r}", UNARY_FNS)
    return Saved(b.unary(fn, ins[0]))


@lowering("binary")
def _fw_binary(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    return Saved(b.binary(op.attrs["op"], ins[0], ins[1]))


def _scalar_code(kind: str, value: float, reverse: bool) -> list[Instr]:
    o = BIN_OP[kind]
    return [const(1, value), I(o, 0, 1, 0) if reverse else I(o, 0, 0, 1)]


@lowering("scalar")
def _fw_scalar(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    a = op.attrs
    return Saved(b.map(f"{a['op']}_const", _scalar_code(a["op"], a["value"], a["reverse"]), ins[0]))


# ----------------------------------------------------------------------- backward


@vjp("unary")
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


@vjp("binary")
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


@vjp("scalar")
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
