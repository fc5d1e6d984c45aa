"""Model data-parallel scaling of airbench94 (bf16, step graph, batch 1024 per GPU) from one GPU.

The 2-, 4- and 8-GPU runs need kinds of the device tool that are lent only at times. Until they
are, this script measures on one GPU what the scaling depends on, and models the rest:

* the 1-GPU step time (``train_step.time_dnnbind``, CUDA events after warm-up, median);
* the gradient buckets ``fit`` under ``DataParallel`` would all-reduce (``plan_buckets``: 25 MiB
  cap, reverse parameter order, one dtype per bucket) and their bytes;
* a device-to-device copy of each bucket on a second stream (``cudaMemcpyAsync``): the fastest any
  link could move that data, an upper bound for NCCL's bus bandwidth;
* the time of a one-rank NCCL all-reduce of the buckets, captured in a CUDA graph as inside the
  step (the per-call floor: NCCL's own kernels, no traffic), when libnccl is installed.

The model is NCCL's ring all-reduce: each of ``n`` ranks sends and receives ``2 (n - 1) / n`` of
the bucket's bytes, so ``t = calls * floor + 2 (n - 1) / n * bytes / busbw``. ``busbw`` is not
measurable on one GPU: the table shows the measured copy bandwidth (optimistic) and the values
given with ``--busbw`` (GB/s; the defaults bracket what nccl-tests report for H100/H200 NVLink at
multi-MiB messages). Efficiency is given without overlap (the all-reduce after backward) and with
perfect overlap (only the last bucket after backward is exposed), for each GPU count of ``--gpus``
(default 2 4 8); ``--steps`` (default 50) steps time the one-GPU step::

    python benchmarks/allreduce_model.py
    python benchmarks/allreduce_model.py --busbw 100 200 360 --json model.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import train_step  # noqa: E402  (the benchmark models live beside this script)


def _copy_ms(nbytes: int, reps: int = 50) -> float:
    from dnnbind import cuda

    src, dst = cuda.empty((nbytes,), np.uint8), cuda.empty((nbytes,), np.uint8)
    side = cuda.Stream()
    side.wait_stream(cuda.current_stream())
    times = []
    for _ in range(reps + 5):
        start, end = cuda.Event(), cuda.Event()
        start.record(side)
        dst.copy_from(src, stream=side)
        end.record(side)
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[5:])


def _nccl_floor_ms(buckets: list[list], reps: int = 30) -> "float | None":
    """One-rank NCCL all-reduce of every bucket (grouped per bucket), or None without libnccl."""
    from dnnbind import cuda
    from dnnbind import distribution as dd
    from dnnbind.distribution.launch import free_port

    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1"),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port()))):
        os.environ[name] = value
    try:
        dist = dd.DataParallel(timeout=60)
        comm = dist.communicator
    except Exception as exc:  # no libnccl: the model then uses a zero floor and says so
        print(f"no NCCL floor measured: {exc}", file=sys.stderr)
        return None
    try:
        # captured in a CUDA graph, as inside the step: the replay times the GPU side only, without
        # Python's time to issue the NCCL calls
        stream = cuda.Stream()
        stream.wait_stream(cuda.current_stream())  # the buckets were allocated on the current stream
        for bucket in buckets:  # one eager round first (NCCL sets up its buffers outside a capture)
            comm.all_reduce(bucket, "avg", stream=stream)
        stream.synchronize()
        with cuda.capture(stream) as graph:
            for bucket in buckets:
                comm.all_reduce(bucket, "avg", stream=stream)
        times = []
        for _ in range(reps + 5):
            start, end = cuda.Event(), cuda.Event()
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end))
        graph.close()
        return statistics.median(times[5:])
    finally:
        dist.close()


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busbw", type=float, nargs="+", default=[100.0, 360.0],
                        help="NCCL bus bandwidths to model, GB/s")
    parser.add_argument("--gpus", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from dnnbind import cuda, mixed_precision
    from dnnbind.distribution.planning import plan_buckets

    if cuda.device_count() == 0:
        print("needs a GPU")
        return 1
    step = train_step.time_dnnbind("airbench94", "mixed_bfloat16", args.steps, 10)["ms_per_step"]
    mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = train_step.build_dnnbind("airbench94")
        weights = list(model.trainable_weights)
    finally:
        mixed_precision.set_global_policy("float32")
    # gradients have their variable's dtype (the float32 master weights under mixed_bfloat16)
    sizes = [int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize for w in weights]
    dtypes = [np.dtype(w.dtype).name for w in weights]
    plan = plan_buckets(sizes, dtypes)
    bucket_bytes = [sum(sizes[i] for i in b) for b in plan]
    total = sum(bucket_bytes)
    arrays = [[cuda.empty(tuple(weights[i].shape), weights[i].dtype) for i in b] for b in plan]
    copy_ms = _copy_ms(total)
    copy_gbs = total / (copy_ms * 1e-3) / 1e9
    floor = _nccl_floor_ms(arrays)
    rows = []
    print(f"airbench94 bf16 b1024, 1 GPU step {step:.3f} ms; gradients {total / 2**20:.2f} MiB in "
          f"{len(plan)} bucket(s) {[round(b / 2**20, 2) for b in bucket_bytes]} MiB; device copy "
          f"{copy_gbs:.0f} GB/s; one-rank NCCL all-reduce of all buckets "
          f"{'n/a' if floor is None else f'{floor * 1e3:.1f} us'}")
    print(f"| GPUs | busbw GB/s | all-reduce ms | efficiency, no overlap | efficiency, overlapped | "
          f"images/s | speedup vs 1 GPU |")
    print("|---|---|---|---|---|---|---|")
    floor_ms = floor or 0.0
    for n in args.gpus:
        for label, busbw in [("copy " + f"{copy_gbs:.0f}", copy_gbs)] + [(f"{b:g}", b) for b in args.busbw]:
            traffic = 2 * (n - 1) / n
            t_ar = floor_ms + traffic * total / (busbw * 1e9) * 1e3
            t_last = floor_ms / len(plan) + traffic * bucket_bytes[-1] / (busbw * 1e9) * 1e3
            eff_serial = step / (step + t_ar)
            eff_overlap = step / (step + t_last)
            ips = n * 1024 / ((step + t_last) * 1e-3)
            rows.append({"gpus": n, "busbw_gbs": busbw, "allreduce_ms": t_ar, "efficiency_serial": eff_serial,
                         "efficiency_overlap": eff_overlap, "images_per_s": ips,
                         "speedup": ips / (1024 / (step * 1e-3))})
            print(f"| {n} | {label} | {t_ar:.4f} | {eff_serial:.1%} | {eff_overlap:.1%} | {ips:,.0f} | "
                  f"{rows[-1]['speedup']:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"step_ms": step, "gradient_bytes": total, "buckets": bucket_bytes, "copy_gbs": copy_gbs,
                       "nccl_floor_ms": floor, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
