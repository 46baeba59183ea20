"""The CPU whole-step kernel: every node of a training step in ONE call into C++ (``StepPlan``,
kernels/cpu/step_plan.cpp), with every node output in one arena (``backends/native.py``
``ArenaLayout``). The same kernels as ``CpuBackend.__call__`` per node (GEMM, fold, binary,
scatter, row dot, compiled map, interpreter), so the same bits, without the ~10-20 us of Python,
pybind and allocation per node that dominated small nodes.

Window nodes (``repops/windowed.py``) are in the plan too: a windowed dot chain (convolution and
its gradients) is the windowed GEMM (implicit im2col), its ``(batch, m, n)`` result permuted
into the output's order (with the epilogue, conv's bias, run on it: a compiled map in place,
``jit.epilogue_map``, or the interpreter with r0 preset) unless it
already is; a window chain (K > 1: batch-norm statistics, pooling) is one compiled map
reading its inputs in place (``CpuBackend.windowed_chain``); any other window node is its
dewindowed form: each windowed operand gathered into the plan's scratch buffer (dense ``(R, K)``),
then the plain node over it as above. Scratch is a
ring (``_Ring``): a region is reused only by a node that the plan orders after every reader of
its previous contents (the plan's rule: a node that writes where an earlier one reads follows it)."""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from verde_chain.commit.native import default_threads, load_library
from verde_chain.errors import RepOpsError
from verde_chain.graph.structure import SourceKind
from verde_chain.repops import windowed
from verde_chain.repops.backends.cpu import extension as ext
from verde_chain.repops.backends.cpu.backend import CompiledMap, CpuBackend
from verde_chain.repops.backends.cpu.jit import map_address, map_work
from verde_chain.repops.backends.native import ArenaLayout, encode_maps, encode_program, writable
from verde_chain.repops.backends.plan import linear_stride
from verde_chain.repops.isa import Instr, Op
from verde_chain.repops.library.shapes import c_strides
from verde_chain.repops.program import InputMap, KernelDesc

# The plan's own buffer after the SourceKind buffers (kernels/cpu/step_plan.cpp RP_SCRATCH).
SCRATCH = int(SourceKind.BATCH) + 1
# No epilogue map (StepPlan.add_dot/add_fold/add_rowdot: lin rows, function address 0, work 0).
_NO_MAP = torch.zeros((0, 4), dtype=torch.int64)
# The scratch ring holds at least this many float32 elements, and twice a node's largest need.
_SCRATCH_MIN = 1 << 22


def in_plan(backend: CpuBackend, desc: KernelDesc) -> bool:
    """Whether the plan runs ``desc``: any plain node; a windowed dot chain whose epilogue loads
    no windowed input; any other window node with a dewindowed form."""
    if not desc.extended:
        return True
    prep = backend.windowed_prepare(desc)
    if prep.gemm is None:
        return prep.dewindowed is not None or prep.pool_backward is not None or backend.windowed_chain(desc) is not None
    return not any(i.op in (Op.LOAD, Op.LOADIDX) and desc.inputs[i.imm].windows for i in desc.epilogue)


def _scratch_need(backend: CpuBackend, desc: KernelDesc) -> int:
    """Scratch elements ``desc`` uses at once (0 for a plain node)."""
    if not desc.extended:
        return 0
    prep = backend.windowed_prepare(desc)
    if prep.pool_backward is not None or backend.windowed_chain(desc) is not None:
        return 0
    if prep.dewindowed is not None:
        return sum(op.rows.shape[1] * desc.K for op in prep.dewindowed.operands.values())
    return desc.numel


class _Ring:
    """Scratch offsets handed out in order, wrapping to 0 when a region would pass the end."""

    def __init__(self, numel: int) -> None:
        self.numel, self._at = numel, 0

    def take(self, n: int) -> int:
        if self._at + n > self.numel:
            self._at = 0
        at, self._at = self._at, self._at + n
        return at


def _tables(op: windowed.Operand) -> list[object]:
    return [torch.from_numpy(op.rows), torch.from_numpy(op.ks), torch.from_numpy(op.wins), int(op.fill)]


# The plan's node kinds (step_plan.cpp NodeKind, WindowNodeKind), as profiles name them.
PLAN_KINDS = {0: "program", 1: "dot", 2: "fold", 3: "binary", 4: "jit", 5: "scatter", 6: "rowdot",
              16: "window gemm", 17: "window gather", 18: "permute", 19: "pool backward"}


@dataclass
class PlanProfile:
    """Where a plan's runs went (``StepKernel.profile``): per plan node its kind, level, work in
    threads' worth (the plan's own estimate) and graph node (``owner``), and the seconds added
    per plan node (``node_s``: a node's own time on the thread that ran it) and per level
    (``level_s``: wall) over ``runs`` runs; ``side_by_side(level, threads)``: whether the plan
    runs that level's nodes side by side, one thread each. ``floating``: the plan nodes that
    floated in the runs (out of their levels, mostly on pool workers beside the levels: their
    own time is in no level's wall), and ``float_s`` the wall the calling thread spent at their
    deadlines (running those no worker had taken, waiting for the others)."""

    kinds: list[str]
    level: np.ndarray
    worth: np.ndarray
    owner: np.ndarray
    node_s: np.ndarray
    level_s: np.ndarray
    side_by_side: Callable[[int, int], bool]
    floating: np.ndarray
    float_s: float = 0.0
    runs: int = 0


class StepKernel(ArenaLayout):
    """``run(prev_arena, batch)`` returns the new arena (see :class:`ArenaLayout`). Node inputs are
    (source, offset, numel) references: the source a ``SourceKind`` (this step's arena, the
    previous step's, the batch), as the C++ plan reads them (generated RP_SOURCE_*)."""

    def __init__(self, backend: CpuBackend, descs: Sequence[KernelDesc], wiring: Sequence[Sequence[tuple[int, int]]],
                 producers: Sequence[int], batch_numel: int, keep: Collection[int] | None = None) -> None:
        super().__init__(descs, producers, batch_numel, wiring, keep)
        self.backend = backend
        need = max((_scratch_need(backend, desc) for desc in descs), default=0)
        self._ring = _Ring(max(_SCRATCH_MIN, 2 * need) if need else 0)
        self._plan = backend.extension.StepPlan(self.arena_numel, self.arena_numel, batch_numel, *ext.DEFAULT_TILE,
                                                self._ring.numel, self.work_numel)
        self._keep: list[object] = []  # compiled maps the plan calls by address
        self._root_rows: list[int] = []  # per plan node, the root row of its output (_hash_in_plan)
        # how the window nodes run: gemm, "gemm, output order", "gemm, epilogue in place", gemm+permute, dewindowed
        self.window_forms: Counter[str] = Counter()
        owner: list[int] = []  # per plan node, the node it belongs to (a window node adds several)
        for d, (desc, wires) in enumerate(zip(descs, wiring, strict=True)):
            refs = self._refs(desc, wires)
            if desc.extended:
                self._add_windowed(desc, refs, self.offsets[d])
            else:
                self._add(desc, refs, self.offsets[d])
            owner += [d] * (len(self._plan) - len(owner))
        self._owner = np.array(owner, dtype=np.int64)
        self._hash_in_plan(owner)
        self.plan_profile: PlanProfile | None = None  # profile()

    def _hash_in_plan(self, owner: list[int]) -> None:
        """Let a committed run hash every node output inside the plan, before its slot is
        reused (``run(..., roots)``): a node's output is its last plan node's (the window
        nodes' first plan nodes write scratch intermediates)."""
        api = roots_api()
        if not api:
            return
        rows = [-1] * len(owner)
        for i, d in enumerate(owner):
            if i + 1 == len(owner) or owner[i + 1] != d:
                rows[i] = d
        self._root_rows = rows
        self.hash_with(api)
        self.hashes_outputs = True

    def hash_with(self, api: int) -> None:
        """Hash committed runs with the keccak tree's table at address ``api`` (``roots_api()``
        unless a test passes one that fails, to reach the plan's error paths)."""
        self._plan.hash_outputs(self._root_rows, default_threads(), api)

    def _refs(self, desc: KernelDesc, wires: Sequence[tuple[int, int]]) -> torch.Tensor:
        rows = []
        for (kind, i), m in zip(wires, desc.inputs, strict=True):
            if kind == SourceKind.BATCH:
                buf, off, n = int(SourceKind.BATCH), 0, self.batch_numel
            else:
                buf, off, n = int(SourceKind(kind)), self.offsets[i], self.numels[i]
            if n != m.numel:
                raise RepOpsError(f"node {desc.label or '?'}: input has {n} elements, its map expects {m.numel}")
            rows.append((buf, off, n))
        return torch.tensor(rows, dtype=torch.int64).reshape(len(rows), 3)

    def _add_windowed(self, desc: KernelDesc, refs: torch.Tensor, out: int) -> None:
        prep = self.backend.windowed_prepare(desc)
        g = prep.gemm
        pb = prep.pool_backward
        if pb is not None:  # max-pool backward: its scatter form reads (arg, dy) in place
            self._plan.add_pool_backward(refs, torch.from_numpy(pb.axes), torch.from_numpy(pb.plane_off), pb.K, out)
            self.window_forms["max-pool backward"] += 1
            return
        chain = self.backend.windowed_chain(desc)
        if chain is not None:  # one compiled chain reading the windowed inputs in place
            self._keep.append(chain.fn)
            self._plan.add_jit(refs, chain.lin, out, desc.numel, map_address(chain.fn), chain.work)
            self.window_forms["windowed jit"] += 1
            return
        if g is None:  # dewindowed: each windowed operand gathered into the scratch, then the plain node
            dw = prep.dewindowed
            assert dw is not None  # in_plan
            dense = refs.clone()
            for t, op in dw.operands.items():
                n = op.rows.shape[1] * desc.K
                at = self._ring.take(n)
                self._plan.add_window_gather(refs[t:t + 1], *_tables(op), desc.K, SCRATCH, at, kmajor=dw.kmajor)
                dense[t] = torch.tensor((SCRATCH, at, n))
            self._add(dw.plain, dense, out)
            self.window_forms["dewindowed"] += 1
            return
        assert prep.operands is not None
        a, b, nb, M, N = prep.operands
        rank = len(desc.out_shape)
        perm = g.batch + g.m + g.n
        gemm = (refs[[g.slot_a, g.slot_b]], *_tables(a), *_tables(b), nb, M, N, desc.K)
        split = self.backend.column_split(desc, g)
        if (perm == tuple(range(rank)) or split) and not desc.epilogue:
            self._plan.add_window_gemm(*gemm, int(SourceKind.NODE_OUTPUT), out, list(split or ()))
            self.window_forms["gemm, output order" if split else "gemm"] += 1
            return
        # the (batch, m, n) result into the output's order, then the epilogue with r0 preset: its
        # loads read plain inputs only (in_plan), the windowed ones get a map that reads nothing.
        # A result already in the output's order (every weight gradient, whose epilogue is the
        # momentum) is written into the output itself, and the permute runs the epilogue alone,
        # in place: no copy (it was 8% of resnet18's step, on one thread).
        if perm == tuple(range(rank)):
            result = (int(SourceKind.NODE_OUTPUT), out)
        else:
            result = (SCRATCH, self._ring.take(desc.numel))
        self._plan.add_window_gemm(*gemm, *result, [])
        src = c_strides([desc.out_shape[a] for a in perm])
        zero = (0,) * rank
        maps = [InputMap(m.numel, zero) if m.windows else m for m in desc.inputs]
        maps.append(InputMap(desc.numel, c_strides(desc.out_shape)))
        # the epilogue as a compiled map where eligible, from what this node computes as a plain
        # descriptor: r0 = the permuted result (the last input), then the epilogue at K = 1 over
        # these inputs (the windowed ones, which it does not read, with their empty maps)
        epi = self.backend.epilogue(dataclasses.replace(desc, K=1, inputs=tuple(maps), kdims=(), body=(),
                                                        prologue=(Instr(Op.LOAD, 0, imm=len(maps) - 1),)))
        empty = torch.from_numpy(encode_program(()))
        self._plan.add_permute(torch.cat([refs, torch.tensor([[*result, desc.numel]])]),
                               torch.from_numpy(encode_maps(maps, rank)), list(desc.out_shape), 1, empty, empty,
                               torch.from_numpy(encode_program(desc.epilogue)), out,
                               [src[perm.index(d)] for d in range(rank)], *self._epilogue_args(epi))
        self.window_forms["gemm, epilogue in place" if result[0] != SCRATCH else "gemm+permute"] += 1

    def _add(self, desc: KernelDesc, refs: torch.Tensor, out: int) -> None:
        prep = self.backend.prepare(desc)
        plan = prep.plan
        if prep.jit is not None and prep.lin is not None:
            self._keep.append(prep.jit)
            self._plan.add_jit(refs, prep.lin, out, desc.numel, map_address(prep.jit), map_work(desc))
            return
        copy = plain_copy(desc)
        if copy is not None and plan.kind == "program":
            # a transpose or other strided copy: the permuting copy, not the interpreter
            t, m = copy
            buf, at, n = (int(v) for v in refs[t])
            n -= m.offset
            empty = torch.from_numpy(encode_program(()))
            self._plan.add_permute(torch.tensor([[buf, at + m.offset, n]]),
                                   torch.from_numpy(encode_maps([InputMap(n, (0,) * len(desc.out_shape))], len(desc.out_shape))),
                                   list(desc.out_shape), 1, empty, empty, empty, out, list(m.strides), _NO_MAP, 0, 0)
            return
        code = (prep.maps, prep.out_shape, desc.K, *prep.programs, out)
        # the epilogue of a dot/fold/rowdot: a compiled map run in place over the kernel's
        # result where the backend compiled one (jit.epilogue_map), else the interpreter (fn 0)
        epi_map = self._epilogue_args(prep.epi)
        if plan.kind == "dot":
            (a_size, a_st, a_off), (b_size, b_st, b_off) = plan.views
            bshape = a_size[:-2]
            aoff = a_off + _grid_offsets(bshape, a_st[:-2])
            boff = b_off + _grid_offsets(bshape, b_st[:-2])
            M, N = a_size[-2], b_size[-1]
            if len(aoff) > 1 and bool((boff == boff[0]).all()) and bool(
                    (aoff == aoff[0] + torch.arange(len(aoff)) * (M * a_st[-2])).all()):
                # one B for every batch entry and A's entries one after another: one GEMM of
                # batch x M rows (the same dot chain per element), B packed once, not per entry
                aoff, boff, M = aoff[:1], boff[:1], M * len(aoff)
            self._plan.add_dot(refs, *code, *plan.slots, M, N, aoff, a_st[-2], a_st[-1], boff, b_st[-2], b_st[-1], *epi_map)
            return
        if plan.kind == "fold":
            ((_, st, x_off),) = plan.views
            m = desc.inputs[plan.slots[0]]
            sr = linear_stride(m, desc.out_shape)
            if sr is not None:
                self._plan.add_fold(refs, *code, plan.slots[0], int(cast(int, plan.op)), x_off, sr, st[-1], *epi_map)
                return
        elif plan.kind == "rowdot":
            (_, (sra, ska), a_at), (_, (srb, skb), b_at) = plan.views
            sa, sb = plan.slots
            self._plan.add_rowdot(refs, *code, sa, a_at, sra, ska, sb, b_at, srb, skb, *epi_map)
            return
        elif plan.kind == "binary":
            self._plan.add_binary(refs, out, desc.numel, int(cast(int, plan.op)))
            return
        elif plan.kind == "scatter":
            self._plan.add_scatter(refs, out, desc.K, desc.numel // desc.out_shape[0], desc.out_shape[0])
            return
        self._plan.add_program(refs, *code)

    def _epilogue_args(self, epi: CompiledMap | None) -> tuple[torch.Tensor, int, int]:
        """The plan's (lin, function address, work) of an epilogue map; (no rows, 0, 0): none."""
        if epi is None:
            return _NO_MAP, 0, 0
        self._keep.append(epi.fn)
        return epi.lin, map_address(epi.fn), epi.work

    def run(self, prev_arena: np.ndarray, batch: np.ndarray, roots: np.ndarray | None = None) -> np.ndarray:
        """The new arena; with ``roots`` ((n_nodes, 32) uint8, ``hashes_outputs``), every node
        output's tensor root written into its row as well."""
        threads = self.backend.threads_now()
        prev = torch.from_numpy(writable(prev_arena))  # read-only: another backend's arena (rare), copied
        b = torch.from_numpy(writable(batch))
        rows = None if roots is None else torch.from_numpy(roots)
        prof = self.plan_profile
        if self.node_times is None and prof is None:
            return self._plan.run(prev, b, threads, None, rows).numpy()
        times = np.zeros(len(self._owner))
        levels = None if prof is None else torch.from_numpy(prof.level_s)
        arena = self._plan.run(prev, b, threads, torch.from_numpy(times), rows, levels).numpy()
        if self.node_times is not None:
            np.add.at(self.node_times, self._owner, times)
        if prof is not None:
            prof.node_s += times
            prof.runs += 1
            if rows is None and self._plan.floated()[1]:
                prof.floating[[i for i, _ in self.floating_nodes()]] = True
                prof.float_s += float(self._plan.float_seconds())
        return arena

    def compiled_epilogues(self) -> list[int]:
        """The plan nodes whose epilogue runs as a compiled map (tests: the path was taken)."""
        return list(self._plan.compiled_epilogues())

    def profile(self) -> PlanProfile:
        """Start profiling the plan (``plan_profile``: per plan node and per level times, added by
        every later run) and return the profile."""
        info = np.array(self._plan.describe(), dtype=np.float64).reshape(-1, 3)
        levels = info[:, 1].astype(np.int64)
        self.plan_profile = PlanProfile(
            kinds=[PLAN_KINDS.get(int(k), str(int(k))) for k in info[:, 0]], level=levels, worth=info[:, 2],
            owner=self._owner, node_s=np.zeros(len(info)), level_s=np.zeros(int(levels.max(initial=-1)) + 1),
            side_by_side=lambda lv, threads: bool(self._plan.side_by_side(lv, threads)),
            floating=np.zeros(len(info), dtype=bool))
        return self.plan_profile

    def hash_workers(self) -> int:
        """How many threads hashed outputs in the last committed run (tests: proof that the
        in-plan hashing ran on several OS threads)."""
        return int(self._plan.hash_workers())

    def idle_hashed(self) -> tuple[int, int]:
        """The last committed run's hashing in the pool's idle time: (items hashed
        while levels ran, all its items); (0, 0) when it hashed at the hash points only (one
        thread, or idle hashing off)."""
        overlapped, total = self._plan.idle_hashed()
        return int(overlapped), int(total)

    def set_idle_hashing(self, on: bool) -> None:
        """Hash in the pool's idle time at two or more threads (the default), or only at the hash
        points: for benchmarks comparing the two in one process (same roots either way)."""
        self._plan.set_idle_hashing(on)

    def set_floating(self, on: bool) -> None:
        """Let plain runs at two or more threads run the floating nodes (an optimizer update, and
        any node that could wait many levels) in the pool's idle time (the default), or run every
        node in its level: for benchmarks comparing the two in one process (same bits either way)."""
        self._plan.set_floating(on)

    def floating_nodes(self) -> list[tuple[int, int]]:
        """The plan nodes that float in plain runs at two or more threads, each with its deadline:
        the level before which it must be done (the level count: the end of the step)."""
        return [(int(i), int(d)) for i, d in self._plan.floating_nodes()]

    def floated(self) -> tuple[int, int]:
        """The last plain run's floating nodes: (how many pool workers ran, how many floated);
        (0, 0) when none floated (one thread, floating off, or none in the plan)."""
        by_workers, total = self._plan.floated()
        return int(by_workers), int(total)


@functools.cache
def roots_api() -> int:
    """The address of the keccak tree's ``keccak_roots_api()`` table (kernels/keccak_tree.c:
    roots_begin, roots_items, roots_threads, roots_run_item, roots_end, the leaf size), with which
    the plan hashes outputs in a committed run, at its hash points on its thread pool and in the
    pool's idle time; 0 without the native library (then committed steps take their roots from a
    whole arena: ``keep=None``)."""
    lib = load_library()
    return 0 if lib is None else int(lib.keccak_roots_api() or 0)


def plain_copy(desc: KernelDesc) -> tuple[int, InputMap] | None:
    """(t, input t's map) if ``desc`` only copies input t's bits (out = in[map], a LOAD into
    r0: LOAD keeps the bits as they are) through non-negative strides, else None."""
    if desc.extended or desc.K != 1 or desc.body or desc.epilogue or len(desc.prologue) != 1 or not desc.out_shape:
        return None
    ins = desc.prologue[0]
    if ins.op != Op.LOAD or ins.dst != 0:
        return None
    m = desc.inputs[ins.imm]
    if m.idx_stride or m.windows or any(s < 0 for s in m.strides):
        return None
    return ins.imm, m


def _grid_offsets(shape: Sequence[int], strides: Sequence[int]) -> torch.Tensor:
    """Element offsets of every index of ``shape`` (C order) under ``strides``; one for ()."""
    off = torch.zeros(1, dtype=torch.int64)
    for n, s in zip(shape, strides):
        off = (off[:, None] + torch.arange(n, dtype=torch.int64)[None, :] * s).reshape(-1)
    return off
