"""A safetensors reader: the header parsed by hand, the tensors mmapped (no framework)."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from .errors import WeightError

DTYPES = {
    "BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32, "F64": np.float64,
    "I8": np.int8, "U8": np.uint8, "I16": np.int16, "I32": np.int32, "I64": np.int64, "BOOL": np.bool_,
}


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    end: int


def read_header(path: Path) -> dict[str, TensorInfo]:
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise WeightError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        (n,) = struct.unpack("<Q", head)
        size = path.stat().st_size
        if n > size - 8:
            raise WeightError(f"{path}: truncated safetensors file (header claims {n} bytes, file has {size})")
        try:
            meta = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise WeightError(f"{path}: malformed safetensors header: {exc}") from None
    base = 8 + n
    out = {}
    for name, t in meta.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        if base + hi > size:
            raise WeightError(f"{path}: tensor {name!r} runs past the end of the file (truncated?)")
        out[name] = TensorInfo(path, t["dtype"], tuple(t["shape"]), base + lo, base + hi)
    return out


class Checkpoint:
    """The tensors of a Hugging Face checkpoint folder (one or several .safetensors files)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            raise WeightError(f"{self.folder}: no .safetensors files in the checkpoint folder")
        self.tensors: dict[str, TensorInfo] = {}
        for f in files:
            self.tensors.update(read_header(f))
        self._maps: dict[Path, np.memmap] = {}

    def array(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        if t.dtype not in DTYPES:
            raise WeightError(f"{t.file}: tensor {name!r} has unsupported dtype {t.dtype}")
        mm = self._maps.get(t.file)
        if mm is None:
            mm = self._maps[t.file] = np.memmap(t.file, dtype=np.uint8, mode="r")
        return mm[t.start:t.end].view(DTYPES[t.dtype]).reshape(t.shape)
