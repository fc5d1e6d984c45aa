"""A fused cuDNN graph: conv + bias + relu in one kernel, checked against the NumPy reference.

    python examples/cudnn_graph.py

On a GPU it builds the plan (cached: a second build of the same structure is a cache hit), runs it
and compares with ``dnnbind.kernels`` on NumPy, then tries MLPerf ResNet's scale-bias-relu-conv-genstats
block (batch-norm statistics in the convolution's epilogue) and its backward, dgrad + drelu + the
batch-norm weight gradients (cuDNN's DgradDreluBNBwdWeight fusion). Without a GPU it says so and shows the
graphs it would build (shapes, layouts, what stays virtual).
"""

from __future__ import annotations

import numpy as np

from dnnbind import cuda, kernels
from dnnbind.cudnn.graph import Graph, GraphNotSupportedError, plan_cache_info

N, H, W, C, K = 8, 16, 16, 32, 64


def conv_bias_relu_graph(dtype: str = "float16") -> Graph:
    g = Graph(io_dtype=dtype, compute_dtype="float32", name="conv_bias_relu")  # NHWC, channels_last
    x = g.tensor("x", (N, H, W, C))
    w = g.tensor("w", (K, 3, 3, C))
    b = g.tensor("b", (1, 1, 1, K))
    y = g.relu(g.bias(g.conv_fprop(x, w, padding=1), b))
    y.output("y")
    return g


def genstats_graph(dtype: str = "float16") -> Graph:
    g = Graph(io_dtype=dtype, intermediate_dtype=dtype, name="scale_bias_relu_conv_genstats")
    x = g.tensor("x", (N, H, W, C))
    t = g.relu(g.bias(g.scale(x, g.tensor("scale", (1, 1, 1, C))), g.tensor("bias", (1, 1, 1, C))))
    y = g.conv_fprop(t, g.tensor("w", (K, 3, 3, C)), padding=1).output("y")
    s, sq = g.genstats(y)
    s.output("sum")
    sq.output("sq_sum")
    return g


def dgrad_drelu_dbn_graph(dtype: str = "float16") -> Graph:
    """The backward of conv(relu(batchnorm(x))) down to the batch norm's weight gradients, one cuDNN fusion."""
    g = Graph(io_dtype=dtype, name="dgrad_drelu_dbn_weight")
    per_channel = [g.tensor(n, (1, 1, 1, C), "float32") for n in ("mean", "inv_std", "gamma", "beta")]
    outs = g.dgrad_drelu_dbn_weight(g.tensor("dy", (N, H, W, K)), g.tensor("w", (K, 3, 3, C)),
                                    g.tensor("x", (N, H, W, C)), *per_channel, padding=1)
    for t, name in zip(outs, ("dz", "dscale", "dbias", "eq_scale_dy", "eq_scale_x", "eq_bias")):
        t.output(name)
    return g


def show(g: Graph) -> None:
    print(g)
    for t in g.tensors:
        print(f"  {t!r}  cuDNN dims {t.dims} strides {t.dim_strides}")


def run_conv_bias_relu(rng: np.random.Generator) -> None:
    dtype = np.float16
    x = rng.uniform(-1, 1, (N, H, W, C)).astype(dtype)
    w = rng.uniform(-0.2, 0.2, (K, 3, 3, C)).astype(dtype)
    b = rng.uniform(-0.5, 0.5, (1, 1, 1, K)).astype(dtype)
    plan = conv_bias_relu_graph().build()
    conv_bias_relu_graph().build()  # same structure: served from the plan cache
    print(f"plan: {plan}; cache {plan_cache_info()}")
    y = cuda.to_device(np.full((N, H, W, K), np.nan, dtype))
    ws = cuda.empty((plan.workspace_size,), "uint8") if plan.workspace_size else None
    plan.execute({"x": cuda.to_device(x), "w": cuda.to_device(w), "b": cuda.to_device(b), "y": y}, workspace=ws)
    got = y.numpy().astype(np.float64)
    ref = np.maximum(kernels.conv2d_forward(x.astype(np.float64), w.astype(np.float64), padding=1, layout="NHWC")
                     + b.astype(np.float64), 0.0)
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    print(f"conv + bias + relu (float16, one fused kernel): relative error vs NumPy {err:.2e}")
    assert err < 1e-2, err


def run_genstats(rng: np.random.Generator) -> None:
    dtype = np.float16
    arrays = {"x": rng.uniform(-1, 1, (N, H, W, C)), "w": rng.uniform(-0.2, 0.2, (K, 3, 3, C)),
              "scale": rng.uniform(0.5, 1.5, (1, 1, 1, C)), "bias": rng.uniform(-0.2, 0.2, (1, 1, 1, C))}
    arrays = {k: v.astype(dtype) for k, v in arrays.items()}
    try:
        plan = genstats_graph().build()
    except GraphNotSupportedError as err:
        print(f"scale-bias-relu-conv-genstats: no engine on this GPU ({err.status_name})")
        return
    dev = {k: cuda.to_device(v) for k, v in arrays.items()}
    dev["y"] = cuda.to_device(np.full((N, H, W, K), np.nan, dtype))
    dev["sum"] = cuda.to_device(np.full((1, 1, 1, K), np.nan, np.float32))
    dev["sq_sum"] = cuda.to_device(np.full((1, 1, 1, K), np.nan, np.float32))
    plan.execute(dev, workspace=cuda.empty((plan.workspace_size,), "uint8") if plan.workspace_size else None)
    y = dev["y"].numpy().astype(np.float64)
    s = dev["sum"].numpy().astype(np.float64)
    ref = y.sum(axis=(0, 1, 2), keepdims=True)
    err = np.linalg.norm(s - ref) / np.linalg.norm(ref)
    print(f"scale-bias-relu-conv-genstats: channel sums from the epilogue vs NumPy over y: {err:.2e}")


def run_dgrad_drelu_dbn(rng: np.random.Generator) -> None:
    dtype = np.float16
    x = rng.uniform(-1, 2, (N, H, W, C)).astype(dtype)
    xr = x.astype(np.float64)
    mean = xr.mean(axis=(0, 1, 2), keepdims=True).astype(np.float32)
    inv = (1.0 / np.sqrt(xr.var(axis=(0, 1, 2), keepdims=True) + 1e-3)).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, (1, 1, 1, C)).astype(np.float32)
    beta = rng.uniform(-0.5, 0.5, (1, 1, 1, C)).astype(np.float32)
    dy = rng.uniform(-1, 1, (N, H, W, K)).astype(dtype)
    w = rng.uniform(-0.2, 0.2, (K, 3, 3, C)).astype(dtype)
    plan = dgrad_drelu_dbn_graph().build()
    print(f"plan: {plan}")
    dev = {"x": x, "mean": mean, "inv_std": inv, "gamma": gamma, "beta": beta, "dy": dy, "w": w}
    dev = {k: cuda.to_device(v) for k, v in dev.items()}
    dev["dz"] = cuda.to_device(np.full((N, H, W, C), np.nan, dtype))
    for name in ("dscale", "dbias", "eq_scale_dy", "eq_scale_x", "eq_bias"):
        dev[name] = cuda.to_device(np.full((1, 1, 1, C), np.nan, np.float32))
    plan.execute(dev, workspace=cuda.empty((plan.workspace_size,), "uint8") if plan.workspace_size else None)
    xhat = (xr - mean) * inv
    dz = kernels.conv2d_backward_data(dy.astype(np.float64), w.astype(np.float64), x.shape, padding=1,
                                  layout="NHWC") * (xhat * gamma + beta > 0)
    ref = (dz * xhat).sum(axis=(0, 1, 2), keepdims=True)
    got = dev["dscale"].numpy().astype(np.float64)
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    print(f"dgrad + drelu + dbn_weight (float16, one fusion): batch-norm scale gradient vs NumPy {err:.2e}")


def main() -> None:
    rng = np.random.default_rng(0)
    if not cuda.is_available():
        print(f"This example needs an NVIDIA GPU to run the plans: {cuda.unavailable_reason()}")
        print("The graphs it would build:")
        show(conv_bias_relu_graph())
        show(genstats_graph())
        show(dgrad_drelu_dbn_graph())
        return
    run_conv_bias_relu(rng)
    run_genstats(rng)
    run_dgrad_drelu_dbn(rng)


if __name__ == "__main__":
    main()
