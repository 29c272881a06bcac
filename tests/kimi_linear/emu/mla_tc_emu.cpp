// mla_tc.cu compiled for the host (g++, the stand-in common.cuh beside this file, the real
// attention_tc.cuh): each block of a launch in turn, its threads as std::threads. The test
// (test_mla_tc_emulated.py) copies mla_tc.cu and attention_tc.cuh beside common.cuh first, so
// the shared header's #include "common.cuh" finds the stand-in. What common.cuh's stand-in
// lacks for them is here: cp.async (copied at once: a stage is read only after the barrier the
// kernel waits at), ldmatrix (x4 and its transpose, through a per-warp table of the lanes'
// row addresses, the PTX fragment layouts), the f32 atomics' int cousins, fences and loads.
// mla_attend_x_wg's wgmma, mbarriers and setmaxnreg come from the stand-ins wgmma.cuh and
// mla_wg.cuh beside common.cuh. C entry points for ctypes: emu_mla_attend_tc,
// emu_mla_attend_tc_decode, emu_mla_absorb_tc, emu_mla_expand_tc, emu_mla_keys, emu_mla_gather,
// emu_mla_attend_x, emu_mla_attend_x_wg (the kernels' arguments), emu_block_order.
#include "common.cuh"

#define __align__(n) __attribute__((aligned(n)))
#define LOG2E 1.4426950408889634f
Dim3 gridDim;

struct float2 {
    float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float __ldcg(const float *p) { return *p; }
inline float2 __ldcg(const float2 *p) { return *p; }
inline void __threadfence() {}
inline int atomicAdd(int *p, int v) {
    const int old = *p;
    *p += v;
    return old;
}
inline int atomicExch(int *p, int v) {
    const int old = *p;
    *p = v;
    return old;
}

inline int warp_max(int v) {  // through the warp's exchange buffer, as the shuffles
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    emu->a[w][l][0] = (unsigned)v;
    __syncwarp();
    int m = (int)emu->a[w][0][0];
    for (int i = 1; i < 32; ++i) m = std::max(m, (int)emu->a[w][i][0]);
    __syncwarp();
    return m;
}

inline int seq_of_row(const int *cu_seqlens, int n_seqs, int r) {
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (cu_seqlens[mid] <= r) lo = mid; else hi = mid - 1;
    }
    return lo;
}

inline void cp_async16_zfill(void *smem, const void *gmem, int src_bytes) {
    std::memset(smem, 0, 16);
    if (src_bytes) std::memcpy(smem, gmem, src_bytes);
}
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}

// ldmatrix .x4: lane 8 j + i gives row i of matrix j; lane l gets matrix j's row l / 4, columns
// 2 (l % 4) and + 1 (transposed: column l / 4 of rows 2 (l % 4) and + 1)
static const bf16 *emu_rows[32][32];
inline void emu_ldsm(unsigned (&r)[4], const bf16 *p, bool trans) {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    emu_rows[w][l] = p;
    __syncwarp();
    for (int j = 0; j < 4; ++j) {
        bf16 lo, hi;
        if (!trans) {
            const bf16 *row = emu_rows[w][8 * j + (l >> 2)];
            lo = row[2 * (l & 3)], hi = row[2 * (l & 3) + 1];
        } else {
            lo = emu_rows[w][8 * j + 2 * (l & 3)][l >> 2], hi = emu_rows[w][8 * j + 2 * (l & 3) + 1][l >> 2];
        }
        r[j] = (unsigned)lo.bits | ((unsigned)hi.bits << 16);
    }
    __syncwarp();
}
inline void ldsm_x4(unsigned (&r)[4], const bf16 *p) { emu_ldsm(r, p, false); }
inline void ldsm_x4_t(unsigned (&r)[4], const bf16 *p) { emu_ldsm(r, p, true); }

#include "mla_tc.cu"
#include "grid.h"

thread_local Dim3 threadIdx;
Dim3 blockIdx, blockDim;
EmuBlock *emu;
// 1024-byte aligned: mla_attend_x_wg's swizzled tiles sit where the hardware's would (wgmma.cuh)
constexpr size_t EMU_SMEM = MLA_TC_SMEM(2) > MLA_XW_SMEM ? MLA_TC_SMEM(2) : MLA_XW_SMEM;
alignas(1024) unsigned char mla_smem[EMU_SMEM];
static const bool emu_shared_set = (emu_shared = mla_smem, true);

extern "C" void emu_mla_attend_tc(const float *q_lat, const uint16_t *q, char *kv, const int *page_table,
                                  const int *cu_seqlens, const int *pos, const int *prompt_len, float *o_lat,
                                  int pages_per_seq, int rows, int n_seqs, int layer, int layers, int heads, int nope,
                                  int rope, int kv_lora, int page_tokens, int token_bytes, int chunk) {
    run_grid(rows, (heads + 31) / 32, 1, 256, mla_smem, sizeof(mla_smem), [&] {
        mla_attend_tc(q_lat, reinterpret_cast<const bf16 *>(q), kv, page_table, cu_seqlens, pos, prompt_len, o_lat,
                      pages_per_seq, rows, n_seqs, layer, layers, heads, nope, rope, kv_lora, page_tokens,
                      token_bytes, chunk);
    });
}

// the expanded form of a prompt's rows: mla_keys, mla_gather, mla_attend_x
static_assert(MLA_X_SMEM <= sizeof(mla_smem), "the emulator's shared memory holds mla_attend_x's");

extern "C" void emu_mla_keys(const int *cu_seqlens, const int *pos, const int *prompt_len, int *koff, int n_seqs) {
    run_grid(1, 1, 1, MLA_X_KEYS_THREADS, mla_smem, sizeof(mla_smem),
             [&] { mla_keys(cu_seqlens, pos, prompt_len, koff, n_seqs); });
}

extern "C" void emu_mla_gather(const char *kv, const int *page_table, const int *koff, uint16_t *lat, int pages_per_seq,
                               int n_seqs, int keys, int layer, int layers, int kv_lora, int rope, int page_tokens,
                               int token_bytes) {
    run_grid(keys, 1, 1, 64, mla_smem, sizeof(mla_smem), [&] {
        mla_gather(kv, page_table, koff, reinterpret_cast<bf16 *>(lat), pages_per_seq, n_seqs, keys, layer, layers,
                   kv_lora, rope, page_tokens, token_bytes);
    });
}

extern "C" void emu_mla_attend_x(const uint16_t *q, const char *kv, const int *page_table, const int *cu_seqlens,
                                 const int *pos, const int *prompt_len, const int *koff, const uint16_t *kx,
                                 uint16_t *o, int pages_per_seq, int rows, int n_seqs, int keys, int layer, int layers,
                                 int heads, int nope, int rope, int kv_lora, int v_dim, int page_tokens,
                                 int token_bytes) {
    run_grid(heads, (rows + MLA_X_BM - 1) / MLA_X_BM + n_seqs, 1, 128, mla_smem, sizeof(mla_smem), [&] {
        mla_attend_x(reinterpret_cast<const bf16 *>(q), kv, page_table, cu_seqlens, pos, prompt_len, koff,
                     reinterpret_cast<const bf16 *>(kx), reinterpret_cast<bf16 *>(o), pages_per_seq, rows, n_seqs,
                     keys, layer, layers, heads, nope, rope, kv_lora, v_dim, page_tokens, token_bytes);
    });
}

// mla_attend_x's wgmma twin: its grid (tiles of MLA_XW_BM rows), MLA_XW_THREADS threads (a block's
// producer and consumer warpgroups at once, meeting at the mbarriers)
extern "C" void emu_mla_attend_x_wg(const uint16_t *q, const char *kv, const int *page_table, const int *cu_seqlens,
                                    const int *pos, const int *prompt_len, const int *koff, const uint16_t *kx,
                                    uint16_t *o, int pages_per_seq, int rows, int n_seqs, int keys, int layer,
                                    int layers, int heads, int nope, int rope, int kv_lora, int v_dim, int page_tokens,
                                    int token_bytes) {
    run_grid(heads, (rows + MLA_XW_BM - 1) / MLA_XW_BM + n_seqs, 1, MLA_XW_THREADS, mla_smem, sizeof(mla_smem), [&] {
        mla_attend_x_wg(reinterpret_cast<const bf16 *>(q), kv, page_table, cu_seqlens, pos, prompt_len, koff,
                        reinterpret_cast<const bf16 *>(kx), reinterpret_cast<bf16 *>(o), pages_per_seq, rows, n_seqs,
                        keys, layer, layers, heads, nope, rope, kv_lora, v_dim, page_tokens, token_bytes);
    });
}

extern "C" void emu_mla_attend_tc_decode(const float *q_lat, const uint16_t *q, char *kv, const int *page_table,
                                         const int *pos, float *o_lat, float *part_o, float *part_ml, int *sem,
                                         int pages_per_seq, int rows, int layer, int layers, int heads, int nope,
                                         int rope, int kv_lora, int page_tokens, int token_bytes, int chunk,
                                         int splits) {
    run_grid(rows, (heads + 15) / 16, splits, 128, mla_smem, sizeof(mla_smem), [&] {
        mla_attend_tc_decode(q_lat, reinterpret_cast<const bf16 *>(q), kv, page_table, pos, o_lat, part_o, part_ml,
                             sem, pages_per_seq, rows, layer, layers, heads, nope, rope, kv_lora, page_tokens,
                             token_bytes, chunk, splits);
    });
}

static int pt_grid(int n) { return (n + MLA_PT_BM - 1) / MLA_PT_BM; }

extern "C" void emu_mla_absorb_tc(const uint16_t *q, const uint16_t *kv_b, float *q_lat, int rows, int heads, int nope,
                                  int rope, int v_dim, int kv_lora) {
    run_grid(pt_grid(rows), heads, (kv_lora + MLA_PT_BN - 1) / MLA_PT_BN, 128, mla_smem, sizeof(mla_smem), [&] {
        mla_absorb_tc(reinterpret_cast<const bf16 *>(q), reinterpret_cast<const bf16 *>(kv_b), q_lat, rows, heads, nope,
                      rope, v_dim, kv_lora);
    });
}

extern "C" void emu_mla_expand_tc(const float *o_lat, const uint16_t *kv_b, uint16_t *o, int rows, int heads, int nope,
                                  int v_dim, int kv_lora) {
    run_grid(pt_grid(rows), heads, (v_dim + MLA_PT_EBN - 1) / MLA_PT_EBN, 128, mla_smem, sizeof(mla_smem), [&] {
        mla_expand_tc(o_lat, reinterpret_cast<const bf16 *>(kv_b), reinterpret_cast<bf16 *>(o), rows, heads, nope, v_dim,
                      kv_lora);
    });
}
