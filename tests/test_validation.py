"""Bad input, class by class: each is a clear ValueError/TypeError naming the model/layer/argument and
the expected versus actual value, raised before anything runs, and a failed call changes no state."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import dnnbind
import dnnbind as keras
import dnnbind.cudnn as cd
from dnnbind import _validate, layers, kernels
from dnnbind._lib import cudnn as C
from dnnbind.callbacks import History


pytestmark = pytest.mark.usefixtures("cpu")  # the NumPy backend (conftest.py)


@pytest.fixture
def model():
    m = keras.Sequential([keras.Input((4,)), layers.Dense(3, activation="softmax", name="out")], name="net")
    m.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return m


X = np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4)
Y = np.arange(8) % 3


def _state(m):
    return [w.copy() for w in m.get_weights()], m.optimizer.iterations


def _assert_unchanged(m, before):
    weights, iterations = before
    assert all(np.array_equal(a, b) for a, b in zip(m.get_weights(), weights))
    assert m.optimizer.iterations == iterations


# ------------------------------------------------------------------ the validation module itself


def test_ints_refuse_floats_bools_and_out_of_range():
    assert _validate.positive_int(np.int64(3), "batch_size", "o") == 3
    for bad in (2.7, 2.0, True, "4", None):
        with pytest.raises(TypeError, match=r"o: batch_size must be an int, got"):
            _validate.positive_int(bad, "batch_size", "o")
    with pytest.raises(ValueError, match=r"o: batch_size must be a positive int, got 0"):
        _validate.positive_int(0, "batch_size", "o")
    with pytest.raises(ValueError, match=r"o: epochs must be an int >= 0, got -3"):
        _validate.non_negative_int(-3, "epochs", "o")
    # a wrong type is also a ValueError, the type Keras 3 raises for e.g. Dense(2.5)
    assert issubclass(_validate.ArgumentTypeError, TypeError) and issubclass(_validate.ArgumentTypeError, ValueError)


def test_numbers_are_finite_and_in_range():
    assert _validate.number(np.float32(0.5), "rate", "o", low=0, high=1, high_open=True) == 0.5
    with pytest.raises(ValueError, match=r"o: rate must be in \[0, 1\), got 1"):
        _validate.number(1.0, "rate", "o", low=0, high=1, high_open=True)
    with pytest.raises(ValueError, match="o: lr must be a finite number, got nan"):
        _validate.number(float("nan"), "lr", "o", low=0)
    with pytest.raises(ValueError, match="o: eps must be > 0, got 0"):
        _validate.number(0, "eps", "o", low=0, low_open=True)
    with pytest.raises(TypeError, match="o: lr must be a number, got '0.1'"):
        _validate.number("0.1", "lr", "o")


def test_finite_array_counts_and_locates():
    x = np.zeros((6, 2, 3), np.float32)
    x[4, 1, 2], x[5, 0, 0] = np.nan, -np.inf
    with pytest.raises(ValueError, match=r"o: x holds 2 non-finite values \(NaN or inf\), the first in sample 4"):
        _validate.finite_array(x, "x", "o")
    _validate.finite_array(np.arange(6), "x", "o")  # ints are always finite
    # the row-chunked scan finds the first bad sample across chunks
    big = np.zeros((10, 4), np.float64)
    big[7, 3] = np.nan
    old, _validate._CHUNK_ELEMENTS = _validate._CHUNK_ELEMENTS, 8
    try:
        with pytest.raises(ValueError, match="holds 1 non-finite value .*sample 7"):
            _validate.finite_array(big, "x", "o")
    finally:
        _validate._CHUNK_ELEMENTS = old


# ------------------------------------------------------------------ fit / evaluate / predict arguments


@pytest.mark.parametrize("call, exc, words", [
    (lambda m: m.predict(X, batch_size=0, verbose=0), ValueError, r"predict: batch_size must be a positive int, got 0"),
    (lambda m: m.predict(X, batch_size=-1, verbose=0), ValueError, r"predict: batch_size must be a positive int"),
    (lambda m: m.evaluate(X, Y, batch_size=0, verbose=0), ValueError, r"evaluate: batch_size must be a positive"),
    (lambda m: m.evaluate(X, Y, batch_size=-4, verbose=0), ValueError, r"evaluate: batch_size must be a positive"),
    (lambda m: m.fit(X, Y, batch_size=2.7, verbose=0), TypeError, r"fit: batch_size must be an int, got float 2.7"),
    (lambda m: m.fit(X, Y, epochs=1.5, verbose=0), TypeError, r"fit: epochs must be an int, got float 1.5"),
    (lambda m: m.fit(X, Y, epochs=-3, verbose=0), ValueError, r"fit: epochs must be an int >= 0, got -3"),
    (lambda m: m.fit(X, Y, epochs=2, initial_epoch=5, verbose=0), ValueError, r"initial_epoch=5 is past epochs=2"),
    (lambda m: m.fit(X, Y, initial_epoch=-1, verbose=0), ValueError, r"fit: initial_epoch must be an int >= 0"),
    (lambda m: m.fit(X, Y, validation_split=1.0, verbose=0), ValueError, r"validation_split must be in \[0, 1\), got"),
    (lambda m: m.fit(X, Y, validation_split=float("nan"), verbose=0), ValueError, r"validation_split must be a finite"),
    (lambda m: m.fit(X, Y, verbose=3), ValueError, r"fit: verbose must be one of 'auto', 0, 1, 2, got int 3"),
    (lambda m: m.predict(X, verbose="yes"), ValueError, r"predict: verbose must be one of"),
    (lambda m: m.fit(X, Y, shuffle="batch", verbose=0), TypeError, r"fit: shuffle must be True or False, got 'batch'"),
    (lambda m: m.fit(X, Y, callbacks=[History], verbose=0), TypeError,
     r"callbacks\[0\] must be a dnnbind.callbacks.Callback instance.*pass an instance, not the class"),
    (lambda m: m.evaluate(X, Y, callbacks="History", verbose=0), TypeError, r"evaluate: callbacks must be a list"),
    (lambda m: m.fit(X, Y, steps_per_epoch="2", verbose=0), TypeError, r"fit: steps_per_epoch must be an int"),
    (lambda m: m.predict(X, steps=0, verbose=0), ValueError, r"predict: steps must be a positive int, got 0"),
    (lambda m: m.fit(X, Y, validation_freq=0, verbose=0), ValueError, r"fit: validation_freq must be a positive int"),
    (lambda m: m.fit(X, Y, validation_batch_size=1.5, verbose=0), TypeError, r"validation_batch_size must be an int"),
    (lambda m: m.fit(X, Y, validation_data=(X,), verbose=0), ValueError,
     r"fit: validation_data must be a tuple \(x_val, y_val\), got a tuple of 1"),
    (lambda m: m.fit(X, Y, validation_data=(np.ones((3, 5)), np.zeros(3)), verbose=0), ValueError,
     r"fit \(validation_data\) expects input of shape \(batch, 4\), got \(3, 5\)"),
    (lambda m: m.fit(X, Y, validation_data=(X, Y, np.ones(7)), verbose=0), ValueError,
     r"fit \(validation_data\): sample_weight must have shape \(8,\) or \(8, 1\)"),
    (lambda m: m.fit(X, Y, class_weight={0: 1.0}, sample_weight=np.ones(8), verbose=0), ValueError,
     r"fit: class_weight and sample_weight cannot both be given"),
    (lambda m: m.fit(X, Y, class_weight=[1.0, 2.0], verbose=0), TypeError, r"fit: class_weight must be a dict"),
    (lambda m: m.evaluate(X, Y, return_dict="yes", verbose=0), TypeError, r"return_dict must be True or False"),
    (lambda m: m.train_on_batch(X, Y, sample_weight=np.ones((8, 2))), ValueError, r"sample_weight must have shape"),
    (lambda m: m.test_on_batch(X, Y, sample_weight=np.full(8, np.nan)), ValueError, r"sample_weight holds"),
])
def test_entry_arguments_are_checked_before_anything_runs(model, call, exc, words):
    before = _state(model)
    with pytest.raises(exc, match=words) as info:
        call(model)
    assert "'net'" in str(info.value) or exc is NotImplementedError
    _assert_unchanged(model, before)


def test_valid_edge_values_still_work(model):
    assert model.fit(X, Y, epochs=0, verbose=0).history == {}           # Keras: nothing to run
    h = model.fit(X, Y, epochs=3, initial_epoch=2, batch_size=np.int64(4), shuffle=np.True_, verbose=False)
    assert h.epoch == [2]
    assert model.predict(X, batch_size=100, verbose=0).shape == (8, 3)


def test_non_finite_data_is_refused_for_training_and_evaluation(model):
    x = X.copy()
    x[5, 2], x[6, 1] = np.nan, np.inf
    before = _state(model)
    for call in (lambda: model.fit(x, Y, verbose=0), lambda: model.train_on_batch(x, Y)):
        with pytest.raises(ValueError, match=r"'net': (fit|train_on_batch): x holds 2 non-finite values "
                                             r"\(NaN or inf\), the first in sample 5; .*weights NaN"):
            call()
    with pytest.raises(ValueError, match=r"evaluate: x holds 2 non-finite .*sample 5; they would make the loss NaN"):
        model.evaluate(x, Y, verbose=0)
    with pytest.raises(ValueError, match=r"fit \(validation_data\): x holds 2 non-finite"):
        model.fit(X, Y, validation_data=(x, Y), verbose=0)
    # float64 values beyond float32's range become inf in the cast, and are caught too
    with pytest.raises(ValueError, match="holds 1 non-finite value"), np.errstate(over="ignore"):
        model.fit(np.where(np.arange(32).reshape(8, 4) == 9, 1e300, X.astype(np.float64)), Y, verbose=0)
    _assert_unchanged(model, before)
    with np.errstate(invalid="ignore"):
        assert np.isnan(model.predict(x, verbose=0)[5]).all()  # predict accepts them, as Keras


def test_non_finite_regression_targets_are_refused():
    m = keras.Sequential([keras.Input((4,)), layers.Dense(1)], name="reg")
    m.compile("sgd", "mse")
    y = np.zeros(8, np.float32)
    y[3] = np.nan
    with pytest.raises(ValueError, match=r"'reg': fit: y holds 1 non-finite value .*sample 3"):
        m.fit(X, y, verbose=0)
    with pytest.raises(ValueError, match=r"'reg': test_on_batch: y holds 1 non-finite"):
        m.test_on_batch(X, y)


def test_empty_data_and_empty_models(model):
    with pytest.raises(ValueError, match=r"'net': evaluate got no samples \(x has shape \(0, 4\)\)"):
        model.evaluate(np.zeros((0, 4)), np.zeros(0), verbose=0)
    with pytest.raises(ValueError, match=r"'net': fit got no samples"):
        model.fit(np.zeros((0, 4)), np.zeros(0), verbose=0)
    with pytest.raises(ValueError, match=r"'net': train_on_batch got no samples"):
        model.train_on_batch(np.zeros((0, 4)), np.zeros(0))
    assert model.predict(np.zeros((0, 4)), verbose=0).shape == (0, 3)
    empty = keras.Sequential(name="hollow")
    empty.compile("adam", "mse")
    for call in (lambda: empty.fit(X, Y, verbose=0), lambda: empty.predict(X, verbose=0),
                 lambda: empty.evaluate(X, Y, verbose=0), lambda: empty.predict_on_batch(X), lambda: empty(X)):
        with pytest.raises(ValueError, match=r"'hollow': \w+ needs a model with at least one layer"):
            call()


def test_failed_compile_changes_nothing(model):
    opt, loss, metrics, config = model.optimizer, model.loss, list(model._metrics), model._compile_config
    with pytest.raises(ValueError, match="unknown metric 'not_a_metric'"):
        model.compile("sgd", "mse", metrics=["not_a_metric"])       # good optimizer and loss, bad metric
    with pytest.raises(ValueError, match="metric names must be unique"):
        model.compile("sgd", "mse", metrics=["accuracy", "accuracy"])
    with pytest.raises(ValueError, match=r"'net': compile: steps_per_execution must be a positive int, got 0"):
        model.compile("sgd", "mse", steps_per_execution=0)
    with pytest.raises(TypeError, match=r"compile: run_eagerly must be True or False"):
        model.compile("sgd", "mse", run_eagerly="no")
    with pytest.raises(TypeError, match=r"compile: metrics must be a list"):
        model.compile("sgd", "mse", metrics={"accuracy"})
    assert model.optimizer is opt and model.loss is loss and model._metrics == metrics
    assert model._compile_config is config and model.metrics_names == ["loss", "accuracy"]
    fresh = keras.Sequential([keras.Input((4,)), layers.Dense(3)])
    with pytest.raises(ValueError):
        fresh.compile("adam", "mse", metrics=["nope"])
    assert not fresh.compiled and fresh.optimizer is None and fresh.loss is None


# ------------------------------------------------------------------ shapes and layer arguments


@pytest.mark.parametrize("shape, exc, words", [
    ((-2, 8, 1), ValueError, r"Input: every dimension of shape must be >= 1, got \(-2, 8, 1\) \(-2 at index 0\)"),
    ((0, 8, 1), ValueError, r"Input: every dimension of shape must be >= 1, got \(0, 8, 1\)"),
    ((2.5, 8), TypeError, r"Input: shape must hold ints, got \(2.5, 8\) \(float 2.5 at index 0\)"),
    (("a", 8), TypeError, r"Input: shape must hold ints"),
    ("28x28", TypeError, r"Input: shape must be a tuple of ints"),
])
def test_input_shapes(shape, exc, words):
    with pytest.raises(exc, match=words):
        keras.Input(shape)


def test_an_input_may_leave_dimensions_unknown_as_keras():
    assert keras.Input((None, 8)).shape == (None, None, 8)


def test_layer_input_shape_and_build_shapes():
    with pytest.raises(ValueError, match=r"Dense 'd': every dimension of input_shape must be >= 1, got \(0, 2\)"):
        layers.Dense(3, input_shape=(0, 2), name="d")
    with pytest.raises(ValueError, match=r"Sequential 's': build: every dimension of input_shape must be >= 1"):
        keras.Sequential([layers.Dense(2)], name="s").build((None, 0))
    with pytest.raises(TypeError, match=r"Input: batch_size must be an int"):
        keras.Input((2,), batch_size=1.5)


@pytest.mark.parametrize("make, exc, words", [
    (lambda: layers.Dense(2.5), TypeError, r"Dense '\w+': units must be an int, got float 2.5"),
    (lambda: layers.Dense(0), ValueError, r"units must be a positive int, got 0"),
    (lambda: layers.Dense(True), TypeError, r"units must be an int, got bool"),
    (lambda: layers.Dense(2, use_bias="no"), TypeError, r"use_bias must be True or False"),
    (lambda: layers.Conv2D(2, 2.7), TypeError, r"Conv2D '\w+': kernel_size must be an int or a pair of ints"),
    (lambda: layers.Conv2D(2, (3, 3, 3)), ValueError, r"kernel_size must be an int or a pair"),
    (lambda: layers.Conv2D(2, 3, strides=0), ValueError, r"strides must be >= 1, got 0"),
    (lambda: layers.Conv2D(4, 3, groups=True), TypeError, r"groups must be an int"),
    (lambda: layers.MaxPooling2D(pool_size=(2, 0)), ValueError, r"MaxPooling2D '\w+': pool_size must be >= 1"),
    (lambda: layers.Dropout(np.float32(1.0)), ValueError, r"Dropout '\w+': rate must be in \[0, 1\), got 1"),
    (lambda: layers.Dropout(float("nan")), ValueError, r"rate must be a finite number"),
    (lambda: layers.BatchNormalization(epsilon=float("nan")), ValueError, r"epsilon must be a finite number"),
    (lambda: layers.BatchNormalization(epsilon=0), ValueError, r"epsilon must be > 0, got 0"),
    (lambda: layers.BatchNormalization(momentum=1.5), ValueError, r"momentum must be in \[0, 1\], got 1.5"),
    (lambda: layers.BatchNormalization(axis=1.0), TypeError, r"axis must be an int"),
    (lambda: layers.ReLU(negative_slope=float("nan")), ValueError, r"ReLU '\w+': negative_slope must be a finite"),
    (lambda: layers.ReLU(max_value=0), ValueError, r"max_value must be > 0, got 0"),
    (lambda: layers.LeakyReLU(negative_slope=-1), ValueError, r"LeakyReLU '\w+': negative_slope must be >= 0"),
    (lambda: layers.ELU(alpha="1"), TypeError, r"ELU '\w+': alpha must be a number"),
    (lambda: layers.Softmax(axis="last"), TypeError, r"Softmax '\w+': axis must be an int"),
    (lambda: layers.Flatten(data_format="NHWC"), ValueError, r"Flatten '\w+': data_format must be one of"),
    (lambda: layers.GlobalAveragePooling2D(keepdims="yes"), TypeError, r"keepdims must be True or False"),
    (lambda: layers.Dense(2, name=3), TypeError, r"Dense: name must be a str"),
])
def test_layer_constructor_arguments(make, exc, words):
    with pytest.raises(exc, match=words):
        make()


def test_too_large_weights_are_refused_before_allocation():
    m = keras.Sequential([keras.Input((8,)), layers.Dense(4, name="ok")], name="m")
    before = [w.copy() for w in m.get_weights()]
    huge = layers.Dense(2**40, name="huge")
    with pytest.raises(dnnbind.AllocationTooLargeError,
                       match=r"Dense 'huge': weight 'kernel' of shape \(4, 1099511627776\) \(float32\) needs "
                             r"17,592,186,044,416 bytes \(16.00 TB\), more than the .* available on the host; "
                             r"use fewer units"):
        m.add(huge)
    assert issubclass(dnnbind.AllocationTooLargeError, MemoryError)
    # the failed add left neither the layer nor half-made weights behind
    assert [layer.name for layer in m.layers] == ["ok"] and m.built
    assert not huge.built and huge._weights == []
    assert all(np.array_equal(a, b) for a, b in zip(m.get_weights(), before))
    conv = layers.Conv2D(2**36, 3, name="wide")
    with pytest.raises(MemoryError, match=r"Conv2D 'wide': weight 'kernel' of shape \(3, 3, 2, 68719476736\)"):
        keras.Sequential([keras.Input((8, 8, 2)), conv])


# ------------------------------------------------------------------ kernels.optim hyper-parameters


def _sgd(**kw):
    p = np.ones(3, np.float32)
    kernels.sgd_update([p], [np.ones(3, np.float32)], [np.zeros(3, np.float32)], **{"lr": 0.1, **kw})
    return p


@pytest.mark.parametrize("kw, exc, words", [
    ({"lr": float("nan")}, ValueError, "sgd_update: lr must be a finite number, got nan"),
    ({"lr": float("inf")}, ValueError, "sgd_update: lr must be a finite number, got inf"),
    ({"lr": -0.1}, ValueError, r"sgd_update: lr must be >= 0, got -0.1"),
    ({"momentum": 1.5}, ValueError, r"sgd_update: momentum must be in \[0, 1\], got 1.5"),
    ({"momentum": float("nan")}, ValueError, "momentum must be a finite number"),
    ({"weight_decay": -1.0}, ValueError, "weight_decay must be >= 0"),
    ({"grad_scale": 0.0}, ValueError, "grad_scale must be > 0"),
    ({"nesterov": "yes"}, TypeError, "nesterov must be True or False"),
])
def test_sgd_hyper_parameters(kw, exc, words):
    p = np.ones(3, np.float32)
    with pytest.raises(exc, match=words):
        kernels.sgd_update([p], [np.ones(3, np.float32)], [np.zeros(3, np.float32)], **{"lr": 0.1, **kw})
    assert np.array_equal(p, np.ones(3))  # nothing ran


def test_adam_and_rmsprop_hyper_parameters():
    p, g, z = np.ones(3, np.float32), np.ones(3, np.float32), np.zeros(3, np.float32)
    adam = dict(lr=0.1, step=1)
    for kw, words in (({"beta1": 1.0}, r"adam_update: beta1 must be in \[0, 1\), got 1"),
                      ({"beta2": float("nan")}, "beta2 must be a finite number"),
                      ({"epsilon": -1e-7}, "epsilon must be >= 0"),
                      ({"step": 0}, "step must be >= 1, got 0"),
                      ({"lr": np.float32("nan")}, "lr must be a finite number")):
        with pytest.raises(ValueError, match=words):
            kernels.adam_update([p], [g], [z.copy()], [z.copy()], **{**adam, **kw})
    for kw, words in (({"rho": 1.5}, r"rmsprop_update: rho must be in \[0, 1\], got 1.5"),
                      ({"epsilon": float("inf")}, "epsilon must be a finite number"),
                      ({"centered": None}, "centered must be True or False")):
        with pytest.raises((ValueError, TypeError), match=words):
            kernels.rmsprop_update([p], [g], [z.copy()], lr=0.1, **kw)
    assert np.array_equal(p, np.ones(3))
    # a 0-d array lr (what a captured CUDA graph reads on replay) is left to the caller
    kernels.sgd_update([p], [g], None, lr=np.array(0.5, np.float32))
    assert np.allclose(p, 0.5)
    # 0-d NumPy arrays are fine for the float hyper-parameters
    assert np.allclose(_sgd(momentum=np.array(0.9)), 0.9)


# ------------------------------------------------------------------ cuDNN handles: no bare ints


def test_descriptors_refuse_bare_int_handles():
    # 0xDEADBEEF used to reach cudnnDropoutGetStatesSize and crash the process
    with pytest.raises(TypeError, match=r"DropoutDescriptor: handle must be a dnnbind.cudnn.Handle, got the bare "
                                        r"int 0xdeadbeef.*Handle.borrow\(raw\)"):
        cd.DropoutDescriptor(0xDEADBEEF, 0.5)
    with pytest.raises(TypeError, match=r"DropoutDescriptor.states_size: handle must be a dnnbind.cudnn.Handle"):
        cd.DropoutDescriptor.states_size(0xDEADBEEF)
    with pytest.raises(TypeError, match=r"handle must be a dnnbind.cudnn.Handle \(cudnn.Handle\(\) or "
                                        r"cudnn.get_handle\(\)\), got str"):
        cd.DropoutDescriptor("handle", 0.5)
    x = cd.TensorDescriptor((1, 2, 4, 4), "float32")
    w = cd.FilterDescriptor((2, 2, 3, 3), "float32")
    with pytest.raises(TypeError, match=r"forward_output_dim: x_desc must be a dnnbind.cudnn.TensorDescriptor, got"):
        cd.ConvolutionDescriptor().forward_output_dim(x.handle, w)
    with pytest.raises(TypeError, match=r"forward_output_dim: w_desc must be a dnnbind.cudnn.FilterDescriptor"):
        cd.ConvolutionDescriptor().forward_output_dim(x, w.handle)
    with pytest.raises(TypeError, match=r"PoolingDescriptor.forward_output_dim: x_desc must be"):
        cd.PoolingDescriptor().forward_output_dim(x.handle)
    with pytest.raises(TypeError, match=r"reserve_space_size: x_desc must be"):
        cd.DropoutDescriptor.reserve_space_size(x.handle)


def test_borrow_wraps_a_raw_handle_without_owning_it(monkeypatch):
    calls = []
    monkeypatch.setattr(C, "raw", lambda name: (lambda *a: calls.append(name) or 0))
    monkeypatch.setattr(C, "cudnnGetStream", lambda h, out: None, raising=False)
    handle = cd.Handle.borrow(0x1234, device=0)
    assert isinstance(handle, cd.Handle) and not handle.owned and handle.handle == 0x1234
    assert cd._handle.require_handle(handle, "op") is handle
    handle.close()
    del handle
    gc.collect()
    assert "cudnnDestroy" not in calls
    with pytest.raises(TypeError, match=r"Handle.from_handle needs a cudnnHandle_t as an int, got bool True"):
        cd.Handle.borrow(True)
    with pytest.raises(ValueError, match="non-null"):
        cd.Handle.borrow(0)
