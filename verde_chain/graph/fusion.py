"""IR rewrites applied after import: recognise op patterns that RepOps has one program for.

``fuse_gelu``: torch exports ``nn.GELU()`` at opsets < 20 as ``x * (1 + erf(x / sqrt 2)) * 0.5``
(Div, Erf, Add, Mul, Mul). When the four intermediates have no other use, the five ops become one
``unary gelu_erf`` (the ``gelu_erf`` program; its gradient ``gelu_erf_grad``): 1 node instead of
5 forward and ~8 backward, and one rounding chain instead of five. The rewrite changes the
computation (not bit-equal to the decomposition), so it is part of the import and of the graph
root; pass ``fuse=False`` to ``import_onnx`` to keep the decomposition.

``fuse_gelu_tanh``: the tanh form ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` becomes one
``unary gelu_tanh`` (gradient ``gelu_tanh_grad``) under the same conditions. torch's exporters
write it in three groupings, all matched: ``(0.5 x) * A`` (transformers' ``NewGELUActivation``,
GPT-2's ``gelu_new``), ``x * (0.5 A)`` (``nn.GELU(approximate="tanh")`` by the dynamo exporter
below opset 20) and ``(x * A) * 0.5`` (the TorchScript exporter), with ``A = 1 + tanh(...)`` and
``x^3`` as ``Pow(x, 3)`` or ``x * (x * x)``. Each is 8 or 9 forward ops and about ten backward
nodes of the MLP's widest shape; the fused op is one node each way. At opset 20 both exporters
emit ``Gelu(approximate="tanh")``, which imports as the same op directly.

``fold_transposes``: a ``transpose`` that swaps the last two axes and feeds one matmul or gemm
operand (directly, or through reshapes that regroup only the leading axes and single-input
elementwise ops, each with one reader: multi-head attention's scaled K^T) becomes that operand's ``trans_a``/``trans_b`` flag: the matmul reads the
untransposed tensor through swapped strides (``library.matmul``), and its backward writes the
gradient straight in the stored layout (dW = g^T x for y = x W^T), so neither the forward nor the
backward transpose node exists. A transposed read changes no arithmetic (every dot chain reads
the same elements in the same order, and the backward's products only swap their factors, which
FMA and MUL do not see), so every value stays bit-identical to the unfused graph; only the node
list, hence C_s, changes. Bytes per step: GPT-2 small's tied LM head alone loses two
768 x 50257 copies.

``fuse_batch_norm``: a ``batch_norm`` whose output has one reader absorbs a same-shape residual
``add`` and then a ``relu`` or ``clip`` (ReLU6): its normalising map runs the separate ops'
instructions in their order (``library.BnTail``), so every value is bit-identical and only the
intermediates stop being node outputs (C_s and the graph root change).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import TypeGuard

import numpy as np

from verde_chain.graph.ir import Model, OpNode

SQRT2_F32 = float(np.float32(math.sqrt(2.0)))
INV_SQRT2_F32 = float(np.float32(1.0 / math.sqrt(2.0)))
SQRT_2_OVER_PI_F32 = float(np.float32(math.sqrt(2.0 / math.pi)))
GELU_TANH_CUBIC_F32 = float(np.float32(0.044715))


def _is_scalar(op: OpNode | None, kind: str, value: float, reverse: bool | None = None) -> TypeGuard[OpNode]:
    return (
        op is not None
        and op.op == "scalar"
        and op.attrs["op"] == kind
        and float(np.float32(op.attrs["value"])) == value
        and (reverse is None or op.attrs["reverse"] == reverse)
    )


def _is_binary(op: OpNode | None, kind: str) -> TypeGuard[OpNode]:
    return op is not None and op.op == "binary" and op.attrs["op"] == kind


def _producers_and_uses(model: Model) -> tuple[dict[str, OpNode], Counter[str]]:
    """Each value's producing op, and how many times each value is read (a model output counts
    as a read): a rewrite may drop an intermediate only if its one reader is the pattern."""
    producer = {op.output: op for op in model.ops}
    return producer, Counter(n for op in model.ops for n in op.inputs) + Counter(model.outputs)


def fuse_gelu(model: Model) -> int:
    """Rewrite every erf-form GELU pattern in place; returns how many were fused."""
    producer, uses = _producers_and_uses(model)
    dead: set[int] = set()
    fused = 0
    for op in model.ops:
        if not _is_scalar(op, "mul", 0.5):
            continue
        m = producer.get(op.inputs[0])
        if not _is_binary(m, "mul"):
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
            _collapse(model, op, "gelu_erf", x, (d, e, a, m), dead)
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
    producer, uses = _producers_and_uses(model)
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


def _collapse(model: Model, root: OpNode, fn: str, x: str, inner: tuple[OpNode, ...] | list[OpNode],
              dead: set[int]) -> None:
    """Turn ``root`` into ``unary fn(x)`` and mark the ``inner`` ops (and their values) dead."""
    for n in inner:
        dead.add(id(n))
        del model.values[n.output]
    root.op, root.inputs, root.attrs = "unary", (x,), {"fn": fn}


class _TanhGelu:
    """Matchers for the pieces of the tanh-form GELU. Each returns ``(x, ops)``: the GELU's input
    and the ops that compute the piece from it, or None. Every op reached through ``_tmp`` has
    exactly one use, so the ops a match returns are dead once the root is rewritten."""

    def __init__(self, model: Model) -> None:
        self.producer, self.uses = _producers_and_uses(model)

    def _tmp(self, name: str) -> OpNode | None:
        return self.producer.get(name) if self.uses[name] == 1 else None

    def cube(self, name: str) -> tuple[str, list[OpNode]] | None:
        """``x^3``: ``pow_const 3`` or ``x * (x * x)`` in either operand order."""
        op = self._tmp(name)
        if op is not None and op.op == "pow_const" and float(np.float32(op.attrs["exponent"])) == 3.0:
            return op.inputs[0], [op]
        if not _is_binary(op, "mul"):
            return None
        for x, sq_name in (op.inputs, op.inputs[::-1]):
            sq = self._tmp(sq_name)
            if _is_binary(sq, "mul") and sq.inputs == (x, x):
                return x, [op, sq]
        return None

    def one_plus_tanh(self, name: str) -> tuple[str, list[OpNode]] | None:
        """``1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))``, each commutative op in either order."""
        a = self._tmp(name)
        if not _is_scalar(a, "add", 1.0):
            return None
        t = self._tmp(a.inputs[0])
        if t is None or t.op != "unary" or t.attrs["fn"] != "tanh":
            return None
        k = self._tmp(t.inputs[0])
        if not _is_scalar(k, "mul", SQRT_2_OVER_PI_F32):
            return None
        s = self._tmp(k.inputs[0])
        if not _is_binary(s, "add"):
            return None
        for x, q_name in (s.inputs, s.inputs[::-1]):
            q = self._tmp(q_name)
            if not _is_scalar(q, "mul", GELU_TANH_CUBIC_F32):
                continue
            c = self.cube(q.inputs[0])
            if c is not None and c[0] == x:
                return x, [a, t, k, s, q, *c[1]]
        return None

    def gelu(self, root: OpNode) -> tuple[str, list[OpNode]] | None:
        """The whole GELU ending in ``root``: ``(0.5 x) * A``, ``x * (0.5 A)`` or ``(x * A) * 0.5``."""
        if _is_binary(root, "mul"):
            for u, v in (root.inputs, root.inputs[::-1]):
                h = self._tmp(u)
                if _is_scalar(h, "mul", 0.5):
                    r = self.one_plus_tanh(v)
                    if r is not None and r[0] == h.inputs[0]:
                        return r[0], [h, *r[1]]
                h = self._tmp(v)
                if _is_scalar(h, "mul", 0.5):
                    r = self.one_plus_tanh(h.inputs[0])
                    if r is not None and r[0] == u:
                        return u, [h, *r[1]]
        elif _is_scalar(root, "mul", 0.5):
            m = self._tmp(root.inputs[0])
            if _is_binary(m, "mul"):
                for u, v in (m.inputs, m.inputs[::-1]):
                    r = self.one_plus_tanh(v)
                    if r is not None and r[0] == u:
                        return u, [m, *r[1]]
        return None


def fuse_gelu_tanh(model: Model) -> int:
    """Rewrite every tanh-form GELU pattern in place; returns how many were fused."""
    match = _TanhGelu(model)
    dead: set[int] = set()
    fused = 0
    for op in model.ops:
        if id(op) in dead:
            continue
        found = match.gelu(op)
        if found is not None:
            _collapse(model, op, "gelu_tanh", found[0], found[1], dead)
            fused += 1
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
