// The llama-family decode as one persistent kernel (sm_90a): a cooperative grid walks a fixed
// list of phases, crossing a software grid barrier between them, for as many steps as the
// generation needs (prompt chunks first, then one fed-back token a sequence), in one launch.
//
// Phases of one step (phase numbers: PH_* below; a layer has five):
//   embed      x[r] = embed[id[r]]
//   qkv        rmsnorm(x) @ qkv_w^T, rope on q and k, k and v appended to the paged KV state
//   attention  a block per (row, kv head, context split), the splits merged by the last block
//   o          x += attn @ o_w^T
//   mlp        act = silu(gate) * up, [gate | up] = rmsnorm(x) @ gate_up_w^T
//   down       x += act @ down_w^T
//   lm_head    logits = rmsnorm(x[last row of each sequence]) @ lm_head^T, and each block's
//              maximum over the logits it wrote
//   pick       every block reduces the blocks' maxima itself and feeds the token back (no barrier)
// The projections are gemv.cuh's (the same tiles, the same Y epilogues, the same reduction
// order: the same bits as the per-op kernels), taken by the grid's blocks tile after tile.
//
// Bitwise determinism: a row's results never depend on the other rows of the step (the gemv
// sums a row in its own mma column, attention is a block per (row, kv head) in a fixed order),
// so prompts consumed in chunks, token by token or beside other sequences give the same bits;
// reductions are fixed trees and there are no float atomics. phase_lo / phase_hi run a range
// of phases of one step (the debug mode launches one phase a launch): the same code on the same
// data, so the same bits as the fused launch.
//
// The grid barrier (GridBar below: an arrival counter and a leaving counter in `bar`, u32[2],
// zero between launches) deadlocks unless every block is resident: the runtime refuses a
// cooperative grid the occupancy API says cannot be co-resident. Data another block wrote is
// read at L2 (ld.global.cg), never through a possibly stale L1 line.
//
// Row layout of a step (every block computes it, the same, in shared memory): sequence s has
// prompt tokens ids[cu_seqlens[s] .. cu_seqlens[s+1]) from position pos[cu_seqlens[s]]; a step
// takes up to `chunk` of its unconsumed prompt tokens, or, once the prompt is consumed, the
// token the previous step picked; a sequence that has produced max_new tokens takes none. A
// step's rows are capped at MEGA_MAX_ROWS (the rest wait a step: a row's bits do not depend on
// its step). The loop ends when no sequence takes a row, or after max_steps.
#include "gemv.cuh"

#define MEGA_THREADS (32 * GEMV_WARPS)
#define MEGA_MAX_ROWS 64
#define MEGA_MAX_SEQS 32
#define MEGA_MAX_G 8
#define MEGA_MAX_HD 128
// pointers table: per layer ln1, qkv_w, o_w, ln2, gate_up_w, down_w (and q_norm, k_norm with
// qk_norm), then the GLOBALS: embed, final_norm, lm_head
#define PER_LAYER 6
#define PER_LAYER_QK 8
#define GLOBALS 3
static_assert(MEGA_THREADS == 256, "the attention and argmax phases are laid out for 8 warps");
static_assert((MEGA_MAX_G * MEGA_MAX_HD) % MEGA_THREADS == 0, "attention's (head, dim) pairs a thread");

// Phases: embed, then per layer qkv, (qk: the q/k norms, with qk_norm), attention, o, mlp,
// down; then lm_head and pick.
enum { PH_EMBED = 0, PH_LAYER = 1, PH_PER_LAYER = 5 };

// ---- the profile build (-DMEGA_PROFILE; bench/mega_prof.py) ---------------------------------
// Thread 0 of each block splits its time, in SM cycles, into buckets per kind of phase: the wait
// (from the end of its previous phase to the grid barrier passed: barrier latency, skew, and
// blocks without work) and the busy time (from the barrier passed to the phase's end); the
// arrivals (the fence and the add) in one bucket of their own. At exit each block writes its
// buckets to mega_prof [block][kind][wait, busy]; block 0 adds the globaltimer (ns) and clock64
// at its start and exit (their ratio turns cycles into time) and the steps run. Outside the
// profile build all of it compiles to nothing.
enum { PK_EMBED, PK_QKV, PK_QK, PK_ATTN, PK_O, PK_MLP, PK_DOWN, PK_LM, PK_PICK, PK_ARRIVE, PK_PLAN, PK_KINDS };
#ifdef MEGA_PROFILE
#define PROF_BLOCKS 256
__device__ unsigned long long mega_prof[PROF_BLOCKS * PK_KINDS * 2 + 8];
__device__ __forceinline__ unsigned long long gtimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}
struct Prof {
    unsigned long long (*acc)[2];  // [PK_KINDS][2] in shared memory
    long long mark, waited;
    __device__ void start(unsigned long long (*a)[2]) {
        acc = a;
        mark = waited = 0;
        if (threadIdx.x < 2 * PK_KINDS) acc[threadIdx.x >> 1][threadIdx.x & 1] = 0;
        if (threadIdx.x == 0) mark = clock64();
        __syncthreads();
    }
    __device__ void passed() {  // thread 0, its barrier wait just passed
        waited = clock64();
    }
    __device__ void end(int kind) {  // thread 0's phase of `kind` ends now
        if (threadIdx.x != 0) return;
        const long long now = clock64(), w = waited > mark ? waited - mark : 0;
        acc[kind][0] += w;
        acc[kind][1] += now - mark - w;
        mark = now;
    }
    __device__ void flush(int steps, unsigned long long g0, unsigned long long c0) {
        if (threadIdx.x != 0 || blockIdx.x >= PROF_BLOCKS) return;
        for (int k = 0; k < PK_KINDS; ++k) {
            mega_prof[(blockIdx.x * PK_KINDS + k) * 2] = acc[k][0];
            mega_prof[(blockIdx.x * PK_KINDS + k) * 2 + 1] = acc[k][1];
        }
        if (blockIdx.x == 0) {
            unsigned long long *t = mega_prof + PROF_BLOCKS * PK_KINDS * 2;
            t[0] = g0;
            t[1] = c0;
            t[2] = gtimer();
            t[3] = clock64();
            t[4] = steps;
            t[5] = gridDim.x;
        }
    }
};
#else
struct Prof {
    __device__ void start(unsigned long long (*)[2]) {}
    __device__ void passed() {}
    __device__ void end(int) {}
};
#endif

// ---- the grid barrier ---------------------------------------------------------------------
// ctr[0] counts arrivals, ctr[1] blocks that have left; both are zero between launches. Barrier
// n (n = 1, 2, ...) is passed when ctr[0] reaches n * gridDim.x: a block arrives (a release
// add, after the block's writes) at the end of a phase, and waits (thread 0 spins with acquire
// loads) at the start of the next one only once it has issued what does not depend on the
// other blocks: its first weight loads. The last block to leave resets both words. Arrive and
// wait are CUTLASS's pattern (fence.acq_rel + relaxed red; ld.acquire), each block passing the
// same barriers in the same order.
__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
struct GridBar {
    unsigned *ctr;
    unsigned round;  // barriers this block has arrived at
    bool pending;    // arrived at, not yet waited for
    Prof prof;
    __device__ void arrive() {
        __syncthreads();
        if (threadIdx.x == 0)
            asm volatile("fence.acq_rel.gpu;\n\tred.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(ctr) : "memory");
        ++round;
        pending = true;
        prof.end(PK_ARRIVE);
    }
    __device__ void wait() {
        if (!pending) return;
        pending = false;
        if (threadIdx.x == 0) {
            const unsigned target = round * gridDim.x;
            while ((int)(ld_acquire(ctr) - target) < 0) {
            }  // a pure spin: a __nanosleep quantum, or relaxed polls and one fence after, cost more
            prof.passed();
        }
        __syncthreads();
    }
    __device__ void leave() {
        wait();
        if (threadIdx.x == 0) {
            unsigned old;
            asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(old) : "l"(ctr + 1) : "memory");
            if (old == gridDim.x - 1) {  // every block is past its last wait: nobody reads ctr[0] again
                asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(ctr) : "memory");
                asm volatile("st.relaxed.gpu.global.u32 [%0], 0;" ::"l"(ctr + 1) : "memory");
            }
        }
    }
};

// ---- the step's rows ----------------------------------------------------------------------
struct Layout {
    int n_rows, n_lm;
    int id[MEGA_MAX_ROWS], pos[MEGA_MAX_ROWS];
    int cu[MEGA_MAX_SEQS + 1];
    int lm_row[MEGA_MAX_SEQS], lm_seq[MEGA_MAX_SEQS];
    // per sequence, across steps
    int consumed[MEGA_MAX_SEQS], fed[MEGA_MAX_SEQS], next_pos[MEGA_MAX_SEQS], n_gen[MEGA_MAX_SEQS];
};

__device__ void plan_step(Layout &L, const int *ids, const int *pos, const int *cu_in, int n_seqs, int chunk,
                          int max_new) {
    if (threadIdx.x == 0) {
        int r = 0;
        L.n_lm = 0;
        for (int s = 0; s < n_seqs; ++s) {
            L.cu[s] = r;
            const int p0 = cu_in[s], plen = cu_in[s + 1] - p0;
            if (L.n_gen[s] >= max_new || plen < 1) continue;
            if (L.consumed[s] < plen) {
                const int k = min(min(chunk, plen - L.consumed[s]), MEGA_MAX_ROWS - r);
                for (int i = 0; i < k; ++i, ++r) {
                    L.id[r] = ids[p0 + L.consumed[s] + i];
                    L.pos[r] = pos[p0] + L.consumed[s] + i;
                }
                L.consumed[s] += k;
                if (k > 0 && L.consumed[s] == plen) {
                    L.lm_row[L.n_lm] = r - 1;
                    L.lm_seq[L.n_lm++] = s;
                }
            } else if (r < MEGA_MAX_ROWS) {
                L.id[r] = L.fed[s];
                L.pos[r] = L.next_pos[s];
                L.lm_row[L.n_lm] = r;
                L.lm_seq[L.n_lm++] = s;
                ++r;
            }
            if (r > L.cu[s]) L.next_pos[s] = L.pos[r - 1] + 1;
        }
        L.cu[n_seqs] = r;
        L.n_rows = r;
    }
    __syncthreads();
}

// ---- a projection: its weights, output width, K and tiles (of 16 outputs, or 8 SwiGLU pairs)
struct Proj {
    const bf16 *W;
    int N, K, n_tiles;
};
// Passes of at most 16 rows (MEGA_NT row tiles): 32 would spill registers (the rows past 16,
// prompt chunks, re-read the tile's weights). A warp stages MEGA_NT x 8 rows of a unit.
#define MEGA_NT 2
#define MEGA_STAGE (MEGA_NT * 8 * GEMV_XLD * 2)
// MegaSmem's bytes: the staged rows, the partial sums, the sums of squares (the launch gives
// this much dynamic shared memory)
#define MEGA_SMEM_BYTES (GEMV_WARPS * (MEGA_STAGE + MEGA_NT * 4 * 32 * 4) + GEMV_WARPS * 8 * GEMV_MAX_NT * 4)

// ---- projections: gemv.cuh's tile loop, one tile at a time ----------------------------------
// gemv_tile with the tile given (not blockIdx.x) and the grid barrier where the per-op kernels
// wait for the previous kernel: the same loads, mma order and reduction, so the same bits as
// the per-op kernels. A warp keeps MEGA_NT tiles of 8 staged rows (a later tile of the phase
// reuses them) and the partial sums apart from them.
struct MegaStage {
    static constexpr bool SHARED = false;
    char *tiles;
    float *red_base;
    __device__ bf16 *stage(int warp, int nt) const {
        return reinterpret_cast<bf16 *>(tiles + warp * MEGA_STAGE) + nt * 8 * GEMV_XLD;
    }
    __device__ float *red(int w) const { return red_base + w * MEGA_NT * 4 * 32; }
};
// The residual add reads x, which another block of the grid wrote in the phase before: its
// pointer is taken after the wait (the same arithmetic as gemv.cuh's YAddRes, so the same bits).
// The other outputs only write, or read weights and the block's own shared memory.
__device__ __forceinline__ YAddRes y_after(const YAddRes &y) { return {after_wait(y.res)}; }

// rmsnorm(res[rows[j]]) * w: XNorm over a gathered subset of rows (the LM head's last rows).
struct XNormRows {
    static constexpr bool NORM = true;
    XNorm base;
    const int *rows;
    float eps;
    __device__ XNormRows after() const { return {base.after(), rows, eps}; }
    __device__ uint4 weight(int k) const { return base.weight(k); }
    __device__ uint4 fetch(int row, int k, int K) const { return ld_act(base.res + (size_t)rows[row] * K + k); }
    __device__ uint4 form(const uint4 &v, const uint4 &nw, bool ok, float &ss) const {
        return base.form(v, nw, ok, ss);
    }
};

// ---- attention: a block per (row, kv head, split of the context) ----------------------------
// Row r attends to positions 0..pos[r] of its sequence, cut into n_used splits of att_split()
// tokens (a function of the row's own context only, so a row's bits do not depend on the other
// rows or on its step): at most ATT_MAX_SPLITS splits, each taken in tiles of ATT_TILE tokens.
// Per tile the block copies the tile's K and V rows into shared memory (cp.async, every copy in
// flight at once), computes the scores with a thread per (query head, token), takes the tile's
// softmax with a warp per head (log2 units, running max and sum), and adds P.V with a thread per
// (query head, dim). One split: the block writes o. Several: each writes its partial (o, max,
// sum) and counts itself in sem[r, kv head]; the last to arrive merges the splits in order
// z = 0, 1, ... (the same bits whichever block is last) and resets the counter to zero.
#define ATT_TILE 64
#define ATT_MAX_SPLITS 16

__device__ __forceinline__ int att_split(int ctx) {  // tiles of ATT_TILE: 16-token splits were slower
    const int s = (ctx + ATT_MAX_SPLITS - 1) / ATT_MAX_SPLITS;
    return max(ATT_TILE, (s + ATT_TILE - 1) / ATT_TILE * ATT_TILE);
}

struct AttnSmem {
    __align__(16) bf16 k[ATT_TILE][MEGA_MAX_HD + 8];
    __align__(16) bf16 v[ATT_TILE][MEGA_MAX_HD];
    float q[MEGA_MAX_G][MEGA_MAX_HD];
    float p[MEGA_MAX_G][ATT_TILE];
    float m[MEGA_MAX_G], l[MEGA_MAX_G], corr[MEGA_MAX_G];
    int last;
};

struct AttnArgs {
    const bf16 *qkv;
    const char *kv_state;
    const int *page_table;
    float *part_o, *part_ml;
    int *sem;
    bf16 *attn;
    int pages_per_seq, n_seqs, layer, n_layers, n_q_heads, n_kv_heads, page_tokens;
};

#define ATT_PAIRS ((MEGA_MAX_G * MEGA_MAX_HD) / MEGA_THREADS)  // (head, dim) pairs a thread, at most

template <int HD>
__device__ void attend(const AttnArgs &a, const Layout &Lo, int r, int kh, int z, AttnSmem &sm) {
    constexpr int CH = HD / 8;  // 16-byte chunks a row
    const int G = a.n_q_heads / a.n_kv_heads, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int qkv_dim = (a.n_q_heads + 2 * a.n_kv_heads) * HD, q_dim = a.n_q_heads * HD;
    const int ctx = Lo.pos[r] + 1, split = att_split(ctx), n_used = (ctx + split - 1) / split;
    if (z >= n_used) return;
    const int s = seq_of_row(Lo.cu, a.n_seqs, r), t0 = z * split, t1 = min(ctx, t0 + split);
    const float scale = LOG2E / sqrtf((float)HD);
    // A tile's K and V rows into shared memory (cp.async, in flight together).
    auto copy_tile = [&](int tb, int n) {
        for (int c = tid; c < n * CH; c += blockDim.x) {
            const int t = c / CH, off = (c - t * CH) * 8, tok = tb + t;
            const int phys = a.page_table[(size_t)s * a.pages_per_seq + tok / a.page_tokens];
            const size_t kb = kv_offset(phys, a.layer, 0, kh, tok % a.page_tokens, a.n_layers, a.n_kv_heads, HD,
                                        a.page_tokens);
            const size_t vb = kv_offset(phys, a.layer, 1, kh, tok % a.page_tokens, a.n_layers, a.n_kv_heads, HD,
                                        a.page_tokens);
            cp_async16(&sm.k[t][off], a.kv_state + kb + off * 2);
            cp_async16(&sm.v[t][off], a.kv_state + vb + off * 2);
        }
        cp_async_commit();
    };
    const bf16 *qkv = after_wait(a.qkv);  // read after the phase's wait (gemv_tile says why)
    for (int i = tid; i < G * HD; i += blockDim.x)
        sm.q[i / HD][i % HD] = to_f(__ldcg(qkv + (size_t)r * qkv_dim + (kh * G) * HD + i)) * scale;
    if (tid < G) {
        sm.m[tid] = -INFINITY;
        sm.l[tid] = 0.f;
    }
    float acc[ATT_PAIRS];
#pragma unroll
    for (int j = 0; j < ATT_PAIRS; ++j) acc[j] = 0.f;
    for (int tb = t0; tb < t1; tb += ATT_TILE) {
        const int n = min(ATT_TILE, t1 - tb);
        copy_tile(tb, n);
        cp_async_wait<0>();
        __syncthreads();
        for (int i = tid; i < G * n; i += blockDim.x) {  // scores: a thread per (head, token)
            const int g = i / n, t = i - g * n;
            float d = 0.f;
#pragma unroll
            for (int e = 0; e < HD; e += 8) {
                float kf[8];
                unpack8(*reinterpret_cast<const uint4 *>(&sm.k[t][e]), kf);
#pragma unroll
                for (int u = 0; u < 8; ++u) d += sm.q[g][e + u] * kf[u];
            }
            sm.p[g][t] = d;
        }
        __syncthreads();
        if (warp < G) {  // the tile's softmax of head `warp`
            float mx = -INFINITY;
            for (int t = lane; t < n; t += 32) mx = fmaxf(mx, sm.p[warp][t]);
            mx = warp_max(mx);
            const float m_old = sm.m[warp], m_new = fmaxf(m_old, mx);
            float sum = 0.f;
            for (int t = lane; t < n; t += 32) {
                const float e = exp2f(sm.p[warp][t] - m_new);
                sm.p[warp][t] = e;
                sum += e;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                const float c = exp2f(m_old - m_new);  // 0 on the first tile (m_old = -inf)
                sm.corr[warp] = c;
                sm.l[warp] = sm.l[warp] * c + sum;
                sm.m[warp] = m_new;
            }
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < ATT_PAIRS; ++j) {  // P.V: a thread per (head, dim)
            const int i = tid + j * MEGA_THREADS, g = i / HD, d = i - g * HD;
            if (g < G) {
                float o = acc[j] * sm.corr[g];
                for (int t = 0; t < n; ++t) o += sm.p[g][t] * to_f(sm.v[t][d]);
                acc[j] = o;
            }
        }
        __syncthreads();  // the next tile overwrites k, v and p
    }
    const size_t head0 = (size_t)r * a.n_q_heads + kh * G;
    if (n_used == 1) {
#pragma unroll
        for (int j = 0; j < ATT_PAIRS; ++j) {
            const int i = tid + j * MEGA_THREADS, g = i / HD, d = i - g * HD;
            if (g < G) a.attn[(size_t)r * q_dim + (kh * G + g) * HD + d] = to_bf(acc[j] / sm.l[g]);
        }
        __syncthreads();  // the next item rewrites m and l
        return;
    }
#pragma unroll
    for (int j = 0; j < ATT_PAIRS; ++j) {
        const int i = tid + j * MEGA_THREADS, g = i / HD, d = i - g * HD;
        if (g < G) a.part_o[((head0 + g) * ATT_MAX_SPLITS + z) * HD + d] = acc[j];
    }
    if (tid < G) {
        a.part_ml[((head0 + tid) * ATT_MAX_SPLITS + z) * 2] = sm.m[tid];
        a.part_ml[((head0 + tid) * ATT_MAX_SPLITS + z) * 2 + 1] = sm.l[tid];
    }
    __syncthreads();
    if (tid == 0) {  // one acq_rel add: it releases the block's partial, and the last one acquires the others'
        int old;
        asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;"
                     : "=r"(old) : "l"(a.sem + r * a.n_kv_heads + kh) : "memory");
        sm.last = old == n_used - 1;
        if (sm.last) a.sem[r * a.n_kv_heads + kh] = 0;  // zero again for the next layer and launch
    }
    __syncthreads();
    if (!sm.last) return;
    const float *part_ml = after_wait(a.part_ml), *part_o = after_wait(a.part_o);
    for (int i = tid; i < G * HD; i += blockDim.x) {  // the last block merges z = 0, 1, ... in order
        const int g = i / HD, d = i - g * HD;
        const float *ml = part_ml + (head0 + g) * ATT_MAX_SPLITS * 2;
        float M = -INFINITY;
        for (int zz = 0; zz < n_used; ++zz) M = fmaxf(M, __ldcg(ml + zz * 2));
        float L = 0.f, O = 0.f;
        for (int zz = 0; zz < n_used; ++zz) {
            const float f = exp2f(__ldcg(ml + zz * 2) - M);
            L += __ldcg(ml + zz * 2 + 1) * f;
            O += __ldcg(part_o + ((head0 + g) * ATT_MAX_SPLITS + zz) * HD + d) * f;
        }
        a.attn[(size_t)r * q_dim + (kh * G + g) * HD + d] = to_bf(O / L);
    }
    __syncthreads();
}

// The block's working memory, in dynamic shared memory: a projection's staged x rows (a warp's
// own, kept across the phase's tiles), the warps' partial sums and sums of squares; or
// attention's tiles.
union MegaSmem {
    struct {
        __align__(16) char tiles[GEMV_WARPS * MEGA_STAGE];
        float red[GEMV_WARPS][MEGA_NT * 4 * 32];
        float ssr[GEMV_WARPS * 8 * GEMV_MAX_NT];
    } g;
    AttnSmem a;
};
static_assert(sizeof(MegaSmem) <= MEGA_SMEM_BYTES, "mega.cu's MEGA_SMEM_BYTES (and the manifest's) hold it");

// y over `rows` rows, the grid's blocks taking tiles tile = blockIdx.x, + gridDim.x, ...
// The first pass waits for the barrier after its first weight loads; a block without tiles
// waits at the end. Passes of at most 16 rows (MEGA_NT row tiles): 32 would spill registers
// (the rows past 16, prompt chunks, re-read the tile's weights, from L2).
// A normed x is staged once a phase where every warp holds at most one unit of K and the rows
// take one pass (a decode step of up to 16 rows): the later tiles reuse what the warp staged.
template <class X, class Y>
__device__ void mega_gemv(const X &xs, const Proj &p, const Y &ys, int rows, MegaSmem &sm, GridBar &gb) {
    const bool keep = X::NORM && rows <= 8 * MEGA_NT && p.K <= GEMV_WARPS * GEMV_UNIT;
    const MegaStage mem{sm.g.tiles, &sm.g.red[0][0]};
    float *ss = sm.g.ssr;
    const auto wait = [&] { gb.wait(); };
    for (int tile = blockIdx.x; tile < p.n_tiles; tile += gridDim.x) {
        const bool staged = keep && tile != blockIdx.x;
        for (int r0 = 0; r0 < rows; r0 += 8 * MEGA_NT) {
            const int R = min(8 * MEGA_NT, rows - r0);
            if (R <= 8) gemv_tile<1>(xs, p.W, ys, tile, r0, R, p.N, p.K, mem, ss, staged, wait);
            else gemv_tile<2>(xs, p.W, ys, tile, r0, R, p.N, p.K, mem, ss, staged, wait);
        }
    }
    gb.wait();
}

// ---- Qwen3's q/k norms: a warp per (row, head) ---------------------------------------------
// rope.cu's qk_norm_rope_append for one head: per-head RMSNorm (bf16(w * bf16(x / rms)), as
// transformers), rope, stored back in place; a k head's rotated row and the matching v row also
// go to the paged KV state. Lane l holds the rope pairs (i, i + head_dim/2), i = l + 32 j.
template <int HD>
__device__ void qk_norm_head(bf16 *qkv, int r, int h, const bf16 *qw, const bf16 *kw, const Layout &Lo,
                             const float *table, const KvAppend &app, int n_q_heads, int n_kv_heads, float eps) {
    constexpr int HALF = HD / 2, J = HALF / 32;
    const int lane = threadIdx.x & 31, qkv_dim = (n_q_heads + 2 * n_kv_heads) * HD, p = Lo.pos[r];
    bf16 *x = qkv + (size_t)r * qkv_dim + (size_t)h * HD;
    float x0[J], x1[J], ss = 0.f;
#pragma unroll
    for (int j = 0; j < J; ++j) {
        x0[j] = to_f(__ldcg(x + lane + 32 * j));
        x1[j] = to_f(__ldcg(x + lane + 32 * j + HALF));
        ss += x0[j] * x0[j] + x1[j] * x1[j];
    }
    const float rs = 1.f / sqrtf(warp_sum(ss) / (float)HD + eps);
    const bf16 *w = h < n_q_heads ? qw : kw;
    bf16 *dk = nullptr, *dv = nullptr;
    const bf16 *vr = nullptr;
    if (h >= n_q_heads) {
        const int kh = h - n_q_heads;
        dk = app.dst(r, 0, kh, p, n_kv_heads, HD);
        dv = app.dst(r, 1, kh, p, n_kv_heads, HD);
        vr = qkv + (size_t)r * qkv_dim + (size_t)(n_q_heads + n_kv_heads + kh) * HD;
    }
#pragma unroll
    for (int j = 0; j < J; ++j) {
        const int i = lane + 32 * j;
        float a = rbf(to_f(w[i]) * rbf(x0[j] * rs)), b = rbf(to_f(w[i + HALF]) * rbf(x1[j] * rs));
        rotate(a, b, table, p, i, HD);
        x[i] = to_bf(a);
        x[i + HALF] = to_bf(b);
        if (dk) {
            dk[i] = to_bf(a);
            dk[i + HALF] = to_bf(b);
            dv[i] = __ldcg(vr + i);
            dv[i + HALF] = __ldcg(vr + i + HALF);
        }
    }
}


extern "C" __global__ void __launch_bounds__(MEGA_THREADS, 1)
mega_decode(const unsigned long long *__restrict__ wt, char *__restrict__ kv_state,
            const int *__restrict__ page_table, const int *__restrict__ ids, const int *__restrict__ pos,
            const int *__restrict__ cu_seqlens, const float *__restrict__ rope, bf16 *__restrict__ x,
            bf16 *__restrict__ qkv, bf16 *__restrict__ attn, bf16 *__restrict__ act, float *__restrict__ part_o,
            float *__restrict__ part_ml, int *sem, float *__restrict__ logits, float *__restrict__ arg_val,
            int *__restrict__ arg_idx, int *__restrict__ tokens, unsigned *bar, int n_seqs, int pages_per_seq,
            int n_layers, int hidden, int inter, int n_q_heads, int n_kv_heads, int head_dim, int page_tokens,
            int vocab, int qk_norm, int chunk, int max_new, int max_steps, int phase_lo, int phase_hi, float eps) {
    __shared__ Layout Lo;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int qkv_dim = (n_q_heads + 2 * n_kv_heads) * head_dim, q_dim = n_q_heads * head_dim;
    const bf16 *const *W = reinterpret_cast<const bf16 *const *>(wt);
    const int per_layer = qk_norm ? PER_LAYER_QK : PER_LAYER, ppl = PH_PER_LAYER + (qk_norm ? 1 : 0);
    const bf16 *embed = W[n_layers * per_layer], *final_norm = W[n_layers * per_layer + 1];
    const int ph_lm = PH_LAYER + ppl * n_layers, ph_pick = ph_lm + 1;
    // The projection of phase ph (W null for the phases without one).
    auto proj = [&](int ph) -> Proj {
        if (ph == ph_lm)
            return {W[n_layers * per_layer + 2], vocab, hidden, (vocab + GEMV_COLS - 1) / GEMV_COLS};
        if (ph < PH_LAYER || ph > ph_lm) return {nullptr, 0, 0, 0};
        const bf16 *const *lw = W + ((ph - PH_LAYER) / ppl) * per_layer;
        const int k = (ph - PH_LAYER) % ppl;
        if (k == 0)  // with q/k norms the projection stores qkv as it is (the qk phase rotates)
            return {lw[1], qkv_dim, hidden, qkv_dim / GEMV_COLS};
        switch (k - (qk_norm ? 1 : 0)) {
            case 2: return {lw[2], hidden, q_dim, (hidden + GEMV_COLS - 1) / GEMV_COLS};
            case 3: return {lw[4], inter, hidden, (inter + GEMV_COLS / 2 - 1) / (GEMV_COLS / 2)};
            case 4: return {lw[5], hidden, inter, (hidden + GEMV_COLS - 1) / GEMV_COLS};
            default: return {nullptr, 0, 0, 0};  // q/k norms, attention
        }
    };
    if (tid < MEGA_MAX_SEQS) {
        Lo.consumed[tid] = 0;
        Lo.n_gen[tid] = 0;
    }
    __syncthreads();
    // Runs phase ph when it is in [phase_lo, phase_hi); then, unless it ends the range, arrives at
    // the grid barrier, which the next phase waits for (a projection after its first weight
    // loads). No L2 prefetch of the next phase's weights (cp.async.bulk.prefetch.L2): the
    // arrivals' fence waited for the prefetches in flight, so dropping it was the largest gain
    // of the megakernel's tuning (docs/perf.md).
    GridBar gb{bar, 0, false};
#ifdef MEGA_PROFILE
    __shared__ unsigned long long prof_acc[PK_KINDS][2];
    const unsigned long long g0 = gtimer(), c0 = clock64();
    int steps_run = 0;
#else
    unsigned long long (*prof_acc)[2] = nullptr;
#endif
    gb.prof.start(prof_acc);
    auto in = [&](int ph) { return ph >= phase_lo && ph < phase_hi; };
    auto done = [&](int ph) {
        if (ph == PH_EMBED) gb.prof.end(PK_EMBED);
        else if (ph == ph_lm) gb.prof.end(PK_LM);
        else {
            const int k = (ph - PH_LAYER) % ppl;  // qkv, (qk), attention, o, mlp, down
            gb.prof.end(k == 0 ? PK_QKV : PK_QK + k - 1 + (qk_norm ? 0 : 1));
        }
        if (ph + 1 < phase_hi) gb.arrive();
    };
    AttnArgs aa{qkv, kv_state, page_table, part_o, part_ml, sem, attn, pages_per_seq, n_seqs, 0, n_layers,
                n_q_heads, n_kv_heads, page_tokens};
    // Dynamic shared memory: MegaSmem (a launch without room for it traps: the manifest gives it).
    extern __shared__ uint4 mega_dyn[];
    unsigned dyn_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn_bytes));
    if (dyn_bytes < MEGA_SMEM_BYTES) __trap();
    MegaSmem &sm = *reinterpret_cast<MegaSmem *>(mega_dyn);

    for (int step = 0; step < max_steps; ++step) {
        plan_step(Lo, ids, pos, cu_seqlens, n_seqs, chunk, max_new);
        gb.prof.end(PK_PLAN);
        const int R = Lo.n_rows;
        if (R == 0) break;
#ifdef MEGA_PROFILE
        ++steps_run;
#endif
        if (in(PH_EMBED)) {
            const int per_row = hidden / 8;
            for (int i = blockIdx.x * blockDim.x + tid; i < R * per_row; i += gridDim.x * blockDim.x) {
                const int r = i / per_row, c = (i - r * per_row) * 8;
                *reinterpret_cast<uint4 *>(x + (size_t)r * hidden + c) =
                    __ldg(reinterpret_cast<const uint4 *>(embed + (size_t)Lo.id[r] * hidden + c));
            }
            done(PH_EMBED);
        }
        for (int layer = 0; layer < n_layers; ++layer) {
            const bf16 *const *lw = W + layer * per_layer;
            const KvAppend app{nullptr, kv_state, page_table, Lo.cu, pages_per_seq, n_seqs, layer, n_layers,
                               page_tokens};
            int ph = PH_LAYER + ppl * layer;
            if (in(ph)) {  // qkv; without q/k norms rope and the KV append in its epilogue
                if (qk_norm) {
                    mega_gemv(XNorm{x, lw[0], eps}, proj(ph), YBf16{qkv}, R, sm, gb);
                } else {
                    YRopeAppend y{qkv, Lo.pos, rope, app, n_q_heads, n_kv_heads, head_dim};
                    mega_gemv(XNorm{x, lw[0], eps}, proj(ph), y, R, sm, gb);
                }
                done(ph);
            }
            if (qk_norm && in(++ph)) {  // q/k norms, rope, KV append: a warp per (row, head)
                gb.wait();
                const int heads = n_q_heads + n_kv_heads;
                for (int item = blockIdx.x * GEMV_WARPS + warp; item < R * heads; item += gridDim.x * GEMV_WARPS) {
                    const int r = item / heads, h = item - r * heads;
                    bf16 *q = after_wait(qkv);
                    if (head_dim == 64)
                        qk_norm_head<64>(q, r, h, lw[6], lw[7], Lo, rope, app, n_q_heads, n_kv_heads, eps);
                    else
                        qk_norm_head<128>(q, r, h, lw[6], lw[7], Lo, rope, app, n_q_heads, n_kv_heads, eps);
                }
                done(ph);
            }
            if (in(ph + 1)) {  // attention, its context splits merged in the phase
                gb.wait();
                aa.layer = layer;
                const int per_split = R * n_kv_heads;
                for (int item = blockIdx.x; item < ATT_MAX_SPLITS * per_split; item += gridDim.x) {
                    const int z = item / per_split, rk = item - z * per_split, r = rk / n_kv_heads;
                    if (head_dim == 64) attend<64>(aa, Lo, r, rk - r * n_kv_heads, z, sm.a);
                    else attend<128>(aa, Lo, r, rk - r * n_kv_heads, z, sm.a);
                }
                done(ph + 1);
            }
            if (in(ph + 2)) {  // o projection into the residual stream
                mega_gemv(XPlain{attn}, proj(ph + 2), YAddRes{x}, R, sm, gb);
                done(ph + 2);
            }
            if (in(ph + 3)) {  // norm, gate/up, SwiGLU
                mega_gemv(XNorm{x, lw[3], eps}, proj(ph + 3), YSwiGLU{act}, R, sm, gb);
                done(ph + 3);
            }
            if (in(ph + 4)) {  // down projection into the residual stream
                mega_gemv(XPlain{act}, proj(ph + 4), YAddRes{x}, R, sm, gb);
                done(ph + 4);
            }
        }
        const int n_lm = Lo.n_lm;
        if (in(ph_lm)) {  // final norm and LM head of each sequence's last row, then this block's argmax
            const Proj lm = proj(ph_lm);
            mega_gemv(XNormRows{XNorm{x, final_norm, eps}, Lo.lm_row, eps}, lm, YF32{logits}, n_lm, sm, gb);
            const int mine = (lm.n_tiles - blockIdx.x + gridDim.x - 1) / gridDim.x * GEMV_COLS;  // my columns
            const float *lg = after_wait(logits);
            for (int j = warp; j < n_lm; j += GEMV_WARPS) {
                float v = -INFINITY;
                int i = INT_MAX;
                for (int c = lane; c < mine; c += 32) {  // the block's own logits: it wrote them
                    const int col = (blockIdx.x + (c / GEMV_COLS) * gridDim.x) * GEMV_COLS + c % GEMV_COLS;
                    if (col < vocab) better(v, i, __ldcg(lg + (size_t)j * vocab + col), col);
                }
                warp_best(v, i);
                if (lane == 0) {
                    arg_val[j * gridDim.x + blockIdx.x] = v;
                    arg_idx[j * gridDim.x + blockIdx.x] = i;
                }
            }
            done(ph_lm);
        }
        if (in(ph_pick)) {  // every block picks every row's token from the blocks' maxima (no barrier)
            gb.wait();
            const float *av = after_wait(arg_val);
            const int *ai = after_wait(arg_idx);
            for (int j = warp; j < n_lm; j += GEMV_WARPS) {
                float v = -INFINITY;
                int i = INT_MAX;
                for (int b = lane; b < gridDim.x; b += 32)
                    better(v, i, __ldcg(av + j * gridDim.x + b), __ldcg(ai + j * gridDim.x + b));
                warp_best(v, i);
                if (lane == 0) {
                    const int s = Lo.lm_seq[j], tok = i == INT_MAX ? -1 : i;
                    Lo.fed[s] = tok < 0 ? 0 : tok;  // a row of only NaN: -1 out, token 0 fed back
                    if (blockIdx.x == 0) tokens[s * max_new + Lo.n_gen[s]] = tok;
                    Lo.n_gen[s] += 1;
                }
            }
        }
        __syncthreads();
        gb.prof.end(PK_PICK);
    }
    gb.leave();
#ifdef MEGA_PROFILE
    gb.prof.flush(steps_run, g0, c0);
#endif
}
