// Causal chunked prefill attention over the paged KV state, flash-attention-2 style on tensor
// cores (mma.sync m16n8k16, bf16 in, fp32 accumulate), fp32 online softmax in log2 units,
// scale 1/sqrt(head_dim). GQA: query head hq reads kv head hq / (n_q_heads / n_kv_heads).
//
// Tiles: the rows of a step are packed by cu_seqlens; sequence s owns rows
// [cu_seqlens[s], cu_seqlens[s+1]) and is cut into ceil(len_s / 64) query tiles of 64 rows
// (the last one short). A tile never crosses a sequence. Tiles are numbered over the sequences
// in order; block (x, y) takes query head hq = x and tile T - 1 - y (T = number of tiles; later
// tiles of a sequence see more keys, so the heavy ones start first); y >= T exits at once.
// T <= ceil_div(rows, 64) + n_seqs, hence grid (n_q_heads, ceil_div(rows, 64) + n_seqs).
//
// A block is 4 warps; warp w owns query rows 16w..16w+15 of the tile (q fragments stay in
// registers). Keys 0..max(pos of the tile's rows) of the sequence are walked in key tiles of
// BN = 4096 / head_dim keys (64 for head_dim 64, 32 for 128): K and V rows are gathered from
// their pages (page_table[s * pages_per_seq + t / page_tokens]) into shared memory with
// cp.async, two stages deep (keys past the tile's last position are zero-filled, never read).
// S = Q K^T and O += P V run on mma.sync (K via ldmatrix, V via ldmatrix.trans; P reuses the S
// accumulators as bf16 A fragments). Row r sees key t iff t <= pos[r]. Every reduction has a
// fixed order and there are no atomics: the same inputs give the same bits.
// o bf16 [rows, n_q_heads * head_dim]; q bf16 rows of q_stride elements (a column slice of qkv).
// head_dim in {64, 128}; other head_dims write nothing.
#include "common.cuh"

#if !defined(PF_BM) || !defined(PF_THREADS)
#error "PF_BM and PF_THREADS come from the family's TILES (kern_models.common.cubins passes them as -D)"
#endif

// PF_BM (query rows per tile) and PF_THREADS (4 warps x 16 rows) come from table.py.
static_assert(PF_BM == 64 && PF_THREADS == 128, "a tile is 4 warps of 16 query rows");
#define PF_SMEM_BYTES (2 * 2 * 64 * 72 * 2)  // 2 stages x {K, V} x BN x (HD + 8) bf16, max over HD

template <int HD>
__device__ __forceinline__ void prefill_tile(const bf16 *__restrict__ q, const char *__restrict__ kv_state,
                                             const int *__restrict__ pt_row, const int *__restrict__ pos,
                                             bf16 *__restrict__ o, int r0, int nrows, int hq, int hkv,
                                             int layer, int n_layers, int n_q_heads, int n_kv_heads,
                                             int page_tokens, int q_stride, unsigned char *smem) {
    constexpr int BN = 4096 / HD;       // keys per key tile
    constexpr int KP = HD + 8;          // padded smem row (bf16): conflict-free ldmatrix
    constexpr int KC = HD / 16;         // k-steps of Q K^T
    constexpr int NT = BN / 8;          // 8-key column tiles of S
    constexpr int DT = HD / 8;          // 8-dim column tiles of O
    constexpr int CH = HD / 8;          // 16-byte chunks per K/V row
    constexpr int LOADS = BN * CH / PF_THREADS;  // 16-byte loads per thread per tile, K and V each
    static_assert(2 * 2 * BN * KP * 2 <= PF_SMEM_BYTES, "smem");
    __shared__ int s_red[2][PF_THREADS / 32];

    bf16 *sK = reinterpret_cast<bf16 *>(smem);  // [2][BN][KP]
    bf16 *sV = sK + 2 * BN * KP;                 // [2][BN][KP]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;

    // This thread's two rows (g and g + 8 of the warp's 16); rows past the tile's end are
    // computed as copies of its last row and never stored.
    const int ra = 16 * warp + g, rb = ra + 8;
    const int rra = r0 + min(ra, nrows - 1), rrb = r0 + min(rb, nrows - 1);
    const int pa = pos[rra], pb = pos[rrb];
    const int wmax = warp_max(max(pa, pb)), wmin = warp_min(min(pa, pb));
    const bool live = 16 * warp < nrows;  // the warp has a row to store
    if (lane == 0) { s_red[0][warp] = wmax; }
    __syncthreads();
    int kmax = s_red[0][0];
#pragma unroll
    for (int w = 1; w < PF_THREADS / 32; ++w) kmax = max(kmax, s_red[0][w]);
    kmax += 1;  // keys [0, kmax) are read

    // Q fragments (A operand, row-major 16 x 16 per k-step), straight from global memory.
    unsigned qa[KC][4];
    {
        const bf16 *qa_row = q + (size_t)rra * q_stride + (size_t)hq * HD + 2 * t4;
        const bf16 *qb_row = q + (size_t)rrb * q_stride + (size_t)hq * HD + 2 * t4;
#pragma unroll
        for (int kc = 0; kc < KC; ++kc) {
            qa[kc][0] = *reinterpret_cast<const unsigned *>(qa_row + kc * 16);
            qa[kc][1] = *reinterpret_cast<const unsigned *>(qb_row + kc * 16);
            qa[kc][2] = *reinterpret_cast<const unsigned *>(qa_row + kc * 16 + 8);
            qa[kc][3] = *reinterpret_cast<const unsigned *>(qb_row + kc * 16 + 8);
        }
    }

    const size_t v_shift = (size_t)n_kv_heads * page_tokens * HD * 2;  // kv = 1
    auto load_tile = [&](int kt, int stage) {
        const int kb = kt * BN;
#pragma unroll
        for (int i = 0; i < LOADS; ++i) {
            const int c = tid + i * PF_THREADS, tt = c / CH, ch = c % CH, t = kb + tt;
            const bool ok = t < kmax;
            const size_t off = ok ? kv_offset(pt_row[t / page_tokens], layer, 0, hkv, t % page_tokens,
                                              n_layers, n_kv_heads, HD, page_tokens) + ch * 16
                                  : 0;
            cp_async16_zfill(sK + (stage * BN + tt) * KP + ch * 8, kv_state + off, ok ? 16 : 0);
            cp_async16_zfill(sV + (stage * BN + tt) * KP + ch * 8, kv_state + off + (ok ? v_shift : 0),
                          ok ? 16 : 0);
        }
    };

    const float sl2 = (1.f / sqrtf((float)HD)) * LOG2E;  // scale * log2(e)
    float acc[DT][4];
#pragma unroll
    for (int d = 0; d < DT; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[d][e] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

    const int n_kt = (kmax + BN - 1) / BN;
    load_tile(0, 0);
    cp_async_commit();
    for (int kt = 0; kt < n_kt; ++kt) {
        const int stage = kt & 1, kb = kt * BN;
        if (kt + 1 < n_kt) load_tile(kt + 1, stage ^ 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();

        if (live && kb <= wmax) {  // some row of this warp sees a key of the tile
            // S = Q K^T (16 x BN per warp)
            float sc[NT][4];
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) sc[j][e] = 0.f;
            const bf16 *kbase = sK + (stage * BN + (lane & 7) + 8 * (lane >> 4)) * KP + 8 * ((lane >> 3) & 1);
#pragma unroll
            for (int kc = 0; kc < KC; ++kc) {
#pragma unroll
                for (int j = 0; j < NT; j += 2) {
                    unsigned b[4];
                    ldsm_x4(b, kbase + 8 * j * KP + kc * 16);
                    mma_bf16(sc[j], qa[kc], b[0], b[1]);
                    mma_bf16(sc[j + 1], qa[kc], b[2], b[3]);
                }
            }
            // scale, causal mask (only on tiles that reach past the warp's first position)
            const bool mask = kb + BN - 1 > wmin;
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float v = sc[j][e] * sl2;
                    if (mask && kb + 8 * j + 2 * t4 + (e & 1) > ((e >> 1) ? pb : pa)) v = -INFINITY;
                    sc[j][e] = v;
                    mx[e >> 1] = fmaxf(mx[e >> 1], v);
                }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                const float mn = fmaxf(m[h], mx[h]);
                const float mu = mn == -INFINITY ? 0.f : mn;  // a row with no key yet
                const float corr = exp2f(m[h] - mu);
                m[h] = mn;
                mx[h] = mu;  // reuse: the subtrahend of this tile
                l[h] *= corr;
#pragma unroll
                for (int d = 0; d < DT; ++d) { acc[d][2 * h] *= corr; acc[d][2 * h + 1] *= corr; }
            }
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float p = exp2f(sc[j][e] - mx[e >> 1]);
                    sc[j][e] = p;
                    l[e >> 1] += p;
                }
            // O += P V
            const bf16 *vbase = sV + (stage * BN + (lane & 7) + 8 * ((lane >> 3) & 1)) * KP + 8 * (lane >> 4);
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                const unsigned pa4[4] = {pack_bf2(sc[2 * kk][0], sc[2 * kk][1]),
                                         pack_bf2(sc[2 * kk][2], sc[2 * kk][3]),
                                         pack_bf2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                                         pack_bf2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
                for (int d = 0; d < DT; d += 2) {
                    unsigned b[4];
                    ldsm_x4_t(b, vbase + 16 * kk * KP + 8 * d);
                    mma_bf16(acc[d], pa4, b[0], b[1]);
                    mma_bf16(acc[d + 1], pa4, b[2], b[3]);
                }
            }
        }
        __syncthreads();  // the next iteration's loads overwrite this stage
    }

    // Row sums over the quad (fixed xor order), normalize, store bf16 pairs.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    const float ia = 1.f / l[0], ib = 1.f / l[1];
    const size_t o_stride = (size_t)n_q_heads * HD;
    bf16 *oa = o + (size_t)(r0 + ra) * o_stride + (size_t)hq * HD + 2 * t4;
    bf16 *ob = o + (size_t)(r0 + rb) * o_stride + (size_t)hq * HD + 2 * t4;
#pragma unroll
    for (int d = 0; d < DT; ++d) {
        if (ra < nrows) *reinterpret_cast<unsigned *>(oa + 8 * d) = pack_bf2(acc[d][0] * ia, acc[d][1] * ia);
        if (rb < nrows) *reinterpret_cast<unsigned *>(ob + 8 * d) = pack_bf2(acc[d][2] * ib, acc[d][3] * ib);
    }
}

extern "C" __global__ void __launch_bounds__(PF_THREADS)
prefill_attention(const bf16 *__restrict__ q, const char *__restrict__ kv_state,
                  const int *__restrict__ page_table, const int *__restrict__ cu_seqlens,
                  const int *__restrict__ pos, bf16 *__restrict__ o, int rows, int n_seqs,
                  int pages_per_seq, int layer, int n_layers, int n_q_heads, int n_kv_heads,
                  int head_dim, int page_tokens, int q_stride) {
    __shared__ alignas(16) unsigned char smem[PF_SMEM_BYTES];
    const int hq = blockIdx.x;
    if (hq >= n_q_heads || n_q_heads % n_kv_heads != 0) return;
    // Tile number T - 1 - blockIdx.y over the sequences' tiles, in sequence order.
    int total = 0;
    for (int s = 0; s < n_seqs; ++s) total += (cu_seqlens[s + 1] - cu_seqlens[s] + PF_BM - 1) / PF_BM;
    if ((int)blockIdx.y >= total) return;
    const int tile = total - 1 - (int)blockIdx.y;
    int s = 0, first = 0;
    for (;; ++s) {
        const int n = (cu_seqlens[s + 1] - cu_seqlens[s] + PF_BM - 1) / PF_BM;
        if (tile < first + n) break;
        first += n;
    }
    const int r0 = cu_seqlens[s] + (tile - first) * PF_BM;
    const int nrows = min(PF_BM, cu_seqlens[s + 1] - r0);
    if (r0 + nrows > rows) return;
    const int hkv = hq / (n_q_heads / n_kv_heads);
    const int *pt_row = page_table + (size_t)s * pages_per_seq;
#define PF_ARGS q, kv_state, pt_row, pos, o, r0, nrows, hq, hkv, layer, n_layers, n_q_heads, \
                n_kv_heads, page_tokens, q_stride, smem
    switch (head_dim) {
        case 64: prefill_tile<64>(PF_ARGS); break;
        case 128: prefill_tile<128>(PF_ARGS); break;
        default: break;
    }
#undef PF_ARGS
}
