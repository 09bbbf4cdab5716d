"""Fitting a hybrid's fusion settings on a retrieval objective (recall@k or all_gold@k of gold passages), with
no LM: the members are queried once, deep enough for every setting tried, and each Optuna trial only fuses
those lists again (:meth:`~ragsuite.retrieval.hybrid.HybridRetriever.fuse`), so a trial costs milliseconds.

Example:
    With the ``dense`` extra, on NQ's ``questions`` and their gold passage ids ``golds``:

    >>> from ragsuite.retrieval.hybrid import FusionSearch
    >>> from ragsuite.retrieval.spec import build_retriever
    >>> search = FusionSearch(build_retriever("hybrid:linear:bm25+dense", dataset="nq"))  # doctest: +SKIP
    >>> lists = member_lists(search.retriever, questions, depth=search.max_depth)  # doctest: +SKIP
    >>> result = sweep_fusion(search, lists, golds, metric="recall@5", trials=40)  # doctest: +SKIP
    >>> result.retriever.describe()["spec"]  # doctest: +SKIP
    'hybrid:linear:bm25:nq@0.35+dense:nq@0.65'
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ragsuite.errors import ConfigError
from ragsuite.retrieval.base import Passage
from ragsuite.retrieval.hybrid import FusionSearch, HybridRetriever

log = logging.getLogger("ragsuite.retrieval.sweep")

#: Queries per member batch call.
_BATCH = 64


def member_lists(
    hybrid: HybridRetriever,
    queries: Sequence[str],
    *,
    depth: int,
    on_batch: Callable[[int], Any] | None = None,
) -> list[list[list[Passage]]]:
    """Each query's ranked list from every member (``[query][member]``), ``depth`` deep (or a member's
    ``max_k``, if lower)."""
    out: list[list[list[Passage]]] = []
    for lo in range(0, len(queries), _BATCH):
        chunk = list(queries[lo : lo + _BATCH])
        per_member = hybrid._fan_out(lambda r, chunk=chunk: r.batch(chunk, _member_depth(r, depth)))
        out.extend([lists[q] for lists in per_member] for q in range(len(chunk)))
        if on_batch is not None:
            on_batch(len(chunk))
    return out


def _member_depth(member: Any, depth: int) -> int:
    limit = getattr(member, "max_k", None)  # a ColBERT server refuses k above its limit
    return depth if not isinstance(limit, int) else min(depth, limit)


def parse_metric(metric: str) -> tuple[str, int]:
    """``"recall@5"`` -> ``("recall", 5)``; ``all_gold@K`` likewise."""
    name, _, k = metric.partition("@")
    if name not in ("recall", "all_gold") or not k.isdigit() or int(k) < 1:
        raise ConfigError(f"the sweep metric must be recall@K or all_gold@K, not {metric!r}")
    return name, int(k)


def fused_metrics(
    hybrid: HybridRetriever,
    lists: Sequence[Sequence[Sequence[Passage]]],
    golds: Sequence[Sequence[str]],
    ks: Sequence[int],
) -> dict[str, float]:
    """Mean ``recall@k`` and ``all_gold@k`` of ``hybrid``'s fusion of the members' ``lists``."""
    from ragsuite.data.metrics import all_gold, retrieval_recall

    if not golds:
        raise ConfigError("no question with gold passage ids to score")
    depth = max(ks)
    ranked = [[p.id for p in hybrid.fuse(per_member, depth)] for per_member in lists]
    metrics: dict[str, float] = {}
    for k in sorted(set(ks)):
        metrics[f"recall@{k}"] = statistics.fmean(
            retrieval_recall(r, g, k) for r, g in zip(ranked, golds, strict=True)
        )
        metrics[f"all_gold@{k}"] = statistics.fmean(
            all_gold(r, g, k) for r, g in zip(ranked, golds, strict=True)
        )
    return metrics


@dataclass
class SweepResult:
    """The best fusion found: the hybrid with its settings, its Optuna params and metrics, and every trial
    (``{"params", "value"}``)."""

    retriever: HybridRetriever
    params: dict[str, Any]
    metrics: dict[str, float]
    trials: list[dict[str, Any]]


def sweep_fusion(
    search: FusionSearch,
    lists: Sequence[Sequence[Sequence[Passage]]],
    golds: Sequence[Sequence[str]],
    *,
    metric: str = "recall@5",
    ks: Sequence[int] = (5, 10),
    trials: int = 40,
    seed: int = 0,
) -> SweepResult:
    """Search ``search``'s fusion settings with seeded TPE, maximizing ``metric`` over the questions.

    The first trial is the hybrid as built, so the result is never worse than it on these questions; ties
    keep the earlier trial. ``lists`` must be at least ``search.max_depth`` deep (:func:`member_lists`).
    """
    import optuna

    _, k = parse_metric(metric)
    if trials < 1:
        raise ConfigError(f"trials must be >= 1, not {trials}")
    ks = sorted({*ks, k})
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    study.enqueue_trial(search.defaults())

    def objective(trial: optuna.Trial) -> float:
        return fused_metrics(search.suggest(trial), lists, golds, [k])[metric]

    study.optimize(objective, n_trials=trials)
    done = [t for t in study.trials if t.value is not None]
    best = max(done, key=lambda t: (t.value, -t.number))
    retriever = search.suggest(optuna.trial.FixedTrial(best.params))
    return SweepResult(
        retriever=retriever,
        params=dict(best.params),
        metrics=fused_metrics(retriever, lists, golds, ks),
        trials=[{"params": dict(t.params), "value": t.value} for t in done],
    )


__all__ = ["SweepResult", "fused_metrics", "member_lists", "parse_metric", "sweep_fusion"]
