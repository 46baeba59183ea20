"""Elementwise IR ops: ``unary`` (relu, tanh, ..., gelu, sin, cos, isnan, not), ``binary``
(arithmetic, max/min, pow, comparisons and logic, numpy broadcasting), ``scalar`` (x op c, or
c op x, with c a CONST immediate), ``pow_const`` (x ** c) and ``where``.

Comparisons, IsNaN and logic produce booleans (binary32 0.0 / 1.0); they and the logic ops have
no gradient (their outputs are piecewise constant)."""

from __future__ import annotations

from collections.abc import Sequence
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
    "Cos": "cos",
    "Sin": "sin",
    "Reciprocal": "reciprocal",
}
BOOL_UNARY = {"IsNaN": ("isnan", "float"), "Not": ("not", "bool")}  # op -> (fn, input dtype)
BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}
COMPARE = {"Equal": "eq", "Less": "lt", "LessOrEqual": "le", "Greater": "gt", "GreaterOrEqual": "ge"}
LOGIC = {"And": "and", "Or": "or", "Xor": "xor"}
NO_GRAD = frozenset(COMPARE.values()) | frozenset(LOGIC.values()) | {"ne", "isnan", "not"}
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
    "sin": ("sin_grad", "x"),
    "cos": ("cos_grad", "x"),
    "reciprocal": ("reciprocal_grad_y", "y"),
}
UNARY_FNS = sorted(set(UNARY_GRAD) | {"neg", "identity", "erf", "isnan", "not"})
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


@onnx_op(*BOOL_UNARY)
def _import_bool_unary(imp: Importer, node: onnx.NodeProto) -> None:
    imp.check_attrs(node, {})
    fn, want = BOOL_UNARY[node.op_type]
    x = imp.value(node.input[0], node)
    if imp.dtype(x) != want and not (want == "float" and imp.dtype(x) == "int"):
        raise UnsupportedModelError(imp.who(node), f"{imp.dtype(x)} input", f"a {want} tensor")
    imp.emit(node, "unary", [x], imp.shape(x), dtype="bool", fn=fn)


@onnx_op(*BINARY)
def _import_binary(imp: Importer, node: onnx.NodeProto) -> None:
    """A ``scalar`` op when one operand is a one-element float constant; else a ``binary`` op
    (both static: folded by the importer before it gets here)."""
    imp.check_attrs(node, {})
    kind = BINARY[node.op_type]
    a, b = node.input[0], node.input[1]
    for side, (name, other) in enumerate(((b, a), (a, b))):
        value = imp.scalar_const(name)
        if value is not None:
            xs = imp.float_input(other, node)
            shape = imp.broadcast(imp.shape(xs), imp.shape(name), node)
            if shape != imp.shape(xs):
                raise UnsupportedModelError(imp.who(node), "a scalar constant that changes the rank")
            imp.emit(node, "scalar", [xs], shape, op=kind, value=value, reverse=bool(side))
            return
    xn, yn = imp.float_input(a, node), imp.float_input(b, node)
    imp.emit(node, "binary", [xn, yn], imp.broadcast(imp.shape(xn), imp.shape(yn), node), op=kind)


@onnx_op(*COMPARE, *LOGIC)
def _import_compare(imp: Importer, node: onnx.NodeProto) -> None:
    """Comparisons of two float or two integer tensors, logic of two booleans -> a boolean."""
    imp.check_attrs(node, {})
    xa, xb = (imp.value(n, node) for n in node.input[:2])
    da, db = imp.dtype(xa), imp.dtype(xb)
    if node.op_type in LOGIC:
        if da != "bool" or db != "bool":
            raise UnsupportedModelError(imp.who(node), f"{da} and {db} operands", "booleans")
    elif "bool" in (da, db) or ("float" in (da, db) and da != db):
        raise UnsupportedModelError(imp.who(node), f"compares {da} with {db}", "two floats or two integers")
    kind = {**COMPARE, **LOGIC}[node.op_type]
    imp.emit(node, "binary", [xa, xb], imp.broadcast(imp.shape(xa), imp.shape(xb), node), dtype="bool", op=kind)


@onnx_op("Max", "Min")
def _import_max_min(imp: Importer, node: onnx.NodeProto) -> None:
    """Variadic Max/Min as a left-to-right chain of binary ``max``/``min`` ops."""
    imp.check_attrs(node, {})
    kind = node.op_type.lower()
    acc = imp.float_input(node.input[0], node)
    if len(node.input) == 1:
        imp.emit(node, "reshape", [acc], imp.shape(acc), shape=imp.shape(acc))
        return
    for i, name in enumerate(node.input[1:], start=1):
        x = imp.float_input(name, node)
        shape = imp.broadcast(imp.shape(acc), imp.shape(x), node)
        out = node.output[0] if i == len(node.input) - 1 else f"{node.output[0]}:{kind}{i}"
        imp.emit(node, "binary", [acc, x], shape, output=out, op=kind)
        acc = out


@onnx_op("Pow")
def _import_pow(imp: Importer, node: onnx.NodeProto) -> None:
    """x ** c for a constant one-element exponent (``pow_const``), else a ``binary`` pow."""
    imp.check_attrs(node, {})
    x = imp.float_input(node.input[0], node)
    c = imp.scalar_const(node.input[1])
    if c is None and imp.is_static(node.input[1]) and np.asarray(imp.static[node.input[1]]).size == 1:
        c = float(np.asarray(imp.static[node.input[1]]).reshape(()))  # an integer exponent
    if c is not None:
        imp.emit(node, "pow_const", [x], imp.shape(x), exponent=c)
        return
    y = imp.float_input(node.input[1], node)
    imp.emit(node, "binary", [x, y], imp.broadcast(imp.shape(x), imp.shape(y), node), op="pow")


@onnx_op("Where")
def _import_where(imp: Importer, node: onnx.NodeProto) -> None:
    """where(c, x, y); a branch that is a one-element float constant is a CONST immediate."""
    imp.check_attrs(node, {})
    c = imp.value(node.input[0], node)
    if imp.dtype(c) != "bool":
        raise UnsupportedModelError(imp.who(node), f"{imp.dtype(c)} condition", "a boolean condition")
    ins, consts, shapes, dtypes = [c], {}, [imp.shape(c)], set()
    for i, name in ((1, node.input[1]), (2, node.input[2])):
        value = imp.scalar_const(name)
        if value is not None:
            consts[i] = value
            dtypes.add("float")
            continue
        v = imp.value(name, node)
        ins.append(v)
        shapes.append(imp.shape(v))
        dtypes.add(imp.dtype(v))
    if len(dtypes) != 1:
        raise UnsupportedModelError(imp.who(node), f"branches of dtypes {sorted(dtypes)}", "branches of one dtype")
    shape: tuple[int, ...] = ()
    for s in shapes:
        shape = imp.broadcast(shape, s, node)
    imp.emit(node, "where", ins, shape, dtype=dtypes.pop(), consts=consts)


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


@lowering("pow_const")
def _fw_pow_const(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    return Saved(b.node(library.pow_const(ins[0].shape, op.attrs["exponent"]), ins[0], label="pow_const"))


def _where_code(consts: dict[int, float]) -> list[Instr]:
    """SELECT(r0, x, y) with the tensor operands loaded in order (r1, r2) and a constant branch
    in the first free register."""
    regs, code, nxt = {}, [], 1
    for i in (1, 2):
        if i not in consts:
            regs[i], nxt = nxt, nxt + 1
    for i in (1, 2):
        if i in consts:
            code.append(const(nxt, consts[i]))
            regs[i], nxt = nxt, nxt + 1
    return code + [I(Op.SELECT, 0, 0, regs[1], regs[2])]


@lowering("where")
def _fw_where(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    consts = {int(k): v for k, v in op.attrs["consts"].items()}
    shape: tuple[int, ...] = library.broadcast_shapes("where", *[r.shape for r in ins])
    return Saved(b.map("where", _where_code(consts), *ins, out_shape=shape))


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
    if fn in NO_GRAD:
        return [None]
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
    if kind in NO_GRAD:
        return out
    if kind in ("max", "min"):
        ga, gb = (b.node(library.minmax_grad(kind, x.shape, y.shape, i), x, y, g, label=f"{kind}_grad")
                  if need[i] else None for i in (0, 1))
    elif kind == "pow":  # torch's formulas: g * (y * x**(y-1)) and g * (out * log(x))
        ga = gb = None
        if need[0]:
            p = b.map("pow_ym1", [const(2, 1.0), I(Op.SUB, 1, 1, 2), *library.transcendental("pow")], x, y,
                      out_shape=g.shape)
            ga = b.map("pow_grad_x", [I(Op.MUL, 1, 1, 2), I(Op.MUL, 0, 0, 1)], g, y, p, out_shape=g.shape)
        if need[1]:
            gb = b.map("pow_grad_y", [I(Op.MUL, 1, 1, 2), I(Op.MUL, 0, 0, 1)], g, s.out, b.unary("log", x),
                       out_shape=g.shape)
    elif kind == "add":
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


@vjp("pow_const")
def _bw_pow_const(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    """g * (c * x**(c-1)) as torch: x**(c-1) by the same rules as the forward, then two MULs."""
    c = float(np.float32(op.attrs["exponent"]))
    if c == 0.0:
        return [b.map("zero_grad", [const(0, 0.0)], g)]
    if c == 1.0:
        return [g]
    p = b.node(library.pow_const(ins[0].shape, c - 1.0), ins[0], label="pow_const")
    return [b.map("pow_const_grad", [const(2, c), I(Op.MUL, 0, 0, 2), I(Op.MUL, 0, 1, 0)], p, g)]


@vjp("where")
def _bw_where(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    consts = {int(k) for k in op.attrs["consts"]}
    branches = [i for i in (1, 2) if i not in consts]  # operand index of each tensor input after c
    out: Grads = [None] * len(ins)
    cond = ins[0]
    for slot, branch in enumerate(branches, start=1):
        if need[slot]:
            gr = b.node(library.where_grad(cond.shape, g.shape, branch), cond, g, label="where_grad")
            out[slot] = b.unbroadcast(gr, ins[slot].shape)
    return out
