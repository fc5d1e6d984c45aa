"""``keras.ops``, numpy part A: products (``_products``). This module only gathers them for
``dnnbind.ops``."""

from __future__ import annotations

from . import _products
from ._products import *  # noqa: F401,F403

__all__ = list(_products.__all__)
