// The llama-family decode as one persistent kernel (sm_90a): a cooperative grid walks a fixed
// list of phases, crossing a software grid barrier between them, for as many steps as the
// generation needs (prompt chunks first, then one fed-back token a sequence), in one launch.
//
// Phases of one step (phase numbers: PH_* below; a layer has five):
//   embed      x[r] = embed[id[r]]
//   qkv        rmsnorm(x) @ qkv_w^T, rope on q and k, k and v appended to the paged KV state
//   attention  a block per (row, kv head): the whole causal context, fp32 online softmax
//   o          x += attn @ o_w^T
//   mlp        act = silu(gate) * up, [gate | up] = rmsnorm(x) @ gate_up_w^T
//   down       x += act @ down_w^T
//   lm_head    logits = rmsnorm(x[last row of each sequence]) @ lm_head^T
//   argmax     partial maxima per (row, chunk of the vocabulary)
//   pick       every block reduces the partials itself and feeds the token back (no barrier)
// The projections are gemv.cuh's (the same tiles, the same Y epilogues, the same reduction
// order: the same bits as the per-op kernels), taken by the grid's blocks tile after tile.
//
// Bitwise determinism: a row's results never depend on the other rows of the step (the gemv
// sums a row in its own mma column, attention is a block per (row, kv head) in a fixed order),
// so prompts consumed in chunks, token by token or beside other sequences give the same bits;
// reductions are fixed trees and there are no float atomics. phase_lo / phase_hi run a range
// of phases of one step (the debug mode launches one phase a launch): the same code on the same
// data, so the same bits as the fused launch.
//
// The grid barrier is a counter and a generation word in `bar` (u32[2], zero before the first
// launch, the counter zero again after every barrier): thread 0 of each block arrives with a
// release add and the last to arrive resets the counter and bumps the generation (release);
// the others spin on the generation (acquire). It deadlocks unless every block is resident:
// the runtime refuses a cooperative grid the occupancy API says cannot be co-resident. Data
// another block wrote is read at L2 (ld.global.cg), never through a possibly stale L1 line.
//
// Row layout of a step (every block computes it, the same, in shared memory): sequence s has
// prompt tokens ids[cu_seqlens[s] .. cu_seqlens[s+1]) from position pos[cu_seqlens[s]]; a step
// takes up to `chunk` of its unconsumed prompt tokens, or, once the prompt is consumed, the
// token the previous step picked; a sequence that has produced max_new tokens takes none. A
// step's rows are capped at MEGA_MAX_ROWS (the rest wait a step: a row's bits do not depend on
// its step). The loop ends when no sequence takes a row, or after max_steps.
#include "gemv.cuh"

#define MEGA_THREADS (32 * GEMV_WARPS)
#define MEGA_MAX_ROWS 64
#define MEGA_MAX_SEQS 32
#define MEGA_MAX_G 8
#define MEGA_MAX_HD 128
#define PER_LAYER 6   // pointers table: ln1, qkv_w, o_w, ln2, gate_up_w, down_w a layer, then
#define GLOBALS 3     // embed, final_norm, lm_head
static_assert(MEGA_THREADS == 256, "the attention and argmax phases are laid out for 8 warps");

enum { PH_EMBED = 0, PH_LAYER = 1, PH_PER_LAYER = 5 };

// ---- the grid barrier ---------------------------------------------------------------------
__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void grid_barrier(unsigned *bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned gen = ld_acquire(bar + 1);  // cannot move before every block arrived
        __threadfence();
        unsigned old;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(bar) : "memory");
        if (old == gridDim.x - 1) {
            asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(bar) : "memory");
            asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(bar + 1), "r"(gen + 1) : "memory");
        } else {
            while (ld_acquire(bar + 1) == gen) __nanosleep(32);
        }
        __threadfence();
    }
    __syncthreads();
}

// ---- the step's rows ----------------------------------------------------------------------
struct Layout {
    int n_rows, n_lm;
    int id[MEGA_MAX_ROWS], pos[MEGA_MAX_ROWS];
    int cu[MEGA_MAX_SEQS + 1];
    int lm_row[MEGA_MAX_SEQS], lm_seq[MEGA_MAX_SEQS];
    // per sequence, across steps
    int consumed[MEGA_MAX_SEQS], fed[MEGA_MAX_SEQS], next_pos[MEGA_MAX_SEQS], n_gen[MEGA_MAX_SEQS];
};

__device__ void plan_step(Layout &L, const int *ids, const int *pos, const int *cu_in, int n_seqs, int chunk,
                          int max_new) {
    if (threadIdx.x == 0) {
        int r = 0;
        L.n_lm = 0;
        for (int s = 0; s < n_seqs; ++s) {
            L.cu[s] = r;
            const int p0 = cu_in[s], plen = cu_in[s + 1] - p0;
            if (L.n_gen[s] >= max_new || plen < 1) continue;
            if (L.consumed[s] < plen) {
                const int k = min(min(chunk, plen - L.consumed[s]), MEGA_MAX_ROWS - r);
                for (int i = 0; i < k; ++i, ++r) {
                    L.id[r] = ids[p0 + L.consumed[s] + i];
                    L.pos[r] = pos[p0] + L.consumed[s] + i;
                }
                L.consumed[s] += k;
                if (k > 0 && L.consumed[s] == plen) {
                    L.lm_row[L.n_lm] = r - 1;
                    L.lm_seq[L.n_lm++] = s;
                }
            } else if (r < MEGA_MAX_ROWS) {
                L.id[r] = L.fed[s];
                L.pos[r] = L.next_pos[s];
                L.lm_row[L.n_lm] = r;
                L.lm_seq[L.n_lm++] = s;
                ++r;
            }
            if (r > L.cu[s]) L.next_pos[s] = L.pos[r - 1] + 1;
        }
        L.cu[n_seqs] = r;
        L.n_rows = r;
    }
    __syncthreads();
}

// ---- projections: gemv.cuh's pass, one tile at a time ---------------------------------------
// gemv_pass without programmatic dependent launch and with the tile given (not blockIdx.x):
// the same loads, mma order and reduction, so the same bits as the per-op kernels.
template <int NT, class X, class Y>
__device__ __forceinline__ void mega_pass(const X &xs, const bf16 *__restrict__ W, const Y &ys, int tile, int r0,
                                          int R, int N, int K, char *smem, float *ssr) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = GEMV_COLS * tile;
    bf16 *xw = reinterpret_cast<bf16 *>(smem + warp * GEMV_WARP_SMEM);
    auto red = [&](int w) { return reinterpret_cast<float *>(smem + w * GEMV_WARP_SMEM); };
    int row0, row1;
    bool ok0, ok1;
    if constexpr (Y::PAIRED) {
        ok0 = ok1 = ys.wrows(tile, g, N, row0, row1);
    } else {
        row0 = n0 + g;
        row1 = n0 + g + 8;
        ok0 = row0 < N;
        ok1 = row1 < N;
    }
    const bf16 *w0 = W + (size_t)(ok0 ? row0 : 0) * K;
    const bf16 *w1 = W + (size_t)(ok1 ? row1 : 0) * K;
    uint4 a[GEMV_KU], b[GEMV_KU];
    int kb = warp * GEMV_UNIT;
    ld_unit(a, b, w0, w1, ok0, ok1, kb, t, K);
    if constexpr (X::NORM) ssr[warp * 8 * GEMV_MAX_NT + lane] = 0.f;
    float c[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.f;
    while (kb < K) {
        if constexpr (X::NORM) {
            const int kc = kb + 8 * lane;
            const bool okc = kc < K;
            const uint4 nw = xs.weight(okc ? kc : 0);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                __syncwarp();
#pragma unroll
                for (int i0 = 0; i0 < 8; i0 += GEMV_STAGE_ROWS) {
                    uint4 raw[GEMV_STAGE_ROWS];
#pragma unroll
                    for (int i = 0; i < GEMV_STAGE_ROWS; ++i)
                        if (nt * 8 + i0 + i < R) raw[i] = xs.fetch(r0 + nt * 8 + i0 + i, okc ? kc : 0, K);
#pragma unroll
                    for (int i = 0; i < GEMV_STAGE_ROWS; ++i) {
                        if (nt * 8 + i0 + i < R) {
                            float ss = 0.f;
                            *reinterpret_cast<uint4 *>(xw + (i0 + i) * GEMV_XLD + 8 * lane) =
                                xs.form(raw[i], nw, okc, ss);
                            ss = warp_sum(ss);
                            if (lane == 0) ssr[warp * 8 * GEMV_MAX_NT + nt * 8 + i0 + i] += ss;
                        }
                    }
                }
                __syncwarp();
#pragma unroll
                for (int u = 0; u < GEMV_KU; ++u) {
                    const uint4 xv = *reinterpret_cast<const uint4 *>(xw + g * GEMV_XLD + 32 * u + 8 * t);
                    mma_bf16(c[nt], a[u].x, b[u].x, a[u].y, b[u].y, xv.x, xv.y);
                    mma_bf16(c[nt], a[u].z, b[u].z, a[u].w, b[u].w, xv.z, xv.w);
                }
            }
        } else {
#pragma unroll
            for (int u = 0; u < GEMV_KU; ++u) {
                const int k = kb + 32 * u + 8 * t;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const int row = nt * 8 + g;
                    const uint4 xv = (row < R && k < K) ? xs.fetch(r0 + row, k, K) : make_uint4(0, 0, 0, 0);
                    mma_bf16(c[nt], a[u].x, b[u].x, a[u].y, b[u].y, xv.x, xv.y);
                    mma_bf16(c[nt], a[u].z, b[u].z, a[u].w, b[u].w, xv.z, xv.w);
                }
            }
        }
        kb += GEMV_WARPS * GEMV_UNIT;
        if (kb < K) ld_unit(a, b, w0, w1, ok0, ok1, kb, t, K);
    }
    __syncwarp();
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) red(warp)[(nt * 4 + i) * 32 + lane] = c[nt][i];
    __syncthreads();
    for (int j = threadIdx.x; j < NT * 4 * 32; j += blockDim.x) {
        const int q = j >> 5, l = j & 31;
        const int nt = q >> 2, i = q & 3;
        const int row = nt * 8 + 2 * (l & 3) + (i & 1);
        if (row >= R) continue;
        float scale = 1.f;
        if constexpr (X::NORM) {
            float s = 0.f;
#pragma unroll
            for (int w = 0; w < GEMV_WARPS; ++w) s += ssr[w * 8 * GEMV_MAX_NT + row];
            scale = 1.f / sqrtf(s / (float)K + xs.eps);
        }
        if constexpr (Y::PAIRED) {
            int w0_, w1_;
            if (i < 2 && ys.wrows(tile, l >> 2, N, w0_, w1_)) {
                float as = 0.f, bs = 0.f;
#pragma unroll
                for (int w = 0; w < GEMV_WARPS; ++w) {
                    as += red(w)[q * 32 + l];
                    bs += red(w)[(q + 2) * 32 + l];
                }
                ys.put(r0 + row, tile, l >> 2, N, as * scale, bs * scale);
            }
        } else {
            const int col = n0 + (l >> 2) + (i >= 2 ? 8 : 0);
            if (col < N) {
                float v = 0.f;
#pragma unroll
                for (int w = 0; w < GEMV_WARPS; ++w) v += red(w)[q * 32 + l];
                ys.put((size_t)(r0 + row) * N + col, v * scale);
            }
        }
    }
    __syncthreads();
}

// y over `rows` rows, the grid's blocks taking tiles tile = blockIdx.x, + gridDim.x, ...
template <class X, class Y>
__device__ void mega_gemv(const X &xs, const bf16 *W, const Y &ys, int rows, int N, int K, int n_tiles,
                          char *smem, float *ssr) {
    for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x)
        for (int r0 = 0; r0 < rows; r0 += 8 * GEMV_MAX_NT) {
            const int R = min(8 * GEMV_MAX_NT, rows - r0);
            if (R <= 8) mega_pass<1>(xs, W, ys, tile, r0, R, N, K, smem, ssr);
            else if (R <= 16) mega_pass<2>(xs, W, ys, tile, r0, R, N, K, smem, ssr);
            else mega_pass<4>(xs, W, ys, tile, r0, R, N, K, smem, ssr);
        }
}

// rmsnorm(res[rows[j]]) * w: XNorm over a gathered subset of rows (the LM head's last rows).
struct XNormRows {
    static constexpr bool NORM = true;
    XNorm base;
    const int *rows;
    float eps;
    __device__ uint4 weight(int k) const { return base.weight(k); }
    __device__ uint4 fetch(int row, int k, int K) const { return ld_act(base.res + (size_t)rows[row] * K + k); }
    __device__ uint4 form(const uint4 &v, const uint4 &nw, bool ok, float &ss) const {
        return base.form(v, nw, ok, ss);
    }
};

// ---- attention: a block per (row, kv head) -------------------------------------------------
// Warp w takes tokens w, w + 8, ... of the row's context 0..pos: a lane holds head_dim / 32
// elements of each of the G query heads, of k and of v; a score is a warp sum (xor tree); each
// warp keeps an online softmax per head (log2 units). The 8 warps merge in order.
struct AttnSmem {
    float m[GEMV_WARPS][MEGA_MAX_G], l[GEMV_WARPS][MEGA_MAX_G];
    float acc[GEMV_WARPS][MEGA_MAX_G][MEGA_MAX_HD];
};

template <int HD>
__device__ void attend(const bf16 *qkv, const char *kv_state, const int *page_table, const Layout &Lo, int r,
                       int kh, bf16 *attn, int pages_per_seq, int n_seqs, int layer, int n_layers, int n_q_heads,
                       int n_kv_heads, int page_tokens, AttnSmem &sm) {
    constexpr int E = HD / 32;  // elements a lane
    const int G = n_q_heads / n_kv_heads, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int qkv_dim = (n_q_heads + 2 * n_kv_heads) * HD;
    const int s = seq_of_row(Lo.cu, n_seqs, r), p = Lo.pos[r];
    const float scale = LOG2E / sqrtf((float)HD);
    float q[MEGA_MAX_G][E], acc[MEGA_MAX_G][E], m[MEGA_MAX_G], l[MEGA_MAX_G];
#pragma unroll
    for (int g = 0; g < MEGA_MAX_G; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            acc[g][e] = 0.f;
            q[g][e] = g < G ? to_f(__ldcg(qkv + (size_t)r * qkv_dim + (kh * G + g) * HD + lane * E + e)) * scale
                            : 0.f;
        }
    }
    for (int t = warp; t <= p; t += GEMV_WARPS) {
        const int phys = page_table[(size_t)s * pages_per_seq + t / page_tokens];
        const bf16 *k = reinterpret_cast<const bf16 *>(
            kv_state + kv_offset(phys, layer, 0, kh, t % page_tokens, n_layers, n_kv_heads, HD, page_tokens));
        const bf16 *v = reinterpret_cast<const bf16 *>(
            kv_state + kv_offset(phys, layer, 1, kh, t % page_tokens, n_layers, n_kv_heads, HD, page_tokens));
        float kf[E], vf[E];
#pragma unroll
        for (int e = 0; e < E; ++e) {
            kf[e] = to_f(__ldcg(k + lane * E + e));
            vf[e] = to_f(__ldcg(v + lane * E + e));
        }
#pragma unroll
        for (int g = 0; g < MEGA_MAX_G; ++g) {
            if (g >= G) break;
            float d = 0.f;
#pragma unroll
            for (int e = 0; e < E; ++e) d += q[g][e] * kf[e];
            d = warp_sum(d);
            const float mn = fmaxf(m[g], d), c = exp2f(m[g] - mn), pe = exp2f(d - mn);
            l[g] = l[g] * c + pe;
#pragma unroll
            for (int e = 0; e < E; ++e) acc[g][e] = acc[g][e] * c + pe * vf[e];
            m[g] = mn;
        }
    }
    for (int g = 0; g < G; ++g) {
        if (lane == 0) {
            sm.m[warp][g] = m[g];
            sm.l[warp][g] = l[g];
        }
#pragma unroll
        for (int e = 0; e < E; ++e) sm.acc[warp][g][lane * E + e] = acc[g][e];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
        const int g = i / HD, d = i % HD;
        float M = -INFINITY;
        for (int w = 0; w < GEMV_WARPS; ++w) M = fmaxf(M, sm.m[w][g]);
        float den = 0.f, num = 0.f;
        for (int w = 0; w < GEMV_WARPS; ++w) {
            const float f = exp2f(sm.m[w][g] - M);  // 0 for a warp without tokens (m = -inf)
            den += sm.l[w][g] * f;
            num += sm.acc[w][g][d] * f;
        }
        attn[(size_t)r * n_q_heads * HD + (kh * G + g) * HD + d] = to_bf(num / den);
    }
    __syncthreads();
}

// ---- argmax: ties to the lowest index, NaN never wins -------------------------------------
__device__ __forceinline__ void better(float &v, int &i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}
__device__ __forceinline__ void warp_best(float &v, int &i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, i, o);
        better(v, i, v2, i2);
    }
}

union MegaSmem {
    struct {
        __align__(16) char tiles[GEMV_WARPS * GEMV_WARP_SMEM];
        float ssr[GEMV_WARPS * 8 * GEMV_MAX_NT];
    } g;
    AttnSmem a;
    struct {
        float v[GEMV_WARPS];
        int i[GEMV_WARPS];
    } am;
};

extern "C" __global__ void __launch_bounds__(MEGA_THREADS, 1)
mega_decode(const unsigned long long *__restrict__ wt, char *__restrict__ kv_state,
            const int *__restrict__ page_table, const int *__restrict__ ids, const int *__restrict__ pos,
            const int *__restrict__ cu_seqlens, const float *__restrict__ rope, bf16 *__restrict__ x,
            bf16 *__restrict__ qkv, bf16 *__restrict__ attn, bf16 *__restrict__ act, float *__restrict__ logits,
            float *__restrict__ arg_val, int *__restrict__ arg_idx, int *__restrict__ tokens, unsigned *bar,
            int n_seqs, int pages_per_seq, int n_layers, int hidden, int inter, int n_q_heads, int n_kv_heads,
            int head_dim, int page_tokens, int vocab, int chunks, int chunk, int max_new, int max_steps,
            int phase_lo, int phase_hi, float eps) {
    __shared__ MegaSmem sm;
    __shared__ Layout Lo;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int qkv_dim = (n_q_heads + 2 * n_kv_heads) * head_dim, q_dim = n_q_heads * head_dim;
    const bf16 *const *W = reinterpret_cast<const bf16 *const *>(wt);
    const bf16 *embed = W[n_layers * PER_LAYER], *final_norm = W[n_layers * PER_LAYER + 1];
    const bf16 *lm_head = W[n_layers * PER_LAYER + 2];
    const int ph_lm = PH_LAYER + PH_PER_LAYER * n_layers, ph_argmax = ph_lm + 1, ph_pick = ph_lm + 2;
    if (tid < MEGA_MAX_SEQS) {
        Lo.consumed[tid] = 0;
        Lo.n_gen[tid] = 0;
    }
    __syncthreads();
    // Runs phase ph when it is in [phase_lo, phase_hi); a barrier after it unless it ends the range.
    auto in = [&](int ph) { return ph >= phase_lo && ph < phase_hi; };
    auto done = [&](int ph) {
        if (ph + 1 < phase_hi) grid_barrier(bar);
    };

    for (int step = 0; step < max_steps; ++step) {
        plan_step(Lo, ids, pos, cu_seqlens, n_seqs, chunk, max_new);
        const int R = Lo.n_rows;
        if (R == 0) break;
        if (in(PH_EMBED)) {
            const int per_row = hidden / 8;
            for (int i = blockIdx.x * blockDim.x + tid; i < R * per_row; i += gridDim.x * blockDim.x) {
                const int r = i / per_row, c = (i - r * per_row) * 8;
                *reinterpret_cast<uint4 *>(x + (size_t)r * hidden + c) =
                    __ldg(reinterpret_cast<const uint4 *>(embed + (size_t)Lo.id[r] * hidden + c));
            }
            done(PH_EMBED);
        }
        for (int layer = 0; layer < n_layers; ++layer) {
            const bf16 *const *lw = W + layer * PER_LAYER;
            const int ph = PH_LAYER + PH_PER_LAYER * layer;
            if (in(ph)) {  // qkv, rope, KV append
                KvAppend app{nullptr, kv_state, page_table, Lo.cu, pages_per_seq, n_seqs, layer, n_layers,
                             page_tokens};
                YRopeAppend y{qkv, Lo.pos, rope, app, n_q_heads, n_kv_heads, head_dim};
                mega_gemv(XNorm{x, lw[0], eps}, lw[1], y, R, qkv_dim, hidden, qkv_dim / GEMV_COLS, sm.g.tiles,
                          sm.g.ssr);
                done(ph);
            }
            if (in(ph + 1)) {  // attention
                for (int item = blockIdx.x; item < R * n_kv_heads; item += gridDim.x) {
                    const int r = item / n_kv_heads, kh = item - r * n_kv_heads;
                    if (head_dim == 64)
                        attend<64>(qkv, kv_state, page_table, Lo, r, kh, attn, pages_per_seq, n_seqs, layer,
                                   n_layers, n_q_heads, n_kv_heads, page_tokens, sm.a);
                    else
                        attend<128>(qkv, kv_state, page_table, Lo, r, kh, attn, pages_per_seq, n_seqs, layer,
                                    n_layers, n_q_heads, n_kv_heads, page_tokens, sm.a);
                }
                done(ph + 1);
            }
            if (in(ph + 2)) {  // o projection into the residual stream
                mega_gemv(XPlain{attn}, lw[2], YAddRes{x}, R, hidden, q_dim, (hidden + GEMV_COLS - 1) / GEMV_COLS,
                          sm.g.tiles, sm.g.ssr);
                done(ph + 2);
            }
            if (in(ph + 3)) {  // norm, gate/up, SwiGLU
                mega_gemv(XNorm{x, lw[3], eps}, lw[4], YSwiGLU{act}, R, inter, hidden,
                          (inter + GEMV_COLS / 2 - 1) / (GEMV_COLS / 2), sm.g.tiles, sm.g.ssr);
                done(ph + 3);
            }
            if (in(ph + 4)) {  // down projection into the residual stream
                mega_gemv(XPlain{act}, lw[5], YAddRes{x}, R, hidden, inter, (hidden + GEMV_COLS - 1) / GEMV_COLS,
                          sm.g.tiles, sm.g.ssr);
                done(ph + 4);
            }
        }
        const int n_lm = Lo.n_lm;
        if (in(ph_lm)) {  // final norm and LM head of each sequence's last row
            mega_gemv(XNormRows{XNorm{x, final_norm, eps}, Lo.lm_row, eps}, lm_head, YF32{logits}, n_lm, vocab,
                      hidden, (vocab + GEMV_COLS - 1) / GEMV_COLS, sm.g.tiles, sm.g.ssr);
            done(ph_lm);
        }
        const int cs = (vocab + chunks - 1) / chunks;
        if (in(ph_argmax)) {  // partial maxima: a block per (row, chunk)
            for (int item = blockIdx.x; item < n_lm * chunks; item += gridDim.x) {
                const int j = item / chunks, c = item - j * chunks;
                const int end = min((c + 1) * cs, vocab);
                float v = -INFINITY;
                int i = INT_MAX;
                for (int k = c * cs + tid; k < end; k += blockDim.x) better(v, i, __ldcg(logits + (size_t)j * vocab + k), k);
                warp_best(v, i);
                if (lane == 0) {
                    sm.am.v[warp] = v;
                    sm.am.i[warp] = i;
                }
                __syncthreads();
                if (tid == 0) {
                    for (int w = 1; w < GEMV_WARPS; ++w) better(v, i, sm.am.v[w], sm.am.i[w]);
                    arg_val[j * chunks + c] = v;
                    arg_idx[j * chunks + c] = i;
                }
                __syncthreads();
            }
            done(ph_argmax);
        }
        if (in(ph_pick)) {  // every block picks every row's token (no barrier): warp j % 8 takes row j
            for (int j = warp; j < n_lm; j += GEMV_WARPS) {
                float v = -INFINITY;
                int i = INT_MAX;
                for (int c = lane; c < chunks; c += 32) better(v, i, __ldcg(arg_val + j * chunks + c),
                                                               __ldcg(arg_idx + j * chunks + c));
                warp_best(v, i);
                if (lane == 0) {
                    const int s = Lo.lm_seq[j], tok = i == INT_MAX ? -1 : i;
                    Lo.fed[s] = tok < 0 ? 0 : tok;  // a row of only NaN: -1 out, token 0 fed back
                    if (blockIdx.x == 0) tokens[s * max_new + Lo.n_gen[s]] = tok;
                    Lo.n_gen[s] += 1;
                }
            }
        }
        __syncthreads();
    }
}
