"""Cases of the image family (``dnnbind/ops/_image.py``): NumPy/SciPy references where an independent one
exists, finite-difference gradients, and real Keras 3 on JAX (``keras.ops.image``). ``data_format`` is
passed explicitly to ``gaussian_blur`` (Keras's JAX backend reads None there as channels_first).
Behaviour beyond these tables (area resizing, elastic fields, fill modes) is in tests/test_ops_image.py."""

import dataclasses

import numpy as np
import scipy.ndimage as ndi

from . import A, Case, I

IMG = A((2, 6, 7, 3), 0.0, 1.0)
G = A((1, 4, 5, 3), 0.0, 1.0)  # gradient cases: finite differences cost two forwards per element
GFIRST = A((1, 3, 4, 5), 0.0, 1.0)
ONE = A((6, 7, 3), 0.0, 1.0)
FIRST = A((2, 3, 6, 7), 0.0, 1.0)
# transforms and points away from integer sample coordinates (bilinear sampling has kinks there)
TRANSFORM = np.array([[1.0313, 0.0712, -0.4137, -0.0591, 0.9637, 0.3311, 0.0, 0.0],
                      [0.8817, -0.1219, 1.2233, 0.1107, 1.1491, -0.7719, 0.0, 0.0]])
START = np.array([[[0.0, 0.0], [0.0, 6.0], [7.0, 0.0], [7.0, 6.0]]] * 2)  # (x, y) of a 7 x 6 image
END = np.array([[[0.31, 0.17], [0.23, 5.61], [6.13, -0.43], [6.77, 5.89]],
                [[-0.27, 0.41], [0.57, 6.29], [7.33, 0.21], [6.41, 5.53]]])


def _gray(x, data_format="channels_last"):
    axis = -1 if data_format == "channels_last" else -3
    return np.expand_dims(np.tensordot(x, np.array([0.2989, 0.5870, 0.1140]), axes=(axis, 0)), axis)


def _map_ref(x, coords, order, fill_mode="constant", fill_value=0.0):
    """SciPy's map_coordinates, padded first as Keras's NumPy backend does (SciPy's edges differ)."""
    pad = [(max(-int(np.floor(c.min())) + 1, 0), max(int(np.ceil(c.max())) + 1 - n, 0)) for c, n in zip(coords, x.shape)]
    mode = {"nearest": "edge", "mirror": "reflect", "reflect": "symmetric"}.get(fill_mode, fill_mode)
    padded = np.pad(x, pad, mode=mode, **({"constant_values": fill_value} if mode == "constant" else {}))
    shifted = [c + p[0] for p, c in zip(pad, coords)]
    return ndi.map_coordinates(padded, shifted, order=order, mode=fill_mode, cval=fill_value)


def _patches_ref(x, size, strides):
    n, h, w, c = x.shape
    ph, pw = size
    sh, sw = strides
    oh, ow = (h - ph) // sh + 1, (w - pw) // sw + 1
    out = np.zeros((n, oh, ow, ph * pw * c))
    for i in range(oh):
        for j in range(ow):
            out[:, i, j] = x[:, i * sh:i * sh + ph, j * sw:j * sw + pw, :].reshape(n, -1)
    return out


def _sobel_ref(x):
    p = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    dy = (p[:, 2:, :-2] + 2 * p[:, 2:, 1:-1] + p[:, 2:, 2:]) - (p[:, :-2, :-2] + 2 * p[:, :-2, 1:-1] + p[:, :-2, 2:])
    dx = (p[:, :-2, 2:] + 2 * p[:, 1:-1, 2:] + p[:, 2:, 2:]) - (p[:, :-2, :-2] + 2 * p[:, 1:-1, :-2] + p[:, 2:, :-2])
    return np.stack([dy, dx], axis=-1)


def _blur_ref(x, kernel_size, sigma, data_format):
    """A direct 2-d correlation with the Keras backends' kernel (outer(y from size[1], x from size[0]))."""
    def taps(k, s):
        t = np.exp(-0.5 * ((np.arange(k) - (k - 1) / 2) / s) ** 2)
        return t / t.sum()
    kern = np.outer(taps(kernel_size[1], sigma[1]), taps(kernel_size[0], sigma[0]))
    kh, kw = kern.shape
    p = np.pad(x, ((0, 0), ((kh - 1) // 2, kh - 1 - (kh - 1) // 2), ((kw - 1) // 2, kw - 1 - (kw - 1) // 2), (0, 0)))
    out = np.zeros_like(x)
    for i in range(kh):
        for j in range(kw):
            out += kern[i, j] * p[:, i:i + x.shape[1], j:j + x.shape[2]]
    return out


CASES = [
    Case("rgb_to_grayscale", (G,), grad=(0,), ref=_gray),
    Case("rgb_to_grayscale", (FIRST,), {"data_format": "channels_first"}, name="channels_first", ref=_gray),
    Case("rgb_to_grayscale", (I((6, 7, 3), 0, 255, "uint8"),), name="uint8"),
    Case("rgb_to_hsv", (G,), grad=(0,)),
    Case("rgb_to_hsv", (FIRST,), {"data_format": "channels_first"}, name="channels_first"),
    Case("hsv_to_rgb", (G,), grad=(0,)),
    Case("hsv_to_rgb", (FIRST,), {"data_format": "channels_first"}, name="channels_first"),
    Case("resize", (G, (3, 7)), grad=(0,)),
    *[Case("resize", (IMG, (9, 5)), {"interpolation": m}, name=m) for m in ("nearest", "bicubic", "lanczos3", "lanczos5")],
    Case("resize", (G, (6, 3)), {"interpolation": "bicubic", "antialias": True}, grad=(0,), name="antialias"),
    Case("resize", (IMG, (3, 4)), {"interpolation": "lanczos3", "antialias": True}, name="lanczos_aa"),
    Case("resize", (ONE, (4, 4)), {"crop_to_aspect_ratio": True}, name="crop"),
    Case("resize", (GFIRST, (4, 3)), {"pad_to_aspect_ratio": True, "fill_value": 0.5, "data_format": "channels_first"},
         grad=(0,), name="pad_channels_first"),
    Case("resize", (IMG, (8, 5)), {"pad_to_aspect_ratio": True}, name="pad_width"),
    Case("resize", (I((2, 6, 7, 3), 0, 255, "uint8"), (4, 9)), name="uint8"),
    Case("resize", (G, (3, 2)), {"interpolation": "area"}, grad=(0,), keras=False, name="area"),
    Case("scale_and_translate", (G, (1, 7, 3, 3), A((2,), 0.6, 1.6), A((2,), -1.0, 1.0), (1, 2), "linear"),
         grad=(0, 2, 3)),
    Case("scale_and_translate", (G, (1, 3, 8, 3), A((2,), 0.6, 1.6), A((2,), -1.0, 1.0), (1, 2), "lanczos5"),
         {"antialias": True}, grad=(0, 2, 3), name="lanczos5_True"),
    *[Case("scale_and_translate", (IMG, (2, 4, 9, 3), A((2,), 0.6, 1.6), A((2,), -1.0, 1.0), (1, 2), m),
           {"antialias": aa}, name=f"{m}_{aa}") for m, aa in (("cubic", True), ("lanczos3", False), ("bilinear", False))],
    Case("affine_transform", (G, TRANSFORM[:1]), grad=(0,)),
    # the transform's gradient: c0, c1 enter as TensorFlow's projective k (Keras's JAX backend multiplies
    # them by the channel index instead), so this one is checked against finite differences only
    Case("affine_transform", (G, TRANSFORM[:1]), grad=(1,), keras=False, name="transform_gradient"),
    *[Case("affine_transform", (IMG, TRANSFORM), {"fill_mode": m, "fill_value": 0.25}, name=m)
      for m in ("nearest", "wrap", "mirror", "reflect")],
    Case("affine_transform", (ONE, TRANSFORM[0]), {"interpolation": "nearest"}, name="nearest_single"),
    Case("affine_transform", (GFIRST, TRANSFORM[1:]), {"data_format": "channels_first"}, grad=(0,),
         name="channels_first"),
    Case("perspective_transform", (G, START[:1], END[:1]), grad=(0, 1, 2)),
    Case("perspective_transform", (IMG, START, END), name="batch"),
    Case("perspective_transform", (ONE, START[0], END[0]), {"interpolation": "nearest", "fill_value": 0.5},
         name="nearest_single"),
    *[Case("map_coordinates", (A((5, 6)), A((2, 3, 4), -1.6, 6.6), order), {"fill_mode": m, "fill_value": 0.3},
           grad=(0, 1) if (order, m) == (1, "constant") else (), name=f"{m}_{order}", ref=_map_ref)
      for m in ("constant", "nearest", "wrap", "mirror", "reflect") for order in (0, 1)],
    Case("map_coordinates", (A((3, 4, 5)), A((3, 7), -0.5, 4.5), 1), grad=(0, 1), name="3d", ref=_map_ref),
    Case("gaussian_blur", (G,), {"kernel_size": (3, 5), "sigma": (1.0, 2.0), "data_format": "channels_last"},
         grad=(0,), ref=_blur_ref),
    Case("gaussian_blur", (FIRST,), {"kernel_size": (4, 3), "sigma": (1.5, 0.7), "data_format": "channels_first"},
         name="channels_first"),
    Case("sobel_edges", (G,), grad=(0,), ref=_sobel_ref),
    Case("sobel_edges", (FIRST,), {"data_format": "channels_first"}, name="channels_first"),
    Case("ssim", (G, G), {"filter_size": 3}, grad=(0, 1)),
    Case("ssim", (ONE, ONE), {"filter_size": 5, "filter_sigma": 1.1, "max_val": 2.0}, name="single"),
    Case("extract_patches", (IMG, 2), ref=lambda x, s: _patches_ref(x, (s, s), (s, s))),
    Case("extract_patches", (IMG, (3, 2)), {"strides": (2, 1)}, name="strides",
         ref=lambda x, s, strides: _patches_ref(x, s, strides)),
    Case("extract_patches", (G, (3, 2)), {"strides": 1, "padding": "same"}, grad=(0,), name="same"),
    Case("extract_patches", (FIRST, (2, 3)), {"strides": 1, "dilation_rate": 2, "data_format": "channels_first"},
         name="dilated_channels_first"),
    Case("extract_patches", (A((1, 5, 6, 4, 2)), (2, 3, 2)), name="3d"),
    Case("extract_patches_3d", (A((1, 4, 3, 4, 2)), (2, 3, 2)), {"strides": 1}, grad=(0,)),
    Case("extract_patches_3d", (A((5, 6, 4, 2)), 2), {"padding": "same", "strides": 2}, name="same_single"),
    Case("pad_images", (G, 1, 2), {"target_height": 7, "target_width": 8}, grad=(0,),
         ref=lambda x, t, l, target_height, target_width: np.pad(x, ((0, 0), (1, 2), (2, 1), (0, 0)))),
    Case("pad_images", (FIRST,), {"bottom_padding": 2, "right_padding": 1, "top_padding": 0, "left_padding": 3,
                                  "data_format": "channels_first"}, name="channels_first"),
    Case("crop_images", (G, 1, 2), {"target_height": 2, "target_width": 3}, grad=(0,),
         ref=lambda x, t, l, target_height, target_width: x[:, 1:3, 2:5]),
    Case("crop_images", (ONE,), {"bottom_cropping": 2, "right_cropping": 1, "target_height": 3, "target_width": 5},
         name="single", ref=lambda x, **k: x[1:4, 1:6]),
    # The displacement fields are float32 Box-Muller draws on both backends, so float64 inputs agree
    # only to float32 resolution (~1e-8 here); the GPU case runs in the float32-based dtypes.
    Case("elastic_transform", (G,), {"alpha": 2.0, "sigma": 1.0, "seed": 7}, grad=(0,), keras=False,
         gpu_dtypes=("float32", "float16", "bfloat16")),
]

# One or two Keras comparisons per op (each compiles on JAX, about a second); the rest are checked
# against references and finite differences.
_KERAS = {"rgb_to_grayscale", "rgb_to_grayscale-uint8", "rgb_to_hsv", "hsv_to_rgb-channels_first", "resize",
          "resize-bicubic", "resize-lanczos_aa", "resize-pad_channels_first", "resize-uint8", "scale_and_translate",
          "scale_and_translate-cubic_True", "affine_transform", "affine_transform-reflect", "perspective_transform",
          "perspective_transform-batch", "map_coordinates-mirror_1", "gaussian_blur-channels_first",
          "sobel_edges-channels_first", "ssim", "extract_patches-same", "extract_patches_3d", "pad_images",
          "crop_images"}
CASES = [dataclasses.replace(c, keras=c.keras and c.label in _KERAS) for c in CASES]
