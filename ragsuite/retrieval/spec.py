"""Build a retriever from a command-line spec.

Specs:
    bm25[:DATASET]               the embedded BM25 index of ``--dataset``'s corpus, or of DATASET's corpus
                                 (TriviaQA ships no corpus: ``bm25:nq``); built once, cached on disk
    colbert-server:URL           a ColBERTv2 HTTP server (``/api/search`` protocol)
    colbert-index:DIR            a local colbert-ai PLAID index (``pip install 'ragsuite[colbert]'``)
    dense[:DATASET[:MODEL_DIR]]  MiniLM (or MODEL_DIR) embeddings of a dataset's corpus, cached on disk
                                 (``pip install 'ragsuite[dense]'``)
    hybrid:MODE:SPEC+SPEC[+...]  several of the above merged, MODE = interleave | rrf
"""

from __future__ import annotations

import os
from typing import Any

from ragsuite.errors import ConfigError
from ragsuite.retrieval.base import Retriever

SPEC_HELP = (
    "bm25 | colbert-server:URL | colbert-index:DIR | dense[:DATASET] | hybrid:interleave|rrf:SPEC+SPEC "
    "(default: bm25)"
)


def build_retriever(
    spec: str,
    *,
    dataset: str | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    **options: Any,
) -> Retriever:
    """Construct the retriever that ``spec`` names.

    Args:
        spec: See the module docstring.
        dataset: Dataset whose corpus the embedded retrievers index.
        data_dir: Dataset root (defaults as in :func:`ragsuite.paths.data_dir`).
        cache_dir: Where built indexes are kept (defaults as in :func:`ragsuite.paths.cache_dir`).
        **options: Passed to the retriever's constructor (``timeout=``, ``retries=`` for servers).
    """
    spec = spec.strip()
    kind, _, rest = spec.partition(":")
    if kind == "bm25":
        corpus_dataset = rest or dataset
        if not corpus_dataset:
            raise ConfigError("the bm25 retriever indexes a dataset's corpus: give --dataset or bm25:DATASET")
        from ragsuite.retrieval.bm25 import BM25Retriever

        return BM25Retriever.from_dataset(corpus_dataset, data_dir=data_dir, cache_dir=cache_dir, **options)
    if kind == "colbert-server":
        if not rest:
            raise ConfigError(
                "colbert-server needs a URL, e.g. colbert-server:http://127.0.0.1:8893/api/search"
            )
        from ragsuite.retrieval.colbert.client import ColBERTv2Client

        return ColBERTv2Client(rest, **options)
    if kind == "colbert-index":
        if not rest:
            raise ConfigError("colbert-index needs the index directory, e.g. colbert-index:/path/to/index")
        from ragsuite.retrieval.colbert.index import ColBERTv2Index

        return ColBERTv2Index.load(rest, **options)
    if kind == "dense":
        corpus_dataset, _, model = rest.partition(":")
        corpus_dataset = corpus_dataset or dataset
        if not corpus_dataset:
            raise ConfigError(
                "the dense retriever embeds a dataset's corpus: give --dataset or dense:DATASET"
            )
        from ragsuite.retrieval.dense import DenseRetriever

        return DenseRetriever.from_dataset(
            corpus_dataset, data_dir=data_dir, cache_dir=cache_dir, model=model or None, **options
        )
    if kind == "hybrid":
        mode, _, members = rest.partition(":")
        if mode not in ("interleave", "rrf") or not members:
            raise ConfigError(
                f"hybrid spec must look like hybrid:interleave:SPEC+SPEC or hybrid:rrf:..., not {spec!r}"
            )
        from ragsuite.retrieval.hybrid import HybridRetriever

        parts = [
            build_retriever(m, dataset=dataset, data_dir=data_dir, cache_dir=cache_dir)
            for m in members.split("+")
        ]
        return HybridRetriever(parts, mode=mode)  # type: ignore[arg-type]
    raise ConfigError(f"unknown retriever spec {spec!r}; expected {SPEC_HELP}")
