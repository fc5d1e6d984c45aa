"""cuDNN's fused flash attention driven directly: the graphs, the cached plans, and the raw execute call.

    python examples/attention.py

For users who bring their own device buffers (a pipeline of their own, not Keras): it builds the forward
and backward attention plans of one configuration (bfloat16, causal, Keras's (batch, seq, heads, dim)
layout), binds device buffers by name, runs both passes on one stream with the plan's workspace and the
backward's float32 scratch, and compares with ``dnnbind.kernels``' NumPy twin in float64. Without a GPU
(or with ``DNNBIND_DEVICE=cpu``) it says so, shows the graphs it would build (their operations in order and the tensors bound by name) and
runs the NumPy twin.
"""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np

from dnnbind import backend, cuda, kernels
from dnnbind.cudnn import attention as A

B, H, S, D = 2, 4, 256, 64
BF16 = np.dtype(ml_dtypes.bfloat16)


def describe(g) -> str:
    ops = " -> ".join(op.name for op in g._ops)
    bound = ", ".join(f"{t.name}{tuple(t.dims)}" for t in g._tensors if not t.virtual and not t.is_scalar)
    return f"{g.name}: {ops}\n  bound by name: {bound}"


def main() -> int:
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.uniform(-1, 1, (B, S, H, D)).astype(BF16) for _ in range(4))
    cfg = A.SDPAConfig(B, H, S, S, D, D, "bfloat16", causal=True, scale=D ** -0.5)
    print(describe(A.forward_graph(cfg)))
    print(describe(A.backward_graph(cfg)))
    f64 = [t.astype(np.float64) for t in (q, k, v, do)]
    o_ref, st_ref = kernels.sdpa_forward(*f64[:3], causal=True)
    grads_ref = kernels.sdpa_backward(f64[3], *f64[:3], o_ref, st_ref, causal=True)
    if not backend.default_device().is_cuda:  # no GPU, or DNNBIND_DEVICE=cpu
        why = "DNNBIND_DEVICE=cpu" if cuda.is_available() else f"no GPU ({cuda.unavailable_reason()})"
        print(f"{why}: ran the NumPy twin only; o[0, 0, 0, :4] =", np.round(o_ref[0, 0, 0, :4], 4))
        print("attention example: OK (cpu)")
        return 0

    from dnnbind.cudnn import workspace

    stream = cuda.Stream()
    fwd, bwd = A.forward_plan(cfg), A.backward_plan(cfg)  # finalized once, then cached per configuration
    print(f"forward plan: {fwd.engine}, workspace {fwd.workspace_size} B; backward: {bwd.engine}, "
          f"workspace {bwd.workspace_size} B")
    put = lambda a: cuda.to_device(a, stream=stream)  # noqa: E731 - explicit host->device copies on the stream
    d = {"q": put(q), "k": put(k), "v": put(v), "do": put(do)}
    d["o"] = cuda.empty((B, S, H, D), BF16, stream=stream)
    d["stats"] = cuda.empty((B, H, S, 1), np.float32, stream=stream)
    # raw pointers: the graphs address q/k/v/o through (B, H, S, D) strides of their (B, S, H, D) memory (K as
    # its transposed view), which a DeviceArray's own shape check would not match
    fwd.execute({n: d[n].ptr for n in ("q", "k", "v", "o", "stats")},
                workspace=workspace(stream, fwd.workspace_size), stream=stream)
    # the backward's float32 scratch (A.backward_scratch_bytes(cfg) gives their sizes)
    d["softmax_sum"] = cuda.empty((B, H, S, 1), np.float32, stream=stream)
    d["dq_accum"] = cuda.empty((B, H, S, D), np.float32, stream=stream)
    for name in ("dq", "dk", "dv"):
        d[name] = cuda.empty((B, S, H, D), BF16, stream=stream)
    names = ("q", "k", "v", "o", "do", "stats", "softmax_sum", "dq_accum", "dq", "dk", "dv")
    bwd.execute({n: d[n].ptr for n in names}, workspace=workspace(stream, bwd.workspace_size), stream=stream)
    got = {n: d[n].to_host(stream=stream).astype(np.float64) for n in ("o", "dq", "dk", "dv")}  # syncs once
    worst = 0.0
    for name, ref in zip(("o", "dq", "dk", "dv"), (o_ref, *grads_ref)):
        err = float(np.abs(got[name] - ref).max() / np.abs(ref).max())
        worst = max(worst, err)
        print(f"{name}: max relative error vs float64 NumPy {err:.2e}")
    if worst > 3e-2:
        print("attention example: FAILED")
        return 1
    print("attention example: OK (gpu matches numpy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
