// Attention on tensor cores in one order for every query row, whatever else shares the launch:
// what lets a prompt's rows (prefill, many rows a block, K/V tiles shared among them) and the
// same token decoded (one row a sequence, its context split over blocks) give the same bits.
//
// The order of one (query row, head) over its keys 0 .. pos (log2 units, scale 1/sqrt(hd)):
// - keys are cut in chunks of `chunk` keys from key 0 (the deployment's decode split), a chunk
//   in tiles of AttnTile<HD>::BN keys (64 at hd 64, 32 at hd 128) from its first key;
// - a tile: S = q K^T on mma.sync m16n8k16 (hd / 16 k16 steps in order, from 0), times the
//   scale, keys past pos at -inf; the chunk's running max m moves to max(m, the tile's max);
//   the running sum l (a thread's own columns) and the output are scaled by exp2(m_old - m),
//   p = exp2(s - m) is added to l column by column and, rounded to bf16, multiplies V on mma
//   (BN / 16 k16 steps of 16 keys in order, the output the accumulator);
// - a chunk's l is its 4 threads' sums added in a fixed xor order; the chunks are folded in
//   order 0, 1, ... from (-inf, 0, 0) (attn_fold), and the row's output is A / L.
// Every product, sum and scale is rounded explicitly (__fmul_rn, __fadd_rn): no contraction
// can differ between the kernels that inline this. A row that sees none of a tile or a chunk
// passes through it unchanged (its scale is 1 or its chunk folds with weight 0), so a block may
// walk more keys than a row needs. The mma sums of a row depend on that row alone, so rows may
// be packed 16 to a warp any way a kernel likes (decode: a kv head's query heads; prefill: 16
// positions of one head).
#pragma once
#include "common.cuh"

template <int HD>
struct AttnTile {
    static constexpr int BN = 4096 / HD;  // keys a tile
    static constexpr int KP = HD + 8;     // padded shared-memory row (bf16): conflict-free ldmatrix
    static constexpr int KC = HD / 16;    // k16 steps of q K^T
    static constexpr int NT = BN / 8;     // 8-key column tiles of S
    static constexpr int DT = HD / 8;     // 8-dim column tiles of the output
    static constexpr int CH = HD / 8;     // 16-byte chunks a K or V row
    static constexpr int TILE_BYTES = BN * KP * 2;  // one K (or V) tile in shared memory
};

// A thread's q fragments (A operand, 16 x 16 a k16 step) of rows qa (g) and qb (g + 8).
template <int HD>
__device__ __forceinline__ void attn_load_q(unsigned (&qf)[HD / 16][4], const bf16 *qa, const bf16 *qb) {
    const int t4 = threadIdx.x & 3;
#pragma unroll
    for (int kc = 0; kc < HD / 16; ++kc) {
        qf[kc][0] = *reinterpret_cast<const unsigned *>(qa + kc * 16 + 2 * t4);
        qf[kc][1] = *reinterpret_cast<const unsigned *>(qb + kc * 16 + 2 * t4);
        qf[kc][2] = *reinterpret_cast<const unsigned *>(qa + kc * 16 + 8 + 2 * t4);
        qf[kc][3] = *reinterpret_cast<const unsigned *>(qb + kc * 16 + 8 + 2 * t4);
    }
}

// A warp's running state over one chunk for its 16 rows; a thread holds rows g and g + 8
// (h = 0, 1): m, l (its columns' part) and ND 8-dim tiles of the output (dims 8 (d0 + d) ..).
template <int ND>
struct AttnRun {
    float m[2], l[2], acc[ND][4];
    __device__ __forceinline__ void reset() {
#pragma unroll
        for (int h = 0; h < 2; ++h) m[h] = -INFINITY, l[h] = 0.f;
#pragma unroll
        for (int d = 0; d < ND; ++d)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[d][e] = 0.f;
    }
    // The chunk's l of each row: the quad's parts in a fixed order.
    __device__ __forceinline__ float row_l(int h) const {
        float s = __fadd_rn(l[h], __shfl_xor_sync(0xffffffffu, l[h], 1));
        return __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 2));
    }
};

// The softmax and P V of one tile of BN keys kb .. kb + BN - 1 for the warp's 16 rows, given
// the tile's raw scores sc (the mma's C fragments: S = q K^T, however its k steps were summed)
// and V rows in shared memory KP bf16 apart; sl2: the scale in log2 units; lim_a, lim_b: the
// last key rows g and g + 8 may see. The warp computes output tiles d0 .. d0 + ND - 1 (ND even);
// the softmax is the same whichever. Shared by every query width: HD-wide heads (attn_tile) and
// MLA's 576-wide scores over 512-wide values (kimi_linear mla.cu).
template <int BN, int KP, int ND>
__device__ __forceinline__ void attn_softmax_pv(AttnRun<ND> &st, float (&sc)[BN / 8][4], const bf16 *sV, int kb,
                                                int lim_a, int lim_b, int d0, float sl2) {
    constexpr int NT = BN / 8;
    const int lane = threadIdx.x & 31, t4 = lane & 3;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float v = __fmul_rn(sc[j][e], sl2);
            if (kb + 8 * j + 2 * t4 + (e & 1) > ((e >> 1) ? lim_b : lim_a)) v = -INFINITY;
            sc[j][e] = v;
            mx[e >> 1] = fmaxf(mx[e >> 1], v);
        }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float mn = fmaxf(st.m[h], mx[h]);
        const float mu = mn == -INFINITY ? 0.f : mn;  // a row with no key yet stays at (-inf, 0, 0)
        const float corr = exp2f(__fsub_rn(st.m[h], mu));
        st.m[h] = mn;
        mx[h] = mu;
        st.l[h] = __fmul_rn(st.l[h], corr);
#pragma unroll
        for (int d = 0; d < ND; ++d) {
            st.acc[d][2 * h] = __fmul_rn(st.acc[d][2 * h], corr);
            st.acc[d][2 * h + 1] = __fmul_rn(st.acc[d][2 * h + 1], corr);
        }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float p = exp2f(__fsub_rn(sc[j][e], mx[e >> 1]));
            sc[j][e] = p;
            st.l[e >> 1] = __fadd_rn(st.l[e >> 1], p);
        }
    const bf16 *vbase = sV + ((lane & 7) + 8 * ((lane >> 3) & 1)) * KP + 8 * (lane >> 4);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
        const unsigned pa[4] = {pack_bf2(sc[2 * kk][0], sc[2 * kk][1]), pack_bf2(sc[2 * kk][2], sc[2 * kk][3]),
                                pack_bf2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                                pack_bf2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
        for (int d = 0; d < ND; d += 2) {
            unsigned b[4];
            ldsm_x4_t(b, vbase + 16 * kk * KP + 8 * (d0 + d));
            mma_bf16(st.acc[d], pa, b[0], b[1]);
            mma_bf16(st.acc[d + 1], pa, b[2], b[3]);
        }
    }
}

// One tile of keys kb .. kb + BN - 1 (K and V rows in shared memory, KP apart) for the warp's
// 16 rows; lim_a, lim_b: the last key rows g and g + 8 may see. The warp computes output tiles
// d0 .. d0 + ND - 1 (ND even); S and the softmax are the same whichever.
template <int HD, int ND>
__device__ __forceinline__ void attn_tile(AttnRun<ND> &st, const unsigned (&qf)[HD / 16][4], const bf16 *sK,
                                          const bf16 *sV, int kb, int lim_a, int lim_b, int d0) {
    using T = AttnTile<HD>;
    const int lane = threadIdx.x & 31;
    float sc[T::NT][4];
#pragma unroll
    for (int j = 0; j < T::NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) sc[j][e] = 0.f;
    const bf16 *kbase = sK + ((lane & 7) + 8 * (lane >> 4)) * T::KP + 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int kc = 0; kc < T::KC; ++kc)
#pragma unroll
        for (int j = 0; j < T::NT; j += 2) {
            unsigned b[4];
            ldsm_x4(b, kbase + 8 * j * T::KP + kc * 16);
            mma_bf16(sc[j], qf[kc], b[0], b[1]);
            mma_bf16(sc[j + 1], qf[kc], b[2], b[3]);
        }
    attn_softmax_pv<T::BN, T::KP, ND>(st, sc, sV, kb, lim_a, lim_b, d0, (1.f / sqrtf((float)HD)) * LOG2E);
}

// Folds a chunk (m, l) into the row's (M, L); A = A co + a cz for each of its outputs.
__device__ __forceinline__ void attn_fold(float &M, float &L, float m, float l, float &co, float &cz) {
    const float Mn = fmaxf(M, m);
    co = exp2f(__fsub_rn(M, Mn));
    cz = exp2f(__fsub_rn(m, Mn));
    L = __fadd_rn(__fmul_rn(L, co), __fmul_rn(l, cz));
    M = Mn;
}
__device__ __forceinline__ float attn_fold_out(float A, float a, float co, float cz) {
    return __fadd_rn(__fmul_rn(A, co), __fmul_rn(a, cz));
}
