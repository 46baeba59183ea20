"""A World over real RepOps kernels, for games refereed by the real ScalarVM.

The job is a small training loop (least squares by gradient descent), four primitive nodes per
step, every one a canonical RepOps kernel executed by the spec interpreter::

    node 0  y = x @ W_prev           sources: BATCH 0 (x, 4x8), PREV_STEP node 3 (W, 8x3)
    node 1  g = x^T @ y              sources: BATCH 0, NODE 0
    node 2  u = g * lr               sources: NODE 1, BATCH 1 (lr, shape (1,))
    node 3  W = W_prev - u           sources: PREV_STEP node 3, NODE 2

C_0's node 3 output is the initial W (the others' initial outputs are zeros and never read).
Micro-states and step proofs come from the ScalarVM twin (``verde_chain.vm.scalarvm``). A
``MicroFault(s, d, e, j, bit)`` makes instruction j - 1 of element e write a result with that
bit flipped; the trace then continues from the wrong state (an honest machine on a wrong
register, ``cheats.corrupted_trace``), so the element's value and everything downstream follow.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from verde_chain.commit import merkle, tensor
from verde_chain.commit.merkle import keccak256
from verde_chain.dispute.cheats import MicroFault, corrupted_trace
from verde_chain.dispute.types import InputProof, NodePreimage, NodeReveal
from verde_chain.dispute.world import LazySteps
from verde_chain.graph.data import batch_leaf
from verde_chain.graph.structure import Source, SourceKind, structure_leaf
from verde_chain.repops import library, program
from verde_chain.repops.program import KernelDesc
from verde_chain.vm import scalarvm as vm

BATCH, PREV, NODE = SourceKind.BATCH, SourceKind.PREV_STEP_NODE_OUTPUT, SourceKind.NODE_OUTPUT


def regression_graph(rows: int = 4, cols: int = 8, outs: int = 3) -> list[tuple[KernelDesc, tuple[Source, ...]]]:
    return [
        (library.matmul((rows, cols), (cols, outs)), (Source(BATCH, 0), Source(PREV, 3))),
        (library.matmul((rows, cols), (rows, outs), trans_a=True), (Source(BATCH, 0), Source(NODE, 0))),
        (library.binary("mul", (cols, outs), (1,)), (Source(NODE, 1), Source(BATCH, 1))),
        (library.binary("sub", (cols, outs), (cols, outs)), (Source(PREV, 3), Source(NODE, 2))),
    ]


@dataclass
class KernelJob:
    num_steps: int
    seed: int = 0
    rows: int = 4
    cols: int = 8
    outs: int = 3
    lr: float = 0.01
    nodes: list[tuple[KernelDesc, tuple[Source, ...]]] = field(init=False)
    batches: list[list[np.ndarray]] = field(init=False)
    init_outputs: list[np.ndarray] = field(init=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        self.nodes = regression_graph(self.rows, self.cols, self.outs)
        lr = np.array([self.lr], dtype=np.float32)
        self.batches = [[rng.standard_normal((self.rows, self.cols)).astype(np.float32), lr]
                        for _ in range(self.num_steps)]
        self.init_outputs = [np.zeros(d.out_shape, np.float32) for d, _ in self.nodes]
        self.init_outputs[3] = rng.standard_normal((self.cols, self.outs)).astype(np.float32)

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @functools.cached_property
    def structure_leaves(self) -> list[bytes]:
        return [structure_leaf(i, d.hash(), [s.as_tuple() for s in src]) for i, (d, src) in enumerate(self.nodes)]

    @functools.cached_property
    def graph_root(self) -> bytes:
        return merkle.merkle_root(self.structure_leaves)

    @functools.cached_property
    def batch_leaves(self) -> list[bytes]:
        return [batch_leaf([tensor.tensor_root(t) for t in b]) for b in self.batches]

    @functools.cached_property
    def batch_root(self) -> bytes:
        return merkle.merkle_root(self.batch_leaves)


@dataclass
class _KStep:
    inputs: list[list[np.ndarray]]
    input_roots: list[list[bytes]]
    outputs: list[np.ndarray]  # uint32 bits, flat
    output_roots: list[bytes]
    levels: list[list[bytes]]


class KernelWorld(LazySteps[_KStep]):
    """Execution of a KernelJob (honest, or with one micro-step fault)."""

    def __init__(self, job: KernelJob, fault: MicroFault | None = None) -> None:
        super().__init__()
        self.job = job
        self.fault = fault
        self.num_steps = job.num_steps
        self.num_nodes = job.num_nodes

    def _compute(self, s: int) -> _KStep:
        job = self.job
        if s == 0:
            outs = [tensor.as_bits(o).copy() for o in job.init_outputs]
            roots = [tensor.tensor_root(o) for o in outs]
            leaves = [tensor.node_hash(d, desc.hash(), [], [roots[d]]) for d, (desc, _) in enumerate(job.nodes)]
            return _KStep([[] for _ in job.nodes], [[] for _ in job.nodes], outs, roots, merkle.levels(leaves))
        prev = self._steps[s - 1]
        st = _KStep([], [], [], [], [])
        hashes = []
        for d, (desc, sources) in enumerate(job.nodes):
            ins = []
            for src in sources:
                if src.kind == SourceKind.BATCH:
                    ins.append(job.batches[s - 1][src.index])
                else:
                    at = st if src.kind == SourceKind.NODE_OUTPUT else prev
                    ins.append(at.outputs[src.index].view(np.float32))
            bits = tensor.as_bits(program.run_spec(desc, ins)).copy()
            f = self.fault
            if f is not None and (f.step, f.node) == (s, d):
                bits[f.element] = vm.State.decode(self._trace(s, d, f.element, ins)[-1]).regs[0]
            roots_in = [tensor.tensor_root(x) for x in ins]
            root_out = tensor.tensor_root(bits)
            st.inputs.append(ins)
            st.input_roots.append(roots_in)
            st.outputs.append(bits)
            st.output_roots.append(root_out)
            hashes.append(tensor.node_hash(d, desc.hash(), roots_in, [root_out]))
        st.levels = merkle.levels(hashes)
        return st

    def _trace(self, s: int, d: int, e: int, ins: Sequence[np.ndarray]) -> list[bytes]:
        desc = self.job.nodes[d][0]
        f = self.fault
        if f is None or (f.step, f.node, f.element) != (s, d, e):
            return [x.encode() for x in vm.run_states(desc, ins, e)]
        return [x.encode() for x in corrupted_trace(desc, list(ins), e, f.micro, f.bit)]

    # -- World ----------------------------------------------------------------------------------

    def step_commitment(self, s: int) -> bytes:
        return self._get(s).levels[-1][0]

    def node_levels(self, s: int) -> list[list[bytes]]:
        return self._get(s).levels

    def desc(self, s: int, d: int) -> bytes:
        return self.job.nodes[d][0].encode()

    def output_levels(self, s: int, d: int) -> list[list[bytes]]:
        leaves = [keccak256(bytes(c)) for c in tensor.chunks(self._get(s).outputs[d])]
        return merkle.levels(leaves)

    def output_chunk(self, s: int, d: int, leaf: int) -> bytes:
        return bytes(tensor.chunks(self._get(s).outputs[d])[leaf])

    def micro_steps(self, s: int, d: int) -> int:
        return int(self.job.nodes[d][0].num_steps)

    @functools.lru_cache(maxsize=32)  # noqa: B019 - a world lives as long as its games
    def _states(self, s: int, d: int, e: int) -> list[bytes]:
        return self._trace(s, d, e, self._get(s).inputs[d])

    def micro_state(self, s: int, d: int, e: int, j: int) -> bytes:
        return self._states(s, d, e)[j]

    def step_proof(self, s: int, d: int, e: int, j: int) -> bytes:
        pre = vm.State.decode(self.micro_state(s, d, e, j))
        return vm.prove_step(self.job.nodes[d][0], self._get(s).inputs[d], pre).proof

    def node_reveal(self, s: int, d: int) -> NodeReveal:
        job = self.job
        st = self._get(s)
        desc, sources = job.nodes[d]
        proofs = []
        for source in sources:
            idx = source.index
            if source.kind == SourceKind.BATCH:
                roots = tuple(tensor.tensor_root(t) for t in job.batches[s - 1])
                proofs.append(InputProof(batch_roots=roots, proof=tuple(merkle.merkle_proof(job.batch_leaves, s - 1))))
            else:
                src = self._get(s if source.kind == SourceKind.NODE_OUTPUT else s - 1)
                pre = NodePreimage(job.nodes[idx][0].hash(), tuple(src.input_roots[idx]), (src.output_roots[idx],))
                proofs.append(InputProof(node=pre, proof=tuple(merkle.proof_from_levels(src.levels, idx))))
        return NodeReveal(
            desc=desc.encode(),
            input_roots=tuple(st.input_roots[d]),
            output_root=st.output_roots[d],
            sources=tuple(src.as_tuple() for src in sources),
            graph_proof=tuple(merkle.merkle_proof(job.structure_leaves, d)),
            input_proofs=tuple(proofs),
        )
