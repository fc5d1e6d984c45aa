"""``keras.utils`` helpers for data in host memory: ``pad_sequences``, ``normalize``, ``pack_x_y_sample_weight``
/ ``unpack_x_y_sample_weight``, ``split_dataset``, ``timeseries_dataset_from_array``, ``Config``.

Keras returns ``tf.data.Dataset`` objects from its dataset builders; dnnbind has no tf.data, so
:func:`timeseries_dataset_from_array` returns a :class:`dnnbind.utils.PyDataset` of NumPy batches (what ``fit``,
``evaluate`` and ``predict`` read, and what a ``for`` loop iterates), and :func:`split_dataset` splits arrays
(or tuples / dicts of arrays, or lists of samples) into two of the same kind. A shared leaf: the standard
library and NumPy only.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from .utils import PyDataset

__all__ = ["pad_sequences", "normalize", "pack_x_y_sample_weight", "unpack_x_y_sample_weight", "split_dataset",
           "timeseries_dataset_from_array", "Config", "TimeseriesDataset"]


def pad_sequences(sequences, maxlen: "int | None" = None, dtype: Any = "int32", padding: str = "pre",
                  truncating: str = "pre", value: Any = 0.0) -> np.ndarray:
    """Keras's ``pad_sequences``: a list of sequences (each a list or array of samples, of any sample shape) as
    one array ``(len(sequences), maxlen, *sample_shape)``, padded with ``value`` and truncated to ``maxlen``
    (default: the longest) at the start (``"pre"``) or the end (``"post"``)."""
    if not hasattr(sequences, "__len__"):
        raise ValueError("`sequences` must be iterable.")
    num_samples = len(sequences)
    lengths, sample_shape, flag = [], (), True
    for x in sequences:
        try:
            lengths.append(len(x))
            if flag and len(x):
                sample_shape = np.asarray(x).shape[1:]
                flag = False
        except TypeError as e:
            raise ValueError(f"`sequences` must be a list of iterables. Found non-iterable: {x}") from e
    if maxlen is None:
        maxlen = np.max(lengths) if lengths else 0
    is_dtype_str = np.issubdtype(dtype, np.str_) or np.issubdtype(dtype, np.str_)
    if isinstance(value, str) and dtype is not object and not is_dtype_str:
        raise ValueError(f"`dtype` {dtype} is not compatible with `value`'s type: {type(value)}\nYou should set "
                         "`dtype=object` for variable length strings.")
    if padding not in ("pre", "post"):
        raise ValueError(f'Padding type "{padding}" not understood')
    if truncating not in ("pre", "post"):
        raise ValueError(f'Truncating type "{truncating}" not understood')
    x = np.full((num_samples, maxlen) + sample_shape, value, dtype=dtype)
    for idx, s in enumerate(sequences):
        if not len(s):
            continue
        trunc = s[-maxlen:] if truncating == "pre" else s[:maxlen]
        trunc = np.asarray(trunc, dtype=dtype)
        if trunc.shape[1:] != sample_shape:
            raise ValueError(f"Shape of sample {trunc.shape[1:]} of sequence at position {idx} is different from "
                             f"expected shape {sample_shape}")
        if maxlen == 0:
            continue
        if padding == "post":
            x[idx, : len(trunc)] = trunc
        else:
            x[idx, -len(trunc):] = trunc
    return x


def normalize(x, axis: int = -1, order: int = 2):
    """``x`` divided by its ``order``-norm along ``axis`` (a zero norm divides by 1), as Keras's ``normalize``.
    A NumPy array gives a NumPy array; a tensor goes through ``keras.ops`` (differentiable)."""
    if isinstance(x, (np.ndarray, list, tuple, float, int)):
        x = np.asarray(x)
        norm = np.atleast_1d(np.linalg.norm(x, order, axis))
        norm[norm == 0] = 1
        axis = axis or -1
        return x / np.expand_dims(norm, axis)
    from . import ops  # (deferred: tensors need the ops, which sit above this leaf)
    if order == 2:
        square_sum = ops.sum(ops.square(x), axis=axis, keepdims=True)
        return ops.multiply(x, ops.rsqrt(ops.maximum(square_sum, 1e-12)))
    norm = ops.norm(x, ord=order, axis=axis, keepdims=True)
    return ops.divide(x, ops.where(ops.equal(norm, 0), ops.ones_like(norm), norm))


def pack_x_y_sample_weight(x, y=None, sample_weight=None):
    """Keras's packing of a batch: ``x`` alone (a tuple ``x`` wrapped as ``(x,)``), ``(x, y)`` or
    ``(x, y, sample_weight)``."""
    if y is None:
        return x if not isinstance(x, tuple) else (x,)
    if sample_weight is None:
        return (x, y)
    return (x, y, sample_weight)


def unpack_x_y_sample_weight(data):
    """``(x, y, sample_weight)`` of a batch given as ``x``, ``(x,)``, ``(x, y)`` or ``(x, y, sample_weight)``
    (missing entries None)."""
    if isinstance(data, list):
        data = tuple(data)
    if not isinstance(data, tuple):
        return (data, None, None)
    if len(data) == 1:
        return (data[0], None, None)
    if len(data) == 2:
        return (data[0], data[1], None)
    if len(data) == 3:
        return (data[0], data[1], data[2])
    raise ValueError(f"Data is expected to be in format `x`, `(x,)`, `(x, y)`, or `(x, y, sample_weight)`, found: "
                     f"{data}")


def _num_samples(dataset: Any) -> int:
    if isinstance(dataset, dict):
        dataset = tuple(dataset.values())
    if isinstance(dataset, tuple):
        lengths = {len(d) for d in dataset}
        if len(lengths) != 1:
            raise ValueError(f"split_dataset: the arrays of a tuple or dict must have the same length, got "
                             f"lengths {sorted(lengths)}")
        return lengths.pop()
    return len(dataset)


def _take(dataset: Any, index: np.ndarray) -> Any:
    if isinstance(dataset, dict):
        return {k: _take(v, index) for k, v in dataset.items()}
    if isinstance(dataset, tuple):
        return tuple(_take(d, index) for d in dataset)
    if isinstance(dataset, np.ndarray):
        return dataset[index]
    return [dataset[i] for i in index]


def _split_sizes(total: int, left_size: Any, right_size: Any) -> tuple[int, int]:
    for name, size in (("left_size", left_size), ("right_size", right_size)):
        if size is not None and (isinstance(size, bool) or not isinstance(size, (int, float)) or size < 0 or
                                 (isinstance(size, float) and not 0 < size < 1) or
                                 (isinstance(size, int) and size > total)):
            raise ValueError(f"split_dataset: {name} must be an int in [0, {total}] or a float in (0, 1), got "
                             f"{size!r}")
    if left_size is None and right_size is None:
        raise TypeError("split_dataset: you must specify either `left_size` or `right_size`")
    to_count = lambda s: int(round(s * total)) if isinstance(s, float) else int(s)  # noqa: E731
    left = to_count(left_size) if left_size is not None else None
    right = to_count(right_size) if right_size is not None else None
    left = total - right if left is None else left
    right = total - left if right is None else right
    if left + right > total:
        raise ValueError(f"split_dataset: left_size ({left}) + right_size ({right}) exceeds the {total} samples")
    if left == 0 and right == 0:
        raise ValueError("split_dataset: both splits would be empty")
    return left, right


def split_dataset(dataset, left_size=None, right_size=None, shuffle: bool = False, seed: "int | None" = None):
    """Keras's ``split_dataset`` for data in memory: an array, a list of samples, or a tuple / dict of arrays of
    one length, split into ``(left, right)`` of the same kind. Sizes are counts or fractions in ``(0, 1)``
    (the missing one takes the rest); ``shuffle`` permutes the samples first (``seed``: NumPy's ``RandomState``)."""
    if not isinstance(dataset, (np.ndarray, list, tuple, dict)):
        raise TypeError(f"split_dataset: dataset must be a NumPy array, a list, or a tuple or dict of arrays "
                        f"(dnnbind has no tf.data), got {type(dataset).__name__}")
    total = _num_samples(dataset)
    left, right = _split_sizes(total, left_size, right_size)
    order = np.arange(total)
    if shuffle:
        np.random.RandomState(seed if seed is not None else np.random.randint(1e6)).shuffle(order)
    return _take(dataset, order[:left]), _take(dataset, order[left:left + right])


class TimeseriesDataset(PyDataset):
    """What :func:`timeseries_dataset_from_array` returns: batches of windows (and their targets) made on demand."""

    def __init__(self, data: Any, targets: Any, starts: np.ndarray, sequence_length: int, sampling_rate: int,
                 batch_size: "int | None") -> None:
        super().__init__()
        self.data, self.targets, self.starts = data, targets, starts
        self.offsets = np.arange(sequence_length) * sampling_rate
        self.batch_size = batch_size

    def __len__(self) -> int:
        if self.batch_size is None:
            return len(self.starts)
        return math.ceil(len(self.starts) / self.batch_size)

    def __getitem__(self, index: int):
        if not 0 <= index < len(self):
            raise IndexError(f"TimeseriesDataset: batch {index} out of range (it has {len(self)})")
        if self.batch_size is None:
            starts = self.starts[index:index + 1]
        else:
            starts = self.starts[index * self.batch_size:(index + 1) * self.batch_size]
        windows = self.data[starts[:, None] + self.offsets[None, :]]
        if self.batch_size is None:
            windows = windows[0]
        if self.targets is None:
            return windows
        target = self.targets[starts]
        return windows, (target[0] if self.batch_size is None else target)

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def timeseries_dataset_from_array(data, targets, sequence_length: int, sequence_stride: int = 1,
                                  sampling_rate: int = 1, batch_size: "int | None" = 128, shuffle: bool = False,
                                  seed: "int | None" = None, start_index: "int | None" = None,
                                  end_index: "int | None" = None, format: str = "tf") -> TimeseriesDataset:
    """Keras's ``timeseries_dataset_from_array``: windows ``data[start + i * sampling_rate]`` (``i <
    sequence_length``) every ``sequence_stride`` steps of ``data[start_index:end_index]``, each with the target
    ``targets[start_index:end_index][start]``; batched by ``batch_size`` (None: single windows), optionally
    shuffled (NumPy ``RandomState(seed)``, as Keras). Returns a :class:`TimeseriesDataset` (a ``PyDataset``) of
    NumPy arrays instead of a ``tf.data.Dataset``; ``format`` is accepted for Keras's signature only."""
    if format not in ("tf", "grain"):
        raise ValueError(f'`format` should be either "tf" or "grain". Received: format={format}')
    data = np.asarray(data) if not isinstance(data, np.ndarray) else data
    if start_index:
        if start_index < 0:
            raise ValueError(f"`start_index` must be 0 or greater. Received: start_index={start_index}")
        if start_index >= len(data):
            raise ValueError(f"`start_index` must be lower than the length of the data. Received: "
                             f"start_index={start_index}, for data of length {len(data)}")
    if end_index:
        if start_index and end_index <= start_index:
            raise ValueError(f"`end_index` must be higher than `start_index`. Received: start_index={start_index}, "
                             f"and end_index={end_index} ")
        if end_index >= len(data):
            raise ValueError(f"`end_index` must be lower than the length of the data. Received: "
                             f"end_index={end_index}, for data of length {len(data)}")
        if end_index <= 0:
            raise ValueError(f"`end_index` must be higher than 0. Received: end_index={end_index}")
    for name, v in (("sampling_rate", sampling_rate), ("sequence_stride", sequence_stride)):
        if v <= 0:
            raise ValueError(f"`{name}` must be higher than 0. Received: {name}={v}")
        if v >= len(data):
            raise ValueError(f"`{name}` must be lower than the length of the data. Received: {name}={v}, for data "
                             f"of length {len(data)}")
    if batch_size is not None and (isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1):
        raise ValueError(f"timeseries_dataset_from_array: batch_size must be a positive int or None, got {batch_size!r}")
    start_index = 0 if start_index is None else start_index
    end_index = len(data) if end_index is None else end_index
    num_seqs = end_index - start_index - (sequence_length - 1) * sampling_rate
    if targets is not None:
        targets = np.asarray(targets) if not isinstance(targets, np.ndarray) else targets
        num_seqs = min(num_seqs, len(targets))
    starts = np.arange(0, max(num_seqs, 0), sequence_stride, dtype=np.int64)
    if shuffle:
        np.random.RandomState(seed if seed is not None else np.random.randint(1e6)).shuffle(starts)
    window_data = data[start_index:end_index]
    window_targets = None if targets is None else targets[start_index:end_index]
    return TimeseriesDataset(window_data, window_targets, starts, int(sequence_length), int(sampling_rate),
                             None if batch_size is None else int(batch_size))


class Config:
    """Keras's ``keras.utils.Config``: attribute and item access to a dict of settings, ``freeze()`` to make it
    read-only, ``to_json()``."""

    def __init__(self, **kwargs: Any) -> None:
        self._config = kwargs
        self._frozen = False

    def freeze(self) -> None:
        """Refuse every later change."""
        self._frozen = True

    def unfreeze(self) -> None:
        self._frozen = False

    def _raise_if_frozen(self) -> None:
        if self._frozen:
            raise ValueError("Cannot mutate attribute(s) because the config is frozen.")

    @property
    def frozen(self) -> bool:
        return self._frozen

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("_config", "_frozen"):
            object.__setattr__(self, name, value)
            return
        self._raise_if_frozen()
        self._config[name] = value

    def __getattr__(self, name: str) -> Any:
        if name in ("_config", "_frozen"):
            raise AttributeError(name)
        try:
            return self._config[name]
        except KeyError as exc:
            raise AttributeError(f"Unknown attribute: '{name}'") from exc

    def __delattr__(self, name: str) -> None:
        self._raise_if_frozen()
        del self._config[name]

    def __getitem__(self, key: str) -> Any:
        return self._config[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._raise_if_frozen()
        self._config[key] = value

    def __delitem__(self, key: str) -> None:
        self._raise_if_frozen()
        del self._config[key]

    def __contains__(self, item: str) -> bool:
        return item in self._config

    def __iter__(self):
        return iter(self._config)

    def __len__(self) -> int:
        return len(self._config)

    def keys(self):
        return self._config.keys()

    def values(self):
        return self._config.values()

    def items(self):
        return self._config.items()

    def pop(self, *args: Any) -> Any:
        self._raise_if_frozen()
        return self._config.pop(*args)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._raise_if_frozen()
        self._config.update(*args, **kwargs)

    def get(self, key: str, default: Any = None) -> Any:
        return self._config.get(key, default)

    def as_dict(self) -> dict:
        return dict(self._config)

    def to_json(self) -> str:
        return json.dumps(self._config)

    def __repr__(self) -> str:
        return f"<Config {self._config}>"
