"""Keras 3's audio preprocessing layers: STFTSpectrogram and MelSpectrogram.

STFTSpectrogram is Keras's trainable layer: the short-time Fourier transform as a strided 1-d convolution whose
two kernels (the DFT's cosine and sine rows times a window, :class:`dnnbind.initializers.STFT`) are weights, so it
runs on both backends (cuDNN on a device), differentiates and can be fine-tuned. MelSpectrogram is Keras's data
layer (it runs in the input pipeline, not on the accelerator): :func:`dnnbind.ops.stft` (NumPy backend), the
magnitude's power, Keras's mel filter bank and the decibel scale.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

import numpy as np

from dnnbind import _validate
from dnnbind import backend as _backend
from dnnbind import initializers as _initializers
from dnnbind import ops as _ops
from dnnbind.autodiff.tensor import Tensor

from .base import Layer, register

__all__ = ["STFTSpectrogram", "MelSpectrogram"]

_MODES = ("log", "magnitude", "psd", "real", "imag", "angle", "stft")


def _int(value: Any, name: str, owner: str, low: int = 1) -> int:
    return _validate.integer(value, name, owner, minimum=low)


def _num(value: Any, name: str, owner: str) -> Any:
    """``value`` checked as a finite number and kept as given (an int stays an int in the config)."""
    _validate.number(value, name, owner)
    return value


@register
class STFTSpectrogram(Layer):
    """``STFTSpectrogram(mode="log", frame_length=256, frame_step=None, fft_length=None, window="hann",
    periodic=False, scaling="density", padding="valid", expand_dims=False, data_format=None)``: Keras 3's layer.
    Inputs ``(batch, time, channels)`` (channels_last) or ``(batch, channels, time)``, float16/32/64. Frames of
    ``frame_length`` every ``frame_step`` (default ``frame_length // 2``) are convolved with the real and imaginary
    kernels ``(frame_length, 1, fft_length // 2 + 1)`` (``fft_length`` default: the next power of two), each
    channel on its own. ``mode``: ``"real"``, ``"imag"``, ``"angle"`` (``arctan2(imag, real)``), ``"stft"``
    (real and imaginary bins concatenated), ``"psd"`` (the power, its inner bins doubled), ``"magnitude"``
    (``sqrt(max(power, epsilon))``) or ``"log"`` (the log of that). Output ``(batch, frames, channels * bins)``
    (channels_last; ``(batch, channels * bins, frames)`` channels_first), or with ``expand_dims`` ``(batch,
    frames, bins, channels)`` / ``(batch, channels, frames, bins)``. The kernels are trainable weights named
    ``real_kernel`` and ``imag_kernel`` (only the one a mode needs for ``"real"`` / ``"imag"``), as Keras."""

    def __init__(self, mode: str = "log", frame_length: int = 256, frame_step: "int | None" = None,
                 fft_length: "int | None" = None, window: Any = "hann", periodic: bool = False,
                 scaling: "str | None" = "density", padding: str = "valid", expand_dims: bool = False,
                 data_format: "str | None" = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"STFTSpectrogram '{self.name}'"
        frame_length = _int(frame_length, "frame_length", owner)
        if frame_step is not None and (not isinstance(frame_step, (int, np.integer)) or frame_step > frame_length
                                       or frame_step < 1):
            raise ValueError(f"{owner}: `frame_step` should be a positive integer not greater than `frame_length`. "
                             f"Received frame_step={frame_step}, frame_length={frame_length}")
        if fft_length is not None:
            fft_length = _int(fft_length, "fft_length", owner)
            if fft_length < frame_length:
                raise ValueError(f"{owner}: `fft_length` should be not less than `frame_length`. Received "
                                 f"fft_length={fft_length}, frame_length={frame_length}")
            if (fft_length & -fft_length) != fft_length:
                warnings.warn(f"`fft_length` is recommended to be a power of two. Received fft_length={fft_length}")
        if mode not in _MODES:
            raise ValueError(f"{owner}: Output mode is invalid, it must be one of {', '.join(_MODES)}. Received: "
                             f"mode={mode}")
        if scaling is not None and scaling not in ("density", "spectrum"):
            raise ValueError(f"{owner}: Scaling is invalid, it must be `None`, 'density' or 'spectrum'. Received "
                             f"scaling={scaling}")
        if padding not in ("valid", "same"):
            raise ValueError(f"{owner}: Padding is invalid, it should be 'valid', 'same'. Received: padding={padding}")
        _initializers.STFT("real", window, scaling, periodic)  # the window's name checked now, as Keras
        self.mode, self.frame_length, self.frame_step = mode, frame_length, frame_step
        self._frame_step = frame_step or frame_length // 2
        self.fft_length = fft_length
        self._fft_length = fft_length or 2 ** int(math.ceil(math.log2(frame_length)))
        self.window = window.tolist() if isinstance(window, np.ndarray) else window
        self.periodic, self.scaling, self.padding, self.expand_dims = bool(periodic), scaling, padding, \
            bool(expand_dims)
        df = _backend.image_data_format() if data_format is None else str(data_format).lower()
        self.data_format = _validate.one_of(df, "data_format", owner, ("channels_last", "channels_first"))
        self._owner = owner

    def build(self, input_shape: Sequence[Any]) -> None:
        shape = (self.frame_length, 1, self._fft_length // 2 + 1)
        if self.mode != "imag":
            self.real_kernel = self.add_weight(name="real_kernel", shape=shape, initializer=_initializers.STFT(
                "real", self.window, self.scaling, self.periodic))
        if self.mode != "real":
            self.imag_kernel = self.add_weight(name="imag_kernel", shape=shape, initializer=_initializers.STFT(
                "imag", self.window, self.scaling, self.periodic))
        self.built = True

    def _check(self, x: Tensor) -> None:
        if x.ndim != 3:
            raise ValueError(f"{self._owner} expects inputs of rank 3 (batch, time, channels) or (batch, channels, "
                             f"time), got shape {tuple(x.shape)}")
        if _backend.standardize_dtype(x.dtype) not in ("float16", "float32", "float64"):
            raise TypeError(f"{self._owner}: Invalid input type. Expected `float16`, `float32` or `float64`. "
                            f"Received: input type={x.dtype}")
        t_axis = 1 if self.data_format == "channels_last" else 2
        if self.padding == "valid" and int(x.shape[t_axis]) < self.frame_length:
            raise ValueError(f"{self._owner}: the signal has {int(x.shape[t_axis])} samples, fewer than "
                             f"frame_length={self.frame_length} (padding='valid')")

    def _conv(self, x: Tensor, kernel: Any) -> Tensor:
        """``(batch, channels, bins, frames)``: each channel convolved on its own."""
        if self.data_format == "channels_last":
            time, channels = int(x.shape[1]), int(x.shape[2])
            x = _ops.reshape(_ops.transpose(x, (0, 2, 1)), (-1, time, 1))
        else:
            channels, time = int(x.shape[1]), int(x.shape[2])
            x = _ops.reshape(x, (-1, 1, time))
        y = _ops.conv(x, _ops.cast(kernel, x.dtype), padding=self.padding, strides=self._frame_step,
                      data_format=self.data_format)
        if self.data_format == "channels_last":
            y = _ops.transpose(y, (0, 2, 1))
        return _ops.reshape(y, (-1, channels, int(y.shape[1]), int(y.shape[2])))

    def _adjust(self, y: Tensor) -> Tensor:
        channels, bins, frames = int(y.shape[1]), int(y.shape[2]), int(y.shape[3])
        if self.data_format == "channels_last":
            if self.expand_dims:
                return _ops.transpose(y, (0, 3, 2, 1))
            return _ops.transpose(_ops.reshape(y, (-1, channels * bins, frames)), (0, 2, 1))
        if self.expand_dims:
            return _ops.transpose(y, (0, 1, 3, 2))
        return _ops.reshape(y, (-1, channels * bins, frames))

    def call(self, inputs: Any) -> Tensor:
        x = inputs if isinstance(inputs, Tensor) else _ops.convert_to_tensor(inputs)
        self._check(x)
        real = self._conv(x, self.real_kernel) if self.mode != "imag" else None
        imag = self._conv(x, self.imag_kernel) if self.mode != "real" else None
        if self.mode == "real":
            return self._adjust(real)
        if self.mode == "imag":
            return self._adjust(imag)
        if self.mode == "angle":
            return self._adjust(_ops.arctan2(imag, real))
        if self.mode == "stft":
            return self._adjust(_ops.concatenate([real, imag], axis=2))
        power = _ops.add(_ops.square(real), _ops.square(imag))
        if self.mode == "psd":
            inner = _ops.pad(power[:, :, 1:-1, :], [(0, 0), (0, 0), (1, 1), (0, 0)])
            return self._adjust(_ops.add(power, inner))
        eps = _backend.epsilon()
        magnitude = self._adjust(_ops.sqrt(_ops.maximum(power, eps)))
        if self.mode == "magnitude":
            return magnitude
        return _ops.log(_ops.maximum(magnitude, eps))

    def compute_output_shape(self, input_shape: Sequence[Any]) -> tuple:
        shape = tuple(input_shape)
        last = self.data_format == "channels_last"
        channels, time = (shape[2], shape[1]) if last else (shape[1], shape[2])
        bins = (self._fft_length // 2 + 1) * (2 if self.mode == "stft" else 1)
        if time is None:
            frames = None
        elif self.padding == "valid":
            frames = (int(time) - self.frame_length) // self._frame_step + 1
        else:
            frames = (int(time) - 1) // self._frame_step + 1
        if self.expand_dims:
            return (shape[0], frames, bins, channels) if last else (shape[0], channels, frames, bins)
        width = None if channels is None else bins * int(channels)
        return (shape[0], frames, width) if last else (shape[0], width, frames)

    def get_config(self) -> dict:
        return {**super().get_config(), "mode": self.mode, "frame_length": self.frame_length,
                "frame_step": self.frame_step, "fft_length": self.fft_length, "window": self.window,
                "periodic": self.periodic, "scaling": self.scaling, "padding": self.padding,
                "data_format": self.data_format, "expand_dims": self.expand_dims}


_MEL_BREAK_FREQUENCY_HERTZ = 700.0
_MEL_HIGH_FREQUENCY_Q = 1127.0


def _hertz_to_mel(f: np.ndarray) -> np.ndarray:
    return _MEL_HIGH_FREQUENCY_Q * np.log(1.0 + f / _MEL_BREAK_FREQUENCY_HERTZ)


def linear_to_mel_weight_matrix(num_mel_bins: int, num_spectrogram_bins: int, sampling_rate: float,
                                lower_edge_hertz: float, upper_edge_hertz: float) -> np.ndarray:
    """Keras's (and TensorFlow's) mel filter bank, ``(num_spectrogram_bins, num_mel_bins)`` float32: triangles
    on the HTK mel scale between ``lower_edge_hertz`` and ``upper_edge_hertz``, the DC bin zero."""
    f32 = np.float32
    nyquist = f32(sampling_rate) / f32(2.0)
    linear = np.linspace(f32(0.0), nyquist, num_spectrogram_bins, dtype=f32)[1:]
    bins_mel = _hertz_to_mel(linear).astype(f32)[:, None]
    edges = np.linspace(_hertz_to_mel(f32(lower_edge_hertz)), _hertz_to_mel(f32(upper_edge_hertz)),
                        num_mel_bins + 2, dtype=f32)
    lower, center, upper = edges[:-2][None, :], edges[1:-1][None, :], edges[2:][None, :]
    lower_slopes = (bins_mel - lower) / (center - lower)
    upper_slopes = (upper - bins_mel) / (upper - center)
    weights = np.maximum(f32(0.0), np.minimum(lower_slopes, upper_slopes)).astype(f32)
    return np.pad(weights, [(1, 0), (0, 0)])


@register
class MelSpectrogram(Layer):
    """``MelSpectrogram(fft_length=2048, sequence_stride=512, sequence_length=None, window="hann",
    sampling_rate=16000, num_mel_bins=128, min_freq=20.0, max_freq=None, power_to_db=True, top_db=80.0,
    mag_exp=2.0, min_power=1e-10, ref_power=1.0)``: Keras 3's data layer. Signals ``(time,)`` or ``(batch,
    time)``: :func:`dnnbind.ops.stft` (centred, reflect padding), ``|X| ** mag_exp``, Keras's mel filter bank
    (``max_freq`` default ``sampling_rate / 2``) and, with ``power_to_db``, ``10 log10(max(S, min_power)) - 10
    log10(max(|ref_power|, min_power))`` floored at its maximum (over the whole batch, as Keras) minus
    ``top_db``. Output ``(num_mel_bins, frames)`` or ``(batch, num_mel_bins, frames)``, in the compute dtype
    (computed in float32, or float64 for a float64 policy). Not trainable; a data-pipeline layer as in Keras,
    it runs on the NumPy backend (a device tensor is refused by ``ops.stft``)."""

    def __init__(self, fft_length: int = 2048, sequence_stride: int = 512, sequence_length: "int | None" = None,
                 window: Any = "hann", sampling_rate: int = 16000, num_mel_bins: int = 128, min_freq: float = 20.0,
                 max_freq: "float | None" = None, power_to_db: bool = True, top_db: float = 80.0,
                 mag_exp: float = 2.0, min_power: float = 1e-10, ref_power: float = 1.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        owner = f"MelSpectrogram '{self.name}'"
        self.fft_length = _int(fft_length, "fft_length", owner)
        self.sequence_stride = _int(sequence_stride, "sequence_stride", owner)
        self.sequence_length = _int(sequence_length, "sequence_length", owner) if sequence_length else fft_length
        if self.fft_length < self.sequence_length:
            raise ValueError(f"{owner}: `fft_length` must be greater than or equal to `sequence_length`. Received: "
                             f"`sequence_length`={self.sequence_length}, `fft_length`={self.fft_length}.")
        self.window = window
        self.sampling_rate = _num(sampling_rate, "sampling_rate", owner)
        if self.sampling_rate <= 0:
            raise ValueError(f"{owner}: sampling_rate must be positive, got {sampling_rate!r}")
        self.num_mel_bins = _int(num_mel_bins, "num_mel_bins", owner)
        self.min_freq = _num(min_freq, "min_freq", owner)
        self.max_freq = _num(max_freq, "max_freq", owner) if max_freq else int(sampling_rate / 2)
        if not self.min_freq < self.max_freq:
            raise ValueError(f"{owner}: min_freq ({min_freq}) must be below max_freq ({self.max_freq})")
        self.power_to_db = bool(power_to_db)
        self.top_db = _num(top_db, "top_db", owner)
        self.mag_exp = _num(mag_exp, "mag_exp", owner)
        self.min_power = _num(min_power, "min_power", owner)
        self.ref_power = _num(ref_power, "ref_power", owner)
        self._owner = owner
        self.built = True

    def call(self, inputs: Any) -> Tensor:
        dt = self._effective_compute_dtype()
        work = dt if str(dt) in ("float32", "float64") else np.dtype("float32")
        x = _ops.cast(inputs if isinstance(inputs, Tensor) else _ops.convert_to_tensor(inputs), work)
        if x.ndim not in (1, 2):
            raise ValueError(f"{self._owner} expects signals of rank 1 (time,) or 2 (batch, time), got shape "
                             f"{tuple(x.shape)}")
        real, imag = _ops.stft(x, sequence_length=self.sequence_length, sequence_stride=self.sequence_stride,
                               fft_length=self.fft_length, window=self.window, center=True)
        spec = _ops.power(_ops.sqrt(_ops.add(_ops.square(real), _ops.square(imag))), self.mag_exp)
        matrix = linear_to_mel_weight_matrix(self.num_mel_bins, int(spec.shape[-1]), self.sampling_rate,
                                             self.min_freq, self.max_freq)
        out = _ops.tensordot(spec, _ops.cast(_ops.convert_to_tensor(matrix), work), axes=1)
        if self.power_to_db:
            log_spec = _ops.multiply(_ops.log10(_ops.maximum(out, self.min_power)), 10.0)
            ref = 10.0 * math.log10(max(abs(self.ref_power), self.min_power))
            log_spec = _ops.subtract(log_spec, ref)
            out = _ops.maximum(log_spec, _ops.subtract(_ops.max(log_spec), self.top_db))
        return _ops.cast(_ops.swapaxes(out, -1, -2), dt)

    def compute_output_shape(self, input_shape: Sequence[Any]) -> tuple:
        shape = tuple(input_shape)
        time = shape[-1]
        frames = None if time is None else int(time) // self.sequence_stride + 1  # (the centred STFT's count)
        return (self.num_mel_bins, frames) if len(shape) == 1 else (shape[0], self.num_mel_bins, frames)

    def get_config(self) -> dict:
        return {**super().get_config(), "fft_length": self.fft_length, "sequence_stride": self.sequence_stride,
                "sequence_length": self.sequence_length, "window": self.window,
                "sampling_rate": self.sampling_rate, "num_mel_bins": self.num_mel_bins, "min_freq": self.min_freq,
                "max_freq": self.max_freq, "power_to_db": self.power_to_db, "top_db": self.top_db,
                "mag_exp": self.mag_exp, "min_power": self.min_power, "ref_power": self.ref_power}
