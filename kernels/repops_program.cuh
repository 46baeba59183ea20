// SPDX-License-Identifier: MIT
//
// repops_program.cuh — the RepOps scalar program interpreter for ONE output element, written
// once as __host__ __device__ code.
//
//   nvcc (kernels/repops_cuda.cu)     device code: every rounding is an explicit _rn intrinsic
//   g++ -O2 -ffp-contract=off         host code: plain IEEE float ops (+ fmaf, sqrtf); the tests
//                                     (tests/test_cuda_program.py) load it through ctypes and
//                                     compare its bits with reference.run on every op family
//
// so the device semantics are proven on a machine without a GPU as far as the source goes:
// the control flow, the addressing, the NaN / signed-zero / LOADIDX rules and the bit tricks
// below are the SAME code on both sides; only the six rounded operations (add, sub, mul, div,
// fma, sqrt) and two conversions change spelling, and each of those is one correctly rounded
// IEEE operation on both (PTX add.rn/sub.rn/mul.rn/div.rn/fma.rn/sqrt.rn without .ftz).
//
// Semantics: verde_chain/repops/fp32.py (instructions) and program.py (execution model):
//
//   registers  r0..r15, uint32 binary32 bit patterns, all +0.0 at the start (r0 may be preset:
//              the CUDA backend runs only the epilogue after the GEMM computed the dot chain)
//   order      prologue at k = 0; body for k = 1 .. K-1 ascending; epilogue at k = K-1
//   result     r0 (raw bits: a LOAD or CONST that writes r0 last keeps a NaN payload)
//   NaN        every arithmetic/sign instruction canonicalises NaN results to 0x7FC00000
//   LOAD t     data[offset + sum_d c[d]*strides[d] + k*kstride]   (box checked before launch)
//   LOADIDX t  the same + int(r_a) * idx_stride, where r_a must be finite, integral and in
//              [-2^31, 2^31) and the address inside [0, numel); otherwise 0x7FC00000, no read
//
// Encodings (identical to kernels/repops_cpu.cpp's run_program): programs are (n, 5) int64
// rows `op, dst, a, b, imm`; input maps are (n_inputs, rank + 4) int64 rows
// `strides[0..rank-1], kstride, offset, idx_stride, numel`. rp_decode() checks them.
#pragma once

#include <stdint.h>

#ifdef __CUDACC__
#define RP_HD __host__ __device__ __forceinline__
#else
#define RP_HD inline
#endif

#ifndef __CUDA_ARCH__
#include <math.h>
#include <string.h>
#endif

#define RP_MAX_RANK 6
#define RP_NUM_REGS 16
#define RP_CANONICAL_NAN 0x7FC00000u
#define RP_ONE_BITS 0x3F800000u

// Opcode numbers: verde_chain/repops/isa.py (part of the protocol; never renumbered).
enum RpOpcode {
    RP_ADD = 0, RP_SUB, RP_MUL, RP_DIV, RP_FMA, RP_SQRT, RP_MAX, RP_MIN, RP_LT, RP_EQ, RP_SELECT, RP_RINT,
    RP_LDEXP, RP_GETEXP, RP_GETMANT, RP_NEG, RP_ABS, RP_CONST, RP_LOAD, RP_COORD, RP_LOADIDX, RP_MOV, RP_FLOOR,
    RP_OP_COUNT
};

// One decoded instruction (16 bytes). imm is the c register for FMA/SELECT, else the immediate.
struct RpInstr {
    int32_t op;
    uint8_t dst, a, b, pad;
    uint32_t imm;
    uint32_t pad2;
};

// One decoded input map; `data` points at the input's bits (device memory in a kernel).
struct RpMap {
    const uint32_t* data;
    int64_t numel, kstride, offset, idx_stride;
    int64_t strides[RP_MAX_RANK];
};

// Everything one element's run can see. The pointers are device pointers inside a kernel.
struct RpProgram {
    int64_t shape[RP_MAX_RANK];
    int64_t rank, K, numel, n_in;
    const RpMap* maps;
    const RpInstr* code;  // prologue, body, epilogue back to back
    int64_t n_pro, n_body, n_epi;
};

// ---------------------------------------------------------------------------- bit helpers

RP_HD float rp_f(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}
RP_HD uint32_t rp_u(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}
RP_HD double rp_d(uint64_t u) {
#ifdef __CUDA_ARCH__
    return __longlong_as_double((long long)u);
#else
    double d;
    memcpy(&d, &u, 8);
    return d;
#endif
}
RP_HD bool rp_isnan(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }
RP_HD uint32_t rp_canon(uint32_t u) { return rp_isnan(u) ? RP_CANONICAL_NAN : u; }
// Leading zeros of a non-zero 32-bit word.
RP_HD int rp_clz(uint32_t x) {
#ifdef __CUDA_ARCH__
    return __clz((int)x);
#else
    return __builtin_clz(x);
#endif
}

// ---------------------------------------------------------------------------- the rounded ops
// The only places where a floating-point rounding happens. Device: explicit round-to-nearest
// intrinsics (never contracted or reassociated, whatever --fmad says). Host: one IEEE
// operation each (the host build uses -ffp-contract=off, so a*b+c is never fused behind our back).

RP_HD uint32_t rp_add(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return rp_canon(rp_u(__fadd_rn(rp_f(a), rp_f(b))));
#else
    return rp_canon(rp_u(rp_f(a) + rp_f(b)));
#endif
}
RP_HD uint32_t rp_sub(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return rp_canon(rp_u(__fsub_rn(rp_f(a), rp_f(b))));
#else
    return rp_canon(rp_u(rp_f(a) - rp_f(b)));
#endif
}
RP_HD uint32_t rp_mul(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return rp_canon(rp_u(__fmul_rn(rp_f(a), rp_f(b))));
#else
    return rp_canon(rp_u(rp_f(a) * rp_f(b)));
#endif
}
RP_HD uint32_t rp_div(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return rp_canon(rp_u(__fdiv_rn(rp_f(a), rp_f(b))));
#else
    return rp_canon(rp_u(rp_f(a) / rp_f(b)));
#endif
}
RP_HD uint32_t rp_fma(uint32_t a, uint32_t b, uint32_t c) {
#ifdef __CUDA_ARCH__
    return rp_canon(rp_u(__fmaf_rn(rp_f(a), rp_f(b), rp_f(c))));
#else
    return rp_canon(rp_u(fmaf(rp_f(a), rp_f(b), rp_f(c))));
#endif
}
RP_HD uint32_t rp_sqrt(uint32_t a) {
#ifdef __CUDA_ARCH__
    return rp_canon(rp_u(__fsqrt_rn(rp_f(a))));
#else
    return rp_canon(rp_u(sqrtf(rp_f(a))));
#endif
}

// ---------------------------------------------------------------------------- exact ops
// Everything below is exact (no rounding) and written with integer bit operations, so host
// and device run literally the same instructions.

// MAX/MIN: NaN if either is NaN; -0 < +0. Total order on non-NaN bit patterns: map the sign-
// magnitude pattern to a two's-complement-like key (negative values reversed).
// -0 -> -1, -x -> -|x|bits - 1 (no overflow: |x|bits <= 2^31 - 1), +x -> its bits.
RP_HD int32_t rp_key(uint32_t u) { return (u & 0x80000000u) ? -(int32_t)(u & 0x7FFFFFFFu) - 1 : (int32_t)u; }
RP_HD uint32_t rp_max(uint32_t a, uint32_t b) {
    if (rp_isnan(a) || rp_isnan(b)) return RP_CANONICAL_NAN;
    return rp_key(a) >= rp_key(b) ? a : b;
}
RP_HD uint32_t rp_min(uint32_t a, uint32_t b) {
    if (rp_isnan(a) || rp_isnan(b)) return RP_CANONICAL_NAN;
    return rp_key(a) <= rp_key(b) ? a : b;
}
// LT/EQ: false on NaN; -0 == +0.
RP_HD bool rp_is_zero(uint32_t u) { return (u & 0x7FFFFFFFu) == 0; }
RP_HD uint32_t rp_lt(uint32_t a, uint32_t b) {
    if (rp_isnan(a) || rp_isnan(b) || (rp_is_zero(a) && rp_is_zero(b))) return 0u;
    return rp_key(a) < rp_key(b) ? RP_ONE_BITS : 0u;
}
RP_HD uint32_t rp_eq(uint32_t a, uint32_t b) {
    if (rp_isnan(a) || rp_isnan(b)) return 0u;
    return (a == b || (rp_is_zero(a) && rp_is_zero(b))) ? RP_ONE_BITS : 0u;
}
// SELECT: b when a != 0.0 as a float (NaN counts as true, -0 as zero), else c.
RP_HD uint32_t rp_select(uint32_t a, uint32_t b, uint32_t c) { return rp_canon(rp_is_zero(a) ? c : b); }

// RINT (ties to even) and FLOOR, on the bits: |x| >= 2^23 (exponent field >= 150), inf and
// zeros are already integral; otherwise the fraction bits are dropped and the integer part
// adjusted, which can carry into the exponent (the bit pattern arithmetic does that for us).
RP_HD uint32_t rp_round_int(uint32_t u, bool floor_mode) {
    if (rp_isnan(u)) return RP_CANONICAL_NAN;
    const uint32_t sign = u & 0x80000000u, mag = u & 0x7FFFFFFFu;
    const uint32_t e = mag >> 23;
    if (e >= 150 || mag == 0) return u;
    if (e < 127) {  // 0 < |x| < 1
        if (floor_mode) return sign ? 0xBF800000u : 0u;          // -1 or +0
        if (e == 126 && mag > 0x3F000000u) return sign | RP_ONE_BITS;  // (0.5, 1) -> 1
        return sign;                                              // [0, 0.5] -> 0 (ties to even)
    }
    const uint32_t frac_bits = 150 - e;  // 1 .. 23 fraction bits in the significand
    const uint32_t mask = (1u << frac_bits) - 1;
    const uint32_t frac = mag & mask;
    if (frac == 0) return u;
    uint32_t trunc = mag & ~mask;  // |x| rounded toward zero (still a valid pattern)
    bool up;
    if (floor_mode) {
        up = sign != 0;  // negative non-integral: away from zero
    } else {
        const uint32_t half = 1u << (frac_bits - 1);
        up = frac > half || (frac == half && ((mag >> frac_bits) & 1u));
    }
    // Adding one unit of the integer part: the lowest integral bit's weight in the pattern.
    if (up) trunc += 1u << frac_bits;
    return sign | trunc;
}

// LDEXP a, b: a * 2^b rounded once. b must be integral (or +-inf, a huge exponent); |b| is
// clamped to 400, which keeps the binary64 product exact (|a| in [2^-149, 2^128)), so the
// binary64 -> binary32 conversion is the only rounding.
RP_HD uint32_t rp_ldexp(uint32_t ua, uint32_t ub) {
    if (rp_isnan(ub) || rp_isnan(ua)) return RP_CANONICAL_NAN;
    const uint32_t mb = ub & 0x7FFFFFFFu;
    const bool neg_b = (ub & 0x80000000u) != 0;
    int32_t e;
    if (mb == 0x7F800000u) {  // +-inf
        if (!neg_b && rp_is_zero(ua)) return RP_CANONICAL_NAN;                    // 0 * 2^+inf
        if (neg_b && (ua & 0x7FFFFFFFu) == 0x7F800000u) return RP_CANONICAL_NAN;  // inf * 2^-inf
        e = neg_b ? -400 : 400;
    } else {
        // integral? (exact check on the bits: no fraction bits below the binary point)
        if (rp_round_int(ub, true) != ub) return RP_CANONICAL_NAN;
        // |b| >= 512 (exponent field >= 136) is beyond the clamp; otherwise convert exactly.
        int32_t mag;
        if ((mb >> 23) >= 136) {
            mag = 400;
        } else if (mb == 0) {
            mag = 0;
        } else {
            const uint32_t ex = mb >> 23;  // >= 127 since b is integral and non-zero
            mag = (int32_t)(((mb & 0x7FFFFFu) | 0x800000u) >> (150 - ex));
            if (mag > 400) mag = 400;
        }
        e = neg_b ? -mag : mag;
    }
    // 2^e as binary64 bits; a as binary64 (exact).
    const double p2 = rp_d((uint64_t)(uint32_t)(e + 1023) << 52);
#ifdef __CUDA_ARCH__
    const double prod = __dmul_rn((double)rp_f(ua), p2);
    return rp_canon(rp_u(__double2float_rn(prod)));
#else
    const double prod = (double)rp_f(ua) * p2;
    return rp_canon(rp_u((float)prod));
#endif
}

// GETEXP: floor(log2|a|) exactly, subnormals included; 0 -> -inf, inf -> +inf, NaN -> NaN.
// Returned as the exact binary32 of a small integer, built on the bits.
RP_HD uint32_t rp_small_int_bits(int32_t v) {  // |v| < 2^24
    if (v == 0) return 0u;
    const uint32_t sign = v < 0 ? 0x80000000u : 0u;
    const uint32_t m = (uint32_t)(v < 0 ? -v : v);
    const int top = 31 - rp_clz(m);  // position of the leading one
    return sign | ((uint32_t)(127 + top) << 23) | ((m << (23 - top)) & 0x7FFFFFu);
}
RP_HD uint32_t rp_getexp(uint32_t u) {
    if (rp_isnan(u)) return RP_CANONICAL_NAN;
    const uint32_t mag = u & 0x7FFFFFFFu;
    if (mag == 0) return 0xFF800000u;
    if (mag == 0x7F800000u) return 0x7F800000u;
    const uint32_t ex = mag >> 23;
    const int32_t e = ex ? (int32_t)ex - 127 : (31 - rp_clz(mag)) - 149;
    return rp_small_int_bits(e);
}
// GETMANT: |a| / 2^GETEXP(a) in [1, 2), exact; 0 and inf -> 1.0, NaN -> NaN.
RP_HD uint32_t rp_getmant(uint32_t u) {
    if (rp_isnan(u)) return RP_CANONICAL_NAN;
    uint32_t mag = u & 0x7FFFFFFFu;
    if (mag == 0 || mag == 0x7F800000u) return RP_ONE_BITS;
    if ((mag >> 23) == 0) mag <<= rp_clz(mag) - 8;  // subnormal: leading one to bit 23
    return (mag & 0x7FFFFFu) | RP_ONE_BITS;
}

// COORD: a coordinate (< 2^24, KernelDesc.validate) as its exact binary32.
RP_HD uint32_t rp_coord_bits(int64_t c) { return rp_small_int_bits((int32_t)c); }

// LOADIDX's index rule (program.index_of): finite, integral, in [-2^31, 2^31); *ok = false otherwise.
RP_HD int64_t rp_index(uint32_t u, bool* ok) {
    const uint32_t mag = u & 0x7FFFFFFFu;
    const uint32_t ex = mag >> 23;
    *ok = false;
    if (ex == 0xFF) return 0;                        // inf, NaN
    if (mag == 0) { *ok = true; return 0; }          // +-0
    if (rp_round_int(u, true) != u) return 0;        // not integral
    if (ex >= 158) {                                 // |x| >= 2^31: only -2^31 itself is allowed
        if (u == 0xCF000000u) { *ok = true; return -2147483648LL; }
        return 0;
    }
    const int64_t m = (int64_t)((mag & 0x7FFFFFu) | 0x800000u);
    const int64_t v = ex >= 150 ? (m << (ex - 150)) : (m >> (150 - ex));
    *ok = true;
    return (u & 0x80000000u) ? -v : v;
}

// ---------------------------------------------------------------------------- one element

struct RpState {
    uint32_t r[RP_NUM_REGS];
    int64_t c[RP_MAX_RANK];
};

RP_HD void rp_exec(const RpProgram& p, const RpInstr& in, int64_t k, RpState& s) {
    uint32_t* r = s.r;
    const uint32_t a = r[in.a], b = r[in.b];
    uint32_t v;
    switch (in.op) {
        case RP_ADD: v = rp_add(a, b); break;
        case RP_SUB: v = rp_sub(a, b); break;
        case RP_MUL: v = rp_mul(a, b); break;
        case RP_DIV: v = rp_div(a, b); break;
        case RP_FMA: v = rp_fma(a, b, r[in.imm & 15u]); break;
        case RP_SQRT: v = rp_sqrt(a); break;
        case RP_MAX: v = rp_max(a, b); break;
        case RP_MIN: v = rp_min(a, b); break;
        case RP_LT: v = rp_lt(a, b); break;
        case RP_EQ: v = rp_eq(a, b); break;
        case RP_SELECT: v = rp_select(a, b, r[in.imm & 15u]); break;
        case RP_RINT: v = rp_round_int(a, false); break;
        case RP_FLOOR: v = rp_round_int(a, true); break;
        case RP_LDEXP: v = rp_ldexp(a, b); break;
        case RP_GETEXP: v = rp_getexp(a); break;
        case RP_GETMANT: v = rp_getmant(a); break;
        case RP_NEG: v = rp_canon(a ^ 0x80000000u); break;
        case RP_ABS: v = rp_canon(a & 0x7FFFFFFFu); break;
        case RP_MOV: v = rp_canon(a); break;
        case RP_CONST: v = in.imm; break;
        case RP_COORD: v = rp_coord_bits(s.c[in.imm]); break;
        case RP_LOAD: {
            // SAFETY: rp_decode proved every LOAD address of every element and k in range.
            const RpMap& m = p.maps[in.imm];
            int64_t addr = m.offset + k * m.kstride;
            for (int64_t d = 0; d < p.rank; d++) addr += s.c[d] * m.strides[d];
            v = m.data[addr];
            break;
        }
        case RP_LOADIDX: {
            // INVARIANT: a bad index or address reads nothing and yields the canonical NaN
            // (decidable on-chain); 128-bit arithmetic so no product can wrap into range.
            const RpMap& m = p.maps[in.imm];
            bool ok;
            const int64_t idx = rp_index(a, &ok);
            v = RP_CANONICAL_NAN;
            if (ok) {
                __int128 addr = (__int128)m.offset + (__int128)k * m.kstride + (__int128)idx * m.idx_stride;
                for (int64_t d = 0; d < p.rank; d++) addr += (__int128)s.c[d] * m.strides[d];
                if (addr >= 0 && addr < (__int128)m.numel) v = m.data[(int64_t)addr];
            }
            break;
        }
        default: v = RP_CANONICAL_NAN; break;  // unreachable: rp_decode rejects unknown opcodes
    }
    r[in.dst] = v;
}

// Run element e; r0_init (may be null) presets r0 and skips prologue and body.
RP_HD uint32_t rp_run_element(const RpProgram& p, int64_t e, const uint32_t* r0_init) {
    RpState s;
    for (int i = 0; i < RP_NUM_REGS; i++) s.r[i] = 0u;
    for (int64_t d = p.rank - 1; d >= 0; d--) {
        s.c[d] = e % p.shape[d];
        e /= p.shape[d];
    }
    const RpInstr* pro = p.code;
    const RpInstr* body = pro + p.n_pro;
    const RpInstr* epi = body + p.n_body;
    if (r0_init != nullptr) {
        s.r[0] = r0_init[0];
    } else {
        for (int64_t j = 0; j < p.n_pro; j++) rp_exec(p, pro[j], 0, s);
        for (int64_t k = 1; k < p.K; k++)
            for (int64_t j = 0; j < p.n_body; j++) rp_exec(p, body[j], k, s);
    }
    for (int64_t j = 0; j < p.n_epi; j++) rp_exec(p, epi[j], p.K - 1, s);
    return s.r[0];
}

// ---------------------------------------------------------------------------- host side
// Decoding and checking of the int64 encodings (host only: the CUDA launcher runs it before
// any byte reaches the device, and the ctypes test library runs it before the host loop).
// Plain (non-__device__) functions: nvcc's device pass parses them but generates no code.

// Fills prog (shape, rank, K, numel, n_in, counts) and the caller-provided arrays maps_out
// (n_in entries; data pointers from `inputs`) and code_out (n_pro + n_body + n_epi entries).
// Returns nullptr, or a static message naming what is wrong (written into err too).
inline const char* rp_decode(const uint32_t* const* inputs, int64_t n_in, const int64_t* maps, const int64_t* shape,
                             int64_t rank, int64_t K, const int64_t* pro, int64_t n_pro, const int64_t* body,
                             int64_t n_body, const int64_t* epi, int64_t n_epi, RpProgram* prog, RpMap* maps_out,
                             RpInstr* code_out) {
    if (rank < 0 || rank > RP_MAX_RANK) return "rank outside 0..6";
    if (K < 1) return "K must be >= 1";
    if (n_in < 0 || n_pro < 0 || n_body < 0 || n_epi < 0) return "negative count";
    int64_t numel = 1;
    for (int64_t d = 0; d < rank; d++) {
        if (shape[d] < 1 || shape[d] > (1 << 24)) return "output dim outside 1..2^24";
        prog->shape[d] = shape[d];
        numel *= shape[d];
    }
    prog->rank = rank;
    prog->K = K;
    prog->numel = numel;
    prog->n_in = n_in;
    prog->n_pro = n_pro;
    prog->n_body = n_body;
    prog->n_epi = n_epi;
    const int64_t* parts[3] = {pro, body, epi};
    const int64_t counts[3] = {n_pro, n_body, n_epi};
    int64_t at = 0;
    for (int part = 0; part < 3; part++) {
        for (int64_t i = 0; i < counts[part]; i++) {
            const int64_t* w = parts[part] + 5 * i;
            if (w[0] < 0 || w[0] >= RP_OP_COUNT) return "unknown opcode";
            for (int j = 1; j < 4; j++)
                if (w[j] < 0 || w[j] >= RP_NUM_REGS) return "register outside 0..15";
            if (w[4] < 0 || w[4] > 0xFFFFFFFFLL) return "immediate does not fit 32 bits";
            const int64_t op = w[0];
            if ((op == RP_FMA || op == RP_SELECT) && w[4] >= RP_NUM_REGS) return "c register outside 0..15";
            if ((op == RP_LOAD || op == RP_LOADIDX) && w[4] >= n_in) return "LOAD of a missing input";
            if (op == RP_COORD && w[4] >= rank) return "COORD axis >= rank";
            RpInstr& in = code_out[at++];
            in.op = (int32_t)op;
            in.dst = (uint8_t)w[1];
            in.a = (uint8_t)w[2];
            in.b = (uint8_t)w[3];
            in.pad = 0;
            in.imm = (uint32_t)w[4];
            in.pad2 = 0;
        }
    }
    for (int64_t t = 0; t < n_in; t++) {
        const int64_t* row = maps + t * (rank + 4);
        RpMap& m = maps_out[t];
        m.data = inputs[t];
        for (int64_t d = 0; d < RP_MAX_RANK; d++) m.strides[d] = d < rank ? row[d] : 0;
        m.kstride = row[rank];
        m.offset = row[rank + 1];
        m.idx_stride = row[rank + 2];
        m.numel = row[rank + 3];
        if (m.numel < 1 || m.offset < 0) return "input numel/offset invalid";
        // SAFETY: rp_exec reads LOAD addresses unchecked; prove the whole box of addresses
        // (every coordinate, every k) lies inside the input first. 128 bits: no wrap.
        bool loads = false;
        for (int64_t i = 0; i < at; i++) loads |= code_out[i].op == RP_LOAD && (int64_t)code_out[i].imm == t;
        if (!loads) continue;
        __int128 lo = m.offset, hi = m.offset;
        for (int64_t d = 0; d < rank; d++) {
            const __int128 span = (__int128)m.strides[d] * (shape[d] - 1);
            lo += span < 0 ? span : 0;
            hi += span > 0 ? span : 0;
        }
        const __int128 kspan = (__int128)m.kstride * (K - 1);
        lo += kspan < 0 ? kspan : 0;
        hi += kspan > 0 ? kspan : 0;
        if (lo < 0 || hi >= (__int128)m.numel) return "LOAD addresses leave the input";
    }
    return nullptr;
}

// The whole node on the host, element by element (the CPU twin of the CUDA kernel).
inline void rp_host_run(const RpProgram& p, const uint32_t* r0_init, uint32_t* out) {
    for (int64_t e = 0; e < p.numel; e++) out[e] = rp_run_element(p, e, r0_init ? r0_init + e : nullptr);
}
