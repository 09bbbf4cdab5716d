"""Rerankers: models that score given passages against a query, higher is more relevant (the
:class:`~ragsuite.retrieval.base.Reranker` protocol), for knowledge-aware diverse reranking.

* :class:`PoolBM25`: Okapi BM25 with the candidate pool itself as the collection (Lucene's idf, ``k1=1.5``,
  ``b=0.75``, the tokenization of ragsuite's BM25: lowercase words of two or more characters, English
  stopwords dropped, Snowball-stemmed). Needs no model and scores every candidate, whichever retriever found
  it.
* :class:`CrossEncoderReranker`: a Hugging Face cross-encoder (a sequence-classification model reading the
  query and the passage together, e.g. ``BAAI/bge-reranker-v2-m3`` downloaded to a folder), from a local
  path; needs ``transformers`` and ``torch`` (the ``dense`` extra).
* :class:`ColBERTReranker`: late interaction with a ColBERT checkpoint (``colbert`` extra); a ColBERTv2 index
  (:class:`~ragsuite.retrieval.colbert.index.ColBERTv2Index`) scores any passages the same way.

:func:`reranker_from_spec` builds one from a command-line spec: ``cross-encoder:PATH`` or ``colbert:DIR``.

Example:
    >>> from ragsuite.retrieval.base import Passage
    >>> pool = [Passage("a", "Ali", "Muhammad Ali won world titles"), Passage("b", "Rain", "It rained")]
    >>> [round(s, 3) for s in PoolBM25().score("Ali world titles", pool)]
    [1.985, 0.0]
"""

from __future__ import annotations

import math
import re
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragsuite.errors import ConfigError
from ragsuite.retrieval.base import Passage

_WORD = re.compile(r"(?u)\b\w\w+\b")
#: The spec forms :func:`reranker_from_spec` accepts.
RERANKER_SPEC_HELP = (
    "cross-encoder:PATH (a Hugging Face cross-encoder folder, e.g. a downloaded "
    "bge-reranker-v2-m3; needs transformers and torch), colbert:DIR (a ColBERT checkpoint folder, or a "
    "ColBERTv2 index built by `ragsuite index`, scoring with its checkpoint), or lm (the LM scores each "
    "passage 0-10)"
)


class PoolBM25:
    """Okapi BM25 over the candidate pool: each call treats ``passages`` as the whole collection.

    Args:
        k1: Term-frequency saturation.
        b: Length normalization.

    Example:
        >>> PoolBM25().score("anything", [])
        []
    """

    def __init__(self, *, k1: float = 1.5, b: float = 0.75) -> None:
        if k1 < 0 or not 0 <= b <= 1:
            raise ConfigError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        self.k1, self.b = float(k1), float(b)

    @staticmethod
    def _terms(text: str) -> list[str]:
        import Stemmer
        from bm25s.stopwords import STOPWORDS_EN

        stop = set(STOPWORDS_EN)
        words = [w for w in _WORD.findall(text.lower()) if w not in stop]
        return Stemmer.Stemmer("english").stemWords(words) if words else []

    def score(self, query: str, passages: Sequence[Passage]) -> list[float]:
        """The BM25 score of each passage (title and text) for ``query``, with the passages' statistics."""
        documents = [Counter(self._terms(f"{p.title} {p.text}")) for p in passages]
        if not documents:
            return []
        lengths = [sum(d.values()) for d in documents]
        average = sum(lengths) / len(lengths) or 1.0
        query_terms = set(self._terms(query))
        n = len(documents)
        idf = {
            t: math.log(1 + (n - df + 0.5) / (df + 0.5)) for t in query_terms for df in [_df(t, documents)]
        }
        scores = []
        for counts, length in zip(documents, lengths, strict=True):
            norm = self.k1 * (1 - self.b + self.b * length / average)
            scores.append(
                sum(
                    (
                        idf[t] * counts[t] * (self.k1 + 1) / (counts[t] + norm)
                        for t in query_terms
                        if counts[t]
                    ),
                    0.0,
                )
            )
        return scores

    def describe(self) -> dict[str, Any]:
        return {"kind": "pool-bm25", "k1": self.k1, "b": self.b}


def _df(term: str, documents: Sequence[Counter[str]]) -> int:
    return sum(1 for d in documents if d[term])


class CrossEncoderReranker:
    """A Hugging Face cross-encoder read from a local folder; scores are its relevance logits (the positive
    class's logit for a two-class head).

    Args:
        path: The model folder (``config.json``, weights, tokenizer).
        max_length: Tokens of query + passage read per pair.
        batch_size: Pairs per forward pass.
        device: ``cpu``, ``cuda``... (default: CUDA when available).

    Raises:
        ConfigError: a missing folder, or ``transformers``/``torch`` not installed.
    """

    def __init__(
        self, path: str | Path, *, max_length: int = 512, batch_size: int = 32, device: str | None = None
    ) -> None:
        self.path = Path(path).expanduser()
        if not (self.path / "config.json").is_file():
            raise ConfigError(
                f"cross-encoder {self.path} has no config.json; give the folder of a Hugging Face "
                "sequence-classification model (e.g. a downloaded BAAI/bge-reranker-v2-m3)"
            )
        try:
            import torch
            from transformers import AutoModelForSequenceClassification, AutoTokenizer
        except ImportError:
            raise ConfigError(
                "a cross-encoder reranker needs transformers and torch: pip install -e '.[dense]'"
            ) from None
        self._torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self.model = AutoModelForSequenceClassification.from_pretrained(self.path).to(self.device).eval()
        self.max_length, self.batch_size = max_length, batch_size

    def score(self, query: str, passages: Sequence[Passage]) -> list[float]:
        """One relevance score per passage for ``query``."""
        texts = [p.render() for p in passages]
        scores: list[float] = []
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start : start + self.batch_size]
            encoded = self.tokenizer(
                [query] * len(batch),
                batch,
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
            with self._torch.no_grad():
                logits = self.model(**encoded).logits.float()
            column = logits[:, -1] if logits.shape[-1] <= 2 else logits.max(dim=-1).values
            scores.extend(float(v) for v in column.cpu())
        return scores

    def describe(self) -> dict[str, Any]:
        return {"kind": "cross-encoder", "path": str(self.path), "max_length": self.max_length}


class ColBERTReranker:
    """Late-interaction (MaxSim) scores from a ColBERT checkpoint alone, no index: the sum over query tokens
    of the best dot product with any document token (as :meth:`ColBERTv2Index.score
    <ragsuite.retrieval.colbert.index.ColBERTv2Index.score>` scores with an index's checkpoint).

    Args:
        checkpoint: A local ColBERT checkpoint folder (``config.json``; e.g. ``colbert-ir/colbertv2.0``
            downloaded) or a model-hub name.

    Raises:
        ConfigError: a folder without ``config.json``, or colbert-ai not installed (the ``colbert`` extra).
    """

    def __init__(self, checkpoint: str | Path) -> None:
        from ragsuite.errors import require
        from ragsuite.retrieval.colbert.compat import patch_colbert_for_transformers
        from ragsuite.retrieval.colbert.index import _colbert_run, _resolve_checkpoint

        require("colbert", extra="colbert", feature="A ColBERT reranker")
        patch_colbert_for_transformers()
        from colbert.infra.config import ColBERTConfig
        from colbert.modeling.checkpoint import Checkpoint

        self.checkpoint = _resolve_checkpoint(checkpoint)
        self._run = _colbert_run
        self._root = Path(tempfile.gettempdir())  # colbert-ai's run root; inference writes nothing there
        with _colbert_run(self._root):
            config = ColBERTConfig.load_from_checkpoint(self.checkpoint) or ColBERTConfig()
            self._model = Checkpoint(self.checkpoint, colbert_config=config)

    def score(self, query: str, passages: Sequence[Passage]) -> list[float]:
        """One late-interaction score per passage for ``query``."""
        if not passages:
            return []
        with self._run(self._root):
            Q = self._model.queryFromText([query])[0]  # (query tokens, dim)
            D = self._model.docFromText([p.render() for p in passages], bsize=64)[0]
            token_scores = D.float() @ Q.float().T  # (docs, doc tokens, query tokens)
            # docFromText zeroes padding and punctuation tokens: they must never be a token's best match.
            token_scores[D.abs().sum(dim=-1) == 0] = float("-inf")
            return [float(s) for s in token_scores.max(dim=1).values.sum(dim=-1)]

    def describe(self) -> dict[str, Any]:
        return {"kind": "colbert-checkpoint", "checkpoint": self.checkpoint}


def reranker_from_spec(spec: str) -> Any:
    """A reranker from ``cross-encoder:PATH`` or ``colbert:DIR`` (a ColBERT index built by ``ragsuite index``,
    or a checkpoint folder).

    Raises:
        ConfigError: another form (the message lists them), or a model that cannot be loaded.
    """
    kind, sep, where = spec.partition(":")
    if sep and where and kind == "cross-encoder":
        return CrossEncoderReranker(where)
    if sep and where and kind == "colbert":
        from ragsuite.retrieval.colbert.index import ColBERTv2Index, is_colbert_index

        return ColBERTv2Index.load(where) if is_colbert_index(where) else ColBERTReranker(where)
    raise ConfigError(f"unknown reranker {spec!r}; use {RERANKER_SPEC_HELP}")


__all__ = ["RERANKER_SPEC_HELP", "ColBERTReranker", "CrossEncoderReranker", "PoolBM25", "reranker_from_spec"]
