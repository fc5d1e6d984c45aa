"""BatchNormalization and LayerNormalization (Keras 3 arguments), computed by ``kernels.batchnorm_*`` /
``kernels.layernorm_*`` with float32 statistics (float64 for float64 data); ``SyncBatchNormalization``
(``BatchNormalization(synchronized=True)``) takes its training statistics over every rank's batch
under a data-parallel distribution (:mod:`.sync_batchnorm`)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from dnnbind import _validate, backend, kernels
from dnnbind import distribution as _distribution
from dnnbind import initializers as _init
from dnnbind import ops as _ops

from .base import Layer, register, split_batch
from .sync_batchnorm import sync_batchnorm_backward, sync_batchnorm_forward

__all__ = ["BatchNormalization", "SyncBatchNormalization", "LayerNormalization", "RMSNormalization"]


@register
class BatchNormalization(Layer):
    """Normalise over the batch (and space) per channel of ``axis``.

    Supported: inputs normalised over the channel axis (``axis=-1`` for channels_last, ``axis=1`` for
    channels_first): 4-d images, 2-d ``(N, C)`` features, and other ranks (Conv1D's ``(N, steps, C)``,
    volumes), which are computed as 4-d ``(N, prod(spatial), 1, C)`` / ``(N, C, prod(spatial), 1)``.
    ``moving = momentum * moving + (1 - momentum) * batch_statistic`` (Keras). The batch variance
    that feeds ``moving_variance`` is the biased one, as Keras (on every path: cuDNN's unbiased update
    is corrected, the fused convolution + batch norm and the synchronised forms use the biased one).
    Weights (Keras order): ``gamma`` (if ``scale``), ``beta`` (if ``center``), ``moving_mean``,
    ``moving_variance``; all float32 whatever the dtype policy.

    ``synchronized=True`` (Keras 3; also spelled ``SyncBatchNormalization``, torch's
    ``SyncBatchNorm``): under a ``dnnbind.distribution.DataParallel`` distribution, training
    batches are normalised with the mean and variance of the global batch (every rank's rows: the
    per-channel sums are all-reduced in forward, the two gradient sums in backward; each rank's
    batch must have the same size). Without a distribution it is exactly BatchNormalization.
    """

    def __init__(self, axis: int = -1, momentum: float = 0.99, epsilon: float = 1e-3, center: bool = True,
                 scale: bool = True, beta_initializer: Any = "zeros", gamma_initializer: Any = "ones",
                 moving_mean_initializer: Any = "zeros", moving_variance_initializer: Any = "ones",
                 synchronized: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"{type(self).__name__} '{self.name}'"
        if isinstance(axis, (list, tuple)):
            if len(axis) != 1:
                raise NotImplementedError(f"{owner}: only one axis is supported, got {axis}")
            axis = axis[0]
        self.axis = _validate.integer(axis, "axis", owner)
        self.momentum = _validate.number(momentum, "momentum", owner, low=0.0, high=1.0)
        self.epsilon = _validate.number(epsilon, "epsilon", owner, low=0.0, low_open=True)
        self.center = _validate.boolean(center, "center", owner)
        self.scale = _validate.boolean(scale, "scale", owner)
        self.synchronized = _validate.boolean(synchronized, "synchronized", owner)
        self.beta_initializer = _init.get(beta_initializer)
        self.gamma_initializer = _init.get(gamma_initializer)
        self.moving_mean_initializer = _init.get(moving_mean_initializer)
        self.moving_variance_initializer = _init.get(moving_variance_initializer)

    def _layout_for(self, shape: tuple[int, ...]) -> tuple[str, str, int]:
        """(mode, layout, channels) for a sample shape, or a clear error."""
        rank = len(shape) + 1
        axis = self.axis % rank if -rank <= self.axis < rank else None
        if rank == 4 and axis == 3:
            return "spatial", "NHWC", shape[2]
        if rank == 4 and axis == 1:
            return "spatial", "NCHW", shape[0]
        if rank == 2 and axis == 1:
            return "per_activation", "NCHW", shape[0]
        # other ranks (Conv1D's (batch, steps, channels), Conv3D's volumes): folded into 4-d (see _fold)
        if rank >= 3 and axis == rank - 1:
            return "spatial", "NHWC", shape[-1]
        if rank >= 3 and axis == 1:
            return "spatial", "NCHW", shape[0]
        raise NotImplementedError(
            f"BatchNormalization '{self.name}': axis={self.axis} on inputs of shape (batch, "
            f"{', '.join(map(str, shape))}) is not supported; normalise over the channel axis: the last "
            "(axis=-1) or the first after the batch (axis=1)"
        )

    def _folded(self) -> bool:
        """True for inputs of rank 3 or >= 5: computed as 4-d (the same per-channel statistics)."""
        return self.__dict__.get("_sample_rank", 1) not in (1, 3)

    def _fold(self, x: Any) -> Any:
        """``x`` (batch, *spatial, C) as (batch, prod(spatial), 1, C); (batch, C, *spatial) as
        (batch, C, prod(spatial), 1). The batch size is read from ``x``."""
        shape = tuple(x.shape)
        rest = int(np.prod(shape[2:] if self.layout == "NCHW" else shape[1:-1], dtype=np.int64))
        return x.reshape((shape[0], shape[1], rest, 1) if self.layout == "NCHW" else (shape[0], rest, 1, shape[-1]))

    def build(self, input_shape):
        _, shape = split_batch(input_shape)
        self._mode, self.layout, c = self._layout_for(shape)
        self._sample_rank = len(shape)
        f32 = "float32"
        self.gamma = self._add_weight("gamma", (c,), self.gamma_initializer, dtype=f32) if self.scale else None
        self.beta = self._add_weight("beta", (c,), self.beta_initializer, dtype=f32) if self.center else None
        self.moving_mean = self._add_weight("moving_mean", (c,), self.moving_mean_initializer, trainable=False,
                                           dtype=f32)
        self.moving_variance = self._add_weight("moving_variance", (c,), self.moving_variance_initializer,
                                               trainable=False, dtype=f32)
        self._consts: dict[str, Any] = {}
        self._set_built(shape)

    def _on_device_change(self) -> None:
        self._consts = {}

    def _param(self, w, fill: float):
        """gamma/beta, or a constant stand-in when scale/center is off (ops always take both)."""
        if w is not None:
            return w.value
        key = f"{fill}"
        if key not in self._consts:
            c = self.moving_mean.shape[0]
            self._consts[key] = backend.asarray(np.full((c,), fill, np.float32), device=self.device)
        return self._consts[key]

    def _kwargs(self) -> dict:
        return {"epsilon": self.epsilon, "mode": self._mode, "layout": self.layout}

    def _replica(self) -> Any:
        """The distribution's replica a synchronised layer reduces its statistics with, or None."""
        if not self.synchronized:
            return None
        dist = _distribution.distribution()
        return None if dist is None else dist.replica()

    def _fusable(self, training: bool) -> bool:
        """Whether a forward with ``training`` runs the plain training op, the one a following relu
        can fuse into (:meth:`_forward_fused`): trainable, no replica to synchronise with, 2-d or 4-d."""
        return bool(training) and self.trainable and self._replica() is None and not self._folded()

    def _forward_fused(self, x, training, activation: str):
        """``forward(x, training)`` followed by ``activation`` (``"relu"``), applied by the batch-norm
        op itself; the next :meth:`backward` takes the gradient w.r.t. the activated output. For
        a layer chain's fusion schedule (``models/chain.py``), which asks :meth:`_fusable` first."""
        if activation != "relu" or not self._fusable(training):
            raise RuntimeError(f"BatchNormalization '{self.name}': cannot fuse activation {activation!r} into a "
                               f"forward with training={training!r} (trainable={self.trainable}, "
                               f"synchronized={self.synchronized})")
        return self._forward(x, training, activation)

    def _forward_after_conv(self, x, w, conv_kwargs: dict, training, activation: "str | None"):
        """The training forward of ``conv(x, w)`` (``conv_kwargs``: ``kernels.conv2d_forward``'s keywords)
        then this batch norm (then ``activation``), through ``kernels.conv2d_batchnorm_forward_training``, which
        may compute the statistics in the convolution's epilogue. Returns this layer's output; the next
        :meth:`backward` is the usual one, its ``dx`` the gradient of the convolution's output. For
        a layer chain's fusion schedule, which asks :meth:`_fusable` first (and that the layout is NHWC)."""
        if not self._fusable(training) or activation not in (None, "relu") or self.layout != "NHWC":
            raise RuntimeError(f"BatchNormalization '{self.name}': cannot take a convolution into a forward with "
                               f"training={training!r} (trainable={self.trainable}, synchronized="
                               f"{self.synchronized}, layout={self.layout}, activation={activation!r})")
        gamma, beta = self._param(self.gamma, 1.0), self._param(self.beta, 0.0)
        y, out, self._saved = kernels.conv2d_batchnorm_forward_training(
            x, w, gamma, beta, self.moving_mean.value, self.moving_variance.value, momentum=self.momentum,
            epsilon=self.epsilon, activation=activation, **conv_kwargs)
        self._sync_replica = None
        self._x, self._training_forward = y, True
        self._activation, self._y = activation, (None if activation is None else out)
        return out

    def _check_backward_through_conv(self) -> None:
        """Raise unless the last forward can take :meth:`_backward_through_conv`: a training forward fused with
        its relu over NHWC data (the fused op's layout)."""
        if (self.__dict__.get("_activation") != "relu" or self.__dict__.get("_sync_replica") is not None
                or self.layout != "NHWC"):
            raise RuntimeError(f"BatchNormalization '{self.name}': a backward through a convolution needs a training "
                               f"forward fused with its relu over NHWC data (layout {self.layout})")

    def _backward_through_conv(self, dy, w, conv_kwargs: dict):
        """The backward of a convolution (filter ``w``, ``conv_kwargs``) applied to this layer's relu'd output,
        from the convolution's output gradient ``dy``, down to this layer's input, through
        ``kernels.batchnorm_relu_conv2d_backward`` (on CUDA possibly one cuDNN graph: the data gradient, the relu
        and the batch-norm weight gradients). Fills this layer's grads like :meth:`backward`; returns dx. For
        a layer chain's fusion schedule, after a forward fused with the relu (:meth:`_forward_fused`)."""
        self._check_backward_through_conv()
        gamma, beta = self._param(self.gamma, 1.0), self._param(self.beta, 0.0)
        return self._finish_backward(*kernels.batchnorm_relu_conv2d_backward(
            dy, w, self._x, self._y, gamma, beta, self._saved, epsilon=self.epsilon, **conv_kwargs))

    def forward(self, x, training=False):
        if self._folded():
            self._unfolded_shape = tuple(x.shape)
            return self._forward(self._fold(x), training, None).reshape(self._unfolded_shape)
        return self._forward(x, training, None)

    def _forward(self, x, training, activation):
        x = self._cast_input(x)
        gamma, beta = self._param(self.gamma, 1.0), self._param(self.beta, 0.0)
        replica = self._replica() if training and self.trainable else None
        self._sync_replica = replica  # what backward follows: this forward's path
        if replica is not None:
            y, self._sync_xhat, self._sync_scale = sync_batchnorm_forward(
                x, gamma, beta, self.moving_mean.value, self.moving_variance.value, momentum=self.momentum,
                epsilon=self.epsilon, layout=self.layout, world_size=replica.world_size,
                all_reduce=replica.step_all_reduce)
            self._training_forward = True
            return y
        if training and self.trainable:
            y, self._saved = kernels.batchnorm_forward_training(
                x, gamma, beta, self.moving_mean.value, self.moving_variance.value, momentum=self.momentum,
                activation=activation, **self._kwargs())
            self._x, self._training_forward = x, True
            # with a fused activation, its backward needs the activated output (its mask is y > 0)
            self._activation, self._y = activation, (None if activation is None else y)
            return y
        self._training_forward = False
        return kernels.batchnorm_forward_inference(x, gamma, beta, self.moving_mean.value, self.moving_variance.value,
                                               **self._kwargs())

    def backward(self, dy, need_dx=True):
        if self._folded():
            return self._backward(self._fold(dy)).reshape(self._unfolded_shape)
        return self._backward(dy)

    def _backward(self, dy):
        gamma = self._param(self.gamma, 1.0)
        if not getattr(self, "_training_forward", False):
            # frozen (inference-mode) BN is a per-channel affine map: dx = dy * gamma / sqrt(var + eps),
            # which is exactly the inference forward applied to dy with a zero mean and zero beta
            zeros = self._param(None, 0.0)
            return kernels.batchnorm_forward_inference(dy, gamma, zeros, zeros, self.moving_variance.value,
                                                   **self._kwargs())
        replica = self.__dict__.get("_sync_replica")
        if replica is not None:
            dx, dgamma, dbeta = sync_batchnorm_backward(dy, self._sync_xhat, self._sync_scale, layout=self.layout,
                                                        world_size=replica.world_size,
                                                        all_reduce=replica.step_all_reduce)
            self._sync_xhat = self._sync_scale = self._sync_replica = None
        else:
            activation = self.__dict__.get("_activation")
            dx, dgamma, dbeta = kernels.batchnorm_backward(dy, self._x, gamma, self._saved, activation=activation,
                                                       y=self._y if activation is not None else None,
                                                       **self._kwargs())
        return self._finish_backward(dx, dgamma, dbeta)

    def _finish_backward(self, dx, dgamma, dbeta):
        """Keep the parameter gradients, drop the forward's state; returns ``dx``."""
        if self.gamma is not None:
            self.grads["gamma"] = dgamma
        if self.beta is not None:
            self.grads["beta"] = dbeta
        # Dropping the saved state frees cuDNN's reserve space here, inside a captured step.
        self._x = self._saved = self._y = self._activation = None
        return dx

    def get_config(self):
        return {**super().get_config(), "axis": self.axis, "momentum": self.momentum, "epsilon": self.epsilon,
                "center": self.center, "scale": self.scale,
                "beta_initializer": _init.serialize(self.beta_initializer),
                "gamma_initializer": _init.serialize(self.gamma_initializer),
                "moving_mean_initializer": _init.serialize(self.moving_mean_initializer),
                "moving_variance_initializer": _init.serialize(self.moving_variance_initializer),
                "synchronized": self.synchronized}


@register
class SyncBatchNormalization(BatchNormalization):
    """``BatchNormalization(synchronized=True)`` (torch users know it as ``SyncBatchNorm``): the
    training statistics of the global batch under a data-parallel distribution. Same arguments and
    weights; files meant for Keras should use ``BatchNormalization(synchronized=True)`` (Keras has
    no class of this name, and weights are keyed by the class's snake-case name)."""

    def __init__(self, *args: Any, synchronized: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, synchronized=synchronized, **kwargs)


@register
class LayerNormalization(Layer):
    """Normalise each sample over ``axis`` with its own mean and (biased) variance (Keras 3)::

        y = (x - mean) / sqrt(var + epsilon) * gamma + beta

    ``axis`` (an int or a list of ints, default -1) must name the trailing axes of the input (e.g.
    ``-1``, or ``[-3, -2, -1]`` for a whole channels_last image); other axis sets raise
    NotImplementedError. Weights (Keras order): ``gamma`` (if ``scale``), ``beta`` (if ``center``),
    of the shape of the normalised axes, float32 whatever the dtype policy (float64 under a float64
    policy); statistics accumulate in float32 for float16/bfloat16 data. ``rms_scaling=True`` is not
    supported.
    """

    def __init__(self, axis: "int | Sequence[int]" = -1, epsilon: float = 1e-3, center: bool = True,
                 scale: bool = True, rms_scaling: bool = False, beta_initializer: Any = "zeros",
                 gamma_initializer: Any = "ones", beta_regularizer: Any = None, gamma_regularizer: Any = None,
                 beta_constraint: Any = None, gamma_constraint: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"LayerNormalization '{self.name}'"
        if isinstance(axis, (list, tuple)):
            if not axis:
                raise ValueError(f"{owner}: axis must be an int or a non-empty list of ints, got {axis!r}")
            self.axis = [_validate.integer(a, "axis", owner) for a in axis]
        else:
            self.axis = _validate.integer(axis, "axis", owner)
        self.epsilon = _validate.number(epsilon, "epsilon", owner, low=0.0, low_open=True)
        self.center = _validate.boolean(center, "center", owner)
        self.scale = _validate.boolean(scale, "scale", owner)
        if _validate.boolean(rms_scaling, "rms_scaling", owner):
            raise NotImplementedError(f"{owner}: rms_scaling=True is not supported")
        self.rms_scaling = False
        self._set_weight_policies(beta_regularizer=beta_regularizer, gamma_regularizer=gamma_regularizer,
                                  beta_constraint=beta_constraint, gamma_constraint=gamma_constraint)
        self.beta_initializer = _init.get(beta_initializer)
        self.gamma_initializer = _init.get(gamma_initializer)

    def _norm_ndim(self, shape: tuple[int, ...]) -> int:
        """How many trailing axes ``axis`` names, for inputs of sample shape ``shape``; or a clear error."""
        rank = len(shape) + 1
        axes = self.axis if isinstance(self.axis, list) else [self.axis]
        owner = f"LayerNormalization '{self.name}'"
        resolved = []
        for a in axes:
            if not -rank <= a < rank:
                raise ValueError(f"{owner}: axis {a} is out of range for inputs of rank {rank} (shape (batch, "
                                 f"{', '.join(map(str, shape))}))")
            resolved.append(a % rank)
        k = len(set(resolved))
        if 0 in resolved or sorted(set(resolved)) != list(range(rank - k, rank)):
            raise NotImplementedError(
                f"{owner}: axis={self.axis} on inputs of rank {rank} is not supported; only the trailing axes "
                f"(e.g. -1, or [{', '.join(str(i) for i in range(-k, 0))}]) can be normalised, never the batch axis"
            )
        return k

    def build(self, input_shape):
        _, shape = split_batch(input_shape)
        k = self._norm_ndim(shape)
        pshape = tuple(shape[len(shape) - k:])
        pdt = "float64" if self.variable_dtype == "float64" else "float32"
        self.gamma = self._add_weight("gamma", pshape, self.gamma_initializer, dtype=pdt) if self.scale else None
        self.beta = self._add_weight("beta", pshape, self.beta_initializer, dtype=pdt) if self.center else None
        self._k = k
        self._set_built(shape)

    def _param(self, w, x):
        """A weight in the op's parameter dtype for ``x`` (float64 data: float64; else float32)."""
        if w is None:
            return None
        want = np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)
        return w.value if w.value.dtype == want else kernels.cast(w.value, want)

    def forward(self, x, training=False):
        x = self._cast_input(x)
        gamma = self._param(self.gamma, x)
        y, mean, inv_std = kernels.layernorm_forward(x, gamma, self._param(self.beta, x), epsilon=self.epsilon,
                                                 norm_ndim=self._k)
        if training:
            self._x, self._gamma_used, self._mean, self._inv_std = x, gamma, mean, inv_std
        return y

    def backward(self, dy, need_dx=True):
        if getattr(self, "_x", None) is None:
            raise RuntimeError(f"LayerNormalization '{self.name}': backward called without a training forward")
        param_grads = self.trainable and (self.gamma is not None or self.beta is not None)
        dx, dgamma, dbeta = kernels.layernorm_backward(dy, self._x, self._gamma_used, self._mean, self._inv_std,
                                                   norm_ndim=self._k, param_grads=param_grads)
        if param_grads:
            if self.gamma is not None:
                self.grads["gamma"] = self._to_variable_dtype(dgamma, self.gamma)
            if self.beta is not None:
                self.grads["beta"] = self._to_variable_dtype(dbeta, self.beta)
        self._x = self._gamma_used = self._mean = self._inv_std = None
        return dx

    def get_config(self):
        return {**super().get_config(), "axis": self.axis, "epsilon": self.epsilon, "center": self.center,
                "scale": self.scale, "rms_scaling": self.rms_scaling,
                "beta_initializer": _init.serialize(self.beta_initializer),
                "gamma_initializer": _init.serialize(self.gamma_initializer)}


@register
class RMSNormalization(Layer):
    """``RMSNormalization(axis=-1, epsilon=1e-6)`` (Keras 3): ``x * rsqrt(mean(x**2, axis) + epsilon) * scale``
    on :func:`dnnbind.ops.rms_normalization` (differentiable on both backends).

    ``axis``: an int or a list of ints, any axes but the batch axis, on inputs of any rank. Weight (Keras):
    ``scale``, of the sizes of the ``axis`` axes (sorted), initialised to ones. After ``build`` the
    config's ``axis`` is the sorted list, as Keras's.
    """

    def __init__(self, axis: "int | Sequence[int]" = -1, epsilon: float = 1e-6, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"RMSNormalization '{self.name}'"
        if isinstance(axis, (list, tuple)):
            if not axis:
                raise ValueError(f"{owner}: axis must be an int or a non-empty list of ints, got {axis!r}")
            self.axis = [_validate.integer(a, "axis", owner) for a in axis]
        else:
            self.axis = _validate.integer(axis, "axis", owner)
        self.epsilon = _validate.number(epsilon, "epsilon", owner, low=0.0)
        self.supports_masking = True

    def _axes(self, rank: int) -> list:
        owner = f"RMSNormalization '{self.name}'"
        axes = self.axis if isinstance(self.axis, list) else [self.axis]
        for a in axes:
            if not -rank <= a < rank:
                raise ValueError(f"{owner}: Axis {a} is out of bounds for inputs of rank {rank}. Received: "
                                 f"axis={self.axis}")
        if any(a % rank == 0 for a in axes) or len({a % rank for a in axes}) != len(axes):
            raise ValueError(f"{owner}: axis={self.axis} must name distinct axes other than the batch axis of inputs "
                             f"of rank {rank}")
        return axes

    def build(self, input_shape: Sequence[Any]) -> None:
        input_shape = tuple(input_shape)
        axes = self._axes(len(input_shape))
        if isinstance(self.axis, list):
            self.axis = sorted(self.axis)
            axes = self.axis
        else:
            self.axis = [self.axis]
        shape = tuple(input_shape[a] for a in axes)
        if any(s is None for s in shape):
            raise ValueError(f"RMSNormalization '{self.name}': the normalised axes {axes} of inputs of shape "
                             f"{input_shape} must have known sizes")
        self.scale = self.add_weight(name="scale", shape=shape, initializer="ones")
        self.built = True

    def call(self, x: Any) -> Any:
        self._axes(x.ndim)
        return _ops.rms_normalization(x, scale=self.scale, axis=self.axis, epsilon=self.epsilon)

    def compute_output_shape(self, input_shape: Sequence[Any]) -> tuple:
        self._axes(len(tuple(input_shape)))
        return tuple(input_shape)

    def get_config(self) -> dict:
        return {**super().get_config(), "axis": self.axis, "epsilon": self.epsilon}


# ----------------------------------------------------------------------------------------------------------
# Written in keras.ops (the op tape differentiates them).
@register
class GroupNormalization(Layer):
    """``GroupNormalization(groups=32, axis=-1, epsilon=1e-3, center=True, scale=True, beta_initializer="zeros",
    gamma_initializer="ones", ...)``: the channels of ``axis`` split into ``groups`` groups, each normalised by
    the mean and variance over its channels and every other non-batch axis (statistics in float32 at least, as
    Keras), then ``* gamma + beta`` per channel. ``groups=-1``: one group per channel (instance normalisation).
    Weights ``gamma`` then ``beta``, each ``(channels,)``."""

    def __init__(self, groups: int = 32, axis: int = -1, epsilon: float = 1e-3, center: bool = True,
                 scale: bool = True, beta_initializer: Any = "zeros", gamma_initializer: Any = "ones",
                 beta_regularizer: Any = None, gamma_regularizer: Any = None, beta_constraint: Any = None,
                 gamma_constraint: Any = None, **kwargs: Any) -> None:
        super().__init__(beta_regularizer=beta_regularizer, gamma_regularizer=gamma_regularizer,
                         beta_constraint=beta_constraint, gamma_constraint=gamma_constraint, **kwargs)
        owner = f"GroupNormalization '{self.name}'"
        self.groups = _validate.integer(groups, "groups", owner)
        if self.groups == 0 or self.groups < -1:
            raise ValueError(f"{owner}: groups must be a positive int or -1 (one group per channel), got {groups!r}")
        self.axis = _validate.integer(axis, "axis", owner)
        self.epsilon = float(_validate.number(epsilon, "epsilon", owner, low=0.0))
        self.center = _validate.boolean(center, "center", owner)
        self.scale = _validate.boolean(scale, "scale", owner)
        self.beta_initializer = _init.get(beta_initializer)
        self.gamma_initializer = _init.get(gamma_initializer)
        self.supports_masking = True
        self.gamma = self.beta = None

    def build(self, input_shape: Any) -> None:
        owner = f"GroupNormalization '{self.name}'"
        shape = tuple(input_shape)
        if not -len(shape) <= self.axis < len(shape) or self.axis % len(shape) == 0:
            raise ValueError(f"{owner}: axis {self.axis} is out of range (or the batch axis) for inputs of shape "
                             f"{shape}")
        dim = shape[self.axis]
        if dim is None:
            raise ValueError(f"{owner}: axis {self.axis} of the input must have a known size, got shape {shape}")
        if self.groups == -1:
            self.groups = int(dim)
        if dim < self.groups:
            raise ValueError(f"{owner}: groups ({self.groups}) cannot be more than the number of channels ({dim})")
        if dim % self.groups:
            raise ValueError(f"{owner}: the number of channels ({dim}) must be a multiple of groups ({self.groups})")
        if self.scale:
            self.gamma = self.add_weight(shape=(dim,), name="gamma", initializer=self.gamma_initializer,
                                         autocast=False)
            self.gamma.regularizer = self._policy_for("gamma", "regularizer")
            self.gamma.constraint = self._policy_for("gamma", "constraint")
        if self.center:
            self.beta = self.add_weight(shape=(dim,), name="beta", initializer=self.beta_initializer, autocast=False)
            self.beta.regularizer = self._policy_for("beta", "regularizer")
            self.beta.constraint = self._policy_for("beta", "constraint")
        self.built = True

    def call(self, inputs: Any) -> Any:
        shape = tuple(int(s) for s in inputs.shape)
        rank = len(shape)
        axis = self.axis % rank
        group_shape = list(shape)
        group_shape[axis] = shape[axis] // self.groups
        group_shape.insert(axis, self.groups)
        x = _ops.reshape(inputs, group_shape)
        in_dtype = x.dtype
        stat_dtype = np.float64 if in_dtype == np.float64 else np.float32
        x = _ops.cast(x, stat_dtype)
        axes = [a for a in range(1, rank + 1) if a != axis]
        mean, variance = _ops.moments(x, axes=axes, keepdims=True)
        inv = _ops.rsqrt(_ops.add(variance, self.epsilon))
        broadcast = [1] * (rank + 1)
        broadcast[axis], broadcast[axis + 1] = self.groups, shape[axis] // self.groups
        if self.gamma is not None:
            inv = _ops.multiply(inv, _ops.cast(_ops.reshape(self.gamma, broadcast), stat_dtype))
        res = _ops.negative(_ops.multiply(mean, inv))
        if self.beta is not None:
            res = _ops.add(res, _ops.cast(_ops.reshape(self.beta, broadcast), stat_dtype))
        y = _ops.cast(_ops.add(_ops.multiply(x, inv), res), in_dtype)
        return _ops.cast(_ops.reshape(y, shape), self.compute_dtype)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        shape = tuple(input_shape)
        if not -len(shape) <= self.axis < len(shape):
            raise ValueError(f"GroupNormalization '{self.name}': axis {self.axis} is out of bounds for input shape "
                             f"{shape}")
        return shape

    def get_config(self) -> dict:
        config = super().get_config()
        for key in ("beta_regularizer", "gamma_regularizer", "beta_constraint", "gamma_constraint"):
            config.setdefault(key, None)
        return {**config, "groups": self.groups, "axis": self.axis, "epsilon": self.epsilon, "center": self.center,
                "scale": self.scale, "beta_initializer": _init.serialize(self.beta_initializer),
                "gamma_initializer": _init.serialize(self.gamma_initializer)}


@register
class UnitNormalization(Layer):
    """``UnitNormalization(axis=-1)``: each vector along ``axis`` (an int or a list of ints) scaled to unit L2
    norm (``x * min(rsqrt(sum(x**2)), 1e12)``, :func:`dnnbind.ops.normalize`)."""

    def __init__(self, axis: Any = -1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"UnitNormalization '{self.name}'"
        if isinstance(axis, (list, tuple)):
            self.axis = [_validate.integer(a, "axis", owner) for a in axis]
        else:
            self.axis = _validate.integer(axis, "axis", owner)
        self.supports_masking = True
        self.built = True

    def call(self, inputs: Any) -> Any:
        axis = tuple(self.axis) if isinstance(self.axis, list) else self.axis
        return _ops.normalize(inputs, axis=axis, order=2, epsilon=1e-12)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return tuple(input_shape)

    def get_config(self) -> dict:
        return {**super().get_config(), "axis": self.axis}


__all__ += ["GroupNormalization", "UnitNormalization"]
