"""cuBLAS on a real GPU: handle lifecycle, SGEMM and GemmEx (TF32, fp16, bf16) against NumPy."""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

import dnnbind.cublas as cb
from dnnbind._lib import cublas as CB

pytestmark = pytest.mark.gpu


def _cuda():
    from dnnbind import cuda

    return cuda


def test_handle_lifecycle_workspace_and_modes():
    cuda = _cuda()
    stream = cuda.Stream()
    with cb.Handle(stream=stream) as handle:
        out = ctypes.c_void_p()
        CB.cublasGetStream_v2(handle.handle, ctypes.byref(out))
        assert out.value == stream.handle == handle.stream
        cc = cuda.Device(handle.device).compute_capability
        assert handle.workspace.nbytes == cb.workspace_size(cc) == (32 if cc[0] >= 9 else 4) * 2**20
        mode = ctypes.c_int()
        CB.cublasGetPointerMode_v2(handle.handle, ctypes.byref(mode))
        assert mode.value == CB.PointerMode.HOST
        assert handle.math == "default"
        handle.set_math("pedantic")
        assert handle.math == "pedantic"
        handle.set_stream(cuda.Stream())  # re-attaches the workspace
    assert handle.closed
    handle.close()


def test_get_handle_cached():
    cuda = _cuda()
    s = cuda.Stream()
    assert cb.get_handle(s) is cb.get_handle(s)
    assert cb.get_handle(s) is not cb.get_handle(cuda.Stream())


def _row_major_gemm(a, b, c_dtype, compute, handle, stream):
    """C = A @ B for row-major arrays via column-major cuBLAS: C^T = B^T A^T."""
    cuda = _cuda()
    m, k = a.shape
    _, n = b.shape
    d_a, d_b = cuda.to_device(a, stream=stream), cuda.to_device(b, stream=stream)
    d_c = cuda.to_device(np.full((m, n), np.nan, dtype=c_dtype), stream=stream)
    cb.gemm(handle, "N", "N", n, m, k, 1.0, d_b, n, d_a, k, 0.0, d_c, n, a_dtype=b.dtype, b_dtype=a.dtype,
            c_dtype=c_dtype, compute=compute)
    return d_c.to_host(stream=stream)


def _rel(got, want):
    return float(np.max(np.abs(got.astype(np.float64) - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("m,n,k", [(37, 53, 29), (128, 17, 256), (5, 300, 64)])
def test_sgemm_raw_matches_numpy(rng, m, n, k):
    cuda = _cuda()
    stream = cuda.Stream()
    handle = cb.Handle(stream=stream)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    d_a, d_b = cuda.to_device(a, stream=stream), cuda.to_device(b, stream=stream)
    d_c = cuda.to_device(np.full((m, n), np.nan, np.float32), stream=stream)
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
    CB.cublasSgemm_v2(handle.handle, CB.Operation.N, CB.Operation.N, n, m, k, ctypes.byref(alpha), d_b.ptr, n,
                      d_a.ptr, k, ctypes.byref(beta), d_c.ptr, n)
    want = a.astype(np.float64) @ b
    assert _rel(d_c.to_host(stream=stream), want) < 1e-5  # CUBLAS_DEFAULT_MATH: plain fp32, no TF32


@pytest.mark.parametrize("dtype,c_dtype,compute,tol", [
    (np.float32, np.float32, "float32", 1e-5),
    (np.float32, np.float32, "tf32", 5e-3),
    (np.float16, np.float16, "float32", 1e-2),
    (np.float16, np.float32, "float32", 5e-3),
    (np.float16, np.float16, "float16", 2e-2),
    (ml_dtypes.bfloat16, ml_dtypes.bfloat16, "float32", 2e-2),
    (ml_dtypes.bfloat16, np.float32, "float32", 1e-2),
    (np.float64, np.float64, "float64", 1e-12),
])
def test_gemm_ex_matches_numpy(rng, dtype, c_dtype, compute, tol):
    cuda = _cuda()
    stream = cuda.Stream()
    handle = cb.get_handle(stream)
    m, n, k = 45, 71, 96
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    got = _row_major_gemm(a, b, np.dtype(c_dtype), compute, handle, stream)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert not np.isnan(got.astype(np.float64)).any()
    assert _rel(got, want) < tol


def test_gemm_transposes_alpha_beta(rng):
    cuda = _cuda()
    stream = cuda.Stream()
    handle = cb.get_handle(stream)
    m, n, k = 23, 31, 17
    # Column-major A^T (k x m stored) and B^T (n x k stored): op = T for both.
    a_t = rng.standard_normal((m, k)).astype(np.float32)  # row-major (m,k) = column-major (k,m)
    b_t = rng.standard_normal((k, n)).astype(np.float32)  # row-major (k,n) = column-major (n,k)
    c0 = rng.standard_normal((n, m)).astype(np.float32)  # row-major (n,m) = column-major (m,n)
    d_a, d_b, d_c = (cuda.to_device(v, stream=stream) for v in (a_t, b_t, c0))
    cb.gemm(handle, "T", "T", m, n, k, 0.5, d_a, k, d_b, n, 2.0, d_c, m, a_dtype=np.float32, b_dtype=np.float32,
            c_dtype=np.float32, compute="float32")
    # column-major C (m x n) = 0.5 * A @ B + 2 * C0 with A = a_t (m x k), B = b_t (k x n)
    want = 0.5 * (a_t.astype(np.float64) @ b_t) + 2.0 * c0.T
    got = d_c.to_host(stream=stream).T
    assert _rel(got, want) < 1e-5


def test_gemm_strided_batched(rng):
    cuda = _cuda()
    stream = cuda.Stream()
    handle = cb.get_handle(stream)
    batch, m, n, k = 3, 19, 11, 27
    a = rng.standard_normal((batch, m, k)).astype(np.float32)
    b = rng.standard_normal((batch, k, n)).astype(np.float32)
    d_a, d_b = cuda.to_device(a, stream=stream), cuda.to_device(b, stream=stream)
    d_c = cuda.to_device(np.full((batch, m, n), np.nan, np.float32), stream=stream)
    cb.gemm_strided_batched(handle, "N", "N", n, m, k, 1.0, d_b, n, k * n, d_a, k, m * k, 0.0, d_c, n, m * n,
                            batch, a_dtype=np.float32, b_dtype=np.float32, c_dtype=np.float32)
    want = np.einsum("bmk,bkn->bmn", a.astype(np.float64), b)
    assert _rel(d_c.to_host(stream=stream), want) < 1e-5


def test_torch_cross_check(rng):
    torch = pytest.importorskip("torch")
    cuda = _cuda()
    handle = cb.get_handle()
    a = rng.standard_normal((33, 65)).astype(np.float16)
    b = rng.standard_normal((65, 12)).astype(np.float16)
    got = _row_major_gemm(a, b, np.dtype(np.float32), "float32", handle, cuda.current_stream())
    want = (torch.from_numpy(a).cuda().float() @ torch.from_numpy(b).cuda().float()).cpu().numpy()
    assert _rel(got, want.astype(np.float64)) < 1e-3
