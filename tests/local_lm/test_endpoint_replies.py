"""``--api-base`` servers whose ``/v1/models`` reply has the wrong shape: one clear error line naming the
server, never a traceback, for the local LM (``--lm local --api-base``) and any other server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ragsuite.lm import LMEndpointError, check_endpoint, parse_lm_spec, resolve_endpoint
from ragsuite.local_lm import LocalServerError

#: /v1/models replies that are JSON but not an OpenAI model list.
WRONG_SHAPES = {
    "a list": [{"id": "m"}],
    "null": None,
    "a string": "models",
    "data an object": {"data": {"id": "m"}},
    "data a string": {"data": "m"},
    "an id that is a number": {"data": [{"id": 5, "owned_by": "llamacpp"}]},
    "an entry that is a list": {"data": [["m"]]},
    "owned_by an object": {"data": [{"id": "PLACEHOLDER", "owned_by": {"x": 1}}]},
}


class _ModelsServer:
    """Answers ``GET /v1/models`` with ``body`` (JSON), on 127.0.0.1, from a background thread."""

    def __init__(self) -> None:
        self.body: object = {"data": []}
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                data = json.dumps(owner.body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"


@pytest.fixture
def models_server() -> Iterator[_ModelsServer]:
    server = _ModelsServer()
    server.thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()
        server.thread.join(timeout=10)


def _shape(body: object, served: str) -> object:
    return json.loads(json.dumps(body).replace("PLACEHOLDER", served))


@pytest.mark.parametrize("case", sorted(WRONG_SHAPES))
def test_a_local_server_listing_models_in_the_wrong_shape_is_one_clear_error(
    tmp_path: Path, cache: Path, models_server: _ModelsServer, case: str, tiny_model
) -> None:
    from ragsuite.local_lm import resolve_model

    path = tiny_model(tmp_path / "m.gguf")
    models_server.body = _shape(WRONG_SHAPES[case], resolve_model(f"local:{path}").name)
    with pytest.raises(LocalServerError, match="not an OpenAI model list") as raised:
        resolve_endpoint(parse_lm_spec(f"local:{path}", api_base=models_server.api_base))
    assert models_server.api_base in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("case", sorted(set(WRONG_SHAPES) - {"owned_by an object"}))  # read for local only
def test_any_server_listing_models_in_the_wrong_shape_is_one_clear_error(
    models_server: _ModelsServer, case: str
) -> None:
    models_server.body = _shape(WRONG_SHAPES[case], "m")
    spec = parse_lm_spec("openai/m", api_base=models_server.api_base)
    with pytest.raises(LMEndpointError, match="not an OpenAI model list") as raised:
        check_endpoint(spec)
    assert models_server.api_base in str(raised.value) and "\n" not in str(raised.value)


def test_a_well_formed_list_still_passes(
    tmp_path: Path, cache: Path, models_server: _ModelsServer, tiny_model
) -> None:
    from ragsuite.local_lm import resolve_model

    path = tiny_model(tmp_path / "m.gguf")
    name = resolve_model(f"local:{path}").name
    models_server.body = {"object": "list", "data": [{"id": name, "owned_by": "llamacpp"}]}
    resolved = resolve_endpoint(parse_lm_spec(f"local:{path}", api_base=models_server.api_base))
    assert resolved.local.engine == "llama.cpp"
    models_server.body = {"object": "list", "data": [{"id": "m"}]}
    assert check_endpoint(parse_lm_spec("openai/m", api_base=models_server.api_base)) == ["m"]


@pytest.mark.parametrize("lm", ["local", "openai/m"])
def test_eval_against_a_server_answering_a_json_list_prints_one_error_line(
    tmp_path: Path,
    cache: Path,
    models_server: _ModelsServer,
    capsys: pytest.CaptureFixture[str],
    lm: str,
    tiny_model,
) -> None:
    from ragsuite.cli import main

    models_server.body = [{"id": "m"}]
    spec = f"local:{tiny_model(tmp_path / 'm.gguf')}" if lm == "local" else lm
    argv = ["eval", "--program", "no-retrieval", "--dataset", "hotpotqa", "--lm", spec, "--api-base",
            models_server.api_base, "--limit", "1", "--no-cache", "--no-progress",
            "--out", str(tmp_path / "r")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "not an OpenAI model list" in lines[0], err
