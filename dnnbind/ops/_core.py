"""The machinery every ``keras.ops`` function shares: dtypes, conversion to tensors, recording, and
the symbolic (functional-API) dispatch.

**dtypes.** :func:`result_type` is Keras 3's type-promotion lattice (``keras.backend.result_type``,
defined in :mod:`dnnbind.backend` and re-exported here) with one difference, stated in DESIGN: 64-bit
types stay 64-bit (Keras's JAX, torch and NumPy backends narrow float64/int64 results to 32 bits; its
TensorFlow backend keeps them, as dnnbind does, so float64 gradient checks are possible). Python numbers
are *weak*: ``x * 2.0`` keeps ``x``'s dtype; a Python int alone is int32, a float the ``floatx``.

**Conversion.** :func:`tensor` turns an op's argument into a :class:`~dnnbind.autodiff.Tensor`: a tensor
as it is; a variable read as one (:func:`read_variable`: its Keras layout, autocast to the compute
dtype inside a layer whose policy asks for it, and, while a tape records, an edge to its leaf); a NumPy
array, a list or a number as a host array placed on the default device (an explicit upload when that is
a GPU); a DeviceArray wrapped as it is.

**Recording.** An op computes its raw result with :mod:`dnnbind.kernels`, then calls :func:`make`,
which wraps it as a tensor and, when a tape records and an input needs a gradient, records a node with
the op's VJP (see :mod:`dnnbind.autodiff.engine`).

**Symbolic tensors.** Every public op is declared with :func:`keras_op`. Called on a symbolic tensor
(``keras.Input(...)`` and what layers made from it), it becomes a node of the functional model being
built (the layers room installs the handler, :func:`set_symbolic_handler`), as in Keras.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Sequence

import numpy as np

from .. import backend, kernels
from ..backend import result_type, standardize_dtype
from .._validate import BFLOAT16
from ..autodiff import engine
from ..autodiff.engine import recording
from ..autodiff.tensor import FilledTensor, Tensor, TransposedView
from ..autodiff.variable import Variable, note_new_cast
from ..kernels import numeric as N

__all__ = ["Tensor", "keras_op", "REGISTRY", "tensor", "tensors", "convert_to_tensor", "read_variable", "make",
           "edge", "result_type", "standardize_dtype", "dtype_of", "unbroadcast", "filled", "ones_like_seed",
           "autocast_scope", "is_float", "set_symbolic_handler", "raw", "np_dtype", "floatx", "device_of_args"]

_BOOL = np.dtype(np.bool_)


# ------------------------------------------------------------------------------------------ dtypes
# standardize_dtype and result_type (Keras's promotion lattice) live in dnnbind.backend, which is
# keras.backend and sits below kernels; they are re-exported here for the op families


# NumPy dtypes that np_dtype gives back as they are (each is what its own Keras name maps to): the ops pass
# these on every call, and the spelling rules need not run for them
_NATIVE_DTYPES = frozenset([np.dtype(name) for name in (
    "bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float16", "float32",
    "float64", "complex64", "complex128")] + [BFLOAT16])


def np_dtype(dtype: Any) -> np.dtype:
    """The NumPy dtype (ml_dtypes' bfloat16 for ``"bfloat16"``) of a Keras dtype spelling."""
    if isinstance(dtype, np.dtype) and dtype in _NATIVE_DTYPES:
        return dtype
    name = standardize_dtype(dtype)
    return BFLOAT16 if name == "bfloat16" else np.dtype(name)


def floatx() -> np.dtype:
    return np_dtype(backend.floatx())


def dtype_of(x: Any) -> np.dtype:
    return x.dtype if hasattr(x, "dtype") else np_dtype(result_type(x))


def is_float(dtype: Any) -> bool:
    dt = np.dtype(dtype) if not isinstance(dtype, np.dtype) else dtype
    return dt.kind == "f" or dt == BFLOAT16


# -------------------------------------------------------------------------------------- autocast
_local = threading.local()


class autocast_scope:
    """``with autocast_scope(dtype):`` float variables read in ops are cast to ``dtype`` (None: no cast).
    A layer's ``__call__`` opens one for its compute dtype when its policy is mixed (Keras's autocast)."""

    def __init__(self, dtype: Any) -> None:
        self.dtype = None if dtype is None else np_dtype(dtype)

    def __enter__(self) -> "autocast_scope":
        stack = getattr(_local, "autocast", None)
        if stack is None:
            stack = _local.autocast = []
        stack.append(self.dtype)
        return self

    def __exit__(self, *exc: Any) -> None:
        _local.autocast.pop()


def _autocast_dtype() -> "np.dtype | None":
    stack = getattr(_local, "autocast", None)
    return stack[-1] if stack else None


# ------------------------------------------------------------------------------------ conversion
def raw(x: Any) -> Any:
    """The raw array (or number) behind ``x`` without recording anything."""
    if isinstance(x, Tensor):
        return x.data
    if isinstance(x, Variable):
        return x.value if x._to_keras is None else tensor(x).data
    return x


def read_variable(v: Variable) -> Tensor:
    """A variable as a tensor (see the module docstring)."""
    t = Tensor(v.value)
    if recording():
        watched = False
        for tape in engine.active_tapes():
            if tape.watches(v):
                tape._note_access(v)
                watched = True
        if watched:
            t._node, t._index = v._leaf_node(), 0
    want = _autocast_dtype()
    if want is not None and v.autocast and t.dtype != want and is_float(t.dtype):
        # in the stored layout (elementwise: the same values), so a transposed view stays a peephole
        t = _autocast_read(v, t, want)
    if v._keras_perm is not None:
        t = _keras_view(t, v._keras_perm)
    elif v._to_keras is not None:
        t = v._to_keras(t)
    return t


def _autocast_read(v: Variable, t: Tensor, want: np.dtype) -> Tensor:
    """A layer weight read in the compute dtype. Inside a model's step the trainer has cast every such
    weight already, with one multi-tensor launch (the layer's ``_precast``: weight -> copy); the read takes
    the copy, and its gradient stays in the compute dtype when the trainer lets the optimizer read those
    (``_keep_grad_dtype``) and the weight was read once this step, else it is cast back. Otherwise the
    read casts now and notes the cast in the layer's ``_cast_weights``, so the next step precasts it."""
    layer = getattr(v, "layer", None)
    if layer is None:
        return _cast_op(t, want)
    pre = layer._precast
    copy = pre.get(v) if pre is not None else None
    if copy is None or copy.dtype != want:
        if layer._cast_weights.get(v) != want:
            # copy-on-write: a trainer may be reading the dict (another thread's step)
            layer._cast_weights = {**layer._cast_weights, v: want}
            note_new_cast()
        return _cast_op(t, want)
    reads = layer.__dict__.setdefault("_precast_reads", {})
    reads[v] = reads.get(v, 0) + 1
    out = Tensor(copy)
    if t._node is not None and recording():
        variable_dtype = t.dtype

        def vjp(node: Any, g: Tensor) -> tuple:
            if layer._keep_grad_dtype and reads.get(v) == 1:
                return (g,)  # the optimizer's fused update converts it exactly, as the cast would
            return (_cast_op(g, variable_dtype),)

        engine.attach(out, ((t._node, t._index),), vjp, "cast")
    return out


def _keras_view(stored: Tensor, axes: tuple) -> Tensor:
    """The Keras-layout read of a variable stored transposed: a lazy :class:`TransposedView` (an op that
    wants the stored layout, ``keras.ops.conv``, takes ``view.source`` and no transpose runs)."""
    view = TransposedView(stored, axes)
    if stored._node is not None and recording():
        back = tuple(axes.index(i) for i in range(len(axes)))
        engine.attach(view, ((stored._node, stored._index),),
                      lambda node, g: (engine.hooks.ops.transpose(g, back),), "transpose")
    return view


def _place(host: np.ndarray, like: Any = None) -> Any:
    """Host data on the device of ``like`` (a raw array), else on the default device."""
    if like is not None:
        if backend.is_device_array(like):
            return backend.asarray(host, device=backend.device_of(like))
        return host
    dev = backend.default_device()
    return backend.asarray(host, device=dev) if dev.is_cuda else host


def _host_array(x: Any, dtype: "np.dtype | None") -> np.ndarray:
    if isinstance(x, (bool, int, float, complex)) and dtype is None:
        dtype = np_dtype(result_type(x))
    if isinstance(x, (list, tuple)) and dtype is None:
        arr = np.asarray(x)
        if arr.dtype == np.float64:
            arr = arr.astype(floatx())
        elif arr.dtype == np.int64:
            arr = arr.astype(np.int32)
        return arr
    # order="C": the kernels take C-contiguous arrays (a strided view of the caller's array: one copy)
    arr = np.asarray(x, order="C") if dtype is None else np.asarray(x, dtype=dtype, order="C")
    return arr


def tensor(x: Any, like: Any = None) -> Tensor:
    """``x`` as a :class:`Tensor` (see the module docstring); ``like``: a raw array whose device host
    data goes to (so ``device_tensor + np_array`` uploads the NumPy operand, not the other way)."""
    if isinstance(x, Tensor):
        return x
    if isinstance(x, Variable):
        return read_variable(x)
    if type(x) is np.ndarray or isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:  # the kernels take C-contiguous arrays (a transposed view: one copy)
            x = np.array(x, order="C")
        return Tensor(_place(x, like))
    if backend.is_device_array(x):
        return Tensor(x)
    if hasattr(x, "_keras_history"):
        raise TypeError(f"a symbolic tensor ({x!r}) reached an op that does not take one: build a model with "
                        "keras.Model(inputs, outputs) and call it on data")
    if isinstance(x, (list, tuple)) and any(isinstance(v, (Tensor, Variable)) or backend.is_device_array(v)
                                           for v in _flat_items(x)):
        return _stack_nested(x)
    if hasattr(x, "__cuda_array_interface__") or hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray):
        try:
            from ..cuda import interop  # deferred: only foreign GPU arrays need the CUDA room

            return Tensor(interop.from_dlpack(x) if hasattr(x, "__dlpack__") else
                          interop.from_cuda_array_interface(x))
        except Exception:  # not a GPU array after all (a CPU torch tensor): take its host values
            pass
    return Tensor(_place(_host_array(x, None), like))


def _flat_items(x: Any):
    for v in x:
        if isinstance(v, (list, tuple)):
            yield from _flat_items(v)
        else:
            yield v


def _op(name: str) -> Callable:
    """A public op by name (the families register theirs on import; all are loaded by ``dnnbind.ops``):
    the machinery here calls ops of the families above it this way, without an import cycle."""
    return REGISTRY[name]["fn"]


def _stack_nested(x: Any) -> Tensor:
    return _op("stack")([_stack_nested(v) if isinstance(v, (list, tuple)) else tensor(v) for v in x])


def tensors(*xs: Any) -> list[Tensor]:
    """Several op arguments as tensors on one device: host data follows the first device operand."""
    for x in xs:
        if x.__class__ is not Tensor:
            break
    else:  # tensors already (the common case): nothing to convert or place
        return [*xs]
    like = next((r for r in map(_probe, xs) if backend.is_device_array(r)), None)
    if like is None:  # only a host-known tensor names the device: its array is needed after all (rare)
        like = next((x.data for x in xs if isinstance(x, FilledTensor) and x.is_cuda), None)
    return [tensor(x, like) for x in xs]


def _probe(x: Any) -> Any:
    """``raw(x)`` for finding the device of an op's operands, without making a FilledTensor's array (a
    host-known operand that ``x * filled`` and the fused VJPs use as a number must stay unmade)."""
    return None if isinstance(x, FilledTensor) else raw(x)


def device_of_args(*xs: Any) -> Any:
    """A raw device array among ``xs`` (to place new constants next to), or None."""
    for x in xs:
        r = raw(x) if isinstance(x, (Tensor, Variable)) else x
        if backend.is_device_array(r):
            return r
    return None


def _cast_op(t: Tensor, dtype: np.dtype) -> Tensor:
    return _op("cast")(t, dtype)


def convert_to_tensor(x: Any, dtype: Any = None, sparse: Any = None, ragged: Any = None) -> Tensor:
    """``keras.ops.convert_to_tensor``: ``x`` as a tensor (of ``dtype``: a cast, recorded, when it differs).
    NumPy data goes to the default device."""
    if sparse:
        raise ValueError("convert_to_tensor: dnnbind has no sparse tensors (sparse=True)")
    if ragged:
        raise ValueError("convert_to_tensor: dnnbind has no ragged tensors (ragged=True)")
    if dtype is not None and not isinstance(x, (Tensor, Variable)) and not backend.is_device_array(x) \
            and not hasattr(x, "_keras_history"):
        if isinstance(x, (list, tuple)) and any(isinstance(v, (Tensor, Variable)) for v in _flat_items(x)):
            return _cast_op(tensor(x), np_dtype(dtype))
        # order="C": a strided NumPy view (x[:, 0]) is copied once here, the kernels take contiguous arrays
        return Tensor(_place(np.asarray(x, dtype=np_dtype(dtype), order="C")))
    t = tensor(x)
    if dtype is not None and t.dtype != np_dtype(dtype):
        t = _cast_op(t, np_dtype(dtype))
    return t


# ------------------------------------------------------------------------------------- recording
def edge(t: Any) -> "tuple | None":
    node = getattr(t, "_node", None)
    return None if node is None else (node, t._index)


def make(out: Any, inputs: Sequence[Any], vjp: Callable, name: str, *, keep_outputs: bool = False,
         once_differentiable: bool = False, multiple: bool = False) -> Any:
    """The op's raw result(s) as tensor(s); recorded with ``vjp`` when a tape records and an input of
    ``inputs`` (tensors, or None for non-differentiable arguments) needs a gradient."""
    if recording():
        edges = tuple([None if t is None else edge(t) for t in inputs])
        for e in edges:
            if e is not None:
                return engine.record(out, edges, vjp, name, keep_outputs=keep_outputs,
                                     once_differentiable=once_differentiable, multiple=multiple)
    if multiple:
        return tuple(Tensor(o) for o in out)
    return Tensor(out)


def needs_grad(*inputs: Any) -> bool:
    """Whether recording now would record (some input has a node)."""
    return recording() and any(getattr(t, "_node", None) is not None for t in inputs)


# ----------------------------------------------------------------------- filled (host-known) tensors
class _Filled(FilledTensor):
    __slots__ = ()


def filled(value: float, shape: Sequence[int], dtype: Any, device: Any) -> FilledTensor:
    """A tensor of ``shape`` holding ``value`` everywhere, made on ``device`` only when read."""
    return _Filled(float(value) if not isinstance(value, (int, np.integer)) or isinstance(value, bool)
                   else value, tuple(map(int, shape)), np.dtype(dtype) if dtype is not BFLOAT16 else dtype,
                   device)


def _materialize(t: FilledTensor) -> Any:
    return N.full(t._shape, t.value, t._dtype, device=t._device)


def ones_like_seed(t: Tensor) -> FilledTensor:
    """The seed of a backward from ``t``: ones of its shape and dtype, made only if a VJP reads them."""
    return filled(1.0 if is_float(t.dtype) else 1, t.shape, t.dtype, t.device)


# ------------------------------------------------------------------------------------ broadcasting
def unbroadcast(g: Tensor, shape: Sequence[int]) -> Tensor:
    """``g`` (the gradient of a broadcast result) summed back to ``shape``."""
    shape = tuple(shape)
    gshape = tuple(g.shape)
    if gshape == shape:
        return g
    lead = len(gshape) - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, s in enumerate(shape) if s == 1 and gshape[lead + i] != 1)
    if isinstance(g, FilledTensor):
        count = 1
        for a in axes:
            count *= gshape[a]
        return filled(g.value * count, shape, g.dtype, g.device)
    out = _op("sum")(g, axis=axes, keepdims=True) if axes else g
    return _op("reshape")(out, shape) if tuple(out.shape) != shape else out


# -------------------------------------------------------------------------------------- the registry
#: name -> {"fn": the public op, "differentiable": bool, "family": str}
REGISTRY: dict[str, dict] = {}
_symbolic_handler: "Callable | None" = None


def set_symbolic_handler(handler: "Callable | None") -> None:
    """Installed by :mod:`dnnbind.layers.base`: ``handler(op, args, kwargs)`` builds the functional-model
    node for an op called on symbolic tensors."""
    global _symbolic_handler
    _symbolic_handler = handler


def _is_symbolic(value: Any) -> bool:
    if hasattr(value, "_keras_history"):
        return True
    if isinstance(value, (list, tuple)):
        return any(hasattr(v, "_keras_history") or (isinstance(v, (list, tuple)) and _is_symbolic(v)) for v in value)
    if isinstance(value, dict):
        return any(_is_symbolic(v) for v in value.values())
    return False


# Types whose values never are, nor hold, a symbolic tensor (a Tensor's slots leave no room for a
# ``_keras_history``): an op's arguments of these types are not inspected on every call
_PLAIN_TYPES = frozenset([Tensor, int, float, bool, str, type(None)])


def _any_symbolic(args: tuple, kwargs: dict) -> bool:
    for a in args:
        if a.__class__ not in _PLAIN_TYPES and _is_symbolic(a):
            return True
    if kwargs:
        for v in kwargs.values():
            if v.__class__ not in _PLAIN_TYPES and _is_symbolic(v):
                return True
    return False


def keras_op(fn: "Callable | None" = None, *, differentiable: bool = True, family: str = "numpy",
             name: "str | None" = None) -> Any:
    """Declare a public op: registered (``REGISTRY``, which the gradient-check harness walks), and
    dispatched to the functional-model builder when an argument is symbolic."""

    def decorate(f: Callable) -> Callable:
        op_name = name or f.__name__

        @functools.wraps(f)
        def op(*args: Any, **kwargs: Any) -> Any:
            if _symbolic_handler is not None and _any_symbolic(args, kwargs):
                return _symbolic_handler(op, args, kwargs)
            return f(*args, **kwargs)

        op.__keras_op__ = op_name
        REGISTRY[op_name] = {"fn": op, "differentiable": differentiable, "family": family}
        return op

    return decorate(fn) if fn is not None else decorate


engine.hooks.wrap = lambda value: value if isinstance(value, Tensor) else Tensor(value)
engine.hooks.tensor = Tensor
engine.hooks.materialize = _materialize
engine.hooks.seed = ones_like_seed
