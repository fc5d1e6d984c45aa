"""Shared inputs and the real-Keras runner of ``tests/test_losses_keras.py`` and ``test_metrics_keras.py``.

Real Keras 3 (NumPy backend) runs once per module in a subprocess: it reads ``inputs.npz`` and a JSON list of
cases, and writes ``out.npz`` (plain float arrays, loaded with ``allow_pickle=False``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest


def inputs() -> dict:
    """Named ``(y_true, y_pred, sample_weight)`` float32 arrays, never all zero."""
    rng = np.random.default_rng(20261203)
    f = np.float32

    def probs(shape):
        p = rng.uniform(0.05, 1.0, size=shape)
        return (p / p.sum(-1, keepdims=True)).astype(f)

    sw6 = rng.uniform(0.5, 1.5, size=(6,)).astype(f)
    hot = np.eye(5, dtype=f)[rng.integers(0, 5, size=6)]
    emb = rng.normal(size=(6, 4))
    emb = (emb / np.linalg.norm(emb, axis=-1, keepdims=True)).astype(f)
    data = {
        "reg": (rng.uniform(0.1, 2.0, (6, 4)), rng.uniform(0.1, 2.0, (6, 4)), sw6),
        "signed": (rng.normal(size=(6, 4)), rng.normal(size=(6, 4)), sw6),
        "bin": (rng.integers(0, 2, (6, 4)), rng.uniform(0.05, 0.95, (6, 4)), sw6),
        "logit": (rng.integers(0, 2, (6, 4)), rng.normal(size=(6, 4)) * 2, sw6),
        "pm": (rng.integers(0, 2, (6, 4)) * 2 - 1, rng.normal(size=(6, 4)), sw6),
        "cat": (hot, probs((6, 5)), sw6),
        "catlogit": (hot, rng.normal(size=(6, 5)) * 2, sw6),
        "sparse": (rng.integers(0, 5, (6,)), probs((6, 5)), sw6),
        "sparselogit": (rng.integers(0, 5, (6,)), rng.normal(size=(6, 5)) * 2, sw6),
        "emb": (np.array([0, 1, 0, 2, 1, 0]), emb, sw6),
        "ctc": (np.array([[1, 2, 0], [3, 3, 1]]), rng.normal(size=(2, 6, 5)), np.array([0.7, 1.3])),
        "seg": (rng.integers(0, 2, (2, 4, 4, 1)), rng.uniform(0.05, 0.95, (2, 4, 4, 1)), np.array([0.7, 1.3])),
        "col": (rng.normal(size=(6, 1)), rng.normal(size=(6, 1)), sw6),
        # classes on axis 1 of (6, 5, 3); weights (6, 1) for the (6, 3) per-position losses
        "axis1": (np.eye(5)[rng.integers(0, 5, size=(6, 3))].transpose(0, 2, 1),
                  np.moveaxis(probs((6, 3, 5)), -1, 1), sw6.reshape(6, 1)),
    }
    out = {}
    for key, (yt, yp, sw) in data.items():
        out[key + "/t"] = np.asarray(yt, f)
        out[key + "/p"] = np.asarray(yp, f)
        out[key + "/w"] = np.asarray(sw, f)
    return out


def run_keras(script: str, cases: list, tmp_name: str) -> dict:
    """Run ``script`` (reads ``sys.argv[1]``/inputs.npz and cases.json, writes out.npz) under real Keras's NumPy
    backend; returns out.npz as a dict, or skips when Keras is missing."""
    if importlib.util.find_spec("keras") is None:
        pytest.skip("real Keras is not installed")
    work = tempfile.mkdtemp(prefix=tmp_name)
    np.savez(os.path.join(work, "inputs.npz"), **inputs())
    with open(os.path.join(work, "cases.json"), "w") as fh:
        json.dump(cases, fh)
    env = dict(os.environ, KERAS_BACKEND="numpy", KERAS_HOME=os.path.join(work, "kh"), PYTHONWARNINGS="ignore")
    env.pop("PYTHONPATH", None)  # real keras, not dnnbind
    proc = subprocess.run([sys.executable, "-c", script, work], env=env, capture_output=True, text=True,
                          timeout=300, cwd=work)
    if proc.returncode != 0:
        raise RuntimeError(f"the Keras reference failed:\n{proc.stderr[-4000:]}")
    with np.load(os.path.join(work, "out.npz"), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}
