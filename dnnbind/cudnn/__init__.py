"""Public cuDNN objects: the room every dnnbind op drives cuDNN through.

* the handle (:class:`Handle`, :func:`get_handle`: one cached handle per stream);
* the legacy-API descriptors (tensor, filter, convolution, pooling, activation, dropout, ...; the RNN
  API's :class:`RNNDescriptor` and :class:`RNNDataDescriptor`, in :mod:`._rnn`),
  with a bounded, lock-free-on-hit ``cached()`` (:class:`LRUCache`);
* the convolution algorithm choice and its cache (:mod:`dnnbind.cudnn.algo`);
* the grow-only per-stream workspace (:func:`workspace`, :func:`workspace_buffer`,
  :func:`release_workspaces`);
* the graph (backend) API: :class:`Graph` builds fused operation graphs, :class:`Plan` runs them
  (:mod:`dnnbind.cudnn.graph`).

Everything here is owned (idempotent ``close()``, context manager, ``weakref.finalize``
cleanup) and imports without a GPU; the legacy descriptors even work without one. The raw 1:1
bindings are :mod:`dnnbind._lib.cudnn` and :mod:`dnnbind._lib.cudnn_graph`.
"""

from __future__ import annotations

from .._lib.cudnn import cudart_version, version
from . import _descriptors, algo, graph
from .._cache import LRUCache
from ._descriptors import *  # noqa: F401,F403  (the descriptors and their records; see its __all__)
from ._handle import Handle, get_handle
from . import _rnn
from ._rnn import RNNDataDescriptor, RNNDataInfo, RNNDescriptor, RNNInfo, RNNWeightParam
from ._workspace import release_workspaces, workspace, workspace_buffer
from .graph import Graph, GraphNotSupportedError, Plan, clear_plan_cache, plan_cache_info

__all__ = ["Handle", "get_handle", "version", "cudart_version", *_descriptors.__all__, *_rnn.__all__,
           "algo", "LRUCache", "workspace", "workspace_buffer", "release_workspaces",
           "graph", "Graph", "Plan", "GraphNotSupportedError", "clear_plan_cache", "plan_cache_info"]
