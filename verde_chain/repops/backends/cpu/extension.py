"""The C++ CPU extension: building it per ISA, and Python entry points to its kernels (GEMM,
reductions, elementwise ops, the interpreter) with the canonical orders.

The sources are ``kernels/cpu/*.cpp`` (with ``kernels/repops_fp32.h``, the one definition of
every instruction, and ``kernels/generated/repops_isa.h``); they are compiled into three torch
extensions (``torch.utils.cpp_extension.load``, cached under ``build/native/`` by the bytes of
every source and header)::

    scalar   -O3 -ffp-contract=off -fno-fast-math -DREPOPS_ISA=0          any CPU
    avx2     ... -DREPOPS_ISA=1 -mavx2 -mfma                               x86-64 with AVX2+FMA
    avx512   ... -DREPOPS_ISA=2 -mavx512f -mavx2 -mfma                     x86-64 with AVX-512F

plus ``-Werror=switch`` (an opcode without a case in the interpreter fails the build) and hidden
visibility (the three extensions live in one process). All three give the same bits as the spec
(the operator library, ``verde_chain/repops/library/``):

* matmul: ``acc = a[0]*b[0]`` then ``acc = fma(a[k], b[k], acc)`` for k ascending;
* reduce_sum / reduce_mean / reduce_max / reduce_min: ``acc = x[0]`` then one op per k,
  k ascending in row-major order over the reduced axes; mean = sum / fl32(K);
* binary: IEEE add/sub/mul/div and spec max/min, numpy broadcasting;
* run_program: a generic interpreter of ANY KernelDesc program (every opcode, the spec's
  prologue / body / epilogue order), vectorised over blocks of output elements;
* NaN results are the canonical 0x7FC00000; subnormals are kept (FTZ/DAZ cleared per thread).

``backends/cpu/backend.py`` turns these into a RepOps backend (desc -> result).

``isa=None`` picks the widest variant the CPU supports; ``threads=None`` uses
``torch.get_num_threads()`` (all cores unless the program set it). Neither changes any bit of
the result; tests check that. The kernels run on ``threads`` OS threads: the caller and the
extension's own persistent worker pool (``kernels/cpu/pool.h``), which starts workers on first
need and keeps them; only output blocks are distributed, never the k range of one output
element. Small calls stay on fewer threads (each thread must get a few microseconds of work).
:func:`probe_reset` / :func:`probe_threads` tell which OS threads ran kernel work.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import numpy as np
import torch

from verde_chain.errors import RepOpsError
from verde_chain.repops.backends.build_lock import exclusive_build
from verde_chain.repops.backends.cpu.codes import BinOp, ReduceOp
from verde_chain.repops.backends.native import writable

REPO_ROOT = Path(__file__).resolve().parents[4]
KERNELS = REPO_ROOT / "kernels"
# Translation units of the extension (one module), and every header they include: the build
# cache key covers all of them.
SOURCES = tuple(KERNELS / "cpu" / f for f in ("bindings.cpp", "pool.cpp", "gemm.cpp", "conv.cpp", "reduce.cpp",
                                              "binary.cpp", "interpreter.cpp", "step_plan.cpp",
                                              "window_plan.cpp", "norm.cpp"))  # fmt: skip
HEADERS = (*sorted((KERNELS / "cpu").glob("*.h")), KERNELS / "repops_fp32.h", KERNELS / "generated" / "repops_isa.h")
BUILD_ROOT = REPO_ROOT / "build" / "native"

ISAS = ("scalar", "avx2", "avx512")
_COMMON_FLAGS = ("-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-unsafe-math-optimizations")
# The extension only: C++20 (the thread pool sleeps in std::atomic::wait; torch 2.11's
# cpp_extension passes -std=c++17, 2.13's -std=c++20, and ours comes after it, so it wins); a missing
# switch case is an error; symbols stay inside each ISA's module.
_EXTENSION_FLAGS = ("-std=c++20", "-Werror=switch", "-fvisibility=hidden", "-fvisibility-inlines-hidden")
_ISA_FLAGS: dict[str, tuple[str, ...]] = {
    "scalar": ("-DREPOPS_ISA=0",),
    "avx2": ("-DREPOPS_ISA=1", "-mavx2", "-mfma"),
    "avx512": ("-DREPOPS_ISA=2", "-mavx512f", "-mavx2", "-mfma"),
}
# CPU flags (as /proc/cpuinfo spells them) each variant needs.
_ISA_CPU_FLAGS: dict[str, frozenset[str]] = {
    "scalar": frozenset(),
    "avx2": frozenset({"avx2", "fma"}),
    "avx512": frozenset({"avx512f", "avx2", "fma"}),
}

# Default blocking (mc rows x kc depth x nc cols); see kernels/cpu/gemm.cpp. Rounded up to
# whole micro-tiles in C++. Any value gives the same bits.
DEFAULT_TILE = (144, 256, 512)


class KernelBuildError(RepOpsError):
    """A RepOps C++ extension failed to compile or load."""


# --------------------------------------------------------------------------------------------
# Build and ISA selection
# --------------------------------------------------------------------------------------------


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    # Not Linux: fall back to torch's own dispatch level.
    cap = torch.backends.cpu.get_cpu_capability()
    if cap.startswith("AVX512"):
        return _ISA_CPU_FLAGS["avx512"]
    if cap.startswith("AVX2"):
        return _ISA_CPU_FLAGS["avx2"]
    return frozenset()


def cpu_supports(isa: str) -> bool:
    if isa not in ISAS:
        raise RepOpsError(f"unknown ISA {isa!r}; known: {ISAS}")
    return _ISA_CPU_FLAGS[isa] <= _cpu_flags()


def available_isas() -> tuple[str, ...]:
    """Variants this CPU can run, narrowest first (overridable with VERDE_REPOPS_ISAS=a,b)."""
    return _available_isas(os.environ.get("VERDE_REPOPS_ISAS"))


@functools.cache
def _available_isas(forced: str | None) -> tuple[str, ...]:
    # Cached per value of the variable: every kernel call without an ISA asks (best_isa).
    names = tuple(forced.split(",")) if forced else ISAS
    return tuple(i for i in names if cpu_supports(i))


def best_isa() -> str:
    return available_isas()[-1]


def build_flags(isa: str) -> list[str]:
    """Compiler flags of every RepOps C/C++ build for ``isa`` (the extension and compiled maps)."""
    return [*_COMMON_FLAGS, *_ISA_FLAGS[isa]]


def extension_flags(isa: str) -> list[str]:
    """Compiler flags of the extension's build for ``isa`` (after cpp_extension's own)."""
    return [*build_flags(isa), *_EXTENSION_FLAGS]


def source_key(paths: Sequence[Path], flags: Sequence[str]) -> str:
    """A build's cache key: the bytes of every source and header it includes, and its flags."""
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    h.update(" ".join(flags).encode())
    return h.hexdigest()[:12]


def build_dir(isa: str) -> Path:
    """Where one variant is built: its name carries the hash of its sources, flags and torch."""
    flags = extension_flags(isa)
    return BUILD_ROOT / f"verde_repops_cpu_{isa}_{source_key([*SOURCES, *HEADERS], [*flags, torch.__version__])}"


@functools.cache
def extension(isa: str) -> ModuleType:
    """Compile (first use; cached on disk by source hash) and import one variant."""
    if not cpu_supports(isa):
        raise RepOpsError(f"this CPU cannot run the {isa} kernels")
    from torch.utils import cpp_extension

    flags = extension_flags(isa)
    where = build_dir(isa)
    try:
        with exclusive_build(where):
            return cpp_extension.load(
                name=where.name,
                sources=[str(p) for p in SOURCES],
                extra_cflags=flags,
                build_directory=str(where),
                verbose=False,
            )
    except Exception as exc:  # compiler errors arrive as RuntimeError/subprocess errors
        raise KernelBuildError(f"building the {isa} RepOps kernels failed: {exc}") from exc


def _ext(isa: str | None) -> ModuleType:
    return extension(best_isa() if isa is None else isa)


Code = TypeVar("Code", ReduceOp, BinOp)


def _code(codes: type[Code], name: str, what: str) -> Code:
    """The code a user-facing (lower-case) name denotes; a one-line error naming the others."""
    member = codes.__members__.get(name.upper()) if name == name.lower() else None
    if member is None:
        raise RepOpsError(f"{what}: unknown op {name!r}; supported: {sorted(k.lower() for k in codes.__members__)}")
    return member


def _threads(threads: int | None) -> int:
    t = torch.get_num_threads() if threads is None else int(threads)
    if t < 1:
        raise RepOpsError(f"threads must be >= 1, got {t}")
    return t


def _f32(x: Any, what: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x)
        if x.dtype == torch.float64 and x.dim() == 0:  # a Python float literal
            x = x.to(torch.float32)
    if x.dtype != torch.float32:
        raise RepOpsError(f"{what}: RepOps CPU kernels take float32, got {x.dtype}")
    if x.device.type != "cpu":
        raise RepOpsError(f"{what}: expected a CPU tensor, got {x.device}")
    return x.detach()


# --------------------------------------------------------------------------------------------
# MatMul / Gemm
# --------------------------------------------------------------------------------------------


def _tile(tile: Sequence[int] | None) -> tuple[int, int, int]:
    mc, kc, nc = DEFAULT_TILE if tile is None else (int(v) for v in tile)
    if min(mc, kc, nc) < 1:
        raise RepOpsError(f"tile sizes must be positive, got {(mc, kc, nc)}")
    return mc, kc, nc


def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    trans_a: bool = False,
    trans_b: bool = False,
    isa: str | None = None,
    threads: int | None = None,
    tile: Sequence[int] | None = None,
) -> torch.Tensor:
    """numpy-style (batched, broadcast, 1-D aware) ``op(a) @ op(b)`` with the fixed fma chain.

    ``trans_a``/``trans_b`` transpose the last two axes (free: only strides change).
    ``tile = (mc, kc, nc)`` overrides the cache blocking (used by tests; bits never change).
    """
    a, b = _f32(a, "matmul a"), _f32(b, "matmul b")
    if a.dim() == 0 or b.dim() == 0:
        raise RepOpsError("matmul: scalars are not supported (rank >= 1 needed)")
    a_vec, b_vec = a.dim() == 1, b.dim() == 1
    # As spec.matmul: a vector becomes a (1, K) row / (K, 1) column first, then the transpose
    # flags apply, and the unit dims are dropped from the result.
    a2 = a.unsqueeze(0) if a_vec else a
    b2 = b.unsqueeze(-1) if b_vec else b
    if trans_a:
        a2 = a2.transpose(-1, -2)
    if trans_b:
        b2 = b2.transpose(-1, -2)
    m, k = a2.shape[-2], a2.shape[-1]
    kb, n = b2.shape[-2], b2.shape[-1]
    if k != kb:
        raise RepOpsError(f"matmul: inner dims differ ({tuple(a.shape)} x {tuple(b.shape)}, trans {trans_a}/{trans_b})")
    if k == 0:
        raise RepOpsError("matmul: K = 0 is not defined by the spec (K >= 1)")
    batch = a2.shape[:-2]
    if b2.shape[:-2] != batch:
        try:
            batch = torch.broadcast_shapes(batch, b2.shape[:-2])
        except RuntimeError as exc:
            raise RepOpsError(f"matmul: batch dims do not broadcast: {exc}") from exc
    # Broadcast batches keep stride 0 where reshape can view them; otherwise reshape copies,
    # which changes no value. Equal batch dims skip torch.broadcast_shapes, two matrices (the
    # usual case) expand and reshape as well, and the kernel is called straight (a and b
    # passed _f32 above): a 1x1 call took 28 us, now 11 (torch.matmul: 1.7), where a 256^2
    # GEMM at 2 threads takes ~140.
    ext, t, (mc, kc, nc) = _ext(isa), _threads(threads), _tile(tile)
    if not batch:
        c = ext.matmul3(a2.unsqueeze(0), b2.unsqueeze(0), t, mc, kc, nc)[0]
    else:
        a3 = a2.expand(*batch, m, k).reshape(-1, m, k)
        b3 = b2.expand(*batch, k, n).reshape(-1, k, n)
        c = ext.matmul3(a3, b3, t, mc, kc, nc).reshape(*batch, m, n)
    if a_vec:
        c = c.squeeze(-2)
    if b_vec:
        c = c.squeeze(-1)
    return c


def matmul3(
    a3: torch.Tensor,
    b3: torch.Tensor,
    isa: str | None = None,
    threads: int | None = None,
    tile: Sequence[int] | None = None,
) -> torch.Tensor:
    """(batch, M, K) @ (batch, K, N) views with any strides (0 for broadcast) -> contiguous
    (batch, M, N); the fixed fma chain. The backend's entry point; :func:`matmul` wraps it."""
    mc, kc, nc = _tile(tile)
    return _ext(isa).matmul3(_f32(a3, "matmul a"), _f32(b3, "matmul b"), _threads(threads), mc, kc, nc)


def windowed_matmul(
    a: Any, a_bits: Any, b: Any, b_bits: Any, nb: int, M: int, N: int, isa: str | None = None,
    threads: int | None = None, tile: Sequence[int] | None = None, split: Sequence[int] | None = None,
) -> torch.Tensor:
    """C (nb, M, N) of two ``repops.windowed.Operand``s over their raw input bits (uint32 arrays):
    the fixed fma chain per element, panels packed straight through the windows; in the layout
    of ``split`` = (n_inner, batch stride, outer stride) if given (``windowed.column_split``)."""
    mc, kc, nc = _tile(tile)
    K = int(a.ks.shape[0])
    return _ext(isa).windowed_matmul(*_operand_args(a, a_bits), *_operand_args(b, b_bits), nb, M, N, K,
                                     _threads(threads), mc, kc, nc, list(split or ()))


def windowed_gather(op: Any, bits: Any, isa: str | None = None, threads: int | None = None,
                    kmajor: bool = False) -> torch.Tensor:
    """Every element ``(R, K)`` (int32 bits) of a ``repops.windowed.Operand`` over its input's bits;
    ``(K, R)`` if ``kmajor``."""
    return _ext(isa).windowed_gather(*_operand_args(op, bits), _threads(threads), kmajor)


def pool_backward(form: Any, arg_bits: Any, dy_bits: Any, isa: str | None = None,
                  threads: int | None = None) -> torch.Tensor:
    """dx (float32, flat) of a ``repops.windowed.MaxPoolBackward`` over the (arg, dy) bits."""
    arg, dy = (torch.from_numpy(writable(np.ascontiguousarray(b)).view(np.int32)) for b in (arg_bits, dy_bits))
    return _ext(isa).pool_backward(arg, dy, torch.from_numpy(form.axes), torch.from_numpy(form.plane_off), form.K,
                                   _threads(threads))


def _operand_args(op: Any, bits: Any) -> list[Any]:
    return [torch.from_numpy(writable(np.ascontiguousarray(bits)).view(np.int32)), torch.from_numpy(op.rows),
            torch.from_numpy(op.ks), torch.from_numpy(op.wins), int(op.fill)]


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None = None,
    alpha: float = 1.0,
    beta: float = 1.0,
    trans_a: bool = False,
    trans_b: bool = False,
    isa: str | None = None,
    threads: int | None = None,
) -> torch.Tensor:
    """ONNX Gemm in spec.gemm's order: the dot chain, then ``r*alpha`` (only if alpha != 1),
    then ``+ c*beta`` (``c`` broadcast; the product only if beta != 1; skipped if beta == 0).
    alpha and beta are rounded to binary32 first, as the spec's CONST does."""
    if a.dim() != 2 or b.dim() != 2:
        raise RepOpsError(f"gemm: A and B must be 2-D, got {tuple(a.shape)} and {tuple(b.shape)}")
    r = matmul(a, b, trans_a, trans_b, isa=isa, threads=threads)
    alpha32, beta32 = torch.tensor(alpha, dtype=torch.float32), torch.tensor(beta, dtype=torch.float32)
    if alpha != 1.0:
        r = binary("mul", r, alpha32, isa=isa, threads=threads)
    if c is not None and beta != 0.0:
        cb = _f32(c, "gemm c") if beta == 1.0 else binary("mul", c, beta32, isa=isa, threads=threads)
        if torch.broadcast_shapes(cb.shape, r.shape) != r.shape:
            raise RepOpsError(f"gemm: C {tuple(cb.shape)} does not broadcast to {tuple(r.shape)}")
        r = binary("add", r, cb, isa=isa, threads=threads)
    return r


# --------------------------------------------------------------------------------------------
# Reductions
# --------------------------------------------------------------------------------------------


def _norm_dims(dim: int | Sequence[int] | None, rank: int) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(rank))
    dims = [dim] if isinstance(dim, int) else list(dim)
    out = sorted({d + rank if d < 0 else d for d in dims})
    if any(not 0 <= d < rank for d in out):
        raise RepOpsError(f"reduce: dims {dim} out of range for rank {rank}")
    return tuple(out)


def _reduce(
    kind: str, x: torch.Tensor, dim: int | Sequence[int] | None, keepdim: bool, isa: str | None, threads: int | None
) -> torch.Tensor:
    x = _f32(x, f"reduce_{kind}")
    dims = _norm_dims(dim, x.dim())
    kept = [d for d in range(x.dim()) if d not in dims]
    big_k = math.prod(x.shape[d] for d in dims)
    if big_k == 0:
        raise RepOpsError(f"reduce_{kind}: empty reduction (K = 0)")
    # k runs row-major over the reduced axes (ascending axis order), as spec.reduce fixes.
    view = x.permute(*kept, *dims).reshape(-1, big_k)
    out = _ext(isa).reduce_last(view, int(_code(ReduceOp, kind, "reduce")), _threads(threads))
    shape = [1 if d in dims else x.shape[d] for d in range(x.dim())] if keepdim else [x.shape[d] for d in kept]
    return out.reshape(shape)


def reduce(
    kind: str,
    x: torch.Tensor,
    dim: int | Sequence[int] | None = None,
    keepdim: bool = False,
    isa: str | None = None,
    threads: int | None = None,
) -> torch.Tensor:
    """Reduction ``kind`` (sum, mean, max, min) over ``dim`` (all axes if None), k ascending."""
    _code(ReduceOp, kind, "reduce")
    return _reduce(kind, x, dim, keepdim, isa, threads)


Reducer = Callable[..., torch.Tensor]


def _reducer(kind: str) -> Reducer:
    def fn(
        x: torch.Tensor,
        dim: int | Sequence[int] | None = None,
        keepdim: bool = False,
        isa: str | None = None,
        threads: int | None = None,
    ) -> torch.Tensor:
        return _reduce(kind, x, dim, keepdim, isa, threads)

    fn.__name__ = fn.__qualname__ = f"reduce_{kind}"
    fn.__doc__ = f"reduce({kind!r}, ...): see :func:`reduce`."
    return fn


reduce_sum, reduce_mean = _reducer("sum"), _reducer("mean")
reduce_max, reduce_min = _reducer("max"), _reducer("min")


def reduce_rows(view: torch.Tensor, op: ReduceOp, isa: str | None = None, threads: int | None = None) -> torch.Tensor:
    """Fold each row of a 2-D (rows, K) view (any strides), k ascending: shape (rows,)."""
    return _ext(isa).reduce_last(_f32(view, f"reduce_{op.name.lower()}"), int(op), _threads(threads))


# --------------------------------------------------------------------------------------------
# Elementwise
# --------------------------------------------------------------------------------------------


def binary(op: str | BinOp, a: Any, b: Any, isa: str | None = None, threads: int | None = None) -> torch.Tensor:
    """``a <op> b`` with numpy broadcasting; op in add, sub, mul, div, max, min (or a BinOp)."""
    code = op if isinstance(op, BinOp) else _code(BinOp, op, "binary")
    op = code.name.lower()
    ta, tb = _f32(a, f"binary {op} a"), _f32(b, f"binary {op} b")
    try:
        ea, eb = torch.broadcast_tensors(ta, tb)
    except RuntimeError as exc:
        raise RepOpsError(f"binary {op}: shapes do not broadcast: {exc}") from exc
    return _ext(isa).binary(ea.contiguous(), eb.contiguous(), int(code), _threads(threads))


def run_program(
    inputs: Sequence[torch.Tensor],
    maps: torch.Tensor,
    out_shape: Sequence[int],
    K: int,
    programs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    r0_init: torch.Tensor | None = None,
    isa: str | None = None,
    threads: int | None = None,
) -> torch.Tensor:
    """Generic interpreter of one KernelDesc program (``backends/native.py`` has the encoding of
    ``maps`` and ``programs``): flat int32 bit patterns out. ``r0_init`` runs only the epilogue."""
    pro, body, epi = programs
    return _ext(isa).run_program(list(inputs), maps, list(out_shape), int(K), pro, body, epi, r0_init, _threads(threads))


def worker_mxcsr(isa: str | None = None, threads: int | None = None) -> int:
    """MXCSR as the threads running kernel work see it, OR-ed over them (-1 off x86): FTZ is
    bit 15, DAZ bit 6."""
    return int(_ext(isa).worker_mxcsr(_threads(threads)))


def probe_reset(isa: str | None = None) -> None:
    """Start a new engagement probe of ``isa``'s kernels (see :func:`probe_threads`)."""
    _ext(isa).probe_reset()


def set_spread_check(on: bool, isa: str | None = None) -> None:
    """Tests: while on, every thread of a call of ``isa``'s kernels runs at least one item (late
    threads are waited for), so a call at N threads is known to have used them."""
    _ext(isa).set_spread_check(on)


def pool_sleeps(isa: str | None = None) -> int:
    """How many times a worker of ``isa``'s thread pool has gone to sleep for want of a job
    (process-wide): between calls that follow each other within its spin (~2 ms,
    ``VERDE_REPOPS_SPIN_US``) a worker stays awake."""
    return int(_ext(isa).pool_sleeps())


def probe_threads(isa: str | None = None) -> list[int]:
    """The OS thread ids that ran at least one item of ``isa``'s kernels since
    :func:`probe_reset`: how many threads really worked."""
    return list(_ext(isa).probe_threads())
