"""Host time per cuDNN call through dnnbind's binding, in microseconds.

    python benchmarks/host_overhead.py [--repeat 20000]

Without a GPU it times descriptor calls only (cuDNN's descriptor functions need none);
with one it adds cudnnActivationForward on a tiny tensor and a conv forward with cached
descriptors. GPU rows measure the host side of the call (enqueue), not kernel time: the
stream is synchronised only once per batch of calls, outside the timed region's inner loop.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from typing import Callable

import numpy as np

import dnnbind.cudnn as cd
from dnnbind._lib import cudnn as C


def _time(fn: Callable[[], None], repeat: int, sync: Callable[[], None] | None = None) -> float:
    for _ in range(min(repeat, 200)):  # warm-up: lazy loading, caches
        fn()
    if sync:
        sync()
    best = float("inf")
    batch = max(repeat // 5, 1)
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        best = min(best, (time.perf_counter() - start) / batch)
        if sync:
            sync()  # drain the queue between batches so it never fills up
    return best * 1e6


def descriptor_rows(repeat: int) -> list[tuple[str, float]]:
    desc = ctypes.c_void_p()
    C.cudnnCreateTensorDescriptor(ctypes.byref(desc))
    raw = C.raw("cudnnSetTensor4dDescriptor")
    d = desc.value
    x = cd.TensorDescriptor((8, 64, 32, 32), "float32")
    w = cd.FilterDescriptor((64, 64, 3, 3), "float32")
    conv = cd.ConvolutionDescriptor(pad=1)
    outs = [ctypes.c_int() for _ in range(4)]
    refs = [ctypes.byref(o) for o in outs]
    xh, wh, ch = x.handle, w.handle, conv.handle
    rows = [
        ("cudnnSetTensor4dDescriptor: bare ctypes (no check)", _time(lambda: raw(d, 0, 0, 8, 64, 32, 32), repeat)),
        ("cudnnSetTensor4dDescriptor: checked wrapper", _time(lambda: C.cudnnSetTensor4dDescriptor(
            d, 0, 0, 8, 64, 32, 32), repeat)),
        ("cudnnSetTensor4dDescriptor: C.call(..., context=)", _time(lambda: C.call(
            "cudnnSetTensor4dDescriptor", d, 0, 0, 8, 64, 32, 32, context=None), repeat)),
        ("cudnnGetConvolution2dForwardOutputDim: checked", _time(lambda: C.cudnnGetConvolution2dForwardOutputDim(
            ch, xh, wh, *refs), repeat)),
        ("ConvolutionDescriptor.forward_output_dim (public)", _time(lambda: conv.forward_output_dim(x, w), repeat)),
        ("TensorDescriptor.cached hit", _time(lambda: cd.TensorDescriptor.cached((8, 64, 32, 32), "float32"),
                                              repeat)),
        ("TensorDescriptor(...) create+set+destroy", _time(lambda: cd.TensorDescriptor(
            (8, 64, 32, 32), "float32").close(), repeat // 4)),
    ]
    C.cudnnDestroyTensorDescriptor(d)
    return rows


def gpu_rows(repeat: int) -> list[tuple[str, float]]:
    from dnnbind import cuda

    stream = cuda.Stream()
    handle = cd.get_handle(stream)
    h = handle.handle
    one, zero = ctypes.byref(ctypes.c_float(1.0)), ctypes.byref(ctypes.c_float(0.0))
    x = cuda.to_device(np.random.default_rng(0).standard_normal((1, 4, 4, 4)).astype(np.float32), stream=stream)
    y = cuda.empty((1, 4, 4, 4), np.float32, stream=stream)
    t = cd.TensorDescriptor.cached((1, 4, 4, 4), "float32")
    act = cd.ActivationDescriptor.cached("relu")
    ah, th, xp, yp = act.handle, t.handle, x.ptr, y.ptr

    xs = cd.TensorDescriptor.cached((2, 8, 16, 16), "float32")
    ws = cd.FilterDescriptor.cached((8, 8, 3, 3), "float32")
    conv = cd.ConvolutionDescriptor.cached(1, 1, 1, 1, "float32", "tensor_op")
    ys = cd.TensorDescriptor.cached(conv.forward_output_dim(xs, ws), "float32")
    cx = cuda.to_device(np.ones((2, 8, 16, 16), np.float32), stream=stream)
    cw = cuda.to_device(np.ones((8, 8, 3, 3), np.float32), stream=stream)
    cy = cuda.empty(ys.get().shape, np.float32, stream=stream)
    algo = C.ConvolutionFwdAlgo.IMPLICIT_PRECOMP_GEMM
    size = ctypes.c_size_t()
    C.cudnnGetConvolutionForwardWorkspaceSize(h, xs.handle, ws.handle, conv.handle, ys.handle, algo,
                                              ctypes.byref(size))
    work = cuda.alloc(max(size.value, 1), stream=stream)

    def conv_call() -> None:
        C.cudnnConvolutionForward(h, one, xs.handle, cx.ptr, ws.handle, cw.ptr, conv.handle, algo, work.ptr,
                                  size.value, zero, ys.handle, cy.ptr)

    def conv_with_lookup() -> None:
        # What an op does per call: cached descriptors by shape, then the call.
        x_d = cd.TensorDescriptor.cached((2, 8, 16, 16), "float32")
        w_d = cd.FilterDescriptor.cached((8, 8, 3, 3), "float32")
        c_d = cd.ConvolutionDescriptor.cached(1, 1, 1, 1, "float32", "tensor_op")
        y_d = cd.TensorDescriptor.cached((2, 8, 16, 16), "float32")
        C.cudnnConvolutionForward(cd.get_handle(stream).handle, one, x_d.handle, cx.ptr, w_d.handle, cw.ptr,
                                  c_d.handle, algo, work.ptr, size.value, zero, y_d.handle, cy.ptr)

    n = max(repeat // 10, 100)
    return [
        ("cudnnActivationForward 1x4x4x4 (host)", _time(lambda: C.cudnnActivationForward(
            h, ah, one, th, xp, zero, th, yp), n, stream.synchronize)),
        ("cudnnConvolutionForward 2x8x16x16 (host)", _time(conv_call, n, stream.synchronize)),
        ("  + descriptor cache lookups + get_handle", _time(conv_with_lookup, n, stream.synchronize)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20000)
    args = parser.parse_args()
    rows = descriptor_rows(args.repeat)
    from dnnbind import cuda

    if cuda.is_available():
        rows += gpu_rows(args.repeat)
        where = f"GPU: {cuda.Device(0).name}"
    else:
        where = f"no GPU ({cuda.unavailable_reason()}): descriptor calls only"
    print(f"cuDNN {C.version()} (built for CUDA {C.cudart_version()}); {where}")
    width = max(len(name) for name, _ in rows)
    print(f"{'call':<{width}}  host µs/call")
    print("-" * (width + 14))
    for name, us in rows:
        print(f"{name:<{width}}  {us:10.2f}")


if __name__ == "__main__":
    main()
