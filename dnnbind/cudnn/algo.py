"""Convolution algorithm choice, cached per key (what ``dnnbind.kernels.conv2d_*`` run with).

Two modes, picked by the key's ``benchmark`` (``dnnbind.kernels.config.benchmark``):

* heuristic (default): ``cudnnGetConvolution*Algorithm_v7`` ranks the algorithms
  without running anything;
* benchmark: ``cudnnFindConvolution*AlgorithmEx`` times them once per key on the
  real buffers (it synchronises, so it must run before any CUDA-graph capture: a
  key first seen while the stream is capturing is an error, not a silent sync).

Either way the first candidate that succeeded, fits the workspace cap
(``key.workspace_limit``), honours ``key.deterministic`` and the math rules
(no tensor-op math for strict fp32, ``MathType.FMA_MATH``) wins. The key holds
everything that changes the answer: device, direction, shapes, dtype, layout,
convolution parameters, math, workspace cap, deterministic, benchmark.

When the workspace the chosen algorithm needs cannot be allocated,
:func:`run_with_workspace` warns once per key and runs :func:`fallback`, the best
algorithm of the same key that needs no workspace at all.

The choices live in a bounded cache (:data:`CACHE_SIZE` keys; :func:`cache_info`,
:func:`clear_cache`). A choice holds its :class:`~dnnbind.cudnn.ConvolutionDescriptor`
(the math type the algorithm was ranked with), shared through
``ConvolutionDescriptor.cached``.
"""

from __future__ import annotations

import ctypes
import warnings
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Callable

import numpy as np

from .._lib import cudnn as C
from .._validate import BFLOAT16
from ..errors import DeviceOutOfMemoryError
from .._cache import LRUCache
from ._descriptors import ConvolutionDescriptor, FilterDescriptor, TensorDescriptor, _require
from ._handle import Handle, require_handle
from ._workspace import workspace

__all__ = ["ConvKey", "AlgoChoice", "math_for", "conv_desc", "choose", "fallback", "run_with_workspace", "workspace_size",
           "is_acceptable", "exec_math", "clear_cache", "cache_info", "CACHE_SIZE"]

CACHE_SIZE = 1024
"""Algorithm choices kept (one per key: direction, shapes, dtype, parameters, switches)."""

_TENSOR_OP_MATHS = (C.MathType.TENSOR_OP_MATH, C.MathType.TENSOR_OP_MATH_ALLOW_CONVERSION)
_MAX_ALGOS = 16  # more than any direction has (8 / 6 / 7)


@dataclass(frozen=True)
class ConvKey:
    """Everything the algorithm choice depends on. Dims are (N, C, H, W) / (K, C/g, R, S)."""

    direction: str  # "forward", "backward_data" or "backward_filter"
    device: int
    x_dims: tuple
    w_dims: tuple
    y_dims: tuple
    dtype: str
    layout: str
    pad: tuple  # (pad_h, pad_w) given to the descriptor (0 when padded explicitly)
    stride: tuple
    dilation: tuple
    groups: int
    math: C.MathType  # the descriptor's math type (FMA_MATH for strict fp32)
    workspace_limit: "int | None"
    deterministic: bool
    benchmark: bool

    # Keys are looked up in the cache on every convolution: hash the 15 fields once.
    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.direction, self.device, self.x_dims, self.w_dims,
                                                self.y_dims, self.dtype, self.layout, self.pad, self.stride,
                                                self.dilation, self.groups, self.math, self.workspace_limit,
                                                self.deterministic, self.benchmark)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    @property
    def compute_dtype(self) -> str:
        """Accumulation type of the convolution descriptor: float64 for float64 data, else float32."""
        return "float64" if self.dtype == "float64" else "float32"


@dataclass(frozen=True)
class AlgoChoice:
    """The algorithm to run, the convolution descriptor to run it with, and its workspace (bytes)."""

    algo: IntEnum  # ConvolutionFwdAlgo / ConvolutionBwdDataAlgo / ConvolutionBwdFilterAlgo
    math: C.MathType
    workspace: int
    conv_desc: ConvolutionDescriptor
    deterministic: bool
    source: str  # "heuristic", "benchmark", "fallback" or "fixed"
    conv: int = field(init=False, compare=False, repr=False)
    """``conv_desc``'s raw handle, read once (the convolution passes it on every call)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "conv", self.conv_desc.handle)

    @property
    def name(self) -> str:
        """The algorithm's cuDNN name without its prefix (``IMPLICIT_PRECOMP_GEMM``, ``ALGO_1``)."""
        return getattr(self.algo, "name", str(self.algo))


# direction -> (algorithm enum, perf struct, heuristic fn, find fn, workspace-size fn)
_DIRECTION = {
    "forward": (C.ConvolutionFwdAlgo, C.ConvolutionFwdAlgoPerf, "cudnnGetConvolutionForwardAlgorithm_v7",
                "cudnnFindConvolutionForwardAlgorithmEx", "cudnnGetConvolutionForwardWorkspaceSize"),
    "backward_data": (C.ConvolutionBwdDataAlgo, C.ConvolutionBwdDataAlgoPerf,
                      "cudnnGetConvolutionBackwardDataAlgorithm_v7", "cudnnFindConvolutionBackwardDataAlgorithmEx",
                      "cudnnGetConvolutionBackwardDataWorkspaceSize"),
    "backward_filter": (C.ConvolutionBwdFilterAlgo, C.ConvolutionBwdFilterAlgoPerf,
                        "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                        "cudnnFindConvolutionBackwardFilterAlgorithmEx",
                        "cudnnGetConvolutionBackwardFilterWorkspaceSize"),
}

_choices = LRUCache(CACHE_SIZE, "convolution algorithms")
_fallbacks = LRUCache(CACHE_SIZE, "no-workspace convolution algorithms")
_warned: set = set()  # ConvKeys whose workspace shortfall was reported


def _algo(direction: str, value: int) -> Any:
    try:
        return _DIRECTION[direction][0](value)
    except ValueError:  # an algorithm newer than the declared enum
        return int(value)


def math_for(dtype: Any, allow_tf32: bool) -> C.MathType:
    """The descriptor math type for data of ``dtype``: tensor ops for float16/bfloat16; for float32
    TF32 when ``allow_tf32`` (``DEFAULT_MATH``) and strict FMA otherwise; float64 has no tensor-op path."""
    dtype = np.dtype(dtype)
    if dtype == np.float16 or dtype == BFLOAT16:
        return C.MathType.TENSOR_OP_MATH
    if dtype == np.float32:
        return C.MathType.DEFAULT_MATH if allow_tf32 else C.MathType.FMA_MATH
    return C.MathType.DEFAULT_MATH


def conv_desc(key: ConvKey, math: int) -> ConvolutionDescriptor:
    """The cross-correlation descriptor of ``key`` with ``math`` (cuDNN's 'convolution' is not what
    deep learning means)."""
    return ConvolutionDescriptor.cached(key.pad, key.stride, key.dilation, key.groups, key.compute_dtype,
                                        C.MathType(math))


def _in_c_order(direction: str, x: Any, w: Any, y: Any, conv: Any) -> tuple:
    """The (x, w, y, conv) arguments in each direction's C order."""
    if direction == "forward":
        return (x, w, conv, y)
    if direction == "backward_data":
        return (w, y, conv, x)  # w, dy, conv, dx
    return (x, y, conv, w)  # x, dy, conv, dw


def workspace_size(direction: str, handle: Handle, x_desc: TensorDescriptor, w_desc: FilterDescriptor,
                   y_desc: TensorDescriptor, conv_desc: ConvolutionDescriptor, algo: int) -> "int | None":
    """Workspace bytes ``algo`` needs for this convolution, or None when cuDNN says it cannot run it."""
    size = ctypes.c_size_t()
    descs = _in_c_order(direction, x_desc.handle, w_desc.handle, y_desc.handle, conv_desc.handle)
    # A non-zero status is an answer here ("this algorithm cannot run"), so the raw function.
    status = C.raw(_DIRECTION[direction][4])(handle.handle, *descs, int(algo), ctypes.byref(size))
    return None if status else int(size.value)


def is_acceptable(perf_math: int, key: ConvKey) -> bool:
    """Strict fp32 refuses tensor-op (TF32) algorithms."""
    return not (key.math == C.MathType.FMA_MATH and perf_math in _TENSOR_OP_MATHS)


def exec_math(perf_math: int, key: ConvKey) -> C.MathType:
    """The math type to run with: strict fp32 keeps FMA; otherwise what the algorithm reported.

    cuDNN >= 7.4 decides on tensor cores from (algorithm, math type) together, so the
    descriptor must carry the math type the perf result was measured with.
    """
    return C.MathType.FMA_MATH if key.math == C.MathType.FMA_MATH else C.MathType(perf_math)


def _context(key: ConvKey) -> dict:
    return dict(direction=key.direction, x=key.x_dims, w=key.w_dims, y=key.y_dims, dtype=key.dtype,
                layout=key.layout, pad=key.pad, stride=key.stride, dilation=key.dilation, groups=key.groups)


def _query(key: ConvKey, handle: Handle, x_desc: TensorDescriptor, w_desc: FilterDescriptor,
           y_desc: TensorDescriptor, stream: Any, buffers: "tuple[int, int, int] | None") -> list:
    """Perf results, best first: from the heuristics, or measured (benchmark mode)."""
    _, perf_type, get_fn, find_fn, _ = _DIRECTION[key.direction]
    perfs = (perf_type * _MAX_ALGOS)()
    count = ctypes.c_int()
    base = conv_desc(key, key.math)
    x, w, y, conv = x_desc.handle, w_desc.handle, y_desc.handle, base.handle
    if not key.benchmark:
        C.call(get_fn, handle.handle, *_in_c_order(key.direction, x, w, y, conv), _MAX_ALGOS, ctypes.byref(count),
               perfs, context=lambda: _context(key))
        return list(perfs[: count.value])
    if stream.is_capturing():
        raise RuntimeError(
            f"conv2d {key.direction}: dnnbind.kernels.config.benchmark is on and this shape key was never seen "
            "before, but the stream is capturing a CUDA graph, where cudnnFind*AlgorithmEx cannot run. "
            "Run one eager step with the same shapes before capturing."
        )
    if buffers is None:
        raise ValueError(f"conv2d {key.direction}: benchmark mode needs the (x, w, y) buffers to time on")
    # Scratch as large as the largest workspace any algorithm asks for, within the cap.
    need = 0
    for algo in range(_MAX_ALGOS):
        size = workspace_size(key.direction, handle, x_desc, w_desc, y_desc, base, algo)
        if size is not None:
            need = max(need, size)
    if key.workspace_limit is not None:
        need = min(need, key.workspace_limit)
    try:
        ws_ptr = workspace(stream, need)
    except DeviceOutOfMemoryError:
        need, ws_ptr = 0, 0
    x_ptr, w_ptr, y_ptr = buffers
    d = _in_c_order(key.direction, x, w, y, conv)
    p = _in_c_order(key.direction, x_ptr, w_ptr, y_ptr, None)
    C.call(find_fn, handle.handle, d[0], p[0], d[1], p[1], d[2], d[3], p[3], _MAX_ALGOS, ctypes.byref(count), perfs,
           ws_ptr, need, context=lambda: _context(key))
    return list(perfs[: count.value])


def choose(key: ConvKey, handle: Handle, x_desc: TensorDescriptor, w_desc: FilterDescriptor,
           y_desc: TensorDescriptor, stream: Any, buffers: "tuple[int, int, int] | None" = None) -> AlgoChoice:
    """The cached choice for ``key``; the first call per key asks cuDNN.

    ``x_desc``/``w_desc``/``y_desc`` describe ``key``'s x (dx), w (dw) and y (dy) in its layout;
    ``stream`` is the :class:`dnnbind.cuda.Stream` the convolution runs on. ``buffers`` are the
    (x, w, y) device pointers, needed only in benchmark mode, where cuDNN writes the output
    buffer while timing.
    """
    choice = _choices.get(key)
    if choice is not None:
        return choice
    _check(handle, x_desc, w_desc, y_desc, "choose")
    perfs = _query(key, handle, x_desc, w_desc, y_desc, stream, buffers)
    source = "benchmark" if key.benchmark else "heuristic"
    chosen = None
    for perf in perfs:
        if perf.status != C.Status.SUCCESS or not is_acceptable(perf.mathType, key):
            continue
        if key.deterministic and perf.determinism != C.Determinism.DETERMINISTIC:
            continue
        math = exec_math(perf.mathType, key)
        conv = conv_desc(key, math)
        size = workspace_size(key.direction, handle, x_desc, w_desc, y_desc, conv, perf.algo)
        if size is None or (key.workspace_limit is not None and size > key.workspace_limit):
            continue
        chosen = AlgoChoice(_algo(key.direction, perf.algo), math, size, conv,
                            perf.determinism == C.Determinism.DETERMINISTIC, source)
        break
    if chosen is None:
        chosen = fallback(key, handle, x_desc, w_desc, y_desc, perfs)
    return _choices.put(key, chosen)


def _check(handle: Any, x_desc: Any, w_desc: Any, y_desc: Any, what: str) -> None:
    require_handle(handle, f"algo.{what}")
    _require(x_desc, TensorDescriptor, f"algo.{what}", "x_desc")
    _require(w_desc, FilterDescriptor, f"algo.{what}", "w_desc")
    _require(y_desc, TensorDescriptor, f"algo.{what}", "y_desc")


def fallback(key: ConvKey, handle: Handle, x_desc: TensorDescriptor, w_desc: FilterDescriptor,
             y_desc: TensorDescriptor, perfs: "list | None" = None) -> AlgoChoice:
    """The best algorithm of ``key`` that needs no workspace (cached).

    Candidates are the perf results in cuDNN's order (``perfs``, else asked from the
    heuristics); determinism and the math rules still apply. Raises RuntimeError when no
    such algorithm exists for this configuration.
    """
    hit = _fallbacks.get(key)
    if hit is not None:
        return hit
    _check(handle, x_desc, w_desc, y_desc, "fallback")
    if not perfs:
        _, perf_type, get_fn, _, _ = _DIRECTION[key.direction]
        found = (perf_type * _MAX_ALGOS)()
        count = ctypes.c_int()
        base = conv_desc(key, key.math)
        descs = _in_c_order(key.direction, x_desc.handle, w_desc.handle, y_desc.handle, base.handle)
        # No ranking is an answer too (no candidate): the RuntimeError below says what to change.
        status = C.raw(get_fn)(handle.handle, *descs, _MAX_ALGOS, ctypes.byref(count), found)
        perfs = list(found[: count.value]) if status == C.Status.SUCCESS else []
    for perf in perfs:
        if perf.status != C.Status.SUCCESS or not is_acceptable(perf.mathType, key):
            continue
        deterministic = perf.determinism == C.Determinism.DETERMINISTIC
        if key.deterministic and not deterministic:
            continue
        math = exec_math(perf.mathType, key)
        conv = conv_desc(key, math)
        if workspace_size(key.direction, handle, x_desc, w_desc, y_desc, conv, perf.algo) == 0:
            return _fallbacks.put(key, AlgoChoice(_algo(key.direction, perf.algo), math, 0, conv, deterministic,
                                                  "fallback"))
    raise RuntimeError(
        f"conv2d {key.direction}: no cuDNN algorithm fits (workspace limit {key.workspace_limit} bytes, "
        f"deterministic={key.deterministic}, math={C.MathType(key.math).name}) for x={key.x_dims} w={key.w_dims} "
        f"y={key.y_dims} {key.dtype} {key.layout} pad={key.pad} stride={key.stride} "
        f"dilation={key.dilation} groups={key.groups}. Raise dnnbind.kernels.config.workspace_limit or turn "
        "off deterministic mode."
    )


def run_with_workspace(key: ConvKey, choice: AlgoChoice, stream: Any, handle: Handle, x_desc: TensorDescriptor,
                       w_desc: FilterDescriptor, y_desc: TensorDescriptor,
                       call: Callable[[AlgoChoice, int], None]) -> AlgoChoice:
    """Get the workspace for ``choice`` on ``stream`` and ``call(choice, workspace_ptr)``; returns what ran.

    If growing the workspace runs out of device memory, warn once per key and run the
    no-workspace fallback instead (and remember it for the key).
    """
    try:
        ws = workspace(stream, choice.workspace)
    except DeviceOutOfMemoryError as exc:
        alt = fallback(key, handle, x_desc, w_desc, y_desc)
        if key not in _warned:
            _warned.add(key)
            warnings.warn(
                f"conv2d {key.direction}: not enough device memory for the {choice.workspace:,}-byte workspace of "
                f"algorithm {choice.name} ({exc.__class__.__name__}); falling back to {alt.name}, which needs no "
                f"workspace and may be slower. x={key.x_dims} w={key.w_dims} {key.dtype} {key.layout}",
                RuntimeWarning, stacklevel=3)
        _choices.put(key, alt)
        call(alt, 0)
        return alt
    call(choice, ws)
    return choice


def clear_cache() -> None:
    """Forget every choice (the next call per key asks cuDNN again)."""
    _choices.clear()
    _fallbacks.clear()


def cache_info() -> "dict[ConvKey, AlgoChoice]":
    """{key: choice} of the choices kept now (a copy; for tests and diagnostics)."""
    return dict(_choices.items())
