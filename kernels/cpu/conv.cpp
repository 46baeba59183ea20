// SPDX-License-Identifier: MIT
//
// conv.cpp — the windowed GEMM: convolution forward, grad-input and grad-weight (any window
// descriptor whose program is the dot chain, repops/windowed.py) as one fixed-chain GEMM with
// implicit im2col.
//
//   C[b, i, j] = dot over k ascending of A(b*M + i, k) * B(b*N + j, k)
//
// Operands are never unfolded: each MR / NR panel of a K block is packed straight from the
// input through its windows (WinOperand, kernels.h), padding taps reading the fill (+0), as the
// plain GEMM packs its panels from strided memory. The micro-kernel is the plain GEMM's
// (gemm_tile.h), so one output element's chain is acc = a0*b0, then fma(a_k, b_k, acc) for k
// ascending, carried through C in fp32 between K blocks: the descriptor's bits whatever the
// blocking or the thread count.
//
// Work items are (batch entry, column block, row block) triples, independent of each other
// (each packs what it reads into its own buffers and writes its own output tile), handed out by
// parallel_items.
//
// windowed_gather writes every (row, k) of one operand densely (the dewindowed nodes: pooling,
// batch-norm statistics), (R, K) or k-major (K, R): div == 1 windows as the panels are packed
// (runs of k, or of rows, copied as intervals), others by fetch_any. A copy of bits: which path
// reads an element, and the layout, change nothing but the time.

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <functional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "gemm_tile.h"
#include "kernels.h"

namespace repops_cpu {

std::atomic<int64_t> div_run_panels{0};
std::atomic<int64_t> contiguous_panels{0};
std::atomic<int64_t> k_panels{0};
std::atomic<int64_t> row_plan_items{0}, row_chain_items{0};

namespace {

constexpr int MAX_CHECKED = 8;

// One element, any windows (div > 1 included): the fill where a window is out of range.
inline uint32_t fetch_any(const WinOperand& o, int64_t r, const int64_t* kk, bool& ok) {
    int64_t addr = o.rows[r] + kk[0];
    for (int64_t w = 0; w < o.nchk; w++) {
        const int64_t v = o.rows[(1 + w) * o.R + r] + kk[1 + w];
        const int64_t div = o.wins[3 * w], size = o.wins[3 * w + 1];
        if (v < 0) return o.fill;
        int64_t q;
        if ((div & (div - 1)) == 0) {  // div == 1 and power-of-two strides: no division
            const int shift = __builtin_ctzll((uint64_t)div);
            q = v >> shift;
            if ((q << shift) != v) return o.fill;
        } else {
            q = v / div;
            if (q * div != v) return o.fill;
        }
        if (q >= size) return o.fill;
        addr += q * o.wins[3 * w + 2];
    }
    if ((uint64_t)addr >= (uint64_t)o.numel) {
        ok = false;
        return 0;
    }
    return o.data[addr];
}

// At most three checked windows, every divisor 1: the runs' paths (else fetch_any per element).
inline bool all_div1(const WinOperand& o) {
    bool div1 = o.nchk <= 3;
    for (int64_t w = 0; w < o.nchk && div1; w++) div1 = o.wins[3 * w] == 1;
    return div1;
}

// A run of entries i .. i+len-1 of a table that step evenly: t(0, i+c) = t(0, i) + c*step and
// each checked window's part t(1+w, i+c) = t(1+w, i) + c*delta[w] (delta >= 0), where entry
// t(w, i) = t[w*pw + i*pi]. Of the row table (pw = R, pi = 1): convolutions' im2col panels are
// such runs along an output row (step = the conv stride), or along the images when the feature
// map is 1x1: then each k reads one interval of c [lo, hi) from memory, step apart, and the
// fill outside it. Of the k table (pw = 1, pi = 1 + nchk): a channel statistic's k range, one
// row's taps along a window axis. Returns the longest such run from i (at least 1, at most
// max_len) and its step and deltas.
int64_t table_run(const int64_t* t, int64_t pw, int64_t pi, int64_t nchk, int64_t i, int64_t max_len, int64_t& step,
                  int64_t* delta) {
    step = 0;
    for (int64_t w = 0; w < nchk; w++) delta[w] = 0;
    if (max_len < 2) return max_len;
    auto at = [&](int64_t w, int64_t c) { return t[w * pw + (i + c) * pi]; };
    step = at(0, 1) - at(0, 0);
    for (int64_t w = 0; w < nchk; w++) {
        delta[w] = at(1 + w, 1) - at(1 + w, 0);
        if (delta[w] < 0) {
            step = 0;
            for (int64_t v = 0; v <= w; v++) delta[v] = 0;
            return 1;
        }
    }
    int64_t len = 2;
    for (; len < max_len; len++) {
        if (at(0, len) - at(0, 0) != len * step) break;
        bool same = true;
        for (int64_t w = 0; w < nchk && same; w++) same = at(1 + w, len) - at(1 + w, 0) == len * delta[w];
        if (!same) break;
    }
    return len;
}

// A run of rows r .. (table_run over the row table).
int64_t run_length(const WinOperand& o, int64_t r, int64_t max_len, int64_t& step, int64_t* delta) {
    return table_run(o.rows, o.R, 1, o.nchk, r, max_len, step, delta);
}

template <typename T>
inline T as_elem(uint32_t bits);
template <>
inline float as_elem<float>(uint32_t bits) {
    return from_bits(bits);
}
template <>
inline uint32_t as_elem<uint32_t>(uint32_t bits) {
    return bits;
}

// The elements in range of one run (table_run) at one k: c = c1 + (j << pshift), j < n, each at
// address first + j*s; every other element of the run is the fill.
struct Span {
    int64_t first = 0, s = 0, c1 = 0, n = 0;
    int pshift = 0;
    int64_t last() const { return first + (n - 1) * s; }
    bool inside(int64_t numel) const { return n == 0 || (std::min(first, last()) >= 0 && std::max(first, last()) < numel); }
};

// The Span of one run from row r and k row kk through NCHK div == 1 windows: a run of rows at
// one k, or a run of k at one row (kk its first k). Element c is in range iff every window has
// 0 <= v0_w + c*delta_w < size_w, i.e. c in [lo, hi).
template <int NCHK>
__attribute__((always_inline)) inline Span span_steps(const WinOperand& o, int64_t r, int64_t valid, const int64_t* kk, int64_t step, const int64_t* delta,
                const uint64_t* size) {
    int64_t lo = 0, hi = valid;
    for (int w = 0; w < NCHK; w++) {
        const int64_t v0 = o.rows[(1 + w) * o.R + r] + kk[1 + w], sz = (int64_t)size[w], dl = delta[w];
        if (dl == 0) {
            if (v0 < 0 || v0 >= sz) hi = 0;
            continue;
        }
        if (dl == 1) {  // a run along a unit-step window axis: no division (a convolution's row)
            lo = std::max(lo, -v0);
            hi = std::min(hi, sz - v0);
            continue;
        }
        if (v0 < 0) lo = std::max(lo, (-v0 + dl - 1) / dl);
        hi = sz - v0 <= 0 ? 0 : std::min(hi, (sz - v0 + dl - 1) / dl);
    }
    Span sp;
    if (hi <= lo) return sp;
    sp.c1 = lo;
    sp.n = hi - lo;
    sp.first = o.rows[r] + kk[0] + lo * step;
    sp.s = step;
    return sp;
}

// span_steps for a run through windows some of which have div > 1, every div a power of two (a
// strided convolution's grad input reads dy at v / stride): element c is in range iff, for every
// window w, 0 <= v_w(c) = v0_w + c*delta_w < size_w*div_w and div_w divides v_w(c); its address
// is then rows(0, r) + kk[0] + c*step + sum_w (v_w(c) / div_w)*stride_w (the stride entry of a
// div == 1 window is 0: its term is in rows(0) / ks(0)). The divisibility holds for c in one
// residue class modulo p_w = div_w / gcd(delta_w, div_w) (for no c if that gcd does not divide
// v0_w), so with at most one window of p_w > 1 the elements in range are c = c1, c1 + p, ... <
// hi, whose addresses step evenly. Shifts and masks only (a division per run and k cost more
// than fetch_any per element). Two windows of p_w > 1 (a run along a diagonal, which the tables
// never give a convolution): false (the caller reads the run element by element).
template <int NCHK>
bool span_steps_div(const WinOperand& o, int64_t r, int64_t valid, const int64_t* kk, int64_t step,
                    const int64_t* delta, const int* shift, Span& sp) {
    sp = Span{};
    int64_t lo = 0, hi = valid, residue = 0;
    int pshift = 0;                  // log2 of the period
    int64_t a0 = o.rows[r] + kk[0];  // the address at c = 0 without the terms of windows that move
    for (int w = 0; w < NCHK; w++) {
        const int64_t v0 = o.rows[(1 + w) * o.R + r] + kk[1 + w], dl = delta[w];
        const int sh = shift[w];
        const int64_t mask = (int64_t(1) << sh) - 1, lim = o.wins[3 * w + 1] << sh;
        if (dl == 0) {
            if (v0 < 0 || v0 >= lim || (v0 & mask) != 0) hi = 0;
            else a0 += (v0 >> sh) * o.wins[3 * w + 2];
            continue;
        }
        if (dl == 1) {
            lo = std::max(lo, -v0);
            hi = std::min(hi, lim - v0);
        } else {
            if (v0 < 0) lo = std::max(lo, (-v0 + dl - 1) / dl);
            hi = lim - v0 <= 0 ? 0 : std::min(hi, (lim - v0 + dl - 1) / dl);
        }
        const int gs = std::min(__builtin_ctzll((uint64_t)dl), sh);  // gcd(dl, div) = 2^gs
        if ((v0 & ((int64_t(1) << gs) - 1)) != 0) {
            hi = 0;
            continue;
        }
        if (gs < sh) {  // p_w = 2^(sh - gs) > 1
            if (pshift > 0) return false;
            pshift = sh - gs;
            while (((v0 + residue * dl) & mask) != 0) residue++;  // < p_w steps
        }
    }
    const int64_t period = int64_t(1) << pshift;
    const int64_t c1 = lo <= residue ? residue : residue + (((lo - residue + period - 1) >> pshift) << pshift);
    if (c1 >= hi) return true;
    sp.c1 = c1;
    sp.pshift = pshift;
    sp.n = (hi - c1 + period - 1) >> pshift;
    // the address of c1 and its step per element in range: a window that moves (dl != 0) adds
    // period*dl/div (an integer: p_w divides period) strides per element (fetch_any's address;
    // 0 for a div == 1 window, whose stride entry is 0)
    sp.first = a0 + c1 * step;
    sp.s = period * step;
    for (int w = 0; w < NCHK; w++) {
        const int64_t dl = delta[w];
        if (dl == 0) continue;
        const int64_t v1 = o.rows[(1 + w) * o.R + r] + kk[1 + w] + c1 * dl;
        sp.first += (v1 >> shift[w]) * o.wins[3 * w + 2];
        sp.s += ((period * dl) >> shift[w]) * o.wins[3 * w + 2];
    }
    return true;
}

// A Span's run of `valid` elements written to d[c * ds]: a panel's k row (ds = 1, floats for the
// micro-kernel), a gather's column (ds = K) or line (ds = 1; raw bits). False (ok cleared,
// nothing written) if an address in range falls outside the operand.
template <typename T>
__attribute__((always_inline)) inline void write_span(const WinOperand& o, const Span& sp, int64_t valid, T* d, int64_t ds, bool& ok) {
    if (!sp.inside(o.numel)) {
        ok = false;
        return;
    }
    const T fill = as_elem<T>(o.fill);
    if (sp.pshift > 0) {
        for (int64_t c = 0; c < valid; c++) d[c * ds] = fill;
        for (int64_t j = 0; j < sp.n; j++) d[(sp.c1 + (j << sp.pshift)) * ds] = as_elem<T>(o.data[sp.first + j * sp.s]);
        return;
    }
    const int64_t lo = sp.c1, hi = sp.c1 + sp.n;
    if (sp.n > 0 && sp.s == 1 && ds == 1) {
#if REPOPS_ISA == 2
        if (sp.n <= 8) {  // one masked move, not a memcpy call (runs of 16: slower, see pack_run_lanes)
            const __mmask16 m = (__mmask16)((1u << sp.n) - 1);
            _mm512_mask_storeu_epi32(d + lo, m, _mm512_maskz_loadu_epi32(m, o.data + sp.first));
        } else
#endif
        std::memcpy(d + lo, o.data + sp.first, sizeof(T) * sp.n);
    } else {
        for (int64_t j = 0; j < sp.n; j++) d[(lo + j) * ds] = as_elem<T>(o.data[sp.first + j * sp.s]);
    }
    for (int64_t c = 0; c < lo; c++) d[c * ds] = fill;
    for (int64_t c = hi; c < valid; c++) d[c * ds] = fill;
}

template <int NCHK, typename T>
void pack_steps_row(const WinOperand& o, int64_t r, int64_t valid, const int64_t* kk, int64_t step,
                    const int64_t* delta, const uint64_t* size, T* d, int64_t ds, bool& ok) {
    write_span(o, span_steps<NCHK>(o, r, valid, kk, step, delta, size), valid, d, ds, ok);
}

template <int NCHK, typename T>
bool pack_steps_row_div(const WinOperand& o, int64_t r, int64_t valid, const int64_t* kk, int64_t step,
                        const int64_t* delta, const int* shift, T* d, int64_t ds, bool& ok) {
    Span sp;
    if (!span_steps_div<NCHK>(o, r, valid, kk, step, delta, shift, sp)) return false;
    write_span(o, sp, valid, d, ds, ok);
    return true;
}

template <int NCHK>
void pack_run_lanes(const WinOperand& o, int64_t r, int64_t len, const int64_t* ks, int64_t cols, int64_t kc, int64_t step,
                    const int64_t* delta, const uint64_t* size, float* d, int64_t ld, bool& ok);

// The least and greatest address part (ks column 0) of k rows [p0, p0 + kc), kc > 0: with a
// panel's least and greatest row address, the box every address of the panel lies in.
inline void ks_address_range(const WinOperand& o, int64_t p0, int64_t kc, int64_t& kmin, int64_t& kmax) {
    const int64_t cols = 1 + o.nchk;
    kmin = kmax = o.ks[p0 * cols];
    for (int64_t k = p0 + 1; k < p0 + kc; k++) {
        kmin = std::min(kmin, o.ks[k * cols]);
        kmax = std::max(kmax, o.ks[k * cols]);
    }
}

#if REPOPS_ISA == 2
// Window coordinates, their k parts and sizes are held as int32 lanes below this bound (the
// caller checks the block's k parts once: ks_fit_lanes).
constexpr int64_t CONTIGUOUS_LIM = int64_t(1) << 30;

// Whether every window k part of k rows [p0, p0 + kc) is within CONTIGUOUS_LIM.
inline bool ks_fit_lanes(const WinOperand& o, int64_t p0, int64_t kc) {
    const int64_t cols = 1 + o.nchk;
    for (int64_t k = p0; k < p0 + kc; k++)
        for (int64_t w = 0; w < o.nchk; w++) {
            const int64_t v = o.ks[k * cols + 1 + w];
            if (v <= -CONTIGUOUS_LIM || v >= CONTIGUOUS_LIM) return false;
        }
    return true;
}

// One K block's k side for pack_contiguous_panel, built once for all the block's panels: each
// window's k parts as int32 (ks_fit_lanes), so a k's part is broadcast from memory into the
// lane compare, and the least and greatest address part, so a panel whose whole box of
// addresses lies inside the input needs no per-k bounds check.
struct ContiguousKs {
    std::vector<int32_t> part;  // [w * kc + k]
    int64_t kmin = 0, kmax = 0;
    // For k rows [p0, p0 + kc), kc > 0, whose window k parts fit (ks_fit_lanes).
    void build(const WinOperand& o, int64_t p0, int64_t kc) {
        const int64_t cols = 1 + o.nchk;
        part.resize(o.nchk * kc);
        ks_address_range(o, p0, kc, kmin, kmax);
        for (int64_t k = 0; k < kc; k++) {
            const int64_t* kk = o.ks + (p0 + k) * cols;
            for (int64_t w = 0; w < o.nchk; w++) part[w * kc + k] = (int32_t)kk[1 + w];
        }
    }
};

// Whether rows [r, r + 2W) of o have consecutive addresses (a panel for pack_contiguous_panel).
inline bool consecutive_rows(const WinOperand& o, int64_t r) {
    for (int64_t c = 1; c < 2 * W; c++)
        if (o.rows[r + c] != o.rows[r] + c) return false;
    return true;
}

// A panel of 2W rows whose addresses follow each other (rows(0, r + c) = rows(0, r) + c: the
// 32 positions of four rows of an 8 x 8 map, one image's input plane) through NCHK div == 1
// windows: at each k its elements are 2W consecutive floats of the input, those whose windows
// are all in range, the fill elsewhere. So per k: a lane mask from the window coordinates (held
// in vectors for the whole K block) and two masked loads over the fill, where the runs (four of
// 8 here) took a span each. For rows that are consecutive (consecutive_rows); false (nothing
// written) where their windows do not fit int32 lanes.
// Kernel alone, 1 thread, this build and the one before taking turns (Intel machine of
// 2026-12-04, best of 2 s, two rounds): 64 -> 64, 3x3, batch 32, on 8 x 8 maps forward 1.79-1.83
// -> 1.11-1.12 ms, grad input 1.80-1.81 -> 1.07-1.11 (torch 0.93-0.99); on 32 x 32 maps (one
// image row a panel) forward 23.2-23.5 -> 19.6-20.7, grad input 22.5-22.6 -> 19.8-22.9.
// Where the panel's box of addresses (its 2W lanes at every k of the block) lies inside the
// input, as it does for all but the first and last few panels of an input, the lane masks are
// the whole bounds check (a masked-off lane is not read), and each k's window parts come from
// ContiguousKs (int32, built once per block).
template <int NCHK>
bool pack_contiguous_panel(const WinOperand& o, int64_t r, int64_t p0, int64_t kc, const uint64_t* size,
                           const ContiguousKs& cks, float* panel, bool& ok) {
    constexpr int64_t LIM = CONTIGUOUS_LIM;
    const int64_t cols = 1 + o.nchk, base = o.rows[r];
    __m512i coord[NCHK > 0 ? NCHK : 1][2], lim[NCHK > 0 ? NCHK : 1];
    for (int w = 0; w < NCHK; w++) {
        if (size[w] >= (uint64_t)LIM) return false;
        alignas(64) int32_t lane[2 * W];
        for (int64_t c = 0; c < 2 * W; c++) {
            const int64_t v = o.rows[(1 + w) * o.R + r + c];
            if (v <= -LIM || v >= LIM) return false;
            lane[c] = (int32_t)v;
        }
        coord[w][0] = _mm512_load_si512(lane);
        coord[w][1] = _mm512_load_si512(lane + W);
        lim[w] = _mm512_set1_epi32((int32_t)size[w]);
    }
    const __m512 fill = _mm512_set1_ps(from_bits(o.fill));
    // locals: the stores below may alias anything, so fields read through o or cks (a
    // thread_local of the caller, reached through __tls_get_addr) were read again at every k
    const int32_t* const part = cks.part.data();
    const int64_t* const ks = o.ks + p0 * cols;
    // Lane masks of k: 0 <= coordinate + k part < size, as one unsigned compare per window.
    auto masks = [&](int64_t k, __mmask16& in0, __mmask16& in1) {
        in0 = in1 = 0xFFFF;
        for (int w = 0; w < NCHK; w++) {
            const __m512i add = _mm512_set1_epi32(part[w * kc + k]);
            in0 = _mm512_mask_cmplt_epu32_mask(in0, _mm512_add_epi32(coord[w][0], add), lim[w]);
            in1 = _mm512_mask_cmplt_epu32_mask(in1, _mm512_add_epi32(coord[w][1], add), lim[w]);
        }
    };
    const uintptr_t data = reinterpret_cast<uintptr_t>(o.data);
    auto at = [data](int64_t first) { return reinterpret_cast<const float*>(data + (uintptr_t)(first * (int64_t)sizeof(float))); };
    if (base + cks.kmin >= 0 && base + cks.kmax + 2 * W <= o.numel) {
        for (int64_t k = 0; k < kc; k++) {
            __mmask16 in0, in1;
            masks(k, in0, in1);
            const float* src = at(base + ks[k * cols]);
            _mm512_storeu_ps(panel + k * 2 * W, _mm512_mask_loadu_ps(fill, in0, src));
            _mm512_storeu_ps(panel + k * 2 * W + W, _mm512_mask_loadu_ps(fill, in1, src + W));
        }
        return true;
    }
    for (int64_t k = 0; k < kc; k++) {
        __mmask16 in[2];
        masks(k, in[0], in[1]);
        const int64_t first = base + ks[k * cols];  // element c's address: first + c
        const uint32_t all = (uint32_t)in[0] | ((uint32_t)in[1] << W);
        if (all != 0 && (first + __builtin_ctz(all) < 0 || first + 31 - __builtin_clz(all) >= o.numel)) ok = false;
        float* d = panel + k * 2 * W;
        for (int h = 0; h < 2; h++)
            _mm512_storeu_ps(d + h * W, in[h] && ok ? _mm512_mask_loadu_ps(fill, in[h], at(first + h * W)) : fill);
    }
    return true;
}

// The k side of one K block for pack_k_panel: the block in groups of W consecutive k, each
// group's window k parts as int32 lanes (ks_fit_lanes checked) and its segments of k whose
// addresses step by one or two floats (ks(k + 1, 0) = ks(k, 0) + step: a grad weight's positions
// along an output row, or along a whole image where the map keeps its size; stride 2).
struct KSegments {
    struct Seg {
        int32_t lane, len, step;  // step 1 or 2 (a stride-2 convolution's positions)
        int64_t addr;             // ks(0) of the segment's first k
    };
    std::vector<__m512i> kpart;  // [group * nchk + w]
    std::vector<Seg> segs;       // group g's: [first[g], first[g + 1])
    std::vector<int32_t> first;
    int64_t kc = 0;

    // Built for k rows [p0, p0 + kc) of o; whether the segments are long enough to pay: MIN_LEN
    // lanes or more on average (a stride-1 output row of 4 columns).
    bool build(const WinOperand& o, int64_t p0, int64_t kc_) {
        constexpr int64_t MIN_LEN = 4;
        kc = kc_;
        const int64_t cols = 1 + o.nchk, groups = ceil_div(kc, W);
        kpart.resize(groups * o.nchk);
        segs.clear();
        first.assign(groups + 1, 0);
        for (int64_t g = 0; g < groups; g++) {
            const int64_t k0 = p0 + g * W, nk = std::min<int64_t>(W, p0 + kc - k0);
            for (int64_t w = 0; w < o.nchk; w++) {
                alignas(64) int32_t lane[W] = {};
                for (int64_t l = 0; l < nk; l++) lane[l] = (int32_t)o.ks[(k0 + l) * cols + 1 + w];
                kpart[g * o.nchk + w] = _mm512_load_si512(lane);
            }
            for (int64_t l = 0; l < nk;) {
                const int64_t a0 = o.ks[(k0 + l) * cols], start = l;
                const int64_t step = l + 1 < nk && o.ks[(k0 + l + 1) * cols] == a0 + 2 ? 2 : 1;
                for (l++; l < nk && o.ks[(k0 + l) * cols] == a0 + (l - start) * step; l++) {
                }
                segs.push_back({(int32_t)start, (int32_t)(l - start), (int32_t)step, a0});
            }
            first[g + 1] = (int32_t)segs.size();
        }
        return (int64_t)segs.size() * MIN_LEN <= kc;
    }
};

// Sixteen vectors of sixteen floats transposed in registers (lane j of v[i] <- lane i of v[j]):
// pairs of rows interleaved, then pairs of pairs, then 128-bit quarters across the groups of
// four rows. Moves bits only.
inline void transpose_16x16(__m512* v) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);      // per quarter: a0 b0 a1 b1
        t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);  // a2 b2 a3 b3
    }
    for (int i = 0; i < 16; i += 4) {  // v[i + j]: rows i .. i + 3 at columns j, j + 4, j + 8, j + 12
        const __m512d t0 = _mm512_castps_pd(t[i]), t1 = _mm512_castps_pd(t[i + 1]);
        const __m512d t2 = _mm512_castps_pd(t[i + 2]), t3 = _mm512_castps_pd(t[i + 3]);
        v[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
        v[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
        v[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
        v[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
    }
    for (int j = 0; j < 4; j++) {  // quarter q of v[4g + j]: column j + 4q of rows 4g .. 4g + 3
        const __m512 u0 = _mm512_shuffle_f32x4(v[j], v[4 + j], 0x88), u1 = _mm512_shuffle_f32x4(v[j], v[4 + j], 0xDD);
        const __m512 u2 = _mm512_shuffle_f32x4(v[8 + j], v[12 + j], 0x88);
        const __m512 u3 = _mm512_shuffle_f32x4(v[8 + j], v[12 + j], 0xDD);
        t[j] = _mm512_shuffle_f32x4(u0, u2, 0x88);
        t[j + 8] = _mm512_shuffle_f32x4(u0, u2, 0xDD);
        t[j + 4] = _mm512_shuffle_f32x4(u1, u3, 0x88);
        t[j + 12] = _mm512_shuffle_f32x4(u1, u3, 0xDD);
    }
    for (int i = 0; i < 16; i++) v[i] = t[i];
}

// A panel of `valid` rows packed along k, where its rows do not step evenly but k does (a grad
// weight's B: the rows are taps (channel, kh, kw), k the positions (image, oh, ow)). Along each
// segment of k a row reads consecutive floats of the input, or every other one (stride 2: two
// masked loads and a permute). Per W rows and W k: each row's W k as a masked load over the fill (the mask from the window coordinates: the row's part plus the
// group's k parts; rows a period of the window parts apart share it), then a transpose in
// registers into the panel's [k][P] layout. False (nothing written) where a row's window part
// does not fit int32 lanes. Packing those panels element by element took 2/3 of a 64 -> 64 grad
// weight on 32 x 32 maps (perf: 39% of the samples, the FMAs 21%). Kernel alone, 1 thread
// (Intel machine of 2026-12-05, best of 3 s): 64 -> 64, 3x3, batch 32, on 32 x 32 maps 38.8 ->
// 20.1-22.2 ms, on 8 x 8 maps 2.25 -> 1.21 ms. The same for the plain A (dy: rows the channels,
// 16 k consecutive floats; 12-row panels, four rows of zeros in the transpose) measured within
// the runs' spread (22.5 / 22.0 ms against 22.8 / 22.1, taking turns).
template <int NCHK>
bool pack_k_panel(const WinOperand& o, int64_t r, int64_t valid, const KSegments& ks, const uint64_t* size,
                  float* panel, bool& ok) {
    constexpr int64_t LIM = CONTIGUOUS_LIM, P = 2 * W;
    for (int w = 0; w < NCHK; w++) {
        if (size[w] >= (uint64_t)LIM) return false;
        for (int64_t c = 0; c < valid; c++) {
            const int64_t v = o.rows[(1 + w) * o.R + r + c];
            if (v <= -LIM || v >= LIM) return false;
        }
    }
    k_panels.fetch_add(1, std::memory_order_relaxed);
    // the rows' window parts (int32) and address parts, and the least period of the window parts
    // along the panel (a grad weight's 9 taps of each channel): rows a period apart have the
    // same lane masks, which are computed for one period only
    alignas(64) int32_t part[NCHK][P];
    int64_t base[P];
    for (int64_t c = 0; c < P; c++) {
        base[c] = c < valid ? o.rows[r + c] : 0;
        for (int w = 0; w < NCHK; w++) part[w][c] = c < valid ? (int32_t)o.rows[(1 + w) * o.R + r + c] : 0;
    }
    int64_t period = 1;
    for (; period < valid; period++) {
        bool same = true;
        for (int w = 0; w < NCHK && same; w++)
            same = std::memcmp(part[w], part[w] + period, (valid - period) * sizeof(int32_t)) == 0;
        if (same) break;
    }
    int64_t bmin = base[0], bmax = base[0];  // a segment whose box of addresses is inside the
    for (int64_t c = 1; c < valid; c++)      // input needs no check per row
        bmin = std::min(bmin, base[c]), bmax = std::max(bmax, base[c]);
    const __m512 fill = _mm512_set1_ps(from_bits(o.fill));
    __m512i lim[NCHK];
    for (int w = 0; w < NCHK; w++) lim[w] = _mm512_set1_epi32((int32_t)size[w]);
    const float* data = reinterpret_cast<const float*>(o.data);
    bool all_ok = true;
    const int64_t groups = ceil_div(ks.kc, W);
    for (int64_t g = 0; g < groups; g++) {
        const int64_t nk = std::min<int64_t>(W, ks.kc - g * W);
        const __m512i* kp = ks.kpart.data() + g * NCHK;
        __mmask16 in[P];
        for (int64_t c = 0; c < valid; c++) {
            if (c >= period) {
                in[c] = in[c - period];
                continue;
            }
            __mmask16 m = 0xFFFF;
            for (int w = 0; w < NCHK; w++)  // 0 <= row part + k part < size, one unsigned compare
                m &= _mm512_cmplt_epu32_mask(_mm512_add_epi32(_mm512_set1_epi32(part[w][c]), kp[w]), lim[w]);
            in[c] = m;
        }
        const KSegments::Seg* sg0 = ks.segs.data() + ks.first[g];
        const int64_t nseg = ks.first[g + 1] - ks.first[g];
        // the usual group: one segment over all W lanes, every row's box inside the input
        const bool whole = nseg == 1 && sg0->len == W && sg0->step == 1 && bmin + sg0->addr >= 0 &&
                           bmax + sg0->addr + W <= o.numel;
        for (int64_t h = 0; h < P; h += W) {
            __m512 v[W];
            for (int64_t c = 0; c < W; c++) {
                if (h + c >= valid) {  // past the operand's rows: zeros (those outputs are discarded)
                    v[c] = _mm512_setzero_ps();
                    continue;
                }
                if (whole) {
                    v[c] = _mm512_mask_loadu_ps(fill, in[h + c], data + base[h + c] + sg0->addr);
                    continue;
                }
                v[c] = fill;
                for (int64_t s = 0; s < nseg; s++) {
                    const KSegments::Seg& sg = sg0[s];
                    const __mmask16 m = in[h + c] & (__mmask16)(((1u << sg.len) - 1) << sg.lane);
                    if (!m) continue;
                    const int64_t st = sg.step, at = base[h + c] + sg.addr - sg.lane * st;  // lane l: at + l*st
                    if (at + __builtin_ctz(m) * st < 0 || at + (31 - __builtin_clz(m)) * st >= o.numel) {
                        all_ok = false;
                        continue;
                    }
                    // masked-off lanes are never read (nor is an address outside formed as a pointer)
                    const uintptr_t src = reinterpret_cast<uintptr_t>(data) + (uintptr_t)(at * (int64_t)sizeof(float));
                    if (st == 1) {
                        v[c] = _mm512_mask_loadu_ps(v[c], m, reinterpret_cast<const float*>(src));
                        continue;
                    }
                    // step 2: lane l's float is float 2l of the 32 from src: the floats of the
                    // lanes in range loaded as two vectors (each mask bit spread to an even
                    // position), the even ones gathered by a permute
                    auto spread = [](uint32_t x) {  // bit i -> bit 2i, 8 bits
                        x = (x | (x << 4)) & 0x0F0Fu;
                        x = (x | (x << 2)) & 0x3333u;
                        return (__mmask16)((x | (x << 1)) & 0x5555u);
                    };
                    const float* f = reinterpret_cast<const float*>(src);
                    const __m512 lo = _mm512_maskz_loadu_ps(spread(m & 0xFFu), f);
                    const __m512 hi = _mm512_maskz_loadu_ps(spread((uint32_t)m >> 8), f + W);
                    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
                    v[c] = _mm512_mask_mov_ps(v[c], m, _mm512_permutex2var_ps(lo, even, hi));
                }
            }
            transpose_16x16(v);
            for (int64_t t = 0; t < nk; t++) _mm512_storeu_ps(panel + (g * W + t) * P + h, v[t]);
        }
    }
    if (!all_ok) ok = false;
    return true;
}
#endif

// Rows [r0, r0 + count) x k [p0, p0 + kc) into P-wide panels, layout [panel][k][P], zeros past
// `count` (those outputs are discarded). NCHK >= 0: that many checked windows, all div == 1
// (a range check each) unless DIV (some div > 1, every div a power of two: pack_steps_row_div);
// NCHK < 0: any windows (fetch_any).
template <int P, int NCHK, bool DIV = false>
void pack_panels(const WinOperand& o, int64_t r0, int64_t count, int64_t p0, int64_t kc, float* out, bool& ok) {
    const int64_t cols = 1 + o.nchk;
    uint64_t size[MAX_CHECKED > NCHK ? MAX_CHECKED : 1] = {};
    int shift[MAX_CHECKED > NCHK ? MAX_CHECKED : 1] = {};
    for (int w = 0; w < NCHK; w++) {
        size[w] = (uint64_t)o.wins[3 * w + 1];
        shift[w] = __builtin_ctzll((uint64_t)o.wins[3 * w]);
    }
    struct Run {
        int64_t c0, len, step, delta[MAX_CHECKED];
    };
    // No checked windows (a convolution's weights): element (c, k) of a panel is
    // data[rows(0, r + c) + ks(k)], so a full panel whose whole box of addresses is inside the
    // input is P loads and stores per k, no per-k bookkeeping. On a 512 x 32 x 4608 forward (a
    // 1x1 map: each weight used 32 times) packing the weights took 1.7x the micro-kernel's time.
    int64_t kmin = 0, kmax = 0;
    if (NCHK == 0 && kc > 0) ks_address_range(o, p0, kc, kmin, kmax);
#if REPOPS_ISA == 2
    // the block's k parts checked once for all its panels (pack_contiguous_panel, pack_k_panel)
    const bool ks_fit = NCHK > 0 && !DIV && P == 2 * W && ks_fit_lanes(o, p0, kc);
    // the block's k side for consecutive panels, built when the first one comes
    thread_local ContiguousKs cks;
    bool cks_built = false;
    int64_t n_contiguous = 0;
    // k's segments (pack_k_panel), built for the block when a panel first asks
    thread_local KSegments kseg;
    int k_segs = -1;  // not built yet; then whether they pay
    auto k_segments = [&] {
        if (k_segs < 0) k_segs = kseg.build(o, p0, kc);
        return k_segs == 1;
    };
#endif
    for (int64_t pp = 0; pp < count; pp += P) {
        const int64_t valid = std::min<int64_t>(P, count - pp), r = r0 + pp;
        float* panel = out + pp * kc;
        if (NCHK == 0 && valid == P && kc > 0) {
            const int64_t* rb = o.rows + r;
            int64_t rmin = rb[0], rmax = rb[0];
            for (int c = 1; c < P; c++) rmin = std::min(rmin, rb[c]), rmax = std::max(rmax, rb[c]);
            if (rmin + kmin >= 0 && rmax + kmax < o.numel) {
                for (int64_t k = 0; k < kc; k++) {
                    const uint32_t* src = o.data + o.ks[(p0 + k) * cols];
                    float* d = panel + k * P;
                    for (int c = 0; c < P; c++) d[c] = from_bits(src[rb[c]]);
                }
                continue;
            }
        }
#if REPOPS_ISA == 2
        if constexpr (NCHK > 0 && !DIV && P == 2 * W)
            if (valid == P && ks_fit && kc > 0 && consecutive_rows(o, r)) {
                if (!cks_built) cks.build(o, p0, kc), cks_built = true;
                if (pack_contiguous_panel<NCHK>(o, r, p0, kc, size, cks, panel, ok)) {
                    n_contiguous++;
                    continue;
                }
            }
#endif
        // the panel as runs; runs of one or two rows do not pay
        Run runs[P];
        int64_t n_runs = 0;
        bool use_runs = NCHK >= 0;
        for (int64_t c = 0; use_runs && c < valid; n_runs++) {
            Run& u = runs[n_runs];
            u.c0 = c;
            u.len = run_length(o, r + c, valid - c, u.step, u.delta);
            c += u.len;
        }
        // (div > 1: runs of eight, runs of four lost to fetch_any: a stride-2 grad input on an 8x8
        // map 1.38x faster, on a 4x4 map 0.86x, kernel alone, 2026-12-02)
        use_runs = use_runs && n_runs * (DIV ? 8 : 4) <= valid;
        if (DIV && use_runs) div_run_panels.fetch_add(1, std::memory_order_relaxed);
#if REPOPS_ISA == 2
        // rows in runs shorter than W (a grad weight's taps: 3 along a 3x3 kernel's row, 7 along
        // resnet18's first 7x7): along k where k steps evenly (resnet18's first grad weight,
        // 7x7 stride 2, kernel alone, 1 thread: 2.30 -> 1.81 ms, its runs of 7 before)
        if constexpr (NCHK > 0 && !DIV && P == 2 * W)
            if ((!use_runs || n_runs * W > valid) && ks_fit && k_segments() &&
                pack_k_panel<NCHK>(o, r, valid, kseg, size, panel, ok))
                continue;
#endif
        if (NCHK >= 0 && !DIV && use_runs) {  // run by run, each over all k of the block
            for (int64_t i = 0; i < n_runs; i++)
                pack_run_lanes<NCHK>(o, r + runs[i].c0, runs[i].len, o.ks + p0 * cols, cols, kc, runs[i].step,
                                     runs[i].delta, size, panel + runs[i].c0, P, ok);
            if (valid < P)
                for (int64_t k = 0; k < kc; k++) std::fill(panel + k * P + valid, panel + (k + 1) * P, 0.0f);
            continue;
        }
        for (int64_t k = 0; k < kc; k++) {
            const int64_t* kk = o.ks + (p0 + k) * cols;
            float* d = panel + k * P;
            int64_t c = 0;
            if (NCHK < 0 || (DIV && !use_runs)) {
                for (; c < valid; c++) d[c] = from_bits(fetch_any(o, r + c, kk, ok));
            } else if (DIV) {
                for (int64_t i = 0; i < n_runs; i++) {
                    const Run& u = runs[i];
                    if (!pack_steps_row_div<NCHK, float>(o, r + u.c0, u.len, kk, u.step, u.delta, shift, d + u.c0, 1, ok))
                        for (int64_t e = 0; e < u.len; e++) d[u.c0 + e] = from_bits(fetch_any(o, r + u.c0 + e, kk, ok));
                }
                c = valid;
            } else {
                const int64_t* ra = o.rows + r;
                for (; c < valid; c++) {
                    bool in = true;
                    for (int w = 0; w < NCHK; w++) in &= (uint64_t)(o.rows[(1 + w) * o.R + r + c] + kk[1 + w]) < size[w];
                    uint32_t bits = o.fill;
                    if (in) {
                        const int64_t addr = ra[c] + kk[0];
                        if ((uint64_t)addr < (uint64_t)o.numel)
                            bits = o.data[addr];
                        else
                            ok = false;
                    }
                    d[c] = from_bits(bits);
                }
            }
            for (; c < P; c++) d[c] = 0.0f;
        }
    }
#if REPOPS_ISA == 2
    // counted once per call: an atomic add per panel bounced its cache line between threads
    if (n_contiguous) contiguous_panels.fetch_add(n_contiguous, std::memory_order_relaxed);
#endif
}

template <int NCHK, bool DIV>
struct WinKind {
    static constexpr int nchk = NCHK;
    static constexpr bool div = DIV;
};

// f(WinKind<NCHK, DIV>{}) for operand o's windows: at most three, every divisor a power of two
// (NCHK of them, DIV if some divisor > 1), else NCHK = -1 (any windows: fetch_any).
template <class F>
void by_windows(const WinOperand& o, F&& f) {
    bool pow2 = o.nchk <= 3;
    for (int64_t w = 0; w < o.nchk && pow2; w++) pow2 = (o.wins[3 * w] & (o.wins[3 * w] - 1)) == 0;
    if (!pow2) return f(WinKind<-1, false>{});
    if (!all_div1(o)) {
        switch (o.nchk) {
            case 1: return f(WinKind<1, true>{});
            case 2: return f(WinKind<2, true>{});
            default: return f(WinKind<3, true>{});
        }
    }
    switch (o.nchk) {
        case 0: return f(WinKind<0, false>{});
        case 1: return f(WinKind<1, false>{});
        case 2: return f(WinKind<2, false>{});
        default: return f(WinKind<3, false>{});
    }
}

template <int P>
void pack(const WinOperand& o, int64_t r0, int64_t count, int64_t p0, int64_t kc, float* out, bool& ok) {
    by_windows(o, [&](auto kind) {
        using Kind = decltype(kind);
        pack_panels<P, Kind::nchk, Kind::div>(o, r0, count, p0, kc, out, ok);
    });
}

// A run of k of a gather (gather_runs): from k0, len entries stepping evenly (table_run).
struct KRun {
    int64_t k0, len, step, delta[MAX_CHECKED];
};

#if REPOPS_ISA == 2
// Rows [r0, r1) of a k-major gather of an operand without checked windows whose k come in runs
// (a channel statistic's input: rows the channels, k (image, pixel), each image's pixels one
// run of consecutive floats): per 16 rows and 16 k of a unit-step run, 16 loads, a transpose
// in registers (transpose_16x16) and 16 stores of a k's 16 rows each; the rest of each run, and
// rows past the last 16, element by element (pack_steps_row) as before. Bits are moved only.
// Element by element, the gathers of resnet18's batch-norm statistics took 40% of the samples
// of a channel_dot_xhat call on (32, 64, 16, 16) (perf), the chains themselves 9%.
void gather_kmajor_transposed(const WinOperand& o, int64_t r0, int64_t r1, const KRun* kruns, int64_t n_runs,
                              uint32_t* out, bool& ok) {
    const uint64_t size[1] = {0};
    const int64_t r16 = r0 + (r1 - r0) / W * W;
    for (int64_t u = 0; u < n_runs; u++) {
        const KRun& run = kruns[u];
        const int64_t a0 = o.ks[run.k0];  // k0 + c reads rows(0, r) + a0 + c*step
        const int64_t n16 = run.step == 1 ? run.len / W * W : 0;
        for (int64_t r = r0; r < r1; r += W) {
            const int64_t rows = std::min<int64_t>(W, r1 - r);
            int64_t done = 0;
            if (r < r16 && n16) {
                int64_t bmin = o.rows[r], bmax = o.rows[r];
                for (int64_t i = 1; i < W; i++) bmin = std::min(bmin, o.rows[r + i]), bmax = std::max(bmax, o.rows[r + i]);
                if (bmin + a0 >= 0 && bmax + a0 + n16 <= o.numel) {
                    for (int64_t c = 0; c < n16; c += W) {
                        __m512 v[W];
                        for (int64_t i = 0; i < W; i++)
                            v[i] = _mm512_castsi512_ps(_mm512_loadu_si512(o.data + o.rows[r + i] + a0 + c));
                        transpose_16x16(v);
                        for (int64_t t = 0; t < W; t++)
                            _mm512_storeu_si512(out + (run.k0 + c + t) * o.R + r, _mm512_castps_si512(v[t]));
                    }
                    done = n16;
                }
            }
            if (done < run.len)
                for (int64_t i = 0; i < rows; i++)
                    pack_steps_row<0, uint32_t>(o, r + i, run.len - done, o.ks + run.k0 + done, run.step, run.delta,
                                                size, out + (run.k0 + done) * o.R + r + i, o.R, ok);
        }
    }
}
#endif

// Rows [r0, r1) of the gather, NCHK div == 1 windows: runs of evenly stepping entries (along k,
// else along rows) copied as intervals, the fill outside them, as the GEMM's panels are. Layout
// (R, K) (out[r*K + k]) or k-major (K, R) (out[k*R + r]: an interpreter reading it has its lanes,
// the rows, contiguous at every k).
template <int NCHK>
void gather_runs(const WinOperand& o, int64_t r0, int64_t r1, int64_t K, uint32_t* out, bool kmajor, int64_t row0,
                 bool& ok) {
    uint64_t size[MAX_CHECKED] = {};
    for (int w = 0; w < NCHK; w++) size[w] = (uint64_t)o.wins[3 * w + 1];
    const int64_t cols = 1 + NCHK;
    int64_t step, delta[MAX_CHECKED];
    // Long runs along k (a channel statistic: k over images and pixels): each row's line of
    // the output written as intervals, in memory order on both sides.
    std::vector<KRun> kruns;
    for (int64_t k = 0; k < K;) {
        KRun u{};
        u.k0 = k;
        u.len = table_run(o.ks, 1, cols, NCHK, k, K - k, u.step, u.delta);
        kruns.push_back(u);
        k += u.len;
    }
    if ((int64_t)kruns.size() * 4 <= K) {
#if REPOPS_ISA == 2
        if (kmajor && NCHK == 0) {
            gather_kmajor_transposed(o, r0, r1, kruns.data(), (int64_t)kruns.size(), out, ok);
            return;
        }
#endif
        if (kmajor) {
            // a tiled transpose: KT k of a run (a part of a run steps evenly too) for every row
            // of the block, so the lines written (each k's rows) stay in L1 until full
            constexpr int64_t KT = 64;
            for (const KRun& u : kruns)
                for (int64_t c0 = 0; c0 < u.len; c0 += KT)
                    for (int64_t r = r0; r < r1; r++)
                        pack_steps_row<NCHK, uint32_t>(o, r, std::min(KT, u.len - c0), o.ks + (u.k0 + c0) * cols,
                                                       u.step, u.delta, size, out + (u.k0 + c0) * o.R + r, o.R, ok);
            return;
        }
        for (int64_t r = r0; r < r1; r++)
            for (const KRun& u : kruns)
                pack_steps_row<NCHK, uint32_t>(o, r, u.len, o.ks + u.k0 * cols, u.step, u.delta, size,
                                               out + (r - row0) * K + u.k0, 1, ok);
        return;
    }
    // Else runs of rows (pooling: a row's taps are short runs), each k's column written as them.
    for (int64_t r = r0; r < r1;) {
        const int64_t len = run_length(o, r, r1 - r, step, delta);
        for (int64_t k = 0; k < K; k++)
            pack_steps_row<NCHK, uint32_t>(o, r, len, o.ks + k * cols, step, delta, size,
                                           kmajor ? out + k * o.R + r : out + (r - row0) * K + k, kmajor ? 1 : K, ok);
        r += len;
    }
}

// Rows [r0, r1) of the gather: out[k * R + r] if kmajor, else out[(r - row0) * K + k] (row0 = 0:
// the whole operand's layout; row0 = r0: a buffer of those rows alone).
void gather_block(const WinOperand& o, int64_t r0, int64_t r1, int64_t K, uint32_t* out, bool kmajor, int64_t row0,
                  bool& ok) {
    if (all_div1(o)) {
        switch (o.nchk) {
            case 0: return gather_runs<0>(o, r0, r1, K, out, kmajor, row0, ok);
            case 1: return gather_runs<1>(o, r0, r1, K, out, kmajor, row0, ok);
            case 2: return gather_runs<2>(o, r0, r1, K, out, kmajor, row0, ok);
            default: return gather_runs<3>(o, r0, r1, K, out, kmajor, row0, ok);
        }
    }
    const int64_t cols = 1 + o.nchk;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t k = 0; k < K; k++)
            out[kmajor ? k * o.R + r : (r - row0) * K + k] = fetch_any(o, r, o.ks + k * cols, ok);
}

// ---------------------------------------------------------------- one row per batch entry (M == 1)
//
// A depthwise convolution (groups = channels, one output channel per group) is a windowed GEMM
// of one row per batch entry: M == 1. The micro-kernel's MR-row tile would do MR times the work
// with MR - 1 rows of zeros, and its B panels are packed to be read once. Instead each output
// element's chain stays in its own vector lane, lanes over up to W consecutive columns of a run
// (B's rows that step evenly: output positions along a row of the map, forward and grad input;
// the taps along a kernel row, grad weight), k ascending; a tap out of range is the fill (+0)
// and takes its FMA like any other. acc = a_0 * b_0, then fma(a_k, b_k, acc), NaN canonical at
// the end: the micro-kernel's chain, so the same bits. Items are (batch entry, column block)
// as before; one element's chain is never split.
//  - RowPlan (the usual case): every entry's B rows are entry 0's at an address offset (each
//    channel reads its own plane through the same windows), so entry 0's runs and, per (run, k),
//    the Span of elements in range are built once per call; an entry reads each (run, k) as one
//    masked load (or gather) from its plane. Up to RUN_V vectors (one run's or several short
//    runs') are carried together: independent chains that hide the FMA latency (the grad
//    weight's 3 runs of 3 taps over K = 8192).
//  - row_chains (any other tables): each (run, k) packed into a buffer in L1 (pack_steps_row),
//    or element by element where rows do not step evenly.

constexpr int RUN_V = 4;  // vectors of accumulators carried together (4 x W columns at most)

// out[c] (c < count) = the chain of the dense row a (K) with B's row r0 + c. Runs of rows that
// step evenly (run_length; at least 4 rows, 8 through divisor windows, as pack_panels asks)
// are packed per k as one interval; other rows W at a time, element by element (fetch_any).
template <int NCHK, bool DIV>
void row_chains(const WinOperand& b, const float* a, int64_t K, int64_t r0, int64_t count, float* out, bool& ok) {
    uint64_t size[MAX_CHECKED] = {};
    int shift[MAX_CHECKED] = {};
    for (int w = 0; w < NCHK; w++) {
        size[w] = (uint64_t)b.wins[3 * w + 1];
        shift[w] = __builtin_ctzll((uint64_t)b.wins[3 * w]);
    }
    const int64_t cols = 1 + b.nchk;
    alignas(64) float lanes[RUN_V * W] = {};  // lanes past a run's end: +0, computed and dropped
    for (int64_t c = 0; c < count;) {
        const int64_t r = r0 + c, span = std::min<int64_t>(count - c, RUN_V * W);
        int64_t step = 0, delta[MAX_CHECKED] = {};
        int64_t len = NCHK >= 0 ? run_length(b, r, span, step, delta) : 1;
        const bool as_run = NCHK >= 0 && len >= std::min<int64_t>(span, DIV ? 8 : 4);
        if (!as_run) len = std::min<int64_t>(span, W);
        const int64_t nv = ceil_div(len, W);
        Vec acc[RUN_V];
        for (int64_t k = 0; k < K; k++) {
            const int64_t* kk = b.ks + k * cols;
            if (as_run && !DIV) {
                pack_steps_row<NCHK < 0 ? 0 : NCHK, float>(b, r, len, kk, step, delta, size, lanes, 1, ok);
            } else if (!as_run ||
                       !pack_steps_row_div<NCHK < 0 ? 0 : NCHK, float>(b, r, len, kk, step, delta, shift, lanes, 1, ok)) {
                for (int64_t e = 0; e < len; e++) lanes[e] = from_bits(fetch_any(b, r + e, kk, ok));
            }
            const Vec ak = vbcast(a[k]);
#pragma GCC unroll 4
            for (int v = 0; v < RUN_V; v++)
                if (v < nv) acc[v] = k == 0 ? vmul(ak, vload(lanes + v * W)) : vfma(ak, vload(lanes + v * W), acc[v]);
        }
#pragma GCC unroll 4
        for (int v = 0; v < RUN_V; v++)
            if (v < nv) vstore(lanes + v * W, vcanon(acc[v]));
        std::memcpy(out + c, lanes, sizeof(float) * len);
        c += len;
    }
}

// Lane l of a Span's run, starting at element c0: element c0 + l (its address first + j*s for
// c0 + l = c1 + (j << pshift)), the fill elsewhere; entry ebase added to every address, which the
// caller checked (Span::inside). Unit steps: one (masked) load; other steps and periods: a masked
// gather. Masked-off lanes read nothing (expand-load from the first element where lanes begin
// before it), so no address outside the operand is formed.
inline Vec span_lanes(const uint32_t* data, int64_t ebase, const Span& sp, int64_t c0, Vec fill) {
    if (sp.n == 0) return fill;
    const int64_t j0 = c0 - sp.c1;
    const float* p = reinterpret_cast<const float*>(data + ebase + sp.first);
#if REPOPS_ISA == 2
    if (sp.pshift == 0 && sp.s == 1) {
        const int64_t lo = std::max<int64_t>(0, -j0), hi = std::min<int64_t>(W, sp.n - j0);
        if (lo >= hi) return fill;
        if (lo == 0 && hi == W) return {_mm512_loadu_ps(p + j0)};
        const __mmask16 m = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
        return {j0 >= 0 ? _mm512_mask_loadu_ps(fill.v, m, p + j0) : _mm512_mask_expandloadu_ps(fill.v, m, p)};
    }
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i j = _mm512_add_epi32(_mm512_set1_epi32((int)j0), iota), zero = _mm512_setzero_si512();
    const __mmask16 m = _mm512_cmpge_epi32_mask(j, zero) &
                        _mm512_cmplt_epi32_mask(j, _mm512_set1_epi32((int)(sp.n << sp.pshift))) &
                        _mm512_cmpeq_epi32_mask(_mm512_and_si512(j, _mm512_set1_epi32((1 << sp.pshift) - 1)), zero);
    if (m == 0) return fill;
    const __m512i i = _mm512_srav_epi32(j, _mm512_set1_epi32(sp.pshift));  // element index per lane
    // the lanes' elements within 32 consecutive floats (a stride-2 forward's row, a stride-2 grad
    // input's every other lane): two masked loads and a permute, cheaper than a gather here
    const int64_t i_lo = (j0 + __builtin_ctz(m)) >> sp.pshift, i_hi = (j0 + 31 - __builtin_clz(m)) >> sp.pshift;
    const int64_t span = (i_hi - i_lo) * sp.s + 1;
    if (sp.s > 0 && span <= 2 * W) {
        const float* q = p + i_lo * sp.s;
        const __m512 lo = _mm512_maskz_loadu_ps((__mmask16)((1u << std::min<int64_t>(span, W)) - 1), q);
        const __m512 hi = span > W ? _mm512_maskz_loadu_ps((__mmask16)((1u << (span - W)) - 1), q + W) : lo;
        const __m512i idx = _mm512_mullo_epi32(_mm512_sub_epi32(i, _mm512_set1_epi32((int)i_lo)), _mm512_set1_epi32((int)sp.s));
        return {_mm512_mask_blend_ps(m, fill.v, _mm512_permutex2var_ps(lo, idx, hi))};
    }
    const __m512i idx = _mm512_mullo_epi32(i, _mm512_set1_epi32((int)sp.s));
    return {_mm512_mask_i32gather_ps(fill.v, m, idx, p, 4)};
#elif REPOPS_ISA == 1
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    if (sp.pshift == 0 && sp.s == 1 && j0 >= 0) {
        const int64_t hi = std::min<int64_t>(W, sp.n - j0);
        if (hi <= 0) return fill;
        if (hi == W) return vload(p + j0);
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)hi), iota);
        return {_mm256_blendv_ps(fill.v, _mm256_maskload_ps(p + j0, m), _mm256_castsi256_ps(m))};
    }
    const __m256i j = _mm256_add_epi32(_mm256_set1_epi32((int)j0), iota);
    const __m256i in_lo = _mm256_cmpgt_epi32(j, _mm256_set1_epi32(-1));
    const __m256i in_hi = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(sp.n << sp.pshift)), j);
    const __m256i on = _mm256_cmpeq_epi32(_mm256_and_si256(j, _mm256_set1_epi32((1 << sp.pshift) - 1)),
                                          _mm256_setzero_si256());
    const __m256i m = _mm256_and_si256(in_lo, _mm256_and_si256(in_hi, on));
    const __m256i idx = _mm256_mullo_epi32(_mm256_srav_epi32(j, _mm256_set1_epi32(sp.pshift)), _mm256_set1_epi32((int)sp.s));
    return {_mm256_mask_i32gather_ps(fill.v, p, idx, _mm256_castsi256_ps(m), 4)};
#else
    if (j0 < 0 || (j0 & ((int64_t(1) << sp.pshift) - 1)) != 0 || (j0 >> sp.pshift) >= sp.n) return fill;
    return {p[(j0 >> sp.pshift) * sp.s]};
#endif
}

// One run of a panel's rows at every k of a K block (pack_panels; the k rows `ld` floats apart,
// k's table entries `cols` apart from ks): run by run, not k row by k row, so one call serves
// the block. On AVX-512 a unit-step span is moved 16 lanes at a time in one pass: the lanes in
// range loaded over the fill (masked-off lanes are never read), the run's lanes stored;
// otherwise, and on the other ISAs, write_span. resnet18's 64 -> 64 convolutions on 8 x 8 maps
// packed runs of 8 through write_span per (k, run) (a call, scalar fills and a masked move for 8
// floats; perf: packing 43% of the forward, the micro-kernel 33%); on AVX-512 those panels now
// take pack_contiguous_panel, and the figures here were measured before it. Kernel alone, 1
// thread, old and new builds taking turns (Intel machine of 2026-12-04, best of 2 s, two
// rounds): forward 1.83-1.89 -> 1.72-1.76 ms, grad input 1.95-1.97 -> 1.73-1.76, grad weight
// (runs of 3: not this path) 2.02-2.11 -> 2.09-2.15; on 32 x 32 maps (runs of 32) within
// noise. Bits are moved, never computed on (a NaN's payload survives as through a scalar copy).
// Through write_span (a memcpy call and scalar fills per k row), the im2col operand of the
// 64 -> 64 forward on 32 x 32 maps took as long to pack as its FMAs.
template <int NCHK>
void pack_run_lanes(const WinOperand& o, int64_t r, int64_t len, const int64_t* ks, int64_t cols, int64_t kc, int64_t step,
                    const int64_t* delta, const uint64_t* size, float* d, int64_t ld, bool& ok) {
#if REPOPS_ISA == 2
    const __m512 fill = _mm512_set1_ps(from_bits(o.fill));
    auto lanes = [](int64_t from, int64_t to) {  // lanes [from, to) of one vector, clipped to [0, W)
        from = std::max<int64_t>(from, 0), to = std::min<int64_t>(to, W);
        return from >= to ? (__mmask16)0 : (__mmask16)((((1u << (to - from)) - 1) << from) & 0xFFFFu);
    };
#endif
    for (int64_t k = 0; k < kc; k++, d += ld) {
        const Span sp = span_steps<NCHK>(o, r, len, ks + k * cols, step, delta, size);
#if REPOPS_ISA == 2
        if (sp.s == 1 || sp.n == 0) {
            if (!sp.inside(o.numel)) {
                ok = false;
                continue;
            }
            // where lane c of the run would read: data + first + (c - c1), for the lanes in range only
            const uintptr_t src = reinterpret_cast<uintptr_t>(o.data + sp.first) - (uintptr_t)(sp.c1 * sizeof(float));
            for (int64_t c = 0; c < len; c += W) {
                const __mmask16 in = lanes(sp.c1 - c, sp.c1 + sp.n - c);
                const __m512 v =
                    in ? _mm512_mask_loadu_ps(fill, in, reinterpret_cast<const float*>(src + c * sizeof(float))) : fill;
                _mm512_mask_storeu_ps(d + c, lanes(0, len - c), v);
            }
            continue;
        }
#endif
        write_span(o, sp, len, d, 1, ok);
    }
}

// The lanes of every batch entry at once (see above): entry 0's runs, grouped (consecutive runs of
// at most RUN_V vectors in all, never across a column block), and per (run, k) the Span of its
// elements in range, addresses relative to entry 0's first row, compacted to 16 bytes (the grad
// weight's plan is 3 runs x K spans, read once per entry).
struct PlanSpan {
    int32_t first, s;
    int16_t c1, n;
    int32_t pshift;
};
struct RowPlan {
    bool ok = false;
    std::vector<int64_t> run_c0, run_len, group_run, block_group;  // block_group[blk]: first group of blk
    std::vector<PlanSpan> spans;                                    // [run * K + k]
    int64_t lo_addr = 0, hi_addr = -1;                              // least / greatest relative address in range
};

// Spans held at most (beyond it: row_chains, which needs no plan).
constexpr int64_t ROW_PLAN_MAX_SPANS = int64_t(1) << 20;

template <int NCHK, bool DIV>
void build_row_plan(const WinOperand& b, int64_t K, int64_t nblocks, const std::function<int64_t(int64_t)>& block_begin,
                    RowPlan& pl) {
    uint64_t size[MAX_CHECKED] = {};
    int shift[MAX_CHECKED] = {};
    for (int w = 0; w < NCHK; w++) {
        size[w] = (uint64_t)b.wins[3 * w + 1];
        shift[w] = __builtin_ctzll((uint64_t)b.wins[3 * w]);
    }
    const int64_t cols = 1 + b.nchk, base0 = b.rows[0];
    pl.lo_addr = INT64_MAX;
    pl.hi_addr = INT64_MIN;
    for (int64_t blk = 0; blk < nblocks; blk++) {
        pl.block_group.push_back((int64_t)pl.group_run.size());
        const int64_t end = block_begin(blk + 1);
        int64_t group_vectors = RUN_V;
        for (int64_t c = block_begin(blk); c < end;) {
            int64_t step, delta[MAX_CHECKED];
            const int64_t len = run_length(b, c, std::min<int64_t>(end - c, RUN_V * W), step, delta);
            if ((int64_t)pl.spans.size() + K > ROW_PLAN_MAX_SPANS) return;
            const int64_t nv = ceil_div(len, W);
            if (group_vectors + nv > RUN_V) {
                pl.group_run.push_back((int64_t)pl.run_c0.size());
                group_vectors = 0;
            }
            group_vectors += nv;
            pl.run_c0.push_back(c);
            pl.run_len.push_back(len);
            for (int64_t k = 0; k < K; k++) {
                const int64_t* kk = b.ks + k * cols;
                Span sp;
                if (!DIV) sp = span_steps<NCHK>(b, c, len, kk, step, delta, size);
                else if (!span_steps_div<NCHK>(b, c, len, kk, step, delta, shift, sp)) return;
                PlanSpan ps{0, 0, 0, 0, 0};
                if (sp.n > 0) {
                    sp.first -= base0;
                    // the lanes' int32 indices and the compact fields must hold the values
                    if (std::abs(sp.s) >= (int64_t(1) << 24) || std::abs(sp.first) >= (int64_t(1) << 31)) return;
                    pl.lo_addr = std::min({pl.lo_addr, sp.first, sp.last()});
                    pl.hi_addr = std::max({pl.hi_addr, sp.first, sp.last()});
                    ps = PlanSpan{(int32_t)sp.first, (int32_t)sp.s, (int16_t)sp.c1, (int16_t)sp.n, sp.pshift};
                }
                pl.spans.push_back(ps);
            }
            c += len;
        }
    }
    pl.block_group.push_back((int64_t)pl.group_run.size());
    pl.group_run.push_back((int64_t)pl.run_c0.size());
    pl.ok = true;
}

// Whether batch entry bi's B rows in columns [j0, j0 + cols) are entry 0's at one offset
// (ebase): its address parts shifted by it, its window parts equal.
bool same_rows(const WinOperand& b, int64_t bi, int64_t N, int64_t j0, int64_t cols, int64_t& ebase) {
    ebase = b.rows[bi * N] - b.rows[0];
    uint64_t diff = 0;  // no early exit: the loop vectorises (an exit per entry cost as much as the FMAs)
    for (int64_t w = 0; w <= b.nchk; w++) {
        const int64_t* mine = b.rows + w * b.R + bi * N;
        const int64_t* first = b.rows + w * b.R;
        const int64_t off = w == 0 ? ebase : 0;
        for (int64_t j = j0; j < j0 + cols; j++) diff |= (uint64_t)(mine[j] - first[j] - off);
    }
    return diff == 0;
}

// out[c - j0] for the columns of block blk, entry ebase: each group's vectors carried over k.
void run_row_plan(const WinOperand& b, const RowPlan& pl, int64_t blk, int64_t ebase, const float* a, int64_t K,
                  int64_t j0, float* out) {
    const Vec fill = vbcast(from_bits(b.fill));
    alignas(64) float lanes[W];
    for (int64_t g = pl.block_group[blk]; g < pl.block_group[blk + 1]; g++) {
        // the group's vectors: slot i is vector vof[i] of run uof[i]
        int64_t uof[RUN_V], vof[RUN_V];
        int nslots = 0;
        for (int64_t u = pl.group_run[g]; u < pl.group_run[g + 1]; u++)
            for (int64_t v = 0; v < ceil_div(pl.run_len[u], W); v++) uof[nslots] = u, vof[nslots++] = v;
        const PlanSpan* sp[RUN_V];
        for (int i = 0; i < nslots; i++) sp[i] = pl.spans.data() + uof[i] * K;
        // the next group's reads (its runs' first and last elements in range at each k) asked for
        // now: an entry's plane is read in short rows far apart (one image's plane of one channel)
        if (g + 1 < pl.block_group[blk + 1])
            for (int64_t u = pl.group_run[g + 1]; u < pl.group_run[g + 2]; u++)
                for (int64_t k = 0; k < K; k++) {
                    const PlanSpan& ps = pl.spans[u * K + k];
                    if (ps.n == 0) continue;
                    __builtin_prefetch(b.data + ebase + ps.first);
                    __builtin_prefetch(b.data + ebase + ps.first + (int64_t)(ps.n - 1) * ps.s);
                }
        Vec acc[RUN_V];
        for (int64_t k = 0; k < K; k++) {
            const Vec ak = vbcast(a[k]);
#pragma GCC unroll 4
            for (int i = 0; i < RUN_V; i++)
                if (i < nslots) {
                    const PlanSpan& ps = sp[i][k];
                    const Span s{ps.first, ps.s, ps.c1, ps.n, ps.pshift};
                    const Vec x = span_lanes(b.data, ebase, s, vof[i] * W, fill);
                    acc[i] = k == 0 ? vmul(ak, x) : vfma(ak, x, acc[i]);
                }
        }
        for (int i = 0; i < nslots; i++) {
            vstore(lanes, vcanon(acc[i]));
            const int64_t c = pl.run_c0[uof[i]] + vof[i] * W;
            std::memcpy(out + (c - j0), lanes, sizeof(float) * std::min<int64_t>(W, pl.run_len[uof[i]] - vof[i] * W));
        }
    }
}

// The column blocks of the windowed GEMM's items: block j is columns [begin(j), begin(j + 1)).
// With enough items (row blocks x column blocks of at most nc) for the threads, nc-wide blocks;
// otherwise (the weight gradient: one batch entry of few rows) n blocks of whole NR panels, as
// even as panels allow, n chosen for the shortest estimated makespan: rounds x the largest
// item, an item costing rows x cols FMAs per k plus PACK_FMAS per element it packs (its A rows
// and B columns, per k). Every item packs its own operands, so each extra column block packs A
// once more: on a 64 x 576 x 32768 weight gradient (2 threads, 2026-12-02) four blocks of
// 160, 160, 160, 96 columns took 30% more CPU time than one thread's two blocks and 1.47x less
// wall; two blocks of 288 pack as much as one thread does, and split evenly.
struct ColumnBlocks {
    int64_t n, N, nc, panels;  // nc > 0: nc-wide blocks; 0: n blocks of whole panels
    int64_t begin(int64_t j) const {
        if (nc > 0) return std::min(N, j * nc);
        return std::min(N, (j * panels / n) * GEMM_NR);
    }
};

// Packing one operand element through its windows costs about as much as this many FMAs
// (perf, the 64 x 576 x 32768 weight gradient at one thread, AVX-512: micro-kernel 14.4%, the
// windowed B panels 14.4% for 18.9 M elements, the A panels 5.1% for 4.2 M, against 1.2 G FMAs:
// 64 and ~100). Only the choice of blocks depends on it, never a bit.
constexpr double PACK_FMAS = 64;

ColumnBlocks column_blocks(int64_t row_items, int64_t rows, int64_t N, int64_t nc, int64_t threads) {
    const int64_t by_nc = ceil_div(N, nc);
    if (threads <= 1 || row_items * by_nc >= 2 * threads) return {by_nc, N, nc, 0};
    const int64_t panels = ceil_div(N, GEMM_NR);
    const double r = (double)round_up(rows, GEMM_MR);
    const int64_t lo = std::min(by_nc, panels);
    ColumnBlocks best{lo, N, 0, panels};
    double best_cost = -1;
    for (int64_t n = lo; n <= std::min(panels, lo + 4 * threads); n++) {
        const double cols = (double)(ceil_div(panels, n) * GEMM_NR);
        const double rounds = (double)ceil_div(row_items * n, threads);
        const double cost = rounds * (r * cols + PACK_FMAS * (r + cols));
        if (best_cost < 0 || cost < best_cost) best.n = n, best_cost = cost;
    }
    return best;
}

}  // namespace

// ------------------------------------------------------------- taps that read only the fill, skipped exactly
//
// B's element at (column, tap) reads the fill, +0, wherever a window leaves the input: padding
// (every tap that hangs over the edge of a small map: a 3x3 convolution on resnet18's 1x1 maps
// reads the input at one tap of nine) and, through a div > 1 window, between the input's
// elements (a stride-2 convolution's grad input: three of every four (position, tap) pairs).
// The chain spends those FMAs on fma(a, +0, acc). Each adds a signed zero: exactly acc when
// acc != 0 (infinities and NaN included), and at most a zero's sign when acc is a zero, provided
// a is finite (0 * inf is NaN). So the chain over only the taps that read the input (its first
// one rounded, then FMA, k ascending: the same order) and the descriptor's chain are at every
// step either equal or both zeros: a product that is not exactly zero makes both round(a*b)
// whatever the zero's sign. Their final values are equal unless both are zeros.
//
// tap_class_gemm runs that. B's columns are grouped into classes by which taps read inside the
// input: per window the phase (v mod div) and the range of tap offsets that stay inside (taken
// within the taps' own range, so an interior column's range is "all of them"), the same in every
// batch entry. Per class, a GEMM over its columns and those taps only (every one of them reads
// inside the input for every column of the class, so the sub-operands keep no windows: after
// dividing, the phases' windows are plain ones, always in range), scattered into C; then every
// column holding a zero is recomputed with every tap (the descriptor's chain, sign of zero
// included). A class none of whose taps reads the input (a weight gradient's corner taps on a 1x1
// map; a stride-2 1x1 grad input's odd positions) is a chain of signed zeros, summed exactly: -0
// iff every product is -0, i.e. iff every A element of the row has the sign bit opposite to the
// fill's. Taken only when A's elements and fill are finite and B's fill is a zero, and when the
// estimated cost pays (tap_class_choice; else the caller runs the one GEMM). resnet18 at 32x32:
// its 3x3 layers on 1x1 maps read the input at one tap of nine, on 2x2 maps four, on 4x4 maps
// 69% of (position, tap) pairs.
std::atomic<int64_t> tap_class_gemms{0}, tap_class_zero_columns{0}, fill_only_columns{0};
std::atomic<int> tap_class_choice{TAP_CLASSES_BY_COST};
std::atomic<int64_t> tap_class_quick_rejects{0}, tap_class_bound_misses{0};
std::atomic<bool> tap_class_bound_audit{false};

namespace {

constexpr int64_t MAX_WINDOW_KEYS = 64, MAX_TAP_CLASSES = 256, MAX_ROW_VALUES = 1 << 16;

// Whether every element is finite: branch-free blocks, on the run's threads (this reads a
// layer's weights, 9.4 MB for a 512-channel 3x3 convolution, before each of its GEMMs, at memory
// speed).
bool all_finite(const uint32_t* data, int64_t n, int64_t threads) {
    constexpr int64_t BLOCK = 1 << 15;
    const int64_t blocks = ceil_div(n, BLOCK);
    std::atomic<bool> bad{false};
    parallel_items(blocks, threads_for(threads, blocks, (double)n, BINARY_MIN_ELEMS), [&](int64_t blk, int64_t) {
        if (bad.load(std::memory_order_relaxed)) return;
        uint32_t any = 0;
        const int64_t i1 = std::min(n, (blk + 1) * BLOCK);
        for (int64_t i = blk * BLOCK; i < i1; i++) any |= (uint32_t)((data[i] & 0x7f800000u) == 0x7f800000u);
        if (any) bad.store(true, std::memory_order_relaxed);
    });
    return !bad.load();
}

bool finite_bits(uint32_t u) { return ((u >> 23) & 0xff) != 0xff; }

// C's element (bi, i, j): row-major (batch, M, N) or the column split's layout.
struct CLayout {
    float* C;
    int64_t M, N, n_inner;
    ColumnSplit split;
    float* at(int64_t bi, int64_t i, int64_t j) const {
        return n_inner ? C + bi * split.batch_stride + (j / n_inner) * split.outer_stride + i * n_inner + j % n_inner
                       : C + bi * M * N + i * N + j;
    }
};

// An operand's tables restricted to the rows `src` (in that order) and the k rows `kk`. With
// phases `ph` (one per window), its div > 1 windows become div == 1 windows over q = v / div
// (v - ph of a row and v + ph of a tap are multiples of div by construction), whose address term
// q*stride is folded into the row and k address parts as windowed.Operand does for div == 1
// windows (stride entry 0). With `inside` (every (row, k) of it reads inside the input: a tap
// class's own taps), it has no windows left: each one's address term is in the address parts,
// and its range check would always pass (the panels pack as plain strided runs). Owns the tables
// the WinOperand points to.
struct SubOperand {
    std::vector<int64_t> rows, ks, wins;
    WinOperand op;
    SubOperand(const WinOperand& o, const std::vector<int64_t>& src, const std::vector<int64_t>& kk, const int64_t* ph,
               bool inside = false) {
        const int64_t nchk = inside ? 0 : o.nchk, w1 = 1 + nchk, R = (int64_t)src.size();
        auto divided = [&](int64_t w) { return ph && o.wins[3 * w] > 1; };
        rows.resize(w1 * R);
        for (int64_t r = 0; r < R; r++) {
            rows[r] = o.rows[src[r]];
            for (int64_t w = 0; w < o.nchk; w++) {
                int64_t v = o.rows[(1 + w) * o.R + src[r]];
                if (divided(w)) {
                    v = (v - ph[w]) / o.wins[3 * w];
                    rows[r] += v * o.wins[3 * w + 2];
                }
                if (w < nchk) rows[(1 + w) * R + r] = v;
            }
        }
        ks.resize(w1 * kk.size());
        for (size_t k = 0; k < kk.size(); k++) {
            const int64_t* from = o.ks + kk[k] * (1 + o.nchk);
            ks[k * w1] = from[0];
            for (int64_t w = 0; w < o.nchk; w++) {
                int64_t v = from[1 + w];
                if (divided(w)) {
                    v = (v + ph[w]) / o.wins[3 * w];
                    ks[k * w1] += v * o.wins[3 * w + 2];
                }
                if (w < nchk) ks[k * w1 + 1 + w] = v;
            }
        }
        wins.assign(o.wins, o.wins + 3 * nchk);
        for (int64_t w = 0; w < nchk; w++)
            if (divided(w)) wins[3 * w] = 1, wins[3 * w + 2] = 0;
        op = WinOperand{o.data, o.numel, rows.data(), ks.data(), R, nchk, wins.data(), o.fill};
    }
};

int64_t mod_pos(int64_t v, int64_t d) { return ((v % d) + d) % d; }

// Window w's rule for a row whose value along it is v: a tap of offset t reads the input iff
// lo <= t < hi (0 <= v + t < size x div) and v + t is divisible by div; otherwise it reads the
// fill. The tap classes (TapClasses::build) and the bound that may skip them (window_fill_pairs)
// both apply it.
struct WindowReach {
    int64_t div, lo, hi;
    bool inside(int64_t v, int64_t t) const { return lo <= t && t < hi && mod_pos(v + t, div) == 0; }
};
inline WindowReach window_reach(const WinOperand& b, int64_t w, int64_t v) {
    const int64_t div = b.wins[3 * w];
    return {div, -v, b.wins[3 * w + 1] * div - v};
}

// What one window decides about a column's taps: those with phase + t divisible by div and
// lo <= t < hi read inside the input (t: the tap's offset along the window, ks).
struct WindowKey {
    int64_t phase, lo, hi;
    bool operator==(const WindowKey& o) const { return phase == o.phase && lo == o.lo && hi == o.hi; }
};

// B's columns grouped by tap class (see above): per class its columns, its phase per window and
// how many taps read the input (count); the taps themselves (k ascending) once asked for.
// Cheap before the choice of path: one pass over the columns, and per window one over k per
// distinct key (a byte mask), per class one AND of the masks.
struct TapClasses {
    // per class: its columns (list_columns) and taps (list_taps), the windows' phases, how many
    // columns and taps it has
    std::vector<std::vector<int64_t>> cols, phases, taps;
    std::vector<int64_t> size, count;
    // Each column's class, and per class how many columns it has and how many of its taps
    // read inside (build); false where the classes do not apply. Counts only: the lists of
    // columns and taps are made once the classes are chosen (list_columns, list_taps).
    bool build(const WinOperand& b, int64_t batch, int64_t N, int64_t K) {
        nw = b.nchk;
        K_ = K;
        const int64_t w1 = 1 + nw;
        std::vector<std::vector<WindowKey>> keys(nw);  // distinct keys per window
        std::vector<int64_t> tmin(nw, INT64_MAX), tmax(nw, INT64_MIN);
        for (int64_t k = 0; k < K; k++)
            for (int64_t w = 0; w < nw; w++) {
                tmin[w] = std::min(tmin[w], b.ks[k * w1 + 1 + w]);
                tmax[w] = std::max(tmax[w], b.ks[k * w1 + 1 + w]);
            }
        auto key_of = [&](int64_t w, int64_t v) {  // of a row whose window w has value v
            const WindowReach reach = window_reach(b, w, v);
            const int64_t lo = std::clamp(reach.lo, tmin[w], tmax[w] + 1);
            const int64_t hi = std::clamp(reach.hi, tmin[w], tmax[w] + 1);
            return lo < hi ? WindowKey{mod_pos(v, reach.div), lo, hi} : WindowKey{0, 0, 0};  // no tap inside
        };
        // per window, the key's index for each row value v in [vmin, vmax] (a map's coordinates)
        std::vector<int64_t> vmin(nw, INT64_MAX), vmax(nw, INT64_MIN);
        std::vector<std::vector<int64_t>> id_of(nw);
        for (int64_t w = 0; w < nw; w++) {
            const int64_t* v = b.rows + (1 + w) * b.R;
            int64_t lo = INT64_MAX, hi = INT64_MIN;  // locals: through vmin[w] every row was a store
            for (int64_t r = 0; r < b.R; r++) lo = std::min(lo, v[r]), hi = std::max(hi, v[r]);
            vmin[w] = lo, vmax[w] = hi;
            if (vmax[w] - vmin[w] >= MAX_ROW_VALUES) return false;
            for (int64_t x = vmin[w]; x <= vmax[w]; x++) {
                const WindowKey key = key_of(w, x);
                int64_t id = std::find(keys[w].begin(), keys[w].end(), key) - keys[w].begin();
                if (id == (int64_t)keys[w].size()) {
                    if (id == MAX_WINDOW_KEYS) return false;
                    keys[w].push_back(key);
                }
                id_of[w].push_back(id);
            }
        }
        auto class_of = [&](int64_t r) {  // mixed radix of the windows' key indices
            int64_t c = 0;
            for (int64_t w = 0; w < nw; w++) c = c * MAX_WINDOW_KEYS + id_of[w][b.rows[(1 + w) * b.R + r] - vmin[w]];
            return c;
        };
        for (int64_t bi = 1; bi < batch; bi++)
            for (int64_t j = 0; j < N; j++)
                if (class_of(bi * N + j) != class_of(j)) return false;
        // dense class numbers, in order of first column; a column of its left neighbour's class
        // (most of a map's row) without the hash lookup; one byte a column (MAX_TAP_CLASSES),
        // where a code and a list entry of int64 a column were written before
        static_assert(MAX_TAP_CLASSES <= 256);
        std::vector<int64_t> seen;
        std::unordered_map<int64_t, int64_t> class_no;
        col_class.resize(N);
        for (int64_t j = 0, c = -1, prev = -1; j < N; j++) {
            const int64_t code = class_of(j);
            if (j == 0 || code != prev) {
                auto [it, fresh] = class_no.emplace(code, (int64_t)seen.size());
                if (fresh) {
                    if ((int64_t)seen.size() == MAX_TAP_CLASSES) return false;
                    seen.push_back(code);
                    size.push_back(0);
                }
                c = it->second, prev = code;
            }
            col_class[j] = (uint8_t)c;
            size[c]++;
        }
        // per window and key, which taps it lets read the input
        masks.resize(nw);
        for (int64_t w = 0; w < nw; w++)
            for (const WindowKey& key : keys[w]) {
                std::vector<uint8_t> m(K);
                const int64_t div = b.wins[3 * w];
                for (int64_t k = 0; k < K; k++) {
                    const int64_t off = b.ks[k * w1 + 1 + w];
                    m[k] = key.lo <= off && off < key.hi && (div == 1 || mod_pos(key.phase + off, div) == 0);
                }
                masks[w].push_back(std::move(m));
            }
        key_ids.resize(seen.size());
        std::vector<uint8_t> in(K);
        for (size_t c = 0; c < seen.size(); c++) {
            int64_t code_c = seen[c];
            std::vector<int64_t> ids(nw), ph(nw);
            for (int64_t w = nw - 1; w >= 0; w--) ids[w] = code_c % MAX_WINDOW_KEYS, code_c /= MAX_WINDOW_KEYS;
            for (int64_t w = 0; w < nw; w++) ph[w] = keys[w][ids[w]].phase;
            taps_inside(ids, in.data());
            int64_t n = 0;
            for (int64_t k = 0; k < K; k++) n += in[k];
            count.push_back(n);
            phases.push_back(std::move(ph));
            key_ids[c] = std::move(ids);
        }
        return true;
    }
    // cols[c] for every class
    void list_columns() {
        cols.assign(size.size(), {});
        for (size_t c = 0; c < size.size(); c++) cols[c].reserve(size[c]);
        for (size_t j = 0; j < col_class.size(); j++) cols[col_class[j]].push_back((int64_t)j);
    }
    // taps[c] for every class
    void list_taps() {
        std::vector<uint8_t> in(K_);
        for (size_t c = 0; c < cols.size(); c++) {
            taps_inside(key_ids[c], in.data());
            std::vector<int64_t> t;
            t.reserve(count[c]);
            for (int64_t k = 0; k < K_; k++)
                if (in[k]) t.push_back(k);
            taps.push_back(std::move(t));
        }
    }

   private:
    int64_t nw = 0, K_ = 0;
    std::vector<std::vector<std::vector<uint8_t>>> masks;  // [window][key][k]
    std::vector<std::vector<int64_t>> key_ids;             // [class][window]
    std::vector<uint8_t> col_class;                        // [column]
    void taps_inside(const std::vector<int64_t>& ids, uint8_t* in) const {
        std::fill(in, in + K_, (uint8_t)1);
        for (int64_t w = 0; w < nw; w++) {
            const uint8_t* m = masks[w][ids[w]].data();
            for (int64_t k = 0; k < K_; k++) in[k] &= m[k];
        }
    }
};

}  // namespace

bool windowed_gemm_one(const WinOperand& a, const WinOperand& b, float* C, int64_t batch, int64_t M, int64_t N,
                       int64_t K, int64_t threads, int64_t mc, int64_t kc, int64_t nc, ColumnSplit split);

// Costs in FMAs (the choice of path depends on them, never a bit), fitted to resnet18's
// convolutions on the development VM, AVX-512 (bench_conv.py --step resnet18 --nodes
// --tap-classes; the one GEMM's windowed panels cost PACK_FMAS per element): packing one
// element of an operand without windows (a strided transpose: A's weights or dy, a class's B);
// one element of the finiteness scan (~0.3-0.5 ms for 2.4 M weights); storing one output element
// through the column table (a scalar store, scattered: a weight gradient's class is one tap of
// every nine columns, and its stores cost more than its FMAs when K is small). The classes run
// when their estimate is at most MAX_COST_SHARE of the one GEMM's (resnet18's 3x3 layers on 8x8
// maps estimate 0.96 and measured 1.1-1.3x slower; on 4x4 maps 0.86 and 0.6-0.9x).
constexpr double PACK_PLAIN_FMAS = 16, SCAN_FMAS = 8, STORE_FMAS = 128, MAX_COST_SHARE = 0.9;
// Writing one element of C in a row written whole (the fill-only columns' zeros, vector stores).
constexpr double PREFILL_FMAS = 8;

// The (row, tap) pairs of b that window w takes outside the input (or between its elements, div >
// 1), from a histogram of its row values: one pass over the rows, then per distinct value a
// difference of two prefix counts of the taps' offsets (div == 1) or one pass over k. -1 where
// that is more work than a pass over the rows.
double window_fill_pairs(const WinOperand& b, int64_t K, int64_t w) {
    const int64_t w1 = 1 + b.nchk;
    // one pass: the histogram's range [lo, lo + size) grows to each value outside it
    const int64_t* v = b.rows + (1 + w) * b.R;
    int64_t lo = v[0];
    std::vector<int64_t> hist(1, 0);
    for (int64_t r = 0; r < b.R; r++) {
        const int64_t x = v[r];
        if (x < lo || x >= lo + (int64_t)hist.size()) {
            const int64_t new_lo = std::min(lo, x), new_hi = std::max(lo + (int64_t)hist.size() - 1, x);
            if (new_hi - new_lo >= MAX_ROW_VALUES) return -1;
            hist.insert(hist.begin(), lo - new_lo, 0);
            hist.resize(new_hi - new_lo + 1, 0);
            lo = new_lo;
        }
        hist[x - lo]++;
    }
    auto offset = [&](int64_t k) { return b.ks[k * w1 + 1 + w]; };
    double total = 0;
    if (b.wins[3 * w] == 1) {
        // taps by offset, cumulated: below(t) = how many taps have an offset < t
        int64_t tmin = INT64_MAX, tmax = INT64_MIN;
        for (int64_t k = 0; k < K; k++) tmin = std::min(tmin, offset(k)), tmax = std::max(tmax, offset(k));
        if (tmax - tmin >= MAX_ROW_VALUES) return -1;
        std::vector<int64_t> below(tmax - tmin + 2, 0);
        for (int64_t k = 0; k < K; k++) below[offset(k) - tmin + 1]++;
        for (size_t t = 1; t < below.size(); t++) below[t] += below[t - 1];
        auto taps_below = [&](int64_t t) { return below[std::clamp<int64_t>(t - tmin, 0, tmax - tmin + 1)]; };
        for (size_t x = 0; x < hist.size(); x++) {
            const WindowReach reach = window_reach(b, w, lo + (int64_t)x);  // div 1: inside iff lo <= offset < hi
            if (hist[x]) total += (double)hist[x] * (double)(taps_below(reach.lo) + K - taps_below(reach.hi));
        }
        return total;
    }
    int64_t distinct = 0;
    for (int64_t h : hist) distinct += h > 0;
    if (distinct * K > b.R) return -1;
    for (size_t x = 0; x < hist.size(); x++) {
        if (!hist[x]) continue;
        const int64_t val = lo + (int64_t)x;
        const WindowReach reach = window_reach(b, w, val);
        int64_t outside = 0;
        for (int64_t k = 0; k < K; k++) outside += !reach.inside(val, offset(k));
        total += (double)hist[x] * (double)outside;
    }
    return total;
}

// At least as many (row, tap) pairs of b as read the fill: window_fill_pairs summed over the
// windows (a pair outside two counts twice), the windows on up to `threads` threads; -1 if one
// of them is -1.
double fill_pairs_at_most(const WinOperand& b, int64_t K, int64_t threads) {
    std::vector<double> per(b.nchk, 0.0);
    parallel_items(b.nchk, threads_for(threads, b.nchk, (double)b.R * (double)b.nchk, BINARY_MIN_ELEMS),
                   [&](int64_t w, int64_t) { per[w] = window_fill_pairs(b, K, w); });
    double total = 0;
    for (double p : per) {
        if (p < 0) return -1;
        total += p;
    }
    return total;
}

// One GEMM item of the tap classes: class c's columns [j0, j1) (of its list) by A's rows [i0, i1)
// of batch entry bi, over the class's taps.
struct TapItem {
    int64_t c, bi, i0, i1, j0, j1;
};

// The class-by-class form (see above) if it applies and pays (MAX_COST_SHARE): true with `ok`
// set, else false (nothing written).
bool tap_class_gemm(const WinOperand& a, const WinOperand& b, float* C, int64_t batch, int64_t M, int64_t N,
                    int64_t K, int64_t threads, int64_t mc, int64_t kc, int64_t nc, ColumnSplit split,
                    int64_t n_inner, bool& ok) {
    // at most MAX_CHECKED windows: a class number is a mixed radix of MAX_WINDOW_KEYS per window
    // (64^8 = 2^48 fits int64; more windows would overflow it and merge classes)
    if (M <= 1 || b.nchk == 0 || b.nchk > MAX_CHECKED || (b.fill & 0x7fffffffu) != 0 || !finite_bits(a.fill))
        return false;
    for (int64_t w = 0; w < a.nchk; w++)
        if (a.wins[3 * w] != 1) return false;
    const int choice = tap_class_choice.load(std::memory_order_relaxed);
    if (choice == TAP_CLASSES_NEVER) return false;
    // an item's FMAs (the micro-tile's rounding included) and its panels packed (A without
    // windows is a strided transpose; B costs as much with or without its windows: a class's
    // columns read the input in shorter runs)
    const double pack_a = a.nchk ? PACK_FMAS : PACK_PLAIN_FMAS;
    auto cost = [&](int64_t rows, int64_t cols, int64_t k) {
        return (double)round_up(rows, GEMM_MR) * (double)round_up(cols, GEMM_NR) * (double)k +
               (double)k * (pack_a * (double)rows + PACK_FMAS * (double)cols);
    };
    double one = 0, rows_share = 0;  // the one GEMM's cost per batch entry; sum of (rows + PACK) per row block
    for (int64_t i0 = 0; i0 < M; i0 += mc) {
        rows_share += (double)round_up(std::min(mc, M - i0), GEMM_MR) + PACK_FMAS;
        for (int64_t j0 = 0; j0 < N; j0 += nc) one += cost(std::min(mc, M - i0), std::min(nc, N - j0), K);
    }
    // Before the classes are built (every call, and they rarely pay on maps much larger than the
    // kernel): each column's items cost at least (rows + PACK) FMAs per row block and tap read
    // inside, and at least R K - fill_pairs_at_most of the (row, tap) pairs read inside, so
    // where even that costs more than the share the classes may take, they cannot pay. The
    // same choice as building them, without the per-column pass: on a 64 -> 64 3x3 forward on
    // 32 x 32 maps, batch 32, building them cost 3% of the call at 1 thread and 5% at 2 (classes
    // by cost against never, paired; 2026-12-05), the bound 0.7% and 1%.
    // Under the audit (tests) the classes are built and costed anyway, and a rejected call whose
    // classes would have paid is counted (tap_class_bound_misses); the choice stays the same.
    bool rejected = false;
    if (choice == TAP_CLASSES_BY_COST) {
        const double fill = fill_pairs_at_most(b, K, threads);
        if (fill >= 0 && rows_share * ((double)b.R * (double)K - fill) + SCAN_FMAS * (double)a.numel >
                             MAX_COST_SHARE * (double)batch * one) {
            tap_class_quick_rejects.fetch_add(1, std::memory_order_relaxed);
            if (!tap_class_bound_audit.load(std::memory_order_relaxed)) return false;
            rejected = true;
        }
    }
    TapClasses tc;
    if (!tc.build(b, batch, N, K)) return false;
    // items: per batch entry, row block of mc and column block of nc (of each class's columns),
    // the classes innermost (one row block's part of C is written class after class while in
    // cache: a weight gradient's classes are its taps, each a column of every nine)
    std::vector<TapItem> items;
    const bool pays = [&] {
        double classes = 0;
        int64_t widest = 0, n_fill = 0;
        for (size_t c = 0; c < tc.size.size(); c++) {
            widest = std::max(widest, tc.size[c]);
            if (tc.count[c] == 0) n_fill += tc.size[c];
        }
        for (int64_t bi = 0; bi < batch; bi++)
            for (int64_t i0 = 0; i0 < M; i0 += mc)
                for (int64_t j0 = 0; j0 < widest; j0 += nc)
                    for (size_t c = 0; c < tc.size.size(); c++) {
                        const int64_t n = tc.size[c], k = tc.count[c];
                        if (k == 0 || j0 >= n) continue;
                        items.push_back({(int64_t)c, bi, i0, std::min(M, i0 + mc), j0, std::min(n, j0 + nc)});
                        if (bi == 0) classes += cost(std::min(mc, M - i0), std::min(nc, n - j0), k);
                    }
        // every other output element stored through the column table; with fill-only columns,
        // each row of C written whole first (its A row read once)
        classes += STORE_FMAS * (double)M * (double)(N - n_fill) +
                   (n_fill ? PREFILL_FMAS * (double)M * (double)N + (double)M * (double)K : 0.0);
        return (double)batch * classes + SCAN_FMAS * (double)a.numel <= MAX_COST_SHARE * (double)batch * one;
    }();
    if (rejected && pays) tap_class_bound_misses.fetch_add(1, std::memory_order_relaxed);
    if (rejected || (!pays && choice == TAP_CLASSES_BY_COST)) return false;
    if (!all_finite(a.data, a.numel, threads)) return false;  // 0 * a non-finite A element is NaN: no skip is exact
    tap_class_gemms.fetch_add(1, std::memory_order_relaxed);
    tc.list_columns();
    tc.list_taps();
    // C's element (bi, i, j) is row(bi, i) + col_off[j]
    const CLayout out{C, M, N, n_inner, split};
    std::vector<int64_t> col_off(N);
    for (int64_t j = 0; j < N; j++) col_off[j] = out.at(0, 0, j) - C;
    std::vector<std::atomic<uint8_t>> redo(N);  // columns to recompute with every tap
    for (auto& r : redo) r.store(0, std::memory_order_relaxed);
    std::atomic<bool> all_ok{true};
    // Runs items over the columns `cols[c]` and taps `taps[c]` (phases[c] if given) and writes
    // them into C; with `mark`, marks the columns where a class that skips taps wrote a zero.
    auto run = [&](const std::vector<TapItem>& its, const std::vector<std::vector<int64_t>>& cols,
                   const std::vector<std::vector<int64_t>>& taps, const std::vector<std::vector<int64_t>>* phases) {
        double fmas = 0;
        for (const TapItem& it : its) fmas += (double)(it.i1 - it.i0) * (double)(it.j1 - it.j0) * (double)taps[it.c].size();
        parallel_items((int64_t)its.size(), threads_for(threads, (int64_t)its.size(), fmas, GEMM_MIN_FMAS),
                       [&](int64_t n, int64_t) {
                           thread_local std::vector<float> buf;
                           thread_local std::vector<int64_t> arows, brows;
                           const TapItem& it = its[n];
                           const std::vector<int64_t>& kk = taps[it.c];
                           const int64_t rows = it.i1 - it.i0, nc_ = it.j1 - it.j0;
                           arows.resize(rows);
                           brows.resize(nc_);
                           for (int64_t i = 0; i < rows; i++) arows[i] = it.bi * M + it.i0 + i;
                           for (int64_t j = 0; j < nc_; j++) brows[j] = it.bi * N + cols[it.c][it.j0 + j];
                           const SubOperand sa(a, arows, kk, nullptr);
                           const SubOperand sb(b, brows, kk, phases ? (*phases)[it.c].data() : nullptr, phases != nullptr);
                           buf.resize(rows * nc_);
                           if (!windowed_gemm_one(sa.op, sb.op, buf.data(), 1, rows, nc_, (int64_t)kk.size(), 1, mc, kc,
                                                  nc, {}))
                               all_ok = false;
                           const bool mark = phases && (int64_t)kk.size() < K;
                           for (int64_t i = 0; i < rows; i++) {
                               float* dst = out.at(it.bi, it.i0 + i, 0);
                               const float* src = buf.data() + i * nc_;
                               for (int64_t j = 0; j < nc_; j++) {
                                   const int64_t col = cols[it.c][it.j0 + j];
                                   dst[col_off[col]] = src[j];
                                   uint32_t u;
                                   std::memcpy(&u, src + j, 4);
                                   if (mark && (u & 0x7fffffffu) == 0) redo[col].store(1, std::memory_order_relaxed);
                               }
                           }
                       });
    };
    // Columns none of whose taps reads the input (every product a * fill): the row's zero, -0
    // iff each of them is -0. Each row of C is first written whole with it (vector stores), then
    // the classes overwrite their columns: 8 columns of 9 of a 3x3 grad weight on a 1x1 map are
    // such columns, scattered through every row.
    int64_t n_fill = 0;
    for (size_t c = 0; c < tc.cols.size(); c++)
        if (tc.taps[c].empty()) n_fill += (int64_t)tc.cols[c].size();
    if (n_fill) {
        fill_only_columns.fetch_add(n_fill, std::memory_order_relaxed);
        const uint32_t fill_sign = b.fill & 0x80000000u;
        const int64_t seg = n_inner ? n_inner : N;  // C's rows are contiguous in segments of seg columns
        parallel_items(batch * M,
                       threads_for(threads, batch * M, (double)(batch * M) * (double)(K + N), BINARY_MIN_ELEMS),
                       [&](int64_t row, int64_t) {
                           thread_local std::vector<uint32_t> arow;
                           arow.resize(K);
                           bool row_ok = true;
                           gather_block(a, row, row + 1, K, arow.data(), false, row, row_ok);
                           uint32_t all_neg = 0x80000000u;
                           for (int64_t k = 0; k < K; k++) all_neg &= arow[k] ^ fill_sign;
                           const float z = from_bits(all_neg);
                           for (int64_t j = 0; j < N; j += seg) {
                               float* dst = out.at(row / M, row % M, j);
                               std::fill(dst, dst + seg, z);
                           }
                           if (!row_ok) all_ok = false;
                       });
    }
    run(items, tc.cols, tc.taps, &tc.phases);
    std::vector<int64_t> zero_cols;
    for (int64_t j = 0; j < N; j++)
        if (redo[j].load(std::memory_order_relaxed)) zero_cols.push_back(j);
    if (!zero_cols.empty()) {  // every tap, the descriptor's chain: one class, no phases
        tap_class_zero_columns.fetch_add((int64_t)zero_cols.size(), std::memory_order_relaxed);
        std::vector<TapItem> again;
        const int64_t n = (int64_t)zero_cols.size();
        for (int64_t bi = 0; bi < batch; bi++)
            for (int64_t i0 = 0; i0 < M; i0 += mc)
                for (int64_t j0 = 0; j0 < n; j0 += nc) again.push_back({0, bi, i0, std::min(M, i0 + mc), j0, std::min(n, j0 + nc)});
        std::vector<int64_t> all_k(K);
        for (int64_t k = 0; k < K; k++) all_k[k] = k;
        run(again, {zero_cols}, {all_k}, nullptr);
    }
    ok = all_ok;
    return true;
}

bool windowed_gemm(const WinOperand& a, const WinOperand& b, float* C, int64_t batch, int64_t M, int64_t N, int64_t K,
                   int64_t threads, int64_t mc, int64_t kc, int64_t nc, ColumnSplit split) {
    const int64_t n_inner = column_split_error(split, batch, M, N) ? 0 : split.n_inner;
    bool ok = true;
    if (tap_class_gemm(a, b, C, batch, M, N, K, threads, mc, kc, nc, split, n_inner, ok)) return ok;
    return windowed_gemm_one(a, b, C, batch, M, N, K, threads, mc, kc, nc, split);
}

// windowed_gemm_one keeps A's packed panels per thread up to this many floats (1 MiB).
constexpr int64_t WGEMM_KEEP_A_FLOATS = int64_t(1) << 18;

bool windowed_gemm_one(const WinOperand& a, const WinOperand& b, float* C, int64_t batch, int64_t M, int64_t N,
                       int64_t K, int64_t threads, int64_t mc, int64_t kc, int64_t nc, ColumnSplit split) {
    // SAFETY: a split that could write outside C (or split a micro-tile) is not used; the
    // callers refuse one before (column_split_error), this keeps a bad call harmless.
    const int64_t n_inner = column_split_error(split, batch, M, N) ? 0 : split.n_inner;
    const int64_t ldc = n_inner ? n_inner : N;
    const CLayout out{C, M, N, n_inner, split};
    auto c_at = [&](int64_t bi, int64_t i, int64_t j) { return out.at(bi, i, j); };
    if ((double)batch * (double)M * (double)N * (double)K < (double)(1 << 20)) threads = 1;
    const int64_t mblocks = ceil_div(M, mc);
    const ColumnBlocks cb = column_blocks(batch * mblocks, std::min(mc, M), N, nc, threads);
    std::atomic<bool> all_ok{true};
    RowPlan plan;
    if (M == 1)
        by_windows(b, [&](auto kind) {
            using Kind = decltype(kind);
            if constexpr (Kind::nchk >= 0)
                build_row_plan<Kind::nchk, Kind::div>(b, K, cb.n, [&](int64_t j) { return cb.begin(j); }, plan);
        });
    // Runs shorter than 4 columns on average (a 2x2 map's rows) leave most lanes empty: with
    // enough columns for the micro-tile the GEMM below is faster (mobilenet_v2's 2x2 depthwise
    // layers, 2026-12-02: 0.5 ms against 0.8 ms); a grad weight's 9 taps in runs of 3 are not.
    constexpr int64_t MIN_RUN = W >= 8 ? 4 : 1;  // scalar: every lane is full
    if (M == 1 && !(plan.ok && (int64_t)plan.run_c0.size() * MIN_RUN > N && N >= GEMM_NR)) {
        // one row per batch entry (see RowPlan): items (batch entry, column block); each item's
        // outputs written in C's layout, segment by segment
        const int64_t nblocks = cb.n;
        parallel_items(batch * nblocks, threads, [&](int64_t item, int64_t) {
            thread_local std::vector<float> arow, outbuf;
            const int64_t bi = item / nblocks, blk = item % nblocks;
            const int64_t j0 = cb.begin(blk), cols = cb.begin(blk + 1) - j0;
            bool ok = true;
            outbuf.resize(cols);
            arow.resize(K);
            gather_block(a, bi, bi + 1, K, reinterpret_cast<uint32_t*>(arow.data()), false, bi, ok);
            int64_t ebase = 0;
            if (plan.ok && same_rows(b, bi, N, j0, cols, ebase)) {
                if (ebase + plan.lo_addr >= 0 && ebase + plan.hi_addr < b.numel)
                    run_row_plan(b, plan, blk, ebase, arow.data(), K, j0, outbuf.data());
                else
                    ok = false;
                row_plan_items.fetch_add(1, std::memory_order_relaxed);
            } else {
                by_windows(b, [&](auto kind) {
                    using Kind = decltype(kind);
                    row_chains<Kind::nchk, Kind::div>(b, arow.data(), K, bi * N + j0, cols, outbuf.data(), ok);
                });
                row_chain_items.fetch_add(1, std::memory_order_relaxed);
            }
            for (int64_t j = 0; j < cols;) {  // contiguous within a split's n_inner columns
                const int64_t seg = n_inner ? std::min(cols - j, n_inner - (j0 + j) % n_inner) : cols - j;
                std::memcpy(c_at(bi, 0, j0 + j), outbuf.data() + j, sizeof(float) * seg);
                j += seg;
            }
            if (!ok) all_ok = false;
        });
        return all_ok;
    }
    const int64_t nblocks = cb.n, n_items = batch * nblocks * mblocks;
    // A's panels over all of K, kept by each thread for the items that follow with the same
    // rows (a convolution's weights: every column block of pixels reads the same A), where they
    // are small (WGEMM_KEEP_A_FLOATS) and a thread has several column blocks to run.
    const bool keep_a = round_up(std::min(mc, M), GEMM_MR) * K <= WGEMM_KEEP_A_FLOATS && nblocks >= 2 * threads;
    const uint64_t call = keep_a ? new_call() : 0;
    parallel_items(n_items, threads, [&](int64_t item, int64_t) {
        thread_local std::vector<float> abuf, bbuf;
        thread_local OwnPacked kept_a;
        const int64_t bi = item / (nblocks * mblocks), rest = item % (nblocks * mblocks);
        const int64_t j0 = cb.begin(rest / mblocks), i0 = (rest % mblocks) * mc;
        const int64_t cols = cb.begin(rest / mblocks + 1) - j0, rows = std::min(mc, M - i0);
        const int64_t a_floats = round_up(rows, GEMM_MR);  // per k
        const auto [a_all, a_stale] = keep_a ? kept_a.get(a_floats * K, call, bi * mblocks + rest % mblocks)
                                             : std::pair<float*, bool>{nullptr, true};
        bool ok = true;
        for (int64_t p0 = 0; p0 < K; p0 += kc) {
            const int64_t kcur = std::min(kc, K - p0);
            float* const bp = at_least(bbuf, round_up(cols, GEMM_NR) * kcur);
            // K block p0's panels at a_floats * p0: every block before it is kc deep
            float* const ap = keep_a ? a_all + a_floats * p0 : at_least(abuf, a_floats * kcur);
            // B's panels packed (written to bp, read back by every row panel) cost 15% of a
            // 64 -> 64 3x3 forward on 32 x 32 maps at 1 thread. Tried on 2026-12-05, paired
            // against this (forward, 1 | 2 threads): each panel packed into one L1-sized buffer
            // and its micro-tiles run at once, 1.00 | 1.00; B not packed but read by the
            // micro-kernel where it lies (masked loads, each k's masks and address precomputed
            // per panel), 1.045 | 1.05: every row panel read the input's scattered lines again.
            pack<GEMM_NR>(b, bi * N + j0, cols, p0, kcur, bp, ok);
            if (a_stale) pack<GEMM_MR>(a, bi * M + i0, rows, p0, kcur, ap, ok);
            sweep_tiles(  // C not fetched ahead: not measured on the windowed GEMM's shapes
                rows, cols, ldc, false, [&](int64_t i, int64_t j) { return c_at(bi, i0 + i, j0 + j); },
                [&](int64_t ir, int64_t jr, float* c) {
                    micro_kernel(kcur, ap + ir * kcur, bp + jr * kcur, c, ldc, p0 == 0, p0 + kcur == K,
                                 std::min<int64_t>(GEMM_MR, rows - ir), std::min<int64_t>(GEMM_NR, cols - jr));
                });
        }
        if (!ok) all_ok = false;
    });
    return all_ok;
}

const char* column_split_error(const ColumnSplit& s, int64_t batch, int64_t M, int64_t N) {
    if (s.n_inner <= 0 || s.n_inner % GEMM_NR != 0 || N % s.n_inner != 0)
        return "n_inner must be a positive multiple of the micro-tile width dividing N";
    if (s.batch_stride < 0 || s.outer_stride < 0) return "split strides must be >= 0";
    const int64_t last = (batch - 1) * s.batch_stride + (N / s.n_inner - 1) * s.outer_stride + M * s.n_inner - 1;
    return last < batch * M * N ? nullptr : "the split layout leaves the output";
}

bool windowed_gather(const WinOperand& o, int64_t K, uint32_t* out, int64_t threads, bool kmajor) {
    std::atomic<bool> all_ok{true};
    // rows per item; k-major: at least 16, a cache line of each k's rows
    const int64_t per_item = std::max<int64_t>(kmajor ? 16 : 1, (1 << 16) / std::max<int64_t>(1, K));
    const int64_t n_items = ceil_div(o.R, per_item);
    // The plan's rule for a gather node (step_plan.cpp add_node): BINARY_MIN_ELEMS per thread.
    // A fixed 2^18 here left a node the plan runs alone on every thread (worth 2-4 threads, e.g.
    // the digits CNN's max-pool backward gathers of 2^17 elements) on one thread.
    threads = threads_for(threads, n_items, (double)o.R * (double)K, BINARY_MIN_ELEMS);
    parallel_items(n_items, threads, [&](int64_t item, int64_t) {
        bool ok = true;
        gather_block(o, item * per_item, std::min(o.R, (item + 1) * per_item), K, out, kmajor, 0, ok);
        if (!ok) all_ok = false;
    });
    return all_ok;
}

}  // namespace repops_cpu
