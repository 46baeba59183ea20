"""Static folding: ONNX nodes whose inputs are all known at import are evaluated there, so
everything that depends only on constants and shapes (attention masks, position ids, rotary
tables, shape arithmetic) never reaches the training graph.

Exact operations (integer and shape arithmetic, comparisons, data movement, casts, and the
binary32 operations IEEE rounds correctly) run in ``onnx.reference`` (numpy). Float operations
that numpy computes through the platform's libm (Cos, Sin, Exp, Log, Tanh, Erf, Sigmoid, Pow)
run the RepOps program of the same operator instead, so a folded constant has the same bits on
every machine (a folded scalar becomes a CONST immediate of the graph, which the graph root
commits).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from verde_chain.repops import reference
from verde_chain.repops.library import binary, map_unary

# ONNX float op -> the RepOps map that folds it (inputs float32, numpy broadcasting)
REPOPS_UNARY = {"Cos": "cos", "Sin": "sin", "Exp": "exp", "Log": "log", "Tanh": "tanh", "Erf": "erf",
                "Sigmoid": "sigmoid"}
# shapes are static: these fold whatever their input holds
SHAPE_OPS = ("Shape", "Size")


def _repops(node: onnx.NodeProto, ins: list[Any]) -> list[Any] | None:
    """The RepOps evaluation of a float transcendental node, or None if numpy is exact for it."""
    if node.op_type in REPOPS_UNARY and ins[0].dtype == np.float32:
        x = np.ascontiguousarray(ins[0], dtype=np.float32)
        desc = map_unary(REPOPS_UNARY[node.op_type], x.shape)
        return [reference.run(desc, [x.reshape(-1)]).reshape(x.shape)]
    if node.op_type == "Pow" and ins[0].dtype == np.float32:
        x, y = np.ascontiguousarray(ins[0]), np.ascontiguousarray(ins[1]).astype(np.float32)
        desc = binary("pow", x.shape, y.shape)
        return [reference.run(desc, [x.reshape(-1), y.reshape(-1)]).reshape(desc.out_shape)]
    return None


def fold(node: onnx.NodeProto, ins: list[Any], opset: int) -> list[Any]:
    """Evaluate ``node`` on constant inputs (arrays, or lists of arrays for sequences); '' marks
    an omitted optional input."""
    got = _repops(node, ins)
    if got is not None:
        return got
    names = [f"in{i}" if name else "" for i, name in enumerate(node.input)]
    local = onnx.NodeProto()
    local.CopyFrom(node)
    del local.input[:]
    local.input.extend(names)
    feeds = {n: v for n, v in zip(names, ins) if n}
    return list(ReferenceEvaluator(local, opsets={"": opset}).run(None, feeds))
