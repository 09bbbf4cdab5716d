"""BM25 query scoring: a compiled kernel (numba, optional) and the NumPy fallback, with identical results.

Both rank by each passage's float64 sum of its query terms' float32 weights, added in query-term order (the
same float64 as scoring the whole corpus gives), and return the ``k`` best passages by (score descending,
corpus order).

The fallback adds the postings into a float64 buffer with NumPy fancy indexing. The kernel halves that memory
traffic and still returns the exact float64 ranking, in the manner of a filter-then-verify top-k:

1. it adds every posting into a **float32** buffer (as ``bm25s``' numba backend does), marking the blocks of
   64 passages it touched;
2. one pass over the touched blocks keeps a heap of the k best float32 sums. A float32 sum of T non-negative
   weights is within ``T * 2**-24 * S`` of the exact sum (Higham, *Accuracy and Stability of Numerical
   Algorithms*, 2002, eq. 4.4), S bounded by the sum of the terms' highest weights; with ``e`` that bound, the
   k-th best float32 sum ``f`` is within ``e`` of the exact k-th best score, so every passage of the exact top
   k has a float32 sum of at least ``f - 2e``. Only those passages (the kernel uses 4x the bound) are
   **verified**: their float64 sums are recomputed, in query-term order, by galloping through each term's
   ascending postings, and compete in a heap by (score, corpus order). Each touched block is first moved out
   of the buffer (leaving it zero) by one branchless, vectorized sweep that also counts its sums within
   reach; most blocks have none and need nothing more. Any k passages bound ``f`` from below, so the pass
   starts from the k-th best sum among the passages of the query's rarest term rather than from zero.

So the result is the fallback's, bit for bit, while the verified passages are about k plus near-ties. The
kernel releases the GIL. Installing the ``fast`` extra (numba) selects it; ``RAGSUITE_BM25_KERNEL=numpy``
forces the fallback.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import queue
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache

import numpy as np


@cache
def _numba_installed() -> bool:
    return importlib.util.find_spec("numba") is not None


def kernel_name() -> str:
    """``"numba"`` when the compiled kernel is in use, else ``"numpy"``."""
    if not _numba_installed() or os.environ.get("RAGSUITE_BM25_KERNEL", "").lower() == "numpy":
        return "numpy"
    return "numba"


class Workspace:
    """Per-query scratch arrays of corpus length, reused and all zero between queries: the NumPy path's
    float64 scores; the compiled kernel's float32 scores and touched-block flags (each made on first use)."""

    def __init__(self, n: int) -> None:
        self._n = n
        self._scores: np.ndarray | None = None
        self._scores32: np.ndarray | None = None
        self._dirty: np.ndarray | None = None

    @property
    def scores(self) -> np.ndarray:
        if self._scores is None:
            self._scores = np.zeros(self._n, dtype=np.float64)
        return self._scores

    @property
    def scores32(self) -> np.ndarray:
        if self._scores32 is None:
            self._scores32 = np.zeros(self._n, dtype=np.float32)
        return self._scores32

    @property
    def dirty(self) -> np.ndarray:
        if self._dirty is None:
            # Only the compiled kernel uses these flags, so numba is already imported (or is about to be).
            from ragsuite.retrieval.bm25_numba import BLOCK_BITS

            self._dirty = np.zeros((self._n >> BLOCK_BITS) + 1, dtype=np.uint8)
        return self._dirty


class Workspaces:
    """At most one :class:`Workspace` per CPU in use at a time; threads beyond that wait for a free one
    (they would only contend for the CPUs anyway)."""

    def __init__(self, n: int) -> None:
        self._n = n
        self._free: queue.SimpleQueue[Workspace] = queue.SimpleQueue()
        self._created = 0
        self._limit = max(2, os.cpu_count() or 2)
        self._lock = threading.Lock()

    def _take(self) -> Workspace:
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            if self._created < self._limit:
                self._created += 1
                return Workspace(self._n)
        return self._free.get()

    @contextmanager
    def borrow(self) -> Iterator[Workspace]:
        """A workspace whose scores are all zero; returned to the pool only if the query finished (an
        interrupted query may leave scores behind, so its workspace is dropped rather than reused)."""
        workspace = self._take()
        try:
            yield workspace
        except BaseException:
            with self._lock:
                self._created -= 1
            raise
        self._free.put(workspace)


#: Postings per passage from which scoring every passage beats tracking the touched ones, per kernel (measured
#: with ``benchmarks/scale.py``'s 1M corpus: NumPy's bincount wins from about 1 in 4; the compiled kernel then
#: only skips marking touched blocks, which is cheap, so it goes dense only past two postings per passage).
DENSE_POSTINGS_SHARE = {"numpy": 0.25, "numba": 2.0}


def dense_pays(postings: int, n_passages: int, kernel: str) -> bool:
    """Whether a query reading ``postings`` postings is scored densely (every passage) or sparsely."""
    return postings >= DENSE_POSTINGS_SHARE[kernel] * n_passages


def top_k_numpy(
    indptr: np.ndarray,
    indices: np.ndarray,
    weights: np.ndarray,
    terms: np.ndarray,
    workspace: Workspace,
    k: int,
    base: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Passage numbers and scores of the best ``k`` passages scoring above ``base``, best first."""
    buffer = workspace.scores
    spans = [(int(indptr[t]), int(indptr[t + 1])) for t in terms.tolist()]
    if dense_pays(sum(hi - lo for lo, hi in spans), len(buffer), "numpy"):
        # One bincount over every posting, in query-term order: the same float64 sums, no scattered reads.
        docs = np.concatenate([indices[lo:hi] for lo, hi in spans])
        totals = np.bincount(
            docs, weights=np.concatenate([weights[lo:hi] for lo, hi in spans]), minlength=len(buffer)
        )
        totals += base
        candidates = np.flatnonzero(totals > base)
        scores = totals[candidates]
    else:
        touched = []
        for lo, hi in spans:  # a term's postings hold each passage once: no repeated index below
            docs = np.asarray(indices[lo:hi])
            buffer[docs] += weights[lo:hi]
            touched.append(docs)
        candidates = np.concatenate(touched) if touched else np.zeros(0, dtype=np.int32)
        scores = buffer[candidates] + base
        buffer[candidates] = 0.0
        above = scores > base
        candidates, scores = candidates[above], scores[above]
    # A passage appears once per query term it matched: the k*T best entries hold the k best passages.
    keep = k * max(1, len(terms))
    if len(scores) > keep:
        threshold = scores[np.argpartition(-scores, keep - 1)[:keep]].min()
        wanted = scores >= threshold
        candidates, scores = candidates[wanted], scores[wanted]
    candidates, first = np.unique(candidates, return_index=True)
    scores = scores[first]
    order = np.lexsort((candidates, -scores))[:k]
    return candidates[order].astype(np.int64), scores[order]


@dataclass(frozen=True)
class Rankings:
    """The top ``k`` of many queries: row ``q`` holds query q's passage numbers and scores, best first, in its
    first ``counts[q]`` columns."""

    docs: np.ndarray  # (queries, k) int64
    scores: np.ndarray  # (queries, k) float64
    counts: np.ndarray  # (queries,) int64

    @classmethod
    def empty(cls, n: int, k: int) -> Rankings:
        return cls(np.zeros((n, k), dtype=np.int64), np.zeros((n, k)), np.zeros(n, dtype=np.int64))

    def rows(self, lo: int, hi: int) -> Rankings:
        """Rows lo to hi (a view: filling it fills these rows)."""
        return Rankings(self.docs[lo:hi], self.scores[lo:hi], self.counts[lo:hi])

    def __len__(self) -> int:
        return len(self.counts)

    def row(self, q: int) -> tuple[np.ndarray, np.ndarray]:
        """Query q's passage numbers and scores."""
        return self.docs[q, : self.counts[q]], self.scores[q, : self.counts[q]]

    def filled(self) -> tuple[np.ndarray, np.ndarray]:
        """Every row's passage numbers and scores, concatenated in row order (unfilled columns left out)."""
        mask = np.arange(self.docs.shape[1]) < self.counts[:, None]
        return self.docs[mask], self.scores[mask]


def flatten(term_lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Many queries' term ids as one array and the offsets where each query's begin (the kernel's input)."""
    offsets = np.zeros(len(term_lists) + 1, dtype=np.int64)
    np.cumsum([len(t) for t in term_lists], out=offsets[1:])
    terms = np.fromiter(itertools.chain.from_iterable(term_lists), dtype=np.int64, count=int(offsets[-1]))
    return terms, offsets


def top_k_many(
    indptr: np.ndarray,
    indices: np.ndarray,
    weights: np.ndarray,
    terms: np.ndarray,
    offsets: np.ndarray,
    bases: np.ndarray,
    workspace: Workspace,
    out: Rankings,
    max_weights: np.ndarray | None = None,
) -> None:
    """Fills ``out`` with each query's best ``k`` passages (k: its width) scoring above the query's base, best
    first, with the selected kernel (see :func:`kernel_name`). Query q's term ids are
    ``terms[offsets[q]:offsets[q + 1]]``; the compiled kernel releases the GIL while it runs."""
    k = out.docs.shape[1]
    if kernel_name() == "numpy":
        for q in range(len(out)):
            docs, scores = top_k_numpy(
                indptr, indices, weights, terms[offsets[q] : offsets[q + 1]], workspace, k, float(bases[q])
            )
            out.counts[q] = len(docs)
            out.docs[q, : len(docs)], out.scores[q, : len(docs)] = docs, scores
        return
    # Imported on first use: numba takes ~0.4 s to import; the kernel itself comes from numba's disk cache.
    from ragsuite.retrieval.bm25_numba import many

    if max_weights is None:
        max_weights = np.full(len(indptr) - 1, -1.0, dtype=np.float32)
    many(
        indptr, indices, weights, max_weights, terms, offsets, np.asarray(bases, dtype=np.float64),
        workspace.scores32, workspace.dirty, k, DENSE_POSTINGS_SHARE["numba"],
        out.docs, out.scores, out.counts,
    )  # fmt: skip
