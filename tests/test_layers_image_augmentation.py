"""AutoContrast, Solarization, RandomInvert, RandomGrayscale and Pipeline against real Keras 3 (JAX backend, in a
subprocess): Keras's ``transform_images`` and dnnbind's on the same images and the same transformation (Keras's
random draws are its own), float and uint8 images, both data formats; configs; the random draws' statistics."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from dnnbind import layers


@pytest.fixture(autouse=True)
def _cpu(cpu):
    yield


def _images(seed: int, shape=(3, 5, 6, 3), dtype="float32", low=0.0, high=255.0) -> np.ndarray:
    x = np.random.default_rng(seed).uniform(low, high, size=shape)
    return np.round(x).astype(dtype) if dtype == "uint8" else x.astype(dtype)


# (label, class, kwargs, images, transformation: a dict of arrays, an array, or None)
def _cases() -> list:
    n = 3
    add = np.array([10.0, 60.0, 0.0], np.float32).reshape(n, 1, 1, 1)
    thr = np.array([128.0, 200.0, 40.0], np.float32).reshape(n, 1, 1, 1)
    return [
        ("autocontrast", "AutoContrast", {}, _images(0, low=30, high=200), None),
        ("autocontrast_unit", "AutoContrast", {"value_range": (0, 1)}, _images(1, low=0.2, high=0.7), None),
        ("autocontrast_uint8", "AutoContrast", {}, _images(2, dtype="uint8", low=40, high=180), None),
        ("solarize", "Solarization", {"addition_factor": 0.5, "threshold_factor": 0.5},
         _images(3), {"additions": add, "thresholds": thr}),
        ("solarize_unit", "Solarization", {"value_range": (0, 1)}, _images(4, low=0, high=1),
         {"additions": add, "thresholds": thr}),
        ("solarize_uint8", "Solarization", {}, _images(5, dtype="uint8"), {"additions": add, "thresholds": thr}),
        ("invert", "RandomInvert", {}, _images(6), {"apply_inversion": np.array([True, False, True])}),
        ("invert_unit", "RandomInvert", {"value_range": (0, 1)}, _images(7, low=0, high=1),
         {"apply_inversion": np.array([False, True, True])}),
        ("grayscale", "RandomGrayscale", {}, _images(8), np.array([True, False, True]).reshape(3, 1, 1, 1)),
        ("grayscale_cf", "RandomGrayscale", {"data_format": "channels_first"}, _images(9, shape=(3, 3, 5, 4)),
         np.array([False, True, True]).reshape(3, 1, 1, 1)),
        ("degenerate", "RandomColorDegeneration", {"factor": 0.8}, _images(11),
         {"factor": np.array([0.2, -0.5, 0.9], np.float32).reshape(3, 1, 1, 1)}),
        ("degenerate_cf", "RandomColorDegeneration", {"factor": (0.1, 0.4), "data_format": "channels_first",
                                                      "value_range": (0, 1)}, _images(12, (3, 3, 4, 5), high=1),
         {"factor": np.array([0.3, 0.1, 1.0], np.float32).reshape(3, 1, 1, 1)}),
        ("saturation", "RandomSaturation", {"factor": 0.5}, _images(13),
         {"factor": np.array([0.25, 1.0, 3.0], np.float32)}),
        ("saturation_cf", "RandomSaturation", {"factor": 0.5, "data_format": "channels_first"},
         _images(14, (3, 3, 4, 5)), {"factor": np.array([0.0, 2.0, 0.5], np.float32)}),
        ("sharpness", "RandomSharpness", {"factor": 0.5}, _images(15),
         {"factor": np.array([0.0, 0.5, 1.0], np.float32)}),
        ("sharpness_cf", "RandomSharpness", {"factor": (0.2, 0.9), "data_format": "channels_first"},
         _images(16, (3, 3, 5, 4)), {"factor": np.array([0.9, 0.2, 0.7], np.float32)}),
        ("hue", "RandomHue", {"factor": 0.5}, _images(17), {"factor": np.array([0.2, -0.35, 0.5], np.float32)}),
        ("hue_cf_unit", "RandomHue", {"factor": (0.1, 0.3), "value_range": (0, 1), "data_format": "channels_first"},
         _images(18, (3, 3, 4, 5), high=1), {"factor": np.array([-0.1, 0.15, 0.05], np.float32)}),
        ("blur", "RandomGaussianBlur", {"kernel_size": 5, "sigma": 0.8}, _images(19, (3, 7, 6, 3)),
         {"should_apply_blur": np.array([True, False, True]), "blur_factor": np.array([0.7, 1.3], np.float32)}),
        ("blur_cf", "RandomGaussianBlur", {"kernel_size": (3, 5), "data_format": "channels_first"},
         _images(21, (3, 3, 6, 7)), {"should_apply_blur": np.array([True, True, False]),
                                     "blur_factor": np.array([0.5, 0.9], np.float32)}),
        ("shear", "RandomShear", {"x_factor": 0.3, "y_factor": 0.2}, _images(22, (3, 6, 7, 3)),
         {"shear_factor": np.array([[0.2, -0.1], [-0.3, 0.15], [0.0, 0.05]], np.float32)}),
        ("shear_nearest_cf", "RandomShear", {"x_factor": 0.5, "interpolation": "nearest", "fill_mode": "constant",
                                             "data_format": "channels_first"}, _images(23, (2, 3, 6, 5)),
         {"shear_factor": np.array([[0.4, 0.0], [-0.25, 0.0]], np.float32)}),
        ("perspective", "RandomPerspective", {"scale": 0.6}, _images(24, (2, 6, 7, 3)),
         {"apply_perspective": np.array([True, False]),
          "start_points": np.tile(np.array([[[0, 0], [6, 0], [0, 5], [6, 5]]], np.float32), (2, 1, 1)),
          "end_points": np.tile(np.array([[[0, 0], [6, 0], [0, 5], [6, 5]]], np.float32), (2, 1, 1))
          * np.array([[[1, 1], [0.8, 1.1], [1.2, 0.9], [0.9, 1.05]]], np.float32)}),
        ("cutmix", "CutMix", {}, _images(25, (3, 5, 6, 2)),
         {"permutation_order": np.array([2, 0, 1], np.int32),
          "batch_masks": np.random.default_rng(0).random((3, 5, 6, 2)) < 0.4,
          "mix_weight": np.array([0.6, 0.7, 0.8], np.float32).reshape(3, 1, 1, 1)}),
        ("equalize", "Equalization", {}, _images(26, (2, 6, 5, 3), low=60, high=140), None),
        ("equalize_bins_cf", "Equalization", {"bins": 16, "data_format": "channels_first", "value_range": (0, 1)},
         _images(27, (2, 3, 5, 6), low=0.2, high=0.6), None),
        ("equalize_flat", "Equalization", {}, np.full((1, 3, 3, 3), 7.0, np.float32), None),
        ("erasing", "RandomErasing", {"fill_value": 3.0}, _images(28, (2, 4, 5, 3)),
         {"apply_erasing": np.array([True, False]),
          "batch_masks": np.random.default_rng(1).random((2, 4, 5, 3)) < 0.5,
          "fill_value": np.full((2, 4, 5, 3), 3.0, np.float32)}),
    ]


CASES = _cases()

_SCRIPT = r"""
import json, sys
import numpy as np
import keras
work = sys.argv[1]
cases = json.load(open(f"{work}/cases.json"))
data = dict(np.load(f"{work}/in.npz"))
out = {}
for label, cls, kwargs, keys in cases:
    layer = getattr(keras.layers, cls)(**kwargs)
    if keys is None:
        t = None
    elif keys == ["__array__"]:
        t = data[f"{label}/t"]
    else:
        t = {k: data[f"{label}/t/{k}"] for k in keys}
    y = layer.transform_images(data[f"{label}/x"], t, training=True)
    out[f"{label}/y"] = np.asarray(y)
    config = layer.get_config()
    config.pop("dtype", None)
    out[f"{label}/config"] = np.array(json.dumps(config, default=str))
np.savez(f"{work}/out.npz", **out)
"""


@functools.lru_cache(maxsize=1)
def _keras_results() -> "dict | str":
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("jax") is None:
        return "real Keras 3 with JAX is not installed (test extra)"
    work = tempfile.mkdtemp(prefix="dnnbind_aug_")
    arrays, described = {}, []
    for label, cls, kwargs, x, t in CASES:
        arrays[f"{label}/x"] = x
        if isinstance(t, dict):
            arrays.update({f"{label}/t/{k}": v for k, v in t.items()})
            keys = sorted(t)
        elif t is not None:
            arrays[f"{label}/t"] = t
            keys = ["__array__"]
        else:
            keys = None
        described.append([label, cls, kwargs, keys])
    np.savez(os.path.join(work, "in.npz"), **arrays)
    with open(os.path.join(work, "cases.json"), "w") as f:
        json.dump(described, f)
    env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
    env.update(KERAS_HOME=os.path.join(work, "kh"), KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, work], capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(f"the Keras side failed:\n{proc.stderr[-4000:]}")
    return dict(np.load(os.path.join(work, "out.npz")))


@pytest.mark.parametrize("label,cls,kwargs,x,t", CASES, ids=[c[0] for c in CASES])
def test_transform_images_matches_keras(label, cls, kwargs, x, t):
    theirs = _keras_results()
    if isinstance(theirs, str):
        pytest.skip(theirs)
    layer = getattr(layers, cls)(**kwargs)
    y = np.asarray(layer.transform_images(x, t, training=True))
    want = theirs[f"{label}/y"]
    assert y.dtype == want.dtype and y.shape == want.shape
    # (images on the 0-255 scale: the interpolating layers differ from JAX's float32 arithmetic in the 4th decimal)
    np.testing.assert_allclose(y.astype(np.float64), want.astype(np.float64), rtol=1e-5, atol=1e-3)
    ours = layer.get_config()
    keras_config = json.loads(str(theirs[f"{label}/config"]))
    assert set(ours) - {"dtype"} == set(keras_config), label
    again = getattr(layers, cls).from_config(json.loads(json.dumps(ours)))
    np.testing.assert_array_equal(np.asarray(again.transform_images(x, t, training=True)), y)


def test_random_draws_follow_the_factors():
    x = np.full((400, 2, 2, 3), 100.0, np.float32)
    inverted = np.asarray(layers.RandomInvert(factor=(0.5, 0.5), seed=1)(x))
    share = np.mean(inverted[:, 0, 0, 0] == 155.0)
    assert abs(share - 0.5) < 0.08 and set(np.unique(inverted)) <= {100.0, 155.0}
    rgb = np.random.default_rng(0).uniform(0, 255, size=(400, 2, 2, 3)).astype(np.float32)
    gray = np.asarray(layers.RandomGrayscale(0.25, seed=2)(rgb))
    is_gray = np.all(np.isclose(gray, gray[..., :1]), axis=(1, 2, 3))
    assert abs(is_gray.mean() - 0.25) < 0.07
    solar = layers.Solarization(addition_factor=(0.2, 0.2), threshold_factor=(1.0, 1.0), seed=3)
    t = solar.get_random_transformation(x)
    additions = np.asarray(t["additions"])  # uniform in [addition_factor[0], addition_factor[1] * 255), as Keras
    assert additions.shape == (400, 1, 1, 1) and additions.min() >= 0.2 and additions.max() < 51.0
    assert abs(additions.mean() - (0.2 + 51.0) / 2) < 2.0
    np.testing.assert_array_equal(np.asarray(layers.RandomInvert(seed=4)(x, training=False)), x)


def test_pipeline_applies_in_order_and_round_trips():
    x = _images(10, low=50, high=150)
    pipe = layers.Pipeline([layers.AutoContrast(), layers.RandomInvert(factor=(1.0, 1.0), seed=1)], name="p")
    y = np.asarray(pipe(x))
    auto = np.asarray(layers.AutoContrast()(x))
    np.testing.assert_allclose(y, 255.0 - auto, rtol=1e-6, atol=1e-4)
    config = pipe.get_config()
    again = layers.Pipeline.from_config(json.loads(json.dumps(config)))
    assert [type(layer).__name__ for layer in again.layers] == ["AutoContrast", "RandomInvert"]
    np.testing.assert_allclose(np.asarray(again(x, training=False)), auto, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("make,match", [
    (lambda: layers.Solarization(addition_factor=2.0), r"Solarization .*addition_factor must be"),
    (lambda: layers.RandomGrayscale(1.5), r"factor"),
    (lambda: layers.AutoContrast(value_range=5), r"value_range"),
    (lambda: layers.Pipeline([layers.AutoContrast(), 3]), r"layers\[1\] must be a layer"),
])
def test_bad_arguments(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_factor_draws_of_the_colour_layers():
    x = _images(20, shape=(64, 4, 4, 3))
    # factor (0.5, 0.5): the neutral strength of sharpness and saturation, whatever is drawn
    np.testing.assert_allclose(np.asarray(layers.RandomSharpness((0.5, 0.5), seed=1)(x)), x, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(np.asarray(layers.RandomSaturation((0.5, 0.5), seed=2)(x)), x, rtol=1e-4, atol=1e-2)
    layer = layers.RandomColorDegeneration((0.2, 0.6), seed=3)
    f = np.asarray(layer.get_random_transformation(x)["factor"])
    assert f.shape == (64, 1, 1, 1) and f.min() >= 0.2 and f.max() < 0.6
    a, b = np.asarray(layer(x)), np.asarray(layer(x))
    assert not np.array_equal(a, b) and np.isfinite(a).all()
    np.testing.assert_array_equal(np.asarray(layer(x, training=False)), x)


def test_mix_up_mixes_images_and_labels_with_one_transformation():
    x = _images(30, shape=(6, 3, 3, 3))
    labels = np.eye(6, dtype=np.float32)
    layer = layers.MixUp(alpha=0.4, seed=5)
    t = layer.get_random_transformation(x)
    w = np.asarray(t["mix_weight"])
    order = np.asarray(t["permutation_order"])
    assert sorted(order.tolist()) == list(range(6)) and ((0 < w) & (w < 1)).all()
    np.testing.assert_allclose(np.asarray(layer.transform_images(x, t)),
                               w[:, None, None, None] * x + (1 - w[:, None, None, None]) * x[order], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(layer.transform_labels(labels, t)),
                               w[:, None] * labels + (1 - w[:, None]) * labels[order], rtol=1e-5)
    out = layer({"images": x, "labels": labels})
    assert set(out) == {"images", "labels"} and np.allclose(np.asarray(out["labels"]).sum(axis=1), 1.0)
    np.testing.assert_array_equal(np.asarray(layer(x, training=False)), x)
    assert layers.MixUp.from_config(layer.get_config()).alpha == 0.4


def test_color_jitter_composes_the_colour_layers():
    x = _images(31, shape=(8, 4, 4, 3), low=20, high=230)
    layer = layers.RandomColorJitter(brightness_factor=0.2, contrast_factor=0.3, saturation_factor=(0.4, 0.6),
                                     hue_factor=0.1, seed=7)
    y = np.asarray(layer(x))
    assert y.shape == x.shape and np.isfinite(y).all() and not np.allclose(y, x)
    assert y.min() >= 0 and y.max() <= 255
    np.testing.assert_array_equal(np.asarray(layer(x, training=False)), x)
    only_contrast = layers.RandomColorJitter(contrast_factor=(0.0, 0.0), seed=1)
    np.testing.assert_allclose(np.asarray(only_contrast(x)), x, rtol=1e-5)  # a contrast factor of exactly 1
    config = layer.get_config()
    assert {"value_range", "brightness_factor", "contrast_factor", "saturation_factor", "hue_factor",
            "seed"} <= set(config)
    layers.RandomColorJitter.from_config(json.loads(json.dumps(config)))


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_cut_mix_boxes_and_labels(data_format):
    shape = (8, 6, 7, 3) if data_format == "channels_last" else (8, 3, 6, 7)
    x = _images(32, shape=shape)
    labels = np.eye(8, dtype=np.float32)
    layer = layers.CutMix(seed=3, data_format=data_format)
    t = layer.get_random_transformation(x)
    mask = np.asarray(t["batch_masks"])
    order = np.asarray(t["permutation_order"])
    mix = np.asarray(t["mix_weight"]).reshape(-1)
    assert mask.shape == shape and sorted(order.tolist()) == list(range(8))
    channel_axis = 3 if data_format == "channels_last" else 1
    assert (mask == mask.take([0], axis=channel_axis)).all()  # one box for every channel
    plane = mask.take(0, axis=channel_axis)
    for i in range(8):  # each mask is one axis-aligned box
        rows, cols = np.nonzero(plane[i])
        if rows.size:
            assert plane[i][rows.min():rows.max() + 1, cols.min():cols.max() + 1].all()
    assert ((0 <= mix) & (mix <= 1)).all()
    y = np.asarray(layer.transform_images(x, t))
    np.testing.assert_array_equal(y, np.where(mask, x[order], x))
    mixed = np.asarray(layer.transform_labels(labels, t))
    np.testing.assert_allclose(mixed, mix[:, None] * labels + (1 - mix[:, None]) * labels[order], rtol=1e-5)
    out = layer({"images": x, "labels": labels})
    assert set(out) == {"images", "labels"}
    single = x[0]
    np.testing.assert_array_equal(np.asarray(layer(single)), single)  # one image: nothing to mix with


def test_random_erasing_boxes_and_fill():
    x = _images(33, shape=(16, 8, 9, 3))
    layer = layers.RandomErasing(factor=(1.0, 1.0), scale=(0.1, 0.3), fill_value=(1.0, 2.0, 3.0), seed=2)
    y = np.asarray(layer(x))
    erased = ~np.isclose(y, x)
    assert erased.any(axis=(1, 2, 3)).all()  # probability 1: every image erased
    np.testing.assert_array_equal(y[erased], np.broadcast_to(np.array([1.0, 2.0, 3.0], np.float32), y.shape)[erased])
    frac = erased[..., 0].mean(axis=(1, 2))
    assert (frac <= 0.35).all() and (frac > 0).all()
    noise = layers.RandomErasing(factor=(1.0, 1.0), seed=3)(x)
    assert np.isfinite(np.asarray(noise)).all() and not np.allclose(np.asarray(noise), x)
    np.testing.assert_array_equal(np.asarray(layer(x, training=False)), x)
    assert layers.RandomErasing.from_config(json.loads(json.dumps(layer.get_config()))).fill_value == [1.0, 2.0, 3.0]
