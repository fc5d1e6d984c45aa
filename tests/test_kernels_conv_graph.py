"""Plain convolutions as cuDNN graph plans (kernels/_cuda/conv_graph.py): the key, which calls are eligible,
the per-key choice and the dispatch from conv.py, with the stream, buffers, plan builder and legacy calls
faked (descriptors are real; no GPU). The numbers are checked on the GPU in test_kernels_conv_graph_gpu.py."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from dnnbind import kernels
from dnnbind.kernels import config
from testutil import FakeStream

pytest.importorskip("cuda.bindings")  # kernels._cuda imports the CUDA rooms at its top

try:  # the geometry's descriptors need libcudnn (not a GPU)
    from dnnbind import cudnn as _cudnn

    _cudnn.TensorDescriptor((1, 1, 1, 1), "float32").close()
except Exception as exc:  # pragma: no cover - reported by the cuDNN tests
    pytest.skip(f"cuDNN not loadable: {exc}", allow_module_level=True)

from dnnbind.cudnn.graph import GraphNotSupportedError  # noqa: E402
from dnnbind.errors import CudnnError  # noqa: E402
from dnnbind.kernels._cuda import _common as cm  # noqa: E402
from dnnbind.kernels._cuda import conv as cconv  # noqa: E402
from dnnbind.kernels._cuda import conv_graph  # noqa: E402

F16 = np.dtype(np.float16)
BF16 = cm.BF16


class _Dev:
    """What the CUDA conv code reads of a DeviceArray: shape, dtype, ptr."""

    def __init__(self, shape, ptr, dtype=F16):
        self.shape, self.dtype, self.ptr = tuple(shape), np.dtype(dtype), ptr


class _Plan:
    def __init__(self, log, mode="A", workspace_size=0, fail=None):
        self.log, self.workspace_size, self.fail = log, workspace_size, fail
        self.engine = f"{mode} #0 (engine {ord(mode)})"

    def execute(self, tensors, workspace=None, *, handle=None):
        self.log.append(("execute", self.engine[0], dict(tensors), workspace))
        if self.fail is not None:
            raise self.fail


def _handle():
    from dnnbind import cudnn

    handle = cudnn.Handle.__new__(cudnn.Handle)
    handle._adopt(0x99, lambda ptr: 0, owned=False)  # a borrowed made-up pointer, never passed to cuDNN
    return handle


@pytest.fixture
def path(monkeypatch):
    """Returns (log, stream, plans): plans[mode] is what building heuristics ``mode``'s plan returns (a
    plan) or raises (an exception). The legacy call, pad2d, crop2d and the workspace are logged."""
    log, stream = [], FakeStream()
    plans = {"A": _Plan(log, "A"), "B": _Plan(log, "B")}

    def build(key, handle, mode):
        log.append(("build", mode, key.direction))
        if isinstance(plans[mode], Exception):
            raise plans[mode]
        return plans[mode]

    def legacy(direction, g, s, handle, buffers, function, call):
        log.append(("legacy", direction, buffers))

    monkeypatch.setattr(cm, "stream_of", lambda s: stream)
    monkeypatch.setattr(cm, "cudnn_handle", lambda s: _handle())
    monkeypatch.setattr(cm, "output", lambda out, shape, dtype, s: _Dev(shape, 0x5000, dtype))
    monkeypatch.setattr(cm, "empty", lambda shape, dtype, s: _Dev(shape, 0x6000, dtype))
    monkeypatch.setattr(cconv, "pad_nchw", lambda x, dims, pad, layout, value, s: log.append(("pad", pad)) or
                        _Dev((dims[0], dims[2] + pad[0] + pad[1], dims[3] + pad[2] + pad[3], dims[1]), 0x7000,
                             x.dtype))
    monkeypatch.setattr(cconv, "crop_nchw", lambda xp, dims, pad, layout, out, s: log.append(("crop", xp.ptr, out.ptr)))
    monkeypatch.setattr(cconv, "_legacy_run", legacy)
    monkeypatch.setattr(conv_graph, "_build", build)
    monkeypatch.setattr(conv_graph, "workspace", lambda s, n: 0x9000 if n else 0)
    monkeypatch.setattr(conv_graph, "_CHOICES", conv_graph.Choices(tuple(conv_graph.DIRECTIONS)))
    return log, stream, plans


def _params(pad=(1, 1, 1, 1), stride=(1, 1), groups=1):
    return kernels.ConvParams(stride=stride, pad=pad, dilation=(1, 1), groups=groups)


def _forward(x_shape=(2, 6, 6, 32), k=32, kernel=3, layout="NHWC", dtype=F16, x_ptr=0x1000, **kw):
    c = x_shape[3] if layout == "NHWC" else x_shape[1]
    params = _params(**kw)
    cg = c // params.groups
    w_shape = (k, kernel, kernel, cg) if layout == "NHWC" else (k, cg, kernel, kernel)
    return cconv.conv2d_forward(_Dev(x_shape, x_ptr, dtype), _Dev(w_shape, 0x2000, dtype), params=params,
                                layout=layout)


def _backward_data(x_shape=(2, 6, 6, 32), k=32, dtype=F16, **kw):
    params = _params(**kw)
    y_shape = kernels.conv2d_output_shape(x_shape, (k, 3, 3, x_shape[3]), stride=params.stride, padding=params.pad,
                                      layout="NHWC")
    return cconv.conv2d_backward_data(_Dev(y_shape, 0x3000, dtype), _Dev((k, 3, 3, x_shape[3]), 0x2000, dtype),
                                      x_shape, params=params, layout="NHWC")


def _backward_filter(x_shape=(2, 6, 6, 32), k=32, dtype=F16, **kw):
    params = _params(**kw)
    w_shape = (k, 3, 3, x_shape[3])
    y_shape = kernels.conv2d_output_shape(x_shape, w_shape, stride=params.stride, padding=params.pad, layout="NHWC")
    return cconv.conv2d_backward_filter(_Dev(x_shape, 0x1000, dtype), _Dev(y_shape, 0x3000, dtype), w_shape,
                                        params=params, layout="NHWC")


# ------------------------------------------------------------------------------------------- the key

KEY_ARGS = ("forward", 0, (2, 32, 6, 6), (64, 32, 3, 3), (2, 64, 6, 6), (1, 1), (1, 1), (1, 1), 1, F16, "NHWC")


def test_key_fields_follow_the_call_and_the_config():
    key = conv_graph.conv_key(*KEY_ARGS)
    assert (key.direction, key.x_shape, key.w_shape, key.y_shape, key.pad, key.stride, key.dtype) == (
        "forward", (2, 6, 6, 32), (64, 3, 3, 32), (2, 6, 6, 64), (1, 1), (1, 1), F16)
    assert (key.allow_tf32, key.benchmark, key.workspace_limit) == (True, False, None)
    assert key == conv_graph.conv_key(*KEY_ARGS) and hash(key) == hash(conv_graph.conv_key(*KEY_ARGS))
    with config.override(allow_tf32=False):
        assert conv_graph.conv_key(*KEY_ARGS) != key and not conv_graph.conv_key(*KEY_ARGS).allow_tf32
    with config.override(benchmark=True):
        assert conv_graph.conv_key(*KEY_ARGS) != key and conv_graph.conv_key(*KEY_ARGS).benchmark
    with config.override(workspace_limit=0):
        assert conv_graph.conv_key(*KEY_ARGS).workspace_limit == 0
    directions = {conv_graph.conv_key(d, *KEY_ARGS[1:]) for d in conv_graph.DIRECTIONS}
    assert len(directions) == len(conv_graph.DIRECTIONS) == 5  # one key per direction


@pytest.mark.parametrize("direction", conv_graph.FUSED_BN_DIRECTIONS)
def test_conv_bn_keys_without_a_measurement_are_float16_only(monkeypatch, direction):
    """conv + genstats and dgrad + drelu + dbn_weight (conv_bn.py) are tried unmeasured in float16 only (the H200's
    bf16/TF32 engines lost to the unfused ops, or had none); config.benchmark measures every dtype; FORCE_GRAPH
    (tests) tries every dtype."""
    args = (direction,) + KEY_ARGS[1:-2]
    assert conv_graph.conv_key(*args, F16, "NHWC").direction == direction
    for dtype in (np.dtype(np.float32), BF16):
        assert conv_graph.conv_key(*args, dtype, "NHWC") is None
        with config.override(benchmark=True):
            assert conv_graph.conv_key(*args, dtype, "NHWC").benchmark
        monkeypatch.setattr(conv_graph, "FORCE_GRAPH", True)
        assert conv_graph.conv_key(*args, dtype, "NHWC") is not None
        monkeypatch.setattr(conv_graph, "FORCE_GRAPH", False)
    with config.override(deterministic=True):
        assert conv_graph.conv_key(*args, F16, "NHWC") is None
    assert conv_graph.DIRECTIONS["forward_genstats"][1] == ("x", "w", "y", "sum", "sq_sum")
    assert conv_graph.DIRECTIONS["backward_data_drelu_dbn"][1][:3] == ("dy", "w", "x")
    with pytest.raises(ValueError, match="direction must be one of"):
        conv_graph.conv_key("fprop", *KEY_ARGS[1:])


@pytest.mark.parametrize("index, value", [(10, "NCHW"), (8, 2), (9, np.dtype(np.float64)), (2, (0, 32, 6, 6)),
                                          (4, (2, 64, 0, 6))])
def test_no_key_where_no_graph_is_tried(index, value):
    args = list(KEY_ARGS)
    args[index] = value
    assert conv_graph.conv_key(*args) is None


def test_deterministic_keeps_every_direction_on_the_legacy_path():
    assert conv_graph.conv_key(*KEY_ARGS) is not None
    with config.override(deterministic=True):
        assert conv_graph.conv_key(*KEY_ARGS) is None
        assert conv_graph.conv_key("backward_data", *KEY_ARGS[1:]) is None
        assert conv_graph.conv_key("backward_filter", *KEY_ARGS[1:]) is None


@pytest.mark.parametrize("direction, op, bound", [
    ("forward", "conv_fprop", {"x": (4, 9, 9, 16), "w": (8, 3, 3, 16), "y": (4, 4, 4, 8)}),
    ("backward_data", "conv_dgrad", {"dy": (4, 4, 4, 8), "w": (8, 3, 3, 16), "dx": (4, 9, 9, 16)}),
    ("backward_filter", "conv_wgrad", {"x": (4, 9, 9, 16), "dy": (4, 4, 4, 8), "dw": (8, 3, 3, 16)})])
def test_graph_structure_per_direction(direction, op, bound):
    key = conv_graph.conv_key(direction, 0, (4, 16, 9, 9), (8, 16, 3, 3), (4, 8, 4, 4), (0, 0), (2, 2), (1, 1), 1,
                              F16, "NHWC")
    g = conv_graph._graph(key)
    assert [o.rsplit("_", 1)[0] for o in g.operations] == [op]
    tensors = {t.name: t for t in g.tensors}
    assert {n: t.shape for n, t in tensors.items()} == bound and not any(t.virtual for t in tensors.values())
    assert all(t.alignment == conv_graph.ALIGNMENT for t in tensors.values())
    assert g.io_dtype == F16 and g.compute_dtype == np.float32
    assert set(conv_graph.DIRECTIONS[direction][1]) == set(bound)


# ------------------------------------------------------------------------------------------ dispatch

def test_heuristic_choice_builds_mode_a_once_and_then_only_executes(path):
    log, _, _ = path
    y = _forward()
    assert y.shape == (2, 6, 6, 32)
    run = ("execute", "A", {"x": 0x1000, "w": 0x2000, "y": 0x5000}, 0)
    assert log == [("build", "A", "forward"), run, run]  # build, first (trial) run, the call's run
    log.clear()
    _forward()
    assert log == [run]
    (key, choice), = conv_graph.cache_info().items()
    assert key.direction == "forward" and choice.path == "graph" and choice.source == "heuristic"
    assert conv_graph.stats()["forward"] == {"graph": 2, "legacy": 0, "decided": 1, "undecided_in_capture": 0}
    _forward(x_shape=(4, 6, 6, 32))  # another shape: another key, decided on its own
    assert len(conv_graph.cache_info()) == 2


def test_backward_pointers_are_bound_by_role(path):
    log, _, _ = path
    _backward_data()
    assert log[-1] == ("execute", "A", {"dx": 0x5000, "w": 0x2000, "dy": 0x3000}, 0)
    _backward_filter()
    assert log[-1] == ("execute", "A", {"x": 0x1000, "dw": 0x5000, "dy": 0x3000}, 0)
    stats = conv_graph.stats()
    assert stats["backward_data"]["graph"] == stats["backward_filter"]["graph"] == 1
    assert stats["forward"]["graph"] == 0 and not any(c.path == "legacy" for c in conv_graph.cache_info().values())


def test_explicit_padding_graph_sees_the_padded_tensors(path):
    """'same' with stride 2 on an even size is (0, 1, 0, 1): pad2d first (forward and backward filter), and
    backward data writes the padded gradient and crops it, exactly as the legacy calls do."""
    log, _, _ = path
    kw = dict(x_shape=(2, 8, 8, 32), pad=(0, 1, 0, 1), stride=(2, 2))
    _forward(**kw)
    assert log[0] == ("pad", (0, 1, 0, 1)) and log[-1][2] == {"x": 0x7000, "w": 0x2000, "y": 0x5000}
    log.clear()
    _backward_data(**kw)
    assert log[-2][2] == {"dx": 0x6000, "w": 0x2000, "dy": 0x3000} and log[-1] == ("crop", 0x6000, 0x5000)
    log.clear()
    _backward_filter(**kw)
    assert log[0] == ("pad", (0, 1, 0, 1)) and log[-1][2] == {"x": 0x7000, "dw": 0x5000, "dy": 0x3000}
    for key in conv_graph.cache_info():
        assert key.x_shape == (2, 9, 9, 32) and key.pad == (0, 0) and key.y_shape == (2, 4, 4, 32)


@pytest.mark.parametrize("timed, path_", [({"A": 0.9, "B": 0.4, "legacy": 1.0}, "B"),
                                          ({"A": 0.5, "B": 0.7, "legacy": 1.0}, "A"),
                                          ({"A": 2.0, "B": 3.0, "legacy": 1.0}, "legacy")])
def test_benchmark_times_both_modes_and_the_legacy_path_once_per_key(path, monkeypatch, timed, path_):
    log, _, _ = path
    order = []

    def time_ms(fn, stream, reps):
        fn()  # runs the path, as the real timer does
        label = "legacy" if log[-1][0] == "legacy" else log[-1][1]
        order.append(label)
        return timed[label]

    monkeypatch.setattr(conv_graph, "time_ms", time_ms)
    with config.override(benchmark=True):
        _backward_filter()
        _backward_filter()
    assert order == ["A", "B", "legacy"]
    assert [e[1] for e in log if e[0] == "build"] == ["A", "B"]
    (key, choice), = conv_graph.cache_info().items()
    assert key.benchmark and choice.source == "benchmark" and choice.path == ("legacy" if path_ == "legacy" else "graph")
    assert choice.timings == (("A #0 (engine 65)", timed["A"]), ("B #0 (engine 66)", timed["B"]),
                              ("legacy", timed["legacy"]))
    assert choice.graph_ms == min(timed["A"], timed["B"]) and choice.legacy_ms == timed["legacy"]
    if path_ != "legacy":
        assert choice.plan.engine[0] == path_ and log[-1][:2] == ("execute", path_)
    else:
        assert log[-1][:2] == ("legacy", "backward_filter")
    stats = conv_graph.stats()["backward_filter"]
    assert stats["decided"] == 1 and stats["graph" if path_ != "legacy" else "legacy"] == 2


def test_benchmark_skips_a_refused_mode_and_times_the_other(path, monkeypatch):
    log, _, plans = path
    plans["A"] = GraphNotSupportedError("graph 'conv_fprop'", [("A #0", "CUDNN_STATUS_NOT_SUPPORTED", "")], {})
    monkeypatch.setattr(conv_graph, "time_ms", lambda fn, stream, reps: fn() or 0.5)
    with config.override(benchmark=True):
        _forward()
    (choice,) = conv_graph.cache_info().values()
    assert choice.path == "graph" and choice.plan.engine.startswith("B") and "heuristics A" in choice.reason
    assert [label for label, _ in choice.timings] == ["B #0 (engine 66)", "legacy"]


def test_refused_build_falls_back_silently_once_per_key(path, caplog):
    log, _, plans = path
    plans["A"] = GraphNotSupportedError("graph 'conv_dgrad'", [("A #0", "CUDNN_STATUS_NOT_SUPPORTED", "")], {})
    with caplog.at_level(logging.DEBUG, logger="dnnbind.kernels.conv_graph"):
        _backward_data()
        _backward_data()
    assert [e[0] for e in log] == ["build", "legacy", "legacy"]
    (choice,) = conv_graph.cache_info().values()
    assert choice.path == "legacy" and choice.source == "refused" and "NOT_SUPPORTED" in choice.reason
    records = [r for r in caplog.records if r.name == "dnnbind.kernels.conv_graph"]
    assert len(records) == 1 and records[0].levelno == logging.DEBUG
    assert conv_graph.stats()["backward_data"] == {"graph": 0, "legacy": 2, "decided": 1, "undecided_in_capture": 0}


def test_first_run_refused_falls_back(path):
    log, _, plans = path
    plans["A"] = _Plan(log, "A", fail=CudnnError(3000, "CUDNN_STATUS_NOT_SUPPORTED", "cudnnBackendExecute"))
    _forward()
    (choice,) = conv_graph.cache_info().values()
    assert choice.source == "refused" and "first run" in choice.reason
    assert [e[0] for e in log] == ["build", "execute", "legacy"]


def test_execution_error_raises_with_context_and_is_not_cached(path):
    log, _, plans = path
    plans["A"] = _Plan(log, "A", fail=CudnnError(5000, "CUDNN_STATUS_EXECUTION_FAILED", "cudnnBackendExecute"))
    with pytest.raises(CudnnError, match="EXECUTION_FAILED") as info:
        _backward_filter()
    assert info.value.context["layout"] == "NHWC" and info.value.context["x shape (N,C,H,W)"] == (2, 32, 6, 6)
    assert "cudnnConvolutionBackwardFilter as a cuDNN graph plan" in info.value.context["function"]
    assert not conv_graph.cache_info()


def test_workspace_limit_keeps_a_larger_plan_out(path):
    log, _, plans = path
    plans["A"] = _Plan(log, "A", workspace_size=1 << 20)
    with config.override(workspace_limit=1024):
        _forward()
    (choice,) = conv_graph.cache_info().values()
    assert choice.source == "workspace_limit" and "1048576 B" in choice.reason and log[-1][0] == "legacy"
    log.clear()
    _forward()  # no cap: another key; the plan runs with the stream's workspace
    assert log[-1] == ("execute", "A", {"x": 0x1000, "w": 0x2000, "y": 0x5000}, 0x9000)


@pytest.mark.parametrize("switch, ran, decided", [
    # fused_graphs off: never a plan, nothing decided
    (dict(fused_graphs=False), [("legacy", "forward"), ("legacy", "backward_data"), ("legacy", "backward_filter")],
     []),
    # deterministic: every direction on the legacy algorithms (they filter for determinism), no key
    (dict(deterministic=True), [("legacy", "forward"), ("legacy", "backward_data"), ("legacy", "backward_filter")],
     [])])
def test_config_switches_keep_calls_on_the_legacy_path(path, switch, ran, decided):
    log, _, _ = path
    with config.override(**switch):
        _forward()
        _backward_data()
        _backward_filter()
    assert [e[:2] for e in log if e[0] != "build"] == ran
    assert [k.direction for k in conv_graph.cache_info()] == decided


@pytest.mark.parametrize("case", [dict(layout="NCHW", x_shape=(2, 32, 6, 6)), dict(dtype=np.float64),
                                  dict(groups=2)])
def test_not_tried_where_it_does_not_apply(path, case):
    log, _, _ = path
    _forward(**case)
    assert log == [("legacy", "forward", (0x1000, 0x2000, 0x5000))] and not conv_graph.cache_info()


def test_undecided_key_while_capturing_runs_legacy_and_decides_later(path):
    log, stream, _ = path
    stream.capturing = True
    _forward()
    assert [e[0] for e in log] == ["legacy"] and not conv_graph.cache_info()
    assert conv_graph.stats()["forward"]["undecided_in_capture"] == 1
    stream.capturing = False
    _forward()  # eager: builds and decides
    stream.capturing = True
    log.clear()
    _forward()  # captured: runs the plan decided before, builds nothing
    assert log == [("execute", "A", {"x": 0x1000, "w": 0x2000, "y": 0x5000}, 0)]


def test_misaligned_pointer_runs_legacy_for_that_call_only(path):
    log, _, _ = path
    _forward(x_ptr=0x1008)
    assert [e[0] for e in log] == ["legacy"] and not conv_graph.cache_info()
    _forward()
    assert conv_graph.cache_info() and conv_graph.stats()["forward"]["graph"] == 1
    log.clear()
    _forward(x_ptr=0x1002)  # decided key, misaligned call: legacy for it alone
    assert [e[0] for e in log] == ["legacy"] and conv_graph.stats()["forward"]["legacy"] == 2


def test_the_key_is_memoised_on_the_geometry_per_config(path, monkeypatch):
    made = []
    real = conv_graph.conv_key
    monkeypatch.setattr(conv_graph, "conv_key", lambda *args: made.append(args[0]) or real(*args))
    for _ in range(3):
        _forward(x_shape=(2, 5, 7, 32))  # a shape no other test uses: a fresh geometry
    with config.override(allow_tf32=False):
        _forward(x_shape=(2, 5, 7, 32))
    assert made == ["forward", "forward"]
