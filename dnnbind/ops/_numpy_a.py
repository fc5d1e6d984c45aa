"""``keras.ops``, numpy part A: products (``_products``), joins, splits and rearrangements (``_joins``), sequences
and windows (``_windows``). This module only gathers them for ``dnnbind.ops``."""

from __future__ import annotations

from . import _joins, _products, _windows
from ._joins import *  # noqa: F401,F403
from ._products import *  # noqa: F401,F403
from ._windows import *  # noqa: F401,F403

__all__ = [n for m in (_products, _joins, _windows) for n in m.__all__]
