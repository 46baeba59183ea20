// SPDX-License-Identifier: MIT
//
// repops_cuda_binding.cpp — torch binding of kernels/repops_cuda.cu (built by
// torch.utils.cpp_extension.load together with the .cu; see verde_chain/repops/backends/cuda/extension.py).
// Host compiler side only: shape checks, output allocation, the current CUDA stream.
//
//   matmul3(a, b, out=None)            batched GEMM, the canonical fma chain
//   windowed_matmul(a tables, b tables, batch, M, N, K)
//                                      the windowed GEMM of convolutions (implicit im2col):
//                                      each operand's bits and windowed.Operand tables on the GPU
//   run_program(inputs, maps, out_shape, K, prologue, body, epilogue, r0_init, threads, out=None)
//                                      any KernelDesc; the argument layout of the CPU binding
//                                      (kernels/cpu/bindings.cpp): inputs are contiguous int32 bit
//                                      tensors ON THE GPU, maps/programs int64 tensors (any
//                                      device; read on the host), r0_init a GPU int32 tensor or
//                                      None; `threads` is accepted for the same signature and
//                                      ignored (the GPU runs one thread per output element).
//   prepare_program(inputs, maps, out_shape, K, prologue, body, epilogue, r0_init, out)
//                                      -> [launch, blob]: run_program's checks and decoding done
//                                      ONCE for fixed buffers; launch_program(launch, blob) then
//                                      only starts the kernel (the whole-step kernel's per-node
//                                      cost: one launch, no transfer)
//   out=                               write the result into this tensor (contiguous, the result's
//                                      dtype and element count, same device, disjoint from every
//                                      operand) and return it: the whole-step kernel
//                                      (backends/cuda/step.py CudaStepKernel) lands every node in a slot
//                                      of one device arena this way, without a copy.

#include <torch/extension.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <utility>
#include <vector>

#include "repops_cuda.h"

namespace {

void check_cuda_f32(const torch::Tensor& t, const char* what) {
    TORCH_CHECK(t.is_cuda(), what, " must be a CUDA tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, what, " must be float32, got ", t.scalar_type());
}

// [first, last) bytes a strided tensor can touch (any stride sign).
std::pair<uintptr_t, uintptr_t> byte_extent(const torch::Tensor& t) {
    intptr_t lo = reinterpret_cast<intptr_t>(t.data_ptr()), hi = lo;
    for (int64_t d = 0; d < t.dim(); d++) {
        const intptr_t span = (intptr_t)(t.size(d) - 1) * (intptr_t)t.stride(d) * (intptr_t)t.element_size();
        if (span < 0) lo += span; else hi += span;
    }
    return {(uintptr_t)lo, (uintptr_t)hi + (uintptr_t)t.element_size()};
}

// The caller's output tensor, checked. SAFETY: the kernels read operands while other threads
// write the output (GEMM tiles; the interpreter's __restrict__ pointers), so an output that
// overlapped an operand would make the bits depend on the schedule: refused.
torch::Tensor given_out(const torch::Tensor& out, torch::ScalarType dtype, int64_t numel, const torch::Device& device,
                        const std::vector<const torch::Tensor*>& reads) {
    TORCH_CHECK(out.is_cuda() && out.device() == device, "out must be a CUDA tensor on the operands' device");
    TORCH_CHECK(out.scalar_type() == dtype && out.is_contiguous() && out.numel() == numel, "out must be a contiguous ",
                dtype, " tensor of ", numel, " elements, got ", out.scalar_type(), " ", out.sizes());
    const auto o = byte_extent(out);
    for (const torch::Tensor* x : reads) {
        if (x->numel() == 0 || numel == 0) continue;
        const auto r = byte_extent(*x);
        TORCH_CHECK(!(r.first < o.second && o.first < r.second), "out overlaps an operand of the kernel");
    }
    return out;
}

// a: (batch, M, K), b: (batch, K, N), any strides (stride 0 for broadcast batches).
torch::Tensor matmul3(const torch::Tensor& a, const torch::Tensor& b, const c10::optional<torch::Tensor>& out) {
    check_cuda_f32(a, "a");
    check_cuda_f32(b, "b");
    TORCH_CHECK(a.dim() == 3 && b.dim() == 3, "matmul3 takes 3-D tensors");
    TORCH_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1), "shape mismatch ", a.sizes(), " @ ", b.sizes());
    TORCH_CHECK(a.device() == b.device(), "a and b are on different devices");
    const int64_t batch = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
    const c10::cuda::CUDAGuard guard(a.device());
    torch::Tensor c = out.has_value()
                          ? given_out(*out, torch::kFloat32, batch * M * N, a.device(), {&a, &b})
                          : torch::empty({batch, M, N}, a.options().memory_format(torch::MemoryFormat::Contiguous));
    void* stream = c10::cuda::getCurrentCUDAStream(a.device().index()).stream();
    // gridDim.z is limited to 65535: launch batches in slices.
    constexpr int64_t MAX_Z = 65535;
    for (int64_t b0 = 0; b0 < batch; b0 += MAX_Z) {
        const int64_t nb = std::min(MAX_Z, batch - b0);
        int err = repops_cuda_gemm(a.data_ptr<float>() + b0 * a.stride(0), a.stride(0), a.stride(1), a.stride(2),
                                   b.data_ptr<float>() + b0 * b.stride(0), b.stride(0), b.stride(1), b.stride(2),
                                   c.data_ptr<float>() + b0 * M * N, nb, M, N, K, stream);
        TORCH_CHECK(err == 0, "repops_cuda_gemm failed with CUDA error ", err);
    }
    return c;
}

// One windowed-GEMM operand (repops/windowed.py Operand): data a contiguous int32 bit tensor
// and the tables int64, all on `device`; shapes checked here, addresses by the descriptor's
// static check before (the kernel reads only in-range taps).
RpWinOperand win_operand(const torch::Tensor& data, const torch::Tensor& rows, const torch::Tensor& ks,
                         const torch::Tensor& wins, int64_t fill, int64_t K, const torch::Device& device,
                         const char* what) {
    TORCH_CHECK(data.is_cuda() && data.device() == device && data.scalar_type() == torch::kInt32 &&
                    data.is_contiguous(), what, ": data must be a contiguous int32 tensor on the GPU");
    for (const torch::Tensor* t : {&rows, &ks, &wins})
        TORCH_CHECK(t->is_cuda() && t->device() == device && t->scalar_type() == torch::kInt64 &&
                        t->is_contiguous() && t->dim() == 2, what, ": tables must be contiguous 2-D int64 GPU tensors");
    const int64_t c = wins.size(0);
    TORCH_CHECK(wins.size(1) == 3 && rows.size(0) == 1 + c && ks.size(0) == K && ks.size(1) == 1 + c, what,
                ": tables of mismatched shapes");
    TORCH_CHECK(fill >= 0 && fill <= 0xFFFFFFFFLL, what, ": fill must be 32 raw bits");
    return RpWinOperand{reinterpret_cast<const uint32_t*>(data.data_ptr<int32_t>()), rows.data_ptr<int64_t>(),
                        ks.data_ptr<int64_t>(), wins.data_ptr<int64_t>(), rows.size(1), c, (uint32_t)fill};
}

// C (batch, M, N) of two windowed operands (a: batch*M rows, b: batch*N rows, K columns).
torch::Tensor windowed_matmul(const torch::Tensor& a_data, const torch::Tensor& a_rows, const torch::Tensor& a_ks,
                              const torch::Tensor& a_wins, int64_t a_fill, const torch::Tensor& b_data,
                              const torch::Tensor& b_rows, const torch::Tensor& b_ks, const torch::Tensor& b_wins,
                              int64_t b_fill, int64_t batch, int64_t M, int64_t N, int64_t K) {
    TORCH_CHECK(batch >= 1 && batch <= 65535 && M >= 1 && N >= 1 && K >= 1, "windowed_matmul: shape out of range");
    const torch::Device device = a_data.device();
    const RpWinOperand a = win_operand(a_data, a_rows, a_ks, a_wins, a_fill, K, device, "operand a");
    const RpWinOperand b = win_operand(b_data, b_rows, b_ks, b_wins, b_fill, K, device, "operand b");
    TORCH_CHECK(a.R == batch * M && b.R == batch * N, "windowed_matmul: tables have ", a.R, " / ", b.R,
                " rows, expected ", batch * M, " / ", batch * N);
    const c10::cuda::CUDAGuard guard(device);
    torch::Tensor c = torch::empty({batch, M, N}, a_data.options().dtype(torch::kFloat32));
    void* stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    const int err = repops_cuda_windowed_gemm(&a, &b, c.data_ptr<float>(), batch, M, N, K, stream);
    TORCH_CHECK(err == 0, "repops_cuda_windowed_gemm failed with CUDA error ", err);
    return c;
}

torch::Tensor host_int64(const torch::Tensor& t, const char* what) {
    TORCH_CHECK(t.scalar_type() == torch::kInt64, what, " must be int64");
    return t.to(torch::kCPU).contiguous();
}

// One program call's arguments, decoded and checked once (shared by run_program and
// prepare_program): host copies of the maps and programs, the input and r0_init device pointers.
struct ProgramCall {
    torch::Tensor maps;
    torch::Tensor progs[3];
    int64_t numel = 1;
    std::vector<const uint32_t*> ptrs;
    const uint32_t* init = nullptr;
    std::vector<const torch::Tensor*> reads;  // what out must not overlap
    c10::optional<torch::Device> device;      // of the inputs (or `on`, when given)
};

// `on`: the device every tensor must be on (prepare_program: out's); else the inputs' common one.
ProgramCall decode_call(const std::vector<torch::Tensor>& inputs, const torch::Tensor& maps_t,
                        const std::vector<int64_t>& out_shape, const torch::Tensor& pro_t, const torch::Tensor& body_t,
                        const torch::Tensor& epi_t, const c10::optional<torch::Tensor>& r0_init,
                        c10::optional<torch::Device> on) {
    ProgramCall c;
    const int64_t rank = (int64_t)out_shape.size();
    const int64_t n_in = (int64_t)inputs.size();
    c.maps = host_int64(maps_t, "maps");
    TORCH_CHECK(c.maps.dim() == 2 && c.maps.size(0) == n_in && c.maps.size(1) == rank + 4,
                "maps must be (n_inputs, rank + 4) int64, got ", c.maps.sizes());
    c.progs[0] = host_int64(pro_t, "prologue");
    c.progs[1] = host_int64(body_t, "body");
    c.progs[2] = host_int64(epi_t, "epilogue");
    for (const auto& p : c.progs)
        TORCH_CHECK(p.dim() == 2 && p.size(1) == 5, "programs are (n, 5) int64 tensors: op, dst, a, b, imm");
    for (int64_t d : out_shape) c.numel *= d;
    c.device = on;
    for (int64_t t = 0; t < n_in; t++) {
        const torch::Tensor& x = inputs[t];
        TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kInt32 && x.is_contiguous(),
                    "inputs must be contiguous CUDA int32 bit tensors");
        TORCH_CHECK(!c.device || *c.device == x.device(), "inputs are on different devices");
        c.device = x.device();
        // SAFETY: the map's numel is what the address checks trust; it must be the real size.
        const int64_t map_numel = c.maps.data_ptr<int64_t>()[t * (rank + 4) + rank + 3];
        TORCH_CHECK(map_numel == x.numel(), "input ", t, " has ", x.numel(), " elements, map says ", map_numel);
        c.ptrs.push_back(reinterpret_cast<const uint32_t*>(x.data_ptr<int32_t>()));
        c.reads.push_back(&x);
    }
    if (r0_init.has_value()) {
        const torch::Tensor& r = *r0_init;
        TORCH_CHECK(r.is_cuda() && r.scalar_type() == torch::kInt32 && r.is_contiguous() && r.numel() == c.numel,
                    "r0_init must be a contiguous CUDA int32 tensor with one value per output element");
        TORCH_CHECK(!c.device || *c.device == r.device(), "r0_init is on another device");
        c.device = r.device();
        c.init = reinterpret_cast<const uint32_t*>(r.data_ptr<int32_t>());
        c.reads.push_back(&r);
    }
    return c;
}

int64_t n_instr(const ProgramCall& c) { return c.progs[0].size(0) + c.progs[1].size(0) + c.progs[2].size(0); }

torch::Tensor run_program(const std::vector<torch::Tensor>& inputs, const torch::Tensor& maps_t,
                          std::vector<int64_t> out_shape, int64_t K, const torch::Tensor& pro_t,
                          const torch::Tensor& body_t, const torch::Tensor& epi_t,
                          const c10::optional<torch::Tensor>& r0_init, int64_t /*threads*/,
                          const c10::optional<torch::Tensor>& out_given) {
    ProgramCall c = decode_call(inputs, maps_t, out_shape, pro_t, body_t, epi_t, r0_init, c10::nullopt);
    const torch::Device device = c.device ? *c.device : torch::Device(torch::kCUDA, c10::cuda::current_device());
    const c10::cuda::CUDAGuard guard(device);
    auto opts = torch::TensorOptions().device(device);
    torch::Tensor out = out_given.has_value() ? given_out(*out_given, torch::kInt32, c.numel, device, c.reads)
                                              : torch::empty({c.numel}, opts.dtype(torch::kInt32));
    const int64_t scratch_bytes = repops_cuda_program_scratch_bytes((int64_t)inputs.size(), n_instr(c));
    torch::Tensor scratch = torch::empty({scratch_bytes}, opts.dtype(torch::kUInt8));
    void* stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
    char err[256] = {0};
    const int rc = repops_cuda_run_program(
        c.ptrs.data(), (int64_t)inputs.size(), c.maps.data_ptr<int64_t>(), out_shape.data(), (int64_t)out_shape.size(),
        K, c.progs[0].data_ptr<int64_t>(), c.progs[0].size(0), c.progs[1].data_ptr<int64_t>(), c.progs[1].size(0),
        c.progs[2].data_ptr<int64_t>(), c.progs[2].size(0), c.init, reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>()),
        scratch.data_ptr(), scratch_bytes, stream, err, (int64_t)sizeof err);
    TORCH_CHECK(rc != -1, "repops_cuda_run_program refused the descriptor: ", err);
    TORCH_CHECK(rc == 0, "repops_cuda_run_program failed with CUDA error ", rc);
    return out;
}

// prepare_program(inputs, maps, out_shape, K, prologue, body, epilogue, r0_init, out)
//   -> [launch (CPU uint8: the launch parameters), blob (device uint8: the staged descriptor)]
// Every check of run_program (and out's) happens here, once; the device pointers of inputs,
// r0_init and out are baked into `launch`. The caller keeps those buffers, and `blob`, alive
// and in place for as long as it launches (backends/cuda/step.py CudaStepKernel owns all of them).
std::vector<torch::Tensor> prepare_program(const std::vector<torch::Tensor>& inputs, const torch::Tensor& maps_t,
                                           std::vector<int64_t> out_shape, int64_t K, const torch::Tensor& pro_t,
                                           const torch::Tensor& body_t, const torch::Tensor& epi_t,
                                           const c10::optional<torch::Tensor>& r0_init, const torch::Tensor& out_t) {
    TORCH_CHECK(out_t.is_cuda(), "out must be a CUDA tensor");
    const torch::Device device = out_t.device();
    ProgramCall c = decode_call(inputs, maps_t, out_shape, pro_t, body_t, epi_t, r0_init, device);
    torch::Tensor out = given_out(out_t, torch::kInt32, c.numel, device, c.reads);
    const c10::cuda::CUDAGuard guard(device);
    const int64_t blob_bytes = repops_cuda_program_scratch_bytes((int64_t)inputs.size(), n_instr(c));
    torch::Tensor blob = torch::empty({blob_bytes}, torch::TensorOptions().device(device).dtype(torch::kUInt8));
    torch::Tensor launch = torch::zeros({repops_cuda_launch_bytes()}, torch::TensorOptions().dtype(torch::kUInt8));
    c10::cuda::CUDAStream cstream = c10::cuda::getCurrentCUDAStream(device.index());
    void* stream = cstream.stream();
    char err[256] = {0};
    const int rc = repops_cuda_prepare_program(
        c.ptrs.data(), (int64_t)inputs.size(), c.maps.data_ptr<int64_t>(), out_shape.data(), (int64_t)out_shape.size(),
        K, c.progs[0].data_ptr<int64_t>(), c.progs[0].size(0), c.progs[1].data_ptr<int64_t>(), c.progs[1].size(0),
        c.progs[2].data_ptr<int64_t>(), c.progs[2].size(0), c.init, reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>()),
        launch.data_ptr(), blob.data_ptr(), blob_bytes, stream, err, (int64_t)sizeof err);
    TORCH_CHECK(rc != -1, "repops_cuda_prepare_program refused the descriptor: ", err);
    TORCH_CHECK(rc == 0, "repops_cuda_prepare_program failed with CUDA error ", rc);
    // Once per node: wait for the staging, so a launch on any stream later finds it complete.
    cstream.synchronize();
    return {launch, blob};
}

// launch_program(launch, blob): run a prepared node on the current stream of blob's device.
void launch_program(const torch::Tensor& launch, const torch::Tensor& blob) {
    TORCH_CHECK(!launch.is_cuda() && launch.scalar_type() == torch::kUInt8 && launch.is_contiguous() &&
                    launch.numel() == repops_cuda_launch_bytes(),
                "launch must be the CPU uint8 tensor prepare_program returned");
    TORCH_CHECK(blob.is_cuda(), "blob must be the device tensor prepare_program returned");
    const c10::cuda::CUDAGuard guard(blob.device());
    void* stream = c10::cuda::getCurrentCUDAStream(blob.device().index()).stream();
    const int rc = repops_cuda_launch_program(launch.data_ptr(), stream);
    TORCH_CHECK(rc == 0, "repops_cuda_launch_program failed with CUDA error ", rc);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "RepOps CUDA kernels: GEMM with the canonical fma chain, program interpreter (kernels/repops_cuda.cu)";
    m.def("matmul3", &matmul3, "batched GEMM, fixed fma chain", pybind11::arg("a"), pybind11::arg("b"),
          pybind11::arg("out") = pybind11::none());
    m.def("windowed_matmul", &windowed_matmul, "windowed GEMM (implicit im2col), fixed fma chain",
          pybind11::arg("a_data"), pybind11::arg("a_rows"), pybind11::arg("a_ks"), pybind11::arg("a_wins"),
          pybind11::arg("a_fill"), pybind11::arg("b_data"), pybind11::arg("b_rows"), pybind11::arg("b_ks"),
          pybind11::arg("b_wins"), pybind11::arg("b_fill"), pybind11::arg("batch"), pybind11::arg("M"),
          pybind11::arg("N"), pybind11::arg("K"));
    m.def("run_program", &run_program, "run any KernelDesc program (one thread per output element)",
          pybind11::arg("inputs"), pybind11::arg("maps"), pybind11::arg("out_shape"), pybind11::arg("K"),
          pybind11::arg("prologue"), pybind11::arg("body"), pybind11::arg("epilogue"), pybind11::arg("r0_init"),
          pybind11::arg("threads"), pybind11::arg("out") = pybind11::none());
    m.def("prepare_program", &prepare_program, "decode, check and stage a node once (see launch_program)",
          pybind11::arg("inputs"), pybind11::arg("maps"), pybind11::arg("out_shape"), pybind11::arg("K"),
          pybind11::arg("prologue"), pybind11::arg("body"), pybind11::arg("epilogue"), pybind11::arg("r0_init"),
          pybind11::arg("out"));
    m.def("launch_program", &launch_program, "launch a node prepared by prepare_program", pybind11::arg("launch"),
          pybind11::arg("blob"));
}
