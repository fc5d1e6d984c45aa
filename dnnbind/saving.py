"""Saving and loading: safetensors weights, and whole models as a zip or a directory. No pickle.

* ``save_weights(model, path)`` / ``load_weights``: one safetensors file; tensors are named
  ``"<layer name>/<weight name>"`` (``"conv2d/kernel"``, ``"batch_normalization/moving_mean"``)
  and stored in Keras layouts.
* ``save_model(model, path)`` / ``load_model(path)``: ``path`` ending in ``.dnnbind`` or
  ``.keras`` (or ``.zip``) is a single zip file; any other path is a directory. Either holds
  ``config.json`` (the model and layer configs, the compile config), ``model.safetensors`` and,
  when the model has an optimizer with state, ``optimizer.safetensors`` (to resume training).

Every file is written to a temporary file in the target directory and renamed into place
(``os.replace``), so a failure never leaves a partial file behind.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
import zipfile
from typing import Any, Iterator

import numpy as np

from .errors import DnnbindError

__all__ = ["save_weights", "load_weights", "save_model", "load_model", "atomic_write", "SavingError"]

_FORMAT = "dnnbind.model"
_FORMAT_VERSION = 1
_ZIP_SUFFIXES = (".dnnbind", ".keras", ".zip")


class SavingError(DnnbindError):
    """A saved file is missing, corrupt, or does not fit the model."""


@contextlib.contextmanager
def atomic_write(path: "str | os.PathLike", mode: str = "wb") -> Iterator[Any]:
    """Open a temporary file next to ``path``; on success rename it to ``path``, on failure delete it."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-" + os.path.basename(path) + "-", dir=directory)
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _safetensors_bytes(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> bytes:
    from safetensors.numpy import save

    return save({k: np.ascontiguousarray(v) for k, v in tensors.items()}, metadata=metadata)


def _safetensors_load(data: bytes, what: str) -> dict[str, np.ndarray]:
    from safetensors.numpy import load

    try:
        return load(data)
    except Exception as exc:  # safetensors raises its own SafetensorError / ValueError on bad bytes
        raise SavingError(f"{what} is not a valid safetensors file (corrupt or truncated?): {exc}") from None


def _model_tensors(model) -> dict[str, np.ndarray]:
    model._require_built("save_weights")
    tensors: dict[str, np.ndarray] = {}
    for layer in model.layers:
        for w in layer._weights:
            if w.path in tensors:
                raise SavingError(f"two weights are named '{w.path}'; give the layers unique names")
            tensors[w.path] = w.numpy()
    return tensors


def _assign_tensors(model, tensors: dict[str, np.ndarray], source: str) -> None:
    """Check every tensor against the model (names, shapes) first, then assign them all."""
    model._require_built("load_weights")
    plan = []
    for layer in model.layers:
        for w in layer._weights:
            if w.path not in tensors:
                raise SavingError(
                    f"{source} has no tensor '{w.path}' for layer '{layer.name}' ({type(layer).__name__}); "
                    f"it holds: {', '.join(sorted(tensors)) or 'nothing'}"
                )
            arr = tensors[w.path]
            if tuple(arr.shape) != w.shape:
                raise SavingError(
                    f"{source}: tensor '{w.path}' has shape {tuple(arr.shape)} but layer '{layer.name}' "
                    f"({type(layer).__name__}) needs {w.shape}"
                )
            plan.append((w, arr))
    for w, arr in plan:
        w.assign(arr)


def save_weights(model, filepath: "str | os.PathLike", overwrite: bool = True) -> None:
    """Write the model's weights (Keras layouts) to a safetensors file at ``filepath``, atomically."""
    filepath = os.fspath(filepath)
    if not overwrite and os.path.exists(filepath):
        raise FileExistsError(f"save_weights: {filepath} exists and overwrite=False")
    data = _safetensors_bytes(_model_tensors(model), {"format": "dnnbind.weights"})
    with atomic_write(filepath) as fh:
        fh.write(data)


def load_weights(model, filepath: "str | os.PathLike") -> None:
    """Load weights saved by :func:`save_weights` (every layer's tensors must be present, shapes equal)."""
    filepath = os.fspath(filepath)
    if not os.path.isfile(filepath):
        raise FileNotFoundError(f"load_weights: no file at {filepath}")
    with open(filepath, "rb") as fh:
        tensors = _safetensors_load(fh.read(), filepath)
    _assign_tensors(model, tensors, filepath)


def _optimizer_tensors(model) -> dict[str, np.ndarray] | None:
    opt = model.optimizer
    if opt is None or not opt.built:
        return None
    state = opt.get_state()
    return {k: np.asarray(v) for k, v in state.items()}


def _model_files(model, include_optimizer: bool) -> dict[str, bytes]:
    from . import __version__

    config = {
        "format": _FORMAT,
        "format_version": _FORMAT_VERSION,
        "dnnbind_version": __version__,
        "class_name": "Sequential",
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


def save_model(model, filepath: "str | os.PathLike", overwrite: bool = True, include_optimizer: bool = True) -> None:
    """Save config, weights and (optionally) optimizer state: a zip for ``.dnnbind``/``.keras``/``.zip``
    paths, otherwise a directory of the same three files."""
    filepath = os.fspath(filepath)
    if not overwrite and os.path.exists(filepath):
        raise FileExistsError(f"save: {filepath} exists and overwrite=False")
    files = _model_files(model, include_optimizer)
    if filepath.lower().endswith(_ZIP_SUFFIXES):
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as zf:
            for name, data in files.items():
                zf.writestr(name, data)
        with atomic_write(filepath) as fh:
            fh.write(buffer.getvalue())
        return
    if os.path.exists(filepath) and not os.path.isdir(filepath):
        raise SavingError(f"save: {filepath} exists and is not a directory (use a .dnnbind path for one file)")
    os.makedirs(filepath, exist_ok=True)
    for name, data in files.items():
        with atomic_write(os.path.join(filepath, name)) as fh:
            fh.write(data)
    if "optimizer.safetensors" not in files:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(filepath, "optimizer.safetensors"))


def _read_model_files(filepath: str) -> dict[str, bytes]:
    names = ("config.json", "model.safetensors", "optimizer.safetensors")
    if os.path.isdir(filepath):
        files = {}
        for name in names:
            p = os.path.join(filepath, name)
            if os.path.isfile(p):
                with open(p, "rb") as fh:
                    files[name] = fh.read()
        return files
    if not os.path.isfile(filepath):
        raise FileNotFoundError(f"load_model: no file or directory at {filepath}")
    try:
        with zipfile.ZipFile(filepath) as zf:
            present = set(zf.namelist())
            return {name: zf.read(name) for name in names if name in present}
    except (zipfile.BadZipFile, OSError, EOFError, zipfile.LargeZipFile) as exc:
        raise SavingError(f"{filepath} is not a dnnbind model file (a zip with config.json and model.safetensors): "
                          f"{exc}") from None


def load_model(filepath: "str | os.PathLike", compile: bool = True) -> Any:
    """Rebuild a model saved by ``model.save``: architecture, weights, compile settings and optimizer state."""
    from . import losses, metrics, optimizers
    from .models import Sequential

    filepath = os.fspath(filepath)
    files = _read_model_files(filepath)
    for required in ("config.json", "model.safetensors"):
        if required not in files:
            raise SavingError(f"{filepath} has no {required}; it is not a model saved by dnnbind")
    try:
        config = json.loads(files["config.json"].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SavingError(f"{filepath}: config.json is corrupt: {exc}") from None
    if not isinstance(config, dict) or config.get("format") != _FORMAT:
        raise SavingError(f"{filepath}: config.json is not a dnnbind model config")
    if config.get("format_version", 0) > _FORMAT_VERSION:
        raise SavingError(f"{filepath} was written by a newer dnnbind (format {config['format_version']})")
    if config.get("class_name") != "Sequential":
        raise SavingError(f"{filepath}: unsupported model class {config.get('class_name')!r}")
    try:
        model = Sequential.from_config(config["config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SavingError(f"{filepath}: the model config cannot be rebuilt: {exc}") from exc
    if not model.built:
        raise SavingError(f"{filepath}: the saved model was never built, so it has no weights to load")
    _assign_tensors(model, _safetensors_load(files["model.safetensors"], f"{filepath}: model.safetensors"),
                    f"{filepath}: model.safetensors")
    compile_config = config.get("compile_config")
    if compile and compile_config:
        model.compile(optimizer=optimizers.get(compile_config["optimizer"]),
                      loss=losses.get(compile_config["loss"]),
                      metrics=[metrics.get(m) for m in compile_config.get("metrics", [])])
        if "optimizer.safetensors" in files:
            state = _safetensors_load(files["optimizer.safetensors"], f"{filepath}: optimizer.safetensors")
            params = [w.value for w in model.trainable_weights]
            try:
                model.optimizer.set_state(state, params)
            except ValueError as exc:
                raise SavingError(f"{filepath}: optimizer state does not fit the model: {exc}") from None
    return model
