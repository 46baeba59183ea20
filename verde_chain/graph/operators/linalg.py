"""Matrix products: ``matmul`` (numpy semantics, rank >= 2) and ``gemm`` (ONNX Gemm, one node
with alpha, beta and the bias in the epilogue)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from verde_chain.graph.builder import GraphBuilder, Ref
from verde_chain.graph.errors import UnsupportedModelError
from verde_chain.graph.ir import OpNode
from verde_chain.graph.operators.registry import Grads, Saved, lowering, onnx_op, vjp
from verde_chain.repops import library
from verde_chain.repops.isa import Op
from verde_chain.repops.library import I, const

if TYPE_CHECKING:
    import onnx

    from verde_chain.graph.onnx_import import Importer


# ----------------------------------------------------------------------- ONNX


@onnx_op("Gemm")
def _import_gemm(imp: Importer, node: onnx.NodeProto) -> None:
    a = imp.check_attrs(node, {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0})
    A = imp.float_input(node.input[0], node)
    B = imp.float_input(node.input[1], node)
    sa, sb = imp.shape(A), imp.shape(B)
    if len(sa) != 2 or len(sb) != 2:
        raise UnsupportedModelError(imp.who(node), f"Gemm of {sa} x {sb}", "2-D A and B")
    M, K = (sa[1], sa[0]) if a["transA"] else sa
    K2, N = (sb[1], sb[0]) if a["transB"] else sb
    if K != K2:
        raise UnsupportedModelError(imp.who(node), f"Gemm inner dimensions differ: {sa} x {sb}")
    ins = [A, B]
    if len(node.input) > 2 and node.input[2]:
        C = imp.float_input(node.input[2], node)
        imp.broadcast(imp.shape(C), (M, N), node)
        ins.append(C)
    imp.emit(
        node, "gemm", ins, (M, N),
        alpha=float(a["alpha"]), beta=float(a["beta"]), trans_a=bool(a["transA"]), trans_b=bool(a["transB"]),
    )


@onnx_op("MatMul")
def _import_matmul(imp: Importer, node: onnx.NodeProto) -> None:
    A = imp.float_input(node.input[0], node)
    B = imp.float_input(node.input[1], node)
    a, b = imp.shape(A), imp.shape(B)
    if len(a) < 2 or len(b) < 2:
        raise UnsupportedModelError(imp.who(node), f"MatMul of rank {len(a)} x {len(b)}", "rank >= 2 operands")
    if a[-1] != b[-2]:
        raise UnsupportedModelError(imp.who(node), f"MatMul inner dimensions differ: {a} x {b}")
    imp.emit(node, "matmul", [A, B], imp.broadcast(a[:-2], b[:-2], node) + (a[-2], b[-1]),
             trans_a=False, trans_b=False)


# ----------------------------------------------------------------------- forward


def _mm(b: GraphBuilder, x: Ref, y: Ref, ta: bool = False, tb: bool = False) -> Ref:
    return b.node(library.matmul(x.shape, y.shape, ta, tb), x, y, label="matmul")


@lowering("matmul")
def _fw_matmul(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    x, w = ins
    if len(x.shape) < 2 or len(w.shape) < 2:
        raise UnsupportedModelError(op.name, f"MatMul of rank {len(x.shape)} x {len(w.shape)}", "rank >= 2 operands")
    return Saved(_mm(b, x, w, op.attrs["trans_a"], op.attrs["trans_b"]))


@lowering("gemm")
def _fw_gemm(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    a = op.attrs
    c_shape = ins[2].shape if len(ins) > 2 else None
    desc = library.gemm(ins[0].shape, ins[1].shape, c_shape, a["alpha"], a["beta"], a["trans_a"], a["trans_b"])
    args = ins if (len(ins) > 2 and a["beta"] != 0.0) else ins[:2]
    return Saved(b.node(desc, *args, label="gemm"))


# ----------------------------------------------------------------------- backward


@vjp("matmul")
def _bw_matmul(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    """y = op(x) @ op(w), op a transpose where the trans flag is set (graph/fusion.py's
    fold_transposes): each gradient is one matmul written in its operand's stored layout, so a
    transposed operand needs no transpose node (d(w^T) = (x^T g)^T = g^T x)."""
    x, w = ins
    ta, tb = op.attrs["trans_a"], op.attrs["trans_b"]
    plan_x, plan_w = library.matmul_grads(ta, tb)
    out: Grads = [None, None]
    if need[0]:
        out[0] = b.unbroadcast(_grad_mm(b, plan_x, {"a": x, "b": w, "g": g}), x.shape)
    if need[1]:
        if len(w.shape) == 2 and len(x.shape) > 2:
            # batched activations times one matrix: one matmul over the flattened rows (fusion
            # never sets trans_a here: a transposed x has no such flat view)
            if ta:
                raise UnsupportedModelError(op.name, "a transposed batched A times a 2-D B")
            k, n = x.shape[-1], g.shape[-1]
            flat = {"a": b.view(x, (x.numel // k, k)), "b": w, "g": b.view(g, (g.numel // n, n))}
            out[1] = _grad_mm(b, plan_w, flat)
        else:
            out[1] = b.unbroadcast(_grad_mm(b, plan_w, {"a": x, "b": w, "g": g}), w.shape)
    return out


def _grad_mm(b: GraphBuilder, plan: library.GradMatmul, env: dict[str, Ref]) -> Ref:
    left, right, tl, tr = plan
    return _mm(b, env[left], env[right], tl, tr)


def _scale(b: GraphBuilder, g: Ref, c: float) -> Ref:
    if c == 1.0:
        return g
    return b.map("scale", [const(1, c), I(Op.MUL, 0, 0, 1)], g)


@vjp("gemm")
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
