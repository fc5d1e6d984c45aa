"""Reshaping ops on NVRTC kernels: padding and cropping (``pad2d``/``crop2d`` of ``layout.cu``),
upsampling and transposition (``reshaping.cu``). Inputs are contiguous; every launch goes on the
call's stream, nothing synchronises.
"""

from __future__ import annotations

from typing import Any, Sequence

from . import _common as cm

__all__ = ["pad2d", "crop2d", "upsample2d_forward", "upsample2d_backward", "transpose"]


def pad_nchw(x: Any, dims: tuple, pad: tuple, layout: str, value: float, stream, out: Any = None) -> Any:
    """``x`` (dims (N, C, H, W) in ``layout``) padded by (t, b, l, r) with ``value``, into ``out`` (the padded
    shape; default: a new array)."""
    n, c, h, w = dims
    t, b, l, r = pad
    hp, wp = h + t + b, w + l + r
    shape = (n, c, hp, wp) if layout == "NCHW" else (n, hp, wp, c)
    xp = cm.empty(shape, x.dtype, stream) if out is None else out
    cm.launch("layout.cu", f"pad2d_{cm.suffix(x.dtype)}", n * c * hp * wp,
              (cm.p(x), cm.p(xp), cm.i64(n), cm.i32(c), cm.i32(h), cm.i32(w), cm.i32(hp), cm.i32(wp),
               cm.i32(t), cm.i32(l), cm.f32(value), cm.i32(layout == "NHWC")), stream)
    return xp


def crop_nchw(xp: Any, dims: tuple, pad: tuple, layout: str, out: Any, stream) -> Any:
    """Write the interior of padded ``xp`` (unpadded dims ``dims``) into ``out``."""
    n, c, h, w = dims
    t, b, l, r = pad
    cm.launch("layout.cu", f"crop2d_{cm.suffix(xp.dtype)}", n * c * h * w,
              (cm.p(xp), cm.p(out), cm.i64(n), cm.i32(c), cm.i32(h), cm.i32(w), cm.i32(h + t + b),
               cm.i32(w + l + r), cm.i32(t), cm.i32(l), cm.i32(layout == "NHWC")), stream)
    return out


_FILE = "reshaping.cu"
_MAX_RANK = 8  # the transpose kernel's fixed argument count


def pad2d(x: Any, padding: tuple, *, value: float = 0.0, layout: str = "NCHW", out: Any = None,
          stream: Any = None) -> Any:
    """``x`` padded by ``padding = (top, bottom, left, right)`` with ``value``."""
    s = cm.stream_of(stream)
    n, c, h, w = cm.nchw_dims(x.shape, layout)
    t, b, l, r = padding
    hp, wp = h + t + b, w + l + r
    res = cm.output(out, (n, c, hp, wp) if layout == "NCHW" else (n, hp, wp, c), x.dtype, s)
    return pad_nchw(x, (n, c, h, w), padding, layout, value, s, out=res)


def crop2d(x: Any, cropping: tuple, *, layout: str = "NCHW", out: Any = None, stream: Any = None) -> Any:
    """The interior of ``x`` without ``cropping = (top, bottom, left, right)``."""
    s = cm.stream_of(stream)
    n, c, hp, wp = cm.nchw_dims(x.shape, layout)
    t, b, l, r = cropping
    h, w = hp - t - b, wp - l - r
    res = cm.output(out, (n, c, h, w) if layout == "NCHW" else (n, h, w, c), x.dtype, s)
    return crop_nchw(x, (n, c, h, w), cropping, layout, res, s)


def _upsample(direction: str, src: Any, dst: Any, x_dims: tuple, size: tuple, interpolation: str, layout: str,
              s) -> Any:
    n, c, h, w = x_dims
    sh, sw = size
    count = int(dst.size)
    cm.launch(_FILE, f"upsample_{interpolation}_{direction}_{cm.suffix(src.dtype)}", count,
              (cm.p(src), cm.p(dst), cm.i64(n), cm.i32(c), cm.i32(h), cm.i32(w), cm.i32(sh), cm.i32(sw),
               cm.i32(layout == "NHWC")), s)
    return dst


def upsample2d_forward(x: Any, *, size: tuple = (2, 2), interpolation: str = "nearest", layout: str = "NCHW",
                       out: Any = None, stream: Any = None) -> Any:
    """``x`` upsampled by ``size = (sh, sw)`` (``"nearest"`` or ``"bilinear"``, half-pixel centres)."""
    s = cm.stream_of(stream)
    dims = cm.nchw_dims(x.shape, layout)
    n, c, h, w = dims
    oh, ow = h * size[0], w * size[1]
    res = cm.output(out, (n, c, oh, ow) if layout == "NCHW" else (n, oh, ow, c), x.dtype, s)
    return _upsample("fwd", x, res, dims, size, interpolation, layout, s)


def upsample2d_backward(dy: Any, x_shape: tuple, *, size: tuple = (2, 2), interpolation: str = "nearest",
                        layout: str = "NCHW", stream: Any = None) -> Any:
    """Gradient w.r.t. the input (shape ``x_shape``) of the upsampling, one thread per input element."""
    s = cm.stream_of(stream)
    dx = cm.empty(tuple(x_shape), dy.dtype, s)
    return _upsample("bwd", dy, dx, cm.nchw_dims(x_shape, layout), size, interpolation, layout, s)


def _transpose_plan(shape: Sequence[int], perm: Sequence[int]) -> "tuple[list[int], list[int]]":
    """Output dims and the matching input strides (elements), with size-1 axes dropped and output
    axes that stay neighbours in the input merged."""
    strides = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        strides[k] = strides[k + 1] * int(shape[k + 1])
    dims: list[int] = []
    steps: list[int] = []
    for a in perm:
        d, st = int(shape[a]), strides[a]
        if d == 1:
            continue
        if dims and steps[-1] == st * d:  # the previous output axis is this one's outer neighbour in x
            dims[-1] *= d
            steps[-1] = st
        else:
            dims.append(d)
            steps.append(st)
    return dims, steps


def transpose(x: Any, axes: tuple, *, out: Any = None, stream: Any = None) -> Any:
    """``x`` with axes permuted by ``axes`` (non-negative), as a new contiguous array; any dtype."""
    s = cm.stream_of(stream)
    shape = tuple(int(x.shape[a]) for a in axes)
    dims, steps = _transpose_plan(tuple(int(d) for d in x.shape), axes)
    if len(dims) > _MAX_RANK:
        raise ValueError(f"transpose: at most {_MAX_RANK} axes that are not merged or of size 1 are supported "
                         f"on CUDA, got shape {tuple(x.shape)} with axes {tuple(axes)}")
    res = cm.output(out, shape, x.dtype, s)
    n = int(x.size)
    if n == 0:
        return res
    if len(dims) <= 1:  # the identity order
        cm.memcpy(res, x, s)
        return res
    pad = _MAX_RANK - len(dims)
    dims = [1] * pad + dims
    steps = [0] * pad + steps
    unit = x.dtype.itemsize
    if unit not in (1, 2, 4, 8):
        raise TypeError(f"transpose: no kernel for {unit}-byte elements ({x.dtype})")
    cm.launch(_FILE, f"transpose_u{unit}", n,
              (cm.p(x), cm.p(res), cm.i64(n), *(cm.i64(d) for d in dims), *(cm.i64(st) for st in steps)), s)
    return res
