"""In-memory retrievers for tests and examples: no index, no files, fully predictable.

:class:`KeywordRetriever` ranks a handful of passages by shared words with the query, so a test can steer
what each query finds by choosing its words. :class:`ListRetriever` answers from a fixed table (query ->
passage ids, or a callable), for tests that need exact control. Both record every query they receive.

Example:
    >>> from ragsuite.retrieval.base import Passage
    >>> corpus = [Passage("p1", "Stettin", "A city on the Oder."), Passage("p2", "Oslo", "A capital.")]
    >>> KeywordRetriever(corpus)("where is stettin", 1)[0].id
    'p1'
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ragsuite.errors import ConfigError, RetrievalError
from ragsuite.retrieval.base import Passage

_WORD = re.compile(r"\w+")
# Words too common to count as a match; without this almost every query matches every passage.
_STOPWORDS = frozenset(
    "a an and are as at be by did do does for from had has have he her his how in is it its of on or she "
    "that the their there this to was were what when where which who whom whose why will with".split()
)


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOPWORDS}


class _Recording:
    """Shared bookkeeping: the queries seen, an optional delay, thread safety."""

    def __init__(self, *, delay: float = 0.0) -> None:
        if delay < 0:
            raise ConfigError(f"delay must be >= 0, not {delay}")
        self.delay = delay
        self.queries: list[str] = []
        self._lock = threading.Lock()

    def _note(self, query: str, k: int) -> None:
        if k < 1:
            raise RetrievalError(f"k must be >= 1, not {k}")
        with self._lock:
            self.queries.append(query)
        if self.delay:
            time.sleep(self.delay)

    def batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        return [self(query, k) for query in queries]  # type: ignore[operator]


class KeywordRetriever(_Recording):
    """Ranks passages by the number of distinct non-stopword words they share with the query.

    Ties keep corpus order; passages sharing no word are never returned, so an unrelated query gets ``[]``.

    Args:
        passages: The corpus.
        delay: Seconds to sleep per call (to make concurrency observable).

    Attributes:
        queries: Every query received, in order.
    """

    def __init__(self, passages: Sequence[Passage], *, delay: float = 0.0) -> None:
        super().__init__(delay=delay)
        self.passages = list(passages)
        self._index = [_words(f"{p.title} {p.text}") for p in self.passages]

    def __call__(self, query: str, k: int) -> list[Passage]:
        self._note(query, k)
        terms = _words(query)
        scored = [(len(terms & words), i) for i, words in enumerate(self._index)]
        ranked = sorted((item for item in scored if item[0] > 0), key=lambda item: (-item[0], item[1]))
        return [self.passages[i].with_score(score) for score, i in ranked[:k]]

    def describe(self) -> dict[str, Any]:
        return {"kind": "keyword", "spec": "keyword:in-memory", "passages": len(self.passages)}


class ListRetriever(_Recording):
    """Answers each query from a fixed table or a function.

    Args:
        passages: The corpus, looked up by id.
        results: Either ``{query: [passage ids]}`` (unknown queries get ``default``) or a callable
            ``(query, k) -> [passage ids]``.
        default: Ids returned for a query missing from the table.
        error: When set, every call raises this exception instead (a failing backend).
        delay: Seconds to sleep per call.

    Attributes:
        queries: Every query received, in order.
    """

    def __init__(
        self,
        passages: Sequence[Passage],
        results: Mapping[str, Sequence[str]] | Callable[[str, int], Sequence[str]] | None = None,
        *,
        default: Sequence[str] = (),
        error: Exception | None = None,
        delay: float = 0.0,
    ) -> None:
        super().__init__(delay=delay)
        self.by_id = {p.id: p for p in passages}
        self.results = results or {}
        self.default = list(default)
        self.error = error
        unknown = [pid for pid in self.default if pid not in self.by_id]
        if isinstance(self.results, Mapping):
            unknown += [pid for ids in self.results.values() for pid in ids if pid not in self.by_id]
        if unknown:
            raise ConfigError(f"ListRetriever: unknown passage ids {sorted(set(unknown))}")

    def __call__(self, query: str, k: int) -> list[Passage]:
        self._note(query, k)
        if self.error is not None:
            raise self.error
        if callable(self.results):
            ids = list(self.results(query, k))
        else:
            ids = list(self.results.get(query, self.default))
        n = len(ids)
        return [self.by_id[pid].with_score(float(n - rank)) for rank, pid in enumerate(ids[:k])]

    def describe(self) -> dict[str, Any]:
        return {"kind": "list", "spec": "list:in-memory", "passages": len(self.by_id)}


__all__ = ["KeywordRetriever", "ListRetriever"]
