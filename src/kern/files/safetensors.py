"""A safetensors reader: the header parsed by hand and checked, the tensors mmapped (no framework).

Every way a file can be damaged (a truncated file, a header that is not a JSON object, a tensor
entry with a missing or mistyped field, offsets that are negative, overlap or run past the end,
a shape that disagrees with its byte range) is a WeightError naming the file and the tensor."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path

import ml_dtypes
import numpy as np

from .errors import WeightError

DTYPES = {
    "BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32, "F64": np.float64,
    "I8": np.int8, "U8": np.uint8, "I16": np.int16, "I32": np.int32, "I64": np.int64, "BOOL": np.bool_,
}
# Every dtype the format defines, with its width: a tensor of a dtype kern cannot read is still
# checked against its byte range, and refused only when a manifest binds it.
ITEM_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "U16": 2, "I16": 2,
              "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "F32": 4, "U64": 8, "I64": 8, "F64": 8}
MAX_HEADER = 100 << 20  # the format's own bound; a larger length is a damaged first 8 bytes


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    end: int


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _no_duplicate_keys(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise WeightError(f"tensor {k!r} appears twice in the header")
        seen[k] = v
    return seen


def _tensor(path: Path, name: str, entry, base: int, data_bytes: int) -> TensorInfo:
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise WeightError(f"{where}: header entry is {type(entry).__name__}, expected an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in ITEM_BYTES:
        raise WeightError(f"{where}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise WeightError(f"{where}: shape {shape!r} is not a list of non-negative whole numbers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        raise WeightError(f"{where}: data_offsets {offsets!r} is not [begin, end] with 0 <= begin <= end")
    lo, hi = offsets
    if hi > data_bytes:
        raise WeightError(f"{where}: data_offsets {offsets} run past the end of the data "
                          f"({data_bytes} bytes; truncated file?)")
    need = prod(shape) * ITEM_BYTES[dtype]
    if hi - lo != need:
        raise WeightError(f"{where}: shape {shape} of {dtype} needs {need} bytes, data_offsets {offsets} "
                          f"hold {hi - lo}")
    return TensorInfo(path, dtype, tuple(shape), base + lo, base + hi)


def read_header(path: Path) -> dict[str, TensorInfo]:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise WeightError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > MAX_HEADER:
                raise WeightError(f"{path}: damaged or truncated safetensors file (its first 8 bytes give a "
                                  f"header of {n} bytes, the file has {size})")
            raw = f.read(n)
    except OSError as exc:
        raise WeightError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    try:
        meta = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except UnicodeDecodeError:
        raise WeightError(f"{path}: damaged safetensors header (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise WeightError(f"{path}: damaged safetensors header (not JSON: {exc.msg} at byte {exc.pos})") from None
    except WeightError as exc:
        raise WeightError(f"{path}: {exc}") from None
    if not isinstance(meta, dict):
        raise WeightError(f"{path}: damaged safetensors header (a JSON {type(meta).__name__}, expected an object)")
    base = 8 + n
    out = {name: _tensor(path, name, t, base, size - base) for name, t in meta.items() if name != "__metadata__"}
    spans = sorted((t.start, t.end, name) for name, t in out.items() if t.end > t.start)
    for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
        if start < end:
            raise WeightError(f"{path}: tensors {a!r} and {b!r} overlap in the file (damaged data_offsets)")
    return out


class WeightFiles:
    """The tensors of a Hugging Face checkpoint folder (one or several .safetensors files)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        files = sorted(self.folder.glob("*.safetensors"))
        if not files:
            raise WeightError(f"{self.folder}: no .safetensors files in the checkpoint folder")
        self.tensors: dict[str, TensorInfo] = {}
        for f in files:
            for name, t in read_header(f).items():
                if name in self.tensors:
                    raise WeightError(f"{f}: tensor {name!r} is also in {self.tensors[name].file.name}")
                self.tensors[name] = t
        self._maps: dict[Path, np.memmap] = {}

    def array(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        if t.dtype not in DTYPES:
            raise WeightError(f"{t.file}: tensor {name!r} has dtype {t.dtype}, which kern does not read")
        if t.start == t.end:
            return np.empty(t.shape, DTYPES[t.dtype])
        mm = self._maps.get(t.file)
        if mm is None:
            mm = self._maps[t.file] = np.memmap(t.file, dtype=np.uint8, mode="r")
        return mm[t.start:t.end].view(DTYPES[t.dtype]).reshape(t.shape)
