"""Normalisation IR ops: ``softmax`` / ``log_softmax`` (one axis), ``layer_norm`` (scale and
bias) and ``rms_norm`` (scale; made by ``graph/fusion.py`` from the exported pattern), each lowered to the operator library's composition and differentiated by its backward
composition."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from verde_chain.graph.builder import GraphBuilder, Ref
from verde_chain.graph.errors import UnsupportedModelError
from verde_chain.graph.ir import OpNode
from verde_chain.graph.operators.registry import Grads, Saved, lowering, onnx_op, vjp
from verde_chain.repops import library

if TYPE_CHECKING:
    import onnx

    from verde_chain.graph.onnx_import import Importer


# ----------------------------------------------------------------------- ONNX


@onnx_op("Softmax", "LogSoftmax")
def _import_softmax(imp: Importer, node: onnx.NodeProto) -> None:
    a = imp.check_attrs(node, {"axis": -1})
    x = imp.float_input(node.input[0], node)
    shape = imp.shape(x)
    axis = a["axis"] % len(shape)
    imp.emit(node, "softmax" if node.op_type == "Softmax" else "log_softmax", [x], shape, axis=axis)


@onnx_op("LayerNormalization")
def _import_layer_norm(imp: Importer, node: onnx.NodeProto) -> None:
    a = imp.check_attrs(node, {"axis": -1, "epsilon": 1e-5, "stash_type": 1})
    if a["stash_type"] != 1:
        raise UnsupportedModelError(imp.who(node), f"stash_type={a['stash_type']}", "stash_type=1 (float32)")
    if len(node.input) < 3 or not node.input[2]:
        raise UnsupportedModelError(imp.who(node), "LayerNormalization without bias", "scale and bias")
    for extra in node.output[1:]:
        if extra and any(extra in n.input for n in imp.proto.graph.node):
            raise UnsupportedModelError(imp.who(node), "Mean/InvStdDev outputs are consumed", "output Y only")
    x, s, b = (imp.float_input(n, node) for n in node.input[:3])
    shape = imp.shape(x)
    axis = a["axis"] % len(shape)
    if imp.shape(s) != shape[axis:] or imp.shape(b) != shape[axis:]:
        raise UnsupportedModelError(imp.who(node), f"scale/bias shapes {imp.shape(s)}, {imp.shape(b)} vs {shape[axis:]}")
    imp.emit(node, "layer_norm", [x, s, b], shape, axis=axis, eps=float(a["epsilon"]))


# ----------------------------------------------------------------------- forward


@lowering("softmax", "log_softmax")
def _fw_softmax(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    comp = (library.softmax if op.op == "softmax" else library.log_softmax)(ins[0].shape, op.attrs["axis"])
    return Saved(b.composite(comp, ins[0], label=op.op)[0])


@lowering("layer_norm")
def _fw_layer_norm(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    if len(ins) != 3:
        raise UnsupportedModelError(op.name, "LayerNormalization without scale and bias", "scale and bias inputs")
    comp = library.layer_norm(ins[0].shape, op.attrs["axis"], op.attrs["eps"], scale=True, bias=True)
    y, mean, istd = b.composite(comp, *ins, label="layer_norm")
    return Saved(y, {"mean": mean, "istd": istd})


@lowering("rms_norm")
def _fw_rms_norm(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    comp = library.rms_norm(ins[0].shape, op.attrs["axis"], op.attrs["eps"], scale=True)
    y, inv = b.composite(comp, *ins, label="rms_norm")
    return Saved(y, {"inv": inv})


# ----------------------------------------------------------------------- backward


@vjp("softmax", "log_softmax")
def _bw_softmax(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    maker = library.softmax_backward if op.op == "softmax" else library.log_softmax_backward
    return [b.composite(maker(s.out.shape, op.attrs["axis"]), s.out, g, label=f"{op.op}_bwd")[0]]


@vjp("layer_norm")
def _bw_layer_norm(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    x, scale, _bias = ins
    comp = library.layer_norm_backward(x.shape, op.attrs["axis"])
    want = [i for i in range(3) if need[i]]
    res = b.composite(comp, x, scale, s.extra["mean"], s.extra["istd"], g, want=want, label="layer_norm_bwd")
    out: Grads = [None, None, None]
    for i, r in zip(want, res):
        out[i] = r
    return out


@vjp("rms_norm")
def _bw_rms_norm(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    x, scale = ins
    comp = library.rms_norm_backward(x.shape, op.attrs["axis"])
    want = [i for i in range(2) if need[i]]
    res = b.composite(comp, x, scale, s.extra["inv"], g, want=want, label="rms_norm_bwd")
    out: Grads = [None, None]
    for i, r in zip(want, res):
        out[i] = r
    return out
