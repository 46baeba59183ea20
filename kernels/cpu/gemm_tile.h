// SPDX-License-Identifier: MIT
//
// gemm_tile.h — the GEMM micro-kernel shared by the plain GEMM (gemm.cpp) and the windowed
// GEMM of convolutions (conv.cpp): one MR x NR output tile over packed panels of A ([k][MR])
// and B ([k][NR]), the dot-product order of kernels.h.
#pragma once

#include <cstdint>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>
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

// A thread's own packed copy of an operand, kept from call to call (no page faults per call)
// and valid for one (call, key): at several threads each thread packs what its items read
// itself, since data one core packed and another read cost more than packing it twice (see
// GEMM_OWN_B_MIN_FMAS). `call` tells one call from another (a later call may pass the same key
// with other data at the same address), `key` the part packed (an entry, a column block).
struct OwnPacked {
    std::vector<float> buf;
    uint64_t call = 0;
    int64_t key = -1;
    // The buffer (at least n floats) and whether it must be packed for (call, key) now.
    std::pair<float*, bool> get(int64_t n, uint64_t c, int64_t k) {
        float* const p = at_least(buf, n);
        const bool stale = call != c || key != k;
        call = c, key = k;
        return {p, stale};
    }
};

// A number of its own for every call that packs into OwnPacked buffers.
inline uint64_t new_call() {
    static std::atomic<uint64_t> calls{0};
    return calls.fetch_add(1, std::memory_order_relaxed) + 1;
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
// A_IN_PLACE: A's R rows are read where they lie, `lda` floats apart, k contiguous within a row
// (gemm_w_rows: rows of W), instead of from a packed [k][MR] panel.
template <int R, int V = GEMM_NV, bool B_IN_PLACE = false, bool A_IN_PLACE = false>
inline void micro_kernel_rows(int64_t kc, const float* __restrict Ap, const float* __restrict Bp, float* C,
                              int64_t ldc, bool first, bool last, int64_t mr, int64_t nr, int64_t ldb = GEMM_NR,
                              int64_t lda = 0) {
    if constexpr (!B_IN_PLACE) ldb = GEMM_NR;
    // A's element (row i, k)
    auto a_at = [&](int i, int64_t k) { return A_IN_PLACE ? Ap[i * lda + k] : Ap[k * GEMM_MR + i]; };
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
            Vec a = vbcast(a_at(i, 0));
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
    auto step = [&](int64_t k) {
        const float* bk = Bp + k * ldb;
        if constexpr (B_IN_PLACE) {
#pragma GCC unroll 8
            for (int j = 0; j < V; j++) __builtin_prefetch(bk + GEMM_IN_PLACE_PREFETCH_ROWS * ldb + j * W, 0, 3);
        }
        Vec b[V];
#pragma GCC unroll 8
        for (int j = 0; j < V; j++) b[j] = vload(bk + j * W);
#pragma GCC unroll 16
        for (int i = 0; i < R; i++) {
            Vec a = vbcast(a_at(i, k));  // a packed panel's rows stay MR apart whatever R is
#pragma GCC unroll 8
            for (int j = 0; j < V; j++) acc[i][j] = vfma(a, b[j], acc[i][j]);
        }
    };
    if constexpr (B_IN_PLACE) {
        for (; k < kc; k++) step(k);
    } else {
        // Unrolled over packed B: the loop's own counter, pointer and branch uops per k are then
        // shared by 8 k (bench_gemm.py --baseline, 1 | 2 threads: 1024^3 0.98 | 0.98; see
        // docs/benchmarks.md, 2026-12-05 from 22:42). B read in place lost by it (32 x 512 x 256:
        // 1.014 | 1.055).
#pragma GCC unroll 8
        for (; k < kc; k++) step(k);
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

// Runs tile(ir, jr, C) for the micro-tiles of a rows x cols block of C (`c_at(i, j)`: where its
// element (i, j) lies; a tile's rows are `ldc` floats apart), columns outer so one B panel serves
// every row panel. With `fetch_c`, each next tile's C is fetched (for writing) while the one
// before runs: each K block reloads its tiles of C, rows a whole row of C apart, which the
// hardware prefetchers do not follow once C has left L2. Only for a C of at least
// GEMM_FETCH_C_MIN_FLOATS: on the Intel machine of 2026-12-04 (bench_gemm.py --baseline, this
// build / before, medians of pairs, 1 | 2 threads) 2048^3 took 0.975 | 0.940, 0.996 | 0.976 and
// 0.989 | 0.969 in three runs, 1024^3 0.998 | 0.980, 1.001 | 1.006, 0.996 | 0.990; with C in L2
// the prefetches cost more than they saved (512 x 256 x 512 1.022, 256^3 1.017, and K = 32:
// 256 x 32 x 512 1.066).
constexpr int64_t GEMM_FETCH_C_MIN_FLOATS = int64_t(1) << 20;  // 4 MiB of C
template <class CAt, class Tile>
inline void sweep_tiles(int64_t rows, int64_t cols, int64_t ldc, bool fetch_c, CAt c_at, Tile tile) {
    for (int64_t jr = 0; jr < cols; jr += GEMM_NR)
        for (int64_t ir = 0; ir < rows; ir += GEMM_MR) {
            const bool down = ir + GEMM_MR < rows;
            if (fetch_c && (down || jr + GEMM_NR < cols)) {
                const int64_t ni = down ? ir + GEMM_MR : 0, nj = down ? jr : jr + GEMM_NR;
                const int64_t last_col = std::min<int64_t>(GEMM_NR, cols - nj) - 1;
                const float* c = c_at(ni, nj);
                for (int64_t r = 0, n = std::min<int64_t>(GEMM_MR, rows - ni); r < n; r++, c += ldc) {
                    for (int64_t j = 0; j < last_col; j += 64 / sizeof(float)) __builtin_prefetch(c + j, 1, 3);
                    __builtin_prefetch(c + last_col, 1, 3);
                }
            }
            tile(ir, jr, c_at(ir, jr));
        }
}

}  // namespace repops_cpu
