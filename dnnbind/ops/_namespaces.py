"""The sub-namespaces of ``keras.ops`` (``keras.ops.numpy``, ``.nn``, ``.linalg``, ``.image``, and ``core`` /
``math``): Keras 3.15.1's names for each, and how a namespace module exports them from :mod:`dnnbind.ops`.

:data:`KERAS_OPS_NAMESPACES` was generated from Keras 3.15.1's API files with
``python tools/keras_api_names.py ops`` (``keras.ops.numpy``/``nn``/``linalg``/``image`` are Keras's
sub-packages; ``core`` and ``math`` are the names ``keras.ops`` takes from ``keras.src.ops.core`` and
``keras.src.ops.math``, which Keras has no public sub-package for). Keras is never imported here.

A namespace module (``dnnbind/ops/nn.py``...) exports each of its names that is a registered op
(:data:`dnnbind.ops._core.REGISTRY`) when it is imported, and resolves later-registered ones on first
access, so ops other families add appear without a change here; a Keras name dnnbind has no op for
yet raises an AttributeError that says so (:func:`missing` lists them).
"""

from __future__ import annotations

import sys
from typing import Any

from . import _core

__all__ = ["KERAS_OPS_NAMESPACES", "install", "missing"]

KERAS_OPS_NAMESPACES: dict[str, tuple[str, ...]] = {
    "numpy": (
        "abs", "absolute", "add", "all", "allclose", "amax", "amin", "angle", "any", "append", "arange",
        "arccos", "arccosh", "arcsin", "arcsinh", "arctan", "arctan2", "arctanh", "argmax", "argmin",
        "argpartition", "argsort", "array", "array_split", "average", "bartlett", "bincount", "bitwise_and",
        "bitwise_invert", "bitwise_left_shift", "bitwise_not", "bitwise_or", "bitwise_right_shift",
        "bitwise_xor", "blackman", "broadcast_to", "cbrt", "ceil", "clip", "concatenate", "conj", "conjugate",
        "copy", "corrcoef", "correlate", "cos", "cosh", "count_nonzero", "cross", "cumprod", "cumsum",
        "deg2rad", "diag", "diagflat", "diagonal", "diff", "digitize", "divide", "divide_no_nan", "dot",
        "dsplit", "dstack", "einsum", "empty", "empty_like", "equal", "exp", "exp2", "expand_dims", "expm1",
        "eye", "fabs", "flip", "fliplr", "flipud", "floor", "floor_divide", "fmax", "fmin", "fmod", "full",
        "full_like", "gcd", "geomspace", "get_item", "greater", "greater_equal", "hamming", "hanning",
        "heaviside", "histogram", "hsplit", "hstack", "hypot", "i0", "identity", "imag", "inner", "isclose",
        "isfinite", "isin", "isinf", "isnan", "isneginf", "isposinf", "isreal", "kaiser", "kron", "lcm",
        "ldexp", "left_shift", "less", "less_equal", "linspace", "log", "log10", "log1p", "log2", "logaddexp",
        "logaddexp2", "logical_and", "logical_not", "logical_or", "logical_xor", "logspace", "matmul", "max",
        "maximum", "mean", "median", "meshgrid", "min", "minimum", "mod", "moveaxis", "multiply",
        "nan_to_num", "nanargmax", "nanargmin", "nancumprod", "nancumsum", "nanmax", "nanmean", "nanmedian",
        "nanmin", "nanpercentile", "nanprod", "nanquantile", "nanstd", "nansum", "nanvar", "ndim", "negative",
        "nextafter", "nonzero", "not_equal", "ones", "ones_like", "outer", "pad", "percentile", "power",
        "prod", "ptp", "quantile", "rad2deg", "ravel", "real", "reciprocal", "repeat", "reshape",
        "right_shift", "roll", "rot90", "round", "searchsorted", "select", "sign", "signbit", "sin", "sinc",
        "sinh", "size", "slogdet", "sort", "split", "sqrt", "square", "squeeze", "stack", "std", "subtract",
        "sum", "swapaxes", "take", "take_along_axis", "tan", "tanh", "tensordot", "tile", "trace",
        "transpose", "trapezoid", "tri", "tril", "triu", "true_divide", "trunc", "unique", "unravel_index",
        "vander", "var", "vdot", "vectorize", "view", "vsplit", "vstack", "where", "zeros", "zeros_like",
    ),
    "nn": (
        "adaptive_average_pool", "adaptive_max_pool", "average_pool", "batch_normalization",
        "binary_crossentropy", "categorical_crossentropy", "celu", "conv", "conv_transpose", "ctc_decode",
        "ctc_loss", "depth_to_space", "depthwise_conv", "dot_product_attention", "elu", "fold", "gelu", "glu",
        "hard_shrink", "hard_sigmoid", "hard_silu", "hard_swish", "hard_tanh", "layer_normalization",
        "leaky_relu", "log_sigmoid", "log_softmax", "max_pool", "moments", "multi_hot", "normalize",
        "one_hot", "polar", "psnr", "relu", "relu6", "rms_normalization", "selu", "separable_conv", "sigmoid",
        "silu", "soft_shrink", "softmax", "softplus", "softsign", "space_to_depth",
        "sparse_categorical_crossentropy", "sparse_plus", "sparse_sigmoid", "sparsemax", "squareplus",
        "swish", "tanh_shrink", "threshold", "unfold",
    ),
    "linalg": (
        "cholesky", "cholesky_inverse", "det", "eig", "eigh", "inv", "jvp", "lstsq", "lu_factor",
        "matrix_rank", "norm", "pinv", "qr", "solve", "solve_triangular", "svd",
    ),
    "image": (
        "affine_transform", "crop_images", "elastic_transform", "extract_patches", "extract_patches_3d",
        "gaussian_blur", "hsv_to_rgb", "map_coordinates", "pad_images", "perspective_transform", "resize",
        "rgb_to_grayscale", "rgb_to_hsv", "scale_and_translate", "sobel_edges", "ssim",
    ),
    "core": (
        "associative_scan", "cast", "cond", "convert_to_numpy", "convert_to_tensor", "custom_gradient",
        "dtype", "fori_loop", "is_tensor", "map", "saturate_cast", "scan", "scatter", "scatter_update",
        "shape", "slice", "slice_update", "stop_gradient", "switch", "unstack", "vectorized_map",
        "while_loop",
    ),
    "math": (
        "cdist", "erf", "erfc", "erfinv", "extract_sequences", "fft", "fft2", "ifft2", "in_top_k", "irfft",
        "istft", "logdet", "logsumexp", "rfft", "rsqrt", "segment_max", "segment_min", "segment_prod",
        "segment_sum", "stft", "top_k", "view_as_complex", "view_as_real",
    ),
}



def missing(namespace: str) -> list[str]:
    """The Keras names of ``namespace`` that are not registered ops (yet)."""
    return [name for name in KERAS_OPS_NAMESPACES[namespace] if name not in _core.REGISTRY]


def install(module_name: str, namespace: str) -> None:
    """Fill the module ``module_name`` with the registered ops of ``namespace`` (and give it the
    ``__getattr__``/``__dir__`` that find the ones registered after it was imported)."""
    module = sys.modules[module_name]
    names = KERAS_OPS_NAMESPACES[namespace]
    known = frozenset(names)
    for name in names:
        if name in _core.REGISTRY:
            setattr(module, name, _core.REGISTRY[name]["fn"])

    def __getattr__(name: str) -> Any:
        if name in known:
            info = _core.REGISTRY.get(name)
            if info is None:
                raise AttributeError(f"keras.ops.{namespace}.{name} is a Keras 3 op that dnnbind does not have yet")
            setattr(module, name, info["fn"])
            return info["fn"]
        raise AttributeError(f"module {module_name!r} has no attribute {name!r} (not a name of keras.ops.{namespace})")

    def __dir__() -> list[str]:
        return sorted(set(module.__dict__) | {n for n in names if n in _core.REGISTRY})

    module.__getattr__ = __getattr__
    module.__dir__ = __dir__
    module.__all__ = [n for n in names if n in _core.REGISTRY]
