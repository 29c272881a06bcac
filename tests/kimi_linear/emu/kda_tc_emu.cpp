// kda_tc.cu compiled for the host (g++, the stand-in common.cuh beside this file): each block of
// a launch in turn, its threads as std::threads. C entry points for ctypes
// (test_kda_tc_emulated.py): emu_kda_tc (prefill: kda_tc_prep, kda_tc_head, then kda_tc) and emu_kda_tc_decode,
// the kernels' arguments.
#include <cmath>
#include <vector>

#include "common.cuh"

// cp.async as the hardware may take it: a thread's copies land only at its cp_async_wait (those
// of every group but the newest N), so a read of the staging area before the wait sees the
// chunk before's rows, and the test fails
struct EmuCopy {
    void *dst;
    const void *src;
};
thread_local std::vector<EmuCopy> emu_pending;
thread_local std::vector<std::vector<EmuCopy>> emu_groups;
inline void cp_async16(void *smem, const void *gmem) { emu_pending.push_back({smem, gmem}); }
inline void cp_async_commit() {
    emu_groups.push_back(std::move(emu_pending));
    emu_pending.clear();
}
template <int N>
inline void cp_async_wait() {
    while ((int)emu_groups.size() > N) {
        for (const EmuCopy &c : emu_groups.front()) std::memcpy(c.dst, c.src, 16);
        emu_groups.erase(emu_groups.begin());
    }
}

#include "kda_tc.cu"
#include "grid.h"

thread_local Dim3 threadIdx;
Dim3 blockIdx, blockDim, gridDim;
EmuBlock *emu;
float sm[(KDA_TC_MAX_DIM * (KDA_TC_VS + 4 * KDA_TC_C + 1) + 2 * KDA_TC_C * KDA_TC_C + 11 * KDA_TC_C +
          4 * KDA_TC_C * KDA_TC_VS) +  // TcSmem, then TcStage
         KDA_TC_MAX_DIM * 7 * KDA_TC_C / 2 + KDA_TC_C * KDA_TC_DV / 2 + 2 * KDA_TC_C * KDA_TC_C];

extern "C" void emu_kda_tc(const uint16_t *mix, const float *g, const float *b, char *state, const int *slot,
                           const int *cu_seqlens, const int *pos, uint16_t *o, int n_seqs, int layer, int layers,
                           int heads, int dim, int conv, int slot_bytes) {
    // the op's three launches, one after the other; the rows' scores poisoned (NaN) first, so a
    // read of an entry kda_tc_prep did not write shows
    const int rows = cu_seqlens[n_seqs];
    std::vector<float> pre((size_t)rows * heads * (2 * KDA_TC_C + 2 * dim), std::nanf(""));
    run_grid(rows, heads, 1, 128, sm, sizeof(sm), [&] {
        kda_tc_prep(reinterpret_cast<const bf16 *>(mix), g, state, slot, cu_seqlens, pos, pre.data(), rows, n_seqs, layer,
                    layers, heads, dim, conv, slot_bytes);
    });
    run_grid(n_seqs, heads, (dim + KDA_TC_DV / 2 - 1) / (KDA_TC_DV / 2), KDA_TC_THREADS, sm, sizeof(sm), [&] {
        kda_tc_head(reinterpret_cast<const bf16 *>(mix), g, b, state, slot, cu_seqlens, pos, pre.data(),
                    reinterpret_cast<bf16 *>(o), n_seqs, layer, layers, heads, dim, conv, slot_bytes);
    });
    run_grid(n_seqs, heads, (dim + KDA_TC_DV / 2 - 1) / (KDA_TC_DV / 2), KDA_TC_THREADS, sm, sizeof(sm), [&] {
        kda_tc(reinterpret_cast<const bf16 *>(mix), g, b, state, slot, cu_seqlens, pos, pre.data(),
               reinterpret_cast<bf16 *>(o), n_seqs, layer, layers, heads, dim, conv, slot_bytes);
    });
}

extern "C" void emu_kda_tc_decode(const uint16_t *mix, const float *g, const float *b, char *state, const int *slot,
                                  const int *pos, uint16_t *o, int rows, int layer, int layers, int heads, int dim,
                                  int conv, int slot_bytes) {
    run_grid(rows, heads, 1, KDA_TC_THREADS, sm, sizeof(sm), [&] {
        kda_tc_decode(reinterpret_cast<const bf16 *>(mix), g, b, state, slot, pos, reinterpret_cast<bf16 *>(o), rows,
                      layer, layers, heads, dim, conv, slot_bytes);
    });
}
