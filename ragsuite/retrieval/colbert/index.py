"""A local ColBERTv2 (PLAID) index built and searched with colbert-ai on CPU (the ``colbert`` extra).

Layout of an index directory:
    ragsuite-colbert.json   settings, checkpoint and passage count; written last, so its presence means the
                            build finished
    passages.jsonl          the indexed passages in colbert pid order (colbert pids are ints 0..n-1; this
                            maps them back to corpus ids, titles and texts)
    plaid/                  colbert-ai's index files
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ragsuite.errors import ConfigError, RetrievalError, require
from ragsuite.files import atomic_open, atomic_write_text
from ragsuite.retrieval.base import COLBERT_QUERY_TOKENS, Passage

log = logging.getLogger("ragsuite.retrieval.colbert.index")

MANIFEST = "ragsuite-colbert.json"
PASSAGES = "passages.jsonl"
PLAID = "plaid"
FORMAT_VERSION = 1
# colbert-ai keeps its run configuration in a process-wide stack (Run()), so calls into it are serialized.
_COLBERT_LOCK = threading.RLock()


def _import_colbert() -> Any:
    colbert = require("colbert", extra="colbert", feature="A local ColBERTv2 index")
    from ragsuite.retrieval.colbert.compat import patch_colbert_for_transformers
    from ragsuite.retrieval.colbert.extensions import use_extensions_dir

    patch_colbert_for_transformers()
    # Where `python -m ragsuite.retrieval.colbert.extensions` compiled them, unless TORCH_EXTENSIONS_DIR says.
    use_extensions_dir()
    return colbert


@contextlib.contextmanager
def _colbert_run(root: Path) -> Iterator[None]:
    """colbert-ai's run context: one in-process rank (no fork, no spawn), nothing written to the CWD, and
    colbert's progress chatter moved to stderr so a command's stdout stays clean."""
    from colbert.infra import Run, RunConfig

    with _COLBERT_LOCK, contextlib.redirect_stdout(sys.stderr):
        with Run().context(
            RunConfig(nranks=1, avoid_fork_if_possible=True, root=str(root), experiment="ragsuite")
        ):
            yield


def _resolve_checkpoint(checkpoint: str | os.PathLike[str]) -> str:
    """A local checkpoint becomes an absolute path (colbert-ai would otherwise try the model hub)."""
    path = Path(checkpoint).expanduser()
    if path.exists():
        if not (path / "config.json").is_file() and not str(path).endswith(".dnn"):
            raise ConfigError(f"{path} is not a ColBERT checkpoint directory (no config.json)")
        return str(path.resolve())
    if str(checkpoint).startswith((".", "/", "~")):
        raise ConfigError(f"checkpoint {checkpoint} does not exist")
    return str(checkpoint)  # a model-hub name such as colbert-ir/colbertv2.0


def is_colbert_index(index_dir: str | os.PathLike[str]) -> bool:
    """Whether ``index_dir`` holds a finished ragsuite ColBERT index."""
    return (Path(index_dir).expanduser() / MANIFEST).is_file()


def build_colbert_index(
    corpus: Sequence[Passage],
    *,
    checkpoint: str | os.PathLike[str],
    index_dir: str | os.PathLike[str],
    nbits: int = 2,
    doc_maxlen: int | None = None,
    kmeans_niters: int = 4,
    index_bsize: int = 64,
    overwrite: bool = False,
) -> ColBERTv2Index:
    """Encode ``corpus`` with a ColBERT checkpoint and build a PLAID index in ``index_dir``.

    Args:
        corpus: Passages to index (ids must be unique); each is encoded as ``"title | text"``.
        checkpoint: A ColBERT checkpoint directory (e.g. a downloaded ``colbert-ir/colbertv2.0``) or hub name.
        index_dir: Directory to create.
        nbits: Bits per residual dimension (2 is ColBERTv2's default).
        doc_maxlen: Passage length in tokens (default: the checkpoint's, 180 for colbertv2.0).
        kmeans_niters: k-means iterations for the centroids.
        index_bsize: Encoding batch size.
        overwrite: Replace an index already in ``index_dir`` (otherwise that is an error).

    Returns:
        The loaded index, ready to search.

    Example:
        With the ColBERTv2 checkpoint in ``~/colbertv2.0``:

        >>> from ragsuite.data.datasets import load_corpus
        >>> corpus = load_corpus("hotpotqa")
        >>> index = build_colbert_index(corpus, checkpoint="~/colbertv2.0", index_dir="ix")  # doctest: +SKIP
        >>> index("Who directed Jaws?", 3)  # doctest: +SKIP
    """
    passages = list(corpus)
    if not passages:
        raise ConfigError("cannot build a ColBERT index over an empty corpus")
    ids = [p.id for p in passages]
    if len(set(ids)) != len(ids):
        raise ConfigError("passage ids must be unique to build a ColBERT index")
    if nbits not in (1, 2, 4, 8):
        raise ConfigError(f"nbits must be 1, 2, 4 or 8, not {nbits}")
    root = Path(index_dir).expanduser().resolve()
    if is_colbert_index(root) and not overwrite:
        raise ConfigError(
            f"{root} already holds a ColBERT index; pass overwrite=True (--overwrite) to rebuild"
        )
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{root} exists and is not a directory")
    checkpoint = _resolve_checkpoint(checkpoint)
    _import_colbert()
    from colbert import Indexer
    from colbert.infra import ColBERTConfig

    root.mkdir(parents=True, exist_ok=True)
    (root / MANIFEST).unlink(missing_ok=True)  # the index is incomplete until the manifest is rewritten
    if (root / PLAID).exists():
        shutil.rmtree(root / PLAID)
    settings: dict[str, Any] = {"nbits": nbits, "kmeans_niters": kmeans_niters, "index_bsize": index_bsize}
    if doc_maxlen is not None:
        settings["doc_maxlen"] = doc_maxlen
    started = time.perf_counter()
    try:
        with _colbert_run(root):
            config = ColBERTConfig(index_path=str(root / PLAID), **settings)
            indexer = Indexer(checkpoint=checkpoint, config=config, verbose=1)
            indexer.index(
                name=PLAID, collection=[p.render() for p in passages], overwrite="force_silent_overwrite"
            )
    except (OSError, RuntimeError, ValueError, AssertionError) as exc:
        raise RetrievalError(
            f"building the ColBERT index in {root} failed: {type(exc).__name__}: {exc}"
        ) from exc
    seconds = time.perf_counter() - started
    with atomic_open(root / PASSAGES) as handle:
        for p in passages:
            handle.write(
                json.dumps({"id": p.id, "title": p.title, "text": p.text}, ensure_ascii=False) + "\n"
            )
    manifest = {
        "format": FORMAT_VERSION,
        "kind": "colbert-index",
        "checkpoint": checkpoint,
        "n_passages": len(passages),
        "build_seconds": round(seconds, 2),
        **settings,
    }
    atomic_write_text(root / MANIFEST, json.dumps(manifest, indent=2))
    log.info("indexed %d passages into %s in %.1fs", len(passages), root, seconds)
    # Opened from the passages already in memory: no second read of the corpus it just wrote.
    return ColBERTv2Index._open(root, manifest, passages, checkpoint=checkpoint)


class ColBERTv2Index:
    """Search a local ColBERT PLAID index with colbert-ai's Searcher. Thread-safe (searches are serialized).

    Use :meth:`load` or :func:`build_colbert_index` rather than the constructor.

    Example:
        >>> index = ColBERTv2Index.load("~/indexes/hotpotqa")  # doctest: +SKIP
        >>> [p.title for p in index("Who directed Jaws?", 3)]  # doctest: +SKIP
    """

    def __init__(
        self, index_dir: Path, manifest: dict[str, Any], passages: list[Passage], searcher: Any
    ) -> None:
        self.index_dir = index_dir
        self.manifest = manifest
        self.passages = passages
        self._searcher = searcher

    @property
    def query_token_limit(self) -> int:
        """Query tokens the checkpoint's encoder reads (its ``query_maxlen``)."""
        config = getattr(self._searcher, "config", None)
        return int(getattr(config, "query_maxlen", None) or COLBERT_QUERY_TOKENS)

    @classmethod
    def load(
        cls,
        index_dir: str | os.PathLike[str],
        *,
        checkpoint: str | os.PathLike[str] | None = None,
        ncells: int | None = None,
        centroid_score_threshold: float | None = None,
        ndocs: int | None = None,
    ) -> ColBERTv2Index:
        """Open an index built by :func:`build_colbert_index`.

        Args:
            index_dir: The index directory.
            checkpoint: Use this checkpoint instead of the one recorded at build time (e.g. after moving it).
            ncells: PLAID search knob: centroids probed per query token (colbert-ai picks by k when None).
            centroid_score_threshold: PLAID centroid pruning threshold (None: colbert-ai's choice by k).
            ndocs: PLAID candidate documents (None: colbert-ai's choice by k).

        Raises:
            ConfigError: There is no finished index in ``index_dir``.
            RetrievalError: The index files are corrupt or do not match the checkpoint.
        """
        root = Path(index_dir).expanduser().resolve()
        if not root.is_dir():
            raise ConfigError(
                f"no ColBERT index at {root}: build one with `ragsuite index --retriever colbert "
                "--checkpoint PATH --dataset NAME` or build_colbert_index()"
            )
        if not is_colbert_index(root):
            raise ConfigError(f"{root} holds no finished ColBERT index ({MANIFEST} is missing); rebuild it")
        try:
            manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
            if not isinstance(manifest, dict):
                raise ValueError(f"{MANIFEST} holds {type(manifest).__name__}, not an object")
            if manifest.get("format") != FORMAT_VERSION:
                raise ValueError(f"unsupported index format {manifest.get('format')!r}")
            with (root / PASSAGES).open(encoding="utf-8") as handle:
                passages = [Passage.from_dict(json.loads(line)) for line in handle if line.strip()]
        except (OSError, ValueError, KeyError) as exc:
            raise RetrievalError(f"ColBERT index {root} is corrupt: {type(exc).__name__}: {exc}") from exc
        if len(passages) != manifest.get("n_passages"):
            raise RetrievalError(
                f"ColBERT index {root} is corrupt: {PASSAGES} lists {len(passages)} passages, "
                f"the manifest says {manifest.get('n_passages')}"
            )
        plaid = root / PLAID
        if not (plaid / "metadata.json").is_file():
            raise RetrievalError(f"ColBERT index {root} is corrupt: {plaid}/metadata.json is missing")
        ckpt = _resolve_checkpoint(checkpoint) if checkpoint is not None else manifest["checkpoint"]
        if checkpoint is None and ckpt.startswith("/") and not Path(ckpt).exists():
            raise ConfigError(
                f"the checkpoint this index was built with ({ckpt}) is gone; "
                "pass checkpoint= (or --checkpoint) to use another copy"
            )
        return cls._open(
            root,
            manifest,
            passages,
            checkpoint=ckpt,
            ncells=ncells,
            centroid_score_threshold=centroid_score_threshold,
            ndocs=ndocs,
        )

    @classmethod
    def _open(
        cls,
        root: Path,
        manifest: dict[str, Any],
        passages: list[Passage],
        *,
        checkpoint: str,
        ncells: int | None = None,
        centroid_score_threshold: float | None = None,
        ndocs: int | None = None,
    ) -> ColBERTv2Index:
        """Start colbert-ai's Searcher over a checked index directory and its passages."""
        ckpt, plaid = checkpoint, root / PLAID
        _import_colbert()
        from colbert import Searcher
        from colbert.infra import ColBERTConfig

        try:
            with _colbert_run(root):
                config = ColBERTConfig(
                    ncells=ncells, centroid_score_threshold=centroid_score_threshold, ndocs=ndocs
                )
                searcher = Searcher(
                    index=str(plaid),
                    index_root="/",
                    checkpoint=ckpt,
                    collection=[p.render() for p in passages],
                    config=config,
                    verbose=1,
                )
        except Exception as exc:  # colbert-ai raises bare asserts, EOFErrors, pickle errors on damaged files
            raise RetrievalError(f"cannot open ColBERT index {root}: {type(exc).__name__}: {exc}") from exc
        index = cls(root, {**manifest, "checkpoint": ckpt}, passages, searcher)
        index._knobs = {
            "ncells": ncells,
            "centroid_score_threshold": centroid_score_threshold,
            "ndocs": ndocs,
        }
        return index

    def _check(self, query: str, k: int) -> None:
        if not isinstance(query, str) or not query.strip():
            raise ConfigError(f"a ColBERT query must be a non-empty string, not {query!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"k must be a positive integer, not {k!r}")

    def _ranked(self, Q: Any, k: int) -> list[Passage]:
        # colbert-ai fixes ncells/ndocs from the first k it sees; reset them so every k gets its own policy.
        self._searcher.configure(**self._knobs)
        pids, _ranks, scores = self._searcher.dense_search(Q, min(k, len(self.passages)))
        return [
            self.passages[int(pid)].with_score(float(score)) for pid, score in zip(pids, scores, strict=True)
        ]

    def __call__(self, query: str, k: int) -> list[Passage]:
        self._check(query, k)
        try:
            with _colbert_run(self.index_dir):
                Q = self._searcher.encode(query)
                return self._ranked(Q[0:1], k)
        except (ConfigError, RetrievalError):
            raise
        except Exception as exc:
            raise RetrievalError(
                f"ColBERT search in {self.index_dir} failed: {type(exc).__name__}: {exc}"
            ) from exc

    def batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        queries = list(queries)
        for query in queries:
            self._check(query, k)
        if not queries:
            return []
        try:
            with _colbert_run(self.index_dir):
                Q = self._searcher.encode(queries)  # one encoder pass for all queries
                return [self._ranked(Q[i : i + 1], k) for i in range(len(queries))]
        except Exception as exc:
            raise RetrievalError(
                f"ColBERT search in {self.index_dir} failed: {type(exc).__name__}: {exc}"
            ) from exc

    def score(self, query: str, passages: Sequence[Passage]) -> list[float]:
        """Late-interaction (MaxSim) scores of ``passages`` for ``query`` with the index's checkpoint: the
        sum over query tokens of the best dot product with any document token. The passages need not be in
        the index, so this reranks any candidate pool (a :class:`~ragsuite.retrieval.base.Reranker`)."""
        self._check(query, 1)
        passages = list(passages)
        if not passages:
            return []
        try:
            with _colbert_run(self.index_dir):
                Q = self._searcher.encode(query)[0]  # (query tokens, dim)
                D = self._searcher.checkpoint.docFromText([p.render() for p in passages], bsize=64)[0]
                token_scores = D.float() @ Q.float().T  # (docs, doc tokens, query tokens)
                # docFromText zeroes padding and punctuation tokens: they must never be a token's best match.
                padding = D.abs().sum(dim=-1) == 0
                token_scores[padding] = float("-inf")
                return [float(s) for s in token_scores.max(dim=1).values.sum(dim=-1)]
        except (ConfigError, RetrievalError):
            raise
        except Exception as exc:
            raise RetrievalError(
                f"ColBERT scoring with {self.index_dir} failed: {type(exc).__name__}: {exc}"
            ) from exc

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "colbert-index",
            "spec": f"colbert-index:{self.index_dir}",
            "index_dir": str(self.index_dir),
            "checkpoint": self.manifest.get("checkpoint"),
            "n_passages": len(self.passages),
            "nbits": self.manifest.get("nbits"),
            "doc_maxlen": self.manifest.get("doc_maxlen"),
        }

    def __len__(self) -> int:
        return len(self.passages)

    def __repr__(self) -> str:
        return f"ColBERTv2Index({str(self.index_dir)!r}, {len(self.passages)} passages)"
