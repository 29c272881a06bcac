// Shared helpers for every family's kernels (sm_90a, bf16 storage, fp32 math), one section
// each: conversions, warp and block reductions, page addressing, programmatic
// dependent launch, cp.async, tensor-core fragments. Every kernel source includes this header
// and takes these helpers from here only.
// Reductions use a fixed tree (warp xor-shuffle, then warps in index order), so the same
// inputs and the same block size always give the same bits. No float atomics anywhere.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

// Tile constants are not here: a family's come from its kernel table (TILES), passed as -D
// defines by kern_models.common.cubins, so a manifest's grid and its kernel's tile are the same
// number; each header or kernel that uses one refuses a build without it.

typedef __nv_bfloat16 bf16;

// log2(e): softmax runs in log2 units (exp2f), scores are scaled by it once.
#define LOG2E 1.4426950408889634f

// ---- conversions --------------------------------------------------------------------------

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

__device__ __forceinline__ unsigned pack_bf2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned *>(&v);
}

// ---- reductions ---------------------------------------------------------------------------
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

__device__ __forceinline__ int warp_max(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ int warp_min(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Argmax over (value, index) pairs: the larger value wins, a tie goes to the lower index, NaN
// never wins (every comparison with it is false). warp_best leaves the warp's best in every lane,
// by `better` or another order of pairs given as Better (argmax.cu's tiers).
__device__ __forceinline__ void better(float &bv, int &bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
}
template <void (*Better)(float &, int &, float, int) = better>
__device__ __forceinline__ void warp_best(float &bv, int &bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, bv, o);
        const int i = __shfl_xor_sync(0xffffffffu, bi, o);
        Better(bv, bi, v, i);
    }
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

// ---- page addressing ----------------------------------------------------------------------
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

// ---- programmatic dependent launch ---------------------------------------------------------
// Programmatic dependent launch (sm_90). Without the launch attribute both are no-ops.
// Most kernels trigger their dependents only after their own wait: when every kernel triggered
// at entry, a chain of kernels sat resident, each waiting on the one before, taking the SM
// slots the running kernel's later waves needed (docs/perf.md has the figures). Two trigger
// at entry, where the next kernel is a projection that only streams weights before its wait: attention_decode (the o projection follows) and
// gemv_residual (gate/up, the next qkv or the LM head follow).
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

// ---- cp.async -----------------------------------------------------------------------------
// 16-byte copies global -> shared at L2 (.cg: never a stale L1 line, see the PDL section).
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
// Copies src_bytes (0 or 16) and zero-fills the rest of the 16 bytes.
__device__ __forceinline__ void cp_async16_zfill(void *smem, const void *gmem, int src_bytes) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Wait until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// ---- tensor-core fragments ----------------------------------------------------------------
// Four 8x8 b16 matrices from shared memory (ldmatrix), plain and transposed.
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const bf16 *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], const bf16 *p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
// c[16 x 8] += A[16 x 16] (row) * B[16 x 8] (col), bf16 operands, fp32 accumulate. Not
// volatile: the compiler may move it among loads (gemv relies on its volatile weight loads
// being free to run ahead of the mma statements).
__device__ __forceinline__ void mma_bf16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    mma_bf16(c, a[0], a[1], a[2], a[3], b0, b1);
}
