"""Core layers: Dense, Dropout, Flatten, Reshape-free activations (Activation, ReLU, Softmax, ...)."""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Sequence

import numpy as np

from dnnbind import _validate, backend, kernels
from dnnbind import initializers as _init
from dnnbind import ops as _ops
from dnnbind import quantizers as Q
from dnnbind.kernels.quantize import FUSED_ACTIVATIONS
from dnnbind.utils import draw_seed

from .base import ActivationFn, Layer, Weight, register, split_batch

__all__ = ["Dense", "Dropout", "Flatten", "Activation", "ReLU", "Softmax", "LeakyReLU", "ELU"]


class _ActivationMixin:
    """A layer with an ``activation=`` argument: owns an :class:`ActivationFn` and can skip a final softmax."""

    activation: ActivationFn

    def _set_activation(self, activation: Any) -> None:
        self.activation = ActivationFn(activation, owner=f"{type(self).__name__} '{self.name}'")
        self._skipped_softmax = False

    def _post_activation(self) -> Any:
        return self.activation.post

    @property
    def has_final_softmax(self) -> bool:
        return self.activation.is_softmax

    def _activate(self, z: Any, training: bool, skip_softmax: bool) -> Any:
        self.__dict__["_skipped_softmax"] = skip_softmax  # a per-step field (see Layer.__setattr__)
        if skip_softmax:
            return z
        return self.activation.forward(z, training)

    def _activation_backward(self, dy: Any) -> Any:
        return dy if self._skipped_softmax else self.activation.backward(dy)

    def _forward(self, x: Any, training: bool, skip_softmax: bool) -> Any:
        raise NotImplementedError

    def forward(self, x, training=False):
        return self._forward(x, training, False)

    def forward_logits(self, x, training=False):
        return self._forward(x, training, True)


def _transpose(a: np.ndarray) -> np.ndarray:
    return a.T


# What each weight of a quantized layer may hold: (integer range, or None for a float, and words for
# the error). E4M3's two NaN encodings (0x7f, 0xff) never come out of the float8 quantizer.
_QUANTIZED_VALUES = {
    "int8": ((-Q.INT8_MAX, Q.INT8_MAX), "int8 values in [-127, 127] (the abs-max quantizer's range)"),
    "float8": ((0, 255), "E4M3 bytes (uint8), none of them NaN (0x7f, 0xff)"),
    "int4": ((0, 255), "two int4 values per byte (uint8)"),
    "scale": (None, "finite scales > 0"),
    "input_scale": (None, "a finite scale >= 0 (0: computed per call)"),
}


class _QuantizedWeight(Weight):
    """A weight of a quantized layer: :meth:`checked` refuses what would not be a quantized value
    (a float array for an integer kernel, which ``astype`` would truncate; a value out of the quantizer's
    range; a scale that is zero, negative or not finite), so ``set_weights``/``load_weights`` check it
    before anything is written."""

    def __init__(self, *args: Any, kind: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kind = kind

    def checked(self, array: Any) -> np.ndarray:
        arr = super().checked(array)
        bounds, words = _QUANTIZED_VALUES[self.kind]
        owner = (f"layer '{self.layer.name}' ({type(self.layer).__name__}, quantized {self.layer.quantization_mode!r}):"
                 f" weight '{self.name}'")
        if bounds is not None:
            if arr.dtype.kind not in "iu":
                raise TypeError(f"{owner} holds {words} ({self.dtype}), got dtype {arr.dtype}: a float array would be "
                                "truncated into it; pass the quantized values (get_weights() of a quantized model), or "
                                "set the float weights on the float model, then quantize()")
            low, high = (int(arr.min()), int(arr.max())) if arr.size else bounds
            nan_bytes = self.kind == "float8" and bool(np.isin(arr, (0x7F, 0xFF)).any())
            if low < bounds[0] or high > bounds[1] or nan_bytes:
                raise ValueError(f"{owner} holds {words}, got values in [{low}, {high}]"
                                 f"{' with NaN bytes' if nan_bytes else ''}: not a {self.layer.quantization_mode} "
                                 "quantization of a kernel")
        else:
            if arr.dtype.kind != "f" and arr.dtype != _validate.BFLOAT16:
                raise TypeError(f"{owner} holds {words} (float32), got dtype {arr.dtype}")
            values = arr.astype(np.float32)
            positive = values > 0 if self.kind == "scale" else values >= 0
            if not (np.isfinite(values).all() and positive.all()):
                raise ValueError(f"{owner} holds {words}, got {values.reshape(-1)[:4]}{'...' if values.size > 4 else ''} "
                                 "(a zero or non-finite scale divides the output by zero)")
        return arr


class _InputScaleWeight(_QuantizedWeight):
    """A calibrated activation scale, ``(1,)`` float32, 0 meaning "dynamic". Its layer keeps on the host
    whether it is set, so a forward never reads the device to pick the dynamic or the static path."""

    def assign(self, array: Any) -> None:
        super().assign(array)
        self.layer._input_scale_static = bool(np.asarray(array, np.float32).reshape(-1)[0] > 0)


def check_calibration(layers: Sequence[Any], owner: str) -> None:
    """Refuse a calibration pass that would set degenerate activation scales, before any layer changes:
    no input reached the layers (an empty ``calibration_data``), or a layer's ``max|x|`` is not finite or
    so small (<= 1e-7, the scale's guard) that its int8 scale ``127 / (max|x| + 1e-7)`` explodes."""
    remedy = ("pass calibration data representative of the model's inputs, or quantize without calibration_data "
              "(the activation scales are then computed per call)")
    if not any(getattr(layer, "_calibration_rows", 0) for layer in layers):
        raise ValueError(f"{owner}: calibration_data holds no samples (no row reached the quantized layers), so it "
                         f"gives no activation scale; {remedy}")
    bad = []
    for layer in layers:
        amax, rows = getattr(layer, "_calibrated_amax", None), getattr(layer, "_calibration_rows", 0)
        if amax is None or rows == 0 or not math.isfinite(amax) or amax <= Q.EPSILON:
            scale = Q.INT8_MAX / ((amax or 0.0) + Q.EPSILON) if amax is not None and math.isfinite(amax) else amax
            bad.append(f"{type(layer).__name__} '{layer.name}' (max|x| = {amax} over {rows} rows: int8 scale {scale:.3g})")
    if bad:
        raise ValueError(f"{owner}: calibration_data gives degenerate activation scales for {', '.join(bad)}: all "
                         f"zeros, NaN/inf or no input; {remedy}")


class _QuantizableMixin:
    """``quantize(mode)`` for layers whose kernel is one ``(out, in)`` matrix once flattened (Keras 3's
    ``Layer.quantize``; inference only). Subclasses give :meth:`_float_kernel_matrix` (the float kernel as a
    host ``(out, in)`` float32 array), :meth:`_quantized_kernel_layout` and the modes they support.

    Quantized weights, in creation (and saving) order: ``kernel`` (int8, E4M3 bytes as uint8, or packed
    int4 as uint8), ``bias`` (unchanged), ``kernel_scale`` (float32) and, for layers whose activations are
    quantized, ``input_scale`` (float32 ``(1,)``, 0 until calibrated). All become non-trainable.
    """

    quantization_mode: "str | None" = None
    int4_group_size: int = Q.DEFAULT_INT4_GROUP_SIZE
    _input_scale_static = False
    _calibration_amax: "float | None" = None
    #: modes this layer computes in low precision; other modes of :data:`Q.MODES` are refused
    _quantize_modes: "tuple[str, ...]" = Q.MODES
    #: whether the activations are quantized too (an ``input_scale`` weight, calibration)
    _quantizes_inputs = True

    kernel: Any
    bias: Any

    def _float_kernel_matrix(self) -> np.ndarray:
        raise NotImplementedError

    def _kernel_dims(self) -> "tuple[int, int]":
        """``(out, in)`` of the flattened kernel."""
        raise NotImplementedError

    def _internal_kernel_shape(self) -> "tuple[int, ...]":
        """The internal shape of an int8/float8 kernel: ``(out, in)`` unless a layer keeps more axes."""
        return self._kernel_dims()

    def _quantized_kernel_layout(self, mode: str) -> "tuple[tuple[int, ...], Callable | None, Callable | None]":
        """``(Keras shape, to_internal, to_keras)`` of the quantized kernel; internal is ``(out, in)``-shaped
        (a convolution's KRSC/KCRS kernel is that once flattened)."""
        raise NotImplementedError

    @property
    def _owner(self) -> str:
        return f"{type(self).__name__} '{self.name}'"

    def _check_quantizable(self, mode: str, group_size: Any, building: bool = False) -> int:
        owner = f"{self._owner}: quantize"
        Q.check_mode(mode, owner)
        if mode not in self._quantize_modes:
            raise NotImplementedError(f"{owner}: mode {mode!r} is not supported by {type(self).__name__} (supported: "
                                      f"{', '.join(self._quantize_modes)})")
        if not self.built and not building:
            raise ValueError(f"{owner}: the layer is not built; call it on data or build the model first")
        if self.quantization_mode is not None:
            raise ValueError(f"{owner}: the layer is already quantized ({self.quantization_mode!r}); quantize the "
                             "float model once")
        if self.compute_dtype == "float64" or self.variable_dtype == "float64":
            raise TypeError(f"{owner}: the layer computes in float64; quantized kernels take float16, bfloat16 or "
                            "float32 inputs (use another dtype policy)")
        group_size = _validate.positive_int(group_size, "group_size", owner)
        if group_size < 2 or group_size % 2:
            raise ValueError(f"{owner}: group_size must be an even int >= 2, got {group_size}")
        return group_size

    def quantize(self, mode: str, *, group_size: int = Q.DEFAULT_INT4_GROUP_SIZE) -> None:
        """Replace the float kernel by its ``mode`` quantization (``"int8"``, ``"float8"``, ``"int4"``; see
        :mod:`dnnbind.quantizers`); ``group_size``: int4's inputs per scale. Nothing changes on an error."""
        group_size = self._check_quantizable(mode, group_size)
        w = self._float_kernel_matrix()
        if mode == "int8":
            q, scale = Q.abs_max_quantize(w, axis=1)
            scale = scale.reshape(-1)
        elif mode == "float8":
            qs, ds = Q.compute_float8_scale(np.max(np.abs(w)) if w.size else 0.0)
            q, scale = Q.float8_to_bits(Q.quantize_float8(w, qs)), np.array([ds], np.float32)
        else:
            q4, scale = Q.abs_max_quantize_grouped(w, group_size)
            q = Q.pack_int4(q4, axis=1)[0]
        self._quantized_build(mode, group_size, q, scale)

    def _quantized_build(self, mode: str, group_size: int, kernel: "np.ndarray | None" = None,
                         scale: "np.ndarray | None" = None) -> None:
        """Make the quantized weights: from host values (``quantize``), or zeros through ``add_weight`` (a
        layer built from a quantized config, whose weights are then loaded)."""
        n, k = self._kernel_dims()
        shape, to_internal, to_keras = self._quantized_kernel_layout(mode)
        if kernel is not None and mode != "int4":
            kernel = kernel.reshape(self._internal_kernel_shape())
        dtype = np.dtype(np.int8) if mode == "int8" else np.dtype(np.uint8)
        if mode == "int4":
            scale_shape, s_internal, s_keras = (-(-k // group_size), n), _transpose, _transpose
        else:
            scale_shape, s_internal, s_keras = ((n,) if mode == "int8" else (1,)), None, None
        bias = self.bias
        # a failure part-way (e.g. out of device memory) puts back everything this touched
        before = self._weights
        saved = {name: self.__dict__[name] for name in ("kernel", "kernel_scale", "input_scale") if name in self.__dict__}
        bias_trainable = None if bias is None else bias.trainable
        self._weights = []
        try:
            self.kernel = self._quantized_weight("kernel", shape, dtype, to_internal, to_keras, kernel, mode)
            if bias is not None:
                bias.trainable = False
                self._weights.append(bias)
            self.kernel_scale = self._quantized_weight("kernel_scale", scale_shape, np.dtype(np.float32), s_internal,
                                                       s_keras, scale, "scale")
            if self._quantizes_inputs and mode != "int4":
                self.input_scale = _InputScaleWeight(self, "input_scale", (1,),
                                                     backend.asarray(np.zeros(1, np.float32), device=self.device),
                                                     False, kind="input_scale")
                self._weights.append(self.input_scale)
                self._input_scale_static = False
            else:
                self.input_scale = None
        except BaseException:
            self._weights = before
            for name in ("kernel", "kernel_scale", "input_scale"):
                if name in saved:
                    self.__dict__[name] = saved[name]
                else:
                    self.__dict__.pop(name, None)
            if bias is not None:
                bias.trainable = bias_trainable
            raise
        self.quantization_mode = mode
        self.int4_group_size = group_size
        self.trainable = False
        self.grads = {}
        self._on_quantized()

    def _on_quantized(self) -> None:
        """Hook for what a layer keeps besides its weights."""

    def _quantized_weight(self, name: str, shape: "tuple[int, ...]", dtype: np.dtype, to_internal: Any,
                          to_keras: Any, internal: "np.ndarray | None", kind: str) -> Weight:
        """A non-trainable :class:`_QuantizedWeight` (``kind``: a key of ``_QUANTIZED_VALUES``): zeros through
        ``add_weight`` (so a weight budget probe sizes it), or the given internal-layout host value."""
        if internal is None:
            made = self._add_weight(name, shape, "zeros", trainable=False, to_internal=to_internal,
                                   to_keras=to_keras, dtype=dtype)
            value = made.value
            self._weights.remove(made)
        else:
            value = backend.asarray(np.ascontiguousarray(np.asarray(internal, dtype)), device=self.device)
        w = _QuantizedWeight(self, name, shape, value, False, to_internal, to_keras, kind=kind)
        self._weights.append(w)
        return w

    def set_input_scale(self, amax: float) -> None:
        """Calibrate: the activations' ``max|x|`` (from :meth:`Model.quantize`'s calibration pass) becomes a
        static per-tensor scale (int8: ``127 / (amax + 1e-7)``; float8: ``amax / 448``)."""
        if self.input_scale is None:
            raise ValueError(f"{self._owner}: mode {self.quantization_mode!r} does not quantize activations")
        if self.quantization_mode == "int8":
            value = np.float32(Q.INT8_MAX) / (np.float32(amax) + np.float32(Q.EPSILON))
        else:
            value = Q.compute_float8_scale(amax)[1]
        self.input_scale.assign(np.array([value], np.float32))

    # ----- calibration: the float forward records max|x| ------------------------------------------
    def _record_input(self, x: Any) -> None:
        amax = float(backend.to_numpy(kernels.abs_max(x))[0])  # calibration only: a host read is fine here
        # max() would drop a NaN: keep it, for check_calibration to refuse
        self._calibration_amax = amax if self._calibration_amax is None or math.isnan(amax) else \
            max(self._calibration_amax, amax)
        self._calibration_rows = getattr(self, "_calibration_rows", 0) + int(x.shape[0])

    def _refuse_training(self) -> None:
        raise ValueError(f"{self._owner} is quantized ({self.quantization_mode!r}) and runs inference only; "
                           "train the float model, then call model.quantize()")

    def quantized_bytes(self) -> "tuple[int, int]":
        """``(bytes of the weights now, bytes they took in the float variable dtype)``."""
        now = sum(int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize for w in self._weights)
        n, k = self._kernel_dims()
        item = _validate.normalize_dtype(self.variable_dtype).itemsize
        before = (n * k + (n if self.bias is not None else 0)) * item
        return now, before

    def _quantization_config(self) -> dict:
        if self.quantization_mode is None:
            return {}
        config = {"quantization_mode": self.quantization_mode}
        if self.quantization_mode == "int4":
            config["int4_group_size"] = self.int4_group_size
        return config

    @classmethod
    def from_config(cls, config: dict) -> Any:
        config = dict(config)
        mode = config.pop("quantization_mode", None)
        group_size = config.pop("int4_group_size", Q.DEFAULT_INT4_GROUP_SIZE)
        layer = cls(**config)
        if mode is not None:
            Q.check_mode(mode, f"{cls.__name__}.from_config: quantization_mode")
            layer._pending_quantization = (mode, group_size)
        return layer

    def _build_pending_quantization(self) -> None:
        """After ``build`` of a layer from a quantized config: quantized weights (zeros) replace the float ones."""
        pending = self.__dict__.pop("_pending_quantization", None)
        if pending is not None:
            mode, group_size = pending
            self._check_quantizable(mode, group_size, building=True)
            self._quantized_build(mode, group_size)


@register
class Dense(_QuantizableMixin, _ActivationMixin, Layer):
    """Fully connected layer ``y = activation(x @ kernel + bias)`` over the last axis.

    ``kernel`` has the Keras layout ``(in, units)`` (also the internal one: cuBLAS takes it transposed
    for free).
    """

    def __init__(self, units: int, activation: Any = None, use_bias: bool = True,
                 kernel_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"Dense '{self.name}'"
        self.units = _validate.positive_int(units, "units", owner)
        self._set_activation(activation)
        self.use_bias = _validate.boolean(use_bias, "use_bias", owner)
        self.kernel_initializer = _init.get(kernel_initializer)
        self.bias_initializer = _init.get(bias_initializer)

    def build(self, input_shape: Sequence[int]) -> None:
        _, shape = split_batch(input_shape)
        if len(shape) < 1:
            raise ValueError(f"Dense '{self.name}' needs inputs with at least one feature axis, got shape {shape}")
        self._in_features = int(shape[-1])
        pending = "_pending_quantization" in self.__dict__
        # a layer rebuilt from a quantized config makes its quantized weights only (loaded next)
        self.kernel = None if pending else self._add_weight("kernel", (shape[-1], self.units), self.kernel_initializer)
        self.bias = self._add_weight("bias", (self.units,), self.bias_initializer) if self.use_bias else None
        self._build_pending_quantization()
        self._set_built(shape)

    def _output_shape(self, input_shape):
        return (*input_shape[:-1], self.units)

    # ----- quantization (inference) ------------------------------------------------------------
    def _kernel_dims(self):
        return self.units, self._in_features

    def _float_kernel_matrix(self):
        return self.kernel.numpy().astype(np.float32).T

    def _quantized_kernel_layout(self, mode):
        k = self._in_features
        # Keras layouts: (in, out) int8/E4M3 bytes; int4 packed along `in` as keras.quantizers.pack_int4(axis=0)
        rows = -(-k // 2) if mode == "int4" else k
        return (rows, self.units), _transpose, _transpose

    def _fused_activation(self) -> "str | None":
        """The activation the quantized op applies itself (int8/float8: relu, in its GEMM's epilogue)."""
        kind = self.activation.kind
        return kind if self.quantization_mode in ("int8", "float8") and kind in FUSED_ACTIVATIONS else None

    def _quantized_matmul(self, x2: Any, b: Any, activation: "str | None") -> Any:
        mode = self.quantization_mode
        if mode == "int8":
            scale = self.input_scale.value if self._input_scale_static else None
            return kernels.int8_dense_forward(x2, self.kernel.value, self.kernel_scale.value, b, input_scale=scale,
                                          activation=activation)
        if mode == "float8":
            scale = self.input_scale.value if self._input_scale_static else None
            return kernels.float8_dense_forward(x2, self.kernel.value, self.kernel_scale.value, b, input_scale=scale,
                                            activation=activation)
        return kernels.int4_dense_forward(x2, self.kernel.value, self.kernel_scale.value, b,
                                      in_features=self._in_features, group_size=self.int4_group_size)

    def _forward(self, x: Any, training: bool, skip_softmax: bool) -> Any:
        x = self._cast_input(x)
        lead = tuple(x.shape[:-1])
        x2 = x if x.ndim == 2 else x.reshape(int(math.prod(lead)), int(x.shape[-1]))
        b = self._compute_weight(self.bias) if self.bias is not None else None
        if self.quantization_mode is not None:
            if training:
                self._refuse_training()
            # skip_softmax: z itself is asked for (see _activate)
            fused = None if skip_softmax else self._fused_activation()
            z = self._quantized_matmul(x2, b, fused)
            if fused is not None:  # applied by the op (inference only: nothing kept for a backward)
                self._skipped_softmax = False
                return z if x.ndim == 2 else z.reshape(*lead, self.units)
        else:
            if self._calibration_amax is not None:
                self._record_input(x2)
            w = self._compute_weight(self.kernel)
            z = kernels.dense_forward(x2, w, b)
            if training:
                d = self.__dict__  # per-step fields (see Layer.__setattr__)
                d["_x2"], d["_w"], d["_lead"] = x2, w, lead
        if x.ndim != 2:
            z = z.reshape(*lead, self.units)
        return self._activate(z, training, skip_softmax)

    def backward(self, dy, need_dx=True):
        if self.quantization_mode is not None:
            self._refuse_training()
        dz = self._activation_backward(dy)
        dz2 = dz if dz.ndim == 2 else dz.reshape(int(math.prod(self._lead)), self.units)
        if self.trainable:
            self.grads["kernel"] = self._to_variable_dtype(kernels.dense_backward_weight(self._x2, dz2), self.kernel)
            if self.bias is not None:
                self.grads["bias"] = self._to_variable_dtype(kernels.bias_backward(dz2), self.bias)
        dx = kernels.dense_backward_input(dz2, self._w) if need_dx else None
        if dx is not None and len(self._lead) != 1:
            dx = dx.reshape(*self._lead, int(self._x2.shape[-1]))
        d = self.__dict__
        d["_x2"] = d["_w"] = None
        return dx

    def get_config(self):
        return {**super().get_config(), "units": self.units, "activation": self.activation.config,
                "use_bias": self.use_bias, "kernel_initializer": _init.serialize(self.kernel_initializer),
                "bias_initializer": _init.serialize(self.bias_initializer), **self._quantization_config()}


@register
class Dropout(Layer):
    """Randomly zero a fraction ``rate`` of the inputs in training, scaling the rest by ``1/(1-rate)``.

    ``seed=None`` draws the mask stream's seed when the layer is created, from dnnbind's seed
    generator (:func:`dnnbind.utils.set_random_seed` makes it reproducible); ``seed`` (the config
    value) stays None. Moving the layer to another device restarts the stream from that seed.
    """

    def __init__(self, rate: float, noise_shape: Any = None, seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"{type(self).__name__} '{self.name}'"
        rate = _validate.number(rate, "rate", owner, low=0.0, high=1.0, high_open=True)
        if noise_shape is not None:
            raise NotImplementedError(f"{owner}: noise_shape is not supported")
        self.rate = float(rate)
        self.seed = None if seed is None else _validate.non_negative_int(seed, "seed", owner)
        self._seed = draw_seed() if seed is None else self.seed
        self._state = None
        self._reserve = None

    def _on_device_change(self) -> None:
        self._state = None

    # What the mask covers: one element here, a whole feature map in SpatialDropout2D.
    def _drop(self, x):
        return kernels.dropout_forward(x, self._state)

    def _drop_backward(self, dy):
        return kernels.dropout_backward(dy, self._reserve, self._state)

    def forward(self, x, training=False):
        if not training or self.rate == 0.0:
            self._reserve = None
            return x
        if self._state is None:
            self._state = kernels.DropoutState(self.rate, seed=self._seed)
        y, self._reserve = self._drop(x)
        return y

    def backward(self, dy, need_dx=True):
        if self._reserve is None:
            return dy
        dx = self._drop_backward(dy)
        self._reserve = None
        return dx

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}


@register
class Flatten(Layer):
    """Flatten all but the batch axis, in the data's own order (channels_last: H, W, C).

    The internal activation layout equals the data format, so this is a reshape (a view).
    """

    def __init__(self, data_format: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if data_format is not None:
            _validate.one_of(str(data_format).lower(), "data_format", f"Flatten '{self.name}'",
                             ("channels_last", "channels_first"))
        self.data_format = data_format

    def _output_shape(self, input_shape):
        return (int(math.prod(input_shape)),)

    def forward(self, x, training=False):
        self.__dict__["_in_shape"] = tuple(x.shape)  # a per-step field (see Layer.__setattr__)
        return x.reshape(int(x.shape[0]), int(math.prod(x.shape[1:])))

    def backward(self, dy, need_dx=True):
        return dy.reshape(*self._in_shape)

    def get_config(self):
        return {**super().get_config(), "data_format": self.data_format}


class _ActivationLayerBase(Layer):
    """A layer that applies one activation (its backward uses what the forward kept)."""

    def _make_fn(self) -> ActivationFn:
        raise NotImplementedError

    def _fn(self) -> ActivationFn:
        if getattr(self, "_act", None) is None:
            self._act = self._make_fn()
            self._skipped = False
        return self._act

    def _post_activation(self) -> Any:
        return self._fn().post

    @property
    def has_final_softmax(self) -> bool:
        return self._fn().is_softmax

    def forward(self, x, training=False):
        self.__dict__["_skipped"] = False  # a per-step field (see Layer.__setattr__)
        return self._fn().forward(self._cast_input(x), training)

    def forward_logits(self, x, training=False):
        self.__dict__["_skipped"] = True
        return self._cast_input(x)

    def backward(self, dy, need_dx=True):
        return dy if self._skipped else self._fn().backward(dy)


@register
class Activation(_ActivationLayerBase):
    """Apply a named activation (``"relu"``, ``"softmax"``, ``"gelu"``, ...)."""

    def __init__(self, activation: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.activation = activation
        self._act = ActivationFn(activation, owner=f"Activation '{self.name}'")
        self._skipped = False

    def _make_fn(self):
        return ActivationFn(self.activation)

    def get_config(self):
        return {**super().get_config(), "activation": self._act.config}


@register
class ReLU(_ActivationLayerBase):
    """``ReLU(max_value=None, negative_slope=0.0, threshold=0.0)``: plain, capped (ReLU6) or leaky."""

    def __init__(self, max_value: float | None = None, negative_slope: float = 0.0, threshold: float = 0.0,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"ReLU '{self.name}'"
        if max_value is not None:
            max_value = _validate.number(max_value, "max_value", owner, low=0.0, low_open=True)
        negative_slope = _validate.number(negative_slope, "negative_slope", owner, low=0.0)
        threshold = _validate.number(threshold, "threshold", owner)
        if threshold != 0.0:
            raise NotImplementedError(f"ReLU '{self.name}': threshold != 0 is not supported")
        if max_value is not None and negative_slope != 0.0:
            raise NotImplementedError(f"ReLU '{self.name}': max_value together with negative_slope is not supported")
        self.max_value = max_value
        self.negative_slope = negative_slope
        self.threshold = threshold

    def _make_fn(self):
        if self.max_value is not None:
            fn = ActivationFn("relu6")
            fn.alpha = self.max_value
            return fn
        if self.negative_slope:
            return ActivationFn("leaky_relu", alpha=self.negative_slope)
        return ActivationFn("relu")

    def get_config(self):
        return {**super().get_config(), "max_value": self.max_value, "negative_slope": self.negative_slope,
                "threshold": self.threshold}


@register
class LeakyReLU(_ActivationLayerBase):
    """``max(x, negative_slope * x)``; Keras 3 default slope 0.3."""

    def __init__(self, negative_slope: float = 0.3, **kwargs: Any) -> None:
        kwargs.pop("alpha", None)
        super().__init__(**kwargs)
        self.negative_slope = _validate.number(negative_slope, "negative_slope", f"LeakyReLU '{self.name}'", low=0.0)

    def _make_fn(self):
        return ActivationFn("leaky_relu", alpha=self.negative_slope)

    def get_config(self):
        return {**super().get_config(), "negative_slope": self.negative_slope}


@register
class ELU(_ActivationLayerBase):
    """``x`` for x > 0 else ``alpha * (exp(x) - 1)``."""

    def __init__(self, alpha: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.alpha = _validate.number(alpha, "alpha", f"ELU '{self.name}'")

    def _make_fn(self):
        return ActivationFn("elu", alpha=self.alpha)

    def get_config(self):
        return {**super().get_config(), "alpha": self.alpha}


@register
class Softmax(_ActivationLayerBase):
    """Softmax over the last axis (other axes are not supported)."""

    def __init__(self, axis: int = -1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.axis = _validate.integer(axis, "axis", f"Softmax '{self.name}'")

    def build(self, input_shape):
        _, shape = split_batch(input_shape)
        if self.axis not in (-1, len(shape)):
            raise NotImplementedError(
                f"Softmax '{self.name}': only the last axis is supported (axis=-1), got axis={self.axis}"
            )
        self._set_built(shape)

    def _make_fn(self):
        return ActivationFn("softmax")

    def get_config(self):
        return {**super().get_config(), "axis": self.axis}


@register
class Lambda(Layer):
    """``keras.layers.Lambda(function, output_shape=None, mask=None, arguments=None)``: ``function(inputs,
    **arguments)`` as a layer. The function is written in ``keras.ops``, so it trains with no backward.

    Saving keeps the function by its importable name (``module.qualname``); a lambda or a nested function
    cannot be written to a config (Keras serialises their bytecode, which only ``safe_mode=False`` loads:
    dnnbind never loads code from a file) — give it a name at module level instead."""

    def __init__(self, function: Callable, output_shape: Any = None, mask: Any = None,
                 arguments: "dict | None" = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not callable(function):
            raise _validate.ArgumentTypeError(f"Lambda '{self.name}': function must be callable, got "
                                              f"{type(function).__name__}")
        self.function = function
        self._output_shape_arg = output_shape
        self.mask = mask
        self.arguments = dict(arguments or {})
        self.built = True

    def call(self, inputs: Any, mask: Any = None, training: Any = None) -> Any:
        kwargs = dict(self.arguments)
        params = inspect.signature(self.function).parameters
        if "mask" in params:
            kwargs["mask"] = mask
        if "training" in params:
            kwargs["training"] = training
        return self.function(inputs, **kwargs)

    def compute_output_shape(self, input_shape: Any) -> Any:
        shape = self._output_shape_arg
        if shape is None:
            return super().compute_output_shape(input_shape)
        if callable(shape):
            return shape(input_shape)
        batch = input_shape[0] if isinstance(input_shape, (list, tuple)) and input_shape and not isinstance(
            input_shape[0], (list, tuple)) else None
        return (batch, *tuple(shape))

    def compute_mask(self, inputs: Any, previous_mask: Any = None) -> Any:
        if callable(self.mask):
            return self.mask(inputs, previous_mask)
        return self.mask

    def get_config(self) -> dict:
        fn = self.function
        name = getattr(fn, "__qualname__", "")
        if "<lambda>" in name or "<locals>" in name or not getattr(fn, "__module__", None):
            raise ValueError(f"Lambda '{self.name}': its function {name or fn!r} has no importable name, so it cannot "
                             "be saved; define it at module level (def my_fn(x): ...) and pass that")
        return {**super().get_config(), "function": {"module": fn.__module__, "name": name},
                "output_shape": self._output_shape_arg if not callable(self._output_shape_arg) else None,
                "arguments": self.arguments}

    @classmethod
    def from_config(cls, config: dict) -> "Lambda":
        config = dict(config)
        spec = config.pop("function")
        if not isinstance(spec, dict) or "module" not in spec or "name" not in spec:
            raise ValueError("Lambda.from_config: the function must be given as {'module': ..., 'name': ...} (dnnbind "
                             "does not load Python bytecode from a file)")
        import importlib  # deferred: only a Lambda being loaded names a module to import

        obj: Any = importlib.import_module(spec["module"])
        for part in spec["name"].split("."):
            obj = getattr(obj, part)
        return cls(obj, **config)


__all__ += ["Lambda"]


@register
class PReLU(Layer):
    """``PReLU(alpha_initializer="zeros", alpha_regularizer=None, alpha_constraint=None, shared_axes=None)``:
    ``relu(x) - alpha * relu(-x)`` with a learned ``alpha`` of the input's sample shape (axes in
    ``shared_axes``, counted with the batch axis as 0, get size 1 and share one slope). Written in
    ``keras.ops``."""

    def __init__(self, alpha_initializer: Any = "zeros", alpha_regularizer: Any = None, alpha_constraint: Any = None,
                 shared_axes: Any = None, **kwargs: Any) -> None:
        super().__init__(alpha_regularizer=alpha_regularizer, alpha_constraint=alpha_constraint, **kwargs)
        owner = f"PReLU '{self.name}'"
        self.alpha_initializer = _init.get(alpha_initializer)
        if shared_axes is None:
            self.shared_axes = None
        elif isinstance(shared_axes, (list, tuple)):
            self.shared_axes = [_validate.positive_int(a, "shared_axes", owner) for a in shared_axes]
        else:
            self.shared_axes = [_validate.positive_int(shared_axes, "shared_axes", owner)]
        self.supports_masking = True
        self.alpha = None

    def build(self, input_shape: Any) -> None:
        owner = f"PReLU '{self.name}'"
        shape = list(tuple(input_shape)[1:])
        for a in self.shared_axes or ():
            if a > len(shape):
                raise ValueError(f"{owner}: shared_axes {self.shared_axes} has axis {a}, beyond the rank of inputs "
                                 f"of shape {tuple(input_shape)}")
            shape[a - 1] = 1
        if any(s is None for s in shape):
            raise ValueError(f"{owner}: every non-shared axis must have a known size, got input shape "
                             f"{tuple(input_shape)}")
        self.alpha = self.add_weight(shape=tuple(int(s) for s in shape), name="alpha",
                                     initializer=self.alpha_initializer)
        self.alpha.regularizer = self._policy_for("alpha", "regularizer")
        self.alpha.constraint = self._policy_for("alpha", "constraint")
        self.built = True

    def call(self, inputs: Any) -> Any:
        pos = _ops.relu(inputs)
        neg = _ops.multiply(_ops.negative(self.alpha), _ops.relu(_ops.negative(inputs)))
        return _ops.add(pos, neg)

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return tuple(input_shape)

    def get_config(self) -> dict:
        config = super().get_config()
        config.setdefault("alpha_regularizer", None)
        config.setdefault("alpha_constraint", None)
        return {**config, "alpha_initializer": _init.serialize(self.alpha_initializer),
                "shared_axes": self.shared_axes}
__all__ += ["PReLU"]
