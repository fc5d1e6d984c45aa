"""The image augmentation and preprocessing layers (``layers/image_preprocessing.py``): shapes, the
inference identity, value ranges, seeds, fixed transformations against real Keras 3 (its JAX backend,
in a subprocess, applying the same transformation dicts) and against hand-made NumPy references,
gradients, configs and bad arguments."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, ops
from dnnbind.autodiff import GradientTape
from dnnbind.layers.image_preprocessing import rotation_matrix
from keras_aux import keras_available
from testutil import numerical_grad


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def _images(shape=(4, 5, 6, 2), seed=0, dtype="float32"):
    return np.random.default_rng(seed).uniform(0, 255, size=shape).astype(dtype)


def _np(t):
    return np.asarray(t)


# ------------------------------------------------------------------- fixed transformations vs Keras
ANGLES = [-30.0, 10.0, 45.0, 90.0]
FLIPS = np.array([True, False, True, False]).reshape(4, 1, 1, 1)
ZOOMS = (np.array([[0.7], [1.3], [1.0], [0.9]], np.float32), np.array([[1.2], [0.8], [1.1], [1.0]], np.float32))
TRANSLATIONS = np.array([[1.5, -2.0], [0.0, 1.0], [-3.0, 0.5], [2.0, 2.0]], np.float32)
CONTRAST = np.array([0.5, 1.2, 1.0, 1.4], np.float32).reshape(4, 1, 1, 1)
BRIGHTNESS = np.array([-30.0, 20.0, 0.0, 60.0], np.float32).reshape(4, 1, 1, 1)
AFFINE_CASES = [(fill, interp) for fill in ("reflect", "wrap", "constant", "nearest")
                for interp in ("bilinear", "nearest")]
RESIZE_CASES = [dict(height=3, width=4), dict(height=8, width=9, interpolation="nearest"),
                dict(height=4, width=4, crop_to_aspect_ratio=True),
                dict(height=4, width=3, pad_to_aspect_ratio=True, fill_value=9.0),
                dict(height=3, width=3, interpolation="bicubic", antialias=True)]
CONFIG_LAYERS = {
    "RandomFlip": dict(mode="vertical", seed=3), "RandomRotation": dict(factor=(-0.2, 0.3), fill_mode="wrap", seed=4),
    "RandomZoom": dict(height_factor=(-0.3, 0.2), width_factor=0.1, interpolation="nearest", seed=5),
    "RandomTranslation": dict(height_factor=0.2, width_factor=(-0.1, 0.3), fill_mode="constant", fill_value=2.0),
    "RandomCrop": dict(height=3, width=4, seed=6), "RandomContrast": dict(factor=0.3, value_range=(0, 1), seed=7),
    "RandomBrightness": dict(factor=(-0.2, 0.4), value_range=(0, 255)), "CenterCrop": dict(height=3, width=2),
    "Resizing": dict(height=7, width=3, interpolation="nearest", crop_to_aspect_ratio=True),
}

# a model of every layer for the .keras files (RandomCrop at the full size: Keras 3.15 does not crop at inference)
FILE_LAYERS = [("RandomFlip", dict(seed=1)), ("RandomRotation", dict(factor=0.1)), ("RandomZoom", dict(height_factor=0.2)),
               ("RandomTranslation", dict(height_factor=0.1, width_factor=0.2)), ("RandomCrop", dict(height=10, width=10)),
               ("Resizing", dict(height=8, width=8)), ("CenterCrop", dict(height=6, width=6)),
               ("RandomContrast", dict(factor=0.2)), ("RandomBrightness", dict(factor=0.1))]


def _file_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((10, 10, 3))] + [getattr(layers, n)(**kw) for n, kw in FILE_LAYERS]
                            + [layers.Flatten(), layers.Dense(2)])


_SCRIPT = r"""
import json, os, sys
import numpy as np
import keras
from keras import layers
from keras.src.utils.image_utils import smart_resize

work = sys.argv[1]
spec = json.load(open(os.path.join(work, "spec.json")))
inp = dict(np.load(os.path.join(work, "in.npz")))
out, configs = {}, {}
for df, x in (("channels_last", inp["x"]), ("channels_first", inp["x_cf"])):
    for mode in ("horizontal", "vertical", "horizontal_and_vertical"):
        out[f"flip/{mode}/{df}"] = layers.RandomFlip(mode, data_format=df).transform_images(
            x, {"flips": inp["flips"]})
    h, w = (x.shape[1], x.shape[2]) if df == "channels_last" else (x.shape[2], x.shape[3])
    for fill, interp in spec["affine"]:
        rot = layers.RandomRotation(0.1, fill_mode=fill, interpolation=interp, fill_value=7.0, data_format=df)
        angle = np.asarray(inp["angles"])
        z = np.zeros(4, np.float32)
        m = rot._compute_affine_matrix(0.5, 0.5, angle, z, z, z + 1, z, z, h, w)
        out[f"rotmat/{df}"] = np.asarray(m)
        out[f"rot/{fill}/{interp}/{df}"] = rot.transform_images(x, {"rotation_matrix": m})
        zoom = layers.RandomZoom(0.2, 0.2, fill_mode=fill, interpolation=interp, fill_value=7.0, data_format=df)
        out[f"zoom/{fill}/{interp}/{df}"] = zoom.transform_images(
            x, {"height_zoom": inp["zoom_h"], "width_zoom": inp["zoom_w"]})
        tr = layers.RandomTranslation(0.2, 0.2, fill_mode=fill, interpolation=interp, fill_value=7.0, data_format=df)
        out[f"translate/{fill}/{interp}/{df}"] = tr.transform_images(x, {"translations": inp["translations"]})
    out[f"contrast/{df}"] = layers.RandomContrast(0.5, value_range=(0, 255), data_format=df).transform_images(
        x, {"contrast_factor": inp["contrast"]})
    out[f"brightness/{df}"] = layers.RandomBrightness(0.5, value_range=(10, 200), data_format=df).transform_images(
        x, {"rgb_delta": inp["brightness"]})
    out[f"crop/{df}"] = layers.RandomCrop(3, 4, data_format=df).transform_images(x, (1, 2))
    out[f"smart/{df}"] = smart_resize(x, (4, 2), data_format=df)
    out[f"center/{df}"] = layers.CenterCrop(3, 4, data_format=df)(x)
    out[f"center_small/{df}"] = layers.CenterCrop(7, 3, data_format=df)(x)
for i, kw in enumerate(spec["resize"]):
    out[f"resize/{i}"] = layers.Resizing(**kw)(inp["x"])
    out[f"resize_u8/{i}"] = layers.Resizing(**kw)(inp["x_u8"])
for name, kw in spec["configs"].items():
    cfg = getattr(layers, name)(**kw).get_config()
    cfg.pop("name"); cfg.pop("dtype")
    configs[name] = json.loads(json.dumps(cfg))
# .keras files both ways: dnnbind's file read here, Keras's own written for dnnbind to read
xs = inp["x_file"]
out["dnnbind_file"] = keras.models.load_model(os.path.join(work, "dnnbind.keras")).predict(xs, verbose=0)
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((10, 10, 3))] + [getattr(layers, n)(**kw) for n, kw in spec["file_layers"]]
                         + [layers.Flatten(), layers.Dense(2)])
model.save(os.path.join(work, "keras.keras"))
out["keras_file"] = model.predict(xs, verbose=0)
np.savez(os.path.join(work, "out.npz"), **{k: np.asarray(v) for k, v in out.items()})
json.dump(configs, open(os.path.join(work, "configs.json"), "w"))
"""


def _inputs():
    x = _images()
    return {"x": x, "x_cf": np.ascontiguousarray(np.moveaxis(x, -1, 1)), "x_u8": _images(dtype="uint8"),
            "flips": FLIPS, "angles": np.array(ANGLES, np.float32), "zoom_h": ZOOMS[0], "zoom_w": ZOOMS[1],
            "translations": TRANSLATIONS, "contrast": CONTRAST, "brightness": BRIGHTNESS}


@functools.lru_cache(maxsize=1)
def _keras_reference():
    work = tempfile.mkdtemp(prefix="dnnbind_image_layers_")
    with open(os.path.join(work, "spec.json"), "w") as f:
        json.dump({"affine": AFFINE_CASES, "resize": RESIZE_CASES, "configs": CONFIG_LAYERS,
                   "file_layers": FILE_LAYERS}, f)
    np.savez(os.path.join(work, "in.npz"), x_file=_images((2, 10, 10, 3)), **_inputs())
    _file_model().save(os.path.join(work, "dnnbind.keras"))
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_HOME", "KERAS_BACKEND")}
    env.update(KERAS_HOME=os.path.join(work, "keras_home"), KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, work], capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise AssertionError(f"the Keras side failed:\n{proc.stderr[-4000:]}")
    return dict(np.load(os.path.join(work, "out.npz"))), json.load(open(os.path.join(work, "configs.json"))), work


@pytest.fixture(scope="module")
def ref():
    if not keras_available():
        pytest.skip("real Keras 3 with jax is not installed (test extra)")
    return _keras_reference()


def _close(actual, expected, atol=2e-3):
    actual = _np(actual)
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=1e-5, atol=atol)


DATA_FORMATS = ("channels_last", "channels_first")


@pytest.mark.parametrize("df", DATA_FORMATS)
def test_flip_matches_keras(ref, df):
    x = _inputs()["x" if df == "channels_last" else "x_cf"]
    for mode in ("horizontal", "vertical", "horizontal_and_vertical"):
        layer = layers.RandomFlip(mode, data_format=df)
        _close(layer.transform_images(x, {"flips": FLIPS}), ref[0][f"flip/{mode}/{df}"], atol=0)


@pytest.mark.parametrize("df", DATA_FORMATS)
def test_affine_layers_match_keras(ref, df):
    inp = _inputs()
    x = inp["x" if df == "channels_last" else "x_cf"]
    h, w = (5, 6)
    matrix = rotation_matrix(np.array(ANGLES, np.float32), h, w)
    _close(matrix, ref[0][f"rotmat/{df}"], atol=1e-5)
    for fill, interp in AFFINE_CASES:
        kw = dict(fill_mode=fill, interpolation=interp, fill_value=7.0, data_format=df)
        rot = layers.RandomRotation(0.1, **kw)
        _close(rot.transform_images(x, {"rotation_matrix": matrix}), ref[0][f"rot/{fill}/{interp}/{df}"])
        zoom = layers.RandomZoom(0.2, 0.2, **kw)
        _close(zoom.transform_images(x, {"height_zoom": ZOOMS[0], "width_zoom": ZOOMS[1]}),
               ref[0][f"zoom/{fill}/{interp}/{df}"])
        tr = layers.RandomTranslation(0.2, 0.2, **kw)
        _close(tr.transform_images(x, {"translations": TRANSLATIONS}), ref[0][f"translate/{fill}/{interp}/{df}"])


@pytest.mark.parametrize("df", DATA_FORMATS)
def test_colour_crop_and_resize_layers_match_keras(ref, df):
    x = _inputs()["x" if df == "channels_last" else "x_cf"]
    out = ref[0]
    _close(layers.RandomContrast(0.5, data_format=df).transform_images(x, {"contrast_factor": CONTRAST}),
           out[f"contrast/{df}"])
    _close(layers.RandomBrightness(0.5, value_range=(10, 200), data_format=df).transform_images(
        x, {"rgb_delta": BRIGHTNESS}), out[f"brightness/{df}"])
    crop = layers.RandomCrop(3, 4, data_format=df)
    _close(crop.transform_images(x, (1, 2)), out[f"crop/{df}"], atol=0)
    # the same window from device-side (tensor) offsets: the gather path of a random draw
    _close(crop.transform_images(x, (ops.convert_to_tensor(np.int32(1)), ops.convert_to_tensor(np.int32(2)))),
           out[f"crop/{df}"], atol=0)
    # not training: Keras's smart_resize (the documented RandomCrop inference)
    _close(layers.RandomCrop(4, 2, data_format=df)(x, training=False), out[f"smart/{df}"])
    _close(layers.CenterCrop(3, 4, data_format=df)(x), out[f"center/{df}"], atol=0)
    _close(layers.CenterCrop(7, 3, data_format=df)(x), out[f"center_small/{df}"])


def test_resizing_matches_keras(ref):
    inp = _inputs()
    for i, kw in enumerate(RESIZE_CASES):
        _close(layers.Resizing(**kw)(inp["x"]), ref[0][f"resize/{i}"])
        got = layers.Resizing(**kw)(inp["x_u8"])
        assert got.dtype == np.uint8
        assert np.abs(_np(got).astype(int) - ref[0][f"resize_u8/{i}"].astype(int)).max() <= 1


def test_configs_match_keras_and_round_trip(ref):
    for name, kw in CONFIG_LAYERS.items():
        layer = getattr(layers, name)(**kw)
        cfg = layer.get_config()
        theirs = dict(ref[1][name])
        mine = json.loads(json.dumps({k: v for k, v in cfg.items() if k not in ("name", "dtype")}))
        if name == "RandomCrop":
            assert isinstance(mine.pop("seed"), int)
            theirs.pop("seed")
        theirs.pop("trainable")
        mine.pop("trainable")
        assert mine == theirs, name
        again = getattr(layers, name).from_config(cfg)
        assert again.get_config() == cfg
        assert layers.deserialize({"class_name": name, "config": cfg}).get_config() == cfg


@pytest.mark.filterwarnings("ignore:save. the .keras file:UserWarning")
def test_keras_files_both_ways(ref):
    xs = _images((2, 10, 10, 3))
    np.testing.assert_allclose(ref[0]["dnnbind_file"], _file_model().predict(xs, verbose=0), rtol=1e-4, atol=1e-3)
    # Keras's file: read back through keras_format (its nodes record training=True, the call's default)
    model = keras.models.load_model(os.path.join(ref[2], "keras.keras"))
    assert [type(layer).__name__ for layer in model.layers[:9]] == [n for n, _ in FILE_LAYERS]
    np.testing.assert_allclose(model.predict(xs, verbose=0), ref[0]["keras_file"], rtol=1e-4, atol=1e-3)


# ------------------------------------------------------------------------- hand-made references
def test_rotation_by_a_quarter_turn_is_rot90():
    x = _images((3, 6, 6, 2))
    layer = layers.RandomRotation((0.25, 0.25), fill_mode="constant", interpolation="nearest")
    np.testing.assert_array_equal(_np(layer(x, training=True)), np.rot90(x, k=1, axes=(1, 2)))
    bilinear = layers.RandomRotation((-0.25, -0.25), fill_mode="constant")
    np.testing.assert_allclose(_np(bilinear(x)), np.rot90(x, k=-1, axes=(1, 2)), atol=1e-3)


def test_translation_by_whole_pixels_shifts_and_fills():
    x = _images((2, 8, 5, 1))
    layer = layers.RandomTranslation((0.25, 0.25), (-0.2, -0.2), fill_mode="constant", fill_value=-1.0,
                                     interpolation="nearest")
    want = np.full_like(x, -1.0)
    want[:, 2:, :4] = x[:, :6, 1:]  # down by 0.25 * 8 = 2 rows, left by 0.2 * 5 = 1 column
    np.testing.assert_array_equal(_np(layer(x)), want)


def test_zoom_by_two_samples_every_other_pixel():
    x = _images((2, 9, 9, 1))
    layer = layers.RandomZoom((1.0, 1.0), fill_mode="constant", interpolation="nearest")  # zoom 2: out
    got = _np(layer(x))
    # input coordinate 2 * o - 4 for output o (centre 4 fixed); rows 2..6 land inside
    want = np.zeros_like(x)
    want[:, 2:7, 2:7] = x[:, 0:9:2, 0:9:2]
    np.testing.assert_array_equal(got, want)


def test_flip_draws_whole_image_flips_from_its_seed():
    x = _images((64, 3, 4, 1))
    out = _np(layers.RandomFlip("horizontal", seed=1)(x))
    same = np.all(out == x, axis=(1, 2, 3))
    flipped = np.all(out == x[:, :, ::-1], axis=(1, 2, 3))
    assert np.all(same | flipped) and 16 < flipped.sum() < 48
    both = _np(layers.RandomFlip(seed=1)(x))  # horizontal_and_vertical: one coin per image for both
    assert np.all(np.all(both == x, axis=(1, 2, 3)) | np.all(both == x[:, ::-1, ::-1], axis=(1, 2, 3)))
    np.testing.assert_array_equal(np.all(both == x[:, ::-1, ::-1], axis=(1, 2, 3)), flipped)


def test_random_crop_windows_are_windows_of_the_input():
    x = _images((3, 7, 8, 2))
    layer = layers.RandomCrop(4, 3, seed=2)
    starts = set()
    for _ in range(12):
        out = _np(layer(x))
        assert out.shape == (3, 4, 3, 2)
        hits = [(t, l) for t in range(4) for l in range(6) if np.array_equal(out, x[:, t:t + 4, l:l + 3])]
        assert len(hits) == 1  # one window for the whole batch
        starts.add(hits[0])
    assert len(starts) > 3


def test_contrast_and_brightness_follow_their_formulas_and_ranges():
    x = _images((16, 5, 6, 3))
    contrast = layers.RandomContrast(0.4, seed=3)
    t = contrast.get_random_transformation(x)
    f = _np(t["contrast_factor"])
    assert f.shape == (16, 1, 1, 1) and np.all((f >= 1.0) & (f < 1.4)) and f.std() > 0  # Keras 3.15: (0, 0.4)
    mean = x.mean(axis=(1, 2), keepdims=True)
    np.testing.assert_allclose(_np(contrast.transform_images(x, t)), np.clip((x - mean) * f + mean, 0, 255),
                               rtol=1e-5, atol=1e-3)
    bright = layers.RandomBrightness(0.5, value_range=(0, 255), seed=4)
    out = _np(bright(x))
    assert out.min() >= 0 and out.max() <= 255
    delta = out - x
    inside = (out > 0) & (out < 255)
    per_image = [np.unique(np.round(delta[i][inside[i]], 2)) for i in range(16)]
    assert all(d.size == 1 and abs(d[0]) <= 0.5 * 255 for d in per_image if d.size)
    u8 = _images((4, 5, 6, 3), dtype="uint8")
    got = bright(u8)
    assert got.dtype == np.uint8  # saturated, no wrap-around


def test_rotation_angles_stay_in_the_factor_range():
    layer = layers.RandomRotation((-0.1, 0.05), seed=5)
    angles = _np(layer.get_random_transformation(_images((256, 4, 4, 1)))["angle"])
    assert angles.min() >= -36.0 and angles.max() < 18.0 and angles.max() - angles.min() > 40.0


@pytest.mark.parametrize("make", [
    lambda: layers.RandomFlip(seed=1), lambda: layers.RandomRotation(0.2, seed=1),
    lambda: layers.RandomZoom(0.3, 0.2, seed=1), lambda: layers.RandomTranslation(0.2, 0.3, seed=1),
    lambda: layers.RandomContrast(0.5, seed=1), lambda: layers.RandomBrightness(0.3, seed=1),
], ids=["flip", "rotation", "zoom", "translation", "contrast", "brightness"])
def test_not_training_is_the_identity_and_training_changes(make):
    x = _images((8, 6, 5, 3))
    layer = make()
    np.testing.assert_array_equal(_np(layer(x, training=False)), x)
    assert np.abs(_np(layer(x)) - x).max() > 1.0  # called alone, training defaults to True (Keras)
    u8 = _images((4, 6, 5, 3), dtype="uint8")
    out = layer(u8, training=False)
    np.testing.assert_array_equal(_np(out), u8)
    keeps_dtype = isinstance(layer, (layers.RandomContrast, layers.RandomBrightness))
    assert out.dtype == (np.uint8 if keeps_dtype else np.float32)


def test_unbatched_images_and_shapes():
    one = _images((6, 5, 3))
    for layer in (layers.RandomFlip(seed=1), layers.RandomRotation(0.3, seed=1), layers.RandomZoom(0.3, seed=1),
                  layers.RandomTranslation(0.2, 0.2, seed=1), layers.RandomContrast(0.3, seed=1),
                  layers.RandomBrightness(0.3, seed=1)):
        assert layer(one).shape == (6, 5, 3)
        assert layer.compute_output_shape((None, 6, 5, 3)) == (None, 6, 5, 3)
    assert layers.RandomCrop(4, 2, seed=1)(one).shape == (4, 2, 3)
    assert layers.CenterCrop(2, 3)(one).shape == (2, 3, 3)
    assert layers.Resizing(3, 7)(one).shape == (3, 7, 3)
    assert layers.RandomCrop(4, 2).compute_output_shape((None, 6, 5, 3)) == (None, 4, 2, 3)
    assert layers.Resizing(3, 7, data_format="channels_first").compute_output_shape((None, 3, 6, 5)) == \
        (None, 3, 3, 7)


def test_seeds_reproduce_and_calls_draw_anew():
    x = _images((8, 6, 6, 1))
    keras.utils.set_random_seed(11)
    a1, a2 = layers.RandomRotation(0.3)(x), None
    keras.utils.set_random_seed(11)
    layer = layers.RandomRotation(0.3)
    a2 = layer(x)
    np.testing.assert_array_equal(_np(a1), _np(a2))
    assert np.abs(_np(layer(x)) - _np(a2)).max() > 1.0  # the generator moved
    np.testing.assert_array_equal(_np(layers.RandomZoom(0.3, seed=9)(x)), _np(layers.RandomZoom(0.3, seed=9)(x)))


def test_augmentation_in_a_model_trains_and_predict_does_not_augment():
    rng = np.random.default_rng(0)
    keras.utils.set_random_seed(0)
    y = rng.integers(0, 2, size=64)
    x = rng.uniform(0, 0.3, size=(64, 10, 10, 1)).astype("float32")
    x[y == 1, 3:7, 3:7] += 0.7
    aug = keras.Sequential([layers.RandomFlip("horizontal"), layers.RandomTranslation(0.1, 0.1),
                            layers.RandomCrop(8, 8)])
    inputs = keras.Input((10, 10, 1))
    h = layers.Flatten()(aug(inputs))
    model = keras.Model(inputs, layers.Dense(1, activation="sigmoid")(h))
    assert model.output_shape == (None, 1)
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="binary_crossentropy", metrics=["accuracy"])
    hist = model.fit(x, y, batch_size=16, epochs=4, verbose=0)
    assert hist.history["loss"][-1] < hist.history["loss"][0]
    p1, p2 = model.predict(x, verbose=0), model.predict(x, verbose=0)
    np.testing.assert_array_equal(p1, p2)  # no augmentation outside training
    # not training, RandomCrop is smart_resize: the largest crop of the target's aspect (all of it), resized
    resized = _np(ops.image.resize(x, (8, 8)))
    np.testing.assert_allclose(_np(aug(x, training=False)), resized, rtol=1e-6, atol=1e-6)
    assert np.abs(_np(aug(x)) - resized).max() > 0.1  # a Sequential called alone augments (Keras)


def test_gradients_flow_to_the_images_float64():
    keras.mixed_precision.set_global_policy("float64")
    x = np.random.default_rng(1).uniform(0, 1, size=(2, 5, 4, 1))
    w = np.random.default_rng(2).normal(size=(2, 5, 4, 1))
    contrast = layers.RandomContrast(0.5, value_range=(-10, 10))
    rot = layers.RandomRotation(0.1, fill_mode="reflect")
    t_contrast = {"contrast_factor": np.array([0.7, 1.3]).reshape(2, 1, 1, 1)}
    t_rot = {"rotation_matrix": rotation_matrix(np.array([13.0, -21.0]), 5, 4)}

    def loss(images):
        return ops.sum(ops.multiply(rot.transform_images(contrast.transform_images(images, t_contrast), t_rot), w))

    xt = ops.convert_to_tensor(x)
    with GradientTape() as tape:
        tape.watch(xt)
        value = loss(xt)
    grad = _np(tape.gradient(value, xt))
    num = numerical_grad(lambda: float(loss(x)), x)
    np.testing.assert_allclose(grad, num, rtol=1e-6, atol=1e-8)


# ------------------------------------------------------------------------------------ bad arguments
@pytest.mark.parametrize("make, error, match", [
    (lambda: layers.RandomFlip("diagonal"), ValueError, "RandomFlip 'random_flip.*mode must be one of"),
    (lambda: layers.RandomRotation(1.5), ValueError, "factor must be a number or a pair of numbers in \\[-1, 1\\]"),
    (lambda: layers.RandomRotation((0.1, 0.2, 0.3)), ValueError, "factor must be a number or a pair"),
    (lambda: layers.RandomRotation("a"), ValueError, "factor must be"),
    (lambda: layers.RandomRotation(0.1, fill_mode="mirror"), NotImplementedError, "unknown fill_mode 'mirror'"),
    (lambda: layers.RandomZoom(-1.0), ValueError, "height_factor must be .* in \\(-1, 1\\]"),
    (lambda: layers.RandomZoom(0.1, interpolation="bicubic"), NotImplementedError, "unknown interpolation"),
    (lambda: layers.RandomTranslation(0.1, 1.2), ValueError, "width_factor must be"),
    (lambda: layers.RandomContrast(-0.1), ValueError, "factor must be .* in \\[0, 1\\]"),
    (lambda: layers.RandomBrightness(0.1, value_range=(1,)), ValueError, "value_range must be a list of two"),
    (lambda: layers.RandomBrightness(0.1, value_range=(3, 3)), ValueError, "two different finite numbers"),
    (lambda: layers.RandomCrop(0, 3), ValueError, "RandomCrop .*height must be a positive int"),
    (lambda: layers.CenterCrop(3, 2.5), TypeError, "CenterCrop .*width must be an int"),
    (lambda: layers.Resizing(3, 3, interpolation="cubic"), ValueError, "interpolation must be one of"),
    (lambda: layers.Resizing(3, 3, crop_to_aspect_ratio=True, pad_to_aspect_ratio=True), ValueError,
     "only one of crop_to_aspect_ratio and pad_to_aspect_ratio"),
    (lambda: layers.RandomFlip(seed=1.5), TypeError, "seed must be an int"),
    (lambda: layers.RandomFlip(data_format="nhwc"), ValueError, "data_format must be one of"),
])
def test_bad_arguments_raise_clear_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_bad_inputs_raise_before_any_draw():
    layer = layers.RandomRotation(0.2, seed=1)
    counter = int(layer.generator.counter)
    with pytest.raises(ValueError, match="RandomRotation 'random_rotation.*' expects images of rank 3 .* got shape "
                                         "\\(4, 5\\)"):
        layer(np.ones((4, 5), np.float32))
    with pytest.raises(TypeError, match="expects numeric images, got dtype bool"):
        layers.RandomFlip()(np.ones((1, 4, 5, 1), bool))
    assert int(layer.generator.counter) == counter
