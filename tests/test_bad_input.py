"""Bad input: each case is a clear Python error naming the model/layer and what was expected."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind
import dnnbind as keras
from dnnbind import layers


pytestmark = pytest.mark.usefixtures("cpu")  # the NumPy backend (conftest.py)


@pytest.fixture
def model():
    m = keras.Sequential([keras.Input((4, 4, 1)), layers.Conv2D(2, 3, name="conv_a"), layers.Flatten(),
                          layers.Dense(3, activation="softmax", name="out")], name="net")
    m.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return m


def test_input_shape_mismatch(model):
    # (2, 4, 4) would be taken, as Keras 3 adds the trailing axis of 1 (Functional._adjust_input_rank)
    with pytest.raises(ValueError, match=r"'net'.*'conv_a' \(Conv2D\).*\(batch, 4, 4, 1\), got \(2, 4, 4, 2\)"):
        model.fit(np.zeros((2, 4, 4, 2)), np.zeros(2), verbose=0)
    with pytest.raises(ValueError, match=r"\(batch, 4, 4, 1\), got \(2, 16\)"):
        model.fit(np.zeros((2, 16)), np.zeros(2), verbose=0)
    with pytest.raises(ValueError, match=r"expects input of shape \(batch, 4, 4, 1\), got \(2, 5, 5, 1\)"):
        model.predict(np.zeros((2, 5, 5, 1)), verbose=0)


def test_wrong_dtype(model):
    with pytest.raises(TypeError, match="numeric input data.*dtype <U1"):
        model.fit(np.full((2, 4, 4, 1), "a"), np.zeros(2), verbose=0)
    with pytest.raises(TypeError, match="numeric input data.*object"):
        model.predict(np.array([None, None], dtype=object), verbose=0)
    with pytest.raises(TypeError, match="labels must be integer class indices, got dtype <U"):
        model.fit(np.zeros((2, 4, 4, 1)), np.array(["a", "b"]), verbose=0)


def test_labels_out_of_range_or_wrong_shape(model):
    x = np.zeros((3, 4, 4, 1))
    with pytest.raises(ValueError, match=r"labels must be in \[0, 3\).*\[0, 3\]"):
        model.fit(x, np.array([0, 1, 3]), verbose=0)
    with pytest.raises(ValueError, match=r"labels must be in \[0, 3\).*\[-1, 1\]"):
        model.evaluate(x, np.array([0, 1, -1]), verbose=0)
    with pytest.raises(ValueError, match=r"shape \(batch,\), got shape \(3, 2\)"):
        model.fit(x, np.zeros((3, 2)), verbose=0)
    with pytest.raises(ValueError, match="non-integer"):
        model.fit(x, np.array([0.5, 1, 2]), verbose=0)


def test_length_mismatch(model):
    with pytest.raises(ValueError, match="3 input samples but 2 targets"):
        model.fit(np.zeros((3, 4, 4, 1)), np.zeros(2), verbose=0)


def test_fit_before_compile():
    m = keras.Sequential([keras.Input((2,)), layers.Dense(1)], name="raw")
    with pytest.raises(dnnbind.DnnbindError, match=r"'raw'.*compile\(optimizer, loss, metrics\) before fit\(\)"):
        m.fit(np.zeros((2, 2)), np.zeros(2))
    with pytest.raises(dnnbind.DnnbindError, match="before evaluate"):
        m.evaluate(np.zeros((2, 2)), np.zeros(2))
    assert m.predict(np.ones((2, 2)), verbose=0).shape == (2, 1)  # predict needs no compile


def test_unknown_names():
    m = keras.Sequential([keras.Input((2,)), layers.Dense(1)])
    with pytest.raises(ValueError, match="unknown loss 'crossentropy'; known losses: .*mse"):
        m.compile("adam", "crossentropy")
    with pytest.raises(ValueError, match="unknown optimizer 'adamix'; known optimizers: adadelta, adafactor, adagrad"):
        m.compile("adamix", "mse")
    with pytest.raises(ValueError, match="unknown metric 'f2_score'; known metrics: acc, accuracy"):
        m.compile("adam", "mse", metrics=["f2_score"])
    m.compile("adam")  # Keras 3: a loss may come from add_loss or a custom train_step
    with pytest.raises(ValueError, match="[Nn]o loss to compute. Provide a `loss` argument in `compile\\(\\)`"):
        m.fit(np.ones((4, 2), np.float32), np.ones((4, 1), np.float32), verbose=0)


def test_set_weights_wrong_shapes(model):
    ws = model.get_weights()
    with pytest.raises(ValueError, match=r"layer 'conv_a' \(Conv2D\): weight 'kernel' expects shape \(3, 3, 1, 2\)"):
        model.set_weights([np.zeros((2, 1, 3, 3))] + ws[1:])
    with pytest.raises(ValueError, match="expects 4 arrays, got 3"):
        model.set_weights(ws[:3])
    with pytest.raises(ValueError, match=r"layer 'out' \(Dense\): weight 'bias' expects shape \(3,\)"):
        model.layers[-1].set_weights([ws[2], np.zeros(4)])
    # nothing was changed by the failed calls
    for a, b in zip(model.get_weights(), ws):
        assert np.array_equal(a, b)


def test_bad_layer_arguments():
    with pytest.raises(ValueError, match="Conv2D.*filters must be a positive int"):
        layers.Conv2D(0, 3)
    with pytest.raises(ValueError, match="padding must be 'valid' or 'same'"):
        layers.Conv2D(2, 3, padding="full")
    with pytest.raises(ValueError, match="data_format must be"):
        layers.MaxPooling2D(data_format="NHWC")
    with pytest.raises(ValueError, match="Dropout.*rate must be in"):
        layers.Dropout(1.5)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        layers.Dense(2, unit=3)
    with pytest.raises(ValueError, match=r"Conv2D 'c'.*input 2x2 is too small"):
        keras.Sequential([keras.Input((2, 2, 1)), layers.Conv2D(1, 3, name="c")])
    with pytest.raises(ValueError, match="4-d inputs"):
        keras.Sequential([keras.Input((5,)), layers.Conv2D(1, 3)])


def test_nan_loss_is_reported():
    # finite data whose loss overflows float32 (NaN/inf in x itself are refused before training)
    m = keras.Sequential([keras.Input((2,)), layers.Dense(1, kernel_initializer="ones")])
    m.compile("sgd", "mse")
    with pytest.warns(RuntimeWarning, match="epoch 1: the loss is inf"):
        m.fit(np.full((4, 2), 1e20, np.float32), np.zeros(4), verbose=0)


def test_step_counts_are_honoured_not_ignored(model):
    x, y = np.arange(64, dtype=np.float32).reshape(4, 4, 4, 1) / 64, np.array([0, 1, 2, 0])
    assert model.predict(x, batch_size=2, steps=1, verbose=0).shape[0] == 2
    assert model.evaluate(x, y, batch_size=2, steps=1, verbose=0) == pytest.approx(
        model.evaluate(x[:2], y[:2], verbose=0), rel=1e-6)
    history = model.fit(x, y, batch_size=2, steps_per_epoch=1, validation_data=(x, y), validation_steps=1,
                        verbose=0)
    assert {"loss", "val_loss"} <= set(history.history) and len(history.history["loss"]) == 1


# ----- messages that named the wrong thing, or nothing (issue 26) -------------------------------------
def test_a_keras_file_without_its_weights_says_so(tmp_path):
    import zipfile

    model = keras.Sequential([keras.Input((4,)), layers.Dense(3)])
    model.save(tmp_path / "full.keras")
    with zipfile.ZipFile(tmp_path / "full.keras") as src, zipfile.ZipFile(tmp_path / "cut.keras", "w") as dst:
        for name in ("config.json", "metadata.json"):
            dst.writestr(name, src.read(name))
    with pytest.raises(dnnbind.saving.SavingError, match=r"cut\.keras is a Keras 3 model file \(\.keras\) without "
                                                         r"model\.weights\.h5: it holds config\.json, metadata\.json"):
        keras.load_model(tmp_path / "cut.keras")


def test_an_empty_or_foreign_weights_h5_names_the_format_it_expected(tmp_path):
    model = keras.Sequential([keras.Input((4,)), layers.Dense(3)])
    (tmp_path / "empty.weights.h5").write_bytes(b"")
    with pytest.raises(dnnbind.saving.SavingError, match=r"empty\.weights\.h5 is empty \(0 bytes\), not an HDF5 file "
                                                         r"\(a Keras 3 \.weights\.h5 weights file\)"):
        model.load_weights(tmp_path / "empty.weights.h5")
    (tmp_path / "text.weights.h5").write_bytes(b"hello, world")
    with pytest.raises(dnnbind.saving.SavingError, match=r"is not an HDF5 file .*, as its name says, nor safetensors: "
                                                         r"it starts with the bytes 68 65 6c 6c"):
        model.load_weights(tmp_path / "text.weights.h5")
    (tmp_path / "empty.keras").write_bytes(b"")
    with pytest.raises(dnnbind.saving.SavingError, match=r"empty\.keras is not a dnnbind model file nor a Keras 3 "
                                                         r"\.keras file \(both are zips\): it is empty \(0 bytes\)"):
        keras.load_model(tmp_path / "empty.keras")


def test_a_py_dataset_whose_len_is_not_an_int_is_told_so(model):
    class Batches(dnnbind.utils.PyDataset):
        def __len__(self):
            return 2.5

        def __getitem__(self, index):
            return np.zeros((2, 4, 4, 1), np.float32), np.zeros(2)

    with pytest.raises(TypeError, match=r"Batches\.__len__\(\) must return the number of batches per epoch as an int, "
                                        r"got 2\.5 \(float\)"):
        model.fit(Batches(), verbose=0)


def test_non_integer_padding_is_named_not_iterated():
    x, w = np.zeros((1, 3, 8, 8), np.float32), np.zeros((4, 3, 3, 3), np.float32)
    for call, op in ((lambda: dnnbind.kernels.conv2d_forward(x, w, padding=1.5), "conv2d_forward"),
                     (lambda: dnnbind.kernels.pool2d_forward(x, padding=1.5), "pool2d_forward")):
        with pytest.raises(TypeError, match=rf"{op}: padding must be 'valid', 'same', an int, a pair or a 4-tuple of "
                                            r"ints, got 1\.5 \(float\)"):
            call()
    with pytest.raises(TypeError, match=r"conv2d_forward: padding .* got \(1\.5, 1\) \(holding float, int\)"):
        dnnbind.kernels.conv2d_forward(x, w, padding=(1.5, 1))  # was truncated to (1, 1)
    with pytest.raises(TypeError, match=r"conv2d_forward: stride must be an int or a pair of ints, got '2'"):
        dnnbind.kernels.conv2d_forward(x, w, stride="2")
    with pytest.raises(TypeError, match=r"ConvolutionDescriptor: pad must be an int or a sequence of ints \(one per "
                                        r"spatial axis\), got 1\.5 \(float\)"):
        dnnbind.cudnn.ConvolutionDescriptor(pad=1.5)
    with pytest.raises(TypeError, match=r"PoolingDescriptor: pad must be an int or a sequence of ints"):
        dnnbind.cudnn.PoolingDescriptor(pad=1.5)


def test_a_read_only_out_array_is_named_before_any_work():
    x, w = np.ones((1, 3, 8, 8), np.float32), np.ones((4, 3, 3, 3), np.float32)
    out = np.zeros((1, 4, 6, 6), np.float32)
    out.flags.writeable = False
    with pytest.raises(ValueError, match=r"conv2d_forward: out \(shape \(1, 4, 6, 6\), float32\) is read-only .*pass "
                                         r"a writeable array"):
        dnnbind.kernels.conv2d_forward(x, w, out=out)
    with pytest.raises(ValueError, match=r"activation_forward: out .* is read-only"):
        dnnbind.kernels.activation_forward(x, "relu", out=np.broadcast_to(np.zeros((), np.float32), x.shape))


def test_a_save_onto_a_read_only_file_system_names_the_target(tmp_path, monkeypatch):
    import errno

    from dnnbind import _files, saving_lib

    def read_only(path, mode):
        raise OSError(errno.EROFS, "Read-only file system", path)

    monkeypatch.setattr(_files, "create_exclusive", read_only)
    monkeypatch.setattr(saving_lib, "create_exclusive", read_only)
    model = keras.Sequential([keras.Input((4,)), layers.Dense(3)])
    for target in (tmp_path / "m.dnnbind", tmp_path / "w.safetensors", tmp_path / "ckpt"):
        save = model.save_weights if target.suffix == ".safetensors" else model.save
        with pytest.raises(OSError, match=rf"cannot save {target}: Read-only file system \(a save first writes "
                                          r"\S+ in .*, then renames it") as raised:
            save(target)
        assert raised.value.errno == errno.EROFS and raised.value.filename == str(target)


def test_descriptor_values_cudnn_would_take_silently_or_refuse_without_words():
    with pytest.raises(ValueError, match=r"ActivationDescriptor: coef must be a finite number .*got nan"):
        dnnbind.cudnn.ActivationDescriptor("clipped_relu", coef=float("nan"))
    with pytest.raises(ValueError, match=r"clipped_relu needs a positive ceiling coef, got -1"):
        dnnbind.cudnn.ActivationDescriptor("clipped_relu", coef=-1)
    x_desc = dnnbind.cudnn.TensorDescriptor((1, 3, 2, 2), "float32")
    w_desc = dnnbind.cudnn.FilterDescriptor((4, 3, 5, 5), "float32")
    with pytest.raises(ValueError, match=r"the kernel spans 5 along spatial axis 0 \(size 5, dilation 1\) but the input "
                                         r"is 2 \+ 2 x 1 padding = 4 there: the output would be empty \(x \(1, 3, 2, 2\) "
                                         r"NCHW, w \(4, 3, 5, 5\) NCHW"):
        dnnbind.cudnn.ConvolutionDescriptor(pad=1).forward_output_dim(x_desc, w_desc)
    assert dnnbind.cudnn.ConvolutionDescriptor(pad=2).forward_output_dim(x_desc, w_desc) == (1, 4, 2, 2)
