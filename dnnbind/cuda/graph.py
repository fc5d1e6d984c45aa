"""CUDA graph capture and replay.

``with capture(stream) as graph:`` records the work queued on ``stream`` (in
thread-local capture mode, so other threads keep working) into ``graph``;
``graph.launch(stream)`` replays it. Graphs are instantiated with
``cudaGraphInstantiateFlagAutoFreeOnLaunch``: memory allocated during capture
and not freed in it belongs to the graph and is released at the next launch.
Allocations made before the capture and dropped during it are freed only after
the capture ends (see :mod:`dnnbind.cuda.memory`), so replays never free them.

Memory allocated during the capture and still held when it ends is the graph's *outstanding*
memory (:attr:`Graph.outstanding_allocations` lists it): it is valid from a launch until the
next launch of the same graph, and never once the graph is closed. Work that is replayed as a
whole step (dnnbind's train/test/predict graphs) allows none: everything it allocates dies
inside the capture, so no address the host keeps can point into graph memory. An allocation
that outlived its capture and was cached on the host (an optimizer's pointer table, once)
made compute-sanitizer report tens of thousands of invalid writes in the replayed step.

Host-to-device uploads of constants during a capture (:func:`dnnbind.cuda.constant`, used
for the optimizers' pointer tables) cannot allocate pinned memory (``cudaHostAlloc`` is
refused while capturing), so each capture reserves a pinned upload arena before it starts;
the graph owns it, and every replay re-reads the same bytes.

A :class:`Graph` owns its ``cudaGraph_t`` and its ``cudaGraphExec_t`` through one
:class:`dnnbind._lib.OwnedPointer` each (the library's ownership policy: a destroy requested
during a capture, by ``close()`` or by a collection, waits for the capture's end).
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any, Iterator

from .._lib import OwnedPointer
from ._util import check, rt
from ..errors import DnnbindError
from .memory import (PinnedBuffer, _capture_id, capture_began, capture_ended, flush_deferred_frees,
                     track_capture, untrack_capture)
from .stream import Stream, as_stream

__all__ = ["Graph", "capture", "upload_slot"]

_arenas: "dict[int, _UploadArena]" = {}  # stream handle -> arena of the capture in progress


class _UploadArena:
    """Pinned host memory handed out in slices during one capture, kept by its graph."""

    def __init__(self, nbytes: int) -> None:
        self.buffer = PinnedBuffer(nbytes)
        self.used = 0

    def take(self, nbytes: int) -> int:
        start = -(-self.used // 16) * 16  # 16-byte aligned slices
        if start + nbytes > self.buffer.nbytes:
            raise DnnbindError(
                f"the CUDA graph's upload arena is full ({self.buffer.nbytes:,} bytes; {nbytes:,} more "
                "requested during capture). Pass a larger upload_bytes= to dnnbind.cuda.capture(), or run "
                "the work once before capturing so its constants already exist.")
        self.used = start + nbytes
        return self.buffer.ptr + start


def upload_slot(stream: Stream, nbytes: int) -> int:
    """Address of ``nbytes`` of pinned memory that lives as long as the graph ``stream`` is capturing."""
    arena = _arenas.get(stream.handle)
    if arena is None:
        raise DnnbindError(f"stream {stream.handle:#x} is being captured, but not by dnnbind.cuda.capture(): "
                           "host-to-device uploads cannot be recorded")
    return arena.take(nbytes)

_MODES = {
    "thread_local": "cudaStreamCaptureModeThreadLocal",
    "global": "cudaStreamCaptureModeGlobal",
    "relaxed": "cudaStreamCaptureModeRelaxed",
}


# Looked up at call time (not bound at creation), so a test can count the destroys.
def _destroy_graph(ptr: int) -> tuple:
    return rt.cudaGraphDestroy(ptr)


def _destroy_exec(ptr: int) -> tuple:
    return rt.cudaGraphExecDestroy(ptr)


class _GraphPart(OwnedPointer):
    """One C object of a :class:`Graph`: its ``cudaGraph_t`` or its ``cudaGraphExec_t``.

    The two are independent once instantiated (an executable is a snapshot of its graph), so
    they may be destroyed in either order; an executable still running is freed by the driver
    when it completes.
    """

    def __init__(self, ptr: Any, destroy: Any, destroy_name: str) -> None:
        self._destroy_name = destroy_name
        self._adopt(int(ptr), destroy)

    def _check_destroy(self, result: tuple) -> None:
        check(result, self._destroy_name)


class Graph:
    """A captured CUDA graph; :meth:`launch` instantiates it on first use."""

    def __init__(self) -> None:
        self._graph: "_GraphPart | None" = None  # set when the capture ends
        self._exec: "_GraphPart | None" = None  # set by instantiate()
        self.stream: Stream | None = None
        self._uploads: "_UploadArena | None" = None  # pinned bytes the graph's copies read
        self.outstanding_allocations: "list[tuple[int, str]]" = []
        """``(bytes, what)`` of each allocation made during the capture and not freed in it."""

    @property
    def captured(self) -> bool:
        """True from the end of a successful capture until :meth:`close`."""
        return self._graph is not None and not self._graph.closed

    def instantiate(self) -> "Graph":
        """Build the executable graph (AutoFreeOnLaunch); called by :meth:`launch` if needed."""
        if not self.captured:
            raise RuntimeError("Graph.instantiate: nothing was captured (or the graph was closed)")
        if self._exec is None:
            flags = rt.cudaGraphInstantiateFlags.cudaGraphInstantiateFlagAutoFreeOnLaunch
            graph_exec = check(rt.cudaGraphInstantiate(self._graph.handle, int(flags)), "cudaGraphInstantiate")
            self._exec = _GraphPart(graph_exec, _destroy_exec, "cudaGraphExecDestroy")
        return self

    def launch(self, stream: Any = None) -> None:
        """Replay on ``stream`` (default: the stream it was captured on)."""
        graph_exec = self._exec
        if graph_exec is None or graph_exec.closed:
            graph_exec = self.instantiate()._exec
        s = as_stream(stream) if stream is not None else (self.stream or as_stream(None))
        check(rt.cudaGraphLaunch(graph_exec.handle, s.handle), "cudaGraphLaunch")

    def close(self) -> None:
        """Destroy the executable and the graph (idempotent). During a capture the destroys wait
        for its end; the upload arena stays with this object until it dies."""
        for part in (self._exec, self._graph):
            if part is not None:
                part.close()

    def __repr__(self) -> str:
        if not self.captured:
            state = "closed" if self._graph is not None else "empty"
        else:
            state = "instantiated" if self._exec is not None else "captured"
        return f"Graph({state})"


@contextlib.contextmanager
def capture(stream: Any = None, *, mode: str = "thread_local", upload_bytes: int = 1 << 20) -> Iterator[Graph]:
    """Capture the work queued on ``stream`` (default: the current stream) into a :class:`Graph`.

    ``upload_bytes`` is the size of the pinned arena for constants uploaded during the capture.

    The stream must not be the legacy NULL stream (the library's streams never are).
    If the block raises, the capture is ended, the partial graph destroyed, and the error re-raised.
    """
    if mode not in _MODES:
        raise ValueError(f"capture: mode must be one of {sorted(_MODES)}, got {mode!r}")
    s = as_stream(stream)
    graph = Graph()
    graph.stream = s
    graph._uploads = _arenas[s.handle] = _UploadArena(upload_bytes)
    # No cyclic garbage collection while capturing: a collection may run the finalizer of any
    # unreachable object, and one that calls a CUDA API refused during capture (destroying an
    # executable graph, a stream or a module, a synchronising free) invalidates the capture at
    # a random point of the step. Reference-count frees are deterministic and stay.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        with _capturing(s, graph, mode):
            yield graph
    finally:
        if gc_was_enabled:
            gc.enable()


@contextlib.contextmanager
def _capturing(s: Stream, graph: Graph, mode: str) -> Iterator[None]:
    """Begin and end the capture on ``s``; record the allocations it leaves outstanding on ``graph``."""
    capture_began()
    try:
        check(rt.cudaStreamBeginCapture(s.handle, getattr(rt.cudaStreamCaptureMode, _MODES[mode])),
              "cudaStreamBeginCapture")
    except BaseException:
        _arenas.pop(s.handle, None)
        capture_ended()
        raise
    capture_id = _capture_id(s.handle)
    track_capture(capture_id)
    try:
        with s:
            yield
    except BaseException:
        _arenas.pop(s.handle, None)
        err, g = rt.cudaStreamEndCapture(s.handle)
        if not err and g is not None:
            rt.cudaGraphDestroy(g)
        rt.cudaGetLastError()
        untrack_capture(capture_id)
        capture_ended()
        flush_deferred_frees()
        raise
    _arenas.pop(s.handle, None)
    try:
        g = check(rt.cudaStreamEndCapture(s.handle), "cudaStreamEndCapture")
    finally:
        graph.outstanding_allocations = untrack_capture(capture_id)
        capture_ended()
    graph._graph = _GraphPart(g, _destroy_graph, "cudaGraphDestroy")
    flush_deferred_frees()
