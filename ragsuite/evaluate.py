"""Evaluate a program on a dataset: examples run concurrently, each record is persisted the moment it is
finished, and a run directory can be resumed after a crash or a kill.

A run directory holds:
    manifest.json   what was run (program, knobs, LM spec without secrets, dataset, split, versions, ...)
    records.jsonl   one JSON record per finished example, appended, flushed and fsynced
    summary.json    means of every metric and of the cost ledger (LM calls, tokens, retrievals)
    table.md        the paper-style table of summary.json
    records.rejected.jsonl   record lines a resume could not use (torn by a kill, corrupt), kept verbatim
    .lock           held by the process running in the directory (a second one is refused)

Scores are means over the examples that finished without error; examples whose LM or retriever still
failed after retries are recorded with the error, counted in ``errors`` and retried on the next run. With
no example scored, every mean is None (shown as "–"), never 0.

Example:
    >>> from ragsuite.evaluate import evaluate
    >>> examples = load_dataset("hotpotqa")[:50]
    >>> result = evaluate(program, examples, dataset="hotpotqa", threads=8, out_dir="runs/x")
    >>> result.metrics["accuracy"], result.cost["lm_calls"]
    (0.42, 1.0)
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import logging
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback
from dspy.utils.usage_tracker import UsageTracker

from ragsuite.aio import DEFAULT_ENGINE, ENGINES, Engine, invoke, run_sync
from ragsuite.data.datasets import get_dataset_info
from ragsuite.errors import ConfigError, DataError, RagsuiteError, Terminated
from ragsuite.files import atomic_open, atomic_write_text, lock_directory
from ragsuite.lm import LMEndpointError, describe_lm_failure, explain_lm_error, redact

log = logging.getLogger("ragsuite.evaluate")

MANIFEST = "manifest.json"
RECORDS = "records.jsonl"
SUMMARY = "summary.json"
TABLE = "table.md"
#: Lines of records.jsonl that could not be used (corrupt, wrong shape, torn by a kill), kept verbatim.
REJECTED = "records.rejected.jsonl"
#: Above this share of stage calls answered by a parse-error fallback, the run is flagged as unreliable.
FALLBACK_WARNING_SHARE = 0.2
#: Manifest keys that define a run: resuming with any of them changed is refused.
CONFIG_KEYS = (
    "program",
    "program_file_sha256",
    "knobs",
    "lm",
    "stage_lms",
    "dataset",
    "split",
    "seed",
    "limit",
    "retriever",
    "examples_sha256",
)
_NOT_CONFIG = ("api_base", "key_env")
COST_KEYS = (
    "lm_calls",
    "lm_requests",
    "cache_hits",
    "input_tokens",
    "output_tokens",
    "retrievals",
    "steps",
    "fallbacks",
)
#: Token-ledger fields every scored record carries (summaries average them).
_TOKEN_KEYS = ("input", "output", "requests", "cache_hits")
_SURROGATE = re.compile("[\ud800-\udfff]")
METRIC_LABELS = {
    "accuracy": "Acc",
    "f1": "F1",
    "exact_match": "EM",
    "yes_no_accuracy": "Acc",
    "str_em": "STR-EM",
    "str_hit": "STR-Hit",
}


@dataclass
class EvalResult:
    """What :func:`evaluate` returns.

    Attributes:
        metrics: Mean of each dataset metric over the scored examples, in [0, 1]; None when none was scored.
        cost: Per-question means of lm_calls (stage calls), lm_requests (calls that reached the provider),
            cache_hits, input_tokens, output_tokens, retrievals, steps, fallbacks (stage calls whose reply
            could not be parsed) and latency_s; None when no example was scored.
        n: Examples scored (finished without error).
        errors: Examples that failed (recorded with their error, not counted as wrong).
        records: One record per finished example, in dataset order.
        total: Examples asked for.
        stopped: Why the run stopped early (``max_errors``, ``on_record``, a fatal LM error), or None.
        summary: The summary dict also written to ``summary.json``.
    """

    metrics: dict[str, float | None]
    cost: dict[str, float | None]
    n: int
    errors: int
    records: list[dict[str, Any]]
    total: int = 0
    stopped: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------- per-example accounting
class _CallCounter(BaseCallback):
    """Counts every LM call made in one example's context, cached or not."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def on_lm_end(self, call_id: str, outputs: Any, exception: Exception | None = None) -> None:
        with self._lock:
            self.calls += 1


class _Usage(UsageTracker):
    """DSPy's usage tracker, also counting the calls that reached the provider, and the tokens of cache hits
    apart (a cached answer costs what its call cost; see :mod:`ragsuite.lm_client`)."""

    def __init__(self) -> None:
        super().__init__()
        self.requests = 0
        self.cached_prompt = 0
        self.cached_completion = 0
        self._lock = threading.Lock()

    def add_usage(self, lm: str, usage_entry: dict[str, Any]) -> None:
        with self._lock:
            self.requests += 1
            super().add_usage(lm, usage_entry)

    def add_cached_usage(self, lm: str, usage: dict[str, int]) -> None:
        with self._lock:
            self.cached_prompt += int(usage.get("prompt_tokens") or 0)
            self.cached_completion += int(usage.get("completion_tokens") or 0)

    def tokens(self) -> tuple[int, int, dict[str, dict[str, Any]]]:
        """Prompt and completion tokens of every call, cache hits included, and the provider's usage by LM."""
        with self._lock:
            by_lm = self.get_total_tokens()
            cached = self.cached_prompt, self.cached_completion
        prompt = sum(int(u.get("prompt_tokens") or 0) for u in by_lm.values()) + cached[0]
        completion = sum(int(u.get("completion_tokens") or 0) for u in by_lm.values()) + cached[1]
        return prompt, completion, by_lm


class _Fatal(Exception):
    """An LM error that makes every further call pointless (bad key, unknown model, server gone)."""


def example_id(example: Any, index: int) -> str:
    value = example.get("id") if hasattr(example, "get") else getattr(example, "id", None)
    return str(value) if value not in (None, "") else f"#{index}"


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


async def _arun_example(
    program: Callable[..., Any],
    example: Any,
    ex_id: str,
    dataset: str,
    model_hint: str | None,
    count_cache_hits: bool = True,
) -> dict[str, Any]:
    from ragsuite.data.metrics import retrieval_recall, score_example

    # Cache hits never reach the usage tracker, so they are counted with a callback; callbacks make every
    # module, adapter and LM call costlier, hence only when some LM can hit the cache.
    counter = _CallCounter() if count_cache_hits else None
    usage = _Usage()
    overrides: dict[str, Any] = {"track_usage": True, "usage_tracker": usage}
    if counter is not None:
        overrides["callbacks"] = [*dspy.settings.get("callbacks", []), counter]
    started = time.perf_counter()
    prediction = None
    error = None
    with dspy.context(**overrides):
        try:
            extra = {arg: example.get(field) for arg, field in getattr(program, "EXAMPLE_INPUTS", {}).items()}
            # program(...) in a synchronous run (thread engine), await program.acall(...) in the async one.
            prediction = await invoke(program, question=example.question, **extra)
        except RagsuiteError as exc:  # retrieval failures, refused questions: this example only
            error = {"type": type(exc).__name__, "message": redact(str(exc))[:2000]}
        except Exception as exc:
            fatal = explain_lm_error(exc, model=model_hint)
            if fatal is not None:
                raise _Fatal(fatal) from exc
            message = describe_lm_failure(exc, lm=dspy.settings.lm) or redact(str(exc))
            error = {"type": type(exc).__name__, "message": message[:2000]}
    latency = time.perf_counter() - started
    prompt_tokens, completion_tokens, by_lm = usage.tokens()
    record: dict[str, Any] = {
        "id": ex_id,
        "question": example.question,
        "type": example.get("type") or None,
        "answers": list(example.get("answers") or []),
        "error": error,
        "latency_s": round(latency, 4),
        "tokens": {
            "input": prompt_tokens,
            "output": completion_tokens,
            "lm_invocations": counter.calls if counter is not None else usage.requests,
            "requests": usage.requests,
            "cache_hits": max(counter.calls - usage.requests, 0) if counter is not None else 0,
            # Of input/output, the tokens of answers served from the cache (what they cost when first asked).
            "cached_input": usage.cached_prompt,
            "cached_output": usage.cached_completion,
            "by_lm": by_lm,
        },
    }
    if prediction is None:
        return record
    answer = str(prediction.get("answer") or "")
    passages = list(prediction.get("passages") or [])
    passage_ids = [str(getattr(p, "id", p)) for p in passages]
    gold = list(example.get("gold_passage_ids") or [])
    # A program without a retriever has no retrieval recall to report (not a recall of 0).
    retrieves = bool(passage_ids) or getattr(program, "retriever", None) is not None
    record.update(
        prediction=answer,
        metrics=score_example(dataset, example, answer),
        retrieval_recall=retrieval_recall(passage_ids, gold, len(passage_ids))
        if gold and retrieves
        else None,
        passage_ids=passage_ids,
        gold_passage_ids=gold,
        stats=dict(prediction.get("stats") or {}),
        trace=list(prediction.get("trace") or []),
    )
    return record


def _run_example(
    program: Callable[..., Any],
    example: Any,
    ex_id: str,
    dataset: str,
    model_hint: str | None,
    count_cache_hits: bool = True,
) -> dict[str, Any]:
    """:func:`_arun_example`, synchronously (one worker thread of the thread engine)."""
    return run_sync(_arun_example(program, example, ex_id, dataset, model_hint, count_cache_hits))


# ---------------------------------------------------------------------------- the run directory
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


def config_diff(
    saved: Mapping[str, Any], now: Mapping[str, Any], keys: Sequence[str] = CONFIG_KEYS
) -> list[str]:
    """Human-readable differences between two manifests on the configuration keys.

    Where an LM is served (``api_base``) and which variable holds its key are not configuration: the same
    model may be served from another address when a run is resumed."""
    diffs: list[str] = []

    def walk(prefix: str, a: Any, b: Any) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                if key in _NOT_CONFIG and prefix.split(".")[0] in ("lm", "stage_lms", "judge_lm"):
                    continue
                walk(f"{prefix}.{key}", a.get(key), b.get(key))
        elif a != b:
            diffs.append(f"{prefix}: {json.dumps(a)} -> {json.dumps(b)}")

    for key in keys:
        walk(key, saved.get(key), now.get(key))
    return diffs


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


def examples_fingerprint(ids: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------- summaries and tables
def summarize(
    records: Sequence[Mapping[str, Any]], *, dataset: str, total: int | None = None
) -> dict[str, Any]:
    """Means of every metric over the scored records and of the cost ledger per question.

    With no scored record every mean is None (shown as "–"), never 0. When more than
    :data:`FALLBACK_WARNING_SHARE` of the stage calls fell back to a default because the LM's reply could
    not be parsed, ``warnings`` says so: the scores then measure the fallbacks, not the model.
    """
    info = get_dataset_info(dataset)
    scored = [r for r in records if not r.get("error")]
    errors = len(records) - len(scored)

    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    def stat(name: str) -> list[float]:
        return [float(r["stats"][name]) for r in scored if name in (r.get("stats") or {})]

    metrics = {m: mean([float(r["metrics"].get(m, 0.0)) for r in scored]) for m in info.metrics}
    recalls = [float(r["retrieval_recall"]) for r in scored if r.get("retrieval_recall") is not None]
    cost = {
        "lm_calls": mean(stat("lm_calls")),
        "lm_requests": mean([float(r["tokens"]["requests"]) for r in scored]),
        "cache_hits": mean([float(r["tokens"]["cache_hits"]) for r in scored]),
        "input_tokens": mean([float(r["tokens"]["input"]) for r in scored]),
        "output_tokens": mean([float(r["tokens"]["output"]) for r in scored]),
        "retrievals": mean(stat("retrievals")),
        "steps": mean(stat("steps")),
        "fallbacks": mean(stat("fallbacks")),
        "latency_s": mean([float(r.get("latency_s", 0.0)) for r in scored]),
    }
    counted = [r["stats"] for r in scored if {"fallbacks", "lm_calls"} <= set(r.get("stats") or {})]
    stage_calls = sum(int(s["lm_calls"]) for s in counted)
    fallbacks = sum(int(s["fallbacks"]) for s in counted)
    share = fallbacks / stage_calls if stage_calls else None
    warnings = []
    if share is not None and share > FALLBACK_WARNING_SHARE:
        warnings.append(
            f"{fallbacks} of {stage_calls} stage calls ({100 * share:.0f}%) got an LM reply that could not "
            "be parsed and used a fallback default instead, so these scores measure the fallbacks, not the "
            "model; check that the LM follows the prompt format (a chat/instruct model, enough --max-tokens)"
        )
    return {
        "dataset": dataset,
        "metrics": metrics,
        "primary_metric": info.primary_metric,
        "retrieval_recall": mean(recalls),
        "cost": cost,
        "fallback_share": share,
        "warnings": warnings,
        "n": len(scored),
        "errors": errors,
        "total": total if total is not None else len(records),
        "complete": total is not None and len(scored) == total,
    }


#: What a table shows for a figure that does not exist (no scored example, no retriever, ...).
MISSING = "–"


def _pct(value: float | None) -> str:
    return MISSING if value is None else f"{100 * value:.1f}"


def _num(value: float | None, digits: int) -> str:
    return MISSING if value is None else f"{value:.{digits}f}"


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A Markdown table, one row per run: paper metrics as percentages (one decimal), then cost per question.

    Each row is a summary (see :func:`summarize`) plus optional ``program`` and ``lm`` labels.
    """
    metric_cols: list[tuple[str, str]] = []
    for row in rows:
        for metric in get_dataset_info(row["dataset"]).metrics:
            label = METRIC_LABELS.get(metric, metric)
            if (metric, label) not in metric_cols:
                metric_cols.append((metric, label))
    labels = [label for _, label in metric_cols]
    if len(set(labels)) != len(labels):  # several datasets: say which metric is which
        labels = [
            f"{label} ({metric})" if labels.count(label) > 1 else label for metric, label in metric_cols
        ]
    header = [
        "program",
        "dataset",
        "LM",
        "n",
        "errors",
        *labels,
        "R-recall",
        "LM calls/q",
        "requests/q",
        "fallbacks/q",
        "tokens/q",
        "cache hits/q",
        "retr./q",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        metrics = row.get("metrics", {})
        cost = row.get("cost", {})
        parts = (cost.get("input_tokens"), cost.get("output_tokens"))
        tokens = None if None in parts else sum(parts)
        cells = [
            str(row.get("program", "")),
            str(row["dataset"]),
            str(row.get("lm", "")),
            str(row.get("n", 0)) + ("" if row.get("complete", True) else f"/{row.get('total', '?')}"),
            str(row.get("errors", 0)),
            *[_pct(metrics.get(metric)) for metric, _ in metric_cols],
            _pct(row.get("retrieval_recall")),
            _num(cost.get("lm_calls"), 2),
            _num(cost.get("lm_requests"), 2),
            _num(cost.get("fallbacks"), 2),
            _num(tokens, 0),
            _num(cost.get("cache_hits"), 2),
            _num(cost.get("retrievals"), 2),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the runner
def evaluate(
    program: Callable[..., Any],
    examples: Sequence[Any],
    *,
    dataset: str,
    threads: int = 8,
    engine: Engine = DEFAULT_ENGINE,
    out_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    max_errors: int | None = None,
    manifest: Mapping[str, Any] | None = None,
) -> EvalResult:
    """Run ``program(question=...)`` on every example, concurrently, scoring each with the dataset's metrics.

    Args:
        program: A ragsuite program (or any module returning ``dspy.Prediction(answer=..., ...)``).
        examples: ``dspy.Example`` objects with ``question``, labels and ``id``.
        dataset: Dataset name (chooses the metrics).
        threads: Examples run at once (each in a copy of the caller's DSPy context).
        engine: ``"threads"``: one worker thread per concurrent example, running ``program(...)``.
            ``"async"``: one event loop (in one thread) awaiting ``program.acall(...)`` for up to
            ``threads`` examples at once; programs without ``aforward`` run in worker threads. Records,
            resuming and interrupts are the same for both.
        out_dir: Run directory to persist to and resume from (see the module docstring); None keeps
            everything in memory. The directory is locked for the run: a second run on it is refused.
        progress: Show a progress bar with the running score, LM calls and tokens.
        on_record: Called in the caller's thread with each new record (``record["metrics"]`` holds the
            scores). An exception it raises (e.g. ``optuna.TrialPruned``) stops the run, after the examples
            in flight are persisted, and propagates.
        max_errors: Stop cleanly once this many examples have failed (the summary is still written).
        manifest: The run's description, saved as ``manifest.json``; resuming with a different
            configuration is refused. Defaults to program name, knobs, dataset and example ids.

    Returns:
        :class:`EvalResult`.

    A KeyboardInterrupt (Ctrl-C, or SIGTERM turned into :class:`~ragsuite.errors.Terminated`) stops the run:
    the examples in flight are dropped, the summary of the finished ones is written, and it propagates.

    Raises:
        ConfigError: bad arguments, ``out_dir`` holding a run with another configuration or records without
            a manifest, or another process running in ``out_dir``.
        LMEndpointError: an LM error that no retry can fix (bad key, unknown model, unreachable server).
    """
    if threads < 1:
        raise ConfigError(f"threads must be >= 1, not {threads}")
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if max_errors is not None and max_errors < 1:
        raise ConfigError(f"max_errors must be >= 1, not {max_errors}")
    get_dataset_info(dataset)
    ids = [example_id(ex, i) for i, ex in enumerate(examples)]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise DataError(f"example id {dup!r} appears more than once")
    options: dict[str, Any] = {
        "dataset": dataset,
        "threads": threads,
        "engine": engine,
        "progress": progress,
        "on_record": on_record,
        "max_errors": max_errors,
        "manifest": manifest,
    }
    if out_dir is None:
        return _execute(program, examples, ids, store=None, **options)
    with lock_directory(out_dir):
        store = RunStore(out_dir)
        try:
            store.check_manifest(
                manifest if manifest is not None else default_manifest(program, dataset, ids)
            )
            return _execute(program, examples, ids, store=store, **options)
        finally:
            store.close()


def _execute(
    program: Callable[..., Any],
    examples: Sequence[Any],
    ids: Sequence[str],
    *,
    store: RunStore | None,
    dataset: str,
    threads: int,
    engine: Engine,
    progress: bool,
    on_record: Callable[[dict[str, Any]], None] | None,
    max_errors: int | None,
    manifest: Mapping[str, Any] | None,
) -> EvalResult:
    """The run loop of :func:`evaluate`, once the arguments are checked and the run directory is held."""
    done: dict[str, dict[str, Any]] = {}
    if store is not None:
        wanted = set(ids)
        done = {i: r for i, r in store.load_records().items() if i in wanted}
        if done:
            log.info("resuming %s: %d of %d examples already done", store.dir, len(done), len(ids))
    todo = [(ex, i) for ex, i in zip(examples, ids, strict=True) if i not in done]
    model_hint = getattr(dspy.settings.get("lm"), "model", None)
    count_cache_hits = _may_hit_cache(program)

    new: dict[str, dict[str, Any]] = {}
    errors = 0
    stopped: str | None = None
    deferred: BaseException | None = None
    bar = _Progress(len(ids), initial=len(done), dataset=dataset, enabled=progress)
    for record in done.values():
        bar.add(record, count=False)

    # Workers pull the next example themselves, so no slot waits on the caller's thread (which persists
    # records, fsyncs and runs on_record); each example runs in its own copy of the caller's context.
    base_context = contextvars.copy_context()
    results: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    halt = threading.Event()
    take_lock = threading.Lock()
    remaining = iter(todo)
    # Workers may run at most this many examples ahead of the records the caller has handled, so that a
    # stop requested from on_record takes effect quickly.
    ahead = threading.BoundedSemaphore(2 * threads)
    failures = [0]

    def finished(record: dict[str, Any]) -> None:
        """Hand a record to the caller's thread (and stop the workers once max_errors have failed)."""
        if record["error"] and max_errors is not None:
            with take_lock:
                failures[0] += 1
                if failures[0] >= max_errors:
                    halt.set()
        results.put(("record", record))

    def worker() -> None:
        try:
            while not halt.is_set():
                ahead.acquire()
                if halt.is_set():
                    return
                with take_lock:
                    item = next(remaining, None)
                if item is None:
                    return
                try:
                    record = base_context.copy().run(
                        _run_example, program, item[0], item[1], dataset, model_hint, count_cache_hits
                    )
                except BaseException as exc:  # _Fatal, or a bug in the harness: stop everyone
                    halt.set()
                    results.put(("raised", exc))
                    return
                finished(record)
        finally:
            results.put(("exit", None))

    async def loop_worker() -> None:
        """The async engine: one event loop starting an example whenever one of ``threads`` slots is free,
        under the same rules as the thread workers (``ahead``, ``halt``, ``max_errors``)."""
        loop = asyncio.get_running_loop()
        # Retrievers and DSPy's own LM-call bookkeeping run in asyncio.to_thread: give the loop enough.
        io_threads = ThreadPoolExecutor(max_workers=min(threads, 64), thread_name_prefix="ragsuite-eval-io")
        loop.set_default_executor(io_threads)
        slots = asyncio.Semaphore(threads)
        running: set[asyncio.Task[None]] = set()

        async def one(example: Any, ex_id: str) -> None:
            try:
                record = await _arun_example(program, example, ex_id, dataset, model_hint, count_cache_hits)
            except BaseException as exc:  # _Fatal, or a bug in the harness: stop everyone
                halt.set()
                results.put(("raised", exc))
                return
            finally:
                slots.release()
            finished(record)

        try:
            while not halt.is_set():
                await slots.acquire()
                while not ahead.acquire(blocking=False):  # never block the loop on the caller
                    if halt.is_set():
                        break
                    await asyncio.sleep(0.005)
                if halt.is_set():
                    break
                item = next(remaining, None)
                if item is None:
                    break
                task = loop.create_task(one(*item))
                running.add(task)
                task.add_done_callback(running.discard)
            if running:
                await asyncio.wait(set(running))
        finally:
            results.put(("exit", None))

    if engine == "async":
        workers = (
            [
                threading.Thread(
                    target=base_context.copy().run,
                    args=(asyncio.run, loop_worker()),
                    name="ragsuite-eval-loop",
                    daemon=True,
                )
            ]
            if todo
            else []
        )
    else:
        workers = [
            threading.Thread(target=worker, name=f"ragsuite-eval-{i}", daemon=True)
            for i in range(min(threads, len(todo)))
        ]
    try:
        for thread in workers:
            thread.start()
        running = len(workers)
        while running:
            try:
                kind, payload = results.get(timeout=0.5)  # a timeout keeps Ctrl-C responsive
            except queue.Empty:
                continue
            if kind == "exit":
                running -= 1
                continue
            if kind == "raised":
                if deferred is None:
                    if isinstance(payload, _Fatal):
                        stopped, deferred = str(payload), LMEndpointError(str(payload))
                    else:
                        stopped, deferred = f"{type(payload).__name__}: {payload}", payload
                continue
            record = payload
            if store is not None:
                store.append(record)
            new[record["id"]] = record
            bar.add(record)
            if record["error"]:
                errors += 1
                log.warning("%s", failure_message(record))
                if max_errors is not None and errors >= max_errors and stopped is None:
                    stopped = f"max_errors={max_errors} reached"
            if on_record is not None and deferred is None:
                try:
                    on_record(record)
                except BaseException as exc:  # e.g. optuna.TrialPruned: stop, persist, then re-raise
                    stopped, deferred = f"on_record raised {type(exc).__name__}", exc
                    halt.set()
            ahead.release()
    except KeyboardInterrupt as exc:
        # Ctrl-C or SIGTERM: the examples in flight are dropped (daemon threads) and rerun on resume; the
        # finished ones are on disk and summarized below.
        halt.set()
        stopped, deferred = ("terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"), exc
    except BaseException:
        halt.set()
        bar.close()
        raise
    bar.close()

    by_id = {**done, **new}
    if store is not None and isinstance(deferred, KeyboardInterrupt):
        # The interrupt can land between writing a record and noting it: what is on disk is the truth.
        store.close()
        by_id = {**by_id, **read_records(store.records_path).records}
    records = [by_id[i] for i in ids if i in by_id]
    summary = summarize(records, dataset=dataset, total=len(ids))
    summary["stopped"] = stopped
    if manifest is not None:
        summary["program"] = manifest.get("program")
        summary["lm"] = (manifest.get("lm") or {}).get("spec")
    else:
        summary["program"] = getattr(program, "name", type(program).__name__)
    if store is not None:
        store.close()
        store.write_summary(summary, format_table([summary]))
    for warning in summary["warnings"]:
        log.warning("%s", warning)
    if stopped:
        log.warning("run stopped early: %s", stopped)
    result = EvalResult(
        metrics=summary["metrics"],
        cost=summary["cost"],
        n=summary["n"],
        errors=summary["errors"],
        records=records,
        total=len(ids),
        stopped=stopped,
        summary=summary,
    )
    if deferred is not None:
        raise deferred
    return result


def failure_message(record: Mapping[str, Any], *, question_chars: int = 80) -> str:
    """One line about a failed example: the cause first and whole (redacted), then the id and the start of
    the question, so that a long question never hides why it failed."""
    error = record.get("error") or {}
    question = str(record.get("question", ""))
    if len(question) > question_chars:
        question = question[: question_chars - 3] + "..."
    return (
        f"{error.get('type', 'Error')}: {redact(str(error.get('message', '')))} "
        f"(example {record.get('id')}, question {question!r})"
    )


def _may_hit_cache(program: Any) -> bool:
    """Whether any LM the program would call (the context's or a stage's) uses DSPy's response cache."""
    lms = [dspy.settings.get("lm")]
    named = getattr(program, "named_predictors", None)
    if callable(named):
        lms += [getattr(predictor, "lm", None) for _, predictor in named()]
    return any(bool(getattr(lm, "cache", False)) for lm in lms if lm is not None)


def default_manifest(program: Any, dataset: str, ids: Sequence[str]) -> dict[str, Any]:
    knobs = program.knobs() if hasattr(program, "knobs") else {}
    return {
        "program": getattr(program, "name", type(program).__name__),
        "knobs": knobs,
        "dataset": dataset,
        "examples_sha256": examples_fingerprint(ids),
        "n_examples": len(ids),
        "versions": package_versions(),
    }


def package_versions() -> dict[str, str]:
    """Versions of Python and the packages that change results."""
    import platform
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for name in ("ragsuite", "dspy", "litellm", "openai", "optuna", "bm25s"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def git_revision() -> dict[str, Any] | None:
    """The ragsuite checkout's commit and whether it has uncommitted changes, when it is a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": rev, "dirty": bool(dirty)}


class _Progress:
    """A tqdm bar on stderr whose postfix shows the running primary score, errors, LM calls and tokens."""

    def __init__(self, total: int, *, initial: int, dataset: str, enabled: bool) -> None:
        self.metric = get_dataset_info(dataset).primary_metric
        self.scored = 0
        self.errors = 0
        self.score = 0.0
        self.calls = 0
        self.tokens = 0
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="eval", unit="q", dynamic_ncols=True)

    def add(self, record: Mapping[str, Any], *, count: bool = True) -> None:
        if record.get("error"):
            self.errors += 1
        else:
            self.scored += 1
            self.score += float(record["metrics"].get(self.metric, 0.0))
        tokens = record.get("tokens", {})
        self.calls += int(tokens.get("lm_invocations", 0))
        self.tokens += int(tokens.get("input", 0)) + int(tokens.get("output", 0))
        if self.bar is not None:
            if count:
                self.bar.update(1)
            done = max(self.scored + self.errors, 1)
            self.bar.set_postfix_str(
                f"{self.metric}={100 * self.score / max(self.scored, 1):.1f}% err={self.errors} "
                f"calls/q={self.calls / done:.1f} tok/q={self.tokens / done:.0f}",
                refresh=False,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


__all__ = [
    "EvalResult",
    "RunStore",
    "config_diff",
    "default_manifest",
    "evaluate",
    "format_table",
    "git_revision",
    "package_versions",
    "summarize",
]
