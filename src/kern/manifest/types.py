"""Op param type strings: "x: in buffer<bf16>", "kv: inout state", "rows: i32"."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from .schema import DTYPE_BYTES

SCALARS: dict[str, tuple[int, int] | None] = {
    "i32": (-(2**31), 2**31 - 1),
    "u32": (0, 2**32 - 1),
    "i64": (-(2**63), 2**63 - 1),
    "f32": None,
}

_PARAM = re.compile(
    r"^\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*:\s*"
    r"(?:(?P<dir>in|out|inout)\s+(?:buffer<(?P<dtype>[a-z0-9]+)>|(?P<state>state))"
    r"|(?P<scalar>[a-z0-9]+))\s*$"
)


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    kind: Literal["buffer", "state", "scalar"]
    direction: Literal["in", "out", "inout"] | None = None
    dtype: str | None = None  # buffer element type, or the scalar type

    @property
    def writes(self) -> bool:
        return self.direction in ("out", "inout")

    def __str__(self) -> str:
        if self.kind == "buffer":
            return f"{self.direction} buffer<{self.dtype}>"
        if self.kind == "state":
            return f"{self.direction} state"
        return str(self.dtype)


def parse_param(text: str) -> Param:
    """Parse one param type string; ValueError names what is malformed."""
    m = _PARAM.match(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(
            f"malformed param {text!r}: expected 'name: in|out|inout buffer<dtype>', "
            "'name: in|out|inout state' or 'name: i32|u32|i64|f32'"
        )
    if m["scalar"]:
        if m["scalar"] not in SCALARS:
            raise ValueError(f"param {text!r}: unknown scalar type {m['scalar']!r}")
        return Param(m["name"], "scalar", None, m["scalar"])
    if m["state"]:
        return Param(m["name"], "state", m["dir"])  # type: ignore[arg-type]
    if m["dtype"] not in DTYPE_BYTES:
        raise ValueError(f"param {text!r}: unknown dtype {m['dtype']!r}")
    return Param(m["name"], "buffer", m["dir"], m["dtype"])  # type: ignore[arg-type]
