"""Weight initialisers with Keras 3 names, defaults and fan computation.

Initialisers run on the host (NumPy, float32 by default); layers then move the
result to their device. A random initialiser given no seed draws one, when it is
created, from dnnbind's seed generator (:func:`dnnbind.utils.set_random_seed` makes
it reproducible).

Fans follow Keras: for a kernel of shape
``(*receptive_field, fan_in_channels, fan_out_channels)`` (Keras layouts: Dense
``(in, out)``, Conv2D ``(kh, kw, in/groups, out)``), ``fan_in = prod(receptive
field) * shape[-2]`` and ``fan_out = prod(receptive field) * shape[-1]``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from . import _keras_objects
from .utils import draw_seed

__all__ = [
    "Initializer",
    "Zeros",
    "Ones",
    "Constant",
    "RandomNormal",
    "RandomUniform",
    "TruncatedNormal",
    "VarianceScaling",
    "GlorotUniform",
    "GlorotNormal",
    "HeNormal",
    "HeUniform",
    "LecunNormal",
    "LecunUniform",
    "OrthogonalInitializer",
    "Orthogonal",
    "IdentityInitializer",
    "Identity",
    "STFTInitializer",
    "STFT",
    "get",
    "serialize",
    "deserialize",
    "compute_fans",
    # Keras 3's function-style names: the classes themselves under snake-case names
    "constant", "glorot_normal", "glorot_uniform", "he_normal", "he_uniform", "identity", "lecun_normal",
    "lecun_uniform", "ones", "orthogonal", "random_normal", "random_uniform", "stft", "truncated_normal",
    "variance_scaling", "zeros",
]


def compute_fans(shape: Sequence[int]) -> tuple[float, float]:
    """(fan_in, fan_out) of a Keras-layout weight shape, as Keras computes them."""
    shape = tuple(int(s) for s in shape)
    if len(shape) == 0:
        return 1.0, 1.0
    if len(shape) == 1:
        return float(shape[0]), float(shape[0])
    if len(shape) == 2:
        return float(shape[0]), float(shape[1])
    receptive = math.prod(shape[:-2])
    return float(receptive * shape[-2]), float(receptive * shape[-1])


class Initializer:
    """Base class: ``init(shape, dtype="float32") -> np.ndarray`` in the Keras layout."""

    def __call__(self, shape: Sequence[int], dtype: Any = "float32") -> np.ndarray:
        raise NotImplementedError

    def get_config(self) -> dict:
        return {}

    @classmethod
    def from_config(cls, config: dict) -> "Initializer":
        return cls(**config)


def _is_seed_generator(value: Any) -> bool:
    """Whether ``value`` is a :class:`dnnbind.random.SeedGenerator`, known by its class's module and name:
    dnnbind.random imports ops, whose variables import this module, so this module cannot import it."""
    cls = type(value)
    return cls.__name__ == "SeedGenerator" and cls.__module__ == "dnnbind.random"


class _Seeded(Initializer):
    """A random initialiser with Keras 3's seeding: an instance gives the same values at every call.

    ``seed``: an int (the values are a function of it); None: one drawn when the instance is created,
    from dnnbind's seed generator (:func:`dnnbind.utils.draw_seed`; reproducible after
    :func:`dnnbind.utils.set_random_seed`), then kept, so an unseeded instance also repeats its values,
    as Keras 3's (whose ``make_default_seed`` does the same); a ``keras.random.SeedGenerator``: new
    values at every call (Keras's way to have them differ), from a stream seeded by the generator's seed.
    ``seed`` (what ``get_config`` returns) stays None for an unseeded instance, so a layer rebuilt from its
    config draws anew.
    """

    def __init__(self, seed: "int | Any | None" = None) -> None:
        if _is_seed_generator(seed):
            self._stream = np.random.default_rng(seed.seed)
            self._seed_value = None
        elif seed is None or (isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_))):
            self._stream = None
            self._seed_value = draw_seed() if seed is None else int(seed)
        else:
            raise ValueError(f"{type(self).__name__}: seed must be an int, None or a keras.random.SeedGenerator, "
                             f"got {seed!r} (of type {type(seed).__name__})")
        self.seed = seed

    @property
    def _rng(self) -> np.random.Generator:
        """The generator for one call: a fresh one from the seed (the same values every call), or the
        SeedGenerator's running stream."""
        return self._stream if self._stream is not None else np.random.default_rng(self._seed_value)

    def get_config(self) -> dict:
        return {"seed": self.seed}


class Zeros(Initializer):
    def __call__(self, shape, dtype="float32"):
        return np.zeros(tuple(shape), dtype=dtype)


class Ones(Initializer):
    def __call__(self, shape, dtype="float32"):
        return np.ones(tuple(shape), dtype=dtype)


class Constant(Initializer):
    """``value`` everywhere: a number, or an array broadcast to the weight's shape (Keras 3 multiplies it into
    ``ones(shape)``: ``Constant(np.eye(3).flatten())`` for a bias of 9)."""

    def __init__(self, value: Any = 0.0) -> None:
        arr = np.asarray(value)
        if arr.dtype.kind not in "biuf":
            raise TypeError(f"Constant: value must be a number or a numeric array, got {value!r}")
        self.value = float(arr) if arr.ndim == 0 else arr.astype(np.float64)

    def __call__(self, shape, dtype="float32"):
        shape = tuple(shape)
        if isinstance(self.value, float):
            return np.full(shape, self.value, dtype=dtype)
        try:
            return np.array(np.broadcast_to(self.value, shape), dtype=dtype)
        except ValueError:
            raise ValueError(f"Constant: a value of shape {self.value.shape} cannot fill a weight of shape {shape} "
                             "(NumPy broadcasting)") from None

    def get_config(self) -> dict:
        return {"value": self.value if isinstance(self.value, float) else self.value.tolist()}


class RandomNormal(_Seeded):
    def __init__(self, mean: float = 0.0, stddev: float = 0.05, seed: int | None = None) -> None:
        super().__init__(seed)
        self.mean, self.stddev = float(mean), float(stddev)

    def __call__(self, shape, dtype="float32"):
        return self._rng.normal(self.mean, self.stddev, size=tuple(shape)).astype(dtype)

    def get_config(self) -> dict:
        return {"mean": self.mean, "stddev": self.stddev, "seed": self.seed}


class RandomUniform(_Seeded):
    def __init__(self, minval: float = -0.05, maxval: float = 0.05, seed: int | None = None) -> None:
        super().__init__(seed)
        self.minval, self.maxval = float(minval), float(maxval)

    def __call__(self, shape, dtype="float32"):
        return self._rng.uniform(self.minval, self.maxval, size=tuple(shape)).astype(dtype)

    def get_config(self) -> dict:
        return {"minval": self.minval, "maxval": self.maxval, "seed": self.seed}


def _truncated_normal(rng: np.random.Generator, mean: float, stddev: float, shape) -> np.ndarray:
    """Normal samples redrawn until within two standard deviations (as TF/Keras)."""
    out = rng.normal(0.0, 1.0, size=shape)
    bad = np.abs(out) > 2.0
    while np.any(bad):
        out[bad] = rng.normal(0.0, 1.0, size=int(bad.sum()))
        bad = np.abs(out) > 2.0
    return mean + stddev * out


class TruncatedNormal(_Seeded):
    def __init__(self, mean: float = 0.0, stddev: float = 0.05, seed: int | None = None) -> None:
        super().__init__(seed)
        self.mean, self.stddev = float(mean), float(stddev)

    def __call__(self, shape, dtype="float32"):
        return _truncated_normal(self._rng, self.mean, self.stddev, tuple(shape)).astype(dtype)

    def get_config(self) -> dict:
        return {"mean": self.mean, "stddev": self.stddev, "seed": self.seed}


class VarianceScaling(_Seeded):
    """Keras ``VarianceScaling``: variance ``scale / n`` with n the fan chosen by ``mode``."""

    def __init__(self, scale: float = 1.0, mode: str = "fan_in", distribution: str = "truncated_normal",
                 seed: int | None = None) -> None:
        super().__init__(seed)
        if scale <= 0:
            raise ValueError(f"VarianceScaling: scale must be positive, got {scale}")
        if mode not in ("fan_in", "fan_out", "fan_avg"):
            raise ValueError(f"VarianceScaling: mode must be 'fan_in', 'fan_out' or 'fan_avg', got {mode!r}")
        if distribution not in ("truncated_normal", "untruncated_normal", "uniform"):
            raise ValueError(
                "VarianceScaling: distribution must be 'truncated_normal', 'untruncated_normal' or "
                f"'uniform', got {distribution!r}"
            )
        self.scale, self.mode, self.distribution = float(scale), mode, distribution

    def __call__(self, shape, dtype="float32"):
        shape = tuple(int(s) for s in shape)
        fan_in, fan_out = compute_fans(shape)
        n = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2.0}[self.mode]
        variance = self.scale / max(1.0, n)
        if self.distribution == "truncated_normal":
            # 0.879... is the stddev of a unit normal truncated to [-2, 2]
            stddev = math.sqrt(variance) / 0.87962566103423978
            out = _truncated_normal(self._rng, 0.0, stddev, shape)
        elif self.distribution == "untruncated_normal":
            out = self._rng.normal(0.0, math.sqrt(variance), size=shape)
        else:
            limit = math.sqrt(3.0 * variance)
            out = self._rng.uniform(-limit, limit, size=shape)
        return out.astype(dtype)

    def get_config(self) -> dict:
        return {"scale": self.scale, "mode": self.mode, "distribution": self.distribution, "seed": self.seed}


class _Preset(VarianceScaling):
    """A VarianceScaling with fixed (scale, mode, distribution); only the seed is configurable."""

    _preset: tuple[float, str, str] = (1.0, "fan_in", "truncated_normal")

    def __init__(self, seed: int | None = None) -> None:
        super().__init__(*self._preset, seed=seed)

    def get_config(self) -> dict:
        return {"seed": self.seed}


class GlorotUniform(_Preset):
    _preset = (1.0, "fan_avg", "uniform")


class GlorotNormal(_Preset):
    _preset = (1.0, "fan_avg", "truncated_normal")


class HeNormal(_Preset):
    _preset = (2.0, "fan_in", "truncated_normal")


class HeUniform(_Preset):
    _preset = (2.0, "fan_in", "uniform")


class LecunNormal(_Preset):
    _preset = (1.0, "fan_in", "truncated_normal")


class LecunUniform(_Preset):
    _preset = (1.0, "fan_in", "uniform")


class OrthogonalInitializer(_Seeded):
    """Keras 3's ``Orthogonal``: the Q of the QR decomposition of a normal matrix (signs fixed by R's
    diagonal), of shape ``(prod(shape[:-1]), shape[-1])`` (transposed when it has fewer rows than
    columns), reshaped to ``shape`` and times ``gain``. Needs at least 2 dimensions."""

    def __init__(self, gain: float = 1.0, seed: int | None = None) -> None:
        super().__init__(seed)
        self.gain = float(gain)

    def __call__(self, shape, dtype="float32"):
        shape = tuple(int(s) for s in shape)
        if len(shape) < 2:
            raise ValueError(f"OrthogonalInitializer: the shape must have at least 2 dimensions, got {shape}")
        rows, cols = math.prod(shape[:-1]), shape[-1]
        a = self._rng.normal(0.0, 1.0, size=(max(rows, cols), min(rows, cols)))
        q, r = np.linalg.qr(a)
        q = q * np.sign(np.diag(r))
        if rows < cols:
            q = q.T
        return (self.gain * q.reshape(shape)).astype(dtype)

    def get_config(self) -> dict:
        return {"gain": self.gain, "seed": self.seed}


Orthogonal = OrthogonalInitializer


class IdentityInitializer(Initializer):
    """Keras 3's ``Identity``: ``gain * eye(rows, cols)`` for a 2-D shape (ones on the main diagonal)."""

    def __init__(self, gain: float = 1.0) -> None:
        self.gain = float(gain)

    def __call__(self, shape, dtype="float32"):
        shape = tuple(int(s) for s in shape)
        if len(shape) != 2:
            raise ValueError("Identity matrix initializer can only be used for 2D matrices. "
                             f"Received: shape={shape} of rank {len(shape)}.")
        return (self.gain * np.eye(*shape)).astype(dtype)

    def get_config(self) -> dict:
        return {"gain": self.gain}


Identity = IdentityInitializer

# numpy's symmetric windows; "periodic" windows are the symmetric ones of length n + 1 without their last point
_WINDOWS = {"hann": np.hanning, "hanning": np.hanning, "hamming": np.hamming, "blackman": np.blackman,
            "bartlett": np.bartlett, "boxcar": np.ones, "ones": np.ones, "rectangular": np.ones}


def _window(name: str, n: int, periodic: bool) -> np.ndarray:
    fn = _WINDOWS[name]
    return fn(n + 1)[:-1] if periodic else fn(n)


class STFTInitializer(Initializer):
    """Keras 3's ``STFT``: the real (``side="real"``: cosine) or imaginary (``"imag"``: sine) part of the DFT
    kernel, of shape ``(frame_length, input_channels, fft_length // 2 + 1)``, times a window (a name:
    ``hann``, ``hamming``, ``blackman``, ``bartlett``, ``boxcar``; an array of ``frame_length`` values; or
    None) divided by its ``scaling`` (``"density"``: the window's L2 norm, ``"spectrum"``: its L1 norm, None).
    ``periodic`` windows as scipy's ``get_window(..., fftbins=True)``."""

    def __init__(self, side: str = "real", window: Any = "hann", scaling: "str | None" = "density",
                 periodic: bool = False) -> None:
        if side not in ("real", "imag"):
            raise ValueError(f"side should be 'real' or 'imag', not {side}")
        if isinstance(window, str) and window not in _WINDOWS:
            raise ValueError(f"STFTInitializer: window {window!r} is not supported; known: "
                             f"{', '.join(sorted(_WINDOWS))}, an array of frame_length values, or None")
        if scaling is not None and scaling not in ("density", "spectrum"):
            raise ValueError(f"Scaling is invalid, it must be `None`, 'density' or 'spectrum'. Received "
                             f"scaling={scaling}")
        self.side, self.window, self.scaling, self.periodic = side, window, scaling, bool(periodic)

    def __call__(self, shape, dtype="float32"):
        shape = tuple(int(s) for s in shape)
        if len(shape) != 3:
            raise ValueError(f"STFTInitializer: the shape must be (frame_length, input_channels, fft_bins), got "
                             f"{shape}")
        frame_length, _, fft_length = shape
        win, scaling = None, 1.0
        if self.window is not None:
            win = _window(self.window, frame_length, self.periodic) if isinstance(self.window, str) \
                else np.asarray(self.window, dtype=np.float64)
            if win.ndim != 1 or win.shape[-1] != frame_length:
                raise ValueError(f"The shape of `window` must be equal to [frame_length]. Received: window "
                                 f"shape={win.shape}")
            win = win.reshape(frame_length, 1, 1)
            if self.scaling == "density":
                scaling = np.sqrt(np.sum(np.square(win)))
            elif self.scaling == "spectrum":
                scaling = np.sum(np.abs(win))
        freq = np.arange(fft_length, dtype=np.float64).reshape(1, 1, fft_length) / ((fft_length - 1) * 2)
        time = np.arange(frame_length, dtype=np.float64).reshape(frame_length, 1, 1)
        args = -2 * time * freq * np.pi
        kernel = np.cos(args) if self.side == "real" else np.sin(args)
        if win is not None:
            kernel = kernel * win / scaling
        return np.broadcast_to(kernel, shape).astype(dtype)

    def get_config(self) -> dict:
        window = self.window.tolist() if isinstance(self.window, np.ndarray) else self.window
        return {"side": self.side, "window": window, "periodic": self.periodic, "scaling": self.scaling}


STFT = STFTInitializer


_BY_NAME: dict[str, type] = {
    "zeros": Zeros,
    "ones": Ones,
    "constant": Constant,
    "random_normal": RandomNormal,
    "random_uniform": RandomUniform,
    "truncated_normal": TruncatedNormal,
    "variance_scaling": VarianceScaling,
    "glorot_uniform": GlorotUniform,
    "glorot_normal": GlorotNormal,
    "he_normal": HeNormal,
    "he_uniform": HeUniform,
    "lecun_normal": LecunNormal,
    "lecun_uniform": LecunUniform,
    "orthogonal": OrthogonalInitializer,
    "identity": IdentityInitializer,
    "stft": STFTInitializer,
}
_CLASS_TO_NAME = {cls.__name__: name for name, cls in _BY_NAME.items()}
# Keras 3's short aliases (Embedding's default is "uniform"); kept apart so serialize keeps the full names
_ALIASES = {"uniform": "random_uniform", "normal": "random_normal", "one": "ones", "zero": "zeros"}
_CLASS_TO_NAME["Orthogonal"] = "orthogonal"  # Keras 3's legacy class name
_CLASS_TO_NAME["Identity"] = "identity"
_CLASS_TO_NAME["STFT"] = "stft"

constant, zeros, ones, identity, stft = Constant, Zeros, Ones, IdentityInitializer, STFTInitializer
random_normal, random_uniform, truncated_normal = RandomNormal, RandomUniform, TruncatedNormal
variance_scaling, glorot_normal, glorot_uniform = VarianceScaling, GlorotNormal, GlorotUniform
he_normal, he_uniform, lecun_normal, lecun_uniform = HeNormal, HeUniform, LecunNormal, LecunUniform
orthogonal = OrthogonalInitializer


def get(identifier: "str | Initializer | dict | Callable | None") -> Initializer:
    """An initialiser from a Keras name (``"he_normal"``), a class name, a config dict or an instance."""
    if isinstance(identifier, Initializer):
        return identifier
    if isinstance(identifier, str):
        key = identifier.strip()
        name = _CLASS_TO_NAME.get(key, key.lower())
        name = _ALIASES.get(name, name)
        if name not in _BY_NAME:
            raise ValueError(f"unknown initializer {identifier!r}; known: {', '.join(sorted(_BY_NAME))}")
        return _BY_NAME[name]()
    if isinstance(identifier, dict):
        cls_name = identifier.get("class_name")
        name = _CLASS_TO_NAME.get(cls_name, str(cls_name).lower())
        if name not in _BY_NAME:
            raise ValueError(f"unknown initializer {cls_name!r}; known: {', '.join(sorted(_BY_NAME))}")
        return _BY_NAME[name].from_config(identifier.get("config", {}))
    if callable(identifier):
        fn = identifier

        class _FromCallable(Initializer):
            def __call__(self, shape, dtype="float32"):
                return np.asarray(fn(tuple(shape), dtype), dtype=dtype)

        return _FromCallable()
    raise TypeError(f"cannot interpret {identifier!r} as an initializer")


def serialize(init: Initializer) -> dict:
    """``{"class_name": ..., "config": ...}`` (JSON-safe)."""
    return {"class_name": type(init).__name__, "config": init.get_config()}


def deserialize(config: "dict | str", custom_objects: "dict | None" = None) -> Initializer:
    """An initializer from :func:`serialize`'s dict, Keras 3's (``{"module", "class_name", "config", ...}``) or a
    name; ``custom_objects`` (and the registry, ``keras.saving.register_keras_serializable``) for the user's."""
    if isinstance(config, dict):
        cls = _keras_objects.find_custom_class(str(config.get("class_name")), config.get("registered_name"),
                                               custom_objects)
        if cls is not None:
            return cls.from_config(config.get("config") or {})
    elif isinstance(config, str):
        cls = _keras_objects.get_registered_object(config, custom_objects)
        if cls is not None:
            return cls() if isinstance(cls, type) else cls
    else:
        raise TypeError(f"initializers.deserialize: expected a dict or a name, got {type(config).__name__}")
    return get(config)
