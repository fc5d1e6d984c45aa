"""An in-memory stand-in for the part of ``tf.data.Dataset`` the keras.io vision examples call, so a
port keeps their pipeline lines: ``Dataset.from_tensor_slices(data).shuffle(n).batch(b).map(fn)``,
``Dataset.zip((a, b))``, ``prefetch``, ``take``, iteration.

A batched dataset is a :class:`dnnbind.utils.PyDataset` that ``fit``/``evaluate`` read batch by batch;
``map`` applies its function to every batch when it is read (every epoch, as ``tf.data`` does), and
``shuffle`` draws a new order of the samples after every epoch (``reshuffle_each_iteration``), from a
seed fixed at the call (``seed``, or the next of a module-level counter: the same pipeline built in the
same order shuffles the same way).
"""

from __future__ import annotations

import itertools

import numpy as np

import dnnbind as keras

__all__ = ["Dataset", "AUTOTUNE"]

AUTOTUNE = None  # no parallel calls to tune here
_seeds = itertools.count(1)


class Dataset(keras.utils.PyDataset):
    def __init__(self, data=None, batch_size=None, seed=None, parts=None, fn=None):
        super().__init__()
        self.data, self.batch_size, self.seed, self.parts, self.fn = data, batch_size, seed, parts, fn
        n = len(parts[0].order) if parts is not None else len(data[0])
        self._rng = np.random.default_rng(seed) if seed is not None else None
        self.order = self._rng.permutation(n) if self._rng is not None else np.arange(n)

    @staticmethod
    def from_tensor_slices(data):
        return Dataset(tuple(np.asarray(a) for a in data))

    @staticmethod
    def zip(parts):
        return Dataset(batch_size=parts[0].batch_size, parts=tuple(parts))

    def shuffle(self, buffer_size, seed=None):
        return Dataset(self.data, self.batch_size, next(_seeds) if seed is None else seed, self.parts, self.fn)

    def batch(self, batch_size):
        return Dataset(self.data, batch_size, self.seed, self.parts, self.fn)

    def map(self, fn, num_parallel_calls=None):
        previous = self.fn
        mapped = fn if previous is None else (lambda *item: fn(*previous(*item)))
        return Dataset(self.data, self.batch_size, self.seed, self.parts, mapped)

    def prefetch(self, buffer_size):
        return self

    def take(self, n):
        return [self[i] for i in range(min(n, len(self)))]

    def __len__(self):
        if self.batch_size is None:
            raise TypeError("an unbatched Dataset stand-in has no batches: call .batch(batch_size) first")
        return -(-len(self.order) // self.batch_size)

    def __getitem__(self, i):
        if not 0 <= i < len(self):
            raise IndexError(i)
        if self.parts is not None:
            item = tuple(p[i] for p in self.parts)
        else:
            rows = self.order[i * self.batch_size:(i + 1) * self.batch_size]
            item = tuple(a[rows] for a in self.data)
        return self.fn(*item) if self.fn is not None else item

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def on_epoch_end(self):
        if self.parts is not None:
            for p in self.parts:
                p.on_epoch_end()
        elif self._rng is not None:
            self.order = self._rng.permutation(len(self.order))
