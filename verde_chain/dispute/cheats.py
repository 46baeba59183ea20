"""Cheating trainers over a real training job, one lie each, first visible at a chosen game level.

Every class here is a :class:`~verde_chain.graph.world.TrainingWorld` (real RepOps execution,
real commitments, real ScalarVM traces) that departs from the honest execution at one step and
then carries on from what it did, as a cheater that wants its own commitments to hang together
would. It answers every question of the game from its own execution, so a player driving it
(``verde_chain.dispute.players``) makes the best moves that execution allows; where the referee
refuses them, the player cannot move and loses on time.

  level  world                      what the trainer did                                where the protocol stops it
  -----  -------------------------  --------------------------------------------------  --------------------------------
  L1     SkippedStepWorld           skipped step s: re-posted C_{s-1} as C_s, went on   L2 reveal: the batch opening is
                                                                                        step s-1's, not s's (InvalidProof)
  L2     DeviantNodeWorld (op)      ran another kernel at node d                        L2 reveal: structure not in the
                                                                                        graph root (InvalidProof), or, if
                                                                                        it claims the graph's kernel, the
                                                                                        preimage is wrong (NodeMismatch)
  L2     DeviantNodeWorld (wiring)  node d read another node's output                   L2 reveal: InputNotJustified
  L2     StaleInputWorld            read a parameter as it was one step earlier         L2 reveal: InputNotJustified
  L2     WrongBatchWorld            trained step s on another step's batch              L2 reveal: InputNotJustified
  L3     UnbackedElementWorld       wrote a wrong output element; its own trace of      L4 start: FinalValueMismatch
                                    that element computes the right value
  L3     DodgingWorld               committed a wrong output tensor, shows the honest   L3: ChunkMismatch / SubtreeMismatch
                                    chunk (or subtree) when asked
  L4     MicroStepWorld             one instruction of one element wrote a wrong        the one-step proof (ScalarVM)
                                    result; the rest of the trace and the step follow
  L4     TrainingWorld+OutputFault  the element's last micro-state is wrong             the one-step proof (ScalarVM)

Steps before the cheat are honest, so the challenger agrees with C_0 .. C_{s-1} and the game
narrows to step s. Tests: ``tests/dispute/test_levels_real.py``.

``TruncatedWorld`` (the bots' ``lazy`` trainer) wraps any world: it ran only the first k steps
and reports state k for every later step.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from verde_chain.commit import merkle, tensor
from verde_chain.commit.merkle import keccak256
from verde_chain.dispute.types import NodeReveal
from verde_chain.errors import VerdeError
from verde_chain.graph.executor import StepExecutor, StepResult, StepState
from verde_chain.graph.structure import GraphNode, Source, SourceKind, TrainingGraph
from verde_chain.graph.world import OutputFault, TrainingWorld
from verde_chain.repops.program import KernelDesc, instruction_at
from verde_chain.vm import scalarvm as vm


class CheatError(VerdeError):
    """A cheat that cannot be built as asked (it would not change anything, or has nothing to change)."""


class CheatWorld(TrainingWorld):
    """TrainingWorld whose step ``s`` is produced by :meth:`_run` (override it to cheat).

    The base class keeps only the last few steps; a cheater's steps depend on each other in
    ways the base class does not know, and the jobs here are tiny, so every step is kept.
    """

    def _result(self, s: int) -> StepResult:
        if s not in self._steps:
            self._steps[s] = self._run(s)
        return self._steps[s]

    def _run(self, s: int) -> StepResult:
        return self.exec.run_step(self._state(s - 1), self.batches(s), self._tamper(s))


# -- L1 -------------------------------------------------------------------------------------------


class SkippedStepWorld(CheatWorld):
    """A lazy trainer: it skips step ``skip`` (its state stays the one after ``skip - 1``),
    posts C_{skip-1} again as C_skip and trains the later steps honestly from the stale state.
    Asked to reveal a node of C_skip, all it has is that node as step ``skip - 1`` computed it,
    with that step's input justifications."""

    def __init__(self, graph: TrainingGraph, init_state: Mapping[str, np.ndarray], batches: Callable[[int], np.ndarray],
                 steps: int, *, skip: int) -> None:
        super().__init__(graph, init_state, batches, steps)
        if not 2 <= skip <= self.num_steps:
            # C_0 is the job's pseudo step (no node has inputs): a step-1 skip would reveal nothing.
            raise CheatError(f"skip must be in 2..{self.num_steps}, got {skip}")
        self.skip = skip

    def _run(self, s: int) -> StepResult:
        if s == self.skip:
            return self._result(s - 1)
        return super()._run(s)

    def node_reveal(self, s: int, d: int) -> NodeReveal:
        return super().node_reveal(s - 1 if s == self.skip else s, d)


# -- L2 -------------------------------------------------------------------------------------------


class _DeviantStepWorld(CheatWorld):
    """At step ``step`` the trainer runs ``cheat_graph`` (same nodes but node ``node``) on
    ``prev``/``batch`` of its choosing. At L2 it reveals node ``node`` as it ran it (its descriptor,
    the input roots it read, its output) with the job's wiring and structure proof — the only
    proofs that exist."""

    step: int
    node: int

    def __init__(self, graph: TrainingGraph, init_state: Mapping[str, np.ndarray], batches: Callable[[int], np.ndarray],
                 steps: int, *, step: int, node: int, cheat_graph: TrainingGraph | None = None) -> None:
        super().__init__(graph, init_state, batches, steps)
        if not 1 <= step <= steps:
            raise CheatError(f"step must be in 1..{steps}, got {step}")
        self.step = step
        self.node = node
        self.cheat_exec = StepExecutor(cheat_graph or graph, self.exec.runner)

    def _prev_for_cheat(self, s: int) -> StepState:
        return self._state(s - 1)

    def _batch_for_cheat(self, s: int) -> np.ndarray:
        return self.batches(s)

    def _run(self, s: int) -> StepResult:
        if s != self.step:
            return super()._run(s)
        return self.cheat_exec.run_step(self._prev_for_cheat(s), self._batch_for_cheat(s))

    def cheat_input_roots(self) -> list[bytes]:
        """The input roots node ``node`` really read at step ``step`` (what its hash commits to)."""
        s, res = self.step, self._result(self.step)
        prev = self._prev_for_cheat(s)
        return [src.pick(res.roots, prev.roots, res.batch_root) for src in self.cheat_exec.graph.nodes[self.node].inputs]

    def node_reveal(self, s: int, d: int) -> NodeReveal:
        r = super().node_reveal(s, d)
        if (s, d) != (self.step, self.node):
            return r
        desc = self.cheat_exec.graph.nodes[d].desc
        return dataclasses.replace(r, desc=desc.encode(), input_roots=tuple(self.cheat_input_roots()))


def _replace_node(graph: TrainingGraph, d: int, desc: KernelDesc | None = None,
                  inputs: tuple[Source, ...] | None = None) -> TrainingGraph:
    old = graph.nodes[d]
    new_desc = desc or old.desc
    node = GraphNode(old.index, new_desc, keccak256(new_desc.encode()), inputs or old.inputs, old.label + "*")
    return dataclasses.replace(graph, nodes=graph.nodes[:d] + (node,) + graph.nodes[d + 1 :])


class DeviantNodeWorld(_DeviantStepWorld):
    """Node ``node`` at step ``step`` runs ``desc`` instead of the graph's kernel (wrong op or
    attribute), and/or reads ``inputs`` instead of the graph's sources (wrong wiring)."""

    def __init__(self, graph: TrainingGraph, init_state: Mapping[str, np.ndarray], batches: Callable[[int], np.ndarray],
                 steps: int, *, step: int, node: int, desc: KernelDesc | None = None,
                 inputs: tuple[Source, ...] | None = None, claim_graph_node: bool = False) -> None:
        if desc is None and inputs is None:
            raise CheatError("a deviant node needs another descriptor or other inputs")
        super().__init__(graph, init_state, batches, steps, step=step, node=node,
                         cheat_graph=_replace_node(graph, node, desc, inputs))
        # Reveal the graph's descriptor and the inputs the graph's wiring gives, as if it had run
        # the right node (then the preimage does not hash to its leaf: NodeMismatch).
        self.claim_graph_node = claim_graph_node

    def node_reveal(self, s: int, d: int) -> NodeReveal:
        if self.claim_graph_node:
            return TrainingWorld.node_reveal(self, s, d)
        return super().node_reveal(s, d)


class StaleInputWorld(_DeviantStepWorld):
    """At step ``step`` the trainer reads parameter/optimizer state ``producer`` as it was after
    step ``step - 2`` (a stale copy: it missed one update). ``node`` is the first node that reads
    it (the one the honest challenger's descent ends on)."""

    def __init__(self, graph: TrainingGraph, init_state: Mapping[str, np.ndarray], batches: Callable[[int], np.ndarray],
                 steps: int, *, step: int, producer: int) -> None:
        if step < 2:
            raise CheatError("a stale input needs a step before the previous one (step >= 2)")
        readers = [n.index for n in graph.nodes
                   if Source(SourceKind.PREV_STEP_NODE_OUTPUT, producer) in n.inputs]
        if not readers:
            raise CheatError(f"no node reads node {producer}'s previous-step output")
        super().__init__(graph, init_state, batches, steps, step=step, node=readers[0])
        self.producer = producer

    def _prev_for_cheat(self, s: int) -> StepState:
        prev, stale = self._state(s - 1), self._state(s - 2)
        return dataclasses.replace(
            prev,
            tensors={**prev.tensors, self.producer: stale.tensors[self.producer]},
            roots={**prev.roots, self.producer: stale.roots[self.producer]},
        )


class WrongBatchWorld(_DeviantStepWorld):
    """Step ``step`` is trained on the batch of step ``batch_of`` (a data-loader cheat: the same
    batch twice). ``node`` is the first node that reads the batch."""

    def __init__(self, graph: TrainingGraph, init_state: Mapping[str, np.ndarray], batches: Callable[[int], np.ndarray],
                 steps: int, *, step: int, batch_of: int) -> None:
        if batch_of == step:
            raise CheatError("the wrong batch must be another step's")
        readers = [n.index for n in graph.nodes if any(src.kind == SourceKind.BATCH for src in n.inputs)]
        super().__init__(graph, init_state, batches, steps, step=step, node=readers[0])
        self.batch_of = batch_of

    def _batch_for_cheat(self, s: int) -> np.ndarray:
        return self.batches(self.batch_of)


# -- L3 -------------------------------------------------------------------------------------------


class UnbackedElementWorld(TrainingWorld):
    """The committed output tensor has element ``fault.element`` flipped (the tensor root, the
    node hash and C_s are all consistent with it), but the trainer's micro-step trace of that
    element is the honest one: its final state decodes to the true value, not the claimed one."""

    def __init__(self, graph: TrainingGraph, init_state: Mapping[str, np.ndarray], batches: Callable[[int], np.ndarray],
                 steps: int, *, fault: OutputFault) -> None:
        super().__init__(graph, init_state, batches, steps, fault)

    @functools.lru_cache(maxsize=16)  # noqa: B019 - a world lives as long as its game
    def _states(self, s: int, d: int, e: int) -> list[vm.State]:
        return vm.run_states(self.graph.nodes[d].desc, self._inputs(s, d), e)


class Dodge(enum.StrEnum):
    """What a DodgingWorld shows honestly when asked at L3."""

    CHUNK = "chunk"  # the leaf chunk
    SUBTREE = "subtree"  # the subtree layers of the output tree


class DodgingWorld(TrainingWorld):
    """Commits the tensor with element ``fault.element`` flipped, then, asked at L3, shows the
    honest leaf chunk (``Dodge.CHUNK``) or the honest subtree layers (``Dodge.SUBTREE``)."""

    def __init__(self, graph: TrainingGraph, init_state: Mapping[str, np.ndarray], batches: Callable[[int], np.ndarray],
                 steps: int, *, fault: OutputFault, dodge: Dodge | str) -> None:
        try:
            self.dodge = Dodge(dodge)
        except ValueError:
            raise CheatError(f"dodge must be one of {', '.join(Dodge)}, got {dodge!r}") from None
        super().__init__(graph, init_state, batches, steps, fault)

    def _faulty(self, s: int, d: int) -> bool:
        assert self.fault is not None
        return (s, d) == (self.fault.step, self.fault.node)

    def _honest_output(self, s: int, d: int) -> np.ndarray:
        assert self.fault is not None
        out = self._output(s, d).copy()
        out.view(np.uint32)[self.fault.element] ^= np.uint32(1 << self.fault.bit)
        return out

    def output_levels(self, s: int, d: int) -> list[list[bytes]]:
        if self.dodge == Dodge.SUBTREE and self._faulty(s, d):
            return merkle.levels(tensor.tensor_leaves(self._honest_output(s, d)))
        return super().output_levels(s, d)

    def output_chunk(self, s: int, d: int, leaf: int) -> bytes:
        if self._faulty(s, d):
            return bytes(tensor.chunks(tensor.as_bits(self._honest_output(s, d)))[leaf])
        return super().output_chunk(s, d, leaf)


# -- L4 -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MicroFault:
    """Micro-step ``micro`` (1..N: the instruction that produces state ``micro``) of element
    ``element`` of node ``node`` at step ``step`` writes its result with bit ``bit`` flipped."""

    step: int
    node: int
    element: int
    micro: int
    bit: int = 22


def corrupted_trace(desc: KernelDesc, inputs: list[np.ndarray], element: int, micro: int, bit: int) -> list[vm.State]:
    """s_0 .. s_N of ``element`` when instruction ``micro - 1`` writes a wrong result (its
    destination register with ``bit`` flipped) and execution goes on from there."""
    if not 1 <= micro <= desc.num_steps:
        raise CheatError(f"micro must be in 1..{desc.num_steps}, got {micro}")
    states = vm.run_states(desc, inputs, element)[:micro + 1]
    instr, _ = instruction_at(desc, micro - 1)
    last = states[micro]
    regs = list(last.regs)
    regs[instr.dst] ^= 1 << bit
    states[micro] = dataclasses.replace(last, regs=tuple(regs))
    while len(states) <= desc.num_steps:
        states.append(vm.prove_step(desc, inputs, states[-1]).post)
    return states


class MicroStepWorld(CheatWorld):
    """One instruction of one element goes wrong (a miscompiled kernel, a flaky FMA); the trainer
    keeps the wrong value: the output element is the corrupted trace's result and every later
    node and step uses it."""

    def __init__(self, graph: TrainingGraph, init_state: Mapping[str, np.ndarray], batches: Callable[[int], np.ndarray],
                 steps: int, *, micro_fault: MicroFault) -> None:
        super().__init__(graph, init_state, batches, steps)
        self.micro_fault = micro_fault

    @functools.cached_property
    def _bad_trace(self) -> list[vm.State]:
        f = self.micro_fault
        honest = super()._run(f.step)  # nodes before f.node are the same in both runs
        batch = np.asarray(self.batches(f.step), dtype=np.float32).reshape(-1)
        ins = self.exec.node_inputs(f.node, self._state(f.step - 1), honest.outputs, batch)
        bad = corrupted_trace(self.graph.nodes[f.node].desc, ins, f.element, f.micro, f.bit)
        if bad[-1].regs[0] == vm.run_states(self.graph.nodes[f.node].desc, ins, f.element)[-1].regs[0]:
            raise CheatError(f"{f} does not change the element's value: choose another bit or micro-step")
        return bad

    def _run(self, s: int) -> StepResult:
        f = self.micro_fault
        if s != f.step:
            return super()._run(s)
        value = np.uint32(self._bad_trace[-1].regs[0])

        def tamper(d: int, out: np.ndarray) -> np.ndarray:
            if d != f.node:
                return out
            bad = out.copy()
            bad.view(np.uint32)[f.element] = value
            return bad

        return self.exec.run_step(self._state(s - 1), self.batches(s), tamper)

    @functools.lru_cache(maxsize=16)  # noqa: B019 - a world lives as long as its game
    def _states(self, s: int, d: int, e: int) -> list[vm.State]:
        f = self.micro_fault
        if (s, d, e) == (f.step, f.node, f.element):
            return self._bad_trace
        return super()._states(s, d, e)


class TruncatedWorld:
    """A trainer that ran only the first `k` steps of ``inner`` and reports state k for every
    later step (its L2..L4 answers for such a step come from step max(1, k))."""

    def __init__(self, inner: TrainingWorld, k: int) -> None:
        self.inner = inner
        self.k = k
        self.num_steps = inner.num_steps
        self.num_nodes = inner.num_nodes
        self.graph = inner.graph

    def _s(self, s: int) -> int:
        return min(s, self.k)

    def step_commitment(self, s: int) -> bytes:
        return self.inner.step_commitment(self._s(s))

    def node_levels(self, s: int) -> list[list[bytes]]:
        return self.inner.node_levels(self._s(s))

    def node_reveal(self, s: int, d: int) -> NodeReveal:
        return self.inner.node_reveal(max(1, self._s(s)), d)

    def desc(self, s: int, d: int) -> bytes:
        return self.inner.desc(s, d)

    def output_levels(self, s: int, d: int) -> list[list[bytes]]:
        return self.inner.output_levels(max(1, self._s(s)), d)

    def output_chunk(self, s: int, d: int, leaf: int) -> bytes:
        return self.inner.output_chunk(max(1, self._s(s)), d, leaf)

    def micro_steps(self, s: int, d: int) -> int:
        return self.inner.micro_steps(s, d)

    def micro_state(self, s: int, d: int, e: int, j: int) -> bytes:
        return self.inner.micro_state(max(1, self._s(s)), d, e, j)

    def step_proof(self, s: int, d: int, e: int, j: int) -> bytes:
        return self.inner.step_proof(max(1, self._s(s)), d, e, j)
