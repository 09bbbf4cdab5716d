"""The transformers engine of the local LM: a GGUF model served through an OpenAI-compatible API on loopback.

It exists so that ``--lm local`` works where llama.cpp cannot be built: transformers (with the ``gguf``
package) reads the same GGUF file, dequantized to float32, and this module answers the requests ``dspy.LM``
sends, one at a time:

- ``GET /v1/models`` and ``GET /health``;
- ``POST /v1/chat/completions``: the model's own chat template (from the GGUF file), ``max_tokens`` (or
  ``max_completion_tokens``), ``temperature`` (0 = greedy), ``top_p``, ``seed``, ``stop``, ``logprobs`` and
  ``top_logprobs`` (natural-log probabilities of the chosen and the most likely tokens, from the unprocessed
  logits), and ``usage`` with the exact token counts;
- ``GET /metrics``: the totals of prompt and generated tokens and of requests, under llama.cpp's metric names,
  so a run's ledger can be checked against the server's own count.

Like llama-server it answers only its own client: with a key in ``$LLAMA_API_KEY`` (which
:class:`~ragsuite.local_lm.server.LocalServer` always sets) every request but ``GET /health`` must
carry ``Authorization: Bearer KEY``; and a request from a web page of another origin (an ``Origin`` header
that is not a loopback one) is refused (403), with no CORS headers in any reply, so a page the user visits
can neither use the model nor read it.

A prompt longer than the context window is refused (HTTP 400, naming ``--local-ctx``); one that fits gets at
most the room that is left for its completion (``finish_reason: length`` says it was cut).

Run by :class:`ragsuite.local_lm.server.LocalServer`; by hand::

    python -m ragsuite.local_lm.hf_server --model model.gguf --name qwen --port 8080
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import json
import math
import os
import socket
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

#: Largest request body accepted: a prompt of this size could never fit a local context window.
MAX_BODY = 8 << 20
#: What may be asked without the key, as the pinned llama-server allows: the liveness check.
PUBLIC_PATHS = frozenset({"/health", "/v1/health"})


def is_loopback_origin(origin: str) -> bool:
    """Whether a browser's ``Origin`` header names a page served from this machine's loopback."""
    try:
        host = urllib.parse.urlsplit(origin.strip()).hostname
    except ValueError:
        return False
    if not host:
        return False  # "null" (a sandboxed page, a file) and malformed origins
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RequestError(ValueError):
    """A request the server refuses with HTTP 400."""


class Generator:
    """A transformers model and tokenizer loaded from one GGUF file, generating one request at a time."""

    def __init__(self, model_path: Path, *, name: str, ctx: int, threads: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from ragsuite.local_lm.models import read_gguf_metadata

        torch.set_num_threads(threads)
        self.torch = torch
        self.name = name
        self.ctx = ctx
        folder, file = str(model_path.parent), model_path.name
        self.tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
        if not getattr(self.tokenizer, "chat_template", None):
            template = read_gguf_metadata(model_path).get("tokenizer.chat_template")
            if isinstance(template, str) and template:
                self.tokenizer.chat_template = template
        self.model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, torch_dtype=torch.float32)
        self.model.eval()
        self.lock = threading.Lock()
        self.totals = {"prompt_tokens": 0, "completion_tokens": 0, "requests": 0}

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages must be a non-empty list")
        if int(body.get("n", 1) or 1) != 1:
            raise RequestError("this server returns one choice per request (n=1)")
        try:
            prompt_ids = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True
            )
        except Exception as exc:  # jinja errors on malformed messages
            raise RequestError(f"the chat template cannot render these messages: {exc}") from None
        room = self.ctx - len(prompt_ids)
        if room <= 0:
            raise RequestError(
                f"the prompt has {len(prompt_ids)} tokens, more than the context window of {self.ctx} "
                "tokens; shorten it or raise --local-ctx"
            )
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or 512
        max_tokens = max(1, min(int(asked), room))
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else [s for s in stops if isinstance(s, str) and s]
        top_n = int(body.get("top_logprobs") or 0) if body.get("logprobs") else None
        with self.lock:
            text, tokens, finish = self._generate(
                prompt_ids,
                max_tokens=max_tokens,
                temperature=float(
                    body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0
                ),
                top_p=float(body.get("top_p") or 1.0),
                seed=body.get("seed"),
                stops=stops,
                top_n=top_n,
            )
            self.totals["prompt_tokens"] += len(prompt_ids)
            self.totals["completion_tokens"] += len(tokens)
            self.totals["requests"] += 1
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish,
        }
        if top_n is not None:
            choice["logprobs"] = {"content": [entry for entry, _ in tokens]}
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(tokens),
                "total_tokens": len(prompt_ids) + len(tokens),
            },
        }

    def _generate(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        seed: Any,
        stops: list[str],
        top_n: int | None,
    ) -> tuple[str, list[tuple[dict[str, Any], int]], str]:
        """Token by token with the KV cache, so that stop strings end generation as soon as they appear."""
        torch = self.torch
        generator = torch.Generator()
        if isinstance(seed, int):
            generator.manual_seed(seed)
        eos = set(_as_list(self.model.generation_config.eos_token_id)) | set(
            _as_list(self.tokenizer.eos_token_id)
        )
        ids = torch.tensor([prompt_ids])
        past = None
        chosen: list[tuple[dict[str, Any], int]] = []
        text, finish = "", "length"
        with torch.inference_mode():
            for _ in range(max_tokens):
                out = self.model(input_ids=ids, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[0, -1].float()
                logprobs = torch.log_softmax(logits, dim=-1)
                token = _sample(logits, temperature=temperature, top_p=top_p, generator=generator)
                if token in eos:
                    finish = "stop"
                    break
                entry = self._logprob_entry(token, logprobs, top_n) if top_n is not None else {}
                chosen.append((entry, token))
                text = self.tokenizer.decode([t for _, t in chosen], skip_special_tokens=True)
                cut = _first_stop(text, stops)
                if cut is not None:
                    text, finish = text[:cut], "stop"
                    break
                ids = torch.tensor([[token]])
        return text, chosen, finish

    def _logprob_entry(self, token: int, logprobs: Any, top_n: int) -> dict[str, Any]:
        def item(tid: int, value: float) -> dict[str, Any]:
            piece = self.tokenizer.decode([tid])
            return {"token": piece, "logprob": float(value), "bytes": list(piece.encode("utf-8"))}

        entry = item(token, float(logprobs[token]))
        if top_n:
            values, indices = self.torch.topk(logprobs, k=min(top_n, 20))
            entry["top_logprobs"] = [item(int(i), float(v)) for v, i in zip(values, indices, strict=True)]
        else:
            entry["top_logprobs"] = []
        return entry


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _first_stop(text: str, stops: list[str]) -> int | None:
    found = [text.find(stop) for stop in stops if stop in text]
    return min(found) if found else None


def _sample(logits: Any, *, temperature: float, top_p: float, generator: Any) -> int:
    import torch

    if temperature <= 0 or not math.isfinite(temperature):
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, dim=-1) - sorted_probs < top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
    return int(torch.multinomial(probs / probs.sum(), 1, generator=generator))


def _handler(generator: Generator, *, api_key: str | None = None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _refused(self) -> bool:
            """Answer a request from another origin (403) or without the key (401); True when refused."""
            origin = self.headers.get("Origin")
            if origin is not None and not is_loopback_origin(origin):
                self._error(403, f"requests from the web origin {origin} are refused", "permission_error")
                return True
            path = self.path.split("?", 1)[0].rstrip("/")
            if api_key and not (self.command == "GET" and path in PUBLIC_PATHS):
                given = self.headers.get("Authorization", "")
                if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                    self._error(401, "Invalid API Key", "authentication_error")
                    return True
            return False

        def do_OPTIONS(self) -> None:
            # A CORS preflight: never granted, so a browser sends no cross-origin request that needs one.
            if not self._refused():
                self._error(405, "CORS preflight requests are not served", "permission_error")

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per request would drown the useful output

        def _send(self, status: int, payload: Any, content_type: str = "application/json") -> None:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
            self._send(status, {"error": {"message": message, "type": kind, "code": status}})

        def do_GET(self) -> None:
            if self._refused():
                return
            path = self.path.split("?", 1)[0].rstrip("/")
            if path in ("/v1/models", "/models"):
                self._send(
                    200,
                    {
                        "object": "list",
                        "data": [
                            {"id": generator.name, "object": "model", "owned_by": "ragsuite-transformers"}
                        ],
                    },
                )
            elif path == "/health":
                self._send(200, {"status": "ok"})
            elif path == "/metrics":
                totals = generator.totals
                text = (
                    f"llamacpp:prompt_tokens_total {totals['prompt_tokens']}\n"
                    "llamacpp:prompt_tokens_cached_total 0\n"  # no prompt cache here
                    f"llamacpp:tokens_predicted_total {totals['completion_tokens']}\n"
                    f"llamacpp:requests_total {totals['requests']}\n"
                )
                self._send(200, text.encode(), "text/plain; version=0.0.4")
            else:
                self._error(404, f"no such endpoint: {path}", "not_found_error")

        def do_POST(self) -> None:
            if self._refused():
                self.close_connection = True  # its body is left unread
                return
            path = self.path.split("?", 1)[0].rstrip("/")
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._error(413, f"request body of {length} bytes is larger than {MAX_BODY} bytes")
                self.close_connection = True
                return
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(body, dict):
                    raise RequestError("the request body must be a JSON object")
                if path not in ("/v1/chat/completions", "/chat/completions"):
                    self._error(404, f"no such endpoint: {path}", "not_found_error")
                    return
                model = body.get("model")
                if model not in (None, generator.name):
                    self._error(
                        404, f"model {model!r} is not served here; this server serves {generator.name}"
                    )
                    return
                self._send(200, generator.chat(body))
            except (RequestError, ValueError, TypeError) as exc:
                self._error(400, str(exc))
            except Exception as exc:  # never leave the client hanging on a model failure
                self._error(500, f"generation failed: {type(exc).__name__}: {exc}", "server_error")

    return Handler


def _watch_parent(parent: int, server: ThreadingHTTPServer) -> None:
    """Shut down when the process that started us is gone (it was killed and could not stop us)."""
    while True:
        time.sleep(2)  # a liveness check of another process: there is no event to wait on
        if os.getppid() != parent:
            server.shutdown()
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="the GGUF file")
    parser.add_argument("--name", required=True, help="the model name clients use")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--ctx", type=int, default=8192, help="context window in tokens")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--parent-pid", type=int, help="exit when this process is gone")
    args = parser.parse_args(argv)
    started = time.monotonic()
    generator = Generator(args.model, name=args.name, ctx=args.ctx, threads=args.threads)
    from ragsuite.local_lm.server import SERVER_KEY_ENV

    handler = _handler(generator, api_key=os.environ.get(SERVER_KEY_ENV) or None)
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    server_class = type("Server", (ThreadingHTTPServer,), {"address_family": family})
    server = server_class((args.host, args.port), handler)
    server.daemon_threads = True
    loaded = time.monotonic() - started
    print(f"serving {args.name} on http://{args.host}:{args.port}/v1 (loaded in {loaded:.0f} s)", flush=True)
    if args.parent_pid:
        threading.Thread(target=_watch_parent, args=(args.parent_pid, server), daemon=True).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
