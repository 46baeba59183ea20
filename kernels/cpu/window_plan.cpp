// SPDX-License-Identifier: MIT
//
// window_plan.cpp — the window-extension pieces of the whole-step plan (see window_plan.h).

#include "window_plan.h"

#include <cstring>

#include "pool.h"

namespace repops_cpu {

int64_t check_win_tables(const torch::Tensor& rows, const torch::Tensor& ks, const torch::Tensor& wins, int64_t fill,
                         int64_t K, const char* what) {
    for (const torch::Tensor* t : {&rows, &ks, &wins})
        TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == torch::kInt64 && t->is_contiguous() && t->dim() == 2,
                    what, ": tables must be contiguous 2-D CPU int64 tensors");
    const int64_t c = wins.size(0);
    TORCH_CHECK(wins.size(1) == 3 && rows.size(0) == 1 + c && ks.size(0) == K && ks.size(1) == 1 + c, what,
                ": tables of mismatched shapes");
    const int64_t* w = wins.data_ptr<int64_t>();
    for (int64_t i = 0; i < c; i++) TORCH_CHECK(w[3 * i] >= 1 && w[3 * i + 1] >= 0, what, ": window div/size");
    TORCH_CHECK(fill >= 0 && fill <= 0xFFFFFFFFLL, what, ": fill must be 32 raw bits");
    return rows.size(1);
}

WinTables read_win_tables(const torch::Tensor& rows, const torch::Tensor& ks, const torch::Tensor& wins, int64_t fill,
                          int64_t K, const char* what) {
    WinTables t;
    t.R = check_win_tables(rows, ks, wins, fill, K, what);
    t.nchk = wins.size(0);
    t.K = K;
    t.fill = (uint32_t)fill;
    auto copy = [](const torch::Tensor& x) {
        return std::vector<int64_t>(x.data_ptr<int64_t>(), x.data_ptr<int64_t>() + x.numel());
    };
    t.rows = copy(rows);
    t.ks = copy(ks);
    t.wins = copy(wins);
    return t;
}

ColumnSplit column_split(const std::vector<int64_t>& split, int64_t batch, int64_t M, int64_t N) {
    if (split.empty()) return ColumnSplit{};
    TORCH_CHECK(split.size() == 3, "a column split is [n_inner, batch stride, outer stride]");
    const ColumnSplit s{split[0], split[1], split[2]};
    const char* bad = column_split_error(s, batch, M, N);
    TORCH_CHECK(bad == nullptr, "column split (", s.n_inner, ", ", s.batch_stride, ", ", s.outer_stride, "): ", bad);
    return s;
}

void permute_into(const float* src, const std::vector<int64_t>& shape, const std::vector<int64_t>& src_strides,
                  float* out, int64_t threads) {
    const int64_t rank = (int64_t)shape.size();
    if (rank == 0) {
        out[0] = src[0];
        return;
    }
    const int64_t inner = shape[rank - 1], inner_st = src_strides[rank - 1];
    int64_t lines = 1;
    for (int64_t d = 0; d + 1 < rank; d++) lines *= shape[d];
    const int64_t per_item = std::max<int64_t>(1, (1 << 12) / std::max<int64_t>(1, inner));  // lines per item
    const int64_t n_items = ceil_div(lines, per_item);
    parallel_items(n_items, threads_for(threads, n_items, (double)(lines * inner), PERMUTE_MIN_ELEMS),
                   [&](int64_t item, int64_t) {
                       for (int64_t l = item * per_item; l < std::min(lines, (item + 1) * per_item); l++) {
                           int64_t rest = l, at = 0;
                           for (int64_t d = rank - 2; d >= 0; d--) {
                               at += (rest % shape[d]) * src_strides[d];
                               rest /= shape[d];
                           }
                           float* o = out + l * inner;
                           if (inner_st == 1) {
                               std::memcpy(o, src + at, sizeof(float) * inner);
                           } else {
                               for (int64_t j = 0; j < inner; j++) o[j] = src[at + j * inner_st];
                           }
                       }
                   });
}

}  // namespace repops_cpu
