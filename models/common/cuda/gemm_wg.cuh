// Many-row projections on Hopper's tensor cores, batch-invariant by construction:
// y[M, N] = x[M, K] @ W[N, K]^T (transformers' Linear layout), bf16 in, fp32 sums.
//
// The reduction order of an output is fixed by K alone, never by M or the tile: K is cut in
// units of 256 elements; partial p (p = 0 .. 7) takes units p, p + 8, p + 16, ... in turn, each
// as 16 wgmma k16 steps of consecutive elements (a chain: one accumulator, started at the
// partial's first step); the 8 partials are added to a running total in order p = 0 .. 7, from
// 0. That is the order of the gemv decode kernels (llama's gemv.cuh: warp p = partial p), and a
// k16 step's sum is the same through wgmma at any N and through mma.sync (wgmma.cuh), so a row
// gets the same bits from this kernel at any M, in either of its shapes, and from the gemv.
//
// A block: one producer warpgroup filling a ring of STAGES shared-memory stages with cp.async
// (each stage 64 K elements of the block's x rows and W rows, 128-byte swizzled, completing on
// the stage's `full` mbarrier), and NWG consumer warpgroups, each 64 x rows beside the block's
// BN W rows on wgmma m64nBNk16 (both operands from shared memory), releasing a stage through its
// `empty` mbarrier once the wgmma reading it retired. A consumer keeps the chain's accumulators
// and the running total (BN / 2 floats each a thread). Split (grid z = 8): block z computes
// partial z alone and stores it; the last of a tile's 8 blocks to arrive (a counter per tile,
// zero between launches, reset by that block) adds them in order and runs the epilogue: the
// same sums in the same order, for few rows and narrow W (8 times the blocks).
//
// What the family supplies (a Y): PAIRED, wrows(q / 8, q % 8, N, w0, w1) and put(...) as llama's
// gemv.cuh defines them: a paired Y needs two W rows of pair q side by side; the block's first
// BN / 2 W rows are the pairs' first rows, the next BN / 2 their partners, so a thread holds both
// sums (columns c and c + BN / 2 of its accumulators).
#pragma once
#include <type_traits>
#include "wgmma.cuh"

#define WG_UNIT 256  // K elements a unit
#define WG_PARTS 8   // partials (the gemv's warps)
#define WG_BK 64     // K elements a stage: 128 bytes a row
#define WG_GROUP 8   // column tiles a group of blocks walks together (L2 reuse)

template <int BN_, int NWG_, int STAGES_>
struct WgCfg {
    static constexpr int BN = BN_, NWG = NWG_, STAGES = STAGES_;
    static constexpr int BM = 64 * NWG;                 // x rows a block
    static constexpr int THREADS = 128 * (NWG + 1);     // a producer warpgroup and NWG consumers
    static constexpr int A_BYTES = BM * 128, B_BYTES = BN * 128, STAGE = A_BYTES + B_BYTES;
    static constexpr int SMEM = STAGES * STAGE + 1024 + 2 * STAGES * 8 + 16;  // + alignment, barriers, flag
    static constexpr int ACC = BN / 2;                  // accumulators a consumer thread
    static constexpr int PART = BN * BM;                // split: floats a (tile, partial)
    static_assert(BM % 16 == 0 && BN % 16 == 0, "a producer thread copies one chunk column of whole rows");
};

// Units of K with index = p (mod 8): partial p's count of the nu units.
__device__ __forceinline__ int wg_units_of(int p, int nu) { return p < nu ? (nu - p + WG_PARTS - 1) / WG_PARTS : 0; }

// The producer: thread i copies 16-byte chunk (i % 8) of rows i / 8, i / 8 + 16, ... of the x and W
// tiles, for every stage of partials p0 .. p1 - 1 in order.
template <class C, class Y>
__device__ __forceinline__ void wg_produce(const bf16 *__restrict__ x, const bf16 *__restrict__ W, const Y &ys,
                                           char *ring, uint64_t *full, uint64_t *empty, int m0, int q0, int rows,
                                           int N, int K, int p0, int p1) {
    const int tid = threadIdx.x, c = tid & 7, r0 = tid >> 3;
    const int nu = (K + WG_UNIT - 1) / WG_UNIT;
    constexpr int AR = C::BM / 16, BR = C::BN / 16;
    const bf16 *ap[AR], *bp[BR];
    bool aok[AR], bok[BR];
#pragma unroll
    for (int j = 0; j < AR; ++j) {
        const int m = m0 + r0 + 16 * j;
        aok[j] = m < rows;
        ap[j] = x + (size_t)(aok[j] ? m : 0) * K + 8 * c;
    }
#pragma unroll
    for (int j = 0; j < BR; ++j) {
        const int b = r0 + 16 * j;
        int w;
        if constexpr (Y::PAIRED) {
            const int q = q0 + (b % (C::BN / 2));
            int w0, w1;
            bok[j] = ys.wrows(q >> 3, q & 7, N, w0, w1);
            w = b < C::BN / 2 ? w0 : w1;
        } else {
            w = q0 + b;
            bok[j] = w < N;
        }
        bp[j] = W + (size_t)(bok[j] ? w : 0) * K + 8 * c;
    }
    int i = 0;
    for (int p = p0; p < p1; ++p)
        for (int u = p; u < nu; u += WG_PARTS)
            for (int sub = 0; sub < WG_UNIT / WG_BK; ++sub, ++i) {
                const int s = i % C::STAGES, n = i / C::STAGES;
                if (n > 0) mbar_wait(&empty[s], (n - 1) & 1);
                const int k = u * WG_UNIT + sub * WG_BK;
                const bool kok = k + 8 * c < K;
                char *a = ring + s * C::STAGE, *bt = a + C::A_BYTES;
#pragma unroll
                for (int j = 0; j < AR; ++j)
                    cp_async16_zfill(a + sw128(r0 + 16 * j, c), ap[j] + (kok ? k : 0), aok[j] && kok ? 16 : 0);
#pragma unroll
                for (int j = 0; j < BR; ++j)
                    cp_async16_zfill(bt + sw128(r0 + 16 * j, c), bp[j] + (kok ? k : 0), bok[j] && kok ? 16 : 0);
                cp_async_arrive(&full[s]);
            }
}

// The producer through the tensor memory access unit: one thread issues, for every stage,
// the x tile's and the W tile's boxes of WG_BOX rows (64 K elements, 128-byte swizzled: the
// layout the cp.async producer writes, so the consumers and the sums are the same) on the
// stage's `full` barrier, which expects the stage's bytes. xmap and wmap: tensor maps of x
// [rows, K] and W [N', K] (kern's `tiles<32,64>` params). A paired Y's box of WG_BOX rows is
// WG_BOX consecutive pairs' first (or partner) rows, consecutive in W: SwiGLU's gate and up
// rows, rope's rows i and i + head_dim / 2 of one head (head_dim a multiple of 64).
#define WG_BOX 32
template <class C, class Y>
__device__ __forceinline__ void wg_produce_tma(const void *xmap, const void *wmap, const Y &ys, char *ring,
                                               uint64_t *full, uint64_t *empty, int m0, int q0, int N, int K,
                                               int p0, int p1) {
    if (threadIdx.x != 0) return;
    static_assert(C::BM % WG_BOX == 0 && C::BN % (2 * WG_BOX) == 0, "whole boxes");
    constexpr int AB = C::BM / WG_BOX, BB = C::BN / WG_BOX;
    int wrow[BB];
#pragma unroll
    for (int j = 0; j < BB; ++j) {
        const int b = WG_BOX * j;
        if constexpr (Y::PAIRED) {
            const int q = q0 + (b % (C::BN / 2));
            int w0, w1;
            ys.wrows(q >> 3, q & 7, N, w0, w1);
            wrow[j] = b < C::BN / 2 ? w0 : w1;
        } else {
            wrow[j] = q0 + b;
        }
    }
    tma_prefetch_map(xmap);
    tma_prefetch_map(wmap);
    const int nu = (K + WG_UNIT - 1) / WG_UNIT;
    int i = 0;
    for (int p = p0; p < p1; ++p)
        for (int u = p; u < nu; u += WG_PARTS)
            for (int sub = 0; sub < WG_UNIT / WG_BK; ++sub, ++i) {
                const int s = i % C::STAGES, n = i / C::STAGES;
                if (n > 0) mbar_wait(&empty[s], (n - 1) & 1);
                const int k = u * WG_UNIT + sub * WG_BK;
                char *a = ring + s * C::STAGE, *bt = a + C::A_BYTES;
                mbar_expect_tx(&full[s], C::STAGE);
#pragma unroll
                for (int j = 0; j < AB; ++j) tma_load_2d(a + j * WG_BOX * 128, xmap, k, m0 + WG_BOX * j, &full[s]);
#pragma unroll
                for (int j = 0; j < BB; ++j) tma_load_2d(bt + j * WG_BOX * 128, wmap, k, wrow[j], &full[s]);
            }
}

// A consumer warpgroup (wg = 0 .. NWG - 1): the chains of partials p0 .. p1 - 1 over its 64 x rows,
// each added to tot in order (tot must start at 0). i: the ring's stage count so far (a
// persistent block's earlier work items); returns it after this item's stages.
template <class C>
__device__ __forceinline__ int wg_consume(float (&tot)[C::ACC], char *ring, uint64_t *full, uint64_t *empty, int wg,
                                          int K, int p0, int p1, int i = 0) {
    const int nu = (K + WG_UNIT - 1) / WG_UNIT;
    float acc[C::ACC];
    for (int p = p0; p < p1; ++p) {
        const int steps = wg_units_of(p, nu) * (WG_UNIT / WG_BK);
        if (steps == 0) continue;  // the gemv adds this partial's 0: the total (never -0) keeps its bits
        for (int st = 0; st < steps; ++st, ++i) {
            const int s = i % C::STAGES;
            mbar_wait(&full[s], (i / C::STAGES) & 1);
            fence_async_smem();
            const char *a = ring + s * C::STAGE + wg * 64 * 128, *b = ring + s * C::STAGE + C::A_BYTES;
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < WG_BK / 16; ++kk)
                wgmma_bn<C::BN>(acc, desc_sw128(a + 32 * kk), desc_sw128(b + 32 * kk), st > 0 || kk > 0);
            wgmma_commit();
            wgmma_wait<1>();  // the previous stage's wgmma retired: its stage is free
            if (st > 0) mbar_arrive(&empty[(i - 1) % C::STAGES]);
        }
        wgmma_wait<0>();
        mbar_arrive(&empty[(i - 1) % C::STAGES]);
#pragma unroll
        for (int j = 0; j < C::ACC; ++j) tot[j] += acc[j];
    }
    return i;
}

// A Y whose put reads what it writes (a residual add) may offer old(i) and put_old(i, v, o):
// the epilogue then reads a row's old values before it stores any of them.
template <class Y, class = void>
struct wg_reads_first : std::false_type {};
template <class Y>
struct wg_reads_first<Y, std::void_t<decltype(&Y::put_old)>> : std::true_type {};

// The epilogue of one consumer thread: y from its totals, times scale[row] (1/rms of a normed
// x, from the family's norm kernel; nullptr: 1).
template <class C, class Y>
__device__ __forceinline__ void wg_store(const float (&tot)[C::ACC], const Y &ys, const float *scale, int wg, int m0,
                                         int q0, int rows, int N) {
    const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = m0 + wg * 64 + 16 * w + g + 8 * h;
        if (r >= rows) continue;
        const float sc = scale ? __ldcg(scale + r) : 1.f;
        if constexpr (Y::PAIRED) {
#pragma unroll
            for (int j = 0; j < C::BN / 16; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int q = q0 + 8 * j + 2 * t + e;
                    int w0, w1;
                    if (ys.wrows(q >> 3, q & 7, N, w0, w1))
                        ys.put(r, q >> 3, q & 7, N, tot[4 * j + 2 * h + e] * sc,
                               tot[4 * (j + C::BN / 16) + 2 * h + e] * sc);
                }
        } else if constexpr (wg_reads_first<Y>::value) {
            float old[C::BN / 4];
#pragma unroll
            for (int j = 0; j < C::BN / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int col = q0 + 8 * j + 2 * t + e;
                    old[2 * j + e] = col < N ? ys.old((size_t)r * N + col) : 0.f;
                }
#pragma unroll
            for (int j = 0; j < C::BN / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int col = q0 + 8 * j + 2 * t + e;
                    if (col < N) ys.put_old((size_t)r * N + col, tot[4 * j + 2 * h + e] * sc, old[2 * j + e]);
                }
        } else {
#pragma unroll
            for (int j = 0; j < C::BN / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int col = q0 + 8 * j + 2 * t + e;
                    if (col < N) ys.put((size_t)r * N + col, tot[4 * j + 2 * h + e] * sc);
                }
        }
    }
}

// The whole projection. Grid: x the column tiles (BN W rows, or BN / 2 pairs, a block), y the
// row tiles (BM rows), z 1 (or WG_PARTS when split, with part and sem). Dynamic shared memory
// C::SMEM. x and W by address (the cp.async producer), or, with xmap and wmap set, through
// their tensor maps (the TMA producer; x and W unused).
template <class C, class Y>
__device__ __forceinline__ void gemm_wg(const bf16 *__restrict__ x, const bf16 *__restrict__ W, const float *scale,
                                        const Y &ys, int rows, int N, int K, float *part = nullptr,
                                        int *sem = nullptr, const void *xmap = nullptr,
                                        const void *wmap = nullptr) {
    extern __shared__ char wg_smem_raw[];
    char *ring = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(wg_smem_raw) + 1023) & ~uintptr_t(1023));
    uint64_t *full = reinterpret_cast<uint64_t *>(ring + C::STAGES * C::STAGE), *empty = full + C::STAGES;
    int *last = reinterpret_cast<int *>(empty + C::STAGES);
    const bool split = part != nullptr;
    const int p0 = split ? blockIdx.z : 0, p1 = split ? blockIdx.z + 1 : WG_PARTS;
    // Blocks in launch order walk WG_GROUP column tiles down every row tile before the next
    // WG_GROUP: a wave reads each W tile from DRAM once and keeps it (and x) in L2. (In the
    // grid's own order a wave walks every W tile of one row tile, and the next wave reads all
    // of W again: measured 45% L2 hits, 8x the bytes.)
    int tile_m, tile_n;
    {
        const int id = blockIdx.y * gridDim.x + blockIdx.x, per_group = WG_GROUP * gridDim.y;
        const int first = id / per_group * WG_GROUP, width = min(WG_GROUP, (int)gridDim.x - first);
        const int local = id % per_group;
        tile_m = local / width;
        tile_n = first + local % width;
    }
    const int tile = tile_m * gridDim.x + tile_n;  // the split's counter and scratch index
    const int m0 = tile_m * C::BM;
    const int q0 = tile_n * (Y::PAIRED ? C::BN / 2 : C::BN);
    if (threadIdx.x == 0) {
        for (int s = 0; s < C::STAGES; ++s) {
            mbar_init(&full[s], xmap ? 1 : 128);  // the TMA thread, or every cp.async thread once its copies landed
            mbar_init(&empty[s], 128 * C::NWG);  // every consumer thread
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int wg = threadIdx.x / 128 - 1;
    if (wg < 0) {
        if (xmap) {
            wg_produce_tma<C>(xmap, wmap, ys, ring, full, empty, m0, q0, N, K, p0, p1);
        } else {
            wg_produce<C>(x, W, ys, ring, full, empty, m0, q0, rows, N, K, p0, p1);
            asm volatile("cp.async.wait_all;" ::: "memory");
        }
    } else {
        float tot[C::ACC];
#pragma unroll
        for (int j = 0; j < C::ACC; ++j) tot[j] = 0.f;
        wg_consume<C>(tot, ring, full, empty, wg, K, p0, p1);
        if (!split) {
            wg_store<C>(tot, ys, scale, wg, m0, q0, rows, N);
            return;
        }
        // split: store this partial ([tile][partial][accumulator j][consumer thread]), count in
        const int ct = threadIdx.x - 128;
        float *mine = part + ((size_t)tile * WG_PARTS + blockIdx.z) * C::PART;
#pragma unroll
        for (int j = 0; j < C::ACC; ++j) __stcg(mine + j * 128 * C::NWG + ct, tot[j]);
        __threadfence();
    }
    if (!split) return;
    __syncthreads();
    if (threadIdx.x == 0) {
        const int n = atomicAdd(&sem[tile], 1);
        *last = n == WG_PARTS - 1;
        if (*last) sem[tile] = 0;  // zero again for the next launch
    }
    __syncthreads();
    if (!*last || wg < 0) return;
    __threadfence();
    const int ct = threadIdx.x - 128;
    float tot[C::ACC];
#pragma unroll
    for (int j = 0; j < C::ACC; ++j) tot[j] = 0.f;
    for (int p = 0; p < WG_PARTS; ++p) {
        const float *pp = part + ((size_t)tile * WG_PARTS + p) * C::PART;
#pragma unroll
        for (int j = 0; j < C::ACC; ++j) tot[j] += __ldcg(pp + j * 128 * C::NWG + ct);
    }
    wg_store<C>(tot, ys, scale, wg, m0, q0, rows, N);
}
