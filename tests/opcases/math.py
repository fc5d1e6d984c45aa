"""Cases of the ``keras.ops.math`` family (``dnnbind/ops/_math.py``): segments, sequences, Fourier transforms,
complex views, distances, determinants. The transforms of ``(real, imag)`` pairs take them as a list, so the
harness differentiates both parts (against finite differences; Keras is compared on values there)."""

import dataclasses

import numpy as np

from . import A, B, Case, I


@dataclasses.dataclass(frozen=True)
class Wellposed(A):
    """Random well-conditioned square matrices (``M @ M.T / n + I``, then ``sign`` times it), for
    determinants: finite differences need ``det`` far from 0."""

    sign: float = 1.0

    def make(self, rng, dtype=None):
        m = rng.uniform(-1, 1, size=self.shape)
        n = self.shape[-1]
        spd = m @ np.swapaxes(m, -1, -2) / n + np.eye(n)
        if self.sign < 0:  # one negative eigenvalue: det < 0
            spd[..., 0, :] *= -1
        return spd.astype(dtype or self.dtype)


IDS = np.array([0, 0, 2, 2, 2, 1], np.int32)
IDS_DROP = np.array([3, 0, -1, 2, 1, 7], np.int32)  # -1 and 7 fall outside num_segments=4: dropped
DATA = A((6, 3))


def _segment(reduce, identity):
    def ref(data, ids, num_segments=None, sorted=False):
        num = int(ids.max()) + 1 if num_segments is None else num_segments
        out = np.full((num,) + data.shape[1:], identity, data.dtype)
        for s in range(num):
            rows = data[ids == s]
            if len(rows):
                out[s] = reduce(rows, axis=0)
        return out
    return ref


def _frames(x, length, stride):
    count = 1 + (x.shape[-1] - length) // stride
    return np.stack([x[..., i * stride:i * stride + length] for i in range(count)], axis=-2)


def _complex(pair):
    return pair[0] + 1j * pair[1]


def _parts(z, dtype):
    return [np.real(z).astype(dtype), np.imag(z).astype(dtype)]


def _cdist(x, y):
    return np.sqrt(np.sum((x[..., :, None, :] - y[..., None, :, :]) ** 2, axis=-1))


PAIR = [A((2, 8)), A((2, 8))]
PAIR2 = [A((2, 4, 5)), A((2, 4, 5))]
HALF = [A((2, 5)), A((2, 5))]
SIGNAL = A((2, 40))
SPECTRUM = [A((2, 7, 9)), A((2, 7, 9))]  # 7 frames of an fft_length-16 transform

CASES = [
    # segments
    Case("segment_sum", (DATA, IDS, 3), grad=(0,), ref=_segment(np.sum, 0)),
    Case("segment_sum", (DATA, IDS_DROP, 4), {"sorted": False}, grad=(0,), ref=_segment(np.sum, 0), name="drop"),
    Case("segment_sum", (I((6, 2), -5, 5), IDS, 3), name="int", ref=_segment(np.sum, 0)),
    Case("segment_sum", (DATA, IDS), name="inferred", ref=_segment(np.sum, 0),
         keras=False),  # Keras's JAX backend requires num_segments; dnnbind infers it (a host read), as its NumPy one
    Case("segment_max", (DATA, IDS, 3), {"sorted": True}, grad=(0,), ref=_segment(np.max, -np.inf)),
    Case("segment_max", (DATA, IDS_DROP, 5), name="empty", ref=_segment(np.max, -np.inf)),
    Case("segment_max", (I((6, 2), -5, 5), IDS, 4), name="int",
         ref=_segment(np.max, np.iinfo(np.int32).min)),
    Case("segment_max", (B((6,)), IDS, 4), name="bool", ref=_segment(np.max, False)),
    Case("segment_min", (DATA, IDS, 3), grad=(0,), ref=_segment(np.min, np.inf)),
    Case("segment_min", (A((6,)), IDS_DROP, 4), grad=(0,), name="drop", ref=_segment(np.min, np.inf)),
    Case("segment_min", (I((6, 2), -5, 5), IDS, 4), name="int", ref=_segment(np.min, np.iinfo(np.int32).max)),
    Case("segment_prod", (DATA, IDS, 3), ref=_segment(np.prod, 1)),
    Case("segment_prod", (I((6, 2), -3, 4), IDS_DROP, 5), name="int", ref=_segment(np.prod, 1)),
    # sequences
    Case("extract_sequences", (A((2, 10)), 4, 3), grad=(0,), ref=_frames),
    Case("extract_sequences", (A((3, 9)), 4, 2), grad=(0,), ref=_frames, name="overlap"),
    Case("extract_sequences", (A((2, 3, 7)), 3, 5), grad=(0,), ref=_frames, name="gaps"),
    Case("extract_sequences", (I((10,), 0, 9), 3, 2), ref=_frames, name="int"),
    # Fourier transforms
    Case("fft", (PAIR,), grad=(0,), ref=lambda x: _parts(np.fft.fft(_complex(x)), x[0].dtype), gpu_dtypes=()),
    Case("fft2", (PAIR2,), grad=(0,), ref=lambda x: _parts(np.fft.fft2(_complex(x)), x[0].dtype), gpu_dtypes=()),
    Case("ifft2", (PAIR2,), grad=(0,), ref=lambda x: _parts(np.fft.ifft2(_complex(x)), x[0].dtype), gpu_dtypes=()),
    Case("rfft", (A((2, 8)),), grad=(0,), ref=lambda x: _parts(np.fft.rfft(x), x.dtype), gpu_dtypes=()),
    Case("rfft", (A((3, 7)), 10), grad=(0,), name="pad", ref=lambda x, n: _parts(np.fft.rfft(x, n), x.dtype),
         gpu_dtypes=()),
    Case("rfft", (A((3, 7)), 5), grad=(0,), name="crop", ref=lambda x, n: _parts(np.fft.rfft(x, n), x.dtype),
         gpu_dtypes=()),
    Case("rfft", (I((6,), -4, 4),), name="int", ref=lambda x: _parts(np.fft.rfft(x), np.float32), gpu_dtypes=()),
    Case("irfft", (HALF,), grad=(0,), ref=lambda x: np.fft.irfft(_complex(x)).astype(x[0].dtype), gpu_dtypes=()),
    *[Case("irfft", (HALF, n), grad=(0,), name=name, gpu_dtypes=(),
           ref=lambda x, n: np.fft.irfft(_complex(x), n).astype(x[0].dtype))
      for n, name in ((9, "odd"), (4, "crop"), (14, "pad"))],
    Case("stft", (SIGNAL, 8, 4, 16), grad=(0,), gpu_dtypes=()),
    Case("stft", (SIGNAL, 7, 3, 8), {"window": "hamming", "center": False}, grad=(0,), name="hamming",
         gpu_dtypes=()),
    Case("stft", (SIGNAL, 8, 5, 8), {"window": None}, grad=(0,), name="no_window", gpu_dtypes=(), keras=False,
         ref=lambda x, n, s, f, window: _parts(np.fft.rfft(_frames(np.pad(x, [(0, 0), (4, 4)], "reflect"), 8, 5)),
                                               x.dtype)),  # (a NumPy reference is enough; Keras's JAX is slow)
    Case("stft", (SIGNAL, 6, 4, 9, A((6,), 0.2, 1.0)), grad=(0, 4), name="tensor_window", gpu_dtypes=()),
    Case("istft", (SPECTRUM, 8, 4, 16), grad=(0,), gpu_dtypes=()),
    Case("istft", (SPECTRUM, 10, 3, 16), {"window": "hamming", "center": False, "length": 30}, grad=(0,),
         name="hamming", gpu_dtypes=()),
    Case("istft", (SPECTRUM, 16, 8, 16), {"window": None}, grad=(0,), name="no_window", gpu_dtypes=()),
    Case("istft", (SPECTRUM, 12, 6, 16), {"window": A((12,), 0.2, 1.0), "length": 40}, grad=(0,),
         name="tensor_window", gpu_dtypes=()),
    # complex views (values compared on their real parts here: tests/test_ops_math.py checks them whole)
    Case("view_as_complex", (A((3, 2)),), ref=lambda x: (x[..., 0] + 1j * x[..., 1]).astype(np.complex64),
         gpu_dtypes=()),
    Case("view_as_real", (np.array([1 + 2j, -0.5 + 0j, 3 - 4j], np.complex64),), gpu_dtypes=(),
         ref=lambda z: np.stack([z.real, z.imag], -1)),
    Case("view_as_real", (A((2, 3)),), grad=(0,), name="real",
         ref=lambda x: np.stack([x, np.zeros_like(x)], -1)),
    Case("polar", (A((2, 3), 0.1, 2.0), A((2, 3), -3.0, 3.0)), gpu_dtypes=(),
         ref=lambda r, t: r * np.cos(t) + 1j * r * np.sin(t)),
    # distances and determinants
    Case("cdist", (A((4, 3)), A((5, 3))), grad=(0, 1), ref=_cdist),
    Case("cdist", (A((2, 4, 3)), A((5, 3))), grad=(0, 1), ref=_cdist, name="batch"),
    Case("cdist", (I((3, 2), -3, 3), I((2, 2), -3, 3)), name="int",
         ref=lambda x, y: _cdist(x, y).astype(np.float32)),
    Case("slogdet", (Wellposed((3, 3)),), grad=(0,), ref=lambda x: list(np.linalg.slogdet(x)), gpu_dtypes=()),
    Case("slogdet", (Wellposed((2, 4, 4), sign=-1.0),), grad=(0,), name="batch_negative",
         ref=lambda x: list(np.linalg.slogdet(x)), gpu_dtypes=()),
    Case("logdet", (Wellposed((4, 4)),), grad=(0,), ref=lambda x: np.linalg.slogdet(x)[1], gpu_dtypes=()),
    Case("logdet", (Wellposed((2, 3, 3)),), grad=(0,), ref=lambda x: np.linalg.slogdet(x)[1], name="batch",
         gpu_dtypes=(), keras=False),  # (slogdet-batch_negative compares the batch with Keras)
]
