"""Child processes (the local LM server, and those tests and benchmarks start), always stopped: SIGINT first
(the process's Ctrl-C path, so it can write its summary and stop its own children), then SIGKILL when it has
not exited in time.

Example:
    >>> with running([sys.executable, "-m", "ragsuite", "serve-retriever", "--corpus", "c.jsonl"]) as proc:
    ...     ...  # the server is stopped however the block ends  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator, Sequence
from typing import Any


def stop_process(process: subprocess.Popen[Any], *, timeout: float = 10.0) -> int:
    """Stop ``process`` (SIGINT, then SIGKILL after ``timeout`` seconds) and return its exit code. A process
    that has already exited is left alone."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)
    return process.returncode


@contextlib.contextmanager
def running(args: Sequence[str], *, timeout: float = 10.0, **popen: Any) -> Iterator[subprocess.Popen[Any]]:
    """``subprocess.Popen(args, **popen)`` for the duration of the block, stopped by :func:`stop_process`
    however the block ends."""
    process = subprocess.Popen(list(args), **popen)
    try:
        yield process
    finally:
        stop_process(process, timeout=timeout)


__all__ = ["running", "stop_process"]
