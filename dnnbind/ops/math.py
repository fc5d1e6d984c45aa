"""``keras.ops.math``: the math ops (``keras.src.ops.math``'s names in ``keras.ops``: fft, stft, segment_sum, top_k, logsumexp...), from :mod:`dnnbind.ops`.

Exports the names of Keras 3.15.1's namespace that dnnbind has as ops (:mod:`dnnbind.ops._namespaces`);
the others raise an AttributeError naming what is missing.
"""

from ._namespaces import install

install(__name__, "math")
