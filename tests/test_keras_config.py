"""``keras.config`` and ``keras.backend`` after ``import dnnbind``: every public name of Keras 3.15.1 is
there (the list is checked against the installed Keras too), and the functions behave as Keras's:
clear_session's resets, get_uid, the dtype rules, the switches, set_backend."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dnnbind
import keras_aux
from dnnbind import backend, config, mixed_precision

ROOT = Path(__file__).resolve().parents[1]

# python tools/keras_api_names.py config backend (Keras 3.15.1)
KERAS_CONFIG = (
    "backend", "disable_flash_attention", "disable_interactive_logging", "disable_traceback_filtering",
    "dtype_policy", "enable_flash_attention", "enable_interactive_logging", "enable_traceback_filtering",
    "enable_unsafe_deserialization", "epsilon", "floatx", "image_data_format", "is_flash_attention_enabled",
    "is_interactive_logging_enabled", "is_nnx_enabled", "is_traceback_filtering_enabled", "max_epochs",
    "max_steps_per_epoch", "set_backend", "set_dtype_policy", "set_epsilon", "set_floatx",
    "set_image_data_format", "set_max_epochs", "set_max_steps_per_epoch",
)
KERAS_BACKEND = (
    "backend", "clear_session", "epsilon", "floatx", "get_uid", "image_data_format", "is_float_dtype",
    "is_int_dtype", "is_keras_tensor", "result_type", "set_epsilon", "set_floatx", "set_image_data_format",
    "standardize_dtype",
)


def _missing(module, names):
    return [n for n in names if not callable(getattr(module, n, None))]


def test_every_keras_config_and_backend_name_is_reachable_after_import_dnnbind():
    code = ("import dnnbind as keras\n"
            f"print([n for n in {KERAS_CONFIG!r} if not callable(getattr(keras.config, n, None))])\n"
            f"print([n for n in {KERAS_BACKEND!r} if not callable(getattr(keras.backend, n, None))])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    missing_config, missing_backend = proc.stdout.split("\n")[:2]
    assert missing_config == "[]", f"keras.config names missing from dnnbind.config: {missing_config}"
    assert missing_backend == "[]", f"keras.backend names missing from dnnbind.backend: {missing_backend}"
    assert not _missing(config, KERAS_CONFIG) and not _missing(backend, KERAS_BACKEND)
    assert sorted(config.__all__) == sorted(KERAS_CONFIG)


@pytest.mark.skipif(importlib.util.find_spec("keras") is None, reason="needs Keras installed (test extra)")
def test_the_name_lists_are_the_installed_keras_ones():
    keras_api_names = keras_aux.keras_api_names()
    for namespace, names in (("config", KERAS_CONFIG), ("backend", KERAS_BACKEND)):
        installed = sorted(alias for alias, _, _ in keras_api_names.public_names(namespace))
        assert installed == sorted(names), f"keras.{namespace} changed: update the lists (and dnnbind) for {installed}"


# ----- behaviour -------------------------------------------------------------------------------------------------
@pytest.fixture
def restore():
    yield
    backend.set_floatx("float32")
    backend.set_epsilon(1e-7)
    backend.set_image_data_format("channels_last")
    mixed_precision.set_global_policy("float32")
    config.set_max_epochs(None)
    config.set_max_steps_per_epoch(None)
    backend.clear_session()


def test_clear_session_resets_what_keras_resets(restore):
    import dnnbind.layers as layers

    backend.clear_session()
    first = [layers.Dense(2).name for _ in range(2)]
    assert first == ["dense", "dense_1"]
    assert backend.get_uid("dense") == 3  # the one table of names, as Keras's object_name_uids
    config.set_dtype_policy("mixed_float16")
    config.disable_interactive_logging()
    config.disable_traceback_filtering()
    config.disable_flash_attention()
    config.enable_unsafe_deserialization()
    config.set_max_epochs(2)
    backend.set_epsilon(1e-5)
    assert (config.is_interactive_logging_enabled(), config.is_traceback_filtering_enabled(),
            config.is_flash_attention_enabled(), config.in_safe_mode()) == (False, False, False, False)
    backend.clear_session(free_memory=False)
    assert layers.Dense(2).name == "dense" and backend.get_uid("dense") == 2
    assert config.dtype_policy().name == "float32"
    assert (config.is_interactive_logging_enabled(), config.is_traceback_filtering_enabled(),
            config.is_flash_attention_enabled(), config.in_safe_mode()) == (True, True, None, None)
    assert config.max_epochs() == 2 and backend.epsilon() == 1e-5  # settings, not session state (Keras too)


def test_get_uid_counts_per_prefix(restore):
    backend.clear_session()
    assert [backend.get_uid("x"), backend.get_uid("x"), backend.get_uid("y"), backend.get_uid()] == [1, 2, 1, 1]


def test_dtype_rules(restore):
    assert [backend.is_float_dtype(d) for d in ("float16", "bfloat16", "float64", "int32", "bool", float)] == \
        [True, True, True, False, False, True]
    assert [backend.is_int_dtype(d) for d in ("int8", "uint64", "float32", "bool", int)] == [True, True, False, False, True]
    assert backend.standardize_dtype(np.float16) == "float16" and backend.standardize_dtype("bf16") == "bfloat16"
    assert backend.result_type("float16", "int32") == "float16" and backend.result_type("int8", "uint8") == "int16"
    assert backend.result_type(np.ones(2, np.float16), 1.0) == "float16" and backend.result_type() == "float32"
    assert backend.result_type is dnnbind.ops.result_type
    backend.set_floatx("float64")  # weak floats follow the floatx (the promotion cache keys on it)
    assert backend.result_type(1.0) == "float64" and backend.result_type("int32", 1.0) == "float64"
    backend.set_floatx("float32")
    assert backend.result_type(1.0) == "float32"


def test_is_keras_tensor(restore):
    import dnnbind.layers as layers

    assert backend.is_keras_tensor(layers.Input((3,)))
    assert not backend.is_keras_tensor(np.ones(3)) and not backend.is_keras_tensor(dnnbind.ops.ones((3,)))


def test_config_settings_are_the_backend_ones(restore):
    config.set_floatx("float16")
    assert backend.floatx() == "float16" and config.floatx() == "float16"
    config.set_image_data_format("Channels_First")
    assert backend.image_data_format() == "channels_first"
    with pytest.raises(ValueError):
        config.set_image_data_format("nchw")
    with pytest.raises(ValueError):
        config.set_floatx("int32")
    config.set_dtype_policy(mixed_precision.Policy("mixed_bfloat16"))
    assert mixed_precision.global_policy().name == "mixed_bfloat16"
    with pytest.raises(ValueError, match="policy"):
        config.set_dtype_policy(3)
    config.set_max_steps_per_epoch(5)
    assert config.max_steps_per_epoch() == 5
    config.enable_flash_attention()
    assert config.is_flash_attention_enabled() is None
    assert config.is_nnx_enabled() is False and config.backend() == "dnnbind"
    config.set_backend("dnnbind")
    with pytest.raises(ValueError, match="own Keras backend"):
        config.set_backend("jax")


def test_max_epochs_come_from_the_environment_as_in_keras():
    code = "import dnnbind as keras; print(keras.config.max_epochs(), keras.config.max_steps_per_epoch())"
    env = {"KERAS_MAX_EPOCHS": "3", "KERAS_MAX_STEPS_PER_EPOCH": "7", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["3", "7"]

