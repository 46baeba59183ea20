// SPDX-License-Identifier: MIT
//
// repops_cuda.h — host interface of the RepOps CUDA kernels (kernels/repops_cuda.cu): the GEMM,
// the windowed GEMM of convolutions and the generic program interpreter.
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

// One operand of the windowed GEMM, DEVICE pointers (the CPU's WinOperand, kernels/cpu/kernels.h):
// element (r, k) is data[rows[r] + ks[k*(1+nchk)]] plus (v/div)*stride per div > 1 window, or
// fill where a window w (v = rows[(1+w)*R + r] + ks[k*(1+nchk) + 1+w]; wins[3w..] = div, size,
// stride) has v < 0, v % div != 0 or v/div >= size. The caller guarantees every in-range
// address lies in data (repops/windowed.py: the descriptor's static check).
typedef struct {
    const uint32_t* data;
    const int64_t* rows;
    const int64_t* ks;
    const int64_t* wins;
    int64_t R, nchk;
    uint32_t fill;
} RpWinOperand;

// C (batch, M, N) = the dot chain over k of A(b*M + i, k) * B(b*N + j, k) (repops_cuda_gemm's
// order and tiles, operands staged through their windows). `a`, `b`: HOST structs.
int repops_cuda_windowed_gemm(const RpWinOperand* a, const RpWinOperand* b, float* C, int64_t batch, int64_t M,
                              int64_t N, int64_t K, void* stream);

// Scratch device memory (bytes) repops_cuda_run_program needs for n_in maps and n_instr
// instructions (the decoded descriptor is staged there; stream-ordered, reusable afterwards).
int64_t repops_cuda_program_scratch_bytes(int64_t n_in, int64_t n_instr);

// Run any RepOps program (kernels/repops_program.cuh): out[e] = r0 after element e's run.
// Encodings as the CPU interpreter's (kernels/cpu/interpreter.h; HOST arrays): maps (n_in, rank + 4) int64
// rows `strides..., kstride, offset, idx_stride, numel`; programs (n, 5) int64 rows
// `op, dst, a, b, imm`. `inputs`: a HOST array of n_in DEVICE pointers to the inputs' bits;
// r0_init (device, numel values, or NULL): preset r0 and run only the epilogue; out: device,
// numel values; scratch: device memory of repops_cuda_program_scratch_bytes(...) bytes.
// Returns 0, -1 when the descriptor is refused (the reason in err), or a cudaError_t (> 0).
int repops_cuda_run_program(const uint32_t* const* inputs, int64_t n_in, const int64_t* maps, const int64_t* out_shape,
                            int64_t rank, int64_t K, const int64_t* pro, int64_t n_pro, const int64_t* body,
                            int64_t n_body, const int64_t* epi, int64_t n_epi, const uint32_t* r0_init, uint32_t* out,
                            void* scratch, int64_t scratch_bytes, void* stream, char* err, int64_t err_len);

// The same in two halves, for a node that runs many times on the same buffers (the
// whole-step kernel, backends/cuda/step.py CudaStepKernel): prepare decodes and checks the descriptor
// ONCE, stages it in `blob` (device memory of repops_cuda_program_scratch_bytes(...) bytes that
// the caller keeps alive) and fills `launch` (HOST memory of repops_cuda_launch_bytes() bytes)
// with the launch parameters, the inputs', r0_init's and out's device pointers baked in;
// launch then only starts the kernel (no transfer, no decoding). The caller guarantees that
// every baked pointer still points at the buffer it was prepared with, out apart from all the
// others. Return values as repops_cuda_run_program's.
int64_t repops_cuda_launch_bytes(void);
int64_t repops_cuda_launch_numel(const void* launch);
int repops_cuda_prepare_program(const uint32_t* const* inputs, int64_t n_in, const int64_t* maps,
                                const int64_t* out_shape, int64_t rank, int64_t K, const int64_t* pro, int64_t n_pro,
                                const int64_t* body, int64_t n_body, const int64_t* epi, int64_t n_epi,
                                const uint32_t* r0_init, uint32_t* out, void* launch, void* blob, int64_t blob_bytes,
                                void* stream, char* err, int64_t err_len);
int repops_cuda_launch_program(const void* launch, void* stream);

#ifdef __cplusplus
}
#endif
