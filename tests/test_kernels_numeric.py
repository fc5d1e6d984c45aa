"""kernels.numeric without a GPU.

* the NumPy reference against plain NumPy (broadcasting, negative and zero strides, empty arrays,
  int/bool/float16/bfloat16), and Philox4x32-10 against Random123's known-answer vectors;
* the CUDA module's host side: its op tables equal the reference's; every kernel it can generate
  compiles with NVRTC for sm_90 (a representative subset here, every one under ``slow``); its
  parameter records have the C structs' sizes; its fast division is exact; axis merging; and every
  public op, driven with fake DeviceArrays, launches kernels whose C signatures match the arguments
  passed (types, count, struct sizes), with strided-kernel geometry that reproduces NumPy's offsets.
"""

from __future__ import annotations

import itertools
import math
import re

import ml_dtypes
import numpy as np
import pytest

from dnnbind.cuda.array import DeviceArray
from dnnbind.cuda.kernel import Pointer, compile_kernel
from dnnbind.kernels import numeric as nm
from dnnbind.kernels._cuda import _common as cm
from dnnbind.kernels._cuda import numeric as dev
from testutil import random

BF16 = np.dtype(ml_dtypes.bfloat16)


# ================================================================================ NumPy reference
def test_unary_reference_matches_numpy(rng):
    x = random(rng, (3, 5), np.float32, 0.1, 0.9)
    for op, fn in [("exp", np.exp), ("log1p", np.log1p), ("arctanh", np.arctanh), ("square", np.square),
                   ("rsqrt", lambda v: 1 / np.sqrt(v)), ("sign", np.sign), ("round", np.round)]:
        got = nm.unary(op, x)
        assert got.dtype == np.float32 and np.allclose(got, fn(x), rtol=1e-6), op
    assert np.array_equal(nm.unary("clip", x, p0=0.3, p1=0.6), np.clip(x, 0.3, 0.6))
    assert np.allclose(nm.unary("scale_shift", x, p0=2.0, p1=-1.0), x * 2 - 1)
    assert np.allclose(nm.unary("erfinv", nm.unary("erf", x)), x, atol=1e-6)
    assert np.allclose(nm.unary("lgamma", np.array([0.0, -1.0, 1.0, 3.0])), [np.inf, np.inf, 0.0, math.log(2.0)])
    h = x.astype(np.float16)
    assert nm.unary("exp", h).dtype == np.float16
    assert np.array_equal(nm.unary("exp", h), np.exp(h.astype(np.float32)).astype(np.float16))
    b = x.astype(BF16)
    assert nm.unary("sqrt", b).dtype == BF16
    i = np.array([-3, 0, 7], np.int8)
    assert np.array_equal(nm.unary("negative", i), -i) and nm.unary("abs", i).dtype == np.int8
    assert np.array_equal(nm.unary("sqrt", np.array([4, 9], np.int32), dtype=np.float32), [2, 3])
    assert np.array_equal(nm.unary("isnan", np.array([np.nan, 1.0])), [True, False])
    assert np.array_equal(nm.unary("bitwise_invert", np.array([True, False])), [False, True])
    assert np.array_equal(nm.unary("logical_not", np.array([0.0, np.nan, 2.0])), [True, False, False])
    assert nm.unary("exp", np.zeros((0, 3), np.float32)).shape == (0, 3)


def test_binary_reference_broadcasts_and_promotes(rng):
    a = random(rng, (4, 1, 3), np.float32)
    b = random(rng, (5, 1), np.float32)
    assert np.allclose(nm.binary("add", a, b), a + b) and nm.binary("add", a, b).shape == (4, 5, 3)
    assert np.allclose(nm.binary("multiply", a, 2.5), a * 2.5)
    assert np.allclose(nm.binary("subtract", 1.0, a), 1 - a)
    assert np.array_equal(nm.binary("less", a, b), a < b)
    # comparisons in the operands' promoted type: float32(0.1) == 0.1 is False in float64
    tenth = np.full(3, 0.1, np.float32)
    assert not nm.binary("equal", tenth, 0.1).any() and nm.binary("equal", tenth, np.float32(0.1)).all()
    i, j = np.array([7, -7, 7, -7], np.int32), np.array([2, 2, -2, 0], np.int32)
    with np.errstate(all="ignore"):
        assert np.array_equal(nm.binary("floor_divide", i, j), np.floor_divide(i, j))
        assert np.array_equal(nm.binary("mod", i, j), np.mod(i, j))
        assert np.array_equal(nm.binary("fmod", i, j), np.fmod(i, j))
        assert np.array_equal(nm.binary("divide", i, j, dtype=np.float32),
                              (i.astype(np.float32) / j.astype(np.float32)))
    assert np.array_equal(nm.binary("left_shift", np.array([1], np.uint8), 3), [8])
    u = np.array([250], np.uint8)
    assert np.array_equal(nm.binary("add", u, u), [244])  # wraps as C
    hf = np.array([1.5, 2.5], np.float16)
    assert nm.binary("maximum", hf, np.array([np.nan, 1.0], np.float16)).dtype == np.float16
    assert np.isnan(nm.binary("maximum", hf, np.array([np.nan, 1.0], np.float16))[0])
    assert nm.binary("add", np.zeros((0,), np.float32), 1.0).shape == (0,)
    with pytest.raises(ValueError, match="cannot be broadcast"):
        nm.binary("add", a, np.ones((2, 4), np.float32))


def test_where_reference(rng):
    c = rng.integers(0, 2, (3, 1)).astype(np.int8)
    a = random(rng, (1, 4), np.float32)
    got = nm.where(c, a, -1.0)
    assert got.shape == (3, 4) and np.array_equal(got, np.where(c.astype(bool), a, np.float32(-1)))
    assert nm.where(np.array([True]), 1, 2).dtype == np.float32


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "mean", "any", "all"])
def test_reduce_reference_every_axis_combination(rng, op):
    x = random(rng, (2, 3, 4, 5), np.float64, 0.5, 1.5)
    if op in ("any", "all"):
        x = (x > 1.0).astype(np.float32)
    fn = getattr(np, op)
    for r in range(0, 5):
        for axes in itertools.combinations(range(4), r):
            for keepdims in (False, True):
                got = nm.reduce(op, x, axes, keepdims)
                ref = fn(x, axis=axes, keepdims=keepdims)
                assert got.shape == np.shape(ref), (op, axes)
                assert np.allclose(got, ref, rtol=1e-12), (op, axes, keepdims)


def test_reduce_reference_dtypes_nan_and_empty():
    x = np.array([[1.0, np.nan, 3.0], [np.nan, 5.0, -np.inf]], np.float32)
    assert np.array_equal(nm.reduce("argmax", x, 1), [1, 0]) and nm.reduce("argmax", x, 1).dtype == np.int32
    assert np.array_equal(nm.reduce("argmin", x, None), 1)
    assert np.isnan(nm.reduce("max", x, (1,))).all()
    assert nm.reduce("sum", np.zeros((0, 3), np.float32), (0,)).tolist() == [0, 0, 0]
    assert nm.reduce("prod", np.zeros((0, 3), np.int32), (0,)).tolist() == [1, 1, 1]
    with np.errstate(invalid="ignore"):
        assert np.isnan(nm.reduce("mean", np.zeros((0,), np.float32), (0,)))
    with pytest.raises(ValueError, match="zero-size"):
        nm.reduce("max", np.zeros((0,), np.float32), (0,))
    b = np.array([True, True, False])
    assert nm.reduce("sum", b, (0,), dtype=np.int32) == 2 and nm.reduce("sum", b, (0,)).dtype == np.bool_
    h = np.full(4096, 1.0, np.float16)
    assert nm.reduce("sum", h, (0,)) == 4096  # float32 accumulation (float16 stops at 2048)


def test_cumulative_reference(rng):
    x = random(rng, (3, 4), np.float32)
    assert np.allclose(nm.cumulative("cumsum", x, 1), np.cumsum(x, 1))
    assert np.allclose(nm.cumulative("cumprod", x, 0, reverse=True), np.flip(np.cumprod(np.flip(x, 0), 0), 0))
    y = np.array([1.0, np.nan, 0.5, 3.0], np.float32)
    assert np.array_equal(nm.cumulative("cummax", y, 0), np.maximum.accumulate(y), equal_nan=True)
    assert np.array_equal(nm.cumulative("cumsum", np.array([True, True]), 0, dtype=np.int32), [1, 2])


def test_strided_copy_and_assign_reference(rng):
    base = random(rng, (24,), np.float32)
    m = base.reshape(4, 6)
    assert np.array_equal(nm.strided_copy(base, (6, 4), (1, 6)), m.T)           # transpose
    assert np.array_equal(nm.strided_copy(base, (4, 6), (6, -1), 5), m[:, ::-1])  # negative stride
    assert np.array_equal(nm.strided_copy(base, (3, 6), (0, 1), 6), np.broadcast_to(m[1], (3, 6)))
    assert np.array_equal(nm.strided_copy(base, (4,), (7,)), np.diagonal(m))
    assert nm.strided_copy(base, (0, 3), (3, 1)).shape == (0, 3)
    with pytest.raises(IndexError, match="outside the base array"):
        nm.strided_copy(base, (5, 6), (6, 1))
    x = base.copy()
    nm.strided_assign(x, (2, 3), (6, 2), 1, np.array([10, 20, 30], np.float64))
    ref = base.copy().reshape(4, 6)
    ref[:2, 1::2] = [10, 20, 30]
    assert np.array_equal(x.reshape(4, 6), ref)
    with pytest.raises(ValueError, match="twice"):
        nm.strided_assign(x, (2, 3), (0, 1), 0, 1.0)


def test_matmul_reference(rng):
    a = random(rng, (2, 1, 3, 4), np.float32)
    b = random(rng, (5, 4, 6), np.float32)
    assert np.allclose(nm.matmul(a, b), np.matmul(a, b)) and nm.matmul(a, b).shape == (2, 5, 3, 6)
    v = random(rng, (4,), np.float32)
    assert np.allclose(nm.matmul(a, v), a @ v) and np.allclose(nm.matmul(v, b), v @ b)
    assert np.allclose(nm.matmul(b, b, transpose_a=True), np.swapaxes(b, -1, -2) @ b)
    i = rng.integers(-5, 5, (3, 4)).astype(np.int8)
    assert np.array_equal(nm.matmul(i, i.T.copy()), (i @ i.T))  # int8 arithmetic wraps as the device
    with pytest.raises(ValueError, match="inner dimensions differ"):
        nm.matmul(a, a)


def test_gathers_and_scatters_reference(rng):
    x = random(rng, (4, 5, 3), np.float32)
    idx = np.array([[3, -1], [0, 2]])
    assert np.array_equal(nm.take(x, idx, 1), np.take(x, idx, 1))
    assert np.array_equal(nm.take(x, np.array([7, -2]), None), np.take(x, [7, -2]))
    with pytest.raises(IndexError):
        nm.take(x, np.array([5]), 1)
    ta = rng.integers(0, 5, (4, 2, 1))
    assert np.array_equal(nm.take_along_axis(x, ta, 1), np.take_along_axis(x, np.broadcast_to(ta, (4, 2, 3)), 1))
    nd = np.array([[0, 1], [3, -1]])
    assert np.array_equal(nm.gather_nd(x, nd), x[(nd[:, 0], nd[:, 1])])
    upd = random(rng, (4, 3, 3), np.float32)
    ia = nm.index_add(x, np.array([1, 1, 4]), upd, axis=1)
    ref = x.copy()
    np.add.at(ref, (slice(None), [1, 1, 4]), upd)
    assert np.allclose(ia, ref)
    sn = nm.scatter_nd(x, nd, 1.0, mode="add")
    ref = x.copy()
    ref[0, 1] += 1
    ref[3, 4] += 1
    assert np.allclose(sn, ref)
    ss = nm.scatter_nd(np.zeros((3,), np.float16), np.array([[2], [0]]), np.array([1.5, 2.5]), mode="set")
    assert ss.dtype == np.float16 and ss.tolist() == [2.5, 0, 1.5]


@pytest.mark.parametrize("mode", nm.PAD_MODES)
def test_pad_reference(rng, mode):
    x = random(rng, (2, 3, 4), np.float32)
    w = ((1, 0), (0, 5), (2, 7))
    got = nm.pad(x, w, mode=mode, constant_value=-3.0)
    ref = np.pad(x, w, mode=mode, constant_values=-3.0) if mode == "constant" else np.pad(x, w, mode=mode)
    assert np.array_equal(got, ref)


def test_constructors_reference():
    assert np.array_equal(nm.full((2, 3), 7, np.int16), np.full((2, 3), 7, np.int16))
    assert np.array_equal(nm.iota(4, 1.5, 0.25, np.float32), [1.5, 1.75, 2.0, 2.25])
    assert np.array_equal(nm.iota(4, 3, -2, np.int8), [3, 1, -1, -3])


def test_sorting_reference():
    x = np.array([[3.0, np.nan, 1.0, 3.0, -np.inf, 0.0, -0.0, np.inf]], np.float32)
    assert np.array_equal(nm.sort(x), np.sort(x, kind="stable"), equal_nan=True)
    assert np.array_equal(nm.sort(x, descending=True), np.sort(x)[:, ::-1], equal_nan=True)
    assert nm.argsort(x).tolist() == [[4, 5, 6, 2, 0, 3, 7, 1]]
    # descending: NaN ties with +inf, then by index; ties keep increasing index order
    assert nm.argsort(x, descending=True).tolist() == [[1, 7, 0, 3, 2, 5, 6, 4]]
    vals, idx = nm.top_k(x, 3)
    assert idx.tolist() == [[1, 7, 0]] and idx.dtype == np.int32 and np.isnan(vals[0, 0])


# Random123's kat_vectors for philox4x32 10: (counter words, key words) -> the four output words.
_PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def _philox_block(c, k):
    """Philox4x32-10 on one block, written out from the paper (every counter word free)."""
    c, (k0, k1) = list(c), k
    for _ in range(10):
        p0, p1 = c[0] * 0xD2511F53, c[2] * 0xCD9E8D57
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ c[3] ^ k1, p0 & 0xFFFFFFFF]
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return tuple(c)


def test_philox_known_answers_and_the_reference_stream():
    for counter, key, words in _PHILOX_KAT:
        assert _philox_block(counter, key) == words
    # the reference's stream: block j counts (counter + j) in the first two words, the key is 64 bits
    assert nm.philox_uint32(0, 0, 4).tolist() == list(_PHILOX_KAT[0][2])
    key, counter = 0xA4093822_299F31D0, (1 << 32) - 2
    got = nm.philox_uint32(key, counter, 11)
    want = [w for j in range(3) for w in _philox_block(((counter + j) & 0xFFFFFFFF, (counter + j) >> 32, 0, 0),
                                                       (key & 0xFFFFFFFF, key >> 32))][:11]
    assert got.tolist() == want and got.dtype == np.uint32


def test_random_reference_kinds():
    bits = nm.random("bits", (3, 5), 7, 11)
    assert bits.dtype == np.uint32 and bits.reshape(-1).tolist() == nm.philox_uint32(7, 11, 15).tolist()
    u = nm.random("uniform", (1000,), 7, 11, np.float32, p0=-2.0, p1=3.0)
    assert np.array_equal(u, (bits_u := (nm.philox_uint32(7, 11, 1000) >> 8).astype(np.float32) * np.float32(2**-24))
                          * np.float32(5.0) + np.float32(-2.0)) and bits_u.max() < 1
    n = nm.random("normal", (20000,), 1, 0, np.float64, p0=1.0, p1=2.0)
    assert n.dtype == np.float64 and abs(n.mean() - 1.0) < 0.1 and abs(n.std() - 2.0) < 0.1
    t = nm.random("truncated_normal", (20000,), 1, 0, BF16)
    assert t.dtype == BF16 and float(np.abs(t.astype(np.float32)).max()) <= 2.0
    c = np.zeros((), np.uint64)
    assert np.array_equal(nm.random("bits", (4,), 3, c), nm.random("bits", (4,), 3, 0))
    nm.advance_counter(c, 5)
    assert int(c) == 5


# ================================================================================ the device module
def test_device_tables_list_the_reference_names():
    assert set(dev.UNARY) == set(nm.UNARY)
    assert set(dev.BINARY) == set(nm.BINARY)
    assert set(dev.REDUCTIONS) == set(nm.REDUCTIONS)
    assert set(dev.CUMULATIVE) == set(nm.CUMULATIVE)
    assert set(dev.RANDOM_KINDS) == set(nm.RANDOM_KINDS)
    assert set(dev.PAD_MODES) == set(nm.PAD_MODES)
    # every name has a device function in numeric.cuh
    header = (cm._SOURCE_DIR / "numeric.cuh").read_text()
    for name in list(dev.UNARY) + list(dev.BINARY):
        fn = (dev.UNARY.get(name) or dev.BINARY[name]).split("::")[1]
        assert re.search(rf"\b{fn[: fn.index('_')]}_##NAME\b|\b{fn}\(", header) or f"({name}," in header, name


def _compile_bodies(bodies, batch=120):
    for start in range(0, len(bodies), batch):
        chunk = bodies[start:start + batch]
        cubin = compile_kernel(dev.header() + "\n".join(b.text for b in chunk), arch="sm_90", options=dev._OPTIONS)
        missing = [b.name for b in chunk if b.name.encode() + b"\0" not in cubin]
        assert not missing, f"not exported: {missing[:5]}"


def test_representative_kernels_compile_for_sm90():
    bodies = dev.kernel_bodies(exhaustive=False)
    assert len(bodies) < 200
    _compile_bodies(bodies)


@pytest.mark.slow
def test_every_generated_kernel_compiles_for_sm90():
    _compile_bodies(dev.kernel_bodies(exhaustive=True))


def test_parameter_records_have_the_c_structs_sizes():
    checks = []
    for nops, maxd, wide in itertools.product((2, 3, 4), (4, 8, 16), (False, True)):
        name = f"nx::Geo{'64' if wide else '32'}<{nops}, {maxd}>"
        checks.append((name, dev.geo_dtype(nops, maxd, wide).itemsize))
    for maxd, wide in itertools.product((4, 8, 16), (False, True)):
        checks.append((f"nx::PadGeo{'64' if wide else '32'}<{maxd}>", dev._pad_geo_dtype(maxd, wide).itemsize))
    checks.append(("nx::NdGeo", dev._nd_geo_dtype().itemsize))
    checks.append(("nx::FastDiv", 12))
    text = "\n".join(f'static_assert(sizeof({n}) == {size}, "{n}");' for n, size in checks)
    compile_kernel(dev.header() + text + '\nextern "C" __global__ void k() {}', arch="sm_90", options=dev._OPTIONS)


def test_fast_divider_is_exact_below_2_31(rng):
    divisors = [1, 2, 3, 5, 7, 10, 31, 32, 33, 255, 641, 1000, 4096, 65535, 65537, 1 << 20, 1_000_003,
                (1 << 30) + 1, (1 << 31) - 1] + rng.integers(1, 1 << 31, 40).tolist()
    n = np.concatenate([rng.integers(0, 1 << 31, 20000, dtype=np.uint64),
                        np.array([0, 1, (1 << 31) - 1, (1 << 31) - 2], np.uint64)])
    for d in divisors:
        dd, mul, shr = dev.fast_divider(d)
        assert dd == d and 0 <= mul < 2**32 and 0 <= shr < 32
        q = n if mul == 0 else ((n * np.uint64(mul)) >> np.uint64(32)) >> np.uint64(shr)
        mult = n - n % np.uint64(d)
        assert np.array_equal(q, n // np.uint64(d)) and np.array_equal(q * np.uint64(d), mult), d


def test_merge_axes():
    assert dev.merge_axes((2, 3, 4), [(12, 4, 1), (12, 4, 1)]) == ([24], [[1], [1]])
    assert dev.merge_axes((2, 3, 4), [(12, 4, 1), (0, 4, 1)]) == ([2, 12], [[12, 1], [0, 1]])
    assert dev.merge_axes((2, 1, 4), [(4, 99, 1), (4, 4, 1)]) == ([8], [[1], [1]])
    assert dev.merge_axes((1, 1), [(5, 7)]) == ([1], [[0]])
    assert dev.merge_axes((3, 4), [(1, 3)]) == ([3, 4], [[1, 3]])  # a transpose stays 2-d
    assert dev.merge_axes((3, 4), [(-4, -1)]) == ([12], [[-1]])    # a full flip merges


# --------------------------------------------------------------------- fake device: host paths
def _c_elem(shape):
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


class _FakeStream:
    _device = 0
    device_index = 0
    _handle = 0

    def is_capturing(self):
        return False


def _split_params(text):
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _signature(body):
    m = re.search(r'extern "C" __global__ void (\w+)\((.*?)\)\s*\{', body.text, re.S)
    assert m and m.group(1) == body.name
    params = []
    for p in _split_params(m.group(2)):
        p = p.replace("__restrict__", "").replace("const ", "").strip()
        ctype, _name = p.rsplit(None, 1) if "*" not in p.split()[-1] else (p.rsplit("*", 1)[0] + "*", "")
        params.append(re.sub(r"\s+", " ", ctype.strip()))
    return params


_SCALARS = {"i64": np.int64, "nx::u32": np.uint32, "int": np.int32, "double": np.float64, "float": np.float32,
            "u64": np.uint64}
_POINTEE = {v: k for k, v in dev._CTYPE.items()}


def _check_arg(body, ctype, arg):
    where = f"{body.name}: parameter {ctype!r} got {type(arg).__name__}"
    if ctype.endswith("*"):
        assert arg is None or isinstance(arg, (DeviceArray, Pointer)), where
        base = ctype[:-1].strip()
        if isinstance(arg, DeviceArray) and base in _POINTEE:
            assert arg.dtype == _POINTEE[base], f"{where} of dtype {arg.dtype}"
        return
    if ctype in _SCALARS:
        assert type(arg) is _SCALARS[ctype], where
        return
    m = re.fullmatch(r"nx::Unit<(\d+)>::t", ctype)
    if m:
        assert isinstance(arg, np.unsignedinteger) and arg.itemsize == int(m.group(1)), where
        return
    assert isinstance(arg, np.void), where
    m = re.fullmatch(r"nx::Geo(32|64)<(\d+), (\d+)>", ctype)
    if m:
        want = dev.geo_dtype(int(m.group(2)), int(m.group(3)), m.group(1) == "64")
    elif ctype == "nx::NdGeo":
        want = dev._nd_geo_dtype()
    else:
        m = re.fullmatch(r"nx::PadGeo(32|64)<(\d+)>", ctype)
        assert m, where
        want = dev._pad_geo_dtype(int(m.group(2)), m.group(1) == "64")
    assert arg.dtype == want, f"{where}: record {arg.dtype} != {want}"


class _Named:
    def __init__(self, name):
        self.name = name


class FakeDevice:
    """Replaces allocation, copies, kernels and cuBLAS with recorders: the device module's host code runs
    as on a GPU, each launch checked against its kernel's C signature and the launch limits."""

    def __init__(self, monkeypatch):
        self.launches, self.copies, self.gemms = [], [], []
        self._next = 1 << 24
        self.stream = _FakeStream()
        monkeypatch.setattr(cm, "stream_of", lambda stream=None: self.stream)
        monkeypatch.setattr(dev, "current_stream", lambda device=None: self.stream)
        monkeypatch.setattr(cm, "empty", lambda shape, dtype, s: self.array(shape, dtype))
        monkeypatch.setattr(cm, "output", lambda out, shape, dtype, s: out if out is not None else
                            self.array(shape, dtype))
        monkeypatch.setattr(cm, "memcpy", lambda dst, src, s, nbytes=None: self.copies.append(("memcpy", dst, src)))
        monkeypatch.setattr(cm, "memset", lambda a, byte, s: self.copies.append(("memset", a, byte)))
        monkeypatch.setattr(cm, "_sm_count", lambda device: 132)
        monkeypatch.setattr(cm, "cublas_handle", lambda s: 0)
        monkeypatch.setattr(dev, "_kernel", self.kernel)
        monkeypatch.setattr(dev, "gemm_strided_batched", self.gemm)
        monkeypatch.setattr(cm, "kernel", self.file_kernel)  # layout.cu's column sums (colsum.py)

    def file_kernel(self, file, name, device):
        """A kernel of one of the .cu files (not a numeric.cuh body): launches recorded by name."""
        fake = self

        class _K:
            def __call__(self, grid, block, args, shared_mem=0, stream=None):
                assert 1 <= grid[0] < 2**31 and all(1 <= g <= 65535 for g in grid[1:]), (name, grid)
                fake.launches.append((_Named(name), grid, block, args, shared_mem))

        return _K()

    def array(self, shape, dtype, offset_items=0, strides=None):
        shape = tuple(int(v) for v in shape)
        dt = np.dtype(dtype)
        el = _c_elem(shape) if strides is None else tuple(strides)
        reach = offset_items + 1 + sum((n - 1) * abs(s) for n, s in zip(shape, el) if n)
        start = self._next
        self._next = -(-(start + reach * dt.itemsize + 4096) // 256) * 256
        self.allocated(start, reach * dt.itemsize)
        return DeviceArray(object(), shape, dt, start + offset_items * dt.itemsize,
                           strides=tuple(s * dt.itemsize for s in el), device_index=0, stream=None)

    def allocated(self, start, nbytes):
        pass

    def kernel(self, body, device):
        fake = self

        class _K:
            def __call__(self, grid, block, args, shared_mem=0, stream=None):
                sig = _signature(body)
                assert len(sig) == len(args), f"{body.name}: {len(sig)} parameters, {len(args)} arguments"
                for ctype, arg in zip(sig, args):
                    _check_arg(body, ctype, arg)
                assert 1 <= grid[0] < 2**31 and all(1 <= g <= 65535 for g in grid[1:]), (body.name, grid)
                assert math.prod(block) <= 1024 and shared_mem <= 48 * 1024, (body.name, block, shared_mem)
                fake.launches.append((body, grid, block, args, shared_mem))

        return _K()

    def gemm(self, handle, transa, transb, m, n, k, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c,
             batch, *, a_dtype, b_dtype, c_dtype, compute):
        from dnnbind.cublas import _gemm

        _gemm._check_dims("gemm", _gemm._op(transa, "", ""), _gemm._op(transb, "", ""), m, n, k, lda, ldb, ldc)
        _gemm._types("gemm", a_dtype, b_dtype, c_dtype, compute)
        self.gemms.append(dict(transa=transa, transb=transb, m=m, n=n, k=k, lda=lda, ldb=ldb, ldc=ldc, sa=stride_a,
                               sb=stride_b, sc=stride_c, batch=batch, dtype=a_dtype, compute=compute))


@pytest.fixture
def fake(monkeypatch):
    return FakeDevice(monkeypatch)


_ALL = list(dev.DTYPES)


def test_fake_elementwise_every_op_and_dtype(fake):
    for op in nm.UNARY:
        for dt in _ALL:
            x = fake.array((3, 5), dt)
            dtype = np.dtype(np.bool_) if op in dev._BOOL_RESULT else dt
            try:
                nm.unary(op, x, p0=0.5, p1=2.0)
            except TypeError as exc:
                assert op in dev._INTEGER_ONLY and dt.kind == "f" or dt == BF16, (op, dt, exc)
            else:
                assert fake.launches[-1][3][1].dtype == dtype
        nm.unary(op, fake.array((4,), np.int32), dtype=np.float16) if op not in dev._INTEGER_ONLY else None
    for op in nm.BINARY:
        for dt in _ALL:
            a, b = fake.array((2, 3), dt), fake.array((3,), dt)
            try:
                nm.binary(op, a, b)
                nm.binary(op, a, 3)
                nm.binary(op, 2, a)
            except TypeError as exc:
                assert op in dev._INTEGER_ONLY and (dt.kind == "f" or dt == BF16), (op, dt, exc)
    nm.where(fake.array((2, 1), np.float32), fake.array((1, 3), np.int8), 2.5, dtype=np.float16)
    nm.where(fake.array((4,), np.bool_), 1, fake.array((4,), BF16))
    for src, dst in itertools.product(_ALL, _ALL):
        dev.convert(fake.array((7,), src), dst)


def _emulate_offsets(geo, n, wide):
    """numeric.cuh's offsets() over positions 0..n-1, from the parameter record."""
    ndim = int(geo["ndim"])
    stride = geo["stride"].astype(np.int64)
    i = np.arange(n, dtype=np.int64)
    off = np.zeros((stride.shape[0], n), np.int64)
    for d in range(stride.shape[1] - 1, 0, -1):
        if d < ndim:
            if wide:
                dim = int(geo["dim"][d])
                q = i // dim
            else:
                dim, mul, shr = (int(v) for v in geo["dim"][d])
                q = i if mul == 0 else (((i.astype(np.uint64) * np.uint64(mul)) >> np.uint64(32))
                                        >> np.uint64(shr)).astype(np.int64)
            off += (i - q * dim)[None, :] * stride[:, d:d + 1]
            i = q
    return off + i[None, :] * stride[:, :1]


def _numpy_offsets(shape, elem_strides):
    idx = np.indices(shape).reshape(len(shape), -1) if shape else np.zeros((0, 1), np.int64)
    return (idx * np.asarray(elem_strides, np.int64)[:, None]).sum(axis=0)


@pytest.mark.parametrize("a_shape, a_strides, b_shape, b_strides, offset", [
    ((4, 6), None, (6,), None, 0),              # bias-like broadcast
    ((4, 6), (1, 4), (4, 1), None, 0),          # transposed operand, column broadcast
    ((3, 4, 5), (20, -5, 1), (1, 4, 1), None, 3),  # negative stride, odd offset
    ((2, 3, 4, 5, 6), None, (3, 1, 5, 1), None, 1),  # rank 5: the 8-axis bucket after merging
    ((5,), (0,), (5,), None, 0),                # a zero-stride operand
])
def test_strided_geometry_reproduces_numpy_offsets(fake, a_shape, a_strides, b_shape, b_strides, offset):
    a = fake.array(a_shape, np.float32, offset, a_strides)
    b = fake.array(b_shape, np.float16, 0, b_strides)
    res = nm.binary("add", a, b, dtype=np.float32)
    body, grid, block, args, _ = fake.launches[-1]
    assert re.search(r"_s_(4|8|16)$", body.name), body.name
    geo, n = args[-1], int(args[3])
    shape = tuple(res.shape)
    assert n == math.prod(shape)
    got = _emulate_offsets(geo, n, wide=False)
    for k, arr in enumerate((a, b, res)):
        want = _numpy_offsets(shape, dev._broadcast_strides(arr, shape))
        assert np.array_equal(got[k], want), (k, arr.shape, arr.strides)


def test_fake_contiguous_path_vectorises_only_aligned(fake):
    a, b = fake.array((1000,), np.float32), fake.array((1000,), np.float32)
    nm.binary("add", a, b)
    body, _, _, args, _ = fake.launches[-1]
    assert body.name.endswith("_c_4") and int(args[-1]) == 1
    odd = fake.array((1000,), np.float32, offset_items=1)
    nm.binary("add", odd, b)
    assert int(fake.launches[-1][3][-1]) == 0


@pytest.mark.parametrize("op", list(nm.REDUCTIONS))
@pytest.mark.parametrize("shape, axis", [((3, 4, 5, 6), (1, 3)), ((7, 5000), (1,)), ((3, 100000), (1,)),
                                         ((100000, 3), (0,)), ((2, 3), (0, 1)), ((4, 10), (1,)), ((0, 4), (0,))])
def test_fake_reductions(fake, op, shape, axis):
    x = fake.array(shape, np.float16 if op not in ("any", "all") else np.int8, 0,
                   None if shape != (3, 4, 5, 6) else (1, 3, 12, 60))  # the first case non-contiguous
    if op in ("argmax", "argmin"):
        if len(axis) > 1:
            axis = None
        else:
            axis = axis[0]
        if 0 in shape:
            return
    elif op in ("max", "min") and 0 in shape:
        return
    res = nm.reduce(op, x, axis)
    assert fake.launches and res.dtype == (np.int32 if op.startswith("arg") else
                                           np.bool_ if op in ("any", "all") else np.float16)


@pytest.mark.parametrize("op", nm.CUMULATIVE)
@pytest.mark.parametrize("shape, axis", [((3, 7), 1), ((2, 70000), 1), ((5000, 3), 0), ((40, 50, 60), 1), ((2, 0), 1)])
def test_fake_cumulative(fake, op, shape, axis):
    for dt in (np.float32, BF16, np.bool_, np.int8):
        nm.cumulative(op, fake.array(shape, dt), axis, reverse=True)


def test_fake_strided_copy_transpose_and_assign(fake):
    base = fake.array((64 * 48,), np.float32)
    nm.strided_copy(base, (48, 64), (1, 48))
    assert fake.launches[-1][0].name.startswith("nx_tr_u4")
    nm.strided_copy(base, (3, 48, 16), (16, 48, 1))
    nm.strided_copy(base, (64 * 48,), (1,))
    assert fake.copies[-1][0] == "memcpy"
    nm.strided_copy(base, (10, 5), (0, -2), 100)
    nm.strided_assign(base, (4, 8), (96, 2), 5, 2.5)
    nm.strided_assign(base, (4, 8), (96, 2), 5, fake.array((8,), np.int32))
    view = DeviceArray(object(), (4, 8), np.float32, base.ptr + 4 * 7, device_index=0, stream=None)
    nm.strided_assign(base, (4, 8), (96, 2), 5, view)  # overlaps: copied first
    assert fake.launches[-2][0].name.startswith("nx_ew_copy")


def test_fake_matmul_paths(fake):
    for dt in (np.float32, np.float16, BF16, np.float64):
        nm.matmul(fake.array((2, 1, 3, 4), dt), fake.array((5, 4, 6), dt))
        g = fake.gemms[-1]
        assert (g["m"], g["n"], g["k"], g["batch"]) == (6, 3, 4, 10)
    assert (g["sa"], g["sb"], g["sc"]) == (24, 12, 18)  # both materialised to the whole batch (b is cuBLAS A)
    nm.matmul(fake.array((7, 3, 4), np.float32), fake.array((4,), np.float32))
    g = fake.gemms[-1]
    assert (g["m"], g["n"], g["k"], g["batch"], g["sa"], g["lda"]) == (1, 3, 4, 7, 0, 1)
    nm.matmul(fake.array((4, 3), np.float32), fake.array((5, 4), np.float32), transpose_a=True, transpose_b=True)
    g = fake.gemms[-1]
    assert (g["m"], g["n"], g["lda"], g["ldb"]) == (5, 3, 4, 3)
    nm.matmul(fake.array((3, 4), np.int32), fake.array((4, 3), np.float32), dtype=np.float16)
    assert fake.gemms[-1]["dtype"] == np.float32  # mixed inputs: float32 GEMM, then a conversion
    for dt in (np.int8, np.int32, np.int64, np.bool_, np.uint16):
        nm.matmul(fake.array((2, 3, 3, 4), dt), fake.array((2, 3, 4, 5), dt, 0, (0, 0, 5, 1)))
        assert fake.launches[-1][0].name.startswith("nx_imm_")


def test_fake_gathers_scatters_pad_sort_random(fake):
    x = fake.array((6, 7, 5), np.float32)
    for it in dev._INDEX_DTYPES:
        nm.take(x, fake.array((3, 2), it), 1)
        nm.take_along_axis(x, fake.array((6, 4, 1), it), 1)
        nm.gather_nd(x, fake.array((4, 2), it))
    nm.take(fake.array((6, 7), np.bool_), fake.array((5,), np.int32), None)
    for dt in _ALL:
        y = fake.array((6, 7), dt)
        nm.index_add(y, fake.array((3,), np.int64), fake.array((6, 3), dt), 1)
        nm.scatter_nd(y, fake.array((4, 1), np.int32), fake.array((4, 7), np.float32), mode="add")
        nm.scatter_nd(y, fake.array((4, 2), np.int32), 1.5, mode="set")
        nm.scatter_nd(y, fake.array((2, 4, 1), np.int64), fake.array((7,), dt), mode="add")
        for mode in nm.PAD_MODES:
            nm.pad(y, ((1, 2), (3, 0)), mode=mode)
        for descending in (False, True):
            nm.sort(y, 0, descending=descending)
            nm.argsort(y, 1, descending=descending, dtype=np.int64)
        nm.top_k(y, 3)
    long = fake.array((3, 10000), np.float32)
    nm.sort(long)
    assert sum(1 for launch in fake.launches[-5:] if launch[0].name.startswith("nx_sortm")) == 2
    for kind in nm.RANDOM_KINDS:
        for dt in (np.float32, np.float16, BF16, np.float64):
            dev.random(kind, (5, 9), 3, 7, dt, p0=0.0, p1=1.0)
            dev.random(kind, (5, 9), 3, fake.array((), np.uint64), dt)
    counter = fake.array((), np.uint64)
    nm.advance_counter(counter, -1)
    assert int(fake.launches[-1][3][1]) == 2**64 - 1
    dev.full((4, 5), 2.5, np.float32)
    dev.full((4, 5), 0, np.int64)
    assert fake.copies[-1][0] == "memset"
    dev.iota(10, 0.5, 2, np.float16)
    dev.iota(10, 3, 2, np.uint16)


def test_fake_empty_arrays_launch_nothing(fake):
    e = fake.array((0, 4), np.float32)
    nm.unary("exp", e)
    nm.binary("add", e, 1.0)
    nm.reduce("sum", e, (1,))
    nm.cumulative("cumsum", e, 1)
    nm.sort(e, 1)
    nm.take(e, fake.array((0,), np.int32), 1)
    dev.random("normal", (0, 3), 1, 1, np.float32)
    assert fake.launches == []


# ------------------------------------------------------- fake device with memory: data-moving kernels
# The kernels whose host-side arguments carry the most arithmetic (copies and conversions, the tiled
# transpose, reductions with split extents, gathers, padding, sorting with merge passes, the integer
# matmul, and cuBLAS's column-major call) are emulated here from their arguments, with the kernels'
# documented semantics, on host memory behind the fake arrays: what the host passes must then give
# NumPy's results.
_BY_SUFFIX = {v: k for k, v in cm._SUFFIX.items()}


class _Memory:
    def __init__(self):
        self.blocks = {}

    def alloc(self, start, nbytes):
        self.blocks[start] = np.zeros(nbytes + 64, np.uint8)

    def typed(self, ptr, dtype):
        """(flat typed view of the block holding ptr, element index of ptr in it)."""
        dt = np.dtype(dtype)
        for start, block in self.blocks.items():
            if start <= ptr < start + block.size:
                assert (ptr - start) % dt.itemsize == 0, "misaligned element address"
                return block[: block.size // dt.itemsize * dt.itemsize].view(dt), (ptr - start) // dt.itemsize
        raise AssertionError(f"address 0x{ptr:x} is in no allocation")


def _ptr(arg):
    return int(arg.ptr) if isinstance(arg, DeviceArray) else int(arg.value)


def _named_signature(body):
    m = re.search(r'extern "C" __global__ void (\w+)\((.*?)\)\s*\{', body.text, re.S)
    out = []
    for p in _split_params(m.group(2)):
        p = p.replace("__restrict__", "").replace("const ", "").strip()
        ctype, name = p.rsplit(None, 1)
        if name.startswith("*"):
            ctype, name = ctype + "*", name[1:]
        out.append((re.sub(r"\s+", "", ctype), name))
    return out


def _pointee(ctype):
    base = ctype.rstrip("*")
    m = re.fullmatch(r"nx::Unit<(\d+)>::t", base)
    if m:
        return np.dtype(f"u{m.group(1)}")
    return {re.sub(r"\s+", "", k): v for k, v in _POINTEE.items()}.get(base)


class EmulatingDevice(FakeDevice):
    def __init__(self, monkeypatch):
        super().__init__(monkeypatch)
        self.mem = _Memory()
        self.partials = {}
        monkeypatch.setattr(cm, "memcpy", self._memcpy)
        monkeypatch.setattr(cm, "memset", self._memset)
        # layout.cu's column sums (sums over leading axes) are not numeric.cuh kernels: emulated whole
        monkeypatch.setattr(dev, "channel_sums", self._channel_sums)

    def _channel_sums(self, x, layout, s, out=None):
        assert layout == "NHWC" and x.ndim == 2 and x.is_contiguous
        host = self.download(x)
        acc = np.float64 if host.dtype == np.float64 else np.float32
        res = out if out is not None else self.array((x.shape[1],), x.dtype)
        assert res.shape == (x.shape[1],) and res.dtype == x.dtype
        self.store(res.ptr, x.dtype, np.arange(x.shape[1]), host.astype(acc).sum(axis=0).astype(x.dtype))
        return res

    def allocated(self, start, nbytes):
        self.mem.alloc(start, nbytes)

    def upload(self, host, offset_items=0):
        host = np.ascontiguousarray(host)
        a = self.array(host.shape, host.dtype, offset_items)
        flat, i0 = self.mem.typed(a.ptr, host.dtype)
        flat[i0:i0 + host.size] = host.reshape(-1)
        return a

    def download(self, a):
        flat, i0 = self.mem.typed(a.ptr, a.dtype)
        el = [s // a.itemsize for s in a.strides]
        return flat[i0 + _numpy_offsets(tuple(a.shape), el)].reshape(a.shape) if a.size else np.empty(a.shape, a.dtype)

    def _memcpy(self, dst, src, s, nbytes=None):
        n = src.nbytes if nbytes is None else nbytes
        d, i = self.mem.typed(dst.ptr, np.uint8)
        sv, j = self.mem.typed(src.ptr, np.uint8)
        d[i:i + n] = sv[j:j + n]

    def _memset(self, a, byte, s):
        d, i = self.mem.typed(a.ptr, np.uint8)
        d[i:i + a.nbytes] = byte

    def kernel(self, body, device):
        checker = super().kernel(body, device)
        fake = self

        class _K:
            def __call__(self, grid, block, args, shared_mem=0, stream=None):
                checker(grid, block, args, shared_mem, stream)
                fake.run(body, args)

        return _K()

    # ---- emulation
    def load(self, ptr, dtype, offsets):
        flat, i0 = self.mem.typed(ptr, dtype)
        return flat[i0 + np.asarray(offsets, np.int64)]

    def store(self, ptr, dtype, offsets, values):
        flat, i0 = self.mem.typed(ptr, dtype)
        flat[i0 + np.asarray(offsets, np.int64)] = values

    def run(self, body, args):
        sig = _named_signature(body)
        a = {name: arg for (_, name), arg in zip(sig, args)}
        t = {name: ctype for ctype, name in sig}
        name = body.name
        if name.startswith("nx_ew_"):
            m = re.match(r"nx_ew_(copy|cvt|cvt2)_", name)
            if m:
                self._ew(name, a, t)
        elif name.startswith("nx_tr_"):
            self._transpose(a, t)
        elif name.startswith("nx_red_"):
            self._reduce(name, a, t)
        elif name.startswith(("nx_take_", "nx_tal_", "nx_gnd_")):
            self._gather(name, a, t)
        elif name.startswith("nx_pad_"):
            self._pad(name, a, t)
        elif name.startswith(("nx_sortb_", "nx_sortc_", "nx_sortm_", "nx_sorto_")):
            self._sort(name, a, t)
        elif name.startswith("nx_imm_"):
            self._imm(a, t)

    def _ew(self, name, a, t):
        out_dt = _pointee(t["out"])
        n = int(a["n"])
        mid = re.search(r"_(?:\w+?)m(\w+?)x", name)
        if "x0" in a:
            src_dt = _pointee(t["x0"])
        if name.split("_")[-2] == "c":
            idx_in = idx_out = np.arange(n)
        else:
            off = _emulate_offsets(a["g"], n, wide=name.split("_")[-2] == "w")
            idx_in, idx_out = off[0], off[-1]
        if "x0" in a:
            vals = self.load(_ptr(a["x0"]), src_dt, idx_in)
        else:
            ld = np.dtype(f"u{a['s0'].itemsize}")
            vals = np.full(n, np.asarray(a["s0"]).view(ld))
            src_dt = out_dt
        if name.startswith("nx_ew_cvt2_"):
            acc = _BY_SUFFIX[re.search(r"m([a-z0-9]+)x", name).group(1)]
            vals = vals.astype(acc)
        with np.errstate(all="ignore"):
            self.store(_ptr(a["out"]), out_dt, idx_out, vals.astype(out_dt) if src_dt != out_dt else vals)

    def _transpose(self, a, t):
        ut = _pointee(t["x"])
        P, Q, sp, sq, osp = (int(a[k]) for k in ("P", "Q", "sp", "sq", "osp"))
        off = _emulate_offsets(a["g"], int(a["nbatch"]), wide=True)
        p, q = np.meshgrid(np.arange(P), np.arange(Q), indexing="ij")
        for b in range(int(a["nbatch"])):
            vals = self.load(_ptr(a["x"]), ut, off[0, b] + p * sp + q * sq)
            self.store(_ptr(a["out"]), ut, off[1, b] + p * osp + q, vals)

    def _reduce(self, name, a, t):
        m = re.match(r"nx_red_(\w+?)_([a-z0-9]+)_([a-z0-9]+)_([a-z0-9]+)_(rb|rw|c32|c64)(\d+)(p?)$", name)
        op, xs, accs, tos, variant, _, partial = m.groups()
        xdt, to = _BY_SUFFIX[xs], _BY_SUFFIX[tos]
        count = int(a["count"])
        if variant in ("rw", "rb"):
            outer, length, inner = int(a["rows"]), int(a["len"]), 1
        else:
            outer, length, inner = int(a["outer"]), int(a["len"]), int(a["inner"])
        chunk = int(a.get("chunk", length if length else 1))
        nsplit = int(a.get("nsplit", 1))
        if partial:  # (value, index) pairs of the first pass, kept by the emulator
            src = self.partials[_ptr(a["x"])]
        else:
            x = self.load(_ptr(a["x"]), xdt, np.arange(outer * length * inner))
            if op in ("any", "all"):
                x = x.astype(bool).astype(np.float64)
            else:
                x = x.astype(np.float64) if (xdt.kind == "f" or xdt == BF16) else x.astype(np.int64)
            r = np.broadcast_to(np.arange(length)[None, :, None], (outer, length, inner))
            src = (x.reshape(outer, length, inner), r)
        vals, pos = src
        accs_v = np.zeros((outer, nsplit, inner), np.float64 if vals.dtype.kind == "f" else np.int64)
        accs_i = np.zeros((outer, nsplit, inner), np.int64)
        for s in range(nsplit):
            v = vals[:, s * chunk:(s + 1) * chunk, :] if not partial else vals
            i = pos[:, s * chunk:(s + 1) * chunk, :] if not partial else pos
            if op in ("argmax", "argmin"):
                key = np.where(np.isnan(v), -np.inf if op == "argmax" else np.inf, v) if v.dtype.kind == "f" else v
                # first NaN, else first extremum (by position)
                nan = np.isnan(v) if v.dtype.kind == "f" else np.zeros(v.shape, bool)
                best = np.where(nan.any(axis=1), np.argmax(nan, axis=1),
                                (np.argmax if op == "argmax" else np.argmin)(np.where(nan, 0, key), axis=1))
                accs_v[:, s] = np.take_along_axis(v, best[:, None], 1)[:, 0]
                accs_i[:, s] = np.take_along_axis(i, best[:, None], 1)[:, 0]
            else:
                fn = {"sum": np.sum, "mean": np.sum, "prod": np.prod, "max": np.max, "min": np.min, "any": np.max,
                      "all": np.min}[op]
                accs_v[:, s] = fn(v, axis=1) if v.shape[1] else {"prod": 1, "all": 1}.get(op, 0)
        if nsplit > 1:
            self.partials[_ptr(a["partial"])] = (accs_v, accs_i)
            return
        res = accs_i[:, 0] if op in ("argmax", "argmin") else accs_v[:, 0] / (count if op == "mean" else 1)
        with np.errstate(all="ignore"):
            self.store(_ptr(a["out"]), to, np.arange(outer * inner), res.reshape(-1).astype(to))

    @staticmethod
    def _clamp(v, n):
        v = v.astype(np.int64) if v.dtype != np.uint64 else np.minimum(v, np.uint64(n - 1)).astype(np.int64)
        v = np.where(v < 0, v + n, v)
        return np.clip(v, 0, n - 1)

    def _gather(self, name, a, t):
        ut, it = _pointee(t["x"]), _pointee(t["idx"])
        total = int(a["total"])
        i = np.arange(total)
        if name.startswith("nx_take_"):
            inner, nidx, n = int(a["inner"]), int(a["nidx"]), int(a["n_axis"])
            tt, k = i // inner, i % inner
            o, j = tt // nidx, tt % nidx
            src = (o * n + self._clamp(self.load(_ptr(a["idx"]), it, j), n)) * inner + k
        elif name.startswith("nx_tal_"):
            off = _emulate_offsets(a["g"], total, wide="_w" in name[-4:])
            src = off[1] + self._clamp(self.load(_ptr(a["idx"]), it, off[0]), int(a["n_axis"])) * int(a["ax_stride"])
        else:
            g, inner = a["g"], int(a["inner"])
            kk = int(g["k"])
            j, k = i // inner, i % inner
            src = k.copy()
            for d in range(kk):
                src += self._clamp(self.load(_ptr(a["idx"]), it, j * kk + d), int(g["dim"][d])) * int(g["stride"][d])
        self.store(_ptr(a["out"]), ut, i, self.load(_ptr(a["x"]), ut, src))

    def _pad(self, name, a, t):
        ut = _pointee(t["x"])
        mode = next(m for m in nm.PAD_MODES if f"_{m}_" in name)
        g, total = a["g"], int(a["total"])
        wide = "_w" in name.rsplit("_", 1)[1][:1] or name.rsplit("_", 1)[1].startswith("w")
        i = np.arange(total)
        src = np.zeros(total, np.int64)
        inside = np.ones(total, bool)
        for d in range(int(g["ndim"]) - 1, -1, -1):
            dim = int(g["dim"][d]) if wide else int(g["dim"][d][0])
            c = (i % dim if d > 0 else i) - int(g["lo"][d])
            i = i // dim if d > 0 else i
            n = int(g["n"][d])
            if mode == "constant":
                inside &= (c >= 0) & (c < n)
            elif mode == "edge":
                c = np.clip(c, 0, n - 1)
            elif mode == "reflect":
                c = np.zeros_like(c) if n == 1 else (lambda m: np.where(m >= n, 2 * (n - 1) - m, m))(c % (2 * (n - 1)))
            elif mode == "symmetric":
                c = (lambda m: np.where(m >= n, 2 * n - 1 - m, m))(c % (2 * n))
            else:
                c = c % n
            src += c * int(g["stride"][d])
        vals = self.load(_ptr(a["x"]), ut, np.where(inside, src, 0))
        self.store(_ptr(a["out"]), ut, np.arange(total), np.where(inside, vals, np.asarray(a["value"]).view(ut)))

    def _keys(self, vals, desc):
        """Sort keys with numeric.cuh's order (ascending; NaN last and one key; -0 == 0); desc: by -x, NaN as +inf."""
        v = vals.astype(np.float64) if (vals.dtype.kind == "f" or vals.dtype == BF16) else vals.astype(np.float64) \
            if vals.dtype.itemsize < 8 else vals
        if v.dtype.kind == "f":
            nan = np.isnan(v)
            if desc:
                return np.where(nan, -np.inf, -v), np.zeros_like(nan)
            return np.where(nan, 0, v), nan
        return (-v.astype(object) if desc else v.astype(object)), np.zeros(v.shape, bool)

    def _sort(self, name, a, t):
        kind = name.split("_")[1]
        if kind == "sortb":
            T = _pointee(t["x"])
            rows, length, kout = int(a["rows"]), int(a["len"]), int(a["kout"])
            for row in range(rows):
                v = self.load(_ptr(a["x"]), T, row * length + np.arange(length))
                key, nan = self._keys(v, bool(int(a["desc_key"])))
                order = sorted(range(length), key=lambda j: (bool(nan[j]), key[j], j))
                if int(a["reverse_out"]):
                    order = order[::-1]
                order = np.asarray(order[:kout], np.int64)
                if a["vals"] is not None:
                    self.store(_ptr(a["vals"]), T, row * kout + np.arange(kout), v[order])
                if a["idxo"] is not None:
                    it = _pointee(t["idxo"])
                    self.store(_ptr(a["idxo"]), it, row * kout + np.arange(kout), order.astype(it))
        elif kind == "sortc":
            T = _pointee(t["x"])
            rows, length, chunk, nch = int(a["rows"]), int(a["len"]), int(a["chunk"]), int(a["nchunks"])
            self.sort_keys = getattr(self, "sort_keys", {})
            for row in range(rows):
                v = self.load(_ptr(a["x"]), T, row * length + np.arange(length))
                key, nan = self._keys(v, bool(int(a["desc_key"])))
                rank = {j: r for r, j in enumerate(sorted(range(length), key=lambda j: (bool(nan[j]), key[j], j)))}
                for c in range(nch):
                    js = sorted(range(c * chunk, min((c + 1) * chunk, length)), key=lambda j: rank[j])
                    # the emulated key of an element is its global rank: the merges compare (key, index)
                    at = row * length + c * chunk + np.arange(len(js))
                    self.store(_ptr(a["keys_out"]), _pointee(t["keys_out"]), at, [rank[j] for j in js])
                    self.store(_ptr(a["idx_out"]), np.int32, at, js)
        elif kind == "sortm":
            kt = _pointee(t["kin"])
            rows, length, width = int(a["rows"]), int(a["len"]), int(a["width"])
            for row in range(rows):
                kin = self.load(_ptr(a["kin"]), kt, row * length + np.arange(length))
                iin = self.load(_ptr(a["iin"]), np.int32, row * length + np.arange(length))
                ko, io = np.empty_like(kin), np.empty_like(iin)
                for start in range(0, length, 2 * width):
                    seg = sorted(zip(kin[start:start + 2 * width], iin[start:start + 2 * width]))
                    ko[start:start + len(seg)] = [s[0] for s in seg]
                    io[start:start + len(seg)] = [s[1] for s in seg]
                    # each run of width must already be sorted (what the previous pass produced)
                    for r0 in range(start, min(start + 2 * width, length), width):
                        run = list(zip(kin[r0:r0 + width], iin[r0:r0 + width]))[: max(0, min(width, length - r0))]
                        assert run == sorted(run), "a merge pass got an unsorted run"
                self.store(_ptr(a["kout"]), kt, row * length + np.arange(length), ko)
                self.store(_ptr(a["iout"]), np.int32, row * length + np.arange(length), io)
        else:
            T = _pointee(t["x"])
            rows, length, kout = int(a["rows"]), int(a["len"]), int(a["kout"])
            for row in range(rows):
                order = self.load(_ptr(a["iin"]), np.int32, row * length + np.arange(length)).astype(np.int64)
                if int(a["reverse_out"]):
                    order = order[::-1]
                order = order[:kout]
                if a["vals"] is not None:
                    v = self.load(_ptr(a["x"]), T, row * length + order)
                    self.store(_ptr(a["vals"]), T, row * kout + np.arange(kout), v)
                if a["idxo"] is not None:
                    it = _pointee(t["idxo"])
                    self.store(_ptr(a["idxo"]), it, row * kout + np.arange(kout), order.astype(it))

    def _imm(self, a, t):
        ta, tb, to = _pointee(t["a"]), _pointee(t["b"]), _pointee(t["out"])
        M, N, K = int(a["M"]), int(a["N"]), int(a["K"])
        nb = int(a["nbatch"])
        off = _emulate_offsets(a["g"], nb, wide=True)
        i, j, k = np.meshgrid(np.arange(M), np.arange(N), np.arange(K), indexing="ij")
        for b in range(nb):
            av = self.load(_ptr(a["a"]), ta, off[0, b] + i * int(a["sam"]) + k * int(a["sak"])).astype(to)
            bv = self.load(_ptr(a["b"]), tb, off[1, b] + k * int(a["sbk"]) + j * int(a["sbn"])).astype(to)
            with np.errstate(over="ignore"):
                prod = (av.astype(np.int64) * bv.astype(np.int64)).sum(axis=2)
            res = (prod != 0) if to == np.bool_ else prod.astype(to)
            self.store(_ptr(a["out"]), to, b * M * N + np.arange(M * N), res.reshape(-1))

    def gemm(self, handle, transa, transb, m, n, k, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c,
             batch, *, a_dtype, b_dtype, c_dtype, compute):
        super().gemm(handle, transa, transb, m, n, k, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc, stride_c,
                     batch, a_dtype=a_dtype, b_dtype=b_dtype, c_dtype=c_dtype, compute=compute)

        def mat(ptr, off, rows, cols, ld, dt):  # column-major rows x cols at ptr + off
            r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
            return self.load(ptr, dt, off + r + c * ld).astype(np.float64)

        for bi in range(batch):
            opa = mat(A, bi * stride_a, *((m, k) if transa.name == "N" else (k, m)), lda, a_dtype)
            opb = mat(B, bi * stride_b, *((k, n) if transb.name == "N" else (n, k)), ldb, b_dtype)
            opa = opa if transa.name == "N" else opa.T
            opb = opb if transb.name == "N" else opb.T
            r, c = np.meshgrid(np.arange(m), np.arange(n), indexing="ij")
            self.store(C, c_dtype, bi * stride_c + r + c * ldc, (alpha * opa @ opb).astype(c_dtype))


@pytest.fixture
def emu(monkeypatch):
    return EmulatingDevice(monkeypatch)


def _check_host(got_dev, want, emu, what):
    got = emu.download(got_dev)
    assert got.shape == np.shape(want), f"{what}: shape {got.shape} != {np.shape(want)}"
    assert got.dtype == np.asarray(want).dtype, f"{what}: dtype {got.dtype} != {np.asarray(want).dtype}"
    assert np.allclose(got.astype(np.float64), np.asarray(want).astype(np.float64), equal_nan=True, rtol=1e-4,
                       atol=1e-6), f"{what}: values differ"


def test_emulated_strided_copies_and_conversions(emu, rng):
    base_h = random(rng, (48 * 64,), np.float32)
    base = emu.upload(base_h)
    for shape, strides, offset in [((48, 64), (1, 48), 0), ((64, 48), (48, -1), 47), ((3, 48, 16), (16, 48, 1), 0),
                                   ((10, 5), (0, -2), 100), ((40,), (65,), 3), ((8, 4, 6, 10), (2, 24, 1, 96), 1),
                                   ((64 * 48,), (1,), 0)]:
        got = nm.strided_copy(base, shape, strides, offset)
        _check_host(got, nm.strided_copy(base_h, shape, strides, offset), emu, f"strided_copy {shape} {strides}")
    for src, dst in [(np.float32, np.float16), (np.int32, np.float64), (np.float32, np.int8), (np.uint8, BF16)]:
        h = (random(rng, (5, 33), np.float32) * 50).astype(src)
        x = emu.upload(h, offset_items=1)
        _check_host(dev.convert(x, dst), h.astype(dst), emu, f"convert {src} -> {dst}")
    x = emu.upload(base_h.reshape(48, 64))
    nm.strided_assign(x, (4, 8), (128, 3), 5, 7.0)
    want = base_h.copy()
    nm.strided_assign(want, (4, 8), (128, 3), 5, 7.0)
    _check_host(x, want.reshape(48, 64), emu, "strided_assign")


@pytest.mark.parametrize("op", ["sum", "max", "mean", "argmax", "argmin", "all"])
def test_emulated_reductions_every_layout(emu, rng, op):
    h = random(rng, (3, 4, 5, 6), np.float32)
    h[0, 1, 2, 3] = np.nan if op in ("max", "argmax") else h[0, 1, 2, 3]
    hs = (h > 0).astype(np.float32) if op == "all" else h
    x = emu.upload(hs)
    xt_h = np.ascontiguousarray(np.transpose(hs, (2, 0, 3, 1)))
    xt = emu.upload(xt_h)
    view = DeviceArray(object(), (3, 4, 5, 6), np.float32, xt.ptr, strides=tuple(4 * s for s in (24, 1, 72, 4)),
                       device_index=0, stream=None)  # (3, 4, 5, 6) as a transposed view of xt
    axes_list = ([(a,) for a in range(4)] + [None] if op.startswith("arg") else
                 [c for r in range(5) for c in itertools.combinations(range(4), r)])
    for axes in axes_list:
        for arr, name in ((x, "contiguous"), (view, "transposed view")):
            got = nm.reduce(op, arr, axes if not op.startswith("arg") else (None if axes is None else axes[0]))
            want = nm.reduce(op, hs, axes if not op.startswith("arg") else (None if axes is None else axes[0]))
            _check_host(got, want, emu, f"{op} over {axes} of a {name}")
    for shape, axes in [((3, 100000), (1,)), ((100000, 3), (0,)), ((2, 3000), (1,)), ((70000,), (0,))]:
        hh = random(rng, shape, np.float32)
        if op == "all":
            hh = (hh > -0.99).astype(np.float32)
        got = nm.reduce(op, emu.upload(hh), axes if not op.startswith("arg") else axes[0])
        _check_host(got, nm.reduce(op, hh, axes if not op.startswith("arg") else axes[0]), emu, f"{op} {shape}")


def test_emulated_gathers_and_padding(emu, rng):
    h = random(rng, (6, 7, 5), np.float32)
    x = emu.upload(h)
    for it in (np.int8, np.uint16, np.int32, np.int64):
        idx = rng.integers(-6 if np.dtype(it).kind == "i" else 0, 9, (3, 2)).astype(it)
        clamp = np.clip(np.where(idx.astype(np.int64) < 0, idx.astype(np.int64) + 7, idx.astype(np.int64)), 0, 6)
        _check_host(nm.take(x, emu.upload(idx), 1), np.take(h, clamp, 1), emu, f"take {it}")
        ta = rng.integers(0, 7, (6, 4, 1)).astype(it)
        _check_host(nm.take_along_axis(x, emu.upload(ta), 1), nm.take_along_axis(h, ta, 1), emu,
                    f"take_along_axis {it}")
    nd = np.array([[0, 1], [5, -1], [2, 3]], np.int64)
    _check_host(nm.gather_nd(x, emu.upload(nd)), nm.gather_nd(h, nd), emu, "gather_nd")
    _check_host(nm.take(x, emu.upload(np.array([3, 100, -1])), None), np.take(h, [3, 100, 209]), emu, "take flat")
    for mode in nm.PAD_MODES:
        w = ((1, 0), (0, 9), (2, 7))
        _check_host(nm.pad(x, w, mode=mode, constant_value=-3.0), nm.pad(h, w, mode=mode, constant_value=-3.0), emu,
                    f"pad {mode}")
    hb = (h > 0)
    _check_host(nm.pad(emu.upload(hb), ((2, 2), (0, 0), (0, 0)), mode="wrap"), np.pad(hb, ((2, 2), (0, 0), (0, 0)),
                                                                                     mode="wrap"), emu, "pad bool")


def test_emulated_sorting(emu, rng):
    h = np.round(random(rng, (5, 37), np.float32), 1)
    h[0, [3, 7]] = np.nan
    h[1, 5] = -0.0
    x = emu.upload(h)
    for axis in (1, 0):
        for descending in (False, True):
            _check_host(nm.sort(x, axis, descending=descending), nm.sort(h, axis, descending=descending), emu,
                        f"sort axis {axis} desc {descending}")
            _check_host(nm.argsort(x, axis, descending=descending), nm.argsort(h, axis, descending=descending), emu,
                        f"argsort axis {axis} desc {descending}")
    vals, idx = nm.top_k(x, 5)
    want_v, want_i = nm.top_k(h, 5)
    _check_host(vals, want_v, emu, "top_k values")
    _check_host(idx, want_i, emu, "top_k indices")
    long_h = np.round(random(rng, (2, 9000), np.float32), 2)
    long = emu.upload(long_h)
    for descending in (False, True):
        _check_host(nm.argsort(long, descending=descending), nm.argsort(long_h, descending=descending), emu,
                    f"argsort of long rows, desc {descending}")
    _check_host(nm.top_k(long, 7)[1], nm.top_k(long_h, 7)[1], emu, "top_k of long rows")


def test_emulated_matmul(emu, rng):
    cases = [((2, 1, 3, 4), (5, 4, 6), False, False), ((7, 3, 4), (4,), False, False), ((4,), (3, 4, 2), False, False),
             ((4, 3), (5, 4), True, True), ((2, 3, 4), (2, 5, 4), False, True), ((3, 4), (4, 1), False, False)]
    for sa, sb, ta, tb in cases:
        for dt in (np.float32, np.float64):
            a_h, b_h = random(rng, sa, dt), random(rng, sb, dt)
            got = nm.matmul(emu.upload(a_h), emu.upload(b_h), transpose_a=ta, transpose_b=tb)
            _check_host(got, nm.matmul(a_h, b_h, transpose_a=ta, transpose_b=tb), emu, f"matmul {sa} {sb} {ta} {tb}")
        for dt in (np.int32, np.int8, np.bool_):
            a_h = rng.integers(-3, 4, sa).astype(dt)
            b_h = rng.integers(-3, 4, sb).astype(dt)
            got = nm.matmul(emu.upload(a_h), emu.upload(b_h), transpose_a=ta, transpose_b=tb)
            _check_host(got, nm.matmul(a_h, b_h, transpose_a=ta, transpose_b=tb), emu, f"int matmul {dt} {sa} {sb}")
