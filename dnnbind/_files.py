"""Crash-safe files: a file replaced whole or not at all (:func:`atomic_write`), the temporaries of
dead writers cleaned up, directory fsync and locks.

A shared leaf (standard library only): :mod:`dnnbind.saving_lib` writes weights, models and
checkpoint directories with it, :mod:`dnnbind.callbacks` its plots.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
from typing import Any, Iterator

try:
    import fcntl
except ImportError:  # not POSIX: directory checkpoints are still atomic, only unlocked
    fcntl = None

__all__ = ["atomic_write", "remove_stale_temporaries", "fsync_directory", "existing_mode", "create_exclusive",
           "directory_lock", "target_error"]

_TEMP_FILE = re.compile(r"^\.(?P<target>.+)\.tmp-(?P<pid>[0-9]+)-[0-9a-f]+$")


def _temp_name(target_name: str) -> str:
    return f".{target_name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"


def _process_exists(pid: int) -> bool:
    if pid == os.getpid():
        return True  # another thread of this process may be writing it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's live process, or a pid we cannot judge: keep its file
    return True


def remove_stale_temporaries(directory: "str | os.PathLike", target_name: str | None = None) -> list[str]:
    """Delete the temporaries (``.<target>.tmp-<pid>-<random>``) in ``directory`` whose writer process
    no longer exists; only those of ``target_name`` when given. Returns the names removed.

    A temporary of a live process is never touched (its pid answers ``kill(pid, 0)``). Pids are
    per machine: on a directory shared by several machines, only use this where the writers are local.
    """
    directory = os.fspath(directory)
    removed = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        match = _TEMP_FILE.match(name)
        if match is None or (target_name is not None and match["target"] != target_name):
            continue
        if not _process_exists(int(match["pid"])):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))
                removed.append(name)
    return removed


def fsync_directory(directory: str) -> None:
    """Make renames and new names in ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a directory; the rename is still atomic
    finally:
        os.close(fd)


def existing_mode(path: str) -> int | None:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None


def create_exclusive(path: str, mode: int | None) -> int:
    """A new file opened for writing: ``0666 & ~umask`` as ``open()`` would give, or ``mode``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    if mode is not None:
        try:
            os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            raise
    return fd


def target_error(exc: OSError, target: str, temporary: str) -> OSError:
    """``exc`` (raised on ``temporary``, a file a save writes before it becomes ``target``) reworded to
    name ``target``, the path the user gave: same errno, so the same OSError subclass."""
    where = os.path.dirname(temporary) or "."
    return OSError(exc.errno, f"cannot save {target}: {exc.strerror or exc} (a save first writes "
                              f"{os.path.basename(temporary)} in {where}, then renames it; save to a writable "
                              "directory with free space)", target)


@contextlib.contextmanager
def atomic_write(path: "str | os.PathLike", mode: str = "wb") -> Iterator[Any]:
    """Open a temporary file next to ``path``; on success fsync it and rename it to ``path``
    (keeping the mode of the file it replaces), on failure delete it.

    The temporary is ``.<name>.tmp-<pid>-<random>``; stale ones of the same target left by dead
    processes are removed first. A symlink at ``path`` is written through, as ``open()`` does.
    """
    target = os.path.realpath(os.fspath(path))
    directory, name = os.path.split(target)
    os.makedirs(directory, exist_ok=True)
    remove_stale_temporaries(directory, name)
    tmp = os.path.join(directory, _temp_name(name))
    try:
        fd = create_exclusive(tmp, existing_mode(target))
    except OSError as exc:  # a read-only or full file system: say which save failed, not which temporary
        raise target_error(exc, os.fspath(path), tmp) from None
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename in (None, tmp):  # ours (a write, fsync, rename)
            raise target_error(exc, os.fspath(path), tmp) from exc
        raise
    fsync_directory(directory)


@contextlib.contextmanager
def directory_lock(directory: str, exclusive: bool) -> Iterator[bool]:
    """``flock`` on the directory itself (no lock file; the kernel drops it when the holder dies).
    Yields whether it locked (False where there is no ``flock``: then nothing proves that a file
    another writer made is abandoned)."""
    if fcntl is None:
        yield False
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield True
    finally:
        os.close(fd)  # releases the lock
