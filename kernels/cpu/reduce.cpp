// SPDX-License-Identifier: MIT
//
// reduce.cpp — order-critical folds of the RepOps CPU kernels: reductions over the last axis of
// a strided (R, K) view (out[r] = fold over k ascending; sum, max, mean, min) and the scatter-add
// of embedding backward. Output elements go to lanes and threads; the k order of one output
// never changes.

#include <vector>

#include "kernels.h"

namespace repops_cpu {
namespace {

inline float reduce_step(int64_t op, float acc, float x) {
    return op == RP_REDUCE_MAX ? max_spec(acc, x) : op == RP_REDUCE_MIN ? min_spec(acc, x) : acc + x;
}
inline Vec vreduce_step(int64_t op, Vec acc, Vec x) {
    return op == RP_REDUCE_MAX ? vmax_spec(acc, x) : op == RP_REDUCE_MIN ? vmin_spec(acc, x) : vadd(acc, x);
}

#ifdef REPOPS_HAVE_ROWS8
// Rows-to-lanes path for reductions along a unit-stride axis (the common "reduce the last
// dimension" case): 8 rows at a time, each 8x8 block of x transposed in registers (simd.h) so
// that lane i carries row i's chain; the k order per row is unchanged.
template <int OP>
inline __m256 y_step(__m256 acc, __m256 x) {
    if (OP == RP_REDUCE_SUM || OP == RP_REDUCE_MEAN) return _mm256_add_ps(acc, x);
    return y_extreme_spec<OP == RP_REDUCE_MAX>(acc, x);
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
            const __m256 col = y_column8(X + 8 * g * sr + k, sr);
            acc[g] = k == 0 ? col : y_step<OP>(acc[g], col);
        }
    }
    for (int g = 0; g < G; g++) {
        const __m256 v = OP == RP_REDUCE_MEAN ? _mm256_div_ps(acc[g], _mm256_set1_ps(kf)) : acc[g];
        _mm256_storeu_ps(O + 8 * g, y_canon(v));
    }
}

template <int OP>
void reduce_rows_unit_k(const float* X, int64_t sr, int64_t K, float kf, float* O, int64_t& r, int64_t r1) {
    for (; r + 32 <= r1; r += 32) reduce_rows8<OP, 4>(X + r * sr, sr, K, kf, O + r);
    for (; r + 8 <= r1; r += 8) reduce_rows8<OP, 1>(X + r * sr, sr, K, kf, O + r);
}
#endif

}  // namespace

// out[r] = fold_k X[r*sr + k*sk], r < R, K >= 1 (the caller checked the addresses).
void reduce_into(const float* X, int64_t R, int64_t K, int64_t sr, int64_t sk, int64_t op, float* O,
                 int64_t threads) {
    const float kf = (float)K;  // mean divides by K rounded to binary32 once
    // Items of whole rows: a multiple of 64 (the widest row group below: 4 vectors of W), about four per
    // thread, at most 4096. One fold over a single row (R = 1) is one chain: one thread.
    constexpr int64_t GROUP = 64;
    threads = threads_for(threads, ceil_div(R, GROUP), (double)R * (double)K, FOLD_MIN_ELEMS);
    const int64_t rows = std::min<int64_t>(4096, round_up(ceil_div(R, 4 * threads), GROUP));
    parallel_items(ceil_div(R, rows), threads, [&](int64_t item, int64_t) {
        const int64_t r0 = item * rows, r1 = std::min(R, r0 + rows);
        int64_t r = r0;
        if (sr == 1) {
            // Output elements are adjacent in memory: one lane per output, k sequential.
            for (; r + 4 * W <= r1; r += 4 * W) {
                Vec acc[4];
                for (int u = 0; u < 4; u++) acc[u] = vload(X + r + u * W);
                for (int64_t k = 1; k < K; k++)
                    for (int u = 0; u < 4; u++) acc[u] = vreduce_step(op, acc[u], vload(X + r + u * W + k * sk));
                for (int u = 0; u < 4; u++) {
                    if (op == RP_REDUCE_MEAN) acc[u] = vdiv(acc[u], vbcast(kf));
                    vstore(O + r + u * W, vcanon(acc[u]));
                }
            }
        }
#ifdef REPOPS_HAVE_ROWS8
        if (sk == 1) {
            switch (op) {
                case RP_REDUCE_SUM: reduce_rows_unit_k<RP_REDUCE_SUM>(X, sr, K, kf, O, r, r1); break;
                case RP_REDUCE_MAX: reduce_rows_unit_k<RP_REDUCE_MAX>(X, sr, K, kf, O, r, r1); break;
                case RP_REDUCE_MEAN: reduce_rows_unit_k<RP_REDUCE_MEAN>(X, sr, K, kf, O, r, r1); break;
                default: reduce_rows_unit_k<RP_REDUCE_MIN>(X, sr, K, kf, O, r, r1); break;
            }
        }
#endif
        // Remaining rows: four independent scalar chains at a time for latency hiding.
        for (; r + 4 <= r1; r += 4) {
            float acc[4];
            for (int u = 0; u < 4; u++) acc[u] = X[(r + u) * sr];
            for (int64_t k = 1; k < K; k++)
                for (int u = 0; u < 4; u++) acc[u] = reduce_step(op, acc[u], X[(r + u) * sr + k * sk]);
            for (int u = 0; u < 4; u++) O[r + u] = canon(op == RP_REDUCE_MEAN ? acc[u] / kf : acc[u]);
        }
        for (; r < r1; r++) {
            float acc = X[r * sr];
            for (int64_t k = 1; k < K; k++) acc = reduce_step(op, acc, X[r * sr + k * sk]);
            O[r] = canon(op == RP_REDUCE_MEAN ? acc / kf : acc);
        }
    });
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
    const int64_t n_items = ceil_div(V, ROWS_PER_ITEM);
    threads = threads_for(threads, n_items, (double)(P + V) * (double)R, SCATTER_MIN_ELEMS);
    parallel_items(n_items, threads, [&](int64_t item, int64_t) {
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

}  // namespace repops_cpu
