"""Plain convolutions as cuDNN graph plans (kernels/_cuda/conv_graph.py) on the GPU: forward, backward data
and backward filter against the legacy calls and the NumPy reference per precision, the per-key choice
(heuristic and measured), config.deterministic, and a CUDA-graph capture replayed with new inputs."""

from __future__ import annotations

import numpy as np
import pytest

from dnnbind import cuda, kernels
from dnnbind.kernels import config
from dnnbind.kernels._cuda import conv_graph
from gpu_errlog import BF16, PRECISIONS, check, dev, host, poisoned, quantize
from testutil import random

pytestmark = pytest.mark.gpu

F16 = np.dtype(np.float16)

# (x (N, H, W, C), filters, kernel, stride, padding, graph expected): "graph expected" where cuDNN 9.19
# builds fp16/bf16 plain conv graphs for every direction (C and K multiples of 32, the 3x3 stride-1 and
# stride-2 convolutions of ResNets); elsewhere, and in float32, either path may run (numbers checked).
CASES = [
    pytest.param((2, 12, 12, 32), 32, 3, 1, "same", True, id="3x3-same-c32"),
    # "same" with stride 2 on an even size: (0, 1, 0, 1), done by pad2d / crop2d around the graph
    pytest.param((2, 10, 10, 32), 64, 3, 2, "same", True, id="3x3-s2-same-asym-c32"),
    pytest.param((2, 14, 14, 64), 32, 3, 2, "valid", True, id="3x3-s2-valid-c64"),
    # an even kernel under "same": (0, 1, 0, 1) again
    pytest.param((2, 9, 9, 16), 16, 2, 1, "same", False, id="2x2-same-asym-c16"),
    # a first layer: C = 3
    pytest.param((4, 16, 16, 3), 32, 3, 1, "same", False, id="3x3-same-c3"),
]
DIRECTIONS = ("forward", "backward_data", "backward_filter")


def _data(rng, x_shape, filters, kernel, stride, padding, dtype):
    x = quantize(random(rng, x_shape), dtype)
    w = quantize(random(rng, (filters, kernel, kernel, x_shape[3])), dtype)
    y_shape = kernels.conv2d_output_shape(x.shape, w.shape, stride=stride, padding=padding, layout="NHWC")
    dy = quantize(random(rng, y_shape), dtype)
    return x, w, dy


def _three(x, w, dy, dtype, **kw):
    """The three ops on the GPU, each into a NaN-poisoned output."""
    xd, wd, dyd = dev(x, dtype), dev(w, dtype), dev(dy, dtype)
    return (kernels.conv2d_forward(xd, wd, out=poisoned(dy.shape, dtype), **kw),
            kernels.conv2d_backward_data(dyd, wd, x.shape, out=poisoned(x.shape, dtype), **kw),
            kernels.conv2d_backward_filter(xd, dyd, w.shape, out=poisoned(w.shape, dtype), **kw))


def _references(x, w, dy, **kw):
    return (kernels.conv2d_forward(x, w, **kw), kernels.conv2d_backward_data(dy, w, x.shape, **kw),
            kernels.conv2d_backward_filter(x, dy, w.shape, **kw))


def _graph_calls() -> "dict[str, int]":
    return {d: counts["graph"] for d, counts in conv_graph.stats().items()}


def _seen_by_cudnn(x_shape, kernel, stride, padding):
    """x's shape and the descriptor padding as the key holds them: Keras "same" puts the extra row and
    column at the bottom and right, and conv.py pads such asymmetric cases with pad2d first."""
    if padding == "valid":
        return tuple(x_shape), (0, 0)
    n, h, w, c = x_shape
    pads = []
    for size in (h, w):
        total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
        pads.append((total // 2, total - total // 2))
    if all(a == b for a, b in pads):
        return tuple(x_shape), (pads[0][0], pads[1][0])
    return (n, h + sum(pads[0]), w + sum(pads[1]), c), (0, 0)


def _choice(direction, dtype, x_shape, w_shape, stride, padding, allow_tf32=True, benchmark=False):
    seen, pad = _seen_by_cudnn(x_shape, w_shape[1], stride, padding)
    hits = [(k, c) for k, c in conv_graph.cache_info().items()
            if (k.direction, k.dtype, k.x_shape, k.w_shape, k.pad, k.stride, k.allow_tf32, k.benchmark)
            == (direction, dtype, seen, tuple(w_shape), pad, (stride, stride), allow_tf32, benchmark)]
    assert len(hits) == 1, (direction, seen, pad, hits)
    return hits[0]


@pytest.mark.parametrize("label, dtype, overrides", PRECISIONS)
@pytest.mark.parametrize("x_shape, filters, kernel, stride, padding, expected", CASES)
def test_graph_matches_legacy_and_numpy(rng, label, dtype, overrides, x_shape, filters, kernel, stride, padding,
                                        expected):
    """Graph plans (fused_graphs on) and legacy calls (off) both match the float64 reference and each other;
    float32 with TF32 off at 1e-5 also shows that allow_tf32=False keeps TF32 engines out."""
    x, w, dy = _data(rng, x_shape, filters, kernel, stride, padding, dtype)
    kw = dict(stride=stride, padding=padding, layout="NHWC")
    case = f"x{x_shape} k{kernel} s{stride} {padding}"
    refs = _references(x, w, dy, **kw)
    with config.override(**overrides):
        before = _graph_calls()
        on = _three(x, w, dy, dtype, **kw)
        taken = {d: _graph_calls()[d] - before[d] for d in DIRECTIONS}
        with config.override(fused_graphs=False):
            before_off = _graph_calls()
            off = _three(x, w, dy, dtype, **kw)
            assert _graph_calls() == before_off  # off: never a plan
    allow_tf32 = overrides.get("allow_tf32", True)
    for direction, a, b, ref in zip(DIRECTIONS, on, off, refs):
        _, choice = _choice(direction, dtype, x.shape, w.shape, stride, padding, allow_tf32)
        assert taken[direction] == (1 if choice.path == "graph" else 0), (direction, taken, choice)
        if expected and label in ("float16", "bfloat16"):
            assert choice.path == "graph" and choice.source == "heuristic", (direction, choice)
        where = f"{case} [{choice.path}]"
        check(f"conv2d_{direction}[conv graph]", label, a, ref, where)
        check(f"conv2d_{direction}[legacy]", label, b, ref, where)
        check(f"conv2d_{direction}[graph vs legacy]", label, a, host(b), where)


def test_graph_plans_repeat_and_are_taken_for_bf16(rng):
    """No silent fallback: bf16 NHWC 3x3 C=64 runs all three directions as plans, twice, with the same
    numbers each time in the forward and within tolerance in the backward."""
    x, w, dy = _data(rng, (8, 16, 16, 64), 64, 3, 1, "same", BF16)
    kw = dict(stride=1, padding="same", layout="NHWC")
    before = _graph_calls()
    first = _three(x, w, dy, BF16, **kw)
    second = _three(x, w, dy, BF16, **kw)
    assert {d: _graph_calls()[d] - before[d] for d in DIRECTIONS} == dict.fromkeys(DIRECTIONS, 2)
    for direction, a, b, ref in zip(DIRECTIONS, first, second, _references(x, w, dy, **kw)):
        check(f"conv2d_{direction}[conv graph]", "bfloat16", a, ref)
        check(f"conv2d_{direction}[conv graph, again]", "bfloat16", b, ref)
    assert np.array_equal(host(first[0]), host(second[0]))


def test_benchmark_times_the_plans_and_the_legacy_path_once_per_key(rng):
    x, w, dy = _data(rng, (3, 14, 14, 32), 48, 3, 1, "same", BF16)
    kw = dict(stride=1, padding="same", layout="NHWC")
    refs = _references(x, w, dy, **kw)
    with config.override(benchmark=True):
        decided = {d: c["decided"] for d, c in conv_graph.stats().items()}
        for _ in range(3):
            for direction, got, ref in zip(DIRECTIONS, _three(x, w, dy, BF16, **kw), refs):
                check(f"conv2d_{direction}[benchmark]", "bfloat16", got, ref)
    for direction in DIRECTIONS:
        assert conv_graph.stats()[direction]["decided"] - decided[direction] == 1
        _, choice = _choice(direction, BF16, x.shape, w.shape, 1, "same", benchmark=True)
        assert choice.source == "benchmark", choice
        labels = [label for label, _ in choice.timings]
        assert labels[-1] == "legacy" and 2 <= len(labels) <= 3 and all(ms > 0 for _, ms in choice.timings), choice
        plan_ms = [ms for _, ms in choice.timings[:-1]]
        assert choice.graph_ms == min(plan_ms) and choice.legacy_ms == choice.timings[-1][1]
        # the decision rule: a plan within GRAPH_MARGIN (2%) of the legacy time is a tie the plan wins
        assert choice.path == ("graph" if choice.graph_ms <= choice.legacy_ms * conv_graph.GRAPH_MARGIN
                               else "legacy"), choice
        if choice.path == "graph":
            assert choice.plan.engine == labels[plan_ms.index(choice.graph_ms)]


def test_deterministic_keeps_every_direction_on_the_legacy_algorithms(rng):
    x, w, dy = _data(rng, (4, 12, 12, 32), 32, 3, 1, "same", F16)
    kw = dict(stride=1, padding="same", layout="NHWC")
    with config.override(deterministic=True):
        before = _graph_calls()
        first = _three(x, w, dy, F16, **kw)
        second = _three(x, w, dy, F16, **kw)
        taken = {d: _graph_calls()[d] - before[d] for d in DIRECTIONS}
    assert taken["forward"] == taken["backward_data"] == taken["backward_filter"] == 0, taken
    for direction, a, b, ref in zip(DIRECTIONS, first, second, _references(x, w, dy, **kw)):
        check(f"conv2d_{direction}[deterministic]", "float16", a, ref)
        assert np.array_equal(host(a), host(b)), direction


def test_plans_are_captured_and_replay_with_new_inputs(rng):
    dtype = BF16
    x, w, dy = _data(rng, (4, 12, 12, 32), 32, 3, 1, "same", dtype)
    x2, dy2 = quantize(random(rng, x.shape), dtype), quantize(random(rng, dy.shape), dtype)
    kw = dict(stride=1, padding="same", layout="NHWC")
    stream = cuda.Stream()
    xd, wd, dyd = (cuda.to_device(np.asarray(a).astype(dtype), stream=stream) for a in (x, w, dy))
    outs = [cuda.empty(a.shape, dtype, stream=stream).fill_bytes(0xFF, stream=stream) for a in (dy, x, w)]
    y, dx, dw = outs

    def step():
        kernels.conv2d_forward(xd, wd, out=y, stream=stream, **kw)
        kernels.conv2d_backward_data(dyd, wd, x.shape, out=dx, stream=stream, **kw)
        kernels.conv2d_backward_filter(xd, dyd, w.shape, out=dw, stream=stream, **kw)

    step()  # eager: builds, decides and grows the stream's workspace
    stream.synchronize()
    before = conv_graph.stats()
    with cuda.capture(stream) as graph:
        step()
    after = conv_graph.stats()
    for direction in DIRECTIONS:
        assert after[direction]["graph"] - before[direction]["graph"] == 1, (direction, before, after)
        assert after[direction]["undecided_in_capture"] == before[direction]["undecided_in_capture"]
    assert not graph.outstanding_allocations
    xd.copy_from_host(np.asarray(x2).astype(dtype), stream=stream)
    dyd.copy_from_host(np.asarray(dy2).astype(dtype), stream=stream)
    for out in outs:  # poison again: the replay must write every element
        out.fill_bytes(0xFF, stream=stream)
    graph.launch(stream)
    stream.synchronize()
    replayed = [host(out) for out in outs]
    for direction, got, ref in zip(DIRECTIONS, replayed, _references(x2, w, dy2, **kw)):
        check(f"conv2d_{direction}[captured graph]", "bfloat16", got, ref)
    step()  # the same plans run eagerly on the same inputs
    stream.synchronize()
    for direction, got, eager in zip(DIRECTIONS, replayed, outs):
        check(f"conv2d_{direction}[captured vs eager]", "bfloat16", got, host(eager))
    graph.close()
