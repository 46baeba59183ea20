"""Data movement IR ops: ``transpose`` (a strided copy) and ``reshape`` (a free view: no node).

ONNX Reshape, Flatten, Squeeze, Unsqueeze, Identity and Cast (float to float) all become
``reshape``; applied to static (constant) tensors they are evaluated at import instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import onnx

from verde_chain.graph.builder import GraphBuilder, Ref
from verde_chain.graph.errors import UnsupportedModelError
from verde_chain.graph.ir import OpNode
from verde_chain.graph.operators.registry import Grads, Saved, lowering, onnx_op, vjp
from verde_chain.repops import library

if TYPE_CHECKING:
    from verde_chain.graph.onnx_import import Importer


# ----------------------------------------------------------------------- ONNX


@onnx_op("Identity")
def _import_identity(imp: Importer, node: onnx.NodeProto) -> None:
    src = node.input[0]
    if imp.is_static(src):
        imp.static[node.output[0]] = imp.static[src]
        return
    x = imp.value(src, node)
    imp.emit(node, "reshape", [x], imp.shape(x), shape=imp.shape(x))


@onnx_op("Cast")
def _import_cast(imp: Importer, node: onnx.NodeProto) -> None:
    to = imp.attrs(node).get("to")
    src = node.input[0]
    if not isinstance(to, int):
        raise UnsupportedModelError(imp.who(node), "Cast without a 'to' attribute")
    if imp.is_static(src):
        np_type = onnx.helper.tensor_dtype_to_np_dtype(to)
        imp.static[node.output[0]] = imp.static[src].astype(np_type)
        return
    v = imp.model.values.get(src)
    if to == onnx.TensorProto.FLOAT and v is not None and not imp.model.integer_inputs.get(src):
        imp.emit(node, "reshape", [src], v.shape, shape=v.shape)
        return
    raise UnsupportedModelError(imp.who(node), f"Cast to {to} of a computed tensor", "Cast to float of float tensors")


@onnx_op("Transpose")
def _import_transpose(imp: Importer, node: onnx.NodeProto) -> None:
    a = imp.check_attrs(node, {"perm": None})
    src = node.input[0]
    if imp.is_static(src):
        imp.static[node.output[0]] = np.transpose(imp.static[src], a["perm"])
        return
    x = imp.value(src, node)
    shape = imp.shape(x)
    perm = list(a["perm"]) if a["perm"] is not None else list(reversed(range(len(shape))))
    if sorted(perm) != list(range(len(shape))):
        raise UnsupportedModelError(imp.who(node), f"perm {perm} for rank {len(shape)}")
    imp.emit(node, "transpose", [x], tuple(shape[p] for p in perm), perm=tuple(perm))


def _reshape_to(imp: Importer, node: onnx.NodeProto, src: str, new: list[int]) -> None:
    if imp.is_static(src):
        imp.static[node.output[0]] = imp.static[src].reshape(new)
        return
    x = imp.value(src, node)
    imp.emit(node, "reshape", [x], tuple(new), shape=tuple(new))


@onnx_op("Reshape")
def _import_reshape(imp: Importer, node: onnx.NodeProto) -> None:
    a = imp.check_attrs(node, {"allowzero": 0})
    src = node.input[0]
    shape = imp.shape(src) if not imp.is_static(src) else tuple(imp.static[src].shape)
    req = imp.ints(node.input[1], node, "shape")
    new = [shape[i] if (d == 0 and not a["allowzero"]) else d for i, d in enumerate(req)]
    if new.count(-1) > 1:
        raise UnsupportedModelError(imp.who(node), f"shape {req} has several -1")
    if -1 in new:
        rest = math.prod(d for d in new if d != -1)
        new[new.index(-1)] = math.prod(shape) // max(rest, 1)
    if math.prod(new) != math.prod(shape):
        raise UnsupportedModelError(imp.who(node), f"cannot reshape {shape} to {req}")
    _reshape_to(imp, node, src, new)


@onnx_op("Flatten")
def _import_flatten(imp: Importer, node: onnx.NodeProto) -> None:
    a = imp.check_attrs(node, {"axis": 1})
    shape = imp.shape(node.input[0])
    ax = a["axis"] % (len(shape) + 1) if a["axis"] < 0 else a["axis"]
    _reshape_to(imp, node, node.input[0], [math.prod(shape[:ax]), math.prod(shape[ax:])])


def _axes_arg(imp: Importer, node: onnx.NodeProto) -> list[int] | None:
    if imp.opset >= 13:
        return imp.ints(node.input[1], node, "axes") if len(node.input) > 1 and node.input[1] else None
    return imp.attrs(node).get("axes")


@onnx_op("Squeeze")
def _import_squeeze(imp: Importer, node: onnx.NodeProto) -> None:
    shape = imp.shape(node.input[0])
    axes = _axes_arg(imp, node)
    ax = {a % len(shape) for a in axes} if axes else {d for d, n in enumerate(shape) if n == 1}
    if any(shape[a] != 1 for a in ax):
        raise UnsupportedModelError(imp.who(node), f"squeeze of non-unit axes {sorted(ax)} of {shape}")
    _reshape_to(imp, node, node.input[0], [n for d, n in enumerate(shape) if d not in ax])


@onnx_op("Unsqueeze")
def _import_unsqueeze(imp: Importer, node: onnx.NodeProto) -> None:
    shape = list(imp.shape(node.input[0]))
    axes = _axes_arg(imp, node) or []
    rank = len(shape) + len(axes)
    for a in sorted(x % rank for x in axes):
        shape.insert(a, 1)
    _reshape_to(imp, node, node.input[0], shape)


# ----------------------------------------------------------------------- forward and backward


@lowering("transpose")
def _fw_transpose(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    return Saved(b.node(library.transpose(ins[0].shape, op.attrs["perm"]), ins[0], label="transpose"))


@vjp("transpose")
def _bw_transpose(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    perm = [p % len(ins[0].shape) for p in op.attrs["perm"]]
    inv = [perm.index(i) for i in range(len(perm))]
    return [b.node(library.transpose(g.shape, inv), g, label="transpose")]


@lowering("reshape")
def _fw_reshape(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    return Saved(b.view(ins[0], op.attrs["shape"]))


@vjp("reshape")
def _bw_reshape(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    return [b.view(g, ins[0].shape)]
