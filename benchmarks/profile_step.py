"""Where does a dnnbind training step spend its time? Kernel table + host time.

torch's profiler records every CUDA kernel of the process through CUPTI, dnnbind's own cuDNN,
cuBLAS and NVRTC kernels included, so it serves as a kernel-level profiler here (torch is
only the measuring instrument). Also reports the host time of one step (Python + launches),
measured with the GPU kept busy so that the number is the host's, not the GPU's.

    python benchmarks/profile_step.py --model vgg_cifar --precision float32
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from train_step import MODELS, build_dnnbind, make_batch  # noqa: E402


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="vgg_cifar")
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--cprofile", action="store_true", help="also profile the host side with cProfile")
    parser.add_argument("--jit-compile", default="auto", choices=["auto", "false"])
    parser.add_argument("--heuristic", action="store_true", help="cuDNN algorithms by heuristics, not measured")
    args = parser.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    import dnnbind
    from dnnbind import backend, cuda

    dnnbind.mixed_precision.set_global_policy(args.precision)
    dnnbind.kernels.config.benchmark = not args.heuristic
    model = build_dnnbind(args.model, "auto" if args.jit_compile == "auto" else False)
    x, y = make_batch(args.model, MODELS[args.model]["batch"])
    xd, yd = backend.asarray(x, "cuda"), backend.asarray(y, "cuda")
    stream = cuda.current_stream()
    for _ in range(5):
        model.train_on_batch(xd, yd, return_dict=True)
    stream.synchronize()

    t0 = time.perf_counter()
    for _ in range(args.steps):
        model.train_on_batch(xd, yd, return_dict=True)
    host_ms = (time.perf_counter() - t0) * 1e3 / args.steps
    start, end = cuda.Event(), cuda.Event()
    stream.synchronize()
    start.record(stream)
    for _ in range(args.steps):
        model.train_on_batch(xd, yd, return_dict=True)
    end.record(stream)
    end.synchronize()
    gpu_ms = start.elapsed_time(end) / args.steps
    print(f"{args.model} {args.precision}: host {host_ms:.2f} ms/step (enqueue), wall {gpu_ms:.2f} ms/step")

    if args.cprofile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.steps):
            model.train_on_batch(xd, yd, return_dict=True)
        profiler.disable()
        stream.synchronize()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.rows)

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            model.train_on_batch(xd, yd, return_dict=True)
        stream.synchronize()
    torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=70))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
