"""A training job as the dispute game's ``World``: every claim a player needs, from real execution.

``verde_chain.dispute.players`` drive a game from a World (``verde_chain/dispute/world.py``); the
tests there use a toy. ``TrainingWorld`` answers the same questions from the RepOps executor: step
commitments, node-tree levels, node reveals with every input justified (structure proof in the
graph root, NODE_OUTPUT in C_s, PREV_STEP in C_{s-1} or C_0's pseudo nodes, BATCH in batchRoot),
output trees and chunks, and the ScalarVM states and step proofs of one element
(``verde_chain.vm.scalarvm``).

Like a trainer, the world keeps the state of every checkpoint step (every ``checkpoint_interval``-th
step, and T) once it has trained, plus the last few states a dispute asked for, and re-executes any
other step from the nearest of those. Level 1 splits at checkpoints first (``bisection.split_points``),
so a full bisection re-executes about one checkpoint interval; ``executed`` counts every step run.

An :class:`OutputFault` makes a dishonest world: the trainer flips one bit of one output element
of one node at one step and carries on from the corrupted tensor (so every later commitment is
wrong too). Its micro-step trace of that element is honest except the final state, whose r0 is
the claimed (flipped) value — a lie in the last instruction.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from verde_chain.commit import merkle, tensor
from verde_chain.dispute.types import InputProof, NodePreimage, NodeReveal
from verde_chain.graph.backend import Runner
from verde_chain.graph.data import batch_leaf, batch_root_list
from verde_chain.graph.errors import JobSpecError
from verde_chain.graph.executor import StepExecutor, StepResult, StepState, detached
from verde_chain.graph.structure import SourceKind, TrainingGraph
from verde_chain.vm import scalarvm as vm

if TYPE_CHECKING:
    from verde_chain.job import Job


@dataclass(frozen=True)
class OutputFault:
    step: int
    node: int
    element: int
    bit: int = 0


RECENT_STATES = 64  # states of recently requested steps kept (a bisection round's split points)


class TrainingWorld:
    def __init__(
        self,
        graph: TrainingGraph,
        init_state: Mapping[str, np.ndarray],
        batches: Callable[[int], np.ndarray],
        steps: int,
        fault: OutputFault | None = None,
        runner: Runner | None = None,
        checkpoint_interval: int = 0,
    ) -> None:
        self.graph = graph
        self.exec = StepExecutor(graph, runner)
        self.batches = batches
        self.num_steps = steps
        self.num_nodes = len(graph.nodes)
        self.fault = fault
        self.interval = checkpoint_interval
        self.init = self.exec.initial_state(init_state)
        self.init_leaves = graph.initial_leaves(init_state)
        self._steps: dict[int, StepResult] = {}
        self._ckpts: dict[int, StepState] = {0: self.init}  # the checkpoints it stored while training
        self._recent: OrderedDict[int, StepState] = OrderedDict()  # states of recently requested steps
        self.executed = 0  # steps run so far (training and every re-execution)
        self.structure_leaves = graph.structure_leaves()
        self.batch_roots = [tensor.tensor_root(np.asarray(batches(s), dtype=np.float32)) for s in range(1, steps + 1)]
        self.batch_leaves = [batch_leaf([r]) for r in self.batch_roots]

    @classmethod
    def from_job(cls, job: Job, fault: OutputFault | None = None, runner: Runner | None = None) -> TrainingWorld:
        """The world of a posted job (checks that the batches are the ones the job committed to)."""
        w = cls(job.program.graph, job.init_state, job.batch, job.spec.steps, fault, runner,
                job.spec.checkpoint_interval)
        if batch_root_list(w.batch_roots) != job.spec.batch_root:
            raise JobSpecError("the job's batches do not match its batchRoot")
        return w

    def adopt(self, st: StepState) -> None:
        """Keep a verified state computed elsewhere (a checkpoint of the same job's run) as if
        this world had trained to it."""
        self._ckpts[st.step] = st

    # ------------------------------------------------------------------ execution
    def _tamper(self, s: int) -> Callable[[int, np.ndarray], np.ndarray] | None:
        f = self.fault
        if f is None or f.step != s:
            return None

        def tamper(d: int, out: np.ndarray) -> np.ndarray:
            if d != f.node:
                return out
            bad = out.copy()
            bad.view(np.uint32)[f.element] ^= np.uint32(1 << f.bit)
            return bad

        return tamper

    def _kept(self, s: int) -> StepState | None:
        if s in self._steps:
            return self._steps[s].state
        return self._ckpts.get(s) or self._recent.get(s)

    def _state(self, s: int) -> StepState:
        return self._kept(s) or self._result(s).state

    def _is_checkpoint(self, s: int) -> bool:
        return s == self.num_steps or (self.interval > 0 and s % self.interval == 0)

    def _result(self, s: int) -> StepResult:
        if s not in self._steps:
            # re-execute from the nearest state kept below s (a checkpoint or a recent request)
            start = max(k for k in (*self._steps, *self._ckpts, *self._recent) if k < s)
            for t in range(start + 1, s + 1):
                self._steps[t] = self.exec.run_step(self._state(t - 1), self.batches(t), self._tamper(t))
                self.executed += 1
                if self._is_checkpoint(t) and t not in self._ckpts:
                    self._ckpts[t] = detached(self._steps[t].state)
                # keep memory bounded: the game only walks forward through nearby steps
                for old in [k for k in self._steps if k < t - 2 and k not in (s - 1, s)]:
                    del self._steps[old]
            self._recent[s] = detached(self._steps[s].state)
            while len(self._recent) > RECENT_STATES:
                self._recent.popitem(last=False)
        return self._steps[s]

    def input_roots(self, s: int, d: int) -> list[bytes]:
        res = self._result(s)
        prev = self._state(s - 1)
        return [src.pick(res.roots, prev.roots, res.batch_root) for src in self.graph.nodes[d].inputs]

    def _inputs(self, s: int, d: int) -> list[np.ndarray]:
        res = self._result(s)
        batch = np.asarray(self.batches(s), dtype=np.float32).reshape(-1)
        return self.exec.node_inputs(d, self._state(s - 1), res.outputs, batch)

    def _output(self, s: int, d: int) -> np.ndarray:
        return self._result(s).outputs[d]

    # ------------------------------------------------------------------ World
    def step_commitment(self, s: int) -> bytes:
        kept = self._kept(s)
        return kept.commitment if kept is not None else self._result(s).commitment

    def node_levels(self, s: int) -> list[list[bytes]]:
        leaves = self.init_leaves if s == 0 else self._result(s).node_hashes
        return merkle.levels(list(leaves))

    def desc(self, s: int, d: int) -> bytes:
        return self.graph.nodes[d].desc.encode()

    def _preimage(self, s: int, d: int) -> NodePreimage:
        node = self.graph.nodes[d]
        if s == 0:
            return NodePreimage(node.desc_hash, (), (self.init.roots[d],))
        return NodePreimage(node.desc_hash, tuple(self.input_roots(s, d)), (self._result(s).roots[d],))

    def node_reveal(self, s: int, d: int) -> NodeReveal:
        node = self.graph.nodes[d]
        proofs = []
        for src in node.inputs:
            if src.kind == SourceKind.BATCH:
                proofs.append(InputProof(
                    batch_roots=(self.batch_roots[s - 1],),
                    proof=tuple(merkle.merkle_proof(self.batch_leaves, s - 1)),
                ))
            else:
                at = s if src.kind == SourceKind.NODE_OUTPUT else s - 1
                leaves = self.init_leaves if at == 0 else self._result(at).node_hashes
                proofs.append(InputProof(
                    node=self._preimage(at, src.index), proof=tuple(merkle.merkle_proof(list(leaves), src.index))
                ))
        return NodeReveal(
            desc=node.desc.encode(),
            input_roots=tuple(self.input_roots(s, d)),
            output_root=self._result(s).roots[d],
            sources=tuple(src.as_tuple() for src in node.inputs),
            graph_proof=tuple(merkle.merkle_proof(self.structure_leaves, d)),
            input_proofs=tuple(proofs),
        )

    def output_levels(self, s: int, d: int) -> list[list[bytes]]:
        return merkle.levels(tensor.tensor_leaves(self._output(s, d)))

    def output_chunk(self, s: int, d: int, leaf: int) -> bytes:
        return bytes(self._chunks(s, d)[leaf])

    # Chunked once per output: a result's opening reads every chunk of each parameter in turn,
    # and re-chunking the whole tensor per chunk made that quadratic (minutes for resnet18).
    @functools.lru_cache(maxsize=4)  # noqa: B019 - a world lives as long as its game
    def _chunks(self, s: int, d: int) -> np.ndarray:
        return tensor.chunks(tensor.as_bits(self._output(s, d)))

    def micro_steps(self, s: int, d: int) -> int:
        return self.graph.nodes[d].desc.num_steps

    @functools.lru_cache(maxsize=16)  # noqa: B019 - a world lives as long as its game
    def _states(self, s: int, d: int, e: int) -> list[vm.State]:
        states = vm.run_states(self.graph.nodes[d].desc, self._inputs(s, d), e)
        f = self.fault
        if f is not None and (f.step, f.node, f.element) == (s, d, e):
            last = states[-1]
            regs = list(last.regs)
            regs[0] ^= 1 << f.bit
            states[-1] = vm.State(last.desc_hash, last.element, last.step, tuple(regs))
        return states

    def micro_state(self, s: int, d: int, e: int, j: int) -> bytes:
        return self._states(s, d, e)[j].encode()

    def step_proof(self, s: int, d: int, e: int, j: int) -> bytes:
        desc = self.graph.nodes[d].desc
        pre = self._states(s, d, e)[j]
        return vm.prove_step(desc, self._inputs(s, d), pre).proof
