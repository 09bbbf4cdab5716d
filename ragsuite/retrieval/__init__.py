"""Retrievers: the :class:`Passage` type, the :class:`Retriever` protocol and its implementations.

BM25 (bm25s) is the embedded default; ColBERTv2 is reachable over HTTP or through a local colbert-ai index
(the ``colbert`` extra); :class:`HybridRetriever` merges several.
"""

from ragsuite.retrieval.base import Passage, Retriever

__all__ = ["Passage", "Retriever"]
