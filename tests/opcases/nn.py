"""Cases of the nn family (``dnnbind/ops/_nn.py`` and the modules it gathers), with NumPy references
written here from the definitions (naive loops over kernel offsets and windows)."""

import math

import numpy as np

from . import A, B, Case, I

X = A((3, 4))
WIDE = A((3, 4), -3.0, 3.0)


def _tup(v, n):
    return (v,) * n if isinstance(v, int) else tuple(v)


def _to_last(x, fmt):
    return x if fmt in (None, "channels_last") else np.moveaxis(x, 1, -1)


def _from_last(y, fmt):
    return y if fmt in (None, "channels_last") else np.moveaxis(y, -1, 1)


def _same(n, k, s, d=1):
    eff = (k - 1) * d + 1
    total = max((-(-n // s) - 1) * s + eff - n, 0)
    return total // 2, total - total // 2


# ---------------------------------------------------------------------------------------- references
def softmax_ref(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax_ref(x, axis=-1):
    s = x - x.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


def sparsemax_ref(x, axis=-1):
    z = np.moveaxis(x, axis, -1)
    srt = -np.sort(-z, axis=-1)
    k = np.arange(1, z.shape[-1] + 1)
    cs = np.cumsum(srt, axis=-1)
    support = srt - (cs - 1) / k > 0
    kz = support.sum(-1, keepdims=True)
    tau = (np.where(support, srt, 0).sum(-1, keepdims=True) - 1) / kz
    return np.moveaxis(np.maximum(z - tau, 0), -1, axis)


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _gelu_erf(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _elu(x, alpha=1.0):
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


def conv_ref(x, k, strides=1, padding="valid", data_format=None, dilation_rate=1):
    x = _to_last(x, data_format)
    nsp = x.ndim - 2
    s, d, ks = _tup(strides, nsp), _tup(dilation_rate, nsp), k.shape[:nsp]
    pads = [_same(x.shape[1 + i], ks[i], s[i], d[i]) if padding == "same" else (0, 0) for i in range(nsp)]
    xp = np.pad(x, [(0, 0)] + pads + [(0, 0)])
    outs = [(xp.shape[1 + i] - ((ks[i] - 1) * d[i] + 1)) // s[i] + 1 for i in range(nsp)]
    cg, kk = k.shape[-2], k.shape[-1]
    g = x.shape[-1] // cg
    y = np.zeros((x.shape[0], *outs, kk))
    for off in np.ndindex(*ks):
        sl = tuple(slice(off[i] * d[i], off[i] * d[i] + (outs[i] - 1) * s[i] + 1, s[i]) for i in range(nsp))
        patch = xp[(slice(None),) + sl]
        for gi in range(g):
            ko = slice(gi * (kk // g), (gi + 1) * (kk // g))
            y[..., ko] += patch[..., gi * cg:(gi + 1) * cg] @ k[off][:, ko]
    return _from_last(y, data_format)


def depthwise_ref(x, k, strides=1, padding="valid", data_format=None, dilation_rate=1):
    return conv_ref(x, k.reshape(k.shape[:-2] + (1, -1)), strides, padding, data_format, dilation_rate)


def separable_ref(x, dk, pk, strides=1, padding="valid", data_format=None, dilation_rate=1):
    return conv_ref(depthwise_ref(x, dk, strides, padding, data_format, dilation_rate), pk, 1, "valid", data_format)


def _transpose_pads(k, s, d, padding, op):
    eff = (k - 1) * d + 1
    if padding == "valid":
        return eff - 1, eff - 1 + (max(eff, s) - eff if op is None else op)
    pad = s + eff - 2 if op is None else eff + eff % 2 - 2 + op
    lo = min(pad // 2 + pad % 2, eff - 1)
    return lo, pad - lo


def conv_transpose_ref(x, k, strides=1, padding="valid", output_padding=None, data_format=None, dilation_rate=1):
    x = _to_last(x, data_format)
    nsp = x.ndim - 2
    s, d, ks = _tup(strides, nsp), _tup(dilation_rate, nsp), k.shape[:nsp]
    ops_ = [None] * nsp if output_padding is None else _tup(output_padding, nsp)
    full = [(x.shape[1 + i] - 1) * s[i] + (ks[i] - 1) * d[i] + 1 for i in range(nsp)]
    y = np.zeros((x.shape[0], *full, k.shape[-2]))
    for off in np.ndindex(*ks):
        sl = tuple(slice(off[i] * d[i], off[i] * d[i] + (x.shape[1 + i] - 1) * s[i] + 1, s[i]) for i in range(nsp))
        y[(slice(None),) + sl] += x @ k[off].T
    for i in range(nsp):  # the full correlation's padding: crop it (or add zeros past the end)
        lo, hi = _transpose_pads(ks[i], s[i], d[i], padding, ops_[i])
        eff = (ks[i] - 1) * d[i] + 1
        c_lo, c_hi = eff - 1 - lo, eff - 1 - hi
        y = np.moveaxis(np.moveaxis(y, 1 + i, 0)[c_lo:full[i] - max(c_hi, 0)], 0, 1 + i)
        if c_hi < 0:
            width = [(0, 0)] * y.ndim
            width[1 + i] = (0, -c_hi)
            y = np.pad(y, width)
    return _from_last(y, data_format)


def pool_ref(x, pool_size, strides=None, padding="valid", data_format=None, mode="max"):
    x = _to_last(x, data_format)
    nsp = x.ndim - 2
    w = _tup(pool_size, nsp)
    s = w if strides is None else _tup(strides, nsp)
    pads = [_same(x.shape[1 + i], w[i], s[i]) if padding == "same" else (0, 0) for i in range(nsp)]
    xp = np.pad(x, [(0, 0)] + pads + [(0, 0)], constant_values=-np.inf if mode == "max" else 0.0)
    ones = np.pad(np.ones(x.shape[1:-1]), pads)
    outs = [(xp.shape[1 + i] - w[i]) // s[i] + 1 for i in range(nsp)]
    acc = np.full((x.shape[0], *outs, x.shape[-1]), -np.inf if mode == "max" else 0.0)
    cnt = np.zeros(outs)
    for off in np.ndindex(*w):
        sl = tuple(slice(off[i], off[i] + (outs[i] - 1) * s[i] + 1, s[i]) for i in range(nsp))
        acc = np.maximum(acc, xp[(slice(None),) + sl]) if mode == "max" else acc + xp[(slice(None),) + sl]
        cnt += ones[sl]
    return _from_last(acc if mode == "max" else acc / cnt[..., None], data_format)


def avg_pool_ref(*args, **kwargs):
    return pool_ref(*args, mode="avg", **kwargs)


def adaptive_ref(x, output_size, data_format=None, mode="max"):
    x = _to_last(x, data_format)
    nsp = x.ndim - 2
    outs = _tup(output_size, nsp)
    for i, o in enumerate(outs):
        n = x.shape[1 + i]
        cols = []
        for j in range(o):
            lo, hi = (j * n) // o, -(-((j + 1) * n) // o)
            piece = np.take(x, range(lo, hi), axis=1 + i)
            cols.append(piece.max(axis=1 + i) if mode == "max" else piece.mean(axis=1 + i))
        x = np.stack(cols, axis=1 + i)
    return _from_last(x, data_format)


def adaptive_avg_ref(x, output_size, data_format=None):
    return adaptive_ref(x, output_size, data_format, mode="avg")


def unfold_ref(x, kernel_size, dilation=1, padding=0, stride=1):
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = (_tup(v, 2) for v in (kernel_size, dilation, padding, stride))
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (xp.shape[2] - (kh - 1) * dh - 1) // sh + 1
    ow = (xp.shape[3] - (kw - 1) * dw - 1) // sw + 1
    out = np.zeros((x.shape[0], x.shape[1], kh, kw, oh, ow))
    for i in range(kh):
        for j in range(kw):
            out[:, :, i, j] = xp[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh, j * dw:j * dw + (ow - 1) * sw + 1:sw]
    return out.reshape(x.shape[0], -1, oh * ow)


def fold_ref(x, output_size, kernel_size, dilation=1, padding=0, stride=1):
    (oh, ow), (kh, kw), (dh, dw), (ph, pw), (sh, sw) = (_tup(v, 2) for v in
                                                         (output_size, kernel_size, dilation, padding, stride))
    n, ckk, _ = x.shape
    c = ckk // (kh * kw)
    nh = (oh + 2 * ph - (kh - 1) * dh - 1) // sh + 1
    nw = (ow + 2 * pw - (kw - 1) * dw - 1) // sw + 1
    blocks = x.reshape(n, c, kh, kw, nh, nw)
    out = np.zeros((n, c, oh + 2 * ph, ow + 2 * pw))
    for i in range(kh):
        for j in range(kw):
            out[:, :, i * dh:i * dh + (nh - 1) * sh + 1:sh, j * dw:j * dw + (nw - 1) * sw + 1:sw] += blocks[:, :, i, j]
    return out[:, :, ph:ph + oh, pw:pw + ow]


def layer_norm_ref(x, gamma=None, beta=None, axis=-1, epsilon=1e-7):
    axes = tuple(np.atleast_1d(axis) % x.ndim)
    y = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + epsilon)
    if gamma is not None:
        y = y * (gamma if len(axes) == 1 and axes[0] == x.ndim - 1 else gamma.reshape(
            [x.shape[i] if i in axes else 1 for i in range(x.ndim)]))
    if beta is not None:
        y = y + (beta if len(axes) == 1 and axes[0] == x.ndim - 1 else beta.reshape(
            [x.shape[i] if i in axes else 1 for i in range(x.ndim)]))
    return y


def batch_norm_ref(x, mean, variance, axis, offset=None, scale=None, epsilon=1e-3):
    shape = [1] * x.ndim
    shape[axis] = -1
    y = (x - mean.reshape(shape)) / np.sqrt(variance.reshape(shape) + epsilon)
    if scale is not None:
        y = y * scale.reshape(shape)
    return y + (offset.reshape(shape) if offset is not None else 0)


def cce_ref(target, output, from_logits=False, axis=-1):
    if from_logits:
        return -(target * log_softmax_ref(output, axis)).sum(axis)
    p = np.clip(output / output.sum(axis, keepdims=True), 1e-7, 1 - 1e-7)
    return -(target * np.log(p)).sum(axis)


def scce_ref(target, output, from_logits=False, axis=-1):
    target = target.reshape(output.shape[:-1]) if target.ndim == output.ndim else target
    hot = np.moveaxis(np.eye(output.shape[axis])[target], -1, axis)
    return cce_ref(hot, output, from_logits, axis)


def bce_ref(target, output, from_logits=False):
    if from_logits:
        return np.logaddexp(0, output) - target * output
    p = np.clip(output, 1e-7, 1 - 1e-7)
    return -(target * np.log(p) + (1 - target) * np.log(1 - p))


def attention_ref(q, k, v, bias=None, mask=None, scale=None, is_causal=False):
    b, t, n, h = q.shape
    s, kh = k.shape[1], k.shape[2]
    g = n // kh
    scale = 1 / math.sqrt(h) if scale is None else scale
    kk = np.repeat(k, g, axis=2)
    vv = np.repeat(v, g, axis=2)
    logits = np.einsum("btnh,bsnh->bnts", q, kk) * scale
    if bias is not None:
        logits = logits + bias
    keep = np.ones(logits.shape, bool)
    if mask is not None:
        keep &= mask
    if is_causal:
        keep &= np.tril(np.ones((t, s), bool))
    logits = np.where(keep, logits, -0.7 * np.finfo(np.float32).max)
    return np.einsum("bnts,bsnh->btnh", softmax_ref(logits), vv)


def depth_to_space_ref(x, b, data_format="channels_last"):
    if data_format == "channels_first":  # Keras's NCHW order: channel c * b * b + i * b + j
        n, c, h, w = x.shape
        return x.reshape(n, c // b // b, b, b, h, w).transpose(0, 1, 4, 2, 5, 3).reshape(n, c // b // b, h * b, w * b)
    n, h, w, c = x.shape
    return x.reshape(n, h, w, b, b, c // b // b).transpose(0, 1, 3, 2, 4, 5).reshape(n, h * b, w * b, c // b // b)


def space_to_depth_ref(x, b, data_format="channels_last"):
    if data_format == "channels_first":
        n, c, h, w = x.shape
        return x.reshape(n, c, h // b, b, w // b, b).transpose(0, 1, 3, 5, 2, 4).reshape(n, c * b * b, h // b, w // b)
    n, h, w, c = x.shape
    return x.reshape(n, h // b, b, w // b, b, c).transpose(0, 1, 3, 2, 4, 5).reshape(n, h // b, w // b, c * b * b)


def normalize_ref(x, axis=-1, order=2, epsilon=1e-7):
    if order == 2:
        return x * np.minimum(1 / np.sqrt((x * x).sum(axis, keepdims=True)), 1 / epsilon)
    norm = np.linalg.norm(x, ord=order, axis=axis, keepdims=True)
    return x / np.maximum(norm, epsilon)


def _lengths(*values):
    return np.array(values, dtype=np.int32)


IMG = A((2, 5, 5, 3))
IMG_CF = A((2, 3, 5, 6))
SEQ = A((2, 7, 3))
VOL = A((1, 4, 4, 5, 2))
LOGITS = A((4, 5), -2.0, 2.0)
PROBS = A((4, 5), 0.05, 1.0)
TARGET = A((4, 5), 0.0, 1.0)

CASES = [
    # ------------------------------------------------------------------------------ activations
    Case("relu6", (A((3, 4), -8.0, 8.0),), grad=(0,), ref=lambda x: np.clip(x, 0, 6)),
    Case("elu", (WIDE,), grad=(0,), ref=_elu),
    Case("elu", (WIDE, 0.5), grad=(0,), ref=_elu, name="alpha"),
    Case("selu", (WIDE,), grad=(0,), ref=lambda x: 1.0507009873554805 * _elu(x, 1.6732632423543772)),
    Case("celu", (WIDE,), grad=(0,), ref=lambda x: np.maximum(x, 0) + np.expm1(np.minimum(x, 0))),
    Case("celu", (WIDE, 2.0), grad=(0,), name="alpha", ref=lambda x, a: np.maximum(x, 0) + a * np.expm1(
        np.minimum(x, 0) / a)),
    Case("gelu", (WIDE,), grad=(0,), ref=_gelu_tanh),
    Case("gelu", (WIDE, False), grad=(0,), name="erf", ref=lambda x, a: _gelu_erf(x)),
    Case("glu", (A((3, 4)),), grad=(0,), ref=lambda x: x[:, :2] / (1 + np.exp(-x[:, 2:]))),
    Case("glu", (A((4, 3)), 0), grad=(0,), name="axis0", ref=lambda x, a: x[:2] / (1 + np.exp(-x[2:]))),
    Case("hard_sigmoid", (A((3, 4), -4.0, 4.0),), grad=(0,), ref=lambda x: np.clip(x + 3, 0, 6) / 6),
    Case("hard_silu", (A((3, 4), -4.0, 4.0),), grad=(0,), ref=lambda x: x * np.clip(x + 3, 0, 6) / 6),
    Case("hard_swish", (A((3, 4), -4.0, 4.0),), grad=(0,), ref=lambda x: x * np.clip(x + 3, 0, 6) / 6),
    Case("hard_tanh", (A((3, 4), -2.0, 2.0),), grad=(0,), ref=lambda x: np.clip(x, -1, 1)),
    Case("hard_shrink", (WIDE,), grad=(0,), ref=lambda x: np.where(np.abs(x) > 0.5, x, 0)),
    Case("hard_shrink", (WIDE, 1.0), grad=(0,), name="threshold", ref=lambda x, t: np.where(np.abs(x) > t, x, 0)),
    Case("soft_shrink", (WIDE,), grad=(0,), ref=lambda x: x - np.clip(x, -0.5, 0.5)),
    Case("soft_shrink", (WIDE, 1.0), grad=(0,), name="threshold", ref=lambda x, t: x - np.clip(x, -t, t)),
    Case("leaky_relu", (WIDE,), grad=(0,), ref=lambda x: np.where(x >= 0, x, 0.2 * x)),
    Case("leaky_relu", (WIDE, 0.05), grad=(0,), name="slope", ref=lambda x, a: np.where(x >= 0, x, a * x)),
    Case("log_sigmoid", (A((3, 4), -20.0, 20.0),), grad=(0,), ref=lambda x: -np.logaddexp(0, -x)),
    Case("softsign", (WIDE,), grad=(0,), ref=lambda x: x / (1 + np.abs(x))),
    Case("sparse_plus", (WIDE,), grad=(0,), ref=lambda x: np.where(x <= -1, 0, np.where(x >= 1, x, (x + 1) ** 2 / 4))),
    Case("sparse_sigmoid", (WIDE,), grad=(0,), ref=lambda x: np.clip((x + 1) / 2, 0, 1)),
    Case("squareplus", (WIDE,), grad=(0,), ref=lambda x: (x + np.sqrt(x * x + 4)) / 2),
    Case("squareplus", (WIDE, 1.0), grad=(0,), name="b", ref=lambda x, b: (x + np.sqrt(x * x + b)) / 2),
    Case("tanh_shrink", (WIDE,), grad=(0,), ref=lambda x: x - np.tanh(x)),
    Case("threshold", (WIDE, 0.2, -1.5), grad=(0,), ref=lambda x, t, v: np.where(x > t, x, v)),
    Case("softmax", (A((3, 5), -3.0, 3.0),), grad=(0,), ref=softmax_ref),
    Case("softmax", (A((3, 5, 2)), 1), grad=(0,), keras=False, name="axis1", ref=softmax_ref),
    Case("softmax", (A((2, 3, 4)), (0, 2)), grad=(0,), name="axes", ref=lambda x, a: softmax_ref(
        x.transpose(1, 0, 2).reshape(3, -1), -1).reshape(3, 2, 4).transpose(1, 0, 2)),
    Case("softmax", (I((3, 4), 0, 4),), name="int", ref=lambda x: softmax_ref(x.astype(np.float32))),
    Case("log_softmax", (A((3, 5), -3.0, 3.0),), grad=(0,), ref=log_softmax_ref),
    Case("log_softmax", (A((3, 5, 2)), 0), grad=(0,), name="axis0", ref=log_softmax_ref),
    # Keras 3.15's sparsemax is wrong for supports of 2+ entries (keras-team/keras#23425, fixed by #23469):
    # compared with the paper's definition only, and with Keras on a support of one
    Case("sparsemax", (A((3, 5), -2.0, 2.0),), grad=(0,), ref=sparsemax_ref, keras=False),
    Case("sparsemax", (A((4, 3), -2.0, 2.0), 0), grad=(0,), name="axis0", ref=sparsemax_ref, keras=False),
    Case("sparsemax", (np.array([[-1.0, 0.0, 1.5], [3.0, 0.5, -2.0]], np.float32),), name="support_of_one",
         ref=sparsemax_ref),
    # ---------------------------------------------------------------------------- convolutions
    Case("conv", (IMG, A((3, 3, 3, 4))), grad=(0, 1), ref=conv_ref),
    Case("conv", (IMG_CF, A((3, 2, 3, 4)), 2, "same", "channels_first"), grad=(0, 1), name="nchw_same_stride",
         ref=conv_ref),
    Case("conv", (A((2, 6, 6, 4)), A((2, 2, 2, 6)), (1, 2), "same", None, 2), grad=(0, 1), name="groups_dilation",
         ref=conv_ref),
    Case("conv", (A((2, 4, 5, 5)), A((3, 3, 1, 4)), 1, "valid", "channels_first"), grad=(0, 1),
         name="depthwise_groups_nchw", ref=conv_ref),
    Case("conv", (SEQ, A((3, 3, 4)), 2, "same"), grad=(0, 1), name="1d", ref=conv_ref),
    Case("conv", (A((2, 3, 8)), A((2, 3, 2)), 1, "valid", "channels_first", 3), grad=(0, 1), name="1d_nchw_dilated",
         ref=conv_ref),
    Case("conv", (VOL, A((2, 2, 3, 2, 3)), (2, 1, 1), "same"), grad=(0, 1), name="3d", ref=conv_ref),
    Case("conv", (A((1, 2, 5, 4, 4)), A((2, 2, 2, 2, 2)), 1, "valid", "channels_first", (2, 1, 1)), grad=(0, 1),
         name="3d_nchw_dilated", ref=conv_ref),
    Case("depthwise_conv", (IMG, A((3, 3, 3, 2))), grad=(0, 1), ref=depthwise_ref),
    Case("depthwise_conv", (IMG_CF, A((2, 3, 3, 1)), 2, "same", "channels_first"), grad=(0, 1), name="nchw",
         ref=depthwise_ref),
    Case("depthwise_conv", (SEQ, A((3, 3, 2)), 1, "same", None, 2), grad=(0, 1), name="1d_dilated",
         ref=depthwise_ref),
    Case("separable_conv", (IMG, A((3, 3, 3, 2)), A((1, 1, 6, 4))), grad=(0, 1, 2), ref=separable_ref),
    Case("separable_conv", (IMG_CF, A((2, 2, 3, 1)), A((1, 1, 3, 2)), 2, "same", "channels_first"), grad=(0, 1, 2),
         name="nchw_same", ref=separable_ref),
    Case("conv_transpose", (A((2, 3, 3, 4)), A((3, 3, 2, 4)), 2), grad=(0, 1), ref=conv_transpose_ref),
    Case("conv_transpose", (A((2, 3, 4, 4)), A((3, 3, 2, 4)), 2, "same"), grad=(0, 1), name="same",
         ref=conv_transpose_ref),
    Case("conv_transpose", (A((2, 3, 3, 4)), A((3, 2, 2, 4)), (2, 3), "valid", 1), grad=(0, 1),
         name="output_padding", ref=conv_transpose_ref),
    Case("conv_transpose", (A((2, 3, 3, 4)), A((2, 2, 3, 3)), 1, "same", None, "channels_first", 2), grad=(0, 1),
         name="nchw_dilated", ref=conv_transpose_ref),
    Case("conv_transpose", (A((2, 4, 3)), A((3, 2, 3)), 3, "same"), grad=(0, 1), name="1d", ref=conv_transpose_ref),
    Case("conv_transpose", (A((1, 2, 3, 2, 2)), A((2, 2, 2, 3, 2)), (2, 1, 2), "valid"), grad=(0, 1), name="3d",
         ref=conv_transpose_ref),
    Case("conv_transpose", (A((1, 2, 2, 3, 2)), A((3, 2, 2, 2, 2)), 2, "same", 1, "channels_first"), grad=(0, 1),
         name="3d_nchw_same", ref=conv_transpose_ref),
    Case("unfold", (A((2, 3, 4, 5)), 2), grad=(0,), ref=unfold_ref),
    Case("unfold", (A((1, 2, 5, 5)), (3, 2), 2, 1, (2, 1)), grad=(0,), name="dilation_padding_stride",
         ref=unfold_ref),
    Case("fold", (A((2, 12, 4)), (4, 4), 2, 1, 0, 2), grad=(0,), ref=fold_ref),
    Case("fold", (A((1, 8, 9)), 2, 2, 1, 1, 1), grad=(0,), name="overlap_padding", ref=fold_ref),
    # ----------------------------------------------------------------------------------- pooling
    # Keras's JAX backend fails on strides=None (keras.ops.max_pool(x, 2)): compared with Keras given strides
    Case("max_pool", (IMG, 2), grad=(0,), ref=pool_ref, keras=False),
    Case("max_pool", (IMG, 2, 2), grad=(0,), name="strides", ref=pool_ref),
    Case("max_pool", (IMG, 3, 2, "same"), grad=(0,), name="same_stride", ref=pool_ref),
    Case("max_pool", (IMG_CF, (2, 3), (1, 2), "valid", "channels_first"), grad=(0,), name="nchw", ref=pool_ref),
    Case("max_pool", (SEQ, 3, 2, "same"), grad=(0,), name="1d", ref=pool_ref),
    Case("max_pool", (VOL, 2, 2, "same"), grad=(0,), name="3d", ref=pool_ref),
    Case("max_pool", (A((1, 2, 3, 4, 5)), (2, 2, 3), (1, 2, 2), "valid", "channels_first"), grad=(0,),
         name="3d_nchw", ref=pool_ref),
    Case("average_pool", (IMG, 2), grad=(0,), ref=avg_pool_ref, keras=False),
    Case("average_pool", (IMG, 3, 2, "same"), grad=(0,), name="same_stride", ref=avg_pool_ref),
    Case("average_pool", (IMG_CF, 2, 1, "same", "channels_first"), grad=(0,), name="nchw_same", ref=avg_pool_ref),
    Case("average_pool", (SEQ, 2, 1, "same"), grad=(0,), name="1d", ref=avg_pool_ref),
    Case("average_pool", (VOL, (2, 3, 2), 2, "same"), grad=(0,), name="3d", ref=avg_pool_ref),
    Case("adaptive_max_pool", (A((1, 7, 5, 2)), (3, 2)), grad=(0,), ref=adaptive_ref, keras=False),
    Case("adaptive_max_pool", (A((2, 2, 5, 4)), 2, "channels_first"), grad=(0,), name="nchw", ref=adaptive_ref,
         keras=False),
    Case("adaptive_max_pool", (A((2, 7, 3)), 3), grad=(0,), name="1d", ref=adaptive_ref),
    Case("adaptive_max_pool", (A((1, 4, 5, 3, 1)), (2, 2, 3)), grad=(0,), name="3d", ref=adaptive_ref, keras=False),
    Case("adaptive_average_pool", (A((1, 7, 5, 2)), (3, 2)), grad=(0,), ref=adaptive_avg_ref, keras=False),
    Case("adaptive_average_pool", (A((1, 2, 5, 4)), (4, 3), "channels_first"), grad=(0,), name="nchw",
         ref=adaptive_avg_ref),
    Case("adaptive_average_pool", (A((1, 1, 4, 5, 3)), 2, "channels_first"), grad=(0,), name="3d_nchw",
         ref=adaptive_avg_ref, keras=False),
    # ----------------------------------------------------------------------------- normalisation
    Case("moments", (A((3, 4, 2)), (0, 2)), grad=(0,), ref=lambda x, a: [x.mean(a), x.var(a)]),
    Case("moments", (A((3, 4)), 1, True), grad=(0,), keras=False, name="keepdims",
         ref=lambda x, a, k: [x.mean(a, keepdims=True), x.var(a, keepdims=True)]),
    Case("batch_normalization", (A((4, 3)), A((3,)), A((3,), 0.5, 1.5), -1, A((3,)), A((3,))),
         grad=(0, 1, 2, 4, 5), ref=batch_norm_ref, keras=False),
    Case("batch_normalization", (A((2, 3, 2, 2)), A((3,)), A((3,), 0.5, 1.5), 1, A((3,)), A((3,)), 1e-2),
         grad=(0, 1, 2, 4, 5), name="nchw", ref=batch_norm_ref),
    Case("batch_normalization", (A((2, 2, 2, 3)), A((3,)), A((3,), 0.5, 1.5), 3), grad=(0, 1, 2), keras=False,
         name="nhwc", ref=batch_norm_ref),
    Case("batch_normalization", (A((2, 3, 2)), A((3,)), A((3,), 0.5, 1.5), 1, None, A((3,))), grad=(0, 1, 2, 5),
         name="composed", ref=batch_norm_ref),
    Case("layer_normalization", (A((3, 4)),), grad=(0,), ref=layer_norm_ref, keras=False),
    Case("layer_normalization", (A((3, 4)), A((4,)), A((4,)), -1, 1e-3), grad=(0, 1, 2), name="params",
         ref=layer_norm_ref),
    Case("layer_normalization", (A((2, 3, 4)), A((3, 4)), A((3, 4)), (1, 2)), grad=(0, 1, 2), name="two_axes",
         ref=lambda x, g, b, a: layer_norm_ref(x, g, b, a)),
    Case("layer_normalization", (A((3, 4, 2)), A((4,)), None, 1), grad=(0, 1), name="middle_axis",
         ref=lambda x, g, b, a: layer_norm_ref(x, g, b, a)),
    Case("rms_normalization", (A((3, 4)),), grad=(0,),
         ref=lambda x: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-7)),
    Case("rms_normalization", (A((3, 4)), A((3, 1)), 0, 1e-3), grad=(0, 1), name="scale_axis",
         ref=lambda x, s, a, e: x / np.sqrt((x * x).mean(a, keepdims=True) + e) * s),
    Case("normalize", (A((3, 4)),), grad=(0,), ref=normalize_ref),
    Case("normalize", (A((3, 4)), 0, 1), grad=(0,), name="l1_axis0", ref=normalize_ref),
    Case("normalize", (A((3, 4)), -1, 3), grad=(0,), name="l3", ref=normalize_ref),
    # ------------------------------------------------------------------------------------ losses
    Case("binary_crossentropy", (A((3, 4), 0.0, 1.0), A((3, 4), 0.05, 0.95)), grad=(0, 1), ref=bce_ref),
    Case("binary_crossentropy", (A((3, 4), 0.0, 1.0), A((3, 4), -4.0, 4.0), True), grad=(0, 1), name="logits",
         ref=bce_ref),
    Case("categorical_crossentropy", (TARGET, PROBS), grad=(0, 1), ref=cce_ref),
    Case("categorical_crossentropy", (TARGET, LOGITS, True), grad=(0, 1), name="logits", ref=cce_ref),
    Case("categorical_crossentropy", (A((5, 3), 0.0, 1.0), A((5, 3), -2.0, 2.0), True, 0), grad=(0, 1),
         name="logits_axis0", ref=cce_ref),
    Case("categorical_crossentropy", (A((2, 3, 4), 0.0, 1.0), A((2, 3, 4), 0.05, 1.0)), grad=(0, 1), keras=False,
         name="3d", ref=cce_ref),
    Case("sparse_categorical_crossentropy", (I((4,), 0, 5), PROBS), grad=(1,), ref=scce_ref),
    Case("sparse_categorical_crossentropy", (I((4,), 0, 5), LOGITS, True), grad=(1,), name="logits", ref=scce_ref),
    Case("sparse_categorical_crossentropy", (I((2, 3), 0, 4), A((2, 3, 4), -2.0, 2.0), True), grad=(1,),
         name="3d_logits", ref=scce_ref),
    Case("sparse_categorical_crossentropy", (I((4, 1), 0, 5), LOGITS, True), grad=(1,), name="trailing_one",
         ref=scce_ref),
    Case("sparse_categorical_crossentropy", (I((2, 4), 0, 3), A((2, 3, 4), -2.0, 2.0), True, 1), grad=(1,),
         name="axis1", keras=False, ref=lambda t, o, f, a: scce_ref(t, np.moveaxis(o, 1, -1), f)),
    Case("ctc_loss", (I((1, 3), 1, 4), A((1, 5, 4), -2.0, 2.0), _lengths(2), _lengths(5)), grad=(1,), keras=False),
    Case("ctc_loss", (np.array([[1, 1, 2], [2, 0, 0]], np.int32), A((2, 5, 4), -2.0, 2.0), _lengths(3, 1),
                      _lengths(5, 4), 3), grad=(1,), name="repeats_mask_index"),
    Case("ctc_decode", (A((2, 6, 4)), _lengths(6, 4))),
    Case("ctc_decode", (A((2, 6, 4)), _lengths(5, 6), "greedy", 100, 1, False, 2), name="no_merge"),
    Case("ctc_decode", (A((2, 5, 4), -2.0, 2.0), _lengths(5, 3), "beam_search", 3, 2), name="beam_search"),
    # --------------------------------------------------------------------------------- attention
    Case("dot_product_attention", (A((2, 3, 4, 2)), A((2, 5, 2, 2)), A((2, 5, 2, 3))), grad=(0, 1, 2),
         ref=attention_ref, name="gqa_value_depth", keras=False),
    Case("dot_product_attention", (A((2, 3, 4, 2)), A((2, 5, 2, 2)), A((2, 5, 2, 2))), grad=(0, 1, 2),
         ref=attention_ref, keras=False, name="gqa"),
    Case("dot_product_attention", (A((1, 4, 4, 3)), A((1, 4, 2, 3)), A((1, 4, 2, 3)), A((1, 4, 4, 4)),
                                   B((1, 1, 4, 4)), 0.4, True), grad=(0, 1, 2, 3), ref=attention_ref,
         name="gqa_bias_mask_causal"),
    Case("dot_product_attention", (A((2, 3, 2, 2)), A((2, 5, 1, 2)), A((2, 5, 1, 2)), None, None, None, True),
         grad=(0, 1, 2), ref=attention_ref, keras=False, name="mqa_causal"),
    # -------------------------------------------------------------------------------------- misc
    Case("multi_hot", (I((3, 4), 0, 6), 6), ref=lambda x, n: np.eye(n, dtype=np.float32)[x].max(1)),
    Case("multi_hot", (I((4,), 0, 5), 5), name="1d", ref=lambda x, n: np.eye(n, dtype=np.float32)[x].max(0)),
    Case("psnr", (A((2, 3, 4), 0.0, 1.0), A((2, 3, 4), 0.0, 1.0), 1.0), grad=(0, 1),
         ref=lambda a, b, m: 20 * np.log10(m) - 10 * np.log10(((a - b) ** 2).mean())),
    Case("depth_to_space", (A((2, 2, 3, 8)), 2), grad=(0,), ref=depth_to_space_ref),
    Case("depth_to_space", (A((2, 8, 2, 3)), 2, "channels_first"), grad=(0,), name="nchw", ref=depth_to_space_ref),
    Case("space_to_depth", (A((2, 4, 6, 2)), 2), grad=(0,), ref=space_to_depth_ref),
    Case("space_to_depth", (A((2, 2, 6, 4)), 2, "channels_first"), grad=(0,), name="nchw", ref=space_to_depth_ref),
]
