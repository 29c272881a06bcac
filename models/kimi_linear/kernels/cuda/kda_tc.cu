// KDA's gated delta rule in chunks fixed by position, products on tensor cores: the default
// (batch-invariant) build's prefill (kda_tc_head, kda_tc) and decode (kda_tc_decode), one device routine
// (tc_rows) for both, so a token's output and the state after its chunk have one set of bits
// whether its prompt came whole, cut anywhere or a token at a time. Grids, blocks and shared
// memory: table.py. The order, step for step: tests/kimi_linear/kda_tc_model.py.
//
// Chunks are KDA_TC_C = 16 positions, from position 0: a token at position p is row p % 16 of
// chunk p / 16. A slot (kda.cu's layout, then this form's rows after every layer's part):
//   [layer][recurrent | window]   recurrent: S0, the state at the start of the current chunk
//   [layer][head][K | G | VN]     [16, dim] f32 each: the chunk's rows so far, k (L2-normed),
//                                 gc (log decay summed from the chunk's start), v' (delta)
// A call computes rows [t0, t1) of a chunk from S0 and rows [0, t0), then keeps its rows, or at
// the chunk's end moves S0 on by the chunk's update. For a new row i:
//   XS = [k_i exp(gc_i); q_i exp(gc_i)] @ S0     (mma, rows of two m16 tiles, others zero)
//   A[i, j] = k_i . k_j exp(gc_i - gc_j) (j < i), P[i, j] = q_i . k_j exp(gc_i - gc_j) (j <= i)
//   v'_i = beta_i (v_i - XS_k[i] - sum_{j < i} A[i, j] v'_j)
//   o_i = XS_q[i] + sum_{j <= i} P[i, j] v'_j
// and at the chunk's end S0 <- exp(gc_15) S0 + (k exp(gc_15 - gc))^T v' (mma, one k16 step over
// the chunk's rows, the accumulator starting at exp(gc_15) S0).
// Products: mma.sync m16n8k16 bf16 -> f32, each f32 operand split hi + lo (bf16 each), three
// products a k16 step (lo*hi, hi*lo, hi*hi, into one accumulator), k16 steps in order: about
// f32's precision at a third of the tensor cores' rate. An mma's row sums that row's products
// only, and rows not computed are zeros. Every scalar step is an explicitly rounded intrinsic
// in a fixed order (no contraction), each row's sums over its own channels (a warp: lane l
// takes l, l + 32, ..., then the xor butterfly) and over the chunk's rows before it (j from 0).
// A value column of S (and of v', o) never meets another, so a block takes a group of them:
// KDA_TC_DV (32), or half that when the step has one sequence (tc_cols; grid z: dim / 16);
// A and P, which every column needs, each group reads alike.
#include "common.cuh"

#define KDA_TC_C 16
#define KDA_TC_DV 32
#define KDA_TC_VS (KDA_TC_DV + 4)  // the row stride of S's, XS's, V's and v''s group columns
#define KDA_TC_MAX_DIM 128
#define KDA_TC_THREADS 256

// A prefill block's value columns. A sequence's chunks are a chain (each needs the state the one
// before it left), so a step's KDA time is its longest chain's, and a step of one sequence (a
// long prompt's part) has heads x dim / 32 blocks, 128 at Kimi's 32 heads of 128: half the
// H100's and H200's 2 x 132 block slots, each block's chain waiting on its loads. Half the
// columns give it 256 blocks, each a chunk's substitution and update over half the columns; more
// sequences keep 32 (their blocks already fill the slots), the grid's upper half returning at
// once. Columns never meet: the same bits either way.
__device__ __forceinline__ int tc_cols(int n_seqs) { return n_seqs == 1 ? KDA_TC_DV / 2 : KDA_TC_DV; }

// Shared memory (f32), dim D, VS = KDA_TC_DV + 4: S [D][VS] (the group's columns), X [2C][D + 4]
// (then the update's k factors), XS [2C][VS], K G [C][D], V VN [C][VS], A P [C][C + 1],
// beta [C], decay [D]: D (VS + 4C + 1) + 2C^2 + 11C + 4C VS. table.py _TC_SMEM.
struct TcSmem {
    float *S, *X, *XS, *K, *G, *V, *VN, *A, *P, *beta, *decay;
    __device__ TcSmem(float *sm, int D) {
        const int C = KDA_TC_C, VS = KDA_TC_VS;
        S = sm;
        X = S + D * VS;
        XS = X + 2 * C * (D + 4);
        K = XS + 2 * C * VS;
        G = K + C * D;
        V = G + C * D;
        VN = V + C * VS;
        A = VN + C * VS;
        P = A + C * (C + 1);
        beta = P + C * (C + 1);
        decay = beta + C;
    }
};

// The staging area after TcSmem (16-byte aligned: TcSmem is 101 D + 2992 f32, D a multiple of 16):
// a chunk's rows as they come from global memory, k and v's group columns bf16 [C][D] and
// [C][KDA_TC_DV], g f32 [C][D], kda_tc_prep's rows f32 [C][2C + 2D]: 56 D + 768 f32 at C = 16.
struct TcStage {
    bf16 *k, *v;
    float *g, *pre;
    __device__ TcStage(float *at, int D) {
        k = reinterpret_cast<bf16 *>(at);
        g = at + KDA_TC_C * D / 2;
        v = reinterpret_cast<bf16 *>(g + KDA_TC_C * D);
        pre = g + KDA_TC_C * D + KDA_TC_C * KDA_TC_DV / 2;
    }
};

// f32 pair -> bf16 hi pair and lo pair (x = hi + lo to about 16 bits)
__device__ __forceinline__ void split2(float x0, float x1, unsigned &hi, unsigned &lo) {
    const float h0 = rbf(x0), h1 = rbf(x1);
    hi = pack_bf2(h0, h1);
    lo = pack_bf2(__fsub_rn(x0, h0), __fsub_rn(x1, h1));
}

// The A fragments (hi, lo) of rows e .. e + 15 of the k16 step over a chunk's 16 rows, X
// [16][DS] f32 (row j of the chunk, channel e): the transposed X as the mma's A (16 x 16).
__device__ __forceinline__ void x_frags(const float *X, int DS, int e, int q, unsigned (&ah)[4], unsigned (&al)[4]) {
    split2(X[(2 * q) * DS + e], X[(2 * q + 1) * DS + e], ah[0], al[0]);
    split2(X[(2 * q) * DS + e + 8], X[(2 * q + 1) * DS + e + 8], ah[1], al[1]);
    split2(X[(2 * q + 8) * DS + e], X[(2 * q + 9) * DS + e], ah[2], al[2]);
    split2(X[(2 * q + 8) * DS + e + 8], X[(2 * q + 9) * DS + e + 8], ah[3], al[3]);
}

// c += a b as lo*hi, hi*lo, hi*hi
__device__ __forceinline__ void mma3(float (&c)[4], const unsigned (&ah)[4], const unsigned (&al)[4], unsigned bh0,
                                     unsigned bh1, unsigned bl0, unsigned bl1) {
    mma_bf16(c, al, bh0, bh1);
    mma_bf16(c, ah, bl0, bl1);
    mma_bf16(c, ah, bh0, bh1);
}

// lane l's part of x . y over d = l, l + 32, ... (fma), then the butterfly: every lane the sum
__device__ __forceinline__ float lane_dot(const float *x, const float *y, int D) {
    const int lane = threadIdx.x & 31;
    float p = 0.f;
    for (int d = lane; d < D; d += 32) p = __fmaf_rn(x[d], y[d], p);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) p = __fadd_rn(p, __shfl_xor_sync(0xffffffffu, p, o));
    return p;
}

// the same with y_d = kj_d exp(gi_d - gj_d) for two x at once (A's k_i and P's q_i), for two
// pairs (i, j) at once (u, w: independent chains in flight; each pair's sums in lane_dot's order);
// rows by pointer: k_i, q_i, gc_i, then k_j, gc_j, of u and of w
__device__ __forceinline__ void lane_pairs(const float *ku, const float *qu, const float *gu, const float *kju,
                                           const float *gju, const float *kw, const float *qw, const float *gw,
                                           const float *kjw, const float *gjw, int D, float (&r)[4]) {
    const int lane = threadIdx.x & 31;
    r[0] = r[1] = r[2] = r[3] = 0.f;
    for (int d = lane; d < D; d += 32) {
        const float du = __fmul_rn(kju[d], expf(__fsub_rn(gu[d], gju[d])));
        const float dw = __fmul_rn(kjw[d], expf(__fsub_rn(gw[d], gjw[d])));
        r[0] = __fmaf_rn(ku[d], du, r[0]);
        r[1] = __fmaf_rn(qu[d], du, r[1]);
        r[2] = __fmaf_rn(kw[d], dw, r[2]);
        r[3] = __fmaf_rn(qw[d], dw, r[3]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
        for (int x = 0; x < 4; ++x) r[x] = __fadd_rn(r[x], __shfl_xor_sync(0xffffffffu, r[x], o));
    }
}

// XS [2C][dv] = X [2C][D] @ S [D][dv] (the group's dv columns): warp w the m16 tile w / 4 and the
// n8 tile w % 4, its k16 steps in order
__device__ __forceinline__ void product_xs(const TcSmem &m, int D, int dv) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int mt = warp >> 2, nt = warp & 3, DS = D + 4, SS = KDA_TC_VS, n = nt * 8 + g;
    if (nt * 8 >= dv) return;
    const float *X = m.X + mt * 16 * DS;
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    for (int k0 = 0; k0 < D; k0 += 16) {
        unsigned ah[4], al[4], bh0, bh1, bl0, bl1;
        const int c0 = k0 + 2 * q;
        split2(X[g * DS + c0], X[g * DS + c0 + 1], ah[0], al[0]);
        split2(X[(g + 8) * DS + c0], X[(g + 8) * DS + c0 + 1], ah[1], al[1]);
        split2(X[g * DS + c0 + 8], X[g * DS + c0 + 9], ah[2], al[2]);
        split2(X[(g + 8) * DS + c0 + 8], X[(g + 8) * DS + c0 + 9], ah[3], al[3]);
        split2(m.S[c0 * SS + n], m.S[(c0 + 1) * SS + n], bh0, bl0);
        split2(m.S[(c0 + 8) * SS + n], m.S[(c0 + 9) * SS + n], bh1, bl1);
        mma3(c, ah, al, bh0, bh1, bl0, bl1);
    }
    float *out = m.XS + (mt * 16) * KDA_TC_VS + nt * 8 + 2 * q;
    out[g * KDA_TC_VS] = c[0];
    out[g * KDA_TC_VS + 1] = c[1];
    out[(g + 8) * KDA_TC_VS] = c[2];
    out[(g + 8) * KDA_TC_VS + 1] = c[3];
}

// S [D][dv] <- S * decay[e] + Kd^T VN, Kd = X [C][D + 4] (rows j, channels e), VN [C][dv]: warp w
// the m16 tiles (key rows) w, w + 8, ..., the group's n8 tiles; a thread reads and writes only its
// own fragment's elements of S
__device__ __forceinline__ void product_update(const TcSmem &m, int D, int dv) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int DS = D + 4, SS = KDA_TC_VS, VS = KDA_TC_VS, nw = KDA_TC_THREADS / 32;
    for (int mt = warp; mt < D / 16; mt += nw) {
        const int e = mt * 16 + g;
        unsigned ah[4], al[4];
        x_frags(m.X, DS, e, q, ah, al);
        const float d0 = m.decay[e], d1 = m.decay[e + 8];
#pragma unroll
        for (int nt = 0; nt < KDA_TC_DV / 8; ++nt) {
            if (nt * 8 >= dv) break;
            const int n = nt * 8 + g, c0 = nt * 8 + 2 * q;
            unsigned bh0, bh1, bl0, bl1;
            split2(m.VN[(2 * q) * VS + n], m.VN[(2 * q + 1) * VS + n], bh0, bl0);
            split2(m.VN[(2 * q + 8) * VS + n], m.VN[(2 * q + 9) * VS + n], bh1, bl1);
            float *s0 = m.S + e * SS + c0, *s1 = m.S + (e + 8) * SS + c0;
            float c[4] = {__fmul_rn(s0[0], d0), __fmul_rn(s0[1], d0), __fmul_rn(s1[0], d1), __fmul_rn(s1[1], d1)};
            mma3(c, ah, al, bh0, bh1, bl0, bl1);
            s0[0] = c[0];
            s0[1] = c[1];
            s1[0] = c[2];
            s1[1] = c[3];
        }
    }
}

// One sequence of one head, value columns [col0, col0 + dv): rows [r0, r1) of mix at positions
// pos0, pos0 + 1, ... (a prompt's part or a decode row), from its slot. Every thread of the block
// (KDA_TC_THREADS) calls it.
__device__ __forceinline__ void tc_rows(const bf16 *mix, const float *g, const float *b, char *state, int slot,
                                        int r0, int r1, int pos0, const float *pre, bf16 *o, int layer, int layers,
                                        int h, int heads, int D, int conv, int slot_bytes, int col0, int cols, float *sm) {
    const int C = KDA_TC_C, DS = D + 4, W = heads * D, SS = KDA_TC_VS, VS = KDA_TC_VS, PS = 2 * C + 2 * D;
    const int dv = min(cols, D - col0);
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
    const TcSmem m(sm, D);
    const size_t per = (size_t)heads * D * D + (size_t)(conv - 1) * 3 * heads * D;
    float *base = reinterpret_cast<float *>(state + (size_t)slot * slot_bytes);
    float *Sg = base + (size_t)layer * per + (size_t)h * D * D;
    float *rows = base + (size_t)layers * per + ((size_t)layer * heads + h) * 3 * C * D;  // K | G | VN
    const bool fresh = pos0 == 0;
    int t0 = pos0 % C;
    for (int i = tid; i < D * dv; i += nt) m.S[(i / dv) * SS + i % dv] = fresh ? 0.f : Sg[(i / dv) * D + col0 + i % dv];
    for (int i = tid; i < t0 * D; i += nt) {
        m.K[i] = rows[i];
        m.G[i] = rows[C * D + i];
    }
    for (int i = tid; i < t0 * dv; i += nt) m.VN[(i / dv) * VS + i % dv] = rows[2 * C * D + (i / dv) * D + col0 + i % dv];
    bool moved = fresh;
    // A chunk's inputs come into the staging area by cp.async while the chunk before it computes:
    // they depend on no state, and a chain of chunks waiting on each chunk's loads paid their
    // latency once a chunk (the chain is the step's KDA time where one long prompt is in it).
    const TcStage st(m.decay + D, D);
    const float *beta_in = b + h;
    auto stage = [&](int rs, int n) {  // rows [rs, rs + n) into the staging area's rows 0 .. n - 1
        for (int i = tid; i < n * (D / 8); i += nt) {  // k: D / 8 pieces of 16 bytes a row
            const int rr = i / (D / 8), c = (i - rr * (D / 8)) * 8;
            cp_async16(st.k + rr * D + c, mix + (size_t)(rs + rr) * 3 * W + W + (size_t)h * D + c);
        }
        for (int i = tid; i < n * (D / 4); i += nt) {  // g
            const int rr = i / (D / 4), c = (i - rr * (D / 4)) * 4;
            cp_async16(st.g + rr * D + c, g + (size_t)(rs + rr) * W + (size_t)h * D + c);
        }
        for (int i = tid; i < n * (dv / 8); i += nt) {  // v's group columns
            const int rr = i / (dv / 8), c = (i - rr * (dv / 8)) * 8;
            cp_async16(st.v + rr * KDA_TC_DV + c, mix + (size_t)(rs + rr) * 3 * W + 2 * W + (size_t)h * D + col0 + c);
        }
        for (int i = tid; i < n * (PS / 4); i += nt) {  // kda_tc_prep's row: A | P | k exp(gc) | q exp(gc)
            const int rr = i / (PS / 4), c = (i - rr * (PS / 4)) * 4;
            cp_async16(st.pre + rr * PS + c, pre + ((size_t)(rs + rr) * heads + h) * PS + c);
        }
        cp_async_commit();
    };
    stage(r0, min(C - t0, r1 - r0));
    for (int r = r0; r < r1;) {
        const int n = min(C - t0, r1 - r), t1 = t0 + n;
        const float bl = tid < n ? beta_in[(size_t)(r + tid) * heads] : 0.f;  // beta's logit, beside the wait
        cp_async_wait<0>();
        __syncthreads();  // the staged rows landed, and the chunk before is done with m's tiles
        // the staged rows into the chunk's tiles: k, g, v to f32; X the new rows' k exp(gc) and
        // q exp(gc), every other row zero; A and P of the new rows (kda_tc_prep's, computed for
        // every prompt row at once as this routine computed them)
        for (int i = tid; i < n * D; i += nt) {
            m.K[t0 * D + i] = to_f(st.k[i]);
            m.G[t0 * D + i] = st.g[i];
        }
        for (int i = tid; i < n * dv; i += nt) {
            const int rr = i / dv, d = i - rr * dv;
            m.V[(t0 + rr) * VS + d] = to_f(st.v[rr * KDA_TC_DV + d]);
        }
        if (tid < n) m.beta[t0 + tid] = __fdiv_rn(1.f, __fadd_rn(1.f, expf(-bl)));  // n <= C < nt
        for (int idx = tid; idx < 2 * C * D; idx += nt) {
            const int rr = idx / D, d = idx - rr * D, i = rr % C;
            m.X[rr * DS + d] = i >= t0 && i < t1 ? st.pre[(i - t0) * PS + 2 * C + (rr < C ? 0 : D) + d] : 0.f;
        }
        for (int idx = tid; idx < n * C; idx += nt) {
            const int i = t0 + idx / C, j = idx % C;
            if (j <= i) {
                m.A[i * (C + 1) + j] = st.pre[(idx / C) * PS + j];
                m.P[i * (C + 1) + j] = st.pre[(idx / C) * PS + C + j];
            }
        }
        __syncthreads();  // the staging area is free: the next chunk's rows go in while this one computes
        if (r + n < r1) stage(r + n, min(C, r1 - r - n));
        // k's L2 norms, a warp a row (the kept rows and the update need k; q's part is kda_tc_prep's)
        for (int i = t0 + warp; i < t1; i += nw) {
            float *ki = m.K + i * D;
            const float rk = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(lane_dot(ki, ki, D), 1e-6f)));
            __syncwarp();
            for (int d = lane; d < D; d += 32) ki[d] = __fmul_rn(ki[d], rk);
        }
        // gc, a thread a channel
        for (int d = tid; d < D; d += nt)
            for (int i = max(t0, 1); i < t1; ++i) m.G[i * D + d] = __fadd_rn(m.G[(i - 1) * D + d], m.G[i * D + d]);
        __syncthreads();
        product_xs(m, D, dv);
        __syncthreads();
        // v' and o: a half-warp a value column, its lane i row i. The forward substitution runs as a
        // wavefront: at step j row j's v' is final (its sum has taken j = 0 .. j - 1) and goes by
        // shuffle to the rows after it, so each row's sums take j in order from 0, the order one
        // thread walking the rows would take (16 steps, not the rows' 136 in a chain)
        {
            const int i = tid & 15, src = tid & 16;  // src: the half-warp's first lane
            const bool active = i >= t0 && i < t1;
            for (int c = 0; c < dv; c += nt / 16) {
                const int d = c + (tid >> 4);
                const bool col = d < dv;
                float acc = 0.f, out = 0.f, vn = 0.f;
                if (col && active) {
                    acc = __fsub_rn(m.V[i * VS + d], m.XS[i * VS + d]);
                    out = m.XS[(C + i) * VS + d];
                }
                if (col && i < t0) vn = m.VN[i * VS + d];
                for (int j = 0; j < t1; ++j) {
                    if (active && i == j) vn = __fmul_rn(m.beta[i], acc);
                    const float vj = __shfl_sync(0xffffffffu, vn, src + j);
                    if (active && j < i) acc = __fmaf_rn(-m.A[i * (C + 1) + j], vj, acc);
                    if (active && j <= i) out = __fmaf_rn(m.P[i * (C + 1) + j], vj, out);
                }
                if (col && active) {
                    m.VN[i * VS + d] = vn;
                    o[(size_t)(r + i - t0) * W + (size_t)h * D + col0 + d] = to_bf(out);
                }
            }
        }
        __syncthreads();
        if (t1 == C) {  // the chunk's end: S0 moves on
            for (int idx = tid; idx < C * D; idx += nt) {
                const int j = idx / D, e = idx % D;
                m.X[j * DS + e] = __fmul_rn(m.K[idx], expf(__fsub_rn(m.G[(C - 1) * D + e], m.G[idx])));
            }
            for (int e = tid; e < D; e += nt) m.decay[e] = expf(m.G[(C - 1) * D + e]);
            __syncthreads();
            product_update(m, D, dv);
            moved = true;
        } else {        // keep the rows: the call ends inside the chunk (k and gc by group 0)
            if (col0 == 0)
                for (int idx = tid; idx < n * D; idx += nt) {
                    const int i = t0 * D + idx;
                    rows[i] = m.K[i];
                    rows[C * D + i] = m.G[i];
                }
            for (int idx = tid; idx < n * dv; idx += nt) {
                const int i = t0 + idx / dv, d = idx % dv;
                rows[2 * C * D + i * D + col0 + d] = m.VN[i * VS + d];
            }
        }
        r += n;
        t0 = 0;
    }
    if (moved) {
        __syncthreads();
        for (int i = tid; i < D * dv; i += nt) Sg[(i / dv) * D + col0 + i % dv] = m.S[(i / dv) * SS + i % dv];
    }
}

// kda_tc_prep: what tc_rows' chunk needs of each prompt row before the state, for every row of
// the step at once (a block a (row, head), 128 threads), computed as tc_rows computed it: k and q
// L2-normed (a warp a row, lane_dot), gc summed from the chunk's start (a thread a channel, rows
// in order, from the slot's kept gc where the row's chunk began in an earlier call), then
// pre[row][head] = [A row (C) | P row (C) | k exp(gc) (D) | q exp(gc) (D)] (lane_pairs; entries
// past the row's own index are not written). It reads the chunk's earlier rows again (up to 15,
// mostly from L2) where tc_rows walked them once, and so takes the scores off the chain that
// walks a sequence's chunks (they were most of its time, redone in each of 4 column groups).
// Grid (rows, heads), block 128; shared memory (f32): K G [C][D], q [D] (table.py _TC_PREP_SMEM).
extern "C" __global__ void __launch_bounds__(128)
kda_tc_prep(const bf16 *__restrict__ mix, const float *__restrict__ g, const char *__restrict__ state,
            const int *__restrict__ slot, const int *__restrict__ cu_seqlens, const int *__restrict__ pos,
            float *__restrict__ pre, int rows, int n_seqs, int layer, int layers, int heads, int dim, int conv,
            int slot_bytes) {
    extern __shared__ float sm[];
    const int r = blockIdx.x, h = blockIdx.y;
    if (r >= rows || h >= heads) return;
    const int C = KDA_TC_C, D = dim, W = heads * D, PS = 2 * C + 2 * D;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
    float *K = sm, *G = K + C * D, *q = G + C * D;
    int lo = 0, hi = n_seqs;  // the row's sequence: the last s with cu_seqlens[s] <= r
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (cu_seqlens[mid] <= r) lo = mid;
        else hi = mid;
    }
    const int r0 = cu_seqlens[lo], p = pos[r], t = p % C, start = p - t;
    const int first = max(start, pos[r0]) - start;  // the chunk's first row of this call; rows before it kept
    const size_t per = (size_t)heads * D * D + (size_t)(conv - 1) * 3 * heads * D;
    const float *kept = reinterpret_cast<const float *>(state + (size_t)slot[lo] * slot_bytes) + (size_t)layers * per +
                        ((size_t)layer * heads + h) * 3 * C * D;  // K | G | VN
    for (int idx = tid; idx < (t + 1) * D; idx += nt) {
        const int j = idx / D, d = idx % D;
        if (j < first) {
            K[idx] = kept[idx];
            G[idx] = kept[C * D + idx];
        } else {
            const size_t rj = (size_t)(r - (t - j));
            K[idx] = to_f(mix[rj * 3 * W + W + (size_t)h * D + d]);
            G[idx] = g[rj * W + (size_t)h * D + d];
        }
    }
    for (int d = tid; d < D; d += nt) q[d] = to_f(mix[(size_t)r * 3 * W + (size_t)h * D + d]);
    __syncthreads();
    const float qscale = __fdiv_rn(1.f, __fsqrt_rn((float)D));
    for (int j = first + warp; j <= t; j += nw) {
        float *kj = K + j * D;
        const float rk = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(lane_dot(kj, kj, D), 1e-6f)));
        __syncwarp();
        for (int d = lane; d < D; d += 32) kj[d] = __fmul_rn(kj[d], rk);
    }
    if (warp == nw - 1) {
        const float rq = __fdiv_rn(qscale, __fsqrt_rn(__fadd_rn(lane_dot(q, q, D), 1e-6f)));
        __syncwarp();
        for (int d = lane; d < D; d += 32) q[d] = __fmul_rn(q[d], rq);
    }
    for (int d = tid; d < D; d += nt)
        for (int j = max(first, 1); j <= t; ++j) G[j * D + d] = __fadd_rn(G[(j - 1) * D + d], G[j * D + d]);
    __syncthreads();
    float *out = pre + ((size_t)r * heads + h) * PS;
    for (int d = tid; d < D; d += nt) {
        out[2 * C + d] = __fmul_rn(K[t * D + d], expf(G[t * D + d]));
        out[2 * C + D + d] = __fmul_rn(q[d], expf(G[t * D + d]));
    }
    const float *kt = K + t * D, *gt = G + t * D;
    for (int j0 = 2 * warp; j0 <= t; j0 += 2 * nw) {
        const int j1 = min(j0 + 1, t);
        float rr[4];
        lane_pairs(kt, q, gt, K + j0 * D, G + j0 * D, kt, q, gt, K + j1 * D, G + j1 * D, D, rr);
        if (lane == 0) {
            out[j0] = rr[0];
            out[C + j0] = rr[1];
            out[j1] = rr[2];
            out[C + j1] = rr[3];
        }
    }
}

// Prefill, in two launches so that no block reads kept rows another block of the launch may be
// rewriting: the groups of a (sequence, head) share the rows' k and gc, which group 0 keeps, and
// a call that starts inside a chunk (reading that chunk's kept rows) and ends inside a later one
// (keeping that one's rows in the same place) would race. kda_tc_head computes a sequence's rows
// of its first chunk when an earlier call began that chunk (reading its kept rows, keeping rows
// after them or completing it); kda_tc the rest, from the first chunk boundary (reading no
// kept rows). A block a (sequence, head, group of tc_cols value columns). Grid (n_seqs, heads,
// ceil(dim / (KDA_TC_DV / 2))), block KDA_TC_THREADS, each.
extern "C" __global__ void __launch_bounds__(KDA_TC_THREADS, 2)
kda_tc_head(const bf16 *__restrict__ mix, const float *__restrict__ g, const float *__restrict__ b,
            char *__restrict__ state, const int *__restrict__ slot, const int *__restrict__ cu_seqlens,
            const int *__restrict__ pos, const float *__restrict__ pre, bf16 *__restrict__ o, int n_seqs, int layer, int layers, int heads, int dim,
            int conv, int slot_bytes) {
    extern __shared__ float sm[];
    const int s = blockIdx.x, h = blockIdx.y, cols = tc_cols(n_seqs), col0 = blockIdx.z * cols;
    if (s >= n_seqs || h >= heads || col0 >= dim) return;
    const int r0 = cu_seqlens[s], r1 = cu_seqlens[s + 1];
    if (r1 == r0) return;
    const int p0 = pos[r0], t0 = p0 % KDA_TC_C;
    if (t0 == 0) return;
    tc_rows(mix, g, b, state, slot[s], r0, min(r1, r0 + KDA_TC_C - t0), p0, pre, o, layer, layers, h, heads, dim, conv,
            slot_bytes, col0, cols, sm);
}

extern "C" __global__ void __launch_bounds__(KDA_TC_THREADS, 2)
kda_tc(const bf16 *__restrict__ mix, const float *__restrict__ g, const float *__restrict__ b, char *__restrict__ state,
       const int *__restrict__ slot, const int *__restrict__ cu_seqlens, const int *__restrict__ pos,
       const float *__restrict__ pre, bf16 *__restrict__ o, int n_seqs, int layer, int layers, int heads, int dim, int conv, int slot_bytes) {
    extern __shared__ float sm[];
    const int s = blockIdx.x, h = blockIdx.y, cols = tc_cols(n_seqs), col0 = blockIdx.z * cols;
    if (s >= n_seqs || h >= heads || col0 >= dim) return;
    const int r0 = cu_seqlens[s], r1 = cu_seqlens[s + 1];
    const int p0 = r1 > r0 ? pos[r0] : 0, t0 = p0 % KDA_TC_C, skip = t0 ? KDA_TC_C - t0 : 0;
    if (r0 + skip >= r1) return;
    tc_rows(mix, g, b, state, slot[s], r0 + skip, r1, p0 + skip, pre, o, layer, layers, h, heads, dim, conv, slot_bytes,
            col0, cols, sm);
}

// Decode: tc_rows' arithmetic for one row, every step of it as tc_rows takes it (so a decoded
// token has the bits it has in a prompt), laid out for one row: a block a (row, head) and all of
// S's value columns (tc_rows' four groups would each redo the row's norms, decays and scores),
// S read from the slot straight into the mma's B fragments (never staged in shared memory: the
// block's footprint is the chunk's kept rows, ~37 KB at dim 128, so several blocks share an SM),
// the row's k exp(gc) and q exp(gc) as row t of the A fragments of two m16 tiles (the other rows
// zero, as in tc_rows), one warp both tiles of an n8 tile of S (each S element read once). At the
// chunk's end S moves on in place, each thread reading and writing its own C fragment's elements.
// Grid (rows, heads), block KDA_TC_THREADS; shared memory (f32): K G [C][D], X VN [C][D + 4],
// q xk xq v xsk xsq decay [D], A P [C], beta: D (4C + 7) + 10C + 1 (table.py _TC_DEC_SMEM).
struct DecSmem {
    float *K, *G, *X, *VN, *q, *xk, *xq, *v, *xsk, *xsq, *decay, *A, *P, *beta;
    __device__ DecSmem(float *sm, int D) {
        const int C = KDA_TC_C, DS = D + 4;
        K = sm;
        G = K + C * D;
        X = G + C * D;
        VN = X + C * DS;
        q = VN + C * DS;
        xk = q + D;
        xq = xk + D;
        v = xq + D;
        xsk = v + D;
        xsq = xsk + D;
        decay = xsq + D;
        A = decay + D;
        P = A + C;
        beta = P + C;
    }
};

extern "C" __global__ void __launch_bounds__(KDA_TC_THREADS, 3)
kda_tc_decode(const bf16 *__restrict__ mix, const float *__restrict__ g, const float *__restrict__ b,
              char *__restrict__ state, const int *__restrict__ slot, const int *__restrict__ pos,
              bf16 *__restrict__ o, int rows, int layer, int layers, int heads, int dim, int conv, int slot_bytes) {
    extern __shared__ float sm[];
    const int r = blockIdx.x, h = blockIdx.y;
    if (r >= rows || h >= heads) return;
    const int C = KDA_TC_C, D = dim, DS = D + 4, W = heads * D;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, nw = nt >> 5;
    const int g8 = lane >> 2, q4 = lane & 3;
    const DecSmem m(sm, D);
    const size_t per = (size_t)heads * D * D + (size_t)(conv - 1) * 3 * heads * D;
    float *base = reinterpret_cast<float *>(state + (size_t)slot[r] * slot_bytes);
    float *Sg = base + (size_t)layer * per + (size_t)h * D * D;
    float *kept = base + (size_t)layers * per + ((size_t)layer * heads + h) * 3 * C * D;  // K | G | VN
    const int p = pos[r], t = p % C;
    const bool fresh = p == 0;
    // the chunk's kept rows, then the new row at t
    for (int i = tid; i < t * D; i += nt) {
        m.K[i] = kept[i];
        m.G[i] = kept[C * D + i];
        m.VN[(i / D) * DS + i % D] = kept[2 * C * D + i];
    }
    const size_t row = (size_t)r * 3 * W + (size_t)h * D;
    for (int d = tid; d < D; d += nt) {
        m.q[d] = to_f(mix[row + d]);
        m.K[t * D + d] = to_f(mix[row + W + d]);
        m.G[t * D + d] = g[(size_t)r * W + (size_t)h * D + d];
        m.v[d] = to_f(mix[row + 2 * W + d]);
    }
    if (tid == 0) m.beta[0] = __fdiv_rn(1.f, __fadd_rn(1.f, expf(-b[(size_t)r * heads + h])));
    __syncthreads();
    // L2 norms (warp 0), gc (a thread a channel)
    const float qscale = __fdiv_rn(1.f, __fsqrt_rn((float)D));
    if (warp == 0) {
        float *kt = m.K + t * D;
        const float rq = __fdiv_rn(qscale, __fsqrt_rn(__fadd_rn(lane_dot(m.q, m.q, D), 1e-6f)));
        const float rk = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(lane_dot(kt, kt, D), 1e-6f)));
        __syncwarp();
        for (int d = lane; d < D; d += 32) {
            m.q[d] = __fmul_rn(m.q[d], rq);
            kt[d] = __fmul_rn(kt[d], rk);
        }
    }
    if (t > 0)
        for (int d = tid; d < D; d += nt) m.G[t * D + d] = __fadd_rn(m.G[(t - 1) * D + d], m.G[t * D + d]);
    __syncthreads();
    // the row's k exp(gc) and q exp(gc); A[t, j] and P[t, j], j <= t, a warp two j at a time
    for (int d = tid; d < D; d += nt) {
        m.xk[d] = __fmul_rn(m.K[t * D + d], expf(m.G[t * D + d]));
        m.xq[d] = __fmul_rn(m.q[d], expf(m.G[t * D + d]));
    }
    const float *kt = m.K + t * D, *gt = m.G + t * D;
    for (int j0 = 2 * warp; j0 <= t; j0 += 2 * nw) {
        const int j1 = min(j0 + 1, t);
        float rr[4];
        lane_pairs(kt, m.q, gt, m.K + j0 * D, m.G + j0 * D, kt, m.q, gt, m.K + j1 * D, m.G + j1 * D, D, rr);
        if (lane == 0) {
            m.A[j0] = rr[0];
            m.P[j0] = rr[1];
            m.A[j1] = rr[2];
            m.P[j1] = rr[3];
        }
    }
    __syncthreads();
    // XS: the row's [k exp(gc); q exp(gc)] @ S0, warp w the n8 tiles w, w + nw, ... of both m16 tiles
    const bool row_lo = g8 == t, row_hi = g8 + 8 == t;
    for (int ntile = warp; ntile < D / 8; ntile += nw) {
        const int n = ntile * 8 + g8;
        float ck[4] = {0.f, 0.f, 0.f, 0.f}, cq[4] = {0.f, 0.f, 0.f, 0.f};
        for (int k0 = 0; k0 < D; k0 += 16) {
            const int c0 = k0 + 2 * q4;
            float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
            if (!fresh) {
                s0 = Sg[(size_t)c0 * D + n];
                s1 = Sg[(size_t)(c0 + 1) * D + n];
                s2 = Sg[(size_t)(c0 + 8) * D + n];
                s3 = Sg[(size_t)(c0 + 9) * D + n];
            }
            unsigned bh0, bh1, bl0, bl1, ah[4], al[4];
            split2(s0, s1, bh0, bl0);
            split2(s2, s3, bh1, bl1);
            const float *xs[2] = {m.xk, m.xq};
#pragma unroll
            for (int x = 0; x < 2; ++x) {
                const float *xr = xs[x];
                split2(row_lo ? xr[c0] : 0.f, row_lo ? xr[c0 + 1] : 0.f, ah[0], al[0]);
                split2(row_hi ? xr[c0] : 0.f, row_hi ? xr[c0 + 1] : 0.f, ah[1], al[1]);
                split2(row_lo ? xr[c0 + 8] : 0.f, row_lo ? xr[c0 + 9] : 0.f, ah[2], al[2]);
                split2(row_hi ? xr[c0 + 8] : 0.f, row_hi ? xr[c0 + 9] : 0.f, ah[3], al[3]);
                mma3(x ? cq : ck, ah, al, bh0, bh1, bl0, bl1);
            }
        }
        const int c0 = ntile * 8 + 2 * q4;
        if (row_lo) {
            m.xsk[c0] = ck[0];
            m.xsk[c0 + 1] = ck[1];
            m.xsq[c0] = cq[0];
            m.xsq[c0 + 1] = cq[1];
        }
        if (row_hi) {
            m.xsk[c0] = ck[2];
            m.xsk[c0 + 1] = ck[3];
            m.xsq[c0] = cq[2];
            m.xsq[c0 + 1] = cq[3];
        }
    }
    __syncthreads();
    // v' and o, a thread a value column
    for (int d = tid; d < D; d += nt) {
        float acc = __fsub_rn(m.v[d], m.xsk[d]);
        for (int j = 0; j < t; ++j) acc = __fmaf_rn(-m.A[j], m.VN[j * DS + d], acc);
        const float vn = __fmul_rn(m.beta[0], acc);
        m.VN[t * DS + d] = vn;
        float out = m.xsq[d];
        for (int j = 0; j <= t; ++j) out = __fmaf_rn(m.P[j], m.VN[j * DS + d], out);
        o[(size_t)r * W + (size_t)h * D + d] = to_bf(out);
    }
    if (t < C - 1) {  // keep the row (and a fresh sequence's S0: zeros)
        for (int d = tid; d < D; d += nt) {
            kept[t * D + d] = m.K[t * D + d];
            kept[C * D + t * D + d] = m.G[t * D + d];
            kept[2 * C * D + t * D + d] = m.VN[t * DS + d];
        }
        if (fresh)
            for (int i = tid; i < D * D; i += nt) Sg[i] = 0.f;
        return;
    }
    // the chunk's end: S0 <- exp(gc_15) S0 + (k exp(gc_15 - gc))^T v', in place
    __syncthreads();
    for (int idx = tid; idx < C * D; idx += nt) {
        const int j = idx / D, e = idx % D;
        m.X[j * DS + e] = __fmul_rn(m.K[idx], expf(__fsub_rn(m.G[(C - 1) * D + e], m.G[idx])));
    }
    for (int e = tid; e < D; e += nt) m.decay[e] = expf(m.G[(C - 1) * D + e]);
    __syncthreads();
    for (int mt = warp; mt < D / 16; mt += nw) {
        const int e = mt * 16 + g8;
        unsigned ah[4], al[4];
        x_frags(m.X, DS, e, q4, ah, al);
        const float d0 = m.decay[e], d1 = m.decay[e + 8];
        for (int ntile = 0; ntile < D / 8; ++ntile) {
            const int n = ntile * 8 + g8, c0 = ntile * 8 + 2 * q4;
            unsigned bh0, bh1, bl0, bl1;
            split2(m.VN[(2 * q4) * DS + n], m.VN[(2 * q4 + 1) * DS + n], bh0, bl0);
            split2(m.VN[(2 * q4 + 8) * DS + n], m.VN[(2 * q4 + 9) * DS + n], bh1, bl1);
            float *s0 = Sg + (size_t)e * D + c0, *s1 = Sg + (size_t)(e + 8) * D + c0;
            float c[4] = {__fmul_rn(fresh ? 0.f : s0[0], d0), __fmul_rn(fresh ? 0.f : s0[1], d0),
                          __fmul_rn(fresh ? 0.f : s1[0], d1), __fmul_rn(fresh ? 0.f : s1[1], d1)};
            mma3(c, ah, al, bh0, bh1, bl0, bl1);
            s0[0] = c[0];
            s0[1] = c[1];
            s1[0] = c[2];
            s1[1] = c[3];
        }
    }
}
