"""``keras.ops.image``: the image ops (``keras.ops.image``), from :mod:`dnnbind.ops`.

Exports the names of Keras 3.15.1's namespace that dnnbind has as ops (:mod:`dnnbind.ops._namespaces`);
the others raise an AttributeError naming what is missing.
"""

from ._namespaces import install

install(__name__, "image")
