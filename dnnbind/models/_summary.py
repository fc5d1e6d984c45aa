"""``Model.summary()``: Keras 3's table in plain text, without rich.

Keras 3 (``keras/src/utils/summary_utils.py``) draws the table with rich (``rich.table.Table``, box
``HEAVY_HEAD``, one space of padding each side, ``show_lines=True``); printed without a terminal it
has no colour, and that is the text reproduced here, character for character: the column widths
come from ``positions`` and ``line_length`` as Keras computes them, then are narrowed as rich
narrows fixed-width columns (``ratio_reduce`` of the excess, one share per column); cells wrap at
spaces (rich's ``divide_line`` without folding; a word longer than its column is cut with an
ellipsis) and are aligned left, right or centred as Keras asks (the header's cells to the bottom).
"""

from __future__ import annotations

import math
import re
import shutil
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["render_table", "format_summary", "emit"]

# rich's box.HEAVY_HEAD
_TOP = ("┏", "━", "┳", "┓")
_HEAD = ("┃", "┃", "┃")
_HEAD_RULE = ("┡", "━", "╇", "┩")
_BODY = ("│", "│", "│")
_ROW_RULE = ("├", "─", "┼", "┤")
_BOTTOM = ("└", "─", "┴", "┘")


def _column_widths(positions: Sequence[float], line_length: int) -> list[int]:
    """Keras's widths (``int(pos * line_length) - current``), then rich's: each cell is ``width + 2``
    (padding) and the excess over ``line_length - borders`` is taken off in equal shares."""
    widths, current = [], 0
    for pos in positions:
        width = int(pos * line_length) - current
        if width < 4:
            raise ValueError("Insufficient console width to print summary.")
        widths.append(width)
        current += width
    cells = [w + 2 for w in widths]
    available = line_length - (len(cells) + 1)
    excess = sum(cells) - available
    if excess > 0:
        total_ratio, remaining, reduced = len(cells), excess, []
        for cell in cells:
            taken = min(cell, round(remaining / total_ratio))
            reduced.append(cell - taken)
            remaining -= taken
            total_ratio -= 1
        cells = reduced
    return cells


def _wrap(text: str, width: int) -> list[str]:
    """rich's word wrap without folding: greedy at spaces; a word wider than ``width`` keeps a line of its
    own, cut to ``width`` with an ellipsis."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        breaks, offset = [], 0
        for match in re.finditer(r"\s*\S+\s*", paragraph):
            start, word = match.start(), match.group()
            length = len(word.rstrip())
            if width - offset >= length:
                offset += len(word)
            elif length > width:
                if start:
                    breaks.append(start)
                offset = len(word)
            elif offset and start:
                breaks.append(start)
                offset = len(word)
        bounds = [0, *breaks, len(paragraph)]
        for a, b in zip(bounds, bounds[1:]):
            line = paragraph[a:b].rstrip()
            if len(line) > width:
                line = line[: width - 1] + "…"
            lines.append(line)
    return lines


def _align(text: str, width: int, how: str) -> str:
    if how == "right":
        return text.rjust(width)
    if how == "center":
        left = (width - len(text)) // 2
        return " " * left + text + " " * (width - len(text) - left)
    return text.ljust(width)


def render_table(header: Sequence[str], rows: Sequence[Sequence[str]], alignment: Sequence[str],
                 positions: Sequence[float], line_length: int) -> list[str]:
    """The table's lines (no trailing newlines), as rich draws Keras's summary table."""
    cells = _column_widths(positions, line_length)
    inner = [c - 2 for c in cells]

    def rule(chars):
        left, fill, cross, right = chars
        return left + cross.join(fill * c for c in cells) + right

    def block(fields, bars, bottom=False):
        wrapped = [_wrap(str(f), w) for f, w in zip(fields, inner)]
        height = max(len(w) for w in wrapped)
        if bottom:  # rich aligns the header's cells to the bottom, the body's to the top
            wrapped = [[""] * (height - len(w)) + w for w in wrapped]
        out = []
        for i in range(height):
            parts = [" " + _align(w[i] if i < len(w) else "", width, how) + " "
                     for w, width, how in zip(wrapped, inner, alignment)]
            out.append(bars[0] + bars[1].join(parts) + bars[2])
        return out

    lines = [rule(_TOP), *block(header, _HEAD, bottom=True), rule(_HEAD_RULE)]
    for i, row in enumerate(rows):
        if i:
            lines.append(rule(_ROW_RULE))
        lines.extend(block(row, _BODY))
    lines.append(rule(_BOTTOM))
    return lines


def _readable_bytes(size: float) -> str:
    """Keras's ``readable_memory_size``: powers of 1024, two decimals."""
    units = ["B", "KB", "MB", "GB", "TB", "PB"]
    for unit in units:
        if size / 1024 < 1:
            return f"{size:.2f} {unit}"
        size /= 1024
    return f"{size:.2f} {units[-1]}"


def _count_and_bytes(weights: Sequence[Any]) -> tuple[int, int]:
    unique = {id(w): w for w in weights}.values()
    count = sum(int(math.prod(tuple(w.shape))) for w in unique)
    nbytes = sum(int(math.prod(tuple(w.shape))) * np.dtype(str(w.dtype)).itemsize for w in unique)
    return count, nbytes


def format_summary(model: Any, rows: Sequence[tuple], connected: bool, line_length: "int | None" = None,
                   positions: "Sequence[float] | None" = None, show_trainable: bool = False,
                   extra_lines: Sequence[str] = ()) -> str:
    """The whole summary text (ending with a newline), as Keras 3 prints it without a terminal.

    ``rows``: ``(name (type), output shape, params, connected to, layer)``; ``connected``: the four-column
    layout of a non-sequential functional model (Keras's ``sequential_like`` False).
    """
    if connected:
        default_length, positions = 108, list(positions or [0.3, 0.56, 0.74, 1.0])
        header = ["Layer (type)", "Output Shape", "Param #", "Connected to"]
        alignment = ["left", "left", "right", "left"]
    else:
        default_length, positions = 88, list(positions or [0.45, 0.80, 1.0])
        header = ["Layer (type)", "Output Shape", "Param #"]
        alignment = ["left", "left", "right"]
    if show_trainable:
        default_length += 12
        positions = [p * 0.90 for p in positions] + [1.0]
        header.append("Trainable")
        alignment.append("center")
    default_length = min(default_length, shutil.get_terminal_size().columns - 4)
    line_length = line_length or default_length
    body = []
    for name, shape, params, links, layer in rows:
        fields = [name, shape, params]
        if connected:
            fields.append(links or "-")
        if show_trainable:
            weights = getattr(layer, "weights", None) or []
            fields.append(("Y" if layer.trainable else "N") if weights else "-")
        body.append(fields)
    trainable, trainable_bytes = _count_and_bytes(model.trainable_weights)
    frozen, frozen_bytes = _count_and_bytes(model.non_trainable_weights)
    optimizer = getattr(model, "optimizer", None) if getattr(model, "compiled", False) else None
    optimizer_built = optimizer is not None and getattr(optimizer, "built", False)
    opt, opt_bytes = _count_and_bytes(optimizer.variables) if optimizer_built else (0, 0)
    lines = [f'Model: "{model.name}"', *render_table(header, body, alignment, positions, line_length),
             f" Total params: {trainable + frozen + opt:,} ({_readable_bytes(trainable_bytes + frozen_bytes + opt_bytes)})",
             f" Trainable params: {trainable:,} ({_readable_bytes(trainable_bytes)})",
             f" Non-trainable params: {frozen:,} ({_readable_bytes(frozen_bytes)})"]
    if optimizer_built:
        lines.append(f" Optimizer params: {opt:,} ({_readable_bytes(opt_bytes)})")
    lines.extend(extra_lines)
    return "\n".join(lines) + "\n"


def emit(text: str, print_fn: "Callable[..., Any] | None") -> None:
    """Keras hands ``print_fn`` the whole text in one call; without one it goes to stdout."""
    if print_fn is None:
        print(text, end="")
    else:
        print_fn(text)
