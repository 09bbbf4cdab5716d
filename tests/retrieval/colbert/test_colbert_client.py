"""ColBERTv2Client against scripted HTTP servers: error replies, retries with backoff, unreachable servers,
malformed replies, batch fallback for upstream servers without POST."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ragsuite.errors import ConfigError, RetrievalError
from ragsuite.retrieval.colbert.client import ColBERTv2Client, split_title

Reply = tuple[int, object]  # (status, JSON payload or raw bytes)


class Scripted:
    """An HTTP server whose replies come from ``respond(method, path, params_or_body, attempt)``."""

    def __init__(self, respond: Callable[[str, str, dict, int], Reply]) -> None:
        self.respond = respond
        self.requests: list[tuple[str, str, dict]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _handle(self, method: str) -> None:
                parts = urllib.parse.urlsplit(self.path)
                if method == "GET":
                    data = {k: v[0] for k, v in urllib.parse.parse_qs(parts.query).items()}
                else:
                    data = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append((method, parts.path, data))
                status, payload = owner.respond(method, parts.path, data, len(owner.requests))
                body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                if status == 429:
                    self.send_header("Retry-After", "0")
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> Scripted:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def hit(pid: int, text: str, score: float = 1.0) -> dict:
    return {"text": text, "pid": pid, "rank": 1, "score": score, "prob": 1.0}


def upstream(method: str, path: str, data: dict, attempt: int) -> Reply:
    """Like the upstream ColBERT server: GET only, ints as pids."""
    if method != "GET":
        return 405, {"error": True, "message": "method not allowed"}
    if path == "/health":
        return 404, b"not found"
    q = data["query"]
    return 200, {"topk": [hit(7, f"Title {q} | body of {q}", 3.5), hit(8, "no separator here", 1.0)]}


def test_split_title():
    assert split_title("Hamlet | A play | in five acts") == ("Hamlet", "A play | in five acts")
    assert split_title("no title") == ("", "no title")


def test_upstream_protocol_url_defaults_and_passages():
    with Scripted(upstream) as srv:
        client = ColBERTv2Client(srv.url, retries=0)
        assert client.url.endswith("/api/search")
        passages = client("jaws", 2)
        assert [(p.id, p.title, p.text, p.score) for p in passages] == [
            ("7", "Title jaws", "body of jaws", 3.5),
            ("8", "", "no separator here", 1.0),
        ]
        assert srv.requests[-1] == ("GET", "/api/search", {"query": "jaws", "k": "2"})
        assert len(client("jaws", 1)) == 1  # never more than k, even if the server sends more
        # Batch: the POST is refused (405), then per-query GETs, remembered for the next batch.
        results = client.batch(["a", "b", "c"], 1)
        assert [r[0].title for r in results] == ["Title a", "Title b", "Title c"]
        assert client._batch_supported is False
        n = len(srv.requests)
        client.batch(["d", "e"], 1)
        assert all(m == "GET" for m, _, _ in srv.requests[n:])
        # /health does not exist upstream: a one-passage search stands in.
        assert client.health()["endpoint"] == "search"


def test_hosted_style_path_is_kept():
    with Scripted(upstream) as srv:
        client = ColBERTv2Client(srv.url + "/wiki17_abstracts", retries=0)
        with pytest.raises(RetrievalError, match="405"):
            ColBERTv2Client(srv.url + "/wiki17_abstracts", retries=0, method="post")("x", 1)
        assert client.url.endswith("/wiki17_abstracts")


@pytest.mark.parametrize(
    ("reply", "match"),
    [
        ((200, {"error": True, "message": "index not loaded"}), "index not loaded"),
        ((200, b"<html>oops</html>"), "not JSON"),
        ((200, {"results": []}), "no 'topk'"),
        ((200, [1, 2]), "expected a JSON object"),
        ((200, {"topk": [{"pid": 1}]}), "malformed"),
        ((404, {"error": True, "message": "no such index"}), "HTTP 404: no such index"),
    ],
)
def test_error_replies_raise_never_empty(reply, match):
    with Scripted(lambda *a: reply) as srv:
        with pytest.raises(RetrievalError, match=match):
            ColBERTv2Client(srv.url, retries=2, backoff=0.01)("q", 3)
        if reply[0] == 404:
            assert len(srv.requests) == 1  # a 4xx is not retried


def test_retries_5xx_and_429_with_backoff():
    def flaky(method, path, data, attempt):
        if attempt == 1:
            return 503, {"error": True, "message": "warming up"}
        if attempt == 2:
            return 429, {"error": True, "message": "slow down"}
        return 200, {"topk": [hit(1, "T | x")]}

    with Scripted(flaky) as srv:
        start = time.perf_counter()
        passages = ColBERTv2Client(srv.url, retries=3, backoff=0.05)("q", 1)
        elapsed = time.perf_counter() - start
        assert [p.id for p in passages] == ["1"] and len(srv.requests) == 3
        assert elapsed >= 0.05 + 0.1  # two waits: backoff, then doubled


def test_gives_up_after_retries_on_persistent_500():
    with Scripted(lambda *a: (500, {"error": True, "message": "boom"})) as srv:
        with pytest.raises(RetrievalError, match=r"HTTP 500 after 3 attempts: boom"):
            ColBERTv2Client(srv.url, retries=2, backoff=0.01)("q", 1)
        assert len(srv.requests) == 3


def test_unreachable_server_raises_after_retries():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    client = ColBERTv2Client(f"http://127.0.0.1:{port}/api/search", retries=2, backoff=0.01, timeout=1)
    with pytest.raises(RetrievalError, match="unreachable after 3 attempts"):
        client("q", 1)
    with pytest.raises(RetrievalError, match="unreachable"):
        client.health()


def test_timeout_is_retried_then_raised():
    def slow(*args):
        time.sleep(0.6)
        return 200, {"topk": []}

    with Scripted(slow) as srv:
        with pytest.raises(RetrievalError, match="unreachable after 2 attempts"):
            ColBERTv2Client(srv.url, retries=1, backoff=0.01, timeout=0.2)("q", 1)


def test_config_validation_and_describe_hides_credentials():
    with pytest.raises(ConfigError):
        ColBERTv2Client("localhost:8893")
    with pytest.raises(ConfigError):
        ColBERTv2Client("http://h:1", method="put")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="k <= 100"):
        ColBERTv2Client("http://h:1")("q", 500)
    client = ColBERTv2Client("http://user:secret@example.org:8893/api/search?token=abc")
    described = client.describe()
    assert described["spec"] == "colbert-server:http://example.org:8893/api/search"
    assert "secret" not in json.dumps(described) and "abc" not in json.dumps(described)
    assert "secret" not in repr(client)


def test_spec_builds_client():
    from ragsuite.retrieval.spec import build_retriever

    with Scripted(upstream) as srv:
        retriever = build_retriever(f"colbert-server:{srv.url}/api/search", retries=0, timeout=2)
        assert isinstance(retriever, ColBERTv2Client) and retriever.timeout == 2
        assert retriever("x", 1)[0].title == "Title x"
        again = build_retriever(retriever.describe()["spec"])
        assert again.url == retriever.url
    with pytest.raises(ConfigError):
        build_retriever("colbert-server:")


def test_batch_probe_falls_back_when_post_fails():
    """A server that crashes (500) on the unknown batch body: auto mode falls back to GETs at once."""

    def flask_like(method, path, data, attempt):
        if method == "POST":
            return 500, {"error": True, "message": "KeyError: 'query'"}
        return 200, {"topk": [hit(1, f"T | {data['query']}")]}

    with Scripted(flask_like) as srv:
        client = ColBERTv2Client(srv.url, retries=3, backoff=1.0)
        start = time.perf_counter()
        assert [r[0].text for r in client.batch(["a", "b"], 1)] == ["a", "b"]
        assert time.perf_counter() - start < 0.9  # no retry sleeps for the probe
        assert [m for m, _, _ in srv.requests].count("POST") == 1
        with pytest.raises(RetrievalError, match="HTTP 500"):
            ColBERTv2Client(srv.url, retries=0, method="post").batch(["a"], 1)
