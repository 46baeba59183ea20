"""Backward compositions of the linear primitives: broadcasting binaries and matmul.

(The backward of a nonlinear operator lives next to its forward: ``maps.GRAD_CODE`` for unary
maps, ``nn.py`` for the normalisations, ``losses.py`` for the losses.)
"""

from __future__ import annotations

from collections.abc import Sequence

from verde_chain.errors import RepOpsError
from verde_chain.repops.isa import Op
from verde_chain.repops.library.asm import I
from verde_chain.repops.library.composite import Builder, Composite
from verde_chain.repops.library.linalg import matmul, matmul_grads
from verde_chain.repops.library.shapes import as_shape, broadcast_axes, broadcast_shapes, numel


def sum_to_shape(b: Builder, g: int, shape: Sequence[int]) -> int:
    """Gradient of a numpy broadcast: reduce_sum over the broadcast axes of g, viewed as shape."""
    target = as_shape(shape)
    gs = b.shape(g)
    if gs == target:
        return g
    axes = broadcast_axes(gs, target)
    if not axes:
        return b.view(g, target)
    return b.view(b.reduce("sum", g, axes, keepdims=False), target)


def binary_backward(op: str, a_shape: Sequence[int], b_shape: Sequence[int]) -> Composite:
    """inputs (a, b, g) -> (da, db) for add/sub/mul/div with broadcasting.

    add: (g, g); sub: (g, NEG g); mul: (MUL(g, b), MUL(g, a));
    div: (DIV(g, b), NEG(DIV(MUL(g, DIV(a, b)), b))) — then summed to each input's shape.
    """
    sa, sb = as_shape(a_shape), as_shape(b_shape)
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
        div_grad_b = (  # r0 = a, r1 = b, r2 = g; r3 = the first register above them
            I(Op.DIV, 3, 0, 1),  # a / b
            I(Op.MUL, 3, 2, 3),  # g * (a / b)
            I(Op.DIV, 3, 3, 1),
            I(Op.NEG, 0, 3),
        )
        db = b.map("div_grad_b", div_grad_b, x, y, g)
    else:
        raise RepOpsError(f"binary_backward: {op!r} not in add/sub/mul/div")
    ra, rb = sum_to_shape(b, da, sa), sum_to_shape(b, db, sb)
    if ra == g:
        ra = b.unary("identity", g)
    if rb == g:
        rb = b.unary("identity", g)
    return b.build(ra, rb)


def matmul_backward(
    a_shape: Sequence[int], b_shape: Sequence[int], trans_a: bool = False, trans_b: bool = False
) -> Composite:
    """inputs (a, b, g) -> (da, db) for y = op(a) @ op(b), each gradient ONE matmul node.

    Supported: 2-D a and b; or batched a (..., M, K) with 2-D b (a Linear layer: the batch is
    folded into M by a free view, so db's chain runs over all batch rows in C order); or a and
    b with identical batch dims. Formulas: d op(a) = g @ op(b)^T, d op(b) = op(a)^T @ g, with
    the transposes expressed as matmul trans flags on the stored tensors.
    """
    sa, sb = as_shape(a_shape), as_shape(b_shape)
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
    env = {"a": a, "b": bb, "g": g}
    da, db = (bld.node(matmul(bld.shape(env[x]), bld.shape(env[y]), tx, ty), env[x], env[y])
              for x, y, tx, ty in matmul_grads(trans_a, trans_b))
    return bld.build(bld.view(da, sa), db)
