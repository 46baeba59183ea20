// SPDX-License-Identifier: MIT
//
// repops_cuda.cu — RepOps on CUDA: the GEMM with the canonical dot-product order, and the
// generic program interpreter (one thread per output element) for every other KernelDesc.
//
// Build flags that the semantics depend on (see tests/test_cuda_compile.py, scripts/gpu_check.py):
//   --fmad=false      never contract a*b+c written as two ops (we use explicit intrinsics anyway)
//   -ftz=false        keep subnormals
//   -prec-div=true -prec-sqrt=true, and never --use_fast_math
//
// Order per output element (identical to kernels/cpu/gemm.cpp and verde_chain/repops/library/linalg.py):
//   acc = __fmul_rn(a[0], b[0])                 one rounded multiply
//   acc = __fmaf_rn(a[k], b[k], acc)            k = 1 .. K-1, ascending, one rounding each
// then NaN -> 0x7FC00000 (rp_canon, kernels/repops_fp32.h). The _rn intrinsics pin
// round-to-nearest-even and stop the compiler from fusing or reassociating. K is never split
// across threads or blocks: each thread owns whole output elements and walks the full K range in
// order; shared-memory tiling only stages operands.
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
#include "../repops_program.cuh"

#include <vector>

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

// Operand loaders of the tile body: element (i, k) of A and (k, j) of B for batch entry bz.
struct StridedOperands {
    GemmParams p;
    __device__ __forceinline__ float a(int64_t bz, int64_t i, int64_t k) const {
        return p.A[bz * p.sab + i * p.sai + k * p.sak];
    }
    __device__ __forceinline__ float b(int64_t bz, int64_t k, int64_t j) const {
        return p.B[bz * p.sbb + k * p.sbk + j * p.sbj];
    }
};

// One BM x BN output tile of batch entry blockIdx.z, operands read through `ld`.
template <class Loader>
__device__ __forceinline__ void gemm_tile(const Loader& ld, float* Cout, int64_t M, int64_t N, int64_t K) {
    __shared__ float As[BK][BM];
    __shared__ float Bs[BK][BN];

    const int tid = threadIdx.x;
    const int tx = tid % TX, ty = tid / TX;
    const int64_t bz = blockIdx.z;
    const int64_t row0 = (int64_t)blockIdx.y * BM, col0 = (int64_t)blockIdx.x * BN;

    float acc[TM][TN];
#pragma unroll
    for (int m = 0; m < TM; m++)
#pragma unroll
        for (int n = 0; n < TN; n++) acc[m][n] = 0.0f;  // overwritten by the k = 0 product

    for (int64_t k0 = 0; k0 < K; k0 += BK) {
        // Stage the A slice: consecutive threads take consecutive k of one row (row-major A).
#pragma unroll
        for (int l = 0; l < (BK * BM) / THREADS; l++) {
            const int idx = tid + l * THREADS;
            const int i = idx / BK, kk = idx % BK;
            const int64_t gi = row0 + i, gk = k0 + kk;
            As[kk][i] = (gi < M && gk < K) ? ld.a(bz, gi, gk) : 0.0f;
        }
        // Stage the B slice: consecutive threads take consecutive columns (row-major B).
#pragma unroll
        for (int l = 0; l < (BK * BN) / THREADS; l++) {
            const int idx = tid + l * THREADS;
            const int j = idx % BN, kk = idx / BN;
            const int64_t gj = col0 + j, gk = k0 + kk;
            Bs[kk][j] = (gj < N && gk < K) ? ld.b(bz, gk, gj) : 0.0f;
        }
        __syncthreads();

        // SAFETY: only k < K is consumed; the zero padding of the last slice never enters a chain.
        const int kmax = (K - k0) < BK ? (int)(K - k0) : BK;
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

    float* C = Cout + bz * M * N;
#pragma unroll
    for (int m = 0; m < TM; m++) {
        const int64_t gi = row0 + ty + TY * m;
        if (gi >= M) continue;
#pragma unroll
        for (int n = 0; n < TN; n++) {
            const int64_t gj = col0 + tx + TX * n;
            if (gj < N) C[gi * N + gj] = rp_f(rp_canon(rp_u(acc[m][n])));
        }
    }
}

__global__ void __launch_bounds__(THREADS) repops_gemm_kernel(GemmParams p) {
    gemm_tile(StridedOperands{p}, p.C, p.M, p.N, p.K);
}

// The windowed GEMM (convolutions, repops/windowed.py; kernels/cpu/conv.cpp on the CPU): the
// same tiles, each operand element read through its tables as it is staged (implicit im2col).
__device__ __forceinline__ float win_element(const RpWinOperand& o, int64_t r, int64_t k) {
    const int64_t cols = 1 + o.nchk;
    int64_t addr = o.rows[r] + o.ks[k * cols];
    for (int64_t w = 0; w < o.nchk; w++) {
        const int64_t v = o.rows[(1 + w) * o.R + r] + o.ks[k * cols + 1 + w];
        const int64_t div = o.wins[3 * w], size = o.wins[3 * w + 1];
        if (v < 0) return rp_f(o.fill);
        const int64_t q = v / div;
        if (q * div != v || q >= size) return rp_f(o.fill);
        addr += q * o.wins[3 * w + 2];
    }
    // SAFETY: the host checked every in-range address against numel (repops_cuda_windowed_gemm)
    return rp_f(o.data[addr]);
}

struct WindowedOperands {
    RpWinOperand A, B;
    int64_t M, N;
    __device__ __forceinline__ float a(int64_t bz, int64_t i, int64_t k) const { return win_element(A, bz * M + i, k); }
    __device__ __forceinline__ float b(int64_t bz, int64_t k, int64_t j) const { return win_element(B, bz * N + j, k); }
};

__global__ void __launch_bounds__(THREADS) repops_wgemm_kernel(WindowedOperands ops, float* C, int64_t K) {
    gemm_tile(ops, C, ops.M, ops.N, K);
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

extern "C" int repops_cuda_windowed_gemm(const RpWinOperand* a, const RpWinOperand* b, float* C, int64_t batch,
                                         int64_t M, int64_t N, int64_t K, void* stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (batch <= 0 || M <= 0 || N <= 0 || K <= 0) return cudaErrorInvalidValue;
    if (batch > 65535) return cudaErrorInvalidValue;  // gridDim.z limit
    WindowedOperands ops{*a, *b, M, N};
    dim3 grid((unsigned)((N + BN - 1) / BN), (unsigned)((M + BM - 1) / BM), (unsigned)batch);
    repops_wgemm_kernel<<<grid, THREADS, 0, s>>>(ops, C, K);
    return cudaGetLastError();
}

// ============================================================================ program interpreter
//
// Any KernelDesc, one thread per output element (grid-stride), through rp_run_element of
// kernels/repops_program.cuh: the same code the host build runs in tests/test_cuda_program.py.
// The decoded descriptor (input maps, then the instruction stream) is staged in shared memory
// when it fits: every thread of a warp reads the same instruction and map (a broadcast).

namespace {

constexpr int PROGRAM_THREADS = 256;
constexpr int64_t PROGRAM_MAX_BLOCKS = 1 << 20;
constexpr int64_t SHARED_STAGE_BYTES = 32 * 1024;
static_assert(sizeof(RpMap) % 4 == 0 && sizeof(RpInstr) % 4 == 0, "staged as 32-bit words");

__global__ void __launch_bounds__(PROGRAM_THREADS)
    repops_program_kernel(RpProgram p, const uint32_t* __restrict__ r0_init, uint32_t* __restrict__ out, int stage) {
    extern __shared__ __align__(16) uint32_t stage_smem[];
    if (stage) {
        // The scratch layout is [maps][code], contiguous (see repops_cuda_run_program).
        const int64_t map_bytes = (int64_t)sizeof(RpMap) * p.n_in;
        const int64_t words = (map_bytes + (int64_t)sizeof(RpInstr) * (p.n_pro + p.n_body + p.n_epi)) / 4;
        const uint32_t* src = reinterpret_cast<const uint32_t*>(p.maps);
        for (int64_t i = threadIdx.x; i < words; i += blockDim.x) stage_smem[i] = src[i];
        __syncthreads();
        p.maps = reinterpret_cast<const RpMap*>(stage_smem);
        p.code = reinterpret_cast<const RpInstr*>(reinterpret_cast<const char*>(stage_smem) + map_bytes);
    }
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < p.numel; e += step)
        out[e] = rp_run_element(p, e, r0_init != nullptr ? r0_init + e : nullptr);
}

void put_error(char* err, int64_t err_len, const char* msg) {
    if (err == nullptr || err_len <= 0) return;
    int64_t i = 0;
    for (; msg[i] != 0 && i < err_len - 1; i++) err[i] = msg[i];
    err[i] = 0;
}

}  // namespace

// The launch parameters of one prepared node (repops_cuda_prepare_program): the decoded
// descriptor (its maps and code pointers lead into the caller's device blob) and the fixed
// r0_init / out device pointers. Kept on the host; launched by value.
struct RpLaunch {
    RpProgram prog;
    const uint32_t* r0_init;
    uint32_t* out;
};

extern "C" int64_t repops_cuda_program_scratch_bytes(int64_t n_in, int64_t n_instr) {
    return (int64_t)sizeof(RpMap) * n_in + (int64_t)sizeof(RpInstr) * n_instr + 16;
}

extern "C" int64_t repops_cuda_launch_bytes(void) { return (int64_t)sizeof(RpLaunch); }

extern "C" int64_t repops_cuda_launch_numel(const void* launch) {
    return static_cast<const RpLaunch*>(launch)->prog.numel;
}

extern "C" int repops_cuda_prepare_program(const uint32_t* const* inputs, int64_t n_in, const int64_t* maps,
                                           const int64_t* out_shape, int64_t rank, int64_t K, const int64_t* pro,
                                           int64_t n_pro, const int64_t* body, int64_t n_body, const int64_t* epi,
                                           int64_t n_epi, const uint32_t* r0_init, uint32_t* out, void* launch,
                                           void* blob, int64_t blob_bytes, void* stream, char* err, int64_t err_len) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (n_in < 0 || n_pro < 0 || n_body < 0 || n_epi < 0) {
        put_error(err, err_len, "negative count");
        return -1;
    }
    const int64_t n_instr = n_pro + n_body + n_epi;
    // Staging area, host side: maps first (8-byte aligned), then the instructions.
    std::vector<RpMap> maps_h((size_t)(n_in > 0 ? n_in : 1));
    std::vector<RpInstr> code_h((size_t)(n_instr > 0 ? n_instr : 1));
    RpLaunch* l = static_cast<RpLaunch*>(launch);
    RpProgram prog{};
    // SAFETY: nothing is staged or launched unless the encodings pass every check (opcodes,
    // registers, input slots, COORD axes, and the LOAD address boxes).
    const char* bad = rp_decode(inputs, n_in, maps, out_shape, rank, K, pro, n_pro, body, n_body, epi, n_epi, &prog,
                                maps_h.data(), code_h.data());
    if (bad != nullptr) {
        put_error(err, err_len, bad);
        return -1;
    }
    if (blob_bytes < repops_cuda_program_scratch_bytes(n_in, n_instr)) {
        put_error(err, err_len, "scratch buffer too small");
        return -1;
    }
    char* dev = static_cast<char*>(blob);
    const size_t map_bytes = sizeof(RpMap) * (size_t)n_in, code_bytes = sizeof(RpInstr) * (size_t)n_instr;
    cudaError_t rc = cudaSuccess;
    // Pageable host -> device: the source is copied to a staging buffer before the call
    // returns, so the host vectors may die at the end of this function.
    if (map_bytes) rc = cudaMemcpyAsync(dev, maps_h.data(), map_bytes, cudaMemcpyHostToDevice, s);
    if (rc == cudaSuccess && code_bytes)
        rc = cudaMemcpyAsync(dev + map_bytes, code_h.data(), code_bytes, cudaMemcpyHostToDevice, s);
    if (rc != cudaSuccess) return (int)rc;
    prog.maps = reinterpret_cast<const RpMap*>(dev);
    prog.code = reinterpret_cast<const RpInstr*>(dev + map_bytes);
    l->prog = prog;
    l->r0_init = r0_init;
    l->out = out;
    return 0;
}

extern "C" int repops_cuda_launch_program(const void* launch, void* stream) {
    const RpLaunch& l = *static_cast<const RpLaunch*>(launch);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const int64_t want = (l.prog.numel + PROGRAM_THREADS - 1) / PROGRAM_THREADS;
    const unsigned blocks = (unsigned)(want < PROGRAM_MAX_BLOCKS ? want : PROGRAM_MAX_BLOCKS);
    const size_t stage_bytes = sizeof(RpMap) * (size_t)l.prog.n_in +
                               sizeof(RpInstr) * (size_t)(l.prog.n_pro + l.prog.n_body + l.prog.n_epi);
    const int stage = (int64_t)stage_bytes <= SHARED_STAGE_BYTES ? 1 : 0;
    repops_program_kernel<<<blocks, PROGRAM_THREADS, stage ? stage_bytes : 0, s>>>(l.prog, l.r0_init, l.out, stage);
    return (int)cudaGetLastError();
}

extern "C" int repops_cuda_run_program(const uint32_t* const* inputs, int64_t n_in, const int64_t* maps,
                                       const int64_t* out_shape, int64_t rank, int64_t K, const int64_t* pro,
                                       int64_t n_pro, const int64_t* body, int64_t n_body, const int64_t* epi,
                                       int64_t n_epi, const uint32_t* r0_init, uint32_t* out, void* scratch,
                                       int64_t scratch_bytes, void* stream, char* err, int64_t err_len) {
    // One node, one call: prepared into the caller's scratch and launched at once (the
    // whole-step kernel prepares every node once and only launches per step).
    RpLaunch l{};
    const int rc = repops_cuda_prepare_program(inputs, n_in, maps, out_shape, rank, K, pro, n_pro, body, n_body, epi,
                                               n_epi, r0_init, out, &l, scratch, scratch_bytes, stream, err, err_len);
    if (rc != 0) return rc;
    return repops_cuda_launch_program(&l, stream);
}
