"""Normalisation IR ops: ``softmax`` / ``log_softmax`` (one axis), ``layer_norm`` (scale and
bias), ``rms_norm`` (scale; made by ``graph/fusion.py`` from the exported pattern) and
``batch_norm`` (training or inference mode), each lowered to the operator library's composition
and differentiated by its backward composition; and ``dropout`` (its mask carried in the batch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from verde_chain.graph.builder import GraphBuilder, Ref
from verde_chain.graph.errors import UnsupportedModelError
from verde_chain.graph.ir import OpNode, Value
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


# ----------------------------------------------------------------------- batch norm, dropout


@onnx_op("BatchNormalization")
def _import_batch_norm(imp: Importer, node: onnx.NodeProto) -> None:
    """Training mode (opset 14+ ``training_mode=1``, as torch exports a model in train()): the
    batch statistics, and the running mean and variance become carried state that this node
    updates each step; otherwise the running statistics normalise. Either way the running
    statistics are state, never trained."""
    a = imp.check_attrs(node, {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 0, "spatial": 1})
    if len(node.input) != 5:
        raise UnsupportedModelError(imp.who(node), f"{len(node.input)} inputs", "X, scale, B, mean, var")
    training = bool(a["training_mode"])
    if any(imp.is_read(extra) for extra in node.output[1:]):
        raise UnsupportedModelError(imp.who(node), "the running statistics outputs are read", "output Y only")
    x, scale, bias = (imp.float_input(n, node) for n in node.input[:3])
    mean, var = (imp.state_value(n, node) for n in node.input[3:5])
    shape = imp.shape(x)
    if len(shape) < 2 or any(imp.shape(v) != (shape[1],) for v in (scale, bias, mean, var)):
        raise UnsupportedModelError(imp.who(node), f"input {shape} with statistics of {imp.shape(scale)}")
    imp.emit(node, "batch_norm", [x, scale, bias, mean, var], shape, eps=float(a["epsilon"]),
             momentum=float(a["momentum"]), training=training)


@onnx_op("Dropout")
def _import_dropout(imp: Importer, node: onnx.NodeProto) -> None:
    """Training mode (``training_mode`` a constant true) with ratio > 0: ``dropout`` with a
    mask value (role ``mask``) that the batch of each step carries (graph/training.py);
    otherwise the identity."""
    a = imp.check_attrs(node, {"seed": 0})
    del a
    if any(imp.is_read(extra) for extra in node.output[1:]):
        raise UnsupportedModelError(imp.who(node), "the mask output is read", "Dropout's output only")
    x = imp.float_input(node.input[0], node)
    ratio, training = 0.5, False
    if len(node.input) > 1 and node.input[1]:
        if not imp.is_static(node.input[1]):
            raise UnsupportedModelError(imp.who(node), "a ratio that is not a constant")
        ratio = float(np.asarray(imp.static[node.input[1]]).reshape(()))
    if len(node.input) > 2 and node.input[2]:
        if not imp.is_static(node.input[2]):
            raise UnsupportedModelError(imp.who(node), "a training_mode that is not a constant")
        training = bool(np.asarray(imp.static[node.input[2]]).reshape(()))
    if not 0.0 <= ratio < 1.0:
        raise UnsupportedModelError(imp.who(node), f"ratio {ratio}", "0 <= ratio < 1")
    if not training or ratio == 0.0:
        imp.emit(node, "reshape", [x], imp.shape(x), shape=imp.shape(x))
        return
    mask = imp.model.add_value(Value(f"{node.output[0]}:mask", imp.shape(x), "mask")).name
    imp.emit(node, "dropout", [x, mask], imp.shape(x), ratio=ratio)


def bn_tail(op: OpNode) -> library.BnTail:
    """The per-element tail fused into a ``batch_norm`` op by ``graph/fusion.py``
    (``fuse_batch_norm``): attrs ``residual`` (the side of the Add it took, the residual its
    last input) and ``act`` (``relu``, or ``clip`` with ``lo`` / ``hi``); none when unfused."""
    act = op.attrs.get("act")
    code = () if act is None else library.unary_code("relu") if act == "relu" else \
        library.clip_code(op.attrs["lo"], op.attrs["hi"])
    return library.BnTail(op.attrs.get("residual"), code, act or "")


@lowering("batch_norm")
def _fw_batch_norm(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    x, rmean, rvar = ins[0], ins[3], ins[4]
    eps = op.attrs["eps"]
    if op.attrs["training"]:
        comp = library.batch_norm_training(x.shape, eps, op.attrs["momentum"], bn_tail(op))
        y, mean, istd, rmean2, rvar2 = b.composite(comp, *ins, label="batch_norm")
        for state, new in ((rmean, rmean2), (rvar, rvar2)):
            if state.kind == "state":
                b.update_state(state, new)
        return Saved(y, {"mean": mean, "istd": istd})
    y, istd = b.composite(library.batch_norm_inference(x.shape, eps, bn_tail(op)), *ins, label="batch_norm")
    return Saved(y, {"mean": rmean, "istd": istd})


@vjp("batch_norm")
def _bw_batch_norm(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    x, scale = ins[0], ins[1]
    act = op.attrs.get("act")
    if act is not None:
        # The activation's gradient from its OUTPUT: 0 < relu(y) exactly where 0 < y, and
        # lo < clip(y) < hi exactly where lo < y < hi (a clipped or NaN y fails both), so this
        # is the gradient the unfused graph computed from y, bit for bit, without y as an output.
        grad = library.unary_grad("relu_grad", g.shape) if act == "relu" else \
            library.clip_grad(g.shape, op.attrs["lo"], op.attrs["hi"])
        g = b.node(grad, s.out, g, label=f"{act}_grad")
    comp = library.batch_norm_backward(x.shape, op.attrs["training"])
    want = [i for i in range(3) if need[i]]
    res = b.composite(comp, x, scale, s.extra["mean"], s.extra["istd"], g, want=want, label="batch_norm_bwd")
    out: Grads = [None] * len(ins)
    for i, r in zip(want, res):
        out[i] = r
    if len(ins) > 5 and need[5]:
        out[5] = g  # the residual's gradient: Add passes g through
    return out


@lowering("dropout")
def _fw_dropout(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    return Saved(b.node(library.dropout_apply(ins[0].shape, op.attrs["ratio"]), *ins, label="dropout"))


@vjp("dropout")
def _bw_dropout(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    return [b.node(library.dropout_apply(g.shape, op.attrs["ratio"]), g, ins[1], label="dropout_bwd"), None]
