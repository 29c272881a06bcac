// Row-invariant projections for many rows (prefill's rows, the wide decode program's):
// y[M, N] = x[M, K] @ W[N, K]^T on Hopper's wgmma, through the common many-row kernel
// (models/common/cuda/gemm_wg.cuh: a producer filling a ring of shared-memory stages through the
// tensor memory access unit, consumer warpgroups on wgmma), which reduces every output in the gemv's order: units of 256, partial p
// taking units p, p + 8, ..., k16 steps of consecutive elements, the 8 partials added in order.
// So a row gets the same bits here, at any M, as from the gemv decode program (gemv.cuh).
// The outputs are the gemv's (its Y: plain bf16 or f32, the residual add, SwiGLU, rope + KV
// append), with the same arithmetic. A normed projection is two launches: rms_prep forms
// x = bf16(nw * res) and 1/rms a row exactly as the gemv forms them (the same XNorm::form, the
// same lane, unit and warp order of the sum of squares), and the GEMM multiplies its sums by
// 1/rms as the gemv's epilogue does.
#include "gemv.cuh"
#include "wg_shapes.cuh"

// xn = bf16(nw * res) [rows, K] and rs = 1/rms [rows], a block (8 warps) a row: warp w takes
// units w, w + 8, ... of 256 elements, lane l elements 8l .. 8l + 7 of a unit, its squares summed
// by XNorm::form, the lanes by warp_sum, the units in order, then the warps in order: the gemv's
// order, so rs is the scale the gemv applies. Grid (rows), block 256.
extern "C" __global__ void __launch_bounds__(256)
rms_prep(const bf16 *__restrict__ res, const bf16 *__restrict__ nw, bf16 *__restrict__ xn,
         float *__restrict__ rs, int rows, int K, float eps) {
    __shared__ float ssw[GEMV_WARPS];
    const int row = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const XNorm xs{res, nw, eps};
    float ssr = 0.f;
    for (int kb = warp * GEMV_UNIT; kb < K; kb += GEMV_WARPS * GEMV_UNIT) {
        const int kc = kb + 8 * lane;
        const bool okc = kc < K;
        float ss = 0.f;
        const uint4 v = xs.form(xs.fetch(row, okc ? kc : 0, K), xs.weight(okc ? kc : 0), okc, ss);
        if (okc) *reinterpret_cast<uint4 *>(xn + (size_t)row * K + kc) = v;
        ssr += warp_sum(ss);
    }
    if (lane == 0) ssw[warp] = ssr;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < GEMV_WARPS; ++w) s += ssw[w];
        rs[row] = 1.f / sqrtf(s / (float)K + eps);
    }
}

// Prefill's entries: grid (column tiles of WG_BN W rows, or WG_BN / 2 pairs; ceil_div(rows, 128)),
// block WgBig::THREADS, dynamic shared memory WG_BIG_SMEM. xn, rs: rms_prep's. x (or xn) and W
// are tensor maps (kern's `tiles<32,64>` params: 128-byte swizzled boxes of 32 rows), not arrays.
extern "C" __global__ void __launch_bounds__(WgBig::THREADS, 1)
norm_gemm_bf16(const bf16 *__restrict__ xn, const float *__restrict__ rs, const bf16 *__restrict__ W,
                   bf16 *__restrict__ y, int rows, int N, int K) {
    gemm_wg<WgBig>(nullptr, nullptr, rs, YBf16{y}, rows, N, K, nullptr, nullptr, xn, W);
}
extern "C" __global__ void __launch_bounds__(WgBig::THREADS, 1)
norm_gemm_f32(const bf16 *__restrict__ xn, const float *__restrict__ rs, const bf16 *__restrict__ W,
                  float *__restrict__ y, int rows, int N, int K) {
    gemm_wg<WgBig>(nullptr, nullptr, rs, YF32{y}, rows, N, K, nullptr, nullptr, xn, W);
}
extern "C" __global__ void __launch_bounds__(WgBig::THREADS, 1)
gemm_residual(const bf16 *__restrict__ x, const bf16 *__restrict__ W, bf16 *res, int rows, int N, int K) {
    gemm_wg<WgBig>(nullptr, nullptr, nullptr, YAddRes{res}, rows, N, K, nullptr, nullptr, x, W);
}
extern "C" __global__ void __launch_bounds__(WgBig::THREADS, 1)
norm_gemm_swiglu(const bf16 *__restrict__ xn, const float *__restrict__ rs, const bf16 *__restrict__ W,
                     bf16 *__restrict__ act, int rows, int N, int K) {
    gemm_wg<WgBig>(nullptr, nullptr, rs, YSwiGLU{act}, rows, N, K, nullptr, nullptr, xn, W);
}
extern "C" __global__ void __launch_bounds__(WgBig::THREADS, 1)
norm_gemm_rope_append(const bf16 *__restrict__ xn, const float *__restrict__ rs, const bf16 *__restrict__ W,
                          bf16 *__restrict__ y, char *__restrict__ kv_state, const int *__restrict__ page_table,
                          const int *__restrict__ cu_seqlens, const int *__restrict__ pos,
                          const float *__restrict__ table, int pages_per_seq, int rows, int n_seqs, int layer,
                          int n_layers, int n_q_heads, int n_kv_heads, int head_dim, int page_tokens, int N, int K) {
    gemm_wg<WgBig>(nullptr, nullptr, rs,
                   rope_append_y(y, kv_state, page_table, cu_seqlens, pos, table, pages_per_seq, n_seqs, layer,
                                 n_layers, n_q_heads, n_kv_heads, head_dim, page_tokens),
                   rows, N, K, nullptr, nullptr, xn, W);
}

// The wide decode program's (few rows, 8 blocks a tile, one a partial): part f32[tiles * 8 *
// WG_SPLIT_PART], sem i32[tiles] (zero before the first launch, zero again after each; tiles =
// the grid's x * y). Grid (column tiles, ceil_div(rows, 64), 8), block WgSplit::THREADS, dynamic
// shared memory WG_SPLIT_SMEM.
extern "C" __global__ void __launch_bounds__(WgSplit::THREADS, 1)
norm_gemm_bf16_split(const bf16 *__restrict__ xn, const float *__restrict__ rs, const bf16 *__restrict__ W,
                           bf16 *__restrict__ y, float *__restrict__ part, int *__restrict__ sem, int rows, int N,
                           int K) {
    gemm_wg<WgSplit>(nullptr, nullptr, rs, YBf16{y}, rows, N, K, part, sem, xn, W);
}
extern "C" __global__ void __launch_bounds__(WgSplit::THREADS, 1)
gemm_residual_split(const bf16 *__restrict__ x, const bf16 *__restrict__ W, bf16 *res, float *__restrict__ part,
                          int *__restrict__ sem, int rows, int N, int K) {
    gemm_wg<WgSplit>(nullptr, nullptr, nullptr, YAddRes{res}, rows, N, K, part, sem, x, W);
}
extern "C" __global__ void __launch_bounds__(WgSplit::THREADS, 1)
norm_gemm_swiglu_split(const bf16 *__restrict__ xn, const float *__restrict__ rs, const bf16 *__restrict__ W,
                             bf16 *__restrict__ act, float *__restrict__ part, int *__restrict__ sem, int rows, int N,
                             int K) {
    gemm_wg<WgSplit>(nullptr, nullptr, rs, YSwiGLU{act}, rows, N, K, part, sem, xn, W);
}
extern "C" __global__ void __launch_bounds__(WgSplit::THREADS, 1)
norm_gemm_rope_append_split(const bf16 *__restrict__ xn, const float *__restrict__ rs,
                                  const bf16 *__restrict__ W, bf16 *__restrict__ y, char *__restrict__ kv_state,
                                  const int *__restrict__ page_table, const int *__restrict__ cu_seqlens,
                                  const int *__restrict__ pos, const float *__restrict__ table,
                                  float *__restrict__ part, int *__restrict__ sem, int pages_per_seq, int rows,
                                  int n_seqs, int layer, int n_layers, int n_q_heads, int n_kv_heads, int head_dim,
                                  int page_tokens, int N, int K) {
    gemm_wg<WgSplit>(nullptr, nullptr, rs,
                     rope_append_y(y, kv_state, page_table, cu_seqlens, pos, table, pages_per_seq, n_seqs, layer,
                                   n_layers, n_q_heads, n_kv_heads, head_dim, page_tokens),
                     rows, N, K, part, sem, xn, W);
}
