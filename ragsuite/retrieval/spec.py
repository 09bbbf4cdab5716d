"""Build a retriever from a command-line spec.

Specs:
    bm25[:DATASET|:PATH]         the embedded BM25 index of ``--corpus`` or of ``--dataset``'s corpus, of
                                 DATASET's corpus (TriviaQA ships no corpus: ``bm25:nq``) or of a corpus
                                 file; built once, cached on disk under a hash of the corpus content
    colbert-server:URL           a ColBERTv2 HTTP server (``/api/search`` protocol)
    colbert-index:DIR            a local colbert-ai PLAID index (``pip install -e '.[colbert]'``)
    dense[:DATASET|:PATH[:MODEL_DIR]][:KEY=VALUE...]
                                 MiniLM (or MODEL_DIR) embeddings of a corpus as for bm25, cached on disk,
                                 searched with FAISS (``pip install -e '.[dense]'``); KEY=VALUE options set
                                 the index: ``index=auto|flat|ivfpq|hnsw``, ``flat_max``, ``nlist``,
                                 ``nprobe``, ``pq_m``, ``pq_bits``, ``rerank``, ``hnsw_m``,
                                 ``ef_construction``, ``ef_search``
                                 (e.g. ``dense:nq:index=hnsw:ef_search=128``)
    hybrid:MODE:SPEC[@W]+SPEC[@W][+...][:KEY=VALUE...]
                                 several of the above merged, MODE = interleave | rrf | linear; ``@W`` a
                                 member's weight (rrf, linear), KEY = ``alpha`` (two members weighed
                                 ``1 - alpha`` and ``alpha``), ``rrf_k``, ``norm`` (linear: ``minmax`` or
                                 ``zscore``), ``depth`` (e.g. ``hybrid:linear:bm25+dense:alpha=0.7``)

A corpus PATH contains ``/`` or ends in ``.jsonl``, ``.tsv``, ``.csv`` or ``.parquet``; anything else is a
dataset name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ragsuite.errors import ConfigError, DataError
from ragsuite.retrieval.base import Retriever

SPEC_HELP = (
    "bm25[:DATASET|:CORPUS_FILE] | colbert-server:URL | colbert-index:DIR | "
    "dense[:DATASET|:CORPUS_FILE][:KEY=VALUE...] | "
    "hybrid:interleave|rrf|linear:SPEC[@W]+SPEC[@W][:alpha=A:rrf_k=K:norm=minmax|zscore:depth=D] "
    "(default: bm25 over --corpus or the dataset's corpus)"
)
_CORPUS_SUFFIXES = (".jsonl", ".tsv", ".csv", ".parquet")


def is_corpus_path(source: str) -> bool:
    """Whether ``source`` (what follows ``bm25:`` / ``dense:``) names a corpus file rather than a dataset."""
    return "/" in source or os.sep in source or source.lower().endswith(_CORPUS_SUFFIXES)


def parse_dense_spec(rest: str) -> tuple[str, str, dict[str, str]]:
    """What follows ``dense:``, split into (source, model directory, ``KEY=VALUE`` index options).

    Parts are separated by ``:``; a part that starts with ``word=`` is an option, the first other part is the
    dataset or corpus file (may be empty) and the remaining ones, joined back with ``:``, the model directory.

    Example:
        >>> parse_dense_spec("nq:index=ivfpq:nprobe=32")
        ('nq', '', {'index': 'ivfpq', 'nprobe': '32'})
    """
    named: list[str] = []
    options: dict[str, str] = {}
    for part in rest.split(":") if rest else []:
        key, eq, value = part.partition("=")
        if eq and key.isidentifier() and key.islower():
            if key in options:
                raise ConfigError(f"dense option {key} given twice in dense:{rest}")
            options[key] = value
        else:
            named.append(part)
    source = named[0] if named else ""
    return source, ":".join(named[1:]), options


def build_retriever(
    spec: str,
    *,
    dataset: str | None = None,
    corpus: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = False,
    **options: Any,
) -> Retriever:
    """Construct the retriever that ``spec`` names.

    Args:
        spec: See the module docstring.
        dataset: Dataset whose corpus the embedded retrievers index.
        corpus: A corpus file the embedded retrievers index instead of ``dataset``'s (``--corpus``).
        data_dir: Dataset root (defaults as in :func:`ragsuite.paths.data_dir`).
        cache_dir: Where built indexes are kept (defaults as in :func:`ragsuite.paths.cache_dir`).
        progress: Show a progress bar while an embedded index is built (BM25 indexing, dense embedding).
        **options: Passed to the retriever's constructor (``timeout=``, ``retries=`` for servers).
    """
    spec = spec.strip()
    kind, _, rest = spec.partition(":")
    if kind == "bm25":
        from ragsuite.retrieval.bm25 import BM25Retriever

        source = rest or (str(corpus) if corpus is not None else dataset)
        if not source:
            raise ConfigError(
                "the bm25 retriever indexes a corpus: give --corpus FILE, --dataset NAME, bm25:DATASET or "
                "bm25:PATH"
            )
        if (rest == "" and corpus is not None) or is_corpus_path(source):
            return BM25Retriever.from_file(source, cache_dir=cache_dir, progress=progress, **options)
        return BM25Retriever.from_dataset(
            source, data_dir=data_dir, cache_dir=cache_dir, progress=progress, **options
        )
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
        from ragsuite.retrieval.dense import DenseRetriever

        named, model, index_options = parse_dense_spec(rest)
        overlap = sorted(set(index_options) & set(options))
        if overlap:
            raise ConfigError(
                f"dense index option(s) {', '.join(overlap)} given both in the spec and as arguments"
            )
        options = {**options, **index_options}
        source = named or (str(corpus) if corpus is not None else dataset)
        if not source:
            raise ConfigError(
                "the dense retriever embeds a corpus: give --corpus FILE, --dataset NAME, dense:DATASET or "
                "dense:PATH"
            )
        if (named == "" and corpus is not None) or is_corpus_path(source):
            return DenseRetriever.from_file(
                source, cache_dir=cache_dir, model=model or None, progress=progress, **options
            )
        return DenseRetriever.from_dataset(
            source, data_dir=data_dir, cache_dir=cache_dir, model=model or None, progress=progress, **options
        )
    if kind == "hybrid":
        from ragsuite.retrieval.hybrid import HybridRetriever, parse_hybrid_spec

        mode, members, weights, settings = parse_hybrid_spec(spec)
        parts = [
            build_retriever(
                m, dataset=dataset, corpus=corpus, data_dir=data_dir, cache_dir=cache_dir, progress=progress
            )
            for m in members
        ]
        return HybridRetriever(parts, mode=mode, weights=weights, **settings)  # type: ignore[arg-type]
    raise ConfigError(f"unknown retriever spec {spec!r}; expected {SPEC_HELP}")


def rebuild_retriever(
    description: Mapping[str, Any],
    *,
    data_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    corpus: str | os.PathLike[str] | None = None,
) -> Retriever:
    """Rebuild a saved retriever from its :meth:`describe` output (what a program file keeps).

    A retriever is rebuilt only from the same corpus content (a hybrid's members included): a dataset's
    corpus is looked up by name under ``data_dir`` (the data root of the machine loading it, not the one it
    was saved on) and its sha256 must match the saved ``corpus_sha256``; a corpus file's must match the
    file at ``corpus_path``.

    Args:
        description: The saved description.
        data_dir: Dataset root (defaults as in :func:`ragsuite.paths.data_dir`: ``$RAGSUITE_DATA``, ...).
        cache_dir: Where the rebuilt index is kept (defaults as in :func:`ragsuite.paths.cache_dir`).
        corpus: Where a saved corpus file is now (another machine, another folder): it stands for every
            saved corpus file with the same sha256.

    Raises:
        ConfigError: no spec; a dataset corpus missing under the data root or with other content (a hash
            mismatch); a corpus file moved, vanished or changed since the program was saved.
    """
    spec = description.get("spec")
    if not isinstance(spec, str) or not spec:
        raise ConfigError("the saved retriever has no spec to rebuild it from")
    if corpus is not None:
        description = _moved_corpus(description, Path(corpus).expanduser().resolve())
        spec = description["spec"]
    _check_corpus(description, data_dir)
    if description.get("kind") == "hybrid":
        spec = _saved_hybrid_spec(spec, description)
    settings = {k: description[k] for k in _BM25_SETTINGS if k in description}
    options = settings if description.get("kind") == "bm25" else {}
    retriever = build_retriever(spec, data_dir=data_dir, cache_dir=cache_dir, **options)
    differing = _differing_settings(description, retriever.describe())
    if differing:
        raise ConfigError(
            f"its settings {differing} cannot be rebuilt from the spec {spec!r} (a hybrid member's); build "
            "the retriever yourself and pass retriever="
        )
    return retriever


#: The scoring settings a BM25 description records; rebuilding with others would score differently.
_BM25_SETTINGS = (
    "method",
    "k1",
    "b",
    "delta",
    "title_weight",
    "stopwords",
    "stemmer",
    "fold_accents",
    "token_pattern",
)


#: A hybrid's merge settings; its spec carries them, and a rebuild must find them unchanged.
_HYBRID_SETTINGS = ("weights", "rrf_k", "norm", "depth")


def _saved_hybrid_spec(spec: str, description: Mapping[str, Any]) -> str:
    """The spec that rebuilds a saved hybrid as it ran, whatever today's defaults: its saved weights and
    settings written out where they differ from them (a spec omits the defaults of its day, and the fitted
    defaults change as they are refitted). A hybrid saved before specs carried weights weighed every member
    1 and kept only ``rrf_k`` and ``depth`` in its description."""
    from ragsuite.retrieval.hybrid import format_hybrid_spec, parse_hybrid_spec
    from ragsuite.retrieval.merge import NORMS

    mode, members, weights, settings = parse_hybrid_spec(spec)
    saved = description.get("weights")
    if mode != "interleave" and _numbers(saved, len(members)):
        weights = [float(w) for w in saved]
    elif mode != "interleave" and "weights" not in description:
        weights = weights or [1.0] * len(members)
    # Only well-formed values go into the spec; others stay out and the rebuild's check names them.
    for key, valid in (("rrf_k", _count), ("depth", _count), ("norm", lambda v: v in NORMS)):
        if valid(description.get(key)):
            settings.setdefault(key, description[key])
    kinds = [m.get("kind") for m in description.get("members") or [] if isinstance(m, Mapping)]
    return format_hybrid_spec(mode, members, weights=weights, kinds=kinds, **settings)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _numbers(value: Any, n: int) -> bool:
    return (
        isinstance(value, list)
        and len(value) == n
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    )


def _moved_corpus(description: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """``description`` with ``path`` in place of every saved corpus file of the same sha256."""
    from ragsuite.data.datasets import file_sha256_cached

    if not path.is_file():
        raise ConfigError(f"corpus={path} does not exist")
    found = file_sha256_cached(path)
    saved: list[str] = []

    def move(node: Mapping[str, Any]) -> dict[str, Any]:
        node = dict(node)
        if isinstance(node.get("members"), list):
            node["members"] = [move(m) if isinstance(m, Mapping) else m for m in node["members"]]
            if node.get("kind") == "hybrid" and all(isinstance(m, Mapping) for m in node["members"]):
                from ragsuite.retrieval.hybrid import format_hybrid_spec, parse_hybrid_spec

                mode, _, weights, settings = parse_hybrid_spec(str(node["spec"]))
                node["spec"] = format_hybrid_spec(
                    mode,
                    [str(m["spec"]) for m in node["members"]],
                    weights=weights,
                    kinds=[m.get("kind") for m in node["members"]],
                    **settings,
                )
        if node.get("corpus_path"):
            saved.append(str(node.get("corpus_sha256")))
            if node.get("corpus_sha256") == found:
                node["corpus_path"] = str(path)
                node["spec"] = f"{node.get('kind', 'bm25')}:{path}"
        return node

    moved = move(description)
    if not saved:
        raise ConfigError(
            "corpus= names a corpus file, but the saved retriever is over a dataset's corpus; point "
            "data_dir= (RAGSUITE_DATA) at the data instead"
        )
    if found not in saved:
        hashes = " and ".join(h[:12] + "..." for h in dict.fromkeys(saved))
        raise ConfigError(
            f"corpus hash mismatch: {path} has sha256 {found[:12]}..., but the program was saved on a corpus "
            f"with sha256 {hashes}; pass the file it was saved on, or a retriever over this one (retriever=) "
            "to accept the change"
        )
    return moved


def _differing_settings(saved: Mapping[str, Any], rebuilt: Mapping[str, Any]) -> dict[str, Any]:
    """The saved BM25 settings (a hybrid's members' included) the rebuilt retriever does not have."""
    keys = (*_BM25_SETTINGS, *_HYBRID_SETTINGS)
    differing = {k: saved[k] for k in keys if k in saved and rebuilt.get(k) != saved[k]}
    for before, after in zip(saved.get("members") or [], rebuilt.get("members") or [], strict=False):
        if isinstance(before, Mapping) and isinstance(after, Mapping):
            differing.update(_differing_settings(before, after))
    return differing


def _check_corpus(description: Mapping[str, Any], data_dir: str | os.PathLike[str] | None) -> None:
    for member in description.get("members") or []:
        if isinstance(member, Mapping):
            _check_corpus(member, data_dir)
    saved_path, saved_hash = description.get("corpus_path"), description.get("corpus_sha256")
    dataset = description.get("dataset")
    if not saved_path and dataset and saved_hash:
        _check_dataset_corpus(str(dataset), str(saved_hash), data_dir)
    if not saved_path:
        return
    from ragsuite.data.datasets import file_sha256_cached

    path = Path(saved_path)
    if not path.is_file():
        raise ConfigError(
            f"the corpus file {path} it was built on no longer exists (moved or deleted); put it back, or "
            "name its new location (ragsuite.load(path, corpus=NEW_PATH); CLI: --retriever bm25:NEW_PATH)"
        )
    if saved_hash and file_sha256_cached(path) != saved_hash:
        raise ConfigError(
            f"the corpus file {path} changed since the program was saved (sha256 {saved_hash[:12]}... "
            "expected); restore it, or pass a retriever over the new content explicitly "
            "(CLI: --retriever bm25:PATH) to accept the change"
        )


def _check_dataset_corpus(dataset: str, saved_hash: str, data_dir: str | os.PathLike[str] | None) -> None:
    """The dataset's corpus under ``data_dir`` must be the one the program was saved on."""
    from ragsuite.data.datasets import corpus_path, file_sha256_cached

    where = f"data_dir={data_dir}" if data_dir is not None else "RAGSUITE_DATA (or the default data root)"
    try:
        path = corpus_path(dataset, data_dir)
    except DataError as exc:
        raise ConfigError(
            f"the {dataset} corpus it was built on is not under {where} ({exc}); point data_dir= "
            "(RAGSUITE_DATA, --data-dir) at a copy of that data, or pass retriever="
        ) from None
    found = file_sha256_cached(path)
    if found != saved_hash:
        raise ConfigError(
            f"corpus hash mismatch: {path} has sha256 {found[:12]}..., but the program was saved on a "
            f"{dataset} corpus with sha256 {saved_hash[:12]}...; point data_dir= (RAGSUITE_DATA, --data-dir) "
            "at the data it was saved with, or pass a retriever over this corpus explicitly (retriever=, "
            "CLI: --retriever) to accept the change"
        )
