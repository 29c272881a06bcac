// The Kimi-Linear (DeepSeek-style) router and the shared expert's sum; the experts themselves
// are the Qwen3-MoE module's (kern_models.qwen3_moe kernels/cuda/moe.cu).
#include "common.cuh"

#define ROUTE_MAX_EXPERTS 512
#define ROUTE_MAX_GROUPS 32

// A warp a row. scores = sigmoid(logits); experts chosen by score + bias (the bias steers the
// choice only) among the topk_groups groups whose two best biased scores sum highest; the
// weights are the chosen experts' unbiased scores, renormalized (norm_topk) in choice order,
// times scaling. Every argmax takes the lower index on a tie (the reference's stable sorts).
// Grid (rows), block 32.
extern "C" __global__ void kimi_route(const float *__restrict__ logits, const bf16 *__restrict__ bias,
                                      int *__restrict__ ids, float *__restrict__ weights, int rows, int experts,
                                      int top_k, float scaling, int norm_topk, int groups, int topk_groups) {
    __shared__ float score[ROUTE_MAX_EXPERTS], choice[ROUTE_MAX_EXPERTS];
    __shared__ int picked[32];
    const int r = blockIdx.x, lane = threadIdx.x;
    if (r >= rows) return;
    for (int e = lane; e < experts; e += 32) {
        const float s = 1.f / (1.f + expf(-logits[(size_t)r * experts + e]));
        score[e] = s;
        choice[e] = s + to_f(bias[e]);
    }
    __syncwarp();
    if (groups > 1) {
        const int size = experts / groups;
        float best = -INFINITY;  // lane g: its group's two best biased scores, summed
        if (lane < groups) {
            float a = -INFINITY, b = -INFINITY;
            for (int e = lane * size; e < (lane + 1) * size; ++e) {
                const float c = choice[e];
                if (c > a) b = a, a = c;
                else if (c > b) b = c;
            }
            best = a + b;
        }
        bool keep = false;
        for (int k = 0; k < topk_groups; ++k) {
            float bv = lane < groups && !keep ? best : -INFINITY;
            int bi = lane < groups && !keep ? lane : 1 << 30;
            warp_best(bv, bi);
            keep |= lane == bi;
        }
        const unsigned kept = __ballot_sync(0xffffffffu, keep);
        __syncwarp();
        for (int e = lane; e < experts; e += 32)
            if (!((kept >> (e / size)) & 1u)) choice[e] = -INFINITY;
        __syncwarp();
    }
    for (int k = 0; k < top_k; ++k) {
        float bv = -INFINITY;
        int bi = 1 << 30;
        for (int e = lane; e < experts; e += 32) better(bv, bi, choice[e], e);  // NaN (taken) never wins
        warp_best(bv, bi);
        if (lane == 0) {
            picked[k] = bi;
            choice[bi] = __int_as_float(0x7fc00000);
        }
        __syncwarp();
    }
    if (lane == 0) {
        float sum = 0.f;
        for (int k = 0; k < top_k; ++k) sum += score[picked[k]];
        const float norm = norm_topk ? 1.f / (sum + 1e-20f) : 1.f;
        for (int k = 0; k < top_k; ++k) {
            ids[(size_t)r * top_k + k] = picked[k];
            weights[(size_t)r * top_k + k] = score[picked[k]] * norm * scaling;
        }
    }
}

// x += y (the shared expert's output onto the routed experts'), rounded to bf16.
// Grid (rows, ceil(hidden / 256)), block 256.
extern "C" __global__ void add(bf16 *__restrict__ x, const bf16 *__restrict__ y, int rows, int hidden) {
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (r >= rows || c >= hidden) return;
    const size_t i = (size_t)r * hidden + c;
    x[i] = to_bf(to_f(x[i]) + to_f(y[i]));
}

// x = 0: where the gathered experts' down projection adds its weighted sum (narrow decode), so
// that the routed experts' output lands alone in the buffer the reference's combine writes.
// Grid (rows, ceil(hidden / 256)), block 256.
extern "C" __global__ void zero(bf16 *__restrict__ x, int rows, int hidden) {
    const int r = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (r >= rows || c >= hidden) return;
    x[(size_t)r * hidden + c] = to_bf(0.f);
}
