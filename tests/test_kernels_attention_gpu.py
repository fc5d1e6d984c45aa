"""cuDNN's fused flash attention on CUDA (``kernels.sdpa_forward``/``sdpa_backward`` through
``dnnbind.cudnn.attention``'s graphs) vs the float64 NumPy twin per dtype, into NaN-poisoned outputs;
``keras.ops.dot_product_attention`` fused vs composed (values and tape gradients); and the fused forward and
backward captured into a CUDA graph, replayed with new inputs (nothing allocated in the capture outlives it)."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import cuda, kernels, ops
from dnnbind.autodiff import GradientTape
from gpu_errlog import BF16, check, dev, poisoned, quantize
from testutil import random

pytestmark = pytest.mark.gpu

HALF = [pytest.param("float16", np.dtype(np.float16), id="fp16"), pytest.param("bfloat16", BF16, id="bf16")]
# one product, a softmax and a second product, accumulated in float32: the half-precision rounding of P and O
TOL = {"float16": 1e-2, "bfloat16": 3e-2}

CASES = [  # (b, h, sq, skv, d, dv, causal, bias, layout)
    (2, 3, 128, 128, 64, 64, False, None, "BSHD"),
    (2, 3, 128, 128, 64, 64, True, None, "BSHD"),
    (2, 4, 96, 160, 128, 128, False, (1, 4), "BSHD"),
    (2, 2, 128, 128, 64, 64, True, (2, 1), "BSHD"),
    (1, 4, 200, 200, 64, 64, True, None, "BHSD"),
    (2, 2, 64, 64, 128, 64, False, None, "BSHD"),
]


def _ids(case):
    b, h, sq, skv, d, dv, causal, bias, layout = case
    return f"{layout}-q{sq}k{skv}-d{d}v{dv}" + ("-causal" if causal else "") + (f"-bias{bias}" if bias else "")


@pytest.mark.parametrize("label, dtype", HALF)
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_sdpa_on_cuda_matches_float64_numpy(rng, label, dtype, case):
    b, h, sq, skv, d, dv, causal, bias, layout = case
    shape = (lambda s, w: (b, s, h, w)) if layout == "BSHD" else (lambda s, w: (b, h, s, w))
    q, k = quantize(random(rng, shape(sq, d), low=-2, high=2), dtype), quantize(random(rng, shape(skv, d)), dtype)
    v, do = quantize(random(rng, shape(skv, dv)), dtype), quantize(random(rng, shape(sq, dv)), dtype)
    bb = None if bias is None else quantize(random(rng, (*bias, sq, skv)), dtype)
    kw = dict(causal=causal, layout=layout, scale=0.1)
    o_ref, st_ref = kernels.sdpa_forward(q, k, v, bias=bb, **kw)
    dq_ref, dk_ref, dv_ref = kernels.sdpa_backward(do, q, k, v, o_ref, st_ref, bias=bb, **kw)
    qd, kd, vd, dod = dev(q, dtype), dev(k, dtype), dev(v, dtype), dev(do, dtype)
    bd = None if bb is None else dev(bb, dtype)
    assert kernels.sdpa_supported(qd, kd, vd, bias=bd, **kw)
    o, st = kernels.sdpa_forward(qd, kd, vd, bias=bd, out=poisoned(o_ref.shape, dtype),
                                 stats_out=poisoned(st_ref.shape, np.float32), **kw)
    grads = kernels.sdpa_backward(dod, qd, kd, vd, o, st, bias=bd, dq_out=poisoned(q.shape, dtype),
                                  dk_out=poisoned(k.shape, dtype), dv_out=poisoned(v.shape, dtype), **kw)
    case_s = _ids(case)
    check("sdpa_forward.o", label, o, o_ref, case_s, TOL[label])
    check("sdpa_forward.stats", label, st, st_ref, case_s, 1e-3)
    for name, got, ref in zip(("dq", "dk", "dv"), grads, (dq_ref, dk_ref, dv_ref)):
        check(f"sdpa_backward.{name}", label, got, ref, case_s, TOL[label])


@pytest.mark.parametrize("label, dtype", HALF)
@pytest.mark.parametrize("causal", [False, True])
def test_dot_product_attention_fused_matches_composed_with_gradients(rng, label, dtype, causal):
    """keras.ops.dot_product_attention on device arrays: flash_attention=True (cuDNN) vs False (cuBLAS +
    softmax), outputs and the tape's gradients of q, k, v; a boolean mask in bfloat16 (an additive bias)."""
    b, t, s, n, hd = 2, 64, 64, 4, 64
    q, k, v = (quantize(random(rng, (b, L, n, hd)), dtype) for L in (t, s, s))
    w = quantize(random(rng, (b, t, n, hd)), dtype)
    mask = None
    if label == "bfloat16":
        mask = rng.uniform(size=(b, 1, t, s)) > 0.2
        mask[..., 0] = True
    results = {}
    for flash in (True, False):
        qd, kd, vd = (ops.convert_to_tensor(dev(x, dtype)) for x in (q, k, v))
        with GradientTape() as tape:
            tape.watch([qd, kd, vd])
            out = ops.dot_product_attention(qd, kd, vd, mask=None if mask is None else dev(mask), is_causal=causal,
                                            flash_attention=flash)
            loss = ops.sum(ops.cast(out, "float32") * ops.convert_to_tensor(dev(w.astype(np.float32))))
        results[flash] = [ops.convert_to_numpy(x).astype(np.float64) for x in [out, *tape.gradient(loss, [qd, kd, vd])]]
    for name, a, e in zip(("out", "dq", "dk", "dv"), results[True], results[False]):
        check(f"dot_product_attention.fused.{name}", label, a, e, f"causal={causal}", TOL[label])


def test_fused_attention_captured_in_a_graph_replays_with_new_inputs(rng):
    b, h, s, d = 2, 4, 128, 64
    dtype = BF16
    stream = cuda.Stream()
    x0 = [quantize(random(rng, (b, s, h, d)), dtype) for _ in range(4)]
    x1 = [quantize(random(rng, (b, s, h, d), low=-2, high=1), dtype) for _ in range(4)]
    bufs = [cuda.to_device(x.astype(dtype), stream=stream) for x in x0]
    qd, kd, vd, dod = bufs
    outs = [cuda.empty((b, s, h, d), dtype, stream=stream) for _ in range(4)]
    st = cuda.empty((b, h, s, 1), np.float32, stream=stream)

    def step():
        o, _ = kernels.sdpa_forward(qd, kd, vd, causal=True, out=outs[0], stats_out=st, stream=stream)
        kernels.sdpa_backward(dod, qd, kd, vd, o, st, causal=True, dq_out=outs[1], dk_out=outs[2], dv_out=outs[3],
                              stream=stream)

    step()  # warm-up: the plans are built and the workspace grown outside the capture
    stream.synchronize()
    with cuda.capture(stream) as graph:
        step()
    assert list(graph.outstanding_allocations) == []
    for xs in (x0, x1):
        for buf, x in zip(bufs, xs):
            buf.copy_from_host(x.astype(dtype), stream=stream)
        for out in outs:
            out.fill_bytes(0xFF, stream=stream)
        graph.launch(stream)
        stream.synchronize()
        q, k, v, do = xs
        o_ref, st_ref = kernels.sdpa_forward(q, k, v, causal=True)
        refs = (o_ref, *kernels.sdpa_backward(do, q, k, v, o_ref, st_ref, causal=True))
        for name, got, ref in zip(("o", "dq", "dk", "dv"), outs, refs):
            check(f"graph_capture.sdpa.{name}", "bfloat16", got, ref, "", TOL["bfloat16"])
    graph.close()


def test_unsupported_head_dim_falls_back_to_the_composed_path(rng):
    """A head dim cuDNN's engines do not take (not a multiple of 8): sdpa_supported says so, and
    dot_product_attention computes it composed (flash_attention=True refuses with the reason)."""
    x = quantize(random(rng, (1, 16, 2, 12)), BF16)
    q = dev(x, BF16)
    assert not kernels.sdpa_supported(q, q, q)
    out = ops.dot_product_attention(q, q, q)
    check("dot_product_attention.composed", "bfloat16", ops.convert_to_numpy(out).astype(np.float64),
          ops.convert_to_numpy(ops.dot_product_attention(x, x, x)), "head dim 12", TOL["bfloat16"])
    with pytest.raises(ValueError, match="flash_attention=True needs cuDNN"):
        ops.dot_product_attention(q, q, q, flash_attention=True)
