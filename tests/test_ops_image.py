"""Image ops (``dnnbind/ops/_image.py``) beyond the registry cases: the fill modes' documented patterns,
TensorFlow's area resize and projective transforms against direct NumPy loops, elastic fields against
SciPy, integer images, gradients w.r.t. filter parameters, errors naming the op, and that every op is
composed of numeric kernels with no host read (so it runs on the CUDA backend as it is)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage as ndi

import dnnbind
from dnnbind import ops
from dnnbind.autodiff import GradientTape
from dnnbind.autodiff.tensor import Tensor
from dnnbind.kernels import linalg as LA
from dnnbind.ops import _image


pytestmark = pytest.mark.usefixtures("cpu")  # conftest: the NumPy backend, then the default back


rng = np.random.default_rng(11)


# ---------------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("mode, pattern", [
    ("constant", "kkkk abcd kkkk"), ("nearest", "aaaa abcd dddd"), ("wrap", "abcd abcd abcd"),
    ("mirror", "cdcb abcd cbab"), ("reflect", "dcba abcd dcba")])
def test_fill_modes_follow_the_documented_patterns(mode, pattern):
    """Keras's docstring: e.g. mirror is ``(c d c b | a b c d | c b a b)``."""
    x = np.array([1.0, 2.0, 3.0, 4.0])
    values = dict(zip("abcdk", [1.0, 2.0, 3.0, 4.0, -9.0]))
    want = [values[ch] for ch in pattern.replace(" ", "")]
    coords = np.arange(-4.0, 8.0)[None]
    for order in (0, 1):  # integer coordinates: both orders pick the pixel
        got = ops.map_coordinates(x, coords, order, fill_mode=mode, fill_value=-9.0)
        np.testing.assert_array_equal(np.asarray(got), want)


def test_nearest_rounds_half_away_from_zero_and_integer_images_round_back():
    x = np.arange(6.0)
    np.testing.assert_array_equal(np.asarray(ops.map_coordinates(x, [[0.5, 1.5, 2.5, -0.5]], 0, "nearest")),
                                  [1.0, 2.0, 3.0, 0.0])
    xi = np.array([[0, 10], [20, 30]], np.int32)
    got = ops.map_coordinates(xi, [[0.5, 0.25], [0.5, 0.5]], 1)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(got), [15, 10])  # 15 exactly; 10.0 (7.5 + 2.5) rounded


def _projective_nearest(img, t):
    """TensorFlow's ImageProjectiveTransform with nearest sampling and constant 0 fill, as loops."""
    h, w, _ = img.shape
    out = np.zeros_like(img)
    a0, a1, a2, b0, b1, b2, c0, c1 = t
    for y in range(h):
        for x in range(w):
            k = c0 * x + c1 * y + 1
            xi, yi = (a0 * x + a1 * y + a2) / k, (b0 * x + b1 * y + b2) / k
            r, c = int(np.floor(yi + 0.5)), int(np.floor(xi + 0.5))
            if 0 <= r < h and 0 <= c < w:
                out[y, x] = img[r, c]
    return out


def test_affine_transform_is_projective_with_c0_c1():
    img = rng.uniform(size=(6, 7, 2))
    t = np.array([0.91, 0.13, 0.37, -0.08, 1.07, 0.21, 0.031, -0.027])
    got = ops.affine_transform(img, t, interpolation="nearest")
    np.testing.assert_array_equal(np.asarray(got), _projective_nearest(img, t))
    with pytest.raises(ValueError, match="affine_transform: transform has 3 rows for 2 images"):
        ops.affine_transform(np.zeros((2, 4, 4, 1)), np.zeros((3, 8)))


def test_perspective_transform_with_equal_points_is_the_identity():
    img = rng.uniform(size=(2, 5, 6, 3))
    pts = np.array([[0.0, 0.0], [0.0, 4.0], [5.0, 0.0], [5.0, 4.0]])
    np.testing.assert_allclose(np.asarray(ops.perspective_transform(img, pts, pts)), img, atol=1e-12)
    shifted = ops.perspective_transform(img, pts, pts + [1.0, 0.0])  # output x samples input x - 1
    np.testing.assert_allclose(np.asarray(shifted)[:, :, 1:], img[:, :, :-1], atol=1e-12)
    np.testing.assert_array_equal(np.asarray(shifted)[:, :, 0], 0.0)


def test_elastic_transform_matches_scipy_on_its_own_fields():
    img = rng.uniform(size=(2, 6, 7, 3))
    out = ops.elastic_transform(img, alpha=3.0, sigma=1.2, fill_mode="mirror", seed=5)
    dy, dx = _image._displacements(2, 6, 7, 1.2, 5, np.dtype(np.float64), ops.convert_to_tensor(img))
    rows, cols = np.meshgrid(np.arange(6.0), np.arange(7.0), indexing="ij")
    for b in range(2):
        coords = [rows + 3.0 * np.asarray(dy)[b], cols + 3.0 * np.asarray(dx)[b]]
        for c in range(3):
            want = ndi.map_coordinates(img[b, :, :, c], coords, order=1, mode="mirror")
            np.testing.assert_allclose(np.asarray(out)[b, :, :, c], want, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(ops.elastic_transform(img, 3.0, 1.2, seed=5)),
                                  np.asarray(ops.elastic_transform(img, 3.0, 1.2, seed=5)))
    assert not np.allclose(np.asarray(ops.elastic_transform(img, 3.0, 1.2, seed=6)),
                           np.asarray(ops.elastic_transform(img, 3.0, 1.2, seed=5)))
    np.testing.assert_allclose(np.asarray(ops.elastic_transform(img, alpha=0.0, sigma=1.0)), img, atol=1e-12)
    dnnbind.utils.set_random_seed(3)
    first = np.asarray(ops.elastic_transform(img))
    dnnbind.utils.set_random_seed(3)
    np.testing.assert_array_equal(np.asarray(ops.elastic_transform(img)), first)


# ---------------------------------------------------------------------------------- resizing
def _area_loops(img, size):
    """TensorFlow's area resize by integration: each output pixel averages its box of the input."""
    h, w = img.shape[:2]
    oh, ow = size
    sy, sx = h / oh, w / ow
    out = np.zeros((oh, ow) + img.shape[2:])
    for i in range(oh):
        for j in range(ow):
            acc = 0.0
            for y in range(h):
                wy = max(0.0, min(y + 1, (i + 1) * sy) - max(y, i * sy))
                for x in range(w):
                    wx = max(0.0, min(x + 1, (j + 1) * sx) - max(x, j * sx))
                    acc = acc + wy * wx * img[y, x]
            out[i, j] = acc / (sy * sx)
    return out


@pytest.mark.parametrize("size", [(3, 2), (4, 5), (9, 4)])
def test_area_resize_averages_boxes(size):
    img = rng.uniform(size=(6, 5, 2))
    np.testing.assert_allclose(np.asarray(ops.resize(img, size, interpolation="area")), _area_loops(img, size),
                               rtol=1e-12, atol=1e-12)


def test_resize_of_integer_images_rounds_and_saturates():
    img = np.zeros((1, 8, 1), np.uint8)
    img[0, 4:] = 255  # a step: bicubic overshoots it
    out = ops.resize(img, (1, 16), interpolation="bicubic")
    assert out.dtype == np.uint8
    f = np.asarray(ops.resize(img.astype(np.float32), (1, 16), interpolation="bicubic"))
    assert f.max() > 255 and f.min() < 0
    np.testing.assert_array_equal(np.asarray(out), np.clip(np.round(f), 0, 255).astype(np.uint8))
    np.testing.assert_array_equal(np.asarray(ops.resize(img, (1, 4), interpolation="nearest")), img[:, ::2])


def test_resize_keeps_identity_axes_and_antialias_only_widens_downscales():
    img = rng.uniform(size=(2, 5, 6, 3))
    np.testing.assert_array_equal(np.asarray(ops.resize(img, (5, 6), interpolation="lanczos5")), img)
    up = [np.asarray(ops.resize(img, (10, 12), antialias=a)) for a in (False, True)]
    np.testing.assert_array_equal(up[0], up[1])
    down = [np.asarray(ops.resize(img, (2, 3), antialias=a)) for a in (False, True)]
    assert not np.allclose(down[0], down[1])


def test_gaussian_blur_is_differentiable_in_sigma():
    img = ops.convert_to_tensor(rng.uniform(size=(1, 5, 6, 1)))
    sigma = ops.convert_to_tensor(np.array(1.3))
    w = rng.normal(size=(1, 5, 6, 1))

    def loss(s):
        return ops.sum(ops.gaussian_blur(img, (5, 5), (s, s), data_format="channels_last") * w)

    with GradientTape() as tape:
        tape.watch(sigma)
        y = loss(sigma)
    eps = 1e-6
    num = (float(loss(1.3 + eps)) - float(loss(1.3 - eps))) / (2 * eps)
    np.testing.assert_allclose(float(tape.gradient(y, sigma)), num, rtol=1e-6)
    assert float(y) == pytest.approx(float(loss(1.3)))


# ------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("call, error, match", [
    (lambda: ops.resize(np.zeros((4, 4)), (2, 2)), ValueError, "resize: images must have rank 3 or 4"),
    (lambda: ops.resize(np.zeros((4, 4, 1)), (2,)), ValueError, "resize: size must be \\(height, width\\)"),
    (lambda: ops.resize(np.zeros((4, 4, 1)), (0, 2)), ValueError, "positive height and width"),
    (lambda: ops.resize(np.zeros((4, 4, 1)), (2, 2), interpolation="cubic"), ValueError, "interpolation must be one"),
    (lambda: ops.resize(np.zeros((4, 4, 1)), (2, 2), crop_to_aspect_ratio=True, pad_to_aspect_ratio=True),
     ValueError, "only one of pad_to_aspect_ratio and crop_to_aspect_ratio"),
    (lambda: ops.resize(np.zeros((4, 4, 1)), (2, 2), fill_mode="reflect"), ValueError, "fill_mode must be one"),
    (lambda: ops.resize(np.zeros((4, 4, 1)), (2, 2), data_format="nhwc"), ValueError, "data_format must be"),
    (lambda: ops.rgb_to_hsv(np.zeros((4, 4, 3), np.int32)), ValueError, "rgb_to_hsv: images must have a float"),
    (lambda: ops.hsv_to_rgb(np.zeros((4, 4, 2))), ValueError, "hsv_to_rgb: images must have 3 channels"),
    (lambda: ops.rgb_to_grayscale(np.zeros((4, 4, 2))), ValueError, "expected 3 \\(RGB\\) or 1"),
    (lambda: ops.map_coordinates(np.zeros((3, 3)), np.zeros((3, 4)), 1), ValueError, "must be the rank of inputs"),
    (lambda: ops.map_coordinates(np.zeros((3, 3)), np.zeros((2, 4)), 2), ValueError, "order must be one of"),
    (lambda: ops.map_coordinates(np.zeros((3, 3)), np.zeros((2, 4)), 1, "edge"), ValueError, "fill_mode must be"),
    (lambda: ops.affine_transform(np.zeros((4, 4, 1)), np.zeros(6)), ValueError, "transform must have shape"),
    (lambda: ops.affine_transform(np.zeros((4, 4, 1)), np.zeros(8), "bicubic"), ValueError, "interpolation"),
    (lambda: ops.perspective_transform(np.zeros((4, 4, 1)), np.zeros((4, 2)), np.zeros((3, 2))), ValueError,
     "end_points must have shape"),
    (lambda: ops.extract_patches(np.zeros((4, 4, 1)), "3"), TypeError, "size must be an int or a tuple"),
    (lambda: ops.extract_patches(np.zeros((4, 4, 1)), (1, 2, 3, 4)), ValueError, "tuple of length 2 or 3"),
    (lambda: ops.extract_patches(np.zeros((4, 4, 1)), 5), ValueError, "do not fit"),
    (lambda: ops.extract_patches(np.zeros((4, 4, 1)), 2, padding="full"), ValueError, "padding must be one"),
    (lambda: ops.ssim(np.zeros((4, 4, 1)), np.zeros((4, 4, 1))), ValueError, "ssim: filter_size must be in"),
    (lambda: ops.ssim(np.zeros((4, 4, 1)), np.zeros((4, 5, 1))), ValueError, "same shape"),
    (lambda: ops.sobel_edges(np.zeros((4, 4, 1))), ValueError, "sobel_edges: images must have rank 4"),
    (lambda: ops.pad_images(np.zeros((4, 4, 1)), 1, 1), ValueError, "give exactly two of top_padding"),
    (lambda: ops.pad_images(np.zeros((4, 4, 1)), 2, 0, target_height=5, target_width=4), ValueError,
     "bottom_padding must be >= 0"),
    (lambda: ops.crop_images(np.zeros((4, 4, 1)), 1, 1, target_height=4, target_width=2), ValueError,
     "leaves images of height 4"),
    (lambda: ops.scale_and_translate(np.zeros((4, 4)), (8, 8), [2.0, 2.0], [0.0, 0.0], (0, 1), "nearest"),
     ValueError, "method must be one of"),
    (lambda: ops.scale_and_translate(np.zeros((4, 4)), (8, 8), [2.0], [0.0], (0, 1), "linear"), ValueError,
     "one entry per spatial dim"),
    (lambda: ops.elastic_transform(np.zeros((4, 4, 1)), seed="x"), TypeError, "seed must be an int or None"),
])
def test_bad_input_is_refused_naming_the_op(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ------------------------------------------------------------------------------------ devices
_IMG = rng.uniform(size=(1, 5, 6, 3))
_CALLS = {
    "resize": lambda x: ops.resize(x, (3, 8), interpolation="lanczos3", antialias=True),
    "resize_area_crop": lambda x: ops.resize(x, (4, 4), interpolation="area", crop_to_aspect_ratio=True),
    "resize_nearest_pad": lambda x: ops.resize(x, (2, 5), interpolation="nearest", pad_to_aspect_ratio=True),
    "scale_and_translate": lambda x: ops.scale_and_translate(x, (1, 4, 9, 3), np.array([0.8, 1.5]),
                                                           np.array([0.2, -0.4]), (1, 2), "cubic"),
    "affine_transform": lambda x: ops.affine_transform(x, np.array([1.1, 0.1, -0.3, 0.05, 0.9, 0.2, 0, 0]),
                                                     fill_mode="reflect"),
    "perspective_transform": lambda x: ops.perspective_transform(
        x, np.array([[0, 0], [0, 4], [5, 0], [5, 4.0]]), np.array([[0.3, 0.1], [0.2, 4.1], [5.2, -0.2], [4.9, 3.8]])),
    "elastic_transform": lambda x: ops.elastic_transform(x, 2.0, 1.0, seed=1),
    "map_coordinates": lambda x: ops.map_coordinates(x[0, :, :, 0], rng.uniform(-1, 6, (2, 4)), 1, "wrap"),
    "gaussian_blur": lambda x: ops.gaussian_blur(x, (3, 3), (0.8, 1.1)),
    "sobel_edges": lambda x: ops.sobel_edges(x),
    "ssim": lambda x: ops.ssim(x, x * 0.5, filter_size=3),
    "colours": lambda x: ops.hsv_to_rgb(ops.rgb_to_hsv(ops.rgb_to_grayscale(x) * np.ones(3))),
    "extract_patches": lambda x: ops.extract_patches(x, (2, 3), strides=1, padding="same"),
    "extract_patches_3d": lambda x: ops.extract_patches_3d(ops.expand_dims(x, -1), 2, padding="same"),
    "pad_and_crop": lambda x: ops.crop_images(ops.pad_images(x, 1, 1, 1, 1), 1, 1, 1, 1),
}


@pytest.mark.parametrize("name", sorted(_CALLS))
def test_image_ops_compose_numeric_kernels_without_host_reads(monkeypatch, name):
    """What makes them run on the CUDA backend unchanged: no LAPACK kernel, no tensor read on the host
    (during the forward and the backward)."""
    for fn in LA.__all__:
        monkeypatch.setattr(LA, fn, lambda *a, **k: pytest.fail("a LAPACK kernel ran"))
    for method in ("numpy", "__array__", "item", "__bool__", "__float__", "__int__", "__index__"):
        monkeypatch.setattr(Tensor, method, lambda *a, **k: pytest.fail(f"a host read ({method})"))
    img = ops.convert_to_tensor(_IMG)
    with GradientTape() as tape:
        tape.watch(img)
        out = _CALLS[name](img)
        loss = ops.sum(out if not isinstance(out, tuple) else out[0])
    tape.gradient(loss, img)
