"""A local OpenAI-compatible chat server for tests and benchmarks, answering like :class:`ScriptedLM`.

It lets the real ``dspy.LM`` client (HTTP, retries, timeouts, usage) run against a scripted responder, with
faults injected on demand: rate limits with ``Retry-After``, server errors, replies slower than the client's
timeout, malformed text and unknown models.

Log probabilities: a request with ``logprobs: true`` (and optionally ``top_logprobs: N``) gets
``choices[0].logprobs.content``, one ``{token, logprob, bytes, top_logprobs}`` entry per token, in OpenAI's
format. A responder scripts them by returning a :class:`Reply`: per-word probabilities (``word_probs``), or
the exact tokens with their alternatives (``tokens``); other tokens get ``default_logprob``. The server's
tokens are whitespace-led words (``"Paris is"`` -> ``"Paris"``, ``" is"``), so the tokens of a reply
concatenate to its text, as a real tokenizer's do. ``/v1/completions`` (a raw prompt, as vLLM serves
completion models) answers too, with the legacy ``logprobs: N`` format (``tokens``, ``token_logprobs``,
``top_logprobs``, ``text_offset``).

Example:
    >>> import dspy
    >>> with LocalOpenAIServer(lambda req: {"answer": "Paris"}) as server:
    ...     lm = dspy.LM("openai/scripted", api_base=server.api_base, api_key="unused", cache=False)
    ...     with dspy.context(lm=lm):
    ...         dspy.Predict("question -> answer")(question="Capital of France?").answer
    'Paris'
"""

from __future__ import annotations

import collections
import json
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from ragsuite.testing.scripted import (
    Reply,
    Responder,
    ScriptedRequest,
    TokenLogprob,
    parse_chat_messages,
    render_reply,
)

FaultKind = Literal["rate_limit", "server_error", "delay", "malformed", "not_found", "disconnect"]

#: Request bodies above this size are refused with 413: the server only ever sees test prompts.
MAX_BODY_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class Fault:
    """One injected failure, applied to a single chat request.

    Attributes:
        kind: ``rate_limit`` (429 with ``Retry-After``), ``server_error`` (500), ``delay`` (sleep ``seconds``
            then answer normally, to trip the client's timeout), ``malformed`` (200 with ``text`` as the
            reply), ``not_found`` (404 "model does not exist") or ``disconnect`` (close without replying).
        seconds: ``Retry-After`` for ``rate_limit``; sleep for ``delay``.
        text: The reply for ``malformed``.
        retry_after: The ``Retry-After`` header verbatim (e.g. an HTTP date), instead of ``seconds``.
    """

    kind: FaultKind
    seconds: float = 0.0
    text: str = "this is not in the expected format"
    retry_after: str | None = None


def word_count(text: str) -> int:
    """The server's token count: whitespace-separated words (deterministic, dependency-free)."""
    return len(text.split())


_TOKEN = re.compile(r"\s*\S+|\s+")


def tokenize(text: str) -> list[str]:
    """The server's tokens: each word with the whitespace before it (they concatenate back to ``text``)."""
    return _TOKEN.findall(text)


def scored_tokens(text: str, reply: Reply | None, default_logprob: float) -> list[TokenLogprob]:
    """The tokens of ``text`` with their log probabilities as ``reply`` scripts them."""
    if reply is not None and reply.tokens is not None:
        joined = "".join(t.token for t in reply.tokens)
        if joined != text:
            raise ValueError(f"the scripted tokens spell {joined[:200]!r}, not the reply {text[:200]!r}")
        return list(reply.tokens)
    probs = reply.word_probs if reply is not None else {}
    scored = []
    for token in tokenize(text):
        prob = probs.get(token.strip())
        scored.append(TokenLogprob(token, math.log(prob) if prob is not None else default_logprob))
    return scored


def _top(token: TokenLogprob, n: int) -> list[tuple[str, float]]:
    top = list(token.top)
    if token.token not in (t for t, _ in top):
        top.append((token.token, token.logprob))
        top.sort(key=lambda pair: -pair[1])
    return top[:n]


def chat_logprobs(tokens: Sequence[TokenLogprob], top_n: int) -> dict[str, Any]:
    """``choices[i].logprobs`` of a chat completion, in OpenAI's format."""

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    content = [
        {**entry(t.token, t.logprob), "top_logprobs": [entry(a, lp) for a, lp in _top(t, top_n)]}
        for t in tokens
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(tokens: Sequence[TokenLogprob], top_n: int, offset: int = 0) -> dict[str, Any]:
    """``choices[i].logprobs`` of a (legacy) text completion, as OpenAI and vLLM write it."""
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token.token)
    return {
        "tokens": [t.token for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [dict(_top(t, top_n)) for t in tokens] if top_n else None,
        "text_offset": offsets,
    }


class LocalOpenAIServer:
    """Serve ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` on 127.0.0.1 from a background
    thread.

    Args:
        responder: ``responder(ScriptedRequest) -> dict | str | Reply``, as for :class:`ScriptedLM`; a
            :class:`Reply` scripts the log probabilities of its tokens.
        latency: Seconds every chat reply waits before answering (a stand-in for LM decode time).
        model: The model id ``/v1/models`` lists; requests for other models get 404 when ``strict_model``.
        strict_model: Refuse unknown model names with 404, as vLLM does.
        fault_fn: Optional ``fault_fn(request_number, request) -> Fault | None`` consulted for every chat
            request (after the queued faults), for faults that depend on the question.
        default_logprob: The log probability of every token a :class:`Reply` does not script.

    Attributes:
        api_base: ``http://127.0.0.1:PORT/v1``.
        chat_requests: Chat and completion requests received, faulted ones included.
        question_counts: Chat requests per ``question`` input field (faulted ones included).
        authorizations: ``Authorization`` header values received, counted (to check which key was sent).
        requests: Parsed requests that were answered (the responder saw them), in arrival order.
    """

    def __init__(
        self,
        responder: Responder,
        *,
        latency: float = 0.0,
        model: str = "scripted",
        strict_model: bool = True,
        fault_fn: Callable[[int, ScriptedRequest], Fault | None] | None = None,
        default_logprob: float = 0.0,
    ) -> None:
        if not default_logprob <= 0.0:
            raise ValueError(f"default_logprob must be <= 0, not {default_logprob!r}")
        self.responder = responder
        self.default_logprob = default_logprob
        self._requests: list[ScriptedRequest] = []
        self.latency = latency
        self.model = model
        self.strict_model = strict_model
        self.fault_fn = fault_fn
        self.chat_requests = 0
        self.faults_served: list[Fault] = []
        self.question_counts: collections.Counter[str] = collections.Counter()
        self.authorizations: collections.Counter[str] = collections.Counter()
        self._faults: collections.deque[Fault] = collections.deque()
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ control
    @property
    def requests(self) -> list[ScriptedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the server is not running; use it as a context manager or call start()")
        return self._httpd.server_address[1]

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def inject(self, *faults: Fault) -> None:
        """Queue faults; each applies to one upcoming chat request, in order."""
        with self._lock:
            self._faults.extend(faults)

    def start(self) -> LocalOpenAIServer:
        self._httpd = _QuietServer(("127.0.0.1", 0), _make_handler(self))
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="local-openai", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> LocalOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ serving
    def _next_fault(self, number: int, request: ScriptedRequest) -> Fault | None:
        with self._lock:
            fault = self._faults.popleft() if self._faults else None
        if fault is None and self.fault_fn is not None:
            fault = self.fault_fn(number, request)
        if fault is not None:
            with self._lock:
                self.faults_served.append(fault)
        return fault

    def _complete(
        self, body: dict[str, Any], *, endpoint: Literal["chat", "text"] = "chat"
    ) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Status, JSON reply and extra headers for one request (``status == 0``: drop the socket)."""
        with self._lock:
            self.chat_requests += 1
            number = self.chat_requests
        if endpoint == "chat":
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return 400, _error("'messages' must be a non-empty list", "invalid_request_error"), {}
            prompts = [messages]
        else:
            prompt = body.get("prompt")
            prompts = [prompt] if isinstance(prompt, str) else prompt
            if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
                return (
                    400,
                    _error("'prompt' must be a string or a list of strings", "invalid_request_error"),
                    {},
                )
        top_n, problem = _logprob_settings(body, endpoint)
        if problem:
            return 400, _error(problem, "invalid_request_error"), {}
        model = str(body.get("model", ""))
        if self.strict_model and model != self.model:
            return 404, _error(f"The model `{model}` does not exist.", "NotFoundError"), {}
        requests = [
            parse_chat_messages(p) if endpoint == "chat" else _completion_request(p)  # type: ignore[arg-type]
            for p in prompts
        ]
        sampling_keys = (
            "temperature",
            "top_p",
            "seed",
            "max_tokens",
            "max_completion_tokens",
            "logprobs",
            "top_logprobs",
        )
        for request in requests:
            request.sampling = {k: body[k] for k in sampling_keys if k in body}
        with self._lock:
            for request in requests:
                self.question_counts[request.inputs.get("question", "")] += 1
        fault = self._next_fault(number, requests[0])
        if fault is not None:
            if fault.kind == "rate_limit":
                headers = {"Retry-After": fault.retry_after or f"{fault.seconds:g}"}
                return 429, _error("Rate limit reached, retry later.", "rate_limit_error"), headers
            if fault.kind == "server_error":
                return 500, _error("Internal server error (injected).", "server_error"), {}
            if fault.kind == "not_found":
                return 404, _error(f"The model `{model}` does not exist.", "NotFoundError"), {}
            if fault.kind == "disconnect":
                return 0, {}, {}
            if fault.kind == "delay":
                time.sleep(fault.seconds)
        if self.latency:
            time.sleep(self.latency)
        choices = []
        completion_tokens = 0
        for index, request in enumerate(requests):
            if fault is not None and fault.kind == "malformed":
                text, reply = fault.text, None
            else:
                text, reply = self._reply(request, endpoint)
            completion_tokens += word_count(text)
            logprobs = None
            if top_n is not None:
                tokens = scored_tokens(text, reply, self.default_logprob)
                logprobs = (
                    chat_logprobs(tokens, top_n) if endpoint == "chat" else completion_logprobs(tokens, top_n)
                )
            choice: dict[str, Any] = {"index": index, "logprobs": logprobs, "finish_reason": "stop"}
            if endpoint == "chat":
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choices.append(choice)
        if endpoint == "chat":
            prompt_tokens = sum(word_count(str(m.get("content") or "")) for m in prompts[0])  # type: ignore[union-attr]
        else:
            prompt_tokens = sum(word_count(p) for p in prompts)  # type: ignore[arg-type]
        reply_body = {
            "id": f"{'chatcmpl' if endpoint == 'chat' else 'cmpl'}-{number}",
            "object": "chat.completion" if endpoint == "chat" else "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        return 200, reply_body, {}

    def _reply(self, request: ScriptedRequest, endpoint: str = "chat") -> tuple[str, Reply | None]:
        """The responder's answer as text (ChatAdapter text for field values, as :class:`ScriptedLM`
        renders it) and the :class:`Reply` that scripts its log probabilities, if any."""
        with self._lock:
            self._requests.append(request)
        answer = self.responder(request)
        reply = answer if isinstance(answer, Reply) else None
        content = answer.content if isinstance(answer, Reply) else answer
        if endpoint == "text" and not isinstance(content, str):
            raise TypeError("a /v1/completions responder must return text (or a Reply with text), not fields")
        return render_reply(request, content), reply

    def _models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "ragsuite"}]}


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog (5) makes a burst of concurrent clients (hundreds of questions at once)
    # wait for TCP's connect retry (1 s and more): latency the server is not meant to add.
    request_queue_size = 1024

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out and hung up is expected in fault tests; anything else is reported.
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


def _completion_request(prompt: str) -> ScriptedRequest:
    """A raw completion prompt as the responder sees it: ``user``, ``prompt`` and ``inputs["prompt"]``."""
    return ScriptedRequest(
        "", {"prompt": prompt}, [], "", prompt, [{"role": "user", "content": prompt}], prompt=prompt
    )


#: The most alternatives per token the server reports (vLLM's default ``max_logprobs``; OpenAI allows 20).
MAX_TOP_LOGPROBS = 20


def _logprob_settings(body: dict[str, Any], endpoint: str) -> tuple[int | None, str | None]:
    """How many alternatives per token to report (None: no log probabilities), or why the request is bad."""
    asked = body.get("logprobs")
    if endpoint == "text":  # legacy completions: logprobs is the number of alternatives
        if asked is None:
            return None, None
        if isinstance(asked, bool) or not isinstance(asked, int) or not 0 <= asked <= MAX_TOP_LOGPROBS:
            return None, f"'logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS}, not {asked!r}"
        return asked, None
    top = body.get("top_logprobs")
    if asked not in (None, True, False):
        return None, f"'logprobs' must be a boolean, not {asked!r}"
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            return None, f"'top_logprobs' must be an integer from 0 to {MAX_TOP_LOGPROBS}, not {top!r}"
        if asked is not True:
            return None, "'top_logprobs' requires 'logprobs': true"
    return (top or 0, None) if asked is True else (None, None)


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _make_handler(server: LocalOpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.1 keeps connections alive, as real servers do; every reply carries Content-Length.
        protocol_version = "HTTP/1.1"
        # Headers and body leave in one segment: with Nagle's algorithm on, a separate small body write
        # waits for the client's delayed ACK (~40 ms per reply), which would swamp any latency being measured.
        disable_nagle_algorithm = True
        wbufsize = 64 * 1024

        def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read stderr
            del format, args

        def _send(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            if path in ("/v1/models", "/models"):
                self._send(200, server._models())
            elif path in ("/health", "/v1/health"):
                self._send(200, {"status": "ok"})
            else:
                self._send(404, _error(f"no route {path}", "not_found"))

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self.close_connection = True
                self._send(413, _error("request body too large", "invalid_request_error"))
                return
            raw = self.rfile.read(length)
            with server._lock:
                server.authorizations[self.headers.get("Authorization") or ""] += 1
            if path in ("/v1/chat/completions", "/chat/completions"):
                endpoint: Literal["chat", "text"] = "chat"
            elif path in ("/v1/completions", "/completions"):
                endpoint = "text"
            else:
                self._send(404, _error(f"no route {path}", "not_found"))
                return
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self._send(400, _error("the body is not JSON", "invalid_request_error"))
                return
            try:
                status, payload, headers = server._complete(body, endpoint=endpoint)
            except Exception as exc:  # a responder bug must reach the client as a 500, not a hang
                status, payload, headers = 500, _error(f"responder failed: {exc!r}", "server_error"), {}
            if status == 0:
                self.close_connection = True
                return
            self._send(status, payload, headers)

    return Handler


__all__ = [
    "Fault",
    "LocalOpenAIServer",
    "Reply",
    "TokenLogprob",
    "chat_logprobs",
    "completion_logprobs",
    "scored_tokens",
    "tokenize",
    "word_count",
]
