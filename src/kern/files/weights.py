"""Weight binding: each weight buffer's bind segments, laid end to end and cast to its dtype (a
segment's `fallback` tensor where the checkpoint lacks its `tensor`)."""

from __future__ import annotations

from math import prod

import numpy as np

from ..manifest.schema import Buffer
from .errors import WeightError
from .safetensors import WeightFiles


def bind_all(weights: dict[str, tuple[Buffer, tuple[int, ...]]], ckpt: WeightFiles, np_dtype) -> dict[str, np.ndarray]:
    """Host arrays for every weight buffer; one WeightError listing every missing or
    mis-shaped tensor. weights maps buffer name -> (buffer, resolved shape)."""
    problems: list[str] = []
    out: dict[str, np.ndarray] = {}
    for name, (buf, shape) in weights.items():
        parts = []
        ok = True
        for i, seg in enumerate(buf.bind or []):
            where = f"buffers.{name}.bind[{i}]"
            tensor = seg.tensor if seg.tensor in ckpt.tensors or seg.fallback is None else seg.fallback
            if tensor not in ckpt.tensors:
                nor = "" if seg.fallback is None else f" (nor {seg.fallback!r}, bound in its place)"
                problems.append(f"{where}: checkpoint has no tensor {seg.tensor!r}{nor}")
                ok = False
                continue
            t = ckpt.array(tensor)
            if seg.rows is not None:
                if seg.rows[1] > t.shape[0]:
                    problems.append(f"{where}: rows {list(seg.rows)} outside tensor {tensor!r} of shape {list(t.shape)}")
                    ok = False
                    continue
                t = t[seg.rows[0]:seg.rows[1]]
            if seg.cols is not None:
                if t.ndim < 2 or seg.cols[1] > t.shape[-1]:
                    problems.append(f"{where}: cols {list(seg.cols)} outside tensor {tensor!r} of shape {list(t.shape)}")
                    ok = False
                    continue
                t = t[..., seg.cols[0]:seg.cols[1]]
            if len(shape) >= 2 and tuple(t.shape[1:]) != tuple(shape[1:]):
                problems.append(f"{where}: tensor {tensor!r} is {list(t.shape)}, the buffer needs "
                                f"[*, {', '.join(map(str, shape[1:]))}]")
                ok = False
                continue
            parts.append(t.reshape(-1))
        if not ok:
            continue
        total = sum(p.size for p in parts)
        if total != prod(shape):
            tensors = ", ".join(repr(s.tensor) for s in buf.bind or [])
            problems.append(f"buffers.{name}: tensors {tensors} hold {total} elements, the buffer "
                            f"{list(shape)} needs {prod(shape)}")
            continue
        arr = np.empty(total, dtype=np_dtype)
        at = 0
        for p in parts:
            np.copyto(arr[at:at + p.size], p, casting="unsafe")  # cast in place: no temporary of the tensor
            at += p.size
        out[name] = arr
    head = f"checkpoint {ckpt.folder} does not fit the manifest"
    if len(problems) == 1:  # one line, as a failed command prints it
        raise WeightError(f"{head}: {problems[0]}")
    if problems:
        raise WeightError(f"{head} ({len(problems)} problems):\n" + "\n".join(f"  {p}" for p in problems))
    return out
