"""ColBERTv2 retrieval: an HTTP client of the ColBERT server protocol (:mod:`.client`), a local colbert-ai
PLAID index (:mod:`.index`, the ``colbert`` extra) and a tiny-checkpoint builder for smoke tests
(:mod:`.checkpoint`). Nothing heavy is imported until used."""

from ragsuite.retrieval.colbert.client import ColBERTv2Client

__all__ = ["ColBERTv2Client"]
