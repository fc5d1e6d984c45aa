"""Fused scaled-dot-product attention (``kernels.sdpa_forward``/``sdpa_backward``): the NumPy twin against a
plain softmax reference and finite differences in float64, ``out=`` buffers, argument errors, and the
structure of the cuDNN graphs (``dnnbind.cudnn.attention``) that the CUDA path finalizes.

The graphs are finalized only on a GPU (tests/test_kernels_attention_gpu.py); here their node sequence,
tensor strides and dtypes are checked, as cuDNN's attention engines match on them."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import kernels
from dnnbind.cudnn import attention as A
from testutil import numerical_grad, random, rel_error


def _reference(q, k, v, bias=None, causal=False, scale=None, layout="BSHD"):
    """softmax(q kᵀ scale + bias) v in float64, written independently of the twin (per head, explicit loops)."""
    if layout == "BSHD":
        q, k, v = (np.swapaxes(t, 1, 2) for t in (q, k, v))
    b, h, sq, d = q.shape
    skv = k.shape[2]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    o = np.empty((b, h, sq, v.shape[3]))
    lse = np.empty((b, h, sq, 1))
    for i in range(b):
        for j in range(h):
            s = q[i, j] @ k[i, j].T * scale
            if bias is not None:
                s = s + bias[i % bias.shape[0], j % bias.shape[1]]
            if causal:
                s = np.where(np.tril(np.ones((sq, skv), bool)), s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            e = np.exp(s - m)
            o[i, j] = (e / e.sum(axis=1, keepdims=True)) @ v[i, j]
            lse[i, j] = m + np.log(e.sum(axis=1, keepdims=True))
    return (np.swapaxes(o, 1, 2) if layout == "BSHD" else o), lse


def _inputs(rng, b, h, sq, skv, d, dv, layout):
    shape = (lambda s, w: (b, s, h, w)) if layout == "BSHD" else (lambda s, w: (b, h, s, w))
    return random(rng, shape(sq, d)), random(rng, shape(skv, d)), random(rng, shape(skv, dv))


CASES = [  # (b, h, sq, skv, d, dv, causal, bias, layout)
    (2, 3, 5, 5, 4, 4, False, None, "BSHD"),
    (2, 3, 5, 5, 4, 4, True, None, "BSHD"),
    (1, 2, 4, 7, 3, 5, False, (1, 2), "BSHD"),
    (2, 2, 6, 3, 4, 2, True, (2, 1), "BSHD"),
    (2, 2, 5, 6, 4, 3, True, None, "BHSD"),
]


@pytest.mark.parametrize("b, h, sq, skv, d, dv, causal, bias, layout", CASES)
def test_forward_matches_softmax_reference(rng, b, h, sq, skv, d, dv, causal, bias, layout):
    q, k, v = _inputs(rng, b, h, sq, skv, d, dv, layout)
    bb = None if bias is None else random(rng, (*bias, sq, skv))
    o, stats = kernels.sdpa_forward(q, k, v, causal=causal, bias=bb, layout=layout, scale=0.7)
    o_ref, lse_ref = _reference(q, k, v, bb, causal, 0.7, layout)
    assert o.shape == o_ref.shape and o.dtype == np.float64 and stats.shape == (b, h, sq, 1)
    assert rel_error(o, o_ref) < 1e-12 and rel_error(stats, lse_ref) < 1e-12


def test_default_scale_is_inverse_sqrt_head_dim(rng):
    q, k, v = _inputs(rng, 1, 2, 4, 4, 9, 3, "BSHD")
    o, _ = kernels.sdpa_forward(q, k, v)
    assert rel_error(o, _reference(q, k, v, scale=1 / 3)[0]) < 1e-12


def test_float32_data_keeps_float32_stats_and_rounds_like_the_device(rng):
    q, k, v = (t.astype(np.float32) for t in _inputs(rng, 2, 2, 8, 8, 8, 8, "BSHD"))
    o, stats = kernels.sdpa_forward(q, k, v, causal=True)
    assert o.dtype == np.float32 and stats.dtype == np.float32
    ref = _reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), causal=True)[0]
    assert rel_error(o, ref) < 1e-5


@pytest.mark.parametrize("b, h, sq, skv, d, dv, causal, bias, layout", CASES)
def test_backward_matches_finite_differences(rng, b, h, sq, skv, d, dv, causal, bias, layout):
    q, k, v = _inputs(rng, b, h, sq, skv, d, dv, layout)
    bb = None if bias is None else random(rng, (*bias, sq, skv))
    o, stats = kernels.sdpa_forward(q, k, v, causal=causal, bias=bb, layout=layout)
    do = random(rng, o.shape)
    dq, dk, dv_ = kernels.sdpa_backward(do, q, k, v, o, stats, causal=causal, bias=bb, layout=layout)

    def loss():
        return float((kernels.sdpa_forward(q, k, v, causal=causal, bias=bb, layout=layout)[0] * do).sum())

    for name, x, g in (("q", q, dq), ("k", k, dk), ("v", v, dv_)):
        num = numerical_grad(loss, x)
        assert np.abs(num).max() > 1e-3, name  # a real gradient, not a vacuous comparison
        assert rel_error(g, num) < 1e-7, name


def test_out_buffers_receive_the_results(rng):
    q, k, v = _inputs(rng, 2, 2, 4, 6, 4, 4, "BSHD")
    o_ref, st_ref = kernels.sdpa_forward(q, k, v, causal=True)
    out, st_out = np.full(o_ref.shape, np.nan), np.full(st_ref.shape, np.nan, np.float64)
    o, st = kernels.sdpa_forward(q, k, v, causal=True, out=out, stats_out=st_out)
    assert o is out and st is st_out and np.array_equal(out, o_ref) and np.array_equal(st_out, st_ref)
    do = random(rng, o.shape)
    ref = kernels.sdpa_backward(do, q, k, v, o, st, causal=True)
    bufs = tuple(np.full(t.shape, np.nan) for t in (q, k, v))
    got = kernels.sdpa_backward(do, q, k, v, o, st, causal=True, dq_out=bufs[0], dk_out=bufs[1], dv_out=bufs[2])
    for g, buf, r in zip(got, bufs, ref):
        assert g is buf and np.array_equal(buf, r)


def test_sdpa_supported_on_numpy(rng):
    q, k, v = _inputs(rng, 1, 1, 3, 3, 2, 2, "BSHD")
    assert kernels.sdpa_supported(q, k, v, causal=True)


@pytest.mark.parametrize("mutate, error, match", [
    (lambda a: dict(a, layout="SBHD"), ValueError, "layout must be one of"),
    (lambda a: dict(a, q=a["q"][0]), ValueError, "q must be 4-d"),
    (lambda a: dict(a, k=a["k"][:, :, :1]), ValueError, "k must match q in batch, heads and head dim"),
    (lambda a: dict(a, v=a["v"][:, :2]), ValueError, "v must match k in batch, sequence and heads"),
    (lambda a: dict(a, k=a["k"].astype(np.float32)), TypeError, "one dtype"),
    (lambda a: dict(a, bias=np.ones((1, 1, 4, 5))), ValueError, r"bias must be \(1 or 2, 1 or 3, 4, 6\)"),
    (lambda a: dict(a, scale=float("inf")), ValueError, "scale must be finite"),
    (lambda a: dict(a, scale="big"), TypeError, "scale must be a number"),
    (lambda a: dict(a, out=np.zeros((2, 4, 3, 4), np.float32)), ValueError, "out has shape"),
    (lambda a: dict(a, q=a["q"].astype(np.int32), k=a["k"].astype(np.int32), v=a["v"].astype(np.int32)),
     TypeError, "q"),
])
def test_bad_arguments_raise_before_computing(rng, mutate, error, match):
    q, k, v = _inputs(rng, 2, 3, 4, 6, 4, 4, "BSHD")
    args = mutate(dict(q=q, k=k, v=v))
    q2, k2, v2 = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(error, match=match):
        kernels.sdpa_forward(q2, k2, v2, **args)


def test_backward_checks_saved_tensors(rng):
    q, k, v = _inputs(rng, 2, 2, 4, 4, 4, 4, "BSHD")
    o, st = kernels.sdpa_forward(q, k, v)
    with pytest.raises(ValueError, match="stats must be"):
        kernels.sdpa_backward(o, q, k, v, o, st[..., 0])
    with pytest.raises(ValueError, match="do must be"):
        kernels.sdpa_backward(o[:, :2], q, k, v, o, st)


# ---------------------------------------------------------------------------------- the cuDNN graphs

def _ops(g):
    return [(op.kind, op.name) for op in g._ops]


def test_config_validates_and_is_a_cache_key():
    cfg = A.SDPAConfig(2, 4, 128, 256, 64, 32, "bfloat16", causal=True, scale=0.125, bias_shape=(1, 4, 128, 256))
    assert cfg == A.SDPAConfig(2, 4, 128, 256, 64, 32, "bfloat16", True, 0.125, (1, 4, 128, 256)) and hash(cfg)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        A.SDPAConfig(1, 1, 8, 8, 8, 8, "float32")
    with pytest.raises(ValueError, match="bias_shape"):
        A.SDPAConfig(1, 2, 8, 8, 8, 8, "float16", bias_shape=(1, 3, 8, 8))
    with pytest.raises(ValueError, match="layout"):
        A.SDPAConfig(1, 1, 8, 8, 8, 8, "float16", layout="NCHW")
    with pytest.raises(TypeError, match="batch must be a positive int"):
        A.SDPAConfig(0.5, 1, 8, 8, 8, 8, "float16")
    assert A.backward_scratch_bytes(cfg) == (2 * 4 * 128 * 4, 2 * 4 * 128 * 64 * 4)


@pytest.mark.parametrize("causal, bias", [(False, None), (True, (2, 1, 16, 24))])
def test_forward_graph_is_the_flash_attention_pattern(causal, bias):
    cfg = A.SDPAConfig(2, 3, 16, 24, 8, 16, "float16", causal=causal, scale=0.5, bias_shape=bias)
    g = A.forward_graph(cfg)
    names = [n for _, n in _ops(g)]
    want = ["bmm1", "attn_scale"] + (["bias_add"] if bias else []) + (
        ["gen_row_index", "gen_col_index", "row_ge_col", "causal_select"] if causal else []) + [
        "row_max", "sub_max", "exp", "row_sum", "log", "lse", "softmax", "bmm2"]
    assert names == want
    t = {x.name: x for x in g._tensors}
    # K enters bmm1 as the transposed (B, H, D, S) view of its BSHD memory: no copy
    assert t["k"].dims == (2, 3, 8, 24) and t["k"].dim_strides == (24 * 3 * 8, 8, 1, 3 * 8)
    assert t["q"].dim_strides == (16 * 3 * 8, 8, 3 * 8, 1)
    assert t["o"].dims == (2, 3, 16, 16) and t["o"].dim_strides == (16 * 3 * 16, 16, 3 * 16, 1)
    assert t["stats"].dtype == np.float32 and t["stats"].dims == (2, 3, 16, 1)


def test_backward_graph_binds_the_scratch_and_writes_three_gradients():
    cfg = A.SDPAConfig(1, 2, 8, 8, 8, 8, "bfloat16", causal=True)
    g = A.backward_graph(cfg)
    t = {x.name: x for x in g._tensors if not x.virtual}
    assert {"q", "k", "v", "o", "do", "stats", "softmax_sum", "dq_accum", "dq", "dk", "dv"} <= set(t)
    assert t["softmax_sum"].dtype == np.float32 and t["dq_accum"].dtype == np.float32
    # the gradients are written in the data dtype (unresolved outputs take the graph's io dtype at build)
    assert g.io_dtype == cfg.dtype and all(t[n].dtype in (None, cfg.dtype) for n in ("dq", "dk", "dv"))
    names = [n for _, n in _ops(g)]
    for first, later in (("reduce_do_o", "sub_dp_softmax_sum"), ("exp_s", "reshape_p"), ("matmul_ds_k", "identity_dq")):
        assert names.index(first) < names.index(later)


def test_plans_are_built_once_per_configuration(monkeypatch):
    """forward_plan/backward_plan finalize a graph on the first call of a configuration and return the cached
    plan after that (Graph.build stands in here: finalizing needs a GPU)."""
    built = []

    def fake_build(self, handle=None, heuristics=()):
        built.append((self.name, heuristics))
        return object()

    monkeypatch.setattr(A.Graph, "build", fake_build)
    A._plans.clear()
    cfg = A.SDPAConfig(1, 2, 16, 16, 8, 8, "float16", causal=True)
    first = A.forward_plan(cfg)
    assert A.forward_plan(cfg) is first and A.backward_plan(cfg) is A.backward_plan(cfg)
    assert A.forward_plan(A.SDPAConfig(1, 2, 16, 16, 8, 8, "float16")) is not first
    assert [name for name, _ in built] == ["sdpa_forward", "sdpa_backward", "sdpa_forward"]
    A._plans.clear()
