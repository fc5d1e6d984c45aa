"""cuBLASLt: owned handle and descriptors, and the "TN" low-precision matmul with a plan cache.

``matmul_tn`` computes, in cuBLAS's column-major terms, ``D (m, n) = [relu](scale_a * scale_b * op(A) @ B (+ bias))``
with ``A`` stored ``(k, m)`` (so ``op(A) = A^T``: the "TN" format FP8 and int8 tensor-core kernels require)
and ``B`` stored ``(k, n)``. In row-major terms: ``D_rm (n, m) = B_rm (n, k) @ A_rm (m, k)^T``, i.e. a dense
layer ``y (rows, out) = x (rows, in) @ W (out, in)^T`` with ``m = out``, ``n = rows``, ``k = in``.

* ``"float8"``: A, B E4M3; compute float32; D float32, float16 or bfloat16; ``a_scale``/``b_scale`` device
  pointers to one float32 each (``CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER``: the factors that turn the E4M3
  values back into real ones). D stays in a float type here, so no D scale (it scales FP8 outputs only).
* ``"int8"``: A, B int8; compute ``CUBLAS_COMPUTE_32I``; D int32 (exact sums); no scales.

Requirements checked before any C call (ValueError naming the operand): leading dimensions multiples of
16 bytes (``k % 16 == 0``; ``m * itemsize(D) % 16 == 0``; FP8 also ``m % 16 == 0``), pointers 16-byte
aligned, positive sizes, and (FP8) a GPU of compute capability 8.9 or newer. cuBLAS's FP8 rules: "All
matrix pointers must be 16-byte aligned", "A must be transposed and B non-transposed (The "TN" format)",
"The compute type must be CUBLAS_COMPUTE_32F", "The scale type must be CUDA_R_32F".

A plan (matmul descriptor, layouts, the setting and the algorithm that ran) is made on the first call of
a (device, kind, m, n, k, D dtype, bias dtype, pointer alignments, relu, workspace) and cached; later calls
set only the pointers, make no allocation and may be captured into a CUDA graph. Making it, the settings are
tried in order, each doing less in the epilogue and leaving the rest to the caller (``matmul_tn`` returns
the steps left, in order: bias first, then relu) -- with a bias, "bias-epilogue" (``CUBLASLT_EPILOGUE_BIAS``)
then "bias-after"; asked for a relu (float8 only), "relu-bias-epilogue" (``CUBLASLT_EPILOGUE_RELU_BIAS``:
bias, then ``max(x, 0)`` in float32 before D's rounding) before those, or without a bias "relu-epilogue"
(``CUBLASLT_EPILOGUE_RELU``) then "plain" -- each with the heuristic's best few algorithms, on the call's real
pointers (scale and bias pointers set before the heuristic, the preference's minimum alignments those of
A, B and D). A setting the heuristic refuses (NOT_SUPPORTED, INVALID_VALUE or no result) or whose
``cublasLtMatmul`` refuses every algorithm (it checks before queuing anything) gives way to the next; when
none runs, :class:`LtNotSupportedError` names the shapes, dtypes and what each attempt answered. The plan's
repr names the setting and algorithm chosen (:func:`lt_plans`).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

from .. import cuda
from .._cache import LRUCache
from .._lib import OwnedPointer, device_index
from .._lib import cublaslt as L
from .._lib.cublas import ComputeType, DataType, Operation
from .. import _validate
from .._validate import BFLOAT16
from ..errors import CublasError

__all__ = ["LtHandle", "LtNotSupportedError", "MatmulDesc", "MatrixLayout", "MatmulPreference", "get_lt_handle", "matmul_tn",
           "check_tn_alignment", "tn_supported", "LtNotSupportedError", "lt_plans"]

_D_TYPES = {np.dtype(np.float32): DataType.R_32F, np.dtype(np.float16): DataType.R_16F, BFLOAT16: DataType.R_16BF,
            np.dtype(np.int32): DataType.R_32I}
_KINDS = ("float8", "int8")
_BIAS_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), BFLOAT16)


class LtHandle(OwnedPointer):
    """An owned ``cublasLtHandle_t`` (not bound to a stream: ``cublasLtMatmul`` takes one per call)."""

    def __init__(self, device: Any = None) -> None:
        index = device_index(device)
        out = ctypes.c_void_p()
        if index is None:
            L.call("cublasLtCreate", ctypes.byref(out))
        else:
            with cuda.CudaDevice(index):
                L.call("cublasLtCreate", ctypes.byref(out))
        self._adopt(int(out.value), L.raw("cublasLtDestroy"))
        self.device = index if index is not None else cuda.current_device_index()

    def _check_destroy(self, status: int) -> None:
        if status:
            raise L._binding.make_error(status, "cublasLtDestroy", None)

    def __repr__(self) -> str:
        return "<cublas.LtHandle closed>" if self.closed else f"<cublas.LtHandle {self.handle:#x} device={self.device}>"


def _set(fn: str, handle: int, attr: int, value: Any) -> None:
    L.call(fn, handle, int(attr), ctypes.byref(value), ctypes.sizeof(value), context={"attribute": int(attr)})


class MatmulDesc(OwnedPointer):
    """``cublasLtMatmulDesc_t``: compute type, scale type, transposes, epilogue and the pointer attributes."""

    def __init__(self, compute: int, scale_type: int) -> None:
        out = ctypes.c_void_p()
        L.call("cublasLtMatmulDescCreate", ctypes.byref(out), int(compute), int(scale_type))
        self._adopt(int(out.value), L.raw("cublasLtMatmulDescDestroy"))

    def set_int32(self, attr: int, value: int) -> None:
        _set("cublasLtMatmulDescSetAttribute", self.handle, attr, ctypes.c_int32(int(value)))

    def set_uint32(self, attr: int, value: int) -> None:
        _set("cublasLtMatmulDescSetAttribute", self.handle, attr, ctypes.c_uint32(int(value)))

    def set_int8(self, attr: int, value: int) -> None:
        _set("cublasLtMatmulDescSetAttribute", self.handle, attr, ctypes.c_int8(int(value)))

    def set_pointer(self, attr: int, ptr: int) -> None:
        _set("cublasLtMatmulDescSetAttribute", self.handle, attr, ctypes.c_void_p(int(ptr) or None))

    def get_int32(self, attr: int) -> int:
        value, written = ctypes.c_int32(), ctypes.c_size_t()
        L.call("cublasLtMatmulDescGetAttribute", self.handle, int(attr), ctypes.byref(value), ctypes.sizeof(value),
               ctypes.byref(written))
        return int(value.value)

    def get_pointer(self, attr: int) -> int:
        value, written = ctypes.c_void_p(), ctypes.c_size_t()
        L.call("cublasLtMatmulDescGetAttribute", self.handle, int(attr), ctypes.byref(value), ctypes.sizeof(value),
               ctypes.byref(written))
        return int(value.value or 0)


class MatrixLayout(OwnedPointer):
    """``cublasLtMatrixLayout_t``: a column-major ``rows x cols`` matrix of ``data_type`` with leading dim ``ld``."""

    def __init__(self, data_type: int, rows: int, cols: int, ld: int) -> None:
        out = ctypes.c_void_p()
        L.call("cublasLtMatrixLayoutCreate", ctypes.byref(out), int(data_type), int(rows), int(cols), int(ld),
               context={"rows": rows, "cols": cols, "ld": ld})
        self._adopt(int(out.value), L.raw("cublasLtMatrixLayoutDestroy"))

    def get_uint64(self, attr: int) -> int:
        value, written = ctypes.c_uint64(), ctypes.c_size_t()
        L.call("cublasLtMatrixLayoutGetAttribute", self.handle, int(attr), ctypes.byref(value), ctypes.sizeof(value),
               ctypes.byref(written))
        return int(value.value)


class MatmulPreference(OwnedPointer):
    """``cublasLtMatmulPreference_t`` with the workspace limit the heuristic may choose within."""

    def __init__(self, max_workspace_bytes: int) -> None:
        out = ctypes.c_void_p()
        L.call("cublasLtMatmulPreferenceCreate", ctypes.byref(out))
        self._adopt(int(out.value), L.raw("cublasLtMatmulPreferenceDestroy"))
        _set("cublasLtMatmulPreferenceSetAttribute", self.handle, L.PreferenceAttribute.MAX_WORKSPACE_BYTES,
             ctypes.c_uint64(int(max_workspace_bytes)))


_handles: dict[int, LtHandle] = {}
_lock = threading.Lock()


def get_lt_handle(device: int) -> LtHandle:
    """The cached :class:`LtHandle` of ``device`` (one per device: the handle holds no stream)."""
    h = _handles.get(device)
    if h is None:
        with _lock:
            h = _handles.get(device)
            if h is None:
                h = _handles[device] = LtHandle(device)
    return h


def check_tn_alignment(kind: str, m: int, n: int, k: int, d_dtype: Any, pointers: "dict[str, int]") -> None:
    """Raise ValueError unless ``matmul_tn`` may run on these sizes and pointers (see the module)."""
    if kind not in _KINDS:
        raise ValueError(f"matmul_tn: kind must be 'float8' or 'int8', got {kind!r}")
    for name, value in (("m", m), ("n", n), ("k", k)):
        _validate.integer(value, name, "matmul_tn")
    d_dtype = _validate.normalize_dtype(d_dtype, "matmul_tn: d_dtype")
    if kind == "int8" and d_dtype != np.dtype(np.int32):
        raise ValueError(f"matmul_tn: int8 writes int32 (exact sums), got D dtype {d_dtype}")
    if kind == "float8" and d_dtype not in (np.dtype(np.float32), np.dtype(np.float16), BFLOAT16):
        raise ValueError(f"matmul_tn: float8 writes float32, float16 or bfloat16, got D dtype {d_dtype}")
    if min(m, n, k) < 1:
        raise ValueError(f"matmul_tn: m, n, k must be positive, got m={m}, n={n}, k={k}")
    if k % 16:
        raise ValueError(f"matmul_tn ({kind}): k={k} (the reduction length, the leading dimension of the 1-byte A and "
                         "B) must be a multiple of 16 (16-byte aligned columns for the tensor-core kernels)")
    if kind == "float8" and m % 16:
        # the 1-byte A's other dimension: cuBLAS asks FP8 matrix dimensions to "support 16-byte alignment"
        raise ValueError(f"matmul_tn (float8): m={m} (the output features, A's second dimension) must be a multiple "
                         "of 16")
    if (m * d_dtype.itemsize) % 16:
        raise ValueError(f"matmul_tn ({kind}): m={m} (D's leading dimension, {d_dtype}) must make a multiple of 16 "
                         f"bytes, i.e. a multiple of {16 // d_dtype.itemsize}")
    for name, ptr in pointers.items():
        if ptr % 16:
            raise ValueError(f"matmul_tn ({kind}): {name} at {ptr:#x} is not 16-byte aligned")


def tn_supported(kind: str, m: int, k: int, d_dtype: Any, compute_capability: "tuple[int, int]") -> bool:
    """Whether :func:`matmul_tn` takes these sizes on a GPU of ``compute_capability`` (pointers from the
    pool are 256-byte aligned)."""
    if kind == "float8" and tuple(compute_capability) < (8, 9):
        return False
    try:
        check_tn_alignment(kind, m, 1, k, np.int32 if kind == "int8" else d_dtype, {})
    except ValueError:
        return False
    return True


class LtNotSupportedError(CublasError):
    """cuBLASLt accepted none of the settings :func:`matmul_tn` tried for one matmul (nothing was queued;
    the caller may take another path). ``context["tried"]`` lists each setting and why it was refused."""


# Settings tried in order when a plan is made, by (bias given, relu asked): (name, the epilogue steps cuBLASLt
# does); the caller does the rest (bias of D's type; relu after the bias, so a relu is fused only with it).
_SETTINGS = {
    (True, True): (("relu-bias-epilogue", ("bias", "relu")), ("bias-epilogue", ("bias",)), ("bias-after", ())),
    (True, False): (("bias-epilogue", ("bias",)), ("bias-after", ())),
    (False, True): (("relu-epilogue", ("relu",)), ("plain", ())),
    (False, False): (("plain", ()),),
}
_EPILOGUES = {("bias", "relu"): L.Epilogue.RELU_BIAS, ("bias",): L.Epilogue.BIAS, ("relu",): L.Epilogue.RELU}
_ALGOS_REQUESTED = 4  # the heuristic's best few: a later one runs when cublasLtMatmul refuses an earlier one
_NOT_SUPPORTED = 15  # CUBLAS_STATUS_NOT_SUPPORTED
# statuses that refuse one setting, not the call: NOT_SUPPORTED, and INVALID_VALUE (the header's answer to a
# scale or bias attribute "set for an unsupported matrix data, scale, and compute type combination")
_REFUSALS = {_NOT_SUPPORTED: "CUBLAS_STATUS_NOT_SUPPORTED", 7: "CUBLAS_STATUS_INVALID_VALUE"}


def _alignment(ptr: int) -> int:
    """Largest power of two dividing ``ptr``, at most 256 (cuBLASLt's default minimum alignment)."""
    return 256 if not ptr else min(256, ptr & -ptr)


class _Plan:
    """One cached cuBLASLt matmul: descriptor, layouts, the setting and the algorithm that ran."""

    __slots__ = ("desc", "a", "b", "d", "pref", "algos", "algo", "algo_index", "setting", "fused", "label", "lock")

    def __init__(self, desc, a, b, d, pref, algos, setting: str, fused: "tuple[str, ...]", label: str) -> None:
        self.desc, self.a, self.b, self.d, self.pref = desc, a, b, d, pref
        # a cached plan's descriptor carries the call's scale and bias pointers: two threads running one
        # plan would otherwise launch with each other's pointers (set, set, launch, launch)
        self.lock = threading.Lock()
        self.algos = algos  # [(cublasLtMatmulAlgo_t bytes, workspace bytes)], best first
        self.algo, self.algo_index = None, -1
        self.setting, self.fused, self.label = setting, fused, label  # fused: the epilogue's steps

    @property
    def fused_bias(self) -> bool:
        return "bias" in self.fused

    def __repr__(self) -> str:
        return (f"<cublas.LtPlan {self.label} setting={self.setting} algo={self.algo_index + 1}/{len(self.algos)} "
                f"workspace={self.algos[self.algo_index][1] if self.algo is not None else '-'}>")


PLAN_CACHE_SIZE = 256
"""cuBLASLt plans kept (shapes, types, alignments)."""
_plans = LRUCache(PLAN_CACHE_SIZE, "cuBLASLt plans")
_ONE_F, _ZERO_F = ctypes.c_float(1.0), ctypes.c_float(0.0)
_ONE_I, _ZERO_I = ctypes.c_int32(1), ctypes.c_int32(0)


def lt_plans() -> "list[_Plan]":
    """The cached plans (their repr names the setting and the algorithm chosen); for tests and diagnostics."""
    return [plan for _, plan in _plans.items()]


def _make_plan(handle: LtHandle, kind: str, m: int, n: int, k: int, d_type: int, bias_type: "int | None",
               workspace_bytes: int, aligns: "tuple[int, int, int]", setting: str, fused: "tuple[str, ...]",
               pointers: "dict[str, int]", label: str) -> "_Plan | str":
    """A plan for one setting, or why the heuristic refused it (a status name, or "no algorithm")."""
    if kind == "float8":
        desc = MatmulDesc(ComputeType.COMPUTE_32F, DataType.R_32F)
        ab = DataType.R_8F_E4M3
        # the default, said out loud: intermediate sums are promoted to fp32 periodically (header: "When
        # enabled ... lower accuracy because intermediate results will not periodically be promoted")
        desc.set_int8(L.MatmulDescAttribute.FAST_ACCUM, 0)
        # the real scale pointers before the heuristic, as cuBLASLt's users (PyTorch's scaled_gemm) do
        desc.set_pointer(L.MatmulDescAttribute.A_SCALE_POINTER, pointers["a_scale"])
        desc.set_pointer(L.MatmulDescAttribute.B_SCALE_POINTER, pointers["b_scale"])
    else:
        desc = MatmulDesc(ComputeType.COMPUTE_32I, DataType.R_32I)
        ab = DataType.R_8I
    desc.set_int32(L.MatmulDescAttribute.TRANSA, Operation.T)
    desc.set_int32(L.MatmulDescAttribute.TRANSB, Operation.N)
    if fused:
        desc.set_uint32(L.MatmulDescAttribute.EPILOGUE, _EPILOGUES[fused])
    if "bias" in fused:
        desc.set_int32(L.MatmulDescAttribute.BIAS_DATA_TYPE, bias_type)
        # header: the heuristic "depend[s] on its value to determine expected pointer alignment"
        desc.set_pointer(L.MatmulDescAttribute.BIAS_POINTER, pointers["bias"])
    a = MatrixLayout(ab, k, m, k)
    b = MatrixLayout(ab, k, n, k)
    d = MatrixLayout(d_type, m, n, m)
    pref = MatmulPreference(workspace_bytes)
    # the alignment the pointers really have (the default 256 assumes more than a view may give)
    for attr, value in zip((L.PreferenceAttribute.MIN_ALIGNMENT_A_BYTES, L.PreferenceAttribute.MIN_ALIGNMENT_B_BYTES,
                            L.PreferenceAttribute.MIN_ALIGNMENT_C_BYTES, L.PreferenceAttribute.MIN_ALIGNMENT_D_BYTES),
                           (aligns[0], aligns[1], aligns[2], aligns[2])):
        _set("cublasLtMatmulPreferenceSetAttribute", pref.handle, attr, ctypes.c_uint32(value))
    results = (L.HeuristicResult * _ALGOS_REQUESTED)()
    count = ctypes.c_int(0)
    status = L.raw("cublasLtMatmulAlgoGetHeuristic")(handle.handle, desc.handle, a.handle, b.handle, d.handle,
                                                     d.handle, pref.handle, _ALGOS_REQUESTED,
                                                     ctypes.addressof(results), ctypes.byref(count))
    if status in _REFUSALS:
        return _REFUSALS[status]
    if status:
        raise L.make_error(status, "cublasLtMatmulAlgoGetHeuristic", {"plan": label, "setting": setting})
    algos = [(ctypes.create_string_buffer(bytes(r.algo), L.ALGO_BYTES), int(r.workspaceSize))
             for r in results[:count.value] if not r.state]
    if not algos:
        return "no algorithm"
    return _Plan(desc, a, b, d, pref, algos, setting, fused, label)


def _run(handle: LtHandle, plan: _Plan, algo: Any, kind: str, a: int, b: int, d: int, workspace: int,
         workspace_bytes: int, stream: Any) -> int:
    if kind == "float8":
        alpha, beta = ctypes.byref(_ONE_F), ctypes.byref(_ZERO_F)
    else:
        alpha, beta = ctypes.byref(_ONE_I), ctypes.byref(_ZERO_I)
    return L.raw("cublasLtMatmul")(handle.handle, plan.desc.handle, alpha, a, plan.a.handle, b, plan.b.handle, beta,
                                   d, plan.d.handle, d, plan.d.handle, ctypes.addressof(algo), workspace or None,
                                   workspace_bytes, stream.handle)


def matmul_tn(kind: str, m: int, n: int, k: int, a: int, b: int, d: int, *, d_dtype: Any, stream: Any,
              workspace: int, workspace_bytes: int, a_scale: int = 0, b_scale: int = 0, bias: int = 0,
              bias_dtype: Any = None, relu: bool = False) -> "tuple[str, ...]":
    """``D (m, n) = [relu]([a_scale * b_scale *] A(k, m)^T @ B(k, n) [+ bias (m,)])`` on ``stream`` (column-major;
    see the module for the row-major reading). ``a``, ``b``, ``d``, ``a_scale``, ``b_scale``, ``bias`` and
    ``workspace`` are device pointers (ints; 0: none); ``stream`` a :class:`dnnbind.cuda.Stream`; ``relu``
    (float8 only): ``max(x, 0)`` after the bias.

    Returns the epilogue steps left to the caller, in the order they apply: ``()`` when cuBLASLt did all
    that was asked, else a tail of ``("bias", "relu")`` (the epilogue that fuses them was refused for this
    shape and type). Raises :class:`LtNotSupportedError` when cuBLASLt accepts none of the settings
    (nothing queued then).
    """
    if not isinstance(relu, bool):
        raise TypeError(f"matmul_tn: relu must be a bool, got {relu!r}")
    if relu and kind != "float8":
        raise ValueError(f"matmul_tn: the relu epilogue is for float8 only ({kind} writes the raw sums), got "
                         f"kind {kind!r}")
    check_tn_alignment(kind, m, n, k, d_dtype, {"A": a, "B": b, "D": d, **({"bias": bias} if bias else {})})
    d_dtype = _validate.normalize_dtype(d_dtype, "matmul_tn: d_dtype")
    if kind == "float8" and not (a_scale and b_scale):
        # cuBLASLt would dereference a null scale pointer on the device
        raise ValueError(f"matmul_tn (float8): a_scale and b_scale must be device pointers to one float32 each, got "
                         f"a_scale={a_scale:#x}, b_scale={b_scale:#x}")
    bias_type = None
    if bias:
        if bias_dtype is None:
            raise ValueError("matmul_tn: bias_dtype (float32, float16 or bfloat16) is required when a bias is given")
        bias_dtype = _validate.normalize_dtype(bias_dtype, "matmul_tn: bias_dtype")
        if bias_dtype not in _BIAS_DTYPES:
            raise ValueError(f"matmul_tn: bias_dtype must be float32, float16 or bfloat16 when a bias is given, got "
                             f"{bias_dtype}")
        bias_type = int(_D_TYPES[bias_dtype])
    device = stream.device_index
    aligns = (_alignment(a), _alignment(b), _alignment(d))
    key = (device, kind, m, n, k, d_dtype.str, bias_type, _alignment(bias) if bias else 0, aligns, relu,
           workspace_bytes)
    asked = (("bias",) if bias else ()) + (("relu",) if relu else ())
    handle = get_lt_handle(device)
    plan = _plans.get(key)
    if plan is not None:
        desc = plan.desc
        with plan.lock:
            if kind == "float8":
                desc.set_pointer(L.MatmulDescAttribute.A_SCALE_POINTER, a_scale)
                desc.set_pointer(L.MatmulDescAttribute.B_SCALE_POINTER, b_scale)
            if plan.fused_bias:
                desc.set_pointer(L.MatmulDescAttribute.BIAS_POINTER, bias)
            status = _run(handle, plan, plan.algo, kind, a, b, d, workspace, workspace_bytes, stream)
        if status:
            raise L.make_error(status, "cublasLtMatmul", {"plan": repr(plan)})
        return asked[len(plan.fused):]
    label = (f"{kind} m={m} n={n} k={k} D={d_dtype}" + (f" bias={np.dtype(bias_dtype)}" if bias else "")
             + (" relu" if relu else ""))
    pointers = {"a_scale": a_scale, "b_scale": b_scale, "bias": bias}
    tried: "list[str]" = []
    for setting, fused in _SETTINGS[bool(bias), relu]:
        plan = _make_plan(handle, kind, m, n, k, int(_D_TYPES[d_dtype]), bias_type, workspace_bytes, aligns,
                          setting, fused, pointers, label)
        if isinstance(plan, str):
            tried.append(f"{setting}: cublasLtMatmulAlgoGetHeuristic {plan}")
            continue
        # cublasLtMatmul checks the call (pointers included) before it queues anything: a refusal is
        # answered by the next algorithm, then the next setting
        for index, (algo, _) in enumerate(plan.algos):
            status = _run(handle, plan, algo, kind, a, b, d, workspace, workspace_bytes, stream)
            if status == 0:
                plan.algo, plan.algo_index = algo, index
                _plans.put(key, plan)
                return asked[len(plan.fused):]
            if status not in _REFUSALS:
                raise L.make_error(status, "cublasLtMatmul", {"plan": label, "setting": setting, "algo": index})
            tried.append(f"{setting}: cublasLtMatmul {_REFUSALS[status]} with algorithm {index + 1} of "
                         f"{len(plan.algos)}")
    raise LtNotSupportedError(
        _NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED", "cublasLtMatmul",
        detail=f"cuBLASLt runs none of the settings tried for {label}",
        context={"kind": kind, "m": m, "n": n, "k": k, "d_dtype": str(d_dtype), "relu": relu,
                 "bias_dtype": str(np.dtype(bias_dtype)) if bias else None, "alignments (A, B, D)": aligns,
                 "workspace_bytes": workspace_bytes, "tried": "; ".join(tried)},
        hint="cuBLASLt has no kernel for this type/shape on this GPU (FP8 needs sm_89+ and the TN layout)")
