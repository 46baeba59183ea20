// SPDX-License-Identifier: MIT
//
// repops_cpu.cpp — RepOps CPU kernels (GEMM, reductions, elementwise, and a generic interpreter
// of KernelDesc programs) with one fixed order.
//
// Built three times from this one source (see verde_chain/repops/cpu_kernels.py):
//   REPOPS_ISA=0  scalar   (no ISA flags; fmaf from libm, correctly rounded)
//   REPOPS_ISA=1  AVX2     (-mavx2 -mfma;   _mm256_fmadd_ps rounds once, like fmaf)
//   REPOPS_ISA=2  AVX-512  (-mavx512f;      _mm512_fmadd_ps rounds once, like fmaf)
// always with -O3 -ffp-contract=off -fno-fast-math, so the compiler never fuses a*b+c on its
// own. All three variants produce the same bits: vector lanes only ever hold DIFFERENT output
// elements, never partial sums of one element.
//
// Canonical orders (the spec; the operator library verde_chain/repops/library/ must agree):
//   dot product   acc = a[0]*b[0]                (one rounded multiply)
//                 acc = fma(a[k], b[k], acc)     k = 1 .. K-1 ascending; K == 0 gives +0
//   sum           acc = x[0]; acc = acc + x[k]   k = 1 .. K-1 ascending
//   max / min     acc = x[0]; acc = max(acc, x[k]); NaN if either is NaN, max(-0,+0) = +0,
//                 min(-0,+0) = -0
//   mean          sum / (float)K
//   add/sub/mul/div  plain IEEE binary32, round to nearest even; max/min as above
// Every NaN result is replaced by the canonical quiet NaN 0x7FC00000. Subnormals are honoured:
// every thread that computes clears FTZ/DAZ and selects round-to-nearest in MXCSR.
//
// GEMM structure (GotoBLAS/BLIS-like, but never splitting K across threads):
//
//   for each (batch b, column block of nc)           <- threads take these, or (one big matrix)
//     for p0 in 0, kc, 2kc, ...  (K blocks, ascending; acc carried through C in fp32)
//       pack B[p0:p0+kc, cols] into NR-wide panels        [k][NR]
//       for each mc row block:                           <- ... threads take these instead
//         pack A rows into MR-tall panels                 [k][MR]
//         for each NR panel, for each MR panel: micro-kernel MR x NR, k ascending
//
// Carrying the accumulator through memory between K blocks stores it exactly (fp32), so the
// chain for one output element is the same uninterrupted fma sequence whatever mc/kc/nc and
// the thread count are. Only output tiles are distributed. Small GEMMs (N <= 128 and
// M*N*K <= 2^18 per batch entry) skip the tiles: see gemm_small.

#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

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
#error "repops_cpu.cpp must not be built with -ffast-math"
#endif

namespace {

constexpr uint32_t CANONICAL_NAN_BITS = 0x7FC00000u;

inline float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline uint32_t to_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float canon(float x) { return x != x ? from_bits(CANONICAL_NAN_BITS) : x; }

// Spec max/min: NaN if either operand is NaN; among equal values (incl. -0 == +0) the sign
// bits are ANDed for max (+0 wins) and ORed for min (-0 wins).
template <bool IS_MAX>
inline float extreme_spec(float a, float b) {
    if (a != a || b != b) return from_bits(CANONICAL_NAN_BITS);
    if (a == b) return from_bits(IS_MAX ? (to_bits(a) & to_bits(b)) : (to_bits(a) | to_bits(b)));
    return (IS_MAX ? a > b : a < b) ? a : b;
}
inline float max_spec(float a, float b) { return extreme_spec<true>(a, b); }
inline float min_spec(float a, float b) { return extreme_spec<false>(a, b); }

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
inline __m256 y_canonical_nan() { return _mm256_castsi256_ps(_mm256_set1_epi32((int)CANONICAL_NAN_BITS)); }

// Spec max/min on 8 lanes (see extreme_spec). Shared by the AVX2 Vec and the rows-to-lanes
// reductions, which AVX-512 builds run on ymm registers too.
template <bool IS_MAX>
inline __m256 y_extreme_spec(__m256 a, __m256 b) {
    const __m256 unord = _mm256_cmp_ps(a, b, _CMP_UNORD_Q);
    const __m256 eq = _mm256_cmp_ps(a, b, _CMP_EQ_OQ);
    const __m256 r = IS_MAX ? _mm256_blendv_ps(_mm256_max_ps(a, b), _mm256_and_ps(a, b), eq)
                            : _mm256_blendv_ps(_mm256_min_ps(a, b), _mm256_or_ps(a, b), eq);
    return _mm256_blendv_ps(r, y_canonical_nan(), unord);
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
    return {_mm512_mask_blend_ps(nan, a.v, _mm512_castsi512_ps(_mm512_set1_epi32((int)CANONICAL_NAN_BITS)))};
}
// Spec max/min on 16 lanes (see extreme_spec): hardware max/min, then the -0/+0 tie rule, then NaN.
template <bool IS_MAX>
inline Vec vextreme_spec(Vec a, Vec b) {
    const __mmask16 unord = _mm512_cmp_ps_mask(a.v, b.v, _CMP_UNORD_Q);
    const __mmask16 eq = _mm512_cmp_ps_mask(a.v, b.v, _CMP_EQ_OQ);
    const __m512i ai = _mm512_castps_si512(a.v), bi = _mm512_castps_si512(b.v);
    const __m512 tie = _mm512_castsi512_ps(IS_MAX ? _mm512_and_si512(ai, bi) : _mm512_or_si512(ai, bi));
    const __m512 r = _mm512_mask_blend_ps(eq, IS_MAX ? _mm512_max_ps(a.v, b.v) : _mm512_min_ps(a.v, b.v), tie);
    return {_mm512_mask_blend_ps(unord, r, _mm512_castsi512_ps(_mm512_set1_epi32((int)CANONICAL_NAN_BITS)))};
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
inline Vec vcanon(Vec a) {
    __m256 nan = _mm256_cmp_ps(a.v, a.v, _CMP_UNORD_Q);
    return {_mm256_blendv_ps(a.v, _mm256_castsi256_ps(_mm256_set1_epi32((int)CANONICAL_NAN_BITS)), nan)};
}
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
    return {extreme_spec<IS_MAX>(a.v, b.v)};
}
constexpr int GEMM_MR = 4;
constexpr int GEMM_NV = 4;  // 4 x 4 tile of scalars
#endif

constexpr int GEMM_NR = GEMM_NV * W;
inline Vec vmax_spec(Vec a, Vec b) { return vextreme_spec<true>(a, b); }
inline Vec vmin_spec(Vec a, Vec b) { return vextreme_spec<false>(a, b); }

// ----------------------------------------------------------------------------------------
// Threads: items are independent output blocks, claimed from a shared counter by `threads`
// virtual workers that run on torch's persistent intra-op pool (at::parallel_for), so the
// real parallelism is min(threads, torch.get_num_threads()). Which worker computes an item
// never changes its bits; dynamic claiming keeps a late thread (busy machine) from holding
// everyone up, and the persistent pool avoids a thread start per call.
// ----------------------------------------------------------------------------------------

template <class F>
void parallel_items(int64_t n_items, int64_t threads, F&& fn) {
    threads = std::max<int64_t>(1, std::min<int64_t>(threads, n_items));
    std::atomic<int64_t> next{0};
    auto worker = [&](int64_t t) {
        FpEnvGuard guard;
        for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n_items;
             i = next.fetch_add(1, std::memory_order_relaxed))
            fn(i, t);
    };
    if (threads == 1) {
        worker(0);
        return;
    }
    at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; t++) worker(t);
    });
}

// ----------------------------------------------------------------------------------------
// GEMM
// ----------------------------------------------------------------------------------------

struct GemmArgs {
    const float* A;
    int64_t sab, sai, sak;  // a(b, i, k) = A[b*sab + i*sai + k*sak]
    const float* B;
    int64_t sbb, sbk, sbj;  // b(b, k, j) = B[b*sbb + k*sbk + j*sbj]
    float* C;               // contiguous (batch, M, N)
    int64_t batch, M, N, K;
    // Optional per-batch element offsets (batch dims that do not collapse to one stride, e.g.
    // a transposed (B, H) pair): a(b, ...) starts at A[aoff[b]] instead of A[b*sab].
    const int64_t* aoff = nullptr;
    const int64_t* boff = nullptr;
    const float* a_at(int64_t bi) const { return A + (aoff ? aoff[bi] : bi * sab); }
    const float* b_at(int64_t bi) const { return B + (boff ? boff[bi] : bi * sbb); }
};

// Packs rows [i0, i0+rows) x k [p0, p0+kc) into MR-tall panels, layout [panel][k][MR],
// zero-filling rows past `rows` (their outputs are discarded).
void pack_a(const float* A, int64_t sai, int64_t sak, int64_t i0, int64_t rows, int64_t p0, int64_t kc,
            float* out) {
    for (int64_t ip = 0; ip < rows; ip += GEMM_MR) {
        float* o = out + ip * kc;
        int64_t r_valid = std::min<int64_t>(GEMM_MR, rows - ip);
        if (sai == 1 && sak != 1) {
            // A transposed (x^T @ g, the weight gradient): rows are contiguous, walk them inner.
            for (int64_t k = 0; k < kc; k++) {
                const float* src = A + (i0 + ip) + (p0 + k) * sak;
                int64_t r = 0;
                for (; r < r_valid; r++) o[k * GEMM_MR + r] = src[r];
                for (; r < GEMM_MR; r++) o[k * GEMM_MR + r] = 0.0f;
            }
            continue;
        }
        for (int64_t r = 0; r < GEMM_MR; r++) {
            if (r < r_valid) {
                const float* src = A + (i0 + ip + r) * sai + p0 * sak;
                for (int64_t k = 0; k < kc; k++) o[k * GEMM_MR + r] = src[k * sak];
            } else {
                for (int64_t k = 0; k < kc; k++) o[k * GEMM_MR + r] = 0.0f;
            }
        }
    }
}

// Packs k [p0, p0+kc) x columns [j0, j0+cols) into NR-wide panels, layout [panel][k][NR].
void pack_b(const float* B, int64_t sbk, int64_t sbj, int64_t j0, int64_t cols, int64_t p0, int64_t kc,
            float* out) {
    for (int64_t jp = 0; jp < cols; jp += GEMM_NR) {
        float* o = out + jp * kc;
        int64_t c_valid = std::min<int64_t>(GEMM_NR, cols - jp);
        if (sbj == 1) {
            for (int64_t k = 0; k < kc; k++) {
                const float* src = B + (p0 + k) * sbk + j0 + jp;
                int64_t c = 0;
                for (; c < c_valid; c++) o[k * GEMM_NR + c] = src[c];
                for (; c < GEMM_NR; c++) o[k * GEMM_NR + c] = 0.0f;
            }
        } else {
            for (int64_t c = 0; c < GEMM_NR; c++) {
                if (c < c_valid) {
                    const float* src = B + p0 * sbk + (j0 + jp + c) * sbj;
                    for (int64_t k = 0; k < kc; k++) o[k * GEMM_NR + c] = src[k * sbk];
                } else {
                    for (int64_t k = 0; k < kc; k++) o[k * GEMM_NR + c] = 0.0f;
                }
            }
        }
    }
}

// One MR x NR tile over kc steps of k. `first`: this block starts at k = 0, so the chain opens
// with one rounded multiply; otherwise the accumulators resume from C. `last`: canonicalise
// NaN before the final store.
void micro_kernel(int64_t kc, const float* __restrict Ap, const float* __restrict Bp, float* C, int64_t ldc,
                  bool first, bool last, int64_t mr, int64_t nr) {
    Vec acc[GEMM_MR][GEMM_NV];
    alignas(64) float tile[GEMM_MR * GEMM_NR];
    const bool full = mr == GEMM_MR && nr == GEMM_NR;
    float* Cw = full ? C : tile;
    const int64_t ld = full ? ldc : GEMM_NR;
    if (!full) {
        std::memset(tile, 0, sizeof tile);
        if (!first)
            for (int64_t i = 0; i < mr; i++)
                for (int64_t j = 0; j < nr; j++) tile[i * GEMM_NR + j] = C[i * ldc + j];
    }
    int64_t k = 0;
    if (first) {
        Vec b[GEMM_NV];
#pragma GCC unroll 8
        for (int j = 0; j < GEMM_NV; j++) b[j] = vload(Bp + j * W);
#pragma GCC unroll 16
        for (int i = 0; i < GEMM_MR; i++) {
            Vec a = vbcast(Ap[i]);
#pragma GCC unroll 8
            for (int j = 0; j < GEMM_NV; j++) acc[i][j] = vmul(a, b[j]);
        }
        k = 1;
    } else {
#pragma GCC unroll 16
        for (int i = 0; i < GEMM_MR; i++)
#pragma GCC unroll 8
            for (int j = 0; j < GEMM_NV; j++) acc[i][j] = vload(Cw + i * ld + j * W);
    }
    for (; k < kc; k++) {
        const float* bk = Bp + k * GEMM_NR;
        const float* ak = Ap + k * GEMM_MR;
        Vec b[GEMM_NV];
#pragma GCC unroll 8
        for (int j = 0; j < GEMM_NV; j++) b[j] = vload(bk + j * W);
#pragma GCC unroll 16
        for (int i = 0; i < GEMM_MR; i++) {
            Vec a = vbcast(ak[i]);
#pragma GCC unroll 8
            for (int j = 0; j < GEMM_NV; j++) acc[i][j] = vfma(a, b[j], acc[i][j]);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < GEMM_MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < GEMM_NV; j++) vstore(Cw + i * ld + j * W, last ? vcanon(acc[i][j]) : acc[i][j]);
    if (!full)
        for (int64_t i = 0; i < mr; i++)
            for (int64_t j = 0; j < nr; j++) C[i * ldc + j] = tile[i * GEMM_NR + j];
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
int64_t ceil_div(int64_t x, int64_t m) { return (x + m - 1) / m; }

// Rows [i_begin, i_end) of one output column block [j0, j0+cols) for one K block, given the
// packed B block: pack each mc x kcur block of A and run the micro-kernels over it.
void compute_rows(const GemmArgs& g, const float* A, float* C, const float* bpack, int64_t i_begin, int64_t i_end,
                  int64_t j0, int64_t cols, int64_t p0, int64_t kcur, int64_t mc, std::vector<float>& abuf) {
    const bool first = p0 == 0, last = p0 + kcur == g.K;
    abuf.resize(round_up(mc, GEMM_MR) * kcur);
    for (int64_t i0 = i_begin; i0 < i_end; i0 += mc) {
        const int64_t rows = std::min(mc, i_end - i0);
        pack_a(A, g.sai, g.sak, i0, rows, p0, kcur, abuf.data());
        for (int64_t jr = 0; jr < cols; jr += GEMM_NR)
            for (int64_t ir = 0; ir < rows; ir += GEMM_MR)
                micro_kernel(kcur, abuf.data() + ir * kcur, bpack + jr * kcur, C + (i0 + ir) * g.N + j0 + jr, g.N,
                             first, last, std::min<int64_t>(GEMM_MR, rows - ir), std::min<int64_t>(GEMM_NR, cols - jr));
    }
}

// Two ways to hand out output blocks, chosen by shape; both give the same bits.
//  * Many (batch, column block) pairs: each thread takes whole pairs and packs its own B block.
//  * Few of them (one big matrix): for each column block and K block, the threads first pack
//    the B block together (one NR panel per item), then take mc-row blocks of the output
//    against the shared packed B. Packing B once per block, not once per thread, matters: with
//    per-thread packing, narrow blocks made packing cost more than the FMAs.
// Small GEMMs (a transformer block's 16-64-wide matrices): the blocked path's 12x32 tiles and
// packing cost more than the FMAs there. Rows are computed directly instead: B packed once per
// batch as [K][Np] (Np = N rounded up to W lanes, zero-padded), then for ROWS output rows at a
// time and W columns per vector, acc = a[i,0] * b[0,j] (one rounded multiply) and
// acc = fma(a[i,k], b[k,j], acc) for k = 1 .. K-1 ascending: the same chain per element.
constexpr int64_t SMALL_GEMM_MAX_N = 128;
constexpr int64_t SMALL_GEMM_MAX_WORK = 1 << 18;  // M*N*K of one batch entry

template <int ROWS>
inline void small_gemm_rows(const GemmArgs& g, const float* A, const float* bp, int64_t Np, float* C, int64_t i0) {
    for (int64_t j0 = 0; j0 < Np; j0 += W) {
        Vec acc[ROWS];
        const Vec b0 = vload(bp + j0);
        for (int r = 0; r < ROWS; r++) acc[r] = vmul(vbcast(A[(i0 + r) * g.sai]), b0);
        for (int64_t k = 1; k < g.K; k++) {
            const Vec bk = vload(bp + k * Np + j0);
            for (int r = 0; r < ROWS; r++) acc[r] = vfma(vbcast(A[(i0 + r) * g.sai + k * g.sak]), bk, acc[r]);
        }
        const int64_t cols = std::min<int64_t>(W, g.N - j0);
        for (int r = 0; r < ROWS; r++) {
            float* c = C + (i0 + r) * g.N + j0;
            if (cols == W) {
                vstore(c, vcanon(acc[r]));
            } else {
                alignas(64) float tmp[W];
                vstore(tmp, vcanon(acc[r]));
                std::memcpy(c, tmp, sizeof(float) * cols);
            }
        }
    }
}

void gemm_small(const GemmArgs& g, int64_t threads) {
    const int64_t Np = round_up(g.N, W);
    parallel_items(g.batch, threads, [&](int64_t bi, int64_t) {
        thread_local std::vector<float> bpack;
        bpack.assign(g.K * Np, 0.0f);
        const float* A = g.a_at(bi);
        const float* B = g.b_at(bi);
        float* C = g.C + bi * g.M * g.N;
        for (int64_t k = 0; k < g.K; k++)
            for (int64_t j = 0; j < g.N; j++) bpack[k * Np + j] = B[k * g.sbk + j * g.sbj];
        int64_t i = 0;
        for (; i + 4 <= g.M; i += 4) small_gemm_rows<4>(g, A, bpack.data(), Np, C, i);
        for (; i < g.M; i++) small_gemm_rows<1>(g, A, bpack.data(), Np, C, i);
    });
}

void gemm(const GemmArgs& g, int64_t threads, int64_t mc, int64_t kc, int64_t nc) {
    // Below ~2^20 FMAs (a few microseconds) waking a second thread costs more than it saves.
    if ((double)g.batch * (double)g.M * (double)g.N * (double)g.K < (double)(1 << 20)) threads = 1;
    if (g.N <= SMALL_GEMM_MAX_N && g.M * g.N * g.K <= SMALL_GEMM_MAX_WORK) {
        gemm_small(g, threads);
        return;
    }
    const int64_t n_nblocks = ceil_div(g.N, nc);
    const int64_t n_pairs = g.batch * n_nblocks;
    if (threads <= 1 || n_pairs >= 2 * threads) {
        threads = std::max<int64_t>(1, std::min(threads, n_pairs));
        std::vector<std::vector<float>> abuf(threads), bbuf(threads);
        parallel_items(n_pairs, threads, [&](int64_t item, int64_t t) {
            const int64_t bi = item / n_nblocks;
            const int64_t j0 = (item % n_nblocks) * nc, cols = std::min(nc, g.N - j0);
            const float* A = g.a_at(bi);
            const float* B = g.b_at(bi);
            float* C = g.C + bi * g.M * g.N;
            bbuf[t].resize(round_up(nc, GEMM_NR) * kc);
            for (int64_t p0 = 0; p0 < g.K; p0 += kc) {
                const int64_t kcur = std::min(kc, g.K - p0);
                pack_b(B, g.sbk, g.sbj, j0, cols, p0, kcur, bbuf[t].data());
                compute_rows(g, A, C, bbuf[t].data(), 0, g.M, j0, cols, p0, kcur, mc, abuf[t]);
            }
        });
        return;
    }
    // Row blocks small enough that every thread gets about two of them.
    const int64_t mc_eff = std::min(mc, std::max<int64_t>(GEMM_MR, round_up(ceil_div(g.M, 2 * threads), GEMM_MR)));
    const int64_t n_iblocks = ceil_div(g.M, mc_eff);
    std::vector<float> bpack(round_up(nc, GEMM_NR) * kc);
    std::vector<std::vector<float>> abuf(threads);
    for (int64_t bi = 0; bi < g.batch; bi++) {
        const float* A = g.a_at(bi);
        const float* B = g.b_at(bi);
        float* C = g.C + bi * g.M * g.N;
        for (int64_t j0 = 0; j0 < g.N; j0 += nc) {
            const int64_t cols = std::min(nc, g.N - j0);
            for (int64_t p0 = 0; p0 < g.K; p0 += kc) {
                const int64_t kcur = std::min(kc, g.K - p0);
                parallel_items(ceil_div(cols, GEMM_NR), threads, [&](int64_t panel, int64_t) {
                    const int64_t jp = panel * GEMM_NR;
                    pack_b(B, g.sbk, g.sbj, j0 + jp, std::min<int64_t>(GEMM_NR, cols - jp), p0, kcur,
                           bpack.data() + jp * kcur);
                });
                parallel_items(n_iblocks, threads, [&](int64_t ib, int64_t t) {
                    const int64_t i0 = ib * mc_eff;
                    compute_rows(g, A, C, bpack.data(), i0, std::min(g.M, i0 + mc_eff), j0, cols, p0, kcur, mc_eff,
                                 abuf[t]);
                });
            }
        }
    }
}

void check_f32_cpu(const torch::Tensor& t, const char* what) {
    TORCH_CHECK(t.device().is_cpu(), what, " must be a CPU tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, what, " must be float32, got ", t.scalar_type());
}

// a: (batch, M, K), b: (batch, K, N), any strides (stride 0 for broadcast batches).
// tile = (mc, kc, nc): cache blocking; any values give the same bits.
torch::Tensor matmul3(const torch::Tensor& a, const torch::Tensor& b, int64_t threads, int64_t mc, int64_t kc,
                      int64_t nc) {
    check_f32_cpu(a, "a");
    check_f32_cpu(b, "b");
    TORCH_CHECK(a.dim() == 3 && b.dim() == 3, "matmul3 takes 3-D tensors");
    TORCH_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1), "shape mismatch ", a.sizes(), " @ ", b.sizes());
    TORCH_CHECK(mc > 0 && kc > 0 && nc > 0, "tile sizes must be positive");
    GemmArgs g{a.data_ptr<float>(), a.stride(0), a.stride(1), a.stride(2),
               b.data_ptr<float>(), b.stride(0), b.stride(1), b.stride(2),
               nullptr, a.size(0), a.size(1), b.size(2), a.size(2)};
    // K == 0: the empty dot product is +0 (zeros() below).
    torch::Tensor c = torch::zeros({g.batch, g.M, g.N}, a.options().memory_format(torch::MemoryFormat::Contiguous));
    if (g.batch == 0 || g.M == 0 || g.N == 0 || g.K == 0) return c;
    g.C = c.data_ptr<float>();
    // Tiles are rounded to whole micro-panels so panels never straddle blocks.
    mc = round_up(mc, GEMM_MR);
    nc = round_up(nc, GEMM_NR);
    gemm(g, threads, mc, kc, nc);
    return c;
}

// ----------------------------------------------------------------------------------------
// Reductions over the last axis of a strided (R, K) view: out[r] = fold over k ascending.
// ----------------------------------------------------------------------------------------

enum ReduceOp : int64_t { RED_SUM = 0, RED_MAX = 1, RED_MEAN = 2, RED_MIN = 3 };

inline float reduce_step(int64_t op, float acc, float x) {
    return op == RED_MAX ? max_spec(acc, x) : op == RED_MIN ? min_spec(acc, x) : acc + x;
}
inline Vec vreduce_step(int64_t op, Vec acc, Vec x) {
    return op == RED_MAX ? vmax_spec(acc, x) : op == RED_MIN ? vmin_spec(acc, x) : vadd(acc, x);
}

#if REPOPS_X86 && defined(__AVX2__)
// Rows-to-lanes path for reductions along a unit-stride axis (the common "reduce the last
// dimension" case): 8 rows at a time, each 8x8 block of x transposed in registers so that lane
// i carries row i's chain; the k order per row is unchanged. Used by the AVX2 and AVX-512
// builds (AVX-512 machines run it on ymm registers).
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

template <int OP>
inline __m256 y_step(__m256 acc, __m256 x) {
    if (OP == 0 || OP == 2) return _mm256_add_ps(acc, x);  // sum, mean
    return y_extreme_spec<OP == 1>(acc, x);
}

// Rows r .. r+8G-1 (row stride sr, unit k stride), K >= 1; writes O[r .. r+8G-1]. G groups of
// 8 rows run interleaved so that G independent chains hide the add/compare latency.
template <int OP, int G>
void reduce_rows8(const float* X, int64_t sr, int64_t K, float kf, float* O) {
    __m256 acc[G];
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 blk[G][8];
        for (int g = 0; g < G; g++) {
            for (int i = 0; i < 8; i++) blk[g][i] = _mm256_loadu_ps(X + (8 * g + i) * sr + k);
            transpose8(blk[g]);  // blk[g][j] lane i = x[r + 8g + i][k + j]
        }
        for (int j = 0; j < 8; j++)
            for (int g = 0; g < G; g++) acc[g] = (k == 0 && j == 0) ? blk[g][0] : y_step<OP>(acc[g], blk[g][j]);
    }
    for (; k < K; k++) {
        for (int g = 0; g < G; g++) {
            const float* x = X + 8 * g * sr + k;
            const __m256 col =
                _mm256_setr_ps(x[0], x[sr], x[2 * sr], x[3 * sr], x[4 * sr], x[5 * sr], x[6 * sr], x[7 * sr]);
            acc[g] = k == 0 ? col : y_step<OP>(acc[g], col);
        }
    }
    for (int g = 0; g < G; g++) {
        __m256 v = OP == 2 ? _mm256_div_ps(acc[g], _mm256_set1_ps(kf)) : acc[g];
        const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
        _mm256_storeu_ps(O + 8 * g, _mm256_blendv_ps(v, y_canonical_nan(), nan));
    }
}

template <int OP>
void reduce_rows_unit_k(const float* X, int64_t sr, int64_t K, float kf, float* O, int64_t& r, int64_t r1) {
    for (; r + 32 <= r1; r += 32) reduce_rows8<OP, 4>(X + r * sr, sr, K, kf, O + r);
    for (; r + 8 <= r1; r += 8) reduce_rows8<OP, 1>(X + r * sr, sr, K, kf, O + r);
}
#define REPOPS_HAVE_ROWS8 1
#endif

// out[r] = fold_k X[r*sr + k*sk], r < R, K >= 1 (the caller checked the addresses).
void reduce_into(const float* X, int64_t R, int64_t K, int64_t sr, int64_t sk, int64_t op, float* O,
                 int64_t threads) {
    const float kf = (float)K;  // mean divides by K rounded to binary32 once
    constexpr int64_t CHUNK = 4096;
    const int64_t n_items = ceil_div(R, CHUNK);
    if (R * K < (1 << 16)) threads = 1;  // thread start-up would dominate
    parallel_items(n_items, threads, [&](int64_t item, int64_t) {
        const int64_t r0 = item * CHUNK, r1 = std::min(R, r0 + CHUNK);
        int64_t r = r0;
        if (sr == 1) {
            // Output elements are adjacent in memory: one lane per output, k sequential.
            for (; r + 4 * W <= r1; r += 4 * W) {
                Vec acc[4];
                for (int u = 0; u < 4; u++) acc[u] = vload(X + r + u * W);
                for (int64_t k = 1; k < K; k++)
                    for (int u = 0; u < 4; u++) acc[u] = vreduce_step(op, acc[u], vload(X + r + u * W + k * sk));
                for (int u = 0; u < 4; u++) {
                    if (op == RED_MEAN) acc[u] = vdiv(acc[u], vbcast(kf));
                    vstore(O + r + u * W, vcanon(acc[u]));
                }
            }
        }
#ifdef REPOPS_HAVE_ROWS8
        if (sk == 1) {
            switch (op) {
                case RED_SUM: reduce_rows_unit_k<RED_SUM>(X, sr, K, kf, O, r, r1); break;
                case RED_MAX: reduce_rows_unit_k<RED_MAX>(X, sr, K, kf, O, r, r1); break;
                case RED_MEAN: reduce_rows_unit_k<RED_MEAN>(X, sr, K, kf, O, r, r1); break;
                default: reduce_rows_unit_k<RED_MIN>(X, sr, K, kf, O, r, r1); break;
            }
        }
#endif
        // Remaining rows: four independent scalar chains at a time for latency hiding.
        for (; r + 4 <= r1; r += 4) {
            float acc[4];
            for (int u = 0; u < 4; u++) acc[u] = X[(r + u) * sr];
            for (int64_t k = 1; k < K; k++)
                for (int u = 0; u < 4; u++) acc[u] = reduce_step(op, acc[u], X[(r + u) * sr + k * sk]);
            for (int u = 0; u < 4; u++) O[r + u] = canon(op == RED_MEAN ? acc[u] / kf : acc[u]);
        }
        for (; r < r1; r++) {
            float acc = X[r * sr];
            for (int64_t k = 1; k < K; k++) acc = reduce_step(op, acc, X[r * sr + k * sk]);
            O[r] = canon(op == RED_MEAN ? acc / kf : acc);
        }
    });
}

torch::Tensor reduce_last(const torch::Tensor& x, int64_t op, int64_t threads) {
    check_f32_cpu(x, "x");
    TORCH_CHECK(x.dim() == 2, "reduce_last takes a 2-D (rows, K) view");
    TORCH_CHECK(op >= RED_SUM && op <= RED_MIN, "unknown reduce op ", op);
    const int64_t R = x.size(0), K = x.size(1);
    TORCH_CHECK(K > 0, "reduction over an empty axis");
    torch::Tensor out = torch::empty({R}, x.options());
    if (R == 0) return out;
    reduce_into(x.data_ptr<float>(), R, K, x.stride(0), x.stride(1), op, out.data_ptr<float>(), threads);
    return out;
}

// ----------------------------------------------------------------------------------------
// Elementwise binary ops on equal-shaped contiguous tensors (Python broadcasts first).
// ----------------------------------------------------------------------------------------

enum BinOp : int64_t { BIN_ADD = 0, BIN_SUB = 1, BIN_MUL = 2, BIN_DIV = 3, BIN_MAX = 4, BIN_MIN = 5 };

inline Vec vbinary(int64_t op, Vec a, Vec b) {
    switch (op) {
        case BIN_ADD: return vadd(a, b);
        case BIN_SUB: return vsub(a, b);
        case BIN_MUL: return vmul(a, b);
        case BIN_DIV: return vdiv(a, b);
        case BIN_MAX: return vmax_spec(a, b);
        default: return vmin_spec(a, b);
    }
}

inline float sbinary(int64_t op, float x, float y) {
    switch (op) {
        case BIN_ADD: return x + y;
        case BIN_SUB: return x - y;
        case BIN_MUL: return x * y;
        case BIN_DIV: return x / y;
        case BIN_MAX: return max_spec(x, y);
        default: return min_spec(x, y);
    }
}

void binary_into(const float* A, const float* B, float* O, int64_t n, int64_t op, int64_t threads) {
    constexpr int64_t CHUNK = 1 << 14;
    if (n < (1 << 17)) threads = 1;
    parallel_items(ceil_div(n, CHUNK), threads, [&](int64_t item, int64_t) {
        const int64_t i0 = item * CHUNK, i1 = std::min(n, i0 + CHUNK);
        int64_t i = i0;
        for (; i + W <= i1; i += W) vstore(O + i, vcanon(vbinary(op, vload(A + i), vload(B + i))));
        for (; i < i1; i++) O[i] = canon(sbinary(op, A[i], B[i]));
    });
}

torch::Tensor binary(const torch::Tensor& a, const torch::Tensor& b, int64_t op, int64_t threads) {
    check_f32_cpu(a, "a");
    check_f32_cpu(b, "b");
    TORCH_CHECK(a.sizes() == b.sizes(), "binary takes equal shapes (broadcast first)");
    TORCH_CHECK(a.is_contiguous() && b.is_contiguous(), "binary takes contiguous tensors");
    TORCH_CHECK(op >= BIN_ADD && op <= BIN_MIN, "unknown binary op ", op);
    torch::Tensor out = torch::empty_like(a, a.options().memory_format(torch::MemoryFormat::Contiguous));
    binary_into(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), a.numel(), op, threads);
    return out;
}

// ----------------------------------------------------------------------------------------
// Scatter-add (embedding backward, spec.scatter_add): out[v, d] = the spec's chain over p = 0..P-1
//   acc = idx[0] == v ? g[0, d] : +0;  acc = acc + (idx[p] == v ? g[p, d] : +0)  for p ascending
// computed in O(P*R + V*R) instead of the interpreter's O(P*V*R), with the same bits:
// positions are bucketed by row (ascending p within a row); a row adds its matching g rows in
// order, and a run of one or more misses between (or after) them is one "+ +0", which only turns
// an accumulated -0 into +0 (x + +0 == x otherwise; NaN stays NaN and is canonicalised at the end).
// Row v matches p iff idx[p] == fl32(v) as binary32 EQ does: idx integral (-0 counts as 0) and in
// [0, V); the caller guarantees V <= 2^24, so fl32(v) == v for every row.
// ----------------------------------------------------------------------------------------

void scatter_rows_into(const float* G, const float* IDX, int64_t P, int64_t R, int64_t V, float* O, int64_t threads) {
    std::vector<int64_t> start(V + 1, 0), pos(P);
    std::vector<int64_t> row_of(P);
    for (int64_t p = 0; p < P; p++) {
        const float x = IDX[p];
        int64_t v = -1;
        if (x >= 0.0f && x < (float)V && std::floor(x) == x) v = (int64_t)x;
        row_of[p] = v;
        if (v >= 0) start[v + 1]++;
    }
    for (int64_t v = 0; v < V; v++) start[v + 1] += start[v];
    {
        std::vector<int64_t> fill(start.begin(), start.end() - 1);
        for (int64_t p = 0; p < P; p++)
            if (row_of[p] >= 0) pos[fill[row_of[p]]++] = p;  // ascending p within each row
    }
    constexpr int64_t ROWS_PER_ITEM = 16;
    if (P * R < (1 << 16)) threads = 1;
    parallel_items(ceil_div(V, ROWS_PER_ITEM), threads, [&](int64_t item, int64_t) {
        const int64_t v1 = std::min(V, (item + 1) * ROWS_PER_ITEM);
        for (int64_t v = item * ROWS_PER_ITEM; v < v1; v++) {
            float* o = O + v * R;
            const int64_t* ps = pos.data() + start[v];
            const int64_t m = start[v + 1] - start[v];
            // k = 0: the first term itself if p = 0 matches, else +0; then the later matches
            auto chain = [&](auto load, auto store, auto add, auto zero, int64_t d) {
                auto acc = (m > 0 && ps[0] == 0) ? load(0, d) : zero();
                int64_t last = 0;
                for (int64_t i = (m > 0 && ps[0] == 0) ? 1 : 0; i < m; i++) {
                    if (ps[i] > last + 1) acc = add(acc, zero());  // the misses in (last, p_i)
                    acc = add(acc, load(ps[i], d));
                    last = ps[i];
                }
                if (last < P - 1) acc = add(acc, zero());  // misses after the last match
                store(d, acc);
            };
            int64_t d = 0;
            for (; d + W <= R; d += W)
                chain([&](int64_t p, int64_t dd) { return vload(G + p * R + dd); },
                      [&](int64_t dd, Vec a) { vstore(o + dd, vcanon(a)); },
                      [](Vec a, Vec b) { return vadd(a, b); }, [] { return vbcast(0.0f); }, d);
            for (; d < R; d++)
                chain([&](int64_t p, int64_t dd) { return G[p * R + dd]; },
                      [&](int64_t dd, float a) { o[dd] = canon(a); },
                      [](float a, float b) { return a + b; }, [] { return 0.0f; }, d);
        }
    });
}

torch::Tensor scatter_rows(const torch::Tensor& g, const torch::Tensor& idx, int64_t V, int64_t threads) {
    check_f32_cpu(g, "g");
    check_f32_cpu(idx, "idx");
    TORCH_CHECK(g.dim() == 2 && idx.dim() == 1 && g.size(0) == idx.size(0) && g.size(0) >= 1,
                "scatter_rows takes g (P, R) and idx (P,)");
    TORCH_CHECK(g.is_contiguous() && idx.is_contiguous(), "scatter_rows takes contiguous tensors");
    TORCH_CHECK(V >= 1 && V <= (1 << 24), "scatter_rows needs 1 <= V <= 2^24 rows");
    torch::Tensor out = torch::empty({V, g.size(1)}, g.options());
    scatter_rows_into(g.data_ptr<float>(), idx.data_ptr<float>(), g.size(0), g.size(1), V, out.data_ptr<float>(),
                      threads);
    return out;
}

// ----------------------------------------------------------------------------------------
// Generic KernelDesc interpreter: any RepOps scalar program (verde_chain/repops/program.py),
// run on blocks of BLOCK output elements. Registers are BLOCK-lane arrays of raw bit patterns;
// every instruction is one loop over the lanes (which the compiler vectorises), and the loop
// index k runs prologue (k = 0), body (k = 1 .. K-1 ascending), epilogue (k = K-1) exactly as
// the spec does. Lanes only ever hold different output elements, so ISA and thread count
// cannot change a bit. Instruction semantics follow verde_chain/repops/fp32.py.
// ----------------------------------------------------------------------------------------

constexpr int MAX_RANK = 6;
constexpr int NUM_REGS = 16;
constexpr int BLOCK = 256;
constexpr uint32_t ONE_BITS = 0x3F800000u;

enum Opcode : int32_t {
    OP_ADD = 0, OP_SUB, OP_MUL, OP_DIV, OP_FMA, OP_SQRT, OP_MAX, OP_MIN, OP_LT, OP_EQ, OP_SELECT, OP_RINT,
    OP_LDEXP, OP_GETEXP, OP_GETMANT, OP_NEG, OP_ABS, OP_CONST, OP_LOAD, OP_COORD, OP_LOADIDX, OP_MOV, OP_FLOOR,
    OP_COUNT
};

struct Instr {
    int32_t op, dst, a, b;
    uint32_t imm;  // c register for FMA/SELECT, else the immediate
};

struct InputMap {
    const uint32_t* data;
    int64_t numel, kstride, offset, idx_stride;
    int64_t strides[MAX_RANK];
    // Linear maps (address = offset + e * lstride for flat output element e: contiguous
    // inputs, lstride 1, and scalars broadcast everywhere, lstride 0) need no per-lane table.
    bool linear;
    int64_t lstride;
    int64_t last;  // the innermost output axis runs follow (see Lanes)
};

inline uint32_t canon_bits(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u ? CANONICAL_NAN_BITS : u; }

// LDEXP a, b (fp32.py): b must be integral; +-inf act as huge exponents; clamping |b| to 400
// keeps the binary64 product exact, so the one float conversion is the only rounding.
inline uint32_t ldexp_bits(uint32_t ua, uint32_t ub) {
    const double a = (double)from_bits(ua), b = (double)from_bits(ub);
    if (b != b) return CANONICAL_NAN_BITS;
    const bool finite_b = std::isfinite(b);
    if (finite_b && std::floor(b) != b) return CANONICAL_NAN_BITS;
    if (b == INFINITY && a == 0.0) return CANONICAL_NAN_BITS;
    if (b == -INFINITY && std::isinf(a)) return CANONICAL_NAN_BITS;
    const int e = (int)std::min(400.0, std::max(-400.0, b));
    return canon_bits(to_bits((float)std::ldexp(a, e)));
}

// GETEXP / GETMANT (fp32.py): exact exponent and significand of |a|; binary64 makes
// subnormals normal. 0 -> (-inf, 1), inf -> (+inf, 1), NaN -> NaN.
inline uint32_t getexp_bits(uint32_t ua) {
    const float a = from_bits(ua);
    if (a != a) return CANONICAL_NAN_BITS;
    if (a == 0.0f) return to_bits(-INFINITY);
    if (std::isinf(a)) return to_bits(INFINITY);
    int e;
    std::frexp(std::fabs((double)a), &e);
    return to_bits((float)(e - 1));
}
inline uint32_t getmant_bits(uint32_t ua) {
    const float a = from_bits(ua);
    if (a != a) return CANONICAL_NAN_BITS;
    if (a == 0.0f || std::isinf(a)) return ONE_BITS;
    int e;
    return to_bits((float)(2.0 * std::frexp(std::fabs((double)a), &e)));
}

// The address of LOADIDX, exact in 128 bits; nullopt-like -1 when not a finite integral index
// or outside [0, numel).
inline int64_t loadidx_address(const InputMap& m, int64_t base, uint32_t ureg) {
    const float x = from_bits(ureg);
    if (!std::isfinite(x) || std::floor(x) != x) return -1;
    // |index| > 2^100 times a non-zero stride is out of range anyway; the clamp keeps int128 exact.
    const double xd = std::min(std::ldexp(1.0, 100), std::max(-std::ldexp(1.0, 100), (double)x));
    const __int128 addr = (__int128)base + (__int128)xd * (__int128)m.idx_stride;
    return (addr < 0 || addr >= (__int128)m.numel) ? -1 : (int64_t)addr;
}

struct Lanes {
    int n = 0;
    alignas(64) uint32_t reg[NUM_REGS][BLOCK];
    alignas(64) uint32_t coord[MAX_RANK][BLOCK];  // coordinates as binary32 bits
    std::vector<int64_t> base;                      // [input][lane]: offset + sum c[d]*strides[d]
    std::vector<int64_t> base0;                     // [input]: lane 0's address (linear maps)
    // Runs along the innermost output axis (non-linear maps): lanes [start, start + len) read
    // run_base[input][run] + j * strides[last], j = 0 .. len-1 (before the k term).
    int n_runs = 0;
    int run_start[BLOCK], run_len[BLOCK];
    std::vector<int64_t> run_base;  // [input][run]
};

// Address of lane i of input t (before the k term).
inline int64_t lane_base(const InputMap& m, const Lanes& L, int64_t t, int i) {
    return m.linear ? L.base0[t] + i * m.lstride : L.base[t * BLOCK + i];
}

template <class F>
inline void lanes_unary(uint32_t* d, const uint32_t* a, int n, F f) {
    for (int i = 0; i < n; i++) d[i] = canon_bits(to_bits(f(from_bits(a[i]))));
}
template <class F>
inline void lanes_binary(uint32_t* d, const uint32_t* a, const uint32_t* b, int n, F f) {
    for (int i = 0; i < n; i++) d[i] = canon_bits(to_bits(f(from_bits(a[i]), from_bits(b[i]))));
}

void exec_instr(const Instr& in, int64_t k, const std::vector<InputMap>& maps, Lanes& L) {
    const int n = L.n;
    uint32_t* d = L.reg[in.dst];
    const uint32_t* a = L.reg[in.a];
    const uint32_t* b = L.reg[in.b];
    const uint32_t* c = L.reg[in.imm & (NUM_REGS - 1)];
    switch (in.op) {
        case OP_ADD: lanes_binary(d, a, b, n, [](float x, float y) { return x + y; }); break;
        case OP_SUB: lanes_binary(d, a, b, n, [](float x, float y) { return x - y; }); break;
        case OP_MUL: lanes_binary(d, a, b, n, [](float x, float y) { return x * y; }); break;
        case OP_DIV: lanes_binary(d, a, b, n, [](float x, float y) { return x / y; }); break;
        case OP_FMA:
            for (int i = 0; i < n; i++) d[i] = canon_bits(to_bits(std::fma(from_bits(a[i]), from_bits(b[i]), from_bits(c[i]))));
            break;
        case OP_SQRT: lanes_unary(d, a, n, [](float x) { return std::sqrt(x); }); break;
        case OP_MAX: lanes_binary(d, a, b, n, max_spec); break;
        case OP_MIN: lanes_binary(d, a, b, n, min_spec); break;
        case OP_LT:
            for (int i = 0; i < n; i++) d[i] = from_bits(a[i]) < from_bits(b[i]) ? ONE_BITS : 0u;
            break;
        case OP_EQ:
            for (int i = 0; i < n; i++) d[i] = from_bits(a[i]) == from_bits(b[i]) ? ONE_BITS : 0u;
            break;
        case OP_SELECT:  // NaN counts as true, -0 as zero
            for (int i = 0; i < n; i++) d[i] = canon_bits(from_bits(a[i]) != 0.0f ? b[i] : c[i]);
            break;
        case OP_RINT: lanes_unary(d, a, n, [](float x) { return std::nearbyint(x); }); break;
        case OP_FLOOR: lanes_unary(d, a, n, [](float x) { return std::floor(x); }); break;
        case OP_LDEXP:
            for (int i = 0; i < n; i++) d[i] = ldexp_bits(a[i], b[i]);
            break;
        case OP_GETEXP:
            for (int i = 0; i < n; i++) d[i] = getexp_bits(a[i]);
            break;
        case OP_GETMANT:
            for (int i = 0; i < n; i++) d[i] = getmant_bits(a[i]);
            break;
        case OP_NEG:
            for (int i = 0; i < n; i++) d[i] = canon_bits(a[i] ^ 0x80000000u);
            break;
        case OP_ABS:
            for (int i = 0; i < n; i++) d[i] = canon_bits(a[i] & 0x7FFFFFFFu);
            break;
        case OP_MOV:
            for (int i = 0; i < n; i++) d[i] = canon_bits(a[i]);
            break;
        case OP_CONST:
            for (int i = 0; i < n; i++) d[i] = in.imm;
            break;
        case OP_COORD: std::memcpy(d, L.coord[in.imm], sizeof(uint32_t) * n); break;
        case OP_LOAD: {
            const InputMap& m = maps[in.imm];
            const int64_t koff = k * m.kstride;
            if (m.linear) {
                const uint32_t* src = m.data + (L.base0[in.imm] + koff);
                if (m.lstride == 1) {
                    std::memcpy(d, src, sizeof(uint32_t) * n);
                } else {
                    for (int i = 0; i < n; i++) d[i] = src[i * m.lstride];
                }
            } else {
                // Per run: a copy (innermost stride 1), a fill (0, broadcast), or a strided read.
                const int64_t st = m.strides[m.last];
                const int64_t* rb = L.run_base.data() + (int64_t)in.imm * BLOCK;
                for (int r = 0; r < L.n_runs; r++) {
                    const uint32_t* src = m.data + (rb[r] + koff);
                    uint32_t* out = d + L.run_start[r];
                    const int len = L.run_len[r];
                    if (st == 1) {
                        std::memcpy(out, src, sizeof(uint32_t) * len);
                    } else if (st == 0) {
                        const uint32_t v = src[0];
                        for (int j = 0; j < len; j++) out[j] = v;
                    } else {
                        for (int j = 0; j < len; j++) out[j] = src[j * st];
                    }
                }
            }
            break;
        }
        case OP_LOADIDX: {
            const InputMap& m = maps[in.imm];
            for (int i = 0; i < n; i++) {
                const int64_t addr = loadidx_address(m, lane_base(m, L, in.imm, i) + k * m.kstride, a[i]);
                d[i] = addr < 0 ? CANONICAL_NAN_BITS : m.data[addr];
            }
            break;
        }
        default: TORCH_CHECK(false, "unknown opcode ", in.op);
    }
}

std::vector<Instr> read_program(const torch::Tensor& code) {
    TORCH_CHECK(code.dim() == 2 && code.size(1) == 5 && code.scalar_type() == torch::kInt64,
                "programs are (n, 5) int64 tensors: op, dst, a, b, imm");
    auto c = code.contiguous();
    const int64_t* p = c.data_ptr<int64_t>();
    std::vector<Instr> out(c.size(0));
    for (int64_t i = 0; i < c.size(0); i++) {
        const int64_t* w = p + 5 * i;
        TORCH_CHECK(w[0] >= 0 && w[0] < OP_COUNT, "unknown opcode ", w[0]);
        for (int j = 1; j < 4; j++) TORCH_CHECK(w[j] >= 0 && w[j] < NUM_REGS, "register out of range");
        out[i] = {(int32_t)w[0], (int32_t)w[1], (int32_t)w[2], (int32_t)w[3], (uint32_t)w[4]};
    }
    return out;
}

// A validated program invocation without data pointers: built once (per node of a StepPlan, or
// per call of run_program) and executed on any inputs of the sizes it was checked against.
struct Prog {
    std::vector<Instr> pro, body, epi;
    std::vector<InputMap> maps;  // .data is filled in per execution
    int64_t rank = 0, K = 1, numel = 1, run_axis = 0;
    int64_t out_shape[MAX_RANK] = {};
    bool need_coords = false;      // COORD used, or some map is not linear
    bool use_coord = false;        // COORD used
    bool need_lane_table = false;  // LOADIDX used: per-lane addresses of non-linear maps
    // Registers the executed sequence reads before writing them start as +0.0 (the spec's
    // initial state); zeroing only those keeps small nodes cheap. [0]: full run, [1]: epilogue
    // only with r0 preset.
    bool live[2][NUM_REGS] = {};
    int64_t work = 0;  // instructions executed, to decide whether threads pay off
};

// rows: n_in rows of rank + 4 int64 [strides..., kstride, offset, idx_stride, numel];
// input_numels: the element count of each input the program will be run on. Addresses of LOAD
// are checked in range by the Python KernelDesc.validate; they are re-checked here so a bad call
// cannot read wild memory.
Prog make_prog(const int64_t* rows, int64_t n_in, const std::vector<int64_t>& out_shape, int64_t K,
               std::vector<Instr> pro, std::vector<Instr> body, std::vector<Instr> epi,
               const std::vector<int64_t>& input_numels) {
    Prog P;
    P.rank = (int64_t)out_shape.size();
    TORCH_CHECK(P.rank <= MAX_RANK, "rank ", P.rank, " > ", MAX_RANK);
    TORCH_CHECK(K >= 1, "K must be >= 1");
    TORCH_CHECK((int64_t)input_numels.size() == n_in, "one element count per input");
    P.K = K;
    P.pro = std::move(pro);
    P.body = std::move(body);
    P.epi = std::move(epi);
    const int64_t rank = P.rank;
    for (int64_t dd = 0; dd < rank; dd++) {
        TORCH_CHECK(out_shape[dd] >= 1, "output dims must be >= 1");
        P.out_shape[dd] = out_shape[dd];
        P.numel *= out_shape[dd];
    }
    P.maps.resize(n_in);
    for (int64_t t = 0; t < n_in; t++) {
        const int64_t* row = rows + t * (rank + 4);
        InputMap& m = P.maps[t];
        m.data = nullptr;
        for (int64_t dd = 0; dd < rank; dd++) m.strides[dd] = row[dd];
        m.kstride = row[rank];
        m.offset = row[rank + 1];
        m.idx_stride = row[rank + 2];
        m.numel = row[rank + 3];
        TORCH_CHECK(m.numel == input_numels[t], "input ", t, " has ", input_numels[t], " elements, map says ",
                    m.numel);
        // SAFETY: LOAD reads data[base + k*kstride] unchecked in the lane loop; prove the whole
        // box of addresses lies inside the tensor first.
        int64_t lo = m.offset, hi = m.offset;
        for (int64_t dd = 0; dd < rank; dd++) {
            const int64_t span = m.strides[dd] * (out_shape[dd] - 1);
            lo += std::min<int64_t>(0, span);
            hi += std::max<int64_t>(0, span);
        }
        const int64_t kspan = m.kstride * (K - 1);
        lo += std::min<int64_t>(0, kspan);
        hi += std::max<int64_t>(0, kspan);
        bool loads = false;
        for (const auto* prog : {&P.pro, &P.body, &P.epi})
            for (const Instr& in : *prog) loads |= in.op == OP_LOAD && (int64_t)in.imm == t;
        TORCH_CHECK(!loads || (lo >= 0 && hi < m.numel), "input ", t, " addresses [", lo, ", ", hi,
                    "] leave [0, ", m.numel, ")");
    }
    P.run_axis = std::max<int64_t>(0, rank - 1);  // innermost axis of size > 1 (runs follow it)
    {
        int64_t cstride[MAX_RANK], acc = 1, last = -1;
        for (int64_t dd = rank - 1; dd >= 0; dd--) {
            cstride[dd] = acc;
            acc *= out_shape[dd];
            if (last < 0 && out_shape[dd] > 1) last = dd;
        }
        if (last >= 0) P.run_axis = last;
        for (InputMap& m : P.maps) {
            m.last = P.run_axis;
            m.lstride = last < 0 ? 0 : m.strides[last];
            m.linear = true;
            for (int64_t dd = 0; dd < rank; dd++)
                if (out_shape[dd] > 1 && m.strides[dd] != m.lstride * cstride[dd]) m.linear = false;
            P.need_coords |= !m.linear;
        }
    }
    for (const auto* prog : {&P.pro, &P.body, &P.epi})
        for (const Instr& in : *prog) {
            if (in.op == OP_LOAD || in.op == OP_LOADIDX) TORCH_CHECK((int64_t)in.imm < n_in, "LOAD of a missing input");
            P.need_lane_table |= in.op == OP_LOADIDX;
            if (in.op == OP_COORD) {
                TORCH_CHECK((int64_t)in.imm < rank, "COORD axis out of range");
                P.need_coords = P.use_coord = true;
            }
            if (in.op == OP_FMA || in.op == OP_SELECT) TORCH_CHECK(in.imm < NUM_REGS, "c register out of range");
        }
    P.work = P.numel * (int64_t)(P.pro.size() + (K - 1) * P.body.size() + P.epi.size());
    for (int with_init = 0; with_init < 2; with_init++) {
        bool written[NUM_REGS] = {};
        bool* live = P.live[with_init];
        if (with_init) written[0] = true;
        auto scan = [&](const std::vector<Instr>& prog) {
            for (const Instr& in : prog) {
                const int op = in.op;
                const bool reads_a = op != OP_CONST && op != OP_LOAD && op != OP_COORD;
                const bool reads_b = reads_a && op != OP_SQRT && op != OP_RINT && op != OP_FLOOR && op != OP_GETEXP &&
                                     op != OP_GETMANT && op != OP_NEG && op != OP_ABS && op != OP_MOV && op != OP_LOADIDX;
                const bool reads_c = op == OP_FMA || op == OP_SELECT;
                if (reads_a && !written[in.a]) live[in.a] = true;
                if (reads_b && !written[in.b]) live[in.b] = true;
                if (reads_c && !written[in.imm]) live[in.imm] = true;
                written[in.dst] = true;
            }
        };
        if (!with_init) {
            scan(P.pro);
            if (K > 1) scan(P.body);
        }
        scan(P.epi);
        if (!written[0]) live[0] = true;  // the result register is read at the end
    }
    return P;
}

// Per-worker register blocks, reused across the nodes of one StepPlan run.
using LanesCache = std::vector<std::unique_ptr<Lanes>>;

// Runs P on inputs data[0 .. n_in) into O (numel bit patterns). init (optional, numel bits):
// run ONLY the epilogue with r0 preset (the prologue and body were done by a faster kernel;
// the caller checked the epilogue reads no other register). O may equal init: each block
// reads its own init range before writing the same range.
void exec_prog(const Prog& P, const uint32_t* const* data, uint32_t* O, const uint32_t* init, int64_t threads,
               LanesCache& cache) {
    const int64_t n_in = (int64_t)P.maps.size(), numel = P.numel, rank = P.rank, K = P.K;
    std::vector<InputMap> maps = P.maps;
    for (int64_t t = 0; t < n_in; t++) maps[t].data = data[t];
    const int64_t n_blocks = ceil_div(numel, BLOCK);
    // Small programs on small tensors: a thread wake-up costs more than the work.
    if (P.work < (1 << 16)) threads = 1;
    threads = std::max<int64_t>(1, std::min(threads, n_blocks));
    const bool* live = P.live[init != nullptr ? 1 : 0];
    if ((int64_t)cache.size() < threads) cache.resize(threads);
    const int64_t* out_shape = P.out_shape;
    parallel_items(n_blocks, threads, [&](int64_t blk, int64_t t) {
        if (!cache[t]) {
            // `new Lanes` (default-init), not make_unique (value-init would zero ~22 KB per call;
            // every register a program reads before writing is zeroed per block below).
            cache[t] = std::unique_ptr<Lanes>(new Lanes);
        }
        Lanes& L = *cache[t];
        const size_t need = (size_t)std::max<int64_t>(1, n_in);
        if (L.base0.size() < need) {
            L.base.resize(need * BLOCK);
            L.base0.resize(need);
            L.run_base.resize(need * BLOCK);
        }
        const int64_t e0 = blk * BLOCK;
        L.n = (int)std::min<int64_t>(BLOCK, numel - e0);
        for (int r = 0; r < NUM_REGS; r++)
            if (live[r]) std::memset(L.reg[r], 0, sizeof(uint32_t) * L.n);
        for (int64_t tt = 0; tt < n_in; tt++) L.base0[tt] = maps[tt].offset + e0 * maps[tt].lstride;
        if (P.need_coords) {
            // Coordinates of the block's first element by division, then runs along the
            // innermost axis: inside a run only the last coordinate moves (by one), so both the
            // coordinate and every address are arithmetic sequences (vectorised loops).
            int64_t cs[MAX_RANK];
            int64_t e = e0;
            for (int64_t dd = rank - 1; dd >= 0; dd--) {
                cs[dd] = e % out_shape[dd];
                e /= out_shape[dd];
            }
            const int64_t last = P.run_axis;
            L.n_runs = 0;
            for (int i = 0; i < L.n;) {
                const int run = (int)std::min<int64_t>(out_shape[last] - cs[last], L.n - i);
                if (P.use_coord) {
                    for (int64_t dd = 0; dd < last; dd++) {
                        const uint32_t cb = to_bits((float)cs[dd]);
                        for (int j = 0; j < run; j++) L.coord[dd][i + j] = cb;
                    }
                    for (int j = 0; j < run; j++) L.coord[last][i + j] = to_bits((float)(cs[last] + j));
                }
                L.run_start[L.n_runs] = i;
                L.run_len[L.n_runs] = run;
                for (int64_t tt = 0; tt < n_in; tt++) {
                    const InputMap& m = maps[tt];
                    if (m.linear) continue;
                    int64_t b = m.offset;
                    for (int64_t dd = 0; dd < rank; dd++) b += cs[dd] * m.strides[dd];
                    L.run_base[tt * BLOCK + L.n_runs] = b;
                    if (P.need_lane_table) {  // LOADIDX reads per-lane addresses
                        const int64_t st = m.strides[last];
                        int64_t* dst = L.base.data() + tt * BLOCK + i;
                        for (int j = 0; j < run; j++) dst[j] = b + j * st;
                    }
                }
                L.n_runs++;
                i += run;
                cs[last] += run;
                for (int64_t dd = last; dd > 0 && cs[dd] == out_shape[dd]; dd--) {
                    cs[dd] = 0;
                    cs[dd - 1]++;
                }
            }
        }
        if (init != nullptr) {
            std::memcpy(L.reg[0], init + e0, sizeof(uint32_t) * L.n);
        } else {
            for (const Instr& in : P.pro) exec_instr(in, 0, maps, L);
            for (int64_t k = 1; k < K; k++)
                for (const Instr& in : P.body) exec_instr(in, k, maps, L);
        }
        for (const Instr& in : P.epi) exec_instr(in, K - 1, maps, L);
        std::memcpy(O + e0, L.reg[0], sizeof(uint32_t) * L.n);
    });
}

// The rows of an (n_rows, n_cols) int64 table, flat.
std::vector<int64_t> int64_rows(const torch::Tensor& t, int64_t n_rows, int64_t n_cols, const char* what) {
    TORCH_CHECK(t.scalar_type() == torch::kInt64 && t.dim() == 2 && t.size(0) == n_rows && t.size(1) == n_cols,
                what, " must be an (", n_rows, ", ", n_cols, ") int64 tensor");
    auto c = t.contiguous();
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + n_rows * n_cols);
}

// inputs: flat int32 bit tensors. maps: (n_inputs, rank + 4) int64 rows
// [strides..., kstride, offset, idx_stride, numel]. r0_init: see exec_prog.
torch::Tensor run_program(const std::vector<torch::Tensor>& inputs, const torch::Tensor& maps_t,
                          std::vector<int64_t> out_shape, int64_t K, const torch::Tensor& pro_t,
                          const torch::Tensor& body_t, const torch::Tensor& epi_t,
                          const c10::optional<torch::Tensor>& r0_init, int64_t threads) {
    const int64_t n_in = (int64_t)inputs.size(), rank = (int64_t)out_shape.size();
    TORCH_CHECK(rank <= MAX_RANK, "rank ", rank, " > ", MAX_RANK);
    std::vector<int64_t> numels(n_in);
    std::vector<const uint32_t*> data(std::max<int64_t>(1, n_in), nullptr);
    for (int64_t t = 0; t < n_in; t++) {
        const torch::Tensor& x = inputs[t];
        TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kInt32 && x.is_contiguous(),
                    "inputs must be contiguous CPU int32 bit tensors");
        numels[t] = x.numel();
        data[t] = reinterpret_cast<const uint32_t*>(x.data_ptr<int32_t>());
    }
    const Prog P = make_prog(int64_rows(maps_t, n_in, rank + 4, "maps").data(), n_in, out_shape, K, read_program(pro_t),
                             read_program(body_t), read_program(epi_t), numels);
    const uint32_t* init = nullptr;
    if (r0_init.has_value()) {
        TORCH_CHECK(r0_init->scalar_type() == torch::kInt32 && r0_init->is_contiguous() &&
                        r0_init->numel() == P.numel,
                    "r0_init must be a contiguous int32 tensor with one value per output element");
        init = reinterpret_cast<const uint32_t*>(r0_init->data_ptr<int32_t>());
    }
    torch::Tensor out = torch::empty({P.numel}, torch::TensorOptions().dtype(torch::kInt32));
    LanesCache cache;
    exec_prog(P, data.data(), reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>()), init, threads, cache);
    return out;
}

// ----------------------------------------------------------------------------------------
// StepPlan: all nodes of one training step in one call (built once per graph by
// verde_chain/repops/backend_cpu.py; see StepKernel there). Every node output lives in one
// arena tensor allocated per run, at offsets fixed when the plan is built; node inputs are
// (buffer, offset, numel) references into this step's arena (outputs of earlier nodes), the
// previous step's arena (state tensors) or the batch. Each node runs the same kernel as the
// per-node path (GEMM, fold, binary, compiled map, or the interpreter), so the bits are the
// same; what disappears is the per-node Python, pybind and allocation overhead, which dominated
// nodes of a few thousand elements. Every address a node can touch is checked when it is added.
// ----------------------------------------------------------------------------------------

enum NodeKind : int64_t { NK_PROGRAM = 0, NK_DOT = 1, NK_FOLD = 2, NK_BINARY = 3, NK_JIT = 4, NK_SCATTER = 5 };
enum Buffer : int64_t { BUF_ARENA = 0, BUF_PREV = 1, BUF_BATCH = 2 };
using JitFn = void (*)(const void* const*, uint32_t*, int64_t, int64_t);

struct Ref {
    int64_t buf, offset, numel;
};

struct PlanNode {
    int64_t kind = NK_PROGRAM;
    int64_t out_offset = 0, out_numel = 0;
    std::vector<Ref> ins;
    bool has_prog = false;  // PROGRAM: the whole program; DOT/FOLD: an epilogue, run with r0 preset
    Prog prog;
    int64_t op = 0;  // FOLD: reduce op; BINARY: binary op
    // DOT: input slots, geometry (pointers set per run), per-batch element offsets
    int64_t sa = 0, sb = 0;
    GemmArgs g{};
    std::vector<int64_t> aoff, boff;
    // FOLD: out[r] = fold_k X[xoff + r*sr + k*sk]
    int64_t slot = 0, R = 0, Kr = 0, sr = 0, sk = 0, xoff = 0;
    // JIT: a compiled map over n = out_numel elements
    JitFn fn = nullptr;
    int64_t work = 0;
};

class StepPlan {
  public:
    StepPlan(int64_t arena_numel, int64_t prev_numel, int64_t batch_numel, int64_t mc, int64_t kc, int64_t nc)
        : size_{arena_numel, prev_numel, batch_numel},
          mc_(round_up(std::max<int64_t>(1, mc), GEMM_MR)),
          kc_(std::max<int64_t>(1, kc)),
          nc_(round_up(std::max<int64_t>(1, nc), GEMM_NR)) {
        for (int64_t s : size_) TORCH_CHECK(s >= 0, "buffer sizes must be >= 0");
    }

    void add_program(const torch::Tensor& refs, const torch::Tensor& maps, std::vector<int64_t> out_shape, int64_t K,
                     const torch::Tensor& pro, const torch::Tensor& body, const torch::Tensor& epi,
                     int64_t out_offset) {
        PlanNode nd = base_node(NK_PROGRAM, refs, maps, out_shape, K, pro, body, epi, out_offset);
        nd.has_prog = true;
        nodes_.push_back(std::move(nd));
    }

    // A dot node: GEMM (batch = aoff.numel()) then, if the epilogue is not empty, the epilogue.
    void add_dot(const torch::Tensor& refs, const torch::Tensor& maps, std::vector<int64_t> out_shape, int64_t K,
                 const torch::Tensor& pro, const torch::Tensor& body, const torch::Tensor& epi, int64_t out_offset,
                 int64_t sa, int64_t sb, int64_t M, int64_t N, const torch::Tensor& aoff, int64_t sai, int64_t sak,
                 const torch::Tensor& boff, int64_t sbk, int64_t sbj) {
        PlanNode nd = base_node(NK_DOT, refs, maps, out_shape, K, pro, body, epi, out_offset);
        nd.has_prog = epi.size(0) > 0;
        const int64_t n_in = (int64_t)nd.ins.size();
        TORCH_CHECK(sa >= 0 && sa < n_in && sb >= 0 && sb < n_in, "dot input slot out of range");
        nd.sa = sa;
        nd.sb = sb;
        nd.aoff = offsets(aoff);
        nd.boff = offsets(boff);
        const int64_t nb = (int64_t)nd.aoff.size();
        TORCH_CHECK((int64_t)nd.boff.size() == nb && nb >= 1 && M >= 1 && N >= 1, "bad dot geometry");
        TORCH_CHECK(nb * M * N == nd.out_numel, "dot output ", nb, "x", M, "x", N, " != ", nd.out_numel);
        check_box(nd.aoff, {sai, sak}, {M, K}, nd.ins[sa].numel, "dot A");
        check_box(nd.boff, {sbk, sbj}, {K, N}, nd.ins[sb].numel, "dot B");
        nd.g.sai = sai;
        nd.g.sak = sak;
        nd.g.sbk = sbk;
        nd.g.sbj = sbj;
        nd.g.batch = nb;
        nd.g.M = M;
        nd.g.N = N;
        nd.g.K = K;
        nodes_.push_back(std::move(nd));
    }

    // A fold node: out[r] = fold over k of X[xoff + r*sr + k*sk] (r < numel, k < K), then the
    // epilogue if not empty.
    void add_fold(const torch::Tensor& refs, const torch::Tensor& maps, std::vector<int64_t> out_shape, int64_t K,
                  const torch::Tensor& pro, const torch::Tensor& body, const torch::Tensor& epi, int64_t out_offset,
                  int64_t slot, int64_t op, int64_t xoff, int64_t sr, int64_t sk) {
        PlanNode nd = base_node(NK_FOLD, refs, maps, out_shape, K, pro, body, epi, out_offset);
        nd.has_prog = epi.size(0) > 0;
        TORCH_CHECK(slot >= 0 && slot < (int64_t)nd.ins.size(), "fold input slot out of range");
        TORCH_CHECK(op >= RED_SUM && op <= RED_MIN, "unknown reduce op ", op);
        check_box({xoff}, {sr, sk}, {nd.out_numel, K}, nd.ins[slot].numel, "fold X");
        nd.slot = slot;
        nd.op = op;
        nd.xoff = xoff;
        nd.R = nd.out_numel;
        nd.Kr = K;
        nd.sr = sr;
        nd.sk = sk;
        nodes_.push_back(std::move(nd));
    }

    // out[e] = a[e] (op) b[e], both inputs exactly out_numel long.
    void add_binary(const torch::Tensor& refs, int64_t out_offset, int64_t numel, int64_t op) {
        PlanNode nd;
        nd.kind = NK_BINARY;
        nd.ins = read_refs(refs);
        set_out(nd, out_offset, numel);
        TORCH_CHECK(op >= BIN_ADD && op <= BIN_MIN, "unknown binary op ", op);
        TORCH_CHECK(nd.ins.size() == 2 && nd.ins[0].numel == numel && nd.ins[1].numel == numel,
                    "binary inputs must have the output's size");
        nd.op = op;
        nodes_.push_back(std::move(nd));
    }

    // A scatter-add node (spec.scatter_add, see scatter_rows_into): refs (g of P*R, idx of P).
    void add_scatter(const torch::Tensor& refs, int64_t out_offset, int64_t P, int64_t R, int64_t V) {
        PlanNode nd;
        nd.kind = NK_SCATTER;
        nd.ins = read_refs(refs);
        TORCH_CHECK(P >= 1 && R >= 1 && V >= 1 && V <= (1 << 24), "bad scatter geometry");
        set_out(nd, out_offset, V * R);
        TORCH_CHECK(nd.ins.size() == 2 && nd.ins[0].numel == P * R && nd.ins[1].numel == P,
                    "scatter inputs must be g (P*R elements) and idx (P)");
        nd.R = R;
        nd.Kr = P;
        nodes_.push_back(std::move(nd));
    }

    // A compiled map (backend_cpu.jit_source): input t is read at lin[t] = (offset, stride) as
    // offset + e*stride for e < numel. fn_addr is the map's address (the library stays loaded
    // by functools.cache in Python; the plan's owner keeps a reference too).
    void add_jit(const torch::Tensor& refs, const torch::Tensor& lin, int64_t out_offset, int64_t numel,
                 int64_t fn_addr, int64_t work) {
        PlanNode nd;
        nd.kind = NK_JIT;
        nd.ins = read_refs(refs);
        set_out(nd, out_offset, numel);
        TORCH_CHECK(fn_addr != 0, "null map function");
        const std::vector<int64_t> rows = int64_rows(lin, (int64_t)nd.ins.size(), 2, "lin");
        for (size_t t = 0; t < nd.ins.size(); t++)
            check_box({rows[2 * t]}, {rows[2 * t + 1]}, {numel}, nd.ins[t].numel, "map input");
        nd.fn = reinterpret_cast<JitFn>(fn_addr);
        nd.work = work;
        nodes_.push_back(std::move(nd));
    }

    int64_t size() const { return (int64_t)nodes_.size(); }

    // times (optional, float64, one per node): each node's seconds are ADDED to its entry
    // (profiling: scripts/bench_ops.py files them under op families).
    torch::Tensor run(const torch::Tensor& prev, const torch::Tensor& batch, int64_t threads,
                      const c10::optional<torch::Tensor>& times) const {
        check_buffer(prev, size_[BUF_PREV], "previous arena");
        check_buffer(batch, size_[BUF_BATCH], "batch");
        double* node_s = nullptr;
        if (times.has_value()) {
            TORCH_CHECK(times->scalar_type() == torch::kFloat64 && times->is_contiguous() &&
                            times->numel() == (int64_t)nodes_.size(),
                        "times must be a contiguous float64 tensor with one entry per node");
            node_s = times->data_ptr<double>();
        }
        torch::Tensor arena = torch::empty({size_[BUF_ARENA]}, torch::TensorOptions().dtype(torch::kFloat32));
        float* base[3] = {arena.data_ptr<float>(), const_cast<float*>(prev.data_ptr<float>()),
                          const_cast<float*>(batch.data_ptr<float>())};
        LanesCache cache;
        std::vector<const uint32_t*> data;
        for (size_t i = 0; i < nodes_.size(); i++) {
            const PlanNode& nd = nodes_[i];
            const auto t0 = std::chrono::steady_clock::now();
            data.assign(std::max<size_t>(1, nd.ins.size()), nullptr);
            for (size_t t = 0; t < nd.ins.size(); t++)
                data[t] = reinterpret_cast<const uint32_t*>(base[nd.ins[t].buf] + nd.ins[t].offset);
            float* out = base[BUF_ARENA] + nd.out_offset;
            uint32_t* out_bits = reinterpret_cast<uint32_t*>(out);
            switch (nd.kind) {
                case NK_PROGRAM: exec_prog(nd.prog, data.data(), out_bits, nullptr, threads, cache); break;
                case NK_DOT: {
                    GemmArgs g = nd.g;
                    g.A = reinterpret_cast<const float*>(data[nd.sa]);
                    g.B = reinterpret_cast<const float*>(data[nd.sb]);
                    g.C = out;
                    g.aoff = nd.aoff.data();
                    g.boff = nd.boff.data();
                    gemm(g, threads, mc_, kc_, nc_);
                    break;
                }
                case NK_FOLD:
                    reduce_into(reinterpret_cast<const float*>(data[nd.slot]) + nd.xoff, nd.R, nd.Kr, nd.sr, nd.sk,
                                nd.op, out, threads);
                    break;
                case NK_BINARY:
                    binary_into(reinterpret_cast<const float*>(data[0]), reinterpret_cast<const float*>(data[1]),
                                out, nd.out_numel, nd.op, threads);
                    break;
                case NK_SCATTER:
                    scatter_rows_into(reinterpret_cast<const float*>(data[0]), reinterpret_cast<const float*>(data[1]),
                                      nd.Kr, nd.R, nd.out_numel / nd.R, out, threads);
                    break;
                default: run_jit(nd, data, out_bits, threads); break;
            }
            if (nd.has_prog && nd.kind != NK_PROGRAM) exec_prog(nd.prog, data.data(), out_bits, out_bits, threads, cache);
            if (node_s) node_s[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        return arena;
    }

  private:
    int64_t size_[3];
    int64_t mc_, kc_, nc_;
    std::vector<PlanNode> nodes_;

    static void run_jit(const PlanNode& nd, const std::vector<const uint32_t*>& data, uint32_t* out,
                        int64_t threads) {
        const void* const* in = reinterpret_cast<const void* const*>(data.data());
        const int64_t n = nd.out_numel;
        // The same threshold as the Python pool of the per-node path (backend_cpu._run_jit).
        if (threads <= 1 || nd.work < (1 << 18)) {
            nd.fn(in, out, 0, n);
            return;
        }
        parallel_items(threads, threads, [&](int64_t i, int64_t) { nd.fn(in, out, n * i / threads, n * (i + 1) / threads); });
    }

    static void check_buffer(const torch::Tensor& t, int64_t numel, const char* what) {
        TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous(), what,
                    " must be a contiguous CPU float32 tensor");
        TORCH_CHECK(t.numel() == numel, what, " has ", t.numel(), " elements, the plan expects ", numel);
    }

    std::vector<Ref> read_refs(const torch::Tensor& refs) const {
        TORCH_CHECK(refs.dim() == 2, "refs must be (n_inputs, 3)");
        const std::vector<int64_t> rows = int64_rows(refs, refs.size(0), 3, "refs");
        std::vector<Ref> out(refs.size(0));
        for (size_t t = 0; t < out.size(); t++) {
            const Ref r{rows[3 * t], rows[3 * t + 1], rows[3 * t + 2]};
            TORCH_CHECK(r.buf >= BUF_ARENA && r.buf <= BUF_BATCH, "unknown buffer ", r.buf);
            TORCH_CHECK(r.offset >= 0 && r.numel >= 0 && r.offset + r.numel <= size_[r.buf], "input ", t,
                        " [", r.offset, ", +", r.numel, ") leaves buffer ", r.buf, " of ", size_[r.buf]);
            out[t] = r;
        }
        return out;
    }

    void set_out(PlanNode& nd, int64_t out_offset, int64_t numel) const {
        TORCH_CHECK(out_offset >= 0 && numel >= 1 && out_offset + numel <= size_[BUF_ARENA], "output [", out_offset,
                    ", +", numel, ") leaves the arena of ", size_[BUF_ARENA]);
        nd.out_offset = out_offset;
        nd.out_numel = numel;
    }

    PlanNode base_node(int64_t kind, const torch::Tensor& refs, const torch::Tensor& maps,
                       const std::vector<int64_t>& out_shape, int64_t K, const torch::Tensor& pro,
                       const torch::Tensor& body, const torch::Tensor& epi, int64_t out_offset) const {
        PlanNode nd;
        nd.kind = kind;
        nd.ins = read_refs(refs);
        std::vector<int64_t> numels;
        for (const Ref& r : nd.ins) numels.push_back(r.numel);
        nd.prog = make_prog(int64_rows(maps, (int64_t)nd.ins.size(), (int64_t)out_shape.size() + 4, "maps").data(),
                            (int64_t)nd.ins.size(), out_shape, K, read_program(pro), read_program(body),
                            read_program(epi), numels);
        set_out(nd, out_offset, nd.prog.numel);
        return nd;
    }

    static std::vector<int64_t> offsets(const torch::Tensor& t) {
        TORCH_CHECK(t.scalar_type() == torch::kInt64 && t.dim() == 1, "offsets must be a 1-D int64 tensor");
        auto c = t.contiguous();
        return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
    }

    // SAFETY: the kernels read base + sum(i_d * stride_d) unchecked for every i_d < extent_d;
    // with non-negative strides the extremes are base and base + sum((extent_d - 1) * stride_d).
    static void check_box(const std::vector<int64_t>& bases, std::vector<int64_t> strides,
                          std::vector<int64_t> extents, int64_t numel, const char* what) {
        int64_t span = 0;
        for (size_t d = 0; d < strides.size(); d++) {
            TORCH_CHECK(strides[d] >= 0 && extents[d] >= 1, what, ": strides must be >= 0");
            span += strides[d] * (extents[d] - 1);
        }
        for (int64_t b : bases)
            TORCH_CHECK(b >= 0 && b + span < numel, what, " addresses [", b, ", ", b + span, "] leave [0, ", numel, ")");
    }
};

// MXCSR as a worker thread sees it (after the guard): lets tests prove FTZ/DAZ are off.
int64_t worker_mxcsr() {
    int64_t value = -1;
    parallel_items(1, 1, [&](int64_t, int64_t) {
#if REPOPS_X86
        value = (int64_t)_mm_getcsr();
#endif
    });
    return value;
}

pybind11::dict info() {
    pybind11::dict d;
    d["isa"] = ISA_NAME;
    d["mr"] = GEMM_MR;
    d["nr"] = GEMM_NR;
    d["lanes"] = W;
    return d;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "RepOps CPU kernels with fixed evaluation orders (see kernels/repops_cpu.cpp)";
    m.def("matmul3", &matmul3, "batched GEMM, fixed fma chain", pybind11::arg("a"), pybind11::arg("b"),
          pybind11::arg("threads"), pybind11::arg("mc"), pybind11::arg("kc"), pybind11::arg("nc"));
    m.def("reduce_last", &reduce_last, "sequential reduction over the last axis", pybind11::arg("x"),
          pybind11::arg("op"), pybind11::arg("threads"));
    m.def("binary", &binary, "elementwise IEEE op with canonical NaN", pybind11::arg("a"), pybind11::arg("b"),
          pybind11::arg("op"), pybind11::arg("threads"));
    m.def("scatter_rows", &scatter_rows, "scatter-add of rows in the spec's order", pybind11::arg("g"),
          pybind11::arg("idx"), pybind11::arg("V"), pybind11::arg("threads"));
    m.def("run_program", &run_program, "run any KernelDesc program (generic interpreter)", pybind11::arg("inputs"),
          pybind11::arg("maps"), pybind11::arg("out_shape"), pybind11::arg("K"), pybind11::arg("prologue"),
          pybind11::arg("body"), pybind11::arg("epilogue"), pybind11::arg("r0_init"), pybind11::arg("threads"));
    pybind11::class_<StepPlan>(m, "StepPlan", "all nodes of one training step in one call")
        .def(pybind11::init<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>(), pybind11::arg("arena_numel"),
             pybind11::arg("prev_numel"), pybind11::arg("batch_numel"), pybind11::arg("mc"), pybind11::arg("kc"),
             pybind11::arg("nc"))
        .def("add_program", &StepPlan::add_program)
        .def("add_dot", &StepPlan::add_dot)
        .def("add_fold", &StepPlan::add_fold)
        .def("add_binary", &StepPlan::add_binary)
        .def("add_jit", &StepPlan::add_jit)
        .def("add_scatter", &StepPlan::add_scatter)
        .def("__len__", &StepPlan::size)
        .def("run", &StepPlan::run, pybind11::arg("prev"), pybind11::arg("batch"), pybind11::arg("threads"),
             pybind11::arg("times") = pybind11::none(), pybind11::call_guard<pybind11::gil_scoped_release>());
    m.def("worker_mxcsr", &worker_mxcsr);
    m.def("info", &info);
}
