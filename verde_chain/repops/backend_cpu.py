"""The C++ CPU backend of the RepOps dispatch: ``(desc, inputs) -> np.ndarray``, bit-identical
to ``reference.run`` for every KernelDesc.

Every node is classified by the STRUCTURE of its program and planned once (cached per desc)::

    dot    prologue  LOAD x<-A; LOAD y<-B; MUL r0 = x*y          -> GEMM (matmul3), then the
           body      LOAD x<-A; LOAD y<-B; FMA r0 = x*y + r0         epilogue (alpha, +C*beta ...)
                                                                     on the interpreter
    fold   prologue  LOAD r0<-X                                  -> reduce_last (sum/max/min),
           body      LOAD x<-X; ADD|MAX|MIN r0 = r0 (op) x           then the epilogue (mean's /K)
    binary LOAD r0<-A; LOAD r1<-B; ADD|SUB|MUL|DIV|MAX|MIN       -> vector binary kernel
           (K = 1, both inputs laid out exactly like the output)
    scatter exactly spec.scatter_add's program and maps           -> bucketed scatter-add, O(P*R +
           (embedding backward; at most 2^24 rows)                  V*R) instead of O(P*V*R)
    jit    any other map (K = 1) over linear input maps, with    -> generated SIMD C, compiled
           >= 8 instructions or >= 64k elements                     once per program (see
                                                                     "map codegen" below)
    any other program                                            -> generic interpreter

Why match the program rather than the label or the shapes: the label is not part of the hash,
so a node could carry any label; and regenerating ``spec.matmul``/``spec.gemm`` descs for guessed
shapes would miss squeezed vectors, broadcast batches and gemm epilogues. The program plus the
input maps ARE the semantics: a dot program with affine maps computes
``out[c] = chain_k A[offA + c.sA + k*kA] * B[offB + c.sB + k*kB]`` whatever produced it, and
the strided views below are built from those very maps, so the fast kernel reads exactly the
addresses the spec reads. A fast kernel only takes the prologue and body; an epilogue runs on the
interpreter with r0 preset, and only if it reads no register but r0 before writing it (so the
registers the fast kernel does not model cannot matter).

Cases deliberately left to the interpreter (the fast kernels would differ or gain nothing):
K = 1 folds (the spec returns the raw loaded bits, including non-canonical NaN payloads, while
the reduce kernel canonicalises), dots without a GEMM-shaped output (reduce_dot; GEMV shapes
with M = 1 or N = 1, measured 3x faster on the interpreter), negative strides (torch views
cannot express them), binaries with broadcast inputs (the interpreter reads them in place).

The interpreter (``run_program`` in ``kernels/repops_cpu.cpp``) executes ANY program exactly:
BLOCK output elements per register array, one vectorised lane loop per instruction, k in the
spec's one order; loads through linear maps (contiguous, broadcast scalar) are block copies,
other maps are read run by run along the innermost output axis (copy, fill or strided read).
Encoding handed to it: programs as (n, 5) int64 rows ``op, dst, a, b, imm``; input maps as
(n_inputs, rank + 4) int64 rows ``strides..., kstride, offset, idx_stride, numel``.

Whole steps: ``compile_step`` (used by the training executor) builds a ``StepKernel``: the plans
above for every node of a training step, handed once to a C++ ``StepPlan`` that runs the whole
step in one call with every node output in one arena (see ``StepKernel``). Same kernels, same
bits; it removes the ~10-20 us of Python, pybind and allocation per node that made a step of
small nodes 3x slower than torch eager.

Threads: ``threads`` workers split OUTPUT elements only (never a k range): the C++ kernels on
torch's intra-op pool (real parallelism ``min(threads, torch.get_num_threads())``), compiled
maps on a small Python pool (ctypes releases the GIL). No bit depends on the thread count.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from verde_chain.errors import RepOpsError
from verde_chain.repops import cpu_kernels as ck
from verde_chain.repops import windowed
from verde_chain.repops.isa import Instr, Op
from verde_chain.repops.program import InputMap, KernelDesc, check_inputs

# Operand registers each opcode reads (a, b, c); CONST/LOAD/COORD read none.
_READS: dict[Op, tuple[str, ...]] = {
    **{op: ("a", "b") for op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.MIN, Op.LT, Op.EQ, Op.LDEXP)},
    **{op: ("a", "b", "imm") for op in (Op.FMA, Op.SELECT)},
    **{op: ("a",) for op in (Op.SQRT, Op.RINT, Op.FLOOR, Op.GETEXP, Op.GETMANT, Op.NEG, Op.ABS, Op.MOV, Op.LOADIDX)},
    **{op: () for op in (Op.CONST, Op.LOAD, Op.COORD)},
}
_FOLD_OPS = {Op.ADD: "sum", Op.MAX: "max", Op.MIN: "min"}
_BINARY_OPS = {Op.ADD: "add", Op.SUB: "sub", Op.MUL: "mul", Op.DIV: "div", Op.MAX: "max", Op.MIN: "min"}


class BackendUnavailable(RepOpsError):
    """The C++ extension cannot be built or loaded on this machine."""


def live_in(program: Sequence[Instr]) -> frozenset[int]:
    """Registers ``program`` reads before writing them (its inputs from earlier phases)."""
    written: set[int] = set()
    reads: set[int] = set()
    for ins in program:
        for field in _READS[ins.op]:
            r = getattr(ins, field)
            if r not in written:
                reads.add(r)
        written.add(ins.dst)
    return frozenset(reads)


def _is_load(ins: Instr, dst: int | None = None) -> bool:
    return ins.op == Op.LOAD and (dst is None or ins.dst == dst)


# ======================================================================= plans


@dataclass(frozen=True)
class Plan:
    kind: str  # "dot" | "fold" | "binary" | "scatter" | "program"
    slots: tuple[int, ...] = ()  # input slots the fast kernel reads
    op: str = ""  # fold: sum/max/min; binary: add/sub/...
    # dot / fold: torch views (size, stride, offset) of the fast kernel's operands, built from
    # the input maps: dot (batch, M, K) and (batch, K, N) after reshape; fold (rows, K)
    views: tuple[tuple[tuple[int, ...], tuple[int, ...], int], ...] = ()
    shapes: tuple[tuple[int, ...], ...] = ()  # the 3-D / 2-D shapes the views are reshaped to


def _match_dot(desc: KernelDesc) -> tuple[int, int] | None:
    """(slot A, slot B) if the prologue/body are the spec's dot chain (any registers)."""
    pro, body = desc.prologue, desc.body
    if len(pro) != 3 or not (_is_load(pro[0]) and _is_load(pro[1])):
        return None
    x, y, sa, sb = pro[0].dst, pro[1].dst, pro[0].imm, pro[1].imm
    if len({x, y, 0}) != 3 or pro[2] != Instr(Op.MUL, 0, x, y):
        return None
    if desc.K > 1 and body != (Instr(Op.LOAD, x, imm=sa), Instr(Op.LOAD, y, imm=sb), Instr(Op.FMA, 0, x, y, 0)):
        return None
    return sa, sb


def _dot_plan(desc: KernelDesc, sa: int, sb: int) -> Plan | None:
    """GEMM geometry of a dot node: N = last output dim if A is constant along it (and B is
    not), M = the dim before it (or the last) where B is constant (and A is not), the dims in
    front of them are batch dims. None (interpreter) when the output is not GEMM-shaped: no M
    and no N (reduce_dot), or M = 1 or N = 1 (a GEMV pads the GEMM's 12 x 32 tile; the
    interpreter is faster there). Batch dims may have any (non-negative) strides, 0 included."""
    am, bm = desc.inputs[sa], desc.inputs[sb]
    shape, K = desc.out_shape, desc.K
    d = len(shape) - 1
    n_dim = m_dim = None
    if d >= 0 and am.strides[d] == 0 and bm.strides[d] != 0:
        n_dim, d = d, d - 1
    if d >= 0 and bm.strides[d] == 0 and am.strides[d] != 0:
        m_dim, d = d, d - 1
    if m_dim is None or n_dim is None or shape[m_dim] == 1 or shape[n_dim] == 1:
        return None
    batch = list(range(d + 1))
    M, N = shape[m_dim], shape[n_dim]
    bsize = tuple(shape[i] for i in batch)
    nb = math.prod(bsize)
    a_view = ((*bsize, M, K), (*(am.strides[i] for i in batch), am.strides[m_dim], am.kstride), am.offset)
    b_view = ((*bsize, K, N), (*(bm.strides[i] for i in batch), bm.kstride, bm.strides[n_dim]), bm.offset)
    return Plan("dot", (sa, sb), views=(a_view, b_view), shapes=((nb, M, K), (nb, K, N)))


# Rows a scatter-add kernel handles: row v is matched by EQ(idx, fl32(v)), exact up to 2^24.
MAX_SCATTER_ROWS = 1 << 24


def _is_scatter_add(desc: KernelDesc) -> bool:
    """The node is ``spec.scatter_add`` (embedding backward) exactly: the program and maps the
    spec builds for its shape, so the scatter kernel computes the very same chain."""
    if len(desc.out_shape) < 1 or len(desc.inputs) != 2 or not 1 <= desc.out_shape[0] <= MAX_SCATTER_ROWS:
        return False
    from verde_chain.repops import spec

    ref = spec.scatter_add(desc.K, desc.out_shape[1:], desc.out_shape[0])
    return (ref.out_shape, ref.K, ref.inputs, ref.prologue, ref.body, ref.epilogue) == (
        desc.out_shape, desc.K, desc.inputs, desc.prologue, desc.body, desc.epilogue
    )


def _plan(desc: KernelDesc) -> Plan:
    if any(s < 0 for m in desc.inputs for s in (*m.strides, m.kstride)):
        return Plan("program")
    if _is_scatter_add(desc):
        return Plan("scatter", (0, 1))
    epi_ok = live_in(desc.epilogue) <= {0}
    dot = _match_dot(desc)
    if dot is not None and epi_ok:
        plan = _dot_plan(desc, *dot)
        if plan is not None:
            return plan
    pro, body = desc.prologue, desc.body
    if (
        desc.K > 1
        and epi_ok
        and len(pro) == 1
        and _is_load(pro[0], 0)
        and len(body) == 2
        and _is_load(body[0])
        and body[0].imm == pro[0].imm
        and body[0].dst != 0
        and body[1].op in _FOLD_OPS
        and body[1].dst == 0
        and {body[1].a, body[1].b} == {0, body[0].dst}
    ):
        m = desc.inputs[pro[0].imm]
        view = ((*desc.out_shape, desc.K), (*m.strides, m.kstride), m.offset)
        return Plan("fold", (pro[0].imm,), _FOLD_OPS[body[1].op], (view,), ((desc.numel, desc.K),))
    if (
        desc.K == 1
        and not desc.epilogue
        and len(pro) == 3
        and pro[0] == Instr(Op.LOAD, 0, imm=0)
        and pro[1] == Instr(Op.LOAD, 1, imm=1)
        and pro[2].op in _BINARY_OPS
        and (pro[2].dst, pro[2].a, pro[2].b) == (0, 0, 1)
        and all(_is_identity(m, desc.out_shape) for m in desc.inputs)
    ):
        return Plan("binary", (0, 1), _BINARY_OPS[pro[2].op])
    return Plan("program")


def _is_identity(m: InputMap, shape: tuple[int, ...]) -> bool:
    """The map reads a C-contiguous tensor of exactly the output's shape, element for element
    (the stride of a size-1 dim is never used, so it may be anything)."""
    acc, ok = 1, m.offset == 0 and m.numel == math.prod(shape)
    for d in reversed(range(len(shape))):
        ok = ok and (shape[d] == 1 or m.strides[d] == acc)
        acc *= shape[d]
    return ok


# ======================================================================= encoding


@dataclass(frozen=True)
class Prepared:
    plan: Plan
    programs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # prologue, body, epilogue
    maps: torch.Tensor
    out_shape: list[int]
    jit: Callable[..., None] | None = None  # compiled map (see jit_source), else the interpreter


_MAX_PREPARED = 16384


def _program_tensor(program: tuple[Instr, ...]) -> torch.Tensor:
    rows = [(int(i.op), i.dst, i.a, i.b, i.imm) for i in program]
    return torch.tensor(rows, dtype=torch.int64).reshape(len(rows), 5)


def _maps_tensor(maps: tuple[InputMap, ...], rank: int) -> torch.Tensor:
    rows = [(*m.strides, m.kstride, m.offset, m.idx_stride, m.numel) for m in maps]
    return torch.tensor(rows, dtype=torch.int64).reshape(len(rows), rank + 4)


# ======================================================================= map codegen
#
# Long straight-line maps (transcendentals, optimizer updates, norm/loss elementwise parts) are
# compiled: the program becomes the body of one C loop over output elements, registers become
# local uint32 variables, every instruction a small branch-free inline function with the
# semantics of fp32.py (canonical NaN after each arithmetic result). The C compiler vectorises
# the loop across ELEMENTS only — never across k, there is none — and is run with
# -ffp-contract=off and without fast-math, so each instruction is still one IEEE operation
# rounded once. Eligible: K = 1, every input read through a linear map (contiguous or scalar
# broadcast), no COORD/LOADIDX, at least JIT_MIN_INSTRS instructions or JIT_MIN_NUMEL elements
# (small short programs are not worth a compile). One shared object per (program, linear maps,
# ISA), cached on disk (~0.3 s per compile).

JIT_MIN_INSTRS = 8
JIT_MIN_NUMEL = 1 << 16  # ... or at least this many output elements
JIT_DIR = ck.BUILD_ROOT / "repops_jit"

_JIT_PRELUDE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#define CN 0x7FC00000u
#define ONE 0x3F800000u
static inline float F(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t U(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline uint64_t UD(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }
static inline double FD(uint64_t u) { double d; memcpy(&d, &u, 8); return d; }
static inline uint32_t canon(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u ? CN : u; }
static inline uint32_t op_add(uint32_t a, uint32_t b) { return canon(U(F(a) + F(b))); }
static inline uint32_t op_sub(uint32_t a, uint32_t b) { return canon(U(F(a) - F(b))); }
static inline uint32_t op_mul(uint32_t a, uint32_t b) { return canon(U(F(a) * F(b))); }
static inline uint32_t op_div(uint32_t a, uint32_t b) { return canon(U(F(a) / F(b))); }
static inline uint32_t op_fma(uint32_t a, uint32_t b, uint32_t c) { return canon(U(fmaf(F(a), F(b), F(c)))); }
static inline uint32_t op_sqrt(uint32_t a) { return canon(U(sqrtf(F(a)))); }
static inline uint32_t op_max(uint32_t a, uint32_t b) {
    float x = F(a), y = F(b);
    uint32_t r = x > y ? a : b;
    r = x == y ? (a & b) : r;  /* max(-0, +0) = +0 */
    return x != x ? CN : (y != y ? CN : r);
}
static inline uint32_t op_min(uint32_t a, uint32_t b) {
    float x = F(a), y = F(b);
    uint32_t r = x < y ? a : b;
    r = x == y ? (a | b) : r;  /* min(-0, +0) = -0 */
    return x != x ? CN : (y != y ? CN : r);
}
static inline uint32_t op_lt(uint32_t a, uint32_t b) { return F(a) < F(b) ? ONE : 0u; }
static inline uint32_t op_eq(uint32_t a, uint32_t b) { return F(a) == F(b) ? ONE : 0u; }
static inline uint32_t op_select(uint32_t a, uint32_t b, uint32_t c) { return canon(F(a) != 0.0f ? b : c); }
static inline uint32_t op_rint(uint32_t a) { return canon(U(nearbyintf(F(a)))); }
static inline uint32_t op_floor(uint32_t a) { return canon(U(floorf(F(a)))); }
static inline uint32_t op_neg(uint32_t a) { return canon(a ^ 0x80000000u); }
static inline uint32_t op_abs(uint32_t a) { return canon(a & 0x7FFFFFFFu); }
static inline uint32_t op_mov(uint32_t a) { return canon(a); }
/* LDEXP (fp32.py): b integral or +-inf (a huge exponent); |b| clamped to 400 keeps the
   binary64 product a * 2^e exact, so the float conversion is the only rounding. */
static inline uint32_t op_ldexp(uint32_t a, uint32_t b) {
    float xf = F(a), yf = F(b);
    float yc = yf > 400.0f ? 400.0f : (yf < -400.0f ? -400.0f : yf);
    int32_t e = (int32_t)(yc == yc ? yc : 0.0f); /* int32: vectorisable without AVX512DQ */
    uint32_t r = canon(U((float)((double)xf * FD((uint64_t)(uint32_t)(e + 1023) << 52))));
    /* NaN b, non-integral finite b, 0 * 2^+inf, inf * 2^-inf: NaN. (Nested selects on float
       compares, not `&`/`|` of comparisons: GCC 12 cannot vectorise those.) */
    r = floorf(yf) == yf ? r : CN;
    r = yf == INFINITY ? (xf == 0.0f ? CN : r) : r;
    return yf == -INFINITY ? (fabsf(xf) == INFINITY ? CN : r) : r;
}
/* GETEXP / GETMANT: exponent and significand of |a| read from its exact binary64 value (where
   binary32 subnormals are normal). 0 -> (-inf, 1), inf -> (+inf, 1), NaN -> NaN. */
static inline uint32_t op_getexp(uint32_t a) {
    float x = F(a);
    uint64_t d = UD(fabs((double)x));
    float e = (float)((int32_t)((d >> 52) & 0x7FF) - 1023);
    uint32_t r = x == 0.0f ? U(-INFINITY) : (fabsf(x) == INFINITY ? U(INFINITY) : U(e));
    return x != x ? CN : r;
}
static inline uint32_t op_getmant(uint32_t a) {
    float x = F(a);
    uint64_t d = UD(fabs((double)x));
    float m = (float)FD((d & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);
    uint32_t r = x == 0.0f ? ONE : (fabsf(x) == INFINITY ? ONE : U(m));
    return x != x ? CN : r;
}
"""

# Vector layer: registers are W-lane GCC vectors; the scalar helpers above define each lane.
# NaN canonicalisation happens ONCE, on the result (see jit_source): no instruction's non-NaN
# result depends on a NaN operand's payload (LT/EQ and SELECT's condition only ask "is it NaN /
# non-zero", MAX/MIN/LDEXP/GETEXP/GETMANT/arithmetic map any NaN to a NaN), so payloads of
# intermediate NaNs are unobservable and only the final register's bits need the rule.
_JIT_VECTOR = r"""
typedef float vf __attribute__((vector_size(4 * W)));
typedef uint32_t vu __attribute__((vector_size(4 * W)));
typedef int32_t vi __attribute__((vector_size(4 * W)));
static inline vu splat(uint32_t c) { vu v; for (int i = 0; i < W; i++) v[i] = c; return v; }
static inline vu sel(vi m, vu a, vu b) { return (vu)((m & (vi)a) | (~m & (vi)b)); }
static inline vu vcanon(vu u) { return sel((vi)((u & 0x7FFFFFFFu) > 0x7F800000u), splat(CN), u); }
static inline vu v_add(vu a, vu b) { return (vu)((vf)a + (vf)b); }
static inline vu v_sub(vu a, vu b) { return (vu)((vf)a - (vf)b); }
static inline vu v_mul(vu a, vu b) { return (vu)((vf)a * (vf)b); }
static inline vu v_div(vu a, vu b) { return (vu)((vf)a / (vf)b); }
static inline vu v_max(vu a, vu b) {
    vf x = (vf)a, y = (vf)b;
    vu r = sel(x > y, a, b);
    r = sel(x == y, a & b, r);
    return sel((x != x) | (y != y), splat(CN), r);
}
static inline vu v_min(vu a, vu b) {
    vf x = (vf)a, y = (vf)b;
    vu r = sel(x < y, a, b);
    r = sel(x == y, a | b, r);
    return sel((x != x) | (y != y), splat(CN), r);
}
static inline vu v_lt(vu a, vu b) { return (vu)((vf)a < (vf)b) & ONE; }
static inline vu v_eq(vu a, vu b) { return (vu)((vf)a == (vf)b) & ONE; }
static inline vu v_select(vu a, vu b, vu c) { return sel((vf)a != 0.0f, b, c); }
static inline vu v_neg(vu a) { return a ^ 0x80000000u; }
static inline vu v_abs(vu a) { return a & 0x7FFFFFFFu; }
static inline vu v_mov(vu a) { return a; }
#define LANES1(name, f) static inline vu name(vu a) { vu r; for (int i = 0; i < W; i++) r[i] = f(a[i]); return r; }
#define LANES2(name, f) static inline vu name(vu a, vu b) { vu r; for (int i = 0; i < W; i++) r[i] = f(a[i], b[i]); return r; }
LANES1(v_getexp, op_getexp) LANES1(v_getmant, op_getmant) LANES2(v_ldexp, op_ldexp)
/* One IEEE operation per lane; hardware instructions where the ISA has them. */
#if W == 16 && defined(__AVX512F__)
static inline vu v_fma(vu a, vu b, vu c) { return (vu)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c); }
static inline vu v_sqrt(vu a) { return (vu)_mm512_sqrt_ps((__m512)a); }
static inline vu v_rint(vu a) { return (vu)_mm512_roundscale_ps((__m512)a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vu v_floor(vu a) { return (vu)_mm512_roundscale_ps((__m512)a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
#elif W == 8 && defined(__AVX2__) && defined(__FMA__)
static inline vu v_fma(vu a, vu b, vu c) { return (vu)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
static inline vu v_sqrt(vu a) { return (vu)_mm256_sqrt_ps((__m256)a); }
static inline vu v_rint(vu a) { return (vu)_mm256_round_ps((__m256)a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vu v_floor(vu a) { return (vu)_mm256_round_ps((__m256)a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
#else
static inline vu v_fma(vu a, vu b, vu c) { vu r; for (int i = 0; i < W; i++) r[i] = op_fma(a[i], b[i], c[i]); return r; }
LANES1(v_sqrt, op_sqrt) LANES1(v_rint, op_rint) LANES1(v_floor, op_floor)
#endif
"""

_JIT_OPS = {
    Op.ADD: "v_add({a}, {b})", Op.SUB: "v_sub({a}, {b})", Op.MUL: "v_mul({a}, {b})", Op.DIV: "v_div({a}, {b})",
    Op.FMA: "v_fma({a}, {b}, {c})", Op.SQRT: "v_sqrt({a})", Op.MAX: "v_max({a}, {b})", Op.MIN: "v_min({a}, {b})",
    Op.LT: "v_lt({a}, {b})", Op.EQ: "v_eq({a}, {b})", Op.SELECT: "v_select({a}, {b}, {c})",
    Op.RINT: "v_rint({a})", Op.FLOOR: "v_floor({a})", Op.LDEXP: "v_ldexp({a}, {b})",
    Op.GETEXP: "v_getexp({a})", Op.GETMANT: "v_getmant({a})", Op.NEG: "v_neg({a})", Op.ABS: "v_abs({a})",
    Op.MOV: "v_mov({a})",
}  # fmt: skip
JIT_LANES = {"scalar": 4, "avx2": 8, "avx512": 16}


def linear_stride(m: InputMap, shape: tuple[int, ...]) -> int | None:
    """s if the map reads address offset + e*s for flat output element e, else None."""
    live = [d for d in range(len(shape)) if shape[d] > 1]
    if not live:
        return 0
    s, acc = m.strides[live[-1]], 1
    for d in reversed(range(len(shape))):
        if shape[d] > 1 and m.strides[d] != s * acc:
            return None
        acc *= shape[d]
    return s


def jit_source(desc: KernelDesc, lanes: int = 16, min_instrs: int = JIT_MIN_INSTRS) -> str | None:
    """C source of ``desc`` as one vector loop (``lanes`` elements per iteration), or None if
    it is not an eligible map.

    Every LOAD of input t reads the same address for a given element (K = 1), so each input is
    loaded once per iteration into x_t: a full vector, or zero-padded lanes in the tail."""
    code = desc.prologue + desc.epilogue  # K = 1: both run at k = 0
    if desc.K != 1 or desc.body or len(code) < min_instrs:
        return None
    strides = [linear_stride(m, desc.out_shape) for m in desc.inputs]
    if any(s is None or s < 0 for s in strides):
        return None
    lines = []
    for ins in code:
        dst = f"r{ins.dst}"
        if ins.op == Op.CONST:
            lines.append(f"{dst} = splat({ins.imm}u);")
        elif ins.op == Op.LOAD:
            lines.append(f"{dst} = x{ins.imm};")
        elif ins.op in _JIT_OPS:
            lines.append(f"{dst} = " + _JIT_OPS[ins.op].format(a=f"r{ins.a}", b=f"r{ins.b}", c=f"r{ins.imm & 15}") + ";")
        else:
            return None  # COORD, LOADIDX: the interpreter handles them
    # The result is canonicalised unless r0's last writer copies raw bits (LOAD, CONST keep
    # payloads in the spec; every register instruction canonicalises).
    last = next((i for i in reversed(code) if i.dst == 0), None)
    ret = "r0" if last is None or last.op in (Op.LOAD, Op.CONST) else "vcanon(r0)"
    n_in = len(desc.inputs)
    params = ", ".join(f"vu x{t}" for t in range(n_in)) or "void"
    args = ", ".join(f"x{t}" for t in range(n_in))
    regs = ", ".join(f"r{i} = splat(0)" for i in range(16))
    body = "\n    ".join(lines)

    def load(t: int, tail: bool) -> str:
        m, s = desc.inputs[t], strides[t]
        src = f"((const uint32_t*)in[{t}])"
        if s == 0:
            return f"vu x{t} = splat({src}[{m.offset}]);"
        if s == 1 and not tail:
            return f"vu x{t}; memcpy(&x{t}, {src} + {m.offset} + e, sizeof x{t});"
        lim = "rem" if tail else "W"
        return f"vu x{t} = splat(0); for (int i = 0; i < {lim}; i++) x{t}[i] = {src}[{m.offset} + (e + i) * {s}];"

    main_loads = "\n        ".join(load(t, False) for t in range(n_in))
    tail_loads = "\n        ".join(load(t, True) for t in range(n_in))
    return (
        _JIT_PRELUDE
        + f"#define W {lanes}\n"
        + _JIT_VECTOR
        + f"static inline vu body({params}) {{\n    vu {regs};\n    {body}\n    return {ret};\n}}\n"
        + "void repops_map(const void* const* in, uint32_t* out, int64_t e0, int64_t e1) {\n"
        + "#if defined(__x86_64__)\n    const unsigned csr = _mm_getcsr();\n"
        + "    _mm_setcsr(csr & ~(0x8000u | 0x0040u | 0x6000u)); /* no FTZ/DAZ, round to nearest */\n#endif\n"
        + "    int64_t e = e0;\n"
        + f"    for (; e + W <= e1; e += W) {{\n        {main_loads}\n"
        + f"        vu r = body({args});\n        memcpy(out + e, &r, sizeof r);\n    }}\n"
        + f"    if (e < e1) {{\n        const int rem = (int)(e1 - e);\n        {tail_loads}\n"
        + f"        vu r = body({args});\n        for (int i = 0; i < rem; i++) out[e + i] = r[i];\n    }}\n"
        + "#if defined(__x86_64__)\n    _mm_setcsr(csr);\n#endif\n}\n"
    )


_JIT_SIGNATURE = (ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint32), ctypes.c_int64, ctypes.c_int64)


@functools.cache
def jit_compile(source: str, isa: str) -> Callable[..., None]:
    """Compile (or load from the disk cache) one generated map; returns the C function."""
    # -fno-trapping-math lets the compiler evaluate both sides of a select (if-conversion, so
    # the loop vectorises); it only drops the promise about FP exception flags and traps, which
    # nothing here enables or reads. Values stay IEEE: no contraction, no fast-math.
    flags = [*ck.build_flags(isa), "-fno-math-errno", "-fno-trapping-math", "-std=c11", "-shared", "-fPIC"]
    key = hashlib.sha256((source + " ".join(flags)).encode()).hexdigest()[:16]
    JIT_DIR.mkdir(parents=True, exist_ok=True)
    lib_path = JIT_DIR / f"map_{isa}_{key}.so"
    if not lib_path.exists():
        src = JIT_DIR / f"map_{isa}_{key}.{os.getpid()}.c"
        tmp = JIT_DIR / f"map_{isa}_{key}.{os.getpid()}.so"
        src.write_text(source)
        cc = os.environ.get("CC", "cc")
        proc = subprocess.run([cc, *flags, "-o", str(tmp), str(src)], capture_output=True, text=True, check=False)
        src.unlink(missing_ok=True)
        if proc.returncode != 0:
            raise BackendUnavailable(f"compiling a RepOps map failed: {proc.stderr[-2000:]}")
        os.replace(tmp, lib_path)  # atomic: concurrent processes never load a partial file
    fn = ctypes.CDLL(str(lib_path)).repops_map
    fn.argtypes = _JIT_SIGNATURE
    fn.restype = None
    return fn


# ======================================================================= backend


class CppBackend:
    """``backend(desc, inputs)``: the C++ kernels for every desc (see the module docstring)."""

    def __init__(
        self, isa: str | None = None, threads: int | None = None, jit: bool = True, jit_min_instrs: int = JIT_MIN_INSTRS
    ) -> None:
        try:
            self.isa = isa or ck.best_isa()
            self._ext = ck.extension(self.isa)
        except RepOpsError as exc:
            raise BackendUnavailable(f"RepOps C++ kernels unavailable: {exc}") from exc
        except Exception as exc:
            raise BackendUnavailable(f"RepOps C++ kernels unavailable: {type(exc).__name__}: {exc}") from exc
        if threads is not None and threads < 1:
            raise RepOpsError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        self.jit = jit and os.environ.get("VERDE_REPOPS_JIT", "1") != "0"
        self.jit_min_instrs = jit_min_instrs
        self._pool: tuple[int, ThreadPoolExecutor] | None = None  # (workers, pool) for compiled maps
        # Per-desc preparation, keyed by identity: graph nodes are long-lived, and hashing a
        # KernelDesc (a transcendental program has ~100 instructions) on every call would cost
        # more than running a small node. The desc itself is kept so its id cannot be reused.
        self._prepared: dict[int, tuple[KernelDesc, Prepared]] = {}

    def compile_step(self, descs: Sequence[KernelDesc], wiring: Sequence[Sequence[tuple[int, int]]],
                     producers: Sequence[int], batch_numel: int) -> StepKernel | None:
        """One C++ call per training step for these nodes (see ``StepKernel``); None (nodes one
        by one) while a node uses the window extension, which the C++ kernels do not read yet."""
        if any(desc.extended for desc in descs):
            return None
        return StepKernel(self, descs, wiring, producers, batch_numel)

    def plan(self, desc: KernelDesc) -> Plan:
        return self._prepare(desc).plan

    def path(self, desc: KernelDesc) -> str:
        """Which code runs ``desc``: dot | fold | binary | scatter | jit | program (the interpreter)."""
        prep = self._prepare(desc)
        return "jit" if prep.jit is not None else prep.plan.kind

    def _prepare(self, desc: KernelDesc) -> Prepared:
        hit = self._prepared.get(id(desc))
        if hit is not None and hit[0] is desc:
            return hit[1]
        if len(self._prepared) >= _MAX_PREPARED:
            self._prepared.clear()
        plan = _plan(desc)
        prep = Prepared(
            plan,
            (_program_tensor(desc.prologue), _program_tensor(desc.body), _program_tensor(desc.epilogue)),
            _maps_tensor(desc.inputs, len(desc.out_shape)),
            list(desc.out_shape),
            self._compile(desc) if plan.kind == "program" else None,
        )
        self._prepared[id(desc)] = (desc, prep)
        return prep

    def _compile(self, desc: KernelDesc) -> Callable[..., None] | None:
        # Big maps are worth a one-time compile whatever their length.
        min_instrs = 1 if desc.numel >= JIT_MIN_NUMEL else self.jit_min_instrs
        source = jit_source(desc, JIT_LANES.get(self.isa, 4), min_instrs) if self.jit else None
        if source is None:
            return None
        try:
            return jit_compile(source, self.isa)
        except (BackendUnavailable, OSError) as exc:
            # SAFETY: the interpreter gives the same bits; losing speed is not worth failing.
            print(f"verde-chain: {exc}; running {desc.label or 'a map'} on the interpreter", file=sys.stderr)
            self.jit = False
            return None

    def _run_jit(self, desc: KernelDesc, fn: Callable[..., None], flat: list[np.ndarray]) -> np.ndarray:
        n = desc.numel
        out = np.empty(n, dtype=np.uint32)
        ptrs = (ctypes.c_void_p * max(1, len(flat)))(*[x.ctypes.data for x in flat])
        optr = out.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32))
        threads = torch.get_num_threads() if self.threads is None else self.threads
        work = n * (len(desc.prologue) + len(desc.epilogue))
        if threads <= 1 or work < (1 << 18):
            fn(ptrs, optr, 0, n)
            return out
        # ctypes releases the GIL: the chunks run in parallel; element ranges are disjoint.
        if self._pool is None or self._pool[0] != threads:
            self._pool = (threads, ThreadPoolExecutor(max_workers=threads, thread_name_prefix="repops-map"))
        bounds = [n * i // threads for i in range(threads + 1)]
        list(self._pool[1].map(lambda i: fn(ptrs, optr, bounds[i], bounds[i + 1]), range(threads)))
        return out

    def __call__(self, desc: KernelDesc, inputs: Sequence[np.ndarray]) -> np.ndarray:
        if desc.extended:  # the window extension: the C++ interpreter does not read windows yet
            return windowed.run(desc, inputs, self._gemm, self)
        prep = self._prepare(desc)
        flat = _flat_bits(desc, inputs)
        plan = prep.plan
        if prep.jit is not None:
            return self._run_jit(desc, prep.jit, flat).view(np.float32).reshape(desc.out_shape)
        if plan.kind == "dot":
            out = self._dot(desc, plan, flat, prep)
        elif plan.kind == "fold":
            out = self._fold(desc, plan, flat, prep)
        elif plan.kind == "binary":
            a, b = (torch.from_numpy(x.view(np.float32)) for x in flat)
            out = ck.binary(plan.op, a, b, isa=self.isa, threads=self.threads).reshape(-1)
        elif plan.kind == "scatter":
            g, idx = (torch.from_numpy(x.view(np.float32)) for x in flat)
            threads = torch.get_num_threads() if self.threads is None else self.threads
            out = self._ext.scatter_rows(g.reshape(desc.K, -1), idx, desc.out_shape[0], threads).reshape(-1)
        else:
            out = self._program(desc, flat, prep)
        return out.numpy().view(np.float32).reshape(desc.out_shape)

    # ------------------------------------------------------------------ fast paths
    def _gemm(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """(nb, M, K) @ (nb, K, N) float32 arrays on the fixed-chain GEMM."""
        return ck.matmul3(torch.from_numpy(a), torch.from_numpy(b), self.isa, self.threads).numpy()

    def _views(self, plan: Plan, flat: list[np.ndarray]) -> list[torch.Tensor]:
        # reshape keeps stride-0 (broadcast) batches as views where it can; a copy changes no value
        return [
            torch.from_numpy(flat[slot].view(np.float32)).as_strided(size, stride, off).reshape(shape)
            for slot, (size, stride, off), shape in zip(plan.slots, plan.views, plan.shapes)
        ]

    def _dot(self, desc: KernelDesc, plan: Plan, flat: list[np.ndarray], prep: Prepared) -> torch.Tensor:
        a, b = self._views(plan, flat)
        return self._epilogue(desc, flat, ck.matmul3(a, b, self.isa, self.threads).reshape(-1), prep)

    def _fold(self, desc: KernelDesc, plan: Plan, flat: list[np.ndarray], prep: Prepared) -> torch.Tensor:
        (x,) = self._views(plan, flat)
        return self._epilogue(desc, flat, ck.reduce_rows(x, plan.op, self.isa, self.threads), prep)

    def _epilogue(self, desc: KernelDesc, flat: list[np.ndarray], r0: torch.Tensor, prep: Prepared) -> torch.Tensor:
        if not desc.epilogue:
            return r0
        return self._program(desc, flat, prep, r0.contiguous().view(torch.int32))

    # ------------------------------------------------------------------ interpreter
    def _program(
        self, desc: KernelDesc, flat: list[np.ndarray], prep: Prepared, r0_init: torch.Tensor | None = None
    ) -> torch.Tensor:
        # The extension is called directly (not through ck.run_program): this path runs for
        # most nodes, and each small node's cost is mostly call overhead.
        pro, body, epi = prep.programs
        threads = torch.get_num_threads() if self.threads is None else self.threads
        out = self._ext.run_program(
            [torch.from_numpy(x.view(np.int32)) for x in flat], prep.maps, prep.out_shape, desc.K,
            pro, body, epi, r0_init, threads,
        )  # fmt: skip
        return out.view(torch.float32)


# ======================================================================= whole-step kernel

# Node outputs start on 64-byte boundaries in the arena (whole cache lines per node).
_ALIGN = 16
_NODE, _PREV, _BATCH = 0, 1, 2  # graph.structure.SourceKind values: node, previous step, batch


class ArenaLayout:
    """Where a whole-step kernel keeps a step's node outputs: one float32 arena, node d at
    ``offsets[d]`` (in order, each on a 64-byte boundary). Every backend's step kernel has this
    one layout, so the executor finds and hashes any arena's slices the same way. The state a
    step reads is the previous step's arena (the producers' slots); ``pack(tensors)`` builds one
    from state tensors that did not come from a run (C_0, a loaded checkpoint), ``views(arena)``
    gives the flat node outputs. ``node_times`` (profiling): when set (float64, one per node),
    every run adds each node's seconds to it."""

    def __init__(self, descs: Sequence[KernelDesc], producers: Sequence[int], batch_numel: int) -> None:
        self.numels = [d.numel for d in descs]
        self.offsets, off = [], 0
        for n in self.numels:
            self.offsets.append(off)
            off += -(-n // _ALIGN) * _ALIGN
        self.arena_numel = max(off, 1)
        self.offsets_arr, self.numels_arr = np.array(self.offsets, dtype=np.int64), np.array(self.numels, dtype=np.int64)
        self.batch_numel = batch_numel
        self.producers = list(producers)
        self._slices = [slice(o, o + n) for o, n in zip(self.offsets, self.numels)]
        self.node_times: np.ndarray | None = None

    def pack(self, tensors: dict[int, np.ndarray]) -> np.ndarray:
        arena = np.zeros(self.arena_numel, dtype=np.float32)
        for p in self.producers:
            arena[self._slices[p]] = tensors[p]
        return arena

    def views(self, arena: np.ndarray) -> list[np.ndarray]:
        return [arena[s] for s in self._slices]


class StepKernel(ArenaLayout):
    """Every node of a training step in ONE call into C++ (``StepPlan`` in
    ``kernels/repops_cpu.cpp``): the same kernels as ``CppBackend.__call__`` per node (GEMM, fold,
    binary, scatter, compiled map, interpreter), so the same bits, without the ~10-20 us of
    Python, pybind and allocation per node that dominated small nodes. ``run(prev_arena, batch)``
    returns the new arena (see :class:`ArenaLayout`)."""

    def __init__(self, backend: CppBackend, descs: Sequence[KernelDesc], wiring: Sequence[Sequence[tuple[int, int]]],
                 producers: Sequence[int], batch_numel: int) -> None:
        super().__init__(descs, producers, batch_numel)
        self.backend = backend
        self._plan = backend._ext.StepPlan(self.arena_numel, self.arena_numel, batch_numel, *ck.DEFAULT_TILE)
        self._keep: list[object] = []  # compiled maps the plan calls by address
        for d, (desc, wires) in enumerate(zip(descs, wiring, strict=True)):
            self._add(d, desc, wires)

    def _refs(self, desc: KernelDesc, wires: Sequence[tuple[int, int]]) -> torch.Tensor:
        rows = []
        for (kind, i), m in zip(wires, desc.inputs, strict=True):
            buf, off, n = (_BATCH, 0, self.batch_numel) if kind == _BATCH else (kind, self.offsets[i], self.numels[i])
            if n != m.numel:
                raise RepOpsError(f"node {desc.label or '?'}: input has {n} elements, its map expects {m.numel}")
            rows.append((buf, off, n))
        return torch.tensor(rows, dtype=torch.int64).reshape(len(rows), 3)

    def _add(self, d: int, desc: KernelDesc, wires: Sequence[tuple[int, int]]) -> None:
        prep = self.backend._prepare(desc)
        plan, refs, out = prep.plan, self._refs(desc, wires), self.offsets[d]
        if prep.jit is not None:
            lin = [(m.offset, linear_stride(m, desc.out_shape)) for m in desc.inputs]
            work = desc.numel * (len(desc.prologue) + len(desc.epilogue))
            addr = ctypes.cast(cast(Any, prep.jit), ctypes.c_void_p).value  # a ctypes function pointer
            self._keep.append(prep.jit)
            self._plan.add_jit(refs, torch.tensor(lin, dtype=torch.int64).reshape(len(lin), 2), out, desc.numel, addr, work)
            return
        code = (prep.maps, prep.out_shape, desc.K, *prep.programs, out)
        if plan.kind == "dot":
            (a_size, a_st, a_off), (b_size, b_st, b_off) = plan.views
            bshape = a_size[:-2]
            aoff = a_off + _grid_offsets(bshape, a_st[:-2])
            boff = b_off + _grid_offsets(bshape, b_st[:-2])
            M, N = a_size[-2], b_size[-1]
            self._plan.add_dot(refs, *code, *plan.slots, M, N, aoff, a_st[-2], a_st[-1], boff, b_st[-2], b_st[-1])
            return
        if plan.kind == "fold":
            ((_, st, x_off),) = plan.views
            m = desc.inputs[plan.slots[0]]
            sr = linear_stride(m, desc.out_shape)
            if sr is not None:
                op = ck.REDUCE_OPS[plan.op]
                self._plan.add_fold(refs, *code, plan.slots[0], op, x_off, sr, st[-1])
                return
        elif plan.kind == "binary":
            self._plan.add_binary(refs, out, desc.numel, ck.BINARY_OPS[plan.op])
            return
        elif plan.kind == "scatter":
            self._plan.add_scatter(refs, out, desc.K, desc.numel // desc.out_shape[0], desc.out_shape[0])
            return
        self._plan.add_program(refs, *code)

    def run(self, prev_arena: np.ndarray, batch: np.ndarray) -> np.ndarray:
        threads = torch.get_num_threads() if self.backend.threads is None else self.backend.threads
        prev = torch.from_numpy(_writable(prev_arena))  # read-only: another backend's arena (rare), copied
        b = torch.from_numpy(_writable(batch))
        times = None if self.node_times is None else torch.from_numpy(self.node_times)
        return self._plan.run(prev, b, threads, times).numpy()


def _grid_offsets(shape: Sequence[int], strides: Sequence[int]) -> torch.Tensor:
    """Element offsets of every index of ``shape`` (C order) under ``strides``; one for ()."""
    off = torch.zeros(1, dtype=torch.int64)
    for n, s in zip(shape, strides):
        off = (off[:, None] + torch.arange(n, dtype=torch.int64)[None, :] * s).reshape(-1)
    return off


def _writable(a: np.ndarray) -> np.ndarray:
    return a if a.flags.writeable else a.copy()


def _flat_bits(desc: KernelDesc, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Flat, writable uint32 views of the inputs (torch cannot wrap read-only numpy arrays),
    sizes checked against the maps: ``program.check_inputs`` with a fast path."""
    if len(inputs) != len(desc.inputs):
        return check_inputs(desc, inputs)  # raises the descriptive error
    out = []
    for x, m in zip(inputs, desc.inputs):
        if not (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.flags.c_contiguous and x.size == m.numel):
            return [_writable(a) for a in check_inputs(desc, inputs)]
        out.append(_writable(x.reshape(-1).view(np.uint32)))
    return out


@functools.cache
def default_backend() -> CppBackend | None:
    """One shared backend (best ISA, torch's thread count), or None if the kernels cannot be
    built here (said once on stderr; the failure is cached, never retried per call)."""
    try:
        return CppBackend()
    except BackendUnavailable as exc:
        print(f"verde-chain: {exc}; RepOps runs on the numpy reference", file=sys.stderr)
        return None


def backend(desc: KernelDesc, inputs: list[np.ndarray]) -> np.ndarray | None:
    """The ``ops.BACKENDS`` signature: the C++ result, or None (the reference runs it)."""
    fn = default_backend()
    return None if fn is None else fn(desc, inputs)


def register(device_type: str = "cpu") -> None:
    """Make the torch-facing API (``verde_chain.repops.matmul`` ...) run on the C++ kernels."""
    from verde_chain.repops import ops

    ops.register_backend(device_type, backend)
