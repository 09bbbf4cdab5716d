"""Merging ranked passage lists: alternating interleave (the LiveRAG winner's merge of sparse and dense
results, also used to merge its two knowledge-focused rerankings) and reciprocal rank fusion.

Example:
    >>> from ragsuite.retrieval.base import Passage
    >>> a = [Passage("1", "", "x"), Passage("2", "", "y")]
    >>> b = [Passage("2", "", "y"), Passage("3", "", "z")]
    >>> [p.id for p in interleave([a, b])]
    ['1', '2', '3']
"""

from __future__ import annotations

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


def rrf(lists: Sequence[Sequence[Passage]], *, k: int = 60, limit: int | None = None) -> list[Passage]:
    """Fuse ranked lists by reciprocal rank: ``score(d) = sum over lists of 1 / (k + rank(d))`` with ranks
    from 1. Ties keep first-seen order. Returned passages carry the fused score.

    Args:
        lists: Ranked passage lists, best first.
        k: The RRF constant (60 in Cormack et al.).
        limit: Return at most this many passages.
    """
    if k < 0:
        raise ConfigError(f"k must be >= 0, not {k}")
    scores: dict[str, float] = {}
    first: dict[str, Passage] = {}
    for ranked in lists:
        seen_here: set[str] = set()
        for rank, passage in enumerate(ranked, start=1):
            if passage.id in seen_here:  # a list repeating an id counts once, at its best rank
                continue
            seen_here.add(passage.id)
            first.setdefault(passage.id, passage)
            scores[passage.id] = scores.get(passage.id, 0.0) + 1.0 / (k + rank)
    order = sorted(first, key=lambda pid: -scores[pid])  # sorted() is stable: ties keep first-seen order
    fused = [first[pid].with_score(scores[pid]) for pid in order]
    return fused if limit is None else fused[:limit]


__all__ = ["interleave", "rrf"]
