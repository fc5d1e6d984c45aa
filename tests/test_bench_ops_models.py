"""benchmarks/ops_models.py on the NumPy backend: the smoke run prints both ratios and stores rows whose
four contenders started from one loss; the ops-written models compute what their layer twins and a
hand-written NumPy forward compute; the loss check that guards the timing can fail."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import mixed_precision

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "ops_models.py"
sys.path.insert(0, str(SCRIPT.parent))
import ops_models  # noqa: E402

RATIO = r"(\d+\.\d\d)x"


@pytest.fixture(autouse=True)
def _cpu():
    keras.set_default_device("cpu")
    yield
    keras.set_default_device(None)
    mixed_precision.set_global_policy("float32")


def test_the_cpu_smoke_run_prints_both_ratios_and_equal_first_losses(tmp_path):
    out = tmp_path / "ops.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--steps", "1", "--warmup", "0",
                           "--rounds", "1", "--precisions", "float32", "--json", str(out)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "graph ratio ops/layers" in proc.stdout and "eager ratio ops/layers" in proc.stdout
    for name, batch in (("mlp", 256), ("cnn", 128)):
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(f"| {name} b{batch} | fp32 |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        graph, eager = re.match(RATIO, cells[4]), re.fullmatch(RATIO, cells[7])
        assert graph and eager, line
        ms = [float(cells[i]) for i in (2, 3, 5, 6)]
        assert all(v > 0 for v in ms)
        assert float(graph.group(1)) == pytest.approx(ms[1] / ms[0], abs=0.006)
        assert float(eager.group(1)) == pytest.approx(ms[3] / ms[2], abs=0.006)
        assert ("over 1.2x" in cells[4]) == (ms[1] / ms[0] > 1.2)
    rows = json.loads(out.read_text())["rows"]
    assert [(r["model"], r["precision"]) for r in rows] == [("mlp", "float32"), ("cnn", "float32")]
    for row in rows:
        losses = row["first_losses"]
        assert set(losses) == set(ops_models.CONTENDERS)
        ref = losses["layers_graph"]
        assert 1.5 < ref[0] < 4.0 and ref[1] < ref[0]  # ~ln(10) from a fresh init; one Adam step lowers it
        for got in losses.values():
            np.testing.assert_allclose(got, ref, rtol=1e-5)
        assert row["graph_ratio"] == pytest.approx(row["ms"]["ops_graph"] / row["ms"]["layers_graph"])


def _numpy_logits(name: str, weights: list, x: np.ndarray) -> np.ndarray:
    """The models' forward in plain NumPy (float64), from the layer model's Keras-layout weights."""
    h = x.astype(np.float64)
    if name == "mlp":
        for i in range(0, 6, 2):
            h = h @ weights[i] + weights[i + 1]
            if i < 4:
                h = np.maximum(h, 0)
        return h
    for i in (0, 2):
        k, b = weights[i].astype(np.float64), weights[i + 1]
        r, s = k.shape[:2]
        oh, ow = h.shape[1] - r + 1, h.shape[2] - s + 1
        h = sum(np.einsum("nhwc,ck->nhwk", h[:, a:a + oh, c:c + ow], k[a, c]) for a in range(r) for c in range(s))
        h = np.maximum(h + b, 0)
        n, hh, ww, ch = h.shape
        h = h[:, :hh // 2 * 2, :ww // 2 * 2].reshape(n, hh // 2, 2, ww // 2, 2, ch).max(axis=(2, 4))
    return h.reshape(h.shape[0], -1) @ weights[4] + weights[5]


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_ops_and_layer_models_share_weights_and_match_a_numpy_forward(name):
    weights = ops_models.initial_weights(name)
    x, y = ops_models.make_batch(name)
    logits = _numpy_logits(name, weights, x)
    shifted = logits - logits.max(axis=1, keepdims=True)
    expected = float(np.mean(np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(len(y)), y]))
    for kind in ("layers", "ops"):
        model = ops_models.build_model(name, kind, jit_compile=False)
        model.set_weights(weights)
        assert [w.shape for w in model.get_weights()] == [w.shape for w in weights]
        np.testing.assert_allclose(np.asarray(model.predict(x, verbose=0)), logits, rtol=1e-4, atol=1e-4)
        assert float(model.train_on_batch(x, y)) == pytest.approx(expected, rel=1e-5)


def test_the_loss_check_refuses_models_that_differ():
    same = {c: [2.30, 2.10] for c in ops_models.CONTENDERS}
    ops_models.check_losses(same, "float32")
    off = dict(same, ops_graph=[2.30 * (1 + 3e-4), 2.10])
    with pytest.raises(AssertionError, match=r"ops_graph step 1 loss .* rtol 0.0001 \(float32\)"):
        ops_models.check_losses(off, "float32")
    ops_models.check_losses(off, "mixed_bfloat16")  # rtol 2e-2 there
    second = dict(same, ops_eager=[2.30, 2.10 * 1.3])
    with pytest.raises(AssertionError, match="ops_eager step 2"):
        ops_models.check_losses(second, "mixed_bfloat16")
    assert math.isclose(ops_models.RTOL["float32"], 1e-4)
    ops_models.check_losses(off, "float32", rtol=1e-3)  # --rtol


def test_a_wrong_model_name_or_kind_is_refused_by_name():
    with pytest.raises(ValueError, match="build_model: kind must be 'layers' or 'ops', got 'torch'"):
        ops_models.build_model("mlp", "torch")
    with pytest.raises(ValueError, match=r"build_model: name must be one of \['mlp', 'cnn'\], got 'vgg'"):
        ops_models.build_model("vgg", "ops")
