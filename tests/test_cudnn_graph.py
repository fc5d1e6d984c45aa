"""The cuDNN graph API without a GPU: the binding against the header text, descriptors, the builder's
shape inference and its errors, and Plan.execute's argument checks (all before any C call)."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np
import pytest

from dnnbind._lib import cudnn_graph as G
from dnnbind.cudnn import graph as cg
from dnnbind.cudnn.graph import BackendDescriptor, Graph, Plan
from dnnbind.errors import CudnnError


def _header_text() -> str:
    try:
        import nvidia.cudnn  # noqa: F401 - only to find the wheel's include directory
    except ImportError:
        pytest.skip("the nvidia-cudnn wheel (with its headers) is not installed")
    import nvidia.cudnn as pkg
    for base in pkg.__path__:
        header = Path(base) / "include" / "cudnn_graph_v9.h"
        if header.exists():
            return header.read_text()
    pytest.skip("cudnn_graph_v9.h is not in the nvidia-cudnn wheel")


_PREFIX = {
    G.DescriptorType: ("CUDNN_BACKEND_", "_DESCRIPTOR"),
    G.AttributeName: ("CUDNN_ATTR_", ""),
    G.AttributeType: ("CUDNN_TYPE_", ""),
    G.PointwiseMode: ("CUDNN_POINTWISE_", ""),
    G.ResampleMode: ("CUDNN_RESAMPLE_", ""),
    G.PaddingMode: ("CUDNN_", ""),
    G.GenStatsMode: ("CUDNN_GENSTATS_", ""),
    G.BnFinalizeStatsMode: ("CUDNN_BN_FINALIZE_STATISTICS_", ""),
    G.HeurMode: ("CUDNN_HEUR_MODE_", ""),
    G.NormMode: ("CUDNN_", ""),
    G.NormFwdPhase: ("CUDNN_NORM_FWD_", ""),
    G.BehaviorNote: ("CUDNN_BEHAVIOR_NOTE_", ""),
    G.NumericalNote: ("CUDNN_NUMERICAL_NOTE_", ""),
}


@pytest.mark.parametrize("enum", list(_PREFIX), ids=lambda e: e.__name__)
def test_enum_values_match_the_header(enum):
    text = _header_text()
    values = {m.group(1): int(m.group(2)) for m in
              re.finditer(r"\b(CUDNN_[A-Za-z0-9_]+)\s*(?:CUDNN_DEPRECATED_ENUM\s*)?=\s*(-?\d+)", text)}
    head, tail = _PREFIX[enum]
    for member in enum:
        c_name = f"{head}{member.name}{tail}"
        assert c_name in values, f"{c_name} is not in cudnn_graph_v9.h"
        assert values[c_name] == member.value, f"{c_name} = {values[c_name]} in the header, {member.value} here"


def test_function_signatures_match_the_header():
    text = _header_text()
    for name, argtypes in {**G.SIGNATURES, **G.OPTIONAL_SIGNATURES}.items():
        match = re.search(rf"CUDNNWINAPI\s+{name}\s*\(([^)]*)\)", text)  # the declaration, not a comment
        assert match, f"{name} is not declared in cudnn_graph_v9.h"
        params = [p for p in match.group(1).split(",") if p.strip()]
        assert len(params) == len(argtypes), f"{name}: {len(params)} parameters in the header, {len(argtypes)} here"
    # int64_t elementCount / int64_t* elementCount: the binding passes 64-bit counts.
    assert G.SIGNATURES["cudnnBackendSetAttribute"][3] is ctypes.c_int64
    assert G.SIGNATURES["cudnnBackendGetAttribute"][4] is ctypes.POINTER(ctypes.c_int64)


def test_fraction_is_two_int64():
    assert ctypes.sizeof(G.Fraction) == 16
    assert G.ATTRIBUTE_CTYPE[G.AttributeType.BOOLEAN] is ctypes.c_bool


# ------------------------------------------------------------------------- descriptors


def _library_or_skip():
    try:
        G.library()
    except Exception as exc:  # LibraryNotFoundError, or an OSError from a broken install
        pytest.skip(f"libcudnn cannot be loaded: {exc}")


def test_descriptor_create_set_close_idempotent():
    _library_or_skip()
    d = BackendDescriptor(G.DescriptorType.TENSOR, "tensor 'x'")
    d.set(G.AttributeName.TENSOR_DIMENSIONS, G.AttributeType.INT64, [2, 3])
    assert d.handle and not d.closed and d.owned
    d.close()
    d.close()
    assert d.closed
    with pytest.raises(ValueError, match="closed"):
        d.handle  # noqa: B018 - the property raises once closed


def test_set_attribute_of_the_wrong_type_names_the_attribute():
    _library_or_skip()
    d = BackendDescriptor(G.DescriptorType.TENSOR, "tensor 'x'")
    with pytest.raises(CudnnError) as info:
        d.set(G.AttributeName.TENSOR_DIMENSIONS, G.AttributeType.FLOAT, [2.0])
    assert info.value.status == 2010  # CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE
    assert "TENSOR_DIMENSIONS of tensor 'x'" in str(info.value)
    d.close()


def _finalize_tensor(dims, strides, alignment=16):
    d = BackendDescriptor(G.DescriptorType.TENSOR, "tensor 't'")
    d.set(G.AttributeName.TENSOR_DATA_TYPE, G.AttributeType.DATA_TYPE, int(G.DataType.FLOAT))
    d.set(G.AttributeName.TENSOR_DIMENSIONS, G.AttributeType.INT64, dims)
    d.set(G.AttributeName.TENSOR_STRIDES, G.AttributeType.INT64, strides)
    d.set(G.AttributeName.TENSOR_UNIQUE_ID, G.AttributeType.INT64, 1)
    d.set(G.AttributeName.TENSOR_BYTE_ALIGNMENT, G.AttributeType.INT64, alignment)
    return d.finalize()


def test_tensor_finalize_and_read_back_or_the_sub_library_error():
    """Every backend finalize loads cuDNN's engine sub-libraries, which need the driver (libcuda): on a
    machine without one it fails with SUBLIBRARY_LOADING_FAILED, naming what was finalized; with a driver
    a tensor finalizes and reads back what was set."""
    _library_or_skip()
    try:
        d = _finalize_tensor([2, 8, 5, 5], [200, 1, 40, 8])
    except CudnnError as err:
        assert err.status == 1008, err  # CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED
        assert "finalizing: tensor 't' (TENSOR)" in str(err)
        return
    assert d.get(G.AttributeName.TENSOR_DIMENSIONS, G.AttributeType.INT64, 8) == [2, 8, 5, 5]
    assert d.get(G.AttributeName.TENSOR_STRIDES, G.AttributeType.INT64, 8) == [200, 1, 40, 8]
    with pytest.raises(CudnnError, match="finalizing: tensor 't'"):
        _finalize_tensor([2, 8], [8, 1], alignment=3)  # alignment not a multiple of the item size


# ------------------------------------------------------------------------- the builder


def test_conv_bias_relu_shapes_and_channels_last_strides():
    g = Graph(io_dtype="float16")
    x = g.tensor("x", (8, 17, 15, 16))
    w = g.tensor("w", (32, 3, 5, 16))
    b = g.tensor("b", (1, 1, 1, 32))
    y = g.conv_fprop(x, w, padding=((1, 1), (2, 2)), stride=(2, 1), dilation=1)
    assert y.shape == (8, 9, 15, 32) and y.dims == (8, 32, 9, 15)
    assert y.dim_strides == (9 * 15 * 32, 1, 15 * 32, 32) and y.virtual
    assert x.dims == (8, 16, 17, 15) and x.dim_strides == (17 * 15 * 16, 1, 15 * 16, 16)
    out = g.relu(g.bias(y, b)).output("y")
    assert not out.virtual and out.dtype is None
    bound = g._resolve()
    assert [t.name for t in bound] == ["x", "w", "b", "y"]
    assert out.dtype == np.float16 and y.dtype == np.float32  # io vs intermediate
    assert g.operations == ("conv_fprop_0", "add_1", "relu_2")


def test_nchw_and_dilation_shapes():
    g = Graph(layout="NCHW")
    x = g.tensor("x", (2, 4, 10, 10))
    w = g.tensor("w", (6, 2, 3, 3))  # groups = 2
    y = g.conv_fprop(x, w, padding=2, dilation=2, stride=3)
    assert y.shape == (2, 6, 4, 4) and y.dim_strides == (96, 16, 4, 1)
    dx = g.conv_dgrad(g.tensor("dy", (2, 6, 4, 4)), w, (2, 4, 10, 10), padding=2, dilation=2, stride=3)
    assert dx.shape == (2, 4, 10, 10)
    dw = g.conv_wgrad(x, g.tensor("dy2", (2, 6, 4, 4)), (6, 2, 3, 3), padding=2, dilation=2, stride=3)
    assert dw.shape == (6, 2, 3, 3)


def test_matmul_pool_reduction_stats_shapes():
    g = Graph()
    c = g.matmul(g.tensor("a", (3, 5, 7)), g.tensor("b", (1, 7, 4)))
    assert c.shape == (3, 5, 4) and c.dim_strides == (20, 4, 1)
    x = g.tensor("x", (2, 9, 9, 8))
    assert g.resample(x, window=3, stride=2, padding=1).shape == (2, 5, 5, 8)
    y, idx = g.resample(x, window=2, return_index=True)
    assert y.shape == idx.shape == (2, 4, 4, 8) and idx.dtype == np.int8
    assert g.reduction(x, axes=(0, 1, 2)).shape == (1, 1, 1, 8)
    s, sq = g.genstats(x)
    assert s.shape == sq.shape == (1, 1, 1, 8) and s.dtype == np.float32
    outs = g.batchnorm(x, g.tensor("scale", (1, 1, 1, 8), "float32"), g.tensor("bias", (1, 1, 1, 8), "float32"))
    assert outs[0].shape == x.shape and outs[1].shape == (1, 1, 1, 8) and outs[3] is None
    eq = g.bn_finalize(s, sq, g.tensor("s2", (1, 1, 1, 8), "float32"), g.tensor("b2", (1, 1, 1, 8), "float32"),
                       accum_count=2 * 81)
    assert all(t.shape == (1, 1, 1, 8) for t in eq[:4]) and eq[4] is None


@pytest.mark.parametrize("build, match", [
    (lambda g: g.conv_fprop(g.tensor("x", (1, 5, 5, 3)), g.tensor("w", (4, 3, 3, 2))), "channels of x"),
    (lambda g: g.conv_fprop(g.tensor("x", (1, 5, 5, 4)), g.tensor("w", (4, 7, 7, 4))), "does not fit"),
    (lambda g: g.conv_dgrad(g.tensor("dy", (1, 5, 5, 4)), g.tensor("w", (4, 3, 3, 4)), (1, 5, 5, 4)),
     "dy must have shape"),
    (lambda g: g.matmul(g.tensor("a", (2, 3)), g.tensor("b", (4, 5))), "columns"),
    (lambda g: g.add(g.tensor("a", (1, 4, 4, 8)), g.tensor("b", (1, 4, 4, 3))), "do not broadcast"),
    (lambda g: g.pointwise("cube", g.tensor("a", (1, 4, 4, 8))), "mode must be one of"),
    (lambda g: g.relu(g.tensor("a", (1, 4, 4, 8)), alpha=0.1), "unknown parameter"),
    (lambda g: g.batchnorm(g.tensor("x", (2, 4, 4, 8)), g.tensor("s", (1, 1, 1, 4)), g.tensor("b", (1, 1, 1, 8))),
     "scale must have shape"),
    (lambda g: g.resample(g.tensor("x", (2, 4, 4, 8)), mode="avg", return_index=True), "return_index"),
    (lambda g: g.tensor("x", (2, 0, 4)), "shape must be >= 1"),
    (lambda g: g.tensor("x", (2, 4, 4, 8), "complex64"), "not supported"),
])
def test_bad_input_names_the_operation_and_argument(build, match):
    with pytest.raises((ValueError, TypeError), match=match):
        build(Graph())


def test_tensor_of_another_graph_and_duplicate_names_are_refused():
    g, h = Graph(), Graph()
    x = h.tensor("x", (1, 4, 4, 8))
    with pytest.raises(ValueError, match="belongs to another Graph"):
        g.relu(x)
    g.tensor("x", (1, 4, 4, 8))
    with pytest.raises(ValueError, match="already has a tensor named 'x'"):
        g.tensor("x", (1, 4, 4, 8))


def test_build_validates_before_any_c_call():
    g = Graph()
    with pytest.raises(ValueError, match="add at least one operation"):
        g.build()
    g.relu(g.tensor("x", (1, 4, 4, 8)))
    with pytest.raises(ValueError, match="no operation result is an output"):
        g.build()
    with pytest.raises(ValueError, match="heuristics modes"):
        g.build(heuristics=("Z",))
    g2 = Graph()
    x = g2.tensor("x", (1, 4, 4, 8))
    g2.relu(x).output("x")
    with pytest.raises(ValueError, match="two tensors are named 'x'"):
        g2.build()
    with pytest.raises(TypeError, match="bare int"):
        _relu_graph().build(handle=1234)


def _relu_graph():
    g = Graph()
    g.relu(g.tensor("x", (2, 4, 4, 8))).output("y")
    return g


def test_cache_key_covers_structure_not_scalar_values():
    def graph(factor, channels=8):
        g = Graph()
        g.scale(g.tensor("x", (2, 4, 4, channels)), factor).output("y")
        return g, g._resolve()

    (g1, b1), (g2, b2), (g3, b3) = graph(2.0), graph(3.0), graph(2.0, channels=16)
    assert g1._key(b1) == g2._key(b2)
    assert g1._key(b1) != g3._key(b3)


class _FakeCore:
    workspace_size = 1024
    engine = "A #0"
    plan = None


class _Array:
    def __init__(self, shape, dtype, ptr=1 << 20, strides=None):
        self.shape, self.dtype, self.ptr = shape, np.dtype(dtype), ptr
        self.strides = strides if strides is not None else np.empty(shape, dtype).strides
        self.nbytes = int(np.prod(shape)) * self.dtype.itemsize


def test_execute_checks_bindings_before_any_c_call():
    g = _relu_graph()
    plan = Plan(_FakeCore(), g, g._resolve())
    assert plan.names == ("x", "y") and plan.workspace_size == 1024
    x, y = _Array((2, 4, 4, 8), "float32"), _Array((2, 4, 4, 8), "float32")
    ws = _Array((1024,), "uint8")
    with pytest.raises(ValueError, match=r"missing \['y'\]"):
        plan.execute({"x": x}, workspace=ws)
    with pytest.raises(ValueError, match="must have shape"):
        plan.execute({"x": _Array((2, 4, 8, 4), "float32"), "y": y}, workspace=ws)
    with pytest.raises(ValueError, match="must be float32"):
        plan.execute({"x": _Array((2, 4, 4, 8), "float16"), "y": y}, workspace=ws)
    with pytest.raises(ValueError, match="byte strides"):
        plan.execute({"x": _Array((2, 4, 4, 8), "float32", strides=(4, 256, 64, 8)), "y": y}, workspace=ws)
    with pytest.raises(ValueError, match="aligned"):
        plan.execute({"x": _Array((2, 4, 4, 8), "float32", ptr=(1 << 20) + 4), "y": y}, workspace=ws)
    with pytest.raises(ValueError, match="needs a workspace of 1024"):
        plan.execute({"x": x, "y": y})
    with pytest.raises(ValueError, match="holds 16 bytes"):
        plan.execute({"x": x, "y": y}, workspace=_Array((16,), "uint8"))
    with pytest.raises(ValueError, match="needs a workspace of 1024 bytes .* the null pointer 0"):
        plan.execute({"x": x, "y": y}, workspace=0)


def test_plan_cache_info_counts_hits_and_misses_and_clear_empties_it():
    cg.clear_plan_cache()
    before = cg.plan_cache_info()
    assert before["size"] == 0
    core = _FakeCore()
    assert cg._plan_cache_get(("test", 1)) is None  # a miss
    cg._plan_cache_put(("test", 1), core)
    assert cg._plan_cache_get(("test", 1)) is core and cg._plan_cache_get(("test", 1)) is core  # two hits
    info = cg.plan_cache_info()
    assert info == {"hits": before["hits"] + 2, "misses": before["misses"] + 1, "size": 1}
    cg.clear_plan_cache()
    assert cg.plan_cache_info()["size"] == 0 and cg._plan_cache_get(("test", 1)) is None


def test_every_operation_sets_attributes_cuDNN_accepts(monkeypatch):
    """Each operation's descriptors take every attribute with the type cuDNN expects (a wrong attribute type
    is refused at set time, with no GPU). Finalize is stubbed: it needs the driver."""
    _library_or_skip()
    monkeypatch.setattr(BackendDescriptor, "finalize", lambda self: self)
    g = Graph(io_dtype="float16")
    x, w = g.tensor("x", (4, 8, 8, 32)), g.tensor("w", (32, 3, 3, 32))

    def pc(name):
        return g.tensor(name, (1, 1, 1, 32), "float32")

    y = g.conv_fprop(x, w, padding=1).output("y")
    g.conv_dgrad(y, w, x.shape, padding=1)
    g.conv_wgrad(x, y, w.shape, padding=1)
    g.relu_backward(g.scale(g.gelu(g.add(y, g.tensor("b", (1, 1, 1, 32)))), 0.5), x)
    g.matmul(g.tensor("a", (2, 4, 8)), g.tensor("bb", (2, 8, 4)))
    g.reduction(x, (0, 1, 2))
    s, sq = g.genstats(y)
    g.batchnorm(x, pc("g1"), pc("b1"), momentum=0.1, running_mean=pc("rm"), running_var=pc("rv"))
    g.batchnorm_backward(y, x, pc("g2"), pc("m2"), pc("i2"))
    g.bn_finalize(s, sq, pc("g3"), pc("b3"), accum_count=256, running_mean=pc("rm3"), running_var=pc("rv3"))
    g.dbn_weight(y, x, pc("m4"), pc("i4"), pc("g4"))
    yy, idx = g.resample(x, return_index=True)
    g.resample_backward(yy, index=idx, x_shape=x.shape)
    g.resample_backward(yy, x=x, y=yy, mode="avg")
    g._resolve()
    td = {t._index: cg._tensor_descriptor(t, t._index + 1) for t in g.tensors}
    kinds = {op.kind for op in g._ops}
    assert kinds == {"conv_fprop", "conv_dgrad", "conv_wgrad", "pointwise", "matmul", "reduction", "genstats",
                     "batchnorm", "batchnorm_backward", "bn_finalize", "dbn_weight", "resample_fwd", "resample_bwd"}
    descs = [cg._op_descriptors(op, td) for op in g._ops]
    assert all(d.handle for d in descs) and len(descs) == len(g.operations)


@pytest.mark.parametrize("mode", ["max", "avg"])
def test_bfloat16_resample_forward_without_index_is_refused_before_any_descriptor(mode, monkeypatch):
    """cuDNN 9.19's engine for it read and wrote bf16 as float32 (graph._refuse_known_wrong says how that was
    shown): build refuses it naming the version and the workaround, before a handle or a descriptor."""
    _library_or_skip()
    monkeypatch.setattr(cg, "get_handle", lambda *a: pytest.fail("the refusal must come before the handle"))
    g = Graph(io_dtype="bfloat16")
    g.resample(g.tensor("x", (2, 8, 8, 32)), mode=mode, window=2, stride=2).output("y")
    with pytest.raises(cg.GraphNotSupportedError, match=r"refused on cuDNN \d+\.\d+\.\d+: cuDNN 9\.19's engine") as info:
        g.build(cache=False)
    assert "float16 or float32" in str(info.value) and "pool2d_forward" in str(info.value)


def test_resample_forward_refusal_spares_float16_the_index_path_and_backward():
    _library_or_skip()
    for dtype in ("float16", "float32"):
        g = Graph(io_dtype=dtype)
        g.resample(g.tensor("x", (2, 8, 8, 32)), mode="avg").output("y")
        g._resolve()
        cg._refuse_known_wrong(g)
    g = Graph(io_dtype="bfloat16")
    y, idx = g.resample(g.tensor("x", (2, 8, 8, 32)), return_index=True)
    y.output("y")
    idx.output("index")
    g.resample_backward(g.tensor("dy", (2, 4, 4, 32)), x_shape=(2, 8, 8, 32), mode="avg").output("dx")
    g._resolve()
    cg._refuse_known_wrong(g)


def test_dgrad_drelu_dbn_weight_builds_cudnn_frontends_pattern(monkeypatch):
    """The operations and attributes of cudnn-frontend's 'Dgrad Drelu DBNweight Graph' sample: conv_dgrad, the
    batch-norm output recomputed as add(alpha2=-1), mul, mul, add, then relu_backward and dbn_weight, with
    float32 per-channel tensors in (C, 1, C, C) strides and float32 virtual intermediates."""
    _library_or_skip()
    monkeypatch.setattr(BackendDescriptor, "finalize", lambda self: self)
    g = Graph(io_dtype="float16")
    pc = [g.tensor(n, (1, 1, 1, 32), "float32") for n in ("mean", "inv", "gamma", "beta")]
    outs = g.dgrad_drelu_dbn_weight(g.tensor("dy", (4, 8, 8, 64)), g.tensor("w", (64, 3, 3, 32)),
                                    g.tensor("x", (4, 8, 8, 32)), *pc, padding=1)
    for t, n in zip(outs, ("dz", "dscale", "dbias", "eq_dy", "eq_x", "eq_b")):
        t.output(n)
    g._resolve()
    kinds = [(op.kind, op.params.get("mode"), op.params.get("alpha2")) for op in g._ops]
    assert kinds == [("conv_dgrad", None, None), ("pointwise", "add", -1.0), ("pointwise", "mul", None),
                     ("pointwise", "mul", None), ("pointwise", "add", None), ("pointwise", "relu_backward", None),
                     ("dbn_weight", None, None)]
    dz = outs[0]
    assert dz.shape == (4, 8, 8, 32) and dz.dtype == np.float16 and not dz.virtual
    assert all(t.dim_strides == (32, 1, 32, 32) and t.dtype == np.float32 for t in outs[1:])
    assert all(t.dtype == np.float32 for t in g.tensors if t.virtual)
    td = {t._index: cg._tensor_descriptor(t, t._index + 1) for t in g.tensors}
    descs = [cg._op_descriptors(op, td) for op in g._ops]  # every attribute accepted with its type
    assert len(descs) == 7


def test_graph_not_supported_lists_every_heuristics_mode(monkeypatch):
    """Each heuristics mode tried leaves a line in the error, an empty one too ('no results'); a graph with
    dbn_weight gets the hint naming the one pattern cuDNN runs it in."""
    _library_or_skip()
    monkeypatch.setattr(BackendDescriptor, "finalize", lambda self: self)
    monkeypatch.setattr(BackendDescriptor, "count", lambda self, name, attr_type: 0)
    real_set = BackendDescriptor.set

    def set_unless_it_needs_a_gpu(self, name, attr_type, values):
        # A handle (cuDNN reads it at once) and an unfinalized graph cannot be set without a GPU.
        if self.kind not in (G.DescriptorType.OPERATIONGRAPH, G.DescriptorType.ENGINEHEUR):
            real_set(self, name, attr_type, values)

    monkeypatch.setattr(BackendDescriptor, "set", set_unless_it_needs_a_gpu)
    g = Graph(io_dtype="float16")
    pc = [g.tensor(n, (1, 1, 1, 32), "float32") for n in ("mean", "inv", "gamma")]
    for t, n in zip(g.dbn_weight(g.tensor("dy", (4, 8, 8, 32)), g.tensor("x", (4, 8, 8, 32)), *pc),
                    ("dscale", "dbias", "eq_dy", "eq_x", "eq_b")):
        t.output(n)
    bound = g._resolve()

    class _Handle:
        handle = None  # never set: see set_unless_it_needs_a_gpu

    modes = cg._heur_modes(("A", "B", "fallback"))
    with pytest.raises(cg.GraphNotSupportedError) as info:
        cg._PlanCore.create(g, bound, _Handle(), modes, True)
    text = str(info.value)
    for mode in ("A", "B", "FALLBACK"):
        assert f"heuristics {mode}: no results" in text, text
    assert "dgrad_drelu_dbn_weight" in text
    assert [t[0] for t in info.value.tried] == ["heuristics A", "heuristics B", "heuristics FALLBACK"]


def test_graph_not_supported_message_keeps_every_mode_past_the_first_twelve_refusals():
    tried = [(f"A #{i}", "CUDNN_STATUS_NOT_SUPPORTED", "") for i in range(20)]
    tried += [("heuristics A", "exhausted", "20 engine configs, none finalized"),
              ("heuristics FALLBACK", "no results", "")]
    text = str(cg.GraphNotSupportedError("graph 'g'", tried, {}))
    assert "A #11" in text and "A #12" not in text and "8 more engine configs refused" in text
    assert "heuristics A: exhausted" in text and "heuristics FALLBACK: no results" in text
