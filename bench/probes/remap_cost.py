"""What one pool remap costs the host on a GPU: a chunk unmapped from one state's virtual range
and mapped into another's (kern.runtime.devices.cuda.vmm, as a hybrid model's slots grow out of
its pages), at a device-sized budget's chunk size and count. Prints a JSON line: milliseconds
a remap (unmap + map + set access), median and max of --repeats, with the device idle and
with a stream of kernels in flight (a copy loop).

    python3 -m bench.probes.remap_cost [--chunk-mib 54] [--chunks 256] [--repeats 20]
"""
import argparse
import json
import statistics
import time

from kern.runtime.devices.cuda import memory
from kern.runtime.devices.cuda.driver import call, open_device
from kern.runtime.devices.cuda.vmm import PhysicalChunks, VirtualPool


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunk-mib", type=int, default=54)
    ap.add_argument("--chunks", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=20)
    a = ap.parse_args()
    dev = open_device()
    chunks = PhysicalChunks(dev, a.chunk_mib << 20, a.chunks)
    pages = VirtualPool(dev, a.chunks, chunks)  # the paged state's range: every chunk mapped
    slots = VirtualPool(dev, a.chunks, chunks)  # the per-sequence state's: none yet
    t0 = time.perf_counter()
    pages.apply(map=[(c, c) for c in range(a.chunks)])
    first = (time.perf_counter() - t0) * 1e3

    def moves(busy) -> list[float]:
        out = []
        for i in range(a.repeats):
            c = a.chunks - 1 - i
            if busy:
                busy()
            t = time.perf_counter()
            pages.apply(unmap=[c])
            slots.apply(map=[(c, i)])
            out.append((time.perf_counter() - t) * 1e3)
        for i in range(a.repeats):  # back, for the next pass
            slots.apply(unmap=[i])
            pages.apply(map=[(a.chunks - 1 - i, a.chunks - 1 - i)])
        return out

    idle = moves(None)
    src, dst = memory.alloc(1 << 30, "probe"), memory.alloc(1 << 30, "probe")
    stream = call("cuStreamCreate", 0)

    def busy():  # ~50 ms of copies queued ahead of the remap
        for _ in range(20):
            call("cuMemcpyDtoDAsync", dst.ptr, src.ptr, 1 << 30, stream)

    loaded = moves(busy)
    call("cuStreamSynchronize", stream)
    print(json.dumps({"chunk_mib": a.chunk_mib, "chunks": a.chunks, "map_all_ms": round(first, 2),
                      "remap_idle_ms": {"p50": round(statistics.median(idle), 3), "max": round(max(idle), 3)},
                      "remap_busy_ms": {"p50": round(statistics.median(loaded), 3), "max": round(max(loaded), 3)}}))


if __name__ == "__main__":
    main()
