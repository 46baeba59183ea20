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


def _fusable_bn(op: OpNode | None, uses: Counter[str], *, act_free: bool) -> bool:
    """A batch norm whose output has only this one reader and that takes a tail: no activation
    yet (and, for a residual, nothing fused at all: the Add must come before the activation)."""
    return (
        op is not None
        and op.op == "batch_norm"
        and uses[op.output] == 1
        and op.attrs.get("act") is None
        and (not act_free or op.attrs.get("residual") is None)
    )


def fuse_batch_norm(model: Model) -> int:
    """Fold into a ``batch_norm`` op the elementwise ops that only read its output: a
    same-shape residual ``add`` (either side), then ``relu`` or ``clip``. The fused op's map runs
    the same instructions in the same order as the separate nodes, so every value is the same;
    the normalised value (and the sum) are no longer node outputs, and the backward reads the
    activation's output instead of its input (``operators/nn.py``). Returns how many ops were
    folded. The rewrite changes the graph (fewer nodes), so ``C_s`` and the graph root."""
    producer = {op.output: op for op in model.ops}
    uses = Counter(n for op in model.ops for n in op.inputs) + Counter(model.outputs)
    dead: set[int] = set()
    folded = 0
    extra: dict[str, object]
    for op in model.ops:
        if op.op == "binary" and op.attrs["op"] == "add":
            sides = [i for i in (0, 1) if _fusable_bn(producer.get(op.inputs[i]), uses, act_free=True)]
            if not sides or model.shape(op.inputs[0]) != model.shape(op.inputs[1]):
                continue
            bn = producer[op.inputs[sides[0]]]
            extra = {"residual": sides[0]}
            rest: tuple[str, ...] = (op.inputs[1 - sides[0]],)
        elif (op.op == "unary" and op.attrs["fn"] == "relu") or op.op == "clip":
            bn_or_none = producer.get(op.inputs[0])
            if not _fusable_bn(bn_or_none, uses, act_free=False):
                continue
            assert bn_or_none is not None
            bn = bn_or_none
            extra = {"act": "relu"} if op.op == "unary" else {"act": "clip", "lo": op.attrs["lo"], "hi": op.attrs["hi"]}
            rest = ()
        else:
            continue
        dead.add(id(bn))
        del model.values[bn.output]
        op.op, op.inputs, op.attrs, op.name = "batch_norm", bn.inputs + rest, {**bn.attrs, **extra}, bn.name
        folded += 1
    model.ops[:] = [op for op in model.ops if id(op) not in dead]
    return folded
