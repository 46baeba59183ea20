// SPDX-License-Identifier: MIT
//
// gemm_tile.h — the GEMM micro-kernel shared by the plain GEMM (gemm.cpp) and the windowed
// GEMM of convolutions (conv.cpp): one MR x NR output tile over packed panels of A ([k][MR])
// and B ([k][NR]), the dot-product order of kernels.h.
#pragma once

#include <cstring>

#include "simd.h"

namespace repops_cpu {

// One MR x NR tile over kc steps of k. `first`: this block starts at k = 0, so the chain opens
// with one rounded multiply; otherwise the accumulators resume from C. `last`: canonicalise
// NaN before the final store.
inline void micro_kernel(int64_t kc, const float* __restrict Ap, const float* __restrict Bp, float* C, int64_t ldc,
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

}  // namespace repops_cpu
