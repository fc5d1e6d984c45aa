"""A whole one-layer recurrent network as ONE recorded node: the fast path of ``keras.layers.LSTM`` / ``GRU`` /
``SimpleRNN`` (and ``Bidirectional`` of them). The forward is :func:`dnnbind.kernels.rnn_forward` (cuDNN's RNN
API on device arrays, its NumPy twin on NumPy arrays), the VJP :func:`dnnbind.kernels.rnn_backward`.

The weights stay Keras's (``kernel`` ``(input, gates * units)``, ``recurrent_kernel``, ``bias``: what the layers
own and what ``.keras`` files hold). Each call packs them into the backend's weight space with one gather: the
Keras tensors of every direction are joined into one flat source (plus one zero element, what the recurrent
biases of a single-bias cell and any alignment gap of cuDNN's space read), and a cached index array (uploaded
once per layout and device) picks the space's elements from it. The VJP unpacks the weight-space gradient the
same way, one gather per Keras tensor (a single Keras bias is cuDNN's input bias; the recurrent one reads 0).
Everything is stream-ordered kernels, no host transfer: a training step stays capturable as a CUDA graph.

Why a gather and not views: cuDNN keeps each gate's matrix ``(units, rows_in)`` row-major, a Keras kernel keeps
all gates side by side ``(rows_in, gates * units)``; no strided view of one packed buffer is both, and a GRU's
gate order differs (Keras z, r, h; cuDNN r, z, h). The gather moves ``4 * (input + units + 1) * units`` elements
per direction, small next to the recurrence itself.

The node's VJP calls kernels directly: it is ``once_differentiable`` (a gradient of its gradient, an outer tape,
raises an error naming it instead of returning a wrong zero), as the other hand-fused backwards are.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import backend, kernels
from ..autodiff.tensor import Tensor
from ..kernels import numeric as N
from ..kernels.rnn import _KERAS_GATE
from ._core import make, needs_grad

__all__ = ["fused_rnn", "rnn_pack_plan"]


class _PackPlan:
    """The index arrays of one weight layout: ``gather`` (``layout.size``) into the flat Keras source (its last
    element a zero), and per direction per Keras tensor the weight-space positions of its elements
    (``inverse``; the space padded with one zero at index ``layout.size``). A single Keras bias is cuDNN's input
    bias (the recurrent one is 0 and stays out of the gradient)."""

    def __init__(self, layout: Any) -> None:
        g, h, n_in, cell = layout.gates, layout.hidden_size, layout.input_size, layout.cell
        gru = cell == "gru"
        shapes = [(n_in, g * h), (h, g * h), (2, g * h) if gru else (g * h,)]
        sizes = [int(np.prod(s)) for s in shapes]
        per_dir = sum(sizes)
        self.shapes = shapes
        self.source_size = per_dir * layout.directions + 1
        zero_src = self.source_size - 1
        gather = np.full(layout.size, zero_src, np.int64)
        for d in range(layout.directions):
            base = d * per_dir
            k_base, r_base, b_base = base, base + sizes[0], base + sizes[0] + sizes[1]
            for lin in range(2 * g):
                e = layout.entry(d, lin)
                k = _KERAS_GATE[cell][lin % g]
                rows_in = n_in if lin < g else h
                src = k_base if lin < g else r_base
                r = np.arange(h)[:, None]
                c = np.arange(rows_in)[None, :]
                gather[e.matrix_offset + r * rows_in + c] = src + c * (g * h) + k * h + r
                rr = np.arange(h)
                if gru:
                    gather[e.bias_offset + rr] = b_base + (lin // g) * g * h + k * h + rr
                elif lin < g:  # (a single Keras bias is the input bias; the recurrent one reads the zero)
                    gather[e.bias_offset + rr] = b_base + k * h + rr
        inverse_all = np.full(self.source_size, layout.size, np.int64)
        hit = gather != zero_src
        inverse_all[gather[hit]] = np.nonzero(hit)[0]
        if (inverse_all[:-1] == layout.size).any():  # every Keras element has its place (a bug otherwise)
            raise RuntimeError(f"fused_rnn: the {cell} weight layout leaves Keras weights unplaced")
        self.gather = gather
        self.inverse = []
        for d in range(layout.directions):
            base = d * per_dir
            offs = np.cumsum([0] + sizes)
            self.inverse.append([inverse_all[base + offs[i]:base + offs[i + 1]] for i in range(3)])
        self._device: dict = {}

    def arrays(self, device: Any) -> tuple:
        """``(gather, inverse)`` on ``device`` (uploaded once per device, then kept: a captured
        graph addresses them)."""
        if not device.is_cuda:
            return self.gather, self.inverse
        key = device.index
        got = self._device.get(key)
        if got is None:
            def up(a: Any) -> Any:
                return backend.asarray(a.astype(np.int32), device=device)

            got = (up(self.gather), [[up(a) for a in per] for per in self.inverse])
            self._device[key] = got
        return got


_plans: dict = {}


def rnn_pack_plan(layout: Any) -> _PackPlan:
    """The cached :class:`_PackPlan` of a weight layout (layouts are frozen and hashable)."""
    key = (layout.cell, layout.input_size, layout.hidden_size, layout.directions, layout.dtype.name,
           layout.backend, layout.size, layout.entries)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _PackPlan(layout)
    return plan


def _zeros(shape: Sequence[int], dtype: np.dtype, device: Any) -> Any:
    return N.full(tuple(shape), 0, dtype, device=device)


def _packed(a: Any) -> Any:
    """``a`` C-contiguous (cuDNN and the flat weight source read packed arrays; a strided view is copied)."""
    if a is None:
        return None
    if backend.is_device_array(a):
        return a if a.is_contiguous else kernels.copy(a)
    return np.ascontiguousarray(a)


def _raw_grad(g: Any, dtype: np.dtype) -> Any:
    if g is None:
        return None
    data = g.data if isinstance(g, Tensor) else g
    if data.dtype != dtype:
        data = kernels.cast(data, dtype)
    return _packed(data)


def fused_rnn(cell: str, x: Tensor, weights: Sequence[Sequence[Tensor]], h0: "Tensor | None" = None,
              c0: "Tensor | None" = None, seq_lengths: "tuple | None" = None) -> tuple:
    """``(y, hy, cy)`` of a one-layer RNN over ``x`` ``(batch, time, features)``, recorded as one node.

    ``cell``: ``"lstm"``, ``"gru"`` (Keras's ``reset_after=True``), ``"tanh"`` or ``"relu"`` (SimpleRNN);
    ``weights``: per direction (one, or two: forward then reverse) the Keras ``(kernel, recurrent_kernel,
    bias)`` tensors, all of ``x``'s dtype; ``h0``/``c0`` ``(directions, batch, units)`` or None (zeros);
    ``seq_lengths``: host ints (right-padded sequences) or None. ``y`` ``(batch, time, directions * units)``,
    the reverse direction aligned to the input steps, padded steps 0; ``hy``/``cy`` ``(directions, batch,
    units)``; ``cy`` is None but for the LSTM. See :mod:`dnnbind.kernels.rnn`."""
    owner = "fused_rnn"
    dirs = len(weights)
    if dirs not in (1, 2):
        raise ValueError(f"{owner}: weights must hold one (kernel, recurrent_kernel, bias) per direction (1 or 2), "
                         f"got {dirs}")
    dtype = x.dtype
    for d, triple in enumerate(weights):
        for name, t in zip(("kernel", "recurrent_kernel", "bias"), triple):
            if t.dtype != dtype:
                raise ValueError(f"{owner}: direction {d}: {name} has dtype {t.dtype}, the inputs {dtype} (cast one)")
    units = int(weights[0][1].shape[0])
    device = backend.device_of(x.data)
    layout = kernels.rnn_weight_layout(cell, int(x.shape[2]), units, bidirectional=dirs == 2, dtype=dtype,
                                       device=device)
    plan = rnn_pack_plan(layout)
    for d, triple in enumerate(weights):
        for name, t, shape in zip(("kernel", "recurrent_kernel", "bias"), triple, plan.shapes):
            if tuple(t.shape) != tuple(shape):
                raise ValueError(f"{owner}: direction {d}: {name} must have shape {tuple(shape)}, got "
                                 f"{tuple(t.shape)}")
    gather, inverse = plan.arrays(device)
    flat = [_packed(t.data).reshape(-1) for triple in weights for t in triple]
    source = kernels.concatenate(flat + [_zeros((1,), dtype, device)], axis=0)
    space = N.take(source, gather)
    flat_inputs = [x] + [t for triple in weights for t in triple] + [h0, c0]
    training = needs_grad(*[t for t in flat_inputs if t is not None])
    xr = _packed(x.data)
    h0r = None if h0 is None else _packed(h0.data)
    c0r = None if c0 is None else _packed(c0.data)
    y, hy, cy, saved = kernels.rnn_forward(xr, space, layout, h0=h0r, c0=c0r, seq_lengths=seq_lengths,
                                           training=training)
    lstm = cell == "lstm"
    outs = (y, hy, cy) if lstm else (y, hy)

    def vjp(node: Any, gy: Any, ghy: Any, gcy: Any = None) -> tuple:
        dy = _raw_grad(gy, dtype)
        if dy is None:
            dy = _zeros(tuple(y.shape), dtype, device)
        dhy = _raw_grad(ghy, dtype)
        dcy = _raw_grad(gcy, dtype) if lstm else None
        dx, dh0, dc0, dspace = kernels.rnn_backward(dy, dhy, dcy, xr, space, layout, saved, h0=h0r, c0=c0r, y=y)
        padded = kernels.concatenate([dspace, _zeros((1,), dtype, device)], axis=0)
        grads: list = [dx]
        for d in range(dirs):
            for i, shape in enumerate(plan.shapes):
                g = N.take(padded, inverse[d][i])
                grads.append(g.reshape(shape))
        grads.append(None if h0 is None else dh0)
        grads.append(None if c0 is None else dc0)
        return tuple(grads)

    result = make(outs, flat_inputs, vjp, f"rnn_{cell}", multiple=True, once_differentiable=True)
    if not lstm:
        result = (*result, None)
    return tuple(result)
