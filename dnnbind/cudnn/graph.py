"""The cuDNN graph (backend) API, Pythonic: describe a fused computation, get a cached plan, execute it.

::

    from dnnbind import cuda, cudnn
    from dnnbind.cudnn.graph import Graph

    g = Graph(io_dtype="float16", compute_dtype="float32")          # layout "NHWC" (Keras' channels_last)
    x = g.tensor("x", (8, 32, 32, 64))                               # (N, H, W, C)
    w = g.tensor("w", (128, 3, 3, 64))                               # (K, R, S, C)
    b = g.tensor("b", (1, 1, 1, 128))
    y = g.relu(g.add(g.conv_fprop(x, w, padding=1), b))
    y.output("y")
    plan = g.build()                                                  # heuristics A, then fallback
    ws = cuda.empty((plan.workspace_size,), "uint8") if plan.workspace_size else None
    plan.execute({"x": x_dev, "w": w_dev, "b": b_dev, "y": y_dev}, workspace=ws)

**Tensors** are :class:`Tensor` nodes. Shapes are given in the layout's axis order, as everywhere
in dnnbind: ``(N, H, W, C)`` for ``"NHWC"``, ``(N, C, H, W)`` for ``"NCHW"``, filters ``(K, R, S, C)``
/ ``(K, C, R, S)``; tensors of rank 2 and 3 (matmul) are row-major ``(..., rows, cols)``. Strides
are in elements, in the same order. cuDNN itself sees ``(N, C, spatial...)``: :attr:`Tensor.dims`.
A tensor an operation makes is *virtual* (never in memory, it lives inside the fused kernel) until
:meth:`Tensor.output` names it; inputs made with :meth:`Graph.tensor` are always in memory. By-value
scalars (:meth:`Graph.scalar`: epsilon, momentum, constant factors) travel with the plan, on the host.

**Dtypes**: a tensor without one takes ``io_dtype`` when it is in memory and ``intermediate_dtype``
(default: ``compute_dtype``) when virtual. Per-channel statistics and batch-norm parameters are
float32 (the house rule).

**Plans**: :meth:`Graph.build` validates in Python, creates and finalizes the backend descriptors,
asks the heuristics (modes in order, ``("A", "fallback")`` by default) for engine configurations and
keeps the first one whose execution plan finalizes. Plans are cached process-wide by the graph's
structure (every tensor's dims, strides, dtype, virtuality, alignment and every operation's
parameters), the heuristics modes, the TF32 choice and the device: two graphs built the same way
share one finalized plan (runtime-compiled kernels are compiled once). Scalars are not part of the
key: each :class:`Plan` carries its own graph's values.

**Execution and CUDA graphs**: :meth:`Plan.execute` binds device pointers by tensor name (a variant
pack), takes the workspace from the caller (``plan.workspace_size`` bytes; a DeviceArray, an
Allocation or a pointer) and enqueues on the handle's stream: no host synchronisation and no
allocation, so it can be captured by :func:`dnnbind.cuda.capture`. Build plans before capturing
(``build`` refuses a cache miss while the stream is captured: finalizing may compile and load
kernels). Keep the :class:`Plan` referenced as long as a captured graph replays it: cuDNN before
9.28 frees a plan's runtime-compiled kernels with the plan.

Everything here that owns a C object is an :class:`dnnbind._lib.OwnedPointer` (idempotent
``close()``, ``weakref.finalize`` cleanup). Errors: bad arguments raise ``ValueError``/``TypeError``
naming the operation and argument before any C call; a failed finalize raises
:class:`dnnbind.errors.CudnnError` with cuDNN's last error string and what was being finalized;
a graph no engine runs raises :class:`GraphNotSupportedError` (a CudnnError) listing what was tried.
"""

from __future__ import annotations

import ctypes
import itertools
from collections import abc
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .. import cuda
from .._cache import LRUCache
from .._lib import OwnedPointer
from .._lib import cudnn as C
from .._lib import cudnn_graph as G
from .._validate import ArgumentTypeError, normalize_dtype
from ..errors import CudnnError
from ._handle import Handle, get_handle, require_handle

__all__ = [
    "Graph",
    "Tensor",
    "Plan",
    "BackendDescriptor",
    "GraphNotSupportedError",
    "clear_plan_cache",
    "plan_cache_info",
]

A = G.AttributeName
T = G.AttributeType
D = G.DescriptorType

_FLT_MAX = float(np.finfo(np.float32).max)
_DEFAULT_ALIGNMENT = 16  # bytes, cudnn-frontend's default; pool allocations are 256-byte aligned

_DTYPE_TO_CUDNN = {
    np.dtype(np.float32): G.DataType.FLOAT,
    np.dtype(np.float64): G.DataType.DOUBLE,
    np.dtype(np.float16): G.DataType.HALF,
    normalize_dtype("bfloat16"): G.DataType.BFLOAT16,
    np.dtype(np.int8): G.DataType.INT8,
    np.dtype(np.uint8): G.DataType.UINT8,
    np.dtype(np.int32): G.DataType.INT32,
    np.dtype(np.int64): G.DataType.INT64,
    np.dtype(np.bool_): G.DataType.BOOLEAN,
}
_SUPPORTED = frozenset(_DTYPE_TO_CUDNN)
_F32 = np.dtype(np.float32)


def _dtype(value: Any, what: str) -> np.dtype:
    return normalize_dtype(value, what, _SUPPORTED)


def _cudnn_dtype(dtype: np.dtype) -> int:
    return int(_DTYPE_TO_CUDNN[dtype])


class GraphNotSupportedError(CudnnError):
    """No engine of this cuDNN runs the graph on this GPU (the operation graph or every plan tried was refused).

    ``tried`` lists ``(what, status name, cuDNN's message)`` for each refusal.
    """

    def __init__(self, what: str, tried: "list[tuple[str, str, str]]", context: Mapping[str, Any],
                 hint: str | None = None) -> None:
        # The first 12 refusals, then every heuristics mode's own line still unshown: each mode tried is named.
        shown = tried[:12] + [t for t in tried[12:] if t[0].startswith("heuristics ")]
        lines = "; ".join(f"{w}: {s} {d}".strip() for w, s, d in shown) or "the heuristics returned no engine"
        if len(tried) > len(shown):
            lines += f"; ... ({len(tried) - len(shown)} more engine configs refused)"
        super().__init__(int(C.Status.NOT_SUPPORTED), "CUDNN_STATUS_NOT_SUPPORTED", "cudnnBackendFinalize",
                         detail=f"no engine runs {what}: {lines}", context=context,
                         hint=hint or _GENERIC_HINT)
        self.tried = tried


_GENERIC_HINT = ("cuDNN's fused engines need channels-last (NHWC) tensors, channels a multiple of 8 for "
                 "float16/bfloat16, and Ampere or newer; try another layout, dtype or heuristics mode, or the "
                 "unfused ops")
_DBN_WEIGHT_HINT = ("cuDNN runs dbn_weight (BN_BWD_WEIGHTS) only inside its DgradDreluBNBwdWeight fusion: "
                    "conv_dgrad -> relu_backward against the recomputed batch-norm output -> dbn_weight, with "
                    "float16 NHWC data on Ampere/Hopper; build it with Graph.dgrad_drelu_dbn_weight, or use "
                    "batchnorm_backward")


# ---------------------------------------------------------------------------------------------
# the owned backend descriptor
# ---------------------------------------------------------------------------------------------


class BackendDescriptor(OwnedPointer):
    """An owned ``cudnnBackendDescriptor_t`` of one :class:`~dnnbind._lib.cudnn_graph.DescriptorType`.

    ``what`` names it in errors ("tensor 'x'", "conv_fprop 'conv_fprop_0'"). Descriptors set as
    attribute values are kept referenced, so nothing this descriptor points to is destroyed first.
    """

    def __init__(self, kind: G.DescriptorType, what: str) -> None:
        self.kind = G.DescriptorType(kind)
        self.what = what
        self._refs: list[Any] = []
        out = ctypes.c_void_p()
        G.call("cudnnBackendCreateDescriptor", int(self.kind), ctypes.byref(out),
               context={"creating": f"{what} ({self.kind.name})"})
        self._adopt(out.value, G.raw("cudnnBackendDestroyDescriptor"))

    def set(self, name: G.AttributeName, attr_type: G.AttributeType, values: Any) -> None:
        """``cudnnBackendSetAttribute``: ``values`` is one value or a sequence; descriptors pass as themselves."""
        if not isinstance(values, (list, tuple)):
            values = [values]
        ctype = G.ATTRIBUTE_CTYPE[attr_type]
        if attr_type == T.BACKEND_DESCRIPTOR:
            self._refs.extend(values)
            items = [v.handle for v in values]
        elif attr_type == T.FRACTION:
            items = [G.Fraction(int(v), 1) for v in values]
        elif ctype in (ctypes.c_float, ctypes.c_double):
            items = [float(v) for v in values]
        elif ctype is ctypes.c_bool:
            items = [bool(v) for v in values]
        else:
            items = [int(v) for v in values]
        array = (ctype * len(items))(*items)
        G.call("cudnnBackendSetAttribute", self.handle, int(name), int(attr_type), len(items),
               ctypes.cast(array, ctypes.c_void_p),
               context=lambda: {"setting": f"{G.AttributeName(name).name} of {self.what} ({self.kind.name})"})

    def finalize(self) -> "BackendDescriptor":
        """``cudnnBackendFinalize``; a failure raises CudnnError naming what was being finalized."""
        G.call("cudnnBackendFinalize", self.handle, context=lambda: {"finalizing": f"{self.what} ({self.kind.name})"})
        return self

    def get(self, name: G.AttributeName, attr_type: G.AttributeType, count: int = 1) -> list:
        """``cudnnBackendGetAttribute`` of up to ``count`` elements (numbers and enums)."""
        ctype = G.ATTRIBUTE_CTYPE[attr_type]
        array = (ctype * max(count, 1))()
        n = ctypes.c_int64()
        G.call("cudnnBackendGetAttribute", self.handle, int(name), int(attr_type), count, ctypes.byref(n),
               ctypes.cast(array, ctypes.c_void_p),
               context=lambda: {"reading": f"{G.AttributeName(name).name} of {self.what} ({self.kind.name})"})
        return list(array[: n.value])

    def count(self, name: G.AttributeName, attr_type: G.AttributeType) -> int:
        """How many elements attribute ``name`` holds (a get with ``requestedElementCount`` 0)."""
        n = ctypes.c_int64()
        G.call("cudnnBackendGetAttribute", self.handle, int(name), int(attr_type), 0, ctypes.byref(n), None,
               context=lambda: {"counting": f"{G.AttributeName(name).name} of {self.what}"})
        return int(n.value)

    def get_descriptors(self, name: G.AttributeName, into: "list[BackendDescriptor]") -> int:
        """Fill the created (unfinalized) descriptors ``into`` from a descriptor-array attribute; returns how many."""
        array = (ctypes.c_void_p * len(into))(*[d.handle for d in into])
        n = ctypes.c_int64()
        G.call("cudnnBackendGetAttribute", self.handle, int(name), int(T.BACKEND_DESCRIPTOR), len(into),
               ctypes.byref(n), ctypes.cast(array, ctypes.c_void_p),
               context=lambda: {"reading": f"{G.AttributeName(name).name} of {self.what}"})
        return int(n.value)

    def _check_destroy(self, status: int) -> None:
        C.check(status, "cudnnBackendDestroyDescriptor", descriptor=self.what)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.handle:#x}"
        return f"<BackendDescriptor {self.kind.name} {self.what!r} {state}>"


# ---------------------------------------------------------------------------------------------
# tensors
# ---------------------------------------------------------------------------------------------


def _packed(dims: Sequence[int], order: Sequence[int]) -> tuple[int, ...]:
    """Packed strides for ``dims`` laid out with ``order`` (outermost first) of axis indices."""
    strides = [0] * len(dims)
    acc = 1
    for axis in reversed(order):
        strides[axis] = acc
        acc *= dims[axis]
    return tuple(strides)


def _channels_last_order(rank: int) -> tuple[int, ...]:
    return (0, *range(2, rank), 1)


def _to_dims(shape: tuple[int, ...], layout: str | None) -> tuple[int, ...]:
    if layout == "NHWC":
        return (shape[0], shape[-1], *shape[1:-1])
    return shape


def _from_dims(dims: tuple[int, ...], layout: str | None) -> tuple[int, ...]:
    if layout == "NHWC":
        return (dims[0], *dims[2:], dims[1])
    return dims


class Tensor:
    """A tensor of a :class:`Graph`: made by :meth:`Graph.tensor`/:meth:`Graph.scalar` or by an operation.

    ``shape``/``strides`` are in the layout's axis order (strides in elements); ``dims``/
    ``dim_strides`` in cuDNN's ``(N, C, spatial...)`` order. ``dtype`` is None until the graph
    resolves it (:meth:`Graph.build`) for an operation's output without an explicit dtype.
    """

    __slots__ = ("name", "dims", "dim_strides", "dtype", "virtual", "value", "layout", "alignment", "_owner",
                 "_index", "producer")

    def __init__(self, owner: object, index: int, name: str, dims: tuple[int, ...], strides: tuple[int, ...],
                 dtype: np.dtype | None, *, virtual: bool, layout: str | None, value: Any = None,
                 alignment: int = _DEFAULT_ALIGNMENT, producer: str = "") -> None:
        self._owner = owner  # the graph's token (not the graph: no reference cycle)
        self._index = index
        self.name = name
        self.dims = dims
        self.dim_strides = strides
        self.dtype = dtype
        self.virtual = virtual
        self.value = value
        self.layout = layout
        self.alignment = alignment
        self.producer = producer

    @property
    def shape(self) -> tuple[int, ...]:
        """Sizes in the layout's axis order (what a DeviceArray holding it has)."""
        return _from_dims(self.dims, self.layout)

    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in elements, in the layout's axis order."""
        return _from_dims(self.dim_strides, self.layout)

    @property
    def is_scalar(self) -> bool:
        """True for a by-value scalar (:meth:`Graph.scalar`)."""
        return self.value is not None

    def output(self, name: str | None = None, dtype: Any = None) -> "Tensor":
        """Make an operation's result a graph output, kept in memory under ``name`` (a variant-pack key).

        ``dtype`` defaults to the graph's ``io_dtype`` (statistics: float32). Returns the tensor.
        """
        if self.is_scalar:
            raise ValueError(f"Tensor.output: {self.name!r} is a by-value scalar, it cannot be an output")
        if name is not None:
            if not isinstance(name, str) or not name:
                raise ArgumentTypeError(f"Tensor.output: name must be a non-empty str, got {name!r}")
            self.name = name
        if dtype is not None:
            self.dtype = _dtype(dtype, f"Tensor.output {self.name!r}")
        self.virtual = False
        return self

    def __repr__(self) -> str:
        kind = "scalar" if self.is_scalar else ("virtual" if self.virtual else "in memory")
        dtype = self.dtype.name if self.dtype is not None else "unresolved"
        return f"Tensor({self.name!r}, shape={self.shape}, dtype={dtype}, {kind})"


# ---------------------------------------------------------------------------------------------
# operations (records; descriptors are made by Graph.build)
# ---------------------------------------------------------------------------------------------


@dataclass
class _Op:
    kind: str
    name: str
    inputs: dict[str, Tensor]
    outputs: dict[str, Tensor]
    params: dict[str, Any] = field(default_factory=dict)

    def key(self) -> tuple:
        return (self.kind, tuple(sorted((k, t._index) for k, t in self.inputs.items())),
                tuple(sorted((k, t._index) for k, t in self.outputs.items())),
                tuple(sorted((k, _hashable(v)) for k, v in self.params.items())))


def _hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, np.dtype):
        return value.name
    return value


_POINTWISE = {
    "add": G.PointwiseMode.ADD, "sub": G.PointwiseMode.SUB, "mul": G.PointwiseMode.MUL,
    "div": G.PointwiseMode.DIV, "max": G.PointwiseMode.MAX, "min": G.PointwiseMode.MIN,
    "add_square": G.PointwiseMode.ADD_SQUARE, "cmp_gt": G.PointwiseMode.CMP_GT,
    "cmp_eq": G.PointwiseMode.CMP_EQ, "cmp_neq": G.PointwiseMode.CMP_NEQ, "cmp_ge": G.PointwiseMode.CMP_GE,
    "cmp_lt": G.PointwiseMode.CMP_LT, "cmp_le": G.PointwiseMode.CMP_LE, "logical_and": G.PointwiseMode.LOGICAL_AND,
    "gen_index": G.PointwiseMode.GEN_INDEX, "binary_select": G.PointwiseMode.BINARY_SELECT,
    "sqrt": G.PointwiseMode.SQRT, "rsqrt": G.PointwiseMode.RSQRT, "exp": G.PointwiseMode.EXP,
    "log": G.PointwiseMode.LOG, "neg": G.PointwiseMode.NEG, "abs": G.PointwiseMode.ABS,
    "reciprocal": G.PointwiseMode.RECIPROCAL, "identity": G.PointwiseMode.IDENTITY,
    "relu": G.PointwiseMode.RELU_FWD, "tanh": G.PointwiseMode.TANH_FWD, "sigmoid": G.PointwiseMode.SIGMOID_FWD,
    "elu": G.PointwiseMode.ELU_FWD, "gelu": G.PointwiseMode.GELU_FWD, "softplus": G.PointwiseMode.SOFTPLUS_FWD,
    "swish": G.PointwiseMode.SWISH_FWD, "gelu_tanh": G.PointwiseMode.GELU_APPROX_TANH_FWD,
    "relu_backward": G.PointwiseMode.RELU_BWD, "tanh_backward": G.PointwiseMode.TANH_BWD,
    "sigmoid_backward": G.PointwiseMode.SIGMOID_BWD, "elu_backward": G.PointwiseMode.ELU_BWD,
    "gelu_backward": G.PointwiseMode.GELU_BWD, "softplus_backward": G.PointwiseMode.SOFTPLUS_BWD,
    "swish_backward": G.PointwiseMode.SWISH_BWD, "gelu_tanh_backward": G.PointwiseMode.GELU_APPROX_TANH_BWD,
}
_COMPARE = frozenset({"cmp_gt", "cmp_eq", "cmp_neq", "cmp_ge", "cmp_lt", "cmp_le", "logical_and"})
_BINARY = frozenset({"add", "sub", "mul", "div", "max", "min", "add_square"}) | _COMPARE
_BACKWARD = frozenset(k for k in _POINTWISE if k.endswith("_backward"))
_REDUCE = {"add": G.ReduceTensorOp.ADD, "mul": G.ReduceTensorOp.MUL, "min": G.ReduceTensorOp.MIN,
           "max": G.ReduceTensorOp.MAX}
_RESAMPLE = {"max": G.ResampleMode.MAXPOOL, "avg": G.ResampleMode.AVGPOOL_EXCLUDE_PADDING,
             "avg_include_pad": G.ResampleMode.AVGPOOL_INCLUDE_PADDING}
_HEUR = {"a": G.HeurMode.A, "b": G.HeurMode.B, "fallback": G.HeurMode.FALLBACK, "instant": G.HeurMode.INSTANT}


def _spatial(value: Any, n: int, what: str, name: str, minimum: int) -> tuple[int, ...]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (int(value),) * n
    try:
        out = tuple(value)
    except TypeError:
        raise ArgumentTypeError(f"{what}: {name} must be an int or {n} ints, got {value!r}") from None
    if len(out) != n or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in out):
        raise ArgumentTypeError(f"{what}: {name} must be an int or {n} ints, got {value!r}")
    if any(v < minimum for v in out):
        raise ValueError(f"{what}: {name} must be >= {minimum}, got {out!r}")
    return tuple(int(v) for v in out)


def _padding(value: Any, n: int, what: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(pre, post) per spatial axis from an int, n ints (symmetric) or n (pre, post) pairs."""
    if isinstance(value, (list, tuple)) and len(value) == n and all(isinstance(v, (list, tuple)) for v in value):
        pairs = [_spatial(v, 2, what, "padding pair", 0) for v in value]
        return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    pad = _spatial(value, n, what, "padding", 0)
    return pad, pad


# ---------------------------------------------------------------------------------------------
# the graph
# ---------------------------------------------------------------------------------------------


class Graph:
    """A cuDNN operation graph under construction; :meth:`build` turns it into a cached :class:`Plan`.

    Parameters
    ----------
    io_dtype:
        dtype of tensors kept in memory when not given (float32, float16, bfloat16, ...).
    compute_dtype:
        math precision of every operation (float32 unless you know the engine takes another).
    intermediate_dtype:
        dtype of virtual tensors; default ``compute_dtype``.
    layout:
        default layout of rank >= 4 tensors: ``"NHWC"`` (channels-last, Keras' default and what the
        fused engines need) or ``"NCHW"``.
    name:
        used in errors and reprs.
    """

    def __init__(self, io_dtype: Any = "float32", compute_dtype: Any = "float32", intermediate_dtype: Any = None,
                 *, layout: str = "NHWC", name: str = "graph") -> None:
        self.io_dtype = _dtype(io_dtype, "Graph: io_dtype")
        self.compute_dtype = _dtype(compute_dtype, "Graph: compute_dtype")
        self.intermediate_dtype = (self.compute_dtype if intermediate_dtype is None
                                   else _dtype(intermediate_dtype, "Graph: intermediate_dtype"))
        self.layout = _layout(layout, "Graph")
        if not isinstance(name, str):
            raise ArgumentTypeError(f"Graph: name must be a str, got {name!r}")
        self.name = name
        self._token = object()
        self._tensors: list[Tensor] = []
        self._ops: list[_Op] = []
        self._counter = itertools.count()

    # ------------------------------------------------------------------ tensors
    def tensor(self, name: str, shape: Sequence[int], dtype: Any = None, *, layout: str | None = None,
               strides: Sequence[int] | None = None, alignment: int = _DEFAULT_ALIGNMENT) -> Tensor:
        """An input (or in-place output) tensor kept in memory, bound by ``name`` at execution.

        ``shape`` in the layout's axis order; ``layout`` defaults to the graph's for rank >= 4 and is
        ignored below (row-major); ``strides`` in elements in the same order (default packed);
        ``dtype`` defaults to ``io_dtype``; ``alignment`` is the byte alignment the pointer will have.
        """
        what = f"Graph.tensor {name!r}"
        if not isinstance(name, str) or not name:
            raise ArgumentTypeError(f"Graph.tensor: name must be a non-empty str, got {name!r}")
        if any(t.name == name and not t.virtual for t in self._tensors):
            raise ValueError(f"{what}: the graph already has a tensor named {name!r}")
        if not isinstance(shape, (list, tuple)) or not 1 <= len(shape) <= 8:
            raise ArgumentTypeError(f"{what}: shape must be a tuple of 1 to 8 positive ints, got {shape!r}")
        shape_t = _spatial(shape, len(shape), what, "shape", 1)
        lay = _layout(layout, what) if layout is not None else self.layout
        lay = lay if len(shape_t) >= 4 or (layout is not None and len(shape_t) >= 3) else None
        dims = _to_dims(shape_t, lay)
        if strides is None:
            order = _channels_last_order(len(dims)) if lay == "NHWC" else tuple(range(len(dims)))
            dim_strides = _packed(dims, order)
        else:
            st = _spatial(strides, len(shape_t), what, "strides", 1)
            dim_strides = _to_dims(st, lay)
        dt = _dtype(dtype, what) if dtype is not None else self.io_dtype
        if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < dt.itemsize \
                or alignment & (alignment - 1):
            raise ValueError(f"{what}: alignment must be a power of two >= the item size {dt.itemsize}, "
                             f"got {alignment!r}")
        return self._add_tensor(name, dims, dim_strides, dt, virtual=False, layout=lay, alignment=alignment)

    def scalar(self, value: float | int, dtype: Any = "float32", *, like: Tensor | None = None) -> Tensor:
        """A by-value scalar (kept on the host, passed at execution): epsilon, momentum, a constant factor.

        ``like``: give it that tensor's rank (all ones), as binary pointwise operations need.
        """
        dt = _dtype(dtype, "Graph.scalar")
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            raise ArgumentTypeError(f"Graph.scalar: value must be a number, got {value!r}")
        rank = len(like.dims) if like is not None else 1
        dims = (1,) * rank
        index = next(self._counter)
        t = Tensor(self._token, index, f"scalar_{index}", dims, dims, dt, virtual=False, layout=None,
                   value=np.array(value, dtype=dt), alignment=dt.itemsize)
        self._tensors.append(t)
        return t

    def _add_tensor(self, name: str, dims: tuple[int, ...], strides: tuple[int, ...], dtype: np.dtype | None,
                    *, virtual: bool, layout: str | None, alignment: int = _DEFAULT_ALIGNMENT,
                    producer: str = "") -> Tensor:
        t = Tensor(self._token, next(self._counter), name, tuple(dims), tuple(strides), dtype, virtual=virtual,
                   layout=layout, alignment=alignment, producer=producer)
        self._tensors.append(t)
        return t

    def _virtual(self, op_name: str, role: str, dims: tuple[int, ...], like: Tensor | None,
                 dtype: np.dtype | None = None) -> Tensor:
        """An operation's result: strides follow ``like``'s layout (channels-last or not)."""
        channels_last = like is not None and _is_channels_last(like)
        order = _channels_last_order(len(dims)) if channels_last and len(dims) >= 3 else tuple(range(len(dims)))
        layout = like.layout if like is not None and len(dims) == len(like.dims) else (
            "NHWC" if channels_last and len(dims) >= 4 else None)
        return self._add_tensor(f"{op_name}.{role}", dims, _packed(dims, order), dtype, virtual=True,
                                layout=layout, producer=op_name)

    def _per_channel(self, op_name: str, role: str, like: Tensor) -> Tensor:
        dims = (1, like.dims[1], *([1] * (len(like.dims) - 2)))
        return self._add_tensor(f"{op_name}.{role}", dims, _packed(dims, _channels_last_order(len(dims))), _F32,
                                virtual=True, layout=like.layout, producer=op_name)

    def _check(self, t: Any, what: str, name: str) -> Tensor:
        if not isinstance(t, Tensor):
            raise ArgumentTypeError(f"{what}: {name} must be a Tensor of this graph, got {type(t).__name__}")
        if t._owner is not self._token:
            raise ValueError(f"{what}: {name} {t.name!r} belongs to another Graph")
        return t

    def _op(self, kind: str, name: str | None, inputs: dict, params: dict | None = None) -> _Op:
        op_name = name if name is not None else f"{kind}_{len(self._ops)}"
        if not isinstance(op_name, str):
            raise ArgumentTypeError(f"Graph.{kind}: name must be a str, got {name!r}")
        op = _Op(kind, op_name, {k: v for k, v in inputs.items() if v is not None}, {}, dict(params or {}))
        return op

    def _commit(self, op: _Op, **outputs: Tensor) -> None:
        op.outputs.update(outputs)
        self._ops.append(op)

    # ------------------------------------------------------------------ convolutions
    def conv_fprop(self, x: Tensor, w: Tensor, *, padding: Any = 0, stride: Any = 1, dilation: Any = 1,
                   compute_dtype: Any = None, name: str | None = None) -> Tensor:
        """Cross-correlation ``y = conv(x, w)``; x ``(N, H, W, C)``, w ``(K, R, S, C/groups)`` (NHWC) -> y ``(N, H', W', K)``.

        ``padding``: int, one int per spatial axis, or ``(pre, post)`` pairs; groups = C / w's C.
        """
        what = f"conv_fprop {name or ''}".strip()
        x, w = self._check(x, what, "x"), self._check(w, what, "w")
        params = self._conv_params(x.dims, w.dims, padding, stride, dilation, compute_dtype, what, "x", "w")
        out_sp = _conv_out(x.dims[2:], w.dims[2:], params, what)
        op = self._op("conv_fprop", name, {"x": x, "w": w}, params)
        y = self._virtual(op.name, "y", (x.dims[0], w.dims[0], *out_sp), x)
        self._commit(op, y=y)
        return y

    def conv_dgrad(self, dy: Tensor, w: Tensor, x_shape: Sequence[int], *, padding: Any = 0, stride: Any = 1,
                   dilation: Any = 1, compute_dtype: Any = None, name: str | None = None) -> Tensor:
        """Data gradient ``dx`` of :meth:`conv_fprop`; ``x_shape`` is x's shape in dy's layout order."""
        what = f"conv_dgrad {name or ''}".strip()
        dy, w = self._check(dy, what, "dy"), self._check(w, what, "w")
        x_dims = _to_dims(_spatial(x_shape, len(dy.dims), what, "x_shape", 1), dy.layout)
        params = self._conv_params(x_dims, w.dims, padding, stride, dilation, compute_dtype, what, "x_shape", "w")
        out_sp = _conv_out(x_dims[2:], w.dims[2:], params, what)
        expect = (x_dims[0], w.dims[0], *out_sp)
        if tuple(dy.dims) != expect:
            raise ValueError(f"{what}: dy must have shape {_from_dims(expect, dy.layout)} for x_shape "
                             f"{tuple(x_shape)} and w {w.shape}, got {dy.shape}")
        op = self._op("conv_dgrad", name, {"dy": dy, "w": w}, params)
        dx = self._virtual(op.name, "dx", x_dims, dy)
        self._commit(op, dx=dx)
        return dx

    def conv_wgrad(self, x: Tensor, dy: Tensor, w_shape: Sequence[int], *, padding: Any = 0, stride: Any = 1,
                   dilation: Any = 1, compute_dtype: Any = None, name: str | None = None) -> Tensor:
        """Filter gradient ``dw`` of :meth:`conv_fprop`; ``w_shape`` in x's layout order ((K, R, S, C) for NHWC)."""
        what = f"conv_wgrad {name or ''}".strip()
        x, dy = self._check(x, what, "x"), self._check(dy, what, "dy")
        w_dims = _to_dims(_spatial(w_shape, len(x.dims), what, "w_shape", 1), x.layout)
        params = self._conv_params(x.dims, w_dims, padding, stride, dilation, compute_dtype, what, "x", "w_shape")
        out_sp = _conv_out(x.dims[2:], w_dims[2:], params, what)
        expect = (x.dims[0], w_dims[0], *out_sp)
        if tuple(dy.dims) != expect:
            raise ValueError(f"{what}: dy must have shape {_from_dims(expect, dy.layout)} for x {x.shape} and "
                             f"w_shape {tuple(w_shape)}, got {dy.shape}")
        op = self._op("conv_wgrad", name, {"x": x, "dy": dy}, params)
        dw = self._virtual(op.name, "dw", w_dims, x)
        self._commit(op, dw=dw)
        return dw

    def _conv_params(self, x_dims, w_dims, padding, stride, dilation, compute_dtype, what, xn, wn) -> dict:
        if len(x_dims) < 3 or len(x_dims) != len(w_dims):
            raise ValueError(f"{what}: {xn} and {wn} must have the same rank (3 to 8), got {len(x_dims)} and "
                             f"{len(w_dims)}")
        n = len(x_dims) - 2
        c, wc, k = x_dims[1], w_dims[1], w_dims[0]
        if c % wc or k % (c // wc):
            raise ValueError(f"{what}: channels of {xn} ({c}) must be a multiple of the filter's ({wc}), and the "
                             f"filter count ({k}) a multiple of the groups ({c // wc if c % wc == 0 else '?'})")
        pre, post = _padding(padding, n, what)
        return {"pre": pre, "post": post, "stride": _spatial(stride, n, what, "stride", 1),
                "dilation": _spatial(dilation, n, what, "dilation", 1),
                "compute": self._compute(compute_dtype, what)}

    def _compute(self, compute_dtype: Any, what: str) -> np.dtype:
        return self.compute_dtype if compute_dtype is None else _dtype(compute_dtype, f"{what}: compute_dtype")

    # ------------------------------------------------------------------ matmul
    def matmul(self, a: Tensor, b: Tensor, *, compute_dtype: Any = None, name: str | None = None) -> Tensor:
        """``c = a @ b``: a ``(..., M, K)``, b ``(..., K, N)`` of rank 2 to 4 (batch axes equal, or 1 in one
        operand) -> c ``(..., M, N)``, row-major. Operands are taken in cuDNN's dims order with their
        strides, so a transposed view (strides swapped) multiplies without a copy."""
        what = f"matmul {name or ''}".strip()
        a, b = self._check(a, what, "a"), self._check(b, what, "b")
        if len(a.dims) not in (2, 3, 4) or len(a.dims) != len(b.dims):
            raise ValueError(f"{what}: a and b must both have rank 2, 3 or 4, got {a.shape} and {b.shape}")
        if a.dims[-1] != b.dims[-2]:
            raise ValueError(f"{what}: a's columns ({a.dims[-1]}) must equal b's rows ({b.dims[-2]}): "
                             f"a {a.shape}, b {b.shape}")
        batch = []
        for p, q in zip(a.dims[:-2], b.dims[:-2]):
            if p != q and 1 not in (p, q):
                raise ValueError(f"{what}: batch sizes {a.dims[:-2]} and {b.dims[:-2]} must match (or one be 1)")
            batch.append(max(p, q))
        op = self._op("matmul", name, {"a": a, "b": b}, {"compute": self._compute(compute_dtype, what)})
        c = self._virtual(op.name, "c", (*batch, a.dims[-2], b.dims[-1]), None)
        self._commit(op, c=c)
        return c

    def reshape(self, x: Tensor, shape: Sequence[int], strides: Sequence[int], *, dtype: Any = None,
                name: str | None = None) -> Tensor:
        """A view of ``x`` with other dims and strides (cuDNN's reshape operation; both in cuDNN's dims order,
        same element count): e.g. the transpose of a virtual score matrix for the next matmul."""
        what = f"reshape {name or ''}".strip()
        x = self._check(x, what, "x")
        dims = _spatial(shape, len(shape), what, "shape", 1)
        st = _spatial(strides, len(dims), what, "strides", 1)
        if int(np.prod(dims)) != int(np.prod(x.dims)):
            raise ValueError(f"{what}: shape {dims} has {int(np.prod(dims))} elements, x {x.dims} has "
                             f"{int(np.prod(x.dims))}")
        op = self._op("reshape", name, {"x": x})
        y = self._add_tensor(f"{op.name}.y", dims, st, None if dtype is None else _dtype(dtype, what),
                             virtual=True, layout=None, producer=op.name)
        self._commit(op, y=y)
        return y

    # ------------------------------------------------------------------ pointwise
    def pointwise(self, mode: str, x: Tensor, b: Tensor | None = None, *, t: Tensor | None = None,
                  axis: int | None = None, dtype: Any = None, compute_dtype: Any = None,
                  name: str | None = None, **params: float) -> Tensor:
        """One pointwise operation by name (see :data:`POINTWISE_MODES`).

        Binary modes broadcast: same rank, each axis equal or 1 in one operand. Backward modes
        (``relu_backward``, ...) take ``(dy, x)`` and return ``dx``. Parameters: ``lower_clip``,
        ``upper_clip``, ``lower_clip_slope`` (relu), ``alpha`` (elu), ``beta`` (softplus, swish);
        binary modes take ``alpha1``/``alpha2``, cuDNN's operand scales (``add`` with ``alpha2=-1``
        is ``x - b``, the form cuDNN's DgradDreluBNBwdWeight pattern matches).

        ``gen_index`` takes ``axis`` (cuDNN's dims order) and gives each element its index along it;
        the comparisons (``cmp_*``, ``logical_and``) give booleans; ``binary_select`` is
        ``t ? x : b`` with the predicate ``t``. ``dtype`` sets the result's dtype (default: the
        graph's intermediate dtype when virtual), e.g. ``"int32"`` for indices, ``"bool"`` for predicates.
        """
        what = f"pointwise {mode!r} {name or ''}".strip()
        if mode not in _POINTWISE:
            raise ValueError(f"Graph.pointwise: mode must be one of {sorted(_POINTWISE)}, got {mode!r}")
        allowed = {"relu": ("lower_clip", "upper_clip", "lower_clip_slope"),
                   "elu": ("alpha",), "softplus": ("beta",), "swish": ("beta",)}.get(mode.replace("_backward", ""), ())
        if mode in _BINARY:
            allowed = ("alpha1", "alpha2")
        if (mode == "binary_select") != (t is not None):
            raise ValueError(f"{what}: the predicate t is " + ("required" if t is None else "only for binary_select"))
        if (mode == "gen_index") != (axis is not None):
            raise ValueError(f"{what}: axis is " + ("required" if axis is None else "only for gen_index"))
        if axis is not None and (isinstance(axis, bool) or not isinstance(axis, (int, np.integer))
                                 or not 0 <= axis < len(x.dims)):
            raise ValueError(f"{what}: axis must be an int in [0, {len(x.dims)}), got {axis!r}")
        out_dtype = None if dtype is None else _dtype(dtype, f"{what}: dtype")
        if mode in _COMPARE and out_dtype is None:
            out_dtype = np.dtype(np.bool_)
        for key, value in params.items():
            if key not in allowed:
                raise ValueError(f"{what}: unknown parameter {key!r} (this mode takes {list(allowed) or 'none'})")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ArgumentTypeError(f"{what}: {key} must be a number, got {value!r}")
        x = self._check(x, what, "dy" if mode in _BACKWARD else "x")
        two = mode in _BINARY or mode in _BACKWARD or mode == "binary_select"
        if two and b is None:
            raise ValueError(f"{what}: needs a second operand ({'x' if mode in _BACKWARD else 'b'})")
        if not two and b is not None:
            raise ValueError(f"{what}: takes one operand, got a second one")
        dims = x.dims
        like = x
        if b is not None:
            b = self._check(b, what, "x" if mode in _BACKWARD else "b")
            if len(b.dims) != len(x.dims):
                raise ValueError(f"{what}: operands must have the same rank, got {x.shape} and {b.shape} "
                                 "(give scalars `like=` the other operand)")
            if any(p != q and 1 not in (p, q) for p, q in zip(x.dims, b.dims)):
                raise ValueError(f"{what}: shapes {x.shape} and {b.shape} do not broadcast")
            if mode in _BACKWARD and x.dims != b.dims:
                raise ValueError(f"{what}: dy and x must have the same shape, got {x.shape} and {b.shape}")
            dims = tuple(max(p, q) for p, q in zip(x.dims, b.dims))
            if dims != x.dims and dims == b.dims:
                like = b
        if t is not None:
            t = self._check(t, what, "t")
            if len(t.dims) != len(x.dims) or any(p != q and q != 1 for p, q in zip(dims, t.dims)):
                raise ValueError(f"{what}: the predicate {t.shape} must broadcast to {_from_dims(dims, x.layout)}")
        full = {"mode": mode, "compute": self._compute(compute_dtype, what), **{k: float(v) for k, v in params.items()}}
        if axis is not None:
            full["axis"] = int(axis)
        role_x, role_b = ("dy", "x") if mode in _BACKWARD else ("x", "b")
        op = self._op("pointwise", name if name is not None else f"{mode}_{len(self._ops)}",
                      {role_x: x, role_b: b, "t": t}, full)
        y = self._virtual(op.name, "dx" if mode in _BACKWARD else "y", dims, like, out_dtype)
        if like.dims == dims:
            y.dim_strides = like.dim_strides if not like.is_scalar else y.dim_strides
        self._commit(op, **{"dx" if mode in _BACKWARD else "y": y})
        return y

    def add(self, a: Tensor, b: Tensor, **kw: Any) -> Tensor:
        """``a + b`` (broadcasting: a bias ``(1, 1, 1, C)`` onto ``(N, H, W, C)``)."""
        return self.pointwise("add", a, b, **kw)

    def sub(self, a: Tensor, b: Tensor, **kw: Any) -> Tensor:
        """``a - b``."""
        return self.pointwise("sub", a, b, **kw)

    def mul(self, a: Tensor, b: Tensor, **kw: Any) -> Tensor:
        """``a * b``."""
        return self.pointwise("mul", a, b, **kw)

    def bias(self, x: Tensor, b: Tensor, **kw: Any) -> Tensor:
        """``x + b`` for a per-channel ``b`` (shape ``(1, 1, 1, C)`` in NHWC)."""
        return self.pointwise("add", x, b, **kw)

    def scale(self, x: Tensor, factor: float | Tensor, **kw: Any) -> Tensor:
        """``x * factor``: a per-channel tensor or a number (a by-value scalar of the compute dtype)."""
        if not isinstance(factor, Tensor):
            factor = self.scalar(factor, self.compute_dtype, like=x)
        return self.pointwise("mul", x, factor, **kw)

    def relu(self, x: Tensor, **kw: Any) -> Tensor:
        """``max(x, 0)`` (``lower_clip_slope=`` for leaky relu, ``upper_clip=`` for relu6)."""
        return self.pointwise("relu", x, **kw)

    def relu_backward(self, dy: Tensor, x: Tensor, **kw: Any) -> Tensor:
        """``dy * (x > 0)``: x is relu's input."""
        return self.pointwise("relu_backward", dy, x, **kw)

    def gelu(self, x: Tensor, **kw: Any) -> Tensor:
        """GELU with erf, ``x * Phi(x)``."""
        return self.pointwise("gelu", x, **kw)

    def gelu_backward(self, dy: Tensor, x: Tensor, **kw: Any) -> Tensor:
        """``dy * d gelu(x)/dx``: x is gelu's input."""
        return self.pointwise("gelu_backward", dy, x, **kw)

    def sigmoid(self, x: Tensor, **kw: Any) -> Tensor:
        """``1 / (1 + exp(-x))``."""
        return self.pointwise("sigmoid", x, **kw)

    def tanh(self, x: Tensor, **kw: Any) -> Tensor:
        """``tanh(x)``."""
        return self.pointwise("tanh", x, **kw)

    # ------------------------------------------------------------------ reductions and statistics
    def reduction(self, x: Tensor, axes: Iterable[int], op: str = "add", *, compute_dtype: Any = None,
                  name: str | None = None) -> Tensor:
        """Reduce ``x`` over ``axes`` (in x's layout order; kept with size 1) with ``op``: add, mul, min, max."""
        what = f"reduction {name or ''}".strip()
        x = self._check(x, what, "x")
        if op not in _REDUCE:
            raise ValueError(f"{what}: op must be one of {sorted(_REDUCE)}, got {op!r}")
        rank = len(x.dims)
        try:
            ax = sorted({int(a) % rank for a in axes})
        except (TypeError, ValueError):
            raise ArgumentTypeError(f"{what}: axes must be ints, got {axes!r}") from None
        if not ax:
            raise ValueError(f"{what}: axes must name at least one axis of {x.shape}")
        shape = tuple(1 if i in ax else s for i, s in enumerate(x.shape))
        dims = _to_dims(shape, x.layout)
        o = self._op("reduction", name, {"x": x}, {"op": op, "compute": self._compute(compute_dtype, what)})
        y = self._virtual(o.name, "y", dims, x)
        self._commit(o, y=y)
        return y

    def genstats(self, x: Tensor, *, compute_dtype: Any = None, name: str | None = None) -> tuple[Tensor, Tensor]:
        """Per-channel ``(sum, sum of squares)`` of ``x`` over all but the channel axis (float32, ``(1, 1, 1, C)``)."""
        what = f"genstats {name or ''}".strip()
        x = self._check(x, what, "x")
        if len(x.dims) < 3:
            raise ValueError(f"{what}: x must have rank >= 3 (N, ..., C), got {x.shape}")
        op = self._op("genstats", name, {"x": x}, {"compute": self._compute(compute_dtype, what)})
        s, sq = self._per_channel(op.name, "sum", x), self._per_channel(op.name, "sq_sum", x)
        self._commit(op, sum=s, sq_sum=sq)
        return s, sq

    # ------------------------------------------------------------------ batch norm
    def _stats_args(self, what: str, x: Tensor, **tensors: Tensor | None) -> None:
        for role, t in tensors.items():
            if t is None:
                continue
            self._check(t, what, role)
            if t.dims != (1, x.dims[1], *([1] * (len(x.dims) - 2))):
                want = _from_dims((1, x.dims[1], *([1] * (len(x.dims) - 2))), x.layout)
                raise ValueError(f"{what}: {role} must have shape {want} (one value per channel), got {t.shape}")

    def batchnorm(self, x: Tensor, scale: Tensor, bias: Tensor, *, epsilon: float = 1e-3,
                  momentum: float | None = None, running_mean: Tensor | None = None,
                  running_var: Tensor | None = None, name: str | None = None) -> tuple[Tensor, ...]:
        """Batch norm, training: ``(y, mean, inv_variance, next_running_mean, next_running_var)``.

        Statistics over all axes but the channel one. With ``running_mean``/``running_var`` (and
        ``momentum``, cuDNN's exponential-average factor: ``new = (1 - m) * old + m * batch``) the next
        running statistics are outputs too; else the last two are None.
        """
        what = f"batchnorm {name or ''}".strip()
        x = self._check(x, what, "x")
        self._stats_args(what, x, scale=scale, bias=bias, running_mean=running_mean, running_var=running_var)
        has_running = running_mean is not None or running_var is not None
        if has_running and (running_mean is None or running_var is None or momentum is None):
            raise ValueError(f"{what}: running statistics need running_mean, running_var and momentum together")
        inputs = {"x": x, "scale": scale, "bias": bias, "epsilon": self._scalar_arg(epsilon, what, "epsilon")}
        if has_running:
            inputs.update(momentum=self._scalar_arg(momentum, what, "momentum"), running_mean=running_mean,
                          running_var=running_var)
        op = self._op("batchnorm", name, inputs, {"compute": self.compute_dtype})
        outs = {"y": self._virtual(op.name, "y", x.dims, x), "mean": self._per_channel(op.name, "mean", x),
                "inv_variance": self._per_channel(op.name, "inv_variance", x)}
        if has_running:
            outs.update(next_running_mean=self._per_channel(op.name, "next_running_mean", x),
                        next_running_var=self._per_channel(op.name, "next_running_var", x))
        self._commit(op, **outs)
        return (outs["y"], outs["mean"], outs["inv_variance"], outs.get("next_running_mean"),
                outs.get("next_running_var"))

    def batchnorm_inference(self, x: Tensor, mean: Tensor, inv_variance: Tensor, scale: Tensor, bias: Tensor,
                            *, name: str | None = None) -> Tensor:
        """``(x - mean) * inv_variance * scale + bias`` as four fused pointwise operations."""
        what = f"batchnorm_inference {name or ''}".strip()
        x = self._check(x, what, "x")
        self._stats_args(what, x, mean=mean, inv_variance=inv_variance, scale=scale, bias=bias)
        base = name or f"batchnorm_inference_{len(self._ops)}"
        centred = self.sub(x, mean, name=f"{base}.sub")
        normed = self.mul(centred, inv_variance, name=f"{base}.mul_inv_std")
        return self.add(self.mul(normed, scale, name=f"{base}.mul_scale"), bias, name=f"{base}.add_bias")

    def batchnorm_backward(self, dy: Tensor, x: Tensor, scale: Tensor, mean: Tensor, inv_variance: Tensor, *,
                           name: str | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """``(dx, dscale, dbias)`` of batch norm training, from the forward's saved mean and inverse std."""
        what = f"batchnorm_backward {name or ''}".strip()
        dy, x = self._check(dy, what, "dy"), self._check(x, what, "x")
        if dy.dims != x.dims:
            raise ValueError(f"{what}: dy and x must have the same shape, got {dy.shape} and {x.shape}")
        self._stats_args(what, x, scale=scale, mean=mean, inv_variance=inv_variance)
        op = self._op("batchnorm_backward", name, {"dy": dy, "x": x, "scale": scale, "mean": mean,
                                                   "inv_variance": inv_variance}, {"compute": self.compute_dtype})
        dx = self._virtual(op.name, "dx", x.dims, x)
        ds, db = self._per_channel(op.name, "dscale", x), self._per_channel(op.name, "dbias", x)
        self._commit(op, dx=dx, dscale=ds, dbias=db)
        return dx, ds, db

    def bn_finalize(self, sum: Tensor, sq_sum: Tensor, scale: Tensor, bias: Tensor, *, accum_count: int,
                    epsilon: float = 1e-3, momentum: float = 0.1, running_mean: Tensor | None = None,
                    running_var: Tensor | None = None, name: str | None = None) -> tuple[Tensor, ...]:
        """Batch-norm statistics from :meth:`genstats` sums: ``(eq_scale, eq_bias, mean, inv_std,
        next_running_mean, next_running_var)`` (the last two None without running statistics).

        ``accum_count`` is how many values each channel's sums cover (N*H*W); ``y = x * eq_scale +
        eq_bias`` applies the normalisation (MLPerf ResNet's scale-bias-relu prologue).
        """
        what = f"bn_finalize {name or ''}".strip()
        s = self._check(sum, what, "sum")
        if len(s.dims) < 3 or any(d != 1 for i, d in enumerate(s.dims) if i != 1):
            raise ValueError(f"{what}: sum must be per-channel ((1, 1, 1, C) in NHWC), got {s.shape}")
        self._stats_args(what, s, sq_sum=sq_sum, scale=scale, bias=bias, running_mean=running_mean,
                         running_var=running_var)
        if (running_mean is None) != (running_var is None):
            raise ValueError(f"{what}: give both running_mean and running_var, or neither")
        if isinstance(accum_count, bool) or not isinstance(accum_count, (int, np.integer)) or accum_count < 1:
            raise ValueError(f"{what}: accum_count must be a positive int (N*H*W), got {accum_count!r}")
        inputs = {"sum": s, "sq_sum": sq_sum, "scale": scale, "bias": bias,
                  "epsilon": self._scalar_arg(epsilon, what, "epsilon"),
                  "momentum": self._scalar_arg(momentum, what, "momentum"),
                  "accum_count": self.scalar(int(accum_count), "int64"),
                  "running_mean": running_mean, "running_var": running_var}
        op = self._op("bn_finalize", name, inputs, {"compute": self.compute_dtype})
        roles = ["eq_scale", "eq_bias", "mean", "inv_std"]
        if running_mean is not None:
            roles += ["next_running_mean", "next_running_var"]
        outs = {r: self._per_channel(op.name, r, s) for r in roles}
        self._commit(op, **outs)
        return (outs["eq_scale"], outs["eq_bias"], outs["mean"], outs["inv_std"], outs.get("next_running_mean"),
                outs.get("next_running_var"))

    def dbn_weight(self, dy: Tensor, x: Tensor, mean: Tensor, inv_variance: Tensor, scale: Tensor, *,
                   name: str | None = None) -> tuple[Tensor, ...]:
        """Batch-norm weight gradients and the equivalent dx terms: ``(dscale, dbias, eq_scale_dy, eq_scale_x,
        eq_bias)``, with ``dx = eq_scale_dy * dy + eq_scale_x * x + eq_bias`` (the backward of the
        genstats / bn_finalize / scale-bias split).

        cuDNN has no engine for this operation alone: it runs inside the DgradDreluBNBwdWeight fusion
        (MLPerf ResNet's backward), which :meth:`dgrad_drelu_dbn_weight` builds.
        """
        what = f"dbn_weight {name or ''}".strip()
        dy, x = self._check(dy, what, "dy"), self._check(x, what, "x")
        if dy.dims != x.dims:
            raise ValueError(f"{what}: dy and x must have the same shape, got {dy.shape} and {x.shape}")
        self._stats_args(what, x, mean=mean, inv_variance=inv_variance, scale=scale)
        op = self._op("dbn_weight", name, {"dy": dy, "x": x, "mean": mean, "inv_variance": inv_variance,
                                           "scale": scale}, {"compute": self.compute_dtype})
        roles = ["dscale", "dbias", "eq_scale_dy", "eq_scale_x", "eq_bias"]
        outs = {r: self._per_channel(op.name, r, x) for r in roles}
        self._commit(op, **outs)
        return tuple(outs[r] for r in roles)

    def dgrad_drelu_dbn_weight(self, dy: Tensor, w: Tensor, x: Tensor, mean: Tensor, inv_variance: Tensor,
                               scale: Tensor, bias: Tensor, *, padding: Any = 0, stride: Any = 1,
                               dilation: Any = 1, name: str | None = None) -> tuple[Tensor, ...]:
        """The backward of ``conv(relu(batchnorm(x)))`` up to the batch-norm weights, as one cuDNN fusion.

        ``dy`` is the convolution's output gradient ``(N, H', W', K)``, ``w`` its filter ``(K, R, S, C)``,
        ``x`` the batch norm's input ``(N, H, W, C)``; ``mean``/``inv_variance``/``scale``/``bias`` are
        float32 ``(1, 1, 1, C)`` (the forward's saved statistics and parameters). Returns ``(dz, dscale,
        dbias, eq_scale_dy, eq_scale_x, eq_bias)``: ``dz`` is the gradient at the relu's input (call
        ``.output`` on it: cuDNN's pattern writes it), and the batch norm's ``dx = eq_scale_dy * dz +
        eq_scale_x * x + eq_bias``. The graph is cuDNN's DgradDreluBNBwdWeight pattern as cudnn-frontend
        builds it: conv_dgrad, the batch-norm output recomputed by four pointwise operations (``x - mean``
        as an add with ``alpha2=-1``), relu_backward, dbn_weight.
        """
        what = f"dgrad_drelu_dbn_weight {name or ''}".strip()
        dy, w, x = self._check(dy, what, "dy"), self._check(w, what, "w"), self._check(x, what, "x")
        self._stats_args(what, x, mean=mean, inv_variance=inv_variance, scale=scale, bias=bias)
        base = name or f"dgrad_drelu_dbn_weight_{len(self._ops)}"
        dconv = self.conv_dgrad(dy, w, x.shape, padding=padding, stride=stride, dilation=dilation,
                                name=f"{base}.dgrad")
        centred = self.pointwise("add", x, mean, alpha2=-1.0, name=f"{base}.sub_mean")
        normed = self.mul(centred, inv_variance, name=f"{base}.mul_inv_std")
        bn = self.add(self.mul(normed, scale, name=f"{base}.mul_scale"), bias, name=f"{base}.add_bias")
        dz = self.relu_backward(dconv, bn, name=f"{base}.drelu")
        return (dz, *self.dbn_weight(dz, x, mean, inv_variance, scale, name=f"{base}.dbn_weight"))

    def _scalar_arg(self, value: Any, what: str, name: str) -> Tensor:
        if isinstance(value, Tensor):
            return self._check(value, what, name)
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
            raise ArgumentTypeError(f"{what}: {name} must be a number, got {value!r}")
        return self.scalar(float(value), "float32")

    # ------------------------------------------------------------------ resample (pooling)
    def resample(self, x: Tensor, *, mode: str = "max", window: Any = 2, stride: Any = None, padding: Any = 0,
                 return_index: bool = False, compute_dtype: Any = None,
                 name: str | None = None) -> "Tensor | tuple[Tensor, Tensor]":
        """Pooling forward: ``mode`` max, avg (padding excluded from the divisor) or avg_include_pad.

        ``stride`` defaults to ``window``. With ``return_index`` (max only) also returns the int8
        index tensor :meth:`resample_backward` takes. :meth:`build` refuses a bfloat16 forward without
        the index (GraphNotSupportedError): cuDNN 9.19's engine for it reads bf16 as float32.
        """
        what = f"resample {name or ''}".strip()
        x = self._check(x, what, "x")
        params = self._pool_params(x, mode, window, stride, padding, compute_dtype, what)
        if return_index and mode != "max":
            raise ValueError(f"{what}: return_index needs mode='max', got {mode!r}")
        out_sp = _pool_out(x.dims[2:], params, what)
        op = self._op("resample_fwd", name, {"x": x}, params)
        y = self._virtual(op.name, "y", (x.dims[0], x.dims[1], *out_sp), x)
        outs = {"y": y}
        if return_index:
            outs["index"] = self._virtual(op.name, "index", y.dims, x, np.dtype(np.int8))
        self._commit(op, **outs)
        return (y, outs["index"]) if return_index else y

    def resample_backward(self, dy: Tensor, *, x: Tensor | None = None, y: Tensor | None = None,
                          index: Tensor | None = None, mode: str = "max", window: Any = 2, stride: Any = None,
                          padding: Any = 0, x_shape: Sequence[int] | None = None, compute_dtype: Any = None,
                          name: str | None = None) -> Tensor:
        """Pooling backward ``dx``: give ``index`` (max pooling, from :meth:`resample`) or the forward's ``x`` and ``y``."""
        what = f"resample_backward {name or ''}".strip()
        dy = self._check(dy, what, "dy")
        for role, t in (("x", x), ("y", y), ("index", index)):
            if t is not None:
                self._check(t, what, role)
        if x is not None:
            x_dims = x.dims
        elif x_shape is not None:
            x_dims = _to_dims(_spatial(x_shape, len(dy.dims), what, "x_shape", 1), dy.layout)
        else:
            raise ValueError(f"{what}: give x (the forward input) or x_shape")
        probe = Tensor(self._token, -1, "x", x_dims, x_dims, None, virtual=True, layout=dy.layout)
        params = self._pool_params(probe, mode, window, stride, padding, compute_dtype, what)
        out_sp = _pool_out(x_dims[2:], params, what)
        if dy.dims != (x_dims[0], x_dims[1], *out_sp):
            raise ValueError(f"{what}: dy must have shape {_from_dims((x_dims[0], x_dims[1], *out_sp), dy.layout)}"
                             f", got {dy.shape}")
        if mode == "max" and index is None and (x is None or y is None):
            raise ValueError(f"{what}: max pooling backward needs index=, or both x= and y=")
        op = self._op("resample_bwd", name, {"dy": dy, "x": x, "y": y, "index": index}, params)
        dx = self._virtual(op.name, "dx", x_dims, dy)
        self._commit(op, dx=dx)
        return dx

    def _pool_params(self, x: Tensor, mode: str, window: Any, stride: Any, padding: Any, compute_dtype: Any,
                     what: str) -> dict:
        if mode not in _RESAMPLE:
            raise ValueError(f"{what}: mode must be one of {sorted(_RESAMPLE)}, got {mode!r}")
        if len(x.dims) < 3:
            raise ValueError(f"{what}: x must have rank >= 3 (N, spatial..., C), got {x.shape}")
        n = len(x.dims) - 2
        win = _spatial(window, n, what, "window", 1)
        pre, post = _padding(padding, n, what)
        return {"mode": mode, "window": win, "stride": _spatial(win if stride is None else stride, n, what,
                                                                  "stride", 1),
                "pre": pre, "post": post, "compute": self._compute(compute_dtype, what)}

    # ------------------------------------------------------------------ build
    @property
    def tensors(self) -> tuple[Tensor, ...]:
        """Every tensor, in creation order."""
        return tuple(self._tensors)

    @property
    def operations(self) -> tuple[str, ...]:
        """Operation names in the order they were added."""
        return tuple(op.name for op in self._ops)

    def _resolve(self) -> list[Tensor]:
        """Validate what only the whole graph shows; resolve dtypes. Returns the tensors the plan binds."""
        what = f"Graph {self.name!r}"
        if not self._ops:
            raise ValueError(f"{what}: add at least one operation before build()")
        used = {id(t) for op in self._ops for t in (*op.inputs.values(), *op.outputs.values())}
        bound = [t for t in self._tensors if id(t) in used and not t.virtual]
        if not any(not t.virtual for op in self._ops for t in op.outputs.values()):
            raise ValueError(f"{what}: no operation result is an output; call .output(name) on the results "
                             "you want in memory")
        names: dict[str, Tensor] = {}
        for t in bound:
            if t.is_scalar:
                continue
            other = names.get(t.name)
            if other is not None and other is not t:
                raise ValueError(f"{what}: two tensors are named {t.name!r}; name outputs apart with .output(name)")
            names[t.name] = t
        for t in self._tensors:
            if t.dtype is None:
                t.dtype = self.intermediate_dtype if t.virtual else self.io_dtype
        return bound

    def _key(self, bound: list[Tensor]) -> tuple:
        tensors = tuple((t._index, t.dims, t.dim_strides, t.dtype.name, t.virtual, t.is_scalar, t.alignment)
                        for t in self._tensors)
        return tensors, tuple(op.key() for op in self._ops), tuple(t._index for t in bound)

    def build(self, handle: Handle | None = None, *, heuristics: Sequence[str] = ("A", "fallback"),
              allow_tf32: bool = True, cache: bool = True) -> "Plan":
        """Finalize the graph into an execution :class:`Plan` (cached by structure; see the module doc).

        ``handle``: a :class:`dnnbind.cudnn.Handle` (default: ``get_handle()`` of the current stream).
        ``heuristics``: modes tried in order ("A", "B", "instant", "fallback"); the first engine
        configuration whose plan finalizes wins. ``allow_tf32=False`` skips engines that run float32
        data on tensor cores (TF32) when every tensor in memory is float32.
        """
        modes = _heur_modes(heuristics)
        if not isinstance(allow_tf32, bool):
            raise ArgumentTypeError(f"Graph.build: allow_tf32 must be a bool, got {allow_tf32!r}")
        bound = self._resolve()
        _refuse_known_wrong(self)
        handle = require_handle(handle, "Graph.build") if handle is not None else get_handle()
        key = (handle.device, self._key(bound), modes, allow_tf32)
        core = _plan_cache_get(key) if cache else None
        if core is None:
            stream = handle.bound_stream
            stream = stream if isinstance(stream, cuda.Stream) else cuda.current_stream()
            if stream.is_capturing():
                raise RuntimeError(f"Graph {self.name!r}: build() found no cached plan while the stream is being "
                                   "captured; build (or execute once) before the capture, since finalizing a "
                                   "plan may compile and load kernels")
            core = _PlanCore.create(self, bound, handle, modes, allow_tf32)
            if cache:
                _plan_cache_put(key, core)
        return Plan(core, self, bound)

    def __repr__(self) -> str:
        return (f"Graph({self.name!r}, io={self.io_dtype.name}, compute={self.compute_dtype.name}, "
                f"{len(self._tensors)} tensors, operations={list(self.operations)})")


POINTWISE_MODES: tuple[str, ...] = tuple(sorted(_POINTWISE))
"""The names :meth:`Graph.pointwise` takes."""


def _layout(layout: Any, what: str) -> str:
    if not isinstance(layout, str) or layout.upper() not in ("NCHW", "NHWC"):
        raise ValueError(f"{what}: layout must be 'NCHW' or 'NHWC', got {layout!r}")
    return layout.upper()


def _is_channels_last(t: Tensor) -> bool:
    return t.layout == "NHWC" or (len(t.dims) >= 3 and t.dims[1] > 1 and t.dim_strides[1] == 1)


def _conv_out(sp: Sequence[int], r: Sequence[int], p: dict, what: str) -> tuple[int, ...]:
    out = []
    for i, (s, k) in enumerate(zip(sp, r)):
        span = s + p["pre"][i] + p["post"][i] - p["dilation"][i] * (k - 1) - 1
        if span < 0:
            raise ValueError(f"{what}: the filter (size {k}, dilation {p['dilation'][i]}) does not fit spatial axis "
                             f"{i} of size {s} with padding {p['pre'][i]}+{p['post'][i]}")
        out.append(span // p["stride"][i] + 1)
    return tuple(out)


def _pool_out(sp: Sequence[int], p: dict, what: str) -> tuple[int, ...]:
    out = []
    for i, s in enumerate(sp):
        span = s + p["pre"][i] + p["post"][i] - p["window"][i]
        if span < 0:
            raise ValueError(f"{what}: window {p['window'][i]} does not fit spatial axis {i} of size {s} with "
                             f"padding {p['pre'][i]}+{p['post'][i]}")
        out.append(span // p["stride"][i] + 1)
    return tuple(out)


def _heur_modes(heuristics: Any) -> tuple[G.HeurMode, ...]:
    if isinstance(heuristics, str):
        heuristics = (heuristics,)
    try:
        items = list(heuristics)
    except TypeError:
        raise ArgumentTypeError(f"Graph.build: heuristics must be a sequence of mode names, got {heuristics!r}") \
            from None
    modes = []
    for m in items:
        if not isinstance(m, str) or m.lower() not in _HEUR:
            raise ValueError(f"Graph.build: heuristics modes must be among {sorted(_HEUR)}, got {m!r}")
        modes.append(_HEUR[m.lower()])
    if not modes:
        raise ValueError("Graph.build: heuristics must name at least one mode")
    return tuple(modes)


# ---------------------------------------------------------------------------------------------
# descriptor construction
# ---------------------------------------------------------------------------------------------


def _tensor_descriptor(t: Tensor, uid: int) -> BackendDescriptor:
    d = BackendDescriptor(D.TENSOR, f"tensor {t.name!r}")
    d.set(A.TENSOR_DATA_TYPE, T.DATA_TYPE, _cudnn_dtype(t.dtype))
    d.set(A.TENSOR_DIMENSIONS, T.INT64, list(t.dims))
    d.set(A.TENSOR_STRIDES, T.INT64, list(t.dim_strides))
    d.set(A.TENSOR_UNIQUE_ID, T.INT64, uid)
    d.set(A.TENSOR_BYTE_ALIGNMENT, T.INT64, t.alignment)
    d.set(A.TENSOR_IS_VIRTUAL, T.BOOLEAN, t.virtual)
    if t.is_scalar:
        d.set(A.TENSOR_IS_BY_VALUE, T.BOOLEAN, True)
    return d.finalize()


def _pointwise_descriptor(mode: G.PointwiseMode, compute: np.dtype, params: dict, what: str) -> BackendDescriptor:
    pw = BackendDescriptor(D.POINTWISE, f"pointwise mode of {what}")
    pw.set(A.POINTWISE_MODE, T.POINTWISE_MODE, int(mode))
    pw.set(A.POINTWISE_MATH_PREC, T.DATA_TYPE, _cudnn_dtype(compute))
    if mode in (G.PointwiseMode.RELU_FWD, G.PointwiseMode.RELU_BWD):
        # What cudnn-frontend sets for relu: NaN propagation, clips, and an upper clip of at most
        # FLT_MAX (a larger double overflows float math).
        pw.set(A.POINTWISE_NAN_PROPAGATION, T.NAN_PROPOGATION, int(G.NanPropagation.PROPAGATE_NAN))
        pw.set(A.POINTWISE_RELU_LOWER_CLIP, T.DOUBLE, params.get("lower_clip", 0.0))
        pw.set(A.POINTWISE_RELU_UPPER_CLIP, T.DOUBLE, min(params.get("upper_clip", _FLT_MAX), _FLT_MAX))
        pw.set(A.POINTWISE_RELU_LOWER_CLIP_SLOPE, T.DOUBLE, params.get("lower_clip_slope", 0.0))
    elif mode in (G.PointwiseMode.ELU_FWD, G.PointwiseMode.ELU_BWD):
        pw.set(A.POINTWISE_ELU_ALPHA, T.DOUBLE, params.get("alpha", 1.0))
    elif mode in (G.PointwiseMode.SOFTPLUS_FWD, G.PointwiseMode.SOFTPLUS_BWD):
        pw.set(A.POINTWISE_SOFTPLUS_BETA, T.DOUBLE, params.get("beta", 1.0))
    elif mode in (G.PointwiseMode.SWISH_FWD, G.PointwiseMode.SWISH_BWD):
        pw.set(A.POINTWISE_SWISH_BETA, T.DOUBLE, params.get("beta", 1.0))
    elif mode == G.PointwiseMode.GEN_INDEX:
        pw.set(A.POINTWISE_AXIS, T.INT64, params["axis"])
    return pw.finalize()


def _op_descriptors(op: _Op, td: Mapping[int, BackendDescriptor]) -> BackendDescriptor:
    """The finalized operation descriptor of ``op``; ``td`` maps tensor indices to their descriptors."""
    what = f"{op.kind} {op.name!r}"
    p = op.params

    def t(role: str) -> BackendDescriptor:
        return td[(op.inputs.get(role) or op.outputs[role])._index]

    kind = op.kind
    if kind in ("conv_fprop", "conv_dgrad", "conv_wgrad"):
        conv = BackendDescriptor(D.CONVOLUTION, f"convolution of {what}")
        conv.set(A.CONVOLUTION_COMP_TYPE, T.DATA_TYPE, _cudnn_dtype(p["compute"]))
        conv.set(A.CONVOLUTION_CONV_MODE, T.CONVOLUTION_MODE, int(G.ConvolutionMode.CROSS_CORRELATION))
        conv.set(A.CONVOLUTION_SPATIAL_DIMS, T.INT64, len(p["stride"]))
        conv.set(A.CONVOLUTION_DILATIONS, T.INT64, list(p["dilation"]))
        conv.set(A.CONVOLUTION_FILTER_STRIDES, T.INT64, list(p["stride"]))
        conv.set(A.CONVOLUTION_PRE_PADDINGS, T.INT64, list(p["pre"]))
        conv.set(A.CONVOLUTION_POST_PADDINGS, T.INT64, list(p["post"]))
        conv.finalize()
        if kind == "conv_fprop":
            o = BackendDescriptor(D.OPERATION_CONVOLUTION_FORWARD, what)
            attrs = (A.OPERATION_CONVOLUTION_FORWARD_ALPHA, A.OPERATION_CONVOLUTION_FORWARD_BETA,
                     A.OPERATION_CONVOLUTION_FORWARD_CONV_DESC)
            tensors = ((A.OPERATION_CONVOLUTION_FORWARD_X, "x"), (A.OPERATION_CONVOLUTION_FORWARD_W, "w"),
                       (A.OPERATION_CONVOLUTION_FORWARD_Y, "y"))
        elif kind == "conv_dgrad":
            o = BackendDescriptor(D.OPERATION_CONVOLUTION_BACKWARD_DATA, what)
            attrs = (A.OPERATION_CONVOLUTION_BWD_DATA_ALPHA, A.OPERATION_CONVOLUTION_BWD_DATA_BETA,
                     A.OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC)
            tensors = ((A.OPERATION_CONVOLUTION_BWD_DATA_DY, "dy"), (A.OPERATION_CONVOLUTION_BWD_DATA_W, "w"),
                       (A.OPERATION_CONVOLUTION_BWD_DATA_DX, "dx"))
        else:
            o = BackendDescriptor(D.OPERATION_CONVOLUTION_BACKWARD_FILTER, what)
            attrs = (A.OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, A.OPERATION_CONVOLUTION_BWD_FILTER_BETA,
                     A.OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC)
            tensors = ((A.OPERATION_CONVOLUTION_BWD_FILTER_X, "x"), (A.OPERATION_CONVOLUTION_BWD_FILTER_DY, "dy"),
                       (A.OPERATION_CONVOLUTION_BWD_FILTER_DW, "dw"))
        o.set(attrs[0], T.FLOAT, 1.0)
        o.set(attrs[1], T.FLOAT, 0.0)
        o.set(attrs[2], T.BACKEND_DESCRIPTOR, conv)
        for attr, role in tensors:
            o.set(attr, T.BACKEND_DESCRIPTOR, t(role))
        return o.finalize()
    if kind == "pointwise":
        mode = _POINTWISE[p["mode"]]
        pw = _pointwise_descriptor(mode, p["compute"], p, what)
        o = BackendDescriptor(D.OPERATION_POINTWISE, what)
        o.set(A.OPERATION_POINTWISE_PW_DESCRIPTOR, T.BACKEND_DESCRIPTOR, pw)
        if p["mode"] in _BACKWARD:
            o.set(A.OPERATION_POINTWISE_XDESC, T.BACKEND_DESCRIPTOR, t("x"))
            o.set(A.OPERATION_POINTWISE_DYDESC, T.BACKEND_DESCRIPTOR, t("dy"))
            o.set(A.OPERATION_POINTWISE_DXDESC, T.BACKEND_DESCRIPTOR, t("dx"))
        else:
            o.set(A.OPERATION_POINTWISE_XDESC, T.BACKEND_DESCRIPTOR, t("x"))
            if "b" in op.inputs:
                o.set(A.OPERATION_POINTWISE_BDESC, T.BACKEND_DESCRIPTOR, t("b"))
            if "t" in op.inputs:
                o.set(A.OPERATION_POINTWISE_TDESC, T.BACKEND_DESCRIPTOR, t("t"))
            o.set(A.OPERATION_POINTWISE_YDESC, T.BACKEND_DESCRIPTOR, t("y"))
        # Only when given: an unset alpha is cuDNN's 1.0, and the header says to leave ALPHA2 unset for
        # one-input modes.
        for key, attr in (("alpha1", A.OPERATION_POINTWISE_ALPHA1), ("alpha2", A.OPERATION_POINTWISE_ALPHA2)):
            if key in p:
                o.set(attr, T.FLOAT, p[key])
        return o.finalize()
    if kind == "matmul":
        mm = BackendDescriptor(D.MATMUL, f"matmul of {what}")
        mm.set(A.MATMUL_COMP_TYPE, T.DATA_TYPE, _cudnn_dtype(p["compute"]))
        mm.finalize()
        o = BackendDescriptor(D.OPERATION_MATMUL, what)
        o.set(A.OPERATION_MATMUL_ADESC, T.BACKEND_DESCRIPTOR, t("a"))
        o.set(A.OPERATION_MATMUL_BDESC, T.BACKEND_DESCRIPTOR, t("b"))
        o.set(A.OPERATION_MATMUL_CDESC, T.BACKEND_DESCRIPTOR, t("c"))
        o.set(A.OPERATION_MATMUL_DESC, T.BACKEND_DESCRIPTOR, mm)
        return o.finalize()
    if kind == "reshape":
        o = BackendDescriptor(D.OPERATION_RESHAPE, what)
        o.set(A.OPERATION_RESHAPE_XDESC, T.BACKEND_DESCRIPTOR, t("x"))
        o.set(A.OPERATION_RESHAPE_YDESC, T.BACKEND_DESCRIPTOR, t("y"))
        return o.finalize()
    if kind == "reduction":
        rd = BackendDescriptor(D.REDUCTION, f"reduction of {what}")
        rd.set(A.REDUCTION_OPERATOR, T.REDUCTION_OPERATOR_TYPE, int(_REDUCE[p["op"]]))
        rd.set(A.REDUCTION_COMP_TYPE, T.DATA_TYPE, _cudnn_dtype(p["compute"]))
        rd.finalize()
        o = BackendDescriptor(D.OPERATION_REDUCTION, what)
        o.set(A.OPERATION_REDUCTION_XDESC, T.BACKEND_DESCRIPTOR, t("x"))
        o.set(A.OPERATION_REDUCTION_YDESC, T.BACKEND_DESCRIPTOR, t("y"))
        o.set(A.OPERATION_REDUCTION_DESC, T.BACKEND_DESCRIPTOR, rd)
        return o.finalize()
    if kind == "genstats":
        o = BackendDescriptor(D.OPERATION_GEN_STATS, what)
        o.set(A.OPERATION_GENSTATS_MODE, T.GENSTATS_MODE, int(G.GenStatsMode.SUM_SQSUM))
        o.set(A.OPERATION_GENSTATS_MATH_PREC, T.DATA_TYPE, _cudnn_dtype(p["compute"]))
        o.set(A.OPERATION_GENSTATS_XDESC, T.BACKEND_DESCRIPTOR, t("x"))
        o.set(A.OPERATION_GENSTATS_SUMDESC, T.BACKEND_DESCRIPTOR, t("sum"))
        o.set(A.OPERATION_GENSTATS_SQSUMDESC, T.BACKEND_DESCRIPTOR, t("sq_sum"))
        return o.finalize()
    if kind == "batchnorm":
        o = BackendDescriptor(D.OPERATION_NORM_FORWARD, what)
        o.set(A.OPERATION_NORM_FWD_MODE, T.NORM_MODE, int(G.NormMode.BATCH_NORM))
        o.set(A.OPERATION_NORM_FWD_PHASE, T.NORM_FWD_PHASE, int(G.NormFwdPhase.TRAINING))
        pairs = [(A.OPERATION_NORM_FWD_XDESC, "x"), (A.OPERATION_NORM_FWD_MEAN_DESC, "mean"),
                 (A.OPERATION_NORM_FWD_INV_VARIANCE_DESC, "inv_variance"), (A.OPERATION_NORM_FWD_SCALE_DESC, "scale"),
                 (A.OPERATION_NORM_FWD_BIAS_DESC, "bias"), (A.OPERATION_NORM_FWD_EPSILON_DESC, "epsilon")]
        if "running_mean" in op.inputs:
            pairs += [(A.OPERATION_NORM_FWD_EXP_AVG_FACTOR_DESC, "momentum"),
                      (A.OPERATION_NORM_FWD_INPUT_RUNNING_MEAN_DESC, "running_mean"),
                      (A.OPERATION_NORM_FWD_INPUT_RUNNING_VAR_DESC, "running_var"),
                      (A.OPERATION_NORM_FWD_OUTPUT_RUNNING_MEAN_DESC, "next_running_mean"),
                      (A.OPERATION_NORM_FWD_OUTPUT_RUNNING_VAR_DESC, "next_running_var")]
        pairs.append((A.OPERATION_NORM_FWD_YDESC, "y"))
        for attr, role in pairs:
            o.set(attr, T.BACKEND_DESCRIPTOR, t(role))
        return o.finalize()
    if kind == "batchnorm_backward":
        o = BackendDescriptor(D.OPERATION_NORM_BACKWARD, what)
        o.set(A.OPERATION_NORM_BWD_MODE, T.NORM_MODE, int(G.NormMode.BATCH_NORM))
        for attr, role in ((A.OPERATION_NORM_BWD_XDESC, "x"), (A.OPERATION_NORM_BWD_MEAN_DESC, "mean"),
                           (A.OPERATION_NORM_BWD_INV_VARIANCE_DESC, "inv_variance"),
                           (A.OPERATION_NORM_BWD_DYDESC, "dy"), (A.OPERATION_NORM_BWD_SCALE_DESC, "scale"),
                           (A.OPERATION_NORM_BWD_DSCALE_DESC, "dscale"), (A.OPERATION_NORM_BWD_DBIAS_DESC, "dbias"),
                           (A.OPERATION_NORM_BWD_DXDESC, "dx")):
            o.set(attr, T.BACKEND_DESCRIPTOR, t(role))
        return o.finalize()
    if kind == "bn_finalize":
        o = BackendDescriptor(D.OPERATION_BN_FINALIZE_STATISTICS, what)
        o.set(A.OPERATION_BN_FINALIZE_STATS_MODE, T.BN_FINALIZE_STATS_MODE, int(G.BnFinalizeStatsMode.TRAINING))
        o.set(A.OPERATION_BN_FINALIZE_MATH_PREC, T.DATA_TYPE, _cudnn_dtype(p["compute"]))
        pairs = [(A.OPERATION_BN_FINALIZE_Y_SUM_DESC, "sum"), (A.OPERATION_BN_FINALIZE_Y_SQ_SUM_DESC, "sq_sum"),
                 (A.OPERATION_BN_FINALIZE_SCALE_DESC, "scale"), (A.OPERATION_BN_FINALIZE_BIAS_DESC, "bias"),
                 (A.OPERATION_BN_FINALIZE_SAVED_MEAN_DESC, "mean"),
                 (A.OPERATION_BN_FINALIZE_SAVED_INV_STD_DESC, "inv_std"),
                 (A.OPERATION_BN_FINALIZE_EQ_SCALE_DESC, "eq_scale"), (A.OPERATION_BN_FINALIZE_EQ_BIAS_DESC, "eq_bias"),
                 (A.OPERATION_BN_FINALIZE_ACCUM_COUNT_DESC, "accum_count"),
                 (A.OPERATION_BN_FINALIZE_EPSILON_DESC, "epsilon"),
                 (A.OPERATION_BN_FINALIZE_EXP_AVERATE_FACTOR_DESC, "momentum")]
        if "running_mean" in op.inputs:
            pairs += [(A.OPERATION_BN_FINALIZE_PREV_RUNNING_MEAN_DESC, "running_mean"),
                      (A.OPERATION_BN_FINALIZE_PREV_RUNNING_VAR_DESC, "running_var"),
                      (A.OPERATION_BN_FINALIZE_UPDATED_RUNNING_MEAN_DESC, "next_running_mean"),
                      (A.OPERATION_BN_FINALIZE_UPDATED_RUNNING_VAR_DESC, "next_running_var")]
        for attr, role in pairs:
            o.set(attr, T.BACKEND_DESCRIPTOR, t(role))
        return o.finalize()
    if kind == "dbn_weight":
        o = BackendDescriptor(D.OPERATION_BN_BWD_WEIGHTS, what)
        o.set(A.OPERATION_BN_BWD_WEIGHTS_MATH_PREC, T.DATA_TYPE, _cudnn_dtype(p["compute"]))
        for attr, role in ((A.OPERATION_BN_BWD_WEIGHTS_X_DESC, "x"), (A.OPERATION_BN_BWD_WEIGHTS_DY_DESC, "dy"),
                           (A.OPERATION_BN_BWD_WEIGHTS_MEAN_DESC, "mean"),
                           (A.OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC, "inv_variance"),
                           (A.OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC, "scale"),
                           (A.OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC, "dscale"),
                           (A.OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC, "dbias"),
                           (A.OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC, "eq_scale_dy"),
                           (A.OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC, "eq_scale_x"),
                           (A.OPERATION_BN_BWD_WEIGHTS_EQ_BIAS, "eq_bias")):
            o.set(attr, T.BACKEND_DESCRIPTOR, t(role))
        return o.finalize()
    if kind in ("resample_fwd", "resample_bwd"):
        rs = BackendDescriptor(D.RESAMPLE, f"resample of {what}")
        rs.set(A.RESAMPLE_MODE, T.RESAMPLE_MODE, int(_RESAMPLE[p["mode"]]))
        rs.set(A.RESAMPLE_COMP_TYPE, T.DATA_TYPE, _cudnn_dtype(p["compute"]))
        rs.set(A.RESAMPLE_NAN_PROPAGATION, T.NAN_PROPOGATION, int(G.NanPropagation.PROPAGATE_NAN))
        pad = G.PaddingMode.NEG_INF_PAD if p["mode"] == "max" else G.PaddingMode.ZERO_PAD
        rs.set(A.RESAMPLE_PADDING_MODE, T.PADDING_MODE, int(pad))
        rs.set(A.RESAMPLE_SPATIAL_DIMS, T.INT64, len(p["window"]))
        # cudnn-frontend passes these as cudnnFraction_t (n/1); INT64 is also documented.
        rs.set(A.RESAMPLE_WINDOW_DIMS, T.FRACTION, list(p["window"]))
        rs.set(A.RESAMPLE_PRE_PADDINGS, T.FRACTION, list(p["pre"]))
        rs.set(A.RESAMPLE_POST_PADDINGS, T.FRACTION, list(p["post"]))
        rs.set(A.RESAMPLE_STRIDES, T.FRACTION, list(p["stride"]))
        rs.finalize()
        if kind == "resample_fwd":
            o = BackendDescriptor(D.OPERATION_RESAMPLE_FWD, what)
            o.set(A.OPERATION_RESAMPLE_FWD_XDESC, T.BACKEND_DESCRIPTOR, t("x"))
            o.set(A.OPERATION_RESAMPLE_FWD_YDESC, T.BACKEND_DESCRIPTOR, t("y"))
            if "index" in op.outputs:
                o.set(A.OPERATION_RESAMPLE_FWD_IDXDESC, T.BACKEND_DESCRIPTOR, t("index"))
            o.set(A.OPERATION_RESAMPLE_FWD_DESC, T.BACKEND_DESCRIPTOR, rs)
        else:
            o = BackendDescriptor(D.OPERATION_RESAMPLE_BWD, what)
            o.set(A.OPERATION_RESAMPLE_BWD_DXDESC, T.BACKEND_DESCRIPTOR, t("dx"))
            o.set(A.OPERATION_RESAMPLE_BWD_DYDESC, T.BACKEND_DESCRIPTOR, t("dy"))
            for attr, role in ((A.OPERATION_RESAMPLE_BWD_IDXDESC, "index"), (A.OPERATION_RESAMPLE_BWD_XDESC, "x"),
                               (A.OPERATION_RESAMPLE_BWD_YDESC, "y")):
                if role in op.inputs:
                    o.set(attr, T.BACKEND_DESCRIPTOR, t(role))
            o.set(A.OPERATION_RESAMPLE_BWD_DESC, T.BACKEND_DESCRIPTOR, rs)
        return o.finalize()
    raise AssertionError(f"unknown operation kind {kind!r}")  # pragma: no cover - _Op kinds are fixed above


# ---------------------------------------------------------------------------------------------
# plans
# ---------------------------------------------------------------------------------------------


_NOT_SUPPORTED_RANGE = range(3000, 4000)
_BF16 = normalize_dtype("bfloat16")


def _graph_context(graph: Graph) -> dict:
    return {"graph": graph.name, "operations": ", ".join(f"{op.kind} {op.name!r}" for op in graph._ops),
            "tensors": "; ".join(f"{t.name} {t.shape} {t.dtype.name}{' virtual' if t.virtual else ''}"
                                 for t in graph._tensors if not t.is_scalar)}


def _refuse_known_wrong(graph: Graph) -> None:
    """Refuse, before any descriptor is made, graphs that cuDNN builds but computes wrongly.

    A bfloat16 resample forward without an index output: on cuDNN 9.19 (H200) the engine the heuristics
    pick reads x and writes y as if they were float32. The wrong outputs of max and average pooling were
    reproduced bit for bit by pooling the bf16 buffer viewed as float32 and viewing the float32 result as
    bf16 (average pooling: NaN, -8640, 2e-28; max pooling: values pieced from two neighbouring inputs).
    The same graph in float16 and the bf16 resample backward compute correctly, and so does the index of
    the bf16 max-pooling forward that writes one (the backward from it matches), so that is let through.
    """
    for op in graph._ops:
        if op.kind != "resample_fwd" or "index" in op.outputs:
            continue
        if _BF16 not in (op.inputs["x"].dtype, op.outputs["y"].dtype):
            continue
        version = C.version()
        reason = (f"bfloat16 forward without an index output, refused on cuDNN {version // 10000}."
                  f"{version // 100 % 100}.{version % 100}: cuDNN 9.19's engine for it read and wrote bf16 x/y "
                  "as float32 (wrong results)")
        raise GraphNotSupportedError(
            f"graph {graph.name!r}", [(f"resample {op.name!r}", "known wrong:", reason)], _graph_context(graph),
            hint="pool in float16 or float32 (cast x), or use dnnbind.kernels.pool2d_forward; max pooling with "
                 "return_index=True is not affected")


class _PlanCore:
    """A finalized execution plan and what binding it needs; shared by every graph of one structure."""

    def __init__(self, plan: BackendDescriptor, workspace_size: int, engine: str, descriptors: list) -> None:
        self.plan = plan
        self.workspace_size = workspace_size
        self.engine = engine  # "<heuristics mode> #<rank> (engine <global index>)" of the config that finalized
        self._descriptors = descriptors  # keeps the op graph (and what it points to) alive with the plan

    @classmethod
    def create(cls, graph: Graph, bound: list[Tensor], handle: Handle, modes: tuple, allow_tf32: bool) -> "_PlanCore":
        context = _graph_context(graph)
        hint = _DBN_WEIGHT_HINT if any(op.kind == "dbn_weight" for op in graph._ops) else None
        td = {t._index: _tensor_descriptor(t, t._index + 1) for t in graph._tensors
              if any(t in (*op.inputs.values(), *op.outputs.values()) for op in graph._ops)}
        ops = [_op_descriptors(op, td) for op in graph._ops]
        og = BackendDescriptor(D.OPERATIONGRAPH, f"operation graph {graph.name!r}")
        og.set(A.OPERATIONGRAPH_HANDLE, T.HANDLE, handle.handle)
        og.set(A.OPERATIONGRAPH_OPS, T.BACKEND_DESCRIPTOR, ops)
        try:
            og.finalize()
        except CudnnError as err:
            if err.status in _NOT_SUPPORTED_RANGE:
                raise GraphNotSupportedError(f"graph {graph.name!r}", [("operation graph", err.status_name,
                                                                          err.detail)], context, hint) from err
            err.add_context(**context)
            raise
        fp32_only = all(t.dtype == _F32 for t in bound if not t.is_scalar)
        tried: list[tuple[str, str, str]] = []
        for mode in modes:
            heur = BackendDescriptor(D.ENGINEHEUR, f"heuristics {mode.name} of {graph.name!r}")
            heur.set(A.ENGINEHEUR_OPERATION_GRAPH, T.BACKEND_DESCRIPTOR, og)
            heur.set(A.ENGINEHEUR_MODE, T.HEUR_MODE, int(mode))
            try:
                heur.finalize()
                n = heur.count(A.ENGINEHEUR_RESULTS, T.BACKEND_DESCRIPTOR)
            except CudnnError as err:
                tried.append((f"heuristics {mode.name}", err.status_name, err.detail))
                continue
            configs = [BackendDescriptor(D.ENGINECFG, f"engine config {i} of {mode.name}") for i in range(max(n, 0))]
            if configs:
                n = heur.get_descriptors(A.ENGINEHEUR_RESULTS, configs)
            # Every mode leaves a line, so the error shows each one tried (an empty list included).
            if n <= 0:
                tried.append((f"heuristics {mode.name}", "no results", ""))
                continue
            for i, cfg in enumerate(configs[:n]):
                label = f"{mode.name} #{i}"
                engine = _engine_index(cfg)
                if engine is not None:
                    label += f" (engine {engine})"
                if not allow_tf32 and fp32_only and _uses_tensor_cores(cfg):
                    tried.append((label, "skipped", "TF32 (allow_tf32=False)"))
                    continue
                plan = BackendDescriptor(D.EXECUTION_PLAN, f"execution plan {label} of {graph.name!r}")
                try:
                    plan.set(A.EXECUTION_PLAN_HANDLE, T.HANDLE, handle.handle)
                    plan.set(A.EXECUTION_PLAN_ENGINE_CONFIG, T.BACKEND_DESCRIPTOR, cfg)
                    plan.finalize()
                except CudnnError as err:
                    tried.append((label, err.status_name, err.detail))
                    plan.close()
                    continue
                size = int(plan.get(A.EXECUTION_PLAN_WORKSPACE_SIZE, T.INT64)[0])
                return cls(plan, size, label, [og, ops, td])
            tried.append((f"heuristics {mode.name}", "exhausted", f"{n} engine configs, none finalized"))
        raise GraphNotSupportedError(f"graph {graph.name!r}", tried, context, hint)


def _engine_of(cfg: BackendDescriptor) -> BackendDescriptor:
    engine = BackendDescriptor(D.ENGINE, "engine of a heuristics result")
    cfg.get_descriptors(A.ENGINECFG_ENGINE, [engine])
    return engine


def _engine_index(cfg: BackendDescriptor) -> int | None:
    """cuDNN's global index of the engine behind ``cfg`` (None when cuDNN will not say): names it in reprs."""
    try:
        values = _engine_of(cfg).get(A.ENGINE_GLOBAL_INDEX, T.INT64)
    except CudnnError:
        return None
    return int(values[0]) if values else None


def _uses_tensor_cores(cfg: BackendDescriptor) -> bool:
    engine = _engine_of(cfg)
    notes = engine.get(A.ENGINE_NUMERICAL_NOTE, T.NUMERICAL_NOTE, 16)
    return int(G.NumericalNote.TENSOR_CORE) in notes or int(G.NumericalNote.DOWN_CONVERT_INPUTS) in notes


class Plan:
    """An execution plan for one :class:`Graph`: bind tensors by name and :meth:`execute`.

    ``workspace_size`` is in bytes; ``names`` are the tensors to bind; ``engine`` says which
    heuristics result runs it. The finalized cuDNN plan is shared through the plan cache.
    """

    def __init__(self, core: _PlanCore, graph: Graph, bound: list[Tensor]) -> None:
        self._core = core
        self.graph_name = graph.name
        self._tensors = {t.name: t for t in bound if not t.is_scalar}
        self._names = self._tensors.keys()  # (a live view: compared with execute's mapping as a set)
        order = [t for t in bound if not t.is_scalar] + [t for t in bound if t.is_scalar]
        self._uids = (ctypes.c_int64 * len(order))(*[t._index + 1 for t in order])
        self._slots = {t.name: i for i, t in enumerate(order) if not t.is_scalar}
        # By-value scalars: cuDNN reads them from host memory during execute; these arrays live with the plan.
        self._scalars = [t.value.copy() for t in order if t.is_scalar]
        self._scalar_ptrs = [s.ctypes.data for s in self._scalars]
        self._count = len(order)
        # Finalized variant packs by (data pointers, workspace): an eager step that gets the same
        # addresses from the pool again (the common case) reuses its pack instead of building one
        self._packs = LRUCache(VARIANT_PACK_CACHE_SIZE, f"variant packs of {self.graph_name!r}")

    @property
    def workspace_size(self) -> int:
        """Bytes of device workspace :meth:`execute` needs (0: none)."""
        return self._core.workspace_size

    @property
    def engine(self) -> str:
        """``"<heuristics mode> #<rank> (engine <cuDNN global index>)"`` of the configuration this plan runs."""
        return self._core.engine

    @property
    def names(self) -> tuple[str, ...]:
        """The tensor names :meth:`execute` binds (inputs and outputs)."""
        return tuple(self._tensors)

    def tensor(self, name: str) -> Tensor:
        """The :class:`Tensor` bound under ``name`` (its shape, dtype and strides)."""
        return self._tensors[name]

    def execute(self, tensors: Mapping[str, Any], workspace: Any = None, *, stream: Any = None,
                handle: Handle | None = None) -> None:
        """Enqueue the plan on the stream: ``tensors`` maps every name of :attr:`names` to device memory.

        Values: a DeviceArray (shape, dtype and strides checked), or anything with ``.ptr`` or a raw
        device pointer int (not checked). ``workspace``: at least :attr:`workspace_size` bytes (a
        DeviceArray, an Allocation or a pointer). ``handle`` (default ``cudnn.get_handle(stream)``)
        picks the stream. No host synchronisation, no allocation: capturable.
        """
        what = f"Plan {self.graph_name!r}: execute"
        if tensors.__class__ is not dict and not isinstance(tensors, abc.Mapping):
            raise ArgumentTypeError(f"{what}: tensors must be a mapping of name -> device array, got "
                                    f"{type(tensors).__name__}")
        if self._names != tensors.keys():
            missing = [n for n in self._tensors if n not in tensors]
            extra = [n for n in tensors if n not in self._tensors]
            raise ValueError(f"{what}: tensors must bind exactly {sorted(self._tensors)}; missing {missing}, "
                             f"unknown {extra}")
        ptrs = (ctypes.c_void_p * self._count)()
        for name, value in tensors.items():
            ptrs[self._slots[name]] = _pointer(value, self._tensors[name], what)
        for i, p in enumerate(self._scalar_ptrs):
            ptrs[len(self._slots) + i] = p
        ws = self._workspace(workspace, what)
        if handle is None:
            handle = get_handle(stream)
        else:
            handle = require_handle(handle, what)
        key = (tuple(ptrs), ws)
        pack = self._packs.get(key)
        if pack is None:
            pack = BackendDescriptor(D.VARIANT_PACK, f"variant pack of {self.graph_name!r}")
            pack.set(A.VARIANT_PACK_UNIQUE_IDS, T.INT64, list(self._uids))
            G.call("cudnnBackendSetAttribute", pack.handle, int(A.VARIANT_PACK_DATA_POINTERS), int(T.VOID_PTR),
                   self._count, ctypes.cast(ptrs, ctypes.c_void_p), context={"setting": "VARIANT_PACK_DATA_POINTERS"})
            wsp = ctypes.c_void_p(ws)
            G.call("cudnnBackendSetAttribute", pack.handle, int(A.VARIANT_PACK_WORKSPACE), int(T.VOID_PTR), 1,
                   ctypes.addressof(wsp), context={"setting": "VARIANT_PACK_WORKSPACE"})
            pack.finalize()
            self._packs.put(key, pack)
        G.call("cudnnBackendExecute", handle.handle, self._core.plan.handle, pack.handle,
               context=lambda: {"graph": self.graph_name, "engine": self.engine,
                                "workspace": f"{self.workspace_size} B at {ws:#x}"})

    def _workspace(self, workspace: Any, what: str) -> int:
        need = self._core.workspace_size
        if workspace is None:
            if need:
                raise ValueError(f"{what}: this plan needs a workspace of {need} bytes (plan.workspace_size); "
                                 "pass workspace=cuda.empty((n,), 'uint8') made once and reused")
            return 0
        if isinstance(workspace, int) and not isinstance(workspace, bool):
            if need and not workspace:
                raise ValueError(f"{what}: this plan needs a workspace of {need} bytes (plan.workspace_size), got "
                                 "the null pointer 0")
            return workspace
        ptr = getattr(workspace, "ptr", None)
        if not isinstance(ptr, int):
            raise ArgumentTypeError(f"{what}: workspace must be a DeviceArray, an Allocation or a pointer int, got "
                                    f"{type(workspace).__name__}")
        nbytes = getattr(workspace, "nbytes", None)
        if isinstance(nbytes, int) and nbytes < need:
            raise ValueError(f"{what}: workspace holds {nbytes} bytes, the plan needs {need}")
        return ptr

    def __repr__(self) -> str:
        return (f"Plan({self.graph_name!r}, engine={self.engine}, workspace_size={self.workspace_size}, "
                f"names={list(self.names)})")


def _pointer(value: Any, t: Tensor, what: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        ptr = value
    else:
        ptr = getattr(value, "ptr", None)
        if not isinstance(ptr, int):
            raise ArgumentTypeError(f"{what}: tensor {t.name!r} must be a DeviceArray or a device pointer int, got "
                                    f"{type(value).__name__}")
        shape = getattr(value, "shape", None)
        if shape is not None:
            if tuple(shape) != t.shape:
                raise ValueError(f"{what}: tensor {t.name!r} must have shape {t.shape}, got {tuple(shape)}")
            dtype = getattr(value, "dtype", None)
            if dtype is not None and np.dtype(dtype) != t.dtype:
                raise ValueError(f"{what}: tensor {t.name!r} must be {t.dtype.name}, got {np.dtype(dtype).name}")
            strides = getattr(value, "strides", None)
            if strides is not None:
                want = [s * t.dtype.itemsize for s in t.strides]
                if any(n > 1 and s != w for n, s, w in zip(t.shape, strides, want)):
                    raise ValueError(f"{what}: tensor {t.name!r} must have byte strides {tuple(want)} "
                                     f"({'channels-last' if t.layout == 'NHWC' else 'row-major'}), got "
                                     f"{tuple(strides)}")
    if ptr == 0:
        raise ValueError(f"{what}: tensor {t.name!r} has a null pointer")
    if ptr % t.alignment:
        raise ValueError(f"{what}: tensor {t.name!r} at {ptr:#x} is not {t.alignment}-byte aligned")
    return ptr


# ---------------------------------------------------------------------------------------------
# the plan cache
# ---------------------------------------------------------------------------------------------

PLAN_CACHE_SIZE = 256
VARIANT_PACK_CACHE_SIZE = 16
"""Finalized variant packs a plan keeps, by data pointers and workspace."""
_plans = LRUCache(PLAN_CACHE_SIZE, "cuDNN graph plans")
_plan_stats = {"hits": 0, "misses": 0}


def _plan_cache_get(key: tuple) -> _PlanCore | None:
    core = _plans.get(key)
    _plan_stats["hits" if core is not None else "misses"] += 1
    return core


def _plan_cache_put(key: tuple, core: _PlanCore) -> None:
    # An evicted plan lives on while a Plan still references it (a captured graph's owner keeps one).
    _plans.put(key, core)


def plan_cache_info() -> dict:
    """``{"hits", "misses", "size"}`` of the process-wide plan cache."""
    return {**_plan_stats, "size": len(_plans.items())}


def clear_plan_cache() -> None:
    """Drop every cached plan (Plans still held keep theirs alive)."""
    _plans.clear()
