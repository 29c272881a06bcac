// gemm_wg.cuh (models/common/cuda) compiled for the host against the stand-ins here and run on
// CPU threads: y = x W^T through its cp.async or its TMA producer, unsplit (grid z 1) or split (grid z 8, a
// tile's 8 blocks at once, as one cluster), for test_wg_emulated.py. Two Ys: a plain one (f32
// stores) and a paired one (pair q: W rows q and N + q, the two sums stored apart), so both of
// wg_store's layouts are walked.
#include "wgmma.cuh"
#include "gemm_wg_host.cuh"

#include <thread>
#include <vector>

thread_local Dim3 threadIdx, blockIdx;
Dim3 blockDim, gridDim;
thread_local EmuBlock *emu_block;
std::mutex emu_mbar_mu;
std::condition_variable emu_mbar_cv;
std::map<const void *, EmuMbar> emu_mbars;

struct YPlain {
    static constexpr bool PAIRED = false;
    float *y;
    void put(size_t i, float v) const { y[i] = v; }
};
struct YPair {
    static constexpr bool PAIRED = true;
    float *y0, *y1;
    bool wrows(int q8, int qi, int N, int &w0, int &w1) const {
        const int q = 8 * q8 + qi;
        w0 = q, w1 = N + q;
        return q < N;
    }
    void put(int r, int q8, int qi, int N, float a, float b) const {
        const size_t i = (size_t)r * N + 8 * q8 + qi;
        y0[i] = a, y1[i] = b;
    }
};

using Cfg = WgCfg<128, 1, 8>;  // the wide decode's split shape (wg_shapes.cuh's WgSplit)

// tma: x and W through tensor maps (the TMA producer, as gemm.cu's entries), else by address
template <class Y>
static void launch(const bf16 *x, const bf16 *W, const Y &ys, int rows, int N, int K, int split, int tma) {
    const EmuTensorMap xm{reinterpret_cast<const uint16_t *>(x), rows, K, WG_BOX},
        wm{reinterpret_cast<const uint16_t *>(W), Y::PAIRED ? 2 * N : N, K, WG_BOX};
    const int gx = (N + (Y::PAIRED ? Cfg::BN / 2 : Cfg::BN) - 1) / (Y::PAIRED ? Cfg::BN / 2 : Cfg::BN);
    const int gy = (rows + Cfg::BM - 1) / Cfg::BM, gz = split ? WG_PARTS : 1;
    gridDim.x = gx, gridDim.y = gy, gridDim.z = gz;
    blockDim.x = Cfg::THREADS;
    std::vector<float> part((size_t)gx * gy * WG_PARTS * Cfg::PART);
    std::vector<int> sem((size_t)gx * gy, 0);
    const size_t smem_bytes = Cfg::SMEM + 1024;
    for (int id = 0; id < gx * gy; ++id) {  // a tile's blocks (its partials) at once, tiles in turn
        std::barrier<> cbar(gz * Cfg::THREADS);
        EmuCluster cl{&cbar, {}};
        std::vector<EmuBlock> blocks(gz);
        std::vector<std::barrier<> *> bars;
        std::vector<char *> mem;
        for (int z = 0; z < gz; ++z) {
            char *m = static_cast<char *>(std::aligned_alloc(1024, (smem_bytes + 1023) / 1024 * 1024));
            std::memset(m, 0xFF, smem_bytes);  // poisoned: a read of what no thread wrote is NaN
            mem.push_back(m);
            bars.push_back(new std::barrier<>(Cfg::THREADS));
            blocks[z] = EmuBlock{m, bars.back(), &cl, z};
            cl.blocks[z] = &blocks[z];
        }
        std::vector<std::thread> ts;
        for (int z = 0; z < gz; ++z)
            for (int t = 0; t < Cfg::THREADS; ++t)
                ts.emplace_back([&, z, t] {
                    emu_block = &blocks[z];
                    blockIdx.x = id % gx, blockIdx.y = id / gx, blockIdx.z = z;
                    threadIdx.x = t;
                    gemm_wg<Cfg>(x, W, nullptr, ys, rows, N, K, split ? part.data() : nullptr,
                                 split ? sem.data() : nullptr, tma ? &xm : nullptr, tma ? &wm : nullptr);
                });
        for (auto &th : ts) th.join();
        for (auto *b : bars) delete b;
        for (auto *m : mem) std::free(m);
    }
}

extern "C" void wg_plain(const uint16_t *x, const uint16_t *W, float *y, int rows, int N, int K, int split,
                         int tma) {
    launch(reinterpret_cast<const bf16 *>(x), reinterpret_cast<const bf16 *>(W), YPlain{y}, rows, N, K, split, tma);
}
extern "C" void wg_pair(const uint16_t *x, const uint16_t *W, float *y0, float *y1, int rows, int N, int K,
                        int split, int tma) {
    launch(reinterpret_cast<const bf16 *>(x), reinterpret_cast<const bf16 *>(W), YPair{y0, y1}, rows, N, K, split,
           tma);
}
