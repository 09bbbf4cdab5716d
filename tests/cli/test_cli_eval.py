"""`ragsuite eval`, `ragsuite report` and `ragsuite serve` end to end against local servers."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from ragsuite.cli import main
from ragsuite.data.datasets import load_dataset
from ragsuite.processes import stop_process
from ragsuite.testing.openai_server import Fault, LocalOpenAIServer
from ragsuite.testing.scripted import ScriptedRequest


def gold_answers(dataset: str, limit: int) -> dict[str, str]:
    return {ex.question: ex.answers[0] for ex in load_dataset(dataset)[:limit]}


RETRIEVER = {"triviaqa": ["--retriever", "bm25:nq"]}


@pytest.mark.slow
@pytest.mark.parametrize(
    "program, dataset",
    [
        (p, d)
        for p in (
            "vanilla",
            "no-retrieval",
            "deepnote",
            "adaptive-note",
            "hanrag",
            "blendfilter",
            "diverse-rerank",
        )
        for d in ("hotpotqa", "asqa", "strategyqa")
    ]
    + [("vanilla", d) for d in ("2wikimultihopqa", "musique", "nq", "triviaqa")],
)
def test_every_program_runs_end_to_end(program, dataset, tmp_path, capsys, universal_responder, eval_args):
    gold = gold_answers(dataset, 2)
    with LocalOpenAIServer(universal_responder(gold)) as server:
        code = main(
            eval_args(server, tmp_path, "--limit", "2", "--threads", "2", program=program, dataset=dataset)
            + RETRIEVER.get(dataset, [])
        )
    out = capsys.readouterr().out
    assert code == 0, out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["n"], summary["errors"]) == (2, 0)
    assert summary["cost"]["lm_calls"] >= 1 and summary["cost"]["input_tokens"] > 0
    assert f"| {program} | {dataset} |" in out
    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert [r["stats"]["fallbacks"] for r in records] == [0, 0]  # every stage's reply parsed
    if dataset in ("hotpotqa", "nq"):  # the gold answer came back through every stage
        assert summary["metrics"]["exact_match"] == 1.0


def test_eval_vanilla_on_real_questions_then_resume_and_report(
    tmp_path, capsys, universal_responder, eval_args
):
    gold = gold_answers("hotpotqa", 3)
    with LocalOpenAIServer(universal_responder(gold)) as server:
        assert main(eval_args(server, tmp_path / "a", "--limit", "3", "--set", "top_k=3")) == 0
        first = capsys.readouterr().out
        assert "| vanilla | hotpotqa | openai/scripted | 3 | 0 | 100.0 | 100.0 | 100.0 |" in first
        assert server.chat_requests == 3
        # The same command again resumes: nothing left to do, no LM call made.
        assert main(eval_args(server, tmp_path / "a", "--limit", "3", "--set", "top_k=3")) == 0
        assert server.chat_requests == 3
        assert main(eval_args(server, tmp_path / "b", "--limit", "2", program="no-retrieval")) == 0
    capsys.readouterr()
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["knobs"] == {"top_k": 3} and manifest["retriever"]["spec"] == "bm25:hotpotqa"
    assert manifest["lm"]["spec"] == "openai/scripted" and manifest["limit"] == 3
    assert "dspy" in manifest["versions"] and manifest["ragsuite_version"]
    records = [json.loads(line) for line in (tmp_path / "a" / "records.jsonl").read_text().splitlines()]
    assert all(len(r["passage_ids"]) == 3 and r["stats"]["retrievals"] == 1 for r in records)
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    table = capsys.readouterr().out
    assert "vanilla (top_k=3)" in table and "| no-retrieval | hotpotqa |" in table


def test_changed_configuration_is_refused(tmp_path, capsys, universal_responder, eval_args):
    gold = gold_answers("hotpotqa", 2)
    with LocalOpenAIServer(universal_responder(gold)) as server:
        assert main(eval_args(server, tmp_path, "--limit", "2")) == 0
        code = main(eval_args(server, tmp_path, "--limit", "2", "--set", "top_k=7", "--temperature", "0.7"))
    err = capsys.readouterr().err
    assert code == 2
    assert "knobs.top_k: 5 -> 7" in err and "lm.temperature: 0.1 -> 0.7" in err and "new --out" in err


def test_max_errors_and_failures_counted_apart(tmp_path, capsys, universal_responder, eval_args):
    with LocalOpenAIServer(universal_responder({}), fault_fn=lambda n, r: Fault("server_error")) as server:
        code = main(
            eval_args(
                server, tmp_path, "--limit", "5", "--threads", "1", "--retries", "0", "--max-errors", "2"
            )
        )
    captured = capsys.readouterr()
    assert code == 1 and "max_errors=2 reached" in captured.err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["n"], summary["errors"], summary["total"]) == (0, 2, 5)
    assert server.chat_requests == 2


def test_no_file_or_log_line_contains_the_api_key(
    tmp_path, capsys, caplog, monkeypatch, universal_responder, eval_args
):
    secret = "sk-fake-secret-0123456789abcdef"
    monkeypatch.setenv("RAGSUITE_TEST_LM_KEY", secret)
    caplog.set_level(logging.DEBUG)
    gold = gold_answers("hotpotqa", 2)
    # The second request fails with the key in the error text, as a misbehaving proxy might echo it.
    with LocalOpenAIServer(universal_responder(gold)) as server:
        server.inject(Fault("malformed", text=f"bad key {secret}"), Fault("malformed", text=f"auth {secret}"))
        code = main(
            ["-vv", *eval_args(server, tmp_path, "--limit", "2", "--api-key-env", "RAGSUITE_TEST_LM_KEY")]
        )
    assert code == 0
    assert server.authorizations[f"Bearer {secret}"] >= 2  # the key was really used
    captured = capsys.readouterr()
    assert secret not in captured.out + captured.err + caplog.text
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"manifest.json", "records.jsonl", "summary.json", "table.md"}
    for path in files:
        assert secret not in path.read_text(), path
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["lm"]["key_env"] == "RAGSUITE_TEST_LM_KEY"


def test_clear_errors_for_unreachable_server_unknown_model_key_and_knob(
    tmp_path, capsys, universal_responder
):
    base = ["eval", "--program", "vanilla", "--dataset", "hotpotqa", "--out", str(tmp_path / "x")]
    code = main([*base, "--lm", f"vllm:m@http://127.0.0.1:{free_port()}/v1"])
    assert code == 2 and "cannot reach the LM server" in capsys.readouterr().err
    with LocalOpenAIServer(universal_responder({})) as server:
        code = main([*base, "--lm", "openai/gpt-nope", "--api-base", server.api_base])
        assert code == 2 and "does not serve model 'gpt-nope'; it serves: scripted" in capsys.readouterr().err
        code = main([*base, "--lm", "openai/scripted", "--api-base", server.api_base, "--set", "nope=1"])
        assert code == 2 and "has no knob 'nope'; its knobs are: top_k" in capsys.readouterr().err
        code = main(
            [
                *base,
                "--lm",
                "openai/scripted",
                "--api-base",
                server.api_base,
                "--stage-lm",
                "route=vllm:scripted",
            ]
        )
        assert code == 2 and "no stage 'route'; its stages are: answer" in capsys.readouterr().err
    assert main([*base, "--lm", "openai/gpt-4o-mini"]) == 2
    assert "OPENAI_API_KEY is not set" in capsys.readouterr().err
    assert not (tmp_path / "x" / "records.jsonl").exists()


# ------------------------------------------------------------------------------------------ serve
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serve_launches_waits_prints_flags_and_stops_on_ctrl_c(tmp_path, fake_vllm):
    _, logs = fake_vllm(tmp_path)
    port = free_port()
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ragsuite",
            "serve",
            "--model",
            "org/Model-7B",
            "--port",
            str(port),
            "--tensor-parallel-size",
            "2",
            "--",
            "--max-model-len",
            "4096",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        lines = [process.stdout.readline() for _ in range(2)]
        assert lines[0].startswith("vLLM is serving org/Model-7B at http://127.0.0.1:")
        assert lines[1].strip() == f"use: --lm openai/org/Model-7B --api-base http://127.0.0.1:{port}/v1"
        args = json.loads((logs / f"{port}.json").read_text())["args"]
        assert args[:2] == ["serve", "org/Model-7B"]
        assert args[args.index("--tensor-parallel-size") + 1] == "2" and args[-2:] == [
            "--max-model-len",
            "4096",
        ]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as reply:
            assert json.load(reply)["data"][0]["id"] == "org/Model-7B"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        stop_process(process)
    with pytest.raises(OSError):  # the server went down with it
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)


def test_a_killed_serve_leaves_no_vllm_behind(tmp_path, fake_vllm):
    """kill -9 of `ragsuite serve` cannot run its cleanup: the server must still go down with it."""
    fake_vllm(tmp_path)
    port = free_port()
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"}
    argv = [sys.executable, "-m", "ragsuite", "serve", "--model", "org/M", "--port", str(port)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout.readline().startswith("vLLM is serving org/M")
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1).close()
            except OSError:
                break  # the fake vLLM is gone
            time.sleep(0.1)
        else:
            pytest.fail("the vllm server outlived a killed `ragsuite serve`")
    finally:
        stop_process(process)


def test_serve_errors(tmp_path, capsys, monkeypatch, fake_vllm):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["serve", "--model", "m"]) == 2
    assert "no `vllm` executable on PATH" in capsys.readouterr().err
    script, _ = fake_vllm(tmp_path, fail=True)
    started = time.monotonic()
    assert main(["serve", "--model", "m", "--vllm", str(script), "--port", str(free_port())]) == 2
    assert "vllm exited with code 3 before serving" in capsys.readouterr().err
    assert time.monotonic() - started < 20


def test_eval_a_saved_program_file(tmp_path, capsys, eval_args, universal_responder):
    from ragsuite import programs
    from ragsuite.retrieval.spec import build_retriever

    retriever = build_retriever("bm25", dataset="hotpotqa")
    programs.get("vanilla")(retriever=retriever, task="short", top_k=2).save(str(tmp_path / "vanilla.json"))
    gold = gold_answers("hotpotqa", 2)
    with LocalOpenAIServer(universal_responder(gold)) as server:
        args = eval_args(server, tmp_path / "run", "--limit", "2")
        args[1:3] = ["--program-file", str(tmp_path / "vanilla.json")]
        assert main(args) == 0
    assert "| vanilla | hotpotqa |" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["program"] == "vanilla" and manifest["knobs"] == {"top_k": 2}
    assert len(manifest["program_file_sha256"]) == 64 and manifest["retriever"]["spec"] == "bm25:hotpotqa"


def test_a_server_behind_basic_auth_in_the_url_works_and_the_password_is_never_written(
    tmp_path, capsys, universal_responder
):
    """--api-base http://user:pass@host/v1 used to fail as a network error, and the raw --lm spec (which may
    hold the URL) was written verbatim into the run files."""
    gold = gold_answers("hotpotqa", 2)
    with LocalOpenAIServer(universal_responder(gold)) as server:
        base = server.api_base.replace("http://", "http://alice:s3cret-pass@")
        for i, flags in enumerate(
            (["--lm", "openai/scripted", "--api-base", base], ["--lm", f"vllm:scripted@{base}"])
        ):
            out = tmp_path / f"run{i}"
            argv = ["eval", "--program", "vanilla", "--dataset", "hotpotqa", "--limit", "2", "--no-cache"]
            assert main([*argv, "--no-progress", "--out", str(out), *flags]) == 0
            printed = capsys.readouterr()
            assert "s3cret-pass" not in printed.out + printed.err
            for path in out.iterdir():
                if path.is_file():
                    assert "s3cret-pass" not in path.read_text(errors="replace"), path.name
            manifest = json.loads((out / "manifest.json").read_text())
            assert manifest["lm"]["api_base"] == server.api_base
        import base64

        expected = "Basic " + base64.b64encode(b"alice:s3cret-pass").decode()
        assert set(server.authorizations) == {expected}  # every request, the /models check included


def test_a_basic_auth_token_echoed_by_the_server_is_written_nowhere(tmp_path, capsys, universal_responder):
    """A server quoting the request's ``Authorization: Basic <base64>`` in its error: the encoded password
    reached records.jsonl, the HTML report and stderr. The password holds an ``@`` as well."""
    import base64

    gold = gold_answers("hotpotqa", 3)
    token = base64.b64encode(b"alice:s3cret@pass").decode()
    answer = universal_responder(gold)
    failing = next(iter(gold))

    def echoing(request: ScriptedRequest):
        if request.inputs.get("question") == failing:
            raise RuntimeError(f"denied: Authorization: Basic {token} (credentials {token})")
        return answer(request)

    out, page = tmp_path / "run", tmp_path / "report.html"
    with LocalOpenAIServer(echoing) as server:
        base = server.api_base.replace("http://", "http://alice:s3cret@pass@")
        argv = ["eval", "--program", "vanilla", "--dataset", "hotpotqa", "--limit", "3", "--no-cache"]
        argv += ["--no-progress", "--retries", "0", "--out", str(out), "--html", str(page)]
        assert main([*argv, "--lm", "openai/scripted", "--api-base", base]) == 1  # one failed, recorded
        assert set(server.authorizations) == {f"Basic {token}"}
    printed = capsys.readouterr()
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [r["error"]["message"].count("***") for r in records if r["error"]] == [2]
    for secret in (token, "s3cret", "pass@"):
        assert secret not in printed.out + printed.err, secret
        assert secret not in page.read_text(), secret
        for path in out.iterdir():
            if path.is_file():
                assert secret not in path.read_text(errors="replace"), (path.name, secret)
