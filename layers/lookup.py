"""``keras.layers.StringLookup`` and ``IntegerLookup`` (Keras 3's ``IndexLookup``) and ``TextVectorization``, on
the host.

Tokens to indices (or back, ``invert=True``) through a vocabulary given as an argument, set by
``set_vocabulary`` or learnt by ``adapt`` (most frequent first, ties broken by the tokens' order, high to
low, as Keras). Index layout as Keras: ``[mask_token] + [OOV] * num_oov_indices + vocabulary`` (the mask
index only in ``"int"`` mode); with several OOV indices an unknown string goes to
``Fingerprint64(token) % num_oov_indices`` (SipHash with ``salt``) and an unknown integer to
``token % num_oov_indices`` (``oov_method="floormod"``), the bins Keras gets from TensorFlow. Output modes
``"int"`` (int64), ``"one_hot"``, ``"multi_hot"``, ``"count"``, ``"tf_idf"`` (idf ``log(1 + documents /
(1 + document count))``, the special indices weighted by the mean idf). Inverted string lookups return a
NumPy array of ``bytes`` objects (as Keras on its non-TensorFlow backends); everything else a tensor.
"""

from __future__ import annotations

import collections
import re
from typing import Any

import numpy as np

from dnnbind import _validate
from dnnbind.autodiff.tensor import Tensor

from ._fingerprint import fingerprint64, siphash64
from .base import is_symbolic, register
from .feature_preprocessing import _HostPreprocessing, _host, _salt

__all__ = ["StringLookup", "IntegerLookup"]

_MODES = ("int", "one_hot", "multi_hot", "count", "tf_idf")


class _IndexLookup(_HostPreprocessing):
    _strings = True

    def __init__(self, max_tokens: "int | None", num_oov_indices: int, mask_token: Any, oov_token: Any,
                 vocabulary_dtype: str, vocabulary: Any = None, idf_weights: Any = None, invert: bool = False,
                 output_mode: str = "int", sparse: bool = False, pad_to_max_tokens: bool = False,
                 oov_method: str = "floormod", name: "str | None" = None, salt: Any = None, **kwargs: Any) -> None:
        frozen = kwargs.pop("vocabulary_size", None)
        has_input = kwargs.pop("has_input_vocabulary", vocabulary is not None)
        kwargs.pop("dtype", None)
        super().__init__(name=name, **kwargs)
        owner = self._owner
        if max_tokens is not None and _validate.integer(max_tokens, "max_tokens", owner) <= 1:
            raise ValueError(f"{owner}: If set, `max_tokens` must be greater than 1. Received: max_tokens={max_tokens}")
        if pad_to_max_tokens and max_tokens is None:
            raise ValueError(f"{owner}: If pad_to_max_tokens is True, must set `max_tokens`. Received: "
                             f"max_tokens={max_tokens}")
        if _validate.integer(num_oov_indices, "num_oov_indices", owner) < 0:
            raise ValueError(f"{owner}: `num_oov_indices` must be greater than or equal to 0. Received: "
                             f"num_oov_indices={num_oov_indices}")
        self.oov_method = _validate.one_of(oov_method, "oov_method", owner, ("floormod", "farmhash"))
        if salt is not None and not self._strings and oov_method != "farmhash":
            raise ValueError(f"{owner}: `salt` can only be used when `oov_method='farmhash'`. Received: "
                             f"oov_method={oov_method}")
        self.salt = _salt(salt, owner)
        output_mode = {"binary": "multi_hot", "tf-idf": "tf_idf"}.get(output_mode, output_mode)
        self.output_mode = _validate.one_of(output_mode, "output_mode", owner, _MODES)
        if invert and output_mode != "int":
            raise ValueError(f"{owner}: `output_mode` must be `'int'` when `invert` is true. Received: "
                             f"output_mode={output_mode}")
        if sparse:
            raise NotImplementedError(f"{owner}: sparse=True (sparse tensors) is not supported")
        if idf_weights is not None and output_mode != "tf_idf":
            raise ValueError(f"{owner}: `idf_weights` should only be set if `output_mode` is `'tf_idf'`. Received: "
                             f"idf_weights={idf_weights} and output_mode={output_mode}")
        self.invert = _validate.boolean(invert, "invert", owner)
        self.max_tokens = max_tokens
        self.num_oov_indices = int(num_oov_indices)
        self.mask_token = mask_token
        self.oov_token = oov_token
        self.sparse = False
        self.pad_to_max_tokens = bool(pad_to_max_tokens)
        self.vocabulary_dtype = vocabulary_dtype
        self._frozen_vocab_size = frozen
        self.input_vocabulary = vocabulary if not isinstance(vocabulary, str) else None
        self.input_idf_weights = idf_weights
        self._has_input_vocabulary = bool(has_input)
        self._tokens: list = []
        self._index: dict = {}
        self.idf_weights = None
        self._counts: collections.Counter = collections.Counter()
        self._doc_counts: collections.Counter = collections.Counter()
        self._num_documents = 0
        if self.output_mode == "tf_idf" and self._has_input_vocabulary and idf_weights is None:
            raise ValueError(f"{owner}: When specifying the `vocabulary` argument, in TF-IDF output mode, the "
                             "`idf_weights` argument must also be provided.")
        if vocabulary is not None:
            self.set_vocabulary(vocabulary, idf_weights)
        self.built = True

    # ----- tokens -------------------------------------------------------------------------------------------
    def _token(self, value: Any) -> Any:
        """A token as the vocabulary keeps it: ``str`` (StringLookup) or ``int`` (IntegerLookup)."""
        if self._strings:
            if isinstance(value, bytes):
                return value.decode("utf-8")
            if isinstance(value, (str, np.str_)):
                return str(value)
            raise _validate.ArgumentTypeError(f"{self._owner}: tokens must be strings, got {value!r}")
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            if isinstance(value, (float, np.floating)) and float(value).is_integer():
                return int(value)
            raise _validate.ArgumentTypeError(f"{self._owner}: tokens must be integers, got {value!r}")
        return int(value)

    def _tokens_of(self, data: Any) -> np.ndarray:
        x = _host(data) if isinstance(data, Tensor) else np.asarray(data, dtype=object if self._strings else None)
        return x

    def _oov_start_index(self) -> int:
        return 1 if self.mask_token is not None and self.output_mode == "int" else 0

    def _token_start_index(self) -> int:
        return self._oov_start_index() + self.num_oov_indices

    def vocabulary_size(self) -> int:
        """The vocabulary's size with the mask and OOV indices."""
        return len(self._tokens) + self._token_start_index()

    def get_vocabulary(self, include_special_tokens: bool = True) -> list:
        vocab = [self.oov_token] * self._token_start_index() + list(self._tokens)
        if self.mask_token is not None and self.output_mode == "int":
            vocab[0] = self.mask_token
        return vocab if include_special_tokens else vocab[self._token_start_index():]

    def set_vocabulary(self, vocabulary: Any, idf_weights: Any = None) -> None:
        """Set the vocabulary (and, for ``"tf_idf"``, the idf weights) directly (Keras's ``set_vocabulary``; a
        vocabulary file path is read one token a line)."""
        owner = self._owner
        if self.output_mode == "tf_idf" and idf_weights is None:
            raise ValueError(f"{owner}: `idf_weights` must be set if output_mode is 'tf_idf'.")
        if self.output_mode != "tf_idf" and idf_weights is not None:
            raise ValueError(f"{owner}: `idf_weights` should only be set if output_mode is `'tf_idf'`. Received: "
                             f"output_mode={self.output_mode} and idf_weights={idf_weights}")
        if isinstance(vocabulary, str):
            if self.output_mode == "tf_idf":
                raise ValueError(f"{owner}: output_mode `'tf_idf'` does not support loading a vocabulary from file.")
            with open(vocabulary, encoding="utf-8") as f:
                lines = f.read().splitlines()
            while lines and lines[-1] == "":
                lines.pop()
            vocabulary = lines if self._strings else [int(v) for v in lines]
        values = [self._token(v) for v in np.asarray(vocabulary, dtype=object).reshape(-1).tolist()]
        if not values:
            raise ValueError(f"{owner}: Cannot set an empty vocabulary. Received: vocabulary={vocabulary}")
        token_start = self._token_start_index()
        special = [self.mask_token] * self._oov_start_index() + [self.oov_token] * self.num_oov_indices
        found_special = values[:token_start] == special
        tokens = values[token_start:] if found_special else values
        repeated = [t for t, c in collections.Counter(tokens).items() if c > 1]
        if repeated:
            raise ValueError(f"{owner}: The passed vocabulary has at least one repeated term. Please uniquify your "
                             f"dataset. The repeated terms are: {repeated}")
        if self.mask_token is not None and self.mask_token in tokens:
            raise ValueError(f"{owner}: Found reserved mask token at unexpected location in `vocabulary`. Either "
                             "remove all mask and OOV tokens, or include them only at the start of the vocabulary "
                             f"in precisely this order: {special}. Received: mask_token={self.mask_token}")
        if self.oov_token is not None and self.invert and self.oov_token in tokens:
            raise ValueError(f"{owner}: Found reserved OOV token at unexpected location in `vocabulary`: "
                             f"{self.oov_token!r}")
        if self.max_tokens is not None and token_start + len(tokens) > self.max_tokens:
            raise ValueError(f"{owner}: Attempted to set a vocabulary larger than the maximum vocab size. Received "
                             f"vocabulary size is {token_start + len(tokens)}; `max_tokens` is {self.max_tokens}.")
        self._set_tokens(tokens)
        if self.output_mode == "tf_idf":
            weights = np.asarray(idf_weights, dtype=np.float64)
            if weights.ndim != 1 or len(weights) != len(values):
                raise ValueError(f"{owner}: `idf_weights` must be the same length as vocabulary. len(idf_weights) is "
                                 f"{weights.size}; len(vocabulary) is {len(values)}")
            front, front_value = (0, 0.0) if found_special else (token_start, float(np.average(weights)))
            back = self.max_tokens - front - len(weights) if self.pad_to_max_tokens else 0
            self.idf_weights = np.pad(weights, (front, back), constant_values=(front_value, 0.0)).astype(
                self.compute_dtype)
        self._record_vocabulary_size()

    def _set_tokens(self, tokens: list) -> None:
        start = self._token_start_index()
        self._tokens = list(tokens)
        self._index = {t: start + i for i, t in enumerate(self._tokens)}

    def _record_vocabulary_size(self) -> None:
        if self.output_mode != "int" and not self.pad_to_max_tokens and self._frozen_vocab_size is not None and \
                self._frozen_vocab_size != self.vocabulary_size():
            raise RuntimeError(f"{self._owner}: When using `output_mode={self.output_mode}` and "
                               "`pad_to_max_tokens=False`, the vocabulary size cannot be changed after the layer is "
                               f"called. Old vocab size is {self._frozen_vocab_size}, new vocab size is "
                               f"{self.vocabulary_size()}")
        self._frozen_vocab_size = self.vocabulary_size()

    # ----- adapt --------------------------------------------------------------------------------------------
    def adapt(self, data: Any, steps: "int | None" = None) -> None:
        """Learn the vocabulary from ``data`` (an array or list: a 1-d one is one token per document; or an
        iterable of batches)."""
        self.reset_state()
        if isinstance(data, (list, tuple, np.ndarray, Tensor)):
            x = self._tokens_of(data)
            self.update_state(x[:, None] if x.ndim == 1 else x)
        else:
            for i, batch in enumerate(data):
                if steps is not None and i >= steps:
                    break
                self.update_state(batch)
        self.finalize_state()

    def update_state(self, data: Any) -> None:
        if self._has_input_vocabulary:
            raise ValueError(f"{self._owner}: Cannot adapt layer '{self.name}' after setting a static vocabulary via "
                             "`vocabulary` argument or `set_vocabulary()` method.")
        x = self._tokens_of(data)
        if x.ndim == 0:
            x = x[None]
        if x.ndim == 1:
            x = x[None]
        self._counts.update(self._token(v) for v in x.reshape(-1).tolist())
        if self.output_mode == "tf_idf":
            for row in x.reshape(x.shape[0], -1):
                self._doc_counts.update({self._token(v) for v in row.tolist()})
            self._num_documents += int(x.shape[0])

    def finalize_state(self) -> None:
        if self._has_input_vocabulary or not self._counts:
            self._record_vocabulary_size()
            return
        for special in (self.mask_token, self.oov_token):
            if special is not None:
                self._counts.pop(special, None)
        # count high to low, ties by the token, high to low (np.lexsort((tokens, counts))[::-1], as Keras)
        ordered = sorted(self._counts.items(), key=lambda tc: (tc[1], tc[0]), reverse=True)
        if self.max_tokens:
            ordered = ordered[:self.max_tokens - self._token_start_index()]
        tokens = [t for t, _ in ordered]
        self._set_tokens(tokens)
        if self.output_mode == "tf_idf":
            docs = np.array([self._doc_counts[t] for t in tokens], dtype=np.float64)
            idf = np.log(1 + self._num_documents / (1 + docs))
            weights = np.pad(idf, (self._token_start_index(), 0), constant_values=float(np.mean(idf)))
            if self.pad_to_max_tokens and self.max_tokens is not None:
                weights = np.pad(weights, (0, self.max_tokens - weights.size))
            self.idf_weights = weights.astype(self.compute_dtype)
        self.reset_state()
        self._record_vocabulary_size()

    def reset_state(self) -> None:
        self._counts = collections.Counter()
        self._doc_counts = collections.Counter()
        self._num_documents = 0

    # ----- the lookup ---------------------------------------------------------------------------------------
    def _oov_index(self, token: Any) -> int:
        if self.num_oov_indices == 0:
            raise ValueError(f"{self._owner}: When `num_oov_indices=0` all inputs should be in vocabulary, found OOV "
                             f"value {token!r}, consider setting `num_oov_indices=1`.")
        start = self._oov_start_index()
        if self.num_oov_indices == 1:
            return start
        if not self._strings and self.oov_method != "farmhash":
            return start + token % self.num_oov_indices
        data = (token if self._strings else str(token)).encode("utf-8")
        h = siphash64(tuple(self.salt), data) if self.salt is not None else fingerprint64(data)
        return start + h % self.num_oov_indices

    def _host_call(self, inputs: Any) -> Any:
        x = self._tokens_of(inputs)
        if self.invert:
            return self._inverse(x)
        if self.output_mode != "int" and not self.pad_to_max_tokens and self._frozen_vocab_size is None:
            raise RuntimeError(f"{self._owner}: When using `output_mode={self.output_mode}` and "
                               "`pad_to_max_tokens=False`, you must set the layer's vocabulary before calling it. "
                               "Either pass a `vocabulary` argument to the layer, or call `adapt` with some sample "
                               "data.")
        masked = np.iinfo(np.int64).max  # (what Keras looks the mask up to outside "int": no bin)
        out = []
        for v in x.reshape(-1).tolist():
            t = self._token(v)
            if self.mask_token is not None and t == self.mask_token:
                out.append(0 if self.output_mode == "int" else masked)
            else:
                i = self._index.get(t)
                out.append(self._oov_index(t) if i is None else i)
        ids = np.asarray(out, dtype=np.int64).reshape(x.shape)
        if self.output_mode == "int":
            return ids
        return self._encode(ids)

    def _encode(self, ids: np.ndarray) -> np.ndarray:
        depth = self.max_tokens if self.pad_to_max_tokens else self._frozen_vocab_size
        x = ids if ids.ndim else ids[None]
        if self.output_mode == "one_hot":
            if x.ndim > 1 and x.shape[-1] == 1:
                x = x[..., 0]
            out = np.zeros(x.shape + (depth,), dtype=self.compute_dtype)
            keep = x < depth
            np.put_along_axis(out, np.where(keep, x, 0)[..., None], keep[..., None].astype(out.dtype), axis=-1)
            return out
        rows = x.reshape(-1, x.shape[-1]) if x.ndim > 1 else x[None]
        counts = np.zeros((rows.shape[0], depth), dtype=np.float64)
        for r, row in enumerate(rows):
            row = row[row < depth]
            np.add.at(counts[r], row, 1.0)
        if self.output_mode == "multi_hot":
            counts = np.minimum(counts, 1.0)
        elif self.output_mode == "tf_idf":
            counts = counts * self.idf_weights[:depth]
        counts = counts.reshape(x.shape[:-1] + (depth,)) if x.ndim > 1 else counts[0]
        return counts.astype(self.compute_dtype)

    def _inverse(self, x: np.ndarray) -> Any:
        start = self._token_start_index()
        out = []
        for v in x.reshape(-1).tolist():
            i = int(v)
            if self.mask_token is not None and i == 0:
                out.append(self.mask_token)
            elif start <= i < start + len(self._tokens):
                out.append(self._tokens[i - start])
            else:
                out.append(self.oov_token)
        if self._strings:
            return np.array([None if t is None else t.encode("utf-8") for t in out], dtype=object).reshape(x.shape)
        return np.asarray(out, dtype=np.int64).reshape(x.shape)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = super().__call__(*args, **kwargs)
        if isinstance(out, Tensor) and out.dtype == object:  # strings stay a NumPy array (see the module docstring)
            return out.data
        return out

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        if self.output_mode == "int":
            return shape
        depth = self.max_tokens if self.pad_to_max_tokens else self._frozen_vocab_size
        if self.output_mode == "one_hot":
            return shape[:-1] + (depth,) if len(shape) > 1 and shape[-1] == 1 else shape + (depth,)
        return shape[:-1] + (depth,)

    def get_config(self) -> dict:
        def listify(v: Any) -> Any:
            return v.tolist() if isinstance(v, np.ndarray) else (list(v) if isinstance(v, tuple) else v)

        return {**super().get_config(), "invert": self.invert, "max_tokens": self.max_tokens,
                "num_oov_indices": self.num_oov_indices, "oov_token": self.oov_token, "mask_token": self.mask_token,
                "output_mode": self.output_mode, "sparse": self.sparse, "pad_to_max_tokens": self.pad_to_max_tokens,
                "vocabulary_dtype": self.vocabulary_dtype, "idf_weights": listify(self.input_idf_weights),
                "vocabulary": listify(self.input_vocabulary), "vocabulary_size": self._frozen_vocab_size,
                "oov_method": self.oov_method, "salt": self.salt}


@register
class StringLookup(_IndexLookup):
    """``StringLookup(max_tokens=None, num_oov_indices=1, mask_token=None, oov_token="[UNK]", vocabulary=None,
    idf_weights=None, invert=False, output_mode="int", pad_to_max_tokens=False, sparse=False, encoding="utf-8",
    salt=None)``: strings to vocabulary indices (see the module docstring)."""

    _strings = True

    def __init__(self, max_tokens: "int | None" = None, num_oov_indices: int = 1, mask_token: Any = None,
                 oov_token: Any = "[UNK]", vocabulary: Any = None, idf_weights: Any = None, invert: bool = False,
                 output_mode: str = "int", pad_to_max_tokens: bool = False, sparse: bool = False,
                 encoding: str = "utf-8", name: "str | None" = None, salt: Any = None, **kwargs: Any) -> None:
        kwargs.pop("vocabulary_dtype", None)
        self.encoding = encoding
        super().__init__(max_tokens, num_oov_indices, mask_token, oov_token, "string", vocabulary=vocabulary,
                         idf_weights=idf_weights, invert=invert, output_mode=output_mode, sparse=sparse,
                         pad_to_max_tokens=pad_to_max_tokens, name=name, salt=salt, **kwargs)

    def get_config(self) -> dict:
        return {**super().get_config(), "encoding": self.encoding}


@register
class IntegerLookup(_IndexLookup):
    """``IntegerLookup(max_tokens=None, num_oov_indices=1, mask_token=None, oov_token=-1, vocabulary=None,
    vocabulary_dtype="int64", idf_weights=None, invert=False, output_mode="int", sparse=False,
    pad_to_max_tokens=False, oov_method="floormod", salt=None)``: integers to vocabulary indices (see the
    module docstring)."""

    _strings = False

    def __init__(self, max_tokens: "int | None" = None, num_oov_indices: int = 1, mask_token: Any = None,
                 oov_token: Any = -1, vocabulary: Any = None, vocabulary_dtype: str = "int64", idf_weights: Any = None,
                 invert: bool = False, output_mode: str = "int", sparse: bool = False, pad_to_max_tokens: bool = False,
                 oov_method: str = "floormod", salt: Any = None, name: "str | None" = None, **kwargs: Any) -> None:
        if vocabulary_dtype != "int64":
            raise ValueError(f"IntegerLookup: Only `vocabulary_dtype='int64'` is supported at this time. Received: "
                             f"vocabulary_dtype={vocabulary_dtype}")
        super().__init__(max_tokens, num_oov_indices, mask_token, oov_token, "int64", vocabulary=vocabulary,
                         idf_weights=idf_weights, invert=invert, output_mode=output_mode, sparse=sparse,
                         pad_to_max_tokens=pad_to_max_tokens, oov_method=oov_method, name=name, salt=salt, **kwargs)


_STRIP = re.compile(r'[!"#$%&()\*\+,-\./:;<=>?@\[\\\]^_`{|}~\']')
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_WHITESPACE = re.compile(r"[ \t\n\v\f\r]+")


@register
class TextVectorization(_HostPreprocessing):
    """``TextVectorization(max_tokens=None, standardize="lower_and_strip_punctuation", split="whitespace",
    ngrams=None, output_mode="int", output_sequence_length=None, pad_to_max_tokens=False, vocabulary=None,
    idf_weights=None, sparse=False, ragged=False, encoding="utf-8")``: strings ``(batch,)`` or ``(batch, 1)`` to
    token indices or vectors, on the host, as Keras 3: standardise (ASCII lower-casing, as ``tf.strings.lower``;
    Keras's punctuation set stripped), split on ASCII whitespace (or into characters), add the ``ngrams``
    (``n``: widths 1 to n; a tuple: those widths, grouped by width), then a :class:`StringLookup` with mask
    ``""`` and OOV ``"[UNK]"``. ``"int"``: int64 ids padded with 0 to the longest text of the batch (or cut and
    padded to ``output_sequence_length``); a list of int64 arrays with ``ragged=True``. ``standardize`` and
    ``split`` may be callables (on Python strings and lists of them here)."""

    def __init__(self, max_tokens: "int | None" = None, standardize: Any = "lower_and_strip_punctuation",
                 split: Any = "whitespace", ngrams: Any = None, output_mode: str = "int",
                 output_sequence_length: "int | None" = None, pad_to_max_tokens: bool = False, vocabulary: Any = None,
                 idf_weights: Any = None, sparse: bool = False, ragged: bool = False, encoding: str = "utf-8",
                 name: "str | None" = None, **kwargs: Any) -> None:
        has_input = kwargs.pop("has_input_vocabulary", vocabulary is not None)
        vocabulary_size = kwargs.pop("vocabulary_size", None)
        kwargs.pop("dtype", None)
        super().__init__(name=name, **kwargs)
        owner = self._owner
        if not (standardize is None or callable(standardize)):
            _validate.one_of(standardize, "standardize", owner, ("lower_and_strip_punctuation", "lower",
                                                                 "strip_punctuation"))
        if not (split is None or callable(split)):
            _validate.one_of(split, "split", owner, ("whitespace", "character"))
        if output_mode == "binary":
            output_mode = "multi_hot"
        if output_mode == "tf-idf":
            output_mode = "tf_idf"
        _validate.one_of(output_mode, "output_mode", owner, _MODES)
        if not (ngrams is None or (isinstance(ngrams, int) and not isinstance(ngrams, bool)) or
                (isinstance(ngrams, (tuple, list)) and all(isinstance(n, int) for n in ngrams))):
            raise ValueError(f"{owner}: `ngrams` must be None, an integer, or a tuple of integers. Received: "
                             f"ngrams={ngrams}")
        if output_mode == "int" and not (output_sequence_length is None or isinstance(output_sequence_length, int)):
            raise ValueError(f"{owner}: `output_sequence_length` must be either None or an integer when "
                             f"`output_mode` is 'int'. Received: output_sequence_length={output_sequence_length}")
        if output_mode != "int" and output_sequence_length is not None:
            raise ValueError(f"{owner}: `output_sequence_length` must not be set if `output_mode` is not 'int'. "
                             f"Received output_sequence_length={output_sequence_length}.")
        if ragged and output_mode != "int":
            raise ValueError(f"{owner}: `ragged` must not be true if `output_mode` is not `'int'`. Received: "
                             f"ragged={ragged} and output_mode={output_mode}")
        self._standardize = standardize
        self._split = split
        self._ngrams_arg = list(ngrams) if isinstance(ngrams, (tuple, list)) else ngrams
        self._ngrams = tuple(range(1, ngrams + 1)) if isinstance(ngrams, int) else (
            None if ngrams is None else tuple(ngrams))
        self._ragged = bool(ragged)
        self._output_mode = output_mode
        self._output_sequence_length = output_sequence_length
        self._encoding = encoding
        self._lookup_layer = StringLookup(max_tokens=max_tokens, vocabulary=vocabulary, idf_weights=idf_weights,
                                          pad_to_max_tokens=pad_to_max_tokens, mask_token="", output_mode=output_mode,
                                          sparse=sparse, has_input_vocabulary=has_input, encoding=encoding,
                                          vocabulary_size=vocabulary_size, name=f"{self.name}_lookup")
        self.built = True

    # ----- text -> tokens -----------------------------------------------------------------------------------
    def _texts(self, inputs: Any) -> list:
        x = _host(inputs) if isinstance(inputs, Tensor) else np.asarray(inputs, dtype=object)
        if self._split is not None and x.ndim > 1:
            if x.shape[-1] != 1:
                raise ValueError(f"{self._owner}: When using `TextVectorization` to tokenize strings, the input rank "
                                 f"must be 1 or the last shape dimension must be 1. Received: inputs.shape={x.shape} "
                                 f"with rank={x.ndim}")
            x = x[..., 0]
        texts = []
        for v in x.reshape(-1).tolist():
            if isinstance(v, bytes):
                v = v.decode(self._encoding)
            if not isinstance(v, str):
                raise _validate.ArgumentTypeError(f"{self._owner}: inputs must be strings, got {v!r}")
            texts.append(v)
        return texts

    def _standardized(self, text: str) -> str:
        if self._standardize in ("lower", "lower_and_strip_punctuation"):
            text = text.translate(_ASCII_LOWER)
        if self._standardize in ("strip_punctuation", "lower_and_strip_punctuation"):
            text = _STRIP.sub("", text)
        if callable(self._standardize):
            text = self._standardize(text)
        return text

    def _tokenize(self, text: str) -> list:
        text = self._standardized(text)
        if self._split is None:
            return [text]
        if self._split == "whitespace":
            tokens = [t for t in _WHITESPACE.split(text) if t]
        elif self._split == "character":
            tokens = list(text)
        else:
            tokens = list(self._split(text))
        if self._ngrams is not None:
            grams = []
            for width in self._ngrams:
                grams.extend(" ".join(tokens[i:i + width]) for i in range(len(tokens) - width + 1))
            tokens = grams
        return tokens

    # ----- the Keras API ------------------------------------------------------------------------------------
    def adapt(self, data: Any, batch_size: "int | None" = None, steps: "int | None" = None) -> None:
        """Learn the vocabulary from texts (an array or list of strings, or an iterable of batches of them)."""
        self._lookup_layer.reset_state()
        if isinstance(data, (list, tuple, np.ndarray, Tensor)):
            batches = [data]
        else:
            batches = data
        for i, batch in enumerate(batches):
            if steps is not None and i >= steps:
                break
            self._update(batch)
        self._lookup_layer.finalize_state()

    def _update(self, batch: Any) -> None:
        lookup = self._lookup_layer
        if lookup._has_input_vocabulary:
            raise ValueError(f"{self._owner}: Cannot adapt layer '{self.name}' after setting a static vocabulary via "
                             "`vocabulary` argument or `set_vocabulary()` method.")
        docs = [self._tokenize(t) for t in self._texts(batch)]
        for doc in docs:
            lookup._counts.update(doc)
        if lookup.output_mode == "tf_idf":
            for doc in docs:
                lookup._doc_counts.update(set(doc))
            lookup._num_documents += len(docs)

    def update_state(self, data: Any) -> None:
        self._update(data)

    def finalize_state(self) -> None:
        self._lookup_layer.finalize_state()

    def reset_state(self) -> None:
        self._lookup_layer.reset_state()

    def get_vocabulary(self, include_special_tokens: bool = True) -> list:
        return self._lookup_layer.get_vocabulary(include_special_tokens)

    def vocabulary_size(self) -> int:
        return self._lookup_layer.vocabulary_size()

    def set_vocabulary(self, vocabulary: Any, idf_weights: Any = None) -> None:
        self._lookup_layer.set_vocabulary(vocabulary, idf_weights=idf_weights)

    def _host_call(self, inputs: Any) -> Any:
        lookup = self._lookup_layer
        docs = [self._tokenize(t) for t in self._texts(inputs)]
        if self._output_mode != "int":
            if lookup.output_mode != "int" and not lookup.pad_to_max_tokens and lookup._frozen_vocab_size is None:
                lookup._host_call(np.array([], dtype=object))  # (raises the "set the vocabulary first" error)
            return np.stack([lookup._encode(np.asarray([self._index(lookup, t) for t in doc], dtype=np.int64))
                             for doc in docs]) if docs else np.zeros((0, lookup._frozen_vocab_size))
        rows = [np.asarray([self._index(lookup, t) for t in doc], dtype=np.int64) for doc in docs]
        if self._output_sequence_length is not None:
            rows = [r[:self._output_sequence_length] for r in rows]
        if self._ragged:
            return rows
        width = self._output_sequence_length if self._output_sequence_length is not None else max(
            (len(r) for r in rows), default=0)
        out = np.zeros((len(rows), width), dtype=np.int64)
        for i, r in enumerate(rows):
            out[i, :len(r)] = r
        return out

    @staticmethod
    def _index(lookup: "StringLookup", token: str) -> int:
        if token == lookup.mask_token:
            return 0 if lookup.output_mode == "int" else np.iinfo(np.int64).max
        i = lookup._index.get(token)
        return lookup._oov_index(token) if i is None else i

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._ragged and not any(is_symbolic(a) for a in args):
            return self._host_call(*args, **kwargs)
        return super().__call__(*args, **kwargs)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        if self._output_mode == "int":
            return (tuple(input_shape)[0], self._output_sequence_length)
        shape = tuple(input_shape)
        shape = shape + (1,) if self._split is None and len(shape) <= 1 else (
            shape + (None,) if self._split is not None else shape)
        return self._lookup_layer.compute_output_shape(shape)

    def get_config(self) -> dict:
        lookup = self._lookup_layer
        owner = self._owner
        for key, value in (("standardize", self._standardize), ("split", self._split)):
            if callable(value):
                raise ValueError(f"{owner}: a callable {key} cannot be written into a config; use one of Keras's "
                                 "names, or rebuild the layer in code")

        def listify(v: Any) -> Any:
            return v.tolist() if isinstance(v, np.ndarray) else (list(v) if isinstance(v, tuple) else v)

        return {**super().get_config(), "max_tokens": lookup.max_tokens, "standardize": self._standardize,
                "split": self._split, "ngrams": self._ngrams_arg, "output_mode": self._output_mode,
                "output_sequence_length": self._output_sequence_length, "pad_to_max_tokens": lookup.pad_to_max_tokens,
                "sparse": lookup.sparse, "ragged": self._ragged, "vocabulary": listify(lookup.input_vocabulary),
                "idf_weights": listify(lookup.input_idf_weights), "encoding": self._encoding,
                "vocabulary_size": self.vocabulary_size()}

    @classmethod
    def from_config(cls, config: dict) -> "TextVectorization":
        config = dict(config)
        if isinstance(config.get("ngrams"), list):
            config["ngrams"] = tuple(config["ngrams"])
        return cls(**config)


__all__ += ["TextVectorization"]
