"""The NumPy backend's one-time glibc malloc tuning (dnnbind.kernels._host_memory)."""

from __future__ import annotations

import sys

import pytest

from dnnbind.kernels import _host_memory


class FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []
        self.gnu_get_libc_version = object()
        outer = self

        class Mallopt:
            argtypes = restype = None

            def __call__(self, param: int, value: int) -> int:
                outer.calls.append((param, value))
                return 1

        self.mallopt = Mallopt()


@pytest.fixture
def fake_libc(monkeypatch):
    libc = FakeLibc()
    monkeypatch.setattr(_host_memory.ctypes, "CDLL", lambda name: libc)
    monkeypatch.setattr(_host_memory, "_done", False)
    monkeypatch.setattr(sys, "platform", "linux")
    for name in ("DNNBIND_MALLOC_TUNING", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    return libc


def test_sets_mmap_and_trim_thresholds_once(fake_libc):
    _host_memory.tune_malloc_once()
    _host_memory.tune_malloc_once()
    assert fake_libc.calls == [(-3, 32 << 20), (-1, 256 << 20)]


@pytest.mark.parametrize("name, value", [("DNNBIND_MALLOC_TUNING", "0"), ("MALLOC_TRIM_THRESHOLD_", "1000"),
                                         ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1000")])
def test_leaves_the_allocator_alone_when_the_user_chose(fake_libc, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    _host_memory.tune_malloc_once()
    assert fake_libc.calls == []


def test_no_glibc_no_call(fake_libc):
    del fake_libc.gnu_get_libc_version
    _host_memory.tune_malloc_once()
    assert fake_libc.calls == []
