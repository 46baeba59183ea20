"""Deterministic execution of a training graph with commitments, checkpoints and recomputation.

``StepExecutor.run_step`` runs the nodes of one step in order on RepOps kernels, computes every
output tensor root, node hash ``node_hash(d, descHash, inputRoots, [outputRoot])`` and the step
commitment ``C_s = step_commitment(node hashes)``. ``TrainingRun`` drives steps 1..T, stores the
full state every ``checkpoint_interval`` steps (``checkpoint.py``: verified on load) and answers
the questions a dispute asks: any C_j, any node's tensors, element openings with proofs, and the
micro-step trace of one output element.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from verde_chain.commit import ElementOpening, node_hash, open_element, step_commitment, tensor_root
from verde_chain.graph.checkpoint import CheckpointStore
from verde_chain.graph.errors import GraphError, ShapeMismatchError
from verde_chain.graph.kernels import Runner, make_runner
from verde_chain.graph.structure import TrainingGraph
from verde_chain.repops import program

BatchFn = Callable[[int], np.ndarray]


@dataclass
class StepState:
    """The state after a step: producer node index -> (flat float32 tensor, its root)."""

    step: int
    tensors: dict[int, np.ndarray]
    roots: dict[int, bytes]
    commitment: bytes


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


class StepExecutor:
    def __init__(self, graph: TrainingGraph, runner: Runner | None = None) -> None:
        self.graph = graph
        self.runner = runner or make_runner()

    def initial_state(self, state: Mapping[str, np.ndarray]) -> StepState:
        tensors, roots = {}, {}
        for slot in self.graph.states:
            arr = np.ascontiguousarray(state[slot.name], dtype=np.float32).reshape(-1)
            if arr.size != slot.numel:
                raise ShapeMismatchError(f"initial {slot.name!r} has {arr.size} elements, expected {slot.shape}")
            tensors[slot.producer] = arr
            roots[slot.producer] = tensor_root(arr)
        return StepState(0, tensors, roots, self.graph.initial_commitment(state))

    def _inputs(self, d: int, prev: StepState, outputs: list[np.ndarray], batch: np.ndarray) -> list[np.ndarray]:
        return [s.pick(outputs, prev.tensors, batch) for s in self.graph.nodes[d].inputs]

    def run_step(
        self, prev: StepState, batch: np.ndarray, tamper: Callable[[int, np.ndarray], np.ndarray] | None = None
    ) -> StepResult:
        """Run one step. ``tamper(d, output)`` (tests and adversarial agents only) may replace a
        node's output before it is committed and consumed — an honest run never passes it."""
        batch = np.ascontiguousarray(batch, dtype=np.float32).reshape(-1)
        if batch.size != self.graph.batch_numel:
            raise ShapeMismatchError(f"batch has {batch.size} elements, graph expects {self.graph.batch_numel}")
        batch_root = tensor_root(batch)
        outputs: list[np.ndarray] = []
        roots: list[bytes] = []
        hashes: list[bytes] = []
        for node in self.graph.nodes:
            ins = self._inputs(node.index, prev, outputs, batch)
            out = np.ascontiguousarray(self.runner(node.desc, ins), dtype=np.float32).reshape(-1)
            if tamper is not None:
                out = tamper(node.index, out)
            r = tensor_root(out)
            in_roots = [s.pick(roots, prev.roots, batch_root) for s in node.inputs]
            outputs.append(out)
            roots.append(r)
            hashes.append(node_hash(node.index, node.desc_hash, in_roots, [r]))
        c = step_commitment(hashes)
        producers = [s.producer for s in self.graph.states]
        state = StepState(prev.step + 1, {p: outputs[p] for p in producers}, {p: roots[p] for p in producers}, c)
        return StepResult(prev.step + 1, outputs, roots, hashes, c, batch_root, state)


@dataclass
class StepLog:
    step: int
    commitment: bytes
    loss: float
    wall_s: float


class TrainingRun:
    """Steps 1..T of a job: commitments, periodic verified checkpoints, recomputation on demand."""

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
    ) -> None:
        if steps < 1:
            raise GraphError(f"steps must be >= 1, got {steps}")
        self.graph = graph
        self.exec = StepExecutor(graph, runner)
        self.batches = batches
        self.T = steps
        self.interval = checkpoint_interval
        self.store = CheckpointStore(out_dir, graph) if out_dir is not None else None
        self.init = self.exec.initial_state(init_state)
        self.commitments: dict[int, bytes] = {0: self.init.commitment}
        self.logs: list[StepLog] = []
        self.state = self.init
        self._memory_ckpts: dict[int, StepState] = {0: self.init}
        if self.store is not None and save_initial:
            self.store.save(self.init)

    @property
    def c0(self) -> bytes:
        return self.init.commitment

    def _checkpoint(self, st: StepState) -> None:
        if self.interval and st.step % self.interval == 0:
            if self.store is not None:
                self.store.save(st)
            else:
                self._memory_ckpts[st.step] = st

    def resume(self) -> int:
        """Continue from the latest stored checkpoint (verified); returns its step."""
        if self.store is None:
            raise GraphError("resume needs an out_dir with checkpoints")
        st = self.store.load_latest(self.T)
        self.state = st
        self.commitments[st.step] = st.commitment
        return st.step

    def run(self, until: int | None = None, progress: Callable[[StepLog], None] | None = None) -> bytes:
        end = self.T if until is None else min(until, self.T)
        while self.state.step < end:
            t0 = time.perf_counter()
            s = self.state.step + 1
            res = self.exec.run_step(self.state, self.batches(s))
            self.state = res.state
            self.commitments[s] = res.commitment
            log = StepLog(s, res.commitment, float(res.outputs[self.graph.named["loss"]][0]) if "loss" in self.graph.named else float("nan"), time.perf_counter() - t0)
            self.logs.append(log)
            self._checkpoint(res.state)
            if progress is not None:
                progress(log)
        if self.store is not None and self.state.step == self.T:
            self.store.write_index({k: v for k, v in sorted(self.commitments.items())})
        return self.state.commitment

    # ------------------------------------------------------------------ recomputation
    def _nearest(self, step: int) -> StepState:
        """A verified state at some step <= ``step`` (checkpoints on disk or in memory)."""
        if self.store is not None:
            return self.store.load_at_or_before(step)
        best = max(k for k in self._memory_ckpts if k <= step)
        return self._memory_ckpts[best]

    def state_at(self, step: int) -> StepState:
        if not 0 <= step <= self.T:
            raise GraphError(f"step {step} outside 0..{self.T}")
        st = self._nearest(step)
        while st.step < step:
            st = self.exec.run_step(st, self.batches(st.step + 1)).state
        return st

    def recompute_step(self, step: int) -> StepResult:
        """Re-execute step ``step`` >= 1 from the nearest checkpoint; every node's tensors."""
        if not 1 <= step <= self.T:
            raise GraphError(f"step {step} outside 1..{self.T}")
        prev = self.state_at(step - 1)
        return self.exec.run_step(prev, self.batches(step))

    def commitment(self, step: int) -> bytes:
        if step == 0:
            return self.c0
        return self.recompute_step(step).commitment

    def node_tensors(self, step: int, d: int) -> tuple[list[np.ndarray], np.ndarray]:
        """(inputs, output) of node d at step ``step``."""
        res, prev = self._with_prev(step)
        ins = self.exec._inputs(d, prev, res.outputs, np.asarray(self.batches(step), dtype=np.float32).reshape(-1))
        return ins, res.outputs[d]

    def _with_prev(self, step: int) -> tuple[StepResult, StepState]:
        prev = self.state_at(step - 1)
        return self.exec.run_step(prev, self.batches(step)), prev

    def open_output(self, step: int, d: int, element: int) -> tuple[bytes, ElementOpening]:
        """(node d's output root, opening of one element with its Merkle proof)."""
        _, out = self.node_tensors(step, d)
        return tensor_root(out), open_element(out, element)

    def trace(self, step: int, d: int, element: int) -> list[program.Step]:
        """The micro-step trace of output element ``element`` of node d at step ``step``."""
        ins, _ = self.node_tensors(step, d)
        return program.trace(self.graph.nodes[d].desc, ins, element)
