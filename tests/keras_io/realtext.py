"""Real English text that every Python ships, for the text examples' offline stand-ins: the pydoc topic
help of CPython's standard library (``pydoc_data.topics``, PSF licence), about 465,000 characters in 79
topics. Tokenized as the keras.io examples' ``custom_standardization`` does (lowercase, punctuation split
off), in plain Python."""

from __future__ import annotations

import collections
import re

import numpy as np

_TOKEN = re.compile(r"[a-z]+|[0-9]+|[^\sa-z0-9]")


def topics() -> "dict[str, str]":
    from pydoc_data.topics import topics as t

    return dict(t)


def words(text: str) -> "list[str]":
    return _TOKEN.findall(text.lower())


def vocabulary(tokens: "list[str]", size: int) -> "list[str]":
    """TextVectorization's vocabulary order: "" (padding, 0), "[UNK]" (1), then by descending frequency."""
    counts = collections.Counter(tokens)
    return ["", "[UNK]"] + [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: size - 2]]


def encode(tokens: "list[str]", vocab: "list[str]") -> np.ndarray:
    index = {w: i for i, w in enumerate(vocab)}
    return np.array([index.get(w, 1) for w in tokens], dtype=np.int32)
