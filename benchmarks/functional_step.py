"""Train step of a functional residual CNN: dnnbind (step replayed as a CUDA graph) vs torch's whole
step captured in a ``torch.cuda.CUDAGraph``.

The network (the same in both): a 3x3 conv to 32 channels + BN + ReLU, then two residual blocks
``x + BN(conv(ReLU(BN(conv(x)))))`` followed by ReLU, global average pooling and a 10-way dense
layer; input 32x32x3, batch 256, Adam, sparse cross-entropy. dnnbind builds it with the Keras
functional API (``Input``, ``layers.Add``); torch runs channels_last with capturable Adam (and
``torch.autocast`` for bf16). Both are timed with CUDA events around each of ``--steps`` steps
after ``--warmup`` steps (defaults 50 and 10) on a device-resident batch; the table gives medians of
``--rounds`` (default 3) alternating rounds and their ratio (torch ms / dnnbind ms: > 1 means dnnbind
is faster).

    python benchmarks/functional_step.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from train_step import capture_torch_step, time_torch_steps  # noqa: E402  (a script beside this one)

BATCH, SHAPE, WIDTH, CLASSES = 256, (32, 32, 3), 32, 10


def build_dnnbind():
    import dnnbind as keras
    from dnnbind import layers

    inputs = keras.Input(SHAPE)
    x = layers.Conv2D(WIDTH, 3, padding="same", use_bias=False)(inputs)
    x = layers.Activation("relu")(layers.BatchNormalization()(x))
    for _ in range(2):
        y = layers.Conv2D(WIDTH, 3, padding="same", use_bias=False)(x)
        y = layers.Activation("relu")(layers.BatchNormalization()(y))
        y = layers.BatchNormalization()(layers.Conv2D(WIDTH, 3, padding="same", use_bias=False)(y))
        x = layers.Activation("relu")(layers.Add()([x, y]))
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(CLASSES, activation="softmax")(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    return model


def build_torch(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(WIDTH, WIDTH, 3, padding=1, bias=False)
            self.b1 = nn.BatchNorm2d(WIDTH, eps=1e-3, momentum=0.01)
            self.c2 = nn.Conv2d(WIDTH, WIDTH, 3, padding=1, bias=False)
            self.b2 = nn.BatchNorm2d(WIDTH, eps=1e-3, momentum=0.01)

        def forward(self, x):
            return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))

    return nn.Sequential(nn.Conv2d(3, WIDTH, 3, padding=1, bias=False), nn.BatchNorm2d(WIDTH, eps=1e-3, momentum=0.01),
                         nn.ReLU(), Block(), Block(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(WIDTH, CLASSES))


def batch():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((BATCH, *SHAPE)).astype(np.float32),
            rng.integers(0, CLASSES, BATCH).astype(np.int32))


def time_dnnbind(precision: str, steps: int, warmup: int) -> float:
    import dnnbind
    from dnnbind import backend, cuda

    dnnbind.mixed_precision.set_global_policy(precision)
    try:
        model = build_dnnbind()
        x, y = batch()
        device = backend.default_device()
        xd, yd = backend.asarray(x, device), backend.asarray(y, device)
        stream = cuda.current_stream()
        for _ in range(warmup):
            model.train_on_batch(xd, yd, return_dict=True)
        stream.synchronize()
        assert model._step_graphs.stats["replays"] > 0, model._step_graphs.stats
        events = [cuda.Event() for _ in range(steps + 1)]
        events[0].record(stream)
        for i in range(steps):
            model.train_on_batch(xd, yd, return_dict=True)
            events[i + 1].record(stream)
        events[-1].synchronize()
        return statistics.median(events[i].elapsed_time(events[i + 1]) for i in range(steps))
    finally:
        dnnbind.mixed_precision.set_global_policy("float32")


def time_torch(precision: str, steps: int, warmup: int) -> float:
    import torch

    torch.backends.cudnn.benchmark = True
    model = build_torch(torch).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7, capturable=True)
    x, y = batch()
    xd = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last).cuda()
    yd = torch.from_numpy(y).long().cuda()
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "mixed_bfloat16")

    def step():
        opt.zero_grad(set_to_none=False)
        with autocast:
            loss = torch.nn.functional.cross_entropy(model(xd), yd)
        loss.backward()
        opt.step()

    return time_torch_steps(torch, capture_torch_step(torch, step).replay, steps, warmup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("| precision | dnnbind graph ms | torch CUDA-graph ms | torch / dnnbind |")
    print("|---|---|---|---|")
    for precision in ("float32", "mixed_bfloat16"):
        ours, theirs = [], []
        for _ in range(args.rounds):  # alternate, so drift hits both alike
            ours.append(time_dnnbind(precision, args.steps, args.warmup))
            theirs.append(time_torch(precision, args.steps, args.warmup))
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"| {precision} | {a:.3f} | {b:.3f} | {b / a:.2f}x |")


if __name__ == "__main__":
    main()
