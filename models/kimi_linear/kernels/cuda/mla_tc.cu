// MLA attention on tensor cores, the up-projections absorbed (as mla.cu's mla_attend, which
// the faster build still runs): per (query row, head) the query [q_lat (kv_lora) | q_rope
// (rope)] against the row's cached tokens' [latent | key part] rows (one kv head shared by
// every query head) and the softmax-weighted latents out, o_lat f32 [rows, heads, kv_lora] for
// mla_expand. Prefill (mla_attend_tc) and decode (mla_attend_tc_decode) run one device routine
// (attend_tc) in one order, so a token prefilled and the same token decoded get the same bits,
// whatever rows share either launch (the contract of docs/determinism.md).
//
// The order of one (row, head) over its keys 0 .. pos:
// - q is rounded to bf16 (q_lat is f32 from mla_absorb; FlashMLA rounds it so too), the keys
//   are the cache's bf16 rows; keys cut in chunks of `chunk` keys from key 0 (the deployment's
//   split, a multiple of MLA_BN: manifests/cuda.py MLA_CHUNK), a chunk in tiles of MLA_BN from
//   its first key;
// - a tile's scores S = q K^T on mma.sync m16n8k16 (fp32 accumulate), the width's nk = width /
//   16 k16 steps cut in 4 runs of kw = ceil(nk / 4) (run w: steps w kw .. , each run summed in
//   step order from 0), S = ((run0 + run1) + run2) + run3, each add rounded;
// - then attention_tc.cuh's softmax and P V (attn_softmax_pv): scale in log2 units, running
//   max, exp2, l a thread's columns, P rounded to bf16 times the latents on mma;
// - a chunk's l its quad's parts in attention_tc's xor order; the chunks' (m, l, acc) folded in
//   order 0, 1, ... from (-inf, 0, 0) (attention_tc's attn_fold), o_lat = A / L (one chunk:
//   exactly acc / l, the fold's co = 0 and cz = 1).
// Prefill (a block a row) walks the row's chunks in order and folds each as it ends: M and L in
// registers, A in o_lat itself (each thread reads back only what it wrote), so no partials and
// no second launch. Decode (a block a (row, 16 heads, chunk): grid z the chunks) writes its
// chunk's (m, l, acc) to part_ml / part_o unless the row has one chunk (then o_lat at once, as
// before the split); the last of a (row, head group)'s blocks to finish (counter sem, zero
// between launches, reset by that block) folds the partials in chunk order. The same f32 ops
// on the same f32 values in the same order either way: a row's bits whole, cut, decoded.
// Every scalar op rounded explicitly (the header's and the adds here): inlining cannot change a
// contraction. A block holds MT groups of 16 query heads of one row (the mma's 16 rows: heads
// past `heads` repeat the last one, never stored); the mma sums a row's products depending on
// that row alone, so which heads share a group or a block cannot change a head's bits.
//
// The 4 warps of a group split the work: for S, warp w the k run w (its q fragments in
// registers, all MLA_BN keys); the 4 partial tiles meet in shared memory and every warp adds
// them in the order above (the same bits in each); for P V, warp w the output dims 128 w ..
// 128 w + 127 (a warp cannot hold 16 rows x 512 f32). Shared memory: two stages of one key
// tile (the V operand is the latent half of the same rows) and the group's partial scores.
// Grids, blocks, shared memory: table.py.
#include "attention_tc.cuh"

#define MLA_TC_MAX_W 576                      // kv_lora + rope, a multiple of 16
#define MLA_TC_MAX_LORA 512                   // 4 warps x 128 dims
#define MLA_BN 32                             // keys a tile
#define MLA_KP (MLA_TC_MAX_W + 8)             // padded shared row (bf16): 1168 bytes, ldmatrix conflict-free
#define MLA_KW 9                              // k16 steps of a warp's run, at most (576 / 16 / 4)
#define MLA_ND 16                             // 8-dim output tiles a warp (128 dims)
#define MLA_NT (MLA_BN / 8)                   // 8-key column tiles of S
#define MLA_TILE (MLA_BN * MLA_KP)            // one stage (bf16 elements)
#define MLA_PART (4 * MLA_NT * 4 * 32)        // a group's partial scores (f32): 4 warps x its C fragments
// the dynamic shared memory of a block of MT groups (bytes): table.py MLA_TC_SMEM
#define MLA_TC_SMEM(MT) (2 * MLA_TILE * 2 + (MT) * MLA_PART * 4)

__device__ __forceinline__ const bf16 *mla_tc_row(const char *kv, int phys, int layer, int tok, int page_tokens,
                                                  int width, int token_bytes) {
    return reinterpret_cast<const bf16 *>(kv + (size_t)phys * page_tokens * token_bytes) +
           ((size_t)layer * page_tokens + tok) * width;
}

// Keys kb .. kb + MLA_BN - 1 into a stage (cp.async, 16 bytes a copy): those past ctx
// zero-filled, so P V never meets a NaN from a stale row (their P is 0).
__device__ __forceinline__ void mla_tc_load(bf16 *dst, const char *__restrict__ kv, const int *__restrict__ table,
                                            int kb, int ctx, int layer, int width, int page_tokens,
                                            int token_bytes) {
    const int n16 = width >> 3;  // 16-byte copies a row
    for (int c = threadIdx.x; c < MLA_BN * n16; c += blockDim.x) {
        const int tt = c / n16, ch = c % n16, t = kb + tt;
        const bool ok = t < ctx;
        const bf16 *src = ok ? mla_tc_row(kv, table[t / page_tokens], layer, t % page_tokens, page_tokens, width,
                                          token_bytes) + ch * 8
                             : reinterpret_cast<const bf16 *>(kv);
        cp_async16_zfill(dst + tt * MLA_KP + ch * 8, src, ok ? 16 : 0);
    }
}

// Two query channels c, c + 1 of head h of row r, rounded to bf16: q_lat's below kv_lora, the
// rope part of q beyond (a k16 step never straddles kv_lora: it is a multiple of 16).
__device__ __forceinline__ unsigned mla_tc_q2(const float *__restrict__ q_lat, const bf16 *__restrict__ q, int r,
                                              int h, int c, int heads, int nope, int rope, int kv_lora) {
    if (c < kv_lora) {
        const float *p = q_lat + ((size_t)r * heads + h) * kv_lora + c;
        return pack_bf2(p[0], p[1]);
    }
    const unsigned short *p = reinterpret_cast<const unsigned short *>(q) + (size_t)r * heads * (nope + rope) +
                              (size_t)h * (nope + rope) + nope + (c - kv_lora);
    return (unsigned)p[0] | ((unsigned)p[1] << 16);
}

// Folds this warp's chunk (st, its quad-summed l in lr) into rows ha, hb's (M, L, A) and, at the
// row's last chunk, writes o_lat = A / L; A lives in o_lat (first: no earlier chunk to read).
__device__ __forceinline__ void mla_tc_fold(const AttnRun<MLA_ND> &st, const float (&lr)[2], float (&M)[2],
                                            float (&L)[2], float *__restrict__ o_lat, int r, int ha, int hb,
                                            int heads, int kv_lora, int d0, bool first, bool last) {
    const int t4 = threadIdx.x & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float co, cz;
        attn_fold(M[h], L[h], st.m[h], lr[h], co, cz);
        const int hh = h ? hb : ha;
        if (hh >= heads) continue;
        float *orow = o_lat + ((size_t)r * heads + hh) * kv_lora + 2 * t4;
#pragma unroll
        for (int d = 0; d < MLA_ND; ++d)
            if (8 * (d0 + d) < kv_lora) {
                float2 *p = reinterpret_cast<float2 *>(orow + 8 * (d0 + d));
                float2 a = first ? make_float2(0.f, 0.f) : *p;
                a.x = attn_fold_out(a.x, st.acc[d][2 * h], co, cz);
                a.y = attn_fold_out(a.y, st.acc[d][2 * h + 1], co, cz);
                if (last) a = make_float2(__fdiv_rn(a.x, L[h]), __fdiv_rn(a.y, L[h]));
                *p = a;
            }
    }
}

// Decode, a row of several chunks: this block's chunk z as a partial, then the last of the row's
// n_chunks blocks of this head group folds them in order z = 0, 1, ... (the same bits whichever
// block is last); it resets the counter.
template <int MT>
__device__ __forceinline__ void mla_tc_merge(const AttnRun<MLA_ND> &st, const float (&lr)[2],
                                             float *__restrict__ o_lat, float *__restrict__ part_o,
                                             float *__restrict__ part_ml, int *__restrict__ sem, int r, int h0,
                                             int ha, int hb, int z, int n_chunks, int heads, int kv_lora, int d0,
                                             int splits, int *s_last) {
    const int w = (threadIdx.x >> 5) & 3, t4 = threadIdx.x & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int hh = h ? hb : ha;
        if (hh >= heads) continue;
        const size_t slot = ((size_t)r * heads + hh) * splits + z;
#pragma unroll
        for (int d = 0; d < MLA_ND; ++d)
            if (8 * (d0 + d) < kv_lora)
                *reinterpret_cast<float2 *>(part_o + slot * kv_lora + 8 * (d0 + d) + 2 * t4) =
                    make_float2(st.acc[d][2 * h], st.acc[d][2 * h + 1]);
        if (w == 0 && t4 == 0) *reinterpret_cast<float2 *>(part_ml + slot * 2) = make_float2(st.m[h], lr[h]);
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int *cnt = sem + (size_t)r * gridDim.y + blockIdx.y;
        const bool last = atomicAdd(cnt, 1) == n_chunks - 1;
        if (last) atomicExch(cnt, 0);
        *s_last = last;
    }
    __syncthreads();
    if (!*s_last) return;
    __threadfence();
    const int hn = min(16 * MT, heads - h0);
    for (int i = threadIdx.x; i < hn * kv_lora; i += blockDim.x) {
        const int hh = h0 + i / kv_lora, d = i % kv_lora;
        const size_t base = ((size_t)r * heads + hh) * splits;
        float Mr = -INFINITY, Lr = 0.f, a = 0.f, co, cz;
#pragma unroll 4
        for (int zz = 0; zz < n_chunks; ++zz) {
            const float2 ml = __ldcg(reinterpret_cast<const float2 *>(part_ml + (base + zz) * 2));
            const float v = __ldcg(part_o + (base + zz) * kv_lora + d);
            attn_fold(Mr, Lr, ml.x, ml.y, co, cz);
            a = attn_fold_out(a, v, co, cz);
        }
        o_lat[((size_t)r * heads + hh) * kv_lora + d] = __fdiv_rn(a, Lr);
    }
}

// Row r (its context ctx = pos + 1, its sequence's page table `table`), heads h0 .. h0 + 16 MT
// - 1, block 128 MT threads: warp 4 grp + w is group grp's warp w. DECODE: keys of chunk
// blockIdx.z alone (partials to part_o / part_ml when the row has more than one chunk, the last
// block folding them); else every chunk of the row in order.
template <int MT, bool DECODE>
__device__ __forceinline__ void attend_tc(const float *__restrict__ q_lat, const bf16 *__restrict__ q,
                                          const char *__restrict__ kv, const int *__restrict__ table,
                                          float *__restrict__ o_lat, float *__restrict__ part_o,
                                          float *__restrict__ part_ml, int *__restrict__ sem, int r, int h0, int ctx,
                                          int layer, int heads, int nope, int rope, int kv_lora, int page_tokens,
                                          int token_bytes, int chunk, int splits, unsigned char *smem, int *s_last) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = warp >> 2, w = warp & 3;
    const int g = lane >> 2, t4 = lane & 3;
    const int width = kv_lora + rope, nk = width >> 4, kw = (nk + 3) >> 2, k0 = w * kw;
    const int ha = h0 + 16 * grp + g, hb = ha + 8;  // this thread's two mma rows (heads)
    bf16 *sK = reinterpret_cast<bf16 *>(smem);
    float *part = reinterpret_cast<float *>(smem + 2 * MLA_TILE * 2) + grp * MLA_PART;

    const int n_chunks = (ctx + chunk - 1) / chunk, z = DECODE ? (int)blockIdx.z : 0;
    if (z >= n_chunks) return;  // decode: a chunk past this row's context (the grid takes the step's reach)
    const int t0 = z * chunk, t1 = DECODE ? min(ctx, t0 + chunk) : ctx;
    const int n_kt = (t1 - t0 + MLA_BN - 1) / MLA_BN;
    mla_tc_load(sK, kv, table, t0, ctx, layer, width, page_tokens, token_bytes);
    cp_async_commit();

    // q fragments (A operand) of this warp's run of k16 steps; steps past nk stay zero
    unsigned qf[MLA_KW][4];
    {
        const int ra = min(ha, heads - 1), rb = min(hb, heads - 1);
#pragma unroll
        for (int kc = 0; kc < MLA_KW; ++kc) {
            const bool on = kc < kw && k0 + kc < nk;
            const int c = (k0 + kc) * 16 + 2 * t4;
            qf[kc][0] = on ? mla_tc_q2(q_lat, q, r, ra, c, heads, nope, rope, kv_lora) : 0u;
            qf[kc][1] = on ? mla_tc_q2(q_lat, q, r, rb, c, heads, nope, rope, kv_lora) : 0u;
            qf[kc][2] = on ? mla_tc_q2(q_lat, q, r, ra, c + 8, heads, nope, rope, kv_lora) : 0u;
            qf[kc][3] = on ? mla_tc_q2(q_lat, q, r, rb, c + 8, heads, nope, rope, kv_lora) : 0u;
        }
    }
    // the scale 1 / sqrt(nope + rope) (the model's, as the reference's), in log2 units
    const float sl2 = __fmul_rn(__fdiv_rn(1.f, __fsqrt_rn((float)(nope + rope))), LOG2E);

    AttnRun<MLA_ND> st;
    st.reset();
    float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.f, 0.f};  // the row's fold so far (prefill)
    const int d0 = w * MLA_ND, lim = ctx - 1;
    const bf16 *kbase0 = sK + ((lane & 7) + 8 * (lane >> 4)) * MLA_KP + 8 * ((lane >> 3) & 1);
    for (int kt = 0; kt < n_kt; ++kt) {
        const int stage = kt & 1, kb = t0 + kt * MLA_BN;
        if (kt + 1 < n_kt)
            mla_tc_load(sK + (stage ^ 1) * MLA_TILE, kv, table, kb + MLA_BN, ctx, layer, width, page_tokens,
                        token_bytes);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        // this warp's run of the scores
        float sc[MLA_NT][4];
#pragma unroll
        for (int j = 0; j < MLA_NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) sc[j][e] = 0.f;
        const bf16 *kbase = kbase0 + stage * MLA_TILE + 16 * k0;
#pragma unroll
        for (int kc = 0; kc < MLA_KW; ++kc)
            if (kc < kw && k0 + kc < nk)
#pragma unroll
                for (int j = 0; j < MLA_NT; j += 2) {
                    unsigned b[4];
                    ldsm_x4(b, kbase + 8 * j * MLA_KP + kc * 16);
                    mma_bf16(sc[j], qf[kc], b[0], b[1]);
                    mma_bf16(sc[j + 1], qf[kc], b[2], b[3]);
                }
        // the 4 runs meet: a lane's C fragments sit at the same (row, key) in every warp
#pragma unroll
        for (int j = 0; j < MLA_NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) part[((w * MLA_NT + j) * 4 + e) * 32 + lane] = sc[j][e];
        __syncthreads();
#pragma unroll
        for (int j = 0; j < MLA_NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float s = part[(j * 4 + e) * 32 + lane];
#pragma unroll
                for (int ww = 1; ww < 4; ++ww) s = __fadd_rn(s, part[((ww * MLA_NT + j) * 4 + e) * 32 + lane]);
                sc[j][e] = s;
            }
        attn_softmax_pv<MLA_BN, MLA_KP, MLA_ND>(st, sc, sK + stage * MLA_TILE, kb, lim, lim, d0, sl2);
        if (!DECODE && (kb + MLA_BN) % chunk == 0 && kt + 1 < n_kt) {  // a chunk ends, not the row's last: fold it
            const float lr[2] = {st.row_l(0), st.row_l(1)};
            mla_tc_fold(st, lr, M, L, o_lat, r, ha, hb, heads, kv_lora, d0, kb < chunk, false);
            st.reset();
        }
        __syncthreads();  // the next iteration's loads overwrite this stage and its scores this part
    }
    const float lr[2] = {st.row_l(0), st.row_l(1)};
    if (!DECODE || n_chunks == 1) {  // the row's last chunk (or its only one): fold it, o_lat = A / L
        mla_tc_fold(st, lr, M, L, o_lat, r, ha, hb, heads, kv_lora, d0, n_chunks == 1, true);
        return;
    }
    if constexpr (DECODE) mla_tc_merge<MT>(st, lr, o_lat, part_o, part_ml, sem, r, h0, ha, hb, z, n_chunks, heads,
                                           kv_lora, d0, splits, s_last);
}

// Prefill's generated rows (a preempted request's, recomputed: decode's form), a block a (row,
// 32 heads), two groups sharing the key tiles; a prompt row (pos < its sequence's prompt_len)
// exits: mla_attend_x computes it. Grid (rows, ceil(heads / 32)), block 256.
extern "C" __global__ void __launch_bounds__(256, 1)
mla_attend_tc(const float *__restrict__ q_lat, const bf16 *__restrict__ q, char *__restrict__ kv,
              const int *__restrict__ page_table, const int *__restrict__ cu_seqlens, const int *__restrict__ pos,
              const int *__restrict__ prompt_len, float *__restrict__ o_lat, int pages_per_seq, int rows, int n_seqs,
              int layer, int layers, int heads, int nope, int rope, int kv_lora, int page_tokens, int token_bytes,
              int chunk) {
    extern __shared__ __align__(16) unsigned char mla_smem[];
    const int r = blockIdx.x;
    if (r >= rows || chunk <= 0 || chunk % MLA_BN) return;
    const int s = seq_of_row(cu_seqlens, n_seqs, r);
    if (pos[r] < prompt_len[s]) return;  // a prompt token: the expanded form's (mla_attend_x)
    attend_tc<2, false>(q_lat, q, kv, page_table + (size_t)s * pages_per_seq, o_lat, nullptr, nullptr, nullptr, r,
                        blockIdx.y * 32, pos[r] + 1, layer, heads, nope, rope, kv_lora, page_tokens, token_bytes,
                        chunk, 1, mla_smem, nullptr);
}

// Decode: a block a (row, 16 heads, chunk), twice prefill's blocks a row for the few rows of a
// step. part_o f32 [rows, heads, splits, kv_lora], part_ml f32 [rows, heads, splits, 2], sem i32
// [rows, ceil(heads / 16)] (zero before the first launch; the folding block zeroes its own
// again). Grid (rows, ceil(heads / 16), splits), splits at least ceil(the step's longest
// context / chunk); block 128.
extern "C" __global__ void __launch_bounds__(128, 2)
mla_attend_tc_decode(const float *__restrict__ q_lat, const bf16 *__restrict__ q, char *__restrict__ kv,
                     const int *__restrict__ page_table, const int *__restrict__ pos, float *__restrict__ o_lat,
                     float *__restrict__ part_o, float *__restrict__ part_ml, int *__restrict__ sem,
                     int pages_per_seq, int rows, int layer, int layers, int heads, int nope, int rope, int kv_lora,
                     int page_tokens, int token_bytes, int chunk, int splits) {
    extern __shared__ __align__(16) unsigned char mla_smem[];
    const int r = blockIdx.x;
    if (r >= rows || chunk <= 0 || chunk % MLA_BN || (pos[r] + chunk) / chunk > splits) return;
    attend_tc<1, true>(q_lat, q, kv, page_table + (size_t)r * pages_per_seq, o_lat, part_o, part_ml, sem, r,
                       blockIdx.y * 16, pos[r] + 1, layer, heads, nope, rope, kv_lora, page_tokens, token_bytes,
                       chunk, splits, mla_smem,
                       reinterpret_cast<int *>(mla_smem + 2 * MLA_TILE * 2));  // the merge's flag: the partial scores' place, free by then
}

// ---- the up-projections on tensor cores (the default build's mla_absorb / mla_expand) ------
// Both are a GEMM a head over the step's rows, on mma.sync m16n8k16 with f32 accumulators: a
// block takes MLA_PT_BM rows (4 warps x 16) and MLA_PT_BN (absorb) or MLA_PT_EBN (expand: decode's
// few rows still make 2 blocks a head at v_dim 128) output columns of one head, kv_b's
// slice for them staged MLA_PT_BK k at a time in shared memory (every warp's B fragments from
// there by ldmatrix), the A fragments read by each thread from global memory. A row's outputs
// are summed over k16 steps in order from 0 into one accumulator, whichever rows share its tile
// (the mma's sums of a row depend on that row alone) and whichever kernel launch: prefill's and
// decode's rows get the same bits. Rows past `rows` repeat the last one and are never stored.
// Grid (ceil(rows / MLA_PT_BM), heads, ceil(width / its block's columns)), block 128, dynamic
// shared memory MLA_PT_SMEM (table.py).
#define MLA_PT_BM 64
#define MLA_PT_BN 128
#define MLA_PT_EBN 64
#define MLA_PT_BK 64
#define MLA_PT_NT (MLA_PT_BN / 8)                       // absorb's 8-column tiles a warp
#define MLA_PT_ENT (MLA_PT_EBN / 8)                     // expand's
#define MLA_PT_AKP (MLA_PT_BN + 8)                      // absorb's staged [k][n] row (bf16)
#define MLA_PT_EKP (MLA_PT_BK + 8)                      // expand's staged [n][k] row (bf16)
#define MLA_PT_SMEM (MLA_PT_BK * MLA_PT_AKP * 2)        // the larger of the two stagings (bytes)
static_assert(MLA_PT_EBN * MLA_PT_EKP <= MLA_PT_BK * MLA_PT_AKP, "expand's staging fits absorb's");

// q_lat[r, h, c] = sum_{d < nope} q[r, h, d] kv_b[h (nope + v_dim) + d, c] (f32): A the query's
// nope part (bf16, as stored), B kv_b's key rows [nope x kv_lora] (n contiguous: staged as
// [k][n], ldmatrix.trans). nope a multiple of 16 (the generator checks it).
extern "C" __global__ void __launch_bounds__(128)
mla_absorb_tc(const bf16 *__restrict__ q, const bf16 *__restrict__ kv_b, float *__restrict__ q_lat, int rows,
              int heads, int nope, int rope, int v_dim, int kv_lora) {
    extern __shared__ __align__(16) unsigned char mla_smem[];
    bf16 *sW = reinterpret_cast<bf16 *>(mla_smem);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    const int h = blockIdx.y, c0 = blockIdx.z * MLA_PT_BN, qd = nope + rope;
    const int r0 = blockIdx.x * MLA_PT_BM + 16 * warp, ra = min(r0 + g, rows - 1), rb = min(r0 + g + 8, rows - 1);
    const bf16 *qa = q + (size_t)ra * heads * qd + (size_t)h * qd, *qb = q + (size_t)rb * heads * qd + (size_t)h * qd;
    const bf16 *wk = kv_b + (size_t)h * (nope + v_dim) * kv_lora;
    float acc[MLA_PT_NT][4];
#pragma unroll
    for (int j = 0; j < MLA_PT_NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
    const bf16 *vbase = sW + ((lane & 7) + 8 * ((lane >> 3) & 1)) * MLA_PT_AKP + 8 * (lane >> 4);
    for (int k0 = 0; k0 < nope; k0 += MLA_PT_BK) {
        const int kn = min(MLA_PT_BK, nope - k0);
        __syncthreads();  // the previous slice's readers are done
        for (int i = threadIdx.x; i < kn * (MLA_PT_BN / 8); i += blockDim.x) {
            const int k = i / (MLA_PT_BN / 8), c = 8 * (i % (MLA_PT_BN / 8));
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (c0 + c < kv_lora) v = *reinterpret_cast<const uint4 *>(wk + (size_t)(k0 + k) * kv_lora + c0 + c);
            *reinterpret_cast<uint4 *>(sW + k * MLA_PT_AKP + c) = v;
        }
        __syncthreads();
        for (int kk = 0; kk < kn / 16; ++kk) {
            const int kc = k0 + 16 * kk + 2 * t4;
            const unsigned a[4] = {*reinterpret_cast<const unsigned *>(qa + kc), *reinterpret_cast<const unsigned *>(qb + kc),
                                   *reinterpret_cast<const unsigned *>(qa + kc + 8),
                                   *reinterpret_cast<const unsigned *>(qb + kc + 8)};
#pragma unroll
            for (int j = 0; j < MLA_PT_NT; j += 2) {
                unsigned b[4];
                ldsm_x4_t(b, vbase + 16 * kk * MLA_PT_AKP + 8 * j);
                mma_bf16(acc[j], a, b[0], b[1]);
                mma_bf16(acc[j + 1], a, b[2], b[3]);
            }
        }
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int r = r0 + g + 8 * hh;
        if (r >= rows) continue;
        float *out = q_lat + ((size_t)r * heads + h) * kv_lora + c0 + 2 * t4;
#pragma unroll
        for (int j = 0; j < MLA_PT_NT; ++j)
            if (c0 + 8 * j < kv_lora)
                *reinterpret_cast<float2 *>(out + 8 * j) = make_float2(acc[j][2 * hh], acc[j][2 * hh + 1]);
    }
}

// o[r, h v_dim + j] = sum_c o_lat[r, h, c] kv_b[h (nope + v_dim) + nope + j, c] (bf16): A the
// attention's f32 o_lat split in two bf16 parts, hi = bf16(x) and lo = bf16(x - hi) (x - hi is
// exact in f32; together ~16 of f32's 24 bits), each k16 step adding hi W, then lo W; B kv_b's
// value rows [v_dim x kv_lora] (k contiguous: staged as [n][k], ldmatrix). kv_lora a multiple
// of 32, v_dim of 8 (the generator checks both).
__device__ __forceinline__ void mla_pt_split(const float *p, unsigned &hi, unsigned &lo) {
    const float2 x = *reinterpret_cast<const float2 *>(p);
    hi = pack_bf2(x.x, x.y);
    lo = pack_bf2(__fsub_rn(x.x, rbf(x.x)), __fsub_rn(x.y, rbf(x.y)));
}

extern "C" __global__ void __launch_bounds__(128)
mla_expand_tc(const float *__restrict__ o_lat, const bf16 *__restrict__ kv_b, bf16 *__restrict__ o, int rows,
              int heads, int nope, int v_dim, int kv_lora) {
    extern __shared__ __align__(16) unsigned char mla_smem[];
    bf16 *sW = reinterpret_cast<bf16 *>(mla_smem);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t4 = lane & 3;
    const int h = blockIdx.y, n0 = blockIdx.z * MLA_PT_EBN;
    const int r0 = blockIdx.x * MLA_PT_BM + 16 * warp, ra = min(r0 + g, rows - 1), rb = min(r0 + g + 8, rows - 1);
    const float *oa = o_lat + ((size_t)ra * heads + h) * kv_lora, *ob = o_lat + ((size_t)rb * heads + h) * kv_lora;
    const bf16 *wv = kv_b + ((size_t)h * (nope + v_dim) + nope) * kv_lora;
    float acc[MLA_PT_ENT][4];
#pragma unroll
    for (int j = 0; j < MLA_PT_ENT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
    const bf16 *kbase = sW + ((lane & 7) + 8 * (lane >> 4)) * MLA_PT_EKP + 8 * ((lane >> 3) & 1);
    for (int k0 = 0; k0 < kv_lora; k0 += MLA_PT_BK) {
        const int kn = min(MLA_PT_BK, kv_lora - k0);
        __syncthreads();
        for (int i = threadIdx.x; i < MLA_PT_EBN * (MLA_PT_BK / 8); i += blockDim.x) {
            const int n = i / (MLA_PT_BK / 8), k = 8 * (i % (MLA_PT_BK / 8));
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (n0 + n < v_dim && k < kn) v = *reinterpret_cast<const uint4 *>(wv + (size_t)(n0 + n) * kv_lora + k0 + k);
            *reinterpret_cast<uint4 *>(sW + n * MLA_PT_EKP + k) = v;
        }
        __syncthreads();
        for (int kk = 0; kk < kn / 16; ++kk) {
            const int kc = k0 + 16 * kk + 2 * t4;
            unsigned hi[4], lo[4];
            mla_pt_split(oa + kc, hi[0], lo[0]);
            mla_pt_split(ob + kc, hi[1], lo[1]);
            mla_pt_split(oa + kc + 8, hi[2], lo[2]);
            mla_pt_split(ob + kc + 8, hi[3], lo[3]);
#pragma unroll
            for (int j = 0; j < MLA_PT_ENT; j += 2) {
                unsigned b[4];
                ldsm_x4(b, kbase + 8 * j * MLA_PT_EKP + 16 * kk);
                mma_bf16(acc[j], hi, b[0], b[1]);
                mma_bf16(acc[j], lo, b[0], b[1]);
                mma_bf16(acc[j + 1], hi, b[2], b[3]);
                mma_bf16(acc[j + 1], lo, b[2], b[3]);
            }
        }
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int r = r0 + g + 8 * hh;
        if (r >= rows) continue;
        bf16 *out = o + (size_t)r * heads * v_dim + (size_t)h * v_dim + n0 + 2 * t4;
#pragma unroll
        for (int j = 0; j < MLA_PT_ENT; ++j)
            if (n0 + 8 * j < v_dim)
                *reinterpret_cast<unsigned *>(out + 8 * j) = pack_bf2(acc[j][2 * hh], acc[j][2 * hh + 1]);
    }
}

// ---- the expanded form: a prompt's rows ---------------------------------------------------------
// A prompt token attends in the non-absorbed form, whatever step carries it (a generated token
// always in the absorbed one above: the form is fixed by the token's role, so its bits are too;
// docs/hybrid.md). Per (row, head) the query [q_nope | q_rope] (nope + rope channels, as q
// holds them) against each key's [k_nope (nope, expanded) | k_rope (rope, the cache's key
// part)], the softmax-weighted values (v_dim, expanded) out: a third of the absorbed form's
// arithmetic at Kimi's shape (192 + 128 against 576 + 512 a (query, key, head)).
//
// The keys' expansion is a GEMM before this op (kx = latent x kv_b^T through the invariant
// linear_gemm, a key a row: the same bits for a key whatever step expands it). A step's
// sequences with a prompt row need their keys 0 .. the last prompt row's position: `mla_keys`
// numbers them (koff, each sequence's first key in kx), `mla_gather` copies their latents
// from the pages into lat, the GEMM's x. kx [keys, heads x (nope + v_dim)]: a head's k_nope
// then its value, kv_b's row order.
//
// The order of one (prompt row, head) over its keys 0 .. pos: tiles of MLA_X_BN keys from key
// 0; a tile's scores S = q K^T on mma.sync m16n8k16, the (nope + rope) / 16 k16 steps in order
// from 0 into one accumulator; then attention_tc.cuh's softmax and P V (attn_softmax_pv: scale
// 1 / sqrt(nope + rope) in log2 units, running max, exp2, P rounded to bf16 times V on mma,
// l a thread's columns added in the quad's xor order at the end); o = acc / l rounded to bf16.
// One running (m, l, acc) a row (no chunks: nothing else computes a prompt row, so no split
// to agree with). A tile past a row's position passes it unchanged (attention_tc.cuh), so a
// block may walk more keys than a row needs; the mma's sums of a row depend on that row alone.
// So a prompt token's bits depend on its sequence's tokens alone: not the batch, the cut, the cache.
#define MLA_X_BM 64                         // query rows a block (4 warps x 16)
#define MLA_X_BN 32                         // keys a tile
#define MLA_X_MAX_QK 192                    // nope + rope, a multiple of 16
#define MLA_X_MAX_V 128                     // v_dim, a multiple of 8
#define MLA_X_KP (MLA_X_MAX_QK + 8)         // padded K row (bf16): 400 bytes, ldmatrix conflict-free
#define MLA_X_VP (MLA_X_MAX_V + 8)          // padded V row: 272 bytes
#define MLA_X_KC (MLA_X_MAX_QK / 16)        // k16 steps of q K^T, at most
#define MLA_X_ND (MLA_X_MAX_V / 8)          // 8-dim output tiles (past v_dim: zero V columns, never stored)
#define MLA_X_KEYS_THREADS 256
// mla_attend_x's dynamic shared memory (bytes): two stages of K and V tiles, the warps' maxima
#define MLA_X_SMEM (2 * MLA_X_BN * (MLA_X_KP + MLA_X_VP) * 2 + 16)

// The keys sequence s needs in the expanded form: 0 .. its last prompt row's position, if the
// step holds a prompt row of it (its rows are consecutive positions from pos[cu_seqlens[s]]).
__device__ __forceinline__ int mla_x_keys(const int *__restrict__ cu_seqlens, const int *__restrict__ pos,
                                          const int *__restrict__ prompt_len, int s) {
    const int r0 = cu_seqlens[s], r1 = cu_seqlens[s + 1];
    if (r1 <= r0 || pos[r0] >= prompt_len[s]) return 0;
    return min(pos[r1 - 1] + 1, prompt_len[s]);
}

// The prompt rows of sequence s in this step (a prefix of its rows).
__device__ __forceinline__ int mla_x_rows(const int *__restrict__ cu_seqlens, const int *__restrict__ pos,
                                          const int *__restrict__ prompt_len, int s) {
    const int r0 = cu_seqlens[s], n = cu_seqlens[s + 1] - r0;
    return n <= 0 ? 0 : max(0, min(n, prompt_len[s] - pos[r0]));
}

// The block's tile of prompt rows: tiles of BM prompt rows of one sequence numbered over the
// sequences in order, block y taking tile T - 1 - y of the T (later tiles see more keys: the
// heavy ones start first). False where y >= T (the grid's spare blocks) or the host's bounds
// would be broken (they never are); else the sequence s, its first row r0 and the tile's rows.
__device__ __forceinline__ bool mla_x_tile(const int *__restrict__ cu_seqlens, const int *__restrict__ pos,
                                           const int *__restrict__ prompt_len, const int *__restrict__ koff,
                                           int n_seqs, int rows, int keys, int BM, int &s, int &r0, int &nrows) {
    int total = 0;
    for (int i = 0; i < n_seqs; ++i) total += (mla_x_rows(cu_seqlens, pos, prompt_len, i) + BM - 1) / BM;
    if ((int)blockIdx.y >= total) return false;
    const int tile = total - 1 - (int)blockIdx.y;
    int first = 0, np = 0;
    for (s = 0;; ++s) {
        np = mla_x_rows(cu_seqlens, pos, prompt_len, s);
        const int n = (np + BM - 1) / BM;
        if (tile < first + n) break;
        first += n;
    }
    r0 = cu_seqlens[s] + (tile - first) * BM;
    nrows = min(BM, cu_seqlens[s] + np - r0);
    return r0 + nrows <= rows && koff[s + 1] <= keys;
}

// A thread's q fragments (the A operand of mma.sync m16n8k16, and of wgmma's RS form: the same
// layout) of rows ra and rb, head h: k16 steps past nope + rope zero.
__device__ __forceinline__ void mla_x_load_q(unsigned (&qf)[MLA_X_KC][4], const bf16 *__restrict__ q, int ra, int rb,
                                             int h, int heads, int qk) {
    const int t4 = threadIdx.x & 3, nk = qk >> 4;
    const bf16 *qa = q + (size_t)ra * heads * qk + (size_t)h * qk, *qb = q + (size_t)rb * heads * qk + (size_t)h * qk;
#pragma unroll
    for (int kc = 0; kc < MLA_X_KC; ++kc) {
        const bool on = kc < nk;
        qf[kc][0] = on ? *reinterpret_cast<const unsigned *>(qa + kc * 16 + 2 * t4) : 0u;
        qf[kc][1] = on ? *reinterpret_cast<const unsigned *>(qb + kc * 16 + 2 * t4) : 0u;
        qf[kc][2] = on ? *reinterpret_cast<const unsigned *>(qa + kc * 16 + 8 + 2 * t4) : 0u;
        qf[kc][3] = on ? *reinterpret_cast<const unsigned *>(qb + kc * 16 + 8 + 2 * t4) : 0u;
    }
}

// A thread's two rows' outputs, o = acc / l (l its quad's parts added in attention_tc.cuh's
// order) rounded to bf16, rows ra, rb of the tile from r0 (those past nrows repeat the last row:
// not stored), head h's v_dim columns (the zero tiles past them not stored).
__device__ __forceinline__ void mla_x_store(const AttnRun<MLA_X_ND> &st, bf16 *__restrict__ o, int r0, int ra, int rb,
                                            int nrows, int h, int heads, int v_dim) {
    const int t4 = threadIdx.x & 3;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const float l = st.row_l(hh);
        const int rr = hh ? rb : ra;
        if (rr >= nrows) continue;
        bf16 *orow = o + (size_t)(r0 + rr) * heads * v_dim + (size_t)h * v_dim + 2 * t4;
#pragma unroll
        for (int d = 0; d < MLA_X_ND; ++d)
            if (8 * d < v_dim)
                *reinterpret_cast<unsigned *>(orow + 8 * d) =
                    pack_bf2(__fdiv_rn(st.acc[d][2 * hh], l), __fdiv_rn(st.acc[d][2 * hh + 1], l));
    }
}

// koff[s] = the keys sequences 0 .. s - 1 need (koff[n_seqs]: the step's total; the host sets
// the `keys` var to at least that). One block of MLA_X_KEYS_THREADS, a thread a sequence, an
// inclusive scan in shared memory (dynamic, MLA_X_KEYS_THREADS ints) a round of them.
extern "C" __global__ void __launch_bounds__(MLA_X_KEYS_THREADS)
mla_keys(const int *__restrict__ cu_seqlens, const int *__restrict__ pos, const int *__restrict__ prompt_len,
         int *__restrict__ koff, int n_seqs) {
    extern __shared__ __align__(16) unsigned char mla_smem[];
    int *sc = reinterpret_cast<int *>(mla_smem);
    int base = 0;
    if (threadIdx.x == 0) koff[0] = 0;
    for (int s0 = 0; s0 < n_seqs; s0 += MLA_X_KEYS_THREADS) {
        const int s = s0 + threadIdx.x;
        sc[threadIdx.x] = s < n_seqs ? mla_x_keys(cu_seqlens, pos, prompt_len, s) : 0;
        __syncthreads();
        for (int d = 1; d < MLA_X_KEYS_THREADS; d <<= 1) {
            const int v = threadIdx.x >= d ? sc[threadIdx.x - d] : 0;
            __syncthreads();
            sc[threadIdx.x] += v;
            __syncthreads();
        }
        if (s < n_seqs) koff[s + 1] = base + sc[threadIdx.x];
        base += sc[MLA_X_KEYS_THREADS - 1];
        __syncthreads();
    }
}

// lat[j] = the latent (kv_lora bf16, as cached) of key j of the numbering above: a block a key,
// 16 bytes a thread. Keys past the step's total (or past `keys`) are left as they are: the
// GEMM's rows for them are never read.
extern "C" __global__ void __launch_bounds__(64)
mla_gather(const char *__restrict__ kv, const int *__restrict__ page_table, const int *__restrict__ koff,
           bf16 *__restrict__ lat, int pages_per_seq, int n_seqs, int keys, int layer, int layers, int kv_lora,
           int rope, int page_tokens, int token_bytes) {
    const int j = blockIdx.x;
    if (j >= keys || j >= koff[n_seqs] || (int)threadIdx.x * 8 >= kv_lora) return;
    int lo = 0, hi = n_seqs - 1;  // the sequence whose keys hold j: koff[s] <= j < koff[s + 1]
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (koff[mid] <= j) lo = mid; else hi = mid - 1;
    }
    const int t = j - koff[lo];
    const bf16 *src = mla_tc_row(kv, page_table[(size_t)lo * pages_per_seq + t / page_tokens], layer, t % page_tokens,
                                 page_tokens, kv_lora + rope, token_bytes);
    *reinterpret_cast<uint4 *>(lat + (size_t)j * kv_lora + threadIdx.x * 8) =
        *reinterpret_cast<const uint4 *>(src + threadIdx.x * 8);
}

// Keys kb .. kb + MLA_X_BN - 1 of the block's sequence (its first key kbase in kx) into a stage:
// K [k_nope | k_rope] (nope + rope channels), V (v_dim, the columns past it zero); keys at or
// past kend zero-filled (their P is 0, and a stale row's NaN never meets it).
__device__ __forceinline__ void mla_x_load(bf16 *sK, bf16 *sV, const bf16 *__restrict__ kx,
                                           const char *__restrict__ kv, const int *__restrict__ table, int kb,
                                           int kend, int kbase, int h, int layer, int heads, int nope, int rope,
                                           int kv_lora, int v_dim, int page_tokens, int token_bytes) {
    constexpr int CK = MLA_X_MAX_QK / 8, CV = MLA_X_MAX_V / 8;  // 16-byte copies of a K and a V row, at most
    const int qk8 = (nope + rope) >> 3, ldx = heads * (nope + v_dim);
    for (int c = threadIdx.x; c < MLA_X_BN * (CK + CV); c += blockDim.x) {
        const int tt = c / (CK + CV), ch = c % (CK + CV), t = kb + tt;
        const bool on = t < kend;
        const bf16 *row = kx + (size_t)(kbase + (on ? t : 0)) * ldx + (size_t)h * (nope + v_dim);
        if (ch < CK) {
            if (ch >= qk8) continue;  // past nope + rope: no k16 step reads it
            const int d = ch * 8;
            const bf16 *src = !on ? kx
                              : d < nope ? row + d
                                         : mla_tc_row(kv, table[t / page_tokens], layer, t % page_tokens, page_tokens,
                                                      kv_lora + rope, token_bytes) + kv_lora + (d - nope);
            cp_async16_zfill(sK + tt * MLA_X_KP + d, src, on ? 16 : 0);
        } else {
            const int d = (ch - CK) * 8;
            const bool ok = on && d < v_dim;
            cp_async16_zfill(sV + tt * MLA_X_VP + d, ok ? row + nope + d : kx, ok ? 16 : 0);
        }
    }
}

// The prompt rows' attention, o [rows, heads x v_dim] bf16 (the absorbed path's mla_expand_tc
// wrote every row before; this overwrites the prompt rows). Tiles of MLA_X_BM prompt rows of one
// sequence, a block per (head, tile): block (x, y) takes head x and tile T - 1 - y of the T
// tiles numbered over the sequences in order (later tiles see more keys: the heavy ones start
// first); y >= T exits, hence grid (heads, ceil(rows / MLA_X_BM) + n_seqs), block 128, dynamic
// shared memory MLA_X_SMEM. Warp w owns
// the tile's rows 16 w .. 16 w + 15 (rows past its end repeat its last row, never stored).
extern "C" __global__ void __launch_bounds__(128)
mla_attend_x(const bf16 *__restrict__ q, const char *__restrict__ kv, const int *__restrict__ page_table,
             const int *__restrict__ cu_seqlens, const int *__restrict__ pos, const int *__restrict__ prompt_len,
             const int *__restrict__ koff, const bf16 *__restrict__ kx, bf16 *__restrict__ o, int pages_per_seq,
             int rows, int n_seqs, int keys, int layer, int layers, int heads, int nope, int rope, int kv_lora,
             int v_dim, int page_tokens, int token_bytes) {
    extern __shared__ __align__(16) unsigned char mla_smem[];
    bf16 *sK = reinterpret_cast<bf16 *>(mla_smem), *sV = sK + 2 * MLA_X_BN * MLA_X_KP;
    int *s_max = reinterpret_cast<int *>(sV + 2 * MLA_X_BN * MLA_X_VP);
    const int h = blockIdx.x, qk = nope + rope;
    if (h >= heads || qk > MLA_X_MAX_QK || qk % 16 || nope % 8 || v_dim > MLA_X_MAX_V || v_dim % 8) return;
    int s, r0, nrows;
    if (!mla_x_tile(cu_seqlens, pos, prompt_len, koff, n_seqs, rows, keys, MLA_X_BM, s, r0, nrows)) return;
    const int kbase = koff[s], kneed = koff[s + 1] - kbase;
    const int *table = page_table + (size_t)s * pages_per_seq;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
    const int ra = 16 * warp + g, rb = ra + 8;
    const int rra = r0 + min(ra, nrows - 1), rrb = r0 + min(rb, nrows - 1);
    const int pa = pos[rra], pb = pos[rrb];
    const int wmax = warp_max(max(pa, pb));
    if (lane == 0) s_max[warp] = wmax;
    __syncthreads();
    const int kend = min(max(max(s_max[0], s_max[1]), max(s_max[2], s_max[3])) + 1, kneed);  // keys [0, kend) are read

    const int nk = qk >> 4;
    unsigned qf[MLA_X_KC][4];
    mla_x_load_q(qf, q, rra, rrb, h, heads, qk);
    // the scale 1 / sqrt(nope + rope) (the model's, as the absorbed form's), in log2 units
    const float sl2 = __fmul_rn(__fdiv_rn(1.f, __fsqrt_rn((float)qk)), LOG2E);
    AttnRun<MLA_X_ND> st;
    st.reset();
    const int n_kt = (kend + MLA_X_BN - 1) / MLA_X_BN;
    mla_x_load(sK, sV, kx, kv, table, 0, kend, kbase, h, layer, heads, nope, rope, kv_lora, v_dim, page_tokens,
               token_bytes);
    cp_async_commit();
    const bf16 *kofs = sK + ((lane & 7) + 8 * (lane >> 4)) * MLA_X_KP + 8 * ((lane >> 3) & 1);
    for (int kt = 0; kt < n_kt; ++kt) {
        const int stage = kt & 1, kb = kt * MLA_X_BN;
        if (kt + 1 < n_kt)
            mla_x_load(sK + (stage ^ 1) * MLA_X_BN * MLA_X_KP, sV + (stage ^ 1) * MLA_X_BN * MLA_X_VP, kx, kv, table,
                       kb + MLA_X_BN, kend, kbase, h, layer, heads, nope, rope, kv_lora, v_dim, page_tokens,
                       token_bytes);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (kb <= wmax) {  // some row of this warp sees a key of the tile
            float sc[MLA_X_BN / 8][4];
#pragma unroll
            for (int j = 0; j < MLA_X_BN / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) sc[j][e] = 0.f;
            const bf16 *kbp = kofs + stage * MLA_X_BN * MLA_X_KP;
#pragma unroll
            for (int kc = 0; kc < MLA_X_KC; ++kc)
                if (kc < nk)
#pragma unroll
                    for (int j = 0; j < MLA_X_BN / 8; j += 2) {
                        unsigned b[4];
                        ldsm_x4(b, kbp + 8 * j * MLA_X_KP + kc * 16);
                        mma_bf16(sc[j], qf[kc], b[0], b[1]);
                        mma_bf16(sc[j + 1], qf[kc], b[2], b[3]);
                    }
            attn_softmax_pv<MLA_X_BN, MLA_X_VP, MLA_X_ND>(st, sc, sV + stage * MLA_X_BN * MLA_X_VP, kb, pa, pb, 0, sl2);
        }
        __syncthreads();  // the next iteration's loads overwrite this stage
    }
    mla_x_store(st, o, r0, ra, rb, nrows, h, heads, v_dim);
}


// ---- the expanded form on wgmma (sm_90a): mla_attend_x_wg ------------------------------------
// mla_attend_x's order, op for op, on Hopper's warpgroup MMA, so a prompt row gets the SAME BITS
// from either kernel (the emulated and the GPU tests compare them): a k16 step's sum has the same
// bits through wgmma as through mma.sync (wgmma.cuh), and wgmma's accumulator fragments are
// mma.sync's (a warp's 16 rows, d[4j + 2h + e] = sc[j][2h + e]), so attention_tc.cuh's softmax
// runs unchanged on them and its packed P is the RS form's A operand in place (mla_wg.cuh).
// - The order tile stays MLA_X_BN (32) keys from key 0: the softmax's running max moves per 32
//   keys, as mla_attend_x's. A stage holds MLA_XW_BK (64) keys: S = q K^T for the 64 on one
//   m64n64 wgmma chain (each score its own sum, whatever N: the (nope + rope) / 16 k16 steps in
//   order, then steps of zeros up to 192, which add exact zeros; the first step starts the sum,
//   scale-d 0, where mma.sync adds its zeroed accumulator: the two can differ only in a zero
//   score's sign, which reaches no output bit, since a score is scaled, maxed and subtracted into
//   exp2, and exp2(+-0) = 1), then the two order tiles in turn: softmax, the output rescaled, P V
//   as 2 k16 steps of m64n128 (keys in order). The second tile's rescale waits for the first's
//   P V to retire (the output is the wgmma's meanwhile); its max and P do not.
// - q (64 rows x nope + rope a warpgroup) lives in registers (the RS form's A: 48 a thread), so
//   shared memory holds keys alone: a stage's K as 3 blocks of 64 channels and V as 2 atoms of
//   64 dims, each 64 keys of 128-byte rows, 128-byte swizzled (the GEMM's K-major tile; V's same
//   rows read N-major). A k16 step of q K^T is 32 bytes into a K block (wgmma.cuh's advance); a
//   k16 step of P V is 16 keys (2 KiB) into V, its two atoms LBO = 8 KiB apart.
// - A block: MLA_XW_BM (128) prompt rows of one head (mla_attend_x's tiles, twice as tall), two
//   consumer warpgroups (warps 0-3 rows 0-63, warps 4-7 rows 64-127; warp w of a group its 16
//   rows w, as mla_attend_x's warps) sharing each stage, and a producer warpgroup (warps 8-11)
//   filling MLA_XW_STAGES stages with cp.async, completing on the stage's `full` mbarrier; a
//   consumer releases a stage (`empty`) once the wgmma reading it retired. Registers: a consumer
//   thread holds q (48), the output (64), S (32), P (8), ~180 in all, more than 384 threads get
//   (168; blocks are counted in whole warpgroups, so 64 rows and a producer warp, two blocks an
//   SM, cap there too and spill): the producer gives registers back (setmaxnreg, MLA_XW_PREGS)
//   and the consumers take them (MLA_XW_CREGS), FlashAttention-3's split. One block an SM, its
//   two warpgroups' softmax and wgmma interleaved by the warp schedulers. Shared memory 121 KiB.
// - Rows that see no key of an order tile pass it unchanged (attention_tc.cuh), so both
//   warpgroups walk every stage the producer loads (to the block's last row's position; the
//   first group's rows at most 64 keys fewer): a branch around a wgmma made ptxas serialize
//   them all (C7513, as did the output's zeros set after the loop began, C7515), and the wasted
//   stage is one in (prompt length / 64).
#include "mla_wg.cuh"

#define MLA_XW_BM 128                                    // prompt rows a block (2 warpgroups x 64)
#define MLA_XW_BK 64                                     // keys a stage (the S wgmma's N)
#define MLA_XW_STAGES 3
#define MLA_XW_ROW 128                                   // bytes a swizzled row (64 bf16)
#define MLA_XW_KBYTES (MLA_X_MAX_QK / 64 * MLA_XW_BK * MLA_XW_ROW)  // a stage's K: 3 blocks, 24 KiB
#define MLA_XW_VBYTES (MLA_X_MAX_V / 64 * MLA_XW_BK * MLA_XW_ROW)   // its V: 2 atoms, 16 KiB
#define MLA_XW_STAGE (MLA_XW_KBYTES + MLA_XW_VBYTES)
#define MLA_XW_THREADS 384                               // two consumer warpgroups and a producer one
#define MLA_XW_PREGS 72                                  // registers a producer thread (setmaxnreg; 64 spill)
#define MLA_XW_CREGS 216                                 // a consumer's (176 spill): 128 x 72 + 256 x 216 <= 65,536
// mla_attend_x_wg's dynamic shared memory (bytes): the stages, their 1024-byte alignment, the
// full and empty barriers, the warps' maxima (table.py MLA_XW_SMEM)
#define MLA_XW_SMEM (MLA_XW_STAGES * MLA_XW_STAGE + 1024 + 2 * MLA_XW_STAGES * 8 + 32)

// The descriptor of a 128-byte-swizzled operand at p: lbo, sbo in bytes (wgmma's fields: 16-byte
// units, bits 16 and 32); 8 rows of 128 bytes are sbo apart. K-major (q K^T's keys): lbo unused.
// N-major (P V's values): lbo the step from one 64-wide atom of n to the next.
__device__ __forceinline__ uint64_t mla_xw_desc(const void *p, uint32_t lbo, uint32_t sbo) {
    uint64_t d = (uint64_t)((smem_u32(p) & 0x3FFFF) >> 4);
    d |= (uint64_t)((lbo >> 4) & 0x3FFF) << 16;
    d |= (uint64_t)((sbo >> 4) & 0x3FFF) << 32;
    d |= (uint64_t)1 << 62;  // 128-byte swizzle
    return d;
}

// attention_tc.cuh's attn_softmax_pv for one order tile of MLA_X_BN keys kb .., up to P: the same
// ops on the same values in the same order (mask, max, corr, m, l rescaled, p, l summed), the
// output's rescale by corr and P V left to the caller (the output is the wgmma's until it
// retires). sc: the tile's scores as attn_softmax_pv's sc[j][e] (= sc[4j + e]); P packed as it
// packs it, pa[kk] the A fragments of k16 step kk.
__device__ __forceinline__ void mla_xw_softmax(AttnRun<MLA_X_ND> &st, float *sc, int kb, int lim_a, int lim_b,
                                               float sl2, float (&corr)[2], unsigned (&pa)[2][4]) {
    constexpr int NT = MLA_X_BN / 8;
    const int t4 = threadIdx.x & 3;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float v = __fmul_rn(sc[4 * j + e], sl2);
            if (kb + 8 * j + 2 * t4 + (e & 1) > ((e >> 1) ? lim_b : lim_a)) v = -INFINITY;
            sc[4 * j + e] = v;
            mx[e >> 1] = fmaxf(mx[e >> 1], v);
        }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float mn = fmaxf(st.m[h], mx[h]);
        const float mu = mn == -INFINITY ? 0.f : mn;  // a row with no key yet stays at (-inf, 0, 0)
        corr[h] = exp2f(__fsub_rn(st.m[h], mu));
        st.m[h] = mn;
        mx[h] = mu;
        st.l[h] = __fmul_rn(st.l[h], corr[h]);
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float p = exp2f(__fsub_rn(sc[4 * j + e], mx[e >> 1]));
            sc[4 * j + e] = p;
            st.l[e >> 1] = __fadd_rn(st.l[e >> 1], p);
        }
#pragma unroll
    for (int kk = 0; kk < MLA_X_BN / 16; ++kk) {
        const float *s = sc + 8 * kk;
        pa[kk][0] = pack_bf2(s[0], s[1]);
        pa[kk][1] = pack_bf2(s[2], s[3]);
        pa[kk][2] = pack_bf2(s[4], s[5]);
        pa[kk][3] = pack_bf2(s[6], s[7]);
    }
}

// The producer warpgroup: keys kb .. kb + MLA_XW_BK - 1 of the block's sequence into a stage, 16-byte
// cp.async copies into the swizzled rows (key tt's chunk c of a 64-channel block at sw128(tt, c)):
// kx's [k_nope | v] of head h, consecutive in a key's row (warp w the keys w, w + 4, ..., its
// copies of a key one run of 512 bytes at Kimi's shape), then the cached k_rope (8 copies a key
// at Kimi's). Keys at or past
// kend zero-filled (their P is 0, and a stale NaN never meets it); V's chunks past v_dim are
// zeroed once, before the first stage, as K's past nope + rope.
__device__ __forceinline__ void mla_xw_load(char *sk, const bf16 *__restrict__ kx, const char *__restrict__ kv,
                                            const int *__restrict__ table, int kb, int kend, int kbase, int h,
                                            int layer, int heads, int nope, int rope, int kv_lora, int v_dim,
                                            int page_tokens, int token_bytes) {
    const int lane = threadIdx.x & 31, pw = (threadIdx.x >> 5) & 3, n8 = nope >> 3, nx = (nope + v_dim) >> 3,
              nr = rope >> 3;
    const size_t ldx = (size_t)heads * (nope + v_dim);
    char *sv = sk + MLA_XW_KBYTES;
    for (int tt = pw; tt < MLA_XW_BK; tt += 4) {
        const int t = kb + tt;
        const bool on = t < kend;
        const bf16 *row = kx + (size_t)(kbase + (on ? t : 0)) * ldx + (size_t)h * (nope + v_dim);
        for (int c = lane; c < nx; c += 32) {
            const int cc = c < n8 ? c : c - n8;
            char *dst = (c < n8 ? sk : sv) + (cc >> 3) * (MLA_XW_BK * MLA_XW_ROW) + sw128(tt, cc & 7);
            cp_async16_zfill(dst, on ? row + 8 * c : kx, on ? 16 : 0);
        }
    }
    for (int i = threadIdx.x & 127; i < MLA_XW_BK * nr; i += 128) {
        const int tt = i / nr, c = n8 + i % nr, t = kb + tt;
        const bool on = t < kend;
        const bf16 *src = on ? mla_tc_row(kv, table[t / page_tokens], layer, t % page_tokens, page_tokens,
                                          kv_lora + rope, token_bytes) + kv_lora + 8 * (c - n8)
                             : kx;
        cp_async16_zfill(sk + (c >> 3) * (MLA_XW_BK * MLA_XW_ROW) + sw128(tt, c & 7), src, on ? 16 : 0);
    }
}

// mla_attend_x on wgmma: its parameters; tiles of MLA_XW_BM prompt rows of one sequence, block
// (x, y) head x and tile T - 1 - y of the T numbered over the sequences in order (y >= T exits),
// hence grid (heads, ceil(rows / MLA_XW_BM) + n_seqs), block MLA_XW_THREADS, dynamic shared
// memory MLA_XW_SMEM. Rows past a tile's end repeat its last row, never stored.
extern "C" __global__ void __launch_bounds__(MLA_XW_THREADS, 1)
mla_attend_x_wg(const bf16 *__restrict__ q, const char *__restrict__ kv, const int *__restrict__ page_table,
                const int *__restrict__ cu_seqlens, const int *__restrict__ pos, const int *__restrict__ prompt_len,
                const int *__restrict__ koff, const bf16 *__restrict__ kx, bf16 *__restrict__ o, int pages_per_seq,
                int rows, int n_seqs, int keys, int layer, int layers, int heads, int nope, int rope, int kv_lora,
                int v_dim, int page_tokens, int token_bytes) {
    extern __shared__ __align__(16) unsigned char mla_smem[];
    char *ring = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(mla_smem) + 1023) & ~uintptr_t(1023));
    uint64_t *full = reinterpret_cast<uint64_t *>(ring + MLA_XW_STAGES * MLA_XW_STAGE), *empty = full + MLA_XW_STAGES;
    int *s_max = reinterpret_cast<int *>(empty + MLA_XW_STAGES);
    const int h = blockIdx.x, qk = nope + rope;
    if (h >= heads || qk > MLA_X_MAX_QK || qk % 16 || nope % 8 || v_dim > MLA_X_MAX_V || v_dim % 8) return;
    int s, r0, nrows;
    if (!mla_x_tile(cu_seqlens, pos, prompt_len, koff, n_seqs, rows, keys, MLA_XW_BM, s, r0, nrows)) return;
    const int kbase = koff[s], kneed = koff[s + 1] - kbase;
    const int *table = page_table + (size_t)s * pages_per_seq;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = warp >> 2, g = lane >> 2;
    const int ra = 16 * warp + g, rb = ra + 8;  // a consumer thread's rows of the tile (warp < 8)
    const int rra = r0 + min(ra, nrows - 1), rrb = r0 + min(rb, nrows - 1);
    int pa = 0, pb = 0;
    if (wg < 2) {
        pa = pos[rra], pb = pos[rrb];
        const int wmax = warp_max(max(pa, pb));
        if (lane == 0) s_max[warp] = wmax;
    }
    if (threadIdx.x == 0) {
        for (int i = 0; i < MLA_XW_STAGES; ++i) {
            mbar_init(&full[i], 128);   // the producer's threads, each once its copies landed
            mbar_init(&empty[i], 256);  // every consumer thread
        }
        mbar_init_fence();
    }
    // K's chunks past nope + rope and V's past v_dim: zero in every stage (no copy writes them;
    // q K^T's steps past nk and P V read them)
    constexpr int CK = MLA_X_MAX_QK / 8, CV = MLA_X_MAX_V / 8;
    for (int i = threadIdx.x; i < MLA_XW_STAGES * MLA_XW_BK * (CK + CV); i += MLA_XW_THREADS) {
        const int st = i / (MLA_XW_BK * (CK + CV)), tt = i / (CK + CV) % MLA_XW_BK, c = i % (CK + CV);
        const bool k = c < CK;
        const int cc = k ? c : c - CK;
        if (8 * cc >= (k ? qk : v_dim))
            *reinterpret_cast<uint4 *>(ring + st * MLA_XW_STAGE + (k ? 0 : MLA_XW_KBYTES) + (cc >> 3) * (MLA_XW_BK * MLA_XW_ROW) +
                                       sw128(tt, cc & 7)) = make_uint4(0, 0, 0, 0);
    }
    fence_async_smem();
    __syncthreads();
    int bmax = s_max[0];
    for (int w = 1; w < 8; ++w) bmax = max(bmax, s_max[w]);
    const int kend = min(bmax + 1, kneed);  // keys [0, kend) are read
    const int n_t = (kend + MLA_XW_BK - 1) / MLA_XW_BK;

    if (wg == 2) {  // the producer
        wg_regs_dec<MLA_XW_PREGS>();
        for (int t = 0; t < n_t; ++t) {
            const int st = t % MLA_XW_STAGES;
            if (t >= MLA_XW_STAGES) mbar_wait(&empty[st], (t / MLA_XW_STAGES - 1) & 1);
            mla_xw_load(ring + st * MLA_XW_STAGE, kx, kv, table, t * MLA_XW_BK, kend, kbase, h, layer, heads, nope,
                        rope, kv_lora, v_dim, page_tokens, token_bytes);
            cp_async_arrive(&full[st]);
        }
        cp_async_wait<0>();
        return;
    }

    // a consumer warpgroup
    wg_regs_inc<MLA_XW_CREGS>();
    unsigned qf[MLA_X_KC][4];
    mla_x_load_q(qf, q, rra, rrb, h, heads, qk);
    // the scale 1 / sqrt(nope + rope) (the model's, as the absorbed form's), in log2 units
    const float sl2 = __fmul_rn(__fdiv_rn(1.f, __fsqrt_rn((float)qk)), LOG2E);
    AttnRun<MLA_X_ND> st;
    st.reset();
    float(&acc)[4 * MLA_X_ND] = *reinterpret_cast<float(*)[4 * MLA_X_ND]>(&st.acc[0][0]);  // wgmma's d[4d + e] = acc[d][e]
    wgmma_reg_fence(acc);  // the zeros set here, before any wgmma (else ptxas serializes them all, C7515)
    for (int t = 0; t < n_t; ++t) {
        const int stage = t % MLA_XW_STAGES;
        const char *sk = ring + stage * MLA_XW_STAGE, *sv = sk + MLA_XW_KBYTES;
        mbar_wait(&full[stage], (t / MLA_XW_STAGES) & 1);
        fence_async_smem();
        float S[MLA_XW_BK / 2];
        wgmma_fence();
#pragma unroll
        for (int kc = 0; kc < MLA_X_KC; ++kc)  // steps past nk add q's zeros times K's zeros (no branch for ptxas)
            wgmma_rs_n64(S, qf[kc], mla_xw_desc(sk + (kc >> 2) * (MLA_XW_BK * MLA_XW_ROW) + 32 * (kc & 3), 16,
                                                8 * MLA_XW_ROW), kc > 0);
        wgmma_commit();
        wgmma_wait<0>();  // S, and the previous stage's P V: that stage is free
        wgmma_reg_fence(S);
        wgmma_reg_fence(acc);
        if (t > 0) mbar_arrive(&empty[(t - 1) % MLA_XW_STAGES]);
        // the two tiles' P apart: the first's is the wgmma's while the second's is computed
        unsigned p[MLA_XW_BK / MLA_X_BN][2][4];
#pragma unroll
        for (int u = 0; u < MLA_XW_BK / MLA_X_BN; ++u) {
            const int kb = t * MLA_XW_BK + u * MLA_X_BN;
            float corr[2];
            mla_xw_softmax(st, S + u * (MLA_X_BN / 2), kb, pa, pb, sl2, corr, p[u]);
            wgmma_wait<0>();  // the previous tile's P V retired: the output is this thread's again
            wgmma_reg_fence(acc);
            if (u > 0) wgmma_reg_fence(p[u - 1][0]), wgmma_reg_fence(p[u - 1][1]);
            if (corr[0] != 1.f || corr[1] != 1.f)  // times 1 keeps every bit: skipped
#pragma unroll
                for (int d = 0; d < MLA_X_ND; ++d) {
                    st.acc[d][0] = __fmul_rn(st.acc[d][0], corr[0]);
                    st.acc[d][1] = __fmul_rn(st.acc[d][1], corr[0]);
                    st.acc[d][2] = __fmul_rn(st.acc[d][2], corr[1]);
                    st.acc[d][3] = __fmul_rn(st.acc[d][3], corr[1]);
                }
            wgmma_reg_fence(acc);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < MLA_X_BN / 16; ++kk)
                wgmma_rs_n128_t(acc, p[u][kk], mla_xw_desc(sv + (u * MLA_X_BN + 16 * kk) * MLA_XW_ROW,
                                                        MLA_XW_BK * MLA_XW_ROW, 8 * MLA_XW_ROW));
            wgmma_commit();
        }
    }
    wgmma_wait<0>();
    wgmma_reg_fence(acc);
    mla_x_store(st, o, r0, ra, rb, nrows, h, heads, v_dim);
}
