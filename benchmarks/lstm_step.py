"""Time one training step (forward + backward + Adam) of a 2-layer LSTM, issue 23's target: dnnbind (its
recurrent layers on the fused cuDNN path, the step replayed as a CUDA graph) against PyTorch's ``nn.LSTM``
with the whole step captured in one ``torch.cuda.CUDAGraph`` (target: 3.02 ms on the H200).

Model: input ``(batch 64, time 128, features 128)``, ``LSTM(512, return_sequences=True)`` twice, a mean squared
error against a fixed ``(64, 128, 512)`` target, Adam (lr 1e-3). Precision ``mixed_bfloat16`` by default
(dnnbind's mixed policy: float32 weights, bfloat16 compute; torch: ``torch.autocast(bfloat16)``, under which
``nn.LSTM`` runs cuDNN in bfloat16), ``float32`` on request.

Contenders, each timed in every one of ``--rounds`` alternating rounds (medians over rounds):

* dnnbind graph: ``model.train_on_batch`` with the default ``jit_compile="auto"`` (the step replayed as a
  CUDA graph);
* dnnbind eager: ``jit_compile=False``;
* dnnbind loop: the graph step with the fused path switched off (the step loop in ``keras.ops``; only with
  ``--loop``: it is slow);
* torch eager and torch graph (as ``train_step.py``: the graph holds ``zero_grad``, forward, loss, backward
  and capturable Adam).

Method (``train_step.py``'s): the batch is uploaded before timing; after ``--warmup`` steps each of
``--steps`` steps is bracketed by CUDA events on the stream the framework computes on; a contender's number
is the median ms/step. The report also checks that the dnnbind layers took the fused path.

    python benchmarks/lstm_step.py
    python benchmarks/lstm_step.py --precisions float32 mixed_bfloat16 --steps 50 --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any, Callable

import numpy as np

BATCH, TIME, FEATURES, UNITS, LAYERS = 64, 128, 128, 512, 2


def make_batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, TIME, FEATURES)).astype(np.float32)
    y = (rng.standard_normal((BATCH, TIME, UNITS)) * 0.1).astype(np.float32)
    return x, y


def step_flops() -> int:
    """FLOPs of one step's matrix work: per layer and step, the input and recurrent projections
    ``2 * batch * (rows_in + units) * 4 * units`` forward, twice that backward."""
    total, rows_in = 0, FEATURES
    for _ in range(LAYERS):
        total += 2 * BATCH * TIME * (rows_in + UNITS) * 4 * UNITS
        rows_in = UNITS
    return 3 * total


# ---------------------------------------------------------------- dnnbind
def build_dnnbind(jit_compile: Any = "auto", fused: bool = True):
    import dnnbind
    from dnnbind import layers

    model = dnnbind.Sequential([dnnbind.Input((TIME, FEATURES))], name="lstm2")
    for _ in range(LAYERS):
        layer = layers.LSTM(UNITS, return_sequences=True)
        layer._fused_allowed = fused
        model.add(layer)
    model.compile(optimizer=dnnbind.optimizers.Adam(learning_rate=1e-3), loss="mse", jit_compile=jit_compile)
    return model


def time_dnnbind(precision: str, steps: int, warmup: int, jit_compile: Any = "auto", fused: bool = True) -> dict:
    import dnnbind
    from dnnbind import backend, cuda

    dnnbind.mixed_precision.set_global_policy(precision)
    try:
        model = build_dnnbind(jit_compile, fused)
        device = backend.default_device()
        x, y = make_batch()
        xd, yd = backend.asarray(x, device), backend.asarray(y, device)
        stream = cuda.current_stream()
        stream.synchronize()
        for _ in range(warmup):
            model.train_on_batch(xd, yd, return_dict=True)  # lazy logs: no host sync per step
        stream.synchronize()
        events = [cuda.Event() for _ in range(steps + 1)]
        events[0].record(stream)
        for i in range(steps):
            model.train_on_batch(xd, yd, return_dict=True)
            events[i + 1].record(stream)
        events[-1].synchronize()
        times = [events[i].elapsed_time(events[i + 1]) for i in range(steps)]
        routed = all(bool(layer._last_call_fused) for layer in model.layers)
        return {"ms_per_step": statistics.median(times), "fused": routed,
                "loss": float(np.asarray(model.train_on_batch(xd, yd, return_dict=True)["loss"]))}
    finally:
        dnnbind.mixed_precision.set_global_policy("float32")


# ---------------------------------------------------------------- torch
class TorchSetup:
    def __init__(self, torch, precision: str, **adam: Any) -> None:
        self.torch = torch
        self.model = torch.nn.LSTM(FEATURES, UNITS, num_layers=LAYERS, batch_first=True).cuda()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3, eps=1e-7, **adam)
        x, y = make_batch()
        self.x, self.y = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
        self.autocast = lambda: torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "mixed_bfloat16")

    def loss(self):
        with self.autocast():
            out, _ = self.model(self.x)
            return self.torch.nn.functional.mse_loss(out.float(), self.y)


def capture_torch_step(torch, step: Callable[[], None]):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def time_torch_steps(torch, step: Callable[[], None], steps: int, warmup: int) -> float:
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    events[0].record()
    for i in range(steps):
        step()
        events[i + 1].record()
    events[-1].synchronize()
    return statistics.median(events[i].elapsed_time(events[i + 1]) for i in range(steps))


def time_torch(torch, precision: str, steps: int, warmup: int, graph: bool) -> dict:
    torch.backends.cudnn.benchmark = True
    t = TorchSetup(torch, precision, capturable=graph)

    def step():
        t.optimizer.zero_grad(set_to_none=not graph)
        t.loss().backward()
        t.optimizer.step()

    if graph:
        g = capture_torch_step(torch, step)
        return {"ms_per_step": time_torch_steps(torch, g.replay, steps, warmup)}
    return {"ms_per_step": time_torch_steps(torch, step, steps, warmup)}


# ---------------------------------------------------------------- driver
def main(argv: "list[str] | None" = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--precisions", nargs="+", default=["mixed_bfloat16"], choices=["float32", "mixed_bfloat16"])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--loop", action="store_true", help="also time the step loop (the fused path off)")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    torch = None
    if not args.no_torch:
        try:
            import torch  # noqa: F811
        except ImportError:
            torch = None
    contenders: dict[str, Callable[[str], dict]] = {
        "dnnbind graph": lambda prec: time_dnnbind(prec, args.steps, args.warmup),
        "dnnbind eager": lambda prec: time_dnnbind(prec, args.steps, args.warmup, jit_compile=False),
    }
    if args.loop:
        contenders["dnnbind loop"] = lambda prec: time_dnnbind(prec, max(3, args.steps // 10), 2, fused=False)
    if torch is not None:
        contenders["torch eager"] = lambda prec: time_torch(torch, prec, args.steps, args.warmup, graph=False)
        contenders["torch graph"] = lambda prec: time_torch(torch, prec, args.steps, args.warmup, graph=True)
    results: dict = {}
    for prec in args.precisions:
        rows: dict[str, list] = {name: [] for name in contenders}
        extra: dict = {}
        for _ in range(args.rounds):
            for name, fn in contenders.items():
                try:
                    r = fn(prec)
                except Exception as exc:  # a contender that fails reads n/a with its reason
                    extra[name] = f"n/a: {type(exc).__name__}: {exc}"[:300]
                    continue
                rows[name].append(r["ms_per_step"])
                if "fused" in r:
                    extra[f"{name} fused"] = r["fused"]
        results[prec] = {name: (statistics.median(v) if v else None) for name, v in rows.items()}
        results[prec]["notes"] = extra
    flops = step_flops()
    print(f"2-layer LSTM, batch {BATCH}, time {TIME}, input {FEATURES}, hidden {UNITS}; {flops / 1e9:.1f} GFLOP/step")
    print(f"{'precision':<16}" + "".join(f"{name:>16}" for name in contenders))
    for prec, row in results.items():
        cells = "".join(f"{'-' if row[n] is None else f'{row[n]:.3f} ms':>16}" for n in contenders)
        print(f"{prec:<16}{cells}")
        for k, v in row["notes"].items():
            print(f"    {k}: {v}")
    print("torch graph target (issue 23): 3.02 ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"flops_per_step": flops, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
