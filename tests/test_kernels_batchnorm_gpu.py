"""CUDA batch normalization vs the NumPy reference; torch cross-check.

GPU tests run every case through the shipped paths ("fast": channels-last training on the
*Ex API with CUDNN_BATCHNORM_SPATIAL_PERSISTENT, channels-last inference on the NVRTC kernel)
and, for channels-last cases, through the legacy cuDNN path too ("legacy"), for two training
steps (running statistics after both), inference and backward. CPU tests (no GPU needed)
check the NVRTC source, the routing and descriptors, and how the reserve space travels in
BatchNormSaved.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import weakref

import numpy as np
import pytest

from dnnbind import kernels
from dnnbind.kernels._cuda import _common as cm
from dnnbind.kernels._cuda import batchnorm as bn
from gpu_errlog import BF16, DTYPES, check, dev, host, poisoned, quantize
from test_kernels_batchnorm import relu_safe_beta
from testutil import random

# (mode, layout, shape): odd channel counts, batch 1, spatial 1x1 (never a single value per
# channel: cuDNN's unbiased running variance would divide by zero, PyTorch refuses it too).
CHANNELS_LAST = [
    ("spatial", "NHWC", (4, 5, 6, 3)), ("spatial", "NHWC", (2, 3, 3, 7)), ("spatial", "NHWC", (3, 4, 4, 64)),
    ("spatial", "NHWC", (2, 3, 5, 96)), ("spatial", "NHWC", (1, 4, 5, 7)), ("spatial", "NHWC", (16, 1, 1, 96)),
    ("spatial", "NHWC", (8, 1, 1, 3)), ("spatial", "NCHW", (16, 7)), ("per_activation", "NHWC", (32, 96)),
    ("spatial", "NCHW", (8, 3)),
]
OTHER = [
    ("spatial", "NCHW", (4, 3, 5, 6)), ("spatial", "NCHW", (2, 7, 3, 3)), ("spatial", "NCHW", (2, 96, 3, 5)),
    ("spatial", "NCHW", (1, 7, 4, 5)), ("spatial", "NCHW", (16, 3, 1, 1)), ("per_activation", "NCHW", (5, 3, 2, 2)),
    ("per_activation", "NHWC", (5, 2, 2, 3)),
]
PATHS = {
    "fast": {},
    "legacy": {"USE_PERSISTENT_NHWC": False, "INFERENCE_KERNEL": False, "BN2D_PATH": "spatial"},
    "legacy2d_per_activation": {"USE_PERSISTENT_NHWC": False, "INFERENCE_KERNEL": False,
                                "BN2D_PATH": "per_activation"},
}
CASES = ([pytest.param("fast", *c, id=f"fast-{c[0]}-{c[1]}-{c[2]}") for c in CHANNELS_LAST + OTHER]
         + [pytest.param("legacy", *c, id=f"legacy-{c[0]}-{c[1]}-{c[2]}") for c in CHANNELS_LAST]
         + [pytest.param("legacy2d_per_activation", *c, id=f"legacy2dpa-{c[0]}-{c[1]}-{c[2]}")
            for c in CHANNELS_LAST if len(c[2]) == 2])


def _pshape(mode: str, layout: str, shape: tuple) -> tuple:
    if len(shape) == 2:
        return (shape[1],)
    if mode == "per_activation":
        return tuple(shape[1:])
    return (shape[1],) if layout == "NCHW" else (shape[3],)


@pytest.fixture
def switches(monkeypatch):
    def apply(path: str) -> None:
        for name, value in PATHS[path].items():
            monkeypatch.setattr(bn, name, value)
    return apply


@pytest.mark.gpu
@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("path, mode, layout, shape", CASES)
def test_batchnorm_two_steps_inference_backward(rng, switches, path, label, dtype, mode, layout, shape):
    switches(path)
    pshape = _pshape(mode, layout, shape)
    gamma = random(rng, pshape, low=0.5, high=1.5).astype(np.float32)
    beta = random(rng, pshape).astype(np.float32)
    rm, rv = random(rng, pshape).astype(np.float32), random(rng, pshape, low=0.5, high=2).astype(np.float32)
    kw = dict(epsilon=1e-3, mode=mode, layout=layout)
    g64, b64 = gamma.astype(np.float64), beta.astype(np.float64)
    rm_ref, rv_ref = rm.astype(np.float64), rv.astype(np.float64)
    drm, drv, dgamma, dbeta = dev(rm), dev(rv), dev(gamma), dev(beta)
    case = f"{path} {mode} {layout} {shape}"
    for step in range(2):  # the running statistics must compose over steps
        x = quantize(random(rng, shape, low=-2, high=3), dtype)
        y_ref, saved_ref = kernels.batchnorm_forward_training(x, g64, b64, rm_ref, rv_ref, momentum=0.9, **kw)
        xd = dev(x, dtype)
        y, saved = kernels.batchnorm_forward_training(xd, dgamma, dbeta, drm, drv, momentum=0.9,
                                                  out=poisoned(shape, dtype), **kw)
        check("batchnorm_forward_training", label, y, y_ref, f"{case} step {step}")
        check("batchnorm.save_mean", label, saved.mean, saved_ref.mean, f"{case} step {step}")
        check("batchnorm.save_inv_std", label, saved.inv_std, saved_ref.inv_std, f"{case} step {step}")
    check("batchnorm.running_mean", label, drm, rm_ref, case + " after 2 steps")
    check("batchnorm.running_var", label, drv, rv_ref, case + " after 2 steps")
    yi = kernels.batchnorm_forward_inference(xd, dgamma, dbeta, drm, drv, out=poisoned(shape, dtype), **kw)
    yi_ref = kernels.batchnorm_forward_inference(x, g64, b64, rm_ref, rv_ref, **kw)
    check("batchnorm_forward_inference", label, yi, yi_ref, case)
    dy = quantize(random(rng, shape), dtype)
    dx, dg, db = kernels.batchnorm_backward(dev(dy, dtype), xd, dgamma, saved, **kw)
    dx_ref, dg_ref, db_ref = kernels.batchnorm_backward(dy, x, g64, saved_ref, **kw)
    check("batchnorm_backward.dx", label, dx, dx_ref, case)
    check("batchnorm_backward.dgamma", label, dg, dg_ref, case)
    check("batchnorm_backward.dbeta", label, db, db_ref, case)
    if path == "fast" and dtype != BF16 and bn._ex_eligible(xd, mode, layout):
        # The fallback would have kept the numbers right; the fast path itself must have run.
        assert (xd.device_index, tuple(shape), str(np.dtype(dtype))) not in bn._ex_refused, case


@pytest.mark.gpu
def test_reserve_travels_in_saved_dies_with_it_and_a_hand_built_record_still_works(rng):
    shape = (8, 4, 4, 64)
    x = random(rng, shape, low=-1, high=2).astype(np.float32)
    dy = random(rng, shape).astype(np.float32)
    gamma, beta = np.full(64, 1.25, np.float32), np.full(64, -0.5, np.float32)
    xd = dev(x)
    y, saved = kernels.batchnorm_forward_training(xd, dev(gamma), dev(beta), dev(np.zeros(64, np.float32)),
                                              dev(np.ones(64, np.float32)), momentum=0.9, layout="NHWC")
    assert saved.path == bn.PERSISTENT and saved.x_shape == shape and saved.x_dtype == np.float32
    # a reserve iff cuDNN asked for one: uint8 bytes on x's device
    assert saved.reserve is None or (saved.reserve.dtype == np.uint8 and saved.reserve.nbytes > 0)
    reserve = None if saved.reserve is None else weakref.ref(saved.reserve)
    _, saved_ref = kernels.batchnorm_forward_training(x.astype(np.float64), gamma.astype(np.float64),
                                                  beta.astype(np.float64), np.zeros(64), np.ones(64), momentum=0.9,
                                                  layout="NHWC")
    ref = kernels.batchnorm_backward(dy.astype(np.float64), x.astype(np.float64), gamma.astype(np.float64), saved_ref,
                                 layout="NHWC")
    # With the forward's record (its reserve) and with one built by hand from copied statistics
    # (no reserve: the legacy backward takes over when cuDNN needs one): both must match.
    by_hand = kernels.BatchNormSaved(dev(saved.mean.to_host()), dev(saved.inv_std.to_host()))
    for record in (saved, by_hand):
        got = kernels.batchnorm_backward(dev(dy), xd, dev(gamma), record, layout="NHWC")
        for name, a, r in zip(("dx", "dgamma", "dbeta"), got, ref):
            check(f"batchnorm_backward.{name}", "float32", a, r, f"record {record.path}")
    del y, saved, record, got
    gc.collect()
    assert reserve is None or reserve() is None  # nothing else holds it


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(16, 8, 8, 64), (4, 3, 5, 7)])
def test_nhwc_training_matches_torch_channels_last(rng, shape):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    c = shape[3]
    x = random(rng, shape, low=-1, high=2).astype(np.float32)
    dy = random(rng, shape).astype(np.float32)
    gamma, beta = random(rng, (c,), low=0.5, high=1.5).astype(np.float32), random(rng, (c,)).astype(np.float32)
    drm, drv = dev(np.zeros(c, np.float32)), dev(np.ones(c, np.float32))
    xd = dev(x)
    y, saved = kernels.batchnorm_forward_training(xd, dev(gamma), dev(beta), drm, drv, momentum=0.9, epsilon=1e-3,
                                              layout="NHWC")
    dx, dg, db = kernels.batchnorm_backward(dev(dy), xd, dev(gamma), saved, epsilon=1e-3, layout="NHWC")
    to_nchw = (0, 3, 1, 2)
    tx = torch.from_numpy(x.transpose(to_nchw).copy()).cuda().to(memory_format=torch.channels_last)
    tx.requires_grad_(True)
    tg = torch.from_numpy(gamma).cuda().requires_grad_(True)
    tb = torch.from_numpy(beta).cuda().requires_grad_(True)
    t_rm, t_rv = torch.zeros(c).cuda(), torch.ones(c).cuda()
    ty = torch.nn.functional.batch_norm(tx, t_rm, t_rv, tg, tb, training=True, momentum=0.1, eps=1e-3)
    ty.backward(torch.from_numpy(dy.transpose(to_nchw).copy()).cuda())
    nhwc = (0, 2, 3, 1)
    check("batchnorm_forward_training", "float32", y, ty.detach().permute(nhwc).cpu().numpy(), "torch")
    # torch feeds the unbiased batch variance to the running one; Keras (and dnnbind) the biased one
    count = x.size // c
    biased = 0.9 + (t_rv.cpu().numpy().astype(np.float64) - 0.9) * (count - 1) / count
    check("batchnorm.running_var", "float32", drv, biased, "torch, debiased")
    check("batchnorm_backward.dx", "float32", dx, tx.grad.permute(nhwc).cpu().numpy(), "torch")
    check("batchnorm_backward.dgamma", "float32", dg, tg.grad.cpu().numpy(), "torch")
    check("batchnorm_backward.dbeta", "float32", db, tb.grad.cpu().numpy(), "torch")


# ------------------------------------------------------------------------ CPU (no GPU needed)

def test_inference_kernel_source_compiles_for_sm90_and_exports_every_dtype():
    from dnnbind.cuda.kernel import compile_kernel

    cubin = compile_kernel(cm.source("batchnorm.cu"), arch="sm_90", options=cm.KERNEL_OPTIONS)
    for suffix in ("f32", "f16", "bf16"):
        assert f"bn_infer_channels_last_{suffix}".encode() + b"\x00" in cubin


class _FakeArray:
    """Just what the routing reads: shape, dtype, ndim, size, nbytes, device_index, ptr."""

    def __init__(self, shape, dtype=np.float32, ptr=0x1000) -> None:
        self.shape, self.dtype, self.ptr, self.device_index = tuple(shape), np.dtype(dtype), ptr, 0
        self.ndim, self.size = len(self.shape), int(np.prod(self.shape))
        self.nbytes = self.size * self.dtype.itemsize


@pytest.mark.parametrize("shape, dtype, mode, layout, expected", [
    ((8, 4, 4, 64), np.float32, "spatial", "NHWC", True),
    ((8, 4, 4, 64), np.float16, "spatial", "NHWC", True),
    ((8, 4, 4, 64), cm.BF16, "spatial", "NHWC", True),
    ((8, 4, 4, 64), np.float64, "spatial", "NHWC", False),  # no persistent float64: legacy
    ((8, 64, 4, 4), np.float32, "spatial", "NCHW", False),
    ((8, 4, 4, 64), np.float32, "per_activation", "NHWC", False),
    ((32, 7), np.float32, "spatial", "NCHW", True),
    ((32, 7), np.float32, "per_activation", "NHWC", True),  # 2-d: both modes are the same
    ((880802, 1, 1, 2), np.float32, "spatial", "NHWC", False),  # PyTorch's cuDNN N limit
    ((1 << 16, 256, 256, 1), np.float32, "spatial", "NHWC", False),  # >= 2**31 - 1 elements
])
def test_ex_path_routing(shape, dtype, mode, layout, expected):
    assert bn._ex_eligible(_FakeArray(shape, dtype), mode, layout) is expected


def test_ex_path_switches(monkeypatch):
    nhwc, flat = _FakeArray((8, 4, 4, 64)), _FakeArray((32, 7))
    monkeypatch.setattr(bn, "BN2D_PATH", "per_activation")
    assert bn._ex_eligible(nhwc, "spatial", "NHWC") and not bn._ex_eligible(flat, "spatial", "NCHW")
    assert bn._descs(flat, "spatial", "NCHW", cm.F32)[0] == 0  # CUDNN_BATCHNORM_PER_ACTIVATION
    monkeypatch.setattr(bn, "BN2D_PATH", "spatial")
    assert bn._descs(flat, "spatial", "NCHW", cm.F32)[0] == 1  # CUDNN_BATCHNORM_SPATIAL
    monkeypatch.setattr(bn, "USE_PERSISTENT_NHWC", False)
    assert not bn._ex_eligible(nhwc, "spatial", "NHWC")


def _readback(desc):
    from dnnbind._lib import cudnn as C

    handle = desc.handle  # a dnnbind.cudnn.TensorDescriptor
    dtype, nb = ctypes.c_int(), ctypes.c_int()
    dims, strides = (ctypes.c_int * 8)(), (ctypes.c_int * 8)()
    C.cudnnGetTensorNdDescriptor(handle, 8, ctypes.byref(dtype), ctypes.byref(nb), dims, strides)
    return dtype.value, tuple(dims[: nb.value]), tuple(strides[: nb.value])


@pytest.mark.parametrize("shape, dtype, code, dims, strides", [
    ((2, 5, 6, 3), np.float32, 0, (2, 3, 5, 6), (90, 1, 18, 3)),
    ((2, 5, 6, 7), cm.BF16, 9, (2, 7, 5, 6), (210, 1, 42, 7)),
    ((4, 7), np.float16, 2, (4, 7, 1, 1), (7, 1, 7, 7)),  # (N, C) is packed NHWC (N, C, 1, 1)
])
def test_ex_descriptors_describe_packed_nhwc_with_float32_parameters(shape, dtype, code, dims, strides):
    xd, pd = bn._ex_descs(_FakeArray(shape, dtype))
    assert _readback(xd) == (code, dims, strides)
    assert _readback(pd) == (0, (1, dims[1], 1, 1), (dims[1], 1, 1, 1))


def test_reserve_is_used_only_for_the_x_it_was_made_for():
    x = _FakeArray((8, 4, 4, 64))
    reserve = _FakeArray((4096,), np.uint8, ptr=0xABC000)
    saved = kernels.BatchNormSaved(_FakeArray((64,)), _FakeArray((64,)), reserve=reserve, path=bn.PERSISTENT,
                               x_shape=x.shape, x_dtype=x.dtype)
    assert bn._reserve_for(saved, x, 4096) is reserve
    assert bn._reserve_for(saved, x, 4097) is None  # smaller than what cuDNN asks for now
    assert bn._reserve_for(saved, _FakeArray((8, 4, 4, 64), np.float16), 4096) is None  # other dtype
    assert bn._reserve_for(saved, _FakeArray((4, 4, 4, 64)), 4096) is None  # other shape
    assert bn._reserve_for(dataclasses.replace(saved, path=bn.LEGACY), x, 4096) is None  # other path
    assert bn._reserve_for(kernels.BatchNormSaved(saved.mean, saved.inv_std), x, 4096) is None  # built by hand


class _FakeStream:
    device_index, handle = 0, 0x77


def _ctypes_check(name: str, args: tuple) -> None:
    from dnnbind._lib import cudnn as C

    argtypes = C.SIGNATURES[name]
    assert len(args) == len(argtypes), f"{name}: {len(args)} arguments, declared {len(argtypes)}"
    for i, (t, a) in enumerate(zip(argtypes, args)):
        try:
            t.from_param(a)
        except TypeError as exc:
            raise AssertionError(f"{name} argument {i}: {a!r} is not a {t.__name__}") from exc


_CORRECTION: list = []  # (kernel, args, kwargs) of the running-variance correction under fake_cudnn


@pytest.fixture
def fake_cudnn(monkeypatch):
    """Route the CUDA implementation to recorders: every cuDNN batch-norm call is checked against
    the ctypes declaration (argument count and types) instead of being made (descriptors are real)."""
    from dnnbind import cudnn
    from dnnbind._lib import cudnn as C

    calls: list[tuple[str, tuple]] = []
    ptrs = iter(range(0x100000, 0x10000000, 0x1000))

    def recorder(name):
        def call(*args):
            _ctypes_check(name, args)
            calls.append((name, args))
            if name.startswith("cudnnGet") and name.endswith("Size"):
                args[-1]._obj.value = 512  # a non-zero workspace / reserve: the table must carry it
        return call

    for name in C.SIGNATURES:
        if "BatchNormalization" in name:
            monkeypatch.setattr(C, name, recorder(name))

    def empty(shape, dtype, stream):
        return _FakeArray(shape, dtype, ptr=next(ptrs))

    handle = cudnn.Handle.__new__(cudnn.Handle)  # borrowed, around a made-up pointer: never reaches cuDNN
    handle._adopt(0x99, lambda ptr: 0, owned=False)
    def output(out, shape, dtype, stream):
        return out if out is not None else empty(shape, dtype, stream)

    for attr, value in (("stream_of", lambda s: _FakeStream()), ("cudnn_handle", lambda s: handle),
                        ("empty", empty), ("output", output)):
        monkeypatch.setattr(cm, attr, value)
    monkeypatch.setattr(cudnn, "workspace", lambda s, n: 0x5000 if n else 0)
    # the running-variance correction after a training call (kernels of their own): recorded apart
    _CORRECTION.clear()

    def kernel(name):
        def run(*args, **kwargs):
            _CORRECTION.append((name, args, kwargs))
            return kwargs.get("out") or (args[-1] if name == "axpy" else empty(args[0].shape, args[0].dtype, None))
        return run

    for name in ("copy", "scale", "axpy"):
        monkeypatch.setattr(bn, name, kernel(name))
    monkeypatch.setattr(bn, "_fwd_sizes", cudnn.LRUCache(8))
    monkeypatch.setattr(bn, "_bwd_sizes", cudnn.LRUCache(8))
    return calls


def test_ex_calls_match_the_ctypes_declarations_and_carry_the_reserve(fake_cudnn):
    x = _FakeArray((8, 4, 4, 64), ptr=0x1000)
    p = [_FakeArray((64,), ptr=0x2000 + i * 0x100) for i in range(4)]
    y, saved = bn.batchnorm_forward_training(x, *p, momentum=0.9, epsilon=1e-3, layout="NHWC")
    mean, inv = saved.mean, saved.inv_std
    fwd = dict(fake_cudnn)["cudnnBatchNormalizationForwardTrainingEx"]
    assert fwd[1:3] == (2, 0)  # SPATIAL_PERSISTENT, OPS_BN
    assert fwd[14] == pytest.approx(0.1) and fwd[17] == 1e-3  # exponentialAverageFactor = 1 - momentum, epsilon
    assert fwd[18:20] == (mean.ptr, inv.ptr) and fwd[22] == 512 and fwd[24] == 512
    reserve_ptr = fwd[23]
    assert reserve_ptr and saved.reserve.ptr == reserve_ptr and saved.reserve.nbytes == 512
    assert saved.path == bn.PERSISTENT and saved.x_shape == x.shape and saved.x_dtype == x.dtype
    # cuDNN fed running_var the unbiased variance: rv = (n-1)/n * rv + momentum/n * old (n = 8*4*4), Keras's
    (_, (rv_in,), _), (_, (rv1, f1), k1), (_, (f2, old, rv2), _) = _CORRECTION
    assert [c[0] for c in _CORRECTION] == ["copy", "scale", "axpy"] and rv_in is p[3] and rv1 is rv2 is p[3]
    assert f1 == pytest.approx(127 / 128) and k1["out"] is p[3] and f2 == pytest.approx(0.9 / 128)
    # the size queries are cached by what the descriptors describe, never by their handles
    assert [key for key, _ in bn._fwd_sizes.items()] == [(0, (8, 64, 4, 4), np.dtype(np.float32))]
    dy = _FakeArray(x.shape, ptr=0x3000)
    bn.batchnorm_backward(dy, x, p[0], saved, epsilon=1e-3, layout="NHWC")
    bwd = dict(fake_cudnn)["cudnnBatchNormalizationBackwardEx"]
    assert bwd[1:3] == (2, 0) and bwd[8] == x.ptr and bwd[12] == dy.ptr and bwd[18] == p[0].ptr
    assert bwd[23:25] == (mean.ptr, inv.ptr) and bwd[28:30] == (reserve_ptr, 512)
    assert [key for key, _ in bn._bwd_sizes.items()] == [(0, (8, 64, 4, 4), np.dtype(np.float32))]
    # A record without the reserve (built by hand): the legacy backward, never a NULL reserve.
    fake_cudnn.clear()
    bn.batchnorm_backward(dy, x, p[0], kernels.BatchNormSaved(_FakeArray((64,), ptr=0x9000), inv), epsilon=1e-3,
                          layout="NHWC")
    assert [name for name, _ in fake_cudnn] == ["cudnnBatchNormalizationBackward"]


def test_legacy_calls_match_the_ctypes_declarations(fake_cudnn):
    x = _FakeArray((4, 7, 3, 5), ptr=0x1000)
    p = [_FakeArray((7,), ptr=0x2000 + i * 0x100) for i in range(4)]
    _, saved = bn.batchnorm_forward_training(x, *p, momentum=0.9, epsilon=1e-3, layout="NCHW")
    assert saved.path == bn.LEGACY and saved.reserve is None and saved.x_shape == x.shape
    bn.batchnorm_backward(_FakeArray(x.shape, ptr=0x3000), x, p[0], saved, epsilon=1e-3, layout="NCHW")
    assert [name for name, _ in fake_cudnn] == ["cudnnBatchNormalizationForwardTraining",
                                                "cudnnBatchNormalizationBackward"]


def test_ex_refusal_falls_back_to_legacy_once_with_a_warning(fake_cudnn, monkeypatch):
    from dnnbind._lib import cudnn as C
    from dnnbind.errors import CudnnError

    monkeypatch.setattr(bn, "_ex_refused", set())

    def refuse_ex(*args):
        raise CudnnError(3000, "CUDNN_STATUS_NOT_SUPPORTED", "cudnnBatchNormalizationForwardTrainingEx")

    monkeypatch.setattr(C, "cudnnBatchNormalizationForwardTrainingEx", refuse_ex)
    x = _FakeArray((4, 3, 3, 5), np.float16, ptr=0x1000)
    p = [_FakeArray((5,), ptr=0x2000 + i * 0x100) for i in range(4)]
    with pytest.warns(RuntimeWarning, match="refused"):
        bn.batchnorm_forward_training(x, *p, momentum=0.9, epsilon=1e-3, layout="NHWC")
    assert bn._ex_refused == {(0, (4, 3, 3, 5), "float16")}
    fake_cudnn.clear()
    bn.batchnorm_forward_training(x, *p, momentum=0.9, epsilon=1e-3, layout="NHWC")  # no second try
    assert [name for name, _ in fake_cudnn] == ["cudnnBatchNormalizationForwardTraining"]


# ------------------------------------------------------------------- fused relu (issue 9)

@pytest.fixture
def fake_relu(monkeypatch):
    """Record the separate relu launches of the unfused fallback (cuDNN's BN calls are faked apart)."""
    calls: list[tuple] = []

    def forward(x, kind, *, out=None, stream=None, alpha=None):
        calls.append(("relu_forward", kind, x.ptr, out.ptr))
        return out

    def backward(dy, x, y, kind, *, stream=None, alpha=None):
        calls.append(("relu_backward", kind, dy.ptr, x.ptr, y.ptr))
        return _FakeArray(dy.shape, dy.dtype, ptr=0xD0000)

    monkeypatch.setattr(bn, "activation_forward", forward)
    monkeypatch.setattr(bn, "activation_backward", backward)
    monkeypatch.setattr(bn, "_ex_refused", set())
    return calls


def test_fused_relu_is_one_ex_call_each_way_with_the_relu_descriptor(fake_cudnn, fake_relu):
    from dnnbind import cudnn
    from dnnbind._lib import cudnn as C

    x = _FakeArray((8, 4, 4, 64), ptr=0x1000)
    p = [_FakeArray((64,), ptr=0x2000 + i * 0x100) for i in range(4)]
    y, saved = bn.batchnorm_forward_training(x, *p, momentum=0.9, epsilon=1e-3, layout="NHWC", activation="relu")
    assert fake_relu == []  # no separate relu launch
    names = [name for name, _ in fake_cudnn]
    assert names == ["cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize",
                     "cudnnGetBatchNormalizationTrainingExReserveSpaceSize",
                     "cudnnBatchNormalizationForwardTrainingEx"]
    calls = dict(fake_cudnn)
    relu = cudnn.ActivationDescriptor.cached(C.ActivationMode.RELU, 0.0, None, True)
    info = relu.get()
    assert info.mode == "relu" and info.coef == 0.0 and info.nan_propagation
    ws_q = calls["cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize"]
    assert ws_q[1:3] == (2, 1) and ws_q[4] is None and ws_q[7] == relu.handle  # BN_ACTIVATION, no z, the relu
    res_q = calls["cudnnGetBatchNormalizationTrainingExReserveSpaceSize"]
    assert res_q[1:4] == (2, 1, relu.handle)
    fwd = calls["cudnnBatchNormalizationForwardTrainingEx"]
    assert fwd[1:3] == (2, 1) and fwd[7:9] == (None, None) and fwd[10] == y.ptr and fwd[20] == relu.handle
    assert fwd[23] == saved.reserve.ptr and fwd[24] == 512
    assert saved.path == bn.FUSED and saved.activation == "relu" and saved.beta is p[1]
    # the fused sizes are cached apart from the plain ones
    assert [key for key, _ in bn._fwd_sizes.items()] == [(0, (8, 64, 4, 4), np.dtype(np.float32), "relu")]
    fake_cudnn.clear()
    dy = _FakeArray(x.shape, ptr=0x3000)
    bn.batchnorm_backward(dy, x, p[0], saved, epsilon=1e-3, layout="NHWC", activation="relu", y=y)
    assert fake_relu == []
    calls = dict(fake_cudnn)
    bws = calls["cudnnGetBatchNormalizationBackwardExWorkspaceSize"]
    assert bws[1:3] == (2, 1) and bws[6] is None and bws[9] == relu.handle
    bwd = calls["cudnnBatchNormalizationBackwardEx"]
    assert bwd[1:3] == (2, 1) and bwd[8] == x.ptr and bwd[10] == y.ptr and bwd[12] == dy.ptr
    assert bwd[18:20] == (p[0].ptr, p[1].ptr) and bwd[25] == relu.handle  # gamma, beta, the relu
    assert bwd[28:30] == (saved.reserve.ptr, 512)
    # the plain backward never takes the fused reserve, nor the fused backward a plain one
    assert bn._reserve_for(saved, x, 512) is None and bn._reserve_for(saved, x, 512, bn.FUSED) is saved.reserve


@pytest.mark.parametrize("shape, layout, why", [
    ((8, 4, 4, 6), "NHWC", "C not a multiple of 4"),
    ((32, 8), "NCHW", "2-d (N, C)"),
    ((8, 8, 4, 4), "NCHW", "legacy NCHW"),
])
def test_fused_relu_elsewhere_runs_the_plain_calls_then_the_relu(fake_cudnn, fake_relu, shape, layout, why):
    x = _FakeArray(shape, ptr=0x1000)
    c = shape[3] if (len(shape) == 4 and layout == "NHWC") else shape[1]
    p = [_FakeArray((c,), ptr=0x2000 + i * 0x100) for i in range(4)]
    y, saved = bn.batchnorm_forward_training(x, *p, momentum=0.9, epsilon=1e-3, layout=layout, activation="relu")
    assert fake_relu == [("relu_forward", "relu", y.ptr, y.ptr)], why  # in place on y
    assert all(args[2] == 0 for name, args in fake_cudnn if "Ex" in name), why  # only CUDNN_BATCHNORM_OPS_BN
    assert saved.activation == "relu" and saved.path in (bn.PERSISTENT, bn.LEGACY) and saved.beta is None
    fake_relu.clear()
    fake_cudnn.clear()
    dy = _FakeArray(x.shape, ptr=0x3000)
    bn.batchnorm_backward(dy, x, p[0], saved, epsilon=1e-3, layout=layout, activation="relu", y=y)
    assert fake_relu == [("relu_backward", "relu", dy.ptr, y.ptr, y.ptr)], why
    backward = [args for name, args in fake_cudnn if name.startswith("cudnnBatchNormalizationBackward")]
    assert len(backward) == 1
    dy_arg = backward[0][12] if len(backward[0]) == 30 else backward[0][9]  # BackwardEx / legacy Backward
    assert dy_arg == 0xD0000, why  # the relu backward's result, not dy


def test_fused_refusal_falls_back_to_the_plain_ex_call_without_a_warning(fake_cudnn, fake_relu, monkeypatch):
    import warnings

    from dnnbind._lib import cudnn as C
    from dnnbind.errors import CudnnError

    recorded = C.cudnnBatchNormalizationForwardTrainingEx

    def refuse_fused(*args):
        if args[2] == 1:
            raise CudnnError(3000, "CUDNN_STATUS_NOT_SUPPORTED", "cudnnBatchNormalizationForwardTrainingEx")
        recorded(*args)

    monkeypatch.setattr(C, "cudnnBatchNormalizationForwardTrainingEx", refuse_fused)
    x = _FakeArray((4, 3, 3, 8), cm.BF16, ptr=0x1000)
    p = [_FakeArray((8,), ptr=0x2000 + i * 0x100) for i in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y, saved = bn.batchnorm_forward_training(x, *p, momentum=0.9, epsilon=1e-3, layout="NHWC", activation="relu")
    assert bn._ex_refused == {(0, (4, 3, 3, 8), "bfloat16", "relu")}  # the plain Ex call stays in use
    assert saved.path == bn.PERSISTENT and saved.activation == "relu"
    assert fake_relu == [("relu_forward", "relu", y.ptr, y.ptr)]
    fake_cudnn.clear()
    bn.batchnorm_forward_training(x, *p, momentum=0.9, epsilon=1e-3, layout="NHWC", activation="relu")
    assert [args[2] for name, args in fake_cudnn if name == "cudnnBatchNormalizationForwardTrainingEx"] == [0]


def test_fused_switch_is_in_the_capture_key(monkeypatch):
    key = kernels.config.capture_key()
    monkeypatch.setattr(bn, "FUSE_ACTIVATION", False)
    assert kernels.config.capture_key() != key
    monkeypatch.setattr(bn, "FUSE_ACTIVATION", True)
    with kernels.config.override(fuse_layers=False):
        assert kernels.config.capture_key() != key
    assert kernels.config.capture_key() == key


# (layout, shape): the fused cuDNN calls (4-d NHWC, C a multiple of 4; of 8 and not), and the
# unfused fallback (odd C, 2-d (N, C), legacy NCHW)
FUSED_CASES = [("NHWC", (4, 5, 6, 8)), ("NHWC", (3, 4, 4, 64)), ("NHWC", (2, 3, 5, 12)), ("NHWC", (4, 5, 6, 3)),
               ("NHWC", (2, 3, 3, 7)), ("NCHW", (16, 8)), ("NCHW", (16, 7)), ("NCHW", (4, 3, 5, 6))]


def _fused_inputs(rng, layout, shape, dtype):
    """x (rounded to dtype) and float32 gamma/beta/running stats with every pre-activation at
    least 1e-3 from relu's kink (in the float64 reference), so GPU and reference masks agree."""
    axes = (0,) if len(shape) == 2 else ((0, 1, 2) if layout == "NHWC" else (0, 2, 3))
    pshape = (shape[1],) if (len(shape) == 2 or layout == "NCHW") else (shape[3],)
    x = quantize(random(rng, shape, low=-2, high=3), dtype)
    gamma = random(rng, pshape, low=0.5, high=1.5).astype(np.float32)
    beta, margin = relu_safe_beta(x, gamma.astype(np.float64), axes, epsilon=1e-3, layout=layout)
    assert margin > 1e-3, margin
    beta = beta.astype(np.float32)
    rm, rv = random(rng, pshape).astype(np.float32), random(rng, pshape, low=0.5, high=2).astype(np.float32)
    return x, gamma, beta, rm, rv


@pytest.mark.gpu
@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("layout, shape", FUSED_CASES)
def test_fused_relu_matches_the_reference(rng, label, dtype, layout, shape):
    x, gamma, beta, rm, rv = _fused_inputs(rng, layout, shape, dtype)
    kw = dict(epsilon=1e-3, mode="spatial", layout=layout)
    g64, b64, rm_ref, rv_ref = (a.astype(np.float64) for a in (gamma, beta, rm, rv))
    y_ref, saved_ref = kernels.batchnorm_forward_training(x, g64, b64, rm_ref, rv_ref, momentum=0.9, activation="relu",
                                                      **kw)
    assert np.any(y_ref == 0) and np.any(y_ref > 0)
    xd, dgamma, dbeta, drm, drv = dev(x, dtype), dev(gamma), dev(beta), dev(rm), dev(rv)
    y, saved = kernels.batchnorm_forward_training(xd, dgamma, dbeta, drm, drv, momentum=0.9, activation="relu",
                                              out=poisoned(shape, dtype), **kw)
    case = f"{layout} {shape} path {saved.path}"
    assert saved.activation == "relu", case
    check("batchnorm_relu_forward_training", label, y, y_ref, case)
    assert np.all(host(y) >= 0), case  # the relu was applied (a fused call that ignored it would leave negatives)
    check("batchnorm_relu.save_mean", label, saved.mean, saved_ref.mean, case)
    check("batchnorm_relu.save_inv_std", label, saved.inv_std, saved_ref.inv_std, case)
    check("batchnorm_relu.running_mean", label, drm, rm_ref, case)
    check("batchnorm_relu.running_var", label, drv, rv_ref, case)
    dy = quantize(random(rng, shape), dtype)
    got = kernels.batchnorm_backward(dev(dy, dtype), xd, dgamma, saved, activation="relu", y=y, **kw)
    ref = kernels.batchnorm_backward(dy, x, g64, saved_ref, activation="relu", y=y_ref, **kw)
    for name, a, r in zip(("dx", "dgamma", "dbeta"), got, ref):
        check(f"batchnorm_relu_backward.{name}", label, a, r, case)
    if dtype == np.float16 and len(shape) == 4 and layout == "NHWC" and shape[3] % 8 == 0:
        # the case every framework that fuses (TensorFlow, MXNet, nnabla) runs: it must not have fallen back
        assert saved.path == bn.FUSED, case


@pytest.mark.gpu
@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("layout, shape", FUSED_CASES[:4])
def test_fused_relu_matches_the_unfused_gpu_ops(rng, label, dtype, layout, shape):
    x, gamma, beta, rm, rv = _fused_inputs(rng, layout, shape, dtype)
    kw = dict(epsilon=1e-3, mode="spatial", layout=layout)
    xd, dgamma, dbeta = dev(x, dtype), dev(gamma), dev(beta)
    dyd = dev(quantize(random(rng, shape), dtype), dtype)
    drm_f, drv_f, drm_u, drv_u = dev(rm), dev(rv), dev(rm), dev(rv)
    y, saved = kernels.batchnorm_forward_training(xd, dgamma, dbeta, drm_f, drv_f, momentum=0.9, activation="relu",
                                              out=poisoned(shape, dtype), **kw)
    fused = kernels.batchnorm_backward(dyd, xd, dgamma, saved, activation="relu", y=y, **kw)
    # what the layers run without fusion: the batch norm, the relu layer, and their backwards in reverse
    pre, saved_u = kernels.batchnorm_forward_training(xd, dgamma, dbeta, drm_u, drv_u, momentum=0.9,
                                                  out=poisoned(shape, dtype), **kw)
    y_u = kernels.activation_forward(pre, "relu", out=poisoned(shape, dtype))
    unfused = kernels.batchnorm_backward(kernels.activation_backward(dyd, pre, y_u, "relu"), xd, dgamma, saved_u, **kw)
    case = f"{layout} {shape} fused path {saved.path}"
    check("batchnorm_relu_vs_unfused.y", label, y, host(y_u), case)
    check("batchnorm_relu_vs_unfused.running_mean", label, drm_f, host(drm_u), case)
    check("batchnorm_relu_vs_unfused.running_var", label, drv_f, host(drv_u), case)
    for name, a, r in zip(("dx", "dgamma", "dbeta"), fused, unfused):
        check(f"batchnorm_relu_vs_unfused.{name}", label, a, host(r), case)
