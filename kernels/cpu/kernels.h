// SPDX-License-Identifier: MIT
//
// kernels.h — the internal API between the translation units of the RepOps CPU extension
// (one extension per ISA, see simd.h): the fast kernels that the per-node path
// (bindings.cpp) and the whole-step plan (step_plan.cpp) call. Pointers are raw float32 bit
// storage; every address range was checked by the caller. No torch types here.
//
// Canonical orders (the spec, verde_chain/repops/library/; every kernel below keeps them):
//   dot product   acc = a[0]*b[0]                (one rounded multiply)
//                 acc = fma(a[k], b[k], acc)     k = 1 .. K-1 ascending; K == 0 gives +0
//   sum           acc = x[0]; acc = acc + x[k]   k = 1 .. K-1 ascending
//   max / min     acc = x[0]; acc = max(acc, x[k])   (rp_max / rp_min)
//   mean          sum / (float)K
//   add/sub/mul/div  one IEEE binary32 operation; max/min as above
// Every NaN result is the canonical NaN 0x7FC00000; subnormals are honoured (FpEnvGuard).
//
// Threads (pool.h): every kernel below splits its OUTPUT into items for parallel_items and asks
// threads_for how many threads its work is worth, with its family's minimum work per thread
// below (each about 5-10 us of one core's work, against a few us to wake a worker). The
// whole-step plan uses the same minimums to decide which nodes are worth threads of their own
// and which run side by side, one thread each.
#pragma once

#include <atomic>
#include <cstdint>

#include "simd.h"

namespace repops_cpu {

// Minimum work per thread (threads_for), per family, in that family's unit.
constexpr double GEMM_MIN_FMAS = 1 << 18;       // multiply-adds (vector FMAs: ~6 us)
constexpr double FOLD_MIN_ELEMS = 1 << 16;      // elements folded
constexpr double BINARY_MIN_ELEMS = 1 << 16;    // output elements (memory-bound)
constexpr double SCATTER_MIN_ELEMS = 1 << 16;   // g elements read + output elements written
constexpr double PROGRAM_MIN_INSTRS = 1 << 15;  // lane-instructions on the interpreter
constexpr double MAP_MIN_INSTRS = 1 << 17;      // lane-instructions of a compiled map
// Output elements of a permuting copy: a strided read per element (~3 ns: resnet18's conv
// permutes of 2^16 elements took ~0.19 ms at 1 thread, 2026-12-02), far from a binary's stream.
constexpr double PERMUTE_MIN_ELEMS = 1 << 14;

// ---------------------------------------------------------------------------- GEMM (gemm.cpp)

struct GemmArgs {
    const float* A;
    int64_t sab, sai, sak;  // a(b, i, k) = A[b*sab + i*sai + k*sak]
    const float* B;
    int64_t sbb, sbk, sbj;  // b(b, k, j) = B[b*sbb + k*sbk + j*sbj]
    float* C;               // contiguous (batch, M, N)
    int64_t batch, M, N, K;
    // Optional per-batch element offsets (batch dims that do not collapse to one stride, e.g.
    // a transposed (B, H) pair): a(b, ...) starts at A[aoff[b]] instead of A[b*sab].
    const int64_t* aoff = nullptr;
    const int64_t* boff = nullptr;
    const float* a_at(int64_t bi) const { return A + (aoff ? aoff[bi] : bi * sab); }
    const float* b_at(int64_t bi) const { return B + (boff ? boff[bi] : bi * sbb); }
    // One B for every batch entry (a weight applied to a batch of matrices: stride 0, no offsets).
    bool one_b() const { return boff == nullptr && sbb == 0; }
};

// C = A @ B in the dot-product order; mc/kc/nc: cache blocking, rounded to whole micro-panels by
// the caller (GEMM_MR, GEMM_NR); any values give the same bits.
void gemm(const GemmArgs& g, int64_t threads, int64_t mc, int64_t kc, int64_t nc);
// Row blocks of the pairs path run by a thread that helped a late thread's item (gemm.cpp,
// one item a thread), so far; and, for tests, how long the thread that takes item 1 of such a
// GEMM waits before it starts (microseconds; 0: not at all), so the other one helps.
extern std::atomic<int64_t> gemm_helped_blocks;
extern std::atomic<int64_t> gemm_late_item_us;

// ---------------------------------------------------------------------------- windowed GEMM (conv.cpp)

// One operand of a windowed dot chain (convolution and its gradients, repops/windowed.py) read
// in place: element (row r, k) is data[RA[r] + KA[k]] unless a checked window is out of range,
// where it is `fill`. Tables: rows[c * R + r] (column-major), ks[k * (1 + nchk) + c], for component
// c = 0 (the address part RA / KA) and c = 1 + w (window w's row / k part of v). Window w
// (wins[3w..3w+2] = div, size, stride): v = row part + k part; in range iff v >= 0, v % div == 0
// and v / div < size; a div > 1 window adds (v / div) * stride to the address (div == 1 windows
// have their stride folded into RA / KA already).
struct WinOperand {
    const uint32_t* data;
    int64_t numel;
    const int64_t* rows;  // (1 + nchk) x R
    const int64_t* ks;    // K x (1 + nchk)
    int64_t R, nchk;
    const int64_t* wins;  // nchk x 3
    uint32_t fill;
};

// C (batch, M, N) = A (rows batch*M) . B (rows batch*N) over K in the dot-product order, packing
// panels straight from the windows (implicit im2col: no unfolded copy). False if an address
// fell outside an operand (C is then unspecified). Layout: C row-major (batch, M, N), or, with
// split = {n_inner, batch stride, outer stride} (n_inner > 0 a multiple of GEMM_NR dividing N),
// element (b, i, j) at b*split[1] + (j / n_inner)*split[2] + i*n_inner + j % n_inner — a
// convolution's (image, group, channel, pixel) order, written by the micro-tiles directly (no
// permuting copy after); the caller checked those addresses.
struct ColumnSplit {
    int64_t n_inner = 0, batch_stride = 0, outer_stride = 0;
};
bool windowed_gemm(const WinOperand& a, const WinOperand& b, float* C, int64_t batch, int64_t M, int64_t N, int64_t K,
                   int64_t threads, int64_t mc, int64_t kc, int64_t nc, ColumnSplit split = {});
// Whether `split` is usable for a (batch, M, N) GEMM writing numel == batch*M*N elements: the
// reason it is not, else nullptr.
const char* column_split_error(const ColumnSplit& split, int64_t batch, int64_t M, int64_t N);
// Every element of one operand, out (R, K) raw bits, or (K, R) if kmajor (im2col made explicit:
// the dewindowed descriptors of pooling and per-channel statistics read it, k-major). False if
// an address fell outside.
bool windowed_gather(const WinOperand& o, int64_t K, uint32_t* out, int64_t threads, bool kmajor = false);
// Panels the windowed GEMM packed as runs through div > 1 windows (pack_steps_row_div) since
// the library loaded: tests read it to prove that path ran.
extern std::atomic<int64_t> div_run_panels;
// Panels whose rows' addresses follow each other, packed with lane masks (conv.cpp
// pack_contiguous_panel, AVX-512), since the library loaded: tests read it to prove that path ran.
extern std::atomic<int64_t> contiguous_panels;
// Panels packed along k with in-register transposes (conv.cpp pack_k_panel, AVX-512: a grad
// weight's taps), since the library loaded: tests read it to prove that path ran.
extern std::atomic<int64_t> k_panels;
// Windowed GEMMs run class by class over only the taps that read inside the input (padding at a
// small map's edges, a strided grad input's taps between dy's elements: conv.cpp tap_class_gemm),
// the columns they recomputed with every tap (a zero's sign), and the columns none of whose taps
// reads the input (summed as signed zeros) since the library loaded: tests read them to prove
// each path ran.
extern std::atomic<int64_t> tap_class_gemms, tap_class_zero_columns, fill_only_columns;
// When the tap classes run: by their estimated cost (the default), whenever they are exact (tests
// of their bits on shapes too small to pay), or never. Only the time depends on it.
enum TapClassChoice { TAP_CLASSES_BY_COST = 0, TAP_CLASSES_WHEN_EXACT = 1, TAP_CLASSES_NEVER = 2 };
extern std::atomic<int> tap_class_choice;
// Calls whose classes a cheap bound showed cannot pay, so they were not built; under the audit
// (tests: the classes built and costed anyway), those whose classes would have paid.
extern std::atomic<int64_t> tap_class_quick_rejects, tap_class_bound_misses;
extern std::atomic<bool> tap_class_bound_audit;
// Items of the one-row-per-batch-entry path (M == 1: depthwise convolutions) since the library
// loaded: lanes over columns read through the call's shared plan (row_plan_items) or packed per
// item (row_chain_items). Tests read them to prove those paths ran.
extern std::atomic<int64_t> row_plan_items, row_chain_items;

// ---------------------------------------------------------------------------- folds (reduce.cpp)

// out[r] = fold_k X[r*sr + k*sk], r < R, K >= 1; op: RpReduceOp (generated/repops_isa.h).
void reduce_into(const float* X, int64_t R, int64_t K, int64_t sr, int64_t sk, int64_t op, float* O,
                 int64_t threads);

// out[r] = the dot chain of A[r*sra + k*ska] and B[r*srb + k*skb] over k (norm.cpp: the
// normalisations' row statistics), r < R, K >= 1.
void rowdot_into(const float* A, const float* B, int64_t R, int64_t K, int64_t sra, int64_t ska, int64_t srb,
                 int64_t skb, float* O, int64_t threads);

// spec.scatter_add (embedding backward): out[v, d] = the spec's chain over p = 0 .. P-1 of
// (idx[p] == v ? g[p, d] : +0); V <= 2^24 rows of R elements.
void scatter_rows_into(const float* G, const float* IDX, int64_t P, int64_t R, int64_t V, float* O, int64_t threads);

// ---------------------------------------------------------------------------- elementwise (binary.cpp)

// O[i] = A[i] (op) B[i], i < n; op: RpBinOp.
void binary_into(const float* A, const float* B, float* O, int64_t n, int64_t op, int64_t threads);

// A compiled map (verde_chain/repops/backends/cpu/jit.py): fn(in, out, e0, e1) computes output
// elements [e0, e1). work: lane-instructions of the whole map (numel x program length).
using MapFn = void (*)(const void* const*, uint32_t*, int64_t, int64_t);
void map_into(MapFn fn, const void* const* in, uint32_t* out, int64_t n, int64_t work, int64_t threads);

}  // namespace repops_cpu
