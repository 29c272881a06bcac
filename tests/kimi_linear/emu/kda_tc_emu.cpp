// kda_tc.cu compiled for the host (g++, the stand-in common.cuh beside this file): each block of
// a launch in turn, its threads as std::threads. C entry points for ctypes
// (test_kda_tc_emulated.py): emu_kda_tc (prefill: kda_tc_head, then kda_tc) and emu_kda_tc_decode,
// the kernels' arguments.
#include <thread>
#include <vector>

#include "kda_tc.cu"

thread_local Dim3 threadIdx;
Dim3 blockIdx, blockDim;
EmuBlock *emu;
float sm[(KDA_TC_MAX_DIM * (KDA_TC_VS + 5 * KDA_TC_C + 1) + 2 * KDA_TC_C * KDA_TC_C + 11 * KDA_TC_C +
          4 * KDA_TC_C * KDA_TC_VS)];

// the order blocks run in: 0 from the first, 1 from the last (a block that reads what another
// block of the same launch writes gets other bits one way or the other)
static int block_order = 0;
extern "C" void emu_block_order(int order) { block_order = order; }

template <class F>
static void run_grid(int gx, int gy, int gz, F body) {
    static EmuBlock block;
    std::barrier<> bar(KDA_TC_THREADS);
    for (int w = 0; w < KDA_TC_THREADS / 32; ++w) block.warp[w] = new std::barrier<>(32);
    block.block = &bar;
    emu = &block;
    blockDim.x = KDA_TC_THREADS;
    const int blocks = gx * gy * gz;
    for (int k = 0; k < blocks; ++k) {
            const int id = block_order ? blocks - 1 - k : k;
            blockIdx.x = id % gx;
            blockIdx.y = id / gx % gy;
            blockIdx.z = id / (gx * gy);
            std::memset(sm, 0xFF, sizeof(sm));  // NaN: a read of what no thread wrote shows
            std::vector<std::thread> threads;
            for (int t = 0; t < KDA_TC_THREADS; ++t)
                threads.emplace_back([t, &body] {
                    threadIdx.x = t;
                    body();
                });
            for (auto &th : threads) th.join();
        }
    for (int w = 0; w < KDA_TC_THREADS / 32; ++w) delete block.warp[w];
}

extern "C" void emu_kda_tc(const uint16_t *mix, const float *g, const float *b, char *state, const int *slot,
                           const int *cu_seqlens, const int *pos, uint16_t *o, int n_seqs, int layer, int layers,
                           int heads, int dim, int conv, int slot_bytes) {
    // the op's two launches, one after the other
    run_grid(n_seqs, heads, (dim + KDA_TC_DV - 1) / KDA_TC_DV, [&] {
        kda_tc_head(reinterpret_cast<const bf16 *>(mix), g, b, state, slot, cu_seqlens, pos,
                    reinterpret_cast<bf16 *>(o), n_seqs, layer, layers, heads, dim, conv, slot_bytes);
    });
    run_grid(n_seqs, heads, (dim + KDA_TC_DV - 1) / KDA_TC_DV, [&] {
        kda_tc(reinterpret_cast<const bf16 *>(mix), g, b, state, slot, cu_seqlens, pos, reinterpret_cast<bf16 *>(o),
               n_seqs, layer, layers, heads, dim, conv, slot_bytes);
    });
}

extern "C" void emu_kda_tc_decode(const uint16_t *mix, const float *g, const float *b, char *state, const int *slot,
                                  const int *pos, uint16_t *o, int rows, int layer, int layers, int heads, int dim,
                                  int conv, int slot_bytes) {
    run_grid(rows, heads, (dim + KDA_TC_DV - 1) / KDA_TC_DV, [&] {
        kda_tc_decode(reinterpret_cast<const bf16 *>(mix), g, b, state, slot, pos, reinterpret_cast<bf16 *>(o), rows,
                      layer, layers, heads, dim, conv, slot_bytes);
    });
}
