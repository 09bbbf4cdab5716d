"""The run directory on disk: the manifest check, the crash-tolerant record log and the summary files.

Each finished example is appended to ``records.jsonl`` as one line and fsynced before the next, so a kill
loses at most the line being written. Reading the log back keeps the usable records and names every line that
is not (a torn last line, corrupt JSON, a record of the wrong shape, an id written twice); a resume moves
those lines verbatim to ``records.rejected.jsonl`` and drops failed records, so that their examples run
again.

Example:
    >>> from ragsuite.evaluation.store import RunStore, read_records
    >>> store = RunStore("runs/x")
    >>> store.append({"id": "q1", "error": {"type": "Timeout", "message": "..."}})
    >>> read_records(store.records_path).records["q1"]["error"]["type"]
    'Timeout'
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragsuite.errors import ConfigError, DataError
from ragsuite.evaluation.manifest import CONFIG_KEYS, config_diff
from ragsuite.evaluation.summary import summarize
from ragsuite.files import atomic_open, atomic_write_text
from ragsuite.lm import redact

log = logging.getLogger("ragsuite.evaluation.store")

MANIFEST = "manifest.json"
RECORDS = "records.jsonl"
SUMMARY = "summary.json"
TABLE = "table.md"
#: Lines of records.jsonl that could not be used (corrupt, wrong shape, torn by a kill), kept verbatim.
REJECTED = "records.rejected.jsonl"
#: Token-ledger fields every scored record carries (summaries average them).
_TOKEN_KEYS = ("input", "output", "requests", "cache_hits")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _jsonable(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if hasattr(value, "toDict"):
        return value.toDict()
    return str(value)


def json_text(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` whose text always encodes as UTF-8.

    An unpaired surrogate (from a broken LM reply or dataset line) cannot be encoded, so it is written as a
    ``\\uXXXX`` escape, which reads back as the same string; everything else is written as is."""
    text = json.dumps(value, ensure_ascii=False, default=_jsonable, **kwargs)
    return _SURROGATE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


class RunStore:
    """A run directory: manifest check, crash-tolerant record log, summary.

    Args:
        out_dir: The directory (created if missing).
        config_keys: The manifest keys that define the run (resuming with any of them changed is refused).
    """

    def __init__(self, out_dir: str | os.PathLike[str], *, config_keys: Sequence[str] = CONFIG_KEYS) -> None:
        self.config_keys = tuple(config_keys)
        self.dir = Path(out_dir).expanduser()
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._handle: Any = None

    @property
    def records_path(self) -> Path:
        return self.dir / RECORDS

    def check_manifest(self, manifest: Mapping[str, Any]) -> None:
        """Write ``manifest`` for a new run; for an existing one, refuse a different configuration.

        Raises:
            ConfigError: naming every configuration key whose value differs.
        """
        path = self.dir / MANIFEST
        clean = json.loads(redact(json.dumps(manifest, default=_jsonable, sort_keys=True)))
        if path.exists():
            try:
                old = json.loads(path.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise DataError(f"{path} is not valid JSON ({exc}); use another --out") from None
            diffs = config_diff(old, clean, self.config_keys)
            if diffs:
                raise ConfigError(
                    f"{self.dir} holds a run with another configuration; refusing to mix results. "
                    f"Differences (saved -> now): {'; '.join(diffs)}. "
                    "Rerun with the saved settings to resume, or choose a new --out directory."
                )
            versions_then, versions_now = old.get("versions", {}), clean.get("versions", {})
            if versions_then != versions_now:
                log.warning(
                    "resuming a run made with other package versions: %s -> %s", versions_then, versions_now
                )
            return
        if self.records_path.is_file() and self.records_path.stat().st_size:
            raise ConfigError(
                f"{self.dir} has records ({RECORDS}) but no {MANIFEST}, so nothing says what produced them; "
                "refusing to mix them with this run. Pass another --out, or delete the directory."
            )
        atomic_write_text(path, json.dumps(clean, indent=2, sort_keys=True) + "\n")

    def load_records(self) -> dict[str, dict[str, Any]]:
        """Finished records by id, so that their examples are not run again.

        Lines that cannot be used (a torn last line from a kill, corrupt JSON, a record of the wrong shape, a
        duplicate id) are named in a warning and moved verbatim to ``records.rejected.jsonl``; failed records
        are dropped so that their examples run again. The log is then rewritten atomically with the kept
        lines unchanged, so every id appears once in it."""
        path = self.records_path
        if not path.exists():
            return {}
        found = read_records(path)
        for problem in found.problems:
            log.warning("%s; the line is moved to %s", problem, REJECTED)
        kept = {i: raw for i, raw in found.raw.items() if not found.records[i].get("error")}
        if found.rejected:
            with (self.dir / REJECTED).open("ab") as handle:
                handle.write(b"".join(line + b"\n" for line in found.rejected))
                handle.flush()
                os.fsync(handle.fileno())
        if len(kept) != found.lines:
            with atomic_open(path, "wb") as handle:
                handle.write(b"".join(line + b"\n" for line in kept.values()))
        return {i: found.records[i] for i in kept}

    @staticmethod
    def _line(record: Mapping[str, Any]) -> str:
        # Redaction runs on the final text, so no field can carry a key into the file.
        return redact(json_text(record)) + "\n"

    def append(self, record: Mapping[str, Any]) -> None:
        """Append one record and make it durable before returning."""
        line = self._line(record).encode("utf-8")
        with self._lock:
            if self._handle is None:
                self._handle = self.records_path.open("ab")
            self._handle.write(line)
            self._handle.flush()
            os.fsync(self._handle.fileno())

    def close(self) -> None:
        with self._lock:
            if self._handle is not None:
                self._handle.close()
                self._handle = None

    def write_summary(self, summary: Mapping[str, Any], table: str) -> None:
        atomic_write_text(self.dir / SUMMARY, redact(json_text(summary, indent=2)) + "\n")
        atomic_write_text(self.dir / TABLE, table + "\n")


@dataclass
class RecordLog:
    """What :func:`read_records` found in a ``records.jsonl``.

    Attributes:
        records: The usable records by id (the last line wins for an id written twice).
        raw: Each usable record's line, byte for byte.
        rejected: The lines that could not be used, byte for byte.
        problems: One ``file:line: why`` message per rejected line.
        lines: Non-empty lines read, usable or not.
    """

    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    raw: dict[str, bytes] = field(default_factory=dict)
    rejected: list[bytes] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    lines: int = 0


def record_problem(record: Any) -> str | None:
    """Why ``record`` cannot be used as an eval record, or None when it can."""
    if not isinstance(record, dict):
        return f"not a JSON object but {type(record).__name__}"
    if not isinstance(record.get("id"), (str, int)) or isinstance(record.get("id"), bool):
        return "no 'id'"
    if record.get("error"):
        return None
    if not isinstance(record.get("metrics"), dict) or not all(
        isinstance(v, (int, float)) for v in record["metrics"].values()
    ):
        return "no 'metrics' object of numbers (and no 'error')"
    tokens = record.get("tokens")
    if not isinstance(tokens, dict) or not all(isinstance(tokens.get(k), (int, float)) for k in _TOKEN_KEYS):
        return f"no 'tokens' object with numbers {', '.join(_TOKEN_KEYS)}"
    if not isinstance(record.get("stats", {}), dict):
        return "'stats' is not an object"
    return None


def read_records(path: str | os.PathLike[str]) -> RecordLog:
    """Read a ``records.jsonl``, keeping the usable records and naming every line that is not.

    Lines are split on ``\\n`` only: a record's text may hold any other line separator (U+2028, ``\\r``).
    """
    path = Path(path)
    result = RecordLog()
    # Each record is written as one line ending in "\n", so a kill mid-write leaves a tail without one.
    *complete, tail = path.read_bytes().split(b"\n")
    lines: list[tuple[int, bytes, str | None]] = [(n, line, None) for n, line in enumerate(complete, 1)]
    if tail.strip():
        lines.append((len(complete) + 1, tail, "truncated last line (the run was interrupted mid-write)"))
    first_line: dict[str, int] = {}
    for lineno, line, why in lines:
        if not line.strip():
            continue
        result.lines += 1
        record: Any = None
        if why is None:
            try:
                record = json.loads(line)
            except ValueError as exc:
                why = f"not valid JSON ({exc})"
            else:
                why = record_problem(record)
        if why is not None:
            result.rejected.append(line)
            result.problems.append(f"{path}:{lineno}: {why}")
            continue
        ex_id = str(record["id"])
        if ex_id in result.raw:  # the last record written for an id is the current one
            result.rejected.append(result.raw.pop(ex_id))
            result.problems.append(
                f"{path}:{first_line[ex_id]}: id {ex_id!r} is written again on line {lineno}"
            )
        first_line[ex_id] = lineno
        result.records[ex_id], result.raw[ex_id] = record, line
    return result


def load_run(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """A run's summary row, recomputed from ``records.jsonl`` when ``summary.json`` is missing (a killed run)
    or unusable.

    Record lines that cannot be used (torn by a kill, corrupt, of the wrong shape) are skipped, each named
    on stderr with its ``file:line`` and why.

    Raises:
        DataError: ``run_dir`` holds no eval run manifest.
    """
    run_dir = Path(run_dir)
    manifest_path = run_dir / MANIFEST
    if not manifest_path.is_file():
        raise DataError(f"{run_dir} is not an eval run directory (no {MANIFEST})")
    manifest = _read_object(manifest_path)
    if manifest is None or not isinstance(manifest.get("dataset"), str):
        raise DataError(
            f"{manifest_path} is not an eval run manifest (no 'dataset'); is {run_dir} an eval run?"
        )
    row = _read_object(run_dir / SUMMARY) if (run_dir / SUMMARY).is_file() else None
    if row is not None and not isinstance(row.get("metrics"), dict):
        print(
            f"warning: {run_dir / SUMMARY} has no 'metrics'; summarizing {RECORDS} instead", file=sys.stderr
        )
        row = None
    if row is None:
        records: list[dict[str, Any]] = []
        if (run_dir / RECORDS).is_file():
            found = read_records(run_dir / RECORDS)
            for problem in found.problems:
                print(f"warning: {problem}; skipped", file=sys.stderr)
            records = list(found.records.values())
        row = summarize(records, dataset=manifest["dataset"], total=manifest.get("n_examples"))
    row["dataset"] = manifest["dataset"]
    row["program"] = manifest.get("program", row.get("program", ""))
    lm, knobs = manifest.get("lm"), manifest.get("knobs")
    row["lm"] = lm.get("spec", row.get("lm", "")) if isinstance(lm, dict) else row.get("lm", "")
    if isinstance(knobs, dict) and knobs:
        from ragsuite.programs.catalog import changed_knobs

        # The label names only the knobs set away from the program's defaults; --json keeps them all.
        row["knobs"] = knobs
        changed = changed_knobs(row["program"], knobs)
        if changed:
            row["program"] += " (" + ", ".join(f"{k}={v}" for k, v in changed.items()) + ")"
    row["dir"] = str(run_dir)
    return row


def _read_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None (with a warning naming the file) for text that is not one."""
    try:
        value = json.loads(path.read_bytes())
    except ValueError as exc:
        print(f"warning: {path} is not valid JSON ({exc})", file=sys.stderr)
        return None
    if not isinstance(value, dict):
        print(f"warning: {path} holds a JSON {type(value).__name__}, not an object", file=sys.stderr)
        return None
    return value
