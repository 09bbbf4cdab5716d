"""One LM over several replicas (LiteLLM's Router): requests spread over them, a failing or down replica's
requests move to another, keys and passwords stay out of run files; `ragsuite serve --replicas N`."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dspy
import pytest

from ragsuite.cli import main
from ragsuite.errors import ConfigError
from ragsuite.lm import build_lm, parse_lm_spec
from ragsuite.lm_replicas import ReplicaLM
from ragsuite.processes import stop_process
from ragsuite.testing.openai_server import Fault, LocalOpenAIServer


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answer(request) -> dict:
    return {"answer": f"echo {request.inputs.get('question', '')}"}


@contextlib.contextmanager
def servers(count: int, **kwargs) -> Iterator[list[LocalOpenAIServer]]:
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(LocalOpenAIServer(answer, **kwargs)) for _ in range(count)]


def ask_all(lm: dspy.BaseLM, questions: list[str], threads: int = 8) -> list[str]:
    predict = dspy.Predict("question -> answer")
    predict.lm = lm
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda q: predict(question=q).answer, questions))


def test_specs_with_several_servers_are_replicas_of_one_model():
    spec = parse_lm_spec("openai/m", api_base="http://a:1/v1, http://b:2/v1/")
    assert spec.replicas == ("http://a:1/v1", "http://b:2/v1") and spec.api_base == "http://a:1/v1"
    assert parse_lm_spec("vllm:m@http://a:1/v1,http://u:pw@b:2/v1").public()["api_base"] == [
        "http://a:1/v1",
        "http://b:2/v1",
    ]
    assert parse_lm_spec("openai/m", api_base=["http://a:1/v1", "http://b:2/v1"]).replicas
    assert parse_lm_spec("openai/m", api_base="http://a:1/v1").replicas == ()
    with pytest.raises(ConfigError, match="http://a:1/v1 twice"):
        parse_lm_spec("openai/m", api_base="http://a:1/v1,http://u:p@a:1/v1")
    with pytest.raises(ConfigError, match="empty item"):
        parse_lm_spec("openai/m", api_base="http://a:1/v1,")
    with pytest.raises(ConfigError, match="not an http"):
        parse_lm_spec("openai/m", api_base="http://a:1/v1,ftp://b/v1")


class Held:
    """A responder that holds every request until ``release`` is set, counting arrivals so a test can wait for
    each request to reach a server (an event, not a sleep) before sending the next."""

    def __init__(self) -> None:
        self.arrived = 0
        self.release = threading.Event()
        self._changed = threading.Condition()

    def __call__(self, request) -> dict:
        with self._changed:
            self.arrived += 1
            self._changed.notify_all()
        assert self.release.wait(60), "the test never released its held requests"
        return answer(request)

    def wait_for(self, count: int) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: self.arrived >= count, timeout=60), (self.arrived, count)


def test_requests_spread_over_every_replica_with_the_same_key(monkeypatch):
    """Least-busy sends each request to the replica with the fewest in flight. Requests are sent one at a
    time, each once the previous one is held by a server, so the Router always sees the true counts
    (requests fired together race between choosing a replica and counting it: LiteLLM's, timing-dependent)."""
    monkeypatch.setenv("VLLM_API_KEY", "replica-key-123456")
    held = Held()
    with contextlib.ExitStack() as stack:
        replicas = [stack.enter_context(LocalOpenAIServer(held)) for _ in range(3)]
        bases = [s.api_base for s in replicas]
        lm = build_lm("openai/scripted", api_base=bases, cache=False, check=True)
        assert isinstance(lm, ReplicaLM) and lm.replicas == tuple(bases)
        predict = dspy.Predict("question -> answer")
        predict.lm = lm
        questions = [f"q{i}" for i in range(6)]
        with ThreadPoolExecutor(len(questions)) as pool:
            try:
                futures = []
                for number, question in enumerate(questions, start=1):
                    futures.append(pool.submit(lambda q=question: predict(question=q).answer))
                    held.wait_for(number)
                in_flight = [s.chat_requests for s in replicas]
            finally:
                held.release.set()
            assert [f.result() for f in futures] == [f"echo {q}" for q in questions]
        counts = [s.chat_requests for s in replicas]
        keys = [dict(s.authorizations) for s in replicas]
    assert in_flight == [2, 2, 2], in_flight  # 6 requests held at once: two on each replica
    assert counts == [2, 2, 2], counts
    assert all(k == {"Bearer replica-key-123456": 2} for k in keys), keys
    state = json.dumps(lm.dump_state())
    assert "replica-key" not in state and all(base in state for base in bases)


def test_saved_state_lists_the_replicas_without_credentials_and_loads_back(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "replica-key-123456")
    lm = build_lm("openai/m", api_base="http://alice:pw-secret@a:1/v1,http://b:2/v1", seed=1)
    predict = dspy.Predict("question -> answer")
    predict.lm = lm
    text = json.dumps(predict.dump_state())
    assert "pw-secret" not in text and "alice" not in text and "replica-key" not in text
    assert '"replicas": ["http://a:1/v1", "http://b:2/v1"]' in text and '"key_env": "VLLM_API_KEY"' in text
    loaded = dspy.BaseLM.load_state(lm.dump_state(), allow_custom_lm_class=True)
    assert isinstance(loaded, ReplicaLM) and loaded.replicas == ("http://a:1/v1", "http://b:2/v1")
    assert loaded.kwargs["seed"] == 1 and loaded.cache_scope == lm.cache_scope


@pytest.mark.parametrize("failure", ["server_error", "down"])
def test_a_failing_replica_s_requests_move_to_another(failure, caplog):
    with servers(2) as (good, bad):
        broken = bad.api_base
        if failure == "down":
            broken = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
        else:
            bad.fault_fn = lambda number, request: Fault("server_error")
        # The broken replica first: least-busy sends it the first request.
        lm = build_lm("openai/scripted", api_base=[broken, good.api_base], cache=False, retries=0)
        questions = [f"q{i}" for i in range(16)]
        with caplog.at_level(logging.WARNING, logger="ragsuite.lm"):
            assert ask_all(lm, questions, threads=4) == [f"echo {q}" for q in questions]
    assert good.chat_requests == 16
    if failure == "server_error":
        assert bad.chat_requests >= 1  # it was tried, and each of its failures went to the good one
    assert not [r for r in caplog.records if "retry" in r.getMessage()]  # no DSPy retry was needed


def test_every_replica_busy_waits_are_dspy_s_capped_ones(caplog):
    """Both replicas answer 429 with Retry-After: 3600 once: the Router fails over without waiting, then
    DSPy's retry waits no longer than --max-retry-wait, and says so."""
    with servers(2) as replicas:
        for server in replicas:
            server.inject(Fault("rate_limit", seconds=3600))
        lm = build_lm(
            "openai/scripted",
            api_base=[s.api_base for s in replicas],
            cache=False,
            retries=2,
            max_retry_wait=0.2,
        )
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="ragsuite.lm"):
            assert ask_all(lm, ["Which band?"]) == ["echo Which band?"]
        elapsed = time.monotonic() - started
        assert sum(s.chat_requests for s in replicas) == 3
    assert elapsed < 15
    waits = [r.getMessage() for r in caplog.records if "retry 1 in 0.2 s" in r.getMessage()]
    assert waits and "capped by --max-retry-wait" in waits[0]


def test_cached_answers_belong_to_the_set_of_replicas():
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    try:
        with servers(3) as (a, b, c):
            pair = build_lm("openai/scripted", api_base=[a.api_base, b.api_base], cache=True)
            assert ask_all(pair, ["cached?"]) == ["echo cached?"]
            assert ask_all(pair, ["cached?"]) == ["echo cached?"]
            assert a.chat_requests + b.chat_requests == 1  # the second came from the cache
            other = build_lm("openai/scripted", api_base=[a.api_base, c.api_base], cache=True)
            assert ask_all(other, ["cached?"]) == ["echo cached?"]
            assert a.chat_requests + b.chat_requests + c.chat_requests == 2  # another set: asked again
    finally:
        dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)


def _eval(out: Path, *api_base_flags: str) -> list[str]:
    return [
        "eval",
        "--program",
        "no-retrieval",
        "--dataset",
        "hotpotqa",
        "--lm",
        "openai/scripted",
        *api_base_flags,
        "--no-cache",
        "--no-progress",
        "--limit",
        "6",
        "--threads",
        "3",
        "--retries",
        "0",
        "--out",
        str(out),
    ]


@pytest.mark.parametrize("engine", ["threads", "async"])
def test_eval_over_replicas_scores_right_with_one_failing_and_keeps_passwords_out(engine, tmp_path, capsys):
    from ragsuite.data.datasets import load_dataset

    gold = {ex.question: ex.answers[0] for ex in load_dataset("hotpotqa")[:6]}

    def gold_answer(request) -> dict:
        return {"answer": gold.get(request.inputs.get("question", ""), "?")}

    with contextlib.ExitStack() as stack:
        good, bad, third = (stack.enter_context(LocalOpenAIServer(gold_answer)) for _ in range(3))
        bad.fault_fn = lambda number, request: Fault("server_error")
        bases = [bad.api_base, good.api_base, third.api_base]
        with_password = bad.api_base.replace("http://", "http://alice:s3cret-pass@")
        code = main(
            _eval(
                tmp_path / "run",
                "--api-base",
                with_password,
                "--api-base",
                f"{good.api_base},{third.api_base}",
                "--engine",
                engine,
            )
        )
        captured = capsys.readouterr()
        assert code == 0, captured.err
        assert bad.chat_requests >= 1 and good.chat_requests + third.chat_requests == 6
        assert set(bad.authorizations) == {"Basic YWxpY2U6czNjcmV0LXBhc3M="}  # its own basic auth only
        assert set(good.authorizations) | set(third.authorizations) == {"Bearer EMPTY"}
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["n"], summary["errors"], summary["metrics"]["exact_match"]) == (6, 0, 1.0)
    assert summary["cost"]["lm_requests"] == 1.0  # answered requests; failed-over attempts are not counted
    manifest_text = (tmp_path / "run" / "manifest.json").read_text()
    manifest = json.loads(manifest_text)
    assert manifest["lm"]["api_base"] == bases
    for name in os.listdir(tmp_path / "run"):
        assert "s3cret" not in (tmp_path / "run" / name).read_text(errors="replace"), name
    assert "s3cret" not in captured.out + captured.err


def test_eval_refuses_a_replica_that_is_down_at_the_start(tmp_path, capsys):
    with LocalOpenAIServer(answer) as good:
        dead = f"http://127.0.0.1:{free_port()}/v1"
        assert main(_eval(tmp_path / "run", "--api-base", good.api_base, "--api-base", dead)) == 2
        err = capsys.readouterr().err
    assert f"cannot reach the LM server at {dead}/models" in err and "one of 2 replicas" in err
    assert not (tmp_path / "run" / "records.jsonl").exists()


# ----------------------------------------------------------------------------------- serve --replicas
def free_ports(count: int) -> int:
    """A base port with ``count`` free ports after it."""
    for _ in range(50):
        base = free_port()
        if base + count > 65535:
            continue
        try:
            with contextlib.ExitStack() as stack:
                for port in range(base, base + count):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no run of free ports")


def test_serve_replicas_one_per_gpu_group_and_prints_the_flags(tmp_path, fake_vllm):
    script, logs = fake_vllm(tmp_path)
    port = free_ports(2)
    argv = [sys.executable, "-m", "ragsuite", "serve", "--model", "org/M", "--port", str(port)]
    argv += ["--replicas", "2", "--tensor-parallel-size", "2", "--vllm", str(script)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    bases = [f"http://127.0.0.1:{port + i}/v1" for i in range(2)]
    try:
        lines = [process.stdout.readline() for _ in range(3)]
        assert lines[0].startswith(f"vLLM is serving org/M on 2 replicas at {bases[0]}, {bases[1]}"), lines
        assert lines[1].strip() == f"use: --lm openai/org/M --api-base {bases[0]} --api-base {bases[1]}"
        assert lines[2].strip() == f"or: --lm vllm:org/M@{bases[0]},{bases[1]}"
        records = [json.loads((logs / f"{port + i}.json").read_text()) for i in range(2)]
        assert [record["gpus"] for record in records] == ["4,5", "6,7"]
        assert all(r["args"][r["args"].index("--tensor-parallel-size") + 1] == "2" for r in records)
        # The printed flags work: the replicas answer as one LM's servers.
        spec = parse_lm_spec("openai/org/M", api_base=bases)
        from ragsuite.lm import check_endpoint

        assert check_endpoint(spec) == ["org/M"]
        process.send_signal(2)  # Ctrl-C stops every replica
        assert process.wait(timeout=30) == 0
    finally:
        stop_process(process)
    for base in bases:
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{base}/models", timeout=2)


def test_serve_replicas_stops_all_when_one_fails_to_start(tmp_path, capsys, fake_vllm):
    port = free_ports(3)
    script, _ = fake_vllm(tmp_path, fail_port=port + 1)
    code = main(["serve", "--model", "m", "--port", str(port), "--replicas", "3", "--vllm", str(script)])
    assert code == 2
    assert "replica 1 (GPU 1, http://127.0.0.1:" in capsys.readouterr().err
    for i in (0, 2):
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port + i}/v1/models", timeout=2)


def test_serve_replicas_errors(capsys, monkeypatch, tmp_path, fake_vllm):
    script, _ = fake_vllm(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert main(["serve", "--model", "m", "--replicas", "3", "--vllm", str(script)]) == 2
    assert "needs 3 GPUs, but CUDA_VISIBLE_DEVICES lists 2" in capsys.readouterr().err
    assert main(["serve", "--model", "m", "--replicas", "0", "--vllm", str(script)]) == 2
    assert "--replicas must be >= 1" in capsys.readouterr().err


# ----------------------------------------------------------------------------------- every replica down
def test_every_replica_down_is_a_transport_error_naming_them():
    dead = [f"http://127.0.0.1:{free_port()}/v1" for _ in range(2)]
    lm = build_lm("openai/scripted", api_base=dead, cache=False, retries=0)
    with pytest.raises(dspy.utils.exceptions.LMTransportError) as raised:
        ask_all(lm, ["Which band?"])
    message = str(raised.value)
    assert "failed to connect to any of the 2 replicas" in message and all(url in message for url in dead)
    for url in dead:  # a port number may hold the digits 429
        message = message.replace(url, "<replica>")
    assert "429" not in message and "rate limit" not in message.lower(), message


@pytest.mark.parametrize("engine", ["threads", "async"])
def test_eval_stops_saying_cannot_reach_when_every_replica_goes_down(engine, tmp_path, capsys, monkeypatch):
    """Replicas that answered the check at the start and then went down: the run stops at once with the
    replicas named, not one "429 rate limited, lower --threads" record per question."""
    import ragsuite.lm

    monkeypatch.setattr(ragsuite.lm, "check_endpoint", lambda spec, timeout=10.0: [])  # they were up then
    dead = [f"http://127.0.0.1:{free_port()}/v1" for _ in range(2)]
    code = main(_eval(tmp_path / "run", "--api-base", ",".join(dead), "--engine", engine))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "cannot reach" in err and all(url in err for url in dead), err
    for url in dead:  # a port number may hold the digits 429
        err = err.replace(url, "<replica>")
    assert "429" not in err and "lower --threads" not in err


@pytest.mark.slow
def test_the_throughput_benchmark_runs_against_the_local_server(tmp_path, repo_root):
    """benchmarks/replicas.py subclasses the local server; a change of its internals must not break it."""
    argv = ["--replicas", "1", "2", "--latency", "0.02", "--capacity", "2", "--threads", "4", "--rounds", "2"]
    done = subprocess.run(
        [sys.executable, str(repo_root / "benchmarks" / "replicas.py"), *argv],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=300,
        # PYTHONPATH: this checkout's ragsuite, whichever one the environment has installed.
        env={**os.environ, "PYTHONPATH": str(repo_root), "DSPY_CACHEDIR": str(tmp_path / "dspy")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| 2, replicas | 8 |" in done.stdout, done.stdout


# ------------------------------------------------------------------------ LiteLLM's Router, public API
def test_the_router_is_litellm_s_own_configured_through_public_arguments():
    """The replicas are routed by ``litellm.Router`` itself (not a subclass, nor ragsuite's own picking), and
    the module uses no private name of litellm or DSPy."""
    import ast
    import inspect

    import litellm

    import ragsuite.lm_replicas as module

    lm = build_lm("openai/m", api_base="http://a:1/v1,http://u:pw@b:2/v1", max_retry_wait=3)
    router = lm.engine.router
    assert type(router) is litellm.Router
    assert [d["model_info"]["id"] for d in router.model_list] == ["http://a:1/v1", "http://b:2/v1"]
    assert router.routing_strategy == "least-busy" and router.num_retries == 1
    assert router.allowed_fails == 0 and router.cooldown_time == 3  # --max-retry-wait caps the rest
    tree = ast.parse(inspect.getsource(module))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] in ("litellm", "dspy"):
            assert not any(alias.name.startswith("_") for alias in node.names), ast.unparse(node)
            assert not any(part.startswith("_") for part in node.module.split(".")), node.module
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            assert not ast.unparse(node).startswith(("router.", "self.router.", "litellm.")), ast.unparse(
                node
            )
        if isinstance(node, ast.ClassDef):
            assert "Router" not in {ast.unparse(base) for base in node.bases}, node.name


def test_a_failed_replica_rests_then_serves_again():
    """One 500: the Router retries on the other replica at once, and the failed one gets nothing until its
    cooldown (here --max-retry-wait, 2 s) is over; then it serves again."""
    with servers(2) as (bad, good):
        bad.inject(Fault("server_error"))
        lm = build_lm(
            "openai/scripted",
            api_base=[bad.api_base, good.api_base],
            cache=False,
            retries=0,
            max_retry_wait=2.0,
        )
        deadline = time.monotonic() + 30
        while bad.chat_requests == 0 and time.monotonic() < deadline:
            assert ask_all(lm, [f"warm {time.monotonic()}"], threads=1)[0].startswith("echo")
        failed_at = time.monotonic()
        assert bad.chat_requests == 1  # the 500, retried on the good replica in the same call
        resting = [ask_all(lm, [f"q{i}"], threads=1) for i in range(5)]
        within = time.monotonic() - failed_at
        assert within < 2.0 and bad.chat_requests == 1, within  # every request went to the good one
        assert all(answers[0].startswith("echo") for answers in resting)
        while bad.chat_requests == 1 and time.monotonic() < deadline:
            ask_all(lm, [f"later {time.monotonic()}"], threads=1)
        back = time.monotonic() - failed_at
    assert bad.chat_requests > 1 and back >= 1.9, back  # back after its cooldown, not before


def test_every_replica_resting_is_a_rate_limit_that_dspy_waits_out(caplog):
    """Both replicas fail: both rest. A call while they rest reaches neither (the Router answers at once);
    it is a rate limit whose Retry-After is the cooldown, and DSPy's capped retry waits it out."""
    with servers(2) as replicas:
        for server in replicas:
            server.inject(Fault("server_error"))
        bases = [s.api_base for s in replicas]
        lm = build_lm("openai/scripted", api_base=bases, cache=False, retries=0, max_retry_wait=0.5)
        with pytest.raises(dspy.utils.exceptions.LMServerError):
            ask_all(lm, ["first"])
        assert sum(s.chat_requests for s in replicas) == 2  # one pass over both
        with pytest.raises(dspy.utils.exceptions.LMRateLimitError) as raised:
            ask_all(lm, ["while resting"])
        assert "every one of the 2 replicas failed" in str(raised.value) and "retry in 0.5 s" in str(
            raised.value
        )
        assert sum(s.chat_requests for s in replicas) == 2  # nothing was sent
        patient = build_lm("openai/scripted", api_base=bases, cache=False, retries=1, max_retry_wait=0.5)
        for server in replicas:
            server.inject(Fault("server_error"))
        with caplog.at_level(logging.WARNING, logger="ragsuite.lm"):
            assert ask_all(patient, ["Which band?"]) == ["echo Which band?"]
        assert sum(s.chat_requests for s in replicas) == 5
