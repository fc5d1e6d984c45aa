"""Data-parallel training over several GPUs and hosts through NCCL, with Keras 3's names.

A script becomes data parallel with two lines, and runs unchanged under every launcher::

    import dnnbind
    from dnnbind import distribution

    distribution.set_distribution(distribution.DataParallel())   # before building the model
    model = dnnbind.models.Sequential([...])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, batch_size=256, epochs=5)   # 256 = the global batch, split over the ranks
    if distribution.is_writer():                # rank 0 (ModelCheckpoint already writes on rank 0 only)
        model.save("model.dnnbind")

Launch commands (one process per GPU; the rank variables are read by :mod:`.env`):

* one host, dnnbind's launcher (also sets ``MASTER_ADDR``/``MASTER_PORT``)::

      python -m dnnbind.launch --nproc-per-node 8 train.py --epochs 5

* several hosts, dnnbind's launcher (run on every host, ``--node-rank`` 0..N-1)::

      python -m dnnbind.launch --nnodes 2 --node-rank 0 --nproc-per-node 8 \\
          --master-addr host0 --master-port 29500 train.py

* torchrun (same variables)::

      torchrun --nproc-per-node 8 train.py
      torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --master-addr host0 --master-port 29500 train.py

* Open MPI (``OMPI_COMM_WORLD_*``; the NCCL id goes through the store when ``MASTER_ADDR`` is
  exported, else through mpi4py)::

      mpirun -np 16 -npernode 8 -x MASTER_ADDR=host0 -x MASTER_PORT=29500 python train.py
      mpirun -np 8 python train.py                       # with mpi4py installed

* Slurm (``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``; ``MASTER_ADDR`` defaults to the first
  host of ``SLURM_STEP_NODELIST``, ``MASTER_PORT`` to 29500)::

      srun --nodes 2 --ntasks-per-node 8 --gpus-per-node 8 --kill-on-bad-exit=1 python train.py

Contents:

* :class:`DataParallel`, :func:`set_distribution`, :func:`distribution`, :func:`list_devices`,
  :func:`initialize` (Keras 3), :func:`is_writer`;
* :class:`Communicator` (the interface) and :class:`NcclCommunicator` (ctypes over ``libnccl``; see
  :mod:`dnnbind._lib.nccl` for why not nccl4py): all-reduce, broadcast, all-gather on dnnbind
  streams, a watchdog with ``ncclCommGetAsyncError``/``ncclCommAbort`` and a timeout;
* :mod:`.planning`: the sharding rule, the gradient bucket plan and when a bucket may be issued
  during backward (pure); :mod:`.reducer`: the bucketed all-reduce overlapping backward on a
  communication stream;
* :mod:`.env`: the launcher environments; :mod:`.store`: the TCP rendezvous store;
  :mod:`.launch`: ``python -m dnnbind.launch``.

Timeouts: the rendezvous and a collective wait at most ``DataParallel(timeout=...)`` seconds
(default ``DNNBIND_DIST_TIMEOUT`` or 600 s); ``python -m dnnbind.launch`` stops the other ranks
within ``--grace`` seconds (default 10) of one failing.
"""

from __future__ import annotations

from .communicator import DEFAULT_TIMEOUT, Communicator, NcclCommunicator
from .data_parallel import (DataParallel, Replica, distribution, initialize, is_writer, list_devices,
                            set_distribution)
from .env import ProcessEnv, from_environment
from .planning import BUCKET_BYTES, BucketSchedule, plan_buckets, shard_length, shard_order
from .store import TCPStore, rendezvous

__all__ = [
    "DataParallel",
    "set_distribution",
    "distribution",
    "list_devices",
    "initialize",
    "is_writer",
    "Communicator",
    "NcclCommunicator",
    "Replica",
    "ProcessEnv",
    "from_environment",
    "TCPStore",
    "rendezvous",
    "plan_buckets",
    "BucketSchedule",
    "shard_order",
    "shard_length",
    "BUCKET_BYTES",
    "DEFAULT_TIMEOUT",
]
