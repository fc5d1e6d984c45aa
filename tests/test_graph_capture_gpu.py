"""Capture a conv forward + backward + Adam update on a stream as a CUDA graph, replay it,
and compare with the same steps run eagerly (step and lr read from device scalars)."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import cuda, kernels
from dnnbind.kernels import config
from gpu_errlog import check, host
from testutil import random

pytestmark = pytest.mark.gpu


class _Net:
    """The buffers of one conv layer training step (every output preallocated, so it survives replay)."""

    def __init__(self, x, w, dy, stream):
        self.s = stream
        put = lambda a: cuda.to_device(np.asarray(a), stream=stream)  # noqa: E731  (0-d stays 0-d)
        self.x, self.w, self.dy = put(x), put(w), put(dy)
        self.m, self.v = put(np.zeros_like(w)), put(np.zeros_like(w))
        self.lr = put(np.asarray(1e-2, np.float32))
        self.step = put(np.asarray(1, np.int64))
        self.kw = dict(stride=2, padding="same", layout="NHWC", stream=stream)  # asymmetric: pad kernels too
        y_shape = kernels.conv2d_output_shape(x.shape, w.shape, stride=2, padding="same", layout="NHWC")
        self.y = cuda.empty(y_shape, np.float32, stream=stream)
        self.dx = cuda.empty(x.shape, np.float32, stream=stream)
        self.dw = cuda.empty(w.shape, np.float32, stream=stream)

    def train_step(self):
        kernels.conv2d_forward(self.x, self.w, out=self.y, **self.kw)
        kernels.conv2d_backward_data(self.dy, self.w, self.x.shape, out=self.dx, **self.kw)
        kernels.conv2d_backward_filter(self.x, self.dy, self.w.shape, out=self.dw, **self.kw)
        kernels.adam_update([self.w], [self.dw], [self.m], [self.v], lr=self.lr, step=self.step, stream=self.s)

    def set_step(self, step: int):
        self.step.copy_from_host(np.asarray(step, np.int64), stream=self.s)


def test_captured_conv_step_with_adam_replays_like_eager(rng):
    x = random(rng, (4, 9, 9, 3)).astype(np.float32)
    w = random(rng, (8, 3, 3, 3)).astype(np.float32)
    dy_shape = kernels.conv2d_output_shape(x.shape, w.shape, stride=2, padding="same", layout="NHWC")
    dy = random(rng, dy_shape).astype(np.float32)
    stream = cuda.Stream()
    with config.override(allow_tf32=False, deterministic=True):
        eager, graphed = _Net(x, w, dy, stream), _Net(x, w, dy, stream)
        # Warm-up (algorithm choice, kernel compilation, pointer tables, workspace), then undo it.
        graphed.train_step()
        graphed.w.copy_from_host(w, stream=stream)
        graphed.m.fill_zero(stream)
        graphed.v.fill_zero(stream)
        stream.synchronize()
        with cuda.capture(stream) as graph:
            graphed.train_step()
        for step in range(1, 5):
            eager.set_step(step)
            eager.train_step()
            graphed.set_step(step)
            graph.launch(stream)
            stream.synchronize()
            for name in ("y", "dx", "dw", "m", "v", "w"):
                a, b = host(getattr(graphed, name)), host(getattr(eager, name))
                assert np.array_equal(a, b), f"step {step}: {name} differs between graph replay and eager"
    # And the eager run is right: the weights moved as Adam moves them.
    assert not np.array_equal(host(eager.w), w.astype(np.float64))
    w_seen = _w_before_last(eager, w)  # the last forward ran with the weights after 3 updates
    check("graph_capture.conv2d_forward", "float32", eager.y,
          kernels.conv2d_forward(x.astype(np.float64), w_seen, stride=2, padding="same", layout="NHWC"), tol=1e-5)


def _w_before_last(net, w0):
    """Weights the last forward saw: replay the NumPy Adam steps 1..3 from w0 (dw is constant)."""
    p = w0.astype(np.float64).copy()
    m, v = np.zeros_like(p), np.zeros_like(p)
    dw = host(net.dw)
    for step in (1, 2, 3):
        kernels.adam_update([p], [dw], [m], [v], lr=float(np.float32(1e-2)), step=step)
    return p


def test_dropout_replayed_in_a_graph_draws_fresh_masks(rng):
    x = random(rng, (32, 256), low=0.5, high=1.5).astype(np.float32)
    stream = cuda.Stream()
    xd = cuda.to_device(x, stream=stream)
    y = cuda.empty(x.shape, np.float32, stream=stream)
    state = kernels.DropoutState(0.5, seed=11)
    kernels.dropout_forward(xd, state, out=y, stream=stream)  # warm-up: creates the cuDNN state
    stream.synchronize()
    with cuda.capture(stream) as graph:
        kernels.dropout_forward(xd, state, out=y, stream=stream)
    masks = []
    for _ in range(3):
        graph.launch(stream)
        stream.synchronize()
        masks.append(host(y) != 0)
    assert abs(masks[0].mean() - 0.5) < 0.05
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])


def test_capture_lists_the_allocations_that_outlive_it():
    s = cuda.Stream()
    kept = []
    with cuda.capture(s) as graph:
        kept.append(cuda.empty(256, np.float32, stream=s))  # still held when the capture ends
        tmp = cuda.empty(64, np.float32, stream=s)  # freed inside the capture: a free node
        del tmp
    assert [nbytes for nbytes, _ in graph.outstanding_allocations] == [1024]
    assert "(256,)" in graph.outstanding_allocations[0][1]
    graph.close()
