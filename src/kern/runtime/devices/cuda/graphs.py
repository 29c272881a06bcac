"""CUDA graphs: capture a launch list on a stream once per shape bucket, replay it with one
cuGraphLaunch. Captured launches keep the argument values they had at capture; what changes
between replays must live in device buffers at fixed addresses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kern.runtime.devices.cuda.driver import call, drv
from kern.runtime.devices.cuda.memory import Stream


class Graph:
    """An instantiated (executable) graph."""

    def __init__(self, exec_handle: Any, label: str):
        self.handle, self.label = exec_handle, label

    def replay(self, stream: Stream) -> None:
        call("cuGraphLaunch", self.handle, stream.handle, where=f"graph {self.label}")

    def destroy(self) -> None:
        if self.handle is not None:
            call("cuGraphExecDestroy", self.handle, where=f"graph {self.label}")
            self.handle = None


def capture(stream: Stream, record: Callable[[], None], label: str = "") -> Graph:
    """Run `record()` under stream capture on `stream` and instantiate what it enqueued."""
    d = drv()
    mode = d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    call("cuStreamBeginCapture", stream.handle, mode, where=f"graph {label}")
    try:
        record()
    except BaseException:
        d.cuStreamEndCapture(stream.handle)  # leave the stream usable; the first error wins
        raise
    graph = call("cuStreamEndCapture", stream.handle, where=f"graph {label}")
    try:
        exec_handle = call("cuGraphInstantiate", graph, 0, where=f"graph {label}")
    finally:
        call("cuGraphDestroy", graph)
    return Graph(exec_handle, label)

