"""A conv -> bias -> ReLU -> max-pool block, forward and backward, built by hand: no layers.

This is the "pipeline of your own" way into dnnbind:

* cuDNN descriptors (``TensorDescriptor``, ``FilterDescriptor``, ``ConvolutionDescriptor``,
  ``ActivationDescriptor``, ``PoolingDescriptor``) plan the shapes; they work even
  without a GPU;
* a ``dnnbind.cudnn.Handle`` bound to a ``dnnbind.cuda.Stream`` runs the activation and
  pooling steps through the raw cuDNN calls (``cudnnActivationForward`` / ``Backward``,
  ``cudnnPoolingForward`` / ``Backward``) with those descriptors;
* ``dnnbind.kernels`` runs the convolution and its two backward passes and the bias gradient, on
  the same ``dnnbind.cudnn`` descriptors; the script prints the algorithms it chose
  (``dnnbind.cudnn.algo``) and the stream's workspace;
* a custom CUDA kernel, compiled at run time with NVRTC (``dnnbind.cuda.Kernel``), adds the
  bias in place (the source is inline below);
* ``dnnbind.cuda.Event`` times the forward and backward passes.

Every result is checked against the NumPy reference: the same ``dnnbind.kernels``
functions called on host arrays. On the CPU backend only that reference path runs
(and the descriptors are still built), and the script says what it skipped.

    python examples/custom_pipeline.py --device cuda
"""

from __future__ import annotations

import argparse
import ctypes
import sys

import numpy as np

import dnnbind
from dnnbind import backend, cudnn, kernels

# One thread per element of an NCHW tensor: y[n, c, h, w] += b[c], in place.
BIAS_ADD_SOURCE = r"""
extern "C" __global__ void bias_add_nchw(float* __restrict__ y, const float* __restrict__ b,
                                         int channels, int plane, long long total) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) {
        int c = (int)((i / plane) % channels);
        y[i] += b[c];
    }
}
"""

# Float32 tolerances (relative): cuDNN may use different summation orders; TF32 is switched off.
TOLERANCE = 1e-4


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--channels", type=int, default=3)
    parser.add_argument("--filters", type=int, default=16)
    parser.add_argument("--size", type=int, default=16, help="height and width of the input")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def reference(x, w, b, dout, padding):
    """Forward and backward on host arrays, through the NumPy implementations of dnnbind.kernels."""
    conv = kernels.conv2d_forward(x, w, padding=padding)
    pre = kernels.bias_add(conv, b)
    act = kernels.activation_forward(pre, "relu")
    out = kernels.pool2d_forward(act, mode="max", window=2)
    d_act = kernels.pool2d_backward(dout, act, out, mode="max", window=2)
    d_pre = kernels.activation_backward(d_act, pre, act, "relu")
    db = kernels.bias_backward(d_pre)
    dw = kernels.conv2d_backward_filter(x, d_pre, w.shape, padding=padding)
    dx = kernels.conv2d_backward_data(d_pre, w, x.shape, padding=padding)
    return {"out": out, "dx": dx, "dw": dw, "db": db}


def forward_loss(x, w, b, dout, padding) -> float:
    conv = kernels.conv2d_forward(x, w, padding=padding)
    out = kernels.pool2d_forward(kernels.activation_forward(kernels.bias_add(conv, b), "relu"), mode="max", window=2)
    return float(np.sum(out * dout))


def check_reference_gradients(x, w, b, dout, padding, rng) -> float:
    """Central differences of L = sum(out * dout) along random directions, in float64.

    This checks the reference itself (so the CPU run verifies something too): the
    directional derivative must equal <grad, direction> for dx, dw and db.
    """
    x, w, b, dout = (a.astype(np.float64) for a in (x, w, b, dout))
    grads = reference(x, w, b, dout, padding)
    eps = 1e-8  # small, so that no ReLU or max-pool decision flips between the two evaluations
    worst = 0.0
    for name, arg in (("dx", 0), ("dw", 1), ("db", 2)):
        direction = rng.standard_normal([x, w, b][arg].shape)
        plus, minus = [x, w, b], [x, w, b]
        plus[arg] = plus[arg] + eps * direction
        minus[arg] = minus[arg] - eps * direction
        numeric = (forward_loss(*plus, dout, padding) - forward_loss(*minus, dout, padding)) / (2 * eps)
        analytic = float(np.sum(grads[name] * direction))
        worst = max(worst, abs(numeric - analytic) / max(abs(analytic), 1e-12))
    return worst


def plan(x_shape, w_shape, padding):
    """Build the descriptors and let cuDNN compute the output shapes."""
    x_desc = cudnn.TensorDescriptor(x_shape, "float32", layout="NCHW")
    w_desc = cudnn.FilterDescriptor(w_shape, "float32", layout="NCHW")
    conv_desc = cudnn.ConvolutionDescriptor(pad=(padding, padding), stride=(1, 1), dilation=(1, 1),
                                            compute_dtype="float32", math="fma")
    conv_shape = tuple(conv_desc.forward_output_dim(x_desc, w_desc))
    y_desc = cudnn.TensorDescriptor(conv_shape, "float32", layout="NCHW")
    pool_desc = cudnn.PoolingDescriptor("max", window=(2, 2), pad=(0, 0), stride=(2, 2))
    pool_shape = tuple(pool_desc.forward_output_dim(y_desc))
    p_desc = cudnn.TensorDescriptor(pool_shape, "float32", layout="NCHW")
    act_desc = cudnn.ActivationDescriptor("relu", coef=0.0)
    print(f"planned: x {x_shape} * w {w_shape} -> conv {conv_shape} -> pool {pool_shape}")
    print(f"  {conv_desc!r}\n  {pool_desc!r}\n  {act_desc!r}")
    return dict(x=x_desc, w=w_desc, conv=conv_desc, y=y_desc, pool=pool_desc, p=p_desc, act=act_desc,
                conv_shape=conv_shape, pool_shape=pool_shape)


def run_gpu(x, w, b, dout, padding, descs, device):
    """The same block on the GPU: kernels + raw cuDNN calls + an NVRTC kernel, timed with events."""
    from dnnbind import cuda
    from dnnbind._lib import cudnn as capi

    stream = cuda.Stream(device=device.index)
    handle = cudnn.Handle(device=device.index, stream=stream)
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    alpha, beta = ctypes.addressof(one), ctypes.addressof(zero)
    kernel = cuda.Kernel(BIAS_ADD_SOURCE, "bias_add_nchw", device=device.index)

    xd, wd, bd = (dnnbind.to_device(a, stream=stream) for a in (x, w, b))
    doutd = dnnbind.to_device(dout, stream=stream)
    # Outputs are poisoned with NaN so that a step that silently does nothing is caught.
    nan = np.full(descs["conv_shape"], np.nan, np.float32)
    pre = dnnbind.to_device(nan, stream=stream)
    act = dnnbind.to_device(nan, stream=stream)
    out = dnnbind.to_device(np.full(descs["pool_shape"], np.nan, np.float32), stream=stream)
    d_act = dnnbind.to_device(nan, stream=stream)
    d_pre = dnnbind.to_device(nan, stream=stream)

    start, middle, end = cuda.Event(), cuda.Event(), cuda.Event()
    with kernels.config.override(allow_tf32=False):
        start.record(stream)
        kernels.conv2d_forward(xd, wd, padding=padding, out=pre, stream=stream)
        total = int(np.prod(descs["conv_shape"]))
        n, k, h, wdt = descs["conv_shape"]
        threads = 256
        kernel(((total + threads - 1) // threads, 1, 1), (threads, 1, 1),
               (pre, bd, np.int32(k), np.int32(h * wdt), np.int64(total)), stream=stream)
        capi.cudnnActivationForward(handle.handle, descs["act"].handle, alpha, descs["y"].handle, pre.ptr, beta,
                                    descs["y"].handle, act.ptr)
        capi.cudnnPoolingForward(handle.handle, descs["pool"].handle, alpha, descs["y"].handle, act.ptr, beta,
                                 descs["p"].handle, out.ptr)
        middle.record(stream)
        capi.cudnnPoolingBackward(handle.handle, descs["pool"].handle, alpha, descs["p"].handle, out.ptr,
                                  descs["p"].handle, doutd.ptr, descs["y"].handle, act.ptr, beta,
                                  descs["y"].handle, d_act.ptr)
        capi.cudnnActivationBackward(handle.handle, descs["act"].handle, alpha, descs["y"].handle, act.ptr,
                                     descs["y"].handle, d_act.ptr, descs["y"].handle, pre.ptr, beta,
                                     descs["y"].handle, d_pre.ptr)
        db = kernels.bias_backward(d_pre, stream=stream)
        dw = kernels.conv2d_backward_filter(xd, d_pre, w.shape, padding=padding, stream=stream)
        dx = kernels.conv2d_backward_data(d_pre, wd, x.shape, padding=padding, stream=stream)
        end.record(stream)
    end.synchronize()
    print(f"gpu: forward {start.elapsed_time(middle):.3f} ms, backward {middle.elapsed_time(end):.3f} ms "
          f"(first call: includes cuDNN algorithm selection)")
    # What dnnbind.kernels chose for the convolutions, from the same room as the descriptors above.
    for key, choice in cudnn.algo.cache_info().items():
        if key.x_dims == tuple(x.shape) and key.w_dims == tuple(w.shape):
            print(f"  conv {key.direction}: {choice.name} ({choice.source}, {choice.workspace} B of workspace)")
    scratch = cudnn.workspace_buffer(stream)
    print(f"  cuDNN workspace of the stream: {0 if scratch is None else scratch.nbytes} B")
    result = {name: arr.to_host(stream=stream) for name, arr in
              (("out", out), ("dx", dx), ("dw", dw), ("db", db))}
    handle.close()
    stream.close()
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = backend.resolve_device(None if args.device == "auto" else args.device)
    rng = np.random.default_rng(args.seed)
    padding = 1
    x = rng.standard_normal((args.batch, args.channels, args.size, args.size)).astype(np.float32)
    w = (rng.standard_normal((args.filters, args.channels, 3, 3)) * 0.3).astype(np.float32)
    b = rng.uniform(-0.5, 0.5, args.filters).astype(np.float32)

    descs = plan(x.shape, w.shape, padding)
    dout = rng.standard_normal(descs["pool_shape"]).astype(np.float32)
    ref = reference(x, w, b, dout, padding)
    if tuple(ref["out"].shape) != descs["pool_shape"]:
        print(f"error: NumPy output {ref['out'].shape} differs from cuDNN's plan {descs['pool_shape']}",
              file=sys.stderr)
        return 1
    print(f"numpy reference: out {ref['out'].shape}, |out| mean {np.abs(ref['out']).mean():.4f}, "
          f"|dw| mean {np.abs(ref['dw']).mean():.4f}")

    grad_error = check_reference_gradients(x, w, b, dout, padding, rng)
    print(f"numpy reference gradients vs central differences (float64): relative error {grad_error:.2e}")
    if not grad_error < 1e-4:
        print("custom pipeline: FAILED (the NumPy reference gradients are wrong)", file=sys.stderr)
        return 1

    if not device.is_cuda:
        print("cpu backend: skipped the GPU pipeline (cuDNN handle, NVRTC kernel, events); "
              "ran the NumPy reference and the descriptor planning only")
        print("custom pipeline: OK (cpu)")
        return 0

    got = run_gpu(x, w, b, dout, padding, descs, device)
    failed = False
    for name, expected in ref.items():
        err = rel_error(got[name], expected)
        ok = np.all(np.isfinite(got[name])) and err < TOLERANCE
        failed |= not ok
        print(f"  {name:>3}: relative error {err:.2e} {'ok' if ok else 'FAILED'}")
    if failed:
        print("custom pipeline: FAILED", file=sys.stderr)
        return 1
    print("custom pipeline: OK (gpu matches numpy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
