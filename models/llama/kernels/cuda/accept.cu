// A speculative round's acceptance on the device (the verify program's last launch), so the host
// reads a round's tokens and accepted counts after one wait. Sequence s's rows are
// [cu_seqlens[s], cu_seqlens[s + 1]): its last token, then the tokens proposed after it; tokens[r]
// is the target's token after row r (sample_partial / argmax_final: the argmax, or the draw keyed
// by the request's seed and the token's index). The proposal is kept while each proposed token
// equals the target's token of the row before it: accepted[s] = the length of that prefix. With
// keyed draws this is rejection sampling of a one-token-a-position proposal (cpu/kernels.py's
// `accept` is the same rule). Integer compares only: no arithmetic to round.
// Grid (ceil_div(n_seqs, 32)), block 32: a thread a sequence.
#include "common.cuh"

extern "C" __global__ void accept(const int *__restrict__ ids, const int *__restrict__ cu_seqlens,
                                  const int *__restrict__ tokens, int *__restrict__ accepted, int n_seqs) {
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= n_seqs) return;
    const int lo = cu_seqlens[s], hi = cu_seqlens[s + 1];
    int n = 0;
    while (lo + n + 1 < hi && ids[lo + n + 1] == tokens[lo + n]) ++n;
    accepted[s] = n;
}
