"""What the registry harness cannot see of ``dnnbind/ops/_math.py`` and ``dnnbind/kernels/segment.py``: error
messages, complex values, round trips, the device guards, the tie rule of segment maxima, the CUDA source."""

from __future__ import annotations

import types

import numpy as np
import pytest

from dnnbind import ops
from dnnbind.autodiff import GradientTape
from dnnbind.cuda.kernel import compile_kernel
from dnnbind.kernels import segment as SEG
from dnnbind.kernels._cuda import _common as cm
from dnnbind.ops import _core
from dnnbind.ops import _math

pytestmark = pytest.mark.usefixtures("cpu")  # the NumPy backend (conftest.py)


def _grads(fn, *xs):
    ts = [ops.convert_to_tensor(np.asarray(x, np.float64)) for x in xs]
    with GradientTape() as tape:
        for t in ts:
            tape.watch(t)
        y = fn(*ts)
    return [np.asarray(g) for g in tape.gradient(y, ts)]


# ------------------------------------------------------------------------------------------ segments
def test_index_reduce_reference():
    x = np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])
    got = SEG.index_reduce("max", x, np.array([2, 0, 2, -3]), np.array([[9.0, -1], [np.nan, 7], [1, 8], [3, 3]]))
    np.testing.assert_array_equal(got, [[np.nan, 7.0], [2, 3], [9, 8]])
    got = SEG.index_reduce("prod", np.ones((2, 3), np.int8), np.array([2, 2]), np.full((2, 2), 16, np.int8), axis=1)
    np.testing.assert_array_equal(got, [[1, 1, 0], [1, 1, 0]])  # 256 wraps to 0, as int8 does
    assert got.dtype == np.int8
    with pytest.raises(IndexError, match="index_reduce: index 3 is out of bounds for axis 0 of size 3"):
        SEG.index_reduce("min", x, np.array([3]), np.ones((1, 2)))
    with pytest.raises(ValueError, match="index_reduce: op must be one of"):
        SEG.index_reduce("sum", x, np.array([0]), np.ones((1, 2)))
    with pytest.raises(ValueError, match=r"index_reduce: updates must have shape \(1, 2\)"):
        SEG.index_reduce("min", x, np.array([0]), np.ones((2, 2)))
    with pytest.raises(TypeError, match="index_reduce: updates have dtype float32 but x has float64"):
        SEG.index_reduce("min", x, np.array([0]), np.ones((1, 2), np.float32))


def test_segment_cuda_source_compiles_for_sm90_and_exports_every_kernel():
    cubin = compile_kernel(cm.source("segment.cu"), arch="sm_90", options=cm.KERNEL_OPTIONS)
    names = [f"index_reduce_{op}_{t}_{i}" for op in SEG.REDUCE_OPS for t in ("f32", "f64", "i32", "i64")
             for i in ("i32", "i64")]
    assert [n for n in names if n.encode() + b"\x00" not in cubin] == []


def test_segment_max_ties_share_the_gradient_as_jax():
    data = np.array([[1.0, 5.0], [1.0, 2.0], [0.0, 5.0], [3.0, 3.0]])
    (g,) = _grads(lambda d: ops.sum(ops.segment_max(d, np.array([0, 0, 0, 1]), num_segments=2)), data)
    np.testing.assert_array_equal(g, [[0.5, 0.5], [0.5, 0.0], [0.0, 0.5], [1.0, 1.0]])
    (g,) = _grads(lambda d: ops.sum(ops.segment_min(d, np.array([0, 0, -1, 1]), num_segments=2)), data)
    np.testing.assert_array_equal(g, [[0.5, 0.0], [0.5, 1.0], [0.0, 0.0], [1.0, 1.0]])  # id -1: dropped


def test_segment_ids_are_checked_and_num_segments_inferred():
    data = np.arange(6.0).reshape(3, 2)
    np.testing.assert_array_equal(np.asarray(ops.segment_sum(data, np.array([1, 1, 4]))),
                                  [[0, 0], [2, 4], [0, 0], [0, 0], [4, 5]])
    with pytest.raises(ValueError, match="segment_sum: Argument `segment_ids` should be an 1-D vector"):
        ops.segment_sum(data, np.zeros((3, 1), np.int32), num_segments=2)
    with pytest.raises(ValueError, match=r"segment_max: Argument `segment_ids` and `data` should have same leading "
                                         r"dimension. Got \(2,\) v.s. \(3, 2\)"):
        ops.segment_max(data, np.array([0, 1]), num_segments=2)
    with pytest.raises(TypeError, match="segment_min: segment_ids must be an integer tensor, got dtype float64"):
        ops.segment_min(data, np.array([0.0, 1.0, 1.0]), num_segments=2)
    with pytest.raises(ValueError, match="segment_prod: num_segments must be a non-negative int, got -1"):
        ops.segment_prod(data, np.array([0, 1, 1]), num_segments=-1)
    with pytest.raises(TypeError, match="segment_sum: data of dtype bool is not supported"):
        ops.segment_sum(np.ones(3, bool), np.array([0, 1, 1]), num_segments=2)


# ---------------------------------------------------------------------------------- Fourier transforms
def test_fft_round_trips():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 9))
    for n in (9, 10, 7):
        back = ops.irfft(ops.rfft(x, n), n)
        np.testing.assert_allclose(np.asarray(back), np.fft.irfft(np.fft.rfft(x, n), n), atol=1e-12)
    re, im = rng.normal(size=(2, 4, 6)), rng.normal(size=(2, 4, 6))
    r2, i2 = ops.ifft2(ops.fft2((re, im)))
    np.testing.assert_allclose(np.asarray(r2), re, atol=1e-12)
    np.testing.assert_allclose(np.asarray(i2), im, atol=1e-12)


def test_irfft_ignores_the_imaginary_parts_of_the_zero_and_nyquist_terms():
    re, im = np.array([1.0, 2.0, 3.0]), np.array([5.0, 0.5, -7.0])
    half = re + 1j * im
    got = ops.irfft((re, im))  # n = 4: term 2 is the Nyquist term
    np.testing.assert_allclose(np.asarray(got), np.fft.irfft(half), atol=1e-12)
    (g_re, g_im) = _grads(lambda r, i: ops.sum(ops.multiply(ops.irfft([r, i]), np.arange(4.0))), re, im)
    assert g_im[0] == 0 and g_im[2] == 0


def test_stft_matches_scipy_and_istft_inverts_it():
    signal = pytest.importorskip("scipy.signal")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 64))
    # Keras: scipy's stft of the reflect-padded signal, window centred in fft_length, rescaled by |sum(w)|
    win = np.pad(signal.get_window("hann", 10), (3, 3))
    padded = np.pad(x, [(0, 0), (8, 8)], mode="reflect")
    want = signal.stft(padded, window=win, nperseg=16, noverlap=12, nfft=16, boundary=None, padded=False)[-1]
    want = np.swapaxes(want * win.sum(), -2, -1)
    re, im = ops.stft(x, 10, 4, 16)
    np.testing.assert_allclose(np.asarray(re), want.real, atol=1e-12)
    np.testing.assert_allclose(np.asarray(im), want.imag, atol=1e-12)
    back = ops.istft((re, im), 10, 4, 16, length=64)
    np.testing.assert_allclose(np.asarray(back), x, atol=1e-10)
    back = ops.istft(ops.stft(x, 16, 8, 16, window=None), 16, 8, 16, window=None)
    assert back.shape == (2, 64)
    np.testing.assert_allclose(np.asarray(back) * 8 / 16, x, atol=1e-10)  # Keras's no-window scaling


def test_fourier_arguments_are_checked():
    with pytest.raises(ValueError, match="fft: Input `x` should be a tuple of two tensors"):
        ops.fft(np.ones(4))
    with pytest.raises(ValueError, match=r"fft2: .*Received: x\[0\].shape = \(2, 2\), x\[1\].shape = \(2, 3\)"):
        ops.fft2((np.ones((2, 2)), np.ones((2, 3))))
    with pytest.raises(ValueError, match="ifft2: At least one tensor in input `x` is not of type float"):
        ops.ifft2((np.ones((2, 2), np.int32), np.ones((2, 2))))
    with pytest.raises(ValueError, match=r"fft2: Input should have rank >= 2. Received: input.shape = \(4,\)"):
        ops.fft2((np.ones(4), np.ones(4)))
    with pytest.raises(ValueError, match=r"irfft: Invalid number of FFT data points \(0\) specified"):
        ops.irfft((np.ones(1), np.ones(1)))
    with pytest.raises(TypeError, match="stft: Invalid input type. Expected `float32` or `float64`"):
        ops.stft(np.ones(8, np.float16), 4, 2, 4)
    with pytest.raises(ValueError, match="stft: `fft_length` must equal or larger than `sequence_length`"):
        ops.stft(np.ones(8), 4, 2, 3)
    with pytest.raises(ValueError, match="istft: `sequence_stride` must be a positive integer"):
        ops.istft((np.ones((2, 3)), np.ones((2, 3))), 4, 0, 4)
    with pytest.raises(ValueError, match='stft: If a string is passed to `window`, it must be one of `"hann"`'):
        ops.stft(np.ones(8), 4, 2, 4, window="blackman")
    with pytest.raises(ValueError, match=r"stft: The shape of `window` must be equal to \[sequence_length\]"):
        ops.stft(np.ones(8), 4, 2, 4, window=np.ones(3))
    with pytest.raises(ValueError, match=r"extract_sequences: `sequence_stride` must be a positive integer"):
        ops.extract_sequences(np.ones(8), 2, 0)


def test_cpu_only_ops_refuse_device_tensors_before_running_anything(monkeypatch):
    # a stand-in for a GPU tensor: the guard must raise before any kernel, with no copy to the host
    fake = types.SimpleNamespace(is_device_array=lambda data: True)
    monkeypatch.setattr(_math, "backend", fake)
    calls = []
    monkeypatch.setattr(_math.np.fft, "fftn", lambda *a, **k: calls.append(a))
    for fn, args in ((ops.fft, ((np.ones(4), np.ones(4)),)), (ops.rfft, (np.ones(4),)),
                     (ops.stft, (np.ones(16), 4, 2, 4)), (ops.istft, ((np.ones((3, 3)), np.ones((3, 3))), 4, 2, 4)),
                     (ops.slogdet, (np.eye(2),)), (ops.logdet, (np.eye(2),)), (ops.polar, (np.ones(2), np.ones(2))),
                     (ops.view_as_complex, (np.ones((2, 2)),))):
        with pytest.raises(NotImplementedError, match="runs on the CPU backend only"):
            fn(*args)
    assert calls == []


# ----------------------------------------------------------------------------------- complex views
def test_complex_views_values_and_dtypes():
    x = np.array([[1.0, 2.0], [-3.0, 0.5]])
    z = ops.view_as_complex(x)
    assert z.dtype == np.complex64  # Keras's dtype, also for float64 input
    np.testing.assert_array_equal(np.asarray(z), [1 + 2j, -3 + 0.5j])
    back = ops.view_as_real(z)
    assert back.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(back), x)
    assert ops.view_as_real(np.array([1 + 1j])).dtype == np.float64
    p = ops.polar(np.array([2.0, 1.0]), np.array([0.0, np.pi / 2]))
    assert p.dtype == np.complex128
    np.testing.assert_allclose(np.asarray(p), [2.0, 1j], atol=1e-15)
    assert ops.polar(np.ones(2, np.float32), np.zeros(2, np.float32)).dtype == np.complex64
    with pytest.raises(ValueError, match=r"view_as_complex: Last dimension of input must be size 2"):
        ops.view_as_complex(np.ones((2, 3)))


# ------------------------------------------------------------------------------ distances, determinants
def test_cdist_of_identical_points_is_zero_and_arguments_are_checked():
    x = np.array([[0.5, -1.0, 2.0], [1.0, 1.0, 1.0]])
    np.testing.assert_allclose(np.asarray(ops.cdist(x, x)).diagonal(), 0.0, atol=1e-7)
    with pytest.raises(ValueError, match="cdist: Inputs to `cdist` must have rank >= 2"):
        ops.cdist(np.ones(3), np.ones((2, 3)))
    with pytest.raises(ValueError, match="cdist: The last dimension of inputs to `cdist` must match"):
        ops.cdist(np.ones((2, 3)), np.ones((2, 4)))
    with pytest.raises(ValueError, match="cdist: Batch dimensions of inputs to `cdist` must be broadcastable"):
        ops.cdist(np.ones((2, 2, 3)), np.ones((3, 2, 3)))


def test_logdet_gradients_and_the_linalg_inv_hook(monkeypatch):
    rng = np.random.default_rng(2)
    m = rng.normal(size=(3, 3)) + 3 * np.eye(3)
    (g,) = _grads(lambda t: ops.logdet(t), m)
    np.testing.assert_allclose(g, np.linalg.inv(m).T, rtol=1e-12)
    # second order: d/dm sum(inv(m)^T) = -inv^T 1 inv^T, transposed
    t = ops.convert_to_tensor(m)
    with GradientTape() as outer:
        outer.watch(t)
        with GradientTape() as inner:
            inner.watch(t)
            y = ops.logdet(t)
        s = ops.sum(inner.gradient(y, t))
    inv = np.linalg.inv(m)
    np.testing.assert_allclose(np.asarray(outer.gradient(s, t)), -(inv @ np.ones((3, 3)) @ inv).T, rtol=1e-10)
    # the linalg family's inv is used once it is registered
    used = []

    def inv(x):
        used.append(x)
        return ops.convert_to_tensor(np.linalg.inv(np.asarray(x)))

    monkeypatch.setitem(_core.REGISTRY, "inv", {"fn": inv, "differentiable": True, "family": "linalg"})
    (g,) = _grads(lambda t: ops.logdet(t), m)
    assert len(used) == 1
    np.testing.assert_allclose(g, np.linalg.inv(m).T, rtol=1e-12)
    with pytest.raises(ValueError, match=r"slogdet: x must be a square matrix or a batch of them \(\.\.\., n, n\), got "
                                         r"shape \(2, 3\)"):
        ops.slogdet(np.ones((2, 3)))
    sign, logabs = ops.slogdet(np.diag([2.0, -3.0]))
    assert sign.shape == () and float(sign) == -1.0 and float(logabs) == pytest.approx(np.log(6.0))
