/* SPDX-License-Identifier: MIT
 *
 * keccak_tree.c — Ethereum keccak-256 and the verde_chain tensor Merkle root, in portable C.
 *
 * Why one file over ~800 lines: it is loaded as one ctypes shared object (commit/native.py) and its
 * scalar, AVX2 (4 lanes) and AVX-512 (8 lanes) permutations must stay bit-identical; kept together
 * they are compared in one place (tests/commit) and dispatched by one CPU check.
 *
 * Twin of verde_chain/commit/merkle.py (generic positional trees) plus the tensor leaf packing:
 *
 *   tensor (n binary32 values, flat C order)
 *     |  each element -> its 4 bit-pattern bytes, BIG-endian
 *     v
 *   chunk i = elements [128 i, 128 i + 128), last chunk zero-padded   (LEAF_ELEMS = 128, 512 bytes)
 *   leaf  i = keccak256(chunk i)                                       (4 permutations per leaf)
 *     |
 *     v
 *                        root
 *                  /              \
 *            H(l0 || l1)       H(l2 || ZERO)       H = keccak256 of the 64-byte pair (positional)
 *            /     \           /      \
 *          l0      l1        l2      ZERO          ZERO = 32 zero bytes pad to a power of two
 *
 * One leaf -> the root is that leaf; zero elements is an error (the caller checks).
 *
 * Keccak here is the original submission padding (0x01 ... 0x80) that Ethereum uses, not
 * FIPS-202 SHA3 (0x06). Rate 136 bytes (17 lanes), capacity 512 bits, 24 rounds of
 * Keccak-f[1600]. Lanes are little-endian 64-bit words of the byte stream.
 *
 * Parallelism: the padded tree is cut into equal, power-of-two sized subtrees ("tasks"); each
 * thread folds the leaves of whole subtrees with a binary-counter stack (O(log n) memory, no
 * leaf array), and the subtree roots are folded the same way on top. Inside a task, blocks of
 * 256 leaves are hashed eight (AVX-512) or four (AVX2) at a time (independent Keccak states in
 * the lanes of a vector: the leaves, then each level of the block's subtree), which is why a tensor root runs faster than one
 * sequential keccak over the same bytes. Subtrees that lie entirely in the zero padding are
 * never hashed: their roots are the precomputed ZERO_l (ZERO_0 = 0, ZERO_{l+1} =
 * H(ZERO_l || ZERO_l)). The result is independent of the thread count.
 *
 * Many tensors in one call (tensor_roots: a training step's node outputs, a model's state):
 * trees of at most 256 leaves are hashed together in groups, their leaves and then each level's
 * pairs packed into the vector lanes ACROSS tensors; larger trees are cut into subtree tasks as
 * above, and the tasks of all of them and the groups form one list of items that the threads
 * share out (one start and join per call, not per large tensor). The caller may bring its own
 * threads (roots_begin / roots_run_item / roots_end: the RepOps whole-step plan runs the items
 * on its persistent pool). A ragged group fills its spare lanes with a copy rather than falling back to scalar
 * permutations (one eight-lane permutation costs less than one scalar one on AVX-512 CPUs).
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LEAF_ELEMS 128
#define LEAF_BYTES (LEAF_ELEMS * 4)
#define RATE_BYTES 136
#define RATE_LANES 17
#define MAX_LEVELS 64
#define MAX_THREADS 256
#define MIN_LEAVES_PER_THREAD 1024

/* ------------------------------------------------------------------------------------------ */
/* Keccak-f[1600]                                                                              */
/* ------------------------------------------------------------------------------------------ */

static const uint64_t ROUND_CONSTANTS[24] = {
    0x0000000000000001ULL, 0x0000000000008082ULL, 0x800000000000808AULL, 0x8000000080008000ULL,
    0x000000000000808BULL, 0x0000000080000001ULL, 0x8000000080008081ULL, 0x8000000000008009ULL,
    0x000000000000008AULL, 0x0000000000000088ULL, 0x0000000080008009ULL, 0x000000008000000AULL,
    0x000000008000808BULL, 0x800000000000008BULL, 0x8000000000008089ULL, 0x8000000000008003ULL,
    0x8000000000008002ULL, 0x8000000000000080ULL, 0x000000000000800AULL, 0x800000008000000AULL,
    0x8000000080008081ULL, 0x8000000000008080ULL, 0x0000000080000001ULL, 0x8000000080008008ULL,
};

/* Rotate left by a constant 1..63: ROL for GCC vector types (several independent states, one
 * per lane), rotl64 for one state (an inline function measured ~10% faster than the macro). */
#define ROL(v, r) (((v) << (r)) | ((v) >> (64 - (r))))

static inline uint64_t rotl64(uint64_t v, unsigned r) { return (v << r) | (v >> (64 - r)); }

/* One round on named lanes A[x + 5y] of lane type T (uint64_t, or a vector of them) with the
 * rotation ROT suited to T. Written as straight-line code (theta, rho+pi, chi, iota) so the
 * compiler keeps all 25 lanes plus temporaries in registers/stack slots without index
 * arithmetic. The rho offsets r[x][y] and the pi move (x, y) -> (y, 2x + 3y) are inlined. */
#define KECCAK_ROUND(T, ROT, A, RC)                                                                \
    do {                                                                                           \
        T c0 = A[0] ^ A[5] ^ A[10] ^ A[15] ^ A[20];                                                \
        T c1 = A[1] ^ A[6] ^ A[11] ^ A[16] ^ A[21];                                                \
        T c2 = A[2] ^ A[7] ^ A[12] ^ A[17] ^ A[22];                                                \
        T c3 = A[3] ^ A[8] ^ A[13] ^ A[18] ^ A[23];                                                \
        T c4 = A[4] ^ A[9] ^ A[14] ^ A[19] ^ A[24];                                                \
        T d0 = c4 ^ ROT(c1, 1);                                                                    \
        T d1 = c0 ^ ROT(c2, 1);                                                                    \
        T d2 = c1 ^ ROT(c3, 1);                                                                    \
        T d3 = c2 ^ ROT(c4, 1);                                                                    \
        T d4 = c3 ^ ROT(c0, 1);                                                                    \
        /* B[y + 5((2x + 3y) mod 5)] = rotl(A[x + 5y] ^ D[x], r[x][y]) */                          \
        T b0 = A[0] ^ d0;                                                                          \
        T b10 = ROT(A[1] ^ d1, 1);                                                                 \
        T b20 = ROT(A[2] ^ d2, 62);                                                                \
        T b5 = ROT(A[3] ^ d3, 28);                                                                 \
        T b15 = ROT(A[4] ^ d4, 27);                                                                \
        T b16 = ROT(A[5] ^ d0, 36);                                                                \
        T b1 = ROT(A[6] ^ d1, 44);                                                                 \
        T b11 = ROT(A[7] ^ d2, 6);                                                                 \
        T b21 = ROT(A[8] ^ d3, 55);                                                                \
        T b6 = ROT(A[9] ^ d4, 20);                                                                 \
        T b7 = ROT(A[10] ^ d0, 3);                                                                 \
        T b17 = ROT(A[11] ^ d1, 10);                                                               \
        T b2 = ROT(A[12] ^ d2, 43);                                                                \
        T b12 = ROT(A[13] ^ d3, 25);                                                               \
        T b22 = ROT(A[14] ^ d4, 39);                                                               \
        T b23 = ROT(A[15] ^ d0, 41);                                                               \
        T b8 = ROT(A[16] ^ d1, 45);                                                                \
        T b18 = ROT(A[17] ^ d2, 15);                                                               \
        T b3 = ROT(A[18] ^ d3, 21);                                                                \
        T b13 = ROT(A[19] ^ d4, 8);                                                                \
        T b14 = ROT(A[20] ^ d0, 18);                                                               \
        T b24 = ROT(A[21] ^ d1, 2);                                                                \
        T b9 = ROT(A[22] ^ d2, 61);                                                                \
        T b19 = ROT(A[23] ^ d3, 56);                                                               \
        T b4 = ROT(A[24] ^ d4, 14);                                                                \
        /* chi: A[x, y] = B[x, y] ^ (~B[x+1, y] & B[x+2, y]); then iota on lane 0 */               \
        A[0] = b0 ^ (~b1 & b2) ^ (RC);                                                             \
        A[1] = b1 ^ (~b2 & b3);                                                                    \
        A[2] = b2 ^ (~b3 & b4);                                                                    \
        A[3] = b3 ^ (~b4 & b0);                                                                    \
        A[4] = b4 ^ (~b0 & b1);                                                                    \
        A[5] = b5 ^ (~b6 & b7);                                                                    \
        A[6] = b6 ^ (~b7 & b8);                                                                    \
        A[7] = b7 ^ (~b8 & b9);                                                                    \
        A[8] = b8 ^ (~b9 & b5);                                                                    \
        A[9] = b9 ^ (~b5 & b6);                                                                    \
        A[10] = b10 ^ (~b11 & b12);                                                                \
        A[11] = b11 ^ (~b12 & b13);                                                                \
        A[12] = b12 ^ (~b13 & b14);                                                                \
        A[13] = b13 ^ (~b14 & b10);                                                                \
        A[14] = b14 ^ (~b10 & b11);                                                                \
        A[15] = b15 ^ (~b16 & b17);                                                                \
        A[16] = b16 ^ (~b17 & b18);                                                                \
        A[17] = b17 ^ (~b18 & b19);                                                                \
        A[18] = b18 ^ (~b19 & b15);                                                                \
        A[19] = b19 ^ (~b15 & b16);                                                                \
        A[20] = b20 ^ (~b21 & b22);                                                                \
        A[21] = b21 ^ (~b22 & b23);                                                                \
        A[22] = b22 ^ (~b23 & b24);                                                                \
        A[23] = b23 ^ (~b24 & b20);                                                                \
        A[24] = b24 ^ (~b20 & b21);                                                                \
    } while (0)

/* 24 rounds on st[25] of lane type T, the lanes kept in locals (see KECCAK_ROUND). */
#define KECCAK_PERMUTE(T, ROT, st)                                                               \
    do {                                                                                         \
        T A[25];                                                                                 \
        memcpy(A, st, sizeof A);                                                                 \
        for (int round = 0; round < 24; round += 2) {                                            \
            KECCAK_ROUND(T, ROT, A, ROUND_CONSTANTS[round]);                                     \
            KECCAK_ROUND(T, ROT, A, ROUND_CONSTANTS[round + 1]);                                 \
        }                                                                                        \
        memcpy(st, A, sizeof A);                                                                 \
    } while (0)

/* Function multiversioning: a BMI1/BMI2 clone (andn, rorx) is picked at load time where the
 * CPU has it; the default clone runs on any x86-64. Other architectures get the plain build. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(VERDE_MULTIVERSION)
#define KECCAK_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KECCAK_CLONES
#endif

KECCAK_CLONES
static void keccak_f1600(uint64_t st[25]) {
    KECCAK_PERMUTE(uint64_t, rotl64, st);
}

static inline uint64_t load_le64(const uint8_t* p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline void store_le64(uint8_t* p, uint64_t v) {
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    memcpy(p, &v, 8);
}

/* An element's big-endian bytes, read as the low or high half of a little-endian lane. */
static inline uint32_t bswap_be32(uint32_t v) {
#if __BYTE_ORDER__ != __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

static inline void squeeze256(const uint64_t st[25], uint8_t out[32]) {
    for (int i = 0; i < 4; i++) store_le64(out + 8 * i, st[i]);
}

/* keccak256 of an arbitrary byte string (the bulk baseline for benchmarks and the tests). */
void keccak256(const uint8_t* data, size_t len, uint8_t out[32]) {
    uint64_t st[25] = {0};
    while (len >= RATE_BYTES) {
        for (int i = 0; i < RATE_LANES; i++) st[i] ^= load_le64(data + 8 * i);
        keccak_f1600(st);
        data += RATE_BYTES;
        len -= RATE_BYTES;
    }
    uint8_t block[RATE_BYTES] = {0};
    memcpy(block, data, len);
    block[len] ^= 0x01; /* Keccak padding, first bit */
    block[RATE_BYTES - 1] ^= 0x80; /* ... and last bit (same byte if len == 135: 0x81) */
    for (int i = 0; i < RATE_LANES; i++) st[i] ^= load_le64(block + 8 * i);
    keccak_f1600(st);
    squeeze256(st, out);
}

/* keccak256(left || right) for two 32-byte nodes: one block, padding at byte 64 and 135. */
static void hash_pair(const uint8_t left[32], const uint8_t right[32], uint8_t out[32]) {
    uint64_t st[25] = {0};
    for (int i = 0; i < 4; i++) {
        st[i] = load_le64(left + 8 * i);
        st[4 + i] = load_le64(right + 8 * i);
    }
    st[8] = 0x01;
    st[16] = 0x8000000000000000ULL;
    keccak_f1600(st);
    squeeze256(st, out);
}

/* ------------------------------------------------------------------------------------------ */
/* Four independent states at once                                                             */
/* ------------------------------------------------------------------------------------------ */

/* Leaves and the pairs of one tree level are independent hashes, so four of them run in the
 * four 64-bit lanes of a vector: lane w of every state word belongs to hash w. GCC vector
 * extensions keep this portable C; the clones of the two callers (whole leaves, whole pairs,
 * with the permutation inlined) pick AVX-512VL (vprolq, vpternlogq on ymm) or AVX2 at load
 * time, and the baseline clone falls back to four scalar permutations. */
typedef uint64_t u64x4 __attribute__((vector_size(32)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(VERDE_MULTIVERSION)
#define KECCAK_X4_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KECCAK_X4_CLONES
#endif

static inline __attribute__((always_inline)) void keccak_f1600_x4(u64x4 st[25]) {
    KECCAK_PERMUTE(u64x4, ROL, st);
}

/* The vector permutation only pays off with 256-bit integer SIMD (AVX2 or better); on other
 * CPUs the four states are permuted one after another with the scalar code instead. */
static int vector_keccak_ok(void) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(VERDE_MULTIVERSION)
    return __builtin_cpu_supports("avx2");
#elif defined(__AVX2__)
    return 1;
#else
    return 0;
#endif
}

static inline __attribute__((always_inline)) void permute_x4(u64x4 st[25]) {
    if (vector_keccak_ok()) {
        keccak_f1600_x4(st);
        return;
    }
    for (int w = 0; w < 4; w++) {
        uint64_t one[25];
        for (int i = 0; i < 25; i++) one[i] = st[i][w];
        keccak_f1600(one);
        for (int i = 0; i < 25; i++) st[i][w] = one[i];
    }
}

/* The lane-parallel hashes, written once for any lane count W and vector type V (the four-lane
 * AVX2 code below, the eight-lane AVX-512 code after it); PERMUTE permutes a V[25] state.
 * Lane w of every state word belongs to hash w; lanes never mix. */

/* Element-wise lane loads (any W): lanes[j][w] = word j of chunk w's big-endian byte stream, i.e.
 * bswap32(e[2j]) | bswap32(e[2j+1]) << 32; and st[k][w] = word k of the 64-byte pair at rows[w]. */
#define LOAD_LEAF_LANES(V, W, chunks, lanes)                                                     \
    for (int j = 0; j < LEAF_ELEMS / 2; j++)                                                     \
        for (int w = 0; w < (W); w++) {                                                          \
            uint32_t lo = (chunks)[w][2 * j], hi = (chunks)[w][2 * j + 1];                       \
            (lanes)[j][w] = (uint64_t)bswap_be32(lo) | ((uint64_t)bswap_be32(hi) << 32);         \
        }

#define LOAD_PAIR_LANES(V, W, rows, st)                                                          \
    for (int w = 0; w < (W); w++)                                                                \
        for (int k = 0; k < 8; k++) (st)[k][w] = load_le64((rows)[w] + 8 * k)

/* W leaves from W 128-element chunks into out (W consecutive 32-byte leaves): a leaf's 512 bytes
 * are 3 full 136-byte blocks and 104 bytes + padding in a fourth. */
#define HASH_LEAVES_LANES(V, W, PERMUTE, LOAD, chunks, out)                                      \
    do {                                                                                         \
        V lanes_[LEAF_ELEMS / 2];                                                                \
        LOAD(V, W, chunks, lanes_);                                                              \
        V st_[25];                                                                               \
        memset(st_, 0, sizeof st_);                                                              \
        const V* p_ = lanes_;                                                                    \
        for (int blk = 0; blk < 3; blk++, p_ += RATE_LANES) {                                    \
            for (int k = 0; k < RATE_LANES; k++) st_[k] ^= p_[k];                                \
            PERMUTE(st_);                                                                        \
        }                                                                                        \
        /* 64 lanes, 51 absorbed: 13 left (104 bytes), then 0x01 at byte 104 = lane 13 */        \
        for (int k = 0; k < 13; k++) st_[k] ^= p_[k];                                            \
        st_[13] ^= 0x01;                                                                         \
        st_[16] ^= 0x8000000000000000ULL;                                                        \
        PERMUTE(st_);                                                                            \
        SQUEEZE_LANES(st_, W, out);                                                              \
    } while (0)

/* out[w] = keccak256 of the 64 bytes at rows[w] (a left || right pair) for w < W. */
#define HASH_PAIRS_LANES(V, W, PERMUTE, LOAD, rows, out)                                         \
    do {                                                                                         \
        V st_[25];                                                                               \
        memset(st_, 0, sizeof st_);                                                              \
        LOAD(V, W, rows, st_);                                                                   \
        st_[8] ^= 0x01;                                                                          \
        st_[16] ^= 0x8000000000000000ULL;                                                        \
        PERMUTE(st_);                                                                            \
        SQUEEZE_LANES(st_, W, out);                                                              \
    } while (0)

/* out[w] = keccak256 of the W messages whose padded bytes (nb blocks of 136) are blocks[w]. */
#define HASH_BLOCKS_LANES(V, W, PERMUTE, blocks, nb, out)                                        \
    do {                                                                                         \
        V st_[25];                                                                               \
        memset(st_, 0, sizeof st_);                                                              \
        for (size_t b_ = 0; b_ < (nb); b_++) {                                                   \
            for (int w = 0; w < (W); w++)                                                        \
                for (int k = 0; k < RATE_LANES; k++)                                             \
                    st_[k][w] ^= load_le64((blocks)[w] + RATE_BYTES * b_ + 8 * k);               \
            PERMUTE(st_);                                                                        \
        }                                                                                        \
        SQUEEZE_LANES(st_, W, out);                                                              \
    } while (0)

#define SQUEEZE_LANES(st, W, out)                                                                \
    for (int w = 0; w < (W); w++)                                                                \
        for (int k = 0; k < 4; k++) store_le64((out) + 32 * w + 8 * k, (st)[k][w])

/* Pointers to chunks i .. i+count-1 of a tensor of n elements; a partial chunk (only the
 * tensor's last one can be) is copied, zero-padded, into pad. */
static void leaf_chunks(const uint32_t* elems, size_t n, size_t i, int count, uint32_t pad[LEAF_ELEMS],
                        const uint32_t** chunks) {
    for (int w = 0; w < count; w++) {
        size_t start = (i + (size_t)w) * LEAF_ELEMS;
        if (start + LEAF_ELEMS <= n) {
            chunks[w] = elems + start;
        } else {
            memset(pad, 0, LEAF_ELEMS * sizeof(uint32_t));
            memcpy(pad, elems + start, (n - start) * sizeof(uint32_t));
            chunks[w] = pad;
        }
    }
}

KECCAK_X4_CLONES
static void hash_leaf_x4(const uint32_t* const chunks[4], uint8_t* out) { HASH_LEAVES_LANES(u64x4, 4, permute_x4, LOAD_LEAF_LANES, chunks, out); }

KECCAK_X4_CLONES
static void hash_pairs_x4(const uint8_t* const rows[4], uint8_t* out) {
    HASH_PAIRS_LANES(u64x4, 4, permute_x4, LOAD_PAIR_LANES, rows, out);
}

KECCAK_X4_CLONES
static void hash_blocks_x4(const uint8_t* const blocks[4], size_t nb, uint8_t* out) {
    HASH_BLOCKS_LANES(u64x4, 4, permute_x4, blocks, nb, out);
}

/* Eight hashes at a time in the 64-bit lanes of a 512-bit vector: where the CPU has AVX-512F
 * with full-width units this permutes eight states in the time the 256-bit code permutes four
 * (measured 31 vs 60 ns per state on the development EPYC; ~50 vs ~60 ns on a later one, a
 * Zen 4 at ~3.7 GHz, where GCC's code, vprolq and vpternlogq for chi, runs ~1.6 512-bit
 * operations per cycle and an explicit ternary-logic theta, 90 instead of 100 operations per
 * round, measured no faster there; on an Intel Xeon it is 7% faster, see keccak_round_x8).
 * Compiled for AVX-512 only (the target attribute, no clones) and called only after a runtime
 * check; elsewhere the four-lane code runs twice. Same bytes either way: lanes never mix. */
#if defined(__x86_64__) && defined(__GNUC__)
#define KECCAK_HAVE_X8 1
#include <immintrin.h>
#define X8_TARGET __attribute__((target("avx512f,avx512vl")))
typedef uint64_t u64x8 __attribute__((vector_size(64)));

/* One round on eight states with ternary logic spelt out: theta's column parities in two
 * three-way xors a column, each lane's theta xor (A ^ C[x-1] ^ rotl(C[x+1], 1)) in one, chi in one
 * (0xD2 = a ^ (~b & c)). That is 61 logic operations and 29 rotates a round, against the 100 GCC
 * makes of KECCAK_ROUND (it keeps D[x] and xors it into each lane on its own). The round reads A
 * and writes E, a plane of chi at a time, so only five b are live at once: written as
 * KECCAK_ROUND is (all 25 b, then chi in place), GCC spilled enough registers to lose most of the
 * gain. On an Intel Xeon (whose published port tables give 512-bit logic two ports, rotates one)
 * a 128 MiB tree at one thread went from 70 to 65 ms, best of 5, three runs taking turns
 * (2026-12-03). */
#define X8_XOR3(a, b, c) _mm512_ternarylogic_epi64((a), (b), (c), 0x96)
#define X8_CHI(a, b, c) _mm512_ternarylogic_epi64((a), (b), (c), 0xD2)
#define X8_ROL(v, r) _mm512_rol_epi64((v), (r))

X8_TARGET static inline __attribute__((always_inline)) void keccak_round_x8(const __m512i A[25], __m512i E[25], uint64_t rc) {
    __m512i c[5], r[5];
    for (int x = 0; x < 5; x++) c[x] = X8_XOR3(X8_XOR3(A[x], A[x + 5], A[x + 10]), A[x + 15], A[x + 20]);
    for (int x = 0; x < 5; x++) r[x] = X8_ROL(c[x], 1);
    /* theta (A ^ D[x], D[x] = C[x-1] ^ rotl(C[x+1], 1)), then rho and pi as in KECCAK_ROUND, and
     * chi a plane at a time, so that only one plane's five b are live at once */
#define X8_T(i, x) X8_XOR3(A[i], c[((x) + 4) % 5], r[((x) + 1) % 5])
#define X8_PLANE(y, b0, b1, b2, b3, b4)                                                              \
    do {                                                                                             \
        const __m512i p0 = (b0), p1 = (b1), p2 = (b2), p3 = (b3), p4 = (b4);                         \
        E[5 * (y) + 0] = X8_CHI(p0, p1, p2);                                                         \
        E[5 * (y) + 1] = X8_CHI(p1, p2, p3);                                                         \
        E[5 * (y) + 2] = X8_CHI(p2, p3, p4);                                                         \
        E[5 * (y) + 3] = X8_CHI(p3, p4, p0);                                                         \
        E[5 * (y) + 4] = X8_CHI(p4, p0, p1);                                                         \
    } while (0)
    X8_PLANE(0, X8_T(0, 0), X8_ROL(X8_T(6, 1), 44), X8_ROL(X8_T(12, 2), 43), X8_ROL(X8_T(18, 3), 21),
             X8_ROL(X8_T(24, 4), 14));
    E[0] = _mm512_xor_si512(E[0], _mm512_set1_epi64((long long)rc));
    X8_PLANE(1, X8_ROL(X8_T(3, 3), 28), X8_ROL(X8_T(9, 4), 20), X8_ROL(X8_T(10, 0), 3), X8_ROL(X8_T(16, 1), 45),
             X8_ROL(X8_T(22, 2), 61));
    X8_PLANE(2, X8_ROL(X8_T(1, 1), 1), X8_ROL(X8_T(7, 2), 6), X8_ROL(X8_T(13, 3), 25), X8_ROL(X8_T(19, 4), 8),
             X8_ROL(X8_T(20, 0), 18));
    X8_PLANE(3, X8_ROL(X8_T(4, 4), 27), X8_ROL(X8_T(5, 0), 36), X8_ROL(X8_T(11, 1), 10), X8_ROL(X8_T(17, 2), 15),
             X8_ROL(X8_T(23, 3), 56));
    X8_PLANE(4, X8_ROL(X8_T(2, 2), 62), X8_ROL(X8_T(8, 3), 55), X8_ROL(X8_T(14, 4), 39), X8_ROL(X8_T(15, 0), 41),
             X8_ROL(X8_T(21, 1), 2));
#undef X8_PLANE
#undef X8_T
}

X8_TARGET static inline __attribute__((always_inline)) void keccak_f1600_x8(u64x8 st[25]) {
    __m512i A[25], E[25];
    memcpy(A, st, sizeof A);
    for (int round = 0; round < 24; round += 2) {
        keccak_round_x8(A, E, ROUND_CONSTANTS[round]);
        keccak_round_x8(E, A, ROUND_CONSTANTS[round + 1]);
    }
    memcpy(st, A, sizeof A);
}

/* The x8 lane loads as whole-vector moves: an 8x8 transpose of 64-bit words (the element-wise
 * loads above, one scalar insert per word, cost ~15% of a leaf's four permutations here). Row w
 * is 64 bytes of hash w's input; after the transpose, vector k holds word k of all eight. */
X8_TARGET static inline __attribute__((always_inline)) void transpose8x8_u64(__m512i r[8]) {
    const __m512i lo = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
    const __m512i hi = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    __m512i s[8], t[8];
    for (int i = 0; i < 8; i += 2) {
        s[i] = _mm512_unpacklo_epi64(r[i], r[i + 1]); /* rows i, i+1; words 0, 2, 4, 6 */
        s[i + 1] = _mm512_unpackhi_epi64(r[i], r[i + 1]); /* words 1, 3, 5, 7 */
    }
    for (int i = 0; i < 8; i += 4)
        for (int k = 0; k < 2; k++) {
            t[i + k] = _mm512_permutex2var_epi64(s[i + k], lo, s[i + k + 2]); /* words k, k+4 */
            t[i + k + 2] = _mm512_permutex2var_epi64(s[i + k], hi, s[i + k + 2]); /* k+2, k+6 */
        }
    for (int k = 0; k < 4; k++) {
        r[k] = _mm512_shuffle_i64x2(t[k], t[k + 4], 0x44); /* rows 0-3 | rows 4-7 of word k */
        r[k + 4] = _mm512_shuffle_i64x2(t[k], t[k + 4], 0xEE); /* ... of word k + 4 */
    }
}

/* bswap of every 32-bit element with AVX-512F only: bytes 0 and 2 from rol 8, 1 and 3 from rol 24
 * (ternary logic 0xCA = mask ? b : c). */
X8_TARGET static inline __attribute__((always_inline)) __m512i bswap32_x16(__m512i v) {
    return _mm512_ternarylogic_epi32(_mm512_set1_epi32(0x00FF00FF), _mm512_rol_epi32(v, 8), _mm512_rol_epi32(v, 24), 0xCA);
}

X8_TARGET static inline __attribute__((always_inline)) void load_leaf_lanes_x8(const uint32_t* const chunks[8], u64x8 lanes[LEAF_ELEMS / 2]) {
    for (int g = 0; g < LEAF_ELEMS / 16; g++) {
        __m512i r[8];
        for (int w = 0; w < 8; w++) r[w] = bswap32_x16(_mm512_loadu_si512(chunks[w] + 16 * g));
        transpose8x8_u64(r);
        for (int k = 0; k < 8; k++) lanes[8 * g + k] = (u64x8)r[k];
    }
}

X8_TARGET static inline __attribute__((always_inline)) void load_pair_lanes_x8(const uint8_t* const rows[8], u64x8 st[25]) {
    __m512i r[8];
    for (int w = 0; w < 8; w++) r[w] = _mm512_loadu_si512(rows[w]);
    transpose8x8_u64(r);
    for (int k = 0; k < 8; k++) st[k] = (u64x8)r[k];
}

#define LOAD_LEAF_LANES_X8(V, W, chunks, lanes) load_leaf_lanes_x8(chunks, lanes)
#define LOAD_PAIR_LANES_X8(V, W, rows, st) load_pair_lanes_x8(rows, st)

X8_TARGET static void hash_leaf_x8(const uint32_t* const chunks[8], uint8_t* out) {
    HASH_LEAVES_LANES(u64x8, 8, keccak_f1600_x8, LOAD_LEAF_LANES_X8, chunks, out);
}

X8_TARGET static void hash_pairs_x8(const uint8_t* const rows[8], uint8_t* out) {
    HASH_PAIRS_LANES(u64x8, 8, keccak_f1600_x8, LOAD_PAIR_LANES_X8, rows, out);
}

X8_TARGET static void hash_blocks_x8(const uint8_t* const blocks[8], size_t nb, uint8_t* out) {
    HASH_BLOCKS_LANES(u64x8, 8, keccak_f1600_x8, blocks, nb, out);
}

/* VERDE_KECCAK_LANES=4 turns the eight-lane path off (tests run the four-lane code with it). */
static int vector8_keccak_ok(void) {
    static int ok = -1;
    if (ok < 0) {
        const char* lanes = getenv("VERDE_KECCAK_LANES");
        ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             !(lanes && strcmp(lanes, "4") == 0);
    }
    return ok;
}
#else
#define KECCAK_HAVE_X8 0
#endif

/* How many hashes one vector permutation takes on this CPU: 8 (AVX-512) or 4. */
static int keccak_lanes(void) {
#if KECCAK_HAVE_X8
    if (vector8_keccak_ok()) return 8;
#endif
    return 4;
}

/* One leaf of one tensor, and where its hash goes. */
typedef struct {
    const uint32_t* elems;
    size_t n;
    size_t leaf;
    uint8_t* out;
} leaf_job_t;

/* Leaves of any tensors, a vector of them per permutation (ACROSS tensor boundaries: a step's
 * node outputs are mostly a few leaves each). A ragged end repeats its last leaf in the spare
 * lanes: one eight-lane permutation costs less than one scalar one here (~1030 vs ~1240 TSC
 * ticks), so nothing is hashed singly. */
static void hash_leaf_jobs(const leaf_job_t* jobs, size_t count) {
    uint32_t pad[8][LEAF_ELEMS];
    const uint32_t* chunks[8];
    uint8_t outs[8 * 32];
    size_t lanes = (size_t)keccak_lanes();
    for (size_t i = 0; i < count; i += lanes) {
        size_t m = count - i < lanes ? count - i : lanes;
        for (size_t w = 0; w < lanes; w++) {
            const leaf_job_t* j = &jobs[i + (w < m ? w : m - 1)];
            leaf_chunks(j->elems, j->n, j->leaf, 1, pad[w], &chunks[w]);
        }
#if KECCAK_HAVE_X8
        if (lanes == 8)
            hash_leaf_x8(chunks, outs);
        else
#endif
            hash_leaf_x4(chunks, outs);
        for (size_t w = 0; w < m; w++) memcpy(jobs[i + w].out, outs + 32 * w, 32);
    }
}

/* Leaves [i, end) of one tensor into out (leaf i at out[0]). */
static void tensor_leaves_run(const uint32_t* elems, size_t n, size_t i, size_t end, uint8_t* out) {
    leaf_job_t jobs[8];
    while (i < end) {
        size_t m = 0;
        for (; m < 8 && i < end; m++, i++, out += 32) {
            leaf_job_t j = {elems, n, i, out};
            jobs[m] = j;
        }
        hash_leaf_jobs(jobs, m);
    }
}

/* out[i] = keccak256 of message i for i < count, the messages anywhere, a vector of them per
 * permutation; a ragged end repeats its last message in the spare lanes (as hash_leaf_jobs
 * does). pairs: each message is a 64-byte left || right pair (in[i][0 .. 64)); else it is nb
 * padded 136-byte blocks at in[i]. A call reads all its inputs before it writes an output, and
 * calls go in order, so a tree level may be hashed in place as long as each output lies at or
 * before every input still to be read (node p of a level at slot p, its children at 2p and
 * 2p + 1). */
static void hash_lanes_many(const uint8_t* const* in, uint8_t* const* out, size_t count, int pairs, size_t nb) {
    const uint8_t* rows[8];
    uint8_t outs[8 * 32];
    size_t lanes = (size_t)keccak_lanes();
    for (size_t i = 0; i < count; i += lanes) {
        size_t m = count - i < lanes ? count - i : lanes;
        for (size_t w = 0; w < lanes; w++) rows[w] = in[i + (w < m ? w : m - 1)];
        int x8 = 0;
#if KECCAK_HAVE_X8
        x8 = lanes == 8;
        if (x8 && pairs) hash_pairs_x8(rows, outs);
        if (x8 && !pairs) hash_blocks_x8(rows, nb, outs);
#endif
        if (!x8 && pairs) hash_pairs_x4(rows, outs);
        if (!x8 && !pairs) hash_blocks_x4(rows, nb, outs);
        for (size_t w = 0; w < m; w++) memcpy(out[i + w], outs + 32 * w, 32);
    }
}

static void hash_pairs_ptrs(const uint8_t* const* in, uint8_t* const* out, size_t count) {
    hash_lanes_many(in, out, count, 1, 0);
}

/* One tree level in place: node p = H(buf[2p] || buf[2p+1]) for p < pairs, written at buf[p]. */
static void hash_level_run(uint8_t* buf, size_t pairs) {
    const uint8_t* in[8];
    uint8_t* out[8];
    for (size_t p = 0; p < pairs; p += 8) {
        size_t m = pairs - p < 8 ? pairs - p : 8;
        for (size_t w = 0; w < m; w++) {
            in[w] = buf + 64 * (p + w);
            out[w] = buf + 32 * (p + w);
        }
        hash_pairs_ptrs(in, out, m);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Zero subtrees and the binary-counter fold                                                   */
/* ------------------------------------------------------------------------------------------ */

static uint8_t ZERO_HASHES[MAX_LEVELS + 1][32];
static pthread_once_t ZERO_ONCE = PTHREAD_ONCE_INIT;

static void init_zero_hashes(void) {
    memset(ZERO_HASHES[0], 0, 32);
    for (int l = 0; l < MAX_LEVELS; l++) hash_pair(ZERO_HASHES[l], ZERO_HASHES[l], ZERO_HASHES[l + 1]);
}

/* Folds nodes pushed left to right at level `base` into the root of a tree `depth` levels
 * above them, ZERO-padded on the right. stack[l] holds the root of a complete run of 2^l
 * pushed nodes whenever bit l of `count` is set. */
typedef struct {
    uint8_t stack[MAX_LEVELS + 1][32];
    uint64_t count;
    int base;
    int depth;
} fold_t;

static void fold_init(fold_t* f, int base, int depth) {
    f->count = 0;
    f->base = base;
    f->depth = depth;
}

static void fold_push(fold_t* f, const uint8_t node[32]) {
    uint8_t cur[32];
    memcpy(cur, node, 32);
    int l = 0;
    while ((f->count >> l) & 1) {
        hash_pair(f->stack[l], cur, cur);
        l++;
    }
    memcpy(f->stack[l], cur, 32);
    f->count++;
}

/* Pushes the root of a complete run of 2^level nodes (count must be a multiple of 2^level):
 * the same as pushing those nodes one by one. */
static void fold_push_at(fold_t* f, const uint8_t node[32], int level) {
    uint8_t cur[32];
    memcpy(cur, node, 32);
    int l = level;
    while ((f->count >> l) & 1) {
        hash_pair(f->stack[l], cur, cur);
        l++;
    }
    memcpy(f->stack[l], cur, 32);
    f->count += (uint64_t)1 << level;
}

/* Root after all pushes (count >= 1, count <= 2^depth). */
static void fold_finish(const fold_t* f, uint8_t out[32]) {
    if (f->count == ((uint64_t)1 << f->depth)) {
        memcpy(out, f->stack[f->depth], 32);
        return;
    }
    uint8_t cur[32];
    int have = 0; /* whether `cur` is a non-ZERO partial subtree at level l */
    for (int l = 0; l < f->depth; l++) {
        const uint8_t* zero = ZERO_HASHES[f->base + l];
        if ((f->count >> l) & 1) {
            hash_pair(f->stack[l], have ? cur : zero, cur);
            have = 1;
        } else if (have) {
            hash_pair(cur, zero, cur);
        }
    }
    memcpy(out, cur, 32);
}

static int depth_for(uint64_t n) {
    int d = 0;
    while (((uint64_t)1 << d) < n) d++;
    return d;
}

/* ------------------------------------------------------------------------------------------ */
/* Threaded subtree tasks                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef struct {
    const uint32_t* elems; /* tensor source, or NULL */
    size_t n_elems;
    const uint8_t* leaves; /* ready-made leaves, or NULL */
    size_t n_leaves;
    int sub_depth; /* each task covers 2^sub_depth leaves */
    size_t n_tasks;
    uint8_t* task_roots; /* n_tasks * 32 */
    size_t next_task; /* the next task not yet claimed by a thread (atomic) */
} tree_job_t;

/* Root of the 2^log (log <= BLOCK_LOG) consecutive leaves starting at `first`: the leaves into
 * buf, then each level in place, every step a vector of hashes per permutation. */
#define BLOCK_LOG 8
#define BLOCK_LEAVES (1u << BLOCK_LOG)

static void block_root(const tree_job_t* job, size_t first, int log, uint8_t* buf, uint8_t out[32]) {
    size_t count = (size_t)1 << log;
    if (job->elems) {
        tensor_leaves_run(job->elems, job->n_elems, first, first + count, buf);
    } else {
        memcpy(buf, job->leaves + 32 * first, 32 * count);
    }
    for (; count >= 2; count /= 2) hash_level_run(buf, count / 2);
    memcpy(out, buf, 32);
}

static void run_task(const tree_job_t* job, size_t t) {
    size_t first = t << job->sub_depth;
    size_t last = first + ((size_t)1 << job->sub_depth);
    if (last > job->n_leaves) last = job->n_leaves;
    fold_t f;
    fold_init(&f, 0, job->sub_depth);
    uint8_t root[32];
    uint8_t buf[32 * BLOCK_LEAVES];
    size_t i = first;
    /* Whole blocks, then the ragged end of the last task in aligned blocks of decreasing powers
     * of two (first is a multiple of 2^sub_depth, so every block starts at a multiple of its
     * size, as fold_push_at needs): never a leaf paired on its own. */
    for (int log = BLOCK_LOG; log >= 0; log--) {
        for (; last - i >= ((size_t)1 << log) && log <= job->sub_depth; i += (size_t)1 << log) {
            block_root(job, i, log, buf, root);
            fold_push_at(&f, root, log);
        }
    }
    fold_finish(&f, job->task_roots + 32 * t);
}

static void* tree_worker(void* arg) {
    tree_job_t* job = (tree_job_t*)arg;
    /* Tasks are claimed one at a time, not dealt out in advance: on a shared machine one thread
     * may get a whole core and another a third of one, and a static split would make the call
     * wait for the slow thread's half. Which thread hashes a task never changes its root. */
    for (size_t t; (t = __atomic_fetch_add(&job->next_task, 1, __ATOMIC_RELAXED)) < job->n_tasks;) run_task(job, t);
    return NULL;
}

/* Threads started so far (keccak_threads_started): lets the tests prove that a call they
 * compare across thread counts really hashed on more than one thread. */
static size_t THREADS_STARTED;

/* Runs fn(worker i) for the `threads` workers at workers + i * stride (the caller's thread is
 * worker 0). Falls back to fewer threads if pthread_create fails: the work is assigned by index,
 * so a failed spawn is redone inline and the result never depends on how many threads ran. */
static void run_parallel(void* (*fn)(void*), void* workers, size_t stride, int threads) {
    pthread_t tids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    uint8_t* w = (uint8_t*)workers;
    for (int i = 1; i < threads; i++) {
        started[i] = pthread_create(&tids[i], NULL, fn, w + stride * (size_t)i) == 0;
        if (started[i]) __atomic_fetch_add(&THREADS_STARTED, 1, __ATOMIC_RELAXED);
    }
    fn(w);
    for (int i = 1; i < threads; i++) {
        if (started[i])
            pthread_join(tids[i], NULL);
        else
            fn(w + stride * (size_t)i);
    }
}

static int clamp_threads(int threads) {
    if (threads < 1) return 1;
    if (threads > MAX_THREADS) return MAX_THREADS;
    return threads;
}

/* A tensor of at most BLOCK_LEAVES leaves, hashed in buf (room for its leaves + 1: a level's
 * ZERO padding) down to its root. */
typedef struct {
    const uint32_t* elems;
    size_t n;
    uint8_t* buf;
    uint8_t* root;
} small_tree_t;

static size_t leaves_of(size_t n_elems) { return (n_elems + LEAF_ELEMS - 1) / LEAF_ELEMS; }

/* Roots of small trees: all their leaves hashed together (hash_leaf_jobs), then level by level
 * ACROSS trees, every level a vector of pairs per permutation; a level with an odd count is
 * completed with ZERO_l, the padding's node at that level, so each result is the ZERO-padded
 * positional root. A committed training step hashes hundreds of such tensors: paired one tree at
 * a time, a 2-leaf tree spends a whole permutation on its one pair. Returns 0, or -2 when out of
 * memory. */
static int small_trees_roots(const small_tree_t* trees, size_t n_trees) {
    size_t n_leaves = 0;
    for (size_t t = 0; t < n_trees; t++) n_leaves += leaves_of(trees[t].n);
    size_t max_pairs = n_leaves / 2 + n_trees;
    void* mem = malloc(n_leaves * sizeof(leaf_job_t) + n_trees * sizeof(size_t) + max_pairs * 2 * sizeof(void*));
    if (!mem) return -2;
    leaf_job_t* jobs = (leaf_job_t*)mem;
    size_t* count = (size_t*)(jobs + n_leaves);
    const uint8_t** in = (const uint8_t**)(count + n_trees);
    uint8_t** out = (uint8_t**)(in + max_pairs);
    size_t k = 0;
    for (size_t t = 0; t < n_trees; t++) {
        count[t] = leaves_of(trees[t].n);
        for (size_t l = 0; l < count[t]; l++) {
            leaf_job_t j = {trees[t].elems, trees[t].n, l, trees[t].buf + 32 * l};
            jobs[k++] = j;
        }
    }
    hash_leaf_jobs(jobs, k);
    for (int l = 0;; l++) {
        /* Pairs of one tree in increasing order: each output (slot p) lies before every input
         * still to be read (slots >= 2p), as hash_pairs_ptrs needs for in-place levels. */
        k = 0;
        for (size_t t = 0; t < n_trees; t++) {
            size_t c = count[t];
            if (c < 2) continue;
            uint8_t* buf = trees[t].buf;
            if (c & 1) memcpy(buf + 32 * c++, ZERO_HASHES[l], 32);
            for (size_t p = 0; p < c / 2; p++, k++) {
                in[k] = buf + 64 * p;
                out[k] = buf + 32 * p;
            }
            count[t] = c / 2;
        }
        if (k == 0) break;
        hash_pairs_ptrs(in, out, k);
    }
    for (size_t t = 0; t < n_trees; t++) memcpy(trees[t].root, trees[t].buf, 32);
    free(mem);
    return 0;
}

/* Root of the leaves padded with ZERO to 2^depth (depth < 0: the smallest that fits).
 * Returns 0 on success, -1 on bad arguments (no leaves, or more than 2^depth), -2 when out of
 * memory. */
static int tree_root(const uint32_t* elems, size_t n_elems, const uint8_t* leaves, size_t n_leaves,
                     int depth, uint8_t out[32], int threads) {
    if (n_leaves == 0) return -1;
    if (depth < 0) depth = depth_for(n_leaves);
    if (depth > MAX_LEVELS - 1 || depth < depth_for(n_leaves)) return -1;
    pthread_once(&ZERO_ONCE, init_zero_hashes);
    if (elems && n_leaves <= BLOCK_LEAVES && depth == depth_for(n_leaves)) {
        uint8_t buf[32 * (BLOCK_LEAVES + 1)];
        small_tree_t tree = {elems, n_elems, buf, out};
        return small_trees_roots(&tree, 1);
    }
    threads = clamp_threads(threads);
    /* A thread costs tens of microseconds to start: give each at least MIN_LEAVES_PER_THREAD
     * leaves (~0.3 ms of hashing) or do not start it. */
    if ((size_t)threads > n_leaves / MIN_LEAVES_PER_THREAD) threads = (int)(n_leaves / MIN_LEAVES_PER_THREAD);
    if (threads < 1) threads = 1;
    /* Subtrees of at most 2^14 leaves (2M elements), and at least ~8 tasks per thread so that
     * threads getting unequal shares of a shared machine still finish together. */
    int sub = depth < 14 ? depth : 14;
    while (sub > 0 && ((n_leaves + ((size_t)1 << sub) - 1) >> sub) < (size_t)(8 * threads)) sub--;
    if (threads == 1) sub = depth; /* one task, no top fold */
    size_t n_tasks = (n_leaves + ((size_t)1 << sub) - 1) >> sub;
    if ((size_t)threads > n_tasks) threads = (int)n_tasks;
    uint8_t* roots = (uint8_t*)malloc(32 * n_tasks);
    if (!roots) return -2;
    tree_job_t job = {elems, n_elems, leaves, n_leaves, sub, n_tasks, roots, 0};
    run_parallel(tree_worker, &job, 0, threads); /* every worker shares the one job */
    fold_t top;
    fold_init(&top, sub, depth - sub);
    for (size_t t = 0; t < n_tasks; t++) fold_push(&top, roots + 32 * t);
    fold_finish(&top, out);
    free(roots);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Public API (ctypes)                                                                          */
/* ------------------------------------------------------------------------------------------ */

size_t leaf_elems(void) { return LEAF_ELEMS; }

/* How many worker threads this library has started since it was loaded. */
size_t keccak_threads_started(void) { return __atomic_load_n(&THREADS_STARTED, __ATOMIC_RELAXED); }

/* Root of the tensor whose binary32 bit patterns are elems[0..n). */
int tensor_root(const uint32_t* elems, size_t n, uint8_t out32[32], int threads) {
    if (n == 0) return -1;
    size_t n_leaves = (n + LEAF_ELEMS - 1) / LEAF_ELEMS;
    return tree_root(elems, n, NULL, n_leaves, -1, out32, threads);
}

/* Root of a positional tree over ready-made 32-byte leaves. */
int merkle_root_from_leaves(const uint8_t* leaves, size_t n_leaves, uint8_t out32[32], int threads) {
    return tree_root(NULL, 0, leaves, n_leaves, -1, out32, threads);
}

/* Root of a subtree of height `depth` whose first n_leaves leaves are given and the rest are
 * ZERO: the sibling nodes of a Merkle proof into a padded tree. */
int merkle_subtree_root(const uint8_t* leaves, size_t n_leaves, int depth, uint8_t out32[32], int threads) {
    return tree_root(NULL, 0, leaves, n_leaves, depth, out32, threads);
}

/* ZERO_depth: the root of an all-padding subtree of height depth (0 <= depth <= 63). */
int zero_subtree_root(int depth, uint8_t out32[32]) {
    if (depth < 0 || depth > MAX_LEVELS - 1) return -1;
    pthread_once(&ZERO_ONCE, init_zero_hashes);
    memcpy(out32, ZERO_HASHES[depth], 32);
    return 0;
}

typedef struct {
    const uint32_t* elems;
    size_t n;
    size_t n_leaves;
    uint8_t* out;
    int threads;
    int index;
} leaves_worker_t;

static void* leaves_worker(void* arg) {
    leaves_worker_t* w = (leaves_worker_t*)arg;
    /* Contiguous slices: each thread streams its own part of the tensor. */
    size_t per = (w->n_leaves + (size_t)w->threads - 1) / (size_t)w->threads;
    size_t first = per * (size_t)w->index;
    size_t last = first + per < w->n_leaves ? first + per : w->n_leaves;
    if (first < last) tensor_leaves_run(w->elems, w->n, first, last, w->out + 32 * first);
    return NULL;
}

/* All leaves of the tensor into out_leaves[0 .. 32 * ceil(n / 128)). */
int tensor_leaves(const uint32_t* elems, size_t n, uint8_t* out_leaves, int threads) {
    if (n == 0) return -1;
    threads = clamp_threads(threads);
    size_t n_leaves = (n + LEAF_ELEMS - 1) / LEAF_ELEMS;
    if ((size_t)threads > n_leaves / MIN_LEAVES_PER_THREAD) threads = (int)(n_leaves / MIN_LEAVES_PER_THREAD);
    if (threads < 1) threads = 1;
    leaves_worker_t w[MAX_THREADS];
    for (int i = 0; i < threads; i++) {
        leaves_worker_t wi = {elems, n, n_leaves, out_leaves, threads, i};
        w[i] = wi;
    }
    run_parallel(leaves_worker, w, sizeof w[0], threads);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* One committed training step in two calls (verde_chain/graph/executor.py run_step)           */
/* ------------------------------------------------------------------------------------------ */

/* Tensors that roots_begin has cut into more than one subtree task since the library was
 * loaded (keccak_trees_split): tests prove with it that their sizes took the split path. */
static size_t TREES_SPLIT;

size_t keccak_trees_split(void) { return __atomic_load_n(&TREES_SPLIT, __ATOMIC_RELAXED); }

/* The work of one tensor_roots call as one list of items: the subtree tasks of every tree of
 * more than BLOCK_LEAVES leaves (items [0, n_tasks): tree k's tasks are [task_start[k],
 * task_start[k + 1])), then the groups of small trees (items n_tasks + g). Items are claimed
 * from one counter, so the threads finish together once per call, not once per big tensor. */
typedef struct {
    tree_job_t* big;
    size_t n_big;
    const size_t* task_start; /* n_big + 1 */
    size_t n_tasks;
    const small_tree_t* small;
    const size_t* group_start; /* group g = small trees [group_start[g], group_start[g + 1]) */
    size_t n_groups;
    size_t next; /* the next item not yet claimed (atomic; the pthread workers) */
    int rc;
} roots_job_t;

static void roots_item(roots_job_t* job, size_t i) {
    if (i < job->n_tasks) {
        size_t lo = 0, hi = job->n_big; /* the tree whose tasks hold i: task_start[lo] <= i < task_start[lo + 1] */
        while (hi - lo > 1) {
            size_t mid = (lo + hi) / 2;
            if (job->task_start[mid] <= i)
                lo = mid;
            else
                hi = mid;
        }
        run_task(&job->big[lo], i - job->task_start[lo]);
        return;
    }
    size_t g = i - job->n_tasks;
    int rc = small_trees_roots(job->small + job->group_start[g], job->group_start[g + 1] - job->group_start[g]);
    if (rc) __atomic_store_n(&job->rc, rc, __ATOMIC_RELAXED);
}

static void* roots_worker(void* arg) {
    roots_job_t* job = (roots_job_t*)arg;
    size_t n_items = job->n_tasks + job->n_groups;
    /* claimed one at a time, as tree_worker claims tasks */
    for (size_t i; (i = __atomic_fetch_add(&job->next, 1, __ATOMIC_RELAXED)) < n_items;) roots_item(job, i);
    return NULL;
}

/* A tensor_roots call taken apart (roots_begin, roots_run_item, roots_end), for callers that
 * run its items on their own threads and at their own pace: the RepOps whole-step plan hashes
 * at its hash points on its persistent pool, and a level's outputs in the pool's idle time
 * while later levels run (kernels/cpu/step_plan.cpp: pool_roots, IdleHashing). The job and
 * every buffer its items write are owned here; roots_end folds the big trees' task roots on top
 * and frees them. */
typedef struct roots_work {
    roots_job_t job;
    size_t n_items;
    int threads; /* the threads the items were sized for (min_leaves each) */
    uint8_t* buf;
    small_tree_t* trees;
    size_t* group_start;
    tree_job_t* big;
    size_t* task_start;
    int* depth;
    uint8_t* task_roots;
    const size_t* numels; /* the caller's, read again by roots_end */
    size_t n;
    uint8_t* roots;
} roots_work_t;

static void roots_free(roots_work_t* w) {
    if (!w) return;
    free(w->buf);
    free(w->trees);
    free(w->group_start);
    free(w->big);
    free(w->task_start);
    free(w->depth);
    free(w->task_roots);
    free(w);
}

/* The items of the roots of n tensors: tensor i is elems[i][0 .. numels[i]) (>= 1 element each),
 * its root to roots[32 i] (written by roots_end). Items are sized for `threads` threads, each given
 * min_leaves leaves at least (fewer threads otherwise), and, when max_item_log > 0, none holds
 * more than 2^max_item_log leaves (a small-tree group may still hold min(min_leaves, 512) leaves):
 * a thread that runs items between other work can then leave it for that work within one item.
 * elems and numels must stay valid until roots_end. *rc: 0, -1 on an empty tensor, -2 when out of
 * memory (then NULL is returned). */
roots_work_t* roots_begin(const uint32_t* const* elems, const size_t* numels, size_t n, uint8_t* roots, int threads,
                          size_t min_leaves, int max_item_log, int* rc) {
    size_t n_small = 0, slots = 0, n_big = 0, small_leaves = 0, all_leaves = 0;
    *rc = -1;
    for (size_t i = 0; i < n; i++) {
        if (numels[i] == 0) return NULL;
        size_t nl = leaves_of(numels[i]);
        all_leaves += nl;
        if (nl <= BLOCK_LEAVES) {
            n_small++;
            slots += nl + 1; /* room for a level's ZERO padding */
            small_leaves += nl;
        } else {
            n_big++;
        }
    }
    *rc = -2;
    pthread_once(&ZERO_ONCE, init_zero_hashes);
    threads = clamp_threads(threads);
    if (min_leaves < 1) min_leaves = 1;
    if ((size_t)threads > all_leaves / min_leaves) threads = (int)(all_leaves / min_leaves);
    if (threads < 1) threads = 1;
    roots_work_t* w = (roots_work_t*)calloc(1, sizeof(roots_work_t));
    if (!w) return NULL;
    w->numels = numels;
    w->n = n;
    w->roots = roots;
    w->buf = (uint8_t*)malloc(32 * (slots ? slots : 1));
    w->trees = (small_tree_t*)malloc(sizeof(small_tree_t) * (n_small ? n_small : 1));
    w->group_start = (size_t*)malloc(sizeof(size_t) * (n_small + 1));
    w->big = (tree_job_t*)malloc(sizeof(tree_job_t) * (n_big ? n_big : 1));
    w->task_start = (size_t*)malloc(sizeof(size_t) * (n_big + 1));
    w->depth = (int*)malloc(sizeof(int) * (n_big ? n_big : 1));
    if (!w->buf || !w->trees || !w->group_start || !w->big || !w->task_start || !w->depth) {
        roots_free(w);
        return NULL;
    }
    /* Small trees in groups of whole trees, ~8 per thread (min_leaves leaves at least, and
     * 2 * BLOCK_LEAVES where that is less: a group fills the vector lanes many times). */
    size_t goal = small_leaves / (8 * (size_t)threads);
    size_t floor_ = min_leaves < 2 * BLOCK_LEAVES ? min_leaves : 2 * BLOCK_LEAVES;
    if (threads == 1 || goal < floor_) goal = threads == 1 ? small_leaves : floor_;
    if (max_item_log > 0 && goal > ((size_t)1 << max_item_log))
        goal = ((size_t)1 << max_item_log) > floor_ ? ((size_t)1 << max_item_log) : floor_;
    size_t k = 0, off = 0, n_groups = 0, run = 0;
    w->group_start[0] = 0;
    for (size_t i = 0; i < n; i++) {
        size_t nl = leaves_of(numels[i]);
        if (nl > BLOCK_LEAVES) continue;
        small_tree_t t = {elems[i], numels[i], w->buf + 32 * off, roots + 32 * i};
        w->trees[k++] = t;
        off += nl + 1;
        run += nl;
        if (run >= goal || k == n_small) {
            w->group_start[++n_groups] = k;
            run = 0;
        }
    }
    /* Big trees: subtrees of at most 2^14 leaves (as tree_root), smaller (down to one block)
     * until all the items come to ~8 per thread; one task per tree on one thread; and never
     * more than 2^max_item_log leaves when that is set. */
    int cap = 14, least = BLOCK_LOG;
    if (max_item_log > 0 && max_item_log < cap) cap = max_item_log;
    if (max_item_log > 0 && max_item_log < least) least = max_item_log;
    const int one_task = threads == 1 && max_item_log <= 0;
    size_t n_tasks = 0;
    for (;; cap--) {
        n_tasks = 0;
        for (size_t b = 0, i = 0; i < n; i++) {
            size_t nl = leaves_of(numels[i]);
            if (nl <= BLOCK_LEAVES) continue;
            w->depth[b] = depth_for(nl);
            int sub = one_task ? w->depth[b] : w->depth[b] < cap ? w->depth[b] : cap;
            n_tasks += (nl + ((size_t)1 << sub) - 1) >> sub;
            b++;
        }
        if (one_task || cap <= least || n_tasks + n_groups >= 8 * (size_t)threads) break;
    }
    w->task_roots = (uint8_t*)malloc(32 * (n_tasks ? n_tasks : 1));
    if (!w->task_roots) {
        roots_free(w);
        return NULL;
    }
    w->task_start[0] = 0;
    for (size_t b = 0, i = 0; i < n; i++) {
        size_t nl = leaves_of(numels[i]);
        if (nl <= BLOCK_LEAVES) continue;
        int sub = one_task ? w->depth[b] : w->depth[b] < cap ? w->depth[b] : cap;
        size_t tasks = (nl + ((size_t)1 << sub) - 1) >> sub;
        tree_job_t job = {elems[i], numels[i], NULL, nl, sub, tasks, w->task_roots + 32 * w->task_start[b], 0};
        w->big[b] = job;
        w->task_start[b + 1] = w->task_start[b] + tasks;
        if (tasks > 1) __atomic_fetch_add(&TREES_SPLIT, 1, __ATOMIC_RELAXED);
        b++;
    }
    roots_job_t job = {w->big, n_big, w->task_start, n_tasks, w->trees, w->group_start, n_groups, 0, 0};
    w->job = job;
    w->n_items = n_tasks + n_groups;
    w->threads = threads;
    *rc = 0;
    return w;
}

/* How many items roots_begin cut the work into; each must run once (roots_run_item, on any
 * thread, in any order) before roots_end. */
int64_t roots_items(const roots_work_t* w) { return (int64_t)w->n_items; }

/* How many threads roots_begin sized the items for (>= 1; fewer than asked when the tensors
 * hold fewer than min_leaves leaves per thread): more would wake threads for nothing. */
int roots_threads(const roots_work_t* w) { return w->threads; }

void roots_run_item(roots_work_t* w, int64_t item) { roots_item(&w->job, (size_t)item); }

/* After every item ran: each big tree's task roots folded on top, as tree_root does (ZERO_{sub + l}
 * padding), into the caller's roots; frees the work. Returns 0, or -2 when an item ran out of
 * memory. */
int roots_end(roots_work_t* w) {
    int rc = __atomic_load_n(&w->job.rc, __ATOMIC_RELAXED);
    for (size_t b = 0, i = 0; i < w->n && rc == 0; i++) {
        if (leaves_of(w->numels[i]) <= BLOCK_LEAVES) continue;
        fold_t top;
        fold_init(&top, w->big[b].sub_depth, w->depth[b] - w->big[b].sub_depth);
        for (size_t r = 0; r < w->big[b].n_tasks; r++) fold_push(&top, w->big[b].task_roots + 32 * r);
        fold_finish(&top, w->roots + 32 * i);
        b++;
    }
    roots_free(w);
    return rc;
}

/* The calls above by address, and the leaf size, for code that reaches this library through one
 * pointer (the RepOps extension gets it from repops/backends/cpu/step.py: roots_api). */
typedef struct {
    roots_work_t* (*begin)(const uint32_t* const*, const size_t*, size_t, uint8_t*, int, size_t, int, int*);
    int64_t (*items)(const roots_work_t*);
    int (*threads)(const roots_work_t*);
    void (*run_item)(roots_work_t*, int64_t);
    int (*end)(roots_work_t*);
    size_t leaf_elems;
} keccak_roots_api_t;

static const keccak_roots_api_t ROOTS_API = {roots_begin, roots_items, roots_threads, roots_run_item, roots_end, LEAF_ELEMS};

const keccak_roots_api_t* keccak_roots_api(void) { return &ROOTS_API; }

/* Roots of n tensors: tensor i is elems[i][0 .. numels[i]) (>= 1 element each) -> roots[32 i],
 * on up to `threads` threads, each given MIN_LEAVES_PER_THREAD leaves at least (fewer threads
 * otherwise), started per call.
 * A step commits every node output, most of them a few thousand elements: one call for all of
 * them saves the per-call cost that dominated small tensors. Trees of at most BLOCK_LEAVES
 * leaves are hashed together in groups (small_trees_roots: leaves and levels across tensors);
 * larger ones are cut into subtree tasks as tensor_root cuts one tensor (same tasks, same top
 * fold, so the same roots), and the tasks of all of them and the groups are one list of items
 * that the threads share out, the big tensors' tasks first. Before, the larger trees went one
 * by one through tensor_root, starting and joining its threads per tensor, and one of fewer than
 * 2 * MIN_LEAVES_PER_THREAD leaves ran on one thread while the others waited. Returns 0, -1 on
 * an empty tensor, -2 when out of memory. */
int tensor_roots(const uint32_t* const* elems, const size_t* numels, size_t n, uint8_t* roots, int threads) {
    int rc = 0;
    roots_work_t* w = roots_begin(elems, numels, n, roots, threads, MIN_LEAVES_PER_THREAD, 0, &rc);
    if (!w) return rc;
    size_t n_items = w->n_items;
    int t = (size_t)w->threads < n_items ? w->threads : (int)n_items;
    if (t <= 1) {
        for (size_t i = 0; i < n_items; i++) roots_item(&w->job, i);
    } else {
        run_parallel(roots_worker, &w->job, 0, t); /* every worker shares the one job */
    }
    return roots_end(w);
}

static void put_word(uint8_t* p, uint64_t x) {
    memset(p, 0, 24);
    for (int i = 0; i < 8; i++) p[24 + i] = (uint8_t)(x >> (56 - 8 * i));
}

/* The Keccak padding of a len-byte message in buf (room for blocks_for(len) blocks, zeroed
 * after the message by the caller). */
static size_t blocks_for(size_t len) { return len / RATE_BYTES + 1; }

static void pad_message(uint8_t* buf, size_t len) {
    buf[len] ^= 0x01;
    buf[RATE_BYTES * blocks_for(len) - 1] ^= 0x80;
}

/* Node hashes of one step; twin of node_hash in verde_chain/commit/tensor.py:
 *   hash_d = keccak256(abi.encode(uint256 d, bytes32 desc_d, bytes32[] ins_d, bytes32[] [table_d]))
 * ins_d = table[idx[start[d]]] .. table[idx[start[d + 1] - 1]]. Rows 0 .. n_nodes-1 of the table
 * are the step's output roots; the caller appends the other roots inputs name (the previous
 * state's, the batch's). The messages are built padded and hashed a vector of them per
 * permutation, nodes of the same block count together (one at a time, a step's ~400 node
 * hashes cost ~0.4 ms on the tiny Llama). Returns 0, -1 on a bad index or range, -2 when out of
 * memory. */
int node_hashes(const uint8_t* table, size_t n_table, const uint8_t* desc, const int64_t* start, const int64_t* idx,
                size_t n_nodes, uint8_t* out) {
    if (n_nodes > n_table || start[0] != 0) return -1;
    size_t max_nb = 1;
    for (size_t d = 0; d < n_nodes; d++) {
        if (start[d + 1] < start[d]) return -1;
        size_t nb = blocks_for(224 + 32 * (size_t)(start[d + 1] - start[d]));
        if (nb > max_nb) max_nb = nb;
        for (int64_t k = start[d]; k < start[d + 1]; k++)
            if (idx[k] < 0 || (size_t)idx[k] >= n_table) return -1;
    }
    /* per block count: its nodes' message offsets in msgs (a counting sort by block count) */
    size_t* first = (size_t*)calloc(max_nb + 2, sizeof(size_t));
    const uint8_t** ptrs = (const uint8_t**)malloc((n_nodes ? n_nodes : 1) * sizeof(void*));
    uint8_t** outs = (uint8_t**)malloc((n_nodes ? n_nodes : 1) * sizeof(void*));
    size_t total = 0;
    for (size_t d = 0; d < n_nodes; d++) total += RATE_BYTES * blocks_for(224 + 32 * (size_t)(start[d + 1] - start[d]));
    uint8_t* msgs = (uint8_t*)calloc(total ? total : 1, 1);
    if (!first || !ptrs || !outs || !msgs) {
        free(first);
        free(ptrs);
        free(outs);
        free(msgs);
        return -2;
    }
    for (size_t d = 0; d < n_nodes; d++) first[blocks_for(224 + 32 * (size_t)(start[d + 1] - start[d])) + 1]++;
    for (size_t nb = 1; nb <= max_nb; nb++) first[nb + 1] += first[nb];
    size_t* fill = (size_t*)malloc((max_nb + 2) * sizeof(size_t));
    if (!fill) {
        free(first);
        free(ptrs);
        free(outs);
        free(msgs);
        return -2;
    }
    memcpy(fill, first, (max_nb + 2) * sizeof(size_t));
    uint8_t* buf = msgs;
    for (size_t d = 0; d < n_nodes; d++) {
        size_t n_in = (size_t)(start[d + 1] - start[d]);
        size_t len = 224 + 32 * n_in;
        /* head: index, descriptor hash, offsets of the two dynamic arrays */
        put_word(buf, d);
        memcpy(buf + 32, desc + 32 * d, 32);
        put_word(buf + 64, 4 * 32);
        put_word(buf + 96, 4 * 32 + 32 * (1 + n_in));
        put_word(buf + 128, n_in);
        uint8_t* p = buf + 160;
        for (size_t j = 0; j < n_in; j++, p += 32) memcpy(p, table + 32 * (size_t)idx[start[d] + (int64_t)j], 32);
        put_word(p, 1);
        memcpy(p + 32, table + 32 * d, 32);
        pad_message(buf, len);
        size_t slot = fill[blocks_for(len)]++;
        ptrs[slot] = buf;
        outs[slot] = out + 32 * d;
        buf += RATE_BYTES * blocks_for(len);
    }
    for (size_t nb = 1; nb <= max_nb; nb++) hash_lanes_many(ptrs + first[nb], outs + first[nb], first[nb + 1] - first[nb], 0, nb);
    free(fill);
    free(first);
    free(ptrs);
    free(outs);
    free(msgs);
    return 0;
}

/* out[32 i] = keccak256(msgs[len * i .. len * (i + 1))) for i < n: many short messages of one
 * length in one call (the batch schedule hashes one 48-byte key per sample and epoch). */
void keccak256_many(const uint8_t* msgs, size_t len, size_t n, uint8_t* out) {
    size_t i = 0;
    if (len < RATE_BYTES) { /* one padded block each: eight (or four) messages per permutation */
        uint8_t pad[8][RATE_BYTES];
        const uint8_t* blocks[8];
        uint8_t* outs[8];
        for (; i < n; i += 8) {
            size_t m = n - i < 8 ? n - i : 8;
            for (size_t w = 0; w < m; w++) {
                memset(pad[w], 0, RATE_BYTES);
                memcpy(pad[w], msgs + len * (i + w), len);
                pad_message(pad[w], len);
                blocks[w] = pad[w];
                outs[w] = out + 32 * (i + w);
            }
            hash_lanes_many(blocks, outs, m, 0, 1);
        }
    }
    for (; i < n; i++) keccak256(msgs + len * i, len, out + 32 * i);
}
