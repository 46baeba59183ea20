// SPDX-License-Identifier: MIT
//
// gemm_tile.h — the GEMM micro-kernel shared by the plain GEMM (gemm.cpp) and the windowed
// GEMM of convolutions (conv.cpp): one MR x NR output tile over packed panels of A ([k][MR])
// and B ([k][NR]), the dot-product order of kernels.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "simd.h"

namespace repops_cpu {

// B read in place (gemm_b_in_place) is fetched this many k rows ahead. Its rows are B's own row
// stride apart (4 KiB for 1024 columns), two cache lines from each per call, which the hardware
// prefetchers did not follow: dlogits^T @ h (10 x 1024, K = 512) took 145 us at one thread
// without it, 72-77 with it (Intel machine of 2026-12-04; 8 rows ahead 3-8% faster than 16 or
// 32 at K = 1024, as fast at 512; into L2 only, no faster).
constexpr int GEMM_IN_PLACE_PREFETCH_ROWS = 8;

// The first n floats of a buffer a thread keeps from call to call, at a 64-byte boundary. It
// grows and never shrinks, so it is not zero-filled again whenever a smaller GEMM came between
// two larger ones (a step's GEMMs differ in size, and resize() refilled what a shrink had
// dropped). Aligned because the micro-kernel's B loads are whole vectors: from a vector's
// 16-byte-aligned data every one of them split two cache lines (Intel machine of 2026-12-03:
// the micro-kernel alone in L1 at 177 GF/s against 191 aligned; a 1024^2 GEMM with A in blocks
// of 48 rows at 127-130 against 135-136). Every user writes what it then reads.
inline float* at_least(std::vector<float>& v, int64_t n) {
    constexpr int64_t ALIGN_FLOATS = 64 / sizeof(float);
    if ((int64_t)v.size() < n + ALIGN_FLOATS - 1) v.resize(n + ALIGN_FLOATS - 1);
    const uintptr_t p = reinterpret_cast<uintptr_t>(v.data());
    return v.data() + ((64 - p % 64) % 64) / sizeof(float);
}

// One R x NR tile (R <= MR rows of an MR-row panel, of which the first mr are real; the first V
// of its GEMM_NV vectors of columns, which hold its nr real columns) over kc steps of k.
// `first`: this block starts at k = 0, so the chain opens with one rounded multiply; otherwise
// the accumulators resume from C. `last`: canonicalise NaN before the final store.
// Every element's chain is the same whatever R and V are: they only decide how many rows and
// vectors of the panel are computed, so a tail of 4 rows of a 12-row tile does not pay for 12,
// nor a GEMM of 10 columns (a classifier's logits) for 32.
// `ldb`: floats between B's k rows: GEMM_NR for a packed panel (a constant, so the loop steps
// by an immediate), or B's own row stride when B is read in place (gemm_b_in_place).
template <int R, int V = GEMM_NV, bool B_IN_PLACE = false>
inline void micro_kernel_rows(int64_t kc, const float* __restrict Ap, const float* __restrict Bp, float* C,
                              int64_t ldc, bool first, bool last, int64_t mr, int64_t nr, int64_t ldb = GEMM_NR) {
    if constexpr (!B_IN_PLACE) ldb = GEMM_NR;
    Vec acc[R][V];
    alignas(64) float tile[R * GEMM_NR];
    const bool full_cols = nr == GEMM_NR;
    float* Cw = full_cols ? C : tile;
    const int64_t ld = full_cols ? ldc : GEMM_NR;
    if (!full_cols && !first)
        for (int64_t i = 0; i < mr; i++)
            for (int64_t j = 0; j < nr; j++) tile[i * GEMM_NR + j] = C[i * ldc + j];
    int64_t k = 0;
    if (first) {
        Vec b[V];
#pragma GCC unroll 8
        for (int j = 0; j < V; j++) b[j] = vload(Bp + j * W);
#pragma GCC unroll 16
        for (int i = 0; i < R; i++) {
            Vec a = vbcast(Ap[i]);
#pragma GCC unroll 8
            for (int j = 0; j < V; j++) acc[i][j] = vmul(a, b[j]);
        }
        k = 1;
    } else {
#pragma GCC unroll 16
        for (int i = 0; i < R; i++)
#pragma GCC unroll 8
            for (int j = 0; j < V; j++) acc[i][j] = i < mr ? vload(Cw + i * ld + j * W) : vbcast(0.0f);
    }
    for (; k < kc; k++) {
        const float* bk = Bp + k * ldb;
        if constexpr (B_IN_PLACE) {
#pragma GCC unroll 8
            for (int j = 0; j < V; j++) __builtin_prefetch(bk + GEMM_IN_PLACE_PREFETCH_ROWS * ldb + j * W, 0, 3);
        }
        const float* ak = Ap + k * GEMM_MR;  // the panel's rows stay MR apart whatever R is
        Vec b[V];
#pragma GCC unroll 8
        for (int j = 0; j < V; j++) b[j] = vload(bk + j * W);
#pragma GCC unroll 16
        for (int i = 0; i < R; i++) {
            Vec a = vbcast(ak[i]);
#pragma GCC unroll 8
            for (int j = 0; j < V; j++) acc[i][j] = vfma(a, b[j], acc[i][j]);
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < R; i++)
        if (i < mr)
#pragma GCC unroll 8
            for (int j = 0; j < V; j++) vstore(Cw + i * ld + j * W, last ? vcanon(acc[i][j]) : acc[i][j]);
    if (!full_cols)
        for (int64_t i = 0; i < mr; i++)
            for (int64_t j = 0; j < nr; j++) C[i * ldc + j] = tile[i * GEMM_NR + j];
}

// One mr x nr tile (mr <= MR, nr <= NR) of an MR x NR panel pair: the rows computed are rounded
// up to 4 or 8 where that is fewer than MR, the columns to one vector where they fit in one.
template <int V, bool B_IN_PLACE = false>
inline void micro_kernel_cols(int64_t kc, const float* __restrict Ap, const float* __restrict Bp, float* C,
                              int64_t ldc, bool first, bool last, int64_t mr, int64_t nr, int64_t ldb) {
    if constexpr (GEMM_MR > 4)
        if (mr <= 4) return micro_kernel_rows<4, V, B_IN_PLACE>(kc, Ap, Bp, C, ldc, first, last, mr, nr, ldb);
    if constexpr (GEMM_MR > 8)
        if (mr <= 8) return micro_kernel_rows<8, V, B_IN_PLACE>(kc, Ap, Bp, C, ldc, first, last, mr, nr, ldb);
    micro_kernel_rows<GEMM_MR, V, B_IN_PLACE>(kc, Ap, Bp, C, ldc, first, last, mr, nr, ldb);
}

// B_IN_PLACE: Bp's k rows are ldb floats apart and fetched ahead (gemm_b_in_place: B itself, or
// its packed last strip at ldb = GEMM_NR); otherwise Bp is a packed panel.
template <bool B_IN_PLACE = false>
inline void micro_kernel(int64_t kc, const float* __restrict Ap, const float* __restrict Bp, float* C, int64_t ldc,
                         bool first, bool last, int64_t mr, int64_t nr, int64_t ldb = GEMM_NR) {
    if constexpr (GEMM_NV > 1)
        if (nr <= W) return micro_kernel_cols<1, B_IN_PLACE>(kc, Ap, Bp, C, ldc, first, last, mr, nr, ldb);
    micro_kernel_cols<GEMM_NV, B_IN_PLACE>(kc, Ap, Bp, C, ldc, first, last, mr, nr, ldb);
}

}  // namespace repops_cpu
