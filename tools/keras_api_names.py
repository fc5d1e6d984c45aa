"""Print the public names of Keras 3's API namespaces, read from an installed Keras's generated API files.

The tables dnnbind keeps (``dnnbind/ops/_namespaces.py``; the lists in ``tests/test_keras_config.py``)
were made with this script from Keras 3.15.1; run it again for a newer Keras and paste the output::

    python tools/keras_api_names.py ops           # the keras.ops sub-namespaces: numpy, nn, linalg, image,
                                                  # and core / math (the names keras.ops takes from
                                                  # keras.src.ops.core and keras.src.ops.math)
    python tools/keras_api_names.py config backend random activations regularizers constraints

Keras is not imported (its API files are read as text), so the script runs without a Keras backend.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

_IMPORT = re.compile(r"from\s+(keras\.src[\w.]*)\s+import\s+\(?\s*(\w+)\s+as\s+(\w+)")


def keras_root() -> Path:
    spec = importlib.util.find_spec("keras")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("keras is not installed (pip install keras)")
    return Path(list(spec.submodule_search_locations)[0])


def public_names(namespace: str, root: "Path | None" = None) -> list[tuple[str, str, str]]:
    """``(public name, source module, source name)`` for every name ``keras.<namespace>`` exports
    (``namespace`` dotted: ``"ops.nn"``, ``"config"``)."""
    path = (root or keras_root()).joinpath(*namespace.split("."), "__init__.py")
    return [(alias, module, name) for module, name, alias in _IMPORT.findall(path.read_text())]


def ops_tables(root: "Path | None" = None) -> dict[str, list[str]]:
    tables = {ns: sorted(alias for alias, _, _ in public_names(f"ops.{ns}", root))
              for ns in ("numpy", "nn", "linalg", "image")}
    top = public_names("ops", root)
    for ns in ("core", "math"):
        tables[ns] = sorted(alias for alias, module, _ in top if module == f"keras.src.ops.{ns}")
    return tables


def _format(name: str, names: list[str], width: int = 110) -> str:
    lines, line = [], "       "
    for n in names:
        item = f' "{n}",'
        if len(line) + len(item) > width:
            lines.append(line)
            line = "       "
        line += item
    lines.append(line)
    return f'    "{name}": (\n' + "\n".join(lines) + "\n    ),"


def main(argv: list[str]) -> None:
    root = keras_root()
    for what in argv or ["ops"]:
        if what == "ops":
            print("KERAS_OPS_NAMESPACES: dict[str, tuple[str, ...]] = {")
            for ns, names in ops_tables(root).items():
                print(_format(ns, names))
            print("}")
        else:
            print(_format(what, sorted(alias for alias, _, _ in public_names(what, root))))


if __name__ == "__main__":
    main(sys.argv[1:])
