"""Elementwise ``keras.ops``: math functions, arithmetic, comparisons, logic, bit operations, casts,
``where`` and ``clip``, with Keras's dtype rules and their VJPs.

Each op converts its arguments (:func:`._core.tensors`), decides the result dtype as Keras's NumPy
backend does (``keras/src/backend/numpy/numpy.py``, with 64-bit types kept: see ``_core``), computes
with :mod:`dnnbind.kernels.numeric` (``unary``/``binary``/``where``: NumPy or NVRTC kernels), and
records its VJP. VJPs are written in these ops, so they are differentiable again; the activations
with a hand-written device backward (``relu``, ``sigmoid``, ``tanh``...) take the one-kernel path of
:mod:`dnnbind.kernels` when nothing records the backward itself.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from .. import kernels
from ..autodiff.engine import recording
from ..autodiff.tensor import FilledTensor, Tensor
from ..kernels import numeric as N
from . import _core
from ._core import filled, is_float, keras_op, make, np_dtype, result_type, tensors, unbroadcast

__all__: list[str] = []


def _export(fn: Callable) -> Callable:
    name = getattr(fn, "__keras_op__", fn.__name__)
    fn.__name__ = fn.__qualname__ = name
    __all__.append(name)
    return fn


def _float_of(dt: np.dtype) -> np.dtype:
    """Keras's result dtype of a float function of ``dt``: floats keep theirs, ints and bool take floatx."""
    return dt if is_float(dt) else _core.floatx()


def _zeros_of(t: Tensor) -> Tensor:
    return filled(0.0 if is_float(t.dtype) else 0, t.shape, t.dtype, t.device)


# ------------------------------------------------------------------------------------------- cast
def _cast(x: Any, dtype: Any) -> Tensor:
    """``keras.ops.cast``: ``x`` converted to ``dtype`` (float to int truncates toward zero; to bool:
    nonzero). The gradient of a float-to-float cast is cast back; nothing flows into an int or bool result."""
    (t,) = tensors(x)
    dt = np_dtype(dtype)
    if t.dtype == dt:
        return t
    if isinstance(t, FilledTensor) and t._node is None:
        value = bool(t.value) if dt.kind == "b" else (int(t.value) if dt.kind in "iu" else float(t.value))
        return filled(value, t.shape, dt, t.device)
    out = kernels.cast(t.data, dt)
    if not is_float(dt) or not is_float(t.dtype):
        return Tensor(out)
    src_dtype = t.dtype
    return make(out, (t,), lambda node, g: (cast(g, src_dtype),), "cast")


cast = _export(keras_op(_cast, name="cast"))


# ------------------------------------------------------------------------------------------ unary
def _unary_raw(op: str, t: Tensor, dt: np.dtype, p0: float = 0.0, p1: float = 0.0) -> Any:
    return N.unary(op, t.data, p0=p0, p1=p1, dtype=dt)


def _define_unary(name: str, kernel_op: str, rule: str, vjp: "Callable | None", *, keep_output: bool = False,
                  doc: str = "") -> Callable:
    """A unary op: ``rule`` gives the result dtype (``"same"``, ``"float"``: ints/bool to floatx,
    ``"bool"``, ``"num"``: bool to int32, ``"floatfn"``: as float but int64 too). ``vjp(x, y, g)``
    (``y`` only with ``keep_output``)."""

    def impl(x: Any) -> Tensor:
        (t,) = tensors(x)
        if rule == "same":
            dt = t.dtype
        elif rule == "bool":
            dt = np.dtype(np.bool_)
        elif rule == "num":
            dt = np.dtype(np.int32) if t.dtype.kind == "b" else t.dtype
        else:
            dt = _float_of(t.dtype)
        if vjp is None or not is_float(dt):
            return Tensor(_unary_raw(kernel_op, t, dt))
        src = t if t.dtype == dt else cast(t, dt)
        out = _unary_raw(kernel_op, src, dt)

        def backward(node: Any, g: Tensor) -> tuple:
            y = node.output(0) if keep_output else None
            return (vjp(src, y, g),)

        return make(out, (src,), backward, name, keep_outputs=keep_output)

    impl.__name__ = name
    impl.__qualname__ = name
    impl.__doc__ = doc or f"Elementwise ``{name}`` (``keras.ops.{name}``)."
    op = keras_op(impl, name=name, differentiable=vjp is not None)
    globals()[name] = op
    __all__.append(name)
    return op


def _d(fn: Callable) -> Callable:
    return fn


_SQRT_PI_2 = 2.0 / math.sqrt(math.pi)
_LN2 = math.log(2.0)
_LN10 = math.log(10.0)

# name: (kernel op, dtype rule, vjp(x, y, g), keeps output)
_UNARY_TABLE: dict[str, tuple] = {
    "negative": ("negative", "same", lambda x, y, g: negative(g), False),
    "positive": ("positive", "same", lambda x, y, g: g, False),
    "absolute": ("abs", "same", lambda x, y, g: multiply(g, sign(x)), False),
    "sign": ("sign", "same", lambda x, y, g: _zeros_of(x), False),
    "square": ("square", "num", lambda x, y, g: multiply(g, multiply(x, 2.0)), False),
    "sqrt": ("sqrt", "float", lambda x, y, g: divide(g, multiply(y, 2.0)), True),
    "rsqrt": ("rsqrt", "float", lambda x, y, g: multiply(g, multiply(multiply(y, multiply(y, y)), -0.5)), True),
    "cbrt": ("cbrt", "float", lambda x, y, g: divide(g, multiply(square(y), 3.0)), True),
    "reciprocal": ("reciprocal", "same", lambda x, y, g: negative(multiply(g, square(y))), True),
    "exp": ("exp", "float", lambda x, y, g: multiply(g, y), True),
    "exp2": ("exp2", "float", lambda x, y, g: multiply(g, multiply(y, _LN2)), True),
    "expm1": ("expm1", "float", lambda x, y, g: multiply(g, add(y, 1.0)), True),
    "log": ("log", "float", lambda x, y, g: divide(g, x), False),
    "log2": ("log2", "float", lambda x, y, g: divide(g, multiply(x, _LN2)), False),
    "log10": ("log10", "float", lambda x, y, g: divide(g, multiply(x, _LN10)), False),
    "log1p": ("log1p", "float", lambda x, y, g: divide(g, add(x, 1.0)), False),
    "sin": ("sin", "float", lambda x, y, g: multiply(g, cos(x)), False),
    "cos": ("cos", "float", lambda x, y, g: negative(multiply(g, sin(x))), False),
    "tan": ("tan", "float", lambda x, y, g: multiply(g, add(square(y), 1.0)), True),
    "arcsin": ("arcsin", "float", lambda x, y, g: multiply(g, rsqrt(subtract(1.0, square(x)))), False),
    "arccos": ("arccos", "float", lambda x, y, g: negative(multiply(g, rsqrt(subtract(1.0, square(x))))), False),
    "arctan": ("arctan", "float", lambda x, y, g: divide(g, add(square(x), 1.0)), False),
    "sinh": ("sinh", "float", lambda x, y, g: multiply(g, cosh(x)), False),
    "cosh": ("cosh", "float", lambda x, y, g: multiply(g, sinh(x)), False),
    "tanh": ("tanh", "float", None, True),  # defined below with the one-kernel backward
    "arcsinh": ("arcsinh", "float", lambda x, y, g: multiply(g, rsqrt(add(square(x), 1.0))), False),
    "arccosh": ("arccosh", "float", lambda x, y, g: multiply(g, rsqrt(subtract(square(x), 1.0))), False),
    "arctanh": ("arctanh", "float", lambda x, y, g: divide(g, subtract(1.0, square(x))), False),
    "floor": ("floor", "float", lambda x, y, g: _zeros_of(x), False),
    "ceil": ("ceil", "float", lambda x, y, g: _zeros_of(x), False),
    "trunc": ("trunc", "same", lambda x, y, g: _zeros_of(x), False),
    "erf": ("erf", "float", lambda x, y, g: multiply(g, multiply(exp(negative(square(x))), _SQRT_PI_2)), False),
    "erfc": ("erfc", "float", lambda x, y, g: multiply(g, multiply(exp(negative(square(x))), -_SQRT_PI_2)), False),
    "erfinv": ("erfinv", "float", lambda x, y, g: multiply(g, multiply(exp(square(y)), 1.0 / _SQRT_PI_2)), True),
    "isnan": ("isnan", "bool", None, False),
    "isinf": ("isinf", "bool", None, False),
    "isfinite": ("isfinite", "bool", None, False),
    "isposinf": ("isposinf", "bool", None, False),
    "isneginf": ("isneginf", "bool", None, False),
    "signbit": ("signbit", "bool", None, False),
    "logical_not": ("logical_not", "bool", None, False),
}

for _name, (_kop, _rule, _vjp, _keep) in _UNARY_TABLE.items():
    if _name not in ("tanh",):
        _define_unary(_name, _kop, _rule, _vjp, keep_output=_keep)

# Keras's aliases
abs = _export(keras_op(lambda x: absolute(x), name="abs"))  # noqa: A001
abs.__doc__ = "``keras.ops.abs``: the absolute value (``absolute``)."


def _fabs(x: Any) -> Tensor:
    """``keras.ops.fabs``: the absolute value, as a float (ints take floatx)."""
    (t,) = tensors(x)
    return absolute(t if is_float(t.dtype) else cast(t, _core.floatx()))


fabs = _export(keras_op(_fabs, name="fabs"))


def _bitwise_invert(x: Any) -> Tensor:
    """``keras.ops.bitwise_invert``: ``~x`` for integers and bools."""
    (t,) = tensors(x)
    if t.dtype.kind not in "iub":
        raise TypeError(f"bitwise_invert: x must be an integer or bool tensor, got dtype {t.dtype}")
    if t.dtype.kind == "b":
        return logical_not(t)
    return Tensor(N.unary("bitwise_invert", t.data))


bitwise_invert = _export(keras_op(_bitwise_invert, name="bitwise_invert", differentiable=False))
bitwise_not = _export(keras_op(lambda x: bitwise_invert(x), name="bitwise_not", differentiable=False))


def _round(x: Any, decimals: int = 0) -> Tensor:
    """``keras.ops.round``: half to even, at ``decimals`` decimal places (gradient zero)."""
    (t,) = tensors(x)
    if decimals == 0:
        if t.dtype.kind in "iub":
            return t
        return make(N.unary("round", t.data), (t,), lambda node, g: (_zeros_of(g),), "round")
    scale = 10.0 ** int(decimals)
    if t.dtype.kind in "iu":
        if decimals >= 0:
            return t
        return cast(multiply(_round(divide(t, scale)), scale), t.dtype)
    return divide(_round(multiply(t, scale)), scale)


round = _export(keras_op(_round, name="round"))  # noqa: A001


# the activations with a one-kernel device backward (kernels.activation_backward), first-order
# Tensor subclass -> f(x1, x2) / f(x): an op of another room that folds a following add or relu into
# itself (ops/_conv.py's PendingConv: conv + bias + relu as one cuDNN call); None from f: no fusion.
ADD_HOOKS: dict = {}
RELU_HOOKS: dict = {}


def _activation_op(name: str, kind: str, composed_vjp: Callable, float_only: bool = True) -> Callable:
    hooks = RELU_HOOKS if name == "relu" else None

    def impl(x: Any) -> Tensor:
        if hooks:
            hook = hooks.get(type(x))
            if hook is not None:
                fused = hook(x)
                if fused is not None:
                    return fused
        (t,) = tensors(x)
        dt = _float_of(t.dtype)
        src = t if t.dtype == dt else cast(t, dt)
        y = kernels.activation_forward(src.data, kind)

        def backward(node: Any, g: Tensor) -> tuple:
            if recording():  # an outer tape records this backward: the composed, differentiable form
                return (composed_vjp(src, node.output(0), g),)
            gd = g.data if g.dtype == dt else cast(g, dt).data
            return (Tensor(kernels.activation_backward(gd, src.data, node.outputs_raw[0], kind)),)

        return make(y, (src,), backward, name, keep_outputs=True)

    impl.__name__ = name
    impl.__doc__ = f"``keras.ops.{name}`` (elementwise; on the GPU one kernel each way)."
    op = keras_op(impl, name=name, family="nn")
    globals()[name] = op
    __all__.append(name)
    return op


_activation_op("tanh", "tanh", lambda x, y, g: multiply(g, subtract(1.0, square(y))))
_activation_op("sigmoid", "sigmoid", lambda x, y, g: multiply(g, multiply(y, subtract(1.0, y))))
_activation_op("relu", "relu", lambda x, y, g: multiply(g, cast(greater(x, 0.0), g.dtype)))
_activation_op("softplus", "softplus", lambda x, y, g: multiply(g, sigmoid(x)))
_activation_op("silu", "swish", lambda x, y, g: multiply(g, add(sigmoid(x), multiply(y, subtract(1.0, sigmoid(x))))))
swish = _export(keras_op(lambda x: silu(x), name="swish", family="nn"))


# ----------------------------------------------------------------------------------------- binary
def _binary_dtype(kind: str, a: Any, b: Any) -> np.dtype:
    if kind == "promote":
        return np_dtype(result_type(a, b))
    if kind == "float":
        return np_dtype(result_type(a, b, float))
    if kind == "bool":
        return np.dtype(np.bool_)
    if kind == "int":
        return np_dtype(result_type(a, b))
    raise AssertionError(kind)


def _operands(x1: Any, x2: Any) -> tuple:
    """Tensors for array operands, Python numbers kept (weak): ``(a, b, raw a, raw b)``."""
    num1 = isinstance(x1, (bool, int, float)) and not isinstance(x1, np.generic)
    num2 = isinstance(x2, (bool, int, float)) and not isinstance(x2, np.generic)
    if num1 and num2:
        x1 = _core.convert_to_tensor(x1)
        num1 = False
    ts = tensors(*[v for v, n in ((x1, num1), (x2, num2)) if not n])
    it = iter(ts)
    a = x1 if num1 else next(it)
    b = x2 if num2 else next(it)
    return a, b


def _raw_operand(v: Any, dt: np.dtype) -> Any:
    """A tensor's array, or a Python number as it is (the kernels take numbers as scalar operands)."""
    return v.data if isinstance(v, Tensor) else v


def _shape_of(v: Any) -> tuple:
    return tuple(v.shape) if isinstance(v, Tensor) else ()


def _define_binary(name: str, kernel_op: str, kind: str, vjp: "Callable | None", *, doc: str = "",
                   family: str = "numpy") -> Callable:
    """A binary op with NumPy broadcasting; ``vjp(a, b, y, g) -> (ga, gb)`` on the broadcast shape
    (unbroadcast here). Python numbers stay weak operands (never differentiated)."""

    hooks = ADD_HOOKS if name == "add" else None

    def impl(x1: Any, x2: Any) -> Tensor:
        if hooks:
            hook = hooks.get(type(x1)) or hooks.get(type(x2))
            if hook is not None:
                fused = hook(x1, x2)
                if fused is not None:
                    return fused
        a, b = _operands(x1, x2)
        dt = _binary_dtype(kind, a, b)
        if kind in ("promote", "float", "int"):
            # operands in the result type (ints of a float op become floats), Python numbers as they are
            if isinstance(a, Tensor) and a.dtype != dt:
                a = cast(a, dt)
            if isinstance(b, Tensor) and b.dtype != dt:
                b = cast(b, dt)
        fast = _filled_fast(name, a, b, dt)
        if fast is not None:
            return fast
        out = N.binary(kernel_op, _raw_operand(a, dt), _raw_operand(b, dt), dtype=dt)
        if vjp is None or not is_float(dt):
            return Tensor(out)
        ta = a if isinstance(a, Tensor) else None
        tb = b if isinstance(b, Tensor) else None

        def backward(node: Any, g: Tensor) -> tuple:
            ga, gb = vjp(a, b, g)
            need = node.needs_input_grad
            ga = unbroadcast(ga, _shape_of(a)) if (ta is not None and need[0] and ga is not None) else None
            gb = unbroadcast(gb, _shape_of(b)) if (tb is not None and need[1] and gb is not None) else None
            return ga, gb

        return make(out, (ta, tb), backward, name)

    impl.__name__ = name
    impl.__doc__ = doc or f"Elementwise ``{name}`` with broadcasting (``keras.ops.{name}``)."
    op = keras_op(impl, name=name, differentiable=vjp is not None, family=family)
    globals()[name] = op
    __all__.append(name)
    return op


def _filled_fast(name: str, a: Any, b: Any, dt: np.dtype) -> "Tensor | None":
    """Host-known operands need no kernel: a filled tensor times a number stays filled, and
    ``x * filled`` is one scale kernel instead of a fill and a multiply."""
    fa, fb = isinstance(a, FilledTensor), isinstance(b, FilledTensor)
    if not (fa or fb) or not is_float(dt):
        return None
    if (fa and a._node is not None) or (fb and b._node is not None):
        return None
    va = a.value if fa else (a if not isinstance(a, Tensor) else None)
    vb = b.value if fb else (b if not isinstance(b, Tensor) else None)
    if va is not None and vb is not None:  # both host-known
        shape = N.broadcast_shapes(_shape_of(a), _shape_of(b), op=name)
        device = (a if fa else b).device
        fn = {"add": lambda p, q: p + q, "subtract": lambda p, q: p - q, "multiply": lambda p, q: p * q,
              "divide": lambda p, q: p / q if q != 0 else math.copysign(math.inf, p) * (1 if q == 0 else 0)}.get(name)
        if fn is None:
            return None
        return filled(fn(float(va), float(vb)), shape, dt, device)
    if name == "multiply":
        value, other = (a.value, b) if fa else (b.value, a)
        if N.broadcast_shapes(_shape_of(a), _shape_of(b), op=name) != tuple(other.shape):
            return None
        if value == 1.0 and other.dtype == dt:
            return other
        return _scale(other, float(value), dt)
    if name == "divide" and fb:
        if N.broadcast_shapes(_shape_of(a), _shape_of(b), op=name) != tuple(a.shape):
            return None
        return _scale(a, 1.0 / float(b.value) if b.value != 0 else math.inf, dt)
    return None


def _scale(t: Tensor, value: float, dt: np.dtype) -> Tensor:
    """``t * value`` (one kernel; differentiable in ``t``)."""
    src = t if t.dtype == dt else cast(t, dt)
    out = N.unary("scale_shift", src.data, p0=value, p1=0.0, dtype=dt)
    return make(out, (src,), lambda node, g: (multiply(g, value),), "multiply")


def _v_add(a, b, g):
    return g, g


def _v_sub(a, b, g):
    return g, negative(g)


def _v_mul(a, b, g):
    return (multiply(g, b) if isinstance(a, Tensor) else None), (multiply(g, a) if isinstance(b, Tensor) else None)


def _v_div(a, b, g):
    ga = divide(g, b) if isinstance(a, Tensor) else None
    gb = negative(divide(multiply(g, a), multiply(b, b))) if isinstance(b, Tensor) else None
    return ga, gb


def _v_pow(a, b, g):
    ga = gb = None
    if isinstance(a, Tensor):
        # d/da a**b = b * a**(b-1); at a == 0 with b >= 1 this is finite (JAX's rule)
        ga = multiply(g, multiply(b, power(a, subtract(b, 1.0))))
    if isinstance(b, Tensor):
        y = power(a, b)
        safe = where(equal(a, 0.0), 1.0, a)
        gb = multiply(g, where(equal(a, 0.0), 0.0, multiply(y, log(safe))))
    return ga, gb


def _select_vjp(pick_a: Callable) -> Callable:
    def vjp(a, b, g):
        mask = pick_a(a, b)  # bool tensor: where the result came from a
        ga = where(mask, g, 0.0) if isinstance(a, Tensor) else None
        gb = where(mask, 0.0, g) if isinstance(b, Tensor) else None
        return ga, gb
    return vjp


def _v_atan2(a, b, g):
    den = add(square(a), square(b))
    ga = multiply(g, divide(b, den)) if isinstance(a, Tensor) else None
    gb = negative(multiply(g, divide(a, den))) if isinstance(b, Tensor) else None
    return ga, gb


def _v_hypot(a, b, g):
    h = hypot(a, b)
    ga = multiply(g, divide(a, h)) if isinstance(a, Tensor) else None
    gb = multiply(g, divide(b, h)) if isinstance(b, Tensor) else None
    return ga, gb


def _v_logaddexp(a, b, g):
    y = logaddexp(a, b)
    ga = multiply(g, exp(subtract(a, y))) if isinstance(a, Tensor) else None
    gb = multiply(g, exp(subtract(b, y))) if isinstance(b, Tensor) else None
    return ga, gb


def _v_logaddexp2(a, b, g):
    y = logaddexp2(a, b)
    ga = multiply(g, exp2(subtract(a, y))) if isinstance(a, Tensor) else None
    gb = multiply(g, exp2(subtract(b, y))) if isinstance(b, Tensor) else None
    return ga, gb


def _v_mod(a, b, g):
    ga = g if isinstance(a, Tensor) else None
    gb = negative(multiply(g, floor_divide(a, b))) if isinstance(b, Tensor) else None
    return ga, gb


def _v_fmod(a, b, g):
    ga = g if isinstance(a, Tensor) else None
    gb = negative(multiply(g, trunc(divide(a, b)))) if isinstance(b, Tensor) else None
    return ga, gb


def _v_zero(a, b, g):
    return (_zeros_of(a) if isinstance(a, Tensor) else None), (_zeros_of(b) if isinstance(b, Tensor) else None)


def _v_copysign(a, b, g):
    ga = multiply(g, multiply(sign(a), sign(copysign(1.0, b)))) if isinstance(a, Tensor) else None
    return ga, (_zeros_of(b) if isinstance(b, Tensor) else None)


_define_binary("add", "add", "promote", _v_add)
_define_binary("subtract", "subtract", "promote", _v_sub)
_define_binary("multiply", "multiply", "promote", _v_mul)
_define_binary("divide", "divide", "float", _v_div)
_define_binary("floor_divide", "floor_divide", "promote", _v_zero)
_define_binary("power", "power", "promote", _v_pow)
_define_binary("maximum", "maximum", "promote", _select_vjp(lambda a, b: greater_equal(a, b)))
_define_binary("minimum", "minimum", "promote", _select_vjp(lambda a, b: less_equal(a, b)))
_define_binary("fmax", "fmax", "promote", _select_vjp(lambda a, b: logical_or(greater_equal(a, b), isnan(b))))
_define_binary("fmin", "fmin", "promote", _select_vjp(lambda a, b: logical_or(less_equal(a, b), isnan(b))))
_define_binary("arctan2", "arctan2", "float", _v_atan2)
_define_binary("hypot", "hypot", "float", _v_hypot)
_define_binary("logaddexp", "logaddexp", "float", _v_logaddexp)
_define_binary("logaddexp2", "logaddexp2", "float", _v_logaddexp2)
_define_binary("copysign", "copysign", "float", _v_copysign)
_define_binary("nextafter", "nextafter", "float", None)
_define_binary("heaviside", "heaviside", "promote", _v_zero)
_define_binary("fmod", "fmod", "promote", _v_fmod)
for _name in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_and", "logical_or",
              "logical_xor"):
    _define_binary(_name, _name, "bool", None)
for _name in ("bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "gcd", "lcm"):
    _define_binary(_name, _name, "int", None)


def _mod_impl(x1: Any, x2: Any) -> Tensor:
    """``keras.ops.mod``: the remainder with the divisor's sign (Python's ``%``); bool becomes int32."""
    a, b = _operands(x1, x2)
    if result_type(a, b) == "bool":
        a = cast(a, "int32") if isinstance(a, Tensor) else int(a)
    return _mod_base(a, b)


_mod_base = _define_binary("mod", "mod", "promote", _v_mod)
globals()["mod"] = _core.REGISTRY["mod"]["fn"] = keras_op(_mod_impl, name="mod")
mod = globals()["mod"]

true_divide = _export(keras_op(lambda x1, x2: divide(x1, x2), name="true_divide"))
bitwise_left_shift = _export(keras_op(lambda x, y: left_shift(x, y), name="bitwise_left_shift",
                                      differentiable=False))
bitwise_right_shift = _export(keras_op(lambda x, y: right_shift(x, y), name="bitwise_right_shift",
                                       differentiable=False))


def _ldexp(x1: Any, x2: Any) -> Tensor:
    """``keras.ops.ldexp``: ``x1 * 2**x2`` (``x2`` an integer tensor)."""
    a, b = _operands(x1, x2)
    if isinstance(b, Tensor) and b.dtype.kind not in "iu":
        raise TypeError(f"ldexp: x2 must be an integer tensor, got dtype {b.dtype}")
    return multiply(a, exp2(cast(b, _float_of(a.dtype if isinstance(a, Tensor) else np.dtype(np.float32)))
                            if isinstance(b, Tensor) else float(b)))


ldexp = _export(keras_op(_ldexp, name="ldexp"))


def _logical_ops_or_bitwise(op_bool: str, op_int: str) -> Callable:
    def fn(x1: Any, x2: Any) -> Tensor:
        a, b = _operands(x1, x2)
        kinds = {v.dtype.kind if isinstance(v, Tensor) else ("b" if isinstance(v, bool) else "i") for v in (a, b)}
        return globals()[op_bool if kinds == {"b"} else op_int](a, b)
    return fn


# what Python's &, |, ^ and ~ mean on tensors: logical on bools, bitwise on ints
logical_and_or_bitwise = _logical_ops_or_bitwise("logical_and", "bitwise_and")
logical_or_or_bitwise = _logical_ops_or_bitwise("logical_or", "bitwise_or")
logical_xor_or_bitwise = _logical_ops_or_bitwise("logical_xor", "bitwise_xor")


def invert_or_not(x: Any) -> Tensor:
    (t,) = tensors(x)
    return logical_not(t) if t.dtype.kind == "b" else bitwise_invert(t)


# ------------------------------------------------------------------------------------- where, clip
def _where(condition: Any, x1: Any = None, x2: Any = None) -> Any:
    """``keras.ops.where``: ``x1`` where ``condition`` else ``x2`` (broadcast; result dtype Keras's
    promotion of the two); with only ``condition``, the indices of its nonzero elements (``nonzero``)."""
    if x1 is None and x2 is None:
        return _core.REGISTRY["nonzero"]["fn"](condition)
    if x1 is None or x2 is None:
        raise ValueError("where: give both x1 and x2, or neither")
    (c,) = tensors(condition)
    a, b = _operands(x1, x2)
    dt = np_dtype(result_type(a, b))
    if isinstance(a, Tensor) and a.dtype != dt:
        a = cast(a, dt)
    if isinstance(b, Tensor) and b.dtype != dt:
        b = cast(b, dt)
    like = c.data if not isinstance(a, Tensor) and not isinstance(b, Tensor) else None
    if like is not None:  # both numbers: the condition's shape
        out = N.where(c.data, N.full(c.shape, a, dt, device=c.device) if True else a, b, dtype=dt)
    else:
        cd = c.data
        if isinstance(a, Tensor) and _core.backend.is_device_array(a.data) and not _core.backend.is_device_array(cd):
            cd = _core.tensor(cd, a.data).data
        elif isinstance(b, Tensor) and _core.backend.is_device_array(b.data) and not _core.backend.is_device_array(cd):
            cd = _core.tensor(cd, b.data).data
        c = Tensor(cd)
        out = N.where(cd, _raw_operand(a, dt), _raw_operand(b, dt), dtype=dt)
    if not is_float(dt):
        return Tensor(out)
    ta = a if isinstance(a, Tensor) else None
    tb = b if isinstance(b, Tensor) else None

    def backward(node: Any, g: Tensor) -> tuple:
        need = node.needs_input_grad
        ga = unbroadcast(where(c, g, 0.0), ta.shape) if ta is not None and need[0] else None
        gb = unbroadcast(where(c, 0.0, g), tb.shape) if tb is not None and need[1] else None
        return ga, gb

    return make(out, (ta, tb), backward, "where")


where = _export(keras_op(_where, name="where"))


def _clip(x: Any, x_min: Any, x_max: Any) -> Tensor:
    """``keras.ops.clip``: ``min(max(x, x_min), x_max)`` (bool becomes int32; the gradient passes where
    ``x`` is inside ``[x_min, x_max]``)."""
    (t,) = tensors(x)
    if t.dtype.kind == "b":
        t = cast(t, "int32")
    if isinstance(x_min, (int, float)) and isinstance(x_max, (int, float)) and not isinstance(x_min, bool):
        out = N.unary("clip", t.data, p0=float(x_min), p1=float(x_max))
        if not is_float(t.dtype):
            return Tensor(out)
        lo, hi = float(x_min), float(x_max)
        return make(out, (t,), lambda node, g: (where(logical_and(greater_equal(t, lo), less_equal(t, hi)), g, 0.0),),
                    "clip")
    return minimum(maximum(t, x_min), x_max) if t.dtype.kind == "f" or is_float(t.dtype) else cast(
        minimum(maximum(t, x_min), x_max), t.dtype)


clip = _export(keras_op(_clip, name="clip"))


# --------------------------------------------------------------------------- complex (NumPy only)
def _complex_only(name: str, fn: Callable) -> Callable:
    def impl(x: Any) -> Tensor:
        (t,) = tensors(x)
        if _core.backend.is_device_array(t.data):
            raise NotImplementedError(f"{name}: complex numbers are not supported on the CUDA backend (DeviceArray "
                                      "has no complex dtypes); compute it on the CPU backend")
        return Tensor(np.ascontiguousarray(fn(t.data)))

    impl.__name__ = name
    impl.__doc__ = f"``keras.ops.{name}`` (complex support: the NumPy backend only)."
    op = keras_op(impl, name=name, differentiable=False)
    globals()[name] = op
    __all__.append(name)
    return op


_complex_only("conj", np.conj)
_complex_only("real", lambda a: np.real(a).copy())
_complex_only("imag", lambda a: np.imag(a).astype(a.dtype) if a.dtype.kind != "c" else np.imag(a).copy())
_complex_only("angle", lambda a: np.angle(a).astype(np.float32 if a.dtype.kind != "c" and a.dtype != np.float64
                                                     else np.angle(a).dtype))
conjugate = _export(keras_op(lambda x: conj(x), name="conjugate", differentiable=False))

__all__ = sorted(set(__all__))
