"""Deterministic execution of a training graph, committing only the steps the protocol needs.

``StepExecutor.run_step(prev, batch)`` runs the nodes of one step in order on RepOps kernels and
computes every output tensor root, node hash ``node_hash(d, descHash, inputRoots, [outputRoot])``
and the step commitment ``C_s = step_commitment(node hashes)``; ``run_plain`` runs the same
kernels (same tensors) with no hashing and returns a ``PlainState`` without roots.

``TrainingRun`` drives steps 1..T. Verde's trainer answers bisection requests by re-executing from
its nearest stored checkpoint, so C_s of every step is not needed while training: the run commits
only the steps it must store or publish — checkpoint steps (``s % N == 0``), the last step of each
``run()`` call (C_T at the end) — and runs plain kernels in between. Every other C_j, node tensor,
element opening and micro-step trace is recomputed on request from the nearest checkpoint
(``recompute_step``), bit-identical to an every-step run: committing is a pure function of the
tensors, which are the same whether or not they were hashed. ``commit_every=True`` restores the
every-step behaviour (tests and tools that want all of C_0..C_T at once).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from verde_chain.commit import ElementOpening, node_hash, open_element, step_commitment, tensor_root
from verde_chain.graph.checkpoint import CheckpointStore
from verde_chain.graph.errors import GraphError, ShapeMismatchError
from verde_chain.graph.kernels import Runner, make_runner
from verde_chain.graph.structure import SourceKind, TrainingGraph
from verde_chain.repops import program

BatchFn = Callable[[int], np.ndarray]

# Chosen from scripts/bench_training.py (docs/benchmarks.md): the smallest of N = 10, 20, 50 at
# which commitments (hashing at the committed steps + waiting on checkpoint writes) stay within
# the 5% goal for both examples (N = 20: 8-14%, N = 50: 3.5-5%), while a full step-level
# bisection over T = 1,000 (k = 16) still re-executes at most 357 steps (~0.15 s digits, ~1.3 s
# transformer: nothing next to an on-chain move clock) and the trainer keeps 21 states.
DEFAULT_CHECKPOINT_INTERVAL = 50

_NODE, _PREV, _BATCH = int(SourceKind.NODE_OUTPUT), int(SourceKind.PREV_STEP_NODE_OUTPUT), int(SourceKind.BATCH)


@dataclass
class PlainState:
    """The state after a step: producer node index -> flat float32 tensor, and the roots known so
    far (empty after a plain step; ``StepExecutor.ensure_roots`` fills them in when needed)."""

    step: int
    tensors: dict[int, np.ndarray]
    roots: dict[int, bytes]


@dataclass
class StepState(PlainState):
    """A committed state: every tensor root and the step's commitment C_s."""

    commitment: bytes


@dataclass
class PlainStep:
    """One step executed without commitments (``StepExecutor.run_plain``)."""

    step: int
    outputs: list[np.ndarray]  # flat output of every node
    state: PlainState


@dataclass
class StepResult:
    step: int
    outputs: list[np.ndarray]  # flat output of every node
    roots: list[bytes]
    node_hashes: list[bytes]
    commitment: bytes
    batch_root: bytes
    state: StepState

    def output(self, graph: TrainingGraph, name: str) -> np.ndarray:
        d = graph.named[name]
        return self.outputs[d].reshape(graph.shapes.get(name, graph.nodes[d].desc.out_shape))


Tamper = Callable[[int, np.ndarray], np.ndarray]


class StepExecutor:
    def __init__(self, graph: TrainingGraph, runner: Runner | None = None) -> None:
        self.graph = graph
        self.runner = runner or make_runner()
        # per node, its inputs as plain (kind, index) pairs: the hot loop then does two int
        # compares per input instead of an enum compare and a method call
        self._wiring: list[tuple[tuple[int, int], ...]] = [
            tuple((int(s.kind), int(s.index)) for s in node.inputs) for node in graph.nodes
        ]
        self._producers = [s.producer for s in graph.states]

    def initial_state(self, state: Mapping[str, np.ndarray]) -> StepState:
        tensors, roots = {}, {}
        for slot in self.graph.states:
            arr = np.ascontiguousarray(state[slot.name], dtype=np.float32).reshape(-1)
            if arr.size != slot.numel:
                raise ShapeMismatchError(f"initial {slot.name!r} has {arr.size} elements, expected {slot.shape}")
            tensors[slot.producer] = arr
            roots[slot.producer] = tensor_root(arr)
        return StepState(0, tensors, roots, self.graph.initial_commitment(state))

    def ensure_roots(self, st: PlainState) -> dict[int, bytes]:
        """The state's tensor roots, computed now (and kept) if a plain step produced it."""
        for p in self._producers:
            if p not in st.roots:
                st.roots[p] = tensor_root(st.tensors[p])
        return st.roots

    def _inputs(self, d: int, prev: PlainState, outputs: list[np.ndarray], batch: np.ndarray) -> list[np.ndarray]:
        return [s.pick(outputs, prev.tensors, batch) for s in self.graph.nodes[d].inputs]

    def _batch(self, batch: np.ndarray) -> np.ndarray:
        batch = np.ascontiguousarray(batch, dtype=np.float32).reshape(-1)
        if batch.size != self.graph.batch_numel:
            raise ShapeMismatchError(f"batch has {batch.size} elements, graph expects {self.graph.batch_numel}")
        return batch

    def _execute(self, prev: PlainState, batch: np.ndarray, tamper: Tamper | None) -> list[np.ndarray]:
        """Every node's flat output, in node order (the kernels; no hashing)."""
        outputs: list[np.ndarray] = []
        prev_t = prev.tensors
        run = self.runner
        for node, wiring in zip(self.graph.nodes, self._wiring):
            ins = [outputs[i] if k == _NODE else prev_t[i] if k == _PREV else batch for k, i in wiring]
            out = run(node.desc, ins)
            if type(out) is not np.ndarray or out.dtype != np.float32 or not out.flags.c_contiguous:
                out = np.ascontiguousarray(out, dtype=np.float32)
            out = out.reshape(-1)
            if tamper is not None:
                out = tamper(node.index, out)
            outputs.append(out)
        return outputs

    def run_plain(self, prev: PlainState, batch: np.ndarray, tamper: Tamper | None = None) -> PlainStep:
        """Run one step's kernels only: the same tensors as ``run_step``, no roots or hashes."""
        outputs = self._execute(prev, self._batch(batch), tamper)
        return PlainStep(prev.step + 1, outputs, PlainState(prev.step + 1, {p: outputs[p] for p in self._producers}, {}))

    def run_step(self, prev: PlainState, batch: np.ndarray, tamper: Tamper | None = None) -> StepResult:
        """Run one step with every output root, node hash and C_s. ``tamper(d, output)`` (tests
        and adversarial agents only) may replace a node's output before it is committed and
        consumed — an honest run never passes it."""
        batch = self._batch(batch)
        outputs = self._execute(prev, batch, tamper)
        # committing is a pure function of the tensors above, so plain steps followed by one
        # committed step give the same bits as committing every step
        batch_root = tensor_root(batch)
        prev_roots = self.ensure_roots(prev)
        roots = [tensor_root(out) for out in outputs]
        hashes = [
            node_hash(
                node.index, node.desc_hash,
                [roots[i] if k == _NODE else prev_roots[i] if k == _PREV else batch_root for k, i in wiring],
                [roots[node.index]],
            )
            for node, wiring in zip(self.graph.nodes, self._wiring)
        ]
        c = step_commitment(hashes)
        producers = self._producers
        state = StepState(prev.step + 1, {p: outputs[p] for p in producers}, {p: roots[p] for p in producers}, c)
        return StepResult(prev.step + 1, outputs, roots, hashes, c, batch_root, state)


@dataclass
class StepLog:
    step: int
    commitment: bytes | None  # None for a plain step the run did not commit (see TrainingRun)
    loss: float
    wall_s: float


class Commitments(Mapping[int, bytes]):
    """C_0 .. C_s of the steps a run has executed so far, as a read-only mapping.

    Steps the run committed are answered from memory; any other C_j is recomputed from the
    nearest checkpoint on first access and kept. ``computed()`` is what is in memory now (what a
    run stores or publishes: C_0, the checkpoint steps, the last step) without recomputing."""

    def __init__(self, run: TrainingRun) -> None:
        self._run = run
        self._known: dict[int, bytes] = {}

    def _set(self, step: int, c: bytes) -> None:
        self._known[step] = c

    def computed(self) -> dict[int, bytes]:
        return dict(sorted(self._known.items()))

    def __getitem__(self, step: int) -> bytes:
        if not isinstance(step, (int, np.integer)) or not 0 <= step <= self._run.state.step:
            raise KeyError(step)
        step = int(step)
        if step not in self._known:
            self._known[step] = self._run.commitment(step)
        return self._known[step]

    def __iter__(self) -> Iterator[int]:
        # materialising the whole mapping: fill the gaps in one ascending sweep per checkpoint
        # interval instead of one recomputation per missing step
        self._run._fill_commitments(self._run.state.step)
        return iter(range(self._run.state.step + 1))

    def __len__(self) -> int:
        return self._run.state.step + 1

    def __contains__(self, step: object) -> bool:
        return isinstance(step, (int, np.integer)) and 0 <= int(step) <= self._run.state.step


class TrainingRun:
    """Steps 1..T of a job: commitments where needed, periodic verified checkpoints, recomputation
    on demand (see the module docstring for which steps are committed while training)."""

    def __init__(
        self,
        graph: TrainingGraph,
        init_state: Mapping[str, np.ndarray],
        batches: BatchFn,
        steps: int,
        checkpoint_interval: int = 0,
        out_dir: str | Path | None = None,
        runner: Runner | None = None,
        save_initial: bool = True,
        commit_every: bool = False,
    ) -> None:
        if steps < 1:
            raise GraphError(f"steps must be >= 1, got {steps}")
        if checkpoint_interval < 0:
            raise GraphError(f"checkpoint_interval must be >= 0, got {checkpoint_interval}")
        self.graph = graph
        self.exec = StepExecutor(graph, runner)
        self.batches = batches
        self.T = steps
        self.interval = checkpoint_interval
        self.commit_every = commit_every
        self.store = CheckpointStore(out_dir, graph) if out_dir is not None else None
        self.init = self.exec.initial_state(init_state)
        self.state: PlainState = self.init  # a StepState after run(), resume() and at the start
        self.commitments = Commitments(self)
        self.commitments._set(0, self.init.commitment)
        self.logs: list[StepLog] = []
        self._memory_ckpts: dict[int, StepState] = {0: self.init}
        self._loss = graph.named.get("loss")
        if self.store is not None and save_initial:
            self.store.save(self.init)

    @property
    def c0(self) -> bytes:
        return self.init.commitment

    def _is_checkpoint(self, step: int) -> bool:
        return bool(self.interval) and step % self.interval == 0

    def _checkpoint(self, st: PlainState) -> None:
        if self._is_checkpoint(st.step):
            assert isinstance(st, StepState)  # run() commits every checkpoint step
            if self.store is not None:
                self.store.save_async(st)  # overlaps the next steps; flushed at the end of run()
            else:
                self._memory_ckpts[st.step] = st

    def resume(self) -> int:
        """Continue from the latest stored checkpoint (verified); returns its step."""
        if self.store is None:
            raise GraphError("resume needs an out_dir with checkpoints")
        st = self.store.load_latest(self.T)
        self.state = st
        self.commitments._set(st.step, st.commitment)
        return st.step

    def run(self, until: int | None = None, progress: Callable[[StepLog], None] | None = None) -> bytes:
        """Execute steps up to ``until`` (default T) and return the last step's commitment."""
        end = self.T if until is None else min(until, self.T)
        while self.state.step < end:
            t0 = time.perf_counter()
            s = self.state.step + 1
            res: StepResult | PlainStep
            c: bytes | None = None
            if self.commit_every or s == end or self._is_checkpoint(s):
                res = self.exec.run_step(self.state, self.batches(s))
                c = res.commitment
                self.commitments._set(s, c)
            else:
                res = self.exec.run_plain(self.state, self.batches(s))
            self.state = res.state
            loss = float(res.outputs[self._loss][0]) if self._loss is not None else float("nan")
            log = StepLog(s, c, loss, time.perf_counter() - t0)
            self.logs.append(log)
            self._checkpoint(res.state)
            if progress is not None:
                progress(log)
        if self.store is not None:
            self.store.flush()  # run() returns with its checkpoints on disk (or raises)
            if self.state.step == self.T:
                self.store.write_index(self.commitments.computed())
        assert isinstance(self.state, StepState)  # the last step of a run() is always committed
        return self.state.commitment

    def _fill_commitments(self, end: int) -> None:
        """Compute every C_j, j <= ``end``, not yet known, in ascending sweeps from checkpoints."""
        known = self.commitments._known
        missing = [j for j in range(1, end + 1) if j not in known]
        st: PlainState | None = None
        for j in missing:
            if st is None or st.step != j - 1:
                st = self.state_at(j - 1)
            res = self.exec.run_step(st, self.batches(j))
            known[j] = res.commitment
            st = res.state

    # ------------------------------------------------------------------ recomputation
    def _nearest(self, step: int) -> PlainState:
        """A verified state at some step <= ``step`` (checkpoints on disk or in memory)."""
        if self.store is not None:
            return self.store.load_at_or_before(step)
        best = max(k for k in self._memory_ckpts if k <= step)
        return self._memory_ckpts[best]

    def state_at(self, step: int) -> PlainState:
        """The state after ``step``, re-executed with plain steps from the nearest checkpoint (a
        ``StepState`` when it is a checkpoint; ``ensure_roots`` gives the roots of any)."""
        if not 0 <= step <= self.T:
            raise GraphError(f"step {step} outside 0..{self.T}")
        st = self._nearest(step)
        while st.step < step:  # plain steps: the caller commits the one it needs
            st = self.exec.run_plain(st, self.batches(st.step + 1)).state
        return st

    def recompute_step(self, step: int) -> StepResult:
        """Re-execute step ``step`` >= 1 from the nearest checkpoint; every node's tensors."""
        if not 1 <= step <= self.T:
            raise GraphError(f"step {step} outside 1..{self.T}")
        prev = self.state_at(step - 1)
        return self.exec.run_step(prev, self.batches(step))

    def commitment(self, step: int) -> bytes:
        """C_step, recomputed from the nearest checkpoint (C_0 is the job's)."""
        if step == 0:
            return self.c0
        return self.recompute_step(step).commitment

    def node_tensors(self, step: int, d: int) -> tuple[list[np.ndarray], np.ndarray]:
        """(inputs, output) of node d at step ``step`` (tensors only: no hashing needed)."""
        if not 1 <= step <= self.T:
            raise GraphError(f"step {step} outside 1..{self.T}")
        prev = self.state_at(step - 1)
        res = self.exec.run_plain(prev, self.batches(step))
        ins = self.exec._inputs(d, prev, res.outputs, np.asarray(self.batches(step), dtype=np.float32).reshape(-1))
        return ins, res.outputs[d]

    def open_output(self, step: int, d: int, element: int) -> tuple[bytes, ElementOpening]:
        """(node d's output root, opening of one element with its Merkle proof)."""
        _, out = self.node_tensors(step, d)
        return tensor_root(out), open_element(out, element)

    def trace(self, step: int, d: int, element: int) -> list[program.Step]:
        """The micro-step trace of output element ``element`` of node d at step ``step``."""
        ins, _ = self.node_tensors(step, d)
        return program.trace(self.graph.nodes[d].desc, ins, element)
