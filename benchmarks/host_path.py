"""Host (Python) time of dnnbind's per-op hot path, piece by piece, in microseconds.

    python benchmarks/host_path.py              # on a GPU: the real path
    python benchmarks/host_path.py --fake       # anywhere: CUDA runtime/driver and cuDNN's
                                                # device calls replaced by no-op fakes
    python benchmarks/host_path.py --profile conv2d_forward   # cProfile one row
    python benchmarks/host_path.py --fake --steps            # whole eager train steps, µs/step
    python benchmarks/host_path.py --fake --steps --profile "mnist_cnn mixed_bfloat16" --top 40

Rows: the pure-Python pieces (is_device_array, route, normalize_shape, as_stream, the conv
algorithm key, descriptor cache hits, kernel argument packing) and whole public op calls
(empty(), a raw NVRTC kernel launch, bias_add, relu, conv2d_forward).

With ``--fake`` every CUDA runtime/driver call the hot path makes (cudaMallocAsync,
cudaStreamIsCapturing, cuLaunchKernel, ...) and cuDNN's handle/compute calls return success
at once; cuDNN's descriptor functions stay real (they need no GPU), NVRTC compiles for
``sm_90``. The fake rows therefore measure what dnnbind's own Python code costs, which is the
part this benchmark is for; on a GPU the rows add the real runtime/driver/cuDNN host time.
``--only NAME`` times only the rows whose name contains NAME; ``--repeat N`` sets the calls per
timing (default 20000 per op row, 200 per step row). GPU rows measure enqueue time: the stream is
synchronised only between timed batches.

``--steps``: one row per model of train_step.py (mnist_cnn, vgg_cifar, airbench94) and policy
(float32, mixed_bfloat16): ``model.train_on_batch`` with ``jit_compile=False`` on a batch already
on the device. Under ``--fake`` the step also needs pinned staging memory (real host buffers),
events, cuBLAS(Lt) handles and gemms, cuDNN's BN/dropout/softmax/tensor calls and the cuDNN graph
API (finalize/execute: one zeroed answer per attribute read) faked; the fake pool hands a freed
block of the same size out again, as the real pool does, so address-keyed caches (optimizer
pointer tables) hit as on a GPU. Nothing reads a device value back during these steps.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import os
import sys

import numpy as np


# ------------------------------------------------------------------------------------ fakes

def install_fakes() -> None:
    """Replace the device-touching calls by no-op successes (see the module docstring)."""
    from cuda.bindings import driver as drv
    from cuda.bindings import runtime as rt

    import dnnbind.cuda.device as dev
    from dnnbind._lib import cublas as B
    from dnnbind._lib import cudnn as C
    from dnnbind._lib import cudnn_graph as G

    dev._probe = (1, "")
    ok = rt.cudaError_t.cudaSuccess
    none = rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone
    handles = itertools.count(0x1000, 0x10)
    ptrs = itertools.count(0x7F0000000000, 1 << 30)  # 1 GiB apart: any size fits
    pinned: dict = {}
    # Like the real stream-ordered pool, a freed block of a size is handed out again (last freed
    # first), so a step that frees and reallocates sees the same addresses, and caches keyed by
    # addresses (optimizer pointer tables) hit as they do on a GPU.
    sizes: dict = {}
    idle: dict = {}

    def malloc_async(nbytes, stream):
        nbytes = int(nbytes)
        free = idle.get(nbytes)
        ptr = free.pop() if free else next(ptrs)
        sizes[ptr] = nbytes
        return ok, ptr

    def free_async(ptr, stream):
        ptr = int(ptr)
        idle.setdefault(sizes.pop(ptr), []).append(ptr)
        return (ok,)

    def host_alloc(nbytes, flags):
        buf = ctypes.create_string_buffer(int(nbytes))
        pinned[ctypes.addressof(buf)] = buf
        return ok, ctypes.addressof(buf)

    attrs = {rt.cudaDeviceAttr.cudaDevAttrComputeCapabilityMajor: 9,
             rt.cudaDeviceAttr.cudaDevAttrComputeCapabilityMinor: 0,
             rt.cudaDeviceAttr.cudaDevAttrMultiProcessorCount: 132}
    runtime = {
        "cudaGetDevice": lambda: (ok, 0),
        "cudaSetDevice": lambda i: (ok,),
        "cudaGetLastError": lambda: (ok,),
        "cudaStreamCreateWithFlags": lambda flags: (ok, next(handles)),
        "cudaStreamDestroy": lambda h: (ok,),
        "cudaStreamGetDevice": lambda h: (ok, 0),
        "cudaStreamIsCapturing": lambda h: (ok, none),
        "cudaStreamGetCaptureInfo": lambda h: (ok, none, 0),
        "cudaStreamSynchronize": lambda h: (ok,),
        "cudaMallocAsync": malloc_async,
        "cudaFreeAsync": free_async,
        "cudaFree": lambda p: (ok,),
        "cudaMemsetAsync": lambda *a: (ok,),
        "cudaMemcpyAsync": lambda *a: (ok,),
        "cudaDeviceGetDefaultMemPool": lambda i: (ok, 1),
        "cudaMemPoolSetAttribute": lambda *a: (ok,),
        "cudaDeviceGetAttribute": lambda attr, i: (ok, attrs.get(attr, 1)),
        # pinned staging memory is real host memory (uploads write into it), kept alive here
        "cudaHostAlloc": host_alloc,
        "cudaFreeHost": lambda p: (pinned.pop(int(p), None) is not None and ok) or ok,
        "cudaEventCreateWithFlags": lambda flags: (ok, next(handles)),
        "cudaEventDestroy": lambda e: (ok,),
        "cudaEventRecord": lambda e, s: (ok,),
        "cudaEventQuery": lambda e: (ok,),
        "cudaEventSynchronize": lambda e: (ok,),
        "cudaStreamWaitEvent": lambda *a: (ok,),
        "cudaStreamQuery": lambda s: (ok,),
        "cudaDeviceSynchronize": lambda: (ok,),
        "cudaMemGetInfo": lambda: (ok, 140 << 30, 141 << 30),
        "cudaMemPoolGetAttribute": lambda pool, attr: (ok, 0),
        "cudaMemPoolTrimTo": lambda pool, n: (ok,),
    }
    for name, fn in runtime.items():
        setattr(rt, name, fn)
    dok = drv.CUresult.CUDA_SUCCESS
    driver = {
        "cuModuleLoadData": lambda image: (dok, 1),
        "cuModuleGetFunction": lambda module, name: (dok, 2),
        "cuModuleUnload": lambda module: (dok,),
        # "not supported": the kernel path then relies on the arguments' own C types,
        # as the ops pass them (NumPy scalars, Pointers).
        "cuFuncGetParamInfo": lambda func, i: (drv.CUresult.CUDA_ERROR_NOT_SUPPORTED, 0, 0),
        "cuLaunchKernel": lambda *a: (dok,),
    }
    for name, fn in driver.items():
        setattr(drv, name, fn)

    C.library()  # real: descriptors keep working without a GPU

    def write(ref, value):
        ref._obj.value = value
        return 0

    def find(handle, *rest):  # (descs x4, requested, byref(count), perfs)
        count, perfs = rest[-2], rest[-1]
        perfs[0].algo, perfs[0].status, perfs[0].mathType, perfs[0].determinism = 1, 0, 0, 1
        count._obj.value = 1
        return 0

    fake = {
        "cudnnCreate": lambda ref: write(ref, next(handles)),
        "cudnnDestroy": lambda h: 0,
        "cudnnSetStream": lambda h, s: 0,
        "cudnnGetConvolutionForwardAlgorithm_v7": find,
        "cudnnGetConvolutionBackwardDataAlgorithm_v7": find,
        "cudnnGetConvolutionBackwardFilterAlgorithm_v7": find,
        "cudnnGetConvolutionForwardWorkspaceSize": lambda *a: write(a[-1], 1 << 16),
        "cudnnGetConvolutionBackwardDataWorkspaceSize": lambda *a: write(a[-1], 1 << 16),
        "cudnnGetConvolutionBackwardFilterWorkspaceSize": lambda *a: write(a[-1], 1 << 16),
        "cudnnConvolutionForward": lambda *a: 0,
        "cudnnConvolutionBackwardData": lambda *a: 0,
        "cudnnConvolutionBackwardFilter": lambda *a: 0,
        "cudnnActivationForward": lambda *a: 0,
        "cudnnActivationBackward": lambda *a: 0,
        "cudnnPoolingForward": lambda *a: 0,
        "cudnnPoolingBackward": lambda *a: 0,
        "cudnnConvolutionBiasActivationForward": lambda *a: 0,
        "cudnnConvolutionBackwardBias": lambda *a: 0,
        "cudnnTransformTensor": lambda *a: 0,
        "cudnnAddTensor": lambda *a: 0,
        "cudnnOpTensor": lambda *a: 0,
        "cudnnReduceTensor": lambda *a: 0,
        "cudnnSetTensor": lambda *a: 0,
        "cudnnScaleTensor": lambda *a: 0,
        "cudnnSoftmaxForward": lambda *a: 0,
        "cudnnSoftmaxBackward": lambda *a: 0,
        "cudnnBatchNormalizationForwardInference": lambda *a: 0,
        "cudnnBatchNormalizationForwardTraining": lambda *a: 0,
        "cudnnBatchNormalizationBackward": lambda *a: 0,
        "cudnnBatchNormalizationForwardTrainingEx": lambda *a: 0,
        "cudnnBatchNormalizationBackwardEx": lambda *a: 0,
        "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize": lambda *a: write(a[-1], 1 << 16),
        "cudnnGetBatchNormalizationBackwardExWorkspaceSize": lambda *a: write(a[-1], 1 << 16),
        "cudnnGetBatchNormalizationTrainingExReserveSpaceSize": lambda *a: write(a[-1], 1 << 16),
        "cudnnGetReductionWorkspaceSize": lambda *a: write(a[-1], 1 << 16),
        "cudnnGetReductionIndicesSize": lambda *a: write(a[-1], 0),
        "cudnnDropoutGetStatesSize": lambda h, ref: write(ref, 1 << 16),
        "cudnnSetDropoutDescriptor": lambda *a: 0,
        "cudnnRestoreDropoutDescriptor": lambda *a: 0,
        "cudnnDropoutForward": lambda *a: 0,
        "cudnnDropoutBackward": lambda *a: 0,
    }
    C._binding._raw.update(fake)
    for name in fake:  # drop checked wrappers built before the fakes
        C.__dict__.pop(name, None)

    # The cuDNN graph API: finalizing a plan loads engine libraries that need a GPU, so the whole
    # backend is faked; every attribute read answers one element of zeros (the caller's arrays
    # come zeroed: a workspace of 0 bytes, engine 0 without tensor-core knobs).
    def get_attribute(desc, name, attr_type, requested, count, array):
        count._obj.value = 1
        return 0

    graph = {
        "cudnnBackendCreateDescriptor": lambda kind, ref: write(ref, next(handles)),
        "cudnnBackendDestroyDescriptor": lambda d: 0,
        "cudnnBackendFinalize": lambda d: 0,
        "cudnnBackendSetAttribute": lambda *a: 0,
        "cudnnBackendGetAttribute": get_attribute,
        "cudnnBackendExecute": lambda *a: 0,
    }
    G.library()
    G._binding._raw.update(graph)
    for name in graph:
        G.__dict__.pop(name, None)

    # cuBLAS needs a context even to create a handle: fake the handle and the compute calls
    B.library()
    blas = {
        "cublasCreate_v2": lambda ref: write(ref, next(handles)),
        "cublasDestroy_v2": lambda h: 0,
        "cublasSetStream_v2": lambda h, s: 0,
        "cublasSetWorkspace_v2": lambda *a: 0,
        "cublasSetMathMode": lambda *a: 0,
        "cublasSetPointerMode_v2": lambda *a: 0,
        "cublasSgemm_v2": lambda *a: 0,
        "cublasGemmEx": lambda *a: 0,
        "cublasGemmStridedBatchedEx": lambda *a: 0,
        "cublasSgeam": lambda *a: 0,
        "cublasSaxpy_v2": lambda *a: 0,
        "cublasSscal_v2": lambda *a: 0,
    }
    B._binding._raw.update(blas)
    for name in blas:
        B.__dict__.pop(name, None)


# ------------------------------------------------------------------------------------ timing

# the same best-of-5-batches timer as host_overhead.py (scripts beside each other)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host_overhead import _time  # noqa: E402


def build_cases(fake: bool):
    """(name, fn) pairs; each fn is one call of the piece being timed."""
    from dnnbind import cuda, cudnn, kernels
    from dnnbind.backend import is_device_array
    from dnnbind.cuda.array import normalize_shape
    from dnnbind.kernels import _dispatch
    from dnnbind.kernels._cuda import _common as cm
    from dnnbind.kernels._cuda import conv as cconv
    from dnnbind.kernels._params import ConvParams, as_pair

    stream = cuda.Stream()
    rng = np.random.default_rng(0)
    n, c, h, w, k = 32, 16, 16, 16, 32
    x = cuda.empty((n, c, h, w), np.float32, stream=stream)
    wt = cuda.empty((k, c, 3, 3), np.float32, stream=stream)
    b = cuda.empty((k,), np.float32, stream=stream)
    y = cuda.empty((n, k, h, w), np.float32, stream=stream)
    if not fake:
        for arr in (x, wt, b):
            arr.copy_from_host(rng.standard_normal(arr.shape).astype(np.float32), stream)
    host = np.zeros((4, 4), np.float32)
    params = ConvParams(stride=(1, 1), pad=(1, 1, 1, 1), dilation=(1, 1), groups=1)
    g = cconv._geometry(x.shape, wt.shape, params, "NCHW", x.dtype)
    kern = cm.kernel("layout.cu", "bias_add_f32", stream.device_index)
    bias_args = (cm.p(y), cm.p(b), cm.p(y), cm.i64(y.size), cm.i64(k), cm.i64(h * w))

    def conv_fwd():
        kernels.conv2d_forward(x, wt, padding=1, out=y, stream=stream)

    cases = [
        ("is_device_array(DeviceArray)", lambda: is_device_array(x)),
        ("is_device_array(ndarray)", lambda: is_device_array(host)),
        ("route(op, family, x=, w=, out=None)", lambda: _dispatch.route("op", "conv", x=x, w=wt, out=None)),
        ("as_array(DeviceArray)", lambda: _dispatch.as_array(x)),
        ("normalize_shape(4-tuple)", lambda: normalize_shape((n, c, h, w))),
        ("as_pair(1, 'stride')", lambda: as_pair(1, "stride")),
        ("as_stream(None)", lambda: cuda.as_stream(None)),
        ("as_stream(Stream)", lambda: cuda.as_stream(stream)),
        ("current_device_index()", cuda.current_device_index),
        ("conv geometry + algo key", lambda: cconv._geometry(x.shape, wt.shape, params, "NCHW", x.dtype)
         .key("forward", 0)),
        ("TensorDescriptor.cached hit", lambda: cudnn.TensorDescriptor.cached((n, c, h, w), x.dtype, "NCHW")),
        ("cudnn get_handle(stream) (cached)", lambda: cm.cudnn_handle(stream)),
        ("kernel args: 3 Pointers + 3 np.int64", lambda: (cm.p(y), cm.p(b), cm.p(y), cm.i64(y.size),
                                                          cm.i64(k), cm.i64(h * w))),
        ("Kernel.__call__ 6 args (prebuilt)", lambda: kern((64, 1, 1), (256, 1, 1), bias_args, stream=stream)),
        ("empty((32,32,16,16)) + free", lambda: cuda.empty((n, k, h, w), np.float32, stream=stream)),
        ("kernels.bias_add(out=y)", lambda: kernels.bias_add(y, b, out=y, stream=stream)),
        ("kernels.bias_add (new output)", lambda: kernels.bias_add(y, b, stream=stream)),
        ("kernels.activation_forward relu (NVRTC kernel)", lambda: kernels.activation_forward(y, "relu", stream=stream)),
        ("kernels.activation_forward gelu (NVRTC)", lambda: kernels.activation_forward(y, "gelu", stream=stream)),
        ("kernels.conv2d_forward(out=y)", conv_fwd),
        ("kernels.conv2d_forward (new output)", lambda: kernels.conv2d_forward(x, wt, padding=1, stream=stream)),
    ]
    _ = g
    return cases, stream


STEP_ROWS = [(model, precision) for model in ("mnist_cnn", "vgg_cifar", "airbench94")
             for precision in ("float32", "mixed_bfloat16")]


def build_step(model_name: str, precision: str):
    """One eager train step (``train_on_batch``, ``jit_compile=False``) of a train_step.py model
    on a device-resident batch; the global dtype policy stays ``precision`` until restored."""
    import dnnbind
    from dnnbind import backend
    from train_step import MODELS, build_dnnbind, make_batch

    dnnbind.mixed_precision.set_global_policy(precision)
    model = build_dnnbind(model_name, jit_compile=False)
    device = backend.default_device()
    x, y = make_batch(model_name, MODELS[model_name]["batch"])
    xd, yd = backend.asarray(x, device), backend.asarray(y, device)

    def step():
        model.train_on_batch(xd, yd, return_dict=True)  # lazy logs: no host read per step

    return step


def step_rows(args: argparse.Namespace, sync) -> int:
    """Time (or, with --profile, cProfile) whole eager train steps: host µs per step."""
    import dnnbind

    rows = [r for r in STEP_ROWS if not args.only or args.only in f"{r[0]} {r[1]}"]
    if args.profile:
        rows = [r for r in STEP_ROWS if args.profile in f"{r[0]} {r[1]}"][:1]
    repeat = args.repeat if args.repeat is not None else 200
    print(f"{'eager train step':<28}  host µs/step")
    print("-" * 42)
    for model_name, precision in rows:
        try:
            step = build_step(model_name, precision)
            if args.profile:
                _profile(f"{model_name} {precision}", step, repeat, sync, args.top)
                continue
            print(f"{model_name + ' ' + precision:<28}  {_time(step, repeat, sync):10.1f}", flush=True)
        finally:
            dnnbind.mixed_precision.set_global_policy("float32")
    return 0


def _profile(name: str, fn, repeat: int, sync, top: int) -> None:
    import cProfile
    import pstats

    _time(fn, max(repeat // 10, 20), sync)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(repeat):
        fn()
    prof.disable()
    print(name, f"({repeat} calls)")
    pstats.Stats(prof).sort_stats(os.environ.get("HOST_PATH_SORT", "tottime")).print_stats(top)


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake", action="store_true", help="no GPU needed: fake the device calls")
    parser.add_argument("--steps", action="store_true",
                        help="time whole eager train steps of train_step.py's models instead of ops")
    parser.add_argument("--repeat", type=int, default=None,
                        help="calls per timing (default 20000 per op row, 200 per step row)")
    parser.add_argument("--profile", default=None, help="cProfile the row whose name contains this")
    parser.add_argument("--top", type=int, default=25, help="entries of the --profile list")
    parser.add_argument("--only", default=None, help="time only rows whose name contains this")
    args = parser.parse_args(argv)
    if args.fake:
        install_fakes()
    from dnnbind import cuda

    if not cuda.is_available():
        print(f"no GPU ({cuda.unavailable_reason()}); run with --fake", file=sys.stderr)
        return 2
    where = "fake device calls (Python-side cost only)" if args.fake else f"GPU: {cuda.Device(0).name}"
    if args.steps:
        print(f"dnnbind host path, {where}; Python {sys.version.split()[0]}")
        return step_rows(args, None if args.fake else cuda.current_stream().synchronize)
    cases, stream = build_cases(args.fake)
    sync = None if args.fake else stream.synchronize
    repeat = args.repeat if args.repeat is not None else 20000
    if args.profile:
        name, fn = next((c for c in cases if args.profile in c[0]))
        _profile(name, fn, repeat // 10, sync, args.top)
        return 0
    print(f"dnnbind host path, {where}; Python {sys.version.split()[0]}")
    width = max(len(name) for name, _ in cases)
    print(f"{'piece':<{width}}  host µs/call")
    print("-" * (width + 14))
    for name, fn in cases:
        if args.only and args.only not in name:
            continue
        print(f"{name:<{width}}  {_time(fn, repeat, sync):10.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
