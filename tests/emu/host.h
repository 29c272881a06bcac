// What the host stand-ins of CUDA headers share (tests/kimi_linear/emu/common.cuh for the mma.sync
// kernels, tests/cuda/emu_wg/wgmma.cuh for the wgmma ones): the device qualifiers compiled away
// for g++, a launch's coordinates, and bf16 as its bits. Each stand-in declares its own
// threadIdx and blockIdx (a block's threads, or every thread of a cluster, as std::threads).
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

using std::max;
using std::min;

#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__
#define __launch_bounds__(...)
#define __restrict__
#define __cluster_dims__(...)

struct Dim3 {
    unsigned x = 0, y = 0, z = 0;
};

struct bf16 {
    uint16_t bits;
};
