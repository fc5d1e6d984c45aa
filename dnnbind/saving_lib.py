"""The file formats behind :mod:`dnnbind.saving` (Keras 3 keeps the same in ``saving/saving_lib.py``):
safetensors (native) and Keras 3's own files, whole models as a zip or a directory. No pickle.

This room sits below the model classes: :mod:`dnnbind.models` calls it (``Model.save``, the weight
budget of ``from_config``) and hands :func:`load_model` the function that builds a model from its
config. Crash-safe writing itself is :mod:`dnnbind._files`.

* ``save_weights(model, path)`` / ``load_weights``: one file. A name ending in ``.weights.h5`` gets
  Keras 3's HDF5 weights file (h5py, ``pip install 'dnnbind[keras]'``); any other name safetensors.
  Both key the weights by position, as Keras 3 does (:func:`dnnbind.keras_format.variable_paths`):
  ``layers/conv2d/vars/0`` is the kernel of the model's first Conv2D, whatever the layer's name, so
  identical models read each other's files. Tensors are in Keras layouts. ``load_weights`` tells the
  format from the contents (safetensors, HDF5, or the weights inside a ``.keras``/``.dnnbind`` zip);
  dnnbind 0.1's safetensors files, keyed ``"<layer name>/<weight name>"``, are still matched by name.
* ``save_model(model, path)`` / ``load_model(path)``: ``.keras`` is a real Keras 3 model file
  (``config.json`` in Keras's JSON, ``metadata.json``, ``model.weights.h5``; the compile config but no
  optimizer state) that ``keras.saving.load_model`` reads, and dnnbind reads Keras's; ``.dnnbind``
  (or ``.zip``) is dnnbind's zip holding ``config.json`` (the model and layer configs, the compile
  config), ``model.safetensors`` and, when the model has an optimizer with state,
  ``optimizer.safetensors`` (to resume training). Any other path is a directory (below).
* Names that promise a format this module does not write are refused with a message saying what to
  use: ``.h5``/``.hdf5`` (Keras 2's HDF5), ``.keras`` for ``save_weights``, ``.weights.h5`` for ``save``.

Crash safety (a ``kill -9`` or a power cut at any moment leaves the old or the new checkpoint,
whole, never a mix):

* A single file (weights, zip) is written to a temporary file beside it, fsynced, renamed over the
  target (``os.replace``) and the directory fsynced. Temporaries are named
  ``.<target name>.tmp-<pid>-<random>``; each save first removes the temporaries of its target
  left by processes that no longer exist (never those of a live process). The replaced file's mode
  is kept; a new file gets ``0666 & ~umask``, as ``open()`` gives.
* A directory holds one file per part under a per-save name (``model.<16 hex>.safetensors``,
  ``config.<16 hex>.json``, ``optimizer.<16 hex>.safetensors``) and ``manifest.json``::

      {"format": "dnnbind.checkpoint", "format_version": 1, "generation": 3,
       "files": {"model.safetensors": {"file": "model.9f3c...e1.safetensors", "size": 1234,
                                       "sha256": "..."}, "config.json": {...}, ...}}

  A save writes and fsyncs the new parts, then replaces ``manifest.json`` atomically (the switch),
  then deletes the parts the new manifest does not name (older saves, saves killed half-way, the
  plain ``config.json``/``model.safetensors``/``optimizer.safetensors`` of the earlier layout); the
  parts of saves killed before their switch go already at the start of the next save. A
  load checks every part's size and SHA-256 against the manifest before using any of them. Saves
  hold an exclusive ``flock`` on the directory and loads a shared one, so a concurrent save never
  deletes what a load is reading. A directory without ``manifest.json`` (written by dnnbind 0.1's
  first layout) is still read, unchecked.

Untrusted files: everything read is checked before it drives an allocation. Every file, zip member,
HDF5 dataset and JSON document is read through one :class:`dnnbind._bounded.BoundedReader`, within
:class:`ReadLimits` (sizes, total, compression ratio, JSON size and depth; ``limits=`` of
:func:`load_model`/:func:`load_weights`, or the ``DNNBIND_READ_*`` environment), which stops at the
first limit passed while it reads (:class:`ReadLimitError`); a model config goes through the layers'
constructors (which check their arguments) and its weights are sized from the config alone
(:func:`check_weight_budget`) before any is created; tensors must be float (float16, bfloat16 and
float64 are cast to the variable dtype) with the right shape, a quantized layer's within its
quantizer's range; tensors the model does not use are named in a warning. Loading is all-or-nothing:
every tensor (and the optimizer state) is checked before the first is assigned. Like a save, a load
of a checkpoint directory removes the parts killed saves left (the directory's lock shows nobody is
writing), and a load of a zip the temporaries of dead writers.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import hashlib
import inspect
import io
import json
import math
import os
import re
import secrets
import warnings
import zipfile
from typing import Any, Callable, Sequence

import numpy as np

from . import __version__, keras_format
from ._bounded import BoundedReader, ReadLimits, declared_nbytes, physical_memory
from ._files import (atomic_write, create_exclusive, directory_lock, existing_mode, fsync_directory,
                     remove_stale_temporaries, target_error)
from ._validate import normalize_dtype
from .errors import AllocationTooLargeError, DnnbindError, ReadLimitError
from .layers.base import Layer, Weight
from .layers.graph import InputLayer, KerasTensor

__all__ = ["save_weights", "load_weights", "save_model", "load_model", "SavingError", "ReadLimits", "ReadLimitError",
           "check_weight_budget"]

# Builds a model from a saved config: ``build({"class_name": ..., "config": ...}, max_weight_bytes=...)``.
# dnnbind.models passes its model_from_config: this room sits below the model classes.
ModelBuilder = Callable[..., Any]

_FORMAT = "dnnbind.model"
_FORMAT_VERSION = 2  # 2: weights keyed by position (layers/<class>/vars/<i>), as Keras 3
_ZIP_SUFFIXES = (".dnnbind", ".zip")
_KERAS_SUFFIX = ".keras"
_KERAS_WEIGHTS_SUFFIX = ".weights.h5"
_LEGACY_H5_SUFFIXES = (".h5", ".hdf5")
_KERAS_WEIGHTS_MEMBER = "model.weights.h5"
_KERAS_MEMBERS = ("config.json", "metadata.json", _KERAS_WEIGHTS_MEMBER)
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"

_MANIFEST = "manifest.json"
_CHECKPOINT_FORMAT = "dnnbind.checkpoint"
_CHECKPOINT_VERSION = 1
_PARTS = ("config.json", "model.safetensors", "optimizer.safetensors")
_PART_FILE = re.compile(r"^(config|model|optimizer)\.[0-9a-f]{16}\.(json|safetensors)$")
_MANIFEST_MAX_BYTES = 1 << 20

# safetensors dtype names -> NumPy; BF16 needs ml_dtypes (safetensors.numpy cannot read it)
_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                       "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
                       "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool"}
_FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
_ADD_WEIGHT = inspect.signature(Layer._add_weight)  # how check_weight_budget reads a build's requests


class SavingError(DnnbindError):
    """A saved file is missing, corrupt, or does not fit the model."""


# ----- safetensors ------------------------------------------------------------------------------
def _safetensors_bytes(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> bytes:
    from safetensors.numpy import save

    # reshape: np.ascontiguousarray makes a 0-d array (Normalization's count) 1-d
    return save({k: np.ascontiguousarray(v).reshape(np.shape(v)) for k, v in tensors.items()}, metadata=metadata)


def _safetensors_load(data: bytes, what: str) -> dict[str, np.ndarray]:
    """Parse safetensors bytes (the header is checked by safetensors itself: offsets, sizes)."""
    from safetensors import deserialize

    try:
        flat = deserialize(data)
    except Exception as exc:  # safetensors raises its own SafetensorError / ValueError on bad bytes
        raise SavingError(f"{what} is not a valid safetensors file (corrupt or truncated?): {exc}") from None
    tensors = {}
    for name, info in flat:
        dtype_name = _SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype_name is None:
            raise SavingError(f"{what}: tensor '{name}' has dtype {info['dtype']}, which dnnbind cannot read; "
                              f"expected one of {', '.join(_SAFETENSORS_DTYPES)}")
        tensors[name] = np.frombuffer(info["data"], dtype=normalize_dtype(dtype_name)).reshape(info["shape"])
    return tensors


def _weight_entries(model, what: str) -> list[tuple[str, Weight, Any]]:
    """``(key, weight, layer)`` in Keras 3's positional scheme (``layers/conv2d/vars/0``), model order."""
    model._require_built(what)
    return [(f"{path}/vars/{i}", w, layer)
            for path, layer, weights in keras_format.variable_paths(model) for i, w in enumerate(weights)]


def _model_tensors(model) -> dict[str, np.ndarray]:
    return {key: w.numpy() for key, w, _ in _weight_entries(model, "save_weights")}


def _warn_unused(names: Sequence[str], source: str, what: str) -> None:
    if names:
        warnings.warn(f"{source}: {len(names)} tensor(s) not used by {what} were ignored: {', '.join(names)}",
                      UserWarning, stacklevel=4)


def _tensor_dtype_name(tensor: Any) -> str:
    """The dtype of an ndarray or an h5py dataset (Keras stores bfloat16 as opaque 2-byte data, tagged)."""
    attrs = getattr(tensor, "attrs", None)
    if attrs is not None and attrs.get("dtype") in ("bfloat16", b"bfloat16"):
        return "bfloat16"
    return str(tensor.dtype)


def _checked_tensor(tensor: Any, w: Weight, key: str, owner: str, source: str) -> np.ndarray:
    """``tensor`` as a NumPy array for ``w`` once its shape and dtype are right; they are checked first,
    so a lazily read tensor (an h5py dataset) is read only when its size is the weight's own."""
    dtype_name = _tensor_dtype_name(tensor)
    mode = getattr(w.layer, "quantization_mode", None)
    if dtype_name in ("int8", "uint8") and mode is None and w.dtype.kind == "f":
        raise SavingError(f"{source}: tensor '{key}' has dtype {dtype_name} but {owner} needs a float tensor "
                          f"({w.dtype}; float16, bfloat16 and float64 are cast); an {dtype_name} weight means the file "
                          "holds a quantized model: call model.quantize(mode) with the mode it was saved in before "
                          "loading it")
    if tuple(tensor.shape) != w.shape:
        raise SavingError(f"{source}: tensor '{key}' has shape {tuple(tensor.shape)} but {owner} needs {w.shape}")
    if w.dtype.kind in "iu":  # a quantized layer's integer (int8, E4M3 bytes, packed int4) weight: exact dtype
        if dtype_name != str(w.dtype):
            raise SavingError(f"{source}: tensor '{key}' has dtype {dtype_name} but {owner} is quantized ({mode!r}) "
                              f"and needs {w.dtype}: the file holds a float model; load it into the float model, "
                              "then call quantize()")
        return _value_checked(w, np.asarray(tensor[()]) if not isinstance(tensor, np.ndarray) else tensor, key,
                              source)
    if dtype_name not in _FLOAT_DTYPES:
        raise SavingError(f"{source}: tensor '{key}' has dtype {dtype_name} but {owner} needs a float "
                          f"tensor ({w.dtype}; float16, bfloat16 and float64 are cast)")
    arr = np.asarray(tensor[()]) if not isinstance(tensor, np.ndarray) else tensor
    if dtype_name == "bfloat16":
        arr = arr.view(normalize_dtype("bfloat16"))  # h5py reads Keras's tagged bfloat16 as opaque bytes
    return _value_checked(w, arr, key, source)


def _value_checked(w: Weight, arr: np.ndarray, key: str, source: str) -> np.ndarray:
    """``arr`` once ``w`` accepts its values (a quantized layer's weights: their range), before any
    weight is assigned."""
    try:
        return w.checked(arr)
    except (TypeError, ValueError) as exc:
        raise SavingError(f"{source}: tensor '{key}': {exc}") from None


def _checked_weight_tensors(model, tensors: dict[str, Any], source: str) -> list[tuple[Weight, np.ndarray]]:
    """Match every weight of ``model`` with its tensor by position (Keras 3's keys), checking presence,
    shape and dtype; assigns nothing. Files keyed by layer name (dnnbind 0.1's ``conv2d/kernel``) are
    matched by name instead."""
    entries = _weight_entries(model, "load_weights")
    if tensors and not any(key.startswith("layers/") for key in tensors):
        return _checked_named_tensors(model, tensors, source)
    plan = []
    for key, w, layer in entries:
        owner = f"weight '{w.name}' of layer '{layer.name}' ({type(layer).__name__})"
        if key not in tensors:
            held = sorted(tensors)
            raise SavingError(f"{source} has no tensor '{key}' for {owner}: the model does not match the file's "
                              f"(it holds {len(held)} tensor(s): {', '.join(held[:12]) or 'none'}"
                              f"{', ...' if len(held) > 12 else ''})")
        plan.append((w, _checked_tensor(tensors[key], w, key, owner, source)))
    expected = {key for key, _, _ in entries}
    layer_paths = {path: layer for path, layer, _ in keras_format.variable_paths(model)}
    unused = sorted(set(tensors) - expected)
    for key in unused:
        path = key.rsplit("/vars/", 1)[0]
        if path in layer_paths:  # Keras refuses this too: the layer differs from the one saved
            layer = layer_paths[path]
            count = sum(1 for k in expected if k.startswith(f"{path}/vars/"))
            raise SavingError(f"{source}: layer '{layer.name}' ({type(layer).__name__}) at '{path}' has {count} "
                              f"weight(s) but the file holds more ('{key}'): the model does not match the file's")
    _warn_unused(unused, source, f"model '{model.name}'")
    return plan


def _checked_named_tensors(model, tensors: dict[str, Any], source: str) -> list[tuple[Weight, np.ndarray]]:
    """dnnbind 0.1's safetensors files, keyed ``"<layer name>/<weight name>"``."""
    plan = []
    for layer in model.layers:
        for w in getattr(layer, "_weights", []):
            owner = f"layer '{layer.name}' ({type(layer).__name__})"
            if w.path not in tensors:
                raise SavingError(f"{source} has no tensor '{w.path}' for {owner} (the file is keyed by layer "
                                  f"names, as dnnbind 0.1 wrote); it holds: {', '.join(sorted(tensors)) or 'nothing'}")
            plan.append((w, _checked_tensor(tensors[w.path], w, w.path, owner, source)))
    used = {w.path for w, _ in plan}
    _warn_unused(sorted(set(tensors) - used), source, f"model '{model.name}'")
    return plan


def _assign_all(plan: list[tuple[Weight, np.ndarray]]) -> None:
    for w, arr in plan:
        w.assign(arr)


# ----- Keras 3 HDF5 weights (model.weights.h5, *.weights.h5) ----------------------------------------
def _require_h5py(what: str) -> Any:
    try:
        import h5py  # optional: only the Keras formats need it
    except ImportError:
        raise ImportError(f"{what} needs h5py to read and write Keras 3 files (.keras, .weights.h5): "
                          "pip install 'dnnbind[keras]'") from None
    return h5py


def _keras_weights_bytes(model) -> bytes:
    """The model's weights as Keras 3 writes ``model.weights.h5``: a group per layer (``layers/<class>``,
    its ``vars`` group carrying the layer's name), datasets ``"0"``, ``"1"``... in Keras order."""
    h5py = _require_h5py("saving in the Keras format")
    model._require_built("save_weights")
    entries = list(keras_format.variable_paths(model))
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        f.create_group("vars").attrs["name"] = model.name
        for path, layer, weights in entries:
            group = f.create_group(path).create_group("vars")
            group.attrs["name"] = layer.name
            for i, w in enumerate(weights):
                arr = w.numpy()
                if str(arr.dtype) == "bfloat16":
                    group.create_dataset(str(i), data=arr).attrs["dtype"] = "bfloat16"  # as Keras tags it
                else:
                    group[str(i)] = arr
    return buffer.getvalue()


_H5_MAX_DEPTH = 64  # Keras nests a group per model level; deeper is not a weights file


def _h5_datasets(h5py: Any, group: Any, prefix: str, source: str, out: dict, reader: BoundedReader,
                 depth: int = 0) -> None:
    """Every dataset below ``group`` by path, unread. Links other than hard ones (which could point
    outside the file) and external or virtual datasets are refused, as Keras does, and so is a dataset
    that declares more than ``max_bytes`` or more than ``max_ratio`` times the bytes it stores (Keras's
    shape-bomb guard; a dataset is read only once its shape is a weight's own)."""
    if depth > _H5_MAX_DEPTH:
        raise SavingError(f"{source}: groups nested deeper than {_H5_MAX_DEPTH} levels; not a Keras weights file")
    for name in group:
        link = group.get(name, getlink=True)
        path = f"{prefix}{name}"
        if not isinstance(link, h5py.HardLink):
            raise SavingError(f"{source}: '{path}' is a {type(link).__name__}; refusing to follow links in a weights "
                              "file")
        item = group[name]
        if isinstance(item, h5py.Group):
            _h5_datasets(h5py, item, f"{path}/", source, out, reader, depth + 1)
        elif isinstance(item, h5py.Dataset):
            if item.external or item.is_virtual:
                raise SavingError(f"{source}: dataset '{path}' stores its data outside the file; refusing it")
            declared = declared_nbytes(item.shape or (), item.dtype.itemsize)
            reader.check_size(declared, f"{source}: dataset '{path}'")
            reader.check_expansion(declared, item.id.get_storage_size(), f"{source}: dataset '{path}'")
            out[path] = item


def _h5_weight_plan(model, fileobj: Any, source: str, reader: BoundedReader) -> list[tuple[Weight, np.ndarray]]:
    """Open a Keras 3 weights file (a path or a file object), check it against ``model`` and read it."""
    h5py = _require_h5py("reading a Keras file")
    try:
        f = h5py.File(fileobj, "r")
    except OSError as exc:
        raise SavingError(f"{source} is not a valid HDF5 file (corrupt or truncated?): {exc}; a Keras 3 weights "
                          "file (.weights.h5, or model.weights.h5 inside a .keras) is HDF5") from None
    with f:
        if "layer_names" in f.attrs or "model_weights" in f or "model_config" in f.attrs:
            raise SavingError(f"{source} is a legacy Keras 2 HDF5 file, which dnnbind does not read; load it "
                              "in Keras and save it again as .keras or .weights.h5 (Keras 3)")
        if "layers" not in f and any(True for _ in _weight_entries(model, "load_weights")):
            raise SavingError(f"{source} has no 'layers' group: it is not a Keras 3 weights file")
        datasets: dict[str, Any] = {}
        if "layers" in f:
            _h5_datasets(h5py, f, "", source, datasets, reader)
        # the model's own vars and the optimizer's: dnnbind does not map Keras optimizer state
        tensors = {key: ds for key, ds in datasets.items() if key.startswith("layers/")}
        return _checked_weight_tensors(model, tensors, source)


def _is_keras_weights_name(filepath: str) -> bool:
    return filepath.lower().endswith(_KERAS_WEIGHTS_SUFFIX)


def _refuse_legacy_h5_name(filepath: str, what: str) -> None:
    lowered = filepath.lower()
    if lowered.endswith(_LEGACY_H5_SUFFIXES) and not _is_keras_weights_name(filepath):
        raise SavingError(f"{what}: {filepath} names the legacy Keras 2 HDF5 format, which dnnbind does not write; "
                          "use .keras (a whole Keras 3 model), .weights.h5 (Keras 3 weights), .dnnbind or "
                          ".safetensors")


def save_weights(model, filepath: "str | os.PathLike", overwrite: bool = True) -> None:
    """Write the model's weights (Keras layouts), atomically: a Keras 3 HDF5 file for a name ending in
    ``.weights.h5`` (needs h5py), otherwise safetensors. Both key the weights by position as Keras 3
    does (``layers/conv2d/vars/0``), so any model of the same architecture reads them back.
    A ``.keras`` name (a whole model: use ``save``) and other ``.h5`` names (Keras 2) are refused."""
    filepath = os.fspath(filepath)
    if filepath.lower().endswith(_KERAS_SUFFIX):
        raise SavingError(f"save_weights: {filepath} names a whole Keras model; use model.save() for .keras, or "
                          "name the weights file .weights.h5 (Keras 3) or .safetensors")
    _refuse_legacy_h5_name(filepath, "save_weights")
    if not overwrite and os.path.exists(filepath):
        raise FileExistsError(f"save_weights: {filepath} exists and overwrite=False")
    if _is_keras_weights_name(filepath):
        data = _keras_weights_bytes(model)
    else:
        data = _safetensors_bytes(_model_tensors(model), {"format": "dnnbind.weights"})
    with atomic_write(filepath) as fh:
        fh.write(data)


def _head(filepath: str) -> bytes:
    with open(filepath, "rb") as fh:
        return fh.read(8)


def _sniff(filepath: str) -> str:
    """``"hdf5"``, ``"zip"`` or ``"other"`` from a file's first bytes (what it is, whatever its name)."""
    head = _head(filepath)
    if head.startswith(_HDF5_MAGIC):
        return "hdf5"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    return "other"


def _first_bytes(data: bytes) -> str:
    """How a file starts, for an error saying it is not the format expected."""
    return "it is empty (0 bytes)" if not data else f"it starts with the bytes {data[:8].hex(' ')}"


def _format_named_by(filepath: str) -> str | None:
    """The format a file's name promises, in words; None for a name that promises none."""
    if _is_keras_weights_name(filepath):
        return "an HDF5 file (a Keras 3 .weights.h5 weights file)"
    if filepath.lower().endswith((_KERAS_SUFFIX, *_ZIP_SUFFIXES)):
        return "a zip (a .keras / .dnnbind model file)"
    return None


def load_weights(model, filepath: "str | os.PathLike", *, limits: "ReadLimits | dict | None" = None) -> None:
    """Load weights from a file :func:`save_weights` or Keras 3 wrote: safetensors, a Keras ``.weights.h5``
    or the weights of a ``.keras`` (or ``.dnnbind``) model file, told apart by their contents. Weights are
    matched by position (Keras 3's ``layers/<class>/vars/<i>``; dnnbind 0.1's name-keyed files by name);
    every one is checked (presence, shape, float dtype) before any is written, so a failure changes none.
    ``limits``: how much the file may make this process read (:class:`ReadLimits`; default: the
    ``DNNBIND_READ_*`` environment, else the built-in limits); over them, ``ReadLimitError``."""
    filepath = os.fspath(filepath)
    reader = BoundedReader(limits)
    if not os.path.isfile(filepath):
        raise FileNotFoundError(f"load_weights: no file at {filepath}")
    kind = _sniff(filepath)
    if kind == "hdf5":
        reader.check_size(os.path.getsize(filepath), filepath)
        plan = _h5_weight_plan(model, filepath, filepath, reader)
    elif kind == "zip":
        files = _read_zip(filepath, reader)
        if _KERAS_WEIGHTS_MEMBER in files:
            plan = _h5_weight_plan(model, io.BytesIO(files[_KERAS_WEIGHTS_MEMBER]),
                                   f"{filepath}: {_KERAS_WEIGHTS_MEMBER}", reader)
        elif "model.safetensors" in files:
            tensors = _safetensors_load(files["model.safetensors"], f"{filepath}: model.safetensors")
            plan = _checked_weight_tensors(model, tensors, f"{filepath}: model.safetensors")
        else:
            raise SavingError(f"{filepath} is a zip without {_KERAS_WEIGHTS_MEMBER} or model.safetensors; it holds "
                              "no weights dnnbind can read")
    else:
        data = reader.read_file(filepath)
        promised = _format_named_by(filepath)
        if not data:
            expected = promised or "a weights file (safetensors, .weights.h5, or a .keras / .dnnbind model)"
            raise SavingError(f"{filepath} is empty (0 bytes), not {expected}; was its save interrupted?")
        try:
            tensors = _safetensors_load(data, filepath)  # dnnbind 0.1 wrote safetensors under any name
        except SavingError:
            if promised is None:
                raise
            raise SavingError(f"{filepath} is not {promised}, as its name says, nor safetensors: "
                              f"{_first_bytes(data)}; it is truncated or was not written by "
                              "save_weights/model.save (or Keras)") from None
        plan = _checked_weight_tensors(model, tensors, filepath)
    _assign_all(plan)


# ----- whole models -------------------------------------------------------------------------------
def _optimizer_tensors(model) -> dict[str, np.ndarray] | None:
    opt = model.optimizer
    if opt is None or not opt.built:
        return None
    state = opt.get_state()
    return {k: np.asarray(v) for k, v in state.items()}


def _model_class_name(model) -> str:
    """``"Sequential"`` or ``"Functional"``: the models a config rebuilds (a subclassed one's layers are code)."""
    for cls in type(model).__mro__:
        if cls.__name__ in ("Sequential", "Functional"):
            return cls.__name__
    raise SavingError(f"save: model '{model.name}' ({type(model).__name__}) is subclassed: no config can rebuild "
                      "its layers, which its own code makes; use save_weights, then load_weights into a new instance")


def _model_files(model, include_optimizer: bool) -> dict[str, bytes]:
    config = {
        "format": _FORMAT,
        "format_version": _FORMAT_VERSION,
        "dnnbind_version": __version__,
        "class_name": _model_class_name(model),
        "config": model.get_config(),
        "compile_config": model._compile_config if model.compiled else None,
        "dtype_policy": None,
    }
    files = {"config.json": json.dumps(config, indent=2).encode("utf-8"),
             "model.safetensors": _safetensors_bytes(_model_tensors(model), {"format": "dnnbind.weights"})}
    if include_optimizer:
        opt = _optimizer_tensors(model)
        if opt is not None:
            files["optimizer.safetensors"] = _safetensors_bytes(opt, {"format": "dnnbind.optimizer"})
    return files


def _keras_model_files(model, include_optimizer: bool) -> dict[str, bytes]:
    """``metadata.json``, ``config.json`` and ``model.weights.h5``, as Keras 3's ``model.save`` writes them."""
    model._require_built("save")
    try:
        config = keras_format.model_to_keras(model)
        config["compile_config"] = keras_format.compile_config_to_keras(
            getattr(model, "_compile_config", None) if getattr(model, "compiled", False) else None)
    except (KeyError, TypeError, ValueError) as exc:
        raise SavingError(f"save: model '{model.name}' cannot be written in the Keras format: {exc}; "
                          "save it as .dnnbind instead") from exc
    if include_optimizer and _optimizer_tensors(model) is not None:
        warnings.warn(f"save: the .keras file of model '{model.name}' holds no optimizer state (dnnbind does not "
                      "map it to Keras's optimizer variables); a model loaded from it restarts its optimizer. "
                      "Save as .dnnbind to resume training.", UserWarning, stacklevel=3)
    metadata = {"keras_version": keras_format.KERAS_FORMAT_VERSION,
                "date_saved": datetime.datetime.now().strftime("%Y-%m-%d@%H:%M:%S"),
                "dnnbind_version": __version__}
    return {"metadata.json": json.dumps(metadata).encode("utf-8"),
            "config.json": json.dumps(config).encode("utf-8"),
            _KERAS_WEIGHTS_MEMBER: _keras_weights_bytes(model)}


def save_model(model, filepath: "str | os.PathLike", overwrite: bool = True, include_optimizer: bool = True) -> None:
    """Save a whole model, replaced as a whole (atomically):

    * ``.keras``: a Keras 3 model file (zip of ``config.json``, ``metadata.json``, ``model.weights.h5``)
      that ``keras.saving.load_model`` reads; it carries the compile config but no optimizer state.
      Needs h5py (``pip install 'dnnbind[keras]'``).
    * ``.dnnbind`` / ``.zip``: dnnbind's zip (config, safetensors weights, optimizer state to resume).
    * any other path: a directory with a checksummed manifest (the same parts).

    ``.h5``/``.hdf5`` (Keras 2's format) and ``.weights.h5`` (weights only: ``save_weights``) are refused.
    """
    filepath = os.fspath(filepath)
    lowered = filepath.lower()
    if _is_keras_weights_name(filepath):
        raise SavingError(f"save: {filepath} names a weights file; use model.save_weights() for .weights.h5, or "
                          "model.save() with a .keras or .dnnbind path")
    _refuse_legacy_h5_name(filepath, "save")
    if not overwrite and os.path.exists(filepath):
        raise FileExistsError(f"save: {filepath} exists and overwrite=False")
    is_keras = lowered.endswith(_KERAS_SUFFIX)
    is_zip = is_keras or lowered.endswith(_ZIP_SUFFIXES)
    if not is_zip and os.path.exists(filepath) and not os.path.isdir(filepath):
        raise SavingError(f"save: {filepath} exists and is not a directory (use a .dnnbind path for one file)")
    files = _keras_model_files(model, include_optimizer) if is_keras else _model_files(model, include_optimizer)
    if is_zip:
        with atomic_write(filepath) as fh, zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_STORED) as zf:
            for name, data in files.items():
                zf.writestr(name, data)
    else:
        _save_directory(filepath, files)


def _read_manifest(directory: str, reader: BoundedReader | None = None) -> dict | None:
    """The parsed, checked manifest of ``directory``; None when it has none."""
    reader = reader if reader is not None else BoundedReader()
    path = os.path.join(directory, _MANIFEST)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_MANIFEST_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    where = f"{path}"
    if len(raw) > _MANIFEST_MAX_BYTES:
        raise SavingError(f"{where} is larger than {_MANIFEST_MAX_BYTES} bytes; it is not a dnnbind manifest")
    try:
        manifest = reader.json(raw, where)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SavingError(f"{where} is corrupt: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != _CHECKPOINT_FORMAT:
        raise SavingError(f"{where} is not a dnnbind checkpoint manifest (format {_CHECKPOINT_FORMAT!r})")
    version = manifest.get("format_version")
    if type(version) is not int or version > _CHECKPOINT_VERSION:
        raise SavingError(f"{where}: format_version {version!r} is not one this dnnbind reads "
                          f"(<= {_CHECKPOINT_VERSION}); was it written by a newer dnnbind?")
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise SavingError(f"{where}: 'files' must be an object, got {type(files).__name__}")
    for part, entry in files.items():
        ok = (part in _PARTS and isinstance(entry, dict) and isinstance(entry.get("file"), str)
              and _PART_FILE.match(entry["file"]) is not None
              and entry["file"].split(".")[0] == part.split(".")[0]
              and entry["file"].split(".")[-1] == part.split(".")[-1]
              and type(entry.get("size")) is int and entry["size"] >= 0
              and isinstance(entry.get("sha256"), str) and re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]))
        if not ok:
            raise SavingError(f"{where}: entry {part!r} is malformed: {str(entry)[:200]}; expected one of "
                              f"{', '.join(_PARTS)} -> {{'file': '<part>.<16 hex>.<ext>', 'size': int, "
                              "'sha256': 64 hex digits}")
    return manifest


def _save_directory(directory: str, files: dict[str, bytes]) -> None:
    os.makedirs(directory, exist_ok=True)
    with directory_lock(directory, exclusive=True) as locked:
        try:
            old = _read_manifest(directory)
        except (SavingError, ReadLimitError):
            old = None  # a damaged checkpoint is replaced, not an obstacle to saving
        else:
            if locked:  # what killed saves left goes before this one writes as much again
                _remove_orphans(directory, old)
        old_files = old["files"] if old else {}
        token = secrets.token_hex(8)
        entries = {}
        try:
            for part, data in files.items():
                stem, ext = part.split(".")
                name = f"{stem}.{token}.{ext}"
                # the part this one replaces keeps its mode (the previous save's, or the first layout's file)
                previous = old_files.get(part, {}).get("file", part)
                try:
                    fd = create_exclusive(os.path.join(directory, name),
                                          existing_mode(os.path.join(directory, previous)))
                except OSError as exc:  # a read-only or full file system: name the checkpoint, not the part
                    raise target_error(exc, directory, os.path.join(directory, name)) from None
                entries[part] = {"file": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
            fsync_directory(directory)  # the new parts' names are durable before the manifest names them
            generation = old.get("generation", 0) if old else 0
            manifest = {"format": _CHECKPOINT_FORMAT, "format_version": _CHECKPOINT_VERSION,
                        "generation": (generation if type(generation) is int else 0) + 1, "files": entries}
            with atomic_write(os.path.join(directory, _MANIFEST)) as fh:  # the switch
                fh.write(json.dumps(manifest, indent=2).encode("utf-8"))
        except BaseException:
            try:
                switched = (_read_manifest(directory) or {}).get("files") == entries
            except (SavingError, ReadLimitError):
                switched = False
            if not switched:  # the old checkpoint stays; the new parts go
                for entry in entries.values():
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(directory, entry["file"]))
            raise
        # Under the lock nobody else is writing: every part the new manifest does not name is garbage.
        keep = {entry["file"] for entry in entries.values()}
        for name in os.listdir(directory):
            if (name in _PARTS or _PART_FILE.match(name)) and name not in keep:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, name))


def _remove_orphans(directory: str, manifest: dict | None) -> list[str]:
    """Delete, in a checkpoint directory nobody is writing (its lock held), the parts ``manifest`` does
    not name (those of saves killed before their switch; without a manifest, the first layout's plain
    files are the checkpoint and stay) and the manifest temporaries of dead writers. Returns the names
    removed; a file that cannot be removed (read-only) stays."""
    keep = {entry["file"] for entry in manifest["files"].values()} if manifest else set(_PARTS)
    removed: list[str] = []
    with contextlib.suppress(OSError):  # cleaning up must not fail a save or a load
        removed += remove_stale_temporaries(directory, _MANIFEST)
    for name in os.listdir(directory):
        if (_PART_FILE.match(name) or (manifest and name in _PARTS)) and name not in keep:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))
                removed.append(name)
    return removed


def _read_directory(directory: str, reader: BoundedReader) -> dict[str, bytes]:
    with directory_lock(directory, exclusive=False) as locked:
        manifest = _read_manifest(directory, reader)
        if manifest is None:
            # the first directory layout: plain names, no checksums
            files = {}
            for part in _PARTS:
                path = os.path.join(directory, part)
                if os.path.isfile(path):
                    files[part] = reader.read_file(path)
            if "config.json" not in files:
                raise SavingError(f"{directory} has no {_MANIFEST} (nor config.json): it is not a checkpoint "
                                  "directory written by dnnbind's model.save")
            return files
        files = {}
        for part, entry in manifest["files"].items():
            path = os.path.join(directory, entry["file"])
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                raise SavingError(f"{path} is missing but {_MANIFEST} lists it as {part}: the checkpoint is "
                                  "incomplete; refusing to load it") from None
            if size != entry["size"]:
                raise SavingError(f"{path} is {size:,} bytes but {_MANIFEST} says {entry['size']:,}: the "
                                  "checkpoint is corrupt or mixed; refusing to load it")
            data = reader.read_file(path)
            digest = hashlib.sha256(data).hexdigest()
            if digest != entry["sha256"]:
                raise SavingError(f"{path}: SHA-256 {digest} does not match {entry['sha256']} in {_MANIFEST}: the "
                                  "checkpoint is corrupt or mixed; refusing to load it")
            files[part] = data
        if locked:  # a shared lock: no save is under way, so what the manifest does not name is a dead one's
            _remove_orphans(directory, manifest)
        return files


def _read_zip(filepath: str, reader: BoundedReader) -> dict[str, bytes]:
    """The members of a dnnbind or Keras model zip that dnnbind reads, each within the read limits."""
    try:
        with reader.open_zip(filepath) as zf:
            if "model.weights.npz" in zf.infos and _KERAS_WEIGHTS_MEMBER not in zf.infos:
                raise SavingError(f"{filepath} holds Keras's npz weights (weights_format='npz'), which dnnbind does "
                                  "not read; save it from Keras with the default h5 weights")
            return {name: zf.read(name) for name in zf.infos if name in _PARTS or name in _KERAS_MEMBERS}
    except (zipfile.BadZipFile, OSError, EOFError, zipfile.LargeZipFile, NotImplementedError) as exc:
        raise SavingError(f"{filepath} is not a dnnbind model file (a zip with config.json and model.safetensors) "
                          f"nor a Keras 3 .keras file, or it is corrupt: {exc}") from None


def _read_model_files(filepath: str, reader: BoundedReader) -> dict[str, bytes]:
    if os.path.isdir(filepath):
        return _read_directory(filepath, reader)
    if not os.path.isfile(filepath):
        raise FileNotFoundError(f"load_model: no file or directory at {filepath}")
    kind = _sniff(filepath)
    if kind == "hdf5":
        raise SavingError(f"{filepath} is an HDF5 file: a legacy Keras 2 model (.h5), which dnnbind does not read "
                          "(load it in Keras and save it as .keras), or a weights file, which load_weights reads "
                          "into a built model")
    if kind != "zip":
        raise SavingError(f"{filepath} is not a dnnbind model file nor a Keras 3 .keras file (both are zips): "
                          f"{_first_bytes(_head(filepath))}; it is truncated, or not a model file (a weights file goes to "
                          "load_weights, a checkpoint directory by its directory's name)")
    with contextlib.suppress(OSError):  # as a save does: the temporaries of writers that died
        remove_stale_temporaries(os.path.dirname(os.path.realpath(filepath)), os.path.basename(filepath))
    return _read_zip(filepath, reader)


def _json_part(files: dict[str, bytes], name: str, filepath: str, reader: BoundedReader) -> Any:
    try:
        return reader.json(files[name], f"{filepath}: {name}")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SavingError(f"{filepath}: {name} is corrupt: {exc}") from None


def _checked_optimizer_state(optimizer, state: dict[str, np.ndarray], params: list, source: str) -> None:
    """Check a saved optimizer state against ``optimizer`` and ``params`` (names, shapes, dtypes)."""
    owner = type(optimizer).__name__
    iterations = state.get("iterations")
    if iterations is not None:
        if iterations.dtype.kind not in "iu" or iterations.size != 1 or int(iterations.reshape(-1)[0]) < 0:
            raise SavingError(f"{source}: 'iterations' must be one integer >= 0, got dtype {iterations.dtype} "
                              f"shape {iterations.shape}")
    expected = {"iterations"}
    for i, p in enumerate(params):
        for slot in optimizer._slot_names_for(p):
            key = f"{i}/{slot}"
            expected.add(key)
            if key not in state:
                raise SavingError(f"{source}: {owner} state is missing '{key}' (parameter {i} has shape "
                                  f"{tuple(p.shape)})")
            arr = state[key]
            if tuple(arr.shape) != tuple(p.shape):
                raise SavingError(f"{source}: {owner} state '{key}' has shape {tuple(arr.shape)}, the parameter "
                                  f"needs {tuple(p.shape)}")
            if str(arr.dtype) not in _FLOAT_DTYPES:
                raise SavingError(f"{source}: {owner} state '{key}' has dtype {arr.dtype}, expected a float dtype "
                                  f"({p.dtype})")
    _warn_unused(sorted(set(state) - expected), source, owner)


def _rebuild(build: ModelBuilder, class_name: str, config: Any, filepath: str, max_weight_bytes: int | None) -> Any:
    """A built model from ``class_name`` ("Sequential" or "Functional") and its ``from_config`` dict
    (checked by the layers, sized before anything is allocated)."""
    try:
        model = build({"class_name": class_name, "config": config}, max_weight_bytes=max_weight_bytes)
    except AllocationTooLargeError as exc:
        raise AllocationTooLargeError(f"{filepath}: {exc}") from None
    except (KeyError, TypeError, ValueError, NotImplementedError) as exc:
        raise SavingError(f"{filepath}: the model config cannot be rebuilt: {exc}") from exc
    if not model.built:
        raise SavingError(f"{filepath}: the saved model was never built, so it has no weights to load")
    return model


def _compile_from(model, compile_config: dict) -> None:
    # compile_from_config understands every structure compile writes (list/dict losses and metrics of
    # multi-output models, loss_weights), not just one loss
    model.compile_from_config(compile_config)


def _load_keras_model(build: ModelBuilder, filepath: str, files: dict[str, bytes], compile: bool,
                      max_weight_bytes: int | None, reader: BoundedReader) -> Any:
    """A model from a Keras 3 ``.keras`` file: its config translated, its weights matched by position."""
    config = _json_part(files, "config.json", filepath, reader)
    try:
        class_name, model_config = keras_format.model_from_keras(config)
    except (KeyError, TypeError, ValueError) as exc:
        raise SavingError(f"{filepath}: {exc}") from None
    model = _rebuild(build, class_name, model_config, filepath, max_weight_bytes)
    plan = _h5_weight_plan(model, io.BytesIO(files[_KERAS_WEIGHTS_MEMBER]), f"{filepath}: {_KERAS_WEIGHTS_MEMBER}",
                           reader)
    if compile and isinstance(config, dict) and config.get("compile_config"):
        try:
            _compile_from(model, keras_format.compile_config_from_keras(config["compile_config"]))
        except (KeyError, TypeError, ValueError, AttributeError, NotImplementedError) as exc:
            # an optimizer dnnbind lacks should not stop a model from loading for inference (Keras warns too)
            warnings.warn(f"{filepath}: the model was loaded uncompiled; its Keras compile config cannot be "
                          f"reproduced: {exc}", UserWarning, stacklevel=3)
    _assign_all(plan)
    return model


def _missing_part(filepath: str, files: dict[str, bytes], reader: BoundedReader) -> SavingError:
    """The error for a model file without its config or weights, naming the format it is and what it holds."""
    held = ", ".join(sorted(files)) or "none of them"
    keras_config = False
    if "config.json" in files:
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            config = reader.json(files["config.json"], f"{filepath}: config.json")
            keras_config = isinstance(config, dict) and "module" in config and config.get("format") != _FORMAT
    if keras_config or "metadata.json" in files:
        missing = [m for m in _KERAS_MEMBERS if m not in files and m != "metadata.json"]
        return SavingError(f"{filepath} is a Keras 3 model file (.keras) without {' and '.join(missing)}: it holds "
                           f"{held}; a .keras file holds {', '.join(_KERAS_MEMBERS)}, so this one is truncated or was "
                           "written with its weights elsewhere; save the model again (model.save with a .keras path)")
    missing = [m for m in ("config.json", "model.safetensors") if m not in files]
    kind = "checkpoint directory" if os.path.isdir(filepath) else "model zip (.dnnbind)"
    return SavingError(f"{filepath} is a dnnbind {kind} without {' and '.join(missing)}: it holds {held}; dnnbind's "
                       "model files hold config.json and model.safetensors (optimizer.safetensors optional), so this "
                       "one is incomplete or not a model saved by dnnbind")


def load_model(filepath: "str | os.PathLike", build: ModelBuilder, compile: bool = True, *,
               max_weight_bytes: int | None = None, limits: "ReadLimits | dict | None" = None) -> Any:
    """Rebuild a model saved by ``model.save`` or by Keras 3: architecture, weights, compile settings and
    (dnnbind's own formats) optimizer state.

    The kind of file is read from its contents: a ``.keras`` zip written by Keras 3 or dnnbind, a dnnbind
    zip (``.dnnbind``; also ``.keras`` files of dnnbind 0.1) or a checkpoint directory. Every file is
    checked before it is used: a directory's parts against its manifest (size, SHA-256), the config's
    arguments by the layers, the weights' total size against ``max_weight_bytes`` (default: the machine's
    physical memory) before any is allocated, and every tensor's presence, shape and dtype before any is
    assigned. Everything is read within ``limits`` (:class:`ReadLimits`: member and total sizes, the
    compression ratio, JSON size and depth; default: the ``DNNBIND_READ_*`` environment, else the built-in
    limits). Raises :class:`SavingError` (or ``ReadLimitError``, ``AllocationTooLargeError``). A Keras
    compile config that dnnbind cannot reproduce (an optimizer it lacks) leaves the model uncompiled,
    with a warning. Like a save, a load removes what killed saves left: the temporaries of dead writers
    and a checkpoint directory's parts that its manifest does not name.

    ``build`` makes the model from its saved config: :func:`dnnbind.models.model_from_config`, which
    :func:`dnnbind.models.load_model` (the public entry point) passes.
    """
    filepath = os.fspath(filepath)
    reader = BoundedReader(limits)
    files = _read_model_files(filepath, reader)
    if _KERAS_WEIGHTS_MEMBER in files and "model.safetensors" not in files and "config.json" in files:
        return _load_keras_model(build, filepath, files, compile, max_weight_bytes, reader)
    if "config.json" not in files or "model.safetensors" not in files:
        raise _missing_part(filepath, files, reader)
    config = _json_part(files, "config.json", filepath, reader)
    if not isinstance(config, dict) or config.get("format") != _FORMAT:
        raise SavingError(f"{filepath}: config.json is not a dnnbind model config")
    version = config.get("format_version", 0)
    if type(version) is not int or version > _FORMAT_VERSION:
        raise SavingError(f"{filepath} was written by a newer dnnbind (format {version!r})")
    if config.get("class_name") not in ("Sequential", "Functional"):
        raise SavingError(f"{filepath}: unsupported model class {config.get('class_name')!r}")
    weights = _safetensors_load(files["model.safetensors"], f"{filepath}: model.safetensors")
    opt_state = None
    if compile and config.get("compile_config") and "optimizer.safetensors" in files:
        opt_state = _safetensors_load(files["optimizer.safetensors"], f"{filepath}: optimizer.safetensors")
    model = _rebuild(build, config["class_name"], config.get("config"), filepath, max_weight_bytes)
    plan = _checked_weight_tensors(model, weights, f"{filepath}: model.safetensors")
    compile_config = config.get("compile_config")
    if compile and compile_config:
        try:
            _compile_from(model, compile_config)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SavingError(f"{filepath}: the compile config cannot be restored: {exc}") from exc
        params = [w.value for w in model.trainable_weights]
        if opt_state is not None:
            _checked_optimizer_state(model.optimizer, opt_state, params, f"{filepath}: optimizer.safetensors")
    _assign_all(plan)
    if opt_state is not None:
        model.optimizer.set_state(opt_state, params)
    return model


# ----- configs from files -------------------------------------------------------------------------
def check_weight_budget(layers: Sequence[Layer], input_shape: Sequence[int], owner: str,
                        max_bytes: int | None = None) -> int:
    """Size the weights ``layers`` (unbuilt, in model order) would create for inputs of ``input_shape``,
    without allocating them; raise ``AllocationTooLargeError`` naming the layer where the total passes
    ``max_bytes`` (default: the machine's physical memory). Returns the total in bytes.

    Each layer is built on a copy whose ``add_weight`` records the shape and returns a zero-stride
    view, so the layers' own ``build`` decides the shapes, and nothing of size is ever made.
    """
    limit = max_bytes if max_bytes is not None else physical_memory()
    what_limit = "max_weight_bytes" if max_bytes is not None else "this machine's physical memory"
    total = 0
    shape = tuple(input_shape)
    for layer in layers:
        if isinstance(layer, InputLayer):
            continue
        if layer.built:  # its weights exist already, and a copy would duplicate them
            raise ValueError(f"{owner}: check_weight_budget sizes unbuilt layers; '{layer.name}' is built")
        probe = copy.deepcopy(layer)

        def sized(_probe: Layer) -> Callable:
            def add_weight(*args: Any, **kwargs: Any) -> Weight:
                nonlocal total
                call = _ADD_WEIGHT.bind(_probe, *args, **kwargs)
                call.apply_defaults()
                a = call.arguments
                wshape = tuple(int(s) for s in a["shape"])
                label = f"{type(_probe).__name__} '{_probe.name}'"
                if any(d < 0 for d in wshape):
                    raise ValueError(f"{label}: weight '{a['name']}' would have a negative shape {wshape}")
                dtype = normalize_dtype(a["dtype"] or _probe.variable_dtype)
                nbytes = math.prod(wshape) * dtype.itemsize
                total += nbytes
                if limit is not None and total > limit:
                    raise AllocationTooLargeError(
                        f"{owner}: layer '{_probe.name}' ({type(_probe).__name__}) weight '{a['name']}' of shape "
                        f"{wshape} ({dtype}) needs {nbytes:,} bytes, bringing the model's weights to at least "
                        f"{total:,} bytes, more than the {limit:,} bytes of {what_limit}; nothing was allocated")
                view = np.broadcast_to(np.zeros((), dtype), wshape)
                to_internal = a["to_internal"]
                w = Weight(_probe, a["name"], wshape, to_internal(view) if to_internal else view, a["trainable"],
                           to_internal, a["to_keras"])
                _probe._weights.append(w)
                return w
            return add_weight

        # the probe and every layer inside it (an RNN's cell, a wrapper's layer) size their weights only
        stack = [probe]
        while stack:
            current = stack.pop()
            current._add_weight = sized(current)
            stack.extend(current._sublayers())
        if probe._is_legacy():
            probe._ensure_built(shape)
            out = probe.output_shape
        else:  # a layer with a call of its own builds from Keras shapes (the batch axis too), as Sequential.build
            probe._build_from_call((KerasTensor((None, *shape), probe._effective_compute_dtype_name()),), {})
            out = None
        if out is None:  # a layer written on keras.ops (Embedding, the recurrent layers): ask it
            out = tuple(probe.compute_output_shape((None, *shape)))[1:]
        shape = tuple(out)
    return total
