"""kernels.config switches and the backend dispatch rules."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from dnnbind import kernels
from dnnbind.kernels import config


def test_defaults_and_override_restores():
    assert config.get() == {"allow_tf32": True, "deterministic": False, "benchmark": False, "workspace_limit": None,
                            "fused_graphs": True, "fuse_layers": True}
    with config.override(allow_tf32=False, workspace_limit=1 << 20):
        assert config.allow_tf32 is False and config.get("workspace_limit") == 1 << 20
        with config.override(deterministic=True):
            assert config.get("deterministic") is True
        assert config.deterministic is False
    assert config.allow_tf32 is True and config.workspace_limit is None


def test_override_restores_on_error_and_rejects_bad_values():
    with pytest.raises(RuntimeError):
        with config.override(benchmark=True):
            raise RuntimeError("boom")
    assert config.benchmark is False
    with pytest.raises(AttributeError, match="no setting 'tf32'"):
        with config.override(tf32=False):
            pass
    with pytest.raises(TypeError, match="allow_tf32 must be True or False"):
        with config.override(allow_tf32=1):
            pass
    with pytest.raises(ValueError, match="workspace_limit must be None or a number of bytes"):
        with config.override(workspace_limit=-1):
            pass


def test_override_from_threads_restores():
    def work():
        for _ in range(100):
            with config.override(deterministic=True):
                pass

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert config.deterministic is False


def test_lists_are_accepted_as_numpy():
    y = kernels.dense_forward([[1.0, 2.0]], np.eye(2))
    assert isinstance(y, np.ndarray) and y.tolist() == [[1.0, 2.0]]
