"""Matrix products: numpy ``matmul`` and ONNX ``Gemm``, each ONE kernel whose reduction is the dot
chain ``acc = a_0*b_0``, then ``acc = FMA(a_k, b_k, acc)`` for k ascending.

Transposes never move data: ``trans_a``/``trans_b`` swap the strides the input maps read with.
Registers: r1 = a_k, r2 = b_k, r0 = the accumulator; Gemm's epilogue uses r1/r2 again once the
chain is done.
"""

from __future__ import annotations

from collections.abc import Sequence

from verde_chain.errors import RepOpsError
from verde_chain.repops.isa import Instr, Op
from verde_chain.repops.library.asm import I, const, load
from verde_chain.repops.library.shapes import Shape, as_shape, broadcast_map, broadcast_shapes, c_strides, numel
from verde_chain.repops.program import InputMap, KernelDesc


def _matrix_view(shape: Shape, strides: Shape, transposed: bool) -> tuple[int, int, int, int]:
    """(rows, cols, row stride, col stride) of the last two axes read as a matrix, or as its
    transpose (the same elements with the two axes' roles swapped)."""
    r, c = (-1, -2) if transposed else (-2, -1)
    return shape[r], shape[c], strides[r], strides[c]


def _matmul_maps(
    a_shape: Shape, b_shape: Shape, trans_a: bool, trans_b: bool
) -> tuple[Shape, int, InputMap, InputMap, bool, bool]:
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


def matmul(a_shape: Sequence[int], b_shape: Sequence[int], trans_a: bool = False, trans_b: bool = False) -> KernelDesc:
    """numpy-style (batched, broadcast) matmul; acc = a0*b0, then acc = FMA(a_k, b_k, acc)."""
    out, K, amap, bmap, av, bv = _matmul_maps(as_shape(a_shape), as_shape(b_shape), trans_a, trans_b)
    out, (amap, bmap) = _squeeze_vec(out, av, bv, [amap, bmap])
    pro = (load(1, 0), load(2, 1), I(Op.MUL, 0, 1, 2))
    body = (load(1, 0), load(2, 1), I(Op.FMA, 0, 1, 2, 0))
    return KernelDesc(out, K, (amap, bmap), pro, body if K > 1 else (), label="matmul")


GradMatmul = tuple[str, str, bool, bool]  # (left, right, trans_left, trans_right) over "a", "b", "g"


def matmul_grads(trans_a: bool, trans_b: bool) -> tuple[GradMatmul, GradMatmul]:
    """Each gradient of y = op(a) @ op(b) (op: a transpose where the flag is set) as ONE matmul
    of the stored tensors, (da, db): d op(a) = g op(b)^T and d op(b) = op(a)^T g; a transposed
    operand's gradient is their transpose, written straight in its stored layout, e.g.
    d(b^T) = g^T op(a). Swapping the factors of a product changes no bit (MUL and FMA commute),
    so each chain equals the one over the untransposed operand."""
    da = ("g", "b", False, not trans_b) if not trans_a else ("b", "g", trans_b, True)
    db = ("a", "g", not trans_a, False) if not trans_b else ("g", "a", True, trans_a)
    return da, db


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
    a, b = as_shape(a_shape), as_shape(b_shape)
    if len(a) != 2 or len(b) != 2:
        raise RepOpsError(f"gemm: A and B must be 2-D, got {a} and {b}")
    mm = matmul(a, b, trans_a, trans_b)
    epi: list[Instr] = []
    if alpha != 1.0:
        epi += [const(1, alpha), I(Op.MUL, 0, 0, 1)]  # r0 = dot * alpha
    inputs = list(mm.inputs)
    if c_shape is not None and beta != 0.0:
        inputs.append(broadcast_map(as_shape(c_shape), mm.out_shape))
        epi += addend_epilogue(2, beta)
    return KernelDesc(mm.out_shape, mm.K, tuple(inputs), mm.prologue, mm.body, tuple(epi), label="gemm")


def addend_epilogue(slot: int, beta: float = 1.0) -> tuple[Instr, ...]:
    """Gemm's ``+ C*beta`` (C read from input ``slot``): ``r1 = C``, ``r1 = r1 * beta`` (if != 1),
    ``r0 = r0 + r1``. It reads no register but r0 before writing it, so it can follow any dot
    chain's epilogue (graph/peephole.py appends it to a matmul whose output an ADD read)."""
    epi: list[Instr] = [load(1, slot)]  # r1 = C
    if beta != 1.0:
        epi += [const(2, beta), I(Op.MUL, 1, 1, 2)]  # r1 = C * beta
    return (*epi, I(Op.ADD, 0, 0, 1))
