"""Parametrised activations: ``clip`` (Clip, ReLU6), and ``activation`` (HardSigmoid,
HardSwish, Softplus), each a map program of the operator library with its gradient map."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from verde_chain.graph.builder import GraphBuilder, Ref
from verde_chain.graph.errors import UnsupportedModelError
from verde_chain.graph.ir import OpNode
from verde_chain.graph.operators.registry import Grads, Saved, lowering, onnx_op, vjp
from verde_chain.repops import library

if TYPE_CHECKING:
    import onnx

    from verde_chain.graph.onnx_import import Importer

ACTIVATIONS = ("hard_sigmoid", "hard_swish", "softplus")


# ----------------------------------------------------------------------- ONNX


@onnx_op("Clip")
def _import_clip(imp: Importer, node: onnx.NodeProto) -> None:
    """Clip (opset 11+): min and max are optional inputs, and must be constants."""
    imp.check_attrs(node, {})
    x = imp.float_input(node.input[0], node)
    bounds: list[float | None] = []
    for i in (1, 2):
        name = node.input[i] if len(node.input) > i else ""
        if not name:
            bounds.append(None)
            continue
        if not imp.is_static(name) or imp.static[name].size != 1:
            raise UnsupportedModelError(imp.who(node), f"bound {name!r} is not a constant scalar")
        bounds.append(float(np.asarray(imp.static[name], dtype=np.float32).reshape(())))
    imp.emit(node, "clip", [x], imp.shape(x), lo=bounds[0], hi=bounds[1])


@onnx_op("HardSigmoid", "HardSwish", "Softplus")
def _import_activation(imp: Importer, node: onnx.NodeProto) -> None:
    if node.op_type == "HardSigmoid":
        a = imp.check_attrs(node, {"alpha": 0.2, "beta": 0.5})
        alpha, beta = float(a["alpha"]), float(a["beta"])
    else:
        imp.check_attrs(node, {})
        alpha, beta = 1 / 6, 0.5
    fn = {"HardSigmoid": "hard_sigmoid", "HardSwish": "hard_swish", "Softplus": "softplus"}[node.op_type]
    x = imp.float_input(node.input[0], node)
    imp.emit(node, "activation", [x], imp.shape(x), fn=fn, alpha=alpha, beta=beta)


# ----------------------------------------------------------------------- forward


@lowering("clip")
def _fw_clip(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    return Saved(b.node(library.clip(ins[0].shape, op.attrs["lo"], op.attrs["hi"]), ins[0], label="clip"))


@lowering("activation")
def _fw_activation(b: GraphBuilder, op: OpNode, ins: list[Ref]) -> Saved:
    fn, x = op.attrs["fn"], ins[0]
    if fn == "hard_sigmoid":
        return Saved(b.node(library.hard_sigmoid(x.shape, op.attrs["alpha"], op.attrs["beta"]), x, label=fn))
    if fn == "hard_swish":
        return Saved(b.node(library.hard_swish(x.shape), x, label=fn))
    if fn == "softplus":
        t = b.unary("exp", x)
        lg = b.node(library.log1p_exp_log(x.shape), t, label="softplus/log_1p")
        return Saved(b.node(library.softplus_tail(x.shape), x, t, lg, label=fn))
    raise UnsupportedModelError(op.name, f"activation {fn!r}", ACTIVATIONS)


# ----------------------------------------------------------------------- backward


@vjp("clip")
def _bw_clip(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    return [b.node(library.clip_grad(ins[0].shape, op.attrs["lo"], op.attrs["hi"]), ins[0], g, label="clip_grad")]


@vjp("activation")
def _bw_activation(b: GraphBuilder, op: OpNode, ins: list[Ref], s: Saved, g: Ref, need: Sequence[bool]) -> Grads:
    fn, x = op.attrs["fn"], ins[0]
    if fn == "hard_sigmoid":
        desc = library.hard_sigmoid_grad(x.shape, op.attrs["alpha"], op.attrs["beta"])
    elif fn == "hard_swish":
        desc = library.hard_swish_grad(x.shape)
    else:
        desc = library.sigmoid_times(x.shape)
    return [b.node(desc, x, g, label=f"{fn}_grad")]
