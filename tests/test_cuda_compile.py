"""Compile checks of the RepOps CUDA GEMM (no GPU needed; skipped without nvcc).

Running it on a GPU and comparing bits with the CPU kernels is scripts/gpu_check.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CU = REPO / "kernels" / "repops_cuda.cu"
BINDING = REPO / "kernels" / "repops_cuda_binding.cpp"
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


@needs_nvcc
def test_cu_compiles_for_sm90_without_spills(tmp_path: Path) -> None:
    obj = tmp_path / "repops_cuda.o"
    r = nvcc(*SEMANTIC_FLAGS, "-O3", "-arch=sm_90", "-Xptxas", "-v", "-c", str(CU), "-o", str(obj))
    assert r.returncode == 0, r.stderr
    assert obj.stat().st_size > 0
    spills = re.findall(r"(\d+) bytes spill stores", r.stderr)
    assert spills and all(int(s) == 0 for s in spills), r.stderr


def arithmetic(ptx_text: str) -> set[str]:
    """The floating-point arithmetic instructions (opcode with modifiers) in a PTX listing."""
    return set(re.findall(r"\b((?:fma|mul|add|sub|mad|div)\.[a-z0-9.]*f32)\b", ptx_text))


@needs_nvcc
def test_ptx_has_only_rounded_mul_and_fma(ptx: str) -> None:
    ops = arithmetic(ptx)
    # The dot-product chain: one rounded multiply to open, single-rounding fma after; nothing
    # flushes subnormals (.ftz) and nothing is approximate.
    assert "mul.rn.f32" in ops and "fma.rn.f32" in ops, ops
    assert ops <= {"mul.rn.f32", "fma.rn.f32"}, ops
    assert ".ftz" not in ptx and ".approx" not in ptx


@needs_nvcc
def test_checker_would_catch_fast_math(tmp_path: Path) -> None:
    # The PTX check above is meaningful: fast-math builds of the same source are rejected by it.
    out = tmp_path / "fast.ptx"
    r = nvcc("--use_fast_math", "-O3", "-arch=sm_90", "-ptx", str(CU), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert ".ftz" in out.read_text()


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


def test_gpu_check_wrapper_shapes_on_cpu() -> None:
    """scripts/gpu_check.py's batching/transposing wrapper, driven by the CPU kernel's matmul3,
    reproduces cpu_kernels.matmul on every comparison case (the GPU run then differs only in
    the kernel itself)."""
    import importlib.util

    import numpy as np

    from verde_chain.repops import cpu_kernels

    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)

    class CpuAsGpu:
        def matmul3(self, a: object, b: object) -> object:
            return cpu_kernels.extension(cpu_kernels.best_isa()).matmul3(a, b, 2, 144, 256, 512)

    cases = [c for c in gpu_check.cases(quick=True) if c[0] != "1024"]
    assert len(cases) >= 10
    for name, a, b, ta, tb in cases:
        want = cpu_kernels.matmul(a, b, ta, tb).numpy().view(np.uint32)
        got = gpu_check.cuda_matmul(CpuAsGpu(), a, b, ta, tb).numpy().view(np.uint32)
        assert np.array_equal(want, got), name
