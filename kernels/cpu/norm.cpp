// SPDX-License-Identifier: MIT
//
// norm.cpp — the row dot products of the normalisation compositions (verde_chain/repops/library/
// nn.py): layer norm's variance and RMSNorm's mean square (reduce_meansq: x*x), and the backward
// passes' sums of g*y and gs*xhat (reduce_dot), each a chain over one row of 16-1024 elements
//   acc = a[0]*b[0]                (one rounded multiply)
//   acc = fma(a[k], b[k], acc)     k = 1 .. K-1 ascending
// as the spec fixes it (kernels.h). The interpreter ran these one block of lanes per 256 rows
// with per-lane address tables; here rows go to vector lanes
// (rows adjacent in memory, or one row broadcast: a GEMV) or to eight interleaved scalar chains
// (rows of contiguous k), never a row split over lanes.

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
