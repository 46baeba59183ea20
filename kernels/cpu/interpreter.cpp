// SPDX-License-Identifier: MIT
//
// interpreter.cpp — the CPU interpreter (see interpreter.h): planning a program once (make_prog:
// address boxes, linear maps, live registers) and running it on blocks of lanes (exec_prog).

#include "interpreter.h"

#include <c10/util/Exception.h>

#include "kernels.h"

namespace repops_cpu {
namespace {

// Address of lane i of input t (before the k term).
inline int64_t lane_base(const InputMap& m, const Lanes& L, int64_t t, int i) {
    return m.linear ? L.base0[t] + i * m.lstride : L.base[t * BLOCK + i];
}

// One instruction on the block's n lanes: its one-lane definition (kernels/repops_fp32.h) in a
// loop the compiler vectorises.
#define RP_LANES1(fn) for (int i = 0; i < n; i++) d[i] = fn(a[i])
#define RP_LANES2(fn) for (int i = 0; i < n; i++) d[i] = fn(a[i], b[i])
#define RP_LANES3(fn) for (int i = 0; i < n; i++) d[i] = fn(a[i], b[i], c[i])

void exec_instr(const Instr& in, int64_t k, const std::vector<InputMap>& maps, Lanes& L) {
    const int n = L.n;
    uint32_t* d = L.reg[in.dst];
    const uint32_t* a = L.reg[in.a];
    const uint32_t* b = L.reg[in.b];
    const uint32_t* c = L.reg[in.imm & (RP_NUM_REGS - 1)];
    // No default: -Werror=switch names an opcode without a case here at build time.
    switch ((RpOpcode)in.op) {
        case RP_ADD: RP_LANES2(rp_add); break;
        case RP_SUB: RP_LANES2(rp_sub); break;
        case RP_MUL: RP_LANES2(rp_mul); break;
        case RP_DIV: RP_LANES2(rp_div); break;
        case RP_FMA: RP_LANES3(rp_fma); break;
        case RP_SQRT: RP_LANES1(rp_sqrt); break;
        case RP_MAX: RP_LANES2(rp_max); break;
        case RP_MIN: RP_LANES2(rp_min); break;
        case RP_LT: RP_LANES2(rp_lt); break;
        case RP_EQ: RP_LANES2(rp_eq); break;
        case RP_SELECT: RP_LANES3(rp_select); break;
        case RP_RINT: RP_LANES1(rp_rint); break;
        case RP_FLOOR: RP_LANES1(rp_floor); break;
        case RP_LDEXP: RP_LANES2(rp_ldexp); break;
        case RP_GETEXP: RP_LANES1(rp_getexp); break;
        case RP_GETMANT: RP_LANES1(rp_getmant); break;
        case RP_NEG: RP_LANES1(rp_neg); break;
        case RP_ABS: RP_LANES1(rp_abs); break;
        case RP_MOV: RP_LANES1(rp_mov); break;
        case RP_CONST:
            for (int i = 0; i < n; i++) d[i] = in.imm;
            break;
        case RP_COORD: std::memcpy(d, L.coord[in.imm], sizeof(uint32_t) * n); break;
        case RP_LOAD: {
            const InputMap& m = maps[in.imm];
            const int64_t koff = k * m.kstride;
            if (m.linear) {
                const uint32_t* src = m.data + (L.base0[in.imm] + koff);
                if (m.lstride == 1) {
                    std::memcpy(d, src, sizeof(uint32_t) * n);
                } else {
                    for (int i = 0; i < n; i++) d[i] = src[i * m.lstride];
                }
            } else {
                // Per run: a copy (innermost stride 1), a fill (0, broadcast), or a strided read.
                const int64_t st = m.strides[m.last];
                const int64_t* rb = L.run_base.data() + (int64_t)in.imm * BLOCK;
                for (int r = 0; r < L.n_runs; r++) {
                    const uint32_t* src = m.data + (rb[r] + koff);
                    uint32_t* out = d + L.run_start[r];
                    const int len = L.run_len[r];
                    if (st == 1) {
                        std::memcpy(out, src, sizeof(uint32_t) * len);
                    } else if (st == 0) {
                        const uint32_t v = src[0];
                        for (int j = 0; j < len; j++) out[j] = v;
                    } else {
                        for (int j = 0; j < len; j++) out[j] = src[j * st];
                    }
                }
            }
            break;
        }
        case RP_LOADIDX: {
            // INVARIANT: a bad index or address reads nothing and yields the canonical NaN.
            const InputMap& m = maps[in.imm];
            for (int i = 0; i < n; i++) {
                const int64_t addr = rp_loadidx_address(lane_base(m, L, in.imm, i) + k * m.kstride, a[i], m.idx_stride,
                                                        m.numel);
                d[i] = addr < 0 ? RP_CANONICAL_NAN : m.data[addr];
            }
            break;
        }
        case RP_OP_COUNT: break;  // not an opcode (decode_program refuses it)
    }
}

#undef RP_LANES1
#undef RP_LANES2
#undef RP_LANES3

// This thread's register blocks, kept for its life: `new Lanes` (default-init), not
// make_unique (value-init would zero ~22 KB; every register a program reads before writing is
// zeroed per block in exec_prog).
Lanes& thread_lanes() {
    thread_local std::unique_ptr<Lanes> lanes(new Lanes);
    return *lanes;
}

}  // namespace

std::vector<Instr> decode_program(const int64_t* rows, int64_t n) {
    std::vector<Instr> out(n);
    for (int64_t i = 0; i < n; i++) {
        const int64_t* w = rows + 5 * i;
        TORCH_CHECK(w[0] >= 0 && w[0] < RP_OP_COUNT, "unknown opcode ", w[0]);
        for (int j = 1; j < 4; j++) TORCH_CHECK(w[j] >= 0 && w[j] < RP_NUM_REGS, "register out of range");
        TORCH_CHECK(w[4] >= 0 && w[4] <= 0xFFFFFFFFLL, "immediate does not fit 32 bits");
        out[i] = {(int32_t)w[0], (int32_t)w[1], (int32_t)w[2], (int32_t)w[3], (uint32_t)w[4]};
    }
    return out;
}

// rows: n_in rows of rank + 4 int64 [strides..., kstride, offset, idx_stride, numel];
// input_numels: the element count of each input the program will be run on. Addresses of LOAD
// are checked in range by the Python KernelDesc.validate; they are re-checked here so a bad call
// cannot read wild memory.
Prog make_prog(const int64_t* rows, int64_t n_in, const std::vector<int64_t>& out_shape, int64_t K,
               std::vector<Instr> pro, std::vector<Instr> body, std::vector<Instr> epi,
               const std::vector<int64_t>& input_numels) {
    Prog P;
    P.rank = (int64_t)out_shape.size();
    TORCH_CHECK(P.rank <= RP_MAX_RANK, "rank ", P.rank, " > ", RP_MAX_RANK);
    TORCH_CHECK(K >= 1, "K must be >= 1");
    TORCH_CHECK((int64_t)input_numels.size() == n_in, "one element count per input");
    P.K = K;
    P.pro = std::move(pro);
    P.body = std::move(body);
    P.epi = std::move(epi);
    const int64_t rank = P.rank;
    for (int64_t dd = 0; dd < rank; dd++) {
        TORCH_CHECK(out_shape[dd] >= 1, "output dims must be >= 1");
        P.out_shape[dd] = out_shape[dd];
        P.numel *= out_shape[dd];
    }
    P.maps.resize(n_in);
    for (int64_t t = 0; t < n_in; t++) {
        const int64_t* row = rows + t * (rank + 4);
        InputMap& m = P.maps[t];
        m.data = nullptr;
        for (int64_t dd = 0; dd < rank; dd++) m.strides[dd] = row[dd];
        m.kstride = row[rank];
        m.offset = row[rank + 1];
        m.idx_stride = row[rank + 2];
        m.numel = row[rank + 3];
        TORCH_CHECK(m.numel == input_numels[t], "input ", t, " has ", input_numels[t], " elements, map says ",
                    m.numel);
        // SAFETY: LOAD reads data[base + k*kstride] unchecked in the lane loop; prove the whole
        // box of addresses lies inside the tensor first.
        int64_t lo = m.offset, hi = m.offset;
        for (int64_t dd = 0; dd < rank; dd++) {
            const int64_t span = m.strides[dd] * (out_shape[dd] - 1);
            lo += std::min<int64_t>(0, span);
            hi += std::max<int64_t>(0, span);
        }
        const int64_t kspan = m.kstride * (K - 1);
        lo += std::min<int64_t>(0, kspan);
        hi += std::max<int64_t>(0, kspan);
        bool loads = false;
        for (const auto* prog : {&P.pro, &P.body, &P.epi})
            for (const Instr& in : *prog) loads |= in.op == RP_LOAD && (int64_t)in.imm == t;
        TORCH_CHECK(!loads || (lo >= 0 && hi < m.numel), "input ", t, " addresses [", lo, ", ", hi,
                    "] leave [0, ", m.numel, ")");
    }
    P.run_axis = std::max<int64_t>(0, rank - 1);  // innermost axis of size > 1 (runs follow it)
    {
        int64_t cstride[RP_MAX_RANK], acc = 1, last = -1;
        for (int64_t dd = rank - 1; dd >= 0; dd--) {
            cstride[dd] = acc;
            acc *= out_shape[dd];
            if (last < 0 && out_shape[dd] > 1) last = dd;
        }
        if (last >= 0) P.run_axis = last;
        for (InputMap& m : P.maps) {
            m.last = P.run_axis;
            m.lstride = last < 0 ? 0 : m.strides[last];
            m.linear = true;
            for (int64_t dd = 0; dd < rank; dd++)
                if (out_shape[dd] > 1 && m.strides[dd] != m.lstride * cstride[dd]) m.linear = false;
            P.need_coords |= !m.linear;
        }
    }
    for (const auto* prog : {&P.pro, &P.body, &P.epi})
        for (const Instr& in : *prog) {
            if (in.op == RP_LOAD || in.op == RP_LOADIDX) TORCH_CHECK((int64_t)in.imm < n_in, "LOAD of a missing input");
            P.need_lane_table |= in.op == RP_LOADIDX;
            if (in.op == RP_COORD) {
                TORCH_CHECK((int64_t)in.imm < rank, "COORD axis out of range");
                P.need_coords = P.use_coord = true;
            }
            if (rp_op_flags(in.op) & RP_READS_C) TORCH_CHECK(in.imm < RP_NUM_REGS, "c register out of range");
        }
    P.work = P.numel * (int64_t)(P.pro.size() + (K - 1) * P.body.size() + P.epi.size());
    P.epi_work = P.numel * (int64_t)P.epi.size();
    for (int with_init = 0; with_init < 2; with_init++) {
        bool written[RP_NUM_REGS] = {};
        bool* live = P.live[with_init];
        if (with_init) written[0] = true;
        auto scan = [&](const std::vector<Instr>& prog) {
            for (const Instr& in : prog) {
                // the register-use table (isa.REG_READS, generated)
                const unsigned reads = rp_op_flags(in.op);
                const bool reads_a = reads & RP_READS_A, reads_b = reads & RP_READS_B, reads_c = reads & RP_READS_C;
                if (reads_a && !written[in.a]) live[in.a] = true;
                if (reads_b && !written[in.b]) live[in.b] = true;
                if (reads_c && !written[in.imm]) live[in.imm] = true;
                written[in.dst] = true;
            }
        };
        if (!with_init) {
            scan(P.pro);
            if (K > 1) scan(P.body);
        }
        scan(P.epi);
        if (!written[0]) live[0] = true;  // the result register is read at the end
    }
    return P;
}


// Runs P on inputs data[0 .. n_in) into O (numel bit patterns). init (optional, numel bits):
// run ONLY the epilogue with r0 preset (the prologue and body were done by a faster kernel;
// the caller checked the epilogue reads no other register). O may equal init: each block
// reads its own init range before writing the same range.
void exec_prog(const Prog& P, const uint32_t* const* data, uint32_t* O, const uint32_t* init, int64_t threads) {
    const int64_t n_in = (int64_t)P.maps.size(), numel = P.numel, rank = P.rank, K = P.K;
    std::vector<InputMap> maps = P.maps;
    for (int64_t t = 0; t < n_in; t++) maps[t].data = data[t];
    const int64_t n_blocks = ceil_div(numel, BLOCK);
    const bool* live = P.live[init != nullptr ? 1 : 0];
    const int64_t* out_shape = P.out_shape;
    const double work = (double)(init != nullptr ? P.epi_work : P.work);
    parallel_items(n_blocks, threads_for(threads, n_blocks, work, PROGRAM_MIN_INSTRS), [&](int64_t blk, int64_t) {
        Lanes& L = thread_lanes();
        const size_t need = (size_t)std::max<int64_t>(1, n_in);
        if (L.base0.size() < need) {
            L.base.resize(need * BLOCK);
            L.base0.resize(need);
            L.run_base.resize(need * BLOCK);
        }
        const int64_t e0 = blk * BLOCK;
        L.n = (int)std::min<int64_t>(BLOCK, numel - e0);
        for (int r = 0; r < RP_NUM_REGS; r++)
            if (live[r]) std::memset(L.reg[r], 0, sizeof(uint32_t) * L.n);
        for (int64_t tt = 0; tt < n_in; tt++) L.base0[tt] = maps[tt].offset + e0 * maps[tt].lstride;
        if (P.need_coords) {
            // Coordinates of the block's first element by division, then runs along the
            // innermost axis: inside a run only the last coordinate moves (by one), so both the
            // coordinate and every address are arithmetic sequences (vectorised loops).
            int64_t cs[RP_MAX_RANK];
            int64_t e = e0;
            for (int64_t dd = rank - 1; dd >= 0; dd--) {
                cs[dd] = e % out_shape[dd];
                e /= out_shape[dd];
            }
            const int64_t last = P.run_axis;
            L.n_runs = 0;
            for (int i = 0; i < L.n;) {
                const int run = (int)std::min<int64_t>(out_shape[last] - cs[last], L.n - i);
                if (P.use_coord) {
                    for (int64_t dd = 0; dd < last; dd++) {
                        const uint32_t cb = rp_coord_bits(cs[dd]);
                        for (int j = 0; j < run; j++) L.coord[dd][i + j] = cb;
                    }
                    for (int j = 0; j < run; j++) L.coord[last][i + j] = rp_coord_bits(cs[last] + j);
                }
                L.run_start[L.n_runs] = i;
                L.run_len[L.n_runs] = run;
                for (int64_t tt = 0; tt < n_in; tt++) {
                    const InputMap& m = maps[tt];
                    if (m.linear) continue;
                    int64_t b = m.offset;
                    for (int64_t dd = 0; dd < rank; dd++) b += cs[dd] * m.strides[dd];
                    L.run_base[tt * BLOCK + L.n_runs] = b;
                    if (P.need_lane_table) {  // LOADIDX reads per-lane addresses
                        const int64_t st = m.strides[last];
                        int64_t* dst = L.base.data() + tt * BLOCK + i;
                        for (int j = 0; j < run; j++) dst[j] = b + j * st;
                    }
                }
                L.n_runs++;
                i += run;
                cs[last] += run;
                for (int64_t dd = last; dd > 0 && cs[dd] == out_shape[dd]; dd--) {
                    cs[dd] = 0;
                    cs[dd - 1]++;
                }
            }
        }
        if (init != nullptr) {
            std::memcpy(L.reg[0], init + e0, sizeof(uint32_t) * L.n);
        } else {
            for (const Instr& in : P.pro) exec_instr(in, 0, maps, L);
            for (int64_t k = 1; k < K; k++)
                for (const Instr& in : P.body) exec_instr(in, k, maps, L);
        }
        for (const Instr& in : P.epi) exec_instr(in, K - 1, maps, L);
        std::memcpy(O + e0, L.reg[0], sizeof(uint32_t) * L.n);
    });
}

}  // namespace repops_cpu
