"""``keras.ops.core``: the core ops (``keras.src.ops.core``'s names in ``keras.ops``: cast, cond, scan, while_loop, slice...), from :mod:`dnnbind.ops`.

Exports the names of Keras 3.15.1's namespace that dnnbind has as ops (:mod:`dnnbind.ops._namespaces`);
the others raise an AttributeError naming what is missing.
"""

from ._namespaces import install

install(__name__, "core")
