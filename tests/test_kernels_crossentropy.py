"""kernels.crossentropy: the per-row categorical cross-entropies (NumPy reference against the definition
and finite differences, and against kernels.losses' batch means), and the CUDA side's launch arguments
against the losses.cu kernels it reuses (a CPU check)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from dnnbind import kernels
from dnnbind._validate import BFLOAT16
from dnnbind.kernels import crossentropy
from dnnbind.kernels._cuda import _common as cm
from dnnbind.kernels._cuda import crossentropy as cuda_xent
from testutil import numerical_grad, random, rel_error


@pytest.mark.parametrize("from_logits", [True, False])
@pytest.mark.parametrize("sparse", [True, False])
def test_rows_against_the_definition_and_finite_differences(rng, from_logits, sparse):
    n, c = 4, 5
    pred = random(rng, (n, c), low=-2, high=2) if from_logits else random(rng, (n, c), low=0.05, high=1.0)
    labels = np.array([1, 0, 4, 2], np.int32)
    target = np.eye(c)[labels] if sparse else random(rng, (n, c), low=0.0, high=1.0)
    fn = crossentropy.softmax_cross_entropy_rows if from_logits else crossentropy.crossentropy_from_probs_rows
    loss, grad = fn(pred, labels if sparse else target)
    if from_logits:
        logp = pred - np.log(np.exp(pred).sum(1, keepdims=True))
    else:
        logp = np.log(np.clip(pred / pred.sum(1, keepdims=True), 1e-7, 1 - 1e-7))
    assert loss.shape == (n,) and loss.dtype == pred.dtype
    assert rel_error(loss, -(target * logp).sum(1)) < 1e-12
    for i in range(n):  # each row's gradient is that row's own loss's
        row = pred[i:i + 1].copy()
        lab = labels[i:i + 1] if sparse else target[i:i + 1]
        num = numerical_grad(lambda: float(fn(row, lab)[0][0]), row)
        assert rel_error(grad[i:i + 1], num) < 1e-7
    # the batch-mean kernels of kernels.losses agree on the mean (for rows of targets that sum to 1: for
    # others their NumPy reference leaves out the sum of the targets in the softmax gradient, their CUDA
    # kernels do not)
    target = target / target.sum(1, keepdims=True)
    loss, grad = fn(pred, labels if sparse else target)
    mean_fn = kernels.softmax_cross_entropy if from_logits else kernels.crossentropy_from_probs
    mean, dmean = mean_fn(pred, labels if sparse else target)
    assert rel_error(mean, loss.mean()) < 1e-12 and rel_error(dmean, grad / n) < 1e-12


def test_labels_of_shape_n_1_and_half_precision(rng):
    pred = random(rng, (3, 4), dtype=np.float16)
    labels = np.array([[1], [3], [0]], np.int64)
    loss, grad = crossentropy.softmax_cross_entropy_rows(pred, labels)
    assert loss.dtype == np.float16 and grad.dtype == np.float16
    x = pred.astype(np.float32)
    ref = np.log(np.exp(x).sum(1)) - x[np.arange(3), labels[:, 0]]
    assert rel_error(loss, ref) < 1e-3


def test_bad_labels_are_refused(rng):
    with pytest.raises(ValueError, match=r"class indices in \[0, 4\)"):
        crossentropy.softmax_cross_entropy_rows(random(rng, (2, 4)), np.array([0, 4]))
    with pytest.raises(ValueError, match="integer labels must have shape"):
        crossentropy.softmax_cross_entropy_rows(random(rng, (2, 4)), np.array([0, 1, 2]))


def _kernel_params(source: str, name: str) -> int:
    """The number of parameters of ``extern "C" __global__ void <name>##...(...)`` in a .cu source."""
    match = re.search(r'extern "C" __global__ void ' + name + r'_##S##_\w*\(([^)]*)\)', source)
    assert match, name
    return len([p for p in match.group(1).replace("\\", " ").split(",") if p.strip()])


def test_cuda_crossentropy_passes_the_row_kernels_their_parameters():
    """The device side launches losses.cu's row kernels: as many arguments as they declare (CPU check;
    the kernels' names and compilation for sm_90 are checked by test_cuda_kernels_compile.py)."""
    source = (Path(cm.__file__).parent / "losses.cu").read_text()

    class Fake:
        ptr = 0

    for kernel, extra in (("softmax_xent", ()), ("probs_xent", (cm.f32(1e-7),))):
        args = cuda_xent._arguments(Fake(), Fake(), Fake(), Fake(), 4, 5, extra)
        assert len(args) == _kernel_params(source, kernel)
        assert float(args[7]) == 4.0  # grad_scale = N: the kernels' 1/N cancels exactly
    assert set(cuda_xent.KERNELS) == {"softmax_xent", "probs_xent"}


def test_bfloat16_rows_and_labels(rng):
    pred = random(rng, (3, 4)).astype(BFLOAT16)
    target = random(rng, (3, 4), low=0.0, high=1.0).astype(BFLOAT16)
    loss, grad = crossentropy.softmax_cross_entropy_rows(pred, target)
    assert loss.dtype == BFLOAT16 and grad.dtype == BFLOAT16
    x, t = pred.astype(np.float64), target.astype(np.float64)
    ref = -(t * (x - np.log(np.exp(x).sum(1, keepdims=True)))).sum(1)
    assert rel_error(loss.astype(np.float64), ref) < 2e-2
