"""Merging ranked passage lists: alternating interleave (the LiveRAG winner's merge of sparse and dense
results, also used to merge its two knowledge-focused rerankings), reciprocal rank fusion (optionally weighted
per list, as Elasticsearch's weighted RRF) and a linear combination of per-query normalized scores
(Elasticsearch's linear retriever, Weaviate's relative-score fusion with alpha).

Example:
    >>> from ragsuite.retrieval.base import Passage
    >>> a = [Passage("1", "", "x"), Passage("2", "", "y")]
    >>> b = [Passage("2", "", "y"), Passage("3", "", "z")]
    >>> [p.id for p in interleave([a, b])]
    ['1', '2', '3']
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ragsuite.errors import ConfigError
from ragsuite.retrieval.base import Passage


def interleave(lists: Sequence[Sequence[Passage]], *, limit: int | None = None) -> list[Passage]:
    """Merge ranked lists by alternating picks: the 1st of each list in list order, then the 2nd of each, and
    so on, preserving each list's order and skipping passages (by id) already taken.

    Args:
        lists: Ranked passage lists, best first.
        limit: Stop after this many unique passages (``None``: take everything).

    Returns:
        The merged unique passages; each keeps the score of the list it was first taken from.
    """
    merged: list[Passage] = []
    seen: set[str] = set()
    depth = max((len(ranked) for ranked in lists), default=0)
    for rank in range(depth):
        for ranked in lists:
            if rank >= len(ranked):
                continue
            passage = ranked[rank]
            if passage.id in seen:
                continue
            seen.add(passage.id)
            merged.append(passage)
            if limit is not None and len(merged) >= limit:
                return merged
    return merged


def rrf(
    lists: Sequence[Sequence[Passage]],
    *,
    k: int = 60,
    limit: int | None = None,
    weights: Sequence[float] | None = None,
) -> list[Passage]:
    """Fuse ranked lists by reciprocal rank: ``score(d) = sum over lists of w / (k + rank(d))`` with ranks
    from 1 and ``w`` the list's weight (1 for every list by default). Ties keep first-seen order. Returned
    passages carry the fused score.

    Args:
        lists: Ranked passage lists, best first.
        k: The RRF constant (60 in Cormack et al.).
        limit: Return at most this many passages.
        weights: One non-negative weight per list (Elasticsearch's weighted RRF); ``None``: all 1.
    """
    if k < 0:
        raise ConfigError(f"k must be >= 0, not {k}")
    weights = _weights(weights, len(lists))
    scores: dict[str, float] = {}
    first: dict[str, Passage] = {}
    for ranked, weight in zip(lists, weights, strict=True):
        seen_here: set[str] = set()
        for rank, passage in enumerate(ranked, start=1):
            if passage.id in seen_here:  # a list repeating an id counts once, at its best rank
                continue
            seen_here.add(passage.id)
            first.setdefault(passage.id, passage)
            scores[passage.id] = scores.get(passage.id, 0.0) + weight / (k + rank)
    return _ranked(first, scores, limit)


#: Per-query score normalizations of :func:`linear`.
NORMS = ("minmax", "zscore")


def normalize(scores: Sequence[float], *, norm: str = "minmax") -> list[float]:
    """One list's scores on a common scale: ``minmax`` maps them onto [0, 1] (best 1, worst 0; all equal:
    all 1), ``zscore`` subtracts their mean and divides by their standard deviation (all equal: all 0).

    Example:
        >>> normalize([4.0, 3.0, 2.0])
        [1.0, 0.5, 0.0]
    """
    if norm not in NORMS:
        raise ConfigError(f"norm must be one of {', '.join(NORMS)}, not {norm!r}")
    values = [float(s) for s in scores]
    if not values:
        return []
    if norm == "minmax":
        low, high = min(values), max(values)
        return [1.0] * len(values) if high == low else [(s - low) / (high - low) for s in values]
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((s - mean) ** 2 for s in values) / len(values))
    return [0.0] * len(values) if std == 0 else [(s - mean) / std for s in values]


def linear(
    lists: Sequence[Sequence[Passage]],
    *,
    weights: Sequence[float] | None = None,
    norm: str = "minmax",
    limit: int | None = None,
) -> list[Passage]:
    """Fuse ranked lists by a weighted mean of their scores, each list's normalized per query first
    (:func:`normalize`): ``score(d) = sum_i w_i * s_i(d) / sum_i w_i``. A passage missing from a list gets
    that list's lowest normalized score (0 with ``minmax``), as if ranked just below its last passage. Ties
    keep first-seen order; returned passages carry the fused score.

    Args:
        lists: Ranked passage lists, best first, with their retrievers' scores (higher is better).
        weights: One non-negative weight per list; ``None``: all equal. For two lists, ``(1 - alpha, alpha)``
            is Weaviate's relative-score fusion with ``alpha``.
        norm: ``minmax`` or ``zscore``.
        limit: Return at most this many passages.
    """
    weights = _weights(weights, len(lists))
    total = math.fsum(weights)
    first: dict[str, Passage] = {}
    per_list: list[tuple[dict[str, float], float]] = []
    for ranked in lists:
        best: dict[str, float] = {}
        for passage in ranked:
            first.setdefault(passage.id, passage)
            best[passage.id] = max(best.get(passage.id, -math.inf), float(passage.score))
        normalized = dict(zip(best, normalize(list(best.values()), norm=norm), strict=True))
        per_list.append((normalized, min(normalized.values(), default=0.0)))
    scores = {
        pid: math.fsum(w * found.get(pid, floor) for w, (found, floor) in zip(weights, per_list, strict=True))
        / total
        for pid in first
    }
    return _ranked(first, scores, limit)


def _weights(weights: Sequence[float] | None, n: int) -> list[float]:
    if weights is None:
        return [1.0] * n
    weights = [float(w) for w in weights]
    if len(weights) != n:
        raise ConfigError(f"got {len(weights)} weights for {n} ranked lists; give one per list")
    if any(not math.isfinite(w) or w < 0 for w in weights) or not any(weights):
        raise ConfigError(f"weights must be finite, >= 0 and not all 0, not {weights}")
    return weights


def _ranked(first: dict[str, Passage], scores: dict[str, float], limit: int | None) -> list[Passage]:
    order = sorted(first, key=lambda pid: -scores[pid])  # sorted() is stable: ties keep first-seen order
    fused = [first[pid].with_score(scores[pid]) for pid in order]
    return fused if limit is None else fused[:limit]


__all__ = ["NORMS", "interleave", "linear", "normalize", "rrf"]
