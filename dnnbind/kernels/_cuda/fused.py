"""Fused paths on the cuDNN graph API (:mod:`dnnbind.cudnn.graph`), chosen per shape key.

The first one: conv + bias + activation forward (``conv2d_bias_activation_forward``), one fused kernel
for channels-last (NHWC) float16 / bfloat16 / float32 data, relu or linear (conv + bias), groups 1:

    graph: y = act(conv_fprop(x, w) + b)      x (N, H, W, C), w (K, R, S, C), b (1, 1, 1, K), y (N, P, Q, K)
           io dtype = x's, compute and intermediates float32

The caller (``conv.py``) passes the geometry it already normalised: x's dims as cuDNN sees them (padded
when the padding is asymmetric; conv.py pads with ``pad2d`` as for its legacy calls), the symmetric
descriptor padding, stride and dilation.

**The choice, once per** :class:`ConvBiasActKey` (device, shapes, dtype, convolution parameters,
activation, ``allow_tf32``, ``benchmark``, ``workspace_limit``):

* ``config.benchmark`` False (heuristic): the graph plan when one of heuristics A's engines builds and
  its first run is accepted; else the legacy path (``Choice.source`` says why).
* ``config.benchmark`` True: the plan may also come from the "fallback" heuristics; both paths run on
  the real buffers, one warm-up and :data:`BENCHMARK_REPS` timed runs each between CUDA events on the
  call's stream (this synchronises, once per key, in the eager warm-up, as ``cudnnFind*AlgorithmEx``
  does for the algorithms); the graph wins when its time is at most :data:`GRAPH_MARGIN` (1.02)
  times the legacy path's. The timed runs are queued behind a kernel that holds the
  stream (``timing.cu``), so the events time GPU work only, as a captured step replays it.

A refusal (:class:`~dnnbind.cudnn.graph.GraphNotSupportedError`, or a cuDNN "not supported" / "bad
parameter" status from the build or the first run) is remembered for the key and costs one debug
line on the ``dnnbind.kernels.fused`` logger; the legacy path gives the same numbers. A plan that needs more
workspace than ``config.workspace_limit`` is not taken.

**Capture.** Plans are built, timed and first run only outside a CUDA-graph capture: a key first met
while its stream is capturing runs the legacy path for that call and is decided at the next eager call.
Executing a plan allocates nothing (the workspace is ``dnnbind.cudnn.workspace(stream, n)``, the
stream's grow-only buffer, already grown by the eager warm-up) and never synchronises. The choices hold
their :class:`~dnnbind.cudnn.graph.Plan` and are never evicted: a captured step graph may replay a
plan's runtime-compiled kernels, which die with the plan (cuDNN < 9.28). :func:`clear_cache` is for tests.

``config.fused_graphs = False`` (part of ``config.capture_key()``) turns every fused path off.
``config.deterministic`` is not in the key: a plan's forward is expected to repeat bit for bit, as the
legacy forward algorithms do (the GPU tests check two runs; the engines' notes are not read).

Counters (:func:`stats`): ``graph`` / ``legacy`` calls run, ``decided`` keys decided, ``undecided_in_capture``
calls that met an undecided key while capturing. :func:`cache_info` maps each key to its :class:`Choice`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...cuda import Event
from ...cudnn import graph as cgraph
from ...cudnn import workspace
from ...errors import CudnnError
from . import _common as cm

__all__ = ["ConvBiasActKey", "Choice", "Choices", "COUNTERS", "ACTIVATIONS", "DTYPES", "BENCHMARK_REPS", "ALIGNMENT",
           "conv_bias_activation_key", "conv_bias_activation", "cache_info", "stats", "clear_cache"]

_log = logging.getLogger("dnnbind.kernels.fused")

ACTIVATIONS = ("relu", "linear")
"""Activations the fused conv path builds; the layer's backward reads relu's mask from y (y > 0)."""
DTYPES = (cm.F16, cm.BF16, cm.F32)
"""Data dtypes tried on the graph API (float64 has no fused engine)."""
BENCHMARK_REPS = 5
"""Timed runs of each path per key under ``config.benchmark`` (after one warm-up run each)."""
ALIGNMENT = 16
"""Byte alignment every bound pointer must have (what the graph tensors declare); else the legacy path."""

# cuDNN statuses that mean "this engine/graph cannot run this configuration" (the legacy calls can).
_BAD_PARAM_RANGE = range(2000, 3000)
_NOT_SUPPORTED_RANGE = range(3000, 4000)


@dataclass(frozen=True)
class ConvBiasActKey:
    """What the fused conv + bias + activation choice depends on. Shapes are NHWC / KRSC."""

    device: int
    x_shape: tuple  # (N, H, W, C) as cuDNN sees it (after explicit padding)
    w_shape: tuple  # (K, R, S, C)
    pad: tuple  # (pad_h, pad_w), symmetric
    stride: tuple
    dilation: tuple
    dtype: np.dtype
    activation: str
    allow_tf32: bool
    benchmark: bool
    workspace_limit: "int | None"

    # Looked up on every fused call: hash the fields once.
    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.device, self.x_shape, self.w_shape, self.pad, self.stride,
                                                self.dilation, self.dtype, self.activation, self.allow_tf32,
                                                self.benchmark, self.workspace_limit)))

    def __hash__(self) -> int:
        return self._hash


@dataclass(frozen=True)
class Choice:
    """The path a key runs: ``plan`` (graph) or None (legacy), why (``source``), and the timings (ms).

    ``graph_ms`` is the fastest plan's time; ``timings`` lists every path measured under
    ``config.benchmark`` as ``(label, ms)`` pairs (a plan's label is its ``Plan.engine``; the legacy
    path's is ``"legacy"``), in the order they ran; ``conv_graph.py`` fills it, the fused path needs none.
    """

    plan: "cgraph.Plan | None"
    source: str  # "heuristic", "benchmark", "refused", "workspace_limit", "forced" (conv_graph.FORCE_GRAPH)
    graph_ms: "float | None" = None
    legacy_ms: "float | None" = None
    reason: str = ""
    timings: tuple = ()

    @property
    def path(self) -> str:
        return "legacy" if self.plan is None else "graph"


COUNTERS = ("graph", "legacy", "decided", "undecided_in_capture")


class Choices:
    """The per-key choices of one graph path and its call counters (one set per bucket), shared by
    ``fused.py`` and ``conv_graph.py``. Choices hold their plans and are never evicted: a captured step
    graph may replay a plan's runtime-compiled kernels, which die with the plan (cuDNN < 9.28)."""

    def __init__(self, buckets: "tuple[str, ...]") -> None:
        self.choices: dict = {}
        self.lock = threading.Lock()
        self.counts = {bucket: dict.fromkeys(COUNTERS, 0) for bucket in buckets}

    def pending(self, key: Any, stream: Any, counts: dict) -> "Choice | None | bool":
        """What a call of ``key`` does before its pointers are seen: False (counted) runs the legacy path (the
        key is decided for it, or undecided while ``stream`` is capturing: nothing is built or timed in a
        capture); None: undecided; a Choice: run its plan."""
        choice = self.choices.get(key)
        if choice is None:
            if stream.is_capturing():
                counts["undecided_in_capture"] += 1
                return False
            return None
        if choice.plan is None:
            counts["legacy"] += 1
            return False
        return choice

    def settle(self, key: Any, choice: Choice, counts: dict) -> Choice:
        """Keep ``choice`` for ``key`` unless another thread decided it meanwhile; returns the one kept."""
        with self.lock:
            kept = self.choices.setdefault(key, choice)
            if kept is choice:
                counts["decided"] += 1
        return kept

    def info(self) -> dict:
        with self.lock:
            return dict(self.choices)

    def stats(self) -> "dict[str, dict[str, int]]":
        return {bucket: dict(counts) for bucket, counts in self.counts.items()}

    def clear(self) -> None:
        with self.lock:
            self.choices.clear()
            for counts in self.counts.values():
                for name in counts:
                    counts[name] = 0


_CHOICES = Choices(("conv_bias_activation",))


def conv_bias_activation_key(device: int, x_dims: tuple, w_kcrs: tuple, pad: tuple, stride: tuple,
                             dilation: tuple, groups: int, dtype: np.dtype, activation: str,
                             layout: str) -> "ConvBiasActKey | None":
    """The key of a conv + bias + activation call, or None when no fused graph applies (layout,
    dtype, activation, groups, an empty tensor). Dims arrive as conv.py holds them: x (N, C, H, W)
    as cuDNN sees it, w (K, C, R, S)."""
    if (layout != "NHWC" or groups != 1 or activation not in ACTIVATIONS or dtype not in DTYPES
            or not all(x_dims) or not all(w_kcrs)):
        return None
    cfg = cm.config()
    n, c, h, w = x_dims
    k, _, r, s = w_kcrs
    return ConvBiasActKey(device=device, x_shape=(n, h, w, c), w_shape=(k, r, s, c), pad=tuple(pad),
                          stride=tuple(stride), dilation=tuple(dilation), dtype=dtype, activation=activation,
                          allow_tf32=bool(cfg.allow_tf32), benchmark=bool(cfg.benchmark),
                          workspace_limit=cfg.workspace_limit)


def _graph(key: ConvBiasActKey) -> "cgraph.Graph":
    g = cgraph.Graph(io_dtype=key.dtype, compute_dtype="float32", layout="NHWC",
                     name=f"conv_bias_{key.activation}")
    x = g.tensor("x", key.x_shape)
    w = g.tensor("w", key.w_shape)
    b = g.tensor("b", (1, 1, 1, key.w_shape[0]))
    y = g.bias(g.conv_fprop(x, w, padding=key.pad, stride=key.stride, dilation=key.dilation), b)
    if key.activation == "relu":
        y = g.relu(y)
    y.output("y")
    return g


def _build(key: ConvBiasActKey, handle: Any) -> "cgraph.Plan":
    """The plan of ``key`` (through the process-wide plan cache); raises what the builder raises.

    Heuristic mode trusts only heuristics A's ranked engines; a measured key may also take what the
    "fallback" heuristics offer, since the timing judges it.
    """
    modes = ("A", "fallback") if key.benchmark else ("A",)
    return _graph(key).build(handle, heuristics=modes, allow_tf32=key.allow_tf32)


def _run(plan: "cgraph.Plan", handle: Any, stream: Any, ptrs: "tuple[int, int, int, int]") -> None:
    x, w, b, y = ptrs
    ws = workspace(stream, plan.workspace_size) if plan.workspace_size else None
    plan.execute({"x": x, "w": w, "b": b, "y": y}, workspace=ws, handle=handle)


def _refusal(err: CudnnError) -> bool:
    return isinstance(err, cgraph.GraphNotSupportedError) or err.status in _NOT_SUPPORTED_RANGE \
        or err.status in _BAD_PARAM_RANGE


GRAPH_MARGIN = 1.02
"""A graph plan is taken when its measured GPU time is at most this factor times the legacy path's: within
2% the GPU times are a tie (they were within 1% for most of airbench's convolutions on the H200, either way
from run to run), and a plan costs ~25 us of host time per call against 45-120 us for a legacy cuDNN call,
which is what an eager step is bound by."""

HOLD_NS = 2_000_000
"""How long (ns) the stream is held before the timed runs: longer than the host needs to queue
:data:`BENCHMARK_REPS` runs of any path (a legacy convolution call costs up to ~120 us of host time)."""


def _time_ms(fn: Callable[[], Any], stream: Any, reps: int) -> float:
    """Mean GPU milliseconds of ``fn()`` on ``stream`` over ``reps`` runs after one warm-up (synchronises).

    The runs are queued behind a kernel that holds the stream for :data:`HOLD_NS`, so they execute back
    to back and the events time the GPU work alone: the choice is made for the captured step, which
    replays with no host gaps. (Eagerly the graph paths are also the cheaper ones on the host.)
    """
    fn()
    start, end = Event(device=stream.device_index), Event(device=stream.device_index)
    cm.launch_rows("timing.cu", "hold_stream", 1, (np.int64(HOLD_NS),), stream, block=1)
    start.record(stream)
    for _ in range(reps):
        fn()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end) / reps


def _decide(key: ConvBiasActKey, handle: Any, stream: Any, ptrs: tuple, legacy: Callable[[], Any]) -> Choice:
    try:
        plan = _build(key, handle)
        if key.workspace_limit is not None and plan.workspace_size > key.workspace_limit:
            return Choice(None, "workspace_limit", reason=f"plan needs {plan.workspace_size} B of workspace, "
                                                          f"workspace_limit is {key.workspace_limit} B")
        if not key.benchmark:
            _run(plan, handle, stream, ptrs)  # a first run cuDNN refuses falls back like a refused build
            return Choice(plan, "heuristic")
        graph_ms = _time_ms(lambda: _run(plan, handle, stream, ptrs), stream, BENCHMARK_REPS)
    except CudnnError as err:
        if not _refusal(err):
            raise
        _log.debug("conv2d_bias_activation_forward %s: no fused cuDNN graph (%s: %s); legacy path", key,
                   err.status_name, err.detail)
        return Choice(None, "refused", reason=f"{err.status_name}: {err.detail}")
    legacy_ms = _time_ms(legacy, stream, BENCHMARK_REPS)
    return Choice(plan if graph_ms <= legacy_ms * GRAPH_MARGIN else None, "benchmark", graph_ms, legacy_ms)


def conv_bias_activation(key: ConvBiasActKey, handle: Any, stream: Any, x_in: Callable[[], Any], w_ptr: int,
                         b_ptr: int, y_ptr: int, legacy: Callable[[], Any]) -> bool:
    """Run the fused graph into y when ``key``'s choice is the graph: True when it ran.

    ``x_in()`` gives x as cuDNN sees it (padded when the padding is explicit; called only when the graph
    runs or is measured, and held until its work is queued); ``w_ptr``/``b_ptr``/``y_ptr`` are device
    pointers of packed KRSC w, (K,) b and NHWC y. ``legacy()`` runs the unfused path into the same y
    (timed under ``config.benchmark``). False means the caller runs ``legacy()``: the key's choice is
    the legacy path, a pointer is not 16-byte aligned (that call only), or the key is undecided while
    the stream is capturing (that call only: nothing is built or timed during a capture).
    """
    counts = _CHOICES.counts["conv_bias_activation"]
    choice = _CHOICES.pending(key, stream, counts)
    if choice is False:
        return False
    xin = x_in()
    ptrs = (xin.ptr, w_ptr, b_ptr, y_ptr)
    if (ptrs[0] | w_ptr | b_ptr | y_ptr) % ALIGNMENT:
        counts["legacy"] += 1
        return False
    if choice is None:
        choice = _CHOICES.settle(key, _decide(key, handle, stream, ptrs, legacy), counts)
        if choice.plan is None:
            counts["legacy"] += 1
            return False
    _run(choice.plan, handle, stream, ptrs)
    counts["graph"] += 1
    return True


def cache_info() -> "dict[ConvBiasActKey, Choice]":
    """A copy of the choices made so far."""
    return _CHOICES.info()


def stats() -> dict:
    """A copy of the counters: ``graph``/``legacy`` calls run, keys ``decided``, ``undecided_in_capture`` calls."""
    return _CHOICES.stats()["conv_bias_activation"]


def clear_cache() -> None:
    """Forget every choice and zero the counters (tests; never while a captured graph still replays a plan)."""
    _CHOICES.clear()
