"""cuDNN on a real GPU: handle lifecycle and raw-binding calls checked against NumPy."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import dnnbind.cudnn as cd
from dnnbind._lib import cudnn as C

pytestmark = pytest.mark.gpu


def _cuda():
    from dnnbind import cuda

    return cuda


def test_handle_create_set_stream_close():
    cuda = _cuda()
    stream = cuda.Stream()
    with cd.Handle() as handle:
        assert handle.handle and handle.owned and handle.stream == 0
        handle.set_stream(stream)
        out = ctypes.c_void_p()
        C.cudnnGetStream(handle.handle, ctypes.byref(out))
        assert out.value == stream.handle == handle.stream
        handle.set_stream(None)
        C.cudnnGetStream(handle.handle, ctypes.byref(out))
        assert not out.value
        assert "cudnn.Handle" in repr(handle)
    assert handle.closed
    handle.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        handle.set_stream(stream)


def test_get_handle_is_cached_per_stream():
    cuda = _cuda()
    s1, s2 = cuda.Stream(), cuda.Stream()
    h1 = cd.get_handle(s1)
    assert cd.get_handle(s1) is h1 and h1.stream == s1.handle
    assert cd.get_handle(s2) is not h1
    assert cd.get_handle() is cd.get_handle(cuda.current_stream())
    borrowed = cd.Handle.from_handle(h1.handle, owned=False)
    borrowed.close()
    assert not h1.closed  # the borrowed wrapper never destroys the real handle


def _scalar(value, dtype=np.float32):
    return ctypes.byref(ctypes.c_double(value) if dtype == np.float64 else ctypes.c_float(value))


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-6), (np.float64, 1e-12)])
def test_add_tensor_broadcasts_bias(rng, dtype, tol):
    cuda = _cuda()
    stream = cuda.Stream()
    handle = cd.get_handle(stream)
    x = rng.standard_normal((3, 5, 4, 6)).astype(dtype)
    b = rng.standard_normal((1, 5, 1, 1)).astype(dtype)
    d_x, d_b = cuda.to_device(x, stream=stream), cuda.to_device(b, stream=stream)
    x_desc = cd.TensorDescriptor.cached(x.shape, dtype)
    b_desc = cd.TensorDescriptor.cached(b.shape, dtype)
    # C = alpha * A + beta * C with A = bias broadcast over N, H, W.
    C.cudnnAddTensor(handle.handle, _scalar(2.0, dtype), b_desc.handle, d_b.ptr, _scalar(0.5, dtype), x_desc.handle,
                     d_x.ptr)
    got = d_x.to_host(stream=stream)
    want = 0.5 * x + 2.0 * b
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("mode,coef,ref", [
    ("relu", 0.0, lambda x: np.maximum(x, 0)),
    ("sigmoid", 0.0, lambda x: 1 / (1 + np.exp(-x))),
    ("tanh", 0.0, np.tanh),
    ("elu", 0.7, lambda x: np.where(x > 0, x, 0.7 * (np.exp(x) - 1))),
    ("clipped_relu", 1.5, lambda x: np.clip(x, 0, 1.5)),
])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_activation_forward_matches_numpy(rng, mode, coef, ref, layout):
    cuda = _cuda()
    stream = cuda.Stream()
    handle = cd.get_handle(stream)
    x = (2 * rng.standard_normal((2, 7, 5, 3))).astype(np.float32)
    d_x = cuda.to_device(x, stream=stream)
    d_y = cuda.to_device(np.full_like(x, np.nan), stream=stream)  # poisoned output
    desc = cd.TensorDescriptor.cached(x.shape, np.float32, layout)
    act = cd.ActivationDescriptor.cached(mode, coef)
    C.call("cudnnActivationForward", handle.handle, act.handle, _scalar(1.0), desc.handle, d_x.ptr, _scalar(0.0),
           desc.handle, d_y.ptr, context={"mode": mode})
    got = d_y.to_host(stream=stream)
    np.testing.assert_allclose(got, ref(x.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_swish_activation(rng):
    cuda = _cuda()
    handle = cd.get_handle()
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    d_x = cuda.to_device(x)
    d_y = cuda.to_device(np.full_like(x, np.nan))
    desc = cd.TensorDescriptor.cached(x.shape, "float32")
    act = cd.ActivationDescriptor("swish", swish_beta=1.5)
    C.cudnnActivationForward(handle.handle, act.handle, _scalar(1.0), desc.handle, d_x.ptr, _scalar(0.0),
                             desc.handle, d_y.ptr)
    got = d_y.to_host()
    want = x / (1 + np.exp(-1.5 * x.astype(np.float64)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_conv_forward_fma_matches_numpy(rng):
    cuda = _cuda()
    handle = cd.get_handle()
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)
    x_desc, w_desc = cd.TensorDescriptor(x.shape, "float32"), cd.FilterDescriptor(w.shape, "float32")
    conv = cd.ConvolutionDescriptor(pad=(1, 0), stride=(2, 1), math="fma")  # no TF32
    y_shape = conv.forward_output_dim(x_desc, w_desc)
    y_desc = cd.TensorDescriptor(y_shape, "float32")
    d_x, d_w = cuda.to_device(x), cuda.to_device(w)
    d_y = cuda.to_device(np.full(y_shape, np.nan, np.float32))
    algo = C.ConvolutionFwdAlgo.IMPLICIT_GEMM
    size = ctypes.c_size_t()
    C.cudnnGetConvolutionForwardWorkspaceSize(handle.handle, x_desc.handle, w_desc.handle, conv.handle,
                                              y_desc.handle, algo, ctypes.byref(size))
    ws = cuda.alloc(max(size.value, 1))
    C.cudnnConvolutionForward(handle.handle, _scalar(1.0), x_desc.handle, d_x.ptr, w_desc.handle, d_w.ptr,
                              conv.handle, algo, ws.ptr, size.value, _scalar(0.0), y_desc.handle, d_y.ptr)
    got = d_y.to_host()
    np.testing.assert_allclose(got, _conv_pad1x0_stride2x1(x, w, y_shape), rtol=1e-5, atol=1e-5)


def _conv_pad1x0_stride2x1(x, w, y_shape):
    """float64 cross-correlation of NCHW x with KCRS w, padding (1, 0), stride (2, 1)."""
    r, s = w.shape[2:]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (0, 0)))
    want = np.zeros(y_shape)
    for i in range(y_shape[2]):
        for j in range(y_shape[3]):
            patch = xp[:, :, 2 * i:2 * i + r, j:j + s]
            want[:, :, i, j] = np.einsum("nchw,kchw->nk", patch, w)
    return want


def test_algorithm_choice_runs_a_convolution_on_the_public_objects(rng):
    """dnnbind.cudnn.algo: choose (cached per key), then run with the stream's workspace."""
    cuda = _cuda()
    stream = cuda.Stream()
    handle = cd.get_handle(stream)
    x = rng.standard_normal((2, 3, 9, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)
    x_desc, w_desc = cd.TensorDescriptor.cached(x.shape, "float32"), cd.FilterDescriptor.cached(w.shape, "float32")
    y_shape = cd.ConvolutionDescriptor(pad=(1, 0), stride=(2, 1)).forward_output_dim(x_desc, w_desc)
    y_desc = cd.TensorDescriptor.cached(y_shape, "float32")
    key = cd.algo.ConvKey("forward", stream.device_index, x.shape, w.shape, y_shape, "float32", "NCHW", (1, 0),
                          (2, 1), (1, 1), 1, C.MathType.FMA_MATH, None, False, False)  # strict fp32
    choice = cd.algo.choose(key, handle, x_desc, w_desc, y_desc, stream)
    assert cd.algo.choose(key, handle, x_desc, w_desc, y_desc, stream) is choice
    assert cd.algo.cache_info()[key] is choice and choice.math is C.MathType.FMA_MATH
    info = choice.conv_desc.get()
    assert (info.pad, info.stride, info.math) == ((1, 0), (2, 1), "fma")
    assert choice.workspace == cd.algo.workspace_size("forward", handle, x_desc, w_desc, y_desc, choice.conv_desc,
                                                      choice.algo)
    d_x, d_w = cuda.to_device(x, stream=stream), cuda.to_device(w, stream=stream)
    d_y = cuda.to_device(np.full(y_shape, np.nan, np.float32), stream=stream)
    ran = []

    def call(ch, ws):
        ran.append((ch, ws))
        C.cudnnConvolutionForward(handle.handle, _scalar(1.0), x_desc.handle, d_x.ptr, w_desc.handle, d_w.ptr,
                                  ch.conv, ch.algo, ws, ch.workspace, _scalar(0.0), y_desc.handle, d_y.ptr)

    assert cd.algo.run_with_workspace(key, choice, stream, handle, x_desc, w_desc, y_desc, call) is choice
    assert ran[0][0] is choice and (ran[0][1] != 0) == (choice.workspace > 0)
    if choice.workspace:
        assert cd.workspace_buffer(stream).nbytes >= choice.workspace
    got = d_y.to_host(stream=stream)
    np.testing.assert_allclose(got, _conv_pad1x0_stride2x1(x, w, y_shape), rtol=1e-5, atol=1e-5)


def test_workspace_is_per_stream_object_and_grow_only():
    cuda = _cuda()
    s1, s2 = cuda.Stream(), cuda.Stream()
    p1 = cd.workspace(s1, 1000)
    assert p1 and cd.workspace(s1, 1 << 20) == p1 and cd.workspace(s1, 0) == 0
    first = cd.workspace_buffer(s1)
    assert first.ptr == p1 and first.nbytes == 1 << 20 and first.stream is s1
    p2 = cd.workspace(s2, 1000)
    assert p2 and p2 != p1 and cd.workspace_buffer(s2).stream is s2
    cd.workspace(s1, (2 << 20) + 1)
    assert cd.workspace_buffer(s1).nbytes == 3 << 20 and cd.workspace_buffer(s1) is not first
    assert first.ptr == p1  # the old buffer lives on while someone (a captured graph) holds it
    handle = s1.handle
    s1.close()
    s3 = cuda.Stream()  # may get s1's handle back: it must not get s1's buffer
    assert cd.workspace_buffer(s3) is None
    assert cd.workspace(s3, 10) and cd.workspace_buffer(s3).stream is s3
    assert s3.handle != handle or cd.workspace_buffer(s3).nbytes == 1 << 20
    cd.release_workspaces()
    assert cd.workspace_buffer(s2) is None and cd.workspace_buffer(s3) is None
    for s in (s2, s3):
        s.synchronize()


def test_find_algorithm_perf_struct():
    handle = cd.get_handle()
    x_desc, w_desc = cd.TensorDescriptor((4, 8, 16, 16), "float32"), cd.FilterDescriptor((8, 8, 3, 3), "float32")
    conv = cd.ConvolutionDescriptor(pad=1)
    y_desc = cd.TensorDescriptor(conv.forward_output_dim(x_desc, w_desc), "float32")
    perf = (C.ConvolutionFwdAlgoPerf * 8)()
    count = ctypes.c_int()
    C.cudnnGetConvolutionForwardAlgorithm_v7(handle.handle, x_desc.handle, w_desc.handle, conv.handle,
                                             y_desc.handle, 8, ctypes.byref(count), perf)
    assert count.value >= 1
    ok = [p for p in perf[: count.value] if p.status == 0]
    assert ok and all(p.algo in set(C.ConvolutionFwdAlgo) for p in ok)
    assert "ConvolutionFwdAlgoPerf(algo=" in repr(ok[0])


def test_dropout_descriptor_round_trip():
    cuda = _cuda()
    handle = cd.get_handle()
    desc = cd.DropoutDescriptor(handle, 0.25, seed=1234)
    info = desc.get()
    assert (info.rate, info.seed, info.states) == (0.25, 1234, desc.states.ptr)
    assert desc.states.nbytes >= cd.DropoutDescriptor.states_size(handle) > 0
    restored = cd.DropoutDescriptor(handle, 0.25, seed=1234, states=desc.states)
    assert restored.get().states == desc.states.ptr
    cuda.current_stream().synchronize()


def test_handle_for_a_capturing_stream_must_exist_before_capture():
    from dnnbind import cublas, cuda
    from dnnbind.errors import DnnbindError

    stream = cuda.Stream()
    with cuda.capture(stream):
        for library in (cd, cublas):
            with pytest.raises(DnnbindError, match="warm-up"):
                library.get_handle(stream)
    # outside the capture the same request creates the handle, and later captures reuse it
    handle = cd.get_handle(stream)
    with cuda.capture(stream):
        assert cd.get_handle(stream) is handle
