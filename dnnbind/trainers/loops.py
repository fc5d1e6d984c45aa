"""The epoch loops of ``fit``, ``evaluate`` and ``predict``: arguments checked, feeds made, callbacks driven.

``Trainer.fit``/``evaluate``/``predict`` hold the public signatures and docstrings and call these with
the model first. Per batch a loop does what it did as a method: the callbacks' batch hooks, one
``model._step(kind, x, y, graph=...)`` (eager, or a CUDA-graph replay: :mod:`.step_graphs`), the
distribution's ``after_step`` and the loss scale's growth check when there are ones, and the lazy logs
(read from the device only when a callback or the progress bar asks). Nothing here waits for the device
but the end-of-epoch logs and ``predict``'s read-back after everything was queued.

Warnings raised in a loop count one more frame than when the loops were ``Trainer`` methods (the
public method's frame): their ``stacklevel`` points at the caller of ``fit``/``evaluate``/``predict``.
"""

from __future__ import annotations

import math
import sys
import warnings
from typing import Any, Sequence

import numpy as np

from .. import _validate, backend
from .. import callbacks as callbacks_module
from ..utils import draw_seed
from .data_adapters import ArrayDataAdapter, EpochIterator, data_kind
from .feeds import (KIND_WORDS, array_feed, check_batch_size_unused, check_class_weight, check_sample_weight,
                    check_x, check_xy, eval_feed, pack, refuse_both_weights, source_feed, split_tuple_x, unpack)

__all__ = ["fit", "evaluate", "predict", "run_test", "callback_list", "resolve_verbose"]

_F32 = np.dtype(np.float32)


def _is_tty(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # closed stream
        return False


def resolve_verbose(verbose: Any, owner: str, stream=None) -> int:
    if isinstance(verbose, str) and verbose == "auto":
        return 1 if _is_tty(stream if stream is not None else sys.stdout) else 2
    if isinstance(verbose, (bool, np.bool_)):
        return int(verbose)
    return int(_validate.one_of(verbose, "verbose", owner, ("auto", 0, 1, 2)))


def callback_list(model: Any, cb_list: list, verbose: int, steps: "int | None", **params: Any):
    """The callbacks of a fit/evaluate/predict call, with Keras's ProgbarLogger added when ``verbose``."""
    if verbose and not any(isinstance(c, callbacks_module.ProgbarLogger) for c in cb_list):
        cb_list = [*cb_list, callbacks_module.ProgbarLogger(verbose)]
    return callbacks_module.CallbackList(cb_list, model=model, params={"verbose": verbose, "steps": steps, **params})


def _fit_feeds(model: Any, owner: str, x: Any, y: Any, sample_weight: Any, class_weight: "dict | None", kind: str,
               batch_size: int, shuffle: bool, steps_per_epoch: "int | None", validation_split: float,
               validation_data: Any, validation_batch_size: "int | None", validation_steps: "int | None",
               shard: "tuple[int, int] | None") -> tuple[EpochIterator, "EpochIterator | None"]:
    """``fit``'s training feed and validation feed (None without validation), every array checked."""
    val_arrays = None
    if kind == "arrays":
        x, y, sample_weight = split_tuple_x(model, x, y, sample_weight, targets=True)
        refuse_both_weights(class_weight, sample_weight, owner)  # a weight inside the (x, y, w) tuple
        xs, ys = check_xy(model, x, y, "fit")
        n = len(xs[0])
        ws = check_sample_weight(model, sample_weight, n, ys, "fit")
        if validation_split and validation_data is None:
            split = int(n * (1.0 - validation_split))
            if split == 0 or split == n:
                raise ValueError(f"{owner}: validation_split={validation_split} leaves no training or no "
                                 f"validation samples out of {n}")
            cut = lambda arrays, part: None if arrays is None else [  # noqa: E731
                None if a is None else (a[:split] if part == 0 else a[split:]) for a in arrays]
            val_arrays = (cut(xs, 1), cut(ys, 1), cut(ws, 1))
            xs, ys, ws = cut(xs, 0), cut(ys, 0), cut(ws, 0)
        if class_weight is not None:
            ws = check_sample_weight(model, None, len(xs[0]), ys, "fit", class_weight)
        train_feed = array_feed(model, xs, ys, ws, batch_size, shuffle, steps_per_epoch, shard)
    else:
        train_feed = source_feed(model, x, y, sample_weight, kind, "fit", targets=True, shuffle=shuffle,
                                 steps=steps_per_epoch, class_weight=class_weight, shard=shard)
    val_feed = None
    if validation_data is not None:
        val_feed = eval_feed(model, validation_data, None, None, "fit (validation_data)",
                             validation_batch_size or batch_size, validation_steps, unpack=True, shard=shard)
    elif val_arrays is not None:
        val_feed = array_feed(model, *val_arrays, validation_batch_size or batch_size, False, validation_steps,
                              shard)
    return train_feed, val_feed


def fit(model: Any, x: Any, y: Any, batch_size: "int | None", epochs: int, verbose: Any,
        callbacks: "Sequence[Any] | None", validation_split: float, validation_data: Any, shuffle: bool,
        class_weight: Any, sample_weight: Any, initial_epoch: int, steps_per_epoch: "int | None",
        validation_steps: "int | None", validation_batch_size: "int | None", validation_freq: int,
        seed: "int | None") -> Any:
    """``Trainer.fit`` (its docstring is the contract): every argument checked before anything runs,
    then the epochs; returns the History."""
    owner = f"{model._owner}: fit"
    model._require_compiled("fit")
    if not model._call_optional():
        model._require_layers("fit")
    batch_size = _validate.optional_positive_int(batch_size, "batch_size", owner)
    epochs = _validate.non_negative_int(epochs, "epochs", owner)
    initial_epoch = _validate.non_negative_int(initial_epoch, "initial_epoch", owner)
    if initial_epoch > epochs:
        raise ValueError(f"{owner}: initial_epoch={initial_epoch} is past epochs={epochs}; epochs is the index "
                         "of the last epoch, not a count (fit(epochs=initial_epoch + n) trains n more)")
    verbose = resolve_verbose(verbose, owner)
    cb_list = _validate.instances(callbacks, callbacks_module.Callback, "callbacks", owner)
    validation_split = _validate.number(validation_split, "validation_split", owner, low=0.0, high=1.0,
                                        high_open=True)
    shuffle = _validate.boolean(shuffle, "shuffle", owner)
    steps_per_epoch = _validate.optional_positive_int(steps_per_epoch, "steps_per_epoch", owner)
    validation_steps = _validate.optional_positive_int(validation_steps, "validation_steps", owner)
    validation_batch_size = _validate.optional_positive_int(validation_batch_size, "validation_batch_size",
                                                            owner)
    validation_freq = _validate.positive_int(validation_freq, "validation_freq", owner)
    if seed is not None:
        _validate.non_negative_int(seed, "seed", owner)
    class_weight = check_class_weight(model, class_weight, owner)
    refuse_both_weights(class_weight, sample_weight, owner)
    kind = data_kind(x)
    if kind != "arrays":
        if validation_split:
            raise ValueError(f"{owner}: validation_split is only supported for NumPy arrays, not for "
                             f"{KIND_WORDS[kind]}; pass validation_data instead")
        check_batch_size_unused(batch_size, kind, owner)
    if validation_data is not None and data_kind(validation_data) == "arrays":
        if not isinstance(validation_data, (tuple, list)) or len(validation_data) not in (2, 3):
            got = (f"a {type(validation_data).__name__} of {len(validation_data)}"
                   if isinstance(validation_data, (tuple, list)) else type(validation_data).__name__)
            raise ValueError(f"{owner}: validation_data must be a tuple (x_val, y_val), got {got} (also accepted: "
                             "(x_val, y_val, sample_weight_val), a generator, a PyDataset)")
    batch_size = batch_size or 32
    replica = model._replica_for(owner)
    shard = None
    if replica is not None:
        batch_size = model._distributed_args(replica, [kind] + ([data_kind(validation_data)] if validation_data
                                                               is not None else []), batch_size, owner)
        if validation_batch_size is not None:
            validation_batch_size = replica.per_replica_batch(validation_batch_size, owner, "validation_batch_size")
        shard = replica.shard
        if not replica.is_writer:  # rank 0 alone draws the bar and writes files
            verbose = 0
            cb_list = replica.writer_callbacks(cb_list)
    train_feed, val_feed = _fit_feeds(model, owner, x, y, sample_weight, class_weight, kind, batch_size, shuffle,
                                      steps_per_epoch, validation_split, validation_data, validation_batch_size,
                                      validation_steps, shard)

    history = callbacks_module.History()
    cbs = callback_list(model, [*cb_list, history], verbose, train_feed.steps_per_epoch, epochs=epochs)
    # History must record what the callbacks add (learning_rate) before the bar prints it
    progbars = [c for c in cbs.callbacks if isinstance(c, callbacks_module.ProgbarLogger)]
    cbs.callbacks = [c for c in cbs.callbacks if c not in progbars] + progbars
    model.history = history
    model.stop_training = False
    if replica is not None:
        seed = replica.agree_seed(seed)  # every rank shuffles alike: rank 0's seed
    # seed=None: one seed per fit call from dnnbind's seed generator (utils.set_random_seed fixes it)
    rng = np.random.default_rng(draw_seed() if seed is None else seed)
    joined = False
    try:
        model._initial_epoch = None
        cbs.on_train_begin()
        # a callback may move the start (BackupAndRestore resuming after its last backed-up epoch), as in Keras
        initial_epoch = model._initial_epoch if model._initial_epoch is not None else initial_epoch
        model._initial_epoch = None
        for epoch in range(initial_epoch, epochs):
            model.reset_metrics()
            cbs.on_epoch_begin(epoch)
            ran = 0
            for step, (xb, yb) in enumerate(train_feed.epoch(rng, model._static_inputs("train"))):
                cbs.on_train_batch_begin(step)
                if not joined:  # here the model is built, also when a PyDataset's first batch built it
                    model._join_replicas(replica, always=True)
                    joined = True
                # a batch smaller than the pass's first (its last) runs eagerly rather than holding
                # a graph of its own
                model._step("train", pack(xb), pack(yb), graph=train_feed.full(xb))
                if replica is not None:
                    replica.after_step()
                if model._loss_scale is not None:
                    model._loss_scale.after_step(model.optimizer)
                ran += 1
                cbs.on_train_batch_end(step, model._lazy_logs())
                if model.stop_training:
                    break
            train_feed.on_epoch_end()
            if ran == 0:
                if train_feed.ran_out:
                    break  # the warning said so; an epoch without a step has nothing to log
                raise ValueError(f"{owner}: x gave no batches (an empty generator or PyDataset)")
            if replica is not None:
                replica.reduce_metrics(model._all_metrics())  # every rank's History is global
            logs = model._logs()
            if "loss" in logs and not math.isfinite(logs["loss"]):
                warnings.warn(f"{model._owner}: epoch {epoch + 1}: the loss is {logs['loss']} "
                              "(NaN or inf); lower the learning rate or check the data "
                              "(callbacks.TerminateOnNaN stops training on it)", RuntimeWarning, stacklevel=3)
            if val_feed is not None and (epoch + 1) % validation_freq == 0:
                cbs.on_test_begin()
                if run_test(model, val_feed, cbs):
                    val_logs = model._logs(prefix="val_")
                    cbs.on_test_end(model._logs())
                    logs.update(val_logs)
                else:
                    cbs.on_test_end({})
            cbs.on_epoch_end(epoch, logs)
            if model.stop_training or train_feed.ran_out:
                break
        cbs.on_train_end()
    except BaseException as exc:
        if replica is not None:
            replica.report_failure(exc)  # the other ranks stop with this message, not a timeout
        raise
    finally:
        train_feed.close()
        if val_feed is not None:
            val_feed.close()
    return history


def run_test(model: Any, feed: EpochIterator, cbs=None) -> int:
    """One epoch of ``feed`` through test steps (metrics reset first); returns the batches run."""
    model.reset_metrics()
    ran = 0
    for step, (xb, yb) in enumerate(feed.epoch(np.random.default_rng(0))):
        if cbs is not None:
            cbs.on_test_batch_begin(step)
        model._step("test", pack(xb), pack(yb), graph=feed.full(xb))
        ran += 1
        if cbs is not None:
            cbs.on_test_batch_end(step, model._lazy_logs())
    feed.on_epoch_end()
    replica = model.__dict__.get("_replica")
    if replica is not None and ran:
        replica.reduce_metrics(model._all_metrics())
    return ran


def evaluate(model: Any, x: Any, y: Any, batch_size: "int | None", verbose: Any, sample_weight: Any,
             steps: "int | None", callbacks: "Sequence[Any] | None", return_dict: bool) -> Any:
    """``Trainer.evaluate`` (its docstring is the contract)."""
    owner = f"{model._owner}: evaluate"
    model._require_compiled("evaluate")
    model._require_layers("evaluate")
    batch_size = _validate.optional_positive_int(batch_size, "batch_size", owner)
    verbose = resolve_verbose(verbose, owner)
    steps = _validate.optional_positive_int(steps, "steps", owner)
    cb_list = _validate.instances(callbacks, callbacks_module.Callback, "callbacks", owner)
    return_dict = _validate.boolean(return_dict, "return_dict", owner)
    kind = data_kind(x)
    if kind != "arrays":
        check_batch_size_unused(batch_size, kind, owner)
    replica = model._replica_for(owner)
    batch_size = batch_size or 32
    if replica is not None:
        batch_size = model._distributed_args(replica, [kind], batch_size, owner)
        verbose = verbose if replica.is_writer else 0
        cb_list = replica.writer_callbacks(cb_list)
    feed = eval_feed(model, x, y, sample_weight, "evaluate", batch_size, steps, unpack=False,
                     shard=None if replica is None else replica.shard)
    model._join_replicas(replica, always=False)
    try:
        cbs = callback_list(model, cb_list, verbose, feed.steps_per_epoch)
        cbs.on_test_begin()
        ran = run_test(model, feed, cbs)
    finally:
        feed.close()
    if ran == 0:
        raise ValueError(f"{owner}: x gave no batches (an empty or exhausted generator or PyDataset)")
    logs = model._logs()
    cbs.on_test_end(logs)
    if return_dict:
        return logs
    values = [logs[name] for name in model.metrics_names]
    return values[0] if len(values) == 1 else values


def predict(model: Any, x: Any, batch_size: "int | None", verbose: Any, steps: "int | None",
            callbacks: "Sequence[Any] | None") -> Any:
    """``Trainer.predict`` (its docstring is the contract): outputs read back once everything is queued."""
    owner = f"{model._owner}: predict"
    model._require_layers("predict")
    batch_size = _validate.optional_positive_int(batch_size, "batch_size", owner)
    verbose = resolve_verbose(verbose, owner)
    steps = _validate.optional_positive_int(steps, "steps", owner)
    cb_list = _validate.instances(callbacks, callbacks_module.Callback, "callbacks", owner)
    kind = data_kind(x)
    if kind == "arrays":
        x, _, _ = split_tuple_x(model, x, None, None, targets=False)
        xs = check_x(model, x, "predict", finite=False, allow_empty=True)
        feed = EpochIterator(ArrayDataAdapter(xs, None, batch_size or 32, shuffle=False, device=model.device), steps)
    else:
        check_batch_size_unused(batch_size, kind, owner)
        feed = source_feed(model, x, None, None, kind, "predict", targets=False, shuffle=False, steps=steps)
    cbs = callback_list(model, cb_list, verbose, feed.steps_per_epoch)
    cbs.on_predict_begin()
    outputs = []
    try:
        for step, (xb, _) in enumerate(feed.epoch(np.random.default_rng(0))):
            cbs.on_predict_batch_begin(step)
            outputs.append(unpack(model._step("predict", pack(xb), graph=feed.full(xb))))
            cbs.on_predict_batch_end(step, {})
        feed.on_epoch_end()
    finally:
        feed.close()
    # read back after everything is queued, so the device never idles waiting for the host
    results = []
    for i, shape in enumerate(model._output_shapes()):
        host = [backend.to_numpy(o[i]) for o in outputs]
        results.append(np.concatenate(host, axis=0) if host else np.zeros((0, *shape), _F32))
    cbs.on_predict_end()
    return results[0] if len(results) == 1 else results
