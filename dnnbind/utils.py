"""Small utilities with Keras names: ``to_categorical``, ``set_random_seed``; dnnbind's seed generator.

Seeding (as Keras 3): :func:`set_random_seed` seeds Python's ``random``, NumPy's global generator
and dnnbind's own global seed generator. Everything random that is given no seed draws one from
that generator with :func:`draw_seed`: an initialiser when it is created, a ``Dropout`` layer when
it is created, an ``kernels.DropoutState`` (hence the cuDNN dropout states) when it is created,
``kernels.random_crop_flip`` per call, and ``fit`` per call for its shuffling. So
``set_random_seed(1)``, build and fit model A, ``set_random_seed(1)``, build and fit model B gives
identical weights when the same draws happen in the same order (with
``kernels.config.deterministic = True`` on the GPU), while two models built without re-seeding differ.
Until :func:`set_random_seed` is called the generator starts from fresh OS entropy.

This module is a shared leaf (it imports only the standard library and NumPy), so that ``ops``,
``initializers``, ``layers`` and ``models`` can all draw from the one generator. The rest of Keras's
``keras.utils`` names live in the rooms that own them and are looked up on first use (module
``__getattr__``, :data:`_LAZY`), so importing this module imports nothing above it.
"""

from __future__ import annotations

import random
import threading

import numpy as np

# keras.utils names that other rooms own: name -> (module, attribute), imported on first use
_LAZY = {
    "CustomObjectScope": ("dnnbind._keras_objects", "CustomObjectScope"),
    "custom_object_scope": ("dnnbind._keras_objects", "custom_object_scope"),
    "get_custom_objects": ("dnnbind._keras_objects", "get_custom_objects"),
    "get_registered_name": ("dnnbind._keras_objects", "get_registered_name"),
    "get_registered_object": ("dnnbind._keras_objects", "get_registered_object"),
    "register_keras_serializable": ("dnnbind._keras_objects", "register_keras_serializable"),
    "serialize_keras_object": ("dnnbind.serialization_lib", "serialize_keras_object"),
    "deserialize_keras_object": ("dnnbind.serialization_lib", "deserialize_keras_object"),
    "clear_session": ("dnnbind.backend", "clear_session"),
    "is_keras_tensor": ("dnnbind.backend", "is_keras_tensor"),
    "standardize_dtype": ("dnnbind.backend", "standardize_dtype"),
    "disable_interactive_logging": ("dnnbind.config", "disable_interactive_logging"),
    "enable_interactive_logging": ("dnnbind.config", "enable_interactive_logging"),
    "is_interactive_logging_enabled": ("dnnbind.config", "is_interactive_logging_enabled"),
    "Progbar": ("dnnbind.callbacks", "Progbar"),
    "pad_sequences": ("dnnbind.data_utils", "pad_sequences"),
    "normalize": ("dnnbind.data_utils", "normalize"),
    "pack_x_y_sample_weight": ("dnnbind.data_utils", "pack_x_y_sample_weight"),
    "unpack_x_y_sample_weight": ("dnnbind.data_utils", "unpack_x_y_sample_weight"),
    "split_dataset": ("dnnbind.data_utils", "split_dataset"),
    "timeseries_dataset_from_array": ("dnnbind.data_utils", "timeseries_dataset_from_array"),
    "Config": ("dnnbind.data_utils", "Config"),
    "get_file": ("dnnbind.file_utils", "get_file"),
    "img_to_array": ("dnnbind.image_utils", "img_to_array"),
    "array_to_img": ("dnnbind.image_utils", "array_to_img"),
    "load_img": ("dnnbind.image_utils", "load_img"),
    "save_img": ("dnnbind.image_utils", "save_img"),
    "get_source_inputs": ("dnnbind.layer_utils", "get_source_inputs"),
    "legacy": ("dnnbind.legacy", "saving"),
    "model_to_dot": ("dnnbind.model_visualization", "model_to_dot"),
    "plot_model": ("dnnbind.model_visualization", "plot_model"),
    "image_dataset_from_directory": ("dnnbind.directory_datasets", "image_dataset_from_directory"),
    "text_dataset_from_directory": ("dnnbind.directory_datasets", "text_dataset_from_directory"),
    "audio_dataset_from_directory": ("dnnbind.directory_datasets", "audio_dataset_from_directory"),
}

__all__ = ["to_categorical", "set_random_seed", "draw_seed", "PyDataset", "Sequence", *sorted(_LAZY)]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib  # (deferred: only the lazy names need it)
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dnnbind.utils' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

_SEED_LIMIT = 2**32  # what np.random.seed accepts
_seed_lock = threading.Lock()
_seed_generator = np.random.default_rng()  # fresh entropy until set_random_seed
_seed_epoch = 0  # set_random_seed calls so far: dnnbind.random remakes its global SeedGenerator when it moves


def to_categorical(y, num_classes: int | None = None, dtype="float32") -> np.ndarray:
    """One-hot encode integer class labels (any shape; a trailing axis of 1 is dropped, as Keras).

    >>> to_categorical([0, 2], 3)
    array([[1., 0., 0.],
           [0., 0., 1.]], dtype=float32)
    """
    y = np.asarray(y)
    if y.dtype.kind not in "iub":
        if y.dtype.kind == "f" and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
            y = y.astype(np.int64)
        else:
            raise ValueError(f"to_categorical: labels must be integers, got dtype {y.dtype}")
    y = y.astype(np.int64)
    if y.ndim > 1 and y.shape[-1] == 1:
        y = y.reshape(y.shape[:-1])
    if y.size and y.min() < 0:
        raise ValueError(f"to_categorical: labels must be >= 0, got {int(y.min())}")
    if num_classes is None:
        num_classes = int(y.max()) + 1 if y.size else 0
    elif y.size and int(y.max()) >= num_classes:
        raise ValueError(f"to_categorical: label {int(y.max())} is out of range for num_classes={num_classes}")
    out = np.zeros(y.shape + (num_classes,), dtype=dtype)
    flat = out.reshape(-1, num_classes)
    flat[np.arange(y.size), y.reshape(-1)] = 1
    return out


def set_random_seed(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and dnnbind's seed generator (Keras 3).

    After it, every seed that dnnbind draws for an unseeded initialiser, dropout layer or state,
    ``random_crop_flip`` call or ``fit`` shuffle comes from a stream fixed by ``seed``
    (see the module docstring), and so does ``keras.random``'s global ``SeedGenerator`` (what
    ``keras.random.normal(shape)`` and the others use without a seed), which is made anew.
    ``seed``: an int in ``[0, 2**32)``.
    """
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"set_random_seed: seed must be an int, got {type(seed).__name__} {seed!r}")
    seed = int(seed)
    if not 0 <= seed < _SEED_LIMIT:
        raise ValueError(f"set_random_seed: seed must be in [0, 2**32), got {seed}")
    global _seed_generator, _seed_epoch
    random.seed(seed)
    np.random.seed(seed)
    with _seed_lock:
        # its own stream (a PCG64 from the seed), distinct from NumPy's global MT19937 one
        _seed_generator = np.random.default_rng(seed)
        _seed_epoch += 1


def seed_epoch() -> int:
    """How many times :func:`set_random_seed` has run: ``keras.random``'s global ``SeedGenerator`` is made
    anew (its seed drawn with :func:`draw_seed`) on its first use after this changes, as Keras resets
    its global seed generator in ``set_random_seed``."""
    return _seed_epoch


def draw_seed() -> int:
    """The next seed (an int in ``[0, 2**63)``) of dnnbind's global seed generator (thread-safe).

    What an unseeded initialiser, dropout layer/state, ``random_crop_flip`` or ``fit`` uses, so
    that :func:`set_random_seed` makes them reproducible.
    """
    with _seed_lock:
        return int(_seed_generator.integers(0, 2**63))


class PyDataset:
    """Base class for a dataset of batches that ``fit``/``evaluate``/``predict`` read (Keras 3's
    ``keras.utils.PyDataset``; ``Sequence`` is the same class, as Keras keeps it).

    Subclass it and define ``__len__`` (the number of batches per epoch) and ``__getitem__(index)``
    returning one batch: ``x``, ``(x, y)`` or ``(x, y, sample_weight)`` as NumPy arrays (lists or
    dicts of them for several inputs/outputs), the first axis the batch. ``on_epoch_end()`` is
    called after every epoch (reshuffle there); ``on_epoch_begin()`` before it.

    Args:
        workers: the number of threads that fetch batches ahead (1: in the training loop itself).
        use_multiprocessing: accepted for Keras compatibility; True raises NotImplementedError when
            the dataset is used (threads only).
        max_queue_size: with ``workers > 1``, how many batches may be fetched ahead.

    ``fit(shuffle=True)`` visits the batch indices in a new random order every epoch, as Keras 3.
    """

    def __init__(self, workers: int = 1, use_multiprocessing: bool = False, max_queue_size: int = 10) -> None:
        if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
            raise ValueError(f"PyDataset: workers must be an int >= 1, got {workers!r}")
        if isinstance(max_queue_size, bool) or not isinstance(max_queue_size, (int, np.integer)) or max_queue_size < 1:
            raise ValueError(f"PyDataset: max_queue_size must be an int >= 1, got {max_queue_size!r}")
        self._workers = int(workers)
        self._use_multiprocessing = bool(use_multiprocessing)
        self._max_queue_size = int(max_queue_size)

    # a subclass that forgets super().__init__() still works with the defaults
    @property
    def workers(self) -> int:
        return self.__dict__.get("_workers", 1)

    @workers.setter
    def workers(self, value: int) -> None:
        self._workers = int(value)

    @property
    def use_multiprocessing(self) -> bool:
        return self.__dict__.get("_use_multiprocessing", False)

    @use_multiprocessing.setter
    def use_multiprocessing(self, value: bool) -> None:
        self._use_multiprocessing = bool(value)

    @property
    def max_queue_size(self) -> int:
        return self.__dict__.get("_max_queue_size", 10)

    @max_queue_size.setter
    def max_queue_size(self, value: int) -> None:
        self._max_queue_size = int(value)

    def __getitem__(self, index: int):
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__(index) returning one batch")

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define __len__() (the number of batches)")

    @property
    def num_batches(self) -> int:
        return len(self)

    def on_epoch_begin(self) -> None:
        """Called before every epoch."""

    def on_epoch_end(self) -> None:
        """Called after every epoch."""


#: Keras keeps the old name ``keras.utils.Sequence`` as an alias of ``PyDataset``.
Sequence = PyDataset
