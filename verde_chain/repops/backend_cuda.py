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
node and the result back. That is the price of the common interface, not of the kernels; the
training executor avoids it through ``compile_step`` (:class:`CudaStepKernel`): a whole step
on device buffers, one batch upload, at most one arena upload and one arena download per step,
every node prepared once (``prepare_program``: decoded, checked and staged on the device) and
then only launched. ``make_runner("cuda")`` should hand out :class:`CudaRunner` for it.

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
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verde_chain.errors import RepOpsError
from verde_chain.repops import windowed
from verde_chain.repops.backend_cpu import (
    _BATCH,
    _NODE,
    _PREV,
    ArenaLayout,
    BackendUnavailable,
    Plan,
    _dot_plan,
    _match_dot,
    live_in,
)
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
        if desc.extended:
            # SAFETY: the device interpreter reads no windows; running one would read wrong memory
            raise RepOpsError(f"{desc.label or 'kernel'}: the CUDA backend does not run window descriptors yet")
        hit = self._prepared.get(id(desc))
        if hit is not None and hit[0] is desc:
            return hit[1]
        if len(self._prepared) >= 16384:
            self._prepared.clear()
        progs = tuple(torch.from_numpy(encode_program(p)) for p in (desc.prologue, desc.body, desc.epilogue))
        prep = _Prepared(plan(desc), progs, torch.from_numpy(encode_maps(desc.inputs, len(desc.out_shape))))  # type: ignore[arg-type]
        self._prepared[id(desc)] = (desc, prep)
        return prep

    def compile_step(
        self,
        descs: Sequence[KernelDesc],
        wiring: Sequence[Sequence[tuple[int, int]]],
        producers: Sequence[int],
        batch_numel: int,
    ) -> CudaStepKernel | None:
        """A whole training step on device tensors (see :class:`CudaStepKernel`); None (nodes one
        by one) while a node uses the window extension, which the device kernels do not read yet."""
        if any(desc.extended for desc in descs):
            return None
        return CudaStepKernel(self, descs, wiring, producers, batch_numel)

    def _upload(self, dst: torch.Tensor, src: np.ndarray) -> None:
        """Host -> device: ``src`` (float32 bits) into the device int32 tensor ``dst``."""
        dst.copy_(torch.from_numpy(_writable(src).view(np.int32)))

    def _download(self, src: torch.Tensor) -> np.ndarray:
        """Device -> host: a new float32 array with the bits of the device int32 tensor ``src``
        (pinned memory on a GPU: the copy runs at full bus speed)."""
        host = torch.empty(src.numel(), dtype=torch.int32, pin_memory=src.is_cuda)
        host.copy_(src)  # synchronous: the host array is complete when this returns
        return host.numpy().view(np.float32)

    def path(self, desc: KernelDesc) -> str:
        """Which kernel runs ``desc``: dot | program."""
        return self._prepare(desc).plan.kind

    def __call__(self, desc: KernelDesc, inputs: Sequence[np.ndarray]) -> np.ndarray:
        if desc.extended:
            # the device interpreter reads no windows yet: operands gathered on the host
            # (repops/windowed.py), then the GEMM and the plain programs run on the device
            return windowed.run(desc, inputs, self._gemm, self)
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

    def _gemm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """(nb, M, K) @ (nb, K, N) float32 host arrays on the device GEMM."""
        da, db = (self._to_device(x).view(torch.float32) for x in (a, b))
        return self._ext.matmul3(da, db).cpu().numpy()

    def _to_device(self, x: np.ndarray) -> torch.Tensor:
        a = np.ascontiguousarray(x).view(np.int32)
        # torch cannot wrap read-only arrays (graph stores may hand those over); a copy is free
        # next to the host -> device transfer.
        return torch.from_numpy(a if a.flags.writeable else a.copy()).to(self.device)

    @staticmethod
    def _host(bits: torch.Tensor, desc: KernelDesc) -> np.ndarray:
        return bits.cpu().numpy().view(np.float32).reshape(desc.out_shape)


# ======================================================================= whole-step kernel


@dataclass
class _NodeLaunch:
    """One node's launch on one arena parity, prepared once: every tensor below is a view of
    the step kernel's device buffers, so a step only launches kernels."""

    desc: KernelDesc
    prep: _Prepared
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
    ``backend_cpu.StepKernel`` that ``graph.executor.StepExecutor`` drives.

    Two device arenas (the CPU layout, :class:`~verde_chain.repops.backend_cpu.ArenaLayout`) alternate as "this step" and "the
    previous step", plus a device batch buffer. ``run(prev_arena, batch)``:

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
        preps = [backend._prepare(d) for d in descs]
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
        self, d: int, desc: KernelDesc, prep: _Prepared, wires: Sequence[tuple[int, int]], o: int
    ) -> _NodeLaunch:
        ins = []
        for (kind, i), m in zip(wires, desc.inputs, strict=True):
            if kind == _BATCH:
                x = self._batch[: self.batch_numel]
            elif kind == _PREV:
                x = self._slot(1 - o, i)
            elif kind == _NODE and i < d:
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
        node.program = self.backend._ext.prepare_program(
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
        self.backend._upload(self._arenas[p], np.ascontiguousarray(prev_arena).reshape(-1))
        return p

    def run(self, prev_arena: np.ndarray, batch: np.ndarray) -> np.ndarray:
        b = np.ascontiguousarray(batch, dtype=np.float32).reshape(-1)
        if b.size != self.batch_numel:
            raise RepOpsError(f"batch has {b.size} elements, the step kernel expects {self.batch_numel}")
        p = self._previous(prev_arena)
        o = 1 - p
        if self.batch_numel:
            self.backend._upload(self._batch[: self.batch_numel], b)
        self._gen[o] = 0  # overwritten below
        ext = self.backend._ext
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
        host = self.backend._download(self._arenas[o])
        host.flags.writeable = False
        gen, self._next_gen = self._next_gen, self._next_gen + 1
        self._gen[o] = gen
        self._last = (host, o, gen)
        return host


def _writable(a: np.ndarray) -> np.ndarray:
    # torch cannot wrap read-only arrays; a host copy is cheap next to the transfer it feeds
    return a if a.flags.writeable else a.copy()


class CudaRunner:
    """The CUDA backend as registered (``ops.BACKENDS["cuda"]``, ``make_runner("cuda")``):
    ``(desc, inputs) -> np.ndarray`` plus ``compile_step`` (whole steps on the device), both on
    the shared :func:`default_backend`, built on first USE: without CUDA the error comes then."""

    def __call__(self, desc: KernelDesc, inputs: list[np.ndarray]) -> np.ndarray:
        return default_backend()(desc, inputs)

    def compile_step(self, *args: Any) -> CudaStepKernel | None:
        """:meth:`CudaBackend.compile_step` of the shared backend."""
        return default_backend().compile_step(*args)


@functools.cache
def default_backend() -> CudaBackend:
    """One shared backend (built once); raises CudaUnavailable where CUDA cannot run."""
    return CudaBackend()


# The ``ops.BACKENDS`` entry. Never returns None: without CUDA it raises :class:`CudaUnavailable`
# (a CUDA tensor must not silently run somewhere else).
backend = CudaRunner()


def register(device_type: str = "cuda") -> None:
    """Make the torch-facing API run tensors of ``device_type`` on the CUDA kernels."""
    from verde_chain.repops import ops

    ops.register_backend(device_type, backend)
