"""The compiled BM25 query kernel (numba), described in :mod:`ragsuite.retrieval.bm25_kernel`.

Imported only when numba is installed, and only by :mod:`ragsuite.retrieval.bm25_kernel` (never the reverse:
this module is the lower one). The functions are module-level, so numba's on-disk cache serves every
later process: jitted closures would be new objects in each process and be compiled again (about 3 s before a
process's first query).
"""

from __future__ import annotations

import numba
import numpy as np

njit = numba.njit(nogil=True, cache=True)

#: Touched passages are marked by blocks of ``2**BLOCK_BITS`` (a compile-time constant of the kernel).
BLOCK_BITS = 6


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
def replace_least(heap, k, s):  # type: ignore[no-untyped-def]
    """Put s in place of the root of a full min-heap of k float32 sums, and sift it down."""
    heap[0] = s
    j = 0
    while True:
        child = 2 * j + 1
        if child >= k:
            return
        if child + 1 < k and heap[child + 1] < heap[child]:
            child += 1
        if heap[child] < heap[j]:
            heap[child], heap[j] = heap[j], heap[child]
            j = child
        else:
            return


@njit
def first_floor(indptr, indices, terms, scores, k):  # type: ignore[no-untyped-def]
    """A lower bound on the k-th best float32 sum, before the scan: the k-th best sum among the passages of
    the query term with the fewest postings (at least k, and few enough to read at once; 0 if none).

    Any k distinct passages bound the k-th best from below, and a rare query term's passages are the likely
    best, so the scan can start near its final threshold and skip most blocks outright.
    """
    best, fewest = -1, min(len(scores) // 8, 8192)
    for t in terms:
        postings = indptr[t + 1] - indptr[t]
        if k <= postings <= fewest:
            best, fewest = t, postings
    if best < 0:
        return np.float32(0.0)
    heap = np.zeros(k, dtype=np.float32)  # a min-heap of the k best sums (0 until filled)
    for p in range(indptr[best], indptr[best + 1]):
        s = scores[indices[p]]
        if s > heap[0]:
            replace_least(heap, k, s)
    return heap[0]


@njit
def one_query(
    indptr, indices, weights, max_weights, terms, scores, dirty, k, base, dense, out_docs, out_scores
):  # type: ignore[no-untyped-def]
    n = len(scores)
    n_blocks = (n + (1 << BLOCK_BITS) - 1) >> BLOCK_BITS
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
                dirty[d >> BLOCK_BITS] = 1
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
    # Only sums within reach of the k-th best can be in the top k: start from a first bound on it.
    bound = np.float64(first_floor(indptr, indices, terms, scores, k))
    collect = np.float32(max(bound - 2.0 * slack, np.float64(smallest)))
    heap_scores = np.empty(k, dtype=np.float64)
    heap_docs = np.empty(k, dtype=np.int64)
    size = 0
    capacity = 1024 + 4 * k
    cand_docs = np.empty(capacity, dtype=np.int64)
    cand_sums = np.empty(capacity, dtype=np.float32)
    count = 0
    block = np.empty(1 << BLOCK_BITS, dtype=np.float32)
    for b in range(n_blocks):
        if not dirty[b]:
            continue
        dirty[b] = 0
        lo, hi = b << BLOCK_BITS, min(n, (b + 1) << BLOCK_BITS)
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
                    else:
                        replace_least(heap, k, s)
                    if size32 == k:
                        floor = heap[0]
                        collect = max(collect, np.float32(np.float64(floor) - 2.0 * slack))
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
