// kda_conv.cuh (KDA's short convolution, prefill and decode) compiled for the host (g++, the
// stand-in common.cuh beside this file), each block of a launch in turn, its threads as
// std::threads. C entry points for ctypes (test_kda_conv_emulated.py): the kernels' arguments.
#include <cmath>

#include "common.cuh"
#include "kda_conv.cuh"
#include "grid.h"

thread_local Dim3 threadIdx;
Dim3 blockIdx, blockDim, gridDim;
EmuBlock *emu;
static float no_smem[1];

static int conv_blocks(int heads, int dim) { return (3 * heads * dim + 127) / 128; }

extern "C" void emu_kda_conv(uint16_t *mix, const uint16_t *w, char *state, const int *slot, const int *cu_seqlens,
                             const int *pos, int n_seqs, int layer, int layers, int heads, int dim, int conv,
                             int slot_bytes) {
    run_grid(n_seqs, conv_blocks(heads, dim), 1, 128, no_smem, 0, [&] {
        kda_conv(reinterpret_cast<bf16 *>(mix), reinterpret_cast<const bf16 *>(w), state, slot, cu_seqlens, pos, n_seqs,
                 layer, layers, heads, dim, conv, slot_bytes);
    });
}

extern "C" void emu_kda_conv_decode(uint16_t *mix, const uint16_t *w, char *state, const int *slot, const int *pos,
                                    int rows, int layer, int layers, int heads, int dim, int conv, int slot_bytes) {
    run_grid(rows, conv_blocks(heads, dim), 1, 128, no_smem, 0, [&] {
        kda_conv_decode(reinterpret_cast<bf16 *>(mix), reinterpret_cast<const bf16 *>(w), state, slot, pos, rows, layer,
                        layers, heads, dim, conv, slot_bytes);
    });
}
