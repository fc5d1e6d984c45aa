"""``DataParallel`` and the global distribution, with Keras 3's names; the trainer's hook.

One process per GPU. Each process builds the same model; ``fit`` then

* takes ``batch_size`` as the **global** batch (Keras 3): each of the ``world_size`` replicas
  reads ``batch_size // world_size`` rows (``batch_size`` must be a multiple of the replicas);
* shards the data like torch's ``DistributedSampler``: the same shuffle seed on every rank
  (rank 0's seed is broadcast when ``fit(seed=None)``), the pass's order padded by wrapping to a
  multiple of ``world_size``, rank ``r`` taking every ``world_size``-th item from ``r``
  (:func:`~dnnbind.distribution.planning.shard_order`). Arrays are sharded by sample, a PyDataset
  by batch index (each of its batches is then one replica's batch); a generator cannot be
  sharded: it is refused unless ``auto_shard_dataset=False`` (each rank's generator then yields
  that rank's batches);
* broadcasts the weights (and built optimizer state) from rank 0 at the start of every ``fit``;
* all-reduces (averages) the gradients inside the step in buckets of
  :data:`~dnnbind.distribution.planning.BUCKET_BYTES` planned in reverse parameter order, each
  bucket one NCCL group issued on a communication stream as soon as backward produced its
  gradients, overlapping the rest of backward; the optimizer update waits for the last one
  (:mod:`.reducer`; captured with the step's graph);
* sums the loss and metric totals and counts over the ranks at the end of each epoch (and of
  each validation), so every rank's ``History`` holds the global values (the progress bar's
  per-batch values are rank 0's own);
* lets rank 0 alone write: ``ModelCheckpoint`` and ``CSVLogger`` run on rank 0 only and the
  progress bar is drawn by rank 0 only (``is_writer()`` tells a script the same).

The NumPy backend refuses a distribution (it runs one process).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import numpy as np

from .. import _validate, backend
from ..errors import DistributedError
from .communicator import Communicator, NcclCommunicator
from .env import from_environment
from .planning import BUCKET_BYTES, FIRST_BUCKET_BYTES, plan_buckets
from .reducer import CollectiveStream, GradientReducer
from ..utils import draw_seed

__all__ = ["DataParallel", "set_distribution", "distribution", "list_devices", "initialize", "is_writer",
           "Replica"]

_global: "DataParallel | None" = None
_OWNER = "DataParallel"


def _device_index(value: Any, where: str) -> int:
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        if int(value) < 0:
            raise ValueError(f"{_OWNER}: {where} must be >= 0, got {value}")
        return int(value)
    if isinstance(value, str):
        try:
            device = backend.Device(value)  # the one parser of device strings
        except ValueError:
            device = None
        if device is not None and device.is_cuda and device.index is not None:
            return device.index
        raise ValueError(f"{_OWNER}: {where} must look like 'gpu:0' or 'cuda:0' (one process per GPU), got {value!r}")
    raise _validate.ArgumentTypeError(f"{_OWNER}: {where} must be a device string like 'gpu:0' or an int, "
                                      f"got {type(value).__name__}")


class DataParallel:
    """Data parallelism over one process per GPU (Keras 3: ``keras.distribution.DataParallel``).

    Parameters
    ----------
    device_mesh:
        Not supported (only ``None``): there is one replica per process.
    devices:
        The job's devices, one per rank in rank order (``["gpu:0", "gpu:1", ...]``; on several hosts
        each host's local indices), or None: rank ``r`` uses GPU ``LOCAL_RANK``. Its length must be
        the job's world size.
    auto_shard_dataset:
        Shard ``fit``/``evaluate`` data over the ranks (default, see the module). False: every
        rank reads the data it is given as its own shard.
    timeout:
        Seconds for the rendezvous and for a collective to complete before the job is aborted
        (None: ``DNNBIND_DIST_TIMEOUT`` or 600).
    bucket_bytes:
        Gradient bucket size in bytes (default 25 MiB, as torch DDP; the first bucket 1 MiB).
    communicator:
        An already-made :class:`~dnnbind.distribution.Communicator` (tests pass a loopback one);
        None: NCCL, connected on first use from the launcher's environment.
    """

    def __init__(self, device_mesh: Any = None, devices: "Sequence[Any] | None" = None,
                 auto_shard_dataset: bool = True, *, timeout: "float | None" = None,
                 bucket_bytes: int = BUCKET_BYTES, communicator: "Communicator | None" = None) -> None:
        if device_mesh is not None:
            raise NotImplementedError(f"{_OWNER}: device_mesh is not supported (one replica per process); pass "
                                      "devices=[...] or nothing")
        if devices is not None:
            if isinstance(devices, (str, bytes)) or not isinstance(devices, (list, tuple)):
                raise _validate.ArgumentTypeError(f"{_OWNER}: devices must be a list like ['gpu:0', 'gpu:1'], "
                                                  f"got {type(devices).__name__}")
            if not devices:
                raise ValueError(f"{_OWNER}: devices must not be empty")
            devices = [_device_index(d, f"devices[{i}]") for i, d in enumerate(devices)]
        self.auto_shard_dataset = _validate.boolean(auto_shard_dataset, "auto_shard_dataset", _OWNER)
        if timeout is not None:
            timeout = _validate.number(timeout, "timeout", _OWNER, low=0.0, low_open=True)
        self.timeout = timeout
        self.bucket_bytes = _validate.positive_int(bucket_bytes, "bucket_bytes", _OWNER)
        if communicator is not None and not isinstance(communicator, Communicator):
            raise _validate.ArgumentTypeError(f"{_OWNER}: communicator must be a dnnbind.distribution.Communicator, "
                                              f"got {type(communicator).__name__}")
        self._device_indices = devices
        self._communicator = communicator
        self._replica: "Replica | None" = None

    # ----- where this process stands ----------------------------------------------------------
    @property
    def devices(self) -> "list[str] | None":
        return None if self._device_indices is None else [f"gpu:{i}" for i in self._device_indices]

    def _env(self):
        return from_environment()

    @property
    def rank(self) -> int:
        return self._communicator.rank if self._communicator is not None else self._env().rank

    @property
    def world_size(self) -> int:
        return self._communicator.world_size if self._communicator is not None else self._env().world_size

    def device_index(self) -> int:
        """This rank's GPU: ``devices[rank]``, else its local rank."""
        env = self._env()
        if self._device_indices is None:
            return env.local_rank
        if len(self._device_indices) != env.world_size:
            raise ValueError(f"{_OWNER}: devices lists {len(self._device_indices)} device(s) but the job has "
                             f"{env.world_size} rank(s) ({env.launcher}); give one device per rank")
        return self._device_indices[env.rank]

    @property
    def communicator(self) -> Communicator:
        """The communicator, connecting (rendezvous + ``ncclCommInitRank``) on first use."""
        if self._communicator is None:
            self._communicator = NcclCommunicator.from_environment(device=self.device_index(), timeout=self.timeout)
        return self._communicator

    def replica(self) -> "Replica":
        """The trainer's hook for this distribution (one per distribution, so graph keys stay stable)."""
        if self._replica is None:
            self._replica = Replica(self)
        return self._replica

    def close(self) -> None:
        """Release the communicator (the process may then start another distribution)."""
        comm, self._communicator = self._communicator, None
        self._replica = None
        if comm is not None:
            comm.close()

    @contextlib.contextmanager
    def scope(self) -> Iterator["DataParallel"]:
        """Make this the distribution inside a ``with`` block (Keras 3 ``Distribution.scope``)."""
        global _global
        previous = _global
        set_distribution(self)
        try:
            yield self
        finally:
            _global = previous

    def __repr__(self) -> str:
        return (f"DataParallel(devices={self.devices}, auto_shard_dataset={self.auto_shard_dataset}, "
                f"connected={self._communicator is not None})")


def set_distribution(value: "DataParallel | None") -> None:
    """Make ``value`` the distribution ``fit``/``evaluate`` use (Keras 3). None: no distribution.

    On a CUDA machine it also makes this rank's GPU the default device and the current one, so a
    model built afterwards lands there. Nothing is connected yet: that happens on the first
    ``fit`` (or :func:`initialize`).
    """
    global _global
    if value is not None and not isinstance(value, DataParallel):
        raise _validate.ArgumentTypeError(f"set_distribution: value must be a DataParallel or None, "
                                          f"got {type(value).__name__}")
    if value is not None and value._communicator is None:
        index = value.device_index()
        if backend.default_device().is_cuda:
            from .. import cuda  # deferred: cuda.bindings loads only on a CUDA machine

            backend.set_default_device(f"cuda:{index}")
            cuda.Device(index).use()
    _global = value


def distribution() -> "DataParallel | None":
    """The distribution set by :func:`set_distribution`, or None (Keras 3)."""
    return _global


def list_devices(device_type: "str | None" = None) -> list[str]:
    """This host's GPUs as ``["gpu:0", ...]`` (Keras 3); ``device_type`` "gpu"/"cuda" or None; "cpu"
    gives ``["cpu:0"]``."""
    if device_type is not None:
        device_type = _validate.one_of(str(device_type).lower(), "device_type", "list_devices", ("gpu", "cuda", "cpu"))
    if device_type == "cpu":
        return ["cpu:0"]
    from .. import cuda  # deferred: cuda.bindings loads only when asked for GPUs

    return [f"gpu:{i}" for i in range(cuda.device_count())]


def initialize(job_addresses: "str | None" = None, num_processes: "int | None" = None,
               process_id: "int | None" = None) -> DataParallel:
    """Connect now (Keras 3 ``keras.distribution.initialize``): returns the global distribution
    (a new ``DataParallel()`` if none was set) after the rendezvous. The arguments, when given,
    must agree with the launcher's environment (``MASTER_ADDR:MASTER_PORT``, ``WORLD_SIZE``, ``RANK``)."""
    env = from_environment()
    if job_addresses is not None and job_addresses.split(",")[0].strip() != f"{env.master_addr}:{env.master_port}":
        raise ValueError(f"initialize: job_addresses={job_addresses!r} but the environment says "
                         f"{env.master_addr}:{env.master_port} (MASTER_ADDR:MASTER_PORT)")
    if num_processes is not None and int(num_processes) != env.world_size:
        raise ValueError(f"initialize: num_processes={num_processes} but the environment says {env.world_size}")
    if process_id is not None and int(process_id) != env.rank:
        raise ValueError(f"initialize: process_id={process_id} but the environment says rank {env.rank}")
    dist = _global if _global is not None else DataParallel()
    set_distribution(dist)
    dist.communicator  # noqa: B018 - connects
    return dist


def is_writer() -> bool:
    """Whether this process should write files (checkpoints, logs): rank 0, or no distribution."""
    return _global is None or _global.rank == 0


class Replica:
    """What the trainer calls under a distribution (kept apart so ``trainer.py`` holds only hooks)."""

    #: callbacks that write files: rank 0 alone runs them
    WRITER_CALLBACKS = ("ModelCheckpoint", "CSVLogger", "BackupAndRestore", "TensorBoard")

    def __init__(self, dist: DataParallel) -> None:
        self.dist = dist
        self._plans: dict[tuple, list[list[int]]] = {}
        self._collective: dict[int, CollectiveStream] = {}  # device index -> its communication stream

    @property
    def comm(self) -> Communicator:
        return self.dist.communicator

    @property
    def rank(self) -> int:
        return self.dist.rank  # read from the launcher's environment until connected: no connection needed

    @property
    def world_size(self) -> int:
        return self.dist.world_size

    @property
    def shard(self) -> "tuple[int, int] | None":
        """``(rank, world_size)`` for the data adapters, or None when data is not auto-sharded."""
        return (self.rank, self.world_size) if self.dist.auto_shard_dataset else None

    @property
    def is_writer(self) -> bool:
        return self.rank == 0

    # ----- before anything runs ---------------------------------------------------------------
    def check_model(self, model: Any, owner: str) -> None:
        """Refuse the NumPy backend and a model on another GPU than this rank's (before connecting)."""
        comm = self.dist._communicator
        if not model.device.is_cuda and not (comm is not None and comm.supports_host_arrays):
            raise ValueError(f"{owner}: a DataParallel distribution needs the CUDA backend (one process per GPU); "
                             f"this model is on {model.device}. Call dnnbind.distribution.set_distribution(None) "
                             "to train in one process on the CPU")
        if model.device.is_cuda:
            index = comm.device if comm is not None and hasattr(comm, "device") else self.dist.device_index()
            if model.device.index != index:
                raise ValueError(f"{owner}: this rank's GPU is cuda:{index} but the model is on {model.device}; call "
                                 "set_distribution before building the model, or model.to(f'cuda:{index}')")

    def per_replica_batch(self, batch_size: int, owner: str, name: str = "batch_size") -> int:
        """The rows each replica reads for the global ``batch_size`` (Keras 3 splits the global batch)."""
        world = self.world_size
        if self.dist.auto_shard_dataset and batch_size % world:
            raise ValueError(f"{owner}: {name}={batch_size} must be a multiple of the {world} replicas: "
                             f"DataParallel splits the global batch evenly (e.g. {name}={world * max(1, batch_size // world)})")
        return batch_size // world if self.dist.auto_shard_dataset else batch_size

    def check_generator(self, kind: str, owner: str) -> None:
        if kind == "generator" and self.dist.auto_shard_dataset:
            raise ValueError(f"{owner}: DataParallel cannot shard a generator over the {self.world_size} ranks; give "
                             "arrays or a PyDataset, or DataParallel(auto_shard_dataset=False) with a generator that "
                             "yields this rank's batches (dnnbind.distribution.distribution().rank)")

    def agree_seed(self, seed: "int | None") -> "int | None":
        """The shuffle seed every rank uses: ``seed``, or rank 0's draw broadcast (None: draw here)."""
        if seed is not None:
            return seed
        mine = draw_seed() if self.rank == 0 else 0
        # a sum where only rank 0 contributes: exact in float64 for seeds below 2**53
        return int(self.comm.all_reduce_host(np.array([mine], np.float64))[0])

    def writer_callbacks(self, callbacks: list) -> list:
        """The callbacks this rank runs: every one on rank 0; no file writers elsewhere."""
        if self.is_writer:
            return callbacks
        return [c for c in callbacks if type(c).__name__ not in self.WRITER_CALLBACKS]

    def broadcast_state(self, model: Any) -> None:
        """Rank 0's weights (trainable and not) and built optimizer state to every rank."""
        arrays = [w.value for w in model.weights]
        opt = getattr(model, "optimizer", None)
        if opt is not None and getattr(opt, "built", False):
            arrays += [a for slots in opt._slots for a in slots.values()]
            if opt._step_array is not None:
                arrays.append(opt._step_array)
        if arrays:
            self.comm.broadcast(arrays, root=0)

    # ----- inside the step --------------------------------------------------------------------
    def plan(self, nbytes: Sequence[int], dtypes: Sequence[str]) -> list[list[int]]:
        """The bucket plan for gradients of these sizes (bytes) and dtypes, parameter order (cached)."""
        key = tuple(zip(nbytes, dtypes))
        plan = self._plans.get(key)
        if plan is None:
            plan = plan_buckets(list(nbytes), list(dtypes), bucket_bytes=self.dist.bucket_bytes,
                                first_bucket_bytes=min(FIRST_BUCKET_BYTES, self.dist.bucket_bytes))
            self._plans[key] = plan
        return plan

    def collective_stream(self, device: int) -> CollectiveStream:
        """The communication stream of GPU ``device`` (made on first use, kept with this replica)."""
        stream = self._collective.get(device)
        if stream is None:
            stream = self._collective[device] = CollectiveStream(device)
        return stream

    def gradient_reducer(self, slots: Sequence[tuple[Any, Any]]) -> "GradientReducer | None":
        """This step's reducer for the trainable weights ``slots`` (``(layer, weight)``, parameter
        order), or None when there is nothing to reduce. Bucketed by the weights' sizes and dtypes,
        so every rank builds the same plan before backward starts."""
        if not slots:
            return None
        values = [w.value for _, w in slots]
        plan = self.plan([int(v.size) * int(v.dtype.itemsize) for v in values], [str(v.dtype) for v in values])
        if not backend.is_device_array(values[0]):
            return GradientReducer(self.comm, slots, plan)
        from .. import cuda  # deferred: cuda.bindings loads only on a CUDA machine

        device = values[0].device.index
        # the ops' stream (stream=None): the step's, the capturing one while a graph is recorded
        return GradientReducer(self.comm, slots, plan, self.collective_stream(device), cuda.as_stream(None))

    def step_all_reduce(self, arrays: Sequence[Any], op: str = "sum") -> None:
        """Reduce ``arrays`` in place for a computation of the step that needs the result now
        (``SyncBatchNormalization``): on the communication stream, after the collectives issued
        before it (the gradient buckets already under way), with the current stream joined back."""
        if not arrays:
            return
        if not backend.is_device_array(arrays[0]):
            self.comm.all_reduce(arrays, op)
            return
        from .. import cuda  # deferred: cuda.bindings loads only on a CUDA machine

        device = arrays[0].device.index
        self.collective_stream(device).run(cuda.as_stream(None),
                                           lambda stream: self.comm.all_reduce(arrays, op, stream=stream))

    def after_step(self) -> None:
        """After a step was queued: the watchdog's progress marker, and any fault it found."""
        self.comm.mark()

    # ----- epoch ends -------------------------------------------------------------------------
    def reduce_metrics(self, metrics: Sequence[Any]) -> None:
        """Sum every metric's device total, weighted count, state variables and host count over the ranks, so
        ``result()`` is global."""
        targets = []
        for m in metrics:
            impl = getattr(m, "_impl", None)
            targets.append(impl if impl is not None else m)
        totals = [t._total for t in targets if t._total is not None]
        # a weighted update's device count, and the metrics' state variables of aggregation "sum" (Keras's
        # default: confusion counts, AUC, IoU, F-scores, R2, Sum, a user's totals)
        totals += [t._weight_count for t in targets if getattr(t, "_weight_count", None) is not None]
        totals += [v.value for t in targets for v in getattr(t, "_variables", ()) if v.aggregation == "sum"]
        if totals:
            self.comm.all_reduce(totals, "sum")
        counts = self.comm.all_reduce_host(np.array([float(t._count) for t in targets], np.float64))
        for t, count in zip(targets, counts):
            t._count = float(count)

    def report_failure(self, exc: BaseException) -> None:
        comm = self.dist._communicator  # never connect just to report
        if comm is not None and not isinstance(exc, DistributedError):  # those came from another rank
            comm.report_failure(f"{type(exc).__name__}: {exc}")
