"""Train/test/predict steps as CUDA graphs (``compile(jit_compile=...)``).

CPU part: the bookkeeping (keys, warm-up -> capture -> replay, host counters, learning-rate uploads
before the launch, invalidation, LRU bound, capture failures) runs on the NumPy backend through a
fake graph backend with CUDA's semantics: a capture runs the step's Python but leaves the arrays
as they were; a launch changes the arrays but no host-side Python state. Results must then be
bit-identical to eager training.

GPU part (``@pytest.mark.gpu``): real graphs against eager steps on the same device.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import dnnbind
import dnnbind as keras
from dnnbind import layers, mixed_precision, kernels
from dnnbind.trainers.step_graphs import StepGraphs, step_key
from testutil import rel_error


# ============================================================================ fake graph backend
class FakeCaptureError(RuntimeError):
    pass


class FakeGraph:
    def __init__(self, fn):
        self.fn = fn
        self.closed = False
        self.launches = 0

    def close(self):
        self.closed = True


def _device_state(model) -> list:
    """Every persistent array a step writes (gathered independently of the model's own _graph_refs)."""
    arrays = [w.value for layer in model.layers for w in layer._weights]
    opt = model.optimizer
    if opt is not None and opt.built:
        arrays += [opt._lr_array, opt._step_array] + [a for slots in opt._slots for a in slots.values()]
    for m in model._all_metrics():
        for holder in (m, getattr(m, "_impl", None)):
            if holder is not None and holder._total is not None:
                arrays.append(holder._total)
    return arrays


def _host_state(model) -> list:
    pairs = []
    for m in model._all_metrics():
        pairs.append((m, "_count"))
        if getattr(m, "_impl", None) is not None:
            pairs.append((m._impl, "_count"))
    if model.optimizer is not None:
        pairs += [(model.optimizer, "_iterations"), (model.optimizer, "_unconfirmed"),
                  (model.optimizer, "_lr_uploaded")]
    return [(obj, attr, getattr(obj, attr)) for obj, attr in pairs]


class FakeBackend:
    """CUDA graph semantics on NumPy arrays (see the module docstring)."""

    def __init__(self, model, fail=None, grow_scratch=0):
        self.model = model
        self.fail = fail
        self.grow_scratch = grow_scratch  # captures during which the "workspace" is replaced
        self.scratch_obj = object()
        self.released = 0
        self.graphs: list[FakeGraph] = []
        self.launches = 0
        self.copies = 0
        self.trims = 0

    def available(self, device):
        return True

    def current_stream(self):
        return "stream-0"

    def stream_key(self, stream):
        return stream

    def capture(self, stream, fn):
        if self.fail is not None:
            # a real capture can fail half-way: the Python has advanced some host counters
            self.model.optimizer._iterations += 1
            self.model._loss_tracker._count += 3
            raise self.fail
        opt = self.model.optimizer
        uploaded = None if opt is None else opt._lr_uploaded
        iterations = None if opt is None else opt._iterations
        saved = [a.copy() for a in _device_state(self.model)]
        host_before = _host_state(self.model)
        fn()
        trains = opt is not None and opt._iterations != iterations
        assert opt is None or opt._lr_uploaded == uploaded, "the captured step uploaded the learning rate"
        for a, before in zip(_device_state(self.model), saved):  # capturing does no device work
            np.copyto(a, before)
        if self.grow_scratch:
            self.grow_scratch -= 1
            self.scratch_obj = object()
        graph = FakeGraph(fn)
        graph.trains = trains
        graph.host_before = host_before
        graph.just_captured = True  # its first launch runs the step whose Python the capture already ran
        self.graphs.append(graph)
        return graph

    def launch(self, graph, stream):
        assert not graph.closed, "a closed graph was launched"
        opt = self.model.optimizer
        if graph.trains and not graph.just_captured:
            # the model must upload a changed learning rate before the launch, never inside it
            assert opt._lr_uploaded == opt.learning_rate, "learning rate not uploaded before the launch"
        host = _host_state(self.model)
        if graph.just_captured:
            # the device work of the first launch is the step as it was captured: its Python (the
            # learning rate it compared, the counters) saw the host state from before the capture
            for obj, attr, value in graph.host_before:
                setattr(obj, attr, value)
        graph.fn()
        for obj, attr, value in host:  # a replay runs device work only
            setattr(obj, attr, value)
        graph.just_captured = False
        graph.launches += 1
        self.launches += 1

    def empty(self, shape, dtype, stream):
        dtype = np.dtype(dtype)
        return np.full(shape, np.nan if dtype.kind == "f" else -1, dtype)  # poisoned

    def copy(self, dst, src, stream):
        self.copies += 1
        np.copyto(dst, src)

    def copy_out(self, src, stream):
        return np.array(src, copy=True)

    def synchronize(self, stream):
        pass

    def trim(self, stream):
        self.trims += 1

    def scratch(self, stream):
        return self.scratch_obj

    def release_scratch(self):
        self.released += 1


def blobs(n=72, d=6, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 3, size=(classes, d))
    y = rng.integers(0, classes, size=n)
    x = (centers[y] + rng.normal(size=(n, d))).astype(np.float32)
    return x, y


def mlp(seed=0, batchnorm=True):
    init = keras.initializers.GlorotUniform
    return keras.Sequential([
        keras.Input((6,)),
        layers.Dense(12, activation="relu", kernel_initializer=init(seed)),
        *([layers.BatchNormalization()] if batchnorm else []),
        layers.Dropout(0.0),
        layers.Dense(3, activation="softmax", kernel_initializer=init(seed + 1)),
    ])


def pair(optimizer_factory, metrics=("accuracy",), **fake):
    """(graphed, eager): same weights, same optimizer settings; the first runs through a FakeBackend."""
    graphed, eager = mlp(), mlp()
    eager.set_weights(graphed.get_weights())
    graphed.compile(optimizer_factory(), "sparse_categorical_crossentropy", metrics=list(metrics))
    eager.compile(optimizer_factory(), "sparse_categorical_crossentropy", metrics=list(metrics), jit_compile=False)
    graphed._step_graphs = StepGraphs(FakeBackend(graphed, **fake))
    return graphed, eager


def assert_same(a, b):
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        assert np.array_equal(wa, wb)
    assert a.optimizer.iterations == b.optimizer.iterations
    for ma, mb in zip(a._all_metrics(), b._all_metrics()):
        assert ma.result() == mb.result() and ma.name == mb.name


# ================================================================================ CPU: arguments
def test_jit_compile_argument_on_numpy(cpu):
    x, y = blobs(32)
    model = mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.compile("sgd", "sparse_categorical_crossentropy")  # "auto": accepted, silent
        model.compile("sgd", "sparse_categorical_crossentropy", jit_compile=False)
    assert model.jit_compile is False
    with pytest.warns(UserWarning, match="jit_compile=True has no effect") as record:
        model.compile("sgd", "sparse_categorical_crossentropy", jit_compile=True)
    assert len(record) == 1 and model.jit_compile is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no further warning per step
        model.fit(x, y, batch_size=8, epochs=2, verbose=0)
        model.predict(x, verbose=0)
    assert len(model._step_graphs) == 0 and model._step_graphs.stats["warmups"] == 0
    for bad in ("yes", 1, None, "AUTO"):
        with pytest.raises(ValueError, match="jit_compile must be 'auto', True or False"):
            model.compile("sgd", "sparse_categorical_crossentropy", jit_compile=bad)
    with pytest.warns(UserWarning, match="run_eagerly=True and jit_compile=True"):
        model.compile("sgd", "sparse_categorical_crossentropy", run_eagerly=True, jit_compile=True)
    assert model.jit_compile is False and model.run_eagerly
    with pytest.raises(ValueError):
        model.jit_compile = "sometimes"


def test_step_key_separates_what_changes_the_captured_work():
    f32, i32 = np.dtype(np.float32), np.dtype(np.int32)
    base = step_key("train", 7, (16, 6), f32, (16,), i32)
    assert base == step_key("train", 7, [16, 6], f32, [16], i32)
    others = [step_key("test", 7, (16, 6), f32, (16,), i32), step_key("train", 8, (16, 6), f32, (16,), i32),
              step_key("train", 7, (8, 6), f32, (8,), i32), step_key("train", 7, (16, 6), np.dtype(np.float16),
                                                                   (16,), i32),
              step_key("train", 7, (16, 6), f32, (16, 3), f32), step_key("predict", 7, (16, 6), f32, None, None)]
    assert len({base, *others}) == len(others) + 1
    with kernels.config.override(allow_tf32=not kernels.config.allow_tf32):
        assert step_key("train", 7, (16, 6), f32, (16,), i32) != base
    with kernels.config.override(deterministic=not kernels.config.deterministic):
        assert step_key("train", 7, (16, 6), f32, (16,), i32) != base
    with kernels.config.override(benchmark=not kernels.config.benchmark):
        assert step_key("train", 7, (16, 6), f32, (16,), i32) != base
    with kernels.config.override(workspace_limit=1 << 20):
        assert step_key("train", 7, (16, 6), f32, (16,), i32) != base
    with pytest.raises(ValueError):
        StepGraphs(max_graphs=0)


# ============================================================ CPU: replays equal eager training
@pytest.mark.parametrize("opt", ["sgd_momentum", "adam_schedule"])
def test_fake_graph_fit_evaluate_predict_match_eager_exactly(cpu, opt):
    factory = {
        "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
        "adam_schedule": lambda: keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.01, 3, 0.5)),
    }[opt]
    x, y = blobs(72)  # batch 16: 4 full batches and a last one of 8 per epoch
    xv, yv = blobs(32, seed=1)
    graphed, eager = pair(factory)
    hg = graphed.fit(x, y, batch_size=16, epochs=3, validation_data=(xv, yv), verbose=0, seed=5)
    he = eager.fit(x, y, batch_size=16, epochs=3, validation_data=(xv, yv), verbose=0, seed=5)
    assert hg.history == he.history
    assert_same(graphed, eager)
    g = graphed._step_graphs
    # train: epoch 1 step 1 warms up, step 2 captures, the other 10 full batches replay; the batches of 8
    # run eagerly outside the cache. test: 2 batches of 16 per epoch -> warm-up, capture, 4 replays.
    assert g.stats["warmups"] == 2 and g.stats["captures"] == 2 and g.stats["replays"] == 10 + 4
    assert g.stats["failures"] == 0 and g.stats["clears"] == 0
    assert sorted(k[0] for k in g.keys()) == ["test", "train"] and g.graph_count == 2
    assert graphed.evaluate(xv, yv, verbose=0, return_dict=True) == eager.evaluate(xv, yv, verbose=0,
                                                                                   return_dict=True)
    pg, pe = graphed.predict(x, batch_size=16, verbose=0), eager.predict(x, batch_size=16, verbose=0)
    assert np.array_equal(pg, pe)  # every batch kept its own output (copied out of the static buffer)
    for xb in (x[:16], x[16:32], x[32:48]):
        assert np.array_equal(graphed.predict_on_batch(xb), eager.predict_on_batch(xb))
    for _ in range(3):
        a = graphed.train_on_batch(x[:16], y[:16], return_dict=True)
        b = eager.train_on_batch(x[:16], y[:16], return_dict=True)
        assert dict(a) == dict(b)
        assert graphed.test_on_batch(xv[:16], yv[:16]) == eager.test_on_batch(xv[:16], yv[:16])
    assert_same(graphed, eager)
    assert {k[0] for k, s in g.states().items() if s == "captured"} == {"train", "test", "predict"}


def test_learning_rate_changes_are_uploaded_before_each_launch(cpu):
    x, y = blobs(64)
    graphed, eager = pair(lambda: keras.optimizers.SGD(0.1, momentum=0.5))
    sched = keras.callbacks.LearningRateScheduler(lambda epoch: 0.1 / (epoch + 1))
    hg = graphed.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[sched], shuffle=False)
    he = eager.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[sched], shuffle=False)
    assert hg.history == he.history and hg.history["learning_rate"] == [0.1, 0.05, 0.1 / 3]
    graphed.optimizer.learning_rate = 0.01  # between steps, as a callback would
    eager.optimizer.learning_rate = 0.01
    graphed.train_on_batch(x[:16], y[:16])
    eager.train_on_batch(x[:16], y[:16])
    assert_same(graphed, eager)
    assert graphed._step_graphs.stats["replays"] >= 10


# ====================================================================== CPU: invalidation
def _warm(model, x, y, steps=3):
    for _ in range(steps):
        model.train_on_batch(x[:16], y[:16])


def test_weights_written_in_place_keep_the_graphs(cpu, tmp_path):
    x, y = blobs(32)
    graphed, eager = pair(lambda: keras.optimizers.Adam(0.01))
    _warm(graphed, x, y)
    _warm(eager, x, y)
    g = graphed._step_graphs
    assert g.graph_count == 1
    fresh = mlp(seed=9).get_weights()
    graphed.set_weights(fresh)
    eager.set_weights(fresh)
    replays = g.stats["replays"]
    graphed.train_on_batch(x[:16], y[:16])
    eager.train_on_batch(x[:16], y[:16])
    assert g.stats["replays"] == replays + 1 and g.stats["clears"] == 0
    assert_same(graphed, eager)
    for m in (graphed, eager):
        m.save_weights(tmp_path / f"{m.name}.safetensors")
        m.train_on_batch(x[:16], y[:16])
        m.load_weights(tmp_path / f"{m.name}.safetensors")
        m.train_on_batch(x[:16], y[:16])
    assert g.stats["replays"] == replays + 3 and g.stats["clears"] == 0
    assert_same(graphed, eager)


@pytest.mark.parametrize("trigger", ["layer_trainable", "model_trainable", "optimizer_set_state", "dtype_policy",
                                     "optimizer_replaced"])
def test_state_changes_drop_the_graphs_before_the_next_step(cpu, trigger):
    x, y = blobs(32)
    graphed, eager = pair(lambda: keras.optimizers.SGD(0.05, momentum=0.9))
    _warm(graphed, x, y)
    _warm(eager, x, y)
    g = graphed._step_graphs
    closed_before = [gr for gr in g.backend.graphs if not gr.closed]
    assert g.graph_count == 1 and closed_before
    for m in (graphed, eager):
        if trigger == "layer_trainable":
            m.layers[0].trainable = False
        elif trigger == "model_trainable":
            m.trainable = False
        elif trigger == "optimizer_set_state":
            params = [w.value for w in m.trainable_weights]
            m.optimizer.set_state(m.optimizer.get_state(), params)
        elif trigger == "dtype_policy":
            m.layers[0].dtype_policy = mixed_precision.Policy("mixed_bfloat16")  # float32 math on NumPy
        else:
            m.optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    graphed.train_on_batch(x[:16], y[:16])
    assert g.stats["clears"] == 1 and all(gr.closed for gr in closed_before)
    eager.train_on_batch(x[:16], y[:16])
    _warm(graphed, x, y)  # warm-up and capture again, then replay
    _warm(eager, x, y)
    assert g.graph_count == 1 and g.stats["captures"] == 2
    assert_same(graphed, eager)


@pytest.mark.parametrize("trigger", ["compile", "to", "jit_off", "build"])
def test_explicit_invalidation_closes_graphs_at_once(cpu, trigger):
    x, y = blobs(32)
    graphed, _ = pair(lambda: keras.optimizers.SGD(0.05))
    _warm(graphed, x, y)
    g = graphed._step_graphs
    assert g.graph_count == 1
    graph = g.backend.graphs[-1]
    if trigger == "compile":
        graphed.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy")
    elif trigger == "to":
        graphed.to("cpu")
    elif trigger == "jit_off":
        graphed.jit_compile = False
    else:
        graphed.build((6,))
    assert len(g) == 0 and graph.closed and g.graph_count == 0 and g.backend.trims == 1
    graphed.train_on_batch(x[:16], y[:16])
    assert len(g) == (0 if trigger == "jit_off" else 1)


def test_lru_keeps_at_most_max_graphs_and_closes_evicted_ones(cpu):
    x, y = blobs(64)
    graphed, eager = pair(lambda: keras.optimizers.SGD(0.05))
    graphed._step_graphs = g = StepGraphs(FakeBackend(graphed), max_graphs=3)
    for _ in range(3):
        for n in (4, 5, 6, 7):
            graphed.train_on_batch(x[:n], y[:n])
            eager.train_on_batch(x[:n], y[:n])
            assert len(g) <= 3
    assert g.stats["evictions"] >= 3
    live = {id(e.graph) for e in g._entries.values() if e.graph is not None}
    assert all(gr.closed for gr in g.backend.graphs if id(gr) not in live)
    assert_same(graphed, eager)  # cycling through more shapes than the cache holds stays correct


def test_a_switch_registered_during_the_warm_up_keys_the_entry_as_the_next_call_does(cpu):
    """An op module registers its switches when first imported, which can happen inside the first step:
    the warm-up's entry is re-keyed, so the second call captures instead of warming up again."""
    x, y = blobs(32)
    graphed, eager = pair(lambda: keras.optimizers.SGD(0.05))
    g = graphed._step_graphs
    owner = "tests.test_graph_step.late_module"
    real_step = graphed._eager_step

    def step_that_imports_a_module(kind, xb, yb):
        kernels.config.register_switches(owner, lambda: (True,))
        return real_step(kind, xb, yb)

    graphed._eager_step = step_that_imports_a_module
    try:
        for _ in range(3):
            graphed.train_on_batch(x, y)
            eager.train_on_batch(x, y)
        assert (g.stats["warmups"], g.stats["captures"], g.stats["replays"]) == (1, 1, 1)
        assert len(g) == 1 and any(owner in str(k) for k in g.keys())
    finally:
        kernels.config._switches.pop(owner, None)
    assert_same(graphed, eager)


# ================================================================== CPU: capture failures
def test_capture_failure_falls_back_to_eager_with_one_warning(cpu):
    x, y = blobs(32)
    graphed, eager = pair(lambda: keras.optimizers.Adam(0.01), fail=FakeCaptureError("boom"))
    graphed.train_on_batch(x[:16], y[:16])
    eager.train_on_batch(x[:16], y[:16])
    with pytest.warns(RuntimeWarning, match=r"train step could not be captured.*FakeCaptureError: boom"):
        graphed.train_on_batch(x[:16], y[:16])
    eager.train_on_batch(x[:16], y[:16])
    assert_same(graphed, eager)  # the counters the failed capture advanced were put back
    g = graphed._step_graphs
    assert list(g.states().values()) == ["eager"] and g.stats["failures"] == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            graphed.train_on_batch(x[:16], y[:16])
            eager.train_on_batch(x[:16], y[:16])
    assert_same(graphed, eager)
    assert g.stats["failures"] == 1 and g.backend.launches == 0


def test_workspace_growing_during_capture_discards_that_capture(cpu):
    x, y = blobs(32)
    graphed, eager = pair(lambda: keras.optimizers.SGD(0.05, momentum=0.9), grow_scratch=1)
    for _ in range(4):
        graphed.train_on_batch(x[:16], y[:16])
        eager.train_on_batch(x[:16], y[:16])
    g = graphed._step_graphs
    assert g.backend.released == 1 and g.backend.graphs[0].closed
    assert g.stats["captures"] == 1 and g.stats["replays"] == 1  # warm-up, discarded capture, capture, replay
    assert_same(graphed, eager)


def test_signature_check_reads_only_identities_and_flags(cpu):
    """The per-step staleness check runs before every graph step, so it must stay cheap: it may read
    flags, dtype policies and identities, never array contents, shapes or device state. Every weight
    is swapped for an object that raises on any use but ``id()``; the signature must still build,
    and a swapped weight must change it."""

    class Opaque:
        def __getattribute__(self, name):
            raise AssertionError(f"_graph_signature read {name!r} of a weight array")

    model = keras.Sequential([keras.Input((8,)), *[layers.Dense(8) for _ in range(20)]])
    model.compile("adam", "mse")
    before = model._graph_signature()
    weights = [w for layer in model._flat_layers() for w in layer._weights]
    saved = [w.value for w in weights]
    try:
        for w in weights:
            w.value = Opaque()
        during = model._graph_signature()
    finally:
        for w, v in zip(weights, saved):
            w.value = v
    assert during != before and model._graph_signature() == before
    assert [id(w.value) for w in weights] == list(before[-1])


# ==================================================================================== GPU
def gpu_model(seed=0, dropout=0.0, weights=None):
    dnnbind.set_default_device("cuda")
    init = keras.initializers.GlorotUniform
    model = keras.Sequential([
        keras.Input((8, 8, 3)),
        layers.Conv2D(6, 3, padding="same", activation="relu", kernel_initializer=init(seed)),
        layers.BatchNormalization(),
        layers.MaxPooling2D(),
        layers.Conv2D(8, 3, padding="same", activation="relu", kernel_initializer=init(seed + 1)),
        layers.Flatten(),
        layers.Dense(16, activation="relu", kernel_initializer=init(seed + 2)),
        layers.Dropout(dropout, seed=3),
        layers.Dense(5, activation="softmax", kernel_initializer=init(seed + 3)),
    ])
    if weights is not None:
        model.set_weights(weights)
    return model


def gpu_data(n=80, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8, 8, 3)).astype(np.float32)
    y = rng.integers(0, 5, n)
    return x, y


@pytest.fixture
def gpu():
    yield
    dnnbind.set_default_device(None)
    mixed_precision.set_global_policy("float32")


def gpu_pair(factory, policy="float32", **kw):
    mixed_precision.set_global_policy(policy)
    graphed = gpu_model(**kw)
    eager = gpu_model(weights=graphed.get_weights(), **kw)
    graphed.compile(factory(), "sparse_categorical_crossentropy", metrics=["accuracy"])
    eager.compile(factory(), "sparse_categorical_crossentropy", metrics=["accuracy"], jit_compile=False)
    return graphed, eager


@pytest.mark.gpu
@pytest.mark.parametrize("opt", ["sgd_momentum", "adam"])
def test_gpu_graph_fit_matches_eager(gpu, opt):
    factory = {"sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
               # a per-step schedule: the learning rate is re-uploaded before every replay
               "adam": lambda: keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(3e-3, 5, 0.7))}[opt]
    x, y = gpu_data(80)  # batch 16: 5 full batches per epoch
    xv, yv = gpu_data(40, seed=1)  # validation: 2 full batches and one of 8
    with kernels.config.override(allow_tf32=False, deterministic=True):
        graphed, eager = gpu_pair(factory)
        hg = graphed.fit(x, y, batch_size=16, epochs=4, validation_data=(xv, yv), verbose=0, seed=7)
        he = eager.fit(x, y, batch_size=16, epochs=4, validation_data=(xv, yv), verbose=0, seed=7)
        g = graphed._step_graphs
        assert g.stats["captures"] >= 2 and g.stats["replays"] >= 4 * 5 - 2 and g.stats["failures"] == 0
        for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
            assert np.allclose(hg.history[key], he.history[key], rtol=1e-6, atol=1e-7), key
        assert graphed.optimizer.iterations == eager.optimizer.iterations == 20
        for a, b in zip(graphed.get_weights(), eager.get_weights()):  # BN moving statistics included
            assert rel_error(a, b) < 1e-6
        pg = graphed.predict(x, batch_size=16, verbose=0)
        pe = eager.predict(x, batch_size=16, verbose=0)
        assert rel_error(pg, pe) < 1e-6
        assert not np.array_equal(pg[:16], pg[16:32])  # each batch has its own output
        ev_g = graphed.evaluate(xv, yv, batch_size=16, verbose=0, return_dict=True)
        ev_e = eager.evaluate(xv, yv, batch_size=16, verbose=0, return_dict=True)
        assert all(abs(ev_g[k] - ev_e[k]) <= 1e-6 * max(1.0, abs(ev_e[k])) for k in ev_e)


@pytest.mark.gpu
def test_gpu_benchmark_mode_is_captured_after_the_warm_up(gpu):
    """cudnnFind runs in the eager warm-up step of a key; the capture reuses its choice."""
    x, y = gpu_data(64)
    with kernels.config.override(allow_tf32=False, deterministic=True, benchmark=True):
        graphed, eager = gpu_pair(lambda: keras.optimizers.SGD(0.05, momentum=0.9))
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            hg = graphed.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
        he = eager.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False)
    g = graphed._step_graphs
    assert g.stats["failures"] == 0 and g.stats["captures"] == 1 and g.stats["replays"] == 6
    assert np.allclose(hg.history["loss"], he.history["loss"], rtol=1e-6)
    for a, b in zip(graphed.get_weights(), eager.get_weights()):
        assert rel_error(a, b) < 1e-6


@pytest.mark.gpu
def test_gpu_train_on_batch_replays_without_host_synchronisation(gpu, monkeypatch):
    from dnnbind import cuda

    x, y = gpu_data(32)
    xd = dnnbind.backend.asarray(x)
    yd = dnnbind.backend.asarray(y.astype(np.int32))
    graphed, eager = gpu_pair(lambda: keras.optimizers.SGD(0.05, momentum=0.9))
    with kernels.config.override(allow_tf32=False, deterministic=True):
        for _ in range(2):  # warm-up, capture
            graphed.train_on_batch(xd, yd, return_dict=True)
            eager.train_on_batch(xd, yd, return_dict=True)
        syncs = []
        real_sync, real_host = cuda.Stream.synchronize, cuda.DeviceArray.to_host
        monkeypatch.setattr(cuda.Stream, "synchronize", lambda self: (syncs.append("stream"), real_sync(self))[1])
        monkeypatch.setattr(cuda.DeviceArray, "to_host",
                            lambda self, *a, **k: (syncs.append("to_host"), real_host(self, *a, **k))[1])
        for _ in range(5):
            graphed.train_on_batch(xd, yd, return_dict=True)
        assert syncs == [], f"replayed train steps synchronised with the host: {syncs}"
        monkeypatch.undo()
        for _ in range(5):
            eager.train_on_batch(xd, yd, return_dict=True)
    assert graphed._step_graphs.stats["replays"] == 5
    for a, b in zip(graphed.get_weights(), eager.get_weights()):
        assert rel_error(a, b) < 1e-6
    assert abs(graphed._loss_tracker.result() - eager._loss_tracker.result()) < 1e-6


@pytest.mark.gpu
def test_gpu_dropout_draws_fresh_masks_on_every_replay(gpu):
    x, y = gpu_data(32)
    graphed, _ = gpu_pair(lambda: keras.optimizers.SGD(0.0), dropout=0.5)  # lr 0: only the masks change
    losses = []
    for _ in range(6):
        graphed.reset_metrics()
        losses.append(graphed.train_on_batch(x, y, return_dict=True)["loss"])
    assert graphed._step_graphs.stats["replays"] == 4
    assert np.all(np.isfinite(losses))
    assert len(set(losses[2:])) == 4, f"replays drew the same dropout mask: {losses}"
    model, _ = gpu_pair(lambda: keras.optimizers.Adam(3e-3), dropout=0.5)
    x, y = gpu_data(128, seed=2)
    h = model.fit(x, y, batch_size=32, epochs=8, verbose=0)
    assert model._step_graphs.stats["replays"] > 0
    assert h.history["loss"][-1] < h.history["loss"][0]


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_gpu_mixed_precision_graphs_match_eager(gpu, policy):
    x, y = gpu_data(64)
    with kernels.config.override(allow_tf32=False, deterministic=True):
        graphed, eager = gpu_pair(lambda: keras.optimizers.Adam(3e-3), policy=policy)
        hg = graphed.fit(x, y, batch_size=16, epochs=3, verbose=0, seed=1)
        he = eager.fit(x, y, batch_size=16, epochs=3, verbose=0, seed=1)
        assert graphed._step_graphs.stats["replays"] >= 10
        # same kernels in the same order: any difference is 16-bit rounding of non-deterministic sums
        assert np.allclose(hg.history["loss"], he.history["loss"], rtol=1e-3)
        for a, b in zip(graphed.get_weights(), eager.get_weights()):
            assert rel_error(a, b) < 1e-3
        if policy == "mixed_float16":
            # a non-finite batch is skipped on the device and halves the scale, inside the graph too
            bad = x[:16].copy()
            bad[0, 0, 0, 0] = 1e35  # finite in float32 (NaN/inf in x are refused), inf in float16
            for m in (graphed, eager):
                scale = float(m._loss_scale.scale.numpy())
                before = [w for w in m.get_weights() if w.ndim > 1]
                m.train_on_batch(bad, y[:16])
                assert float(m._loss_scale.scale.numpy()) == scale / 2
                assert all(np.array_equal(a, b) for a, b in zip(before, [w for w in m.get_weights() if w.ndim > 1]))


@pytest.mark.gpu
def test_gpu_invalidation_and_set_weights(gpu):
    x, y = gpu_data(32)
    with kernels.config.override(allow_tf32=False, deterministic=True):
        graphed, eager = gpu_pair(lambda: keras.optimizers.SGD(0.05, momentum=0.9))
        for _ in range(3):
            graphed.train_on_batch(x, y)
            eager.train_on_batch(x, y)
        g = graphed._step_graphs
        assert g.graph_count == 1
        fresh = gpu_model(seed=5).get_weights()
        for m in (graphed, eager):
            m.set_weights(fresh)  # in place: the graph stays and sees the new values
            m.train_on_batch(x, y)
        assert g.graph_count == 1 and g.stats["replays"] == 2
        for m in (graphed, eager):
            m.layers[0].trainable = False
            for _ in range(3):
                m.train_on_batch(x, y)
        assert g.stats["clears"] == 1 and g.graph_count == 1
        for a, b in zip(graphed.get_weights(), eager.get_weights()):
            assert rel_error(a, b) < 1e-6
        graphed.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy")
        assert len(g) == 0
        graphed.to("cpu")
        graphed.to("cuda")
        graphed.fit(x, y, batch_size=16, epochs=2, verbose=0)  # graphs again on the moved weights
        assert g.graph_count == 1


@pytest.mark.gpu
def test_gpu_capture_failure_falls_back_with_a_warning(gpu):
    class HostPeek(layers.Layer):
        """Reads its input on the host every step: impossible inside a CUDA graph capture."""

        def forward(self, x, training=False):
            self.seen = float(dnnbind.backend.to_numpy(x).ravel()[0])
            return x

        def backward(self, dy, need_dx=True):
            return dy

    x, y = gpu_data(32)
    dnnbind.set_default_device("cuda")
    model = keras.Sequential([keras.Input((8, 8, 3)), HostPeek(), layers.Flatten(), layers.Dense(5)])
    model.compile(keras.optimizers.SGD(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.train_on_batch(x, y)
    with pytest.warns(RuntimeWarning, match="could not be captured"):
        model.train_on_batch(x, y)
    assert list(model._step_graphs.states().values()) == ["eager"]
    assert model.optimizer.iterations == 2
    model.fit(x, y, batch_size=32, epochs=2, verbose=0)  # the stream is usable afterwards
    assert model.optimizer.iterations == 4 and np.isfinite(model.evaluate(x, y, verbose=0))


def _graph_pool_reserved() -> int:
    """Bytes this process's CUDA-graph memory pool holds on the current device."""
    from cuda.bindings import runtime

    dnnbind.cuda.current_stream().synchronize()
    err, value = runtime.cudaDeviceGetGraphMemAttribute(dnnbind.cuda.current_device_index(),
                                                        runtime.cudaGraphMemAttributeType.cudaGraphMemAttrReservedMemCurrent)
    assert err == runtime.cudaError_t.cudaSuccess, err
    return int(value)


@pytest.mark.gpu
def test_gpu_lru_bound_closes_evicted_graphs(gpu):
    x, y = gpu_data(40)
    model, _ = gpu_pair(lambda: keras.optimizers.SGD(0.01))
    for n in range(4, 14):  # ten batch shapes, each warmed up, captured and replayed
        for _ in range(3):
            model.train_on_batch(x[:n], y[:n])
    g = model._step_graphs
    assert g.stats["captures"] == 10 and g.stats["replays"] == 10
    assert len(g) == 8 and g.graph_count == 8 and g.stats["evictions"] == 2
    graph_pool_before = _graph_pool_reserved()
    model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
    assert len(g) == 0
    # closing the graphs and trimming the graph pool gives memory back (never takes more). This
    # process's graph pool, not the device's free memory, which other processes move.
    assert _graph_pool_reserved() <= graph_pool_before
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)  # still trains: graphs are captured again
    assert g.graph_count == 1


def test_capture_key_follows_registered_module_switches():
    """A module switch that changes the captured kernels (batch norm's path) is part of the step key."""
    from dnnbind.kernels._cuda import batchnorm as bn_cuda

    before = kernels.config.capture_key()
    key = step_key("train", 1, (8, 4), np.float32, (8,), np.int32)
    saved = bn_cuda.USE_PERSISTENT_NHWC
    try:
        bn_cuda.USE_PERSISTENT_NHWC = not saved
        assert kernels.config.capture_key() != before
        assert step_key("train", 1, (8, 4), np.float32, (8,), np.int32) != key
    finally:
        bn_cuda.USE_PERSISTENT_NHWC = saved
    assert kernels.config.capture_key() == before


@pytest.mark.gpu
def test_gpu_flipping_a_batchnorm_switch_captures_anew(gpu):
    from dnnbind.kernels._cuda import batchnorm as bn_cuda

    x, y = gpu_data(32)
    dnnbind.set_default_device("cuda")
    model = keras.Sequential([keras.Input((8, 8, 3)), layers.Conv2D(4, 3), layers.BatchNormalization(),
                              layers.Flatten(), layers.Dense(5, activation="softmax")])
    model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
    saved = bn_cuda.USE_PERSISTENT_NHWC
    try:
        for flag in (saved, not saved):
            bn_cuda.USE_PERSISTENT_NHWC = flag
            for _ in range(3):
                model.train_on_batch(x, y)
    finally:
        bn_cuda.USE_PERSISTENT_NHWC = saved
    stats = model._step_graphs.stats
    assert stats["captures"] == 2 and stats["replays"] == 2 and stats["failures"] == 0, stats
