"""Time one training step (forward + backward + Adam) of a transformer encoder block: dnnbind's functional
Keras model against PyTorch's ``nn.TransformerEncoderLayer`` eager and with its whole step in a CUDA graph.

The block (issue 23's target): d_model 512, 8 heads (key_dim 64), feed-forward 2048 with ReLU, post-norm
(``x = LN(x + MHA(x, x)); x = LN(x + FFN(x))``, epsilon 1e-5), no dropout, sequence 512, batch 32, mean
squared error against a random target, Adam (lr 1e-4). Precisions: ``mixed_bfloat16`` (torch.autocast
bfloat16) and ``float32`` (TF32 allowed in both).

Contenders, timed in each of ``--rounds`` alternating rounds (medians over rounds):

* dnnbind graph: ``model.train_on_batch`` with ``jit_compile="auto"`` (the step replayed as one CUDA graph);
  its attention is cuDNN's fused flash attention (``ops.dot_product_attention``'s fused path) in bfloat16;
* dnnbind graph, composed attention: the same with ``keras.config.disable_flash_attention()`` (cuBLAS
  batched products + the softmax kernel), to show what the fused kernel buys;
* torch eager, and torch graph (the whole step in one ``torch.cuda.CUDAGraph``, ``Adam(capturable=True)``).

Method as ``train_step.py``: one batch uploaded before timing, ``--warmup`` steps, then ``--steps`` steps
each between CUDA events; peak device memory from the pool's high-water mark / ``max_memory_allocated``.

    python benchmarks/transformer_step.py --json transformer.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

from train_step import _reset_pool_high_water_mark, capture_torch_step, time_torch_steps

D_MODEL, HEADS, FF, SEQ, BATCH = 512, 8, 2048, 512, 32


def make_batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((BATCH, SEQ, D_MODEL)).astype(np.float32)
    y = rng.standard_normal((BATCH, SEQ, D_MODEL)).astype(np.float32)
    return x, y


def build_dnnbind():
    import dnnbind
    from dnnbind import layers

    inp = dnnbind.Input((SEQ, D_MODEL))
    a = layers.MultiHeadAttention(HEADS, D_MODEL // HEADS)(inp, inp)
    x = layers.LayerNormalization(epsilon=1e-5)(layers.Add()([inp, a]))
    f = layers.Dense(FF, activation="relu")(x)
    f = layers.Dense(D_MODEL)(f)
    out = layers.LayerNormalization(epsilon=1e-5)(layers.Add()([x, f]))
    model = dnnbind.Model(inp, out, name="encoder_block")
    model.compile(optimizer=dnnbind.optimizers.Adam(learning_rate=1e-4), loss="mse")
    return model


def time_dnnbind(precision: str, steps: int, warmup: int, flash: bool) -> dict:
    import dnnbind
    from dnnbind import backend, cuda

    dnnbind.mixed_precision.set_global_policy(precision)
    if not flash:
        dnnbind.config.disable_flash_attention()
    try:
        model = build_dnnbind()
        device = backend.default_device()
        x, y = make_batch()
        xd, yd = backend.asarray(x, device), backend.asarray(y, device)
        stream = cuda.current_stream()
        stream.synchronize()
        peak_reset = _reset_pool_high_water_mark()
        for _ in range(warmup):
            model.train_on_batch(xd, yd, return_dict=True)
        stream.synchronize()
        events = [cuda.Event() for _ in range(steps + 1)]
        events[0].record(stream)
        for i in range(steps):
            model.train_on_batch(xd, yd, return_dict=True)
            events[i + 1].record(stream)
        events[-1].synchronize()
        ms = statistics.median(events[i].elapsed_time(events[i + 1]) for i in range(steps))
        loss = float(np.asarray(model.train_on_batch(xd, yd, return_dict=True)["loss"]))
        return {"ms_per_step": ms, "peak_bytes": cuda.pool_stats().get("used_high"), "peak_reset": peak_reset,
                "loss": loss}
    finally:
        dnnbind.mixed_precision.set_global_policy("float32")
        dnnbind.config.enable_flash_attention()


class TorchBlock:
    def __init__(self, torch, precision: str, **adam) -> None:
        self.torch = torch
        self.model = torch.nn.TransformerEncoderLayer(D_MODEL, HEADS, FF, dropout=0.0, activation="relu",
                                                      layer_norm_eps=1e-5, batch_first=True).cuda()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4, eps=1e-7, **adam)
        x, y = make_batch()
        self.x, self.y = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
        self.bf16 = precision == "mixed_bfloat16"

    def step(self) -> None:
        self.optimizer.zero_grad(set_to_none=False)
        with self.torch.autocast("cuda", dtype=self.torch.bfloat16, enabled=self.bf16):
            loss = self.torch.nn.functional.mse_loss(self.model(self.x).float(), self.y)
        loss.backward()
        self.optimizer.step()


def time_torch(torch, precision: str, steps: int, warmup: int, graph: bool) -> dict:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t = TorchBlock(torch, precision, capturable=graph)
    if graph:
        g = capture_torch_step(torch, t.step)
        ms = time_torch_steps(torch, g.replay, steps, warmup)
    else:
        ms = time_torch_steps(torch, t.step, steps, warmup)
    return {"ms_per_step": ms, "peak_bytes": torch.cuda.max_memory_allocated()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precisions", nargs="+", default=["mixed_bfloat16", "float32"],
                        choices=["float32", "mixed_bfloat16"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from dnnbind import cuda

    if not cuda.is_available():
        print(f"benchmarks/transformer_step.py needs a GPU: {cuda.unavailable_reason()}", file=sys.stderr)
        return 2
    import dnnbind

    dnnbind.set_default_device("cuda")
    torch = None
    if not args.no_torch:
        try:
            import torch  # noqa: F811 - optional
            torch.backends.cuda.matmul.allow_tf32 = True
        except ImportError:
            torch = None
    results = []
    for precision in args.precisions:
        rounds: dict = {}
        for _ in range(args.rounds):
            runs = {"dnnbind graph": lambda: time_dnnbind(precision, args.steps, args.warmup, True),
                    "dnnbind graph, composed attention": lambda: time_dnnbind(precision, args.steps, args.warmup,
                                                                              False)}
            if torch is not None:
                runs["torch eager"] = lambda: time_torch(torch, precision, args.steps, args.warmup, False)
                runs["torch graph"] = lambda: time_torch(torch, precision, args.steps, args.warmup, True)
            for name, fn in runs.items():
                try:
                    rounds.setdefault(name, []).append(fn())
                except Exception as err:  # a contender's failure is reported, the others still run
                    rounds.setdefault(name, []).append({"error": f"{type(err).__name__}: {err}"[:300]})
        row = {"precision": precision}
        for name, rs in rounds.items():
            ok = [r for r in rs if "error" not in r]
            row[name] = ({"ms_per_step": statistics.median(r["ms_per_step"] for r in ok),
                          "peak_MiB": (ok[0].get("peak_bytes") or 0) / 2**20} if ok else rs[0])
        tg = row.get("torch graph", {}).get("ms_per_step")
        for name in rounds:
            ms = row[name].get("ms_per_step")
            if ms is not None and tg:
                row[name]["speedup_vs_torch_graph"] = tg / ms
            print(f"{precision:15s} {name:36s} " + (f"{ms:8.3f} ms  peak {row[name]['peak_MiB']:.0f} MiB" +
                  (f"  x{row[name]['speedup_vs_torch_graph']:.2f} vs torch graph" if tg else "")
                  if ms is not None else row[name]["error"]), flush=True)
        results.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
