"""Crash-safe file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Literal

_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux ``/proc``).

    Elsewhere it is set and restored at once under a lock; ``os.umask`` has no read-only form.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        umask = os.umask(0o077)
        os.umask(umask)
    return umask


def new_file_mode(path: str | os.PathLike[str]) -> int:
    """The mode ``open(path, "w")`` would leave: the existing file's, else 0o666 less the umask."""
    try:
        return stat.S_IMODE(Path(path).stat().st_mode)
    except FileNotFoundError:
        return 0o666 & ~current_umask()


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: Literal["w", "wb"] = "w") -> Iterator[IO]:
    """Open a temporary file beside ``path``; on a clean exit it is fsynced and renamed over ``path``,
    on an exception it is removed and ``path`` is left untouched.

    The file gets the permissions a plain ``open(path, "w")`` would give it (the existing file's mode,
    else 0o666 less the umask), not the 0600 of a temporary file.

    Example:
        >>> with atomic_open("/tmp/ragsuite-example.json") as handle:  # doctest: +SKIP
        ...     handle.write("{}")
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A unique name per writer: concurrent writers of the same path must not share a temporary file.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
            yield handle
            handle.flush()
            os.fchmod(handle.fileno(), new_file_mode(path))
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_open`)."""
    with atomic_open(path) as handle:
        handle.write(text)
    return Path(path)


LOCK_FILE = ".lock"


@contextlib.contextmanager
def lock_directory(path: str | os.PathLike[str], *, flag: str = "--out") -> Iterator[Path]:
    """Hold an exclusive lock on the directory ``path`` (created if missing) for the ``with`` block.

    The lock is an ``fcntl.flock`` on ``path/.lock``, so the kernel releases it when its holder exits,
    even on SIGKILL: a stale lock file never blocks the next run. The file names the holder's pid and
    host for the message another process gets.

    Args:
        path: The directory to lock.
        flag: The option that chose the directory, named in the error message.

    Raises:
        ConfigError: another process holds the lock (the message names its pid and host).

    Example:
        >>> with lock_directory("/tmp/ragsuite-run"):  # doctest: +SKIP
        ...     ...  # only this process writes in /tmp/ragsuite-run
    """
    import fcntl
    import socket

    from ragsuite.errors import ConfigError

    directory = Path(path).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    lock_path = directory / LOCK_FILE
    # 0o666: the umask decides, as for every other file (0o644 left group-shared run directories unlockable).
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
            raise ConfigError(
                f"{directory} is in use by {holder}; wait for it to finish, stop it, "
                f"or pass another {flag} directory"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
        try:
            yield directory
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
