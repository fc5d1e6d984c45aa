"""Graph-replayed training steps under NVIDIA compute-sanitizer (memcheck and racecheck).

A step replayed from a CUDA graph addresses memory baked in at capture; a buffer whose life
differs between capture and replay shows only there, as invalid accesses that eager steps never
make. These tests run a small CNN's train/test/predict steps (warm-up, capture, replays) in a
child process under the sanitizer and require zero reports. ``tools/sanitize.py`` runs the tools
over the whole GPU suite and the benchmark models.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

# The sanitizer's lookup, the "already under a sanitizer" flag and the kernel classification live once,
# in tools/sanitize.py (which runs these tools over the whole GPU suite).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from sanitize import ENV_FLAG as _UNDER  # noqa: E402
from sanitize import classify, report_kernels  # noqa: E402
from sanitize import find_compute_sanitizer as _sanitizer  # noqa: E402


STEPS = textwrap.dedent(r"""
    import numpy as np, dnnbind
    from dnnbind import backend, cuda, layers
    dnnbind.mixed_precision.set_global_policy(PRECISION)
    model = dnnbind.Sequential([
        dnnbind.Input((12, 12, 3)),
        layers.Conv2D(8, 3, padding="same", activation="relu"),
        layers.BatchNormalization(),
        layers.MaxPooling2D(2),
        layers.Conv2D(16, 3, use_bias=False),
        layers.Activation("gelu"),
        layers.Flatten(),
        layers.Dropout(0.25),
        layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  jit_compile=JIT)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 12, 12, 3)).astype(np.float32)
    y = rng.integers(0, 10, 64).astype(np.int32)
    device = backend.default_device()
    xd, yd = backend.asarray(x, device), backend.asarray(y, device)
    for _ in range(5):
        model.train_on_batch(xd, yd)
    for _ in range(3):
        logs = model.test_on_batch(xd, yd, return_dict=True)
        out = model.predict_on_batch(xd)
    cuda.current_stream().synchronize()
    stats = model._step_graphs.stats
    if JIT:
        assert stats["captures"] == 3 and stats["replays"] >= 3 and stats["failures"] == 0, stats
    assert np.isfinite(out).all() and np.isfinite(logs["loss"])
    print("steps ok", stats)
""")


def _run(tool: str, precision: str, jit: bool, extra: tuple = ()) -> str:
    sanitizer = _sanitizer()
    if sanitizer is None:
        pytest.skip("compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    if os.environ.get(_UNDER):
        pytest.skip(f"already running under compute-sanitizer ({os.environ[_UNDER]})")
    script = STEPS.replace("PRECISION", repr(precision)).replace("JIT", repr(jit))
    proc = subprocess.run([sanitizer, "--tool", tool, "--report-api-errors", "no", "--print-limit", "20",
                           *extra, sys.executable, "-c", script],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=540)
    assert "steps ok" in proc.stdout, proc.stdout[-4000:]
    return proc.stdout


@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
def test_graph_replayed_steps_memcheck_clean(precision):
    out = _run("memcheck", precision, jit=True)
    assert re.search(r"ERROR SUMMARY: 0 errors", out), out[-4000:]


def test_eager_steps_racecheck_clean_in_dnnbind_kernels():
    out = _run("racecheck", "float32", jit=False, extra=("--racecheck-report", "all"))
    summary = re.search(r"RACECHECK SUMMARY: (\d+) hazard", out)
    assert summary is not None, out[-4000:]
    # hazards in library kernels (C++ names, or cuBLAS/cuDNN/NCCL's C-named families) are not ours
    ours = {k: n for k, n in report_kernels(out).items() if classify(k) == "dnnbind"}
    assert not ours, ours
