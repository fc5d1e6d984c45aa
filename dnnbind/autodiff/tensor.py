"""``dnnbind.Tensor``: the one tensor type both backends return from ``keras.ops``.

A Tensor wraps one raw array, ``data``: a ``numpy.ndarray`` on the CPU backend or a
:class:`dnnbind.cuda.DeviceArray` on a GPU. It adds nothing to the array but the node that made it
while a tape recorded (``_node``, ``_index``: see :mod:`dnnbind.autodiff.engine`) and Python's
operators, which are ``keras.ops`` calls (``x * w`` is ``ops.multiply(x, w)``), so they are
differentiable and broadcast as NumPy does. Tensors are immutable, like JAX arrays: ``x[i] = v`` is
refused with a pointer to ``ops.slice_update`` / ``ops.scatter_update``.

Reading values on the host is always explicit or forced by Python: ``numpy()``, ``np.asarray(t)``,
``float(t)``, ``bool(t)``, ``repr(t)`` copy a device tensor to the host (and so wait for its stream).

The operators are installed by :mod:`dnnbind.ops` when it is imported (:func:`install_operators`):
this room sits below the ops room and cannot import it.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .. import backend
from . import engine

__all__ = ["Tensor", "FilledTensor", "LazyTensor", "TransposedView", "install_operators", "is_tensor"]


class Tensor:
    """A value of ``keras.ops`` (see the module docstring). ``Tensor(array)`` wraps a NumPy array or a
    DeviceArray without copying; use ``dnnbind.ops.convert_to_tensor`` for anything else."""

    __slots__ = ("data", "_node", "_index", "_keras_mask", "__weakref__")
    __array_priority__ = 1000

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        """NumPy's ufuncs on tensors (``np_array * t``, ``np.exp(t)``) are the matching ``keras.ops`` (tensors
        out, differentiable); a ufunc with no such op, or another method, computes on host copies."""
        if method == "__call__" and not kwargs:
            fn = _UFUNC_OPS.get(ufunc.__name__)
            if fn is not None and _OPS_TABLE[0] is not None:
                return getattr(_OPS_TABLE[0], fn)(*inputs)
        host = [np.asarray(i) if isinstance(i, Tensor) else i for i in inputs]
        return getattr(ufunc, method)(*host, **kwargs)

    def __init__(self, data: Any) -> None:
        self.data = data
        self._node = None
        self._index = 0
        self._keras_mask = None

    # ----- array facts --------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return tuple(self.data.shape)

    # C getters (no Python frame): the ops and the trainer read a tensor's dtype on every call
    dtype = property(operator.attrgetter("data.dtype"), doc="The element type, an np.dtype.")
    ndim = property(operator.attrgetter("data.ndim"), doc="The number of dimensions.")

    @property
    def size(self) -> int:
        return int(self.data.size)

    @property
    def device(self) -> "backend.Device":
        """Where the tensor lives (``cpu`` or ``cuda:N``)."""
        return backend.device_of(self.data)

    @property
    def is_cuda(self) -> bool:
        return backend.is_device_array(self.data)

    def __len__(self) -> int:
        if self.data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return int(self.data.shape[0])

    # ----- host values (explicit transfers) -----------------------------------------------------
    def numpy(self) -> np.ndarray:
        """A host copy (waits for the tensor's stream when it is on a GPU)."""
        return np.array(backend.to_numpy(self.data), copy=True)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        host = backend.to_numpy(self.data)
        return host if dtype is None else host.astype(dtype)

    def item(self) -> Any:
        return backend.to_numpy(self.data).item()

    def tolist(self) -> Any:
        return backend.to_numpy(self.data).tolist()

    def __bool__(self) -> bool:
        if self.size != 1:
            raise ValueError(f"the truth value of a tensor of shape {self.shape} is ambiguous; use "
                             "keras.ops.any or keras.ops.all")
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self.dtype.kind not in "iub":
            raise TypeError(f"only integer tensors can be used as an index, got dtype {self.dtype}")
        return int(self.item())

    def __complex__(self) -> complex:
        return complex(self.item())

    def __format__(self, spec: str) -> str:
        return format(self.item(), spec) if spec and self.size == 1 else format(str(self), spec)

    def __repr__(self) -> str:
        where = "" if not self.is_cuda else f", device={self.device}"
        body = np.array2string(backend.to_numpy(self.data), separator=", ", threshold=64)
        return f"<Tensor shape={self.shape}, dtype={self.dtype.name}{where}, value=\n{body}>"

    __str__ = __repr__
    __hash__ = object.__hash__

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        for i in range(len(self)):
            yield self[i]

    def __setitem__(self, key: Any, value: Any) -> None:
        raise TypeError("dnnbind tensors are immutable (as JAX arrays are): use "
                        "keras.ops.slice_update(x, start_indices, updates) or keras.ops.scatter_update(x, indices, "
                        "updates), which return a new tensor")

    def __reduce__(self) -> Any:
        raise TypeError("dnnbind tensors are not picklable; save arrays with numpy() or the model with model.save()")


class LazyTensor(Tensor):
    """A tensor whose array is made by ``_make()`` when ``data`` is first read (then kept). Its shape is
    ``_shape``; dtype and device are those of ``_like`` (a tensor it is computed from): nothing is
    computed to answer them. Subclasses: :class:`FilledTensor`, :class:`TransposedView`,
    ``ops._conv.PendingConv``."""

    __slots__ = ("_made", "_shape", "_like")

    def _init_lazy(self, shape: tuple, like: "Tensor | None") -> None:
        self._made = None
        self._shape = tuple(shape)
        self._like = like
        self._node = None
        self._index = 0
        self._keras_mask = None

    def _make(self) -> Any:
        raise NotImplementedError

    @property  # type: ignore[override]
    def data(self) -> Any:
        if self._made is None:
            self._made = self._make()
        return self._made

    @property
    def shape(self) -> tuple:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self._like.dtype

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        n = 1
        for s in self._shape:
            n *= int(s)
        return n

    @property
    def device(self) -> Any:
        return self._like.device

    @property
    def is_cuda(self) -> bool:
        return self._like.is_cuda


class FilledTensor(LazyTensor, engine.FilledTensor):
    """A tensor of ``shape`` whose every element is ``value`` (a Python number), its array made only when
    ``data`` is read: the ones a backward starts from, or such a gradient scaled by a number. Behaves as
    any Tensor."""

    __slots__ = ("value", "_dtype", "_device")

    def __init__(self, value: float, shape: tuple, dtype: Any, device: Any) -> None:
        self.value = value
        self._dtype = np.dtype(dtype)
        self._device = device
        self._init_lazy(shape, None)

    def _make(self) -> Any:
        return engine.hooks.materialize(self)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def device(self) -> Any:
        return self._device

    @property
    def is_cuda(self) -> bool:
        return bool(self._device.is_cuda)


class TransposedView(LazyTensor):
    """``source`` with its axes permuted by ``axes``, the array made only when ``data`` is read: how a
    variable stored in another layout than Keras's (a convolution kernel, KRSC) reads in ops. An op that
    wants the stored layout (``keras.ops.conv``) takes ``source`` instead, so no step transposes the kernel
    for nothing. Behaves as any Tensor (its node, when recorded, transposes the gradient back)."""

    __slots__ = ("source", "axes")

    def __init__(self, source: Tensor, axes: tuple) -> None:
        self.source = source
        self.axes = tuple(axes)
        shape = source.shape
        self._init_lazy(tuple(shape[a] for a in self.axes), source)

    def _make(self) -> Any:
        with engine.stop_recording():
            return engine.hooks.ops.transpose(self.source, self.axes).data


# NumPy ufunc name -> the keras.ops function (installed with the operators)
_UFUNC_OPS = {
    "add": "add", "subtract": "subtract", "multiply": "multiply", "true_divide": "divide", "divide": "divide",
    "floor_divide": "floor_divide", "power": "power", "negative": "negative", "positive": "positive",
    "absolute": "absolute", "exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log", "log2": "log2",
    "log10": "log10", "log1p": "log1p", "sqrt": "sqrt", "square": "square", "sin": "sin", "cos": "cos",
    "tan": "tan", "arcsin": "arcsin", "arccos": "arccos", "arctan": "arctan", "sinh": "sinh", "cosh": "cosh",
    "tanh": "tanh", "arctan2": "arctan2", "maximum": "maximum", "minimum": "minimum", "equal": "equal",
    "not_equal": "not_equal", "less": "less", "less_equal": "less_equal", "greater": "greater",
    "greater_equal": "greater_equal", "sign": "sign", "floor": "floor", "ceil": "ceil", "matmul": "matmul",
    "logical_and": "logical_and", "logical_or": "logical_or", "logical_not": "logical_not", "isnan": "isnan",
    "isinf": "isinf", "isfinite": "isfinite", "reciprocal": "reciprocal", "mod": "mod", "remainder": "mod",
}
_OPS_TABLE: list = [None]


def is_tensor(x: Any) -> bool:
    """Whether ``x`` is a :class:`Tensor` (``keras.ops.is_tensor``)."""
    return isinstance(x, Tensor)


_BINARY = {
    "__add__": ("add", False), "__radd__": ("add", True),
    "__sub__": ("subtract", False), "__rsub__": ("subtract", True),
    "__mul__": ("multiply", False), "__rmul__": ("multiply", True),
    "__truediv__": ("divide", False), "__rtruediv__": ("divide", True),
    "__floordiv__": ("floor_divide", False), "__rfloordiv__": ("floor_divide", True),
    "__mod__": ("mod", False), "__rmod__": ("mod", True),
    "__pow__": ("power", False), "__rpow__": ("power", True),
    "__matmul__": ("matmul", False), "__rmatmul__": ("matmul", True),
    "__and__": ("logical_and_or_bitwise", False), "__rand__": ("logical_and_or_bitwise", True),
    "__or__": ("logical_or_or_bitwise", False), "__ror__": ("logical_or_or_bitwise", True),
    "__xor__": ("logical_xor_or_bitwise", False), "__rxor__": ("logical_xor_or_bitwise", True),
    "__lshift__": ("left_shift", False), "__rlshift__": ("left_shift", True),
    "__rshift__": ("right_shift", False), "__rrshift__": ("right_shift", True),
    "__eq__": ("equal", False), "__ne__": ("not_equal", False),
    "__lt__": ("less", False), "__le__": ("less_equal", False),
    "__gt__": ("greater", False), "__ge__": ("greater_equal", False),
}
_UNARY = {"__neg__": "negative", "__pos__": "positive", "__abs__": "absolute", "__invert__": "invert_or_not"}


def install_operators(cls: type, table: Any, *, identity_equality: bool = False) -> None:
    """Give ``cls`` (Tensor, Variable, KerasTensor) Python's operators and the array methods, as calls of
    ``table`` (the :mod:`dnnbind.ops` module, or an object with its functions). ``identity_equality``: keep
    ``==``/``!=``/hash by identity (variables are dictionary keys and list members; use ``ops.equal``)."""

    def binary(name: str, reflected: bool):
        fn = getattr(table, name)
        if reflected:
            def method(self, other):
                return fn(other, self)
        else:
            def method(self, other):
                return fn(self, other)
        return method

    def unary(name: str):
        fn = getattr(table, name)

        def method(self):
            return fn(self)
        return method

    for dunder, (name, reflected) in _BINARY.items():
        if identity_equality and dunder in ("__eq__", "__ne__"):
            continue
        setattr(cls, dunder, binary(name, reflected))
    for dunder, name in _UNARY.items():
        setattr(cls, dunder, unary(name))
    cls.__getitem__ = lambda self, key: table.get_item(self, key)
    if cls is Tensor:
        _OPS_TABLE[0] = table
    cls.T = property(lambda self: table.transpose(self))
    cls.reshape = lambda self, *shape: table.reshape(self, shape[0] if len(shape) == 1 and isinstance(
        shape[0], (tuple, list)) else shape)
    cls.transpose = lambda self, *axes: table.transpose(self, (axes[0] if len(axes) == 1 and isinstance(
        axes[0], (tuple, list)) else axes) or None)
    cls.astype = lambda self, dtype, **unused: table.cast(self, dtype)

    def reduction(name: str):
        def method(self, axis=None, dtype=None, out=None, keepdims=False, **unused):
            if out is not None:
                raise TypeError(f"Tensor.{name}: out= is not supported (tensors are immutable)")
            res = getattr(table, name)(self, axis=axis, keepdims=keepdims)
            return res if dtype is None else table.cast(res, dtype)
        return method

    for name in ("sum", "mean", "max", "min", "prod", "any", "all", "std", "var"):
        setattr(cls, name, reduction(name))
    cls.argmax = lambda self, axis=None, **unused: table.argmax(self, axis=axis)
    cls.argmin = lambda self, axis=None, **unused: table.argmin(self, axis=axis)
    cls.flatten = lambda self: table.reshape(self, (-1,))
    cls.squeeze = lambda self, axis=None: table.squeeze(self, axis)
