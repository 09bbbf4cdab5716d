"""LM specs, keys from the environment, endpoint checks, per-stage LMs and redaction."""

from __future__ import annotations

import logging
import socket

import dspy
import pytest

from ragsuite.errors import ConfigError
from ragsuite.lm import (
    PLACEHOLDER_KEY,
    LMEndpointError,
    build_lm,
    check_endpoint,
    parse_lm_spec,
    parse_stage_lms,
    redact,
    resolve_endpoint,
    set_stage_lms,
    strip_credentials,
)
from ragsuite.testing.openai_server import Fault, LocalOpenAIServer
from ragsuite.testing.scripted import ScriptedLM


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_openai_spec_needs_its_key_from_the_environment(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY is not set"):
        build_lm("openai/gpt-4o-mini")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-abcdefghijklmnop")
    lm = build_lm("openai/gpt-4o-mini", max_tokens=256, timeout=30, retries=5)
    assert lm.model == "openai/gpt-4o-mini"
    assert lm.kwargs["api_key"] == "sk-test-abcdefghijklmnop"
    assert lm.kwargs["temperature"] == 0.1
    assert lm.kwargs["timeout"] == 30
    assert lm.num_retries == 5
    assert "api_key" not in lm.dump_state()


def test_vllm_shorthand_and_api_base(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-openai-key-000000")
    spec = parse_lm_spec("vllm:meta-llama/Llama-3.1-8B-Instruct@http://gpu:8001/v1")
    assert (spec.model, spec.api_base) == ("openai/meta-llama/Llama-3.1-8B-Instruct", "http://gpu:8001/v1")
    assert parse_lm_spec("vllm:qwen").api_base == "http://127.0.0.1:8000/v1"
    assert parse_lm_spec("vllm:qwen", api_base="http://h:9/v1/").api_base == "http://h:9/v1"
    lm = build_lm("openai/qwen", api_base="http://h:9/v1")
    # A keyless local server gets a placeholder; the OpenAI key never goes to another endpoint.
    assert lm.kwargs["api_key"] == PLACEHOLDER_KEY
    assert lm.kwargs["api_base"] == "http://h:9/v1"
    monkeypatch.setenv("VLLM_API_KEY", "vllm-secret-123")
    assert build_lm("vllm:qwen").kwargs["api_key"] == "vllm-secret-123"
    monkeypatch.setenv("MY_GATEWAY_KEY", "gw-secret-456")
    assert build_lm("vllm:qwen", api_key_env="MY_GATEWAY_KEY").kwargs["api_key"] == "gw-secret-456"
    with pytest.raises(ConfigError, match="UNSET_KEY_VAR is not set"):
        build_lm("vllm:qwen", api_key_env="UNSET_KEY_VAR")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "empty"),
        ("gpt-4o", "not PROVIDER/MODEL"),
        ("openai/", "not PROVIDER/MODEL"),
        ("vllm:", "names no model"),
        ("vllm:x@ftp://h/v1", "not an http"),
    ],
)
def test_bad_specs(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_lm_spec(spec)


def test_conflicting_servers_and_bad_urls():
    with pytest.raises(ConfigError, match="different servers"):
        parse_lm_spec("vllm:x@http://a:1/v1", api_base="http://b:2/v1")
    with pytest.raises(ConfigError, match="not an http"):
        parse_lm_spec("openai/x", api_base="localhost:8000")
    assert strip_credentials("http://user:pw@h:8000/v1?token=abc") == "http://h:8000/v1"


def test_parsing_a_spec_starts_no_server_reaches_no_host_and_registers_nothing(monkeypatch):
    """Parsing only describes the endpoint: a ``local`` spec starts no server, no spec asks a server
    anything, and a URL's password is not registered for redaction until the endpoint is resolved."""
    import urllib.request

    import ragsuite.local_lm as local_lm
    import ragsuite.local_lm.server as local_server

    def refuse(*args, **kwargs):
        raise AssertionError("parsing an LM spec must not start a server or reach a host")

    for module, name in (
        (local_lm, "shared_server"),
        (local_lm, "local_endpoint"),
        (local_server, "shared_server"),
    ):
        monkeypatch.setattr(module, name, refuse)
    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    for spec, api_base in (("local", None), ("local:some-model", None), ("local", "http://127.0.0.1:9/v1")):
        parsed = parse_lm_spec(spec, api_base=api_base, local_options={"threads": 2})
        assert parsed.local is None and parsed.local_model is not None
        assert parsed.local_model.spec == spec and dict(parsed.local_model.options) == {"threads": 2}
    url = "http://alice:parse-only-pw-4711@gpu:8000/v1"
    parse_lm_spec("openai/m", api_base=url)
    parse_lm_spec(f"vllm:m@{url},http://gpu-2:8000/v1")
    assert redact("echo parse-only-pw-4711") == "echo parse-only-pw-4711"


def test_a_parsed_spec_is_deterministic_and_holds_no_secret_in_sight():
    import base64

    url = "http://bob:repr-hidden-pw-90@gpu:8000/v1"
    first = parse_lm_spec("openai/m", api_base=f"{url},http://carol:other-pw-91@gpu-2:8000/v1")
    assert first == parse_lm_spec("openai/m", api_base=f"{url},http://carol:other-pw-91@gpu-2:8000/v1")
    assert first.api_base == "http://gpu:8000/v1" and first.replicas == (
        "http://gpu:8000/v1",
        "http://gpu-2:8000/v1",
    )
    token = base64.b64encode(b"bob:repr-hidden-pw-90").decode()
    assert first.authorization == f"Basic {token}"
    for secret in ("repr-hidden-pw-90", "other-pw-91", token):
        assert secret not in repr(first) and secret not in str(first.public())


def test_resolving_an_endpoint_registers_its_credentials_and_starts_the_local_server_once(monkeypatch):
    from pathlib import Path

    import ragsuite.local_lm as local_lm
    from ragsuite.local_lm import LocalEndpoint, ModelFile

    parsed = parse_lm_spec("openai/m", api_base="http://dan:resolve-pw-5150@gpu:8000/v1")
    assert redact("echo resolve-pw-5150") == "echo resolve-pw-5150"
    assert resolve_endpoint(parsed) == parsed  # nothing to start for a remote server
    assert redact("echo resolve-pw-5150") == "echo ***"
    started = []

    def fake_endpoint(spec, *, api_base=None, **options):
        started.append((spec, api_base, options))
        model = ModelFile("m-0123abcd", Path("m.gguf"), "0123abcd" * 8)
        return LocalEndpoint(model, "http://127.0.0.1:4242/v1", "llama.cpp", api_key="local-key-" + "x" * 20)

    monkeypatch.setattr(local_lm, "local_endpoint", fake_endpoint)
    parsed = parse_lm_spec("local:m", local_options={"threads": 2, "ctx": None})
    assert started == []
    resolved = resolve_endpoint(parsed)
    assert started == [("local:m", None, {"threads": 2})]
    assert (resolved.model, resolved.api_base) == ("openai/m-0123abcd", "http://127.0.0.1:4242/v1")
    assert resolved.local is not None and "local-key-" not in repr(resolved)
    assert resolve_endpoint(resolved) is resolved  # resolved once: no second server
    assert resolved.public()["sha256"] == "0123abcd" * 8 and "4242" not in str(resolved.public())


def test_check_endpoint_reports_unreachable_and_unknown_models():
    with pytest.raises(LMEndpointError, match="cannot reach the LM server"):
        check_endpoint(parse_lm_spec(f"vllm:x@http://127.0.0.1:{free_port()}/v1"), timeout=2)
    with LocalOpenAIServer(lambda r: {"answer": "a"}, model="llama-8b") as server:
        assert check_endpoint(parse_lm_spec("openai/llama-8b", api_base=server.api_base)) == ["llama-8b"]
        with pytest.raises(LMEndpointError, match="does not serve model 'llama-70b'; it serves: llama-8b"):
            build_lm("openai/llama-70b", api_base=server.api_base, check=True)
    assert check_endpoint(parse_lm_spec("anthropic/claude")) == []  # provider endpoints are not probed


class TwoStages(dspy.Module):
    def __init__(self) -> None:
        super().__init__()
        self.route = dspy.Predict("question -> label")
        self.answer = dspy.ChainOfThought("question -> answer")

    def forward(self, question: str) -> dspy.Prediction:
        label = self.route(question=question).label
        return dspy.Prediction(label=label, answer=self.answer(question=question).answer)


def test_set_stage_lms_routes_each_stage_to_its_lm():
    small = ScriptedLM(lambda r: {"label": "small", "answer": "from-small"})
    large = ScriptedLM(lambda r: {"label": "large", "answer": "from-large"})
    program = TwoStages()
    assert set_stage_lms(program, {"answer": large}) == {"answer": ["answer.predict"]}
    with dspy.context(lm=small):
        prediction = program(question="q")
    assert (prediction.label, prediction.answer) == ("small", "from-large")
    assert len(small.requests) == 1 and len(large.requests) == 1
    with pytest.raises(ConfigError, match=r"no stage 'filter'; its stages are: answer, route"):
        set_stage_lms(program, {"filter": small})


def test_parse_stage_lms():
    assert parse_stage_lms(["route=vllm:small", "answer = openai/gpt-4o"]) == {
        "route": "vllm:small",
        "answer": "openai/gpt-4o",
    }
    with pytest.raises(ConfigError, match="STAGE=SPEC"):
        parse_stage_lms(["route"])
    with pytest.raises(ConfigError, match="twice"):
        parse_stage_lms(["route=a/b", "route=c/d"])


def test_redact(monkeypatch):
    monkeypatch.setenv("SOME_SERVICE_API_KEY", "plain-secret-value")
    text = (
        "key plain-secret-value rejected; header Authorization: Bearer abcdefghijklmnop; "
        'token sk-proj-ABCDEFGHIJKLMNOP1234 and {"api_key": "zzzzzzzzzz"} but answer 42 stays'
    )
    cleaned = redact(text)
    for secret in ("plain-secret-value", "abcdefghijklmnop", "sk-proj-ABCDEFGHIJKLMNOP1234", "zzzzzzzzzz"):
        assert secret not in cleaned
    assert "answer 42 stays" in cleaned and "Bearer ***" in cleaned


def test_redact_hides_basic_auth_in_every_form_and_passwords_holding_an_at(monkeypatch):
    """A server echoing ``Authorization: Basic <base64>`` put the encoded password in records, the HTML report
    and stderr; ``http://alice:p@ss@host`` left ``ss`` in sight."""
    import base64

    from ragsuite.data import download
    from ragsuite.optimizers.tuning import redact_storage
    from ragsuite.redaction import register_secret, register_url_credentials

    token = base64.b64encode(b"alice:p@ss-w0rd-9").decode()
    # A registered secret that is a piece of a token (as another test's may be) must not cut it.
    other = base64.b64encode(b"bob:s3cret-pass-99").decode()
    register_secret(other[:16])
    assert redact(f"got Basic {other} and more") == "got Basic *** and more"
    # Header-shaped tokens are recognised without any configuration.
    assert redact(f"headers {{'Authorization': 'Basic {token}'}}") == "headers {'Authorization': 'Basic ***'}"
    assert redact(f"got Basic {token} and bearer abcdefghijkl") == "got Basic *** and bearer ***"
    assert redact("authorization=Token abcdef123; next") == "authorization=Token ***; next"
    # "basic" as a word, and base64 that is no user:password, stay.
    for text in ("basic retrieval beats Basic RAG", "Basic dGVzdGluZw== is base64 of 'testing'"):
        assert redact(text) == text
    # The password holds "@": the whole user:password is hidden, up to the host.
    url = "http://alice:p@ss-w0rd-9@gpu-7:8000/v1/models"
    assert redact(f"GET {url} failed") == "GET http://***@gpu-7:8000/v1/models failed"
    assert redact_storage("postgresql://u:p@ss-w0rd-9@db/optuna") == "postgresql://u:***@db/optuna"
    # A configured URL's password, user:password and bare token are hidden wherever they appear.
    text = f"echo: {token} / alice:p@ss-w0rd-9 / p@ss-w0rd-9"
    assert redact(text) == text  # not configured yet: a bare token cannot be told from other text
    resolve_endpoint(parse_lm_spec("openai/m", api_base=url.removesuffix("/models")))
    assert redact(text) == "echo: *** / *** / ***"
    # A key read from a variable of any name (--api-key-env) is hidden too.
    monkeypatch.setenv("LLM_CREDENTIAL", "opaque-credential-42")
    build_lm("openai/m", api_base="http://127.0.0.1:1/v1", api_key_env="LLM_CREDENTIAL")
    assert redact("rejected opaque-credential-42") == "rejected ***"
    # One redaction for every message: the downloader's is the same function.
    register_url_credentials("http://bob:mirror-secret@10.0.0.5:8080")
    assert download.redact is redact
    assert "mirror-secret" not in download.redact("cannot reach http://bob:mirror-secret@10.0.0.5:8080/x")


def test_every_log_line_and_error_of_the_command_line_is_redacted(monkeypatch, capsys, tmp_path):
    """Libraries log through their own loggers and handlers (LiteLLM, DSPy, MLflow): each line is redacted,
    its traceback too, as is the one-line error of a command."""
    from ragsuite.cli import main

    monkeypatch.setenv("VLLM_API_KEY", "vllm-key-0123456789abcdef")
    url = "http://alice:s3cret@pass@127.0.0.1:9/v1"
    # The endpoint is unreachable: the command stops with one error line naming it.
    argv = ["eval", "--program", "vanilla", "--dataset", "hotpotqa", "--out", str(tmp_path / "run")]
    assert main([*argv, "--lm", f"vllm:m@{url}"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the LM server" in err and "s3cret" not in err and "pass@" not in err
    stream = __import__("io").StringIO()
    handler = logging.StreamHandler(stream)
    library = logging.getLogger("some.library")
    library.addHandler(handler)
    try:
        try:
            raise RuntimeError("upstream said key=vllm-key-0123456789abcdef")
        except RuntimeError:
            library.exception("call to %s failed", url)
    finally:
        library.removeHandler(handler)
    logged = stream.getvalue()
    assert (
        "call to http://***@127.0.0.1:9/v1 failed" in logged
        and "RuntimeError: upstream said key=***" in logged
    )
    assert "s3cret" not in logged and "vllm-key-0123456789abcdef" not in logged
    # A crash nothing caught prints its traceback redacted too.
    import sys

    try:
        raise RuntimeError(f"crashed calling {url}")
    except RuntimeError:
        sys.excepthook(*sys.exc_info())
    crash = capsys.readouterr().err
    assert "RuntimeError: crashed calling http://***@127.0.0.1:9/v1" in crash and "s3cret" not in crash


def test_memoized_pricing_lookup_returns_what_dspy_would():
    from dspy.clients import costs
    from dspy.clients.model_metadata import model_info as original

    build_lm("openai/local", api_base="http://127.0.0.1:1/v1")
    assert getattr(costs.model_info, "_ragsuite_memoized", False)
    for provider, model in (("openai-chat", "gpt-4o-mini"), ("openai-chat", "not-a-known-model")):
        first = costs.model_info(provider, model)
        assert first == original(provider, model) == costs.model_info(provider, model)
        first["mutated"] = True  # callers get copies: the memo is not corrupted
        assert "mutated" not in costs.model_info(provider, model)


@pytest.mark.parametrize(
    "fault",
    [Fault("rate_limit", seconds=3600), Fault("rate_limit", retry_after="Fri, 31 Dec 2099 23:59:59 GMT")],
    ids=["an-hour", "an-http-date-in-2099"],
)
def test_retry_after_waits_are_capped_and_logged(fault, caplog):
    """Retry-After: 3600 (or a date in 2099) used to stall the run silently for that long."""
    import time

    with LocalOpenAIServer(lambda request: {"answer": "Rush"}) as server:
        server.inject(fault)
        lm = build_lm("openai/scripted", api_base=server.api_base, cache=False, retries=2, max_retry_wait=0.2)
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="ragsuite.lm"), dspy.context(lm=lm):
            answer = dspy.Predict("question -> answer")(question="Which band?").answer
        elapsed = time.monotonic() - started
    assert answer == "Rush" and server.chat_requests == 2
    assert elapsed < 10
    waits = [r.getMessage() for r in caplog.records if "retry 1 in 0.2 s" in r.getMessage()]
    assert waits and "capped by --max-retry-wait" in waits[0]


def test_the_endpoint_check_never_carries_the_key_to_another_host(monkeypatch):
    """/v1/models redirecting to another host used to receive the key there too."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    seen: list[str | None] = []

    def serve(handler_cls):
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler_cls)
        Thread(target=server.serve_forever, daemon=True).start()
        return server

    class Attacker(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            body = b'{"data": [{"id": "scripted"}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    attacker = serve(Attacker)
    # "localhost" and "127.0.0.1" are different hosts for the browser-style origin check.
    target = f"http://localhost:{attacker.server_address[1]}/v1/models"

    class Redirector(Attacker):
        def do_GET(self):
            if self.path.startswith("/v1/models"):
                self.send_response(302)
                self.send_header("Location", target)
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                super().do_GET()

    redirector = serve(Redirector)
    try:
        monkeypatch.setenv("SECRET_SERVER_KEY", "sk-test-secret-key-123456")
        spec = parse_lm_spec(
            "openai/scripted",
            api_base=f"http://127.0.0.1:{redirector.server_address[1]}/v1",
            api_key_env="SECRET_SERVER_KEY",
        )
        with pytest.raises(LMEndpointError, match="redirected to another host") as info:
            check_endpoint(spec)
        assert "sk-test-secret" not in str(info.value)
        assert seen == []  # the other host was never even asked
    finally:
        for server in (attacker, redirector):
            server.shutdown()
            server.server_close()


@pytest.mark.parametrize(
    ("fault", "expected", "not_expected"),
    [
        (Fault("delay", seconds=3), "did not answer within --timeout 0.3 s on 2 attempt(s)", "timeout="),
        (Fault("rate_limit", seconds=0), "429 (rate limited) on 2 attempt(s)", "never retries"),
    ],
    ids=["timeout", "rate-limit"],
)
def test_lm_failures_name_the_flag_to_change(fault, expected, not_expected):
    from ragsuite.evaluation import evaluate
    from ragsuite.programs.baselines import NoRetrieval

    examples = [dspy.Example(id="q1", question="Which band?", answers=["Rush"]).with_inputs("question")]
    with LocalOpenAIServer(lambda request: {"answer": "Rush"}) as server:
        server.inject(fault, fault)  # the first attempt and its one retry
        lm = build_lm("openai/scripted", api_base=server.api_base, cache=False, retries=1, timeout=0.3)
        with dspy.context(lm=lm):
            result = evaluate(NoRetrieval(), examples, dataset="hotpotqa", progress=False)
    message = result.records[0]["error"]["message"]
    assert expected in message and not_expected not in message, message


def test_each_program_gets_its_papers_generation_settings_unless_flags_say_otherwise():
    """The official DeepNote code generates with max_tokens 1280 and top_p 0.9; others keep 0.1 and 1024."""
    import argparse

    from ragsuite.cli.args import add_lm_arguments, generation_settings

    parser = argparse.ArgumentParser()
    parser.add_argument("--program")
    parser.add_argument("--program-file", default=None)
    add_lm_arguments(parser)

    def settings(*argv):
        return generation_settings(parser.parse_args(["--lm", "openai/x", *argv]))

    assert settings("--program", "deepnote") == {"temperature": 0.1, "max_tokens": 1280, "top_p": 0.9}
    assert settings("--program", "adaptive-note")["top_p"] == 0.9
    assert settings("--program", "vanilla") == {"temperature": 0.1, "max_tokens": 1024, "top_p": None}
    assert settings("--program", "deepnote", "--top-p", "1.0", "--max-tokens", "300") == {
        "temperature": 0.1,
        "max_tokens": 300,
        "top_p": 1.0,
    }
    lm = build_lm("openai/x", api_base="http://127.0.0.1:9/v1", top_p=0.9, max_tokens=1280)
    assert lm.kwargs["top_p"] == 0.9 and lm.kwargs["max_tokens"] == 1280


def test_retry_after_is_read_as_seconds_or_an_http_date():
    from ragsuite.lm_client import retry_after_seconds

    assert retry_after_seconds("3600") == 3600.0 and retry_after_seconds(1.5) == 1.5
    assert retry_after_seconds("Thu, 01 Jan 1998 00:00:00 GMT") == 0.0  # a date past: retry now
    assert retry_after_seconds("Fri, 31 Dec 2099 23:59:59 GMT") > 365 * 24 * 3600
    for unusable in (None, "", "soon", "-5", "nan", True):
        assert retry_after_seconds(unusable) is None, unusable
