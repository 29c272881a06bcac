"""Where `--workload FILE` comes from: a TOML workload (workload.py) or a trace of served steps
(trace.py, `kern serve --trace`), told apart by the file's first line."""

from __future__ import annotations

from pathlib import Path

from . import trace
from .workload import Workload, WorkloadError, parse


def read(path: str | Path) -> Workload:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise WorkloadError(f"--workload {path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise WorkloadError(f"--workload {path}: not UTF-8 text") from None
    return trace.parse(text, str(path)) if trace.is_trace(text) else parse(text, str(path))
