// SPDX-License-Identifier: MIT
//
// simd.h — the ISA layer of the RepOps CPU kernels: W-lane vectors of independent output
// elements and the FP environment every thread running items sets (the pool: pool.h).
//
// Built three times (verde_chain/repops/backends/cpu/extension.py), one extension per ISA:
//   REPOPS_ISA=0  scalar   (no ISA flags; fmaf from libm, correctly rounded)
//   REPOPS_ISA=1  AVX2     (-mavx2 -mfma;   _mm256_fmadd_ps rounds once, like fmaf)
//   REPOPS_ISA=2  AVX-512  (-mavx512f;      _mm512_fmadd_ps rounds once, like fmaf)
// always with -O3 -ffp-contract=off -fno-fast-math, so the compiler never fuses a*b+c on its own.
// All three give the same bits: vector lanes only ever hold DIFFERENT output elements, never
// partial sums of one element.
//
// One lane's semantics are kernels/repops_fp32.h (rp_canon, rp_max, rp_min, ...). The Vec
// operations below are their W-lane spellings for the hand-vectorised kernels (GEMM, folds,
// binaries, scatter): vcanon = rp_canon, vmax_spec/vmin_spec = rp_max/rp_min on every lane;
// tests/repops/test_cpu_kernels.py checks them lane by lane against the reference on the edge grid.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "../repops_fp32.h"
#include "pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define REPOPS_X86 1
#else
#define REPOPS_X86 0
#endif

#ifndef REPOPS_ISA
#define REPOPS_ISA 0
#endif

#if defined(__FAST_MATH__)
#error "the RepOps CPU kernels must not be built with -ffast-math"
#endif

namespace repops_cpu {

inline float from_bits(uint32_t u) { return rp_f(u); }
inline uint32_t to_bits(float f) { return rp_u(f); }
// One lane of the spec on floats: the canonical NaN, MAX, MIN (kernels/repops_fp32.h).
inline float canon(float x) { return rp_f(rp_canon(rp_u(x))); }
inline float max_spec(float a, float b) { return rp_f(rp_max(rp_u(a), rp_u(b))); }
inline float min_spec(float a, float b) { return rp_f(rp_min(rp_u(a), rp_u(b))); }

// SAFETY: torch (set_flush_denormal) or another library may have turned on FTZ/DAZ in this
// thread; either would flush subnormal operands/results and break bitwise agreement with the
// spec. MXCSR is per thread, so every worker installs this guard.
struct FpEnvGuard {
#if REPOPS_X86
    unsigned saved;
    FpEnvGuard() : saved(_mm_getcsr()) {
        // FTZ = bit 15, DAZ = bit 6, rounding control = bits 13-14 (00 = nearest even).
        _mm_setcsr(saved & ~(0x8000u | 0x0040u | 0x6000u));
    }
    ~FpEnvGuard() { _mm_setcsr(saved); }
#endif
};

#if REPOPS_X86 && defined(__AVX2__)
inline __m256 y_canonical_nan() { return _mm256_castsi256_ps(_mm256_set1_epi32((int)RP_CANONICAL_NAN)); }

// rp_max / rp_min on 8 lanes: hardware max/min, then the -0/+0 tie rule (AND / OR of equal
// values), then NaN. Shared by the AVX2 Vec and the rows-to-lanes reductions, which AVX-512
// builds run on ymm registers too.
template <bool IS_MAX>
inline __m256 y_extreme_spec(__m256 a, __m256 b) {
    const __m256 unord = _mm256_cmp_ps(a, b, _CMP_UNORD_Q);
    const __m256 eq = _mm256_cmp_ps(a, b, _CMP_EQ_OQ);
    const __m256 r = IS_MAX ? _mm256_blendv_ps(_mm256_max_ps(a, b), _mm256_and_ps(a, b), eq)
                            : _mm256_blendv_ps(_mm256_min_ps(a, b), _mm256_or_ps(a, b), eq);
    return _mm256_blendv_ps(r, y_canonical_nan(), unord);
}
// rp_canon on 8 lanes.
inline __m256 y_canon(__m256 v) { return _mm256_blendv_ps(v, y_canonical_nan(), _mm256_cmp_ps(v, v, _CMP_UNORD_Q)); }

// Rows to lanes, for chains along a unit-stride axis (reduce.cpp's folds, norm.cpp's dot
// chains; AVX-512 builds run them on ymm registers too): an 8x8 block, r[i] = row i's
// elements k .. k+7, transposed in registers so that r[j] lane i = row i's element k+j. Each
// lane then carries one row's chain in the row's own k order.
#define REPOPS_HAVE_ROWS8 1
inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm256_shuffle_ps(t[4 * h + 0], t[4 * h + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h + 0], t[4 * h + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x20);
        r[4 + i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x31);
    }
}
// One k of 8 rows, lane i = p[i * sr] (the K tail after the 8x8 blocks, element by element).
inline __m256 y_column8(const float* p, int64_t sr) {
    return _mm256_setr_ps(p[0], p[sr], p[2 * sr], p[3 * sr], p[4 * sr], p[5 * sr], p[6 * sr], p[7 * sr]);
}
#endif

// ----------------------------------------------------------------------------------------
// Vector abstraction: W lanes of independent output elements.
// ----------------------------------------------------------------------------------------

#if REPOPS_ISA == 2
constexpr const char* ISA_NAME = "avx512";
constexpr int W = 16;
struct Vec {
    __m512 v;
};
inline Vec vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void vstore(float* p, Vec a) { _mm512_storeu_ps(p, a.v); }
inline Vec vbcast(float x) { return {_mm512_set1_ps(x)}; }
inline Vec vmul(Vec a, Vec b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline Vec vadd(Vec a, Vec b) { return {_mm512_add_ps(a.v, b.v)}; }
inline Vec vsub(Vec a, Vec b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline Vec vdiv(Vec a, Vec b) { return {_mm512_div_ps(a.v, b.v)}; }
inline Vec vfma(Vec a, Vec b, Vec c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline Vec vcanon(Vec a) {
    __mmask16 nan = _mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q);
    return {_mm512_mask_blend_ps(nan, a.v, _mm512_castsi512_ps(_mm512_set1_epi32((int)RP_CANONICAL_NAN)))};
}
// rp_max / rp_min on 16 lanes: hardware max/min, then the -0/+0 tie rule, then NaN.
template <bool IS_MAX>
inline Vec vextreme_spec(Vec a, Vec b) {
    const __mmask16 unord = _mm512_cmp_ps_mask(a.v, b.v, _CMP_UNORD_Q);
    const __mmask16 eq = _mm512_cmp_ps_mask(a.v, b.v, _CMP_EQ_OQ);
    const __m512i ai = _mm512_castps_si512(a.v), bi = _mm512_castps_si512(b.v);
    const __m512 tie = _mm512_castsi512_ps(IS_MAX ? _mm512_and_si512(ai, bi) : _mm512_or_si512(ai, bi));
    const __m512 r = _mm512_mask_blend_ps(eq, IS_MAX ? _mm512_max_ps(a.v, b.v) : _mm512_min_ps(a.v, b.v), tie);
    return {_mm512_mask_blend_ps(unord, r, _mm512_castsi512_ps(_mm512_set1_epi32((int)RP_CANONICAL_NAN)))};
}
constexpr int GEMM_MR = 12;
constexpr int GEMM_NV = 2;  // 12 x 32 tile: 24 zmm accumulators

#elif REPOPS_ISA == 1
constexpr const char* ISA_NAME = "avx2";
constexpr int W = 8;
struct Vec {
    __m256 v;
};
inline Vec vload(const float* p) { return {_mm256_loadu_ps(p)}; }
inline void vstore(float* p, Vec a) { _mm256_storeu_ps(p, a.v); }
inline Vec vbcast(float x) { return {_mm256_set1_ps(x)}; }
inline Vec vmul(Vec a, Vec b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline Vec vadd(Vec a, Vec b) { return {_mm256_add_ps(a.v, b.v)}; }
inline Vec vsub(Vec a, Vec b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline Vec vdiv(Vec a, Vec b) { return {_mm256_div_ps(a.v, b.v)}; }
inline Vec vfma(Vec a, Vec b, Vec c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline Vec vcanon(Vec a) { return {y_canon(a.v)}; }
template <bool IS_MAX>
inline Vec vextreme_spec(Vec a, Vec b) {
    return {y_extreme_spec<IS_MAX>(a.v, b.v)};
}
constexpr int GEMM_MR = 6;
constexpr int GEMM_NV = 2;  // 6 x 16 tile: 12 ymm accumulators

#else
constexpr const char* ISA_NAME = "scalar";
constexpr int W = 1;
struct Vec {
    float v;
};
inline Vec vload(const float* p) { return {*p}; }
inline void vstore(float* p, Vec a) { *p = a.v; }
inline Vec vbcast(float x) { return {x}; }
inline Vec vmul(Vec a, Vec b) { return {a.v * b.v}; }
inline Vec vadd(Vec a, Vec b) { return {a.v + b.v}; }
inline Vec vsub(Vec a, Vec b) { return {a.v - b.v}; }
inline Vec vdiv(Vec a, Vec b) { return {a.v / b.v}; }
inline Vec vfma(Vec a, Vec b, Vec c) { return {std::fma(a.v, b.v, c.v)}; }
inline Vec vcanon(Vec a) { return {canon(a.v)}; }
template <bool IS_MAX>
inline Vec vextreme_spec(Vec a, Vec b) {
    return {IS_MAX ? max_spec(a.v, b.v) : min_spec(a.v, b.v)};
}
constexpr int GEMM_MR = 4;
constexpr int GEMM_NV = 4;  // 4 x 4 tile of scalars
#endif

constexpr int GEMM_NR = GEMM_NV * W;
inline Vec vmax_spec(Vec a, Vec b) { return vextreme_spec<true>(a, b); }
inline Vec vmin_spec(Vec a, Vec b) { return vextreme_spec<false>(a, b); }

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
inline int64_t ceil_div(int64_t x, int64_t m) { return (x + m - 1) / m; }

}  // namespace repops_cpu
