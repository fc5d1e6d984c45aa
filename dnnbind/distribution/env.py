"""Who am I in the job: rank, world size, local rank and the rendezvous address, read from the
environment that a launcher set.

Recognised launchers, in this order of precedence (the first whose variables are present wins):

==========================  =================================================================================
``python -m dnnbind.launch``  ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
and ``torchrun``              ``MASTER_PORT`` (the same variables, so a script runs under either)
``mpirun`` (Open MPI)         ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``, ``OMPI_COMM_WORLD_LOCAL_RANK``,
                              ``OMPI_COMM_WORLD_LOCAL_SIZE``; ``MASTER_ADDR``/``MASTER_PORT`` if exported
                              (``-x``), else the NCCL id goes through mpi4py
Slurm ``srun``                ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_STEP_TASKS_PER_NODE``
                              (else ``SLURM_NTASKS_PER_NODE``);
                              ``MASTER_ADDR`` defaults to the first host of ``SLURM_STEP_NODELIST`` (or
                              ``SLURM_JOB_NODELIST``), ``MASTER_PORT`` to 29500
nothing                       one process: rank 0 of 1, ``127.0.0.1``
==========================  =================================================================================

The variables must agree, or :func:`from_environment` refuses them naming the variables: a rank
variable and its world size come together (``RANK`` without ``WORLD_SIZE`` is not ignored), rank <
world size, local rank < local world size <= world size. A job of several processes whose store is
reachable from other hosts (``MASTER_ADDR`` not loopback) needs ``DNNBIND_STORE_TOKEN``, the secret
every rank proves to rank 0's store (:mod:`.store`); ``python -m dnnbind.launch`` makes one on one host.

Everything here is a pure function of a mapping (``os.environ`` by default), so it is tested
without launching anything.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from dataclasses import dataclass
from typing import Mapping

__all__ = ["ProcessEnv", "from_environment", "first_slurm_host", "is_loopback", "read_port", "DEFAULT_PORT",
           "TOKEN_VARIABLE"]

DEFAULT_PORT = 29500  # torchrun's default, so the same firewall rule serves both
#: the job's shared secret, which rank 0's store asks every rank to prove it holds
TOKEN_VARIABLE = "DNNBIND_STORE_TOKEN"


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
    store_token:
        ``DNNBIND_STORE_TOKEN``: the secret every rank proves to rank 0's store (None: not set, which
        only a store on loopback, or a job of one process, allows). Not shown in the repr.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: "str | None"
    master_port: "int | None"
    launcher: str
    store_token: "str | None" = dataclasses.field(default=None, repr=False, compare=False)


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


def read_port(env: Mapping[str, str], default: "int | None", minimum: int = 1) -> "int | None":
    """``MASTER_PORT`` as a TCP port, ``default`` when unset; ValueError naming it when malformed
    (``minimum`` 0: the launcher's "pick a free port")."""
    if env.get("MASTER_PORT") in (None, ""):
        return default
    port = _int(env, "MASTER_PORT", minimum)
    if port > 65535:
        raise ValueError(f"dnnbind.distribution: MASTER_PORT must be a TCP port in [{minimum}, 65535], got {port}")
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


# (rank, world size, local rank, local world size) variables of each launcher, in precedence order
_LAUNCHERS = (
    ("env", ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")),
    ("mpirun", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE")),
    ("slurm", ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")),
)
_PREFIX = "dnnbind.distribution"


def _is_set(env: Mapping[str, str], name: str) -> bool:
    return str(env.get(name, "")).strip() != ""


def _launcher(env: Mapping[str, str]) -> "tuple[str, tuple[str, ...]] | None":
    """The first launcher whose rank or world-size variable is set; both must be, or neither."""
    for launcher, names in _LAUNCHERS:
        rank_name, world_name = names[:2]
        has_rank, has_world = _is_set(env, rank_name), _is_set(env, world_name)
        if has_rank != has_world:
            given, missing = (rank_name, world_name) if has_rank else (world_name, rank_name)
            raise ValueError(f"{_PREFIX}: {given}={env[given]!r} is set but {missing} is not: a launcher sets both "
                             f"(torchrun, mpirun, srun and python -m dnnbind.launch do); set {missing} too, or unset "
                             f"{given} to run as one process")
        if has_rank:
            return launcher, names
    return None


def _check_consistent(out: ProcessEnv, names: "tuple[str, ...]") -> None:
    """rank < world size, local rank < local world size <= world size, naming the variables."""
    rank_name, world_name, local_name, local_world_name = names
    where = f"{_PREFIX} ({out.launcher})"
    if out.rank >= out.world_size:
        raise ValueError(f"{where}: rank {out.rank} is outside [0, {out.world_size}) ({rank_name}={out.rank} must be "
                         f"< {world_name}={out.world_size})")
    if out.local_rank >= out.local_world_size:
        raise ValueError(f"{where}: local rank {out.local_rank} is outside [0, {out.local_world_size}) "
                         f"({local_name}={out.local_rank} must be < {local_world_name}={out.local_world_size})")
    if out.local_world_size > out.world_size:
        raise ValueError(f"{where}: {local_world_name}={out.local_world_size} processes on this host is more than "
                         f"{world_name}={out.world_size} in the whole job; the local world size must be <= the world "
                         "size")


def _store_token(env: Mapping[str, str], out: ProcessEnv) -> "str | None":
    """``DNNBIND_STORE_TOKEN``, required when ranks meet in a store that listens beyond loopback."""
    token = env.get(TOKEN_VARIABLE)
    if token is not None and not token.strip():
        raise ValueError(f"{_PREFIX}: {TOKEN_VARIABLE} is set but empty; give every rank the same secret "
                         "(python -m dnnbind.launch makes one), or unset it on a single host")
    if token is None and out.world_size > 1 and out.master_addr is not None and not is_loopback(out.master_addr):
        raise ValueError(
            f"{_PREFIX} ({out.launcher}): the ranks meet in rank 0's store at {out.master_addr}:{out.master_port}, "
            f"reachable from other hosts, so it admits only ranks that present the job's secret: set "
            f"{TOKEN_VARIABLE} to the same value for every rank (e.g. export {TOKEN_VARIABLE}=$(python -c 'import "
            "secrets; print(secrets.token_hex(16))') before torchrun/srun, and mpirun -x "
            f"{TOKEN_VARIABLE}); python -m dnnbind.launch on one host makes one itself")
    return None if token is None else token.strip()


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface (``localhost``, ``127.x``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def from_environment(env: "Mapping[str, str] | None" = None) -> ProcessEnv:
    """Read this process's rank, world size, local rank and rendezvous address (see the module).

    Raises ValueError naming the variables for a malformed or inconsistent value: a rank variable
    without its world size (or the reverse), a rank outside ``[0, world_size)``, a local rank
    outside ``[0, local_world_size)``, a local world size above the world size, a bad
    ``MASTER_PORT``, or no ``DNNBIND_STORE_TOKEN`` for a store reachable from other hosts.
    """
    env = os.environ if env is None else env
    found = _launcher(env)
    launcher, names = found if found is not None else ("none", ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                "LOCAL_WORLD_SIZE"))
    if launcher == "env":
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE", 1)
        local = _int(env, "LOCAL_RANK") if _is_set(env, "LOCAL_RANK") else rank
        local_world = _int(env, "LOCAL_WORLD_SIZE", 1) if _is_set(env, "LOCAL_WORLD_SIZE") else world
        addr = env.get("MASTER_ADDR") or "127.0.0.1"
        out = ProcessEnv(rank, world, local, local_world, addr, read_port(env, DEFAULT_PORT), "env")
    elif launcher == "mpirun":
        rank, world = _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE", 1)
        local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK") if _is_set(env, "OMPI_COMM_WORLD_LOCAL_RANK") else rank
        local_world = (_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1) if _is_set(env, "OMPI_COMM_WORLD_LOCAL_SIZE")
                       else world)
        addr = env.get("MASTER_ADDR") or None
        out = ProcessEnv(rank, world, local, local_world, addr, read_port(env, DEFAULT_PORT if addr else None),
                         "mpirun")
    elif launcher == "slurm":
        rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS", 1)
        local = _int(env, "SLURM_LOCALID") if _is_set(env, "SLURM_LOCALID") else 0
        # the step's (else the job's) tasks per node may read "4" or "4(x2)" or "4,2(x3)": the first count
        # is ours on homogeneous jobs, a larger local id proves it is at least that, and a job's count
        # (srun -n 1 inside an allocation of 8 per node) cannot pass the step's world size
        per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_NTASKS_PER_NODE", "")
        match = re.match(r"\s*(\d+)", per_node)
        local_world = min(max(int(match.group(1)) if match else 1, local + 1), world)
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        addr = env.get("MASTER_ADDR") or (first_slurm_host(nodelist) if nodelist else "127.0.0.1")
        out = ProcessEnv(rank, world, local, local_world, addr, read_port(env, DEFAULT_PORT), "slurm")
    else:
        addr = env.get("MASTER_ADDR") or "127.0.0.1"
        out = ProcessEnv(0, 1, 0, 1, addr, read_port(env, DEFAULT_PORT), "none")
    _check_consistent(out, names)
    return dataclasses.replace(out, store_token=_store_token(env, out))
