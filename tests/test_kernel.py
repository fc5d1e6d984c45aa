"""NVRTC kernels: compilation (works without a GPU), caches, errors; launches on a GPU."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dnnbind import cuda
from dnnbind.cuda import kernel as kmod
from dnnbind.errors import NvrtcError

SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""

TEMPLATED = r"""
template <typename T>
__global__ void scale(T* x, T a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * a;
}
"""


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DNNBIND_CACHE_DIR", str(tmp_path))
    kmod._memory_cache.clear()
    yield tmp_path
    kmod._memory_cache.clear()


def test_compile_sm90_gives_a_cubin_and_hits_the_disk_cache(cache_dir):
    before = dict(kmod.stats)
    cubin = cuda.compile_kernel(SAXPY, "saxpy", arch="sm_90")
    assert cubin[:4] == b"\x7fELF"
    assert kmod.stats["compiled"] == before["compiled"] + 1
    files = [f for f in os.listdir(cache_dir) if f.endswith(".cubin")]
    assert len(files) == 1 and not any(f.startswith(".tmp") for f in os.listdir(cache_dir))

    again = cuda.compile_kernel(SAXPY, "saxpy", arch="sm_90")  # memory hit
    assert again == cubin and kmod.stats["memory_hits"] == before["memory_hits"] + 1

    kmod._memory_cache.clear()  # a new process: only the disk cache is left
    from_disk = cuda.compile_kernel(SAXPY, "saxpy", arch="sm_90")
    assert from_disk == cubin
    assert kmod.stats["disk_hits"] == before["disk_hits"] + 1
    assert kmod.stats["compiled"] == before["compiled"] + 1


def test_cache_key_covers_options_and_arch(cache_dir):
    cuda.compile_kernel(SAXPY, "saxpy", arch="sm_90")
    cuda.compile_kernel(SAXPY, "saxpy", arch="sm_80")
    cuda.compile_kernel(SAXPY, "saxpy", arch="sm_90", options=("-DFOO=1",))
    assert len([f for f in os.listdir(cache_dir) if f.endswith(".cubin")]) == 3


def test_damaged_cache_entry_is_recompiled(cache_dir):
    cuda.compile_kernel(SAXPY, "saxpy", arch="sm_90")
    (path,) = [cache_dir / f for f in os.listdir(cache_dir) if f.endswith(".cubin")]
    path.write_bytes(b"")
    kmod._memory_cache.clear()
    compiled = kmod.stats["compiled"]
    assert cuda.compile_kernel(SAXPY, "saxpy", arch="sm_90")[:4] == b"\x7fELF"
    assert kmod.stats["compiled"] == compiled + 1


def test_compile_error_carries_the_nvrtc_log(cache_dir):
    bad = 'extern "C" __global__ void broken(float* x) { x[0] = undefined_name; }'
    with pytest.raises(NvrtcError) as info:
        cuda.compile_kernel(bad, "broken", arch="sm_90")
    err = info.value
    assert "undefined_name" in err.log and "undefined" in err.log
    assert "NVRTC_ERROR_COMPILATION" in str(err) and "undefined_name" in str(err)
    assert not os.listdir(cache_dir)


def test_name_expressions_are_lowered_and_cached(cache_dir):
    exprs = ["scale<float>", "scale<double>"]
    _, names = kmod._compile(TEMPLATED, "sm_90", (), tuple(exprs))
    assert set(names) == set(exprs)
    assert all(n.startswith("_Z") for n in names.values()) and len(set(names.values())) == 2
    kmod._memory_cache.clear()
    _, again = kmod._compile(TEMPLATED, "sm_90", (), tuple(exprs))
    assert again == names


def test_ptx_for_compute_arch(cache_dir):
    ptx = cuda.compile_kernel(SAXPY, "saxpy", arch="compute_90")
    assert b".visible .entry saxpy" in ptx


@pytest.mark.skipif(not kmod.fp16_headers_available(), reason="cuda_fp16.h / cuda_bf16.h not found")
def test_bf16_and_fp16_headers_compile(cache_dir):
    src = r"""
    #include <cuda_fp16.h>
    #include <cuda_bf16.h>
    extern "C" __global__ void twice(__nv_bfloat16* x, __half* h, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) { x[i] = __float2bfloat16(2.f * __bfloat162float(x[i])); h[i] = __hadd(h[i], h[i]); }
    }
    """
    assert cuda.compile_kernel(src, "twice", arch="sm_90")[:4] == b"\x7fELF"


@pytest.mark.parametrize("arch", ["90", "sm90", "sm_9", "gfx90a", ""])
def test_bad_arch_is_rejected(arch):
    with pytest.raises(ValueError, match="sm_90"):
        cuda.compile_kernel(SAXPY, "saxpy", arch=arch)


def test_bad_options_are_rejected():
    with pytest.raises(TypeError, match="sequence of strings"):
        cuda.compile_kernel(SAXPY, "saxpy", arch="sm_90", options="-O3")


def test_argument_packing_follows_the_parameter_sizes(cache_dir):
    k = cuda.Kernel(SAXPY, "saxpy", arch="sm_90")  # compile-only: no GPU needed
    assert k.cubin[:4] == b"\x7fELF"
    import ctypes

    v = k._pack(0, 2.5, 4)
    assert ctypes.sizeof(v) == 4 and isinstance(v, ctypes.c_float) and v.value == 2.5
    v = k._pack(3, 5, 8)
    assert isinstance(v, ctypes.c_int64) and v.value == 5
    v = k._pack(3, np.int64(-7), 8)
    assert bytes(v) == np.int64(-7).tobytes()
    assert bytes(k._pack(0, np.float16(1.5), 2)) == np.float16(1.5).tobytes()
    assert k._pack(1, kmod.Pointer(0x1234), 8).value == 0x1234
    with pytest.raises(TypeError, match="np.int32"):
        k._pack(0, 3, None)
    with pytest.raises(TypeError, match="exact type"):
        k._pack(0, np.float64(1.0), 4)
    with pytest.raises(OverflowError):
        k._pack(0, 2**40, 4)
    with pytest.raises(TypeError, match="unsupported type"):
        k._pack(0, "x", 8)


@pytest.mark.parametrize("grid", [0, (1, 2, 3, 4), (-1,), "x"])
def test_launch_dims_are_validated(grid):
    with pytest.raises((ValueError, TypeError)):
        kmod._dims(grid, "grid")


# ---------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_kernel_launch_matches_numpy(rng, cache_dir):
    n = 10_001
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    k = cuda.Kernel(SAXPY, "saxpy")
    assert k.arch == cuda.Device().arch
    assert k.param_sizes() == (4, 8, 8, 8)
    dx, dy = cuda.to_device(x), cuda.to_device(y)
    k(((n + 255) // 256,), (256,), (np.float32(3.0), dx, dy, np.int64(n)))
    # the kernel may fuse the multiply-add (FMA), NumPy rounds twice
    np.testing.assert_allclose(dy.to_host(), 3.0 * x + y, rtol=1e-5, atol=1e-6)
    k(((n + 255) // 256,), 256, (0.5, dx, dy, n))  # Python scalars sized from cuFuncGetParamInfo
    np.testing.assert_allclose(dy.to_host(), 3.5 * x + y, rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="takes 4 arguments"):
        k(1, 1, (dx, dy))

    compiled = kmod.stats["compiled"]
    k2 = cuda.Kernel(SAXPY, "saxpy")  # cache hit on the device
    assert kmod.stats["compiled"] == compiled and k2.cubin == k.cubin


@pytest.mark.gpu
def test_templated_kernel_launch(rng, cache_dir):
    x = rng.standard_normal(300)
    k = cuda.Kernel(TEMPLATED, "scale<double>", name_expressions=["scale<double>", "scale<float>"])
    d = cuda.to_device(x)
    k(2, 256, (d, np.float64(-2.0), np.int32(300)))
    np.testing.assert_array_equal(d.to_host(), -2.0 * x)
