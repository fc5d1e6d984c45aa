"""``keras.random``: random tensors from counter-based Philox streams, the same bits on the CPU and the GPU.

Every draw is Philox4x32-10 (:func:`dnnbind.kernels.numeric.philox_uint32`) keyed by a 64-bit key, read
from a 64-bit block counter: :func:`dnnbind.kernels.numeric.random` on NumPy, its NVRTC twin on a GPU,
bit for bit the same words. What a draw turns the words into is fixed here, so a ``uniform`` (and so a
``dropout`` mask, a ``randint``, a ``shuffle`` order, a ``categorical`` sample) is bitwise equal across
the two backends; ``normal`` and what is computed from it further agree to float rounding.

**Seeds** follow Keras's ``draw_seed`` rules. ``seed`` is

* an ``int``: the same numbers at every call (key from the seed, counter 0);
* a :class:`SeedGenerator`: new numbers at every call. The generator holds a key and a 0-d uint64
  counter array on the device it was made on; a draw reads the counter where it lives and the op then
  advances it there (``kernels.numeric.advance_counter``, stream-ordered, no host read), so a CUDA graph
  captured around a draw draws fresh numbers at every replay. Each call moves the counter by
  :data:`BLOCKS_PER_CALL` blocks, so a call's numbers never overlap another's, whatever their shapes;
  the first call of ``SeedGenerator(s)`` equals a call with ``seed=s``, as in Keras;
* ``None``: the global :class:`SeedGenerator`, made on first use with a seed from
  :func:`dnnbind.utils.draw_seed`, and made anew after :func:`dnnbind.utils.set_random_seed` (so that
  ``set_random_seed(1)`` makes unseeded draws reproducible) and after ``keras.backend.clear_session()``.

Results are :class:`dnnbind.Tensor` on the device of the generator's counter (an ``int`` seed: the
default device). ``dropout`` and ``shuffle`` are differentiable in their input; the random numbers
carry no gradient, but tensor parameters of ``uniform``/``normal``/``truncated_normal`` do (the
samples are ``u * (maxval - minval) + minval`` and ``z * stddev + mean``, as in JAX).

Float draws are computed in float32 and rounded to ``dtype`` (24 random bits per element, float64
included), as the kernels define them. Keras's own backends draw other bits (JAX's threefry, NumPy's
PCG64): the distributions are Keras's, the numbers are not.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from . import backend, ops, utils
from ._validate import BFLOAT16
from .autodiff.tensor import Tensor
from .kernels import numeric as N
from .ops import _core

__all__ = ["SeedGenerator", "normal", "uniform", "truncated_normal", "randint", "categorical", "dropout",
           "shuffle", "gamma", "binomial", "beta", "BLOCKS_PER_CALL"]

#: How far one random op moves a :class:`SeedGenerator`'s counter, in Philox blocks (4 words each): a
#: fixed stride, so each call owns its own range of the stream (2**34 words) whatever it draws.
BLOCKS_PER_CALL = 1 << 32

_U64_MASK = (1 << 64) - 1
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_TINY_UNIFORM = 2.0 ** -25  # below the smallest nonzero uniform (2**-24): where (0, 1) must exclude 0


def _key_of(seed: int) -> int:
    """The Philox key of an integer seed: SplitMix64 of its low 64 bits (Steele et al., 2014), so that
    nearby seeds get unrelated keys."""
    z = (int(seed) + 0x9E3779B97F4A7C15) & _U64_MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64_MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64_MASK
    return z ^ (z >> 31)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


class SeedGenerator:
    """A stream of seeds for the random ops (``keras.random.SeedGenerator``): each op called with
    ``seed=generator`` draws new numbers.

    ``seed``: an int (None: one from :func:`dnnbind.utils.draw_seed`, reproducible after
    :func:`dnnbind.utils.set_random_seed`). The state is :attr:`key` (a 64-bit Philox key, from the seed)
    and :attr:`counter`, a 0-d uint64 array on the default device at creation (a NumPy array on the CPU
    backend, a DeviceArray on a GPU): the Philox block the next op starts from. Ops read and advance it
    on its device (module docstring), so it also advances inside replayed CUDA graphs.

    ``name``: Keras's naming (``seed_generator``, ``seed_generator_1``...). ``backend=`` (Keras's hook for
    another backend) is accepted and ignored; other keywords are an error, as in Keras.

    Example::

        gen = keras.random.SeedGenerator(42)
        a = keras.random.normal((2, 3), seed=gen)
        b = keras.random.normal((2, 3), seed=gen)   # different from a
    """

    def __init__(self, seed: "int | None" = None, name: "str | None" = None, **kwargs: Any) -> None:
        kwargs.pop("backend", None)
        if kwargs:
            raise ValueError(f"Unrecognized keyword arguments: {kwargs}")
        self.name = name if name is not None else backend.uniquify("seed_generator")
        self._initial_seed = seed
        if seed is None:
            seed = utils.draw_seed()
        if not _is_int(seed):
            raise ValueError(f"Argument `seed` must be an integer. Received: seed={seed!r} (of type {type(seed)})")
        self.seed = int(seed)
        self.key = _key_of(self.seed)
        self.counter = backend.asarray(np.zeros((), np.uint64), device=backend.default_device())

    @property
    def device(self) -> backend.Device:
        return backend.device_of(self.counter)

    def next(self, ordered: bool = True) -> "tuple[int, Tensor]":
        """Advance by one call and return the state it had: ``(key, counter)``, the counter a 0-d uint64
        tensor (a copy, read on its device). What an op does with its seed; ``ordered`` is accepted for
        Keras's signature (the counter always moves by :data:`BLOCKS_PER_CALL`)."""
        snapshot = ops.copy(Tensor(self.counter))
        N.advance_counter(self.counter, BLOCKS_PER_CALL)
        return self.key, snapshot

    def get_config(self) -> dict:
        return {"seed": self._initial_seed, "name": self.name}

    @classmethod
    def from_config(cls, config: dict) -> "SeedGenerator":
        return cls(**config)

    def __repr__(self) -> str:
        return f"<SeedGenerator name={self.name!r} seed={self.seed} device={self.device}>"


# ----- the global generator ----------------------------------------------------------------------------
_global: "SeedGenerator | None" = None
_global_made_at: tuple = ()


def global_seed_generator() -> SeedGenerator:
    """The generator ``seed=None`` draws from: made on first use, and again after ``set_random_seed``,
    ``clear_session`` or a change of the default device (so its counter is where the draws go)."""
    global _global, _global_made_at
    made_at = (utils.seed_epoch(), backend.default_device())
    if _global is None or _global_made_at != made_at:
        _global, _global_made_at = SeedGenerator(), made_at
    return _global


def _forget_global_generator() -> None:
    global _global
    _global = None


backend.on_clear_session(_forget_global_generator)


# ----- one op's stream --------------------------------------------------------------------------------
class _Stream:
    """The Philox words one random op draws: ``with _Stream(seed, op) as s: s.draw(...)``. Successive draws
    take successive blocks; on exit a generator's counter has moved by exactly :data:`BLOCKS_PER_CALL`
    (the advances between draws and the last one are device ops on its counter, in stream order)."""

    def __init__(self, seed: Any, op: str) -> None:
        if isinstance(seed, SeedGenerator):
            self.generator: "SeedGenerator | None" = seed
            self.key = seed.key
        elif seed is None:
            self.generator = global_seed_generator()
            self.key = self.generator.key
        elif _is_int(seed):
            self.generator = None
            self.key = _key_of(seed)
        else:
            raise ValueError("Argument `seed` must be either an integer or an instance of `SeedGenerator`. "
                             f"Received: seed={seed!r} (of type {type(seed)}) in keras.random.{op}")
        self.op = op
        self.taken = 0  # blocks given to draws so far
        self.applied = 0  # blocks added to the generator's counter so far

    def __enter__(self) -> "_Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.generator is not None:
            N.advance_counter(self.generator.counter, BLOCKS_PER_CALL - self.applied)

    def draw(self, kind: str, shape: Sequence[int], dtype: Any = _F32, p0: float = 0.0, p1: float = 1.0) -> Any:
        """A raw array of ``kernels.numeric.random(kind, ...)`` from the next blocks of this op's stream."""
        n = math.prod(shape)
        blocks = -(-(2 * n if kind == "normal" else n) // 4)
        if self.taken + blocks > BLOCKS_PER_CALL:
            raise ValueError(f"keras.random.{self.op}: {n} elements are more than one call may draw "
                             f"({4 * BLOCKS_PER_CALL} random words)")
        # kernels.numeric.random takes float kinds only; bfloat16 is rounded from its float32 draw here
        kernel_dtype = _F32 if np.dtype(dtype) == BFLOAT16 else dtype
        if self.generator is None:
            out = N.random(kind, shape, self.key, self.taken, kernel_dtype, p0=p0, p1=p1)
        else:
            counter = self.generator.counter
            if self.taken != self.applied:
                N.advance_counter(counter, self.taken - self.applied)
                self.applied = self.taken
            out = N.random(kind, shape, self.key, counter, kernel_dtype, p0=p0, p1=p1)
        self.taken += blocks
        return out if kernel_dtype is dtype else _cast_raw(out, BFLOAT16)

    def tensor(self, kind: str, shape: Sequence[int], dtype: Any = _F32, p0: float = 0.0, p1: float = 1.0) -> Tensor:
        return Tensor(self.draw(kind, shape, dtype, p0, p1))

    def open_uniform(self, shape: Sequence[int], dtype: np.dtype) -> Tensor:
        """Uniform in the open interval (0, 1) (0 replaced by 2**-25: logarithms stay finite)."""
        return ops.maximum(self.tensor("uniform", shape, dtype), _TINY_UNIFORM)


# ----- argument checks ----------------------------------------------------------------------------------
def _shape(shape: Any, op: str) -> tuple[int, ...]:
    if _is_int(shape):
        shape = (shape,)
    try:
        out = tuple(int(s) for s in shape)
    except TypeError:
        raise TypeError(f"keras.random.{op}: shape must be a tuple of ints, got {shape!r}") from None
    if any(s < 0 for s in out):
        raise ValueError(f"keras.random.{op}: shape {out} has a negative extent")
    return out


def _float_dtype(dtype: Any, op: str) -> np.dtype:
    name = backend.standardize_dtype(dtype)
    if not backend.is_float_dtype(name):
        raise ValueError(f"`keras.random.{op}` requires a floating point `dtype`. Received: dtype={dtype} ")
    return _core.np_dtype(name)


def _compute_dtype(dt: np.dtype) -> np.dtype:
    """float64 draws compute in float64, the others in float32."""
    return _F64 if dt == _F64 else _F32


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def _cast_raw(x: Any, dtype: np.dtype) -> Any:
    """A raw array converted to ``dtype`` by ``kernels.numeric`` (which converts on load; ``kernels.cast``
    has no unsigned wide types)."""
    return x if x.dtype == dtype else N.unary("positive", x, dtype=dtype)


def _bits64(s: "_Stream", shape: tuple) -> Any:
    """64 random bits per element (two Philox words: high, then low), as uint64."""
    u64 = np.dtype(np.uint64)
    hi = _cast_raw(s.draw("bits", shape), u64)
    lo = _cast_raw(s.draw("bits", shape), u64)
    return N.binary("bitwise_or", N.binary("left_shift", hi, 32, dtype=u64), lo, dtype=u64)


def _below(value: float, dt: np.dtype) -> float:
    """The largest ``dt`` number below ``value``."""
    v = np.asarray(value, dt)
    if float(v) >= value:
        v = np.nextafter(v, np.asarray(-np.inf, dt))
    return float(v)


# ----- the draws ----------------------------------------------------------------------------------------
def uniform(shape: Sequence[int], minval: Any = 0.0, maxval: Any = 1.0, dtype: Any = None, seed: Any = None) -> Tensor:
    """Uniform samples in ``[minval, maxval)`` (``keras.random.uniform``).

    Element ``i`` is ``(w_i >> 8) * 2**-24 * (maxval - minval) + minval`` in float32 for Philox word
    ``w_i`` of the stream (bitwise the same on both backends), rounded to ``dtype`` (a float type; None:
    floatx); float16/bfloat16 results are kept below ``maxval`` (rounding would reach it). ``minval`` and
    ``maxval`` may also be tensors broadcastable to ``shape``."""
    dt = _float_dtype(dtype, "uniform")
    shape = _shape(shape, "uniform")
    with _Stream(seed, "uniform") as s:
        if _is_number(minval) and _is_number(maxval):
            if dt in (_F32, _F64):
                return s.tensor("uniform", shape, dt, float(minval), float(maxval))
            out = s.draw("uniform", shape, dt, float(minval), float(maxval))
            return Tensor(N.binary("minimum", out, _below(float(maxval), dt), dtype=dt))
        u = s.tensor("uniform", shape, _compute_dtype(dt))
    lo, hi = _core.tensors(minval, maxval)
    return ops.cast(ops.add(ops.multiply(u, ops.subtract(hi, lo)), lo), dt)


def _location_scale(kind: str, op: str, shape: Any, loc: Any, scale: Any, dtype: Any, seed: Any) -> Tensor:
    """A standard ``kind`` draw times ``scale`` plus ``loc``: in the kernel for numbers, with ops (and so
    differentiable in them) for tensors."""
    dt = _float_dtype(dtype, op)
    shape = _shape(shape, op)
    with _Stream(seed, op) as s:
        if _is_number(loc) and _is_number(scale):
            return s.tensor(kind, shape, dt, float(loc), float(scale))
        z = s.tensor(kind, shape, _compute_dtype(dt))
    return ops.cast(ops.add(ops.multiply(z, scale), loc), dt)


def normal(shape: Sequence[int], mean: Any = 0.0, stddev: Any = 1.0, dtype: Any = None, seed: Any = None) -> Tensor:
    """Normal samples (``keras.random.normal``): Box-Muller on Philox words ``2i`` and ``2i + 1`` in
    float32 (``kernels.numeric.random``), times ``stddev`` plus ``mean`` (numbers, or tensors
    broadcastable to ``shape``), rounded to ``dtype`` (a float type; None: floatx)."""
    return _location_scale("normal", "normal", shape, mean, stddev, dtype, seed)


def truncated_normal(shape: Sequence[int], mean: Any = 0.0, stddev: Any = 1.0, dtype: Any = None,
                     seed: Any = None) -> Tensor:
    """Normal samples within two standard deviations of the mean (``keras.random.truncated_normal``,
    Keras's definition: the normal distribution conditioned on ``|x - mean| <= 2 stddev``). Drawn by the
    inverse CDF of that truncated distribution (one word per element, no rejection loop)."""
    return _location_scale("truncated_normal", "truncated_normal", shape, mean, stddev, dtype, seed)


def randint(shape: Sequence[int], minval: Any, maxval: Any, dtype: Any = "int32", seed: Any = None) -> Tensor:
    """Uniform integers in ``[minval, maxval)`` (``keras.random.randint``; ``dtype`` an integer type).

    Element ``i`` is ``minval + (w_i * (maxval - minval)) >> 32`` (Lemire's multiply-shift, in uint64)
    for Philox word ``w_i``: exact integer arithmetic, so bitwise the same on both backends; its bias is
    below ``range / 2**32`` (none for powers of two). A range above 2**32 (int64 only) takes 64 bits
    (two words) modulo the range (bias below ``range / 2**64``). ``minval``/``maxval``: ints, or integer
    tensors broadcastable to ``shape``."""
    name = backend.standardize_dtype(dtype)
    if not backend.is_int_dtype(name):
        raise ValueError(f"`keras.random.randint` requires an integer `dtype`. Received: dtype={dtype} ")
    dt = _core.np_dtype(name)
    shape = _shape(shape, "randint")
    u64, i64 = np.dtype(np.uint64), np.dtype(np.int64)
    scalar = _is_int(minval) and _is_int(maxval)
    if scalar:
        lo, span = int(minval), int(maxval) - int(minval)
        if span <= 0:
            raise ValueError(f"keras.random.randint: maxval ({maxval}) must be greater than minval ({minval})")
        info = np.iinfo(dt)
        if int(minval) < info.min or int(maxval) - 1 > info.max:
            raise ValueError(f"keras.random.randint: [{minval}, {maxval}) does not fit dtype {name}")
        wide = span > 1 << 32
    else:
        lo_t, hi_t = _core.tensors(minval, maxval)
        if lo_t.dtype.kind not in "iu" or hi_t.dtype.kind not in "iu":
            raise TypeError("keras.random.randint: minval and maxval must be integers or integer tensors")
        lo = ops.cast(lo_t, i64).data
        span = N.binary("subtract", ops.cast(hi_t, i64).data, lo, dtype=i64)
        wide = True
        if not backend.is_device_array(span):  # a host check is free on NumPy
            if np.any(span <= 0):
                raise ValueError("keras.random.randint: maxval must be greater than minval everywhere")
            wide = bool(np.any(span > 1 << 32))
    with _Stream(seed, "randint") as s:
        span_u64 = span if scalar else _cast_raw(span, u64)
        if not wide:
            bits = _cast_raw(s.draw("bits", shape), u64)
            offset = N.binary("right_shift", N.binary("multiply", bits, span_u64, dtype=u64), 32, dtype=u64)
        else:
            offset = N.binary("mod", _bits64(s, shape), span_u64, dtype=u64)
    value = N.binary("add", _cast_raw(offset, i64), lo, dtype=i64)
    return Tensor(_cast_raw(value, dt))


def categorical(logits: Any, num_samples: int, dtype: Any = "int32", seed: Any = None) -> Tensor:
    """Class indices sampled from ``softmax(logits)`` per row (``keras.random.categorical``): ``logits``
    ``(batch, classes)``, the result ``(batch, num_samples)`` of ``dtype``.

    Gumbel-max: sample ``j`` of row ``b`` is ``argmax_c(logits[b, c] + g[b, j, c])`` with Gumbel noise
    ``g = -log(-log(u))`` from uniforms ``u`` (the same draws on both backends; ``u = 0`` gives ``-inf``,
    a class never taken). ``-inf`` logits are never sampled."""
    t = ops.stop_gradient(_core.tensor(logits))
    if t.ndim != 2:
        raise ValueError("`logits` should be a 2-D tensor with shape [batch_size, num_classes]. "
                         f"Received: logits={tuple(t.shape)}")
    if not _is_int(num_samples) or num_samples < 0:
        raise ValueError(f"keras.random.categorical: num_samples must be an int >= 0, got {num_samples!r}")
    out_dt = _core.np_dtype(dtype)
    cdt = _F64 if t.dtype == _F64 else _F32
    t = ops.cast(t, cdt)
    batch, classes = t.shape
    with _Stream(seed, "categorical") as s:
        u = s.tensor("uniform", (batch, int(num_samples), classes), cdt)
    gumbel = ops.negative(ops.log(ops.negative(ops.log(u))))
    scores = ops.add(ops.expand_dims(t, 1), gumbel)
    return ops.cast(ops.argmax(scores, axis=-1), out_dt)


def dropout(inputs: Any, rate: float, noise_shape: Any = None, seed: Any = None) -> Tensor:
    """``keras.random.dropout``: ``inputs / (1 - rate)`` where a uniform draw is below ``1 - rate``, else 0
    (``rate`` 0: ``inputs`` unchanged; 1: zeros). ``noise_shape`` (None entries: the input's extents)
    is the shape of the mask, broadcast over ``inputs``. The mask is a float32 uniform draw (bitwise the
    same on both backends, whatever the input dtype); differentiable in ``inputs``."""
    x = _core.tensor(inputs)
    if not _is_number(rate) or not 0.0 <= float(rate) <= 1.0:
        raise ValueError(f"keras.random.dropout: rate must be a number in [0, 1], got {rate!r}")
    rate = float(rate)
    if rate == 1.0:
        return ops.zeros_like(x)
    if rate == 0.0:
        return x
    if noise_shape is None:
        mask_shape = tuple(x.shape)
    else:
        if len(noise_shape) != x.ndim:
            raise ValueError(f"keras.random.dropout: noise_shape {tuple(noise_shape)} must have the rank of the "
                             f"inputs ({x.ndim})")
        mask_shape = tuple(x.shape[i] if n is None else int(n) for i, n in enumerate(noise_shape))
    keep = 1.0 - rate
    with _Stream(seed, "dropout") as s:
        u = s.draw("uniform", mask_shape, _F32)
    mask = Tensor(N.binary("less", u, keep))
    return ops.where(mask, ops.divide(x, keep), 0.0)


def shuffle(x: Any, axis: int = 0, seed: Any = None) -> Tensor:
    """``x`` with the elements of each line along ``axis`` permuted at random, each line independently
    (``keras.random.shuffle``, as Keras's JAX and NumPy backends do). The order is an argsort of 64-bit
    random keys (two Philox words per element; ties, with probability about ``n**2 / 2**65`` for a line
    of ``n``, keep their order); differentiable in ``x`` (a gather)."""
    t = _core.tensor(x)
    if t.ndim == 0:
        raise ValueError("keras.random.shuffle: x must have rank >= 1")
    if not _is_int(axis) or not -t.ndim <= axis < t.ndim:
        raise ValueError(f"keras.random.shuffle: axis {axis!r} is out of range for rank {t.ndim}")
    with _Stream(seed, "shuffle") as s:
        keys = _bits64(s, tuple(t.shape))
    order = N.argsort(keys, int(axis))
    return ops.take_along_axis(t, Tensor(order), axis=int(axis))


# ----- gamma, beta, binomial: fixed-round rejection samplers written in ops --------------------------------
_GAMMA_ROUNDS = 8


def _log_gamma(s: _Stream, shape: tuple, alpha: Tensor, cdt: np.dtype) -> Tensor:
    """``log`` of Gamma(``alpha``, 1) samples of ``shape`` (``alpha`` broadcast to it).

    Marsaglia and Tsang (2000), "A simple method for generating gamma variables": for ``a >= 1``, with
    ``d = a - 1/3`` and ``c = 1 / sqrt(9 d)``, a normal ``x`` and a uniform ``u``, ``d v`` with
    ``v = (1 + c x)**3`` is accepted when ``v > 0`` and ``log u < x**2 / 2 + d - d v + d log v``; each
    round accepts with probability at least 0.95. :data:`_GAMMA_ROUNDS` rounds are drawn at once and
    the first accepted one kept; when none is (probability below ``0.05**8``, about 4e-11) the sample
    is ``d``, the distribution's mode neighbourhood. ``a < 1`` uses their boost: ``Gamma(a) = Gamma(a +
    1) * u**(1/a)``, added in log space (``log u / a``), so small ``a`` gives finite logs where the
    sample itself underflows.
    """
    rounds = (_GAMMA_ROUNDS, *shape)
    a0 = ops.broadcast_to(ops.cast(alpha, cdt), shape)
    small = ops.less(a0, 1.0)
    a = ops.where(small, ops.add(a0, 1.0), a0)
    d = ops.subtract(a, 1.0 / 3.0)
    c = ops.rsqrt(ops.multiply(d, 9.0))
    x = s.tensor("normal", rounds, cdt)
    u = s.open_uniform(rounds, cdt)
    boost_u = s.open_uniform(shape, cdt)
    v = ops.power(ops.add(ops.multiply(c, x), 1.0), 3.0)
    positive = ops.greater(v, 0.0)
    log_v = ops.log(ops.where(positive, v, 1.0))
    bound = ops.add(ops.multiply(ops.square(x), 0.5), ops.multiply(d, ops.add(ops.subtract(1.0, v), log_v)))
    accept = ops.logical_and(positive, ops.less(ops.log(u), bound))
    log_d = ops.log(d)
    candidates = ops.add(log_d, log_v)
    out = _first_accepted(accept, candidates, log_d)
    boost = ops.where(small, ops.divide(ops.log(boost_u), a0), 0.0)
    return ops.where(ops.greater(a0, 0.0), ops.add(out, boost), math.nan)


def _first_accepted(accept: Tensor, candidates: Tensor, fallback: Tensor) -> Tensor:
    """Per element, the candidate of the first round (axis 0) whose ``accept`` is true, else ``fallback``."""
    first = ops.argmax(ops.cast(accept, "int32"), axis=0)
    picked = ops.squeeze(ops.take_along_axis(candidates, ops.expand_dims(first, 0), axis=0), 0)
    return ops.where(ops.any(accept, axis=0), picked, fallback)


def _parameter(value: Any, name: str, op: str, cdt: np.dtype) -> Tensor:
    if _is_number(value) and not math.isfinite(float(value)):
        raise ValueError(f"keras.random.{op}: {name} must be finite, got {value!r}")
    return ops.cast(_core.tensor(value), cdt)


def gamma(shape: Sequence[int], alpha: Any, dtype: Any = None, seed: Any = None) -> Tensor:
    """Gamma(``alpha``, scale 1) samples (``keras.random.gamma``): mean and variance ``alpha``. ``alpha``: a
    positive number, or a tensor broadcastable to ``shape`` (non-positive entries give NaN). Sampler:
    Marsaglia-Tsang with a fixed number of rounds (see :func:`_log_gamma`)."""
    dt = _float_dtype(dtype, "gamma")
    shape = _shape(shape, "gamma")
    if _is_number(alpha) and not float(alpha) > 0:
        raise ValueError(f"keras.random.gamma: alpha must be > 0, got {alpha!r}")
    cdt = _compute_dtype(dt)
    a = _parameter(alpha, "alpha", "gamma", cdt)
    with _Stream(seed, "gamma") as s:
        return ops.cast(ops.exp(_log_gamma(s, shape, a, cdt)), dt)


def beta(shape: Sequence[int], alpha: Any, beta: Any, dtype: Any = None, seed: Any = None) -> Tensor:
    """Beta(``alpha``, ``beta``) samples (``keras.random.beta``): ``X / (X + Y)`` for ``X ~ Gamma(alpha)``
    and ``Y ~ Gamma(beta)``, computed as ``sigmoid(log X - log Y)`` so that small parameters (where
    ``X`` and ``Y`` underflow) still give samples in [0, 1]. Parameters: positive numbers or tensors
    broadcastable to ``shape``."""
    dt = _float_dtype(dtype, "beta")
    shape = _shape(shape, "beta")
    for name, value in (("alpha", alpha), ("beta", beta)):
        if _is_number(value) and not float(value) > 0:
            raise ValueError(f"keras.random.beta: {name} must be > 0, got {value!r}")
    cdt = _compute_dtype(dt)
    a = _parameter(alpha, "alpha", "beta", cdt)
    b = _parameter(beta, "beta", "beta", cdt)
    with _Stream(seed, "beta") as s:
        log_x = _log_gamma(s, shape, a, cdt)
        log_y = _log_gamma(s, shape, b, cdt)
    return ops.cast(ops.sigmoid(ops.subtract(log_x, log_y)), dt)


_INVERSION_ROUNDS = 40
_BTRS_ROUNDS = 12
_STIRLING_TAIL = (0.0810614667953272, 0.0413406959554092, 0.0276779256849983, 0.02079067210376509,
                  0.0166446911898211, 0.0138761288230707, 0.0118967099458917, 0.0104112652619720,
                  0.00925546218271273, 0.00833056343336287)


def _stirling_tail(k: Tensor, cdt: np.dtype) -> Tensor:
    """``log(k!) - [(k + 1/2) log(k + 1) - (k + 1) + log(2 pi) / 2]``: a table for ``k <= 9``, else the series."""
    kp1 = ops.add(k, 1.0)
    kp1sq = ops.square(kp1)
    series = ops.divide(ops.subtract(1.0 / 12, ops.divide(ops.subtract(1.0 / 360, ops.divide(1.0 / 1260, kp1sq)),
                                                          kp1sq)), kp1)
    table = _core.tensor(np.asarray(_STIRLING_TAIL, cdt), like=_core.device_of_args(k))
    index = ops.cast(ops.clip(k, 0.0, 9.0), "int32")
    return ops.where(ops.less_equal(k, 9.0), ops.take(table, index), series)


def _binomial_inversion(s: _Stream, shape: tuple, n: Tensor, q: Tensor, cdt: np.dtype, rounds: int) -> Tensor:
    """Binomial(n, q) by counting geometric waiting times (Devroye, 1986, X.4), for ``n q`` below 10: the
    number of partial sums of ``ceil(log u / log(1 - q))`` that stay within ``n``, over ``rounds`` rounds
    (:data:`_INVERSION_ROUNDS`, where a count of 40 or more has probability below 1e-11, or ``n + 1`` when
    ``n`` is a known number: every wait is at least 1, so ``n + 1`` of them always pass ``n``)."""
    u = s.open_uniform((rounds, *shape), cdt)
    log1mq = ops.log1p(ops.negative(ops.where(ops.greater(q, 0.0), q, 0.5)))
    waits = ops.ceil(ops.divide(ops.log(u), log1mq))
    within = ops.less_equal(ops.cumsum(waits, axis=0), n)
    count = ops.sum(ops.cast(within, cdt), axis=0)
    return ops.where(ops.greater(q, 0.0), count, 0.0)


def _binomial_btrs(s: _Stream, shape: tuple, n: Tensor, q: Tensor, cdt: np.dtype) -> Tensor:
    """Binomial(n, q) by Hörmann's transformed rejection with squeeze, BTRS ("The generation of binomial
    random variates", 1993), for ``n q >= 10`` and ``q <= 1/2``, as JAX implements it: each round accepts
    with probability above 0.8; :data:`_BTRS_ROUNDS` rounds at once, the first accepted kept, else the
    mode ``floor((n + 1) q)`` (probability below 1e-8)."""
    rounds = (_BTRS_ROUNDS, *shape)
    npq = ops.multiply(n, ops.multiply(q, ops.subtract(1.0, q)))
    stddev = ops.sqrt(npq)
    b = ops.add(ops.multiply(stddev, 2.53), 1.15)
    a = ops.add(ops.add(ops.multiply(b, 0.0248), -0.0873), ops.multiply(q, 0.01))
    c = ops.add(ops.multiply(n, q), 0.5)
    v_r = ops.subtract(0.92, ops.divide(4.2, b))
    r = ops.divide(q, ops.subtract(1.0, q))
    alpha = ops.multiply(ops.add(ops.divide(5.1, b), 2.83), stddev)
    m = ops.floor(ops.multiply(ops.add(n, 1.0), q))
    u = ops.subtract(s.open_uniform(rounds, cdt), 0.5)
    v = s.open_uniform(rounds, cdt)
    us = ops.subtract(0.5, ops.abs(u))
    k = ops.floor(ops.add(ops.multiply(ops.add(ops.divide(ops.multiply(a, 2.0), us), b), u), c))
    squeeze = ops.logical_and(ops.greater_equal(us, 0.07), ops.less_equal(v, v_r))
    inside = ops.logical_and(ops.greater_equal(k, 0.0), ops.less_equal(k, n))
    safe_k = ops.where(inside, k, 0.0)
    log_v = ops.log(ops.divide(ops.multiply(v, alpha), ops.add(ops.divide(a, ops.square(us)), b)))
    n_m1 = ops.add(ops.subtract(n, m), 1.0)
    n_k1 = ops.add(ops.subtract(n, safe_k), 1.0)
    bound = ops.add(ops.add(
        ops.multiply(ops.add(m, 0.5), ops.log(ops.divide(ops.add(m, 1.0), ops.multiply(r, n_m1)))),
        ops.multiply(ops.add(n, 1.0), ops.log(ops.divide(n_m1, n_k1)))),
        ops.multiply(ops.add(safe_k, 0.5), ops.log(ops.divide(ops.multiply(r, n_k1), ops.add(safe_k, 1.0)))))
    bound = ops.add(bound, ops.subtract(ops.add(_stirling_tail(m, cdt), _stirling_tail(ops.subtract(n, m), cdt)),
                                        ops.add(_stirling_tail(safe_k, cdt),
                                                _stirling_tail(ops.subtract(n, safe_k), cdt))))
    accept = ops.logical_or(squeeze, ops.logical_and(inside, ops.less_equal(log_v, bound)))
    return _first_accepted(accept, k, m)


def binomial(shape: Sequence[int], counts: Any, probabilities: Any, dtype: Any = None, seed: Any = None) -> Tensor:
    """Binomial(``counts``, ``probabilities``) samples (``keras.random.binomial``): the number of successes
    in ``counts`` trials, as a float ``dtype`` (None: floatx). Parameters: numbers or tensors
    broadcastable to ``shape``; entries with ``counts < 0`` or a probability outside [0, 1] give NaN.

    As JAX: ``p > 1/2`` draws ``counts - Binomial(counts, 1 - p)``; then ``counts * p < 10`` counts
    geometric waiting times (:func:`_binomial_inversion`), larger ones use Hörmann's BTRS
    (:func:`_binomial_btrs`), each with a fixed number of rounds."""
    dt = _float_dtype(dtype, "binomial")
    shape = _shape(shape, "binomial")
    cdt = _compute_dtype(dt)
    n = ops.broadcast_to(_parameter(counts, "counts", "binomial", cdt), shape)
    p = ops.broadcast_to(_parameter(probabilities, "probabilities", "binomial", cdt), shape)
    if _is_number(counts) and float(counts) < 0:
        raise ValueError(f"keras.random.binomial: counts must be >= 0, got {counts!r}")
    if _is_number(probabilities) and not 0.0 <= float(probabilities) <= 1.0:
        raise ValueError(f"keras.random.binomial: probabilities must be in [0, 1], got {probabilities!r}")
    valid = ops.logical_and(ops.greater_equal(n, 0.0),
                            ops.logical_and(ops.greater_equal(p, 0.0), ops.less_equal(p, 1.0)))
    flip = ops.greater(p, 0.5)
    q = ops.where(flip, ops.subtract(1.0, p), p)
    q = ops.where(valid, q, 0.0)
    n_safe = ops.where(valid, n, 0.0)
    # numbers: the branch is known here, and the inversion needs at most counts + 1 rounds
    known = _is_number(counts) and _is_number(probabilities)
    if known:
        q0 = min(float(probabilities), 1.0 - float(probabilities))
        branches = ("inversion",) if float(counts) * q0 < 10.0 else ("btrs",)
        rounds = max(1, min(_INVERSION_ROUNDS, int(float(counts)) + 1))
    else:
        branches, rounds = ("inversion", "btrs"), _INVERSION_ROUNDS
    with _Stream(seed, "binomial") as s:
        if "inversion" in branches:
            small = _binomial_inversion(s, shape, n_safe, q, cdt, rounds)
        if "btrs" in branches:
            large = _binomial_btrs(s, shape, n_safe, ops.maximum(q, 1e-6), cdt)
    if known:
        x = small if branches == ("inversion",) else large
    else:
        x = ops.where(ops.less(ops.multiply(n_safe, q), 10.0), small, large)
    x = ops.where(flip, ops.subtract(n_safe, x), x)
    return ops.cast(ops.where(valid, x, math.nan), dt)

