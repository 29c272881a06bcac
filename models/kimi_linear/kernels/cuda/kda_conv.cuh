// KDA's short causal convolution: kda_conv (prefill, a sequence's rows) and kda_conv_decode (a
// row a sequence), built into kda.cubin through kda.cu (which includes common.cuh first) and
// compiled for the CPU by tests/kimi_linear/emu/kda_conv_emu.cpp. out[t] = silu(sum_j w[c, j] *
// ext[t + j]), ext = window ++ rows, in place over mix. A thread owns one channel c of one
// sequence: it reads a tile of up to KDA_CONV_TILE rows of its channel first (independent loads,
// all in flight: the walk paid a load's latency a row when each row was read, used and written
// in turn), then computes them in order with the window in registers and writes them back. No
// other thread touches the channel, and every row of a tile is read before any is written, so
// the in-place rewrite is safe. A row's arithmetic is fixed (the products in tap order from
// zero, each one fma, then silu as acc / (1 + expf(-acc))) whatever the tile or the rows beside
// it: prefill's many rows and decode's one give a token the same bits, wherever its prompt was
// cut (the window carries the last conv - 1 inputs across calls).
#pragma once

#define KDA_MAX_CONV 8  // taps at most (table.py MAX_CONV)
#define KDA_CONV_TILE 16  // rows of a channel read at once (registers: one float a row)

// A layer's part of a slot (kda.cu's layout: [layer][recurrent S | window] in f32).
__device__ __forceinline__ float *kda_layer(char *state, int slot, int slot_bytes, int layer, int heads,
                                            int dim, int conv) {
    const size_t per = (size_t)heads * dim * dim + (size_t)(conv - 1) * 3 * heads * dim;
    return reinterpret_cast<float *>(state + (size_t)slot * slot_bytes) + (size_t)layer * per;
}

__device__ __forceinline__ void conv_rows(bf16 *mix, const bf16 *w, char *state, int slot, int r0, int r1,
                                          bool fresh, int layer, int layers, int heads, int dim, int conv,
                                          int slot_bytes) {
    const int C = 3 * heads * dim;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float *win = kda_layer(state, slot, slot_bytes, layer, heads, dim, conv) + (size_t)heads * dim * dim;
    float wc[KDA_MAX_CONV], ext[KDA_MAX_CONV];
#pragma unroll
    for (int j = 0; j < KDA_MAX_CONV; ++j) {
        wc[j] = j < conv ? to_f(w[(size_t)c * conv + j]) : 0.f;
        ext[j] = (j < conv - 1 && !fresh) ? win[(size_t)j * C + c] : 0.f;
    }
    for (int rb = r0; rb < r1; rb += KDA_CONV_TILE) {
        const int n = min(KDA_CONV_TILE, r1 - rb);
        float xs[KDA_CONV_TILE];
#pragma unroll
        for (int i = 0; i < KDA_CONV_TILE; ++i) xs[i] = i < n ? to_f(mix[(size_t)(rb + i) * C + c]) : 0.f;
#pragma unroll
        for (int i = 0; i < KDA_CONV_TILE; ++i) {
            if (i < n) {
                const float x = xs[i];
                float acc = 0.f;
#pragma unroll
                for (int j = 0; j < KDA_MAX_CONV; ++j)
                    if (j < conv) acc = __fmaf_rn(j == conv - 1 ? x : ext[j], wc[j], acc);
#pragma unroll
                for (int j = 0; j < KDA_MAX_CONV - 1; ++j)
                    if (j < conv - 2) ext[j] = ext[j + 1];
#pragma unroll
                for (int j = 0; j < KDA_MAX_CONV; ++j)
                    if (j == conv - 2) ext[j] = x;
                mix[(size_t)(rb + i) * C + c] = to_bf(acc / (1.f + expf(-acc)));
            }
        }
    }
#pragma unroll
    for (int j = 0; j < KDA_MAX_CONV; ++j)
        if (j < conv - 1) win[(size_t)j * C + c] = ext[j];
}

// Prefill: grid (n_seqs, ceil(3 * heads * dim / 128)), block 128.
extern "C" __global__ void kda_conv(bf16 *__restrict__ mix, const bf16 *__restrict__ w, char *__restrict__ state,
                                    const int *__restrict__ slot, const int *__restrict__ cu_seqlens,
                                    const int *__restrict__ pos, int n_seqs, int layer, int layers, int heads,
                                    int dim, int conv, int slot_bytes) {
    const int s = blockIdx.x;
    if (s >= n_seqs) return;
    const int r0 = cu_seqlens[s], r1 = cu_seqlens[s + 1];
    if (r1 == r0) return;
    conv_rows(mix, w, state, slot[s], r0, r1, pos[r0] == 0, layer, layers, heads, dim, conv, slot_bytes);
}

// Decode: row r is sequence r's one token. Grid (rows, ceil(3 * heads * dim / 128)), block 128.
extern "C" __global__ void kda_conv_decode(bf16 *__restrict__ mix, const bf16 *__restrict__ w,
                                           char *__restrict__ state, const int *__restrict__ slot,
                                           const int *__restrict__ pos, int rows, int layer, int layers,
                                           int heads, int dim, int conv, int slot_bytes) {
    const int r = blockIdx.x;
    if (r >= rows) return;
    conv_rows(mix, w, state, slot[r], r, r + 1, pos[r] == 0, layer, layers, heads, dim, conv, slot_bytes);
}
