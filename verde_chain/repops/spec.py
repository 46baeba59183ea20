"""The RepOps operator library: every operator as primitive KernelDescs and their compositions.

Primitive builders return one :class:`KernelDesc` (``binary``, ``map_unary``, ``reduce``,
``matmul``, ``gemm``, ``gather``, ``scatter_add``, ...). High-level operators (softmax, layer
norm, cross-entropy, optimizers and all backward passes) are :class:`Composite` s: small DAGs of
primitive nodes, exactly as they appear in a training graph. ``docs/repops-spec.md`` lists every
program and composition; this file is the executable form of that document.

Conventions used by every elementwise program: input t is loaded into register r_t by the
prologue, the op's code follows, the result is r0. Transcendental programs come from
``transcendental.PROGRAMS`` (engineer T): input r0 (and r1 for gradients), output r0, any
register may be clobbered, so they are never fused into reductions.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from verde_chain.errors import RepOpsError
from verde_chain.repops.isa import Instr, Op, f32_bits
from verde_chain.repops.program import InputMap, KernelDesc, run_spec, trace  # noqa: F401

Shape = tuple[int, ...]
Runner = Callable[[KernelDesc, list[np.ndarray]], np.ndarray]

# ======================================================================= small helpers


def _shape(s: Sequence[int]) -> Shape:
    return tuple(int(d) for d in s)


def c_strides(shape: Sequence[int]) -> Shape:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def broadcast_shapes(op: str, *shapes: Sequence[int]) -> Shape:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise RepOpsError(f"{op}: shapes {[tuple(s) for s in shapes]} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def broadcast_map(in_shape: Sequence[int], out_shape: Sequence[int]) -> InputMap:
    """Map reading a C-contiguous ``in_shape`` tensor broadcast (numpy rules) to ``out_shape``."""
    st = c_strides(in_shape)
    lead = len(out_shape) - len(in_shape)
    strides = []
    for d in range(len(out_shape)):
        i = d - lead
        strides.append(0 if i < 0 or in_shape[i] == 1 else st[i])
    return InputMap(numel(in_shape), tuple(strides))


def _axes(op: str, axes: Sequence[int] | None, rank: int) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(rank))
    out = sorted({a + rank if a < 0 else a for a in axes})
    if any(not 0 <= a < rank for a in out):
        raise RepOpsError(f"{op}: axes {tuple(axes)} out of range for rank {rank}")
    return tuple(out)


def I(op: Op, dst: int, a: int = 0, b: int = 0, c: int = 0) -> Instr:
    return Instr(op, dst, a, b, c)


def const(dst: int, value: float) -> Instr:
    """CONST of ``value`` rounded to binary32 (exact for the constants we use; see docs)."""
    return Instr(Op.CONST, dst, imm=f32_bits(value))


def load(dst: int, slot: int) -> Instr:
    return Instr(Op.LOAD, dst, imm=slot)


def transcendental(name: str) -> tuple[Instr, ...]:
    from verde_chain.repops import transcendental as tr

    prog = tr.PROGRAMS.get(name)
    if prog is None:
        raise RepOpsError(
            f"{name}: no transcendental program; available: {sorted(tr.PROGRAMS)}"
        )
    return tuple(prog)


# ======================================================================= exact constants


def _round_to_24_bits(q: int, s: int, sticky: bool) -> tuple[int, int]:
    """Round q * 2**-s (q of 25 bits or more; ``sticky``: something non-zero lies below q's lsb)
    to 24 significant bits, nearest-even. Returns (q', s') with the rounded value q' * 2**-s'."""
    while q.bit_length() > 25:
        sticky = sticky or bool(q & 1)
        q >>= 1
        s -= 1
    guard, q = q & 1, q >> 1
    s -= 1
    if guard and (sticky or (q & 1)):
        q += 1
    return q, s


def f32_of_fraction(x: Fraction) -> float:
    """Correctly rounded (nearest-even) binary32 value of an exact rational (normal range)."""
    if x == 0:
        return 0.0
    sign = -1.0 if x < 0 else 1.0
    x = abs(x)
    e = x.numerator.bit_length() - x.denominator.bit_length()
    # scale so that q = floor(x * 2**s) has 25..26 bits: 24 kept + guard + more
    s = 25 - e
    num, den = (x.numerator << s, x.denominator) if s >= 0 else (x.numerator, x.denominator << -s)
    q, r = divmod(num, den)
    q, s = _round_to_24_bits(q, s, r != 0)
    val = math.ldexp(q, -s)
    if not (2.0**-126 <= val <= 3.4028234663852886e38):
        raise RepOpsError(f"constant {x} outside the binary32 normal range")
    return sign * val


def f32_of_sqrt_fraction(x: Fraction) -> float:
    """Correctly rounded binary32 value of sqrt(x) for an exact rational x > 0."""
    if x <= 0:
        raise RepOpsError(f"sqrt constant of non-positive {x}")
    e = (x.numerator.bit_length() - x.denominator.bit_length()) // 2
    s = 25 - e  # sqrt(x) * 2**s has about 25..26 bits
    n = x * Fraction(4) ** s
    floor_n = n.numerator // n.denominator
    q = math.isqrt(floor_n)
    inexact = q * q != floor_n or n.denominator != 1 and n.numerator % n.denominator != 0
    q, s = _round_to_24_bits(q, s, inexact)
    return math.ldexp(q, -s)


def f32q(x: float) -> Fraction:
    """The exact rational value of ``x`` after rounding to binary32 (hyper-parameters)."""
    return Fraction(float(np.float32(x)))


# ======================================================================= primitive kernels


def elementwise(
    label: str, in_shapes: Sequence[Sequence[int]], code: Sequence[Instr], out_shape: Sequence[int] | None = None
) -> KernelDesc:
    """Map kernel: input t (numpy-broadcast to the output) -> r_t, then ``code``; result r0."""
    shapes = [_shape(s) for s in in_shapes]
    out = _shape(out_shape) if out_shape is not None else broadcast_shapes(label, *shapes)
    if out_shape is not None:
        broadcast_shapes(label, out, *shapes)
    maps = tuple(broadcast_map(s, out) for s in shapes)
    pro = tuple(load(t, t) for t in range(len(shapes))) + tuple(code)
    return KernelDesc(out, 1, maps, pro, label=label)


UNARY_CODE: dict[str, tuple[Instr, ...]] = {
    "identity": (),
    "neg": (I(Op.NEG, 0, 0),),
    "abs": (I(Op.ABS, 0, 0),),
    "sqrt": (I(Op.SQRT, 0, 0),),
    "floor": (I(Op.FLOOR, 0, 0),),
    "ceil": (I(Op.NEG, 0, 0), I(Op.FLOOR, 0, 0), I(Op.NEG, 0, 0)),
    "round": (I(Op.RINT, 0, 0),),
    # relu(x) = MAX(x, +0): relu(-0) = +0, relu(NaN) = NaN (canonical)
    "relu": (const(1, 0.0), I(Op.MAX, 0, 0, 1)),
    "reciprocal": (const(1, 1.0), I(Op.DIV, 0, 1, 0)),
    "square": (I(Op.MUL, 0, 0, 0),),
}
TRANSCENDENTAL_UNARY = ("exp", "log", "tanh", "erf", "sigmoid", "gelu_erf", "gelu_tanh", "rsqrt")


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


def clip(shape: Sequence[int], lo: float | None, hi: float | None) -> KernelDesc:
    """MIN(MAX(x, lo), hi); NaN stays NaN."""
    code: list[Instr] = []
    if lo is not None:
        code += [const(1, lo), I(Op.MAX, 0, 0, 1)]
    if hi is not None:
        code += [const(1, hi), I(Op.MIN, 0, 0, 1)]
    return elementwise("clip", [shape], code)


def leaky_relu(shape: Sequence[int], alpha: float) -> KernelDesc:
    """x if x >= 0 (i.e. not x < 0) else x*alpha; NaN -> NaN."""
    code = (const(1, 0.0), I(Op.LT, 2, 0, 1), const(3, alpha), I(Op.MUL, 3, 0, 3), I(Op.SELECT, 0, 2, 3, 0))
    return elementwise("leaky_relu", [shape], code)


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
    "le": (I(Op.LT, 2, 0, 1), I(Op.EQ, 3, 0, 1), I(Op.MAX, 0, 2, 3)),
    "ge": (I(Op.LT, 2, 1, 0), I(Op.EQ, 3, 0, 1), I(Op.MAX, 0, 2, 3)),
}


def binary(op: str, a_shape: Sequence[int], b_shape: Sequence[int]) -> KernelDesc:
    if op not in BINARY_CODE:
        raise RepOpsError(f"binary: unknown op {op!r}; supported: {sorted(BINARY_CODE)}")
    return elementwise(op, [a_shape, b_shape], BINARY_CODE[op])


def where(cond_shape: Sequence[int], x_shape: Sequence[int], y_shape: Sequence[int]) -> KernelDesc:
    """x where cond != 0.0 (NaN counts as true) else y."""
    return elementwise("where", [cond_shape, x_shape, y_shape], (I(Op.SELECT, 0, 0, 1, 2),))


GRAD_CODE: dict[str, tuple[Instr, ...]] = {
    # inputs: r0 = forward input x (or output y, see docs), r1 = upstream gradient g
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
}


def unary_grad(name: str, shape: Sequence[int]) -> KernelDesc:
    """Backward of a unary map: inputs (x or y as named, g) -> dx."""
    if name in GRAD_CODE:
        code = GRAD_CODE[name]
    elif name in ("gelu_erf_grad", "gelu_tanh_grad"):
        code = transcendental(name)
    else:
        raise RepOpsError(
            f"unary_grad: unknown {name!r}; supported: {sorted(GRAD_CODE) + ['gelu_erf_grad', 'gelu_tanh_grad']}"
        )
    return elementwise(name, [shape, shape], code)


# ----------------------------------------------------------------------- reductions

REDUCE_KINDS = ("sum", "mean", "max", "min", "prod", "sumsq", "l1", "l2", "meansq")


def reduced_shape(shape: Shape, axes: tuple[int, ...], keepdims: bool) -> Shape:
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in axes)


def linear_k_stride(shape: Shape, strides: Shape, axes: tuple[int, ...]) -> int | None:
    """kstride if k (row-major over ``axes``) maps linearly to memory, else None."""
    live = [a for a in axes if shape[a] > 1]
    if not live:
        return 1
    for a, b in itertools.pairwise(live):
        if strides[a] != strides[b] * shape[b]:
            return None
    return strides[live[-1]]


def _reduce_code(kind: str, K: int) -> tuple[tuple[Instr, ...], tuple[Instr, ...], tuple[Instr, ...]]:
    chain = {"sum": Op.ADD, "mean": Op.ADD, "max": Op.MAX, "min": Op.MIN, "prod": Op.MUL}
    if kind in chain:
        pro: tuple[Instr, ...] = (load(0, 0),)
        body: tuple[Instr, ...] = (load(1, 0), I(chain[kind], 0, 0, 1))
    elif kind in ("sumsq", "l2", "meansq"):  # dot-product order: MUL first, FMA after
        pro = (load(1, 0), I(Op.MUL, 0, 1, 1))
        body = (load(1, 0), I(Op.FMA, 0, 1, 1, 0))
    elif kind == "l1":
        pro = (load(0, 0), I(Op.ABS, 0, 0))
        body = (load(1, 0), I(Op.ABS, 1, 1), I(Op.ADD, 0, 0, 1))
    else:
        raise RepOpsError(f"reduce: unknown kind {kind!r}; supported: {REDUCE_KINDS}")
    epi: tuple[Instr, ...] = ()
    if kind in ("mean", "meansq"):
        epi = (const(1, float(K)), I(Op.DIV, 0, 0, 1))
    elif kind == "l2":
        epi = (I(Op.SQRT, 0, 0),)
    return pro, body, epi


def reduce(
    kind: str,
    shape: Sequence[int],
    axes: Sequence[int] | None = None,
    keepdims: bool = True,
) -> KernelDesc:
    """Reduction over ``axes`` with k ascending in row-major order of the reduced axes.

    The input is C-contiguous; the reduced axes must be linear in memory (see
    ``linear_k_stride``) — otherwise use ``Builder.reduce``/``reduce_composite``, which insert a
    transpose node first. mean = sum / fl32(K); l2 = sqrt(sum of squares).
    """
    shp = _shape(shape)
    ax = _axes(f"reduce_{kind}", axes, len(shp))
    st = c_strides(shp)
    K = numel([shp[a] for a in ax])
    ks = linear_k_stride(shp, st, ax)
    if ks is None:
        raise RepOpsError(f"reduce_{kind}: axes {ax} of {shp} are not contiguous in memory")
    out = reduced_shape(shp, ax, keepdims)
    kept = [d for d in range(len(shp)) if d not in ax]
    if keepdims:
        ostr = tuple(0 if d in ax else st[d] for d in range(len(shp)))
    else:
        ostr = tuple(st[d] for d in kept)
    pro, body, epi = _reduce_code(kind, K)
    return KernelDesc(out, K, (InputMap(numel(shp), ostr, ks),), pro, body if K > 1 else (), epi, label=f"reduce_{kind}")


def reduce_dot(shape: Sequence[int], axes: Sequence[int] | None = None, keepdims: bool = True, mean: bool = False) -> KernelDesc:
    """sum over axes of a*b (same-shape contiguous a, b): MUL at k=0, FMA chain after."""
    shp = _shape(shape)
    ax = _axes("reduce_dot", axes, len(shp))
    st = c_strides(shp)
    ks = linear_k_stride(shp, st, ax)
    if ks is None:
        raise RepOpsError(f"reduce_dot: axes {ax} of {shp} are not contiguous in memory")
    K = numel([shp[a] for a in ax])
    out = reduced_shape(shp, ax, keepdims)
    ostr = tuple(0 if d in ax else st[d] for d in range(len(shp))) if keepdims else tuple(
        st[d] for d in range(len(shp)) if d not in ax
    )
    m = InputMap(numel(shp), ostr, ks)
    pro = (load(1, 0), load(2, 1), I(Op.MUL, 0, 1, 2))
    body = (load(1, 0), load(2, 1), I(Op.FMA, 0, 1, 2, 0))
    epi = (const(1, float(K)), I(Op.DIV, 0, 0, 1)) if mean else ()
    return KernelDesc(out, K, (m, m), pro, body if K > 1 else (), epi, label="reduce_dot")


# ----------------------------------------------------------------------- linear algebra


def _matmul_maps(a_shape: Shape, b_shape: Shape, trans_a: bool, trans_b: bool) -> tuple[Shape, int, InputMap, InputMap, bool, bool]:
    if not a_shape or not b_shape:
        raise RepOpsError("matmul: scalars are not supported (rank >= 1 needed)")
    a_vec, b_vec = len(a_shape) == 1, len(b_shape) == 1
    a2 = (1,) + a_shape if a_vec else a_shape
    b2 = b_shape + (1,) if b_vec else b_shape
    ast, bst = c_strides(a2), c_strides(b2)
    # logical (M, K) view of a and (K, N) of b, with transposes expressed as swapped strides
    M, K, a_m, a_k = _matrix_view(a2, ast, trans_a)
    Kb, N, b_k, b_n = _matrix_view(b2, bst, trans_b)
    if K != Kb:
        raise RepOpsError(f"matmul: inner dims differ ({a_shape} x {b_shape}, trans {trans_a}/{trans_b})")
    batch = broadcast_shapes("matmul", a2[:-2], b2[:-2])
    out = batch + (M, N)
    abm = broadcast_map(a2[:-2], batch).strides if batch else ()
    bbm = broadcast_map(b2[:-2], batch).strides if batch else ()
    # batch strides of a/b scale by the matrix size
    a_mat, b_mat = a2[-1] * a2[-2], b2[-1] * b2[-2]
    amap = InputMap(numel(a2), tuple(s * a_mat for s in abm) + (a_m, 0), a_k)
    bmap = InputMap(numel(b2), tuple(s * b_mat for s in bbm) + (0, b_n), b_k)
    return out, K, amap, bmap, a_vec, b_vec


def _squeeze_vec(out: Shape, a_vec: bool, b_vec: bool, maps: list[InputMap]) -> tuple[Shape, list[InputMap]]:
    """Drop the unit M (a vector) / N (b vector) output dims numpy's matmul drops."""
    drop = set()
    if a_vec:
        drop.add(len(out) - 2)
    if b_vec:
        drop.add(len(out) - 1)
    keep = [d for d in range(len(out)) if d not in drop]
    out2 = tuple(out[d] for d in keep)
    return out2, [
        InputMap(m.numel, tuple(m.strides[d] for d in keep), m.kstride, m.offset, m.idx_stride) for m in maps
    ]


def _matrix_view(shape: Shape, strides: Shape, transposed: bool) -> tuple[int, int, int, int]:
    """(rows, cols, row stride, col stride) of the last two axes read as a matrix, or as its
    transpose (the same elements with the two axes' roles swapped)."""
    r, c = (-1, -2) if transposed else (-2, -1)
    return shape[r], shape[c], strides[r], strides[c]


def matmul(a_shape: Sequence[int], b_shape: Sequence[int], trans_a: bool = False, trans_b: bool = False) -> KernelDesc:
    """numpy-style (batched, broadcast) matmul; acc = a0*b0, then acc = FMA(a_k, b_k, acc)."""
    out, K, amap, bmap, av, bv = _matmul_maps(_shape(a_shape), _shape(b_shape), trans_a, trans_b)
    out, (amap, bmap) = _squeeze_vec(out, av, bv, [amap, bmap])
    pro = (load(1, 0), load(2, 1), I(Op.MUL, 0, 1, 2))
    body = (load(1, 0), load(2, 1), I(Op.FMA, 0, 1, 2, 0))
    return KernelDesc(out, K, (amap, bmap), pro, body if K > 1 else (), label="matmul")


def gemm(
    a_shape: Sequence[int],
    b_shape: Sequence[int],
    c_shape: Sequence[int] | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    trans_a: bool = False,
    trans_b: bool = False,
) -> KernelDesc:
    """ONNX Gemm as ONE node: dot chain, then epilogue r0 = r0*alpha (if != 1) + C*beta."""
    a, b = _shape(a_shape), _shape(b_shape)
    if len(a) != 2 or len(b) != 2:
        raise RepOpsError(f"gemm: A and B must be 2-D, got {a} and {b}")
    mm = matmul(a, b, trans_a, trans_b)
    epi: list[Instr] = []
    if alpha != 1.0:
        epi += [const(1, alpha), I(Op.MUL, 0, 0, 1)]
    inputs = list(mm.inputs)
    if c_shape is not None and beta != 0.0:
        inputs.append(broadcast_map(_shape(c_shape), mm.out_shape))
        epi.append(load(1, 2))
        if beta != 1.0:
            epi += [const(2, beta), I(Op.MUL, 1, 1, 2)]
        epi.append(I(Op.ADD, 0, 0, 1))
    return KernelDesc(mm.out_shape, mm.K, tuple(inputs), mm.prologue, mm.body, tuple(epi), label="gemm")


# ----------------------------------------------------------------------- data movement


def strided_copy(out_shape: Sequence[int], in_numel: int, strides: Sequence[int], offset: int = 0, label: str = "copy") -> KernelDesc:
    return KernelDesc(_shape(out_shape), 1, (InputMap(in_numel, _shape(strides), 0, offset),), (load(0, 0),), label=label)


def transpose(shape: Sequence[int], perm: Sequence[int] | None = None) -> KernelDesc:
    shp = _shape(shape)
    p = tuple(reversed(range(len(shp)))) if perm is None else tuple(a % len(shp) for a in perm) if shp else ()
    if sorted(p) != list(range(len(shp))):
        raise RepOpsError(f"transpose: {perm} is not a permutation of rank {len(shp)}")
    st = c_strides(shp)
    return strided_copy(tuple(shp[a] for a in p), numel(shp), tuple(st[a] for a in p), label="transpose")


def reshape(shape: Sequence[int], new_shape: Sequence[int]) -> KernelDesc:
    new = _shape(new_shape)
    if numel(new) != numel(shape):
        raise RepOpsError(f"reshape: {tuple(shape)} -> {new} changes the element count")
    return strided_copy(new, numel(shape), c_strides(new), label="reshape")


def expand(shape: Sequence[int], out_shape: Sequence[int]) -> KernelDesc:
    out = broadcast_shapes("expand", shape, out_shape)
    return KernelDesc(out, 1, (broadcast_map(_shape(shape), out),), (load(0, 0),), label="expand")


def slice_(shape: Sequence[int], starts: Sequence[int], ends: Sequence[int], steps: Sequence[int]) -> KernelDesc:
    """x[start:end:step] per axis (already clamped/normalised python-slice semantics)."""
    shp = _shape(shape)
    st = c_strides(shp)
    out, strides, off = [], [], 0
    for d, n in enumerate(shp):
        rng = range(*slice(starts[d], ends[d], steps[d]).indices(n))
        if len(rng) == 0:
            raise RepOpsError("slice: empty results are not supported")
        out.append(len(rng))
        strides.append(rng.step * st[d])
        off += rng.start * st[d]
    return strided_copy(out, numel(shp), strides, off, label="slice")


def _load_at_index(dim: int) -> tuple[Instr, ...]:
    """Prologue of gather / gather_elements: r1 = the index (input 1), wrapped once if negative
    (idx + dim, as ONNX), then r0 = LOADIDX of input 0 at r1 along the gathered axis."""
    return (
        load(1, 1),
        const(2, 0.0),
        I(Op.LT, 3, 1, 2),
        const(4, float(dim)),
        I(Op.ADD, 4, 1, 4),
        I(Op.SELECT, 1, 3, 4, 1),
        Instr(Op.LOADIDX, 0, 1, 0, 0),
    )


def gather(data_shape: Sequence[int], idx_shape: Sequence[int], axis: int = 0) -> KernelDesc:
    """ONNX Gather: out[i_pre, j, i_post] = data[i_pre, idx[j], i_post] via LOADIDX.

    Indices are float32 integral values; negative ones wrap once (idx + dim, as ONNX); anything
    else out of range or non-integral gives canonical NaN (the LOADIDX rule).
    """
    ds, js = _shape(data_shape), _shape(idx_shape)
    ax = axis + len(ds) if axis < 0 else axis
    if not 0 <= ax < len(ds):
        raise RepOpsError(f"gather: axis {axis} out of range for {ds}")
    out = ds[:ax] + js + ds[ax + 1 :]
    dst = c_strides(ds)
    data_strides = dst[:ax] + (0,) * len(js) + dst[ax + 1 :]
    idx_strides = (0,) * ax + c_strides(js) + (0,) * (len(ds) - ax - 1)
    dmap = InputMap(numel(ds), data_strides, 0, 0, dst[ax])
    imap = InputMap(max(1, numel(js)), idx_strides)
    pro = _load_at_index(ds[ax])
    return KernelDesc(out, 1, (dmap, imap), pro, label="gather")


def gather_elements(data_shape: Sequence[int], idx_shape: Sequence[int], axis: int = 0) -> KernelDesc:
    """ONNX GatherElements: out[c] = data[c with c[axis] replaced by idx[c]] (same wrap/NaN rule
    as ``gather``)."""
    ds, js = _shape(data_shape), _shape(idx_shape)
    ax = axis + len(ds) if axis < 0 else axis
    if len(js) != len(ds) or not 0 <= ax < len(ds) or any(j > d for i, (j, d) in enumerate(zip(js, ds)) if i != ax):
        raise RepOpsError(f"gather_elements: indices {js} do not fit data {ds} on axis {axis}")
    dst = c_strides(ds)
    dmap = InputMap(numel(ds), tuple(0 if d == ax else dst[d] for d in range(len(ds))), 0, 0, dst[ax])
    imap = InputMap(numel(js), c_strides(js))
    pro = _load_at_index(ds[ax])
    return KernelDesc(js, 1, (dmap, imap), pro, label="gather_elements")


def scatter_add(idx_numel: int, row_shape: Sequence[int], num_rows: int) -> KernelDesc:
    """Embedding backward: out[v, d] = sum_{p ascending} (idx[p] == v ? g[p, d] : +0).

    Inputs: g of shape (P, *row_shape), idx of P float32 integral values. k = p. The first term is
    the selected value itself; non-matching rows add +0, so an all-miss row is +0.
    """
    rs = _shape(row_shape)
    P = int(idx_numel)
    row = numel(rs)
    out = (int(num_rows),) + rs
    gmap = InputMap(P * row, (0,) + c_strides(rs), row)
    imap = InputMap(P, (0,) * len(out), 1)
    pro = (load(1, 1), Instr(Op.COORD, 2, imm=0), I(Op.EQ, 3, 1, 2), load(4, 0), const(5, 0.0), I(Op.SELECT, 0, 3, 4, 5))
    body = (load(1, 1), I(Op.EQ, 3, 1, 2), load(4, 0), I(Op.SELECT, 6, 3, 4, 5), I(Op.ADD, 0, 0, 6))
    return KernelDesc(out, P, (gmap, imap), pro, body if P > 1 else (), label="scatter_add")


# ======================================================================= compositions


@dataclass(frozen=True)
class Node:
    desc: KernelDesc
    args: tuple[int, ...]  # storage ids: inputs 0..n-1, node i -> n + i


@dataclass(frozen=True)
class Composite:
    """A small DAG of primitive nodes (how a high-level op appears in the training graph)."""

    label: str
    in_shapes: tuple[Shape, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[tuple[int, Shape], ...]  # (storage id, shape) — reshapes are free views

    def run(self, inputs: Sequence[np.ndarray], runner: Runner | None = None) -> list[np.ndarray]:
        if runner is None:
            from verde_chain.repops.reference import run as runner_
            runner = runner_
        if len(inputs) != len(self.in_shapes):
            raise RepOpsError(f"{self.label}: {len(inputs)} inputs given, {len(self.in_shapes)} expected")
        store: list[np.ndarray] = []
        for x, s in zip(inputs, self.in_shapes):
            a = np.asarray(x)
            if a.dtype != np.float32:
                raise RepOpsError(f"{self.label}: inputs must be float32, got {a.dtype}")
            if a.size != numel(s):
                raise RepOpsError(f"{self.label}: input of {a.size} elements, expected shape {s}")
            store.append(np.ascontiguousarray(a).reshape(-1))
        for node in self.nodes:
            store.append(np.ascontiguousarray(runner(node.desc, [store[i] for i in node.args])).reshape(-1))
        return [store[i].reshape(s) for i, s in self.outputs]


class Builder:
    """Builds a Composite; values are ints, reshape is a free view (no node)."""

    def __init__(self, label: str, *in_shapes: Sequence[int]) -> None:
        self.label = label
        self.in_shapes = tuple(_shape(s) for s in in_shapes)
        self.nodes: list[Node] = []
        self.shapes: list[Shape] = list(self.in_shapes)
        self.storage: list[int] = list(range(len(self.in_shapes)))  # value -> storage id

    def inputs(self) -> list[int]:
        return list(range(len(self.in_shapes)))

    def shape(self, v: int) -> Shape:
        return self.shapes[v]

    def node(self, desc: KernelDesc, *args: int) -> int:
        for t, (a, m) in enumerate(zip(args, desc.inputs)):
            if numel(self.shapes[a]) != m.numel:
                raise RepOpsError(f"{self.label}/{desc.label}: arg {t} has {self.shapes[a]}, map wants {m.numel}")
        sid = len(self.in_shapes) + len(self.nodes)
        self.nodes.append(Node(desc, tuple(self.storage[a] for a in args)))
        self.shapes.append(desc.out_shape)
        self.storage.append(sid)
        return len(self.shapes) - 1

    def view(self, v: int, shape: Sequence[int]) -> int:
        s = _shape(shape)
        if numel(s) != numel(self.shapes[v]):
            raise RepOpsError(f"{self.label}: cannot view {self.shapes[v]} as {s}")
        self.shapes.append(s)
        self.storage.append(self.storage[v])
        return len(self.shapes) - 1

    # vocabulary -------------------------------------------------------------------
    def unary(self, name: str, x: int) -> int:
        return self.node(map_unary(name, self.shape(x)), x)

    def binary(self, op: str, x: int, y: int) -> int:
        return self.node(binary(op, self.shape(x), self.shape(y)), x, y)

    def map(self, label: str, code: Sequence[Instr], *xs: int) -> int:
        return self.node(elementwise(label, [self.shape(x) for x in xs], code), *xs)

    def reduce(self, kind: str, x: int, axes: Sequence[int] | None, keepdims: bool = True) -> int:
        shp = self.shape(x)
        ax = _axes(f"reduce_{kind}", axes, len(shp))
        if linear_k_stride(shp, c_strides(shp), ax) is not None:
            return self.node(reduce(kind, shp, ax, keepdims), x)
        # move the reduced axes last (one exact copy node), reduce the trailing block, view back
        kept = [d for d in range(len(shp)) if d not in ax]
        t = self.node(transpose(shp, kept + list(ax)), x)
        r = self.node(reduce(kind, self.shape(t), range(len(kept), len(shp)), False), t)
        return self.view(r, reduced_shape(shp, ax, keepdims))

    def reduce_dot(self, x: int, y: int, axes: Sequence[int] | None, keepdims: bool = True, mean: bool = False) -> int:
        if self.shape(x) != self.shape(y):
            raise RepOpsError(f"reduce_dot: shapes {self.shape(x)} and {self.shape(y)} differ")
        return self.node(reduce_dot(self.shape(x), axes, keepdims, mean), x, y)

    def build(self, *outs: int) -> Composite:
        return Composite(
            self.label, self.in_shapes, tuple(self.nodes), tuple((self.storage[o], self.shapes[o]) for o in outs)
        )


def single(desc: KernelDesc, in_shapes: Sequence[Sequence[int]] | None = None) -> Composite:
    shapes = in_shapes or [(m.numel,) for m in desc.inputs]
    b = Builder(desc.label, *shapes)
    return b.build(b.node(desc, *b.inputs()))


def reduce_composite(kind: str, shape: Sequence[int], axes: Sequence[int] | None, keepdims: bool = True) -> Composite:
    """Any reduction over any axes (transpose node inserted when needed), plus
    log_sum = log(sum(x)) and log_sum_exp = log(sum(exp(x - m))) + m with m = max(x)."""
    b = Builder(f"reduce_{kind}", shape)
    x = 0
    if kind == "log_sum":
        return b.build(b.unary("log", b.reduce("sum", x, axes, keepdims)))
    if kind == "log_sum_exp":
        m = b.reduce("max", x, axes, True)
        s = b.reduce("sum", b.unary("exp", b.binary("sub", x, m)), axes, True)
        y = b.binary("add", b.unary("log", s), m)
        return b.build(b.view(y, reduced_shape(b.shape(x), _axes("reduce", axes, len(b.shape(x))), keepdims)))
    return b.build(b.reduce(kind, x, axes, keepdims))


def _norm_axes(shape: Shape, axis: int | Sequence[int]) -> tuple[int, ...]:
    return _axes("axis", [axis] if isinstance(axis, int) else axis, len(shape))


def softmax(shape: Sequence[int], axis: int | Sequence[int] = -1) -> Composite:
    """m = max; e = exp(x - m) (one node); s = sum(e); y = e / s."""
    b = Builder("softmax", shape)
    (x,) = b.inputs()
    ax = _norm_axes(b.shape(x), axis)
    m = b.reduce("max", x, ax)
    e = b.map("sub_exp", (I(Op.SUB, 0, 0, 1),) + transcendental("exp"), x, m)
    s = b.reduce("sum", e, ax)
    return b.build(b.binary("div", e, s))


def log_softmax(shape: Sequence[int], axis: int | Sequence[int] = -1) -> Composite:
    """m = max; d = x - m; s = sum(exp(d)); y = d - log(s)."""
    b = Builder("log_softmax", shape)
    (x,) = b.inputs()
    ax = _norm_axes(b.shape(x), axis)
    d = b.binary("sub", x, b.reduce("max", x, ax))
    s = b.reduce("sum", b.unary("exp", d), ax)
    return b.build(b.binary("sub", d, b.unary("log", s)))


def softmax_backward(shape: Sequence[int], axis: int | Sequence[int] = -1) -> Composite:
    """inputs (y, g): s = sum(g*y) (dot order), dx = y * (g - s)."""
    b = Builder("softmax_backward", shape, shape)
    y, g = b.inputs()
    s = b.reduce_dot(g, y, _norm_axes(b.shape(y), axis))
    return b.build(b.map("softmax_bwd", (I(Op.SUB, 1, 1, 2), I(Op.MUL, 0, 0, 1)), y, g, s))


def log_softmax_backward(shape: Sequence[int], axis: int | Sequence[int] = -1) -> Composite:
    """inputs (y, g): s = sum(g); dx = g - exp(y) * s."""
    b = Builder("log_softmax_backward", shape, shape)
    y, g = b.inputs()
    s = b.reduce("sum", g, _norm_axes(b.shape(y), axis))
    e = b.unary("exp", y)
    return b.build(b.map("log_softmax_bwd", (I(Op.MUL, 0, 0, 2), I(Op.SUB, 0, 1, 0)), e, g, s))


def layer_norm(
    shape: Sequence[int], axis: int = -1, eps: float = 1e-5, scale: bool = True, bias: bool = True
) -> Composite:
    """inputs (x[, scale][, bias]); outputs (y, mean, inv_std), all statistics keepdims.

    mean = reduce_mean(x); c = x - mean; var = reduce_meansq(c) (MUL/FMA chain, / fl32(K));
    inv_std = 1 / sqrt(var + eps); y = ((c * inv_std) * scale) + bias.
    """
    shp = _shape(shape)
    ax0 = axis + len(shp) if axis < 0 else axis
    nshape = shp[ax0:]
    ins = [shp] + ([nshape] if scale else []) + ([nshape] if bias else [])
    b = Builder("layer_norm", *ins)
    x = 0
    ax = tuple(range(ax0, len(shp)))
    mean = b.reduce("mean", x, ax)
    c = b.binary("sub", x, mean)
    var = b.reduce("meansq", c, ax)
    istd = b.map("inv_std", (const(1, eps), I(Op.ADD, 0, 0, 1), I(Op.SQRT, 0, 0), const(1, 1.0), I(Op.DIV, 0, 1, 0)), var)
    args = [c, istd]
    code = [I(Op.MUL, 0, 0, 1)]
    if scale:
        args.append(1)
        code.append(I(Op.MUL, 0, 0, 2))
    if bias:
        args.append(2 if scale else 1)
        code.append(I(Op.ADD, 0, 0, len(args) - 1))
    y = b.map("ln_affine", code, *args)
    return b.build(y, mean, istd)


def layer_norm_backward(shape: Sequence[int], axis: int = -1) -> Composite:
    """inputs (x, scale, mean, inv_std, g) -> (dx, dscale, dbias).

    xhat = (x - mean) * inv_std; gs = g * scale; a = mean(gs); bb = mean(gs * xhat) (dot order);
    dx = ((gs - a) - xhat * bb) * inv_std; dscale = sum_batch(g * xhat) (dot); dbias = sum_batch(g).
    """
    shp = _shape(shape)
    ax0 = axis + len(shp) if axis < 0 else axis
    nshape = shp[ax0:]
    stat = shp[:ax0] + (1,) * (len(shp) - ax0)
    b = Builder("layer_norm_backward", shp, nshape, stat, stat, shp)
    x, sc, mean, istd, g = b.inputs()
    nax = tuple(range(ax0, len(shp)))
    bax = tuple(range(ax0))
    xhat = b.map("xhat", (I(Op.SUB, 0, 0, 1), I(Op.MUL, 0, 0, 2)), x, mean, istd)
    gs = b.binary("mul", g, sc)
    a = b.reduce("mean", gs, nax)
    bb = b.reduce_dot(gs, xhat, nax, mean=True)
    dx = b.map(
        "ln_dx", (I(Op.SUB, 0, 0, 1), I(Op.MUL, 5, 2, 3), I(Op.SUB, 0, 0, 5), I(Op.MUL, 0, 0, 4)), gs, a, xhat, bb, istd
    )
    if bax:
        dscale = b.view(b.reduce_dot(g, xhat, bax, keepdims=False), nshape)
        dbias = b.view(b.reduce("sum", g, bax, keepdims=False), nshape)
    else:
        dscale = b.binary("mul", g, xhat)
        dbias = b.unary("identity", g)
    return b.build(dx, dscale, dbias)


def gelu(shape: Sequence[int], approximate: str = "none") -> KernelDesc:
    return map_unary("gelu_tanh" if approximate == "tanh" else "gelu_erf", shape)


def _nll_tail(
    b: Builder, lsm: int, lab: int, wts: int | None, ss: Shape, reduction: str, ignore_index: int | None
) -> int:
    """Append the NLL nodes for log-probabilities ``lsm`` (N, C, d..); returns the loss value."""
    if reduction not in ("mean", "sum", "none"):
        raise RepOpsError(f"nll: reduction {reduction!r} not in mean/sum/none")
    C = ss[1]
    lshape = (ss[0],) + ss[2:]
    weights = wts is not None
    inner = c_strides(ss)
    rest = numel(ss[2:])
    # nll[n, d] = -lsm[n, label[n,d], d] : data map strides (N: C*rest, d..: inner) ; idx stride rest
    dmap = InputMap(numel(ss), (inner[0],) + inner[2:], 0, 0, rest)
    lmap = InputMap(numel(lshape), c_strides(lshape))
    maps = [dmap, lmap]
    code: list[Instr] = [load(1, 1)]
    if ignore_index is not None:
        code += [const(7, float(ignore_index)), I(Op.EQ, 7, 1, 7)]  # r7 = ignored?
    code += [Instr(Op.LOADIDX, 0, 1, 0, 0), I(Op.NEG, 0, 0)]
    if weights:
        maps.append(InputMap(C, (0,) * len(lshape), 0, 0, 1))
        code += [Instr(Op.LOADIDX, 2, 1, 0, 2), I(Op.MUL, 0, 0, 2)]
    if ignore_index is not None:
        code += [const(6, 0.0), I(Op.SELECT, 0, 7, 6, 0)]
    nll_desc = KernelDesc(lshape, 1, tuple(maps), tuple(code), label="nll")
    nll = b.node(nll_desc, *([lsm, lab] + ([wts] if wts is not None else [])))
    if reduction == "none":
        return nll
    if reduction == "sum":
        return b.reduce("sum", nll, None, keepdims=False)
    if not weights and ignore_index is None:
        return b.reduce("mean", nll, None, keepdims=False)
    # w[n, d] = W[label] (or 1), +0 where ignored; inputs (labels[, W]) -> r0 = label[, r1 = W]
    lmap0 = InputMap(numel(lshape), c_strides(lshape))
    wmaps: tuple[InputMap, ...]
    if weights:
        wmaps = (lmap0, InputMap(C, (0,) * len(lshape), 0, 0, 1))
        wcode: list[Instr] = [load(0, 0), Instr(Op.LOADIDX, 1, 0, 0, 1)]
    else:
        wmaps = (lmap0,)
        wcode = [load(0, 0), const(1, 1.0)]
    if ignore_index is not None:
        wcode += [const(7, float(ignore_index)), I(Op.EQ, 7, 0, 7), const(6, 0.0), I(Op.SELECT, 1, 7, 6, 1)]
    wcode.append(I(Op.MOV, 0, 1))
    wdesc = KernelDesc(lshape, 1, wmaps, tuple(wcode), label="ce_weight")
    w = b.node(wdesc, lab, wts) if wts is not None else b.node(wdesc, lab)
    num = b.reduce("sum", nll, None, keepdims=False)
    den = b.reduce("sum", w, None, keepdims=False)
    return b.binary("div", num, den)


def nll_loss(
    logp_shape: Sequence[int], reduction: str = "mean", weights: bool = False, ignore_index: int | None = None
) -> Composite:
    """ONNX NegativeLogLikelihoodLoss. inputs (log_prob (N,C,d..), labels (N,d..) as float32
    integral values[, weights (C,)]) -> loss. The nodes are those of ``softmax_cross_entropy``
    after its log_softmax."""
    ss = _shape(logp_shape)
    if len(ss) < 2:
        raise RepOpsError(f"nll_loss: log-probabilities must be (N, C, ...), got {ss}")
    lshape = (ss[0],) + ss[2:]
    b = Builder("nll_loss", ss, lshape, *([(ss[1],)] if weights else []))
    return b.build(_nll_tail(b, 0, 1, 2 if weights else None, ss, reduction, ignore_index))


def softmax_cross_entropy(
    scores_shape: Sequence[int],
    reduction: str = "mean",
    weights: bool = False,
    ignore_index: int | None = None,
) -> Composite:
    """ONNX SoftmaxCrossEntropyLoss. inputs (scores (N,C,d..), labels (N,d..) as float32
    integral values[, weights (C,)]); outputs (loss, log_prob).

    lsm = log_softmax over axis 1; nll = -lsm[n, label, d..] (LOADIDX); with weights w = W[label]
    (LOADIDX), nll *= w; ignored labels give nll = +0 and w = +0. mean = sum(nll) / sum(w), or
    reduce_mean(nll) when neither weights nor ignore_index are given.
    """
    ss = _shape(scores_shape)
    if len(ss) < 2:
        raise RepOpsError(f"softmax_cross_entropy: scores must be (N, C, ...), got {ss}")
    if reduction not in ("mean", "sum", "none"):
        raise RepOpsError(f"softmax_cross_entropy: reduction {reduction!r} not in mean/sum/none")
    C = ss[1]
    lshape = (ss[0],) + ss[2:]
    ins = [ss, lshape] + ([(C,)] if weights else [])
    b = Builder("softmax_cross_entropy", *ins)
    x, lab = 0, 1
    ls = log_softmax(ss, 1)
    # inline the log_softmax nodes
    vals = [x]
    for node in ls.nodes:
        vals.append(b.node(node.desc, *[vals[i] for i in node.args]))
    lsm = vals[ls.outputs[0][0]]
    loss = _nll_tail(b, lsm, lab, 2 if weights else None, ss, reduction, ignore_index)
    return b.build(loss, lsm)


def softmax_cross_entropy_backward(scores_shape: Sequence[int], reduction: str = "mean") -> Composite:
    """inputs (scores, labels, g (scalar, or per-sample for 'none')) -> dscores.

    p = softmax(scores) (composition above); dx = (p - onehot) * g [/ fl32(N*d..) for mean],
    onehot = EQ(label, COORD(axis 1)).
    """
    ss = _shape(scores_shape)
    lshape = (ss[0],) + ss[2:]
    gshape = lshape if reduction == "none" else ()
    b = Builder("softmax_cross_entropy_backward", ss, lshape, gshape)
    x, lab, g = b.inputs()
    sm = softmax(ss, 1)
    vals = [x]
    for node in sm.nodes:
        vals.append(b.node(node.desc, *[vals[i] for i in node.args]))
    p = vals[sm.outputs[0][0]]
    code = [Instr(Op.COORD, 3, imm=1), I(Op.EQ, 4, 1, 3), I(Op.SUB, 0, 0, 4), I(Op.MUL, 0, 0, 2)]
    if reduction == "mean":
        code += [const(5, float(numel(lshape))), I(Op.DIV, 0, 0, 5)]
    lab_map = InputMap(numel(lshape), (c_strides(lshape)[0], 0) + c_strides(lshape)[1:])
    g_map = InputMap(1, (0,) * len(ss)) if reduction != "none" else lab_map
    desc = KernelDesc(
        ss, 1, (InputMap(numel(ss), c_strides(ss)), lab_map, g_map), (load(0, 0), load(1, 1), load(2, 2), *code), label="ce_bwd"
    )
    return b.build(b.node(desc, p, lab, g))


# ----------------------------------------------------------------------- optimizers


def sgd(
    shape: Sequence[int],
    lr: float,
    momentum: float = 0.0,
    dampening: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    first_step: bool = False,
) -> Composite:
    """torch.optim.SGD step. inputs (p, g, buf) -> (p_new, buf_new). All hyper-parameters are
    rounded to binary32 first; (1 - dampening) is computed exactly and rounded once.

    g' = g + wd*p (ADD(g, MUL(wd, p)), when wd != 0)
    buf' = g' on the first step, else ADD(MUL(momentum, buf), MUL(1-dampening, g'))
    d = nesterov ? ADD(g', MUL(momentum, buf')) : buf'      (d = g' when momentum == 0)
    p' = SUB(p, MUL(lr, d))
    """
    shp = _shape(shape)
    b = Builder("sgd", shp, shp, shp)
    p, g, buf = b.inputs()
    greg: list[Instr] = []  # r1 = g' (inputs: r0 = p, r1 = g)
    if weight_decay != 0.0:
        greg = [const(8, weight_decay), I(Op.MUL, 8, 8, 0), I(Op.ADD, 1, 1, 8)]
    if momentum == 0.0:
        new_buf = b.unary("identity", buf)
        pcode = greg + [const(9, lr), I(Op.MUL, 9, 9, 1), I(Op.SUB, 0, 0, 9)]
        return b.build(b.map("sgd_param", pcode, p, g), new_buf)
    one_m_d = f32_of_fraction(1 - f32q(dampening))
    if first_step:
        bcode = greg + [I(Op.MOV, 0, 1)]
    else:
        bcode = greg + [const(8, momentum), I(Op.MUL, 8, 8, 2), *(
            [const(9, one_m_d), I(Op.MUL, 1, 9, 1)] if dampening != 0.0 else []
        ), I(Op.ADD, 0, 8, 1)]
    nb = b.map("sgd_buf", bcode, p, g, buf)
    if nesterov:
        pcode = greg + [const(8, momentum), I(Op.MUL, 8, 8, 2), I(Op.ADD, 1, 1, 8), const(9, lr), I(Op.MUL, 9, 9, 1), I(Op.SUB, 0, 0, 9)]
    else:
        pcode = [const(9, lr), I(Op.MUL, 9, 9, 2), I(Op.SUB, 0, 0, 9)]
    return b.build(b.map("sgd_param", pcode, p, g, nb), nb)


@dataclass(frozen=True)
class AdamConstants:
    """Per-step constants, computed exactly from binary32 hyper-parameters, rounded once."""

    one_minus_b1: float  # fl32(1 - b1)
    one_minus_b2: float  # fl32(1 - b2)
    step_size: float  # fl32(lr / (1 - b1**t))
    bc2_sqrt: float  # fl32(sqrt(1 - b2**t))
    decay: float  # fl32(1 - lr*wd) (AdamW)


def adam_constants(lr: float, b1: float, b2: float, wd: float, t: int) -> AdamConstants:
    if t < 1:
        raise RepOpsError(f"adam: step t={t} must be >= 1")
    L, B1, B2, W = f32q(lr), f32q(b1), f32q(b2), f32q(wd)
    return AdamConstants(
        one_minus_b1=f32_of_fraction(1 - B1),
        one_minus_b2=f32_of_fraction(1 - B2),
        step_size=f32_of_fraction(L / (1 - B1**t)),
        bc2_sqrt=f32_of_sqrt_fraction(1 - B2**t),
        decay=f32_of_fraction(1 - L * W) if wd else 1.0,
    )


def adam(
    shape: Sequence[int],
    lr: float,
    t: int,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    decoupled: bool = False,
) -> Composite:
    """torch Adam (decoupled=False, wd as L2) / AdamW (decoupled=True) at step t >= 1.

    inputs (p, g, m, v) -> (p_new, m_new, v_new), one node per output:
      g' = ADD(g, MUL(wd, p)) (Adam with wd only)
      m' = ADD(MUL(b1, m), MUL(1-b1, g'));  v' = ADD(MUL(b2, v), MUL(MUL(1-b2, g'), g'))
      denom = ADD(DIV(SQRT(v'), bc2_sqrt), eps);  p1 = decoupled ? MUL(p, 1 - lr*wd) : p
      p' = SUB(p1, MUL(step_size, DIV(m', denom)))
    """
    k = adam_constants(lr, betas[0], betas[1], weight_decay if decoupled else 0.0, t)
    shp = _shape(shape)
    b = Builder("adamw" if decoupled else "adam", shp, shp, shp, shp)
    p, g, m, v = b.inputs()
    greg: list[Instr] = []  # inputs r0 = p, r1 = g, r2 = m or v
    if weight_decay != 0.0 and not decoupled:
        greg = [const(8, weight_decay), I(Op.MUL, 8, 8, 0), I(Op.ADD, 1, 1, 8)]
    mcode = greg + [const(8, betas[0]), I(Op.MUL, 8, 8, 2), const(9, k.one_minus_b1), I(Op.MUL, 9, 9, 1), I(Op.ADD, 0, 8, 9)]
    vcode = greg + [
        const(8, betas[1]), I(Op.MUL, 8, 8, 2), const(9, k.one_minus_b2), I(Op.MUL, 9, 9, 1), I(Op.MUL, 9, 9, 1), I(Op.ADD, 0, 8, 9)
    ]
    mn = b.map("adam_m", mcode, p, g, m)
    vn = b.map("adam_v", vcode, p, g, v)
    pcode: list[Instr] = [  # r0 = p, r1 = m', r2 = v'
        I(Op.SQRT, 3, 2), const(4, k.bc2_sqrt), I(Op.DIV, 3, 3, 4), const(4, eps), I(Op.ADD, 3, 3, 4),
        I(Op.DIV, 3, 1, 3), const(4, k.step_size), I(Op.MUL, 3, 4, 3),
    ]
    if decoupled and weight_decay != 0.0:
        pcode += [const(4, k.decay), I(Op.MUL, 0, 0, 4)]
    pcode += [I(Op.SUB, 0, 0, 3)]
    pn = b.map("adam_param", pcode, p, mn, vn)
    return b.build(pn, mn, vn)


def onnx_momentum(shape: Sequence[int], r: float, t: int, alpha: float, beta: float, norm_coefficient: float, mode: str) -> Composite:
    """ONNX ai.onnx.preview.training Momentum with R, T baked in. inputs (x, g, v) -> (x', v').

    gr = ADD(MUL(norm, x), g); v' = ADD(MUL(alpha, v), MUL(beta_t, gr)) with beta_t = beta if t > 0
    else 1; standard: x' = SUB(x, MUL(r, v')); nesterov: x' = SUB(x, MUL(r, ADD(gr, MUL(alpha, v')))).
    """
    shp = _shape(shape)
    b = Builder("momentum", shp, shp, shp)
    x, g, v = b.inputs()
    greg = [const(8, norm_coefficient), I(Op.MUL, 8, 8, 0), I(Op.ADD, 1, 8, 1)]  # r1 = gr
    bt = beta if t > 0 else 1.0
    vn = b.map("momentum_v", greg + [const(8, alpha), I(Op.MUL, 8, 8, 2), const(9, bt), I(Op.MUL, 9, 9, 1), I(Op.ADD, 0, 8, 9)], x, g, v)
    if mode == "standard":
        xcode = [const(9, r), I(Op.MUL, 9, 9, 2), I(Op.SUB, 0, 0, 9)]
    elif mode == "nesterov":
        xcode = greg + [const(8, alpha), I(Op.MUL, 8, 8, 2), I(Op.ADD, 8, 1, 8), const(9, r), I(Op.MUL, 9, 9, 8), I(Op.SUB, 0, 0, 9)]
    else:
        raise RepOpsError(f"momentum: mode {mode!r} not in standard/nesterov")
    return b.build(b.map("momentum_x", xcode, x, g, vn), vn)


def onnx_adam(
    shape: Sequence[int], r: float, t: int, alpha: float, beta: float, epsilon: float, norm_coefficient: float, norm_coefficient_post: float
) -> Composite:
    """ONNX ai.onnx.preview.training Adam with R, T baked in. inputs (x, g, v, h) -> (x', v', h').

    gr = ADD(MUL(norm, x), g); v' = ADD(MUL(alpha, v), MUL(1-alpha, gr));
    h' = ADD(MUL(beta, h), MUL(1-beta, MUL(gr, gr))); r_adj = fl32(r*sqrt(1-beta^t)/(1-alpha^t))
    (exact, rounded once; r if t == 0); x' = MUL(1-norm_post, SUB(x, MUL(r_adj, DIV(v', ADD(SQRT(h'), eps))))).
    """
    R, A, Bt = f32q(r), f32q(alpha), f32q(beta)
    if t > 0:
        # exact: r * sqrt(1-b^t) / (1-a^t) = sqrt(r^2 (1-b^t) / (1-a^t)^2) for r >= 0
        val = R * R * (1 - Bt**t) / (1 - A**t) ** 2
        r_adj = math.copysign(f32_of_sqrt_fraction(val), float(R)) if R != 0 else 0.0
    else:
        r_adj = float(R)
    shp = _shape(shape)
    b = Builder("onnx_adam", shp, shp, shp, shp)
    x, g, v, h = b.inputs()
    greg = [const(8, norm_coefficient), I(Op.MUL, 8, 8, 0), I(Op.ADD, 1, 8, 1)]
    vn = b.map("adam_v", greg + [const(8, alpha), I(Op.MUL, 8, 8, 2), const(9, f32_of_fraction(1 - A) if A != 1 else 0.0), I(Op.MUL, 9, 9, 1), I(Op.ADD, 0, 8, 9)], x, g, v)
    hn = b.map("adam_h", greg + [const(8, beta), I(Op.MUL, 8, 8, 2), I(Op.MUL, 10, 1, 1), const(9, f32_of_fraction(1 - Bt) if Bt != 1 else 0.0), I(Op.MUL, 9, 9, 10), I(Op.ADD, 0, 8, 9)], x, g, h)
    xcode = [
        I(Op.SQRT, 3, 2), const(4, epsilon), I(Op.ADD, 3, 3, 4), I(Op.DIV, 3, 1, 3), const(4, r_adj), I(Op.MUL, 3, 4, 3), I(Op.SUB, 0, 0, 3),
    ]
    if norm_coefficient_post != 0.0:
        xcode += [const(4, f32_of_fraction(1 - f32q(norm_coefficient_post))), I(Op.MUL, 0, 4, 0)]
    return b.build(b.map("adam_x", xcode, x, vn, hn), vn, hn)


# ----------------------------------------------------------------------- backward of linear ops


def sum_to_shape(b: Builder, g: int, shape: Sequence[int]) -> int:
    """Gradient of a numpy broadcast: reduce_sum over the broadcast axes of g, viewed as shape."""
    target = _shape(shape)
    gs = b.shape(g)
    if gs == target:
        return g
    lead = len(gs) - len(target)
    axes = [d for d in range(len(gs)) if d < lead or (target[d - lead] == 1 and gs[d] != 1)]
    if not axes:
        return b.view(g, target)
    return b.view(b.reduce("sum", g, axes, keepdims=False), target)


def binary_backward(op: str, a_shape: Sequence[int], b_shape: Sequence[int]) -> Composite:
    """inputs (a, b, g) -> (da, db) for add/sub/mul/div with broadcasting.

    add: (g, g); sub: (g, NEG g); mul: (MUL(g, b), MUL(g, a));
    div: (DIV(g, b), NEG(DIV(MUL(g, DIV(a, b)), b))) — then summed to each input's shape.
    """
    sa, sb = _shape(a_shape), _shape(b_shape)
    out = broadcast_shapes(op, sa, sb)
    b = Builder(f"{op}_backward", sa, sb, out)
    x, y, g = b.inputs()
    if op == "add":
        da, db = g, g
    elif op == "sub":
        da, db = g, b.unary("neg", g)
    elif op == "mul":
        da, db = b.binary("mul", g, y), b.binary("mul", g, x)
    elif op == "div":
        da = b.binary("div", g, y)
        db = b.map("div_grad_b", (I(Op.DIV, 3, 0, 1), I(Op.MUL, 3, 2, 3), I(Op.DIV, 3, 3, 1), I(Op.NEG, 0, 3)), x, y, g)
    else:
        raise RepOpsError(f"binary_backward: {op!r} not in add/sub/mul/div")
    ra, rb = sum_to_shape(b, da, sa), sum_to_shape(b, db, sb)
    if ra == g:
        ra = b.unary("identity", g)
    if rb == g:
        rb = b.unary("identity", g)
    return b.build(ra, rb)


def matmul_backward(a_shape: Sequence[int], b_shape: Sequence[int], trans_a: bool = False, trans_b: bool = False) -> Composite:
    """inputs (a, b, g) -> (da, db) for y = op(a) @ op(b), each gradient ONE matmul node.

    Supported: 2-D a and b; or batched a (..., M, K) with 2-D b (a Linear layer: the batch is
    folded into M by a free view, so db's chain runs over all batch rows in C order); or a and
    b with identical batch dims. Formulas: d op(a) = g @ op(b)^T, d op(b) = op(a)^T @ g, with
    the transposes expressed as matmul trans flags on the stored tensors.
    """
    sa, sb = _shape(a_shape), _shape(b_shape)
    if len(sa) < 2 or len(sb) < 2:
        raise RepOpsError("matmul_backward: operands must be at least 2-D")
    fold = len(sb) == 2 and len(sa) > 2
    if not fold and sa[:-2] != sb[:-2]:
        raise RepOpsError(f"matmul_backward: batch dims {sa[:-2]} vs {sb[:-2]} unsupported (fold or equal only)")
    y_shape = matmul(sa, sb, trans_a, trans_b).out_shape
    bld = Builder("matmul_backward", sa, sb, y_shape)
    a, bb, g = bld.inputs()
    if fold:
        if trans_a:
            raise RepOpsError("matmul_backward: trans_a with folded batch dims is unsupported")
        a = bld.view(a, (numel(sa[:-1]), sa[-1]))
        g = bld.view(g, (numel(y_shape[:-1]), y_shape[-1]))
    ash, bsh, gsh = bld.shape(a), bld.shape(bb), bld.shape(g)
    if not trans_a:
        da = bld.node(matmul(gsh, bsh, False, not trans_b), g, bb)
    else:
        da = bld.node(matmul(bsh, gsh, trans_b, True), bb, g)
    if not trans_b:
        db = bld.node(matmul(ash, gsh, not trans_a, False), a, g)
    else:
        db = bld.node(matmul(gsh, ash, True, trans_a), g, a)
    return bld.build(bld.view(da, sa), db)
