"""``keras.ops.nn``: the neural-network ops (``keras.ops.nn``: activations, convolutions, pooling, losses, normalisation...), from :mod:`dnnbind.ops`.

Exports the names of Keras 3.15.1's namespace that dnnbind has as ops (:mod:`dnnbind.ops._namespaces`);
the others raise an AttributeError naming what is missing.
"""

from ._namespaces import install

install(__name__, "nn")
