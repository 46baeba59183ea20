"""Compile checks of the RepOps CUDA kernels: the GEMM, the windowed GEMM of convolutions and the
program interpreter (no GPU needed; skipped without nvcc).

The PTX is read per kernel: the GEMM may contain only the rounded multiply and fma of its chain;
the interpreter only the six correctly rounded _rn operations its source spells out (plus the
exact binary64 product of LDEXP and its conversions), each exactly once per inlined copy of the
instruction switch, identical with --fmad=true (nothing contractible in the source), and nothing
anywhere flushes subnormals (.ftz) or approximates (.approx). The host build of the interpreter
and its bitwise checks are tests/repops/test_cuda_program.py; running on a GPU is scripts/gpu_check.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sysconfig
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from verde_chain.repops.isa import Op

REPO = Path(__file__).resolve().parents[2]
CU = REPO / "kernels" / "cuda" / "repops_cuda.cu"
BINDING = REPO / "kernels" / "cuda" / "repops_cuda_binding.cpp"
HEADER = REPO / "kernels" / "repops_program.cuh"
SEMANTIC_FLAGS = ["--fmad=false", "-ftz=false", "-prec-div=true", "-prec-sqrt=true"]

NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not installed")


def nvcc(*args: str) -> subprocess.CompletedProcess[str]:
    assert NVCC is not None
    return subprocess.run([NVCC, *args], capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def ptx(tmp_path_factory: pytest.TempPathFactory) -> str:
    if NVCC is None:
        pytest.skip("nvcc not installed")
    out = tmp_path_factory.mktemp("ptx") / "repops_cuda.ptx"
    r = nvcc(*SEMANTIC_FLAGS, "-O3", "-arch=sm_90", "-ptx", str(CU), "-o", str(out))
    assert r.returncode == 0, r.stderr
    return out.read_text()


def entries(ptx_text: str) -> dict[str, str]:
    """PTX text of each kernel entry, keyed by the kernel's source name (gemm, program)."""
    parts = re.split(r"^(?:\.visible )?\.entry ", ptx_text, flags=re.MULTILINE)[1:]
    out = {}
    for part in parts:
        m = re.search(r"repops_([a-z0-9]+)_kernel", part.split("(", 1)[0])
        assert m is not None, part[:200]
        out[m.group(1)] = part
    return out


@needs_nvcc
def test_cu_compiles_for_sm90_without_spills(tmp_path: Path) -> None:
    obj = tmp_path / "repops_cuda.o"
    r = nvcc(*SEMANTIC_FLAGS, "-O3", "-arch=sm_90", "-Xptxas", "-v", "-c", str(CU), "-o", str(obj))
    assert r.returncode == 0, r.stderr
    assert obj.stat().st_size > 0
    # The GEMM keeps its 8 x 8 accumulators in registers; the interpreter's register file is
    # indexed by the program, so it lives in local memory by design (not checked).
    info = r.stderr.split("Compiling entry function")
    gemm = [chunk for chunk in info if "repops_gemm_kernel" in chunk.split("\n", 1)[0]]
    assert len(gemm) == 1, r.stderr
    spills = re.findall(r"(\d+) bytes spill stores", gemm[0])
    assert spills and all(int(s) == 0 for s in spills), r.stderr
    assert any("repops_program_kernel" in chunk.split("\n", 1)[0] for chunk in info), r.stderr
    wgemm = [chunk for chunk in info if "repops_wgemm_kernel" in chunk.split("\n", 1)[0]]
    assert len(wgemm) == 1 and re.findall(r"(\d+) bytes spill stores", wgemm[0]) == ["0"], r.stderr


def arithmetic(ptx_text: str) -> set[str]:
    """The floating-point arithmetic instructions (opcode with modifiers) in a PTX listing."""
    return set(re.findall(r"\b((?:fma|mul|add|sub|mad|div)\.[a-z0-9.]*f32)\b", ptx_text))


@needs_nvcc
@pytest.mark.parametrize("kernel", ["gemm", "wgemm"])
def test_ptx_has_only_rounded_mul_and_fma(ptx: str, kernel: str) -> None:
    """The GEMM and the windowed GEMM of convolutions (its operands staged through their
    windows: integer address arithmetic only)."""
    ops = arithmetic(entries(ptx)[kernel])
    # The dot-product chain: one rounded multiply to open, single-rounding fma after; nothing
    # flushes subnormals (.ftz) and nothing is approximate.
    assert "mul.rn.f32" in ops and "fma.rn.f32" in ops, ops
    assert ops <= {"mul.rn.f32", "fma.rn.f32"}, ops
    assert ".ftz" not in ptx and ".approx" not in ptx


FLOAT_OPS = (
    r"\b((?:fma|mul|add|sub|mad|div|sqrt|rcp|rsqrt|ex2|lg2|sin|cos|tanh|cvt)\.[a-z0-9.]*f(?:32|64)(?:\.f(?:32|64))?)\b"
)
PROGRAM_OPS = {"add.rn.f32", "sub.rn.f32", "mul.rn.f32", "div.rn.f32", "fma.rn.f32", "sqrt.rn.f32"}
# LDEXP: binary32 -> binary64 (exact), one binary64 multiply by 2^e (exact), one rounding back.
PROGRAM_LDEXP_OPS = {"cvt.f64.f32", "mul.rn.f64", "cvt.rn.f32.f64"}


def float_ops(ptx_text: str) -> list[str]:
    return re.findall(FLOAT_OPS, ptx_text)


@needs_nvcc
def test_program_kernel_ptx_has_only_the_intrinsics_it_asks_for(ptx: str) -> None:
    prog = entries(ptx)["program"]
    ops = float_ops(prog)
    assert set(ops) == PROGRAM_OPS | PROGRAM_LDEXP_OPS, sorted(set(ops))
    # One of each per inlined copy of the instruction switch: no fma (or anything else) beyond
    # the one __fmaf_rn the source writes.
    counts = {op: ops.count(op) for op in PROGRAM_OPS | PROGRAM_LDEXP_OPS}
    assert len(set(counts.values())) == 1, counts
    assert ".ftz" not in prog and ".approx" not in prog and "mad." not in prog


@needs_nvcc
def test_program_kernel_has_nothing_contractible(ptx: str, tmp_path: Path) -> None:
    """Built with --fmad=true the interpreter's floating-point instructions are the same: every
    rounding is an explicit _rn intrinsic, so the flag cannot change a bit."""
    out = tmp_path / "fmad.ptx"
    flags = ["--fmad=true", "-ftz=false", "-prec-div=true", "-prec-sqrt=true"]
    r = nvcc(*flags, "-O3", "-arch=sm_90", "-ptx", str(CU), "-o", str(out))
    assert r.returncode == 0, r.stderr
    fmad = entries(out.read_text())["program"]
    assert sorted(float_ops(fmad)) == sorted(float_ops(entries(ptx)["program"]))


@needs_nvcc
def test_header_compiles_for_other_architectures(tmp_path: Path) -> None:
    """The interpreter header is plain CUDA C++ (no sm_90 feature): sm_80 builds too."""
    r = nvcc(*SEMANTIC_FLAGS, "-O3", "-arch=sm_80", "-c", str(CU), "-o", str(tmp_path / "sm80.o"))
    assert r.returncode == 0, r.stderr


def test_header_is_plain_cpp_for_the_host(tmp_path: Path) -> None:
    """g++ compiles repops_program.cuh without CUDA, warning-free (tests/repops/test_cuda_program.py
    runs that build)."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not installed")
    src = tmp_path / "h.cpp"
    src.write_text('#include "repops_program.cuh"\nint main() { return (int)rp_getexp(0x3F800000u); }\n')
    cmd = [
        gxx,
        "-std=c++17",
        "-O2",
        "-ffp-contract=off",
        "-Wall",
        "-Wextra",
        "-Werror",
        f"-I{HEADER.parent}",
        str(src),
        "-o",
        str(tmp_path / "h"),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    assert subprocess.run([str(tmp_path / "h")], check=False).returncode == 0  # GETEXP(1.0) = +0.0


@needs_nvcc
def test_checker_would_catch_fast_math(tmp_path: Path) -> None:
    # The PTX check above is meaningful: fast-math builds of the same source are rejected by it.
    out = tmp_path / "fast.ptx"
    r = nvcc("--use_fast_math", "-O3", "-arch=sm_90", "-ptx", str(CU), "-o", str(out))
    assert r.returncode == 0, r.stderr
    fast = out.read_text()
    assert ".ftz" in fast
    assert ".ftz" in entries(fast)["program"]  # the interpreter's check would fail too


def test_binding_parses_against_torch_headers(tmp_path: Path) -> None:
    """Syntax check of the torch binding with the host compiler (the CPU torch wheel ships the
    c10/cuda headers but not one generated config header, which a stub stands in for)."""
    from torch.utils import cpp_extension

    gxx = shutil.which("g++")
    cuda_inc = Path("/usr/local/cuda/include")
    torch_inc = [Path(p) for p in cpp_extension.include_paths()]
    if (
        gxx is None
        or not cuda_inc.exists()
        or not any((p / "c10" / "cuda" / "CUDAStream.h").exists() for p in torch_inc)
    ):
        pytest.skip("needs g++, CUDA headers and torch's c10/cuda headers")
    stub = tmp_path / "stub" / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")
    incs = [*torch_inc, Path(sysconfig.get_paths()["include"]), cuda_inc, REPO / "kernels", tmp_path / "stub"]
    cmd = [
        gxx,
        "-std=c++20",
        "-fsyntax-only",
        "-w",
        "-DTORCH_EXTENSION_NAME=verde_repops_cuda_check",
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        *[f"-I{p}" for p in incs],
        str(BINDING),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-4000:]


def test_gpu_check_wrapper_shapes_on_cpu(script: Callable[[str], ModuleType]) -> None:
    """scripts/gpu_check.py's batching/transposing wrapper, driven by the CPU kernel's matmul3,
    reproduces the CPU extension's matmul on every comparison case (the GPU run then differs only in
    the kernel itself)."""
    import numpy as np

    from verde_chain.repops.backends.cpu import extension as cpu_ext

    gpu_check = script("gpu_check")

    class CpuAsGpu:
        def matmul3(self, a: object, b: object) -> object:
            return cpu_ext.extension(cpu_ext.best_isa()).matmul3(a, b, 2, 144, 256, 512)

    cases = [c for c in gpu_check.cases(quick=True) if c[0] != "1024"]
    assert len(cases) >= 10
    for name, a, b, ta, tb in cases:
        want = cpu_ext.matmul(a, b, ta, tb).numpy().view(np.uint32)
        got = gpu_check.cuda_matmul(CpuAsGpu(), a, b, ta, tb).numpy().view(np.uint32)
        assert np.array_equal(want, got), name


@needs_nvcc
def test_ctypes_fallback_library_refuses_bad_descriptors_on_the_host() -> None:
    """The nvcc-built fallback library (backends/cuda/extension.py CtypesCuda) loads without a GPU, and its
    launcher decodes and checks a descriptor on the host before touching the device: a bad one
    is refused with the reason (-1), a good one gets as far as the CUDA runtime (error > 0
    here, where there is no device)."""
    import ctypes

    import numpy as np
    import torch

    from verde_chain.repops.backends.cuda.extension import CtypesCuda

    lib = CtypesCuda(arch="90").lib
    assert lib.repops_cuda_program_scratch_bytes(2, 3) == 2 * 88 + 3 * 16 + 16
    x = np.zeros(4, np.uint32)
    ptrs = (ctypes.c_void_p * 1)(x.ctypes.data)
    shape = (ctypes.c_int64 * 1)(4)
    load = np.array([[int(Op.LOAD), 0, 0, 0, 0]], np.int64)  # LOAD r0 <- input 0
    err = ctypes.create_string_buffer(256)

    def launch(maps: np.ndarray) -> int:
        rc = lib.repops_cuda_run_program(
            ptrs, 1, maps.ctypes.data, shape, 1, 1, load.ctypes.data, 1, None, 0, None, 0,
            None, None, None, 1 << 20, None, err, len(err),
        )  # fmt: skip
        return int(rc)

    assert launch(np.array([[1, 0, 2, 0, 4]], np.int64)) == -1  # offset 2: addresses 2..5 of 4
    assert b"LOAD addresses leave" in err.value
    if not torch.cuda.is_available():
        assert launch(np.array([[1, 0, 0, 0, 4]], np.int64)) > 0  # valid: fails only at the runtime


@needs_nvcc
def test_ctypes_fallback_prepare_checks_once_on_the_host() -> None:
    """The whole-step kernel's entry points in the fallback library: prepare decodes and checks
    on the host exactly as run_program (a bad descriptor refused with the reason, nothing
    written to the launch parameters), a good one gets as far as staging on the device."""
    import ctypes

    import numpy as np
    import torch

    from verde_chain.repops.backends.cuda.extension import CtypesCuda

    lib = CtypesCuda(arch="90").lib
    assert lib.repops_cuda_launch_bytes() == 120 + 16  # RpProgram (120 bytes) + r0_init, out
    x = np.zeros(4, np.uint32)
    ptrs = (ctypes.c_void_p * 1)(x.ctypes.data)
    shape = (ctypes.c_int64 * 1)(4)
    load = np.array([[int(Op.LOAD), 0, 0, 0, 0]], np.int64)  # LOAD r0 <- input 0
    err = ctypes.create_string_buffer(256)
    launch = np.full(lib.repops_cuda_launch_bytes(), 0xAB, np.uint8)

    def prepare(maps: np.ndarray, blob_bytes: int = 1 << 20) -> int:
        rc = lib.repops_cuda_prepare_program(
            ptrs, 1, maps.ctypes.data, shape, 1, 1, load.ctypes.data, 1, None, 0, None, 0,
            None, None, launch.ctypes.data, None, blob_bytes, None, err, len(err),
        )  # fmt: skip
        return int(rc)

    assert prepare(np.array([[1, 0, 2, 0, 4]], np.int64)) == -1  # offset 2: addresses 2..5 of 4
    assert b"LOAD addresses leave" in err.value and (launch == 0xAB).all()
    assert prepare(np.array([[1, 0, 0, 0, 4]], np.int64), blob_bytes=8) == -1
    assert b"scratch buffer too small" in err.value
    if not torch.cuda.is_available():
        assert prepare(np.array([[1, 0, 0, 0, 4]], np.int64)) > 0  # valid: fails only at the runtime
