"""The CPU whole-step kernel: every node of a training step in ONE call into C++ (``StepPlan``,
kernels/cpu/step_plan.cpp), with every node output in one arena (``backends/native.py``
``ArenaLayout``). The same kernels as ``CpuBackend.__call__`` per node (GEMM, fold, binary,
scatter, row dot, compiled map, interpreter), so the same bits, without the ~10-20 us of Python, pybind
and allocation per node that dominated small nodes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np
import torch

from verde_chain.errors import RepOpsError
from verde_chain.graph.structure import SourceKind
from verde_chain.repops.backends.cpu import extension as ext
from verde_chain.repops.backends.cpu.backend import CpuBackend
from verde_chain.repops.backends.cpu.jit import map_address, map_work
from verde_chain.repops.backends.native import ArenaLayout, writable
from verde_chain.repops.backends.plan import linear_stride
from verde_chain.repops.program import KernelDesc


class StepKernel(ArenaLayout):
    """``run(prev_arena, batch)`` returns the new arena (see :class:`ArenaLayout`). Node inputs are
    (source, offset, numel) references: the source a ``SourceKind`` (this step's arena, the
    previous step's, the batch), as the C++ plan reads them (generated RP_SOURCE_*)."""

    def __init__(self, backend: CpuBackend, descs: Sequence[KernelDesc], wiring: Sequence[Sequence[tuple[int, int]]],
                 producers: Sequence[int], batch_numel: int) -> None:
        super().__init__(descs, producers, batch_numel)
        self.backend = backend
        self._plan = backend.extension.StepPlan(self.arena_numel, self.arena_numel, batch_numel, *ext.DEFAULT_TILE)
        self._keep: list[object] = []  # compiled maps the plan calls by address
        for d, (desc, wires) in enumerate(zip(descs, wiring, strict=True)):
            self._add(d, desc, wires)

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

    def _add(self, d: int, desc: KernelDesc, wires: Sequence[tuple[int, int]]) -> None:
        prep = self.backend.prepare(desc)
        plan, refs, out = prep.plan, self._refs(desc, wires), self.offsets[d]
        if prep.jit is not None and prep.lin is not None:
            self._keep.append(prep.jit)
            self._plan.add_jit(refs, prep.lin, out, desc.numel, map_address(prep.jit), map_work(desc))
            return
        code = (prep.maps, prep.out_shape, desc.K, *prep.programs, out)
        if plan.kind == "dot":
            (a_size, a_st, a_off), (b_size, b_st, b_off) = plan.views
            bshape = a_size[:-2]
            aoff = a_off + _grid_offsets(bshape, a_st[:-2])
            boff = b_off + _grid_offsets(bshape, b_st[:-2])
            M, N = a_size[-2], b_size[-1]
            self._plan.add_dot(refs, *code, *plan.slots, M, N, aoff, a_st[-2], a_st[-1], boff, b_st[-2], b_st[-1])
            return
        if plan.kind == "fold":
            ((_, st, x_off),) = plan.views
            m = desc.inputs[plan.slots[0]]
            sr = linear_stride(m, desc.out_shape)
            if sr is not None:
                self._plan.add_fold(refs, *code, plan.slots[0], int(cast(int, plan.op)), x_off, sr, st[-1])
                return
        elif plan.kind == "rowdot":
            (_, (sra, ska), a_at), (_, (srb, skb), b_at) = plan.views
            sa, sb = plan.slots
            self._plan.add_rowdot(refs, *code, sa, a_at, sra, ska, sb, b_at, srb, skb)
            return
        elif plan.kind == "binary":
            self._plan.add_binary(refs, out, desc.numel, int(cast(int, plan.op)))
            return
        elif plan.kind == "scatter":
            self._plan.add_scatter(refs, out, desc.K, desc.numel // desc.out_shape[0], desc.out_shape[0])
            return
        self._plan.add_program(refs, *code)

    def run(self, prev_arena: np.ndarray, batch: np.ndarray) -> np.ndarray:
        threads = self.backend.threads_now()
        prev = torch.from_numpy(writable(prev_arena))  # read-only: another backend's arena (rare), copied
        b = torch.from_numpy(writable(batch))
        times = None if self.node_times is None else torch.from_numpy(self.node_times)
        return self._plan.run(prev, b, threads, times).numpy()



def _grid_offsets(shape: Sequence[int], strides: Sequence[int]) -> torch.Tensor:
    """Element offsets of every index of ``shape`` (C order) under ``strides``; one for ()."""
    off = torch.zeros(1, dtype=torch.int64)
    for n, s in zip(shape, strides):
        off = (off[:, None] + torch.arange(n, dtype=torch.int64)[None, :] * s).reshape(-1)
    return off
