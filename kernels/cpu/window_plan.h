// SPDX-License-Identifier: MIT
//
// window_plan.h — the window-extension nodes of the whole-step plan (step_plan.cpp): the
// windowed GEMM (convolution and its gradients), the gather of a windowed operand into a dense
// scratch tensor (pooling, batch-norm statistics: the dewindowed descriptors of
// repops/windowed.py) and the permuting copy that puts a GEMM's (batch, m, n) result in the
// output's order. The plan owns each operand's tables; the data pointers come per run.
#pragma once

#include <torch/extension.h>

#include <vector>

#include "kernels.h"

namespace repops_cpu {

// A windowed operand's tables (repops/windowed.py, Operand), owned and checked.
struct WinTables {
    std::vector<int64_t> rows, ks, wins;
    int64_t R = 0, nchk = 0, K = 0;
    uint32_t fill = 0;
    WinOperand on(const uint32_t* data, int64_t numel) const {
        return WinOperand{data, numel, rows.data(), ks.data(), R, nchk, wins.data(), fill};
    }
};

// The max-pool backward in scatter form (repops/windowed.py MaxPoolBackward): per windowed
// (trailing) output axis i < r, S (output extent), O (entries), div, k_mul, offset, stride (of an
// entry in both inputs), and the tap digit kd_i(t) = (t / dstride) % dsize; plane p's entries
// start at plane_off[p]. Checked: every entry of the (planes x O) box lies inside both inputs.
struct PoolBackward {
    int64_t r = 0, K = 0, plane = 1;  // plane: prod S, the output elements per plane
    int64_t S[3] = {1, 1, 1}, O[3] = {1, 1, 1}, div[3] = {1, 1, 1}, kmul[3] = {}, off[3] = {}, st[3] = {},
            dstride[3] = {1, 1, 1}, dsize[3] = {1, 1, 1};
    std::vector<int64_t> plane_off;
    // tap t's part of the position along axis i; tap_off[3 * t + i] holds it for K <=
    // TAP_TABLE_MAX (read_pool_backward), beyond that it is computed per entry
    std::vector<int64_t> tap_off;
    static constexpr int64_t TAP_TABLE_MAX = int64_t(1) << 16;
    int64_t tap_part_of(int64_t t, int64_t i) const { return kmul[i] * ((t / dstride[i]) % dsize[i]) + off[i]; }
    int64_t tap_part(int64_t t, int64_t i) const { return tap_off.empty() ? tap_part_of(t, i) : tap_off[3 * t + i]; }
    int64_t numel() const { return (int64_t)plane_off.size() * plane; }
};

// axes: (r, 8) int64 rows `S, O, div, k_mul, offset, stride, digit stride, digit size`, r in
// 1..3; plane_off: (planes,) int64; the inputs' sizes arg_numel / dy_numel. Checked as above.
PoolBackward read_pool_backward(const torch::Tensor& axes, const torch::Tensor& plane_off, int64_t K,
                                int64_t arg_numel, int64_t dy_numel);

// dx (numel() elements) of max_pool_backward (docs/repops-spec.md): per plane, each entry's
// term (the spec's SELECT of dy) goes to the input position and tap its arg names, every other
// term is +0, then each position's chain (the term of tap 0, ADD the rest, t ascending). Items
// are whole planes: any thread count gives the same bits.
void pool_backward_into(const PoolBackward& g, const uint32_t* arg, const uint32_t* dy, float* dx, int64_t threads);

// What a window node of the plan keeps: NK_WGEMM reads a and b (C (nb, M, N) over K), NK_GATHER
// reads a (R x K, or K x R if kmajor), NK_PERMUTE copies its last input into the output's order (shape,
// src_strides: permute_into), NK_POOLBACK reads (arg, dy) (pool).
struct WindowParts {
    WinTables a, b;
    int64_t nb = 0, M = 0, N = 0, K = 0;
    ColumnSplit split;
    bool kmajor = false;
    std::vector<int64_t> shape, src_strides;
    PoolBackward pool;
};

// Checks one operand's tables: rows (1 + c, R), ks (K, 1 + c), wins (c, 3) contiguous CPU int64,
// div >= 1, size >= 0, fill 32 raw bits. Returns R. The one check of the per-node entry point
// (bindings.cpp) and the plan.
int64_t check_win_tables(const torch::Tensor& rows, const torch::Tensor& ks, const torch::Tensor& wins, int64_t fill,
                         int64_t K, const char* what);
WinTables read_win_tables(const torch::Tensor& rows, const torch::Tensor& ks, const torch::Tensor& wins, int64_t fill,
                          int64_t K, const char* what);

// A GEMM's output layout from Python: [] (row-major) or [n_inner, batch stride, outer stride],
// checked (column_split_error).
ColumnSplit column_split(const std::vector<int64_t>& split, int64_t batch, int64_t M, int64_t N);

// out (C order over shape[0 .. rank)) [e] = src[sum_d c_d * src_strides[d]]: every output element
// once, a plain copy of bits.
void permute_into(const float* src, const std::vector<int64_t>& shape, const std::vector<int64_t>& src_strides,
                  float* out, int64_t threads);

}  // namespace repops_cpu
