"""Optimizers vs hand-computed Keras 3 updates, schedules, lookup by name, state export."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dnnbind import optimizers
from testutil import rel_error


def run(opt, p0, grads):
    p = p0.copy()
    for g in grads:
        opt._apply_raw([p], [g.copy()])
    return p


@pytest.fixture
def data(rng):
    p0 = rng.normal(size=(5, 3)).astype(np.float32)
    grads = [rng.normal(size=(5, 3)).astype(np.float32) for _ in range(3)]
    return p0, grads


def test_sgd_momentum_nesterov_and_decay(data):
    p0, grads = data
    for momentum, nesterov, wd in [(0.0, False, None), (0.9, False, None), (0.9, True, 0.01)]:
        p, v = p0.astype(np.float64), np.zeros_like(p0, dtype=np.float64)
        lr = 0.1
        for g in grads:
            if wd:
                p = p - lr * wd * p
            if momentum:
                v = momentum * v - lr * g
                p = p + (momentum * v - lr * g if nesterov else v)
            else:
                p = p - lr * g
        got = run(optimizers.SGD(lr, momentum=momentum, nesterov=nesterov, weight_decay=wd), p0, grads)
        assert rel_error(got, p) < 1e-6, (momentum, nesterov, wd)


def adam_ref(p0, grads, lr, b1=0.9, b2=0.999, eps=1e-7, wd=0.0, amsgrad=False):
    p, m, v, vh = p0.astype(np.float64), 0.0, 0.0, 0.0
    for t, g in enumerate(grads, start=1):
        p = p - lr * wd * p
        m = m + (g - m) * (1 - b1)
        v = v + (g * g - v) * (1 - b2)
        lr_t = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        vh = np.maximum(vh, v) if amsgrad else v
        p = p - lr_t * m / (np.sqrt(vh) + eps)
    return p


def test_adam_adamw(data):
    p0, grads = data
    assert rel_error(run(optimizers.Adam(0.01), p0, grads), adam_ref(p0, grads, 0.01)) < 1e-6
    assert rel_error(run(optimizers.AdamW(0.01), p0, grads), adam_ref(p0, grads, 0.01, wd=0.004)) < 1e-6
    assert optimizers.AdamW().weight_decay == 0.004
    assert rel_error(run(optimizers.Adam(0.01, amsgrad=True), p0, grads),
                     adam_ref(p0, grads, 0.01, amsgrad=True)) < 1e-6


@pytest.mark.parametrize("centered,momentum", [(False, 0.0), (True, 0.0), (False, 0.5), (True, 0.5)])
def test_rmsprop(data, centered, momentum):
    p0, grads = data
    lr, rho, eps = 0.01, 0.9, 1e-7
    p, v, a, mom = p0.astype(np.float64), 0.0, 0.0, 0.0
    for g in grads:
        v = rho * v + (1 - rho) * g * g
        denom = v
        if centered:
            a = rho * a + (1 - rho) * g
            denom = v - a * a
        inc = lr * g / np.sqrt(denom + eps)
        if momentum:
            mom = momentum * mom + inc
            p = p - mom
        else:
            p = p - inc
    got = run(optimizers.RMSprop(lr, rho=rho, momentum=momentum, centered=centered), p0, grads)
    assert rel_error(got, p) < 1e-5


def test_defaults_and_get():
    assert optimizers.SGD().learning_rate == pytest.approx(0.01)
    a = optimizers.Adam()
    assert (a.learning_rate, a.beta_1, a.beta_2, a.epsilon) == (pytest.approx(0.001), 0.9, 0.999, 1e-7)
    r = optimizers.RMSprop()
    assert (r.rho, r.momentum, r.epsilon, r.centered) == (0.9, 0.0, 1e-7, False)
    assert isinstance(optimizers.get("adam"), optimizers.Adam)
    assert isinstance(optimizers.get("AdamW"), optimizers.AdamW)
    with pytest.raises(ValueError, match="unknown optimizer 'adamix'.*adam, adamax, adamw"):
        optimizers.get("adamix")
    cfg = optimizers.serialize(optimizers.SGD(0.3, momentum=0.5))
    clone = optimizers.get(cfg)
    assert isinstance(clone, optimizers.SGD) and clone.momentum == 0.5 and clone.learning_rate == pytest.approx(0.3)


def test_schedules():
    s = optimizers.schedules
    e = s.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    assert e(0) == pytest.approx(0.1) and e(10) == pytest.approx(0.05) and e(5) == pytest.approx(0.1 * 0.5 ** 0.5)
    assert s.ExponentialDecay(0.1, 10, 0.5, staircase=True)(15) == pytest.approx(0.05)
    c = s.CosineDecay(1.0, decay_steps=100, alpha=0.1)
    assert c(0) == pytest.approx(1.0) and c(100) == pytest.approx(0.1) and c(50) == pytest.approx(0.55)
    assert c(1000) == pytest.approx(0.1)
    w = s.CosineDecay(0.0, 10, warmup_target=1.0, warmup_steps=5)
    assert w(0) == 0.0 and w(5) == pytest.approx(1.0) and w(15) == pytest.approx(0.0, abs=1e-12)
    pc = s.PiecewiseConstantDecay([10, 20], [1.0, 0.5, 0.1])
    assert [pc(0), pc(10), pc(11), pc(20), pc(21)] == [1.0, 1.0, 0.5, 0.5, 0.1]
    with pytest.raises(ValueError, match="len\\(values\\) == len\\(boundaries\\) \\+ 1"):
        s.PiecewiseConstantDecay([1], [1.0])


def test_schedule_drives_the_update(rng):
    """With a schedule, step t uses schedule(t) (Keras: the step count before the update)."""
    p0 = rng.normal(size=(4,)).astype(np.float32)
    g = np.ones(4, np.float32)
    sched = optimizers.schedules.PiecewiseConstantDecay([0], [1.0, 0.1])
    opt = optimizers.SGD(sched)
    p = run(opt, p0, [g, g, g])
    assert rel_error(p, p0 - (1.0 + 0.1 + 0.1)) < 1e-6
    assert opt.iterations == 3 and opt.learning_rate == pytest.approx(0.1)


def test_learning_rate_setter_and_state_round_trip(data):
    p0, grads = data
    opt = optimizers.Adam(0.01)
    p = run(opt, p0, grads[:2])
    opt.learning_rate = 0.02
    state = opt.get_state()
    assert state["iterations"] == 2 and set(state) == {"iterations", "0/m", "0/v"}
    clone = optimizers.Adam(0.02)
    clone.set_state(state, [p.copy()])
    a, b = p.copy(), p.copy()
    opt._apply_raw([a], [grads[2]])
    clone._apply_raw([b], [grads[2]])
    assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="learning_rate must be a finite number"):
        optimizers.SGD(float("nan"))


# ----- gradient clipping (Keras 3: clipnorm, global_clipnorm, clipvalue) -------------------------
def keras_clip_by_norm(g, clip):
    """keras.optimizers.Optimizer._clip_by_norm, written out: g * clip / max(||g||, clip)."""
    norm = np.sqrt(np.sum(np.square(g, dtype=np.float64)))
    return g.astype(np.float64) * clip / max(norm, clip)


def keras_clip_by_global_norm(gs, clip):
    """keras.optimizers.clip_by_global_norm: scale = clip * min(1 / norm, 1 / clip)."""
    norm = np.sqrt(sum(np.sum(np.square(g, dtype=np.float64)) for g in gs))
    scale = clip * min(1.0 / norm, 1.0 / clip)
    return [g.astype(np.float64) * scale for g in gs]


@pytest.fixture
def two_tensors(rng):
    """A large-norm gradient (clipped) and a small one (below every threshold used)."""
    p0 = [rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(5,)).astype(np.float32)]
    grads = [rng.normal(size=(4, 3)).astype(np.float32) * 3.0, rng.uniform(-0.1, 0.1, size=(5,)).astype(np.float32)]
    return p0, grads


def sgd_once(p0, grads, **clip):
    """The gradient SGD(lr=1) applied; float64 parameters, so the difference is exact enough."""
    ps = [p.astype(np.float64) for p in p0]
    optimizers.SGD(1.0, **clip)._apply_raw(ps, [g.copy() for g in grads])
    return [p0_i.astype(np.float64) - p for p0_i, p in zip(p0, ps)]


def test_clipnorm_rescales_each_tensor_above_the_norm(two_tensors):
    p0, grads = two_tensors
    norms = [float(np.linalg.norm(g)) for g in grads]
    assert norms[0] > 1.0 > norms[1]
    applied = sgd_once(p0, grads, clipnorm=1.0)
    assert rel_error(applied[0], keras_clip_by_norm(grads[0], 1.0)) < 1e-6
    assert abs(np.linalg.norm(applied[0]) - 1.0) < 1e-6
    assert rel_error(applied[1], grads[1]) < 1e-6  # below the norm: unchanged


def test_global_clipnorm_rescales_all_tensors_together(two_tensors):
    p0, grads = two_tensors
    applied = sgd_once(p0, grads, global_clipnorm=0.5)
    expected = keras_clip_by_global_norm(grads, 0.5)
    for a, e in zip(applied, expected):
        assert rel_error(a, e) < 1e-6
    assert abs(np.sqrt(sum(np.sum(a * a) for a in applied)) - 0.5) < 1e-6
    # a threshold above the global norm changes nothing
    for a, g in zip(sgd_once(p0, grads, global_clipnorm=100.0), grads):
        assert rel_error(a, g) < 1e-6


def test_clipvalue_clamps_elements(two_tensors):
    p0, grads = two_tensors
    applied = sgd_once(p0, grads, clipvalue=0.75)
    for a, g in zip(applied, grads):
        assert rel_error(a, np.clip(g, -0.75, 0.75)) < 1e-6
    assert np.max(np.abs(applied[0])) == pytest.approx(0.75, rel=1e-6) and np.max(np.abs(grads[0])) > 2


def test_clipnorm_takes_precedence_over_clipvalue_as_keras(two_tensors):
    p0, grads = two_tensors
    applied = sgd_once(p0, grads, clipnorm=1.0, clipvalue=1e-3)
    assert rel_error(applied[0], keras_clip_by_norm(grads[0], 1.0)) < 1e-6
    assert rel_error(applied[1], grads[1]) < 1e-6


def test_clipping_acts_on_unscaled_gradients_and_adam(two_tensors):
    """Loss scaling divides first (Keras's LossScaleOptimizer), then the clip; Adam sees the result."""
    p0, grads = two_tensors
    clipped = keras_clip_by_global_norm(grads, 0.5)
    opt = optimizers.Adam(0.01, global_clipnorm=0.5)
    ps = [p.copy() for p in p0]
    for _ in range(3):
        opt._apply_raw(ps, [g * np.float32(1024.0) for g in grads], grad_scale=1024.0)
    for i in range(2):
        expected = adam_ref(p0[i], [clipped[i]] * 3, 0.01)
        assert rel_error(ps[i], expected) < 1e-5


def test_clipping_non_finite_gradients_as_keras(two_tensors):
    p0, grads = two_tensors
    bad = [g.copy() for g in grads]
    bad[1][0] = np.inf
    # global: a non-finite norm makes every applied gradient NaN (clip_by_global_norm)
    assert all(np.isnan(a).all() for a in sgd_once(p0, bad, global_clipnorm=1.0))
    # per tensor: only the tensor holding inf is affected (its finite entries become 0, inf -> NaN)
    applied = sgd_once(p0, bad, clipnorm=1.0)
    assert rel_error(applied[0], keras_clip_by_norm(grads[0], 1.0)) < 1e-6
    assert np.isnan(applied[1][0]) and np.all(applied[1][1:] == 0)
    # clipvalue keeps NaN as NaN and clamps inf
    bad[1][1] = np.nan
    applied = sgd_once(p0, bad, clipvalue=0.5)
    assert applied[1][0] == pytest.approx(0.5) and np.isnan(applied[1][1])


def test_clip_arguments_are_checked_and_configured():
    with pytest.raises(ValueError, match="SGD: only one of clipnorm and global_clipnorm can be set"):
        optimizers.SGD(clipnorm=1.0, global_clipnorm=1.0)
    with pytest.raises(ValueError, match="Adam: clipvalue must be > 0, got -1"):
        optimizers.Adam(clipvalue=-1)
    with pytest.raises(ValueError, match="RMSprop: clipnorm must be a finite number"):
        optimizers.RMSprop(clipnorm=float("inf"))
    with pytest.raises(TypeError, match="SGD: global_clipnorm must be a number, got '1'"):
        optimizers.SGD(global_clipnorm="1")
    opt = optimizers.AdamW(clipnorm=2.0, clipvalue=0.5)
    cfg = optimizers.serialize(opt)["config"]
    assert (cfg["clipnorm"], cfg["global_clipnorm"], cfg["clipvalue"]) == (2.0, None, 0.5)
    clone = optimizers.get(optimizers.serialize(opt))
    assert (clone.clipnorm, clone.global_clipnorm, clone.clipvalue) == (2.0, None, 0.5)
    # setting a value re-captures a graphed step (it is baked in) and a refused one changes nothing
    version = opt._state_version
    opt.clipnorm = 3.0
    assert opt.clipnorm == 3.0 and opt._state_version == version + 1
    with pytest.raises(ValueError, match="only one of clipnorm and global_clipnorm"):
        opt.global_clipnorm = 1.0
    assert opt.global_clipnorm is None and opt._state_version == version + 1


def test_kernels_clip_arguments_are_checked(rng):
    from dnnbind import kernels

    p, g = [rng.normal(size=3)], [rng.normal(size=3)]
    with pytest.raises(ValueError, match="sgd_update: only one of clipnorm and global_clipnorm"):
        kernels.sgd_update(p, g, None, lr=0.1, clipnorm=1.0, global_clipnorm=2.0)
    with pytest.raises(ValueError, match="adam_update: clipnorm must be > 0, got 0"):
        kernels.adam_update(p, g, [np.zeros(3)], [np.zeros(3)], lr=0.1, step=1, clipnorm=0.0)
    before = p[0].copy()
    with pytest.raises(ValueError, match="rmsprop_update: clipvalue must be a finite number"):
        kernels.rmsprop_update(p, g, [np.zeros(3)], lr=0.1, clipvalue=float("nan"))
    assert np.array_equal(p[0], before)


def _clip_model(device):
    import dnnbind as keras
    from dnnbind import layers

    keras.set_default_device(device)
    try:
        init = keras.initializers.GlorotUniform
        model = keras.Sequential([layers.Dense(5, activation="relu", kernel_initializer=init(0)),
                                  layers.Dense(3, activation="softmax", kernel_initializer=init(1))])
        model.build((None, 6))
        model.compile(optimizers.SGD(1.0, global_clipnorm=1e-2), "sparse_categorical_crossentropy")
    finally:
        keras.set_default_device(None)
    return model


def _global_step_norms(model, x, y, steps):
    norms = []
    for _ in range(steps):
        before = model.get_weights()
        model.train_on_batch(x, y)
        norms.append(math.sqrt(sum(float(np.sum((a.astype(np.float64) - b) ** 2))
                                   for a, b in zip(model.get_weights(), before))))
    return norms


def test_global_clipnorm_bounds_each_training_step_numpy(rng):
    """lr 1, no momentum: every step moves the weights by exactly the clip norm (the raw gradient is larger)."""
    x, y = rng.normal(size=(16, 6)).astype(np.float32), rng.integers(0, 3, 16)
    norms = _global_step_norms(_clip_model("cpu"), x, y, 3)
    assert norms == pytest.approx([1e-2] * 3, rel=1e-4)


# ----- the same on CUDA (fused kernels, device-side norms), against the NumPy reference ----------
GPU_SHAPES = [(3, 5), (70001,), (1,), (4, 4, 3, 3)]  # one tensor spans several chunks


def _poison_pool(nbytes=1 << 20):
    """Fill memory the stream-ordered pool is about to hand out again with NaN, so scratch the
    clipping kernels failed to write would show up as NaN in the result."""
    from gpu_errlog import dev

    junk = dev(np.full(nbytes // 8, np.nan))
    del junk


def _gpu_case(rng, param_dtype, grad_dtypes, scale):
    ps = [(rng.uniform(-1, 1, size=s)).astype(param_dtype) for s in GPU_SHAPES]
    # per-tensor magnitudes differ, so a threshold clips some tensors and not others
    gs = [(rng.uniform(-1, 1, size=s) * mag * scale).astype(gd)
          for s, mag, gd in zip(GPU_SHAPES, (4.0, 0.002, 0.5, 1.0), grad_dtypes)]
    return ps, gs


def _thresholds(gs, scale):
    norms = [float(np.linalg.norm(g.astype(np.float64))) / scale for g in gs]
    return {"clipnorm": float(np.median(norms)), "global_clipnorm": 0.5 * float(np.linalg.norm(norms)),
            "clipvalue": 0.375}


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["sgd", "adam", "rmsprop"])
@pytest.mark.parametrize("clip", ["clipnorm", "global_clipnorm", "clipvalue"])
@pytest.mark.parametrize("param_dtype, grad_dtypes, label", [
    pytest.param(np.float32, (np.float32,) * 4, "float32", id="f32"),
    # two dtype groups in one call: the global norm must span both
    pytest.param(np.float32, (np.float32, np.float16, np.float32, "bfloat16"), "float32", id="f32-f16-bf16"),
    pytest.param(np.float64, (np.float64,) * 4, "float64", id="f64"),
])
def test_clipping_gpu_matches_numpy(rng, kind, clip, param_dtype, grad_dtypes, label):
    import ml_dtypes

    from dnnbind import kernels
    from gpu_errlog import check, dev

    grad_dtypes = [ml_dtypes.bfloat16 if d == "bfloat16" else d for d in grad_dtypes]
    scale = 4.0
    ps, gs = _gpu_case(rng, param_dtype, grad_dtypes, scale)
    kwargs = {clip: _thresholds(gs, scale)[clip]}
    zeros = lambda: [np.zeros(s, param_dtype) for s in GPU_SHAPES]  # noqa: E731
    host_state = [zeros(), zeros(), zeros()]
    dps, dgs = [dev(p) for p in ps], [dev(g) for g in gs]
    dev_state = [[dev(a) for a in st] for st in host_state]
    gs_dev = dev(np.asarray(scale, np.float32))

    # hyper-parameters exact in float32: the kernels take lr, momentum, rho, epsilon and clipvalue
    # as float32, so a float64 comparison at 1e-10 must not see their rounding
    eps = 2.0 ** -23

    def update(params, grads, state, grad_scale):
        if kind == "sgd":
            kernels.sgd_update(params, grads, state[0], lr=2.0 ** -4, momentum=0.5, grad_scale=grad_scale, **kwargs)
        elif kind == "adam":
            kernels.adam_update(params, grads, state[0], state[1], lr=2.0 ** -7, step=step, epsilon=eps, amsgrad=True,
                            vhat=state[2], grad_scale=grad_scale, **kwargs)
        else:
            kernels.rmsprop_update(params, grads, state[0], lr=2.0 ** -7, rho=0.75, momentum=0.5, epsilon=eps,
                               centered=True, mom=state[1], avg=state[2], grad_scale=grad_scale, **kwargs)

    for step in (1, 2, 3):
        update(ps, [g.astype(np.float64) if param_dtype == np.float64 else g for g in gs], host_state, scale)
        _poison_pool()
        update(dps, dgs, dev_state, gs_dev)
    tol = 1e-10 if label == "float64" else 1e-5
    used = {"sgd": 1, "adam": 3, "rmsprop": 3}[kind]
    for i in range(len(GPU_SHAPES)):
        check(f"{kind}_update[{clip}]", label, dps[i], ps[i], f"params[{i}] grads {np.dtype(gs[i].dtype)}", tol=tol)
        for k in range(used):
            check(f"{kind}_update[{clip}]", label, dev_state[k][i], host_state[k][i], f"state{k}[{i}]", tol=tol)


@pytest.mark.gpu
def test_clipping_gpu_is_captured_and_replays_like_eager(rng):
    """Global norm and per-tensor factors computed inside a CUDA graph: replay = eager = NumPy,
    and the capture leaves no allocation behind (the scratch dies inside it)."""
    from dnnbind import cuda, kernels
    from gpu_errlog import check, host

    ps, gs = _gpu_case(rng, np.float32, (np.float32,) * 4, 1.0)
    stream = cuda.Stream()
    put = lambda a: cuda.to_device(np.asarray(a), stream=stream)  # noqa: E731
    for clip in ({"global_clipnorm": 0.7}, {"clipnorm": 0.3}):
        eager, graphed = [put(p) for p in ps], [put(p) for p in ps]
        grads = [put(g) for g in gs]
        lr, scale = put(np.asarray(0.1, np.float32)), put(np.asarray(2.0, np.float32))
        run = lambda params: kernels.sgd_update(params, grads, None, lr=lr, grad_scale=scale,  # noqa: E731
                                            stream=stream, **clip)
        run(graphed)  # warm-up: kernels compiled, pointer table uploaded
        for p, h in zip(graphed, ps):
            p.copy_from_host(h, stream=stream)
        stream.synchronize()
        with cuda.capture(stream) as graph:
            run(graphed)
        assert list(graph.outstanding_allocations) == []
        reference = [p.astype(np.float64) for p in ps]
        for _ in range(3):
            run(eager)
            graph.launch(stream)
            kernels.sgd_update(reference, [g.astype(np.float64) for g in gs], None, lr=float(np.float32(0.1)),
                           grad_scale=2.0, **clip)
        stream.synchronize()
        for i, (a, b, r) in enumerate(zip(graphed, eager, reference)):
            assert np.array_equal(host(a), host(b)), f"{clip} params[{i}]: replay differs from eager"
            check("sgd_update[captured clip]", "float32", a, r, f"{clip} params[{i}]", tol=1e-5)
        graph.close()


@pytest.mark.gpu
def test_clipping_gpu_skip_flag_changes_nothing(rng):
    from dnnbind import kernels
    from gpu_errlog import dev, host

    ps, gs = _gpu_case(rng, np.float32, (np.float32,) * 4, 1.0)
    dps, dgs = [dev(p) for p in ps], [dev(g) for g in gs]
    dm, dv = [dev(np.zeros_like(p)) for p in ps], [dev(np.zeros_like(p)) for p in ps]
    kernels.adam_update(dps, dgs, dm, dv, lr=0.1, step=1, global_clipnorm=0.1, skip=dev(np.asarray(1, np.int32)))
    for p, d, m in zip(ps, dps, dm):
        assert np.array_equal(host(d), p.astype(np.float64)) and not np.any(host(m))


@pytest.mark.gpu
def test_global_clipnorm_bounds_each_graphed_training_step_cuda(rng, recwarn):
    x, y = rng.normal(size=(16, 6)).astype(np.float32), rng.integers(0, 3, 16)
    model = _clip_model("cuda")
    assert model.device.is_cuda
    norms = _global_step_norms(model, x, y, 4)  # eager, captured, replayed, replayed
    assert norms == pytest.approx([1e-2] * 4, rel=1e-4)
    assert not [w for w in recwarn if "could not be captured" in str(w.message)]
