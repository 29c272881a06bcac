// A host stand-in for models/common/cuda/common.cuh, enough of it to compile kda_tc.cu with g++
// and run its blocks on CPU threads (kda_tc_emu.cpp): a block's threads are std::threads, a
// warp's shuffles and mma.sync meet through per-warp buffers and barriers. The mma's sum is
// taken as kda_tc_model.py takes it (the exact products and the accumulator added in double,
// rounded once to f32), so the emulated kernel and the model differ only where expf and fma's
// last bits do. Only for the CPU test of the kernel's indexing (test_kda_tc_emulated.py).
#pragma once
#include "host.h"

extern thread_local Dim3 threadIdx;
extern Dim3 blockIdx, blockDim;

inline float __bfloat162float(bf16 v) {
    uint32_t u = (uint32_t)v.bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline bf16 __float2bfloat16_rn(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return bf16{(uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
}
inline float to_f(bf16 v) { return __bfloat162float(v); }
inline bf16 to_bf(float v) { return __float2bfloat16_rn(v); }
inline float rbf(float v) { return to_f(to_bf(v)); }
inline unsigned pack_bf2(float lo, float hi) {
    return (unsigned)to_bf(lo).bits | ((unsigned)to_bf(hi).bits << 16);
}

inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }

// the emulator's block: a barrier for the block, one a warp, and the warps' exchange buffers
struct EmuBlock {
    std::barrier<> *block;
    std::barrier<> *warp[32];
    float f[32][32];
    unsigned a[32][32][4], b[32][32][2];
};
extern EmuBlock *emu;

inline void __syncthreads() { emu->block->arrive_and_wait(); }
inline void __syncwarp() { emu->warp[threadIdx.x >> 5]->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    emu->f[w][l] = v;
    __syncwarp();
    const float r = emu->f[w][l ^ o];
    __syncwarp();
    return r;
}

inline float __shfl_sync(unsigned, float v, int src) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    emu->f[w][l] = v;
    __syncwarp();
    const float r = emu->f[w][src & 31];
    __syncwarp();
    return r;
}

inline float bf_lo(unsigned r) { return to_f(bf16{(uint16_t)(r & 0xFFFF)}); }
inline float bf_hi(unsigned r) { return to_f(bf16{(uint16_t)(r >> 16)}); }

// c[16 x 8] += A[16 x 16] B[16 x 8], the PTX fragments of mma.sync.m16n8k16.row.col
inline void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    for (int i = 0; i < 4; ++i) emu->a[w][l][i] = a[i];
    emu->b[w][l][0] = b0;
    emu->b[w][l][1] = b1;
    __syncwarp();
    double A[16][16], B[16][8];
    for (int t = 0; t < 32; ++t) {
        const int g = t >> 2, q = t & 3;
        const unsigned *ra = emu->a[w][t], *rb = emu->b[w][t];
        A[g][2 * q] = bf_lo(ra[0]), A[g][2 * q + 1] = bf_hi(ra[0]);
        A[g + 8][2 * q] = bf_lo(ra[1]), A[g + 8][2 * q + 1] = bf_hi(ra[1]);
        A[g][2 * q + 8] = bf_lo(ra[2]), A[g][2 * q + 9] = bf_hi(ra[2]);
        A[g + 8][2 * q + 8] = bf_lo(ra[3]), A[g + 8][2 * q + 9] = bf_hi(ra[3]);
        B[2 * q][g] = bf_lo(rb[0]), B[2 * q + 1][g] = bf_hi(rb[0]);
        B[2 * q + 8][g] = bf_lo(rb[1]), B[2 * q + 9][g] = bf_hi(rb[1]);
    }
    __syncwarp();
    const int g = l >> 2, q = l & 3;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * q, 2 * q + 1, 2 * q, 2 * q + 1};
    for (int i = 0; i < 4; ++i) {
        double s = c[i];
        for (int k = 0; k < 16; ++k) s += A[rows[i]][k] * B[k][cols[i]];
        c[i] = (float)s;
    }
}
