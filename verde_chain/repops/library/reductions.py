"""Reduction kernels: one output element from K inputs, combined in the ONE fixed order.

k runs 0 .. K-1 in row-major order of the reduced axes: the prologue handles k = 0 (so the
accumulator starts from the first term itself, not from a +0 that would change -0 results), the
body k = 1 .. K-1 ascending, the epilogue finishes (mean's division, l2's square root). The
reduced axes must be linear in memory here; ``Builder.reduce`` (composite.py) inserts a
transpose node first when they are not.

Registers: r0 is the accumulator, r1 (and r2 for dot products) the term loaded at k.
"""

from __future__ import annotations

from collections.abc import Sequence

from verde_chain.errors import RepOpsError
from verde_chain.repops.isa import Instr, Op
from verde_chain.repops.library.asm import I, const, load
from verde_chain.repops.library.shapes import (
    Shape,
    as_shape,
    c_strides,
    linear_k_stride,
    normalize_axes,
    numel,
    reduced_shape,
)
from verde_chain.repops.program import InputMap, KernelDesc

REDUCE_KINDS = ("sum", "mean", "max", "min", "prod", "sumsq", "l1", "l2", "meansq")
Program = tuple[Instr, ...]


def _reduce_code(kind: str, K: int) -> tuple[Program, Program, Program]:
    chain = {"sum": Op.ADD, "mean": Op.ADD, "max": Op.MAX, "min": Op.MIN, "prod": Op.MUL}
    if kind in chain:
        pro: Program = (load(0, 0),)
        body: Program = (load(1, 0), I(chain[kind], 0, 0, 1))
    elif kind in ("sumsq", "l2", "meansq"):  # dot-product order: MUL first, FMA after
        pro = (load(1, 0), I(Op.MUL, 0, 1, 1))
        body = (load(1, 0), I(Op.FMA, 0, 1, 1, 0))
    elif kind == "l1":
        pro = (load(0, 0), I(Op.ABS, 0, 0))
        body = (load(1, 0), I(Op.ABS, 1, 1), I(Op.ADD, 0, 0, 1))
    else:
        raise RepOpsError(f"reduce: unknown kind {kind!r}; supported: {REDUCE_KINDS}")
    epi: Program = ()
    if kind in ("mean", "meansq"):
        epi = (const(1, float(K)), I(Op.DIV, 0, 0, 1))
    elif kind == "l2":
        epi = (I(Op.SQRT, 0, 0),)
    return pro, body, epi


def _reduced_map(
    op: str, shape: Sequence[int], axes: Sequence[int] | None, keepdims: bool
) -> tuple[Shape, int, InputMap]:
    """(output shape, K, the input map) of a reduction of a C-contiguous tensor over ``axes``."""
    shp = as_shape(shape)
    ax = normalize_axes(op, axes, len(shp))
    st = c_strides(shp)
    ks = linear_k_stride(shp, st, ax)
    if ks is None:
        raise RepOpsError(f"{op}: axes {ax} of {shp} are not contiguous in memory")
    if keepdims:
        ostr = tuple(0 if d in ax else st[d] for d in range(len(shp)))
    else:
        ostr = tuple(st[d] for d in range(len(shp)) if d not in ax)
    K = numel([shp[a] for a in ax])
    return reduced_shape(shp, ax, keepdims), K, InputMap(numel(shp), ostr, ks)


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
    out, K, m = _reduced_map(f"reduce_{kind}", shape, axes, keepdims)
    pro, body, epi = _reduce_code(kind, K)
    return KernelDesc(out, K, (m,), pro, body if K > 1 else (), epi, label=f"reduce_{kind}")


def reduce_dot(
    shape: Sequence[int], axes: Sequence[int] | None = None, keepdims: bool = True, mean: bool = False
) -> KernelDesc:
    """sum over axes of a*b (same-shape contiguous a, b): MUL at k=0, FMA chain after."""
    out, K, m = _reduced_map("reduce_dot", shape, axes, keepdims)
    pro = (load(1, 0), load(2, 1), I(Op.MUL, 0, 1, 2))
    body = (load(1, 0), load(2, 1), I(Op.FMA, 0, 1, 2, 0))
    epi = (const(1, float(K)), I(Op.DIV, 0, 0, 1)) if mean else ()
    return KernelDesc(out, K, (m, m), pro, body if K > 1 else (), epi, label="reduce_dot")
