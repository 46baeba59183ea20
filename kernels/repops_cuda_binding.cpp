// SPDX-License-Identifier: MIT
//
// repops_cuda_binding.cpp — torch binding of kernels/repops_cuda.cu (built by
// torch.utils.cpp_extension.load together with the .cu; see verde_chain/repops/backend_cuda.py).
// Host compiler side only: shape checks, output allocation, the current CUDA stream.
//
//   matmul3(a, b)                      batched GEMM, the canonical fma chain
//   run_program(inputs, maps, out_shape, K, prologue, body, epilogue, r0_init, threads)
//                                      any KernelDesc; the argument layout of the CPU binding
//                                      (kernels/repops_cpu.cpp): inputs are contiguous int32 bit
//                                      tensors ON THE GPU, maps/programs int64 tensors (any
//                                      device; read on the host), r0_init a GPU int32 tensor or
//                                      None; `threads` is accepted for the same signature and
//                                      ignored (the GPU runs one thread per output element).

#include <torch/extension.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <vector>

#include "repops_cuda.h"

namespace {

void check_cuda_f32(const torch::Tensor& t, const char* what) {
    TORCH_CHECK(t.is_cuda(), what, " must be a CUDA tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, what, " must be float32, got ", t.scalar_type());
}

// a: (batch, M, K), b: (batch, K, N), any strides (stride 0 for broadcast batches).
torch::Tensor matmul3(const torch::Tensor& a, const torch::Tensor& b) {
    check_cuda_f32(a, "a");
    check_cuda_f32(b, "b");
    TORCH_CHECK(a.dim() == 3 && b.dim() == 3, "matmul3 takes 3-D tensors");
    TORCH_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1), "shape mismatch ", a.sizes(), " @ ", b.sizes());
    TORCH_CHECK(a.device() == b.device(), "a and b are on different devices");
    const int64_t batch = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
    torch::Tensor c = torch::empty({batch, M, N}, a.options().memory_format(torch::MemoryFormat::Contiguous));
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

torch::Tensor host_int64(const torch::Tensor& t, const char* what) {
    TORCH_CHECK(t.scalar_type() == torch::kInt64, what, " must be int64");
    return t.to(torch::kCPU).contiguous();
}

torch::Tensor run_program(const std::vector<torch::Tensor>& inputs, const torch::Tensor& maps_t,
                          std::vector<int64_t> out_shape, int64_t K, const torch::Tensor& pro_t,
                          const torch::Tensor& body_t, const torch::Tensor& epi_t,
                          const c10::optional<torch::Tensor>& r0_init, int64_t /*threads*/) {
    const int64_t rank = (int64_t)out_shape.size();
    const int64_t n_in = (int64_t)inputs.size();
    torch::Tensor maps = host_int64(maps_t, "maps");
    TORCH_CHECK(maps.dim() == 2 && maps.size(0) == n_in && maps.size(1) == rank + 4,
                "maps must be (n_inputs, rank + 4) int64, got ", maps.sizes());
    torch::Tensor progs[3] = {host_int64(pro_t, "prologue"), host_int64(body_t, "body"), host_int64(epi_t, "epilogue")};
    for (const auto& p : progs)
        TORCH_CHECK(p.dim() == 2 && p.size(1) == 5, "programs are (n, 5) int64 tensors: op, dst, a, b, imm");
    int64_t numel = 1;
    for (int64_t d : out_shape) numel *= d;
    c10::optional<torch::Device> device;
    std::vector<const uint32_t*> ptrs;
    for (int64_t t = 0; t < n_in; t++) {
        const torch::Tensor& x = inputs[t];
        TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kInt32 && x.is_contiguous(),
                    "inputs must be contiguous CUDA int32 bit tensors");
        TORCH_CHECK(!device || *device == x.device(), "inputs are on different devices");
        device = x.device();
        // SAFETY: the map's numel is what the address checks trust; it must be the real size.
        const int64_t map_numel = maps.data_ptr<int64_t>()[t * (rank + 4) + rank + 3];
        TORCH_CHECK(map_numel == x.numel(), "input ", t, " has ", x.numel(), " elements, map says ", map_numel);
        ptrs.push_back(reinterpret_cast<const uint32_t*>(x.data_ptr<int32_t>()));
    }
    const uint32_t* init = nullptr;
    if (r0_init.has_value()) {
        const torch::Tensor& r = *r0_init;
        TORCH_CHECK(r.is_cuda() && r.scalar_type() == torch::kInt32 && r.is_contiguous() && r.numel() == numel,
                    "r0_init must be a contiguous CUDA int32 tensor with one value per output element");
        TORCH_CHECK(!device || *device == r.device(), "r0_init is on another device");
        device = r.device();
        init = reinterpret_cast<const uint32_t*>(r.data_ptr<int32_t>());
    }
    if (!device) device = torch::Device(torch::kCUDA, c10::cuda::current_device());
    const c10::cuda::CUDAGuard guard(*device);
    auto opts = torch::TensorOptions().device(*device);
    torch::Tensor out = torch::empty({numel}, opts.dtype(torch::kInt32));
    const int64_t n_instr = progs[0].size(0) + progs[1].size(0) + progs[2].size(0);
    const int64_t scratch_bytes = repops_cuda_program_scratch_bytes(n_in, n_instr);
    torch::Tensor scratch = torch::empty({scratch_bytes}, opts.dtype(torch::kUInt8));
    void* stream = c10::cuda::getCurrentCUDAStream(device->index()).stream();
    char err[256] = {0};
    const int rc = repops_cuda_run_program(
        ptrs.data(), n_in, maps.data_ptr<int64_t>(), out_shape.data(), rank, K, progs[0].data_ptr<int64_t>(),
        progs[0].size(0), progs[1].data_ptr<int64_t>(), progs[1].size(0), progs[2].data_ptr<int64_t>(),
        progs[2].size(0), init, reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>()), scratch.data_ptr(),
        scratch_bytes, stream, err, (int64_t)sizeof err);
    TORCH_CHECK(rc != -1, "repops_cuda_run_program refused the descriptor: ", err);
    TORCH_CHECK(rc == 0, "repops_cuda_run_program failed with CUDA error ", rc);
    return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "RepOps CUDA kernels: GEMM with the canonical fma chain, program interpreter (kernels/repops_cuda.cu)";
    m.def("matmul3", &matmul3, "batched GEMM, fixed fma chain", pybind11::arg("a"), pybind11::arg("b"));
    m.def("run_program", &run_program, "run any KernelDesc program (one thread per output element)",
          pybind11::arg("inputs"), pybind11::arg("maps"), pybind11::arg("out_shape"), pybind11::arg("K"),
          pybind11::arg("prologue"), pybind11::arg("body"), pybind11::arg("epilogue"), pybind11::arg("r0_init"),
          pybind11::arg("threads"));
}
