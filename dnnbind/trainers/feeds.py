"""User data checked against the model, in step form: the feeds of fit/evaluate/predict, ``*_on_batch``'s batches.

Step form (what a train/test/predict step takes, and what the step-graph cache keys and buffers):
inputs and targets are *packed*, one array for a one-input (one-output) model, a tuple otherwise
(:func:`pack` / :func:`unpack`). A weighted batch appends one float32 sample-weight array per output
with a loss to the targets (:func:`step_targets`).

* Checks (:func:`check_x`, :func:`check_y`, :func:`check_xy`, :func:`check_sample_weight`,
  :func:`check_class_weight`): host arrays in the model's input/output order, inputs in each
  ``Input``'s dtype (float32 without one, as Keras 3) and of the model's sample shapes (the model is
  built from them if needed), labels in each loss's form, NaN/inf
  refused where they would make the loss NaN; every error names the model, the call and the argument.
* Feeds (:func:`array_feed`, :func:`source_feed`, :func:`eval_feed`): an
  :class:`~dnnbind.trainers.data_adapters.EpochIterator` over the right adapter; a generator's or a
  PyDataset's batches are checked one by one as they come (:func:`prepare_batch`).
* :func:`device_batch`: one ``*_on_batch`` batch on the model's device (DeviceArrays taken as they are).

Every function takes the model (a :class:`~dnnbind.trainers.trainer.Trainer`) first; what it reads
from it is listed in :mod:`dnnbind.trainers.protocol`.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from .. import _validate, backend, kernels
from .compile_utils import NoLoss
from .data_adapters import (ArrayDataAdapter, EpochIterator, GeneratorDataAdapter, PyDatasetAdapter,
                            _is_arraylike_leaf, class_weight_to_sample_weights, data_kind, flatten_structure,
                            unpack_x_y_sample_weight)

__all__ = ["pack", "unpack", "check_x", "check_y", "check_xy", "check_sample_weight", "check_class_weight",
           "refuse_both_weights", "step_targets", "split_tuple_x", "check_batch_size_unused", "array_feed",
           "source_feed", "eval_feed", "prepare_batch", "device_batch", "upload", "KIND_WORDS"]

_F32 = np.dtype(np.float32)

KIND_WORDS = {"generator": "a generator or iterator", "py_dataset": "a PyDataset"}


def pack(arrays: "list | None") -> Any:
    if arrays is None:
        return None
    return arrays[0] if len(arrays) == 1 else tuple(arrays)


def unpack(packed: Any) -> "list | None":
    if packed is None:
        return None
    return list(packed) if isinstance(packed, tuple) else [packed]


def _is_weight_vector(value: Any) -> bool:
    """A plain list/tuple of numbers (one weight per sample), not one entry per output."""
    return isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in value)


def refuse_both_weights(class_weight: Any, sample_weight: Any, owner: str) -> None:
    if class_weight is not None and sample_weight is not None:
        raise ValueError(f"{owner}: class_weight and sample_weight cannot both be given (as Keras); multiply the "
                         "class weights into sample_weight")


# ----- checks ---------------------------------------------------------------------------------
def input_dtypes(model: Any, n: int) -> list[np.dtype]:
    """The dtype each of ``n`` inputs is fed as: the model's ``Input`` dtype (Keras 3 converts the data to
    it), float32 where it has none."""
    known = model._input_dtypes()
    known = list(known) + [None] * (n - len(known))
    return [_F32 if d is None else d for d in known[:n]]


def check_x(model: Any, x: Any, what: str, *, finite: bool = True, allow_empty: bool = False) -> list[np.ndarray]:
    """``x`` as host arrays of the model's input shapes and dtypes (each ``Input``'s dtype, float32 where
    the model has none), one per input (building the model
    from them if needed). ``finite``: refuse NaN/inf (training and evaluation; predict accepts
    them, as Keras); ``allow_empty``: accept zero samples (predict returns an empty result)."""
    if not model._call_optional():
        model._require_layers(what)
    owner = model._owner
    if backend.is_device_array(x):
        raise TypeError(f"{owner}: {what} takes NumPy arrays; got a DeviceArray "
                        "(use predict_on_batch/train_on_batch for device data)")
    model._guess_input_structure(x)
    items = flatten_structure(x, model._input_names(), f"{owner}: {what}", "x")
    arrays = []
    for item, dtype in zip(items, input_dtypes(model, len(items))):
        if backend.is_device_array(item):
            raise TypeError(f"{owner}: {what} takes NumPy arrays; got a DeviceArray "
                            "(use predict_on_batch/train_on_batch for device data)")
        arr = np.asarray(item)
        if arr.dtype.kind not in "fiub":
            raise TypeError(f"{owner}: {what} expects numeric input data (floats or ints), got dtype {arr.dtype}")
        if arr.ndim < 1:
            raise ValueError(f"{owner}: {what} expects a batch of samples, got a scalar")
        if arr.dtype != dtype:
            arr = arr.astype(dtype)  # to the Input's dtype, as Keras 3 (int32 ids stay integers)
        arrays.append(arr)
    counts = {len(a) for a in arrays}
    if len(counts) > 1:
        raise ValueError(f"{owner}: {what} got inputs with different numbers of samples "
                         f"{[len(a) for a in arrays]}; every input needs one row per sample")
    if len(arrays[0]) == 0 and not allow_empty:
        raise ValueError(f"{owner}: {what} got no samples (x has shape {tuple(arrays[0].shape)})")
    expected = model._expected_input_shapes()
    if expected is not None and len(expected) == len(arrays):
        arrays = [_adjust_rank(a, tuple(e)) for a, e in zip(arrays, expected)]
    samples = [tuple(a.shape[1:]) for a in arrays]
    if expected is not None and not all(_shape_fits(got, e) for got, e in zip(samples, expected)) or \
            expected is not None and len(samples) != len(expected):
        if len(arrays) == 1:
            raise ValueError(f"{owner}{model._input_hint()}: {what} expects input of shape (batch, "
                             f"{', '.join(map(str, expected[0]))}), got {tuple(arrays[0].shape)}")
        raise ValueError(f"{owner}: {what} expects inputs of shapes {[(None, *e) for e in expected]} "
                         f"({', '.join(model._input_names())}), got {[tuple(a.shape) for a in arrays]}")
    if not model.built and not model._call_optional():
        model._build_for(samples)
    if finite:
        # after the cast: float64 values beyond float32's range have become inf
        harm = "the loss and the weights" if what.startswith(("fit", "train")) else "the loss"
        for name, arr in zip(model._input_names(), arrays):
            _validate.finite_array(arr, "x" if len(arrays) == 1 else f"x['{name}']", f"{owner}: {what}",
                                   hint=f"they would make {harm} NaN; clean or impute the data first "
                                        "(predict accepts them)")
    return arrays


def _shape_fits(got: tuple, expected: Any) -> bool:
    """A sample shape against an ``Input``'s: same rank, and equal wherever the Input names a size (None:
    any size, as Keras's ``Input(shape=(None,))`` of variable-length sequences)."""
    expected = tuple(expected)
    return len(got) == len(expected) and all(e is None or int(g) == int(e) for g, e in zip(got, expected))


def _adjust_rank(arr: np.ndarray, expected: tuple) -> np.ndarray:
    """Keras 3's ``Functional._adjust_input_rank``: data one axis short of an input whose last axis is 1 gets
    that axis (``(N, 28, 28)`` for ``Input((28, 28, 1))``), data with one extra trailing axis of 1 loses it."""
    if arr.ndim == len(expected) and expected and expected[-1] == 1:
        return arr.reshape(arr.shape + (1,))
    if arr.ndim == len(expected) + 2 and arr.shape[-1] == 1:
        return arr.reshape(arr.shape[:-1])
    return arr


def flatten_targets(model: Any, y: Any, owner: str) -> list:
    """``y`` with one entry per output, in ``model.output_names`` order (:func:`flatten_structure`), or, as
    Keras 3's ``CompileLoss`` reads a loss "partially defined over y_pred", one array per output that has a
    loss (``loss=[fn, None]`` with ``y`` a single array) placed at those outputs, None at the others."""
    names = list(model.output_names)
    try:
        return flatten_structure(y, names, owner, "y")
    except ValueError:
        losses = list(getattr(model, "_losses", ()) or ())
        slots = [i for i, loss in enumerate(losses) if loss is not None]
        if len(names) < 2 or len(losses) != len(names) or not slots or len(slots) == len(names):
            raise
        given = [y] if _is_arraylike_leaf(y) else list(y) if isinstance(y, (list, tuple)) else None
        if given is None or len(given) != len(slots):
            raise
        items: list = [None] * len(names)
        for i, t in zip(slots, given):
            items[i] = t
        return items


def check_y(model: Any, y: Any, n: int, what: str) -> list[np.ndarray]:
    """Targets of the outputs that have a loss, in the losses' label forms (one per output)."""
    items = flatten_targets(model, y, f"{model._owner}: {what}")
    return [None if loss is None else check_y_one(model, i, item, n, what)
            for i, (item, loss) in enumerate(zip(items, model._losses))]


def check_y_one(model: Any, i: int, y: Any, n: int, what: str) -> np.ndarray:
    """Output ``i``'s host targets for ``n`` samples, in its loss's label form."""
    owner = model._owner
    names = list(model.output_names)
    arr = np.asarray(y)
    if arr.ndim < 1 or len(arr) != n:
        raise ValueError(f"{owner}: {what} got {n} input samples but "
                         f"{len(arr) if arr.ndim else 'a scalar'} targets"
                         f"{'' if len(names) == 1 else f' for output {names[i]!r}'}; x and y must have the "
                         "same length")
    who = f"{owner}: " if len(names) == 1 else f"{owner}: output '{names[i]}': "
    loss = model._losses[i]
    # no compiled loss: the targets go to the custom step as given, so the output shape is not needed (a
    # GAN with no call() has none)
    shape = None if isinstance(loss, NoLoss) else model._output_shapes()[i]
    arr = loss.prepare_labels(arr, shape, owner=who)
    _validate.finite_array(arr, "y" if len(names) == 1 else f"y['{names[i]}']", f"{owner}: {what}",
                           hint="clean the targets first")
    return arr


def check_xy(model: Any, x: Any, y: Any, what: str) -> tuple[list, "list | None"]:
    """``(xs, ys)`` checked for training or evaluation: finite, same length, labels in the losses' forms."""
    if y is None:
        if model._targets_optional():
            return check_x(model, x, what), None
        raise ValueError(f"{model._owner}: {what} needs targets y")
    xs = check_x(model, x, what)
    return xs, check_y(model, y, len(xs[0]), what)


def check_class_weight(model: Any, class_weight: Any, owner: str) -> "dict | None":
    if class_weight is None:
        return None
    if not isinstance(class_weight, dict):
        raise _validate.ArgumentTypeError(f"{owner}: class_weight must be a dict {{class index: weight}}, got "
                                          f"{type(class_weight).__name__}")
    out = {}
    for key, weight in class_weight.items():
        if isinstance(key, (bool, np.bool_)) or not isinstance(key, (int, np.integer)) or key < 0:
            raise ValueError(f"{owner}: class_weight keys must be class indices (ints >= 0), got {key!r}")
        out[int(key)] = _validate.number(weight, f"class_weight[{int(key)}]", owner)
    names = list(model.output_names)
    if len(names) > 1:
        raise ValueError(f"{owner}: class_weight is only supported for models with a single output (this one "
                         f"has {names}); give sample_weight with one array per output instead")
    return out


def check_sample_weight(model: Any, sample_weight: Any, n: int, ys: list, what: str,
                        class_weight: "dict | None" = None) -> "list | None":
    """Per-sample weights ``(n,)`` float32, one per output (None for an output without a loss), or
    None. One array weighs every output (Keras 3); a list/dict gives one per output (None: ones).
    ``class_weight`` (already checked) turns the one output's labels ``ys[0]`` into weights."""
    owner = f"{model._owner}: {what}"
    if class_weight is not None:
        refuse_both_weights(class_weight, sample_weight, owner)
        return [class_weight_to_sample_weights(ys[0], class_weight)]
    if sample_weight is None:
        return None
    names = list(model.output_names)
    if len(names) == 1 or isinstance(sample_weight, (list, tuple, dict)) and not _is_weight_vector(sample_weight):
        items = flatten_structure(sample_weight, names, owner, "sample_weight")
    else:
        items = [sample_weight] * len(names)
    out = []
    for name, item, target in zip(names, items, ys):
        if target is None:
            out.append(None)
            continue
        if item is None:
            out.append(np.ones(n, _F32))
            continue
        w = np.asarray(item)
        where = "sample_weight" if len(names) == 1 else f"sample_weight['{name}']"
        if w.dtype.kind not in "fiub":
            raise TypeError(f"{owner}: {where} must be numbers, got dtype {w.dtype}")
        if w.shape not in ((n,), (n, 1)):
            raise ValueError(f"{owner}: {where} must have shape ({n},) or ({n}, 1), one weight per sample, "
                             f"got {w.shape}")
        w = np.ascontiguousarray(w.reshape(n), dtype=_F32)
        _validate.finite_array(w, where, owner, hint="give every sample a finite weight")
        out.append(w)
    return out


def step_targets(ys: "list | None", ws: "list | None") -> "list | None":
    """What a step takes as ``y``: the targets of the outputs with a loss, then (when weighted) one
    weight array per such output, so graph steps upload the weights into static buffers too."""
    if ys is None:
        return None
    present = [t for t in ys if t is not None]
    if ws is None:
        return present
    return present + [w for w, t in zip(ws, ys) if t is not None]


def split_tuple_x(model: Any, x: Any, y: Any, sample_weight: Any, targets: bool) -> tuple[Any, Any, Any]:
    """A tuple ``(x, y)`` / ``(x, y, sample_weight)`` passed as ``x`` unpacked (Keras 3's rule for
    one batch). Training/evaluation: whenever ``y`` is None. Predict: when the tuple's length is
    not the model's number of inputs (a tuple of one array per input stays the inputs)."""
    if y is not None or sample_weight is not None or not isinstance(x, tuple) or len(x) not in (2, 3):
        return x, y, sample_weight
    if not targets:
        model._guess_input_structure(x)
        if len(x) == len(model._input_names()):
            return x, y, sample_weight
    return unpack_x_y_sample_weight(x)


def check_batch_size_unused(batch_size: Any, kind: str, owner: str) -> None:
    """Called by the loops of ``fit``/``evaluate``/``predict`` themselves: the warning's ``stacklevel``
    counts this function, the loop and the public method, and points at the caller of the latter."""
    # Keras 3 ignores it silently; a script that passes it still runs, but is told
    if batch_size is not None:
        warnings.warn(f"{owner}: batch_size={batch_size} is ignored when x is {KIND_WORDS[kind]}: its "
                      "batches already have their size", UserWarning, stacklevel=4)


# ----- feeds ----------------------------------------------------------------------------------
def array_feed(model: Any, xs: list, ys: "list | None", ws: "list | None", batch_size: int, shuffle: bool,
               steps: "int | None", shard: "tuple[int, int] | None" = None) -> EpochIterator:
    targets = None if ys is None else step_targets(ys, ws)
    return EpochIterator(ArrayDataAdapter(xs, targets, batch_size, shuffle=shuffle, device=model.device,
                                          shard=shard), steps)


def source_feed(model: Any, x: Any, y: Any, sample_weight: Any, kind: str, what: str, *, targets: bool,
                shuffle: bool, steps: "int | None", class_weight: "dict | None" = None,
                shard: "tuple[int, int] | None" = None) -> EpochIterator:
    """A feed over a generator or PyDataset whose batches are checked one by one (:func:`prepare_batch`)."""
    owner = f"{model._owner}: {what}"
    for name, value, part in (("y", y, "the targets"), ("sample_weight", sample_weight, "the sample weights")):
        if value is not None:
            raise ValueError(f"{owner}: when x is {KIND_WORDS[kind]}, {name} must not be passed; {part} "
                             f"come from the batches it yields ((x, y) or (x, y, sample_weight))")

    def prepare(raw: Any) -> tuple[list, "list | None"]:
        return prepare_batch(model, raw, what, targets, class_weight)

    if kind == "py_dataset":
        adapter: Any = PyDatasetAdapter(x, prepare, shuffle=shuffle, device=model.device, owner=owner, shard=shard)
    else:
        adapter = GeneratorDataAdapter(x, prepare, device=model.device)
    return EpochIterator(adapter, steps)


def eval_feed(model: Any, x: Any, y: Any, sample_weight: Any, what: str, batch_size: int, steps: "int | None",
              unpack: bool, shard: "tuple[int, int] | None" = None) -> EpochIterator:
    """The feed of an evaluation (``evaluate``, or ``fit``'s ``validation_data`` when ``unpack``)."""
    kind = data_kind(x)
    if kind != "arrays":
        return source_feed(model, x, y, sample_weight, kind, what, targets=True, shuffle=False, steps=steps,
                           shard=shard)
    if unpack:
        x, y, sample_weight = unpack_x_y_sample_weight(tuple(x))
    else:
        x, y, sample_weight = split_tuple_x(model, x, y, sample_weight, targets=True)
    xs, ys = check_xy(model, x, y, what)
    ws = check_sample_weight(model, sample_weight, len(xs[0]), ys, what)
    return array_feed(model, xs, ys, ws, batch_size, False, steps, shard)


def prepare_batch(model: Any, raw: Any, what: str, targets: bool, class_weight: "dict | None"
                  ) -> tuple[list, "list | None"]:
    """One batch of a generator or PyDataset, checked as ``fit``/``evaluate``/``predict`` check
    arrays, in step form: ``(xs, targets + sample weights)`` host arrays."""
    x, y, sample_weight = unpack_x_y_sample_weight(raw)
    if not targets:
        return check_x(model, x, what, finite=False), None
    if y is None:
        raise ValueError(f"{model._owner}: {what} got a batch without targets; a generator or PyDataset for "
                         "training or evaluation must yield (x, y) or (x, y, sample_weight)")
    xs, ys = check_xy(model, x, y, what)
    ws = check_sample_weight(model, sample_weight, len(xs[0]), ys, what, class_weight)
    return xs, step_targets(ys, ws)


# ----- one batch on the device (*_on_batch) ---------------------------------------------------
def device_batch(model: Any, x: Any, y: Any, what: str, sample_weight: Any = None,
                 class_weight: "dict | None" = None) -> tuple[Any, Any]:
    """Packed ``(x, y)`` on the model's device for a ``*_on_batch`` call (``y`` with the sample
    weights appended, see :func:`step_targets`). DeviceArrays (already on this model's device)
    are taken as they are: only shapes are checked, labels must already be in the loss's form
    (int32 class indices or float rows); ``class_weight`` needs host labels."""
    owner = model._owner
    model._guess_input_structure(x)
    items = flatten_structure(x, model._input_names(), f"{owner}: {what}", "x")
    if not any(backend.is_device_array(i) for i in items):
        if y is None:  # predicting: NaN/inf pass, as in predict
            return upload(model, check_x(model, x, what, finite=False)), None
        xs, ys = check_xy(model, x, y, what)
        ws = check_sample_weight(model, sample_weight, len(xs[0]), ys, what, class_weight)
        return upload(model, xs), upload(model, step_targets(ys, ws))
    if class_weight is not None:
        raise TypeError(f"{owner}: {what}: class_weight needs host (NumPy) labels to read the classes from; "
                        "pass sample_weight instead with device data")
    model._require_layers(what)
    for arr in items:
        if not backend.is_device_array(arr):
            raise TypeError(f"{owner}: {what} got a mix of DeviceArrays and host arrays as inputs")
        if arr.ndim < 1 or int(arr.shape[0]) == 0:
            raise ValueError(f"{owner}: {what} got no samples (x has shape {tuple(arr.shape)})")
        if backend.device_of(arr) != model.device:
            raise ValueError(f"{owner}: {what} got data on {backend.device_of(arr)} but the model "
                             f"is on {model.device}; move one of them (model.to(...) or backend.asarray)")
    if not model.built:
        model._build_for([tuple(a.shape[1:]) for a in items])
    expected = model._expected_input_shapes()
    for arr, shape in zip(items, expected):
        if not _shape_fits(tuple(arr.shape[1:]), shape):
            raise ValueError(f"{owner} expects input of shape (batch, {', '.join(map(str, shape))}), "
                             f"got {tuple(arr.shape)}")
    dtypes = model._input_dtypes()
    # to the Input's dtype (Keras 3); without one, floats as given and the rest as float32
    items = [a if a.dtype == (d if d is not None else a.dtype if a.dtype.kind == "f" else _F32)
             else kernels.cast(a, d if d is not None else _F32) for a, d in zip(items, dtypes)]
    n = int(items[0].shape[0])
    if y is None:
        return pack(items), None
    ys = flatten_targets(model, y, f"{owner}: {what}")
    out = []
    for i, (t, loss) in enumerate(zip(ys, model._losses)):
        if loss is None:
            continue
        if not backend.is_device_array(t):
            t = check_y_one(model, i, t, n, what)
            t = backend.asarray(t, device=model.device)
        elif int(t.shape[0]) != n:
            raise ValueError(f"{owner}: {what} got {n} input samples but {t.shape[0]} targets")
        out.append(t)
    if sample_weight is not None:
        out += _device_weights(model, sample_weight, n, what)
    return pack(items), pack(out)


def _device_weights(model: Any, sample_weight: Any, n: int, what: str) -> list:
    """Sample weights for a device batch: ``(n,)`` float32 on the model's device, one per output
    with a loss (host arrays are checked as in ``fit``; DeviceArrays only by shape, no read-back)."""
    names = list(model.output_names)
    has_loss = [loss is not None for loss in model._losses]
    host = not any(backend.is_device_array(v) for v in (
        sample_weight.values() if isinstance(sample_weight, dict) else
        sample_weight if isinstance(sample_weight, (list, tuple)) else [sample_weight]))
    if host:
        ws = check_sample_weight(model, sample_weight, n, [True if h else None for h in has_loss], what)
        return [backend.asarray(w, device=model.device) for w, h in zip(ws, has_loss) if h]
    items = (flatten_structure(sample_weight, names, f"{model._owner}: {what}", "sample_weight")
             if isinstance(sample_weight, (list, tuple, dict)) else [sample_weight] * len(names))
    out = []
    for item, h in zip(items, has_loss):
        if not h:
            continue
        if not backend.is_device_array(item) or tuple(item.shape) not in ((n,), (n, 1)):
            got = tuple(item.shape) if hasattr(item, "shape") else type(item).__name__
            raise ValueError(f"{model._owner}: {what}: sample_weight must be DeviceArrays of shape ({n},) or "
                             f"({n}, 1) on {model.device} (one weight per sample), got {got}")
        if backend.device_of(item) != model.device:
            raise ValueError(f"{model._owner}: {what} got sample_weight on {backend.device_of(item)} but the "
                             f"model is on {model.device}")
        item = item.reshape(n) if item.ndim == 2 else item
        out.append(item if item.dtype == _F32 else kernels.cast(item, _F32))
    return out


def upload(model: Any, arrays: "list | None") -> Any:
    """Packed host arrays on the model's device (NumPy stays as it is)."""
    if arrays is None:
        return None
    dev = model.device
    return pack([backend.asarray(a, device=dev) if dev.is_cuda else a for a in arrays])
