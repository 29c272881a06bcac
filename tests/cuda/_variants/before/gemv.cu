// The decode projections (gemv.cuh holds the template and says how it works): the plain f32
// LM head and the fused variants, one launch each.
#include "gemv.cuh"

extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS, 2)
gemv_f32(const bf16 *__restrict__ x, const bf16 *__restrict__ W, float *__restrict__ y,
         int rows, int N, int K) {
    gemv(XPlain{x}, W, YF32{y}, rows, N, K);
}
// y = rmsnorm(res) * nw @ W^T: the RMSNorm fused into the projection that follows it.
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS, 2)
norm_gemv_bf16(const bf16 *__restrict__ res, const bf16 *__restrict__ nw,
               const bf16 *__restrict__ W, bf16 *__restrict__ y, int rows, int N, int K,
               float eps) {
    gemv(XNorm{res, nw, eps}, W, YBf16{y}, rows, N, K);
}
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS, 2)
norm_gemv_f32(const bf16 *__restrict__ res, const bf16 *__restrict__ nw,
              const bf16 *__restrict__ W, float *__restrict__ y, int rows, int N, int K,
              float eps) {
    gemv(XNorm{res, nw, eps}, W, YF32{y}, rows, N, K);
}
// res += x @ W^T: the projection fused with the residual add after it. It lets the next kernel
// launch at entry (early): in the llama decode chain that is a normed projection (gate/up, the
// next layer's qkv, the LM head), which before its wait only streams its weights, and this
// kernel's predecessor let it launch only after its own wait, so the order of writes holds
// (common.cuh). The figures are in docs/perf.md.
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS, 2)
gemv_residual(const bf16 *__restrict__ x, const bf16 *__restrict__ W, bf16 *res,
              int rows, int N, int K) {
    gemv(XPlain{x}, W, YAddRes{res}, rows, N, K, true);
}
// act = silu(gate) * up, [gate | up] = (rmsnorm(res) * nw) @ W^T, W = gate_up [2N, K]: the
// post-attention norm, the gate/up projection and SwiGLU in one launch. Grid
// ceil_div(N, GEMV_COLS / 2).
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS, 2)
norm_gemv_swiglu(const bf16 *__restrict__ res, const bf16 *__restrict__ nw, const bf16 *__restrict__ W,
                 bf16 *__restrict__ act, int rows, int N, int K, float eps) {
    gemv(XNorm{res, nw, eps}, W, YSwiGLU{act}, rows, N, K);
}
// qkv = (rmsnorm(res) * nw) @ W^T, then rope on q and k and the KV append of k and v: the
// input norm, the qkv projection, rope and the cache write of a decode layer in one launch.
// N = (n_q_heads + 2 n_kv_heads) * head_dim, head_dim % 16 == 0; y [rows, N]. Grid
// ceil_div(N, GEMV_COLS).
extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS, 2)
norm_gemv_rope_append(const bf16 *__restrict__ res, const bf16 *__restrict__ nw,
                      const bf16 *__restrict__ W, bf16 *__restrict__ y, char *__restrict__ kv_state,
                      const int *__restrict__ page_table, const int *__restrict__ cu_seqlens,
                      const int *__restrict__ pos, const float *__restrict__ table, int pages_per_seq,
                      int rows, int n_seqs, int layer, int n_layers, int n_q_heads, int n_kv_heads,
                      int head_dim, int page_tokens, int N, int K, float eps) {
    gemv(XNorm{res, nw, eps}, W,
         rope_append_y(y, kv_state, page_table, cu_seqlens, pos, table, pages_per_seq, n_seqs, layer, n_layers, n_q_heads,
                      n_kv_heads, head_dim, page_tokens), rows, N, K);
}
