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
#include <cstring>
#include <atomic>
#include <thread>
#include <vector>

#include "gemm_tile.h"
#include "kernels.h"

namespace repops_cpu {

std::atomic<int64_t> div_run_panels{0};

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

// One run (table_run) from row r and k row kk: a run of rows at one k, or a run of k at one
// row (kk its first k). Element c is in range iff every window has 0 <= v0_w + c*delta_w <
// size_w, i.e. c in [lo, hi). Element c goes to d[c * ds]: a panel's k row (ds = 1, floats for
// the micro-kernel), a gather's column (ds = K) or line (ds = 1; raw bits).
template <int NCHK, typename T>
void pack_steps_row(const WinOperand& o, int64_t r, int64_t valid, const int64_t* kk, int64_t step,
                    const int64_t* delta, const uint64_t* size, T* d, int64_t ds, bool& ok) {
    int64_t lo = 0, hi = valid;
    for (int w = 0; w < NCHK; w++) {
        const int64_t v0 = o.rows[(1 + w) * o.R + r] + kk[1 + w], sz = (int64_t)size[w], dl = delta[w];
        if (dl == 0) {
            if (v0 < 0 || v0 >= sz) hi = 0;
            continue;
        }
        if (v0 < 0) lo = std::max(lo, (-v0 + dl - 1) / dl);
        hi = sz - v0 <= 0 ? 0 : std::min(hi, (sz - v0 + dl - 1) / dl);
    }
    const T fill = as_elem<T>(o.fill);
    if (hi <= lo) {
        lo = hi = 0;
    } else {
        const int64_t base = o.rows[r] + kk[0];
        const int64_t first = base + lo * step, last = base + (hi - 1) * step;
        if (std::min(first, last) < 0 || std::max(first, last) >= o.numel) {
            ok = false;
            return;
        }
        if (step == 1 && ds == 1) {
            std::memcpy(d + lo, o.data + first, sizeof(T) * (hi - lo));
        } else {
            for (int64_t c = lo; c < hi; c++) d[c * ds] = as_elem<T>(o.data[base + c * step]);
        }
    }
    for (int64_t c = 0; c < lo; c++) d[c * ds] = fill;
    for (int64_t c = hi; c < valid; c++) d[c * ds] = fill;
}

// pack_steps_row for a run through windows some of which have div > 1, every div a power of
// two (a strided convolution's grad input reads dy at v / stride): element c is in range iff,
// for every window w, 0 <= v_w(c) = v0_w + c*delta_w < size_w*div_w and div_w divides v_w(c);
// its address is then rows(0, r) + kk[0] + c*step + sum_w (v_w(c) / div_w)*stride_w (the stride
// entry of a div == 1 window is 0: its term is in rows(0) / ks(0)). The divisibility holds for
// c in one residue class modulo p_w = div_w / gcd(delta_w, div_w) (for no c if that gcd does not
// divide v0_w), so with at most one window of p_w > 1 the elements in range are c = c1, c1 + p,
// ... < hi, whose addresses step evenly: a strided copy, the fill everywhere else. Shifts and
// masks only (a division per run and k cost more than fetch_any per element). Two windows of
// p_w > 1 (a run along a diagonal, which the tables never give a convolution): false, nothing
// written (the caller packs the run element by element).
template <int NCHK, typename T>
bool pack_steps_row_div(const WinOperand& o, int64_t r, int64_t valid, const int64_t* kk, int64_t step,
                        const int64_t* delta, const int* shift, T* d, int64_t ds, bool& ok) {
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
    const T fill = as_elem<T>(o.fill);
    for (int64_t c = 0; c < valid; c++) d[c * ds] = fill;
    const int64_t period = int64_t(1) << pshift;
    const int64_t c1 = lo <= residue ? residue : residue + (((lo - residue + period - 1) >> pshift) << pshift);
    if (c1 >= hi) return true;
    const int64_t n = (hi - c1 + period - 1) >> pshift;
    // the address of c1 and its step per element in range: a window that moves (dl != 0) adds
    // period*dl/div (an integer: p_w divides period) strides per element (fetch_any's address;
    // 0 for a div == 1 window, whose stride entry is 0)
    int64_t first = a0 + c1 * step, s = period * step;
    for (int w = 0; w < NCHK; w++) {
        const int64_t dl = delta[w];
        if (dl == 0) continue;
        const int64_t v1 = o.rows[(1 + w) * o.R + r] + kk[1 + w] + c1 * dl;
        first += (v1 >> shift[w]) * o.wins[3 * w + 2];
        s += ((period * dl) >> shift[w]) * o.wins[3 * w + 2];
    }
    const int64_t last = first + (n - 1) * s;
    if (std::min(first, last) < 0 || std::max(first, last) >= o.numel) {
        ok = false;
        return true;
    }
    for (int64_t j = 0; j < n; j++) d[(c1 + (j << pshift)) * ds] = as_elem<T>(o.data[first + j * s]);
    return true;
}

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
    if (NCHK == 0 && kc > 0) {
        kmin = kmax = o.ks[p0 * cols];
        for (int64_t k = 1; k < kc; k++) {
            kmin = std::min(kmin, o.ks[(p0 + k) * cols]);
            kmax = std::max(kmax, o.ks[(p0 + k) * cols]);
        }
    }
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
            } else if (use_runs) {
                for (int64_t i = 0; i < n_runs; i++)
                    pack_steps_row<NCHK, float>(o, r + runs[i].c0, runs[i].len, kk, runs[i].step, runs[i].delta,
                                                size, d + runs[i].c0, 1, ok);
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
}

template <int P>
void pack(const WinOperand& o, int64_t r0, int64_t count, int64_t p0, int64_t kc, float* out, bool& ok) {
    bool pow2 = o.nchk <= 3;
    for (int64_t w = 0; w < o.nchk && pow2; w++) pow2 = (o.wins[3 * w] & (o.wins[3 * w] - 1)) == 0;
    if (!pow2) return pack_panels<P, -1>(o, r0, count, p0, kc, out, ok);
    if (!all_div1(o)) {
        switch (o.nchk) {
            case 1: return pack_panels<P, 1, true>(o, r0, count, p0, kc, out, ok);
            case 2: return pack_panels<P, 2, true>(o, r0, count, p0, kc, out, ok);
            default: return pack_panels<P, 3, true>(o, r0, count, p0, kc, out, ok);
        }
    }
    switch (o.nchk) {
        case 0: return pack_panels<P, 0>(o, r0, count, p0, kc, out, ok);
        case 1: return pack_panels<P, 1>(o, r0, count, p0, kc, out, ok);
        case 2: return pack_panels<P, 2>(o, r0, count, p0, kc, out, ok);
        default: return pack_panels<P, 3>(o, r0, count, p0, kc, out, ok);
    }
}

// Rows [r0, r1) of the gather, NCHK div == 1 windows: runs of evenly stepping entries (along k,
// else along rows) copied as intervals, the fill outside them, as the GEMM's panels are. Layout
// (R, K) (out[r*K + k]) or k-major (K, R) (out[k*R + r]: an interpreter reading it has its lanes,
// the rows, contiguous at every k).
template <int NCHK>
void gather_runs(const WinOperand& o, int64_t r0, int64_t r1, int64_t K, uint32_t* out, bool kmajor, bool& ok) {
    uint64_t size[MAX_CHECKED] = {};
    for (int w = 0; w < NCHK; w++) size[w] = (uint64_t)o.wins[3 * w + 1];
    const int64_t cols = 1 + NCHK;
    int64_t step, delta[MAX_CHECKED];
    // Long runs along k (a channel statistic: k over images and pixels): each row's line of
    // the output written as intervals, in memory order on both sides.
    struct KRun {
        int64_t k0, len, step, delta[MAX_CHECKED];
    };
    std::vector<KRun> kruns;
    for (int64_t k = 0; k < K;) {
        KRun u{};
        u.k0 = k;
        u.len = table_run(o.ks, 1, cols, NCHK, k, K - k, u.step, u.delta);
        kruns.push_back(u);
        k += u.len;
    }
    if ((int64_t)kruns.size() * 4 <= K) {
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
                                               out + r * K + u.k0, 1, ok);
        return;
    }
    // Else runs of rows (pooling: a row's taps are short runs), each k's column written as them.
    for (int64_t r = r0; r < r1;) {
        const int64_t len = run_length(o, r, r1 - r, step, delta);
        for (int64_t k = 0; k < K; k++)
            pack_steps_row<NCHK, uint32_t>(o, r, len, o.ks + k * cols, step, delta, size,
                                           kmajor ? out + k * o.R + r : out + r * K + k, kmajor ? 1 : K, ok);
        r += len;
    }
}

void gather_block(const WinOperand& o, int64_t r0, int64_t r1, int64_t K, uint32_t* out, bool kmajor, bool& ok) {
    if (all_div1(o)) {
        switch (o.nchk) {
            case 0: return gather_runs<0>(o, r0, r1, K, out, kmajor, ok);
            case 1: return gather_runs<1>(o, r0, r1, K, out, kmajor, ok);
            case 2: return gather_runs<2>(o, r0, r1, K, out, kmajor, ok);
            default: return gather_runs<3>(o, r0, r1, K, out, kmajor, ok);
        }
    }
    const int64_t cols = 1 + o.nchk;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t k = 0; k < K; k++) out[kmajor ? k * o.R + r : r * K + k] = fetch_any(o, r, o.ks + k * cols, ok);
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

bool windowed_gemm(const WinOperand& a, const WinOperand& b, float* C, int64_t batch, int64_t M, int64_t N, int64_t K,
                   int64_t threads, int64_t mc, int64_t kc, int64_t nc, ColumnSplit split) {
    // SAFETY: a split that could write outside C (or split a micro-tile) is not used; the
    // callers refuse one before (column_split_error), this keeps a bad call harmless.
    const int64_t n_inner = column_split_error(split, batch, M, N) ? 0 : split.n_inner;
    const int64_t ldc = n_inner ? n_inner : N;
    // (i, j) of batch entry bi: row-major (M, N), or the split layout
    auto c_at = [&](int64_t bi, int64_t i, int64_t j) {
        return n_inner ? C + bi * split.batch_stride + (j / n_inner) * split.outer_stride + i * n_inner + j % n_inner
                       : C + bi * M * N + i * N + j;
    };
    if ((double)batch * (double)M * (double)N * (double)K < (double)(1 << 20)) threads = 1;
    const int64_t mblocks = ceil_div(M, mc);
    const ColumnBlocks cb = column_blocks(batch * mblocks, std::min(mc, M), N, nc, threads);
    std::atomic<bool> all_ok{true};
    const int64_t nblocks = cb.n, n_items = batch * nblocks * mblocks;
    parallel_items(n_items, threads, [&](int64_t item, int64_t) {
        thread_local std::vector<float> abuf, bbuf;
        const int64_t bi = item / (nblocks * mblocks), rest = item % (nblocks * mblocks);
        const int64_t j0 = cb.begin(rest / mblocks), i0 = (rest % mblocks) * mc;
        const int64_t cols = cb.begin(rest / mblocks + 1) - j0, rows = std::min(mc, M - i0);
        bool ok = true;
        for (int64_t p0 = 0; p0 < K; p0 += kc) {
            const int64_t kcur = std::min(kc, K - p0);
            bbuf.resize(round_up(cols, GEMM_NR) * kcur);
            abuf.resize(round_up(rows, GEMM_MR) * kcur);
            pack<GEMM_NR>(b, bi * N + j0, cols, p0, kcur, bbuf.data(), ok);
            pack<GEMM_MR>(a, bi * M + i0, rows, p0, kcur, abuf.data(), ok);
            for (int64_t jr = 0; jr < cols; jr += GEMM_NR)
                for (int64_t ir = 0; ir < rows; ir += GEMM_MR)
                    micro_kernel(kcur, abuf.data() + ir * kcur, bbuf.data() + jr * kcur, c_at(bi, i0 + ir, j0 + jr),
                                 ldc, p0 == 0, p0 + kcur == K, std::min<int64_t>(GEMM_MR, rows - ir),
                                 std::min<int64_t>(GEMM_NR, cols - jr));
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
        gather_block(o, item * per_item, std::min(o.R, (item + 1) * per_item), K, out, kmajor, ok);
        if (!ok) all_ok = false;
    });
    return all_ok;
}

}  // namespace repops_cpu
