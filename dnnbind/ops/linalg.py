"""``keras.ops.linalg``: the linear-algebra ops (``keras.ops.linalg``), from :mod:`dnnbind.ops`.

Exports the names of Keras 3.15.1's namespace that dnnbind has as ops (:mod:`dnnbind.ops._namespaces`);
the others raise an AttributeError naming what is missing.
"""

from ._namespaces import install

install(__name__, "linalg")
