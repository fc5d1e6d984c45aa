"""A one-layer RNN on cuDNN's RNN API: ``cudnnRNNForward``, ``cudnnRNNBackwardData_v8``,
``cudnnRNNBackwardWeights_v8`` (see :mod:`dnnbind.kernels.rnn` for the arguments and the layouts).

Descriptors come from :meth:`dnnbind.cudnn.RNNDescriptor.cached` / :class:`RNNDataDescriptor` (keyed by
the shapes, the lengths and the dtype); the work space is the stream's grow-only cuDNN workspace, the reserve
space (training) is allocated per forward and travels in the :class:`~dnnbind.kernels.rnn.RNNSaved` record.
The sequence lengths cuDNN wants on the device are uploaded once per (device, lengths) and kept (a captured
graph addresses them), so a call makes no host transfer once they are known. Weight gradients are accumulated
(``CUDNN_WGRAD_MODE_ADD``) into a zeroed buffer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import cudnn
from ..._lib import cudnn as C
from ...cuda import to_device
from ..rnn import RNNSaved, RNNWeightEntry, RNNWeightLayout
from . import _common as cm

__all__ = ["rnn_weight_layout", "rnn_forward", "rnn_backward"]

_layouts: dict = {}
_lengths = cudnn.LRUCache(256, "RNN device sequence lengths")
_sizes = cudnn.LRUCache(256, "RNN temp space sizes")


def _math_type(dtype: np.dtype) -> str:
    if dtype in (cm.F16, cm.BF16):
        return "tensor_op"
    if dtype == cm.F32:
        return "default" if cm.config().allow_tf32 else "fma"
    return "default"


def _descriptor(cell: str, input_size: int, hidden: int, directions: int, dtype: np.dtype) -> cudnn.RNNDescriptor:
    return cudnn.RNNDescriptor.cached(cell, input_size, hidden, bidirectional=directions == 2, dtype=dtype.name,
                                      math_type=_math_type(dtype), bias="double")


def rnn_weight_layout(cell: str, input_size: int, hidden: int, directions: int, dtype: np.dtype, device: Any):
    """cuDNN's packed weight space, read once per (cell, sizes, directions, dtype, device)."""
    key = (cell, input_size, hidden, directions, dtype.name, device.index)
    layout = _layouts.get(key)
    if layout is not None:
        return layout
    s = cm.stream_of(None)
    handle = cm.cudnn_handle(s)
    desc = _descriptor(cell, input_size, hidden, directions, dtype)
    nbytes = desc.weight_space_size(handle)
    probe = cm.empty((nbytes // dtype.itemsize,), dtype, s)  # cuDNN reports addresses inside a real weight space
    entries = []
    for pseudo in range(desc.pseudo_layers):
        for lin in range(desc.linear_layers):
            p = desc.weight_params(handle, pseudo, lin, weight_space=probe, weight_space_size=nbytes)
            if p.bias_offset is None:
                raise RuntimeError(f"cuDNN gave no bias for linear layer {lin} in double-bias mode")
            entries.append(RNNWeightEntry(pseudo, lin, p.matrix_offset, tuple(p.matrix_shape), p.bias_offset,
                                          tuple(p.bias_shape)))
    layout = RNNWeightLayout(cell, input_size, hidden, directions, dtype, nbytes // dtype.itemsize, tuple(entries),
                             "cudnn")
    _layouts[key] = layout
    return layout


def _device_lengths(lengths: tuple, s) -> Any:
    key = (s.device_index, lengths)
    arr = _lengths.get(key)
    if arr is None:
        arr = _lengths.put(key, to_device(np.asarray(lengths, np.int32), stream=s))
    return arr


def _plan(x: Any, layout: Any, lengths: tuple, training: bool, s) -> tuple:
    """``(descriptor, x data desc, y data desc, state desc, workspace bytes, reserve bytes)``."""
    batch, time = int(x.shape[0]), int(x.shape[1])
    dt = layout.dtype
    desc = _descriptor(layout.cell, layout.input_size, layout.hidden_size, layout.directions, dt)
    xd = cudnn.RNNDataDescriptor.cached(dt.name, "batch_major_unpacked", time, batch, layout.input_size,
                                        seq_lengths=lengths, padding_fill=0.0)
    yd = cudnn.RNNDataDescriptor.cached(dt.name, "batch_major_unpacked", time, batch,
                                        layout.directions * layout.hidden_size, seq_lengths=lengths, padding_fill=0.0)
    hd = cudnn.TensorDescriptor.cached((layout.directions, batch, layout.hidden_size), dt.name)
    key = (layout.cell, layout.input_size, layout.hidden_size, layout.directions, dt.name, time, batch, lengths,
           training, _math_type(dt), s.device_index)
    sizes = _sizes.get(key)
    if sizes is None:
        sizes = _sizes.put(key, desc.temp_space_sizes(cm.cudnn_handle(s), xd, training))
    return desc, xd, yd, hd, sizes[0], sizes[1]


def _ptr(a: Any) -> "int | None":
    return None if a is None else a.ptr


def rnn_forward(x: Any, weights: Any, layout: Any, *, h0: Any = None, c0: Any = None, seq_lengths: tuple = (),
                training: bool = False, out: Any = None, stream: Any = None) -> tuple:
    if layout.backend != "cudnn":
        raise ValueError("rnn_forward: the weight layout is NumPy's; on CUDA take rnn_weight_layout(..., device=cuda) "
                         "and pack the weights with it")
    s = cm.stream_of(stream)
    handle = cm.cudnn_handle(s)
    batch, time = int(x.shape[0]), int(x.shape[1])
    desc, xd, yd, hd, work, reserve_size = _plan(x, layout, seq_lengths, training, s)
    y = cm.output(out, (batch, time, layout.directions * layout.hidden_size), x.dtype, s)
    state_shape = (layout.directions, batch, layout.hidden_size)
    hy = cm.empty(state_shape, x.dtype, s)
    lstm = layout.cell == "lstm"
    cy = cm.empty(state_shape, x.dtype, s) if lstm else None
    reserve = cm.empty((max(reserve_size, 1),), np.uint8, s) if training else None
    ws = cudnn.workspace(s, work)
    lengths = _device_lengths(seq_lengths, s)
    mode = C.ForwardMode.TRAINING if training else C.ForwardMode.INFERENCE
    C.call("cudnnRNNForward", handle.handle, desc.handle, mode, lengths.ptr, xd.handle, x.ptr, yd.handle, y.ptr,
           hd.handle, _ptr(h0), hy.ptr, hd.handle, _ptr(c0), _ptr(cy), weights.nbytes, weights.ptr, work, ws or None,
           reserve_size if training else 0, _ptr(reserve),
           context=lambda: {"x": tuple(x.shape), "dtype": str(x.dtype), "cell": layout.cell,
                            "hidden": layout.hidden_size, "directions": layout.directions, "training": training})
    saved = RNNSaved("cudnn", steps=y, reserve=reserve, seq_lengths=tuple(seq_lengths)) if training else None
    return y, hy, cy, saved


def rnn_backward(dy: Any, dhy: Any, dcy: Any, x: Any, weights: Any, layout: Any, saved: Any, *, h0: Any = None,
                 c0: Any = None, y: Any = None, stream: Any = None) -> tuple:
    if saved.path != "cudnn" or saved.reserve is None:
        raise ValueError("rnn_backward: saved must be the record of a CUDA rnn_forward(..., training=True)")
    s = cm.stream_of(stream)
    handle = cm.cudnn_handle(s)
    y = saved.steps if y is None else y
    desc, xd, yd, hd, work, reserve_size = _plan(x, layout, saved.seq_lengths, True, s)
    ws = cudnn.workspace(s, work)
    lengths = _device_lengths(saved.seq_lengths, s)
    state_shape = tuple(hd.get().shape)
    dx = cm.empty(x.shape, x.dtype, s)
    dh0 = cm.empty(state_shape, x.dtype, s)
    lstm = layout.cell == "lstm"
    dc0 = cm.empty(state_shape, x.dtype, s) if lstm else None
    dw = cm.empty(weights.shape, weights.dtype, s)
    cm.memset(dw, 0, s)

    def context() -> dict:
        return {"x": tuple(x.shape), "dtype": str(x.dtype), "cell": layout.cell, "hidden": layout.hidden_size,
                "directions": layout.directions}

    C.call("cudnnRNNBackwardData_v8", handle.handle, desc.handle, lengths.ptr, yd.handle, y.ptr, dy.ptr, xd.handle,
           dx.ptr, hd.handle, _ptr(h0), _ptr(dhy), dh0.ptr, hd.handle, _ptr(c0), _ptr(dcy), _ptr(dc0),
           weights.nbytes, weights.ptr, work, ws or None, reserve_size, saved.reserve.ptr, context=context)
    C.call("cudnnRNNBackwardWeights_v8", handle.handle, desc.handle, C.WgradMode.ADD, lengths.ptr, xd.handle, x.ptr,
           hd.handle, _ptr(h0), yd.handle, y.ptr, dw.nbytes, dw.ptr, work, ws or None, reserve_size,
           saved.reserve.ptr, context=context)
    return dx, dh0, dc0, dw
