"""Building and loading the RepOps CUDA kernels (``kernels/cuda/``): the torch extension
(``torch.utils.cpp_extension.load``, for THIS device's architecture) or, when cpp_extension cannot
build (nvcc's CUDA major version differs from torch's, say), the .cu alone built by nvcc and called
through ctypes (:class:`CtypesCuda`).

Both are compiled with nvcc flags that the bits depend on: ``--fmad=false -ftz=false
-prec-div=true -prec-sqrt=true`` and never fast math; the interpreter's arithmetic is written
with ``__fadd_rn``-style intrinsics anyway (kernels/repops_fp32.h), so no flag can fuse or
approximate it. The build cache key covers every source and header.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from verde_chain.repops.backends.build_lock import exclusive_build
from verde_chain.repops.backends.cpu.extension import BUILD_ROOT, KERNELS, source_key
from verde_chain.repops.backends.registry import BackendUnavailable

CU_SOURCE = KERNELS / "cuda" / "repops_cuda.cu"
BINDING_SOURCE = KERNELS / "cuda" / "repops_cuda_binding.cpp"
HEADERS = (
    KERNELS / "cuda" / "repops_cuda.h",
    KERNELS / "repops_program.cuh",
    KERNELS / "repops_fp32.h",
    KERNELS / "generated" / "repops_isa.h",
)
# nvcc flags the semantics depend on (tests/test_cuda_compile.py checks the PTX they produce).
CUDA_SEMANTIC_FLAGS = ["--fmad=false", "-ftz=false", "-prec-div=true", "-prec-sqrt=true"]
# -Werror=switch on the host pass: an opcode without a case in the interpreter's switch
# (kernels/repops_program.cuh, __host__ __device__) fails the build.
CUDA_FLAGS = ["-O3", *CUDA_SEMANTIC_FLAGS, "-Xcompiler", "-Werror=switch"]


class CudaUnavailable(BackendUnavailable):
    """The RepOps CUDA backend cannot run here (no CUDA build of torch, no device, no nvcc)."""


def cuda_status() -> str | None:
    """None if torch can run CUDA kernels here, else the reason (for the error message)."""
    if not torch.cuda.is_available():
        built = torch.version.cuda
        if built is None:
            return f"CUDA is not available: torch {torch.__version__} is a CPU-only build"
        return f"CUDA is not available: torch {torch.__version__} (CUDA {built}) sees no CUDA device"
    return None



def _source_key(extra: Sequence[str]) -> str:
    return source_key((BINDING_SOURCE, CU_SOURCE, *HEADERS), extra)


def build_extension() -> Any:
    """JIT-build kernels/cuda/repops_cuda.cu + the torch binding for THIS device's architecture
    (cached under build/native/ by source, flags, torch version and compute capability)."""
    from torch.utils import cpp_extension

    major, minor = torch.cuda.get_device_capability()
    # Compile for exactly this device (sm_90 on H100/H200).
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    name = f"verde_repops_cuda_{_source_key([*CUDA_FLAGS, torch.__version__, f'{major}.{minor}'])}"
    with exclusive_build(BUILD_ROOT / name):
        return cpp_extension.load(
            name=name,
            sources=[str(BINDING_SOURCE), str(CU_SOURCE)],
            extra_cflags=["-O3"],
            extra_cuda_cflags=CUDA_FLAGS,
            extra_include_paths=[str(KERNELS)],
            build_directory=str(BUILD_ROOT / name),
            verbose=False,
        )


def byte_extent(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) bytes of memory a strided tensor can touch (any stride sign)."""
    lo = hi = t.data_ptr()
    for n, st in zip(t.shape, t.stride()):
        span = (n - 1) * st * t.element_size()
        lo, hi = (lo + span, hi) if span < 0 else (lo, hi + span)
    return lo, hi + t.element_size()


def check_out(out: torch.Tensor, dtype: torch.dtype, numel: int, reads: Sequence[torch.Tensor]) -> None:
    """An ``out=`` tensor a kernel may write: contiguous, of the right type and size, and apart
    from every tensor the kernel reads (the same checks as the torch binding)."""
    if out.dtype != dtype or not out.is_contiguous() or out.numel() != numel:
        raise ValueError(
            f"out must be a contiguous {dtype} tensor of {numel} elements, got {out.dtype} {tuple(out.shape)}"
        )
    # SAFETY: the kernels read their operands while other threads write the output (the GEMM
    # tiles, the interpreter's restrict pointers): an overlap would make the bits order-dependent.
    olo, ohi = byte_extent(out)
    for x in reads:
        if x.numel() and out.numel():
            lo, hi = byte_extent(x)
            if lo < ohi and olo < hi:
                raise ValueError("out overlaps an operand of the kernel")


def _decode_call(
    inputs: list[torch.Tensor], maps: torch.Tensor, out_shape: list[int], programs: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, list[torch.Tensor], int]:
    """(host maps, host programs, output numel) of a program call, with the inputs checked as the
    binding checks them (the ctypes fallback's run_program and prepare_program share it)."""
    rank = len(out_shape)
    maps_h = maps.to("cpu", torch.int64).contiguous()
    progs = [t.to("cpu", torch.int64).contiguous() for t in programs]
    for t, x in enumerate(inputs):
        if not (x.is_cuda and x.dtype == torch.int32 and x.is_contiguous()):
            raise ValueError("inputs must be contiguous CUDA int32 bit tensors")
        if int(maps_h[t, rank + 3]) != x.numel():
            raise ValueError(f"input {t} has {x.numel()} elements, map says {int(maps_h[t, rank + 3])}")
    return maps_h, progs, int(np.prod(out_shape)) if out_shape else 1


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
        self.lib.repops_cuda_launch_bytes.argtypes = []
        self.lib.repops_cuda_launch_bytes.restype = i64
        self.lib.repops_cuda_prepare_program.argtypes = [
            p, i64, p, p, i64, i64, p, i64, p, i64, p, i64, p, p, p, p, i64, p, ctypes.c_char_p, i64,
        ]  # fmt: skip
        self.lib.repops_cuda_prepare_program.restype = ctypes.c_int
        self.lib.repops_cuda_launch_program.argtypes = [p, p]
        self.lib.repops_cuda_launch_program.restype = ctypes.c_int

    def matmul3(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        batch, m, k = a.shape
        n = b.shape[2]
        if out is None:
            c = torch.empty(batch, m, n, device=a.device, dtype=torch.float32)
        else:
            check_out(out, torch.float32, batch * m * n, (a, b))
            c = out
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
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        rank = len(out_shape)
        maps_h, progs, numel = _decode_call(inputs, maps, out_shape, (pro, body, epi))
        device = inputs[0].device if inputs else torch.device("cuda")
        if out is None:
            out = torch.empty(numel, dtype=torch.int32, device=device)
        else:
            check_out(out, torch.int32, numel, (*inputs, *(() if r0_init is None else (r0_init,))))
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

    def prepare_program(
        self, inputs: list[torch.Tensor], maps: torch.Tensor, out_shape: list[int], K: int,
        pro: torch.Tensor, body: torch.Tensor, epi: torch.Tensor, r0_init: torch.Tensor | None, out: torch.Tensor,
    ) -> list[torch.Tensor]:  # fmt: skip
        """The binding's prepare_program: [launch parameters (CPU uint8), staged descriptor]."""
        rank = len(out_shape)
        maps_h, progs, numel = _decode_call(inputs, maps, out_shape, (pro, body, epi))
        if r0_init is not None and not (r0_init.is_cuda and r0_init.dtype == torch.int32 and r0_init.is_contiguous()
                                        and r0_init.numel() == numel):  # fmt: skip
            raise ValueError("r0_init must be a contiguous CUDA int32 tensor with one value per output element")
        check_out(out, torch.int32, numel, (*inputs, *(() if r0_init is None else (r0_init,))))
        n_instr = sum(p.shape[0] for p in progs)
        nbytes = int(self.lib.repops_cuda_program_scratch_bytes(len(inputs), n_instr))
        blob = torch.empty(nbytes, dtype=torch.uint8, device=out.device)
        launch = torch.zeros(int(self.lib.repops_cuda_launch_bytes()), dtype=torch.uint8)
        ptrs = (ctypes.c_void_p * max(1, len(inputs)))(*[x.data_ptr() for x in inputs])
        shape = (ctypes.c_int64 * max(1, rank))(*out_shape)
        err = ctypes.create_string_buffer(256)
        stream = torch.cuda.current_stream(out.device).cuda_stream
        rc = self.lib.repops_cuda_prepare_program(
            ptrs, len(inputs), maps_h.data_ptr(), shape, rank, K,
            progs[0].data_ptr(), progs[0].shape[0], progs[1].data_ptr(), progs[1].shape[0],
            progs[2].data_ptr(), progs[2].shape[0], None if r0_init is None else r0_init.data_ptr(),
            out.data_ptr(), launch.data_ptr(), blob.data_ptr(), nbytes, stream, err, len(err),
        )  # fmt: skip
        if rc == -1:
            raise ValueError(f"repops_cuda_prepare_program refused the descriptor: {err.value.decode()}")
        if rc != 0:
            raise RuntimeError(f"repops_cuda_prepare_program failed with CUDA error {rc}")
        torch.cuda.current_stream(out.device).synchronize()
        return [launch, blob]

    def launch_program(self, launch: torch.Tensor, blob: torch.Tensor) -> None:
        """The binding's launch_program (synchronous here, like the other fallback calls)."""
        if launch.is_cuda or launch.dtype != torch.uint8 or launch.numel() != int(self.lib.repops_cuda_launch_bytes()):
            raise ValueError("launch must be the CPU uint8 tensor prepare_program returned")
        stream = torch.cuda.current_stream(blob.device)
        rc = self.lib.repops_cuda_launch_program(launch.data_ptr(), stream.cuda_stream)
        if rc != 0:
            raise RuntimeError(f"repops_cuda_launch_program failed with CUDA error {rc}")
        stream.synchronize()


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
