"""``keras.activations``: every Keras 3 activation, as differentiable functions on tensors, and ``get`` /
``serialize`` / ``deserialize``.

Each takes what ``keras.ops`` takes (a tensor, a variable, a NumPy array...) and returns a
:class:`dnnbind.Tensor` (``linear`` returns its input), with Keras 3's names, arguments, defaults and
numerics (``keras/src/activations/activations.py`` and the backends' ``nn`` functions it calls).

Where ``keras.ops`` has the activation as an op (``ops.relu``, ``ops.sigmoid``, ``ops.tanh``,
``ops.softplus``, ``ops.silu``, and any ``keras.ops.nn`` activation added later: ``ops.gelu``,
``ops.elu``, ``ops.softmax``...), the function calls that op, which may have a one-kernel GPU path;
otherwise it computes the same thing from the elementwise and reduction ops (its *composite*,
``fn.composite``, kept as the reference and tested against Keras either way). Composites keep
gradients finite where a ``where`` discards a branch (``elu`` evaluates ``expm1`` on ``min(x, 0)``).
"""

from __future__ import annotations

import functools
import inspect
import math
import types
from typing import Any, Callable

import numpy as np

from . import ops
from ._keras_objects import deserialize_object, serialize_object
from .kernels import numeric as N
from .ops import _core

__all__ = [
    "celu", "elu", "exponential", "gelu", "glu", "hard_shrink", "hard_sigmoid", "hard_silu", "hard_swish",
    "hard_tanh", "leaky_relu", "linear", "log_sigmoid", "log_softmax", "mish", "relu", "relu6", "selu",
    "sigmoid", "silu", "swish", "soft_shrink", "softmax", "softplus", "softsign", "sparse_plus",
    "sparse_sigmoid", "sparsemax", "squareplus", "tanh", "tanh_shrink", "threshold", "get", "serialize",
    "deserialize",
]

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _prefer_op(name: str) -> Callable[[Callable], Callable]:
    """The activation calls ``keras.ops.<name>`` when that op is registered (looked up per call, so ops
    added to dnnbind.ops later are used without a change here), with this function's arguments bound to
    their names (its defaults win: ``activations.gelu`` is exact, ``ops.gelu`` approximate by default);
    else the composite below runs."""

    def decorate(composite: Callable) -> Callable:
        signature = inspect.signature(composite)

        @functools.wraps(composite)
        def activation(x: Any, *args: Any, **kwargs: Any) -> Any:
            info = _core.REGISTRY.get(name)
            if info is None:
                return composite(x, *args, **kwargs)
            bound = signature.bind(x, *args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            return info["fn"](arguments.pop("x"), **arguments)

        activation.composite = composite
        return activation

    return decorate


def _float(x: Any) -> Any:
    """``x`` as a float tensor (ints and bools take floatx, as the activation ops do)."""
    t = _core.tensor(x)
    return t if _core.is_float(t.dtype) else ops.cast(t, _core.floatx())


# ----- the ReLU family ----------------------------------------------------------------------------------
def relu(x: Any, negative_slope: float = 0.0, max_value: "float | None" = None, threshold: float = 0.0) -> Any:
    """``max(x, 0)``, generalised as Keras's: ``x`` above ``threshold`` (else 0), clipped at ``max_value``
    when given, and ``negative_slope * (x - threshold)`` below the threshold."""
    x = _float(x)
    if negative_slope != 0.0:
        if max_value is None and threshold == 0:
            return leaky_relu(x, negative_slope=negative_slope)
        negative_part = ops.relu(ops.add(ops.negative(x), threshold)) if threshold != 0 else ops.relu(ops.negative(x))
    clip_max = max_value is not None
    if threshold != 0:
        y = ops.where(ops.greater(x, threshold), x, 0.0)
    elif max_value == 6:
        y = relu6(x)
        clip_max = False
    else:
        y = ops.relu(x)
    if clip_max:
        y = ops.clip(y, 0.0, float(max_value))
    if negative_slope != 0.0:
        y = ops.subtract(y, ops.multiply(negative_part, negative_slope))
    return y


@_prefer_op("leaky_relu")
def leaky_relu(x: Any, negative_slope: float = 0.2) -> Any:
    """``x`` for ``x >= 0``, ``negative_slope * x`` below."""
    x = _float(x)
    return ops.where(ops.greater_equal(x, 0.0), x, ops.multiply(x, negative_slope))


@_prefer_op("relu6")
def relu6(x: Any) -> Any:
    """``min(max(x, 0), 6)``."""
    return ops.minimum(ops.maximum(_float(x), 0.0), 6.0)


@_prefer_op("elu")
def elu(x: Any, alpha: float = 1.0) -> Any:
    """``x`` for ``x >= 0``, ``alpha * (exp(x) - 1)`` below."""
    x = _float(x)
    return ops.where(ops.greater_equal(x, 0.0), x, ops.multiply(ops.expm1(ops.minimum(x, 0.0)), alpha))


@_prefer_op("selu")
def selu(x: Any) -> Any:
    """``scale * elu(x, alpha)`` with Klambauer et al.'s ``alpha ~ 1.6733`` and ``scale ~ 1.0507``."""
    return ops.multiply(elu.composite(x, _SELU_ALPHA), _SELU_SCALE)


@_prefer_op("celu")
def celu(x: Any, alpha: float = 1.0) -> Any:
    """``max(x, 0) + alpha * (exp(min(x, 0) / alpha) - 1)``."""
    x = _float(x)
    return ops.add(ops.maximum(x, 0.0), ops.multiply(ops.expm1(ops.divide(ops.minimum(x, 0.0), alpha)), alpha))


def exponential(x: Any) -> Any:
    """``exp(x)``."""
    return ops.exp(x)


def linear(x: Any) -> Any:
    """The identity: ``x`` itself, unconverted (as Keras)."""
    return x


# ----- sigmoid-like -----------------------------------------------------------------------------------------
def sigmoid(x: Any) -> Any:
    """``1 / (1 + exp(-x))``."""
    return ops.sigmoid(x)


def tanh(x: Any) -> Any:
    """The hyperbolic tangent."""
    return ops.tanh(x)


def softplus(x: Any) -> Any:
    """``log(1 + exp(x))``, computed without overflow."""
    return ops.softplus(x)


def silu(x: Any) -> Any:
    """``x * sigmoid(x)`` (alias ``swish``)."""
    return ops.silu(x)


swish = silu


@_prefer_op("softsign")
def softsign(x: Any) -> Any:
    """``x / (1 + |x|)``."""
    x = _float(x)
    return ops.divide(x, ops.add(ops.abs(x), 1.0))


@_prefer_op("hard_sigmoid")
def hard_sigmoid(x: Any) -> Any:
    """``clip(x / 6 + 1/2, 0, 1)``."""
    return ops.clip(ops.add(ops.divide(_float(x), 6.0), 0.5), 0.0, 1.0)


@_prefer_op("hard_silu")
def hard_silu(x: Any) -> Any:
    """``x * hard_sigmoid(x)`` (alias ``hard_swish``)."""
    x = _float(x)
    return ops.multiply(x, hard_sigmoid(x))


hard_swish = hard_silu


@_prefer_op("hard_tanh")
def hard_tanh(x: Any) -> Any:
    """``clip(x, -1, 1)``."""
    return ops.clip(_float(x), -1.0, 1.0)


@_prefer_op("log_sigmoid")
def log_sigmoid(x: Any) -> Any:
    """``log(sigmoid(x)) = -softplus(-x)``."""
    return ops.negative(ops.softplus(ops.negative(_float(x))))


@_prefer_op("sparse_sigmoid")
def sparse_sigmoid(x: Any) -> Any:
    """0 for ``x <= -1``, 1 for ``x >= 1``, ``(x + 1) / 2`` between."""
    x = _float(x)
    inner = ops.multiply(ops.add(x, 1.0), 0.5)
    return ops.where(ops.less_equal(x, -1.0), 0.0, ops.where(ops.greater_equal(x, 1.0), 1.0, inner))


@_prefer_op("gelu")
def gelu(x: Any, approximate: bool = False) -> Any:
    """``x * Phi(x)`` with ``Phi`` the standard normal CDF: exact (``(1 + erf(x / sqrt 2)) / 2``), or with
    ``approximate=True`` the tanh form ``(1 + tanh(sqrt(2/pi) (x + 0.044715 x**3))) / 2``."""
    x = _float(x)
    if approximate:
        inner = ops.multiply(ops.add(x, ops.multiply(ops.power(x, 3.0), 0.044715)), math.sqrt(2.0 / math.pi))
        return ops.multiply(x, ops.multiply(ops.add(ops.tanh(inner), 1.0), 0.5))
    return ops.divide(ops.multiply(x, ops.add(ops.erf(ops.divide(x, math.sqrt(2.0))), 1.0)), 2.0)


@_prefer_op("glu")
def glu(x: Any, axis: int = -1) -> Any:
    """Gated linear unit: ``a * sigmoid(b)`` for the two halves ``a, b`` of ``x`` along ``axis``."""
    x = _float(x)
    if x.shape[axis] % 2 != 0:
        raise ValueError(f"axis size must be divisible by 2. Received: x.shape={tuple(x.shape)} with axis={axis}")
    a, b = ops.split(x, 2, axis=axis)
    return ops.multiply(a, ops.sigmoid(b))


@_prefer_op("mish")
def mish(x: Any) -> Any:
    """``x * tanh(softplus(x))``."""
    x = _float(x)
    return ops.multiply(x, ops.tanh(ops.softplus(x)))


@_prefer_op("squareplus")
def squareplus(x: Any, b: float = 4) -> Any:
    """``(x + sqrt(x**2 + b)) / 2``."""
    x = _float(x)
    return ops.divide(ops.add(x, ops.sqrt(ops.add(ops.square(x), b))), 2.0)


@_prefer_op("sparse_plus")
def sparse_plus(x: Any) -> Any:
    """0 for ``x <= -1``, ``(x + 1)**2 / 4`` for ``-1 < x < 1``, ``x`` above."""
    x = _float(x)
    inner = ops.multiply(ops.square(ops.add(x, 1.0)), 0.25)
    return ops.where(ops.less_equal(x, -1.0), 0.0, ops.where(ops.less(x, 1.0), inner, x))


# ----- shrinkage and thresholds ------------------------------------------------------------------------------
@_prefer_op("tanh_shrink")
def tanh_shrink(x: Any) -> Any:
    """``x - tanh(x)``."""
    x = _float(x)
    return ops.subtract(x, ops.tanh(x))


@_prefer_op("soft_shrink")
def soft_shrink(x: Any, threshold: float = 0.5) -> Any:
    """``x - threshold`` above ``threshold``, ``x + threshold`` below ``-threshold``, 0 between."""
    x = _float(x)
    return ops.where(ops.greater(x, threshold), ops.subtract(x, threshold),
                     ops.where(ops.less(x, -threshold), ops.add(x, threshold), 0.0))


@_prefer_op("hard_shrink")
def hard_shrink(x: Any, threshold: float = 0.5) -> Any:
    """``x`` where ``|x| > threshold``, else 0."""
    x = _float(x)
    return ops.where(ops.greater(ops.abs(x), threshold), x, 0.0)


@_prefer_op("threshold")
def threshold(x: Any, threshold: float, default_value: float) -> Any:
    """``x`` where ``x > threshold``, else ``default_value``."""
    x = _float(x)
    return ops.where(ops.greater(x, threshold), x, float(default_value))


# ----- over an axis ------------------------------------------------------------------------------------------
@_prefer_op("softmax")
def softmax(x: Any, axis: Any = -1) -> Any:
    """``exp(x) / sum(exp(x))`` over ``axis`` (an int or a tuple), from ``x - max(x)``."""
    x = _float(x)
    shifted = ops.subtract(x, ops.stop_gradient(ops.max(x, axis=axis, keepdims=True)))
    e = ops.exp(shifted)
    return ops.divide(e, ops.sum(e, axis=axis, keepdims=True))


@_prefer_op("log_softmax")
def log_softmax(x: Any, axis: Any = -1) -> Any:
    """``x - log(sum(exp(x)))`` over ``axis``, from ``x - max(x)``."""
    x = _float(x)
    shifted = ops.subtract(x, ops.stop_gradient(ops.max(x, axis=axis, keepdims=True)))
    return ops.subtract(shifted, ops.log(ops.sum(ops.exp(shifted), axis=axis, keepdims=True)))


@_prefer_op("sparsemax")
def sparsemax(x: Any, axis: int = -1) -> Any:
    """Martins and Astudillo's sparsemax over ``axis``: the Euclidean projection of ``x`` onto the simplex,
    ``max(x - tau, 0)``, ``tau = (sum of the k largest - 1) / k`` with ``k`` the support size; differentiable
    (the sort is a gather of ``x``).

    Keras 3.15.1 sums the *cumulative* sums over the support instead (keras-team/keras#23425, fixed
    upstream by #23469): its outputs then do not sum to 1 whenever more than one element is in the
    support. This is the corrected algorithm; where the support has one element the two agree."""
    x = _float(x)
    ax = axis % x.ndim
    order = N.argsort(x.data, ax, descending=True)
    z = ops.take_along_axis(x, _core.Tensor(order), axis=ax)
    cumulative = ops.cumsum(z, axis=ax)
    shape = [1] * x.ndim
    shape[ax] = x.shape[ax]
    rank = _core.tensor(np.arange(1, x.shape[ax] + 1, dtype=x.dtype).reshape(shape), like=x.data)
    support = ops.greater(ops.subtract(z, ops.divide(ops.subtract(cumulative, 1.0), rank)), 0.0)
    k = ops.sum(ops.cast(support, x.dtype), axis=ax, keepdims=True)
    tau = ops.divide(ops.subtract(ops.sum(ops.where(support, z, 0.0), axis=ax, keepdims=True), 1.0), k)
    return ops.maximum(ops.subtract(x, tau), 0.0)


# ----- get / serialize / deserialize ---------------------------------------------------------------------------
ALL_OBJECTS_DICT: dict[str, Callable] = {fn.__name__: fn for fn in (
    relu, leaky_relu, relu6, softmax, celu, elu, selu, softplus, softsign, squareplus, soft_shrink, sparse_plus,
    silu, gelu, glu, tanh, tanh_shrink, threshold, sigmoid, sparse_sigmoid, exponential, hard_sigmoid, hard_silu,
    hard_tanh, hard_shrink, linear, mish, log_softmax, log_sigmoid, sparsemax)}
ALL_OBJECTS_DICT["swish"] = silu
ALL_OBJECTS_DICT["hard_swish"] = hard_silu


def serialize(activation: Callable) -> Any:
    """An activation as Keras saves it in a layer config: a built-in one by name (``"relu"``; ``swish`` is
    ``"silu"``), another function as Keras's ``{"class_name": "function", "config": name, ...}`` dict,
    a callable object with ``get_config`` as its class's Keras object dict."""
    name = getattr(activation, "__name__", None)
    if isinstance(activation, types.FunctionType) and ALL_OBJECTS_DICT.get(name) is activation:
        return name
    if isinstance(activation, types.FunctionType):
        return {"module": "builtins", "class_name": "function", "config": name, "registered_name": "function"}
    if hasattr(activation, "get_config"):
        return serialize_object(activation, "keras.activations")
    raise ValueError(f"Unknown activation function '{activation}' cannot be serialized: use a name of "
                     "keras.activations, a named function, or an object with get_config()")


def deserialize(config: Any, custom_objects: "dict | None" = None) -> Callable:
    """The activation a :func:`serialize` result (or a Keras file's) names: a name of this module or of
    ``custom_objects``, or a Keras object dict (``class_name`` "function" with the name as ``config``,
    or a class with its config)."""
    if isinstance(config, dict) and config.get("class_name") == "function":
        config = config.get("config")
    if isinstance(config, str):
        fn = (custom_objects or {}).get(config) or ALL_OBJECTS_DICT.get(config)
        if fn is None:
            raise ValueError(f"Unknown activation {config!r}; known: {', '.join(sorted(ALL_OBJECTS_DICT))} (pass "
                             "custom_objects={name: function} for your own)")
        return fn
    return deserialize_object(config, {}, custom_objects, "activation")


def get(identifier: Any) -> Callable:
    """An activation from a name, a serialized dict, a callable, or None (``linear``)."""
    if identifier is None:
        return linear
    if isinstance(identifier, dict):
        obj = deserialize(identifier)
    elif isinstance(identifier, str):
        obj = ALL_OBJECTS_DICT.get(identifier)
    else:
        obj = identifier
    if callable(obj):
        return obj
    raise ValueError(f"Could not interpret activation function identifier: {identifier}")
