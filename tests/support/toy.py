"""The toy machine (twin of ``contracts/test/ToyStepper.sol``) and a toy job/world for games (test support).

Toy machine::

    desc      = abi.encode(uint256 outputNumel, uint256 numSteps, uint256 opId)
    state j   = abi.encode(uint256 j, uint256 acc)            hash = keccak256(state)
    acc_0     = (uint32(keccak256(abi.encode(descHash, inputRoots))) + e * 0x9E3779B9) mod 2^32
    acc_{j+1} = (acc_j * 1103515245 + 12345 + j) mod 2^32
    value     = acc_N

Toy job: T steps of a graph of ``num_nodes`` nodes, wired like a training step (every node reads
the previous node of the same step and its own output of the previous step; node 0 reads the
batch). Output tensors are real TensorCommit trees over the toy values, so L2/L3 openings are
the genuine ones. A ``Fault`` makes a world dishonest at one chosen point; every later value that
depends on it follows consistently, as a buggy or cheating trainer's execution would.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from eth_abi import encode as abi_encode

from verde_chain.commit import merkle, tensor
from verde_chain.commit.merkle import ZERO, keccak256
from verde_chain.commit.tensor import LEAF_BYTES, LEAF_ELEMS
from verde_chain.dispute.types import InputProof, NodePreimage, NodeReveal
from verde_chain.dispute.world import LazySteps
from verde_chain.graph.data import batch_leaf
from verde_chain.graph.structure import SourceKind, structure_leaf

MASK = 0xFFFFFFFF
GOLDEN = 0x9E3779B9
MUL = 1103515245
INC = 12345

# -- the machine ----------------------------------------------------------------------------------


def encode_desc(numel: int, micro_steps: int, op_id: int) -> bytes:
    return abi_encode(["uint256", "uint256", "uint256"], [numel, micro_steps, op_id])


def encode_state(j: int, acc: int) -> bytes:
    return j.to_bytes(32, "big") + acc.to_bytes(32, "big")


def decode_state(state: bytes) -> tuple[int, int]:
    return int.from_bytes(state[:32], "big"), int.from_bytes(state[32:64], "big")


def base_acc(desc_hash: bytes, input_roots: Sequence[bytes]) -> int:
    h = keccak256(abi_encode(["bytes32", "bytes32[]"], [desc_hash, list(input_roots)]))
    return int.from_bytes(h[-4:], "big")


def initial_acc(desc_hash: bytes, input_roots: Sequence[bytes], element: int) -> int:
    return (base_acc(desc_hash, input_roots) + element * GOLDEN) & MASK


def next_acc(acc: int, j: int) -> int:
    return (acc * MUL + INC + j) & MASK


@functools.cache
def affine(n: int) -> tuple[int, int]:
    """(A, B) with acc_n = A * acc_0 + B mod 2^32 (lets a world compute whole tensors at once)."""
    a, b = 1, 0
    for j in range(n):
        a, b = (MUL * a) & MASK, (MUL * b + INC + j) & MASK
    return a, b


# -- the job --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeSpec:
    numel: int
    micro_steps: int
    op_id: int
    sources: tuple[tuple[SourceKind, int], ...]

    @property
    def desc(self) -> bytes:
        return encode_desc(self.numel, self.micro_steps, self.op_id)

    @property
    def desc_hash(self) -> bytes:
        return keccak256(self.desc)


def default_graph(num_nodes: int, numels: Sequence[int], micro: Sequence[int], batch_width: int = 2) -> list[NodeSpec]:
    specs = []
    for d in range(num_nodes):
        if d == 0:
            src: list[tuple[SourceKind, int]] = [(SourceKind.BATCH, 0), (SourceKind.PREV_STEP_NODE_OUTPUT, num_nodes - 1)]
        else:
            src = [(SourceKind.NODE_OUTPUT, d - 1), (SourceKind.PREV_STEP_NODE_OUTPUT, d)]
            if d % 3 == 2:
                src.append((SourceKind.BATCH, (d // 3) % batch_width))
            if d >= 3 and d % 4 == 3:
                src.append((SourceKind.NODE_OUTPUT, d - 3))
        specs.append(NodeSpec(numels[d % len(numels)], micro[d % len(micro)], d, tuple(src)))
    return specs


@dataclass
class ToyJob:
    """The public job: graph, C_0, batches. Both parties share it."""

    num_steps: int
    nodes: list[NodeSpec]
    batch_width: int = 2
    seed: int = 0
    init_roots: list[bytes] = field(init=False)
    batches: list[list[bytes]] = field(init=False)

    def __post_init__(self) -> None:
        tag = self.seed.to_bytes(8, "big")
        self.init_roots = [keccak256(b"init" + tag + d.to_bytes(4, "big")) for d in range(self.num_nodes)]
        self.batches = [
            [keccak256(b"batch" + tag + s.to_bytes(8, "big") + b.to_bytes(4, "big")) for b in range(self.batch_width)]
            for s in range(1, self.num_steps + 1)
        ]

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @functools.cached_property
    def structure_leaves(self) -> list[bytes]:
        return [structure_leaf(d, n.desc_hash, n.sources) for d, n in enumerate(self.nodes)]

    @functools.cached_property
    def graph_root(self) -> bytes:
        return merkle.merkle_root(self.structure_leaves)

    @functools.cached_property
    def batch_leaves(self) -> list[bytes]:
        return [batch_leaf(b) for b in self.batches]

    @functools.cached_property
    def batch_root(self) -> bytes:
        return merkle.merkle_root(self.batch_leaves)

    @functools.cached_property
    def c0_leaves(self) -> list[bytes]:
        return [tensor.node_hash(d, n.desc_hash, [], [self.init_roots[d]]) for d, n in enumerate(self.nodes)]


# -- faults ---------------------------------------------------------------------------------------

FAULT_KINDS = ("micro", "input", "desc", "garbage_node", "node_padding", "element_padding", "leaf_padding")


@dataclass(frozen=True)
class Fault:
    """One deviation from the honest execution.

    micro            state `micro` (1..N) of element `element` of node `node` at step `step` is off by one bit
    input            node's first input root is replaced (its output follows from the wrong input)
    desc             node runs another op (its descHash is not the graph's)
    garbage_node     node's hash in C_step is random bytes (no preimage)
    node_padding     a padding leaf of C_step's node tree is non-zero (num_nodes not a power of two)
    element_padding  a padding element of the node's last output chunk is non-zero
    leaf_padding     a padding leaf of the node's output tree is non-zero
    """

    kind: str
    step: int
    node: int = 0
    element: int = 0
    micro: int = 1

    def at(self, s: int, d: int) -> bool:
        return self.step == s and self.node == d


@dataclass
class _Step:
    inputs: list[list[bytes]]
    outputs: list[bytes]
    descs: list[bytes]
    levels: list[list[bytes]]


class ToyWorld(LazySteps[_Step]):
    """A full (lazy, cached) execution of a ToyJob, honest or with one Fault."""

    def __init__(self, job: ToyJob, fault: Fault | None = None) -> None:
        super().__init__()
        self.job = job
        self.fault = fault
        self.num_steps = job.num_steps
        self.num_nodes = job.num_nodes

    # -- execution ----------------------------------------------------------------------------

    def _fault(self, kind: str, s: int, d: int) -> bool:
        return self.fault is not None and self.fault.kind == kind and self.fault.at(s, d)

    def _spec(self, s: int, d: int) -> NodeSpec:
        spec = self.job.nodes[d]
        if self._fault("desc", s, d):
            spec = replace(spec, op_id=spec.op_id + 1000)
        return spec

    def _compute(self, s: int) -> _Step:
        job = self.job
        if s == 0:
            c0_descs = [n.desc for n in job.nodes]
            return _Step([[] for _ in job.nodes], list(job.init_roots), c0_descs, _levels(job.c0_leaves, job.num_nodes))
        prev = self._steps[s - 1]
        inputs: list[list[bytes]] = []
        outputs: list[bytes] = []
        descs: list[bytes] = []
        hashes: list[bytes] = []
        for d in range(job.num_nodes):
            spec = self._spec(s, d)
            ins = []
            for kind, idx in spec.sources:
                # A malformed graph (forward reference, batch index past the batch) reads ZERO;
                # the referee refuses such a node (SourceNotEarlier, BatchIndexOutOfRange).
                if kind == SourceKind.NODE_OUTPUT:
                    ins.append(outputs[idx] if idx < d else ZERO)
                elif kind == SourceKind.PREV_STEP_NODE_OUTPUT:
                    ins.append(prev.outputs[idx])
                else:
                    batch = job.batches[s - 1]
                    ins.append(batch[idx] if idx < len(batch) else ZERO)
            if self._fault("input", s, d):
                ins[0] = keccak256(b"wrong input" + ins[0])
            inputs.append(ins)
            descs.append(spec.desc)
            if spec.numel == 0:  # a malformed graph: no tensor to commit to (EmptyOutput on chain)
                out_root = ZERO
            elif self._fault("element_padding", s, d) or self._fault("leaf_padding", s, d):
                out_root = self._output_levels(s, d, spec, ins)[-1][0]
            else:  # fast path (native tree builder when available); same root
                out_root = tensor.tensor_root(self._output_bits(s, d, spec, ins))
            outputs.append(out_root)
            h = tensor.node_hash(d, spec.desc_hash, ins, [out_root])
            if self._fault("garbage_node", s, d):
                h = keccak256(b"garbage" + h)
            hashes.append(h)
        levels = _levels(hashes, job.num_nodes, garbage_pad=self.fault is not None and self.fault.kind == "node_padding"
                         and self.fault.step == s)
        return _Step(inputs, outputs, descs, levels)

    def _output_bits(self, s: int, d: int, spec: NodeSpec, ins: Sequence[bytes]) -> np.ndarray:
        base = base_acc(spec.desc_hash, ins)
        e = np.arange(spec.numel, dtype=np.uint64)
        acc0 = (np.uint64(base) + e * np.uint64(GOLDEN)) & np.uint64(MASK)
        a, b = affine(spec.micro_steps)
        bits = ((acc0 * np.uint64(a) + np.uint64(b)) & np.uint64(MASK)).astype(np.uint32)
        if self._fault("micro", s, d):
            f = self.fault
            assert f is not None
            bits[f.element] = decode_state(self._trace(s, d, f.element, spec, ins)[-1])[1]
        return bits

    def _output_levels(self, s: int, d: int, spec: NodeSpec, ins: Sequence[bytes]) -> list[list[bytes]]:
        chunks = self._chunks(s, d, spec, ins)
        leaves = [keccak256(c) for c in chunks]
        garbage = self._fault("leaf_padding", s, d)
        return _levels(leaves, len(leaves), garbage_pad=garbage)

    def _chunks(self, s: int, d: int, spec: NodeSpec, ins: Sequence[bytes]) -> list[bytes]:
        rows = tensor.chunks(self._output_bits(s, d, spec, ins))
        if self._fault("element_padding", s, d):
            rows = rows.copy()
            # the last padding element of the last chunk
            rows[-1, -4:] = np.frombuffer((0xDEADBEEF).to_bytes(4, "big"), dtype=np.uint8)
        return [bytes(r) for r in rows]

    def _trace(self, s: int, d: int, e: int, spec: NodeSpec, ins: Sequence[bytes]) -> list[bytes]:
        acc = initial_acc(spec.desc_hash, ins, e)
        states = [encode_state(0, acc)]
        corrupt = self._fault("micro", s, d) and self.fault is not None and self.fault.element == e
        for j in range(spec.micro_steps):
            acc = next_acc(acc, j)
            if corrupt and self.fault is not None and j + 1 == self.fault.micro:
                acc ^= 1
            states.append(encode_state(j + 1, acc))
        return states

    # -- World ----------------------------------------------------------------------------------

    def step_commitment(self, s: int) -> bytes:
        return self._get(s).levels[-1][0]

    def node_levels(self, s: int) -> list[list[bytes]]:
        return self._get(s).levels

    def desc(self, s: int, d: int) -> bytes:
        return self._get(s).descs[d]

    def _node_args(self, s: int, d: int) -> tuple[NodeSpec, list[bytes]]:
        st = self._get(s)
        return self._spec(s, d), st.inputs[d]

    def output_levels(self, s: int, d: int) -> list[list[bytes]]:
        spec, ins = self._node_args(s, d)
        return self._output_levels(s, d, spec, ins)

    def output_chunk(self, s: int, d: int, leaf: int) -> bytes:
        spec, ins = self._node_args(s, d)
        return self._chunks(s, d, spec, ins)[leaf]

    def micro_steps(self, s: int, d: int) -> int:
        return self._spec(s, d).micro_steps

    def micro_state(self, s: int, d: int, e: int, j: int) -> bytes:
        spec, ins = self._node_args(s, d)
        return self._trace_cached(s, d, e, spec, tuple(ins))[j]

    @functools.lru_cache(maxsize=64)  # noqa: B019 - a world lives as long as its game
    def _trace_cached(self, s: int, d: int, e: int, spec: NodeSpec, ins: tuple[bytes, ...]) -> list[bytes]:
        return self._trace(s, d, e, spec, ins)

    def step_proof(self, s: int, d: int, e: int, j: int) -> bytes:
        return b""

    def node_reveal(self, s: int, d: int) -> NodeReveal:
        job = self.job
        st = self._get(s)
        spec = self._spec(s, d)
        graph = job.nodes[d]  # the wiring comes from the job's graph
        proofs = []
        for kind, idx in graph.sources:
            if kind == SourceKind.BATCH:
                proofs.append(InputProof(
                    batch_roots=tuple(job.batches[s - 1]), proof=tuple(merkle.merkle_proof(job.batch_leaves, s - 1))
                ))
            else:
                src_step = s if kind == SourceKind.NODE_OUTPUT else s - 1
                src = self._get(src_step)
                pre = NodePreimage(keccak256(src.descs[idx]), tuple(src.inputs[idx]), (src.outputs[idx],))
                proofs.append(InputProof(node=pre, proof=tuple(merkle.proof_from_levels(src.levels, idx))))
        return NodeReveal(
            desc=spec.desc,
            input_roots=tuple(st.inputs[d]),
            output_root=st.outputs[d],
            sources=tuple((int(k), i) for k, i in graph.sources),
            graph_proof=tuple(merkle.merkle_proof(job.structure_leaves, d)),
            input_proofs=tuple(proofs),
        )


def _levels(leaves: list[bytes], size: int, garbage_pad: bool = False) -> list[list[bytes]]:
    """Merkle levels over `leaves` (ZERO-padded to a power of two; optionally one garbage pad)."""
    if not garbage_pad:
        return merkle.levels(leaves)
    width = 1 << merkle.depth_for(size)
    if width == size:
        raise ValueError("no padding leaf to corrupt: the size is a power of two")
    return merkle.levels(list(leaves) + [ZERO] * (width - len(leaves) - 1) + [keccak256(b"padding")])


def chunk_element(chunk: bytes, element: int) -> int:
    off = (element % LEAF_ELEMS) * 4
    return int.from_bytes(chunk[off : off + 4], "big")


assert LEAF_BYTES == 4 * LEAF_ELEMS
