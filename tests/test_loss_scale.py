"""Dynamic loss scaling (mixed_float16): a skipped step changes nothing, the step count included.

CPU part (NumPy backend, the loss scale forced on as in test_models): an optimizer that skips a
step ends bit-identical (parameters, slots, device step count) to one that never saw it; a model
whose first steps overflow trains, once the scale is small enough, exactly as a model that only
made the applied steps (Adam's bias correction counts applied updates); ``iterations`` counts
applied updates, read lazily from the device counter when the skip flags lived there.

GPU part (``@pytest.mark.gpu``): the same counts through real CUDA graphs, where the host cannot
see which steps were skipped until it reads the device counter.
"""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind
import dnnbind as keras
from dnnbind import backend, layers, mixed_precision, models, kernels, optimizers
from testutil import rel_error

OPTIMIZERS = {
    "sgd_momentum": lambda: optimizers.SGD(0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    "adam_amsgrad": lambda: optimizers.Adam(0.01, amsgrad=True, weight_decay=0.004),
    "rmsprop_centered": lambda: optimizers.RMSprop(0.01, momentum=0.5, centered=True),
}


def _grads(rng, shapes):
    return [rng.normal(size=s).astype(np.float32) for s in shapes]


def _state(opt):
    return [opt._step_array] + [a for slots in opt._slots for a in slots.values()]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_skipped_step_is_as_if_it_never_happened(rng, name):
    shapes = [(4, 3), (3,)]
    p0 = [rng.normal(size=s).astype(np.float32) for s in shapes]
    g1, g2, g3 = (_grads(rng, shapes) for _ in range(3))
    bad = [np.full(s, np.inf, np.float32) for s in shapes]
    skipping, plain = OPTIMIZERS[name](), OPTIMIZERS[name]()
    a, b = [p.copy() for p in p0], [p.copy() for p in p0]
    no, yes = np.asarray(0, np.int32), np.asarray(1, np.int32)
    skipping._apply_raw(a, g1, skip=no)
    before = [p.copy() for p in a] + [np.array(s, copy=True) for s in _state(skipping)]
    skipping._apply_raw(a, bad, skip=yes)
    assert all(np.array_equal(x, y) for x, y in zip(a + _state(skipping), before)), "a skipped step changed state"
    assert skipping.iterations == 1 and int(skipping._step_array) == 1
    for g in (g2, g3):
        skipping._apply_raw(a, g, skip=no)
    for g in (g1, g2, g3):
        plain._apply_raw(b, g)
    assert skipping.iterations == plain.iterations == 3 and skipping._step_array.dtype == np.int64
    for x, y in zip(a + _state(skipping), b + _state(plain)):
        assert np.array_equal(x, y)


class _DeviceFlag(np.ndarray):
    """A NumPy skip flag the optimizer must treat as living on the device (value unknown to the host)."""


def test_iterations_are_read_from_the_device_counter_only_when_flags_were_on_the_device(monkeypatch):
    real = backend.is_device_array
    monkeypatch.setattr(backend, "is_device_array", lambda a: isinstance(a, _DeviceFlag) or real(a))
    reads = []
    real_to_numpy = backend.to_numpy
    monkeypatch.setattr(backend, "to_numpy", lambda a, *args, **kw: reads.append(a) or real_to_numpy(a, *args, **kw))
    flag = lambda v: np.asarray(v, np.int32).view(_DeviceFlag)  # noqa: E731
    # the schedule drops at step 2: the host estimate picks the rate without reading the device
    opt = optimizers.SGD(optimizers.schedules.PiecewiseConstantDecay([1], [0.5, 0.25]))
    p = [np.ones(3, np.float32)]
    g = [np.full(3, 2.0, np.float32)]
    for skip in (0, 1, 0, 1):
        opt._apply_raw(p, g, skip=flag(skip))
    assert reads == [] and (opt._iterations, opt._unconfirmed) == (4, 4)  # the host could not know
    # applied: steps 1 (lr 0.5, estimate 0) and 3 (lr 0.25, estimate 2 > boundary 1)
    np.testing.assert_array_equal(p[0], np.float32(1.0 - 0.5 * 2.0 - 0.25 * 2.0))
    assert opt.iterations == 2 and len(reads) == 1  # one lazy read of the device counter
    assert opt.iterations == 2 and len(reads) == 1 and opt._unconfirmed == 0  # then exact, no more reads
    opt._apply_raw(p, g)  # no flag: counted on the host
    opt._apply_raw(p, g, skip=np.asarray(1, np.int32))  # a host flag: counted exactly too
    assert opt.iterations == 3 and len(reads) == 1 and int(opt._step_array) == 3
    opt.iterations = 7  # the setter keeps the device counter equal
    assert int(opt._step_array) == 7 and opt.get_state()["iterations"] == 7


def _mlp(weights=None):
    model = keras.Sequential([keras.Input((6,)), layers.Dense(5, activation="relu"), layers.Dense(3)])
    if weights is not None:
        model.set_weights(weights)
    model.compile(optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_model_overflowed_steps_leave_adam_bias_correction_as_if_they_never_happened(rng):
    """A scale of 2**127 overflows the first steps' gradients; once halved enough, the model trains
    exactly (bit for bit: power-of-two scaling is exact) as one that made only the applied steps."""
    x = (100 * rng.normal(size=(8, 6))).astype(np.float32)
    y = rng.integers(0, 3, 8)
    scaled = _mlp()
    plain = _mlp(scaled.get_weights())
    scaled._loss_scale = models._LossScale(scaled.device, initial=2.0**127)
    steps = 12
    with np.errstate(all="ignore"):
        for _ in range(steps):
            scaled.train_on_batch(x, y)
    skipped = int(round(np.log2(2.0**127 / float(scaled._loss_scale.scale))))
    assert 1 <= skipped <= steps - 3
    assert scaled.optimizer.iterations == steps - skipped == int(scaled.optimizer._step_array)
    for _ in range(steps - skipped):
        plain.train_on_batch(x, y)
    for a, b in zip(scaled.get_weights(), plain.get_weights()):
        assert np.array_equal(a, b)
    for a, b in zip(_state(scaled.optimizer), _state(plain.optimizer)):
        assert np.array_equal(a, b)


# ==================================================================================== GPU
@pytest.fixture
def gpu():
    dnnbind.set_default_device("cuda")
    yield
    dnnbind.set_default_device(None)
    mixed_precision.set_global_policy("float32")


def _gpu_model(jit_compile):
    mixed_precision.set_global_policy("mixed_float16")
    init = keras.initializers.GlorotUniform
    model = keras.Sequential([
        keras.Input((8, 8, 3)),
        layers.Conv2D(6, 3, padding="same", activation="relu", kernel_initializer=init(1)),
        layers.Flatten(),
        layers.Dense(16, activation="relu", kernel_initializer=init(2)),
        layers.Dense(5, activation="softmax", kernel_initializer=init(3)),
    ])
    model.compile(optimizers.Adam(3e-3), "sparse_categorical_crossentropy", jit_compile=jit_compile)
    return model


@pytest.mark.gpu
def test_gpu_skipped_steps_counted_on_the_device_through_graphs(gpu):
    """float16 gradients overflow under a scale of 2**40 until it is halved to about 2**16: those
    steps are skipped inside replayed graphs, and only the device knows which."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16 * 40, 8, 8, 3)).astype(np.float32)
    y = rng.integers(0, 5, len(x))
    results = {}
    with kernels.config.override(allow_tf32=False, deterministic=True):
        for jit in (True, False):
            model = _gpu_model(jit)
            model._loss_scale = models._LossScale(model.device, initial=2.0**40)
            model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
            opt = model.optimizer
            skipped = int(round(np.log2(2.0**40 / float(model._loss_scale.scale.numpy()))))
            assert 1 <= skipped < 40
            if jit:
                assert model._step_graphs.stats["replays"] >= 30
            # the host estimate counts issued steps; the flags were on the device
            assert opt._iterations == 40 and opt._unconfirmed == 40
            assert opt.iterations == 40 - skipped and opt._unconfirmed == 0
            assert int(opt._step_array.numpy()) == 40 - skipped
            assert all(np.all(np.isfinite(w)) for w in model.get_weights())
            results[jit] = (skipped, model.get_weights())
    (sg, wg), (se, we) = results[True], results[False]
    assert sg == se
    for a, b in zip(wg, we):
        assert rel_error(a, b) < 1e-3
