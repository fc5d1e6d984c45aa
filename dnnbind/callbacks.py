"""Training callbacks with Keras 3 names and semantics, the progress bar, and History.

Batch-level ``logs`` are *lazy*: a value is read from the device only when a callback looks it
up. Callbacks that do not read batch logs (the default set) therefore cost no host
synchronisation per step; the progress bar reads them only when it redraws (at most ~20 times a
second on a terminal, once per epoch otherwise).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import sys
import time
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from . import event_file
from ._files import atomic_write
from .errors import DnnbindError

__all__ = [
    "Callback",
    "CallbackList",
    "History",
    "ProgbarLogger",
    "Progbar",
    "EarlyStopping",
    "ModelCheckpoint",
    "LearningRateScheduler",
    "ReduceLROnPlateau",
    "CSVLogger",
    "TerminateOnNaN",
    "LambdaCallback",
    "TensorBoard",
    "RemoteMonitor",
    "BackupAndRestore",
    "SwapEMAWeights",
    "LazyLogs",
    "MissingDependencyError",
]


class MissingDependencyError(DnnbindError, ImportError):
    """An optional dependency is not installed; the message names the pip extra."""


class LazyLogs(Mapping):
    """A read-only mapping whose values are computed (read from the device) on first access."""

    def __init__(self, thunks: "dict[str, Callable[[], float]]", base: Mapping | None = None) -> None:
        self._thunks = dict(thunks)
        self._values: dict[str, Any] = dict(base or {})

    def __getitem__(self, key: str) -> Any:
        if key in self._values:
            return self._values[key]
        if key in self._thunks:
            value = self._thunks[key]()
            self._values[key] = value
            return value
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        yield from self._values
        yield from (k for k in self._thunks if k not in self._values)

    def __len__(self) -> int:
        return len(set(self._values) | set(self._thunks))

    def __repr__(self) -> str:
        return f"LazyLogs({sorted(self)})"


class Callback:
    """Base class: override any of the ``on_*`` hooks; ``self.model`` is the model being trained."""

    def __init__(self) -> None:
        self.model = None
        self.params: dict = {}

    def set_model(self, model) -> None:
        self.model = model

    def set_params(self, params: dict) -> None:
        self.params = params

    def on_train_begin(self, logs=None): ...
    def on_train_end(self, logs=None): ...
    def on_epoch_begin(self, epoch, logs=None): ...
    def on_epoch_end(self, epoch, logs=None): ...
    def on_batch_begin(self, batch, logs=None): ...
    def on_batch_end(self, batch, logs=None): ...

    def on_train_batch_begin(self, batch, logs=None):
        # Keras: on_batch_begin/on_batch_end are the older names of the training-batch hooks
        self.on_batch_begin(batch, logs=logs)

    def on_train_batch_end(self, batch, logs=None):
        self.on_batch_end(batch, logs=logs)

    def on_test_begin(self, logs=None): ...
    def on_test_end(self, logs=None): ...
    def on_test_batch_begin(self, batch, logs=None): ...
    def on_test_batch_end(self, batch, logs=None): ...
    def on_predict_begin(self, logs=None): ...
    def on_predict_end(self, logs=None): ...
    def on_predict_batch_begin(self, batch, logs=None): ...
    def on_predict_batch_end(self, batch, logs=None): ...


_HOOKS = [name for name in vars(Callback) if name.startswith("on_")]


class CallbackList(Callback):
    """Calls every hook on each callback in order."""

    def __init__(self, callbacks: Iterable[Callback] = (), model=None, params: dict | None = None) -> None:
        super().__init__()
        self.callbacks = list(callbacks)
        for cb in self.callbacks:
            if not isinstance(cb, Callback):
                raise TypeError(f"callbacks must be dnnbind.callbacks.Callback instances, got {type(cb).__name__}")
        if model is not None:
            self.set_model(model)
        if params is not None:
            self.set_params(params)

    def set_model(self, model):
        super().set_model(model)
        for cb in self.callbacks:
            cb.set_model(model)

    def set_params(self, params):
        super().set_params(params)
        for cb in self.callbacks:
            cb.set_params(params)

    def __getattribute__(self, name: str):
        if name in _HOOKS:
            callbacks = object.__getattribute__(self, "callbacks")

            # Keras always passes a logs dict, and LambdaCallback functions rely on it
            wants = 2 if ("epoch" in name or "batch" in name) else 1

            def call_all(*args, **kwargs):
                if len(args) < wants and "logs" not in kwargs:
                    args = (*args, {})
                for cb in callbacks:
                    getattr(cb, name)(*args, **kwargs)

            return call_all
        return object.__getattribute__(self, name)


# ----- History and plotting -------------------------------------------------------------------
class History(Callback):
    """Records epoch logs: ``history.history["loss"]``, ``history.epoch``; ``plot(path)`` draws them."""

    def __init__(self) -> None:
        super().__init__()
        self.history: dict[str, list[float]] = {}
        self.epoch: list[int] = []

    def on_train_begin(self, logs=None):
        self.epoch = []

    def on_epoch_end(self, epoch, logs=None):
        self.epoch.append(epoch)
        for key, value in (logs or {}).items():
            self.history.setdefault(key, []).append(value)

    def plot(self, path: "str | os.PathLike", metrics: "Iterable[str] | None" = None, dpi: int = 100) -> str:
        """Save the curves (one panel per quantity, train and ``val_`` together) to a PNG at ``path``.

        Needs matplotlib (``pip install "dnnbind[plot]"``); uses the non-interactive Agg backend.
        """
        try:
            import matplotlib

            matplotlib.use("Agg", force=False)
            from matplotlib.figure import Figure
        except ImportError as exc:
            raise MissingDependencyError(
                'History.plot needs matplotlib, which is not installed: pip install "dnnbind[plot]"'
            ) from exc
        names = list(metrics) if metrics is not None else [k for k in self.history if not k.startswith("val_")
                                                            and k not in ("learning_rate", "lr")]
        if not names:
            raise ValueError("History.plot: nothing to plot (train first, or name the metrics to plot)")
        fig = Figure(figsize=(5 * len(names), 4))
        epochs = [e + 1 for e in self.epoch] or list(range(1, len(self.history[names[0]]) + 1))
        for i, name in enumerate(names, start=1):
            ax = fig.add_subplot(1, len(names), i)
            if name not in self.history:
                raise ValueError(f"History.plot: no '{name}' in history; recorded: {', '.join(self.history)}")
            ax.plot(epochs[: len(self.history[name])], self.history[name], marker="o", label=name)
            val = self.history.get(f"val_{name}")
            if val:
                ax.plot(epochs[: len(val)], val, marker="o", label=f"val_{name}")
            ax.set_xlabel("epoch")
            ax.set_title(name)
            ax.grid(True, alpha=0.3)
            ax.legend()
        fig.tight_layout()
        path = os.fspath(path)
        with atomic_write(path) as fh:
            fig.savefig(fh, format="png", dpi=dpi)
        return path


# ----- progress bar ---------------------------------------------------------------------------
_BAR = "\u2501"  # "━", Keras 3's bar character
_ASCII_BAR = "="  # where the output encoding cannot write it (Keras's io_utils does the same)
_BOLD, _GREEN, _GREY, _RESET = "\x1b[1m", "\x1b[32m", "\x1b[37m", "\x1b[0m"
_clock = time.perf_counter  # seconds; a module attribute so tests can drive it


def _format_value(value: Any) -> str:
    """Keras 3: four decimals, or scientific notation at or below 1e-3 in magnitude."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{v:.4f}" if abs(v) > 1e-3 else f"{v:.4e}"


def _format_eta(seconds: float) -> str:
    """Keras 3's ETA: ``1:02:03`` past an hour, ``2:03`` past a minute, else ``45s``."""
    if seconds > 3600:
        return f"{int(seconds // 3600)}:{int(seconds % 3600 // 60):02d}:{int(seconds % 60):02d}"
    if seconds > 60:
        return f"{int(seconds // 60)}:{int(seconds % 60):02d}"
    return f"{int(seconds)}s"


def _format_per_step(seconds: float, unit: str) -> str:
    if seconds >= 1 or seconds == 0:
        return f"{seconds:.0f}s/{unit}"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.0f}ms/{unit}"
    return f"{seconds * 1e6:.0f}us/{unit}"


def _can_encode(stream, text: str) -> bool:
    encoding = getattr(stream, "encoding", None)
    if not encoding:
        return True  # io.StringIO and friends hold str
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


class Progbar:
    """Keras 3's progress bar (``keras.utils.Progbar``).

    ``verbose=1`` on a terminal redraws one line with ``\\r`` at most every ``interval`` seconds::

        12/469 ━━━━━━━━━━━━━━━━━━━━ 1s 3ms/step - accuracy: 0.9100 - loss: 0.2900

    (steps done/target, the bar of ``width`` characters, the ETA, the time per step, the
    metrics) with Keras's colours, and ends with the same line giving the elapsed seconds
    instead of the ETA. Written to a file or a pipe, ``verbose=1`` writes only that final line
    (Keras rewrites the line there too, filling logs with carriage returns). ``verbose=2``
    writes one line when finished: ``469/469 - 5s - 3ms/step - accuracy: 0.9100 - loss: 0.2900``.
    ``target=None`` (unknown length) counts up (``    37/Unknown``).

    ``values`` is a mapping, a list of ``(name, value)`` pairs (Keras), or a callable returning
    either; it is read only when something is drawn, since reading a device metric costs a
    synchronisation. Values are shown as given: dnnbind's logs are already the epoch's running
    means, so ``stateful_metrics`` (accepted for Keras compatibility) changes nothing. The time per
    step leaves out the first step (compilation, capture), as Keras.
    """

    def __init__(self, target: int | None, width: int = 20, verbose: int = 1, interval: float = 0.05,
                 stateful_metrics: Iterable[str] | None = None, unit_name: str = "step", *,
                 stream=None) -> None:
        self.target = target
        self.width = int(width)
        self.verbose = verbose
        self.interval = float(interval)
        self.stateful_metrics = set(stateful_metrics or ())
        self.unit_name = unit_name
        self.stream = stream if stream is not None else sys.stdout
        isatty = getattr(self.stream, "isatty", None)
        self.dynamic = bool(isatty and isatty()) and verbose == 1
        self._bar_char = _BAR if _can_encode(self.stream, _BAR) else _ASCII_BAR
        self._start = _clock()
        self._time_after_first_step: float | None = None
        self._last_draw = 0.0
        self._drawn_width = 0
        self._seen = 0

    # ----- pieces of a line
    def _counter(self, current: int) -> str:
        if not self.target:
            return f"{current:7d}/Unknown"
        return f"{current:>{len(str(self.target))}d}/{self.target}"

    def _bar(self, current: int) -> str:
        """The bar, with Keras's colours on a terminal (green done, grey to do)."""
        if not self.target:
            return ""
        done = max(min(int(self.width * current / self.target), self.width), 0)
        filled, rest = self._bar_char * done, self._bar_char * (self.width - done)
        if not self.dynamic:
            return filled + rest
        return (f"{_GREEN}{filled}{_RESET}" if filled else "") + f"{_GREY}{rest}{_RESET}"

    def _bold(self, text: str) -> str:
        return f"{_BOLD}{text}{_RESET}" if self.dynamic else text

    @staticmethod
    def _metrics(values: Any) -> str:
        if callable(values):
            values = values()
        items = values.items() if isinstance(values, Mapping) else (values or ())
        return "".join(f" - {k}: {_format_value(v)}" for k, v in items)

    def _per_step(self, current: int, now: float) -> float:
        """Seconds per step, leaving out the first step once there are others (Keras)."""
        if not current:
            return 0.0
        if self._time_after_first_step is not None and current > 1:
            per = (now - self._time_after_first_step) / (current - 1)
        else:
            per = (now - self._start) / current
        if current == 1 and self._time_after_first_step is None:
            self._time_after_first_step = now
        return per

    # ----- public
    def update(self, current: int, values: Any = None, finalize: bool | None = None) -> None:
        """Report ``current`` steps done; ``finalize`` (default: ``current >= target``) ends the line."""
        if finalize is None:
            finalize = self.target is not None and current >= self.target
        self._seen = current
        now = _clock()
        per = self._per_step(current, now)
        if self.verbose == 0:
            return
        if self.verbose == 2:
            if finalize:
                line = (f"{self._counter(current)} - {now - self._start:.0f}s - "
                        f"{_format_per_step(per, self.unit_name)}{self._metrics(values)}")
                self._write(line + "\n")
            return
        if not finalize and (not self.dynamic or now - self._last_draw < self.interval):
            return
        self._last_draw = now
        if finalize:
            timing = f"{now - self._start:.0f}s"
        else:
            timing = _format_eta(per * (self.target - current)) if self.target else f"{now - self._start:.0f}s"
        bar = self._bar(current)
        line = (f"{self._bold(self._counter(current))}{' ' + bar if bar else ''} {self._bold(timing)} "
                f"{_format_per_step(per, self.unit_name)}{self._metrics(values)}")
        width = len(_strip_ansi(line))
        padding = " " * max(self._drawn_width - width, 0)
        self._write(("\r" if self.dynamic else "") + line + padding + ("\n" if finalize else ""))
        self._drawn_width = 0 if finalize else width

    def add(self, n: int, values: Any = None) -> None:
        """``update(seen + n, values)``, as Keras."""
        self.update(self._seen + n, values)

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _log_order(key: str) -> tuple:
    """Keras 3's order: the model's logs sorted by name (``val_`` ones after), what callbacks add
    (the learning rate) last."""
    return (key in ("learning_rate", "lr"), key.startswith("val_"), key)


class ProgbarLogger(Callback):
    """Keras 3's ``ProgbarLogger``: ``Epoch i/n`` (when ``epochs > 1``) and a :class:`Progbar` per
    epoch during ``fit`` (silent during its validation), one for ``evaluate`` and ``predict``.

    ``verbose``: 1 a live bar, 2 one line per epoch; None takes the model's ``params["verbose"]``
    (``"auto"`` is 1). ``stream`` defaults to ``sys.stdout``. Batch logs are read only when the
    bar redraws.
    """

    def __init__(self, verbose: int | None = None, stream=None) -> None:
        super().__init__()
        self.verbose = verbose
        self.stream = stream
        self.epochs = 1
        self.target: int | None = None
        self.seen = 0
        self._bar: Progbar | None = None
        self._called_in_fit = False

    def set_params(self, params):
        super().set_params(params)
        self.epochs = params.get("epochs") or 1
        self.target = params.get("steps")

    def _verbosity(self) -> int:
        verbose = self.verbose if self.verbose is not None else self.params.get("verbose", 1)
        return 1 if verbose == "auto" else int(verbose or 0)

    def _out(self):
        return self.stream if self.stream is not None else sys.stdout

    def _new_bar(self) -> None:
        self.seen = 0
        self._bar = Progbar(self.target, verbose=self._verbosity(), stream=self._out())

    def _update(self, batch: int, logs) -> None:
        self.seen = batch + 1
        if self._bar is None:
            self._new_bar()
        if self._bar.verbose == 1:
            # a callable: the bar reads the values (a device sync) only when it redraws a live line
            logs = logs if logs is not None else {}
            self._bar.update(self.seen, lambda: {k: logs[k] for k in sorted(logs, key=_log_order)},
                             finalize=False)

    def _finalize(self, logs) -> None:
        if self._bar is None:
            self._new_bar()
        if self._bar.target is None:
            self._bar.target = self.seen
        logs = dict(logs or {})
        self._bar.update(self._bar.target, {k: logs[k] for k in sorted(logs, key=_log_order)}, finalize=True)
        self._bar = None

    def on_train_begin(self, logs=None):
        self._called_in_fit = True

    def on_train_end(self, logs=None):
        self._called_in_fit = False

    def on_epoch_begin(self, epoch, logs=None):
        self._new_bar()
        if self._verbosity() and self.epochs > 1:
            out = self._out()
            out.write(f"Epoch {epoch + 1}/{self.epochs}\n")
            out.flush()

    def on_train_batch_end(self, batch, logs=None):
        self._update(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._finalize(logs)

    def on_test_begin(self, logs=None):
        if not self._called_in_fit:
            self._new_bar()

    def on_test_batch_end(self, batch, logs=None):
        if not self._called_in_fit:
            self._update(batch, logs)

    def on_test_end(self, logs=None):
        if not self._called_in_fit:
            self._finalize(logs)

    def on_predict_begin(self, logs=None):
        self._new_bar()

    def on_predict_batch_end(self, batch, logs=None):
        self._update(batch, None)  # never the predictions

    def on_predict_end(self, logs=None):
        self._finalize(None)


# ----- monitoring helpers -----------------------------------------------------------------------
def _monitor_mode(cls: str, mode: str, monitor: str) -> str:
    if mode not in ("auto", "min", "max"):
        warnings.warn(f"{cls}: mode {mode!r} is unknown, falling back to 'auto'", stacklevel=3)
        mode = "auto"
    if mode == "auto":
        name = monitor.removeprefix("val_")
        return "max" if ("acc" in name or name.startswith(("auc", "precision", "recall", "f1"))) else "min"
    return mode


def _as_float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class EarlyStopping(Callback):
    """Stop when ``monitor`` has not improved by ``min_delta`` for ``patience`` epochs (Keras 3 rules)."""

    def __init__(self, monitor: str = "val_loss", min_delta: float = 0.0, patience: int = 0, verbose: int = 0,
                 mode: str = "auto", baseline: float | None = None, restore_best_weights: bool = False,
                 start_from_epoch: int = 0) -> None:
        super().__init__()
        self.monitor = monitor
        self.patience = int(patience)
        self.verbose = verbose
        self.baseline = baseline
        self.min_delta = abs(float(min_delta))
        self.restore_best_weights = restore_best_weights
        self.start_from_epoch = int(start_from_epoch)
        self.mode = _monitor_mode("EarlyStopping", mode, monitor)
        self.best_weights = None
        self.stopped_epoch = 0

    def _improved(self, value: float, reference: float | None) -> bool:
        if reference is None:
            return True
        if self.mode == "max":
            return value - self.min_delta > reference
        return value + self.min_delta < reference

    def on_train_begin(self, logs=None):
        self.wait = 0
        self.stopped_epoch = 0
        self.best = None
        self.best_weights = None
        self.best_epoch = 0

    def on_epoch_end(self, epoch, logs=None):
        current = _as_float((logs or {}).get(self.monitor))
        if current is None:
            warnings.warn(f"EarlyStopping: metric '{self.monitor}' is not available; available: "
                          f"{', '.join(logs or {})}", stacklevel=2)
            return
        if epoch < self.start_from_epoch:
            return
        if self.restore_best_weights and self.best_weights is None:
            self.best_weights = self.model.get_weights()
        self.wait += 1
        if self._improved(current, self.best):
            self.best = current
            self.best_epoch = epoch
            if self.restore_best_weights:
                self.best_weights = self.model.get_weights()
            if self.baseline is None or self._improved(current, self.baseline):
                self.wait = 0
            return
        if self.wait >= self.patience and epoch > 0:
            self.stopped_epoch = epoch
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        if self.stopped_epoch > 0 and self.verbose:
            print(f"Epoch {self.stopped_epoch + 1}: early stopping")
        if self.restore_best_weights and self.best_weights is not None:
            if self.verbose:
                print(f"Restoring model weights from the end of the best epoch: {self.best_epoch + 1}.")
            self.model.set_weights(self.best_weights)


class ModelCheckpoint(Callback):
    """Save the model (or its weights) after each epoch, or every ``save_freq`` training batches (an int,
    as Keras); ``filepath`` may hold ``{epoch:02d}``, ``{val_loss:.2f}`` and other log keys (``{batch}``
    too with an int ``save_freq``)."""

    def __init__(self, filepath: "str | os.PathLike", monitor: str = "val_loss", verbose: int = 0,
                 save_best_only: bool = False, save_weights_only: bool = False, mode: str = "auto",
                 save_freq: "str | int" = "epoch", initial_value_threshold: float | None = None) -> None:
        super().__init__()
        if save_freq != "epoch" and (isinstance(save_freq, bool) or not isinstance(save_freq, int)
                                     or save_freq < 1):
            raise ValueError(f"ModelCheckpoint: save_freq must be 'epoch' or a positive int (batches), got "
                             f"{save_freq!r}")
        self.save_freq = save_freq
        self._batches_seen = 0
        self._epoch = 0
        self.filepath = os.fspath(filepath)
        self.monitor = monitor
        self.verbose = verbose
        self.save_best_only = save_best_only
        self.save_weights_only = save_weights_only
        self.mode = _monitor_mode("ModelCheckpoint", mode, monitor)
        self.best = initial_value_threshold

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.save_freq == "epoch":
            return
        self._batches_seen += 1
        if self._batches_seen % self.save_freq == 0:
            self._save(self._epoch, logs, batch=batch)

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq == "epoch":
            self._save(epoch, logs)

    def _save(self, epoch, logs, batch=None):
        # a batch's logs may hold tensors: the format specs ({loss:.2f}) take their float values
        logs = {k: v if isinstance(v, (int, float)) or _as_float(v) is None else _as_float(v)
                for k, v in dict(logs or {}).items()}
        if batch is not None:
            logs.setdefault("batch", batch)
        try:
            path = self.filepath.format(epoch=epoch + 1, **logs)
        except KeyError as exc:
            raise KeyError(f"ModelCheckpoint: filepath {self.filepath!r} names {exc} which is not in the logs "
                           f"({', '.join(logs)})") from None
        if self.save_best_only:
            current = _as_float(logs.get(self.monitor))
            if current is None:
                warnings.warn(f"ModelCheckpoint: can save best model only with '{self.monitor}' available",
                              stacklevel=2)
                return
            better = self.best is None or (current > self.best if self.mode == "max" else current < self.best)
            if not better:
                if self.verbose:
                    print(f"\nEpoch {epoch + 1}: {self.monitor} did not improve from {self.best:.5f}")
                return
            if self.verbose:
                print(f"\nEpoch {epoch + 1}: {self.monitor} improved to {current:.5f}, saving model to {path}")
            self.best = current
        elif self.verbose:
            print(f"\nEpoch {epoch + 1}: saving model to {path}")
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        if self.save_weights_only:
            self.model.save_weights(path)
        else:
            self.model.save(path)


class LearningRateScheduler(Callback):
    """At each epoch start, set the learning rate to ``schedule(epoch, lr)`` (or ``schedule(epoch)``)."""

    def __init__(self, schedule: Callable, verbose: int = 0) -> None:
        super().__init__()
        self.schedule = schedule
        self.verbose = verbose

    def on_epoch_begin(self, epoch, logs=None):
        opt = self.model.optimizer
        lr = opt.learning_rate
        try:
            new = self.schedule(epoch, lr)
        except TypeError:
            new = self.schedule(epoch)
        new_f = _as_float(new)
        if new_f is None or not math.isfinite(new_f):
            raise ValueError(f"LearningRateScheduler: the schedule must return a finite float, got {new!r}")
        opt.learning_rate = new_f
        if self.verbose:
            print(f"\nEpoch {epoch + 1}: LearningRateScheduler setting learning rate to {new_f}.")

    def on_epoch_end(self, epoch, logs=None):
        if isinstance(logs, dict):
            logs["learning_rate"] = float(self.model.optimizer.learning_rate)


class ReduceLROnPlateau(Callback):
    """Multiply the learning rate by ``factor`` when ``monitor`` stalls for ``patience`` epochs."""

    def __init__(self, monitor: str = "val_loss", factor: float = 0.1, patience: int = 10, verbose: int = 0,
                 mode: str = "auto", min_delta: float = 1e-4, cooldown: int = 0, min_lr: float = 0.0,
                 **kwargs) -> None:
        super().__init__()
        if "epsilon" in kwargs:
            min_delta = kwargs.pop("epsilon")
        if kwargs:
            raise TypeError(f"ReduceLROnPlateau: unexpected argument(s) {', '.join(kwargs)}")
        if factor >= 1.0:
            raise ValueError(f"ReduceLROnPlateau does not support a factor >= 1.0, got {factor}")
        self.monitor = monitor
        self.factor = float(factor)
        self.patience = int(patience)
        self.verbose = verbose
        self.mode = _monitor_mode("ReduceLROnPlateau", mode, monitor)
        self.min_delta = float(min_delta)
        self.cooldown = int(cooldown)
        self.min_lr = float(min_lr)
        self._reset()

    def _reset(self):
        self.wait = 0
        self.cooldown_counter = 0
        self.best = -np.inf if self.mode == "max" else np.inf

    def _better(self, a: float, b: float) -> bool:
        return a > b + self.min_delta if self.mode == "max" else a < b - self.min_delta

    def on_train_begin(self, logs=None):
        self._reset()

    def on_epoch_end(self, epoch, logs=None):
        opt = self.model.optimizer
        if isinstance(logs, dict):
            logs["learning_rate"] = float(opt.learning_rate)
        current = _as_float((logs or {}).get(self.monitor))
        if current is None:
            warnings.warn(f"ReduceLROnPlateau: metric '{self.monitor}' is not available; available: "
                          f"{', '.join(logs or {})}", stacklevel=2)
            return
        in_cooldown = self.cooldown_counter > 0
        if in_cooldown:
            self.cooldown_counter -= 1
            self.wait = 0
        if self._better(current, self.best):
            self.best = current
            self.wait = 0
        elif not in_cooldown:
            self.wait += 1
            if self.wait >= self.patience:
                old = float(opt.learning_rate)
                if old > self.min_lr:
                    new = max(old * self.factor, self.min_lr)
                    opt.learning_rate = new
                    if self.verbose:
                        print(f"\nEpoch {epoch + 1}: ReduceLROnPlateau reducing learning rate to {new}.")
                    self.cooldown_counter = self.cooldown
                    self.wait = 0


class CSVLogger(Callback):
    """Write each epoch's logs to a CSV file (columns: ``epoch`` then the log keys, sorted)."""

    def __init__(self, filename: "str | os.PathLike", separator: str = ",", append: bool = False) -> None:
        super().__init__()
        self.filename = os.fspath(filename)
        self.sep = separator
        self.append = append
        self._file = None
        self._writer = None
        self._keys: list[str] | None = None

    def on_train_begin(self, logs=None):
        has_content = self.append and os.path.exists(self.filename) and os.path.getsize(self.filename) > 0
        self._write_header = not has_content
        self._file = open(self.filename, "a" if self.append else "w", newline="", encoding="utf-8")
        self._writer = None
        self._keys = None

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        if self._keys is None:
            self._keys = sorted(logs)
        if self._writer is None:
            self._writer = csv.DictWriter(self._file, fieldnames=["epoch", *self._keys], delimiter=self.sep)
            if self._write_header:
                self._writer.writeheader()
        row = {"epoch": epoch}
        row.update({k: logs.get(k, "NA") for k in self._keys})
        self._writer.writerow(row)
        self._file.flush()

    def on_train_end(self, logs=None):
        if self._file is not None:
            self._file.close()
            self._file = None
            self._writer = None


class TerminateOnNaN(Callback):
    """Stop training when a batch loss is NaN or infinite (reads the loss each batch: one sync per step)."""

    def on_train_batch_end(self, batch, logs=None):
        loss = _as_float((logs or {}).get("loss"))
        if loss is not None and not math.isfinite(loss):
            print(f"Batch {batch}: Invalid loss, terminating training")
            self.model.stop_training = True


class LambdaCallback(Callback):
    """A callback from plain functions: ``LambdaCallback(on_epoch_end=lambda epoch, logs: ...)``."""

    def __init__(self, on_epoch_begin=None, on_epoch_end=None, on_train_begin=None, on_train_end=None,
                 on_train_batch_begin=None, on_train_batch_end=None, **kwargs) -> None:
        super().__init__()
        hooks = dict(on_epoch_begin=on_epoch_begin, on_epoch_end=on_epoch_end, on_train_begin=on_train_begin,
                     on_train_end=on_train_end, on_train_batch_begin=on_train_batch_begin,
                     on_train_batch_end=on_train_batch_end)
        # Keras also accepts on_batch_begin/on_batch_end and the test/predict hooks
        for key, fn in kwargs.items():
            name = {"on_batch_begin": "on_train_batch_begin", "on_batch_end": "on_train_batch_end"}.get(key, key)
            if name not in _HOOKS:
                raise TypeError(f"LambdaCallback: unknown hook {key!r}")
            hooks[name] = fn
        for name, fn in hooks.items():
            if fn is not None:
                setattr(self, name, fn)


def _scalar_logs(logs: Any) -> dict[str, float]:
    out = {}
    for key, value in dict(logs or {}).items():
        number = _as_float(value)
        if number is not None:
            out[key] = number
    return out


class TensorBoard(Callback):
    """Keras's ``TensorBoard`` for scalars: event files TensorBoard reads (written by :mod:`dnnbind.event_file`,
    no TensorFlow), under ``log_dir/train`` and ``log_dir/validation``.

    Each epoch writes ``epoch_<metric>`` (and ``epoch_learning_rate``) at step ``epoch`` (the ``val_`` metrics,
    without the prefix, to ``validation``); ``update_freq=N`` also writes ``batch_<metric>`` every ``N``
    training batches at the global batch count; an evaluation inside ``fit`` writes
    ``evaluation_<metric>_vs_iterations`` at the optimizer's step. Histograms, images, graphs, embeddings and
    profiling are not written (a warning says so when they are asked for)."""

    def __init__(self, log_dir: "str | os.PathLike" = "logs", histogram_freq: int = 0, write_graph: bool = True,
                 write_images: bool = False, write_steps_per_second: bool = False, update_freq: "str | int" = "epoch",
                 profile_batch: Any = 0, embeddings_freq: int = 0, embeddings_metadata: Any = None) -> None:
        super().__init__()
        if update_freq not in ("epoch", "batch") and (isinstance(update_freq, bool) or not isinstance(update_freq, int)
                                                      or update_freq < 1):
            raise ValueError(f"TensorBoard: update_freq must be 'epoch', 'batch' or a positive int, got "
                             f"{update_freq!r}")
        ignored = [name for name, value in (("histogram_freq", histogram_freq), ("write_images", write_images),
                                            ("embeddings_freq", embeddings_freq), ("profile_batch", profile_batch))
                   if value]
        if ignored:
            warnings.warn(f"TensorBoard: dnnbind writes scalars only; {', '.join(ignored)} ignored", UserWarning,
                          stacklevel=2)
        self.log_dir = os.fspath(log_dir)
        self.update_freq = 1 if update_freq == "batch" else update_freq
        self.write_steps_per_second = bool(write_steps_per_second)
        self._train = event_file.EventFileWriter(os.path.join(self.log_dir, "train"))
        self._val = event_file.EventFileWriter(os.path.join(self.log_dir, "validation"))
        self._batches = 0
        self._epoch_start = 0.0
        self._in_fit = False

    def on_train_begin(self, logs=None):
        self._in_fit = True
        self._batches = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.perf_counter()
        self._epoch_batches = 0

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        self._epoch_batches = getattr(self, "_epoch_batches", 0) + 1
        if self.update_freq != "epoch" and self._batches % self.update_freq == 0:
            scalars = {f"batch_{k}": v for k, v in _scalar_logs(logs).items()}
            if scalars:
                self._train.add_scalars(scalars, self._batches)

    def on_epoch_end(self, epoch, logs=None):
        values = _scalar_logs(logs)
        train = {f"epoch_{k}": v for k, v in values.items() if not k.startswith("val_")}
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and "epoch_learning_rate" not in train:
            train["epoch_learning_rate"] = float(optimizer.learning_rate)
        if self.write_steps_per_second:
            seconds = time.perf_counter() - self._epoch_start
            train["epoch_steps_per_second"] = getattr(self, "_epoch_batches", 0) / seconds if seconds > 0 else 0.0
        self._train.add_scalars(train, epoch)
        val = {f"epoch_{k[4:]}": v for k, v in values.items() if k.startswith("val_")}
        if val:
            self._val.add_scalars(val, epoch)

    def on_test_end(self, logs=None):
        optimizer = getattr(self.model, "optimizer", None)
        if self._in_fit and optimizer is not None:
            scalars = {f"evaluation_{k}_vs_iterations": v for k, v in _scalar_logs(logs).items()}
            if scalars:
                self._val.add_scalars(scalars, int(optimizer.iterations))

    def on_train_end(self, logs=None):
        self._in_fit = False
        self._train.close()
        self._val.close()


class RemoteMonitor(Callback):
    """Keras's ``RemoteMonitor``: POST ``{"epoch": epoch, **logs}`` to ``root + path`` at each epoch end, as JSON
    (``send_as_json``) or as a form field ``field`` holding the JSON (urllib; no extra dependency). A server that
    cannot be reached gives a warning, not an error, as in Keras."""

    def __init__(self, root: str = "http://localhost:9000", path: str = "/publish/epoch/end/", field: str = "data",
                 headers: "dict | None" = None, send_as_json: bool = False, timeout: float = 10.0) -> None:
        super().__init__()
        self.root, self.path, self.field = root, path, field
        self.headers = dict(headers or {})
        self.send_as_json = bool(send_as_json)
        self.timeout = float(timeout)

    def on_epoch_end(self, epoch, logs=None):
        import urllib.error  # (deferred: only this callback talks to the network)
        import urllib.parse
        import urllib.request

        send = {"epoch": epoch}
        for key, value in dict(logs or {}).items():
            number = _as_float(value)
            send[key] = number if number is not None else value
        if self.send_as_json:
            body, content_type = json.dumps(send).encode("utf-8"), "application/json"
        else:
            body = urllib.parse.urlencode({self.field: json.dumps(send)}).encode("utf-8")
            content_type = "application/x-www-form-urlencoded"
        request = urllib.request.Request(self.root + self.path, data=body, method="POST",
                                         headers={"Content-Type": content_type, **self.headers})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                response.read()
        except (urllib.error.URLError, OSError) as exc:
            warnings.warn(f"Could not reach RemoteMonitor root server at {self.root} ({exc})", UserWarning,
                          stacklevel=2)


class BackupAndRestore(Callback):
    """Keras's ``BackupAndRestore``: after every epoch (or every ``save_freq`` batches) the model's weights, its
    optimizer's state and the position in training are written to ``backup_dir`` (safetensors and JSON, each
    file replaced atomically; no pickle). When ``fit`` starts and a backup is there, it is restored and training
    resumes after the last backed-up epoch; a ``fit`` that finishes deletes the backup (unless
    ``delete_checkpoint=False``). ``double_checkpoint`` keeps the previous backup too, used if the latest one
    cannot be read."""

    def __init__(self, backup_dir: "str | os.PathLike", save_freq: "str | int" = "epoch",
                 double_checkpoint: bool = False, delete_checkpoint: bool = True) -> None:
        super().__init__()
        if not backup_dir:
            raise ValueError("BackupAndRestore: backup_dir must be a directory path, got an empty value")
        if save_freq != "epoch" and (isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1):
            raise ValueError(f"Invalid value for argument `save_freq`. Received: save_freq={save_freq}. "
                             "Expected either 'epoch' or an integer value.")
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq = save_freq
        self.double_checkpoint = bool(double_checkpoint)
        self.delete_checkpoint = bool(delete_checkpoint)
        self._batches = 0
        self._current_epoch = 0

    def _paths(self, which: str = "latest") -> dict[str, str]:
        d = os.path.join(self.backup_dir, which)
        return {"dir": d, "weights": os.path.join(d, "model.weights.safetensors"),
                "optimizer": os.path.join(d, "optimizer.safetensors"), "meta": os.path.join(d, "training.json")}

    def _save(self, epoch: int, batch: "int | None") -> None:
        from safetensors.numpy import save  # (deferred: safetensors is only needed when a backup is written)
        latest = self._paths("latest")
        if self.double_checkpoint and os.path.isfile(latest["meta"]):
            previous = self._paths("previous")
            os.makedirs(previous["dir"], exist_ok=True)
            for key in ("weights", "optimizer", "meta"):
                if os.path.isfile(latest[key]):
                    os.replace(latest[key], previous[key])
        os.makedirs(latest["dir"], exist_ok=True)
        self.model.save_weights(latest["weights"])
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and optimizer.built:
            state = {k: np.ascontiguousarray(np.asarray(v)).reshape(np.shape(v)) for k, v in optimizer.get_state().items()}
            with atomic_write(latest["optimizer"]) as f:
                f.write(save(state))
        with atomic_write(latest["meta"], "w") as f:
            json.dump({"epoch": int(epoch), "batch": batch, "format": "dnnbind.backup", "version": 1}, f)

    def _restore(self, which: str) -> bool:
        from safetensors.numpy import load  # (deferred: as above)
        paths = self._paths(which)
        if not os.path.isfile(paths["meta"]):
            return False
        with open(paths["meta"]) as f:
            meta = json.load(f)
        self.model.load_weights(paths["weights"])
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and os.path.isfile(paths["optimizer"]):
            with open(paths["optimizer"], "rb") as f:
                state = load(f.read())
            optimizer.set_state(state, [w.value for w in self.model.trainable_weights])
        epoch, batch = int(meta["epoch"]), meta.get("batch")
        # a backup taken at an epoch's end resumes with the next epoch; one taken mid-epoch redoes that epoch
        self.model._initial_epoch = epoch + 1 if batch is None else epoch
        return True

    def on_train_begin(self, logs=None):
        if not self.model.built:
            raise ValueError("To use the BackupAndRestore callback, you model must be built before you call `fit()`. "
                             f"Model {self.model.name} is unbuilt. You can build it beforehand by calling it on a "
                             "batch of data.")
        self._batches = 0
        try:
            restored = self._restore("latest")
        except (OSError, ValueError, KeyError) as exc:
            if not self.double_checkpoint:
                raise
            warnings.warn(f"BackupAndRestore: the latest backup in {self.backup_dir} cannot be read ({exc}); "
                          "restoring the previous one", UserWarning, stacklevel=2)
            restored = self._restore("previous")
        return restored

    def on_epoch_begin(self, epoch, logs=None):
        self._current_epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        if self.save_freq != "epoch" and self._batches % self.save_freq == 0:
            self._save(self._current_epoch, batch)

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq == "epoch":
            self._save(epoch, None)

    def on_train_end(self, logs=None):
        if self.delete_checkpoint and os.path.isdir(self.backup_dir) and not getattr(self.model, "stop_training", False):
            import shutil  # (deferred: only a finished fit removes the backup)
            shutil.rmtree(self.backup_dir, ignore_errors=True)


class SwapEMAWeights(Callback):
    """Keras's ``SwapEMAWeights``: evaluate (and checkpoint) with the optimizer's exponential moving average of
    the weights. It needs an optimizer with ``use_ema=True``, which dnnbind's optimizers do not have yet: like
    Keras with such an optimizer, it raises ``ValueError`` when training starts."""

    def __init__(self, swap_on_epoch: bool = False) -> None:
        super().__init__()
        self.swap_on_epoch = bool(swap_on_epoch)

    def on_train_begin(self, logs=None):
        optimizer = getattr(self.model, "optimizer", None)
        if not getattr(optimizer, "use_ema", False):
            raise ValueError("SwapEMAWeights must be used when `use_ema=True` is set on the optimizer. Received: "
                             f"use_ema={getattr(optimizer, 'use_ema', False)} (dnnbind's optimizers do not keep "
                             "an EMA of the weights yet)")
