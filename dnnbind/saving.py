"""Saving and loading: safetensors weights, and whole models as a zip or a directory. No pickle.

* ``save_weights(model, path)`` / ``load_weights``: one safetensors file; tensors are named
  ``"<layer name>/<weight name>"`` (``"conv2d/kernel"``, ``"batch_normalization/moving_mean"``)
  and stored in Keras layouts.
* ``save_model(model, path)`` / ``load_model(path)``: ``path`` ending in ``.dnnbind`` or
  ``.keras`` (or ``.zip``) is a single zip file holding ``config.json`` (the model and layer
  configs, the compile config), ``model.safetensors`` and, when the model has an optimizer with
  state, ``optimizer.safetensors`` (to resume training). Any other path is a directory (below).

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
  plain ``config.json``/``model.safetensors``/``optimizer.safetensors`` of the earlier layout). A
  load checks every part's size and SHA-256 against the manifest before using any of them. Saves
  hold an exclusive ``flock`` on the directory and loads a shared one, so a concurrent save never
  deletes what a load is reading. A directory without ``manifest.json`` (written by dnnbind 0.1's
  first layout) is still read, unchecked.

Untrusted files: everything read is checked before it drives an allocation. Zip members and files
larger than the machine's memory are refused; a model config goes through the layers'
constructors (which check their arguments) and its weights are sized from the config alone
(:func:`check_weight_budget`) before any is created; tensors must be float (float16, bfloat16 and
float64 are cast to the variable dtype) with the right shape; tensors the model does not use are
named in a warning. Loading is all-or-nothing: every tensor (and the optimizer state) is checked
before the first is assigned.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import inspect
import json
import math
import os
import re
import secrets
import stat
import warnings
import zipfile
from typing import Any, Iterator, Sequence

import numpy as np

from .errors import AllocationTooLargeError, DnnbindError
from .layers.base import InputLayer, Layer, Weight
from .mixed_precision import numpy_dtype

try:
    import fcntl
except ImportError:  # not POSIX: directory checkpoints are still atomic, only unlocked
    fcntl = None

__all__ = ["save_weights", "load_weights", "save_model", "load_model", "atomic_write", "SavingError",
           "remove_stale_temporaries", "check_weight_budget"]

_FORMAT = "dnnbind.model"
_FORMAT_VERSION = 1
_ZIP_SUFFIXES = (".dnnbind", ".keras", ".zip")

_MANIFEST = "manifest.json"
_CHECKPOINT_FORMAT = "dnnbind.checkpoint"
_CHECKPOINT_VERSION = 1
_PARTS = ("config.json", "model.safetensors", "optimizer.safetensors")
_PART_FILE = re.compile(r"^(config|model|optimizer)\.[0-9a-f]{16}\.(json|safetensors)$")
_TEMP_FILE = re.compile(r"^\.(?P<target>.+)\.tmp-(?P<pid>[0-9]+)-[0-9a-f]+$")
_MANIFEST_MAX_BYTES = 1 << 20

# safetensors dtype names -> NumPy; BF16 needs ml_dtypes (safetensors.numpy cannot read it)
_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                       "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
                       "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool"}
_FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
_ADD_WEIGHT = inspect.signature(Layer.add_weight)  # how check_weight_budget reads a build's requests


class SavingError(DnnbindError):
    """A saved file is missing, corrupt, or does not fit the model."""


# ----- crash-safe files ---------------------------------------------------------------------------
def _temp_name(target_name: str) -> str:
    return f".{target_name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"


def _process_exists(pid: int) -> bool:
    if pid == os.getpid():
        return True  # another thread of this process may be writing it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's live process, or a pid we cannot judge: keep its file
    return True


def remove_stale_temporaries(directory: "str | os.PathLike", target_name: str | None = None) -> list[str]:
    """Delete the temporaries (``.<target>.tmp-<pid>-<random>``) in ``directory`` whose writer process
    no longer exists; only those of ``target_name`` when given. Returns the names removed.

    A temporary of a live process is never touched (its pid answers ``kill(pid, 0)``). Pids are
    per machine: on a directory shared by several machines, only use this where the writers are local.
    """
    directory = os.fspath(directory)
    removed = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        match = _TEMP_FILE.match(name)
        if match is None or (target_name is not None and match["target"] != target_name):
            continue
        if not _process_exists(int(match["pid"])):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))
                removed.append(name)
    return removed


def _fsync_directory(directory: str) -> None:
    """Make renames and new names in ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a directory; the rename is still atomic
    finally:
        os.close(fd)


def _existing_mode(path: str) -> int | None:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None


def _create_exclusive(path: str, mode: int | None) -> int:
    """A new file opened for writing: ``0666 & ~umask`` as ``open()`` would give, or ``mode``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    if mode is not None:
        try:
            os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            raise
    return fd


@contextlib.contextmanager
def atomic_write(path: "str | os.PathLike", mode: str = "wb") -> Iterator[Any]:
    """Open a temporary file next to ``path``; on success fsync it and rename it to ``path``
    (keeping the mode of the file it replaces), on failure delete it.

    The temporary is ``.<name>.tmp-<pid>-<random>``; stale ones of the same target left by dead
    processes are removed first. A symlink at ``path`` is written through, as ``open()`` does.
    """
    target = os.path.realpath(os.fspath(path))
    directory, name = os.path.split(target)
    os.makedirs(directory, exist_ok=True)
    remove_stale_temporaries(directory, name)
    tmp = os.path.join(directory, _temp_name(name))
    fd = _create_exclusive(tmp, _existing_mode(target))
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_directory(directory)


@contextlib.contextmanager
def _directory_lock(directory: str, exclusive: bool) -> Iterator[None]:
    """``flock`` on the directory itself (no lock file; the kernel drops it when the holder dies)."""
    if fcntl is None:
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # releases the lock


def _memory_bytes() -> int | None:
    """Physical memory of this machine, the bound for anything a file asks us to allocate."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _check_file_size(nbytes: int, what: str) -> None:
    limit = _memory_bytes()
    if limit is not None and nbytes > limit:
        raise SavingError(f"{what} is {nbytes:,} bytes, more than this machine's {limit:,} bytes of memory; "
                          "refusing to read it")


# ----- safetensors ------------------------------------------------------------------------------
def _safetensors_bytes(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> bytes:
    from safetensors.numpy import save

    return save({k: np.ascontiguousarray(v) for k, v in tensors.items()}, metadata=metadata)


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
        tensors[name] = np.frombuffer(info["data"], dtype=numpy_dtype(dtype_name)).reshape(info["shape"])
    return tensors


def _model_tensors(model) -> dict[str, np.ndarray]:
    model._require_built("save_weights")
    tensors: dict[str, np.ndarray] = {}
    for layer in model.layers:
        for w in layer._weights:
            if w.path in tensors:
                raise SavingError(f"two weights are named '{w.path}'; give the layers unique names")
            tensors[w.path] = w.numpy()
    return tensors


def _warn_unused(names: Sequence[str], source: str, what: str) -> None:
    if names:
        warnings.warn(f"{source}: {len(names)} tensor(s) not used by {what} were ignored: {', '.join(names)}",
                      UserWarning, stacklevel=4)


def _checked_weight_tensors(model, tensors: dict[str, np.ndarray], source: str) -> list[tuple[Weight, np.ndarray]]:
    """Match every weight of ``model`` with its tensor, checking name, shape and dtype; assigns nothing."""
    model._require_built("load_weights")
    plan = []
    for layer in model.layers:
        for w in layer._weights:
            owner = f"layer '{layer.name}' ({type(layer).__name__})"
            if w.path not in tensors:
                raise SavingError(f"{source} has no tensor '{w.path}' for {owner}; "
                                  f"it holds: {', '.join(sorted(tensors)) or 'nothing'}")
            arr = tensors[w.path]
            if tuple(arr.shape) != w.shape:
                raise SavingError(f"{source}: tensor '{w.path}' has shape {tuple(arr.shape)} but {owner} needs {w.shape}")
            if str(arr.dtype) not in _FLOAT_DTYPES:
                raise SavingError(f"{source}: tensor '{w.path}' has dtype {arr.dtype} but {owner} needs a float "
                                  f"tensor ({w.dtype}; float16, bfloat16 and float64 are cast)")
            if str(arr.dtype) == "bfloat16":
                arr = arr.astype(np.float32)  # exact; Weight.assign takes NumPy's numeric kinds (ml_dtypes' is 'V')
            plan.append((w, arr))
    used = {w.path for w, _ in plan}
    _warn_unused(sorted(set(tensors) - used), source, f"model '{model.name}'")
    return plan


def _assign_all(plan: list[tuple[Weight, np.ndarray]]) -> None:
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
    """Load weights saved by :func:`save_weights`: every layer's tensor must be present with its shape
    and a float dtype. All are checked before any is assigned, so a failure changes no weight."""
    filepath = os.fspath(filepath)
    if not os.path.isfile(filepath):
        raise FileNotFoundError(f"load_weights: no file at {filepath}")
    _check_file_size(os.path.getsize(filepath), filepath)
    with open(filepath, "rb") as fh:
        tensors = _safetensors_load(fh.read(), filepath)
    _assign_all(_checked_weight_tensors(model, tensors, filepath))


# ----- whole models -------------------------------------------------------------------------------
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
    paths, otherwise a directory with a checksummed manifest. Either is replaced as a whole."""
    filepath = os.fspath(filepath)
    if not overwrite and os.path.exists(filepath):
        raise FileExistsError(f"save: {filepath} exists and overwrite=False")
    is_zip = filepath.lower().endswith(_ZIP_SUFFIXES)
    if not is_zip and os.path.exists(filepath) and not os.path.isdir(filepath):
        raise SavingError(f"save: {filepath} exists and is not a directory (use a .dnnbind path for one file)")
    files = _model_files(model, include_optimizer)
    if is_zip:
        with atomic_write(filepath) as fh, zipfile.ZipFile(fh, "w", compression=zipfile.ZIP_STORED) as zf:
            for name, data in files.items():
                zf.writestr(name, data)
    else:
        _save_directory(filepath, files)


def _read_manifest(directory: str) -> dict | None:
    """The parsed, checked manifest of ``directory``; None when it has none."""
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
        manifest = json.loads(raw.decode("utf-8"))
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
    with _directory_lock(directory, exclusive=True):
        try:
            old = _read_manifest(directory)
        except SavingError:
            old = None  # a damaged checkpoint is replaced, not an obstacle to saving
        old_files = old["files"] if old else {}
        token = secrets.token_hex(8)
        entries = {}
        try:
            for part, data in files.items():
                stem, ext = part.split(".")
                name = f"{stem}.{token}.{ext}"
                # the part this one replaces keeps its mode (the previous save's, or the first layout's file)
                previous = old_files.get(part, {}).get("file", part)
                fd = _create_exclusive(os.path.join(directory, name),
                                       _existing_mode(os.path.join(directory, previous)))
                entries[part] = {"file": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
            _fsync_directory(directory)  # the new parts' names are durable before the manifest names them
            generation = old.get("generation", 0) if old else 0
            manifest = {"format": _CHECKPOINT_FORMAT, "format_version": _CHECKPOINT_VERSION,
                        "generation": (generation if type(generation) is int else 0) + 1, "files": entries}
            with atomic_write(os.path.join(directory, _MANIFEST)) as fh:  # the switch
                fh.write(json.dumps(manifest, indent=2).encode("utf-8"))
        except BaseException:
            try:
                switched = (_read_manifest(directory) or {}).get("files") == entries
            except SavingError:
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


def _read_directory(directory: str) -> dict[str, bytes]:
    with _directory_lock(directory, exclusive=False):
        manifest = _read_manifest(directory)
        if manifest is None:
            # the first directory layout: plain names, no checksums
            files = {}
            for part in _PARTS:
                path = os.path.join(directory, part)
                if os.path.isfile(path):
                    _check_file_size(os.path.getsize(path), path)
                    with open(path, "rb") as fh:
                        files[part] = fh.read()
            if "config.json" not in files:
                raise SavingError(f"{directory} has no {_MANIFEST}; it is not a model saved by dnnbind")
            return files
        files = {}
        for part, entry in manifest["files"].items():
            path = os.path.join(directory, entry["file"])
            try:
                fh = open(path, "rb")
            except FileNotFoundError:
                raise SavingError(f"{path} is missing but {_MANIFEST} lists it as {part}: the checkpoint is "
                                  "incomplete; refusing to load it") from None
            with fh:
                size = os.fstat(fh.fileno()).st_size
                if size != entry["size"]:
                    raise SavingError(f"{path} is {size:,} bytes but {_MANIFEST} says {entry['size']:,}: the "
                                      "checkpoint is corrupt or mixed; refusing to load it")
                data = fh.read(size)
            digest = hashlib.sha256(data).hexdigest()
            if digest != entry["sha256"]:
                raise SavingError(f"{path}: SHA-256 {digest} does not match {entry['sha256']} in {_MANIFEST}: the "
                                  "checkpoint is corrupt or mixed; refusing to load it")
            files[part] = data
        return files


def _read_model_files(filepath: str) -> dict[str, bytes]:
    if os.path.isdir(filepath):
        return _read_directory(filepath)
    if not os.path.isfile(filepath):
        raise FileNotFoundError(f"load_model: no file or directory at {filepath}")
    try:
        with zipfile.ZipFile(filepath) as zf:
            members = {info.filename: info for info in zf.infolist() if info.filename in _PARTS}
            for name, info in members.items():
                _check_file_size(info.file_size, f"{filepath}: {name}")
            return {name: zf.read(name) for name in members}  # zipfile checks each member's CRC-32
    except (zipfile.BadZipFile, OSError, EOFError, zipfile.LargeZipFile, NotImplementedError) as exc:
        raise SavingError(f"{filepath} is not a dnnbind model file (a zip with config.json and model.safetensors), "
                          f"or it is corrupt: {exc}") from None


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


def load_model(filepath: "str | os.PathLike", compile: bool = True, *, max_weight_bytes: int | None = None) -> Any:
    """Rebuild a model saved by ``model.save``: architecture, weights, compile settings and optimizer state.

    Every file is checked before it is used: a directory's parts against its manifest (size, SHA-256),
    the config's arguments by the layers, the weights' total size against ``max_weight_bytes``
    (default: the machine's physical memory) before any is allocated, and every tensor's name, shape
    and dtype before any is assigned. Raises :class:`SavingError` (or ``AllocationTooLargeError``).
    """
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
    version = config.get("format_version", 0)
    if type(version) is not int or version > _FORMAT_VERSION:
        raise SavingError(f"{filepath} was written by a newer dnnbind (format {version!r})")
    if config.get("class_name") != "Sequential":
        raise SavingError(f"{filepath}: unsupported model class {config.get('class_name')!r}")
    weights = _safetensors_load(files["model.safetensors"], f"{filepath}: model.safetensors")
    opt_state = None
    if compile and config.get("compile_config") and "optimizer.safetensors" in files:
        opt_state = _safetensors_load(files["optimizer.safetensors"], f"{filepath}: optimizer.safetensors")
    try:
        model = Sequential.from_config(config.get("config"), max_weight_bytes=max_weight_bytes)
    except AllocationTooLargeError as exc:
        raise AllocationTooLargeError(f"{filepath}: {exc}") from None
    except (KeyError, TypeError, ValueError, NotImplementedError) as exc:
        raise SavingError(f"{filepath}: the model config cannot be rebuilt: {exc}") from exc
    if not model.built:
        raise SavingError(f"{filepath}: the saved model was never built, so it has no weights to load")
    plan = _checked_weight_tensors(model, weights, f"{filepath}: model.safetensors")
    compile_config = config.get("compile_config")
    if compile and compile_config:
        try:
            model.compile(optimizer=optimizers.get(compile_config["optimizer"]),
                          loss=losses.get(compile_config["loss"]),
                          metrics=[metrics.get(m) for m in compile_config.get("metrics", [])])
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
    limit = max_bytes if max_bytes is not None else _memory_bytes()
    what_limit = "max_weight_bytes" if max_bytes is not None else "this machine's physical memory"
    total = 0
    shape = tuple(input_shape)
    for layer in layers:
        if isinstance(layer, InputLayer):
            continue
        if layer.built:  # its weights exist already, and a copy would duplicate them
            raise ValueError(f"{owner}: check_weight_budget sizes unbuilt layers; '{layer.name}' is built")
        probe = copy.deepcopy(layer)

        def add_weight(*args: Any, _probe: Layer = probe, **kwargs: Any) -> Weight:
            nonlocal total
            call = _ADD_WEIGHT.bind(_probe, *args, **kwargs)
            call.apply_defaults()
            a = call.arguments
            wshape = tuple(int(s) for s in a["shape"])
            label = f"{type(_probe).__name__} '{_probe.name}'"
            if any(d < 0 for d in wshape):
                raise ValueError(f"{label}: weight '{a['name']}' would have a negative shape {wshape}")
            dtype = numpy_dtype(a["dtype"] or _probe.variable_dtype)
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

        probe.add_weight = add_weight
        probe._ensure_built(shape)
        shape = tuple(probe.output_shape)
    return total
