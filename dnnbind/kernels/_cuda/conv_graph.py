"""Convolutions (forward, backward data, backward filter), and two convolution + batch-norm fusions, as
cached cuDNN graph plans.

Why: cuDNN 9 rebuilds a backend graph inside every legacy call (``cudnnConvolutionForward`` /
``BackwardData`` / ``BackwardFilter``), which costs 45-120 us of host time per call on an H200; an
eager step of a small CNN is host-bound on it. Executing a finalized plan that is kept per shape
key costs a fraction of that, and heuristics A's engines run as fast as (or faster than) the legacy
algorithms ``cudnnFind`` picks. ``conv.py`` asks :func:`convolution` first on its channels-last,
groups-1 paths and makes its legacy call when this answers False.

One graph per direction, io dtype = the data's (float16 / bfloat16 / float32), compute float32,
NHWC data and KRSC filters, shapes as cuDNN sees them (x padded by ``pad2d`` when the padding is
asymmetric, exactly as for the legacy calls)::

    forward          y  = conv_fprop(x, w)        x (N, H, W, C), w (K, R, S, C) -> y (N, P, Q, K)
    backward_data    dx = conv_dgrad(dy, w)       dy (N, P, Q, K), w             -> dx (N, H, W, C)
    backward_filter  dw = conv_wgrad(x, dy)       x, dy                          -> dw (K, R, S, C)
    forward_genstats y  = conv_fprop(x, w),       x, w                           -> y, sum, sq_sum (1, 1, 1, K)
                     sum, sq_sum = genstats(y)    (float32: the batch-norm statistics in the conv's epilogue)

    backward_data_drelu_dbn                       dy, w, x (the batch norm's input), its saved mean and
                     dz = relu_backward(          1/std, gamma, beta (float32 (1, 1, 1, C))
                       conv_dgrad(dy, w), bn(x))  -> dz (N, H, W, C), and float32 (1, 1, 1, C): dscale, dbias
                     dbn_weight(dz, x, ...)       and eq_dy, eq_x, eq_b (dx = eq_dy * dz + eq_x * x + eq_b)

``forward_genstats`` serves ``conv_bn.py`` (a convolution followed by a training batch norm): its legacy
path is the convolution and the batch norm's own training call, and the graph path's time includes the
work that ``conv_bn.py`` runs after the plan (``tail``: the normalisation from the sums), so the two
paths compared do the same job. In heuristic mode it is tried for float16 only: on an H200 (cuDNN 9.19)
float16 is where a specialised engine runs conv + genstats in the time of the convolution alone
(0.90-1.09x over four ResNet/VGG shapes), while the bfloat16 and TF32 engines took 2.1-3.1x the
convolution's time, which the saved statistics pass does not repay; strict float32 has no engine.
``config.benchmark`` measures every dtype. ``backward_data_drelu_dbn`` (cuDNN's DgradDreluBNBwdWeight
pattern, MLPerf ResNet's backward) serves ``conv_bn.py``'s backward of conv(relu(batchnorm(x))) the same
way (legacy: the data gradient and the batch norm's backward with the relu; the tail: the dx kernel); on
the H200 only float16 has an engine for it (0.89-0.93x of the dgrad and the relu's backward alone).

**The choice, once per** :class:`ConvGraphKey` (direction, device, shapes, padding, stride,
dilation, dtype, ``allow_tf32``, ``benchmark``, ``workspace_limit``), made as ``fused.py`` makes
its own (with its timer and its refusal rule):

* ``config.benchmark`` False (heuristic): heuristics A's plan when it builds, fits
  ``workspace_limit`` and its first run is accepted; else the legacy path.
* ``config.benchmark`` True: the plans of heuristics A and B (each mode's first engine that
  finalizes) and the legacy path all run on the call's buffers, one warm-up and
  :data:`~.fused.BENCHMARK_REPS` runs each between CUDA events (synchronising once per key in the
  eager warm-up, as ``cudnnFind*AlgorithmEx`` does); the fastest plan wins when it is within
  :data:`~.fused.GRAPH_MARGIN` (2%) of the legacy path's time or faster, and every timing is kept in
  the :class:`~.fused.Choice` (``timings``). The timed runs queue behind a kernel that holds the
  stream, so the events time GPU work only, as a captured step replays it (eagerly, the plans are
  also the cheaper path on the host: ~20-35 us against 45-120 us a legacy call).

``config.deterministic``: every direction stays on the legacy path (whose algorithms ``algo.choose``
filters for determinism; the engines' numerical notes are not read here, and heuristics B may offer a
split-K engine), and no key is made. ``config.fused_graphs = False`` turns this path off (conv.py
checks it).

A refusal (:class:`~dnnbind.cudnn.graph.GraphNotSupportedError`, a "not supported" / "bad
parameter" status from a build or a first run) or a plan over ``workspace_limit`` is remembered for
the key, with one debug line on the ``dnnbind.kernels.conv_graph`` logger; other cuDNN errors raise.

**Capture and the host path.** Nothing is built, measured or first run while the stream is being
captured: an undecided key runs the legacy path for that call. A pointer not 16-byte aligned (what
the graph tensors declare) runs the legacy path for that call. A decided key costs one dict lookup
and :meth:`~dnnbind.cudnn.graph.Plan.execute` with raw pointer ints (the cheapest form: no shape or
dtype checks, the variant pack reused per pointer set by the plan); the workspace is the stream's
grow-only ``cudnn.workspace`` buffer, grown by the eager warm-up, so executing allocates nothing and
never synchronises. Choices hold their plans and are never evicted: a captured step graph may
replay a plan's runtime-compiled kernels, which die with the plan (cuDNN < 9.28).

Counters (:func:`stats`, per direction): ``graph`` / ``legacy`` calls, keys ``decided``,
``undecided_in_capture`` calls. :func:`cache_info` maps each key to its choice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...cudnn import graph as cgraph
from ...cudnn import workspace
from ...errors import CudnnError
from . import _common as cm
# fused.py's measurement and refusal rule, shared: every graph path decides the same way.
from .fused import ALIGNMENT, BENCHMARK_REPS, DTYPES, GRAPH_MARGIN, Choice, Choices
from .fused import _refusal as is_refusal
from .fused import _time_ms as time_ms

__all__ = ["ConvGraphKey", "DIRECTIONS", "HEURISTIC_MODES", "BENCHMARK_MODES", "GENSTATS_HEURISTIC_DTYPES",
           "FUSED_BN_DIRECTIONS",
           "FORCE_GRAPH", "conv_key", "convolution", "will_try", "decided",
           "cache_info", "stats", "clear_cache"]

_log = logging.getLogger("dnnbind.kernels.conv_graph")

# direction (the names algo.ConvKey uses) -> (graph operation, the tensor names bound in the x, w, y-role
# order of conv.py's buffers, the order algo.choose takes them in too)
DIRECTIONS = {
    "forward": ("conv_fprop", ("x", "w", "y")),
    "backward_data": ("conv_dgrad", ("dx", "w", "dy")),
    "backward_filter": ("conv_wgrad", ("x", "dw", "dy")),
    "forward_genstats": ("conv_fprop+genstats", ("x", "w", "y", "sum", "sq_sum")),
    "backward_data_drelu_dbn": ("dgrad+drelu+dbn_weight", ("dy", "w", "x", "mean", "inv_std", "gamma", "beta", "dz",
                                                           "dscale", "dbias", "eq_dy", "eq_x", "eq_b")),
}
FUSED_BN_DIRECTIONS = ("forward_genstats", "backward_data_drelu_dbn")
"""The directions of conv_bn.py (a convolution fused with a batch norm), tried unmeasured in
:data:`GENSTATS_HEURISTIC_DTYPES` only."""
GENSTATS_HEURISTIC_DTYPES = (cm.F16,)
"""The dtypes the :data:`FUSED_BN_DIRECTIONS` try without a measurement (see the module doc)."""
FORCE_GRAPH: bool = False
"""Tests: every key takes the first plan that builds and runs (heuristics A, then B), unmeasured, and
the :data:`FUSED_BN_DIRECTIONS` are tried in every dtype, so each graph path can be compared with the legacy one
where the measurement would not pick it. Clear the cache (:func:`clear_cache`) when flipping it."""
HEURISTIC_MODES = ("A",)
"""Heuristics trusted without a measurement (their first engine that finalizes)."""
BENCHMARK_MODES = ("A", "B")
"""Heuristics whose first engine is timed against the legacy path under ``config.benchmark``
(mode B's engine measured faster than A's and the legacy's for a first-layer wgrad on an H200)."""


@dataclass(frozen=True)
class ConvGraphKey:
    """What the choice for one convolution (or fused direction) depends on. Shapes are NHWC / KRSC, as cuDNN
    sees them."""

    direction: str  # a key of DIRECTIONS
    device: int
    x_shape: tuple  # (N, H, W, C), after explicit padding
    w_shape: tuple  # (K, R, S, C)
    y_shape: tuple  # (N, P, Q, K)
    pad: tuple  # (pad_h, pad_w), symmetric
    stride: tuple
    dilation: tuple
    dtype: np.dtype
    allow_tf32: bool
    benchmark: bool
    workspace_limit: "int | None"

    # Looked up on every call: hash the fields once.
    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.direction, self.device, self.x_shape, self.w_shape, self.pad,
                                                self.stride, self.dilation, self.dtype, self.allow_tf32,
                                                self.benchmark, self.workspace_limit)))

    def __hash__(self) -> int:
        return self._hash


_CHOICES = Choices(tuple(DIRECTIONS))


def conv_key(direction: str, device: int, x_dims: tuple, w_kcrs: tuple, y_dims: tuple, pad: tuple, stride: tuple,
             dilation: tuple, groups: int, dtype: np.dtype, layout: str) -> "ConvGraphKey | None":
    """The key of one convolution call, or None when no graph plan is tried for it: another layout
    than NHWC, groups > 1, a dtype without graph engines (float64), an empty tensor, or any direction
    under ``config.deterministic`` (the legacy choice keeps only algorithms cuDNN reports deterministic;
    a plan's engine, heuristics B's split-K ones included, is not checked). Dims arrive as conv.py holds them: x (N, C, H, W)
    as cuDNN sees it, w (K, C, R, S), y (N, K, P, Q). Reads the config's switches."""
    if direction not in DIRECTIONS:
        raise ValueError(f"conv_graph.conv_key: direction must be one of {sorted(DIRECTIONS)}, got {direction!r}")
    cfg = cm.config()
    if (layout != "NHWC" or groups != 1 or dtype not in DTYPES or not all(x_dims) or not all(w_kcrs)
            or not all(y_dims) or cfg.deterministic):
        return None
    if (direction in FUSED_BN_DIRECTIONS and not cfg.benchmark and not FORCE_GRAPH
            and dtype not in GENSTATS_HEURISTIC_DTYPES):
        return None
    n, c, h, w = x_dims
    k, _, r, s = w_kcrs
    _, _, p, q = y_dims
    return ConvGraphKey(direction=direction, device=device, x_shape=(n, h, w, c), w_shape=(k, r, s, c),
                        y_shape=(n, p, q, k), pad=tuple(pad), stride=tuple(stride), dilation=tuple(dilation),
                        dtype=dtype, allow_tf32=bool(cfg.allow_tf32), benchmark=bool(cfg.benchmark),
                        workspace_limit=cfg.workspace_limit)


def _graph(key: ConvGraphKey) -> "cgraph.Graph":
    op, _ = DIRECTIONS[key.direction]
    g = cgraph.Graph(io_dtype=key.dtype, compute_dtype="float32", layout="NHWC", name=op)
    conv = dict(padding=key.pad, stride=key.stride, dilation=key.dilation)
    if key.direction == "forward":
        g.conv_fprop(g.tensor("x", key.x_shape), g.tensor("w", key.w_shape), **conv).output("y")
    elif key.direction == "forward_genstats":
        y = g.conv_fprop(g.tensor("x", key.x_shape), g.tensor("w", key.w_shape), **conv).output("y")
        total, squares = g.genstats(y)
        total.output("sum")
        squares.output("sq_sum")
    elif key.direction == "backward_data_drelu_dbn":
        c = key.x_shape[3]
        stats = [g.tensor(name, (1, 1, 1, c), "float32") for name in ("mean", "inv_std", "gamma", "beta")]
        outs = g.dgrad_drelu_dbn_weight(g.tensor("dy", key.y_shape), g.tensor("w", key.w_shape),
                                        g.tensor("x", key.x_shape), *stats, **conv)
        for t, name in zip(outs, DIRECTIONS[key.direction][1][7:]):
            t.output(name)
    elif key.direction == "backward_data":
        g.conv_dgrad(g.tensor("dy", key.y_shape), g.tensor("w", key.w_shape), key.x_shape, **conv).output("dx")
    else:
        g.conv_wgrad(g.tensor("x", key.x_shape), g.tensor("dy", key.y_shape), key.w_shape, **conv).output("dw")
    return g


def _build(key: ConvGraphKey, handle: Any, mode: str) -> "cgraph.Plan":
    """The plan of heuristics ``mode``'s first engine that finalizes (through the process-wide plan cache)."""
    return _graph(key).build(handle, heuristics=(mode,), allow_tf32=key.allow_tf32)


def _run(plan: "cgraph.Plan", names: tuple, handle: Any, stream: Any, ptrs: tuple) -> None:
    # Raw ints: Plan.execute checks only their alignment and reuses the variant pack of this pointer set.
    if len(ptrs) == 3:
        tensors = {names[0]: ptrs[0], names[1]: ptrs[1], names[2]: ptrs[2]}
    else:
        tensors = dict(zip(names, ptrs))
    plan.execute(tensors, workspace(stream, plan.workspace_size), handle=handle)


def _decide(key: ConvGraphKey, handle: Any, stream: Any, ptrs: tuple, legacy: Callable[[], Any],
            tail: "Callable[[], Any] | None") -> Choice:
    names = DIRECTIONS[key.direction][1]
    plans, refused, over_limit = [], [], []
    measure = key.benchmark and not FORCE_GRAPH
    for mode in (BENCHMARK_MODES if key.benchmark or FORCE_GRAPH else HEURISTIC_MODES):
        try:
            plan = _build(key, handle, mode)
        except CudnnError as err:
            if not is_refusal(err):
                raise
            refused.append(f"heuristics {mode}: {err.status_name}: {err.detail}")
            continue
        if key.workspace_limit is not None and plan.workspace_size > key.workspace_limit:
            over_limit.append(f"{plan.engine} needs {plan.workspace_size} B of workspace, workspace_limit is "
                              f"{key.workspace_limit} B")
            continue
        plans.append(plan)
    timings = []
    for plan in list(plans):
        try:
            if measure:
                def graph_path(plan=plan):
                    _run(plan, names, handle, stream, ptrs)
                    if tail is not None:
                        tail()
                timings.append((plan.engine, time_ms(graph_path, stream, BENCHMARK_REPS)))
            else:
                _run(plan, names, handle, stream, ptrs)  # a first run cuDNN refuses falls back like a refused build
        except CudnnError as err:
            if not is_refusal(err):
                raise
            refused.append(f"{plan.engine} (first run): {err.status_name}: {err.detail}")
            plans.remove(plan)
    if not plans:
        reason = "; ".join(refused + over_limit)
        _log.debug("%s %s: no cuDNN graph plan (%s); legacy path", DIRECTIONS[key.direction][0], key, reason)
        return Choice(None, "refused" if refused else "workspace_limit", reason=reason)
    if not measure:
        return Choice(plans[0], "forced" if FORCE_GRAPH else "heuristic")
    legacy_ms = time_ms(legacy, stream, BENCHMARK_REPS)
    best, graph_ms = min(zip(plans, (ms for _, ms in timings)), key=lambda item: item[1])
    return Choice(best if graph_ms <= legacy_ms * GRAPH_MARGIN else None, "benchmark", graph_ms, legacy_ms,
                  reason="; ".join(refused + over_limit), timings=(*timings, ("legacy", legacy_ms)))


def convolution(key: ConvGraphKey, handle: Any, stream: Any, ptrs: "tuple[int, ...]",
                legacy: "Callable[[], Any] | None", tail: "Callable[[], Any] | None" = None) -> bool:
    """Run ``key``'s convolution as a graph plan when that is its choice: True when it ran.

    ``ptrs``: device pointers of the packed tensors in x, w, y-role order, as :data:`DIRECTIONS` names
    them (forward: x, w, y; backward_data: dx, w, dy; backward_filter: x, dw, dy), x / dx as cuDNN
    sees them (padded when the padding is explicit); the fused directions bind every name of their
    :data:`DIRECTIONS` entry, in that order.
    ``legacy()`` runs the legacy call into the same output (timed under ``config.benchmark``);
    ``tail()``, when given, is timed after each plan's run (the caller's work that the graph path adds).
    A caller may pass None for both when :func:`decided` said the key has its choice.
    False means the caller runs its legacy call: the key's choice is legacy, a pointer is not
    16-byte aligned (that call only), or the key is undecided while the stream is capturing (that
    call only: nothing is built or timed during a capture).
    """
    counts = _CHOICES.counts[key.direction]
    choice = _CHOICES.pending(key, stream, counts)
    if choice is False:
        return False
    if choice is None and legacy is None:  # the caller saw the key decided (a cache cleared since)
        counts["legacy"] += 1
        return False
    # One test for the pointers: an OR keeps every low bit any of them has.
    bits = ptrs[0] | ptrs[1] | ptrs[2]
    for extra in ptrs[3:]:
        bits |= extra
    if bits % ALIGNMENT:
        counts["legacy"] += 1
        return False
    if choice is None:
        choice = _CHOICES.settle(key, _decide(key, handle, stream, ptrs, legacy, tail), counts)
        if choice.plan is None:
            counts["legacy"] += 1
            return False
    _run(choice.plan, DIRECTIONS[key.direction][1], handle, stream, ptrs)
    counts["graph"] += 1
    return True


def decided(key: ConvGraphKey) -> bool:
    """Whether ``key`` has its choice (a caller builds its ``legacy`` / ``tail`` timers only when not)."""
    return key in _CHOICES.choices


def will_try(key: ConvGraphKey, stream: Any) -> bool:
    """False (and the call counted) when :func:`convolution` would run the legacy path whatever the
    pointers: ``key`` is decided for it, or undecided while ``stream`` is capturing. A caller that prepares
    buffers for the graph path asks this first."""
    return _CHOICES.pending(key, stream, _CHOICES.counts[key.direction]) is not False


def cache_info() -> "dict[ConvGraphKey, Choice]":
    """A copy of the choices made so far."""
    return _CHOICES.info()


def stats() -> "dict[str, dict[str, int]]":
    """A copy of the counters per direction: ``graph`` / ``legacy`` calls run, keys ``decided``,
    ``undecided_in_capture`` calls."""
    return _CHOICES.stats()


def clear_cache() -> None:
    """Forget every choice and zero the counters (tests; never while a captured graph still replays a plan)."""
    _CHOICES.clear()
