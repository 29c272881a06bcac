"""A request's random keys: every draw of a request, on the device or the host, is a function
of its seed and the token's index alone (splitmix64), never of its slot, batch or history of
steps; a request without a seed gets one derived from its id."""

from __future__ import annotations

import hashlib


def draw_key(seed: int, n: int) -> int:
    """The 64-bit key of a request's n-th device draw: its seed and n mixed (splitmix64), so a
    seed reproduces every draw whatever else shares the batch."""
    return _mix64((seed ^ _mix64(n)) & _M64)


_M64 = (1 << 64) - 1


class HostDraw:
    """The uniform number of a host draw, from the same key as the device's draw of that token:
    a function of the request's seed and the token's index, never of its slot or its history
    of steps (preempted, resumed, batched anyhow, the n-th token draws the same number)."""

    def __init__(self, key: int):
        self.key = key

    def random(self) -> float:
        return (self.key >> 11) * 2.0 ** -53  # the key's top 53 bits: in [0, 1)


def _mix64(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def seed_of(request_id: str) -> int:
    """A request without a seed draws from one derived from its id: reproducible, and no two
    requests share a stream by accident of arrival order."""
    return int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "little")
