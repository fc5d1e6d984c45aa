"""``python -m dnnbind.launch``: start one training process per GPU and watch them.

::

    python -m dnnbind.launch --nproc-per-node 4 train.py --epochs 10
    python -m dnnbind.launch --nnodes 2 --node-rank 0 --nproc-per-node 8 \\
        --master-addr node0 --master-port 29500 train.py        # on node0, and --node-rank 1 on node1

Each child gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` (torchrun's names, so the same script also runs under torchrun) on top of the
launcher's own environment, which is passed through unchanged (``NCCL_NVLS_ENABLE``,
``NCCL_DEBUG``, ``CUDA_VISIBLE_DEVICES``... stay as they are), and ``DNNBIND_STORE_TOKEN``, the
secret rank 0's store asks of every rank: the launcher's own when set, else a random one per job.
Several hosts share no launcher, so with ``--nnodes`` > 1 and a ``--master-addr`` other than loopback
it must be set, to the same value, on every host. A bad value (``MASTER_PORT=abc``) is reported in one
line naming the variable, with exit code 2 as for a bad argument.

Monitoring: the launcher polls its children every 0.1 s. When one exits with a non-zero code (or
a signal), the others get SIGTERM, and SIGKILL after ``--grace`` seconds (default 10), so every
process is gone within about ``grace + 0.2`` s of the failure; the launcher then exits with the
failed child's code (1 for a signal) and prints which rank failed, e.g.
``dnnbind.launch: rank 1 (pid 4242) exited with code 1; stopped ranks [0, 2, 3]``. SIGINT or
SIGTERM sent to the launcher is forwarded to every child. Each child runs in its own process
group, which is what gets signalled (a child's own workers go with it).
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from typing import Sequence

from .env import DEFAULT_PORT, TOKEN_VARIABLE, is_loopback, read_port

__all__ = ["main", "build_parser", "child_environments", "free_port"]

_POLL_S = 0.1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dnnbind.launch",
        description="Start one dnnbind training process per GPU (data parallel), torchrun-style.")
    parser.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1,
                        help="processes (GPUs) on this host (default 1)")
    parser.add_argument("--nnodes", type=int, default=1, help="hosts in the job (default 1)")
    parser.add_argument("--node-rank", "--node_rank", type=int, default=0, help="this host's index (default 0)")
    parser.add_argument("--master-addr", "--master_addr", default=None,
                        help="host of rank 0's rendezvous store (default $MASTER_ADDR or 127.0.0.1)")
    parser.add_argument("--master-port", "--master_port", type=int, default=None,
                        help=f"its TCP port (default $MASTER_PORT or {DEFAULT_PORT}; 0 picks a free one, one host only)")
    parser.add_argument("--grace", type=float, default=10.0,
                        help="seconds between SIGTERM and SIGKILL when stopping the others (default 10)")
    parser.add_argument("-m", "--module", action="store_true", help="run the script as a module (python -m)")
    parser.add_argument("script", help="the training script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    return parser


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (another process may still take it before rank 0 binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def child_environments(base: "dict[str, str]", *, nproc_per_node: int, nnodes: int, node_rank: int,
                       master_addr: str, master_port: int, store_token: "str | None" = None) -> list[dict[str, str]]:
    """The environment of each local child: ``base`` plus the rank variables and, when given, the
    store's token (pure; tested)."""
    world = nproc_per_node * nnodes
    out = []
    for local in range(nproc_per_node):
        env = dict(base)
        env.update(RANK=str(node_rank * nproc_per_node + local), WORLD_SIZE=str(world), LOCAL_RANK=str(local),
                   LOCAL_WORLD_SIZE=str(nproc_per_node), GROUP_RANK=str(node_rank), MASTER_ADDR=master_addr,
                   MASTER_PORT=str(master_port))
        if store_token is not None:
            env[TOKEN_VARIABLE] = store_token
        # another launcher's variables would take precedence in a script that reads them directly
        for stale in ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                      "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_LOCALID"):
            env.pop(stale, None)
        out.append(env)
    return out


def _store_token(env: "dict[str, str] | os._Environ", nnodes: int, addr: str) -> str:
    """The job's store token: the environment's, else a new random one (one host only: other hosts'
    launchers could not know it)."""
    token = env.get(TOKEN_VARIABLE)
    if token is not None:
        if not token.strip():
            raise ValueError(f"{TOKEN_VARIABLE} is set but empty; unset it (one host: the launcher makes one) or "
                             "give every host the same secret")
        return token.strip()
    if nnodes > 1 and not is_loopback(addr):
        raise ValueError(f"--nnodes {nnodes} with --master-addr {addr}: the hosts' ranks meet in a store reachable "
                         f"from the network, which admits only ranks holding the job's secret; export {TOKEN_VARIABLE} "
                         "with the same value on every host first, e.g. "
                         f"{TOKEN_VARIABLE}=$(python -c 'import secrets; print(secrets.token_hex(16))')")
    return secrets.token_hex(16)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _stop(procs: list[subprocess.Popen], ranks: list[int], grace: float) -> list[int]:
    """SIGTERM the running children, SIGKILL what is left after ``grace`` s; their ranks."""
    running = [(r, p) for r, p in zip(ranks, procs) if p.poll() is None]
    for _, p in running:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.poll() is None for _, p in running):
        time.sleep(_POLL_S / 2)
    for _, p in running:
        if p.poll() is None:
            _signal_group(p, signal.SIGKILL)
    for _, p in running:
        try:
            p.wait(timeout=5.0)
        except subprocess.TimeoutExpired:  # unkillable (D state): nothing more to do
            pass
    return [r for r, _ in running]


def main(argv: "Sequence[str] | None" = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.nproc_per_node < 1:
        parser.error(f"--nproc-per-node must be >= 1, got {args.nproc_per_node}")
    if args.nnodes < 1 or not (0 <= args.node_rank < args.nnodes):
        parser.error(f"--node-rank must be in [0, --nnodes={args.nnodes}), got {args.node_rank}")
    if args.grace < 0:
        parser.error(f"--grace must be >= 0 seconds, got {args.grace}")
    addr = args.master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    try:
        port = args.master_port if args.master_port is not None else read_port(os.environ, DEFAULT_PORT, minimum=0)
        token = _store_token(os.environ, args.nnodes, addr)
    except ValueError as exc:  # one line naming the variable, as argparse reports a bad argument
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    if port == 0:
        if args.nnodes > 1:
            parser.error("--master-port 0 (a free port) works on one host only: the other hosts cannot know it")
        port = free_port(addr)
    if not (1 <= port <= 65535):
        parser.error(f"--master-port must be in [1, 65535], got {port}")
    command = [sys.executable, *(["-m"] if args.module else []), args.script, *args.script_args]
    envs = child_environments(dict(os.environ), nproc_per_node=args.nproc_per_node, nnodes=args.nnodes,
                              node_rank=args.node_rank, master_addr=addr, master_port=port, store_token=token)
    ranks = [int(e["RANK"]) for e in envs]
    procs: list[subprocess.Popen] = []
    received: list[int] = []

    def forward(signum, _frame) -> None:
        received.append(signum)
        for p in procs:
            if p.poll() is None:
                _signal_group(p, signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for env in envs:
            procs.append(subprocess.Popen(command, env=env, start_new_session=True))
        while True:
            codes = [p.poll() for p in procs]
            failed = [(r, p, c) for r, p, c in zip(ranks, procs, codes) if c not in (None, 0)]
            if failed:
                rank, proc, code = failed[0]
                stopped = _stop(procs, ranks, args.grace)
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                print(f"dnnbind.launch: rank {rank} (pid {proc.pid}) {how}; stopped ranks {stopped}",
                      file=sys.stderr, flush=True)
                return code if code > 0 else 1
            if all(c == 0 for c in codes):
                return 0
            if received and all(c is not None for c in codes):
                return 128 + received[0]
            time.sleep(_POLL_S)
    finally:
        if any(p.poll() is None for p in procs):
            _stop(procs, ranks, args.grace)
        for s, handler in previous.items():
            signal.signal(s, handler)


if __name__ == "__main__":  # pragma: no cover - python -m dnnbind.distribution.launch
    sys.exit(main())
