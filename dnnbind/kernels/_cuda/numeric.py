"""CUDA implementation of :mod:`dnnbind.kernels.numeric` (the NumPy-like primitives of ``keras.ops``).

Same signatures and semantics as the NumPy reference there; every call launches on its stream
(``stream=None``: the current one), allocates through the stream-ordered pool and never
synchronises. The device code is ``numeric.cuh`` (conversions, the op functions of the tables,
index arithmetic, the reduction/scan/sort templates); each kernel is a small generated module,
``prelude.cuh + numeric.cuh +`` a tail naming one specialisation (a :class:`_Body`), compiled on first
use per device and cached in memory here and on disk by :class:`dnnbind.cuda.Kernel`.

Strategies (docs/DESIGN.md, "The numeric engine"):

* **Elementwise** (``unary``, ``binary``, ``where``, conversions, ``strided_copy``/``strided_assign``,
  ``full``): one kernel per (op, operand types, compute type, result type, variant). Operands of
  the result's shape, all contiguous: a flat loop with 16-byte vector accesses when every pointer
  allows them (``c``); otherwise per-operand element strides (0 on broadcast axes) over the result's
  index space, adjacent axes merged first, positions split with precomputed multipliers in 32-bit
  arithmetic (``s``) or 64-bit division for spaces or offsets of 2**31 elements and more (``w``).
  Python numbers are kernel parameters.
* **Reductions**: (outer, reduced, inner) after merging axes (one strided copy first when the
  reduced axes are not adjacent, or the array is not contiguous); rows by a warp or a block each,
  columns by a thread each (coalesced across threads); long extents split into fixed chunks
  (from the shape alone) with a second pass over the partials: deterministic.
* **Scans**: rows by a block each (tiles in shared memory; long rows in chunks with a pass over
  the chunk totals), columns by a thread each in index order; few long columns are transposed.
* **matmul**: cuBLAS ``cublasGemmStridedBatchedEx`` (batch broadcasting by a stride 0 where one side
  has no batch, else materialised); integer and bool matmul: a tiled NVRTC kernel.
* **Gathers/scatters**: one thread per moved unit (the widest of 16/8/4/2/1 bytes that divides the
  rows); indices clamped into range on the device; ``index_add``/``scatter_nd(mode="add")`` use
  atomics (float32 scratch for float16/bfloat16, int32 scratch for 8/16-bit ints and bool).
* **Sorting**: bitonic sort of (key, index) pairs in shared memory per row up to ``SORT_BLOCK_MAX``;
  longer rows sort chunks of that size, then merge them pass by pass (ranks by binary search).
* **random**: Philox4x32-10 as ``numeric.philox_uint32``; the counter a parameter or a 0-d uint64
  array read on the device; ``advance_counter`` one thread.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import re
import threading
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Sequence

import numpy as np

from ..._lib.cublas import Operation
from ..._validate import BFLOAT16
from ...cublas import gemm_strided_batched
from ...cuda import Kernel
from ...cuda.array import DeviceArray
from ...cuda.device import CudaDevice, current_device_index
from ...cuda.kernel import compile_kernel
from ...cuda.stream import current_stream
from ...errors import CublasError
from .. import numeric as _ref
from . import _common as cm
from .colsum import channel_sums

__all__ = [
    "UNARY", "BINARY", "REDUCTIONS", "CUMULATIVE", "RANDOM_KINDS", "PAD_MODES", "SORT_BLOCK_MAX",
    "unary", "binary", "where", "reduce", "cumulative", "strided_copy", "strided_assign", "matmul",
    "take", "take_along_axis", "index_add", "gather_nd", "scatter_nd", "pad", "full", "iota",
    "sort", "argsort", "top_k", "random", "advance_counter", "convert", "kernel_bodies", "precompile",
]

# ------------------------------------------------------------------------------------ dtypes
F64, F32, F16, BF16 = np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16), BFLOAT16
BOOL = np.dtype(np.bool_)
I8, U8, I16, U16 = np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16), np.dtype(np.uint16)
I32, U32, I64, U64 = np.dtype(np.int32), np.dtype(np.uint32), np.dtype(np.int64), np.dtype(np.uint64)
_LOW = (F16, BF16)
DTYPES = (F64, F32, F16, BF16, I8, U8, I16, U16, I32, U32, I64, U64, BOOL)

_CTYPE = {F64: "double", F32: "float", F16: "half_t", BF16: "bf16_t", BOOL: "bool_t", I8: "nx::i8", U8: "nx::u8",
          I16: "nx::i16", U16: "nx::u16", I32: "nx::i32", U32: "nx::u32", I64: "i64", U64: "u64"}
_UNIT_DTYPE = {1: U8, 2: U16, 4: U32, 8: U64}
_UNIT_TYPE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
# 64-bit atomicAdd exists for double and unsigned long long (int64 adds as its two's complement)
_NATIVE_ATOMIC = frozenset({F32, F64, I32, U32, I64, U64})


def _compute(dt: np.dtype) -> np.dtype:
    """The type an op computes in for result/storage type ``dt`` (bool as int8 0/1)."""
    if dt in _LOW:
        return F32
    return I8 if dt == BOOL else dt


def _sfx(dt: np.dtype) -> str:
    return cm.suffix(dt)


def _is_float(dt: np.dtype) -> bool:
    return dt.kind == "f" or dt == BF16


# ---------------------------------------------------------------------------- the op tables
# name -> the device function of numeric.cuh (each the NumPy reference's meaning; see its comments)
UNARY: dict[str, str] = {name: f"nx::un_{name}" for name in _ref.UNARY}
BINARY: dict[str, str] = {name: f"nx::bin_{name}" for name in _ref.BINARY}
# ops numeric.cuh defines for integer (and bool) compute types only: a float one is a TypeError
_INTEGER_ONLY = frozenset({"bitwise_invert", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift",
                           "gcd", "lcm"})
_BOOL_RESULT = _ref._BOOL_RESULT
# name -> Reducer OP code (numeric.cuh), "argmax"/"argmin" -> ArgReducer's MAX flag
REDUCTIONS: dict[str, Any] = {"sum": 0, "prod": 1, "max": 2, "min": 3, "mean": 4, "any": 5, "all": 6,
                              "argmax": True, "argmin": False}
CUMULATIVE: dict[str, int] = {"cumsum": 0, "cumprod": 1, "cummax": 2, "cummin": 3}
RANDOM_KINDS: dict[str, int] = {"bits": 0, "uniform": 1, "normal": 2, "truncated_normal": 3}
PAD_MODES: dict[str, int] = {"constant": 0, "edge": 1, "reflect": 2, "symmetric": 3, "wrap": 4}

SORT_BLOCK_MAX = 4096
"""Rows up to this length sort in one block's shared memory (4096 pairs of 8-byte keys and int32
indices: 48 KiB); longer rows sort chunks of this length and merge them."""

MAXD = 16
"""The most axes an operand may keep after adjacent axes are merged (a ValueError beyond)."""

# ------------------------------------------------------------------------- source and kernels
_SOURCE_DIR = cm._SOURCE_DIR
_OPTIONS = ("-std=c++17", "--fmad=false")
_header_text: "list[str]" = []


def header() -> str:
    """prelude.cuh + numeric.cuh: the start of every numeric module."""
    if not _header_text:
        prelude = (_SOURCE_DIR / "prelude.cuh").read_text()
        body = (_SOURCE_DIR / "numeric.cuh").read_text()
        _header_text.append(prelude + '\n#line 1 "numeric.cuh"\n' + body)
    return _header_text[0]


class _Body:
    """One kernel: its extern "C" name and the source tail that defines it (self-contained: tails of
    different kernels can share one translation unit, which the compile tests use)."""

    __slots__ = ("name", "text")

    def __init__(self, name: str, text: str) -> None:
        self.name = name
        self.text = text

    def source(self) -> str:
        return header() + "\n" + self.text

    def __repr__(self) -> str:
        return f"_Body({self.name!r})"


_bodies: "dict[tuple, _Body]" = {}
_kernels: "dict[tuple[str, int], Kernel]" = {}
_lock = threading.Lock()


def _body(key: tuple, make) -> _Body:
    b = _bodies.get(key)
    if b is None:
        b = make()
        with _lock:
            b = _bodies.setdefault(key, b)
    return b


def _kernel(body: _Body, device: int) -> Kernel:
    k = _kernels.get((body.name, device))
    if k is None:
        with _lock:
            k = _kernels.get((body.name, device))
            if k is None:
                k = Kernel(body.source(), body.name, options=_OPTIONS, device=device)
                _kernels[(body.name, device)] = k
    return k


_BLOCK = 256


def _launch(body: _Body, items: int, args: tuple, s) -> None:
    """A grid-stride launch of 256-thread blocks over ``items`` (at most 32 blocks per SM)."""
    if items <= 0:
        return
    device = s._device
    k = _kernels.get((body.name, device)) or _kernel(body, device)
    grid = max(1, min(-(-int(items) // _BLOCK), cm._sm_count(device) * 32))
    k((grid, 1, 1), (_BLOCK, 1, 1), args, stream=s)


def _launch_grid(body: _Body, grid: tuple, block: tuple, args: tuple, s, shared: int = 0) -> None:
    device = s._device
    k = _kernels.get((body.name, device)) or _kernel(body, device)
    k(grid, block, args, shared_mem=shared, stream=s)


# ------------------------------------------------------------------------------ host helpers
def _elem_strides(a: Any) -> tuple:
    """Element strides of a DeviceArray (or a :class:`_View`'s own)."""
    if isinstance(a, _View):
        return a.elem
    item = a.itemsize
    out = []
    for st in a.strides:
        if st % item:
            raise ValueError(f"numeric: array of shape {tuple(a.shape)} {a.dtype} has byte strides {tuple(a.strides)} "
                             "that are not multiples of its itemsize; make a contiguous copy first")
        out.append(st // item)
    return tuple(out)


def _broadcast_strides(a: Any, shape: tuple) -> tuple:
    """``a``'s element strides over ``shape`` (NumPy broadcasting: 0 on broadcast axes)."""
    st = _elem_strides(a)
    lead = len(shape) - a.ndim
    return tuple(0 for _ in range(lead)) + tuple(0 if n == 1 and m != 1 else s
                                                 for n, m, s in zip(a.shape, shape[lead:], st))


def _c_strides(shape: Sequence[int]) -> tuple:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(out))


def merge_axes(shape: Sequence[int], strides: Sequence[Sequence[int]]) -> "tuple[list[int], list[list[int]]]":
    """Drop extents of 1 and merge adjacent axes along which every operand's stride is continuous.

    ``strides``: one stride tuple per operand (over ``shape``). Returns (merged shape, one stride
    list per operand); a space of one element comes back as one axis of extent 1."""
    nops = len(strides)
    dims = [(int(n), [int(st[i]) for st in strides]) for i, n in enumerate(shape) if n != 1]
    if not dims:
        return [1], [[0] for _ in range(nops)]
    merged = [dims[-1]]
    for n, st in reversed(dims[:-1]):
        n_in, st_in = merged[-1]
        if all(a == b * n_in for a, b in zip(st, st_in)):
            merged[-1] = (n * n_in, st_in)
        else:
            merged.append((n, st))
    merged.reverse()
    return [d[0] for d in merged], [[d[1][k] for d in merged] for k in range(nops)]


def fast_divider(d: int) -> tuple:
    """(d, mul, shr) of numeric.cuh's FastDiv: ``n // d == (n * mul) >> (32 + shr)`` for n < 2**31."""
    d = int(d)
    if d == 1:
        return (1, 0, 0)
    p = 31 + (d - 1).bit_length()
    return (d, ((1 << p) + d - 1) // d, p - 32)


def _maxd(nd: int) -> int:
    return 4 if nd <= 4 else (8 if nd <= 8 else 16)


_geo_dtypes: dict = {}


def geo_dtype(nops: int, maxd: int, wide: bool) -> np.dtype:
    """The NumPy record of numeric.cuh's Geo32<NOPS, MAXD> / Geo64<NOPS, MAXD> (the kernel parameter)."""
    key = (nops, maxd, wide)
    dt = _geo_dtypes.get(key)
    if dt is None:
        if wide:
            dt = np.dtype([("ndim", "<i4"), ("pad", "<i4"), ("dim", "<i8", (maxd,)), ("stride", "<i8", (nops, maxd))])
        else:
            dt = np.dtype([("ndim", "<i4"), ("dim", "<u4", (maxd, 3)), ("stride", "<i4", (nops, maxd))])
        _geo_dtypes[key] = dt
    return dt


def _geo(shape: Sequence[int], strides: Sequence[Sequence[int]], maxd: int, wide: bool) -> np.void:
    rec = np.zeros((), geo_dtype(len(strides), maxd, wide))
    rec["ndim"] = len(shape)
    for d, n in enumerate(shape):
        if wide:
            rec["dim"][d] = n
        else:
            rec["dim"][d] = fast_divider(n)
        for k, st in enumerate(strides):
            rec["stride"][k, d] = st[d]
    return rec[()]


def _fits32(shape: Sequence[int], strides: Sequence[Sequence[int]]) -> bool:
    """Every position below 2**31 and every operand's reachable offset within int32."""
    if math.prod(shape) >= 2**31:
        return False
    for st in strides:
        if sum((n - 1) * abs(s) for n, s in zip(shape, st)) >= 2**31:
            return False
    return True


def _check_rank(op: str, shape: Sequence[int], arrays: Sequence[Any]) -> None:
    if len(shape) > MAXD:
        raise ValueError(f"{op}: {len(shape)} axes remain after merging (shapes "
                         f"{', '.join(str(tuple(a.shape)) for a in arrays)}); the device kernels take at most {MAXD}")


def _bits(value: Any, dt: np.dtype) -> np.generic:
    """``value`` (already a value of ``dt``, or a number NumPy converts to it) as the unsigned integer
    of its bytes: scalar kernel parameters travel as raw bits of their C type."""
    arr = np.asarray(value).astype(dt) if not isinstance(value, np.ndarray) or value.dtype != dt else value
    return arr.reshape(()).view(_UNIT_TYPE[dt.itemsize])[()]


def _stream_for(stream: Any, device: Any):
    """The stream of a constructor: ``stream`` if given, else the current stream of ``device``."""
    if stream is not None:
        return cm.stream_of(stream)
    index = None if device is None else getattr(device, "index", device)
    return current_stream(index)


def _ptr_ok(a: Any, nbytes: int) -> bool:
    return a.ptr % nbytes == 0


def _describe(*arrays: Any) -> str:
    return ", ".join(f"{tuple(a.shape)} {a.dtype}" for a in arrays if hasattr(a, "shape"))


# ----------------------------------------------------------------------- elementwise engine
class _In:
    """One input of an elementwise kernel: an array (``array``) or a scalar (``bits``: raw bits of
    ``load``), stored as ``store``, converted through ``mid`` (the reference's intermediate astype,
    or None) to ``load``, the type the op receives."""

    __slots__ = ("array", "bits", "store", "mid", "load")

    def __init__(self, array: Any, bits: Any, store: "np.dtype | None", mid: "np.dtype | None", load: np.dtype):
        self.array, self.bits, self.store, self.mid, self.load = array, bits, store, mid, load


def _load_expr(mid: "np.dtype | None", load: np.dtype, elem: str) -> str:
    if mid is not None and mid != load:
        return f"nx::cvt<{_CTYPE[load]}>(nx::cvt<{_CTYPE[mid]}>({elem}))"
    return f"nx::cvt<{_CTYPE[load]}>({elem})"


def _ew_body(tag: str, expr: str, ins: tuple, to: np.dtype, variant: str, vw: int, maxd: int) -> _Body:
    """Source of one elementwise kernel. ``ins``: per input (store dtype or None for a scalar, mid,
    load); ``variant``: "c" (contiguous, ``vw``-element vectors), "s" (strided, 32-bit), "w" (64-bit)."""
    # per input: store (k: a scalar), m + the intermediate type, x + the load type (no suffix has an m or x)
    parts = [tag] + [(_sfx(st) if st is not None else "k") + (f"m{_sfx(mid)}" if mid is not None else "")
                     + f"x{_sfx(ld)}" for st, mid, ld in ins] + [_sfx(to), variant]
    if variant == "c":
        parts.append(str(vw))
    else:
        parts.append(str(maxd))
    name = "nx_ew_" + "_".join(parts)
    ns = name + "_ns"
    params, scal = [], []
    arrays = [k for k, (st, _, _) in enumerate(ins) if st is not None]
    for k, (st, mid, ld) in enumerate(ins):
        if st is not None:
            params.append(f"const {_CTYPE[st]}* __restrict__ x{k}")
        else:
            params.append(f"nx::Unit<{ld.itemsize}>::t s{k}")
            scal.append(f"const {_CTYPE[ld]} c{k} = nx::bitcast<{_CTYPE[ld]}>(s{k});")
    tos = _CTYPE[to]
    params.append(f"{tos}* __restrict__ out")
    args_decl = ", ".join(f"{_CTYPE[ld]} v{k}" for k, (_, _, ld) in enumerate(ins))
    head = (f"namespace {ns} {{\nusing namespace nx;\n"
            f"__device__ __forceinline__ {tos} op({args_decl}, double p0, double p1) {{\n"
            f"    (void)p0; (void)p1;\n    return cvt<{tos}>({expr});\n}}\n}}\n")

    def call(load_of) -> str:
        vals = []
        for k, (st, mid, ld) in enumerate(ins):
            vals.append(load_of(k, st, mid, ld) if st is not None else f"c{k}")
        return f"{ns}::op({', '.join(vals)}, p0, p1)"

    scal_text = "\n    ".join(scal)
    if variant == "c":
        params += ["i64 n", "double p0", "double p1", "int vec"]
        packs = "\n        ".join(
            f"const Pack<{_CTYPE[ins[k][0]]}, VW> a{k} = load_pack<{_CTYPE[ins[k][0]]}, VW>(x{k}, v * VW);"
            for k in arrays)
        tail = call(lambda k, st, mid, ld: _load_expr(mid, ld, f"x{k}[i]"))
        body = f"""
extern "C" __global__ void {name}({", ".join(params)}) {{
    {scal_text}
    const int VW = {vw};
    const i64 gid = (i64)blockIdx.x * blockDim.x + threadIdx.x, gs = (i64)gridDim.x * blockDim.x;
    const i64 nvec = vec ? n / VW : 0;
    for (i64 v = gid; v < nvec; v += gs) {{
        {packs}
        Pack<{tos}, VW> r;
#pragma unroll
        for (int e = 0; e < VW; ++e) r.e[e] = {call(lambda k, st, mid, ld: _load_expr(mid, ld, f"a{k}.e[e]"))};
        store_pack<{tos}, VW>(out, v * VW, r);
    }}
    for (i64 i = nvec * VW + gid; i < n; i += gs) out[i] = {tail};
}}
"""
    else:
        nops = len(arrays) + 1
        pos = {k: j for j, k in enumerate(arrays)}
        if variant == "s":
            params += ["nx::u32 n", "double p0", "double p1", f"nx::Geo32<{nops}, {maxd}> g"]
            loop = "for (nx::u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)"
            off_t = "int"
        else:
            params += ["i64 n", "double p0", "double p1", f"nx::Geo64<{nops}, {maxd}> g"]
            loop = "for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)"
            off_t = "i64"
        body = f"""
extern "C" __global__ void {name}({", ".join(params)}) {{
    {scal_text}
    {loop} {{
        {off_t} off[{nops}];
        nx::offsets<{nops}, {maxd}>(g, i, off);
        out[off[{nops - 1}]] = {call(lambda k, st, mid, ld: _load_expr(mid, ld, f"x{k}[off[{pos[k]}]]"))};
    }}
}}
"""
    return _Body(name, head + body)


class _View:
    """Device memory seen as an element view: base address, shape, element strides, dtype (the attributes
    the engine reads from a DeviceArray). ``owner`` keeps the memory alive for the call."""

    __slots__ = ("owner", "ptr", "shape", "elem", "dtype", "itemsize", "ndim", "is_contiguous")

    def __init__(self, owner: Any, ptr: int, shape: Sequence[int], elem_strides: Sequence[int], dtype: np.dtype):
        self.owner, self.ptr, self.dtype, self.itemsize = owner, int(ptr), np.dtype(dtype), np.dtype(dtype).itemsize
        self.shape = tuple(int(n) for n in shape)
        self.elem = tuple(int(st) for st in elem_strides)
        self.ndim = len(self.shape)
        c = _c_strides(self.shape)
        self.is_contiguous = math.prod(self.shape) <= 1 or all(n == 1 or a == b
                                                                for n, a, b in zip(self.shape, self.elem, c))

    @property
    def strides(self) -> tuple:
        return tuple(st * self.itemsize for st in self.elem)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @classmethod
    def of(cls, a: Any, dtype: "np.dtype | None" = None) -> "_View":
        """``a`` (a DeviceArray or a view) as a view, its bits read as ``dtype`` (same itemsize)."""
        elem = a.elem if isinstance(a, _View) else _elem_strides(a)
        return cls(a.owner if isinstance(a, _View) else a, a.ptr, a.shape, elem, a.dtype if dtype is None else dtype)


def _arg(a: Any) -> Any:
    """A kernel pointer argument for an array, a view or None."""
    if a is None or isinstance(a, DeviceArray):
        return a
    return cm.p(int(a.ptr))


def _elementwise(tag: str, expr: str, ins: "list[_In]", res: Any, s, p0: float = 0.0, p1: float = 0.0,
                 op: str = "elementwise") -> Any:
    """Run ``expr`` (over v0, v1, ... in the inputs' load types, and p0, p1) into ``res`` (any layout):
    the contiguous vector kernel when every array has the result's shape and is contiguous, else the
    strided kernel over the merged axes. Returns ``res``."""
    shape = tuple(res.shape)
    n = math.prod(shape)
    if n == 0:
        return res
    arrays = [i.array for i in ins if i.array is not None]
    to = res.dtype
    key_ins = tuple((i.store if i.array is not None else None, i.mid, i.load) for i in ins)
    args = [_arg(i.array) if i.array is not None else i.bits for i in ins]
    if res.is_contiguous and all(a.is_contiguous and tuple(a.shape) == shape for a in arrays):
        vw = 16 // max([a.itemsize for a in arrays] + [res.itemsize])
        vec = all(_ptr_ok(a, min(16, vw * a.itemsize)) for a in arrays + [res])
        body = _body(("ew", tag, expr, key_ins, to, "c", vw), lambda: _ew_body(tag, expr, key_ins, to, "c", vw, 0))
        args += [_arg(res), cm.i64(n), cm.f64(p0), cm.f64(p1), cm.i32(vec)]
        _launch(body, max(n // vw, 1) if vec else n, tuple(args), s)
        return res
    strides = [_broadcast_strides(a, shape) for a in arrays] + [_elem_strides(res)]
    mshape, mstrides = merge_axes(shape, strides)
    _check_rank(op, mshape, arrays + [res])
    maxd = _maxd(len(mshape))
    wide = not _fits32(mshape, mstrides)
    variant = "w" if wide else "s"
    body = _body(("ew", tag, expr, key_ins, to, variant, maxd),
                 lambda: _ew_body(tag, expr, key_ins, to, variant, 0, maxd))
    args += [_arg(res), cm.i64(n) if wide else np.uint32(n), cm.f64(p0), cm.f64(p1),
             _geo(mshape, mstrides, maxd, wide)]
    _launch(body, n, tuple(args), s)
    return res


def _array_in(a: Any, load: np.dtype, mid: "np.dtype | None" = None) -> _In:
    return _In(a, None, a.dtype, mid, load)


def _scalar_in(value: Any, load: np.dtype) -> _In:
    return _In(None, _bits(value, load), None, None, load)


def _bit_copy(src: Any, res: Any, s) -> Any:
    """The bits of ``src`` (an array or view, broadcastable to ``res``) into ``res`` (any layout)."""
    unit = _UNIT_DTYPE[src.itemsize]
    dst = _View.of(res, unit)
    _elementwise("copy", "v0", [_In(_View.of(src, unit), None, unit, None, unit)], dst, s, op="copy")
    return res


def convert(x: Any, dtype: Any, *, out: Any = None, stream: Any = None) -> Any:
    """``x.astype(dtype)`` with NumPy's conversion rules (numeric.cuh's cvt), into a new array or ``out``."""
    s = cm.stream_of(stream)
    dt = np.dtype(dtype)
    res = cm.output(out, x.shape, dt, s)
    if dt == x.dtype:
        if x.is_contiguous and res.is_contiguous:
            cm.memcpy(res, x, s)
            return res
        return _bit_copy(x, res, s)
    return _elementwise("cvt", "v0", [_array_in(x, dt)], res, s, op="convert")


def _contiguous(x: Any, s) -> Any:
    """``x`` itself when C-contiguous, else a contiguous copy."""
    if x.is_contiguous:
        return x
    return _bit_copy(x, cm.empty(x.shape, x.dtype, s), s)


def _to_dtype(x: Any, dt: np.dtype, s) -> Any:
    """``x`` contiguous and of ``dt`` (converted or copied only when needed)."""
    if x.dtype != dt:
        return convert(x, dt, stream=s)
    return _contiguous(x, s)


# --------------------------------------------------------------------------- elementwise ops
def _unary_types(op: str, xdt: np.dtype, dt: np.dtype) -> "tuple[np.dtype, np.dtype | None, str]":
    """(compute type, intermediate conversion, device function) of unary ``op`` as the reference computes it."""
    if op in _BOOL_RESULT:
        c, mid = _compute(xdt), None
    elif _is_float(dt):
        c = _compute(dt)
        # integers and bools round to dt first (x.astype(dt) in the reference), then widen to c
        mid = dt if not _is_float(xdt) and dt != c else None
    else:
        c, mid = _compute(xdt), None
    fn = UNARY[op]
    if op == "bitwise_invert" and xdt == BOOL and not _is_float(dt):
        fn = UNARY["logical_not"]  # NumPy inverts bools logically
    return c, mid, fn


def unary(op: str, x: Any, *, p0: float = 0.0, p1: float = 0.0, dtype: Any, out: Any = None, stream: Any = None) -> Any:
    """``numeric.unary`` on the device (see the module docstring)."""
    s = cm.stream_of(stream)
    dt = np.dtype(dtype)
    c, mid, fn = _unary_types(op, x.dtype, dt)
    if op in _INTEGER_ONLY and _is_float(c):
        raise TypeError(f"{op}: not defined for float operands (x {tuple(x.shape)} {x.dtype}, dtype {dt})")
    res = cm.output(out, x.shape, dt, s)
    return _elementwise("un_" + op, f"{fn}<{_CTYPE[c]}>(v0, p0, p1)", [_array_in(x, c, mid)], res, s,
                        float(p0), float(p1), op=op)


def _binary_work(a: Any, b: Any, dt: np.dtype) -> np.dtype:
    """The reference's ``work`` type (before the float16/bfloat16 -> float32 step)."""
    if dt == BOOL:
        return np.dtype(np.result_type(*(v.dtype if hasattr(v, "dtype") else type(v) for v in (a, b))))
    return dt


def binary(op: str, a: Any, b: Any, *, dtype: Any, out: Any = None, stream: Any = None) -> Any:
    """``numeric.binary`` on the device; a Python number operand is a kernel parameter."""
    s = cm.stream_of(stream)
    dt = np.dtype(dtype)
    work = _binary_work(a, b, dt)
    work = F32 if work in _LOW else work
    c = _compute(work)
    if op in _INTEGER_ONLY and _is_float(c):
        raise TypeError(f"{op}: not defined for float operands ({_describe(a, b)}, dtype {dt}: compute type {c})")
    shape = _ref.broadcast_shapes(*(v.shape for v in (a, b) if hasattr(v, "shape")), op=op)
    res = cm.output(out, shape, dt, s)
    ins = []
    for v in (a, b):
        if hasattr(v, "shape"):
            ins.append(_array_in(v, c))
        else:
            ins.append(_scalar_in(work.type(v) if work.kind in "fciu" else v, c))
    return _elementwise("bin_" + op, f"{BINARY[op]}<{_CTYPE[c]}>(v0, v1)", ins, res, s, op=op)


def where(condition: Any, a: Any, b: Any, *, dtype: Any, out: Any = None, stream: Any = None) -> Any:
    """``numeric.where`` on the device: ``condition`` any dtype (nonzero is true), a/b converted to ``dtype``."""
    s = cm.stream_of(stream)
    dt = np.dtype(dtype)
    shape = _ref.broadcast_shapes(*(v.shape for v in (condition, a, b) if hasattr(v, "shape")), op="where")
    res = cm.output(out, shape, dt, s)
    ins = [_array_in(condition, BOOL)]
    for v in (a, b):
        ins.append(_array_in(v, dt) if hasattr(v, "shape") else _scalar_in(np.asarray(v).astype(dt), dt))
    return _elementwise("where", "v0.v ? v1 : v2", ins, res, s, op="where")


# ------------------------------------------------------------------------------ strided views
def _transpose_body(unit: int, maxd: int) -> _Body:
    name = f"nx_tr_u{unit}_{maxd}"
    ut = f"nx::Unit<{unit}>::t"
    text = f"""
extern "C" __global__ void {name}(const {ut}* __restrict__ x, {ut}* __restrict__ out, i64 P, i64 Q, i64 sp, i64 sq,
                                  i64 osp, i64 nbatch, nx::Geo64<2, {maxd}> g) {{
    __shared__ {ut} tile[32][33];
    const i64 tp = (P + 31) / 32, tq = (Q + 31) / 32, ntiles = nbatch * tp * tq;
    for (i64 t = blockIdx.x; t < ntiles; t += gridDim.x) {{
        const i64 b = t / (tp * tq), r = t - b * (tp * tq);
        const i64 p0 = (r / tq) * 32, q0 = (r - (r / tq) * tq) * 32;
        i64 off[2];
        nx::offsets<2, {maxd}>(g, b, off);
        for (int j = threadIdx.y; j < 32; j += blockDim.y) {{
            const i64 p = p0 + threadIdx.x, q = q0 + j;
            if (p < P && q < Q) tile[j][threadIdx.x] = x[off[0] + p * sp + q * sq];
        }}
        __syncthreads();
        for (int j = threadIdx.y; j < 32; j += blockDim.y) {{
            const i64 p = p0 + j, q = q0 + threadIdx.x;
            if (p < P && q < Q) out[off[1] + p * osp + q] = tile[threadIdx.x][j];
        }}
        __syncthreads();
    }}
}}
"""
    return _Body(name, text)


_TILE_MIN = 8  # both tiled extents at least this: otherwise the plain gather moves it


def _copy_view(src: _View, res: Any, s) -> Any:
    """Bit copy of the view ``src`` (shape of ``res``) into contiguous ``res``: a memcpy when the view is
    contiguous, a shared-memory tiled transpose when the view's unit-stride axis is not the last one,
    else the strided gather."""
    shape = tuple(res.shape)
    n = math.prod(shape)
    if n == 0:
        return res
    mshape, (sst, ost) = merge_axes(shape, [src.elem, _c_strides(shape)])
    if len(mshape) == 1 and sst[0] == 1:
        cm.memcpy(res, src, s, nbytes=n * src.itemsize)
        return res
    q = len(mshape) - 1
    p = next((d for d in range(q - 1, -1, -1) if abs(sst[d]) == 1), None)
    if (p is not None and sst[q] != 1 and mshape[p] >= _TILE_MIN and mshape[q] >= _TILE_MIN
            and len(mshape) <= MAXD):
        batch = [d for d in range(len(mshape)) if d not in (p, q)]
        bshape = [mshape[d] for d in batch] or [1]
        bstr = [[sst[d] for d in batch] or [0], [ost[d] for d in batch] or [0]]
        maxd = _maxd(len(bshape))
        body = _body(("tr", src.itemsize, maxd), lambda: _transpose_body(src.itemsize, maxd))
        nbatch = math.prod(bshape)
        tiles = nbatch * -(-mshape[p] // 32) * -(-mshape[q] // 32)
        grid = max(1, min(tiles, cm._sm_count(s._device) * 16))
        _launch_grid(body, (grid, 1, 1), (32, 8, 1),
                     (_arg(src), _arg(res), cm.i64(mshape[p]), cm.i64(mshape[q]), cm.i64(sst[p]), cm.i64(sst[q]),
                      cm.i64(ost[p]), cm.i64(nbatch), _geo(bshape, bstr, maxd, True)), s)
        return res
    return _bit_copy(src, res, s)


def strided_copy(x: Any, shape: Sequence[int], strides: Sequence[int], offset: int = 0, *, out: Any = None,
                 stream: Any = None) -> Any:
    """``numeric.strided_copy`` on the device (memcpy, tiled transpose or strided gather)."""
    s = cm.stream_of(stream)
    shape = tuple(int(n) for n in shape)
    res = cm.output(out, shape, x.dtype, s)
    if math.prod(shape) == 0:
        return res
    src = _View(x, x.ptr + int(offset) * x.itemsize, shape, strides, x.dtype)
    if res.is_contiguous:
        return _copy_view(src, res, s)
    return _bit_copy(src, res, s)


def _overlaps(a: Any, b: Any) -> bool:
    """Whether the bytes ``a`` can reach and those ``b`` can reach intersect."""
    def span(v):
        elem = v.elem if isinstance(v, _View) else _elem_strides(v)
        lo = v.ptr + sum((n - 1) * st for n, st in zip(v.shape, elem) if st < 0) * v.itemsize
        hi = v.ptr + (sum((n - 1) * st for n, st in zip(v.shape, elem) if st > 0) + 1) * v.itemsize
        return lo, hi
    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def strided_assign(x: Any, shape: Sequence[int], strides: Sequence[int], offset: int, value: Any, *,
                   stream: Any = None) -> Any:
    """``numeric.strided_assign`` on the device: in place into the view of ``x``; returns ``x``. A value
    array that shares memory with the view is copied first (NumPy's assignment semantics)."""
    s = cm.stream_of(stream)
    shape = tuple(int(n) for n in shape)
    if math.prod(shape) == 0:
        return x
    dst = _View(x, x.ptr + int(offset) * x.itemsize, shape, strides, x.dtype)
    if hasattr(value, "shape"):
        if value.size == 0:
            return x
        if _overlaps(value, dst):
            value = _bit_copy(value, cm.empty(value.shape, value.dtype, s), s)
        if value.dtype == x.dtype:
            _bit_copy(value, dst, s)
        else:
            _elementwise("cvt", "v0", [_array_in(value, x.dtype)], dst, s, op="strided_assign")
        return x
    with np.errstate(all="ignore"):
        raw = np.asarray(value).astype(x.dtype)
    unit = _UNIT_DTYPE[x.itemsize]
    _elementwise("copy", "v0", [_In(None, _bits(raw, x.dtype), None, None, unit)], _View.of(dst, unit), s,
                 op="strided_assign")
    return x


# ------------------------------------------------------------------------------ constructors
def full(shape: Sequence[int], value: Any, dtype: Any, *, device: Any = None, stream: Any = None) -> Any:
    """``numeric.full`` on the device: a memset when every byte of the value is the same, else a fill kernel."""
    s = _stream_for(stream, device)
    dt = np.dtype(dtype)
    res = cm.empty(tuple(int(n) for n in shape), dt, s)
    if res.size == 0:
        return res
    with np.errstate(all="ignore"):
        raw = np.full((), value, dtype=dt)
    data = raw.tobytes()
    if data.count(data[:1]) == len(data):
        cm.memset(res, data[0], s)
        return res
    unit = _UNIT_DTYPE[dt.itemsize]
    _elementwise("copy", "v0", [_In(None, _bits(raw, dt), None, None, unit)], _View.of(res, unit), s, op="full")
    return res


def _iota_body(to: np.dtype, integer: bool) -> _Body:
    name = f"nx_iota_{_sfx(to)}_{'i' if integer else 'f'}"
    value = ("nx::cvt<{t}>((i64)((u64)istart + (u64)i * (u64)istep))" if integer
             else "nx::cvt<{t}>(start + (double)i * step)").format(t=_CTYPE[to])
    text = f"""
extern "C" __global__ void {name}({_CTYPE[to]}* __restrict__ out, i64 n, double start, double step, i64 istart,
                                  i64 istep) {{
    (void)start; (void)step; (void)istart; (void)istep;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        out[i] = {value};
}}
"""
    return _Body(name, text)


def iota(n: int, start: float, step: float, dtype: Any, *, device: Any = None, stream: Any = None) -> Any:
    """``numeric.iota`` on the device: float64 arithmetic for floats, int64 (wrapping) for int/bool dtypes."""
    s = _stream_for(stream, device)
    dt = np.dtype(dtype)
    res = cm.empty((int(n),), dt, s)
    if n <= 0:
        return res
    integer = dt.kind in "iub"
    body = _body(("iota", dt, integer), lambda: _iota_body(dt, integer))
    if integer:
        istart, istep, fstart, fstep = int(np.asarray(start, np.int64)), int(np.asarray(step, np.int64)), 0.0, 0.0
    else:
        istart, istep, fstart, fstep = 0, 0, float(start), float(step)
    _launch(body, int(n), (res, cm.i64(int(n)), cm.f64(fstart), cm.f64(fstep), cm.i64(istart), cm.i64(istep)), s)
    return res


# ------------------------------------------------------------------------------------ reductions
_COLUMN_SUM_DTYPES = frozenset(np.dtype(t) for t in (np.float16, BFLOAT16, np.float32, np.float64))
_ROW_WARP_MAX = 4096      # rows up to this long: a warp each; longer: a block (or several) each
_ROW_THREAD_MAX = 16      # rows up to this long: a thread each (the column kernel with inner == 1)
_TARGET_BLOCKS = 1024     # a row reduction splits long rows until about this many blocks work
_COL_THREADS = 1 << 16    # a column reduction with fewer threads splits its extent (if longer than 64)
_ACC_BYTES_ARG = 16       # sizeof(ValIdx<A>)


def _reduce_types(op: str, xdt: np.dtype, dt: np.dtype) -> "tuple[str, np.dtype]":
    """(the C++ reducer type's template arguments after Tin, accumulator dtype) of ``op``."""
    if op in ("argmax", "argmin"):
        a = U8 if xdt == BOOL else _compute(xdt)
        return f"nx::ArgReducer<{_CTYPE[xdt]}, {_CTYPE[a]}, {_CTYPE[dt]}, {'true' if REDUCTIONS[op] else 'false'}>", a
    code = REDUCTIONS[op]
    if op in ("any", "all"):
        src, acc = U8, U8
    else:
        src = F32 if dt in _LOW else dt  # the reference's src dtype: x.astype(compute(dt))
        if op in ("sum", "prod"):
            acc = I64 if dt == BOOL else src
        elif op == "mean":
            acc = src if _is_float(dt) else F64
        else:
            acc = U8 if dt == BOOL else src
    return f"nx::Reducer<{_CTYPE[xdt]}, {_CTYPE[src]}, {_CTYPE[acc]}, {_CTYPE[dt]}, {code}>", acc


def _acc_size(op: str, acc: np.dtype) -> int:
    return _ACC_BYTES_ARG if op in ("argmax", "argmin") else acc.itemsize


def _reduce_body(reducer: str, tag: str, variant: str, vw: int, partial: bool) -> _Body:
    """``variant``: "rb" rows by blocks, "rw" rows by warps, "c32"/"c64" columns (32/64-bit positions)."""
    name = f"nx_red_{tag}_{variant}{vw}{'p' if partial else ''}"
    ns = name + "_ns"
    rdecl = f"nx::PartialReducer<{reducer}>" if partial else reducer
    head = f"namespace {ns} {{ typedef {rdecl} R; }}\n"
    r = f"{ns}::R"
    if variant == "rb":
        text = f"""
extern "C" __global__ void {name}(const {r}::Tin* __restrict__ x, {r}::TO* __restrict__ out, {r}::Acc* partial,
                                  i64 rows, i64 len, i64 chunk, i64 nsplit, int vec, i64 count) {{
    nx::reduce_rows_block<{r}, 256, {vw}>(x, out, partial, rows, len, chunk, nsplit, vec, count);
}}
"""
    elif variant == "rw":
        text = f"""
extern "C" __global__ void {name}(const {r}::Tin* __restrict__ x, {r}::TO* __restrict__ out, i64 rows, i64 len,
                                  int vec, i64 count) {{
    nx::reduce_rows_warp<{r}, {vw}>(x, out, rows, len, vec, count);
}}
"""
    else:
        idx = "nx::u32" if variant == "c32" else "i64"
        text = f"""
extern "C" __global__ void {name}(const {r}::Tin* __restrict__ x, {r}::TO* __restrict__ out, {r}::Acc* partial,
                                  {idx} outer, {idx} len, {idx} inner, {idx} chunk, {idx} nsplit, i64 count) {{
    nx::reduce_cols<{r}, {idx}>(x, out, partial, outer, len, inner, chunk, nsplit, count);
}}
"""
    return _Body(name, head + text)


def _reduce_layout(x: Any, axes: Sequence[int], s) -> "tuple[int, int, int, Any]":
    """(outer, reduced, inner, contiguous source) with the reduced axes one run."""
    shape = tuple(int(n) for n in x.shape)
    red = set(axes)
    if x.is_contiguous:
        runs: list = []
        for i, n in enumerate(shape):
            if n == 1:
                continue
            flag = i in red
            if runs and runs[-1][1] == flag:
                runs[-1][0] *= n
            else:
                runs.append([n, flag])
        nred = sum(1 for _, f in runs if f)
        if nred <= 1:
            j = next((k for k, (_, f) in enumerate(runs) if f), len(runs))
            outer = math.prod(n for n, _ in runs[:j])
            length = runs[j][0] if j < len(runs) else 1
            inner = math.prod(n for n, _ in runs[j + 1:])
            return outer, length, inner, x
    kept = [i for i in range(len(shape)) if i not in red]
    order = kept + sorted(red)
    elem = _elem_strides(x)
    pshape = tuple(shape[i] for i in order)
    tmp = cm.empty(pshape, x.dtype, s)
    _copy_view(_View(x, x.ptr, pshape, tuple(elem[i] for i in order), x.dtype), tmp, s)
    return math.prod(shape[i] for i in kept), math.prod(shape[i] for i in red), 1, tmp


def reduce(op: str, x: Any, axis: Any, keepdims: bool, *, dtype: Any, out: Any = None, stream: Any = None) -> Any:
    """``numeric.reduce`` on the device (``axis``: a tuple of axes, or for argmax/argmin an int or None)."""
    s = cm.stream_of(stream)
    dt = np.dtype(dtype)
    ndim = x.ndim
    if op in ("argmax", "argmin"):
        axes = tuple(range(ndim)) if axis is None else (int(axis),)
    else:
        axes = tuple(sorted(int(a) for a in axis))
    if op in ("argmax", "argmin") and axis is None:
        out_shape = (1,) * ndim if keepdims else ()
    else:
        out_shape = tuple(1 if i in axes else n for i, n in enumerate(x.shape)) if keepdims else tuple(
            n for i, n in enumerate(x.shape) if i not in axes)
    final = cm.output(out, out_shape, dt, s)
    n_out = math.prod(out_shape)
    if n_out == 0:
        return final
    target = final if final.is_contiguous else cm.empty(out_shape, dt, s)
    outer, length, inner, src = _reduce_layout(x, axes, s)
    if op == "sum" and outer == 1 and inner > 1 and length > 1 and dt == x.dtype and dt in _COLUMN_SUM_DTYPES:
        # the leading axes summed (a broadcast add's VJP, a bias gradient): layout.cu's column sums,
        # 16-byte loads and a short second pass (the generic column kernel's second pass walks
        # thousands of partials per thread: 37 us against 7 us for a 2.8M-element bias gradient)
        channel_sums(src.reshape(length, inner), "NHWC", s, out=target.reshape(inner))
        if target is not final:
            _bit_copy(target, final, s)
        return final
    reducer, acc = _reduce_types(op, x.dtype, dt)
    tag = f"{op}_{_sfx(x.dtype)}_{_sfx(acc)}_{_sfx(dt)}"
    asz = _acc_size(op, acc)
    count = cm.i64(length)
    if inner == 1 and length > _ROW_THREAD_MAX:
        vw = 16 // x.dtype.itemsize
        vec = int(length % vw == 0 and _ptr_ok(src, 16))
        if length <= _ROW_WARP_MAX:
            body = _body(("red", reducer, "rw", vw, False), lambda: _reduce_body(reducer, tag, "rw", vw, False))
            _launch(body, outer * 32, (_arg(src), _arg(target), cm.i64(outer), cm.i64(length), cm.i32(vec), count), s)
        else:
            slot = 256 * vw
            nsplit = max(1, min(-(-_TARGET_BLOCKS // outer), -(-length // (slot * 4))))
            chunk = -(-(-(-length // nsplit)) // slot) * slot
            nsplit = -(-length // chunk)
            partial = cm.empty((outer * nsplit * asz,), U8, s) if nsplit > 1 else None
            body = _body(("red", reducer, "rb", vw, False), lambda: _reduce_body(reducer, tag, "rb", vw, False))
            grid = max(1, min(outer * nsplit, cm._sm_count(s._device) * 32))
            _launch_grid(body, (grid, 1, 1), (256, 1, 1),
                         (_arg(src), _arg(target), _arg(partial), cm.i64(outer), cm.i64(length), cm.i64(chunk),
                          cm.i64(nsplit), cm.i32(vec), count), s)
            if partial is not None:
                body2 = _body(("red", reducer, "rw", 1, True), lambda: _reduce_body(reducer, tag, "rw", 1, True))
                _launch(body2, outer * 32,
                        (_arg(partial), _arg(target), cm.i64(outer), cm.i64(nsplit), cm.i32(0), count), s)
    else:
        threads = outer * inner
        nsplit = 1
        if threads < _COL_THREADS and length > 64:
            nsplit = max(1, min(-(-2 * _COL_THREADS // threads), -(-length // 32)))
        chunk = max(1, -(-length // nsplit))
        nsplit = max(1, -(-length // chunk))
        wide = outer * max(length, 1) * inner >= 2**31 or outer * nsplit * inner >= 2**31
        variant = "c64" if wide else "c32"
        ity = cm.i64 if wide else np.uint32
        partial = cm.empty((outer * nsplit * inner * asz,), U8, s) if nsplit > 1 else None
        body = _body(("red", reducer, variant, 1, False), lambda: _reduce_body(reducer, tag, variant, 1, False))
        _launch(body, outer * nsplit * inner,
                (_arg(src), _arg(target), _arg(partial), ity(outer), ity(length), ity(inner), ity(chunk), ity(nsplit),
                 count), s)
        if partial is not None:
            body2 = _body(("red", reducer, variant, 1, True), lambda: _reduce_body(reducer, tag, variant, 1, True))
            _launch(body2, outer * inner,
                    (_arg(partial), _arg(target), None, ity(outer), ity(nsplit), ity(inner), ity(nsplit), ity(1),
                     count), s)
    if target is not final:
        _bit_copy(target, final, s)
    return final


# ------------------------------------------------------------------------------------------ scans
_SCAN_CHUNK = 8192      # long rows of few-row scans split into chunks of this many elements
_SCAN_FEW_ROWS = 256    # "few rows": fewer than this
_SCAN_TRANSPOSE = 4096  # column scans with fewer (outer * inner) columns than this transpose to rows


def _scan_types(op: str, dt: np.dtype) -> "tuple[np.dtype, np.dtype]":
    src = F32 if dt in _LOW else dt
    if dt == BOOL:
        return src, (I64 if op in ("cumsum", "cumprod") else U8)
    return src, src


def _scan_body(op: str, tin: np.dtype, src: np.dtype, acc: np.dtype, to: np.dtype, variant: str) -> _Body:
    name = f"nx_scan_{op}_{_sfx(tin)}_{_sfx(src)}_{_sfx(acc)}_{_sfx(to)}_{variant}"
    ns = name + "_ns"
    head = (f"namespace {ns} {{ typedef nx::Scanner<{_CTYPE[tin]}, {_CTYPE[src]}, {_CTYPE[acc]}, {_CTYPE[to]}, "
            f"{CUMULATIVE[op]}> SC; }}\n")
    sc = f"{ns}::SC"
    if variant == "r":
        text = f"""
extern "C" __global__ void {name}(const {_CTYPE[tin]}* __restrict__ x, {_CTYPE[to]}* __restrict__ out,
                                  const {sc}::Acc* carry, {sc}::Acc* totals, i64 rows, i64 len, i64 chunk,
                                  i64 nchunks, int reverse, int mode) {{
    nx::scan_rows<{sc}, {_CTYPE[tin]}, {_CTYPE[to]}, 256, 4>(x, out, carry, totals, rows, len, chunk, nchunks, reverse,
                                                             mode);
}}
"""
    else:
        text = f"""
extern "C" __global__ void {name}(const {_CTYPE[tin]}* __restrict__ x, {_CTYPE[to]}* __restrict__ out, i64 outer,
                                  i64 len, i64 inner, int reverse) {{
    nx::scan_cols<{sc}, {_CTYPE[to]}>(x, out, outer, len, inner, reverse);
}}
"""
    return _Body(name, head + text)


def _scan_rows(op: str, x: Any, res: Any, rows: int, length: int, reverse: bool, s) -> None:
    dt = res.dtype
    src, acc = _scan_types(op, dt)
    body = _body(("scan", op, x.dtype, src, acc, dt, "r"), lambda: _scan_body(op, x.dtype, src, acc, dt, "r"))
    cap = cm._sm_count(s._device) * 32
    if rows >= _SCAN_FEW_ROWS or length <= _SCAN_CHUNK:
        _launch_grid(body, (max(1, min(rows, cap)), 1, 1), (256, 1, 1),
                     (_arg(x), _arg(res), None, None, cm.i64(rows), cm.i64(length), cm.i64(length), cm.i64(1),
                      cm.i32(reverse), cm.i32(0)), s)
        return
    nchunks = -(-length // _SCAN_CHUNK)
    jobs = max(1, min(rows * nchunks, cap))
    totals = cm.empty((rows * nchunks,), acc, s)
    scanned = cm.empty((rows * nchunks,), acc, s)
    _launch_grid(body, (jobs, 1, 1), (256, 1, 1),
                 (_arg(x), _arg(res), None, totals, cm.i64(rows), cm.i64(length), cm.i64(_SCAN_CHUNK),
                  cm.i64(nchunks), cm.i32(reverse), cm.i32(1)), s)
    body2 = _body(("scan", op, acc, acc, acc, acc, "r"), lambda: _scan_body(op, acc, acc, acc, acc, "r"))
    _launch_grid(body2, (max(1, min(rows, cap)), 1, 1), (256, 1, 1),
                 (totals, scanned, None, None, cm.i64(rows), cm.i64(nchunks), cm.i64(nchunks), cm.i64(1), cm.i32(0),
                  cm.i32(0)), s)
    _launch_grid(body, (jobs, 1, 1), (256, 1, 1),
                 (_arg(x), _arg(res), scanned, None, cm.i64(rows), cm.i64(length), cm.i64(_SCAN_CHUNK),
                  cm.i64(nchunks), cm.i32(reverse), cm.i32(0)), s)


def cumulative(op: str, x: Any, axis: int, *, reverse: bool, dtype: Any, out: Any = None, stream: Any = None) -> Any:
    """``numeric.cumulative`` on the device (row scans per block, column scans per thread, in index order)."""
    s = cm.stream_of(stream)
    dt = np.dtype(dtype)
    final = cm.output(out, x.shape, dt, s)
    if x.size == 0:
        return final
    res = final if final.is_contiguous else cm.empty(x.shape, dt, s)
    xc = _contiguous(x, s)
    shape = tuple(int(n) for n in x.shape)
    outer, length, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    if inner == 1:
        _scan_rows(op, xc, res, outer, length, bool(reverse), s)
    elif outer * inner < _SCAN_TRANSPOSE and length >= 256:
        # few long columns: scan them as rows of a transposed copy, then transpose back
        rows_shape = (outer, inner, length)
        xt = cm.empty(rows_shape, x.dtype, s)
        _copy_view(_View(xc, xc.ptr, rows_shape, (length * inner, 1, inner), x.dtype), xt, s)
        rt = cm.empty(rows_shape, dt, s)
        _scan_rows(op, xt, rt, outer * inner, length, bool(reverse), s)
        cols = (outer, length, inner)
        _copy_view(_View(rt, rt.ptr, cols, (length * inner, 1, length), dt),
                   _View(res, res.ptr, cols, _c_strides(cols), dt), s)
    else:
        src, acc = _scan_types(op, dt)
        body = _body(("scan", op, x.dtype, src, acc, dt, "c"), lambda: _scan_body(op, x.dtype, src, acc, dt, "c"))
        _launch(body, outer * inner, (_arg(xc), _arg(res), cm.i64(outer), cm.i64(length), cm.i64(inner),
                                      cm.i32(bool(reverse))), s)
    if res is not final:
        _bit_copy(res, final, s)
    return final


# ------------------------------------------------------------------------------------------ matmul
def _gemm_compute(dt: np.dtype) -> str:
    if dt == F64:
        return "float64"
    if dt == F32:
        return "tf32" if cm.config().allow_tf32 else "float32"
    return "float32"  # float16/bfloat16 data: float32 accumulation


def _imatmul_body(ta: np.dtype, tb: np.dtype, to: np.dtype, maxd: int) -> _Body:
    name = f"nx_imm_{_sfx(ta)}_{_sfx(tb)}_{_sfx(to)}_{maxd}"
    acc = "u64" if to.itemsize == 8 else "nx::u32"
    dstore = _CTYPE[to]
    text = f"""
extern "C" __global__ void {name}(const {_CTYPE[ta]}* __restrict__ a, const {_CTYPE[tb]}* __restrict__ b,
                                  {dstore}* __restrict__ out, i64 M, i64 N, i64 K, i64 sam, i64 sak, i64 sbk, i64 sbn,
                                  i64 nbatch, nx::Geo64<2, {maxd}> g) {{
    // 16x16 output tiles; values converted to the result type, products summed wrapping in {acc}
    __shared__ {acc} ta[16][17];
    __shared__ {acc} tb[16][17];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const i64 tm = (M + 15) / 16, tn = (N + 15) / 16, total = nbatch * tm * tn;
    for (i64 t = blockIdx.x; t < total; t += gridDim.x) {{
        const i64 bi = t / (tm * tn), r = t - bi * (tm * tn);
        const i64 i = (r / tn) * 16 + ty, j = (r - (r / tn) * tn) * 16 + tx;
        i64 off[2];
        nx::offsets<2, {maxd}>(g, bi, off);
        {acc} sum = 0;
        for (i64 k0 = 0; k0 < K; k0 += 16) {{
            const i64 ka = k0 + tx, kb = k0 + ty;
            ta[ty][tx] = (i < M && ka < K) ? ({acc})nx::arith(nx::cvt<{dstore}>(a[off[0] + i * sam + ka * sak]))
                                           : ({acc})0;
            tb[ty][tx] = (kb < K && j < N) ? ({acc})nx::arith(nx::cvt<{dstore}>(b[off[1] + kb * sbk + j * sbn]))
                                           : ({acc})0;
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < 16; ++kk) sum += ta[ty][kk] * tb[kk][tx];
            __syncthreads();
        }}
        if (i < M && j < N) out[bi * M * N + i * N + j] = nx::cvt<{dstore}>(sum);
    }}
}}
"""
    return _Body(name, text)


def _operand(x: Any, transposed: bool, vector_first: bool) -> "tuple[tuple, tuple, tuple]":
    """(batch shape, matrix shape as op(x) (rows, cols), element strides (batch..., rows, cols) of op(x))."""
    elem = _elem_strides(x)
    if x.ndim == 1:
        n = int(x.shape[0])
        return (), ((1, n) if vector_first else (n, 1)), ((0, elem[0]) if vector_first else (elem[0], 0))
    shape = tuple(int(v) for v in x.shape)
    rows, cols = shape[-2], shape[-1]
    rs, cs = elem[-2], elem[-1]
    if transposed:
        rows, cols, rs, cs = cols, rows, cs, rs
    return shape[:-2], (rows, cols), tuple(elem[:-2]) + (rs, cs)


def matmul(a: Any, b: Any, *, transpose_a: bool = False, transpose_b: bool = False, dtype: Any, out: Any = None,
           stream: Any = None) -> Any:
    """``numeric.matmul`` on the device: cuBLAS ``cublasGemmStridedBatchedEx`` for float dtypes (float16/
    bfloat16 with float32 accumulation, float32 TF32 under ``config.allow_tf32``, float64), a tiled NVRTC
    kernel for integer and bool dtypes (exact, wrapping)."""
    op = "matmul"
    s = cm.stream_of(stream)
    dt = np.dtype(dtype)
    ba, (m, k), _ = _operand(a, transpose_a, True)
    bb, (_, n), _ = _operand(b, transpose_b, False)
    batch = tuple(_ref.broadcast_shapes(ba, bb, op=op))
    shape = batch + ((m,) if a.ndim >= 2 else ()) + ((n,) if b.ndim >= 2 else ())
    final = cm.output(out, shape, dt, s)
    nbatch = math.prod(batch)
    if nbatch * m * n == 0:
        return final
    for name, v in (("m", m), ("n", n), ("k", k), ("batch", nbatch)):
        if v >= 2**31:
            raise ValueError(f"{op}: {name} = {v} exceeds the device limit 2**31 - 1 (a {tuple(a.shape)}, "
                             f"b {tuple(b.shape)})")
    if not _is_float(dt):
        return _imatmul(a, b, transpose_a, transpose_b, dt, batch, m, n, k, final, s)
    target = final if final.is_contiguous else cm.empty(shape, dt, s)
    if k == 0:
        cm.memset(target, 0, s)
        if target is not final:
            _bit_copy(target, final, s)
        return final
    gdt = dt if (a.dtype == dt and b.dtype == dt) else _compute(dt)
    ca, stride_a = _gemm_operand(a, gdt, batch, s)
    cb, stride_b = _gemm_operand(b, gdt, batch, s)
    c = target if gdt == dt else cm.empty(shape, gdt, s)
    # Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: b is cuBLAS's A, m and n swap; each
    # leading dimension is the row length of the stored matrices (1 for a vector b, which is a column).
    lda = int(b.shape[-1]) if b.ndim >= 2 else 1
    ldb = int(a.shape[-1])
    try:
        gemm_strided_batched(cm.cublas_handle(s), Operation.T if transpose_b else Operation.N,
                             Operation.T if transpose_a else Operation.N, n, m, k, 1.0, cb.ptr, lda, stride_b,
                             ca.ptr, ldb, stride_a, 0.0, c.ptr, n, m * n, nbatch, a_dtype=gdt, b_dtype=gdt,
                             c_dtype=gdt, compute=_gemm_compute(gdt))
    except CublasError as exc:
        exc.add_context(op=op, a=f"{tuple(a.shape)} {a.dtype}", b=f"{tuple(b.shape)} {b.dtype}", dtype=str(dt))
        raise
    if c is not target:
        convert(c, dt, out=target, stream=s)
    if target is not final:
        _bit_copy(target, final, s)
    return final


def _gemm_operand(x: Any, gdt: np.dtype, batch: tuple, s) -> "tuple[Any, int]":
    """(``x`` contiguous in ``gdt``, its stride between batch matrices): 0 when it has no batch,
    the matrix size when its batch is the whole batch; otherwise materialised to the whole batch."""
    xc = _to_dtype(x, gdt, s)
    if x.ndim < 2:
        return xc, 0
    xb = tuple(int(v) for v in x.shape[:-2])
    msize = int(x.shape[-2]) * int(x.shape[-1])
    if math.prod(xb) == 1:
        return xc, 0
    if (1,) * (len(batch) - len(xb)) + xb == batch:
        return xc, msize
    full_shape = batch + tuple(int(v) for v in x.shape[-2:])
    res = cm.empty(full_shape, gdt, s)
    _bit_copy(xc, res, s)
    return res, msize


def _imatmul(a: Any, b: Any, transpose_a: bool, transpose_b: bool, dt: np.dtype, batch: tuple, m: int, n: int, k: int,
             final: Any, s) -> Any:
    target = final if final.is_contiguous else cm.empty(final.shape, dt, s)
    if k == 0:
        cm.memset(target, 0, s)
    else:
        ba, _, sta = _operand(a, transpose_a, True)
        bb, _, stb = _operand(b, transpose_b, False)
        nb = len(batch)

        def batch_strides(bshape, st):
            lead = nb - len(bshape)
            return [0] * lead + [0 if d == 1 else v for d, v in zip(bshape, st[:-2])]

        bshape, bstr = merge_axes(batch or (1,), [batch_strides(ba, sta) or [0], batch_strides(bb, stb) or [0]])
        maxd = _maxd(len(bshape))
        body = _body(("imm", a.dtype, b.dtype, dt, maxd), lambda: _imatmul_body(a.dtype, b.dtype, dt, maxd))
        nbatch = math.prod(batch)
        tiles = nbatch * -(-m // 16) * -(-n // 16)
        grid = max(1, min(tiles, cm._sm_count(s._device) * 32))
        _launch_grid(body, (grid, 1, 1), (16, 16, 1),
                     (_arg(a), _arg(b), _arg(target), cm.i64(m), cm.i64(n), cm.i64(k), cm.i64(sta[-2]),
                      cm.i64(sta[-1]), cm.i64(stb[-2]), cm.i64(stb[-1]), cm.i64(nbatch),
                      _geo(bshape, bstr, maxd, True)), s)
    if target is not final:
        _bit_copy(target, final, s)
    return final


# ------------------------------------------------------------------------------ gathers and scatters
# Out-of-range indices cannot raise on the device without a synchronisation: negative ones count from
# the end, and the rest are clamped into [0, n) (numeric.cuh's clamp_index).
_INDEX_DTYPES = (I8, U8, I16, U16, I32, U32, I64, U64)


def _unit_for(nbytes: int, *arrays: Any) -> int:
    """The widest of 16/8/4/2/1 bytes dividing ``nbytes`` (a row) and every array's address."""
    for u in (16, 8, 4, 2, 1):
        if nbytes % u == 0 and all(a is None or a.ptr % u == 0 for a in arrays):
            return u
    return 1


def _index_array(op: str, indices: Any, s) -> Any:
    if indices.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{op}: indices must be an integer array, got {indices.dtype}")
    return _contiguous(indices, s)


def _nd_geo_dtype(maxd: int = MAXD) -> np.dtype:
    return np.dtype([("k", "<i4"), ("pad", "<i4"), ("dim", "<i8", (maxd,)), ("stride", "<i8", (maxd,))])


def _nd_geo(dims: Sequence[int], strides: Sequence[int]) -> np.void:
    rec = np.zeros((), _nd_geo_dtype())
    rec["k"] = len(dims)
    for t, (d, st) in enumerate(zip(dims, strides)):
        rec["dim"][t] = d
        rec["stride"][t] = st
    return rec[()]


def _pos_loop(wide: bool) -> str:
    if wide:
        return "for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x)"
    return ("for (nx::u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < (nx::u32)total; "
            "i += gridDim.x * blockDim.x)")


def _div(wide: bool, n: str, fd: str, d: str) -> str:
    """``n / d`` in the kernel: 64-bit division, or FastDiv ``fd`` (32-bit positions)."""
    return f"({n} / {d})" if wide else f"(i64)nx::fdiv((nx::u32){n}, {fd})"


def _take_body(unit: int, it: np.dtype, wide: bool) -> _Body:
    name = f"nx_take_u{unit}_{_sfx(it)}_{'w' if wide else 's'}"
    ut = f"nx::Unit<{unit}>::t"
    text = f"""
extern "C" __global__ void {name}(const {ut}* __restrict__ x, const {_CTYPE[it]}* __restrict__ idx,
                                  {ut}* __restrict__ out, i64 total, i64 inner, i64 nidx, i64 n_axis,
                                  nx::u32 inner_mul, nx::u32 inner_shr, nx::u32 nidx_mul, nx::u32 nidx_shr) {{
    const nx::FastDiv fi = {{(nx::u32)inner, inner_mul, inner_shr}}, fj = {{(nx::u32)nidx, nidx_mul, nidx_shr}};
    (void)fi; (void)fj;
    {_pos_loop(wide)} {{
        const i64 t = {_div(wide, "i", "fi", "inner")}, k = (i64)i - t * inner;
        const i64 o = {_div(wide, "t", "fj", "nidx")}, j = t - o * nidx;
        out[i] = x[(o * n_axis + nx::clamp_index(idx[j], n_axis)) * inner + k];
    }}
}}
"""
    return _Body(name, text)


def _fd(d: int) -> tuple:
    """FastDiv's (mul, shr) kernel arguments for ``d`` (unused by the 64-bit kernels: zeros past 2**31)."""
    if d >= 2**31:
        return np.uint32(0), np.uint32(0)
    _, mul, shr = fast_divider(d)
    return np.uint32(mul), np.uint32(shr)


def take(x: Any, indices: Any, axis: "int | None" = None, *, out: Any = None, stream: Any = None) -> Any:
    """``numeric.take`` on the device (indices clamped into range)."""
    op = "take"
    s = cm.stream_of(stream)
    idx = _index_array(op, indices, s)
    xc = _contiguous(x, s)
    src_shape = (int(x.size),) if axis is None else tuple(int(v) for v in x.shape)
    ax = 0 if axis is None else int(axis)
    shape = src_shape[:ax] + tuple(int(v) for v in idx.shape) + src_shape[ax + 1:]
    final = cm.output(out, shape, x.dtype, s)
    if math.prod(shape) == 0:
        return final
    n_axis = src_shape[ax]
    if n_axis == 0:
        raise IndexError(f"{op}: cannot take from axis {ax} of size 0 (x {tuple(x.shape)}, indices "
                         f"{tuple(idx.shape)})")
    target = final if final.is_contiguous else cm.empty(shape, x.dtype, s)
    outer, inner = math.prod(src_shape[:ax]), math.prod(src_shape[ax + 1:])
    unit = _unit_for(inner * x.itemsize, xc, target)
    inner_u = inner * x.itemsize // unit
    nidx = int(idx.size)
    total = outer * nidx * inner_u
    wide = total >= 2**31
    body = _body(("take", unit, idx.dtype, wide), lambda: _take_body(unit, idx.dtype, wide))
    _launch(body, total, (_arg(xc), idx, _arg(target), cm.i64(total), cm.i64(inner_u), cm.i64(nidx), cm.i64(n_axis))
            + _fd(inner_u) + _fd(nidx), s)
    if target is not final:
        _bit_copy(target, final, s)
    return final


def _tal_body(unit: int, it: np.dtype, wide: bool, maxd: int) -> _Body:
    name = f"nx_tal_u{unit}_{_sfx(it)}_{'w' if wide else 's'}{maxd}"
    ut = f"nx::Unit<{unit}>::t"
    geo = f"nx::Geo64<2, {maxd}>" if wide else f"nx::Geo32<2, {maxd}>"
    off_t = "i64" if wide else "int"
    text = f"""
extern "C" __global__ void {name}(const {ut}* __restrict__ x, const {_CTYPE[it]}* __restrict__ idx,
                                  {ut}* __restrict__ out, i64 total, i64 ax_stride, i64 n_axis, {geo} g) {{
    {_pos_loop(wide)} {{
        {off_t} off[2];
        nx::offsets<2, {maxd}>(g, i, off);
        out[i] = x[(i64)off[1] + nx::clamp_index(idx[off[0]], n_axis) * ax_stride];
    }}
}}
"""
    return _Body(name, text)


def take_along_axis(x: Any, indices: Any, axis: int, *, out: Any = None, stream: Any = None) -> Any:
    """``numeric.take_along_axis`` on the device (indices and x broadcast on the other axes; clamped)."""
    op = "take_along_axis"
    s = cm.stream_of(stream)
    if indices.dtype not in _INDEX_DTYPES:
        raise TypeError(f"{op}: indices must be an integer array, got {indices.dtype}")
    ax = int(axis)
    other = [v for i, v in enumerate(x.shape) if i != ax]
    iother = [v for i, v in enumerate(indices.shape) if i != ax]
    bshape = _ref.broadcast_shapes(other, iother, op=op)
    shape = tuple(bshape[:ax]) + (int(indices.shape[ax]),) + tuple(bshape[ax:])
    final = cm.output(out, shape, x.dtype, s)
    if math.prod(shape) == 0:
        return final
    n_axis = int(x.shape[ax])
    if n_axis == 0:
        raise IndexError(f"{op}: cannot take from axis {ax} of size 0 (x {tuple(x.shape)}, indices "
                         f"{tuple(indices.shape)})")
    target = final if final.is_contiguous else cm.empty(shape, x.dtype, s)
    xe = _elem_strides(x)
    xs = [0 if (i == ax or (x.shape[i] == 1 and shape[i] != 1)) else xe[i] for i in range(x.ndim)]
    ist = _broadcast_strides(indices, shape)
    mshape, mstr = merge_axes(shape, [ist, xs])
    _check_rank(op, mshape, [x, indices])
    maxd = _maxd(len(mshape))
    total = math.prod(shape)
    wide = total >= 2**31 or not _fits32(mshape, mstr)
    unit = x.itemsize
    body = _body(("tal", unit, indices.dtype, wide, maxd), lambda: _tal_body(unit, indices.dtype, wide, maxd))
    _launch(body, total, (_arg(x), _arg(indices), _arg(target), cm.i64(total), cm.i64(xe[ax]), cm.i64(n_axis),
                          _geo(mshape, mstr, maxd, wide)), s)
    if target is not final:
        _bit_copy(target, final, s)
    return final


def _gnd_body(unit: int, it: np.dtype, wide: bool) -> _Body:
    name = f"nx_gnd_u{unit}_{_sfx(it)}_{'w' if wide else 's'}"
    ut = f"nx::Unit<{unit}>::t"
    text = f"""
extern "C" __global__ void {name}(const {ut}* __restrict__ x, const {_CTYPE[it]}* __restrict__ idx,
                                  {ut}* __restrict__ out, i64 total, i64 inner, nx::u32 inner_mul, nx::u32 inner_shr,
                                  nx::NdGeo g) {{
    const nx::FastDiv fi = {{(nx::u32)inner, inner_mul, inner_shr}};
    (void)fi;
    {_pos_loop(wide)} {{
        const i64 j = {_div(wide, "i", "fi", "inner")}, k = (i64)i - j * inner;
        out[i] = x[k + nx::nd_offset(g, idx + j * g.k)];
    }}
}}
"""
    return _Body(name, text)


def gather_nd(x: Any, indices: Any, *, out: Any = None, stream: Any = None) -> Any:
    """``numeric.gather_nd`` on the device (each index clamped into its axis)."""
    op = "gather_nd"
    s = cm.stream_of(stream)
    idx = _index_array(op, indices, s)
    xc = _contiguous(x, s)
    kdim = int(idx.shape[-1])
    shape = tuple(int(v) for v in idx.shape[:-1]) + tuple(int(v) for v in x.shape[kdim:])
    final = cm.output(out, shape, x.dtype, s)
    if math.prod(shape) == 0:
        return final
    if any(int(x.shape[t]) == 0 for t in range(kdim)):
        raise IndexError(f"{op}: cannot gather from an empty axis (x {tuple(x.shape)}, indices {tuple(idx.shape)})")
    if kdim > MAXD:
        raise ValueError(f"{op}: indices index {kdim} axes; the device kernel takes at most {MAXD}")
    target = final if final.is_contiguous else cm.empty(shape, x.dtype, s)
    inner = math.prod(int(v) for v in x.shape[kdim:])
    unit = _unit_for(inner * x.itemsize, xc, target)
    inner_u = inner * x.itemsize // unit
    row_units = _c_strides(x.shape)
    strides = [row_units[t] * x.itemsize // unit for t in range(kdim)]
    total = math.prod(int(v) for v in idx.shape[:-1]) * inner_u
    wide = total >= 2**31
    body = _body(("gnd", unit, idx.dtype, wide), lambda: _gnd_body(unit, idx.dtype, wide))
    _launch(body, total, (_arg(xc), idx, _arg(target), cm.i64(total), cm.i64(inner_u)) + _fd(inner_u)
            + (_nd_geo([int(v) for v in x.shape[:kdim]], strides),), s)
    if target is not final:
        _bit_copy(target, final, s)
    return final


def _accumulator(xdt: np.dtype) -> "tuple[np.dtype, np.dtype]":
    """(the reference's accumulation dtype, the dtype the device adds in with atomics) for x's dtype."""
    acc = F32 if xdt in _LOW else xdt
    if xdt in _NATIVE_ATOMIC:
        return acc, xdt
    if xdt in _LOW:
        return acc, F32
    return acc, (U32 if xdt.kind == "u" else I32)


def _scatter_body(kind: str, tu: "np.dtype | None", acc: np.dtype, scr: np.dtype, it: np.dtype, wide: bool) -> _Body:
    """kind: "iadd" (index_add's (outer, nidx, inner) layout), "add"/"set" (scatter_nd's (M, inner))."""
    name = (f"nx_sc_{kind}_{_sfx(tu) if tu is not None else 'k'}_{_sfx(acc)}_{_sfx(scr)}_{_sfx(it)}_"
            f"{'w' if wide else 's'}")
    value = (f"nx::cvt<{_CTYPE[acc]}>(upd[i])" if tu is not None
             else f"nx::bitcast<{_CTYPE[acc]}>(sval)")
    upd_t = _CTYPE[tu] if tu is not None else "nx::u8"
    write = (f"res[target] = nx::cvt<{_CTYPE[scr]}>(v);" if kind == "set"
             else f"nx::atomic_add(res + target, nx::cvt<{_CTYPE[scr]}>(v));")
    if kind == "iadd":
        locate = f"""const i64 t = {_div(wide, "i", "fi", "inner")}, k = (i64)i - t * inner;
        const i64 o = {_div(wide, "t", "fj", "nidx")}, j = t - o * nidx;
        const i64 target = (o * n_axis + nx::clamp_index(idx[j], n_axis)) * inner + k;"""
        extra = "i64 nidx, i64 n_axis, nx::u32 nidx_mul, nx::u32 nidx_shr"
        setup = "const nx::FastDiv fj = {(nx::u32)nidx, nidx_mul, nidx_shr}; (void)fj;"
    else:
        locate = f"""const i64 j = {_div(wide, "i", "fi", "inner")}, k = (i64)i - j * inner;
        const i64 target = k + nx::nd_offset(g, idx + j * g.k);"""
        extra = "nx::NdGeo g"
        setup = ""
    text = f"""
extern "C" __global__ void {name}(const {upd_t}* __restrict__ upd, nx::Unit<{acc.itemsize}>::t sval,
                                  {_CTYPE[scr]}* __restrict__ res, const {_CTYPE[it]}* __restrict__ idx, i64 total,
                                  i64 inner, nx::u32 inner_mul, nx::u32 inner_shr, {extra}) {{
    const nx::FastDiv fi = {{(nx::u32)inner, inner_mul, inner_shr}};
    (void)fi; (void)upd; (void)sval;
    {setup}
    {_pos_loop(wide)} {{
        {locate}
        const {_CTYPE[acc]} v = {value};
        {write}
    }}
}}
"""
    return _Body(name, text)


def _scatter_start(x: Any, scr: np.dtype, acc: np.dtype, s) -> Any:
    """The array the scatter writes into: a copy of x, or x in the atomic scratch type."""
    if scr == x.dtype:
        res = cm.empty(x.shape, x.dtype, s)
        if x.is_contiguous:
            cm.memcpy(res, x, s)
        else:
            _bit_copy(x, res, s)
        return res
    res = cm.empty(x.shape, scr, s)
    return _elementwise("cvt2", "v0", [_array_in(x, scr, acc)], res, s, op="scatter")


def index_add(x: Any, indices: Any, updates: Any, axis: int = 0, *, stream: Any = None) -> Any:
    """``numeric.index_add`` on the device: atomic adds (float32 scratch for float16/bfloat16, int32 for
    8/16-bit ints and bool, then one conversion back), so the order of duplicate additions is not fixed."""
    op = "index_add"
    s = cm.stream_of(stream)
    idx = _index_array(op, indices, s)
    ax = int(axis)
    acc, scr = _accumulator(x.dtype)
    res = _scatter_start(x, scr, acc, s)
    n_axis = int(x.shape[ax])
    outer, inner = math.prod(int(v) for v in x.shape[:ax]), math.prod(int(v) for v in x.shape[ax + 1:])
    nidx = int(idx.size)
    total = outer * nidx * inner
    if total:
        if n_axis == 0:
            raise IndexError(f"{op}: cannot add into axis {ax} of size 0 (x {tuple(x.shape)}, indices "
                             f"{tuple(idx.shape)})")
        upd = _contiguous(updates, s)
        wide = total >= 2**31
        body = _body(("sc", "iadd", upd.dtype, acc, scr, idx.dtype, wide),
                     lambda: _scatter_body("iadd", upd.dtype, acc, scr, idx.dtype, wide))
        _launch(body, total, (upd, _bits(0, _UNIT_DTYPE[acc.itemsize]), res, idx, cm.i64(total), cm.i64(inner))
                + _fd(inner) + (cm.i64(nidx), cm.i64(n_axis)) + _fd(nidx), s)
    if scr != x.dtype:
        res = convert(res, x.dtype, stream=s)
    return res


def scatter_nd(x: Any, indices: Any, updates: Any, *, mode: str = "add", stream: Any = None) -> Any:
    """``numeric.scatter_nd`` on the device: ``"add"`` by atomics as :func:`index_add`; ``"set"`` by plain
    stores (with duplicate indices, which write wins is unspecified)."""
    op = "scatter_nd"
    s = cm.stream_of(stream)
    idx = _index_array(op, indices, s)
    kdim = int(idx.shape[-1])
    if kdim > MAXD:
        raise ValueError(f"{op}: indices index {kdim} axes; the device kernel takes at most {MAXD}")
    acc, scr = _accumulator(x.dtype)
    if mode == "set":
        scr = x.dtype
    res = _scatter_start(x, scr, acc, s)
    want = tuple(int(v) for v in idx.shape[:-1]) + tuple(int(v) for v in x.shape[kdim:])
    inner = math.prod(int(v) for v in x.shape[kdim:])
    total = math.prod(want)
    if total:
        if any(int(x.shape[t]) == 0 for t in range(kdim)):
            raise IndexError(f"{op}: cannot scatter into an empty axis (x {tuple(x.shape)}, indices "
                             f"{tuple(idx.shape)})")
        if hasattr(updates, "shape"):
            if tuple(updates.shape) == want and updates.is_contiguous:
                upd = updates
            else:
                upd = _bit_copy(updates, cm.empty(want, updates.dtype, s), s)
            tu, sval = upd.dtype, _bits(0, _UNIT_DTYPE[acc.itemsize])
        else:
            upd, tu = None, None
            with np.errstate(all="ignore"):
                sval = _bits(np.asarray(updates).astype(acc), acc)
        wide = total >= 2**31
        strides = list(_c_strides(x.shape)[:kdim])
        body = _body(("sc", mode, tu, acc, scr, idx.dtype, wide),
                     lambda: _scatter_body(mode, tu, acc, scr, idx.dtype, wide))
        _launch(body, total, (_arg(upd), sval, res, idx, cm.i64(total), cm.i64(inner)) + _fd(inner)
                + (_nd_geo([int(v) for v in x.shape[:kdim]], strides),), s)
    if scr != x.dtype:
        res = convert(res, x.dtype, stream=s)
    return res


# ------------------------------------------------------------------------------------------ padding
def _pad_geo_dtype(maxd: int, wide: bool) -> np.dtype:
    if wide:
        return np.dtype([("ndim", "<i4"), ("pad", "<i4"), ("dim", "<i8", (maxd,)), ("n", "<i8", (maxd,)),
                         ("lo", "<i8", (maxd,)), ("stride", "<i8", (maxd,))])
    return np.dtype([("ndim", "<i4"), ("dim", "<u4", (maxd, 3)), ("n", "<i4", (maxd,)), ("lo", "<i4", (maxd,)),
                     ("stride", "<i4", (maxd,))])


def _pad_body(unit: int, mode: str, wide: bool, maxd: int) -> _Body:
    name = f"nx_pad_u{unit}_{mode}_{'w' if wide else 's'}{maxd}"
    ut = f"nx::Unit<{unit}>::t"
    geo = f"nx::PadGeo64<{maxd}>" if wide else f"nx::PadGeo32<{maxd}>"
    text = f"""
extern "C" __global__ void {name}(const {ut}* __restrict__ x, {ut}* __restrict__ out, i64 total, {ut} value,
                                  {geo} g) {{
    (void)value;
    {_pos_loop(wide)} {{
        i64 src;
        const bool inside = nx::pad_source<{PAD_MODES[mode]}, {maxd}>(g, i, &src);
        out[i] = inside ? x[src] : value;
    }}
}}
"""
    return _Body(name, text)


def pad(x: Any, pad_width: Sequence[Sequence[int]], *, mode: str = "constant", constant_value: float = 0.0,
        out: Any = None, stream: Any = None) -> Any:
    """``numeric.pad`` on the device: one thread per output element maps its coordinates to the source
    (constant: outside -> the value; edge: clamp; reflect/symmetric/wrap: periodic, as NumPy for any width)."""
    op = "pad"
    s = cm.stream_of(stream)
    widths = [(int(lo), int(hi)) for lo, hi in pad_width]
    shape = tuple(int(n) + lo + hi for (lo, hi), n in zip(widths, x.shape))
    final = cm.output(out, shape, x.dtype, s)
    total = math.prod(shape)
    if total == 0:
        return final
    with np.errstate(all="ignore"):
        raw = np.asarray(constant_value).astype(x.dtype)
    if x.size == 0:  # only "constant" pads an empty axis: every element is the value
        return _fill_into(final, raw, s)
    target = final if final.is_contiguous else cm.empty(shape, x.dtype, s)
    xc = _contiguous(x, s)
    # merge runs of unpadded axes (extents of 1 without padding drop out)
    dims: list = []
    for (lo, hi), n, st in zip(widths, (int(v) for v in x.shape), _c_strides(x.shape)):
        if n == 1 and lo == 0 and hi == 0:
            continue
        if dims and lo == 0 and hi == 0 and dims[-1][1] == 0 and dims[-1][2] == 0:
            prev = dims[-1]
            dims[-1] = (prev[0] * n, 0, 0, st)
        else:
            dims.append((n, lo, hi, st))
    if not dims:
        dims = [(1, 0, 0, 1)]
    if len(dims) > MAXD:
        raise ValueError(f"{op}: {len(dims)} axes remain after merging (x {tuple(x.shape)}); the device kernel "
                         f"takes at most {MAXD}")
    maxd = _maxd(len(dims))
    wide = total >= 2**31 or int(x.size) >= 2**31
    rec = np.zeros((), _pad_geo_dtype(maxd, wide))
    rec["ndim"] = len(dims)
    for d, (n, lo, hi, st) in enumerate(dims):
        rec["dim"][d] = (n + lo + hi) if wide else fast_divider(n + lo + hi)
        rec["n"][d], rec["lo"][d], rec["stride"][d] = n, lo, st
    unit = x.itemsize
    body = _body(("pad", unit, mode, wide, maxd), lambda: _pad_body(unit, mode, wide, maxd))
    _launch(body, total, (_arg(xc), _arg(target), cm.i64(total), _bits(raw, x.dtype), rec[()]), s)
    if target is not final:
        _bit_copy(target, final, s)
    return final


def _fill_into(res: Any, raw: np.ndarray, s) -> Any:
    unit = _UNIT_DTYPE[res.itemsize]
    _elementwise("copy", "v0", [_In(None, _bits(raw, res.dtype), None, None, unit)], _View.of(res, unit), s, op="fill")
    return res


# ------------------------------------------------------------------------------------------ sorting
def _key_bytes(dt: np.dtype) -> int:
    return 8 if dt.itemsize == 8 else 4


def _sort_block_body(t: np.dtype, io: np.dtype) -> _Body:
    name = f"nx_sortb_{_sfx(t)}_{_sfx(io)}"
    T, K = _CTYPE[t], ("u64" if _key_bytes(t) == 8 else "nx::u32")
    text = f"""
extern "C" __global__ void {name}(const {T}* __restrict__ x, {T}* __restrict__ vals, {_CTYPE[io]}* __restrict__ idxo,
                                  i64 rows, int len, int npow2, int desc_key, int reverse_out, int kout) {{
    extern __shared__ __align__(16) unsigned char smem[];
    {K}* keys = ({K}*)smem;
    int* idx = (int*)(keys + npow2);
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {{
        const {T}* xr = x + row * len;
        for (int i = threadIdx.x; i < npow2; i += blockDim.x) {{
            if (i < len) {{ keys[i] = nx::sort_key(xr[i], desc_key != 0); idx[i] = i; }}
            else {{ keys[i] = ({K})~({K})0; idx[i] = 0x7fffffff; }}
        }}
        __syncthreads();
        nx::bitonic(keys, idx, npow2);
        for (int r = threadIdx.x; r < kout; r += blockDim.x) {{
            const int j = idx[reverse_out ? len - 1 - r : r];
            if (vals) vals[row * kout + r] = xr[j];
            if (idxo) idxo[row * kout + r] = nx::cvt<{_CTYPE[io]}>(j);
        }}
        __syncthreads();
    }}
}}
"""
    return _Body(name, text)


def _sort_chunk_body(t: np.dtype) -> _Body:
    name = f"nx_sortc_{_sfx(t)}"
    T, K = _CTYPE[t], ("u64" if _key_bytes(t) == 8 else "nx::u32")
    text = f"""
extern "C" __global__ void {name}(const {T}* __restrict__ x, {K}* __restrict__ keys_out, int* __restrict__ idx_out,
                                  i64 rows, i64 len, int chunk, i64 nchunks, int npow2, int desc_key) {{
    extern __shared__ __align__(16) unsigned char smem[];
    {K}* keys = ({K}*)smem;
    int* idx = (int*)(keys + npow2);
    for (i64 job = blockIdx.x; job < rows * nchunks; job += gridDim.x) {{
        const i64 row = job / nchunks, c = job - row * nchunks, start = c * chunk;
        const int m = (int)(len - start < chunk ? len - start : chunk);
        const {T}* xr = x + row * len + start;
        for (int i = threadIdx.x; i < npow2; i += blockDim.x) {{
            if (i < m) {{ keys[i] = nx::sort_key(xr[i], desc_key != 0); idx[i] = (int)(start + i); }}
            else {{ keys[i] = ({K})~({K})0; idx[i] = 0x7fffffff; }}
        }}
        __syncthreads();
        nx::bitonic(keys, idx, npow2);
        for (int r = threadIdx.x; r < m; r += blockDim.x) {{
            keys_out[row * len + start + r] = keys[r];
            idx_out[row * len + start + r] = idx[r];
        }}
        __syncthreads();
    }}
}}
"""
    return _Body(name, text)


def _sort_merge_body(kbytes: int) -> _Body:
    name = f"nx_sortm_k{kbytes}"
    K = "u64" if kbytes == 8 else "nx::u32"
    text = f"""
extern "C" __global__ void {name}(const {K}* __restrict__ kin, const int* __restrict__ iin, {K}* __restrict__ kout,
                                  int* __restrict__ iout, i64 rows, i64 len, i64 width) {{
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < rows * len; e += (i64)gridDim.x * blockDim.x) {{
        const i64 row = e / len, p = e - row * len, run = p / width, start = run * width;
        const {K}* kr = kin + row * len;
        const int* ir = iin + row * len;
        const {K} key = kr[p];
        const int id = ir[p];
        i64 pos = p;
        // the other run of the pair, and how many of its (key, index) pairs come before this one
        i64 lo, hi, base;
        if ((run & 1) == 0) {{ lo = start + width; hi = start + 2 * width < len ? start + 2 * width : len; base = p; }}
        else {{ lo = start - width; hi = start; base = lo + (p - start); }}
        if (lo < len) {{
            const i64 first = lo;
            while (lo < hi) {{
                const i64 mid = (lo + hi) >> 1;
                if (nx::key_less(kr[mid], ir[mid], key, id)) lo = mid + 1; else hi = mid;
            }}
            pos = base + (lo - first);
        }}
        kout[row * len + pos] = key;
        iout[row * len + pos] = id;
    }}
}}
"""
    return _Body(name, text)


def _sort_out_body(t: np.dtype, io: np.dtype) -> _Body:
    name = f"nx_sorto_{_sfx(t)}_{_sfx(io)}"
    T = _CTYPE[t]
    text = f"""
extern "C" __global__ void {name}(const {T}* __restrict__ x, const int* __restrict__ iin, {T}* __restrict__ vals,
                                  {_CTYPE[io]}* __restrict__ idxo, i64 rows, i64 len, i64 kout, int reverse_out) {{
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < rows * kout; e += (i64)gridDim.x * blockDim.x) {{
        const i64 row = e / kout, r = e - row * kout;
        const int j = iin[row * len + (reverse_out ? len - 1 - r : r)];
        if (vals) vals[e] = x[row * len + j];
        if (idxo) idxo[e] = nx::cvt<{_CTYPE[io]}>(j);
    }}
}}
"""
    return _Body(name, text)


def _sort_rows(op: str, xr: Any, rows: int, length: int, desc_key: bool, reverse_out: bool, kout: int,
               vals: Any, idxo: Any, io: np.dtype, s) -> None:
    """Sort each row of contiguous ``xr`` (rows, length); write the first ``kout`` of the order (reversed
    when ``reverse_out``) as values into ``vals`` and/or indices into ``idxo`` (either may be None)."""
    if rows == 0 or kout == 0:
        return
    if length >= 2**31 - 1:
        raise ValueError(f"{op}: rows of {length} elements exceed the device limit of 2**31 - 2")
    t = xr.dtype
    kb = _key_bytes(t)
    cap = cm._sm_count(s._device) * 8
    if length <= SORT_BLOCK_MAX:
        npow2 = 1 << max(0, (length - 1).bit_length())
        threads = min(1024, max(32, npow2))
        body = _body(("sortb", t, io), lambda: _sort_block_body(t, io))
        _launch_grid(body, (max(1, min(rows, cap)), 1, 1), (threads, 1, 1),
                     (_arg(xr), _arg(vals), _arg(idxo), cm.i64(rows), cm.i32(length), cm.i32(npow2),
                      cm.i32(desc_key), cm.i32(reverse_out), cm.i32(kout)), s, shared=npow2 * (kb + 4))
        return
    chunk = SORT_BLOCK_MAX
    nchunks = -(-length // chunk)
    key_dt = U64 if kb == 8 else U32
    keys = [cm.empty((rows * length,), key_dt, s), cm.empty((rows * length,), key_dt, s)]
    idxs = [cm.empty((rows * length,), I32, s), cm.empty((rows * length,), I32, s)]
    body = _body(("sortc", t), lambda: _sort_chunk_body(t))
    _launch_grid(body, (max(1, min(rows * nchunks, cap)), 1, 1), (1024, 1, 1),
                 (_arg(xr), keys[0], idxs[0], cm.i64(rows), cm.i64(length), cm.i32(chunk), cm.i64(nchunks),
                  cm.i32(chunk), cm.i32(desc_key)), s, shared=chunk * (kb + 4))
    merge = _body(("sortm", kb), lambda: _sort_merge_body(kb))
    cur, width = 0, chunk
    while width < length:
        _launch(merge, rows * length, (keys[cur], idxs[cur], keys[1 - cur], idxs[1 - cur], cm.i64(rows),
                                       cm.i64(length), cm.i64(width)), s)
        cur, width = 1 - cur, width * 2
    outb = _body(("sorto", t, io), lambda: _sort_out_body(t, io))
    _launch(outb, rows * kout, (_arg(xr), idxs[cur], _arg(vals), _arg(idxo), cm.i64(rows), cm.i64(length),
                                cm.i64(kout), cm.i32(reverse_out)), s)


def _rows_last(x: Any, axis: int, s) -> "tuple[Any, tuple]":
    """``x`` contiguous with ``axis`` moved last (a copy when needed), and the permutation used."""
    order = tuple(i for i in range(x.ndim) if i != axis) + (axis,)
    if axis == x.ndim - 1:
        return _contiguous(x, s), order
    elem = _elem_strides(x)
    pshape = tuple(int(x.shape[i]) for i in order)
    tmp = cm.empty(pshape, x.dtype, s)
    _copy_view(_View(x, x.ptr, pshape, tuple(elem[i] for i in order), x.dtype), tmp, s)
    return tmp, order


def _sorted_into(op: str, x: Any, axis: int, desc_key: bool, reverse_out: bool, want_vals: bool, io: np.dtype,
                 final: Any, s) -> Any:
    """Sort along ``axis`` into ``final`` (values of x's dtype, or indices of ``io``), any layout of final."""
    if x.size == 0:
        return final
    xr, order = _rows_last(x, axis, s)
    length = int(x.shape[axis])
    rows = int(x.size) // length
    direct = axis == x.ndim - 1 and final.is_contiguous
    res = final if direct else cm.empty(xr.shape, final.dtype, s)
    _sort_rows(op, xr, rows, length, desc_key, reverse_out, length, res if want_vals else None,
               None if want_vals else res, io, s)
    if not direct:
        # res is laid out in `order`; final[..] = res permuted back
        rst = _c_strides(xr.shape)
        back = [0] * x.ndim
        for j, i in enumerate(order):
            back[i] = rst[j]
        src = _View(res, res.ptr, tuple(x.shape), back, final.dtype)
        if final.is_contiguous:
            _copy_view(src, final, s)
        else:
            _bit_copy(src, final, s)
    return final


def sort(x: Any, axis: int = -1, *, descending: bool = False, out: Any = None, stream: Any = None) -> Any:
    """``numeric.sort`` on the device: a stable ascending sort of (key, index) pairs; descending writes it
    reversed (NaN first), as the reference's sort-then-flip."""
    s = cm.stream_of(stream)
    final = cm.output(out, x.shape, x.dtype, s)
    return _sorted_into("sort", x, int(axis), False, bool(descending), True, I32, final, s)


def argsort(x: Any, axis: int = -1, *, descending: bool = False, dtype: Any = None, out: Any = None,
            stream: Any = None) -> Any:
    """``numeric.argsort`` on the device: stable; descending sorts by -x with NaN as +inf's equal (ties and
    NaN in increasing index order), as the reference."""
    s = cm.stream_of(stream)
    dt = I32 if dtype is None else np.dtype(dtype)
    final = cm.output(out, x.shape, dt, s)
    return _sorted_into("argsort", x, int(axis), bool(descending), False, False, dt, final, s)


def top_k(x: Any, k: int, *, stream: Any = None) -> "tuple[Any, Any]":
    """``numeric.top_k`` on the device: the first ``k`` of the descending argsort order, and their values."""
    s = cm.stream_of(stream)
    k = int(k)
    shape = tuple(int(v) for v in x.shape[:-1]) + (k,)
    vals, idx = cm.empty(shape, x.dtype, s), cm.empty(shape, I32, s)
    if math.prod(shape) == 0:
        return vals, idx
    xr = _contiguous(x, s)
    length = int(x.shape[-1])
    rows = int(x.size) // length
    _sort_rows("top_k", xr, rows, length, True, False, k, vals, idx, I32, s)
    return vals, idx


# ------------------------------------------------------------------------------------------- random
_MASK64 = (1 << 64) - 1


def _f32_bits(v: float) -> str:
    return f"__int_as_float(0x{int(np.float32(v).view(np.uint32)):08x})"


def _random_body(kind: str, to: np.dtype) -> _Body:
    name = f"nx_rand_{kind}_{_sfx(to)}"
    T = _CTYPE[to]
    if kind == "bits":
        per, emit = 4, "out[i] = w[e];"
    elif kind == "uniform":
        per, emit = 4, f"out[i] = nx::cvt<{T}>(nx::uniform01(w[e]) * (p1 - p0) + p0);"
    elif kind == "truncated_normal":
        lo = math.erf(-2.0 / math.sqrt(2.0))
        per = 4
        emit = (f"const float t = {_f32_bits(lo)} + nx::uniform01(w[e]) * {_f32_bits(-2.0 * lo)};\n"
                f"                const float z = {_f32_bits(math.sqrt(2.0))} * (float)nx::erfinv_giles((double)t);\n"
                f"                out[i] = nx::cvt<{T}>(nx::np_minimum(nx::np_maximum(z, -2.0f), 2.0f) * p1 + p0);")
    else:
        per = 2
        emit = (f"const float u1 = nx::uniform01(w[2 * e]) + {_f32_bits(2.0 ** -25)};\n"
                f"                const float u2 = nx::uniform01(w[2 * e + 1]);\n"
                f"                const float z = sqrtf(-2.0f * logf(u1)) * cosf({_f32_bits(2 * np.pi)} * u2);\n"
                f"                out[i] = nx::cvt<{T}>(z * p1 + p0);")
    text = f"""
extern "C" __global__ void {name}({T}* __restrict__ out, i64 n, u64 key, u64 counter, const u64* counter_ptr,
                                  float p0, float p1) {{
    (void)p0; (void)p1;
    const u64 c0 = counter_ptr ? *counter_ptr : counter;
    const i64 blocks = (n + {per - 1}) / {per};
    for (i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x; j < blocks; j += (i64)gridDim.x * blockDim.x) {{
        const u64 c = c0 + (u64)j;
        nx::u32 w[4] = {{(nx::u32)c, (nx::u32)(c >> 32), 0u, 0u}};
        nx::philox10(w, (nx::u32)key, (nx::u32)(key >> 32));
#pragma unroll
        for (int e = 0; e < {per}; ++e) {{
            const i64 i = j * {per} + e;
            if (i < n) {{
                {emit}
            }}
        }}
    }}
}}
"""
    return _Body(name, text)


def random(kind: str, shape: Sequence[int], key: int, counter: Any, dtype: Any, *, p0: float = 0.0, p1: float = 1.0,
           device: Any = None, stream: Any = None) -> Any:
    """``numeric.random`` on the device: Philox4x32-10 words as the reference maps them; ``counter`` an int
    (a kernel parameter) or a 0-d uint64 DeviceArray the kernel reads, so a replayed graph sees its value."""
    op = "random"
    dt = U32 if kind == "bits" else np.dtype(dtype)
    if isinstance(counter, DeviceArray):
        if counter.shape != () or counter.dtype != U64:
            raise TypeError(f"{op}: a device counter must be a 0-d uint64 array, got shape {tuple(counter.shape)} "
                            f"and dtype {counter.dtype}")
        s = cm.stream_of(stream) if stream is not None else current_stream(counter.device_index)
        if s.device_index != counter.device_index:
            raise ValueError(f"{op}: the counter is on cuda:{counter.device_index} but the stream on "
                             f"cuda:{s.device_index}")
        cval, cptr = 0, counter
    elif hasattr(counter, "shape"):
        raise TypeError(f"{op}: counter must be an int or a 0-d uint64 DeviceArray, got {type(counter).__name__}")
    else:
        s = _stream_for(stream, device)
        cval, cptr = int(counter) & _MASK64, None
    res = cm.empty(tuple(int(v) for v in shape), dt, s)
    n = int(res.size)
    if n == 0:
        return res
    body = _body(("rand", kind, dt), lambda: _random_body(kind, dt))
    per = 2 if kind == "normal" else 4
    _launch(body, -(-n // per), (res, cm.i64(n), cm.u64(int(key) & _MASK64), cm.u64(cval), cptr,
                                 np.float32(p0), np.float32(p1)), s)
    return res


def _advance_body() -> _Body:
    name = "nx_advance_counter"
    text = f"""
extern "C" __global__ void {name}(u64* counter, u64 amount) {{
    if (blockIdx.x == 0 && threadIdx.x == 0) *counter += amount;
}}
"""
    return _Body(name, text)


def advance_counter(counter: Any, amount: int, *, stream: Any = None) -> Any:
    """``counter += amount`` (mod 2**64) by one device thread, stream-ordered; returns ``counter``."""
    s = cm.stream_of(stream) if stream is not None else current_stream(counter.device_index)
    body = _body(("advance",), _advance_body)
    _launch_grid(body, (1, 1, 1), (1, 1, 1), (counter, cm.u64(int(amount) & _MASK64)), s)
    return counter


# ------------------------------------------------------------------------- the kernels, enumerated
def _unary_expr(op: str, xdt: np.dtype, dt: np.dtype) -> "tuple[str, tuple] | None":
    c, mid, fn = _unary_types(op, xdt, dt)
    if op in _INTEGER_ONLY and _is_float(c):
        return None
    return f"{fn}<{_CTYPE[c]}>(v0, p0, p1)", ((xdt, mid, c),)


def kernel_bodies(exhaustive: bool = True) -> "list[_Body]":
    """Every kernel this module generates: each table op for every operand dtype (with the default result
    dtype, plus the conversion paths of other result dtypes), every conversion and copy, every variant
    (contiguous, 32- and 64-bit strided, each rank bucket) of representative ops, every reduction, scan,
    gather, scatter, padding, sort, random and matmul kernel. ``exhaustive=False``: a few of each (kernel
    family, variant), spread over the ops and dtypes, for the fast compile test."""
    bodies = _all_bodies()
    if exhaustive:
        return bodies
    groups: "dict[tuple, list[_Body]]" = {}
    for b in bodies:
        family = re.match(r"nx_(ew_[a-z]+|[a-z]+)", b.name).group(1)
        variant = tuple(b.name.rsplit("_", 2)[-2:]) if family.startswith("ew") else b.name.rsplit("_", 1)[-1]
        groups.setdefault((family, variant), []).append(b)
    picked = []
    for members in groups.values():
        step = max(1, len(members) // 2)
        picked += members[::step][:2]
    return picked


def _all_bodies() -> "list[_Body]":
    out: "dict[str, _Body]" = {}

    def add(b: _Body) -> None:
        out.setdefault(b.name, b)

    kinds = DTYPES
    ops_u, ops_b = list(UNARY), list(BINARY)
    # unary: (x dtype, default result) for every dtype; int/bool x with a float result (rounded to it first)
    for op in ops_u:
        pairs = [(x, BOOL if op in _BOOL_RESULT else x) for x in kinds] + [(I32, F16), (BOOL, F32), (I64, BF16)]
        for xdt, dt in pairs:
            e = _unary_expr(op, xdt, dt)
            if e is not None:
                add(_ew_body("un_" + op, e[0], e[1], dt, "s", 0, 4))
                add(_ew_body("un_" + op, e[0], e[1], dt, "c", 16 // max(xdt.itemsize, dt.itemsize), 0))
    for op in ops_b:
        for dt_in in kinds:
            dt = BOOL if op in _BOOL_RESULT else dt_in
            work = _compute(F32 if dt_in in _LOW else dt_in) if dt == BOOL else _compute(dt)
            if op in _INTEGER_ONLY and _is_float(work):
                continue
            expr = f"{BINARY[op]}<{_CTYPE[work]}>(v0, v1)"
            add(_ew_body("bin_" + op, expr, ((dt_in, None, work), (dt_in, None, work)), dt, "s", 0, 4))
            add(_ew_body("bin_" + op, expr, ((dt_in, None, work), (dt_in, None, work)), dt, "c",
                         16 // max(dt_in.itemsize, dt.itemsize), 0))
            if dt_in in (F32, I32):
                add(_ew_body("bin_" + op, expr, ((dt_in, None, work), (None, None, work)), dt, "c", 16 // max(
                    dt_in.itemsize, dt.itemsize), 0))
    # every variant and rank bucket, on three ops
    for variant, maxd in (("c", 0), ("s", 4), ("s", 8), ("s", 16), ("w", 4), ("w", 8), ("w", 16)):
        add(_ew_body("bin_add", "nx::bin_add<float>(v0, v1)", ((F16, None, F32), (BF16, None, F32)), F16, variant,
                     8, maxd))
        add(_ew_body("un_exp", "nx::un_exp<double>(v0, p0, p1)", ((F64, None, F64),), F64, variant, 2, maxd))
        add(_ew_body("where", "v0.v ? v1 : v2", ((BOOL, None, BOOL), (F32, None, F32), (None, None, F32)), F32,
                     variant, 4, maxd))
    for dt in kinds:
        for cond in (BOOL, F32, U8):
            add(_ew_body("where", "v0.v ? v1 : v2", ((cond, None, BOOL), (dt, None, dt), (dt, None, dt)), dt, "s",
                         0, 4))
        add(_ew_body("where", "v0.v ? v1 : v2", ((BOOL, None, BOOL), (None, None, dt), (dt, None, dt)), dt, "c",
                     16 // dt.itemsize, 0))
    # conversions (every pair) and bit copies / fills (every unit, every variant)
    for src in kinds:
        for dst in kinds:
            if src != dst:
                add(_ew_body("cvt", "v0", ((src, None, dst),), dst, "c", 16 // max(src.itemsize, dst.itemsize), 0))
                add(_ew_body("cvt", "v0", ((src, None, dst),), dst, "s", 0, 4))
    for acc_x in kinds:
        acc, scr = _accumulator(acc_x)
        if scr != acc_x:
            add(_ew_body("cvt2", "v0", ((acc_x, acc, scr),), scr, "c", 16 // max(acc_x.itemsize, scr.itemsize), 0))
    for unit in (U8, U16, U32, U64):
        for variant, vw, maxd in (("c", 16 // unit.itemsize, 0), ("s", 0, 4), ("s", 0, 8), ("s", 0, 16), ("w", 0, 4),
                                  ("w", 0, 16)):
            add(_ew_body("copy", "v0", ((unit, None, unit),), unit, variant, vw, maxd))
            add(_ew_body("copy", "v0", ((None, None, unit),), unit, variant, vw, maxd))
        for maxd in (4, 8, 16):
            add(_transpose_body(unit.itemsize, maxd))
    for dt in kinds:
        add(_iota_body(dt, dt.kind in "iub"))
    # reductions: every op and dtype, every variant, both passes
    for op in REDUCTIONS:
        for xdt in kinds:
            dt = BOOL if op in ("any", "all") else (I32 if op in ("argmax", "argmin") else xdt)
            reducer, acc = _reduce_types(op, xdt, dt)
            tag = f"{op}_{_sfx(xdt)}_{_sfx(acc)}_{_sfx(dt)}"
            vw = 16 // xdt.itemsize
            add(_reduce_body(reducer, tag, "rw", vw, False))
            add(_reduce_body(reducer, tag, "rb", vw, False))
            add(_reduce_body(reducer, tag, "rw", 1, True))
            for variant in ("c32", "c64"):
                add(_reduce_body(reducer, tag, variant, 1, False))
                add(_reduce_body(reducer, tag, variant, 1, True))
        for xdt, dt in ((I32, BOOL), (F32, I32), (U8, F16), (F16, F64)):  # other result dtypes
            if op in ("argmax", "argmin"):
                dt = I64
            reducer, acc = _reduce_types(op, xdt, dt)
            add(_reduce_body(reducer, f"{op}_{_sfx(xdt)}_{_sfx(acc)}_{_sfx(dt)}", "c32", 1, False))
    for op in CUMULATIVE:
        for dt in kinds:
            src, acc = _scan_types(op, dt)
            add(_scan_body(op, dt, src, acc, dt, "r"))
            add(_scan_body(op, dt, src, acc, dt, "c"))
            add(_scan_body(op, acc, acc, acc, acc, "r"))
        src, acc = _scan_types(op, F32)
        add(_scan_body(op, I32, src, acc, F32, "r"))
    # gathers and scatters
    idx_kinds = _INDEX_DTYPES
    for it in idx_kinds:
        for wide in (False, True):
            for unit in (1, 2, 4, 8, 16):
                add(_take_body(unit, it, wide))
                add(_gnd_body(unit, it, wide))
            for unit in (1, 2, 4, 8):
                add(_tal_body(unit, it, wide, 4))
    for maxd in (8, 16):
        add(_tal_body(4, I64, False, maxd))
        add(_tal_body(4, I64, True, maxd))
    for xdt in kinds:
        acc, scr = _accumulator(xdt)
        for wide in (False, True):
            add(_scatter_body("iadd", xdt, acc, scr, I64, wide))
            add(_scatter_body("add", xdt, acc, scr, I64, wide))
            add(_scatter_body("set", xdt, acc, xdt, I64, wide))
        add(_scatter_body("add", None, acc, scr, I32, False))
        add(_scatter_body("set", None, acc, xdt, I32, False))
        add(_scatter_body("iadd", F64 if xdt != F64 else F32, acc, scr, I32, False))
    for it in idx_kinds:
        add(_scatter_body("iadd", F32, F32, F32, it, False))
        add(_scatter_body("add", F32, F32, F32, it, False))
    for unit in (1, 2, 4, 8):
        for mode in PAD_MODES:
            for wide in (False, True):
                add(_pad_body(unit, mode, wide, 4))
        add(_pad_body(unit, "reflect", False, 8))
        add(_pad_body(unit, "reflect", True, 16))
    # sorting
    for t in kinds:
        for io in (I32, I64):
            add(_sort_block_body(t, io))
            add(_sort_out_body(t, io))
        add(_sort_chunk_body(t))
    for io in (F32, F64, I16, U64):
        add(_sort_block_body(F32, io))
    add(_sort_merge_body(4))
    add(_sort_merge_body(8))
    for kind in RANDOM_KINDS:
        for dt in ((U32,) if kind == "bits" else (F32, F16, BF16, F64)):
            add(_random_body(kind, dt))
    add(_advance_body())
    for dt in ([d for d in kinds if not _is_float(d)]):
        for maxd in ((4, 8, 16) if dt == I32 else (4,)):
            add(_imatmul_body(dt, dt, dt, maxd))
    add(_imatmul_body(U8, I8, I32, 4))
    add(_imatmul_body(F32, I64, I64, 4))
    return list(out.values())


def _compile_text(args: "tuple[str, str]") -> str:
    """Compile one kernel (a process pool's task): into the disk cache :class:`Kernel` reads."""
    text, arch = args
    compile_kernel(header() + "\n" + text, arch=arch, options=_OPTIONS)
    return arch


def precompile(arch: "str | None" = None, workers: "int | None" = None, exhaustive: bool = True) -> int:
    """Compile the kernels of :func:`kernel_bodies` for ``arch`` (default: the current device's) into
    the on-disk kernel cache, in ``workers`` processes (default: one per CPU, at most 32); returns how
    many. Later calls find them there instead of running NVRTC one by one on first use (a cold start)."""
    if arch is None:
        arch = CudaDevice(current_device_index()).arch
    jobs = [(b.text, arch) for b in kernel_bodies(exhaustive)]
    n = workers or min(os.cpu_count() or 1, 32)
    if n <= 1:
        for job in jobs:
            _compile_text(job)
        return len(jobs)
    with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn")) as pool:
        for _ in pool.map(_compile_text, jobs, chunksize=8):
            pass
    return len(jobs)
