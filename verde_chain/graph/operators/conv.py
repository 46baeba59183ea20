"""Convolution and pooling IR ops: ``conv`` (N-D, strides, pads, dilations, groups, bias),
``max_pool`` and ``avg_pool`` (kernel, strides, pads, dilations, ceil_mode; count_include_pad).
GlobalAveragePool is a ``reduce`` mean over the spatial axes.

Forward and backward are the windowed kernels of ``repops/library/conv.py`` (docs/repops-spec.md
§4, "Convolution" and "Pooling"); ONNX ``auto_pad`` is turned into explicit pads at import
(``ConvGeometry.from_onnx``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from verde_chain.errors import RepOpsError
from verde_chain.graph.builder import GraphBuilder, Ref
from verde_chain.graph.errors import UnsupportedModelError
from verde_chain.graph.ir import OpNode
from verde_chain.graph.operators.registry import Grads, Saved, lowering, onnx_op, vjp
from verde_chain.repops import library
from verde_chain.repops.library import ConvGeometry

if TYPE_CHECKING:
    import onnx

    from verde_chain.graph.onnx_import import Importer


def _geometry(op: OpNode, x_shape: Sequence[int]) -> ConvGeometry:
    a = op.attrs
    return ConvGeometry.make(x_shape, a["kernel"], a["strides"], a["dilations"], a["pads"], a.get("ceil_mode", False))


def _window_attrs(imp: Importer, node: onnx.NodeProto, x: str, kernel: Sequence[int],
                  a: dict[str, Any]) -> tuple[ConvGeometry, dict[str, Any]]:
    """The node's geometry (auto_pad resolved) and the IR op's window attributes."""
    try:
        geo = ConvGeometry.from_onnx(imp.shape(x), kernel, a)
    except RepOpsError as exc:  # a window that does not fit, a bad attribute
        raise UnsupportedModelError(imp.who(node), str(exc)) from exc
    attrs = {"kernel": geo.kernel, "strides": geo.strides, "dilations": geo.dilations, "pads": geo.pads,
             "ceil_mode": geo.ceil_mode}
    return geo, attrs


# ----------------------------------------------------------------------- ONNX


@onnx_op("Conv")
def _import_conv(imp: Importer, node: onnx.NodeProto) -> None:
    a = imp.check_attrs(node, {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None,
                               "pads": None, "strides": None})
    x = imp.float_input(node.input[0], node)
    w = imp.float_input(node.input[1], node)
    ins = [x, w]
    if len(node.input) > 2 and node.input[2]:
        ins.append(imp.float_input(node.input[2], node))
    ws = imp.shape(w)
    if a["kernel_shape"] is not None and tuple(a["kernel_shape"]) != ws[2:]:
        raise UnsupportedModelError(imp.who(node), f"kernel_shape {a['kernel_shape']} vs weight {ws}")
    geo, attrs = _window_attrs(imp, node, x, ws[2:], a)
    del attrs["ceil_mode"]
    groups = int(a["group"])
    try:
        library.convolution(geo, ws, groups, len(ins) == 3)
    except RepOpsError as exc:
        raise UnsupportedModelError(imp.who(node), str(exc)) from exc
    if len(ins) == 3 and imp.shape(ins[2]) != (ws[0],):
        raise UnsupportedModelError(imp.who(node), f"bias {imp.shape(ins[2])} for {ws[0]} output channels")
    out = (imp.shape(x)[0], ws[0], *geo.out_spatial)
    imp.emit(node, "conv", ins, out, groups=groups, **attrs)


@onnx_op("MaxPool", "AveragePool")
def _import_pool(imp: Importer, node: onnx.NodeProto) -> None:
    allowed: dict[str, Any] = {"auto_pad": "NOTSET", "ceil_mode": 0, "dilations": None, "kernel_shape": None,
                               "pads": None, "strides": None}
    if node.op_type == "MaxPool":
        allowed["storage_order"] = 0
    else:
        allowed["count_include_pad"] = 0
    a = imp.check_attrs(node, allowed)
    if any(imp.is_read(extra) for extra in node.output[1:]):
        raise UnsupportedModelError(imp.who(node), "the Indices output is read", "MaxPool's values only")
    x = imp.float_input(node.input[0], node)
    geo, attrs = _window_attrs(imp, node, x, a["kernel_shape"], a)
    out = imp.shape(x)[:2] + geo.out_spatial
    if node.op_type == "MaxPool":
        imp.emit(node, "max_pool", [x], out, **attrs)
    else:
        imp.emit(node, "avg_pool", [x], out, count_include_pad=bool(a["count_include_pad"]), **attrs)


@onnx_op("GlobalAveragePool")
def _import_global_avg_pool(imp: Importer, node: onnx.NodeProto) -> None:
    imp.check_attrs(node, {})
    x = imp.float_input(node.input[0], node)
    shape = imp.shape(x)
    if len(shape) < 3:
        raise UnsupportedModelError(imp.who(node), f"input {shape}", "(N, C, spatial...)")
    axes = tuple(range(2, len(shape)))
    imp.emit(node, "reduce", [x], shape[:2] + (1,) * len(axes), kind="mean", axes=axes, keepdims=True)


# ----------------------------------------------------------------------- forward


@lowering("conv")
def _fw_conv(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    geo = _geometry(op, ins[0].shape)
    desc = library.convolution(geo, ins[1].shape, op.attrs["groups"], len(ins) == 3)
    y = b.node(desc, *ins, label="conv")
    return Saved(b.view(y, (ins[0].shape[0], ins[1].shape[0], *geo.out_spatial)))


@lowering("max_pool")
def _fw_max_pool(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    return Saved(b.node(library.max_pool(_geometry(op, ins[0].shape)), ins[0], label="max_pool"))


@lowering("avg_pool")
def _fw_avg_pool(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    desc = library.avg_pool(_geometry(op, ins[0].shape), op.attrs["count_include_pad"])
    return Saved(b.node(desc, ins[0], label="avg_pool"))


# ----------------------------------------------------------------------- backward


@vjp("conv")
def _bw_conv(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    x, w = ins[0], ins[1]
    geo = _geometry(op, x.shape)
    groups = op.attrs["groups"]
    out: Grads = [None] * len(ins)
    if need[0]:
        dx = b.node(library.conv_grad_input(geo, w.shape, groups), g, w, label="conv_grad_input")
        out[0] = b.view(dx, x.shape)
    if need[1]:
        dw = b.node(library.conv_grad_weight(geo, w.shape, groups), g, x, label="conv_grad_weight")
        out[1] = b.view(dw, w.shape)
    if len(ins) == 3 and need[2]:
        out[2] = b.node(library.channel_sum(g.shape), g, label="conv_grad_bias")
    return out


@vjp("max_pool")
def _bw_max_pool(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    geo = _geometry(op, ins[0].shape)
    arg = b.node(library.max_pool_argmax(geo), ins[0], label="max_pool_argmax")
    return [b.node(library.max_pool_backward(geo), arg, g, label="max_pool_bwd")]


@vjp("avg_pool")
def _bw_avg_pool(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    geo = _geometry(op, ins[0].shape)
    gd = b.node(library.avg_pool_grad_scale(geo, op.attrs["count_include_pad"]), g, label="avg_pool_grad_scale")
    return [b.node(library.window_sum_backward(geo), gd, label="avg_pool_bwd")]

