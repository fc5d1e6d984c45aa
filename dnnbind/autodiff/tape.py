"""``GradientTape``: TensorFlow's tape API over the one engine (:mod:`dnnbind.autodiff.engine`).

::

    with dnnbind.GradientTape() as tape:
        y_pred = model(x, training=True)
        loss = loss_fn(y, y_pred)
    grads = tape.gradient(loss, model.trainable_variables)

While a tape is active in a thread, differentiable operations on trainable variables (and on the
tensors it ``watch``es, and on whatever was computed from them) record nodes. ``gradient`` may be
called once on a non-persistent tape (it frees what the backward kept as it goes, unless another
active tape shares those nodes); ``persistent=True`` allows several calls. Tapes nest: the
gradient computed under an outer tape is itself recorded (higher-order gradients), and several
tapes may be active at once (a GAN's generator and discriminator tapes).
"""

from __future__ import annotations

from typing import Any, Sequence

from . import engine

__all__ = ["GradientTape"]


def _seed(t: Any) -> Any:
    """Ones like ``t``, made only if a VJP reads them (``ops._core.ones_like_seed``, through the hooks)."""
    return engine.hooks.seed(t)


def _flatten(structure: Any) -> "tuple[list, Any]":
    """Leaves of a (nested) list/tuple/dict, and a function putting values back in that structure."""
    if isinstance(structure, dict):
        keys = list(structure)
        parts = [_flatten(structure[k]) for k in keys]
        flat = [leaf for p in parts for leaf in p[0]]

        def rebuild(values: list) -> dict:
            out, i = {}, 0
            for k, (leaves, fn) in zip(keys, parts):
                out[k] = fn(values[i:i + len(leaves)])
                i += len(leaves)
            return out
        return flat, rebuild
    if isinstance(structure, (list, tuple)):
        parts = [_flatten(v) for v in structure]
        flat = [leaf for p in parts for leaf in p[0]]
        kind = type(structure)

        def rebuild(values: list) -> Any:
            out, i = [], 0
            for leaves, fn in parts:
                out.append(fn(values[i:i + len(leaves)]))
                i += len(leaves)
            return out if kind is list else tuple(out)
        return flat, rebuild
    return [structure], lambda values: values[0]


class GradientTape:
    """Records differentiable operations for :meth:`gradient` (TensorFlow's ``tf.GradientTape``).

    ``persistent``: allow several ``gradient`` calls. ``watch_accessed_variables``: trainable variables
    read while the tape is active are watched automatically (else only what :meth:`watch` names)."""

    def __init__(self, persistent: bool = False, watch_accessed_variables: bool = True) -> None:
        self._persistent = bool(persistent)
        self.watch_accessed_variables = bool(watch_accessed_variables)
        self._watched: dict[int, Any] = {}  # id -> variable or tensor explicitly watched
        self._accessed: dict[int, Any] = {}  # id -> variable read while recording
        self._first_seq = 0
        self._last_seq = 0
        self._active = False
        self._used = False

    @property
    def persistent(self) -> bool:
        return self._persistent

    def __enter__(self) -> "GradientTape":
        if self._active:
            raise RuntimeError("this GradientTape is already recording")
        engine._tapes().append(self)
        self._active = True
        self._first_seq = next(engine._seq)
        return self

    def __exit__(self, *exc: Any) -> None:
        tapes = engine._tapes()
        if self in tapes:
            tapes.remove(self)
        self._active = False
        self._last_seq = next(engine._seq)

    def watch(self, tensor: Any) -> None:
        """Differentiate w.r.t. ``tensor`` (a Tensor, a Variable, or a nested structure of them) too."""
        flat, _ = _flatten(tensor)
        for t in flat:
            if hasattr(t, "_leaf"):  # a Variable
                self._watched[id(t)] = t
                t._leaf_node()
            elif hasattr(t, "_node"):
                if t._node is None:
                    t._node, t._index = engine.Leaf(t), 0
                self._watched[id(t)] = t
            else:
                raise TypeError(f"GradientTape.watch: expected a Tensor or a Variable, got {type(t).__name__}; "
                                "convert arrays with keras.ops.convert_to_tensor first")

    def watches(self, variable: Any) -> bool:
        """Whether a read of ``variable`` now should be recorded as an edge to its leaf."""
        if id(variable) in self._watched:
            return True
        return self.watch_accessed_variables and variable.trainable

    def has_accessed(self, variable: Any) -> bool:
        """Whether a read of ``variable`` was recorded on this tape."""
        return id(variable) in self._accessed

    def _note_access(self, variable: Any) -> None:
        self._accessed.setdefault(id(variable), variable)

    def _read_edges(self, variables: Sequence[Any], all_trainable: bool = False) -> tuple:
        """``watches`` and ``_note_access`` for a batch of variables read at once while this tape is the only
        one recording (dnnbind's own layers read all their weights together): per variable, the edge to its
        leaf when this tape watches it, else None. ``all_trainable``: the caller knows every variable is
        trainable now (a layer's ``trainable_weights``)."""
        watched, accessed = self._watched, self._accessed
        auto = self.watch_accessed_variables
        edges = []
        for v in variables:
            key = id(v)
            if (auto and (all_trainable or v.trainable)) or key in watched:
                if key not in accessed:
                    accessed[key] = v
                leaf = v._leaf
                edges.append((leaf if leaf is not None else v._leaf_node(), 0))
            else:
                edges.append(None)
        return tuple(edges)

    def watched_variables(self) -> list:
        """The variables this tape watched (read while recording, or watched explicitly), in first-read order."""
        out = {**self._accessed}
        for k, v in self._watched.items():
            if hasattr(v, "_leaf"):
                out.setdefault(k, v)
        return list(out.values())

    def stop_recording(self) -> "engine.stop_recording":
        """``with tape.stop_recording():`` nothing inside is recorded (by any tape)."""
        return engine.stop_recording()

    def reset(self) -> None:
        """Forget what was recorded so far (TensorFlow's ``reset``)."""
        self._first_seq = next(engine._seq)
        self._accessed = {}

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: str = "none") -> Any:
        """The gradient of ``target`` (a tensor, or a structure of tensors whose gradients add up) w.r.t.
        ``sources`` (a variable or tensor, or a nested list/tuple/dict of them), in ``sources``'
        structure. ``output_gradients``: the seed per target (default ones, i.e. the gradient of the
        sum). ``unconnected_gradients``: ``"none"`` (None for a source the target does not depend on)
        or ``"zero"`` (zeros of its shape)."""
        if unconnected_gradients not in ("none", "zero"):
            raise ValueError(f"GradientTape.gradient: unconnected_gradients must be 'none' or 'zero', got "
                             f"{unconnected_gradients!r}")
        if self._used and not self._persistent:
            raise RuntimeError("A non-persistent GradientTape can only be used to compute one set of gradients "
                               "(or jacobians); use GradientTape(persistent=True) for more")
        ops = engine.hooks.ops
        targets, _ = _flatten(target)
        flat_sources, rebuild = _flatten(sources)
        for s in flat_sources:
            if not (hasattr(s, "_leaf") or hasattr(s, "_node")):
                raise TypeError(f"GradientTape.gradient: sources must be Variables or Tensors, got "
                                f"{type(s).__name__}")
        if any(t is None for t in targets):
            raise TypeError("GradientTape.gradient: a target is None (a loss function that returned nothing?); "
                            "targets must be tensors")
        tensors = [ops.convert_to_tensor(t) if not hasattr(t, "_node") else t for t in targets]
        if output_gradients is None:
            seeds = [_seed(t) for t in tensors]
        else:
            seeds_flat, _ = _flatten(output_gradients)
            if len(seeds_flat) != len(tensors):
                raise ValueError(f"GradientTape.gradient: output_gradients has {len(seeds_flat)} entries for "
                                 f"{len(tensors)} targets")
            seeds = [ops.convert_to_tensor(g) if g is not None else _seed(t)
                     for g, t in zip(seeds_flat, tensors)]
        if self._active:
            self._last_seq = next(engine._seq)  # gradient() inside the with-block: what was recorded so far
        self._used = True
        results = engine.gradient(tensors, seeds, flat_sources, tape=self, release=not self._persistent)
        # a variable stored in another layout (a convolution kernel) gets its gradient in the Keras layout,
        # as Keras returns it (optimizer.apply takes either)
        results = [s._to_keras(g) if g is not None and getattr(s, "_to_keras", None) is not None else g
                   for s, g in zip(flat_sources, results)]
        if unconnected_gradients == "zero":
            results = [ops.zeros_like(s) if g is None else g for s, g in zip(flat_sources, results)]
        return rebuild(results)

    def jacobian(self, target: Any, sources: Any, unconnected_gradients: str = "none",
                 experimental_use_pfor: bool = True) -> Any:
        """The Jacobian of ``target`` w.r.t. each source: shape ``target.shape + source.shape``, one
        gradient per element of ``target`` (needs ``persistent=True`` when ``target`` has more than one element)."""
        ops = engine.hooks.ops
        t = ops.convert_to_tensor(target)
        flat_sources, rebuild = _flatten(sources)
        n = t.size
        rows: list[list] = [[] for _ in flat_sources]
        persistent, self._persistent = self._persistent, True
        try:
            for i in range(n):
                seed = ops.reshape(ops.one_hot(ops.convert_to_tensor(i), n, dtype=t.dtype), t.shape)
                grads = engine.gradient([t], [seed], flat_sources, tape=self, release=False)
                for k, (s, g) in enumerate(zip(flat_sources, grads)):
                    rows[k].append(ops.zeros_like(s) if g is None else g)
        finally:
            self._persistent = persistent
        self._used = True
        out = []
        for s, r in zip(flat_sources, rows):
            shape = tuple(t.shape) + tuple(s.shape)
            out.append(ops.reshape(ops.stack(r), shape) if r else ops.zeros(shape))
        return rebuild(out)
