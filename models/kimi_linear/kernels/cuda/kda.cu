// KDA (Kimi Delta Attention): the short causal convolution, the decay gate, the gated delta
// rule (chunked prefill and the one-token step) and the gated output norm. bf16 activations,
// fp32 math, the per-sequence state in fp32. Grids, blocks and shared memory: table.py.
//
// A slot of the `kda` state (slot_bytes, the used part first) holds every KDA layer's part,
// [layer][recurrent | window] in f32:
//   recurrent  [heads, dim, dim]             S (key dim x value dim) of each head
//   window     [conv - 1, 3 * heads * dim]   the last conv - 1 inputs of the convolution
// A sequence whose first row sits at position 0 starts from zeros, whatever its slot holds.
// mix rows are [q | k | v], each heads * dim wide. Each token t of a head (q, k L2-normed,
// q scaled by dim^-1/2, g_t <= 0 the per-channel log decay, beta_t = sigmoid(b_t)):
//   S <- diag(exp(g_t)) S;  S <- S + beta_t k_t (v_t - S^T k_t)^T;  o_t = S^T q_t
#include "common.cuh"

#define KDA_MAX_DIM 128
#include "kda_conv.cuh"  // kda_layer (a layer's part of a slot), the convolution (KDA_MAX_CONV taps)

// ---- the short convolution ----------------------------------------------------------------
// kda_conv and kda_conv_decode: kda_conv.cuh (one routine for prefill's rows and decode's one).

// ---- the decay gate -----------------------------------------------------------------------
// g = -exp(A_log[head]) * softplus(f + dt_bias) (softplus(x) = x above 20), in place. exp and
// log in double, each rounded to f32 where the reference rounds (its numpy does the same): the
// gate's output is f32 on both sides, so kern test holds it to a floor of a few f32 ulps, which
// expf's, logf's and numpy's own f32 errors went past. Grid (rows, ceil(heads * dim / 256)),
// block 256.
extern "C" __global__ void kda_gate(float *__restrict__ f, const bf16 *__restrict__ a_log,
                                    const bf16 *__restrict__ dt_bias, int rows, int heads, int dim) {
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (r >= rows || c >= heads * dim) return;
    float *p = f + (size_t)r * heads * dim + c;
    const float x = *p + to_f(dt_bias[c]);
    const float sp = x > 20.f ? x : (float)log((double)(1.f + (float)exp((double)x)));
    *p = -((float)exp((double)to_f(a_log[c / dim])) * sp);
}

// ---- the gated delta rule, chunked (prefill) -----------------------------------------------
// A block a (sequence, head) walks the sequence's rows `chunk` (at most the block's threads)
// at a time with S in shared memory. A chunk of n rows, gc the log decay summed from the chunk's start, D(i, j) =
// exp(gc_i - gc_j) per channel (j <= i):
//   T = (I - M)^-1, M[i, j] = -beta_i sum_d k_i k_j D(i, j) (j < i), by forward substitution
//   u = T (beta v);  w = T (beta k exp(gc));  v' = u - w S
//   o = (q exp(gc)) S + P v',  P[i, j] = sum_d q_i k_j D(i, j) (j <= i)
//   S <- exp(gc_last) S + (k exp(gc_last - gc))^T v'
// Every pairwise sum is a warp's (lanes over channels), every matrix product a thread an
// output element in a fixed order. Dynamic shared memory: table.py (kda_chunked).
extern "C" __global__ void kda_chunked(const bf16 *__restrict__ mix, const float *__restrict__ g,
                                       const float *__restrict__ b, char *__restrict__ state,
                                       const int *__restrict__ slot, const int *__restrict__ cu_seqlens,
                                       const int *__restrict__ pos, bf16 *__restrict__ o, int n_seqs, int layer,
                                       int layers, int heads, int dim, int conv, int slot_bytes, int chunk) {
    extern __shared__ float sm[];
    const int s = blockIdx.x, h = blockIdx.y;
    if (s >= n_seqs || h >= heads) return;
    const int r0 = cu_seqlens[s], r1 = cu_seqlens[s + 1];
    if (r1 == r0) return;
    const int D = dim, W = heads * dim, BC = chunk;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
    float *S = sm;                      // [D][D]
    float *Q = S + D * D;               // [BC][D]  q, then q exp(gc)
    float *K = Q + BC * D;              // [BC][D]
    float *V = K + BC * D;              // [BC][D]  v, then the inter-chunk output
    float *G = V + BC * D;              // [BC][D]  gc
    float *U = G + BC * D;              // [BC][D]  u, then v'
    float *Wm = U + BC * D;             // [BC][D]  w, then k exp(gc_last - gc)
    float *T = Wm + BC * D;             // [BC][BC + 1]
    float *P = T + BC * (BC + 1);       // [BC][BC + 1]
    float *beta = P + BC * (BC + 1);    // [BC]
    float *Sg = kda_layer(state, slot[s], slot_bytes, layer, heads, dim, conv) + (size_t)h * D * D;
    const bool fresh = pos[r0] == 0;
    for (int i = tid; i < D * D; i += nt) S[i] = fresh ? 0.f : Sg[i];
    const float qscale = rsqrtf((float)D);
    for (int c0 = r0; c0 < r1; c0 += BC) {
        const int n = min(BC, r1 - c0);
        __syncthreads();
        for (int idx = tid; idx < n * D; idx += nt) {
            const int i = idx / D, d = idx % D;
            const size_t row = (size_t)(c0 + i) * 3 * W + (size_t)h * D + d;
            Q[idx] = to_f(mix[row]);
            K[idx] = to_f(mix[row + W]);
            V[idx] = to_f(mix[row + 2 * W]);
            G[idx] = g[(size_t)(c0 + i) * W + (size_t)h * D + d];
        }
        for (int i = tid; i < n; i += nt) beta[i] = 1.f / (1.f + expf(-b[(size_t)(c0 + i) * heads + h]));
        __syncthreads();
        // L2 norms (a warp a row) and the running decay (a thread a channel)
        for (int i = warp; i < n; i += nw) {
            float sq = 0.f, sk = 0.f;
            for (int d = lane; d < D; d += 32) {
                sq += Q[i * D + d] * Q[i * D + d];
                sk += K[i * D + d] * K[i * D + d];
            }
            const float rq = qscale / sqrtf(warp_sum(sq) + 1e-6f), rk = 1.f / sqrtf(warp_sum(sk) + 1e-6f);
            for (int d = lane; d < D; d += 32) {
                Q[i * D + d] *= rq;
                K[i * D + d] *= rk;
            }
        }
        for (int d = tid; d < D; d += nt)
            for (int i = 1; i < n; ++i) G[i * D + d] += G[(i - 1) * D + d];
        __syncthreads();
        // M (into T, strictly lower) and P (lower with the diagonal): a warp a pair
        for (int pr = warp; pr < n * n; pr += nw) {
            const int i = pr / n, j = pr % n;
            if (j > i) {
                if (lane == 0) T[i * (BC + 1) + j] = 0.f, P[i * (BC + 1) + j] = 0.f;
                continue;
            }
            float a = 0.f, p = 0.f;
            for (int d = lane; d < D; d += 32) {
                const float kd = K[j * D + d] * expf(G[i * D + d] - G[j * D + d]);
                a += K[i * D + d] * kd;
                p += Q[i * D + d] * kd;
            }
            a = warp_sum(a);
            p = warp_sum(p);
            if (lane == 0) {
                T[i * (BC + 1) + j] = j < i ? -beta[i] * a : 0.f;
                P[i * (BC + 1) + j] = p;
            }
        }
        __syncthreads();
        // forward substitution, row by row: T[i, j] += sum_{j < m < i} T[i, m] T[m, j]
        for (int i = 2; i < n; ++i) {
            float t = 0.f;
            if (tid < i) {
                t = T[i * (BC + 1) + tid];
                for (int m = tid + 1; m < i; ++m) t += T[i * (BC + 1) + m] * T[m * (BC + 1) + tid];
            }
            __syncthreads();
            if (tid < i) T[i * (BC + 1) + tid] = t;
            __syncthreads();
        }
        for (int i = tid; i < n; i += nt) T[i * (BC + 1) + i] = 1.f;
        __syncthreads();
        // u = T (beta v), w = T (beta k exp(gc))
        for (int idx = tid; idx < n * D; idx += nt) {
            const int i = idx / D, d = idx % D;
            float u = 0.f, w = 0.f;
            for (int j = 0; j <= i; ++j) {
                const float t = T[i * (BC + 1) + j] * beta[j];
                u += t * V[j * D + d];
                w += t * K[j * D + d] * expf(G[j * D + d]);
            }
            U[idx] = u;
            Wm[idx] = w;
        }
        __syncthreads();
        for (int idx = tid; idx < n * D; idx += nt) Q[idx] *= expf(G[idx]);
        __syncthreads();
        // v' = u - w S (into U) and the inter-chunk output (q exp(gc)) S (into V)
        for (int idx = tid; idx < n * D; idx += nt) {
            const int i = idx / D, d = idx % D;
            float vn = U[idx], inter = 0.f;
            for (int e = 0; e < D; ++e) {
                const float se = S[e * D + d];
                vn -= Wm[i * D + e] * se;
                inter += Q[i * D + e] * se;
            }
            U[idx] = vn;
            V[idx] = inter;
        }
        __syncthreads();
        // o = inter + P v'; the state's update factors k exp(gc_last - gc) (into Wm)
        for (int idx = tid; idx < n * D; idx += nt) {
            const int i = idx / D, d = idx % D;
            float acc = V[idx];
            for (int j = 0; j <= i; ++j) acc += P[i * (BC + 1) + j] * U[j * D + d];
            o[(size_t)(c0 + i) * W + (size_t)h * D + d] = to_bf(acc);
            Wm[idx] = K[idx] * expf(G[(n - 1) * D + d] - G[idx]);
        }
        __syncthreads();
        // S <- exp(gc_last) S + (k exp(gc_last - gc))^T v'
        for (int idx = tid; idx < D * D; idx += nt) {
            const int e = idx / D, d = idx % D;
            float acc = S[idx] * expf(G[(n - 1) * D + e]);
            for (int i = 0; i < n; ++i) acc += Wm[i * D + e] * U[i * D + d];
            S[idx] = acc;
        }
    }
    __syncthreads();
    for (int i = tid; i < D * D; i += nt) Sg[i] = S[i];
}

// ---- the gated delta rule, a token at a time (decode, and the invariant prefill) ------------
// One token of one head, a thread a value column j of S (its D entries in registers: s[i] =
// S[i, j]), q, k (normed) and exp(g) in shared memory. Every operation is an explicitly rounded
// intrinsic in a fixed order over i, so the compiler may not contract or reorder it: the step
// has the same bits inlined into kda_step (a decode row) and kda_tokens (a prompt's rows in
// turn), and a token's output and state do not depend on which kernel stepped it, nor on where
// a prompt was cut. fresh: the sequence's first token (S is zero before it).
__device__ __forceinline__ float kda_token(float (&s)[KDA_MAX_DIM], bool fresh, const float *q, const float *k,
                                           const float *eg, float vj, float beta, int D) {
    float ks = 0.f;
    if (!fresh) {
#pragma unroll
        for (int i = 0; i < KDA_MAX_DIM; ++i)
            if (i < D) ks = __fmaf_rn(k[i], __fmul_rn(s[i], eg[i]), ks);
    }
    const float delta = __fmul_rn(__fsub_rn(vj, ks), beta);
    float out = 0.f;
#pragma unroll
    for (int i = 0; i < KDA_MAX_DIM; ++i)
        if (i < D) {
            const float sij = __fmaf_rn(k[i], delta, fresh ? 0.f : __fmul_rn(s[i], eg[i]));
            s[i] = sij;
            out = __fmaf_rn(q[i], sij, out);
        }
    return out;
}

// The per-token inputs of row r, head h, into shared memory (q and k L2-normed over the block,
// q scaled by dim^-1/2; exp(g)); v's column j and beta returned. Every thread of the block
// (blockDim.x = KDA_MAX_DIM) calls it: it synchronizes.
__device__ __forceinline__ void kda_token_inputs(const bf16 *mix, const float *g, const float *b, int r, int h,
                                                 int heads, int D, float *q, float *k, float *eg, float *scratch,
                                                 float &vj, float &beta) {
    const int j = threadIdx.x, W = heads * D;
    const size_t row = (size_t)r * 3 * W + (size_t)h * D;
    const float qj = j < D ? to_f(mix[row + j]) : 0.f, kj = j < D ? to_f(mix[row + W + j]) : 0.f;
    vj = j < D ? to_f(mix[row + 2 * W + j]) : 0.f;
    const float sq = block_sum(__fmul_rn(qj, qj), scratch);
    const float sk = block_sum(__fmul_rn(kj, kj), scratch);
    const float rq = __fdiv_rn(rsqrtf((float)D), __fsqrt_rn(__fadd_rn(sq, 1e-6f)));
    const float rk = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(sk, 1e-6f)));
    if (j < D) {
        q[j] = __fmul_rn(qj, rq);
        k[j] = __fmul_rn(kj, rk);
        eg[j] = expf(g[(size_t)r * W + (size_t)h * D + j]);
    }
    beta = __fdiv_rn(1.f, __fadd_rn(1.f, expf(-b[(size_t)r * heads + h])));
    __syncthreads();
}

// Decode: a block a (row, head), row r sequence r's one token. Grid (rows, heads), block 128.
extern "C" __global__ void kda_step(const bf16 *__restrict__ mix, const float *__restrict__ g,
                                    const float *__restrict__ b, char *__restrict__ state,
                                    const int *__restrict__ slot, const int *__restrict__ pos,
                                    bf16 *__restrict__ o, int rows, int layer, int layers, int heads, int dim,
                                    int conv, int slot_bytes) {
    __shared__ float q[KDA_MAX_DIM], k[KDA_MAX_DIM], eg[KDA_MAX_DIM], scratch[32];
    const int r = blockIdx.x, h = blockIdx.y, j = threadIdx.x, D = dim;
    if (r >= rows || h >= heads) return;
    float vj, beta;
    kda_token_inputs(mix, g, b, r, h, heads, D, q, k, eg, scratch, vj, beta);
    if (j >= D) return;
    float *S = kda_layer(state, slot[r], slot_bytes, layer, heads, dim, conv) + (size_t)h * D * D;
    const bool fresh = pos[r] == 0;
    float s[KDA_MAX_DIM];
#pragma unroll
    for (int i = 0; i < KDA_MAX_DIM; ++i) s[i] = (i < D && !fresh) ? S[(size_t)i * D + j] : 0.f;
    const float out = kda_token(s, fresh, q, k, eg, vj, beta, D);
#pragma unroll
    for (int i = 0; i < KDA_MAX_DIM; ++i)
        if (i < D) S[(size_t)i * D + j] = s[i];
    o[(size_t)r * heads * D + (size_t)h * D + j] = to_bf(out);
}

// Prefill, batch-invariant: a block a (sequence, head) walks the sequence's rows in order,
// each through decode's step (kda_token) with S's column in registers from the first row to
// the last: a token's output and the state after it are the bytes decode gives it, whatever
// the step's token budget cut the prompt into and whatever shares the step. The chunked
// kernel above is the faster form whose bits depend on the cut. Grid (n_seqs, heads), block 128.
extern "C" __global__ void kda_tokens(const bf16 *__restrict__ mix, const float *__restrict__ g,
                                      const float *__restrict__ b, char *__restrict__ state,
                                      const int *__restrict__ slot, const int *__restrict__ cu_seqlens,
                                      const int *__restrict__ pos, bf16 *__restrict__ o, int n_seqs, int layer,
                                      int layers, int heads, int dim, int conv, int slot_bytes) {
    __shared__ float q[KDA_MAX_DIM], k[KDA_MAX_DIM], eg[KDA_MAX_DIM], scratch[32];
    const int s_ = blockIdx.x, h = blockIdx.y, j = threadIdx.x, D = dim;
    if (s_ >= n_seqs || h >= heads) return;
    const int r0 = cu_seqlens[s_], r1 = cu_seqlens[s_ + 1];
    if (r1 == r0) return;
    float *S = kda_layer(state, slot[s_], slot_bytes, layer, heads, dim, conv) + (size_t)h * D * D;
    const bool fresh = pos[r0] == 0;
    float s[KDA_MAX_DIM];
#pragma unroll
    for (int i = 0; i < KDA_MAX_DIM; ++i) s[i] = (i < D && j < D && !fresh) ? S[(size_t)i * D + j] : 0.f;
    for (int r = r0; r < r1; ++r) {
        __syncthreads();  // every thread is done with the last token's q, k and exp(g)
        float vj, beta;
        kda_token_inputs(mix, g, b, r, h, heads, D, q, k, eg, scratch, vj, beta);
        if (j < D) {
            const float out = kda_token(s, fresh && r == r0, q, k, eg, vj, beta, D);
            o[(size_t)r * heads * D + (size_t)h * D + j] = to_bf(out);
        }
    }
    if (j < D) {
#pragma unroll
        for (int i = 0; i < KDA_MAX_DIM; ++i)
            if (i < D) S[(size_t)i * D + j] = s[i];
    }
}

// ---- the gated output norm ----------------------------------------------------------------
// y = rmsnorm(o per head) * w * sigmoid(gate). Grid (rows, heads), block 32 (a warp a head).
extern "C" __global__ void kda_out_norm(const bf16 *__restrict__ o, const bf16 *__restrict__ gate,
                                        const bf16 *__restrict__ w, bf16 *__restrict__ y, int rows, int heads,
                                        int dim, float eps) {
    const int r = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    if (r >= rows || h >= heads) return;
    const size_t base = (size_t)r * heads * dim + (size_t)h * dim;
    float ss = 0.f;
    for (int d = lane; d < dim; d += 32) ss += to_f(o[base + d]) * to_f(o[base + d]);
    const float rs = 1.f / sqrtf(warp_sum(ss) / (float)dim + eps);
    for (int d = lane; d < dim; d += 32) {
        const float gt = to_f(gate[base + d]);
        y[base + d] = to_bf(to_f(o[base + d]) * rs * to_f(w[d]) / (1.f + expf(-gt)));
    }
}
