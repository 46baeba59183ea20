"""The ``reduce`` IR op: ReduceSum / ReduceMean / ReduceMax over any axes (sum and mean are
differentiable)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from verde_chain.graph.builder import GraphBuilder, Ref
from verde_chain.graph.errors import NotDifferentiableError
from verde_chain.graph.ir import OpNode
from verde_chain.graph.operators.registry import Grads, Saved, lowering, onnx_op, vjp
from verde_chain.repops import library
from verde_chain.repops.isa import Op
from verde_chain.repops.library import I, const

if TYPE_CHECKING:
    import onnx

    from verde_chain.graph.onnx_import import Importer

REDUCE = {"ReduceSum": "sum", "ReduceMean": "mean", "ReduceMax": "max"}


@onnx_op(*REDUCE)
def _import_reduce(imp: Importer, node: onnx.NodeProto) -> None:
    axes_as_input = imp.opset >= 18 or node.op_type == "ReduceSum"
    allowed: dict[str, Any] = {"keepdims": 1, "noop_with_empty_axes": 0}
    if not axes_as_input:
        allowed["axes"] = None
    a = imp.check_attrs(node, allowed)
    x = imp.float_input(node.input[0], node)
    shape = imp.shape(x)
    if axes_as_input:
        axes = imp.ints(node.input[1], node, "axes") if len(node.input) > 1 and node.input[1] else None
    else:
        axes = a["axes"]
    if not axes:
        if a["noop_with_empty_axes"]:
            imp.emit(node, "reshape", [x], shape, shape=shape)
            return
        axes = list(range(len(shape)))
    axes = sorted({ax % len(shape) for ax in axes})
    keep = bool(a["keepdims"])
    out = tuple(1 if d in axes else n for d, n in enumerate(shape)) if keep else tuple(
        n for d, n in enumerate(shape) if d not in axes
    )
    imp.emit(node, "reduce", [x], out, kind=REDUCE[node.op_type], axes=tuple(axes), keepdims=keep)


@lowering("reduce")
def _fw_reduce(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    a = op.attrs
    return Saved(b.reduce(a["kind"], ins[0], a["axes"], a["keepdims"]))


@vjp("reduce")
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
