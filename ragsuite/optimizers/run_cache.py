"""A long run's own record of its LM replies, so that a run stopped part-way resumes where it stopped.

A compile on the local CPU LM takes hours, and a killed process loses everything it held. With
:func:`recording_lm_calls` every LM reply of the run lands on disk as it arrives, in a folder that belongs to
the run's output (DSPy's disk cache, keyed as every cached reply is: by the request and the endpoint, or for
the local LM by the model file's sha256 and engine; see :mod:`ragsuite.lm_client`). The same run started
again replays the finished calls from there and sends only the rest; the optimizers are seeded, so the replay
takes the same path and ends with the same program.

The folder holds :data:`RUN_FILE`, what the run was started with (program, knobs, optimizer, options,
examples, LMs by model and endpoint without credentials). A folder holding the calls of a run started with
anything else is refused, so that no reply of another LM, model or program is replayed. Replies still come
from (and go to) the cache in force before, DSPy's shared one, as without the run's folder.

Example:
    >>> with recording_lm_calls("runs/mipro.lm-cache", description={"program": "vanilla"}):  # doctest: +SKIP
    ...     compiled = compile_program(program, train, val, optimizer="mipro", dataset="hotpotqa")
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dspy
from dspy.clients.cache import Cache

from ragsuite.errors import ConfigError
from ragsuite.files import atomic_write_text, lock_directory

log = logging.getLogger("ragsuite.optimizers.run_cache")

#: The file in a run's cache folder that records what the run was started with.
RUN_FILE = "ragsuite-run.json"

#: A run's cache never evicts: an evicted reply would be paid for again on resume (diskcache culls above it).
NO_EVICTION_BYTES = 2**50


class RunCache(Cache):
    """DSPy's response cache on a folder of the run's own, in front of the cache in force before.

    A reply is looked up in the run's folder, then in ``fallback``; a new reply is stored in both.

    Args:
        folder: The run's cache folder.
        fallback: The cache in force before (DSPy's shared one), or None.
    """

    def __init__(self, folder: Path, *, fallback: Cache | None) -> None:
        super().__init__(
            enable_disk_cache=True,
            enable_memory_cache=True,
            disk_cache_dir=str(folder),
            disk_size_limit_bytes=NO_EVICTION_BYTES,
        )
        self.folder = folder
        self.fallback = fallback
        self.found_at_start = len(self.disk_cache)

    def get(self, request: dict[str, Any], ignored_args_for_cache_key: list[str] | None = None) -> Any:
        found = super().get(request, ignored_args_for_cache_key)
        if found is None and self.fallback is not None:
            found = self.fallback.get(request, ignored_args_for_cache_key)
        return found

    def put(
        self,
        request: dict[str, Any],
        value: Any,
        ignored_args_for_cache_key: list[str] | None = None,
        enable_memory_cache: bool = True,
    ) -> None:
        super().put(request, value, ignored_args_for_cache_key, enable_memory_cache)
        if self.fallback is not None:
            self.fallback.put(request, value, ignored_args_for_cache_key, enable_memory_cache)

    def close(self) -> None:
        """Close the folder's database files (the replies are already on disk)."""
        close = getattr(self.disk_cache, "close", None)
        if close is not None:
            close()


def settings_differing(record: Path, wanted: dict[str, Any]) -> list[str] | None:
    """The keys whose values differ between ``wanted`` and the run description saved in ``record`` (an
    unreadable one differs in every key), or None when no description was saved there."""
    if not record.is_file():
        return None
    try:
        saved = json.loads(record.read_text(encoding="utf-8"))
    except ValueError:
        saved = {}
    if not isinstance(saved, dict):
        saved = {}
    return sorted(k for k in set(wanted) | set(saved) if wanted.get(k) != saved.get(k))


def check_run_folder(folder: Path, description: dict[str, Any]) -> None:
    """Record ``description`` in a new folder, or check that the folder's run was started with it.

    Raises:
        ConfigError: the folder holds the replies of a run started with something else (the differences
            are named), or replies without :data:`RUN_FILE`.
    """
    record = folder / RUN_FILE
    wanted = json.loads(json.dumps(description, sort_keys=True, default=str))
    differs = settings_differing(record, wanted)
    if differs is not None:
        if differs:
            raise ConfigError(
                f"{folder} holds the LM replies of a run started with another {', '.join(differs)}; "
                "rerun with that run's settings to resume it, delete that folder to start over, or write "
                "to another --out"
            )
        return
    # Dot files are the folder's lock and a description write a kill interrupted, not replies.
    if any(not path.name.startswith(".") for path in folder.iterdir()):
        raise ConfigError(
            f"{folder} holds files but no {RUN_FILE}, so its replies cannot be checked against this run; "
            "delete that folder or write to another --out"
        )
    atomic_write_text(record, json.dumps(wanted, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def recording_lm_calls(
    folder: str | os.PathLike[str], *, description: dict[str, Any], label: str = "run"
) -> Iterator[RunCache]:
    """Record the LM replies of the ``with`` block in ``folder`` and replay those an earlier run left there.

    Only LMs built with their cache on (``cache=True``, the default) use it; DSPy bypasses any cache for an
    LM built with ``cache=False``. One process at a time may use a folder.

    Args:
        folder: The run's cache folder (created if missing).
        description: What the run is started with (JSON; never a key or credential): program, knobs,
            optimizer, options, examples, LMs. Another run's folder is refused (see :func:`check_run_folder`).
        label: The run's name in the message that says what was found ("compile").

    Yields:
        The cache in force in the block; ``found_at_start`` counts the replies an earlier run left.

    Raises:
        ConfigError: another process uses the folder, or it holds another run's replies.
    """
    folder = Path(folder).expanduser()
    with lock_directory(folder, flag="--out"):
        check_run_folder(folder, description)
        previous = dspy.cache  # builds DSPy's shared cache now if nothing has yet
        cache = RunCache(folder, fallback=previous)
        if cache.found_at_start:
            log.warning(
                "resuming: %d LM calls cached from an earlier %s in %s", cache.found_at_start, label, folder
            )
        dspy.cache = cache
        try:
            yield cache
        finally:
            dspy.cache = previous
            cache.close()


__all__ = ["RUN_FILE", "RunCache", "check_run_folder", "recording_lm_calls"]
