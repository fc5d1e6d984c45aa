"""Conv + batch norm (+ relu): the fused cuDNN-graph paths of ``kernels.conv2d_batchnorm_forward_training`` and
``kernels.batchnorm_relu_conv2d_backward`` against the ops they replace, per shape and precision, and what the
measured choice picks (issue 9).

For each ResNet/VGG-like shape (``vgg_cifar``'s and ``airbench94``'s convolutions) and each precision
(``fp16``, ``bf16``, ``tf32``, ``fp32`` = float32 without TF32) it times, in microseconds of GPU time,
one training forward + the batch norm's backward (the job a ``Conv2D -> BatchNormalization -> ReLU``
does that fusion changes):

* ``legacy``: ``conv2d_forward`` + ``batchnorm_forward_training(activation="relu")`` + ``batchnorm_backward``;
* ``genstats``: ``conv2d_batchnorm_forward_training`` on its graph path (``conv_graph.FORCE_GRAPH``: the
  convolution with the statistics in its epilogue, then the normalising kernel) + the same backward;
  "no engine" where cuDNN builds none for it.

and, for the backward of a ``BatchNormalization -> ReLU -> Conv2D`` (x the batch norm's input, the same
shapes, C = K), from the convolution's output gradient down to x:

* ``legacy``: ``conv2d_backward_data`` + ``batchnorm_backward(activation="relu")``;
* ``dgrad_drelu_dbnw``: ``batchnorm_relu_conv2d_backward`` on its graph path (dgrad + drelu + dbn_weight,
  then the dx kernel).

Timing: ``kernel_bandwidth.py``'s ``Timer`` (warm-up runs, then ``--reps`` runs queued behind a spin kernel,
whose hold doubles until the host queues them all before it ends, between CUDA events: GPU time, as a
captured step replays it; the median of ``--trials`` such timings). ``choice`` is what
``config.benchmark`` picks for the key (its own measurement of the forward jobs), ``heuristic`` what is
taken without it (the graph for float16 only). The normalising kernel's achieved bandwidth (read y,
write out) is reported against ``--bandwidth`` GB/s when given.

    python benchmarks/conv_bn.py
    python benchmarks/conv_bn.py --precisions fp16 bf16 --reps 20 --json conv_bn.json
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

SHAPES = [  # (x (N, H, W, C), filters): 3x3 "same" convolutions
    ((256, 32, 32, 64), 64), ((256, 16, 16, 128), 128), ((256, 8, 8, 256), 256),
    ((1024, 16, 16, 64), 256), ((1024, 8, 8, 256), 256),
]
PRECISIONS = {"fp16": ("float16", True), "bf16": ("bfloat16", True), "tf32": ("float32", True),
              "fp32": ("float32", False)}


def main(argv: "list[str] | None" = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=list(PRECISIONS))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--bandwidth", type=float, default=None, help="the GPU's measured GB/s, for the kernel's share")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from dnnbind import cuda, kernels
    from dnnbind.kernels._cuda import conv_bn, conv_graph
    from kernel_bandwidth import Timer  # this folder's: GPU time of back-to-back calls

    if not cuda.is_available():
        print("conv_bn.py: needs an NVIDIA GPU", file=sys.stderr)
        return 2
    stream = cuda.current_stream()
    timer = Timer(args.reps, args.trials)
    rng = np.random.default_rng(0)
    rows = []
    print("ratios: time / legacy time; genstats = heuristics A's first plan (what the heuristic mode takes);\n"
          "choice / heuristic = the path config.benchmark / the unmeasured rule takes, and its job's time ratio")
    print(f"{'precision':9s} {'x (N,H,W,C)':20s} {'K':>4s} {'legacy us':>10s} {'genstats us':>12s} {'ratio':>6s} "
          f"{'apply GB/s':>12s} {'choice':>13s} {'heuristic':>13s}")
    for label in args.precisions:
        dtype, tf32 = PRECISIONS[label]
        for x_shape, k in SHAPES:
            c = x_shape[3]
            x = kernels.cast(cuda.to_device(rng.uniform(-1, 1, x_shape).astype(np.float32)), dtype)
            w = kernels.cast(cuda.to_device(rng.uniform(-.1, .1, (k, 3, 3, c)).astype(np.float32)), dtype)
            gamma, beta = (cuda.to_device(rng.uniform(lo, hi, k).astype(np.float32))
                           for lo, hi in ((.5, 1.5), (-.5, .5)))
            rm, rv = cuda.to_device(np.zeros(k, np.float32)), cuda.to_device(np.ones(k, np.float32))
            y_shape = x_shape[:3] + (k,)
            dout = kernels.cast(cuda.to_device(rng.uniform(-1, 1, y_shape).astype(np.float32)), dtype)
            kw = dict(momentum=0.99, epsilon=1e-3, activation="relu", layout="NHWC")
            row = {"precision": label, "x": x_shape, "filters": k}
            with kernels.config.override(allow_tf32=tf32):
                def legacy():
                    y = kernels.conv2d_forward(x, w, padding=1, layout="NHWC")
                    out, saved = kernels.batchnorm_forward_training(y, gamma, beta, rm, rv, **kw)
                    kernels.batchnorm_backward(dout, y, gamma, saved, y=out, epsilon=1e-3, activation="relu",
                                           layout="NHWC")

                def fused():
                    y, out, saved = kernels.conv2d_batchnorm_forward_training(x, w, gamma, beta, rm, rv, padding=1, **kw)
                    kernels.batchnorm_backward(dout, y, gamma, saved, y=out, epsilon=1e-3, activation="relu",
                                           layout="NHWC")
                    return saved

                row["legacy_us"] = timer.per_call_ms(legacy) * 1e3
                conv_graph.clear_cache()
                conv_graph.FORCE_GRAPH = True
                try:
                    if fused().path == conv_bn.GENSTATS:
                        row["genstats_us"] = timer.per_call_ms(fused) * 1e3
                        y = cuda.empty(y_shape, dtype)
                        sums = cuda.to_device(np.ones(k, np.float32))
                        mean, inv = cuda.empty((k,), "float32"), cuda.empty((k,), "float32")
                        apply_ms = timer.per_call_ms(lambda: conv_bn._apply(
                            y, y, sums, sums, gamma, beta, rm, rv, mean, inv, int(np.prod(y_shape)) // k, 1e-3, 0.99,
                            True, stream))
                        row["apply_gbps"] = 2 * y.nbytes / (apply_ms * 1e-3) / 1e9
                finally:
                    conv_graph.FORCE_GRAPH = False
                    conv_graph.clear_cache()
                for mode, bench in (("choice", True), ("heuristic", False)):
                    with kernels.config.override(benchmark=bench):
                        fused()  # decides the key (measuring both jobs under benchmark)
                        row[f"{mode}_us"] = timer.per_call_ms(fused) * 1e3
                    picks = [ch.path for key, ch in conv_graph.cache_info().items()
                             if key.direction == "forward_genstats" and key.benchmark == bench]
                    row[mode] = picks[0] if picks else "legacy"
                conv_graph.clear_cache()
            g, gbps, lu = row.get("genstats_us"), row.get("apply_gbps"), row["legacy_us"]
            share = f" ({gbps / args.bandwidth:.0%})" if gbps and args.bandwidth else ""
            g_txt = "no engine" if g is None else f"{g:.1f}"
            ratio = "-" if g is None else f"{g / lu:.2f}"
            bw = "-" if gbps is None else f"{gbps:.0f}{share}"
            picked = [f"{row[m]} {row[m + '_us'] / lu:.2f}" for m in ("choice", "heuristic")]
            print(f"{label:9s} {str(x_shape):20s} {k:4d} {lu:10.1f} {g_txt:>12s} {ratio:>6s} {bw:>12s} "
                  f"{picked[0]:>13s} {picked[1]:>13s}", flush=True)
            rows.append(row)
    print(f"\nbackward of BN -> relu -> conv down to x:\n{'precision':9s} {'x (N,H,W,C)':20s} {'K':>4s} "
          f"{'legacy us':>10s} {'fused us':>10s} {'ratio':>6s} {'choice':>13s} {'heuristic':>13s}")
    for label in args.precisions:
        dtype, tf32 = PRECISIONS[label]
        for x_shape, k in SHAPES:
            c = x_shape[3]
            if c != k:
                continue
            x = kernels.cast(cuda.to_device(rng.uniform(-1, 1, x_shape).astype(np.float32)), dtype)
            w = kernels.cast(cuda.to_device(rng.uniform(-.1, .1, (k, 3, 3, c)).astype(np.float32)), dtype)
            dy = kernels.cast(cuda.to_device(rng.uniform(-1, 1, x_shape[:3] + (k,)).astype(np.float32)), dtype)
            gamma, beta = (cuda.to_device(rng.uniform(lo, hi, c).astype(np.float32))
                           for lo, hi in ((.5, 1.5), (-.5, .5)))
            row = {"precision": label, "direction": "backward", "x": x_shape, "filters": k}
            with kernels.config.override(allow_tf32=tf32):
                y, saved = kernels.batchnorm_forward_training(x, gamma, beta, cuda.to_device(np.zeros(c, np.float32)),
                                                          cuda.to_device(np.ones(c, np.float32)), activation="relu",
                                                          layout="NHWC")

                def legacy_bwd():
                    dconv = kernels.conv2d_backward_data(dy, w, x_shape, padding=1, layout="NHWC")
                    kernels.batchnorm_backward(dconv, x, gamma, saved, activation="relu", y=y, layout="NHWC")

                def fused_bwd():
                    kernels.batchnorm_relu_conv2d_backward(dy, w, x, y, gamma, beta, saved, padding=1, layout="NHWC")

                row["legacy_us"] = timer.per_call_ms(legacy_bwd) * 1e3
                conv_graph.clear_cache()
                conv_graph.FORCE_GRAPH = True
                try:
                    fused_bwd()
                    if any(ch.plan is not None for key, ch in conv_graph.cache_info().items()
                           if key.direction == "backward_data_drelu_dbn"):
                        row["fused_us"] = timer.per_call_ms(fused_bwd) * 1e3
                finally:
                    conv_graph.FORCE_GRAPH = False
                    conv_graph.clear_cache()
                for mode, bench in (("choice", True), ("heuristic", False)):
                    with kernels.config.override(benchmark=bench):
                        fused_bwd()
                        row[f"{mode}_us"] = timer.per_call_ms(fused_bwd) * 1e3
                    picks = [ch.path for key, ch in conv_graph.cache_info().items()
                             if key.direction == "backward_data_drelu_dbn" and key.benchmark == bench]
                    row[mode] = picks[0] if picks else "legacy"
                conv_graph.clear_cache()
            f_us, lu = row.get("fused_us"), row["legacy_us"]
            f_txt = "no engine" if f_us is None else f"{f_us:.1f}"
            ratio = "-" if f_us is None else f"{f_us / lu:.2f}"
            picked = [f"{row[m]} {row[m + '_us'] / lu:.2f}" for m in ("choice", "heuristic")]
            print(f"{label:9s} {str(x_shape):20s} {k:4d} {lu:10.1f} {f_txt:>10s} {ratio:>6s} {picked[0]:>13s} "
                  f"{picked[1]:>13s}", flush=True)
            rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
