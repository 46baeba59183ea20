"""IR rewrites applied after import: recognise op patterns that RepOps has one program for.

``fuse_gelu``: torch exports ``nn.GELU()`` at opsets < 20 as ``x * (1 + erf(x / sqrt 2)) * 0.5``
(Div, Erf, Add, Mul, Mul). When the four intermediates have no other use, the five ops become one
``unary gelu_erf`` (the ``gelu_erf`` program; its gradient ``gelu_erf_grad``): 1 node instead of
5 forward and ~8 backward, and one rounding chain instead of five. The rewrite changes the
computation (not bit-equal to the decomposition), so it is part of the import and of the graph
root; pass ``fuse=False`` to ``import_onnx`` to keep the decomposition.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from verde_chain.graph.ir import Model, OpNode

SQRT2_F32 = float(np.float32(math.sqrt(2.0)))
INV_SQRT2_F32 = float(np.float32(1.0 / math.sqrt(2.0)))


def _is_scalar(op: OpNode | None, kind: str, value: float, reverse: bool | None = None) -> bool:
    return (
        op is not None
        and op.op == "scalar"
        and op.attrs["op"] == kind
        and float(np.float32(op.attrs["value"])) == value
        and (reverse is None or op.attrs["reverse"] == reverse)
    )


def fuse_gelu(model: Model) -> int:
    """Rewrite every erf-form GELU pattern in place; returns how many were fused."""
    producer = {op.output: op for op in model.ops}
    uses = Counter(n for op in model.ops for n in op.inputs) + Counter(model.outputs)
    dead: set[int] = set()
    fused = 0
    for op in model.ops:
        if not _is_scalar(op, "mul", 0.5):
            continue
        m = producer.get(op.inputs[0])
        if m is None or m.op != "binary" or m.attrs["op"] != "mul":
            continue
        for x, a_name in (m.inputs, m.inputs[::-1]):
            a = producer.get(a_name)
            if not _is_scalar(a, "add", 1.0):
                continue
            assert a is not None
            e = producer.get(a.inputs[0])
            if e is None or e.op != "unary" or e.attrs["fn"] != "erf":
                continue
            d = producer.get(e.inputs[0])
            if not (_is_scalar(d, "div", SQRT2_F32, False) or _is_scalar(d, "mul", INV_SQRT2_F32)):
                continue
            assert d is not None
            if d.inputs[0] != x or any(uses[n.output] != 1 for n in (d, e, a, m)):
                continue
            for n in (d, e, a, m):
                dead.add(id(n))
                del model.values[n.output]
            op.op, op.inputs, op.attrs = "unary", (x,), {"fn": "gelu_erf"}
            fused += 1
            break
    model.ops[:] = [op for op in model.ops if id(op) not in dead]
    return fused
