"""The cases of each op family, in one table that its CPU test (NumPy vs a naive reference and finite
differences, float64) and its GPU test (CUDA vs the NumPy reference, per dtype) both run.

A case added here is checked on both backends; a new activation in ``kernels.ACTIVATIONS`` is tested on
both without a line changed here.
"""

from __future__ import annotations

import pytest

from dnnbind import kernels

# Convolution: x shape NCHW, w shape KCRS, stride, padding, dilation, groups. NHWC runs are the same
# cases transposed.
CONV_CASES = [
    pytest.param((2, 3, 5, 5), (4, 3, 3, 3), 1, 0, 1, 1, id="3x3-valid"),
    pytest.param((2, 3, 5, 5), (4, 3, 3, 3), 1, 1, 1, 1, id="3x3-pad1"),
    pytest.param((1, 3, 7, 7), (4, 3, 7, 7), 1, 0, 1, 1, id="7x7-batch1"),
    pytest.param((2, 3, 6, 5), (4, 3, 3, 2), (2, 1), (1, 0), 1, 1, id="strided-pad-pair"),
    pytest.param((2, 3, 6, 6), (2, 3, 3, 3), 2, "same", 1, 1, id="same-stride2"),  # pads (0, 1, 0, 1)
    pytest.param((2, 3, 9, 8), (6, 3, 3, 3), 2, "same", 1, 1, id="same-stride2-asym"),
    pytest.param((2, 4, 8, 8), (4, 4, 2, 2), 2, "same", 1, 1, id="same-even-window"),
    pytest.param((1, 2, 5, 5), (3, 2, 3, 3), 2, (1, 0, 2, 1), 1, 1, id="explicit-asym"),
    pytest.param((1, 3, 10, 9), (2, 3, 3, 3), (2, 3), (0, 2, 1, 0), 1, 1, id="explicit-asym-4tuple"),
    pytest.param((2, 2, 7, 7), (2, 2, 3, 3), 1, 2, 2, 1, id="dilation2"),
    pytest.param((1, 5, 7, 6), (2, 5, 2, 3), (1, 2), 1, (2, 1), 1, id="wide-dilated-strided"),
    pytest.param((2, 4, 5, 5), (6, 2, 3, 3), 1, 1, 1, 2, id="groups2"),
    pytest.param((2, 6, 8, 8), (9, 2, 3, 3), 1, 1, 1, 3, id="groups3"),
    pytest.param((2, 3, 5, 5), (6, 1, 3, 3), 1, "same", 1, 3, id="depthwise-multiplier2"),
    pytest.param((2, 7, 9, 9), (7, 1, 3, 3), 2, "same", 1, 7, id="depthwise-same-stride2"),
    pytest.param((2, 5, 6, 6), (3, 5, 1, 1), 1, "valid", 1, 1, id="1x1"),
    pytest.param((2, 6, 5, 5), (3, 6, 3, 3), 2, "same", 1, 1, id="wide-input-im2col"),  # row-major im2col path
    pytest.param((3, 13, 5, 6), (11, 13, 3, 2), (1, 2), "valid", 1, 1, id="odd-channels"),
]

# Pooling: x shape NCHW, window, stride (None: the window), padding.
POOL_CASES = [
    pytest.param((2, 3, 6, 6), 2, None, 0, id="2x2-s2"),
    pytest.param((2, 3, 8, 8), 2, None, 0, id="2x2-s2-8x8"),
    pytest.param((2, 3, 5, 7), (2, 3), None, "valid", id="valid-leftovers"),  # the last row/columns in no window
    pytest.param((2, 3, 5, 5), 3, 1, 1, id="3x3-s1-pad1"),
    pytest.param((2, 3, 5, 5), 2, 2, "same", id="2x2-same"),  # pads (0, 1, 0, 1)
    pytest.param((2, 3, 7, 9), 2, 2, "same", id="2x2-same-odd"),
    pytest.param((1, 5, 7, 7), 3, 2, "same", id="3x3-s2-same-asym"),
    pytest.param((2, 2, 7, 6), (3, 2), (2, 1), (1, 0), id="rect-pad-pair"),
    pytest.param((2, 4, 9, 6), (3, 2), (2, 1), 1, id="sym-pad1"),
    pytest.param((1, 2, 6, 6), 3, 2, (0, 2, 1, 1), id="explicit-asym"),
    pytest.param((1, 2, 10, 7), (2, 3), (3, 2), (0, 1, 2, 0), id="explicit-asym-strided"),
    pytest.param((3, 1, 5, 5), 5, 1, 0, id="global-window"),
    # non-overlapping max pooling in NHWC runs dnnbind's own backward kernel; leftovers get 0
    pytest.param((2, 5, 9, 7), 2, None, 0, id="2x2-leftover-row-col"),
    pytest.param((3, 40, 6, 6), 3, 3, 0, id="3x3-s3-40ch"),
]

# Activations: every kind the ops know (default alpha), and the kinds that take an alpha with one.
ACTIVATION_CASES = [pytest.param(kind, None, id=kind) for kind in kernels.ACTIVATIONS] + [
    pytest.param("elu", 0.7, id="elu-0.7"),
    pytest.param("clipped_relu", 1.5, id="clipped_relu-1.5"),
    pytest.param("leaky_relu", 0.1, id="leaky_relu-0.1"),
]
