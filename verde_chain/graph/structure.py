"""The committed structure of a training step: nodes, input sources, graph root, C_0 layout.

One training step is a fixed list of primitive nodes ``0 .. n-1`` in topological order (forward,
loss, backward, optimizer, carries). Node ``d`` runs ONE RepOps kernel (``KernelDesc``, hashed
to ``descHash``) and produces ONE output tensor. Each of its inputs comes from a source::

    kind  name                    index means                     the root the referee expects
    ----  ----------------------  ------------------------------  ------------------------------
    0     NODE_OUTPUT             node d' < d of this step        output root of d' in C_s
    1     PREV_STEP_NODE_OUTPUT   node d' of the previous step    output root of d' in C_{s-1}
    2     BATCH                   0 (one packed batch per step)   tensor root of batch s

Graph root (committed by the client; the referee checks a revealed node against it)::

    leaf_d = keccak256(abi.encode(uint256 d, bytes32 descHash, (uint8 kind, uint32 index)[] sources))
    graphRoot = merkle_root([leaf_0, ..., leaf_{n-1}])       positional, ZERO-padded (commit.merkle)

State: the tensors that cross a step boundary (parameters, optimizer state, frozen constants)
are exactly the outputs of their *producer* nodes (the optimizer / carry node that writes the
new value). C_0 is a pseudo step with the same width ``n``::

    leaf_d of C_0 = node_hash(d, descHash_d, [], [tensor_root(initial value)])   d a producer
                  = bytes32(0)                                                    otherwise
    C_0 = merkle_root(leaves)

so "output root of node d' in C_{s-1}" is uniform for s = 1 too.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from eth_abi import encode as abi_encode

from verde_chain.commit import merkle, node_hash, step_commitment, tensor_root
from verde_chain.commit.merkle import keccak256
from verde_chain.graph.errors import GraphError, ShapeMismatchError
from verde_chain.repops.library.shapes import Shape
from verde_chain.repops.program import KernelDesc

ZERO32 = b"\x00" * 32
T = TypeVar("T")


class SourceKind(enum.IntEnum):
    """Where a node input comes from. Numbers are protocol: never renumber."""

    NODE_OUTPUT = 0
    PREV_STEP_NODE_OUTPUT = 1
    BATCH = 2


@dataclass(frozen=True, slots=True)
class Source:
    kind: SourceKind
    index: int

    def as_tuple(self) -> tuple[int, int]:
        return (int(self.kind), int(self.index))

    def pick(self, this_step: Sequence[T], prev_step: Mapping[int, T], batch: T) -> T:
        """The value this source names, out of node values of this step (by node index), node
        values of the previous step (by producer index) and the step's batch value; the values
        may be tensors, roots, or anything else kept per node."""
        if self.kind == SourceKind.NODE_OUTPUT:
            return this_step[self.index]
        if self.kind == SourceKind.PREV_STEP_NODE_OUTPUT:
            return prev_step[self.index]
        return batch


@dataclass(frozen=True)
class GraphNode:
    index: int
    desc: KernelDesc
    desc_hash: bytes
    inputs: tuple[Source, ...]
    label: str = ""

    def structure_leaf(self) -> bytes:
        return structure_leaf(self.index, self.desc_hash, [s.as_tuple() for s in self.inputs])


def structure_leaf(index: int, desc_hash: bytes, sources: Sequence[tuple[int, int]]) -> bytes:
    """Leaf ``index`` of graphRoot: keccak256(abi.encode(uint256 index, bytes32 descHash,
    InputSource[] sources)), an InputSource being GameTypes.sol's (uint8 kind, uint32 index);
    ``sources`` are those pairs (``Source.as_tuple()``, or ``NodeReveal.sources`` as revealed)."""
    return keccak256(
        abi_encode(["uint256", "bytes32", "(uint8,uint32)[]"], [index, desc_hash, [(int(k), i) for k, i in sources]])
    )


@dataclass(frozen=True)
class NamedTensor:
    """A named tensor of the step layout (a state slot or a batch field)."""

    name: str
    shape: Shape

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class StateSlot(NamedTensor):
    """A tensor that crosses step boundaries; ``producer`` is the node that writes its new value."""

    role: str  # param | opt | const | outputs (an inference job's outputs buffer)
    producer: int


@dataclass(frozen=True)
class BatchField(NamedTensor):
    """One tensor packed into the per-step batch: elements [offset, offset + numel)."""

    offset: int


@dataclass(frozen=True)
class TrainingGraph:
    nodes: tuple[GraphNode, ...]
    states: tuple[StateSlot, ...]
    batch_fields: tuple[BatchField, ...]
    batch_numel: int
    # named nodes of interest: "loss", "logits", "pred", ... -> node index
    named: Mapping[str, int]
    # free views: node index whose output is read in a named shape (e.g. logits)
    shapes: Mapping[str, Shape]
    # S > 1 micro-batch shards: node range [lo, hi) of shard k's block (its unpacks, forward,
    # loss, backward), which reads only the state, the batch and nodes of its own block; what
    # lets ranks compute shards apart (graph/distributed.py). Not committed: the structure
    # leaves are. Empty for S = 1.
    shard_blocks: tuple[tuple[int, int], ...] = ()

    # -------------------------------------------------------------- commitments
    def structure_leaves(self) -> list[bytes]:
        return [n.structure_leaf() for n in self.nodes]

    def root(self) -> bytes:
        return merkle.merkle_root(self.structure_leaves())

    def structure_proof(self, d: int) -> list[bytes]:
        return merkle.merkle_proof(self.structure_leaves(), d)

    def state_by_name(self) -> dict[str, StateSlot]:
        return {s.name: s for s in self.states}

    def initial_leaves(self, state: Mapping[str, np.ndarray]) -> list[bytes]:
        leaves = [ZERO32] * len(self.nodes)
        for slot in self.states:
            arr = state.get(slot.name)
            if arr is None:
                raise GraphError(f"initial state lacks tensor {slot.name!r}", tensor=slot.name)
            if arr.size != slot.numel or arr.dtype != np.float32:
                raise ShapeMismatchError(
                    f"initial state {slot.name!r}: {arr.dtype}{tuple(arr.shape)}, expected float32{slot.shape}",
                    tensor=slot.name,
                )
            node = self.nodes[slot.producer]
            leaves[slot.producer] = node_hash(slot.producer, node.desc_hash, [], [tensor_root(arr)])
        return leaves

    def initial_commitment(self, state: Mapping[str, np.ndarray]) -> bytes:
        """C_0: the pseudo step whose producer nodes output the initial state (module docstring)."""
        return step_commitment(self.initial_leaves(state))

    # -------------------------------------------------------------- serialisation
    def encode(self) -> bytes:
        """Canonical bytes: abi.encode((bytes desc, (uint8,uint256)[] sources)[]) in node order."""
        return abi_encode(
            ["(bytes,(uint8,uint256)[])[]"],
            [[(n.desc.encode(), [s.as_tuple() for s in n.inputs]) for n in self.nodes]],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "graph_root": "0x" + self.root().hex(),
            "nodes": [
                {
                    "index": n.index,
                    "label": n.label,
                    "desc_hash": "0x" + n.desc_hash.hex(),
                    "desc": "0x" + n.desc.encode().hex(),
                    "inputs": [[s.kind.name, s.index] for s in n.inputs],
                    "out_shape": list(n.desc.out_shape),
                }
                for n in self.nodes
            ],
            "states": [
                {"name": s.name, "shape": list(s.shape), "role": s.role, "producer": s.producer} for s in self.states
            ],
            "batch": {
                "numel": self.batch_numel,
                "fields": [{"name": f.name, "shape": list(f.shape), "offset": f.offset} for f in self.batch_fields],
            },
            "named": dict(self.named),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)

    def pack_batch(self, tensors: Mapping[str, np.ndarray]) -> np.ndarray:
        """Pack one step's batch tensors into the single float32 batch tensor (field order)."""
        out = np.zeros(self.batch_numel, dtype=np.float32)
        for f in self.batch_fields:
            if f.name not in tensors:
                raise GraphError(f"batch lacks field {f.name!r}", field=f.name)
            a = np.asarray(tensors[f.name], dtype=np.float32)
            if a.size != f.numel:
                raise ShapeMismatchError(
                    f"batch field {f.name!r} has shape {tuple(a.shape)}, graph expects {f.shape}", field=f.name
                )
            out[f.offset : f.offset + f.numel] = a.reshape(-1)
        return out

    def summary(self) -> dict[str, Any]:
        labels: dict[str, int] = {}
        for n in self.nodes:
            labels[n.label] = labels.get(n.label, 0) + 1
        return {
            "nodes": len(self.nodes),
            "states": len(self.states),
            "params": sum(s.numel for s in self.states if s.role == "param"),
            "batch_numel": self.batch_numel,
            "labels": labels,
        }
