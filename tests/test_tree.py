"""``keras.tree`` (``dnnbind.tree``): each case is evaluated with dnnbind and with real Keras 3's tree (its optree
implementation, in one subprocess on the NumPy backend); results are compared by ``repr`` and errors by type."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from dnnbind import tree

PRELUDE = textwrap.dedent("""
    import collections
    NT = collections.namedtuple("NT", "a b")
    S = {"b": [1, (2, None)], "a": NT(3, {"z": 4, "y": 5}), "c": collections.OrderedDict([("q", 6), ("p", 7)]),
         "d": collections.deque([8, 9]), "e": collections.defaultdict(list, {"k": 10, "j": ()})}
""")

CASES = [
    "tree.flatten(S)", "tree.flatten_with_path(S)", "tree.flatten(None)", "tree.flatten([None])", "tree.flatten('ab')",
    "tree.flatten([])", "tree.flatten({1: 'a', 'x': 'b'})", "tree.flatten([[[]], (), {}])", "tree.flatten(NT([1], 2))",
    "tree.flatten_with_path(NT(1, [2]))", "tree.flatten_with_path(7)",
    "tree.is_nested(None)", "tree.is_nested(())", "tree.is_nested('ab')", "tree.is_nested(NT(1, 2))",
    "tree.is_nested(collections.deque())", "tree.is_nested({})",
    "tree.map_structure(lambda x: x * 10, S)", "tree.map_structure(lambda x: 1, None)",
    "tree.map_structure(lambda x: x, {'b': 1, 'a': 2})",
    "tree.map_structure(lambda x: x + 1, [None, 1, {'b': None}], none_is_leaf=False)",
    "tree.map_structure(lambda x, y: (x, y), [1, {'a': 2}], [3, collections.OrderedDict(a=4)])",
    "tree.map_structure(lambda x, y: x + y, [1, 2], (1, 2))",
    "tree.map_structure(lambda x, y: x, [1, 2], [1])",
    "tree.map_structure(lambda x, y: x, {'a': 1}, {'b': 1})",
    "tree.map_structure(lambda x, y: x, [1], [[1]])",
    "tree.map_structure(lambda x, y: x, NT(1, 2), (1, 2))",
    "tree.map_structure(lambda x: x)",
    "tree.map_structure_up_to([1, [2]], lambda a: a, [[1, 2], [[3]]])",
    "tree.map_structure_up_to({'a': 0, 'b': 0}, lambda a, b: (a, b), {'a': [1], 'b': 2}, {'b': 3, 'a': (4,)})",
    "tree.map_structure_up_to([0, 0], lambda a: a, [1])",
    "tree.assert_same_structure([1, (2, {'a': 3})], [4, (5, {'a': None})])",
    "tree.assert_same_structure([1, 2], (1, 2))", "tree.assert_same_structure({'a': 1}, {'b': 1})",
    "tree.assert_same_structure([1], [[1]])", "tree.assert_same_structure({'a': 1}, collections.OrderedDict(a=1))",
    "tree.assert_same_paths([1, 2], (1, 2))", "tree.assert_same_paths(NT(1, 2), (1, 2))",
    "tree.assert_same_paths([1], [[1]])", "tree.assert_same_paths({'a': 1}, {'b': 1})",
    "tree.pack_sequence_as(S, list(range(11)))", "tree.pack_sequence_as({'b': 1, 'a': 2}, [10, 20])",
    "tree.pack_sequence_as([1, 2], [1])", "tree.pack_sequence_as([1, 2], [1, 2, 3])", "tree.pack_sequence_as(1, [5])",
    "tree.pack_sequence_as([1, 2], 5)",
    "tree.lists_to_tuples([1, [2, {'a': [3]}], NT([4], 5)])",
    "tree.map_shape_structure(lambda s: len(s), {'a': (None, 3), 'b': [[1, 2], (4,)], 'c': []})",
    "tree.traverse(lambda x: tree.MAP_TO_NONE if x == 2 else None, [1, [2, 3]])",
    "tree.traverse(lambda x: None, [1, [2, 3]], top_down=False)",
    "tree.traverse(lambda x: x * 2 if isinstance(x, int) else None, {'b': [1, (2,)], 'a': 3})",
    "tree.traverse(lambda x: len(x) if isinstance(x, list) else None, [1, [2, [3]]], top_down=False)",
    "tree.traverse(lambda x: 'top' if isinstance(x, dict) else None, [{'a': 1}, 2])",
]


def _evaluate(tree_module, cases):
    scope = {"tree": tree_module}
    exec(PRELUDE, scope)
    out = []
    for case in cases:
        try:
            out.append(repr(eval(case, scope)))
        except Exception as exc:  # noqa: BLE001 - the exception's type is what is compared
            out.append(f"raises {type(exc).__name__}")
    return out


_KERAS_SCRIPT = """
import json, sys
from keras import tree
sys.path.insert(0, sys.argv[1])
from test_tree import _evaluate, CASES
print(json.dumps(_evaluate(tree, CASES)))
"""


@pytest.fixture(scope="module")
def keras_results(tmp_path_factory):
    if importlib.util.find_spec("keras") is None or importlib.util.find_spec("optree") is None:
        pytest.skip("needs Keras and optree installed (test extra)")
    work = tmp_path_factory.mktemp("keras_tree")
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_HOME", "KERAS_BACKEND")}
    env.update(KERAS_HOME=str(work), KERAS_BACKEND="numpy")
    proc = subprocess.run([sys.executable, "-c", _KERAS_SCRIPT, os.path.dirname(__file__)], capture_output=True,
                          text=True, timeout=180, env=env, cwd=str(work))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_case_matches_keras(keras_results):
    mine = _evaluate(tree, CASES)
    mismatches = [(case, got, want) for case, got, want in zip(CASES, mine, keras_results) if got != want]
    assert not mismatches, "\n".join(f"{c}\n  dnnbind: {g}\n  keras:   {w}" for c, g, w in mismatches)
    assert len(set(mine)) >= 30 and sum(r.startswith("raises") for r in mine) >= 10  # not all alike


def test_error_messages_say_what_differs():
    with pytest.raises(ValueError, match="arity mismatch; expected: 2, got: 1"):
        tree.map_structure(lambda a, b: a, [1, 2], [1])
    with pytest.raises(ValueError, match=r"missing key\(s\): \['a'\]"):
        tree.assert_same_structure({"a": 1}, {"b": 1})
    with pytest.raises(ValueError, match="Paths in `b` missing in `a`"):
        tree.assert_same_paths([1], [[1]])


def test_namespace_has_every_keras_name():
    names = ["MAP_TO_NONE", "assert_same_paths", "assert_same_structure", "flatten", "flatten_with_path",
             "is_nested", "lists_to_tuples", "map_shape_structure", "map_structure", "map_structure_up_to",
             "pack_sequence_as", "traverse"]
    import dnnbind as keras
    assert all(hasattr(keras.tree, n) for n in names) and sorted(tree.__all__) == sorted(names)
