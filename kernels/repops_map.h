// SPDX-License-Identifier: MIT
//
// repops_map.h — the W-lane layer of compiled maps (verde_chain/repops/backends/cpu/jit.py).
//
// A long straight-line map (K = 1, linear input maps: transcendentals, optimizer updates, the
// elementwise parts of norms and losses; indexed reads too: concat, gathers, slice gradients) is
// compiled into one loop over output elements, W of them per iteration (C++17, g++); a K > 1
// program (a chain) the same, with a loop over k inside it. The generated source of a map is
//
//     #define W 16
//     #include "repops_map.h"
//     RP_MAP_BODY(vu x0, vu x1) {
//         vu r0 = rp_splat<vu>(0u), ...; r3 = rp_fma_value(r1, r2, r0); ...; return rp_canon(r0);
//     }
//     extern "C" void repops_map(const void* const* in, uint32_t* out, int64_t e0, int64_t e1) { ... }
//
// Registers are GCC vectors of W bit patterns (vu) and every instruction is the template of
// kernels/repops_fp32.h instantiated for vu: the ONE definition, run on W lanes as vector
// instructions. This header only supplies the vector spellings of the primitives (bit casts,
// the IEEE operations, the leading one, small integers, LDEXP's exponent and product), which
// must be declared before repops_fp32.h so that its templates find them. Lanes hold different output elements,
// never parts of one, so W cannot change a bit.
//
// Canonical NaN once, at the end. A map uses the instructions' *values* (rp_<op>_value, no
// canonicalisation) where an instruction has one, and canonicalises the result once. That gives
// the spec's bits: no instruction's result depends on a NaN operand's payload (arithmetic and
// sign operations keep a NaN a NaN, RINT/FLOOR too; MAX/MIN/LDEXP/GETEXP/GETMANT return the
// canonical NaN; LT/EQ and SELECT's condition only ask "NaN or not", "zero or not"), so only the
// final register's bits can show a payload, and rp_canon fixes those. The same holds across a
// chain's k iterations: a register carried to the next k is an operand like any other. The one
// exception is a result last written by LOAD, LOADIDX or CONST, which the spec returns raw
// (jit.py leaves it).
//
// Build flags: -ffp-contract=off, no fast-math (each instruction stays one IEEE operation rounded
// once), -fno-trapping-math (selects may evaluate both sides; only FP exception flags, which
// nothing reads, could tell).
#ifndef REPOPS_MAP_H
#define REPOPS_MAP_H

#include <stdint.h>

#ifndef W
#error "define W (lanes per vector) before including repops_map.h"
#endif

typedef uint32_t vu __attribute__((vector_size(4 * W)));
typedef int32_t vi __attribute__((vector_size(4 * W)));
typedef float vf __attribute__((vector_size(4 * W)));
typedef int64_t vl __attribute__((vector_size(8 * W)));
typedef double vd __attribute__((vector_size(8 * W)));

// ============================================================================ primitives, W lanes

inline vf rp_f(vu u) { return (vf)u; }
inline vu rp_u(vf f) { return (vu)f; }

inline vf rp_fadd(vf x, vf y) { return x + y; }
inline vf rp_fsub(vf x, vf y) { return x - y; }
inline vf rp_fmul(vf x, vf y) { return x * y; }
inline vf rp_fdiv(vf x, vf y) { return x / y; }

// fma, sqrt, roundToIntegral: the one-lane IEEE operation on every lane; GCC turns each loop into
// one vector instruction where the ISA has it (vfmadd, vsqrtps, vrndscaleps / vroundps). GCC's
// builtins, not <math.h> or <immintrin.h>: those headers would be most of a map's compile time.
inline vf rp_ffma(vf x, vf y, vf z) {
    vf r;
    for (int i = 0; i < W; i++) r[i] = __builtin_fmaf(x[i], y[i], z[i]);
    return r;
}
inline vf rp_fsqrt(vf x) {
    vf r;
    for (int i = 0; i < W; i++) r[i] = __builtin_sqrtf(x[i]);
    return r;
}
inline vf rp_fround(vf x, int floor_mode) {
    vf r;
    if (floor_mode) {
        for (int i = 0; i < W; i++) r[i] = __builtin_floorf(x[i]);
    } else {
        for (int i = 0; i < W; i++) r[i] = __builtin_nearbyintf(x[i]);
    }
    return r;
}

// The leading one of 0 < m < 2^24: the exponent field of (float)m (an exact conversion).
inline vi rp_msb(vu m) {
    const vf f = __builtin_convertvector((vi)(m & 0xFFFFFFu), vf);
    return (vi)((vu)f >> 23) - 127;
}
// A small integer (|v| < 2^24) as its exact binary32.
inline vu rp_int_bits(vi v) { return (vu)__builtin_convertvector(v, vf); }
// LDEXP's exponent: b clamped to [-400, 400] (NaN -> 0), converted exactly.
inline vi rp_clamped_int(vu b) {
    const vf y = (vf)b, hi = vf{} + 400.0f, lo = vf{} - 400.0f;
    vf c = y > hi ? hi : y;
    c = y < lo ? lo : c;
    c = y == y ? c : vf{};
    return __builtin_convertvector(c, vi);
}
// x * 2^e, the binary64 product exact and the narrowing the one rounding (as rp_fscale(float)).
inline vf rp_fscale(vf x, vi e) {
    const vd p2 = (vd)((__builtin_convertvector(e, vl) + 1023) << 52);
    return __builtin_convertvector(__builtin_convertvector(x, vd) * p2, vf);
}

#include "repops_fp32.h"

#define RP_MAP_BODY static inline __attribute__((always_inline)) vu body

// Lane i's index, 0 .. W-1.
inline vi rp_iota() {
    vi r;
    for (int i = 0; i < W; i++) r[i] = i;
    return r;
}

// p[at[i]] on every lane: one gather instruction where the ISA has one (GCC does not turn the
// loop into one). Every at[i] must be a valid index of p.
inline vu rp_gather_lanes(const uint32_t* p, vi at) {
#if defined(__AVX512F__) && W == 16
    return (vu)__builtin_ia32_gathersiv16sf(vf{}, p, at, (unsigned short)0xFFFF, 4);
#elif defined(__AVX2__) && W == 8
    return (vu)__builtin_ia32_gathersiv8sf(vf{}, (const float*)p, at, (vf)(vi{} - 1), 4);
#else
    vu r;
    for (int i = 0; i < W; i++) r[i] = p[at[i]];
    return r;
#endif
}

// LOADIDX on W lanes: lane i reads p at base[i] + int(index of lane i) * idx_stride, or yields the
// canonical NaN and reads nothing, by rp_loadidx_address (the one rule, which the C++ and CUDA
// interpreters call too). base[i] is the descriptor's address of lane i's element (jit.py computes it
// from the input's periodic map); lanes past a tail hold some element's base, and whatever they
// read lies inside the input too (the rule bounds every address by numel), nothing is stored.
inline vu rp_loadidx_lanes(const uint32_t* p, vl base, vu index_bits, int64_t idx_stride, int64_t numel) {
    vu r;
    for (int i = 0; i < W; i++) {
        const int64_t a = rp_loadidx_address(base[i], index_bits[i], idx_stride, numel);
        r[i] = a < 0 ? RP_CANONICAL_NAN : p[a];
    }
    return r;
}

// The same rule in 32-bit vector operations, for a map whose input has numel < 2^29 and whose
// descriptor addresses lie in (-2^29, 2^29) (jit.py emits it then, with `limit` the largest
// binary32 <= floor(2^30 / |idx_stride|), or 0 for a stride of 0: no limit). rp_index's rule:
// the value is an index if it is integral (floor(x) == x: neither NaN nor fractional) and
// |x| < 2^31 (exponent field < 158), or x = -2^31 exactly. An index with |x| > limit is at
// least 2^30 / |idx_stride| + 1 (no binary32 lies between limit and the floor), so its address
// is at least 2^30 - 2^29 away from [0, numel): it fails the rule anyway, and no product or sum
// below leaves int32 (|x * idx_stride| <= 2^30). Failing lanes convert +0 (no out-of-range
// conversion) and read element 0 (numel >= 1), then yield the canonical NaN: no branch per
// lane, as which lanes fail follows the data (half of a concat's reads).
inline vu rp_loadidx_lanes_small(const uint32_t* p, vi base, vu u, int32_t idx_stride, int32_t numel, float limit) {
    const vf x = (vf)u;
    vf fl;
    for (int i = 0; i < W; i++) fl[i] = __builtin_floorf(x[i]);
    vi ok = (((u & 0x7FFFFFFFu) >> 23) < 158u || u == 0xCF000000u) && fl == x;
    if (limit > 0) ok = ok && (x <= limit) && (x >= -limit);
    const vi a = base + __builtin_convertvector(ok ? x : vf{}, vi) * idx_stride;
    ok = ok && a >= 0 && a < numel;
    const vu r = rp_gather_lanes(p, ok ? a : vi{});
    return ok ? r : vu{} + RP_CANONICAL_NAN;
}

// The map's loop runs with the FP environment the spec assumes: no FTZ/DAZ, round to nearest
// (a library may have changed this thread's MXCSR).
#if defined(__x86_64__)
#define RP_MAP_FPENV_ENTER                              \
    const unsigned rp_csr = __builtin_ia32_stmxcsr(); \
    __builtin_ia32_ldmxcsr(rp_csr & ~(0x8000u | 0x0040u | 0x6000u))
#define RP_MAP_FPENV_EXIT __builtin_ia32_ldmxcsr(rp_csr)
#else
#define RP_MAP_FPENV_ENTER (void)0
#define RP_MAP_FPENV_EXIT (void)0
#endif

#endif  // REPOPS_MAP_H
