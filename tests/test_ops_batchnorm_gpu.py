"""CUDA batch normalization (cuDNN) vs the NumPy reference; torch cross-check."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import ops
from gpu_errlog import DTYPES, check, dev, host, poisoned, quantize
from testutil import random

pytestmark = pytest.mark.gpu

CASES = [("spatial", "NCHW", (4, 3, 5, 6)), ("spatial", "NHWC", (4, 5, 6, 3)), ("per_activation", "NCHW", (5, 3, 2, 2)),
         ("per_activation", "NHWC", (5, 2, 2, 3)), ("spatial", "NCHW", (16, 7)), ("spatial", "NCHW", (1, 13, 3, 3))]


@pytest.mark.parametrize("label, dtype", DTYPES)
@pytest.mark.parametrize("mode, layout, shape", CASES)
def test_batchnorm_training_inference_backward(rng, label, dtype, mode, layout, shape):
    x = quantize(random(rng, shape, low=-2, high=3), dtype)
    if len(shape) == 2:
        pshape = (shape[1],)
    elif mode == "per_activation":
        pshape = shape[1:]
    else:
        pshape = (shape[1],) if layout == "NCHW" else (shape[3],)
    gamma = random(rng, pshape, low=0.5, high=1.5).astype(np.float32)
    beta = random(rng, pshape).astype(np.float32)
    rm, rv = random(rng, pshape).astype(np.float32), random(rng, pshape, low=0.5, high=2).astype(np.float32)
    dy = quantize(random(rng, shape), dtype)
    kw = dict(epsilon=1e-3, mode=mode, layout=layout)
    rm_ref, rv_ref = rm.astype(np.float64), rv.astype(np.float64)
    y_ref, mean_ref, inv_ref = ops.batchnorm_forward_training(x, gamma.astype(np.float64), beta.astype(np.float64),
                                                              rm_ref, rv_ref, momentum=0.9, **kw)
    drm, drv = dev(rm), dev(rv)
    xd = dev(x, dtype)
    y, mean, inv = ops.batchnorm_forward_training(xd, dev(gamma), dev(beta), drm, drv, momentum=0.9,
                                                  out=poisoned(shape, dtype), **kw)
    case = f"{mode} {layout} {shape}"
    check("batchnorm_forward_training", label, y, y_ref, case)
    check("batchnorm.save_mean", label, mean, mean_ref, case)
    check("batchnorm.save_inv_std", label, inv, inv_ref, case)
    check("batchnorm.running_mean", label, drm, rm_ref, case)
    check("batchnorm.running_var", label, drv, rv_ref, case)
    yi = ops.batchnorm_forward_inference(xd, dev(gamma), dev(beta), drm, drv, out=poisoned(shape, dtype), **kw)
    yi_ref = ops.batchnorm_forward_inference(x, gamma.astype(np.float64), beta.astype(np.float64), rm_ref, rv_ref,
                                             **kw)
    check("batchnorm_forward_inference", label, yi, yi_ref, case)
    dx, dg, db = ops.batchnorm_backward(dev(dy, dtype), xd, dev(gamma), mean, inv, **kw)
    dx_ref, dg_ref, db_ref = ops.batchnorm_backward(dy, x, gamma.astype(np.float64), mean_ref, inv_ref, **kw)
    check("batchnorm_backward.dx", label, dx, dx_ref, case)
    check("batchnorm_backward.dgamma", label, dg, dg_ref, case)
    check("batchnorm_backward.dbeta", label, db, db_ref, case)


def test_batchnorm_matches_torch(rng):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    x = random(rng, (8, 4, 5, 5)).astype(np.float32)
    gamma, beta = np.ones(4, np.float32) * 1.5, np.full(4, 0.25, np.float32)
    rm, rv = np.zeros(4, np.float32), np.ones(4, np.float32)
    drm, drv = dev(rm), dev(rv)
    y, _, _ = ops.batchnorm_forward_training(dev(x), dev(gamma), dev(beta), drm, drv, momentum=0.9, epsilon=1e-3)
    t_rm, t_rv = torch.zeros(4).cuda(), torch.ones(4).cuda()
    ref = torch.nn.functional.batch_norm(torch.from_numpy(x).cuda(), t_rm, t_rv, torch.from_numpy(gamma).cuda(),
                                         torch.from_numpy(beta).cuda(), training=True, momentum=0.1, eps=1e-3)
    check("batchnorm_forward_training", "float32", y, ref.cpu().numpy(), "torch")
    check("batchnorm.running_var", "float32", drv, t_rv.cpu().numpy(), "torch")
