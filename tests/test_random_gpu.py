"""``dnnbind.random`` on a GPU: the same bits as the NumPy backend (uniform and what is built from it),
a SeedGenerator's counter on the device, advanced there."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind
from dnnbind import backend
from dnnbind import random as R

pytestmark = pytest.mark.gpu


@pytest.fixture
def on():
    def run(device, fn):
        dnnbind.set_default_device(device)
        try:
            return fn()
        finally:
            dnnbind.set_default_device(None)
    return run


def _host(t):
    return np.asarray(t)


@pytest.mark.parametrize("draw", [
    lambda seed: R.uniform((37, 11), -2.0, 5.0, seed=seed),
    lambda seed: R.randint((1000,), -7, 100, seed=seed),
    lambda seed: R.dropout(np.arange(1.0, 61.0, dtype=np.float32).reshape(6, 10), 0.3, seed=seed),
    lambda seed: R.shuffle(np.arange(60.0, dtype=np.float32).reshape(6, 10), axis=1, seed=seed),
], ids=["uniform", "randint", "dropout", "shuffle"])
def test_bitwise_the_same_on_both_backends(on, draw):
    cpu = _host(on("cpu", lambda: draw(3)))
    gpu = on("cuda", lambda: draw(3))
    assert backend.is_device_array(gpu.data)
    np.testing.assert_array_equal(_host(gpu), cpu)


def test_a_generator_counter_lives_and_advances_on_the_device(on):
    def two_draws():
        gen = R.SeedGenerator(11)
        first, second = R.uniform((100,), seed=gen), R.uniform((100,), seed=gen)
        return gen, _host(first), _host(second)

    cpu_gen, *cpu = on("cpu", two_draws)
    gpu_gen, *gpu = on("cuda", two_draws)
    assert backend.is_device_array(gpu_gen.counter)
    assert int(np.asarray(gpu_gen.counter.to_host())) == int(cpu_gen.counter) == 2 * R.BLOCKS_PER_CALL
    for a, b in zip(cpu, gpu):
        np.testing.assert_array_equal(a, b)


def test_normal_agrees_to_rounding(on):
    cpu = _host(on("cpu", lambda: R.normal((4096,), seed=5)))
    gpu = _host(on("cuda", lambda: R.normal((4096,), seed=5)))
    np.testing.assert_allclose(gpu, cpu, rtol=1e-5, atol=1e-6)
