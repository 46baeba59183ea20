"""IR rewrites applied after import: recognise op patterns that RepOps has one program for.

``fuse_gelu``: torch exports ``nn.GELU()`` at opsets < 20 as ``x * (1 + erf(x / sqrt 2)) * 0.5``
(Div, Erf, Add, Mul, Mul). When the four intermediates have no other use, the five ops become one
``unary gelu_erf`` (the ``gelu_erf`` program; its gradient ``gelu_erf_grad``): 1 node instead of
5 forward and ~8 backward, and one rounding chain instead of five. The rewrite changes the
computation (not bit-equal to the decomposition), so it is part of the import and of the graph
root; pass ``fuse=False`` to ``import_onnx`` to keep the decomposition.

``fold_transposes``: a ``transpose`` that swaps the last two axes and feeds one matmul or gemm
operand (directly, or through one reshape that regroups only the leading axes: multi-head
attention's K^T) becomes that operand's ``trans_a``/``trans_b`` flag: the matmul reads the
untransposed tensor through swapped strides (``library.matmul``), and its backward writes the
gradient straight in the stored layout (dW = g^T x for y = x W^T), so neither the forward nor the
backward transpose node exists. A transposed read changes no arithmetic (every dot chain reads
the same elements in the same order, and the backward's products only swap their factors, which
FMA and MUL do not see), so every value stays bit-identical to the unfused graph; only the node
list, hence C_s, changes. Bytes per step: GPT-2 small's tied LM head alone loses two
768 x 50257 copies.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence

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


def _swaps_last_two(perm: Sequence[int]) -> bool:
    n = len(perm)
    return n >= 2 and tuple(p % n for p in perm) == (*range(n - 2), n - 1, n - 2)


def _commutes_with_swap(model: Model, op: OpNode) -> bool:
    """Whether ``op`` may run on the untransposed tensor instead: an elementwise op of one
    tensor (the same values in another layout), or a reshape that regroups only the axes in
    front of the last two (attention's (B*H, T, D) <-> (B, H, T, D))."""
    if op.op in ("scalar", "unary"):
        return True
    return op.op == "reshape" and model.shape(op.output)[-2:] == model.shape(op.inputs[0])[-2:]


def fold_transposes(model: Model) -> int:
    """Fold every last-two-axes ``transpose`` read by exactly one matmul/gemm operand into that
    operand's trans flag, in place; returns how many were folded.

    Left alone (each would change a value or cannot be read through strides): a transpose with
    another consumer or that is a model output; any other perm; the A operand of a batched
    matmul with a 2-D B (its weight gradient folds the batch into the rows of A, which a
    transposed A cannot be viewed as); a consumer that also reads the untransposed tensor, or
    another use of that tensor between the transpose and its consumer (the gradient
    contributions to it would be summed in another order)."""
    consumers: dict[str, list[tuple[int, OpNode, int]]] = defaultdict(list)  # value -> (position, op, slot)
    for pos, op in enumerate(model.ops):
        for slot, name in enumerate(op.inputs):
            consumers[name].append((pos, op, slot))
    outputs = set(model.outputs)
    dead: set[int] = set()
    for pos, t in enumerate(model.ops):
        if t.op != "transpose" or not _swaps_last_two(t.attrs["perm"]) or t.output in outputs:
            continue
        if len(consumers[t.output]) != 1:
            continue
        at, user, slot = consumers[t.output][0]
        reader = (at, user, slot)  # the op that reads the untransposed tensor once folded
        chain: list[OpNode] = []  # views and elementwise ops between the transpose and the matmul
        while _commutes_with_swap(model, user) and user.output not in outputs and len(consumers[user.output]) == 1:
            chain.append(user)
            at, user, slot = consumers[user.output][0]
        if user.op not in ("matmul", "gemm") or slot > 1:
            continue
        a_rank, b_rank = (len(model.shape(n)) for n in user.inputs[:2])
        if user.op == "matmul" and slot == 0 and a_rank > 2 and b_rank == 2:
            continue
        src = t.inputs[0]
        if src in user.inputs or any(pos < p < at for p, _, _ in consumers[src]):
            continue
        first = chain[0] if chain else user
        first.inputs = tuple(src if n == t.output else n for n in first.inputs)
        for op in chain:  # each now holds its values with the last two axes swapped back
            shape = model.shape(op.output)
            shape = shape[:-2] + (shape[-1], shape[-2])
            model.values[op.output].shape = shape
            if op.op == "reshape":
                op.attrs["shape"] = shape
        flag = ("trans_a", "trans_b")[slot]
        user.attrs[flag] = not user.attrs[flag]
        consumers[src] = [c for c in consumers[src] if c[1] is not t] + [reader]
        dead.add(id(t))
        del model.values[t.output]
    model.ops[:] = [op for op in model.ops if id(op) not in dead]
    return len(dead)
