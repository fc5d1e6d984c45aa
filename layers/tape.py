"""Define-by-run tape: the layer applications of one training forward, replayed backwards.

Chainer's anchor, with dnnbind's hand-written backward: no autograd of ops, only of layers. While a
:class:`Tape` is active (``with Tape(training=True) as tape:``), every ``Layer.__call__`` on arrays
runs through :meth:`Tape.run`, which records the application: the layer, which recorded arrays it
read (input *slots*), the slot of what it returned, and a snapshot of what its forward left on
``self`` (``Layer._call_state()``). Functional models run their nodes through :meth:`Tape.run`
directly. :meth:`Tape.backward` then walks the applications in reverse: it restores the snapshot
when a layer was applied more than once (a shared layer), calls ``layer.backward``, sums the
gradients of arrays read by several layers, and sums a shared layer's weight gradients over its
applications into ``layer.grads``.

The rule for subclassed models: only layers are differentiated. An array computed by an op outside
a layer (``x * 2``, ``kernels.add``, a NumPy function) is a constant to the tape. When such a
computation reads a layer's output, that layer receives no gradient, and :meth:`Tape.backward`
raises a ``ValueError`` naming the layer and asking to wrap the computation in a ``Layer`` (with
its own ``backward``). Ops applied to the model *inputs* before the first layer are fine.

Memory: the tape holds references to every array it recorded until it is dropped; a training step
drops it before returning, so nothing allocated in a (captured) step outlives it.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from dnnbind import backend, kernels

__all__ = ["Tape", "active_tape"]

_stack: list["Tape"] = []


def active_tape() -> "Tape | None":
    """The innermost active tape, or None (then layer calls are plain eager calls)."""
    return _stack[-1] if _stack else None


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) or backend.is_device_array(value)


def _drop_new_arrays(layer: Any, before: tuple[dict, dict]) -> None:
    """Put back the attributes a forward pointed at new arrays (on the layer and its ActivationFns)."""
    state, nested = before
    for key, value in list(layer.__dict__.items()):
        if _is_array(value) and state.get(key) is not value:
            setattr(layer, key, state.get(key))
    for key, attrs in nested.items():
        holder = layer.__dict__.get(key)
        if holder is None:
            continue
        for name, value in list(holder.__dict__.items()):
            if _is_array(value) and attrs.get(name) is not value:
                setattr(holder, name, attrs.get(name))


class _Application:
    __slots__ = ("layer", "in_slots", "out_slot", "state", "before", "multi", "done")

    def __init__(self, layer: Any, in_slots: list[int], out_slot: int, state: Any, before: Any, multi: bool) -> None:
        self.layer = layer
        self.in_slots = in_slots
        self.out_slot = out_slot
        self.state = state  # what the forward left on the layer
        self.before = before  # the layer's state before the forward
        self.multi = multi
        self.done = False  # its backward ran


class Tape:
    """The applications of one forward. ``training``: what layer calls without an explicit
    ``training=`` argument use while the tape is active. ``strict``: raise when a recorded layer's
    output received no gradient (subclassed models: it fed a computation the tape cannot see)."""

    def __init__(self, training: bool = True, strict: bool = False) -> None:
        self.training = bool(training)
        self.strict = bool(strict)
        self.applications: list[_Application] = []
        self._slot_of: dict[int, int] = {}  # id(array) -> its latest slot
        self._keep: list[Any] = []  # the arrays whose ids are keys above stay alive, so ids stay unique
        self._produced: set[int] = set()  # slots written by a layer (they can take a gradient)
        self._uses: dict[int, int] = {}  # id(layer) -> applications
        self._last: dict[int, _Application] = {}  # id(layer) -> its latest application
        self._next = 0

    def __enter__(self) -> "Tape":
        _stack.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _stack.remove(self)

    # ----- forward --------------------------------------------------------------------------
    def _new_slot(self, array: Any) -> int:
        slot = self._next
        self._next += 1
        self._slot_of[id(array)] = slot
        self._keep.append(array)
        return slot

    def watch(self, array: Any) -> int:
        """Declare a model input (a source: it takes no gradient)."""
        return self._new_slot(array)

    def _slot(self, array: Any) -> int:
        slot = self._slot_of.get(id(array))
        # an array no layer made (a constant, or an op outside any layer): a source to the tape
        return self._new_slot(array) if slot is None else slot

    def run(self, layer: Any, inputs: Any, training: bool | None = None, logits: bool = False) -> Any:
        """``layer.forward`` (or ``forward_logits``) on ``inputs`` (a list for a multi-input layer), recorded."""
        multi = bool(getattr(layer, "multi_input", False))
        arrays: Sequence[Any] = inputs if multi else [inputs]
        in_slots = [self._slot(a) for a in arrays]
        training = self.training if training is None else training
        before = layer._call_state()
        out = layer.forward_logits(inputs, training=training) if logits else layer.forward(inputs, training=training)
        out_slot = self._new_slot(out)
        self._produced.add(out_slot)
        self._uses[id(layer)] = self._uses.get(id(layer), 0) + 1
        app = _Application(layer, in_slots, out_slot, None, before, multi)
        previous = self._last.get(id(layer))
        if previous is not None:  # what the previous application left is what this one started from
            previous.state = before
        self._last[id(layer)] = app
        self.applications.append(app)
        return out

    # ----- backward -------------------------------------------------------------------------
    def backward(self, seeds: Sequence[tuple[Any, Any]], on_grads: "Callable[[Any], None] | None" = None) -> None:
        """Backpropagate ``(output array, gradient)`` pairs through the recorded applications; fills
        every applied layer's ``grads`` (summed over the applications of a shared layer).

        ``on_grads(layer)``, when given, is called as soon as a layer's ``grads`` are final: after
        its backward, or for a shared layer after the backward of its last application to run (its
        first in the forward). A layer whose output took no gradient is never reported."""
        grads: dict[int, Any] = {}
        for array, grad in seeds:
            slot = self._slot_of.get(id(array))
            if slot is None or slot not in self._produced:
                raise ValueError(
                    "a model output was not produced by a layer (an op outside any Layer made it, or it is an "
                    "input passed through); the tape differentiates layers only: wrap the computation in a "
                    "dnnbind Layer with its own backward")
            grads[slot] = grad if slot not in grads else kernels.add(grads[slot], grad)
        shared_grads: dict[int, dict[str, Any]] = {}
        pending = dict(self._uses) if on_grads is not None else None  # id(layer) -> backward runs to come
        for app in reversed(self.applications):
            layer = app.layer
            dy = grads.pop(app.out_slot, None)
            shared = self._uses[id(layer)] > 1
            if dy is None:
                if self.strict:
                    raise ValueError(
                        f"layer '{layer.name}' ({type(layer).__name__}) received no gradient: its output was "
                        "unused, or read by a computation outside any Layer (x * 2, kernels.add, a NumPy function), "
                        "which the tape cannot differentiate. Wrap that computation in a dnnbind Layer with "
                        "its own backward (see dnnbind.layers.tape)")
                if pending is not None:
                    self._settle(layer, pending, shared_grads, on_grads)
                continue
            if shared and app.state is not None:  # (a layer's last application: its live state)
                layer._restore_call_state(app.state)
            need_dx = any(s in self._produced for s in app.in_slots)
            layer.grads = {}
            dx = layer.backward(dy, need_dx=need_dx)
            app.done = True
            if shared:
                acc = shared_grads.setdefault(id(layer), {})
                for name, g in layer.grads.items():
                    acc[name] = g if name not in acc else kernels.add(acc[name], g)
            if pending is not None:
                self._settle(layer, pending, shared_grads, on_grads, ran=True)
            if not need_dx:
                continue
            dxs = dx if app.multi else [dx]
            for slot, d in zip(app.in_slots, dxs):
                if d is None or slot not in self._produced:
                    continue
                grads[slot] = d if slot not in grads else kernels.add(grads[slot], d)
        for app in self.applications:
            acc = shared_grads.get(id(app.layer))
            if acc is not None:
                app.layer.grads = acc

    def _settle(self, layer: Any, pending: dict[int, int], shared_grads: dict[int, dict[str, Any]],
                on_grads: Callable[[Any], None], ran: bool = False) -> None:
        """One application of ``layer`` was walked; after its last, report the layer if any of its
        backward runs happened (a shared layer's ``grads`` become the sum over its applications)."""
        key = id(layer)
        pending[key] -= 1
        if pending[key]:
            return
        if key in shared_grads:
            layer.grads = shared_grads[key]
        elif not ran:
            return
        on_grads(layer)

    def clear(self) -> None:
        """Drop every reference the tape holds (the arrays of the step). A layer whose backward did not
        run (its output took no gradient, or backward failed) gets its pre-forward state back, so it
        keeps no array of the step either."""
        for app in reversed(self.applications):
            if not app.done:
                _drop_new_arrays(app.layer, app.before)
        self.applications = []
        self._slot_of = {}
        self._keep = []
        self._produced = set()
        self._uses = {}
        self._last = {}
