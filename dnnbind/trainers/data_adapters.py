"""Data adapters: what ``fit``/``evaluate``/``predict`` read, turned into batches on the model's device.

The trainer sees data only through this module:

* :func:`flatten_structure` turns the user's ``x``, ``y`` or ``sample_weight`` (one array, a
  list/tuple, or a dict keyed by input/output name) into a list in the model's input/output order;
  :func:`unpack_x_y_sample_weight` splits one batch (``x``, ``(x,)``, ``(x, y)`` or
  ``(x, y, sample_weight)``) as Keras 3 does; :func:`class_weight_to_sample_weights` turns Keras's
  ``class_weight`` dict into per-sample weights.
* An adapter has ``num_batches`` (None: unknown until the source runs out), ``batch_size`` (None:
  whatever the source yields), ``batches(rng, into=None)`` (one pass over the data: an iterator of
  ``(xs, ys)`` lists on the model's device; ``ys`` is None for predict) and ``on_epoch_end()``:

  - :class:`ArrayDataAdapter`: in-memory arrays (already checked by the trainer), shuffled per pass;
  - :class:`GeneratorDataAdapter`: a Python generator or iterator yielding batches (it cannot
    restart: a later pass continues it);
  - :class:`PyDatasetAdapter`: a :class:`dnnbind.utils.PyDataset` (``__len__``/``__getitem__``;
    ``workers > 1`` fetches batches ahead on threads; ``on_epoch_end`` after every epoch).

  The generator and PyDataset adapters take a ``prepare(raw_batch) -> (xs, ys)`` function from the
  trainer that checks one host batch and puts it in step form (labels prepared, sample weights
  appended to ``ys``).
* :class:`EpochIterator` applies Keras 3's ``steps_per_epoch`` / ``validation_steps`` / ``steps``
  rules on top of an adapter (see its docstring).

Devices. Host batches of generators, PyDatasets and large arrays reach the GPU through
:class:`Prefetcher`: while step ``k`` runs, batch ``k + 1`` is copied on a side stream from pinned
staging buffers into one of two device slots; the compute stream waits on an event before it uses a
batch, and a slot is overwritten only after the compute stream recorded that the step reading it
was queued. No host synchronisation anywhere. Arrays that use under half the free device memory
are uploaded once and batched on the device (``kernels.take`` with a permutation uploaded once per
pass); ``into(n, xs_dev, ys_dev)`` may then return static buffers (a graph step's inputs, lists
in the same order) that a shuffled batch of ``n`` rows is gathered straight into. On the NumPy
backend batches are the host arrays themselves (no copies).

Data parallelism (``shard=(rank, world_size)``, from ``dnnbind.distribution``): the array and
PyDataset adapters read only this rank's share of each pass, chosen by
:func:`dnnbind.distribution.planning.shard_order` from the pass's order (the same on every rank:
the same seed), padded by wrapping so every rank runs the same number of steps.

Sample weights travel as extra entries of ``ys`` (after the targets, one per output with a loss),
so a CUDA-graph step uploads them into a static buffer like ``x`` and ``y`` and reads them on the
device.
"""

from __future__ import annotations

import collections.abc
import types
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .. import _validate, backend, kernels
from ..backend import Device
from ..distribution.planning import shard_length, shard_order
from ..utils import PyDataset

__all__ = ["flatten_structure", "unpack_x_y_sample_weight", "class_weight_to_sample_weights", "data_kind",
           "ArrayDataAdapter", "GeneratorDataAdapter", "PyDatasetAdapter", "EpochIterator", "Prefetcher", "Batch"]

#: one batch: (inputs, targets or None), each a list of arrays in the model's order
Batch = tuple[list, "list | None"]

_RAN_OUT = ("Your input ran out of data; interrupting training. Make sure that your dataset or generator can "
            "generate at least `steps_per_epoch * epochs` batches")


def _is_arraylike_leaf(v: Any) -> bool:
    return hasattr(v, "shape") and np.ndim(v) > 0


def flatten_structure(data: Any, names: Sequence[str], owner: str, what: str) -> list:
    """``data`` as a list with one entry per name, in ``names`` order.

    One name: ``data`` itself (a list/tuple of one array is unwrapped, as Keras). Several names: a
    list/tuple of that length, or a dict with exactly those keys. Raises a ValueError naming
    ``owner`` and ``what`` (``"x"``, ``"y"``, ``"sample_weight"``) otherwise.
    """
    names = list(names)
    kind = "inputs" if what == "x" else "outputs"
    if isinstance(data, dict):
        missing = [n for n in names if n not in data]
        extra = sorted(set(data) - set(names))
        if missing or extra:
            raise ValueError(f"{owner}: {what} is a dict with keys {sorted(data)}, but the model's "
                             f"{kind} are named {names}"
                             f"{f' (missing {missing})' if missing else ''}{f' (unknown {extra})' if extra else ''}")
        return [data[n] for n in names]
    if len(names) == 1:
        if isinstance(data, (list, tuple)) and len(data) == 1 and _is_arraylike_leaf(data[0]):
            return [data[0]]
        return [data]
    if isinstance(data, (list, tuple)) and len(data) == len(names) and all(
            _is_arraylike_leaf(v) or isinstance(v, (list, tuple)) or v is None for v in data):
        return list(data)
    got = f"a {type(data).__name__} of {len(data)}" if isinstance(data, (list, tuple)) else type(data).__name__
    raise ValueError(f"{owner}: the model has {len(names)} {kind} {names}; "
                     f"{what} must be a list of {len(names)} arrays or a dict keyed by those names, got {got}")


def unpack_x_y_sample_weight(data: Any) -> tuple[Any, Any, Any]:
    """``(x, y, sample_weight)`` of one batch as Keras 3 reads it: ``x``, ``(x,)``, ``(x, y)`` or
    ``(x, y, sample_weight)`` (a list counts as a tuple); ValueError for a longer tuple."""
    if isinstance(data, list):
        data = tuple(data)
    if not isinstance(data, tuple):
        return data, None, None
    if len(data) == 1:
        return data[0], None, None
    if len(data) == 2:
        return data[0], data[1], None
    if len(data) == 3:
        return data[0], data[1], data[2]
    raise ValueError("Data is expected to be in format `x`, `(x,)`, `(x, y)`, or `(x, y, sample_weight)`, found "
                     f"a tuple of {len(data)}")


def class_weight_to_sample_weights(y: np.ndarray, class_weight: dict) -> np.ndarray:
    """Per-sample weights ``(N,)`` float32 from ``class_weight`` ``{class index: weight}`` (Keras 3).

    The class of a sample is its integer label, the arg-max of a one-hot/probability row, or the
    rounded value of a one-wide (binary) target; a class missing from the dict weighs 1.
    """
    y = np.asarray(y)
    if y.ndim > 1:
        y = np.argmax(y, axis=-1) if y.shape[-1] != 1 else np.squeeze(y, axis=-1)
    classes = np.round(y).astype(np.int64).reshape(len(y))
    out = np.ones(len(y), np.float32)
    for cls, weight in class_weight.items():
        out[classes == int(cls)] = weight
    return out


def data_kind(x: Any) -> str:
    """``"py_dataset"`` (a :class:`~dnnbind.utils.PyDataset`, or an object with ``__len__``,
    ``__getitem__`` and ``on_epoch_end`` such as ``keras.utils.PyDataset``), ``"generator"`` (a
    generator or any iterator) or ``"arrays"`` (everything else: arrays, lists/tuples/dicts of them)."""
    if isinstance(x, PyDataset) or (not isinstance(x, (np.ndarray, list, tuple, dict)) and hasattr(x, "__getitem__")
                                    and hasattr(x, "__len__") and callable(getattr(x, "on_epoch_end", None))):
        return "py_dataset"
    if isinstance(x, (types.GeneratorType, collections.abc.Iterator)) and not _is_arraylike_leaf(x):
        return "generator"
    return "arrays"


# ----- adapters ----------------------------------------------------------------------------------------
class ArrayDataAdapter:
    """In-memory arrays ``xs`` (and ``ys``: targets, then sample weights), all with the same number of
    samples, in batches of ``batch_size`` (the last one smaller).

    ``shuffle``: a new order from ``rng`` at every :meth:`batches` call (one per pass).
    ``shard``: ``(rank, world_size)``: only this rank's samples of each pass' order (see the module).
    """

    def __init__(self, xs: list[np.ndarray], ys: "list[np.ndarray] | None", batch_size: int, *, shuffle: bool,
                 device: Device, shard: "tuple[int, int] | None" = None) -> None:
        self.xs = list(xs)
        self.ys = None if ys is None else list(ys)
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.device = device
        self.shard = shard
        self.num_samples = len(self.xs[0]) if shard is None else shard_length(len(self.xs[0]), shard[1])
        self.num_batches = -(-self.num_samples // self.batch_size)
        self._device_data = self._upload_if_small()

    def _upload_if_small(self) -> "dict | None":
        """The whole dataset on the device when it uses under half the free memory (else None: stream)."""
        dev = self.device
        if not dev.is_cuda:
            return None
        from .. import cuda  # deferred: importing dnnbind.cuda loads cuda.bindings, needed only here

        free, _ = cuda.memory_info(dev.index)
        nbytes = sum(a.nbytes for a in self.xs) + sum(a.nbytes for a in (self.ys or []))
        if nbytes >= 0.5 * free:
            return None
        up = [backend.asarray(a, device=dev) for a in self.xs]
        return {"x": up, "y": None if self.ys is None else [backend.asarray(a, device=dev) for a in self.ys]}

    def on_epoch_end(self) -> None:
        pass

    def _host_batches(self, order: "np.ndarray | None") -> Iterator[Batch]:
        n, bs = self.num_samples, self.batch_size
        for start in range(0, n, bs):
            sel = slice(start, start + bs) if order is None else order[start:start + bs]
            yield [a[sel] for a in self.xs], (None if self.ys is None else [a[sel] for a in self.ys])

    def batches(self, rng: np.random.Generator, into: "Callable[[int, list, list | None], Any] | None" = None
                ) -> Iterator[Batch]:
        total = len(self.xs[0])
        order = rng.permutation(total) if self.shuffle else None
        if self.shard is not None:
            order = shard_order(total if order is None else order, *self.shard)
        if not self.device.is_cuda:
            return self._host_batches(order)
        if self._device_data is not None:
            return self._device_batches(order, into)
        return Prefetcher(self.device)(self._host_batches(order))

    def _device_batches(self, order: "np.ndarray | None", into: Any) -> Iterator[Batch]:
        x_dev, y_dev = self._device_data["x"], self._device_data["y"]
        n, bs = self.num_samples, self.batch_size
        # one upload of the permutation per pass; batches are gathered on the device
        order_dev = None if order is None else backend.asarray(order.astype(np.int64), device=self.device)
        for start in range(0, n, bs):
            stop = min(start + bs, n)
            if order_dev is None:
                yield [a[start:stop] for a in x_dev], (None if y_dev is None else [a[start:stop] for a in y_dev])
                continue
            idx = order_dev[start:stop]
            dst = into(stop - start, x_dev, y_dev) if into is not None else None
            if dst is not None:
                yield ([kernels.take(a, idx, out=o) for a, o in zip(x_dev, dst[0])],
                       None if y_dev is None else [kernels.take(a, idx, out=o) for a, o in zip(y_dev, dst[1])])
            else:
                yield [kernels.take(a, idx) for a in x_dev], (None if y_dev is None else [kernels.take(a, idx) for a in y_dev])


class GeneratorDataAdapter:
    """Batches from a Python generator or iterator, each checked and put in step form by ``prepare``.

    A generator cannot restart: every :meth:`batches` call continues the same one (an iterable that
    is not an iterator is iterated anew). ``num_batches`` is ``len(source)`` when it has one, else
    None (the :class:`EpochIterator` learns it when the source runs out).
    """

    batch_size = None

    def __init__(self, source: Any, prepare: Callable[[Any], Batch], *, device: Device) -> None:
        self.source = source
        self.prepare = prepare
        self.device = device
        try:
            self.num_batches: "int | None" = len(source)
        except TypeError:
            self.num_batches = None

    def on_epoch_end(self) -> None:
        pass

    def batches(self, rng: np.random.Generator, into: Any = None) -> Iterator[Batch]:
        return _to_device(map(self.prepare, iter(self.source)), self.device)


class PyDatasetAdapter:
    """Batches ``dataset[i]`` of a :class:`~dnnbind.utils.PyDataset`, ``i`` in ``range(len(dataset))``
    (shuffled per pass when ``shuffle``, as Keras 3), each checked and put in step form by ``prepare``.

    ``workers > 1``: up to ``max_queue_size`` batches are fetched ahead by a pool of that many
    threads (in order of use). ``use_multiprocessing=True`` raises NotImplementedError.
    ``shard``: ``(rank, world_size)``: this rank's batch indices of each pass (each batch is one
    replica's batch).
    """

    batch_size = None

    def __init__(self, dataset: Any, prepare: Callable[[Any], Batch], *, shuffle: bool, device: Device,
                 owner: str = "fit", shard: "tuple[int, int] | None" = None) -> None:
        workers = int(getattr(dataset, "workers", 1) or 1)
        if getattr(dataset, "use_multiprocessing", False):
            raise NotImplementedError(f"{owner}: PyDataset(use_multiprocessing=True) is not supported; use "
                                      f"workers={max(workers, 2)} without it (threads fetch the batches)")
        if workers < 1:
            raise ValueError(f"{owner}: PyDataset workers must be >= 1, got {workers}")
        self.dataset = dataset
        self.prepare = prepare
        self.shuffle = bool(shuffle)
        self.device = device
        self.workers = workers
        self.max_queue_size = max(int(getattr(dataset, "max_queue_size", 10) or 10), 1)
        self.num_batches = _py_dataset_length(dataset, owner)
        # sharded: this rank reads these many of the dataset's batches per pass (see the module)
        self.shard = shard
        self._total_batches = self.num_batches
        if shard is not None:
            self.num_batches = shard_length(self.num_batches, shard[1])

    def on_epoch_begin(self) -> None:
        begin = getattr(self.dataset, "on_epoch_begin", None)
        if callable(begin):
            begin()

    def on_epoch_end(self) -> None:
        self.dataset.on_epoch_end()

    def _raw_batches(self, order: Sequence[int]) -> Iterator[Any]:
        if self.workers == 1:
            for i in order:
                yield self.dataset[int(i)]
            return
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="dnnbind-pydataset")
        try:
            pending: collections.deque = collections.deque()
            ahead = iter(order)
            for i in ahead:
                pending.append(pool.submit(self.dataset.__getitem__, int(i)))
                if len(pending) >= self.max_queue_size:
                    break
            while pending:
                batch = pending.popleft().result()
                for i in ahead:
                    pending.append(pool.submit(self.dataset.__getitem__, int(i)))
                    break
                yield batch
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def batches(self, rng: np.random.Generator, into: Any = None) -> Iterator[Batch]:
        order = np.arange(self._total_batches)
        if self.shuffle:
            order = rng.permutation(self._total_batches)
        if self.shard is not None:
            order = shard_order(order, *self.shard)
        return _to_device(map(self.prepare, self._raw_batches(order)), self.device)


def _py_dataset_length(dataset: Any, owner: str) -> int:
    name = type(dataset).__name__
    length = getattr(type(dataset), "__len__", None)
    try:
        n = length(dataset) if length is not None else None
    except NotImplementedError:
        n = None
    if n is None:
        raise ValueError(f"{owner}: a PyDataset must define __len__ (the number of batches per epoch), "
                         f"{name} does not")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise _validate.ArgumentTypeError(f"{owner}: {name}.__len__() must return the number of batches per epoch "
                                          f"as an int, got {n!r} ({type(n).__name__}); return an int, e.g. "
                                          "math.ceil(samples / batch_size)")
    if n < 0:
        raise ValueError(f"{owner}: {name}.__len__() must return the number of batches per epoch, >= 0, got {n}")
    return int(n)


def _to_device(host: Iterator[Batch], device: Device) -> Iterator[Batch]:
    return Prefetcher(device)(host) if device.is_cuda else host


# ----- epochs and steps --------------------------------------------------------------------------------
class EpochIterator:
    """Keras 3's epoch rules over an adapter.

    * ``steps`` None: each epoch is one full pass (a source without a length runs until it is
      exhausted; its length is then known, so a generator that cannot restart *runs out* in the
      next epoch).
    * ``steps`` given: each epoch takes ``steps`` batches, continuing the same pass across epochs
      (epoch 2 of arrays with ``steps_per_epoch=2`` sees batches 3 and 4) and starting a new pass
      once a pass of known length is used up.
    * A pass of known length used up before ``steps`` batches ends the epoch early with Keras's
      warning; the next epoch starts a new pass. A source that ends by itself before its steps (a
      generator, in any epoch after its first full pass) *runs out*: the warning, ``ran_out`` is
      set and ``fit`` stops training after that epoch.

    ``full(xs)``: whether a batch has the source's full number of rows (the batch size, or the
    first batch's rows for a generator): other batches run eagerly so step graphs stay keyed by
    static shapes. Call ``on_epoch_end()`` after each epoch and ``close()`` at the end.
    """

    def __init__(self, adapter: Any, steps: "int | None" = None) -> None:
        self.adapter = adapter
        self.steps = steps
        self.num_batches = adapter.num_batches
        self.batch_rows = adapter.batch_size
        self.ran_out = False
        self._current: "Iterator[Batch] | None" = None
        self._seen = 0

    @property
    def steps_per_epoch(self) -> "int | None":
        """What the progress bar shows as the target (None: unknown)."""
        if self.steps is not None and self.num_batches is not None:
            return min(self.steps, self.num_batches)
        return self.steps if self.steps is not None else self.num_batches

    def full(self, xs: list) -> bool:
        rows = int(xs[0].shape[0])
        if self.batch_rows is None:
            self.batch_rows = rows
        return rows == self.batch_rows

    def _ran_out(self, stop: bool) -> None:
        self.ran_out = stop
        self._current = None
        # frames: this, epoch(), the loop in dnnbind.trainers.loops, the Trainer method, its caller
        warnings.warn(f"{_RAN_OUT} (here {self.steps_per_epoch} per epoch).", UserWarning, stacklevel=5)

    def epoch(self, rng: np.random.Generator, into: Any = None) -> Iterator[Batch]:
        """The batches of one epoch."""
        self.ran_out = False
        begin = getattr(self.adapter, "on_epoch_begin", None)
        if begin is not None:
            begin()
        steps = self.steps if self.steps is not None else self.num_batches
        if steps is None:  # unknown length: one pass, until the source ends
            count = 0
            for batch in self.adapter.batches(rng, into):
                count += 1
                yield batch
            self.num_batches = count
            return
        if self._current is None or self.steps is None:
            self._current = iter(self.adapter.batches(rng, into))
            self._seen = 0
        for _ in range(steps):
            if self.num_batches is not None and self._seen >= self.num_batches:
                if self.steps is not None:
                    self._ran_out(stop=False)
                break
            try:
                batch = next(self._current)
            except StopIteration:
                if self.num_batches is None:
                    self.num_batches = self._seen
                self._ran_out(stop=True)
                break
            self._seen += 1
            yield batch
        if self.num_batches is not None and self._seen >= self.num_batches:
            self._current = None  # the next epoch starts a new pass

    def on_epoch_end(self) -> None:
        self.adapter.on_epoch_end()

    def close(self) -> None:
        """Stop a pass left unfinished (its prefetch slots and worker threads are released)."""
        current, self._current = self._current, None
        close = getattr(current, "close", None)
        if close is not None:
            close()


# ----- host-to-device prefetch -------------------------------------------------------------------------
class _CudaTransfer:
    """The CUDA side of :class:`Prefetcher`: the compute stream (current when the pass starts), a
    copy stream, events, and uploads into device slots through pinned staging buffers."""

    def __init__(self, device: Device) -> None:
        from .. import cuda  # deferred: importing dnnbind.cuda loads cuda.bindings, needed only on CUDA

        self._cuda = cuda
        self.index = device.index
        self.main = cuda.current_stream(device.index)
        self.side = cuda.Stream(device.index)

    def upload(self, slot: "list | None", host: list) -> list:
        """Copy ``host`` arrays into ``slot``'s device buffers on the copy stream.

        Buffers are made (where a slot is new or its shapes changed) on the *compute* stream, so that
        their stream-ordered frees, whenever the last reference goes, follow every step that read
        them; the copy stream then waits for the allocation once. ``DeviceArray.copy_from_host``
        stages through the pinned pool, which reuses a staging buffer only after its copy's event
        completed."""
        host = [np.asarray(h) for h in host]
        out = [slot[i] if slot is not None and i < len(slot) else None for i in range(len(host))]
        fresh = False
        for i, h in enumerate(host):
            if out[i] is None or tuple(out[i].shape) != h.shape or out[i].dtype != h.dtype:
                out[i] = self._cuda.empty(h.shape, h.dtype, stream=self.main)
                fresh = True
        if fresh:
            self.side.wait_event(self.record(True))
        for dst, h in zip(out, host):
            dst.copy_from_host(h, stream=self.side)
        return out

    def record(self, on_main: bool, event: Any = None) -> Any:
        """Record ``event`` (None: a new one) on the compute or the copy stream; returns it. Re-recording is
        safe once every wait on its previous record is queued (a stream wait binds the record it sees)."""
        if event is None:
            event = self._cuda.Event(timing=False, device=self.index)
        return event.record(self.main if on_main else self.side)

    def wait(self, on_main: bool, event: Any) -> None:
        (self.main if on_main else self.side).wait_event(event)

    def close(self) -> None:
        """Nothing to wait for: the compute stream waited for every copy before its batch was used."""


class Prefetcher:
    """Host batches in, device batches out, with batch ``k + 1`` copied while step ``k`` runs.

    Two device slots alternate. For batch ``k`` (slot ``k % 2``): the copy stream first waits for
    the event the compute stream recorded after queueing step ``k - 2`` (the last reader of that
    slot), copies the batch in through pinned staging buffers and records ``ready[k]``; the compute
    stream waits for ``ready[k]`` before the batch is handed out (so every copy is waited for by
    the compute stream, also when the consumer stops early). The next host batch is produced
    and its copy queued only after the consumer queued step ``k``, so the host work and the copy of
    batch ``k + 1`` overlap step ``k`` on the GPU. Nothing waits on the host.

    Three events serve a whole pass (the copy stream's "ready" one, and one "released" per slot), each
    re-recorded after the waits on its previous record were queued.

    ``transfer`` (tests substitute a fake): ``upload(slot, host) -> device arrays``,
    ``record(on_main, event=None) -> event`` (re-records ``event`` when given), ``wait(on_main, event)``,
    ``close()``.
    """

    SLOTS = 2

    def __init__(self, device: Device, transfer: Any = None) -> None:
        self.device = device
        self.transfer = transfer

    def __call__(self, host: Iterator[Batch]) -> Iterator[Batch]:
        t = self.transfer if self.transfer is not None else _CudaTransfer(self.device)
        slots: list = [None] * self.SLOTS          # per slot: (xs, ys) device arrays
        released: list = [None] * self.SLOTS       # per slot: event after the step that read it was queued

        def upload(k: int, batch: Batch) -> Batch:
            s = k % self.SLOTS
            if released[s] is not None:
                t.wait(False, released[s])
            old = slots[s]
            xs, ys = batch
            dx = t.upload(None if old is None else old[0], xs)
            dy = None if ys is None else t.upload(None if old is None or old[1] is None else old[1], ys)
            slots[s] = (dx, dy)
            return dx, dy

        try:
            k, ready = 0, None
            for batch in host:
                dev = upload(k, batch)
                ready = t.record(False, ready)
                t.wait(True, ready)
                yield dev
                released[k % self.SLOTS] = t.record(True, released[k % self.SLOTS])
                k += 1
        finally:
            t.close()
