"""Crash-safe file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Literal


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: Literal["w", "wb"] = "w") -> Iterator[IO]:
    """Open a temporary file beside ``path``; on a clean exit it is fsynced and renamed over ``path``,
    on an exception it is removed and ``path`` is left untouched.

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
