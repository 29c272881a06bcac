// Two-stage sampling over fp32 logits [n_rows, vocab] by the Gumbel-max trick: row r's token is
// argmax_i(logit_i / T_r + g_i), g_i = -log(-log(u_i)), u_i uniform in (0, 1) from a counter
// hash of the row's 64-bit key and i: a draw from softmax(logits / T_r) in one pass, no sort.
// T_r <= 0 is the plain argmax (greedy). Deterministic: the key (the host's per-request seed
// and token count) fixes every u_i whatever the batch. Ties break to the lowest index; NaN never
// wins (a row of only NaN gives -1). Both stages may be launched with PDL: they wait for the
// previous kernel before reading and read its output at L2.
// A token mask (a grammar's): mask_row[r] = 0 draws row r over every token; m > 0 draws it only
// among the tokens whose bit is set in row m - 1 of `mask` (bit i % 32 of word i / 32, words =
// ceil(vocab / 32) a row: llguidance's layout, uploaded as it comes). Among the allowed tokens
// the draw is the unmasked one (the same keyed noise). Where no allowed logit is above -inf the
// row draws among its -inf ones, else among its NaN ones, as if their logits were 0 (greedy: the
// lowest; sampled: the keyed noise alone, an even draw); where the mask allows none it gives
// token 0. That is the host's path (sampling.penalize, mask and argmax) mirrored: there a NaN
// logit becomes -inf and a -inf one the lowest float64.
// sample_partial: chunk c of row r covers [c*cs, min((c+1)*cs, vocab)), cs =
//   ceil_div(vocab, chunks); writes part_val/part_idx[r, c]. Grid (chunks, n_rows), block 256.
// argmax_final: tokens[r] = best of part_*[r, 0..chunks). Grid (n_rows), block 32.
#include "common.cuh"
#include <limits.h>

// splitmix64's finaliser: a bijective 64-bit mix (models/llama/kernels/cpu/kernels.py mirrors it).
__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ float gumbel(unsigned long long key, int i) {
    const unsigned long long h = mix64(key ^ mix64((unsigned long long)(unsigned)i));
    // 23 bits: b + 0.5 is exact in float32 for every b < 2^23, so u lies in [2^-24, 1 - 2^-24] and
    // g stays finite (with 24 bits the largest b + 0.5 rounds up to 2^24: u = 1, g = +inf).
    const float u = ((float)(h >> 41) + 0.5f) * (1.0f / 8388608.0f);
    return -logf(-logf(u));
}

// A candidate's tier rides in bits 29-30 of its index (vocabularies stay below 2^29): word 0 (the
// index as is) a logit above -inf, 1 an allowed -inf, 2 an allowed NaN, 3 token 0 where the mask
// allows none. A lower word wins, then the larger value, then the lower index (INT_MAX, word 3 too,
// is no candidate: token 0's 3 << 29 beats it). Unmasked rows hold word-0 candidates only, where
// this is common.cuh's better.
#define TIER_SHIFT 29
__device__ __forceinline__ void better_tier(float &bv, int &bi, float v, int i) {
    const int bt = bi >> TIER_SHIFT, t = i >> TIER_SHIFT;
    if (t < bt || (t == bt && (v > bv || (v == bv && i < bi)))) { bv = v; bi = i; }
}

extern "C" __global__ void sample_partial(const float *__restrict__ logits, const float *__restrict__ temperature,
                                          const int *__restrict__ key, const int *__restrict__ mask,
                                          const int *__restrict__ mask_row, float *__restrict__ part_val,
                                          int *__restrict__ part_idx, int vocab, int n_rows, int chunks) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const int c = blockIdx.x, r = blockIdx.y;
    if (c >= chunks || r >= n_rows) return;
    pdl_wait();
    pdl_launch_dependents();
    const int cs = (vocab + chunks - 1) / chunks;
    const int lo = c * cs, hi = min(vocab, lo + cs);
    const float *row = logits + (size_t)r * vocab;
    const float t = temperature[r];
    const int m = mask_row[r];
    const unsigned long long k = ((unsigned long long)(unsigned)key[2 * r + 1] << 32) | (unsigned)key[2 * r];
    float bv = -INFINITY;
    int bi = INT_MAX;
    if (m > 0) {
        const unsigned *words = reinterpret_cast<const unsigned *>(mask) + (size_t)(m - 1) * ((vocab + 31) / 32);
        if (c == 0 && threadIdx.x == 0) bi = 3 << TIER_SHIFT;  // token 0, should the mask allow none
        const float inv = t > 0.0f ? 1.0f / t : 0.0f;
        for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            if (!((__ldg(words + (i >> 5)) >> (i & 31)) & 1u)) continue;
            const float l = __ldcg(row + i);
            if (l > -INFINITY)  // finite or +inf (NaN fails the compare)
                better_tier(bv, bi, t > 0.0f ? l * inv + gumbel(k, i) : l, i);
            else
                better_tier(bv, bi, t > 0.0f ? gumbel(k, i) : 0.0f, i | ((isnan(l) ? 2 : 1) << TIER_SHIFT));
        }
    } else if (t > 0.0f) {
        const float inv = 1.0f / t;
        for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) better(bv, bi, __ldcg(row + i) * inv + gumbel(k, i), i);
    } else {
        for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) better(bv, bi, __ldcg(row + i), i);
    }
    warp_best<better_tier>(bv, bi);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w) better_tier(bv, bi, sv[w], si[w]);
        part_val[(size_t)r * chunks + c] = bv;
        part_idx[(size_t)r * chunks + c] = bi;
    }
}

extern "C" __global__ void argmax_final(const float *__restrict__ part_val,
                                        const int *__restrict__ part_idx, int *__restrict__ tokens,
                                        int n_rows, int chunks) {
    const int r = blockIdx.x;
    if (r >= n_rows) return;
    pdl_wait();
    pdl_launch_dependents();
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x)
        better_tier(bv, bi, __ldcg(part_val + (size_t)r * chunks + c), __ldcg(part_idx + (size_t)r * chunks + c));
    warp_best<better_tier>(bv, bi);
    if (threadIdx.x == 0) tokens[r] = bi == INT_MAX ? -1 : bi & ((1 << TIER_SHIFT) - 1);
}
