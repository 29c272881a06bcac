// A host stand-in for models/common/cuda/wgmma.cuh (and the parts of common.cuh gemm_wg.cuh
// uses), enough to compile gemm_wg.cuh with g++ and run a launch's blocks on CPU threads
// (wg_emu.cpp): every thread a std::thread, the blocks of a tile's split (grid z) at once, as a
// cluster. mbarriers are counted phases (a mutex and a condition variable), cp.async a copy made
// at once, wgmma a warpgroup thread's own accumulators computed from the swizzled shared-memory
// tiles its descriptors name; a TMA box a copy made at once, its bytes counted on the barrier. The k16 step's sum is taken as the numpy model takes it
// (test_wg_emulated.py): the accumulator and the 16 exact products added in order in double,
// rounded once to f32. Only for the CPU test of gemm_wg.cuh's order and indexing.
#pragma once
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>

#include "host.h"

extern thread_local Dim3 threadIdx, blockIdx;
extern Dim3 blockDim, gridDim;

inline float bf2f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// ---- a block's place in the emulated launch (wg_emu.cpp sets these for each thread) ----------
struct EmuCluster;
struct EmuBlock {
    char *smem;
    std::barrier<> *bar;
    EmuCluster *cluster;
    int rank;
};
struct EmuCluster {
    std::barrier<> *bar;
    EmuBlock *blocks[8];
};
extern thread_local EmuBlock *emu_block;
inline char *emu_smem_base() { return emu_block->smem; }
inline void __syncthreads() { emu_block->bar->arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <class T>
inline T __ldcg(const T *p) { return *p; }
template <class T>
inline void __stcg(T *p, T v) { *p = v; }
inline int atomicAdd(int *p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }

// ---- mbarriers: phases counted on the host, keyed by the barrier's address -------------------
struct EmuMbar {
    int count = 0, pending = 0, phase = 0;
    long tx = 0;  // bytes the tensor memory access unit has yet to land in this phase
};
extern std::mutex emu_mbar_mu;
extern std::condition_variable emu_mbar_cv;
extern std::map<const void *, EmuMbar> emu_mbars;

inline uint32_t smem_u32(const void *p) { return (uint32_t)(static_cast<const char *>(p) - emu_block->smem); }
inline void mbar_init(uint64_t *bar, int count) {
    std::lock_guard<std::mutex> g(emu_mbar_mu);
    emu_mbars[bar] = EmuMbar{count, count, 0};
}
// a phase completes once its arrivals are all in and its expected bytes have landed
inline void emu_mbar_step(EmuMbar &m, int arrivals, long bytes) {
    m.pending -= arrivals;
    m.tx += bytes;
    if (m.pending == 0 && m.tx == 0) {
        m.pending = m.count;
        ++m.phase;
        emu_mbar_cv.notify_all();
    }
}
inline void mbar_arrive(uint64_t *bar) {
    std::lock_guard<std::mutex> g(emu_mbar_mu);
    emu_mbar_step(emu_mbars.at(bar), 1, 0);
}
// returns once the phase of parity `parity` has completed (the current phase's parity differs)
inline void mbar_wait(uint64_t *bar, int parity) {
    std::unique_lock<std::mutex> g(emu_mbar_mu);
    emu_mbar_cv.wait(g, [&] { return (emu_mbars.at(bar).phase & 1) != parity; });
}
inline void cp_async_arrive(uint64_t *bar) { mbar_arrive(bar); }  // the copies landed at once
inline void mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
    std::lock_guard<std::mutex> g(emu_mbar_mu);
    emu_mbar_step(emu_mbars.at(bar), 1, (long)bytes);
}
inline void cp_async16_zfill(void *smem, const void *gmem, int src_bytes) {
    std::memset(smem, 0, 16);
    if (src_bytes) std::memcpy(smem, gmem, src_bytes);
}
// A tensor map as wg_emu.cpp makes one: a row-major bf16 [rows, cols] and its box, 64 elements
// (128 bytes) of box_rows rows, written 128-byte swizzled, zeros past the tensor's edges.
struct EmuTensorMap {
    const uint16_t *base;
    int rows, cols, box_rows;
};
inline uint32_t sw128(int row, int chunk);
inline void tma_load_2d(void *dst, const void *map, int c0, int c1, uint64_t *bar) {
    const EmuTensorMap &m = *static_cast<const EmuTensorMap *>(map);
    char *d = static_cast<char *>(dst);
    for (int r = 0; r < m.box_rows; ++r)
        for (int c = 0; c < 64; ++c) {
            const int gr = c1 + r, gc = c0 + c;
            const uint16_t v = gr < m.rows && gc < m.cols ? m.base[(size_t)gr * m.cols + gc] : 0;
            std::memcpy(d + sw128(r, c / 8) + 2 * (c % 8), &v, 2);
        }
    std::lock_guard<std::mutex> g(emu_mbar_mu);
    emu_mbar_step(emu_mbars.at(bar), 0, -(long)(m.box_rows * 128));
}
inline void tma_prefetch_map(const void *) {}
inline void fence_async_smem() {}

// ---- K-major tiles of 64 bf16 a row, 128-byte swizzle (as wgmma.cuh) -------------------------
inline uint32_t sw128(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }
inline uint64_t desc_sw128(const void *p) { return (uint64_t)((smem_u32(p) & 0x3FFFF) >> 4); }

inline void wgmma_fence() {}
inline void wgmma_commit() {}
template <int N>
inline void wgmma_wait() {}

// the bf16 at byte `addr` of a swizzled K-major tile (the tile 1024-byte aligned): the 16-byte
// chunk bits [4, 7) of the address taken xor its row's bits [7, 10), as the hardware reads it
inline float emu_tile(uint32_t addr) {
    const uint32_t phys = addr ^ (((addr >> 7) & 7) << 4);
    uint16_t b;
    std::memcpy(&b, emu_block->smem + phys, 2);
    return bf2f(b);
}

// d[64 x BN] (+)= A[64 x 16] B[BN x 16]^T, this thread's accumulators of the warpgroup's
// (d[4j + 2h + e] = row 16w + g + 8h, column 8j + 2t + e)
template <int BN>
inline void wgmma_bn(float (&d)[BN / 2], uint64_t a, uint64_t b, int scale_d) {
    const uint32_t oa = (uint32_t)(a & 0x3FFF) << 4, ob = (uint32_t)(b & 0x3FFF) << 4;
    const int t = threadIdx.x & 127, w = t >> 5, g = (t & 31) >> 2, q = t & 3;
    for (int j = 0; j < BN / 8; ++j)
        for (int h = 0; h < 2; ++h)
            for (int e = 0; e < 2; ++e) {
                const int row = 16 * w + g + 8 * h, col = 8 * j + 2 * q + e;
                double s = scale_d ? (double)d[4 * j + 2 * h + e] : 0.0;
                for (int k = 0; k < 16; ++k)
                    s += (double)emu_tile(oa + row * 128 + 2 * k) * (double)emu_tile(ob + col * 128 + 2 * k);
                d[4 * j + 2 * h + e] = (float)s;
            }
}
