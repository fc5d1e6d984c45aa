"""CUDA fused optimizer kernels vs the NumPy reference (several steps, many tensors, one launch)."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import kernels
from gpu_errlog import BF16, check, dev, dev_offset, host
from testutil import random

pytestmark = pytest.mark.gpu

SHAPES = [(3, 5), (70001,), (1,), (4, 4, 3, 3)]  # one tensor spans several chunks


def _params(rng, grad_dtype=np.float32):
    ps = [random(rng, s).astype(np.float32) for s in SHAPES]
    gs = [random(rng, s).astype(grad_dtype) for s in SHAPES]
    return ps, gs


def _zeros():
    return [np.zeros(s, np.float32) for s in SHAPES]


def _compare(op, host_lists, dev_lists, case):
    for name, hs, ds in zip(("params", "state0", "state1", "state2"), host_lists, dev_lists):
        for i, (h, d) in enumerate(zip(hs, ds)):
            check(op, "float32", d, h.astype(np.float64), f"{case} {name}[{i}]", tol=2e-6)


@pytest.mark.parametrize("momentum, nesterov, wd", [(0.0, False, 0.0), (0.9, False, 0.0), (0.9, True, 0.01)])
@pytest.mark.parametrize("device_lr", [False, True])
def test_sgd(rng, momentum, nesterov, wd, device_lr):
    ps, gs = _params(rng)
    vs = _zeros()
    dps, dgs, dvs = [dev(p) for p in ps], [dev(g) for g in gs], [dev(v) for v in vs]
    lr = dev(np.asarray(0.05, np.float32)) if device_lr else 0.05
    for _ in range(3):
        kernels.sgd_update(ps, gs, vs, lr=0.05, momentum=momentum, nesterov=nesterov, weight_decay=wd)
        kernels.sgd_update(dps, dgs, dvs, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=wd)
    _compare("sgd_update", [ps, vs], [dps, dvs], f"m={momentum} n={nesterov} wd={wd}")


@pytest.mark.parametrize("amsgrad, wd", [(False, 0.0), (True, 0.0), (False, 0.004)])
@pytest.mark.parametrize("device_scalars", [False, True])
@pytest.mark.parametrize("grad_dtype", [np.float32, np.float16])
def test_adam(rng, amsgrad, wd, device_scalars, grad_dtype):
    ps, gs = _params(rng, grad_dtype)
    m, v, vh = _zeros(), _zeros(), _zeros()
    dps, dgs = [dev(p) for p in ps], [dev(g) for g in gs]
    dm, dv, dvh = [dev(a) for a in m], [dev(a) for a in v], [dev(a) for a in vh]
    for step in (1, 2, 3):
        lr = dev(np.asarray(1e-2, np.float32)) if device_scalars else 1e-2
        st = dev(np.asarray(step, np.int64)) if device_scalars else step
        kernels.adam_update(ps, gs, m, v, lr=1e-2, step=step, weight_decay=wd, amsgrad=amsgrad, vhat=vh, grad_scale=4.0)
        kernels.adam_update(dps, dgs, dm, dv, lr=lr, step=st, weight_decay=wd, amsgrad=amsgrad, vhat=dvh,
                        grad_scale=dev(np.asarray(4.0, np.float32)) if device_scalars else 4.0)
    _compare("adam_update", [ps, m, v] + ([vh] if amsgrad else []), [dps, dm, dv] + ([dvh] if amsgrad else []),
             f"amsgrad={amsgrad} wd={wd} grads={np.dtype(grad_dtype)}")


@pytest.mark.parametrize("momentum, centered", [(0.0, False), (0.9, False), (0.5, True)])
def test_rmsprop(rng, momentum, centered):
    ps, gs = _params(rng)
    sq, mo, av = _zeros(), _zeros(), _zeros()
    dps, dgs = [dev(p) for p in ps], [dev(g) for g in gs]
    dsq, dmo, dav = [dev(a) for a in sq], [dev(a) for a in mo], [dev(a) for a in av]
    for _ in range(3):
        kernels.rmsprop_update(ps, gs, sq, lr=1e-3, momentum=momentum, centered=centered, mom=mo, avg=av)
        kernels.rmsprop_update(dps, dgs, dsq, lr=1e-3, momentum=momentum, centered=centered, mom=dmo, avg=dav)
    _compare("rmsprop_update", [ps, sq], [dps, dsq], f"momentum={momentum} centered={centered}")


def test_skip_flag_leaves_everything_unchanged(rng):
    ps, gs = _params(rng)
    dps, dgs = [dev(p) for p in ps], [dev(g) for g in gs]
    dm, dv = [dev(a) for a in _zeros()], [dev(a) for a in _zeros()]
    kernels.adam_update(dps, dgs, dm, dv, lr=0.1, step=1, skip=dev(np.asarray(1, np.int32)))
    for p, d in zip(ps, dps):
        assert np.array_equal(host(d), p.astype(np.float64))
    kernels.adam_update(dps, dgs, dm, dv, lr=0.1, step=1, skip=dev(np.asarray(0, np.int32)))
    assert not np.array_equal(host(dps[0]), ps[0].astype(np.float64))


def _updater(name):
    """update(params, grads, states, step, skip) for one optimizer; states: three lists of slots."""
    if name == "sgd":
        return lambda ps, gs, st, step, skip: kernels.sgd_update(ps, gs, st[0], lr=0.05, momentum=0.9, nesterov=True,
                                                             weight_decay=0.01, skip=skip)
    if name.startswith("adam"):
        ams = name == "adam_amsgrad"
        return lambda ps, gs, st, step, skip: kernels.adam_update(ps, gs, st[0], st[1], lr=1e-2, step=step,
                                                              weight_decay=0.004, amsgrad=ams, vhat=st[2],
                                                              grad_scale=4.0, skip=skip)
    return lambda ps, gs, st, step, skip: kernels.rmsprop_update(ps, gs, st[0], lr=1e-3, momentum=0.5, centered=True,
                                                             mom=st[1], avg=st[2], skip=skip)


@pytest.mark.parametrize("name", ["sgd", "adam", "adam_amsgrad", "rmsprop"])
@pytest.mark.parametrize("step_dtype", [np.int64, np.float32])
def test_skip_then_apply_matches_the_reference(rng, name, step_dtype):
    """skip=1 (its gradients poisoned with NaN and inf) changes nothing on the device, the step
    count included; the next skip=0 step equals the NumPy reference's, bias correction included."""
    update = _updater(name)
    ps, g1 = _params(rng)
    _, g3 = _params(rng)
    bad = [np.full(s, np.nan, np.float32) for s in SHAPES]
    bad[0][0, 0] = np.inf
    hst, hstep = [_zeros() for _ in range(3)], np.zeros((), step_dtype)
    dps = [dev(p) for p in ps]
    dst, dstep = [[dev(a) for a in col] for col in hst], dev(np.zeros((), step_dtype))
    for k, (grads, skip) in enumerate(((g1, 0), (bad, 1), (g3, 0))):
        flag = dev(np.asarray(skip, np.int32))  # a device flag: the kernels read it, the host never does
        kernels.advance_step(hstep, skip=np.asarray(skip, np.int32))
        update(ps, grads, hst, hstep, np.asarray(skip, np.int32))
        if skip:
            before = [host(a) for a in dps + [x for col in dst for x in col] + [dstep]]
        kernels.advance_step(dstep, skip=flag)
        update(dps, [dev(g) for g in grads], dst, dstep, flag)
        if skip:
            after = [host(a) for a in dps + [x for col in dst for x in col] + [dstep]]
            assert all(np.array_equal(a, b) for a, b in zip(after, before)), f"{name}: the skipped step changed state"
    assert host(dstep) == 2 == float(hstep)
    used = {"sgd": 1, "adam": 2, "adam_amsgrad": 3, "rmsprop": 3}[name]
    _compare(f"{name} skip", [ps] + hst[:used], [dps] + dst[:used], f"{name} step={np.dtype(step_dtype)}")


@pytest.mark.parametrize("step_dtype", [np.float32, np.int32, np.int64])
def test_advance_step_reads_the_flag_on_the_device(step_dtype):
    step = dev(np.asarray(5, step_dtype))
    for skip in (None, 0, dev(np.asarray(0, np.int32)), 1, dev(np.asarray(1, np.int32)), dev(np.asarray(7, np.int32))):
        kernels.advance_step(step, skip=skip)
    assert step.numpy().dtype == step_dtype and int(step.numpy()) == 8


def test_owner_tables_with_new_gradient_arrays_every_step(rng):
    """As a training step does: fresh gradient arrays each call (addresses reused by the pool or
    not), one UpdateTables kept by the caller; the numbers follow the reference either way."""
    ps, gs = _params(rng)
    vs = _zeros()
    dps, dvs = [dev(p) for p in ps], [dev(v) for v in vs]
    tables = kernels.UpdateTables()
    for step in range(1, 4):
        kernels.sgd_update(ps, [g * step for g in gs], vs, lr=0.05, momentum=0.9)
        dgs = [dev(g * step) for g in gs]
        kernels.sgd_update(dps, dgs, dvs, lr=0.05, momentum=0.9, tables=tables)
        del dgs  # freed stream-ordered after the update: the next step's may reuse the addresses
    assert 1 <= len(tables) <= 3
    _compare("sgd_update", [ps, vs], [dps, dvs], "owner tables, new gradients each step")


# Lengths that are not multiples of any vector width, one tensor over many chunks (70001 items
# in ~90k: 1024-item chunks), a tensor shorter than one vector.
ODD_SHAPES = [(8191,), (3,), (16, 3, 3, 7), (70001,), (1,), (4096,)]


def _grads(step, shapes, dtype):
    return [random(np.random.default_rng(100 + step), s).astype(dtype) for s in shapes]


@pytest.mark.parametrize("name", ["sgd", "adam", "adam_amsgrad", "rmsprop"])
@pytest.mark.parametrize("grad_dtype", [np.float32, BF16])
def test_vector_and_scalar_paths_follow_the_reference(rng, name, grad_dtype):
    """Offset 0: every array 16-byte aligned (vector loads, scalar tails); offsets 1 and 2 items
    (4 and 8 bytes) break the alignment, so every tensor takes the scalar path. All three follow
    the reference, and repeating a run gives the same bits."""
    update = _updater(name)
    ps = [random(rng, s).astype(np.float32) for s in ODD_SHAPES]
    hst = [[np.zeros(s, np.float32) for s in ODD_SHAPES] for _ in range(3)]
    runs = {}
    for offset, repeat in ((0, 0), (0, 1), (1, 0), (2, 0)):
        dps = [dev_offset(p, offset) for p in ps]
        dst = [[dev_offset(a, offset) for a in col] for col in hst]
        for step in (1, 2, 3):
            update(dps, [dev_offset(g, offset) for g in _grads(step, ODD_SHAPES, grad_dtype)], dst, step, None)
        runs[offset, repeat] = [np.asarray(a.to_host()) for a in dps + [x for col in dst for x in col]]
    for step in (1, 2, 3):
        update(ps, _grads(step, ODD_SHAPES, grad_dtype), hst, step, None)
    used = {"sgd": 1, "adam": 2, "adam_amsgrad": 3, "rmsprop": 3}[name]
    want = ps + [a for col in hst[:used] for a in col]
    for (offset, repeat), got in runs.items():
        for i, (g, w) in enumerate(zip(got, want)):
            check(f"{name}_update", "float32", g, w.astype(np.float64),
                  f"offset {offset} grads {np.dtype(grad_dtype)} array {i}", tol=2e-6)
    assert all(np.array_equal(a, b) for a, b in zip(runs[0, 0], runs[0, 1])), f"{name}: two runs differ"


@pytest.mark.parametrize("grad_dtype", [np.float16, BF16, np.float32])
@pytest.mark.parametrize("offset", [0, 3])
def test_float16_params_with_eight_item_vectors(rng, grad_dtype, offset):
    """float16 parameters and slots (8-item vectors) against the float32 reference on the same
    inputs, its parameters and slots rounded to float16 after each step as the kernel stores them."""
    shapes = [(8195,), (17,), (4104,), (7,)]
    p16 = [random(rng, s).astype(np.float16) for s in shapes]
    ps = [p.astype(np.float32) for p in p16]
    m, v = [np.zeros(s, np.float32) for s in shapes], [np.zeros(s, np.float32) for s in shapes]
    dps = [dev_offset(p, offset) for p in p16]
    dm = [dev_offset(np.zeros(s, np.float16), offset) for s in shapes]
    dv = [dev_offset(np.zeros(s, np.float16), offset) for s in shapes]
    for step in (1, 2, 3):
        gs = _grads(step, shapes, grad_dtype)
        kernels.adam_update(ps, gs, m, v, lr=1e-2, step=step, weight_decay=0.004)
        ps, m, v = ([a.astype(np.float16).astype(np.float32) for a in col] for col in (ps, m, v))
        kernels.adam_update(dps, [dev_offset(g, offset) for g in gs], dm, dv, lr=1e-2, step=step, weight_decay=0.004)
    for i, (d, h) in enumerate(zip(dps, ps)):
        check("adam_update", "float16", d, h.astype(np.float64), f"offset {offset} params[{i}]")


@pytest.mark.parametrize("clip", [{"clipnorm": 0.5}, {"global_clipnorm": 1.0}])
def test_clipping_sums_follow_the_reference_on_both_paths(rng, clip):
    """The clipping norms are summed per chunk in runs of the vector width on both paths."""
    ps = [random(rng, s).astype(np.float32) for s in ODD_SHAPES]
    got = {}
    for offset in (0, 1):
        dps = [dev_offset(p, offset) for p in ps]
        dm = [dev_offset(np.zeros(s, np.float32), offset) for s in ODD_SHAPES]
        dv = [dev_offset(np.zeros(s, np.float32), offset) for s in ODD_SHAPES]
        gs = [dev_offset(g, offset) for g in _grads(1, ODD_SHAPES, np.float32)]
        kernels.adam_update(dps, gs, dm, dv, lr=1e-2, step=1, **clip)
        got[offset] = dps
    m, v = [np.zeros(s, np.float32) for s in ODD_SHAPES], [np.zeros(s, np.float32) for s in ODD_SHAPES]
    kernels.adam_update(ps, _grads(1, ODD_SHAPES, np.float32), m, v, lr=1e-2, step=1, **clip)
    for offset, dps in got.items():
        for i, (d, h) in enumerate(zip(dps, ps)):
            check("adam_update", "float32", d, h.astype(np.float64), f"{clip} offset {offset} params[{i}]", tol=2e-6)
