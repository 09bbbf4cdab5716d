"""Metrics for DSPy optimizers over ragsuite programs.

Programs return ``dspy.Prediction(answer, trace, passages, stats)``. DSPy optimizers call a metric as
``metric(example, prediction, trace)`` where ``trace`` is DSPy's list of predictor calls (unrelated to the
prediction's own ``trace`` field, which holds the program's step log): ``None`` while scoring, a list while
bootstrapping demos, in which case the metric must answer pass/fail. GEPA additionally passes
``pred_name`` and ``pred_trace`` and accepts ``dspy.Prediction(score=..., feedback=...)``.

Example:
    >>> metric = optimizer_metric(dataset="hotpotqa")      # doctest: +SKIP
    >>> gepa_metric = feedback_metric(dataset="hotpotqa")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import dspy

from ragsuite.errors import ConfigError

Metric = Callable[..., Any]

#: Scores at or above this count as a pass when a float metric is asked for a bool (bootstrapping).
PASS_THRESHOLD = 1.0


def resolve_metric(metric: Metric | None, dataset: str | None) -> Metric:
    """``metric`` itself, or the dataset's primary metric from :func:`ragsuite.data.metrics.metric_for`."""
    if metric is not None:
        return metric
    if not dataset:
        raise ConfigError("give metric= or dataset= (whose primary metric is then used)")
    from ragsuite.data.metrics import metric_for

    return metric_for(dataset)


def optimizer_metric(
    metric: Metric | None = None,
    *,
    dataset: str | None = None,
    sound_trace: Callable[[Any], bool] | None = None,
) -> Metric:
    """Wrap a metric for DSPy optimizers: float while scoring, bool while bootstrapping.

    Args:
        metric: ``metric(example, prediction, trace=None)``; defaults to the dataset's primary metric.
        dataset: Dataset whose primary metric is used when ``metric`` is omitted.
        sound_trace: While bootstrapping, a trace with a full-credit answer becomes demos only if this says
            its steps are sound (a program's ``sound_demo_trace``).
    """
    base = resolve_metric(metric, dataset)

    def ragsuite_metric(example: Any, prediction: Any, trace: Any = None, *_: Any, **__: Any) -> float | bool:
        score = base(example, prediction, trace)
        if trace is None:
            return float(score)
        # A float metric asked for a pass/fail decision: only a full-credit answer becomes a demo.
        passed = bool(score) if isinstance(score, bool) else float(score) >= PASS_THRESHOLD
        return passed and (sound_trace is None or sound_trace(trace))

    ragsuite_metric.__name__ = getattr(base, "__name__", "ragsuite_metric")
    return ragsuite_metric


def _passage_ids(items: Sequence[Any] | None) -> list[str]:
    ids = []
    for item in items or []:
        pid = item.get("id") if isinstance(item, dict) else getattr(item, "id", None)
        if pid is not None:
            ids.append(str(pid))
    return ids


def _retrieved_ids(prediction: Any) -> list[str]:
    """Every passage id the program saw: those it used plus those its trace records as retrieved."""
    seen = dict.fromkeys(_passage_ids(getattr(prediction, "passages", None)))
    for event in getattr(prediction, "trace", None) or []:
        if isinstance(event, dict):
            seen.update(dict.fromkeys(str(p) for p in event.get("passage_ids") or []))
            seen.update(dict.fromkeys(_passage_ids(event.get("passages"))))
    return list(seen)


def describe_outcome(example: Any, prediction: Any, score: float) -> str:
    """Textual feedback on one answer: which gold answer was missed and whether the gold passages were
    retrieved and used. GEPA's reflection LM reads it to rewrite instructions."""
    answer = str(getattr(prediction, "answer", "") or "").strip()
    golds = [str(a) for a in (getattr(example, "answers", None) or [])]
    gold_text = " | ".join(repr(g) for g in golds[:5]) or "(none given)"
    if score >= PASS_THRESHOLD:
        lines = [f"Correct (score {score:.2f}): the answer {answer!r} matches the gold answer {gold_text}."]
    elif score > 0:
        lines = [
            f"Partly correct (score {score:.2f}): the answer {answer!r}; the gold answer is {gold_text}."
        ]
    else:
        lines = [f"Wrong (score {score:.2f}): the answer {answer!r} missed the gold answer {gold_text}."]
    short = getattr(example, "short_answers", None)
    if short:
        missed = [g[0] for g in short if g and not any(a.lower() in answer.lower() for a in g)]
        if missed:
            lines.append(f"Short answers not mentioned: {', '.join(repr(m) for m in missed[:5])}.")
    gold_ids = [str(p) for p in (getattr(example, "gold_passage_ids", None) or [])]
    if gold_ids:
        used = set(_passage_ids(getattr(prediction, "passages", None)))
        retrieved = set(_retrieved_ids(prediction))
        found = [g for g in gold_ids if g in retrieved]
        lines.append(f"Retrieval: {len(found)} of {len(gold_ids)} gold passages were retrieved.")
        missing = [g for g in gold_ids if g not in retrieved]
        if missing:
            lines.append(
                f"Never retrieved: {', '.join(missing[:5])}; the search queries did not reach this evidence."
            )
        dropped = [g for g in found if g not in used]
        if dropped and used:
            lines.append(f"Retrieved but not used as evidence: {', '.join(dropped[:5])}.")
    if answer == "":
        lines.append("The answer was empty.")
    return " ".join(lines)


def feedback_metric(metric: Metric | None = None, *, dataset: str | None = None) -> Metric:
    """A GEPA metric: ``dspy.Prediction(score=float, feedback=str)`` built on ``metric``.

    Args:
        metric: ``metric(example, prediction, trace=None)``; defaults to the dataset's primary metric.
        dataset: Dataset whose primary metric is used when ``metric`` is omitted.
    """
    base = resolve_metric(metric, dataset)

    def ragsuite_feedback(
        gold: Any,
        pred: Any,
        trace: Any = None,
        pred_name: str | None = None,
        pred_trace: Any = None,
    ) -> dspy.Prediction:
        score = float(base(gold, pred, None))
        feedback = describe_outcome(gold, pred, score)
        if pred_name:
            feedback = f"[stage {pred_name}] {feedback}"
        return dspy.Prediction(score=score, feedback=feedback)

    return ragsuite_feedback
