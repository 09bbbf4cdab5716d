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
   reach; most blocks have none and need nothing more.

So the result is the fallback's, bit for bit, while the verified passages are about k plus near-ties. The
kernel releases the GIL. ``pip install 'ragsuite[fast]'`` (numba) selects it; ``RAGSUITE_BM25_KERNEL=numpy``
forces the fallback.
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


#: The compiled kernel marks touched passages by blocks of ``2**BLOCK_BITS``.
BLOCK_BITS = 6


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


def _compile() -> Any:
    import numba  # imported on first use: it takes ~0.4 s

    njit = numba.njit(nogil=True, cache=True)
    block_bits = BLOCK_BITS

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
    def push(heap_scores, heap_docs, size, k, s, d):  # type: ignore[no-untyped-def]
        """Offer (s, d) to a min-heap (worst at the root) of the k best by (score desc, passage asc)."""
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
        return size

    @njit
    def term_max(indptr, weights, max_weights, t):  # type: ignore[no-untyped-def]
        # Filled on a term's first query (one sequential pass, cheaper than scoring its postings once);
        # threads racing here store the same value.
        m = max_weights[t]
        if m < 0:
            m = np.float32(0.0)
            for p in range(indptr[t], indptr[t + 1]):
                if weights[p] > m:
                    m = weights[p]
            max_weights[t] = m
        return np.float64(m)

    @njit
    def seek(indices, lo, hi, d):  # type: ignore[no-untyped-def]
        """The first position in [lo, hi) of the ascending ``indices`` holding d or more (hi if none),
        galloping from lo: a walk over ascending d costs O(log gap) per step."""
        if lo >= hi or indices[lo] >= d:
            return lo
        step = 1
        while lo + step < hi and indices[lo + step] < d:
            step *= 2
        left = lo + step // 2 + 1  # indices[lo + step // 2] < d
        right = min(lo + step, hi)
        while left < right:
            mid = (left + right) // 2
            if indices[mid] < d:
                left = mid + 1
            else:
                right = mid
        return left

    @njit
    def score_exactly(
        indptr,
        indices,
        weights,
        terms,
        position,
        docs,
        sums,
        count,
        collect,
        base,
        heap_scores,
        heap_docs,
        size,
        k,
    ):  # type: ignore[no-untyped-def]
        """Offers the exact score of each of the ascending docs[:count] whose float32 sum reaches
        ``collect`` to the heap: the float64 sum of its weights in query-term order, as the NumPy path sums
        it (one galloping walk per term, ``position`` holding where each term's walk is)."""
        for c in range(count):
            if sums[c] < collect:
                continue
            d = docs[c]
            exact = 0.0
            for j in range(len(terms)):
                hi = indptr[terms[j] + 1]
                p = seek(indices, position[j], hi, d)
                position[j] = p
                if p < hi and indices[p] == d:
                    exact += np.float64(weights[p])
            exact += base
            if exact > base:
                size = push(heap_scores, heap_docs, size, k, exact, d)
        return size

    @njit
    def one_query(
        indptr, indices, weights, max_weights, terms, scores, dirty, k, base, dense, out_docs, out_scores
    ):  # type: ignore[no-untyped-def]
        n = len(scores)
        n_blocks = (n + (1 << block_bits) - 1) >> block_bits
        # 1. Every posting into the float32 buffer (half the memory traffic of float64), marking the
        # 64-passage blocks it touches, so the scan below skips the untouched ones.
        if dense:
            dirty[:n_blocks] = 1
            for t in terms:
                for p in range(indptr[t], indptr[t + 1]):
                    scores[indices[p]] += weights[p]
        else:
            for t in terms:
                for p in range(indptr[t], indptr[t + 1]):
                    d = indices[p]
                    scores[d] += weights[p]
                    dirty[d >> block_bits] = 1
        # ``slack``: 4x the float32 rounding bound of the module docstring (S <= the sum of the terms'
        # highest weights); a passage of the exact top k has a float32 sum of at least the k-th best's
        # minus 2 slack.
        most = 0.0
        for t in terms:
            most += term_max(indptr, weights, max_weights, t)
        slack = (len(terms) + 1) * most * 2.0**-22
        # 2. One pass over the touched blocks, in passage order: a heap of the k best float32 sums gives the
        # running k-th best; a passage within 2 slack of it (rarely true, so the test is well predicted) gets
        # its exact float64 score, summed in query-term order as the NumPy path sums it (one galloping walk
        # per term, as passages ascend), and competes for the k best by (exact score desc, passage asc).
        n_terms = len(terms)
        position = np.empty(n_terms, dtype=np.int64)
        for j in range(n_terms):
            position[j] = indptr[terms[j]]
        heap = np.empty(k, dtype=np.float32)
        size32 = 0
        smallest = np.float32(1e-45)  # the least positive float32: `s >= collect` implies s > 0
        floor = np.float32(0.0)
        collect = smallest
        heap_scores = np.empty(k, dtype=np.float64)
        heap_docs = np.empty(k, dtype=np.int64)
        size = 0
        capacity = 1024 + 4 * k
        cand_docs = np.empty(capacity, dtype=np.int64)
        cand_sums = np.empty(capacity, dtype=np.float32)
        count = 0
        block = np.empty(1 << block_bits, dtype=np.float32)
        for b in range(n_blocks):
            if not dirty[b]:
                continue
            dirty[b] = 0
            lo, hi = b << block_bits, min(n, (b + 1) << block_bits)
            # One branchless sweep (which LLVM vectorizes) moves the block out of the buffer, leaving it all
            # zero, and counts the sums within reach; most blocks have none and are done.
            reach = 0
            for j in range(hi - lo):
                s = scores[lo + j]
                block[j] = s
                scores[lo + j] = 0.0
                reach += np.int32(s >= collect)
            if reach == 0:
                continue
            for j in range(hi - lo):
                d = lo + j
                s = block[j]
                if s >= collect:
                    if s > floor:
                        if size32 < k:  # sift up
                            j = size32
                            heap[j] = s
                            size32 += 1
                            while j > 0 and heap[(j - 1) // 2] > heap[j]:
                                heap[(j - 1) // 2], heap[j] = heap[j], heap[(j - 1) // 2]
                                j = (j - 1) // 2
                        else:  # replace the root, sift down
                            heap[0] = s
                            j = 0
                            while True:
                                child = 2 * j + 1
                                if child >= k:
                                    break
                                if child + 1 < k and heap[child + 1] < heap[child]:
                                    child += 1
                                if heap[child] < heap[j]:
                                    heap[child], heap[j] = heap[j], heap[child]
                                    j = child
                                else:
                                    break
                        if size32 == k:
                            floor = heap[0]
                            collect = np.float32(max(np.float64(floor) - 2.0 * slack, np.float64(smallest)))
                    cand_docs[count], cand_sums[count] = d, s
                    count += 1
                    if count == capacity:  # keep those still near the risen k-th best; score them if many
                        kept = 0
                        for c in range(count):
                            if cand_sums[c] >= collect:
                                cand_docs[kept], cand_sums[kept] = cand_docs[c], cand_sums[c]
                                kept += 1
                        count = kept
                        if count > capacity // 2:
                            size = score_exactly(
                                indptr, indices, weights, terms, position, cand_docs, cand_sums, count,
                                smallest, base, heap_scores, heap_docs, size, k,
                            )  # fmt: skip
                            count = 0
        size = score_exactly(
            indptr, indices, weights, terms, position, cand_docs, cand_sums, count, collect, base,
            heap_scores, heap_docs, size, k,
        )  # fmt: skip
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
        max_weights,
        terms,
        offsets,
        bases,
        scores,
        dirty,
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
                indptr, indices, weights, max_weights, query_terms, scores, dirty, k, bases[q], dense,
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
    max_weights: np.ndarray | None = None,
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
    if max_weights is None:
        max_weights = np.full(len(indptr) - 1, -1.0, dtype=np.float32)
    _compiled(
        indptr, indices, weights, max_weights, terms, offsets, np.asarray(bases, dtype=np.float64),
        workspace.scores32, workspace.dirty, k, DENSE_POSTINGS_SHARE["numba"],
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
    max_weights: np.ndarray | None = None,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each query (its term ids and base score): the passage numbers and scores of its best ``k``
    passages scoring above the base, best first, with the selected kernel (see :func:`kernel_name`)."""
    if kernel_name() == "numba":
        return top_k_many_numba(indptr, indices, weights, term_lists, bases, workspace, k, max_weights)
    return [
        top_k_numpy(indptr, indices, weights, terms, workspace, k, float(base))
        for terms, base in zip(term_lists, bases, strict=True)
    ]
