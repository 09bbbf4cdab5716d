"""The embedded default retriever: BM25 (bm25s) over passage title + text, cached on disk.

Defaults, and why
-----------------
The settings were chosen on the dev splits of all six datasets that ship a corpus, as ONE configuration for
all of them (no per-dataset tuning: the dev splits are small, 48-497 questions, and per-dataset choices would
overfit them). The reference is plain bm25s: Snowball English stemmer, bm25s' English stopwords, the title and
text joined by a space, ``method="lucene"``, ``k1=1.5``, ``b=0.75``.

* ``title_weight=3`` (the title is indexed three times before the text). Multi-hop and entity questions name
  the entity whose page holds the answer; weighting the title lifted recall@5 on every dataset (mean +2.9
  points at weight 3; 2 gave +2.0, 4 gave +3.0 — we kept the middle of the plateau rather than the maximum).
* ``fold_accents=True``: questions often spell names without diacritics ("Pokemon", "Dvorak"); folding both
  sides to ASCII-like forms added recall on MuSiQue and harmed nothing.
* ``method="lucene"``, ``k1=1.5``, ``b=0.75`` kept: with the title weighted, k1/b grids, ATIRE, BM25+, BM25L
  moved the mean by less than a point in either direction and no variant was better on every dataset.
* Rejected: the larger NLTK-style stopword list (loses on MuSiQue and StrategyQA), no stopwords, Porter
  instead of Snowball, keeping one-character tokens, removing question words from queries (all within noise
  or worse on some dataset).

recall@5 on the dev splits, plain bm25s -> this default: hotpotqa .775 -> .790, 2wikimultihopqa .688 -> .705,
musique .491 -> .539, strategyqa .714 -> .751, asqa .761 -> .805, nq .920 -> .940
(``python benchmarks/retrieval.py`` reproduces them with the speed comparison).

The index is built and served by :mod:`ragsuite.retrieval.bm25_index`: a streaming build whose memory does
not grow with the corpus (shards sorted on disk, then merged), resumable after a kill, with the weights bm25s
itself would store; served from memory-mapped files, so opening a 21M-passage index reads a few KB. A query
adds the weights of its terms' postings into a reusable score buffer and ranks only the blocks of passages it
touched, so its cost follows the postings it reads, not the corpus size
(:mod:`ragsuite.retrieval.bm25_kernel`).
"""

from __future__ import annotations

import collections
import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.util
import itertools
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import unicodedata
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np

from ragsuite.errors import ConfigError, DataError, RetrievalError
from ragsuite.paths import cache_dir as resolve_cache_dir
from ragsuite.retrieval import bm25_kernel
from ragsuite.retrieval.base import Passage
from ragsuite.retrieval.bm25_index import (
    DEFAULT_BLOCK_POSTINGS,
    DEFAULT_SHARD_PASSAGES,
    FORMAT_VERSION,
    DuplicateIdError,
    IndexBuilder,
    IndexDamaged,
    OpenIndex,
    Scoring,
    index_bytes,
)
from ragsuite.retrieval.bm25_kernel import Rankings

log = logging.getLogger("ragsuite.retrieval.bm25")

Method = Literal["lucene", "robertson", "atire", "bm25l", "bm25+"]
StopwordList = Literal["en", "en_plus", "none"]

_STEM_CACHE_LIMIT = 500_000
_WORD_MEMO_LIMIT = 500_000


@functools.cache
def _bm25s_version() -> str:
    """bm25s' version, from its package metadata (importing bm25s costs ~0.5 s: it imports scipy and numba
    when they are installed)."""
    return importlib.metadata.version("bm25s")


@functools.cache
def _stopword_lists() -> dict[str, tuple[str, ...]]:
    """bm25s' stopword lists, read from its ``stopwords`` module file alone (not through the package, see
    :func:`_bm25s_version`)."""
    spec = importlib.util.find_spec("bm25s")
    locations = list(spec.submodule_search_locations or []) if spec else []
    path = Path(locations[0]) / "stopwords.py" if locations else None
    if path is None or not path.is_file():
        from bm25s.stopwords import STOPWORDS_EN, STOPWORDS_EN_PLUS
    else:
        module_spec = importlib.util.spec_from_file_location("_ragsuite_bm25s_stopwords", path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        STOPWORDS_EN, STOPWORDS_EN_PLUS = module.STOPWORDS_EN, module.STOPWORDS_EN_PLUS
    return {"en": tuple(STOPWORDS_EN), "en_plus": tuple(STOPWORDS_EN_PLUS), "none": ()}


_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_FOLDED: dict[str, str] = {}


def _fold_char(match: re.Match[str]) -> str:
    char = match.group()
    folded = _FOLDED.get(char)
    if folded is None:
        folded = "".join(c for c in unicodedata.normalize("NFKD", char) if not unicodedata.combining(c))
        _FOLDED[char] = folded
    return folded


def _fold(text: str) -> str:
    """Drop diacritics ("Dvořák" -> "Dvorak"); ASCII text is returned as is, cheaply.

    The same as NFKD-normalizing the whole text and dropping combining marks (NFKD decomposes character by
    character; its reordering only moves combining marks, which are dropped), but done per distinct
    non-ASCII character, memoized, so long texts with a few accents cost little.
    """
    if text.isascii():
        return text
    return _NON_ASCII.sub(_fold_char, text)


class _Tokenizer:
    """Lowercase, split, drop stopwords, stem. Safe to call from several threads.

    PyStemmer's ``Stemmer`` objects are not thread-safe, so each thread gets its own; stems are memoized in a
    shared dict (single get/set operations on a dict are atomic in CPython).
    """

    def __init__(
        self, *, token_pattern: str, stopwords: StopwordList, stemmer: str | None, fold_accents: bool
    ):
        try:
            self._split = re.compile(token_pattern).findall
        except re.error as exc:
            raise ConfigError(f"invalid token_pattern {token_pattern!r}: {exc}") from None
        lists = _stopword_lists()
        if stopwords not in lists:
            raise ConfigError(f"stopwords must be one of {', '.join(lists)}, not {stopwords!r}")
        self.stopwords = frozenset(lists[stopwords])
        self._stemmer_name = stemmer
        self._fold_accents = fold_accents
        self._local = threading.local()
        self._cache: dict[str, str] = {}
        if stemmer is not None:
            self._stemmer()  # fail early on an unknown language

    def _stemmer(self) -> Any:
        stemmer = getattr(self._local, "stemmer", None)
        if stemmer is None:
            import Stemmer

            try:
                stemmer = Stemmer.Stemmer(self._stemmer_name)
            except KeyError:
                raise ConfigError(
                    f"unknown stemmer {self._stemmer_name!r}; see Stemmer.algorithms()"
                ) from None
            self._local.stemmer = stemmer
        return stemmer

    def split(self, text: str) -> list[str]:
        """Lowercased, accent-folded words, stopwords included, not stemmed."""
        if self._fold_accents:
            text = _fold(text)
        return self._split(text.lower())

    def words(self, text: str) -> list[str]:
        """Lowercased, accent-folded words minus stopwords, not stemmed."""
        stop = self.stopwords
        return [w for w in self.split(text) if w not in stop]

    def stem_all(self, words: Iterable[str]) -> dict[str, str]:
        """Stems of many distinct words at once (one PyStemmer call)."""
        unique = list(dict.fromkeys(words))
        if self._stemmer_name is None:
            return {w: w for w in unique}
        return dict(zip(unique, self._stemmer().stemWords(unique), strict=True))

    def __call__(self, text: str) -> list[str]:
        words = self.words(text)
        if self._stemmer_name is None:
            return words
        cache = self._cache
        missing = [w for w in words if w not in cache]
        if missing:
            stems = self.stem_all(missing)
            if len(cache) < _STEM_CACHE_LIMIT:
                cache.update(stems)
            return [cache.get(w) or stems[w] for w in words]
        return [cache[w] for w in words]


@dataclass(frozen=True)
class _CorpusSource:
    """Where an index's passages come from: a stream from the start, a content digest, a size if known."""

    stream: Callable[[], Iterator[Passage]]
    digest: str
    total: Callable[[], int | None]
    on_duplicate: Callable[[DuplicateIdError], Exception]


def _passages_digest(passages: Sequence[Passage]) -> str:
    digest = hashlib.sha256()
    for p in passages:
        digest.update(f"{p.id}\x00{p.title}\x00{p.text}\x01".encode("utf-8", "surrogatepass"))
    return "passages:" + digest.hexdigest()


class BM25Retriever:
    """BM25 over ``title + text``, built once per corpus and settings into an on-disk index and served from it
    memory-mapped.

    The index lives in ``<cache_dir>/bm25/<index_key>``, where the key hashes the corpus content (a corpus
    file's sha256, remembered while the file is unchanged, so a large file is not read again to open its
    index), the settings and the bm25s version; a later instance with the same corpus and settings opens it
    instead of rebuilding. A killed build resumes where it stopped. Instances are safe to query from many
    threads at once.

    Args:
        passages: The corpus, in memory (see :meth:`from_file` and :meth:`from_dataset` to stream one from
            disk). Returned passages have the same ``id``, ``title`` and ``text``, with ``score`` set.
        cache_dir: Root of ragsuite's caches (default :func:`ragsuite.paths.cache_dir`).
        method: bm25s scoring variant.
        k1: Term-frequency saturation.
        b: Length normalization.
        delta: The BM25L / BM25+ delta (ignored by the other methods).
        title_weight: How many times the title is indexed before the text (0 drops titles).
        stopwords: ``"en"`` (bm25s' English list), ``"en_plus"`` (the larger NLTK-style list) or ``"none"``.
        stemmer: A PyStemmer language (``"english"``, ``"porter"``, ...) or ``None`` for no stemming.
        fold_accents: Strip diacritics from corpus and queries.
        token_pattern: Regex whose matches are the tokens (lowercased text).
        dataset: Name of the dataset the corpus belongs to; makes :meth:`describe`'s spec ``bm25:<dataset>``.
        corpus_file: ``{"corpus_path", "corpus_sha256"}`` of the file the corpus was read from (see
            :meth:`from_file`); makes the spec ``bm25:<path>``.
        persist: Save the built index to (and open it from) the cache directory; ``False`` builds it in a
            temporary directory removed with the instance.
        progress: Show a progress bar while building (passages/s and ETA).
        verify: Check the sha256 of every index file on opening (by default only sizes are checked, and the
            sha256 of files whose mtime changed since they were written).
        shard_passages: Passages tokenized per shard during a build (bounds its memory).
        block_postings: Postings weighted per merge block during a build (bounds its memory).

    Example:
        >>> corpus = [
        ...     Passage("p1", "Stettin", "Stettin is a port city on the Oder."),
        ...     Passage("p2", "Oder", "The Oder is a river in Central Europe."),
        ...     Passage("p3", "Baltic Sea", "An arm of the Atlantic."),
        ... ]
        >>> retriever = BM25Retriever(corpus, persist=False)
        >>> [p.id for p in retriever("Which river flows through Stettin?", k=2)]
        ['p1', 'p2']
        >>> hotpotqa = BM25Retriever.from_dataset("hotpotqa")  # cached under ragsuite.paths.cache_dir()
    """

    def __init__(
        self,
        passages: Iterable[Passage] | None = None,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        method: Method = "lucene",
        k1: float = 1.5,
        b: float = 0.75,
        delta: float = 0.5,
        title_weight: int = 3,
        stopwords: StopwordList = "en",
        stemmer: str | None = "english",
        fold_accents: bool = True,
        token_pattern: str = r"(?u)\b\w\w+\b",
        dataset: str | None = None,
        corpus_file: Mapping[str, str] | None = None,
        persist: bool = True,
        progress: bool = False,
        verify: bool = False,
        shard_passages: int = DEFAULT_SHARD_PASSAGES,
        block_postings: int = DEFAULT_BLOCK_POSTINGS,
        _source: _CorpusSource | None = None,
    ) -> None:
        if method not in ("lucene", "robertson", "atire", "bm25l", "bm25+"):
            raise ConfigError(f"unknown BM25 method {method!r}")
        if k1 < 0 or not 0 <= b <= 1:
            raise ConfigError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        if title_weight < 0 or int(title_weight) != title_weight:
            raise ConfigError(f"title_weight must be a non-negative integer, got {title_weight!r}")
        if shard_passages < 1 or block_postings < 1:
            raise ConfigError("shard_passages and block_postings must be positive integers")
        if _source is None:
            if passages is None:
                raise ConfigError("give the passages, or use BM25Retriever.from_file / from_dataset")
            in_memory = list(passages)
            if not in_memory:
                raise ConfigError("cannot build a BM25 index over an empty corpus")
            _source = _CorpusSource(
                stream=lambda: iter(in_memory),
                digest=_passages_digest(in_memory),
                total=lambda: len(in_memory),
                on_duplicate=lambda exc: ConfigError(str(exc)),
            )
        self.settings: dict[str, Any] = {
            "method": method,
            "k1": float(k1),
            "b": float(b),
            "delta": float(delta),
            "title_weight": int(title_weight),
            "stopwords": stopwords,
            "stemmer": stemmer,
            "fold_accents": bool(fold_accents),
            "token_pattern": token_pattern,
        }
        self.dataset = dataset
        self.corpus_file = dict(corpus_file) if corpus_file else None
        # The content hash of a corpus read from a file (a dataset's corpus.jsonl too): what a saved program
        # keeps instead of the machine path of its data directory, and checks again when it is loaded.
        self.corpus_sha256 = (
            _source.digest.removeprefix("file:") if _source.digest.startswith("file:") else None
        )
        self._tokenize = _Tokenizer(
            token_pattern=token_pattern, stopwords=stopwords, stemmer=stemmer, fold_accents=fold_accents
        )
        self._build_limits = {"shard_passages": shard_passages, "block_postings": block_postings}
        self.index_key = self._compute_key(_source.digest)
        #: True when this instance built the index, False when it opened a cached one.
        self.index_built = False
        started = time.perf_counter()
        if persist:
            self.index_dir: Path | None = resolve_cache_dir(cache_dir) / "bm25" / self.index_key
            index = self._open_or_build(_source, progress=progress, verify=verify)
        else:
            self.index_dir = None
            scratch = Path(tempfile.mkdtemp(prefix="ragsuite-bm25-"))
            weakref.finalize(self, shutil.rmtree, scratch, True)
            self._build(_source, scratch / "index", progress=progress)
            index = OpenIndex.open(scratch / "index")
        self.build_seconds = time.perf_counter() - started
        self._adopt(index)

    @classmethod
    def from_dataset(
        cls,
        name: str,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        **settings: Any,
    ) -> BM25Retriever:
        """The index of a dataset's ``corpus.jsonl``, streamed from disk (never loaded whole).

        Args:
            name: Dataset name (its corpus is indexed; TriviaQA has none: use ``"nq"``).
            data_dir: Dataset root.
            cache_dir: Cache root.
            **settings: Any keyword argument of the constructor.
        """
        from ragsuite.data.datasets import corpus_path

        path = corpus_path(name, data_dir)
        source = _file_source(path, cache_dir=cache_dir)
        return cls(cache_dir=cache_dir, dataset=name, _source=source, **settings)

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None, **settings: Any
    ) -> BM25Retriever:
        """The index of your own corpus file (JSONL, TSV, CSV or Parquet with ``id``, ``title``, ``text``),
        streamed from disk (never loaded whole)."""
        resolved = Path(path).expanduser().resolve()
        if not resolved.is_file():
            raise DataError(f"{resolved} does not exist")
        source = _file_source(resolved, cache_dir=cache_dir)
        corpus_file = {"corpus_path": str(resolved), "corpus_sha256": source.digest.removeprefix("file:")}
        return cls(cache_dir=cache_dir, corpus_file=corpus_file, _source=source, **settings)

    # -- building and opening ----------------------------------------------------------------------

    def _compute_key(self, corpus_digest: str) -> str:
        digest = hashlib.sha256()
        header = {"format": FORMAT_VERSION, "bm25s": _bm25s_version(), "settings": self.settings}
        digest.update(json.dumps(header, sort_keys=True).encode())
        digest.update(corpus_digest.encode())
        return digest.hexdigest()[:24]

    def _document(self, passage: Passage) -> str:
        return (passage.title + " ") * self.settings["title_weight"] + passage.text

    def _build(self, source: _CorpusSource, work: Path, *, progress: bool) -> dict[str, Any]:
        s = self.settings
        builder = IndexBuilder(
            work,
            tokenize=self._tokenize,
            document=self._document,
            scoring=Scoring(method=s["method"], k1=s["k1"], b=s["b"], delta=s["delta"]),
            **self._build_limits,
        )
        meta = {
            "index_key": self.index_key,
            "bm25s": _bm25s_version(),
            "settings": s,
            "dataset": self.dataset,
        }
        log.info("building BM25 index %s in %s", self.index_key, work)
        try:
            built = builder.build(
                source.stream(), total=source.total() if progress else None, progress=progress, meta=meta
            )
        except DuplicateIdError as exc:
            raise source.on_duplicate(exc) from None
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.index_built = True
        return built

    def _open_or_build(self, source: _CorpusSource, *, progress: bool, verify: bool) -> OpenIndex:
        assert self.index_dir is not None
        directory = self.index_dir
        index = self._open_cached(directory, verify=verify)
        if index is not None:
            return index
        parent = directory.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            lock = (parent / f"{self.index_key}.lock").open("a")
        except OSError as exc:
            raise ConfigError(
                f"cannot write the BM25 index under {parent} ({exc}); pass another --cache-dir"
            ) from exc
        with lock:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.warning("another process is building BM25 index %s; waiting for it", self.index_key)
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            index = self._open_cached(directory, verify=verify)  # built while this one waited
            if index is not None:
                return index
            work = parent / f"{self.index_key}.partial"
            self._build(source, work, progress=progress)
            os.replace(work, directory)
            # Only after success: a process still waiting on this lock finds the index when it gets it.
            Path(lock.name).unlink(missing_ok=True)
            log.info("saved BM25 index to %s", directory)
            return OpenIndex.open(directory)

    def _open_cached(self, directory: Path, *, verify: bool) -> OpenIndex | None:
        """The cached index, or None when absent; a damaged one is removed (with a warning) to be rebuilt."""
        if not directory.exists():
            return None
        try:
            index = OpenIndex.open(directory, verify=verify)
            if index.meta.get("index_key") != self.index_key:
                raise IndexDamaged("its metadata does not match this corpus and these settings")
        except (IndexDamaged, OSError, ValueError, KeyError, TypeError) as exc:
            log.warning(
                "the cached BM25 index at %s is unusable (%s: %s); rebuilding it",
                directory,
                type(exc).__name__,
                exc,
            )
            _discard(directory)
            return None
        log.info("opened BM25 index %s at %s", self.index_key, directory)
        return index

    def _adopt(self, index: OpenIndex) -> None:
        self._index = index
        #: The corpus, read from the index's passage store on demand (a read-only sequence of passages).
        self.passages = index.passages
        self._n = len(index.passages)
        # Plain ndarray views of the maps (the compiled kernel takes no ndarray subclass).
        self._indptr = np.asarray(index.indptr)
        self._indices = np.asarray(index.indices)
        self._weights = np.asarray(index.weights)
        self._workspaces = bm25_kernel.Workspaces(self._n)
        # Each term's highest weight (-1: not yet known), found by the compiled kernel on its first query.
        self._max_weights = np.full(len(self._indptr) - 1, -1.0, dtype=np.float32)
        # Query word -> term id of its stem (-1: a stopword, or no such term), filled as queries come.
        self._word_terms: dict[str, int] = {}

    # -- querying -----------------------------------------------------------------------------------

    def _term_ids(self, query: str) -> list[int]:
        return self._term_ids_many([query])[0]

    def _term_ids_many(self, queries: Sequence[str]) -> list[list[int]]:
        """Each query's indexed term ids, in query order: its stemmed words (stopwords left out) that the
        index has. Each word's term id (-1: none) is memoized, so a word seen before costs one dict lookup."""
        for query in queries:
            if not isinstance(query, str):
                raise ConfigError(f"a query must be a string, got {type(query).__name__}")
        word_lists = [self._tokenize.split(query) for query in queries]
        known: Mapping[str, int] = self._word_terms
        new = {w for words in word_lists for w in words if w not in known}
        if new:
            found = self._look_up_words(new)
            if len(self._word_terms) < _WORD_MEMO_LIMIT:
                self._word_terms.update(found)  # one atomic update: other threads see all of it or none
            else:
                known = collections.ChainMap(found, self._word_terms)
        return [[i for w in words if (i := known[w]) >= 0] for words in word_lists]

    def _look_up_words(self, words: set[str]) -> dict[str, int]:
        """The term id of each word's stem, -1 for a stopword or a stem the index does not have."""
        stems = self._tokenize.stem_all(w for w in words if w not in self._tokenize.stopwords)
        lookup = self._index.vocabulary.get
        found = dict.fromkeys(words, -1)
        for word, stem in stems.items():
            if stem != "" and (i := lookup(stem)) is not None:
                found[word] = i
        return found

    def _bases(self, terms: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Each query's base score: 0, or with BM25L / BM25+ the sum of its terms' non-occurrence scores,
        which every passage gets (a float32 sum, as bm25s)."""
        nonoccurrence = self._index.nonoccurrence
        if nonoccurrence is None:
            return np.zeros(len(offsets) - 1)
        return np.array([float(nonoccurrence[terms[lo:hi]].sum()) for lo, hi in itertools.pairwise(offsets)])

    def _rank_into(self, terms: np.ndarray, offsets: np.ndarray, bases: np.ndarray, out: Rankings) -> None:
        """Fills ``out`` with the top k (its width) of the queries ``terms[offsets[q]:offsets[q + 1]]``,
        ranked exactly as sorting every passage by (score descending, corpus order) would rank them."""
        with self._workspaces.borrow() as workspace:
            bm25_kernel.top_k_many(
                self._indptr, self._indices, self._weights, terms, offsets, bases, workspace, out,
                self._max_weights,
            )  # fmt: skip
        k = out.docs.shape[1]
        for q in np.flatnonzero(out.counts < min(k, self._n)).tolist():
            self._pad(out, q, float(bases[q]))

    def _pad(self, out: Rankings, q: int, base: float) -> None:
        """Row q's matched passages followed by the first others in corpus order, at the base score (every
        passage a query does not match scores the base)."""
        count, k = int(out.counts[q]), out.docs.shape[1]
        matched = set(out.docs[q, :count].tolist())
        for i in range(self._n):
            if count >= k:
                break
            if i not in matched:
                out.docs[q, count], out.scores[q, count] = i, base
                count += 1
        out.counts[q] = count

    def _passages_of(self, ranked: Rankings) -> list[list[Passage]]:
        """The passages of the rankings, with their scores (one gather for all of them)."""
        docs, scores = ranked.filled()
        return _split(self._index.passages.get_many(docs, scores.tolist()), ranked.counts)

    def _ids_of(self, ranked: Rankings) -> list[list[str]]:
        """The passage ids of the rankings."""
        return _split(self._index.passages.ids_many(ranked.filled()[0]), ranked.counts)

    def _check_k(self, k: int) -> int:
        """``k`` checked, and clamped to the corpus: the rankings are allocated k wide, and a k of 10**9 from
        a knob must cost no more than the whole corpus."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ConfigError(f"k must be a positive integer, got {k!r}")
        return min(int(k), max(self._n, 1))

    def __call__(self, query: str, k: int) -> list[Passage]:
        """The top ``k`` passages for ``query`` (all of them when k exceeds the corpus).

        A query with no indexed term (empty, only stopwords, or only unknown words) matches nothing: ``[]``.
        """
        k = self._check_k(k)
        term_ids = self._term_ids(query)
        if not term_ids:
            return []
        terms, offsets = np.array(term_ids, dtype=np.int64), np.array([0, len(term_ids)], dtype=np.int64)
        ranked = Rankings.empty(1, int(k))
        try:
            self._rank_into(terms, offsets, self._bases(terms, offsets), ranked)
            return self._passages_of(ranked)[0]
        except (ValueError, IndexError, OSError) as exc:
            raise RetrievalError(f"BM25 search failed for query {query[:200]!r}: {exc}") from exc

    def warm_up(self) -> None:
        """Search the first passage's own words once, so that the next query skips the one-off costs of a
        process's first search: importing numba and loading the compiled kernel from its disk cache (1-3 s on
        2 busy cores; a query without an indexed word never reaches the kernel), and the stemmer's setup."""
        if self._n:
            first = self._index.passages.get(0)
            self(f"{first.title} {first.text}"[:500], 1)

    def batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """``[self(q, k) for q in queries]``, the queries spread over a thread per CPU when that pays."""
        return self._batch(queries, k, self._passages_of)

    def batch_ids(self, queries: Sequence[str], k: int) -> list[list[str]]:
        """The ids of :meth:`batch`'s passages, without reading their titles and texts: all that recall needs.

        Example:
            >>> retriever = BM25Retriever(
            ...     [Passage("p1", "Stettin", "Stettin is a port city on the Oder."),
            ...      Passage("p2", "Oder", "The Oder is a river in Central Europe."),
            ...      Passage("p3", "Baltic Sea", "An arm of the Atlantic.")],
            ...     persist=False,
            ... )
            >>> retriever.batch_ids(["Which river flows through Stettin?", "Baltic"], k=1)
            [['p1'], ['p3']]
        """
        return self._batch(queries, k, self._ids_of)

    #: Postings a batch reads in all from which :meth:`batch` spreads it over a thread per CPU. Below it,
    #: handing chunks of queries to threads (each hand-over needs the GIL) costs more than the threads save:
    #: on 2 CPUs, the dev questions of StrategyQA and ASQA (10k-40k postings a batch) ran faster in one
    #: thread, those of NQ, MuSiQue and HotpotQA (230k-1.2M) on two.
    threaded_postings = 100_000
    #: Postings per chunk handed to a thread: about a few ms of kernel, so that a thread slowed by other
    #: processes does not hold the batch back, while hand-overs stay rare.
    chunk_postings = 1_000_000

    def _batch(
        self, queries: Sequence[str], k: int, read: Callable[[Rankings], list[list[_T]]]
    ) -> list[list[_T]]:
        k = self._check_k(k)
        all_ids = self._term_ids_many(queries)
        results: list[list[_T]] = [[] for _ in all_ids]
        scored = [i for i, ids in enumerate(all_ids) if ids]  # no indexed term: matches nothing
        terms, offsets = bm25_kernel.flatten([all_ids[i] for i in scored])
        bases = self._bases(terms, offsets)
        ranked = Rankings.empty(len(scored), int(k))
        threaded = len(scored) > 1 and (os.cpu_count() or 1) > 1 and bm25_kernel.kernel_name() == "numba"
        postings = int((self._indptr[terms + 1] - self._indptr[terms]).sum()) if threaded else 0
        threaded = threaded and postings >= self.threaded_postings
        # The compiled kernel releases the GIL: a thread per CPU takes chunks of queries as it frees up, while
        # this thread reads the passages of each chunk as it completes, in order.
        size = len(scored)
        if threaded:
            per_thread = -(-len(scored) // (os.cpu_count() or 1))
            size = min(per_thread, self.chunk_postings * len(scored) // postings)
        size = max(1, size)
        spans = [(lo, min(lo + size, len(scored))) for lo in range(0, len(scored), size)]

        def rank(span: tuple[int, int]) -> Rankings:
            lo, hi = span
            self._rank_into(terms, offsets[lo : hi + 1], bases[lo:hi], ranked.rows(lo, hi))
            return ranked.rows(lo, hi)

        futures = []
        try:
            if threaded:
                futures = [_kernel_threads().submit(rank, span) for span in spans]
                chunks: Iterator[Rankings] = (f.result() for f in futures)
            else:
                chunks = map(rank, spans)
            for (lo, hi), chunk in zip(spans, chunks, strict=True):
                for i, found in zip(scored[lo:hi], read(chunk), strict=True):
                    results[i] = found
            return results
        except (ValueError, IndexError, OSError) as exc:
            raise RetrievalError(f"BM25 batch search failed: {exc}") from exc
        finally:
            for future in futures:  # after a failure or an interrupt: the chunks not yet started
                future.cancel()

    def describe(self) -> dict[str, Any]:
        """Kind, spec, index key, corpus size and settings (JSON-able)."""
        if self.corpus_file:
            spec = f"bm25:{self.corpus_file['corpus_path']}"
        else:
            spec = f"bm25:{self.dataset}" if self.dataset else "bm25"
        return {
            "kind": "bm25",
            "spec": spec,
            **({"corpus_sha256": self.corpus_sha256} if self.dataset and self.corpus_sha256 else {}),
            **(self.corpus_file or {}),
            "index_key": self.index_key,
            "dataset": self.dataset,
            "num_passages": self._n,
            "bm25s": _bm25s_version(),
            **self.settings,
        }

    def index_stats(self) -> dict[str, Any]:
        """Terms, postings, bytes on disk, build seconds and the query kernel in use."""
        meta = self._index.meta
        return {
            "terms": int(meta["num_terms"]),
            "postings": int(meta["num_postings"]),
            "index_bytes": index_bytes(meta),
            "build_seconds": meta.get("build_seconds"),
            "kernel": bm25_kernel.kernel_name(),
        }

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return f"BM25Retriever({self.describe()['spec']!r}, passages={self._n}, key={self.index_key})"


def _file_source(path: Path, *, cache_dir: str | os.PathLike[str] | None) -> _CorpusSource:
    """A corpus file as an index source: streamed, keyed by its (remembered) sha256."""
    from ragsuite.data.datasets import count_table_rows, file_sha256_cached, iter_corpus_file

    def on_duplicate(exc: DuplicateIdError) -> Exception:
        lines = [
            line
            for number, (line, _) in enumerate(iter_corpus_file(path))
            if number in (exc.first, exc.second)
        ]
        if len(lines) == 2:
            return DataError(
                f"{path}:{lines[1]}: duplicate passage id {exc.passage_id!r} (first on line {lines[0]})"
            )
        return DataError(f"{path}: {exc}")

    return _CorpusSource(
        stream=lambda: (passage for _, passage in iter_corpus_file(path)),
        digest="file:" + file_sha256_cached(path, cache_dir=cache_dir),
        total=lambda: count_table_rows(path),
        on_duplicate=on_duplicate,
    )


_T = TypeVar("_T")


def _split(everything: list[_T], counts: np.ndarray) -> list[list[_T]]:
    """``everything`` (the items of several rankings, concatenated) cut back into one list per ranking."""
    ends = np.cumsum(counts).tolist()
    return [everything[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]


_threads: tuple[int, ThreadPoolExecutor] | None = None
_threads_lock = threading.Lock()


def _kernel_threads() -> ThreadPoolExecutor:
    """A thread per CPU for :meth:`BM25Retriever.batch`'s kernel calls, shared by every retriever and started
    once per process (a forked child starts its own: its parent's threads are not in it)."""
    global _threads
    with _threads_lock:
        if _threads is None or _threads[0] != os.getpid():
            pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="bm25-kernel")
            _threads = (os.getpid(), pool)
        return _threads[1]


def _discard(directory: Path) -> None:
    aside = directory.with_name(f".corrupt-{directory.name}-{uuid.uuid4().hex[:8]}")
    try:
        os.replace(directory, aside)
    except OSError:
        aside = directory
    shutil.rmtree(aside, ignore_errors=True)
