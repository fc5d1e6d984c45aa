"""Keras's ragged ``.npy`` arrays (``imdb.npz``, ``reuters.npz``: object arrays of lists of word ids) read without
unpickling.

``np.save`` writes an object array as a pickle stream. dnnbind never unpickles: this module walks the stream's
opcodes with :func:`pickletools.genops` (a disassembler: it decodes, it runs nothing and imports nothing) and
accepts exactly the shape numpy writes for a 1-D object array of lists of ints: ``numpy.core.multiarray.
_reconstruct(numpy.ndarray, (0,), b'b')`` built with ``(1, (n,), dtype('O8'), False, [list, list, ...])``. Any
other opcode, global or object is refused with :class:`DatasetFormatError`, so a crafted file can at worst be
rejected, never run code.
"""

from __future__ import annotations

import io
import pickletools
from typing import Any

import numpy as np

from .download import DatasetFormatError

__all__ = ["ragged_int_lists"]

_ALLOWED_GLOBALS = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                    ("numpy", "ndarray"), ("numpy", "dtype")}
_MARK = object()


class _Global:
    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name


class _Call:
    def __init__(self, func: Any, args: Any) -> None:
        self.func, self.args, self.state = func, args, None


def _decode(stream: bytes, what: str, max_items: int) -> Any:
    stack: list = []
    memo: dict = {}
    items = 0

    def pop_mark() -> list:
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is _MARK:
                out = stack[i + 1:]
                del stack[i:]
                return out
        raise DatasetFormatError(f"{what}: malformed array stream (no MARK)")

    try:
        for opcode, arg, _ in pickletools.genops(io.BytesIO(stream)):
            name = opcode.name
            if name in ("PROTO", "FRAME"):
                continue
            if name in ("GLOBAL", "STACK_GLOBAL"):
                module, attr = arg.split(" ", 1) if name == "GLOBAL" else (stack.pop(-2), stack.pop())
                if (module, attr) not in _ALLOWED_GLOBALS:
                    raise DatasetFormatError(f"{what}: the array stream names {module}.{attr}, which a ragged "
                                             "array of word ids never does; refused")
                stack.append(_Global(module, attr))
            elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[arg] = stack[-1]
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                stack.append(memo[arg])
            elif name == "MARK":
                stack.append(_MARK)
            elif name == "EMPTY_TUPLE":
                stack.append(())
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                values = tuple(stack[-n:])
                del stack[-n:]
                stack.append(values)
            elif name == "TUPLE":
                stack.append(tuple(pop_mark()))
            elif name == "EMPTY_LIST":
                stack.append([])
            elif name == "APPEND":
                value = stack.pop()
                stack[-1].append(value)
                items += 1
            elif name == "APPENDS":
                values = pop_mark()
                stack[-1].extend(values)
                items += len(values)
            elif name in ("BININT", "BININT1", "BININT2", "LONG1", "INT", "LONG", "LONG4", "BINFLOAT", "FLOAT"):
                stack.append(arg)
            elif name in ("NEWTRUE", "NEWFALSE", "NONE"):
                stack.append({"NEWTRUE": True, "NEWFALSE": False, "NONE": None}[name])
            elif name in ("SHORT_BINBYTES", "BINBYTES", "BINBYTES8", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8",
                          "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"):
                stack.append(arg)
            elif name == "REDUCE":
                args = stack.pop()
                stack.append(_Call(stack.pop(), args))
            elif name == "BUILD":
                state = stack.pop()
                if not isinstance(stack[-1], _Call):
                    raise DatasetFormatError(f"{what}: malformed array stream (BUILD of a plain value)")
                stack[-1].state = state
            elif name == "STOP":
                return stack.pop()
            else:
                raise DatasetFormatError(f"{what}: the array stream uses the pickle opcode {name}, which a ragged "
                                         "array of word ids never does; refused")
            if items > max_items:
                raise DatasetFormatError(f"{what}: more than {max_items:,} items; refused")
    except (ValueError, IndexError, KeyError, TypeError, AttributeError) as exc:
        if isinstance(exc, DatasetFormatError):
            raise
        raise DatasetFormatError(f"{what}: malformed array stream ({type(exc).__name__}: {exc})") from None
    raise DatasetFormatError(f"{what}: the array stream has no STOP")


def ragged_int_lists(data: bytes, what: str, max_items: int = 200_000_000) -> np.ndarray:
    """A 1-D object array of lists of Python ints from one ``.npy`` member holding Keras's ragged word ids."""
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(f)
    except ValueError as exc:
        raise DatasetFormatError(f"{what}: not a NumPy .npy array ({exc})") from None
    if not dtype.hasobject:  # a plain array: no stream to decode
        count = int(np.prod(shape))
        return np.frombuffer(data, dtype, count, offset=f.tell()).reshape(shape)
    obj = _decode(data[f.tell():], what, max_items)
    ok = (isinstance(obj, _Call) and isinstance(obj.func, _Global) and obj.func.name == "_reconstruct"
          and isinstance(obj.state, tuple) and len(obj.state) == 5)
    if ok:
        _, got_shape, dt, _, values = obj.state
        ok = (isinstance(dt, _Call) and isinstance(dt.func, _Global) and dt.func.name == "dtype"
              and isinstance(dt.args, tuple) and dt.args[:1] == ("O8",) and tuple(got_shape) == tuple(shape)
              and len(shape) == 1 and isinstance(values, list) and len(values) == shape[0])
    if not ok:
        raise DatasetFormatError(f"{what}: not a 1-D object array of lists (the layout Keras's imdb/reuters files "
                                 "have); refused")
    out = np.empty(len(values), dtype=object)
    for i, seq in enumerate(values):
        if not isinstance(seq, list) or not all(type(w) is int for w in seq):
            raise DatasetFormatError(f"{what}: entry {i} is not a list of ints; refused")
        out[i] = seq
    return out
