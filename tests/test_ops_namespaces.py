"""The sub-namespaces of ``keras.ops`` (``dnnbind.ops.numpy``, ``.nn``, ``.linalg``, ``.image``, ``.core``,
``.math``): Keras 3.15.1's name tables (checked against the installed Keras), each exporting exactly its
registered ops, picking up ops registered later, and a list of the Keras names still missing."""

from __future__ import annotations

import importlib
import importlib.util
import warnings

import pytest

import keras_aux
from dnnbind import ops
from dnnbind.ops import _core
from dnnbind.ops._namespaces import KERAS_OPS_NAMESPACES, missing

NAMESPACES = sorted(KERAS_OPS_NAMESPACES)


@pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="needs Keras installed (test extra)")
def test_the_tables_are_the_installed_keras_ones():
    keras_api_names = keras_aux.keras_api_names()
    installed = keras_api_names.ops_tables()
    for ns in NAMESPACES:
        assert list(KERAS_OPS_NAMESPACES[ns]) == installed[ns], (
            f"keras.ops.{ns} changed: regenerate dnnbind/ops/_namespaces.py with tools/keras_api_names.py ops")


@pytest.mark.parametrize("ns", NAMESPACES)
def test_a_namespace_exports_exactly_its_registered_ops(ns):
    module = importlib.import_module(f"dnnbind.ops.{ns}")
    assert getattr(ops, ns) is module
    registered = [n for n in KERAS_OPS_NAMESPACES[ns] if n in _core.REGISTRY]
    assert module.__all__ == registered
    for name in registered:
        assert getattr(module, name) is _core.REGISTRY[name]["fn"] is getattr(ops, name)
    for name in missing(ns):
        with pytest.raises(AttributeError, match="does not have yet"):
            getattr(module, name)
    with pytest.raises(AttributeError, match="not a name of"):
        module.no_such_op  # noqa: B018


def test_the_namespaces_hold_the_ops_there_are():
    assert {"abs", "matmul", "where", "sum"} <= set(ops.numpy.__all__)
    assert {"relu", "sigmoid"} <= set(ops.nn.__all__) and {"cast", "stop_gradient"} <= set(ops.core.__all__)


def test_an_op_registered_later_appears(monkeypatch):
    name = "relu"  # taken out of the registry, then registered again as a stand-in
    monkeypatch.delitem(_core.REGISTRY, name)
    monkeypatch.delattr(ops.nn, name, raising=False)
    assert name in missing("nn")
    with pytest.raises(AttributeError, match="does not have yet"):
        getattr(ops.nn, name)

    def fake(x):
        return x

    monkeypatch.setitem(_core.REGISTRY, name, {"fn": fake, "differentiable": False, "family": "nn"})
    assert getattr(ops.nn, name) is fake and name in dir(ops.nn)
    # monkeypatch's undo puts the real op back in the registry and as the module's attribute


def test_list_the_keras_ops_still_missing():
    """Not a failure: a report of what the op families have left to add (pytest's warnings summary)."""
    report = {ns: missing(ns) for ns in NAMESPACES}
    assert all(set(names) <= set(KERAS_OPS_NAMESPACES[ns]) for ns, names in report.items())
    lines = [f"keras.ops.{ns}: {len(names)} of {len(KERAS_OPS_NAMESPACES[ns])} missing: {', '.join(names)}"
             for ns, names in report.items() if names]
    if lines:
        warnings.warn("Keras ops dnnbind does not have yet:\n" + "\n".join(lines), UserWarning, stacklevel=1)
