// MLA (multi-head latent attention) over the paged latent cache, the up-projections absorbed:
// prefill and decode alike attend over the cached latents themselves (one shared "kv head" of
// kv_lora + rope channels), the query's key half mapped into latent space first (mla_absorb)
// and the weighted latent mapped out through kv_b's value half after (mla_expand).
// bf16 storage, fp32 math. Grids, blocks: table.py. mla_attend / mla_attend_decode are the
// faster build's attention (CUDA cores); the default build's is mla_tc.cu's, on tensor cores,
// between the same mla_absorb and mla_expand.
//
// The `kv` state, a page of page_tokens x token_bytes (the used part first):
// [layer][token][latent (kv_lora, RMS-normed) | key part (rope)] in bf16. Kimi-Linear rotates
// nothing (no rope), so the key part is stored as projected.
// q rows: [heads][nope | rope]; kv_b rows: [heads][nope key rows | v_dim value rows] x kv_lora.
#include "common.cuh"

#define MLA_MAX_W 576    // kv_lora + rope
#define MLA_MAX_LORA 512
#define MLA_ROWS 16      // rows a block of mla_absorb / mla_expand
#define MLA_TT 16        // cached tokens a tile of mla_attend
#define MLA_HEADS 8      // heads a block of mla_attend (a warp each)

__device__ __forceinline__ bf16 *mla_row(char *kv, int phys, int layer, int tok, int page_tokens, int width,
                                         int token_bytes) {
    return reinterpret_cast<bf16 *>(kv + (size_t)phys * page_tokens * token_bytes) +
           ((size_t)layer * page_tokens + tok) * width;
}

// ---- append -------------------------------------------------------------------------------
// The latent RMS-normed (as transformers: x / rms rounded to bf16, times the weight) and the
// key part copied, at the row's position in its sequence's pages. A block a row, 128 threads.
__device__ __forceinline__ void append_row(const bf16 *ckv, const bf16 *norm_w, char *kv, const int *table,
                                           int r, int p, int layer, int kv_lora, int rope, int page_tokens,
                                           int token_bytes, float eps) {
    __shared__ float scratch[32];
    const int width = kv_lora + rope;
    const bf16 *src = ckv + (size_t)r * width;
    float ss = 0.f;
    for (int c = threadIdx.x; c < kv_lora; c += blockDim.x) ss += to_f(src[c]) * to_f(src[c]);
    const float rs = 1.f / sqrtf(block_sum(ss, scratch) / (float)kv_lora + eps);
    bf16 *dst = mla_row(kv, table[p / page_tokens], layer, p % page_tokens, page_tokens, width, token_bytes);
    for (int c = threadIdx.x; c < width; c += blockDim.x)
        dst[c] = c < kv_lora ? to_bf(to_f(norm_w[c]) * rbf(to_f(src[c]) * rs)) : src[c];
}

extern "C" __global__ void mla_append(const bf16 *__restrict__ ckv, const bf16 *__restrict__ norm_w,
                                      char *__restrict__ kv, const int *__restrict__ page_table,
                                      const int *__restrict__ cu_seqlens, const int *__restrict__ pos,
                                      int pages_per_seq, int rows, int n_seqs, int layer, int layers, int kv_lora,
                                      int rope, int page_tokens, int token_bytes, float eps) {
    const int r = blockIdx.x;
    if (r >= rows) return;
    const int s = seq_of_row(cu_seqlens, n_seqs, r);
    append_row(ckv, norm_w, kv, page_table + (size_t)s * pages_per_seq, r, pos[r], layer, kv_lora, rope,
               page_tokens, token_bytes, eps);
}

extern "C" __global__ void mla_append_decode(const bf16 *__restrict__ ckv, const bf16 *__restrict__ norm_w,
                                             char *__restrict__ kv, const int *__restrict__ page_table,
                                             const int *__restrict__ pos, int pages_per_seq, int rows, int layer,
                                             int layers, int kv_lora, int rope, int page_tokens, int token_bytes,
                                             float eps) {
    const int r = blockIdx.x;
    if (r >= rows) return;
    append_row(ckv, norm_w, kv, page_table + (size_t)r * pages_per_seq, r, pos[r], layer, kv_lora, rope,
               page_tokens, token_bytes, eps);
}

// ---- absorb the key up-projection into the query -------------------------------------------
// q_lat[r, h, c] = sum_d q[r, h, d] * kv_b[h * (nope + v_dim) + d, c] (d < nope), f32.
// Grid (ceil(rows / MLA_ROWS), heads, ceil(kv_lora / 128)), block 128: a thread a latent
// channel c of MLA_ROWS rows, kv_b's rows streamed once for them.
extern "C" __global__ void mla_absorb(const bf16 *__restrict__ q, const bf16 *__restrict__ kv_b,
                                      float *__restrict__ q_lat, int rows, int heads, int nope, int rope,
                                      int v_dim, int kv_lora) {
    __shared__ float qs[MLA_ROWS][256];
    const int r0 = blockIdx.x * MLA_ROWS, h = blockIdx.y, c = blockIdx.z * blockDim.x + threadIdx.x;
    const int n = min(MLA_ROWS, rows - r0), qd = nope + rope;
    for (int idx = threadIdx.x; idx < n * nope; idx += blockDim.x)
        qs[idx / nope][idx % nope] = to_f(q[(size_t)(r0 + idx / nope) * heads * qd + (size_t)h * qd + idx % nope]);
    __syncthreads();
    if (c >= kv_lora) return;
    float acc[MLA_ROWS];
#pragma unroll
    for (int i = 0; i < MLA_ROWS; ++i) acc[i] = 0.f;
    const bf16 *wk = kv_b + (size_t)h * (nope + v_dim) * kv_lora + c;
    for (int d = 0; d < nope; ++d) {
        const float w = to_f(wk[(size_t)d * kv_lora]);
#pragma unroll
        for (int i = 0; i < MLA_ROWS; ++i) acc[i] += qs[i][d] * w;
    }
    for (int i = 0; i < n; ++i) q_lat[((size_t)(r0 + i) * heads + h) * kv_lora + c] = acc[i];
}

// ---- attend over the latents --------------------------------------------------------------
// A block a (row, MLA_HEADS heads), a warp a head: the row's cached tokens 0..pos[r] in tiles
// of MLA_TT (loaded once for the block's heads), a score a token (lanes over channels, one
// warp sum), an online softmax in log2 units; o_lat[r, h, :] = softmax . latents (f32).
// Grid (rows, ceil(heads / MLA_HEADS)), block 32 * MLA_HEADS.
__device__ __forceinline__ void attend_row(const float *q_lat, const bf16 *q, char *kv, const int *table, float *o_lat,
                                           int r, int ctx, int layer, int heads, int nope, int rope, int kv_lora,
                                           int page_tokens, int token_bytes) {
    __shared__ float qs[MLA_HEADS][MLA_MAX_W];
    __shared__ __align__(16) bf16 lat[MLA_TT][MLA_MAX_W];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.y * MLA_HEADS + warp, width = kv_lora + rope, qd = nope + rope;
    const float scale = rsqrtf((float)qd) * LOG2E;
    if (h < heads)
        for (int c = lane; c < width; c += 32)
            qs[warp][c] = scale * (c < kv_lora ? q_lat[((size_t)r * heads + h) * kv_lora + c]
                                               : to_f(q[(size_t)r * heads * qd + (size_t)h * qd + nope + c - kv_lora]));
    float acc[MLA_MAX_LORA / 32];
#pragma unroll
    for (int m = 0; m < MLA_MAX_LORA / 32; ++m) acc[m] = 0.f;
    float mx = -INFINITY, l = 0.f;
    const int n8 = width >> 3;
    for (int t0 = 0; t0 < ctx; t0 += MLA_TT) {
        const int nt = min(MLA_TT, ctx - t0);
        __syncthreads();  // the previous tile is read by every warp (and qs written, the first time)
        for (int idx = threadIdx.x; idx < nt * n8; idx += blockDim.x) {
            const int tt = idx / n8, j = idx % n8, t = t0 + tt;
            const bf16 *src = mla_row(kv, table[t / page_tokens], layer, t % page_tokens, page_tokens, width,
                                      token_bytes);
            reinterpret_cast<uint4 *>(&lat[tt][0])[j] = reinterpret_cast<const uint4 *>(src)[j];
        }
        __syncthreads();
        if (h >= heads) continue;
        float mine = -INFINITY;
        for (int tt = 0; tt < nt; ++tt) {
            float part = 0.f;
            for (int c = lane; c < width; c += 32) part += qs[warp][c] * to_f(lat[tt][c]);
            part = warp_sum(part);
            if (lane == tt) mine = part;
        }
        const float m_new = fmaxf(mx, warp_max(mine));
        const float alpha = exp2f(mx - m_new);
        const float p = lane < nt ? exp2f(mine - m_new) : 0.f;
        l = l * alpha + warp_sum(p);
        mx = m_new;
#pragma unroll
        for (int m = 0; m < MLA_MAX_LORA / 32; ++m) acc[m] *= alpha;
        for (int tt = 0; tt < nt; ++tt) {
            const float pt = __shfl_sync(0xffffffffu, p, tt);
#pragma unroll
            for (int m = 0; m < MLA_MAX_LORA / 32; ++m)
                if (lane + 32 * m < kv_lora) acc[m] += pt * to_f(lat[tt][lane + 32 * m]);
        }
    }
    if (h >= heads) return;
    const float inv = 1.f / l;
#pragma unroll
    for (int m = 0; m < MLA_MAX_LORA / 32; ++m)
        if (lane + 32 * m < kv_lora) o_lat[((size_t)r * heads + h) * kv_lora + lane + 32 * m] = acc[m] * inv;
}

extern "C" __global__ void mla_attend(const float *__restrict__ q_lat, const bf16 *__restrict__ q,
                                      char *__restrict__ kv, const int *__restrict__ page_table,
                                      const int *__restrict__ cu_seqlens, const int *__restrict__ pos,
                                      float *__restrict__ o_lat, int pages_per_seq, int rows, int n_seqs, int layer,
                                      int layers, int heads, int nope, int rope, int kv_lora, int page_tokens,
                                      int token_bytes) {
    const int r = blockIdx.x;
    if (r >= rows) return;
    const int s = seq_of_row(cu_seqlens, n_seqs, r);
    attend_row(q_lat, q, kv, page_table + (size_t)s * pages_per_seq, o_lat, r, pos[r] + 1, layer, heads, nope, rope,
               kv_lora, page_tokens, token_bytes);
}

extern "C" __global__ void mla_attend_decode(const float *__restrict__ q_lat, const bf16 *__restrict__ q,
                                             char *__restrict__ kv, const int *__restrict__ page_table,
                                             const int *__restrict__ pos, float *__restrict__ o_lat,
                                             int pages_per_seq, int rows, int layer, int layers, int heads, int nope,
                                             int rope, int kv_lora, int page_tokens, int token_bytes) {
    const int r = blockIdx.x;
    if (r >= rows) return;
    attend_row(q_lat, q, kv, page_table + (size_t)r * pages_per_seq, o_lat, r, pos[r] + 1, layer, heads, nope, rope,
               kv_lora, page_tokens, token_bytes);
}

// ---- expand through the value up-projection ------------------------------------------------
// o[r, h * v_dim + j] = sum_c o_lat[r, h, c] * kv_b[h * (nope + v_dim) + nope + j, c], bf16.
// Grid (ceil(rows / MLA_ROWS), heads), block 256: a warp an output column j at a time (lanes
// over c, kv_b's row read once for MLA_ROWS rows), one warp sum a row.
extern "C" __global__ void mla_expand(const float *__restrict__ o_lat, const bf16 *__restrict__ kv_b,
                                      bf16 *__restrict__ o, int rows, int heads, int nope, int v_dim, int kv_lora) {
    __shared__ float ol[MLA_ROWS][MLA_MAX_LORA];
    const int r0 = blockIdx.x * MLA_ROWS, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int n = min(MLA_ROWS, rows - r0);
    for (int idx = threadIdx.x; idx < n * kv_lora; idx += blockDim.x)
        ol[idx / kv_lora][idx % kv_lora] = o_lat[((size_t)(r0 + idx / kv_lora) * heads + h) * kv_lora + idx % kv_lora];
    __syncthreads();
    for (int j = warp; j < v_dim; j += blockDim.x >> 5) {
        const bf16 *wv = kv_b + ((size_t)h * (nope + v_dim) + nope + j) * kv_lora;
        float w[MLA_MAX_LORA / 32];
#pragma unroll
        for (int m = 0; m < MLA_MAX_LORA / 32; ++m) w[m] = lane + 32 * m < kv_lora ? to_f(wv[lane + 32 * m]) : 0.f;
        for (int i = 0; i < n; ++i) {
            float part = 0.f;
#pragma unroll
            for (int m = 0; m < MLA_MAX_LORA / 32; ++m)
                if (lane + 32 * m < kv_lora) part += ol[i][lane + 32 * m] * w[m];
            part = warp_sum(part);
            if (lane == 0) o[(size_t)(r0 + i) * heads * v_dim + (size_t)h * v_dim + j] = to_bf(part);
        }
    }
}
