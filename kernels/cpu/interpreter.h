// SPDX-License-Identifier: MIT
//
// interpreter.h — the CPU interpreter of ANY RepOps program (verde_chain/repops/program.py), run
// on blocks of BLOCK output elements. Registers are BLOCK-lane arrays of raw bit patterns; every
// instruction is one loop over the lanes calling its one definition (kernels/repops_fp32.h),
// which the compiler vectorises, and the loop index k runs prologue (k = 0), body (k = 1 .. K-1
// ascending), epilogue (k = K-1) exactly as the spec does. Lanes only ever hold different output
// elements, so ISA and thread count cannot change a bit.
//
// Encodings (those of the CUDA interpreter, kernels/repops_program.cuh): programs are (n, 5)
// int64 rows `op, dst, a, b, imm`; input maps (n_inputs, rank + 4) int64 rows
// `strides..., kstride, offset, idx_stride, numel`.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "simd.h"

namespace repops_cpu {

constexpr int BLOCK = 256;

struct Instr {
    int32_t op, dst, a, b;
    uint32_t imm;  // c register for FMA/SELECT, else the immediate
};

struct InputMap {
    const uint32_t* data;
    int64_t numel, kstride, offset, idx_stride;
    int64_t strides[RP_MAX_RANK];
    // Linear maps (address = offset + e * lstride for flat output element e: contiguous
    // inputs, lstride 1, and scalars broadcast everywhere, lstride 0) need no per-lane table.
    bool linear;
    int64_t lstride;
    int64_t last;  // the innermost output axis runs follow (see Lanes)
};

struct Lanes {
    int n = 0;
    alignas(64) uint32_t reg[RP_NUM_REGS][BLOCK];
    alignas(64) uint32_t coord[RP_MAX_RANK][BLOCK];  // coordinates as binary32 bits
    std::vector<int64_t> base;                      // [input][lane]: offset + sum c[d]*strides[d]
    std::vector<int64_t> base0;                     // [input]: lane 0's address (linear maps)
    // Runs along the innermost output axis (non-linear maps): lanes [start, start + len) read
    // run_base[input][run] + j * strides[last], j = 0 .. len-1 (before the k term).
    int n_runs = 0;
    int run_start[BLOCK], run_len[BLOCK];
    std::vector<int64_t> run_base;  // [input][run]
};

// A validated program invocation without data pointers: built once (per node of a StepPlan, or
// per call of run_program) and executed on any inputs of the sizes it was checked against.
struct Prog {
    std::vector<Instr> pro, body, epi;
    std::vector<InputMap> maps;  // .data is filled in per execution
    int64_t rank = 0, K = 1, numel = 1, run_axis = 0;
    int64_t out_shape[RP_MAX_RANK] = {};
    bool need_coords = false;      // COORD used, or some map is not linear
    bool use_coord = false;        // COORD used
    bool need_lane_table = false;  // LOADIDX used: per-lane addresses of non-linear maps
    // Registers the executed sequence reads before writing them start as +0.0 (the spec's
    // initial state); zeroing only those keeps small nodes cheap. [0]: full run, [1]: epilogue
    // only with r0 preset.
    bool live[2][RP_NUM_REGS] = {};
    int64_t work = 0;  // instructions executed, to decide whether threads pay off
    int64_t epi_work = 0;  // of them, the epilogue's (what a run with r0 preset executes)
};

// n rows of `op, dst, a, b, imm`, checked (opcode, registers, 32-bit immediate).
std::vector<Instr> decode_program(const int64_t* rows, int64_t n);

// rows: n_in rows of rank + 4 int64 [strides..., kstride, offset, idx_stride, numel];
// input_numels: the element count of each input the program will be run on. Addresses of LOAD
// are checked in range by the Python KernelDesc.validate; they are re-checked here so a bad call
// cannot read wild memory.
Prog make_prog(const int64_t* rows, int64_t n_in, const std::vector<int64_t>& out_shape, int64_t K,
               std::vector<Instr> pro, std::vector<Instr> body, std::vector<Instr> epi,
               const std::vector<int64_t>& input_numels);

// Runs P on inputs data[0 .. n_in) into O (numel bit patterns). init (optional, numel bits):
// run ONLY the epilogue with r0 preset (the prologue and body were done by a faster kernel;
// the caller checked the epilogue reads no other register). O may equal init: each block
// reads its own init range before writing the same range.
void exec_prog(const Prog& P, const uint32_t* const* data, uint32_t* O, const uint32_t* init, int64_t threads);

}  // namespace repops_cpu
