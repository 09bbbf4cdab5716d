"""The embedded local LM without a model: GGUF metadata, verified assembly of packaged models, the server's
lifecycle against a stand-in llama-server, and the ``--lm local`` path through ``build_lm``."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from ragsuite.errors import ConfigError, MissingExtraError
from ragsuite.local_lm.models import ModelFileError, PackagedModel, read_gguf_metadata, resolve_model
from ragsuite.local_lm.server import LocalServer, LocalServerError, plan_settings, resolve_engine


def test_gguf_metadata_reads_scalars_and_strings_and_skips_arrays(tmp_path: Path, tiny_model) -> None:
    path = tiny_model(tmp_path / "m.gguf", context_length=4096)
    metadata = read_gguf_metadata(path)
    assert metadata["general.architecture"] == "qwen2"
    assert metadata["qwen2.context_length"] == 4096
    assert metadata["tokenizer.chat_template"].startswith("{% for m")
    assert "tokenizer.ggml.tokens" not in metadata  # arrays are skipped, not loaded


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"PK\x03\x04 not a model", "not a GGUF model file"),
        (b"GGUF\x03\x00\x00\x00", "truncated"),
        (
            b"GGUF"
            + (3).to_bytes(4, "little")
            + bytes(8)
            + (1).to_bytes(8, "little")
            + (10**12).to_bytes(8, "little"),
            "corrupt",
        ),
    ],
)
def test_a_file_that_is_not_a_whole_gguf_header_is_refused_clearly(
    tmp_path: Path, content: bytes, message: str
) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelFileError, match=message):
        read_gguf_metadata(path)


@pytest.fixture
def packaged(install_packaged) -> Callable[..., PackagedModel]:
    """``packaged(sha256=None)``: a tiny packaged model (the only one known), its slices installed under
    ``tmp_path/site``; ``sha256`` replaces the true hash of the whole."""
    names = ["fake_model_part1", "fake_model_part2", "fake_model_part3"]
    return functools.partial(install_packaged, "tiny-test-model", names)


def test_a_packaged_model_is_joined_verified_and_then_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path, packaged
) -> None:
    model = packaged()
    first = resolve_model("local:tiny-test-model")
    assert first.sha256 == model.sha256
    assert hashlib.sha256(first.path.read_bytes()).hexdigest() == model.sha256
    assert first.name == f"tiny-test-model-{model.sha256[:12]}"
    assert first.context_length == 32768
    modified = first.path.stat().st_mtime_ns
    # The second resolve reuses the verified file instead of joining the slices again.
    (tmp_path / "site" / "fake_model_part2" / "data" / "part02.bin").unlink()
    assert resolve_model("local:tiny-test-model").path.stat().st_mtime_ns == modified


def test_slices_that_do_not_join_into_the_pinned_file_are_refused_and_nothing_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path, packaged
) -> None:
    packaged(sha256="0" * 64)
    with pytest.raises(ModelFileError, match="refusing to serve it"):
        resolve_model("local:tiny-test-model")
    assert not list((cache / "models").glob("*.gguf"))
    assert not list((cache / "models").glob("*.part*"))


def test_a_missing_slice_package_names_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path, packaged
) -> None:
    packaged()
    import shutil

    shutil.rmtree(tmp_path / "site" / "fake_model_part3")
    with pytest.raises(ModelFileError, match=r"fake-model-part3==1.0 is missing.*\[local\]"):
        resolve_model("local:tiny-test-model")


def test_a_gguf_path_is_served_under_a_name_carrying_its_hash(
    tmp_path: Path, cache: Path, tiny_model
) -> None:
    path = tiny_model(tmp_path / "mine.gguf")
    model = resolve_model(f"local:{path}")
    assert model.path == path.resolve()
    assert model.name == f"mine-{hashlib.sha256(path.read_bytes()).hexdigest()[:12]}"
    assert model.public() == {"name": model.name, "sha256": model.sha256, "bytes": path.stat().st_size}


def test_an_unknown_model_name_lists_the_packaged_ones(cache: Path) -> None:
    with pytest.raises(ConfigError, match=r"qwen2\.5-coder-0\.5b-instruct-q4_k_m"):
        resolve_model("local:no-such-model")


def test_settings_come_from_the_model_and_the_machine(
    tmp_path: Path, cache: Path, monkeypatch, tiny_model
) -> None:
    model = resolve_model(f"local:{tiny_model(tmp_path / 'm.gguf', context_length=32768)}")
    monkeypatch.setattr("ragsuite.local_lm.server.usable_cores", lambda: 5)
    settings = plan_settings(model, parallel=2)
    # The context is capped; the server's threads (all its slots decode together in one batch on them) come
    # from the usable cores, whatever the number of slots: every core reads prompts, half of them generate.
    assert (settings.ctx, settings.batch_threads, settings.threads, settings.parallel) == (8192, 5, 2, 2)
    assert plan_settings(model).public() == {"parallel": 5, "ctx": 8192, "threads": 2, "batch_threads": 5}
    # --local-threads N sets both.
    assert plan_settings(model, threads=3).public() == {
        "parallel": 5,
        "ctx": 8192,
        "threads": 3,
        "batch_threads": 3,
    }
    monkeypatch.setattr("ragsuite.local_lm.server.usable_cores", lambda: 2)
    assert plan_settings(model).public() == {"parallel": 2, "ctx": 8192, "threads": 1, "batch_threads": 2}
    monkeypatch.setattr("ragsuite.local_lm.server.usable_cores", lambda: 1)
    assert plan_settings(model).public() == {"parallel": 1, "ctx": 8192, "threads": 1, "batch_threads": 1}
    small = resolve_model(f"local:{tiny_model(tmp_path / 's.gguf', context_length=2048)}")
    assert plan_settings(small).ctx == 2048
    with pytest.raises(ConfigError, match="larger than the 2,048 tokens"):
        plan_settings(small, ctx=4096)


def test_asking_for_llama_cpp_without_a_server_says_how_to_build_one(monkeypatch, cache: Path) -> None:
    monkeypatch.delenv("RAGSUITE_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="ragsuite serve --local --build"):
        resolve_engine("llama.cpp")


def test_the_transformers_engine_without_the_extra_names_the_install_command(
    monkeypatch, cache: Path
) -> None:
    monkeypatch.delenv("RAGSUITE_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setitem(sys.modules, "gguf", None)  # an import of gguf now fails
    with pytest.raises(MissingExtraError, match=r"serve --local --build(.|\n)*\[local-hf\]"):
        resolve_engine("auto")


def test_the_server_starts_serves_its_model_and_stops(
    tmp_path: Path, cache: Path, fake_llama_server, tiny_model
) -> None:
    model = resolve_model(f"local:{tiny_model(tmp_path / 'm.gguf')}")
    executable = fake_llama_server(tmp_path)
    server = LocalServer(model, engine="llama.cpp", llama_server=executable, parallel=2, threads=3)
    with server:
        process = server.process
        assert process is not None and process.poll() is None
        # The server requires its key on everything but /health, as the pinned llama-server does.
        keyed = urllib.request.Request(
            f"{server.api_base}/models", headers={"Authorization": f"Bearer {server.api_key}"}
        )
        with urllib.request.urlopen(keyed, timeout=10) as reply:
            assert json.loads(reply.read())["data"][0]["id"] == model.name
        command = server.command()
        assert command[command.index("--ctx-size") + 1] == str(2 * 8192)  # llama-server splits it per slot
        assert command[command.index("--parallel") + 1] == "2"
        # The server's threads, not a slot's: llama-server decodes its busy slots together on all of them.
        assert command[command.index("--threads") + 1] == command[command.index("--threads-batch") + 1] == "3"
        assert server.host == "127.0.0.1"
    assert process.poll() is not None  # stopped when the block ended


def test_a_server_that_exits_while_loading_reports_its_output(
    tmp_path: Path, cache: Path, monkeypatch, fake_llama_server, tiny_model
) -> None:
    monkeypatch.setenv("FAKE_EXIT", "1")
    model = resolve_model(f"local:{tiny_model(tmp_path / 'm.gguf')}")
    server = LocalServer(model, engine="llama.cpp", llama_server=fake_llama_server(tmp_path))
    with pytest.raises(LocalServerError, match=r"exited with code 3(.|\n)*failed to load model"):
        server.start()
    assert server.process is None


def test_lm_local_talks_to_the_server_and_records_the_model_not_the_port(
    tmp_path: Path, cache: Path, monkeypatch, tiny_model, fake_llama_server
) -> None:
    import dspy

    from ragsuite.lm import build_lm, parse_lm_spec, resolve_endpoint
    from ragsuite.local_lm.server import stop_shared_servers

    monkeypatch.setenv("RAGSUITE_LLAMA_SERVER", str(fake_llama_server(tmp_path)))
    path = tiny_model(tmp_path / "m.gguf")
    try:
        parsed = resolve_endpoint(parse_lm_spec(f"local:{path}", local_options={"engine": "auto"}))
        lm = build_lm(f"local:{path}", local_options={"engine": "auto"}, cache=False)
        assert parsed.api_base == lm.kwargs["api_base"]  # one server for both calls
        public = parsed.public()
        assert public["engine"] == "llama.cpp"
        assert public["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert public["api_base"] is None and str(parsed.api_base).split(":")[-1] not in json.dumps(public)
        assert lm.cache_scope == f"local:{public['sha256']}:llama.cpp"
        # A CPU reply can take minutes: the local LM waits 1,800 s by default, a remote one 120 s, and a
        # timeout given is kept.
        assert lm.kwargs["timeout"] == 1800.0
        assert build_lm(f"local:{path}", local_options={"engine": "auto"}, timeout=30).kwargs["timeout"] == 30
        remote = build_lm("openai/m", api_base="http://127.0.0.1:9/v1", cache=False)
        assert remote.kwargs["timeout"] == 120.0

        class QA(dspy.Signature):
            question: str = dspy.InputField()
            answer: str = dspy.OutputField()

        with dspy.context(lm=lm):
            assert dspy.Predict(QA)(question="Capital of France?").answer == "Paris"
    finally:
        stop_shared_servers()


def test_json_replies_from_llama_cpp_are_held_to_the_signature_schema(
    tmp_path: Path, cache: Path, monkeypatch, tiny_model, fake_llama_server
) -> None:
    """llama-server compiles a JSON schema sent as response_format into a grammar: DSPy's JSON adapter sends
    the signature's schema to it, so a small model's reply always parses. The transformers engine has no
    such constraint and is sent none."""
    import dspy

    from ragsuite.lm import build_lm
    from ragsuite.local_lm import LocalEndpoint
    from ragsuite.local_lm.server import stop_shared_servers

    requests = tmp_path / "requests.jsonl"
    monkeypatch.setenv("RAGSUITE_LLAMA_SERVER", str(fake_llama_server(tmp_path)))
    monkeypatch.setenv("FAKE_REQUESTS", str(requests))
    monkeypatch.setenv("FAKE_REPLY", '{"better": true}')
    path = tiny_model(tmp_path / "m.gguf")

    class Compare(dspy.Signature):
        question: str = dspy.InputField()
        better: bool = dspy.OutputField()

    try:
        lm = build_lm(f"local:{path}", local_options={"engine": "llama.cpp"}, cache=False)
        assert lm.supports_response_schema and "response_format" in lm.supported_params
        with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
            assert dspy.Predict(Compare)(question="Is 2 > 1?").better is True
    finally:
        stop_shared_servers()
    sent = json.loads(requests.read_text().splitlines()[-1])["response_format"]
    assert sent["type"] == "json_schema"
    schema = sent["json_schema"]["schema"]
    assert schema["properties"]["better"]["type"] == "boolean" and schema["required"] == ["better"]
    model = resolve_model(f"local:{path}")
    assert not LocalEndpoint(model, "http://127.0.0.1:9/v1", "transformers").structured_outputs


def test_every_stage_of_a_run_on_llama_cpp_asks_for_its_schema_and_parses_the_first_time(
    tmp_path: Path, cache: Path, monkeypatch, tiny_model, fake_llama_server
) -> None:
    """With the local LM on llama.cpp each stage uses DSPy's JSON adapter with the signature's schema (a small
    model breaks the chat format on true/false stages, costing a second request each time): one request per
    stage call, no fallback, and the manifest says which adapter the prompts were written by."""
    from ragsuite.cli import main
    from ragsuite.local_lm import server as local_servers

    requests = tmp_path / "requests.jsonl"
    monkeypatch.setenv("RAGSUITE_LLAMA_SERVER", str(fake_llama_server(tmp_path)))
    monkeypatch.setenv("FAKE_REQUESTS", str(requests))
    reply = {"note": "Paris is the capital.", "queries": ["capital of France"], "updated_note": "Paris.",
             "better": False, "answer": "Paris"}  # fmt: skip
    monkeypatch.setenv("FAKE_REPLY", json.dumps(reply))
    path = tiny_model(tmp_path / "m.gguf")
    out = tmp_path / "run"
    try:
        code = main(["eval", "--program", "deepnote", "--dataset", "hotpotqa", "--lm", f"local:{path}",
                     "--limit", "1", "--no-cache", "--no-progress", "--out", str(out)])  # fmt: skip
    finally:
        local_servers.stop_shared_servers()
    assert code == 0
    (record,) = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    sent = [json.loads(line) for line in requests.read_text().splitlines()]
    assert len(sent) == sum(record["stage_calls"].values()) >= 4  # no second requests
    assert not any("fallback" in step for step in record["trace"])
    assert record["prediction"] == "Paris"
    for body in sent:
        assert body["response_format"]["type"] == "json_schema"
        # The compact prompt: the instruction and labelled inputs, no format tutorial (the grammar holds it).
        text = "\n".join(message["content"] for message in body["messages"])
        assert "Reply with a JSON object: {" in text and "[[ ##" not in text
    asked = {tuple(body["response_format"]["json_schema"]["schema"]["required"]) for body in sent}
    assert {("note",), ("queries",), ("updated_note",), ("better",), ("answer",)} <= asked
    assert json.loads((out / "manifest.json").read_text())["lm"]["adapter"] == "compact-json"


def test_the_stage_adapter_is_json_only_for_plain_outputs_of_a_schema_holding_lm() -> None:
    """The JSON adapter is chosen for a stage when its LM holds replies to a schema and every output is a
    plain value; DSPy's own types (a probability-backed decision) keep DSPy's default, and so does an
    explicitly configured adapter. Salvaging wrappers are seen through."""
    import dspy

    from ragsuite.programs.base import stage_adapter
    from ragsuite.programs.hanrag import salvage_route
    from ragsuite.programs.pipeline import choice_predictor, decision_predictor
    from ragsuite.signatures.hanrag import Filter, Route

    class SchemaLM(dspy.LM):
        structured_outputs = True

    def adapter_for(predictor: object, **settings: object) -> object:
        with dspy.context(**settings), stage_adapter(predictor):
            return dspy.settings.adapter

    schema_lm, plain_lm = SchemaLM("openai/m"), dspy.LM("openai/m")
    generate = dspy.Predict(Filter)
    probability = decision_predictor(Filter, "relevant", mode="probability", threshold=0.5)
    assert isinstance(adapter_for(generate, lm=schema_lm), dspy.JSONAdapter)
    assert isinstance(adapter_for(dspy.ChainOfThought(Filter), lm=schema_lm), dspy.JSONAdapter)
    assert adapter_for(generate, lm=plain_lm) is None  # DSPy's default, the chat adapter
    assert adapter_for(probability, lm=schema_lm) is None
    routed = salvage_route(choice_predictor(Route, "category", mode="generate", weights={}))
    assert isinstance(adapter_for(routed, lm=schema_lm), dspy.JSONAdapter)
    chosen = dspy.ChatAdapter()
    assert adapter_for(generate, lm=schema_lm, adapter=chosen) is chosen
    generate.lm = plain_lm  # a stage LM of its own decides for its stage
    assert adapter_for(generate, lm=schema_lm) is None


def test_a_running_local_server_is_reused_by_api_base_and_must_serve_the_same_file(
    tmp_path: Path, cache: Path, tiny_model, write_gguf, fake_llama_server
) -> None:
    from ragsuite.lm import parse_lm_spec, resolve_endpoint
    from ragsuite.local_lm import LocalServerError as Error

    path = tiny_model(tmp_path / "m.gguf")
    other = write_gguf(tmp_path / "other.gguf", {"general.architecture": "llama"})
    model = resolve_model(f"local:{path}")
    with LocalServer(model, engine="llama.cpp", llama_server=fake_llama_server(tmp_path)) as server:
        parsed = resolve_endpoint(parse_lm_spec(f"local:{path}", api_base=server.api_base))
        assert parsed.api_base == server.api_base and parsed.local is not None
        assert parsed.local.engine == "llama.cpp"
        with pytest.raises(Error, match=r"not other-"):
            resolve_endpoint(parse_lm_spec(f"local:{other}", api_base=server.api_base))


def test_serve_local_list_shows_what_is_installed(capsys: pytest.CaptureFixture[str]) -> None:
    from ragsuite.cli import main

    assert main(["serve", "--local", "--list"]) == 0
    out = capsys.readouterr().out
    assert "qwen2.5-coder-0.5b-instruct-q4_k_m" in out
    assert ("installed" in out) and os.linesep in out


def test_a_prompt_longer_than_the_window_is_refused_with_the_flag_to_raise_and_the_run_goes_on(
    tmp_path: Path, cache: Path, monkeypatch, capsys, tiny_model, fake_llama_server
) -> None:
    from ragsuite.cli import main

    monkeypatch.setenv("RAGSUITE_LLAMA_SERVER", str(fake_llama_server(tmp_path)))
    path = tiny_model(tmp_path / "m.gguf")
    out = tmp_path / "run"
    command = [
        "eval",
        "--program",
        "vanilla",
        "--dataset",
        "hotpotqa",
        "--lm",
        f"local:{path}",
        "--limit",
        "2",
    ]
    # The stand-in counts words as tokens; 256 is too few for the prompt with its passages.
    from ragsuite.local_lm import server as local_servers

    try:
        code = main([*command, "--local-ctx", "256", "--local-parallel", "2", "--no-cache", "--no-progress",
                     "--out", str(out)])  # fmt: skip
        assert not local_servers._servers  # the command stopped the server it started
    finally:
        local_servers.stop_shared_servers()
    assert code == 1
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == 2  # every question recorded: the run went on
    assert all("--local-ctx" in record["error"]["message"] for record in records)
    assert json.loads((out / "summary.json").read_text())["errors"] == 2
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["lm"]["engine"] == "llama.cpp" and manifest["lm"]["api_base"] is None


def test_serve_local_starts_a_server_other_commands_reuse_and_ctrl_c_stops_it(
    tmp_path: Path, cache: Path, capsys, monkeypatch, tiny_model, fake_llama_server
) -> None:
    import signal
    import subprocess

    from ragsuite.cli import main
    from ragsuite.local_lm.server import free_port
    from ragsuite.processes import stop_process

    path = tiny_model(tmp_path / "m.gguf")
    # The key the server requires, given to both sides through the environment (none is printed then).
    monkeypatch.setenv("RAGSUITE_LOCAL_API_KEY", "shared-test-key-0123")
    env = {**os.environ, "RAGSUITE_LLAMA_SERVER": str(fake_llama_server(tmp_path)), "PYTHONUNBUFFERED": "1"}
    port = free_port()
    command = [sys.executable, "-m", "ragsuite", "serve", "--local", str(path), "--port", str(port)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(2)]  # blocks until the server is ready
        api_base = f"http://127.0.0.1:{port}/v1"
        assert f"use: --lm local:{path} --api-base {api_base}" in lines[1], lines
        out = tmp_path / "run"
        flags = ["--limit", "1", "--no-cache", "--no-progress", "--out", str(out)]
        code = main(["eval", "--program", "no-retrieval", "--dataset", "hotpotqa", "--lm", f"local:{path}",
                     "--api-base", api_base, *flags])  # fmt: skip
        assert code == 0, capsys.readouterr().err
        assert json.loads((out / "manifest.json").read_text())["lm"]["engine"] == "llama.cpp"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{api_base}/models", timeout=5)  # the server went with it
    finally:
        stop_process(process)


def test_the_build_finds_cmake_beside_this_python_when_the_venv_is_not_activated(tmp_path, monkeypatch):
    import stat

    from ragsuite.local_lm import build

    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    cmake = venv_bin / "cmake"
    cmake.write_text("#!/bin/sh\n")
    cmake.chmod(cmake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(build.sys, "executable", str(venv_bin / "python"))
    assert build.find_tool("cmake") == str(cmake)
    assert build.find_tool("no-such-tool") is None


# A llama-server log as it writes one: its clock (minutes.seconds.ms.us since start), then the event.
SERVER_LOG = """\
0.00.919.330 I srv    load_model: initializing, n_slots = 2, n_ctx_slot = 8192, kv_unified = 'false'
0.01.015.494 I slot launch_slot_: id  0 | task 0 | processing task, is_child = 0
0.02.500.000 I slot launch_slot_: id  1 | task 3 | processing task, is_child = 0
0.11.057.376 I slot print_timing: id  0 | task 0 |        eval time =    2546.87 ms /    40 tokens
0.11.057.507 I slot      release: id  0 | task 0 | stop processing: n_tokens = 1062, truncated = 0
0.12.000.000 I slot      release: id  1 | task 3 | stop processing: n_tokens = 300, truncated = 0
1.02.000.000 I slot launch_slot_: id  0 | task 7 | processing task, is_child = 0
1.04.250.000 I slot      release: id  0 | task 7 | stop processing: n_tokens = 80, truncated = 0
1.05.000.000 I slot launch_slot_: id  1 | task 9 | processing task, is_child = 0
"""


def test_the_overhead_benchmark_reads_busy_time_from_the_server_log(load_benchmark) -> None:
    """Overlapping slots count once in the busy time and in full in the summed time; a request still open
    is reported, not counted."""
    bench = load_benchmark("real_lm")
    intervals, still_open = bench.slot_intervals(SERVER_LOG)
    assert still_open == 1
    assert intervals == [pytest.approx(pair) for pair in [(1.015494, 11.057507), (2.5, 12.0), (62.0, 64.25)]]
    assert bench.union_seconds(intervals) == pytest.approx((12.0 - 1.015494) + 2.25)
    assert sum(end - start for start, end in intervals) == pytest.approx(10.042013 + 9.5 + 2.25)
    assert bench.union_seconds([]) == 0.0
