"""Elementwise (map) kernels: one output element from the same-position (broadcast) inputs.

``elementwise`` is the one constructor: input t, numpy-broadcast to the output shape, is loaded
into r_t, then the operator's code runs and r0 is the result. Unary, binary and gradient
operators are tables of such code (``UNARY_CODE``, ``BINARY_CODE``, ``GRAD_CODE``); a new
pointwise operator is one entry in a table (or, with parameters, one small function below).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from verde_chain.errors import RepOpsError
from verde_chain.repops.isa import Instr, Op
from verde_chain.repops.library.asm import I, const, load, transcendental
from verde_chain.repops.library.shapes import as_shape, broadcast_map, broadcast_shapes
from verde_chain.repops.program import KernelDesc

F32 = np.float32


def elementwise(
    label: str, in_shapes: Sequence[Sequence[int]], code: Sequence[Instr], out_shape: Sequence[int] | None = None
) -> KernelDesc:
    """Map kernel: input t (numpy-broadcast to the output) -> r_t, then ``code``; result r0."""
    shapes = [as_shape(s) for s in in_shapes]
    out = as_shape(out_shape) if out_shape is not None else broadcast_shapes(label, *shapes)
    if out_shape is not None:
        broadcast_shapes(label, out, *shapes)
    maps = tuple(broadcast_map(s, out) for s in shapes)
    pro = tuple(load(t, t) for t in range(len(shapes))) + tuple(code)
    return KernelDesc(out, 1, maps, pro, label=label)


# ----------------------------------------------------------------------- unary: x in r0

UNARY_CODE: dict[str, tuple[Instr, ...]] = {
    "identity": (),
    "neg": (I(Op.NEG, 0, 0),),
    "abs": (I(Op.ABS, 0, 0),),
    "sqrt": (I(Op.SQRT, 0, 0),),
    "floor": (I(Op.FLOOR, 0, 0),),
    "ceil": (I(Op.NEG, 0, 0), I(Op.FLOOR, 0, 0), I(Op.NEG, 0, 0)),  # -floor(-x)
    "round": (I(Op.RINT, 0, 0),),
    # relu(x) = MAX(x, +0): relu(-0) = +0, relu(NaN) = NaN (canonical)
    "relu": (const(1, 0.0), I(Op.MAX, 0, 0, 1)),
    "reciprocal": (const(1, 1.0), I(Op.DIV, 0, 1, 0)),
    "square": (I(Op.MUL, 0, 0, 0),),
    # booleans are binary32 0.0 / 1.0 (docs/repops-spec.md, "Integers and booleans")
    "isnan": (I(Op.EQ, 1, 0, 0), const(2, 1.0), I(Op.SUB, 0, 2, 1)),  # 1 - (x == x)
    "not": (const(1, 0.0), I(Op.EQ, 0, 0, 1)),  # x == 0 (NaN counts as true, as in SELECT)
}
TRANSCENDENTAL_UNARY = ("exp", "log", "tanh", "erf", "sigmoid", "gelu_erf", "gelu_tanh", "rsqrt", "sin", "cos")


def unary_code(name: str) -> tuple[Instr, ...]:
    if name in UNARY_CODE:
        return UNARY_CODE[name]
    if name in TRANSCENDENTAL_UNARY:
        return transcendental(name)
    raise RepOpsError(
        f"map_unary: unknown op {name!r}; supported: {sorted(UNARY_CODE) + list(TRANSCENDENTAL_UNARY)}"
    )


def map_unary(name: str, shape: Sequence[int]) -> KernelDesc:
    return elementwise(name, [shape], unary_code(name))


def map_affine(shape: Sequence[int], mul: float = 1.0, add: float = 0.0) -> KernelDesc:
    """y = x*mul + add (MUL then ADD, two roundings; either step omitted when neutral)."""
    code: list[Instr] = []
    if mul != 1.0:
        code += [const(1, mul), I(Op.MUL, 0, 0, 1)]
    if add != 0.0:
        code += [const(1, add), I(Op.ADD, 0, 0, 1)]
    return elementwise("affine", [shape], code)


def clip_code(lo: float | None, hi: float | None) -> tuple[Instr, ...]:
    """r0 = MIN(MAX(r0, lo), hi) (a bound omitted when None); writes r1; NaN stays NaN."""
    code: list[Instr] = []
    if lo is not None:
        code += [const(1, lo), I(Op.MAX, 0, 0, 1)]
    if hi is not None:
        code += [const(1, hi), I(Op.MIN, 0, 0, 1)]
    return tuple(code)


def clip(shape: Sequence[int], lo: float | None, hi: float | None) -> KernelDesc:
    """MIN(MAX(x, lo), hi); NaN stays NaN."""
    return elementwise("clip", [shape], clip_code(lo, hi))


def leaky_relu(shape: Sequence[int], alpha: float) -> KernelDesc:
    """x if x >= 0 (i.e. not x < 0) else x*alpha; NaN -> NaN."""
    code = (
        const(1, 0.0),
        I(Op.LT, 2, 0, 1),  # r2 = x < 0
        const(3, alpha),
        I(Op.MUL, 3, 0, 3),  # r3 = x * alpha
        I(Op.SELECT, 0, 2, 3, 0),  # r0 = r2 ? r3 : x
    )
    return elementwise("leaky_relu", [shape], code)


def pow_const_code(exponent: float) -> tuple[Instr, ...]:
    """x**c for a constant c, x in r0: the exponents torch computes without pow() by the same
    roundings (2: x*x, 3: (x*x)*x, -1: 1/x, -2: 1/(x*x), 0.5: sqrt), 1 and 0 exactly, any
    other c the ``pow`` program with c in r1."""
    c = float(F32(exponent))
    special: dict[float, tuple[Instr, ...]] = {
        1.0: (),
        0.0: (const(0, 1.0),),  # pow(x, 0) = 1, NaN included
        2.0: (I(Op.MUL, 0, 0, 0),),
        3.0: (I(Op.MUL, 1, 0, 0), I(Op.MUL, 0, 1, 0)),
        0.5: (I(Op.SQRT, 0, 0),),
        -1.0: (const(1, 1.0), I(Op.DIV, 0, 1, 0)),
        -2.0: (I(Op.MUL, 0, 0, 0), const(1, 1.0), I(Op.DIV, 0, 1, 0)),
    }
    return special.get(c, (const(1, c),) + transcendental("pow"))


def pow_const(shape: Sequence[int], exponent: float) -> KernelDesc:
    return elementwise("pow_const", [shape], pow_const_code(exponent))


def gelu(shape: Sequence[int], approximate: str = "none") -> KernelDesc:
    """GELU, exact (erf) form or ``approximate="tanh"``: one transcendental program each."""
    return map_unary("gelu_tanh" if approximate == "tanh" else "gelu_erf", shape)


# ----------------------------------------------------------------------- binary: a in r0, b in r1

BINARY_CODE: dict[str, tuple[Instr, ...]] = {
    "add": (I(Op.ADD, 0, 0, 1),),
    "sub": (I(Op.SUB, 0, 0, 1),),
    "mul": (I(Op.MUL, 0, 0, 1),),
    "div": (I(Op.DIV, 0, 0, 1),),
    "max": (I(Op.MAX, 0, 0, 1),),
    "min": (I(Op.MIN, 0, 0, 1),),
    "lt": (I(Op.LT, 0, 0, 1),),
    "gt": (I(Op.LT, 0, 1, 0),),
    "eq": (I(Op.EQ, 0, 0, 1),),
    # a <= b as MAX(a < b, a == b): both are 0.0 / 1.0, so MAX is OR (false on NaN)
    "le": (I(Op.LT, 2, 0, 1), I(Op.EQ, 3, 0, 1), I(Op.MAX, 0, 2, 3)),
    "ge": (I(Op.LT, 2, 1, 0), I(Op.EQ, 3, 0, 1), I(Op.MAX, 0, 2, 3)),
    "ne": (I(Op.EQ, 2, 0, 1), const(3, 1.0), I(Op.SUB, 0, 3, 2)),  # 1 - (a == b): true on NaN
    # logical ops on booleans (0.0 / 1.0): MIN is AND, MAX is OR, and 'a != b' is XOR
    "and": (I(Op.MIN, 0, 0, 1),),
    "or": (I(Op.MAX, 0, 0, 1),),
    "xor": (I(Op.EQ, 2, 0, 1), const(3, 1.0), I(Op.SUB, 0, 3, 2)),
    "pow": transcendental("pow"),  # C99 pow (docs/repops-transcendentals.md)
}


def binary(op: str, a_shape: Sequence[int], b_shape: Sequence[int]) -> KernelDesc:
    if op not in BINARY_CODE:
        raise RepOpsError(f"binary: unknown op {op!r}; supported: {sorted(BINARY_CODE)}")
    return elementwise(op, [a_shape, b_shape], BINARY_CODE[op])


def where(cond_shape: Sequence[int], x_shape: Sequence[int], y_shape: Sequence[int]) -> KernelDesc:
    """x where cond != 0.0 (NaN counts as true) else y."""
    return elementwise("where", [cond_shape, x_shape, y_shape], (I(Op.SELECT, 0, 0, 1, 2),))


# ----------------------------------------------------------------------- gradients of unary maps

GRAD_CODE: dict[str, tuple[Instr, ...]] = {
    # inputs: r0 = forward input x (or output y, see the name), r1 = upstream gradient g
    # relu'(x) * g = g if 0 < x else +0 (x = -0, +0, NaN give +0)
    "relu_grad": (const(2, 0.0), I(Op.LT, 3, 2, 0), I(Op.SELECT, 0, 3, 1, 2)),
    # from y = tanh(x): g * (1 - y*y)
    "tanh_grad_y": (I(Op.MUL, 2, 0, 0), const(3, 1.0), I(Op.SUB, 2, 3, 2), I(Op.MUL, 0, 1, 2)),
    # from y = sigmoid(x): g * (y * (1 - y))
    "sigmoid_grad_y": (const(3, 1.0), I(Op.SUB, 2, 3, 0), I(Op.MUL, 2, 0, 2), I(Op.MUL, 0, 1, 2)),
    # from y = exp(x): g * y
    "exp_grad_y": (I(Op.MUL, 0, 1, 0),),
    # from x: g / x
    "log_grad": (I(Op.DIV, 0, 1, 0),),
    # from y = sqrt(x): g / (y + y)
    "sqrt_grad_y": (I(Op.ADD, 2, 0, 0), I(Op.DIV, 0, 1, 2)),
    # from y = 1/x: -(g * (y * y)), torch's order
    "reciprocal_grad_y": (I(Op.MUL, 2, 0, 0), I(Op.MUL, 0, 1, 2), I(Op.NEG, 0, 0)),
}
TRANSCENDENTAL_GRAD = ("gelu_erf_grad", "gelu_tanh_grad", "sin_grad", "cos_grad")


def unary_grad(name: str, shape: Sequence[int]) -> KernelDesc:
    """Backward of a unary map: inputs (x or y as named, g) -> dx."""
    if name in GRAD_CODE:
        code = GRAD_CODE[name]
    elif name in TRANSCENDENTAL_GRAD:
        code = transcendental(name)
    else:
        raise RepOpsError(f"unary_grad: unknown {name!r}; supported: {sorted(GRAD_CODE) + list(TRANSCENDENTAL_GRAD)}")
    return elementwise(name, [shape, shape], code)


# ----------------------------------------------------------------------- gradients of binary maps


def minmax_grad(op: str, a_shape: Sequence[int], b_shape: Sequence[int], wrt: int) -> KernelDesc:
    """Gradient of ``max``/``min`` (a in r0, b in r1, g in r2) w.r.t. operand ``wrt``, as torch
    splits it: g where that operand alone wins, g/2 on a tie, +0 where it loses (a NaN operand
    wins: it is what the forward returned)."""
    if op not in ("max", "min"):
        raise RepOpsError(f"minmax_grad: {op!r} is not max or min")
    mine, other = (0, 1) if wrt == 0 else (1, 0)
    wins = I(Op.LT, 3, other, mine) if op == "max" else I(Op.LT, 3, mine, other)
    code = (
        wins,  # r3 = this operand wins strictly
        I(Op.EQ, 4, 0, 1),  # r4 = tie
        I(Op.EQ, 5, mine, mine),
        const(6, 1.0),
        I(Op.SUB, 5, 6, 5),  # r5 = this operand is NaN
        I(Op.MAX, 3, 3, 5),
        const(6, 0.5),
        I(Op.MUL, 6, 2, 6),  # r6 = g/2
        const(7, 0.0),
        I(Op.SELECT, 6, 4, 6, 7),  # tie ? g/2 : +0
        I(Op.SELECT, 0, 3, 2, 6),  # wins ? g : (tie ? g/2 : +0)
    )
    out = broadcast_shapes(f"{op}_grad", a_shape, b_shape)
    return elementwise(f"{op}_grad", [a_shape, b_shape, out], code, out)


def where_grad(cond_shape: Sequence[int], g_shape: Sequence[int], branch: int) -> KernelDesc:
    """Gradient of ``where(c, x, y)`` w.r.t. x (branch 1: SELECT(c, g, +0)) or y (branch 2:
    SELECT(c, +0, g)); inputs (c, g), the output has g's shape."""
    code = (const(2, 0.0), I(Op.SELECT, 0, 0, 1, 2) if branch == 1 else I(Op.SELECT, 0, 0, 2, 1))
    return elementwise("where_grad", [cond_shape, g_shape], code, g_shape)


# ----------------------------------------------------------------------- vision activations
def hard_sigmoid(shape: Sequence[int], alpha: float = 0.2, beta: float = 0.5) -> KernelDesc:
    """ONNX HardSigmoid: ``MAX(MIN(ADD(MUL(x, alpha), beta), 1), +0)``; NaN -> NaN."""
    return elementwise("hard_sigmoid", [shape], _hard_sigmoid_code(alpha, beta, 0))


def _hard_sigmoid_code(alpha: float, beta: float, dst: int) -> tuple[Instr, ...]:
    """``r_dst = hard_sigmoid(r0)`` (r_dst and r_dst+1 written)."""
    t = dst + 1
    return (
        const(t, alpha),
        I(Op.MUL, dst, 0, t),  # alpha * x
        const(t, beta),
        I(Op.ADD, dst, dst, t),  # z = alpha * x + beta
        const(t, 1.0),
        I(Op.MIN, dst, dst, t),
        const(t, 0.0),
        I(Op.MAX, dst, dst, t),
    )


def _inside_code(alpha: float, beta: float) -> tuple[Instr, ...]:
    """``r4 = 1.0`` where ``0 < alpha*x + beta < 1`` (x in r0), else +0; uses r4..r6."""
    return (
        const(5, alpha),
        I(Op.MUL, 4, 0, 5),
        const(5, beta),
        I(Op.ADD, 4, 4, 5),  # r4 = z
        const(5, 0.0),
        I(Op.LT, 6, 5, 4),  # r6 = 0 < z
        const(5, 1.0),
        I(Op.LT, 4, 4, 5),  # r4 = z < 1
        I(Op.MUL, 4, 4, 6),  # both (1.0 * 1.0 or a +0)
    )


def hard_swish(shape: Sequence[int]) -> KernelDesc:
    """ONNX HardSwish: ``MUL(x, hard_sigmoid(x))`` with alpha = 1/6, beta = 0.5."""
    return elementwise("hard_swish", [shape], _hard_sigmoid_code(1 / 6, 0.5, 2) + (I(Op.MUL, 0, 0, 2),))


def hard_sigmoid_grad(shape: Sequence[int], alpha: float = 0.2, beta: float = 0.5) -> KernelDesc:
    """inputs (x, g): ``SELECT(inside, MUL(g, alpha), +0)``, inside = ``0 < alpha*x + beta < 1``."""
    code = _inside_code(alpha, beta) + (const(5, alpha), I(Op.MUL, 5, 1, 5), const(6, 0.0), I(Op.SELECT, 0, 4, 5, 6))
    return elementwise("hard_sigmoid_grad", [shape, shape], code)


def hard_swish_grad(shape: Sequence[int]) -> KernelDesc:
    """inputs (x, g): ``MUL(g, ADD(hard_sigmoid(x), SELECT(inside, MUL(x, 1/6), +0)))``."""
    code = (
        _hard_sigmoid_code(1 / 6, 0.5, 2)  # r2 = hard_sigmoid(x)
        + _inside_code(1 / 6, 0.5)  # r4 = inside
        + (const(5, 1 / 6), I(Op.MUL, 5, 0, 5), const(6, 0.0), I(Op.SELECT, 5, 4, 5, 6),  # r5 = inside ? x/6 : +0
           I(Op.ADD, 2, 2, 5), I(Op.MUL, 0, 1, 2))
    )
    return elementwise("hard_swish_grad", [shape, shape], code)


def clip_grad(shape: Sequence[int], lo: float | None, hi: float | None) -> KernelDesc:
    """inputs (x, g): g where ``lo < x < hi`` (strictly, as torch's hardtanh), else +0."""
    code: list[Instr] = [const(3, 1.0)]  # r3 = inside so far
    if lo is not None:
        code += [const(2, lo), I(Op.LT, 2, 2, 0), I(Op.MUL, 3, 3, 2)]
    if hi is not None:
        code += [const(2, hi), I(Op.LT, 2, 0, 2), I(Op.MUL, 3, 3, 2)]
    code += [const(2, 0.0), I(Op.SELECT, 0, 3, 1, 2)]
    return elementwise("clip_grad", [shape, shape], code)


def softplus_tail(shape: Sequence[int]) -> KernelDesc:
    """Softplus's last node: inputs (x, t = exp(x), l = log(1 + t)) ->
    ``SELECT(LT(20, x), x, SELECT(EQ(u, 1), t, MUL(l, DIV(t, SUB(u, 1)))))`` with ``u = ADD(t, 1)``:
    ``log1p(t)`` by Goldberg's correction (accurate where ``1 + t`` rounds), x itself above 20."""
    code = (
        const(3, 1.0),
        I(Op.ADD, 4, 1, 3),  # r4 = u = t + 1
        I(Op.SUB, 5, 4, 3),  # r5 = u - 1
        I(Op.DIV, 5, 1, 5),  # r5 = t / (u - 1)
        I(Op.MUL, 5, 2, 5),  # r5 = l * t / (u - 1)
        I(Op.EQ, 6, 4, 3),  # r6 = u == 1
        I(Op.SELECT, 5, 6, 1, 5),  # r5 = u == 1 ? t : r5
        const(3, 20.0),
        I(Op.LT, 6, 3, 0),  # r6 = 20 < x
        I(Op.SELECT, 0, 6, 0, 5),
    )
    return elementwise("softplus", [shape, shape, shape], code)


def log1p_exp_log(shape: Sequence[int]) -> KernelDesc:
    """``log(ADD(t, 1))`` (softplus's middle node; t = exp(x) in r0)."""
    return elementwise("log_1p", [shape], (const(1, 1.0), I(Op.ADD, 0, 0, 1), *transcendental("log")))


def sigmoid_times(shape: Sequence[int]) -> KernelDesc:
    """inputs (x, g): ``MUL(sigmoid(x), g)`` (softplus's gradient); g is loaded after the program."""
    sh = as_shape(shape)
    m = broadcast_map(sh, sh)
    pro = (load(0, 0), *transcendental("sigmoid"), load(1, 1), I(Op.MUL, 0, 0, 1))
    return KernelDesc(sh, 1, (m, m), pro, label="softplus_grad")


def dropout_apply(shape: Sequence[int], ratio: float) -> KernelDesc:
    """inputs (x, mask): ``MUL(MUL(x, mask), fl32(1 / (1 - ratio)))`` (the mask 1.0 / +0.0);
    also the backward, with g for x."""
    scale = 1.0 / (1.0 - float(np.float32(ratio)))
    return elementwise("dropout", [shape, shape], (I(Op.MUL, 0, 0, 1), const(1, scale), I(Op.MUL, 0, 0, 1)))
