"""BM25 query scoring: a compiled kernel (numba, optional) and the NumPy fallback, with identical results.

Both add a query's term weights into a float64 score buffer term by term (so every passage's score is the same
float64 sum, in the same order, as scoring the whole corpus would give) and return the ``k`` best passages by
(score descending, corpus order). The kernel does it in one pass over the postings with a k-sized heap and
releases the GIL; the fallback does it with NumPy fancy indexing. ``pip install 'ragsuite[fast]'`` (numba)
selects the kernel; ``RAGSUITE_BM25_KERNEL=numpy`` forces the fallback.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

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
    """Per-query scratch arrays of corpus length, reused: scores (all zero between queries) and the list of
    touched passages."""

    def __init__(self, n: int) -> None:
        self.scores = np.zeros(n, dtype=np.float64)
        self.touched = np.zeros(n + 1, dtype=np.int32)  # one spare slot: the branchless marking writes ahead


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
#: with ``benchmarks/scale.py``'s 1M corpus: NumPy's bincount wins from about 1 in 4; the compiled kernel's
#: bookkeeping is cheap enough that a pass over the whole buffer pays only past two postings per passage).
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


def _compile() -> Any:
    import numba  # imported on first use: it takes ~0.4 s

    njit = numba.njit(nogil=True, cache=True)

    @njit
    def worse(score_a: float, doc_a: int, score_b: float, doc_b: int) -> bool:
        return score_a < score_b or (score_a == score_b and doc_a > doc_b)

    @njit
    def sift_down(heap_scores, heap_docs, size, i):  # type: ignore[no-untyped-def]
        while True:
            child = 2 * i + 1
            if child >= size:
                return
            if child + 1 < size and worse(
                heap_scores[child + 1], heap_docs[child + 1], heap_scores[child], heap_docs[child]
            ):
                child += 1
            if worse(heap_scores[child], heap_docs[child], heap_scores[i], heap_docs[i]):
                heap_scores[i], heap_scores[child] = heap_scores[child], heap_scores[i]
                heap_docs[i], heap_docs[child] = heap_docs[child], heap_docs[i]
                i = child
            else:
                return

    @njit
    def one_query(indptr, indices, weights, terms, scores, touched, k, base, dense, out_docs, out_scores):  # type: ignore[no-untyped-def]
        count = 0
        if dense:  # every passage is scanned below: no bookkeeping of the touched ones
            for t in terms:
                for p in range(indptr[t], indptr[t + 1]):
                    scores[indices[p]] += np.float64(weights[p])
            count = len(scores)
        else:
            # Weights are never negative, so a passage's score leaves 0.0 at its first positive weight and
            # never returns to it: that moment marks it touched, once. Written without a branch (a
            # half-and-half branch mispredicts at every other posting and costs 3x).
            for t in terms:
                for p in range(indptr[t], indptr[t + 1]):
                    d = indices[p]
                    w = np.float64(weights[p])
                    old = scores[d]
                    touched[count] = d
                    count += (old == 0.0) & (w != 0.0)
                    scores[d] = old + w
        # A min-heap (worst at the root) of the k best by (score desc, passage asc).
        heap_scores = np.empty(k, dtype=np.float64)
        heap_docs = np.empty(k, dtype=np.int64)
        size = 0
        for i in range(count):
            d = np.int64(i) if dense else np.int64(touched[i])
            s = scores[d] + base
            scores[d] = 0.0  # leave the buffer all zero, as the NumPy path expects it
            if not s > base:
                continue
            if size < k:
                j = size
                heap_scores[j], heap_docs[j] = s, d
                size += 1
                while j > 0:
                    parent = (j - 1) // 2
                    if worse(heap_scores[j], heap_docs[j], heap_scores[parent], heap_docs[parent]):
                        heap_scores[j], heap_scores[parent] = heap_scores[parent], heap_scores[j]
                        heap_docs[j], heap_docs[parent] = heap_docs[parent], heap_docs[j]
                        j = parent
                    else:
                        break
            elif worse(heap_scores[0], heap_docs[0], s, d):
                heap_scores[0], heap_docs[0] = s, d
                sift_down(heap_scores, heap_docs, size, 0)
        # Best first: insertion sort of the (at most k) heap entries.
        for i in range(size):
            j = i
            while j > 0 and worse(out_scores[j - 1], out_docs[j - 1], heap_scores[i], heap_docs[i]):
                out_scores[j], out_docs[j] = out_scores[j - 1], out_docs[j - 1]
                j -= 1
            out_scores[j], out_docs[j] = heap_scores[i], heap_docs[i]
        return size

    @njit
    def many(
        indptr,
        indices,
        weights,
        terms,
        offsets,
        bases,
        scores,
        touched,
        k,
        dense_share,
        out_docs,
        out_scores,
        out_counts,
    ):  # type: ignore[no-untyped-def]
        for q in range(len(offsets) - 1):
            query_terms = terms[offsets[q] : offsets[q + 1]]
            postings = 0
            for t in query_terms:
                postings += indptr[t + 1] - indptr[t]
            dense = postings >= dense_share * len(scores)
            out_counts[q] = one_query(
                indptr, indices, weights, query_terms, scores, touched, k, bases[q], dense,
                out_docs[q], out_scores[q],
            )  # fmt: skip

    return many


_compiled: Any = None
_compile_lock = threading.Lock()


def top_k_many_numba(
    indptr: np.ndarray,
    indices: np.ndarray,
    weights: np.ndarray,
    term_lists: list[np.ndarray],
    bases: np.ndarray,
    workspace: Workspace,
    k: int,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`top_k_numpy` for many queries in one compiled call (the GIL is released while it runs)."""
    global _compiled
    if _compiled is None:
        with _compile_lock:
            if _compiled is None:
                _compiled = _compile()
    n = len(term_lists)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(t) for t in term_lists], out=offsets[1:])
    terms = np.concatenate(term_lists) if n else np.zeros(0, dtype=np.int64)
    out_docs = np.zeros((n, k), dtype=np.int64)
    out_scores = np.zeros((n, k), dtype=np.float64)
    out_counts = np.zeros(n, dtype=np.int64)
    _compiled(
        indptr, indices, weights, terms, offsets, np.asarray(bases, dtype=np.float64), workspace.scores,
        workspace.touched, k, DENSE_POSTINGS_SHARE["numba"],
        out_docs, out_scores, out_counts,
    )  # fmt: skip
    return [(out_docs[q, : out_counts[q]], out_scores[q, : out_counts[q]]) for q in range(n)]


def top_k_many(
    indptr: np.ndarray,
    indices: np.ndarray,
    weights: np.ndarray,
    term_lists: list[np.ndarray],
    bases: np.ndarray,
    workspace: Workspace,
    k: int,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each query (its term ids and base score): the passage numbers and scores of its best ``k``
    passages scoring above the base, best first, with the selected kernel (see :func:`kernel_name`)."""
    if kernel_name() == "numba":
        return top_k_many_numba(indptr, indices, weights, term_lists, bases, workspace, k)
    return [
        top_k_numpy(indptr, indices, weights, terms, workspace, k, float(base))
        for terms, base in zip(term_lists, bases, strict=True)
    ]
