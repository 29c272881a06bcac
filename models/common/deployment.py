"""Writing a generated deployment's manifests: manifest.json, or one manifest a rank of a split
(rank0.json, rank1.json, ... beside one kernels/ folder)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def write(out: Path, m: dict, ranks: int = 1, shard: Callable[[int], dict] | None = None,
          add_module: Callable[[dict, Path], None] | None = None) -> Path:
    """m as out/manifest.json; or, ranks > 1, shard(rank) as out/rank{rank}.json for each rank,
    add_module(manifest, out/kernels) putting the split's collectives module beside the kernels.
    The path of manifest.json or rank0.json."""
    if ranks == 1:
        path = out / "manifest.json"
        path.write_text(json.dumps(m, indent=1) + "\n")
        return path
    for rank in range(ranks):
        mr = shard(rank)
        add_module(mr, out / "kernels")
        (out / f"rank{rank}.json").write_text(json.dumps(mr, indent=1) + "\n")
    return out / "rank0.json"
