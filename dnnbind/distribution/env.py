"""Who am I in the job: rank, world size, local rank and the rendezvous address, read from the
environment that a launcher set.

Recognised launchers, in this order of precedence (the first whose variables are present wins):

==========================  =================================================================================
``python -m dnnbind.launch``  ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
and ``torchrun``              ``MASTER_PORT`` (the same variables, so a script runs under either)
``mpirun`` (Open MPI)         ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``, ``OMPI_COMM_WORLD_LOCAL_RANK``,
                              ``OMPI_COMM_WORLD_LOCAL_SIZE``; ``MASTER_ADDR``/``MASTER_PORT`` if exported
                              (``-x``), else the NCCL id goes through mpi4py
Slurm ``srun``                ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NTASKS_PER_NODE``;
                              ``MASTER_ADDR`` defaults to the first host of ``SLURM_STEP_NODELIST`` (or
                              ``SLURM_JOB_NODELIST``), ``MASTER_PORT`` to 29500
nothing                       one process: rank 0 of 1, ``127.0.0.1``
==========================  =================================================================================

Everything here is a pure function of a mapping (``os.environ`` by default), so it is tested
without launching anything.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

__all__ = ["ProcessEnv", "from_environment", "first_slurm_host", "DEFAULT_PORT"]

DEFAULT_PORT = 29500  # torchrun's default, so the same firewall rule serves both


@dataclass(frozen=True)
class ProcessEnv:
    """This process's place in the job.

    Attributes
    ----------
    rank, world_size:
        Global rank in ``[0, world_size)`` and the number of processes (one per GPU).
    local_rank, local_world_size:
        Rank among the processes of this host, and how many run here (``local_rank`` picks the GPU).
    master_addr, master_port:
        Where rank 0's rendezvous store listens (None: unknown, e.g. mpirun without ``-x``; the
        NCCL id then goes through mpi4py).
    launcher:
        ``"dnnbind.launch"``/``"torchrun"`` (``"env"``), ``"mpirun"``, ``"slurm"`` or ``"none"``.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: "str | None"
    master_port: "int | None"
    launcher: str


def _int(env: Mapping[str, str], name: str, minimum: int = 0) -> int:
    raw = env.get(name)
    try:
        value = int(str(raw).strip())
    except (TypeError, ValueError):
        raise ValueError(f"dnnbind.distribution: environment variable {name} must be an integer, "
                         f"got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"dnnbind.distribution: environment variable {name} must be >= {minimum}, got {value}")
    return value


def _port(env: Mapping[str, str], default: "int | None") -> "int | None":
    if env.get("MASTER_PORT") in (None, ""):
        return default
    port = _int(env, "MASTER_PORT", 1)
    if port > 65535:
        raise ValueError(f"dnnbind.distribution: MASTER_PORT must be a TCP port in [1, 65535], got {port}")
    return port


def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``"gpu[003-005,9],cpu1"`` -> ``"gpu003"``.

    Handles the compressed forms ``scontrol show hostnames`` expands (a prefix with a bracketed
    list of numbers or zero-padded ranges), so no ``scontrol`` call is needed.
    """
    text = nodelist.strip()
    if not text:
        raise ValueError("dnnbind.distribution: SLURM_STEP_NODELIST is empty")
    # the first top-level comma ends the first entry; commas inside brackets do not
    depth = 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            text = text[:i]
            break
    match = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\](.*)", text)
    if not match:
        if "[" in text or "]" in text:
            raise ValueError(f"dnnbind.distribution: cannot read the Slurm node list {nodelist!r}")
        return text
    prefix, inner, suffix = match.groups()
    first = inner.split(",")[0].split("-")[0]
    if "[" in suffix:  # e.g. "rack[1-2]-node[01-04]": expand the rest the same way
        return first_slurm_host(prefix + first + suffix)
    return prefix + first + suffix


def from_environment(env: "Mapping[str, str] | None" = None) -> ProcessEnv:
    """Read this process's rank, world size, local rank and rendezvous address (see the module).

    Raises ValueError naming the variable for a malformed or inconsistent value (a rank outside
    ``[0, world_size)``, a local rank outside ``[0, local_world_size)``).
    """
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE", 1)
        local = _int(env, "LOCAL_RANK") if env.get("LOCAL_RANK", "") != "" else rank
        local_world = (_int(env, "LOCAL_WORLD_SIZE", 1) if env.get("LOCAL_WORLD_SIZE", "") != ""
                       else max(world, local + 1))
        addr = env.get("MASTER_ADDR") or "127.0.0.1"
        out = ProcessEnv(rank, world, local, local_world, addr, _port(env, DEFAULT_PORT), "env")
    elif "OMPI_COMM_WORLD_RANK" in env:
        rank, world = _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE", 1)
        local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK") if "OMPI_COMM_WORLD_LOCAL_RANK" in env else rank
        local_world = (_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1) if "OMPI_COMM_WORLD_LOCAL_SIZE" in env
                       else max(world, local + 1))
        addr = env.get("MASTER_ADDR") or None
        out = ProcessEnv(rank, world, local, local_world, addr, _port(env, DEFAULT_PORT if addr else None),
                         "mpirun")
    elif "SLURM_PROCID" in env:
        rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS", 1)
        local = _int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0
        # SLURM_NTASKS_PER_NODE may read "4" or "4(x2)" or "4,2(x3)": the first count is ours on
        # homogeneous jobs, and a larger local id proves it is at least that
        per_node = env.get("SLURM_NTASKS_PER_NODE", "")
        match = re.match(r"\s*(\d+)", per_node)
        local_world = max(int(match.group(1)) if match else 1, local + 1)
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        addr = env.get("MASTER_ADDR") or (first_slurm_host(nodelist) if nodelist else "127.0.0.1")
        out = ProcessEnv(rank, world, local, local_world, addr, _port(env, DEFAULT_PORT), "slurm")
    else:
        addr = env.get("MASTER_ADDR") or "127.0.0.1"
        out = ProcessEnv(0, 1, 0, 1, addr, _port(env, DEFAULT_PORT), "none")
    if out.rank >= out.world_size:
        raise ValueError(f"dnnbind.distribution ({out.launcher}): rank {out.rank} is outside [0, {out.world_size}) "
                         f"(world size {out.world_size})")
    if out.local_rank >= out.local_world_size:
        raise ValueError(f"dnnbind.distribution ({out.launcher}): local rank {out.local_rank} is outside "
                         f"[0, {out.local_world_size})")
    return out
