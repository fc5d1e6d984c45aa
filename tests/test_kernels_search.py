"""``dnnbind.kernels.search.searchsorted``: the NumPy reference (NumPy's order, NaN last; argument checks)
and its NVRTC source, compiled for sm_90 on the CPU (no GPU needed)."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind.kernels import search


def test_searchsorted_kernel_reference_orders_nan_last():
    seq = np.array([-1.0, 0.0, 0.0, 2.0, np.nan], np.float32)
    vals = np.array([np.nan, -np.inf, 0.0, 1.0, 5.0], np.float32)
    np.testing.assert_array_equal(search.searchsorted(seq, vals, side="left"), [4, 0, 1, 3, 4])
    np.testing.assert_array_equal(search.searchsorted(seq, vals, side="right"), [5, 0, 3, 3, 4])
    assert search.searchsorted(seq, vals, dtype="int64").dtype == np.int64
    low = np.array([0.5, 1.5], dtype=np.float16)
    np.testing.assert_array_equal(search.searchsorted(low, np.array([1.0], np.float16)), [1])
    with pytest.raises(TypeError, match="promote both"):
        search.searchsorted(seq, np.array([1], np.int32))
    with pytest.raises(ValueError, match="1-d"):
        search.searchsorted(np.ones((2, 2)), np.ones(2))
    with pytest.raises(TypeError, match="int32 or int64"):
        search.searchsorted(seq, vals, dtype="float32")


def test_searchsorted_nvrtc_source_compiles_for_sm90_and_exports_every_kernel():
    from dnnbind.cuda.kernel import compile_kernel
    from dnnbind.kernels._cuda import _common as cm

    cubin = compile_kernel(cm.source("search.cu"), arch="sm_90", options=cm.KERNEL_OPTIONS)
    assert cubin[:4] == b"\x7fELF"
    names = [f"searchsorted_{t}_{i}" for t in ("f32", "f64", "f16", "bf16", "i32", "i64", "i8", "u8", "bool")
             for i in ("i32", "i64")]
    missing = [n for n in names if n.encode() + b"\x00" not in cubin]
    assert not missing, missing
