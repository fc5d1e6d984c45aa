"""Quantizers (``keras.quantizers``): the NumPy definitions every quantized path agrees with.

Three modes, as Keras 3's ``model.quantize(mode)``:

* ``"int8"``: symmetric abs-max, ``scale = 127 / (max|x| + 1e-7)``, ``q = clip(rint(x * scale), -127, 127)``,
  ``x ~ q / scale`` (Keras's convention: the scale multiplies *into* the integer range). Weights get one
  scale per output channel; activations one per row (dynamic) or one per tensor (calibrated).
* ``"int4"``: weight-only, the same rule with ``7 / (max|x| + 1e-7)`` and range ``[-8, 7]`` over groups of
  ``group_size`` (128, as Keras) consecutive inputs per output channel; two values per byte
  (:func:`pack_int4`: low nibble the even index, high nibble the odd one).
* ``"float8"``: E4M3 (``ml_dtypes.float8_e4m3fn``, largest finite 448) with one *dequantization* scale
  per tensor, ``scale = max|x| / 448`` (Keras's / Transformer Engine's convention: ``x ~ q * scale``),
  ``q = e4m3(clip(x * (448 / max|x|), -448, 448))``; a zero or non-finite ``max|x|`` gives scale 1.

Rounding is to nearest, ties to even (``numpy.rint``, ``cvt.rni`` / ``cvt.rn`` on the GPU); every scale
is one float32 division, so the GPU kernels reproduce them bit for bit. E4M3 values travel as their
bytes (``uint8``) wherever an array library lacks the type.
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "MODES", "INT8_MAX", "INT4_MIN", "INT4_MAX", "E4M3_MAX", "EPSILON", "DEFAULT_INT4_GROUP_SIZE", "FLOAT8_E4M3",
    "quantize_int", "abs_max_quantize", "abs_max_quantize_grouped", "dequantize_grouped", "pack_int4", "unpack_int4",
    "compute_float8_scale", "quantize_float8", "float8_to_bits", "float8_from_bits", "check_mode",
]

MODES = ("int8", "float8", "int4")
INT8_MAX = 127
INT4_MIN, INT4_MAX = -8, 7
E4M3_MAX = 448.0
EPSILON = 1e-7  # keras.backend.epsilon()
DEFAULT_INT4_GROUP_SIZE = 128
FLOAT8_E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
_F32 = np.dtype(np.float32)


def check_mode(mode: Any, owner: str) -> str:
    """``mode`` when it is one of :data:`MODES`, else a ValueError naming them."""
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"{owner}: mode must be one of {', '.join(repr(m) for m in MODES)}, got {mode!r}")
    return mode


def _f32(x: Any) -> np.ndarray:
    return np.asarray(x).astype(np.float32, copy=False)


def quantize_int(x: Any, scale: Any, value_range: "tuple[int, int]" = (-INT8_MAX, INT8_MAX)) -> np.ndarray:
    """The integer rounding of every mode: ``clip(rint(x * scale), *value_range)`` as int8, in float32
    (round half to even, as the GPU's ``cvt.rni``; ``scale`` broadcasts against ``x``)."""
    return np.clip(np.rint(_f32(x) * scale), value_range[0], value_range[1]).astype(np.int8)


def abs_max_quantize(x: Any, axis: Any, value_range: "tuple[int, int]" = (-INT8_MAX, INT8_MAX),
                     epsilon: float = EPSILON) -> "tuple[np.ndarray, np.ndarray]":
    """``(q int8, scale float32)`` with ``scale = value_range[1] / (max|x| over axis + epsilon)`` (kept dims)
    and ``q = clip(rint(x * scale), *value_range)``, in float32 (Keras's ``abs_max_quantize``)."""
    xf = _f32(x)
    scale = np.float32(value_range[1]) / (np.max(np.abs(xf), axis=axis, keepdims=True) + np.float32(epsilon))
    scale = scale.astype(np.float32, copy=False)
    return quantize_int(xf, scale, value_range), scale


def abs_max_quantize_grouped(w: Any, group_size: int = DEFAULT_INT4_GROUP_SIZE,
                             value_range: "tuple[int, int]" = (INT4_MIN, INT4_MAX),
                             epsilon: float = EPSILON) -> "tuple[np.ndarray, np.ndarray]":
    """Per-group abs-max of a ``(out, in)`` matrix along ``in``: ``(q int8 (out, in), scale float32
    (out, ceil(in / group_size)))``; the last group may be shorter."""
    wf = _f32(w)
    if wf.ndim != 2:
        raise ValueError(f"abs_max_quantize_grouped: w must be 2-d (out, in), got shape {wf.shape}")
    if not isinstance(group_size, int) or group_size < 2 or group_size % 2:
        raise ValueError(f"abs_max_quantize_grouped: group_size must be an even int >= 2, got {group_size!r}")
    n, k = wf.shape
    groups = max(1, math.ceil(k / group_size))
    padded = np.zeros((n, groups * group_size), np.float32)
    padded[:, :k] = wf
    g = padded.reshape(n, groups, group_size)
    scale = (np.float32(value_range[1]) / (np.max(np.abs(g), axis=2) + np.float32(epsilon))).astype(np.float32)
    q = quantize_int(g, scale[:, :, None], value_range)
    return q.reshape(n, groups * group_size)[:, :k], scale


def dequantize_grouped(q: Any, scale: Any, group_size: int) -> np.ndarray:
    """float32 ``q / scale`` of a grouped ``(out, in)`` matrix (the inverse of :func:`abs_max_quantize_grouped`)."""
    q = np.asarray(q)
    k = q.shape[1]
    per_column = np.repeat(np.asarray(scale, np.float32), group_size, axis=1)[:, :k]
    return q.astype(np.float32) / per_column


def pack_int4(q: Any, axis: int = 0) -> "tuple[np.ndarray, tuple[int, ...], int]":
    """Two int4 values (int8 in ``[-8, 7]``) per byte along ``axis``, as Keras's ``pack_int4``: byte ``j``
    holds element ``2j`` in its low nibble and ``2j + 1`` in its high one (an odd length is padded with a
    zero). Returns ``(packed uint8, packed shape, original length)``."""
    arr = np.asarray(q)
    if arr.dtype != np.int8:
        raise TypeError(f"pack_int4: expected an int8 array of values in [-8, 7], got {arr.dtype}")
    if arr.size and (arr.min() < INT4_MIN or arr.max() > INT4_MAX):
        raise ValueError(f"pack_int4: values must lie in [-8, 7], got [{arr.min()}, {arr.max()}]")
    arr = np.moveaxis(arr, axis, 0)
    n = arr.shape[0]
    if n % 2:
        arr = np.concatenate([arr, np.zeros((1,) + arr.shape[1:], np.int8)], axis=0)
    u = arr.view(np.uint8) & np.uint8(0x0F)
    packed = np.ascontiguousarray(np.moveaxis(u[0::2] | (u[1::2] << np.uint8(4)), 0, axis))
    return packed, tuple(packed.shape), n


def unpack_int4(packed: Any, orig_len: int, axis: int = 0) -> np.ndarray:
    """The int8 values :func:`pack_int4` packed (sign-extended nibbles), ``orig_len`` long along ``axis``."""
    p = np.moveaxis(np.asarray(packed).view(np.uint8), axis, 0)
    low = (p & np.uint8(0x0F)).astype(np.int8)
    high = (p >> np.uint8(4)).astype(np.int8)
    low = np.where(low > 7, low - 16, low).astype(np.int8)
    high = np.where(high > 7, high - 16, high).astype(np.int8)
    out = np.empty((2 * p.shape[0],) + p.shape[1:], np.int8)
    out[0::2], out[1::2] = low, high
    return np.ascontiguousarray(np.moveaxis(out[:orig_len], 0, axis))


def compute_float8_scale(amax: Any) -> "tuple[np.float32, np.float32]":
    """``(quantize scale 448 / amax, dequantize scale amax / 448)`` as float32; ``(1, 1)`` for an amax that
    is zero or not finite (Keras's ``compute_float8_scale`` keeps the previous scale then; inference starts
    from 1)."""
    a = np.float32(amax)
    if not (np.isfinite(a) and a > 0):
        return np.float32(1.0), np.float32(1.0)
    return np.float32(E4M3_MAX) / a, a / np.float32(E4M3_MAX)


def quantize_float8(x: Any, quantize_scale: Any) -> np.ndarray:
    """``e4m3(clip(x * quantize_scale, -448, 448))`` (float32 product, then round to nearest even); NaN stays NaN."""
    v = _f32(x) * np.float32(quantize_scale)
    return np.clip(v, -E4M3_MAX, E4M3_MAX).astype(FLOAT8_E4M3)


def float8_to_bits(q: np.ndarray) -> np.ndarray:
    """E4M3 values as their bytes (``uint8``), the form dnnbind stores and moves them in."""
    return np.asarray(q, FLOAT8_E4M3).view(np.uint8)


def float8_from_bits(bits: Any) -> np.ndarray:
    """The E4M3 values of bytes written by :func:`float8_to_bits`."""
    return np.asarray(bits, np.uint8).view(FLOAT8_E4M3)
