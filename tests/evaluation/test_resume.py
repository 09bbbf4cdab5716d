"""A run killed with SIGKILL loses only the examples in flight; rerunning the command finishes the rest
without re-asking the LM about any finished example."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragsuite.cli import main
from ragsuite.data.datasets import load_dataset
from ragsuite.processes import stop_process
from ragsuite.testing.openai_server import Fault, LocalOpenAIServer

LIMIT = 8
FAST = 4  # requests answered at once before the server starts hanging


def run_eval(server: LocalOpenAIServer, out: Path, tmp_path: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "DSPY_CACHEDIR": str(tmp_path / "dspy_cache"),
    }
    command = [
        sys.executable, "-m", "ragsuite", "eval", "--program", "no-retrieval", "--dataset", "hotpotqa",
        "--lm", "openai/scripted", "--api-base", server.api_base, "--limit", str(LIMIT), "--threads", "2",
        "--timeout", "120", "--no-cache", "--no-progress", "--out", str(out),
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def read_ids(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_kill_9_then_resume_loses_and_repeats_nothing_finished(tmp_path, capsys):
    examples = load_dataset("hotpotqa")[:LIMIT]
    gold = {ex.question: ex.answers[0] for ex in examples}

    def hang_after_fast(number, request):
        return Fault("delay", seconds=60) if number > FAST else None

    out = tmp_path / "run"
    records = out / "records.jsonl"
    with LocalOpenAIServer(
        lambda r: {"answer": gold[r.inputs["question"]]}, fault_fn=hang_after_fast
    ) as server:
        process = run_eval(server, out, tmp_path)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if records.exists() and len(read_ids(records)) == FAST and server.chat_requests == FAST + 2:
                    break
                assert process.poll() is None, process.communicate()
                time.sleep(0.1)
            else:
                pytest.fail(f"the run did not reach {FAST} records")
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        finally:
            stop_process(process)

        assert not (out / "summary.json").exists()  # killed mid-run, before any summary
        assert main(["report", str(out)]) == 0  # a killed run still reports what it has
        assert (
            f"| no-retrieval | hotpotqa | openai/scripted | {FAST}/{LIMIT} | 0 |" in capsys.readouterr().out
        )
        finished = read_ids(records)
        before = records.read_bytes()
        finished_questions = {ex.question for ex in examples if ex.id in finished}
        in_flight = [q for q in server.question_counts if q not in finished_questions]
        assert len(in_flight) == 2
        # A kill in the middle of a write leaves a torn last line: it must be tolerated.
        records.write_bytes(before + b'{"id": "torn", "question": "half a rec')

        server.fault_fn = None
        second = run_eval(server, out, tmp_path)
        try:
            stdout, stderr = second.communicate(timeout=180)
        finally:
            stop_process(second)
        assert second.returncode == 0, stderr

    final = read_ids(records)
    assert sorted(final) == sorted(ex.id for ex in examples)  # every example exactly once
    assert records.read_bytes().startswith(before)  # finished records kept as they were
    by_question = {ex.id: ex.question for ex in examples}
    for ex_id in finished:  # finished examples were never asked again
        assert server.question_counts[by_question[ex_id]] == 1
    for question in in_flight:  # lost with the kill, asked once more
        assert server.question_counts[question] == 2
    assert sum(server.question_counts.values()) == LIMIT + 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == LIMIT and summary["metrics"]["exact_match"] == 1.0
    assert "| no-retrieval | hotpotqa |" in stdout
