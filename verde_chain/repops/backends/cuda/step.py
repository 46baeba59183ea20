"""The CUDA whole-step kernel: every node of a training step on device tensors."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from verde_chain.errors import RepOpsError
from verde_chain.graph.structure import SourceKind
from verde_chain.repops.backends.cuda.backend import CudaBackend, Prepared
from verde_chain.repops.backends.native import ArenaLayout
from verde_chain.repops.backends.plan import Plan
from verde_chain.repops.program import KernelDesc


@dataclass
class _NodeLaunch:
    """One node's launch on one arena parity, prepared once: every tensor below is a view of
    the step kernel's device buffers, so a step only launches kernels."""

    desc: KernelDesc
    prep: Prepared
    ins: list[torch.Tensor]  # int32 contiguous views: arena slots, the previous arena, the batch
    out: torch.Tensor  # int32 view of this node's arena slot
    # dot: GEMM operands (float32 3-D views, or None when the reshape must copy; then `operands`
    # rebuilds them each step), the GEMM's output (the slot itself, or the epilogue's r0 scratch)
    a: torch.Tensor | None = None
    b: torch.Tensor | None = None
    gemm_out: torch.Tensor | None = None
    r0: torch.Tensor | None = None
    # the interpreter's part (the whole node, or a dot's epilogue), prepared by the extension:
    # [launch parameters, staged descriptor] with every buffer address baked in
    program: list[torch.Tensor] | None = None

    def operands(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.a is not None and self.b is not None:
            return self.a, self.b
        a, b = _gemm_views(self.prep.plan, self.ins)
        return a, b


def _gemm_views(plan: Plan, ins: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The GEMM operands of a dot plan as views of the input tensors (``as_strided`` offsets are
    storage offsets, hence the input view's own offset added). A reshape of a broadcast batch
    may copy (on the device): ``_NodeLaunch.operands`` then rebuilds it every step."""
    out = []
    for slot, (size, stride, off), shape in zip(plan.slots, plan.views, plan.shapes):
        base = ins[slot].view(torch.float32)
        out.append(base.as_strided(size, stride, base.storage_offset() + off).reshape(shape))
    return out


def _shares_storage(x: torch.Tensor, base: torch.Tensor) -> bool:
    return x.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


class CudaStepKernel(ArenaLayout):
    """Every node of a training step on device tensors, with the interface of the CPU
    ``backends/cpu/step.py`` ``StepKernel`` that ``graph.executor.StepExecutor`` drives.

    Two device arenas (the CPU layout, :class:`~verde_chain.repops.backends.native.ArenaLayout`)
    alternate as "this step" and "the previous step", plus a device batch buffer.
    ``run(prev_arena, batch)``:

    * previous state: if ``prev_arena`` is the host array this kernel's last ``run`` returned,
      the device arena it was copied from is still intact and is read directly (no transfer);
      any other array (C_0 packed, a checkpoint, a ``dataclasses.replace``d state, an older
      arena) is uploaded: ONE host -> device copy;
    * the batch: ONE host -> device copy;
    * every node: the GEMM (``matmul3(a, b, out=)`` on strided views of those buffers) and/or
      the interpreter (``launch_program``: the node was decoded, checked and staged on the
      device once, by ``prepare_program``, with its buffers' addresses), the output written
      straight into its arena slot (a GEMM with an epilogue: into a scratch r0 first);
    * ONE device -> host copy of the arena, returned READ-ONLY.

    The last returned array is recognised by identity AND a generation number recorded for the
    device arena it came from (so a device arena overwritten since can never be mistaken for
    it); it is read-only so that it cannot be edited behind the device copy's back.
    """

    def __init__(
        self,
        backend: CudaBackend,
        descs: Sequence[KernelDesc],
        wiring: Sequence[Sequence[tuple[int, int]]],
        producers: Sequence[int],
        batch_numel: int,
    ) -> None:
        super().__init__(descs, producers, batch_numel)
        self.backend = backend
        dev = backend.device
        # zeros: the padding between slots is never written, so returned arenas are deterministic
        self._arenas = [torch.zeros(self.arena_numel, dtype=torch.int32, device=dev) for _ in range(2)]
        self._batch = torch.zeros(max(batch_numel, 1), dtype=torch.int32, device=dev)
        self._gen = [0, 0]  # generation held by each device arena (0: none a host array has)
        self._next_gen = 1
        self._last: tuple[np.ndarray, int, int] | None = None  # (host array, arena index, generation)
        preps = [backend.prepare(d) for d in descs]
        r0_numel = max([d.numel for d, p in zip(descs, preps) if p.plan.kind == "dot" and d.epilogue] or [0])
        self._r0 = torch.zeros(max(r0_numel, 1), dtype=torch.int32, device=dev)
        # _launches[o]: the nodes writing arena o and reading arena 1 - o as the previous step
        self._launches = [
            [
                self._launch(d, desc, prep, wires, o)
                for d, (desc, prep, wires) in enumerate(zip(descs, preps, wiring, strict=True))
            ]
            for o in (0, 1)
        ]

    def _slot(self, arena: int, d: int) -> torch.Tensor:
        return self._arenas[arena][self._slices[d]]

    def _launch(
        self, d: int, desc: KernelDesc, prep: Prepared, wires: Sequence[tuple[int, int]], o: int
    ) -> _NodeLaunch:
        ins = []
        for (kind, i), m in zip(wires, desc.inputs, strict=True):
            if kind == SourceKind.BATCH:
                x = self._batch[: self.batch_numel]
            elif kind == SourceKind.PREV_STEP_NODE_OUTPUT:
                x = self._slot(1 - o, i)
            elif kind == SourceKind.NODE_OUTPUT and i < d:
                x = self._slot(o, i)
            else:
                raise RepOpsError(f"node {d} ({desc.label or '?'}) reads source ({kind}, {i}): not an earlier node")
            # SAFETY: the interpreter's address checks trust the map's numel; it must be the size
            # of the buffer slice it reads (as the CPU StepKernel's _refs checks).
            if x.numel() != m.numel:
                raise RepOpsError(
                    f"node {desc.label or '?'}: input has {x.numel()} elements, its map expects {m.numel}"
                )
            ins.append(x)
        node = _NodeLaunch(desc, prep, ins, self._slot(o, d))
        if prep.plan.kind == "dot":
            a, b = _gemm_views(prep.plan, ins)
            views = all(_shares_storage(t, ins[s]) for t, s in zip((a, b), prep.plan.slots))
            node.a, node.b = (a, b) if views else (None, None)
            nb, M, N = a.shape[0], a.shape[1], b.shape[2]
            if desc.epilogue:
                # the GEMM writes a scratch r0 (shared: nodes run one after another on one
                # stream), the epilogue reads it and writes the slot (never the same buffer: the
                # interpreter's r0_init and out are restrict pointers)
                node.r0 = self._r0[: desc.numel]
                node.gemm_out = node.r0.view(torch.float32).view(nb, M, N)
            else:
                node.gemm_out = node.out.view(torch.float32).view(nb, M, N)
                return node
        # decoded, checked (addresses, out apart from every operand) and staged ONCE
        node.program = self.backend.extension.prepare_program(
            ins, prep.maps, list(desc.out_shape), desc.K, *prep.programs, node.r0, node.out
        )
        return node

    def _previous(self, prev_arena: np.ndarray) -> int:
        """The device arena holding ``prev_arena`` (uploading it unless it is still there)."""
        last = self._last
        if last is not None and last[0] is prev_arena and self._gen[last[1]] == last[2]:
            return last[1]
        if prev_arena.dtype != np.float32 or prev_arena.size != self.arena_numel:
            raise RepOpsError(
                f"previous arena must be {self.arena_numel} float32 values, got {prev_arena.dtype} {prev_arena.shape}"
            )
        p = 0 if last is None else 1 - last[1]  # either arena will do: both are overwritten
        self._gen[p] = 0  # about to be overwritten: no host array describes it any more
        self.backend.upload(self._arenas[p], np.ascontiguousarray(prev_arena).reshape(-1))
        return p

    def run(self, prev_arena: np.ndarray, batch: np.ndarray) -> np.ndarray:
        b = np.ascontiguousarray(batch, dtype=np.float32).reshape(-1)
        if b.size != self.batch_numel:
            raise RepOpsError(f"batch has {b.size} elements, the step kernel expects {self.batch_numel}")
        p = self._previous(prev_arena)
        o = 1 - p
        if self.batch_numel:
            self.backend.upload(self._batch[: self.batch_numel], b)
        self._gen[o] = 0  # overwritten below
        ext = self.backend.extension
        times = self.node_times
        sync = torch.cuda.synchronize if self.backend.device.type == "cuda" else (lambda: None)
        for d, node in enumerate(self._launches[o]):
            t0 = time.perf_counter() if times is not None else 0.0
            if node.gemm_out is not None:
                a, b3 = node.operands()
                ext.matmul3(a, b3, out=node.gemm_out)
            if node.program is not None:
                ext.launch_program(*node.program)
            if times is not None:
                sync()
                times[d] += time.perf_counter() - t0
        host = self.backend.download(self._arenas[o])
        host.flags.writeable = False
        gen, self._next_gen = self._next_gen, self._next_gen + 1
        self._gen[o] = gen
        self._last = (host, o, gen)
        return host
