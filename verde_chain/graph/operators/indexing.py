"""The ``gather`` IR op: an embedding lookup (Gather on axis 0 with indices from the batch);
its gradient is a scatter-add into the table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from verde_chain.graph.builder import GraphBuilder, Ref
from verde_chain.graph.errors import NotDifferentiableError, UnsupportedModelError
from verde_chain.graph.ir import OpNode
from verde_chain.graph.operators.registry import Grads, Saved, lowering, onnx_op, vjp
from verde_chain.repops import library

if TYPE_CHECKING:
    import onnx

    from verde_chain.graph.onnx_import import Importer


@onnx_op("Gather")
def _import_gather(imp: Importer, node: onnx.NodeProto) -> None:
    a = imp.check_attrs(node, {"axis": 0})
    data, idx = node.input[0], node.input[1]
    if imp.is_static(data) and imp.is_static(idx):
        imp.static[node.output[0]] = np.take(imp.static[data], imp.static[idx], axis=a["axis"])
        return
    iv = imp.model.values.get(idx)
    if a["axis"] != 0 or iv is None or iv.role != "input" or not imp.model.integer_inputs.get(idx):
        raise UnsupportedModelError(
            imp.who(node), "Gather other than an embedding lookup", "axis 0, indices = an integer graph input"
        )
    d = imp.float_input(data, node)
    imp.emit(node, "gather", [d, idx], iv.shape + imp.shape(d)[1:])


@lowering("gather")
def _fw_gather(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    data, idx = ins
    return Saved(b.node(library.gather(data.shape, idx.shape, 0), data, idx, label="gather"))


@vjp("gather")
def _bw_gather(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    data, idx = ins
    if need[1]:
        raise NotDifferentiableError(f"{op.name}: no gradient flows into Gather indices")
    row = data.shape[1:]
    desc = library.scatter_add(idx.numel, row, data.shape[0])
    return [b.node(desc, b.view(g, (g.numel,)), b.view(idx, (idx.numel,)), label="scatter_add"), None]
