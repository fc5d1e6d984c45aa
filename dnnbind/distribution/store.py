"""A tiny key-value store over TCP for the rendezvous: rank 0 serves it at ``MASTER_ADDR:MASTER_PORT``,
every rank (rank 0 included) is a client.

It carries the NCCL unique id from rank 0 to the others, tells who joined (a rank that never
shows up is named in the timeout error), and is the channel a failing rank uses to tell the
others why (``report_failure``/``failure``), so every rank stops with the same clear message.

Wire format: one JSON object per line each way (``{"op": "set", "key": ..., "value": <hex>}``).
Values are bytes (sent as hex); no pickle. Every blocking call has a timeout in seconds. A line is
at most :data:`MAX_MESSAGE_BYTES` (1 MiB: a value of up to about 512 KiB); the client refuses to send
a longer one, and the server reads at most that much of a line before it answers "message too long"
and drops the connection, so a peer cannot make rank 0 buffer without bound.

What the store trusts: only connections that prove they hold the job's token. On connecting, the
server sends a random nonce; the client answers with HMAC-SHA256(token, "client" | server nonce |
client nonce) and its own nonce; the server checks it (``hmac.compare_digest``) and answers with
HMAC-SHA256(token, "server" | ...), which the client checks in turn, so neither side sends the token
and a rank never takes a NCCL id from a process that does not know it either. A connection that
fails, or does not finish the handshake within :data:`HANDSHAKE_TIMEOUT_S`, is closed before any
request of it is read. The token is ``DNNBIND_STORE_TOKEN`` (:mod:`.env`; ``python -m dnnbind.launch``
makes a random one per job on one host); without one (``token=None``), which a store listening beyond
loopback refuses, the handshake still runs with an empty key, which every local process knows.
Authenticated ranks are trusted: the store does not bound how many keys they set.

Closing the server is graceful: a request the server has already read is answered before its
connection goes (rank 0 may close the moment the last rank's ``set`` lands, and that rank must still
get its reply), and a ``get``/``missing`` still waiting is answered at once with "closed", which the
client reports as the store lost.

The server binds to loopback when ``MASTER_ADDR`` is a loopback address (``127.0.0.1``,
``localhost``, ``::1``), else to every interface (other hosts must reach it), as torchrun's store.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import socket
import threading
import time
from typing import Any

from ..errors import DistributedError
from .env import TOKEN_VARIABLE, is_loopback

__all__ = ["TCPStore", "StoreServer", "rendezvous", "FAILURE_KEY", "MAX_MESSAGE_BYTES", "HANDSHAKE_TIMEOUT_S"]

FAILURE_KEY = "dnnbind/failure"
#: the longest line (request or reply, newline included) either side sends or reads
MAX_MESSAGE_BYTES = 1 << 20
#: seconds a new connection has to prove it holds the token
HANDSHAKE_TIMEOUT_S = 10.0
_HELLO = "dnnbind-store/1"
_HANDSHAKE_LINE_BYTES = 1024
_FAILURE_MESSAGE_CHARS = 8192


def _token_key(token: "str | bytes | None") -> bytes:
    if token is None:
        return b""
    if isinstance(token, str):
        token = token.encode()
    if not isinstance(token, bytes) or not token:
        raise ValueError(f"TCPStore: token must be a non-empty str or bytes (the job's {TOKEN_VARIABLE}) or None")
    return token


def _proof(key: bytes, role: str, server_nonce: str, client_nonce: str) -> str:
    return hmac.new(key, f"{role}|{server_nonce}|{client_nonce}".encode(), hashlib.sha256).hexdigest()


def _send_line(sock: socket.socket, message: dict) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


def _read_line(reader: Any, limit: int) -> "bytes | None":
    """One line of at most ``limit`` bytes; None when longer (the rest is never read)."""
    line = reader.readline(limit + 1)
    return None if len(line) > limit else line


def _hello_reply(line: "bytes | None") -> dict:
    """A handshake line as a dict ({} when it is not one)."""
    try:
        message = json.loads(line) if line else {}
    except (ValueError, RecursionError):  # a handshake line nested ~1000 deep fits its 1 KiB
        return {}
    return message if isinstance(message, dict) else {}


class StoreServer:
    """The store's server (rank 0): a listening socket and one daemon thread per connection.

    ``port=0`` picks a free port (read it back from :attr:`port`). ``token``: the job's secret, which
    every connection must prove it holds (see the module); required unless ``host`` is loopback.
    """

    def __init__(self, host: str, port: int, *, token: "str | bytes | None" = None) -> None:
        self._key = _token_key(token)
        if not self._key and not is_loopback(host):
            raise ValueError(f"dnnbind.distribution: rank 0's store would listen on every interface for {host}:{port}, "
                             f"but no token (the job's {TOKEN_VARIABLE}) was given to tell this job's ranks from "
                             "anyone else; set the same token for every rank")
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()
        bind = "127.0.0.1" if is_loopback(host) else ""
        family = socket.AF_INET6 if ":" in host and not is_loopback(host) else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((bind, int(port)))
        except OSError as exc:
            self._sock.close()
            raise DistributedError(f"dnnbind.distribution: rank 0 cannot listen on port {port} for the rendezvous "
                                   f"({exc}); pick a free MASTER_PORT (--master-port)") from exc
        self._sock.listen(256)
        self.port = int(self._sock.getsockname()[1])
        self._closed = False
        self._conns: set = set()
        self._inflight = 0  # requests read and not yet answered: close() lets them finish
        self._thread = threading.Thread(target=self._serve, name="dnnbind-store", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with self._cond:
                if self._closed:  # accepted while closing: serve nothing after close()
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._handle, args=(conn,), name="dnnbind-store-conn", daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            self._serve_connection(conn)
        finally:
            with self._cond:
                self._conns.discard(conn)

    def _authenticate(self, conn: socket.socket, reader: Any) -> bool:
        """The handshake (see the module): True once the peer proved it holds the token."""
        nonce = secrets.token_hex(16)
        try:
            conn.settimeout(HANDSHAKE_TIMEOUT_S)
            _send_line(conn, {"hello": _HELLO, "nonce": nonce})
            answer = _hello_reply(_read_line(reader, _HANDSHAKE_LINE_BYTES))
            client_nonce, proof = answer.get("nonce"), answer.get("proof")
            if not (isinstance(client_nonce, str) and isinstance(proof, str) and len(client_nonce) <= 64
                    and hmac.compare_digest(proof, _proof(self._key, "client", nonce, client_nonce))):
                _send_line(conn, {"ok": False, "error": "token"})
                return False
            _send_line(conn, {"ok": True, "proof": _proof(self._key, "server", nonce, client_nonce)})
            conn.settimeout(None)
            return True
        except OSError:  # gone, or silent past the timeout: served nothing
            return False

    def _serve_connection(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            if not self._authenticate(conn, reader):
                return
            while True:
                try:
                    line = _read_line(reader, MAX_MESSAGE_BYTES)
                except OSError:  # the client went away (reset): nothing to answer
                    return
                if line is None:  # longer than any request: answer once, then drop the connection
                    try:
                        _send_line(conn, {"ok": False, "error": f"message too long: more than {MAX_MESSAGE_BYTES} "
                                                                 "bytes without a newline"})
                    except OSError:
                        pass
                    return
                if not line:
                    return
                with self._cond:
                    if self._closed:  # read after close(): answered by the connection going away
                        return
                    self._inflight += 1
                try:
                    try:
                        request = json.loads(line)
                        reply = self._answer(request)
                    except Exception as exc:  # a malformed request: answer it, keep serving the others
                        reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                    try:
                        conn.sendall(json.dumps(reply).encode() + b"\n")
                    except OSError:
                        return
                finally:
                    with self._cond:
                        self._inflight -= 1
                        self._cond.notify_all()

    def _answer(self, request: dict) -> dict:
        op = request.get("op")
        key = str(request.get("key", ""))
        with self._cond:
            if op == "set":
                self._data[key] = bytes.fromhex(request["value"])
                self._cond.notify_all()
                return {"ok": True}
            if op == "get":
                deadline = time.monotonic() + float(request.get("timeout", 0.0))
                while key not in self._data:
                    if self._closed:
                        return {"ok": False, "error": "closed"}
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return {"ok": False, "error": "timeout"}
                    self._cond.wait(min(left, 1.0))
                return {"ok": True, "value": self._data[key].hex()}
            if op == "set_if_absent":  # one atomic step: the first writer wins, everyone reads the winner
                value = self._data.setdefault(key, bytes.fromhex(request["value"]))
                self._cond.notify_all()
                return {"ok": True, "value": value.hex()}
            if op == "check":
                value = self._data.get(key)
                return {"ok": True, "value": None if value is None else value.hex()}
            if op == "add":
                current = int(self._data.get(key, b"0").decode() or 0) + int(request.get("amount", 1))
                self._data[key] = str(current).encode()
                self._cond.notify_all()
                return {"ok": True, "value": current}
            if op == "missing":
                deadline = time.monotonic() + float(request.get("timeout", 0.0))
                keys = [str(k) for k in request.get("keys", [])]
                while True:
                    missing = [k for k in keys if k not in self._data]
                    left = deadline - time.monotonic()
                    if not missing or left <= 0:
                        return {"ok": True, "missing": missing}
                    if self._closed:
                        return {"ok": False, "error": "closed"}
                    self._cond.wait(min(left, 1.0))
        return {"ok": False, "error": f"unknown op {op!r}"}

    #: seconds close() waits for the requests already read to be answered
    DRAIN_S = 5.0

    def close(self) -> None:
        """Stop serving: the clients see the store go away, as when rank 0's process ends.

        Requests already read are answered first (waiting ``get``/``missing`` calls with
        "closed"), for at most :attr:`DRAIN_S` seconds; then every connection is shut.
        """
        with self._cond:
            self._closed = True
            self._cond.notify_all()  # waiting get/missing answer "closed" now
        try:
            self._sock.close()
        except OSError:
            pass
        deadline = time.monotonic() + self.DRAIN_S
        with self._cond:
            while self._inflight > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            conns, self._conns = self._conns, set()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class TCPStore:
    """A client of the rendezvous store (and, on rank 0 with ``is_server``, its server too).

    Parameters
    ----------
    host, port:
        ``MASTER_ADDR`` and ``MASTER_PORT``.
    is_server:
        Start the server in this process (rank 0).
    timeout:
        Seconds to wait for the server to accept a connection, and the default for :meth:`get`.
    token:
        The job's secret (``DNNBIND_STORE_TOKEN``; :attr:`ProcessEnv.store_token`): the client proves
        it holds it, and checks that the server does too. The server needs one unless ``host`` is
        loopback.
    """

    def __init__(self, host: str, port: int, *, is_server: bool = False, timeout: float = 300.0,
                 token: "str | bytes | None" = None) -> None:
        self.host = host
        self.timeout = float(timeout)
        self._key = _token_key(token)
        self.server = StoreServer(host, port, token=token) if is_server else None
        self.port = self.server.port if self.server is not None else int(port)
        self._lock = threading.Lock()
        self._sock: "socket.socket | None" = None
        self._reader: Any = None
        try:
            self._connect(self.timeout)
        except BaseException:
            self.close()
            raise

    def _connect(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last: "Exception | None" = None
        while True:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=max(0.1, min(5.0, timeout)))
            except OSError as exc:
                last = exc
            else:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                reader = sock.makefile("rb")
                try:
                    self._handshake(sock, reader)
                except BaseException:
                    reader.close()
                    sock.close()
                    raise
                sock.settimeout(None)
                self._sock, self._reader = sock, reader
                return
            if time.monotonic() >= deadline:
                raise DistributedError(
                    f"dnnbind.distribution: could not reach the rendezvous store of rank 0 at {self.host}:{self.port} "
                    f"within {timeout:g} s ({type(last).__name__}: {last}): rank 0 did not start, died, or is "
                    "unreachable from here (check MASTER_ADDR/MASTER_PORT and the firewall)")
            time.sleep(0.1)

    def _handshake(self, sock: socket.socket, reader: Any) -> None:
        """Prove this rank holds the token and check that the server does (see the module)."""
        where = f"the rendezvous store at {self.host}:{self.port}"
        try:
            sock.settimeout(HANDSHAKE_TIMEOUT_S)
            hello = _hello_reply(_read_line(reader, _HANDSHAKE_LINE_BYTES))
            nonce = hello.get("nonce")
            if hello.get("hello") != _HELLO or not isinstance(nonce, str) or len(nonce) > 64:
                raise DistributedError(f"dnnbind.distribution: {where} did not greet as a dnnbind store: another "
                                       "program listens on MASTER_PORT there; pick a free port")
            mine = secrets.token_hex(16)
            _send_line(sock, {"nonce": mine, "proof": _proof(self._key, "client", nonce, mine)})
            reply = _hello_reply(_read_line(reader, _HANDSHAKE_LINE_BYTES))
        except OSError as exc:
            raise DistributedError(f"dnnbind.distribution: {where} dropped the connection during the token "
                                   f"handshake ({type(exc).__name__}: {exc})") from exc
        if not reply.get("ok"):
            raise DistributedError(
                f"dnnbind.distribution: {where} refused this rank: it did not present the job's token "
                f"({TOKEN_VARIABLE} is {'set' if self._key else 'not set'} here and differs from rank 0's); give "
                f"every rank the same {TOKEN_VARIABLE} (python -m dnnbind.launch passes its own to its children)")
        proof = reply.get("proof")
        if not (isinstance(proof, str) and hmac.compare_digest(proof, _proof(self._key, "server", nonce, mine))):
            raise DistributedError(f"dnnbind.distribution: {where} does not know this job's token: it is another "
                                   "job's store, or an impostor; check MASTER_ADDR/MASTER_PORT")

    def _request(self, request: dict, wait: float = 0.0) -> dict:
        data = json.dumps(request).encode() + b"\n"
        if len(data) > MAX_MESSAGE_BYTES:
            raise DistributedError(
                f"dnnbind.distribution: the store request {request.get('op')!r} for key {str(request.get('key'))[:80]!r} "
                f"is {len(data):,} bytes, more than the store's limit of {MAX_MESSAGE_BYTES:,} bytes per message "
                "(values travel as hex, so about 512 KiB); the rendezvous store carries ids and short messages")
        with self._lock:
            if self._sock is None:
                raise DistributedError("dnnbind.distribution: the rendezvous store is closed")
            try:
                # the server answers a blocking request after at most ``wait`` s; a slack covers the network
                self._sock.settimeout(wait + 30.0)
                self._sock.sendall(data)
                line = _read_line(self._reader, MAX_MESSAGE_BYTES)
            except OSError as exc:
                raise DistributedError(
                    f"dnnbind.distribution: lost the rendezvous store at {self.host}:{self.port} ({exc}): "
                    "rank 0, which serves it, exited or failed") from exc
            if line is None:
                raise DistributedError(f"dnnbind.distribution: the store at {self.host}:{self.port} replied with more "
                                       f"than {MAX_MESSAGE_BYTES:,} bytes in one line; refusing the reply")
            reply = json.loads(line) if line else {"ok": False, "error": "closed"}
            if not reply.get("ok") and reply.get("error") == "closed":
                raise DistributedError(
                    f"dnnbind.distribution: lost the rendezvous store at {self.host}:{self.port}: rank 0, which "
                    "serves it, exited or failed")
        return reply

    def set(self, key: str, value: bytes) -> None:
        self._request({"op": "set", "key": key, "value": bytes(value).hex()})

    def get(self, key: str, timeout: "float | None" = None) -> bytes:
        """The value of ``key``, waiting up to ``timeout`` s (default: the store's) for a rank to set it."""
        wait = self.timeout if timeout is None else float(timeout)
        reply = self._request({"op": "get", "key": key, "timeout": wait}, wait)
        if not reply.get("ok"):
            raise DistributedError(f"dnnbind.distribution: no rank set {key!r} in the rendezvous store within "
                                   f"{wait:g} s")
        return bytes.fromhex(reply["value"])

    def set_if_absent(self, key: str, value: bytes) -> bytes:
        """Set ``key`` unless a rank already did, in one step on the server; returns the value it holds."""
        return bytes.fromhex(self._request({"op": "set_if_absent", "key": key, "value": bytes(value).hex()})["value"])

    def check(self, key: str) -> "bytes | None":
        """The value of ``key`` now, or None (never waits)."""
        value = self._request({"op": "check", "key": key}).get("value")
        return None if value is None else bytes.fromhex(value)

    def add(self, key: str, amount: int = 1) -> int:
        return int(self._request({"op": "add", "key": key, "amount": int(amount)})["value"])

    def missing(self, keys: list[str], timeout: float) -> list[str]:
        """Which of ``keys`` are still unset after waiting up to ``timeout`` s for all of them."""
        return list(self._request({"op": "missing", "keys": list(keys), "timeout": float(timeout)},
                                  float(timeout))["missing"])

    def report_failure(self, rank: int, message: str) -> None:
        """Tell the other ranks why this one stops (the first report wins; never raises)."""
        try:
            self.set_if_absent(FAILURE_KEY, f"rank {rank}: {message}"[:_FAILURE_MESSAGE_CHARS].encode())
        except Exception:  # the store is gone too: the launcher still reports the exit
            pass

    def failure(self) -> "str | None":
        """The failure another rank reported, or None."""
        value = self.check(FAILURE_KEY)
        return None if value is None else value.decode(errors="replace")

    def close(self) -> None:
        """Close the connection (and stop the server on rank 0). Idempotent."""
        with self._lock:
            sock, self._sock = self._sock, None
            reader, self._reader = self._reader, None
        for part in (reader, sock):  # the file first: the socket closes only when both are closed
            if part is not None:
                try:
                    part.close()
                except OSError:
                    pass
        if self.server is not None:
            self.server.close()
            self.server = None


def rendezvous(store: TCPStore, rank: int, world_size: int, *, timeout: float, tag: str = "join") -> None:
    """Every rank announces itself and waits until all ``world_size`` have (at most ``timeout`` s).

    Raises DistributedError naming the ranks that did not show up, e.g. ``rank(s) [3] did not join
    the rendezvous at 127.0.0.1:29500 within 30 s``.
    """
    store.set(f"dnnbind/{tag}/{rank}", f"{socket.gethostname()}:{os.getpid()}".encode())
    keys = [f"dnnbind/{tag}/{r}" for r in range(world_size)]
    missing = store.missing(keys, timeout)
    if missing:
        ranks = sorted(int(k.rsplit("/", 1)[1]) for k in missing)
        raise DistributedError(f"dnnbind.distribution: rank(s) {ranks} of {world_size} did not join the rendezvous "
                               f"at {store.host}:{store.port} within {timeout:g} s (this is rank {rank}); they did "
                               "not start, crashed early, or use another MASTER_ADDR/MASTER_PORT")
