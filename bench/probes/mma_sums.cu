// Do Hopper's tensor-core instructions sum alike? A probe, run once on the H200 (results in
// docs/perf-history.md): the same bf16 A [64, K] and B [N, K] (both K-major), D = A B^T in fp32,
// chained over K in k16 steps, through
//   wgmma m64nNk16 for N = 8 .. 256 (A, B from 128-byte-swizzled shared memory), and the roles
//   swapped (B as the 64-row operand), and
//   mma.sync m16n8k16 from registers with the k slots of each step mapped five ways.
// It prints, for each pair, how many of the 64 x N outputs differ in their bits.
// Build: nvcc -gencode=arch=compute_90a,code=sm_90a -O2 -o mma_sums mma_sums.cu
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>
#include <cmath>
typedef __nv_bfloat16 bf16;
#include "wgmma_gen.cuh"

#define K 256
#define NMAX 256
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

// Byte offset of element (row, k) in a K-major tile of 64-element rows, 128-byte swizzle
// (16-byte chunk c of row r sits at chunk c ^ (r % 8)): what TMA's SWIZZLE_128B writes.
__device__ __forceinline__ int sw128(int row, int k) {
    return row * 128 + ((((k * 2) >> 4) ^ (row & 7)) << 4) + ((k * 2) & 15);
}
__device__ __forceinline__ uint64_t desc_sw128(const void *smem) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    uint64_t d = 0;
    d |= (uint64_t)((a & 0x3FFFF) >> 4);
    d |= (uint64_t)1 << 16;             // leading byte offset (unused for swizzled K-major)
    d |= (uint64_t)(1024 >> 4) << 32;   // stride byte offset: 8 rows of 128 bytes
    d |= (uint64_t)1 << 62;             // 128-byte swizzle
    return d;
}

// One warpgroup: D[64, N] (or D^T when swap) over all K. Shared: A tiles then B tiles, each
// K-tile of 64 elements a (rows x 128 bytes) block.
template <int N>
__global__ void wg(const bf16 *A, const bf16 *B, float *D, int swap) {
    extern __shared__ __align__(1024) char sm[];
    char *As = sm, *Bs = sm + (K / 64) * 64 * 128;
    for (int i = threadIdx.x; i < 64 * K; i += blockDim.x) {
        const int r = i / K, k = i % K;
        *reinterpret_cast<bf16 *>(As + (k / 64) * 64 * 128 + sw128(r, k % 64)) = A[i];
    }
    for (int i = threadIdx.x; i < N * K; i += blockDim.x) {
        const int r = i / K, k = i % K;
        *reinterpret_cast<bf16 *>(Bs + (k / 64) * N * 128 + sw128(r, k % 64)) = B[i];
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    float d[N / 2];
    for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    for (int s = 0; s < K / 16; ++s) {
        const int kt = s / 4, kk = s % 4;
        // operand 1 (64 rows) and operand 2 (N rows)
        const char *p64 = swap ? Bs + kt * N * 128 : As + kt * 64 * 128;
        const char *pN = swap ? As + kt * 64 * 128 : Bs + kt * N * 128;
        if constexpr (N == 8) wgmma_n8(d, desc_sw128(p64 + kk * 32), desc_sw128(pN + kk * 32), s > 0);
        if constexpr (N == 16) wgmma_n16(d, desc_sw128(p64 + kk * 32), desc_sw128(pN + kk * 32), s > 0);
        if constexpr (N == 64) wgmma_n64(d, desc_sw128(p64 + kk * 32), desc_sw128(pN + kk * 32), s > 0);
        if constexpr (N == 128) wgmma_n128(d, desc_sw128(p64 + kk * 32), desc_sw128(pN + kk * 32), s > 0);
        if constexpr (N == 256) wgmma_n256(d, desc_sw128(p64 + kk * 32), desc_sw128(pN + kk * 32), s > 0);
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int j = 0; j < N / 8; ++j)
        for (int i = 0; i < 4; ++i) {
            const int r = 16 * warp + g + (i >= 2 ? 8 : 0), c = 8 * j + 2 * t + (i & 1);
            // D is [64 rows of A, N rows of B]: with swap, r indexes B (only N=64 here) and c A
            if (swap) D[c * 64 + r] = d[j * 4 + i];
            else D[r * N + c] = d[j * 4 + i];
        }
}

// k index of slot j (0..15) of step s under mapping `mode`; A and B use the same mapping.
__device__ int kmap(int mode, int s, int j) {
    switch (mode) {
    case 0: return 16 * s + j;                                     // natural
    case 1: return 16 * s + (j ^ 8);                               // halves swapped
    case 2: return 16 * s + (j & 8) + ((j & 7) ^ 2);               // word pairs swapped in a half
    case 3: {                                                      // the gemv's sets of 4
        const int c = s / 2, h = s % 2, sp = j / 2;
        const int word = 4 * (sp % 4) + 2 * h + sp / 4;
        return 32 * c + 2 * word + (j & 1);
    }
    default: return 16 * s + ((j & 1) << 3) + (j >> 1);            // slots interleaved
    }
}
__device__ unsigned pk(const bf16 *row, int k0, int k1) {
    unsigned short a = *reinterpret_cast<const unsigned short *>(row + k0);
    unsigned short b = *reinterpret_cast<const unsigned short *>(row + k1);
    return (unsigned)a | ((unsigned)b << 16);
}
// One warp a 16 x 8 tile of D[64, N]; grid (N / 8, 4).
__global__ void ms(const bf16 *A, const bf16 *B, float *D, int N, int mode) {
    const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
    const int r0 = 16 * blockIdx.y, c0 = 8 * blockIdx.x;
    const bf16 *a0 = A + (size_t)(r0 + g) * K, *a1 = A + (size_t)(r0 + g + 8) * K, *b = B + (size_t)(c0 + g) * K;
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    for (int s = 0; s < K / 16; ++s) {
        const int j0 = 2 * t, j1 = 2 * t + 8;
        const unsigned x0 = pk(a0, kmap(mode, s, j0), kmap(mode, s, j0 + 1));
        const unsigned x1 = pk(a1, kmap(mode, s, j0), kmap(mode, s, j0 + 1));
        const unsigned x2 = pk(a0, kmap(mode, s, j1), kmap(mode, s, j1 + 1));
        const unsigned x3 = pk(a1, kmap(mode, s, j1), kmap(mode, s, j1 + 1));
        const unsigned y0 = pk(b, kmap(mode, s, j0), kmap(mode, s, j0 + 1));
        const unsigned y1 = pk(b, kmap(mode, s, j1), kmap(mode, s, j1 + 1));
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(x0), "r"(x1), "r"(x2), "r"(x3), "r"(y0), "r"(y1));
    }
    D[(r0 + g) * N + c0 + 2 * t] = c[0];
    D[(r0 + g) * N + c0 + 2 * t + 1] = c[1];
    D[(r0 + g + 8) * N + c0 + 2 * t] = c[2];
    D[(r0 + g + 8) * N + c0 + 2 * t + 1] = c[3];
}

static uint64_t st = 88172645463325252ull;
static double urand() { st ^= st << 13; st ^= st >> 7; st ^= st << 17; return (st >> 11) * (1.0 / 9007199254740992.0); }

template <int N>
static int run_wg(const bf16 *dA, const bf16 *dB, float *dD, int swap, std::vector<float> &out) {
    const int smem = (K / 64) * (64 + N) * 128;
    CK(cudaFuncSetAttribute(wg<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    wg<N><<<1, 128, smem>>>(dA, dB, dD, swap);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    out.resize(64 * N);
    CK(cudaMemcpy(out.data(), dD, 64 * N * 4, cudaMemcpyDeviceToHost));
    return 0;
}
// differing outputs between a [64, Na] and a [64, Nb] result over the first min(Na, Nb) columns
static int diff(const std::vector<float> &a, int Na, const std::vector<float> &b, int Nb) {
    int n = 0, N = Na < Nb ? Na : Nb;
    for (int r = 0; r < 64; ++r)
        for (int c = 0; c < N; ++c) n += memcmp(&a[r * Na + c], &b[r * Nb + c], 4) != 0;
    return n;
}

int main() {
    for (int trial = 0; trial < 3; ++trial) {
        std::vector<bf16> A(64 * K), B(NMAX * K);
        // wide exponents and mixed signs: sums that cancel and round
        auto draw = [&](int scale) {
            const double u = urand() * 2 - 1, e = std::floor(urand() * (2 * scale + 1)) - scale;
            return __float2bfloat16((float)(u * std::ldexp(1.0, (int)e)));
        };
        const int sc = trial == 0 ? 0 : trial == 1 ? 6 : 12;
        for (auto &v : A) v = draw(sc);
        for (auto &v : B) v = draw(sc);
        bf16 *dA, *dB;
        float *dD;
        CK(cudaMalloc(&dA, A.size() * 2));
        CK(cudaMalloc(&dB, B.size() * 2));
        CK(cudaMalloc(&dD, 64 * NMAX * 4 * 4));
        CK(cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dB, B.data(), B.size() * 2, cudaMemcpyHostToDevice));
        std::vector<float> w8, w16, w64, w128, w256, w64s, m[5];
        if (run_wg<8>(dA, dB, dD, 0, w8) || run_wg<16>(dA, dB, dD, 0, w16) || run_wg<64>(dA, dB, dD, 0, w64) ||
            run_wg<128>(dA, dB, dD, 0, w128) || run_wg<256>(dA, dB, dD, 0, w256) || run_wg<64>(dA, dB, dD, 1, w64s))
            return 1;
        for (int mode = 0; mode < 5; ++mode) {
            ms<<<dim3(NMAX / 8, 4), 32>>>(dA, dB, dD, NMAX, mode);
            CK(cudaDeviceSynchronize());
            m[mode].resize(64 * NMAX);
            CK(cudaMemcpy(m[mode].data(), dD, 64 * NMAX * 4, cudaMemcpyDeviceToHost));
        }
        // fp64 reference: how far each is (to see the probe computes a product at all)
        double err = 0, ref2 = 0;
        for (int r = 0; r < 64; ++r)
            for (int c = 0; c < 64; ++c) {
                double s = 0;
                for (int k = 0; k < K; ++k) s += (double)__bfloat162float(A[r * K + k]) * __bfloat162float(B[c * K + k]);
                err += (s - w256[r * 256 + c]) * (s - w256[r * 256 + c]);
                ref2 += s * s;
            }
        printf("trial %d (exponent spread +-%d), rel err of wgmma n256 vs fp64: %.2e (64x64 outputs)\n", trial, sc,
               std::sqrt(err / ref2));
        printf("  wgmma n8 vs n256: %d of %d differ\n", diff(w8, 8, w256, 256), 64 * 8);
        printf("  wgmma n16 vs n256: %d of %d\n", diff(w16, 16, w256, 256), 64 * 16);
        printf("  wgmma n64 vs n256: %d of %d\n", diff(w64, 64, w256, 256), 64 * 64);
        printf("  wgmma n128 vs n256: %d of %d\n", diff(w128, 128, w256, 256), 64 * 128);
        printf("  wgmma n64 roles swapped vs n256: %d of %d\n", diff(w64s, 64, w256, 256), 64 * 64);
        printf("  mma.sync natural vs wgmma n256: %d of %d\n", diff(m[0], 256, w256, 256), 64 * 256);
        printf("  mma.sync halves swapped vs natural: %d of %d\n", diff(m[1], 256, m[0], 256), 64 * 256);
        printf("  mma.sync pairs swapped in a half vs natural: %d of %d\n", diff(m[2], 256, m[0], 256), 64 * 256);
        printf("  mma.sync slots interleaved vs natural: %d of %d\n", diff(m[4], 256, m[0], 256), 64 * 256);
        printf("  mma.sync gemv sets vs natural: %d of %d\n", diff(m[3], 256, m[0], 256), 64 * 256);
        cudaFree(dA);
        cudaFree(dB);
        cudaFree(dD);
    }
    return 0;
}
