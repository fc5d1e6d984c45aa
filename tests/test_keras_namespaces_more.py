"""``keras.models.model_from_json`` / ``Model.to_json`` (both ways with real Keras), ``keras.mixed_precision``'s and
``keras.dtype_policies``' names, ``keras.legacy.saving`` / ``keras.utils.legacy``."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import dtype_policies, layers, mixed_precision


def _model():
    inputs = keras.Input((4,), name="x")
    hidden = layers.Dense(3, activation="relu", name="h")(inputs)
    return keras.Model(inputs, layers.Dense(2, name="out")(hidden))


def test_to_json_round_trip_keeps_the_architecture_and_compile():
    model = _model()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    text = model.to_json(indent=1)
    again = keras.models.model_from_json(text)
    assert [type(l).__name__ for l in again.layers] == [type(l).__name__ for l in model.layers]
    assert [l.name for l in again.layers] == [l.name for l in model.layers]
    assert again.layers[1].units == 3 and again.layers[1].get_config()["activation"] == "relu"
    assert again.compiled and isinstance(again.optimizer, keras.optimizers.Adam)
    seq = keras.Sequential([keras.Input((5,)), layers.Dense(2)])
    seq2 = keras.models.model_from_json(seq.to_json())
    assert isinstance(seq2, keras.Sequential) and seq2.layers[0].units == 2
    x = np.ones((2, 5), "float32")
    assert keras.ops.convert_to_numpy(seq2(x)).shape == (2, 2)
    with pytest.raises(ValueError, match="not valid JSON"):
        keras.models.model_from_json("{nope")
    with pytest.raises(TypeError, match="expected a JSON string"):
        keras.models.model_from_json({"a": 1})


_KERAS_SIDE = textwrap.dedent("""
    import sys, keras
    text = open(sys.argv[1]).read()
    model = keras.models.model_from_json(text)
    print([type(l).__name__ for l in model.layers], model.layers[1].units)
    inputs = keras.Input((6,))
    theirs = keras.Model(inputs, keras.layers.Dense(5, activation="tanh", name="k")(inputs))
    open(sys.argv[2], "w").write(theirs.to_json())
""")


@pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="needs Keras installed (test extra)")
def test_json_crosses_to_and_from_keras(tmp_path):
    (tmp_path / "ours.json").write_text(_model().to_json())
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_HOME", "KERAS_BACKEND")}
    env.update(KERAS_HOME=str(tmp_path / "kh"), KERAS_BACKEND="numpy")
    proc = subprocess.run([sys.executable, "-c", _KERAS_SIDE, str(tmp_path / "ours.json"), str(tmp_path / "theirs.json")],
                          capture_output=True, text=True, timeout=180, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "['InputLayer', 'Dense', 'Dense'] 3"
    theirs = keras.models.model_from_json((tmp_path / "theirs.json").read_text())
    assert theirs.layers[-1].units == 5 and theirs.layers[-1].name == "k"


def test_mixed_precision_names():
    try:
        mixed_precision.set_dtype_policy("mixed_bfloat16")
        assert mixed_precision.dtype_policy().name == "mixed_bfloat16" == keras.config.dtype_policy().name
    finally:
        mixed_precision.set_dtype_policy("float32")
    assert keras.mixed_precision.LossScaleOptimizer is keras.optimizers.LossScaleOptimizer
    with pytest.raises(ValueError, match="Invalid `policy` argument"):
        mixed_precision.set_dtype_policy(3)


def test_dtype_policies():
    assert keras.dtype_policies.DTypePolicy is keras.dtype_policies.FloatDTypePolicy is mixed_precision.Policy
    p = dtype_policies.get("mixed_float16")
    assert (p.compute_dtype, p.variable_dtype) == ("float16", "float32")
    config = dtype_policies.serialize(p)
    assert config == {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "mixed_float16"},
                      "registered_name": None}
    assert dtype_policies.deserialize(config) == p
    assert dtype_policies.get(None) == mixed_precision.global_policy()
    with pytest.raises(ValueError, match="int8_from_float32"):
        dtype_policies.get("int8_from_float32")
    m = dtype_policies.DTypePolicyMap(default_policy="float32")
    m["encoder/layer_0/dense"] = "bfloat16"
    m["encoder/.*"] = "float16"
    m["decoder"] = "bfloat16"
    assert m["encoder/layer_0/dense"].name == "bfloat16" and m["encoder/attention/query"].name == "float16"
    assert m["decoder/attention"].name == "float32" and len(m) == 3
    m["encoder/attention/.*"] = "bfloat16"
    with pytest.raises(ValueError, match="matches multiple dtype policy"):
        m["encoder/attention/query"]
    with pytest.raises(ValueError, match="already exist"):
        m["decoder"] = "float32"
    again = dtype_policies.deserialize(dtype_policies.serialize(m))
    assert isinstance(again, dtype_policies.DTypePolicyMap) and again["decoder"].name == "bfloat16"


def test_legacy_saving_namespaces():
    for ns in (keras.legacy.saving, keras.utils.legacy):
        assert ns.serialize_keras_object is keras.saving.serialize_keras_object
        assert ns.deserialize_keras_object is keras.saving.deserialize_keras_object


class _FakePydot:
    """Just enough of pydot's API to record what model_to_dot builds (pydot is not a dependency)."""

    class Dot:
        def __init__(self):
            self.nodes, self.edges, self.attrs, self.written = [], [], {}, None

        def set(self, key, value):
            self.attrs[key] = value

        def set_node_defaults(self, **kwargs):
            self.attrs["node"] = kwargs

        def add_node(self, node):
            self.nodes.append(node)

        def add_edge(self, edge):
            self.edges.append(edge)

        def write(self, path, format):
            self.written = (path, format)
            _FakePydot.last = self

    class Node:
        def __init__(self, name, label):
            self.name, self.label = name, label

    class Edge:
        def __init__(self, src, dst):
            self.src, self.dst = src, dst


def test_model_to_dot_and_plot_model(monkeypatch, tmp_path):
    inputs = keras.Input((4,), name="x")
    a = layers.Dense(3, name="a", activation="relu")(inputs)
    b = layers.Dense(3, name="b")(inputs)
    model = keras.Model(inputs, layers.Add(name="sum")([a, b]))
    monkeypatch.setitem(sys.modules, "pydot", None)
    with pytest.raises(ImportError, match=r"install pydot \(`pip install pydot`\)"):
        keras.utils.model_to_dot(model)
    monkeypatch.setitem(sys.modules, "pydot", _FakePydot)
    dot = keras.utils.model_to_dot(model, show_shapes=True, show_layer_activations=True)
    by_id = {n.name: n.label for n in dot.nodes}
    names = {id(l): l.name for l in model.layers}
    edges = sorted((names[int(e.src)], names[int(e.dst)]) for e in dot.edges)
    assert edges == [("a", "sum"), ("b", "sum"), ("x", "a"), ("x", "b")]
    assert "a (Dense)\nActivation: relu\nOutput shape: (None, 3)" == by_id[str(id(model.layers[1]))]
    seq = keras.Sequential([keras.Input((2,)), layers.Dense(3), layers.Dense(1)])
    keras.utils.plot_model(seq, to_file=tmp_path / "m.svg")
    assert _FakePydot.last.written == (str(tmp_path / "m.svg"), "svg")
    assert len(_FakePydot.last.nodes) == len(seq.layers) and len(_FakePydot.last.edges) == len(seq.layers) - 1
