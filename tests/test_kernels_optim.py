"""NumPy optimizer updates against hand-computed Keras 3 formulas (two steps)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dnnbind import kernels


def _setup():
    p = np.array([1.0, -2.0, 0.5])
    g1 = np.array([0.1, -0.3, 0.2])
    g2 = np.array([-0.2, 0.1, 0.4])
    return p, g1, g2


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_momentum_two_steps(nesterov):
    p, g1, g2 = _setup()
    lr, mom, wd = 0.1, 0.9, 0.01
    params, vel = [p.copy()], [np.zeros(3)]
    ref_p, ref_v = p.copy(), np.zeros(3)
    for g in (g1, g2):
        kernels.sgd_update(params, [g], vel, lr=np.asarray(lr), momentum=mom, nesterov=nesterov, weight_decay=wd)
        ref_p = ref_p - lr * wd * ref_p
        ref_v = mom * ref_v - lr * g
        ref_p = ref_p + (mom * ref_v - lr * g if nesterov else ref_v)
    np.testing.assert_allclose(params[0], ref_p, rtol=1e-14)
    np.testing.assert_allclose(vel[0], ref_v, rtol=1e-14)


def test_sgd_plain_and_grad_scale_and_skip():
    p, g1, _ = _setup()
    params = [p.copy()]
    kernels.sgd_update(params, [g1 * 8], None, lr=0.5, grad_scale=8.0)
    np.testing.assert_allclose(params[0], p - 0.5 * g1, rtol=1e-14)
    before = params[0].copy()
    kernels.sgd_update(params, [g1], None, lr=0.5, skip=np.asarray(1, np.int32))
    assert np.array_equal(params[0], before)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_two_steps(amsgrad):
    p, g1, g2 = _setup()
    lr, b1, b2, eps, wd = 0.01, 0.9, 0.999, 1e-7, 0.004
    params, m, v = [p.copy()], [np.zeros(3)], [np.zeros(3)]
    vhat = [np.zeros(3)] if amsgrad else None
    rp, rm, rv, rvh = p.copy(), np.zeros(3), np.zeros(3), np.zeros(3)
    for t, g in enumerate((g1, g2), start=1):
        kernels.adam_update(params, [g], m, v, lr=lr, step=np.asarray(t), beta1=b1, beta2=b2, epsilon=eps,
                        weight_decay=wd, amsgrad=amsgrad, vhat=vhat)
        rp = rp - lr * wd * rp
        rm = rm + (g - rm) * (1 - b1)
        rv = rv + (g * g - rv) * (1 - b2)
        rvh = np.maximum(rvh, rv)
        lr_t = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        rp = rp - lr_t * rm / (np.sqrt(rvh if amsgrad else rv) + eps)
    np.testing.assert_allclose(params[0], rp, rtol=1e-14)
    np.testing.assert_allclose(m[0], rm, rtol=1e-14)
    np.testing.assert_allclose(v[0], rv, rtol=1e-14)


@pytest.mark.parametrize("centered", [False, True])
@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_rmsprop_two_steps(centered, momentum):
    p, g1, g2 = _setup()
    lr, rho, eps = 0.01, 0.9, 1e-7
    params, sq = [p.copy()], [np.zeros(3)]
    mom, avg = [np.zeros(3)], [np.zeros(3)]
    rp, rs, rmom, ravg = p.copy(), np.zeros(3), np.zeros(3), np.zeros(3)
    for g in (g1, g2):
        kernels.rmsprop_update(params, [g], sq, lr=lr, rho=rho, momentum=momentum, epsilon=eps, centered=centered,
                           mom=mom, avg=avg)
        rs = rho * rs + (1 - rho) * g * g
        denom = rs
        if centered:
            ravg = rho * ravg + (1 - rho) * g
            denom = rs - ravg * ravg
        inc = lr * g / np.sqrt(denom + eps)
        if momentum:
            rmom = momentum * rmom + inc
            rp = rp - rmom
        else:
            rp = rp - inc
    np.testing.assert_allclose(params[0], rp, rtol=1e-13)
    np.testing.assert_allclose(sq[0], rs, rtol=1e-14)


def test_float16_grads_update_float32_params():
    params = [np.ones(4, np.float32)]
    kernels.sgd_update(params, [np.full(4, 0.5, np.float16)], None, lr=0.1)
    np.testing.assert_allclose(params[0], 0.95, rtol=1e-7)
    assert params[0].dtype == np.float32


def test_validation():
    p = [np.ones(3, np.float32)]
    with pytest.raises(ValueError, match=r"adam_update: m\[0\] has shape \(2,\) but params\[0\] has \(3,\)"):
        kernels.adam_update(p, [np.ones(3, np.float32)], [np.zeros(2, np.float32)], [np.zeros(3, np.float32)], lr=0.1,
                        step=1)
    with pytest.raises(ValueError, match="sgd_update: grads has 2 entries but params has 1"):
        kernels.sgd_update(p, [np.ones(3, np.float32)] * 2, None, lr=0.1)
    with pytest.raises(ValueError, match="sgd_update: momentum=0.9 needs velocities"):
        kernels.sgd_update(p, [np.ones(3, np.float32)], None, lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="adam_update: step must be >= 1"):
        kernels.adam_update(p, [np.ones(3, np.float32)], [np.zeros(3, np.float32)], [np.zeros(3, np.float32)], lr=0.1,
                        step=0)


# ----- skipped steps (dynamic loss scaling): nothing changes, and the step count stays ----------
def _bad_grads(g):
    """What an overflowed mixed-precision step hands the optimizer: inf and NaN among the values."""
    bad = g.copy()
    bad[0], bad[-1] = np.inf, np.nan
    return bad


@pytest.mark.parametrize("amsgrad", [False, True])
def test_adam_skipped_step_changes_nothing_and_the_next_uses_the_right_bias_correction(amsgrad):
    p, g1, g2 = _setup()
    lr, b1, b2, eps, wd = 0.01, 0.9, 0.999, 1e-7, 0.004
    params, m, v, vhat = [p.copy()], [np.zeros(3)], [np.zeros(3)], [np.zeros(3)]
    step = np.zeros((), np.int64)  # the count of applied updates, as Optimizer keeps it
    kw = dict(lr=lr, step=step, beta1=b1, beta2=b2, epsilon=eps, weight_decay=wd, amsgrad=amsgrad,
              vhat=vhat if amsgrad else None)
    for g, skip in ((g1, 0), (_bad_grads(g2), 1)):
        flag = np.asarray(skip, np.int32)
        before = [a.copy() for a in (params[0], m[0], v[0], vhat[0])]
        kernels.advance_step(step, skip=flag)
        kernels.adam_update(params, [g], m, v, skip=flag, **kw)
    after = (params[0], m[0], v[0], vhat[0])
    assert all(np.array_equal(a, b) for a, b in zip(after, before)), "the skipped step changed a tensor"
    assert int(step) == 1, "the skipped step advanced the step count"
    kernels.advance_step(step, skip=np.asarray(0, np.int32))
    kernels.adam_update(params, [g2], m, v, skip=np.asarray(0, np.int32), **kw)
    assert int(step) == 2
    # reference: two applied updates, t = 1 and t = 2, as if the skipped step had never been
    rp, rm, rv, rvh = p.copy(), np.zeros(3), np.zeros(3), np.zeros(3)
    for t, g in ((1, g1), (2, g2)):
        rp = rp - lr * wd * rp
        rm = rm + (g - rm) * (1 - b1)
        rv = rv + (g * g - rv) * (1 - b2)
        rvh = np.maximum(rvh, rv)
        rp = rp - lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t) * rm / (np.sqrt(rvh if amsgrad else rv) + eps)
    np.testing.assert_allclose(params[0], rp, rtol=1e-14)
    np.testing.assert_allclose(m[0], rm, rtol=1e-14)
    np.testing.assert_allclose(v[0], rv, rtol=1e-14)
    if amsgrad:
        np.testing.assert_allclose(vhat[0], rvh, rtol=1e-14)


def _update_fn(case):
    """update(params, slots, g, skip) for one optimizer configuration (slots: 3 zero-initialised lists)."""
    if case.startswith("sgd"):
        return lambda params, slots, g, skip: kernels.sgd_update(
            params, [g], slots[0], lr=0.1, momentum=0.9, nesterov=case == "sgd_nesterov", weight_decay=0.01,
            skip=skip)
    centered = case != "rmsprop"
    return lambda params, slots, g, skip: kernels.rmsprop_update(
        params, [g], slots[0], lr=0.01, momentum=0.5 if centered else 0.0, centered=centered, mom=slots[1],
        avg=slots[2], weight_decay=0.01, skip=skip)


@pytest.mark.parametrize("case", ["sgd", "sgd_nesterov", "rmsprop", "rmsprop_centered_momentum"])
def test_skipped_step_leaves_params_and_slots_of_sgd_and_rmsprop(case):
    update = _update_fn(case)
    p, g1, g2 = _setup()
    params, slots = [p.copy()], [[np.zeros(3)] for _ in range(3)]
    update(params, slots, g1, np.asarray(0, np.int32))
    before = [params[0].copy()] + [s[0].copy() for s in slots]
    assert not np.array_equal(before[0], p) and np.any(before[1] != 0)  # the first step did move them
    update(params, slots, _bad_grads(g2), np.asarray(1, np.int32))
    assert all(np.array_equal(a, b) for a, b in zip([params[0]] + [s[0] for s in slots], before))
    update(params, slots, g2, 0)
    # the same, bit for bit, as a run that never saw the skipped step
    ref, ref_slots = [p.copy()], [[np.zeros(3)] for _ in range(3)]
    for g in (g1, g2):
        update(ref, ref_slots, g, None)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip([params] + slots, [ref] + ref_slots))


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
def test_advance_step_counts_applied_updates_only(dtype):
    step = np.asarray(5, dtype)
    for skip in (None, 0, np.asarray(0, np.int32)):
        kernels.advance_step(step, skip=skip)
    assert step.dtype == dtype and int(step) == 8
    for skip in (1, np.asarray(1, np.int32), np.asarray(-1, np.int32)):  # nonzero: skipped
        kernels.advance_step(step, skip=skip)
    assert int(step) == 8
    with pytest.raises(TypeError, match="advance_step: step must be an array"):
        kernels.advance_step(3)
    with pytest.raises(TypeError, match="advance_step: step must be a one-element float32, int32 or int64"):
        kernels.advance_step(np.zeros(2, np.int64))


# ----------------------------------------------------------- pointer tables (no GPU needed)

class _Array:
    """What the CUDA table builder reads of a DeviceArray: ptr, size, dtype."""

    def __init__(self, ptr: int, size: int, dtype=np.float32) -> None:
        self.ptr, self.size, self.dtype = ptr, size, np.dtype(dtype)


class _Stream:
    def __init__(self, capturing: bool = False) -> None:
        self.device_index, self.capturing = 0, capturing

    def is_capturing(self) -> bool:
        return self.capturing


@pytest.fixture
def uploads(monkeypatch):
    """Record each table the CUDA implementation uploads (instead of uploading it)."""
    from dnnbind.cuda import array

    made = []

    def constant(host, stream=None):
        made.append(np.array(host))
        return ("device table", len(made))

    monkeypatch.setattr(array, "constant", constant)
    return made


def test_update_tables_keep_the_most_recent_and_validate():
    tables = kernels.UpdateTables(max_entries=2)
    for key in ("a", "b"):
        tables._put((key,), key)
    assert tables._get(("a",)) == "a"  # now the most recent
    tables._put(("c",), "c")
    assert len(tables) == 2 and tables._get(("b",)) is None and tables._get(("a",)) == "a"
    assert repr(tables) == "UpdateTables(2 of at most 2 tables)"
    tables.clear()
    assert len(tables) == 0 and kernels.UpdateTables().max_entries == 64
    with pytest.raises(ValueError, match="UpdateTables: max_entries must be .*, got 0"):
        kernels.UpdateTables(0)
    with pytest.raises(TypeError, match="sgd_update: tables must be a dnnbind.kernels.UpdateTables or None, got dict"):
        kernels.sgd_update([np.ones(2)], [np.ones(2)], None, lr=0.1, tables={})


def test_cuda_tables_are_kept_by_their_owner_and_keyed_by_their_content(uploads):
    from dnnbind.kernels._cuda import optim

    # the second gradient sits 4 bytes past a 16-byte boundary: that tensor takes the scalar path
    params, grads = [_Array(0x1000, 3), _Array(0x2000, 2100)], [_Array(0x3000, 3), _Array(0x4004, 2100)]
    slots = [_Array(0x5000, 3), _Array(0x6000, 2100)]
    tables = kernels.UpdateTables()
    (group, (_, _, _, entry)), = optim._prepare(params, grads, [slots], _Stream(), tables).items()
    assert optim.chunk_items(2103) == optim.MIN_CHUNK == 1024
    assert group == ("f32", "f32") and entry == (("device table", 1), 2, 4, 1024)  # 2100 items: 3 chunks
    # per tensor: param, grad, state, two unused state columns, size, first chunk, vectorised;
    # then (tensor, start) per chunk
    assert uploads[0].tolist() == [0x1000, 0x3000, 0x5000, 0, 0, 3, 0, 1, 0x2000, 0x4004, 0x6000, 0, 0, 2100, 1, 0,
                                   0, 0, 1, 0, 1, 1024, 1, 2048]
    assert len(tables) == 1
    optim._prepare(params, grads, [slots], _Stream(), tables)
    assert len(uploads) == 1  # kept: uploaded once
    # new gradient arrays at other addresses: another table (its content differs)
    optim._prepare(params, [_Array(0x7000, 3), grads[1]], [slots], _Stream(), tables)
    assert len(uploads) == 2 and uploads[1][1] == 0x7000 and len(tables) == 2


def test_cuda_tables_made_or_needed_during_a_capture_are_neither_kept_nor_reused(uploads):
    from dnnbind.kernels._cuda import optim

    params, grads = [_Array(0x1000, 5)], [_Array(0x2000, 5)]
    tables = kernels.UpdateTables()
    optim._prepare(params, grads, [None], _Stream(), tables)
    (_, (_, _, _, entry)), = optim._prepare(params, grads, [None], _Stream(capturing=True), tables).items()
    # the captured update got its own table (graph memory, dying with the step), the same content
    assert len(uploads) == 2 and entry[0] == ("device table", 2) and uploads[1].tolist() == uploads[0].tolist()
    assert len(tables) == 1 and tables._get(next(iter(tables._entries))) == (("device table", 1), 1, 1, 1024)


@pytest.mark.parametrize("total, chunk", [(0, 1024), (35_000, 1024), (524_289, 2048), (2_000_000, 4096),
                                          (25_000_000, 65536), (10**9, 65536)])
def test_chunks_spread_a_group_over_about_target_blocks(total, chunk):
    from dnnbind.kernels._cuda import optim

    assert optim.chunk_items(total) == chunk
    assert chunk % 8 == 0  # a multiple of every vector width: only a tensor's last chunk has a tail


def test_vector_flag_follows_each_arrays_alignment_for_its_vector_size():
    from dnnbind.kernels._cuda import optim

    # float16 params: 8 items a vector; an 8-byte-aligned float16 array fails, a 16-byte one passes;
    # bfloat16-sized 2-byte gradients need 16 bytes too, float64 ones 16 (two 16-byte pieces)
    assert optim._vectorisable([_Array(0x1000, 8, np.float16), None], 8)
    assert not optim._vectorisable([_Array(0x1008, 8, np.float16)], 8)
    assert optim._vectorisable([_Array(0x1010, 8, np.float64)], 8)
    # float32 params with float16 gradients: 4 items, the gradients need 8-byte alignment only
    assert optim._vectorisable([_Array(0x1000, 4), _Array(0x2008, 4, np.float16)], 4)
    assert not optim._vectorisable([_Array(0x1000, 4), _Array(0x2004, 4, np.float16)], 4)


def test_cuda_tables_without_an_owner_live_with_the_first_parameter(uploads):
    import gc

    from dnnbind.kernels._cuda import optim

    params, grads = [_Array(0x1000, 5)], [_Array(0x2000, 5)]
    optim._prepare(params, grads, [None], _Stream(), None)
    optim._prepare(params, grads, [None], _Stream(), None)
    assert len(uploads) == 1 and len(optim._tables_of_params[params[0]]) == 1
    before = len(optim._tables_of_params)
    del params
    gc.collect()
    assert len(optim._tables_of_params) == before - 1


def test_optimizers_pass_their_own_tables_through_one_prepared_update(monkeypatch):
    from dnnbind import optimizers

    checks = []
    real = kernels.optim._check_lists
    monkeypatch.setattr(kernels.optim, "_check_lists", lambda *a, **k: (checks.append(a[0]), real(*a, **k))[1])
    opt = optimizers.Adam(0.1)
    p, g = np.ones(3, np.float32), np.full(3, 0.5, np.float32)
    opt._apply_raw([p], [g])
    prepared = opt._prepared
    opt._apply_raw([p], [g.copy()])
    # the lists were checked once (the gradients each step by the prepared update's one pass)
    assert checks == ["adam_update"] and opt._prepared is prepared
    assert prepared._kw["tables"] is opt._tables and isinstance(opt._tables, kernels.UpdateTables)
    # and the result is the public op's, step for step
    q, m, v = np.ones(3, np.float32), np.zeros(3, np.float32), np.zeros(3, np.float32)
    for step in (1, 2):
        kernels.adam_update([q], [g], [m], [v], lr=0.1, step=step)
    np.testing.assert_array_equal(p, q)


