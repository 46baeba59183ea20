"""Incremental construction of a :class:`TrainingGraph` from RepOps primitives.

Values (:class:`Ref`) are a storage plus a logical shape; reshapes are free views of the same
flat storage (tensor roots are over the flat C-order elements, so a view needs no node). A storage
is the output of a node of this step, a state tensor (resolved to its producer node once the
optimizer nodes exist) or the packed batch.

Common subexpressions are built once: every node is a pure function of its descriptor and the
storages it reads (randomness such as dropout's keep-mask arrives in the batch), so a node
equal to an earlier one in both returns the earlier node's output (``GraphBuilder.node``). The
cross-entropy's backward, for one, recomputes the forward's max, ``sub_exp`` and sum of the
same scores: with this the step commits each once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from verde_chain.graph.errors import GraphError, ShapeMismatchError
from verde_chain.graph.structure import BatchField, GraphNode, Source, SourceKind, StateSlot, TrainingGraph
from verde_chain.repops import library
from verde_chain.repops.isa import Instr
from verde_chain.repops.library.shapes import Shape, as_shape
from verde_chain.repops.program import KernelDesc


@dataclass(frozen=True)
class Ref:
    kind: str  # node | state | batch
    key: int | str  # node index, state name, or 0
    shape: Shape

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


# Merge equal nodes (module docstring). Off only to build the graph as it was before, so tests
# can compare the two bit for bit.
CSE = True


class GraphBuilder:
    def __init__(self) -> None:
        self._descs: list[KernelDesc] = []
        self._args: list[tuple[Ref, ...]] = []
        self._labels: list[str] = []
        self._states: dict[str, tuple[Shape, str]] = {}
        self._batch: list[BatchField] = []
        self._batch_numel = 0
        self._sealed = False
        self._desc_hash_cache: dict[KernelDesc, bytes] = {}
        # (descriptor, the storages it reads) -> the node computing it; None: CSE off
        self._cse: dict[tuple[KernelDesc, tuple[tuple[str, int | str], ...]], int] | None = {} if CSE else None
        # carried state a forward rule computes anew each step (batch norm's running statistics)
        self.state_updates: dict[str, Ref] = {}

    # -------------------------------------------------------------- leaves
    def state(self, name: str, shape: Sequence[int], role: str) -> Ref:
        shp = as_shape(shape)
        if name in self._states and self._states[name][0] != shp:
            raise GraphError(f"state {name!r} declared with two shapes", state=name)
        self._states[name] = (shp, role)
        return Ref("state", name, shp)

    def update_state(self, state: Ref, new: Ref) -> None:
        """``new`` is the next step's value of the carried ``state`` (its producer, instead of a
        carry copy)."""
        if state.kind != "state" or new.kind != "node" or new.numel != state.numel:
            raise GraphError(f"state update {state} <- {new}: a state and a node output of its size")
        if state.key in self.state_updates:
            raise GraphError(f"state {state.key!r} updated twice", state=state.key)
        self.state_updates[str(state.key)] = new

    def batch_field(self, name: str, shape: Sequence[int]) -> Ref:
        """Declare a field of the packed batch and unpack it with one copy node."""
        if self._sealed:
            raise GraphError(f"batch field {name!r} declared after the batch was unpacked")
        shp = as_shape(shape)
        f = BatchField(name, shp, self._batch_numel)
        self._batch.append(f)
        self._batch_numel += f.numel
        return Ref("batch", name, shp)

    def unpack(self, field: Ref) -> Ref:
        # the layout must be complete before the first copy node reads the batch (its numel is
        # part of the descriptor), so declaring fields afterwards is refused
        self._sealed = True
        f = next(b for b in self._batch if b.name == field.key)
        desc = library.strided_copy(f.shape, self._batch_numel, library.c_strides(f.shape), f.offset, label=f"batch:{f.name}")
        return self.node(desc, Ref("batch", 0, (self._batch_numel,)), label=f"batch:{f.name}")

    @property
    def num_nodes(self) -> int:
        return len(self._descs)

    # -------------------------------------------------------------- nodes
    def node(self, desc: KernelDesc, *args: Ref, label: str = "") -> Ref:
        if len(args) != len(desc.inputs):
            raise ShapeMismatchError(f"{label or desc.label}: {len(args)} args for {len(desc.inputs)} inputs")
        for t, (a, m) in enumerate(zip(args, desc.inputs)):
            if a.numel != m.numel:
                raise ShapeMismatchError(
                    f"{label or desc.label}: arg {t} has shape {a.shape} ({a.numel} elements), kernel reads {m.numel}",
                    arg=t,
                )
        if self._cse is not None:
            # the descriptor's InputMaps fix how each input is read (numel, strides, offsets), so
            # the Ref's logical shape does not matter: only which storage it is; KernelDesc
            # equality leaves out the label
            key = (desc, tuple((a.kind, a.key) for a in args))
            hit = self._cse.get(key)
            if hit is not None:
                return Ref("node", hit, desc.out_shape)
            self._cse[key] = len(self._descs)
        self._descs.append(desc)
        self._args.append(tuple(args))
        self._labels.append(label or desc.label)
        return Ref("node", len(self._descs) - 1, desc.out_shape)

    def cse_barrier(self) -> None:
        """Nodes added from now on are never merged with earlier ones (a micro-batch shard's
        block must read only its own nodes, docs/distributed.md)."""
        if self._cse is not None:
            self._cse.clear()

    def view(self, r: Ref, shape: Sequence[int]) -> Ref:
        shp = as_shape(shape)
        if math.prod(shp) != r.numel:
            raise ShapeMismatchError(f"cannot view {r.shape} as {shp}")
        return Ref(r.kind, r.key, shp)

    def composite(self, comp: library.Composite, *args: Ref, want: Sequence[int] | None = None, label: str = "") -> list[Ref]:
        """Inline a spec Composite; only the nodes the wanted outputs need are added."""
        if len(args) != len(comp.in_shapes):
            raise ShapeMismatchError(f"{comp.label}: {len(args)} args, {len(comp.in_shapes)} expected")
        for a, s in zip(args, comp.in_shapes):
            if a.numel != math.prod(s):
                raise ShapeMismatchError(f"{comp.label}: arg of shape {a.shape} where {s} is expected")
        n_in = len(comp.in_shapes)
        outs = list(range(len(comp.outputs))) if want is None else list(want)
        needed: set[int] = set()
        stack = [comp.outputs[o][0] for o in outs]
        while stack:
            sid = stack.pop()
            if sid >= n_in and sid not in needed:
                needed.add(sid)
                stack.extend(comp.nodes[sid - n_in].args)
        store: dict[int, Ref] = {i: a for i, a in enumerate(args)}
        for i, nd in enumerate(comp.nodes):
            sid = n_in + i
            if sid not in needed:
                continue
            ins = [store[a] for a in nd.args]
            ins = [self.view(r, (m.numel,)) if r.numel == m.numel else r for r, m in zip(ins, nd.desc.inputs)]
            store[sid] = self.node(nd.desc, *ins, label=f"{label or comp.label}/{nd.desc.label}")
        return [self.view(store[comp.outputs[o][0]], comp.outputs[o][1]) for o in outs]

    # -------------------------------------------------------------- vocabulary
    def map(self, label: str, code: Sequence[Instr], *xs: Ref, out_shape: Sequence[int] | None = None) -> Ref:
        return self.node(library.elementwise(label, [x.shape for x in xs], code, out_shape), *xs, label=label)

    def unary(self, name: str, x: Ref) -> Ref:
        return self.node(library.map_unary(name, x.shape), x, label=name)

    def binary(self, op: str, x: Ref, y: Ref) -> Ref:
        return self.node(library.binary(op, x.shape, y.shape), x, y, label=op)

    def reduce(self, kind: str, x: Ref, axes: Sequence[int], keepdims: bool = True) -> Ref:
        descs, out = library.reduce_nodes(kind, x.shape, axes, keepdims)
        for desc in descs:
            x = self.node(desc, x)
        return self.view(x, out)

    def unbroadcast(self, g: Ref, shape: Sequence[int]) -> Ref:
        """Sum g over the axes along which ``shape`` was broadcast to g.shape (gradient of broadcast)."""
        target = as_shape(shape)
        if g.shape == target:
            return g
        axes = library.broadcast_axes(g.shape, target)
        if not axes:
            return self.view(g, target)
        r = self.reduce("sum", g, axes, keepdims=True)
        return self.view(r, target)

    def constant(self, value: float, shape: Sequence[int] = ()) -> Ref:
        """A zero-input node filling ``shape`` with ``value`` (e.g. the loss seed gradient 1.0)."""
        desc = KernelDesc(as_shape(shape), 1, (), (library.const(0, value),), label="fill")
        return self.node(desc, label="fill")

    # -------------------------------------------------------------- finish
    def finish(self, producers: dict[str, Ref], named: dict[str, Ref],
               shard_blocks: tuple[tuple[int, int], ...] = ()) -> TrainingGraph:
        """Resolve state reads to PREV_STEP sources of their producer nodes; freeze the graph.
        ``shard_blocks``: the node ranges of the micro-batch shards (``TrainingGraph``)."""
        prod_index: dict[str, int] = {}
        for name, (shape, _role) in self._states.items():
            r = producers.get(name)
            if r is None or r.kind != "node":
                raise GraphError(f"state {name!r} has no producer node", state=name)
            if r.numel != math.prod(shape):
                raise ShapeMismatchError(f"state {name!r}: producer output {r.shape} vs state {shape}", state=name)
            prod_index[name] = int(r.key)
        if len(set(prod_index.values())) != len(prod_index):
            raise GraphError("two states share a producer node")
        nodes = []
        for d, (desc, args, label) in enumerate(zip(self._descs, self._args, self._labels)):
            srcs = []
            for a in args:
                if a.kind == "node":
                    srcs.append(Source(SourceKind.NODE_OUTPUT, int(a.key)))
                elif a.kind == "state":
                    srcs.append(Source(SourceKind.PREV_STEP_NODE_OUTPUT, prod_index[str(a.key)]))
                else:
                    srcs.append(Source(SourceKind.BATCH, 0))
            h = self._desc_hash_cache.get(desc)
            if h is None:
                h = desc.hash()
                self._desc_hash_cache[desc] = h
            nodes.append(GraphNode(d, desc, h, tuple(srcs), label))
        states = tuple(StateSlot(n, s, role, prod_index[n]) for n, (s, role) in self._states.items())
        for nm, r in named.items():
            if r.kind != "node":
                raise GraphError(f"named output {nm!r} is not a node output")
        return TrainingGraph(
            nodes=tuple(nodes),
            states=states,
            batch_fields=tuple(self._batch),
            batch_numel=self._batch_numel,
            named={k: int(r.key) for k, r in named.items()},
            shapes={k: r.shape for k, r in named.items()},
            shard_blocks=shard_blocks,
        )
