"""Categorical preprocessing layers (Keras 3): CategoryEncoding, Discretization and Hashing.

As Keras's, they run on the host in the input pipeline (NumPy in, a tensor out): Hashing hashes strings
and integers with FarmHash's Fingerprint64, or SipHash-2-4 when ``salt`` is given, bitwise as Keras (which
calls TensorFlow for it; :mod:`._fingerprint` is a pure-Python copy of both hashes), Discretization buckets by
``bin_boundaries`` (or those its ``adapt`` finds, with Keras's quantile summaries), CategoryEncoding turns
integer ids into one-hot, multi-hot or count vectors.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from dnnbind import _validate
from dnnbind import ops as _ops
from dnnbind.autodiff.tensor import Tensor

from ._fingerprint import fingerprint64, siphash64
from .base import Layer, is_symbolic, register

__all__ = ["CategoryEncoding", "Discretization", "Hashing"]

_OUTPUT_MODES = ("int", "one_hot", "multi_hot", "count")


def _host(value: Any) -> np.ndarray:
    if isinstance(value, Tensor):
        return np.asarray(_ops.convert_to_numpy(value))
    return np.asarray(value)


def _encode(indices: np.ndarray, output_mode: str, depth: int, dtype: Any, owner: str,
            count_weights: Any = None) -> np.ndarray:
    """Keras's ``encode_categorical_inputs`` on the host (ids must be in ``[0, depth)``)."""
    if output_mode == "int":
        return indices.astype(dtype)
    x = np.asarray(indices)
    if x.ndim == 0:
        x = x[None]
    if x.size and (x.min() < 0 or x.max() >= depth):
        bad = x[(x < 0) | (x >= depth)].reshape(-1)[0]
        raise ValueError(f"{owner}: input ids must be in [0, num_tokens={depth}), got {bad}")
    if output_mode == "one_hot":
        if x.ndim > 1 and x.shape[-1] == 1:
            x = x[..., 0]
        return np.eye(depth, dtype=dtype)[x]
    if output_mode == "multi_hot":
        one = np.eye(depth, dtype=dtype)[x]
        return one.max(axis=-2) if x.ndim >= 1 else one
    one = np.eye(depth, dtype=dtype if count_weights is None else np.asarray(count_weights).dtype)[x]
    if count_weights is not None:
        one = one * np.asarray(count_weights)[..., None]
    return one.sum(axis=1 if x.ndim > 1 else 0)


class _HostPreprocessing(Layer):
    """The host data-path call: NumPy in, a tensor out (no tape: nothing here is differentiable)."""

    @property
    def _owner(self) -> str:
        return f"{type(self).__name__} '{self.name}'"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if any(is_symbolic(a) for a in args) or any(is_symbolic(v) for v in kwargs.values()):
            return super().__call__(*args, **kwargs)
        kwargs.pop("training", None)
        return Tensor(np.asarray(self._host_call(*args, **kwargs), order="C"))  # (ascontiguousarray makes 0-d 1-d)

    def call(self, inputs: Any, **kwargs: Any) -> Any:
        return Tensor(np.asarray(self._host_call(inputs, **kwargs), order="C"))  # (ascontiguousarray makes 0-d 1-d)

    def _host_call(self, inputs: Any, **kwargs: Any) -> np.ndarray:
        raise NotImplementedError


@register
class CategoryEncoding(_HostPreprocessing):
    """``CategoryEncoding(num_tokens=None, output_mode="multi_hot", sparse=False)``: integer ids in
    ``[0, num_tokens)`` to ``"one_hot"`` (a last axis of size 1 is replaced), ``"multi_hot"`` or ``"count"``
    (``call(inputs, count_weights=None)``) vectors of size ``num_tokens`` over the last axis (Keras 3)."""

    def __init__(self, num_tokens: "int | None" = None, output_mode: str = "multi_hot", sparse: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if output_mode == "binary":
            output_mode = "multi_hot"
        self.output_mode = _validate.one_of(output_mode, "output_mode", self._owner, ("count", "one_hot", "multi_hot"))
        if num_tokens is None:
            raise ValueError(f"{self._owner}: num_tokens must be set to use this layer. If the number of tokens is "
                             "not known beforehand, use the IntegerLookup layer instead.")
        self.num_tokens = _validate.positive_int(num_tokens, "num_tokens", self._owner)
        if sparse:
            raise NotImplementedError(f"{self._owner}: sparse=True (sparse tensors) is not supported")
        self.sparse = False
        self.built = True

    def _host_call(self, inputs: Any, count_weights: Any = None) -> np.ndarray:
        if count_weights is not None and self.output_mode != "count":
            raise ValueError(f"{self._owner}: `count_weights` is not used when `output_mode` is not 'count'. "
                             f"Received `count_weights={count_weights}`.")
        x = _host(inputs)
        if x.dtype.kind not in "iu":
            if x.dtype.kind != "f" or not np.all(np.floor(x) == x):
                raise _validate.ArgumentTypeError(f"{self._owner}: inputs must be integer ids, got dtype {x.dtype}")
            x = x.astype(np.int64)
        return _encode(x, self.output_mode, self.num_tokens, self.compute_dtype, self._owner,
                       None if count_weights is None else _host(count_weights).astype(self.compute_dtype))

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        if not shape:
            return (self.num_tokens,)
        if self.output_mode == "one_hot" and (shape[-1] != 1 or len(shape) == 1):
            return shape + (self.num_tokens,)
        return shape[:-1] + (self.num_tokens,)

    def get_config(self) -> dict:
        return {**super().get_config(), "num_tokens": self.num_tokens, "output_mode": self.output_mode}


# ----- Discretization's quantile summaries (Keras's algorithm, on NumPy) -----------------------------------
def _summarize(values: np.ndarray, epsilon: float) -> np.ndarray:
    values = np.sort(np.reshape(values, [-1]))
    step = max(np.size(values) / (1.0 / epsilon), 1)
    boundaries = values[int(step - 1)::int(step)]
    return np.stack([boundaries, np.ones_like(boundaries) * step])


def _compress(summary: np.ndarray, epsilon: float) -> np.ndarray:
    if summary.shape[1] * epsilon < 1:
        return summary
    percents = epsilon + np.arange(0.0, 1.0, epsilon)
    cum = summary[1].cumsum()
    frac = cum / cum[-1]
    bins = np.interp(percents, frac, summary[0])
    cum = np.interp(percents, frac, cum)
    return np.stack((bins, cum - np.concatenate((np.array([0]), cum[:-1])))).astype("float32")


def _merge(prev: np.ndarray, nxt: np.ndarray, epsilon: float) -> np.ndarray:
    merged = np.concatenate((prev, nxt), axis=1)
    return _compress(np.take(merged, np.argsort(merged[0]), axis=1), epsilon)


@register
class Discretization(_HostPreprocessing):
    """``Discretization(bin_boundaries=None, num_bins=None, epsilon=0.01, output_mode="int", sparse=False)``:
    each value to the index of its bucket (``np.digitize`` by ``bin_boundaries``: bucket ``i`` is
    ``[b[i-1], b[i])``), as int32, or encoded as one-hot/multi-hot/count vectors of ``len(bin_boundaries) + 1``.
    ``adapt(data)`` (with ``num_bins``) finds boundaries at ``num_bins`` quantiles, with Keras's summaries."""

    def __init__(self, bin_boundaries: "Sequence[float] | None" = None, num_bins: "int | None" = None,
                 epsilon: float = 0.01, output_mode: str = "int", sparse: bool = False, dtype: Any = None,
                 name: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(name=name, dtype=dtype, **kwargs)
        owner = self._owner
        self.output_mode = _validate.one_of(output_mode, "output_mode", owner, _OUTPUT_MODES)
        if sparse:
            raise NotImplementedError(f"{owner}: sparse=True (sparse tensors) is not supported")
        if num_bins is not None and _validate.integer(num_bins, "num_bins", owner) < 0:
            raise ValueError(f"{owner}: `num_bins` must be greater than or equal to 0. Received: `num_bins={num_bins}`")
        if num_bins is not None and bin_boundaries is not None:
            raise ValueError(f"{owner}: Both `num_bins` and `bin_boundaries` should not be set. Received: "
                             f"`num_bins={num_bins}` and `bin_boundaries={bin_boundaries}`")
        if num_bins is None and bin_boundaries is None:
            raise ValueError(f"{owner}: You need to set either `num_bins` or `bin_boundaries`.")
        self.bin_boundaries = None if bin_boundaries is None else [float(b) for b in bin_boundaries]
        if self.bin_boundaries is not None and any(b > a for a, b in zip(self.bin_boundaries[1:],
                                                                          self.bin_boundaries)):
            raise ValueError(f"{owner}: bin_boundaries must be sorted in increasing order, got {bin_boundaries!r}")
        self.num_bins = num_bins
        self.epsilon = float(_validate.number(epsilon, "epsilon", owner, low=0.0, low_open=True))
        self.sparse = False
        self.summary = None if self.bin_boundaries else np.array([[], []], dtype="float32")
        self.built = True

    def adapt(self, data: Any, steps: "int | None" = None) -> None:
        """Bin boundaries at ``num_bins`` quantiles of ``data`` (an array, or an iterable of batches)."""
        if self.num_bins is None:
            raise ValueError(f"{self._owner}: Cannot adapt a Discretization layer that has been initialized with "
                             "`bin_boundaries`, use `num_bins` instead.")
        self.reset_state()
        if isinstance(data, (np.ndarray, Tensor, list)) and not (isinstance(data, list) and data and
                                                                  isinstance(data[0], np.ndarray)):
            self.update_state(data)
        else:
            for i, batch in enumerate(data):
                if steps is not None and i >= steps:
                    break
                self.update_state(batch[0] if isinstance(batch, tuple) else batch)
        self.finalize_state()

    def update_state(self, data: Any) -> None:
        self.summary = _merge(_summarize(_host(data).astype("float32"), self.epsilon), self.summary, self.epsilon)

    def finalize_state(self) -> None:
        if self.num_bins is not None:
            self.bin_boundaries = _compress(self.summary, 1.0 / self.num_bins)[0, :-1].tolist()

    def reset_state(self) -> None:
        if self.num_bins is not None:
            self.summary = np.array([[], []], dtype="float32")

    def _host_call(self, inputs: Any) -> np.ndarray:
        if self.bin_boundaries is None:
            raise ValueError(f"{self._owner}: You need to either pass the `bin_boundaries` argument at construction "
                             "time or call `adapt(dataset)` before you can start using the `Discretization` layer.")
        x = _host(inputs)
        indices = np.digitize(x, np.asarray(self.bin_boundaries, dtype=x.dtype if x.dtype.kind == "f" else None))
        dtype = "int32" if self.output_mode == "int" else self.compute_dtype
        return _encode(indices, self.output_mode, len(self.bin_boundaries) + 1, dtype, self._owner)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        if self.output_mode == "int":
            return shape
        depth = len(self.bin_boundaries) + 1 if self.bin_boundaries is not None else self.num_bins
        if self.output_mode == "one_hot":
            return shape[:-1] + (depth,) if shape and shape[-1] == 1 and len(shape) > 1 else shape + (depth,)
        return (shape[0],) + shape[2:] + (depth,) if len(shape) >= 2 else (depth,)

    def get_config(self) -> dict:
        # Keras's own keys (its Discretization takes no others)
        return {"bin_boundaries": self.bin_boundaries, "num_bins": self.num_bins, "epsilon": self.epsilon,
                "output_mode": self.output_mode, "sparse": self.sparse, "name": self.name,
                "dtype": self.dtype_policy.name}

    @classmethod
    def from_config(cls, config: dict) -> "Discretization":
        config = dict(config)
        if config.get("bin_boundaries") is not None and config.get("num_bins") is not None:
            boundaries = config.pop("bin_boundaries")  # (an adapted layer has both, as in Keras)
            layer = cls(**config)
            layer.bin_boundaries = list(boundaries)
            return layer
        return cls(**config)


def _salt(value: Any, owner: str) -> "list | None":
    if value is None:
        return None
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return [_validate.integer(v, "salt", owner, minimum=0) for v in value]
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return [int(value), int(value)]
    raise ValueError(f"{owner}: The `salt` argument for `Hashing` can only be a tuple of size 2 integers, or a "
                     f"single integer. Received: salt={value}.")


def _as_bytes(values: np.ndarray, owner: str) -> list:
    """The byte strings TensorFlow hashes: strings as UTF-8, integers as their decimal text (``tf.as_string``)."""
    flat = values.reshape(-1)
    kind = values.dtype.kind
    if kind in "US":
        return [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in flat.tolist()]
    if kind == "O":
        out = []
        for v in flat.tolist():
            if isinstance(v, str):
                out.append(v.encode("utf-8"))
            elif isinstance(v, bytes):
                out.append(v)
            elif isinstance(v, (int, np.integer)) and not isinstance(v, bool):
                out.append(str(int(v)).encode())
            else:
                raise _validate.ArgumentTypeError(f"{owner}: inputs must be strings or integers, got {v!r}")
        return out
    if kind in "iu":
        return [str(int(v)).encode() for v in flat.astype(np.int64).tolist()]
    raise _validate.ArgumentTypeError(f"{owner}: inputs must be strings or integers, got dtype {values.dtype}")


@register
class Hashing(_HostPreprocessing):
    """``Hashing(num_bins, mask_value=None, salt=None, output_mode="int", sparse=False)``: strings or integers
    to bins ``hash % num_bins``: FarmHash Fingerprint64, or SipHash-2-4 keyed by ``salt`` (an int ``s`` means
    ``[s, s]``), the bins Keras gives. With ``mask_value``, that value maps to 0 and the others to
    ``1 + hash % (num_bins - 1)``. Integers hash as their decimal text, as Keras. Output int64 (``"int"``) or
    one-hot/multi-hot/count vectors of ``num_bins``."""

    def __init__(self, num_bins: int, mask_value: Any = None, salt: Any = None, output_mode: str = "int",
                 sparse: bool = False, **kwargs: Any) -> None:
        if kwargs.get("dtype") is None:
            kwargs["dtype"] = "int64" if output_mode == "int" else None
        dtype = kwargs.pop("dtype")
        super().__init__(**kwargs)
        owner = self._owner
        self._out_dtype = str(np.dtype(dtype)) if dtype is not None else self.compute_dtype
        if dtype is not None and output_mode != "int":
            self.dtype_policy = type(self.dtype_policy)(str(np.dtype(dtype)))
        self.num_bins = _validate.positive_int(num_bins, "num_bins", owner)
        if mask_value is not None and self.num_bins < 2:
            raise ValueError(f"{owner}: num_bins must be at least 2 with a mask_value (bin 0 is the mask's), got "
                             f"{num_bins}")
        self.output_mode = _validate.one_of(output_mode, "output_mode", owner, _OUTPUT_MODES)
        if output_mode == "int" and np.dtype(self._out_dtype).kind not in "iu":
            raise ValueError(f"{owner}: When `output_mode=\"int\"`, `dtype` should be an integer type, got {dtype!r}")
        if sparse:
            raise NotImplementedError(f"{owner}: sparse=True (sparse tensors) is not supported")
        self.sparse = False
        self.mask_value = mask_value
        self.salt = _salt(salt, owner)
        self.strong_hash = self.salt is not None
        self.built = True

    def _bins(self, x: np.ndarray) -> np.ndarray:
        keys = _as_bytes(x, self._owner)
        n = self.num_bins - (1 if self.mask_value is not None else 0)
        if self.salt is not None:
            key = (self.salt[0], self.salt[1])
            hashed = [siphash64(key, k) % n for k in keys]
        else:
            hashed = [fingerprint64(k) % n for k in keys]
        out = np.asarray(hashed, dtype=np.int64).reshape(x.shape)
        if self.mask_value is not None:
            mask = _as_bytes(np.asarray([self.mask_value]), self._owner)[0]
            out = np.where(np.asarray([k == mask for k in keys]).reshape(x.shape), 0, out + 1)
        return out

    def _host_call(self, inputs: Any) -> np.ndarray:
        x = inputs if isinstance(inputs, np.ndarray) else (_host(inputs) if isinstance(inputs, Tensor)
                                                              else np.asarray(inputs, dtype=object))
        if x.dtype == object and x.size and all(isinstance(v, str) for v in x.reshape(-1).tolist()):
            x = x.astype(str)
        bins = self._bins(x)
        return _encode(bins, self.output_mode, self.num_bins, self._out_dtype, self._owner)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        if self.output_mode == "int":
            return shape
        if self.output_mode == "one_hot" and (not shape or shape[-1] != 1):
            return shape + (self.num_bins,)
        return shape[:-1] + (self.num_bins,) if len(shape) > 1 else (self.num_bins,)

    def get_config(self) -> dict:
        return {**super().get_config(), "dtype": self._out_dtype, "num_bins": self.num_bins, "salt": self.salt,
                "mask_value": self.mask_value, "output_mode": self.output_mode, "sparse": self.sparse}


_CROSS_KEY = 0xDECAFCAFFE  # TensorFlow's default hash key of tf.sparse.cross_hashed
_M64 = (1 << 64) - 1


def _fingerprint_cat64(fp1: int, fp2: int) -> int:
    """TensorFlow's ``FingerprintCat64``: two fingerprints combined (order matters)."""
    mul = 0xC6A4A7935BD1E995

    def shift_mix(v: int) -> int:
        return v ^ (v >> 47)

    result = fp1 ^ mul
    result ^= (shift_mix((fp2 * mul) & _M64) * mul) & _M64
    result = (result * mul) & _M64
    result = (shift_mix(result) * mul) & _M64
    return shift_mix(result)


@register
class HashedCrossing(_HostPreprocessing):
    """``HashedCrossing(num_bins, output_mode="int", sparse=False)``: the cross of two or more categorical
    features (each of shape ``()``, ``(batch,)`` or ``(batch, 1)``, strings or integers) hashed into
    ``num_bins`` bins, bitwise as Keras (``tf.sparse.cross_hashed``: each string's Fingerprint64, or an
    integer's value, chained by ``FingerprintCat64`` from the key ``0xDECAFCAFFE``). Output int64 of the
    inputs' shape, or one-hot vectors of ``num_bins``."""

    def __init__(self, num_bins: int, output_mode: str = "int", sparse: bool = False, name: "str | None" = None,
                 dtype: Any = None, **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        owner = self._owner
        self.num_bins = _validate.positive_int(num_bins, "num_bins", owner)
        self.output_mode = _validate.one_of(output_mode, "output_mode", owner, ("int", "one_hot"))
        if sparse:
            raise NotImplementedError(f"{owner}: sparse=True (sparse tensors) is not supported")
        self.sparse = False
        if dtype is None:
            dtype = "int64" if output_mode == "int" else self.compute_dtype
        self._out_dtype = str(np.dtype(dtype))
        if output_mode == "int" and np.dtype(self._out_dtype).kind not in "iu":
            raise ValueError(f"{owner}: When `output_mode=\"int\"`, `dtype` should be an integer type, got {dtype!r}")
        self.built = True

    def _feature_hashes(self, x: np.ndarray) -> list:
        flat = x.reshape(-1)
        if x.dtype.kind in "iu":
            return [int(v) & _M64 for v in flat.astype(np.int64).tolist()]
        if x.dtype.kind in "USO":
            out = []
            for v in flat.tolist():
                if isinstance(v, str):
                    out.append(fingerprint64(v.encode("utf-8")))
                elif isinstance(v, bytes):
                    out.append(fingerprint64(v))
                elif isinstance(v, (int, np.integer)) and not isinstance(v, bool):
                    out.append(int(v) & _M64)
                else:
                    raise _validate.ArgumentTypeError(f"{self._owner}: inputs must be strings or integers, got {v!r}")
            return out
        raise _validate.ArgumentTypeError(f"{self._owner}: inputs must be strings or integers, got dtype {x.dtype}")

    def _host_call(self, inputs: Any) -> np.ndarray:
        owner = self._owner
        if not isinstance(inputs, (list, tuple)):
            raise ValueError(f"{owner}: `HashedCrossing` should be called on a list or tuple of inputs. Received: "
                             f"inputs={inputs!r}")
        if len(inputs) < 2:
            raise ValueError(f"{owner}: `HashedCrossing` should be called on at least two inputs. Received: "
                             f"inputs={inputs!r}")
        arrays = [_host(x) if isinstance(x, (Tensor, np.ndarray)) else np.asarray(x) for x in inputs]
        shape = arrays[0].shape
        for a in arrays:
            if a.ndim > 2 or (a.ndim == 2 and a.shape[-1] != 1):
                raise ValueError(f"{owner}: All `HashedCrossing` inputs should have shape `()`, `(batch_size)` or "
                                 f"`(batch_size, 1)`. Received shapes {[x.shape for x in arrays]}")
            if a.shape != shape:
                raise ValueError(f"{owner}: Expected the input tensors to have identical shapes, got "
                                 f"{[x.shape for x in arrays]}")
        columns = [self._feature_hashes(a) for a in arrays]
        out = []
        for row in zip(*columns):
            h = _CROSS_KEY
            for value in row:
                h = _fingerprint_cat64(h, value)
            out.append(h % self.num_bins)
        bins = np.asarray(out, dtype=np.int64).reshape(shape)
        if self.output_mode == "int":
            return bins.astype(self._out_dtype)
        return _encode(bins, "one_hot", self.num_bins, self._out_dtype, owner)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        if not isinstance(input_shape, (list, tuple)) or len(input_shape) < 2 or \
                not all(isinstance(s, (list, tuple)) for s in input_shape):
            raise ValueError(f"{self._owner}: Expected as input a list/tuple of tensors. Received "
                             f"input_shape={input_shape}")
        first = tuple(input_shape[0])
        if self.output_mode == "int":
            return first
        if not first or first[-1] != 1:
            return first + (self.num_bins,)
        return first[:-1] + (self.num_bins,)

    def get_config(self) -> dict:
        return {"num_bins": self.num_bins, "output_mode": self.output_mode, "sparse": self.sparse,
                "name": self.name, "dtype": self._out_dtype}


__all__ += ["HashedCrossing"]
