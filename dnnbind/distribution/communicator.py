"""Collectives between the processes of a data-parallel job: the interface, and NCCL behind it.

:class:`Communicator` is what the trainer talks to (tests substitute a loopback one).
:class:`NcclCommunicator` issues NCCL collectives (``ncclAllReduce``, ``ncclBroadcast``,
``ncclAllGather``) on dnnbind streams; a list of arrays goes in one ``ncclGroupStart/End``, which
NCCL turns into one launch. They are stream-ordered and never wait for the host, so they can sit
inside a step captured as a CUDA graph (NCCL supports stream capture; the step's first, eager run
sets up NCCL's per-stream state before the capture).

Faults. A watchdog thread polls every 0.1 s:

* ``ncclCommGetAsyncError`` (a network error, a peer that reported failure);
* progress: the trainer marks each step (:meth:`Communicator.mark`, an event recorded after the
  step was queued); a marker not reached within ``timeout`` seconds (default 600 s, as torch's
  NCCL timeout; ``DataParallel(timeout=...)`` or ``DNNBIND_DIST_TIMEOUT``) means a collective waits
  for a rank that died or hangs;
* the rendezvous store, once a second: a rank that fails (an exception in ``fit``, device OOM
  included) reports why there before it exits, and the others stop with that message.

On a fault it calls ``ncclCommAbort`` (which ends the pending NCCL kernels, so a host blocked on
the stream returns) and records the message; the next :meth:`check` (every step, and before any
host read) raises :class:`~dnnbind.errors.DistributedError` naming the rank. If the main thread
does not pick it up within ``abort_grace`` seconds (default 60 s; it is blocked somewhere NCCL
cannot release), the watchdog prints the message and ends the process with exit code 1, as
torch's ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` does, so no rank hangs forever.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from typing import Any, Sequence

import numpy as np

# dnnbind.cuda and dnnbind._lib.nccl are imported inside the methods: cuda.bindings and libnccl load
# only once a communicator is really made, so `import dnnbind` stays free of both
from ..errors import DistributedError
from .env import ProcessEnv, from_environment
from .store import TCPStore, rendezvous

__all__ = ["Communicator", "NcclCommunicator", "REDUCE_OPS", "DEFAULT_TIMEOUT"]

REDUCE_OPS = ("sum", "avg", "max", "min", "prod")
DEFAULT_TIMEOUT = 600.0
_POLL_S = 0.1
_STORE_POLL_S = 1.0
_UID_KEY = "dnnbind/nccl_unique_id"


def default_timeout() -> float:
    """``DNNBIND_DIST_TIMEOUT`` seconds if set (a positive number), else 600."""
    raw = os.environ.get("DNNBIND_DIST_TIMEOUT")
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"dnnbind.distribution: DNNBIND_DIST_TIMEOUT must be a positive number of seconds, got {raw!r}")
    return value


class Communicator:
    """The collectives data parallelism needs. Array arguments are modified in place.

    Subclasses provide ``rank``, ``world_size`` and the methods below; ``supports_host_arrays``
    is True only for test communicators working on NumPy arrays (the NumPy backend otherwise
    refuses a distribution).
    """

    rank: int = 0
    world_size: int = 1
    supports_host_arrays = False

    def all_reduce(self, arrays: Sequence[Any], op: str = "sum", stream: Any = None) -> None:
        """Reduce each array over the ranks (``op``: sum, avg, max, min, prod), in place, as one group."""
        raise NotImplementedError

    def broadcast(self, arrays: Sequence[Any], root: int = 0, stream: Any = None) -> None:
        """Overwrite each array with rank ``root``'s, in place, as one group."""
        raise NotImplementedError

    def all_gather(self, array: Any, stream: Any = None) -> Any:
        """A new array of shape ``(world_size, *array.shape)``: every rank's ``array`` in rank order."""
        raise NotImplementedError

    def all_reduce_host(self, values: np.ndarray, op: str = "sum") -> np.ndarray:
        """Reduce a small host array over the ranks and return the result (synchronises: epoch ends only)."""
        raise NotImplementedError

    def mark(self, stream: Any = None) -> None:
        """Note that a step was queued on ``stream`` (the watchdog's progress marker); never blocks."""

    def check(self) -> None:
        """Raise DistributedError if a fault was detected (by the watchdog, or another rank's report)."""

    def report_failure(self, message: str) -> None:
        """Tell the other ranks that this one fails, and why (best effort, never raises)."""

    def close(self) -> None:
        """Release the communicator (idempotent)."""


def _check_op(op: str) -> str:
    if op not in REDUCE_OPS:
        raise ValueError(f"dnnbind.distribution: op must be one of {REDUCE_OPS}, got {op!r}")
    return op


class NcclCommunicator(Communicator):
    """A communicator over NCCL, one process per GPU. Make it with :meth:`from_environment`.

    Parameters
    ----------
    comm:
        The raw ``ncclComm_t`` (an int).
    rank, world_size, device:
        This process's rank, the number of ranks, its CUDA device index.
    store:
        The rendezvous store (kept for failure reports), or None (mpi4py rendezvous).
    timeout:
        Seconds a step marker may stay unreached before the communicator is aborted.
    abort_grace:
        Seconds the main thread has to notice an abort before the process exits with code 1.
    """

    def __init__(self, comm: int, rank: int, world_size: int, device: int, *, store: "TCPStore | None" = None,
                 timeout: float = DEFAULT_TIMEOUT, abort_grace: float = 60.0) -> None:
        self._comm = int(comm)
        self.rank, self.world_size, self.device = int(rank), int(world_size), int(device)
        self.store = store
        self.timeout = float(timeout)
        self.abort_grace = float(abort_grace)
        self._fault: "str | None" = None
        self._fault_seen = False
        self._reported = False
        self._marker: "tuple[Any, float] | None" = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name=f"dnnbind-nccl-watchdog-{rank}", daemon=True)
        self._watchdog.start()

    # ----- construction -----------------------------------------------------------------------
    @classmethod
    def from_environment(cls, *, device: "int | None" = None, env: "ProcessEnv | None" = None,
                         timeout: "float | None" = None) -> "NcclCommunicator":
        """Join the job the launcher described (:func:`~dnnbind.distribution.env.from_environment`).

        Rank 0 serves the rendezvous store on ``MASTER_ADDR:MASTER_PORT``; every rank joins it
        (a rank missing after ``timeout`` s is named in the error), rank 0 publishes the NCCL
        unique id there, then every rank calls ``ncclCommInitRank`` on GPU ``device`` (default:
        its local rank). Under mpirun without ``MASTER_ADDR`` the id goes through mpi4py
        (``MPI.COMM_WORLD.Bcast`` of the raw 128 bytes).
        """
        from .. import cuda
        from .._lib import nccl

        env = from_environment() if env is None else env
        timeout = default_timeout() if timeout is None else float(timeout)
        index = env.local_rank if device is None else int(device)
        count = cuda.device_count()
        if index >= count:
            raise DistributedError(f"dnnbind.distribution: rank {env.rank} (local rank {env.local_rank}) needs GPU "
                                   f"{index}, but this host has {count}; start at most {count} processes per host "
                                   "(--nproc-per-node) or pass DataParallel(devices=...)")
        cuda.Device(index).use()
        store = None
        if env.master_addr is not None:
            # a job of one process: nobody else needs to reach its store
            host = env.master_addr if env.world_size > 1 else "127.0.0.1"
            store = TCPStore(host, env.master_port, is_server=env.rank == 0, timeout=timeout,
                             token=env.store_token)
            try:
                rendezvous(store, env.rank, env.world_size, timeout=timeout)
                if env.rank == 0:
                    uid = nccl.UniqueId()
                    nccl.call("ncclGetUniqueId", ctypes.byref(uid))
                    store.set(_UID_KEY, uid.to_bytes())
                else:
                    uid = nccl.UniqueId.from_bytes(store.get(_UID_KEY, timeout))
            except BaseException:
                store.close()
                raise
        else:
            uid = _mpi_unique_id(env)
        handle = ctypes.c_void_p()
        try:
            nccl.call("ncclCommInitRank", ctypes.byref(handle), env.world_size, uid, env.rank,
                      context={"rank": env.rank, "world_size": env.world_size, "device": index})
        except BaseException as exc:
            if store is not None:
                store.report_failure(env.rank, f"ncclCommInitRank failed: {exc}")
                store.close()
            raise
        return cls(int(handle.value), env.rank, env.world_size, index, store=store, timeout=timeout)

    # ----- collectives ------------------------------------------------------------------------
    def _check_arrays(self, arrays: Sequence[Any], what: str) -> list:
        from ..cuda import DeviceArray
        from .._lib import nccl

        out = []
        for i, a in enumerate(arrays):
            if not isinstance(a, DeviceArray):
                raise TypeError(f"NcclCommunicator.{what}: array {i} must be a DeviceArray, got {type(a).__name__}")
            if not a.is_contiguous:
                raise ValueError(f"NcclCommunicator.{what}: array {i} (shape {tuple(a.shape)}) must be contiguous")
            if a.device.index != self.device:
                raise ValueError(f"NcclCommunicator.{what}: array {i} is on cuda:{a.device.index} but this rank's "
                                 f"communicator is on cuda:{self.device}")
            out.append((a, int(nccl.dtype_of(a.dtype))))
        return out

    def _grouped(self, calls: list, what: str) -> None:
        from .._lib import nccl

        self.check()
        nccl.call("ncclGroupStart")
        try:
            for name, args in calls:
                nccl.call(name, *args, context=lambda: {"collective": what, "rank": self.rank,
                                                        "world_size": self.world_size})
        finally:
            nccl.call("ncclGroupEnd", context=lambda: {"collective": what, "rank": self.rank})

    def all_reduce(self, arrays: Sequence[Any], op: str = "sum", stream: Any = None) -> None:
        from ..cuda import as_stream
        from .._lib import nccl

        code = int(getattr(nccl.RedOp, _check_op(op).upper()))
        checked = self._check_arrays(arrays, "all_reduce")
        s = as_stream(stream).handle
        self._grouped([("ncclAllReduce", (a.ptr, a.ptr, a.size, dt, code, self._comm, s)) for a, dt in checked],
                      "all_reduce")

    def broadcast(self, arrays: Sequence[Any], root: int = 0, stream: Any = None) -> None:
        from ..cuda import as_stream

        if not (0 <= int(root) < self.world_size):
            raise ValueError(f"NcclCommunicator.broadcast: root must be in [0, {self.world_size}), got {root}")
        checked = self._check_arrays(arrays, "broadcast")
        s = as_stream(stream).handle
        self._grouped([("ncclBroadcast", (a.ptr, a.ptr, a.size, dt, int(root), self._comm, s)) for a, dt in checked],
                      "broadcast")

    def all_gather(self, array: Any, stream: Any = None) -> Any:
        from .. import cuda

        ((a, dt),) = self._check_arrays([array], "all_gather")
        s = cuda.as_stream(stream)
        out = cuda.empty((self.world_size, *a.shape), a.dtype, stream=s, device=self.device)
        self._grouped([("ncclAllGather", (a.ptr, out.ptr, a.size, dt, self._comm, s.handle))], "all_gather")
        return out

    def all_reduce_host(self, values: np.ndarray, op: str = "sum") -> np.ndarray:
        from .. import cuda

        host = np.ascontiguousarray(values)
        stream = cuda.current_stream(self.device)
        dev = cuda.to_device(host, stream=stream, device=self.device)
        self.all_reduce([dev], op, stream=stream)
        out = dev.to_host(stream=stream)
        self.check()  # an abort while waiting: the values are garbage, say why instead
        return out

    # ----- faults -----------------------------------------------------------------------------
    def mark(self, stream: Any = None) -> None:
        from .. import cuda

        self.check()
        with self._lock:
            if self._marker is not None:
                return  # one marker in flight measures "no progress for timeout s"
            s = cuda.as_stream(stream)
            if s.is_capturing():
                return
            self._marker = (cuda.Event(timing=False, device=self.device).record(s), time.monotonic())

    def check(self) -> None:
        if self._fault is not None:
            self._fault_seen = True
            raise DistributedError(self._fault)

    def report_failure(self, message: str) -> None:
        if self._reported or self.store is None:
            return
        self._reported = True
        self.store.report_failure(self.rank, message)

    def _fail(self, message: str) -> None:
        """Abort the communicator and record why (watchdog thread)."""
        from .._lib import nccl

        text = (f"dnnbind.distribution: rank {self.rank} of {self.world_size} stops: {message}. The NCCL "
                "communicator was aborted (ncclCommAbort)")
        with self._lock:
            if self._fault is not None:
                return
            self._fault = text
            comm, self._comm = self._comm, 0
        if comm:
            try:
                nccl.raw("ncclCommAbort")(comm)
            except Exception:  # already failing: the recorded message is what matters
                pass
        print(text, file=sys.stderr, flush=True)

    def _watch(self) -> None:
        from .. import cuda
        from .._lib import nccl

        try:
            cuda.Device(self.device).use()  # events and NCCL queries need this thread's context
        except Exception:
            return
        status = ctypes.c_int()
        last_store = time.monotonic()
        store_alive = True
        while not self._stop.wait(_POLL_S):
            if self._fault is not None:
                deadline = time.monotonic() + self.abort_grace
                while time.monotonic() < deadline and not self._stop.is_set():
                    if self._fault_seen:
                        return
                    time.sleep(_POLL_S)
                if not self._fault_seen and not self._stop.is_set():
                    print(f"{self._fault}; the main thread did not return within {self.abort_grace:g} s, "
                          "exiting with code 1", file=sys.stderr, flush=True)
                    os._exit(1)
                return
            comm = self._comm
            if not comm:
                return
            if nccl.raw("ncclCommGetAsyncError")(comm, ctypes.byref(status)) == 0 and status.value not in (0, 7):
                self._fail(f"NCCL reported {nccl.status_name(status.value)} asynchronously "
                           f"({nccl.error(status.value, 'ncclCommGetAsyncError').detail})")
                continue
            marker = self._marker
            waited = 0.0
            if marker is not None:
                try:
                    done = marker[0].query()
                except Exception as exc:
                    self._fail(f"the step's event failed: {exc}")
                    continue
                if done:
                    with self._lock:
                        if self._marker is marker:
                            self._marker = None
                else:
                    waited = time.monotonic() - marker[1]
                    if waited > self.timeout:
                        self._fail(f"a collective did not complete within {self.timeout:g} s (a rank died, hangs, "
                                   "or runs different collectives)")
                        continue
            if self.store is not None and store_alive and time.monotonic() - last_store >= _STORE_POLL_S:
                last_store = time.monotonic()
                try:
                    other = self.store.failure()
                except DistributedError as exc:
                    store_alive = False
                    if waited > 5.0:  # idle ranks may outlive rank 0 at the end of a job: only a stuck one is told
                        self._fail(str(exc))
                    continue
                if other is not None and not other.startswith(f"rank {self.rank}:"):
                    self._fail(f"another rank failed: {other}")

    def close(self) -> None:
        """Stop the watchdog, destroy the communicator (after this rank's work is done) and leave
        the store; rank 0 keeps serving it until every rank left (at most ``timeout`` s)."""
        from .._lib import nccl

        self._stop.set()
        with self._lock:
            comm, self._comm = self._comm, 0
        if comm:
            nccl.call("ncclCommDestroy", comm)
        store, self.store = self.store, None
        if store is not None:
            try:
                store.set(f"dnnbind/left/{self.rank}", b"1")
                if store.server is not None:
                    store.missing([f"dnnbind/left/{r}" for r in range(self.world_size)], min(self.timeout, 60.0))
            except DistributedError:
                pass
            store.close()


def _mpi_unique_id(env: ProcessEnv) -> Any:
    """The NCCL unique id through MPI (mpirun without MASTER_ADDR): raw bytes, no pickle."""
    from .._lib import nccl

    try:
        from mpi4py import MPI
    except ImportError:
        raise DistributedError(
            "dnnbind.distribution: started by mpirun without MASTER_ADDR/MASTER_PORT and mpi4py is not installed; "
            "either `pip install mpi4py`, or export the rendezvous address: "
            "mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500 ...") from None
    buf = bytearray(nccl.UNIQUE_ID_BYTES)
    if env.rank == 0:
        uid = nccl.UniqueId()
        nccl.call("ncclGetUniqueId", ctypes.byref(uid))
        buf[:] = uid.to_bytes()
    MPI.COMM_WORLD.Bcast([buf, MPI.BYTE], root=0)
    return nccl.UniqueId.from_bytes(bytes(buf))
