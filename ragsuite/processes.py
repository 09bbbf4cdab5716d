"""Child processes (model servers, and those tests and benchmarks start): started so they never outlive us,
waited on until they serve, and always stopped: SIGINT first (the process's Ctrl-C path, so it can write its
summary and stop its own children), then SIGKILL when it has not exited in time.

Example:
    >>> with running([sys.executable, "-m", "ragsuite", "serve-retriever", "--corpus", "c.jsonl"]) as proc:
    ...     ...  # the server is stopped however the block ends  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ragsuite.network import held_by, listening_pids, port_taken_error


class ProcessExitedError(RuntimeError):
    """The process exited before it served; ``code`` is its exit status."""

    def __init__(self, code: int) -> None:
        super().__init__(f"exited with code {code}")
        self.code = code


def stop_with_parent() -> None:
    """In the child before exec (``preexec_fn``): ask Linux to send SIGTERM when the parent dies, so a killed
    run leaves no server behind holding memory, cores or GPUs."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def served_models(url: str, *, timeout: float = 5.0, api_key: str | None = None) -> list[str] | None:
    """The model ids an OpenAI-compatible server lists at ``url`` (``.../v1/models``), asked with ``api_key``
    where one is given; None while it does not answer; ``[]`` when it answers 401/403 (it was started with
    another key, so it is up but will not list)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as reply:
            payload = json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return [] if exc.code in (401, 403) else None
    except (urllib.error.URLError, OSError, ValueError):
        return None
    data = payload.get("data") if isinstance(payload, dict) else None
    return [str(m.get("id")) for m in data or [] if isinstance(m, dict)]


def model_entries(payload: object) -> list[dict[str, Any]]:
    """The entries of a parsed ``/v1/models`` reply, checked to have OpenAI's shape: an object whose
    ``data`` (absent: none) is a list of objects, each with a string ``id``.

    Raises:
        ValueError: another shape; the message names the part that is wrong.
    """
    if not isinstance(payload, dict):
        raise ValueError(f"the reply is a JSON {_json_kind(payload)}, not an object")
    data = payload.get("data", [])
    if not isinstance(data, list):
        raise ValueError(f"its 'data' is a JSON {_json_kind(data)}, not a list")
    for number, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise ValueError(f"data[{number}] is a JSON {_json_kind(entry)}, not an object")
        if not isinstance(entry.get("id"), str):
            raise ValueError(f"data[{number}].id is a JSON {_json_kind(entry.get('id'))}, not a string")
    return data


def _json_kind(value: object) -> str:
    """The JSON name of a parsed value's type (bool before int: a bool is an int)."""
    kinds = ((bool, "boolean"), (int, "number"), (float, "number"), (str, "string"), (list, "array"))
    fallback = "null" if value is None else "object"
    return next((name for kind, name in kinds if isinstance(value, kind)), fallback)


def wait_until_serving(
    process: subprocess.Popen[Any],
    url: str,
    *,
    timeout: float,
    ready: Callable[[list[str]], bool] = lambda served: True,
    interval: float = 0.25,
    port: int | None = None,
    api_key: str | None = None,
) -> list[str]:
    """Poll ``url`` (``.../v1/models``, asked with ``api_key``) until the listed model ids satisfy ``ready``;
    return them.

    With ``port``, what answers must also be ``process`` (or its process group) listening on that port:
    another server on the port, even one listing the same model, is not ours.

    Raises:
        ProcessExitedError: the process exited first.
        TimeoutError: ``timeout`` seconds passed.
        PortInUseError: another process answered on ``port``.
    """
    deadline = time.monotonic() + timeout
    while True:
        code = process.poll()
        if code is not None:
            raise ProcessExitedError(code)
        served = served_models(url, api_key=api_key)
        if served is not None and ready(served):
            if port is not None:
                owners = listening_pids(port)
                if owners is not None and not held_by(owners, process.pid):
                    raise port_taken_error(urllib.parse.urlsplit(url).hostname or "127.0.0.1", port)
            return served
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not serve within {timeout:g} s")
        # Waiting on the process doubles as the poll interval: an exit is seen at once.
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=interval)


def wait_until_ready(
    process: subprocess.Popen[Any],
    url: str,
    *,
    server: str,
    timeout: float,
    error: Callable[[str], Exception],
    ready: Callable[[list[str]], bool] = lambda served: True,
    port: int | None = None,
    interval: float = 0.25,
    tail: Callable[[], str] | None = None,
    api_key: str | None = None,
) -> list[str]:
    """:func:`wait_until_serving`, with its failures as ``error(message)``: a message naming ``server`` and,
    where ``tail`` gives it, the server's last output. A port held by another process stays a
    :class:`PortInUseError`.

    Raises:
        Exception: ``error(...)`` when the process exited first or ``timeout`` passed.
        PortInUseError: another process answered on ``port``.
    """

    def output() -> str:  # read when it failed: the output it left by then
        return f". Its last output:\n{tail()}" if tail is not None else "; see its output above"

    try:
        return wait_until_serving(
            process, url, timeout=timeout, ready=ready, interval=interval, port=port, api_key=api_key
        )
    except ProcessExitedError as exc:
        if port is not None and listening_pids(port):  # it could not bind: say who holds the port
            raise port_taken_error(urllib.parse.urlsplit(url).hostname or "127.0.0.1", port) from None
        raise error(f"{server} exited with code {exc.code} before serving{output()}") from None
    except TimeoutError:
        raise error(f"{server} did not serve at {url} within {timeout:g} s{output()}") from None


def stop_process(process: subprocess.Popen[Any], *, timeout: float = 10.0, group: bool = False) -> int:
    """Stop ``process`` and return its exit code: SIGINT, then SIGKILL after ``timeout`` seconds. With
    ``group`` the signals go to its whole process group (a server started with ``start_new_session``, and
    its workers), with a SIGTERM step between. A process that has already exited is left alone."""
    steps = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL) if group else (signal.SIGINT, signal.SIGKILL)
    for sig in steps:
        if process.poll() is not None:
            break
        try:
            if group:
                os.killpg(process.pid, sig)
            else:
                process.send_signal(sig)
        except ProcessLookupError:
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout)
    return process.wait()


@contextlib.contextmanager
def running(args: Sequence[str], *, timeout: float = 10.0, **popen: Any) -> Iterator[subprocess.Popen[Any]]:
    """``subprocess.Popen(args, **popen)`` for the duration of the block, stopped by :func:`stop_process`
    however the block ends."""
    process = subprocess.Popen(list(args), **popen)
    try:
        yield process
    finally:
        stop_process(process, timeout=timeout)


__all__ = [
    "ProcessExitedError",
    "model_entries",
    "running",
    "served_models",
    "stop_process",
    "stop_with_parent",
    "wait_until_ready",
    "wait_until_serving",
]
