"""Finding and loading the CUDA libraries: pathfinder, override variables, and the not-found message."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest

from dnnbind._lib import loader
from dnnbind.errors import DnnbindError, LibraryNotFoundError

CUDNN_PATH = loader.library_info("cudnn").path


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch):
    for name in loader.LIBRARIES:
        monkeypatch.delenv(loader.override_variable(name), raising=False)
    loader.clear_cache()
    yield
    loader.clear_cache()


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DNNBIND_")}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=120)


@pytest.mark.parametrize("name", ["cudnn", "cublas", "cublasLt", "nvrtc"])
def test_found_by_pathfinder_with_version(name):
    info = loader.library_info(name)
    assert info.name == name
    assert info.found_via in {"site-packages", "conda", "CUDA_PATH", "system-search", "was-already-loaded-from-elsewhere"}
    assert info.path is None or os.path.isfile(info.path)
    if name == "nvrtc":
        major, minor = info.version.split(".")
        assert int(major) >= 12 and int(minor) >= 0
    else:
        assert isinstance(info.version, int) and info.version >= 90000
    assert loader.load_library(name) is loader.load_library(name)  # cached


def test_override_file_in_process(monkeypatch):
    monkeypatch.setenv("DNNBIND_CUDNN_PATH", CUDNN_PATH)
    info = loader.library_info("cudnn")
    assert info.found_via == "override:DNNBIND_CUDNN_PATH"
    assert info.path == os.path.abspath(CUDNN_PATH)
    assert info.version >= 90000


def test_override_directory_in_process(monkeypatch):
    monkeypatch.setenv("DNNBIND_CUDNN_PATH", os.path.dirname(CUDNN_PATH))
    info = loader.library_info("cudnn")
    assert info.found_via == "override:DNNBIND_CUDNN_PATH"
    assert os.path.basename(info.path).startswith("libcudnn.so")
    assert "_" not in os.path.basename(info.path)  # libcudnn.so.9, not libcudnn_ops.so.9


_DESCRIPTOR_PROBE = """
import dnnbind.cudnn as cd
from dnnbind._lib import loader
x = cd.TensorDescriptor((2, 3, 9, 9), "float32")
w = cd.FilterDescriptor((4, 3, 3, 3), "float32")
conv = cd.ConvolutionDescriptor(pad=1, stride=2)
print(loader.library_info("cudnn").found_via, loader.library_info("cudnn").path, conv.forward_output_dim(x, w))
"""


def test_override_directory_of_links_loads_sublibraries(tmp_path):
    # A directory other than the wheel's: cudnnCreateConvolutionDescriptor and the output-dim
    # query live in libcudnn_cnn, which libcudnn.so.9 dlopens from its own directory.
    for lib in glob.glob(os.path.join(os.path.dirname(CUDNN_PATH), "libcudnn*.so*")):
        os.symlink(lib, tmp_path / os.path.basename(lib))
    proc = _run(_DESCRIPTOR_PROBE, DNNBIND_CUDNN_PATH=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    found_via, path, dims = proc.stdout.split(" ", 2)
    assert found_via == "override:DNNBIND_CUDNN_PATH"
    assert path.startswith(str(tmp_path))
    assert dims.strip() == "(2, 4, 5, 5)"


def test_override_file_in_fresh_process():
    proc = _run(_DESCRIPTOR_PROBE, DNNBIND_CUDNN_PATH=CUDNN_PATH)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("override:DNNBIND_CUDNN_PATH ")
    assert proc.stdout.strip().endswith("(2, 4, 5, 5)")


def test_bogus_override_names_path_and_fix(monkeypatch, tmp_path):
    bogus = str(tmp_path / "no" / "libcudnn.so.9")
    monkeypatch.setenv("DNNBIND_CUDNN_PATH", bogus)
    with pytest.raises(LibraryNotFoundError) as info:
        loader.load_library("cudnn")
    msg = str(info.value)
    assert bogus in msg and "DNNBIND_CUDNN_PATH" in msg
    assert 'pip install "dnnbind[cu12]"' in msg and "nvidia-cudnn-cu12" in msg
    assert isinstance(info.value, DnnbindError) and isinstance(info.value, OSError)


def test_override_directory_without_library(monkeypatch, tmp_path):
    monkeypatch.setenv("DNNBIND_CUBLAS_PATH", str(tmp_path))
    with pytest.raises(LibraryNotFoundError, match="holds no file matching") as info:
        loader.load_library("cublas")
    assert str(tmp_path) in str(info.value) and "nvidia-cublas-cu12" in str(info.value)


def test_override_file_that_is_not_a_library(monkeypatch, tmp_path):
    fake = tmp_path / "libnvrtc.so.12"
    fake.write_text("not an ELF file")
    monkeypatch.setenv("DNNBIND_NVRTC_PATH", str(fake))
    with pytest.raises(LibraryNotFoundError, match="cannot load the nvrtc library from") as info:
        loader.load_library("nvrtc")
    assert "nvidia-cuda-nvrtc-cu12" in str(info.value)


def test_missing_library_lists_every_place_looked(monkeypatch):
    from cuda.pathfinder import DynamicLibNotFoundError

    def not_found(name):
        raise DynamicLibNotFoundError(f'Failure finding "lib{name}.so.12": No such file')

    monkeypatch.setattr(loader, "_pathfinder_load", not_found)
    monkeypatch.setenv("CUDA_HOME", "/opt/nowhere-cuda")
    with pytest.raises(LibraryNotFoundError) as info:
        loader.load_library("cublasLt")
    msg = str(info.value)
    for needle in ("DNNBIND_CUBLASLT_PATH: not set", "site-packages", "conda", "/opt/nowhere-cuda",
                   "LD_LIBRARY_PATH", 'Failure finding "libcublasLt.so.12"', "DynamicLibNotFoundError",
                   'pip install "dnnbind[cu12]"', "nvidia-cublas-cu12", "nvidia-cublas"):
        assert needle in msg, needle


def test_unknown_library_name():
    with pytest.raises(ValueError, match="unknown CUDA library 'cufft'"):
        loader.load_library("cufft")


def test_import_loads_nothing():
    code = (
        "import dnnbind, dnnbind.cudnn, dnnbind.cublas, dnnbind._lib.cudnn, dnnbind._lib.cublas\n"
        "from dnnbind._lib import loader\n"
        "maps = open('/proc/self/maps').read()\n"
        "print(len(loader._loaded), 'libcudnn' in maps, 'libcublas' in maps)\n"
    )
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "False", "False"]
