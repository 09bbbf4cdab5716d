"""The on-disk BM25 index: a streaming, resumable, memory-bounded build, and memory-mapped serving.

Build, in two passes (memory is bounded by the shard and block sizes, never by the corpus):

1. **Tokenize.** Passages stream in shards of ``shard_passages``. Each passage's stems get term ids (in
   first-seen order); the shard's ``(term, passage, term frequency)`` postings are sorted term-major and
   written to disk, and the passages' lengths, their ``id``/``title``/``text`` (the passage store) and the
   shard's new terms are appended to files of their own. A shard's ``.done`` file, written last, makes it
   count: a killed build resumes at the first unfinished shard.
2. **Merge.** With every document frequency and the average length known, the terms are taken in blocks of
   about ``block_postings`` postings. A block's postings are read from every shard, weighted with bm25s' own
   formulas (``bm25s.scoring``: the same float64 arithmetic, stored as float32, exactly as ``bm25s.BM25``
   stores them) and appended to one CSC matrix: ``indptr`` per term, passage ``indices`` and ``weights``.
   The merge records its progress after every block and resumes there too.

Serving memory-maps every file, so opening an index reads only its small metadata, whatever its size, and the
OS pages in the postings a query touches. The vocabulary is looked up by binary search over the terms sorted
as UTF-8 bytes, also memory-mapped; passages are read from the passage store on demand.

Files of an index directory (raw little-endian arrays; ``N`` passages, ``V`` terms, ``P`` postings):

=====================  ======================================================================
``indptr.i64``         ``V + 1`` offsets into ``indices``/``weights`` per term id
``indices.i32``        ``P`` passage numbers, ascending within each term
``weights.f32``        ``P`` BM25 weights (bm25s' precomputed scores)
``nonoccurrence.f32``  ``V`` per-term score of a passage without the term (BM25L and BM25+ only)
``terms.bin``          the terms, UTF-8, concatenated in term-id order
``term_offsets.i64``   ``V + 1`` byte offsets into ``terms.bin``
``terms_sorted.i32``   ``V`` term ids in the byte order of their terms (for the binary search)
``passages.bin``       each passage's id, title and text, UTF-8, concatenated
``passage_offsets.i64``  ``3 N + 1`` byte offsets into ``passages.bin``
``lengths.i32``        ``N`` passage lengths in tokens
``ragsuite-meta.json`` settings, counts, and each file's size, mtime and sha256; written last
=====================  ======================================================================
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import mmap
import os
import shutil
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from ragsuite.data.datasets import file_sha256
from ragsuite.retrieval.base import Passage

log = logging.getLogger("ragsuite.retrieval.bm25")

FORMAT_VERSION = 2
META_NAME = "ragsuite-meta.json"
_SEP = "\x00"

# One shard's postings are sorted in memory: ~100k passages of ~100 tokens is ~10M postings, ~250 MB.
DEFAULT_SHARD_PASSAGES = 100_000
# A merge block holds its postings several times over (ids, frequencies, weights, sort order): ~0.2 GB.
DEFAULT_BLOCK_POSTINGS = 4_000_000


class IndexDamaged(ValueError):
    """An index directory whose files are not what its metadata says."""


# -- file helpers -------------------------------------------------------------------------------------


def _append(path: Path, values: np.ndarray) -> None:
    with path.open("ab") as handle:
        handle.write(np.ascontiguousarray(values).tobytes())


def _read(path: Path, dtype: Any, start: int = 0, count: int = -1) -> np.ndarray:
    """``count`` items from ``start`` of a raw array file (read into memory, not mapped)."""
    itemsize = np.dtype(dtype).itemsize
    if count == 0:
        return np.zeros(0, dtype=dtype)
    with path.open("rb") as handle:
        return np.fromfile(handle, dtype=dtype, count=count, offset=start * itemsize)


def _map(path: Path, dtype: Any) -> np.ndarray:
    """A read-only memory map of a raw array file (an empty array for an empty file, which mmap refuses)."""
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def _truncate(path: Path, size: int) -> None:
    with path.open("ab") as handle:
        handle.truncate(size)


def _fsync_file(path: Path) -> None:
    with path.open("rb") as handle:
        os.fsync(handle.fileno())


def file_digests(directory: Path, *, with_sha256: bool = True) -> dict[str, dict[str, Any]]:
    """Size, mtime and (optionally) sha256 of every file of an index directory, the metadata file aside."""
    digests = {}
    for path in sorted(directory.iterdir()):
        if not path.is_file() or path.name == META_NAME:
            continue
        stat = path.stat()
        entry: dict[str, Any] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        if with_sha256:
            entry["sha256"] = file_sha256(path)
        digests[path.name] = entry
    return digests


def check_files(directory: Path, expected: Any, *, full: bool = False) -> None:
    """Check an index directory against what its metadata recorded.

    Sizes are always checked; a file whose mtime differs from when it was written (copied, touched, or
    written to) has its sha256 checked, as has every file when ``full`` is true.

    Raises:
        IndexDamaged: naming the first file that is missing, extra, or not what was written.
    """
    if not isinstance(expected, dict) or not expected:
        raise IndexDamaged("its metadata records no files (an index from an older ragsuite)")
    found = file_digests(directory, with_sha256=False)
    extra = sorted(set(found) - set(expected))
    if extra:
        raise IndexDamaged(f"it holds files it was not written with: {extra}")
    for name, want in expected.items():
        got = found.get(name)
        if got is None:
            raise IndexDamaged(f"{name} is missing")
        if got["size"] != want.get("size"):
            raise IndexDamaged(f"{name} is damaged (its size differs from when it was written)")
        if full or got["mtime_ns"] != want.get("mtime_ns"):
            if file_sha256(directory / name) != want.get("sha256"):
                raise IndexDamaged(f"{name} is damaged (its sha256 differs from when it was written)")


# -- building ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scoring:
    """BM25 parameters, as bm25s names them."""

    method: str
    k1: float
    b: float
    delta: float


def _idf_by_df(df: np.ndarray, n_docs: int, method: str) -> np.ndarray:
    """float32 idf per term, from bm25s' scalar idf function (computed once per distinct df: exactly the
    values bm25s stores, ``math.log`` included)."""
    from bm25s.scoring import _select_idf_scorer

    idf_fn = _select_idf_scorer(method)
    distinct, inverse = np.unique(df, return_inverse=True)
    per_df = np.array([idf_fn(int(d), N=n_docs) if d else 0.0 for d in distinct], dtype=np.float32)
    return per_df[inverse]


def _weights(
    tf: np.ndarray,
    lengths: np.ndarray,
    idf: np.ndarray,
    nonoccurrence: np.ndarray | None,
    avg_len: np.float64,
    scoring: Scoring,
) -> np.ndarray:
    """float32 BM25 weights of postings, computed as ``bm25s.scoring._build_scores_and_indices_for_matrix``
    computes them (its tfc function applied elementwise, the float32 idf, the float32 cast last)."""
    from bm25s.scoring import _select_tfc_scorer

    tfc = _select_tfc_scorer(scoring.method)(
        tf_array=tf.astype(np.float32),
        l_d=lengths.astype(np.int64),
        l_avg=avg_len,
        k1=scoring.k1,
        b=scoring.b,
        delta=scoring.delta,
    )
    scores = idf * tfc
    if nonoccurrence is not None:
        scores = scores - nonoccurrence
    weights = scores.astype(np.float32)
    # Every method's weight is >= 0 (idf >= 0; tfc grows with tf); the query kernel relies on it.
    if len(weights) and weights.min() < 0:
        raise ValueError(f"a BM25 weight came out negative ({weights.min()}) with {scoring}")
    return weights


class _Progress:
    """A tqdm bar over passages (rate and ETA), or nothing."""

    def __init__(self, *, enabled: bool, total: int | None, initial: int) -> None:
        self._bar = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total or None, initial=initial, desc="BM25 index", unit="passage", unit_scale=True
            )

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def stage(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class IndexBuilder:
    """Builds an index directory from a stream of passages, resuming a killed build in the same ``work``
    directory.

    Args:
        work: The build's working directory (kept until :meth:`build` finishes; then renamed into place).
        tokenize: Maps a passage's indexed text to its stems.
        document: Maps a passage to the text that is indexed (title weighting).
        scoring: BM25 method and parameters.
        shard_passages: Passages per shard (memory of the tokenize pass).
        block_postings: Postings per merge block (memory of the merge pass).
    """

    def __init__(
        self,
        work: Path,
        *,
        tokenize: Callable[[str], list[str]],
        document: Callable[[Passage], str],
        scoring: Scoring,
        shard_passages: int = DEFAULT_SHARD_PASSAGES,
        block_postings: int = DEFAULT_BLOCK_POSTINGS,
    ) -> None:
        if shard_passages < 1 or block_postings < 1:
            raise ValueError("shard_passages and block_postings must be positive")
        self.work = work
        self.tokenize = tokenize
        self.document = document
        self.scoring = scoring
        self.shard_passages = shard_passages
        self.block_postings = block_postings
        self.shards = work / "shards"

    # The tokenize pass -------------------------------------------------------------------------------

    def _resume_tokenize(self) -> tuple[int, int, dict[str, int]]:
        """(completed shards, passages in them, vocabulary) from the files of a killed build."""
        self.work.mkdir(parents=True, exist_ok=True)
        self.shards.mkdir(exist_ok=True)
        done = []
        while (self.shards / f"{len(done):06d}.done").is_file():
            done.append(json.loads((self.shards / f"{len(done):06d}.done").read_text(encoding="utf-8")))
        vocab: dict[str, int] = {}
        for number in range(len(done)):
            for term in json.loads((self.shards / f"{number:06d}.terms.json").read_text(encoding="utf-8")):
                vocab[term] = len(vocab)
        for stale in self.shards.glob(f"{len(done):06d}.*"):  # the shard the kill interrupted
            stale.unlink()
        sizes = done[-1]["sizes"] if done else {}
        for name in ("passages.bin", "passage_offsets.i64", "lengths.i32", "id_hashes.i64"):
            path = self.work / name
            path.touch()
            _truncate(path, sizes.get(name, 0))
        if not done:
            _append(self.work / "passage_offsets.i64", np.zeros(1, dtype=np.int64))
        passages = done[-1]["passages_total"] if done else 0
        return len(done), passages, vocab

    def _write_shard(
        self,
        number: int,
        batch: list[Passage],
        vocab: dict[str, int],
        first_passage: int,
    ) -> None:
        tokenize, document = self.tokenize, self.document
        vocab_before = len(vocab)
        term_ids = array("i")
        lengths = np.empty(len(batch), dtype=np.int32)
        blob = bytearray()
        offsets = np.empty(3 * len(batch), dtype=np.int64)
        base = (self.work / "passages.bin").stat().st_size
        setdefault = vocab.setdefault
        for i, passage in enumerate(batch):
            stems = tokenize(document(passage))
            term_ids.extend([setdefault(s, len(vocab)) for s in stems])
            lengths[i] = len(stems)
            for j, field in enumerate((passage.id, passage.title, passage.text)):
                blob += field.encode("utf-8", "surrogatepass")
                offsets[3 * i + j] = base + len(blob)
        ids = np.frombuffer(term_ids, dtype=np.int32) if len(term_ids) else np.zeros(0, dtype=np.int32)
        docs = np.repeat(np.arange(first_passage, first_passage + len(batch), dtype=np.int64), lengths)
        # One sort gives term-major order, passage order within a term, and each pair's frequency.
        keys, tf = np.unique((ids.astype(np.int64) << 32) | docs, return_counts=True)
        terms = (keys >> 32).astype(np.int32)
        uterms, counts = np.unique(terms, return_counts=True)
        prefix = self.shards / f"{number:06d}"
        (prefix.with_suffix(".docs.i32")).write_bytes((keys & 0xFFFFFFFF).astype(np.int32).tobytes())
        (prefix.with_suffix(".tf.i32")).write_bytes(tf.astype(np.int32).tobytes())
        (prefix.with_suffix(".uterms.i32")).write_bytes(uterms.astype(np.int32).tobytes())
        (prefix.with_suffix(".counts.i64")).write_bytes(counts.astype(np.int64).tobytes())
        # The shard's new terms are the last ones inserted: read them from the end, not the whole dict.
        new_terms = list(islice(reversed(vocab), len(vocab) - vocab_before))[::-1]
        (prefix.with_suffix(".terms.json")).write_text(json.dumps(new_terms), encoding="utf-8")
        with (self.work / "passages.bin").open("ab") as handle:
            handle.write(blob)
        _append(self.work / "passage_offsets.i64", offsets)
        _append(self.work / "lengths.i32", lengths)
        _append(self.work / "id_hashes.i64", _id_hashes(batch))
        for path in [*self.shards.glob(f"{number:06d}.*"), *self.work.glob("*.*")]:
            if path.is_file():
                _fsync_file(path)
        sizes = {
            name: (self.work / name).stat().st_size
            for name in ("passages.bin", "passage_offsets.i64", "lengths.i32", "id_hashes.i64")
        }
        done = {"passages": len(batch), "passages_total": first_passage + len(batch), "sizes": sizes}
        (prefix.with_suffix(".done")).write_text(json.dumps(done), encoding="utf-8")

    # The merge pass ----------------------------------------------------------------------------------

    def _merge(self, n_shards: int, n_passages: int, progress: _Progress) -> dict[str, Any]:
        work, shards = self.work, self.shards
        lengths = _read(work / "lengths.i32", np.int32)
        # bm25s: avg_doc_len = np.array(lengths).mean(); the integer sum is exact in float64 here.
        avg_len = np.float64(np.array(lengths, dtype=np.int64).mean()) if n_passages else np.float64(0)
        # Per shard: its terms and where each term's postings start (12 bytes per term and shard).
        per_shard = []
        n_terms = 0
        for s in range(n_shards):
            uterms = _read(shards / f"{s:06d}.uterms.i32", np.int32)
            counts = _read(shards / f"{s:06d}.counts.i64", np.int64)
            starts = np.zeros(len(counts) + 1, dtype=np.int64)
            np.cumsum(counts, out=starts[1:])
            per_shard.append((uterms, starts))
            if len(uterms):
                n_terms = max(n_terms, int(uterms[-1]) + 1)
        df = np.zeros(n_terms, dtype=np.int64)
        for uterms, starts in per_shard:
            df[uterms] += np.diff(starts)
        indptr = np.zeros(n_terms + 1, dtype=np.int64)
        np.cumsum(df, out=indptr[1:])
        idf = _idf_by_df(df, n_passages, self.scoring.method)
        nonoccurrence = _nonoccurrence(df, n_passages, avg_len, self.scoring)

        state_path = work / "merge.json"
        state = {"next_term": 0, "indices": 0, "weights": 0}
        if state_path.is_file():
            state = json.loads(state_path.read_text(encoding="utf-8"))
        for name in ("indices.i32", "weights.f32"):
            (work / name).touch()
            _truncate(work / name, state[name.split(".")[0]])

        term = int(state["next_term"])
        while term < n_terms:
            # The block ends where it reaches block_postings (at least one term, however long its list).
            end = int(np.searchsorted(indptr, indptr[term] + self.block_postings, side="right")) - 1
            end = min(max(end, term + 1), n_terms)
            progress.stage(f"merging terms {term:,}-{end:,} of {n_terms:,}")
            pieces_terms, pieces_docs, pieces_tf = [], [], []
            for s, (uterms, starts) in enumerate(per_shard):
                lo, hi = np.searchsorted(uterms, [term, end])
                if lo == hi:
                    continue
                start, stop = int(starts[lo]), int(starts[hi])
                pieces_terms.append(np.repeat(uterms[lo:hi], np.diff(starts[lo : hi + 1])))
                pieces_docs.append(_read(shards / f"{s:06d}.docs.i32", np.int32, start, stop - start))
                pieces_tf.append(_read(shards / f"{s:06d}.tf.i32", np.int32, start, stop - start))
            block_terms = np.concatenate(pieces_terms)
            # Shards hold ascending passage numbers, so a stable sort by term keeps passages ascending.
            order = np.argsort(block_terms, kind="stable")
            block_terms = block_terms[order]
            docs = np.concatenate(pieces_docs)[order]
            tf = np.concatenate(pieces_tf)[order]
            del order, pieces_terms, pieces_docs, pieces_tf
            weights = _weights(
                tf,
                lengths[docs],
                idf[block_terms],
                None if nonoccurrence is None else nonoccurrence[block_terms],
                avg_len,
                self.scoring,
            )
            _append(work / "indices.i32", docs.astype(np.int32))
            _append(work / "weights.f32", weights)
            _fsync_file(work / "indices.i32")
            _fsync_file(work / "weights.f32")
            state = {
                "next_term": end,
                "indices": (work / "indices.i32").stat().st_size,
                "weights": (work / "weights.f32").stat().st_size,
            }
            state_path.write_text(json.dumps(state), encoding="utf-8")
            term = end
        (work / "indptr.i64").write_bytes(indptr.tobytes())
        if nonoccurrence is not None:
            (work / "nonoccurrence.f32").write_bytes(nonoccurrence.tobytes())
        return {"num_terms": n_terms, "num_postings": int(indptr[-1]), "avg_length": float(avg_len)}

    def _write_vocabulary(self, n_shards: int) -> None:
        terms: list[str] = []
        for number in range(n_shards):
            terms.extend(json.loads((self.shards / f"{number:06d}.terms.json").read_text(encoding="utf-8")))
        encoded = [t.encode("utf-8", "surrogatepass") for t in terms]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        (self.work / "terms.bin").write_bytes(b"".join(encoded))
        (self.work / "term_offsets.i64").write_bytes(offsets.tobytes())
        order = sorted(range(len(encoded)), key=encoded.__getitem__)
        (self.work / "terms_sorted.i32").write_bytes(np.array(order, dtype=np.int32).tobytes())

    def _check_unique_ids(self, n_passages: int) -> None:
        hashes = _read(self.work / "id_hashes.i64", np.int64)
        order = np.argsort(hashes, kind="stable")
        same = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
        if not len(same):
            return
        store = PassageStore(self.work)
        try:
            for position in same:
                first, second = int(order[position]), int(order[position + 1])
                if store.id(first) == store.id(second):
                    raise DuplicateIdError(store.id(first), first, second)
        finally:
            store.close()

    # The whole build ---------------------------------------------------------------------------------

    def build(
        self,
        passages: Iterable[Passage],
        *,
        total: int | None = None,
        progress: bool = False,
        meta: dict[str, Any],
    ) -> dict[str, Any]:
        """Build (or finish building) the index in ``work``; returns its metadata (also written to
        ``work/ragsuite-meta.json`` last, with every file's size, mtime and sha256).

        Raises:
            DuplicateIdError: two passages share an id.
            ValueError: the corpus is empty.
        """
        started = time.perf_counter()
        n_shards, n_passages, vocab = self._resume_tokenize()
        if n_passages:
            log.info("resuming the BM25 build in %s after %d passages", self.work, n_passages)
        bar = _Progress(enabled=progress, total=total, initial=n_passages)
        try:
            stream = iter(passages)
            for _ in range(n_passages):  # already in the completed shards
                if next(stream, None) is None:
                    raise ValueError("the corpus is shorter than the interrupted build that indexed it")
            batch: list[Passage] = []
            for passage in stream:
                batch.append(passage)
                if len(batch) == self.shard_passages:
                    self._write_shard(n_shards, batch, vocab, n_passages)
                    n_shards, n_passages = n_shards + 1, n_passages + len(batch)
                    bar.update(len(batch))
                    batch = []
            if batch:
                self._write_shard(n_shards, batch, vocab, n_passages)
                n_shards, n_passages = n_shards + 1, n_passages + len(batch)
                bar.update(len(batch))
            if not n_passages:
                raise ValueError("cannot build a BM25 index over an empty corpus")
            bar.stage("checking ids")
            self._check_unique_ids(n_passages)
            stats = self._merge(n_shards, n_passages, bar)
            bar.stage("writing the vocabulary")
            self._write_vocabulary(n_shards)
        finally:
            bar.close()
        shutil.rmtree(self.shards)
        for leftover in ("merge.json", "id_hashes.i64"):
            (self.work / leftover).unlink(missing_ok=True)
        full_meta = {
            **meta,
            "format": FORMAT_VERSION,
            "num_docs": n_passages,
            **stats,
            "build_seconds": round(time.perf_counter() - started, 3),
        }
        for path in self.work.iterdir():
            _fsync_file(path)
        full_meta["files"] = file_digests(self.work)
        (self.work / META_NAME).write_text(json.dumps(full_meta, indent=2), encoding="utf-8")
        return full_meta


def _nonoccurrence(df: np.ndarray, n_docs: int, avg_len: np.float64, scoring: Scoring) -> np.ndarray | None:
    """bm25s' ``nonoccurrence_array`` (BM25L/BM25+ only): ``idf * tfc(tf=0, l_d=avg)``, per term, float32."""
    if scoring.method not in ("bm25l", "bm25+"):
        return None
    from bm25s.scoring import _select_idf_scorer, _select_tfc_scorer

    idf_fn = _select_idf_scorer(scoring.method)
    tfc = _select_tfc_scorer(scoring.method)(
        tf_array=0, l_d=avg_len, l_avg=avg_len, k1=scoring.k1, b=scoring.b, delta=scoring.delta
    )
    distinct, inverse = np.unique(df, return_inverse=True)
    per_df = np.array([idf_fn(int(d), N=n_docs) * tfc if d else 0.0 for d in distinct], dtype=np.float32)
    return per_df[inverse]


def _id_hashes(batch: Sequence[Passage]) -> np.ndarray:
    """64-bit hashes of passage ids (duplicates are found by sorting these, then confirmed on the ids)."""
    return np.array(
        [
            int.from_bytes(
                hashlib.blake2b(p.id.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little"
            )
            - (1 << 63)
            for p in batch
        ],
        dtype=np.int64,
    )


class DuplicateIdError(ValueError):
    """Two passages of a corpus share an id (positions are 0-based passage numbers)."""

    def __init__(self, passage_id: str, first: int, second: int) -> None:
        super().__init__(
            f"duplicate passage id {passage_id!r} (passages {first + 1} and {second + 1} of the corpus)"
        )
        self.passage_id, self.first, self.second = passage_id, first, second


# -- serving ----------------------------------------------------------------------------------------


class PassageStore(Sequence[Passage]):
    """The passages of an index, read from its memory-mapped passage store on demand.

    Behaves as a read-only list of :class:`Passage` (``len``, indexing, iteration), holding none of them.
    """

    def __init__(self, directory: Path) -> None:
        # A plain ndarray view of the map: slicing it skips np.memmap's per-access Python overhead.
        self._offsets = np.asarray(_map(directory / "passage_offsets.i64", np.int64))
        blob_path = directory / "passages.bin"
        self._file = blob_path.open("rb")
        size = blob_path.stat().st_size
        self._blob: Any = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def __len__(self) -> int:
        return max(0, (len(self._offsets) - 1) // 3)

    def _fields(self, i: int) -> list[str]:
        start, a, b, end = self._offsets[3 * i : 3 * i + 4].tolist()
        raw = self._blob[start:end]
        return [
            raw[: a - start].decode("utf-8", "surrogatepass"),
            raw[a - start : b - start].decode("utf-8", "surrogatepass"),
            raw[b - start :].decode("utf-8", "surrogatepass"),
        ]

    def id(self, i: int) -> str:
        start, end = self._offsets[3 * i : 3 * i + 2].tolist()
        return self._blob[start:end].decode("utf-8", "surrogatepass")

    def get(self, i: int, score: float = 0.0) -> Passage:
        pid, title, text = self._fields(i)
        return Passage(pid, title, text, score)

    def get_many(self, numbers: np.ndarray, scores: Sequence[float]) -> list[Passage]:
        """:meth:`get` of many passage numbers (one gather of their offsets, not a slice per passage)."""
        numbers = np.asarray(numbers, dtype=np.int64)
        bounds = self._offsets[3 * numbers[:, None] + np.arange(4)].tolist()
        blob = self._blob
        return [
            Passage(
                blob[start:a].decode("utf-8", "surrogatepass"),
                blob[a:b].decode("utf-8", "surrogatepass"),
                blob[b:end].decode("utf-8", "surrogatepass"),
                score,
            )
            for (start, a, b, end), score in zip(bounds, scores, strict=True)
        ]

    def ids_many(self, numbers: np.ndarray) -> list[str]:
        """The ids of many passages, reading neither their titles nor their texts."""
        starts = 3 * np.asarray(numbers, dtype=np.int64)
        ends = self._offsets[starts + 1].tolist()
        blob = self._blob
        return [
            blob[start:end].decode("utf-8", "surrogatepass")
            for start, end in zip(self._offsets[starts].tolist(), ends, strict=True)
        ]

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self.get(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        i = int(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("passage index out of range")
        return self.get(i)

    def __iter__(self) -> Iterator[Passage]:
        return (self.get(i) for i in range(len(self)))

    def close(self) -> None:
        if isinstance(self._blob, mmap.mmap):
            self._blob.close()
        self._file.close()


class Vocabulary:
    """Term -> term id over the memory-mapped, byte-sorted term list (binary search; results memoized)."""

    _MEMO_LIMIT = 200_000

    def __init__(self, directory: Path) -> None:
        self._offsets = _map(directory / "term_offsets.i64", np.int64)
        self._sorted = _map(directory / "terms_sorted.i32", np.int32)
        path = directory / "terms.bin"
        self._file = path.open("rb")
        self._blob: Any = (
            mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if path.stat().st_size else b""
        )
        self._memo: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._sorted)

    def term(self, term_id: int) -> bytes:
        return self._blob[int(self._offsets[term_id]) : int(self._offsets[term_id + 1])]

    def get(self, term: str) -> int | None:
        """The id of ``term``, or None when the corpus does not have it."""
        found = self._memo.get(term)
        if found is not None:
            return found if found >= 0 else None
        key = term.encode("utf-8", "surrogatepass")
        sorted_ids = self._sorted
        position = bisect.bisect_left(_SortedTerms(self), key)
        result = -1
        if position < len(sorted_ids):
            candidate = int(sorted_ids[position])
            if self.term(candidate) == key:
                result = candidate
        if len(self._memo) < self._MEMO_LIMIT:
            self._memo[term] = result
        return result if result >= 0 else None

    def close(self) -> None:
        if isinstance(self._blob, mmap.mmap):
            self._blob.close()
        self._file.close()


class _SortedTerms(Sequence[bytes]):
    """The terms in byte order, as a sequence ``bisect`` can search."""

    def __init__(self, vocabulary: Vocabulary) -> None:
        self._vocabulary = vocabulary

    def __len__(self) -> int:
        return len(self._vocabulary)

    def __getitem__(self, i: Any) -> Any:
        return self._vocabulary.term(int(self._vocabulary._sorted[i]))


@dataclass
class OpenIndex:
    """The memory-mapped arrays of a built index."""

    directory: Path
    meta: dict[str, Any]
    indptr: np.ndarray
    indices: np.ndarray
    weights: np.ndarray
    nonoccurrence: np.ndarray | None
    vocabulary: Vocabulary
    passages: PassageStore

    @classmethod
    def open(cls, directory: Path, *, verify: bool = False) -> OpenIndex:
        """Map an index directory, after checking its files against its metadata (sizes; the sha256 of any
        file whose mtime changed, or of all with ``verify``) and the shape of its arrays.

        Raises:
            IndexDamaged: the files are not what was written, or not a consistent index.
            OSError, ValueError: unreadable metadata.
        """
        meta = json.loads((directory / META_NAME).read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT_VERSION:
            raise IndexDamaged(f"it has format {meta.get('format')!r}, this ragsuite reads {FORMAT_VERSION}")
        check_files(directory, meta.get("files"), full=verify)
        index = cls(
            directory=directory,
            meta=meta,
            indptr=_map(directory / "indptr.i64", np.int64),
            indices=_map(directory / "indices.i32", np.int32),
            weights=_map(directory / "weights.f32", np.float32),
            nonoccurrence=(
                _map(directory / "nonoccurrence.f32", np.float32)
                if (directory / "nonoccurrence.f32").is_file()
                else None
            ),
            vocabulary=Vocabulary(directory),
            passages=PassageStore(directory),
        )
        index._check_shapes()
        return index

    def _check_shapes(self) -> None:
        n, v, p = self.meta.get("num_docs"), self.meta.get("num_terms"), self.meta.get("num_postings")
        problems = []
        if len(self.passages) != n:
            problems.append(f"its passage store holds {len(self.passages)} passages, not {n}")
        if len(self.indptr) != (v or 0) + 1 or len(self.vocabulary) != v:
            problems.append("its vocabulary and term offsets disagree")
        if len(self.indices) != p or len(self.weights) != p or (len(self.indptr) and self.indptr[-1] != p):
            problems.append("its posting arrays disagree")
        if self.nonoccurrence is not None and len(self.nonoccurrence) != v:
            problems.append("its non-occurrence array has the wrong length")
        if problems:
            raise IndexDamaged("; ".join(problems))

    def close(self) -> None:
        self.passages.close()
        self.vocabulary.close()


def index_bytes(meta: dict[str, Any]) -> int:
    """Bytes on disk of an index: its files as recorded in its metadata (the metadata file aside)."""
    return sum(int(entry.get("size", 0)) for entry in (meta.get("files") or {}).values())
