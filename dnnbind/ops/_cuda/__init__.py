"""CUDA implementations of the ops: one module per family (``conv``, ``pooling``, ``activation``,
``batchnorm``, ``softmax``, ``losses``, ``dropout``, ``dense``, ``elementwise``, ``optim``) with the
public ops' signatures, plus ``_common`` (handles, descriptor caches, workspace, kernel launch),
``algo`` (convolution algorithm choice) and the NVRTC sources (``*.cu``, ``prelude.cuh``).

The public ops in :mod:`dnnbind.ops` import these modules lazily, only for DeviceArray inputs;
nothing here touches the GPU at import time.
"""
