"""Deterministic execution of a training graph, committing only the steps the protocol needs.

``StepExecutor.run_step(prev, batch)`` runs the nodes of one step in order on RepOps kernels and
computes every output tensor root, node hash ``node_hash(d, descHash, inputRoots, [outputRoot])``
and the step commitment ``C_s = step_commitment(node hashes)``; ``run_plain`` runs the same
kernels (same tensors) with no hashing and returns a ``PlainState`` without roots. With a runner
that offers ``compile_step`` (the C++ backend) the whole step is ONE native call writing every
node output into one arena (same bits as node by node; docs/training.md §4), and a committed
step hashes every root and node hash in two more. ``keep`` (run_plain, run_step) names the node
outputs the caller will read: with it the step runs on a SHARED layout (native.ArenaLayout)
that keeps only those and the state, the other outputs sharing memory by liveness and hashed
inside the step before their memory is reused; the roots, node hashes and C_s are the same.

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
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from verde_chain.commit import ElementOpening, open_element, step_commitment, tensor_root
from verde_chain.commit.native import NodeWiring, arena_roots, node_hashes, tensor_roots
from verde_chain.graph.backend import Runner, make_runner
from verde_chain.graph.checkpoint import CheckpointStore
from verde_chain.graph.errors import GraphError, ShapeMismatchError
from verde_chain.graph.structure import SourceKind, TrainingGraph
from verde_chain.repops import program

BatchFn = Callable[[int], np.ndarray]
_NOT_RUN = np.zeros(0, dtype=np.float32)  # a node output not (yet) computed in this process

# Chosen from scripts/bench_training.py (docs/benchmarks.md): with the whole-step kernel a plain
# step costs less than torch eager, so hashing a committed step (~2-3x a plain step: every node
# output's root at ~1.4 GB/s) is what an interval must amortise. N = 100 (Verde's own setting) is
# the smallest of 20 / 50 / 100 that keeps commitments (hashing + waiting on checkpoint writes)
# within the 5% goal for both examples with a margin (N = 50: 4-7%); a full step-level bisection
# over T = 1,000 (k = 16) then re-executes at most 685 steps (~0.05 s digits, ~0.5 s
# transformer: nothing next to an on-chain move clock) and the trainer keeps 11 states.
DEFAULT_CHECKPOINT_INTERVAL = 100


@dataclass
class PlainState:
    """The state after a step: producer node index -> flat float32 tensor, and the roots known so
    far (empty after a plain step; ``StepExecutor.ensure_roots`` fills them in when needed)."""

    step: int
    tensors: dict[int, np.ndarray]
    roots: dict[int, bytes]
    # The whole-step kernel's arena these tensors are views of, if one produced them (the next
    # step reads its state straight from it). Not an init field, so ``dataclasses.replace``
    # (which may swap a tensor) drops it instead of carrying a stale buffer along.
    arena: np.ndarray | None = field(default=None, init=False, repr=False, compare=False)
    # the step kernel (its ArenaLayout) that laid out ``arena``
    layout: Any = field(default=None, init=False, repr=False, compare=False)


@dataclass
class StepState(PlainState):
    """A committed state: every tensor root and the step's commitment C_s."""

    commitment: bytes


def detached(st: StepState) -> StepState:
    """A copy of a committed state that owns its tensors (not views of a whole-step arena, which
    the next step may reuse): what a trainer keeps as a checkpoint."""
    return StepState(st.step, {p: t.copy() for p, t in st.tensors.items()}, dict(st.roots), st.commitment)


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
        # node hashes in one native call: a table of roots [this step's outputs | the previous
        # state's, in producer order | the batch's], and each node's input rows in it
        n, slot = len(graph.nodes), {p: i for i, p in enumerate(self._producers)}
        node_k, prev_k = SourceKind.NODE_OUTPUT, SourceKind.PREV_STEP_NODE_OUTPUT
        self._hash_wiring = NodeWiring([
            [i if k == node_k else n + slot[i] if k == prev_k else n + len(slot) for k, i in wires]
            for wires in self._wiring
        ])  # fmt: skip
        self._desc_hashes = np.frombuffer(b"".join(node.desc_hash for node in graph.nodes), dtype=np.uint8).reshape(n, 32)
        # the runner's whole-step kernels, built on first use: key None (every output kept) or
        # the frozenset of nodes a shared layout keeps
        self._kernels: dict[frozenset[int] | None, Any] = {}

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
        missing = [p for p in self._producers if p not in st.roots]
        if missing:
            rows = self._roots(st.arena, st.layout, [st.tensors[p] for p in missing], missing)
            st.roots.update(zip(missing, _rows(rows)))
        return st.roots

    def _roots(self, arena: np.ndarray | None, layout: Any, tensors: list[np.ndarray], nodes: list[int] | None) -> np.ndarray:
        """Roots of ``tensors`` (node ``nodes[i]``'s output each; None: every node's, in order),
        from the arena when they are its slices (no view per tensor; ``layout``: the kernel
        that laid it out), as an (n, 32) array."""
        if arena is None or layout is None:
            return tensor_roots(tensors)
        if nodes is None:
            assert layout.keeps_all  # a shared layout's step hashes its outputs while it runs
            return arena_roots(arena, layout.offsets_arr, layout.numels_arr)
        return arena_roots(arena, layout.offsets_arr[nodes], layout.numels_arr[nodes])

    def node_inputs(self, d: int, prev: PlainState, outputs: list[np.ndarray], batch: np.ndarray) -> list[np.ndarray]:
        """Node d's input tensors, given the previous state, this step's outputs and its batch."""
        return [s.pick(outputs, prev.tensors, batch) for s in self.graph.nodes[d].inputs]

    def _batch(self, batch: np.ndarray) -> np.ndarray:
        batch = np.ascontiguousarray(batch, dtype=np.float32).reshape(-1)
        if batch.size != self.graph.batch_numel:
            raise ShapeMismatchError(f"batch has {batch.size} elements, graph expects {self.graph.batch_numel}")
        return batch

    def step_kernel(self, keep: Collection[int] | None = None) -> Any:
        """The runner's whole-step kernel (``compile_step``: the C++ backend runs every node of a
        step in one call), or None: then nodes run one by one. Same bits either way. ``keep``:
        the kernel of the shared layout keeping those outputs and the state (a runner whose
        kernel keeps every output anyway may return that)."""
        key = None if keep is None else frozenset(keep)
        if key not in self._kernels:
            compile_step = getattr(self.runner, "compile_step", None)
            self._kernels[key] = None if compile_step is None else compile_step(
                [n.desc for n in self.graph.nodes], self._wiring, self._producers, self.graph.batch_numel, keep=key
            )  # fmt: skip
        return self._kernels[key]

    def _execute(self, prev: PlainState, batch: np.ndarray, tamper: Tamper | None,
                 keep: Collection[int] | None = None, commit: bool = False) -> Executed:
        """Every node's flat output, in node order, the arena they are views of and, for a
        ``commit`` step whose kernel hashes while it runs, every output's root. Without
        ``tamper`` the whole-step kernel runs, if the runner has one, and its arena becomes the
        next state's (the next step reads its inputs from it); otherwise nodes run one by one
        and the arena is None. ``keep``: the outputs the caller reads (None: all)."""
        fused = self.step_kernel(keep) if tamper is None else None
        if fused is not None and commit and not (fused.keeps_all or fused.hashes_outputs):
            fused = self.step_kernel()  # no hashing inside this kernel: every output kept, then hashed
        if fused is not None:
            # a state from another layout (or none: C_0, a checkpoint) is packed for this step
            # only: kept on the state, a packed copy would live as long as a checkpoint does
            prev_arena = prev.arena if prev.arena is not None and prev.layout is fused else fused.pack(prev.tensors)
            if commit and fused.hashes_outputs:
                roots = np.empty((len(self.graph.nodes), 32), dtype=np.uint8)
                arena = fused.run(prev_arena, batch, roots)
                return Executed(fused.views(arena), arena, fused, roots)
            arena = fused.run(prev_arena, batch)
            return Executed(fused.views(arena), arena, fused, None)
        outputs: list[np.ndarray] = [_NOT_RUN] * len(self.graph.nodes)
        self._run_nodes(range(len(self.graph.nodes)), outputs, prev, batch, tamper)
        return Executed(outputs, None, None, None)

    def _run_nodes(self, nodes: Iterable[int], outputs: list[np.ndarray], prev: PlainState, batch: np.ndarray,
                   tamper: Tamper | None) -> None:
        """Run ``nodes`` (ascending) one by one, each writing ``outputs[d]``; the nodes of this
        step they read must be in ``outputs`` already."""
        prev_t = prev.tensors
        run = self.runner
        node_k, prev_k = SourceKind.NODE_OUTPUT, SourceKind.PREV_STEP_NODE_OUTPUT
        all_nodes, all_wiring = self.graph.nodes, self._wiring
        for d in nodes:
            ins = [outputs[i] if k == node_k else prev_t[i] if k == prev_k else batch for k, i in all_wiring[d]]
            out = run(all_nodes[d].desc, ins)
            if type(out) is not np.ndarray or out.dtype != np.float32 or not out.flags.c_contiguous:
                out = np.ascontiguousarray(out, dtype=np.float32)
            out = out.reshape(-1)
            if tamper is not None:
                out = tamper(d, out)
            outputs[d] = out

    def run_plain(self, prev: PlainState, batch: np.ndarray, tamper: Tamper | None = None,
                  keep: Collection[int] | None = None) -> PlainStep:
        """Run one step's kernels only: the same tensors as ``run_step``, no roots or hashes.
        ``keep``: the outputs the caller reads besides the state (None: all; the others are
        then empty arrays)."""
        ex = self._execute(prev, self._batch(batch), tamper, keep)
        state = PlainState(prev.step + 1, {p: ex.outputs[p] for p in self._producers}, {})
        state.arena, state.layout = ex.arena, ex.layout
        return PlainStep(prev.step + 1, ex.outputs, state)

    def run_step(self, prev: PlainState, batch: np.ndarray, tamper: Tamper | None = None,
                 keep: Collection[int] | None = None) -> StepResult:
        """Run one step with every output root, node hash and C_s. ``tamper(d, output)`` (tests
        and adversarial agents only) may replace a node's output before it is committed and
        consumed — an honest run never passes it. ``keep``: as in ``run_plain`` (the roots
        cover every output either way)."""
        batch = self._batch(batch)
        ex = self._execute(prev, batch, tamper, keep, commit=True)
        outputs, arena = ex.outputs, ex.arena
        # committing is a pure function of the tensors above, so plain steps followed by one
        # committed step give the same bits as committing every step
        batch_root = tensor_root(batch)
        prev_roots = self.ensure_roots(prev)
        producers = self._producers
        root_rows = ex.roots if ex.roots is not None else self._roots(arena, ex.layout, outputs, None)
        # node_hash(d, descHash, inputRoots, [outputRoot]) of every node, then C_s over them
        table = np.concatenate([
            root_rows,
            np.frombuffer(b"".join([*(prev_roots[p] for p in producers), batch_root]), dtype=np.uint8).reshape(-1, 32),
        ])  # fmt: skip
        hash_rows = node_hashes(table, self._desc_hashes, self._hash_wiring)
        c = step_commitment(hash_rows)
        roots, hashes = _rows(root_rows), _rows(hash_rows)
        state = StepState(prev.step + 1, {p: outputs[p] for p in producers}, {p: roots[p] for p in producers}, c)
        state.arena, state.layout = arena, ex.layout
        return StepResult(prev.step + 1, outputs, roots, hashes, c, batch_root, state)


class Executed(NamedTuple):
    """What ``StepExecutor._execute`` ran: every node's flat output (empty where the layout did
    not keep it), the arena they are views of and its kernel (None: node by node), and every
    output's root if the kernel hashed them while it ran."""

    outputs: list[np.ndarray]
    arena: np.ndarray | None
    layout: Any
    roots: np.ndarray | None


def _rows(table: np.ndarray) -> list[bytes]:
    """An (n, 32) uint8 array as n 32-byte strings."""
    raw = table.tobytes()
    return [raw[i : i + 32] for i in range(0, len(raw), 32)]


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

    def record(self, step: int, c: bytes) -> None:
        """Keep C_step, computed by the run."""
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
        end = self._run.state.step
        missing = [j for j in range(1, end + 1) if j not in self._known]
        self._known.update(self._run.sweep_commitments(missing))
        return iter(range(end + 1))

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
        executor: StepExecutor | None = None,
    ) -> None:
        if steps < 1:
            raise GraphError(f"steps must be >= 1, got {steps}")
        if checkpoint_interval < 0:
            raise GraphError(f"checkpoint_interval must be >= 0, got {checkpoint_interval}")
        self.graph = graph
        # ``executor``: another way to run the same steps (graph/distributed.py: shards on ranks)
        self.exec = executor or StepExecutor(graph, runner)
        self.batches = batches
        self.T = steps
        self.interval = checkpoint_interval
        self.commit_every = commit_every
        self.store = CheckpointStore(out_dir, graph) if out_dir is not None else None
        self.init = self.exec.initial_state(init_state)
        self.state: PlainState = self.init  # a StepState after run(), resume() and at the start
        self.commitments = Commitments(self)
        self.commitments.record(0, self.init.commitment)
        self.logs: list[StepLog] = []
        self._memory_ckpts: dict[int, StepState] = {0: self.init}
        self._loss = graph.named.get("loss")
        # what a run reads of a step besides the state: the loss (the shared layout keeps it)
        # (None: every output, the full layout)
        self.keep: Collection[int] | None = () if self._loss is None else (self._loss,)
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
                # the state tensors alone: not the whole-step arena with every activation
                self._memory_ckpts[st.step] = detached(st)

    def resume(self) -> int:
        """Continue from the latest stored checkpoint (verified); returns its step."""
        if self.store is None:
            raise GraphError("resume needs an out_dir with checkpoints")
        st = self.store.load_latest(self.T)
        self.start_from(st)
        return st.step

    def start_from(self, st: StepState) -> None:
        """Continue from a verified committed state (a checkpoint, loaded here or received)."""
        self.state = st
        self.commitments.record(st.step, st.commitment)
        if self.store is None:
            self._memory_ckpts[st.step] = st

    def run(self, until: int | None = None, progress: Callable[[StepLog], None] | None = None) -> bytes:
        """Execute steps up to ``until`` (default T) and return the last step's commitment."""
        end = self.T if until is None else min(until, self.T)
        while self.state.step < end:
            t0 = time.perf_counter()
            s = self.state.step + 1
            res: StepResult | PlainStep
            c: bytes | None = None
            if self.commit_every or s == end or self._is_checkpoint(s):
                res = self.exec.run_step(self.state, self.batches(s), keep=self.keep)
                c = res.commitment
                self.commitments.record(s, c)
            else:
                res = self.exec.run_plain(self.state, self.batches(s), keep=self.keep)
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

    def sweep_commitments(self, steps: list[int]) -> Iterator[tuple[int, bytes]]:
        """(j, C_j) for ascending ``steps`` >= 1, re-executed in sweeps: from a checkpoint, or
        on from the previous step of the list when it is the one just computed."""
        st: PlainState | None = None
        for j in steps:
            if st is None or st.step != j - 1:
                st = self.state_at(j - 1)
            res = self.exec.run_step(st, self.batches(j), keep=self.keep)
            yield j, res.commitment
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
            st = self.exec.run_plain(st, self.batches(st.step + 1), keep=self.keep).state
        return st

    def recompute_step(self, step: int, keep: Collection[int] | None = None) -> StepResult:
        """Re-execute step ``step`` >= 1 from the nearest checkpoint; every node's tensors
        (``keep``: only those and the state, as in ``StepExecutor.run_step``)."""
        if not 1 <= step <= self.T:
            raise GraphError(f"step {step} outside 1..{self.T}")
        prev = self.state_at(step - 1)
        return self.exec.run_step(prev, self.batches(step), keep=keep)

    def commitment(self, step: int) -> bytes:
        """C_step, recomputed from the nearest checkpoint (C_0 is the job's)."""
        if step == 0:
            return self.c0
        return self.recompute_step(step, keep=self.keep).commitment

    def node_tensors(self, step: int, d: int) -> tuple[list[np.ndarray], np.ndarray]:
        """(inputs, output) of node d at step ``step`` (tensors only: no hashing needed)."""
        if not 1 <= step <= self.T:
            raise GraphError(f"step {step} outside 1..{self.T}")
        prev = self.state_at(step - 1)
        res = self.exec.run_plain(prev, self.batches(step))
        ins = self.exec.node_inputs(d, prev, res.outputs, np.asarray(self.batches(step), dtype=np.float32).reshape(-1))
        return ins, res.outputs[d]

    def open_output(self, step: int, d: int, element: int) -> tuple[bytes, ElementOpening]:
        """(node d's output root, opening of one element with its Merkle proof)."""
        _, out = self.node_tensors(step, d)
        return tensor_root(out), open_element(out, element)

    def trace(self, step: int, d: int, element: int) -> list[program.Step]:
        """The micro-step trace of output element ``element`` of node d at step ``step``."""
        ins, _ = self.node_tensors(step, d)
        return program.trace(self.graph.nodes[d].desc, ins, element)
