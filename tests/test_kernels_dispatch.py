"""Backend routing of the public ops: what reaches dnnbind.kernels._cuda.<family>, and mixed-device errors.

A stand-in DeviceArray class and stand-in _cuda modules record the forwarded
calls, so the contract with the CUDA implementations is checked without a GPU.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from dnnbind import kernels
from dnnbind.kernels import _dispatch


class FakeDeviceArray:
    def __init__(self, shape, dtype=np.float32):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.ndim = len(self.shape)
        self.size = int(np.prod(self.shape))


@pytest.fixture
def fake_cuda(monkeypatch):
    calls = []

    def recorder(family):
        module = types.ModuleType(f"dnnbind.kernels._cuda.{family}")

        def __getattr__(name):
            def fn(*args, **kwargs):
                calls.append((family, name, args, kwargs))
                return "cuda-result"
            return fn

        module.__getattr__ = __getattr__
        return module

    for family in ("conv", "pooling", "activation", "optim", "losses", "elementwise"):
        monkeypatch.setitem(sys.modules, f"dnnbind.kernels._cuda.{family}", recorder(family))
    monkeypatch.setattr(_dispatch, "_cuda_modules", {})
    monkeypatch.setattr(_dispatch, "is_device_array", lambda x: isinstance(x, FakeDeviceArray))
    return calls


def test_conv_forward_forwards_normalised_params(fake_cuda):
    x = FakeDeviceArray((2, 6, 6, 3))
    w = FakeDeviceArray((4, 3, 3, 3))
    assert kernels.conv2d_forward(x, w, stride=2, padding="same", layout="nhwc") == "cuda-result"
    family, name, args, kwargs = fake_cuda[-1]
    assert (family, name) == ("conv", "conv2d_forward") and args == (x, w)
    assert kwargs == {"params": kernels.ConvParams(stride=(2, 2), pad=(0, 1, 0, 1), dilation=(1, 1), groups=1),
                      "layout": "NHWC", "out": None, "stream": None}


def test_pool_and_activation_forward(fake_cuda):
    x = FakeDeviceArray((2, 3, 5, 5))
    kernels.pool2d_forward(x, mode="average", window=3, stride=2, padding=1)
    _, name, args, kwargs = fake_cuda[-1]
    assert name == "pool2d_forward" and kwargs["params"] == kernels.PoolParams("avg", (3, 3), (2, 2), (1, 1, 1, 1))
    kernels.activation_forward(x, "LeakY_ReLU")
    _, name, args, kwargs = fake_cuda[-1]
    assert args == (x, "leaky_relu") and kwargs == {"alpha": 0.2, "out": None, "stream": None}


def test_optimizer_forwards_lists(fake_cuda):
    p = [FakeDeviceArray((3,))]
    kernels.adam_update(p, p, p, p, lr=0.1, step=FakeDeviceArray(()), weight_decay=0.004)
    _, name, args, kwargs = fake_cuda[-1]
    assert name == "adam_update" and all(isinstance(a, list) for a in args)
    assert kwargs["weight_decay"] == 0.004 and kwargs["vhat"] is None


def test_validation_still_runs_first(fake_cuda):
    with pytest.raises(ValueError, match="conv2d_forward: x has 3 channels but w expects 4"):
        kernels.conv2d_forward(FakeDeviceArray((2, 3, 5, 5)), FakeDeviceArray((8, 4, 3, 3)))
    assert fake_cuda == []


def test_mixing_devices_is_an_error(fake_cuda):
    x = FakeDeviceArray((2, 3, 5, 5))
    w = np.zeros((4, 3, 3, 3), np.float32)
    with pytest.raises(TypeError, match="conv2d_forward: x is a DeviceArray but w is a ndarray"):
        kernels.conv2d_forward(x, w)
    with pytest.raises(TypeError, match="conv2d_forward: x is a numpy.ndarray but w is a DeviceArray"):
        kernels.conv2d_forward(np.zeros((2, 3, 5, 5), np.float32), FakeDeviceArray((4, 3, 3, 3)))
    assert fake_cuda == []
