// SPDX-License-Identifier: MIT
//
// repops_cuda_binding.cpp — torch binding of kernels/repops_cuda.cu (built by
// torch.utils.cpp_extension.load together with the .cu; see scripts/gpu_check.py).
// Host compiler side only: shape checks, output allocation, the current CUDA stream.

#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

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

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "RepOps CUDA GEMM with the canonical fma chain (see kernels/repops_cuda.cu)";
    m.def("matmul3", &matmul3, "batched GEMM, fixed fma chain", pybind11::arg("a"), pybind11::arg("b"));
}
