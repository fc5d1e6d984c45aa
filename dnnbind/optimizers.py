"""Optimizers with Keras 3 names, defaults and update rules; updates run in ``dnnbind.kernels.optim``.

The update is fused and in place on the parameters' device. The learning rate and the step
count are 0-d arrays on that device, so a captured CUDA graph of a training step replays with
the current values; the learning rate array is rewritten (one tiny host-to-device copy) only
when its value changes (a schedule, a callback).

Step count: the device counter (int64, ``_step_array``) is the truth. Each ``apply`` advances it
on the device with ``kernels.advance_step`` unless the step's ``skip`` flag is set (dynamic loss
scaling skips steps whose gradients overflowed), so Adam's bias correction and ``iterations``
count applied updates only (Keras's LossScaleOptimizer). The host keeps an estimate without ever
waiting for the device: ``_iterations`` counts the steps issued minus the skips it has seen, and
``_unconfirmed`` the issued steps whose skip flag lived on the device (a CUDA graph replay
advances both, like any host counter). Reading ``iterations`` returns the estimate when nothing
is unconfirmed; otherwise it reads the device counter once (one stream synchronisation) and
resets the estimate to it. A learning-rate schedule is evaluated at the estimate on the training
path (no synchronisation per step), so after skipped steps it runs ahead by the number of skips
until the next such read; the model reads it whenever it synchronises anyway (the loss scale's
growth check, every ``growth_steps`` steps).

Weight decay is decoupled, as in Keras 3: ``p -= lr * weight_decay * p`` before the update.

Gradient clipping takes Keras 3's arguments (``clipnorm``: per-tensor L2 norm, ``global_clipnorm``:
the norm of all gradients together, ``clipvalue``: per element; at most one of the two norms).
It acts on the gradients after the loss-scale division, inside the fused update
(``kernels.optim``): on a GPU the norms and factors never leave the device. The values are baked
into a captured training step, so setting one bumps ``_state_version`` (the model re-captures).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from . import _keras_objects, _validate, backend, kernels
from .kernels import numeric as _numeric

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "Nadam", "Lion", "Lamb",
           "Ftrl", "Adafactor", "ScheduleFreeAdamW", "LossScaleOptimizer", "get", "serialize", "deserialize", "schedules", "legacy"]


# ----- learning-rate schedules (keras.optimizers.schedules) ------------------------------------
class LearningRateSchedule:
    """``schedule(step) -> learning rate`` (``step`` counts optimizer updates from 0)."""

    def __call__(self, step: int) -> float:
        raise NotImplementedError

    def get_config(self) -> dict:
        raise NotImplementedError

    @classmethod
    def from_config(cls, config: dict) -> "LearningRateSchedule":
        return cls(**config)


class ExponentialDecay(LearningRateSchedule):
    """``initial * decay_rate ** (step / decay_steps)`` (floored exponent when ``staircase``)."""

    def __init__(self, initial_learning_rate: float, decay_steps: int, decay_rate: float, staircase: bool = False,
                 name: str = "ExponentialDecay") -> None:
        if decay_steps <= 0:
            raise ValueError(f"ExponentialDecay: decay_steps must be positive, got {decay_steps}")
        self.initial_learning_rate = float(initial_learning_rate)
        self.decay_steps = int(decay_steps)
        self.decay_rate = float(decay_rate)
        self.staircase = bool(staircase)
        self.name = name

    def __call__(self, step):
        p = step / self.decay_steps
        if self.staircase:
            p = math.floor(p)
        return self.initial_learning_rate * self.decay_rate ** p

    def get_config(self):
        return {"initial_learning_rate": self.initial_learning_rate, "decay_steps": self.decay_steps,
                "decay_rate": self.decay_rate, "staircase": self.staircase, "name": self.name}


class CosineDecay(LearningRateSchedule):
    """Keras ``CosineDecay``: optional linear warm-up to ``warmup_target``, then a cosine to ``alpha`` x."""

    def __init__(self, initial_learning_rate: float, decay_steps: int, alpha: float = 0.0, name: str = "CosineDecay",
                 warmup_target: float | None = None, warmup_steps: int = 0) -> None:
        if decay_steps <= 0:
            raise ValueError(f"CosineDecay: decay_steps must be positive, got {decay_steps}")
        self.initial_learning_rate = float(initial_learning_rate)
        self.decay_steps = int(decay_steps)
        self.alpha = float(alpha)
        self.name = name
        self.warmup_target = None if warmup_target is None else float(warmup_target)
        self.warmup_steps = int(warmup_steps)

    def __call__(self, step):
        if self.warmup_target is not None and step < self.warmup_steps:
            frac = step / self.warmup_steps
            return self.initial_learning_rate + frac * (self.warmup_target - self.initial_learning_rate)
        start = self.initial_learning_rate if self.warmup_target is None else self.warmup_target
        s = min(step - (self.warmup_steps if self.warmup_target is not None else 0), self.decay_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * s / self.decay_steps))
        return start * ((1.0 - self.alpha) * cosine + self.alpha)

    def get_config(self):
        return {"initial_learning_rate": self.initial_learning_rate, "decay_steps": self.decay_steps,
                "alpha": self.alpha, "name": self.name, "warmup_target": self.warmup_target,
                "warmup_steps": self.warmup_steps}


class PiecewiseConstantDecay(LearningRateSchedule):
    """``values[i]`` while ``boundaries[i-1] < step <= boundaries[i]`` (Keras's convention)."""

    def __init__(self, boundaries: Sequence[int], values: Sequence[float], name: str = "PiecewiseConstant") -> None:
        if len(values) != len(boundaries) + 1:
            raise ValueError(
                f"PiecewiseConstantDecay: needs len(values) == len(boundaries) + 1, got {len(values)} values "
                f"and {len(boundaries)} boundaries"
            )
        self.boundaries = [int(b) for b in boundaries]
        self.values = [float(v) for v in values]
        self.name = name

    def __call__(self, step):
        for boundary, value in zip(self.boundaries, self.values):
            if step <= boundary:
                return value
        return self.values[-1]

    def get_config(self):
        return {"boundaries": self.boundaries, "values": self.values, "name": self.name}


class PolynomialDecay(LearningRateSchedule):
    """Keras ``PolynomialDecay``: ``(initial - end) * (1 - step / decay_steps) ** power + end``; the step stops at
    ``decay_steps``, or with ``cycle`` the horizon grows to the next multiple of ``decay_steps``."""

    def __init__(self, initial_learning_rate: float, decay_steps: int, end_learning_rate: float = 0.0001,
                 power: float = 1.0, cycle: bool = False, name: str = "PolynomialDecay") -> None:
        if decay_steps <= 0:
            raise ValueError(f"Argument `decay_steps` must be > 0. Received: decay_steps={decay_steps}")
        self.initial_learning_rate = float(initial_learning_rate)
        self.decay_steps = decay_steps
        self.end_learning_rate = float(end_learning_rate)
        self.power = float(power)
        self.cycle = bool(cycle)
        self.name = name

    def __call__(self, step):
        step = float(step)
        decay_steps = float(self.decay_steps)
        if self.cycle:
            decay_steps *= 1.0 if step == 0 else math.ceil(step / self.decay_steps)
        else:
            step = min(step, decay_steps)
        p = step / decay_steps
        return (self.initial_learning_rate - self.end_learning_rate) * (1 - p) ** self.power + self.end_learning_rate

    def get_config(self):
        return {"initial_learning_rate": self.initial_learning_rate, "decay_steps": self.decay_steps,
                "end_learning_rate": self.end_learning_rate, "power": self.power, "cycle": self.cycle,
                "name": self.name}


class InverseTimeDecay(LearningRateSchedule):
    """Keras ``InverseTimeDecay``: ``initial / (1 + decay_rate * step / decay_steps)`` (floored ratio with
    ``staircase``)."""

    def __init__(self, initial_learning_rate: float, decay_steps: int, decay_rate: float, staircase: bool = False,
                 name: str = "InverseTimeDecay") -> None:
        if decay_steps <= 0:
            raise ValueError(f"Argument `decay_steps` must be > 0. Received: decay_steps={decay_steps}")
        self.initial_learning_rate = float(initial_learning_rate)
        self.decay_steps = decay_steps
        self.decay_rate = float(decay_rate)
        self.staircase = bool(staircase)
        self.name = name

    def __call__(self, step):
        p = step / self.decay_steps
        if self.staircase:
            p = math.floor(p)
        return self.initial_learning_rate / (1.0 + self.decay_rate * p)

    def get_config(self):
        return {"initial_learning_rate": self.initial_learning_rate, "decay_steps": self.decay_steps,
                "decay_rate": self.decay_rate, "staircase": self.staircase, "name": self.name}


class CosineDecayRestarts(LearningRateSchedule):
    """Keras ``CosineDecayRestarts`` (SGDR): cosine decay to ``alpha`` over ``first_decay_steps``, restarting
    with periods ``t_mul`` times longer and peaks ``m_mul`` times lower each time."""

    def __init__(self, initial_learning_rate: float, first_decay_steps: int, t_mul: float = 2.0, m_mul: float = 1.0,
                 alpha: float = 0.0, name: str = "SGDRDecay") -> None:
        if first_decay_steps <= 0:
            raise ValueError(f"Argument `first_decay_steps` must be > 0. Received: "
                             f"first_decay_steps={first_decay_steps}")
        self.initial_learning_rate = float(initial_learning_rate)
        self.first_decay_steps = first_decay_steps
        self._t_mul, self._m_mul = float(t_mul), float(m_mul)
        self.alpha = float(alpha)
        self.name = name

    def __call__(self, step):
        fraction = step / self.first_decay_steps
        t_mul = self._t_mul
        if t_mul == 1.0:
            i_restart = math.floor(fraction)
            fraction -= i_restart
        else:
            i_restart = math.floor(math.log(1.0 - fraction * (1.0 - t_mul)) / math.log(t_mul))
            sum_r = (1.0 - t_mul ** i_restart) / (1.0 - t_mul)
            fraction = (fraction - sum_r) / t_mul ** i_restart
        cosine = 0.5 * self._m_mul ** i_restart * (1.0 + math.cos(math.pi * fraction))
        return self.initial_learning_rate * ((1 - self.alpha) * cosine + self.alpha)

    def get_config(self):
        return {"initial_learning_rate": self.initial_learning_rate, "first_decay_steps": self.first_decay_steps,
                "t_mul": self._t_mul, "m_mul": self._m_mul, "alpha": self.alpha, "name": self.name}


_SCHEDULES = (ExponentialDecay, CosineDecay, PiecewiseConstantDecay, PolynomialDecay, InverseTimeDecay,
              CosineDecayRestarts)


class _SchedulesNamespace:
    """``dnnbind.optimizers.schedules.ExponentialDecay`` etc., as in Keras."""

    LearningRateSchedule = LearningRateSchedule
    ExponentialDecay = ExponentialDecay
    CosineDecay = CosineDecay
    PiecewiseConstantDecay = PiecewiseConstantDecay
    PolynomialDecay = PolynomialDecay
    InverseTimeDecay = InverseTimeDecay
    CosineDecayRestarts = CosineDecayRestarts

    @staticmethod
    def serialize(schedule: LearningRateSchedule) -> dict:
        return {"class_name": type(schedule).__name__, "config": schedule.get_config()}

    @staticmethod
    def deserialize(config: dict, custom_objects: "dict | None" = None) -> LearningRateSchedule:
        cls = _keras_objects.find_custom_class(config["class_name"], config.get("registered_name"), custom_objects) \
            or {c.__name__: c for c in _SCHEDULES}.get(config["class_name"])
        if cls is None:
            raise ValueError(f"unknown learning-rate schedule {config['class_name']!r}")
        return cls.from_config(config["config"])


schedules = _SchedulesNamespace()


# ----- optimizers ------------------------------------------------------------------------------
class Optimizer:
    """Base class: holds the learning rate (float or schedule), the step count and per-parameter slots.

    ``apply(params, grads, grad_scale=None, skip=None)`` updates ``params`` in place
    (``grad_scale`` divides the gradients first, for loss scaling; ``skip`` is a 0-d int32 flag,
    on the device for a device model: non-zero skips the update, the slots and the step count
    without a host round trip).

    ``iterations`` is the number of applied updates (skipped steps excluded); reading it may
    synchronise once after device-flagged steps (see the module docstring).
    """

    _slot_names: tuple[str, ...] = ()

    def __init__(self, learning_rate: "float | LearningRateSchedule" = 0.001, weight_decay: float | None = None,
                 name: str | None = None, clipnorm: float | None = None, clipvalue: float | None = None,
                 global_clipnorm: float | None = None, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"{type(self).__name__}: unexpected keyword argument(s) {', '.join(sorted(kwargs))}")
        owner = type(self).__name__
        clipnorm = self._check_clip(clipnorm, "clipnorm")
        clipvalue = self._check_clip(clipvalue, "clipvalue")
        global_clipnorm = self._check_clip(global_clipnorm, "global_clipnorm")
        if clipnorm is not None and global_clipnorm is not None:
            raise ValueError(f"{owner}: only one of clipnorm and global_clipnorm can be set, got "
                             f"clipnorm={clipnorm:g}, global_clipnorm={global_clipnorm:g}")
        self._clipnorm, self._clipvalue, self._global_clipnorm = clipnorm, clipvalue, global_clipnorm
        self.name = name or type(self).__name__.lower()
        self._learning_rate = self._check_lr(learning_rate)
        if weight_decay is not None and weight_decay < 0:
            raise ValueError(f"{type(self).__name__}: weight_decay must be >= 0, got {weight_decay}")
        self.weight_decay = weight_decay
        # host estimate of the applied-update count, and how many issued steps it may overcount
        # (their skip flags were on the device); both are host counters a graph replay advances
        self._iterations = 0
        self._unconfirmed = 0
        self._slots: list[dict[str, Any]] = []
        self._device = None
        self._lr_array = None
        self._lr_uploaded: float | None = None
        self._step_array = None
        # bumped whenever the state arrays are reallocated (build, set_state, to): CUDA graphs of a
        # training step address them, and a model drops its graphs when this changes
        self._state_version = 0
        # the CUDA updates' device pointer tables for this optimizer's arrays (made on first use)
        self._tables = kernels.UpdateTables()
        self._prepared = None  # the update, checked once per parameter set (see _fused)
        self.built = False

    def _check_lr(self, lr):
        if isinstance(lr, LearningRateSchedule):
            return lr
        if callable(lr):
            raise TypeError(f"{type(self).__name__}: learning_rate must be a number or a LearningRateSchedule")
        lr = float(lr)
        if not math.isfinite(lr) or lr < 0:
            raise ValueError(f"{type(self).__name__}: learning_rate must be a finite number >= 0, got {lr}")
        return lr

    def _check_clip(self, value: Any, name: str) -> float | None:
        if value is None:
            return None
        return _validate.number(value, name, type(self).__name__, low=0.0, low_open=True)

    def _set_clip(self, name: str, value: Any) -> None:
        value = self._check_clip(value, name)
        other = {"clipnorm": "_global_clipnorm", "global_clipnorm": "_clipnorm"}.get(name)
        if value is not None and other is not None and getattr(self, other) is not None:
            raise ValueError(f"{type(self).__name__}: only one of clipnorm and global_clipnorm can be set; "
                             f"{other.lstrip('_')} is {getattr(self, other):g}, set it to None first")
        setattr(self, "_" + name, value)
        self._state_version += 1  # a captured step baked the old value in

    @property
    def clipnorm(self) -> float | None:
        """Each gradient tensor whose L2 norm exceeds this is rescaled to this norm (Keras 3)."""
        return self._clipnorm

    @clipnorm.setter
    def clipnorm(self, value) -> None:
        self._set_clip("clipnorm", value)

    @property
    def global_clipnorm(self) -> float | None:
        """All gradients are rescaled together when their joint L2 norm exceeds this (Keras 3)."""
        return self._global_clipnorm

    @global_clipnorm.setter
    def global_clipnorm(self, value) -> None:
        self._set_clip("global_clipnorm", value)

    @property
    def clipvalue(self) -> float | None:
        """Each gradient element is clamped to ``[-clipvalue, clipvalue]`` (Keras 3; the norms,
        when set, take precedence, as in Keras)."""
        return self._clipvalue

    @clipvalue.setter
    def clipvalue(self, value) -> None:
        self._set_clip("clipvalue", value)

    def _clip_kwargs(self) -> dict:
        return {"clipnorm": self._clipnorm, "global_clipnorm": self._global_clipnorm, "clipvalue": self._clipvalue}

    @property
    def iterations(self) -> int:
        """Applied updates so far (steps skipped for non-finite gradients excluded), as Keras.

        Exact without touching the device unless steps were issued with a device ``skip`` flag since
        the last read; then this reads the device step counter (one synchronisation of its stream).
        """
        if self._unconfirmed:
            self._confirm_iterations()
        return self._iterations

    @iterations.setter
    def iterations(self, value: int) -> None:
        self._iterations = int(value)
        self._unconfirmed = 0
        if self._step_array is not None:  # the device counter is the truth: keep them equal
            host = np.array(self._iterations, np.int64)
            if backend.is_device_array(self._step_array):
                self._step_array.copy_from_host(host)
            else:
                self._step_array[...] = host

    def _confirm_iterations(self) -> None:
        """Reset the host estimate to the device step counter (waits for the counter's stream)."""
        if self._step_array is not None:
            self._iterations = int(backend.to_numpy(self._step_array))
        self._unconfirmed = 0

    def _count_step(self, skip: Any) -> None:
        """Advance the host estimate after one ``apply``: exactly when the flag is on the host."""
        if skip is None:
            self._iterations += 1
        elif backend.is_device_array(skip):
            self._iterations += 1
            self._unconfirmed += 1
        else:
            self._iterations += int(int(np.asarray(skip)) == 0)

    def _lr_at(self, step: int) -> float:
        if isinstance(self._learning_rate, LearningRateSchedule):
            return float(self._learning_rate(step))
        return float(self._learning_rate)

    # Keras exposes learning_rate as a settable attribute (callbacks assign to it).
    @property
    def learning_rate(self) -> float:
        """The current learning rate (a schedule is evaluated at ``iterations``)."""
        if isinstance(self._learning_rate, LearningRateSchedule):
            return float(self._learning_rate(self.iterations))
        return float(self._learning_rate)

    @learning_rate.setter
    def learning_rate(self, value) -> None:
        self._learning_rate = self._check_lr(value)

    lr = learning_rate

    @property
    def schedule(self) -> LearningRateSchedule | None:
        return self._learning_rate if isinstance(self._learning_rate, LearningRateSchedule) else None

    # ----- state ----------------------------------------------------------------------------
    def build(self, params: Sequence[Any]) -> None:
        """Create zeroed slots like each parameter, and the 0-d lr (float32) and step count (int64)
        arrays, on the params' device."""
        iterations = self.iterations
        self._device = backend.device_of(params[0]) if params else backend.default_device()
        self._slots = [{name: kernels.zeros_like(p) for name in self._slot_names_for(p)} for p in params]
        lr = self._lr_at(iterations)
        self._lr_array = backend.asarray(np.array(lr, np.float32), device=self._device)
        self._lr_uploaded = lr
        self._step_array = backend.asarray(np.array(iterations, np.int64), device=self._device)
        self._tables.clear()  # they address the old slots (no captured graph uses a kept table)
        self._prepared = None
        self._state_version += 1
        self.built = True

    def _slot_names_for(self, p) -> tuple[str, ...]:
        return self._slot_names

    def _sync_lr(self, stream: Any = None) -> None:
        """Rewrite the device learning rate when its host value changed (no-op otherwise).

        ``stream``: where the upload is queued (default: the array's stream). A model running its
        step as a CUDA graph calls this before the launch, so the captured step never uploads.
        A schedule is evaluated at the host estimate of the step count (never a device read).
        """
        lr = self._lr_at(self._iterations)
        if lr != self._lr_uploaded:
            host = np.array(lr, np.float32)
            if backend.is_device_array(self._lr_array):
                self._lr_array.copy_from_host(host, stream=stream)
            else:
                self._lr_array[...] = host
            self._lr_uploaded = lr

    def apply(self, grads: Sequence[Any], trainable_variables: "Sequence[Any] | None" = None) -> None:
        """Keras 3's ``apply(grads, trainable_variables)``: one update of the variables (in place) from their
        gradients (tensors or arrays; None entries are skipped, as Keras skips them). Builds the slots on
        first use (or when the variable list changes); then each variable's ``constraint`` is applied."""
        if trainable_variables is None:
            raise ValueError(f"{type(self).__name__}.apply: give the variables the gradients belong to "
                             "(optimizer.apply(grads, model.trainable_variables))")
        grads, variables = list(grads), list(trainable_variables)
        if len(grads) != len(variables):
            raise ValueError(f"{type(self).__name__}.apply: {len(grads)} gradients for {len(variables)} variables")
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        if not pairs:
            return
        # a Tensor's array, a Variable's value, or the array itself (a NumPy array's .data is its buffer)
        raw = [g.data if hasattr(g, "_node") else g.value if hasattr(g, "_leaf") else g for g, _ in pairs]
        params = [v.value for _, v in pairs]
        for i, (p, g, (_, v)) in enumerate(zip(params, raw, pairs)):
            if tuple(g.shape) != tuple(p.shape) and getattr(v, "_to_internal", None) is not None and \
                    tuple(g.shape) == tuple(v.shape):
                # a Keras-layout gradient (tape.gradient's) of a variable stored in another layout
                raw[i] = g = v._internal_from_tensor(g)
            if tuple(g.shape) != tuple(p.shape):
                g_shape = tuple(g.shape)
                raise ValueError(f"{type(self).__name__}.apply: the gradient of '{getattr(v, 'path', v)}' has shape "
                                 f"{g_shape}, the variable {tuple(p.shape)}")
        keys = [id(v) for _, v in pairs]
        if self.__dict__.get("_apply_keys") != keys:
            self._apply_keys = keys
            for _, v in pairs:
                v._relayout_ok = False  # its slots follow the stored layout from now on
            self.build(params)
        self._apply_raw(params, raw)
        for _, v in pairs:
            c = getattr(v, "constraint", None)
            if c is not None:
                v.assign(c(v))

    def apply_gradients(self, grads_and_vars: Sequence[tuple[Any, Any]]) -> None:
        """``apply`` for a list of ``(gradient, variable)`` pairs (Keras 3's ``apply_gradients``)."""
        pairs = list(grads_and_vars)
        self.apply([g for g, _ in pairs], [v for _, v in pairs])

    def _apply_raw(self, params: Sequence[Any], grads: Sequence[Any], *, grad_scale: Any = None, skip: Any = None) -> None:
        """One update of the raw arrays ``params`` (in place) from ``grads``; builds the slots on first use."""
        if not self.built or len(self._slots) != len(params):
            self.build(params)
        self._sync_lr()
        # step += 1 on the device unless skipped (Adam's bias correction reads the 1-based count of
        # applied updates); the kernel reads the flag, so this is graph-replay safe with no host read
        kernels.advance_step(self._step_array, skip=skip)
        self._update(list(params), list(grads), grad_scale=grad_scale, skip=skip)
        self._count_step(skip)

    def _update(self, params, grads, *, grad_scale, skip) -> None:
        raise NotImplementedError

    def _fused(self, kind: str, params: list, grads: list, states: tuple, hyper: dict, *, grad_scale: Any,
               skip: Any, step: Any = None) -> None:
        """Run the ``kernels.optim`` update ``kind`` through an ``kernels.optim.PreparedUpdate``: the public
        op's checks of the parameters, slots and hyper-parameters run when one of them changed (a new
        parameter set, rebuilt slots, a hyper-parameter set by the user), not every step; the
        gradients are still checked every step."""
        prepared = self._prepared
        if prepared is None or prepared.kind != kind or not prepared.matches(params, *states, **hyper):
            prepared = self._prepared = kernels.optim.PreparedUpdate(kind, params, *states, **hyper)
        prepared(grads, lr=self._lr_array, step=step, grad_scale=grad_scale, skip=skip)

    def _reads_compute_grads(self) -> bool:
        """Whether this update may be given float16/bfloat16 gradients of float32 parameters instead
        of their float32 casts, with bitwise the same result: the fused updates of ``kernels.optim``
        convert each gradient element exactly, as the cast would. Not with ``clipnorm`` or
        ``global_clipnorm``: the update groups tensors by gradient dtype, and a group's chunk size
        follows its total size, so the norms' sums would be taken in another order. Not for a
        subclass with its own ``_update``, ``apply`` or ``_fused`` (it may expect the casts)."""
        cls = type(self)
        return (cls._update in _FUSED_UPDATES and cls._apply_raw is Optimizer._apply_raw and cls._fused is Optimizer._fused
                and self._clipnorm is None and self._global_clipnorm is None)

    def _slot_lists(self, name: str) -> list:
        return [slots[name] for slots in self._slots]

    @property
    def variables(self) -> list[Any]:
        """The state arrays (iterations first, then each parameter's slots), as Keras lists them."""
        out = [np.array(self.iterations, np.int64)]
        for slots in self._slots:
            out += list(slots.values())
        return out

    def get_state(self) -> dict[str, np.ndarray]:
        """Host copies of the state, by stable names (``"iterations"``, ``"3/momentum"``...)."""
        state = {"iterations": np.array(self.iterations, np.int64)}
        for i, slots in enumerate(self._slots):
            for name, arr in slots.items():
                state[f"{i}/{name}"] = backend.to_numpy(arr)
        return state

    def set_state(self, state: dict[str, np.ndarray], params: Sequence[Any]) -> None:
        """Restore :meth:`get_state`'s output for ``params`` (their order and shapes must match)."""
        self.iterations = int(np.asarray(state.get("iterations", 0)).reshape(-1)[0])
        self.build(params)
        for i, slots in enumerate(self._slots):
            for name in list(slots):
                key = f"{i}/{name}"
                if key not in state:
                    raise ValueError(f"{type(self).__name__}: optimizer state is missing '{key}'")
                arr = np.asarray(state[key])
                if tuple(arr.shape) != tuple(slots[name].shape):
                    raise ValueError(
                        f"{type(self).__name__}: optimizer state '{key}' has shape {arr.shape}, the parameter "
                        f"needs {tuple(slots[name].shape)}"
                    )
                slots[name] = backend.asarray(arr.astype(slots[name].dtype), device=self._device)

    def to(self, device) -> None:
        """Move the state to ``device`` (explicit copies through the host; ``model.to`` calls this)."""
        if not self.built:
            return
        dev = backend.resolve_device(device)
        move = lambda a: backend.asarray(backend.to_numpy(a), device=dev)  # noqa: E731
        self._slots = [{name: move(arr) for name, arr in slots.items()} for slots in self._slots]
        self._lr_array, self._step_array = move(self._lr_array), move(self._step_array)
        self._device = dev
        self._tables.clear()
        self._prepared = None
        self._state_version += 1

    def get_config(self) -> dict:
        lr = self._learning_rate
        lr_cfg = schedules.serialize(lr) if isinstance(lr, LearningRateSchedule) else lr
        return {"name": self.name, "learning_rate": lr_cfg, "weight_decay": self.weight_decay,
                "clipnorm": self._clipnorm, "global_clipnorm": self._global_clipnorm, "clipvalue": self._clipvalue}

    @classmethod
    def from_config(cls, config: dict) -> "Optimizer":
        config = dict(config)
        lr = config.get("learning_rate")
        if isinstance(lr, dict):
            config["learning_rate"] = schedules.deserialize(lr)
        return cls(**config)

    def _wd(self) -> float:
        return float(self.weight_decay or 0.0)


class SGD(Optimizer):
    """``v = momentum * v - lr * g; p += v`` (Nesterov: ``p += momentum * v - lr * g``); Keras 3 rule."""

    def __init__(self, learning_rate=0.01, momentum: float = 0.0, nesterov: bool = False,
                 weight_decay: float | None = None, name: str | None = None, **kwargs) -> None:
        super().__init__(learning_rate, weight_decay, name, **kwargs)
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"SGD: momentum must be in [0, 1], got {momentum}")
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)

    def _slot_names_for(self, p):
        return ("momentum",) if self.momentum else ()

    def _update(self, params, grads, *, grad_scale, skip):
        velocities = self._slot_lists("momentum") if self.momentum else None
        self._fused("sgd", params, grads, (velocities,),
                    dict(momentum=self.momentum, nesterov=self.nesterov, weight_decay=self._wd(), tables=self._tables,
                         **self._clip_kwargs()), grad_scale=grad_scale, skip=skip)

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum, "nesterov": self.nesterov}


class Adam(Optimizer):
    """Adam with Keras's epsilon placement: ``p -= lr_t * m / (sqrt(v) + epsilon)``."""

    def __init__(self, learning_rate=0.001, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7,
                 amsgrad: bool = False, weight_decay: float | None = None, name: str | None = None, **kwargs) -> None:
        super().__init__(learning_rate, weight_decay, name, **kwargs)
        for label, value in (("beta_1", beta_1), ("beta_2", beta_2)):
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{type(self).__name__}: {label} must be in [0, 1), got {value}")
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)
        self.amsgrad = bool(amsgrad)

    def _slot_names_for(self, p):
        return ("m", "v", "vhat") if self.amsgrad else ("m", "v")

    def _update(self, params, grads, *, grad_scale, skip):
        self._fused("adam", params, grads, (self._slot_lists("m"), self._slot_lists("v")),
                    dict(beta1=self.beta_1, beta2=self.beta_2, epsilon=self.epsilon, weight_decay=self._wd(),
                         amsgrad=self.amsgrad, vhat=self._slot_lists("vhat") if self.amsgrad else None,
                         tables=self._tables, **self._clip_kwargs()),
                    grad_scale=grad_scale, skip=skip, step=self._step_array)

    def get_config(self):
        return {**super().get_config(), "beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon,
                "amsgrad": self.amsgrad}


class AdamW(Adam):
    """Adam with decoupled weight decay (Keras default ``weight_decay=0.004``)."""

    def __init__(self, learning_rate=0.001, weight_decay: float = 0.004, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-7, amsgrad: bool = False, name: str | None = None, **kwargs) -> None:
        super().__init__(learning_rate, beta_1, beta_2, epsilon, amsgrad, weight_decay, name, **kwargs)


class RMSprop(Optimizer):
    """Keras 3 RMSprop: ``v = rho v + (1-rho) g^2``; centered subtracts the mean square of ``g``."""

    def __init__(self, learning_rate=0.001, rho: float = 0.9, momentum: float = 0.0, epsilon: float = 1e-7,
                 centered: bool = False, weight_decay: float | None = None, name: str | None = None, **kwargs) -> None:
        super().__init__(learning_rate, weight_decay, name, **kwargs)
        self.rho, self.momentum, self.epsilon = float(rho), float(momentum), float(epsilon)
        self.centered = bool(centered)

    def _slot_names_for(self, p):
        names = ["velocity"]
        if self.momentum:
            names.append("momentum")
        if self.centered:
            names.append("average_gradient")
        return tuple(names)

    def _update(self, params, grads, *, grad_scale, skip):
        self._fused("rmsprop", params, grads, (self._slot_lists("velocity"),),
                    dict(rho=self.rho, momentum=self.momentum, epsilon=self.epsilon, centered=self.centered,
                         mom=self._slot_lists("momentum") if self.momentum else None,
                         avg=self._slot_lists("average_gradient") if self.centered else None,
                         weight_decay=self._wd(), tables=self._tables, **self._clip_kwargs()),
                    grad_scale=grad_scale, skip=skip)

    def get_config(self):
        return {**super().get_config(), "rho": self.rho, "momentum": self.momentum, "epsilon": self.epsilon,
                "centered": self.centered}


# ----- optimizers written in the numeric engine ----------------------------------------------------
class _Rules:
    """Element-wise steps of an update rule on one parameter's arrays, through :mod:`dnnbind.kernels.numeric`
    (NumPy arrays or device arrays; on the device each step is one NVRTC kernel on the current stream, never
    a host read, so a captured training step replays them). Every result has the parameter's dtype."""

    def __init__(self, dtype: Any) -> None:
        self.dtype = dtype

    def add(self, a, b):
        return _numeric.binary("add", a, b, dtype=self.dtype)

    def sub(self, a, b):
        return _numeric.binary("subtract", a, b, dtype=self.dtype)

    def mul(self, a, b):
        return _numeric.binary("multiply", a, b, dtype=self.dtype)

    def div(self, a, b):
        return _numeric.binary("divide", a, b, dtype=self.dtype)

    def pow(self, a, b):
        return _numeric.binary("power", a, b, dtype=self.dtype)

    def maximum(self, a, b):
        return _numeric.binary("maximum", a, b, dtype=self.dtype)

    def greater(self, a, b):
        return _numeric.binary("greater", a, b)

    def sqrt(self, x):
        return _numeric.unary("sqrt", x, dtype=self.dtype)

    def square(self, x):
        return _numeric.unary("square", x, dtype=self.dtype)

    def abs(self, x):
        return _numeric.unary("abs", x, dtype=self.dtype)

    def sign(self, x):
        return _numeric.unary("sign", x, dtype=self.dtype)

    def clip(self, x, low: float, high: float):
        return _numeric.unary("clip", x, p0=low, p1=high, dtype=self.dtype)

    def where(self, condition, a, b):
        return _numeric.where(condition, a, b, dtype=self.dtype)

    def sum(self, x):
        return _numeric.reduce("sum", x, dtype=self.dtype)

    def isfinite(self, x):
        return _numeric.unary("isfinite", x)


class _ComposedOptimizer(Optimizer):
    """Base of the optimizers whose update is written in :mod:`dnnbind.kernels.numeric` (Adagrad, Adadelta,
    Adamax, Nadam, Lion, Ftrl, Lamb, Adafactor, ScheduleFreeAdamW) rather than one fused kernel: per parameter,
    the gradient is cast to the parameter's dtype, divided by the loss scale, clipped (Keras 3's ``clipnorm`` /
    ``global_clipnorm`` / ``clipvalue``, norms reduced on the device), the decoupled weight decay applied,
    then :meth:`_rule` computes the new parameter and slots, which are written in place; with a ``skip``
    flag every write is ``where(skip, old, new)``, so a skipped step changes nothing and the flag is never
    read on the host. The learning rate and the 1-based step count are the base's 0-d device arrays.

    A subclass sets ``_slot_names`` (and ``_slot_init`` for slots that do not start at zero) and writes
    ``_rule(r, p, g, slots, lr, step) -> (new_p, {slot: new value})`` with ``r`` a :class:`_Rules`; it may
    override ``_before_rules`` for per-step state shared by all parameters (Nadam's ``u_product``)."""

    _slot_init: dict = {}

    def build(self, params: Sequence[Any]) -> None:
        super().build(params)
        for slots in self._slots:
            for name, value in self._slot_init.items():
                if name in slots:
                    _numeric.binary("add", slots[name], float(value(self)), dtype=slots[name].dtype,
                                    out=slots[name])

    def _grads(self, params, grads, grad_scale) -> list:
        out = []
        for p, g in zip(params, grads):
            r = _Rules(p.dtype)
            g = r.mul(g, 1.0) if g.dtype != p.dtype else g
            if grad_scale is not None:
                g = r.div(g, grad_scale)
            out.append(g)
        if self._clipnorm is not None:  # each tensor to at most clipnorm: g * c / max(||g||, c)
            c = self._clipnorm
            clipped = []
            for g in out:
                r = _Rules(g.dtype)
                clipped.append(r.mul(g, r.div(c, r.maximum(r.sqrt(r.sum(r.square(g))), c))))
            out = clipped
        elif self._global_clipnorm is not None:
            c = self._global_clipnorm
            r = _Rules(np.dtype(np.float64) if any(g.dtype == np.float64 for g in out) else np.dtype(np.float32))
            total = None
            for g in out:
                part = r.sum(r.square(g))
                total = part if total is None else r.add(total, part)
            norm = r.sqrt(total)
            # a non-finite global norm poisons every gradient (Keras's clip_by_global_norm)
            factor = r.where(r.isfinite(norm), r.div(c, r.maximum(norm, c)), float("nan"))
            out = [_Rules(g.dtype).mul(g, factor) for g in out]
        elif self._clipvalue is not None:
            v = self._clipvalue
            out = [_Rules(g.dtype).clip(g, -v, v) for g in out]
        return out

    @staticmethod
    def _write(target, value, skip) -> None:
        if skip is None:
            _numeric.binary("add", value, 0.0, dtype=target.dtype, out=target)
        else:
            _numeric.where(skip, target, value, dtype=target.dtype, out=target)

    def _before_rules(self, skip) -> None:
        """Per-step state shared by the parameters, updated before them (under ``skip``)."""

    def _update(self, params, grads, *, grad_scale, skip):
        if skip is not None and not hasattr(skip, "shape"):
            if int(skip):
                return
            skip = None
        grads = self._grads(params, grads, grad_scale)
        self._before_rules(skip)
        lr, step, wd = self._lr_array, self._step_array, self._wd()
        for p, g, slots in zip(params, grads, self._slots):
            r = _Rules(p.dtype)
            base = r.sub(p, r.mul(r.mul(p, lr), wd)) if wd else p
            new_p, new_slots = self._rule(r, base, g, slots, lr, step)
            for name, value in new_slots.items():
                self._write(slots[name], value, skip)
            self._write(p, new_p, skip)

    def _rule(self, r: _Rules, p, g, slots: dict, lr, step) -> tuple:
        raise NotImplementedError


def _beta(owner: str, name: str, value: Any, *, low_open: bool = False, high_open: bool = True) -> float:
    return _validate.number(value, name, owner, low=0.0, high=1.0, low_open=low_open, high_open=high_open)


class Adagrad(_ComposedOptimizer):
    """Keras 3 Adagrad: ``acc += g^2; p -= lr * g / sqrt(acc + epsilon)`` (``acc`` starts at
    ``initial_accumulator_value``)."""

    _slot_names = ("accumulator",)
    _slot_init = {"accumulator": lambda self: self.initial_accumulator_value}

    def __init__(self, learning_rate=0.001, initial_accumulator_value: float = 0.1, epsilon: float = 1e-7,
                 weight_decay: float | None = None, name: str | None = None, **kwargs) -> None:
        super().__init__(learning_rate, weight_decay, name, **kwargs)
        self.initial_accumulator_value = _validate.number(initial_accumulator_value, "initial_accumulator_value",
                                                          "Adagrad", low=0.0)
        self.epsilon = _validate.number(epsilon, "epsilon", "Adagrad", low=0.0)

    def _rule(self, r, p, g, slots, lr, step):
        acc = r.add(slots["accumulator"], r.square(g))
        return r.sub(p, r.div(r.mul(g, lr), r.sqrt(r.add(acc, self.epsilon)))), {"accumulator": acc}

    def get_config(self):
        return {**super().get_config(), "initial_accumulator_value": self.initial_accumulator_value,
                "epsilon": self.epsilon}


class Adadelta(_ComposedOptimizer):
    """Keras 3 Adadelta: ``Eg = rho Eg + (1-rho) g^2``, ``d = -sqrt(Ed + eps) g / sqrt(Eg + eps)``,
    ``Ed = rho Ed + (1-rho) d^2``, ``p += lr * d``."""

    _slot_names = ("accumulated_grad", "accumulated_delta_var")

    def __init__(self, learning_rate=0.001, rho: float = 0.95, epsilon: float = 1e-7,
                 weight_decay: float | None = None, name: str | None = None, **kwargs) -> None:
        super().__init__(learning_rate, weight_decay, name, **kwargs)
        self.rho = _beta("Adadelta", "rho", rho, high_open=False)
        self.epsilon = _validate.number(epsilon, "epsilon", "Adadelta", low=0.0)

    def _rule(self, r, p, g, slots, lr, step):
        rho, eps = self.rho, self.epsilon
        acc_g = r.add(r.mul(slots["accumulated_grad"], rho), r.mul(r.square(g), 1 - rho))
        delta = r.div(r.mul(r.sqrt(r.add(slots["accumulated_delta_var"], eps)), g), r.sqrt(r.add(acc_g, eps)))
        acc_d = r.add(r.mul(slots["accumulated_delta_var"], rho), r.mul(r.square(delta), 1 - rho))
        return r.sub(p, r.mul(delta, lr)), {"accumulated_grad": acc_g, "accumulated_delta_var": acc_d}

    def get_config(self):
        return {**super().get_config(), "rho": self.rho, "epsilon": self.epsilon}


class _TwoBetas(_ComposedOptimizer):
    def __init__(self, learning_rate=0.001, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7,
                 weight_decay: float | None = None, name: str | None = None, **kwargs) -> None:
        super().__init__(learning_rate, weight_decay, name, **kwargs)
        owner = type(self).__name__
        self.beta_1, self.beta_2 = _beta(owner, "beta_1", beta_1), _beta(owner, "beta_2", beta_2)
        self.epsilon = _validate.number(epsilon, "epsilon", owner, low=0.0)

    def get_config(self):
        return {**super().get_config(), "beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon}


class Adamax(_TwoBetas):
    """Keras 3 Adamax: ``m += (g - m)(1 - b1)``, ``u = max(b2 u, |g|)``, ``p -= lr m / ((1 - b1^t)(u + eps))``."""

    _slot_names = ("momentum", "norm")

    def _rule(self, r, p, g, slots, lr, step):
        m = r.add(slots["momentum"], r.mul(r.sub(g, slots["momentum"]), 1 - self.beta_1))
        u = r.maximum(r.mul(slots["norm"], self.beta_2), r.abs(g))
        correction = r.sub(1.0, r.pow(self.beta_1, step))
        return r.sub(p, r.div(r.mul(m, lr), r.mul(r.add(u, self.epsilon), correction))), {"momentum": m, "norm": u}


class Nadam(_TwoBetas):
    """Keras 3 Nadam (Dozat's momentum schedule ``u_t = b1 (1 - 0.5 * 0.96^t)``; ``u_product`` is the running
    product of the ``u_t``, one 0-d array on the parameters' device)."""

    _slot_names = ("momentum", "velocity")

    def build(self, params: Sequence[Any]) -> None:
        super().build(params)
        dtype = params[0].dtype if params else np.float32
        self._u_product = backend.asarray(np.array(1.0, dtype), device=self._device)

    def _u(self, r, step, offset: int):
        return r.mul(r.sub(1.0, r.mul(r.pow(0.96, r.add(step, float(offset))), 0.5)), self.beta_1)

    def _before_rules(self, skip) -> None:
        r = _Rules(self._u_product.dtype)
        self._write(self._u_product, r.mul(self._u_product, self._u(r, self._step_array, 0)), skip)

    def _rule(self, r, p, g, slots, lr, step):
        b1, b2 = self.beta_1, self.beta_2
        u_t, u_t_1 = self._u(r, step, 0), self._u(r, step, 1)
        u_product_t = r.mul(self._u_product, 1.0)
        u_product_t_1 = r.mul(u_product_t, u_t_1)
        m = r.add(slots["momentum"], r.mul(r.sub(g, slots["momentum"]), 1 - b1))
        v = r.add(slots["velocity"], r.mul(r.sub(r.square(g), slots["velocity"]), 1 - b2))
        m_hat = r.add(r.div(r.mul(m, u_t_1), r.sub(1.0, u_product_t_1)),
                      r.div(r.mul(g, r.sub(1.0, u_t)), r.sub(1.0, u_product_t)))
        v_hat = r.div(v, r.sub(1.0, r.pow(b2, step)))
        return r.sub(p, r.div(r.mul(m_hat, lr), r.add(r.sqrt(v_hat), self.epsilon))), {"momentum": m, "velocity": v}

    def get_state(self) -> dict[str, np.ndarray]:
        state = super().get_state()
        if self.built:
            state["u_product"] = backend.to_numpy(self._u_product)
        return state

    def set_state(self, state: dict[str, np.ndarray], params: Sequence[Any]) -> None:
        super().set_state(state, params)
        if "u_product" in state:
            value = np.asarray(state["u_product"]).astype(self._u_product.dtype).reshape(())
            self._u_product = backend.asarray(value, device=self._device)

    def to(self, device) -> None:
        if self.built:
            u = backend.to_numpy(self._u_product)
        super().to(device)
        if self.built:
            self._u_product = backend.asarray(u, device=self._device)


class Lion(_ComposedOptimizer):
    """Keras 3 Lion: ``p -= lr sign(b1 m + (1 - b1) g)``, then ``m = b2 m + (1 - b2) g``."""

    _slot_names = ("momentum",)

    def __init__(self, learning_rate=0.001, beta_1: float = 0.9, beta_2: float = 0.99,
                 weight_decay: float | None = None, name: str | None = None, **kwargs) -> None:
        super().__init__(learning_rate, weight_decay, name, **kwargs)
        if not 0.0 < float(beta_1) <= 1.0:
            raise ValueError(f"Argument `beta_1` must be in the [0, 1] range. Otherwise, the optimizer degenerates "
                             f"to SignSGD. Received: beta_1={beta_1}.")
        self.beta_1, self.beta_2 = float(beta_1), _beta("Lion", "beta_2", beta_2, high_open=False)

    def _rule(self, r, p, g, slots, lr, step):
        m = slots["momentum"]
        direction = r.sign(r.add(r.mul(m, self.beta_1), r.mul(g, 1.0 - self.beta_1)))
        new_m = r.add(r.mul(m, self.beta_2), r.mul(g, 1.0 - self.beta_2))
        return r.sub(p, r.mul(direction, lr)), {"momentum": new_m}

    def get_config(self):
        return {**super().get_config(), "beta_1": self.beta_1, "beta_2": self.beta_2}


class Lamb(_TwoBetas):
    """Keras 3 Lamb: Adam's bias-corrected ``m / (sqrt(v) + eps)`` scaled by the trust ratio
    ``||p|| / ||update||`` (1 where either norm is 0)."""

    _slot_names = ("momentum", "velocity")

    def _rule(self, r, p, g, slots, lr, step):
        m = r.add(slots["momentum"], r.mul(r.sub(g, slots["momentum"]), 1 - self.beta_1))
        v = r.add(slots["velocity"], r.mul(r.sub(r.square(g), slots["velocity"]), 1 - self.beta_2))
        m_hat = r.div(m, r.sub(1.0, r.pow(self.beta_1, step)))
        v_sqrt = r.add(r.sqrt(r.div(v, r.sub(1.0, r.pow(self.beta_2, step)))), self.epsilon)
        update = r.div(m_hat, v_sqrt)
        w_norm, g_norm = r.sqrt(r.sum(r.square(p))), r.sqrt(r.sum(r.square(update)))
        ratio = r.where(r.greater(w_norm, 0.0), r.where(r.greater(g_norm, 0.0), r.div(w_norm, g_norm), 1.0), 1.0)
        return r.sub(p, r.mul(r.mul(update, ratio), lr)), {"momentum": m, "velocity": v}


class Ftrl(_ComposedOptimizer):
    """Keras 3 FTRL-proximal (McMahan et al.), with its L1, L2 and L2-shrinkage strengths and ``beta``."""

    _slot_names = ("accumulator", "linear")
    _slot_init = {"accumulator": lambda self: self.initial_accumulator_value}

    def __init__(self, learning_rate=0.001, learning_rate_power: float = -0.5, initial_accumulator_value: float = 0.1,
                 l1_regularization_strength: float = 0.0, l2_regularization_strength: float = 0.0,
                 l2_shrinkage_regularization_strength: float = 0.0, beta: float = 0.0,
                 weight_decay: float | None = None, name: str | None = None, **kwargs) -> None:
        super().__init__(learning_rate, weight_decay, name, **kwargs)
        checks = (("initial_accumulator_value", initial_accumulator_value, "a non-negative"),
                  ("l1_regularization_strength", l1_regularization_strength, "a non-negative"),
                  ("l2_regularization_strength", l2_regularization_strength, "a non-negative"),
                  ("l2_shrinkage_regularization_strength", l2_shrinkage_regularization_strength, "a non-negative"))
        for label, value, what in checks:
            if float(value) < 0.0:
                raise ValueError(f"`{label}` needs to be {what} float. Received: {label}={value}.")
        if float(learning_rate_power) > 0.0:
            raise ValueError(f"`learning_rate_power` needs to be negative or zero. Received: "
                             f"learning_rate_power={learning_rate_power}.")
        self.learning_rate_power = float(learning_rate_power)
        self.initial_accumulator_value = float(initial_accumulator_value)
        self.l1_regularization_strength = float(l1_regularization_strength)
        self.l2_regularization_strength = float(l2_regularization_strength)
        self.l2_shrinkage_regularization_strength = float(l2_shrinkage_regularization_strength)
        self.beta = float(beta)

    def _rule(self, r, p, g, slots, lr, step):
        power = -self.learning_rate_power
        l2_reg = r.add(r.div(self.beta, r.mul(lr, 2.0)), self.l2_regularization_strength)
        grad = r.add(g, r.mul(p, 2 * self.l2_shrinkage_regularization_strength))
        accum = slots["accumulator"]
        new_accum = r.add(accum, r.square(g))
        linear = r.add(slots["linear"], r.sub(grad, r.mul(r.div(r.sub(r.pow(new_accum, power), r.pow(accum, power)),
                                                                lr), p)))
        quadratic = r.add(r.div(r.pow(new_accum, power), lr), r.mul(l2_reg, 2.0))
        l1 = self.l1_regularization_strength
        new_p = r.div(r.sub(r.clip(linear, -l1, l1), linear), quadratic)
        return new_p, {"accumulator": new_accum, "linear": linear}

    def get_config(self):
        return {**super().get_config(), "learning_rate_power": self.learning_rate_power,
                "initial_accumulator_value": self.initial_accumulator_value,
                "l1_regularization_strength": self.l1_regularization_strength,
                "l2_regularization_strength": self.l2_regularization_strength,
                "l2_shrinkage_regularization_strength": self.l2_shrinkage_regularization_strength,
                "beta": self.beta}


class Adafactor(_ComposedOptimizer):
    """Keras 3 Adafactor (Shazeer & Stern): for a parameter of 2 or more dimensions the second moment is kept
    factored, as row means ``r`` and column means ``c`` of ``g^2 + epsilon_1`` (stored here with kept axes,
    ``(..., rows, 1)`` and ``(..., 1, cols)``), and ``v = (r / mean(r)) * c``; a vector keeps ``v`` whole.
    ``beta_2_t = 1 - t^beta_2_decay``; the step is ``max(epsilon_2, rms(p)) * min(lr, 1/sqrt(t))`` times
    ``u / max(1, rms(u) / clip_threshold)`` with ``u = g / sqrt(v)``."""

    def __init__(self, learning_rate=0.001, beta_2_decay: float = -0.8, epsilon_1: float = 1e-30,
                 epsilon_2: float = 1e-3, clip_threshold: float = 1.0, relative_step: bool = True,
                 weight_decay: float | None = None, name: str | None = None, **kwargs) -> None:
        super().__init__(learning_rate, weight_decay, name, **kwargs)
        self.beta_2_decay = _validate.number(beta_2_decay, "beta_2_decay", "Adafactor")
        self.epsilon_1 = _validate.number(epsilon_1, "epsilon_1", "Adafactor", low=0.0)
        self.epsilon_2 = _validate.number(epsilon_2, "epsilon_2", "Adafactor", low=0.0)
        self.clip_threshold = _validate.number(clip_threshold, "clip_threshold", "Adafactor", low=0.0, low_open=True)
        self.relative_step = bool(relative_step)

    def _slot_names_for(self, p):
        return ("r", "c", "velocity") if len(p.shape) >= 2 else ("velocity",)

    def build(self, params: Sequence[Any]) -> None:
        super().build(params)
        for p, slots in zip(params, self._slots):
            if "r" in slots:
                shape = tuple(p.shape)
                slots["r"] = _numeric.full(shape[:-1] + (1,), 0.0, p.dtype, device=self._device)
                slots["c"] = _numeric.full(shape[:-2] + (1, shape[-1]), 0.0, p.dtype, device=self._device)

    def _rms(self, r, x):
        return r.sqrt(_numeric.reduce("mean", r.square(x), dtype=r.dtype))

    def _rule(self, r, p, g, slots, lr, step):
        inv_sqrt_t = r.div(1.0, r.sqrt(step))
        # min(lr, 1/sqrt(t)) whatever relative_step says: Keras 3.15's update takes that minimum twice
        rho_t = r.where(r.greater(lr, inv_sqrt_t), inv_sqrt_t, lr)
        alpha_t = r.mul(r.maximum(self._rms(r, p), self.epsilon_2), rho_t)
        grad_sq = r.add(r.square(g), self.epsilon_1)
        beta_2_t = r.sub(1.0, r.pow(step, self.beta_2_decay))
        new = {}
        if "r" in slots:
            mean = lambda x, axis: _numeric.reduce("mean", x, axis=axis, keepdims=True, dtype=r.dtype)  # noqa: E731
            new["r"] = r.add(r.mul(slots["r"], beta_2_t), r.mul(mean(grad_sq, -1), r.sub(1.0, beta_2_t)))
            new["c"] = r.add(r.mul(slots["c"], beta_2_t), r.mul(mean(grad_sq, -2), r.sub(1.0, beta_2_t)))
            new["velocity"] = r.mul(r.div(new["r"], mean(new["r"], -2)), new["c"])
        else:
            new["velocity"] = r.add(r.mul(slots["velocity"], beta_2_t), r.mul(grad_sq, r.sub(1.0, beta_2_t)))
        u_t = r.div(g, r.sqrt(new["velocity"]))
        u_hat = r.div(u_t, r.maximum(r.div(self._rms(r, u_t), self.clip_threshold), 1.0))
        return r.sub(p, r.mul(u_hat, alpha_t)), new

    def get_config(self):
        return {**super().get_config(), "beta_2_decay": self.beta_2_decay, "epsilon_1": self.epsilon_1,
                "epsilon_2": self.epsilon_2, "clip_threshold": self.clip_threshold,
                "relative_step": self.relative_step}


class ScheduleFreeAdamW(_ComposedOptimizer):
    """Keras 3 ScheduleFreeAdamW (Defazio et al.): Adam steps on ``z`` (the "momentum" slot, starting as a copy of
    the parameter), ``x`` the running average of the ``z`` (weight ``1/t``), and the parameter held at
    ``y = (1 - b1) z + b1 x``; an optional linear learning-rate warm-up over ``warmup_steps``."""

    _slot_names = ("momentum", "velocity")

    def __init__(self, learning_rate=0.0025, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-8,
                 warmup_steps: int = 0, weight_decay: float | None = None, name: str | None = None, **kwargs) -> None:
        super().__init__(learning_rate, weight_decay, name, **kwargs)
        self.beta_1 = _validate.number(beta_1, "beta_1", "ScheduleFreeAdamW", low=0.0, high=1.0, low_open=True)
        self.beta_2 = _beta("ScheduleFreeAdamW", "beta_2", beta_2)
        self.epsilon = _validate.number(epsilon, "epsilon", "ScheduleFreeAdamW", low=0.0)
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"ScheduleFreeAdamW: warmup_steps must be an int >= 0, got {warmup_steps!r}")
        self.warmup_steps = warmup_steps

    def build(self, params: Sequence[Any]) -> None:
        super().build(params)
        for p, slots in zip(params, self._slots):  # z starts at the parameter, as in Keras
            _numeric.binary("add", p, 0.0, dtype=p.dtype, out=slots["momentum"])

    def _rule(self, r, p, g, slots, lr, step):
        b1, b2 = self.beta_1, self.beta_2
        if self.warmup_steps > 0:
            factor = r.div(step, float(self.warmup_steps))
            lr = r.mul(r.where(r.greater(factor, 1.0), 1.0, factor), lr)
        z_old = slots["momentum"]
        v = r.add(slots["velocity"], r.mul(r.sub(r.square(g), slots["velocity"]), 1 - b2))
        denom = r.add(r.sqrt(r.div(v, r.sub(1.0, r.pow(b2, step)))), self.epsilon)
        z = r.sub(z_old, r.div(r.mul(g, lr), denom))
        weight = r.div(1.0, step)
        x_old = r.div(r.sub(p, r.mul(z_old, 1 - b1)), b1)
        x_new = r.add(r.mul(x_old, r.sub(1.0, weight)), r.mul(z, weight))
        return r.add(r.mul(z, 1 - b1), r.mul(x_new, b1)), {"momentum": z, "velocity": v}

    def get_config(self):
        return {**super().get_config(), "beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon,
                "warmup_steps": self.warmup_steps}


class LossScaleOptimizer(Optimizer):
    """Keras 3's ``LossScaleOptimizer(inner_optimizer, initial_scale=2**15, dynamic_growth_steps=2000)``: dynamic
    loss scaling around another optimizer.

    In a custom training step, ``loss = optimizer.scale_loss(loss)`` multiplies the loss by the current scale;
    the next ``apply`` divides the gradients by it, skips the update when any gradient is not finite
    (on the device: the flag is never read on the host) and halves the scale, and doubles it after
    ``dynamic_growth_steps`` finite steps in a row (one read of a device counter every that many steps).
    Without a ``scale_loss`` call since the last update the gradients are taken as unscaled (dnnbind's
    ``fit`` does not call it: under ``mixed_float16`` on a GPU it scales the loss itself and hands the
    scaled gradients here with their scale, which passes them on to the inner optimizer).
    ``iterations``, ``learning_rate`` and the state are the inner optimizer's."""

    def __init__(self, inner_optimizer: Optimizer, initial_scale: float = 2.0**15, dynamic_growth_steps: int = 2000,
                 name: str | None = None, **kwargs: Any) -> None:
        if not isinstance(inner_optimizer, Optimizer):
            raise TypeError(f"LossScaleOptimizer: inner_optimizer must be a dnnbind optimizer, got "
                            f"{type(inner_optimizer).__name__}")
        if isinstance(inner_optimizer, LossScaleOptimizer):
            raise TypeError("LossScaleOptimizer: inner_optimizer is already a LossScaleOptimizer")
        if kwargs:
            raise TypeError(f"LossScaleOptimizer: unexpected keyword argument(s) {', '.join(sorted(kwargs))}")
        # no Optimizer.__init__: the state (slots, learning rate, step count) is the inner optimizer's, and
        # every private attribute not set here is read from it (__getattr__)
        self.name = name or "loss_scale_optimizer"
        self.built = False
        self.inner_optimizer = inner_optimizer
        self.initial_scale = _validate.number(initial_scale, "initial_scale", "LossScaleOptimizer", low=0.0,
                                              low_open=True)
        self.dynamic_growth_steps = _validate.positive_int(dynamic_growth_steps, "dynamic_growth_steps",
                                                           "LossScaleOptimizer")
        self._scale = None  # a trainers.precision.LossScale, made on the parameters' device at the first update
        self._loss_scaled = False

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("inner_optimizer")
        if inner is None or not name.startswith("_"):
            raise AttributeError(f"'LossScaleOptimizer' object has no attribute {name!r}")
        return getattr(inner, name)

    def _sync_lr(self, stream: Any = None) -> None:
        self.inner_optimizer._sync_lr(stream)

    def _confirm_iterations(self) -> None:
        self.inner_optimizer._confirm_iterations()

    def _slot_names_for(self, p) -> tuple[str, ...]:
        return self.inner_optimizer._slot_names_for(p)

    @property
    def weight_decay(self):
        return self.inner_optimizer.weight_decay

    @property
    def scale(self):
        """The current loss scale (a 0-d array on the parameters' device; ``initial_scale`` before the first update)."""
        return self.initial_scale if self._scale is None else self._scale.scale

    dynamic_scale = scale

    def _loss_scale(self, device):
        if self._scale is None:
            from .trainers.precision import LossScale  # (deferred: the trainers sit above the optimizers)
            self._scale = LossScale(device, initial=self.initial_scale, growth_steps=self.dynamic_growth_steps)
        return self._scale

    def scale_loss(self, loss: Any) -> Any:
        """``loss`` times the current scale (a Tensor stays on the tape); the next update unscales."""
        self._loss_scaled = True
        if self._scale is None:
            return loss * self.initial_scale
        from . import ops  # (deferred: ops sit above the optimizers)
        return ops.multiply(loss, ops.convert_to_tensor(backend.to_numpy(self._scale.scale)))

    def _apply_raw(self, params, grads, *, grad_scale: Any = None, skip: Any = None) -> None:
        if grad_scale is not None or not params:  # the trainer's own loss scaling: pass it on
            self.inner_optimizer._apply_raw(params, grads, grad_scale=grad_scale, skip=skip)
            return
        scale = self._loss_scale(backend.device_of(params[0]))
        own_skip, finite = scale.check(list(grads))
        if skip is not None:
            own_skip = _numeric.binary("maximum", own_skip, skip if hasattr(skip, "shape") else int(skip),
                                       dtype=np.int32)
        self.inner_optimizer._apply_raw(params, grads, grad_scale=scale.scale if self._loss_scaled else None,
                                        skip=own_skip)
        scale.update(finite)
        scale.maybe_grow()
        self._loss_scaled = False

    def build(self, params: Sequence[Any]) -> None:
        self.inner_optimizer.build(params)
        self.built = True

    @property
    def iterations(self) -> int:
        return self.inner_optimizer.iterations

    @iterations.setter
    def iterations(self, value: int) -> None:
        if hasattr(self, "inner_optimizer"):
            self.inner_optimizer.iterations = value

    @property
    def learning_rate(self) -> float:
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, value) -> None:
        if hasattr(self, "inner_optimizer"):
            self.inner_optimizer.learning_rate = value

    def _lr_at(self, step: int) -> float:
        return self.inner_optimizer._lr_at(step)

    @property
    def variables(self) -> list[Any]:
        return self.inner_optimizer.variables

    def get_state(self) -> dict[str, np.ndarray]:
        return self.inner_optimizer.get_state()

    def set_state(self, state: dict[str, np.ndarray], params: Sequence[Any]) -> None:
        self.inner_optimizer.set_state(state, params)

    def to(self, device) -> None:
        self.inner_optimizer.to(device)
        self._scale = None

    def _reads_compute_grads(self) -> bool:
        return False

    def get_config(self) -> dict:
        return {"name": self.name, "inner_optimizer": serialize(self.inner_optimizer),
                "initial_scale": self.initial_scale, "dynamic_growth_steps": self.dynamic_growth_steps}

    @classmethod
    def from_config(cls, config: dict, custom_objects: "dict | None" = None) -> "LossScaleOptimizer":
        config = dict(config)
        inner = config.pop("inner_optimizer")
        return cls(deserialize(inner, custom_objects) if isinstance(inner, dict) else get(inner), **config)


class _LegacyOptimizer:
    """``keras.optimizers.legacy.*``: Keras 3 refuses them, and so does dnnbind."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise ImportError("`keras.optimizers.legacy` is not supported in Keras 3 (nor in dnnbind): use "
                          "dnnbind.optimizers.<Name> (SGD, Adam, RMSprop, Adagrad, Ftrl, ...) instead")


class _LegacyNamespace:
    """``dnnbind.optimizers.legacy``: the Keras 2 names, each refusing as Keras 3 does."""

    Adagrad = Adam = Ftrl = Optimizer = RMSprop = SGD = _LegacyOptimizer


legacy = _LegacyNamespace()


_BY_NAME = {"sgd": SGD, "adam": Adam, "adamw": AdamW, "rmsprop": RMSprop, "adagrad": Adagrad, "adadelta": Adadelta,
            "adamax": Adamax, "nadam": Nadam, "lion": Lion, "lamb": Lamb, "ftrl": Ftrl,
            "adafactor": Adafactor, "schedulefreeadamw": ScheduleFreeAdamW, "lossscaleoptimizer": LossScaleOptimizer}
# the updates that hand their gradients straight to the fused ops (see _reads_compute_grads)
_FUSED_UPDATES = frozenset([SGD._update, Adam._update, RMSprop._update])


def get(identifier: Any) -> Optimizer:
    """An optimizer from a name (``"adam"``, ``"sgd"``...), a config dict, a class or an instance."""
    if isinstance(identifier, Optimizer):
        return identifier
    if isinstance(identifier, type) and issubclass(identifier, Optimizer):
        return identifier()
    if isinstance(identifier, str):
        cls = _BY_NAME.get(identifier.strip().lower())
        if cls is None:
            raise ValueError(f"unknown optimizer {identifier!r}; known optimizers: {', '.join(sorted(_BY_NAME))}")
        return cls()
    if isinstance(identifier, dict):
        cls = _BY_NAME.get(str(identifier.get("class_name", "")).lower())
        if cls is None:
            raise ValueError(f"unknown optimizer class {identifier.get('class_name')!r}; known: "
                             f"{', '.join(c.__name__ for c in _BY_NAME.values())}")
        return cls.from_config(identifier.get("config", {}))
    raise TypeError(f"cannot interpret {identifier!r} as an optimizer; use a name such as 'adam' or an instance")


def serialize(optimizer: Optimizer) -> dict:
    return {"class_name": type(optimizer).__name__, "config": optimizer.get_config()}


def deserialize(config: dict, custom_objects: "dict | None" = None) -> Optimizer:
    """An optimizer from :func:`serialize`'s dict or Keras 3's (``{"module", "class_name", "config", ...}``);
    the user's classes through ``custom_objects`` and the registry (``register_keras_serializable``)."""
    if not isinstance(config, dict) or not isinstance(config.get("class_name"), str):
        raise TypeError(f"optimizers.deserialize: expected {{'class_name': str, 'config': dict}}, got "
                        f"{str(config)[:120]}")
    cls = _keras_objects.find_custom_class(config["class_name"], config.get("registered_name"), custom_objects)
    if cls is not None:
        return cls.from_config(config.get("config") or {})
    return get(config)
