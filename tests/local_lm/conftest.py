"""Test doubles for the local LM, as fixtures: a test's own cache directory, tiny GGUF files, packaged models
installed from them and a stand-in ``llama-server`` executable.

The stand-in takes llama-server's flags, serves ``/v1/models`` under ``--alias`` and answers chat
completions with a fixed reply and exact usage, so the server lifecycle and the ``--lm local`` path can be
tested without a model. Like llama-server it reads a key from ``LLAMA_API_KEY`` and then answers only
``/health`` without it. ``FAKE_EXIT`` in its environment makes it exit at once, as a server whose model
fails to load does; ``FAKE_REPLY`` replaces the reply; ``FAKE_REQUESTS`` names a file that keeps each request.
"""

from __future__ import annotations

import hashlib
import stat
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ragsuite.local_lm.models import PackagedModel


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _write_gguf(
    path: Path, metadata: dict[str, object], *, arrays: dict[str, list[object]] | None = None
) -> Path:
    """A GGUF (version 3) header with ``metadata`` (str -> string, bool, int -> uint32, float -> float32) and
    ``arrays`` (lists of strings or of uint32), no tensors."""
    entries = []
    for key, value in metadata.items():
        if isinstance(value, str):
            entries.append(_string(key) + struct.pack("<I", 8) + _string(value))
        elif isinstance(value, bool):
            entries.append(_string(key) + struct.pack("<I?", 7, value))
        elif isinstance(value, int):
            entries.append(_string(key) + struct.pack("<II", 4, value))
        else:
            entries.append(_string(key) + struct.pack("<If", 6, float(value)))
    for key, items in (arrays or {}).items():
        if all(isinstance(item, str) for item in items):
            body = b"".join(_string(str(item)) for item in items)
            entries.append(_string(key) + struct.pack("<IIQ", 9, 8, len(items)) + body)
        else:
            body = b"".join(struct.pack("<I", int(item)) for item in items)  # type: ignore[arg-type]
            entries.append(_string(key) + struct.pack("<IIQ", 9, 4, len(items)) + body)
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, len(entries))
    path.write_bytes(header + b"".join(entries))
    return path


def _tiny_model(path: Path, *, context_length: int = 32768) -> Path:
    """A GGUF header of a tiny qwen2 model (a chat template, three tokens) at ``path``."""
    return _write_gguf(
        path,
        {
            "general.architecture": "qwen2",
            "general.name": "Tiny",
            "qwen2.context_length": context_length,
            "tokenizer.chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
        },
        arrays={"tokenizer.ggml.tokens": ["a", "b", "c"], "tokenizer.ggml.token_type": [1, 1, 1]},
    )


FAKE_LLAMA_SERVER = r'''#!{python}
"""A stand-in for llama-server: its flags, /v1/models under --alias, fixed chat replies with usage."""
import argparse, json, os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
for flag in ("--model", "--alias", "--host", "--port", "--ctx-size", "--parallel", "--threads"):
    parser.add_argument(flag)
parser.add_argument("--threads-batch")
parser.add_argument("--cors-origins")
for flag in ("--metrics", "--jinja", "--no-webui", "--no-cors-credentials"):
    parser.add_argument(flag, action="store_true")
args = parser.parse_args()
print("fake llama-server", " ".join(sys.argv[1:]), flush=True)
if os.environ.get("FAKE_EXIT"):
    print("error: failed to load model", flush=True)
    sys.exit(3)
reply = os.environ.get("FAKE_REPLY", "[[ ## answer ## ]]\nParis\n\n[[ ## completed ## ]]")
key = os.environ.get("LLAMA_API_KEY")
totals = {{"prompt": 0, "completion": 0}}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, payload, ctype="application/json"):
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _unauthorized(self):  # the pinned llama-server's rule: only /health is open without the key
        if not key or self.path.split("?")[0] in ("/health", "/v1/health"):
            return False
        if self.headers.get("Authorization") == "Bearer " + key:
            return False
        data = json.dumps({{"error": {{"code": 401, "message": "Invalid API Key"}}}}).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        return True

    def do_GET(self):
        if self._unauthorized():
            return
        if self.path.startswith("/v1/models"):
            model = {{"id": args.alias, "object": "model", "owned_by": "llamacpp"}}
            self._send({{"object": "list", "data": [model]}})
        else:
            lines = [
                f"llamacpp:prompt_tokens_total {{totals['prompt']}}",
                "llamacpp:prompt_tokens_cached_total 0",
                f"llamacpp:tokens_predicted_total {{totals['completion']}}",
            ]
            self._send("\n".join(lines).encode(), "text/plain")

    def do_POST(self):
        if self._unauthorized():
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if os.environ.get("FAKE_REQUESTS"):  # a file that keeps each request body, one JSON line each
            with open(os.environ["FAKE_REQUESTS"], "a") as log:
                log.write(json.dumps(body) + "\n")
        prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        ctx = int(args.ctx_size) // int(args.parallel or 1)  # llama-server splits its window among slots
        if prompt > ctx:  # llama-server's own refusal of a prompt longer than its window
            message = f"request ({{prompt}} tokens) exceeds the available context size ({{ctx}} tokens)"
            error = {{"code": 400, "message": message, "type": "exceed_context_size_error"}}
            data = json.dumps({{"error": error}}).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        completion = len(reply.split())
        totals["prompt"] += prompt
        totals["completion"] += completion
        message = {{"role": "assistant", "content": reply}}
        usage = {{"prompt_tokens": prompt, "completion_tokens": completion}}
        self._send({{
            "id": "x", "object": "chat.completion", "created": 0, "model": args.alias,
            "choices": [{{"index": 0, "message": message, "finish_reason": "stop"}}],
            "usage": {{**usage, "total_tokens": prompt + completion}},
        }})


server = ThreadingHTTPServer((args.host, int(args.port)), Handler)
try:
    server.serve_forever()
except KeyboardInterrupt:
    pass
'''


def _fake_llama_server(folder: Path) -> Path:
    """Write the stand-in ``llama-server`` into ``folder`` and return its path."""
    path = folder / "llama-server"
    path.write_text(FAKE_LLAMA_SERVER.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _slice_packages(root: Path, data: bytes, names: list[str]) -> None:
    """Split ``data`` over packages ``names`` laid out like the model wheels (``<name>/data/partNN.bin``)."""
    size = -(-len(data) // len(names))
    for number, name in enumerate(names, start=1):
        folder = root / name / "data"
        folder.mkdir(parents=True)
        (root / name / "__init__.py").write_text("")
        (folder / f"part{number:02d}.bin").write_bytes(data[(number - 1) * size : number * size])


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """ragsuite's cache directory for the test (``$RAGSUITE_CACHE``): ``tmp_path/cache``."""
    monkeypatch.setenv("RAGSUITE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def install_packaged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., PackagedModel]:
    """``install_packaged(name, parts, sha256=None)``: a tiny packaged model ``name``, the only one known, its
    GGUF sliced over the packages ``parts`` installed under ``tmp_path/site``; ``sha256`` replaces the true
    hash of the whole."""
    from ragsuite.local_lm import models as local_models
    from ragsuite.local_lm.models import PackagedModel

    def install(name: str, parts: list[str], *, sha256: str | None = None) -> PackagedModel:
        data = _tiny_model(tmp_path / "whole.gguf").read_bytes()
        _slice_packages(tmp_path / "site", data, parts)
        monkeypatch.syspath_prepend(str(tmp_path / "site"))
        model = PackagedModel(
            name=name,
            description="test",
            parts=tuple(parts),
            requirements=tuple(f"{part.replace('_', '-')}==1.0" for part in parts),
            size=len(data),
            sha256=sha256 or hashlib.sha256(data).hexdigest(),
        )
        monkeypatch.setattr(local_models, "PACKAGED_MODELS", (model,))
        return model

    return install


@pytest.fixture(scope="session")
def write_gguf() -> Callable[..., Path]:
    """``write_gguf(path, metadata, arrays=None)``: a GGUF (version 3) header without tensors."""
    return _write_gguf


@pytest.fixture(scope="session")
def tiny_model() -> Callable[..., Path]:
    """``tiny_model(path, context_length=32768)``: a tiny qwen2 model's GGUF header at ``path``."""
    return _tiny_model


@pytest.fixture(scope="session")
def fake_llama_server() -> Callable[[Path], Path]:
    """``fake_llama_server(folder)``: the stand-in ``llama-server`` written into ``folder``, its path."""
    return _fake_llama_server


@pytest.fixture(scope="session")
def slice_packages() -> Callable[[Path, bytes, list[str]], None]:
    """``slice_packages(root, data, names)``: ``data`` split over model packages laid out like the wheels."""
    return _slice_packages
