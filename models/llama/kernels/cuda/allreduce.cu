// The peer-memory all-reduce of tensor-parallel decode (sm_90a): every rank's part is read
// straight from its GPU over NVLink (peer access), summed in rank order in fp32 (so every rank
// gets the same bits) and written on each rank. One barrier a call: block b bumps its epoch,
// writes it into flag slot [b][rank] of every rank (a system-scope release after a system fence,
// so the part the previous kernel wrote is visible first), then waits until its own slots
// [b][p] have reached the epoch for every p (system-scope acquire). The manifest alternates two
// halves of the part buffer between calls, so no second barrier is needed: a rank writes a
// half again only after every rank has passed the next call's barrier.
// Under programmatic dependent launch (the manifest's choice) it lets the next kernel launch at
// entry, so the next projection streams its weights while this one waits on the other ranks,
// and waits for the projection before it before touching anything (common.cuh); without the
// launch attribute both are no-ops.
// A rank that never arrives (it failed) traps after WAIT_NS rather than hanging the GPU.
// gemv_push + all_reduce_add_local (below): decode's fan-in projection pushes its part into every
// rank's buffer, and the all-reduce reads them from its own memory.
#include "gemv.cuh"
#include "wg_shapes.cuh"

#define WAIT_NS 20000000000ull

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void store_release_sys(unsigned *p, unsigned v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned load_acquire_sys(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// The barrier of block blockIdx.x among `ranks` ranks (see the top of the file).
__device__ void barrier(const unsigned long long *flag_peers, unsigned *flags, unsigned *epoch, int rank,
                        int ranks) {
    pdl_launch_dependents();
    pdl_wait();
    if (threadIdx.x == 0) {
        const int b = blockIdx.x;
        const unsigned e = epoch[b] + 1;
        epoch[b] = e;
        __threadfence_system();
        for (int p = 0; p < ranks; ++p)
            store_release_sys(reinterpret_cast<unsigned *>(flag_peers[p]) + b * ranks + rank, e);
        const unsigned long long give_up = global_ns() + WAIT_NS;
        for (int p = 0; p < ranks; ++p)
            while (load_acquire_sys(flags + b * ranks + p) < e)
                if (global_ns() > give_up) __trap();
    }
    __syncthreads();
}

// y[i] = sum over ranks p of parts[p][offset + i] (bf16 parts, fp32 sum; small prefills).
extern "C" __global__ void __launch_bounds__(512)
all_reduce_bf16(const unsigned long long *__restrict__ parts, const unsigned long long *__restrict__ flag_peers,
                unsigned *flags, unsigned *epoch, bf16 *__restrict__ y, int rank, int ranks, int offset, int n) {
    barrier(flag_peers, flags, epoch, rank, ranks);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float s = 0.f;
        for (int p = 0; p < ranks; ++p) {
            const unsigned short raw = __ldcv(reinterpret_cast<const unsigned short *>(parts[p]) + offset + i);
            s += to_f(__ushort_as_bfloat16(raw));
        }
        y[i] = to_bf(s);
    }
}

// y[r][p * width + j] = parts[p][r * width + j] for every rank p: each rank's slice of a
// vocabulary-sharded LM head's fp32 logits, gathered on every rank (the same bits everywhere,
// so every rank samples the same token). 16-byte copies when width % 4 == 0, four of them a
// thread in flight before any is stored.
extern "C" __global__ void __launch_bounds__(512)
all_gather_f32(const unsigned long long *__restrict__ parts, const unsigned long long *__restrict__ flag_peers,
               unsigned *flags, unsigned *epoch, float *__restrict__ y, int rank, int ranks, int rows, int width) {
    barrier(flag_peers, flags, epoch, rank, ranks);
    const int stride = gridDim.x * blockDim.x, t0 = blockIdx.x * blockDim.x + threadIdx.x;
    const size_t row_out = (size_t)ranks * width;
    for (int p = 0; p < ranks; ++p) {
        const float *src = reinterpret_cast<const float *>(parts[p]);
        float *dst = y + (size_t)p * width;
        if ((width & 3) == 0) {
            const int w4 = width >> 2, n4 = rows * w4;
            for (int i = t0; i < n4; i += 4 * stride) {
                float4 v[4];
#pragma unroll
                for (int u = 0; u < 4; ++u)
                    if (i + u * stride < n4) v[u] = __ldcv(reinterpret_cast<const float4 *>(src) + i + u * stride);
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int k = i + u * stride;
                    if (k < n4) {
                        const int r = k / w4, c = k - r * w4;
                        *reinterpret_cast<float4 *>(dst + r * row_out + 4 * c) = v[u];
                    }
                }
            }
        } else {
            for (int k = t0; k < rows * width; k += stride) {
                const int r = k / width, c = k - r * width;
                dst[r * row_out + c] = __ldcv(src + k);
            }
        }
    }
}

// ---- decode's fan-in projection pushing its part, and the all-reduce reading it locally ------
// gemv_push: y = x @ W^T in fp32 (gemv.cuh), each output stored into slot `rank` of every
// rank's part buffer (recv: [2 halves][ranks][rows][N]; remote stores over NVLink, which nothing
// waits for: the blocks leave as soon as they are issued, so the next kernel's blocks take
// their places and stream their weights). all_reduce_add_local then crosses the barrier (the
// system fence and release before a rank's flag come after the projection's grid has finished,
// its stores to the other ranks included) and sums the ranks' slots from its own memory, in
// rank order: the same bits as reading every rank's part over NVLink after the projection, one
// remote read round trip less.
// The halves alternate between calls as for the other kernels.
struct YPush {
    static constexpr bool PAIRED = false;
    const unsigned long long *peers;
    float *mine;
    size_t base;
    int rank, ranks;
    __device__ void put(size_t i, float v) const {
        for (int p = 0; p < ranks; ++p)
            (p == rank ? mine : reinterpret_cast<float *>(peers[p]))[base + i] = v;
    }
};

extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS, 2)
gemv_push(const bf16 *__restrict__ x, const bf16 *__restrict__ W, float *recv,
          const unsigned long long *__restrict__ parts, int rank, int ranks, int offset, int rows, int N, int K) {
    gemv(XPlain{x}, W, YPush{parts, recv, (size_t)offset + (size_t)rank * rows * N, rank, ranks}, rows, N, K);
}

// The batch-invariant split's many-row twins of gemv_push (prefill's rows, the wide decode's):
// gemm.cu's gemm_residual and gemm_residual_split with YPush for the residual add, so a row's
// part has the gemv's bits at any M (gemm.cu's header) and all_reduce_add_local sums the parts
// in rank order. x and W are tensor maps (tiles<32,64>), as gemm.cu's. Grids, blocks and shared
// memory: gemm_residual's and gemm_residual_split's (table.py).
extern "C" __global__ void __launch_bounds__(WgBig::THREADS, 1)
gemm_push(const bf16 *__restrict__ x, const bf16 *__restrict__ W, float *recv,
          const unsigned long long *__restrict__ parts, int rank, int ranks, int offset, int rows, int N, int K) {
    gemm_wg<WgBig>(nullptr, nullptr, nullptr, YPush{parts, recv, (size_t)offset + (size_t)rank * rows * N, rank, ranks},
                   rows, N, K, nullptr, nullptr, x, W);
}
extern "C" __global__ void __launch_bounds__(WgSplit::THREADS, 1)
gemm_push_split(const bf16 *__restrict__ x, const bf16 *__restrict__ W, float *recv,
                const unsigned long long *__restrict__ parts, float *__restrict__ part, int *__restrict__ sem,
                int rank, int ranks, int offset, int rows, int N, int K) {
    gemm_wg<WgSplit>(nullptr, nullptr, nullptr, YPush{parts, recv, (size_t)offset + (size_t)rank * rows * N, rank, ranks},
                     rows, N, K, part, sem, x, W);
}

// res[i] += sum over ranks p of recv[offset + p * n + i] (the slots gemv_push filled on every rank).
extern "C" __global__ void __launch_bounds__(512)
all_reduce_add_local(const float *recv, const unsigned long long *__restrict__ flag_peers, unsigned *flags,
                     unsigned *epoch, bf16 *res, int rank, int ranks, int offset, int n) {
    barrier(flag_peers, flags, epoch, rank, ranks);
    const float *got = recv + offset;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float s = 0.f;
        for (int p = 0; p < ranks; ++p) s += __ldcv(got + (size_t)p * n + i);
        res[i] = to_bf(to_f(res[i]) + s);
    }
}
