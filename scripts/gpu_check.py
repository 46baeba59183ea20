"""One-shot GPU check of the RepOps CUDA GEMM: build, bitwise comparison with the CPU kernels,
and a benchmark against cuBLAS FP32. Prints ONE JSON summary line (and writes it to --out).

Usage (on a machine with a CUDA-enabled torch and nvcc):
    python scripts/gpu_check.py [--out summary.json] [--sizes 1024 4096] [--quick]

Steps, each timed and recorded (a failing step is reported, later steps still run if they can):
  1. JIT-build kernels/repops_cuda.cu + kernels/repops_cuda_binding.cpp with
     torch.utils.cpp_extension.load (--fmad=false -ftz=false -prec-div=true -prec-sqrt=true,
     no fast math; arch = the device's compute capability), cached under build/native/. If
     that fails (say nvcc's CUDA major version differs from torch's), the .cu alone is built
     with nvcc as a shared library and called through ctypes ("build_mode" in the summary).
  2. Run GEMMs on random, edge-value (±0, subnormal, ±inf, NaN, max finite, cancellation),
     transposed, batched and broadcast inputs; compare the bits with
     verde_chain.repops.cpu_kernels.matmul (the CPU kernels, themselves tested against the spec).
  3. Benchmark square GEMMs vs torch.matmul (cuBLAS, TF32 disabled) with CUDA events.
Exit status 0 iff every comparison is bit-identical.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np
import torch

from verde_chain.repops.edges import edge_floats

CUDA_FLAGS = ["-O3", "--fmad=false", "-ftz=false", "-prec-div=true", "-prec-sqrt=true"]
EDGE = edge_floats()  # the project's one list of binary32 edge values


def build_extension() -> Any:
    from torch.utils import cpp_extension

    major, minor = torch.cuda.get_device_capability()
    # Compile for exactly this device (sm_90 on H100/H200).
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    sources = [REPO / "kernels" / "repops_cuda_binding.cpp", REPO / "kernels" / "repops_cuda.cu"]
    key = hashlib.sha256(
        b"".join(p.read_bytes() for p in [*sources, REPO / "kernels" / "repops_cuda.h"])
        + " ".join([*CUDA_FLAGS, torch.__version__, f"{major}.{minor}"]).encode()
    ).hexdigest()[:12]
    name = f"verde_repops_cuda_{key}"
    build_dir = REPO / "build" / "native" / name
    build_dir.mkdir(parents=True, exist_ok=True)
    return cpp_extension.load(
        name=name,
        sources=[str(s) for s in sources],
        extra_cflags=["-O3"],
        extra_cuda_cflags=CUDA_FLAGS,
        extra_include_paths=[str(REPO / "kernels")],
        build_directory=str(build_dir),
        verbose=False,
    )


class CtypesGemm:
    """Fallback when cpp_extension cannot build (e.g. nvcc and torch.version.cuda differ in major
    version): the .cu alone, compiled by nvcc into a shared library and called through ctypes on
    torch's device pointers (legacy default stream, synchronised by the caller)."""

    def __init__(self) -> None:
        nvcc = shutil.which("nvcc") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
        major, minor = torch.cuda.get_device_capability()
        cu = REPO / "kernels" / "repops_cuda.cu"
        flags = [*CUDA_FLAGS, f"-arch=sm_{major}{minor}", "-Xcompiler", "-fPIC", "-shared"]
        key = hashlib.sha256(
            cu.read_bytes() + (REPO / "kernels" / "repops_cuda.h").read_bytes() + " ".join(flags).encode()
        )
        out_dir = REPO / "build" / "native" / f"repops_cuda_ctypes_{key.hexdigest()[:12]}"
        out_dir.mkdir(parents=True, exist_ok=True)
        so = out_dir / "librepops_cuda.so"
        if not so.exists():
            cmd = [nvcc, *flags, "-I", str(REPO / "kernels"), str(cu), "-o", str(so)]
            r = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if r.returncode != 0:
                raise RuntimeError(f"nvcc failed: {r.stderr[-2000:]}")
        self.lib = ctypes.CDLL(str(so))
        i64 = ctypes.c_int64
        p = ctypes.c_void_p
        self.lib.repops_cuda_gemm.argtypes = [p, i64, i64, i64, p, i64, i64, i64, p, i64, i64, i64, i64, p]
        self.lib.repops_cuda_gemm.restype = ctypes.c_int

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


def cuda_matmul(
    ext: Any, a: torch.Tensor, b: torch.Tensor, trans_a: bool = False, trans_b: bool = False
) -> torch.Tensor:
    a2 = a.transpose(-1, -2) if trans_a else a
    b2 = b.transpose(-1, -2) if trans_b else b
    m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    batch = torch.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    a3 = a2.expand(*batch, m, k).reshape(-1, m, k)
    b3 = b2.expand(*batch, k, n).reshape(-1, k, n)
    return ext.matmul3(a3, b3).reshape(*batch, m, n)


def edge(shape: tuple[int, ...], seed: int, frac: float) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    mask = rng.random(shape) < frac
    x[mask] = rng.choice(EDGE, size=int(mask.sum()))
    return torch.from_numpy(x)


def subnormal(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    mant = rng.integers(-(2**23) + 1, 2**23, size=shape).astype(np.float64)
    return torch.from_numpy((mant * 2.0**-149 * 2.0 ** rng.integers(0, 4, size=shape)).astype(np.float32))


def cases(quick: bool) -> list[tuple[str, torch.Tensor, torch.Tensor, bool, bool]]:
    g = torch.Generator().manual_seed(0)
    out = [
        ("1x1x1", torch.randn(1, 1, generator=g), torch.randn(1, 1, generator=g), False, False),
        ("7x13x5", torch.randn(7, 13, generator=g), torch.randn(13, 5, generator=g), False, False),
        ("129x257x65", torch.randn(129, 257, generator=g), torch.randn(257, 65, generator=g), False, False),
        ("trans_a", torch.randn(70, 130, generator=g), torch.randn(70, 33, generator=g), True, False),
        ("trans_b", torch.randn(130, 70, generator=g), torch.randn(33, 70, generator=g), False, True),
        ("trans_ab", torch.randn(70, 130, generator=g), torch.randn(33, 70, generator=g), True, True),
        ("batched", torch.randn(4, 65, 33, generator=g), torch.randn(4, 33, 70, generator=g), False, False),
        ("broadcast", torch.randn(3, 1, 20, 40, generator=g), torch.randn(5, 40, 17, generator=g), False, False),
        ("edge", edge((140, 300), 1, 0.3), edge((300, 150), 2, 0.3), False, False),
        ("edge_dense", edge((64, 40), 3, 0.8), edge((40, 64), 4, 0.8), False, False),
        ("subnormal", subnormal((130, 100), 5), torch.empty(100, 140).uniform_(-2, 2, generator=g), False, False),
        (
            "cancel",
            torch.ones(8, 64),
            torch.tensor([3.0, -3.0]).repeat(32).reshape(64, 1).expand(64, 9).contiguous(),
            False,
            False,
        ),
        ("1024", torch.randn(1024, 1024, generator=g), torch.randn(1024, 1024, generator=g), False, False),
    ]
    if not quick:
        out.append(
            ("777x2049x1000", torch.randn(777, 2049, generator=g), torch.randn(2049, 1000, generator=g), False, False)
        )
    return out


def compare(ext: Any, quick: bool) -> list[dict[str, Any]]:
    from verde_chain.repops import cpu_kernels

    rows = []
    threads = max(1, len(os.sched_getaffinity(0)))
    for name, a, b, ta, tb in cases(quick):
        row: dict[str, Any] = {"case": name, "shape_a": list(a.shape), "shape_b": list(b.shape), "trans": [ta, tb]}
        try:
            want = cpu_kernels.matmul(a, b, ta, tb, threads=threads).numpy().view(np.uint32)
            got = cuda_matmul(ext, a.cuda(), b.cuda(), ta, tb).cpu().numpy().view(np.uint32)
            diff = np.flatnonzero(want.reshape(-1) != got.reshape(-1))
            row["mismatches"] = int(diff.size)
            row["elements"] = int(want.size)
            if diff.size:
                i = int(diff[0])
                row["first_mismatch"] = {
                    "index": i,
                    "cpu": f"0x{int(want.reshape(-1)[i]):08x}",
                    "gpu": f"0x{int(got.reshape(-1)[i]):08x}",
                }
        except Exception as exc:  # noqa: BLE001 - one failing case must not hide the others
            row["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    return rows


def bench(ext: Any, sizes: list[int]) -> list[dict[str, Any]]:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    rows = []
    for n in sizes:
        a = torch.randn(n, n, device="cuda")
        b = torch.randn(n, n, device="cuda")
        iters = 20 if n <= 2048 else 5

        def timed(fn: Any, iters: int = iters) -> float:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / iters

        t_cublas = timed(lambda a=a, b=b: torch.matmul(a, b))
        t_repops = timed(lambda a=a, b=b: ext.matmul3(a[None], b[None]))
        flops = 2.0 * n**3
        rows.append(
            {
                "n": n,
                "cublas_ms": round(t_cublas, 3),
                "repops_ms": round(t_repops, 3),
                "cublas_tflops": round(flops / t_cublas / 1e9, 2),
                "repops_tflops": round(flops / t_repops / 1e9, 2),
                "ratio": round(t_repops / t_cublas, 3),
            }
        )
    return rows


def _timed_step(summary: dict[str, Any], name: str, fn: Callable[[], Any]) -> None:
    """summary[name] = fn(), its seconds in summary[name + "_s"]; a failure goes to the errors."""
    t0 = time.perf_counter()
    try:
        summary[name] = fn()
    except Exception:  # noqa: BLE001 - the summary reports every failure
        summary["errors"].append(f"{name}: " + traceback.format_exc()[-3000:])
    summary[f"{name}_s"] = round(time.perf_counter() - t0, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None, help="also write the JSON summary here")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--quick", action="store_true", help="skip the largest comparison case")
    args = ap.parse_args()

    summary: dict[str, Any] = {"ok": False, "errors": []}
    if not torch.cuda.is_available():
        summary["errors"].append(f"torch {torch.__version__} has no CUDA device")
    else:
        summary["device"] = torch.cuda.get_device_name()
        summary["capability"] = list(torch.cuda.get_device_capability())
        summary["torch"] = torch.__version__
        ext: Any = None
        t0 = time.perf_counter()
        try:
            ext = build_extension()
            summary["build_mode"] = "cpp_extension"
        except Exception:  # noqa: BLE001 - the summary reports every failure
            summary["build_warning"] = "cpp_extension: " + traceback.format_exc()[-3000:]
            try:
                ext = CtypesGemm()
                summary["build_mode"] = "nvcc+ctypes"
            except Exception:  # noqa: BLE001
                summary["errors"].append("build: " + traceback.format_exc()[-3000:])
        summary["build_s"] = round(time.perf_counter() - t0, 1)
        if ext is not None:
            _timed_step(summary, "compare", lambda: compare(ext, args.quick))
            _timed_step(summary, "bench", lambda: bench(ext, args.sizes))
        rows = summary.get("compare", [])
        summary["ok"] = bool(rows) and all(r.get("mismatches") == 0 for r in rows) and not summary["errors"]
    line = json.dumps(summary)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
