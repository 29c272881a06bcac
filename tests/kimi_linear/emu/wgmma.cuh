// A host stand-in for models/common/cuda/wgmma.cuh beside the mma.sync stand-in common.cuh here
// (tests/cuda/emu_wg/wgmma.cuh is gemm_wg.cuh's, with its own launch): enough for mla_tc.cu's
// mla_attend_x_wg on the emulator's threads (grid.h: a block's threads as std::threads, blocks in
// turn). mbarriers are counted phases keyed by their address (a mutex and a condition variable);
// cp.async lands at once, so its arrival is an arrival; wgmma's fence, commit and wait are
// nothing (the stand-in wgmma, mla_wg.cuh here, computes at once); the proxy fence a lag. Shared
// memory addresses (smem_u32, the descriptors' fields) are offsets from emu_shared, the
// emulator's shared memory, 1024-byte aligned as the kernels align their swizzled tiles.
#pragma once
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "common.cuh"

inline unsigned char *emu_shared = nullptr;  // the including emulator points it at its shared memory

struct EmuMbar {
    int count = 0, pending = 0, phase = 0;
};
inline std::mutex emu_mbar_mu;
inline std::condition_variable emu_mbar_cv;
inline std::map<const void *, EmuMbar> emu_mbars;

inline uint32_t smem_u32(const void *p) {
    return (uint32_t)(static_cast<const unsigned char *>(p) - emu_shared);
}
inline void mbar_init(uint64_t *bar, int count) {
    std::lock_guard<std::mutex> g(emu_mbar_mu);
    emu_mbars[bar] = EmuMbar{count, count, 0};
}
inline void mbar_arrive(uint64_t *bar) {
    std::lock_guard<std::mutex> g(emu_mbar_mu);
    EmuMbar &m = emu_mbars.at(bar);
    if (--m.pending == 0) {
        m.pending = m.count;
        ++m.phase;
        emu_mbar_cv.notify_all();
    }
}
// returns once the phase of parity `parity` has completed (the current phase's parity differs)
inline void mbar_wait(uint64_t *bar, int parity) {
    std::unique_lock<std::mutex> g(emu_mbar_mu);
    emu_mbar_cv.wait(g, [&] { return (emu_mbars.at(bar).phase & 1) != parity; });
}
inline void cp_async_arrive(uint64_t *bar) { mbar_arrive(bar); }  // the copies landed at once
// The kernels fence right after waiting for a stage (and once at the start): here the thread also
// lags a while, so a producer the barriers let run ahead overwrites a stage still being read,
// and the test sees it (with threads in step the emulator would hide a missing or early release).
inline void fence_async_smem() { std::this_thread::sleep_for(std::chrono::microseconds(300)); }

inline uint32_t sw128(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }

inline void wgmma_fence() {}
inline void wgmma_commit() {}
template <int N>
inline void wgmma_wait() {}
