"""CUDA graph capture and replay.

``with capture(stream) as graph:`` records the work queued on ``stream`` (in
thread-local capture mode, so other threads keep working) into ``graph``;
``graph.launch(stream)`` replays it. Graphs are instantiated with
``cudaGraphInstantiateFlagAutoFreeOnLaunch``: memory allocated during capture
and not freed in it belongs to the graph and is released at the next launch.
Allocations made before the capture and dropped during it are freed only after
the capture ends (see :mod:`dnnbind.cuda.memory`), so replays never free them.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator

from ._util import check, rt
from .memory import flush_deferred_frees
from .stream import Stream, as_stream

__all__ = ["Graph", "capture"]

_MODES = {
    "thread_local": "cudaStreamCaptureModeThreadLocal",
    "global": "cudaStreamCaptureModeGlobal",
    "relaxed": "cudaStreamCaptureModeRelaxed",
}


def _destroy(graph_box: list, exec_box: list) -> None:
    try:
        if exec_box[0] is not None:
            rt.cudaGraphExecDestroy(exec_box[0])
        if graph_box[0] is not None:
            rt.cudaGraphDestroy(graph_box[0])
    except Exception:
        pass
    graph_box[0] = exec_box[0] = None


class Graph:
    """A captured CUDA graph; :meth:`launch` instantiates it on first use."""

    def __init__(self) -> None:
        self._graph: list = [None]  # boxes shared with the finalizer (no reference to self)
        self._exec: list = [None]
        self._finalizer = weakref.finalize(self, _destroy, self._graph, self._exec)
        self.stream: Stream | None = None

    @property
    def captured(self) -> bool:
        return self._graph[0] is not None

    def instantiate(self) -> "Graph":
        """Build the executable graph (AutoFreeOnLaunch); called by :meth:`launch` if needed."""
        if self._graph[0] is None:
            raise RuntimeError("Graph.instantiate: nothing was captured (or the graph was closed)")
        if self._exec[0] is None:
            flags = rt.cudaGraphInstantiateFlags.cudaGraphInstantiateFlagAutoFreeOnLaunch
            self._exec[0] = check(rt.cudaGraphInstantiate(self._graph[0], int(flags)), "cudaGraphInstantiate")
        return self

    def launch(self, stream: Any = None) -> None:
        """Replay on ``stream`` (default: the stream it was captured on)."""
        self.instantiate()
        s = as_stream(stream) if stream is not None else (self.stream or as_stream(None))
        check(rt.cudaGraphLaunch(self._exec[0], s.handle), "cudaGraphLaunch")

    def close(self) -> None:
        """Destroy the graph and its executable (idempotent)."""
        self._finalizer()

    def __repr__(self) -> str:
        state = "instantiated" if self._exec[0] is not None else ("captured" if self.captured else "empty")
        return f"Graph({state})"


@contextlib.contextmanager
def capture(stream: Any = None, *, mode: str = "thread_local") -> Iterator[Graph]:
    """Capture the work queued on ``stream`` (default: the current stream) into a :class:`Graph`.

    The stream must not be the legacy NULL stream (the library's streams never are).
    If the block raises, the capture is ended, the partial graph destroyed, and the error re-raised.
    """
    if mode not in _MODES:
        raise ValueError(f"capture: mode must be one of {sorted(_MODES)}, got {mode!r}")
    s = as_stream(stream)
    graph = Graph()
    graph.stream = s
    check(rt.cudaStreamBeginCapture(s.handle, getattr(rt.cudaStreamCaptureMode, _MODES[mode])),
          "cudaStreamBeginCapture")
    try:
        with s:
            yield graph
    except BaseException:
        err, g = rt.cudaStreamEndCapture(s.handle)
        if not err and g is not None:
            rt.cudaGraphDestroy(g)
        rt.cudaGetLastError()
        flush_deferred_frees()
        raise
    g = check(rt.cudaStreamEndCapture(s.handle), "cudaStreamEndCapture")
    graph._graph[0] = g
    flush_deferred_frees()
