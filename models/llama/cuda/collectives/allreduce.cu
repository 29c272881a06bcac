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
// gemv_all_reduce_add (at the end) fuses decode's fan-in projection and its all-reduce into
// one launch: parts pushed into every rank's buffer, a barrier a tile, a local sum.
#include "gemv.cuh"

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

// res[i] += sum over ranks p of parts[p][offset + i] (fp32 parts of a fan-in projection; decode).
extern "C" __global__ void __launch_bounds__(512)
all_reduce_add_f32(const unsigned long long *__restrict__ parts, const unsigned long long *__restrict__ flag_peers,
                   unsigned *flags, unsigned *epoch, bf16 *res, int rank, int ranks, int offset, int n) {
    barrier(flag_peers, flags, epoch, rank, ranks);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float s = 0.f;
        for (int p = 0; p < ranks; ++p) s += __ldcv(reinterpret_cast<const float *>(parts[p]) + offset + i);
        res[i] = to_bf(to_f(res[i]) + s);
    }
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

// ---- the fan-in projection and its all-reduce in one launch (decode) -------------------------
// res[r, c] += sum over ranks p, in rank order, of x_p[r, :] . W_p[c, :] (x_p, W_p: rank p's
// slices). Block t computes its 16 columns' fp32 part (gemv.cuh) and pushes it into slot
// `rank` of every rank's part buffer (recv: [2 halves][ranks][rows][N]; remote stores over
// NVLink, no round trip); thread 0 then signals tile t on every rank (a system fence after the
// block's stores, a system-scope release of the tile's epoch) and waits for every rank's signal
// of tile t; the block then sums the ranks' parts of its own 16 columns from local memory, in
// rank order, and adds them into the residual: the same bits as gemv_f32 + all_reduce_add_f32,
// with no second launch and no remote read. A block waits only for the same tile of the other
// ranks, so every tile must be resident at once on every rank (N / 16 blocks within what the
// GPU holds: the generator's FUSED_MAX_TILES). The halves alternate between calls as for the
// other kernels: a rank pushes into a half again only two calls later, after every rank's
// whole previous call, which read it, has finished.
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
gemv_all_reduce_add(const bf16 *__restrict__ x, const bf16 *__restrict__ W, bf16 *res, float *recv,
                    const unsigned long long *__restrict__ parts, const unsigned long long *__restrict__ flag_peers,
                    unsigned *flags, unsigned *epoch, int rank, int ranks, int offset, int rows, int N, int K) {
    const int tile = blockIdx.x;
    const size_t slot = (size_t)rows * N;
    gemv(XPlain{x}, W, YPush{parts, recv, (size_t)offset + rank * slot, rank, ranks}, rows, N, K);
    // gemv ends with __syncthreads: every part this block stores is issued
    if (threadIdx.x == 0) {
        const unsigned e = epoch[tile] + 1;
        epoch[tile] = e;
        __threadfence_system();
        for (int p = 0; p < ranks; ++p)
            store_release_sys(reinterpret_cast<unsigned *>(flag_peers[p]) + tile * ranks + rank, e);
        const unsigned long long give_up = global_ns() + WAIT_NS;
        for (int p = 0; p < ranks; ++p)
            while (load_acquire_sys(flags + tile * ranks + p) < e)
                if (global_ns() > give_up) __trap();
    }
    __syncthreads();
    const float *got = recv + offset;
    const int n0 = GEMV_COLS * tile;
    for (int j = threadIdx.x; j < rows * GEMV_COLS; j += blockDim.x) {
        const int r = j / GEMV_COLS, c = n0 + j % GEMV_COLS;
        if (c >= N) continue;
        const size_t i = (size_t)r * N + c;
        float s = 0.f;
        for (int p = 0; p < ranks; ++p) s += __ldcv(got + p * slot + i);
        res[i] = to_bf(to_f(__ldcg(res + i)) + s);
    }
}

// ---- the split's gate/up projection on narrower tiles (decode) -------------------------------
// norm_gemv_swiglu (gemv.cu) with 4 outputs a block instead of 8: mma rows g < 4 are gate rows
// 4t + g, rows g + 8 their up rows, rows 4..7 and 12..15 empty (no loads). A rank's slice of the
// intermediate width makes few blocks: Llama-3.1-8B's 14336 / 2 = 7168 outputs are 896 blocks
// of 8, 3.4 waves of the 264 an H200 holds, the last one 40% full (the gemv ran at 3.0 TB/s
// against 3.6 unsplit); 1792 blocks of 4 are 6.8 waves. Same sums, same bits: a block's sums
// are formed in the same order whatever its width. Grid ceil_div(N, 4).
struct YSwiGLU4 {
    static constexpr bool PAIRED = true;
    bf16 *act;
    __device__ bool wrows(int tile, int g, int N, int &w0, int &w1) const {
        w0 = 4 * tile + g;
        w1 = N + w0;
        return g < 4 && w0 < N;
    }
    __device__ void put(int r, int tile, int g, int N, float gate, float up) const {
        const float gs = rbf(gate);
        act[(size_t)r * N + 4 * tile + g] = to_bf(rbf(gs / (1.f + expf(-gs))) * rbf(up));
    }
};

extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS, 2)
norm_gemv_swiglu4(const bf16 *__restrict__ res, const bf16 *__restrict__ nw, const bf16 *__restrict__ W,
                  bf16 *__restrict__ act, int rows, int N, int K, float eps) {
    gemv(XNorm{res, nw, eps}, W, YSwiGLU4{act}, rows, N, K);
}
