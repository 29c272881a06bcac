// Shared helpers for the llama-family kernels (sm_90a, bf16 storage, fp32 math).
// Reductions use a fixed tree (warp xor-shuffle, then warps in index order), so the same
// inputs and the same block size always give the same bits. No float atomics anywhere.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float to_f(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ bf16 to_bf(float v) { return __float2bfloat16_rn(v); }
// Round through bf16 and back: what a bf16 tensor op in the reference does to a value.
__device__ __forceinline__ float rbf(float v) { return to_f(to_bf(v)); }

// Eight bf16 in one 16-byte word.
__device__ __forceinline__ void unpack8(const uint4 &u, float *f) {
    const bf16 *h = reinterpret_cast<const bf16 *>(&u);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = to_f(h[i]);
}
__device__ __forceinline__ uint4 pack8(const float *f) {
    uint4 u;
    bf16 *h = reinterpret_cast<bf16 *>(&u);
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = to_bf(f[i]);
    return u;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets
// the result. `scratch` holds 32 floats. Order: lanes by xor tree, then warps 0..n-1.
__device__ __forceinline__ float block_sum(float v, float *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n_warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = 0.f;
    for (int w = 0; w < n_warps; ++w) t += scratch[w];
    return t;
}

// Index of the sequence that owns row r: cu_seqlens[s] <= r < cu_seqlens[s+1].
__device__ __forceinline__ int seq_of_row(const int *cu_seqlens, int n_seqs, int r) {
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (cu_seqlens[mid] <= r) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// Byte offset of (layer, kv, head, token, 0) in the paged KV state.
// Page p starts at p * page_tokens * bytes_per_token, bytes_per_token =
// n_layers * 2 * n_kv_heads * head_dim * 2; inside a page: [layer][k|v][head][token][dim].
__device__ __forceinline__ size_t kv_offset(int phys_page, int layer, int kv, int head, int tok,
                                            int n_layers, int n_kv_heads, int head_dim,
                                            int page_tokens) {
    const size_t page_bytes = (size_t)page_tokens * n_layers * 2 * n_kv_heads * head_dim * 2;
    const size_t in_page =
        ((((size_t)layer * 2 + kv) * n_kv_heads + head) * page_tokens + tok) * head_dim * 2;
    return (size_t)phys_page * page_bytes + in_page;
}

// Programmatic dependent launch (sm_90). Without the launch attribute both are no-ops.
// Most kernels trigger their dependents only after their own wait: when every kernel triggered
// at entry, a chain of kernels sat resident, each waiting on the one before, taking the SM
// slots the running kernel's later waves needed (measured on the H200: Llama-3.2-1B decode
// 1.27 -> 1.87 ms a step). Two trigger at entry, where the next kernel is a projection that
// only streams weights before its wait: attention_decode (the o projection follows) and
// gemv_residual (gate/up, the next qkv or the LM head follow); measured faster (docs/perf.md).
// What is after a kernel's wait is ordered whatever the triggers: its wait covers the kernel
// before it, which finished only after its own wait. What is before the wait is not: behind an
// early trigger a kernel may start while the kernels before it still run. So before its wait a
// kernel reads only what cannot be changing: weights, the step's inputs (copied up before the
// step's first kernel, which has no PDL attribute) and, for attention_decode, the K/V rows of
// earlier positions. attention_decode follows the qkv projection, which triggers late: its
// launch means the qkv projection passed its wait, so every kernel before that is complete.
// tests/cuda/test_cuda_pdl_order.py checks that the generated manifests keep to this.
// pdl_launch_dependents: the next kernel in the stream may start its prologue now.
// pdl_wait: block until the previous kernel finished and its writes are visible; call it
// before reading anything the previous kernel wrote and before the first global write.
__device__ __forceinline__ void pdl_launch_dependents() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
