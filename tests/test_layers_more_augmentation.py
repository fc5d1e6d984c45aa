"""RandomPosterization, RandomElasticTransform, AugMix, RandAugment, STFTSpectrogram and MelSpectrogram against
real Keras 3 (JAX backend, in one subprocess): Keras's ``transform_images`` and dnnbind's on the same images and
the same transformation; the elastic field against Keras's own ops (``gaussian_blur``, ``map_coordinates``)
composed as Keras's ``elastic_transform`` composes them, on dnnbind's fields; the spectrograms on the same signals
(STFTSpectrogram with Keras's weights); configs, inference identity and error messages."""

from __future__ import annotations

import fcntl
import functools
import hashlib
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


def _signal(seed: int, shape) -> np.ndarray:
    t = np.arange(shape[-1] if len(shape) < 3 else shape[1], dtype=np.float64)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape) * 0.3
    tone = np.sin(2 * np.pi * 0.07 * t) + 0.5 * np.cos(2 * np.pi * 0.21 * t)
    x = x + (tone if len(shape) < 3 else tone[:, None])
    return x.astype(np.float32)


# (label, class, kwargs, images, transformation dict)
TRANSFORM_CASES = [
    ("poster", "RandomPosterization", {"factor": 4}, _images(0),
     {"shift_factor": np.array([7, 5, 6], np.uint8)}),
    ("poster_unit", "RandomPosterization", {"factor": (2, 6), "value_range": (0, 1)}, _images(1, high=1.0),
     {"shift_factor": np.array([2, 4, 3], np.uint8)}),
    ("poster_uint8_cf", "RandomPosterization", {"factor": 8, "data_format": "channels_first"},
     _images(2, (3, 3, 4, 5), dtype="uint8"), {"shift_factor": np.array([0, 1, 4], np.uint8)}),
]

# (label, kwargs, images, apply, distortion): Keras's elastic_transform composed from its ops on our fields
ELASTIC_CASES = [
    ("elastic", {"scale": (0.6, 0.6)}, _images(3, (2, 12, 10, 3)), [True, False], 0.6),
    ("elastic_nearest_cf", {"scale": (1.0, 1.0), "interpolation": "nearest", "fill_mode": "constant",
                            "fill_value": 7.0, "data_format": "channels_first"},
     _images(4, (2, 3, 11, 13)), [True, True], 1.0),
    ("elastic_wrap_unit", {"scale": (0.8, 0.8), "fill_mode": "wrap", "value_range": (0, 1)},
     _images(5, (1, 10, 10, 2), high=1.0), [True], 0.8),
]

# (label, class, kwargs, signal)
AUDIO_CASES = [
    ("stft_log", "STFTSpectrogram", {"frame_length": 16}, _signal(0, (2, 64, 1))),
    ("stft_psd_same", "STFTSpectrogram", {"mode": "psd", "frame_length": 12, "frame_step": 5, "padding": "same",
                                          "scaling": "spectrum", "window": "hamming"}, _signal(1, (2, 50, 2))),
    ("stft_stft_cf", "STFTSpectrogram", {"mode": "stft", "frame_length": 10, "fft_length": 16,
                                         "data_format": "channels_first", "periodic": True}, _signal(2, (2, 2, 40))),
    ("stft_angle_expand", "STFTSpectrogram", {"mode": "angle", "frame_length": 8, "expand_dims": True},
     _signal(3, (1, 33, 2))),
    ("stft_magnitude_cf_expand", "STFTSpectrogram", {"mode": "magnitude", "frame_length": 8, "window": None,
                                                     "scaling": None, "expand_dims": True,
                                                     "data_format": "channels_first"}, _signal(4, (2, 2, 30))),
    ("stft_real", "STFTSpectrogram", {"mode": "real", "frame_length": 8}, _signal(5, (2, 24, 1))),
    ("stft_imag", "STFTSpectrogram", {"mode": "imag", "frame_length": 8, "window": "blackman"},
     _signal(6, (2, 24, 1))),
    ("mel", "MelSpectrogram", {"fft_length": 64, "sequence_stride": 16, "num_mel_bins": 12, "sampling_rate": 8000},
     _signal(7, (2, 256))),
    ("mel_nodb", "MelSpectrogram", {"fft_length": 32, "sequence_stride": 8, "sequence_length": 24,
                                    "num_mel_bins": 6, "sampling_rate": 4000, "power_to_db": False, "mag_exp": 1.0,
                                    "min_freq": 100.0, "max_freq": 1500.0, "window": "hamming"},
     _signal(8, (3, 100))),
    ("mel_single", "MelSpectrogram", {"fft_length": 32, "sequence_stride": 10, "num_mel_bins": 8,
                                      "top_db": 20.0, "ref_power": 2.0}, _signal(9, (90,))),
]

_SCRIPT = r"""
import json, sys
import numpy as np
import keras
from keras import ops
work = sys.argv[1]
spec = json.load(open(f"{work}/cases.json"))
data = dict(np.load(f"{work}/in.npz"))
out = {}

def config_of(layer):
    config = layer.get_config()
    config.pop("dtype", None)
    return np.array(json.dumps(config, default=str))

for label, cls, kwargs, keys in spec["transform"]:
    layer = getattr(keras.layers, cls)(**kwargs)
    t = {k: data[f"{label}/t/{k}"] for k in keys}
    out[f"{label}/y"] = np.asarray(layer.transform_images(data[f"{label}/x"], t, training=True))
    out[f"{label}/config"] = config_of(layer)

for label, kwargs in spec["elastic"]:
    layer = keras.layers.RandomElasticTransform(**kwargs)
    out[f"{label}/config"] = config_of(layer)
    x = data[f"{label}/x"]
    cf = kwargs.get("data_format") == "channels_first"
    xl = np.transpose(x, (0, 2, 3, 1)) if cf else x
    n, h, w, c = xl.shape
    d = float(data[f"{label}/d"])
    alpha, sigma = max(h, w) * 0.1 * d, min(h, w) * 0.05 * d
    k = int(6 * sigma) | 1
    fields = []
    for name in ("dx", "dy"):
        f = data[f"{label}/{name}"] * sigma
        f = ops.image.gaussian_blur(f[..., None], kernel_size=(k, k), sigma=(sigma, sigma),
                                    data_format="channels_last")
        fields.append(np.asarray(f)[..., 0])
    yy, xx = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    order = 1 if kwargs.get("interpolation", "bilinear") == "bilinear" else 0
    res = np.zeros_like(xl)
    for b in range(n):
        for ch in range(c):
            res[b, ..., ch] = np.asarray(ops.image.map_coordinates(
                xl[b, ..., ch], [yy + alpha * fields[1][b], xx + alpha * fields[0][b]], order=order,
                fill_mode=kwargs.get("fill_mode", "reflect"), fill_value=kwargs.get("fill_value", 0.0)))
    apply = data[f"{label}/apply"].reshape(-1, 1, 1, 1)
    res = np.where(apply, res, xl)
    vr = kwargs.get("value_range", (0, 255))
    res = np.clip(res, vr[0], vr[1])
    out[f"{label}/y"] = np.transpose(res, (0, 3, 1, 2)) if cf else res

for label, cls, kwargs in spec["audio"]:
    layer = getattr(keras.layers, cls)(**kwargs)
    x = data[f"{label}/x"]
    out[f"{label}/y"] = np.asarray(layer(x))
    out[f"{label}/shape"] = np.array([-1 if s is None else s for s in layer.compute_output_shape(x.shape)])
    out[f"{label}/config"] = config_of(layer)
    for i, wt in enumerate(layer.weights):
        out[f"{label}/w{i}"] = np.asarray(wt)

import random as py_random

def flatten(value, prefix, arrays):
    if isinstance(value, dict):
        return {"dict": {k: flatten(v, f"{prefix}/{k}", arrays) for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return {"list": [flatten(v, f"{prefix}/{i}", arrays) for i, v in enumerate(value)]}
    if value is None or isinstance(value, str):
        return {"value": value}
    arrays[prefix] = np.asarray(value)
    return {"array": prefix}

for label, cls, kwargs, seed in spec["composite"]:
    py_random.seed(seed)
    layer = getattr(keras.layers, cls)(seed=seed, **kwargs)
    x = data[f"{label}/x"]
    t = layer.get_random_transformation(x, training=True)
    out[f"{label}/y"] = np.asarray(layer.transform_images(x, t, training=True))
    out[f"{label}/t"] = np.array(json.dumps(flatten(t, f"{label}/t", out)))
    out[f"{label}/config"] = config_of(layer)

np.savez(f"{work}/out.npz", **out)
"""

# (label, class, kwargs, seed, images): Keras draws the transformation, both apply it
COMPOSITE_CASES = [  # (one image shape, two cases: eager JAX compiles each op once per shape; the channels_first
    # case avoids auto_contrast, which Keras computes over axes 1 and 2 whatever the data format)
    ("augmix_few_cf_unit", "AugMix", {"all_ops": False, "num_chains": 2, "factor": 0.6, "value_range": (0, 1),
                                      "alpha": 0.5, "data_format": "channels_first"}, 6, _images(31, (2, 3, 8, 8),
                                                                                                 high=1.0)),
    ("randaugment", "RandAugment", {"num_ops": 3}, 4, _images(33, (2, 8, 8, 3))),
]


def _unflatten(node, arrays):
    if "dict" in node:
        return {k: _unflatten(v, arrays) for k, v in node["dict"].items()}
    if "list" in node:
        return [_unflatten(v, arrays) for v in node["list"]]
    if "value" in node:
        return node["value"]
    return arrays[node["array"]]


def _elastic_transformation(label, kwargs, x, apply, distortion):
    layer = layers.RandomElasticTransform(**kwargs)
    n = x.shape[0]
    h, w = (x.shape[1], x.shape[2]) if kwargs.get("data_format") != "channels_first" else x.shape[2:]
    rng = np.random.default_rng(len(label))
    return layer, {"apply_transform": np.array(apply), "distortion_factor": np.float32(distortion),
                   "dx": rng.normal(size=(n, h, w)).astype(np.float32),
                   "dy": rng.normal(size=(n, h, w)).astype(np.float32)}


@functools.lru_cache(maxsize=2)
def _keras_results(composites: bool = False) -> "dict | str":
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("jax") is None:
        return "real Keras 3 with JAX is not installed (test extra)"
    arrays, spec = {}, {"transform": [], "elastic": [], "audio": [], "composite": []}
    for label, cls, kwargs, seed, x in (COMPOSITE_CASES if composites else []):
        arrays[f"{label}/x"] = x
        spec["composite"].append([label, cls, kwargs, seed])
    for label, cls, kwargs, x, t in ([] if composites else TRANSFORM_CASES):
        arrays[f"{label}/x"] = x
        arrays.update({f"{label}/t/{k}": v for k, v in t.items()})
        spec["transform"].append([label, cls, kwargs, sorted(t)])
    for label, kwargs, x, apply, distortion in ([] if composites else ELASTIC_CASES):
        _, t = _elastic_transformation(label, kwargs, x, apply, distortion)
        arrays.update({f"{label}/x": x, f"{label}/dx": t["dx"], f"{label}/dy": t["dy"],
                       f"{label}/apply": t["apply_transform"], f"{label}/d": t["distortion_factor"]})
        spec["elastic"].append([label, kwargs])
    for label, cls, kwargs, x in ([] if composites else AUDIO_CASES):
        arrays[f"{label}/x"] = x
        spec["audio"].append([label, cls, kwargs])
    key = hashlib.sha256(_SCRIPT.encode() + json.dumps(spec).encode()
                         + b"".join(np.ascontiguousarray(arrays[k]).tobytes() for k in sorted(arrays))).hexdigest()[:16]
    done = os.path.join(tempfile.gettempdir(), f"dnnbind_aug2_{key}.npz")
    # one Keras run shared by the xdist workers (and by reruns of the same cases): a lock, then the file
    with open(done + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(done):
            work = tempfile.mkdtemp(prefix="dnnbind_aug2_")
            np.savez(os.path.join(work, "in.npz"), **arrays)
            with open(os.path.join(work, "cases.json"), "w") as f:
                json.dump(spec, f)
            env = {k: v for k, v in os.environ.items() if k != "KERAS_HOME"}
            env.update(KERAS_HOME=os.path.join(work, "kh"), KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
            proc = subprocess.run([sys.executable, "-c", _SCRIPT, work], capture_output=True, text=True, env=env,
                                  timeout=300)
            if proc.returncode != 0:
                raise AssertionError(f"the Keras side failed:\n{proc.stderr[-4000:]}")
            os.replace(os.path.join(work, "out.npz"), done)
    return dict(np.load(done))


def _theirs(composites: bool = False) -> dict:
    theirs = _keras_results(composites)
    if isinstance(theirs, str):
        pytest.skip(theirs)
    return theirs


def _same_config(layer, theirs, label):
    ours = layer.get_config()
    keras_config = json.loads(str(theirs[f"{label}/config"]))
    assert set(ours) - {"dtype"} == set(keras_config), label
    plain = json.loads(json.dumps(ours))
    for key, value in keras_config.items():
        if key != "name":
            assert plain[key] == value, (label, key)
    return type(layer).from_config(plain)


@pytest.mark.parametrize("label,cls,kwargs,x,t", TRANSFORM_CASES, ids=[c[0] for c in TRANSFORM_CASES])
def test_transform_images_matches_keras(label, cls, kwargs, x, t):
    theirs = _theirs()
    layer = getattr(layers, cls)(**kwargs)
    y = np.asarray(layer.transform_images(x, t, training=True))
    want = theirs[f"{label}/y"]
    assert y.dtype == want.dtype and y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-4)
    again = _same_config(layer, theirs, label)
    np.testing.assert_array_equal(np.asarray(again.transform_images(x, t, training=True)), y)


@pytest.mark.parametrize("label,kwargs,x,apply,distortion", ELASTIC_CASES, ids=[c[0] for c in ELASTIC_CASES])
def test_elastic_matches_keras_ops(label, kwargs, x, apply, distortion):
    theirs = _theirs()
    layer, t = _elastic_transformation(label, kwargs, x, apply, distortion)
    y = np.asarray(layer.transform_images(x, t, training=True))
    want = theirs[f"{label}/y"]
    assert y.shape == want.shape and y.dtype == np.float32
    assert not np.allclose(y[0], x[0], atol=1e-2)  # the field moves pixels
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=2e-3 if kwargs.get("value_range") is None else 1e-5)
    _same_config(layer, theirs, label)


def test_posterization_draws_and_inference():
    x = _images(10, (300, 2, 2, 3))
    layer = layers.RandomPosterization(factor=(2, 5), seed=3)
    shift = np.asarray(layer.get_random_transformation(x)["shift_factor"])
    assert shift.dtype == np.uint8 and set(np.unique(shift)) == {4, 5, 6}  # bits 2, 3, 4: randint excludes 5
    y = np.asarray(layer(x))
    assert not np.array_equal(y, x)
    np.testing.assert_array_equal(np.asarray(layer(x, training=False)), x)
    fixed = np.asarray(layers.RandomPosterization(factor=(3, 3)).get_random_transformation(x)["shift_factor"])
    np.testing.assert_array_equal(fixed, np.full(300, 5, np.uint8))


def test_elastic_draws_and_inference():
    x = _images(11, (6, 10, 12, 3))
    layer = layers.RandomElasticTransform(factor=(1.0, 1.0), scale=0.5, seed=5)
    t = layer.get_random_transformation(x)
    d = float(np.asarray(t["distortion_factor"]))
    assert 0.0 <= d < 0.5 and bool(np.all(np.asarray(t["apply_transform"])))
    assert np.asarray(t["dx"]).shape == (6, 10, 12) and not np.allclose(np.asarray(t["dx"]), np.asarray(t["dy"]))
    y1, y2 = np.asarray(layer(x)), np.asarray(layer(x))
    assert y1.shape == x.shape and not np.allclose(y1, y2)  # the counter advances
    assert y1.min() >= 0 and y1.max() <= 255
    np.testing.assert_array_equal(np.asarray(layer(x, training=False)), x)
    none = layers.RandomElasticTransform(factor=0.0)
    assert none.get_random_transformation(x) is None
    np.testing.assert_array_equal(np.asarray(none(x)), x)
    single = np.asarray(layers.RandomElasticTransform(factor=(1.0, 1.0), seed=1)(x[0]))
    assert single.shape == x[0].shape and not np.allclose(single, x[0])


@pytest.mark.parametrize("make,match", [
    (lambda: layers.RandomPosterization(factor=9), r"RandomPosterization .*`factor` argument should be .*\[1, 8\]"),
    (lambda: layers.RandomPosterization(factor=(9, 10)), r"RandomPosterization .*Received: factor=\(9, 10\)"),
    (lambda: layers.RandomPosterization(factor="4"), r"RandomPosterization .*`factor`"),
    (lambda: layers.RandomPosterization(factor=4, value_range=1), r"RandomPosterization .*value_range"),
    (lambda: layers.RandomElasticTransform(factor=1.5), r"RandomElasticTransform .*`factor`.*\[0, 1\]"),
    (lambda: layers.RandomElasticTransform(scale=(2, 3)), r"RandomElasticTransform .*`scale`"),
])
def test_bad_arguments_raise_value_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_keras_quirks_kept():
    # Keras checks a pair only as pair[0] <= high and pair[1] >= low
    assert layers.RandomPosterization(factor=(0, 10)).factor == (0, 10)
    assert layers.RandomPosterization(factor=5).factor == (1, 5)
    with pytest.raises(NotImplementedError, match="RandomElasticTransform .*interpolation"):
        layers.RandomElasticTransform(interpolation="bicubic")
    with pytest.raises(NotImplementedError, match="RandomElasticTransform .*fill_mode"):
        layers.RandomElasticTransform(fill_mode="edge")


@pytest.mark.parametrize("label,cls,kwargs,x", AUDIO_CASES, ids=[c[0] for c in AUDIO_CASES])
def test_audio_layers_match_keras(label, cls, kwargs, x):
    theirs = _theirs()
    layer = getattr(layers, cls)(**kwargs)
    y = np.asarray(layer(x))
    want = theirs[f"{label}/y"]
    assert y.shape == want.shape and y.dtype == want.dtype == np.float32, label
    assert tuple(layer.compute_output_shape(x.shape)) == y.shape
    if cls == "STFTSpectrogram":
        kernels = [np.asarray(w) for w in layer.weights]
        assert len(kernels) == sum(k.startswith(f"{label}/w") for k in theirs)
        for i, k in enumerate(kernels):
            np.testing.assert_allclose(k, theirs[f"{label}/w{i}"], rtol=1e-5, atol=1e-5)  # (Keras: float32 trig)
        assert tuple(int(s) for s in theirs[f"{label}/shape"]) == y.shape
    # angle: arctan2 near the branch cut or a vanishing bin may flip by 2 pi; compare on the circle
    if kwargs.get("mode") == "angle":
        np.testing.assert_allclose(np.cos(y), np.cos(want), atol=1e-4)
        np.testing.assert_allclose(np.sin(y), np.sin(want), atol=1e-4)
    else:
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * scale)
    again = _same_config(layer, theirs, label)
    np.testing.assert_allclose(np.asarray(again(x)), y, rtol=1e-6, atol=1e-6)


def _stft_reference(x, frame_length, step, nfft, window):
    """Frames (valid) times the window, through NumPy's rfft, scaled by the window's L2 norm: (batch, frames, bins)."""
    frames = np.stack([x[:, i:i + frame_length] for i in range(0, x.shape[1] - frame_length + 1, step)], axis=1)
    spec = np.fft.rfft(frames * window, n=nfft) / np.sqrt(np.sum(window ** 2))
    return spec


def test_stft_spectrogram_against_numpy_fft_and_trains():
    x = _signal(20, (2, 40, 1)).astype(np.float64)
    layer = layers.STFTSpectrogram(mode="stft", frame_length=8, frame_step=4, dtype="float64")
    y = np.asarray(layer(x))
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(8) / 7)  # symmetric (periodic=False)
    ref = _stft_reference(x[..., 0], 8, 4, 8, hann)
    np.testing.assert_allclose(y, np.concatenate([ref.real, ref.imag], axis=-1), rtol=1e-10, atol=1e-10)
    assert [w.name for w in layer.trainable_weights] == ["real_kernel", "imag_kernel"]
    assert np.asarray(layers.STFTSpectrogram(mode="real", frame_length=8)(x.astype(np.float32))).shape == (2, 9, 5)
    assert [w.name for w in layers.STFTSpectrogram(mode="imag", frame_length=8).weights] == []  # (not built yet)


def test_mel_spectrogram_filter_bank_and_db_floor():
    from layers.audio_preprocessing import linear_to_mel_weight_matrix

    m = linear_to_mel_weight_matrix(10, 33, 8000, 100.0, 3000.0)
    assert m.shape == (33, 10) and m.dtype == np.float32 and np.all(m[0] == 0) and np.all(m >= 0)
    assert np.all(m.max(axis=0) > 0.3) and np.all(m <= 1.0)
    x = _signal(21, (2, 200))
    db = np.asarray(layers.MelSpectrogram(fft_length=64, sequence_stride=16, num_mel_bins=10, top_db=15.0)(x))
    assert db.shape == (2, 10, 200 // 16 + 1)
    np.testing.assert_allclose(db.min(), db.max() - 15.0, rtol=1e-5)


@pytest.mark.parametrize("make,error,match", [
    (lambda: layers.STFTSpectrogram(frame_length=16, frame_step=20), ValueError, r"STFTSpectrogram .*frame_step"),
    (lambda: layers.STFTSpectrogram(frame_length=16, fft_length=8), ValueError, r"STFTSpectrogram .*fft_length"),
    (lambda: layers.STFTSpectrogram(mode="power"), ValueError, r"STFTSpectrogram .*mode=power"),
    (lambda: layers.STFTSpectrogram(scaling="l2"), ValueError, r"STFTSpectrogram .*Scaling"),
    (lambda: layers.STFTSpectrogram(padding="causal"), ValueError, r"STFTSpectrogram .*padding=causal"),
    (lambda: layers.STFTSpectrogram(window="kaiser-ish"), ValueError, r"window"),
    (lambda: layers.STFTSpectrogram(frame_length=8)(np.zeros((2, 16), np.float32)), ValueError, r"rank 3"),
    (lambda: layers.STFTSpectrogram(frame_length=8)(np.zeros((2, 16, 1), np.int32)), TypeError, r"float16"),
    (lambda: layers.MelSpectrogram(fft_length=32, sequence_length=64), ValueError, r"MelSpectrogram .*fft_length"),
    (lambda: layers.MelSpectrogram(fft_length=32)(np.zeros((2, 3, 64), np.float32)), ValueError, r"rank 1"),
])
def test_audio_bad_arguments(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.slow  # (Keras's composites in eager JAX: about a minute on 2 cores)
@pytest.mark.parametrize("label,cls,kwargs,seed,x", COMPOSITE_CASES, ids=[c[0] for c in COMPOSITE_CASES])
def test_composites_apply_keras_transformations(label, cls, kwargs, seed, x):
    theirs = _theirs(composites=True)
    layer = getattr(layers, cls)(seed=seed, **kwargs)
    t = _unflatten(json.loads(str(theirs[f"{label}/t"])), theirs)
    y = np.asarray(layer.transform_images(x, t, training=True))
    want = theirs[f"{label}/y"]
    assert y.shape == want.shape and y.dtype == want.dtype
    assert not np.allclose(want, x, atol=1e-3)
    if kwargs.get("data_format") == "channels_first":
        used = ([s["layer_name"] for c in t["chain_transforms"] for s in c] if cls == "AugMix" else
                [layers.image_augmentation2.RANDAUGMENT_LAYERS[i] for i in np.asarray(t["layer_idxes"])])
        assert "auto_contrast" not in used, f"pick another seed for {label}: Keras's AutoContrast ignores data_format"
    high = 1.0 if kwargs.get("value_range") else 255.0
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=2e-3 * high)
    _same_config(layer, theirs, label)


def test_composites_draw_on_their_generator_and_select_by_index():
    x = _images(40, (2, 8, 8, 3))
    aug = layers.AugMix(seed=3)
    t = aug.get_random_transformation(x)
    w = np.asarray(t["chain_mixing_weights"])
    assert w.shape == (3,) and np.isclose(w.sum(), 1.0) and 0 <= float(np.asarray(t["weight_sample"])) <= 1
    assert len(t["chain_transforms"]) == 3 and all(len(c) == 3 for c in t["chain_transforms"])
    # every step "nothing": the mix of unchanged images is the images
    for chain in t["chain_transforms"]:
        for step in chain:
            step["layer_index"] = np.int32(len(aug._augment_layers))
    np.testing.assert_allclose(np.asarray(aug.transform_images(x, t)), x, rtol=1e-5, atol=1e-3)
    # a picked index applies that layer's own transformation
    step = t["chain_transforms"][0][0]
    step["layer_index"] = np.int32(aug._augment_layers.index("solarization"))
    alone = np.asarray(aug.solarization.transform_images(x, step["transformations"]["solarization"]))
    np.testing.assert_allclose(np.asarray(aug._step(layers.image_augmentation2._ops.convert_to_tensor(x), step)),
                               alone, rtol=1e-6)
    y1, y2 = np.asarray(aug(x)), np.asarray(aug(x))
    assert not np.allclose(y1, y2) and y1.min() >= 0 and y1.max() <= 255
    np.testing.assert_array_equal(np.asarray(aug(x, training=False)), x)

    ra = layers.RandAugment(num_ops=2, seed=4)
    t = ra.get_random_transformation(x)
    idx = np.asarray(t["layer_idxes"])
    assert idx.shape == (2,) and set(t["transforms"]) == set(layers.image_augmentation2.RANDAUGMENT_LAYERS)
    t["layer_idxes"] = np.array([0, 8], np.int32)  # random_shear, then solarization
    want = ra.solarization.transform_images(ra.random_shear.transform_images(x, t["transforms"]["random_shear"]),
                                            t["transforms"]["solarization"])
    np.testing.assert_allclose(np.asarray(ra.transform_images(x, t)), np.asarray(want), rtol=1e-6, atol=1e-4)
    np.testing.assert_array_equal(np.asarray(ra(x, training=False)), x)
    assert not np.allclose(np.asarray(ra(x)), np.asarray(ra(x)))
    for layer in (aug, ra):
        again = type(layer).from_config(json.loads(json.dumps(layer.get_config())))
        assert json.loads(json.dumps(again.get_config())) == json.loads(json.dumps(layer.get_config()))


@pytest.mark.parametrize("make,match", [
    (lambda: layers.AugMix(factor=1.5), r"AugMix .*`factor`.*\[0, 1\]"),
    (lambda: layers.AugMix(num_chains=0), r"AugMix .*num_chains"),
    (lambda: layers.AugMix(value_range=3), r"AugMix .*value_range"),
    (lambda: layers.RandAugment(factor=(2, 3)), r"RandAugment .*`factor`"),
    (lambda: layers.RandAugment(num_ops=-1), r"RandAugment .*num_ops"),
])
def test_composite_bad_arguments(make, match):
    with pytest.raises(ValueError, match=match):
        make()
