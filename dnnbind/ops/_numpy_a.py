"""``keras.ops``, numpy part A: products (``_products``), joins, splits and rearrangements (``_joins``), sequences
and windows (``_windows``), sorting, searching and counting (``_sorting``). This module only gathers them for
``dnnbind.ops``."""

from __future__ import annotations

from . import _joins, _products, _sorting, _windows
from ._joins import *  # noqa: F401,F403
from ._products import *  # noqa: F401,F403
from ._sorting import *  # noqa: F401,F403
from ._windows import *  # noqa: F401,F403

__all__ = [n for m in (_products, _joins, _windows, _sorting) for n in m.__all__]
