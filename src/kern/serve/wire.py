"""The messages between the API process and the engine process, and the cheap forms Deltas and
LoopStats travel in.

Down (API -> engine): AddRequest, Abort, Query, Stop. Up (engine -> API): Ready or LoadFailed once,
then one Step per step of the loop (everything the step made, for every request, in one
message) and a QueryResult per Query. A Delta travels as the tuple of its fields: a frozen
dataclass pickles an order of magnitude slower than a tuple, and at a busy server's token rate
the API process has only tens of microseconds a token for everything (docs/perf.md)."""

from __future__ import annotations

from dataclasses import fields
from operator import attrgetter
from typing import Any, NamedTuple

from ..generation.outputs import Delta, LoopStats
from ..generation.params import SamplingParams

# Every field, in order: a field the loop adds travels without a change here.
_delta_fields = attrgetter(*(f.name for f in fields(Delta)))
_stats_fields = attrgetter(*(f.name for f in fields(LoopStats)))


def pack_delta(d: Delta) -> tuple:
    return _delta_fields(d)


def unpack_delta(t: tuple) -> Delta:
    return Delta(*t)


def pack_stats(s: LoopStats) -> tuple:
    return _stats_fields(s)


def unpack_stats(t: tuple) -> LoopStats:
    return LoopStats(*t)


class AddRequest(NamedTuple):
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams


class Abort(NamedTuple):
    request_id: str


class Query(NamedTuple):
    """Run fn(loop) on the engine process between steps (tests read the pool's books with it)."""

    key: int
    fn: Any  # a picklable callable of the loop


class Stop(NamedTuple):
    pass


class Ready(NamedTuple):
    """The loop is built: what the API process needs to parse and answer requests."""

    model_name: str
    context: int
    tokenizer: Any  # kern.tokenizer.Tokenizer (it pickles), or None: token ids only
    vocab: int  # token ids a prompt may hold
    stats: tuple


class Raised(NamedTuple):
    """An exception as it crosses: its type (by reference), args and attributes. Pickling the
    exception itself calls its __init__ with its args on the other side, which fails for one
    with other parameters (ManifestError, CudaError); this rebuilds it without calling it."""

    kind: type
    args: tuple
    state: dict

    @classmethod
    def of(cls, e: BaseException) -> Raised:
        return cls(type(e), e.args, dict(e.__dict__))

    def rebuild(self) -> BaseException:
        e = self.kind.__new__(self.kind, *self.args)
        e.args = self.args
        e.__dict__.update(self.state)
        return e


class LoadFailed(NamedTuple):
    error: Raised  # what building the loop raised, raised again by Driver.start


class Step(NamedTuple):
    """One step's worth: requests taken (accepted, or refused with a message), the Deltas, the
    stats after it, and `failure` once the loop has failed (then every open request is refused)."""

    accepted: list[str]
    refused: list[tuple[str, str, bool]]  # (request id, message, engine failed)
    deltas: list[tuple]
    stats: tuple
    failure: str | None


class QueryResult(NamedTuple):
    key: int
    value: Any
    error: Raised | None
