// What the Qwen3-MoE kernels share (moe.cu, moe_wg.cu): the router's expert bound and how a
// narrow-decode block finds the pairs that chose its expert.
#pragma once
#include "common.cuh"

#define MOE_MAX_EXPERTS 1024

// The pairs (r * top_k + j) of the blockIdx.y-th expert, in ascending expert index, among the
// experts some pair chose that this buffer holds (ids - first in [0, count)): into list, in
// pair order (their count into n); returns that expert less first, or -1 past the last one.
// Every thread of the block calls it (it syncs). n_pairs <= MOE_GEMV_MAX_PAIRS (the manifest
// checks it: the narrow decode's rows times top_k).
#define MOE_GEMV_MAX_PAIRS 1024
__device__ __forceinline__ int expert_pairs(const int *__restrict__ ids, int n_pairs, int first, int count,
                                            int *list, int &n) {
    static_assert(MOE_MAX_EXPERTS == 32 * 32, "one bitmap word a lane");
    __shared__ unsigned used[32];
    __shared__ int sid[MOE_GEMV_MAX_PAIRS];
    __shared__ int found[2];
    n_pairs = min(n_pairs, MOE_GEMV_MAX_PAIRS);
    if (threadIdx.x < 32) used[threadIdx.x] = 0u;
    __syncthreads();
    for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) {
        const int e = ids[p] - first;
        sid[p] = e;
        if (e >= 0 && e < count && e < MOE_MAX_EXPERTS) atomicOr(&used[e >> 5], 1u << (e & 31));  // integer: exact
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x, k = blockIdx.y;
        unsigned word = used[lane];
        const int mine = __popc(word);
        int incl = mine;  // experts chosen in words 0 .. lane
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int t = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += t;
        }
        int e = -1;
        if (k >= incl - mine && k < incl) {  // the k-th chosen expert is in this lane's word
            for (int i = incl - mine; i < k; ++i) word &= word - 1;
            e = lane * 32 + __ffs(word) - 1;
        }
        const unsigned has = __ballot_sync(0xffffffffu, e >= 0);
        e = has ? __shfl_sync(0xffffffffu, e, __ffs(has) - 1) : -1;
        int got = 0;
        for (int base = 0; e >= 0 && base < n_pairs; base += 32) {
            const bool hit = base + lane < n_pairs && sid[base + lane] == e;
            const unsigned b = __ballot_sync(0xffffffffu, hit);
            if (hit) list[got + __popc(b & ((1u << lane) - 1u))] = base + lane;
            got += __popc(b);
        }
        if (lane == 0) found[0] = e, found[1] = got;
    }
    __syncthreads();
    n = found[1];
    return found[0];
}
