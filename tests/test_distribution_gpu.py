"""Data parallelism on GPUs through NCCL (needs libnccl: ``pip install "dnnbind[nccl]"``).

One GPU: the communicator's collectives against NumPy, the whole distributed path with one rank
(``fit`` under ``DataParallel`` bitwise equal to a plain ``fit`` in deterministic mode, with the
gradient buckets' NCCL all-reduces issued on the communication stream while the step was being
captured and then replayed), SyncBatchNormalization against BatchNormalization, the fault paths
(another rank's failure report, a collective past its timeout: ``ncclCommAbort`` and an error
naming it), ``python -m dnnbind.launch`` with one NCCL rank, and the distributed step under
compute-sanitizer memcheck. Two GPUs (``two_gpus``): two ranks train identically and like one
process on the global batch; a failing rank stops the other with its message.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import cuda, layers, kernels
from dnnbind import distribution as dd
from dnnbind.distribution.communicator import NcclCommunicator
from dnnbind.distribution.launch import free_port
from dnnbind.errors import DistributedError

pytestmark = pytest.mark.gpu

two_gpus = pytest.mark.skipif(cuda.device_count() < 2, reason="needs 2 GPUs (nvidia-h200-x2)")

def _need_nccl() -> None:
    from dnnbind._lib import loader
    from dnnbind.errors import LibraryNotFoundError

    try:
        loader.load_library("nccl")
    except LibraryNotFoundError as exc:
        pytest.skip(f"libnccl not installed (pip install 'dnnbind[nccl]'): {str(exc).splitlines()[0]}")


def _one_rank_env(monkeypatch) -> None:
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1"),
                        ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port()))):
        monkeypatch.setenv(name, value)


@pytest.fixture
def one_rank(monkeypatch):
    _need_nccl()
    _one_rank_env(monkeypatch)
    dist = dd.DataParallel(timeout=60)
    yield dist
    dd.set_distribution(None)
    dist.close()


def _dtypes():
    import ml_dtypes

    return [np.float32, np.float16, ml_dtypes.bfloat16, np.float64, np.int32]


@pytest.mark.parametrize("dtype", _dtypes(), ids=lambda d: np.dtype(d).name)
def test_collectives_on_one_rank_match_numpy(one_rank, dtype):
    comm = one_rank.communicator
    rng = np.random.default_rng(4)
    host = (rng.normal(size=(7, 5)) * 3 + 0.5).astype(dtype)
    ops_to_check = ("sum", "max", "min") if np.dtype(dtype).kind == "i" else ("sum", "avg", "max", "min")
    for op in ops_to_check:
        dev = cuda.to_device(host)
        other = cuda.to_device(host[:3].copy())
        comm.all_reduce([dev, other], op)  # one group of two
        np.testing.assert_array_equal(dev.numpy(), host)  # one rank: the reduction of one value is itself
        np.testing.assert_array_equal(other.numpy(), host[:3])
    dev = cuda.to_device(host)
    comm.broadcast([dev], root=0)
    np.testing.assert_array_equal(dev.numpy(), host)
    gathered = comm.all_gather(cuda.to_device(host))
    assert gathered.shape == (1, 7, 5) and gathered.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(gathered.numpy()[0], host)
    np.testing.assert_array_equal(comm.all_reduce_host(np.array([1.5, -2.0])), [1.5, -2.0])
    with pytest.raises(ValueError, match="op must be one of"):
        comm.all_reduce([dev], "mean")
    with pytest.raises(TypeError, match="array 0 must be a DeviceArray, got ndarray"):
        comm.all_reduce([host], "sum")
    with pytest.raises(ValueError, match=r"root must be in \[0, 1\), got 1"):
        comm.broadcast([dev], root=1)


def _data(n=256, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8, 8, 3)).astype(np.float32)
    y = (x[:, :4, :, 0].mean(axis=(1, 2)) > 0).astype(np.int64) + (x[:, 4:, :, 1].mean(axis=(1, 2)) > 0.1)
    return x, y.astype(np.int64)


def _model(seed=3):
    keras.utils.set_random_seed(seed)
    m = keras.Sequential([keras.Input((8, 8, 3)), layers.Conv2D(8, 3, padding="same", activation="relu"),
                          layers.BatchNormalization(), layers.Flatten(), layers.Dense(3, activation="softmax")])
    m.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return m


def _spy_all_reduce(monkeypatch) -> list:
    """Record (op, capturing, stream handle) of every NcclCommunicator.all_reduce."""
    calls = []
    original = NcclCommunicator.all_reduce

    def spy(self, arrays, op="sum", stream=None):
        s = cuda.as_stream(stream)
        calls.append((op, s.is_capturing(), s.handle))
        return original(self, arrays, op, stream)

    monkeypatch.setattr(NcclCommunicator, "all_reduce", spy)
    return calls


def test_one_rank_data_parallel_fit_is_bitwise_plain_fit_with_nccl_in_the_graph(one_rank, monkeypatch):
    x, y = _data()
    one_rank.bucket_bytes = 4096  # two buckets: [dense bias, dense kernel], [BN beta, gamma, conv bias, kernel]
    calls = _spy_all_reduce(monkeypatch)
    with kernels.config.override(deterministic=True), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain = _model()
        plain_hist = plain.fit(x, y, batch_size=32, epochs=2, seed=5, verbose=0, validation_data=(x[:64], y[:64]))
        dd.set_distribution(one_rank)
        dp = _model()
        dp_hist = dp.fit(x, y, batch_size=32, epochs=2, seed=5, verbose=0, validation_data=(x[:64], y[:64]))
    assert not [w for w in caught if "could not be captured" in str(w.message)], [str(w.message) for w in caught]
    for a, b in zip(plain.get_weights(), dp.get_weights()):
        assert np.array_equal(a, b)  # bitwise, BatchNormalization's moving statistics included
    assert dp_hist.history == plain_hist.history
    stats = dp._step_graphs.stats
    assert stats["captures"] >= 2 and stats["replays"] >= 12 and stats["failures"] == 0, stats
    weights = [w.value for w in dp.trainable_weights]
    plan = dd.plan_buckets([w.nbytes for w in weights], [str(w.dtype) for w in weights], bucket_bytes=4096,
                           first_bucket_bytes=4096)
    assert plan == [[5, 4], [3, 2, 1, 0]]
    # one averaging all-reduce per bucket, issued on the replica's communication stream (not the
    # compute stream) by the eager warm-up and by the capture only: replays ran them from the graph
    comm_stream = one_rank.replica().collective_stream(0).stream.handle
    grads = [(capturing, handle) for op, capturing, handle in calls if op == "avg"]
    assert grads == [(False, comm_stream)] * len(plan) + [(True, comm_stream)] * len(plan), calls
    assert comm_stream != cuda.current_stream().handle


@pytest.mark.parametrize("axis, shape", [(-1, (6, 5, 5, 8)), (1, (6, 8, 5, 5)), (-1, (48, 8))],
                         ids=["nhwc", "nchw", "2d"])
@pytest.mark.parametrize("dtype", _dtypes()[:3], ids=lambda d: np.dtype(d).name)
def test_sync_batchnorm_on_one_nccl_rank_matches_batchnorm(one_rank, axis, shape, dtype):
    rng = np.random.default_rng(9)
    c = shape[axis]
    x = rng.normal(1.0, 2.0, size=shape).astype(dtype)
    dy = rng.normal(size=shape).astype(dtype)
    weights = [rng.uniform(0.5, 2.0, c), rng.normal(size=c), rng.normal(0.8, 0.2, c), rng.uniform(0.5, 2.0, c)]
    tol = {np.dtype(np.float32): 2e-5}.get(np.dtype(dtype), 5e-3 if np.dtype(dtype) == np.float16 else 3e-2)
    dd.set_distribution(one_rank)
    outs = []
    for cls in (layers.BatchNormalization, layers.SyncBatchNormalization):
        layer = cls(axis=axis, momentum=0.9, dtype=np.dtype(dtype).name)
        layer.build(shape[1:])
        layer.set_weights(weights)
        y = layer.forward(cuda.to_device(x), training=True)
        dx = layer.backward(cuda.to_device(dy))
        outs.append([y.numpy(), dx.numpy(), layer.grads["gamma"].numpy(), layer.grads["beta"].numpy(),
                     *layer.get_weights()[2:]])
    (y, dx, dg, db, mm, mv), (sy, sdx, sdg, sdb, smm, smv) = outs
    assert sy.dtype == np.dtype(dtype) and sdx.dtype == np.dtype(dtype)
    for name, got, want, t in (("y", sy, y, tol), ("dx", sdx, dx, 5 * tol), ("dgamma", sdg, dg, 5 * tol),
                               ("dbeta", sdb, db, 5 * tol), ("moving_mean", smm, mm, 1e-5),
                               ("moving_variance", smv, mv, 1e-5)):
        assert np.all(np.isfinite(got)), name
        err = float(np.linalg.norm((got.astype(np.float64) - want.astype(np.float64)).ravel()) /
                    np.linalg.norm(want.astype(np.float64).ravel()))
        assert err < t, (name, err)


def test_fit_with_sync_batchnorm_captures_its_collectives(one_rank, monkeypatch):
    x, y = _data()

    def model(synchronized):
        keras.utils.set_random_seed(3)
        m = keras.Sequential([keras.Input((8, 8, 3)), layers.Conv2D(8, 3, padding="same"),
                              layers.BatchNormalization(synchronized=synchronized), layers.Activation("relu"),
                              layers.Flatten(), layers.Dense(3, activation="softmax")])
        m.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy")
        return m

    calls = _spy_all_reduce(monkeypatch)
    with kernels.config.override(allow_tf32=False), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain = model(False)
        plain.fit(x, y, batch_size=32, epochs=2, seed=5, verbose=0)
        dd.set_distribution(one_rank)
        synced = model(True)
        synced.fit(x, y, batch_size=32, epochs=2, seed=5, verbose=0)
    assert not [w for w in caught if "could not be captured" in str(w.message)], [str(w.message) for w in caught]
    assert synced._step_graphs.stats["failures"] == 0 and synced._step_graphs.stats["replays"] >= 12
    for a, b in zip(plain.get_weights(), synced.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-4)
    # the statistics' sums (forward) and the two gradient sums (backward), captured on the
    # communication stream like the gradient buckets
    comm_stream = one_rank.replica().collective_stream(0).stream.handle
    captured = [(op, handle) for op, capturing, handle in calls if capturing]
    assert captured == [("sum", comm_stream), ("sum", comm_stream), ("avg", comm_stream)], calls


def test_a_failure_reported_by_another_rank_aborts_this_one(one_rank):
    comm = one_rank.communicator
    other = dd.TCPStore("127.0.0.1", comm.store.port, timeout=5)
    try:
        other.report_failure(1, "DeviceOutOfMemoryError: out of memory on cuda:1")
    finally:
        other.close()
    message = None
    deadline = time.monotonic() + 15
    while message is None and time.monotonic() < deadline:
        try:
            comm.check()
        except DistributedError as exc:
            message = str(exc)
        time.sleep(0.1)
    assert message is not None
    assert "another rank failed: rank 1: DeviceOutOfMemoryError" in message and "ncclCommAbort" in message
    with pytest.raises(DistributedError, match="rank 1: DeviceOutOfMemoryError"):
        comm.all_reduce([cuda.to_device(np.ones(3, np.float32))], "sum")


_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def test_a_collective_past_its_timeout_aborts_with_an_error(monkeypatch):
    _need_nccl()
    _one_rank_env(monkeypatch)
    dist = dd.DataParallel(timeout=0.5)
    try:
        comm = dist.communicator
        stream = cuda.current_stream()
        spin = cuda.Kernel(_SPIN, "spin")
        # load the module first: a kernel's first launch loads it, which may wait for the device,
        # so the long launch below would return only after it finished
        spin((1,), (1,), args=(np.int64(0),), stream=stream)
        stream.synchronize()
        # about 2 s of one spinning thread on a ~2 GHz SM: the step marker stays unreached past 0.5 s
        spin((1,), (1,), args=(np.int64(4_000_000_000),), stream=stream)
        comm.mark(stream)
        start = time.monotonic()
        message = None
        while message is None and time.monotonic() - start < 20:
            try:
                comm.check()
            except DistributedError as exc:
                message = str(exc)
            time.sleep(0.05)
        assert message is not None and "did not complete within 0.5 s" in message and "rank 0 of 1" in message
        stream.synchronize()
    finally:
        dist.close()


_TRAIN = r"""
import hashlib, os, sys
import numpy as np
import dnnbind as keras
from dnnbind import distribution as dd, layers, kernels
# exact float32 GEMMs in a fixed order: the comparison with one process then sees only the split sum
kernels.config.allow_tf32 = False
kernels.config.deterministic = True
dd.set_distribution(dd.DataParallel(timeout=120))
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 16)).astype(np.float32)
y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
def model():
    keras.utils.set_random_seed(1)
    m = keras.Sequential([keras.Input((16,)), layers.Dense(32, activation="relu"), layers.Dense(2, activation="softmax")])
    m.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return m
m = model()
FAIL
hist = m.fit(x, y, batch_size=64, epochs=2, seed=3, verbose=0)
w = m.get_weights()
digest = hashlib.sha256(b"".join(a.tobytes() for a in w)).hexdigest()
dist = dd.distribution()
rank = dist.rank
dd.set_distribution(None)
if rank == 0:
    ref = model()
    ref.fit(x, y, batch_size=64, epochs=2, seed=3, verbose=0)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(w, ref.get_weights()))
    os.write(1, f"MAXDIFF {diff}\n".encode())
# one write per line: the ranks share the launcher's pipe, and print may split a line
os.write(1, f"RANK {rank} {dist.world_size} DIGEST {digest} LOSS {hist.history['loss'][-1]!r}\n".encode())
dist.close()
"""


def _launch(tmp_path, nproc: int, fail: str = "") -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(_TRAIN.replace("FAIL", fail))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    return subprocess.run([sys.executable, "-m", "dnnbind.launch", "--nproc-per-node", str(nproc), "--master-port",
                           "0", str(script)], capture_output=True, text=True, env=env, timeout=300)


def test_launcher_with_one_nccl_rank(tmp_path):
    _need_nccl()
    done = _launch(tmp_path, 1)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("RANK")]
    assert len(rows) == 1 and rows[0][1:3] == ["0", "1"]
    diff = float(next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("MAXDIFF")))
    assert diff == 0.0  # one rank: exactly the plain fit


@two_gpus
def test_two_ranks_train_alike_and_like_one_process_on_the_global_batch(tmp_path):
    _need_nccl()
    done = _launch(tmp_path, 2)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = sorted(line.split() for line in done.stdout.splitlines() if line.startswith("RANK"))
    assert [r[1:3] for r in rows] == [["0", "2"], ["1", "2"]]
    assert rows[0][4] == rows[1][4]  # bitwise the same weights on both ranks
    assert rows[0][6] == rows[1][6]  # the same (global) History
    diff = float(next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("MAXDIFF")))
    assert diff < 1e-4, diff  # vs one process: only the summation order differs


@two_gpus
def test_a_failing_rank_stops_the_other_with_its_message(tmp_path):
    _need_nccl()
    script = tmp_path / "train.py"
    fail = textwrap.dedent("""
        class Boom(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if dd.distribution().rank == 1 and batch == 2:
                    raise MemoryError("boom on rank 1")
        fit = m.fit
        m.fit = lambda *a, **k: fit(*a, callbacks=[Boom()], **k)
    """)
    script.write_text(_TRAIN.replace("FAIL", fail))
    port = free_port()
    procs = []
    start = time.monotonic()
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert time.monotonic() - start < 180
    assert procs[1].returncode != 0 and "MemoryError: boom on rank 1" in outs[1]
    assert procs[0].returncode != 0, outs[0][-3000:]
    # the store's report (usually), else the lost store or the collective timeout; by the exception or,
    # when the main thread stayed blocked, the watchdog's exit message
    assert re.search(r"rank 0 of 2 stops: another rank failed: rank 1: MemoryError: boom on rank 1", outs[0]) or \
        re.search(r"rank 0 of 2 stops: .*(lost the rendezvous store|did not complete)", outs[0]), outs[0][-3000:]


def test_distributed_step_memcheck_clean(tmp_path):
    _need_nccl()
    from test_sanitizer_gpu import _UNDER, _sanitizer

    sanitizer = _sanitizer()
    if sanitizer is None:
        pytest.skip("compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)")
    if os.environ.get(_UNDER):
        pytest.skip(f"already running under compute-sanitizer ({os.environ[_UNDER]})")
    script = tmp_path / "train.py"
    script.write_text(_TRAIN.replace("FAIL", ""))
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    proc = subprocess.run([sanitizer, "--tool", "memcheck", "--report-api-errors", "no", "--print-limit", "20",
                           sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env, timeout=540)
    assert "DIGEST" in proc.stdout, proc.stdout[-4000:]
    assert re.search(r"ERROR SUMMARY: 0 errors", proc.stdout), proc.stdout[-4000:]
