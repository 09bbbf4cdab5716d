"""HTTP client of the ColBERTv2 server protocol (the one ``dspy.ColBERTv2`` speaks).

Protocol:
    ``GET  /api/search?query=Q&k=K``          -> ``{"topk": [{"text", "pid", "rank", "score", "prob"}, ...]}``
    ``POST /api/search {"query": Q, "k": K}`` -> the same (servers started with POST support)
    ``POST /api/search {"queries": [...], "k": K}`` -> ``{"results": [{"query", "topk"}, ...]}``
                                                  (ragsuite's own server, ``ragsuite serve-retriever``)
    ``GET  /health``                          -> ``{"status": "ok", ...}`` (ragsuite's server)
    An error reply is ``{"error": true, "message": ...}``.

``text`` is ``"title | body"``; this client splits it into :class:`Passage` fields.
"""

from __future__ import annotations

import contextvars
import json
import logging
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any, Literal

from ragsuite.aio import DaemonThreadPool
from ragsuite.errors import ConfigError, RetrievalError
from ragsuite.retrieval.base import COLBERT_QUERY_TOKENS, Passage

log = logging.getLogger("ragsuite.retrieval.colbert.client")

# The public ColBERTv2 servers and dspy.ColBERTv2 refuse k > 100.
SERVER_MAX_K = 100
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# Statuses meaning "this server has no POST/batch endpoint", after which batch() falls back to GETs.
_NO_BATCH_STATUSES = frozenset({400, 404, 405, 501})


class _HTTPFailure(Exception):
    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


def split_title(text: str) -> tuple[str, str]:
    """Split the server's ``"title | body"`` passage text; text without the separator has no title."""
    title, sep, body = text.partition(" | ")
    return (title.strip(), body) if sep else ("", text)


def _public_url(url: str) -> str:
    """The URL without user info or query string, safe to log and save."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class ColBERTv2Client:
    """A thread-safe retriever backed by a ColBERTv2 HTTP server.

    Args:
        url: The search endpoint, e.g. ``http://127.0.0.1:8893/api/search``; a bare ``http://host:port``
            gets ``/api/search`` appended. Hosted servers with another path (``.../wiki17_abstracts``) are
            used as given.
        timeout: Seconds to wait for each HTTP reply.
        retries: Extra attempts after a connection error, a timeout, a 5xx or a 429 reply.
        backoff: Seconds before the first retry; doubled (with jitter) for each further retry. A 429's
            ``Retry-After`` is honoured up to 30 s.
        method: ``"get"`` sends ``GET ?query=&k=``; ``"post"`` sends JSON bodies (``dspy.ColBERTv2(...,
            post_requests=True)`` style); ``"auto"`` uses GET for single queries and tries one batched POST
            for :meth:`batch`, falling back to concurrent GETs when the server has no batch endpoint.
        max_k: Largest k the server accepts (100 for the ColBERT servers); larger requests raise
            :class:`ConfigError` before anything is sent.
        batch_workers: Concurrent requests when :meth:`batch` falls back to one request per query.
        query_token_limit: Query tokens the server's encoder reads (ColBERTv2: 32); programs put what must
            survive first in a long retrieval text.

    Example:
        A ColBERT server on port 8893 (``ragsuite serve-retriever``, or the authors' server):

        >>> client = ColBERTv2Client("http://127.0.0.1:8893/api/search", timeout=5.0)
        >>> client.health()["status"]  # doctest: +SKIP
        'ok'
        >>> client("Who wrote Hamlet?", 3)[0].title  # doctest: +SKIP
        'Hamlet'
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.5,
        method: Literal["auto", "get", "post"] = "auto",
        max_k: int = SERVER_MAX_K,
        batch_workers: int = 8,
        query_token_limit: int | None = COLBERT_QUERY_TOKENS,
    ) -> None:
        parts = urllib.parse.urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"ColBERT server URL must look like http://host:port/api/search, not {url!r}")
        if parts.path in ("", "/"):
            parts = parts._replace(path="/api/search")
        if timeout <= 0:
            raise ConfigError(f"timeout must be > 0, not {timeout}")
        if retries < 0:
            raise ConfigError(f"retries must be >= 0, not {retries}")
        if backoff < 0:
            raise ConfigError(f"backoff must be >= 0, not {backoff}")
        if method not in ("auto", "get", "post"):
            raise ConfigError(f"method must be 'auto', 'get' or 'post', not {method!r}")
        if max_k < 1:
            raise ConfigError(f"max_k must be >= 1, not {max_k}")
        self.url = urllib.parse.urlunsplit(parts)
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.method = method
        self.max_k = int(max_k)
        self.batch_workers = max(1, int(batch_workers))
        self.query_token_limit = query_token_limit
        # Learned once per client: whether the server answers batched POSTs. A plain bool is safe to race on.
        self._batch_supported: bool | None = None if method == "auto" else method == "post"

    # -- public API ---------------------------------------------------------------------------------------

    def __call__(self, query: str, k: int) -> list[Passage]:
        """The top ``k`` passages for ``query``, best first.

        Raises:
            ConfigError: ``k`` is not in 1..max_k or the query is empty.
            RetrievalError: The server is unreachable after the retries, replied with an error or with
                something that is not the protocol.
        """
        self._check(query, k)
        try:
            if self.method == "post":
                reply = self._request("POST", self.url, {"query": query, "k": k})
            else:
                reply = self._request("GET", self._get_url(query, k))
        except _HTTPFailure as exc:
            raise self._error(exc) from None
        return self._passages(reply, k)

    def batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """Results for each query, in order: one batched POST when the server supports it, else one request
        per query (``batch_workers`` at a time)."""
        queries = list(queries)
        for query in queries:
            self._check(query, k)
        if not queries:
            return []
        if self._batch_supported is not False:
            # The first batch in "auto" mode is a probe: any failure means "send one query per request".
            probing = self.method == "auto" and self._batch_supported is None
            try:
                reply = self._request(
                    "POST", self.url, {"queries": queries, "k": k}, attempts=1 if probing else None
                )
            except (_HTTPFailure, RetrievalError) as exc:
                no_batch = isinstance(exc, _HTTPFailure) and exc.status in _NO_BATCH_STATUSES
                if not (probing or (self.method == "auto" and no_batch)):
                    raise self._error(exc) if isinstance(exc, _HTTPFailure) else exc from None
                log.info(
                    "%s did not answer a batched POST (%s); sending one query per request", self.url, exc
                )
                self._batch_supported = False
            else:
                results = reply.get("results")
                if isinstance(results, list) and len(results) == len(queries):
                    self._batch_supported = True
                    return [self._passages(r if isinstance(r, dict) else {}, k) for r in results]
                if self.method == "post":
                    raise RetrievalError(
                        f"ColBERT server {_public_url(self.url)} answered a batch of {len(queries)} queries "
                        "without a matching 'results' list"
                    )
                # A server that ignored "queries" (answered one query, or nothing useful): it cannot batch.
                self._batch_supported = False
        if len(queries) == 1:
            return [self(queries[0], k)]
        with DaemonThreadPool(min(self.batch_workers, len(queries)), name="colbert-client") as pool:
            futures = [pool.submit(contextvars.copy_context().run, self, q, k) for q in queries]
            return [f.result() for f in futures]

    def health(self) -> dict[str, Any]:
        """Check that the server answers: ``GET /health`` where it exists, else a one-passage search.

        Returns:
            The server's health reply (with ``"status": "ok"``) plus ``latency_s``.

        Raises:
            RetrievalError: The server is unreachable or unhealthy.
        """
        parts = urllib.parse.urlsplit(self.url)
        health_url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/health", "", ""))
        start = time.perf_counter()
        try:
            reply = self._request("GET", health_url, attempts=1)
        except _HTTPFailure as exc:
            if exc.status != 404:
                raise self._error(exc) from None
            # Upstream ColBERT servers have no /health: a tiny search proves the index answers.
            self("a", 1)
            reply = {"status": "ok", "endpoint": "search"}
        if reply.get("error") or reply.get("status", "ok") != "ok":
            raise RetrievalError(f"ColBERT server {_public_url(self.url)} is unhealthy: {reply}")
        return {**reply, "status": "ok", "latency_s": round(time.perf_counter() - start, 4)}

    def describe(self) -> dict[str, Any]:
        url = _public_url(self.url)
        return {
            "kind": "colbert-server",
            "spec": f"colbert-server:{url}",
            "url": url,
            "timeout": self.timeout,
            "retries": self.retries,
            "method": self.method,
            "max_k": self.max_k,
        }

    def __repr__(self) -> str:
        return f"ColBERTv2Client({_public_url(self.url)!r})"

    # -- internals ----------------------------------------------------------------------------------------

    def _get_url(self, query: str, k: int) -> str:
        joiner = "&" if urllib.parse.urlsplit(self.url).query else "?"
        return f"{self.url}{joiner}{urllib.parse.urlencode({'query': query, 'k': k})}"

    def _check(self, query: str, k: int) -> None:
        if not isinstance(query, str) or not query.strip():
            raise ConfigError(f"a ColBERT query must be a non-empty string, not {query!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"k must be a positive integer, not {k!r}")
        if k > self.max_k:
            raise ConfigError(
                f"k={k} exceeds this ColBERT server's limit of {self.max_k} passages per query (ColBERTv2 "
                f"servers and dspy.ColBERTv2 accept k <= {SERVER_MAX_K}); ask for fewer passages. A server "
                "started with `ragsuite serve-retriever --max-k N` allows more: build the client with "
                "ColBERTv2Client(url, max_k=N)"
            )

    def _error(self, exc: _HTTPFailure) -> RetrievalError:
        where = _public_url(self.url)
        if exc.status == 0:
            return RetrievalError(
                f"ColBERT server {where} unreachable after {self.retries + 1} attempts: {exc}"
            )
        return RetrievalError(f"ColBERT server {where} failed with HTTP {exc.status}: {exc}")

    def _request(
        self, method: str, url: str, payload: dict | None = None, *, attempts: int | None = None
    ) -> dict:
        """One protocol exchange with retries. Non-retryable HTTP failures surface as :class:`_HTTPFailure`
        (so callers can react to 404/405); everything else that fails becomes :class:`RetrievalError`."""
        attempts = self.retries + 1 if attempts is None else attempts
        data = None if payload is None else json.dumps(payload).encode("utf-8")
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json; charset=utf-8"
        last: _HTTPFailure | None = None
        for attempt in range(attempts):
            if attempt:
                delay = self.backoff * (2 ** (attempt - 1)) * (1 + random.random() / 4)
                if last is not None and last.retry_after is not None:
                    delay = max(delay, min(last.retry_after, 30.0))
                log.warning(
                    "ColBERT server %s: %s; retry %d/%d in %.2fs",
                    _public_url(url),
                    last,
                    attempt,
                    attempts - 1,
                    delay,
                )
                time.sleep(delay)
            request = urllib.request.Request(url, data=data, headers=headers, method=method)
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    body = response.read()
                    status = response.status
            except urllib.error.HTTPError as exc:
                failure = _HTTPFailure(exc.code, self._error_message(exc), self._retry_after(exc))
                if exc.code not in _RETRY_STATUSES:
                    raise failure from None
                last = failure
                continue
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                last = _HTTPFailure(0, f"{type(reason).__name__}: {reason}")
                continue
            return self._decode(status, body)
        assert last is not None
        if last.status == 0:
            raise self._error(last)
        raise RetrievalError(
            f"ColBERT server {_public_url(self.url)} failed with HTTP {last.status} "
            f"after {attempts} attempts: {last}"
        )

    @staticmethod
    def _retry_after(exc: urllib.error.HTTPError) -> float | None:
        value = exc.headers.get("Retry-After") if exc.headers else None
        try:
            return float(value) if value is not None else None
        except ValueError:
            return None

    @staticmethod
    def _error_message(exc: urllib.error.HTTPError) -> str:
        try:
            body = exc.read()[:2000].decode("utf-8", "replace")
        except Exception:  # the body is only decoration for the message
            body = ""
        try:
            reply = json.loads(body)
            if isinstance(reply, dict) and reply.get("message"):
                return str(reply["message"])
        except ValueError:
            pass
        return body.strip()[:300] or str(exc.reason)

    def _decode(self, status: int, body: bytes) -> dict:
        where = _public_url(self.url)
        if status != 200:
            raise RetrievalError(f"ColBERT server {where} answered HTTP {status}")
        try:
            reply = json.loads(body)
        except ValueError:
            raise RetrievalError(
                f"ColBERT server {where} sent a reply that is not JSON: {body[:200]!r}"
            ) from None
        if not isinstance(reply, dict):
            raise RetrievalError(
                f"ColBERT server {where} sent {type(reply).__name__}, expected a JSON object"
            )
        if reply.get("error"):
            raise RetrievalError(
                f"ColBERT server {where} returned an error: {reply.get('message', 'no message')}"
            )
        return reply

    def _passages(self, reply: dict, k: int) -> list[Passage]:
        if reply.get("error"):
            message = reply.get("message", "no message")
            raise RetrievalError(f"ColBERT server {_public_url(self.url)} returned an error: {message}")
        topk = reply.get("topk")
        if not isinstance(topk, list):
            raise RetrievalError(
                f"ColBERT server {_public_url(self.url)} reply has no 'topk' list: {str(reply)[:200]}"
            )
        passages = []
        for item in topk[:k]:
            if not isinstance(item, dict) or "text" not in item:
                raise RetrievalError(
                    f"ColBERT server {_public_url(self.url)} sent a malformed passage: {item!r}"
                )
            text = str(item["text"])
            if isinstance(item.get("title"), str):
                # ragsuite's server names the title, which keeps titles containing " | " intact.
                title = item["title"]
                body = text[len(title) + 3 :] if title and text.startswith(f"{title} | ") else text
            else:
                title, body = split_title(text)
            pid = item.get("id", item.get("pid", ""))
            try:
                score = float(item.get("score", 0.0))
            except (TypeError, ValueError):
                score = 0.0
            passages.append(Passage(id=str(pid), title=title, text=body, score=score))
        return passages
