"""Nearest-neighbour search over L2-normalized embeddings with FAISS (Johnson, Douze & Jégou, "Billion-scale
similarity search with GPUs", 2019): exact inner product for small corpora, an approximate index above a size
threshold.

Index kinds:

* ``flat``: ``IndexFlatIP``, exact; every query scores every passage (4 bytes x dim per passage in memory).
* ``ivfpq``: an inverted file of ``nlist`` k-means cells whose vectors are product-quantized to ``pq_m`` codes
  of ``pq_bits`` bits (Jégou, Douze & Schmid, "Product quantization for nearest neighbor search", 2011); a
  query visits its ``nprobe`` nearest cells. The ``rerank * k`` best candidates are then re-scored exactly
  against the stored float32 embeddings (memory-mapped, so only the candidates' rows are read): the
  quantized scores choose candidates, exact scores order them.
* ``hnsw``: a hierarchical navigable small-world graph (Malkov & Yashunin, 2018) over the full vectors,
  ``hnsw_m`` links per node, searched with a beam of ``ef_search``.

``auto`` (the default) is ``flat`` up to ``flat_max`` passages and ``ivfpq`` above. ``nlist`` defaults to the
power of two nearest ``4 * sqrt(n)`` (at most ``n / 39``, so that k-means has 39 training points per cell) and
``pq_m`` to ``dim / 8`` (48 one-byte codes for a 384-dim encoder). ``python benchmarks/dense_scale.py``
measures recall and memory of these settings.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from ragsuite.errors import ConfigError, require
from ragsuite.files import new_file_mode

IndexKind = Literal["auto", "flat", "ivfpq", "hnsw"]
RowBatches = Callable[[], Iterator[np.ndarray]]

# Rows read from disk (or sliced from memory) per ``add``/training step while an index is built.
_BUILD_BATCH = 16_384


def faiss_module() -> Any:
    """Import faiss or raise :class:`~ragsuite.errors.MissingExtraError` naming the ``dense`` extra."""
    return require("faiss", extra="dense", feature="Dense retrieval's FAISS index")


@dataclass(frozen=True)
class IndexSettings:
    """How the passage index is built and searched.

    Args:
        index: ``auto`` | ``flat`` | ``ivfpq`` | ``hnsw`` (see the module docstring).
        flat_max: Largest corpus ``auto`` searches exactly.
        nlist: IVF cells; ``None`` chooses from the corpus size.
        nprobe: IVF cells visited per query.
        pq_m: PQ sub-vectors (must divide the embedding dimension); ``None`` is ``dim // 8``.
        pq_bits: Bits per PQ code (4 to 12; 8 in practice).
        rerank: IVF-PQ candidates per result re-scored exactly (``1`` keeps the quantized ranking).
        hnsw_m: HNSW links per node.
        ef_construction: HNSW beam width while building.
        ef_search: HNSW beam width while searching (at least k is used).

    Example:
        >>> IndexSettings(index="ivfpq", nprobe=32).spec_options()
        ['index=ivfpq', 'nprobe=32']
    """

    index: IndexKind = "auto"
    flat_max: int = 200_000
    nlist: int | None = None
    nprobe: int = 128
    pq_m: int | None = None
    pq_bits: int = 8
    rerank: int = 16
    hnsw_m: int = 32
    ef_construction: int = 80
    ef_search: int = 64

    def __post_init__(self) -> None:
        if self.index not in get_args(IndexKind):
            raise ConfigError(f"index must be one of {', '.join(get_args(IndexKind))}, not {self.index!r}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "index" or (value is None and f.name in ("nlist", "pq_m")):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"dense index option {f.name} must be a positive integer, not {value!r}")
        if not 4 <= self.pq_bits <= 12:
            raise ConfigError(f"pq_bits must be between 4 and 12, not {self.pq_bits}")

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> IndexSettings:
        """Settings from ``key=value`` strings (spec options) or typed values; unknown keys are refused."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(
                f"unknown dense index option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        parsed: dict[str, Any] = {}
        for key, value in options.items():
            if key == "index" or not isinstance(value, str):
                parsed[key] = value
                continue
            try:
                parsed[key] = int(value)
            except ValueError:
                raise ConfigError(f"dense index option {key}={value!r} must be an integer") from None
        return cls(**parsed)

    def spec_options(self) -> list[str]:
        """``key=value`` for every setting that differs from its default, in field order."""
        default = IndexSettings()
        return [
            f"{f.name}={getattr(self, f.name)}"
            for f in fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        ]

    def resolve(self, n: int, dim: int) -> dict[str, Any]:
        """The concrete parameters for ``n`` vectors of ``dim`` dimensions (what :meth:`describe` reports)."""
        kind = self.index
        if kind == "auto":
            kind = "flat" if n <= self.flat_max else "ivfpq"
        if kind == "flat":
            return {"type": "flat", "factory": "Flat"}
        if kind == "hnsw":
            return {
                "type": "hnsw",
                "factory": f"HNSW{self.hnsw_m},Flat",
                "hnsw_m": self.hnsw_m,
                "ef_construction": self.ef_construction,
                "ef_search": self.ef_search,
            }
        nlist = self.nlist or default_nlist(n)
        pq_m = self.pq_m or max(1, dim // 8)
        if dim % pq_m:
            raise ConfigError(f"pq_m={pq_m} must divide the embedding dimension {dim}")
        if n < 2**self.pq_bits:
            raise ConfigError(
                f"an IVF-PQ index with pq_bits={self.pq_bits} trains on at least {2**self.pq_bits} passages; "
                f"this corpus has {n}: use index=flat or a smaller pq_bits"
            )
        if nlist > n:
            raise ConfigError(f"nlist={nlist} is more than the {n} passages; use a smaller nlist")
        return {
            "type": "ivfpq",
            "factory": f"IVF{nlist},PQ{pq_m}x{self.pq_bits}",
            "nlist": nlist,
            "nprobe": min(self.nprobe, nlist),
            "pq_m": pq_m,
            "pq_bits": self.pq_bits,
            "rerank": self.rerank,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_nlist(n: int) -> int:
    """The power of two nearest ``4 * sqrt(n)``, at most ``n // 39`` (39 k-means points per cell), and at
    least 1."""
    target = 4 * math.sqrt(n)
    nlist = 2 ** round(math.log2(max(target, 1)))
    return max(1, min(nlist, n // 39))


def build_key(params: Mapping[str, Any]) -> str:
    """A short hash of the parameters that shape a built index (search-time ones left out)."""
    build = {k: v for k, v in params.items() if k not in ("nprobe", "ef_search", "rerank")}
    return hashlib.sha256(json.dumps(build, sort_keys=True).encode()).hexdigest()[:12]


def array_batches(vectors: np.ndarray, rows: int = _BUILD_BATCH) -> RowBatches:
    """Batches of an in-memory matrix."""

    def batches() -> Iterator[np.ndarray]:
        for lo in range(0, len(vectors), rows):
            yield np.ascontiguousarray(vectors[lo : lo + rows], dtype=np.float32)

    return batches


def npy_batches(path: str | os.PathLike[str], rows: int = _BUILD_BATCH) -> RowBatches:
    """Batches of a 2-D float32 ``.npy`` file read with plain reads: unlike slices of a memory map, the rows
    read leave no pages in the process' resident set."""

    def batches() -> Iterator[np.ndarray]:
        with open(path, "rb") as handle:
            shape, dtype = read_npy_header(handle)
            for lo in range(0, shape[0], rows):
                count = min(rows, shape[0] - lo)
                block = np.fromfile(handle, dtype=dtype, count=count * shape[1])
                if block.size != count * shape[1]:
                    raise ValueError(f"{path} is truncated")
                yield block.reshape(count, shape[1]).astype(np.float32, copy=False)

    return batches


def read_npy_header(handle: Any) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of the ``.npy`` file open in ``handle``, left positioned at its data."""
    version = np.lib.format.read_magic(handle)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
    else:
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
    if fortran or len(shape) != 2:
        raise ValueError(f"expected a C-ordered matrix, got shape {shape} (fortran order: {fortran})")
    return shape, dtype


class NpyRows:
    """Rows of a 2-D float32 ``.npy`` file, read on demand with ``pread``.

    Used for IVF-PQ's exact re-scoring instead of indexing the memory map: a page faulted in through a map
    brings the pages around it into the process as well (the kernel's fault-around, 64 KiB), so a thousand
    queries' scattered candidates would map most of a large file; reads leave nothing resident.

    Example:
        >>> rows = NpyRows("embeddings.npy")  # doctest: +SKIP
        >>> rows(np.array([3, 17])).shape  # doctest: +SKIP
        (2, 384)
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        with open(path, "rb") as handle:
            shape, dtype = read_npy_header(handle)
            self.offset = handle.tell()
        if dtype != np.dtype("<f4"):
            raise ValueError(f"{path} holds {dtype}, not little-endian float32")
        self.shape = shape
        self._row_bytes = shape[1] * 4
        self._fd = os.open(path, os.O_RDONLY)

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        size = self._row_bytes
        out = bytearray(len(ids) * size)
        for j, i in enumerate(ids):
            row = os.pread(self._fd, size, self.offset + int(i) * size)
            if len(row) != size:
                raise ValueError(f"row {i} is beyond the end of the embedding file")
            out[j * size : (j + 1) * size] = row
        return np.frombuffer(out, dtype="<f4").reshape(len(ids), self.shape[1])

    def close(self) -> None:
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()


def build_index(
    params: Mapping[str, Any],
    *,
    n: int,
    dim: int,
    batches: RowBatches,
    progress: bool = False,
    seed: int = 0,
) -> Any:
    """Build the FAISS index :meth:`IndexSettings.resolve` described over the rows ``batches`` yields.

    IVF-PQ trains on a random sample of ``max(40 * nlist, 40 * 2**pq_bits)`` rows (all rows when fewer),
    gathered in one pass over the batches; rows are then added batch by batch, so that only the index and one
    batch are in memory.
    """
    from tqdm.auto import tqdm

    faiss = faiss_module()
    kind = params["type"]
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, params["hnsw_m"], faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = params["ef_construction"]
    elif kind == "ivfpq":
        index = faiss.index_factory(dim, params["factory"], faiss.METRIC_INNER_PRODUCT)
        n_train = min(n, max(40 * params["nlist"], 40 * 2 ** params["pq_bits"]))
        chosen = np.zeros(n, dtype=bool)
        chosen[np.random.default_rng(seed).choice(n, n_train, replace=False)] = True
        sample, lo = [], 0
        for block in batches():
            sample.append(block[chosen[lo : lo + len(block)]])
            lo += len(block)
        index.cp.seed = seed  # k-means of the coarse quantizer
        # Polysemous codes only serve Hamming-distance filtering, which search does not use; training them
        # takes most of the build time on small corpora.
        index.do_polysemous_training = False
        # Small corpora train k-means on fewer than faiss' 39 points per centroid; that is expected here and
        # needs no warning on stderr (too few points for 2**pq_bits centroids is refused in resolve()).
        index.cp.min_points_per_centroid = index.pq.cp.min_points_per_centroid = 1
        index.train(np.concatenate(sample))
        del sample
    else:
        raise ConfigError(f"unknown index type {kind!r}")
    added = 0
    with tqdm(total=n, desc=f"{kind} index", unit="passage", disable=not progress, leave=False) as bar:
        for block in batches():
            index.add(block)
            added += len(block)
            bar.update(len(block))
    if added != n or index.ntotal != n:
        raise ValueError(f"the index holds {index.ntotal} vectors, expected {n}")
    return index


def save_index(index: Any, path: Path) -> None:
    """Write ``index`` to ``path`` atomically (a temporary file renamed over it)."""
    faiss = faiss_module()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        faiss.write_index(index, tmp)
        with open(tmp, "rb") as handle:
            os.fchmod(handle.fileno(), new_file_mode(path))  # not mkstemp's 0600
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_index(path: Path, *, n: int, dim: int) -> Any | None:
    """The index saved at ``path`` if it is readable and holds ``n`` vectors of ``dim`` dims, else None."""
    if not path.is_file():
        return None
    faiss = faiss_module()
    try:
        index = faiss.read_index(str(path))
    except RuntimeError:
        return None
    if index.ntotal != n or index.d != dim:
        return None
    return index


def search(
    index: Any,
    params: Mapping[str, Any],
    queries: np.ndarray,
    k: int,
    *,
    vectors: np.ndarray | Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` (scores, ids) per query row, best first; ids are -1 where fewer than k were found.

    ``vectors`` (the stored embeddings: a matrix, or a function from row ids to rows such as
    :class:`NpyRows`) are needed for IVF-PQ's exact re-scoring.
    Thread-safe: search parameters are passed per call, not set on the shared index.
    """
    faiss = faiss_module()
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    k = min(k, index.ntotal)
    kind = params["type"]
    if kind == "flat":
        return index.search(queries, k)
    if kind == "hnsw":
        return index.search(
            queries, k, params=faiss.SearchParametersHNSW(efSearch=max(params["ef_search"], k))
        )
    depth = min(k * params["rerank"], index.ntotal)
    scores, ids = index.search(queries, depth, params=faiss.SearchParametersIVF(nprobe=params["nprobe"]))
    if params["rerank"] <= 1 or vectors is None:
        return scores[:, :k], ids[:, :k]
    out_scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
    out_ids = np.full((len(queries), k), -1, dtype=np.int64)
    for row, (query, candidates) in enumerate(zip(queries, ids, strict=True)):
        candidates = np.sort(candidates[candidates >= 0])
        if not len(candidates):
            continue
        rows = vectors(candidates) if callable(vectors) else vectors[candidates]
        exact = np.asarray(rows, dtype=np.float32) @ query
        best = np.argsort(-exact, kind="stable")[:k]
        out_scores[row, : len(best)] = exact[best]
        out_ids[row, : len(best)] = candidates[best]
    return out_scores, out_ids
