// SPDX-License-Identifier: MIT
//
// repops_fp32.h — THE definition of every RepOps instruction on binary32 bit patterns, for every
// C++ and CUDA path: the twin of verde_chain/repops/fp32.py (the spec; docs/repops-spec.md §1).
//
//   kernels/repops_program.cuh      one element's program: the CUDA interpreter and its host build
//   kernels/cpu/interpreter.cpp     the CPU interpreter: one loop over a block of lanes per instruction
//   kernels/repops_map.h            compiled maps: W lanes per GCC vector, one vector op per instruction
//   kernels/cpu/*.cpp               scalar tails of the GEMM, folds, binaries and scatter
//
// NaN canonicalisation, signed zeros, MAX/MIN, LT/EQ, SELECT, RINT/FLOOR, LDEXP, GETEXP/GETMANT,
// COORD and the LOADIDX index rule are written once, here. Opcode numbers and the register-use
// table come from generated/repops_isa.h (scripts/codegen.py, from isa.py).
//
// Lanes. Every instruction is a template over its lane type U: uint32_t (one lane: the
// interpreters, the device) or a GCC vector of W uint32 lanes (compiled maps; repops_map.h
// declares the vector overloads of the primitives BEFORE including this header, so the templates
// find them). The definitions use only what both lane types have: integer and float operators,
// comparisons, and `cond ? a : b` on values computed unconditionally (a select, no branch), with
// conditions combined by `&` / `|`. Every function is total: operands outside an operation's
// domain give some value that a select discards, never undefined behaviour.
//
// Two layers:
//
//   primitives   the IEEE operations (add, sub, mul, div, fma, sqrt, roundToIntegral, the binary64
//                product and narrowing of LDEXP), bit casts and a few exact integer facts (leading
//                one, a small integer as binary32, LDEXP's clamped exponent). Each is ONE correctly
//                rounded or exact operation, spelled per target: the device as explicit _rn
//                intrinsics (never contracted, whatever --fmad says) and integer bit operations;
//                the host as C operators, conversions and libm builtins that compile to single
//                instructions (built with -ffp-contract=off, never fast-math); W lanes as vector
//                instructions (repops_map.h). A host build with -DRP_AS_DEVICE takes the device's
//                integer spellings (tests/test_cuda_program.py runs the CUDA interpreter's source
//                that way).
//   instructions rp_add .. rp_floor: the RepOps rules on top of the primitives, the same code on
//                every target. rp_<op>_value is an instruction's result before the canonical-NaN
//                rule (rp_<op> = rp_canon(rp_<op>_value)); see repops_map.h for why a straight-line
//                program may canonicalise once at its end.
#ifndef REPOPS_FP32_H
#define REPOPS_FP32_H

#include <stdint.h>

#include "generated/repops_isa.h"

#ifdef __CUDACC__
#define RP_HD __host__ __device__ __forceinline__
#else
#define RP_HD inline
#endif


#define RP_ONE_BITS 0x3F800000u
#define RP_SIGN_BIT 0x80000000u
#define RP_ABS_MASK 0x7FFFFFFFu
#define RP_INF_BITS 0x7F800000u

// A constant in every lane.
template <class U>
RP_HD U rp_splat(uint32_t c) {
    return U{} + c;
}

// ============================================================================ primitives (one lane)

RP_HD float rp_f(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
#endif
}
RP_HD uint32_t rp_u(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    __builtin_memcpy(&u, &f, 4);
    return u;
#endif
}
RP_HD double rp_d(uint64_t u) {
#ifdef __CUDA_ARCH__
    return __longlong_as_double((long long)u);
#else
    double d;
    __builtin_memcpy(&d, &u, 8);
    return d;
#endif
}

// Position of the leading one of 0 < m < 2^24 (floor(log2 m)); m = 0 gives some value. Device:
// clz; host: the exponent field of (float)m, an exact conversion below 2^24.
RP_HD int32_t rp_msb(uint32_t m) {
#if defined(__CUDA_ARCH__)
    return 31 - __clz((int)m);
#elif defined(RP_AS_DEVICE)
    return 31 - __builtin_clz(m | 1u);
#else
    return (int32_t)(rp_u((float)(int32_t)(m & 0xFFFFFFu)) >> 23) - 127;
#endif
}

// The exact binary32 of an integer |v| < 2^24 (COORD, GETEXP). Device: built on the bits (the
// leading one gives the exponent, the bits below it the fraction); host: one int -> float
// conversion, exact below 2^24.
RP_HD uint32_t rp_int_bits(int32_t v) {
#if defined(__CUDA_ARCH__) || defined(RP_AS_DEVICE)
    const uint32_t sign = v < 0 ? RP_SIGN_BIT : 0u;
    const uint32_t m = (uint32_t)(v < 0 ? -v : v);
    const int32_t top = rp_msb(m | 1u);  // the leading one (m = 0 is handled below)
    const uint32_t bits = sign | ((uint32_t)(top + 127) << 23) | ((m << ((uint32_t)(23 - top) & 31u)) & 0x7FFFFFu);
    return m == 0u ? 0u : bits;
#else
    return rp_u((float)v);
#endif
}

RP_HD float rp_fadd(float x, float y) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(x, y);
#else
    return x + y;
#endif
}
RP_HD float rp_fsub(float x, float y) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(x, y);
#else
    return x - y;
#endif
}
RP_HD float rp_fmul(float x, float y) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(x, y);
#else
    return x * y;
#endif
}
RP_HD float rp_fdiv(float x, float y) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(x, y);
#else
    return x / y;
#endif
}
RP_HD float rp_ffma(float x, float y, float z) {
#ifdef __CUDA_ARCH__
    return __fmaf_rn(x, y, z);
#else
    return __builtin_fmaf(x, y, z);
#endif
}
RP_HD float rp_fsqrt(float x) {
#ifdef __CUDA_ARCH__
    return __fsqrt_rn(x);
#else
    return __builtin_sqrtf(x);
#endif
}
// x * 2^e rounded once to binary32: the binary64 product is exact (|x| in [2^-149, 2^128),
// |e| <= 400), so the narrowing conversion is the only rounding.
RP_HD float rp_fscale(float x, int32_t e) {
    const double p2 = rp_d((uint64_t)(uint32_t)(e + 1023) << 52);
#ifdef __CUDA_ARCH__
    return __double2float_rn(__dmul_rn((double)x, p2));
#else
    return (float)((double)x * p2);
#endif
}

// Round to an integral value on the bits: IEEE roundToIntegralTiesToEven (floor_mode 0) or
// roundToIntegralTowardNegative (1), the device's spelling of rp_fround. |x| >= 2^23 (exponent
// field >= 150), inf and zeros are integral already; 0 < |x| < 1 rounds to 0 or 1 in magnitude;
// otherwise the fb fraction bits (1 .. 23) are dropped and one unit of the integer part added
// when rounding up, which may carry into the exponent (the bit-pattern arithmetic does that).
template <class U>
RP_HD U rp_round_int_bits(U u, int floor_mode) {
    const U zero = rp_splat<U>(0u), one = rp_splat<U>(1u);
    const U sign = u & RP_SIGN_BIT, mag = u & RP_ABS_MASK, e = mag >> 23;
    const U fb = (e >= 127u) & (e < 150u) ? rp_splat<U>(150u) - e : zero;
    const U mask = (one << fb) - 1u, frac = mag & mask, half = (mask + 1u) >> 1;
    const U odd = (mag >> fb) & 1u;
    const U up_rint = frac > half ? one : ((frac == half) & (frac != 0u) ? odd : zero);
    const U up_floor = (sign != 0u) & (frac != 0u) ? one : zero;
    const U general = sign | ((mag & ~mask) + ((floor_mode ? up_floor : up_rint) << fb));
    // 0 < |x| < 1: FLOOR gives -1 or +0; RINT gives +-1 above one half, else +-0 (ties to even).
    const U below_one = floor_mode ? (sign != 0u ? rp_splat<U>(0xBF800000u) : zero)
                                   : ((e == 126u) & (mag > 0x3F000000u) ? (sign | RP_ONE_BITS) : sign);
    const U r = (e < 127u) & (mag != 0u) ? below_one : general;
    return (mag > RP_INF_BITS) ? rp_splat<U>(RP_CANONICAL_NAN) : r;
}
// Device: on the bits; host: nearbyintf / floorf (one instruction with SSE4.1 or AVX).
// The host spells libm functions as GCC builtins (no <math.h>: compiled maps include this
// header, and header parsing would be most of their compile time).
RP_HD float rp_fround(float x, int floor_mode) {
#if defined(__CUDA_ARCH__) || defined(RP_AS_DEVICE)
    return rp_f(rp_round_int_bits<uint32_t>(rp_u(x), floor_mode));
#else
    return floor_mode ? __builtin_floorf(x) : __builtin_nearbyintf(x);
#endif
}

// LDEXP's exponent: an integral (or infinite) b as an integer clamped to [-400, 400]; other b:
// some value. Device: on the bits (exponent field >= 136 means |b| >= 512, inf included; a
// non-zero |b| < 1 gives 0); host: a float clamp and one exact conversion.
RP_HD int32_t rp_clamped_int(uint32_t ub) {
#if defined(__CUDA_ARCH__) || defined(RP_AS_DEVICE)
    const uint32_t mb = ub & RP_ABS_MASK, eb = mb >> 23;
    const uint32_t shift = (eb >= 127 && eb < 136) ? 150 - eb : 23u;
    uint32_t mag = eb >= 136 ? 400u : (eb >= 127 ? (((mb & 0x7FFFFFu) | 0x800000u) >> shift) : 0u);
    mag = mag > 400u ? 400u : mag;
    return (ub & RP_SIGN_BIT) ? -(int32_t)mag : (int32_t)mag;
#else
    const float y = rp_f(ub);
    const float yc = y > 400.0f ? 400.0f : (y < -400.0f ? -400.0f : y);
    return (int32_t)(yc == yc ? yc : 0.0f);
#endif
}

// ============================================================================ the rules

template <class U>
RP_HD auto rp_isnan(U u) {
    return (u & RP_ABS_MASK) > RP_INF_BITS;
}
template <class U>
RP_HD auto rp_is_zero(U u) {
    return (u & RP_ABS_MASK) == 0u;
}
// Every NaN result of an instruction is the canonical NaN, whatever the operands' payloads.
template <class U>
RP_HD U rp_canon(U u) {
    return rp_isnan(u) ? rp_splat<U>(RP_CANONICAL_NAN) : u;
}

// floor(log2|a|) of a finite non-zero a (subnormals included), as rp_msb's integer type.
template <class U>
RP_HD auto rp_ilogb(U mag) {
    typedef decltype(rp_msb(mag)) I;
    const U ex = mag >> 23;
    return ex != 0u ? (I)ex - 127 : rp_msb(mag | 1u) - 149;
}

// ---------------------------------------------------------------------------- values

// ADD .. SQRT: one IEEE operation, round to nearest even.
template <class U>
RP_HD U rp_add_value(U a, U b) {
    return rp_u(rp_fadd(rp_f(a), rp_f(b)));
}
template <class U>
RP_HD U rp_sub_value(U a, U b) {
    return rp_u(rp_fsub(rp_f(a), rp_f(b)));
}
template <class U>
RP_HD U rp_mul_value(U a, U b) {
    return rp_u(rp_fmul(rp_f(a), rp_f(b)));
}
template <class U>
RP_HD U rp_div_value(U a, U b) {
    return rp_u(rp_fdiv(rp_f(a), rp_f(b)));
}
template <class U>
RP_HD U rp_fma_value(U a, U b, U c) {
    return rp_u(rp_ffma(rp_f(a), rp_f(b), rp_f(c)));
}
template <class U>
RP_HD U rp_sqrt_value(U a) {
    return rp_u(rp_fsqrt(rp_f(a)));
}
// RINT: ties to even; FLOOR: toward -inf.
template <class U>
RP_HD U rp_rint_value(U a) {
    return rp_u(rp_fround(rp_f(a), 0));
}
template <class U>
RP_HD U rp_floor_value(U a) {
    return rp_u(rp_fround(rp_f(a), 1));
}
// SELECT: b when a != 0.0 as a float (NaN counts as true, -0 as zero), else c.
template <class U>
RP_HD U rp_select_value(U a, U b, U c) {
    return rp_is_zero(a) ? c : b;
}
// NEG, ABS, MOV: the sign bit flipped, cleared, kept.
template <class U>
RP_HD U rp_neg_value(U a) {
    return a ^ RP_SIGN_BIT;
}
template <class U>
RP_HD U rp_abs_value(U a) {
    return a & RP_ABS_MASK;
}
template <class U>
RP_HD U rp_mov_value(U a) {
    return a;
}

// ---------------------------------------------------------------------------- instructions

template <class U>
RP_HD U rp_add(U a, U b) {
    return rp_canon(rp_add_value(a, b));
}
template <class U>
RP_HD U rp_sub(U a, U b) {
    return rp_canon(rp_sub_value(a, b));
}
template <class U>
RP_HD U rp_mul(U a, U b) {
    return rp_canon(rp_mul_value(a, b));
}
template <class U>
RP_HD U rp_div(U a, U b) {
    return rp_canon(rp_div_value(a, b));
}
template <class U>
RP_HD U rp_fma(U a, U b, U c) {
    return rp_canon(rp_fma_value(a, b, c));
}
template <class U>
RP_HD U rp_sqrt(U a) {
    return rp_canon(rp_sqrt_value(a));
}
template <class U>
RP_HD U rp_rint(U a) {
    return rp_canon(rp_rint_value(a));
}
template <class U>
RP_HD U rp_floor(U a) {
    return rp_canon(rp_floor_value(a));
}
template <class U>
RP_HD U rp_select(U a, U b, U c) {
    return rp_canon(rp_select_value(a, b, c));
}
template <class U>
RP_HD U rp_neg(U a) {
    return rp_canon(rp_neg_value(a));
}
template <class U>
RP_HD U rp_abs(U a) {
    return rp_canon(rp_abs_value(a));
}
template <class U>
RP_HD U rp_mov(U a) {
    return rp_canon(rp_mov_value(a));
}

// The instructions below give the canonical NaN themselves (their value is their result).

// MAX/MIN: NaN if either is NaN; -0 < +0. Equal values have equal bits except +0/-0, so the AND
// of the patterns picks +0 for MAX and the OR picks -0 for MIN.
template <class U>
RP_HD U rp_max(U a, U b) {
    const auto x = rp_f(a), y = rp_f(b);
    U r = x > y ? a : b;
    r = x == y ? (a & b) : r;
    r = y != y ? rp_splat<U>(RP_CANONICAL_NAN) : r;
    return x != x ? rp_splat<U>(RP_CANONICAL_NAN) : r;
}
template <class U>
RP_HD U rp_min(U a, U b) {
    const auto x = rp_f(a), y = rp_f(b);
    U r = x < y ? a : b;
    r = x == y ? (a | b) : r;
    r = y != y ? rp_splat<U>(RP_CANONICAL_NAN) : r;
    return x != x ? rp_splat<U>(RP_CANONICAL_NAN) : r;
}
// LT/EQ: the IEEE comparison (false on NaN, -0 == +0) as 1.0 / +0.0.
template <class U>
RP_HD U rp_lt(U a, U b) {
    return rp_f(a) < rp_f(b) ? rp_splat<U>(RP_ONE_BITS) : rp_splat<U>(0u);
}
template <class U>
RP_HD U rp_eq(U a, U b) {
    return rp_f(a) == rp_f(b) ? rp_splat<U>(RP_ONE_BITS) : rp_splat<U>(0u);
}

// LDEXP a, b: a * 2^b rounded once. b must be integral; +-inf act as huge exponents (|b| is
// clamped to 400, beyond which every finite non-zero a already gives +-0 or +-inf). NaN for a NaN
// operand, a non-integral b, 0 * 2^+inf and inf * 2^-inf.
template <class U>
RP_HD U rp_ldexp(U a, U b) {
    const U cn = rp_splat<U>(RP_CANONICAL_NAN);
    const auto y = rp_f(b);
    U r = rp_canon(rp_u(rp_fscale(rp_f(a), rp_clamped_int(b))));
    r = rp_fround(y, 1) == y ? r : cn;                                                // NaN or non-integral b
    r = (b == RP_INF_BITS) & rp_is_zero(a) ? cn : r;                                  // 0 * 2^+inf
    r = (b == (RP_SIGN_BIT | RP_INF_BITS)) & ((a & RP_ABS_MASK) == RP_INF_BITS) ? cn : r;  // inf * 2^-inf
    return rp_isnan(a) ? cn : r;
}

// GETEXP: floor(log2|a|) exactly; +-0 -> -inf, +-inf -> +inf, NaN -> NaN.
template <class U>
RP_HD U rp_getexp(U a) {
    const U mag = a & RP_ABS_MASK;
    U r = rp_int_bits(rp_ilogb(mag));
    r = mag == 0u ? rp_splat<U>(0xFF800000u) : r;
    r = mag == RP_INF_BITS ? rp_splat<U>(RP_INF_BITS) : r;
    return rp_isnan(a) ? rp_splat<U>(RP_CANONICAL_NAN) : r;
}
// GETMANT: |a| / 2^GETEXP(a) in [1, 2), exact; +-0 and +-inf -> 1.0, NaN -> NaN. A subnormal's
// leading one moves to bit 23 (the implicit bit); the bits below it are the fraction.
template <class U>
RP_HD U rp_getmant(U a) {
    const U mag = a & RP_ABS_MASK;
    const U sub = mag << ((U)(23 - rp_msb(mag | 1u)) & 31u);
    U r = (((mag >> 23) == 0u ? sub : mag) & 0x7FFFFFu) | RP_ONE_BITS;
    r = (mag == 0u) | (mag == RP_INF_BITS) ? rp_splat<U>(RP_ONE_BITS) : r;
    return rp_isnan(a) ? rp_splat<U>(RP_CANONICAL_NAN) : r;
}

// ---------------------------------------------------------------------------- memory and coordinates

// COORD: an output coordinate (< 2^24, KernelDesc.validate) as its exact binary32.
RP_HD uint32_t rp_coord_bits(int64_t c) { return rp_int_bits((int32_t)c); }

// LOADIDX's index rule (program.index_of): the register's value if it is finite, integral and in
// [-2^31, 2^31); *ok = 0 otherwise (the instruction then yields the canonical NaN and reads
// nothing). -0 is index 0.
RP_HD int64_t rp_index(uint32_t u, int* ok) {
    const uint32_t mag = u & RP_ABS_MASK, ex = mag >> 23;
    const int64_t m = (int64_t)((mag & 0x7FFFFFu) | 0x800000u);
    const int64_t v = ex < 127 ? 0 : (ex >= 150 ? m << ((ex - 150) & 7u) : m >> ((150 - ex) & 31u));
    // |x| >= 2^31 (exponent field >= 158; inf and NaN too): only -2^31 itself is in range
    *ok = (ex < 158 || u == 0xCF000000u) && rp_floor(u) == u;
    return u == 0xCF000000u ? -2147483648LL : ((u & RP_SIGN_BIT) ? -v : v);
}

// LOADIDX's address: `base` (the descriptor's address: offset, coordinates and k terms) plus
// int(index) * idx_stride when the index obeys rp_index and the address lies in [0, numel);
// else -1 (the canonical NaN, no read). 128-bit arithmetic: no product can wrap into range.
RP_HD int64_t rp_loadidx_address(__int128 base, uint32_t index_bits, int64_t idx_stride, int64_t numel) {
    int ok;
    const int64_t idx = rp_index(index_bits, &ok);
    const __int128 addr = base + (__int128)idx * idx_stride;
    return (ok && addr >= 0 && addr < (__int128)numel) ? (int64_t)addr : -1;
}

#endif  // REPOPS_FP32_H
