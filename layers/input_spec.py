"""``keras.layers.InputSpec``: Keras 3's description of the inputs a layer accepts. A layer that sets its
``input_spec`` attribute has its inputs checked by :func:`assert_input_compatibility` at each eager call
(``Layer.__call__``), as Keras does. A leaf of :mod:`dnnbind.layers`: it imports nothing from it."""

from __future__ import annotations

from typing import Any, Sequence

from dnnbind import _validate

__all__ = ["InputSpec", "assert_input_compatibility"]


class InputSpec:
    """``InputSpec(dtype=None, shape=None, ndim=None, max_ndim=None, min_ndim=None, axes=None,
    allow_last_axis_squeeze=False, name=None, optional=False)``: the rank, dtype, shape (None entries: any
    size) and sizes of given axes (``axes={-1: 8}``) of the inputs a layer accepts (Keras 3)."""

    def __init__(self, dtype: Any = None, shape: "Sequence[Any] | None" = None, ndim: "int | None" = None,
                 max_ndim: "int | None" = None, min_ndim: "int | None" = None, axes: "dict | None" = None,
                 allow_last_axis_squeeze: bool = False, name: "str | None" = None, optional: bool = False) -> None:
        self.dtype = None if dtype is None else str(_validate.normalize_dtype(dtype, "InputSpec: dtype"))
        self.shape = None if shape is None else tuple(None if s is None else int(s) for s in shape)
        self.ndim = len(self.shape) if self.shape is not None else ndim
        self.max_ndim = max_ndim
        self.min_ndim = min_ndim
        self.name = name
        self.optional = optional
        self.allow_last_axis_squeeze = allow_last_axis_squeeze
        try:
            self.axes = {int(k): v for k, v in (axes or {}).items()}
        except (ValueError, TypeError):
            raise TypeError(f"InputSpec: the keys of axes must be ints, got {axes!r}") from None
        if self.axes and (self.ndim is not None or self.max_ndim is not None):
            top = (self.ndim if self.ndim is not None else self.max_ndim) - 1
            if max(self.axes) > top:
                raise ValueError(f"InputSpec: axis {max(self.axes)} is beyond the rank given by ndim/max_ndim "
                                 f"({top + 1})")

    def __repr__(self) -> str:
        spec = [f"dtype={self.dtype}" if self.dtype else "", f"shape={self.shape}" if self.shape else "",
                f"ndim={self.ndim}" if self.ndim is not None else "",
                f"max_ndim={self.max_ndim}" if self.max_ndim is not None else "",
                f"min_ndim={self.min_ndim}" if self.min_ndim is not None else "",
                f"axes={self.axes}" if self.axes else ""]
        return f"InputSpec({', '.join(x for x in spec if x)})"

    def get_config(self) -> dict:
        return {"dtype": self.dtype, "shape": self.shape, "ndim": self.ndim, "max_ndim": self.max_ndim,
                "min_ndim": self.min_ndim, "axes": self.axes}

    @classmethod
    def from_config(cls, config: dict) -> "InputSpec":
        return cls(**config)


def assert_input_compatibility(input_spec: Any, inputs: Any, layer_name: str) -> None:
    """Keras's check of ``inputs`` (one tensor or a list) against ``input_spec`` (an :class:`InputSpec` or a
    list of them): a ValueError naming the layer, the input and what differs."""
    if not input_spec:
        return
    specs = list(input_spec) if isinstance(input_spec, (list, tuple)) else [input_spec]
    items = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    if len(items) != len(specs):
        raise ValueError(f"Layer '{layer_name}' expects {len(specs)} input(s), but it received {len(items)} input "
                         "tensors")
    for i, (x, spec) in enumerate(zip(items, specs)):
        if spec is None or (x is None and spec.optional):
            continue
        shape = tuple(getattr(x, "shape", ()))
        rank = len(shape)
        where = f"Input {i} of layer '{layer_name}' is incompatible with the layer:"
        if spec.ndim is not None and not spec.allow_last_axis_squeeze and rank != spec.ndim:
            raise ValueError(f"{where} expected ndim={spec.ndim}, found ndim={rank}. Full shape received: {shape}")
        if spec.max_ndim is not None and rank > spec.max_ndim:
            raise ValueError(f"{where} expected max_ndim={spec.max_ndim}, found ndim={rank}")
        if spec.min_ndim is not None and rank < spec.min_ndim:
            raise ValueError(f"{where} expected min_ndim={spec.min_ndim}, found ndim={rank}. Full shape received: "
                             f"{shape}")
        if spec.dtype is not None and str(getattr(x, "dtype", "")) != spec.dtype:
            raise ValueError(f"{where} expected dtype={spec.dtype}, found dtype={getattr(x, 'dtype', None)}")
        for axis, value in spec.axes.items():
            if value is None:
                continue
            if not -rank <= axis < rank or shape[axis] not in (value, None):
                raise ValueError(f"{where} expected axis {axis} of input shape to have value {value}, but received "
                                 f"input with shape {shape}")
        if spec.shape is not None:
            if len(spec.shape) != rank or any(a is not None and b is not None and a != b
                                              for a, b in zip(spec.shape, shape)):
                raise ValueError(f"{where} expected shape={spec.shape}, found shape={shape}")
