// Attention over the paged KV state on tensor cores (GQA, causal, scale 1/sqrt(head_dim)), in
// the one order of models/common/cuda/attention_tc.cuh for every query row: a prompt's rows
// (attention_rows) get the bits the same tokens get decoded (attention_decode), alone or in
// any batch. Query head hq reads kv head hq / G (G = n_q_heads / n_kv_heads, as transformers'
// repeat_kv). q [rows, q_stride] (query head hq at column hq * head_dim, a column slice of qkv),
// o [rows, n_q_heads * head_dim], both bf16. head_dim 64 or 128; split_tokens (the chunk of
// attention_tc.cuh) a multiple of 4096 / head_dim; G <= 8.
#include "attention_tc.cuh"

#if !defined(DEC_THREADS)
#error "DEC_THREADS comes from the family's TILES (kern_models.common.cubins passes it as -D)"
#endif
static_assert(DEC_THREADS == 128, "the attention blocks are 4 warps");
#define ATTN_MAX_G 8
#define ATTN_SMEM (4 * 64 * 72 * 2)  // 2 stages x {K, V} tiles, the larger of head_dim 64 and 128

// This block's query heads: gridDim.y = n_kv_heads * HG blocks share the kv heads, HG a kv head,
// each serving G of its heads from hq0 on (G = n_q_heads / n_kv_heads / HG).
struct HeadGroup {
    int h, G, hq0;  // kv head, query heads, the first of them
};
__device__ __forceinline__ HeadGroup head_group(int n_q_heads, int n_kv_heads) {
    const int HG = gridDim.y / n_kv_heads, G = n_q_heads / n_kv_heads / HG, h = blockIdx.y / HG;
    return {h, G, h * (G * HG) + (int)blockIdx.y % HG * G};
}
// Whether the launch's grid suits the heads: a whole group of at most ATTN_MAX_G query heads a
// kv head, gridDim.y a multiple of n_kv_heads that divides each group evenly.
__device__ __forceinline__ bool head_groups_fit(int n_q_heads, int n_kv_heads) {
    const int G = n_q_heads / n_kv_heads, HG = gridDim.y / n_kv_heads;
    return G <= ATTN_MAX_G && HG >= 1 && gridDim.y % n_kv_heads == 0 && G % HG == 0;
}

// Copies keys kb .. kb + BN - 1 of kv head h (those < kend; the rest zero-filled) into a stage
// with cp.async: which = 0 every key but `skip`, 1 only `skip`, 2 every key.
template <int HD>
__device__ __forceinline__ void attn_load(bf16 *sK, bf16 *sV, const char *__restrict__ kv_state,
                                          const int *__restrict__ pt_row, int kb, int kend, int h, int layer,
                                          int n_layers, int n_kv_heads, int page_tokens, int which, int skip) {
    using T = AttnTile<HD>;
    const size_t v_shift = (size_t)n_kv_heads * page_tokens * HD * 2;  // kv = 1
#pragma unroll
    for (int i = 0; i < T::BN * T::CH / DEC_THREADS; ++i) {
        const int c = threadIdx.x + i * DEC_THREADS, tt = c / T::CH, ch = c % T::CH, t = kb + tt;
        if (which != 2 && (t == skip) != (which == 1)) continue;
        const bool ok = t < kend;
        const size_t off = ok ? kv_offset(pt_row[t / page_tokens], layer, 0, h, t % page_tokens, n_layers,
                                          n_kv_heads, HD, page_tokens) + ch * 16
                              : 0;
        cp_async16_zfill(sK + tt * T::KP + ch * 8, kv_state + off, ok ? 16 : 0);
        cp_async16_zfill(sV + tt * T::KP + ch * 8, kv_state + off + (ok ? v_shift : 0), ok ? 16 : 0);
    }
}

// ---- decode ---------------------------------------------------------------------------------
// One block per (row r, kv head h, head group hg, chunk z): the chunk's keys
// [z * split_tokens, min(pos[r] + 1, (z + 1) * split_tokens)) for the block's query heads, the
// mma's rows (rows past them repeat the last head and are never stored). Its 4 warps compute
// the same scores and softmax and each a quarter of the output's dims. Only the n_used =
// ceil((pos[r] + 1) / split_tokens) chunks that hold context work: with one, the block writes o
// directly; with more, each writes its partial and the last block to arrive (counter sem[r,
// h * HG + hg], i32, zero between launches, reset by that block) folds them in order. Grid
// (rows, n_kv_heads * HG, n_splits), block DEC_THREADS.
template <int HD>
__device__ void attend_decode(const bf16 *__restrict__ q, const char *__restrict__ kv_state,
                              const int *__restrict__ page_table, int r, const int *__restrict__ pos,
                              float *__restrict__ part_o, float *__restrict__ part_ml, int *__restrict__ sem,
                              bf16 *__restrict__ o, int pages_per_seq, int layer, int n_layers, int n_q_heads,
                              int n_kv_heads, int page_tokens, int split_tokens, int q_stride,
                              unsigned char *smem, int &merge) {
    using T = AttnTile<HD>;
    constexpr int ND = T::DT / 4;
    const int z = blockIdx.z, n_splits = gridDim.z, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const HeadGroup heads = head_group(n_q_heads, n_kv_heads);
    const int *pt_row = page_table + (size_t)r * pages_per_seq;
    // Under PDL this runs before griddepcontrol.wait: pos and the page table are inputs of the
    // step and the K/V rows before pos[r] were written by earlier steps; the row at pos[r] and
    // q come from the kernels this one waits on.
    const int p_last = pos[r];
    const int n_used = min(n_splits, (p_last + split_tokens) / split_tokens);
    if (z >= n_used) return;
    const int t0 = z * split_tokens, t1 = min(p_last + 1, t0 + split_tokens);
    const int n_kt = (t1 - t0 + T::BN - 1) / T::BN;
    bf16 *sK = reinterpret_cast<bf16 *>(smem), *sV = sK + 2 * T::BN * T::KP;
    attn_load<HD>(sK, sV, kv_state, pt_row, t0, t1, heads.h, layer, n_layers, n_kv_heads, page_tokens, 0, p_last);
    cp_async_commit();
    pdl_wait();
    attn_load<HD>(sK, sV, kv_state, pt_row, t0, t1, heads.h, layer, n_layers, n_kv_heads, page_tokens, 1, p_last);
    cp_async_commit();
    unsigned qf[T::KC][4];
    {
        const bf16 *qr = q + (size_t)r * q_stride + (size_t)heads.hq0 * HD;
        attn_load_q<HD>(qf, qr + min(g, heads.G - 1) * HD, qr + min(g + 8, heads.G - 1) * HD);
    }
    AttnRun<ND> st;
    st.reset();
    const int d0 = warp * ND;
    for (int kt = 0; kt < n_kt; ++kt) {
        const int stage = kt & 1, kb = t0 + kt * T::BN;
        if (kt + 1 < n_kt)
            attn_load<HD>(sK + (stage ^ 1) * T::BN * T::KP, sV + (stage ^ 1) * T::BN * T::KP, kv_state, pt_row,
                          kb + T::BN, t1, heads.h, layer, n_layers, n_kv_heads, page_tokens, 2, 0);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        attn_tile<HD, ND>(st, qf, sK + stage * T::BN * T::KP, sV + stage * T::BN * T::KP, kb, p_last, p_last, d0);
        __syncthreads();  // the next iteration's loads overwrite this stage
    }
    float lr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) lr[h] = st.row_l(h);
    const size_t o_row = (size_t)r * n_q_heads * HD;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int gg = g + 8 * h;
        if (gg >= heads.G) continue;
        const int hq = heads.hq0 + gg;
        if (n_used == 1) {
            float M = -INFINITY, L = 0.f, co, cz;
            attn_fold(M, L, st.m[h], lr[h], co, cz);
#pragma unroll
            for (int d = 0; d < ND; ++d) {
                const float a0 = attn_fold_out(0.f, st.acc[d][2 * h], co, cz);
                const float a1 = attn_fold_out(0.f, st.acc[d][2 * h + 1], co, cz);
                *reinterpret_cast<unsigned *>(o + o_row + (size_t)hq * HD + 8 * (d0 + d) + 2 * t4) =
                    pack_bf2(a0 / L, a1 / L);
            }
        } else {
            const size_t slot = ((size_t)r * n_q_heads + hq) * n_splits + z;
#pragma unroll
            for (int d = 0; d < ND; ++d)
                *reinterpret_cast<float2 *>(part_o + slot * HD + 8 * (d0 + d) + 2 * t4) =
                    make_float2(st.acc[d][2 * h], st.acc[d][2 * h + 1]);
            if (warp == 0 && t4 == 0) { part_ml[slot * 2] = st.m[h]; part_ml[slot * 2 + 1] = lr[h]; }
        }
    }
    if (n_used == 1) return;

    // The last of the n_used blocks of (r, h, hg) to finish folds them in order z = 0, 1, ...
    // (the same bits whichever block is last); it resets the counter.
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        int *cnt = sem + (size_t)r * gridDim.y + blockIdx.y;
        const bool last = atomicAdd(cnt, 1) == n_used - 1;
        if (last) atomicExch(cnt, 0);
        merge = last;
    }
    __syncthreads();
    if (!merge) return;
    __threadfence();
    for (int i = tid; i < heads.G * HD; i += DEC_THREADS) {
        const int hq = heads.hq0 + i / HD, d = i % HD;
        const size_t base = ((size_t)r * n_q_heads + hq) * n_splits;
        float M = -INFINITY, L = 0.f, a = 0.f, co, cz;
        for (int zz = 0; zz < n_used; ++zz) {
            attn_fold(M, L, __ldcg(part_ml + (base + zz) * 2), __ldcg(part_ml + (base + zz) * 2 + 1), co, cz);
            a = attn_fold_out(a, __ldcg(part_o + (base + zz) * HD + d), co, cz);
        }
        o[o_row + (size_t)hq * HD + d] = to_bf(a / L);
    }
}

extern "C" __global__ void __launch_bounds__(DEC_THREADS, 4)
attention_decode(const bf16 *__restrict__ q, const char *__restrict__ kv_state,
                 const int *__restrict__ page_table, const int *__restrict__ pos,
                 float *__restrict__ part_o, float *__restrict__ part_ml, int *__restrict__ sem,
                 bf16 *__restrict__ o, int rows, int pages_per_seq, int layer, int n_layers,
                 int n_q_heads, int n_kv_heads, int head_dim, int page_tokens, int split_tokens,
                 int q_stride) {
    __shared__ alignas(16) unsigned char smem[ATTN_SMEM];
    __shared__ int merge;
    // The next kernel (the o projection) may launch at once: before its own wait it only streams
    // its weights, so it can overlap this kernel and the qkv projection that this one waits on.
    // This kernel waits before it reads q or the newest K/V row or writes anything, so the
    // chain's order holds.
    pdl_launch_dependents();
    const int r = blockIdx.x;
    if (r >= rows || !head_groups_fit(n_q_heads, n_kv_heads)) return;
#define DEC_ARGS q, kv_state, page_table, r, pos, part_o, part_ml, sem, o, pages_per_seq, layer, \
                 n_layers, n_q_heads, n_kv_heads, page_tokens, split_tokens, q_stride, smem, merge
    switch (head_dim) {
        case 64: attend_decode<64>(DEC_ARGS); break;
        case 128: attend_decode<128>(DEC_ARGS); break;
        default: break;
    }
#undef DEC_ARGS
}

// ---- attention_rows: a prompt's rows -----------------------------------------------------------
// Tiles of 64 query rows of one sequence (rows packed by cu_seqlens; a tile never crosses a
// sequence), a block per (query head, tile): block (x, y) takes head x and tile T - 1 - y of the
// T tiles numbered over the sequences in order (later tiles see more keys: the heavy ones start
// first); y >= T exits at once, hence grid (n_q_heads, ceil(rows / 64) + n_seqs). Warp w owns
// rows 16 w .. 16 w + 15 (rows past the tile's end repeat its last row, never stored). Keys 0 ..
// the tile's last position are walked in tiles shared by the block's rows (cp.async, two stages),
// chunk by chunk as decode splits them, each chunk folded into the row's output in order.
template <int HD>
__device__ void attend_rows(const bf16 *__restrict__ q, const char *__restrict__ kv_state,
                            const int *__restrict__ pt_row, const int *__restrict__ pos, bf16 *__restrict__ o,
                            int r0, int nrows, int hq, int hkv, int layer, int n_layers, int n_q_heads,
                            int n_kv_heads, int page_tokens, int split_tokens, int q_stride, unsigned char *smem,
                            int *s_max) {
    using T = AttnTile<HD>;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
    const int ra = 16 * warp + g, rb = ra + 8;
    const int rra = r0 + min(ra, nrows - 1), rrb = r0 + min(rb, nrows - 1);
    const int pa = pos[rra], pb = pos[rrb];
    const int wmax = warp_max(max(pa, pb));
    if (lane == 0) s_max[warp] = wmax;
    __syncthreads();
    int kmax = s_max[0];
#pragma unroll
    for (int w = 1; w < DEC_THREADS / 32; ++w) kmax = max(kmax, s_max[w]);
    kmax += 1;  // keys [0, kmax) are read
    unsigned qf[T::KC][4];
    attn_load_q<HD>(qf, q + (size_t)rra * q_stride + (size_t)hq * HD, q + (size_t)rrb * q_stride + (size_t)hq * HD);

    bf16 *sK = reinterpret_cast<bf16 *>(smem), *sV = sK + 2 * T::BN * T::KP;
    AttnRun<T::DT> st;
    float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.f, 0.f}, A[T::DT][4];
#pragma unroll
    for (int d = 0; d < T::DT; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) A[d][e] = 0.f;
    const int n_kt = (kmax + T::BN - 1) / T::BN;
    attn_load<HD>(sK, sV, kv_state, pt_row, 0, kmax, hkv, layer, n_layers, n_kv_heads, page_tokens, 2, 0);
    cp_async_commit();
    for (int kt = 0; kt < n_kt; ++kt) {
        const int stage = kt & 1, kb = kt * T::BN;
        if (kt + 1 < n_kt)
            attn_load<HD>(sK + (stage ^ 1) * T::BN * T::KP, sV + (stage ^ 1) * T::BN * T::KP, kv_state, pt_row,
                          kb + T::BN, kmax, hkv, layer, n_layers, n_kv_heads, page_tokens, 2, 0);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (kb % split_tokens == 0) st.reset();
        if (kb <= wmax)  // some row of this warp sees a key of the tile
            attn_tile<HD, T::DT>(st, qf, sK + stage * T::BN * T::KP, sV + stage * T::BN * T::KP, kb, pa, pb, 0);
        if ((kb + T::BN) % split_tokens == 0 || kt == n_kt - 1) {  // the chunk ends: fold it in
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float co, cz;
                attn_fold(M[h], L[h], st.m[h], st.row_l(h), co, cz);
#pragma unroll
                for (int d = 0; d < T::DT; ++d) {
                    A[d][2 * h] = attn_fold_out(A[d][2 * h], st.acc[d][2 * h], co, cz);
                    A[d][2 * h + 1] = attn_fold_out(A[d][2 * h + 1], st.acc[d][2 * h + 1], co, cz);
                }
            }
        }
        __syncthreads();  // the next iteration's loads overwrite this stage
    }
    const size_t o_stride = (size_t)n_q_heads * HD;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int rr = h ? rb : ra;
        if (rr >= nrows) continue;
        bf16 *orow = o + (size_t)(r0 + rr) * o_stride + (size_t)hq * HD + 2 * t4;
#pragma unroll
        for (int d = 0; d < T::DT; ++d)
            *reinterpret_cast<unsigned *>(orow + 8 * d) = pack_bf2(A[d][2 * h] / L[h], A[d][2 * h + 1] / L[h]);
    }
}

extern "C" __global__ void __launch_bounds__(DEC_THREADS)
attention_rows(const bf16 *__restrict__ q, const char *__restrict__ kv_state, const int *__restrict__ page_table,
               const int *__restrict__ cu_seqlens, const int *__restrict__ pos, bf16 *__restrict__ o, int rows,
               int n_seqs, int pages_per_seq, int layer, int n_layers, int n_q_heads, int n_kv_heads, int head_dim,
               int page_tokens, int split_tokens, int q_stride) {
    __shared__ alignas(16) unsigned char smem[ATTN_SMEM];
    __shared__ int s_max[DEC_THREADS / 32];
    constexpr int BM = 64;  // query rows a tile
    const int hq = blockIdx.x;
    if (hq >= n_q_heads || n_q_heads % n_kv_heads != 0) return;
    int total = 0;
    for (int s = 0; s < n_seqs; ++s) total += (cu_seqlens[s + 1] - cu_seqlens[s] + BM - 1) / BM;
    if ((int)blockIdx.y >= total) return;
    const int tile = total - 1 - (int)blockIdx.y;
    int s = 0, first = 0;
    for (;; ++s) {
        const int n = (cu_seqlens[s + 1] - cu_seqlens[s] + BM - 1) / BM;
        if (tile < first + n) break;
        first += n;
    }
    const int r0 = cu_seqlens[s] + (tile - first) * BM;
    const int nrows = min(BM, cu_seqlens[s + 1] - r0);
    if (r0 + nrows > rows) return;
    const int hkv = hq / (n_q_heads / n_kv_heads);
    const int *pt_row = page_table + (size_t)s * pages_per_seq;
#define ROW_ARGS q, kv_state, pt_row, pos, o, r0, nrows, hq, hkv, layer, n_layers, n_q_heads, n_kv_heads, \
                 page_tokens, split_tokens, q_stride, smem, s_max
    switch (head_dim) {
        case 64: attend_rows<64>(ROW_ARGS); break;
        case 128: attend_rows<128>(ROW_ARGS); break;
        default: break;
    }
#undef ROW_ARGS
}
