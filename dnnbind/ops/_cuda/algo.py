"""Convolution algorithm choice, cached per key.

Two modes, picked by ``dnnbind.ops.config.benchmark``:

* heuristic (default): ``cudnnGetConvolution*Algorithm_v7`` ranks the algorithms
  without running anything;
* benchmark: ``cudnnFindConvolution*AlgorithmEx`` times them once per key on the
  real buffers (it synchronises, so it must run before any CUDA-graph capture: a
  key first seen while the stream is capturing is an error, not a silent sync).

Either way the first candidate that succeeded, fits the workspace cap
(``config.workspace_limit``), honours ``config.deterministic`` and the math rules
(no tensor-op math for fp32 when ``config.allow_tf32`` is False) wins. The cache
key holds everything that changes the answer: device, direction, shapes, dtype,
layout, convolution parameters, math, workspace cap, deterministic, benchmark.

When the workspace the chosen algorithm needs cannot be allocated, :func:`fallback`
gives the best algorithm of the same key that needs no workspace at all (the caller
warns once per key).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Callable

from ..._lib import cudnn as C
from . import _common as cm

__all__ = ["ConvKey", "AlgoChoice", "choose", "fallback", "clear_cache", "cache_info",
           "MATH_DEFAULT", "MATH_TENSOR_OP", "MATH_TENSOR_OP_ALLOW_CONVERSION", "MATH_FMA"]

# cudnnMathType_t
MATH_DEFAULT = 0  # fp32: TF32 tensor cores allowed (cuDNN >= 8 on Ampere and newer)
MATH_TENSOR_OP = 1
MATH_TENSOR_OP_ALLOW_CONVERSION = 2
MATH_FMA = 3  # fp32: FMA only, strict IEEE fp32
_TENSOR_OP_MATHS = (MATH_TENSOR_OP, MATH_TENSOR_OP_ALLOW_CONVERSION)

# direction -> (heuristic fn, find fn, workspace-size fn, perf struct, max-count fn, algo names)
_FWD_NAMES = ("IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING",
              "WINOGRAD", "WINOGRAD_NONFUSED")
_BWD_DATA_NAMES = ("ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED")
_BWD_FILTER_NAMES = ("ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING")

@dataclass(frozen=True)
class ConvKey:
    """Everything the algorithm choice depends on. Dims are (N, C, H, W) / (K, C/g, R, S)."""

    direction: str
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
    math: int  # the descriptor's math type (MATH_FMA for strict fp32)
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


@dataclass(frozen=True)
class AlgoChoice:
    """The algorithm to run, the convolution descriptor to run it with, and its workspace."""

    algo: int
    math: int
    workspace: int
    conv_desc: int
    deterministic: bool
    source: str  # "heuristic", "benchmark" or "fallback"

    def name(self, direction: str) -> str:
        names = {"forward": _FWD_NAMES, "backward_data": _BWD_DATA_NAMES,
                 "backward_filter": _BWD_FILTER_NAMES}[direction]
        return names[self.algo] if 0 <= self.algo < len(names) else str(self.algo)


_cache: dict[ConvKey, AlgoChoice] = {}
_fallbacks: dict[ConvKey, AlgoChoice] = {}
_conv_descs: dict[tuple, Any] = {}


def conv_desc(pad: tuple, stride: tuple, dilation: tuple, groups: int, compute_dtype, math: int) -> int:
    """A cached cross-correlation descriptor (cuDNN's 'convolution' is not what DL frameworks mean)."""
    key = (pad, stride, dilation, groups, cm.cudnn_dtype(compute_dtype), math)

    def setup(handle: int) -> None:
        cm.cudnn_call("cudnnSetConvolution2dDescriptor", handle, pad[0], pad[1], stride[0], stride[1],
                      dilation[0], dilation[1], 1, key[4],  # 1: CUDNN_CROSS_CORRELATION
                      pad=pad, stride=stride, dilation=dilation)
        cm.cudnn_call("cudnnSetConvolutionGroupCount", handle, groups, groups=groups)
        cm.cudnn_call("cudnnSetConvolutionMathType", handle, math, math=math)

    return cm.cached_descriptor(_conv_descs, key, "cudnnCreateConvolutionDescriptor",
                                "cudnnDestroyConvolutionDescriptor", setup)


def math_for(dtype) -> int:
    """The descriptor math type for ``dtype`` under the current config."""
    if dtype in (cm.F16, cm.BF16):
        return MATH_TENSOR_OP
    if dtype == cm.F32:
        return MATH_DEFAULT if cm.config().allow_tf32 else MATH_FMA
    return MATH_DEFAULT  # float64: no tensor-op path anyway


def _perf_type(direction: str):
    return {"forward": C.ConvolutionFwdAlgoPerf, "backward_data": C.ConvolutionBwdDataAlgoPerf,
            "backward_filter": C.ConvolutionBwdFilterAlgoPerf}[direction]


_FN = {
    "forward": ("cudnnGetConvolutionForwardAlgorithm_v7", "cudnnFindConvolutionForwardAlgorithmEx",
                "cudnnGetConvolutionForwardWorkspaceSize"),
    "backward_data": ("cudnnGetConvolutionBackwardDataAlgorithm_v7",
                      "cudnnFindConvolutionBackwardDataAlgorithmEx",
                      "cudnnGetConvolutionBackwardDataWorkspaceSize"),
    "backward_filter": ("cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                        "cudnnFindConvolutionBackwardFilterAlgorithmEx",
                        "cudnnGetConvolutionBackwardFilterWorkspaceSize"),
}
_MAX_ALGOS = 16  # more than any direction has (8 / 6 / 7)


def _descs_in_order(direction: str, x_desc: int, w_desc: int, y_desc: int, cdesc: int) -> tuple:
    """The descriptor arguments in each direction's C order."""
    if direction == "forward":
        return (x_desc, w_desc, cdesc, y_desc)
    if direction == "backward_data":
        return (w_desc, y_desc, cdesc, x_desc)  # w, dy, conv, dx
    return (x_desc, y_desc, cdesc, w_desc)  # x, dy, conv, dw


def workspace_size(direction: str, handle: int, x_desc: int, w_desc: int, y_desc: int, cdesc: int,
                   algo: int) -> "int | None":
    """Workspace bytes ``algo`` needs, or None when cuDNN says the algorithm cannot run."""
    size = ctypes.c_size_t()
    status = C.raw(_FN[direction][2])(handle, *_descs_in_order(direction, x_desc, w_desc, y_desc, cdesc),
                                      algo, ctypes.byref(size))
    return None if status else int(size.value)


def is_acceptable(perf_math: int, key: ConvKey) -> bool:
    """Strict fp32 refuses tensor-op (TF32) algorithms."""
    return not (key.math == MATH_FMA and perf_math in _TENSOR_OP_MATHS)


def exec_math(perf_math: int, key: ConvKey) -> int:
    """The math type to run with: strict fp32 keeps FMA; otherwise what the algorithm reported.

    cuDNN >= 7.4 decides on tensor cores from (algorithm, math type) together, so the
    descriptor must carry the math type the perf result was measured with.
    """
    return MATH_FMA if key.math == MATH_FMA else int(perf_math)


def _query(key: ConvKey, handle: int, x_desc: int, w_desc: int, y_desc: int, stream,
           buffers: "tuple[int, int, int] | None") -> list:
    """Perf results, best first: from the heuristics, or measured (benchmark mode)."""
    get_fn, find_fn, _ = _FN[key.direction]
    perfs = (_perf_type(key.direction) * _MAX_ALGOS)()
    count = ctypes.c_int()
    base = conv_desc(key.pad, key.stride, key.dilation, key.groups,
                     cm.F64 if key.dtype == "float64" else cm.F32, key.math)
    descs = _descs_in_order(key.direction, x_desc, w_desc, y_desc, base)
    context = dict(direction=key.direction, x=key.x_dims, w=key.w_dims, y=key.y_dims, dtype=key.dtype,
                   layout=key.layout, pad=key.pad, stride=key.stride, dilation=key.dilation, groups=key.groups)
    if not key.benchmark:
        C.call(get_fn, handle, *descs, _MAX_ALGOS, ctypes.byref(count), perfs, context=context)
        return list(perfs[: count.value])
    if stream.is_capturing():
        raise RuntimeError(
            f"conv2d {key.direction}: dnnbind.ops.config.benchmark is on and this shape key was never seen "
            "before, but the stream is capturing a CUDA graph, where cudnnFind*AlgorithmEx cannot run. "
            "Run one eager step with the same shapes before capturing."
        )
    x_ptr, w_ptr, y_ptr = buffers  # type: ignore[misc]
    # Scratch as large as the largest workspace any algorithm asks for, within the cap.
    need = 0
    for algo in range(_MAX_ALGOS):
        size = workspace_size(key.direction, handle, x_desc, w_desc, y_desc, base, algo)
        if size is not None:
            need = max(need, size)
    limit = key.workspace_limit
    need = min(need, limit) if limit is not None else need
    try:
        ws_ptr = cm.workspace(stream, need)
    except cm.DeviceOutOfMemoryError:
        need, ws_ptr = 0, 0
    data = {"forward": (x_ptr, w_ptr, y_ptr), "backward_data": (w_ptr, y_ptr, x_ptr),
            "backward_filter": (x_ptr, y_ptr, w_ptr)}[key.direction]
    d = descs
    C.call(find_fn, handle, d[0], data[0], d[1], data[1], d[2], d[3], data[2], _MAX_ALGOS, ctypes.byref(count),
           perfs, ws_ptr, need, context=context)
    return list(perfs[: count.value])


def choose(key: ConvKey, handle: int, x_desc: int, w_desc: int, y_desc: int, stream,
           buffers: "tuple[int, int, int] | None" = None) -> AlgoChoice:
    """The cached choice for ``key``; the first call per key asks cuDNN.

    ``buffers`` are the (x, w, y) device pointers (dx/dw/dy as the direction has them),
    needed only in benchmark mode, where cuDNN writes the output buffer while timing.
    """
    choice = _cache.get(key)
    if choice is not None:
        return choice
    perfs = _query(key, handle, x_desc, w_desc, y_desc, stream, buffers)
    source = "benchmark" if key.benchmark else "heuristic"
    chosen = None
    for perf in perfs:
        if perf.status != 0 or not is_acceptable(perf.mathType, key):
            continue
        if key.deterministic and perf.determinism != 1:  # 1: CUDNN_DETERMINISTIC
            continue
        math = exec_math(perf.mathType, key)
        cdesc = conv_desc(key.pad, key.stride, key.dilation, key.groups,
                          cm.F64 if key.dtype == "float64" else cm.F32, math)
        size = workspace_size(key.direction, handle, x_desc, w_desc, y_desc, cdesc, perf.algo)
        if size is None:
            continue
        if key.workspace_limit is not None and size > key.workspace_limit:
            continue
        chosen = AlgoChoice(int(perf.algo), math, size, cdesc, perf.determinism == 1, source)
        break
    if chosen is None:
        chosen = fallback(key, handle, x_desc, w_desc, y_desc, perfs)
    _cache[key] = chosen
    return chosen


def fallback(key: ConvKey, handle: int, x_desc: int, w_desc: int, y_desc: int,
             perfs: "list | None" = None) -> AlgoChoice:
    """The best algorithm of ``key`` that needs no workspace (cached).

    Candidates are the perf results in cuDNN's order, then every algorithm number;
    determinism and the math rules still apply. Raises CudnnError-free RuntimeError
    when no such algorithm exists for this configuration.
    """
    hit = _fallbacks.get(key)
    if hit is not None:
        return hit
    compute = cm.F64 if key.dtype == "float64" else cm.F32
    candidates: list[tuple[int, int, int]] = []  # (algo, math, determinism)
    for perf in perfs or []:
        if perf.status == 0 and is_acceptable(perf.mathType, key):
            candidates.append((int(perf.algo), exec_math(perf.mathType, key), int(perf.determinism)))
    if not perfs:
        perf_list = (_perf_type(key.direction) * _MAX_ALGOS)()
        count = ctypes.c_int()
        base = conv_desc(key.pad, key.stride, key.dilation, key.groups, compute, key.math)
        status = C.raw(_FN[key.direction][0])(handle, *_descs_in_order(key.direction, x_desc, w_desc, y_desc, base),
                                               _MAX_ALGOS, ctypes.byref(count), perf_list)
        if status == 0:
            for perf in perf_list[: count.value]:
                if perf.status == 0 and is_acceptable(perf.mathType, key):
                    candidates.append((int(perf.algo), exec_math(perf.mathType, key), int(perf.determinism)))
    for algo, math, determinism in candidates:
        if key.deterministic and determinism != 1:
            continue
        cdesc = conv_desc(key.pad, key.stride, key.dilation, key.groups, compute, math)
        if workspace_size(key.direction, handle, x_desc, w_desc, y_desc, cdesc, algo) == 0:
            choice = AlgoChoice(algo, math, 0, cdesc, determinism == 1, "fallback")
            _fallbacks[key] = choice
            return choice
    raise RuntimeError(
        f"conv2d {key.direction}: no cuDNN algorithm fits (workspace limit {key.workspace_limit} bytes, "
        f"deterministic={key.deterministic}, math={key.math}) for x={key.x_dims} w={key.w_dims} "
        f"y={key.y_dims} {key.dtype} {key.layout} pad={key.pad} stride={key.stride} "
        f"dilation={key.dilation} groups={key.groups}. Raise dnnbind.ops.config.workspace_limit or turn "
        "off deterministic mode."
    )


def clear_cache() -> None:
    """Forget every choice (the next call per key asks cuDNN again)."""
    _cache.clear()
    _fallbacks.clear()


def cache_info() -> dict:
    """{key: choice} of what was chosen so far (a copy; for tests and diagnostics)."""
    return dict(_cache)


def run_with_workspace(key: ConvKey, choice: AlgoChoice, stream, handle: int, x_desc: int, w_desc: int,
                       y_desc: int, call: Callable[[AlgoChoice, int], None]) -> AlgoChoice:
    """Get the workspace for ``choice`` and ``call(choice, workspace_ptr)``.

    If growing the workspace runs out of device memory, warn once per key and run the
    no-workspace fallback instead (and remember it for the key).
    """
    try:
        ws = cm.workspace(stream, choice.workspace)
    except cm.DeviceOutOfMemoryError as exc:
        alt = fallback(key, handle, x_desc, w_desc, y_desc)
        cm.warn_once(
            ("conv-workspace", key),
            f"conv2d {key.direction}: not enough device memory for the {choice.workspace:,}-byte workspace of "
            f"algorithm {choice.name(key.direction)} ({exc.__class__.__name__}); falling back to "
            f"{alt.name(key.direction)}, which needs no workspace and may be slower. "
            f"x={key.x_dims} w={key.w_dims} {key.dtype} {key.layout}",
        )
        _cache[key] = alt
        call(alt, 0)
        return alt
    call(choice, ws)
    return choice
