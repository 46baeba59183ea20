"""The CUDA backend of the RepOps dispatch: ``(desc, inputs) -> np.ndarray``, bit-identical to
``reference.run`` for every KernelDesc, on an NVIDIA GPU.

What runs where (the same planning as the CPU backend, whose matchers are imported, not copied)::

    dot      prologue LOAD/LOAD/MUL, body LOAD/LOAD/FMA (backend_cpu._match_dot), GEMM-shaped
             output (backend_cpu._dot_plan)        -> CUDA GEMM (kernels/repops_cuda.cu), then
                                                      the epilogue on the interpreter, r0 preset
                                                      (only when it reads no register but r0)
    anything else                                  -> the CUDA program interpreter: one thread per
                                                      output element running the KernelDesc's
                                                      program (kernels/repops_program.cuh)

Both kernels are compiled by ``torch.utils.cpp_extension.load`` with nvcc flags that the bits
depend on: ``--fmad=false -ftz=false -prec-div=true -prec-sqrt=true`` and never fast math; the
interpreter's arithmetic is written with ``__fadd_rn``-style intrinsics anyway, so no flag can
fuse or approximate it. If cpp_extension cannot build (nvcc's CUDA major version differs from
torch's, say), the .cu alone is built by nvcc and called through ctypes (:class:`CtypesCuda`).

The backend API is numpy in, numpy out (``ops.BACKENDS``): inputs are copied to the GPU per
node and the result back. That is the price of the common interface, not of the kernels.

Without CUDA (a CPU build of torch, or no device), constructing :class:`CudaBackend` or calling
:func:`backend` raises :class:`CudaUnavailable` saying so; nothing silently falls back.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verde_chain.repops.backend_cpu import BackendUnavailable, Plan, _dot_plan, _match_dot, live_in
from verde_chain.repops.isa import Instr
from verde_chain.repops.program import InputMap, KernelDesc, check_inputs

REPO_ROOT = Path(__file__).resolve().parents[2]
KERNELS = REPO_ROOT / "kernels"
BUILD_ROOT = REPO_ROOT / "build" / "native"
CU_SOURCE = KERNELS / "repops_cuda.cu"
BINDING_SOURCE = KERNELS / "repops_cuda_binding.cpp"
HEADERS = (KERNELS / "repops_cuda.h", KERNELS / "repops_program.cuh")
# nvcc flags the semantics depend on (tests/test_cuda_compile.py checks the PTX they produce).
CUDA_SEMANTIC_FLAGS = ["--fmad=false", "-ftz=false", "-prec-div=true", "-prec-sqrt=true"]
CUDA_FLAGS = ["-O3", *CUDA_SEMANTIC_FLAGS]


class CudaUnavailable(BackendUnavailable):
    """The RepOps CUDA backend cannot run here (no CUDA build of torch, no device, no nvcc)."""


# ======================================================================= encodings


def encode_program(program: Sequence[Instr]) -> np.ndarray:
    """(n, 5) int64 rows ``op, dst, a, b, imm`` (the CPU and CUDA interpreters' encoding)."""
    rows = [(int(i.op), i.dst, i.a, i.b, i.imm) for i in program]
    return np.array(rows, dtype=np.int64).reshape(len(rows), 5)


def encode_maps(maps: Sequence[InputMap], rank: int) -> np.ndarray:
    """(n_inputs, rank + 4) int64 rows ``strides..., kstride, offset, idx_stride, numel``."""
    rows = [(*m.strides, m.kstride, m.offset, m.idx_stride, m.numel) for m in maps]
    return np.array(rows, dtype=np.int64).reshape(len(rows), rank + 4)


# ======================================================================= building


def cuda_status() -> str | None:
    """None if torch can run CUDA kernels here, else the reason (for the error message)."""
    if not torch.cuda.is_available():
        built = torch.version.cuda
        if built is None:
            return f"CUDA is not available: torch {torch.__version__} is a CPU-only build"
        return f"CUDA is not available: torch {torch.__version__} (CUDA {built}) sees no CUDA device"
    return None


def _source_key(extra: Sequence[str]) -> str:
    blob = b"".join(p.read_bytes() for p in (BINDING_SOURCE, CU_SOURCE, *HEADERS))
    return hashlib.sha256(blob + " ".join(extra).encode()).hexdigest()[:12]


def build_extension() -> Any:
    """JIT-build kernels/repops_cuda.cu + the torch binding for THIS device's architecture
    (cached under build/native/ by source, flags, torch version and compute capability)."""
    from torch.utils import cpp_extension

    major, minor = torch.cuda.get_device_capability()
    # Compile for exactly this device (sm_90 on H100/H200).
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    name = f"verde_repops_cuda_{_source_key([*CUDA_FLAGS, torch.__version__, f'{major}.{minor}'])}"
    build_dir = BUILD_ROOT / name
    build_dir.mkdir(parents=True, exist_ok=True)
    return cpp_extension.load(
        name=name,
        sources=[str(BINDING_SOURCE), str(CU_SOURCE)],
        extra_cflags=["-O3"],
        extra_cuda_cflags=CUDA_FLAGS,
        extra_include_paths=[str(KERNELS)],
        build_directory=str(build_dir),
        verbose=False,
    )


class CtypesCuda:
    """Fallback when cpp_extension cannot build (e.g. nvcc and torch.version.cuda differ in major
    version): the .cu alone, compiled by nvcc into a shared library and called through ctypes on
    torch's device pointers. Same ``matmul3`` / ``run_program`` signatures as the binding."""

    def __init__(self, arch: str | None = None) -> None:
        """``arch``: e.g. "90" for sm_90; default: the current device's compute capability."""
        nvcc = shutil.which("nvcc") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
        if arch is None:
            major, minor = torch.cuda.get_device_capability()
            arch = f"{major}{minor}"
        flags = [*CUDA_FLAGS, f"-arch=sm_{arch}", "-Xcompiler", "-fPIC", "-shared"]
        out_dir = BUILD_ROOT / f"repops_cuda_ctypes_{_source_key(flags)}"
        out_dir.mkdir(parents=True, exist_ok=True)
        so = out_dir / "librepops_cuda.so"
        if not so.exists():
            tmp = out_dir / f"librepops_cuda.{os.getpid()}.so"
            cmd = [nvcc, *flags, "-I", str(KERNELS), str(CU_SOURCE), "-o", str(tmp)]
            r = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if r.returncode != 0:
                raise CudaUnavailable(f"nvcc failed: {r.stderr[-2000:]}")
            os.replace(tmp, so)
        self.lib = ctypes.CDLL(str(so))
        i64, p = ctypes.c_int64, ctypes.c_void_p
        self.lib.repops_cuda_gemm.argtypes = [p, i64, i64, i64, p, i64, i64, i64, p, i64, i64, i64, i64, p]
        self.lib.repops_cuda_gemm.restype = ctypes.c_int
        self.lib.repops_cuda_program_scratch_bytes.argtypes = [i64, i64]
        self.lib.repops_cuda_program_scratch_bytes.restype = i64
        self.lib.repops_cuda_run_program.argtypes = [
            p, i64, p, p, i64, i64, p, i64, p, i64, p, i64, p, p, p, i64, p, ctypes.c_char_p, i64,
        ]  # fmt: skip
        self.lib.repops_cuda_run_program.restype = ctypes.c_int

    def matmul3(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        batch, m, k = a.shape
        n = b.shape[2]
        c = torch.empty(batch, m, n, device=a.device, dtype=torch.float32)
        torch.cuda.synchronize()
        for b0 in range(0, batch, 65535):
            nb = min(65535, batch - b0)
            rc = self.lib.repops_cuda_gemm(
                a.data_ptr() + 4 * b0 * a.stride(0), a.stride(0), a.stride(1), a.stride(2),
                b.data_ptr() + 4 * b0 * b.stride(0), b.stride(0), b.stride(1), b.stride(2),
                c.data_ptr() + 4 * b0 * m * n, nb, m, n, k, None,
            )  # fmt: skip
            if rc != 0:
                raise RuntimeError(f"repops_cuda_gemm returned CUDA error {rc}")
        torch.cuda.synchronize()
        return c

    def run_program(
        self, inputs: list[torch.Tensor], maps: torch.Tensor, out_shape: list[int], K: int,
        pro: torch.Tensor, body: torch.Tensor, epi: torch.Tensor, r0_init: torch.Tensor | None, threads: int,
    ) -> torch.Tensor:  # fmt: skip
        rank = len(out_shape)
        host = [t.to("cpu", torch.int64).contiguous() for t in (maps, pro, body, epi)]
        maps_h, progs = host[0], host[1:]
        for t, x in enumerate(inputs):
            if not (x.is_cuda and x.dtype == torch.int32 and x.is_contiguous()):
                raise ValueError("inputs must be contiguous CUDA int32 bit tensors")
            if int(maps_h[t, rank + 3]) != x.numel():
                raise ValueError(f"input {t} has {x.numel()} elements, map says {int(maps_h[t, rank + 3])}")
        numel = int(np.prod(out_shape)) if out_shape else 1
        device = inputs[0].device if inputs else torch.device("cuda")
        out = torch.empty(numel, dtype=torch.int32, device=device)
        n_instr = sum(p.shape[0] for p in progs)
        nbytes = int(self.lib.repops_cuda_program_scratch_bytes(len(inputs), n_instr))
        scratch = torch.empty(nbytes, dtype=torch.uint8, device=device)
        ptrs = (ctypes.c_void_p * max(1, len(inputs)))(*[x.data_ptr() for x in inputs])
        shape = (ctypes.c_int64 * max(1, rank))(*out_shape)
        err = ctypes.create_string_buffer(256)
        stream = torch.cuda.current_stream(device).cuda_stream
        rc = self.lib.repops_cuda_run_program(
            ptrs, len(inputs), maps_h.data_ptr(), shape, rank, K,
            progs[0].data_ptr(), progs[0].shape[0], progs[1].data_ptr(), progs[1].shape[0],
            progs[2].data_ptr(), progs[2].shape[0], None if r0_init is None else r0_init.data_ptr(),
            out.data_ptr(), scratch.data_ptr(), nbytes, stream, err, len(err),
        )  # fmt: skip
        if rc == -1:
            raise ValueError(f"repops_cuda_run_program refused the descriptor: {err.value.decode()}")
        if rc != 0:
            raise RuntimeError(f"repops_cuda_run_program failed with CUDA error {rc}")
        # Synchronous like matmul3 above: this fallback exists for checks, where a CUDA error
        # should surface at the call that caused it.
        torch.cuda.current_stream(device).synchronize()
        return out


def load_extension() -> tuple[Any, str, str | None]:
    """(extension, build mode, warning): cpp_extension, else the nvcc + ctypes fallback."""
    reason = cuda_status()
    if reason is not None:
        raise CudaUnavailable(reason)
    try:
        return build_extension(), "cpp_extension", None
    except Exception as exc:  # noqa: BLE001 - compiler failures arrive as several types
        warning = f"cpp_extension: {type(exc).__name__}: {str(exc)[-2000:]}"
    try:
        return CtypesCuda(), "nvcc+ctypes", warning
    except Exception as exc:
        raise CudaUnavailable(f"the RepOps CUDA kernels cannot be built: {warning}; nvcc+ctypes: {exc}") from exc


# ======================================================================= backend


def plan(desc: KernelDesc) -> Plan:
    """``dot`` (GEMM + epilogue) or ``program`` (the interpreter), from the program's structure."""
    if any(s < 0 for m in desc.inputs for s in (*m.strides, m.kstride)):
        return Plan("program")  # torch views (the GEMM's operands) cannot express negative strides
    dot = _match_dot(desc)
    if dot is not None and live_in(desc.epilogue) <= {0}:
        p = _dot_plan(desc, *dot)
        if p is not None:
            return p
    return Plan("program")


@dataclass(frozen=True)
class _Prepared:
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
        self._ext = ext
        self._prepared: dict[int, tuple[KernelDesc, _Prepared]] = {}

    def _prepare(self, desc: KernelDesc) -> _Prepared:
        hit = self._prepared.get(id(desc))
        if hit is not None and hit[0] is desc:
            return hit[1]
        if len(self._prepared) >= 16384:
            self._prepared.clear()
        progs = tuple(torch.from_numpy(encode_program(p)) for p in (desc.prologue, desc.body, desc.epilogue))
        prep = _Prepared(plan(desc), progs, torch.from_numpy(encode_maps(desc.inputs, len(desc.out_shape))))  # type: ignore[arg-type]
        self._prepared[id(desc)] = (desc, prep)
        return prep

    def path(self, desc: KernelDesc) -> str:
        """Which kernel runs ``desc``: dot | program."""
        return self._prepare(desc).plan.kind

    def __call__(self, desc: KernelDesc, inputs: Sequence[np.ndarray]) -> np.ndarray:
        prep = self._prepare(desc)
        flat = check_inputs(desc, inputs)
        dev = [self._to_device(x) for x in flat]
        pro, body, epi = prep.programs
        r0: torch.Tensor | None = None
        if prep.plan.kind == "dot":
            a, b = (
                dev[slot].view(torch.float32).as_strided(size, stride, off).reshape(shape)
                for slot, (size, stride, off), shape in zip(prep.plan.slots, prep.plan.views, prep.plan.shapes)
            )
            r0 = self._ext.matmul3(a, b).reshape(-1).view(torch.int32)
            if not desc.epilogue:
                return self._host(r0, desc)
        out = self._ext.run_program(dev, prep.maps, list(desc.out_shape), desc.K, pro, body, epi, r0, 0)
        return self._host(out, desc)

    def _to_device(self, x: np.ndarray) -> torch.Tensor:
        a = np.ascontiguousarray(x).view(np.int32)
        # torch cannot wrap read-only arrays (graph stores may hand those over); a copy is free
        # next to the host -> device transfer.
        return torch.from_numpy(a if a.flags.writeable else a.copy()).to(self.device)

    @staticmethod
    def _host(bits: torch.Tensor, desc: KernelDesc) -> np.ndarray:
        return bits.cpu().numpy().view(np.float32).reshape(desc.out_shape)


@functools.cache
def default_backend() -> CudaBackend:
    """One shared backend (built once); raises CudaUnavailable where CUDA cannot run."""
    return CudaBackend()


def backend(desc: KernelDesc, inputs: list[np.ndarray]) -> np.ndarray:
    """The ``ops.BACKENDS`` signature. Never returns None: without CUDA it raises
    :class:`CudaUnavailable` (a CUDA tensor must not silently run somewhere else)."""
    return default_backend()(desc, inputs)


def register(device_type: str = "cuda") -> None:
    """Make the torch-facing API run tensors of ``device_type`` on the CUDA kernels."""
    from verde_chain.repops import ops

    ops.register_backend(device_type, backend)
