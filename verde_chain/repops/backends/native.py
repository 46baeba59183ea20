"""What the native backends (C++ CPU, CUDA) share on the Python side: the int64 encodings their
interpreters decode (kernels/repops_program.cuh ``rp_decode``, kernels/cpu/interpreter.cpp
``decode_program`` / ``make_prog``) and the arena layout of their whole-step kernels.

Encodings::

    program   (n, 5) int64 rows              op, dst, a, b, imm
    maps      (n_inputs, rank + 4) int64 rows  strides[0..rank-1], kstride, offset, idx_stride, numel
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Sequence
from typing import Generic, TypeVar

import numpy as np

from verde_chain.errors import RepOpsError
from verde_chain.graph.structure import SourceKind
from verde_chain.repops.isa import Instr
from verde_chain.repops.program import InputMap, KernelDesc

# Node outputs start on 64-byte boundaries in the arena (whole cache lines per node).
_ALIGN = 16
T = TypeVar("T")


def encode_program(program: Sequence[Instr]) -> np.ndarray:
    """(n, 5) int64 rows ``op, dst, a, b, imm``."""
    rows = [(int(i.op), i.dst, i.a, i.b, i.imm) for i in program]
    return np.array(rows, dtype=np.int64).reshape(len(rows), 5)


def encode_maps(maps: Sequence[InputMap], rank: int) -> np.ndarray:
    """(n_inputs, rank + 4) int64 rows ``strides..., kstride, offset, idx_stride, numel``."""
    rows = [(*m.strides, m.kstride, m.offset, m.idx_stride, m.numel) for m in maps]
    return np.array(rows, dtype=np.int64).reshape(len(rows), rank + 4)


def encode_desc(desc: KernelDesc) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], np.ndarray]:
    """The prologue, body and epilogue rows and the map rows of ``desc``."""
    # SAFETY: the native encodings carry no windows; a window descriptor run on them would read
    # wrong memory. Backends send those through repops/windowed.py instead.
    if desc.extended:
        raise RepOpsError(f"{desc.label or 'kernel'}: the native kernels do not read window descriptors")
    programs = (encode_program(desc.prologue), encode_program(desc.body), encode_program(desc.epilogue))
    return programs, encode_maps(desc.inputs, len(desc.out_shape))


def writable(a: np.ndarray) -> np.ndarray:
    """``a``, or a copy if it is read-only (torch cannot wrap read-only numpy arrays; a copy
    changes no bit and is cheap next to the kernel or transfer it feeds)."""
    return a if a.flags.writeable else a.copy()


class PerDesc(Generic[T]):
    """What a backend prepares once per descriptor (``make(desc)``), keyed by identity: graph
    nodes are long-lived, and hashing a KernelDesc (a transcendental program has ~100
    instructions) on every call would cost more than running a small node. The desc itself is
    kept so its id cannot be reused; at ``limit`` entries the cache starts over."""

    def __init__(self, make: Callable[[KernelDesc], T], limit: int = 16384) -> None:
        self._make = make
        self._limit = limit
        self._entries: dict[int, tuple[KernelDesc, T]] = {}

    def __call__(self, desc: KernelDesc) -> T:
        hit = self._entries.get(id(desc))
        if hit is not None and hit[0] is desc:
            return hit[1]
        if len(self._entries) >= self._limit:
            self._entries.clear()
        value = self._make(desc)
        self._entries[id(desc)] = (desc, value)
        return value


class ArenaLayout:
    """Where a whole-step kernel keeps a step's node outputs. The ARENA is one float32 array per
    step, returned by the run: node d at ``offsets[d]`` (in node order, each on a 64-byte
    boundary) for every kept node. With ``keep=None`` every node is kept (the layout every
    backend's step kernel has; the dispute path opens any node of it). With ``keep`` (a shared
    layout: ``wiring`` needed) only the state (the producers' outputs) and the nodes in ``keep``
    are in the arena; every other node's output lives in the WORK region, ``work_numel``
    elements the kernel owns and reuses from step to step, at plan address ``offsets[d] >=
    arena_numel``, in slots shared by liveness (:func:`shared_slots`). So a step holds its input
    state, its output arena and one work region, never two full sets of node outputs.

    The state a step reads is the previous step's arena (the producers' slots); ``pack(tensors)``
    builds one from state tensors that did not come from a run (C_0, a loaded checkpoint),
    ``views(arena)`` gives the flat node outputs (an empty array for a node not kept).
    ``node_times`` (profiling): when set (float64, one per node), every run adds each node's
    seconds to it. ``hashes_outputs``: whether ``run(prev, batch, roots)`` can fill every
    node's tensor root while it runs (a shared layout's committed step needs it)."""

    hashes_outputs = False

    def __init__(self, descs: Sequence[KernelDesc], producers: Sequence[int], batch_numel: int,
                 wiring: Sequence[Sequence[tuple[int, int]]] | None = None,
                 keep: Collection[int] | None = None) -> None:
        n = len(descs)
        self.numels = [d.numel for d in descs]
        self.producers = list(producers)
        self.keeps_all = keep is None
        if keep is None:
            kept = list(range(n))
        elif wiring is None:
            raise RepOpsError("a shared arena layout needs the wiring (who reads each node)")
        else:
            kept = sorted(set(self.producers) | set(keep))
        self.offsets, off = [0] * n, 0
        for d in kept:
            self.offsets[d] = off
            off += _padded(self.numels[d])
        self.arena_numel = max(off, 1)
        self.work_numel = 0
        if wiring is not None and keep is not None:
            last = last_reads(wiring)
            work, self.work_numel = shared_slots(self.numels, last, set(kept))
            check_slots(work, self.numels, last)
            for d, o in work.items():
                self.offsets[d] = self.arena_numel + o
        self.offsets_arr, self.numels_arr = np.array(self.offsets, dtype=np.int64), np.array(self.numels, dtype=np.int64)
        self.batch_numel = batch_numel
        self._slices: list[slice | None] = [None] * n
        for d in kept:
            self._slices[d] = slice(self.offsets[d], self.offsets[d] + self.numels[d])
        self.node_times: np.ndarray | None = None

    def pack(self, tensors: dict[int, np.ndarray]) -> np.ndarray:
        arena = np.zeros(self.arena_numel, dtype=np.float32)
        for p in self.producers:
            arena[self._slices[p]] = tensors[p]
        return arena

    def views(self, arena: np.ndarray) -> list[np.ndarray]:
        return [NOT_KEPT if s is None else arena[s] for s in self._slices]


# A node output a shared layout did not keep (its slot was reused during the step).
NOT_KEPT = np.zeros(0, dtype=np.float32)


def _padded(numel: int) -> int:
    return -(-numel // _ALIGN) * _ALIGN


def last_reads(wiring: Sequence[Sequence[tuple[int, int]]]) -> list[int]:
    """Per node, the last node of the same step that reads its output (itself if none does)."""
    last = list(range(len(wiring)))
    this_step = int(SourceKind.NODE_OUTPUT)
    for d, wires in enumerate(wiring):
        for kind, i in wires:
            if kind == this_step:
                last[i] = max(last[i], d)
    return last


def shared_slots(numels: Sequence[int], last: Sequence[int], kept: set[int]) -> tuple[dict[int, int], int]:
    """Work-region offsets of the nodes not in ``kept`` and the region's size. In node order,
    node d takes a slot when it is reached and gives it back once ``last[d]`` (its last
    reader) has been reached: a node never writes over an output a later node still reads, nor
    over its own inputs. A slot is taken from the free block freed EARLIEST that fits (else the
    region grows): the plan must order a node that reuses memory after every reader of the old
    contents (kernels/cpu/step_plan.cpp must_follow), and old contents' readers have mostly run
    long before, so the reuse adds few waits between the plan's levels (and a committed step
    few hashing calls)."""
    free: list[list[int]] = []  # [offset, size, freed at node], ascending offsets, coalesced
    top = 0
    slots: dict[int, int] = {}
    release: dict[int, list[int]] = {}
    for d, numel in enumerate(numels):
        if d not in kept:
            size = _padded(numel)
            fits = [j for j, blk in enumerate(free) if blk[1] >= size]
            if fits:
                j = min(fits, key=lambda j: free[j][2])
                at, left, when = free[j]
                free[j:j + 1] = [[at + size, left - size, when]] if left > size else []
            elif free and free[-1][0] + free[-1][1] == top:  # the free tail, grown
                at = free.pop()[0]
                top = at + size
            else:
                at, top = top, top + size
            slots[d] = at
            release.setdefault(last[d], []).append(d)
        for e in release.pop(d, ()):
            _give_back(free, slots[e], _padded(numels[e]), d)
    return slots, top


def _give_back(free: list[list[int]], at: int, size: int, when: int) -> None:
    """Return [at, at + size) to the free list, merged with its free neighbours."""
    j = bisect.bisect(free, [at])
    blk = [at, size, when]
    if j < len(free) and free[j][0] == at + size:  # the next block
        nxt = free.pop(j)
        blk = [at, size + nxt[1], max(when, nxt[2])]
    if j and free[j - 1][0] + free[j - 1][1] == at:  # the previous block
        prv = free[j - 1]
        free[j - 1] = [prv[0], prv[1] + blk[1], max(prv[2], blk[2])]
        return
    free.insert(j, blk)


def check_slots(slots: dict[int, int], numels: Sequence[int], last: Sequence[int]) -> None:
    """SAFETY: no two work-region outputs share memory while both are live (d from d to
    ``last[d]``, its last reader). Shared memory between live outputs would hand a node another
    node's data: a wrong tensor, and a commitment no honest party reproduces."""
    live_at = np.zeros(0, dtype=np.int64)
    live_end = np.zeros(0, dtype=np.int64)
    live_last = np.zeros(0, dtype=np.int64)
    live_node = np.zeros(0, dtype=np.int64)
    for d in sorted(slots):
        alive = live_last >= d
        live_at, live_end, live_last, live_node = live_at[alive], live_end[alive], live_last[alive], live_node[alive]
        at, end = slots[d], slots[d] + _padded(numels[d])
        clash = (live_at < end) & (at < live_end)
        if clash.any():
            raise RepOpsError(f"arena layout: node {d}'s slot [{at}, {end}) overlaps node "
                              f"{int(live_node[clash][0])}'s output, which is still read later in the step")
        live_at, live_end = np.append(live_at, at), np.append(live_end, end)
        live_last, live_node = np.append(live_last, last[d]), np.append(live_node, d)
