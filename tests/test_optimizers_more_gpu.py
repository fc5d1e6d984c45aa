"""The numeric-engine optimizers (Adagrad, Adadelta, Adamax, Nadam, Lion, Lamb, Ftrl, Adafactor, ScheduleFreeAdamW) on device arrays vs the
same optimizer on NumPy arrays: several steps, a device skip flag (read on the device only), clipping and decay."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import optimizers
from gpu_errlog import check, dev
from testutil import random

pytestmark = pytest.mark.gpu

SHAPES = [(3, 5), (70001,), (1,), (4, 4, 3, 3)]
CASES = [("Adagrad", {"learning_rate": 0.1, "weight_decay": 0.01}), ("Adadelta", {"learning_rate": 1.0}),
         ("Adamax", {"learning_rate": 0.05, "clipnorm": 0.5}), ("Nadam", {"learning_rate": 0.02}),
         ("Lion", {"learning_rate": 0.01, "clipvalue": 0.3}), ("Lamb", {"global_clipnorm": 1.0}),
         ("Ftrl", {"learning_rate": 0.1, "l1_regularization_strength": 0.01, "beta": 0.1}),
         ("Adafactor", {"learning_rate": 0.5, "relative_step": False}),
         ("ScheduleFreeAdamW", {"learning_rate": 0.01, "warmup_steps": 2})]


@pytest.mark.parametrize("name, kwargs", CASES, ids=[c[0] for c in CASES])
def test_device_steps_match_numpy(rng, name, kwargs):
    ps = [random(rng, s).astype(np.float32) for s in SHAPES]
    grads = [[random(rng, s).astype(np.float32) for s in SHAPES] for _ in range(4)]
    host_opt, dev_opt = getattr(optimizers, name)(**kwargs), getattr(optimizers, name)(**kwargs)
    hp, dp = [p.copy() for p in ps], [dev(p) for p in ps]
    for i, gs in enumerate(grads):
        skip = 1 if i == 2 else 0  # the third step is skipped: on the device through its flag
        host_opt._apply_raw(hp, [g.copy() for g in gs], skip=np.array(skip, np.int32))
        dev_opt._apply_raw(dp, [dev(g) for g in gs], skip=dev(np.array(skip, np.int32)))
    assert dev_opt.iterations == host_opt.iterations == 3
    for i, (h, d) in enumerate(zip(hp, dp)):
        check(name, "float32", d, h.astype(np.float64), f"params[{i}]", tol=5e-6)
    host_state, dev_state = host_opt.get_state(), dev_opt.get_state()
    for key, value in host_state.items():
        np.testing.assert_allclose(dev_state[key], value, rtol=5e-5, atol=1e-6, err_msg=key)
