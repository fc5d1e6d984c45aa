"""Data parallelism on the CPU: launcher environments (dnnbind.launch, torchrun, mpirun, Slurm), the
launcher itself (real child processes meeting in the TCP store on 127.0.0.1), sharding, bucketing,
the fault paths (a rank that never joins, a child that fails), the NCCL declarations (when libnccl
is present), and ``fit`` under ``DataParallel`` with a loopback communicator kept in this file: two
ranks as threads on NumPy models must train exactly like one process on the global batch."""

from __future__ import annotations

import ctypes
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import callbacks, layers
from dnnbind import distribution as dd
from dnnbind.distribution import env as denv
from dnnbind.distribution import launch as dlaunch
from dnnbind.distribution import store as dd_store
from dnnbind.distribution.planning import BUCKET_BYTES, FIRST_BUCKET_BYTES
from dnnbind.errors import DistributedError
from testutil import numerical_grad, rel_error

MB = 1024 * 1024


# ----- launcher environments -----------------------------------------------------------------------
TOKEN = {"DNNBIND_STORE_TOKEN": "s3cret"}  # a store reachable from other hosts needs the job's token


def test_env_torchrun_and_dnnbind_launch():
    e = denv.from_environment({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                               "MASTER_ADDR": "node0", "MASTER_PORT": "29400", **TOKEN})
    assert e == denv.ProcessEnv(5, 8, 1, 4, "node0", 29400, "env")
    assert e.store_token == "s3cret" and "s3cret" not in repr(e)
    # without LOCAL_* (a hand-set single host): local rank = rank, defaults for the address
    e = denv.from_environment({"RANK": "2", "WORLD_SIZE": "3"})
    assert (e.rank, e.world_size, e.local_rank, e.local_world_size) == (2, 3, 2, 3)
    assert (e.master_addr, e.master_port) == ("127.0.0.1", 29500)


def test_env_mpirun():
    base = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    e = denv.from_environment(base)
    assert e == denv.ProcessEnv(3, 4, 1, 2, None, None, "mpirun")  # no address: the id goes through mpi4py
    e = denv.from_environment({**base, "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "1234", **TOKEN})
    assert (e.master_addr, e.master_port, e.launcher) == ("10.0.0.7", 1234, "mpirun")


def test_env_slurm():
    e = denv.from_environment({"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
                               "SLURM_NTASKS_PER_NODE": "8(x2)", "SLURM_STEP_NODELIST": "gpu[007-008]", **TOKEN})
    assert e == denv.ProcessEnv(9, 16, 1, 8, "gpu007", 29500, "slurm")
    e = denv.from_environment({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
                               "SLURM_JOB_NODELIST": "a1,b2", "MASTER_PORT": "4000", **TOKEN})
    assert (e.master_addr, e.master_port) == ("a1", 4000)


def test_env_precedence_and_single_process():
    # torchrun inside a Slurm allocation: its variables win
    e = denv.from_environment({"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"})
    assert (e.rank, e.world_size, e.launcher) == (1, 2, "env")
    assert denv.from_environment({}) == denv.ProcessEnv(0, 1, 0, 1, "127.0.0.1", 29500, "none")


@pytest.mark.parametrize("nodelist, host", [
    ("gpu[003-005,9],cpu1", "gpu003"), ("node1", "node1"), ("n[10,2]", "n10"), ("a1,b[1-2]", "a1"),
    ("rack[1-2]-node[01-04]", "rack1-node01"), ("x[0007]-ib", "x0007-ib")])
def test_first_slurm_host(nodelist, host):
    assert denv.first_slurm_host(nodelist) == host


@pytest.mark.parametrize("env, message", [
    ({"RANK": "2", "WORLD_SIZE": "2"}, "rank 2 is outside [0, 2)"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK must be an integer, got 'x'"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE must be >= 1, got 0"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"}, "MASTER_PORT must be a TCP port"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, "local rank 2 is outside [0, 2)"),
])
def test_env_errors_name_the_variable(env, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        denv.from_environment(env)


@pytest.mark.parametrize("env, message", [
    # local rank >= local world size, and local world size > world size (the issue's cases)
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
     "local rank 2 is outside [0, 2) (LOCAL_RANK=2 must be < LOCAL_WORLD_SIZE=2)"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"},
     "LOCAL_WORLD_SIZE=4 processes on this host is more than WORLD_SIZE=2 in the whole job"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, "OMPI_COMM_WORLD_LOCAL_SIZE=3 processes on this host is more than "
                                          "OMPI_COMM_WORLD_SIZE=2"),
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "2"},
     "local rank 2 is outside [0, 2) (SLURM_LOCALID=2 must be < SLURM_NTASKS_PER_NODE=2)"),
    # a rank without its world size (or the reverse) was ignored: the job ran as one process
    ({"RANK": "1"}, "RANK='1' is set but WORLD_SIZE is not"),
    ({"WORLD_SIZE": "4"}, "WORLD_SIZE='4' is set but RANK is not"),
    ({"OMPI_COMM_WORLD_RANK": "3"}, "OMPI_COMM_WORLD_RANK='3' is set but OMPI_COMM_WORLD_SIZE is not"),
    ({"SLURM_NTASKS": "8"}, "SLURM_NTASKS='8' is set but SLURM_PROCID is not"),
    # a store other hosts can reach needs the job's token; an empty one is no token
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.5"}, "set DNNBIND_STORE_TOKEN to the same value for "
                                                                   "every rank"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "gpu[1-2]"}, "store at gpu1:29500, reachable"),
    ({"RANK": "0", "WORLD_SIZE": "1", "DNNBIND_STORE_TOKEN": " "}, "DNNBIND_STORE_TOKEN is set but empty"),
])
def test_inconsistent_environments_are_refused_naming_the_variables(env, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        denv.from_environment(env)


def test_consistent_environments_without_a_token_where_none_is_needed():
    # loopback, one process, or mpirun without MASTER_ADDR (the id goes through mpi4py): no token needed
    assert denv.from_environment({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "localhost"}).store_token is None
    assert denv.from_environment({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "10.0.0.5"}).world_size == 1
    assert denv.from_environment({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}).master_addr is None
    # srun -n 1 inside an allocation of 8 tasks per node: the job's count does not pass the step's
    e = denv.from_environment({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "8"})
    assert (e.world_size, e.local_world_size) == (1, 1)


def test_launcher_reports_a_bad_environment_value_in_one_line():
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "DNNBIND_STORE_TOKEN")}
    for extra, args, message in (
            ({"MASTER_PORT": "abc"}, [], "environment variable MASTER_PORT must be an integer, got 'abc'"),
            ({"MASTER_PORT": "70000"}, [], "MASTER_PORT must be a TCP port in [0, 65535], got 70000"),
            ({}, ["--nnodes", "2", "--master-addr", "10.0.0.5"], "export DNNBIND_STORE_TOKEN with the same value on "
                                                                 "every host")):
        done = subprocess.run([sys.executable, "-m", "dnnbind.launch", *args, "x.py"], capture_output=True, text=True,
                              env={**env, **extra}, timeout=60)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        assert lines[0].startswith("python -m dnnbind.launch: error: ") and message in lines[0], lines


def test_child_environments():
    envs = dlaunch.child_environments({"NCCL_NVLS_ENABLE": "0", "SLURM_PROCID": "7", "KEEP": "1"}, nproc_per_node=3,
                                      nnodes=2, node_rank=1, master_addr="h0", master_port=1234, store_token="t0k")
    assert [e["RANK"] for e in envs] == ["3", "4", "5"]
    assert {e["WORLD_SIZE"] for e in envs} == {"6"} and [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2"]
    for e in envs:
        assert e["NCCL_NVLS_ENABLE"] == "0" and e["KEEP"] == "1" and "SLURM_PROCID" not in e
        assert (e["MASTER_ADDR"], e["MASTER_PORT"], e["LOCAL_WORLD_SIZE"], e["DNNBIND_STORE_TOKEN"]) == \
            ("h0", "1234", "3", "t0k")
        # what the child reads back is what the launcher meant
        parsed = denv.from_environment(e)
        assert (parsed.rank, parsed.world_size, parsed.local_rank) == (int(e["RANK"]), 6, int(e["LOCAL_RANK"]))


# ----- the launcher with real child processes ----------------------------------------------------
_CHILD_OK = r"""
import os
from dnnbind.distribution import TCPStore, from_environment, rendezvous
env = from_environment()
store = TCPStore(env.master_addr, env.master_port, is_server=env.rank == 0, timeout=30, token=env.store_token)
assert env.store_token and len(env.store_token) == 32  # the launcher's, one per job
rendezvous(store, env.rank, env.world_size, timeout=30)
store.set(f"v/{env.rank}", str(10 * env.rank + 1).encode())
values = [int(store.get(f"v/{r}", 30)) for r in range(env.world_size)]
line = f"RESULT {env.rank} {env.world_size} {env.local_rank} {os.environ.get('NCCL_NVLS_ENABLE')} {sum(values)}\n"
os.write(1, line.encode())  # one write: the ranks share the pipe, and print may split a line
store.set(f"done/{env.rank}", b"1")
if env.rank == 0:  # keep serving until every rank read
    assert not store.missing([f"done/{r}" for r in range(env.world_size)], 30)
store.close()
"""

_CHILD_FAIL = """
import os, sys, time
rank = int(os.environ["RANK"])
if rank == 1:
    time.sleep(0.5)
    sys.exit(3)
time.sleep(120)  # the launcher must stop this one
"""


def _launch(tmp_path, body: str, nproc: int, *extra: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(body))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env["NCCL_NVLS_ENABLE"] = "0"
    env["MASTER_ADDR"] = "127.0.0.1"
    return subprocess.run([sys.executable, "-m", "dnnbind.launch", "--nproc-per-node", str(nproc),
                           "--master-port", "0", *extra, str(script)], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_launcher_runs_ranks_that_meet_in_the_store(tmp_path):
    done = _launch(tmp_path, _CHILD_OK, 3)
    assert done.returncode == 0, done.stderr
    rows = sorted(line.split()[1:] for line in done.stdout.splitlines() if line.startswith("RESULT"))
    # rank, world, local rank, NCCL_NVLS_ENABLE passed through, sum of every rank's value (1 + 11 + 21)
    assert rows == [[str(r), "3", str(r), "0", "33"] for r in range(3)]


def test_launcher_stops_the_others_when_one_fails(tmp_path):
    start = time.monotonic()
    done = _launch(tmp_path, _CHILD_FAIL, 3, "--grace", "2")
    elapsed = time.monotonic() - start
    assert done.returncode == 3
    assert "rank 1 (pid" in done.stderr and "exited with code 3" in done.stderr
    assert "stopped ranks [0, 2]" in done.stderr
    # children sleep 120 s: they were stopped (SIGTERM ends a sleeping Python at once; grace 2 s bounds it)
    assert elapsed < 30, elapsed


def test_launcher_argument_errors():
    for args, message in ((["--nproc-per-node", "0", "x.py"], "--nproc-per-node must be >= 1"),
                          (["--nnodes", "2", "--node-rank", "2", "x.py"], "--node-rank must be in [0, --nnodes=2)"),
                          (["--nnodes", "2", "--master-port", "0", "x.py"], "works on one host only")):
        done = subprocess.run([sys.executable, "-m", "dnnbind.launch", *args], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2 and message in done.stderr, done.stderr


# ----- the store and the rendezvous faults ---------------------------------------------------------
def test_rendezvous_names_the_rank_that_never_joins():
    store = dd.TCPStore("127.0.0.1", 0, is_server=True, timeout=5)
    try:
        start = time.monotonic()
        with pytest.raises(DistributedError, match=r"rank\(s\) \[1, 2\] of 3 did not join the rendezvous at "
                                                   r"127\.0\.0\.1:\d+ within 0\.5 s"):
            dd.rendezvous(store, 0, 3, timeout=0.5)
        assert time.monotonic() - start < 5
    finally:
        store.close()


def test_the_store_admits_only_clients_holding_the_token():
    server = dd.TCPStore("127.0.0.1", 0, is_server=True, timeout=5, token="job-secret")
    try:
        for token, state in ((None, "not set"), ("another-job", "set")):
            with pytest.raises(DistributedError, match=rf"refused this rank: it did not present the job's token "
                                                       rf"\(DNNBIND_STORE_TOKEN is {state} here"):
                dd.TCPStore("127.0.0.1", server.port, timeout=5, token=token)
        # a peer that skips the handshake is answered "token" and never served
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
            hello = json.loads(raw.makefile("rb").readline())
            assert hello["hello"] == "dnnbind-store/1" and len(hello["nonce"]) == 32
            raw.sendall(b'{"op": "set", "key": "dnnbind/failure", "value": "00"}\n')
            assert json.loads(raw.makefile("rb").readline()) == {"ok": False, "error": "token"}
        assert server.check("dnnbind/failure") is None
        # a hello nested 1000 deep (it fits the handshake's 1 KiB) is refused the same way: it used to end
        # the connection's thread in a RecursionError traceback, unanswered
        thread_errors = []
        hook, threading.excepthook = threading.excepthook, lambda args: thread_errors.append(args.exc_type)
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
                reader = raw.makefile("rb")
                reader.readline()
                raw.sendall(b"[" * 1000 + b"\n")
                assert json.loads(reader.readline()) == {"ok": False, "error": "token"}
        finally:
            threading.excepthook = hook
        assert thread_errors == []
        client = dd.TCPStore("127.0.0.1", server.port, timeout=5, token="job-secret")
        client.set("k", b"v")
        assert server.get("k", 1) == b"v"
        client.close()
    finally:
        server.close()
    # the client checks the server too: a listener that cannot prove the token is not this job's store
    with socket.socket() as fake:
        fake.bind(("127.0.0.1", 0))
        fake.listen(1)

        def impostor():
            conn, _ = fake.accept()
            with conn:
                conn.sendall(b'{"hello": "dnnbind-store/1", "nonce": "ab"}\n')
                conn.makefile("rb").readline()
                conn.sendall(b'{"ok": true, "proof": "00"}\n')

        t = threading.Thread(target=impostor)
        t.start()
        with pytest.raises(DistributedError, match="does not know this job's token: it is another job's store"):
            dd.TCPStore("127.0.0.1", fake.getsockname()[1], timeout=5, token="job-secret")
        t.join(5)
    with pytest.raises(ValueError, match="would listen on every interface .* but no token"):
        dd_store.StoreServer("0.0.0.0", 0)


_STORE_CHILD = r"""
import json, sys
from dnnbind.distribution import TCPStore


def peak_kib():
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))


store = TCPStore("127.0.0.1", 0, is_server=True, timeout=5, token="t")
print(json.dumps({"port": store.port, "base_kib": peak_kib()}), flush=True)
sys.stdin.readline()  # the parent has sent its oversized lines
print(json.dumps({"peak_kib": peak_kib(), "keys": store.check("after") is not None}), flush=True)
store.close()
"""


def test_an_oversized_store_line_is_refused_in_bounded_memory():
    """A 300 MB unterminated line made rank 0 hold 665 MB. Now the server reads at most
    MAX_MESSAGE_BYTES of a line (before and after the handshake), answers "message too long" and drops
    the connection; its peak memory (measured in the child serving it) barely moves."""
    child = subprocess.Popen([sys.executable, "-c", _STORE_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        start = json.loads(child.stdout.readline())
        port = start["port"]
        chunk = b"x" * (4 * MB)

        def flood(authenticate: bool) -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                reader = sock.makefile("rb")
                hello = json.loads(reader.readline())
                if authenticate:
                    mine = "cd" * 16
                    proof = dd_store._proof(b"t", "client", hello["nonce"], mine)
                    sock.sendall(json.dumps({"nonce": mine, "proof": proof}).encode() + b"\n")
                    assert json.loads(reader.readline())["ok"]
                try:
                    for _ in range(75):  # 300 MB, no newline
                        sock.sendall(chunk)
                except OSError:  # the server dropped the connection part-way: what we want
                    pass
                try:
                    return reader.readline()
                except OSError:
                    return b""

        for authenticate in (False, True):
            reply = flood(authenticate)
            assert reply in (b"", b'{"ok": false, "error": "token"}\n') or b"message too long" in reply, reply
        # exactly one byte over the limit, fully read by the server: the reply arrives whole
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            reader = sock.makefile("rb")
            hello = json.loads(reader.readline())
            proof = dd_store._proof(b"t", "client", hello["nonce"], "ef" * 16)
            sock.sendall(json.dumps({"nonce": "ef" * 16, "proof": proof}).encode() + b"\n")
            assert json.loads(reader.readline())["ok"]
            sock.sendall(b"y" * (dd_store.MAX_MESSAGE_BYTES + 1))
            assert json.loads(reader.readline()) == {
                "ok": False, "error": f"message too long: more than {dd_store.MAX_MESSAGE_BYTES} bytes without a newline"}
            assert reader.readline() == b""  # and the connection is gone
        # the client refuses to send what the server would refuse, naming the limit
        client = dd.TCPStore("127.0.0.1", port, timeout=5, token="t")
        with pytest.raises(DistributedError, match=r"the store request 'set' for key 'big' is [\d,]+ bytes, more than "
                                                   r"the store's limit of 1,048,576 bytes per message"):
            client.set("big", b"z" * (600 * 1024))
        client.set("after", b"1")  # the server still serves
        client.close()
        child.stdin.write("done\n")
        child.stdin.flush()
        end = json.loads(child.stdout.readline())
        assert end["keys"]
        grown_mb = (end["peak_kib"] - start["base_kib"]) / 1024
        assert grown_mb < 50, f"the store's peak memory grew by {grown_mb:.0f} MB"
    finally:
        child.kill()
        child.wait()


def test_rendezvous_of_three_ranks_in_threads_and_failure_reports():
    server = dd.TCPStore("127.0.0.1", 0, is_server=True, timeout=5)
    errors = []

    def rank(r):
        try:
            s = server if r == 0 else dd.TCPStore("127.0.0.1", server.port, timeout=5)
            dd.rendezvous(s, r, 3, timeout=10)
            if r == 2:
                s.report_failure(2, "DeviceOutOfMemoryError: out of memory")
                s.report_failure(2, "a second report is ignored")
            if r != 0:
                s.close()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert not errors
        assert server.failure() == "rank 2: DeviceOutOfMemoryError: out of memory"
        assert server.add("counter", 2) == 2 and server.add("counter", 3) == 5
        with pytest.raises(DistributedError, match="no rank set 'missing' in the rendezvous store within 0.2 s"):
            server.get("missing", timeout=0.2)
    finally:
        server.close()


def test_failure_reports_racing_keep_the_first_in_one_step(monkeypatch):
    """Two ranks failing at once: the report is one atomic set-if-absent on the server (a check then a
    set could let the second overwrite the first), and every rank reads the one that won."""
    server = dd.TCPStore("127.0.0.1", 0, is_server=True, timeout=5)
    a, b = (dd.TCPStore("127.0.0.1", server.port, timeout=5) for _ in range(2))
    try:
        sent = []
        request = dd.TCPStore._request
        monkeypatch.setattr(dd.TCPStore, "_request", lambda self, req, wait=0.0: sent.append(req["op"])
                            or request(self, req, wait))
        a.report_failure(1, "first")
        b.report_failure(3, "second")
        assert sent == ["set_if_absent", "set_if_absent"]
        assert a.failure() == b.failure() == server.failure() == "rank 1: first"
        assert b.set_if_absent("k", b"x") == b"x" and a.set_if_absent("k", b"y") == b"x"
    finally:
        a.close(), b.close(), server.close()


def test_client_names_rank_0_when_the_store_is_unreachable():
    port = dlaunch.free_port()
    start = time.monotonic()
    with pytest.raises(DistributedError, match=rf"rendezvous store of rank 0 at 127\.0\.0\.1:{port} within 0\.3 s"):
        dd.TCPStore("127.0.0.1", port, timeout=0.3)
    assert time.monotonic() - start < 5


def test_lost_store_is_reported_as_rank_0_gone():
    server = dd.TCPStore("127.0.0.1", 0, is_server=True, timeout=5)
    client = dd.TCPStore("127.0.0.1", server.port, timeout=5)
    server.close()
    time.sleep(0.1)
    with pytest.raises(DistributedError, match="rank 0, which serves it, exited or failed"):
        client.set("k", b"v")
    client.close()


def test_closing_the_server_answers_the_request_it_already_read(monkeypatch):
    # rank 0 closes the moment the last rank's "set" lands; that rank must still get its reply
    server = dd.TCPStore("127.0.0.1", 0, is_server=True, timeout=5)
    answer = server.server._answer

    def slow_answer(request):
        reply = answer(request)
        if request.get("key") == "done/1":
            time.sleep(0.3)  # the value is stored; the reply is not sent yet
        return reply

    monkeypatch.setattr(server.server, "_answer", slow_answer)
    client = dd.TCPStore("127.0.0.1", server.port, timeout=5)
    errors: list = []

    def last_rank():
        try:
            client.set("done/1", b"1")
        except Exception as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    t = threading.Thread(target=last_rank)
    t.start()
    assert server.missing(["done/1"], 5) == []
    server.close()
    t.join(10)
    assert not t.is_alive() and errors == []
    # after the close, the next request finds the store gone
    with pytest.raises(DistributedError, match="rank 0, which serves it, exited or failed"):
        client.set("k", b"v")
    client.close()


def test_closing_the_server_ends_a_waiting_get_at_once():
    server = dd.TCPStore("127.0.0.1", 0, is_server=True, timeout=5)
    client = dd.TCPStore("127.0.0.1", server.port, timeout=5)
    errors: list = []

    def waiter():
        try:
            client.get("never", 60)
        except DistributedError as exc:
            errors.append(str(exc))

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.2)
    start = time.monotonic()
    server.close()
    t.join(10)
    assert not t.is_alive() and time.monotonic() - start < 5
    assert len(errors) == 1 and "rank 0, which serves it, exited or failed" in errors[0], errors
    client.close()


# ----- sharding -------------------------------------------------------------------------------------
@pytest.mark.parametrize("n, world", [(64, 4), (10, 4), (3, 5), (1, 2), (17, 1)])
def test_shards_are_disjoint_covering_and_equal(n, world):
    order = np.random.default_rng(11).permutation(n)
    shards = [dd.shard_order(order, r, world) for r in range(world)]
    length = dd.shard_length(n, world)
    assert all(len(s) == length for s in shards)
    joined = np.concatenate(shards)
    assert set(joined.tolist()) == set(range(n))  # covering
    pad = length * world - n
    assert len(joined) - len(set(joined.tolist())) == pad  # disjoint but for the padded repeats
    padded = np.concatenate([order] * (-(-length * world // n)))[:length * world]
    for r in range(world):  # DistributedSampler: rank r takes positions r, r + world, ...
        np.testing.assert_array_equal(shards[r], padded[r::world])


def test_shards_are_seed_consistent_and_rebuild_the_global_batches():
    n, world, global_batch = 48, 4, 8
    orders = [np.random.default_rng(5).permutation(n) for _ in range(world)]  # each rank draws from the same seed
    shards = [dd.shard_order(orders[r], r, world) for r in range(world)]
    per = global_batch // world
    for k in range(n // global_batch):
        rows = np.concatenate([s[k * per:(k + 1) * per] for s in shards])
        assert sorted(rows.tolist()) == sorted(orders[0][k * global_batch:(k + 1) * global_batch].tolist())
    np.testing.assert_array_equal(dd.shard_order(6, 1, 2), [1, 3, 5])  # no shuffle: arange
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\), got 2"):
        dd.shard_order(6, 2, 2)


def test_array_adapter_shards_each_pass():
    from dnnbind.backend import Device
    from dnnbind.trainers.data_adapters import ArrayDataAdapter

    x = np.arange(10, dtype=np.float32)[:, None] + 1
    seen = []
    for r in range(3):
        a = ArrayDataAdapter([x], None, 2, shuffle=True, device=Device("cpu"), shard=(r, 3))
        assert (a.num_samples, a.num_batches) == (4, 2)
        seen.append(np.concatenate([b[0][0][:, 0] for b in a.batches(np.random.default_rng(9))]))
    order = np.random.default_rng(9).permutation(10)
    padded = np.concatenate([order, order[:2]])
    for r in range(3):
        np.testing.assert_array_equal(seen[r], padded[r::3] + 1)


# ----- bucketing ------------------------------------------------------------------------------------
def test_buckets_follow_reverse_order_with_the_ddp_caps():
    sizes = [4 * MB, 100, 10 * MB, 10 * MB, 10 * MB, 512 * 1024, 600 * 1024]
    plan = dd.plan_buckets(sizes, ["float32"] * len(sizes))
    # reverse order; the first bucket closes at 1 MiB, the others at 25 MiB
    assert plan == [[6, 5], [4, 3, 2], [1, 0]]
    assert sorted(i for b in plan for i in b) == list(range(len(sizes)))
    flat = [i for b in plan for i in b]
    assert flat == sorted(flat, reverse=True)
    for b in plan[:-1]:
        size = sum(sizes[i] for i in b)
        assert size >= (FIRST_BUCKET_BYTES if b is plan[0] else BUCKET_BYTES)
        assert size - sizes[b[-1]] < (FIRST_BUCKET_BYTES if b is plan[0] else BUCKET_BYTES)  # closed at once


def test_buckets_never_mix_dtypes_and_big_gradients_stand_alone():
    sizes = [100, 200, 30 * MB, 300, 400]
    dtypes = ["float32", "float16", "float32", "float16", "float32"]
    plan = dd.plan_buckets(sizes, dtypes, bucket_bytes=1000, first_bucket_bytes=1000)
    for b in plan:
        assert len({dtypes[i] for i in b}) == 1
    assert [2] in plan or any(b[-1] == 2 for b in plan)  # the 30 MB one closes its bucket
    assert sorted(i for b in plan for i in b) == list(range(5))
    assert plan == [[4, 2], [3, 1], [0]]
    assert dd.plan_buckets([], []) == []
    with pytest.raises(ValueError, match="3 sizes but 2 dtypes"):
        dd.plan_buckets([1, 2, 3], ["float32"] * 2)


# ----- NCCL declarations (only where libnccl is installed) -------------------------------------------
def _nccl_or_skip():
    from dnnbind._lib import loader
    from dnnbind.errors import LibraryNotFoundError

    try:
        loader.load_library("nccl")
    except LibraryNotFoundError as exc:
        pytest.skip(f"libnccl not installed (pip install 'dnnbind[nccl]'): {str(exc).splitlines()[0]}")
    from dnnbind._lib import nccl

    return nccl


def test_nccl_declarations_resolve_and_errors_carry_words():
    nccl = _nccl_or_skip()
    lib = nccl.library()
    for name in nccl.SIGNATURES:
        assert getattr(lib, name) is not None
    assert nccl.version() >= 21000
    uid = nccl.UniqueId()
    nccl.call("ncclGetUniqueId", ctypes.byref(uid))  # needs no GPU
    assert len(uid.to_bytes()) == 128 and uid.to_bytes() != bytes(128)
    assert nccl.UniqueId.from_bytes(uid.to_bytes()).to_bytes() == uid.to_bytes()
    with pytest.raises(keras.errors.NcclError, match=r"ncclCommCount failed with ncclInvalidArgument \(4\): "
                                                     r"invalid argument.*comm argument is NULL"):
        nccl.call("ncclCommCount", None, None)
    assert nccl.dtype_of("float32") == 7 and nccl.dtype_of(np.float16) == 6
    with pytest.raises(ValueError, match="NCCL has no data type for complex64"):
        nccl.dtype_of(np.complex64)


# ----- DataParallel: arguments, and the NumPy backend's refusal ---------------------------------------
def test_data_parallel_arguments():
    dp = dd.DataParallel(devices=["gpu:0", "cuda:1", 2])
    assert dp.devices == ["gpu:0", "gpu:1", "gpu:2"] and dp.auto_shard_dataset
    for kwargs, error, message in (
            ({"device_mesh": object()}, NotImplementedError, "device_mesh is not supported"),
            ({"devices": "gpu:0"}, TypeError, "devices must be a list"),
            ({"devices": ["tpu:0"]}, ValueError, r"devices\[0\] must look like 'gpu:0'"),
            ({"devices": []}, ValueError, "devices must not be empty"),
            ({"timeout": 0}, ValueError, "timeout must be > 0"),
            ({"auto_shard_dataset": "yes"}, TypeError, "auto_shard_dataset must be True or False"),
            ({"communicator": object()}, TypeError, "communicator must be a dnnbind.distribution.Communicator")):
        with pytest.raises(error, match=message):
            dd.DataParallel(**kwargs)
    with pytest.raises(TypeError, match="set_distribution: value must be a DataParallel or None"):
        dd.set_distribution("dp")


def test_numpy_backend_refuses_a_distribution(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    m = _model()
    x, y = _data(16)
    before = [w.copy() for w in m.get_weights()]
    with dd.DataParallel().scope():
        assert dd.distribution() is not None and dd.is_writer()
        with pytest.raises(ValueError, match=r"fit: a DataParallel distribution needs the CUDA backend .*on cpu"):
            m.fit(x, y, epochs=1, verbose=0)
        with pytest.raises(ValueError, match=r"evaluate: a DataParallel distribution needs the CUDA backend"):
            m.evaluate(x, y, verbose=0)
    assert dd.distribution() is None
    assert all(np.array_equal(a, b) for a, b in zip(before, m.get_weights()))  # nothing ran


# ----- a loopback communicator: ranks are threads of this process ---------------------------------------
class LoopbackGroup:
    """``world`` ranks in threads exchanging NumPy arrays through a barrier (reductions in rank order)."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=60)
        self.slots: list = [None] * world
        self.calls: list = []


class LoopbackCommunicator(dd.Communicator):
    supports_host_arrays = True

    def __init__(self, group: LoopbackGroup, rank: int) -> None:
        self.group, self.rank, self.world_size = group, rank, group.world

    def _exchange(self, value):
        g = self.group
        g.slots[self.rank] = value
        g.barrier.wait()
        out = list(g.slots)
        g.barrier.wait()
        return out

    def all_reduce(self, arrays, op="sum", stream=None):
        if self.rank == 0:
            self.group.calls.append(("all_reduce", op, [a.shape for a in arrays]))
        got = self._exchange([np.array(a, copy=True) for a in arrays])
        for i, a in enumerate(arrays):
            total = got[0][i].copy()
            for r in range(1, self.world_size):
                total = total + got[r][i]
            a[...] = total / self.world_size if op == "avg" else total

    def broadcast(self, arrays, root=0, stream=None):
        got = self._exchange([np.array(a, copy=True) for a in arrays])
        for a, b in zip(arrays, got[root]):
            a[...] = b

    def all_gather(self, array, stream=None):
        return np.stack(self._exchange(np.array(array, copy=True)))

    def all_reduce_host(self, values, op="sum"):
        values = np.array(values)
        self.all_reduce([values], op)
        return values


def _data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = ((x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1)).astype(np.int64)
    return x, y


def _model(seed=3):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((6,)), layers.Dense(8, activation="relu"), layers.Dense(3, activation="softmax")])
    m.compile(keras.optimizers.SGD(0.1, momentum=0.9), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return m


def _run_ranks(world, fn, monkeypatch, comm=LoopbackCommunicator, **dp_kwargs):
    """``fn(rank, dist)`` in ``world`` threads, each seeing its own distribution (``DataParallel(
    communicator=comm(group, rank), **dp_kwargs)``)."""
    group = LoopbackGroup(world)
    local = threading.local()
    monkeypatch.setattr(dd, "distribution", lambda: getattr(local, "dist", None))
    results, errors = [None] * world, []

    def body(rank):
        local.dist = dd.DataParallel(communicator=comm(group, rank), **dp_kwargs)
        try:
            results[rank] = fn(rank, local.dist)
        except BaseException as exc:  # pragma: no cover - re-raised below
            errors.append(exc)
            group.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return results, group


def test_fit_on_two_loopback_ranks_equals_one_process_on_the_global_batch(monkeypatch, tmp_path):
    x, y = _data(64)
    reference = _model()
    start = [w.copy() for w in reference.get_weights()]
    ref_hist = reference.fit(x, y, batch_size=16, epochs=3, seed=7, verbose=0, validation_data=(x[:32], y[:32]))

    def rank_fit(rank, dist):
        m = _model(seed=3 if rank == 0 else 99)  # rank 1 starts elsewhere: the broadcast must fix it
        ck = callbacks.ModelCheckpoint(str(tmp_path / f"w{rank}.weights.safetensors"), save_weights_only=True)
        hist = m.fit(x, y, batch_size=16, epochs=3, seed=7, verbose=0, callbacks=[ck],
                     validation_data=(x[:32], y[:32]))
        return m.get_weights(), hist.history

    results, group = _run_ranks(2, rank_fit, monkeypatch)
    (w0, h0), (w1, h1) = results
    assert all(np.array_equal(a, b) for a, b in zip(w0, w1))  # the same averaged update everywhere
    assert not np.array_equal(w0[0], start[0])
    for a, b in zip(w0, reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    assert h0 == h1  # every rank's History is global
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        np.testing.assert_allclose(h0[key], ref_hist.history[key], rtol=2e-5, atol=2e-6)
    # rank 0 alone wrote its checkpoint
    assert (tmp_path / "w0.weights.safetensors").exists() and not (tmp_path / "w1.weights.safetensors").exists()
    # gradients went in reverse-order buckets as averages (one bucket: the model is far below 1 MiB)
    grads = [c for c in group.calls if c[0] == "all_reduce" and c[1] == "avg"]
    assert len(grads) == 3 * 4  # 3 epochs x 4 steps (64 samples, global batch 16: 8 rows per rank)
    assert grads[0][2] == [(3,), (8, 3), (8,), (6, 8)]


def test_fit_arguments_under_a_distribution(monkeypatch):
    x, y = _data(32)

    def rank_fit(rank, dist):
        m = _model()
        with pytest.raises(ValueError, match=r"batch_size=15 must be a multiple of the 2 replicas"):
            m.fit(x, y, batch_size=15, verbose=0)
        with pytest.raises(ValueError, match="DataParallel cannot shard a generator over the 2 ranks"):
            m.fit(iter([(x, y)]), verbose=0)
        return True

    results, _ = _run_ranks(2, rank_fit, monkeypatch)
    assert results == [True, True]


def test_evaluate_on_two_loopback_ranks_is_global(monkeypatch):
    x, y = _data(40)
    reference = _model()
    expected = reference.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)
    weights = reference.get_weights()

    def rank_eval(rank, dist):
        m = _model()
        m.set_weights(weights)
        return m.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)

    results, _ = _run_ranks(2, rank_eval, monkeypatch)
    assert results[0] == results[1]
    for key in expected:
        np.testing.assert_allclose(results[0][key], expected[key], rtol=1e-5)


def test_evaluate_on_two_loopback_ranks_reduces_weighted_and_variable_metrics(monkeypatch):
    """Weighted metrics (device weight counts) and metrics with state variables (MeanIoU's confusion matrix)
    are global too."""
    x, y = _data(40)
    w = np.random.default_rng(4).uniform(0.2, 2.0, size=40).astype(np.float32)

    def model():
        m = _model()
        m.compile("sgd", "sparse_categorical_crossentropy",
                  metrics=[keras.metrics.MeanIoU(num_classes=3, sparse_y_pred=False)],
                  weighted_metrics=["accuracy", "sparse_categorical_crossentropy"])
        return m

    reference = model()
    expected = reference.evaluate(x, y, sample_weight=w, batch_size=8, verbose=0, return_dict=True)
    weights = reference.get_weights()

    def rank_eval(rank, dist):
        m = model()
        m.set_weights(weights)
        return m.evaluate(x, y, sample_weight=w, batch_size=8, verbose=0, return_dict=True)

    results, _ = _run_ranks(2, rank_eval, monkeypatch)
    assert results[0] == results[1] and "mean_io_u" in expected and "sparse_categorical_crossentropy" in expected
    for key in expected:
        np.testing.assert_allclose(results[0][key], expected[key], rtol=1e-5, err_msg=key)


def test_a_failing_rank_reports_before_raising():
    class Reporting(LoopbackCommunicator):
        reported: list = []

        def report_failure(self, message):
            self.reported.append(message)

    comm = Reporting(LoopbackGroup(1), 0)
    replica = dd.DataParallel(communicator=comm).replica()
    replica.report_failure(MemoryError("device out of memory"))
    replica.report_failure(DistributedError("from another rank"))  # not echoed back
    assert comm.reported == ["MemoryError: device out of memory"]


# ----- gradient buckets overlapping backward ---------------------------------------------------------
def test_bucket_schedule_issues_complete_buckets_in_plan_order():
    schedule = dd.BucketSchedule([[5, 4], [3, 2], [1, 0]])
    assert schedule.deliver(5) == [] and schedule.deliver(4) == [0]
    assert schedule.deliver(1) == [] and schedule.deliver(0) == []  # bucket 2 complete, bucket 1 not yet
    assert schedule.deliver(0) == [] and schedule.deliver(99) == []  # twice, or unknown: nothing
    assert schedule.issued == 1 and not schedule.done
    assert schedule.deliver(2) == [] and schedule.deliver(3) == [1, 2]  # then both, in plan order
    assert schedule.done and schedule.flush() == []
    partial = dd.BucketSchedule([[2], [1, 0]])
    assert partial.deliver(1) == [] and partial.flush() == [0, 1]  # backward over: the rest, in order
    with pytest.raises(ValueError, match="more than one bucket"):
        dd.BucketSchedule([[1, 0], [0]])


class _Recorder(LoopbackCommunicator):
    """Loopback, logging every all-reduce (rank 0) into the same list as the layers' backward runs."""

    def __init__(self, group, rank, events):
        super().__init__(group, rank)
        self.events = events

    def all_reduce(self, arrays, op="sum", stream=None):
        if self.rank == 0:
            self.events.append(("all_reduce", op, [tuple(a.shape) for a in arrays]))
        super().all_reduce(arrays, op, stream)


def _log_backward(model, events, rank):
    for layer in model.layers:
        def backward(dy, need_dx=True, _layer=layer, _original=layer.backward):
            if rank == 0:
                events.append(("backward", _layer.name))
            return _original(dy, need_dx=need_dx)
        layer.backward = backward


def _run_recorded(world, fn, monkeypatch, **dp_kwargs):
    """``fn(rank, events)`` on loopback ranks that log their all-reduces (rank 0's) into ``events``."""
    events = []
    results, _ = _run_ranks(world, lambda rank, dist: fn(rank, events), monkeypatch,
                            comm=lambda group, rank: _Recorder(group, rank, events), **dp_kwargs)
    return results, events


def _three_dense(seed=3, functional=False):
    keras.utils.set_random_seed(seed)
    d1, d2, d3 = layers.Dense(8, activation="relu", name="d1"), layers.Dense(8, name="d2"), \
        layers.Dense(3, activation="softmax", name="d3")
    if functional:
        inp = keras.Input((6,))
        m = keras.Model(inp, d3(d2(d1(inp))))
    else:
        m = keras.Sequential([keras.Input((6,)), d1, d2, d3])
    m.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    return m


@pytest.mark.parametrize("functional", [False, True], ids=["sequential", "functional"])
def test_each_bucket_is_reduced_before_backward_reaches_the_next(monkeypatch, functional):
    x, y = _data(32)
    reference = _three_dense(functional=functional)
    reference.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)

    def rank_fit(rank, events):
        m = _three_dense(functional=functional)
        _log_backward(m, events, rank)
        m.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
        return m.get_weights()

    # 100-byte buckets: [d3 bias+kernel (108 B)], [d2 (288 B)], [d1 (224 B)]
    results, events = _run_recorded(2, rank_fit, monkeypatch, bucket_bytes=100)
    step = [("backward", "d3"), ("all_reduce", "avg", [(3,), (8, 3)]),
            ("backward", "d2"), ("all_reduce", "avg", [(8,), (8, 8)]),
            ("backward", "d1"), ("all_reduce", "avg", [(8,), (6, 8)])]
    grads = [e for e in events if e[0] == "backward" or e[1] == "avg"]
    assert grads == step * 2  # 32 samples, global batch 16: two steps
    assert all(np.array_equal(a, b) for a, b in zip(*results))
    for a, b in zip(results[0], reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_the_engine_reports_a_shared_weight_once_with_its_summed_gradient(rng):
    from dnnbind.autodiff import GradientTape, engine
    from dnnbind.ops._core import ones_like_seed

    keras.utils.set_random_seed(1)
    shared, head = layers.Dense(4, name="shared"), layers.Dense(2, name="head")
    inp = keras.Input((4,))
    m = keras.Model(inp, head(shared(shared(inp))))
    x = rng.normal(size=(5, 4)).astype(np.float32)
    with GradientTape() as tape:
        (out,) = m._run_forward([x], training=True, logits=[False])
    variables = m.trainable_weights
    reported = []
    grads = engine.gradient([out], [ones_like_seed(out)], variables, tape=tape,
                            on_leaf=lambda w, g: reported.append((w.path, g)))
    # each weight once, as soon as it is final: the head's before the shared layer's (the backward's order)
    assert sorted(p for p, _ in reported) == sorted(w.path for w in variables)
    order = [p for p, _ in reported]
    assert max(order.index("head/kernel"), order.index("head/bias")) < min(order.index("shared/kernel"),
                                                                           order.index("shared/bias"))
    final = dict(reported)
    assert all(final[w.path] is g for w, g in zip(variables, grads))  # the reported array is the final sum
    d_second = np.ones((5, 2)) @ head.kernel.numpy().T  # into the second application, then the first
    d_first = d_second @ shared.kernel.numpy().T
    np.testing.assert_allclose(np.asarray(final["shared/bias"]), d_second.sum(0) + d_first.sum(0), rtol=1e-5)


def test_a_gradient_replaced_after_the_hook_is_refused():
    from dnnbind.distribution.reducer import GradientReducer

    class Comm(dd.Communicator):
        def all_reduce(self, arrays, op="sum", stream=None):
            pass

    layer = layers.Dense(2, name="dense_hook")
    layer.build((3,))
    slots = [(layer, w) for w in layer.trainable_weights]
    reducer = GradientReducer(Comm(), slots, [[1, 0]])
    layer.grads = {"kernel": np.ones((3, 2), np.float32), "bias": np.ones(2, np.float32)}
    reducer.layer_done(layer)
    assert reducer.issued == 1
    with pytest.raises(RuntimeError, match="gradient of 'dense_hook/kernel' was replaced after"):
        reducer.finish([np.ones((3, 2), np.float32), layer.grads["bias"]])


# ----- synchronised batch normalization --------------------------------------------------------------
_BN_CASES = [((8, 5), -1), ((4, 3, 3, 2), -1), ((4, 2, 3, 3), 1)]


def _bn_layer(cls, shape, axis, dtype, weights):
    layer = cls(axis=axis, momentum=0.9, dtype=dtype)
    layer.build(shape[1:])
    layer.set_weights(weights)
    return layer


def _bn_weights(rng, channels):
    # gamma/beta multiples of 1/8 (exact in float32), a moving mean near the data's: the shift
    return [rng.integers(4, 17, channels) / 8.0, rng.integers(-8, 9, channels) / 8.0,
            rng.normal(1.5, 0.3, channels), rng.uniform(0.5, 2.0, channels)]


def _sync_bn_on_ranks(world, x, dy, axis, dtype, weights, monkeypatch):
    """SyncBatchNormalization on ``world`` loopback ranks, each given its slice of the batch: per
    rank (y, dx, dgamma, dbeta, moving_mean, moving_variance)."""
    rows = len(x) // world

    def rank_bn(rank, dist):
        layer = _bn_layer(layers.SyncBatchNormalization, x.shape, axis, dtype, weights)
        part = slice(rank * rows, (rank + 1) * rows)
        y = layer.forward(x[part], training=True)
        dx = layer.backward(dy[part])
        return y, dx, layer.grads["gamma"], layer.grads["beta"], *layer.get_weights()[2:]

    results, _ = _run_ranks(world, rank_bn, monkeypatch)
    return results


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 2e-6)])
@pytest.mark.parametrize("shape, axis", _BN_CASES, ids=["2d", "nhwc", "nchw"])
def test_sync_batchnorm_on_two_ranks_is_batchnorm_of_the_whole_batch(monkeypatch, shape, axis, dtype, tol):
    rng = np.random.default_rng(11)
    x = rng.normal(1.5, 2.0, size=shape).astype(dtype)
    dy = rng.normal(size=shape).astype(dtype)
    weights = _bn_weights(rng, shape[axis])
    plain = _bn_layer(layers.BatchNormalization, shape, axis, dtype, weights)
    y_ref = plain.forward(x, training=True)
    dx_ref = plain.backward(dy)
    ranks = _sync_bn_on_ranks(2, x, dy, axis, dtype, weights, monkeypatch)
    (y0, dx0, dg0, db0, mm0, mv0), (y1, dx1, dg1, db1, mm1, mv1) = ranks
    assert y0.dtype == np.dtype(dtype) and dx0.dtype == np.dtype(dtype)
    assert rel_error(np.concatenate([y0, y1]), y_ref) < tol
    assert rel_error(np.concatenate([dx0, dx1]), dx_ref) < 10 * tol
    # parameter gradients stay each rank's own: their sum is the whole batch's (DataParallel averages)
    assert rel_error(np.asarray(dg0) + dg1, plain.grads["gamma"]) < 10 * tol
    assert rel_error(np.asarray(db0) + db1, plain.grads["beta"]) < 10 * tol
    assert np.array_equal(mm0, mm1) and np.array_equal(mv0, mv1)  # every rank keeps the same statistics
    mm_ref, mv_ref = plain.get_weights()[2:]
    assert rel_error(mm0, mm_ref) < 2e-6 and rel_error(mv0, mv_ref) < 2e-6  # float32 weights


def test_sync_batchnorm_gradients_match_finite_differences_float64(monkeypatch):
    rng = np.random.default_rng(5)
    shape, axis = (4, 2, 2, 3), -1
    x = rng.normal(0.5, 1.5, size=shape)
    r = rng.normal(size=shape)
    weights = _bn_weights(rng, 3)
    ranks = _sync_bn_on_ranks(2, x, r, axis, "float64", weights, monkeypatch)
    dx = np.concatenate([ranks[0][1], ranks[1][1]])
    dgamma, dbeta = ranks[0][2] + ranks[1][2], ranks[0][3] + ranks[1][3]

    def loss(gamma=weights[0], beta=weights[1]):
        ys = _sync_bn_on_ranks(2, x, r, axis, "float64", [gamma, beta, *weights[2:]], monkeypatch)
        return float((np.concatenate([ys[0][0], ys[1][0]]) * r).sum())

    assert rel_error(dx, numerical_grad(lambda: loss(), x)) < 1e-7
    # gamma and beta are float32 weights: steps of 2**-10 keep the perturbed values exact
    gamma, beta = weights[0].copy(), weights[1].copy()
    assert rel_error(dgamma, numerical_grad(lambda: loss(gamma=gamma), gamma, eps=2.0 ** -10)) < 1e-7
    assert rel_error(dbeta, numerical_grad(lambda: loss(beta=beta), beta, eps=2.0 ** -10)) < 1e-7


def test_sync_batchnorm_without_a_distribution_is_batchnorm(monkeypatch, rng):
    shape = (6, 4, 4, 3)
    x = rng.normal(1.0, 2.0, size=shape).astype(np.float32)
    dy = rng.normal(size=shape).astype(np.float32)
    weights = _bn_weights(rng, 3)
    outs = []
    for layer in (_bn_layer(layers.BatchNormalization, shape, -1, "float32", weights),
                  _bn_layer(layers.SyncBatchNormalization, shape, -1, "float32", weights),
                  layers.BatchNormalization.from_config({**layers.BatchNormalization(synchronized=True).get_config(),
                                                         "name": "bn_sync", "momentum": 0.9})):
        if not layer.built:
            layer.build(shape[1:])
            layer.set_weights(weights)
        outs.append([layer.forward(x, training=True), layer.backward(dy), layer.grads["gamma"], *layer.get_weights()])
    for other in outs[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(outs[0], other))  # bitwise: the same path
    # one loopback rank: the synchronised path, equal to batch normalization up to rounding
    (one,) = _sync_bn_on_ranks(1, x, dy, -1, "float32", weights, monkeypatch)
    for got, want in zip(one, [outs[0][0], outs[0][1], outs[0][2]]):
        assert rel_error(got, want) < 2e-6


def test_sync_batchnorm_config_and_arguments():
    layer = layers.SyncBatchNormalization(axis=1, momentum=0.8)
    config = layer.get_config()
    assert config["synchronized"] is True and config["axis"] == 1 and layer.synchronized
    again = layers.deserialize({"class_name": "SyncBatchNormalization", "config": config})
    assert type(again) is layers.SyncBatchNormalization and again.synchronized and again.momentum == 0.8
    assert layers.BatchNormalization().get_config()["synchronized"] is False
    assert layers.BatchNormalization(synchronized=True).synchronized
    with pytest.raises(TypeError, match=r"BatchNormalization '.*': synchronized must be True or False"):
        layers.BatchNormalization(synchronized="yes")


def _bn_model(cls_kwargs, seed=3):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((6,)), layers.Dense(8), layers.BatchNormalization(momentum=0.9, **cls_kwargs),
                          layers.Activation("relu"), layers.Dense(3, activation="softmax")])
    m.compile(keras.optimizers.SGD(0.1, momentum=0.9), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return m


def test_fit_with_sync_batchnorm_on_two_ranks_equals_one_process(monkeypatch):
    x, y = _data(64)
    reference = _bn_model({})
    ref_hist = reference.fit(x, y, batch_size=16, epochs=2, seed=7, verbose=0)

    def rank_fit(rank, dist):
        m = _bn_model({"synchronized": True}, seed=3 if rank == 0 else 99)
        hist = m.fit(x, y, batch_size=16, epochs=2, seed=7, verbose=0)
        return m.get_weights(), hist.history

    results, _ = _run_ranks(2, rank_fit, monkeypatch)
    (w0, h0), (w1, _) = results
    assert all(np.array_equal(a, b) for a, b in zip(w0, w1))
    # global-batch statistics: two ranks of 8 rows train like one process on 16 (plain BN on 8 would not)
    for a, b in zip(w0, reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=5e-5, atol=5e-6)
    np.testing.assert_allclose(h0["loss"], ref_hist.history["loss"], rtol=5e-5)


def test_reducer_forks_per_bucket_and_always_joins_back():
    """The device path's stream protocol, with a stand-in for the communication stream: each bucket
    forks from the compute stream before its all-reduce goes to the communication stream; finish
    joins once; a backward that raises is joined back by close (a capture must not end unjoined)."""
    from dnnbind.distribution.reducer import GradientReducer

    log = []

    class Collective:
        stream = "comm"

        def fork(self, compute):
            log.append(("fork", compute))

        def join(self, compute):
            log.append(("join", compute))

    class Comm(dd.Communicator):
        def all_reduce(self, arrays, op="sum", stream=None):
            log.append(("all_reduce", op, stream, len(arrays)))

    dense = [layers.Dense(2, name=f"dense_fork_{i}") for i in range(2)]
    for layer in dense:
        layer.build((2,))
        layer.grads = {w.name: np.ones(w.value.shape, np.float32) for w in layer.trainable_weights}
    slots = [(layer, w) for layer in dense for w in layer.trainable_weights]
    reducer = GradientReducer(Comm(), slots, [[3, 2], [1, 0]], Collective(), "compute")
    reducer.layer_done(dense[1])
    assert log == [("fork", "compute"), ("all_reduce", "avg", "comm", 2)]
    reducer.layer_done(dense[0])
    reducer.finish([layer.grads[w.name] for layer, w in slots])
    reducer.close()
    assert log[2:] == [("fork", "compute"), ("all_reduce", "avg", "comm", 2), ("join", "compute")]
    log.clear()
    failing = GradientReducer(Comm(), slots, [[3, 2], [1, 0]], Collective(), "compute")
    failing.layer_done(dense[1])
    failing.close()  # backward raised before finish
    failing.close()
    assert log == [("fork", "compute"), ("all_reduce", "avg", "comm", 2), ("join", "compute")]
