"""dnnbind/trainers/loops.py: the epoch loops moved out of Trainer keep where their warnings point
(each ``stacklevel`` counts the loop's own frame): at the caller of ``evaluate``/``predict``.

(``fit``'s point one frame short, at ``Model.fit``'s wrapper, and a ran-out warning from ``run_test`` at
``Trainer.evaluate``/``Trainer.fit``: as before the split, which kept every location as it was.)"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers


def _model():
    m = keras.Sequential([keras.Input((4,)), layers.Dense(2)])
    m.compile("sgd", "mse", jit_compile=False)
    return m


def _batches(n):
    rng = np.random.default_rng(0)
    for _ in range(n):
        yield rng.random((4, 4), dtype=np.float32), rng.random((4, 2), dtype=np.float32)


@pytest.mark.parametrize("call", [
    lambda m: m.evaluate(_batches(2), batch_size=5, verbose=0),        # batch_size ignored
    lambda m: m.predict(_batches(2), batch_size=5, verbose=0),
    lambda m: m.predict(_batches(2), steps=3, verbose=0),               # the input ran out of data
])
def test_loop_warnings_point_at_the_caller(call):
    model = _model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call(model)
    user = [w for w in caught if issubclass(w.category, UserWarning)]
    assert len(user) == 1, [str(w.message) for w in caught]
    assert user[0].filename == __file__, user[0].filename
