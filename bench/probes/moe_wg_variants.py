"""Time moe_wg.cu's grouped expert projections (moe_wg_gate_up, moe_wg_down over moe_sort's tiles)
of this tree beside a base build (an earlier moe_wg.cubin whose grid is (column tiles,
max_tiles), a block a work item), at the Qwen3-30B-A3B shape (hidden 2048, expert width 768,
128 experts, top 8) for decode batches of 16 and 64 rows and a prefill chunk, and check the two
builds give the same bytes: one line a (kernel, rows) with each build's time and the touched
experts' read rate. Run on the device from the repository root, kern importable:

    python3 -m bench.probes.moe_wg_variants BASE_CUBIN_DIR [ROWS]

With ROWS, each build's two kernels run once at that many rows, untimed (for ncu -k regex:moe_wg)."""
import sys
from pathlib import Path
import tempfile

import numpy as np

from kern.runtime.devices.cuda.launch import Module, PackedLaunch, launch
from kern_models.qwen3_moe.kernels.cuda import CUBINS, table
from tests.cuda.cuda_gpu import Gpu, op_launches

HIDDEN, INTER, EXPERTS, TOP_K = 2048, 768, 128, 8
REPS = 10


def bf16(rng, shape, scale):
    f = (rng.standard_normal(shape) * scale).astype(np.float32)
    return (f.view(np.uint32) + 0x7FFF + ((f.view(np.uint32) >> 16) & 1) >> 16).astype(np.uint16)


def main() -> None:
    base_dir = Path(sys.argv[1])
    gpu = Gpu.of_family(CUBINS, Path(tempfile.mkdtemp()))
    base = Module((base_dir / "moe_wg.cubin").read_bytes(), "moe_wg_base")
    kinds = {e: gpu.docs[e][1] for e in ("moe_wg_gate_up", "moe_wg_down")}
    ops = table.ops()
    rng = np.random.default_rng(0)
    W_gu = gpu.put(bf16(rng, (EXPERTS * 2 * INTER, HIDDEN), 0.05))
    W_d = gpu.put(bf16(rng, (EXPERTS * HIDDEN, INTER), 0.05))
    smem = table.BY_ENTRY["moe_wg_down"].shared_mem
    once = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    for rows in [once] if once else (16, 64, 512):
        pairs = rows * TOP_K
        tiles = -(-pairs // table.TILES["MOE_BM"]) + EXPERTS
        ids = np.stack([rng.choice(EXPERTS, TOP_K, replace=False) for _ in range(rows)]).astype(np.int32)
        touched = len(np.unique(ids))
        x, ids_d = gpu.put(bf16(rng, (rows, HIDDEN), 1.0)), gpu.put(ids)
        sorted_, pos, tile_buf = gpu.empty(pairs * 4), gpu.empty(pairs * 4), gpu.empty((1 + 3 * tiles) * 4)
        for la in op_launches(gpu, ops["moe_sort"], dict(ids=ids_d, sorted=sorted_, pos=pos, tiles=tile_buf,
                                                          n_pairs=pairs, experts=EXPERTS)):
            launch(la, gpu.stream)
        gpu.stream.synchronize()
        acts = {b: gpu.empty(pairs * INTER * 2) for b in ("base", "tree")}
        ys = {b: gpu.empty(pairs * HIDDEN * 4) for b in ("base", "tree")}
        line = [f"rows {rows:4d} ({touched} experts)"]
        for name, N, K, wbytes in (("moe_wg_gate_up", 2 * INTER, HIDDEN, 2 * INTER * HIDDEN * 2),
                                   ("moe_wg_down", HIDDEN, INTER, HIDDEN * INTER * 2)):
            for b in ("base", "tree"):
                common = dict(sorted=sorted_, tiles=tile_buf, inter=INTER, hidden=HIDDEN, first=0, count=EXPERTS,
                              max_tiles=tiles)
                named = (dict(common, x=x, W=W_gu, act=acts[b], top_k=TOP_K) if name == "moe_wg_gate_up"
                         else dict(common, act=acts["base"], W=W_d, y=ys[b]))
                if b == "tree":
                    la = op_launches(gpu, ops[name], named)
                else:
                    params = [p.split(":")[0] for p in table.BY_ENTRY[name].params]
                    cols = HIDDEN // table.DEFINES["WG_BN"] if name == "moe_wg_down" else INTER // (table.DEFINES["WG_BN"] // 2)
                    grid = (cols, tiles)
                    vals = tuple(getattr(named[p], "ptr", named[p]) for p in params)
                    la = [PackedLaunch(base.kernel(name, kinds[name]), grid, (256,), vals, smem, False, False)]
                if once:
                    launch(la[0], gpu.stream)
                    gpu.stream.synchronize()
                    continue
                ms = gpu.graph_ms(la * REPS, per=REPS)
                line.append(f"{name[7:]} {b} {ms * 1e3:7.1f} us {touched * wbytes / ms / 1e9:6.2f} TB/s")
        same_act = np.array_equal(gpu.get(acts["base"], np.uint16, pairs * INTER),
                                  gpu.get(acts["tree"], np.uint16, pairs * INTER))
        same_y = np.array_equal(gpu.get(ys["base"], np.uint32, pairs * HIDDEN), gpu.get(ys["tree"], np.uint32, pairs * HIDDEN))
        line.append(f"same bytes: act {same_act}, y {same_y}")
        print(" | ".join(line), flush=True)
    gpu.close()


if __name__ == "__main__":
    main()
