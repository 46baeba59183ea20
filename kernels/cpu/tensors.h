// SPDX-License-Identifier: MIT
//
// tensors.h — torch tensors in and out of the RepOps CPU kernels: the checks and decodings the
// per-node entry points (bindings.cpp) and the whole-step plan (step_plan.cpp) share.
#pragma once

#include <torch/extension.h>

#include <vector>

#include "interpreter.h"

namespace repops_cpu {

inline void check_f32_cpu(const torch::Tensor& t, const char* what) {
    TORCH_CHECK(t.device().is_cpu(), what, " must be a CPU tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, what, " must be float32, got ", t.scalar_type());
}

// The rows of an (n_rows, n_cols) int64 table, flat.
inline std::vector<int64_t> int64_rows(const torch::Tensor& t, int64_t n_rows, int64_t n_cols, const char* what) {
    TORCH_CHECK(t.scalar_type() == torch::kInt64 && t.dim() == 2 && t.size(0) == n_rows && t.size(1) == n_cols,
                what, " must be an (", n_rows, ", ", n_cols, ") int64 tensor");
    auto c = t.contiguous();
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + n_rows * n_cols);
}

// A program as an (n, 5) int64 tensor of rows `op, dst, a, b, imm`, decoded and checked.
inline std::vector<Instr> read_program(const torch::Tensor& code) {
    TORCH_CHECK(code.dim() == 2 && code.size(1) == 5 && code.scalar_type() == torch::kInt64,
                "programs are (n, 5) int64 tensors: op, dst, a, b, imm");
    return decode_program(int64_rows(code, code.size(0), 5, "program").data(), code.size(0));
}

// SAFETY: the kernels read base + sum(i_d * stride_d) unchecked for every i_d < extent_d;
// with non-negative strides the extremes are base and base + sum((extent_d - 1) * stride_d).
inline void check_box(const std::vector<int64_t>& bases, const std::vector<int64_t>& strides,
                      const std::vector<int64_t>& extents, int64_t numel, const char* what) {
    int64_t span = 0;
    for (size_t d = 0; d < strides.size(); d++) {
        TORCH_CHECK(strides[d] >= 0 && extents[d] >= 1, what, ": strides must be >= 0");
        span += strides[d] * (extents[d] - 1);
    }
    for (int64_t b : bases)
        TORCH_CHECK(b >= 0 && b + span < numel, what, " addresses [", b, ", ", b + span, "] leave [0, ", numel, ")");
}

// A compiled map's input rows (backends/cpu/jit.py map_lin): input t is read at
// offset + ((e / q) % p) * s for output elements e < n; every such address lies in [0, numel).
inline void check_map_inputs(const std::vector<int64_t>& rows, size_t t, int64_t n, int64_t numel) {
    const int64_t offset = rows[4 * t], s = rows[4 * t + 1], q = rows[4 * t + 2], p = rows[4 * t + 3];
    TORCH_CHECK(q >= 1 && p >= 1, "map input ", t, ": q and p must be >= 1");
    check_box({offset}, {s}, {std::min(p, (n + q - 1) / q)}, numel, "map input");
}

// Registers the StepPlan class (step_plan.cpp) in the extension module.
void bind_step_plan(pybind11::module& m);
// Registers the row dot products (norm.cpp).
void bind_norm(pybind11::module& m);

}  // namespace repops_cpu
