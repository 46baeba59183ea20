// SPDX-License-Identifier: MIT
//
// norm.cpp — the row dot products of the normalisation compositions (verde_chain/repops/library/
// nn.py): layer norm's variance and RMSNorm's mean square (reduce_meansq: x*x), and the backward
// passes' sums of g*y and gs*xhat (reduce_dot), each a chain over one row of 16-1024 elements
//   acc = a[0]*b[0]                (one rounded multiply)
//   acc = fma(a[k], b[k], acc)     k = 1 .. K-1 ascending
// as the spec fixes it (kernels.h). The interpreter ran these one block of lanes per 256 rows
// with per-lane address tables; here rows go to vector lanes (rows adjacent in memory, or one
// row broadcast: a GEMV; rows of contiguous k: 8x8 blocks transposed in registers) or, on the
// scalar build and for other strides, to eight interleaved scalar chains; never a row split
// over lanes.

#include <cmath>

#include "kernels.h"
#include "tensors.h"

namespace repops_cpu {

namespace {
// rows [r, r + N) as N independent scalar chains (latency hidden across rows); N a constant so
// the accumulators stay in registers
template <int N>
inline void rowdot_scalar(const float* A, const float* B, int64_t r, int64_t K, int64_t sra, int64_t ska, int64_t srb,
                          int64_t skb, float* O) {
    float acc[N];
    for (int u = 0; u < N; u++) acc[u] = A[(r + u) * sra] * B[(r + u) * srb];
    for (int64_t k = 1; k < K; k++)
        for (int u = 0; u < N; u++) acc[u] = std::fma(A[(r + u) * sra + k * ska], B[(r + u) * srb + k * skb], acc[u]);
    for (int u = 0; u < N; u++) O[r + u] = canon(acc[u]);
}

#ifdef REPOPS_HAVE_ROWS8
// Rows of contiguous k (the norms' statistics over the last axis: row stride K, k stride 1)
// to lanes: each 8x8 block of an operand transposed in registers (simd.h transpose8), so lane
// i carries row i's chain, k ascending: a lane-wise MUL for k = 0, lane-wise FMAs after (one
// rounding each, as std::fma), the same operations as rowdot_scalar. A's blocks are 8 rows
// loaded and transposed; B's the same (ROWS), or, with row stride 0 (a GEMV's vector), each k
// broadcast to every lane (BCAST), or A's own (SAME: a mean square, one transpose for both).
enum RowRead { ROWS, BCAST, SAME };

template <int MODE>
inline void block8(const float* p, int64_t sr, __m256 blk[8]) {
    if (MODE == BCAST) {
        for (int j = 0; j < 8; j++) blk[j] = _mm256_broadcast_ss(p + j);
    } else {
        for (int i = 0; i < 8; i++) blk[i] = _mm256_loadu_ps(p + i * sr);
        transpose8(blk);  // blk[j] lane i = row i's element k + j
    }
}

// Rows 0 .. 8G-1 of A (row stride sra) and B (srb), unit k stride, K >= 1; writes O[0 .. 8G-1].
// G groups of 8 rows: G independent chains to hide the FMA latency.
template <int MB, int G>
void rowdot_rows8(const float* A, int64_t sra, const float* B, int64_t srb, int64_t K, float* O) {
    __m256 acc[G];
    auto block_step = [&](int64_t k, bool first) {
        for (int g = 0; g < G; g++) {
            __m256 a[8], b[8];
            block8<ROWS>(A + 8 * g * sra + k, sra, a);
            if (MB != SAME) block8<MB>(B + 8 * g * srb + k, srb, b);
            const __m256* bb = MB == SAME ? a : b;
            int j = 0;
            if (first) acc[g] = _mm256_mul_ps(a[0], bb[0]), j = 1;
            for (; j < 8; j++) acc[g] = _mm256_fmadd_ps(a[j], bb[j], acc[g]);
        }
    };
    int64_t k = 0;
    if (K >= 8) {
        block_step(0, true);
        for (k = 8; k + 8 <= K; k += 8) block_step(k, false);
    }
    for (; k < K; k++)  // the K tail (all of K < 8) one k at a time
        for (int g = 0; g < G; g++) {
            const __m256 a = y_column8(A + 8 * g * sra + k, sra);
            const __m256 b = MB == SAME ? a : y_column8(B + 8 * g * srb + k, srb);
            acc[g] = k == 0 ? _mm256_mul_ps(a, b) : _mm256_fmadd_ps(a, b, acc[g]);
        }
    for (int g = 0; g < G; g++) _mm256_storeu_ps(O + 8 * g, y_canon(acc[g]));
}

// Groups of G = 4 (32 rows) when one operand streams rows, G = 2 (16 rows) when both do: 32 row
// streams at most (512 rows x 768, AVX-512 machine, 2026-12-02: both operands in 4 groups took
// 1.8x the time of 2 groups; a mean square in 4 groups 0.85x that of 2).
template <int MB>
void rowdot_rows_unit_k(const float* A, int64_t sra, const float* B, int64_t srb, int64_t K, float* O, int64_t& r,
                        int64_t r1) {
    constexpr int G = MB == ROWS ? 2 : 4;
    for (; r + 8 * G <= r1; r += 8 * G) rowdot_rows8<MB, G>(A + r * sra, sra, B + r * srb, srb, K, O + r);
    for (; r + 8 <= r1; r += 8) rowdot_rows8<MB, 1>(A + r * sra, sra, B + r * srb, srb, K, O + r);
}
#endif
}  // namespace

void rowdot_into(const float* A, const float* B, int64_t R, int64_t K, int64_t sra, int64_t ska, int64_t srb,
                 int64_t skb, float* O, int64_t threads) {
    constexpr int64_t GROUP = 64;
    threads = threads_for(threads, ceil_div(R, GROUP), 2.0 * (double)R * (double)K, FOLD_MIN_ELEMS);
    const int64_t rows = std::min<int64_t>(4096, round_up(ceil_div(R, 4 * threads), GROUP));
    parallel_items(ceil_div(R, rows), threads, [&](int64_t item, int64_t) {
        const int64_t r1 = std::min(R, (item + 1) * rows);
        int64_t r = item * rows;
        if ((sra == 0 || sra == 1) && (srb == 0 || srb == 1)) {
            // W adjacent rows per vector (an operand with row stride 0, a GEMV's vector, is
            // broadcast to every lane), two vectors interleaved
            auto ld = [](const float* p, int64_t sr) { return sr == 1 ? vload(p) : vbcast(*p); };
            for (; r + 2 * W <= r1; r += 2 * W) {
                const float* a = A + r * sra;
                const float* b = B + r * srb;
                Vec acc[2];
                for (int u = 0; u < 2; u++) acc[u] = vmul(ld(a + u * W * sra, sra), ld(b + u * W * srb, srb));
                for (int64_t k = 1; k < K; k++)
                    for (int u = 0; u < 2; u++)
                        acc[u] = vfma(ld(a + u * W * sra + k * ska, sra), ld(b + u * W * srb + k * skb, srb), acc[u]);
                for (int u = 0; u < 2; u++) vstore(O + r + u * W, vcanon(acc[u]));
            }
        }
#ifdef REPOPS_HAVE_ROWS8
        if (ska == 1 && skb == 1) {
            if (A == B && sra == srb)
                rowdot_rows_unit_k<SAME>(A, sra, B, srb, K, O, r, r1);
            else if (srb == 0 && sra != 0)
                rowdot_rows_unit_k<BCAST>(A, sra, B, srb, K, O, r, r1);
            else if (sra == 0 && srb != 0)  // swapped: a*b, fma(a, b, c) commute (NaN payloads: canon)
                rowdot_rows_unit_k<BCAST>(B, srb, A, sra, K, O, r, r1);
            else if (sra != 0)
                rowdot_rows_unit_k<ROWS>(A, sra, B, srb, K, O, r, r1);
        }
#endif
        for (; r + 8 <= r1; r += 8) rowdot_scalar<8>(A, B, r, K, sra, ska, srb, skb, O);
        for (; r < r1; r++) rowdot_scalar<1>(A, B, r, K, sra, ska, srb, skb, O);
    });
}

namespace {
torch::Tensor rowdot(const torch::Tensor& a, const torch::Tensor& b, int64_t threads) {
    check_f32_cpu(a, "a");
    check_f32_cpu(b, "b");
    TORCH_CHECK(a.dim() == 2 && a.sizes() == b.sizes(), "rowdot takes two (rows, K) views of one shape");
    const int64_t R = a.size(0), K = a.size(1);
    TORCH_CHECK(K > 0, "a dot product over an empty axis");
    torch::Tensor out = torch::empty({R}, a.options());
    if (R == 0) return out;
    rowdot_into(a.data_ptr<float>(), b.data_ptr<float>(), R, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                out.data_ptr<float>(), threads);
    return out;
}
}  // namespace

void bind_norm(pybind11::module& m) {
    m.def("rowdot", &rowdot, "per-row dot products of two (rows, K) views in the spec's chain", pybind11::arg("a"),
          pybind11::arg("b"), pybind11::arg("threads"));
}

}  // namespace repops_cpu
