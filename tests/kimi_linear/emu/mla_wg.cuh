// A host stand-in for models/kimi_linear/kernels/cuda/mla_wg.cuh (the RS-form wgmma, setmaxnreg,
// the operand fences), with wgmma.cuh's stand-in beside it. A warpgroup's wgmma is computed by
// each thread for its own accumulators, at once: A from its warp's 32 lanes' registers in the PTX
// fragment layout (a warp's 16 rows, as mma.sync m16n8k16's A: the lanes meet through the warp's
// exchange buffer, common.cuh), B from shared memory where the descriptor (as mla_tc.cu built it:
// start, LBO, SBO, swizzle) says the hardware reads it, the 128-byte swizzle applied to the
// address: K-major, element (n, k) at start + (n % 8) 128 + (n / 8) SBO + 2k; N-major, at start +
// 2 (n % 64) + (n / 64) LBO + (k % 8) 128 + (k / 8) SBO. A k16 step's sum is common.cuh's
// mma_bf16's: the accumulator (0 when scale-d is 0) and the 16 exact products added in order in
// double, rounded once to f32, so the emulated kernel and mla_attend_x's emulation sum alike.
#pragma once
#include <cassert>

#include "wgmma.cuh"

inline void mbar_init_fence() {}
template <int N>
inline void wg_regs_dec() {}
template <int N>
inline void wg_regs_inc() {}
template <int N>
inline void wgmma_reg_fence(float (&)[N]) {}
template <int N>
inline void wgmma_reg_fence(unsigned (&)[N]) {}

// the bf16 at shared-memory byte offset addr as the 128-byte swizzle places it
inline double emu_sw128_at(uint32_t addr) {
    const uint32_t phys = addr ^ (((addr >> 7) & 7) << 4);
    bf16 b;
    std::memcpy(&b, emu_shared + phys, 2);
    return to_f(b);
}

template <int NN>
inline void emu_wgmma_rs(float *d, const unsigned (&a)[4], uint64_t desc, int scale_d, bool n_major) {
    const int w = (threadIdx.x >> 5) & 31, l = threadIdx.x & 31, g = l >> 2, q = l & 3;
    assert((desc >> 62) == 1 && "128-byte swizzle");
    const uint32_t start = (uint32_t)(desc & 0x3FFF) << 4, lbo = (uint32_t)((desc >> 16) & 0x3FFF) << 4,
                   sbo = (uint32_t)((desc >> 32) & 0x3FFF) << 4;
    for (int i = 0; i < 4; ++i) emu->a[w][l][i] = a[i];
    __syncwarp();
    double A[16][16];
    for (int t = 0; t < 32; ++t) {
        const int tg = t >> 2, tq = t & 3;
        const unsigned *r = emu->a[w][t];
        A[tg][2 * tq] = bf_lo(r[0]), A[tg][2 * tq + 1] = bf_hi(r[0]);
        A[tg + 8][2 * tq] = bf_lo(r[1]), A[tg + 8][2 * tq + 1] = bf_hi(r[1]);
        A[tg][2 * tq + 8] = bf_lo(r[2]), A[tg][2 * tq + 9] = bf_hi(r[2]);
        A[tg + 8][2 * tq + 8] = bf_lo(r[3]), A[tg + 8][2 * tq + 9] = bf_hi(r[3]);
    }
    __syncwarp();
    for (int j = 0; j < NN / 8; ++j)
        for (int h = 0; h < 2; ++h)
            for (int e = 0; e < 2; ++e) {
                const int row = g + 8 * h, n = 8 * j + 2 * q + e;
                double s = scale_d ? (double)d[4 * j + 2 * h + e] : 0.0;
                for (int k = 0; k < 16; ++k) {
                    const uint32_t at = n_major ? start + 2 * (n % 64) + (n / 64) * lbo + (k % 8) * 128 + (k / 8) * sbo
                                                : start + (n % 8) * 128 + (n / 8) * sbo + 2 * k;
                    s += A[row][k] * emu_sw128_at(at);
                }
                d[4 * j + 2 * h + e] = (float)s;
            }
}
inline void wgmma_rs_n64(float (&d)[32], const unsigned (&a)[4], uint64_t b, int scale_d) {
    emu_wgmma_rs<64>(d, a, b, scale_d, false);
}
inline void wgmma_rs_n128_t(float (&d)[64], const unsigned (&a)[4], uint64_t b) {
    emu_wgmma_rs<128>(d, a, b, 1, true);
}
