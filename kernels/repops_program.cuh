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
// so the device semantics are proven on a machine without a GPU as far as the source goes: the
// instruction semantics are kernels/repops_fp32.h (the one definition every C++ and CUDA path
// shares), and the control flow, the addressing and the LOADIDX rule below are the SAME code on
// both sides; the test library is built with -DRP_AS_DEVICE, so even the exact integer primitives
// take the device's spelling, and only the correctly rounded IEEE operations (add, sub, mul, div,
// fma, sqrt, the binary64 product and narrowing of LDEXP) change spelling: each is one correctly
// rounded operation on both (PTX add.rn/sub.rn/mul.rn/div.rn/fma.rn/sqrt.rn without .ftz).
//
// Execution model: verde_chain/repops/program.py.
//
//   registers  r0..r15, uint32 binary32 bit patterns, all +0.0 at the start (r0 may be preset:
//              the CUDA backend runs only the epilogue after the GEMM computed the dot chain)
//   order      prologue at k = 0; body for k = 1 .. K-1 ascending; epilogue at k = K-1
//   result     r0 (raw bits: a LOAD or CONST that writes r0 last keeps a NaN payload)
//   LOAD t     data[offset + sum_d c[d]*strides[d] + k*kstride]   (box checked before launch)
//   LOADIDX t  the same + int(r_a) * idx_stride, where r_a must be finite, integral and in
//              [-2^31, 2^31) (rp_index) and the address inside [0, numel); otherwise 0x7FC00000,
//              no read
//
// Encodings (identical to the CPU extension's run_program, kernels/cpu/bindings.cpp): programs
// are (n, 5) int64 rows `op, dst, a, b, imm`; input maps are (n_inputs, rank + 4) int64 rows
// `strides[0..rank-1], kstride, offset, idx_stride, numel`. rp_decode() checks them.
#pragma once

#include <stdint.h>

#include "repops_fp32.h"

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

// ---------------------------------------------------------------------------- one element

struct RpState {
    uint32_t r[RP_NUM_REGS];
    int64_t c[RP_MAX_RANK];
};

RP_HD void rp_exec(const RpProgram& p, const RpInstr& in, int64_t k, RpState& s) {
    uint32_t* r = s.r;
    const uint32_t a = r[in.a], b = r[in.b], c = r[in.imm & (RP_NUM_REGS - 1)];
    uint32_t v = RP_CANONICAL_NAN;
    // No default: -Wswitch (an error in the host builds) names an opcode without a case here.
    switch ((RpOpcode)in.op) {
        case RP_ADD: v = rp_add(a, b); break;
        case RP_SUB: v = rp_sub(a, b); break;
        case RP_MUL: v = rp_mul(a, b); break;
        case RP_DIV: v = rp_div(a, b); break;
        case RP_FMA: v = rp_fma(a, b, c); break;
        case RP_SQRT: v = rp_sqrt(a); break;
        case RP_MAX: v = rp_max(a, b); break;
        case RP_MIN: v = rp_min(a, b); break;
        case RP_LT: v = rp_lt(a, b); break;
        case RP_EQ: v = rp_eq(a, b); break;
        case RP_SELECT: v = rp_select(a, b, c); break;
        case RP_RINT: v = rp_rint(a); break;
        case RP_FLOOR: v = rp_floor(a); break;
        case RP_LDEXP: v = rp_ldexp(a, b); break;
        case RP_GETEXP: v = rp_getexp(a); break;
        case RP_GETMANT: v = rp_getmant(a); break;
        case RP_NEG: v = rp_neg(a); break;
        case RP_ABS: v = rp_abs(a); break;
        case RP_MOV: v = rp_mov(a); break;
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
            // INVARIANT: a bad index or address reads nothing and yields the canonical NaN.
            const RpMap& m = p.maps[in.imm];
            __int128 base = (__int128)m.offset + (__int128)k * m.kstride;
            for (int64_t d = 0; d < p.rank; d++) base += (__int128)s.c[d] * m.strides[d];
            const int64_t addr = rp_loadidx_address(base, a, m.idx_stride, m.numel);
            if (addr >= 0) v = m.data[addr];
            break;
        }
        case RP_OP_COUNT: break;  // not an opcode (rp_decode refuses it)
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
        if (shape[d] < 1 || shape[d] > RP_MAX_DIM) return "output dim outside 1..2^24";
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
            if ((rp_op_flags((int)op) & RP_READS_C) && w[4] >= RP_NUM_REGS) return "c register outside 0..15";
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
