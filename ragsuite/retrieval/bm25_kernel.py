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
    """Per-query scratch arrays of corpus length, reused: scores (all zero between queries), a touched-mark
    per passage, and the list of touched passages."""

    def __init__(self, n: int) -> None:
        self.scores = np.zeros(n, dtype=np.float64)
        self.stamp = np.zeros(n, dtype=np.int32)
        self.touched = np.zeros(n, dtype=np.int32)
        self.epoch = 0

    def next_epoch(self) -> int:
        self.epoch += 1
        if self.epoch >= 2**31 - 1:  # marks wrap around: clear them once
            self.stamp[:] = 0
            self.epoch = 1
        return self.epoch


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
    touched = []
    for term in terms.tolist():  # a term's postings hold each passage once: no repeated index below
        lo, hi = int(indptr[term]), int(indptr[term + 1])
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
    def top_k(indptr, indices, weights, terms, scores, stamp, touched, epoch, k, base):  # type: ignore[no-untyped-def]
        count = 0
        for t in terms:
            for p in range(indptr[t], indptr[t + 1]):
                d = indices[p]
                if stamp[d] != epoch:
                    stamp[d] = epoch
                    scores[d] = np.float64(weights[p])  # 0.0 + w == w: the same sum as from zero
                    touched[count] = d
                    count += 1
                else:
                    scores[d] += np.float64(weights[p])
        # A min-heap (worst at the root) of the k best by (score desc, passage asc).
        heap_scores = np.empty(k, dtype=np.float64)
        heap_docs = np.empty(k, dtype=np.int64)
        size = 0
        for i in range(count):
            d = np.int64(touched[i])
            s = scores[d] + base
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
        for i in range(count):  # leave the buffer all zero, as the NumPy path expects it
            scores[touched[i]] = 0.0
        return heap_docs[:size].copy(), heap_scores[:size].copy()

    return top_k


_compiled: Any = None
_compile_lock = threading.Lock()


def top_k_numba(
    indptr: np.ndarray,
    indices: np.ndarray,
    weights: np.ndarray,
    terms: np.ndarray,
    workspace: Workspace,
    k: int,
    base: float,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`top_k_numpy`, compiled (the GIL is released while it runs)."""
    global _compiled
    if _compiled is None:
        with _compile_lock:
            if _compiled is None:
                _compiled = _compile()
    docs, scores = _compiled(
        indptr, indices, weights, terms, workspace.scores, workspace.stamp, workspace.touched,
        workspace.next_epoch(), k, base,
    )  # fmt: skip
    order = np.lexsort((docs, -scores))
    return docs[order], scores[order]


def top_k(
    indptr: np.ndarray,
    indices: np.ndarray,
    weights: np.ndarray,
    terms: np.ndarray,
    workspace: Workspace,
    k: int,
    base: float,
) -> tuple[np.ndarray, np.ndarray]:
    """The best ``k`` passages above ``base`` with the selected implementation (see :func:`kernel_name`)."""
    search = top_k_numba if kernel_name() == "numba" else top_k_numpy
    return search(indptr, indices, weights, terms, workspace, k, base)
