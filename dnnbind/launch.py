"""``python -m dnnbind.launch --nproc-per-node N train.py args...``: see :mod:`dnnbind.distribution.launch`."""

from __future__ import annotations

import sys

from .distribution.launch import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
