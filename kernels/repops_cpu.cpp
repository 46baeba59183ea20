// SPDX-License-Identifier: MIT
//
// repops_cpu.cpp — RepOps CPU kernels (GEMM, reductions, elementwise) with one fixed order.
//
// Built three times from this one source (see verde_chain/repops/cpu_kernels.py):
//   REPOPS_ISA=0  scalar   (no ISA flags; fmaf from libm, correctly rounded)
//   REPOPS_ISA=1  AVX2     (-mavx2 -mfma;   _mm256_fmadd_ps rounds once, like fmaf)
//   REPOPS_ISA=2  AVX-512  (-mavx512f;      _mm512_fmadd_ps rounds once, like fmaf)
// always with -O3 -ffp-contract=off -fno-fast-math, so the compiler never fuses a*b+c on its
// own. All three variants produce the same bits: vector lanes only ever hold DIFFERENT output
// elements, never partial sums of one element.
//
// Canonical orders (the spec; engineer B's verde_chain/repops/spec.py must agree):
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
// the thread count are. Only output tiles are distributed.

#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
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
inline float max_spec(float a, float b) {
    if (a != a || b != b) return from_bits(CANONICAL_NAN_BITS);
    if (a == b) return from_bits(to_bits(a) & to_bits(b));
    return a > b ? a : b;
}
inline float min_spec(float a, float b) {
    if (a != a || b != b) return from_bits(CANONICAL_NAN_BITS);
    if (a == b) return from_bits(to_bits(a) | to_bits(b));
    return a < b ? a : b;
}

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
inline Vec vmax_spec(Vec a, Vec b) {
    __mmask16 unord = _mm512_cmp_ps_mask(a.v, b.v, _CMP_UNORD_Q);
    __mmask16 eq = _mm512_cmp_ps_mask(a.v, b.v, _CMP_EQ_OQ);
    __m512 both = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a.v), _mm512_castps_si512(b.v)));
    __m512 r = _mm512_mask_blend_ps(eq, _mm512_max_ps(a.v, b.v), both);
    return {_mm512_mask_blend_ps(unord, r, _mm512_castsi512_ps(_mm512_set1_epi32((int)CANONICAL_NAN_BITS)))};
}
inline Vec vmin_spec(Vec a, Vec b) {
    __mmask16 unord = _mm512_cmp_ps_mask(a.v, b.v, _CMP_UNORD_Q);
    __mmask16 eq = _mm512_cmp_ps_mask(a.v, b.v, _CMP_EQ_OQ);
    __m512 either = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(a.v), _mm512_castps_si512(b.v)));
    __m512 r = _mm512_mask_blend_ps(eq, _mm512_min_ps(a.v, b.v), either);
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
inline Vec vmax_spec(Vec a, Vec b) {
    __m256 unord = _mm256_cmp_ps(a.v, b.v, _CMP_UNORD_Q);
    __m256 eq = _mm256_cmp_ps(a.v, b.v, _CMP_EQ_OQ);
    __m256 r = _mm256_blendv_ps(_mm256_max_ps(a.v, b.v), _mm256_and_ps(a.v, b.v), eq);
    return {_mm256_blendv_ps(r, _mm256_castsi256_ps(_mm256_set1_epi32((int)CANONICAL_NAN_BITS)), unord)};
}
inline Vec vmin_spec(Vec a, Vec b) {
    __m256 unord = _mm256_cmp_ps(a.v, b.v, _CMP_UNORD_Q);
    __m256 eq = _mm256_cmp_ps(a.v, b.v, _CMP_EQ_OQ);
    __m256 r = _mm256_blendv_ps(_mm256_min_ps(a.v, b.v), _mm256_or_ps(a.v, b.v), eq);
    return {_mm256_blendv_ps(r, _mm256_castsi256_ps(_mm256_set1_epi32((int)CANONICAL_NAN_BITS)), unord)};
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
inline Vec vmax_spec(Vec a, Vec b) { return {max_spec(a.v, b.v)}; }
inline Vec vmin_spec(Vec a, Vec b) { return {min_spec(a.v, b.v)}; }
constexpr int GEMM_MR = 4;
constexpr int GEMM_NV = 4;  // 4 x 4 tile of scalars
#endif

constexpr int GEMM_NR = GEMM_NV * W;

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
};

// Packs rows [i0, i0+rows) x k [p0, p0+kc) into MR-tall panels, layout [panel][k][MR],
// zero-filling rows past `rows` (their outputs are discarded).
void pack_a(const float* A, int64_t sai, int64_t sak, int64_t i0, int64_t rows, int64_t p0, int64_t kc,
            float* out) {
    for (int64_t ip = 0; ip < rows; ip += GEMM_MR) {
        float* o = out + ip * kc;
        int64_t r_valid = std::min<int64_t>(GEMM_MR, rows - ip);
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
void gemm(const GemmArgs& g, int64_t threads, int64_t mc, int64_t kc, int64_t nc) {
    // Below ~2^20 FMAs (a few microseconds) waking a second thread costs more than it saves.
    if ((double)g.batch * (double)g.M * (double)g.N * (double)g.K < (double)(1 << 20)) threads = 1;
    const int64_t n_nblocks = ceil_div(g.N, nc);
    const int64_t n_pairs = g.batch * n_nblocks;
    if (threads <= 1 || n_pairs >= 2 * threads) {
        threads = std::max<int64_t>(1, std::min(threads, n_pairs));
        std::vector<std::vector<float>> abuf(threads), bbuf(threads);
        parallel_items(n_pairs, threads, [&](int64_t item, int64_t t) {
            const int64_t bi = item / n_nblocks;
            const int64_t j0 = (item % n_nblocks) * nc, cols = std::min(nc, g.N - j0);
            const float* A = g.A + bi * g.sab;
            const float* B = g.B + bi * g.sbb;
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
        const float* A = g.A + bi * g.sab;
        const float* B = g.B + bi * g.sbb;
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

inline __m256 y_canonical_nan() { return _mm256_castsi256_ps(_mm256_set1_epi32((int)CANONICAL_NAN_BITS)); }

template <int OP>
inline __m256 y_step(__m256 acc, __m256 x) {
    if (OP == 0 || OP == 2) return _mm256_add_ps(acc, x);  // sum, mean
    const __m256 unord = _mm256_cmp_ps(acc, x, _CMP_UNORD_Q);
    const __m256 eq = _mm256_cmp_ps(acc, x, _CMP_EQ_OQ);
    const __m256 r = OP == 1 ? _mm256_blendv_ps(_mm256_max_ps(acc, x), _mm256_and_ps(acc, x), eq)
                             : _mm256_blendv_ps(_mm256_min_ps(acc, x), _mm256_or_ps(acc, x), eq);
    return _mm256_blendv_ps(r, y_canonical_nan(), unord);
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

torch::Tensor reduce_last(const torch::Tensor& x, int64_t op, int64_t threads) {
    check_f32_cpu(x, "x");
    TORCH_CHECK(x.dim() == 2, "reduce_last takes a 2-D (rows, K) view");
    TORCH_CHECK(op >= RED_SUM && op <= RED_MIN, "unknown reduce op ", op);
    const int64_t R = x.size(0), K = x.size(1), sr = x.stride(0), sk = x.stride(1);
    TORCH_CHECK(K > 0, "reduction over an empty axis");
    torch::Tensor out = torch::empty({R}, x.options());
    if (R == 0) return out;
    const float* X = x.data_ptr<float>();
    float* O = out.data_ptr<float>();
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

torch::Tensor binary(const torch::Tensor& a, const torch::Tensor& b, int64_t op, int64_t threads) {
    check_f32_cpu(a, "a");
    check_f32_cpu(b, "b");
    TORCH_CHECK(a.sizes() == b.sizes(), "binary takes equal shapes (broadcast first)");
    TORCH_CHECK(a.is_contiguous() && b.is_contiguous(), "binary takes contiguous tensors");
    TORCH_CHECK(op >= BIN_ADD && op <= BIN_MIN, "unknown binary op ", op);
    torch::Tensor out = torch::empty_like(a, a.options().memory_format(torch::MemoryFormat::Contiguous));
    const int64_t n = a.numel();
    const float* A = a.data_ptr<float>();
    const float* B = b.data_ptr<float>();
    float* O = out.data_ptr<float>();
    constexpr int64_t CHUNK = 1 << 14;
    if (n < (1 << 17)) threads = 1;
    parallel_items(ceil_div(n, CHUNK), threads, [&](int64_t item, int64_t) {
        const int64_t i0 = item * CHUNK, i1 = std::min(n, i0 + CHUNK);
        int64_t i = i0;
        for (; i + W <= i1; i += W) vstore(O + i, vcanon(vbinary(op, vload(A + i), vload(B + i))));
        for (; i < i1; i++) O[i] = canon(sbinary(op, A[i], B[i]));
    });
    return out;
}

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
    m.def("worker_mxcsr", &worker_mxcsr);
    m.def("info", &info);
}
