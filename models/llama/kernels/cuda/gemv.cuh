// Skinny matrix products for decode rows: y[rows, N] = x[rows, K] @ W[N, K]^T
// (transformers' Linear layout: W is [out_features, in_features], row-major, bf16).
//
// One block per 16 output columns (grid ceil_div(N, 16), block 256 = 8 warps). The block's
// 16 W rows are cut along K into units of 256 elements; warp w takes units w, w+8, ...
// Each lane issues all 32 of its 8-byte W loads of a unit (rows g and g+8, g = lane/4)
// before using any, then feeds them straight into tensor-core mma.m16n8k16 (bf16 in, fp32
// accumulate) with x as the 8-column operand: W is read from memory exactly once for up to
// 32 rows (rows in tiles of 8; rows > 32 go in passes of 32, re-reading W).
// The k16 sets: a tensor-core step's sum depends on which 16 k it takes, not on which k slot
// holds which (measured: bench/probes/mma_sums.cu), so each step takes 16 consecutive elements,
// as wgmma does from shared memory: lane (g, t = lane%4) loads the 4 elements 4t..4t+3 of each
// half of a 32-element step (8-byte loads, k0 = unit + 32u + 4t and k0 + 16) into the mma's k
// slots {2t, 2t+1, 2t+8, 2t+9} of that half's k16 step: no shuffles, no shared memory for W,
// and every warp load covers whole 32-byte sectors (8 rows x 2 x 32 contiguous bytes). So a
// many-row kernel on wgmma (gemm.cu) walking K in the same sets and partials gets the same bits.
// The 8 warps' partial sums are added in warp order through shared memory: fixed order, no
// atomics, bitwise deterministic for a given (rows, N, K).
// Variants (one template: how x is formed, how y is stored): gemv_bf16 / gemv_f32 store y;
// norm_gemv_* multiply by rmsnorm(res) * nw, with the 1/rms taken from the same loads and
// applied to the sums in the epilogue (no pass of its own); gemv_residual adds y into the
// residual stream; norm_gemv_swiglu multiplies gate and up rows side by side and stores
// silu(gate) * up; norm_gemv_rope_append rotates q and k head pairs side by side and writes
// k and v to the paged KV state (norm + qkv projection + rope + KV append in one launch).
// K % 8 == 0, pointers 16-byte aligned. Grid (ceil_div(N, GEMV_COLS)) (norm_gemv_swiglu,
// norm_gemv_rope_append: pairs of W rows, ceil_div(N, GEMV_COLS / 2) for swiglu's output
// width N), block 32 * GEMV_WARPS.
#pragma once
#include "rope.cuh"

#if !defined(GEMV_COLS) || !defined(GEMV_WARPS)
#error "GEMV_COLS and GEMV_WARPS come from the family's TILES (kern_models.common.cubins passes them as -D)"
#endif

// GEMV_WARPS (8) and GEMV_COLS (16 output columns a block) come from table.py.
static_assert(GEMV_COLS == 16, "a block's columns are the 16 W rows of one mma tile");
#define GEMV_KU 8                    // 16-byte loads per W row per lane per unit
#define GEMV_UNIT (32 * GEMV_KU)     // K elements per warp unit
#define GEMV_MAX_NT 4                // row tiles of 8 per pass: 32 rows
// Staged x rows a lane loads before it stores any (more spill registers: docs/perf.md)
#ifndef GEMV_STAGE_ROWS
#define GEMV_STAGE_ROWS 4
#endif
#define GEMV_XLD (GEMV_UNIT + 32)    // staged x row (elements): rows g, g+1 on other banks
#define GEMV_WARP_SMEM 4608          // bytes a warp: 8 staged rows, or its 16 x 32 partial sums
static_assert(8 * GEMV_XLD * 2 <= GEMV_WARP_SMEM && GEMV_MAX_NT * 4 * 32 * 4 <= GEMV_WARP_SMEM, "");
// Streaming weight load: read-only path, no L1 allocation, 256-byte L2 prefetch. Volatile keeps
// the first unit's loads before griddepcontrol.wait.
__device__ __forceinline__ uint2 ld_stream8(const bf16 *p) {
    uint2 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}
// Activations (x, the residual) are written by the previous kernel, which under PDL may still
// be finishing when this kernel starts: read them at L2 (ld.global.cg). Neither the
// non-coherent path (__ldg) nor plain L1-cached loads are safe here: with plain loads, eager
// PDL launches on the H200 read stale lines (a decode row's logits came out as NaN), since the
// SM's L1 may hold lines from before the previous kernel's writes. The asm is not volatile, so
// the compiler may batch and hoist these loads (a volatile load is pinned between the mma
// statements: one round trip per mma); what keeps them after the wait is that their addresses
// come from after_wait(), a volatile statement placed after it.
__device__ __forceinline__ uint4 ld_act(const bf16 *p) {
    uint4 r;
    asm("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}
__device__ __forceinline__ uint2 ld_act8(const bf16 *p) {
    uint2 r;
    asm("ld.global.cg.v2.u32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p));
    return r;
}
// A lane's mma operand of one 32-element step from a row at `p` (the step's first element):
// elements 4t..4t+3 (x, y) and 16+4t..16+4t+3 (z, w), zero past K (k: the step's index of p).
template <class Ld>
__device__ __forceinline__ uint4 step_operand(const Ld &ld, const bf16 *p, int k, int t, int K) {
    const uint2 lo = k + 4 * t < K ? ld(p + 4 * t) : make_uint2(0, 0);
    const uint2 hi = k + 16 + 4 * t < K ? ld(p + 16 + 4 * t) : make_uint2(0, 0);
    return make_uint4(lo.x, lo.y, hi.x, hi.y);
}
template <typename T>
__device__ __forceinline__ T *after_wait(T *p) {
    uint64_t a;
    asm volatile("mov.b64 %0, %1;" : "=l"(a) : "l"(reinterpret_cast<uint64_t>(p)) : "memory");
    return reinterpret_cast<T *>(a);
}

// ---- the x operand: plain or RMS-normed -------------------------------------------------
// A plain x is loaded by the lanes that feed it to the mma, straight from L2 (lane (g, t) loads
// row g's elements it multiplies). A normed x is staged: per unit of K, a warp puts the x rows
// it needs in its own shared-memory tile: lane l loads elements 8l .. 8l+7 of the unit for each
// row (one coalesced 16-byte load a row, GEMV_STAGE_ROWS rows issued before any is used),
// forms them once (nw * res, and the sum of squares), stores them, and the mma loop reads its
// operands there. Staging pays for the normed projections and not for the plain ones
// (docs/perf.md). fetch's address is always valid (the caller clamps k), form zeroes what lies
// past K.
struct XPlain {
    static constexpr bool NORM = false;
    const bf16 *x;
    __device__ XPlain after() const { return {after_wait(x)}; }
    __device__ uint4 fetch(int row, int k, int K) const { return ld_act(x + (size_t)row * K + k); }
    // this lane's operand of the 32-element step at k of row `row` (step_operand)
    __device__ uint4 operand(int row, int k, int t, int K) const {
        return step_operand([](const bf16 *p) { return ld_act8(p); }, x + (size_t)row * K + k, k, t, K);
    }
};

// x = rmsnorm(res) * nw with 1/rms deferred: 1/rms is one number a row, so it commutes with
// the dot product; the mma takes bf16(nw * res) and the epilogue multiplies the row's sums by
// 1/rms. The sum of squares comes from the same res loads (lanes by xor tree, then the units in
// order, then the warps in order: the same in every block), so the norm costs no extra pass or
// round trip. One rounding of x instead of the unfused norm's two (bf16(nw * bf16(res / rms))):
// the error is of the same size, not the same bits.
struct XNorm {
    static constexpr bool NORM = true;
    const bf16 *res, *w;
    float eps;
    __device__ XNorm after() const { return {after_wait(res), w, eps}; }
    __device__ uint4 weight(int k) const { return __ldg(reinterpret_cast<const uint4 *>(w + k)); }
    __device__ uint4 fetch(int row, int k, int K) const { return ld_act(res + (size_t)row * K + k); }
    __device__ uint4 form(const uint4 &v, const uint4 &nw, bool ok, float &ss) const {
        float f[8], g[8];
        unpack8(v, f);
        unpack8(nw, g);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            f[j] = ok ? f[j] : 0.f;
            ss += f[j] * f[j];
            f[j] *= g[j];
        }
        return pack8(f);
    }
};

// ---- the output ---------------------------------------------------------------------------
// Plain outputs: the block of tile t = blockIdx.x takes 16 consecutive rows of W (outputs
// n0 .. n0+15, n0 = 16 t); mma row g is W row n0 + g, mma row g + 8 is W row n0 + g + 8.
struct YBf16 {
    static constexpr bool PAIRED = false;
    bf16 *y;
    __device__ void put(size_t i, float v) const { y[i] = to_bf(v); }
};
struct YF32 {
    static constexpr bool PAIRED = false;
    float *y;
    __device__ void put(size_t i, float v) const { y[i] = v; }
};
// res = bf16(res + bf16(v)): the projection rounded to bf16, then the residual add, as the
// unfused add_rms_norm does it. Each element is read and written by one thread only.
struct YAddRes {
    static constexpr bool PAIRED = false;
    bf16 *res;
    __device__ void put(size_t i, float v) const {
        res[i] = to_bf(to_f(__ldcg(res + i)) + rbf(v));
    }
    // The same add split in two, for an epilogue that reads all its residuals before it stores
    // any (the loads then overlap instead of waiting one by one behind the stores).
    __device__ float old(size_t i) const { return to_f(__ldcg(res + i)); }
    __device__ void put_old(size_t i, float v, float o) const { res[i] = to_bf(o + rbf(v)); }
};

// Paired outputs: mma rows g and g + 8 are two W rows one output needs together. wrows names
// them (false: past the end), put takes their two sums for x row r.
// SwiGLU: W is gate_up [2N, K] (gate rows, then up rows); tile t takes gate rows 8t .. 8t+7
// and the matching up rows, and stores act = bf16(bf16(silu(bf16(gate))) * bf16(up)) [rows, N],
// as gemv + silu_mul would.
struct YSwiGLU {
    static constexpr bool PAIRED = true;
    bf16 *act;
    __device__ bool wrows(int tile, int g, int N, int &w0, int &w1) const {
        w0 = (GEMV_COLS / 2) * tile + g;
        w1 = N + w0;
        return w0 < N;
    }
    __device__ void put(int r, int tile, int g, int N, float gate, float up) const {
        const float gs = rbf(gate);
        act[(size_t)r * N + (GEMV_COLS / 2) * tile + g] = to_bf(rbf(gs / (1.f + expf(-gs))) * rbf(up));
    }
};
// Rope and the KV append: W is the fused qkv projection [N, K], N = (n_q + 2 n_kv) head_dim
// (q heads, k heads, v heads). Tile t takes 8 rope pairs (i, i + head_dim/2) of one head, so
// the epilogue holds both halves of each pair: it rounds them to bf16 (what the unfused gemv
// stores), rotates q and k (rope.cuh), stores q, k and v into y [rows, N] as gemv + rope would
// leave them, and writes k and v of this position to the paged KV state, as qk_norm_rope_append does.
struct YRopeAppend {
    static constexpr bool PAIRED = true;
    bf16 *y;
    const int *pos;
    const float *table;
    KvAppend app;
    int n_q_heads, n_kv_heads, head_dim;
    __device__ void pair(int tile, int g, int &head, int &i) const {
        const int per_head = head_dim >> 4;  // tiles a head: (head_dim / 2) / 8 pairs
        head = tile / per_head;
        i = (tile - head * per_head) * 8 + g;
    }
    __device__ bool wrows(int tile, int g, int N, int &w0, int &w1) const {
        int head, i;
        pair(tile, g, head, i);
        w0 = head * head_dim + i;
        w1 = w0 + (head_dim >> 1);
        return w0 < N;
    }
    __device__ void put(int r, int tile, int g, int N, float a, float b) const {
        int head, i;
        pair(tile, g, head, i);
        const int half = head_dim >> 1, p = pos[r];
        float x0 = rbf(a), x1 = rbf(b);
        if (head < n_q_heads + n_kv_heads) rotate(x0, x1, table, p, i, head_dim);
        bf16 *yr = y + (size_t)r * N + (size_t)head * head_dim;
        yr[i] = to_bf(x0);
        yr[i + half] = to_bf(x1);
        if (head >= n_q_heads) {
            const int which = head >= n_q_heads + n_kv_heads;  // 0: k, 1: v
            bf16 *d = app.dst(r, which, head - n_q_heads - which * n_kv_heads, p, n_kv_heads, head_dim);
            d[i] = to_bf(x0);
            d[i + half] = to_bf(x1);
        }
    }
};

// The fused qkv projections' Y (gemv.cu's, gemm.cu's entries): rope and the KV append.
__device__ __forceinline__ YRopeAppend rope_append_y(bf16 *y, char *kv_state, const int *page_table,
                                                     const int *cu_seqlens, const int *pos, const float *table,
                                                     int pages_per_seq, int n_seqs, int layer, int n_layers,
                                                     int n_q_heads, int n_kv_heads, int head_dim, int page_tokens) {
    const KvAppend app{nullptr, kv_state, page_table, cu_seqlens, pages_per_seq, n_seqs, layer, n_layers,
                       page_tokens};
    return {y, pos, table, app, n_q_heads, n_kv_heads, head_dim};
}

__device__ __forceinline__ void ld_unit(uint4 *a, uint4 *b, const bf16 *w0, const bf16 *w1,
                                        bool ok0, bool ok1, int kb, int t, int K) {
    const auto ld = [](const bf16 *p) { return ld_stream8(p); };
#pragma unroll
    for (int u = 0; u < GEMV_KU; ++u) {
        const int k = kb + 32 * u;
        a[u] = step_operand(ld, w0 + k, ok0 ? k : K, t, K);
        b[u] = step_operand(ld, w1 + k, ok1 ? k : K, t, K);
    }
}

// Where a pass keeps its staged x rows and the warps' partial sums. The per-op kernels: a warp's
// 8 staged rows, later its slice of the reduction, in the same bytes (GEMV_WARP_SMEM a warp).
struct GemvSmem {
    static constexpr bool SHARED = true;  // the reduction overwrites the staged rows
    char *smem;
    __device__ bf16 *stage(int warp, int) const { return reinterpret_cast<bf16 *>(smem + warp * GEMV_WARP_SMEM); }
    __device__ float *red(int w) const { return reinterpret_cast<float *>(smem + w * GEMV_WARP_SMEM); }
};
// A Y's view after the wait: itself, unless it reads what the previous kernel writes through a
// pointer that must not be read before the wait (an overload for such a Y says so).
template <class Y>
__device__ __forceinline__ Y y_after(const Y &y) { return y; }

// One pass of tile `tile` (16 W rows, or 8 pairs) over rows [r0, r0 + R), R <= 8 * NT. Each
// warp's first W unit is loaded before wait() (W never depends on the previous kernel or
// phase; x does): under PDL the weight stream overlaps the previous kernel's tail. mem.stage
// is this warp's staging tile (8 rows of GEMV_XLD for each of the NT row tiles, or the same 8
// rows reused), mem.red(w) warp w's slice of the reduction; `ssr` the warps' sums of squares.
// staged: the rows are in this warp's stage already (the megakernel's later tiles of a phase):
// the same values, not loaded and formed again.
template <int NT, class X, class Y, class Mem, class Wait>
__device__ __forceinline__ void gemv_tile(const X &xs0, const bf16 *__restrict__ W, const Y &ys0, int tile,
                                          int r0, int R, int N, int K, const Mem &mem, float *ssr, bool staged,
                                          const Wait &wait) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = GEMV_COLS * tile;
    int row0, row1;
    bool ok0, ok1;
    if constexpr (Y::PAIRED) {
        ok0 = ok1 = ys0.wrows(tile, g, N, row0, row1);
    } else {
        row0 = n0 + g;
        row1 = n0 + g + 8;
        ok0 = row0 < N;
        ok1 = row1 < N;
    }
    const bf16 *w0 = W + (size_t)(ok0 ? row0 : 0) * K;
    const bf16 *w1 = W + (size_t)(ok1 ? row1 : 0) * K;
    uint4 a[GEMV_KU], b[GEMV_KU];
    int kb = warp * GEMV_UNIT;
    ld_unit(a, b, w0, w1, ok0, ok1, kb, t, K);
    wait();
    // after(): the activations' addresses come from after the wait, so their loads (asm that the
    // compiler may move or merge: ld_act is neither volatile nor memory-clobbering) neither rise
    // above it nor reuse values from before it
    const X xs = xs0.after();
    const Y ys = y_after(ys0);
    if constexpr (X::NORM)
        if (!staged) ssr[warp * 8 * GEMV_MAX_NT + lane] = 0.f;  // this warp's row sums
    float c[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.f;
    while (kb < K) {
        if constexpr (X::NORM) {
            const int kc = kb + 8 * lane;  // this lane's 8 elements of the unit when staging
            const bool okc = kc < K;
            const uint4 nw = staged ? make_uint4(0, 0, 0, 0) : xs.weight(okc ? kc : 0);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                bf16 *xw = mem.stage(warp, nt);
                __syncwarp();  // the previous tile's reads of xw are done
#pragma unroll
                for (int i0 = 0; i0 < 8 && !staged; i0 += GEMV_STAGE_ROWS) {
                    uint4 raw[GEMV_STAGE_ROWS];
#pragma unroll
                    for (int i = 0; i < GEMV_STAGE_ROWS; ++i)
                        if (nt * 8 + i0 + i < R) raw[i] = xs.fetch(r0 + nt * 8 + i0 + i, okc ? kc : 0, K);
#pragma unroll
                    for (int i = 0; i < GEMV_STAGE_ROWS; ++i) {
                        if (nt * 8 + i0 + i < R) {
                            float ss = 0.f;
                            *reinterpret_cast<uint4 *>(xw + (i0 + i) * GEMV_XLD + 8 * lane) =
                                xs.form(raw[i], nw, okc, ss);
                            ss = warp_sum(ss);
                            if (lane == 0) ssr[warp * 8 * GEMV_MAX_NT + nt * 8 + i0 + i] += ss;
                        }
                    }
                }
                __syncwarp();
                // Rows past R hold stale values: they only reach their own mma columns, which
                // the epilogue drops.
#pragma unroll
                for (int u = 0; u < GEMV_KU; ++u) {
                    const bf16 *xs8 = xw + g * GEMV_XLD + 32 * u + 4 * t;  // step_operand's elements
                    const uint2 lo = *reinterpret_cast<const uint2 *>(xs8), hi = *reinterpret_cast<const uint2 *>(xs8 + 16);
                    const uint4 xv = make_uint4(lo.x, lo.y, hi.x, hi.y);
                    mma_bf16(c[nt], a[u].x, b[u].x, a[u].y, b[u].y, xv.x, xv.y);
                    mma_bf16(c[nt], a[u].z, b[u].z, a[u].w, b[u].w, xv.z, xv.w);
                }
            }
        } else {  // plain x: each lane loads its own operands (rows g, 8 + g, ...) straight from L2
#pragma unroll
            for (int u = 0; u < GEMV_KU; ++u) {
                const int k = kb + 32 * u;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const int row = nt * 8 + g;
                    const uint4 xv = row < R ? xs.operand(r0 + row, k, t, K) : make_uint4(0, 0, 0, 0);
                    mma_bf16(c[nt], a[u].x, b[u].x, a[u].y, b[u].y, xv.x, xv.y);
                    mma_bf16(c[nt], a[u].z, b[u].z, a[u].w, b[u].w, xv.z, xv.w);
                }
            }
        }
        kb += GEMV_WARPS * GEMV_UNIT;
        if (kb < K) ld_unit(a, b, w0, w1, ok0, ok1, kb, t, K);
    }

    // c[nt][i]: i = 0, 1 -> (W row g, x rows 2t, 2t+1), i = 2, 3 -> (W row g + 8, same x rows).
    // red(warp)[nt * 4 + i][lane]; then the 8 warps are added in order.
    if constexpr (Mem::SHARED) __syncwarp();  // xw becomes red(warp)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) mem.red(warp)[(nt * 4 + i) * 32 + lane] = c[nt][i];
    __syncthreads();
    for (int j = threadIdx.x; j < NT * 4 * 32; j += blockDim.x) {
        const int q = j >> 5, l = j & 31;
        const int nt = q >> 2, i = q & 3;
        const int row = nt * 8 + 2 * (l & 3) + (i & 1);
        if (row >= R) continue;
        float scale = 1.f;
        if constexpr (X::NORM) {
            float s = 0.f;
#pragma unroll
            for (int w = 0; w < GEMV_WARPS; ++w) s += ssr[w * 8 * GEMV_MAX_NT + row];
            scale = 1.f / sqrtf(s / (float)K + xs.eps);
        }
        if constexpr (Y::PAIRED) {  // i = 0, 1: sums of W row g; i + 2: those of its partner
            int w0_, w1_;
            if (i < 2 && ys.wrows(tile, l >> 2, N, w0_, w1_)) {
                float as = 0.f, bs = 0.f;
#pragma unroll
                for (int w = 0; w < GEMV_WARPS; ++w) {
                    as += mem.red(w)[q * 32 + l];
                    bs += mem.red(w)[(q + 2) * 32 + l];
                }
                ys.put(r0 + row, tile, l >> 2, N, as * scale, bs * scale);
            }
        } else {
            const int col = n0 + (l >> 2) + (i >= 2 ? 8 : 0);
            if (col < N) {
                float v = 0.f;
#pragma unroll
                for (int w = 0; w < GEMV_WARPS; ++w) v += mem.red(w)[q * 32 + l];
                ys.put((size_t)(r0 + row) * N + col, v * scale);
            }
        }
    }
    __syncthreads();  // red and ssr are reused by the next pass
}

// early: let the next kernel launch at entry, not after the wait (see the kernels that pass it).
template <class X, class Y>
__device__ __forceinline__ void gemv(const X &xs, const bf16 *__restrict__ W, const Y &ys,
                                     int rows, int N, int K, bool early = false) {
    __shared__ __align__(16) char smem[GEMV_WARPS * GEMV_WARP_SMEM];
    __shared__ float ssr[GEMV_WARPS * 8 * GEMV_MAX_NT];
    if (early) pdl_launch_dependents();
    const GemvSmem mem{smem};
    for (int r0 = 0; r0 < rows; r0 += 8 * GEMV_MAX_NT) {
        const int R = min(8 * GEMV_MAX_NT, rows - r0);
        const bool first = r0 == 0;
        // the first pass waits for the previous kernel after its first weight loads (PDL)
        const auto wait = [&] {
            if (first) {
                pdl_wait();
                if (!early) pdl_launch_dependents();
            }
        };
        if (R <= 8) gemv_tile<1>(xs, W, ys, blockIdx.x, r0, R, N, K, mem, ssr, false, wait);
        else if (R <= 16) gemv_tile<2>(xs, W, ys, blockIdx.x, r0, R, N, K, mem, ssr, false, wait);
        else gemv_tile<4>(xs, W, ys, blockIdx.x, r0, R, N, K, mem, ssr, false, wait);
    }
}
