"""Input pipelines: every kind of ``x`` (arrays, (x, y) tuples, generators, PyDataset), Keras 3's
steps rules, sample and class weights against hand-computed weighted losses, and the prefetch
ordering (a fake transfer on the CPU; the CUDA path in the @gpu tests at the end)."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, kernels
from dnnbind.trainers import data_adapters as da


def _data(n=48, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    return x, y


def _model(seed=3, optimizer=None, device=None):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((6,)), layers.Dense(8, activation="relu"), layers.Dense(3, activation="softmax")])
    if device is not None:
        m.to(device)
    m.compile(optimizer or keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return m


def _weights(m):
    return [w.copy() for w in m.get_weights()]


def _same(a, b):
    return all(np.array_equal(u, v) for u, v in zip(a, b))


def _batches(x, y, bs, w=None):
    for i in range(0, len(x), bs):
        yield (x[i:i + bs], y[i:i + bs]) if w is None else (x[i:i + bs], y[i:i + bs], w[i:i + bs])


class _Batches(keras.utils.PyDataset):
    """Batches of arrays; records which indices were read, in which thread."""

    def __init__(self, x, y, bs, w=None, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y, self.bs, self.w = x, y, bs, w
        self.read: list[int] = []
        self.threads: set[str] = set()
        self.epochs_ended = 0

    def __len__(self):
        return -(-len(self.x) // self.bs)

    def __getitem__(self, i):
        self.read.append(i)
        self.threads.add(threading.current_thread().name)
        s = slice(i * self.bs, (i + 1) * self.bs)
        return (self.x[s], self.y[s]) if self.w is None else (self.x[s], self.y[s], self.w[s])

    def on_epoch_end(self):
        self.epochs_ended += 1


# ------------------------------------------------------------------ helpers of the module


def test_unpack_x_y_sample_weight_follows_keras():
    a, b, c = np.ones(2), np.zeros(2), np.full(2, 3.0)
    assert da.unpack_x_y_sample_weight(a) == (a, None, None)
    assert da.unpack_x_y_sample_weight((a,)) == (a, None, None)
    assert da.unpack_x_y_sample_weight([a, b]) == (a, b, None)
    assert da.unpack_x_y_sample_weight((a, b, c)) == (a, b, c)
    with pytest.raises(ValueError, match=r"`\(x, y, sample_weight\)`, found a tuple of 4"):
        da.unpack_x_y_sample_weight((a, b, c, c))


def test_class_weight_to_sample_weights_reads_sparse_onehot_and_binary_labels():
    cw = {0: 0.5, 2: 4.0}
    np.testing.assert_array_equal(da.class_weight_to_sample_weights(np.array([0, 1, 2, 2]), cw), [0.5, 1, 4, 4])
    onehot = np.eye(3, dtype=np.float32)[[2, 0, 1]]
    np.testing.assert_array_equal(da.class_weight_to_sample_weights(onehot, cw), [4, 0.5, 1])
    binary = np.array([[0.0], [1.0], [0.0]], np.float32)
    np.testing.assert_array_equal(da.class_weight_to_sample_weights(binary, {1: 3.0}), [1, 3, 1])


def test_data_kind():
    x, y = _data(8)
    assert da.data_kind(x) == da.data_kind([x, x]) == da.data_kind({"a": x}) == da.data_kind((x, y)) == "arrays"
    assert da.data_kind(_batches(x, y, 4)) == da.data_kind(iter([(x, y)])) == "generator"
    assert da.data_kind(_Batches(x, y, 4)) == "py_dataset"


def test_py_dataset_is_keras_shaped():
    assert keras.utils.Sequence is keras.utils.PyDataset
    ds = _Batches(*_data(8), 4, workers=3, use_multiprocessing=False, max_queue_size=5)
    assert (ds.workers, ds.use_multiprocessing, ds.max_queue_size, len(ds), ds.num_batches) == (3, False, 5, 2, 2)
    with pytest.raises(ValueError, match="workers must be an int >= 1, got 0"):
        _Batches(*_data(8), 4, workers=0)


# ------------------------------------------------------------------ every input type, same training


def test_every_input_type_trains_exactly_like_the_arrays():
    x, y = _data()
    ref = _model()
    ref_hist = ref.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0).history
    runs = {
        "tuple": lambda m: m.fit((x, y), batch_size=16, shuffle=False, verbose=0),
        "generator": lambda m: m.fit(_batches(x, y, 16), verbose=0),
        "iterator": lambda m: m.fit(iter(list(_batches(x, y, 16))), verbose=0),
        "py_dataset": lambda m: m.fit(_Batches(x, y, 16), shuffle=False, verbose=0),
        "py_dataset_threads": lambda m: m.fit(_Batches(x, y, 16, workers=3, max_queue_size=2), shuffle=False,
                                              verbose=0),
    }
    for name, run in runs.items():
        m = _model()
        hist = run(m).history
        assert _same(_weights(m), _weights(ref)), name
        assert hist["loss"] == pytest.approx(ref_hist["loss"], rel=1e-6), name
        assert hist["accuracy"] == ref_hist["accuracy"], name


def test_py_dataset_workers_read_on_threads_and_on_epoch_end_runs_every_epoch():
    x, y = _data()
    ds = _Batches(x, y, 8, workers=3)
    m = _model()
    m.fit(ds, epochs=3, verbose=0, seed=1)
    assert ds.epochs_ended == 3 and sorted(ds.read) == sorted(list(range(6)) * 3)
    assert all(t.startswith("dnnbind-pydataset") for t in ds.threads)
    # shuffle=True (fit's default) visits the batches in a new order per epoch, as Keras 3
    assert [ds.read[i:i + 6] for i in (0, 6, 12)] != [list(range(6))] * 3


def test_py_dataset_multiprocessing_is_refused_clearly():
    m = _model()
    with pytest.raises(NotImplementedError,
                       match=r"PyDataset\(use_multiprocessing=True\) is not supported; use workers=2"):
        m.fit(_Batches(*_data(), 8, use_multiprocessing=True), verbose=0)


def test_predict_reads_x_of_every_input_type():
    x, y = _data(40)
    m = _model()
    ref = m.predict(x, batch_size=16, verbose=0)
    np.testing.assert_array_equal(m.predict((x, y), batch_size=16, verbose=0), ref)
    np.testing.assert_array_equal(m.predict(_batches(x, y, 16), verbose=0), ref)
    np.testing.assert_array_equal(m.predict((b for b, _ in _batches(x, y, 16)), verbose=0), ref)
    np.testing.assert_array_equal(m.predict(_Batches(x, y, 16, workers=2), verbose=0), ref)
    np.testing.assert_array_equal(m.predict(x, batch_size=16, steps=2, verbose=0), ref[:32])


def test_evaluate_reads_every_input_type_and_steps():
    x, y = _data(40)
    m = _model()
    ref = m.evaluate(x, y, batch_size=8, verbose=0)
    assert m.evaluate((x, y), batch_size=8, verbose=0) == pytest.approx(ref, rel=1e-6)
    assert m.evaluate(_batches(x, y, 8), verbose=0) == pytest.approx(ref, rel=1e-6)
    assert m.evaluate(_Batches(x, y, 8), verbose=0) == pytest.approx(ref, rel=1e-6)
    assert m.evaluate(x, y, batch_size=8, steps=2, verbose=0) == pytest.approx(
        m.evaluate(x[:16], y[:16], verbose=0), rel=1e-6)
    assert m.evaluate(_batches(x, y, 8), steps=3, verbose=0) == pytest.approx(
        m.evaluate(x[:24], y[:24], verbose=0), rel=1e-6)


# ------------------------------------------------------------------ Keras 3's steps rules


def test_steps_per_epoch_continues_the_pass_across_epochs():
    x, y = _data(64)
    ref = _model()
    ref.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    # 2 epochs of 2 steps each = one pass of the 4 batches, in order
    for data in (lambda: (x, y), lambda: _batches(x, y, 16)):
        m = _model()
        args = data()
        hist = (m.fit(*args, batch_size=16, epochs=2, steps_per_epoch=2, shuffle=False, verbose=0)
                if isinstance(args, tuple) else m.fit(args, epochs=2, steps_per_epoch=2, verbose=0))
        assert len(hist.history["loss"]) == 2 and _same(_weights(m), _weights(ref))
    ds = _Batches(x, y, 16)
    with pytest.warns(UserWarning, match="ran out of data"):
        _model().fit(ds, epochs=3, steps_per_epoch=3, shuffle=False, verbose=0)
    # epoch 1: 0 1 2, epoch 2: 3 (the pass is used up: Keras warns and ends the epoch), epoch 3: 0 1 2
    assert ds.read == [0, 1, 2, 3, 0, 1, 2]


def test_a_generator_without_steps_runs_until_exhausted_then_runs_out():
    x, y = _data(48)
    m = _model()
    with pytest.warns(UserWarning, match="Your input ran out of data; interrupting training"):
        hist = m.fit(_batches(x, y, 16), epochs=3, verbose=0)
    assert len(hist.history["loss"]) == 1  # the second epoch found it empty and training stopped
    m2 = _model()
    with pytest.warns(UserWarning, match="ran out of data"):
        hist = m2.fit(_batches(x, y, 16), epochs=2, steps_per_epoch=2, verbose=0)
    assert len(hist.history["loss"]) == 2  # epoch 2 ran its one remaining batch, then stopped


def test_the_last_partial_batch_of_a_generator_runs():
    x, y = _data(40)
    ref = _model()
    ref.fit(x, y, batch_size=16, shuffle=False, verbose=0)   # 16, 16, 8
    m = _model()
    m.fit(_batches(x, y, 16), verbose=0)
    assert _same(_weights(m), _weights(ref))


def test_validation_data_of_every_kind_and_validation_steps():
    x, y = _data(64)
    xv, yv = x[:24] * 0.5, y[:24]
    kinds = {"tuple": (xv, yv), "generator": _batches(xv, yv, 8), "py_dataset": _Batches(xv, yv, 8)}
    for name, val in kinds.items():
        m = _model()
        hist = m.fit(x, y, batch_size=16, validation_data=val, validation_batch_size=8, validation_steps=2,
                     verbose=0).history
        expected = m.evaluate(xv[:16], yv[:16], verbose=0)
        assert hist["val_loss"][0] == pytest.approx(expected[0], rel=1e-6), name
        assert hist["val_accuracy"][0] == pytest.approx(expected[1]), name


# ------------------------------------------------------------------ sample and class weights


def _per_sample_xent(m, x, y):
    p = m.predict(x, verbose=0).astype(np.float64)
    p = np.clip(p / p.sum(axis=1, keepdims=True), 1e-7, 1 - 1e-7)
    return -np.log(p[np.arange(len(y)), y])


def test_weighted_evaluate_matches_keras_reduction_by_hand():
    x, y = _data(40)
    w = np.random.default_rng(5).uniform(0, 3, 40).astype(np.float32)
    m = _model()
    l = _per_sample_xent(m, x, y)
    # one batch: sum(w * l) / N (Keras 3's sum_over_batch_size, not / sum(w))
    loss, acc = m.evaluate(x, y, sample_weight=w, batch_size=40, verbose=0)
    assert loss == pytest.approx(np.sum(w * l) / 40, rel=1e-5)
    assert acc == pytest.approx(m.evaluate(x, y, verbose=0)[1])  # metrics are not weighted (Keras 3)
    # batches of 16, 16, 8: the loss tracker averages the batch values weighted by batch size
    batches = [(0, 16), (16, 32), (32, 40)]
    by_batch = [np.sum(w[a:b] * l[a:b]) / (b - a) for a, b in batches]
    expected = sum(v * (b - a) for v, (a, b) in zip(by_batch, batches)) / 40
    assert m.evaluate(x, y, sample_weight=w.reshape(40, 1), batch_size=16, verbose=0)[0] == pytest.approx(
        expected, rel=1e-5)
    assert m.evaluate(_batches(x, y, 16, w), verbose=0)[0] == pytest.approx(expected, rel=1e-5)
    assert m.evaluate((x, y, w), batch_size=16, verbose=0)[0] == pytest.approx(expected, rel=1e-5)
    assert m.test_on_batch(x, y, sample_weight=w)[0] == pytest.approx(np.sum(w * l) / 40, rel=1e-5)


def test_class_weight_weighs_each_sample_by_its_class():
    x, y = _data(32)
    cw = {0: 0.25, 1: 3.0}
    m = _model()
    l = _per_sample_xent(m, x, y)
    w = np.array([cw.get(int(c), 1.0) for c in y])
    before = _weights(m)
    hist = m.fit(x, y, class_weight=cw, batch_size=32, epochs=1, verbose=0)
    assert hist.history["loss"][0] == pytest.approx(np.sum(w * l) / 32, rel=1e-5)
    m2 = _model()
    assert _same(_weights(m2), before)
    m2.fit(x, y, sample_weight=w, batch_size=32, verbose=0)
    m3 = _model()
    m3.train_on_batch(x, y, class_weight=cw)
    # class_weight == the equivalent sample_weight (up to NumPy's alignment-dependent summation order)
    for other in (m2, m3):
        for u, v in zip(_weights(other), _weights(m)):
            np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-7)
    assert not np.allclose(_weights(m)[0], before[0])


def test_sample_weights_scale_the_gradient():
    x, y = _data(32)
    a = _model(optimizer=keras.optimizers.SGD(0.1))
    a.fit(x, y, sample_weight=np.full(32, 2.0), batch_size=32, verbose=0)
    b = _model(optimizer=keras.optimizers.SGD(0.2))
    b.fit(x, y, batch_size=32, verbose=0)
    for u, v in zip(_weights(a), _weights(b)):
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-7)
    # zero weights on half the batch: the same update as the other half alone at half the rate
    # (sum over the kept half / 32 = mean over it / 2)
    w = np.r_[np.ones(16), np.zeros(16)]
    c = _model(optimizer=keras.optimizers.SGD(0.2))
    c.fit(x, y, sample_weight=w, batch_size=32, verbose=0)
    d = _model(optimizer=keras.optimizers.SGD(0.1))
    d.fit(x[:16], y[:16], batch_size=16, verbose=0)
    for u, v in zip(_weights(c), _weights(d)):
        np.testing.assert_allclose(u, v, rtol=1e-5, atol=1e-7)


def test_multi_output_sample_weights_as_one_array_a_list_or_a_dict():
    x, _ = _data(24)
    keras.utils.set_random_seed(1)
    inp = keras.Input((6,), name="x")
    h = layers.Dense(5, activation="tanh")(inp)
    out_a = layers.Dense(1, name="a")(h)
    out_b = layers.Dense(2, name="b")(h)
    m = keras.Model(inp, [out_a, out_b])
    m.compile("sgd", loss={"a": "mse", "b": "mse"}, loss_weights={"a": 1.0, "b": 0.5})
    ya = x[:, :1] * 2
    yb = x[:, 1:3]
    pa, pb = m.predict(x, verbose=0)
    la = np.mean((pa - ya) ** 2, axis=1)
    lb = np.mean((pb - yb) ** 2, axis=1)
    wa = np.linspace(0, 2, 24)
    wb = np.linspace(1, 0, 24)
    logs = m.evaluate(x, {"a": ya, "b": yb}, sample_weight={"a": wa, "b": wb}, batch_size=24, verbose=0,
                      return_dict=True)
    assert logs["a_loss"] == pytest.approx(np.sum(wa * la) / 24, rel=1e-5)
    assert logs["b_loss"] == pytest.approx(np.sum(wb * lb) / 24, rel=1e-5)
    assert logs["loss"] == pytest.approx(np.sum(wa * la) / 24 + 0.5 * np.sum(wb * lb) / 24, rel=1e-5)
    as_list = m.evaluate(x, [ya, yb], sample_weight=[wa, wb], batch_size=24, verbose=0, return_dict=True)
    assert as_list["loss"] == pytest.approx(logs["loss"], rel=1e-6)
    one = m.evaluate(x, [ya, yb], sample_weight=wa, batch_size=24, verbose=0, return_dict=True)
    assert one["b_loss"] == pytest.approx(np.sum(wa * lb) / 24, rel=1e-5)  # one array weighs every output
    with pytest.raises(ValueError, match="class_weight is only supported for models with a single output"):
        m.fit(x, [ya, yb], class_weight={0: 1.0}, verbose=0)


# ------------------------------------------------------------------ errors name what to do


def test_generator_and_dataset_arguments_are_checked():
    x, y = _data(16)
    m = _model()
    before = _weights(m)
    with pytest.raises(ValueError, match=r"fit: when x is a generator or iterator, y must not be passed"):
        m.fit(_batches(x, y, 8), y, verbose=0)
    with pytest.raises(ValueError, match=r"when x is a PyDataset, sample_weight must not be passed"):
        m.fit(_Batches(x, y, 8), sample_weight=np.ones(16), verbose=0)
    with pytest.raises(ValueError, match=r"validation_split is only supported for NumPy arrays"):
        m.fit(_batches(x, y, 8), validation_split=0.5, verbose=0)
    with pytest.warns(UserWarning, match=r"batch_size=4 is ignored when x is a PyDataset"):
        m.predict(_Batches(x, y, 8), batch_size=4, verbose=0)
    with pytest.raises(ValueError, match=r"fit got a batch without targets; .* must yield \(x, y\)"):
        m.fit((b for b in [x[:8]]), verbose=0)
    with pytest.raises(ValueError, match=r"fit expects input of shape \(batch, 6\), got \(8, 5\)"):
        m.fit(iter([(x[:8, :5], y[:8])]), verbose=0)
    with pytest.raises(ValueError, match=r"fit: sample_weight must have shape \(8,\) or \(8, 1\)"):
        m.fit(iter([(x[:8], y[:8], np.ones(7))]), verbose=0)
    with pytest.raises(ValueError, match=r"evaluate: x gave no batches"):
        m.evaluate(iter([]), verbose=0)
    with pytest.raises(ValueError, match=r"class_weight keys must be class indices"):
        m.fit(x, y, class_weight={"a": 1.0}, verbose=0)
    assert _same(_weights(m), before)


# ------------------------------------------------------------------ prefetch ordering (fake transfer)


class _FakeTransfer:
    """Records what the prefetcher asks of the streams, with the consumer's steps in between."""

    def __init__(self):
        self.log: list[tuple] = []
        self._events = 0

    def upload(self, slot, host):
        self.log.append(("copy", int(host[0][0, 0]), "reuse" if slot is not None else "new"))
        return [np.array(h, copy=True) for h in host]

    def record(self, on_main, event=None):
        if event is None:
            self._events += 1
            event = self._events
        self.log.append(("record", "main" if on_main else "side", event))
        return event

    def wait(self, on_main, event):
        self.log.append(("wait", "main" if on_main else "side", event))

    def close(self):
        self.log.append(("close",))


def test_prefetch_copies_the_next_batch_while_the_step_runs_and_reuses_slots_only_when_released():
    t = _FakeTransfer()
    host = (([np.full((2, 1), float(k))], [np.full((2, 1), -1.0)]) for k in range(4))
    for xs, _ in da.Prefetcher(keras.Device("cpu"), transfer=t)(host):
        t.log.append(("step", int(xs[0][0, 0])))
    log = t.log

    def at(entry):
        return log.index(entry)

    for k in range(4):
        copy_k = next(i for i, e in enumerate(log) if e[:2] == ("copy", k))
        step_k = at(("step", k))
        ready = log[copy_k + 2]  # each batch: x copy, y copy, then the copy stream's ready event
        assert ready[:2] == ("record", "side")
        # the compute stream waits on that event before the step uses the batch
        assert log[copy_k + 3] == ("wait", "main", ready[2]) and copy_k + 3 < step_k
        if k + 1 < 4:
            copy_next = next(i for i, e in enumerate(log) if e[:2] == ("copy", k + 1))
            # batch k+1 is produced and copied only after step k was queued (it overlaps step k) ...
            assert step_k < copy_next < at(("step", k + 1))
        if k >= 2:
            # ... into the slot of batch k-2, only after the event recorded once step k-2 was queued
            released = log[at(("step", k - 2)) + 1]
            assert released[:2] == ("record", "main")
            assert log[copy_k - 1] == ("wait", "side", released[2])
            assert log[copy_k][2] == "reuse"
    assert log[-1] == ("close",)
    # no other kind of call: nothing synchronises the host
    assert {e[0] for e in log} == {"copy", "record", "wait", "step", "close"}
    # three events serve the pass (ready, and released per slot), re-recorded: none made per batch
    assert {e[2] for e in log if e[0] == "record"} == {1, 2, 3}


def test_prefetch_closes_when_the_consumer_stops_early():
    t = _FakeTransfer()
    host = (([np.full((2, 1), float(k))], None) for k in range(10))
    it = da.Prefetcher(keras.Device("cpu"), transfer=t)(host)
    next(it)
    it.close()
    assert t.log[-1] == ("close",)


# ------------------------------------------------------------------ the GPU path


def _gpu():
    return keras.Device("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("weighted", [False, True])
def test_gpu_generator_fit_with_graphs_matches_the_array_path_exactly(weighted):
    x, y = _data(96)
    w = np.random.default_rng(2).uniform(0.1, 2.0, 96).astype(np.float32) if weighted else None
    # deterministic kernels, and no TF32, so the comparison with NumPy below is tight
    with kernels.config.override(deterministic=True, allow_tf32=False):
        ref = _model(device=_gpu())
        ref.fit(x, y, sample_weight=w, batch_size=16, epochs=2, shuffle=False, verbose=0)
        gen = _model(device=_gpu())
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # a failed capture would warn
            gen.fit(_batches(np.r_[x, x], np.r_[y, y], 16, None if w is None else np.r_[w, w]), epochs=2,
                    steps_per_epoch=6, verbose=0)
            ds = _model(device=_gpu())
            ds.fit(_Batches(x, y, 16, w, workers=2), epochs=2, shuffle=False, verbose=0)
    assert gen._step_graphs.stats["captures"] >= 1 and gen._step_graphs.stats["replays"] >= 1
    assert _same(_weights(gen), _weights(ref)) and _same(_weights(ds), _weights(ref))
    # and the GPU agrees with the NumPy backend (named: the default device is the GPU here)
    cpu = _model(device=keras.Device("cpu"))
    cpu.fit(x, y, sample_weight=w, batch_size=16, epochs=2, shuffle=False, verbose=0)
    for u, v in zip(_weights(gen), _weights(cpu)):
        np.testing.assert_allclose(u, v, rtol=2e-4, atol=2e-5)


@pytest.mark.gpu
def test_gpu_partial_batches_and_predict_through_the_prefetcher():
    x, y = _data(40)  # batches of 16, 16, 8: the last runs eagerly
    with kernels.config.override(deterministic=True, allow_tf32=False):
        m = _model(device=_gpu())
        ref = m.predict(x, batch_size=16, verbose=0)
        out = m.predict(_Batches(x, y, 16, workers=2), verbose=0)
        again = m.predict(_batches(x, y, 16), verbose=0)  # graphs captured by now: replays
        e_gen = m.evaluate(_batches(x, y, 16, np.linspace(0, 1, 40)), verbose=0)[0]
        e_arr = m.evaluate(x, y, sample_weight=np.linspace(0, 1, 40), batch_size=16, verbose=0)[0]
    np.testing.assert_array_equal(out, ref)
    np.testing.assert_array_equal(again, ref)
    cpu = _model(device=keras.Device("cpu"))  # the NumPy backend (the default device is the GPU here)
    np.testing.assert_allclose(out, cpu.predict(x, verbose=0), rtol=1e-4, atol=1e-6)
    assert e_gen == pytest.approx(e_arr, rel=1e-6)
    assert e_gen == pytest.approx(cpu.evaluate(x, y, sample_weight=np.linspace(0, 1, 40), batch_size=16,
                                               verbose=0)[0], rel=1e-4)


@pytest.mark.gpu
def test_gpu_streamed_arrays_use_the_prefetcher(monkeypatch):
    from dnnbind import cuda

    x, y = _data(64)
    w = np.linspace(0.5, 1.5, 64).astype(np.float32)
    with kernels.config.override(deterministic=True):
        ref = _model(device=_gpu())
        ref.fit(x, y, sample_weight=w, batch_size=16, epochs=2, seed=4, verbose=0)
        m = _model(device=_gpu())
        # pretend the device is nearly full, so the arrays are streamed batch by batch (shuffled
        # on the host with the same seed, so the same batches)
        monkeypatch.setattr(cuda, "memory_info", lambda *a, **k: (1024, 2**30))
        m.fit(x, y, sample_weight=w, batch_size=16, epochs=2, seed=4, verbose=0)
    assert m._step_graphs.stats["replays"] >= 1
    assert _same(_weights(m), _weights(ref))
