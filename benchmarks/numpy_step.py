"""Time one mnist_cnn training step on the NumPy backend, against the same step in torch-CPU.

The model is Keras's mnist_convnet example, channels_last, batch 128::

    Conv2D(32, 3, relu) -> MaxPool2 -> Conv2D(64, 3, relu) -> MaxPool2 -> Flatten
    -> Dropout(0.5) -> Dense(10) -> softmax cross-entropy, Adam

timed twice on the NumPy backend: ``ops`` is the step written directly with
``dnnbind.ops`` (forward, backward and the Adam update); ``sequential`` is what a
user runs, ``dnnbind.Sequential`` (the Keras example's layers, softmax output,
sparse categorical cross-entropy, Adam) and ``train_on_batch`` after
``dnnbind.set_default_device("cpu")``. torch runs the same step when it is
importable, with as many threads as there are cores. The contenders run in
alternating blocks so that a busy neighbour slows all of them; prints the median
milliseconds per step and the ratios, plus the BLAS/OpenMP thread pools in use
(through ``threadpoolctl`` when it is installed).

    python benchmarks/numpy_step.py [--steps 30] [--batch 128] [--only ops,sequential,torch]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from dnnbind import ops


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
        self.dropout = ops.DropoutState(0.5, seed=seed)
        self.step = 0

    def __call__(self, x: np.ndarray, labels: np.ndarray) -> float:
        p, L = self.p, "NHWC"
        a1 = ops.conv2d_bias_activation_forward(x, p["w1"], p["b1"], activation="relu", layout=L)
        h1 = ops.pool2d_forward(a1, mode="max", window=2, layout=L)
        a2 = ops.conv2d_bias_activation_forward(h1, p["w2"], p["b2"], activation="relu", layout=L)
        h2 = ops.pool2d_forward(a2, mode="max", window=2, layout=L)
        flat = h2.reshape(h2.shape[0], -1)
        d, reserve = ops.dropout_forward(flat, self.dropout)
        logits = ops.dense_forward(d, p["w3"], p["b3"])
        loss, dlogits = ops.softmax_cross_entropy(logits, labels)

        g = {}
        g["w3"] = ops.dense_backward_weight(d, dlogits)
        g["b3"] = ops.bias_backward(dlogits)
        dd = ops.dense_backward_input(dlogits, p["w3"])
        dflat = ops.dropout_backward(dd, reserve, self.dropout)
        dh2 = dflat.reshape(h2.shape)
        da2 = ops.pool2d_backward(dh2, a2, h2, mode="max", window=2, layout=L)
        # relu's derivative reads x > 0, which equals y > 0: the fused forward kept only y
        dz2 = ops.activation_backward(da2, a2, a2, "relu")
        g["b2"] = ops.bias_backward(dz2, layout=L)
        g["w2"] = ops.conv2d_backward_filter(h1, dz2, p["w2"].shape, layout=L)
        dh1 = ops.conv2d_backward_data(dz2, p["w2"], h1.shape, layout=L)
        da1 = ops.pool2d_backward(dh1, a1, h1, mode="max", window=2, layout=L)
        dz1 = ops.activation_backward(da1, a1, a1, "relu")
        g["b1"] = ops.bias_backward(dz1, layout=L)
        g["w1"] = ops.conv2d_backward_filter(x, dz1, p["w1"].shape, layout=L)

        self.step += 1
        names = list(p)
        ops.adam_update([p[k] for k in names], [g[k] for k in names], [self.m[k] for k in names],
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


def time_steps(steps_by_name: dict, x, labels, steps: int, warmup: int = 3, blocks: int = 3) -> dict:
    """Median ms/step of each step function.

    Each runs ``steps`` steps in ``blocks`` back-to-back blocks (as in training, so torch's
    thread pool stays warm), the blocks of the contenders alternating so that a busy
    neighbour on a shared machine slows both rather than whichever ran during the busy spell.
    """
    times: dict = {name: [] for name in steps_by_name}
    per_block = max(1, steps // blocks)
    for _ in range(blocks):
        for name, step in steps_by_name.items():
            for _ in range(warmup):
                step(x, labels)
            for _ in range(per_block):
                t0 = time.perf_counter()
                step(x, labels)
                times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--only", default="ops,sequential,torch", help="comma-separated contenders")
    args = parser.parse_args()
    wanted = set(args.only.split(","))

    rng = np.random.default_rng(0)
    x = rng.random((args.batch, 28, 28, 1), dtype=np.float32)
    labels = rng.integers(0, 10, args.batch).astype(np.int64)
    params = make_params(rng)

    makers = {"ops": lambda: NumpyStep({k: v.copy() for k, v in params.items()}),
              "sequential": lambda: sequential_step_fn(params), "torch": lambda: torch_step_fn(params)}
    contenders = {}
    for name, make in makers.items():
        if name in wanted:
            try:
                contenders[name] = make()
            except ImportError as exc:
                print(f"{name}: not run ({exc})")
    ms = time_steps(contenders, x, labels, args.steps)
    print(f"thread pools: {thread_pools()} ({os.cpu_count()} cores)")
    labels_ = {"ops": "dnnbind NumPy, ops-level step", "sequential": "dnnbind NumPy, Sequential.train_on_batch"}
    if "torch" in ms:
        import torch

        labels_["torch"] = f"torch {torch.__version__} CPU ({torch.get_num_threads()} threads)"
    for name, value in ms.items():
        ratio = f"  {value / ms['torch']:.2f}x torch" if "torch" in ms and name != "torch" else ""
        print(f"{labels_[name]:45s} {value:8.2f} ms/step{ratio}")
    print(f"(median of {args.steps} steps each, batch {args.batch}; goal <= 1.5x torch)")


if __name__ == "__main__":
    main()
