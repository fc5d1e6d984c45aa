"""Checkpoints that survive ``kill -9`` (zip, directory, weights file), stale temporaries, file modes,
manifest checks, untrusted configs and tensors, and all-or-nothing weight changes."""

from __future__ import annotations

import json
import os
import signal
import stat
import struct
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest

import dnnbind as keras
from dnnbind import layers, saving, saving_lib
from dnnbind.errors import AllocationTooLargeError


pytestmark = pytest.mark.usefixtures("cpu")  # the NumPy backend (conftest.py)


def mlp(width=8):
    return keras.Sequential([keras.Input((4,)), layers.Dense(width, name="d1"), layers.Dense(3, name="d2")])


def trained_mlp(seed=0):
    rng = np.random.default_rng(seed)
    model = mlp()
    model.compile(keras.optimizers.Adam(0.01), "mse")
    model.fit(rng.normal(size=(16, 4)).astype(np.float32), rng.normal(size=(16, 3)).astype(np.float32),
              batch_size=8, epochs=1, verbose=0)
    return model


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ----- kill -9 while saving -----------------------------------------------------------------------
# A fork server: it imports dnnbind and builds the model once, then forks one writer per line it reads
# ("<fmt> <path> <generation>") and prints its pid. Each writer fills every weight, every optimizer
# slot and `iterations` with its generation g, saves, prints "saved g <seconds>" and goes on with
# g + 1. The test kills a writer with SIGKILL a random moment after a "saving g" line, within the time
# the previous save took: 20 kills per format cost a fork each, not an interpreter start.
_FORK_SERVER = r"""
import os
import signal
import sys
import time
import numpy as np
import dnnbind as keras
from dnnbind import layers

keras.set_default_device("cpu")
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # killed writers are reaped by the kernel
fsync = os.fsync
os.fsync = lambda fd: (time.sleep(0.005), fsync(fd))  # a slower disk: kills land mid-write more often
model = keras.Sequential([keras.Input((256,)), layers.Dense(1024, name="d1"), layers.Dense(256, name="d2")])  # as _worker_model
model.compile(keras.optimizers.Adam(0.001), "mse")
params = [w.value for w in model.trainable_weights]
model.optimizer.build(params)
shapes = {k: np.shape(v) for k, v in model.optimizer.get_state().items()}


def write_forever(fmt, path, gen):
    while True:
        model.set_weights([np.full(w.shape, gen, np.float32) for w in model.weights])
        state = {k: np.full(s, gen, np.float32) for k, s in shapes.items()}
        state["iterations"] = np.array(gen, np.int64)
        model.optimizer.set_state(state, params)
        print("saving", gen, flush=True)
        began = time.perf_counter()
        if fmt.startswith("weights"):
            model.save_weights(path)
        else:
            model.save(path)
        print("saved", gen, time.perf_counter() - began, flush=True)
        gen += 1


print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "sync":  # every line a dead writer printed is in the pipe before this one
        print("sync", flush=True)
        continue
    fmt, path, gen = line.split()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            write_forever(fmt, path, int(gen))
        finally:
            os._exit(1)
    print("pid", pid, flush=True)
"""

_TARGETS = {"zip": "ckpt.dnnbind", "directory": "ckpt_dir", "weights": "ckpt.weights.safetensors",
            "keras": "ckpt.keras", "weights_h5": "ckpt.weights.h5"}


def _worker_model():
    return keras.Sequential([keras.Input((256,)), layers.Dense(1024, name="d1"), layers.Dense(256, name="d2")])


def _generation_on_disk(fmt: str, path, with_optimizer: bool = True) -> int:
    """The one generation the checkpoint at ``path`` holds (weights, Adam slots and iterations all
    equal to it); fails on a mix or on a load error."""
    if fmt.startswith("weights"):
        model = _worker_model()
        model.load_weights(path)
        values = model.get_weights()
    else:
        model = keras.load_model(path)
        values = model.get_weights()
        if with_optimizer and fmt != "keras":  # a .keras file holds no optimizer state
            state = model.optimizer.get_state()
            values += [v for k, v in state.items() if k != "iterations"]
            values.append(np.full((1,), model.optimizer.iterations, np.float32))
            assert len(values) == 4 + 8 + 1
    first = float(values[0].flat[0])
    for v in values:
        assert np.all(v == first), f"mixed checkpoint: values {np.unique(v)[:5]} besides generation {first}"
    return int(first)


def _debris(fmt: str, path) -> list[str]:
    """What a killed save left beside the checkpoint: temporaries, parts no manifest names."""
    if fmt != "directory":
        return sorted(name for name in os.listdir(path.parent) if name != path.name)
    parts = json.loads((path / "manifest.json").read_text())["files"]
    return sorted(set(os.listdir(path)) - {"manifest.json", *(e["file"] for e in parts.values())})


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.002)
    pytest.fail(f"writer {pid} survived SIGKILL")


@pytest.mark.slow
@pytest.mark.parametrize("fmt", sorted(_TARGETS))
def test_kill_9_during_saves_leaves_a_whole_checkpoint(tmp_path, fmt):
    """20 writers killed with SIGKILL mid-save: every checkpoint left loads whole (the last complete
    save, or the one killed after its switch), what a killed save left never piles up (the next save
    removes it before writing, load_model too), and after one more save nothing is left."""
    if fmt in ("keras", "weights_h5"):
        pytest.importorskip("h5py")
    rng = np.random.default_rng(1234)
    path = tmp_path / _TARGETS[fmt]
    server = subprocess.Popen([sys.executable, "-c", _FORK_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "DNNBIND_DEVICE": "cpu"})

    def stalled(signum, frame):  # a read of the server's pipe that never returns fails the test, not the run
        raise TimeoutError("the fork server sent nothing for 240 s (a writer that died before printing?)")

    previous = signal.signal(signal.SIGALRM, stalled)
    signal.alarm(240)
    try:
        assert server.stdout.readline().split() == ["ready"]
        start, interrupted, most_debris = 0, 0, 0
        for _ in range(20):
            server.stdin.write(f"{fmt} {path} {start}\n")
            server.stdin.flush()
            target = start + int(rng.integers(1, 3))
            lines, pid = [], None
            for line in server.stdout:
                words = line.split()
                if words[0] == "pid":
                    pid = int(words[1])
                    continue
                lines.append(words)
                if words == ["saving", str(target)]:
                    break
            assert pid is not None and lines, f"the fork server ended (exit {server.poll()})"
            time.sleep(float(rng.uniform(0.0, float(lines[-2][2]))))  # within the previous save's duration
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid)
            server.stdin.write("sync\n")
            server.stdin.flush()
            for line in server.stdout:  # what the writer printed before it died
                if line.split() == ["sync"]:
                    break
                lines.append(line.split())
            debris = _debris(fmt, path)
            interrupted += bool(debris)
            # at most what one save writes: the next save removed the killed ones' leftovers first
            most_debris = max(most_debris, len(debris))
            generation = _generation_on_disk(fmt, path)
            saved = [int(words[1]) for words in lines if words[0] == "saved"]
            assert generation in (max(saved), max(saved) + 1), (generation, saved)
            if fmt in ("zip", "directory", "keras"):
                assert _debris(fmt, path) == [], "load_model leaves what dead writers left"
            start = max(saved) + 2
        assert interrupted >= 1, "none of the 20 kills landed while a save was writing"
        assert most_debris <= (4 if fmt == "directory" else 1), most_debris
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        server.kill()
        server.wait()
    # one more save (here) removes every leftover of the killed ones: their pids are dead
    model = _worker_model()
    model.set_weights([np.full(w.shape, 999, np.float32) for w in model.weights])
    model.save_weights(path) if fmt.startswith("weights") else model.save(path)
    assert _debris(fmt, path) == []
    assert _generation_on_disk(fmt, path, with_optimizer=False) == 999


def test_orphaned_parts_go_at_the_start_of_the_next_save_and_on_load(tmp_path, monkeypatch):
    """Parts of directory saves killed before their switch (no pid in their names: the directory's
    lock says nobody is writing) and manifest temporaries of dead writers are removed before the next
    save writes its own, and by load_model; a live writer's temporary stays."""
    model = trained_mlp()
    d = tmp_path / "d"
    model.save(d)
    dead = dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        orphans = [f"model.{i:016x}.safetensors" for i in range(20)] + ["optimizer.00000000000000ff.safetensors",
                                                                        f".manifest.json.tmp-{dead}-0badc0de"]
        kept = [f".manifest.json.tmp-{live.pid}-0badc0de", "notes.txt"]
        for name in orphans + kept:
            (d / name).write_bytes(b"x" * 1000)

        def named() -> set:
            return {e["file"] for e in json.loads((d / "manifest.json").read_text())["files"].values()}

        keras.load_model(d)
        assert sorted(os.listdir(d)) == sorted(["manifest.json", *named(), *kept])
        for name in orphans:
            (d / name).write_bytes(b"x" * 1000)
        seen = []
        real = saving_lib.create_exclusive

        def spy(path, mode):  # what the directory holds when the save writes its first part
            seen.append(sorted(set(os.listdir(d)) - {"manifest.json", *named(), *kept}))
            return real(path, mode)

        monkeypatch.setattr(saving_lib, "create_exclusive", spy)
        model.save(d)
        assert seen[0] == [], seen[0]
        assert sorted(os.listdir(d)) == sorted(["manifest.json", *named(), *kept])
        # a manifest this dnnbind cannot read: its parts are not judged orphans before the switch
        monkeypatch.setattr(saving_lib, "create_exclusive", real)
        manifest = json.loads((d / "manifest.json").read_text())
        (d / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))
        (d / "model.00000000000000aa.safetensors").write_bytes(b"x")
        monkeypatch.setattr(saving_lib, "create_exclusive", spy)
        seen.clear()
        model.save(d)
        assert "model.00000000000000aa.safetensors" in seen[0]
        assert sorted(os.listdir(d)) == sorted(["manifest.json", *named(), *kept])  # gone after the switch
    finally:
        live.kill()
        live.wait()


# ----- temporaries, modes, manifests --------------------------------------------------------------
def test_a_save_removes_stale_temporaries_of_dead_writers_only(tmp_path):
    model = trained_mlp()
    dead = dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = [f".m.dnnbind.tmp-{dead}-0badc0de", f".m.dnnbind.tmp-{live.pid}-0badc0de",
                 f".m.dnnbind.tmp-{os.getpid()}-0badc0de", f".other.dnnbind.tmp-{dead}-0badc0de", "notes.txt"]
        for name in names:
            (tmp_path / name).write_bytes(b"partial")
        model.save(tmp_path / "m.dnnbind")
        assert sorted(os.listdir(tmp_path)) == sorted(["m.dnnbind", *names[1:]])
        assert saving.remove_stale_temporaries(tmp_path) == [f".other.dnnbind.tmp-{dead}-0badc0de"]

        d = tmp_path / "d"
        model.save(d)
        leftovers = [f".manifest.json.tmp-{dead}-12345678", "model.0123456789abcdef.safetensors",
                     "optimizer.safetensors"]  # a killed save's parts, and the first layout's file
        for name in leftovers + [f".manifest.json.tmp-{live.pid}-12345678", "notes.txt"]:
            (d / name).write_bytes(b"partial")
        model.save(d)
        parts = json.loads((d / "manifest.json").read_text())["files"]
        assert sorted(os.listdir(d)) == sorted(["manifest.json", *(e["file"] for e in parts.values()),
                                                f".manifest.json.tmp-{live.pid}-12345678", "notes.txt"])
    finally:
        live.kill()
        live.wait()


def test_saves_keep_the_mode_of_the_file_they_replace(tmp_path):
    model = trained_mlp()
    old_umask = os.umask(0o027)
    try:
        for path, save in [(tmp_path / "m.dnnbind", model.save), (tmp_path / "w.safetensors", model.save_weights)]:
            save(path)
            assert stat.S_IMODE(path.stat().st_mode) == 0o640  # 0666 & ~umask, as open() gives
            for mode in (0o644, 0o600, 0o664):
                path.chmod(mode)
                save(path)
                assert stat.S_IMODE(path.stat().st_mode) == mode
        d = tmp_path / "d"
        model.save(d)

        def modes():
            files = json.loads((d / "manifest.json").read_text())["files"]
            return {part: stat.S_IMODE((d / e["file"]).stat().st_mode) for part, e in files.items()}

        assert set(modes().values()) == {0o640}
        files = json.loads((d / "manifest.json").read_text())["files"]
        (d / files["model.safetensors"]["file"]).chmod(0o644)
        model.save(d)
        assert modes() == {"config.json": 0o640, "model.safetensors": 0o644, "optimizer.safetensors": 0o640}
    finally:
        os.umask(old_umask)


def test_a_corrupt_or_mixed_directory_checkpoint_is_refused(tmp_path):
    model = trained_mlp()
    d = tmp_path / "d"
    model.save(d)
    manifest_path = d / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["format"] == "dnnbind.checkpoint" and manifest["generation"] == 1
    files = manifest["files"]
    old_optimizer = (d / files["optimizer.safetensors"]["file"]).read_bytes()
    model.fit(np.ones((8, 4), np.float32), np.zeros((8, 3), np.float32), verbose=0)
    model.save(d)
    good = manifest_path.read_bytes()
    files = json.loads(good)["files"]
    assert json.loads(good)["generation"] == 2

    # an older save's optimizer state under the new name (the mix the first layout could produce)
    opt_file = d / files["optimizer.safetensors"]["file"]
    new_optimizer = opt_file.read_bytes()
    assert len(old_optimizer) == len(new_optimizer) and old_optimizer != new_optimizer
    opt_file.write_bytes(old_optimizer)
    with pytest.raises(saving.SavingError, match=r"optimizer\.[0-9a-f]{16}\.safetensors: SHA-256 .* does not "
                                                 r"match .* in manifest.json: the checkpoint is corrupt or mixed"):
        keras.load_model(d)
    opt_file.write_bytes(new_optimizer)
    keras.load_model(d)  # intact again

    model_file = d / files["model.safetensors"]["file"]
    data = model_file.read_bytes()
    model_file.write_bytes(data + b"\0")
    with pytest.raises(saving.SavingError, match=f"is {len(data) + 1:,} bytes but manifest.json says {len(data):,}"):
        keras.load_model(d)
    model_file.write_bytes(data)

    tampered = json.loads(good)
    tampered["files"]["model.safetensors"]["sha256"] = "0" * 64
    manifest_path.write_text(json.dumps(tampered))
    with pytest.raises(saving.SavingError, match="does not match 0{64} in manifest.json"):
        keras.load_model(d)
    tampered["files"]["model.safetensors"]["file"] = "../../etc/passwd"
    manifest_path.write_text(json.dumps(tampered))
    with pytest.raises(saving.SavingError, match="entry 'model.safetensors' is malformed"):
        keras.load_model(d)
    manifest_path.write_text("{truncated")
    with pytest.raises(saving.SavingError, match="manifest.json is corrupt"):
        keras.load_model(d)
    manifest_path.write_bytes(good)
    assert np.array_equal(keras.load_model(d).get_weights()[0], model.get_weights()[0])


def test_a_corrupt_zip_member_is_refused(tmp_path):
    model = trained_mlp()
    path = tmp_path / "m.dnnbind"
    model.save(path)
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("model.safetensors")
    data[info.header_offset + 30 + len(info.filename) + 100] ^= 0xFF  # a byte inside the member's data
    path.write_bytes(bytes(data))
    with pytest.raises(saving.SavingError, match="corrupt: Bad CRC-32 for file 'model.safetensors'"):
        keras.load_model(path)


# ----- untrusted configs and tensors --------------------------------------------------------------
def _rewrite_config(src, dst, change):
    with zipfile.ZipFile(src) as zf:
        files = {name: zf.read(name) for name in zf.namelist()}
    config = json.loads(files["config.json"])
    change(config["config"]["layers"])
    files["config.json"] = json.dumps(config).encode()
    with zipfile.ZipFile(dst, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return dst


@pytest.fixture
def weight_spy(monkeypatch):
    """Records every real weight creation (the size estimate of load_model makes none)."""
    created = []
    real = layers.Layer._add_weight

    def spy(self, name, shape, *args, **kwargs):
        created.append((self.name, name, tuple(shape)))
        return real(self, name, shape, *args, **kwargs)

    monkeypatch.setattr(layers.Layer, "_add_weight", spy)
    return created


@pytest.mark.parametrize("key, value, error, message", [
    ("units", 1e13, saving.SavingError, "Dense 'd1': units must be an int, got float 10000000000000.0"),
    ("units", -3, saving.SavingError, "Dense 'd1': units must be a positive int, got -3"),
    ("units", True, saving.SavingError, "Dense 'd1': units must be an int, got bool True"),
    ("units", 10**13, AllocationTooLargeError,
     r"layer 'd1' \(Dense\) weight 'kernel' of shape \(4, 10000000000000\) \(float32\) needs "
     r"160,000,000,000,000 bytes.*physical memory; nothing was allocated"),
])
def test_a_config_is_checked_before_anything_is_allocated(tmp_path, weight_spy, key, value, error, message):
    trained_mlp().save(tmp_path / "m.dnnbind")
    weight_spy.clear()
    bad = _rewrite_config(tmp_path / "m.dnnbind", tmp_path / "bad.dnnbind", lambda ls: ls[1]["config"].update({key: value}))
    with pytest.raises(error, match=message):
        keras.load_model(bad)
    assert weight_spy == []


def test_the_weights_of_a_config_are_sized_before_any_is_made(tmp_path, weight_spy):
    trained_mlp().save(tmp_path / "m.dnnbind")
    # huge input: the first Dense's kernel alone passes the machine's memory
    bad = _rewrite_config(tmp_path / "m.dnnbind", tmp_path / "bad.dnnbind",
                          lambda ls: ls[0]["config"].update({"shape": [2**40]}))
    weight_spy.clear()
    with pytest.raises(AllocationTooLargeError, match=r"layer 'd1' \(Dense\) weight 'kernel' of shape \(1099511627776, 8\)"):
        keras.load_model(bad)
    assert weight_spy == []
    # d1: 4*8*4 + 8*4 = 160 bytes; d2: 8*3*4 = 96 more passes 200, before d1 is created
    with pytest.raises(AllocationTooLargeError, match=r"layer 'd2' \(Dense\) weight 'kernel' of shape \(8, 3\) "
                                                      r"\(float32\) needs 96 bytes, bringing the model's weights to at "
                                                      r"least 256 bytes, more than the 200 bytes of max_weight_bytes"):
        keras.load_model(tmp_path / "m.dnnbind", max_weight_bytes=200)
    assert weight_spy == []
    unbuilt = [layers.Dense(8, name="a"), layers.Dense(3, name="b")]
    assert saving.check_weight_budget(unbuilt, (4,), "test") == 160 + 96 + 12
    assert weight_spy == [] and not any(layer.built for layer in unbuilt)
    loaded = keras.load_model(tmp_path / "m.dnnbind", max_weight_bytes=268)
    assert [c[:2] for c in weight_spy] == [("d1", "kernel"), ("d1", "bias"), ("d2", "kernel"), ("d2", "bias")]
    assert loaded.count_params() == 67


def _write_safetensors(path, tensors):
    """A safetensors file by hand (safetensors.numpy cannot write bfloat16)."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, array) in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_weight_tensors_must_be_float_and_extra_ones_are_named(tmp_path):
    model = trained_mlp()
    weights = {f"{layer.name}/{w.name}": w.numpy() for layer in model.layers for w in layer._weights}
    path = tmp_path / "w.safetensors"
    other = mlp()

    _write_safetensors(path, {k: ("I8", np.ones_like(v, np.int8)) for k, v in weights.items()})
    with pytest.raises(saving.SavingError, match=r"tensor 'd1/kernel' has dtype int8 but layer 'd1' \(Dense\) needs "
                                                 r"a float tensor \(float32;"):
        other.load_weights(path)

    for code, dtype in [("F64", np.float64), ("F16", np.float16)]:
        _write_safetensors(path, {k: (code, v.astype(dtype)) for k, v in weights.items()})
        other.load_weights(path)
        for (name, want), got in zip(weights.items(), other.get_weights()):
            assert got.dtype == np.float32
            assert np.array_equal(got, want.astype(dtype).astype(np.float32)), name

    ml_dtypes = pytest.importorskip("ml_dtypes")
    _write_safetensors(path, {k: ("BF16", v.astype(ml_dtypes.bfloat16)) for k, v in weights.items()})
    other.load_weights(path)
    assert np.array_equal(other.get_weights()[0], weights["d1/kernel"].astype(ml_dtypes.bfloat16).astype(np.float32))

    extra = {k: ("F32", v) for k, v in weights.items()}
    extra["d3/kernel"] = ("F32", np.ones((3, 3), np.float32))
    extra["notes"] = ("U8", np.arange(4, dtype=np.uint8))
    _write_safetensors(path, extra)
    with pytest.warns(UserWarning, match="2 tensor\\(s\\) not used by model '.*' were ignored: d3/kernel, notes"):
        other.load_weights(path)
    assert np.array_equal(other.get_weights()[3], weights["d2/bias"])

    _write_safetensors(path, {k: ("F32", v) for k, v in weights.items() if k != "d2/bias"})
    with pytest.raises(saving.SavingError, match="has no tensor 'd2/bias' for layer 'd2'"):
        other.load_weights(path)


# ----- all or nothing -----------------------------------------------------------------------------
def _assert_unchanged(model, before):
    after = model.get_weights()
    assert len(after) == len(before)
    for a, b in zip(after, before):
        assert np.array_equal(a, b)


def test_failed_set_weights_and_load_weights_change_no_weight(tmp_path):
    model = trained_mlp()
    before = model.get_weights()
    new = [np.full_like(w, 7.0) for w in before]

    with pytest.raises(ValueError, match=r"layer 'd2' \(Dense\): weight 'bias' expects shape \(3,\), got \(4,\)"):
        model.set_weights(new[:-1] + [np.zeros(4, np.float32)])
    _assert_unchanged(model, before)
    with pytest.raises(TypeError, match="layer 'd2': weight 'bias' must be numeric, got dtype <U1"):
        model.set_weights(new[:-1] + [np.array(["a", "b", "c"])])
    _assert_unchanged(model, before)
    with pytest.raises(ValueError, match="set_weights expects 4 arrays"):
        model.set_weights(new[:-1])
    _assert_unchanged(model, before)
    with pytest.raises(TypeError, match="weight 'bias' must be numeric"):
        model.layers[1].set_weights([new[2], np.array(["a", "b", "c"])])
    _assert_unchanged(model, before)

    names = ["d1/kernel", "d1/bias", "d2/kernel", "d2/bias"]
    path = tmp_path / "w.safetensors"
    for last, error in [(("F32", np.zeros((4,), np.float32)), "'d2/bias' has shape \\(4,\\)"),
                        (("I8", np.zeros((3,), np.int8)), "'d2/bias' has dtype int8")]:
        _write_safetensors(path, {**{n: ("F32", a) for n, a in zip(names[:-1], new)}, "d2/bias": last})
        with pytest.raises(saving.SavingError, match=error):
            model.load_weights(path)
        _assert_unchanged(model, before)
    model.set_weights(new)  # and a good call still changes every weight
    assert all(np.all(w == 7.0) for w in model.get_weights())


def test_optimizer_state_is_checked_before_a_model_is_loaded(tmp_path):
    model = trained_mlp()
    path = tmp_path / "m.dnnbind"
    model.save(path)
    with zipfile.ZipFile(path) as zf:
        files = {name: zf.read(name) for name in zf.namelist()}
    from safetensors.numpy import load, save

    state = load(files["optimizer.safetensors"])
    assert state["iterations"] == 2 and sorted(state)[-1] == "iterations"

    def with_state(changed):
        with zipfile.ZipFile(path, "w") as zf:
            for name, data in files.items():
                zf.writestr(name, save(changed) if name == "optimizer.safetensors" else data)

    with_state({**state, "3/v": np.zeros((4,), np.float32)})
    with pytest.raises(saving.SavingError, match="Adam state '3/v' has shape \\(4,\\), the parameter needs \\(3,\\)"):
        keras.load_model(path)
    with_state({**state, "3/v": np.zeros((3,), np.int32)})
    with pytest.raises(saving.SavingError, match="Adam state '3/v' has dtype int32, expected a float dtype"):
        keras.load_model(path)
    with_state({k: v for k, v in state.items() if k != "0/m"})
    with pytest.raises(saving.SavingError, match="Adam state is missing '0/m'"):
        keras.load_model(path)
    with_state({**state, "iterations": np.array([-1], np.int64)})
    with pytest.raises(saving.SavingError, match="'iterations' must be one integer >= 0"):
        keras.load_model(path)
    with_state({**state, "9/m": np.zeros((2,), np.float32)})
    with pytest.warns(UserWarning, match="1 tensor\\(s\\) not used by Adam were ignored: 9/m"):
        loaded = keras.load_model(path)
    assert loaded.optimizer.iterations == 2
    assert np.array_equal(loaded.optimizer.get_state()["3/v"], state["3/v"])
