"""A model's train / test / predict steps captured as CUDA graphs and replayed (``compile(jit_compile=...)``).

A dnnbind step is host-bound: hundreds of op calls, each with Python and cuDNN host work, for
about a millisecond of GPU work. Capturing the whole step (forward, backward, optimizer update,
loss and metric accumulation) once and replaying it with one ``cudaGraphLaunch`` removes that.

Life of a step key ``(kind, stream, x shape/dtype, y shape/dtype, kernels.config switches)``:

1. first sight: the step runs eagerly. That warm-up creates everything a capture must not create:
   cuDNN/cuBLAS handles for the stream, algorithm choices, the workspace, optimizer slots,
   metric accumulators, dropout states, compiled kernels. (The optimizer's pointer tables are
   the exception: a capture makes its own, uploaded from the graph's pinned arena, and frees them
   inside the graph.)
2. second sight: the step is captured on the current stream, reading *static* input buffers
   owned by the key, then launched.
3. from then on: the batch is copied into the static buffers (device to device, outside the
   graph, or gathered straight into them by ``kernels.take(..., out=)``), the learning rate is
   uploaded if it changed, and the graph is launched. Host-side counters the step advances in
   Python (metric sample counts, the optimizer's update-count estimate) are advanced by the amounts measured
   during the capture.

A capture that raises falls back to eager for that key with a warning naming the error; the
capture is ended by :func:`dnnbind.cuda.capture` and the host counters are restored.

Several inputs or outputs: a step's ``x``/``y`` (and a predict step's result) may be a tuple of
arrays (a multi-input / multi-output model); keys, static buffers and outputs are then tuples too.

Validity: a graph bakes in the addresses of every buffer it touches. The model's
``_graph_signature()`` (trainable flags, dtype policies, weight arrays, optimizer identity and
state version, loss-scale state) is compared before every step; any change drops every graph.
``compile()``, ``to()`` and ``build()`` drop them explicitly. Each captured entry also keeps
strong references to the persistent arrays it addresses (weights, optimizer state, metric
totals, the cuDNN workspace), so a graph can never write into memory that was given back.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any, Callable

from .. import kernels
from ..errors import DnnbindError

__all__ = ["StepGraphs", "CudaGraphBackend", "MAX_GRAPHS", "KINDS"]

MAX_GRAPHS = 8
KINDS = ("train", "test", "predict")


class CudaGraphBackend:
    """What :class:`StepGraphs` needs from CUDA; tests substitute a fake to check the bookkeeping on NumPy.

    Its methods import :mod:`dnnbind.cuda` (and the CUDA ops' workspace) where they use it: this module
    is imported by every model, also on the NumPy backend, which must not load cuda.bindings.
    """

    def available(self, device: Any) -> bool:
        return bool(device.is_cuda)

    def current_stream(self) -> Any:
        from ..cuda import current_stream  # deferred: CUDA only (class docstring)

        return current_stream()

    def stream_key(self, stream: Any) -> int:
        return stream.handle

    def capture(self, stream: Any, fn: Callable[[], Any]) -> Any:
        """Capture ``fn()``'s work on ``stream`` and instantiate the graph (so instantiation errors
        count as capture errors); an exception ends the capture and propagates."""
        from ..cuda import capture  # deferred: CUDA only (class docstring)

        with capture(stream) as graph:
            fn()
        try:
            if graph.outstanding_allocations:
                # Graph memory the host still holds would alias memory the next replay reuses
                # (see dnnbind.cuda.graph): a step must free everything it allocates.
                left = graph.outstanding_allocations
                shown = "; ".join(f"{what} ({nbytes:,} bytes)" for nbytes, what in left[:4])
                raise DnnbindError(
                    f"the step kept {len(left)} allocation(s) made during its capture alive after it: {shown}"
                    f"{'; ...' if len(left) > 4 else ''}. A replayed step must free everything it allocates "
                    "(this is a dnnbind bug: please report it)")
            graph.instantiate()
        except BaseException:
            graph.close()
            raise
        return graph

    def launch(self, graph: Any, stream: Any) -> None:
        graph.launch(stream)

    def empty(self, shape: tuple, dtype: Any, stream: Any) -> Any:
        from ..cuda import empty  # deferred: CUDA only (class docstring)

        return empty(shape, dtype, stream=stream)

    def copy(self, dst: Any, src: Any, stream: Any) -> None:
        """Device-to-device copy into a static buffer, queued on ``stream`` before the launch."""
        if dst.ptr != src.ptr:  # a batch already gathered into the buffer (another view of it)
            dst.copy_from(src, stream=stream)

    def copy_out(self, src: Any, stream: Any) -> Any:
        """A fresh copy of a static output (the next replay overwrites ``src``)."""
        return kernels.copy(src, stream=stream)

    def synchronize(self, stream: Any) -> None:
        if not getattr(stream, "closed", False):
            stream.synchronize()

    def trim(self, stream: Any) -> None:
        """Give the graph memory no remaining graph uses back to the driver (after graphs were closed)."""
        from ..cuda._util import rt  # deferred: CUDA only (class docstring)

        rt.cudaDeviceGraphMemTrim(stream.device_index)

    def scratch(self, stream: Any) -> Any:
        """The cuDNN workspace the captured work addresses, or None.

        It is cached per stream and replaced (the old one freed) when a larger one is needed, so a
        graph keeps a reference to the one it baked in.
        """
        from ..cudnn import workspace_buffer  # deferred: CUDA only (class docstring)

        return workspace_buffer(stream)

    def release_scratch(self) -> None:
        """Drop cached workspaces (one grew during a capture, so it is the graph's memory now)."""
        from ..cudnn import release_workspaces  # deferred: CUDA only (class docstring)

        release_workspaces()


class _Entry:
    """One step key: warm-up seen, static buffers, the graph and what a replay must do on the host."""

    __slots__ = ("key", "kind", "stream", "static_x", "static_y", "out", "out_spec", "graph", "eager",
                 "host_deltas", "refs")

    def __init__(self, key: tuple, kind: str, stream: Any) -> None:
        self.key = key
        self.kind = kind
        self.stream = stream
        self.static_x = self.static_y = self.out = None
        self.out_spec: "tuple | None" = None  # (shape, dtype) of a predict step's output, from the warm-up
        self.graph = None
        self.eager = False  # capture failed: this key always runs eagerly
        self.host_deltas: list[tuple[Any, str, Any]] = []
        self.refs: list = []

    @property
    def state(self) -> str:
        return "eager" if self.eager else ("captured" if self.graph is not None else "warm")


def _config_key() -> tuple:
    return kernels.config.capture_key()


def _is_multi(shape: Any) -> bool:
    """Whether ``shape`` is a tuple of shapes (several arrays) rather than one shape."""
    return bool(shape) and isinstance(shape[0], (tuple, list))


def _norm_shape(shape: Any) -> "tuple | None":
    if shape is None:
        return None
    return tuple(tuple(s) for s in shape) if _is_multi(shape) else tuple(shape)


def _spec(value: Any) -> tuple[Any, Any]:
    """``(shape, dtype)`` of an array, or of a tuple of arrays (tuples of shapes and dtypes)."""
    if value is None:
        return None, None
    if isinstance(value, tuple):
        return tuple(tuple(a.shape) for a in value), tuple(a.dtype for a in value)
    return tuple(value.shape), value.dtype


def _parts(value: Any) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def step_key(kind: str, stream_key: Any, x_shape: tuple, x_dtype: Any, y_shape: "tuple | None",
             y_dtype: Any) -> tuple:
    """The cache key of a step: its kind, stream, input/label shapes and dtypes (tuples of them for
    several arrays) and the ops switches that change which kernels run (a change there means a new
    warm-up and capture)."""
    return (kind, stream_key, _norm_shape(x_shape), x_dtype, _norm_shape(y_shape), y_dtype, _config_key())


class StepGraphs:
    """The graph cache of one model: at most ``max_graphs`` keys, least recently used dropped first.

    The model provides ``_eager_step(kind, x, y)``, ``_graph_signature()``, ``_host_counters()``
    (``(object, attribute)`` pairs the step advances in Python), ``_graph_refs()``,
    ``_before_launch(kind, stream)`` (uploads the learning rate if it changed), ``_flat_layers()``
    (whose ``grads`` a failed capture clears) and ``_discard_forward()`` (drops the recorded forward
    of a functional or subclassed model likewise): :class:`dnnbind.trainers.protocol.GraphStepped`.
    """

    def __init__(self, backend: Any = None, max_graphs: int = MAX_GRAPHS) -> None:
        if max_graphs < 1:
            raise ValueError(f"StepGraphs: max_graphs must be >= 1, got {max_graphs}")
        self.backend = backend if backend is not None else CudaGraphBackend()
        self.max_graphs = int(max_graphs)
        self.signature: Any = None
        self._entries: "OrderedDict[tuple, _Entry]" = OrderedDict()
        self._warned: set = set()
        self.stats = {"warmups": 0, "captures": 0, "replays": 0, "eager": 0, "failures": 0, "evictions": 0,
                      "clears": 0}

    # ----- inspection -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> list[tuple]:
        return list(self._entries)

    def states(self) -> dict[tuple, str]:
        """{key: "warm" | "captured" | "eager"} (tests and diagnostics)."""
        return {k: e.state for k, e in self._entries.items()}

    @property
    def graph_count(self) -> int:
        return sum(e.graph is not None for e in self._entries.values())

    # ----- invalidation -----------------------------------------------------------------------
    def clear(self) -> None:
        """Drop every key and close every graph (after the work queued on their streams finished,
        since a closed graph's memory may be reused at once)."""
        if not self._entries:
            self.signature = None
            return
        self._close(list(self._entries.values()))
        self._entries.clear()
        self.signature = None
        self.stats["clears"] += 1

    def _close(self, entries: list) -> None:
        streams: dict[int, Any] = {}
        for entry in entries:
            if entry.graph is None:
                continue
            if id(entry.stream) not in streams:
                streams[id(entry.stream)] = entry.stream
                try:
                    self.backend.synchronize(entry.stream)
                except Exception:  # a destroyed stream: its work is done or lost anyway
                    pass
            entry.graph.close()
            entry.graph = None
        for entry in entries:
            entry.refs = []
        for stream in streams.values():
            try:
                self.backend.trim(stream)
            except Exception:  # only an optimisation: the memory stays cached for later graphs
                pass

    def _check_signature(self, model: Any) -> None:
        sig = model._graph_signature()
        if sig != self.signature:
            self.clear()
            self.signature = sig

    def _add(self, key: tuple, kind: str, stream: Any) -> _Entry:
        entry = self._entries[key] = _Entry(key, kind, stream)
        while len(self._entries) > self.max_graphs:
            _, old = self._entries.popitem(last=False)
            self._close([old])
            self.stats["evictions"] += 1
        return entry

    # ----- static inputs ----------------------------------------------------------------------
    def static_inputs(self, model: Any, kind: str, x_shape: tuple, x_dtype: Any, y_shape: "tuple | None" = None,
                      y_dtype: Any = None) -> "tuple[Any, Any] | None":
        """``(static_x, static_y)`` that the next ``kind`` step with these shapes will read (so a batch
        can be gathered straight into them), or None when that step will not run from a graph."""
        if not model._graphs_enabled():
            return None
        stream = self.backend.current_stream()
        entry = self._entries.get(step_key(kind, self.backend.stream_key(stream), x_shape, x_dtype, y_shape,
                                           y_dtype))
        if entry is None or entry.eager:
            return None
        self._ensure_static(entry, x_shape, x_dtype, y_shape, y_dtype, stream)
        return entry.static_x, entry.static_y

    def _empty(self, shape: Any, dtype: Any, stream: Any) -> Any:
        if _is_multi(shape):
            return tuple(self.backend.empty(tuple(s), d, stream) for s, d in zip(shape, dtype))
        return self.backend.empty(tuple(shape), dtype, stream)

    def _ensure_static(self, entry: _Entry, x_shape, x_dtype, y_shape, y_dtype, stream) -> None:
        if entry.static_x is None:
            entry.static_x = self._empty(x_shape, x_dtype, stream)
        if y_shape is not None and entry.static_y is None:
            entry.static_y = self._empty(y_shape, y_dtype, stream)

    # ----- running a step ---------------------------------------------------------------------
    def run(self, model: Any, kind: str, x: Any, y: Any = None) -> Any:
        """Run one ``kind`` step on ``x``/``y``: eagerly (warm-up, failed capture), by capturing, or by
        replaying. Returns what the eager step returns (predict: a fresh output array)."""
        if kind not in KINDS:
            raise ValueError(f"StepGraphs.run: kind must be one of {KINDS}, got {kind!r}")
        backend = self.backend
        stream = backend.current_stream()
        self._check_signature(model)
        arrays = _parts(x) + (() if y is None else _parts(y))
        if not all(getattr(a, "is_contiguous", True) for a in arrays):
            self.stats["eager"] += 1
            return model._eager_step(kind, x, y)
        x_shape, x_dtype = _spec(x)
        y_shape, y_dtype = _spec(y)
        key = step_key(kind, backend.stream_key(stream), x_shape, x_dtype, y_shape, y_dtype)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._add(key, kind, stream)
            result = model._eager_step(kind, x, y)
            self.stats["warmups"] += 1
            if kind == "predict":
                entry.out_spec = _spec(result)
            # The key holds kernels.config.capture_key(), whose registered module switches appear when an op
            # module is first imported, which may be inside this first step: key the entry as the next
            # call of the same step will.
            settled = step_key(kind, backend.stream_key(stream), x_shape, x_dtype, y_shape, y_dtype)
            if settled != key:
                if self._entries.get(key) is entry:
                    del self._entries[key]
                stale = self._entries.pop(settled, None)
                if stale is not None and stale is not entry:
                    self._close([stale])
                self._entries[settled] = entry
                entry.key = key = settled
            # The warm-up may have built state (the optimizer's slots on the first step): graphs
            # captured before it would address the old buffers.
            sig = model._graph_signature()
            if sig != self.signature:
                self._close([e for e in self._entries.values() if e is not entry])
                for k in [k for k in self._entries if k != key]:
                    del self._entries[k]
                self.signature = sig
            return result
        self._entries.move_to_end(key)
        if entry.eager:
            self.stats["eager"] += 1
            return model._eager_step(kind, x, y)
        if entry.graph is None:
            return self._capture_and_launch(model, entry, stream, x, y)
        return self._replay(model, entry, stream, x, y)

    def _load_inputs(self, entry: _Entry, stream: Any, x: Any, y: Any) -> None:
        for static, value in ((entry.static_x, x), (entry.static_y, y)):
            if value is None or value is static:
                continue
            for dst, src in zip(_parts(static), _parts(value)):
                if src is not dst:
                    self.backend.copy(dst, src, stream)

    def _copy_out(self, entry: _Entry, stream: Any) -> Any:
        if isinstance(entry.out, tuple):
            return tuple(self.backend.copy_out(o, stream) for o in entry.out)
        return self.backend.copy_out(entry.out, stream)

    def _step_fn(self, model: Any, entry: _Entry) -> Callable[[], None]:
        sx, sy = entry.static_x, entry.static_y
        if entry.kind != "predict":
            return lambda: model._eager_step(entry.kind, sx, sy)

        def predict() -> None:
            # the output is written into a buffer made before the capture, so the graph frees
            # everything it allocates and its output outlives no replay
            result = model._eager_step("predict", sx, None)
            for src, dst in zip(_parts(result), _parts(entry.out)):
                kernels.copy(src, out=dst)

        return predict

    def _capture_and_launch(self, model: Any, entry: _Entry, stream: Any, x: Any, y: Any) -> Any:
        backend = self.backend
        self._ensure_static(entry, *_spec(x), *_spec(y), stream)
        if entry.kind == "predict" and entry.out is None:
            entry.out = self._empty(*entry.out_spec, stream)
        self._load_inputs(entry, stream, x, y)
        # uploads (the learning rate) cannot be captured: they happen now, before the capture
        model._before_launch(entry.kind, stream)
        counters = model._host_counters()
        before = [getattr(obj, attr) for obj, attr in counters]
        scratch = backend.scratch(stream)
        graph = None
        try:
            graph = backend.capture(stream, self._step_fn(model, entry))
            if backend.scratch(stream) is not scratch:
                # the workspace grew inside the capture: the cached one is graph memory now and
                # must not serve eager steps; drop it and capture again next time
                graph.close()
                graph = None
                backend.release_scratch()
                self._restore(model, counters, before)
                return model._eager_step(entry.kind, x, y)
            after = [getattr(obj, attr) for obj, attr in counters]
            # the capture ran the step's Python once: host counters already moved by one step
            entry.host_deltas = [(obj, attr, a - b) for (obj, attr), a, b in zip(counters, after, before) if a != b]
            backend.launch(graph, stream)
        except Exception as exc:
            if graph is not None:
                graph.close()
            self._restore(model, counters, before)
            entry.eager = True
            self.stats["failures"] += 1
            self._warn_failure(model, entry.kind, exc)
            return model._eager_step(entry.kind, x, y)
        entry.graph = graph
        entry.refs = [*model._graph_refs(), scratch, entry.static_x, entry.static_y, entry.out]
        self.stats["captures"] += 1
        return self._copy_out(entry, stream) if entry.kind == "predict" else None

    def _replay(self, model: Any, entry: _Entry, stream: Any, x: Any, y: Any) -> Any:
        self._load_inputs(entry, stream, x, y)
        model._before_launch(entry.kind, stream)
        self.backend.launch(entry.graph, stream)
        for obj, attr, delta in entry.host_deltas:
            setattr(obj, attr, getattr(obj, attr) + delta)
        self.stats["replays"] += 1
        return self._copy_out(entry, stream) if entry.kind == "predict" else None

    @staticmethod
    def _restore(model: Any, counters: list, before: list) -> None:
        for (obj, attr), value in zip(counters, before):
            setattr(obj, attr, value)
        # references a half-run step left behind point at memory of the discarded capture
        model._discard_forward()
        for layer in model._flat_layers():
            layer.grads = {}

    def _warn_failure(self, model: Any, kind: str, exc: BaseException) -> None:
        what = f"{type(exc).__name__}: {exc}"
        if (kind, what) in self._warned:
            return
        self._warned.add((kind, what))
        warnings.warn(
            f"{type(model).__name__} '{model.name}': the {kind} step could not be captured as a CUDA graph "
            f"({what}); steps of this shape run eagerly (slower on the host, same results). "
            "compile(..., jit_compile=False) runs every step eagerly and silences this.",
            RuntimeWarning, stacklevel=4)
