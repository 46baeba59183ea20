"""What the native backends (C++ CPU, CUDA) share on the Python side: the int64 encodings their
interpreters decode (kernels/repops_program.cuh ``rp_decode``, kernels/cpu/interpreter.cpp
``decode_program`` / ``make_prog``) and the arena layout of their whole-step kernels.

Encodings::

    program   (n, 5) int64 rows              op, dst, a, b, imm
    maps      (n_inputs, rank + 4) int64 rows  strides[0..rank-1], kstride, offset, idx_stride, numel
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import numpy as np

from verde_chain.errors import RepOpsError
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
    """Where a whole-step kernel keeps a step's node outputs: one float32 arena, node d at
    ``offsets[d]`` (in order, each on a 64-byte boundary). Every backend's step kernel has this
    one layout, so the executor finds and hashes any arena's slices the same way. The state a
    step reads is the previous step's arena (the producers' slots); ``pack(tensors)`` builds one
    from state tensors that did not come from a run (C_0, a loaded checkpoint), ``views(arena)``
    gives the flat node outputs. ``node_times`` (profiling): when set (float64, one per node),
    every run adds each node's seconds to it."""

    def __init__(self, descs: Sequence[KernelDesc], producers: Sequence[int], batch_numel: int) -> None:
        self.numels = [d.numel for d in descs]
        self.offsets, off = [], 0
        for n in self.numels:
            self.offsets.append(off)
            off += -(-n // _ALIGN) * _ALIGN
        self.arena_numel = max(off, 1)
        self.offsets_arr, self.numels_arr = np.array(self.offsets, dtype=np.int64), np.array(self.numels, dtype=np.int64)
        self.batch_numel = batch_numel
        self.producers = list(producers)
        self._slices = [slice(o, o + n) for o, n in zip(self.offsets, self.numels)]
        self.node_times: np.ndarray | None = None

    def pack(self, tensors: dict[int, np.ndarray]) -> np.ndarray:
        arena = np.zeros(self.arena_numel, dtype=np.float32)
        for p in self.producers:
            arena[self._slices[p]] = tensors[p]
        return arena

    def views(self, arena: np.ndarray) -> list[np.ndarray]:
        return [arena[s] for s in self._slices]
