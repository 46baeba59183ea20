// SPDX-License-Identifier: MIT
//
// window_plan.cpp — the window-extension pieces of the whole-step plan (see window_plan.h).

#include "window_plan.h"

#include <algorithm>
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

void permute_into(const float* src, const std::vector<int64_t>& shape_in, const std::vector<int64_t>& strides_in,
                  float* out, int64_t threads) {
    // The same copy over fewer axes: size-1 axes dropped, and an axis merged into the one before
    // it where the source steps evenly across both (the output, in C order, always does). A
    // convolution's (image, 1, channel, 1, 1) output from the GEMM's (channel, image) order was
    // 16k one-element lines, each paying its index arithmetic (0.13 ms for 64 KiB); it is one
    // axis of 32 lines of 512 strided elements.
    std::vector<int64_t> shape, src_strides;
    for (size_t d = 0; d < shape_in.size(); d++) {
        if (shape_in[d] == 1) continue;
        if (!shape.empty() && src_strides.back() == strides_in[d] * shape_in[d]) {
            shape.back() *= shape_in[d];
            src_strides.back() = strides_in[d];
            continue;
        }
        shape.push_back(shape_in[d]);
        src_strides.push_back(strides_in[d]);
    }
    if (shape.empty() && !shape_in.empty()) {  // every axis of size 1: one element
        shape.push_back(1);
        src_strides.push_back(1);
    }
    const int64_t rank = (int64_t)shape.size();
    if (rank == 0) {
        out[0] = src[0];
        return;
    }
    const int64_t inner = shape[rank - 1], inner_st = src_strides[rank - 1];
    // A source already in the output's order at the output's address (a weight gradient the GEMM
    // wrote into the node's output, whose permute runs only the epilogue): nothing to copy.
    if (rank == 1 && inner_st == 1 && src == out) return;
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

PoolBackward read_pool_backward(const torch::Tensor& axes, const torch::Tensor& plane_off, int64_t K,
                                int64_t arg_numel, int64_t dy_numel) {
    for (const torch::Tensor* t : {&axes, &plane_off})
        TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == torch::kInt64 && t->is_contiguous(),
                    "max-pool backward: tables must be contiguous CPU int64 tensors");
    TORCH_CHECK(axes.dim() == 2 && axes.size(1) == 8 && axes.size(0) >= 1 && axes.size(0) <= 3,
                "max-pool backward: axes must be (r, 8), r in 1..3");
    TORCH_CHECK(plane_off.dim() == 1 && plane_off.numel() >= 1, "max-pool backward: plane offsets must be 1-D");
    TORCH_CHECK(K >= 1 && K < (1 << 24), "max-pool backward: K in 1 .. 2^24 - 1");
    PoolBackward g;
    g.r = axes.size(0);
    g.K = K;
    const int64_t* a = axes.data_ptr<int64_t>();
    int64_t box = 0;  // the largest entry offset inside a plane
    for (int64_t i = 0; i < g.r; i++) {
        const int64_t* row = a + 8 * i;
        g.S[i] = row[0], g.O[i] = row[1], g.div[i] = row[2], g.kmul[i] = row[3], g.off[i] = row[4];
        g.st[i] = row[5], g.dstride[i] = row[6], g.dsize[i] = row[7];
        TORCH_CHECK(g.S[i] >= 1 && g.O[i] >= 1 && g.div[i] >= 1 && g.st[i] >= 0 && g.dstride[i] >= 1 && g.dsize[i] >= 1,
                    "max-pool backward: bad axis ", i);
        g.plane *= g.S[i];
        box += (g.O[i] - 1) * g.st[i];
    }
    g.plane_off.assign(plane_off.data_ptr<int64_t>(), plane_off.data_ptr<int64_t>() + plane_off.numel());
    if (K <= PoolBackward::TAP_TABLE_MAX) {  // three integer divisions per entry were most of the
        g.tap_off.resize(3 * K);                // node's time (resnet18's 3x3 pool: 3.1 ms on 131 k entries)
        for (int64_t t = 0; t < K; t++)
            for (int64_t i = 0; i < 3; i++) g.tap_off[3 * t + i] = g.tap_part_of(t, i);
    }
    for (int64_t p : g.plane_off)
        TORCH_CHECK(p >= 0 && p + box < std::min(arg_numel, dy_numel), "max-pool backward: an entry leaves its input");
    return g;
}

void pool_backward_into(const PoolBackward& g, const uint32_t* arg, const uint32_t* dy, float* dx, int64_t threads) {
    const int64_t planes = (int64_t)g.plane_off.size(), plane = g.plane, K = g.K;
    const int64_t per_item = std::max<int64_t>(1, (1 << 14) / (plane * K));  // planes per item
    const int64_t n_items = ceil_div(planes, per_item);
    const float fK = (float)K;
    const uint32_t one = RP_ONE_BITS, zero = 0u;  // EQ's true, SELECT's +0
    parallel_items(n_items, threads_for(threads, n_items, (double)(planes * plane * K), BINARY_MIN_ELEMS),
                   [&](int64_t item, int64_t) {
        // slots[t * plane + x]: the term of position x at tap t
        thread_local std::vector<float> slots;
        slots.resize(K * plane);
        float* sl = slots.data();
        for (int64_t p = item * per_item; p < std::min(planes, (item + 1) * per_item); p++) {
            std::fill(slots.begin(), slots.begin() + K * plane, from_bits(zero));
            const int64_t base = g.plane_off[p];
            for (int64_t q0 = 0; q0 < g.O[0]; q0++)
                for (int64_t q1 = 0; q1 < g.O[1]; q1++)
                    for (int64_t q2 = 0; q2 < g.O[2]; q2++) {
                        const int64_t at = base + q0 * g.st[0] + q1 * g.st[1] + q2 * g.st[2];
                        const float a = from_bits(arg[at]);
                        if (!(a >= 0.0f && a < fK)) continue;  // NaN too: EQ(arg, t) holds for no t
                        const int64_t t = (int64_t)a;
                        if ((float)t != a) continue;
                        const int64_t q[3] = {q0, q1, q2};
                        int64_t x = 0;
                        bool inside = true;
                        for (int64_t i = 0; i < 3; i++) {
                            const int64_t xi = q[i] * g.div[i] - g.tap_part(t, i);
                            inside &= xi >= 0 && xi < g.S[i];
                            x = x * g.S[i] + xi;
                        }
                        if (inside) sl[t * plane + x] = from_bits(rp_select(one, dy[at], zero));
                    }
            // the chains, W positions at a time: ADD in t order, canonical NaN per step
            float* out = dx + p * plane;
            int64_t x = 0;
            for (; x + W <= plane; x += W) {
                Vec acc = vload(sl + x);
                for (int64_t t = 1; t < K; t++) acc = vcanon(vadd(acc, vload(sl + t * plane + x)));
                vstore(out + x, acc);
            }
            for (; x < plane; x++) {
                uint32_t acc = to_bits(sl[x]);
                for (int64_t t = 1; t < K; t++) acc = rp_add(acc, to_bits(sl[t * plane + x]));
                out[x] = from_bits(acc);
            }
        }
    });
}

}  // namespace repops_cpu
