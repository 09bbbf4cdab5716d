"""The retrieval contract every program relies on: :class:`Passage` and the :class:`Retriever` protocol.

:class:`Passage` and :func:`passage_id` live in :mod:`ragsuite.passages`, below both the corpora
(:mod:`ragsuite.data`) and the retrievers, and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ragsuite.passages import Passage, passage_id

__all__ = [
    "COLBERT_QUERY_TOKENS",
    "Passage",
    "Reranker",
    "Retriever",
    "passage_id",
    "query_token_limit",
    "ranked_ids",
]


@runtime_checkable
class Retriever(Protocol):
    """Anything that maps a query to ranked passages.

    Implementations must be safe to call from several threads at once and must raise
    :class:`ragsuite.errors.RetrievalError` on failure rather than return an empty list. One with an async
    client may also define ``async def acall(query, k)``: a program run with ``acall`` awaits it instead of
    calling ``__call__`` in a worker thread.
    """

    def __call__(self, query: str, k: int) -> list[Passage]: ...

    def batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]: ...

    def describe(self) -> dict[str, Any]:
        """A JSON-able description (kind and settings, never secrets) saved in manifests and program files."""
        ...


@runtime_checkable
class Reranker(Protocol):
    """Anything that scores given passages against a query (higher is more relevant): a cross-encoder, or
    ColBERT late interaction (:meth:`ragsuite.retrieval.colbert.index.ColBERTv2Index.score`)."""

    def score(self, query: str, passages: Sequence[Passage]) -> list[float]: ...


#: Query tokens a ColBERTv2 encoder reads by default (``query_maxlen``); later tokens are dropped.
COLBERT_QUERY_TOKENS = 32


def query_token_limit(retriever: Any) -> int | None:
    """How many query tokens ``retriever`` reads (its ``query_token_limit`` attribute), or ``None`` when it
    reads the whole query (BM25, dense). A hybrid retriever reads as little as its most limited member.

    Programs ask this to build retrieval texts whose important part survives the cut.
    """
    limit = getattr(retriever, "query_token_limit", None)
    if limit is not None:
        return int(limit)
    limits = [query_token_limit(member) for member in getattr(retriever, "retrievers", None) or []]
    known = [limit for limit in limits if limit is not None]
    return min(known) if known else None


def ranked_ids(retriever: Retriever, queries: Sequence[str], k: int) -> list[list[str]]:
    """The ids of ``retriever.batch(queries, k)``'s passages: from its ``batch_ids`` when it has one (BM25
    reads only the ids then, not the titles and texts), else from the passages."""
    batch_ids = getattr(retriever, "batch_ids", None)
    if batch_ids is not None:
        return batch_ids(queries, k)
    return [[p.id for p in passages] for passages in retriever.batch(queries, k)]
