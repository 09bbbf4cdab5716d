"""Evaluate a program on a dataset, resumably: :func:`evaluate` and the run directory it writes.

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

The modules, one concern each:
    loop       :func:`evaluate` and its run loop (handles each finished example in the caller's thread)
    engines    where examples run at once: worker threads or one event loop
    example    one example: run, score, count its LM calls and tokens
    store      the run directory: manifest check, record log, summary files
    manifest   what defines a run, versions, git revision
    summary    means over the records, the Markdown table
    paired     runs compared question by question
    progress   the progress bar

Example:
    A scripted LM that always answers "Rush" stands in for a real one here:

    >>> import dspy
    >>> from ragsuite import programs
    >>> from ragsuite.data.datasets import load_dataset
    >>> from ragsuite.evaluation import evaluate
    >>> from ragsuite.retrieval.bm25 import BM25Retriever
    >>> from ragsuite.testing.scripted import ScriptedLM
    >>> examples = load_dataset("hotpotqa")[:4]
    >>> program = programs.get("vanilla")(retriever=BM25Retriever.from_dataset("hotpotqa"), task="short")
    >>> with dspy.context(lm=ScriptedLM(lambda request: {"answer": "Rush"})):
    ...     result = evaluate(program, examples, dataset="hotpotqa", out_dir="runs/x", progress=False)
    >>> result.metrics["accuracy"], result.cost["lm_calls"]
    (0.25, 1.0)
"""

from __future__ import annotations

from ragsuite.evaluation.example import example_id
from ragsuite.evaluation.loop import EvalResult, evaluate
from ragsuite.evaluation.manifest import (
    CONFIG_KEYS,
    config_diff,
    default_manifest,
    examples_fingerprint,
    git_revision,
    package_versions,
)
from ragsuite.evaluation.store import (
    MANIFEST,
    RECORDS,
    REJECTED,
    SUMMARY,
    TABLE,
    RecordLog,
    RunStore,
    json_text,
    load_run,
    read_records,
    record_problem,
)
from ragsuite.evaluation.summary import (
    COST_KEYS,
    FALLBACK_WARNING_SHARE,
    METRIC_LABELS,
    MISSING,
    failure_message,
    format_table,
    summarize,
)

__all__ = [
    "CONFIG_KEYS",
    "COST_KEYS",
    "FALLBACK_WARNING_SHARE",
    "MANIFEST",
    "METRIC_LABELS",
    "MISSING",
    "RECORDS",
    "REJECTED",
    "SUMMARY",
    "TABLE",
    "EvalResult",
    "RecordLog",
    "RunStore",
    "config_diff",
    "default_manifest",
    "evaluate",
    "example_id",
    "examples_fingerprint",
    "failure_message",
    "format_table",
    "git_revision",
    "json_text",
    "load_run",
    "package_versions",
    "read_records",
    "record_problem",
    "summarize",
]
