"""NumPy convolution: forward against a naive loop, backward against finite differences (float64)."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import kernels
from cases import CONV_CASES
from testutil import FakeStream, TOLERANCE, numerical_grad, random, rel_error

FD_TOL = 1e-7  # central differences with eps=1e-6 in float64


def naive_conv_nchw(x, w, stride, pad, dilation, groups):
    """Direct 7-loop cross-correlation; pad = (top, bottom, left, right)."""
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    t, b, l, rp = pad
    xp = np.zeros((n, c, h + t + b, wd + l + rp))
    xp[:, :, t:t + h, l:l + wd] = x
    oh = (h + t + b - ((r - 1) * dilation[0] + 1)) // stride[0] + 1
    ow = (wd + l + rp - ((s - 1) * dilation[1] + 1)) // stride[1] + 1
    kg = k // groups
    y = np.zeros((n, k, oh, ow))
    for ni in range(n):
        for ki in range(k):
            g = ki // kg
            for i in range(oh):
                for j in range(ow):
                    acc = 0.0
                    for ci in range(cg):
                        for ri in range(r):
                            for si in range(s):
                                acc += xp[ni, g * cg + ci, i * stride[0] + ri * dilation[0],
                                          j * stride[1] + si * dilation[1]] * w[ki, ci, ri, si]
                    y[ni, ki, i, j] = acc
    return y


def to_nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def to_nchw(a):
    return np.ascontiguousarray(a.transpose(0, 3, 1, 2))




@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", CONV_CASES)
def test_conv_forward_matches_naive_both_layouts(rng, xs, ws, stride, padding, dilation, groups):
    x = random(rng, xs)
    w = random(rng, ws)
    y = kernels.conv2d_forward(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
    params, _ = kernels.conv.conv_params("t", xs, ws, stride=stride, padding=padding, dilation=dilation,
                                     groups=groups, layout="NCHW")
    ref = naive_conv_nchw(x, w, params.stride, params.pad, params.dilation, groups)
    assert rel_error(y, ref) < TOLERANCE["float64"]
    y_nhwc = kernels.conv2d_forward(to_nhwc(x), w.transpose(0, 2, 3, 1).copy(), stride=stride, padding=padding,
                                dilation=dilation, groups=groups, layout="NHWC")
    assert rel_error(to_nchw(y_nhwc), ref) < TOLERANCE["float64"]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", CONV_CASES)
def test_conv_backward_finite_differences(rng, layout, xs, ws, stride, padding, dilation, groups):
    x = random(rng, xs)
    w = random(rng, ws)
    if layout == "NHWC":
        x, w = to_nhwc(x), w.transpose(0, 2, 3, 1).copy()
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)
    y = kernels.conv2d_forward(x, w, **kw)
    g = random(rng, y.shape)

    def loss():
        return float(np.sum(g * kernels.conv2d_forward(x, w, **kw)))

    dx = kernels.conv2d_backward_data(g, w, x.shape, **kw)
    dw = kernels.conv2d_backward_filter(x, g, w.shape, **kw)
    assert rel_error(dx, numerical_grad(loss, x)) < FD_TOL
    assert rel_error(dw, numerical_grad(loss, w)) < FD_TOL


@pytest.mark.parametrize("size, kernel, stride, dilation", [(6, 3, 2, 1), (7, 3, 2, 1), (5, 2, 1, 1), (9, 3, 3, 2), (8, 1, 2, 1)])
def test_same_padding_output_shape_is_keras(size, kernel, stride, dilation):
    x = np.ones((1, size, size, 2))
    w = np.ones((3, kernel, kernel, 2))
    y = kernels.conv2d_forward(x, w, stride=stride, padding="same", dilation=dilation, layout="NHWC")
    expected = -(-size // stride)  # Keras: ceil(in / stride)
    assert y.shape == (1, expected, expected, 3)
    pad = kernels.resolve_padding("same", (size, size), (kernel, kernel), (stride, stride), (dilation, dilation))
    assert pad[1] >= pad[0] and pad[1] - pad[0] <= 1  # the odd pixel at the bottom


def test_same_padding_asymmetric_values(rng):
    # 6x6, k=3, s=2: TensorFlow pads 0 on top/left and 1 on bottom/right.
    x = random(rng, (1, 1, 6, 6))
    w = random(rng, (1, 1, 3, 3))
    y = kernels.conv2d_forward(x, w, stride=2, padding="same")
    ref = naive_conv_nchw(x, w, (2, 2), (0, 1, 0, 1), (1, 1), 1)
    assert rel_error(y, ref) < 1e-12


def test_bias_add_and_backward(rng):
    for layout, shape, axis in (("NCHW", (2, 3, 4, 5), 1), ("NHWC", (2, 4, 5, 3), 3), ("NCHW", (4, 3), 1)):
        y = random(rng, shape)
        b = random(rng, (3,))
        bshape = [1] * len(shape)
        bshape[axis] = 3
        assert rel_error(kernels.bias_add(y, b, layout=layout), y + b.reshape(bshape)) < 1e-15
        g = random(rng, shape)
        db = kernels.bias_backward(g, layout=layout)
        num = numerical_grad(lambda: float(np.sum(g * kernels.bias_add(y, b, layout=layout))), b)
        assert rel_error(db, num) < FD_TOL


def test_bias_add_in_place(rng):
    y = random(rng, (2, 3, 2, 2)).astype(np.float32)
    b = random(rng, (3,)).astype(np.float32)
    expected = y + b.reshape(1, 3, 1, 1)
    r = kernels.bias_add(y, b, out=y)
    assert r is y and rel_error(y, expected) < 1e-7


@pytest.mark.parametrize("activation", ["relu", "linear", "sigmoid"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_fused_conv_bias_activation(rng, activation, layout):
    x = random(rng, (2, 3, 5, 5) if layout == "NCHW" else (2, 5, 5, 3))
    w = random(rng, (4, 3, 3, 3) if layout == "NCHW" else (4, 3, 3, 3))
    b = random(rng, (4,))
    y = kernels.conv2d_bias_activation_forward(x, w, b, activation=activation, padding=1, layout=layout)
    ref = kernels.activation_forward(kernels.bias_add(kernels.conv2d_forward(x, w, padding=1, layout=layout), b, layout=layout),
                                 activation)
    assert rel_error(y, ref) < 1e-14


def test_float16_and_bfloat16_compute_in_float32(rng):
    import ml_dtypes

    x = random(rng, (2, 3, 6, 6), np.float32)
    w = random(rng, (4, 3, 3, 3), np.float32)
    ref = kernels.conv2d_forward(x, w, padding=1)
    for dt, tol in ((np.float16, TOLERANCE["float16"]), (ml_dtypes.bfloat16, TOLERANCE["bfloat16"])):
        y = kernels.conv2d_forward(x.astype(dt), w.astype(dt), padding=1)
        assert y.dtype == np.dtype(dt)
        assert rel_error(y.astype(np.float32), ref) < tol
        dx = kernels.conv2d_backward_data(y, w.astype(dt), x.shape, padding=1)
        assert dx.dtype == np.dtype(dt)


def test_out_argument(rng):
    x = random(rng, (2, 3, 5, 5), np.float32)
    w = random(rng, (4, 3, 3, 3), np.float32)
    out = np.full((2, 4, 3, 3), np.nan, np.float32)
    r = kernels.conv2d_forward(x, w, out=out)
    assert r is out
    assert rel_error(out, kernels.conv2d_forward(x, w)) == 0
    with pytest.raises(ValueError, match=r"conv2d_forward: out has shape \(2, 4, 5, 5\)"):
        kernels.conv2d_forward(x, w, out=np.empty((2, 4, 5, 5), np.float32))


def test_validation_messages(rng):
    x = random(rng, (2, 3, 5, 5), np.float32)
    with pytest.raises(ValueError, match=r"conv2d_forward: x has 3 channels but w expects 4 \(w shape \(8, 4, 3, 3\), "
                                         r"groups=1, layout NCHW\)"):
        kernels.conv2d_forward(x, np.zeros((8, 4, 3, 3), np.float32))
    with pytest.raises(TypeError, match="conv2d_forward: w has dtype float64 but x has dtype float32"):
        kernels.conv2d_forward(x, np.zeros((8, 3, 3, 3)))
    with pytest.raises(ValueError, match="conv2d_forward: x must be 4-d"):
        kernels.conv2d_forward(x[0], np.zeros((8, 3, 3, 3), np.float32))
    with pytest.raises(ValueError, match="does not divide"):
        kernels.conv2d_forward(random(rng, (1, 4, 5, 5), np.float32), np.zeros((3, 2, 3, 3), np.float32), groups=2)
    with pytest.raises(ValueError, match="output would be empty"):
        kernels.conv2d_forward(x, np.zeros((8, 3, 7, 7), np.float32))
    with pytest.raises(ValueError, match="layout must be 'NCHW' or 'NHWC'"):
        kernels.conv2d_forward(x, np.zeros((8, 3, 3, 3), np.float32), layout="CHWN")
    with pytest.raises(ValueError, match=r"conv2d_backward_data: dy has shape \(2, 8, 5, 5\) but the forward output "
                                         r"shape is \(2, 8, 3, 3\)"):
        kernels.conv2d_backward_data(np.zeros((2, 8, 5, 5), np.float32), np.zeros((8, 3, 3, 3), np.float32), x.shape)
    with pytest.raises(ValueError, match=r"bias_add: b has shape \(4,\) but y"):
        kernels.bias_add(x, np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="conv2d_forward: x must be float16, bfloat16, float32 or float64"):
        kernels.conv2d_forward(x.astype(np.int32), np.zeros((8, 3, 3, 3), np.int32))


def test_bias_add_and_backward_channels_last_long_rows(rng):
    # Wide enough for the tiled-row add and the gemv gradient; also in place and into out=.
    y = random(rng, (3, 5, 7, 16)).astype(np.float32)
    b = random(rng, (16,)).astype(np.float32)
    expected = y + b
    assert np.array_equal(kernels.bias_add(y, b, layout="NHWC"), expected)
    out = np.full_like(y, np.nan)
    assert kernels.bias_add(y, b, layout="NHWC", out=out) is out and np.array_equal(out, expected)
    strided = y[:, ::2]
    assert np.array_equal(kernels.bias_add(strided, b, layout="NHWC"), strided + b)
    db = kernels.bias_backward(y, layout="NHWC")
    assert db.dtype == np.float32 and rel_error(db, y.astype(np.float64).sum(axis=(0, 1, 2))) < 1e-6
    assert kernels.bias_add(y, b, layout="NHWC", out=y) is y and np.array_equal(y, expected)


# --------------------------------------- CUDA fused conv+bias+activation: control flow, no GPU

class _Dev:
    """What the CUDA conv code reads of a DeviceArray: shape, dtype, ptr."""

    def __init__(self, shape, ptr=0x1000, dtype=np.float32):
        self.shape, self.dtype, self.ptr = tuple(shape), np.dtype(dtype), ptr


def fake_handle(raw: int = 0x99):
    """A borrowed dnnbind.cudnn.Handle around a made-up pointer (these tests never pass it to cuDNN)."""
    from dnnbind import cudnn

    handle = cudnn.Handle.__new__(cudnn.Handle)
    handle._adopt(raw, lambda ptr: 0, owned=False)
    return handle


@pytest.fixture
def fused(monkeypatch):
    """The CUDA fused op with the stream, buffers and unfused calls faked (descriptors are real):
    returns the log of what ran."""
    from dnnbind import cudnn
    from dnnbind.kernels._cuda import _common as cm
    from dnnbind.kernels._cuda import conv as cconv

    log = []

    class Stream:
        device_index = 0

    monkeypatch.setattr(cm, "stream_of", lambda s: Stream())
    monkeypatch.setattr(cm, "cudnn_handle", lambda s: fake_handle())
    monkeypatch.setattr(cm, "output", lambda out, shape, dtype, s: _Dev(shape, 0x5000))
    monkeypatch.setattr(cudnn, "workspace", lambda s, n: 0)
    monkeypatch.setattr(cconv, "_FUSED_UNSUPPORTED", set())
    monkeypatch.setattr(cconv, "conv2d_forward", lambda x, w, **kw: log.append("conv2d_forward") or _Dev((1,)))
    monkeypatch.setattr(cconv, "bias_add", lambda y, b, **kw: log.append("bias_add"))
    return log


def _fused_call(cconv, activation):
    x, w, b = _Dev((2, 3, 6, 6)), _Dev((4, 3, 3, 3), 0x2000), _Dev((4,), 0x3000)
    params = kernels.ConvParams(stride=(1, 1), pad=(1, 1, 1, 1), dilation=(1, 1), groups=1)
    return cconv.conv2d_bias_activation_forward(x, w, b, activation=activation, params=params, layout="NCHW")


def test_fused_linear_without_its_algorithm_runs_unfused_without_an_error(fused, monkeypatch):
    from dnnbind.cudnn import algo
    from dnnbind.kernels._cuda import conv as cconv

    queries = []
    monkeypatch.setattr(algo, "workspace_size", lambda *args: queries.append(args[-1]))  # None: cannot run
    for _ in range(2):
        _fused_call(cconv, "linear")
    # one query (IMPLICIT_PRECOMP_GEMM = 1), then the geometry is known: unfused calls only
    assert queries == [1] and len(cconv._FUSED_UNSUPPORTED) == 1
    assert fused == ["conv2d_forward", "bias_add"] * 2


def test_fused_linear_asks_its_workspace_once_per_geometry(fused, monkeypatch):
    from dnnbind._lib import cudnn as C
    from dnnbind.cudnn import algo
    from dnnbind.kernels._cuda import conv as cconv

    queries, made = [], []
    monkeypatch.setattr(algo, "workspace_size", lambda *args: queries.append(args[-1]) or 0)
    monkeypatch.setattr(C, "cudnnConvolutionBiasActivationForward", lambda *args: made.append(args[7]))
    for _ in range(3):
        _fused_call(cconv, "linear")
    # three fused calls with IMPLICIT_PRECOMP_GEMM (1); its workspace asked on the first only
    assert made == [1, 1, 1] and queries == [1]
    assert fused == [] and not cconv._FUSED_UNSUPPORTED


def test_fused_call_refused_by_cudnn_runs_unfused_and_other_errors_raise(fused, monkeypatch):
    from dnnbind import cudnn
    from dnnbind._lib import cudnn as C
    from dnnbind.cudnn import algo
    from dnnbind.errors import CudnnError
    from dnnbind.kernels._cuda import activation
    from dnnbind.kernels._cuda import conv as cconv

    conv_desc = cudnn.ConvolutionDescriptor(1)
    choice = algo.AlgoChoice(C.ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM, C.MathType.DEFAULT_MATH, 0, conv_desc, True,
                             "fixed")
    monkeypatch.setattr(algo, "choose", lambda *args: choice)
    status = {"value": (3000, "CUDNN_STATUS_NOT_SUPPORTED")}
    made = []

    def call(*args):
        made.append((args[6], args[7]))  # the convolution descriptor and algorithm chosen
        raise CudnnError(*status["value"], "cudnnConvolutionBiasActivationForward")

    monkeypatch.setattr(C, "cudnnConvolutionBiasActivationForward", call)
    monkeypatch.setattr(activation, "activation_forward", lambda y, kind, **kw: fused.append(kind))
    _fused_call(cconv, "relu")
    assert made == [(conv_desc.handle, 1)] and fused == ["conv2d_forward", "bias_add", "relu"]
    assert len(cconv._FUSED_UNSUPPORTED) == 1
    cconv._FUSED_UNSUPPORTED.clear()
    status["value"] = (5000, "CUDNN_STATUS_EXECUTION_FAILED")
    with pytest.raises(CudnnError, match="CUDNN_STATUS_EXECUTION_FAILED") as info:
        _fused_call(cconv, "relu")
    assert info.value.context["x shape (N,C,H,W)"] == (2, 3, 6, 6) and not cconv._FUSED_UNSUPPORTED
    assert info.value.context["x strides (elements)"] == (108, 36, 6, 1)  # read back from the descriptor


def test_conv_geometry_equality_ignores_descriptor_handles():
    """_FUSED_UNSUPPORTED is keyed by geometries: by their shapes and parameters, never by the
    descriptors they carry."""
    import dataclasses

    from dnnbind.kernels._cuda import conv as cconv

    params = kernels.ConvParams(stride=(1, 1), pad=(1, 1, 1, 1), dilation=(1, 1), groups=1)
    g = cconv._geometry((2, 3, 6, 6), (4, 3, 3, 3), params, "NCHW", np.float32)
    from dnnbind import cudnn

    # Other descriptor objects (not cached ones): other handles, same geometry.
    other = dataclasses.replace(g, x_desc=cudnn.TensorDescriptor((2, 3, 6, 6), "float32"),
                                w_desc=cudnn.FilterDescriptor((4, 3, 3, 3), "float32"),
                                y_desc=cudnn.TensorDescriptor((2, 4, 6, 6), "float32"))
    assert other.x != g.x and other.w != g.w and other.y != g.y
    assert other == g and hash(other) == hash(g) and other in {g}
    assert dataclasses.replace(g, y_dims=(2, 4, 5, 5)) != g


# ------------------------------ CUDA fused graph path (kernels/_cuda/fused.py): choice logic, builder faked

def _bf16():
    from dnnbind._validate import BFLOAT16

    return BFLOAT16


class _DevC(_Dev):
    """A fake DeviceArray the graph path accepts: packed, 16-byte aligned unless ``ptr`` says otherwise."""

    is_contiguous = True


class _FakePlan:
    def __init__(self, log, workspace_size=0):
        self.log, self.workspace_size = log, workspace_size

    def execute(self, tensors, workspace=None, *, handle=None):
        self.log.append(("execute", tensors["x"], tensors["w"], tensors["b"], tensors["y"], workspace))


@pytest.fixture
def graph_path(monkeypatch):
    """conv2d_bias_activation_forward on CUDA with the stream, buffers, graph builder and unfused calls
    faked (descriptors are real). Returns (log, stream, builder): builder["result"] is what the fake
    build returns (a plan) or raises (an exception)."""
    from dnnbind.kernels._cuda import _common as cm
    from dnnbind.kernels._cuda import activation
    from dnnbind.kernels._cuda import conv as cconv
    from dnnbind.kernels._cuda import fused

    log = []
    stream = FakeStream()
    builder = {"result": _FakePlan(log)}

    def build(key, handle):
        log.append(("build", key))
        if isinstance(builder["result"], Exception):
            raise builder["result"]
        return builder["result"]

    monkeypatch.setattr(cm, "stream_of", lambda s: stream)
    monkeypatch.setattr(cm, "cudnn_handle", lambda s: fake_handle())
    monkeypatch.setattr(cm, "output", lambda out, shape, dtype, s: _DevC(shape, 0x5000, dtype))
    monkeypatch.setattr(fused, "_build", build)
    monkeypatch.setattr(fused, "workspace", lambda s, n: 0x9000)
    monkeypatch.setattr(fused, "_CHOICES", fused.Choices(("conv_bias_activation",)))
    monkeypatch.setattr(cconv, "_FUSED_UNSUPPORTED", set())
    monkeypatch.setattr(cconv, "conv2d_forward", lambda x, w, **kw: log.append("conv2d_forward"))
    monkeypatch.setattr(cconv, "bias_add", lambda y, b, **kw: log.append("bias_add"))
    monkeypatch.setattr(activation, "activation_forward", lambda y, kind, **kw: log.append(kind))
    monkeypatch.setattr(cconv, "pad_nchw", lambda x, dims, pad, layout, value, s: log.append(("pad", pad)) or
                        _DevC((dims[0], dims[2] + pad[0] + pad[1], dims[3] + pad[2] + pad[3], dims[1]), 0x7000,
                              x.dtype))
    return log, stream, builder


def _graph_call(activation="relu", layout="NHWC", dtype=None, x_shape=(2, 6, 6, 32), k=32, pad=(1, 1, 1, 1),
                stride=(1, 1), groups=1, x_ptr=0x1000):
    from dnnbind.kernels._cuda import conv as cconv

    dtype = np.dtype(dtype or _bf16())
    c = x_shape[3] if layout == "NHWC" else x_shape[1]
    w_shape = (k, 3, 3, c // groups) if layout == "NHWC" else (k, c // groups, 3, 3)
    x, w, b = _DevC(x_shape, x_ptr, dtype), _DevC(w_shape, 0x2000, dtype), _DevC((k,), 0x3000, dtype)
    params = kernels.ConvParams(stride=stride, pad=pad, dilation=(1, 1), groups=groups)
    return cconv.conv2d_bias_activation_forward(x, w, b, activation=activation, params=params, layout=layout)


def test_fused_graphs_is_a_setting_and_part_of_the_capture_key():
    from dnnbind.kernels import config

    assert config.fused_graphs is True and config.get("fused_graphs") is True
    before = config.capture_key()
    with config.override(fused_graphs=False):
        assert config.fused_graphs is False and config.capture_key() != before
    assert config.capture_key() == before
    with pytest.raises(TypeError, match="fused_graphs must be True or False"):
        with config.override(fused_graphs=1):
            pass


def test_fused_key_covers_shapes_and_switches_and_skips_what_no_graph_runs():
    from dnnbind.kernels import config
    from dnnbind.kernels._cuda import fused

    bf16 = _bf16()
    args = (0, (2, 32, 6, 6), (64, 32, 3, 3), (1, 1), (1, 1), (1, 1), 1, bf16, "relu", "NHWC")
    key = fused.conv_bias_activation_key(*args)
    assert (key.x_shape, key.w_shape, key.pad, key.dtype, key.activation) == ((2, 6, 6, 32), (64, 3, 3, 32), (1, 1),
                                                                              bf16, "relu")
    assert key == fused.conv_bias_activation_key(*args) and hash(key) == hash(fused.conv_bias_activation_key(*args))
    with config.override(allow_tf32=False):
        assert fused.conv_bias_activation_key(*args) != key
    with config.override(benchmark=True):
        assert fused.conv_bias_activation_key(*args).benchmark and fused.conv_bias_activation_key(*args) != key
    with config.override(workspace_limit=0):
        assert fused.conv_bias_activation_key(*args).workspace_limit == 0
    assert fused.conv_bias_activation_key(*args[:8], "linear", "NHWC").activation == "linear"
    for i, value in ((9, "NCHW"), (6, 2), (8, "gelu"), (7, np.dtype(np.float64)), (1, (0, 32, 6, 6))):
        changed = list(args)
        changed[i] = value
        assert fused.conv_bias_activation_key(*changed) is None, changed


@pytest.mark.parametrize("activation, ops_", [("relu", ["conv_fprop", "add", "relu"]),
                                              ("linear", ["conv_fprop", "add"])])
def test_fused_graph_structure(activation, ops_):
    from dnnbind.kernels._cuda import fused

    key = fused.conv_bias_activation_key(0, (4, 16, 9, 9), (8, 16, 3, 3), (0, 0), (2, 2), (1, 1), 1,
                                         np.dtype(np.float16), activation, "NHWC")
    g = fused._graph(key)
    assert [op.split("_")[0] for op in g.operations] == [o.split("_")[0] for o in ops_]
    bound = {t.name: t for t in g.tensors if not t.virtual}
    assert bound["x"].shape == (4, 9, 9, 16) and bound["w"].shape == (8, 3, 3, 16) and bound["b"].shape == (1, 1, 1, 8)
    assert bound["y"].shape == (4, 4, 4, 8) and g.io_dtype == np.float16  # y takes io_dtype at build
    assert all(t.alignment == fused.ALIGNMENT for t in bound.values())


def test_fused_graph_taken_once_built_and_cached_per_key(graph_path):
    from dnnbind.kernels._cuda import fused

    log, _, _ = graph_path
    y = _graph_call()
    assert y.shape == (2, 6, 6, 32)
    builds = [e for e in log if e[0] == "build"]
    # one build, a first (trial) run, then the call's run: x, w, b, y pointers in that order
    assert len(builds) == 1 and log[1:] == [("execute", 0x1000, 0x2000, 0x3000, 0x5000, None)] * 2
    log.clear()
    _graph_call()
    assert log == [("execute", 0x1000, 0x2000, 0x3000, 0x5000, None)]
    (key, choice), = fused.cache_info().items()
    assert choice.path == "graph" and choice.source == "heuristic" and key == builds[0][1]
    assert fused.stats() == {"graph": 2, "legacy": 0, "decided": 1, "undecided_in_capture": 0}
    log.clear()
    _graph_call(x_shape=(4, 6, 6, 32))  # another shape: another key, decided on its own
    assert log[0][0] == "build" and len(fused.cache_info()) == 2


def test_fused_graph_refused_falls_back_silently_once_per_key(graph_path, caplog):
    import logging

    from dnnbind.cudnn.graph import GraphNotSupportedError
    from dnnbind.kernels._cuda import fused

    log, _, builder = graph_path
    builder["result"] = GraphNotSupportedError("graph 'conv_bias_relu'", [("A #0", "CUDNN_STATUS_NOT_SUPPORTED", "")],
                                               {})
    with caplog.at_level(logging.DEBUG, logger="dnnbind.kernels.fused"):
        _graph_call(x_shape=(2, 6, 6, 3))
        _graph_call(x_shape=(2, 6, 6, 3))
    assert len([e for e in log if e[0] == "build"]) == 1
    assert [e for e in log if not isinstance(e, tuple)] == ["conv2d_forward", "bias_add", "relu"] * 2
    (choice,) = fused.cache_info().values()
    assert choice.path == "legacy" and choice.source == "refused" and "NOT_SUPPORTED" in choice.reason
    assert len([r for r in caplog.records if r.name == "dnnbind.kernels.fused"]) == 1
    assert all(r.levelno == logging.DEBUG for r in caplog.records if r.name == "dnnbind.kernels.fused")
    assert fused.stats()["legacy"] == 2 and fused.stats()["graph"] == 0


def test_fused_graph_execution_error_raises_with_context_and_is_not_cached(graph_path):
    from dnnbind.errors import CudnnError
    from dnnbind.kernels._cuda import fused

    log, _, builder = graph_path

    class Failing(_FakePlan):
        def execute(self, *args, **kwargs):
            raise CudnnError(5000, "CUDNN_STATUS_EXECUTION_FAILED", "cudnnBackendExecute")

    builder["result"] = Failing(log)
    with pytest.raises(CudnnError, match="EXECUTION_FAILED") as info:
        _graph_call()
    assert info.value.context["layout"] == "NHWC" and info.value.context["x shape (N,C,H,W)"] == (2, 32, 6, 6)
    assert not fused.cache_info()


def test_fused_graphs_off_never_builds(graph_path):
    from dnnbind.kernels import config

    log, _, _ = graph_path
    with config.override(fused_graphs=False):
        _graph_call()
    assert log == ["conv2d_forward", "bias_add", "relu"]


@pytest.mark.parametrize("case", [dict(layout="NCHW", x_shape=(2, 32, 6, 6)), dict(activation="gelu"),
                                  dict(dtype=np.float64), dict(groups=2, k=32)])
def test_fused_graph_not_tried_where_it_does_not_apply(graph_path, case):
    from dnnbind.kernels._cuda import fused

    log, _, _ = graph_path
    _graph_call(**case)
    assert log[:2] == ["conv2d_forward", "bias_add"] and not fused.cache_info()


def test_fused_graph_undecided_key_while_capturing_runs_legacy_and_decides_later(graph_path):
    from dnnbind.kernels._cuda import fused

    log, stream, _ = graph_path
    stream.capturing = True
    _graph_call()
    assert log == ["conv2d_forward", "bias_add", "relu"] and not fused.cache_info()
    assert fused.stats()["undecided_in_capture"] == 1
    stream.capturing = False
    _graph_call()  # eager: builds and decides
    stream.capturing = True
    log.clear()
    _graph_call()  # captured: runs the plan decided before, builds nothing
    assert log == [("execute", 0x1000, 0x2000, 0x3000, 0x5000, None)]


def test_fused_graph_misaligned_pointer_runs_legacy_for_that_call_only(graph_path):
    from dnnbind.kernels._cuda import fused

    log, _, _ = graph_path
    _graph_call(x_ptr=0x1002)
    assert log == ["conv2d_forward", "bias_add", "relu"] and not fused.cache_info()
    _graph_call()
    assert fused.cache_info() and fused.stats()["graph"] == 1


def test_fused_graph_workspace_limit(graph_path):
    from dnnbind.kernels import config
    from dnnbind.kernels._cuda import fused

    log, _, builder = graph_path
    builder["result"] = _FakePlan(log, workspace_size=1 << 20)
    with config.override(workspace_limit=1024):
        _graph_call()
    (choice,) = fused.cache_info().values()
    assert choice.source == "workspace_limit" and log[-3:] == ["conv2d_forward", "bias_add", "relu"]
    log.clear()
    _graph_call()  # no cap: the plan, with the stream's workspace
    assert log[-1] == ("execute", 0x1000, 0x2000, 0x3000, 0x5000, 0x9000)


@pytest.mark.parametrize("graph_ms, legacy_ms, path", [(0.5, 1.0, "graph"), (2.0, 1.0, "legacy")])
def test_fused_graph_benchmark_times_both_once_per_key(graph_path, monkeypatch, graph_ms, legacy_ms, path):
    from dnnbind.kernels import config
    from dnnbind.kernels._cuda import fused

    log, _, _ = graph_path
    timed = []

    def time_ms(fn, stream, reps):
        fn()  # runs the path as the real timer does
        timed.append(log[-1])
        return graph_ms if isinstance(log[-1], tuple) else legacy_ms

    monkeypatch.setattr(fused, "_time_ms", time_ms)
    with config.override(benchmark=True):
        _graph_call()
        _graph_call()
    assert len(timed) == 2 and isinstance(timed[0], tuple) and timed[1] == "relu"  # graph, then legacy, once
    (key, choice), = fused.cache_info().items()
    assert key.benchmark and choice.source == "benchmark" and choice.path == path
    assert (choice.graph_ms, choice.legacy_ms) == (graph_ms, legacy_ms)
    assert fused.stats()["decided"] == 1 and fused.stats()[path] == 2


def test_fused_graph_explicit_padding_pads_only_when_the_graph_runs(graph_path):
    from dnnbind.cudnn.graph import GraphNotSupportedError
    from dnnbind.kernels._cuda import fused

    log, _, builder = graph_path
    # "same" with stride 2 on an even size: asymmetric (0, 1, 0, 1), done by pad2d, pad 0 in the graph
    _graph_call(x_shape=(2, 8, 8, 32), pad=(0, 1, 0, 1), stride=(2, 2))
    (key,) = fused.cache_info()
    assert log[0] == ("pad", (0, 1, 0, 1)) and key.x_shape == (2, 9, 9, 32) and key.pad == (0, 0)
    assert log[-1] == ("execute", 0x7000, 0x2000, 0x3000, 0x5000, None)
    builder["result"] = GraphNotSupportedError("g", [], {})
    log.clear()
    _graph_call(x_shape=(4, 8, 8, 32), pad=(0, 1, 0, 1), stride=(2, 2))  # refused: decided after one pad
    log.clear()
    _graph_call(x_shape=(4, 8, 8, 32), pad=(0, 1, 0, 1), stride=(2, 2))
    # legacy (bf16: three launches; conv2d_forward, faked here, pads for itself)
    assert log == ["conv2d_forward", "bias_add", "relu"]
