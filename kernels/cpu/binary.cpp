// SPDX-License-Identifier: MIT
//
// binary.cpp — elementwise kernels: binary instructions (ADD, SUB, MUL, DIV, MAX, MIN) on
// equal-shaped contiguous operands (the caller broadcasts first), W lanes at a time, the tail
// lane by lane on the instructions of kernels/repops_fp32.h; and compiled maps, split into
// element ranges. Every element is its own item of work, so any split gives the same bits.

#include "kernels.h"

namespace repops_cpu {
namespace {

inline Vec vbinary(int64_t op, Vec a, Vec b) {
    switch (op) {
        case RP_BIN_ADD: return vadd(a, b);
        case RP_BIN_SUB: return vsub(a, b);
        case RP_BIN_MUL: return vmul(a, b);
        case RP_BIN_DIV: return vdiv(a, b);
        case RP_BIN_MAX: return vmax_spec(a, b);
        default: return vmin_spec(a, b);
    }
}

inline uint32_t sbinary(int64_t op, uint32_t x, uint32_t y) {
    switch (op) {
        case RP_BIN_ADD: return rp_add(x, y);
        case RP_BIN_SUB: return rp_sub(x, y);
        case RP_BIN_MUL: return rp_mul(x, y);
        case RP_BIN_DIV: return rp_div(x, y);
        case RP_BIN_MAX: return rp_max(x, y);
        default: return rp_min(x, y);
    }
}

}  // namespace

// Items of CHUNK elements (a multiple of every W): 64 KiB per operand.
constexpr int64_t CHUNK = 1 << 14;

void binary_into(const float* A, const float* B, float* O, int64_t n, int64_t op, int64_t threads) {
    const int64_t n_items = ceil_div(n, CHUNK);
    parallel_items(n_items, threads_for(threads, n_items, (double)n, BINARY_MIN_ELEMS), [&](int64_t item, int64_t) {
        const int64_t i0 = item * CHUNK, i1 = std::min(n, i0 + CHUNK);
        int64_t i = i0;
        for (; i + W <= i1; i += W) vstore(O + i, vcanon(vbinary(op, vload(A + i), vload(B + i))));
        for (; i < i1; i++) O[i] = from_bits(sbinary(op, to_bits(A[i]), to_bits(B[i])));
    });
}

void map_into(MapFn fn, const void* const* in, uint32_t* out, int64_t n, int64_t work, int64_t threads) {
    // About four ranges per thread, each a multiple of GRAIN elements: a map's cost per element
    // is its program length (up to a few hundred instructions), so ranges far shorter than a
    // binary's CHUNK still carry enough work.
    // A chain's elements carry K instructions each (a batch-norm statistic: 64 channels, each a
    // chain over 8,192 k): there ranges of 16 elements, one vector of the widest ISA's lanes,
    // so that a few outputs still split among threads.
    constexpr int64_t GRAIN = 256, CHAIN_GRAIN = 16;
    constexpr double CHAIN_ELEM_INSTRS = 256;
    const int64_t grain = (double)work >= CHAIN_ELEM_INSTRS * (double)n ? CHAIN_GRAIN : GRAIN;
    threads = threads_for(threads, ceil_div(n, grain), (double)work, MAP_MIN_INSTRS);
    const int64_t span = round_up(ceil_div(n, 4 * threads), grain);
    parallel_items(ceil_div(n, span), threads,
                   [&](int64_t item, int64_t) { fn(in, out, item * span, std::min(n, (item + 1) * span)); });
}

}  // namespace repops_cpu
