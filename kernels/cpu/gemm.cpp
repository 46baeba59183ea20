// SPDX-License-Identifier: MIT
//
// gemm.cpp — the RepOps GEMM: C = A @ B with the dot-product order of kernels.h, on any strides.
//
// Structure (GotoBLAS/BLIS-like, but never splitting K across threads):
//
//   for each (batch b, column block of nc)           <- threads take these, or (one big matrix)
//     for p0 in 0, kc, 2kc, ...  (K blocks, ascending; acc carried through C in fp32)
//       pack B[p0:p0+kc, cols] into NR-wide panels        [k][NR]
//       for each row block of min(mc, GEMM_PAIR_PACK_ROWS):
//         pack A rows into MR-tall panels                 [k][MR]
//         for each NR panel, for each MR panel: micro-kernel MR x NR, k ascending
//
//   one big matrix: B packed once (panels over all of K), threads take 2-D tiles
//   (mc_eff rows x nc_eff columns) and run the K blocks of their tile as above; so too a few
//   entries against one B (packed once for all), and, at one thread too, a few rows of several
//   entries against one B (gemm_tiles)
//
//   entries against one B whose A entries follow each other row after row: first folded into
//   one taller matrix, which then takes one of the two ways above
//
// Carrying the accumulator through memory between K blocks stores it exactly (fp32), so the
// chain for one output element is the same uninterrupted fma sequence whatever mc/kc/nc and
// the thread count are. Only output tiles are distributed. Small GEMMs (N <= 128 and
// M*N*K <= 2^18 per batch entry) skip the tiles: see gemm_small.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "gemm_tile.h"
#include "kernels.h"

namespace repops_cpu {
std::atomic<int64_t> gemm_helped_blocks{0};
std::atomic<int64_t> gemm_late_item_us{0};
namespace {

// Vectors [0, n) of an operand whose vector v runs contiguously along k (src[v * stride + k]),
// written as out[k * width + v] for k in [0, kn): four vectors by four k at a time through one
// 4x4 transpose in registers. Returns how many vectors it wrote (a multiple of four); the
// caller writes the rest. It packs A's rows (row-major A) and B's columns (B = W^T) into
// panels: element by element, a strided 4-byte store each, packing A took a fifth of a 2048^2
// GEMM's time, as A is packed again for every column block.
int64_t transpose_by4(const float* src, int64_t stride, int64_t n, int64_t kn, float* out, int64_t width) {
#if REPOPS_X86
    int64_t v = 0;
    for (; v + 4 <= n; v += 4) {
        const float* s0 = src + v * stride;
        int64_t k = 0;
        for (; k + 4 <= kn; k += 4) {
            __m128 x0 = _mm_loadu_ps(s0 + k), x1 = _mm_loadu_ps(s0 + stride + k);
            __m128 x2 = _mm_loadu_ps(s0 + 2 * stride + k), x3 = _mm_loadu_ps(s0 + 3 * stride + k);
            _MM_TRANSPOSE4_PS(x0, x1, x2, x3);
            _mm_storeu_ps(out + k * width + v, x0);
            _mm_storeu_ps(out + (k + 1) * width + v, x1);
            _mm_storeu_ps(out + (k + 2) * width + v, x2);
            _mm_storeu_ps(out + (k + 3) * width + v, x3);
        }
        for (; k < kn; k++)
            for (int64_t q = 0; q < 4; q++) out[k * width + v + q] = s0[q * stride + k];
    }
    return v;
#else
    (void)src, (void)stride, (void)n, (void)kn, (void)out, (void)width;
    return 0;
#endif
}

// Packs rows [i0, i0+rows) x k [p0, p0+kc) into MR-tall panels, layout [panel][k][MR],
// zero-filling rows past `rows` (their outputs are discarded).
void pack_a(const float* A, int64_t sai, int64_t sak, int64_t i0, int64_t rows, int64_t p0, int64_t kc,
            float* out) {
    for (int64_t ip = 0; ip < rows; ip += GEMM_MR) {
        float* o = out + ip * kc;
        int64_t r_valid = std::min<int64_t>(GEMM_MR, rows - ip);
        if (sai == 1 && sak != 1) {
            // A transposed (x^T @ g, the weight gradient): rows are contiguous, walk them inner;
            // a whole panel's MR floats of one k in one copy (vector moves). Against the copy
            // element by element (bench_gemm.py --a-transposed --baseline, Intel machine of
            // 2026-12-04, 1 | 2 threads): digits-wide's dW1, 1024 x 512 x 64, 0.93 | 0.92;
            // 1024 x 2048 x 1024 0.95 | 0.96; 300 x 100 x 200 0.98 | 0.96.
            const float* src = A + (i0 + ip) + p0 * sak;
            if (r_valid == GEMM_MR) {
                for (int64_t k = 0; k < kc; k++) std::memcpy(o + k * GEMM_MR, src + k * sak, sizeof(float) * GEMM_MR);
                continue;
            }
            for (int64_t k = 0; k < kc; k++) {
                int64_t r = 0;
                for (; r < r_valid; r++) o[k * GEMM_MR + r] = src[k * sak + r];
                for (; r < GEMM_MR; r++) o[k * GEMM_MR + r] = 0.0f;
            }
            continue;
        }
        int64_t r = 0;
        if (sak == 1) r = transpose_by4(A + (i0 + ip) * sai + p0, sai, r_valid, kc, o, GEMM_MR);
        for (; r < GEMM_MR; r++) {
            if (r < r_valid) {
                const float* src = A + (i0 + ip + r) * sai + p0 * sak;
                for (int64_t k = 0; k < kc; k++) o[k * GEMM_MR + r] = src[k * sak];
            } else {
                for (int64_t k = 0; k < kc; k++) o[k * GEMM_MR + r] = 0.0f;
            }
        }
    }
}

constexpr int64_t PACK_B_K = 64;  // pack_b's k block for a B whose columns run along k

// pack_b's k block for a B with contiguous rows: PACK_B_ROWS rows at a time, every panel's
// part of them, where each panel used to be filled down all kc rows before the next (reading
// each row's NR floats once per panel, kc rows apart). Stand-alone, 1 thread, medians of calls
// taking turns, this / panel by panel (Intel machine of 2026-12-06): 1024^3 0.977 and 0.976
// (blocks of 4-32 rows: 0.976-0.984), 2048^3 0.99, 512^3 0.98, 1024 x 1024 x 300 1.00; with
// gemm_tiles' own-B threads packing their block in one call (before: a call per panel),
// bench_gemm.py --baseline, paired, 1 | 2 threads: 1024^3 0.977 | 0.989, 2048^3 0.989 | 0.990,
// 512^3 0.998 | 0.988, 256^3 0.996-1.006 | 1.011-1.014. Why the panel-by-panel walk lost was
// not traced (no hardware counters on that machine).
constexpr int64_t PACK_B_ROWS = 16;

// Packs k [p0, p0+kc) x columns [j0, j0+cols) into NR-wide panels, layout [panel][k][NR].
void pack_b(const float* B, int64_t sbk, int64_t sbj, int64_t j0, int64_t cols, int64_t p0, int64_t kc,
            float* out) {
    if (sbj == 1) {
        for (int64_t kb = 0; kb < kc; kb += PACK_B_ROWS)
            for (int64_t jp = 0; jp < cols; jp += GEMM_NR) {
                float* o = out + jp * kc;
                const int64_t c_valid = std::min<int64_t>(GEMM_NR, cols - jp);
                for (int64_t k = kb, k_end = std::min(kc, kb + PACK_B_ROWS); k < k_end; k++) {
                    const float* src = B + (p0 + k) * sbk + j0 + jp;
                    int64_t c = 0;
                    for (; c < c_valid; c++) o[k * GEMM_NR + c] = src[c];
                    for (; c < GEMM_NR; c++) o[k * GEMM_NR + c] = 0.0f;
                }
            }
        return;
    }
    for (int64_t jp = 0; jp < cols; jp += GEMM_NR) {
        float* o = out + jp * kc;
        int64_t c_valid = std::min<int64_t>(GEMM_NR, cols - jp);
        // B's columns run along k (a weight used as W^T). The panel is walked in blocks of
        // PACK_B_K rows, whose NR floats each stay in L1 while every column fills them: a
        // whole panel of a GEMM over all of K (gemm_tiles: 512 x 32 floats, 64 KB) filled
        // column by column wrote each of its cache lines NR/16 times from L2.
        for (int64_t kb = 0; kb < kc; kb += PACK_B_K) {
            const int64_t kn = std::min(PACK_B_K, kc - kb);
            int64_t c = sbk == 1 ? transpose_by4(B + p0 + kb + (j0 + jp) * sbj, sbj, c_valid, kn,
                                                 o + kb * GEMM_NR, GEMM_NR)
                                 : 0;
            for (; c < GEMM_NR; c++) {
                float* oc = o + kb * GEMM_NR + c;
                if (c < c_valid) {
                    const float* src = B + (p0 + kb) * sbk + (j0 + jp + c) * sbj;
                    for (int64_t k = 0; k < kn; k++) oc[k * GEMM_NR] = src[k * sbk];
                } else {
                    for (int64_t k = 0; k < kn; k++) oc[k * GEMM_NR] = 0.0f;
                }
            }
        }
    }
}

// Rows [i_begin, i_end) of one output column block [j0, j0+cols) for one K block, given the
// packed B block (its NR panels `bstride` floats apart): pack each mc x kcur block of A and run
// the micro-kernels over it.
void compute_rows(const GemmArgs& g, const float* A, float* C, const float* bpack, int64_t bstride, int64_t i_begin,
                  int64_t i_end, int64_t j0, int64_t cols, int64_t p0, int64_t kcur, int64_t mc,
                  std::vector<float>& abuf, int64_t fetch_end = -1) {
    const bool first = p0 == 0, last = p0 + kcur == g.K;
    if (fetch_end < 0) fetch_end = i_end;
    float* const ap = at_least(abuf, round_up(mc, GEMM_MR) * kcur);
    constexpr int64_t LINE = 64 / sizeof(float);
    for (int64_t i0 = i_begin; i0 < i_end; i0 += mc) {
        const int64_t rows = std::min(mc, i_end - i0);
        pack_a(A, g.sai, g.sak, i0, rows, p0, kcur, ap);
        // The next row block's A lines, fetched into L2 a few before each micro-tile while this
        // block runs: pack_a waited on them (A beyond L2, each row's kc floats a short stream the
        // hardware prefetchers picked up late). perf (2048^3, 2 threads): pack_a 8.0% of the
        // samples before, 3.2% after; bench_gemm.py --baseline, 1 | 2 threads: 2048^3 0.995 |
        // 0.986, 1024^3 0.990 | 1.001. Issued one every 16 k inside the micro-kernel instead,
        // 1-4% slower than none (the micro-kernel's loop paid for the check).
        const int64_t next = i0 + mc, next_rows = std::max<int64_t>(0, std::min(mc, fetch_end - next));
        const bool by_rows = g.sak == 1, by_k = !by_rows && g.sai == 1;
        const int64_t per_run = by_rows ? ceil_div(kcur, LINE) : ceil_div(next_rows, LINE);
        const int64_t lines = by_rows ? next_rows * per_run : by_k ? kcur * per_run : 0;
        const int64_t per_tile = ceil_div(lines, ceil_div(rows, GEMM_MR) * ceil_div(cols, GEMM_NR));
        int64_t fetched = 0;
        sweep_tiles(
            rows, cols, g.N, g.M * g.N >= GEMM_FETCH_C_MIN_FLOATS, [&](int64_t i, int64_t j) { return C + (i0 + i) * g.N + j0 + j; },
            [&](int64_t ir, int64_t jr, float* c) {
                for (const int64_t end = std::min(lines, fetched + per_tile); fetched < end; fetched++) {
                    const int64_t run = fetched / per_run, at = fetched % per_run * LINE;
                    __builtin_prefetch(by_rows ? A + (next + run) * g.sai + p0 + at : A + next + at + (p0 + run) * g.sak, 0, 2);
                }
                micro_kernel(kcur, ap + ir * kcur, bpack + jr / GEMM_NR * bstride, c, g.N, first, last,
                             std::min<int64_t>(GEMM_MR, rows - ir), std::min<int64_t>(GEMM_NR, cols - jr));
            });
    }
}

// Two ways to hand out output blocks, chosen by shape; both give the same bits.
//  * Many (batch, column block) pairs: each thread takes whole pairs and packs its own B block.
//  * Few of them (one big matrix): 2-D tiles against one shared packed B (gemm_tiles). Packing
//    B once, not once per thread, matters: with per-thread packing, narrow blocks made packing
//    cost more than the FMAs. But a large matrix whose columns cut evenly into a few blocks a
//    thread takes whole pairs too (even_column_blocks).
// Small GEMMs (a transformer block's 16-64-wide matrices): the blocked path's 12x32 tiles and
// packing cost more than the FMAs there. Rows are computed directly instead: B packed once per
// batch as [K][Np] (Np = N rounded up to W lanes, zero-padded), then for ROWS output rows at a
// time and W columns per vector, acc = a[i,0] * b[0,j] (one rounded multiply) and
// acc = fma(a[i,k], b[k,j], acc) for k = 1 .. K-1 ascending: the same chain per element.
// So too, at any size, a GEMM whose N fits in one vector (a classifier's logits, h @ W^T with 10
// classes), 12 rows at a time: the blocked path packed all of A (by transposes, for B = W^T)
// for W columns of FMAs. On the Intel machine of 2026-12-04, paired against it (bench_gemm.py
// --baseline, 1 thread | 2 threads): 512 x 1024 x 10 0.59 | 0.64, 2048 x 64 x 12 0.77 | 0.76,
// 1000 x 300 x 7 (B as stored) 0.55 | 0.60. Wider N was not: with B ([K][Np]) streamed from L2
// for every 4 rows, 1024 x 512 x 64 (A transposed) took 2.5x as long as the blocked path.
constexpr int64_t SMALL_GEMM_MAX_N = 128;
constexpr int64_t SMALL_GEMM_MAX_WORK = 1 << 18;  // M*N*K of one batch entry
// Rows small_rows computes at a time when N fits in one vector: 12 independent chains for the FMAs.
constexpr int SMALL_ROWS_ONE_VECTOR = 12;
// The row group small_rows sweeps first for a B of Np packed columns (gemm_small cuts its items
// in whole groups).
constexpr int64_t small_row_group(int64_t Np) { return Np == W ? SMALL_ROWS_ONE_VECTOR : 4; }
constexpr int64_t GEMM_ITEMS_PER_THREAD = 4;      // tiles per thread on one big matrix (choose_tiling)
// A GEMM of at most this many rows is cut into tiles by columns only, one tile per thread
// (choose_tiling). Cut into row tiles of one micro-tile's height as well, each of them streamed
// its column block's B panels, half packed by the other thread: the tiny Llama's x @ W^T, 2 x 16
// rows, K 512, N 256, took 0.30 ms at 2 threads against 0.21 ms at 1; cut by columns only,
// 0.11 ms. Four column tiles per thread then packed all of A four times over, for every tile: on
// the Intel machine of 2026-12-03 (stand-alone, B = W^T, medians of 2,000 calls), 32 x 256 x 256
// at 2 threads took 24 us with 32 rows and four tiles a thread, 17 us with one tile a thread
// (1 thread: 32 us); 64 x 256 x 256: 63 -> 31 us (1 thread: 54); 128 x 256 x 256: 88 -> 58 (97);
// 128 x 512 x 512: 314 -> 207 (386). 256 rows cut by columns only (four tiles a thread) took
// 158 us against 129 in row tiles.
constexpr int64_t GEMM_FEW_ROWS = 128;
// Entries of at most this many rows against one B that did not fold into one matrix take
// gemm_tiles at one thread too, B packed once for all entries (gemm). Its own bound: where
// GEMM_FEW_ROWS went from 32 to 128 for the tiling, this rule was not measured past 32 rows.
constexpr int64_t GEMM_FEW_ROWS_ONE_B = 32;

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

// B of batch entry bi as [K][Np], zero-padded columns.
void small_pack_b(const GemmArgs& g, int64_t bi, int64_t Np, float* bp) {
    const float* B = g.b_at(bi);
    // Columns along k (B = W^T): four columns at a time through transposes; the rest one by one.
    const int64_t j_done = g.sbk == 1 ? transpose_by4(B, g.sbj, g.N, g.K, bp, Np) : 0;
    for (int64_t k = 0; k < g.K; k++) {
        float* row = bp + k * Np;
        if (g.sbj == 1)
            std::memcpy(row, B + k * g.sbk, sizeof(float) * g.N);
        else
            for (int64_t j = j_done; j < g.N; j++) row[j] = B[k * g.sbk + j * g.sbj];
        for (int64_t j = g.N; j < Np; j++) row[j] = 0.0f;
    }
}

// Output rows [i0, i1) of batch entry bi against its packed B.
void small_rows(const GemmArgs& g, int64_t bi, const float* bp, int64_t Np, int64_t i0, int64_t i1) {
    const float* A = g.a_at(bi);
    float* C = g.C + bi * g.M * g.N;
    int64_t i = i0;
    if (small_row_group(Np) == SMALL_ROWS_ONE_VECTOR)
        for (; i + SMALL_ROWS_ONE_VECTOR <= i1; i += SMALL_ROWS_ONE_VECTOR)
            small_gemm_rows<SMALL_ROWS_ONE_VECTOR>(g, A, bp, Np, C, i);
    for (; i + 4 <= i1; i += 4) small_gemm_rows<4>(g, A, bp, Np, C, i);
    for (; i < i1; i++) small_gemm_rows<1>(g, A, bp, Np, C, i);
}

// Items: whole batch entries when there are at least two per thread (each packs its own B);
// otherwise blocks of rows, each thread packing the B of its blocks' entries for itself. (B
// packed once, one item per entry, then read by every thread took 1.03-1.08x as long at 2
// threads, bench_gemm.py --baseline on the Intel machine of 2026-12-04, medians of 15 pairs:
// 512 x 1024 x 10 0.926, 2048 x 64 x 12 0.969, 1000 x 300 x 7 (B as stored) 0.946 of before.)
void gemm_small(const GemmArgs& g, int64_t threads) {
    const int64_t Np = round_up(g.N, W);
    if (threads == 1 || g.batch >= 2 * threads) {
        parallel_items(g.batch, threads, [&](int64_t bi, int64_t) {
            thread_local std::vector<float> bpack;
            float* const bp = at_least(bpack, g.K * Np);
            small_pack_b(g, bi, Np, bp);
            small_rows(g, bi, bp, Np, 0, g.M);
        });
        return;
    }
    // About four row blocks per thread, whole groups of rows as small_rows takes them; a thread
    // packs an entry's B once per call into a buffer of its own (as gemm_tiles' threads do).
    const int64_t rows = round_up(ceil_div(g.M * g.batch, 4 * threads), small_row_group(Np));
    const int64_t per_entry = ceil_div(g.M, rows);
    const uint64_t call = new_call();
    parallel_items(g.batch * per_entry, threads, [&](int64_t item, int64_t) {
        const int64_t bi = item / per_entry, i0 = (item % per_entry) * rows;
        thread_local OwnPacked mine;
        const auto [bp, stale] = mine.get(g.K * Np, call, bi);
        if (stale) small_pack_b(g, bi, Np, bp);
        small_rows(g, bi, bp, Np, i0, std::min(g.M, i0 + rows));
    });
}

// The 2-D tiles of gemm_tiles: mc x nc output elements (whole micro-tiles), n_i x n_j per entry.
struct Tiling {
    int64_t mc, nc, n_i, n_j;
};

// Tiles for `threads` threads, at least GEMM_ITEMS_PER_THREAD per thread where the shape allows
// (a thread the OS wakes late still finds work), at most mc x nc. Among the row counts that
// allow, the one with the shortest estimated makespan (list scheduling: total / T + the largest
// tile * (T - 1) / T), a tile costing rows x (cols + NR) in padded micro-tiles: each tile packs
// its A rows once per K block, about as much work as NR columns of FMAs. E.g. 1024^2 at 2 threads
// is 15 x 2 tiles of 72 x 512 (the last row of tiles 16 rows high): 30 tiles, where the earlier
// row blocks of 144 gave 8 per block (7 x 144 + 16 rows), at best 576 : 448 rows per thread.
// At most GEMM_FEW_ROWS rows are one row of tiles, cut by columns only, one tile a thread where
// N allows.
Tiling choose_tiling(int64_t batch, int64_t M, int64_t N, int64_t threads, int64_t mc, int64_t nc) {
    const int64_t want = (M <= GEMM_FEW_ROWS ? 1 : GEMM_ITEMS_PER_THREAD) * threads;
    const int64_t i_lo = ceil_div(M, mc), i_hi = M <= GEMM_FEW_ROWS ? i_lo : std::min(ceil_div(M, GEMM_MR), i_lo + want);
    Tiling best{mc, nc, i_lo, ceil_div(N, nc)};
    double best_cost = -1;
    for (int64_t n = i_lo; n <= std::max(i_lo, i_hi); n++) {
        Tiling t;
        t.mc = round_up(ceil_div(M, n), GEMM_MR);
        t.n_i = ceil_div(M, t.mc);
        const int64_t nj = std::min(std::max(ceil_div(N, nc), ceil_div(want, batch * t.n_i)), ceil_div(N, GEMM_NR));
        t.nc = round_up(ceil_div(N, nj), GEMM_NR);
        t.n_j = ceil_div(N, t.nc);
        const auto padded = [](int64_t total, int64_t block, int64_t n_blocks, int64_t unit) {
            return (double)(block * (n_blocks - 1) + round_up(total - block * (n_blocks - 1), unit));
        };
        const double total = (double)batch * padded(M, t.mc, t.n_i, GEMM_MR) *
                             (padded(N, t.nc, t.n_j, GEMM_NR) + (double)(t.n_j * GEMM_NR));
        const double largest = (double)t.mc * (double)(t.nc + GEMM_NR);
        const double cost = total / (double)threads + largest * (double)(threads - 1) / (double)threads;
        if (best_cost < 0 || cost < best_cost) best = t, best_cost = cost;
    }
    return best;
}

// Few (batch, column block) pairs (one big matrix): ONE parallel call whose items are 2-D
// output tiles (choose_tiling) of one batch entry, each running every K block itself (p0
// ascending, the accumulator carried through C). B is packed once per call, one NR panel over
// all of K at a time, by the first item that needs the panel; items needing it meanwhile pack
// the other panels of their column block, then wait for it. So packing costs no barrier: an
// earlier version packed each nc x kc block in a parallel call of its own and then computed it
// in another, two barriers per block (16 per 1024^2 GEMM).
//
// At several threads, though, each thread packs the column block its items need into a buffer
// of its own (once per call and column block: items are column block major, so a thread mostly
// stays in one), where that is little work beside the thread's share of the FMAs
// (GEMM_OWN_B_MIN_FMAS); B itself is only read, so nothing a thread reads was written by
// another. Panels one core packed and another read cost more than packing them twice: on the
// Intel machine of 2026-12-04 (stand-alone build, 2 threads, medians of up to 3,000 calls) a
// weight gradient x^T @ dy of the tiny Llama, 256 x 32 x 512, took 47.7 us with the shared
// panels against 33.5 us (1 thread: 56.6); 300 x 100 x 200 56.1 -> 45.0; 512^3 with B = W^T
// 1,020 -> 919; 768^3 3,229 -> 2,982; 1024^3 7,415 -> 6,867 (as stored) and 7,489 -> 7,278
// (B = W^T). A thread then packs up to a whole column block, where the shared panels had it
// pack its part: fine at 2 threads, not measured at 8 or more (the rule keeps each thread's FMAs
// at least GEMM_OWN_B_MIN_FMAS per packed element). Entries against one B (a few rows each) keep
// the shared panels: a thread would pack that B again for every entry it visits.
constexpr double GEMM_OWN_B_MIN_FMAS = 64;
constexpr int64_t GEMM_OWN_B_MAX_FLOATS = int64_t(1) << 22;  // a thread's buffer: 16 MiB at most

void gemm_tiles(const GemmArgs& g, int64_t threads, int64_t mc, int64_t kc, int64_t nc) {
    const Tiling tl = choose_tiling(g.batch, g.M, g.N, threads, mc, nc);
    const int64_t mc_eff = tl.mc, nc_eff = tl.nc, n_i = tl.n_i, n_j = tl.n_j;
    const int64_t panels = ceil_div(g.N, GEMM_NR), pstride = g.K * GEMM_NR;  // per batch entry
    // One B for every entry (GemmArgs::one_b) is packed once, as entry 0's.
    const bool shared_b = g.one_b();
    const int64_t block_floats = ceil_div(nc_eff, GEMM_NR) * pstride;  // one packed column block
    const double fmas_per_thread = (double)g.batch * (double)g.M * (double)g.N * (double)g.K / (double)threads;
    // One tile (entry bi, rows from i0, columns [j0, j0 + cols)) over all K blocks, given its
    // column block of packed B (NR panels pstride floats apart). A is packed per tile and K
    // block, so once per column block. Tried on 2026-12-05: each thread keeping its tiles' A
    // rows packed over all of K for the other column blocks (bench_gemm.py --baseline, 1 | 2
    // threads): 1024^3 0.992 | 1.065, 2048^3 0.993 | 1.010.
    auto tile_over_k = [&](int64_t bi, int64_t i0, int64_t j0, int64_t cols, const float* bcols) {
        thread_local std::vector<float> abuf;
        for (int64_t p0 = 0; p0 < g.K; p0 += kc)
            compute_rows(g, g.a_at(bi), g.C + bi * g.M * g.N, bcols + p0 * GEMM_NR, pstride, i0,
                         std::min(g.M, i0 + mc_eff), j0, cols, p0, std::min(kc, g.K - p0), mc_eff, abuf);
    };
    if (threads > 1 && (g.batch == 1 || !shared_b) && block_floats <= GEMM_OWN_B_MAX_FLOATS &&
        fmas_per_thread >= GEMM_OWN_B_MIN_FMAS * (double)block_floats) {
        // Column blocks by thread: items are the threads' slots; slot s drains the tiles of its
        // home groups ((entry, column block) pairs [lo, hi), every group some slot's home), so
        // each thread packs its own blocks only, then takes tiles from any group with two or
        // more left (a late thread's work; the last tile of a group its owner takes, packing
        // nothing more). Before, every thread took tiles from the first column block, then all
        // from the next: at 2 threads each packed all of B (1024^3: two blocks of 512 each).
        // Which thread runs a tile changes no bit.
        const uint64_t call = new_call();
        const int64_t groups = g.batch * n_j, slots = std::min(threads, groups * n_i);
        std::unique_ptr<std::atomic<int64_t>[]> taken(new std::atomic<int64_t>[groups]);
        for (int64_t q = 0; q < groups; q++) taken[q].store(0, std::memory_order_relaxed);
        auto run_tile = [&](int64_t q, int64_t ib) {
            const int64_t bi = q / n_j, jb = q % n_j;
            const int64_t j0 = jb * nc_eff, cols = std::min(nc_eff, g.N - j0), i0 = ib * mc_eff;
            thread_local OwnPacked mine;
            const auto [bcols, stale] = mine.get(block_floats, call, q);
            if (stale) pack_b(g.b_at(bi), g.sbk, g.sbj, j0, cols, 0, g.K, bcols);  // panels pstride apart
            tile_over_k(bi, i0, j0, cols, bcols);
        };
        parallel_items(slots, threads, [&](int64_t s, int64_t) {
            const int64_t lo = s * groups / slots, hi = std::min(groups, std::max(lo + 1, (s + 1) * groups / slots));
            for (int64_t q = lo; q < hi; q++)
                for (int64_t ib; (ib = taken[q].fetch_add(1, std::memory_order_relaxed)) < n_i;) run_tile(q, ib);
            for (int64_t d = 0; d < groups; d++) {
                const int64_t q = (hi + d) % groups;
                while (n_i - taken[q].load(std::memory_order_relaxed) >= 2) {
                    const int64_t ib = taken[q].fetch_add(1, std::memory_order_relaxed);
                    if (ib < n_i) run_tile(q, ib);
                }
            }
        });
        return;
    }
    const int64_t b_entries = shared_b ? 1 : g.batch;
    // Kept for this thread's next call (no page faults per call) up to GEMM_KEEP_PACKED_B floats;
    // a bigger B (K*N floats per entry) gets a buffer of its own, freed on return.
    constexpr int64_t GEMM_KEEP_PACKED_B = int64_t(1) << 24;  // 64 MiB
    thread_local std::vector<float> kept;
    std::vector<float> once;
    std::vector<float>& bpack = b_entries * panels * pstride <= GEMM_KEEP_PACKED_B ? kept : once;
    float* const bw = at_least(bpack, b_entries * panels * pstride);
    std::unique_ptr<std::atomic<uint8_t>[]> state(new std::atomic<uint8_t>[b_entries * panels]);
    for (int64_t p = 0; p < b_entries * panels; p++) state[p].store(0, std::memory_order_relaxed);
    enum : uint8_t { UNPACKED, PACKING, READY };
    // Panels [p_begin, p_end) of B's entry be packed, whoever packs them.
    auto ready = [&](int64_t be, int64_t p_begin, int64_t p_end) {
        const float* B = g.b_at(be);
        for (int64_t p = be * panels + p_begin; p < be * panels + p_end; p++) {
            uint8_t expect = UNPACKED;
            if (state[p].load(std::memory_order_acquire) == UNPACKED &&
                state[p].compare_exchange_strong(expect, PACKING, std::memory_order_acq_rel)) {
                const int64_t jp = (p - be * panels) * GEMM_NR;
                pack_b(B, g.sbk, g.sbj, jp, std::min<int64_t>(GEMM_NR, g.N - jp), 0, g.K, bw + p * pstride);
                state[p].store(READY, std::memory_order_release);
            }
        }
        for (int64_t p = be * panels + p_begin; p < be * panels + p_end; p++)
            for (int spins = 0; state[p].load(std::memory_order_acquire) != READY; spins++)
                if (spins > 1000) std::this_thread::yield();  // the packer may be descheduled
    };
    parallel_items(g.batch * n_j * n_i, threads, [&](int64_t item, int64_t) {
        // Column block major: threads working at the same time share (and pack) the same panels.
        const int64_t bi = item / (n_j * n_i), jb = item / n_i % n_j, ib = item % n_i;
        const int64_t be = shared_b ? 0 : bi;
        const int64_t j0 = jb * nc_eff, cols = std::min(nc_eff, g.N - j0), i0 = ib * mc_eff;
        ready(be, j0 / GEMM_NR, ceil_div(j0 + cols, GEMM_NR));
        tile_over_k(bi, i0, j0, cols, bw + (be * panels + j0 / GEMM_NR) * pstride);
    });
}

// A few rows, W < M <= GEMM_NR, against a B whose columns run along k (B = W^T: a Linear layer's
// forward x @ W^T for a batch of a few tokens): computed transposed, C^T = W @ x^T, with W read
// where it lies. x^T is one packed NR-wide panel ([k][NR], rows past M zero), and each item
// runs MR rows of W at a time (MR output columns) over all of K: per k, the panel's NV vectors
// times each of the MR rows' W[j][k], broadcast. Lane m of row j's accumulator is C[m][j], and
// its chain is the blocked path's: W[j][0] * x[m][0] (one rounded multiply, the same product),
// then fma(W[j][k], x[m][k], acc) for k ascending. The tile is then stored transposed. The
// blocked path packed all of W^T by transposes for at most 32 rows of FMAs. On the Intel
// machine of 2026-12-04 (stand-alone, 1 thread, medians of 2,000 calls taking turns): 32 x 256
// x 512 75.7 -> 57.2 us, 32 x 512 x 256 79.0 -> 58.3; at 16 rows (half the lanes empty) it lost
// (16 x 256 x 256: 26.9 -> 31.2), so M > W.
constexpr int64_t W_ROWS_PER_ITEM = 4;  // MR-row groups of W per item

void gemm_w_rows(const GemmArgs& g, int64_t threads) {
    const int64_t groups = ceil_div(g.N, GEMM_MR), per_item = std::min(W_ROWS_PER_ITEM, ceil_div(groups, threads));
    const int64_t blocks = ceil_div(groups, per_item), items = g.batch * blocks;
    const uint64_t call = new_call();
    parallel_items(items, std::min(threads, items), [&](int64_t item, int64_t) {
        const int64_t bi = item / blocks, j_begin = item % blocks * per_item * GEMM_MR;
        const int64_t j_end = std::min(g.N, j_begin + per_item * GEMM_MR);
        // x^T of entry bi, packed by this thread once per call and entry
        thread_local OwnPacked panel;
        thread_local std::vector<float> last_rows;
        const auto [xp, stale] = panel.get(g.K * GEMM_NR, call, bi);
        if (stale) pack_b(g.a_at(bi), g.sak, g.sai, 0, g.M, 0, g.K, xp);  // x^T as a K x M operand: one panel
        const float* B = g.b_at(bi);
        float* C = g.C + bi * g.M * g.N;
        for (int64_t j0 = j_begin; j0 < j_end; j0 += GEMM_MR) {
            const int64_t R = std::min<int64_t>(GEMM_MR, g.N - j0);
            const float* w = B + j0 * g.sbj;
            int64_t ldw = g.sbj;
            if (R < GEMM_MR) {  // the last rows: copied beside zero rows, so no read passes W's end
                float* const t = at_least(last_rows, GEMM_MR * g.K);
                for (int64_t r = 0; r < GEMM_MR; r++)
                    for (int64_t k = 0; k < g.K; k++) t[r * g.K + k] = r < R ? w[r * g.sbj + k] : 0.0f;
                w = t, ldw = g.K;
            }
            alignas(64) float tile[GEMM_MR][GEMM_NR];  // C^T's MR x NR tile: lane m of row r is C[m][j0 + r]
            micro_kernel_rows<GEMM_MR, GEMM_NV, false, true>(g.K, w, xp, &tile[0][0], GEMM_NR, true, true, GEMM_MR,
                                                             GEMM_NR, GEMM_NR, ldw);
            for (int64_t m = 0; m < g.M; m++)
                for (int64_t r = 0; r < R; r++) C[m * g.N + j0 + r] = tile[r][m];
        }
    });
}

// A few rows (M <= GEMM_B_IN_PLACE_ROWS) against a B whose rows are contiguous (sbj == 1: an
// activation, or a weight used as it is stored): B is read where it is, not packed. Each element
// of B is used by at most M / MR + 1 row panels, so packing it (a read and a write of all of B,
// then reads of the copy) cost as much as the FMAs. Items are column blocks; per NR-wide strip of
// B, the row panels run one after the other (the strip, K x NR, stays in L1/L2 for the next),
// each over all of K in one micro-kernel call (first and last: the same uninterrupted chain per
// element); A is packed once per item. A strip narrower than NR is packed (a whole NR-wide read
// of B's rows there could run past its end). On the Intel machine of 2026-12-04, against the
// packed path (this build / before, medians of 300 calls, 1 thread | 2 threads):
// dlogits^T @ h of a 10-class head, 10 x 512 x 1024: 0.50 | 0.45; 13 x 512 x 1024 0.72 | 0.63;
// 32 x 512 x 256 (the tiny Llama's dx = dy @ W) 0.79-0.83 | 0.91; 64 x 512 x 512 0.89 | 0.94.
// At 128 rows A, packed again by every item, made it lose (128 x 1024 x 256 at 2 threads: 1.10).
constexpr int64_t GEMM_B_IN_PLACE_ROWS = 64;
constexpr int64_t GEMM_B_IN_PLACE_COLS = 256;

void gemm_b_in_place(const GemmArgs& g, int64_t threads) {
    // Blocks of at most GEMM_B_IN_PLACE_COLS columns, narrower where that gives each of several
    // threads two items
    const int64_t per_entry = threads > 1 ? ceil_div(2 * threads, g.batch) : 1;
    const int64_t want = std::max(ceil_div(g.N, GEMM_B_IN_PLACE_COLS), per_entry);
    const int64_t width = round_up(ceil_div(g.N, std::min(want, ceil_div(g.N, GEMM_NR))), GEMM_NR);
    const int64_t nblocks = ceil_div(g.N, width), items = g.batch * nblocks;
    parallel_items(items, std::min(threads, items), [&](int64_t item, int64_t) {
        const int64_t bi = item / nblocks, j0 = item % nblocks * width;
        const int64_t cols = std::min(width, g.N - j0);
        thread_local std::vector<float> abuf, tail;
        float* const ap = at_least(abuf, round_up(g.M, GEMM_MR) * g.K);
        pack_a(g.a_at(bi), g.sai, g.sak, 0, g.M, 0, g.K, ap);
        const float* B = g.b_at(bi);
        float* C = g.C + bi * g.M * g.N;
        for (int64_t j = j0; j < j0 + cols; j += GEMM_NR) {
            const int64_t nr = std::min<int64_t>(GEMM_NR, j0 + cols - j);
            const float* bp = B + j;
            if (nr < GEMM_NR) {
                float* const packed = at_least(tail, GEMM_NR * g.K);
                pack_b(B, g.sbk, g.sbj, j, nr, 0, g.K, packed);
                bp = packed;
            }
            const int64_t ldb = nr < GEMM_NR ? GEMM_NR : g.sbk;
            for (int64_t i = 0; i < g.M; i += GEMM_MR)
                micro_kernel<true>(g.K, ap + i * g.K, bp, C + i * g.N + j, g.N, true, true,
                                   std::min<int64_t>(GEMM_MR, g.M - i), nr, ldb);
        }
    });
}

}  // namespace

// The pairs path sweeps all M rows of its column block, packing A at most this many rows at a
// time whatever the tile's mc: on the Intel machine of 2026-12-03 a 2048^2 GEMM at 1 thread ran
// at 131 GF/s with blocks of 48 rows against 120 with the default tile's 144 (best of 5 each,
// taking turns; 1024^2: within 3%). The tile's mc still sizes the items of gemm_tiles (cut
// smaller there, 2 threads lost ~5%) and of the windowed GEMM, whose items gather their B block
// through the windows once per mc rows (resnet18's step at mc = 48: 190 ms against 156).
constexpr int64_t GEMM_PAIR_PACK_ROWS = 48;

// gemm() halves the column blocks at several threads when that gives the pairs path two pairs a
// thread, up to this many rows. Paired against the 2-D tiles at nc 512, 2 threads, on the Intel
// machine of 2026-12-04 (B = W^T; medians of 21 pairs): 256 x 256 x 1024 0.77, 384 x 1024 x 1024
// 0.82, 512 x 64 x 1024 (the wide digits MLP's first layer) 0.91, 768 x 768 x 1024 0.96,
// 1024^3 and 1024 x 1024 x 2048 1.00, 2048 x 64 x 1024 1.08: the gain shrinks as the rows grow
// (why the tiles lose was not traced; the pairs path packs A once per column block, so twice as
// often at half the width). A few rows (GEMM_FEW_ROWS) keep their one tile a thread.
constexpr int64_t GEMM_HALF_NC_ROWS = 768;

// At one thread the pairs path's column blocks are this many times the tile's nc: it packs all
// of A once per column block, so wider blocks pack A less often (B's block, kc x nc, then 1 MiB
// at the default tile: half this machine's L2 a core). Where it splits a GEMM among threads the
// blocks stay nc wide (enough pairs for every thread). On the Intel machine of 2026-12-04
// (bench_gemm.py --baseline, this build / before, 1 thread, medians of pairs, two runs):
// 1024^3 0.973 and 0.976, 2048^3 0.981 and 0.985, 512 x 512 x 1024 (B = W^T) 0.991, 512 x 256
// x 1024 (A transposed) 1.018 and 0.985, 512^3 1.007.
constexpr int64_t GEMM_ONE_THREAD_NC_FACTOR = 2;

// At several threads, a matrix of at least this many rows (one batch entry) takes column blocks
// GEMM_WIDE_NC_FACTOR times the tile's nc: A is packed once per column block, and the 2-D tiles
// of gemm_tiles still give every thread several items where the pairs path (which needs two
// column blocks a thread) would have cut N into four blocks at 2 threads. On the Intel machine of
// 2026-12-05 (stand-alone, 2 threads, nc 1024 against 512, medians of 24-30 calls taking turns):
// 2048^3 0.98, 2048 x 512 x 2048 0.986, 4096 x 1024 x 1024 1.00; with fewer rows it did not pay
// (1024^3 1.012, 800 x 1024 x 2048 1.009, 1024 x 1024 x 2048 0.993). Since 2026-12-06 such a
// matrix whose columns cut evenly among the threads takes the pairs path instead (2048^3 at 2
// threads: even_column_blocks, below); these tiles serve the rest (e.g. 2048^3 at 3+ threads).
constexpr int64_t GEMM_WIDE_NC_ROWS = 2048;
constexpr int64_t GEMM_WIDE_NC_FACTOR = 2;

// At several threads, one matrix of more than GEMM_HALF_NC_ROWS rows whose N cuts into a few
// column blocks a thread, all about as wide, each from nc to GEMM_WIDE_NC_FACTOR x nc: the
// pairs path on those blocks, each thread then running the 1-thread way on its own columns (B
// packed a K block at a time for all M rows, C reloaded per K block), not the 2-D tiles (a
// thread's column block packed over all of K, read again for each tile; why they lose here was
// not traced: this machine has no hardware counters). On the Intel machine of 2026-12-06
// (stand-alone, 2 threads, calls taking turns, min | median against the tiles): 2048^3 0.95 |
// 0.95 and 0.96 | 0.96, 2048 x 2048 x 1024 0.93 | 0.93, 1536^3 0.94 | 0.94, 2048 x 512 x 2048
// 0.96 | 0.96, 2048 x 1024 x 2048 0.96 | 0.96, 3072 x 1024 x 1024 0.97 | 0.98, 1280 x 2048 x
// 2048 0.97 | 0.98, 1024 x 1024 x 2048 0.96 | 0.96; 1024^3 0.98 | 1.00 (bench_gemm.py
// --baseline, paired: 2048^3 0.949, 1024^3 0.989). But blocks one a thread give a late thread
// nothing to take (the tiles' reason for several items a thread): with a busy process on one of
// the two cores, medians against the tiles were 2048^3 1.04 and 1024^3 1.15. So only where a
// thread's share is at least GEMM_EVEN_BLOCKS_MIN_FMAS (1024^3 at 2 threads is half of it);
// at 8 threads or more it also needs N of 4096 or more (blocks of at least nc). A matrix whose N
// fits one block of the 1-thread width takes row bands instead (GEMM_BAND_MIN_ROWS; 2048 x 2048 x
// 1024 above, among others). Since 2026-12-06 a thread done with its block also takes row blocks
// of a late thread's (RowRegions).
// Returns the blocks' width, or 0 where N does not cut so: `threads` x m blocks for the least m
// whose width is at most GEMM_WIDE_NC_FACTOR x nc, if that width is at least nc and the blocks
// pad N by under a quarter block (the last one then at least 3/4 as wide as the others).
constexpr double GEMM_EVEN_BLOCKS_MIN_FMAS = double(int64_t(1) << 30);
static int64_t even_column_blocks(int64_t N, int64_t threads, int64_t nc) {
    for (int64_t n = threads;; n += threads) {
        const int64_t width = round_up(ceil_div(N, n), GEMM_NR);
        if (width <= GEMM_WIDE_NC_FACTOR * nc || width == GEMM_NR)  // (NR: a test's tiny nc)
            return width >= nc && 4 * (n * width - N) < width ? width : 0;
    }
}

// At several threads, one matrix of more than GEMM_HALF_NC_ROWS rows whose N fits one column
// block of the 1-thread width (nc to GEMM_ONE_THREAD_NC_FACTOR x nc): the pairs path on row
// bands, one a thread, each band swept the 1-thread way (B packed a K block at a time, all of N
// wide, then the band's rows) -- not the 2-D tiles, nor column blocks cut among the threads.
// The tiles hold a thread's column block packed over all of K (2 MiB at 1024^2, this machine's
// L2 a core), read again for every tile; column blocks among the threads halve the width
// swept per packed row block of A and pack all of A once per block. A band packs its own rows of
// A once and all of B once. On the Intel machine of 2026-12-06 (2 threads, separate processes
// taking turns, medians of 60 calls, three each; M x K x N, tiles or even blocks -> bands):
// 1024^3 6.93-7.11 -> 6.74-6.94 ms, 1024 x 512 x 1024 3.40-3.46 -> 3.34-3.37, 1536 x 1024 x
// 1024 10.46-10.48 -> 10.00-10.11, 2048 x 1024 x 1024 13.84-14.02 -> 13.30-13.35 (its even
// blocks before), 2048 x 1024 x 768 10.73-10.81 -> 10.01-10.22, 1024 x 2048 x 1024 14.02-14.30
// -> 13.61-13.63, 2048 x 2048 x 1024 27.8-28.1 -> 26.7-26.8, 800 x 1024 x 1024 5.44-5.57 ->
// 5.35-5.44. Not where N is narrower than nc (2048 x 1024 x 256: 3.59-3.94 -> 3.69-3.77) nor
// wider than one block (2048^3 53.4-53.7 -> 53.9-54.9 as two bands of two blocks: the even
// blocks pack less there). Bands one a thread leave nothing for a late thread to take, as the
// even blocks do (see even_column_blocks); each band has at least GEMM_BAND_MIN_ROWS rows, so
// its FMAs outweigh its packing of all of B (K x N).
constexpr int64_t GEMM_BAND_MIN_ROWS = 384;

// A thread that splits a late thread's region (RowRegions) must take at least this many row
// blocks of each K block it covers: it packs each of those K blocks of B again (kc x 1024 floats
// at the default tile), estimated at about 1.25 row blocks' FMAs from two figures of this
// machine on 2026-12-06: a thread's half of B for 1024^3 (512K floats) took 0.4 ms to pack in
// the tiles, and a row block (48 x 1024 x 256 FMAs) takes 0.16 ms at 160 GF/s. Not tuned.
constexpr int64_t GEMM_HELP_MIN_ROW_BLOCKS = 4;

// The pairs path's items when it has one a thread (row bands, even column blocks), each row
// blocks 0 .. n of pack_rows rows over K blocks 0 .. n_kb - 1, K block major, shared out so that
// a thread done with its own item takes part of a late thread's. A region is row blocks
// [lo, end) of one item from some K block on; its owner runs them block after block, claiming
// one row block at a time from one atomic word (K block p, next row block r, end L). A thread
// with nothing left splits the region with the most work left: with r < L it moves the end to s
// (r < s < L) in the same word, and row blocks [s, L) from block p on become a region of its
// own. Its rows' blocks before p are done: the owner claimed block p's first row block only
// after its block p - 1 had ended. So every element's chain still runs its K blocks in order,
// one thread after another at most, and which thread runs a row block changes no bit. A split
// must leave the new region at least GEMM_HELP_MIN_ROW_BLOCKS row blocks.
class RowRegions {
  public:
    template <class ChunksOf>
    RowRegions(int64_t items, int64_t n_kb, ChunksOf chunks_of)
        : n_kb_(n_kb), initial_(items), capacity_(items > 0 ? items + MAX_SPLITS : 0), count_(items),
          regions_(capacity_ > 0 ? new Region[capacity_] : nullptr) {  // none at all off the helped path (every 1-thread GEMM)
        for (int64_t i = 0; i < items; i++) {
            regions_[i].item = i, regions_[i].lo = 0;
            regions_[i].state.store(pack(0, 0, chunks_of(i)), std::memory_order_relaxed);
        }
    }

    // Runs region q's row blocks to the end, as they are claimed: run(item, p, r_begin, r_end).
    template <class Run>
    void drain(int64_t q, Run& run) {
        Region& g = regions_[q];
        const bool helping = q >= initial_;
        for (uint64_t st = g.state.load(std::memory_order_acquire); std::get<2>(unpack(st)) > 0;) {
            const auto [p, r, end] = unpack(st);
            int64_t cp = p, cr = r;
            if (r >= end) {
                if (p + 1 >= n_kb_) return;
                cp = p + 1, cr = g.lo;
            }
            if (!g.state.compare_exchange_weak(st, pack(cp, cr + 1, end), std::memory_order_acq_rel)) continue;
            run(g.item, cp, cr, cr + 1);
            if (helping) gemm_helped_blocks.fetch_add(1, std::memory_order_relaxed);
            st = g.state.load(std::memory_order_acquire);
        }
    }

    // Splits the region with the most row blocks left that can be split now (see the class);
    // returns the new region's index, or -1 where no region can be split now or later. A region
    // between two K blocks (its owner running the last row block of one) can be split once its
    // owner has claimed the next block's first: until then this thread waits.
    int64_t split_largest() {
        for (int spins = 0;; spins++) {
            const int64_t n = std::min(count_.load(std::memory_order_acquire), capacity_);
            int64_t best = -1, best_left = 0, best_s = 0;
            uint64_t best_st = 0;
            bool later = false;
            for (int64_t q = 0; q < n; q++) {
                const uint64_t st = regions_[q].state.load(std::memory_order_acquire);
                const auto [p, r, end] = unpack(st);
                if (end == 0) continue;  // not yet published (or an empty region): lo not to be read
                const int64_t lo = regions_[q].lo, after = n_kb_ - 1 - p;
                later = later || (after > 0 && end - lo >= 2 * GEMM_HELP_MIN_ROW_BLOCKS + 2);
                // Even shares of what is left: the owner rows [r, s) of block p and [lo, s) of
                // each later one, the new region rows [s, end) of block p and every later one.
                const int64_t s = std::max(r + 1, ceil_div(end * (after + 1) + r + lo * after, 2 * (after + 1)));
                const int64_t left = (end - r) + after * (end - lo);
                if (end - s >= GEMM_HELP_MIN_ROW_BLOCKS && left > best_left)
                    best = q, best_left = left, best_s = s, best_st = st;
            }
            if (best >= 0) {
                const int64_t q = count_.fetch_add(1, std::memory_order_acq_rel);
                if (q >= capacity_) return -1;
                const auto [p, r, end] = unpack(best_st);
                Region& mine = regions_[q];
                mine.item = regions_[best].item, mine.lo = best_s;
                // Published only once the owner's end has moved: until then no one may split it.
                if (regions_[best].state.compare_exchange_strong(best_st, pack(p, r, best_s), std::memory_order_acq_rel)) {
                    mine.state.store(pack(p, best_s, end), std::memory_order_release);
                    return q;
                }
                continue;  // the owner claimed a row block meanwhile: look again
            }
            if (!later) return -1;
            if (spins > 1000) std::this_thread::yield();
        }
    }

  private:
    static constexpr int64_t MAX_SPLITS = 256;
    static constexpr int BITS = 21;  // row blocks and K blocks below 2^21 each
    struct Region {
        int64_t item = 0, lo = 0;
        std::atomic<uint64_t> state{0};  // end 0: not published (or empty)
    };
    static uint64_t pack(int64_t p, int64_t r, int64_t end) {
        return (uint64_t)p << (2 * BITS) | (uint64_t)r << BITS | (uint64_t)end;
    }
    static std::tuple<int64_t, int64_t, int64_t> unpack(uint64_t st) {
        const uint64_t mask = (uint64_t(1) << BITS) - 1;
        return {(int64_t)(st >> (2 * BITS)), (int64_t)(st >> BITS & mask), (int64_t)(st & mask)};
    }
    const int64_t n_kb_, initial_, capacity_;
    std::atomic<int64_t> count_;
    std::unique_ptr<Region[]> regions_;
};


// At most this K, a GEMM is mostly its stores of C (a classifier's backward dlogits @ W, K = the
// classes): one column block as wide as C, so C is written in whole rows, not in column blocks;
// at one thread the pairs path packs and sweeps its rows MR at a time. Paired against the
// column blocks of nc (bench_gemm.py --baseline, Intel machine of 2026-12-04, 1 | 2 threads):
// 512 x 10 x 1024 0.86-0.89 | 0.71-0.83, 256 x 8 x 4096 0.77 | 0.80, 1024 x 16 x 1024 0.91 |
// 0.95, 2048 x 16 x 512 (one block before too) 0.97 | 0.99. MR-row tiles at 2 threads made that
// last one lose (1.14: 171 items of 12 rows); at K = 64 (512 x 64 x 1024) the whole width lost
// (398 | 233 us against 387 | 216).
constexpr int64_t GEMM_TINY_K = 16;

void gemm(const GemmArgs& g, int64_t threads, int64_t mc, int64_t kc, int64_t nc) {
    const double fmas = (double)g.batch * (double)g.M * (double)g.N * (double)g.K;
    threads = threads_for(threads, g.batch * g.M, fmas, GEMM_MIN_FMAS);
    if (g.N <= SMALL_GEMM_MAX_N && (g.M * g.N * g.K <= SMALL_GEMM_MAX_WORK || g.N <= W)) {
        gemm_small(g, threads);
        return;
    }
    // Entries of A that follow each other row after row, against one B, are one taller matrix
    // (a Linear layer's input x (B, T, H) @ W^T): the same chain per element, and the items
    // are then cut from all the rows together, so each B panel is packed once and used by the
    // thread that packed it. As a batch, the tiny Llama's 2 x 16 rows at 2 threads had items of
    // both entries share every panel across the threads: 0.047-0.095 ms a call, against 0.081
    // at 1 thread.
    if (g.batch > 1 && g.one_b() && g.aoff == nullptr && g.sab == g.M * g.sai) {
        GemmArgs rows = g;
        rows.M = g.batch * g.M;
        rows.batch = 1;
        rows.sab = 0;
        gemm(rows, threads, mc, kc, nc);
        return;
    }
    // After the fold: a few rows against W^T read W in place, transposed (gemm_w_rows).
    if (g.sbk == 1 && g.M > W && g.M <= GEMM_NR && g.N >= GEMM_MR) {
        gemm_w_rows(g, threads);
        return;
    }
    // After the fold: a batch of a few rows against one B reads that B once per strip, for all
    // entries' rows, not once per entry.
    if (g.M <= GEMM_B_IN_PLACE_ROWS && g.sbj == 1 && g.N >= GEMM_NR) {
        gemm_b_in_place(g, threads);
        return;
    }
    // One matrix of many rows at several threads (neither of the first two rules below applies):
    // row bands one a thread where N fits one block of the 1-thread width (GEMM_BAND_MIN_ROWS),
    // else column blocks cut evenly among the threads (even_column_blocks) where the matrix is
    // large enough for them; 0 where not.
    const bool one_big = threads > 1 && g.batch == 1 && g.K > GEMM_TINY_K && g.M > GEMM_HALF_NC_ROWS;
    const int64_t bands = one_big && g.N >= nc && g.N <= GEMM_ONE_THREAD_NC_FACTOR * nc &&
                                  g.M >= GEMM_BAND_MIN_ROWS * threads
                              ? threads
                              : 1;
    const int64_t even_nc = one_big && bands == 1 && fmas >= GEMM_EVEN_BLOCKS_MIN_FMAS * (double)threads
                                ? even_column_blocks(g.N, threads, nc)
                                : 0;
    // A tiny K: whole rows of C at a time (see GEMM_TINY_K).
    if (g.K <= GEMM_TINY_K) {
        nc = round_up(g.N, GEMM_NR);
        if (threads == 1) mc = GEMM_MR;  // the pairs path's rows; at several, gemm_tiles' tiles
    }
    // At several threads, column blocks half as wide when that gives every thread two pairs,
    // for at most GEMM_HALF_NC_ROWS rows: the pairs path then beats the 2-D tiles of gemm_tiles.
    else if (threads > 1 && g.M > GEMM_FEW_ROWS && g.M <= GEMM_HALF_NC_ROWS && g.batch * ceil_div(g.N, nc) < 2 * threads) {
        const int64_t half = round_up(ceil_div(nc, 2), GEMM_NR);
        if (g.batch * ceil_div(g.N, half) >= 2 * threads) nc = half;
    }
    // At several threads, one matrix of many rows whose N fits one block of the 1-thread width:
    // that block, in row bands (see GEMM_BAND_MIN_ROWS).
    else if (bands > 1) {
        nc = round_up(g.N, GEMM_NR);
    }
    // At several threads, one matrix of many rows whose columns cut evenly among the threads:
    // the pairs path on those blocks (see even_column_blocks).
    else if (even_nc > 0) {
        nc = even_nc;
    }
    // At several threads, one tall matrix: column blocks twice as wide (see GEMM_WIDE_NC_ROWS).
    else if (threads > 1 && g.batch == 1 && g.M >= GEMM_WIDE_NC_ROWS) {
        nc *= GEMM_WIDE_NC_FACTOR;
    }
    const int64_t n_nblocks = ceil_div(g.N, nc);
    const int64_t n_pairs = g.batch * n_nblocks;
    // A few rows of several entries against one B that did not fold into one matrix (A's
    // entries have rows between them): B is then most of the work, and gemm_tiles packs it once
    // for all entries, at one thread too.
    const bool few_rows_one_b = g.batch > 1 && g.M <= GEMM_FEW_ROWS_ONE_B && g.one_b();
    if ((threads <= 1 && !few_rows_one_b) || (threads > 1 && (bands > 1 || even_nc > 0 || n_pairs >= 2 * threads))) {
        threads = std::max<int64_t>(1, std::min(threads, n_pairs * bands));
        if (threads == 1 && g.K > GEMM_TINY_K) nc *= GEMM_ONE_THREAD_NC_FACTOR;
        const int64_t blocks = ceil_div(g.N, nc), band_rows = round_up(ceil_div(g.M, bands), GEMM_MR);
        const int64_t items = g.batch * blocks * bands, pack_rows = std::min(mc, GEMM_PAIR_PACK_ROWS);
        // One item a thread (row bands, even column blocks): a thread done with its own item
        // takes part of a late one's (RowRegions), packing that item's B blocks itself.
        const bool helped = threads > 1 && items <= threads;
        const int64_t n_kb = ceil_div(g.K, kc);
        auto item_rows = [&](int64_t item) {
            const int64_t i_begin = std::min(g.M, item % bands * band_rows);
            return std::pair<int64_t, int64_t>{i_begin, std::min(g.M, i_begin + band_rows)};
        };
        auto row_blocks = [&](int64_t item) {
            const auto [i_begin, i_end] = item_rows(item);
            return ceil_div(i_end - i_begin, pack_rows);
        };
        RowRegions regions(helped ? items : 0, n_kb, row_blocks);
        parallel_items(items, threads, [&](int64_t slot, int64_t) {
            // Kept by each thread from call to call: fresh buffers of this size were zero-filled
            // and page-faulted on every call (0.5-1 MiB of B block at the default tile).
            thread_local std::vector<float> abuf, bbuf;
            float* const bp = at_least(bbuf, round_up(nc, GEMM_NR) * kc);
            // Row blocks [r_begin, r_end) of `item` for K block p, its B block packed here unless
            // this thread's buffer holds it (`packed`: item, block).
            std::pair<int64_t, int64_t> packed{-1, -1};
            auto run = [&](int64_t item, int64_t p, int64_t r_begin, int64_t r_end) {
                const int64_t bi = item / (blocks * bands);
                const int64_t j0 = (item / bands % blocks) * nc, cols = std::min(nc, g.N - j0);
                const auto [i_begin, i_end] = item_rows(item);
                const int64_t p0 = p * kc, kcur = std::min(kc, g.K - p0);
                if (packed != std::pair<int64_t, int64_t>{item, p}) {
                    pack_b(g.b_at(bi), g.sbk, g.sbj, j0, cols, p0, kcur, bp);
                    packed = {item, p};
                }
                const int64_t r0 = i_begin + r_begin * pack_rows;
                const int64_t r1 = std::min(i_end, i_begin + r_end * pack_rows);
                compute_rows(g, g.a_at(bi), g.C + bi * g.M * g.N, bp, kcur * GEMM_NR, r0, r1, j0, cols, p0, kcur,
                             pack_rows, abuf, i_end);
            };
            if (!helped) {
                for (int64_t p = 0; p < n_kb; p++) run(slot, p, 0, row_blocks(slot));
                return;
            }
            if (const int64_t late = gemm_late_item_us.load(std::memory_order_relaxed); slot == 1 && late > 0)
                std::this_thread::sleep_for(std::chrono::microseconds(late));
            regions.drain(slot, run);
            for (int64_t r; (r = regions.split_largest()) >= 0;) regions.drain(r, run);
        });
        return;
    }
    gemm_tiles(g, threads, mc, kc, nc);
}

}  // namespace repops_cpu
