"""Summaries of a run's records and the paper-style Markdown table of one or more summaries.

Scores are means over the examples that finished without error; failed examples are counted in ``errors``,
not scored as wrong. With no example scored, every mean is None and every table cell "–", never 0.

Example:
    Two records scored by :func:`~ragsuite.evaluation.example.arun_example`, one right and one wrong:

    >>> import dspy
    >>> from ragsuite.aio import run_sync
    >>> from ragsuite.data.datasets import load_dataset
    >>> from ragsuite.evaluation.example import arun_example
    >>> from ragsuite.testing.scripted import ScriptedLM
    >>> program = dspy.Predict("question -> answer")
    >>> with dspy.context(lm=ScriptedLM(lambda request: {"answer": "Rush"})):
    ...     records = [run_sync(arun_example(program, ex, ex.id, dataset="hotpotqa"))
    ...                for ex in load_dataset("hotpotqa")[:2]]
    >>> summary = summarize(records, dataset="hotpotqa", total=2)
    >>> summary["metrics"]["accuracy"], summary["errors"]
    (0.5, 0)
    >>> print(format_table([{**summary, "program": "predict", "lm": "scripted"}]))
    | program | dataset | LM | n | errors | Acc | F1 | EM | R-recall | LM calls/q | requests/q | ...
    |---|...
    | predict | hotpotqa | scripted | 2 | 0 | 50.0 | 50.0 | 50.0 | – | – | 1.00 | – | 0 | 0.00 | – |
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ragsuite.data.datasets import get_dataset_info
from ragsuite.lm import redact

#: Above this share of stage calls answered by a parse-error fallback, the run is flagged as unreliable.
FALLBACK_WARNING_SHARE = 0.2
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
METRIC_LABELS = {
    "accuracy": "Acc",
    "f1": "F1",
    "exact_match": "EM",
    "yes_no_accuracy": "Acc",
    "str_em": "STR-EM",
    "str_hit": "STR-Hit",
}


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
