"""The doctor: the rules on fabricated reports, and the real command on this machine."""

from __future__ import annotations

import copy
import io
import subprocess
import sys

import pytest

from dnnbind import cuda
from dnnbind.doctor import check_report, collect_report, doctor, format_report

GOOD = {
    "dnnbind": "0.1.0",
    "python": "3.12.0",
    "driver_cuda_version": 13000,
    "cuda_bindings": "13.3.0",
    "cuda_available": True,
    "unavailable_reason": "",
    "gpus": [{"index": 0, "name": "NVIDIA H200", "compute_capability": [9, 0], "total_memory": 150 * 2**30,
              "free_memory": 149 * 2**30, "multiprocessors": 132}],
    "cudnn": {"version": 91900, "cuda_version": 13000, "path": "/x/libcudnn.so.9", "error": None},
    "cublas": {"version": 130100, "path": "/x/libcublas.so.13", "error": None},
    "nvrtc": {"version": "13.0", "path": "/x/libnvrtc.so.13", "error": None},
}


def report(**changes):
    r = copy.deepcopy(GOOD)
    for key, value in changes.items():
        r[key] = value
    return r


def test_consistent_gpu_report_passes():
    assert check_report(GOOD) == []
    out = io.StringIO()
    assert doctor(file=out, report=GOOD) == 0
    text = out.getvalue()
    assert "NVIDIA H200" in text and "sm_90" in text and "9.19.0 (built for CUDA 13.0)" in text
    assert "consistent" in text


def test_cudnn_cublas_major_mismatch():
    r = report(cublas={"version": 120904, "path": "/y", "error": None})
    problems = check_report(r)
    assert any("cuDNN is built for CUDA 13 but cuBLAS is for CUDA 12" in p.message for p in problems)
    assert all("pip install" in p.fix for p in problems)
    assert doctor(file=io.StringIO(), report=r) == 1


def test_driver_too_old_for_the_libraries():
    problems = check_report(report(driver_cuda_version=12040))
    messages = " ".join(p.message for p in problems)
    assert "cuDNN is built for CUDA 13" in messages and "supports only up to CUDA 12.4" in messages
    fixes = " ".join(p.fix for p in problems)
    assert "580" in fixes and 'pip install "dnnbind[cu12]"' in fixes


def test_cuda_bindings_newer_than_driver():
    r = report(driver_cuda_version=12090, cuda_bindings="13.3.0",
               cudnn={"version": 92800, "cuda_version": 12090, "path": "/x", "error": None},
               cublas={"version": 120904, "path": "/x", "error": None},
               nvrtc={"version": "12.9", "path": "/x", "error": None})
    problems = check_report(r)
    assert len(problems) == 1
    assert "cuda-bindings 13.3.0" in problems[0].message
    assert 'pip install "cuda-bindings>=12.0,<13"' in problems[0].fix


def test_gpu_too_old_for_cudnn_cuda13_build():
    gpus = [{"index": 0, "name": "Tesla V100", "compute_capability": [7, 0], "total_memory": 2**34,
             "free_memory": 2**33, "multiprocessors": 80}]
    problems = check_report(report(gpus=gpus))
    assert len(problems) == 1 and "sm_70" in problems[0].message and "sm_75" in problems[0].message
    assert "cu12" in problems[0].fix


def test_missing_library_on_a_gpu_machine():
    problems = check_report(report(cudnn={"version": None, "path": None,
                                          "error": "LibraryNotFoundError: cannot find the cudnn library"}))
    assert any("cuDNN could not be loaded" in p.message for p in problems)
    assert any("nvidia-cudnn-cu13" in p.fix for p in problems)


def test_cpu_only_report_is_consistent_in_one_line():
    r = report(cuda_available=False, gpus=[], driver_cuda_version=None,
               unavailable_reason="no NVIDIA driver found (cudaGetDeviceCount: cudaErrorInsufficientDriver)",
               cublas={"version": 120904, "path": "/y", "error": None})  # mismatch does not matter on CPU
    assert check_report(r) == []
    text = format_report(r, [])
    verdict = [line for line in text.splitlines() if "NumPy CPU backend" in line]
    assert len(verdict) == 1 and "cudaErrorInsufficientDriver" in verdict[0]


def test_collect_report_never_raises_and_has_the_libraries():
    r = collect_report()
    for key in ("cudnn", "cublas", "nvrtc", "gpus", "driver_cuda_version", "cuda_bindings"):
        assert key in r
    assert r["cuda_bindings"] and r["cuda_bindings"].split(".")[0].isdigit()


def _run_cli():
    return subprocess.run([sys.executable, "-m", "dnnbind", "doctor"], capture_output=True, text=True,
                          timeout=120)


# A CPU-only install (`pip install -e .`, no cu12 wheels) on a machine without a GPU: the loader
# finds no library, cuda-bindings sees no driver.
_CPU_ONLY = """
import sys
from dnnbind._lib import loader


class DynamicLibNotFoundError(RuntimeError):  # what cuda.pathfinder raises when nothing is installed
    pass


def missing(name):
    raise DynamicLibNotFoundError(f'Failure finding "lib{name}.so": No such file: lib{name}.so')


loader._pathfinder_load = missing
import dnnbind.cuda

dnnbind.cuda.is_available = lambda: False
dnnbind.cuda.device_count = lambda: 0
from dnnbind.__main__ import main

sys.exit(main(sys.argv[1:]))
"""


def _run_cpu_only(*args):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("DNNBIND_") or not k.endswith("_PATH")}
    return subprocess.run([sys.executable, "-c", _CPU_ONLY, "doctor", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_cpu_only_install_says_where_it_looked_and_how_to_install():
    proc = _run_cpu_only()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "cannot find the cudnn library. Looked in:" in line)
    assert lines[start].startswith("  cuDNN           : not available: LibraryNotFoundError: ")
    block = lines[start + 1: start + 4]  # the rest of the message, aligned under it, not cut off
    assert block[0].strip() == "- DNNBIND_CUDNN_PATH: not set"
    assert "the NVIDIA pip wheels in site-packages" in block[1] and "system loader" in block[1]
    assert 'Failure finding "libcudnn.so"' in block[1]
    assert block[2].strip().startswith('Fix: pip install "dnnbind[cu12]"') and "nvidia-cudnn-cu12" in block[2]
    assert all(line.startswith(" " * 20) for line in block)
    for name in ("cublas", "nvrtc"):
        assert f"cannot find the {name} library. Looked in:" in proc.stdout
    verdict = [line for line in lines if line.startswith("OK: no usable GPU")]
    assert len(verdict) == 1 and "NumPy CPU backend" in verdict[0]
    assert 'not installed: fine for the CPU backend. For an NVIDIA GPU: pip install "dnnbind[cu12]"' in proc.stdout
    # the JSON report keeps the whole message too
    proc = _run_cpu_only("--json")
    import json

    report = json.loads(proc.stdout)["report"]
    assert "Looked in:\n  - DNNBIND_CUDNN_PATH: not set" in report["cudnn"]["error"]
    assert 'Fix: pip install "dnnbind[cu12]"' in report["cudnn"]["error"]


def test_multi_line_problem_messages_stay_aligned():
    r = report(cudnn={"version": None, "path": None,
                      "error": "LibraryNotFoundError: cannot find the cudnn library. Looked in:\n  - A\nFix: B"})
    text = format_report(r, check_report(r))
    assert "  PROBLEM: cuDNN could not be loaded: LibraryNotFoundError: cannot find the cudnn library. Looked in:\n" \
           "             - A\n           Fix: B" in text


@pytest.mark.skipif(cuda.is_available(), reason="checks the GPU-less verdict")
def test_real_doctor_without_gpu_exits_zero():
    proc = _run_cli()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "NumPy CPU backend" in line]
    assert len(lines) == 1 and lines[0].startswith("OK")
    assert "cuDNN" in proc.stdout and "cuda-bindings" in proc.stdout


def test_module_and_function_are_both_callable():
    import dnnbind
    import dnnbind.doctor as module

    out = io.StringIO()
    assert module(file=out, report=GOOD) == 0 and "NVIDIA H200" in out.getvalue()
    assert callable(dnnbind.doctor)


@pytest.mark.gpu
def test_real_doctor_on_gpu():
    proc = _run_cli()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert cuda.Device(0).name in proc.stdout
    assert "consistent" in proc.stdout
