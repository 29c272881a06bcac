"""The engine process's loop, run in this process over scripted pipes: what it takes between
steps and the one message it sends up a step."""

from __future__ import annotations

from kern.generation.params import SamplingParams
from kern.serve import wire
from kern.serve.engine_process import Serving

from .engines import CountingLoop


class Pipes:
    """Scripted pipes: round i is what arrives down while the engine's i-th message goes up (the
    engine sends exactly one a turn of its loop), round 0 what is there at the start."""

    def __init__(self, rounds: list[list]):
        self.rounds, self.sent = rounds[1:], []
        self.pending = list(rounds[0])

    def recv(self):  # blocking, when idle: the next round's first message
        while not self.pending:
            self.pending = self.rounds.pop(0)
        return self.pending.pop(0)

    def poll(self) -> bool:
        return bool(self.pending)

    def send(self, msg):
        self.sent.append(msg)
        if self.rounds:
            self.pending += self.rounds.pop(0)


def add(rid: str, n: int) -> wire.AddRequest:
    return wire.AddRequest(rid, [5, 6, 7], SamplingParams(max_tokens=n))


def serve(rounds: list, loop=None) -> list[wire.Step]:
    pipes = Pipes(rounds)
    Serving(loop or CountingLoop(), pipes).run(pipes)
    return pipes.sent


def test_a_step_goes_up_as_one_message_after_the_requests_it_accepted():
    steps = serve([[add("a", 2), add("b", 3)], [], [], [wire.Stop()]])
    assert [s.accepted for s in steps] == [["a", "b"], [], []]
    assert [[(d[0], d[4]) for d in s.deltas] for s in steps] == [
        [("a", None), ("b", None)], [("a", "length"), ("b", None)], [("b", "length")]]
    assert [wire.unpack_stats(s.stats).running for s in steps] == [2, 1, 0]


def test_an_abort_is_taken_before_the_next_step_and_its_request_sends_nothing_more():
    steps = serve([[add("a", 5), add("b", 5)], [wire.Abort("a")], [wire.Stop()]])
    assert [[d[0] for d in s.deltas] for s in steps] == [["a", "b"], ["b"]]


def test_a_failed_step_refuses_every_open_request_and_every_later_one():
    class Failing(CountingLoop):
        def step(self, emit=None):
            raise RuntimeError("device lost")

    first, second = serve([[add("a", 2), add("b", 2)], [add("c", 2)], [wire.Stop()]], Failing())
    assert first.failure == second.failure == "the engine failed: device lost"
    assert [r[0] for r in first.refused] == ["a", "b"] and [r[0] for r in second.refused] == ["c"]
    assert all(engine_failed for _, _, engine_failed in first.refused + second.refused)
