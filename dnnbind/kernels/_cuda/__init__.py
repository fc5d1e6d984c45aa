"""CUDA implementations of the ops: one module per family (``conv``, ``pooling``, ``activation``,
``batchnorm``, ``softmax``, ``losses``, ``dropout``, ``dense``, ``elementwise``, ``optim``) with the
public ops' signatures, plus ``_common`` (streams, handles, alpha/beta scalars, allocation, kernel
launch) and the NVRTC sources (``*.cu``, ``prelude.cuh``). cuDNN's descriptors, the convolution
algorithm choice and the workspace are :mod:`dnnbind.cudnn`'s: these modules only call cuDNN with them.

The public ops in :mod:`dnnbind.kernels` import these modules lazily, only for DeviceArray inputs;
nothing here touches the GPU at import time.
"""
