// The emulators' launch (kda_tc_emu.cpp, mla_tc_emu.cpp): a grid's blocks one after another,
// first to last or last to first (emu_block_order: a block that reads what another block of the
// same launch writes gets other bits one way or the other), each block's threads as
// std::threads, its shared memory poisoned first (0xFF bytes: NaN, so a read of what no thread
// wrote shows). Included after common.cuh; the including file defines the Dim3s and `emu`.
#pragma once
#include <barrier>
#include <cstring>
#include <thread>
#include <vector>

extern Dim3 gridDim;
static int block_order = 0;
extern "C" void emu_block_order(int order) { block_order = order; }

template <class F>
static void run_grid(int gx, int gy, int gz, int threads, void *smem, size_t smem_bytes, F body) {
    static EmuBlock block;
    std::barrier<> bar(threads);
    for (int w = 0; w < threads / 32; ++w) block.warp[w] = new std::barrier<>(32);
    block.block = &bar;
    emu = &block;
    blockDim.x = threads;
    gridDim.x = gx, gridDim.y = gy, gridDim.z = gz;
    const int blocks = gx * gy * gz;
    for (int k = 0; k < blocks; ++k) {
        const int id = block_order ? blocks - 1 - k : k;
        blockIdx.x = id % gx;
        blockIdx.y = id / gx % gy;
        blockIdx.z = id / (gx * gy);
        std::memset(smem, 0xFF, smem_bytes);
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t)
            ts.emplace_back([t, &body] {
                threadIdx.x = t;
                body();
            });
        for (auto &th : ts) th.join();
    }
    for (int w = 0; w < threads / 32; ++w) delete block.warp[w];
}
