// SPDX-License-Identifier: MIT
//
// repops_cuda.cu — RepOps GEMM on CUDA with the canonical dot-product order.
//
// Build flags that the semantics depend on (see tests/test_cuda_compile.py, scripts/gpu_check.py):
//   --fmad=false      never contract a*b+c written as two ops (we use explicit intrinsics anyway)
//   -ftz=false        keep subnormals
//   -prec-div=true -prec-sqrt=true, and never --use_fast_math
//
// Order per output element (identical to kernels/repops_cpu.cpp and verde_chain/repops/spec.py):
//   acc = __fmul_rn(a[0], b[0])                 one rounded multiply
//   acc = __fmaf_rn(a[k], b[k], acc)            k = 1 .. K-1, ascending, one rounding each
// then NaN -> 0x7FC00000. The _rn intrinsics pin round-to-nearest-even and stop the compiler
// from fusing or reassociating. K is never split across threads or blocks: each thread owns
// whole output elements and walks the full K range in order; shared-memory tiling only stages
// operands.
//
// Tiling: a block of 256 threads computes a BM x BN = 128 x 128 output tile; each thread owns
// TM x TN = 8 x 8 elements at rows ty + 16*m and columns tx + 16*n (strided ownership:
// conflict-free shared-memory reads, coalesced stores). K advances in BK = 8 slices.
//
//      B tile  Bs[BK][BN]
//        k ->  +-------------+
//              |             |
//   A tile     +-------------+
//   As[BK][BM]   C tile (block) : thread (tx, ty) owns C[ty + 16m][tx + 16n], m, n < 8

#include <cuda_runtime.h>
#include <stdint.h>

#include "repops_cuda.h"

namespace {

constexpr int BM = 128;
constexpr int BN = 128;
constexpr int BK = 8;
constexpr int TM = 8;
constexpr int TN = 8;
constexpr int TX = BN / TN;  // 16 threads across columns
constexpr int TY = BM / TM;  // 16 threads across rows
constexpr int THREADS = TX * TY;
static_assert((BK * BM) % THREADS == 0 && (BK * BN) % THREADS == 0, "tile loads must divide evenly");

struct GemmParams {
    const float* A;
    int64_t sab, sai, sak;
    const float* B;
    int64_t sbb, sbk, sbj;
    float* C;
    int64_t M, N, K;
};

__device__ __forceinline__ float canon(float x) { return isnan(x) ? __int_as_float(0x7FC00000) : x; }

__global__ void __launch_bounds__(THREADS) repops_gemm_kernel(GemmParams p) {
    __shared__ float As[BK][BM];
    __shared__ float Bs[BK][BN];

    const int tid = threadIdx.x;
    const int tx = tid % TX, ty = tid / TX;
    const int64_t bz = blockIdx.z;
    const int64_t row0 = (int64_t)blockIdx.y * BM, col0 = (int64_t)blockIdx.x * BN;
    const float* A = p.A + bz * p.sab;
    const float* B = p.B + bz * p.sbb;

    float acc[TM][TN];
#pragma unroll
    for (int m = 0; m < TM; m++)
#pragma unroll
        for (int n = 0; n < TN; n++) acc[m][n] = 0.0f;  // overwritten by the k = 0 product

    for (int64_t k0 = 0; k0 < p.K; k0 += BK) {
        // Stage the A slice: consecutive threads take consecutive k of one row (row-major A).
#pragma unroll
        for (int l = 0; l < (BK * BM) / THREADS; l++) {
            const int idx = tid + l * THREADS;
            const int i = idx / BK, kk = idx % BK;
            const int64_t gi = row0 + i, gk = k0 + kk;
            As[kk][i] = (gi < p.M && gk < p.K) ? A[gi * p.sai + gk * p.sak] : 0.0f;
        }
        // Stage the B slice: consecutive threads take consecutive columns (row-major B).
#pragma unroll
        for (int l = 0; l < (BK * BN) / THREADS; l++) {
            const int idx = tid + l * THREADS;
            const int j = idx % BN, kk = idx / BN;
            const int64_t gj = col0 + j, gk = k0 + kk;
            Bs[kk][j] = (gj < p.N && gk < p.K) ? B[gk * p.sbk + gj * p.sbj] : 0.0f;
        }
        __syncthreads();

        // SAFETY: only k < K is consumed; the zero padding of the last slice never enters a chain.
        const int kmax = (p.K - k0) < BK ? (int)(p.K - k0) : BK;
        int kk = 0;
        if (k0 == 0) {
            // INVARIANT: the chain opens with one rounded multiply, not fma(a0, b0, +0) (which
            // would turn a -0 product into +0).
            float a[TM], b[TN];
#pragma unroll
            for (int m = 0; m < TM; m++) a[m] = As[0][ty + TY * m];
#pragma unroll
            for (int n = 0; n < TN; n++) b[n] = Bs[0][tx + TX * n];
#pragma unroll
            for (int m = 0; m < TM; m++)
#pragma unroll
                for (int n = 0; n < TN; n++) acc[m][n] = __fmul_rn(a[m], b[n]);
            kk = 1;
        }
        for (; kk < kmax; kk++) {
            float a[TM], b[TN];
#pragma unroll
            for (int m = 0; m < TM; m++) a[m] = As[kk][ty + TY * m];
#pragma unroll
            for (int n = 0; n < TN; n++) b[n] = Bs[kk][tx + TX * n];
#pragma unroll
            for (int m = 0; m < TM; m++)
#pragma unroll
                for (int n = 0; n < TN; n++) acc[m][n] = __fmaf_rn(a[m], b[n], acc[m][n]);
        }
        __syncthreads();
    }

    float* C = p.C + bz * p.M * p.N;
#pragma unroll
    for (int m = 0; m < TM; m++) {
        const int64_t gi = row0 + ty + TY * m;
        if (gi >= p.M) continue;
#pragma unroll
        for (int n = 0; n < TN; n++) {
            const int64_t gj = col0 + tx + TX * n;
            if (gj < p.N) C[gi * p.N + gj] = canon(acc[m][n]);
        }
    }
}

}  // namespace

extern "C" int repops_cuda_gemm(const float* A, int64_t sab, int64_t sai, int64_t sak, const float* B, int64_t sbb,
                                int64_t sbk, int64_t sbj, float* C, int64_t batch, int64_t M, int64_t N, int64_t K,
                                void* stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (batch <= 0 || M <= 0 || N <= 0) return cudaSuccess;
    if (K == 0) return cudaMemsetAsync(C, 0, sizeof(float) * batch * M * N, s);  // empty sum: +0
    if (batch > 65535) return cudaErrorInvalidValue;  // gridDim.z limit; callers split batches
    GemmParams p{A, sab, sai, sak, B, sbb, sbk, sbj, C, M, N, K};
    dim3 grid((unsigned)((N + BN - 1) / BN), (unsigned)((M + BM - 1) / BM), (unsigned)batch);
    repops_gemm_kernel<<<grid, THREADS, 0, s>>>(p);
    return cudaGetLastError();
}
