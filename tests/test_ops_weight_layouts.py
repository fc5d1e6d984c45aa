"""A user's layer written in keras.ops, on the NumPy backend: its fresh convolution kernel moves once to the
convolution's filter layout (Variable.relayout), so no step transposes it, while everything a user sees stays
in Keras's layout; under a mixed policy its weights are read from the trainer's one multi-tensor cast."""

from __future__ import annotations

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, ops
from dnnbind.autodiff.tensor import TransposedView
from testutil import numerical_grad


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


class OpsConv(layers.Layer):
    def __init__(self, filters, **kwargs):
        super().__init__(**kwargs)
        self.filters = filters

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(3, 3, input_shape[-1], self.filters), name="kernel")
        self.bias = self.add_weight(shape=(self.filters,), initializer="random_normal", name="bias")

    def call(self, x):
        return ops.relu(ops.conv(x, self.kernel, padding="same") + self.bias)


def _reference_conv(x, k, b):
    """NumPy: 'same' 3x3 cross-correlation, NHWC, Keras kernel (3, 3, in, out), then bias and relu."""
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    n, h, w, _ = x.shape
    out = np.zeros((n, h, w, k.shape[-1]), np.float64)
    for i in range(3):
        for j in range(3):
            out += np.einsum("nhwc,ck->nhwk", xp[:, i:i + h, j:j + w], k[i, j])
    return np.maximum(out + b, 0)


def test_a_fresh_kernel_moves_to_the_filter_layout_and_still_speaks_keras(rng):
    layer = OpsConv(4)
    x = rng.standard_normal((2, 5, 6, 3)).astype(np.float32)
    y = layer(x)
    k = layer.kernel
    assert k.shape == (3, 3, 3, 4) and tuple(k.value.shape) == (4, 3, 3, 3)  # stored KRSC
    keras_values = k.numpy()
    assert keras_values.shape == (3, 3, 3, 4)
    np.testing.assert_allclose(np.asarray(y), _reference_conv(x, keras_values, layer.bias.numpy()), rtol=1e-5,
                               atol=1e-5)
    # reads in ops see the Keras layout (a lazy view of the storage)
    read = ops.convert_to_tensor(k)
    assert isinstance(read, TransposedView) and read.shape == (3, 3, 3, 4)
    np.testing.assert_array_equal(np.asarray(read), keras_values)
    np.testing.assert_array_equal(np.asarray(ops.sum(k, axis=(0, 1, 2))), keras_values.sum(axis=(0, 1, 2)))
    # assign / get_weights / set_weights speak the Keras layout
    new = rng.standard_normal((3, 3, 3, 4)).astype(np.float32)
    k.assign(new)
    np.testing.assert_array_equal(k.numpy(), new)
    layer.set_weights([new * 2, layer.bias.numpy()])
    np.testing.assert_array_equal(layer.get_weights()[0], new * 2)
    np.testing.assert_allclose(np.asarray(layer(x)), _reference_conv(x, new * 2, layer.bias.numpy()), rtol=1e-5,
                               atol=1e-5)


def test_tape_gradients_come_in_the_keras_layout_and_are_right(rng):
    keras.utils.set_random_seed(3)
    layer = OpsConv(2, dtype="float64")
    x = rng.standard_normal((2, 4, 4, 3))
    layer(x)  # builds; the kernel moves
    assert tuple(layer.kernel.value.shape) == (2, 3, 3, 3)
    with keras.GradientTape() as tape:
        loss = ops.sum(ops.square(layer(x)))
    gk, gb = tape.gradient(loss, [layer.kernel, layer.bias])
    assert gk.shape == (3, 3, 3, 2) and gb.shape == (2,)
    k0, b0 = layer.kernel.numpy(), layer.bias.numpy()

    np.testing.assert_allclose(np.asarray(gk), numerical_grad(lambda: float(np.sum(_reference_conv(x, k0, b0) ** 2)),
                                                              k0), rtol=1e-5, atol=1e-6)
    # optimizer.apply takes the Keras-layout gradients
    opt = keras.optimizers.SGD(0.1)
    opt.apply([gk, gb], [layer.kernel, layer.bias])
    np.testing.assert_allclose(layer.kernel.numpy(), k0 - 0.1 * np.asarray(gk), rtol=1e-6)  # lr in float32


def test_no_move_once_a_tape_or_an_optimizer_has_seen_the_kernel(rng):
    x = rng.standard_normal((1, 4, 4, 2)).astype(np.float32)
    layer = OpsConv(3)
    layer.build(x.shape)
    with keras.GradientTape() as tape:
        reg = ops.sum(ops.square(ops.convert_to_tensor(layer.kernel)))  # read on the tape before the conv
        loss = ops.sum(layer(x)) + reg
    assert tuple(layer.kernel.value.shape) == (3, 3, 2, 3)  # stays in the Keras layout
    g = tape.gradient(loss, layer.kernel)
    assert g.shape == (3, 3, 2, 3)

    other = OpsConv(3)
    other.build(x.shape)
    opt = keras.optimizers.Adam(1e-3)
    opt.apply([np.ones((3, 3, 2, 3), np.float32), np.ones(3, np.float32)], [other.kernel, other.bias])
    other(x)
    assert tuple(other.kernel.value.shape) == (3, 3, 2, 3)  # the optimizer's slots follow the old layout
    with pytest.raises(RuntimeError, match="cannot change its layout"):
        other.kernel.relayout((3, 0, 1, 2))


def test_a_model_of_ops_layers_trains_like_the_same_model_of_dnnbind_layers(rng):
    x = rng.standard_normal((8, 6, 6, 2)).astype(np.float32)
    y = rng.integers(0, 3, 8).astype(np.int32)

    def build(kind):
        keras.utils.set_random_seed(0)
        conv = OpsConv(4) if kind == "ops" else layers.Conv2D(4, 3, padding="same", activation="relu")
        model = keras.Sequential([keras.Input((6, 6, 2)), conv, layers.Flatten(), layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.Adam(1e-2),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    ref, mine = build("layers"), build("ops")
    mine.set_weights(ref.get_weights())
    for _ in range(3):
        np.testing.assert_allclose(float(mine.train_on_batch(x, y)), float(ref.train_on_batch(x, y)), rtol=1e-5)
    for a, b in zip(mine.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.gpu
def test_mixed_precision_reads_take_the_precast_copies(rng, monkeypatch):
    # on the GPU (the NumPy backend computes mixed policies in float32: nothing to cast there)
    from dnnbind.ops import _core

    keras.set_default_device("cuda")
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        keras.utils.set_random_seed(0)
        layer = OpsConv(4)
        model = keras.Sequential([keras.Input((6, 6, 2)), layer, layers.Flatten(), layers.Dense(3)])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        x = rng.standard_normal((8, 6, 6, 2)).astype(np.float32)
        y = rng.integers(0, 3, 8).astype(np.int32)
        model.train_on_batch(x, y)  # casts per read, and notes them for the next step's precast
        assert set(layer._cast_weights) == {layer.kernel, layer.bias}
        casts = []
        real = _core._cast_op
        monkeypatch.setattr(_core, "_cast_op", lambda t, dt: casts.append(dt) or real(t, dt))
        before = layer.kernel.numpy()
        loss = float(model.train_on_batch(x, y))
        assert casts == []  # both weights came from the multi-tensor cast; their gradients stayed bf16
        assert np.isfinite(loss) and not np.array_equal(layer.kernel.numpy(), before)
        assert layer._precast is None and "_precast_reads" not in layer.__dict__  # nothing outlives the step
        # the same steps with the casts per read (no precast) give the same loss
        keras.utils.set_random_seed(0)
        twin = keras.Sequential([keras.Input((6, 6, 2)), OpsConv(4), layers.Flatten(), layers.Dense(3)])
        twin.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        twin.set_weights(model.get_weights())
        model.set_weights(twin.get_weights())
        monkeypatch.setattr(_core, "_cast_op", real)
        a, b = float(model.train_on_batch(x, y)), float(twin.train_on_batch(x, y))
        assert abs(a - b) <= 2e-2 * abs(b)
    finally:
        keras.mixed_precision.set_global_policy("float32")
        keras.set_default_device("cpu")


# ------------------------------------------------------------------ conv + bias + relu as one node
def _conv_ref(x, k, b=None, relu=False, fmt="channels_last"):
    if fmt == "channels_first":
        x = np.transpose(x, (0, 2, 3, 1))
    y = _reference_conv(x, k, np.zeros(k.shape[-1]) if b is None else b.reshape(-1))
    if not relu:  # _reference_conv applies relu: undo by recomputing without it
        xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
        n, h, w, _ = x.shape
        y = sum(np.einsum("nhwc,ck->nhwk", xp[:, i:i + h, j:j + w], k[i, j]) for i in range(3) for j in range(3))
        y = y + (0 if b is None else b.reshape(-1))
    return np.transpose(y, (0, 3, 1, 2)) if fmt == "channels_first" else y


@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
def test_conv_bias_relu_fold_into_one_node_with_the_right_values_and_gradients(rng, fmt):
    from dnnbind.ops._conv import PendingConv

    x = rng.standard_normal((2, 4, 5, 3) if fmt == "channels_last" else (2, 3, 4, 5))
    k = rng.standard_normal((3, 3, 3, 2))
    b = rng.standard_normal((2,) if fmt == "channels_last" else (2, 1, 1))
    xt, kt, bt = (ops.convert_to_tensor(v) for v in (x, k, b))
    with keras.GradientTape(persistent=True) as tape:
        for t in (xt, kt, bt):
            tape.watch(t)
        y = ops.relu(ops.conv(xt, kt, padding="same", data_format=fmt) + bt)
        loss = ops.sum(ops.square(y))
    assert type(y) is PendingConv and y.act == "relu" and y._node.name == "conv_bias_relu"
    unread = ops.relu(ops.conv(xt, kt, padding="same", data_format=fmt) + bt)
    assert unread.shape == _conv_ref(x, k, b, True, fmt).shape and unread._made is None  # shape known unread
    np.testing.assert_allclose(np.asarray(y), _conv_ref(x, k, b, True, fmt), rtol=1e-10, atol=1e-10)
    gx, gk, gb = tape.gradient(loss, [xt, kt, bt])
    for got, arr in ((gx, x), (gk, k), (gb, b)):
        want = numerical_grad(lambda: float(np.sum(_conv_ref(x, k, b, True, fmt) ** 2)), arr)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_an_intermediate_used_elsewhere_keeps_its_own_gradient(rng):
    x = rng.standard_normal((2, 4, 4, 2))
    k = rng.standard_normal((3, 3, 2, 3))
    b = rng.standard_normal(3)
    xt, kt, bt = (ops.convert_to_tensor(v) for v in (x, k, b))
    with keras.GradientTape() as tape:
        tape.watch(kt)
        tape.watch(bt)
        z = ops.conv(xt, kt, padding="same")
        fused = ops.relu(z + bt)              # one fused node ...
        loss = ops.sum(fused) + ops.sum(ops.square(z))  # ... and the plain convolution, read on its own
    gk, gb = tape.gradient(loss, [kt, bt])

    def f():
        return float(np.sum(_conv_ref(x, k, b, True)) + np.sum(_conv_ref(x, k) ** 2))

    np.testing.assert_allclose(np.asarray(gk), numerical_grad(f, k), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(gb), numerical_grad(f, b), rtol=1e-5, atol=1e-6)


def test_no_fold_for_a_bias_of_another_shape_or_a_read_convolution(rng):
    from dnnbind.ops._conv import PendingConv

    x = ops.convert_to_tensor(rng.standard_normal((1, 4, 4, 2)).astype(np.float32))
    k = ops.convert_to_tensor(rng.standard_normal((3, 3, 2, 3)).astype(np.float32))
    z = ops.conv(x, k)
    full = ops.convert_to_tensor(rng.standard_normal((2, 2, 3)).astype(np.float32))
    y = z + full  # broadcast over the batch only: an ordinary add
    assert type(y) is not PendingConv
    np.testing.assert_allclose(np.asarray(y), np.asarray(z) + np.asarray(full), rtol=1e-6)
    z2 = ops.conv(x, k)
    np.asarray(z2)  # read: the convolution ran on its own
    b = ops.convert_to_tensor(np.arange(3, dtype=np.float32))
    assert type(z2 + b) is not PendingConv
    with pytest.raises(ValueError, match="conv"):
        ops.conv(x, ops.convert_to_tensor(np.ones((3, 3, 5, 3), np.float32)))  # checked at the call, not the read


def test_second_order_gradients_through_the_fused_node(rng):
    x = rng.standard_normal((1, 3, 3, 2))
    k = rng.standard_normal((3, 3, 2, 2))
    b = rng.standard_normal(2)
    kt = ops.convert_to_tensor(k)
    bt = ops.convert_to_tensor(b)

    def grad_norm(fuse):
        xt = ops.convert_to_tensor(x)
        with keras.GradientTape() as outer:
            outer.watch(kt)
            with keras.GradientTape() as inner:
                inner.watch(xt)
                z = ops.conv(xt, kt, padding="same")
                y = ops.relu(z + bt) if fuse else ops.maximum(ops.add(np.asarray(z), 0.0) * 0 + z + bt, 0.0)
                loss = ops.sum(ops.square(y))
            gx = inner.gradient(loss, xt)
            norm = ops.sum(ops.square(gx))
        return np.asarray(outer.gradient(norm, kt))

    np.testing.assert_allclose(grad_norm(True), grad_norm(False), rtol=1e-8, atol=1e-10)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, tol", [("float32", 2e-3), ("float16", 2e-2), ("bfloat16", 6e-2)])  # float32: TF32 convs
@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
def test_fused_conv_bias_relu_on_the_device_matches_numpy(rng, dtype, tol, fmt):
    from dnnbind import backend
    from dnnbind.ops._conv import PendingConv

    x = rng.standard_normal((4, 9, 7, 8) if fmt == "channels_last" else (4, 8, 9, 7))
    k = rng.standard_normal((3, 3, 8, 16)) * 0.3
    b = rng.standard_normal((16,) if fmt == "channels_last" else (16, 1, 1))
    want = _conv_ref(x, k, b, True, fmt)

    def run(device):
        xs = [ops.convert_to_tensor(backend.asarray(v.astype(np.float32), device)) for v in (x, k, b)]
        xs = [ops.cast(v, dtype) for v in xs]
        with keras.GradientTape() as tape:
            for t in xs:
                tape.watch(t)
            y = ops.relu(ops.conv(xs[0], xs[1], padding="same", data_format=fmt) + xs[2])
            loss = ops.sum(ops.square(ops.cast(y, "float32")))
        assert type(y) is PendingConv and y.act == "relu"
        return [np.asarray(ops.cast(v, "float32")) for v in [y, *tape.gradient(loss, xs)]]

    got = run("cuda")
    scale = np.max(np.abs(want))
    assert np.max(np.abs(got[0] - want)) <= tol * scale
    ref = run("cpu") if dtype == "float32" else None
    if ref is not None:
        for g, r in zip(got[1:], ref[1:]):
            assert np.max(np.abs(g - r)) <= 5e-3 * max(np.max(np.abs(r)), 1e-6)
    for g in got[1:]:
        assert np.all(np.isfinite(g)) and np.any(g != 0)
