"""What the cuDNN and cuBLAS bindings share: lazy loading, declaring, and status-checked calls."""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Mapping

from .loader import load_library

__all__ = ["Binding"]

ErrorFactory = Callable[[int, str, "Mapping[str, Any] | None"], Exception]


class Binding:
    """One C library: ``argtypes`` tables applied on first use, and checked calls.

    ``signatures`` maps status-returning functions to their argtypes (restype int);
    ``plain`` maps the others to ``(argtypes, restype)``. ``make_error(status, function,
    context)`` builds the exception for a non-zero status.
    """

    def __init__(self, libname: str, signatures: Mapping[str, tuple[Any, ...]],
                 plain: Mapping[str, tuple[tuple[Any, ...], Any]], make_error: ErrorFactory) -> None:
        self.libname = libname
        self.signatures = signatures
        self.plain = plain
        self.make_error = make_error
        self._lib: ctypes.CDLL | None = None
        self._raw: dict[str, Callable[..., int]] = {}
        self._lock = threading.Lock()

    def module_hooks(self, namespace: dict) -> "tuple[Callable[[str], Any], Callable[[], list[str]]]":
        """``(__getattr__, __dir__)`` for the module that binds this library (PEP 562).

        C function names become checked wrappers, built on first use (loading the library
        then, never at import) and kept as module globals, so later lookups are dict hits.
        """
        def __getattr__(name: str) -> Any:
            if name in self.signatures:
                wrapper = self.checked(name)
                namespace[name] = wrapper
                return wrapper
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")

        def __dir__() -> list[str]:
            return sorted(set(namespace) | set(self.signatures))

        return __getattr__, __dir__

    def library(self) -> ctypes.CDLL:
        """The loaded library with every declared function's argtypes/restype set."""
        if self._lib is not None:
            return self._lib
        with self._lock:
            if self._lib is None:
                lib = load_library(self.libname)
                for name, argtypes in self.signatures.items():
                    fn = getattr(lib, name)
                    fn.argtypes = list(argtypes)
                    fn.restype = ctypes.c_int
                    self._raw[name] = fn
                for name, (argtypes, restype) in self.plain.items():
                    fn = getattr(lib, name)
                    fn.argtypes = list(argtypes)
                    fn.restype = restype
                self._lib = lib
        return self._lib

    def raw(self, name: str) -> Callable[..., int]:
        """The bare ctypes function ``name``; it returns the status as an int."""
        if self._lib is None:
            self.library()
        try:
            return self._raw[name]
        except KeyError:
            raise AttributeError(f"dnnbind._lib.{self.libname} does not declare {name!r}") from None

    def call(self, name: str, *args: Any,
             context: "Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None" = None) -> None:
        """Call ``name``; raise the library's error (carrying ``context``) on a non-zero status.

        ``context`` may be a zero-argument callable returning the mapping: it is then built only
        when the call fails (hot paths pass a lambda instead of building a dict per call).
        """
        fn = self._raw.get(name) or self.raw(name)
        status = fn(*args)
        if status:
            if callable(context):
                context = context()
            raise self.make_error(status, name, context)

    def checked(self, name: str) -> Callable[..., None]:
        """A wrapper around ``name`` that raises on a non-zero status (no context argument: fastest)."""
        fn = self.raw(name)
        make_error = self.make_error

        def checked(*args: Any) -> None:
            status = fn(*args)
            if status:
                raise make_error(status, name, None)

        checked.__name__ = checked.__qualname__ = name
        checked.__doc__ = f"Checked ``{name}``: raises on a non-success status."
        return checked
