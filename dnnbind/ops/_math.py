"""The ``keras.ops.math`` namespace (and ``polar``, ``slogdet``): segment reductions, ``extract_sequences``,
the Fourier transforms (``fft``, ``fft2``, ``ifft2``, ``rfft``, ``irfft``, ``stft``, ``istft``), complex
views, ``cdist`` and log-determinants.

* **Segments** drop ids outside ``[0, num_segments)`` (JAX's rule) by sending them to one extra segment
  that is cut off at the end; sums use :func:`dnnbind.kernels.numeric.index_add`, max/min/prod
  :func:`dnnbind.kernels.segment.index_reduce` (atomic updates on the device). Tied maxima share the
  gradient equally, as JAX's scatter-max; ``segment_prod`` has no gradient (JAX has none for repeated ids).
* **Fourier transforms** take and return Keras's ``(real, imag)`` pairs of float tensors. They run on
  the NumPy backend only (``numpy.fft``): the device has no cuFFT binding yet, so a GPU tensor raises
  ``NotImplementedError`` before anything runs. Every transform is composed of one complex DFT
  (:func:`_dft`, whose VJP is the adjoint DFT) and ops (crops, pads, mirrors, frames), so all of them
  are differentiable again.
* **Complex views** (``view_as_complex``, ``polar``; ``view_as_real`` of a complex tensor) need complex
  dtypes, which exist on the NumPy backend only, and record no gradient (dnnbind has no complex autodiff).
* ``cdist`` is the matmul expansion ``|x|^2 + |y|^2 - 2 x.y`` (one GEMM, no ``(m, n, d)`` difference
  tensor); ``slogdet``/``logdet`` use ``numpy.linalg`` on the NumPy backend (their VJP ``inv(x)^T`` is
  written in ops) and raise ``NotImplementedError`` on the device.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import backend
from ..autodiff.tensor import Tensor
from ..kernels import numeric as N
from ..kernels import segment as SEG
from . import _core
from ._core import is_float, keras_op, make, np_dtype, result_type, tensors
from ._elementwise import (add, cast, cos, divide, equal, greater, greater_equal, less, logical_and, maximum,
                           multiply, negative, sin, sqrt, square, subtract, where)
from ._indexing import index_add, take
from ._matmul import matmul
from ._reductions import sum as _sum
from ._shape import broadcast_to, concatenate, expand_dims, flip, get_item, pad, reshape, stack, swapaxes
from ._statistics import as_tensor_of, float_result_dtype, frame_positions, operands, sliding_windows

__all__ = ["segment_sum", "segment_max", "segment_min", "segment_prod", "extract_sequences", "fft", "fft2",
           "ifft2", "rfft", "irfft", "stft", "istft", "view_as_complex", "view_as_real", "polar", "cdist",
           "logdet", "slogdet"]


def _last(t: Tensor, index: Any) -> Tensor:
    return get_item(t, (Ellipsis, index))


def _zeros(shape: tuple, dt: Any, like: Tensor) -> Tensor:
    return Tensor(N.full(tuple(shape), 0, dt, device=like.device))


def _cpu_only(op: str, *ts: Tensor, why: str = "dnnbind has no FFT on the GPU yet (no cuFFT binding)") -> None:
    for t in ts:
        if backend.is_device_array(t.data):
            raise NotImplementedError(f"{op}: {why}; it runs on the CPU backend only (compute it on NumPy "
                                      "data, or with dnnbind.set_default_device('cpu'))")


# ------------------------------------------------------------------------------------------ segments
def _segment_ids(op: str, data: Any, segment_ids: Any, num_segments: Any, *,
                 bool_data: bool = True) -> "tuple[Tensor, Tensor, int]":
    """(data, ids with the dropped ones sent to segment ``num_segments``, ``num_segments``), after Keras's
    checks (and, without ``bool_data``, a refusal of bool data, as JAX's)."""
    d, ids = tensors(data, segment_ids)
    if not bool_data and d.dtype.kind == "b":
        raise TypeError(f"{op}: data of dtype bool is not supported (as JAX); cast it to an integer dtype")
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{op}: segment_ids must be an integer tensor, got dtype {ids.dtype}")
    if ids.ndim != 1:
        raise ValueError(f"{op}: Argument `segment_ids` should be an 1-D vector, got shape: {ids.ndim}. Consider "
                         "either flatten input with segment_ids.reshape((-1)) and data.reshape((-1, ) + "
                         "data.shape[len(segment_ids.shape):]) or vectorize with vmap.")
    if d.ndim == 0 or int(ids.shape[0]) != int(d.shape[0]):
        raise ValueError(f"{op}: Argument `segment_ids` and `data` should have same leading dimension. Got "
                         f"{tuple(ids.shape)} v.s. {tuple(d.shape)}.")
    if num_segments is None:
        host = ids.numpy()  # a host read: the result's shape depends on the ids (Keras infers it the same way)
        num = max(int(host.max()) + 1, 0) if host.size else 0
    else:
        if isinstance(num_segments, bool) or not isinstance(num_segments, (int, np.integer)) or num_segments < 0:
            raise ValueError(f"{op}: num_segments must be a non-negative int, got {num_segments!r}")
        num = int(num_segments)
    kept = logical_and(greater_equal(ids, 0), less(ids, num))
    return d, where(kept, ids, num), num


def _segment_extremum(op: str, data: Any, segment_ids: Any, num_segments: Any) -> Tensor:
    d, ids, num = _segment_ids(op, data, segment_ids, num_segments)
    kind = "max" if op == "segment_max" else "min"
    work = cast(d, "int32") if d.dtype.kind == "b" else d
    dt = work.dtype
    if d.dtype.kind == "b":
        identity: Any = 0 if kind == "max" else 1
    elif is_float(dt):
        identity = -math.inf if kind == "max" else math.inf
    else:
        info = np.iinfo(dt)
        identity = int(info.min) if kind == "max" else int(info.max)
    base = N.full((num + 1,) + tuple(work.shape[1:]), identity, dt, device=work.device)
    raw = SEG.index_reduce(kind, base, ids.data, work.data, 0)
    if not is_float(dt):
        full = Tensor(raw)
    else:
        def backward(node: Any, g: Tensor) -> tuple:
            # JAX's scatter-max rule: the elements equal to their segment's result share its gradient
            hit = cast(equal(work, take(node.output(0), ids, axis=0)), g.dtype)
            ties = index_add(_zeros(tuple(g.shape), g.dtype, g), ids, hit, axis=0)
            return (multiply(take(divide(g, maximum(ties, 1.0)), ids, axis=0), hit),)

        full = make(raw, (work,), backward, op, keep_outputs=True)
    out = get_item(full, slice(0, num))
    return cast(out, "bool") if d.dtype.kind == "b" else out


@keras_op(family="math")
def segment_sum(data: Any, segment_ids: Any, num_segments: Any = None, sorted: bool = False) -> Tensor:  # noqa: A002
    """``keras.ops.segment_sum``: ``out[s] = sum(data[segment_ids == s])`` for ``s < num_segments``; ids outside
    ``[0, num_segments)`` are dropped (JAX's rule). ``num_segments`` None: ``max(segment_ids) + 1``, read on
    the host (the result's shape depends on it). ``sorted`` is a hint that changes nothing here."""
    d, ids, num = _segment_ids("segment_sum", data, segment_ids, num_segments, bool_data=False)
    full = index_add(_zeros((num + 1,) + tuple(d.shape[1:]), d.dtype, d), ids, d, axis=0)
    return get_item(full, slice(0, num))


@keras_op(family="math")
def segment_max(data: Any, segment_ids: Any, num_segments: Any = None, sorted: bool = False) -> Tensor:  # noqa: A002
    """``keras.ops.segment_max``: the maximum of each segment (see :func:`segment_sum`); an empty segment is
    the identity (-inf, or the integer type's minimum; False for bool); NaN propagates; tied maxima share
    the gradient."""
    return _segment_extremum("segment_max", data, segment_ids, num_segments)


@keras_op(family="math")
def segment_min(data: Any, segment_ids: Any, num_segments: Any = None, sorted: bool = False) -> Tensor:  # noqa: A002
    """``keras.ops.segment_min``: the minimum of each segment (see :func:`segment_max`)."""
    return _segment_extremum("segment_min", data, segment_ids, num_segments)


@keras_op(family="math", differentiable=False)
def segment_prod(data: Any, segment_ids: Any, num_segments: Any = None, sorted: bool = False) -> Tensor:  # noqa: A002
    """``keras.ops.segment_prod``: the product of each segment (1 when empty; see :func:`segment_sum`). Not
    differentiable: JAX has no gradient of a product scatter with repeated ids, nor has dnnbind."""
    d, ids, num = _segment_ids("segment_prod", data, segment_ids, num_segments, bool_data=False)
    base = N.full((num + 1,) + tuple(d.shape[1:]), 1, d.dtype, device=d.device)
    return get_item(Tensor(SEG.index_reduce("prod", base, ids.data, d.data, 0)), slice(0, num))


# ------------------------------------------------------------------------------------------ sequences
def _positive_int(op: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{op}: `{name}` must be a positive integer. Received: {name}={value!r}")
    return int(value)


@keras_op(family="math")
def extract_sequences(x: Any, sequence_length: int, sequence_stride: int) -> Tensor:
    """``keras.ops.extract_sequences``: the windows of ``sequence_length`` every ``sequence_stride`` along
    the last axis, shape ``x.shape[:-1] + (1 + (N - sequence_length) // sequence_stride, sequence_length)``
    (no window when ``N < sequence_length``). One strided copy; overlapping windows add their gradients."""
    (t,) = tensors(x)
    if t.ndim < 1:
        raise ValueError(f"extract_sequences: Input should have rank >= 1. Received: input.shape = {tuple(t.shape)}")
    length = _positive_int("extract_sequences", "sequence_length", sequence_length)
    stride = _positive_int("extract_sequences", "sequence_stride", sequence_stride)
    return sliding_windows(t, length, stride, "extract_sequences")


# ----------------------------------------------------------------------------------- Fourier transforms
def _dft(op: str, re: Tensor, im: Tensor, ndims: int, inverse: bool) -> "tuple[Tensor, Tensor]":
    """The complex DFT (``numpy.fft.fftn``/``ifftn``) over the last ``ndims`` axes of ``re + i im``, in
    complex128, rounded to ``re``'s dtype. VJP: the adjoint, ``n * ifft`` of a forward transform and
    ``fft / n`` of an inverse one (``n`` the transformed size), itself a recorded DFT."""
    _cpu_only(op, re, im)
    dt = re.dtype
    axes = tuple(range(-ndims, 0))
    z = re.data.astype(np.float64) + 1j * im.data.astype(np.float64)
    res = np.fft.ifftn(z, axes=axes) if inverse else np.fft.fftn(z, axes=axes)
    outs = (res.real.astype(dt), res.imag.astype(dt))  # (astype: new C-contiguous arrays)
    n = float(math.prod(int(s) for s in re.shape[-ndims:]))
    shape = tuple(re.shape)

    def backward(node: Any, g_re: Any, g_im: Any) -> tuple:
        g_re = g_re if g_re is not None else _zeros(shape, dt, re)
        g_im = g_im if g_im is not None else _zeros(shape, dt, re)
        a, b = _dft(op, g_re, g_im, ndims, not inverse)
        scale = n if not inverse else 1.0 / n
        return multiply(a, scale), multiply(b, scale)

    return make(outs, (re, im), backward, op, multiple=True)


def _complex_pair(op: str, x: Any, min_rank: int) -> "tuple[Tensor, Tensor]":
    """Keras's ``(real, imag)`` argument checks; both as tensors of one float dtype."""
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise ValueError(f"{op}: Input `x` should be a tuple of two tensors - real and imaginary. Received: x={x!r}")
    re, im = tensors(x[0], x[1])
    if tuple(re.shape) != tuple(im.shape):
        raise ValueError(f"{op}: Input `x` should be a tuple of two tensors - real and imaginary. Both the real "
                         f"and imaginary parts should have the same shape. Received: x[0].shape = "
                         f"{tuple(re.shape)}, x[1].shape = {tuple(im.shape)}")
    if not is_float(re.dtype) or not is_float(im.dtype):
        raise ValueError(f"{op}: At least one tensor in input `x` is not of type float. Received dtypes "
                         f"{re.dtype} and {im.dtype}.")
    if re.ndim < min_rank:
        raise ValueError(f"{op}: Input should have rank >= {min_rank}. Received: input.shape = {tuple(re.shape)}")
    _cpu_only(op, re, im)
    dt = np_dtype(result_type(re, im))
    return (re if re.dtype == dt else cast(re, dt)), (im if im.dtype == dt else cast(im, dt))


@keras_op(family="math")
def fft(x: Any) -> tuple:
    """``keras.ops.fft``: the DFT along the last axis of ``x = (real, imag)``; returns ``(real, imag)``.
    NumPy backend only (``NotImplementedError`` on the GPU: no cuFFT binding yet)."""
    re, im = _complex_pair("fft", x, 1)
    return _dft("fft", re, im, 1, False)


@keras_op(family="math")
def fft2(x: Any) -> tuple:
    """``keras.ops.fft2``: the 2-d DFT over the last two axes (see :func:`fft`)."""
    re, im = _complex_pair("fft2", x, 2)
    return _dft("fft2", re, im, 2, False)


@keras_op(family="math")
def ifft2(x: Any) -> tuple:
    """``keras.ops.ifft2``: the inverse 2-d DFT over the last two axes (``1/(m n)`` normalised; see :func:`fft`)."""
    re, im = _complex_pair("ifft2", x, 2)
    return _dft("ifft2", re, im, 2, True)


def _fit_last(t: Tensor, n: int) -> Tensor:
    """``t``'s last axis cropped or zero-padded to ``n``."""
    m = int(t.shape[-1])
    if m > n:
        return _last(t, slice(0, n))
    if m < n:
        return pad(t, [(0, 0)] * (t.ndim - 1) + [(0, n - m)])
    return t


def _fft_length(op: str, value: Any, default: int) -> int:
    n = default if value is None else value
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"{op}: Invalid number of FFT data points ({n}) specified.")
    return int(n)


@keras_op(family="math")
def rfft(x: Any, fft_length: Any = None) -> tuple:
    """``keras.ops.rfft``: the ``fft_length // 2 + 1`` non-negative-frequency terms of the DFT of the real
    ``x`` along its last axis (cropped or zero-padded to ``fft_length``, default its length); ints become
    floatx. Returns ``(real, imag)``; NumPy backend only."""
    (t,) = tensors(x)
    if t.ndim < 1:
        raise ValueError(f"rfft: Input should have rank >= 1. Received: input.shape = {tuple(t.shape)}")
    _cpu_only("rfft", t)
    n = _fft_length("rfft", fft_length, int(t.shape[-1]))
    dt = float_result_dtype(t.dtype)
    src = _fit_last(t if t.dtype == dt else cast(t, dt), n)
    re, im = _dft("rfft", src, _zeros(tuple(src.shape), dt, src), 1, False)
    half = slice(0, n // 2 + 1)
    return _last(re, half), _last(im, half)


@keras_op(family="math")
def irfft(x: Any, fft_length: Any = None) -> Tensor:
    """``keras.ops.irfft``: the real signal of length ``fft_length`` (default ``2 * (m - 1)``) whose
    :func:`rfft` is ``x = (real, imag)`` (cropped or zero-padded to ``fft_length // 2 + 1`` terms; the
    imaginary parts of the zero and Nyquist terms are ignored, as NumPy). NumPy backend only."""
    re, im = _complex_pair("irfft", x, 1)
    n = _fft_length("irfft", fft_length, 2 * (int(re.shape[-1]) - 1))
    half = n // 2 + 1
    re, im = _fit_last(re, half), _fit_last(im, half)
    mirror = slice(1, (n + 1) // 2)  # the terms whose conjugates fill frequencies half .. n-1
    if (n + 1) // 2 > 1:
        re = concatenate([re, flip(_last(re, mirror), -1)], axis=-1)
        im = concatenate([im, negative(flip(_last(im, mirror), -1))], axis=-1)
    out, _ = _dft("irfft", re, im, 1, True)
    return out


def _window(op: str, window: Any, length: int, nfft: int, dt: np.dtype, like: Tensor) -> "Tensor | None":
    """The analysis window of ``length`` (``"hann"``/``"hamming"``: periodic, as ``scipy.signal.get_window``;
    or a 1-d tensor of ``length``; or None), centred in ``nfft`` zeros."""
    if window is None:
        return None
    w = _window_of_length(op, window, length, dt, like)
    left = (nfft - length) // 2
    return pad(w, [(left, nfft - length - left)]) if nfft > length else w


def _window_of_length(op: str, window: Any, length: int, dt: np.dtype, like: Tensor) -> Tensor:
    if isinstance(window, str):
        if window not in ("hann", "hamming"):
            raise ValueError(f'{op}: If a string is passed to `window`, it must be one of `"hann"`, `"hamming"`. '
                             f"Received: window={window}")
        k = np.arange(length, dtype=np.float64)
        a = 0.5 if window == "hann" else 0.54
        host = a - (1.0 - a) * np.cos(2.0 * np.pi * k / length) if length > 1 else np.ones(length)
        return _core.tensor(host.astype(dt), like.data)  # a constant of the host, uploaded (no device read)
    w = as_tensor_of(window, dt, _core.device_of_args(like))
    if w.ndim != 1 or int(w.shape[0]) != length:
        raise ValueError(f"{op}: The shape of `window` must be equal to [sequence_length]. Received: window "
                         f"shape={tuple(w.shape)}")
    return w


def _stft_args(op: str, sequence_length: Any, sequence_stride: Any, fft_length: Any) -> "tuple[int, int, int]":
    if isinstance(sequence_stride, bool) or not isinstance(sequence_stride, int) or sequence_stride <= 0:
        raise ValueError(f"{op}: `sequence_stride` must be a positive integer. Received: "
                         f"sequence_stride={sequence_stride}")
    length = _positive_int(op, "sequence_length", sequence_length)
    nfft = _positive_int(op, "fft_length", fft_length)
    if nfft < length:
        raise ValueError(f"{op}: `fft_length` must equal or larger than `sequence_length`. Received: "
                         f"sequence_length={length}, fft_length={nfft}")
    return length, int(sequence_stride), nfft


@keras_op(family="math")
def stft(x: Any, sequence_length: int, sequence_stride: int, fft_length: int, window: Any = "hann",
         center: bool = True) -> tuple:
    """``keras.ops.stft``: the short-time Fourier transform along the last axis: windows of ``fft_length``
    every ``sequence_stride`` (after reflect-padding ``fft_length // 2`` on both sides when ``center``),
    times ``window`` (``sequence_length`` long, centred in ``fft_length``), then :func:`rfft`. Returns
    ``(real, imag)`` of shape ``x.shape[:-1] + (frames, fft_length // 2 + 1)``. ``x`` float32 or float64;
    NumPy backend only."""
    length, stride, nfft = _stft_args("stft", sequence_length, sequence_stride, fft_length)
    (t,) = tensors(x)
    if _core.standardize_dtype(t.dtype) not in ("float32", "float64"):
        raise TypeError(f"stft: Invalid input type. Expected `float32` or `float64`. Received: input type={t.dtype}")
    _cpu_only("stft", t)
    win = _window("stft", window, length, nfft, t.dtype, t)
    if center:
        t = pad(t, [(0, 0)] * (t.ndim - 1) + [(nfft // 2, nfft // 2)], mode="reflect")
    frames = sliding_windows(t, nfft, stride, "stft")
    if win is not None:
        frames = multiply(frames, win)
    return rfft(frames, nfft)


@keras_op(family="math")
def istft(x: Any, sequence_length: int, sequence_stride: int, fft_length: int, length: Any = None,
          window: Any = "hann", center: bool = True) -> Tensor:
    """``keras.ops.istft``: the inverse of :func:`stft` by weighted overlap-add (scipy's least-squares
    ``istft``, as Keras): each frame's :func:`irfft` times the window, summed into place and divided by the
    summed squared window where that exceeds 1e-10; without a window, scaled by ``fft_length /
    sequence_stride`` (Keras's). Then the centre padding is cut off and the result clipped to ``length``.
    NumPy backend only."""
    seq, stride, nfft = _stft_args("istft", sequence_length, sequence_stride, fft_length)
    re, im = _complex_pair("istft", x, 2)
    dt = re.dtype
    win = _window("istft", window, seq, nfft, dt, re)
    frames = irfft((re, im), nfft)  # (..., count, nfft)
    count = int(frames.shape[-2])
    out_len = nfft + stride * (count - 1)
    positions = frame_positions(out_len, nfft, stride, count, frames)
    if win is not None:
        frames = multiply(frames, win)
    summed = index_add(_zeros(tuple(frames.shape[:-2]) + (out_len,), dt, frames), positions, frames, axis=-1)
    weights = broadcast_to(square(win), (count, nfft)) if win is not None else Tensor(
        N.full((count, nfft), 1, dt, device=frames.device))
    norm = index_add(_zeros((out_len,), dt, frames), positions, weights, axis=0)
    y = divide(summed, where(greater(norm, 1e-10), norm, 1.0))
    if win is None:
        y = multiply(y, nfft / stride)
    start = 0 if center is False else nfft // 2
    if length is not None:
        end = start + int(length)
    elif center is True:
        end = -(nfft // 2)
    else:
        end = out_len
    return _last(y, slice(start, end))


# ------------------------------------------------------------------------------------- complex views
def _complex_of(re: np.ndarray, im: np.ndarray) -> np.ndarray:
    ctype = np.complex128 if np.dtype(re.dtype) == np.float64 else np.complex64
    out = np.empty(np.shape(re), ctype)
    out.real, out.imag = re, im
    return out


@keras_op(family="math", differentiable=False)
def view_as_complex(x: Any) -> Tensor:
    """``keras.ops.view_as_complex``: ``x[..., 0] + 1j * x[..., 1]`` as complex64 (Keras's dtype, also for
    float64). Complex tensors exist on the NumPy backend only; no gradient is recorded."""
    (t,) = tensors(x)
    if t.ndim < 1 or int(t.shape[-1]) != 2:
        raise ValueError(f"view_as_complex: Last dimension of input must be size 2 (real and imaginary). "
                         f"Received shape: {tuple(t.shape)}")
    _cpu_only("view_as_complex", t, why="complex tensors are not supported on the CUDA backend")
    host = t.data.astype(np.float32)
    return Tensor(_complex_of(host[..., 0], host[..., 1]))


@keras_op(family="math")
def view_as_real(x: Any) -> Tensor:
    """``keras.ops.view_as_real``: ``stack([real(x), imag(x)], -1)`` (complex64 gives float32, complex128
    float64; a real ``x`` gives ``(x, 0)`` and is differentiable). Complex input: NumPy backend only."""
    (t,) = tensors(x)
    if t.dtype.kind == "c":
        return Tensor(np.stack([t.data.real, t.data.imag], axis=-1))
    return stack([t, _zeros(tuple(t.shape), t.dtype, t)], axis=-1)


@keras_op(family="nn", differentiable=False)
def polar(abs_: Any, angle: Any) -> Tensor:
    """``keras.ops.polar``: the complex ``abs_ * (cos(angle) + 1j * sin(angle))`` (broadcast; complex64, or
    complex128 for float64). NumPy backend only; no gradient is recorded (complex result)."""
    a, th = tensors(abs_, angle)
    _cpu_only("polar", a, th, why="complex tensors are not supported on the CUDA backend")
    real, imag = multiply(a, cos(th)), multiply(a, sin(th))
    return Tensor(_complex_of(real.data, imag.data))


# ---------------------------------------------------------------------------------------- distances
@keras_op(family="math")
def cdist(x: Any, y: Any) -> Tensor:
    """``keras.ops.cdist``: Euclidean distances between the rows of ``x`` (``(..., m, d)``) and ``y``
    (``(..., n, d)``), shape ``(..., m, n)`` (batch axes broadcast), by ``sqrt(max(|x|^2 + |y|^2 - 2 x.y, 0))``
    (one matmul): distances much smaller than the vectors' norms lose relative precision to cancellation.
    dtype ``result_type(x, y, float)``."""
    (a, b), like = operands(x, y)
    dt = float_result_dtype(a, b)
    a, b = as_tensor_of(a, dt, like), as_tensor_of(b, dt, like)
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"cdist: Inputs to `cdist` must have rank >= 2. Received shapes: x.shape={tuple(a.shape)}, "
                         f"y.shape={tuple(b.shape)}")
    if int(a.shape[-1]) != int(b.shape[-1]):
        raise ValueError(f"cdist: The last dimension of inputs to `cdist` must match. Received shapes: "
                         f"x.shape={tuple(a.shape)}, y.shape={tuple(b.shape)}")
    try:
        N.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(f"cdist: Batch dimensions of inputs to `cdist` must be broadcastable. Received shapes: "
                         f"x.shape={tuple(a.shape)}, y.shape={tuple(b.shape)}") from None
    xx = _sum(square(a), axis=-1, keepdims=True)
    yy = expand_dims(_sum(square(b), axis=-1), -2)
    xy = matmul(a, swapaxes(b, -1, -2))
    return sqrt(maximum(subtract(add(xx, yy), multiply(xy, 2.0)), 0.0))


# ----------------------------------------------------------------------------------- determinants
_LOW = (np.dtype(np.float16), _core.np_dtype("bfloat16"))


def _square_matrices(op: str, t: Tensor) -> None:
    if t.ndim < 2 or int(t.shape[-1]) != int(t.shape[-2]):
        raise ValueError(f"{op}: x must be a square matrix or a batch of them (..., n, n), got shape {tuple(t.shape)}")


def _host_work(t: Tensor) -> np.ndarray:
    """The array numpy.linalg computes on (float16/bfloat16 in float32)."""
    return t.data.astype(np.float32) if t.dtype in _LOW else t.data


def _inverse(t: Tensor) -> Tensor:
    """``inv(t)``, differentiable: the linalg family's ``inv`` when it is registered, else NumPy's here."""
    entry = _core.REGISTRY.get("inv")
    if entry is not None:
        return entry["fn"](t)
    _cpu_only("inv", t, why="dnnbind has no matrix inverse on the GPU yet")
    out = np.linalg.inv(_host_work(t)).astype(t.dtype)

    def backward(node: Any, g: Tensor) -> tuple:
        inv_t = swapaxes(node.output(0), -1, -2)
        return (negative(matmul(inv_t, matmul(g, inv_t))),)

    return make(out, (t,), backward, "inv", keep_outputs=True)


@keras_op
def slogdet(x: Any) -> tuple:
    """``keras.ops.slogdet``: ``(sign, log|det|)`` of the square matrices ``x`` (``(..., n, n)``; ints become
    floatx). NumPy backend only (``numpy.linalg.slogdet``); the gradient of ``log|det|`` is ``inv(x)^T``,
    ``sign`` has none."""
    (t,) = tensors(x)
    _square_matrices("slogdet", t)
    _cpu_only("slogdet", t, why="dnnbind has no LU factorisation on the GPU yet")
    dt = float_result_dtype(t.dtype)
    src = t if t.dtype == dt else cast(t, dt)
    sign, logabs = np.linalg.slogdet(_host_work(src))
    outs = (np.asarray(sign).astype(dt), np.asarray(logabs).astype(dt))  # (astype: new C-contiguous arrays)

    def backward(node: Any, g_sign: Any, g_log: Any) -> tuple:
        if g_log is None:
            return (None,)
        return (multiply(reshape(g_log, tuple(g_log.shape) + (1, 1)), swapaxes(_inverse(src), -1, -2)),)

    return make(outs, (src,), backward, "slogdet", multiple=True)


@keras_op(family="math")
def logdet(x: Any) -> Tensor:
    """``keras.ops.logdet``: ``log|det(x)|`` (``slogdet(x)[1]``, as Keras: the log-determinant for the positive
    definite matrices it is meant for). NumPy backend only."""
    return slogdet(x)[1]
