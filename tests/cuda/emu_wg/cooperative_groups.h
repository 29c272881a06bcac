// A host stand-in for the cluster part of <cooperative_groups.h> that gemm_wg.cuh uses (see
// wgmma.cuh here): the cluster's barrier and another block's shared memory at this offset.
#pragma once
namespace cooperative_groups {
struct cluster_group {
    void sync() { emu_block->cluster->bar->arrive_and_wait(); }
    template <class T>
    T *map_shared_rank(T *p, int rank) {
        const char *c = reinterpret_cast<const char *>(p);
        return reinterpret_cast<T *>(emu_block->cluster->blocks[rank]->smem + (c - emu_block->smem));
    }
};
inline cluster_group this_cluster() { return {}; }
}  // namespace cooperative_groups
