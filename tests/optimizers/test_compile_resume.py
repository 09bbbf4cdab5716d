"""A stopped ``ragsuite compile`` resumes: the rerun replays the LM calls the killed run finished from the
compile's own cache folder, sends only the others, and writes the program an uninterrupted compile writes."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from ragsuite.errors import ConfigError
from ragsuite.optimizers.run_cache import RUN_FILE, check_run_folder
from ragsuite.processes import running
from ragsuite.testing.openai_server import LocalOpenAIServer
from ragsuite.testing.responders import grounded_responder
from ragsuite.testing.scripted import ScriptedRequest


class _Gate:
    """A responder that counts the requests it answers and, once armed, holds every request past a number
    (the client then waits on it, as on a slow LM) until released."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.answered = 0
        self.hold_after: int | None = None
        self.held = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, request: ScriptedRequest) -> Any:
        with self._lock:
            hold = self.hold_after is not None and self.answered >= self.hold_after
            if not hold:
                self.answered += 1
        if hold:
            self.held.set()
            self.release.wait(timeout=600)
        return self.inner(request)


def _gold() -> dict[str, str]:
    from ragsuite.data.datasets import load_dataset

    return {ex.question: ex.answers[0] for ex in load_dataset("hotpotqa")}


def _args(command: str, out: Path, api_base: str, *options: str) -> list[str]:
    """``ragsuite <command>`` of vanilla on HotpotQA against ``api_base``, writing to ``out``: one request at
    a time, so that when a request arrives, every earlier reply is recorded."""
    run = ["--threads", "1", "--no-progress", "--out", str(out)]
    run += ["--lm", "openai/scripted", "--api-base", api_base]
    return [command, "--program", "vanilla", "--dataset", "hotpotqa", *options, *run]


def _compile_args(out: Path, api_base: str, *extra: str) -> list[str]:
    return _args("compile", out, api_base, "--optimizer", "bootstrap", "--train", "4", "--val", "2", *extra)


def _program(path: Path) -> dict[str, Any]:
    """The compiled program and its scores; not the costs, which differ by the calls replayed from disk."""
    saved = json.loads(path.read_text())
    scores = {
        label: {k: v for k, v in scored.items() if k != "cost"}
        for label, scored in saved["metadata"]["metrics"].items()
    }
    return {"knobs": saved["knobs"], "predictors": saved["predictors"], "scores": scores}


@pytest.mark.slow
def test_a_killed_compile_resumes_sending_only_the_calls_it_had_not_finished(tmp_path, caplog, monkeypatch):
    from ragsuite.cli import main

    secret = "sk-resume-test-0123456789"
    monkeypatch.setenv("RESUME_TEST_KEY", secret)
    key = ("--api-key-env", "RESUME_TEST_KEY")
    gate = _Gate(grounded_responder(_gold()))
    with LocalOpenAIServer(gate) as server:
        assert main(_compile_args(tmp_path / "whole.json", server.api_base, *key)) == 0
        total = gate.answered
        assert total >= 6  # scored before, bootstrapped on 4 train examples, scored after

        finished = total // 2
        gate.answered, gate.hold_after = 0, finished
        out = tmp_path / "resumed.json"
        env = {**os.environ, "DSPY_CACHEDIR": str(tmp_path / "shared-cache")}
        command = [sys.executable, "-m", "ragsuite", *_compile_args(out, server.api_base, *key)]
        try:
            with running(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as killed:
                assert gate.held.wait(timeout=300), "the compile never reached its held request"
                killed.kill()  # SIGKILL mid-request: nothing the process held survives
                killed.wait(timeout=60)
        finally:
            gate.release.set()
        assert gate.answered == finished and not out.exists()

        gate.answered, gate.hold_after = 0, None
        with caplog.at_level(logging.WARNING, logger="ragsuite.optimizers.run_cache"):
            assert main(_compile_args(out, server.api_base, *key)) == 0  # DSPy's shared cache is off here
        assert any(secret in sent for sent in server.authorizations)
    assert gate.answered == total - finished
    assert f"resuming: {finished} LM calls cached from an earlier compile" in caplog.text
    assert _program(out) == _program(tmp_path / "whole.json")
    files = [path for path in (tmp_path / "resumed.lm-cache").rglob("*") if path.is_file()]
    assert files and not any(secret in path.name or secret.encode() in path.read_bytes() for path in files)


@pytest.mark.slow
def test_a_compile_with_another_program_setting_does_not_replay_the_folder(tmp_path, capsys):
    from ragsuite.cli import main

    gate = _Gate(grounded_responder(_gold()))
    out = tmp_path / "vanilla.json"
    with LocalOpenAIServer(gate) as server:
        assert main(_compile_args(out, server.api_base)) == 0
        before = gate.answered
        assert main(_compile_args(out, server.api_base, "--set", "top_k=3")) == 2
        assert gate.answered == before  # refused before any LM call
    err = capsys.readouterr().err
    assert "vanilla.lm-cache holds the LM replies of a run started with another knobs" in err
    assert "delete that folder to start over" in err


@pytest.mark.slow
def test_no_cache_records_nothing_and_says_a_stopped_compile_starts_over(tmp_path, caplog):
    from ragsuite.cli import main

    gate = _Gate(grounded_responder(_gold()))
    out = tmp_path / "vanilla.json"
    with LocalOpenAIServer(gate) as server:
        with caplog.at_level(logging.WARNING, logger="ragsuite.cli.compile"):
            assert main(_compile_args(out, server.api_base, "--no-cache")) == 0
    assert not (tmp_path / "vanilla.lm-cache").exists()
    assert "a stopped compile starts over" in caplog.text


def test_a_run_folder_records_its_description_and_refuses_another(tmp_path):
    folder = tmp_path / "run.lm-cache"
    folder.mkdir()
    check_run_folder(folder, {"program": "vanilla", "lm": {"model": "openai/a"}})
    assert json.loads((folder / RUN_FILE).read_text()) == {"lm": {"model": "openai/a"}, "program": "vanilla"}
    check_run_folder(folder, {"program": "vanilla", "lm": {"model": "openai/a"}})  # the same run: resumes
    with pytest.raises(ConfigError, match="started with another lm, program"):
        check_run_folder(folder, {"program": "rat", "lm": {"model": "openai/b"}})


def test_a_folder_of_replies_without_a_description_is_refused(tmp_path):
    folder = tmp_path / "run.lm-cache"
    folder.mkdir()
    (folder / "cache.db").write_bytes(b"")
    with pytest.raises(ConfigError, match=f"no {RUN_FILE}"):
        check_run_folder(folder, {"program": "vanilla"})


def _tune_args(out: Path, api_base: str) -> list[str]:
    return _args("tune", out, api_base, "--trials", "1", "--val", "4")


@pytest.mark.slow
def test_a_tune_killed_mid_trial_retries_that_trial_sending_only_its_unfinished_calls(tmp_path, caplog):
    import optuna

    from ragsuite.cli import main

    gate = _Gate(grounded_responder(_gold()))
    with LocalOpenAIServer(gate) as server:
        assert main(_tune_args(tmp_path / "whole", server.api_base)) == 0
        total = gate.answered
        assert total >= 4  # one call per validation question at least

        finished = total // 2
        gate.answered, gate.hold_after = 0, finished
        out = tmp_path / "resumed"
        env = {**os.environ, "DSPY_CACHEDIR": str(tmp_path / "shared-cache")}
        command = [sys.executable, "-m", "ragsuite", *_tune_args(out, server.api_base)]
        try:
            with running(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as killed:
                assert gate.held.wait(timeout=300), "the tune never reached its held request"
                killed.kill()  # SIGKILL mid-trial: the trial stays RUNNING in the study
                killed.wait(timeout=60)
        finally:
            gate.release.set()
        assert gate.answered == finished

        gate.answered, gate.hold_after = 0, None
        with caplog.at_level(logging.WARNING):
            assert main(_tune_args(out, server.api_base)) == 0
    assert gate.answered == total - finished
    assert f"resuming: {finished} LM calls cached from an earlier tune" in caplog.text
    (whole,) = (tmp_path / "whole").glob("*/best.json")
    (resumed,) = out.glob("*/best.json")
    assert json.loads(resumed.read_text())["knobs"] == json.loads(whole.read_text())["knobs"]
    study = optuna.load_study(study_name=resumed.parent.name, storage=f"sqlite:///{out / 'study.db'}")
    states = [(t.state.name, t.user_attrs.get("retry_of")) for t in study.trials]
    assert states == [("FAIL", None), ("COMPLETE", 0)]


def test_a_description_write_cut_short_by_a_kill_does_not_block_the_folder(tmp_path):
    folder = tmp_path / "run.lm-cache"
    folder.mkdir()
    (folder / ".lock").write_text("")
    (folder / f".{RUN_FILE}.abc123.tmp").write_text('{"progr')
    check_run_folder(folder, {"program": "vanilla"})
    assert json.loads((folder / RUN_FILE).read_text()) == {"program": "vanilla"}
