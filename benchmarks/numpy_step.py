"""Time one mnist_cnn training step on the NumPy backend, against the same step in torch-CPU.

The model is Keras's mnist_convnet example, channels_last, batch 128::

    Conv2D(32, 3, relu) -> MaxPool2 -> Conv2D(64, 3, relu) -> MaxPool2 -> Flatten
    -> Dropout(0.5) -> Dense(10) -> softmax cross-entropy, Adam

written directly with ``dnnbind.ops`` (forward, backward and the Adam update).
torch runs the same step when it is importable, with as many threads as there
are cores. Prints the median milliseconds per step after a warm-up and the ratio.

    python benchmarks/numpy_step.py [--steps 20] [--batch 128]
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
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    x = rng.random((args.batch, 28, 28, 1), dtype=np.float32)
    labels = rng.integers(0, 10, args.batch).astype(np.int64)
    params = make_params(rng)

    contenders = {"numpy": NumpyStep({k: v.copy() for k, v in params.items()})}
    try:
        contenders["torch"] = torch_step_fn(params)
    except ImportError:
        pass
    ms = time_steps(contenders, x, labels, args.steps)
    print(f"dnnbind NumPy backend: {ms['numpy']:8.2f} ms/step (median of {args.steps}, batch {args.batch})")
    if "torch" not in ms:
        print("torch is not importable: no torch-CPU comparison")
        return
    import torch

    print(f"torch {torch.__version__} CPU ({torch.get_num_threads()} threads): {ms['torch']:8.2f} ms/step")
    print(f"ratio NumPy / torch: {ms['numpy'] / ms['torch']:.2f}x (goal <= 1.5x)")


if __name__ == "__main__":
    main()
