"""The CUDA program interpreter (``kernels/repops_program.cuh``) built for the host, and a CPU
stand-in for the CUDA extension on top of it: how the CUDA backend's tests run without a GPU
(tests/repops/test_cuda_program.py, test_cuda_step.py)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from verde_chain.repops import program
from verde_chain.repops.backends.cpu import extension as cpu_ext
from verde_chain.repops.backends.cuda import extension as cuda_ext
from verde_chain.repops.backends.native import encode_maps, encode_program

REPO = Path(__file__).resolve().parents[2]
GXX = shutil.which("g++")

HOST_ENTRY = r"""
#include "repops_program.cuh"
#include <string.h>
#include <vector>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif
// The CUDA launcher's argument layout minus scratch and stream (host pointers throughout).
extern "C" int rp_host_run_program(const uint32_t* const* inputs, int64_t n_in, const int64_t* maps,
                                   const int64_t* shape, int64_t rank, int64_t K, const int64_t* pro, int64_t n_pro,
                                   const int64_t* body, int64_t n_body, const int64_t* epi, int64_t n_epi,
                                   const uint32_t* r0_init, uint32_t* out, char* err, int64_t err_len) {
    if (n_in < 0 || n_pro < 0 || n_body < 0 || n_epi < 0) return -1;
    std::vector<RpMap> m((size_t)(n_in > 0 ? n_in : 1));
    std::vector<RpInstr> code((size_t)(n_pro + n_body + n_epi > 0 ? n_pro + n_body + n_epi : 1));
    RpProgram p{};
    const char* bad = rp_decode(inputs, n_in, maps, shape, rank, K, pro, n_pro, body, n_body, epi, n_epi, &p,
                                m.data(), code.data());
    if (bad != nullptr) {
        strncpy(err, bad, (size_t)err_len - 1);
        return -1;
    }
    p.maps = m.data();
    p.code = code.data();
#if defined(__x86_64__)
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr & ~(0x8000u | 0x0040u | 0x6000u));  // no FTZ/DAZ, round to nearest (as a GPU)
#endif
    rp_host_run(p, r0_init, out);
#if defined(__x86_64__)
    _mm_setcsr(csr);
#endif
    return 0;
}
"""


class HostInterpreter:
    """``kernels/repops_program.cuh`` compiled for the host; a RepOps runner (desc, ins) -> out."""

    def __init__(self, so: Path) -> None:
        self.lib = ctypes.CDLL(str(so))
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        self.lib.rp_host_run_program.argtypes = [
            p,
            i64,
            p,
            p,
            i64,
            i64,
            p,
            i64,
            p,
            i64,
            p,
            i64,
            p,
            p,
            ctypes.c_char_p,
            i64,
        ]
        self.lib.rp_host_run_program.restype = ctypes.c_int

    def raw(
        self, inputs: Sequence[np.ndarray], maps: np.ndarray, shape: Sequence[int], K: int,
        progs: Sequence[np.ndarray], r0_init: np.ndarray | None = None,
    ) -> tuple[int, np.ndarray, str]:  # fmt: skip
        """Call the C entry point on encodings (no Python-side validation at all)."""
        ins = [np.ascontiguousarray(x).reshape(-1).view(np.uint32) for x in inputs]
        ptrs = (ctypes.c_void_p * max(1, len(ins)))(*[x.ctypes.data for x in ins])
        numel = int(np.prod(shape)) if len(shape) else 1
        out = np.zeros(max(numel, 1), np.uint32)
        shp = np.ascontiguousarray(shape, dtype=np.int64).reshape(-1)
        maps = np.ascontiguousarray(maps, dtype=np.int64)
        progs = [np.ascontiguousarray(p, dtype=np.int64) for p in progs]
        r0 = None if r0_init is None else np.ascontiguousarray(r0_init).reshape(-1).view(np.uint32)
        err = ctypes.create_string_buffer(256)
        rc = self.lib.rp_host_run_program(
            ptrs, len(ins), maps.ctypes.data, shp.ctypes.data, len(shape), K,
            progs[0].ctypes.data, len(progs[0]), progs[1].ctypes.data, len(progs[1]), progs[2].ctypes.data,
            len(progs[2]), None if r0 is None else r0.ctypes.data, out.ctypes.data, err, len(err),
        )  # fmt: skip
        return rc, out[:numel], err.value.decode()

    def run(
        self, desc: program.KernelDesc, inputs: Sequence[np.ndarray], r0_init: np.ndarray | None = None
    ) -> np.ndarray:
        flat = program.check_inputs(desc, inputs)
        progs = [encode_program(p) for p in (desc.prologue, desc.body, desc.epilogue)]
        rc, out, err = self.raw(
            flat, encode_maps(desc.inputs, len(desc.out_shape)), desc.out_shape, desc.K, progs, r0_init
        )
        assert rc == 0, err
        return out.view(np.float32).reshape(desc.out_shape)

    __call__ = run


def build_host(d: Path) -> HostInterpreter:
    """Compile the host build of the interpreter into folder `d` (skips the test without g++)."""
    if GXX is None:
        pytest.skip("g++ not installed")
    src, so = d / "rp_host.cpp", d / "librp_host.so"
    src.write_text(HOST_ENTRY)
    # RP_AS_DEVICE: the exact primitives take the device's integer spellings (repops_fp32.h), so
    # only the correctly rounded IEEE operations differ from the source nvcc compiles.
    cmd = [GXX, "-std=c++17", "-O2", "-ffp-contract=off", "-fno-fast-math", "-DRP_AS_DEVICE", "-Wall", "-Wextra",
           "-Werror", "-fPIC", "-shared", f"-I{REPO / 'kernels'}", str(src), "-o", str(so)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-4000:]
    return HostInterpreter(so)


class StandInExtension:
    """The binding's two entry points on the CPU: GEMM by the C++ CPU kernels' canonical chain,
    programs by the host build of the CUDA interpreter (same argument layout as the binding)."""

    def __init__(self, host: HostInterpreter) -> None:
        self.host = host
        self.calls = {"matmul3": 0, "run_program": 0, "r0_init": 0, "out": 0, "prepare_program": 0, "launch_program": 0}
        self._prepared: dict[int, tuple[Any, ...]] = {}
        # storage address of every tensor handed to a kernel (tests/repops/test_cuda_step.py checks that
        # the whole-step kernel only ever passes views of its device buffers)
        self.storages: set[int] = set()

    def _seen(self, *ts: torch.Tensor | None) -> None:
        self.storages.update(t.untyped_storage().data_ptr() for t in ts if t is not None)

    def matmul3(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        self.calls["matmul3"] += 1
        self._seen(a, b, out)
        c = cpu_ext.matmul(a, b)
        if out is None:
            return c
        # the binding's out= contract, then the result lands in the caller's tensor
        cuda_ext.check_out(out, torch.float32, c.numel(), (a, b))
        self.calls["out"] += 1
        out.copy_(c.reshape(out.shape))
        return out

    def run_program(
        self, inputs: list[torch.Tensor], maps: torch.Tensor, out_shape: list[int], K: int,
        pro: torch.Tensor, body: torch.Tensor, epi: torch.Tensor, r0_init: torch.Tensor | None, threads: int,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        self.calls["run_program"] += 1
        self.calls["r0_init"] += r0_init is not None
        self._seen(*inputs, r0_init, out)
        ins = [x.numpy() for x in inputs]
        r0 = None if r0_init is None else r0_init.numpy()
        rc, res, err = self.host.raw(ins, maps.numpy(), out_shape, K, [p.numpy() for p in (pro, body, epi)], r0)
        assert rc == 0, err
        if out is None:
            return torch.from_numpy(res.view(np.int32).copy())
        cuda_ext.check_out(out, torch.int32, res.size, (*inputs, *(() if r0_init is None else (r0_init,))))
        self.calls["out"] += 1
        out.copy_(torch.from_numpy(res.view(np.int32)))
        return out

    def prepare_program(
        self, inputs: list[torch.Tensor], maps: torch.Tensor, out_shape: list[int], K: int,
        pro: torch.Tensor, body: torch.Tensor, epi: torch.Tensor, r0_init: torch.Tensor | None, out: torch.Tensor,
    ) -> list[torch.Tensor]:  # fmt: skip
        """The binding's contract: every check now (the descriptor by a dry run of the decoder on
        the real buffers, out's placement), the buffers fixed; launch_program only runs."""
        self.calls["prepare_program"] += 1
        numel = int(np.prod(out_shape)) if out_shape else 1
        cuda_ext.check_out(out, torch.int32, numel, (*inputs, *(() if r0_init is None else (r0_init,))))
        progs = [p.numpy() for p in (pro, body, epi)]
        r0 = None if r0_init is None else r0_init.numpy()
        rc, _, err = self.host.raw([x.numpy() for x in inputs], maps.numpy(), out_shape, K, progs, r0)
        if rc != 0:
            raise ValueError(f"prepare_program refused the descriptor: {err}")
        key = len(self._prepared) + 1
        self._prepared[key] = (list(inputs), maps.numpy().copy(), list(out_shape), K, progs, r0_init, out)
        return [torch.tensor([key], dtype=torch.int64).view(torch.uint8), torch.zeros(16, dtype=torch.uint8)]

    def launch_program(self, launch: torch.Tensor, blob: torch.Tensor) -> None:
        self.calls["launch_program"] += 1
        inputs, maps, out_shape, K, progs, r0_init, out = self._prepared[int(launch.view(torch.int64)[0])]
        self._seen(*inputs, r0_init, out)
        r0 = None if r0_init is None else r0_init.numpy()
        rc, res, err = self.host.raw([x.numpy() for x in inputs], maps, out_shape, K, progs, r0)
        assert rc == 0, err
        out.copy_(torch.from_numpy(res.view(np.int32)))


class WindowedStandInExtension(StandInExtension):
    """The stand-in with the binding's windowed GEMM too (same arguments: each operand's bits and
    tables, then batch, M, N, K), run by the C++ CPU kernel of the same chain."""

    def windowed_matmul(self, *args: Any) -> torch.Tensor:
        self.calls["windowed_matmul"] = self.calls.get("windowed_matmul", 0) + 1
        *tables, batch, M, N, K = args
        assert len(tables) == 10 and all(isinstance(t, torch.Tensor) for i, t in enumerate(tables) if i % 5 != 4)
        ext = cpu_ext.extension(cpu_ext.best_isa())
        return ext.windowed_matmul(*tables, batch, M, N, K, 1, *cpu_ext.DEFAULT_TILE)
