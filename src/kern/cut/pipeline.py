"""A cut manifest's stages run in sequence as one model (kern cut writes them).

Each stage is its own verified manifest on its own engine. A step of a program runs every
stage that holds calls of it, in order; the buffers a stage sends (whole allocations) are
written into the next stages that receive them, and the step's inputs into every stage that
declares them. Outputs are read from the stage that writes them last."""

from __future__ import annotations

from math import prod
from pathlib import Path

import numpy as np

from ..manifest.verify import load_verified
from ..runtime.engine import Engine
from ..errors import KernError
from ..files.jsonfiles import read_object

PIPELINE_FILE = "pipeline.json"


def read_pipeline(folder: str | Path) -> dict:
    path = Path(folder) / PIPELINE_FILE
    if not path.is_file():
        raise KernError(f"{path}: cannot read it: no such file; give a folder written by kern cut")
    doc = read_object(path)
    if doc.get("kern_pipeline") != 1 or not isinstance(doc.get("stages"), list):
        raise KernError(f"{path}: not a kern cut pipeline (kern_pipeline 1 with a stages list)")
    return doc


class Pipeline:
    def __init__(self, folder: str | Path, weights: str | Path | None, **engine_args):
        folder = Path(folder)
        doc = read_pipeline(folder)
        self.source_sha256: str = doc.get("source_sha256", "")
        self.stages = [Engine(load_verified(folder / s), weights, **engine_args) for s in doc["stages"]]
        self.programs: dict[str, list[dict]] = doc["programs"]

    def run(self, program: str, vars: dict[str, int], inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One step through every stage; returns the step's outputs (at the step's shape)."""
        if program not in self.programs:
            raise KernError(f"no program named {program!r}; the pipeline has {', '.join(self.programs)}")
        held: dict[str, np.ndarray] = {}
        outs: dict[str, np.ndarray] = {}
        for seg in self.programs[program]:
            e = self.stages[seg["stage"]]
            for buf in seg["receives"]:
                e.device.write(e.buffers[buf], held[buf])
            env = e.run(program, {k: x for k, x in vars.items() if k in e.m.vars},
                        {b: x for b, x in inputs.items() if b in e.m.buffers})
            for buf in seg["sends"]:
                held[buf] = e.device.read(e.buffers[buf], e.m.buffers[buf].dtype, (prod(e.shapes[buf]),))
            for name, b in e.m.buffers.items():
                if b.fill is not None and b.kind == "output":
                    outs[name] = e.read(name, env)
        return outs
