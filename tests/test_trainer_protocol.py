"""dnnbind/trainers/protocol.py against the code: every attribute the trainer's rooms use on a model (and
on its layers), every one the step graphs use on the trainer, and every one the models use on the trainer,
is listed there, nothing more; and the model kinds provide all of it."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers
from dnnbind.models import Functional, Model, Sequential
from dnnbind.trainers import protocol
from dnnbind.trainers.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
TRAINERS = ROOT / "dnnbind" / "trainers"
#: the rooms that talk to a model (data_adapters sees only arrays; step_graphs is GraphStepped's)
MODEL_ROOMS = ["trainer", "loops", "feeds", "precision", "compile_utils"]


def _members(proto: type) -> set[str]:
    """The names a protocol class declares itself (annotations and methods), not its bases'."""
    own = set(proto.__dict__.get("__annotations__", {}))
    own |= {k for k, v in proto.__dict__.items()
            if (callable(v) or isinstance(v, property)) and (not k.startswith("__") or k == "__call__")}
    return own


def _trainer_class() -> ast.ClassDef:
    tree = ast.parse((TRAINERS / "trainer.py").read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")


def _trainer_defines() -> set[str]:
    return {n.name for n in _trainer_class().body if isinstance(n, ast.FunctionDef)}


def _is_dict_of(node: ast.AST, names: tuple[str, ...]) -> bool:
    """``v.__dict__`` for a variable called one of ``names``."""
    return isinstance(node, ast.Attribute) and node.attr == "__dict__" and isinstance(node.value, ast.Name) \
        and node.value.id in names


def _uses(paths: list[Path], names: tuple[str, ...], skip_self_in: tuple[str, ...] = ()) -> tuple[set, set]:
    """``(read, written)``: attributes read or called / assigned on variables called ``names`` in these
    files, including ``getattr(v, "x")`` and ``v.__dict__.get("x")`` / ``v.__dict__["x"] = ...`` /
    ``v.__dict__.setdefault("x", ...)``."""
    read: set = set()
    written: set = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names:
                if node.value.id == "self" and path.stem in skip_self_in:
                    continue
                if node.attr == "__dict__":
                    continue
                (written if isinstance(node.ctx, ast.Store) else read).add(node.attr)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                    and isinstance(node.args[0], ast.Name) and node.args[0].id in names \
                    and isinstance(node.args[1], ast.Constant):
                read.add(node.args[1].value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
                read.add("__call__")  # self(x, training=...)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args \
                    and isinstance(node.args[0], ast.Constant) and _is_dict_of(node.func.value, names):
                (written if node.func.attr == "setdefault" else read).add(node.args[0].value)
            elif isinstance(node, ast.Subscript) and _is_dict_of(node.value, names) \
                    and isinstance(node.slice, ast.Constant) and isinstance(node.ctx, ast.Store):
                written.add(node.slice.value)
    return read, written


def _room_paths(rooms: list[str]) -> list[Path]:
    return [TRAINERS / f"{room}.py" for room in rooms]


def test_trained_model_lists_every_model_attribute_the_trainer_uses():
    # ``self`` in precision.py is a LossScale's, not the model's
    read, written = _uses(_room_paths(MODEL_ROOMS), ("self", "model"), skip_self_in=("precision", "compile_utils"))
    defines = _trainer_defines()
    from_model = read - defines - written  # what the trainer neither defines nor sets itself
    declared = _members(protocol.TrainedModel)
    hooks = declared & defines
    # a model is a layer: what the trainer reads on it as on any layer is TrainedLayer's
    assert from_model - _members(protocol.TrainedLayer) == declared - hooks
    # the hooks are the ones with a default in Trainer that a model kind overrides
    assert hooks == {"_guess_input_structure", "_guess_output_structure", "_discard_forward"}
    for hook in hooks - {"_discard_forward"}:
        assert any(hook in cls.__dict__ for cls in (Model, Sequential, Functional)), hook


def test_trained_layer_lists_every_layer_attribute_the_steps_use():
    read, written = _uses(_room_paths(MODEL_ROOMS), ("layer",))
    assert read | written == _members(protocol.TrainedLayer)
    # the model is one of the loss sources _may_have_losses scans as a layer: the protocol says so
    assert protocol.TrainedLayer in protocol.TrainedModel.__mro__


def test_graph_stepped_lists_what_the_step_graphs_call_on_the_model():
    read, written = _uses(_room_paths(["step_graphs"]), ("model",))
    assert not written
    assert read == _members(protocol.GraphStepped)
    # the trainer provides what the model side (TrainedModel) does not
    provided = _members(protocol.GraphStepped) - _members(protocol.TrainedModel)
    assert provided and all(hasattr(Trainer, name) for name in provided)


def test_trainer_hooks_list_what_the_models_use_on_the_trainer():
    trainer_defines = _trainer_defines()
    _, trainer_sets = _uses(_room_paths(["trainer"]), ("self",))
    models = sorted((ROOT / "dnnbind" / "models").glob("*.py"))
    read, written = _uses(models, ("self", "model"))
    public_api = {n for n in trainer_defines if not n.startswith("_")}  # fit, predict... are Keras's surface
    used = ((read | written) & (trainer_defines | trainer_sets)) - public_api
    assert used == _members(protocol.TrainerHooks)


def _models():
    seq = Sequential([keras.Input((4,)), layers.Dense(3, activation="softmax")])
    inp = keras.Input((4,))
    func = Model(inp, layers.Dense(2)(inp))

    class Sub(Model):
        def __init__(self):
            super().__init__()
            self.dense = layers.Dense(2)

        def call(self, x, training=False):
            return self.dense(x)

    sub = Sub()
    sub(np.zeros((1, 4), np.float32))
    return {"sequential": seq, "functional": func, "subclassed": sub}


@pytest.mark.parametrize("kind", ["sequential", "functional", "subclassed"])
def test_every_model_kind_provides_the_protocols(kind):
    model = _models()[kind]
    model.compile("sgd", "mse")
    for proto in (protocol.TrainedModel, protocol.TrainedLayer, protocol.GraphStepped, protocol.TrainerHooks):
        missing = [name for name in _members(proto) if not hasattr(model, name)]
        assert missing == [], (proto.__name__, missing)
    for layer in model._flat_layers():
        missing = [name for name in _members(protocol.TrainedLayer) if not hasattr(layer, name)]
        assert missing == [], (type(layer).__name__, missing)
    # the shapes the protocol promises, on a built model
    assert [tuple(s) for s in model._expected_input_shapes()] == [(4,)]
    assert len(model._output_shapes()) == len(model.output_names) == len(model._fusable_outputs()) == 1
