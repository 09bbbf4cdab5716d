"""The eval run directory under faults and bad input: unparsable replies, lone surrogates, two processes on
one directory, torn and malformed record lines, records without a manifest, SIGTERM, long error messages.

Every dataset here is written by the test itself (a few hotpotqa-shaped questions)."""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import ClassVar

import dspy
import pytest

from ragsuite.cli import main
from ragsuite.errors import ConfigError
from ragsuite.evaluation import (
    MANIFEST,
    RECORDS,
    REJECTED,
    SUMMARY,
    RunStore,
    evaluate,
    format_table,
    summarize,
)
from ragsuite.files import LOCK_FILE
from ragsuite.processes import stop_process
from ragsuite.programs.base import RAGProgram
from ragsuite.testing.openai_server import LocalOpenAIServer
from ragsuite.testing.scripted import ScriptedLM

QUESTIONS = [
    (
        "q0",
        "Which river flows through the capital of the country that hosted the 1992 Olympics?",
        "Manzanares",
    ),
    ("q1", "Who painted the ceiling of the chapel commissioned by Pope Sixtus IV?", "Michelangelo"),
    ("q2", "What is the name of the ship on which Charles Darwin sailed?", "Beagle"),
    ("q3", "Which element has the chemical symbol that is also the name of a Roman god?", "Mercury"),
]

#: The same, the first question holding U+2028, which ``str.splitlines()`` splits on and JSON does not escape.
SEPARATED = [(QUESTIONS[0][0], QUESTIONS[0][1] + "\u2028(a line separator)", "Manzanares"), *QUESTIONS[1:]]


def make_examples(questions=QUESTIONS) -> list[dspy.Example]:
    return [
        dspy.Example(id=i, question=q, answers=[a], gold_passage_ids=[f"p-{i}"], type="bridge").with_inputs(
            "question"
        )
        for i, q, a in questions
    ]


def write_dataset(root: Path, questions=QUESTIONS) -> Path:
    """A data directory holding ``hotpotqa/dev.jsonl`` with ``questions`` (JSON-escaped, so lone surrogates
    survive the file)."""
    (root / "hotpotqa").mkdir(parents=True)
    lines = [
        json.dumps({"id": i, "question": q, "answers": [a], "type": "bridge", "gold_passage_ids": [f"p-{i}"]})
        for i, q, a in questions
    ]
    (root / "hotpotqa" / "dev.jsonl").write_text("\n".join(lines) + "\n", encoding="ascii")
    return root


def gold_reply(questions=QUESTIONS):
    gold = {q: a for _, q, a in questions}
    return lambda request: {"answer": gold.get(request.inputs["question"], "unknown")}


class OneStage(RAGProgram):
    """Retrieve once (when given a retriever), then one answer stage with a parse-error fallback."""

    name: ClassVar[str] = "one-stage"

    def __init__(self, *, retriever=None, task="short") -> None:
        super().__init__(retriever=retriever, task=task)
        self.answer = dspy.Predict("question -> answer")

    def forward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        passages = self.retrieve(ledger, question, 1) if self.retriever is not None else []
        answer = self.call_stage(ledger, "answer", self.answer, fallback={"answer": ""}, question=question)
        return self.finish(ledger, answer.answer, passages)


def cli_env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "DSPY_CACHEDIR": str(tmp_path / "dspy_cache"),
    }


def eval_command(server: LocalOpenAIServer, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "eval", "--program", "no-retrieval", "--dataset", "hotpotqa", "--data-dir", str(data),
        "--lm", "openai/scripted", "--api-base", server.api_base, "--no-cache", "--no-progress",
        "--out", str(out), *extra,
    ]  # fmt: skip


def start_eval(
    server: LocalOpenAIServer, data: Path, out: Path, tmp_path: Path, *extra: str
) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ragsuite", *eval_command(server, data, out, *extra)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(tmp_path),
    )


stop = stop_process  # SIGINT, then SIGKILL if it has not exited within 10 s


def wait_for(condition, process: subprocess.Popen, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            pytest.fail(f"the run exited before {what}: {process.communicate()}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def record_lines(out: Path) -> list[str]:
    path = out / RECORDS
    return [line for line in path.read_bytes().decode().split("\n") if line.strip()] if path.exists() else []


# ------------------------------------------------------------------ unparsable replies, n=0, no retriever
def test_a_run_of_unparsable_replies_is_flagged_not_silently_scored(tmp_path, capsys):
    data = write_dataset(tmp_path / "data")
    with LocalOpenAIServer(lambda request: "no fields in this reply at all") as server:
        code = main(eval_command(server, data, tmp_path / "run"))
    captured = capsys.readouterr()
    assert code == 0
    assert "4 of 4 stage calls (100%) got an LM reply that could not be parsed" in captured.err
    summary = json.loads((tmp_path / "run" / SUMMARY).read_text())
    assert summary["fallback_share"] == 1.0 and summary["cost"]["fallbacks"] == 1.0
    assert len(summary["warnings"]) == 1 and "fallback" in summary["warnings"][0]
    header, _, row = captured.out.splitlines()[:3]
    cells = dict(zip(header.split(" | "), row.split(" | "), strict=True))
    assert cells["fallbacks/q"] == "1.00"
    assert cells["R-recall"] == "–"  # the no-retrieval program has no recall, not a recall of 0
    assert summary["retrieval_recall"] is None


def test_fallbacks_under_the_threshold_give_no_warning():
    record = {
        "id": "a",
        "error": None,
        "metrics": {"accuracy": 1.0, "f1": 1.0, "exact_match": 1.0},
        "tokens": {"requests": 5, "cache_hits": 0, "input": 10, "output": 2},
        "stats": {"lm_calls": 5, "retrievals": 1, "fallbacks": 1},
    }
    summary = summarize([record], dataset="hotpotqa", total=1)
    assert summary["fallback_share"] == pytest.approx(0.2) and summary["warnings"] == []
    assert "| 5.00 | 5.00 | 1.00 | 12 | 0.00 | 1.00 |" in format_table([summary])


def test_a_run_with_nothing_scored_shows_dashes_not_zeros():
    failed = {"id": "a", "error": {"type": "RetrievalError", "message": "down"}}
    summary = summarize([failed], dataset="hotpotqa", total=1)
    assert summary["n"] == 0
    assert summary["metrics"] == {"accuracy": None, "f1": None, "exact_match": None}
    assert all(value is None for value in summary["cost"].values())
    row = format_table([summary]).splitlines()[2]
    assert "0.0" not in row and "0.00" not in row
    assert row.endswith("| 0/1 | 1 | – | – | – | – | – | – | – | – | – | – |")


def test_a_retrieving_program_that_found_nothing_has_recall_zero():
    class Empty:
        def __call__(self, query, k):
            return []

        def batch(self, queries, k):
            return [[] for _ in queries]

    examples = make_examples()[:1]
    with dspy.context(lm=ScriptedLM(gold_reply())):
        result = evaluate(OneStage(retriever=Empty()), examples, dataset="hotpotqa", progress=False)
    assert result.records[0]["retrieval_recall"] == 0.0 and result.summary["retrieval_recall"] == 0.0
    with dspy.context(lm=ScriptedLM(gold_reply())):
        result = evaluate(OneStage(), examples, dataset="hotpotqa", progress=False)
    assert result.records[0]["retrieval_recall"] is None and result.summary["retrieval_recall"] is None


# ------------------------------------------------------------------ lone surrogates
def test_a_lone_surrogate_in_a_reply_is_written_and_read_back(tmp_path):
    examples = make_examples()
    odd = examples[1].question

    def respond(request):
        if request.inputs["question"] == odd:
            return {"answer": "Michel\ud800angelo"}
        return gold_reply()(request)

    with dspy.context(lm=ScriptedLM(respond)):
        result = evaluate(OneStage(), examples, dataset="hotpotqa", out_dir=tmp_path, progress=False)
    assert result.n == 4 and result.errors == 0 and (tmp_path / SUMMARY).is_file()
    text = (tmp_path / RECORDS).read_bytes().decode("utf-8")  # valid UTF-8 throughout
    by_id = {r["id"]: r for r in map(json.loads, text.splitlines())}
    assert by_id["q1"]["prediction"] == "Michel\ud800angelo"  # kept, not dropped
    assert "Michel\\ud800angelo" in text
    assert RunStore(tmp_path).load_records().keys() == {"q0", "q1", "q2", "q3"}


def test_lone_surrogates_from_the_server_and_the_dataset_do_not_stop_the_run(tmp_path, capsys):
    questions = [*QUESTIONS[:2], ("bad", "Which \ud800 city hosts the Louvre?", "Paris"), *QUESTIONS[2:]]
    data = write_dataset(tmp_path / "data", questions)
    gold = {q: a for _, q, a in questions}

    def respond(request):
        question = request.inputs["question"]
        return {"answer": "Beagle\udfff" if "Darwin" in question else gold.get(question, "Paris")}

    out = tmp_path / "run"
    with LocalOpenAIServer(respond) as server:
        first = main(eval_command(server, data, out))
        capsys.readouterr()
        second = main(eval_command(server, data, out))  # a rerun does not crash on the bad question either
    assert first == second == 1  # the bad question fails (recorded, retried on the rerun), the rest ran
    summary = json.loads((out / SUMMARY).read_text())
    assert (summary["n"], summary["errors"]) == (4, 1)
    records = [json.loads(line) for line in record_lines(out)]
    assert sorted(r["id"] for r in records) == sorted(i for i, _, _ in questions)
    darwin = next(r for r in records if r["id"] == "q2")
    assert darwin["prediction"] == "Beagle\udfff"
    bad = next(r for r in records if r["id"] == "bad")
    assert "lone surrogate" in bad["error"]["message"]
    assert bad["question"] == "Which \ud800 city hosts the Louvre?"


def test_a_reply_longer_than_max_tokens_allows_is_recorded_as_an_error_and_the_run_goes_on(tmp_path, capsys):
    """A 300 KB reply of unbalanced JSON (a server ignoring max_tokens) held the run for minutes with nothing
    written: DSPy's JSON fallback repairs malformed JSON in super-linear time (1 MB: minutes). A reply longer
    than max_tokens can produce is now the example's error, before any parsing; a long reply within a raised
    --max-tokens is answered, and written without delay (redaction rescanned a 100 KB word from each letter).
    """
    data = write_dataset(tmp_path / "data")
    gold = {q: a for _, q, a in QUESTIONS}
    flood = '{"answer": ' + "{ word " * 50_000  # 300 KB

    def respond(request):
        question = request.inputs["question"]
        if "Darwin" in question:
            return flood
        if "Sixtus" in question:
            return {"answer": "Michelangelo " + "x" * 99_000}  # 100 KB: within --max-tokens 8192 (131 KB)
        return {"answer": gold[question]}

    out = tmp_path / "run"
    started = time.monotonic()
    with LocalOpenAIServer(respond) as server:
        code = main(eval_command(server, data, out, "--max-tokens", "8192", "--retries", "0"))
    elapsed = time.monotonic() - started
    assert code == 1  # the flooded question failed, and was recorded
    records = {r["id"]: r for r in map(json.loads, record_lines(out))}
    assert sorted(records) == ["q0", "q1", "q2", "q3"]
    error = records["q2"]["error"]
    assert error["type"] == "LMReplyTooLongError"
    assert "replied with 350,011 characters, more than max_tokens=8192" in error["message"]
    assert "--max-tokens" in error["message"]
    assert records["q1"]["error"] is None and records["q1"]["prediction"].startswith("Michelangelo")
    assert records["q0"]["metrics"]["exact_match"] == 1.0
    assert elapsed < 60, elapsed  # bounded: no parse of the flood


# ------------------------------------------------------------------ one process per run directory
@pytest.mark.slow
def test_a_second_process_on_the_same_directory_is_refused(tmp_path, capsys):
    data = write_dataset(tmp_path / "data")
    out = tmp_path / "run"
    # The first run's LM calls wait until the second process has been refused, so the first run holds the
    # directory throughout, however slowly a loaded machine starts the second one.
    answer, release, asked = gold_reply(), threading.Event(), threading.Event()

    def held(request):
        asked.set()
        release.wait(timeout=300)
        return answer(request)

    with LocalOpenAIServer(held) as server:
        first = start_eval(server, data, out, tmp_path, "--threads", "1")
        try:
            lock = out / LOCK_FILE
            wait_for(lambda: lock.exists() and f"pid {first.pid}" in lock.read_text(), first, "the lock")
            wait_for(asked.is_set, first, "the first run's first LM call")
            second = start_eval(server, data, out, tmp_path, "--threads", "1")
            try:
                _, stderr = second.communicate(timeout=120)
            finally:
                stop(second)
            assert second.returncode == 2, stderr
            assert f"{out} is in use by pid {first.pid} on host" in stderr and "another --out" in stderr
            # The same lock guards a tune output directory.
            tune = [
                "tune", "--program", "no-retrieval", "--dataset", "hotpotqa", "--data-dir", str(data),
                "--train", "1", "--val", "2", "--trials", "1", "--lm", "openai/scripted",
                "--api-base", server.api_base, "--out", str(out),
            ]  # fmt: skip
            assert main(tune) == 2
            assert f"is in use by pid {first.pid}" in capsys.readouterr().err
            assert first.poll() is None  # the first run was not disturbed
        finally:
            release.set()
            stop(first)
    ids = [json.loads(line)["id"] for line in record_lines(out)]
    assert len(ids) == len(set(ids))  # nothing ran twice
    assert server.question_counts.most_common(1)[0][1] == 1


def test_the_lock_is_released_after_a_run(tmp_path):
    examples = make_examples()[:1]
    with dspy.context(lm=ScriptedLM(gold_reply())):
        evaluate(OneStage(), examples, dataset="hotpotqa", out_dir=tmp_path, progress=False)
        evaluate(OneStage(), examples, dataset="hotpotqa", out_dir=tmp_path, progress=False)
        with pytest.raises(ConfigError):  # a refused run releases it too
            evaluate(OneStage(), examples[:0], dataset="hotpotqa", out_dir=tmp_path, progress=False)
        evaluate(OneStage(), examples, dataset="hotpotqa", out_dir=tmp_path, progress=False)


# ------------------------------------------------------------------ bad record lines
def write_run_with_bad_lines(tmp_path) -> tuple[Path, bytes]:
    questions = SEPARATED
    with dspy.context(lm=ScriptedLM(gold_reply(questions))):
        evaluate(OneStage(), make_examples(questions), dataset="hotpotqa", out_dir=tmp_path, progress=False)
    (tmp_path / SUMMARY).unlink()  # as if killed: report recomputes from the records
    path = tmp_path / RECORDS
    lines = path.read_bytes().split(b"\n")[:-1]
    assert "\u2028".encode() in b"".join(lines)
    bad = [b'["not", "a", "record"]', b'{"id": "q9", "metrics": "none"}', b"{not json"]
    torn = lines[3][: len(lines[3]) // 2]
    path.write_bytes(b"\n".join([lines[0], bad[0], lines[1], bad[1], lines[2], bad[2]]) + b"\n" + torn)
    return path, torn


def test_report_skips_and_names_bad_lines(tmp_path, capsys):
    path, _ = write_run_with_bad_lines(tmp_path)
    assert main(["report", str(tmp_path), "--json"]) == 0
    captured = capsys.readouterr()
    row = json.loads(captured.out)[0]
    assert (row["n"], row["errors"], row["total"]) == (3, 0, 4)
    assert row["metrics"]["exact_match"] == 1.0
    for lineno, why in [
        (2, "not a JSON object"),
        (4, "no 'metrics'"),
        (6, "not valid JSON"),
        (7, "truncated"),
    ]:
        assert f"{path}:{lineno}: {why}" in captured.err


def test_report_names_a_broken_summary_or_manifest(tmp_path, capsys):
    write_run_with_bad_lines(tmp_path)
    (tmp_path / SUMMARY).write_text('["not", "a", "summary"]')
    assert main(["report", str(tmp_path), "--json"]) == 0
    captured = capsys.readouterr()
    assert f"{tmp_path / SUMMARY} holds a JSON list, not an object" in captured.err
    assert json.loads(captured.out)[0]["n"] == 3  # recomputed from the usable records
    (tmp_path / MANIFEST).write_text('"a string"')
    assert main(["report", str(tmp_path)]) == 2
    assert f"{tmp_path / MANIFEST} is not an eval run manifest" in capsys.readouterr().err


def test_eval_skips_names_and_keeps_bad_lines(tmp_path, caplog):
    path, torn = write_run_with_bad_lines(tmp_path)
    questions = SEPARATED
    # Records are written in the order questions finish: the torn one is whichever finished last.
    kept = {json.loads(line)["id"] for line in path.read_bytes().split(b"\n")[:-1] if b'"metrics": {' in line}
    (torn_question,) = [q for i, q, _ in questions if i not in kept]
    lm = ScriptedLM(gold_reply(questions))
    with caplog.at_level(logging.WARNING, "ragsuite.evaluation"), dspy.context(lm=lm):
        result = evaluate(
            OneStage(), make_examples(questions), dataset="hotpotqa", out_dir=tmp_path, progress=False
        )
    assert result.n == 4 and result.errors == 0
    assert [r.inputs["question"] for r in lm.requests] == [torn_question]  # only the torn one reran
    for lineno in (2, 4, 6, 7):
        assert f"{path}:{lineno}:" in caplog.text
    rejected = (tmp_path / REJECTED).read_bytes().split(b"\n")
    assert rejected[:4] == [b'["not", "a", "record"]', b'{"id": "q9", "metrics": "none"}', b"{not json", torn]
    assert sorted(json.loads(line)["id"] for line in record_lines(tmp_path)) == ["q0", "q1", "q2", "q3"]


def test_records_without_a_manifest_are_refused(tmp_path):
    examples = make_examples()
    with dspy.context(lm=ScriptedLM(gold_reply())):
        evaluate(OneStage(), examples, dataset="hotpotqa", out_dir=tmp_path, progress=False)
    (tmp_path / MANIFEST).unlink()
    before = (tmp_path / RECORDS).read_bytes()
    with pytest.raises(ConfigError, match=r"has records .* but no manifest\.json.*another --out"):
        evaluate(OneStage(), examples, dataset="hotpotqa", out_dir=tmp_path, progress=False)
    assert (tmp_path / RECORDS).read_bytes() == before and not (tmp_path / MANIFEST).exists()


# ------------------------------------------------------------------ SIGTERM
def interrupt_when(
    ready, process: subprocess.Popen, what: str, signum: int, *, timeout: float = 60
) -> tuple[str, float]:
    """Once ``ready()``, send ``signum`` and wait for the process to exit: its stderr and the seconds it took.
    The process is stopped whatever happens."""
    try:
        wait_for(ready, process, what)
        started = time.monotonic()
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=timeout)
        return stderr, time.monotonic() - started
    finally:
        stop(process)


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, code, stopped",
    [(signal.SIGTERM, 143, "terminated (SIGTERM)"), (signal.SIGINT, 130, "interrupted")],
)
def test_sigterm_and_ctrl_c_keep_the_records_and_write_the_summary(tmp_path, signum, code, stopped):
    data = write_dataset(tmp_path / "data")
    out = tmp_path / "run"
    # The first question is answered at once; the others wait until the signal was sent, so exactly one
    # record is kept however slow the machine.
    answer, release, calls = gold_reply(), threading.Event(), itertools.count()

    def first_only(request):
        if next(calls):
            release.wait(timeout=300)
        return answer(request)

    with LocalOpenAIServer(first_only) as server:
        process = start_eval(server, data, out, tmp_path, "--threads", "1")
        try:
            wait_for(lambda: len(record_lines(out)) >= 1, process, "the first record")
            process.send_signal(signum)
            _, stderr = process.communicate(timeout=60)
        finally:
            release.set()
            stop(process)
    assert process.returncode == code, stderr
    assert "rerun the same command" in stderr
    summary = json.loads((out / SUMMARY).read_text())
    kept = record_lines(out)
    assert len(kept) == 1
    assert summary["n"] == len(kept) and summary["total"] == 4 and not summary["complete"]
    assert summary["stopped"] == stopped


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["threads", "async"])
def test_an_interrupt_does_not_wait_for_the_examples_in_flight(tmp_path, engine):
    """Every LM call takes a minute: SIGTERM must still end the run at once (the examples in flight are
    dropped and run again on resume), with the summary written."""
    data = write_dataset(tmp_path / "data")
    out = tmp_path / "run"
    with LocalOpenAIServer(gold_reply(), latency=60.0) as server:
        process = start_eval(server, data, out, tmp_path, "--threads", "2", "--engine", engine)
        stderr, waited = interrupt_when(
            lambda: server.chat_requests >= 2, process, "two examples in flight", signal.SIGTERM, timeout=30
        )
    assert process.returncode == 143, stderr
    assert waited < 20, f"the run took {waited:.0f} s to stop"
    summary = json.loads((out / SUMMARY).read_text())
    assert summary["n"] == 0 and summary["total"] == 4 and summary["stopped"] == "terminated (SIGTERM)"
    assert not record_lines(out)


@pytest.mark.slow
def test_an_interrupt_does_not_wait_for_a_program_s_concurrent_steps(tmp_path, data_dir):
    """BlendFilter asks for its two generated queries at once, each on a thread of its own: an interrupt
    must not wait for those threads' LM calls either (a thread joined at exit kept the process alive)."""
    out = tmp_path / "run"
    with LocalOpenAIServer(gold_reply(), latency=120.0) as server:
        process = subprocess.Popen(
            [sys.executable, "-m", "ragsuite", "eval", "--program", "blendfilter", "--dataset", "hotpotqa",
             "--data-dir", str(data_dir), "--limit", "2", "--lm", "openai/scripted", "--api-base",
             server.api_base, "--no-cache", "--no-progress", "--threads", "1", "--out", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(tmp_path),
        )  # fmt: skip
        stderr, waited = interrupt_when(
            lambda: server.chat_requests >= 2, process, "both generated queries in flight", signal.SIGINT
        )
    assert process.returncode == 130, stderr
    assert waited < 30, f"the run took {waited:.0f} s to stop"
    assert json.loads((out / SUMMARY).read_text())["stopped"] == "interrupted"


# ------------------------------------------------------------------ the failure warning
def test_the_failure_warning_shows_the_whole_cause_first(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-abcdefghijklmnop1234")

    class Broken:
        def __call__(self, query, k):
            raise OSError("index shard 7 is unreadable; key sk-test-abcdefghijklmnop1234 rejected")

        def batch(self, queries, k):
            return [self(q, k) for q in queries]

    question = "Which " + "very " * 80 + "long question is this?"
    examples = make_examples([("long", question, "none")])
    with caplog.at_level(logging.WARNING, "ragsuite.evaluation"), dspy.context(lm=ScriptedLM(gold_reply())):
        result = evaluate(OneStage(retriever=Broken()), examples, dataset="hotpotqa", progress=False)
    assert result.errors == 1
    line = next(r.getMessage() for r in caplog.records if "RetrievalError" in r.getMessage())
    assert line.startswith("RetrievalError: retrieval failed for question")
    assert "index shard 7 is unreadable" in line and "sk-test" not in line
    assert "(example long, question 'Which very very" in line and "long question is this?" not in line
