// SPDX-License-Identifier: MIT
//
// bindings.cpp — the torch extension of the RepOps CPU kernels (one per ISA, see simd.h): the
// per-node entry points (tensor checks, output allocation) and the module definition. The
// kernels are gemm.cpp, conv.cpp, reduce.cpp, binary.cpp, interpreter.cpp; the whole-step plan is
// step_plan.cpp. Python side: verde_chain/repops/backends/cpu/extension.py.

#include <atomic>
#include <stdexcept>

#include "kernels.h"
#include "recycled.h"
#include "tensors.h"
#include "window_plan.h"

namespace repops_cpu {
namespace {

// Results of RESULT_RECYCLE_BYTES or more come from one process-wide RecycledBuffers (recycled.h:
// a caller that drops each result before the next call of its size, as a layer run op by op
// does, would otherwise pay that result's page faults on every call), two idle buffers of a
// size and 256 MiB idle in all; smaller ones from torch::empty (malloc keeps those in its
// heap). Switched off (set_result_recycling), every result comes from torch::empty: for a
// paired benchmark. Either way changes no bit.
constexpr int64_t RESULT_RECYCLE_BYTES = int64_t(1) << 20;
std::atomic<bool> recycle_results{true};

RecycledBuffers& results_pool() {
    // never destroyed: a result dropped while the process exits still finds it
    static auto* pool = new std::shared_ptr<RecycledBuffers>(RecycledBuffers::make(2, size_t(256) << 20));
    return **pool;
}

torch::Tensor result_tensor(at::IntArrayRef shape, torch::ScalarType dtype) {
    if (!recycle_results.load(std::memory_order_relaxed) || tensor_bytes(shape, dtype) < RESULT_RECYCLE_BYTES)
        return torch::empty(shape, torch::TensorOptions().dtype(dtype));
    return results_pool().take(shape, dtype);
}

// a: (batch, M, K), b: (batch, K, N), any strides (stride 0 for broadcast batches).
// tile = (mc, kc, nc): cache blocking; any values give the same bits.
torch::Tensor matmul3(const torch::Tensor& a, const torch::Tensor& b, int64_t threads, int64_t mc, int64_t kc,
                      int64_t nc) {
    check_f32_cpu(a, "a");
    check_f32_cpu(b, "b");
    TORCH_CHECK(a.dim() == 3 && b.dim() == 3, "matmul3 takes 3-D tensors");
    TORCH_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1), "shape mismatch ", a.sizes(), " @ ", b.sizes());
    TORCH_CHECK(mc > 0 && kc > 0 && nc > 0, "tile sizes must be positive");
    GemmArgs g{a.data_ptr<float>(), a.stride(0), a.stride(1), a.stride(2),
               b.data_ptr<float>(), b.stride(0), b.stride(1), b.stride(2),
               nullptr, a.size(0), a.size(1), b.size(2), a.size(2)};
    // K == 0: the empty dot product is +0. Otherwise the GEMM stores every element (its first K
    // block), so C is not filled first: torch's fill runs on torch's OpenMP threads, which then
    // spin for milliseconds on the cores this call's pool workers need (issue #14: a 256^3 GEMM
    // at 2 threads ran on one, and 1024^3 lost a third of its second thread).
    const auto options = a.options().memory_format(torch::MemoryFormat::Contiguous);
    if (g.batch == 0 || g.M == 0 || g.N == 0 || g.K == 0) return torch::zeros({g.batch, g.M, g.N}, options);
    torch::Tensor c = result_tensor({g.batch, g.M, g.N}, torch::kFloat32);
    g.C = c.data_ptr<float>();
    // Tiles are rounded to whole micro-panels so panels never straddle blocks.
    mc = round_up(mc, GEMM_MR);
    nc = round_up(nc, GEMM_NR);
    gemm(g, threads, mc, kc, nc);
    return c;
}

// One windowed-GEMM operand from its tables (repops/windowed.py, Operand): data int32 bits,
// rows (1 + c, R) int64, ks (K, 1 + c) int64, wins (c, 3) int64.
WinOperand win_operand(const torch::Tensor& data, const torch::Tensor& rows, const torch::Tensor& ks,
                       const torch::Tensor& wins, int64_t fill, int64_t K, const char* what) {
    TORCH_CHECK(data.device().is_cpu() && data.scalar_type() == torch::kInt32 && data.is_contiguous(), what,
                ": data must be a contiguous CPU int32 bit tensor");
    const int64_t R = check_win_tables(rows, ks, wins, fill, K, what);
    return WinOperand{reinterpret_cast<const uint32_t*>(data.data_ptr<int32_t>()), data.numel(), rows.data_ptr<int64_t>(),
                      ks.data_ptr<int64_t>(), R, wins.size(0), wins.data_ptr<int64_t>(), (uint32_t)fill};
}

// C (batch, M, N): operand a has batch*M rows, b batch*N rows, both K columns; with split
// (n_inner, batch stride, outer stride), C's elements in that layout (windowed_gemm).
torch::Tensor windowed_matmul(const torch::Tensor& a_data, const torch::Tensor& a_rows, const torch::Tensor& a_ks,
                              const torch::Tensor& a_wins, int64_t a_fill, const torch::Tensor& b_data,
                              const torch::Tensor& b_rows, const torch::Tensor& b_ks, const torch::Tensor& b_wins,
                              int64_t b_fill, int64_t batch, int64_t M, int64_t N, int64_t K, int64_t threads,
                              int64_t mc, int64_t kc, int64_t nc, std::vector<int64_t> split) {
    TORCH_CHECK(batch >= 1 && M >= 1 && N >= 1 && K >= 1, "windowed_matmul: empty shape");
    TORCH_CHECK(mc > 0 && kc > 0 && nc > 0, "tile sizes must be positive");
    const WinOperand a = win_operand(a_data, a_rows, a_ks, a_wins, a_fill, K, "operand a");
    const WinOperand b = win_operand(b_data, b_rows, b_ks, b_wins, b_fill, K, "operand b");
    TORCH_CHECK(a.R == batch * M && b.R == batch * N, "windowed_matmul: tables have ", a.R, " / ", b.R,
                " rows, expected ", batch * M, " / ", batch * N);
    torch::Tensor c = result_tensor({batch, M, N}, torch::kFloat32);
    const ColumnSplit cs = column_split(split, batch, M, N);
    TORCH_CHECK(windowed_gemm(a, b, c.data_ptr<float>(), batch, M, N, K, threads, round_up(mc, GEMM_MR), kc,
                              round_up(nc, GEMM_NR), cs),
                "windowed_matmul: an operand address fell outside its input");
    return c;
}

// Every element (R, K) of one windowed operand, int32 bits; (K, R) if kmajor.
torch::Tensor gather_operand(const torch::Tensor& data, const torch::Tensor& rows, const torch::Tensor& ks,
                             const torch::Tensor& wins, int64_t fill, int64_t threads, bool kmajor) {
    const int64_t K = ks.size(0);
    const WinOperand o = win_operand(data, rows, ks, wins, fill, K, "operand");
    torch::Tensor out = kmajor ? result_tensor({K, o.R}, torch::kInt32) : result_tensor({o.R, K}, torch::kInt32);
    TORCH_CHECK(windowed_gather(o, K, reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>()), threads, kmajor),
                "windowed_gather: an operand address fell outside its input");
    return out;
}

// max_pool_backward in scatter form (window_plan.h): dx as float32 (planes x prod S).
torch::Tensor pool_backward(const torch::Tensor& arg, const torch::Tensor& dy, const torch::Tensor& axes,
                            const torch::Tensor& plane_off, int64_t K, int64_t threads) {
    for (const torch::Tensor* t : {&arg, &dy})
        TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == torch::kInt32 && t->is_contiguous(),
                    "pool_backward: arg and dy must be contiguous CPU int32 bits");
    const PoolBackward g = read_pool_backward(axes, plane_off, K, arg.numel(), dy.numel());
    torch::Tensor dx = result_tensor({g.numel()}, torch::kFloat32);
    pool_backward_into(g, reinterpret_cast<const uint32_t*>(arg.data_ptr<int32_t>()),
                       reinterpret_cast<const uint32_t*>(dy.data_ptr<int32_t>()), dx.data_ptr<float>(), threads);
    return dx;
}

torch::Tensor reduce_last(const torch::Tensor& x, int64_t op, int64_t threads) {
    check_f32_cpu(x, "x");
    TORCH_CHECK(x.dim() == 2, "reduce_last takes a 2-D (rows, K) view");
    TORCH_CHECK(op >= 0 && op < RP_REDUCE_COUNT, "unknown reduce op ", op);
    const int64_t R = x.size(0), K = x.size(1);
    TORCH_CHECK(K > 0, "reduction over an empty axis");
    torch::Tensor out = result_tensor({R}, torch::kFloat32);
    if (R == 0) return out;
    reduce_into(x.data_ptr<float>(), R, K, x.stride(0), x.stride(1), op, out.data_ptr<float>(), threads);
    return out;
}

torch::Tensor binary(const torch::Tensor& a, const torch::Tensor& b, int64_t op, int64_t threads) {
    check_f32_cpu(a, "a");
    check_f32_cpu(b, "b");
    TORCH_CHECK(a.sizes() == b.sizes(), "binary takes equal shapes (broadcast first)");
    TORCH_CHECK(a.is_contiguous() && b.is_contiguous(), "binary takes contiguous tensors");
    TORCH_CHECK(op >= 0 && op < RP_BIN_COUNT, "unknown binary op ", op);
    torch::Tensor out = result_tensor(a.sizes(), torch::kFloat32);
    binary_into(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), a.numel(), op, threads);
    return out;
}


torch::Tensor scatter_rows(const torch::Tensor& g, const torch::Tensor& idx, int64_t V, int64_t threads) {
    check_f32_cpu(g, "g");
    check_f32_cpu(idx, "idx");
    TORCH_CHECK(g.dim() == 2 && idx.dim() == 1 && g.size(0) == idx.size(0) && g.size(0) >= 1,
                "scatter_rows takes g (P, R) and idx (P,)");
    TORCH_CHECK(g.is_contiguous() && idx.is_contiguous(), "scatter_rows takes contiguous tensors");
    TORCH_CHECK(V >= 1 && V <= (1 << 24), "scatter_rows needs 1 <= V <= 2^24 rows");
    torch::Tensor out = result_tensor({V, g.size(1)}, torch::kFloat32);
    scatter_rows_into(g.data_ptr<float>(), idx.data_ptr<float>(), g.size(0), g.size(1), V, out.data_ptr<float>(),
                      threads);
    return out;
}

// inputs: flat int32 bit tensors. maps: (n_inputs, rank + 4) int64 rows
// [strides..., kstride, offset, idx_stride, numel]. r0_init: see exec_prog.
torch::Tensor run_program(const std::vector<torch::Tensor>& inputs, const torch::Tensor& maps_t,
                          std::vector<int64_t> out_shape, int64_t K, const torch::Tensor& pro_t,
                          const torch::Tensor& body_t, const torch::Tensor& epi_t,
                          const c10::optional<torch::Tensor>& r0_init, int64_t threads) {
    const int64_t n_in = (int64_t)inputs.size(), rank = (int64_t)out_shape.size();
    TORCH_CHECK(rank <= RP_MAX_RANK, "rank ", rank, " > ", RP_MAX_RANK);
    std::vector<int64_t> numels(n_in);
    std::vector<const uint32_t*> data(std::max<int64_t>(1, n_in), nullptr);
    for (int64_t t = 0; t < n_in; t++) {
        const torch::Tensor& x = inputs[t];
        TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kInt32 && x.is_contiguous(),
                    "inputs must be contiguous CPU int32 bit tensors");
        numels[t] = x.numel();
        data[t] = reinterpret_cast<const uint32_t*>(x.data_ptr<int32_t>());
    }
    const Prog P = make_prog(int64_rows(maps_t, n_in, rank + 4, "maps").data(), n_in, out_shape, K, read_program(pro_t),
                             read_program(body_t), read_program(epi_t), numels);
    const uint32_t* init = nullptr;
    if (r0_init.has_value()) {
        TORCH_CHECK(r0_init->scalar_type() == torch::kInt32 && r0_init->is_contiguous() &&
                        r0_init->numel() == P.numel,
                    "r0_init must be a contiguous int32 tensor with one value per output element");
        init = reinterpret_cast<const uint32_t*>(r0_init->data_ptr<int32_t>());
    }
    torch::Tensor out = result_tensor({P.numel}, torch::kInt32);
    exec_prog(P, data.data(), reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>()), init, threads);
    return out;
}

// A compiled map (fn_addr: its C function, kept loaded by the caller) over numel elements;
// inputs: int32 bit tensors, input t read at lin[t] = (offset, s, q, p) as offset + ((e / q) % p) * s.
// work: lane-instructions (numel x program length).
torch::Tensor run_map(int64_t fn_addr, const std::vector<torch::Tensor>& inputs, const torch::Tensor& lin,
                      int64_t numel, int64_t work, int64_t threads) {
    TORCH_CHECK(fn_addr != 0, "null map function");
    TORCH_CHECK(numel >= 1, "a map has at least one output element");
    const int64_t n_in = (int64_t)inputs.size();
    const std::vector<int64_t> rows = int64_rows(lin, n_in, 4, "lin");
    std::vector<const void*> data(std::max<int64_t>(1, n_in), nullptr);
    for (int64_t t = 0; t < n_in; t++) {
        const torch::Tensor& x = inputs[t];
        TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kInt32 && x.is_contiguous(),
                    "inputs must be contiguous CPU int32 bit tensors");
        check_map_inputs(rows, t, numel, x.numel());
        data[t] = x.data_ptr<int32_t>();
    }
    torch::Tensor out = result_tensor({numel}, torch::kInt32);
    map_into(reinterpret_cast<MapFn>(fn_addr), data.data(), reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>()),
             numel, work, threads);
    return out;
}

// MXCSR as the threads running items see it (the OR over 64 items per thread, on `threads`
// threads): lets tests prove FTZ/DAZ are off wherever kernels run.
int64_t worker_mxcsr(int64_t threads) {
    std::atomic<uint32_t> seen{0};
    parallel_items(64 * threads, threads, [&](int64_t, int64_t) {
#if REPOPS_X86
        seen.fetch_or(_mm_getcsr());
#endif
    });
#if REPOPS_X86
    return (int64_t)seen.load();
#else
    return -1;
#endif
}

pybind11::dict info() {
    pybind11::dict d;
    d["isa"] = ISA_NAME;
    d["mr"] = GEMM_MR;
    d["nr"] = GEMM_NR;
    d["lanes"] = W;
    return d;
}

}  // namespace
}  // namespace repops_cpu

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "RepOps CPU kernels with fixed evaluation orders (see kernels/cpu/)";
    using namespace repops_cpu;
    m.def("matmul3", &matmul3, "batched GEMM, fixed fma chain", pybind11::arg("a"), pybind11::arg("b"),
          pybind11::arg("threads"), pybind11::arg("mc"), pybind11::arg("kc"), pybind11::arg("nc"));
    m.def("windowed_matmul", &windowed_matmul, "windowed GEMM (implicit im2col), fixed fma chain",
          pybind11::arg("a_data"), pybind11::arg("a_rows"), pybind11::arg("a_ks"), pybind11::arg("a_wins"),
          pybind11::arg("a_fill"), pybind11::arg("b_data"), pybind11::arg("b_rows"), pybind11::arg("b_ks"),
          pybind11::arg("b_wins"), pybind11::arg("b_fill"), pybind11::arg("batch"), pybind11::arg("M"),
          pybind11::arg("N"), pybind11::arg("K"), pybind11::arg("threads"), pybind11::arg("mc"), pybind11::arg("kc"),
          pybind11::arg("nc"), pybind11::arg("split") = std::vector<int64_t>{});
    m.attr("GEMM_NR") = GEMM_NR;  // micro-tile width: windowed_matmul's n_inner is a multiple of it
    m.def("windowed_gather", &gather_operand, "every element of a windowed operand (explicit im2col)",
          pybind11::arg("data"), pybind11::arg("rows"), pybind11::arg("ks"), pybind11::arg("wins"),
          pybind11::arg("fill"), pybind11::arg("threads"), pybind11::arg("kmajor") = false);
    m.def("pool_backward", &pool_backward, "max-pool backward in scatter form, the spec's chains",
          pybind11::arg("arg"), pybind11::arg("dy"), pybind11::arg("axes"), pybind11::arg("plane_off"),
          pybind11::arg("K"), pybind11::arg("threads"));
    m.def("reduce_last", &reduce_last, "sequential reduction over the last axis", pybind11::arg("x"),
          pybind11::arg("op"), pybind11::arg("threads"));
    m.def("binary", &binary, "elementwise IEEE op with canonical NaN", pybind11::arg("a"), pybind11::arg("b"),
          pybind11::arg("op"), pybind11::arg("threads"));
    m.def("scatter_rows", &scatter_rows, "scatter-add of rows in the spec's order", pybind11::arg("g"),
          pybind11::arg("idx"), pybind11::arg("V"), pybind11::arg("threads"));
    m.def("run_program", &run_program, "run any KernelDesc program (generic interpreter)", pybind11::arg("inputs"),
          pybind11::arg("maps"), pybind11::arg("out_shape"), pybind11::arg("K"), pybind11::arg("prologue"),
          pybind11::arg("body"), pybind11::arg("epilogue"), pybind11::arg("r0_init"), pybind11::arg("threads"));
    m.def("run_map", &run_map, "run a compiled map (verde_chain/repops/backends/cpu/jit.py) on threads",
          pybind11::arg("fn_addr"), pybind11::arg("inputs"), pybind11::arg("lin"), pybind11::arg("numel"),
          pybind11::arg("work"), pybind11::arg("threads"), pybind11::call_guard<pybind11::gil_scoped_release>());
    repops_cpu::bind_step_plan(m);
    repops_cpu::bind_norm(m);
    m.def("worker_mxcsr", &worker_mxcsr, pybind11::arg("threads"));
    m.def("probe_reset", &probe_reset, "forget the threads that ran items so far");
    m.def("probe_threads", &probe_threads, "OS thread ids that ran at least one item since probe_reset");
    m.def("pool_size", &pool_size, "pool workers started so far");
    m.def("pool_sleeps", &pool_sleeps, "times a pool worker went to sleep for want of a job");
    m.def("gemm_helped_blocks", [] { return repops_cpu::gemm_helped_blocks.load(); },
          "row blocks of one-item-a-thread GEMMs run by a thread helping a late one, so far");
    m.def("set_gemm_late_item_us", [](int64_t us) {
              if (us < 0) throw std::invalid_argument("set_gemm_late_item_us: microseconds >= 0");
              return repops_cpu::gemm_late_item_us.exchange(us);
          }, pybind11::arg("us"),
          "tests: the thread that takes item 1 of a one-item-a-thread GEMM waits this long first; returns the previous wait");
    m.def("div_run_panels", [] { return repops_cpu::div_run_panels.load(); },
          "panels the windowed GEMM packed as runs through div > 1 windows so far");
    m.def("contiguous_panels", [] { return repops_cpu::contiguous_panels.load(); },
          "panels the windowed GEMM packed with lane masks, their rows' addresses following each other, so far");
    m.def("k_panels", [] { return repops_cpu::k_panels.load(); },
          "panels the windowed GEMM packed along k with in-register transposes, so far");
    m.def("tap_class_gemms", [] { return repops_cpu::tap_class_gemms.load(); },
          "windowed GEMMs run class by class over only the taps that read inside the input, so far");
    m.def("tap_class_zero_columns", [] { return repops_cpu::tap_class_zero_columns.load(); },
          "columns of tap-class windowed GEMMs recomputed with every tap (zeros: their sign) so far");
    m.def("tap_class_choice", [](int choice) {
              if (choice < 0 || choice > 2) throw std::invalid_argument("tap_class_choice: 0 (by cost), 1 (when exact) or 2 (never)");
              return repops_cpu::tap_class_choice.exchange(choice);
          }, pybind11::arg("choice"),
          "when windowed GEMMs run by tap classes: 0 by cost, 1 whenever exact, 2 never; returns the previous choice");
    m.def("tap_class_quick_rejects", [] { return repops_cpu::tap_class_quick_rejects.load(); },
          "windowed GEMMs whose tap classes a cheap bound showed cannot pay (not built) so far");
    m.def("tap_class_bound_misses", [] { return repops_cpu::tap_class_bound_misses.load(); },
          "under the audit: calls the bound rejected whose classes would have paid, so far");
    m.def("set_tap_class_bound_audit", [](bool on) { return repops_cpu::tap_class_bound_audit.exchange(on); },
          pybind11::arg("on"), "tests: build and cost the classes the bound rejected (the choice is the same)");
    m.def("fill_only_columns", [] { return repops_cpu::fill_only_columns.load(); },
          "columns of tap-class windowed GEMMs none of whose taps reads the input (signed zeros) so far");
    m.def("row_plan_items", [] { return repops_cpu::row_plan_items.load(); },
          "M == 1 windowed GEMM items run with lanes over columns from the call's shared plan so far");
    m.def("row_chain_items", [] { return repops_cpu::row_chain_items.load(); },
          "M == 1 windowed GEMM items run with lanes over columns so far");
    m.def("set_spread_check", &set_spread_check, "tests: every thread of a call runs at least one item",
          pybind11::arg("on"));
    m.def("info", &info);
    m.def("set_result_recycling", [](bool on) { return recycle_results.exchange(on); }, pybind11::arg("on"),
          "results of 1 MiB or more on recycled buffers (on) or from torch::empty (off); returns the previous setting");
    m.def("result_recycling_counts", [] { return results_pool().counts(); },
          "(bytes of result buffers held idle, results served from an idle buffer so far)");
    m.def("release_idle_results", [] { results_pool().release_idle(); }, "free the idle result buffers");
}