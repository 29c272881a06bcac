"""A small test harness over the device layer: load the kernels (shipped and test-only), move numpy
arrays, launch and synchronise. Outputs are poisoned (0xFF bytes: NaN in bf16/f32, -1 in i32)
so an unwritten element never passes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kern.runtime.devices.cuda import memory
from kern.runtime.devices.cuda.launch import Kernel, Module, PackedLaunch, launch
from kern.runtime.devices.cuda.memory import DeviceBuffer, Stream
from tests.cuda.cuda_kernel_docs import kinds_by_entry


def _value(e, named: dict) -> int:
    """A launch's grid expression (the manifest's closed set) over an op's named arguments."""
    if isinstance(e, int):
        return e
    if isinstance(e, str):
        return named[e]
    (kind, args), = e.items()
    a, b = (_value(x, named) for x in args)
    return {"ceil_div": -(-a // b), "mul": a * b, "add": a + b}[kind]


def op_launches(gpu, spec: dict, named: dict) -> list:
    """The launches of a manifest op (spec: its JSON, e.g. a family table's ops()[name]) with its
    parameters bound by name in `named`; the llama gemm twins' scratch (xn and rs of rms_prep,
    part and sem of a split variant) is made here and added to `named` when absent."""
    from kern_models.llama.kernels.cuda import table
    params = [p.split(":")[0] for p in spec["params"]]
    if "xn" in params:
        named.setdefault("xn", gpu.empty(named["rows"] * named["K"] * 2))
        named.setdefault("rs", gpu.empty(named["rows"] * 4))
    out = []
    for la in spec["impl"]["launches"]:
        grid = tuple(_value(g, named) for g in la["grid"])
        names = la.get("args") or params
        if "part" in names and "part" not in named:
            tiles = grid[0] * grid[1]
            named["part"] = gpu.empty(tiles * table.GEMM_SPLIT * table.TILES["WG_SPLIT_PART"] * 4)
            named["sem"] = gpu.put(np.zeros(tiles, np.int32))
        tiles = la.get("tiles") or {}
        out.append(gpu.make(la["entry"], grid, tuple(la["block"]),
                            *(gpu.tensor_map(named[n], named["K"], tiles[n]) if n in tiles else named[n]
                              for n in names), shared_mem=_value(la.get("shared_mem", 0), named)))
    return out


def launch_all(launches, stream: Stream) -> None:
    for l in launches:
        launch(l, stream)


class Gpu:
    def __init__(self, device, cubin_dir: Path):
        self.device = device
        self.stream = Stream()
        self.docs = kinds_by_entry()
        self.modules = {p.stem: Module(p.read_bytes(), p.stem) for p in sorted(cubin_dir.glob("*.cubin"))}
        self._kernels: dict[str, Kernel] = {}
        self._bufs: list[DeviceBuffer] = []

    @classmethod
    def of_family(cls, cubins, out: Path) -> "Gpu":
        """A model family's cubins (its kernels/cuda package's CUBINS) provided into `out`, beside
        any already there, and loaded on GPU 0; each entry's parameter kinds read from the
        family's own sources (the default docs are llama's)."""
        from tests.cuda.cuda_kernel_docs import in_sources
        from kern.runtime.devices.cuda.driver import open_device

        cubins.provide(out)
        g = cls(open_device(0), out)
        g.docs.update({e: (mod, tuple(p.kind for p in ps)) for e, (mod, ps) in in_sources(cubins.folder).items()})
        return g

    def kernel(self, entry: str) -> Kernel:
        if entry not in self._kernels:
            module, kinds = self.docs[entry]
            self._kernels[entry] = self.modules[module].kernel(entry, kinds)
        return self._kernels[entry]

    def put(self, arr: np.ndarray) -> DeviceBuffer:
        arr = np.ascontiguousarray(arr)
        buf = memory.alloc(max(arr.nbytes, 1))
        memory.copy_to_device(buf.ptr, arr)
        self._bufs.append(buf)
        return buf

    def empty(self, nbytes: int, poison: int = 0xFF) -> DeviceBuffer:
        buf = memory.alloc(max(nbytes, 1))
        memory.memset(buf.ptr, poison, buf.nbytes)
        self._bufs.append(buf)
        return buf

    def get(self, buf: DeviceBuffer, dtype, shape) -> np.ndarray:
        out = np.empty(shape, dtype=dtype)
        self.stream.synchronize()
        return memory.copy_to_host(out, buf.ptr)

    def tensor_map(self, buf: DeviceBuffer, cols: int, box, dtype: str = "bf16") -> int:
        """The device address of a tensor map over buf's rows of `cols` elements (a launch's
        `tiles` param, as kern's cuda device passes it)."""
        from kern.runtime.devices.cuda.tensormap import TensorMaps

        if not hasattr(self, "_maps"):
            self._maps = TensorMaps()
        return self._maps.address(buf.ptr, buf.nbytes // 2 // cols, cols, dtype, tuple(box), "a test's launch")

    def make(self, entry: str, grid, block, *args, shared_mem=0, cooperative=False, pdl=False) -> PackedLaunch:
        vals = tuple(a.ptr if isinstance(a, DeviceBuffer) else a for a in args)
        return PackedLaunch(self.kernel(entry), grid, block, vals, shared_mem, cooperative, pdl)

    def run(self, entry: str, grid, block, *args, **kw) -> None:
        launch(self.make(entry, grid, block, *args, **kw), self.stream)
        self.stream.synchronize()

    def graph_ms(self, launches, per: int = 1) -> float:
        """Median milliseconds of one replay of `launches` captured as a graph, divided by `per`
        (the launch list holds `per` repetitions); three warm-up replays, five timed."""
        import statistics

        from kern.runtime.devices.cuda.driver import call
        from kern.runtime.devices.cuda.graphs import capture

        g = capture(self.stream, lambda: launch_all(launches, self.stream), "timing")
        start, stop = call("cuEventCreate", 0), call("cuEventCreate", 0)
        try:
            for _ in range(3):
                g.replay(self.stream)
            out = []
            for _ in range(5):
                call("cuEventRecord", start, self.stream.handle)
                g.replay(self.stream)
                call("cuEventRecord", stop, self.stream.handle)
                call("cuEventSynchronize", stop)
                out.append(call("cuEventElapsedTime", start, stop) / per)
        finally:
            g.destroy()
            call("cuEventDestroy", start)
            call("cuEventDestroy", stop)
        return statistics.median(out)

    def close(self) -> None:
        self.stream.synchronize()
        for b in self._bufs:
            b.free()
        self.stream.destroy()


def report(res: dict, name: str) -> None:
    """A probe's results: printed, and written to $OUT/NAME.json (the current folder without $OUT)."""
    import json
    import os

    text = json.dumps(res, indent=1)
    print(text)
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(text + "\n")
