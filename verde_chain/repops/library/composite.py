"""Compositions: a high-level operator as a small DAG of primitive nodes.

A :class:`Composite` is exactly how the operator appears in a training graph: its nodes are
inlined one by one (``GraphBuilder.composite``), each a primitive :class:`KernelDesc` with its
own ``descHash``. :class:`Builder` is the language the compositions in ``nn.py``, ``losses.py``,
``optimizers.py`` and ``backward.py`` are written in: values are ints, a reshape is a free view
(no node), and ``reduce`` over axes that are not linear in memory inserts one transpose node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from verde_chain.errors import RepOpsError
from verde_chain.repops.isa import Instr
from verde_chain.repops.library.maps import binary, elementwise, map_unary
from verde_chain.repops.library.movement import transpose
from verde_chain.repops.library.reductions import reduce, reduce_dot
from verde_chain.repops.library.shapes import (
    Shape,
    as_shape,
    c_strides,
    linear_k_stride,
    normalize_axes,
    numel,
    reduced_shape,
)
from verde_chain.repops.program import KernelDesc, Runner


@dataclass(frozen=True)
class Node:
    desc: KernelDesc
    args: tuple[int, ...]  # storage ids: inputs 0..n-1, node i -> n + i


@dataclass(frozen=True)
class Composite:
    """A small DAG of primitive nodes (how a high-level op appears in the training graph)."""

    label: str
    in_shapes: tuple[Shape, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[tuple[int, Shape], ...]  # (storage id, shape) — reshapes are free views

    def run(self, inputs: Sequence[np.ndarray], runner: Runner | None = None) -> list[np.ndarray]:
        if runner is None:
            from verde_chain.repops.reference import run as runner_
            runner = runner_
        if len(inputs) != len(self.in_shapes):
            raise RepOpsError(f"{self.label}: {len(inputs)} inputs given, {len(self.in_shapes)} expected")
        store: list[np.ndarray] = []
        for x, s in zip(inputs, self.in_shapes):
            a = np.asarray(x)
            if a.dtype != np.float32:
                raise RepOpsError(f"{self.label}: inputs must be float32, got {a.dtype}")
            if a.size != numel(s):
                raise RepOpsError(f"{self.label}: input of {a.size} elements, expected shape {s}")
            store.append(np.ascontiguousarray(a).reshape(-1))
        for node in self.nodes:
            store.append(np.ascontiguousarray(runner(node.desc, [store[i] for i in node.args])).reshape(-1))
        return [store[i].reshape(s) for i, s in self.outputs]


class Builder:
    """Builds a Composite; values are ints, reshape is a free view (no node)."""

    def __init__(self, label: str, *in_shapes: Sequence[int]) -> None:
        self.label = label
        self.in_shapes = tuple(as_shape(s) for s in in_shapes)
        self.nodes: list[Node] = []
        self.shapes: list[Shape] = list(self.in_shapes)
        self.storage: list[int] = list(range(len(self.in_shapes)))  # value -> storage id

    def inputs(self) -> list[int]:
        return list(range(len(self.in_shapes)))

    def shape(self, v: int) -> Shape:
        return self.shapes[v]

    def node(self, desc: KernelDesc, *args: int) -> int:
        for t, (a, m) in enumerate(zip(args, desc.inputs)):
            if numel(self.shapes[a]) != m.numel:
                raise RepOpsError(f"{self.label}/{desc.label}: arg {t} has {self.shapes[a]}, map wants {m.numel}")
        sid = len(self.in_shapes) + len(self.nodes)
        self.nodes.append(Node(desc, tuple(self.storage[a] for a in args)))
        self.shapes.append(desc.out_shape)
        self.storage.append(sid)
        return len(self.shapes) - 1

    def view(self, v: int, shape: Sequence[int]) -> int:
        s = as_shape(shape)
        if numel(s) != numel(self.shapes[v]):
            raise RepOpsError(f"{self.label}: cannot view {self.shapes[v]} as {s}")
        self.shapes.append(s)
        self.storage.append(self.storage[v])
        return len(self.shapes) - 1

    def inline(self, comp: Composite, *args: int) -> list[int]:
        """Append the nodes of another composite, fed with ``args``; its output values."""
        vals = list(args)
        for node in comp.nodes:
            vals.append(self.node(node.desc, *[vals[i] for i in node.args]))
        return [vals[sid] for sid, _ in comp.outputs]

    # vocabulary -------------------------------------------------------------------
    def unary(self, name: str, x: int) -> int:
        return self.node(map_unary(name, self.shape(x)), x)

    def binary(self, op: str, x: int, y: int) -> int:
        return self.node(binary(op, self.shape(x), self.shape(y)), x, y)

    def map(self, label: str, code: Sequence[Instr], *xs: int) -> int:
        return self.node(elementwise(label, [self.shape(x) for x in xs], code), *xs)

    def reduce(self, kind: str, x: int, axes: Sequence[int] | None, keepdims: bool = True) -> int:
        descs, out = reduce_nodes(kind, self.shape(x), axes, keepdims)
        for desc in descs:
            x = self.node(desc, x)
        return x if self.shape(x) == out else self.view(x, out)

    def reduce_dot(self, x: int, y: int, axes: Sequence[int] | None, keepdims: bool = True, mean: bool = False) -> int:
        if self.shape(x) != self.shape(y):
            raise RepOpsError(f"reduce_dot: shapes {self.shape(x)} and {self.shape(y)} differ")
        return self.node(reduce_dot(self.shape(x), axes, keepdims, mean), x, y)

    def build(self, *outs: int) -> Composite:
        return Composite(
            self.label, self.in_shapes, tuple(self.nodes), tuple((self.storage[o], self.shapes[o]) for o in outs)
        )


def reduce_nodes(
    kind: str, shape: Sequence[int], axes: Sequence[int] | None, keepdims: bool
) -> tuple[list[KernelDesc], Shape]:
    """A reduction over any axes as a chain of nodes, and the output shape (a free view of the
    last node's output): one reduce kernel when the reduced axes are linear in memory; else a
    transpose moving them last (an exact copy) and a reduce over the trailing block."""
    shp = as_shape(shape)
    ax = normalize_axes(f"reduce_{kind}", axes, len(shp))
    if linear_k_stride(shp, c_strides(shp), ax) is not None:
        red = reduce(kind, shp, ax, keepdims)
        return [red], red.out_shape
    kept = [d for d in range(len(shp)) if d not in ax]
    t = transpose(shp, kept + list(ax))
    return [t, reduce(kind, t.out_shape, range(len(kept), len(shp)), False)], reduced_shape(shp, ax, keepdims)


def single(desc: KernelDesc, in_shapes: Sequence[Sequence[int]] | None = None) -> Composite:
    """One primitive node as a Composite (the torch API and tests run everything as composites)."""
    shapes = in_shapes or [(m.numel,) for m in desc.inputs]
    b = Builder(desc.label, *shapes)
    return b.build(b.node(desc, *b.inputs()))


def reduce_composite(kind: str, shape: Sequence[int], axes: Sequence[int] | None, keepdims: bool = True) -> Composite:
    """Any reduction over any axes (transpose node inserted when needed), plus
    log_sum = log(sum(x)) and log_sum_exp = log(sum(exp(x - m))) + m with m = max(x)."""
    b = Builder(f"reduce_{kind}", shape)
    x = 0
    if kind == "log_sum":
        return b.build(b.unary("log", b.reduce("sum", x, axes, keepdims)))
    if kind == "log_sum_exp":
        m = b.reduce("max", x, axes, True)
        s = b.reduce("sum", b.unary("exp", b.binary("sub", x, m)), axes, True)
        y = b.binary("add", b.unary("log", s), m)
        return b.build(b.view(y, reduced_shape(b.shape(x), normalize_axes("reduce", axes, len(b.shape(x))), keepdims)))
    return b.build(b.reduce(kind, x, axes, keepdims))
