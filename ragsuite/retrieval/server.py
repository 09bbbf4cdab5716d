"""Serve any :class:`~ragsuite.retrieval.base.Retriever` over the ColBERTv2 server protocol.

Endpoints:
    ``GET  /api/search?query=Q&k=K``            -> ``{"query", "latency", "topk": [{"text", "pid", "rank",
                                                   "score", "prob", "id", "title"}, ...]}``
    ``POST /api/search {"query": Q, "k": K}``   -> the same
    ``POST /api/search {"queries": [...], "k": K}`` -> ``{"results": [{"query", "topk"}, ...], "latency"}``
    ``GET  /health``                            -> ``{"status": "ok", "retriever": {...}, "max_k": ...}``
    ``POST /retrieve {"queries": [...], "topk": K, "return_scores": B}`` -> ``{"result": [[hit, ...], ...]}``,
        the protocol of Search-R1-style retrieval servers: a hit is ``{"document": {"id", "contents"},
        "score"}`` with ``return_scores``, else the bare document; ``contents`` is ``'"title"\\ntext'``.

Before it answers anything the server runs one real search (:meth:`RetrieverServer.warm_up`): a retriever's
first search pays one-off costs (BM25 with the compiled kernel: importing numba and loading the kernel from
its disk cache, 1-3 s on 2 busy cores, against about 1 ms for the searches after it), and those costs belong
before ``/health`` says ok, not on the first client. ``/health`` reports the warm-up's seconds as
``warm_up_s`` (``null`` when it failed; the server serves anyway and its searches report their own errors).

Errors are ``{"error": true, "message": ...}`` with a 4xx status for bad requests (missing query, bad or
too-large k, oversized query or body) and 500 when the retriever fails. ``text`` is ``"title | body"`` as the
upstream servers send it, so ``dspy.ColBERTv2`` works unchanged; ``id`` and ``title`` are extras that keep
passage ids and titles exact.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import urllib.parse
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ragsuite.errors import ConfigError
from ragsuite.retrieval.base import Passage, Retriever

log = logging.getLogger("ragsuite.retrieval.server")

SEARCH_PATH = "/api/search"
HEALTH_PATH = "/health"
RETRIEVE_PATH = "/retrieve"
#: The server's first search when its retriever has no ``warm_up()``: common words most corpora index.
WARM_UP_QUERY = "name of the first city, country, river, film, person and year"


class _Server(ThreadingHTTPServer):
    """A thread per connection, with a listen backlog for many clients connecting at once (the standard
    library's default of 5 makes the 6th simultaneous client wait a second for a SYN retry, or reset)."""

    request_queue_size = 1024
    daemon_threads = True
    allow_reuse_address = True


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _topk(passages: Sequence[Passage]) -> list[dict[str, Any]]:
    """The protocol's passage records; ``prob`` is the softmax of the scores, as the upstream server sends."""
    scores = [float(p.score) for p in passages]
    top = max(scores, default=0.0)
    weights = [math.exp(s - top) if math.isfinite(s) else 0.0 for s in scores]
    total = sum(weights) or 1.0
    return [
        {
            "text": p.render(),
            "pid": p.id,
            "rank": rank,
            "score": p.score,
            "prob": w / total,
            "id": p.id,
            "title": p.title,
            # dspy.ColBERTv2 reads long_text from POST replies (its GET path adds it itself).
            "long_text": p.render(),
        }
        for rank, (p, w) in enumerate(zip(passages, weights, strict=True), 1)
    ]


class RetrieverServer:
    """A threaded HTTP server answering ColBERT-protocol searches with ``retriever``.

    Args:
        retriever: Any retriever (thread-safe, as the protocol requires).
        host: Interface to bind; loopback by default. Bind to ``0.0.0.0`` only on a trusted network: there is
            no authentication.
        port: TCP port; 0 picks a free one (see :attr:`port` after :meth:`start`).
        max_k: Largest k served; larger requests get HTTP 400 with an explanation.
        default_k: k when a request names none.
        max_query_chars: Longer queries get HTTP 413.
        max_batch: Most queries in one batched POST (more get HTTP 413).
        max_body_bytes: Largest POST body accepted (larger gets HTTP 413).
        max_response_bytes: Largest reply sent (a larger one is refused with HTTP 400 saying so).
        request_timeout: Seconds a connection may stay idle before the server drops it.

    Example:
        >>> from ragsuite.retrieval.bm25 import BM25Retriever
        >>> with RetrieverServer(BM25Retriever.from_dataset("hotpotqa")) as server:
        ...     print(server.url)
        http://127.0.0.1:.../api/search
    """

    def __init__(
        self,
        retriever: Retriever,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_k: int = 100,
        default_k: int = 10,
        max_query_chars: int = 2000,
        max_batch: int = 256,
        max_body_bytes: int = 1_000_000,
        max_response_bytes: int = 64_000_000,
        request_timeout: float = 30.0,
    ) -> None:
        default_k = min(default_k, max_k)
        if max_k < 1 or default_k < 1:
            raise ConfigError(f"need 1 <= default_k <= max_k, got default_k={default_k}, max_k={max_k}")
        if min(max_query_chars, max_batch, max_body_bytes, max_response_bytes) < 1:
            raise ConfigError(
                "max_query_chars, max_batch, max_body_bytes and max_response_bytes must be positive"
            )
        if not 0 <= port <= 65535:
            raise ConfigError(f"port must be in 0..65535, not {port}")
        self.retriever = retriever
        self.host = host
        self.max_k = max_k
        self.default_k = default_k
        self.max_query_chars = max_query_chars
        self.max_batch = max_batch
        self.max_body_bytes = max_body_bytes
        self.max_response_bytes = max_response_bytes
        self.request_timeout = request_timeout
        self._requested_port = port
        #: Seconds the warm-up search took (None: not run yet, or it failed).
        self.warm_up_s: float | None = None
        self._warmed = False
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------------------

    def bind(self) -> _Server:
        """Create the listening socket (idempotent)."""
        if self._httpd is None:
            handler = type("_Handler", (_Handler,), {"app": self, "timeout": self.request_timeout})
            try:
                httpd = _Server((self.host, self._requested_port), handler)
            except OSError as exc:
                raise ConfigError(f"cannot listen on {self.host}:{self._requested_port}: {exc}") from exc
            httpd.daemon_threads = True
            self._httpd = httpd
        return self._httpd

    @property
    def port(self) -> int:
        return self.bind().server_address[1]

    @property
    def url(self) -> str:
        """The search endpoint, for :class:`ColBERTv2Client` or ``dspy.ColBERTv2(url=...)``."""
        host = self.host if self.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}{SEARCH_PATH}"

    def warm_up(self) -> float | None:
        """Run one real search, once, so that the first client's search is as fast as the later ones.

        The retriever's own ``warm_up()`` when it has one (BM25 searches its first passage's words);
        otherwise :data:`WARM_UP_QUERY`, then the words of the passage it found, which is the path a
        matching query takes (BM25 skips its kernel for a query without an indexed word). A failure is
        logged, not raised: the server serves anyway, and each search reports its own error.

        Returns:
            The seconds it took, or None when it failed.
        """
        if self._warmed:
            return self.warm_up_s
        self._warmed = True
        start = time.perf_counter()
        try:
            own = getattr(self.retriever, "warm_up", None)
            if callable(own):
                own()
            elif hits := self.retriever(WARM_UP_QUERY, 1):
                self.retriever(hits[0].render()[: self.max_query_chars], 1)
        except Exception as exc:  # a broken retriever still gets served, with a 500 per search
            log.warning(
                "the warm-up search failed (%s: %s); the first search may be slow", type(exc).__name__, exc
            )
            return None
        self.warm_up_s = round(time.perf_counter() - start, 6)
        log.info("warmed up with a search in %.3f s", self.warm_up_s)
        return self.warm_up_s

    def start(self) -> RetrieverServer:
        """Warm up (:meth:`warm_up`), then serve in a background daemon thread."""
        httpd = self.bind()
        if self._thread is None:
            self.warm_up()
            self._thread = threading.Thread(target=httpd.serve_forever, name="retriever-server", daemon=True)
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Warm up (:meth:`warm_up`), then serve in the calling thread until :meth:`stop` or
        KeyboardInterrupt."""
        try:
            httpd = self.bind()
            self.warm_up()
            httpd.serve_forever()
        finally:
            self.stop()

    def stop(self) -> None:
        if self._httpd is not None:
            if self._thread is not None:
                self._httpd.shutdown()
                self._thread.join(timeout=5)
            self._httpd.server_close()
        self._httpd = None
        self._thread = None

    def __enter__(self) -> RetrieverServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- request handling (called from handler threads) ---------------------------------------------------

    def parse_k(self, raw: Any) -> int:
        if raw is None or raw == "":
            return self.default_k
        if isinstance(raw, bool):
            raise _BadRequest(400, f"k must be an integer, not {raw!r}")
        try:
            k = int(raw)
        except (TypeError, ValueError, OverflowError):  # OverflowError: k=1e400 reads as infinity
            raise _BadRequest(400, f"k must be an integer, not {raw!r}") from None
        if isinstance(raw, float) and raw != k:
            raise _BadRequest(400, f"k must be an integer, not {raw!r}")
        if k < 1:
            raise _BadRequest(400, f"k must be >= 1, not {k}")
        if k > self.max_k:
            raise _BadRequest(400, f"k={k} is above this server's limit of {self.max_k}")
        return k

    def check_query(self, query: Any) -> str:
        if not isinstance(query, str) or not query.strip():
            raise _BadRequest(400, "a non-empty 'query' is required")
        if len(query) > self.max_query_chars:
            raise _BadRequest(
                413, f"query has {len(query)} characters; this server accepts at most {self.max_query_chars}"
            )
        return query

    def search(self, query: str, k: int) -> dict[str, Any]:
        start = time.perf_counter()
        passages = self.retriever(query, k)
        return {"query": query, "topk": _topk(passages[:k]), "latency": round(time.perf_counter() - start, 6)}

    def check_queries(self, queries: Any) -> list[str]:
        if not isinstance(queries, list) or not queries:
            raise _BadRequest(400, "'queries' must be a non-empty list of strings")
        if len(queries) > self.max_batch:
            raise _BadRequest(
                413, f"{len(queries)} queries in one request; this server accepts at most {self.max_batch}"
            )
        return [self.check_query(q) for q in queries]

    def _batch(self, queries: list[str], k: int) -> list[list[Passage]]:
        results = self.retriever.batch(queries, k)
        if len(results) != len(queries):
            raise RuntimeError(f"retriever returned {len(results)} result lists for {len(queries)} queries")
        return results

    def search_batch(self, queries: Any, k: int) -> dict[str, Any]:
        queries = self.check_queries(queries)
        start = time.perf_counter()
        results = self._batch(queries, k)
        return {
            "results": [{"query": q, "topk": _topk(r[:k])} for q, r in zip(queries, results, strict=True)],
            "latency": round(time.perf_counter() - start, 6),
        }

    def retrieve(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The ``POST /retrieve`` reply (see the module docstring)."""
        queries = payload.get("queries")
        queries = self.check_queries([queries] if isinstance(queries, str) else queries)
        k = self.parse_k(payload.get("topk"))
        with_scores = payload.get("return_scores", False)
        if not isinstance(with_scores, bool):
            raise _BadRequest(400, f"return_scores must be true or false, not {with_scores!r}")
        results = self._batch(queries, k)

        def hit(p: Passage) -> dict[str, Any]:
            document = {"id": p.id, "contents": f'"{p.title}"\n{p.text}'}
            return {"document": document, "score": p.score} if with_scores else document

        return {"result": [[hit(p) for p in passages[:k]] for passages in results]}

    def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "retriever": self.retriever.describe(),
            "max_k": self.max_k,
            "max_query_chars": self.max_query_chars,
            "max_batch": self.max_batch,
            "warm_up_s": self.warm_up_s,
        }


class _Handler(BaseHTTPRequestHandler):
    app: RetrieverServer
    protocol_version = "HTTP/1.1"
    server_version = "ragsuite-retriever"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - %s", self.address_string(), format % args)

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode("utf-8")
        if len(body) > self.app.max_response_bytes:
            status, body = (
                400,
                json.dumps(
                    {
                        "error": True,
                        "message": f"the reply would be {len(body)} bytes, above this server's limit of "
                        f"{self.app.max_response_bytes} (--max-response-bytes); ask for a smaller k or "
                        "fewer queries",
                    }
                ).encode("utf-8"),
            )
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _fail(self, status: int, message: str) -> None:
        self._send(status, {"error": True, "message": message})

    def _dispatch(self, action: Any) -> None:
        try:
            self._send(200, action())
        except _BadRequest as exc:
            self._fail(exc.status, str(exc))
        except Exception as exc:  # the retriever failed: report it, keep serving
            log.exception("retriever failed while serving %s", self.path)
            self._fail(500, f"retriever failed: {type(exc).__name__}: {exc}")

    def do_GET(self) -> None:
        parts = urllib.parse.urlsplit(self.path)
        path = parts.path.rstrip("/") or "/"
        if path == HEALTH_PATH:
            self._dispatch(self.app.health)
            return
        if path != SEARCH_PATH:
            self._fail(404, f"no such endpoint {path!r}; use {SEARCH_PATH} or {HEALTH_PATH}")
            return
        params = urllib.parse.parse_qs(parts.query, keep_blank_values=True)

        def action() -> dict[str, Any]:
            query = self.app.check_query((params.get("query") or [None])[0])
            return self.app.search(query, self.app.parse_k((params.get("k") or [None])[0]))

        self._dispatch(action)

    def do_POST(self) -> None:
        path = urllib.parse.urlsplit(self.path).path.rstrip("/")
        if path not in (SEARCH_PATH, RETRIEVE_PATH):
            self._fail(404, f"no such endpoint {path!r}; POST to {SEARCH_PATH} or {RETRIEVE_PATH}")
            return
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            self.close_connection = True
            self._fail(411, "POST needs a Content-Length header")
            return
        try:
            length = int(length_header)
        except ValueError:
            self.close_connection = True
            self._fail(400, f"bad Content-Length {length_header!r}")
            return
        if length < 0 or length > self.app.max_body_bytes:
            # Do not read an oversized body; drop the connection after replying.
            self.close_connection = True
            self._fail(
                413, f"request body of {length} bytes; this server accepts at most {self.app.max_body_bytes}"
            )
            return
        raw = self.rfile.read(length)

        def action() -> dict[str, Any]:
            try:
                payload = json.loads(raw or b"null")
            except ValueError:
                raise _BadRequest(400, "request body is not valid JSON") from None
            except RecursionError:
                raise _BadRequest(400, "request body is nested too deeply") from None
            if not isinstance(payload, dict):
                raise _BadRequest(400, 'request body must be a JSON object: {"query": ..., "k": ...}')
            if path == RETRIEVE_PATH:
                return self.app.retrieve(payload)
            k = self.app.parse_k(payload.get("k"))
            if "queries" in payload:
                return self.app.search_batch(payload["queries"], k)
            return self.app.search(self.app.check_query(payload.get("query")), k)

        self._dispatch(action)
