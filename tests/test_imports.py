"""Imports flow one way (docs/DESIGN.md, "Rooms and import direction").

* The module-level imports between dnnbind's own modules form no cycle (the cycles models <-> saving,
  backend <-> ops and cuda.array <-> interop were broken by moving code, not by deferring imports).
* Each room imports on its own, in a fresh interpreter, whichever is imported first.
* Importing the Keras-like API on the NumPy backend loads no CUDA library binding.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "layers":  # installed as dnnbind.layers (package-dir)
        parts.insert(0, "dnnbind")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    files = [*(ROOT / "dnnbind").rglob("*.py"), *(ROOT / "layers").rglob("*.py")]
    return {_module_name(p): p for p in files}


def _imports(name: str, path: Path, known: set[str], *, in_functions: bool = False) -> set[str]:
    """The dnnbind modules ``name`` imports when it is imported, and with ``in_functions`` also those
    its functions import when they run."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text())
    out: set[str] = set()

    def visit(nodes: list) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if in_functions:
                    visit(node.body)
                continue
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name in known)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[:len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    if sub in known:
                        out.add(sub)
                    elif target in known:
                        out.add(target)
            if isinstance(node, ast.ClassDef):
                visit(node.body)
            elif hasattr(node, "body"):
                for field in ("body", "orelse", "finalbody", "handlers"):
                    visit(getattr(node, field, []) or [])

    visit(tree.body)
    out.discard(name)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def _graph(in_functions: bool) -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules), in_functions=in_functions) for name, path in modules.items()}


def test_module_level_imports_have_no_cycle():
    assert _cycles(_graph(in_functions=False)) == []


def test_deferred_imports_hide_no_cycle_but_the_documented_one():
    graph = _graph(in_functions=True)
    # the edges the three former cycles ran along now point one way only
    assert "dnnbind.saving_lib" in graph["dnnbind.models.model"]
    assert not graph["dnnbind.saving_lib"] & {"dnnbind.models", "dnnbind.saving"}
    assert "dnnbind.kernels" not in graph["dnnbind.backend"]
    assert "dnnbind.cuda.interop" not in graph["dnnbind.cuda.array"]
    # Model.__new__ returns a Functional for Model(inputs, outputs), and Functional subclasses Model
    # (Keras 3 defers the same import): the one cycle DESIGN.md names
    assert _cycles(graph) == [["dnnbind.models.functional", "dnnbind.models.model"]]


@pytest.mark.parametrize("first", ["dnnbind.saving", "dnnbind.models", "dnnbind.saving_lib", "dnnbind.callbacks",
                                   "dnnbind.cuda.interop", "dnnbind.cuda.array", "dnnbind.cuda._dlpack",
                                   "dnnbind.backend", "dnnbind.kernels", "dnnbind.cudnn", "dnnbind.cublas",
                                   "dnnbind.kernels._cuda._common", "dnnbind.layers", "dnnbind.doctor",
                                   "dnnbind.random", "dnnbind.config"])
def test_each_room_imports_first_in_a_fresh_interpreter(first):
    code = f"import {first}, dnnbind.saving, dnnbind.models; print(dnnbind.saving.load_model is dnnbind.load_model)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "True"


def test_the_numpy_backend_loads_no_cuda_binding():
    code = ("import sys, dnnbind, dnnbind.kernels, dnnbind.layers, dnnbind.models, dnnbind.saving, dnnbind.callbacks; "
            "print(sorted(m for m in sys.modules if m.startswith(('cuda.bindings', 'dnnbind.cuda', "
            "'dnnbind.kernels._cuda', 'dnnbind.cudnn', 'dnnbind.cublas'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


# Keras 3's namespaces that dnnbind has (``keras.<name>`` is ``dnnbind.<name>``)
KERAS_NAMESPACES = ("activations", "backend", "callbacks", "config", "constraints", "datasets", "distribution",
                    "initializers", "layers", "losses", "metrics", "mixed_precision", "models", "ops",
                    "optimizers", "quantizers", "random", "regularizers", "saving", "utils")


def test_every_keras_namespace_is_reachable_after_a_bare_import_without_loading_cuda():
    """``import dnnbind as keras`` then ``keras.distribution``, ``keras.quantizers``, ...: each an attribute of
    the package (as Keras 3 has them), and none loads a CUDA library or its binding until used."""
    code = (
        "import sys, types, dnnbind\n"
        f"names = {KERAS_NAMESPACES!r}\n"
        "mods = [getattr(dnnbind, n) for n in names]\n"
        "assert all(isinstance(m, types.ModuleType) and m.__name__ == 'dnnbind.' + n for m, n in zip(mods, names))\n"
        "assert dnnbind.distribution.DataParallel and dnnbind.quantizers.abs_max_quantize\n"
        "assert set(names) <= set(dir(dnnbind))\n"
        "from dnnbind._lib import loader\n"
        "bindings = sorted(m for m in sys.modules if m.startswith(('cuda.bindings', 'dnnbind.cuda', "
        "'dnnbind.kernels._cuda', 'dnnbind.cudnn', 'dnnbind.cublas', 'dnnbind._lib.cudnn', 'dnnbind._lib.cublas', "
        "'dnnbind._lib.nccl')))\n"
        "maps = [line.split()[-1] for line in open('/proc/self/maps') if any(k in line for k in "
        "('libcudnn', 'libcublas', 'libnccl', 'libcudart', 'libnvrtc'))]\n"
        "print(bindings, sorted(loader._loaded), sorted(set(maps)))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[] [] []"
