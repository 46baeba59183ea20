"""The CUDA backend of the RepOps dispatch: ``(desc, inputs) -> np.ndarray``, bit-identical to
``reference.run`` for every KernelDesc, on an NVIDIA GPU.

What runs where (the planning of ``backends/plan.py``, which the CPU backend uses too)::

    dot      prologue LOAD/LOAD/MUL, body LOAD/LOAD/FMA, GEMM-shaped output
                                                   -> CUDA GEMM (kernels/cuda/repops_cuda.cu), then
                                                      the epilogue on the interpreter, r0 preset
                                                      (only when it reads no register but r0)
    anything else                                  -> the CUDA program interpreter: one thread per
                                                      output element running the KernelDesc's
                                                      program (kernels/repops_program.cuh)

The kernels and their build: ``backends/cuda/extension.py``. The backend API is numpy in, numpy
out (the registry's): inputs are copied to the GPU per node and the result back. That is the
price of the common interface, not of the kernels; the training executor avoids it through
``compile_step`` (``backends/cuda/step.py``, :class:`CudaStepKernel`): a whole step on device
buffers, one batch upload, at most one arena upload and one arena download per step, every node
prepared once (``prepare_program``: decoded, checked and staged on the device) and then only
launched. ``make_runner("cuda")`` hands out :class:`CudaRunner` for it.

Without CUDA (a CPU build of torch, or no device), constructing :class:`CudaBackend` or calling
:func:`backend` raises :class:`CudaUnavailable` saying so; nothing silently falls back.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from verde_chain.repops import windowed
from verde_chain.repops.backends.cuda.extension import CudaUnavailable, cuda_status, load_extension
from verde_chain.repops.backends.native import PerDesc, encode_desc, writable
from verde_chain.repops.backends.plan import Plan, classify
from verde_chain.repops.program import KernelDesc, check_inputs

if TYPE_CHECKING:
    from verde_chain.repops.backends.cuda.step import CudaStepKernel

# The fast kernels the CUDA backend has (the rest runs on its interpreter).
KINDS = frozenset({"dot"})


@dataclass(frozen=True)
class Prepared:
    plan: Plan
    programs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    maps: torch.Tensor


class CudaBackend:
    """``backend(desc, inputs)`` on the GPU (see the module docstring)."""

    def __init__(self, device: str | torch.device | None = None, ext: Any = None) -> None:
        reason = cuda_status()
        if reason is not None:
            raise CudaUnavailable(reason)
        self.device = torch.device(device if device is not None else "cuda")
        if ext is None:
            ext, self.build_mode, self.build_warning = load_extension()
        else:
            self.build_mode, self.build_warning = "given", None
        self.extension = ext  # the built kernels: the torch extension or CtypesCuda
        self.prepare: PerDesc[Prepared] = PerDesc(self._prepare)
        """The plan and encodings of a descriptor, made once per descriptor."""

    @staticmethod
    def _prepare(desc: KernelDesc) -> Prepared:
        (pro, body, epi), maps = encode_desc(desc)
        programs = (torch.from_numpy(pro), torch.from_numpy(body), torch.from_numpy(epi))
        return Prepared(classify(desc, KINDS), programs, torch.from_numpy(maps))

    def compile_step(
        self,
        descs: Sequence[KernelDesc],
        wiring: Sequence[Sequence[tuple[int, int]]],
        producers: Sequence[int],
        batch_numel: int,
        keep: Collection[int] | None = None,
    ) -> CudaStepKernel | None:
        """A whole training step on device tensors (see :class:`CudaStepKernel`); None (nodes one
        by one) while a node uses the window extension, which the device kernels do not read yet.
        ``keep`` is accepted and ignored: the device kernel keeps every node output (the full
        ``ArenaLayout``), which the executor handles like any full layout."""
        from verde_chain.repops.backends.cuda.step import CudaStepKernel

        if any(desc.extended for desc in descs):
            return None
        return CudaStepKernel(self, descs, wiring, producers, batch_numel)

    def upload(self, dst: torch.Tensor, src: np.ndarray) -> None:
        """Host -> device: ``src`` (float32 bits) into the device int32 tensor ``dst``."""
        dst.copy_(torch.from_numpy(writable(src).view(np.int32)))

    def download(self, src: torch.Tensor) -> np.ndarray:
        """Device -> host: a new float32 array with the bits of the device int32 tensor ``src``
        (pinned memory on a GPU: the copy runs at full bus speed)."""
        host = torch.empty(src.numel(), dtype=torch.int32, pin_memory=src.is_cuda)
        host.copy_(src)  # synchronous: the host array is complete when this returns
        return host.numpy().view(np.float32)

    def path(self, desc: KernelDesc) -> str:
        """Which kernel runs ``desc``: dot | program."""
        return self.prepare(desc).plan.kind

    def __call__(self, desc: KernelDesc, inputs: Sequence[np.ndarray]) -> np.ndarray:
        if desc.extended:
            # convolutions on the device's windowed GEMM (operands read through their windows);
            # an extension without it gathers them on the host (windowed.explicit); the rest is
            # dewindowed onto the device interpreter (repops/windowed.py)
            gemm = self._windowed_gemm if hasattr(self.extension, "windowed_matmul") else windowed.explicit(self._gemm)
            return windowed.run(desc, inputs, gemm, self)
        prep = self.prepare(desc)
        flat = check_inputs(desc, inputs)
        dev = [self._to_device(x) for x in flat]
        pro, body, epi = prep.programs
        r0: torch.Tensor | None = None
        if prep.plan.kind == "dot":
            a, b = (
                dev[slot].view(torch.float32).as_strided(size, stride, off).reshape(shape)
                for slot, (size, stride, off), shape in zip(prep.plan.slots, prep.plan.views, prep.plan.shapes)
            )
            r0 = self.extension.matmul3(a, b).reshape(-1).view(torch.int32)
            if not desc.epilogue:
                return self._host(r0, desc)
        out = self.extension.run_program(dev, prep.maps, list(desc.out_shape), desc.K, pro, body, epi, r0, 0)
        return self._host(out, desc)

    def _gemm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """(nb, M, K) @ (nb, K, N) float32 host arrays on the device GEMM."""
        da, db = (self._to_device(x).view(torch.float32) for x in (a, b))
        return self.extension.matmul3(da, db).cpu().numpy()

    def _windowed_gemm(self, a: windowed.Operand, a_bits: np.ndarray, b: windowed.Operand, b_bits: np.ndarray,
                       nb: int, M: int, N: int) -> np.ndarray:
        """The device's windowed GEMM (kernels/cuda/repops_cuda.cu repops_wgemm_kernel)."""
        args: list[Any] = []
        for op, bits in ((a, a_bits), (b, b_bits)):
            tables = [torch.from_numpy(t).to(self.device) for t in (op.rows, op.ks, op.wins)]
            args += [self._to_device(bits), *tables, int(op.fill)]
        return self.extension.windowed_matmul(*args, nb, M, N, int(a.ks.shape[0])).cpu().numpy()

    def _to_device(self, x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(writable(np.ascontiguousarray(x).view(np.int32))).to(self.device)

    @staticmethod
    def _host(bits: torch.Tensor, desc: KernelDesc) -> np.ndarray:
        return bits.cpu().numpy().view(np.float32).reshape(desc.out_shape)


class CudaRunner:
    """The CUDA backend as registered (``BACKENDS["cuda"]``, ``make_runner("cuda")``):
    ``(desc, inputs) -> np.ndarray`` plus ``compile_step`` (whole steps on the device), both on
    the shared :func:`default_backend`, built on first USE: without CUDA the error comes then."""

    def __call__(self, desc: KernelDesc, inputs: list[np.ndarray]) -> np.ndarray:
        return default_backend()(desc, inputs)

    def compile_step(self, *args: Any, **kw: Any) -> CudaStepKernel | None:
        """:meth:`CudaBackend.compile_step` of the shared backend."""
        return default_backend().compile_step(*args, **kw)


@functools.cache
def default_backend() -> CudaBackend:
    """One shared backend (built once); raises CudaUnavailable where CUDA cannot run."""
    return CudaBackend()


# The ``ops.BACKENDS`` entry. Never returns None: without CUDA it raises :class:`CudaUnavailable`
# (a CUDA tensor must not silently run somewhere else).
# The registry's entry. Never returns None: without CUDA it raises :class:`CudaUnavailable`
# (a CUDA tensor must not silently run somewhere else).
backend = CudaRunner()


def register(name: str = "cuda") -> None:
    """Make the torch-facing API run tensors of device ``name`` on the CUDA kernels."""
    from verde_chain.repops.backends import registry

    registry.register(name, backend)
