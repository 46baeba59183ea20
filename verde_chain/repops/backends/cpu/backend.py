"""The C++ CPU backend: ``(desc, inputs) -> np.ndarray``, bit-identical to ``reference.run`` for
every KernelDesc, on the extension of ``backends/cpu/extension.py`` (kernels/cpu/).

Every node is planned once (cached per desc) by the structure of its program
(``backends/plan.py``): dot -> GEMM, fold -> reduction, binary -> vector binary, scatter ->
bucketed scatter-add, rowdot -> per-row dot chains (kernels/cpu/norm.cpp), each fast kernel followed by the epilogue: a
compiled map over the kernel's result where it is eligible (``jit.epilogue_map``: gemm's bias,
the dot epilogues of ``graph/peephole.py``), else the interpreter with r0 preset; any other program -> a compiled map if it is a long straight-line map
(``backends/cpu/jit.py``), else the interpreter, which executes ANY program exactly (BLOCK output
elements per register array, one vectorised lane loop per instruction, k in the spec's one
order; kernels/cpu/interpreter.cpp). Encodings handed to the extension: ``backends/native.py``.

Whole steps: ``compile_step`` (used by the training executor) builds a ``StepKernel``
(``backends/cpu/step.py``): the plans above for every node of a training step, handed once to a
C++ ``StepPlan`` that runs the whole step in one call with every node output in one arena. Same
kernels, same bits; it removes the ~10-20 us of Python, pybind and allocation per node that
made a step of small nodes 3x slower than torch eager.

Threads: every kernel, compiled maps included, runs on ``threads`` OS threads (default
``torch.get_num_threads()``, read per call) of the extension's persistent pool
(``kernels/cpu/pool.h``); they split OUTPUT elements only, never a k range, so no bit depends
on the thread count.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from verde_chain.errors import RepOpsError
from verde_chain.repops import windowed
from verde_chain.repops.backends.cpu import extension as ext
from verde_chain.repops.backends.cpu.codes import BinOp, ReduceOp
from verde_chain.repops.backends.cpu.jit import (
    JIT_LANES,
    JIT_MIN_INSTRS,
    epilogue_map,
    jit_compile,
    jit_source,
    map_address,
    map_lin,
    map_work,
    min_instrs_for,
)
from verde_chain.repops.backends.native import PerDesc, encode_desc, writable
from verde_chain.repops.backends.plan import Plan, classify
from verde_chain.repops.backends.registry import BackendUnavailable
from verde_chain.repops.program import KernelDesc, check_inputs

if TYPE_CHECKING:
    from verde_chain.repops.backends.cpu.step import StepKernel


@dataclass(frozen=True)
class Prepared:
    plan: Plan
    programs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # prologue, body, epilogue
    maps: torch.Tensor
    out_shape: list[int]
    jit: Callable[..., None] | None = None  # compiled map (backends/cpu/jit.py), else the interpreter
    lin: torch.Tensor | None = None  # the compiled map's input rows (jit.map_lin)
    epi: CompiledMap | None = None  # a dot/fold/rowdot's epilogue as a compiled map, else the interpreter


@dataclass(frozen=True)
class CompiledMap:
    """A compiled map the backend keeps beside a descriptor: an epilogue run over a kernel's
    result (``jit.epilogue_map``) or a window descriptor as one chain (``windowed_chain``). The
    function, its input rows (``jit.map_lin``) and its lane-instructions."""

    fn: Callable[..., None]
    lin: torch.Tensor
    work: int


class CpuBackend:
    """``backend(desc, inputs)``: the C++ kernels for every desc (see the module docstring)."""

    def __init__(
        self, isa: str | None = None, threads: int | None = None, jit: bool = True, jit_min_instrs: int = JIT_MIN_INSTRS,
        jit_epilogues: bool = True,
    ) -> None:
        try:
            self.isa = isa or ext.best_isa()
            self.extension = ext.extension(self.isa)  # the torch extension module of this ISA
        except RepOpsError as exc:
            raise BackendUnavailable(f"RepOps C++ kernels unavailable: {exc}") from exc
        except Exception as exc:
            raise BackendUnavailable(f"RepOps C++ kernels unavailable: {type(exc).__name__}: {exc}") from exc
        if threads is not None and threads < 1:
            raise RepOpsError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        self.jit = jit and os.environ.get("VERDE_REPOPS_JIT", "1") != "0"
        self.jit_min_instrs = jit_min_instrs
        # Tests and benchmarks switch the compiled epilogues off (the interpreter's bits, its cost).
        self.jit_epilogues = jit_epilogues and os.environ.get("VERDE_REPOPS_JIT_EPILOGUES", "1") != "0"
        self.prepare: PerDesc[Prepared] = PerDesc(self._prepare)
        """The plan, encodings and compiled map of a descriptor, made once per descriptor."""
        self.windowed_prepare: PerDesc[windowed.Prepared] = PerDesc(windowed.prepare)
        """A window descriptor's GEMM operand tables or dewindowed form, made once per descriptor."""
        self.windowed_chain: PerDesc[CompiledMap | None] = PerDesc(self._windowed_chain)
        """A window descriptor compiled as one chain over its inputs in place (``jit.k_linear``,
        ``jit.masked_window``), made once per descriptor."""

    def compile_step(self, descs: Sequence[KernelDesc], wiring: Sequence[Sequence[tuple[int, int]]],
                     producers: Sequence[int], batch_numel: int, keep: Collection[int] | None = None) -> StepKernel | None:
        """One C++ call per training step for these nodes (see ``StepKernel``; ``keep``: the
        shared layout, ``native.ArenaLayout``); None (nodes one by one) if a window node has no
        form the plan runs (``step.in_plan``)."""
        from verde_chain.repops.backends.cpu.step import StepKernel, in_plan

        if not all(in_plan(self, desc) for desc in descs):
            return None
        return StepKernel(self, descs, wiring, producers, batch_numel, keep)

    def plan(self, desc: KernelDesc) -> Plan:
        return self.prepare(desc).plan

    def path(self, desc: KernelDesc) -> str:
        """Which code runs ``desc``: dot | fold | binary | scatter | rowdot | jit | program (the
        interpreter); a window descriptor: "windowed jit" (``windowed_chain``) or "window" (its
        GEMM, scatter form or dewindowed form)."""
        if desc.extended:
            return "window" if self.windowed_chain(desc) is None else "windowed jit"
        prep = self.prepare(desc)
        return "jit" if prep.jit is not None else prep.plan.kind

    def _prepare(self, desc: KernelDesc) -> Prepared:
        plan = classify(desc)
        (pro, body, epi), maps = encode_desc(desc)
        jit = self._compile(desc) if plan.kind == "program" else None
        return Prepared(
            plan,
            (torch.from_numpy(pro), torch.from_numpy(body), torch.from_numpy(epi)),
            torch.from_numpy(maps),
            list(desc.out_shape),
            jit,
            None if jit is None else map_lin(desc),
            self.epilogue(desc) if plan.kind in ("dot", "fold", "rowdot") else None,
        )

    def _windowed_chain(self, desc: KernelDesc) -> CompiledMap | None:
        """A window descriptor that is no windowed GEMM nor max-pool backward, with K > 1 and
        windows that move with k alone (``jit.k_linear``: batch-norm statistics) or are masked
        per lane (``jit.masked_window``: pooling), as one compiled chain reading its inputs in
        place: no gather into scratch, so each input is read once, from where it lies."""
        prep = self.windowed_prepare(desc)
        if prep.gemm is not None or prep.pool_backward is not None:
            return None
        fn = self._compile(desc)
        return None if fn is None else CompiledMap(fn, map_lin(desc), map_work(desc))

    def epilogue(self, desc: KernelDesc) -> CompiledMap | None:
        """``desc``'s epilogue as a compiled map run over the kernel's result, or None (no
        epilogue, not an eligible map, compiled maps off): the interpreter runs it, r0 preset."""
        epi = epilogue_map(desc) if self.jit_epilogues else None
        fn = None if epi is None else self._compile(epi)
        return None if fn is None or epi is None else CompiledMap(fn, map_lin(epi), map_work(epi))

    def _compile(self, desc: KernelDesc) -> Callable[..., None] | None:
        # Big maps are worth a one-time compile whatever their length.
        if not self.jit:
            return None
        source = jit_source(desc, JIT_LANES.get(self.isa, 4), min_instrs_for(desc, self.jit_min_instrs))
        if source is None:
            return None
        try:
            return jit_compile(source, self.isa)
        except (BackendUnavailable, OSError) as exc:
            # SAFETY: the interpreter gives the same bits; losing speed is not worth failing.
            print(f"verde-chain: {exc}; running {desc.label or 'a map'} on the interpreter", file=sys.stderr)
            self.jit = False
            return None

    def threads_now(self) -> int:
        """The thread count of the next call: ``threads``, or torch's current count if None."""
        return torch.get_num_threads() if self.threads is None else self.threads

    def __call__(self, desc: KernelDesc, inputs: Sequence[np.ndarray]) -> np.ndarray:
        if desc.extended:  # the window extension: windowed GEMM or dewindowed (repops/windowed.py)
            chain = self.windowed_chain(desc)
            if chain is not None:
                out = self._run_map(chain.fn, chain.lin, chain.work, _int32_tensors(_flat_bits(desc, inputs)), desc.numel)
                return out.numpy().view(np.float32).reshape(desc.out_shape)
            wp = self.windowed_prepare(desc)
            split = None if wp.gemm is None else self.column_split(desc, wp.gemm)
            gemm = functools.partial(self._windowed_gemm, split=split) if split else self._windowed_gemm
            return windowed.run(desc, inputs, gemm, self, self._windowed_gather, wp, ordered=split is not None,
                                pool_backward=self._pool_backward)
        prep = self.prepare(desc)
        flat = _flat_bits(desc, inputs)
        plan = prep.plan
        if prep.jit is not None:
            out = self._run_map(prep.jit, prep.lin, map_work(desc), _int32_tensors(flat), desc.numel)
        elif plan.kind == "dot":
            out = self._dot(desc, plan, flat, prep)
        elif plan.kind == "fold":
            out = self._fold(desc, plan, flat, prep)
        elif plan.kind == "rowdot":
            a, b = self._views(plan, flat)
            out = self._epilogue(desc, flat, self.extension.rowdot(a, b, self.threads_now()), prep)
        elif plan.kind == "binary":
            a, b = (torch.from_numpy(x.view(np.float32)) for x in flat)
            out = ext.binary(cast(BinOp, plan.op), a, b, isa=self.isa, threads=self.threads).reshape(-1)
        elif plan.kind == "scatter":
            g, idx = (torch.from_numpy(x.view(np.float32)) for x in flat)
            out = self.extension.scatter_rows(g.reshape(desc.K, -1), idx, desc.out_shape[0], self.threads_now()).reshape(-1)
        else:
            out = self._program(desc, flat, prep)
        return out.numpy().view(np.float32).reshape(desc.out_shape)

    # ------------------------------------------------------------------ fast paths
    def _run_map(self, fn: Callable[..., None], lin: torch.Tensor | None, work: float, bits: list[torch.Tensor],
                 numel: int) -> torch.Tensor:
        """A compiled map (a plain map, an epilogue or a window chain) over its inputs' bits:
        the output's bits (int32), at this call's thread count."""
        return self.extension.run_map(map_address(fn), bits, lin, numel, work, self.threads_now())

    def column_split(self, desc: KernelDesc, g: windowed.WindowedGemm) -> tuple[int, int, int] | None:
        """``windowed.column_split`` at this ISA's micro-tile width (None: the GEMM's own order)."""
        return windowed.column_split(desc, g, int(self.extension.GEMM_NR))

    def _windowed_gemm(self, a: windowed.Operand, a_bits: np.ndarray, b: windowed.Operand, b_bits: np.ndarray,
                       nb: int, M: int, N: int, split: tuple[int, int, int] | None = None) -> np.ndarray:
        """The windowed GEMM with implicit im2col (kernels/cpu/conv.cpp), in the output's order
        if ``split`` (``column_split``)."""
        return ext.windowed_matmul(a, a_bits, b, b_bits, nb, M, N, self.isa, self.threads, split=split).numpy()

    def _windowed_gather(self, op: windowed.Operand, bits: np.ndarray, kmajor: bool) -> np.ndarray:
        """Every element of a windowed operand (kernels/cpu/conv.cpp), for dewindowed nodes."""
        return ext.windowed_gather(op, bits, self.isa, self.threads, kmajor).numpy().view(np.uint32)

    def _pool_backward(self, form: windowed.MaxPoolBackward, arg: np.ndarray, dy: np.ndarray) -> np.ndarray:
        """A max-pool backward in scatter form (kernels/cpu/window_plan.cpp)."""
        return ext.pool_backward(form, arg, dy, self.isa, self.threads).numpy()

    def _views(self, plan: Plan, flat: list[np.ndarray]) -> list[torch.Tensor]:
        # reshape keeps stride-0 (broadcast) batches as views where it can; a copy changes no value
        return [
            torch.from_numpy(flat[slot].view(np.float32)).as_strided(size, stride, off).reshape(shape)
            for slot, (size, stride, off), shape in zip(plan.slots, plan.views, plan.shapes)
        ]

    def _dot(self, desc: KernelDesc, plan: Plan, flat: list[np.ndarray], prep: Prepared) -> torch.Tensor:
        a, b = self._views(plan, flat)
        return self._epilogue(desc, flat, ext.matmul3(a, b, self.isa, self.threads).reshape(-1), prep)

    def _fold(self, desc: KernelDesc, plan: Plan, flat: list[np.ndarray], prep: Prepared) -> torch.Tensor:
        (x,) = self._views(plan, flat)
        return self._epilogue(desc, flat, ext.reduce_rows(x, cast(ReduceOp, plan.op), self.isa, self.threads), prep)

    def _epilogue(self, desc: KernelDesc, flat: list[np.ndarray], r0: torch.Tensor, prep: Prepared) -> torch.Tensor:
        if not desc.epilogue:
            return r0
        r0_bits = r0.contiguous().view(torch.int32)
        if prep.epi is not None:  # input 0: the kernel's result (jit.epilogue_map)
            bits = [r0_bits, *_int32_tensors(flat)]
            return self._run_map(prep.epi.fn, prep.epi.lin, prep.epi.work, bits, desc.numel).view(torch.float32)
        return self._program(desc, flat, prep, r0_bits)

    # ------------------------------------------------------------------ interpreter
    def _program(
        self, desc: KernelDesc, flat: list[np.ndarray], prep: Prepared, r0_init: torch.Tensor | None = None
    ) -> torch.Tensor:
        # The extension is called directly (not through ext.run_program): this path runs for
        # most nodes, and each small node's cost is mostly call overhead.
        pro, body, epi = prep.programs
        out = self.extension.run_program(
            [torch.from_numpy(x.view(np.int32)) for x in flat], prep.maps, prep.out_shape, desc.K,
            pro, body, epi, r0_init, self.threads_now(),
        )  # fmt: skip
        return out.view(torch.float32)



def _int32_tensors(flat: Sequence[np.ndarray]) -> list[torch.Tensor]:
    """The flat uint32 inputs as int32 tensors over the same memory (run_map's inputs)."""
    return [torch.from_numpy(x.view(np.int32)) for x in flat]


def _flat_bits(desc: KernelDesc, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Flat, writable uint32 views of the inputs (torch cannot wrap read-only numpy arrays),
    sizes checked against the maps: ``program.check_inputs`` with a fast path."""
    if len(inputs) != len(desc.inputs):
        return check_inputs(desc, inputs)  # raises the descriptive error
    out = []
    for x, m in zip(inputs, desc.inputs):
        if not (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.flags.c_contiguous and x.size == m.numel):
            return [writable(a) for a in check_inputs(desc, inputs)]
        out.append(writable(x.reshape(-1).view(np.uint32)))
    return out


@functools.cache
def default_backend() -> CpuBackend | None:
    """One shared backend (best ISA, torch's thread count), or None if the kernels cannot be
    built here (said once on stderr; the failure is cached, never retried per call)."""
    try:
        return CpuBackend()
    except BackendUnavailable as exc:
        print(f"verde-chain: {exc}; RepOps runs on the numpy reference", file=sys.stderr)
        return None


def backend(desc: KernelDesc, inputs: list[np.ndarray]) -> np.ndarray | None:
    """The registry's signature: the C++ result, or None (the reference runs it)."""
    fn = default_backend()
    return None if fn is None else fn(desc, inputs)


def register(name: str = "cpu") -> None:
    """Make the torch-facing API (``verde_chain.repops.matmul`` ...) run tensors of device
    ``name`` on the C++ kernels."""
    from verde_chain.repops.backends import registry

    registry.register(name, backend)
