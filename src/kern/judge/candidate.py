"""The candidate's run: loaded, run free on the workload (and the wide one, and each sequence
alone), then every span replayed from A's record. In the judging process, after A is released;
or, when A and B live on different devices, in a process of its own started before A loads
(`python -m kern.judge.candidate`, a fresh interpreter, so a CUDA candidate never inherits a
forked context), taking the diff and workloads once A has loaded and then the record through a
Feed as A makes it, so that B's load, free runs and replays hide behind A's load and record."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..drive.engine_io import EngineIO
from ..drive.script import Script
from ..manifest.verify import Verified, verify_path
from ..runtime.engine import Engine
from . import blas, forked, invariance
from .diff import Diff
from .precision import Precision
from .record import Live, Recording, StepOut
from .replay import SpanRun, free_run, replay


@dataclass
class Outcome:
    out: list[StepOut] = field(default_factory=list)  # B free, step by step
    runs: list[SpanRun] = field(default_factory=list)  # every span record replayed on B
    wide_out: list[StepOut] = field(default_factory=list)  # B free on the wide workload
    alone: list[invariance.Invariance] = field(default_factory=list)  # B's sequences alone vs batched
    seconds: dict[str, float] = field(default_factory=dict)
    error: str = ""  # B failed loading or running: a finding, not a crash of kern test


def load(v_b: Verified, weights: str | Path | None) -> tuple[EngineIO | None, Outcome]:
    """B loaded, or the Outcome that says why it did not load (a finding)."""
    o = Outcome()
    t = time.perf_counter()
    try:
        io = EngineIO(Engine(v_b, weights))
    except Exception as exc:  # the candidate's failure is a finding, not a crash of kern test
        o.error = f"{type(exc).__name__}: {exc}"
        return None, o
    o.seconds["load_b"] = time.perf_counter() - t
    return io, o


def run(v_b: Verified, weights: str | Path | None, d: Diff, prec: Precision, wl: Script,
        wide: Script | None, rec: Recording | Live, loaded: tuple[EngineIO | None, Outcome] | None = None) -> Outcome:
    io, o = loaded or load(v_b, weights)
    if io is None:
        return o
    try:
        start = {s: io.read_state(s, io.state_prefix(s, wl.pages_used, len(wl.seqs))).copy() for s in prec.carried
                 if s in io.e.states}
        o.out, o.seconds["free_b"] = free_run(io, wl)
        # what needs no record first: beside A, B runs these while A is still recording
        if wide is not None:
            o.wide_out, o.seconds["wide_b"] = free_run(io, wide)
        o.alone = [invariance.check(io, wl, o.out)]
        if wide is not None:  # the wide decode program's rows against the narrow one's
            o.alone.append(invariance.check(io, wide, o.wide_out, "wide"))
        o.seconds["alone_b"] = sum(x.seconds for x in o.alone)
        # the replays restore what each span reads (a carried state from B's own bytes at load)
        o.runs, o.seconds["replay_b"] = replay(io, "b", d, rec, prec, start=start, wl=wl)
    except Exception as exc:  # the candidate's failure is a finding, not a crash of kern test
        o.error = f"{type(exc).__name__}: {exc}"
    return o


class Beside:
    """run() in a process of its own, started first so that B's interpreter, verification and
    load overlap A's load; what to run (the diff, the workloads) and then A's record arrive
    through `feed`."""

    def __init__(self, candidate: str | Path, weights: str | Path | None, feed: forked.Feed):
        r = feed.pipe()
        self._res, w = os.pipe()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._proc = subprocess.Popen([sys.executable, "-m", "kern.judge.candidate", str(r), str(w), str(candidate),
                                       "" if weights is None else str(weights)], pass_fds=(r, w), env=env)
        os.close(r)
        os.close(w)

    def send_setup(self, feed: forked.Feed, d: Diff, prec: Precision, wl: Script, wide: Script | None) -> None:
        feed.send(("setup", d, prec, wl, wide))

    def result(self) -> Outcome:
        with os.fdopen(self._res, "rb") as f:
            data = f.read()
        self._res = -1
        code = self._proc.wait()
        if not data:
            return Outcome(error=f"the candidate's process died (exit code {code})")
        return pickle.loads(data)

    def abandon(self) -> None:
        """The judging process gives up before B's result (the reference did not load): B's
        process is ended (it is this one's own child) and its result never read."""
        if self._res >= 0:
            os.close(self._res)
            self._res = -1
        self._proc.kill()
        self._proc.wait()


def _main(feed_fd: int, result_fd: int, candidate: str, weights: str | None) -> None:
    try:
        msgs = forked.inbox(feed_fd)
        with blas.threads(1):  # as the judging process runs its side
            v = verify_path(candidate).verified
            # B loads while A does; the setup (the diff, the workloads) follows A's load
            loaded = load(v, weights) if v is not None else None
            _, d, prec, wl, wide = next(msgs)
            o = (run(v, weights, d, prec, wl, wide, Live(msgs), loaded) if v is not None
                 else Outcome(error=f"{candidate} failed verification"))
    except Exception as exc:  # noqa: BLE001 - reported as the candidate's failure, never a traceback
        o = Outcome(error=f"{type(exc).__name__}: {exc}")
    try:
        with os.fdopen(result_fd, "wb") as f:
            f.write(pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL))
    except BrokenPipeError:  # the judging process is gone
        pass


def apart(v_a: Verified, v_b: Verified) -> bool:
    """A and B on different devices: B may be loaded while A is (their memories are apart)."""
    return v_a.manifest.target.device != v_b.manifest.target.device


if __name__ == "__main__":
    from kern.judge.candidate import _main as main  # Outcome pickled under its module's own name

    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] or None)
