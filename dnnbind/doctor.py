"""``python -m dnnbind doctor``: what is installed, where it was loaded from, and whether it fits.

:func:`collect_report` gathers facts into a plain dict (never raises),
:func:`check_report` applies the compatibility rules to such a dict (a pure
function, so the rules are tested with fabricated reports), and :func:`doctor`
prints both and returns the exit code: 0 when consistent (a machine without a
GPU, where the NumPy backend is used, counts as consistent), 1 otherwise.
"""

from __future__ import annotations

import sys
import types
from typing import Any, TextIO

from . import __version__

__all__ = ["collect_report", "check_report", "format_report", "doctor", "Problem"]

# Oldest compute capability each cuDNN 9 build supports (cuDNN support matrix: the CUDA 12
# builds run on Maxwell sm_50 and newer; CUDA 13 dropped Maxwell, Pascal and Volta).
_CUDNN_MIN_CC = {11: (3, 5), 12: (5, 0), 13: (7, 5)}
# Minimum Linux driver per CUDA major (CUDA release notes, minor-version compatibility).
_MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
# pip names of the cuDNN / cuBLAS / NVRTC wheels per CUDA major.
_WHEELS = {
    12: "nvidia-cudnn-cu12 nvidia-cublas-cu12 nvidia-cuda-nvrtc-cu12",
    13: "nvidia-cudnn-cu13 nvidia-cublas nvidia-cuda-nvrtc",
}


class Problem(tuple):
    """(message, fix)."""

    __slots__ = ()

    def __new__(cls, message: str, fix: str) -> "Problem":
        return super().__new__(cls, (message, fix))

    @property
    def message(self) -> str:
        return self[0]

    @property
    def fix(self) -> str:
        return self[1]


def _install(major: int) -> str:
    extra = f'pip install "dnnbind[cu{major}]"'
    wheels = _WHEELS.get(major)
    return f"{extra}  (or: pip install {wheels})" if wheels else extra


def _library(name: str) -> dict:
    entry: dict[str, Any] = {"version": None, "path": None, "error": None}
    try:
        from ._lib import loader  # deferred: a failing import is reported (collect_report's docstring)

        info = loader.library_info(name)
        entry.update(version=info.version, path=info.path, found_via=info.found_via)
    except Exception as exc:  # missing library, broken loader: report, never raise
        # the whole message: the loader's says where it looked and which pip command installs it
        entry["error"] = f"{type(exc).__name__}: {str(exc).strip()}"
    return entry


def collect_report() -> dict:
    """Everything the checks need, as plain data. Never raises.

    The CUDA rooms are imported inside its ``try`` blocks, not at the top: a broken install is what
    the doctor is run to diagnose, so their import errors become lines of the report.
    """
    report: dict[str, Any] = {
        "dnnbind": __version__,
        "python": sys.version.split()[0],
        "driver_cuda_version": None,
        "cuda_bindings": None,
        "cuda_available": False,
        "unavailable_reason": "",
        "gpus": [],
    }
    try:
        import cuda.bindings

        report["cuda_bindings"] = getattr(cuda.bindings, "__version__", None)
    except Exception as exc:
        report["cuda_bindings_error"] = f"{type(exc).__name__}: {exc}"
    try:
        from cuda.bindings import runtime as rt

        err, version = rt.cudaDriverGetVersion()
        if not err and version:
            report["driver_cuda_version"] = int(version)
    except Exception:
        pass
    try:
        from . import cuda  # deferred: a failing import is reported (collect_report's docstring)

        report["cuda_available"] = cuda.is_available()
        report["unavailable_reason"] = cuda.unavailable_reason()
        for index in range(cuda.device_count()):
            try:
                dev = cuda.CudaDevice(index)
                free, total = dev.mem_get_info()
                report["gpus"].append({
                    "index": index, "name": dev.name, "compute_capability": list(dev.compute_capability),
                    "total_memory": total, "free_memory": free, "multiprocessors": dev.multiprocessor_count,
                })
            except Exception as exc:
                report["gpus"].append({"index": index, "error": f"{type(exc).__name__}: {exc}"})
    except Exception as exc:
        report["unavailable_reason"] = f"dnnbind.cuda failed: {type(exc).__name__}: {exc}"

    cudnn = _library("cudnn")
    if cudnn["error"] is None:
        try:
            from ._lib import cudnn as cudnn_lib  # deferred: a failing import is reported

            cudnn["version"] = cudnn_lib.version()
            cudnn["cuda_version"] = cudnn_lib.cudart_version()
        except Exception as exc:
            cudnn["cuda_version"] = None
            cudnn["error"] = f"{type(exc).__name__}: {exc}"
    report["cudnn"] = cudnn
    report["cublas"] = _library("cublas")
    report["nvrtc"] = _library("nvrtc")
    return report


def _major_of(report: dict, name: str) -> int | None:
    lib = report.get(name) or {}
    if lib.get("error"):
        return None
    if name == "cudnn":
        v = lib.get("cuda_version")
        return int(v) // 1000 if v else None
    v = lib.get("version")
    if v is None:
        return None
    if name == "nvrtc":
        return int(str(v).split(".")[0])
    return int(v) // 10000  # cuBLAS 120904 -> 12


def _fmt_cuda(v: int | None) -> str:
    return "unknown" if not v else f"{v // 1000}.{(v % 1000) // 10}"


def is_cpu_only(report: dict) -> bool:
    """True when no usable GPU exists: the NumPy backend will be used."""
    return not report.get("cuda_available") or not report.get("gpus")


def check_report(report: dict) -> list[Problem]:
    """The compatibility problems in ``report`` (empty when consistent), each with a fix."""
    if is_cpu_only(report):
        return []  # the CPU backend needs none of the CUDA libraries to agree
    problems: list[Problem] = []
    names = {"cudnn": "cuDNN", "cublas": "cuBLAS", "nvrtc": "NVRTC"}
    driver = report.get("driver_cuda_version")
    driver_major = driver // 1000 if driver else None

    for key, label in names.items():
        lib = report.get(key) or {}
        if lib.get("error"):
            major = driver_major or 12
            problems.append(Problem(f"{label} could not be loaded: {lib['error']}", _install(major)))

    majors = {key: _major_of(report, key) for key in names}
    if driver_major is not None:
        for key, major in majors.items():
            if major is not None and major > driver_major:
                problems.append(Problem(
                    f"{names[key]} is built for CUDA {major}, but the driver supports only up to CUDA "
                    f"{_fmt_cuda(driver)}",
                    f"upgrade the NVIDIA driver to {_MIN_DRIVER.get(major, 'a newer release')} or newer, or "
                    f"install the CUDA {driver_major} libraries: {_install(driver_major)}"))

    cudnn_major, cublas_major = majors["cudnn"], majors["cublas"]
    if cudnn_major is not None and cublas_major is not None and cudnn_major != cublas_major:
        target = min(cudnn_major, cublas_major) if driver_major is None else min(driver_major, max(cudnn_major, cublas_major))
        problems.append(Problem(
            f"cuDNN is built for CUDA {cudnn_major} but cuBLAS is for CUDA {cublas_major}; they must match",
            f"install one CUDA major for both: {_install(target)}, and uninstall the other set"))
    nvrtc_major = majors["nvrtc"]
    if nvrtc_major is not None and cublas_major is not None and nvrtc_major != cublas_major:
        problems.append(Problem(
            f"NVRTC is for CUDA {nvrtc_major} but cuBLAS is for CUDA {cublas_major}; they must match",
            f"install one CUDA major for both: {_install(cublas_major)}"))

    bindings = report.get("cuda_bindings")
    if bindings and driver_major is not None:
        b_major = int(str(bindings).split(".")[0])
        if b_major > driver_major:
            problems.append(Problem(
                f"cuda-bindings {bindings} needs a CUDA {b_major} driver, but the driver supports CUDA "
                f"{_fmt_cuda(driver)}",
                f'pip install "cuda-bindings>={driver_major}.0,<{driver_major + 1}"  (or upgrade the driver to '
                f"{_MIN_DRIVER.get(b_major, 'a newer release')} or newer)"))

    minimum = _CUDNN_MIN_CC.get(cudnn_major) if cudnn_major is not None else None
    for gpu in report.get("gpus", []):
        if gpu.get("error"):
            problems.append(Problem(f"GPU {gpu.get('index')} could not be queried: {gpu['error']}",
                                    "check the driver installation with `nvidia-smi`"))
            continue
        cc = tuple(gpu["compute_capability"])
        if minimum is not None and cc < minimum:
            fix = (_install(12) + " (the CUDA 12 builds of cuDNN support sm_50 and newer)"
                   if cudnn_major and cudnn_major >= 13 and cc >= _CUDNN_MIN_CC[12]
                   else "this GPU is too old for cuDNN 9; use the CPU backend (DNNBIND_DEVICE=cpu)")
            problems.append(Problem(
                f"GPU {gpu['index']} ({gpu['name']}, sm_{cc[0]}{cc[1]}) is not supported by cuDNN built "
                f"for CUDA {cudnn_major} (needs sm_{minimum[0]}{minimum[1]} or newer)", fix))
    return problems


def _version_text(key: str, lib: dict) -> str:
    if lib.get("error") and lib.get("version") is None:
        return f"not available: {lib['error']}"
    v = lib.get("version")
    if key in ("cudnn", "cublas") and isinstance(v, int):
        major, rest = divmod(v, 10000)  # both encode major*10000 + minor*100 + patch
        text = f"{major}.{rest // 100}.{rest % 100}"
    else:
        text = str(v)
    if key == "cudnn" and lib.get("cuda_version"):
        text += f" (built for CUDA {_fmt_cuda(lib['cuda_version'])})"
    where = lib.get("path") or "loaded by the system"
    return f"{text}  [{where}]"


def _indented(head: str, text: str) -> str:
    """``head`` + ``text``, its further lines aligned under the first (multi-line loader errors)."""
    first, *rest = str(text).splitlines() or [""]
    return "\n".join([head + first] + [" " * len(head) + line for line in rest])


def format_report(report: dict, problems: list[Problem]) -> str:
    """Human-readable text for ``report`` and ``problems``."""
    lines = [f"dnnbind {report.get('dnnbind')} doctor (Python {report.get('python')})"]
    driver = report.get("driver_cuda_version")
    lines.append(f"  NVIDIA driver   : {'supports CUDA ' + _fmt_cuda(driver) if driver else 'not found'}")
    lines.append(f"  cuda-bindings   : {report.get('cuda_bindings') or report.get('cuda_bindings_error', 'missing')}")
    for key, label in (("cudnn", "cuDNN"), ("cublas", "cuBLAS"), ("nvrtc", "NVRTC")):
        lines.append(_indented(f"  {label:<15} : ", _version_text(key, report.get(key) or {})))
    for gpu in report.get("gpus", []):
        if gpu.get("error"):
            lines.append(f"  GPU {gpu['index']:<11} : error: {gpu['error']}")
            continue
        major, minor = gpu["compute_capability"]
        lines.append(f"  GPU {gpu['index']:<11} : {gpu['name']}, compute capability {major}.{minor} (sm_{major}{minor}), "
                     f"{gpu['total_memory'] / 2**30:.1f} GiB ({gpu['free_memory'] / 2**30:.1f} GiB free), "
                     f"{gpu.get('multiprocessors', '?')} SMs")
    if is_cpu_only(report):
        lines.append(f"OK: no usable GPU ({report.get('unavailable_reason') or 'none found'}); "
                     "dnnbind will use the NumPy CPU backend.")
        missing = [label for key, label in (("cudnn", "cuDNN"), ("cublas", "cuBLAS"), ("nvrtc", "NVRTC"))
                   if (report.get(key) or {}).get("error")]
        if missing:
            lines.append(f"  ({', '.join(missing)} not installed: fine for the CPU backend. For an NVIDIA GPU: "
                         'pip install "dnnbind[cu12]", or "dnnbind[cu13]" with a CUDA 13 driver.)')
        return "\n".join(lines)
    if problems:
        lines.append(f"{len(problems)} problem(s) found:")
        for p in problems:
            lines.append(_indented("  PROBLEM: ", p.message))
            lines.append(_indented("      fix: ", p.fix))
    else:
        lines.append("OK: driver, cuda-bindings, cuDNN, cuBLAS, NVRTC and the GPU(s) are consistent.")
    return "\n".join(lines)


def doctor(file: TextIO | None = None, report: dict | None = None) -> int:
    """Print the diagnosis and return the exit code (0 consistent, 1 problems found)."""
    report = collect_report() if report is None else report
    problems = check_report(report)
    print(format_report(report, problems), file=file or sys.stdout)
    return 1 if problems else 0


class _CallableModule(types.ModuleType):
    """``import dnnbind.doctor`` shadows the lazily exported function ``dnnbind.doctor``;
    making the module callable keeps ``dnnbind.doctor()`` working either way."""

    def __call__(self, *args: Any, **kwargs: Any) -> int:
        return doctor(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
