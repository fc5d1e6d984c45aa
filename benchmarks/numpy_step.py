"""Time one mnist_cnn training step on the NumPy backend, against the same step in torch-CPU.

The model is Keras's mnist_convnet example, channels_last, batch 128::

    Conv2D(32, 3, relu) -> MaxPool2 -> Conv2D(64, 3, relu) -> MaxPool2 -> Flatten
    -> Dropout(0.5) -> Dense(10) -> softmax cross-entropy, Adam

timed twice on the NumPy backend: ``ops`` is the step written directly with
``dnnbind.kernels`` (forward, backward and the Adam update); ``sequential`` is what a
user runs, ``dnnbind.Sequential`` (the Keras example's layers, softmax output,
sparse categorical cross-entropy, Adam) and ``train_on_batch`` after
``dnnbind.set_default_device("cpu")``. torch runs the same step when it is
importable, with as many threads as there are cores.

Each contender runs in its own worker process (a process holding torch changes
glibc's allocator thresholds, and with them the NumPy backend's speed, so one shared
process would not measure what a user gets), and the workers run alternating blocks
of steps, with a pause between blocks for the previous one's spinning BLAS/OpenMP
threads to park, so that a busy neighbour on a shared machine slows all of them
rather than whichever ran during the busy spell. Prints the median milliseconds per
step, the ratios to torch, and each worker's BLAS/OpenMP thread pools (through
``threadpoolctl`` when it is installed).

    python benchmarks/numpy_step.py [--steps 30] [--blocks 3] [--batch 128] [--only ops,sequential,torch]

Contenders: ``ops``, ``sequential``, ``torch`` (with the same glibc malloc thresholds as
dnnbind sets for itself: the ratios are against this one) and ``torch_default_malloc``
(glibc's defaults, as a plain torch script runs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from dnnbind import kernels


def make_params(rng: np.random.Generator) -> dict[str, np.ndarray]:
    def glorot(shape, fan_in, fan_out):
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-limit, limit, shape).astype(np.float32)

    return {
        "w1": glorot((32, 3, 3, 1), 9, 9 * 32),          # (K, R, S, C): NHWC filter layout
        "b1": np.zeros(32, np.float32),
        "w2": glorot((64, 3, 3, 32), 9 * 32, 9 * 64),
        "b2": np.zeros(64, np.float32),
        "w3": glorot((1600, 10), 1600, 10),               # Dense (in, out)
        "b3": np.zeros(10, np.float32),
    }


class NumpyStep:
    def __init__(self, params: dict[str, np.ndarray], seed: int = 0) -> None:
        self.p = params
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.dropout = kernels.DropoutState(0.5, seed=seed)
        self.step = 0

    def __call__(self, x: np.ndarray, labels: np.ndarray) -> float:
        p, L = self.p, "NHWC"
        a1 = kernels.conv2d_bias_activation_forward(x, p["w1"], p["b1"], activation="relu", layout=L)
        h1 = kernels.pool2d_forward(a1, mode="max", window=2, layout=L)
        a2 = kernels.conv2d_bias_activation_forward(h1, p["w2"], p["b2"], activation="relu", layout=L)
        h2 = kernels.pool2d_forward(a2, mode="max", window=2, layout=L)
        flat = h2.reshape(h2.shape[0], -1)
        d, reserve = kernels.dropout_forward(flat, self.dropout)
        logits = kernels.dense_forward(d, p["w3"], p["b3"])
        loss, dlogits = kernels.softmax_cross_entropy(logits, labels)

        g = {}
        g["w3"] = kernels.dense_backward_weight(d, dlogits)
        g["b3"] = kernels.bias_backward(dlogits)
        dd = kernels.dense_backward_input(dlogits, p["w3"])
        dflat = kernels.dropout_backward(dd, reserve, self.dropout)
        dh2 = dflat.reshape(h2.shape)
        da2 = kernels.pool2d_backward(dh2, a2, h2, mode="max", window=2, layout=L)
        # relu's derivative reads x > 0, which equals y > 0: the fused forward kept only y
        dz2 = kernels.activation_backward(da2, a2, a2, "relu")
        g["b2"] = kernels.bias_backward(dz2, layout=L)
        g["w2"] = kernels.conv2d_backward_filter(h1, dz2, p["w2"].shape, layout=L)
        dh1 = kernels.conv2d_backward_data(dz2, p["w2"], h1.shape, layout=L)
        da1 = kernels.pool2d_backward(dh1, a1, h1, mode="max", window=2, layout=L)
        dz1 = kernels.activation_backward(da1, a1, a1, "relu")
        g["b1"] = kernels.bias_backward(dz1, layout=L)
        g["w1"] = kernels.conv2d_backward_filter(x, dz1, p["w1"].shape, layout=L)

        self.step += 1
        names = list(p)
        kernels.adam_update([p[k] for k in names], [g[k] for k in names], [self.m[k] for k in names],
                        [self.v[k] for k in names], lr=1e-3, step=self.step)
        return float(loss)


def sequential_step_fn(params: dict[str, np.ndarray]):
    """``train_on_batch`` of the Keras mnist_convnet on the NumPy backend, from the same weights."""
    import dnnbind
    from dnnbind import layers

    dnnbind.set_default_device("cpu")
    model = dnnbind.Sequential([
        dnnbind.Input(shape=(28, 28, 1)),
        layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer=dnnbind.optimizers.Adam(learning_rate=1e-3), loss="sparse_categorical_crossentropy")
    # Keras layouts: conv kernels (R, S, C, K), dense (in, out).
    model.set_weights([params["w1"].transpose(1, 2, 3, 0), params["b1"], params["w2"].transpose(1, 2, 3, 0),
                       params["b2"], params["w3"], params["b3"]])

    def step(x: np.ndarray, labels: np.ndarray) -> float:
        return model.train_on_batch(x, labels)

    return step


def thread_pools() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed: thread pools unknown"
    return "; ".join(f"{i['internal_api']} {i.get('version') or ''} {i['num_threads']} threads".replace("  ", " ")
                     for i in threadpool_info())


def torch_step_fn(params: dict[str, np.ndarray]):
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Dropout(0.5), torch.nn.Linear(1600, 10),
    )
    with torch.no_grad():  # same initial weights as the NumPy model
        model[0].weight.copy_(torch.from_numpy(params["w1"].transpose(0, 3, 1, 2).copy()))
        model[3].weight.copy_(torch.from_numpy(params["w2"].transpose(0, 3, 1, 2).copy()))
        model[8].weight.copy_(torch.from_numpy(params["w3"].T.copy()))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x: np.ndarray, labels: np.ndarray) -> float:
        xt = torch.from_numpy(x.transpose(0, 3, 1, 2))  # NCHW view, as torch expects
        yt = torch.from_numpy(labels)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(xt), yt)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def make_inputs(batch: int) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    x = rng.random((batch, 28, 28, 1), dtype=np.float32)
    labels = rng.integers(0, 10, batch).astype(np.int64)
    return x, labels, make_params(rng)


MAKERS = {
    "ops": lambda params: NumpyStep({k: v.copy() for k, v in params.items()}),
    "sequential": sequential_step_fn,
    "torch": torch_step_fn,
    "torch_default_malloc": torch_step_fn,
}

# The glibc thresholds dnnbind's NumPy backend sets for itself (dnnbind.kernels._host_memory), given
# to the "torch" worker through the environment so that both frameworks reuse freed memory;
# "torch_default_malloc" runs with glibc's defaults, as a plain torch script does (on the
# 2-core machine of issue 3 that is ~1.5x slower: every step page-faults its buffers anew).
TORCH_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def describe(name: str) -> str:
    if name == "ops":
        return "dnnbind NumPy, ops-level step"
    if name == "sequential":
        return "dnnbind NumPy, Sequential.train_on_batch"
    import torch

    label = f"torch {torch.__version__} CPU ({torch.get_num_threads()} threads)"
    return label + (", glibc malloc defaults" if name == "torch_default_malloc" else "")


def run_block(step, x, labels, warmup: int, steps: int) -> list[float]:
    for _ in range(warmup):
        step(x, labels)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step(x, labels)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def worker(name: str, batch: int) -> None:
    """Build one contender, then run a block per ``"<warmup> <steps>"`` line on stdin (JSON replies)."""
    x, labels, params = make_inputs(batch)
    try:
        step = MAKERS[name](params)
    except ImportError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return
    print(json.dumps({"label": describe(name), "threads": thread_pools()}), flush=True)
    for line in sys.stdin:
        warmup, steps = (int(v) for v in line.split())
        print(json.dumps(run_block(step, x, labels, warmup, steps)), flush=True)


def time_isolated(names: list[str], batch: int, steps: int, blocks: int, warmup: int = 3,
                  pause_s: float = 0.3) -> tuple[dict, dict]:
    """ms of every timed step of each contender, each in its own worker process, blocks alternating."""
    procs, info = {}, {}
    try:
        for name in names:
            env = dict(os.environ)
            env.update(TORCH_MALLOC_ENV if name == "torch" else {})
            procs[name] = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", name, "--batch", str(batch)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        for name in list(procs):
            reply = json.loads(procs[name].stdout.readline() or '{"error": "the worker died"}')
            if "error" in reply:
                print(f"{name}: not run ({reply['error']})")
                procs.pop(name).stdin.close()
            else:
                info[name] = reply
        times: dict = {name: [] for name in procs}
        per_block = max(1, steps // blocks)
        for _ in range(blocks):
            for name, proc in procs.items():
                time.sleep(pause_s)
                proc.stdin.write(f"{warmup} {per_block}\n")
                proc.stdin.flush()
                times[name] += json.loads(proc.stdout.readline())
    finally:
        for proc in procs.values():
            proc.stdin.close()
            proc.wait()
    return times, info


def time_in_process(names: list[str], batch: int, steps: int, blocks: int, warmup: int = 3) -> tuple[dict, dict]:
    """As :func:`time_isolated`, all contenders in this process (for profiling)."""
    x, labels, params = make_inputs(batch)
    contenders, info = {}, {}
    for name in names:
        try:
            contenders[name] = MAKERS[name](params)
            info[name] = {"label": describe(name), "threads": ""}
        except ImportError as exc:
            print(f"{name}: not run ({exc})")
    times: dict = {name: [] for name in contenders}
    for _ in range(blocks):
        for name, step in contenders.items():
            times[name] += run_block(step, x, labels, warmup, max(1, steps // blocks))
    for name in info:
        info[name]["threads"] = thread_pools()
    return times, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per contender")
    parser.add_argument("--blocks", type=int, default=3, help="alternating blocks the steps are split into")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--only", default=",".join(MAKERS), help="comma-separated contenders")
    parser.add_argument("--in-process", action="store_true", help="run every contender in this process")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.batch)
        return
    names = [name for name in MAKERS if name in set(args.only.split(","))]
    timer = time_in_process if args.in_process else time_isolated
    times, info = timer(names, args.batch, args.steps, args.blocks)
    print(f"{os.cpu_count()} cores; thread pools per contender:")
    for name in times:
        print(f"  {name}: {info[name]['threads']}")
    med = {name: statistics.median(t) for name, t in times.items()}
    low = {name: min(t) for name, t in times.items()}
    print(f"{'ms/step':58s} {'median':>8s} {'min':>8s}  ratio of medians (of minima)")
    for name in times:
        ratio = ""
        if "torch" in times and name != "torch":
            ratio = f"  {med[name] / med['torch']:.2f}x torch ({low[name] / low['torch']:.2f}x)"
        print(f"{info[name]['label']:58s} {med[name]:8.2f} {low[name]:8.2f}{ratio}")
    print(f"({args.steps} steps each in {args.blocks} alternating blocks, batch {args.batch}; goal <= 1.5x torch)")


if __name__ == "__main__":
    main()
