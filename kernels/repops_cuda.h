// SPDX-License-Identifier: MIT
//
// repops_cuda.h — host interface of the RepOps CUDA kernels (kernels/repops_cuda.cu).
// Plain C types only, so the .cu file compiles with nvcc alone (no torch headers) and the
// torch binding (kernels/repops_cuda_binding.cpp) is built by the host compiler.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Batched GEMM C[b] = op(A[b]) @ op(B[b]) with the RepOps dot-product order
//   acc = a[0]*b[0] (one rounded multiply), then acc = fma(a[k], b[k], acc), k ascending;
// NaN results canonical (0x7FC00000). a(b, i, k) = A[b*sab + i*sai + k*sak],
// b(b, k, j) = B[b*sbb + k*sbk + j*sbj], C contiguous (batch, M, N). K == 0 writes +0.
// `stream` is a cudaStream_t. Returns a cudaError_t (0 = success).
int repops_cuda_gemm(const float* A, int64_t sab, int64_t sai, int64_t sak, const float* B, int64_t sbb,
                     int64_t sbk, int64_t sbj, float* C, int64_t batch, int64_t M, int64_t N, int64_t K,
                     void* stream);

#ifdef __cplusplus
}
#endif
