"""The name census: which of Keras 3's public names ``import dnnbind as keras`` reaches, namespace by
namespace, read from the installed Keras's generated API files (``tools/keras_api_names.py``; Keras is not
imported). Floors per namespace keep the count from falling unnoticed; the names still missing are listed in
the failure message and, with the reasons, in the README ("Keras names not provided")."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

#: namespace -> the fewest names dnnbind must reach (Keras 3.15.1 counts in the comments)
FLOORS = {
    "layers": 163,        # of 175
    "losses": 48,         # of 48
    "metrics": 72,        # of 72
    "ops": 337,           # of 337
    "activations": None,  # every name
    "regularizers": None,
    "constraints": None,
    "random": None,
    "config": None,
    "backend": None,
    "tree": None,
    "initializers": None,
    "callbacks": 15,      # of 16 (OrbaxCheckpoint)
    "optimizers": 18,     # of 21
    "saving": 12,         # of 13
    "utils": 37,          # of 38
    "models": None,
}
TOTAL_SHARE = 0.86  # of every name in every namespace (1,440 in 3.15.1, keras.applications included)

_IMPORT = re.compile(r"from\s+(keras\.src[\w.]*)\s+import\s+\(?\s*(\w+)\s+as\s+(\w+)")


def _keras_root() -> Path:
    spec = importlib.util.find_spec("keras")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("keras is not installed (pip install keras): the census reads its API files")
    return Path(list(spec.submodule_search_locations)[0])


def _namespaces(root: Path) -> "dict[str, list[str]]":
    out = {}
    for init in sorted(root.glob("**/__init__.py")):
        rel = init.parent.relative_to(root)
        if "src" in rel.parts or "_tf_keras" in rel.parts:
            continue
        ns = ".".join(rel.parts)
        out[ns] = [alias for _, _, alias in _IMPORT.findall(init.read_text())]
    return out


def _reach(ns: str):
    import dnnbind

    mod = dnnbind
    for part in [p for p in ns.split(".") if p]:
        mod = getattr(mod, part, None)
        if mod is None:
            return None
    return mod


def test_the_keras_name_census_does_not_fall():
    root = _keras_root()
    tables = _namespaces(root)
    total = have = 0
    short = []
    for ns, names in tables.items():
        mod = _reach(ns)
        missing = [n for n in names if mod is None or not hasattr(mod, n)]
        total += len(names)
        have += len(names) - len(missing)
        if ns in FLOORS:
            floor = len(names) if FLOORS[ns] is None else FLOORS[ns]
            if len(names) - len(missing) < floor:
                short.append(f"{ns}: {len(names) - len(missing)} of {len(names)} < {floor}; missing {missing}")
    assert not short, "\n".join(short)
    assert have / total >= TOTAL_SHARE, f"{have} of {total} Keras names ({have / total:.1%}) < {TOTAL_SHARE:.0%}"


def test_every_keras_namespace_is_reachable_after_a_bare_import():
    """Keras's namespaces exist as attributes after a bare ``import dnnbind`` in a fresh interpreter, except
    those the README lists as not provided (that the import loads no CUDA library is tests/test_imports.py's)."""
    import subprocess

    not_provided = {"applications", "distillation", "export", "visualization", "wrappers", "utils.bounding_boxes"}
    root = _keras_root()
    names = sorted(ns for ns in _namespaces(root) if ns and not any(
        ns == p or ns.startswith(p + ".") for p in not_provided))
    code = ("import sys, dnnbind\n"
            f"names = {names!r}\n"
            "missing = []\n"
            "for ns in names:\n"
            "    mod = dnnbind\n"
            "    for part in ns.split('.'):\n"
            "        mod = getattr(mod, part, None)\n"
            "        if mod is None:\n"
            "            missing.append(ns); break\n"
            "print('MISSING', missing)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "MISSING []" in out.stdout, out.stdout


def test_device_scope_sets_and_restores_the_default_device():
    import dnnbind
    from dnnbind import backend, ops

    dnnbind.set_default_device("cpu")
    try:
        with dnnbind.device("cpu") as dev:
            assert str(dev) == "cpu" and str(backend.default_device()) == "cpu"
            assert ops.convert_to_numpy(ops.ones((2,))).tolist() == [1.0, 1.0]
        with pytest.raises(RuntimeError):
            with dnnbind.device("cpu"):
                raise RuntimeError("inside")
        assert str(backend.default_device()) == "cpu"
        assert dnnbind.version() == dnnbind.__version__
    finally:
        dnnbind.set_default_device(None)
