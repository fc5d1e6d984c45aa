"""User-defined differentiable operations: :class:`Function` (PyTorch's ``autograd.Function`` form) and
:func:`custom_gradient` (Keras's ``keras.ops.custom_gradient``).

::

    class Exp(dnnbind.autodiff.Function):
        @staticmethod
        def forward(ctx, x):
            y = keras.ops.exp(x)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, dy):
            (y,) = ctx.saved_tensors
            return dy * y

    y = Exp.apply(x)

``forward`` runs with recording stopped (its operations record nothing) on the arguments converted to
tensors; ``apply`` then records one node whose VJP is ``backward``. ``backward`` returns one gradient
per positional argument of ``forward`` (None for a non-differentiable one) and is itself recorded when
an outer tape is active, so it may be differentiated again if it is written in ``keras.ops``.
"""

from __future__ import annotations

from typing import Any, Callable

from . import engine

__all__ = ["Function", "FunctionCtx", "custom_gradient"]


class FunctionCtx:
    """What :meth:`Function.forward` leaves for :meth:`Function.backward`."""

    def __init__(self) -> None:
        self.saved_tensors: tuple = ()
        self.needs_input_grad: tuple = ()
        self._non_differentiable: set[int] = set()

    def save_for_backward(self, *tensors: Any) -> None:
        self.saved_tensors = tuple(tensors)

    def mark_non_differentiable(self, *tensors: Any) -> None:
        self._non_differentiable.update(id(t) for t in tensors)


def _edge(ops: Any, value: Any) -> "tuple[Any, tuple | None]":
    """``(tensor, edge)`` for one argument: a tensor (a variable read as one), and its edge or None."""
    if hasattr(value, "_node") or hasattr(value, "_leaf"):
        t = ops.convert_to_tensor(value)
        node = t._node
        return t, (None if node is None else (node, t._index))
    return value, None


class Function:
    """Base class of a user-defined differentiable operation (see the module docstring)."""

    @staticmethod
    def forward(ctx: FunctionCtx, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("a Function defines forward(ctx, *args)")

    @staticmethod
    def backward(ctx: FunctionCtx, *grads: Any) -> Any:
        raise NotImplementedError("a Function defines backward(ctx, *grads)")

    @classmethod
    def apply(cls, *args: Any, **kwargs: Any) -> Any:
        ops = engine.hooks.ops
        pairs = [_edge(ops, a) for a in args]
        inputs = [p[0] for p in pairs]
        edges = tuple(p[1] for p in pairs)
        ctx = FunctionCtx()
        with engine.stop_recording():
            out = cls.forward(ctx, *inputs, **kwargs)
        multiple = isinstance(out, (tuple, list))
        outs = [ops.convert_to_tensor(o) for o in (out if multiple else (out,))]
        if not engine.recording() or all(e is None for e in edges):
            return tuple(outs) if multiple else outs[0]

        def vjp(node: engine.Node, *grads: Any) -> tuple:
            ctx.needs_input_grad = node.needs_input_grad
            filled = [ops.zeros_like(o) if g is None else g for g, o in zip(grads, node.saved)]
            res = cls.backward(ctx, *filled)
            res = tuple(res) if isinstance(res, (tuple, list)) else (res,)
            if len(res) != len(edges):
                raise RuntimeError(f"{cls.__name__}.backward returned {len(res)} gradients for {len(edges)} inputs")
            return res

        raw = tuple(o.data for o in outs)
        recorded = engine.record(raw, edges, vjp, cls.__name__, multiple=True)
        recorded[0]._node.saved = tuple(ops.stop_gradient(o) for o in outs)  # shapes/dtypes for the zeros
        result = [r if id(o) not in ctx._non_differentiable else o for r, o in zip(recorded, outs)]
        return tuple(result) if multiple else result[0]


def custom_gradient(f: Callable) -> Callable:
    """Keras's ``keras.ops.custom_gradient``: ``f(*args)`` returns ``(y, grad_fn)``; ``grad_fn(upstream)``
    (or ``grad_fn(*upstream)`` for several outputs; a ``upstream=`` keyword is also accepted, as JAX's form
    writes it) returns the gradient of each positional argument. ``f`` runs with recording stopped."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ops = engine.hooks.ops
        pairs = [_edge(ops, a) for a in args]
        inputs = [p[0] for p in pairs]
        edges = tuple(p[1] for p in pairs)
        with engine.stop_recording():
            y, grad_fn = f(*inputs, **kwargs)
        multiple = isinstance(y, (tuple, list))
        outs = [ops.convert_to_tensor(o) for o in (y if multiple else (y,))]
        if not engine.recording() or all(e is None for e in edges):
            return tuple(outs) if multiple else outs[0]

        def vjp(node: engine.Node, *grads: Any) -> tuple:
            filled = [ops.zeros_like(o) if g is None else g for g, o in zip(grads, node.saved)]
            try:
                res = grad_fn(*filled)
            except TypeError:
                if len(filled) != 1:
                    raise
                res = grad_fn(upstream=filled[0])
            res = tuple(res) if isinstance(res, (tuple, list)) else (res,)
            if len(res) != len(edges):
                raise RuntimeError(f"custom_gradient '{getattr(f, '__name__', f)}': the gradient function returned "
                                   f"{len(res)} gradients for {len(edges)} arguments")
            return res

        recorded = engine.record(tuple(o.data for o in outs), edges, vjp, getattr(f, "__name__", "custom_gradient"),
                                 multiple=True)
        recorded[0]._node.saved = tuple(ops.stop_gradient(o) for o in outs)
        return tuple(recorded) if multiple else recorded[0]

    wrapper.__name__ = getattr(f, "__name__", "custom_gradient")
    wrapper.__doc__ = getattr(f, "__doc__", None)
    return wrapper
