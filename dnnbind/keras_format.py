"""Keras 3's naming and config JSON, translated to and from dnnbind's (no file I/O here: see :mod:`dnnbind.saving`).

* :func:`variable_paths`: where each weight lives in a Keras 3 weights file. Keras keys weights by
  position, not by layer name: the layers of a model in order, each under the snake-case name of its
  class made unique by a counter (``layers/conv2d``, ``layers/conv2d_1``, ``layers/dense``), and each
  layer's variables numbered in Keras order (trainable ones first, then the others, each in creation
  order: ``vars/0`` kernel, ``vars/1`` bias). Two identical models therefore share every key, whatever
  their automatic layer names. dnnbind's safetensors files use the same keys
  (``layers/conv2d/vars/0``).
* :func:`model_to_keras` / :func:`model_from_keras`: a model's ``config.json`` as Keras 3 writes it
  (``{"module", "class_name", "config", "registered_name", "build_config", "compile_config"}``, dtype
  policies and initializers as such dicts) to and from the configs that dnnbind's Sequential and
  Functional ``from_config`` take. A user's layer class is written as Keras writes it (its module and
  registered name, :func:`dnnbind.saving.register_keras_serializable`) and read back through the registry
  or a ``CustomObjectScope``. Anything dnnbind cannot honour (a regularizer, a constraint, an
  unregistered custom class, a quantized policy, call arguments a layer's ``call`` does not take) raises ``ValueError`` naming the layer and the key.

Keras config values are untrusted input here: every one goes through the layers' constructors,
which check their arguments; this module only checks the structure and refuses what it cannot map.
"""

from __future__ import annotations

import inspect
from typing import Any, Iterator

from . import _keras_objects
from . import initializers as _init
from . import activations as _activations
from .layers.base import Layer, Weight, _snake_case, get_layer_class
from .mixed_precision import Policy

__all__ = ["KERAS_FORMAT_VERSION", "keras_snake_case", "variable_paths", "keras_weight_order", "model_to_keras",
           "model_config_with_compile",
           "model_from_keras", "compile_config_to_keras", "compile_config_from_keras"]

# The Keras version whose .keras layout this module writes (metadata.json's "keras_version"): 3.x keeps
# config.json, metadata.json and model.weights.h5 with the variable paths above.
KERAS_FORMAT_VERSION = "3.0.0"

# Keras config keys that dnnbind's layers do not take, with the only values dnnbind can honour
# (anything else would silently change the model). A callable accepts any value: the key only
# matters when another key has a value already refused (renorm_momentum without renorm).
_ANY = object()
_KERAS_ONLY_KEYS: dict[str, Any] = {
    "quantization_config": None, "lora_rank": None, "lora_alpha": _ANY,
    "renorm": False, "renorm_clipping": None, "renorm_momentum": _ANY,
    "autocast": True, "sparse": False, "ragged": False, "optional": False,
}
# every name keras.activations knows (dnnbind.activations has them all)
_KERAS_ACTIVATIONS = tuple(sorted(_activations.ALL_OBJECTS_DICT))
_OPTIMIZER_KERAS_ONLY: dict[str, Any] = {
    "clipnorm": None, "global_clipnorm": None, "clipvalue": None, "use_ema": False, "ema_momentum": _ANY,
    "ema_overwrite_frequency": _ANY, "loss_scale_factor": None, "gradient_accumulation_steps": None,
}
_LOSS_KERAS_ONLY: dict[str, Any] = {"dtype": None}  # every reduction is dnnbind's too
# config keys that hold a whole layer (Bidirectional's and TimeDistributed's layer, an RNN's cell)
_NESTED_LAYER_KEYS = ("layer", "backward_layer", "cell")


# classes that Keras 3 exports (and writes in config.json) under another name than the class's own, which
# still names their weights-file groups (grouped_query_attention)
_KERAS_EXPORT_NAMES = {"GroupedQueryAttention": "GroupQueryAttention"}

keras_snake_case = _snake_case  # Keras's to_snake_case, which also names dnnbind's layers


def keras_weight_order(layer: Layer) -> list[Weight]:
    """A layer's own weights in the order Keras numbers them: those created trainable, then the others
    (each in creation order; variables assigned as attributes after them). Freezing a layer does not change
    it. A sublayer's weights are its own (see :func:`variable_paths`)."""
    created = list(layer._weights) + layer._tracked_variables()
    return [w for w in created if w.trainable] + [w for w in created if not w.trainable]


def _counted(used: dict, base: str) -> str:
    count = used.get(base)
    used[base] = 0 if count is None else count + 1
    return base if count is None else f"{base}_{count + 1}"


def variable_paths(model: Any) -> Iterator[tuple[str, Any, list[Weight]]]:
    """``(group path, layer, weights in Keras order)`` for every layer of ``model``, weightless ones too,
    in model order: ``("layers/conv2d", conv, [kernel, bias])``. Weight ``i`` is keyed ``<path>/vars/<i>``.
    As Keras 3's ``saving_lib`` walks them: a model's layers under ``layers/<snake_case class>[_<n>]``, a
    layer's sublayers under ``<its path>/<attribute name>`` (a list attribute: ``<attribute>/<snake_case>``),
    a nested model's layers below its own path."""
    used: dict[str, int] = {}
    for layer in model.layers:
        path = f"layers/{_counted(used, keras_snake_case(type(layer).__name__))}"
        yield from _layer_paths(layer, path)


def _layer_paths(layer: Any, path: str) -> Iterator[tuple[str, Any, list[Weight]]]:
    if not isinstance(layer, Layer):
        yield path, layer, []
        return
    yield path, layer, keras_weight_order(layer)
    if hasattr(layer, "_direct_layers"):  # a model: its layers below its path
        for sub_path, sub, weights in variable_paths(layer):
            yield f"{path}/{sub_path}", sub, weights
        return
    d = layer.__dict__
    for attr in d.get("_tracked", {}):
        value = d.get(attr)
        if isinstance(value, Layer):
            yield from _layer_paths(value, f"{path}/{attr}")
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, Layer) for v in value):
            used: dict[str, int] = {}
            for v in value:
                yield from _layer_paths(v, f"{path}/{attr}/{_counted(used, keras_snake_case(type(v).__name__))}")


# ----- dnnbind -> Keras -----------------------------------------------------------------------------
def _keras_object(module: str, class_name: str, config: Any) -> dict:
    return {"module": module, "class_name": class_name, "config": config, "registered_name": None}


def _policy_to_keras(name: Any) -> dict:
    return _keras_object("keras", "DTypePolicy", {"name": Policy(name).name})


def _initializer_to_keras(config: Any, where: str) -> Any:
    if config is None or isinstance(config, str):
        return config
    cls_name = config.get("class_name") if isinstance(config, dict) else None
    if cls_name not in _init._CLASS_TO_NAME:
        raise ValueError(f"{where}: initializer {cls_name!r} has no Keras equivalent (a callable initializer "
                         "cannot be saved in the Keras format); use a named one such as 'glorot_uniform'")
    return _keras_object("keras.initializers", cls_name, dict(config.get("config") or {}))


def _custom_layer_classes(model: Any) -> dict[str, type]:
    """The user's layer classes in ``model`` (at any depth), by class name."""
    found = {}
    for _, layer, _ in variable_paths(model):
        cls = type(layer)
        if isinstance(layer, Layer) and not cls.__module__.startswith("dnnbind."):
            found[cls.__name__] = cls
    return found


def _layer_to_keras(entry: dict, where: str, custom: "dict[str, type] | None" = None) -> dict:
    class_name = entry["class_name"]
    config = dict(entry["config"])
    user_class = (custom or {}).get(class_name)
    if class_name == "InputLayer":
        shape = list(config["shape"])
        return _keras_object("keras.layers", "InputLayer", {
            "batch_shape": [config.get("batch_size"), *shape], "dtype": config.get("dtype") or "float32",
            "sparse": False, "name": config["name"]})
    where = f"{where} layer '{config.get('name')}' ({class_name})"
    config.pop("input_shape", None)  # becomes the model's InputLayer
    if "dtype" in config:
        config["dtype"] = _policy_to_keras(config["dtype"])
    for key, value in list(config.items()):
        if key.endswith("_initializer"):
            config[key] = _initializer_to_keras(value, f"{where}: {key}")
    if "activation" in config and isinstance(config["activation"], str) and \
            config["activation"] not in _KERAS_ACTIVATIONS:
        raise ValueError(f"{where}: activation {config['activation']!r} has no Keras name "
                         f"(Keras knows {', '.join(_KERAS_ACTIVATIONS)})")
    if "data_format" in config and config["data_format"] is None:
        config["data_format"] = "channels_last"  # what Keras resolves None to (its image_data_format default)
    for key in _NESTED_LAYER_KEYS:  # a wrapper's layer, an RNN's cell: layer objects inside the config
        if isinstance(config.get(key), dict):
            config[key] = _layer_to_keras(config[key], where, custom)
    if isinstance(config.get("cells"), list):
        config["cells"] = [_layer_to_keras(c, where, custom) for c in config["cells"]]
    if user_class is not None:  # as Keras writes a user's class: its module and registered name
        return {"module": user_class.__module__, "class_name": class_name, "config": config,
                "registered_name": _keras_objects.get_registered_name(user_class)}
    return _keras_object("keras.layers", _KERAS_EXPORT_NAMES.get(class_name, class_name), config)


def model_to_keras(model: Any) -> dict:
    """``config.json`` of a ``.keras`` file for ``model`` (a built Sequential or functional model), without
    its compile config. A subclassed model has no config Keras could rebuild: ValueError."""
    config = model.get_config()
    custom = _custom_layer_classes(model)
    if isinstance(config, dict) and "input_layers" in config:
        return _functional_to_keras(config, custom)
    if not isinstance(config, dict) or "layers" not in config:
        raise ValueError(f"model '{model.name}' ({type(model).__name__}) is subclassed: its layers are made by its "
                         "own code, so no config can rebuild it; save its weights (.weights.h5) instead")
    return _sequential_to_keras(model, config, custom)


def model_config_with_compile(model: Any) -> dict:
    """:func:`model_to_keras` plus, for a compiled model, its ``compile_config`` (what ``Model.to_json`` and
    ``serialize_keras_object`` write, as Keras does)."""
    config = model_to_keras(model)
    compiled = compile_config_to_keras(
        getattr(model, "_compile_config", None) if getattr(model, "compiled", False) else None)
    if compiled is not None:
        config["compile_config"] = compiled
    return config


def _sequential_to_keras(model: Any, config: dict, custom: "dict[str, type] | None" = None) -> dict:
    where = f"Sequential '{config.get('name')}'"
    entries = list(config["layers"])
    build_shape = config.get("build_input_shape")
    if not entries or entries[0]["class_name"] != "InputLayer":
        declared = entries[0]["config"].get("input_shape") if entries else None
        shape = declared if declared is not None else build_shape
        if shape is not None:
            # Keras 3 starts a Sequential with its InputLayer rather than an input_shape argument
            entries.insert(0, {"class_name": "InputLayer", "config": {
                "shape": list(shape), "batch_size": None, "dtype": "float32", "name": "input_layer"}})
    layers = [_layer_to_keras(entry, where, custom) for entry in entries]
    for keras_entry, layer in zip(layers[1:] if layers and layers[0]["class_name"] == "InputLayer" else layers,
                                  model.layers):
        if getattr(layer, "built", False) and layer.input_shape is not None:
            keras_entry["build_config"] = {"input_shape": [None, *layer.input_shape]}
    keras_config = {"name": config.get("name"), "trainable": config.get("trainable", True),
                    "dtype": _policy_to_keras("float32"), "layers": layers}
    if build_shape is not None:
        keras_config["build_input_shape"] = [None, *build_shape]
    out = _keras_object("keras", "Sequential", keras_config)
    if build_shape is not None:
        out["build_config"] = {"input_shape": [None, *build_shape]}
    return out


def _refs_to_keras(refs: list, names: list | None) -> Any:
    """dnnbind's ``[layer, node, tensor]`` refs as Keras writes them: named ones as a dict, a bare ref (a model
    of one bare tensor) bare, a list (also of one) as a list."""
    if names is not None:
        return dict(zip(names, [refs] if _is_ref(refs) else refs))
    return refs


def _functional_to_keras(config: dict, custom: "dict[str, type] | None" = None) -> dict:
    where = f"Functional '{config.get('name')}'"
    layers = []
    for entry in config["layers"]:
        keras_entry = _layer_to_keras(entry, where, custom)
        keras_entry["name"] = entry.get("name", entry["config"].get("name"))
        keras_entry["inbound_nodes"] = entry.get("inbound_nodes", [])
        layers.append(keras_entry)
    keras_config = {"name": config.get("name"), "trainable": config.get("trainable", True), "layers": layers,
                    "input_layers": _refs_to_keras(config["input_layers"], config.get("input_names")),
                    "output_layers": _refs_to_keras(config["output_layers"], config.get("output_names"))}
    out = _keras_object("keras.src.models.functional", "Functional", keras_config)
    out["registered_name"] = "Functional"  # as Keras writes it
    out["build_config"] = {"input_shape": None}
    return out


def compile_config_to_keras(compile_config: dict | None) -> dict | None:
    """dnnbind's ``model._compile_config`` as Keras's ``compile_config`` (optimizer, loss and metrics as
    Keras objects)."""
    if not compile_config:
        return None
    opt = dict(compile_config["optimizer"])
    opt_config = dict(opt.get("config") or {})
    lr = opt_config.get("learning_rate")
    if isinstance(lr, dict):
        opt_config["learning_rate"] = _keras_object("keras.optimizers.schedules", lr["class_name"], lr["config"])
    def one_loss(loss: Any) -> Any:
        if loss is None or isinstance(loss, str):
            return loss
        return _keras_object("keras.losses", loss["class_name"], loss.get("config") or {})

    def metric_list(group: Any) -> list:
        return [m if isinstance(m, str) else _keras_object("keras.metrics", m["class_name"], m.get("config") or {})
                for m in group or []]

    # several outputs: a list (one per output) or a dict keyed by output name, as compile took them
    loss = compile_config["loss"]
    if isinstance(loss, list):
        loss = [one_loss(entry) for entry in loss]
    elif isinstance(loss, dict) and "class_name" not in loss:
        loss = {name: one_loss(entry) for name, entry in loss.items()}
    else:
        loss = one_loss(loss)
    def metric_groups(metrics: Any) -> Any:
        return ({name: metric_list(group) for name, group in metrics.items()} if isinstance(metrics, dict)
                else metric_list(metrics)) or None

    return {"optimizer": _keras_object("keras.optimizers", opt["class_name"], opt_config),
            "loss": loss, "loss_weights": compile_config.get("loss_weights"),
            "metrics": metric_groups(compile_config.get("metrics")),
            "weighted_metrics": metric_groups(compile_config.get("weighted_metrics")), "run_eagerly": False,
            "steps_per_execution": 1, "jit_compile": False}


# ----- Keras -> dnnbind -----------------------------------------------------------------------------
def _check_keras_object(entry: Any, where: str, modules: tuple[str, ...]) -> tuple[str, Any]:
    """``(class_name, config)`` of a serialised built-in Keras object, or a ValueError saying why not."""
    if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str) or "config" not in entry:
        raise ValueError(f"{where} must be a Keras object {{'class_name': str, 'config': ...}}, got {str(entry)[:200]}")
    module = entry.get("module")
    registered = entry.get("registered_name")
    if (module is not None and not (isinstance(module, str) and module.startswith(modules))) or \
            (registered is not None and registered != entry["class_name"]):
        raise ValueError(f"{where}: {entry['class_name']!r} (module {module!r}, registered_name {registered!r}) is "
                         "a custom object; dnnbind reads only Keras's built-in classes")
    return entry["class_name"], entry["config"]


def _policy_from_keras(value: Any, where: str) -> str:
    if isinstance(value, dict):
        class_name, config = _check_keras_object(value, f"{where}: dtype", ("keras",))
        if class_name not in ("DTypePolicy", "FloatDTypePolicy", "Policy") or not isinstance(config, dict):
            raise ValueError(f"{where}: dtype policy {class_name!r} is not supported (dnnbind has float policies "
                             "only: float32, float16, bfloat16, float64, mixed_float16, mixed_bfloat16)")
        value = config.get("name")
    try:
        return Policy(value).name
    except (ValueError, TypeError):
        raise ValueError(f"{where}: dtype policy {value!r} is not supported (dnnbind has float32, float16, "
                         "bfloat16, float64, mixed_float16, mixed_bfloat16)") from None


def _initializer_from_keras(value: Any, where: str) -> Any:
    if value is None or isinstance(value, str):
        return value
    class_name, config = _check_keras_object(value, where, ("keras",))
    if not isinstance(config, dict):
        raise ValueError(f"{where}: initializer config must be a dict, got {type(config).__name__}")
    # Keras 3.x added fan axes to the variance-scaling family; None is the classic behaviour dnnbind has
    config = {k: v for k, v in config.items() if not (k in ("input_axes", "output_axes") and v is None)}
    return {"class_name": class_name, "config": config}


def _activation_from_keras(value: Any, where: str) -> Any:
    if isinstance(value, dict) and value.get("class_name") == "function" and isinstance(value.get("config"), str):
        value = value["config"]
    if value is not None and not isinstance(value, (str, dict)):
        raise ValueError(f"{where}: activation must be a Keras activation name or object, got {str(value)[:200]}")
    return value


def _drop_keras_only(config: dict, table: dict, where: str) -> dict:
    out = {}
    for key, value in config.items():
        if key in table:
            allowed = table[key]
            if allowed is not _ANY and value != allowed:
                raise ValueError(f"{where}: {key}={value!r} is not supported by dnnbind (only {allowed!r})")
            continue
        out[key] = value
    return out


def _is_custom_entry(entry: Any) -> bool:
    """Whether a serialized object names one of the user's classes (a module outside Keras, or a registered
    name other than its class name), as Keras writes them."""
    if not isinstance(entry, dict):
        return False
    module, registered = entry.get("module"), entry.get("registered_name")
    return (isinstance(module, str) and not module.startswith("keras")) or \
        (registered is not None and registered != entry.get("class_name"))


def _entry_class(entry: dict) -> type:
    """The class a converted layer entry makes (the user's, through the registry, or dnnbind's)."""
    user_class = _keras_objects.find_custom_class(entry["class_name"], entry.get("registered_name"))
    return user_class if isinstance(user_class, type) else get_layer_class(entry["class_name"])


def _layer_from_keras(entry: Any, where: str) -> dict:
    registered = None
    if _is_custom_entry(entry) and isinstance(entry.get("class_name"), str) and "config" in entry:
        class_name, config, registered = entry["class_name"], entry["config"], entry.get("registered_name")
        user_class = _keras_objects.find_custom_class(class_name, registered)
        if not (isinstance(user_class, type) and issubclass(user_class, Layer)):
            key = registered or class_name
            raise ValueError(f"{where}: {class_name!r} (module {entry.get('module')!r}, registered_name "
                             f"{registered!r}) is a custom layer that is not registered: decorate its class with "
                             f"@keras.saving.register_keras_serializable(), or load with custom_objects="
                             f"{{'{key}': {class_name}}}")
    else:
        class_name, config = _check_keras_object(entry, where, ("keras",))
        try:
            get_layer_class(class_name)
        except ValueError as exc:
            raise ValueError(f"{where}: Keras layer {class_name!r} is not supported by dnnbind ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{where}: config of {class_name!r} must be a dict, got {type(config).__name__}")
    where = f"{where} ({class_name} '{config.get('name')}')"
    config = _drop_keras_only(config, _KERAS_ONLY_KEYS, where)
    if class_name == "InputLayer":
        batch_shape = config.pop("batch_shape", None)
        if batch_shape is None:
            batch_shape = config.pop("batch_input_shape", None)
        if not isinstance(batch_shape, list) or not batch_shape:
            raise ValueError(f"{where}: batch_shape must be a list [batch, *shape], got {batch_shape!r}")
        dtype = config.pop("dtype", None)
        if isinstance(dtype, dict):
            dtype = _policy_from_keras(dtype, where)
        return {"class_name": "InputLayer", "config": {**config, "shape": batch_shape[1:],
                                                       "batch_size": batch_shape[0], "dtype": dtype}}
    if "dtype" in config:
        config["dtype"] = _policy_from_keras(config["dtype"], where)
    for key, value in list(config.items()):
        if key.endswith("_initializer"):
            config[key] = _initializer_from_keras(value, f"{where}: {key}")
    for key in ("activation", "recurrent_activation"):
        if key in config:
            config[key] = _activation_from_keras(config[key], where)
    for key in _NESTED_LAYER_KEYS:
        if config.get(key) is not None:
            config[key] = _layer_from_keras(config[key], f"{where}: {key}")
    if isinstance(config.get("cells"), list):
        config["cells"] = [_layer_from_keras(c, f"{where}: cells") for c in config["cells"]]
    if registered is not None:
        return {"class_name": class_name, "registered_name": registered, "config": config}
    return {"class_name": class_name, "config": config}


def model_from_keras(config: Any) -> tuple[str, dict]:
    """``(class name, config)`` for dnnbind's ``from_config`` from a Keras 3 ``config.json``: a Sequential
    or a functional model."""
    class_name, model_config = _check_keras_object(config, "config.json", ("keras",))
    if not isinstance(model_config, dict) or not isinstance(model_config.get("layers"), list):
        raise ValueError(f"config.json: a {class_name} config must hold a 'layers' list")
    if class_name == "Sequential":
        return "Sequential", _sequential_from_keras(config, model_config)
    if class_name in ("Functional", "Model") and "input_layers" in model_config:
        return "Functional", _functional_from_keras(model_config)
    raise ValueError(f"config.json: model class {class_name!r} is not supported (dnnbind reads Keras Sequential "
                     "and functional models; a subclassed model is rebuilt by its own code, then load_weights)")


def _sequential_from_keras(config: dict, model_config: dict) -> dict:
    where = f"config.json: Sequential '{model_config.get('name')}'"
    layers = [_layer_from_keras(entry, f"{where} layers[{i}]") for i, entry in enumerate(model_config["layers"])]
    out = {"name": model_config.get("name"), "trainable": model_config.get("trainable", True), "layers": layers}
    build_shape = model_config.get("build_input_shape")
    if build_shape is None and isinstance(config.get("build_config"), dict):
        build_shape = config["build_config"].get("input_shape")
    if build_shape is not None:
        out["build_input_shape"] = build_shape
    return out


def _is_ref(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 3 and isinstance(value[0], str)


def _refs_from_keras(value: Any, key: str) -> tuple[list, list | None]:
    """Keras's ``input_layers``/``output_layers`` (a ref, a list or a dict of refs) as ``(refs, names)``; a bare
    ref stays bare (the model takes or gives one bare tensor)."""
    if _is_ref(value):
        return value, None
    if isinstance(value, dict) and all(_is_ref(v) for v in value.values()):
        return list(value.values()), list(value)
    if isinstance(value, list) and value and all(_is_ref(v) for v in value):
        return value, None
    raise ValueError(f"config.json: {key} must be a [layer, node, tensor] ref, a list or a dict of them, got "
                     f"{str(value)[:200]}")


def _call_default(entry: dict, argument: str) -> Any:
    """The default of ``argument`` in the layer class's ``call`` (None when it has none)."""
    try:
        parameter = inspect.signature(_entry_class(entry).call).parameters.get(argument)
    except (ValueError, TypeError):
        return None
    return None if parameter is None or parameter.default is inspect.Parameter.empty else parameter.default


def _functional_from_keras(model_config: dict) -> dict:
    where = f"config.json: Functional '{model_config.get('name')}'"
    layers = []
    for i, entry in enumerate(model_config["layers"]):
        converted = _layer_from_keras(entry, f"{where} layers[{i}]")
        nodes = entry.get("inbound_nodes", [])
        if not isinstance(nodes, list):
            raise ValueError(f"{where} layers[{i}]: inbound_nodes must be a list, got {str(nodes)[:200]}")
        default_training = _call_default(converted, "training")
        for node in nodes:
            kwargs = node.get("kwargs") if isinstance(node, dict) else None
            if kwargs and default_training is not None and kwargs.get("training", None) == default_training:
                # Keras records the default it resolved (True for its augmentation layers); a model's
                # own training= overrides it in both, so the node is the same without it
                kwargs = {k: v for k, v in kwargs.items() if k != "training"}
                node["kwargs"] = kwargs
            if kwargs and any(v is not None for v in kwargs.values()) and not _takes_call_kwargs(
                    converted, kwargs):
                raise ValueError(f"{where} layers[{i}] ('{entry.get('name')}'): call arguments {kwargs} are not "
                                 "supported by dnnbind")
        converted["name"] = entry.get("name", converted["config"].get("name"))
        converted["inbound_nodes"] = nodes
        layers.append(converted)
    inputs, input_names = _refs_from_keras(model_config.get("input_layers"), "input_layers")
    outputs, output_names = _refs_from_keras(model_config.get("output_layers"), "output_layers")
    out = {"name": model_config.get("name"), "trainable": model_config.get("trainable", True), "layers": layers,
           "input_layers": inputs, "output_layers": outputs}
    if input_names is not None:
        out["input_names"] = input_names
    if output_names is not None:
        out["output_names"] = output_names
    return out


def _takes_call_kwargs(entry: dict, kwargs: dict) -> bool:
    """Whether a layer of ``class_name`` is called in ``keras.ops`` (not one of dnnbind's forward/backward
    layers) and its ``call`` names every key of ``kwargs`` (``MultiHeadAttention``'s ``use_causal_mask``):
    then the functional graph passes them on, as Keras does."""
    cls = _entry_class(entry)
    if cls._is_legacy():
        return False
    params = inspect.signature(cls.call).parameters
    return all(isinstance(k, str) and k in params and k not in ("self", "training") for k in kwargs)


def compile_config_from_keras(compile_config: Any) -> dict | None:
    """dnnbind's compile arguments (``{"optimizer", "loss", "metrics", "loss_weights", "weighted_metrics"}`` as
    dnnbind identifiers) for a Keras
    ``compile_config``; ValueError when dnnbind cannot reproduce it."""
    if not compile_config:
        return None
    if not isinstance(compile_config, dict):
        raise ValueError(f"compile_config must be a dict, got {type(compile_config).__name__}")
    loss_weights = compile_config.get("loss_weights")
    if loss_weights is not None and not isinstance(loss_weights, (int, float, list, dict)):
        raise ValueError(f"compile_config: loss_weights must be a number, list or dict, got {str(loss_weights)[:200]}")
    optimizer = compile_config.get("optimizer")
    if isinstance(optimizer, dict):
        class_name, config = _check_keras_object(optimizer, "compile_config: optimizer", ("keras",))
        config = _drop_keras_only(dict(config), _OPTIMIZER_KERAS_ONLY, f"compile_config: optimizer {class_name}")
        lr = config.get("learning_rate")
        if isinstance(lr, dict):
            lr_class, lr_config = _check_keras_object(lr, "compile_config: learning_rate", ("keras",))
            config["learning_rate"] = {"class_name": lr_class, "config": lr_config}
        optimizer = {"class_name": class_name, "config": config}

    def one_loss(loss: Any, where: str) -> Any:
        if isinstance(loss, dict):
            class_name, config = _check_keras_object(loss, where, ("keras",))
            return {"class_name": class_name,
                    "config": _drop_keras_only(dict(config), _LOSS_KERAS_ONLY, f"{where} {class_name}")}
        if not isinstance(loss, str):
            raise ValueError(f"{where} must be a Keras loss name or object, got {str(loss)[:200]}")
        return loss

    def metric_list(metrics: Any, where: str) -> list:
        if not isinstance(metrics, list):
            raise ValueError(f"{where} must be a list, got {str(metrics)[:200]}")
        out = []
        for i, metric in enumerate(metrics):
            if isinstance(metric, dict):
                class_name, config = _check_keras_object(metric, f"{where}[{i}]", ("keras",))
                metric = {"class_name": class_name, "config": _drop_keras_only(dict(config), {"dtype": _ANY}, "metric")}
            out.append(metric)
        return out

    # several outputs: a list of losses (None: no loss for that output) or a dict keyed by output name
    loss = compile_config.get("loss")
    if isinstance(loss, list):
        loss = [None if entry is None else one_loss(entry, f"compile_config: loss[{i}]")
                for i, entry in enumerate(loss)]
    elif isinstance(loss, dict) and "class_name" not in loss:
        loss = {name: None if entry is None else one_loss(entry, f"compile_config: loss['{name}']")
                for name, entry in loss.items()}
    else:
        loss = one_loss(loss, "compile_config: loss")
    def metric_groups(key: str) -> Any:
        metrics = compile_config.get(key) or []
        if isinstance(metrics, dict):
            return {name: metric_list(group or [], f"compile_config: {key}['{name}']")
                    for name, group in metrics.items()}
        return metric_list(metrics, f"compile_config: {key}")

    weighted = metric_groups("weighted_metrics")
    return {"optimizer": optimizer, "loss": loss, "metrics": metric_groups("metrics"), "loss_weights": loss_weights,
            "weighted_metrics": weighted or None}
