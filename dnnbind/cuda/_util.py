"""Turn cuda-python's ``(err, value...)`` tuples into values or :class:`CudaError`.

cuda-bindings returns every result as a tuple whose first item is the status.
:func:`check` strips it, and raises with the status name and the runtime's own
words (``cudaGetErrorName`` / ``cudaGetErrorString``) and the function that
failed, so a status code never reaches the user without words.
"""

from __future__ import annotations

from typing import Any

from ..errors import CudaError

try:  # cuda-bindings is a hard dependency, but import dnnbind must work without it
    from cuda.bindings import runtime as rt
except Exception as _exc:  # pragma: no cover - exercised only where cuda-bindings is broken
    rt = None
    IMPORT_ERROR: "Exception | None" = _exc
else:
    IMPORT_ERROR = None

__all__ = ["rt", "IMPORT_ERROR", "check", "check_driver", "error_name", "driver"]


def driver():
    """``cuda.bindings.driver``, imported on first use (kernels only)."""
    from cuda.bindings import driver as drv

    return drv


def error_name(err: Any) -> tuple[str, str]:
    """(name, description) of a runtime status; never raises."""
    try:
        ok, name = rt.cudaGetErrorName(err)[:2]
        ok2, text = rt.cudaGetErrorString(err)[:2]
        return name.decode(), text.decode()
    except Exception:
        return getattr(err, "name", f"cudaError {int(err)}"), ""


def check(result: tuple, function: str, **context: Any) -> Any:
    """Return the value(s) of a runtime call, or raise :class:`CudaError` naming ``function``.

    One value is returned bare, several as a tuple, none as ``None``.
    """
    err = result[0]
    if err:  # cudaSuccess is 0; IntEnum compares as int
        name, text = error_name(err)
        raise CudaError(int(err), name, function, text, context or None)
    if len(result) == 1:
        return None
    if len(result) == 2:
        return result[1]
    return result[1:]


def check_driver(result: tuple, function: str, **context: Any) -> Any:
    """Like :func:`check` for ``cuda.bindings.driver`` results (``CUresult``)."""
    err = result[0]
    if err:
        drv = driver()
        try:
            name = drv.cuGetErrorName(err)[1].decode()
            text = drv.cuGetErrorString(err)[1].decode()
        except Exception:
            name, text = getattr(err, "name", f"CUresult {int(err)}"), ""
        raise CudaError(int(err), name, function, text, context or None)
    if len(result) == 1:
        return None
    if len(result) == 2:
        return result[1]
    return result[1:]
