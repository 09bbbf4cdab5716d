"""The evaluation harness: scores, cost ledger, persistence, resume, errors, early stops."""

from __future__ import annotations

import json
import threading
import time
from typing import ClassVar

import dspy
import pytest

from ragsuite.data.datasets import load_dataset
from ragsuite.errors import ConfigError
from ragsuite.evaluation import RECORDS, REJECTED, evaluate, format_table, summarize
from ragsuite.lm import LMEndpointError, build_lm
from ragsuite.programs.base import RAGProgram
from ragsuite.retrieval.base import Passage
from ragsuite.testing.openai_server import LocalOpenAIServer
from ragsuite.testing.scripted import ScriptedLM


class GoldRetriever:
    """Returns each question's gold passages (ids only matter here)."""

    def __init__(self, examples) -> None:
        self.gold = {ex.question: list(ex.gold_passage_ids) for ex in examples}

    def __call__(self, query: str, k: int) -> list[Passage]:
        return [Passage(pid, "t", "text") for pid in self.gold.get(query, [])[:k]]

    def batch(self, queries, k):
        return [self(q, k) for q in queries]

    def describe(self):
        return {"kind": "gold", "spec": "gold"}


class TwoCallProgram(RAGProgram):
    """Retrieve once, then two LM stages: ``draft`` and ``answer``."""

    name: ClassVar[str] = "two-call"
    KNOBS: ClassVar[tuple[str, ...]] = ("top_k",)

    def __init__(self, *, retriever=None, task="short", top_k: int = 1) -> None:
        super().__init__(retriever=retriever, task=task)
        self.top_k = top_k
        self.draft = dspy.Predict("question -> draft")
        self.answer = dspy.Predict("question, draft -> answer")

    def forward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        passages = self.retrieve(ledger, question, self.top_k)
        draft = self.call_stage(ledger, "draft", self.draft, question=question).draft
        answer = self.call_stage(ledger, "answer", self.answer, question=question, draft=draft).answer
        ledger.record("answer", answer=answer)
        return self.finish(ledger, answer, passages)


@pytest.fixture(scope="module")
def examples():
    return load_dataset("hotpotqa")[:6]


def gold_responder(examples, *, right: int | None = None, fail: set[str] = frozenset()):
    """Answers the gold answer for the first ``right`` questions (all when None), a wrong one otherwise."""
    gold = {ex.question: ex.answers[0] for i, ex in enumerate(examples) if right is None or i < right}

    def respond(request):
        question = request.inputs["question"]
        if question in fail:
            raise RuntimeError(f"scripted failure for {question[:20]}")
        if request.asks_for("draft"):
            return {"draft": "thinking"}
        return {"answer": gold.get(question, "certainly not the answer")}

    return respond


def program_for(examples, top_k: int = 1) -> TwoCallProgram:
    return TwoCallProgram(retriever=GoldRetriever(examples), top_k=top_k)


def test_scores_costs_and_run_directory(examples, tmp_path):
    lm = ScriptedLM(gold_responder(examples, right=4))
    seen = []
    with dspy.context(lm=lm):
        result = evaluate(
            program_for(examples),
            examples,
            dataset="hotpotqa",
            threads=3,
            out_dir=tmp_path,
            progress=False,
            on_record=seen.append,
        )
    assert result.n == 6 and result.errors == 0 and result.stopped is None
    assert result.metrics["accuracy"] == pytest.approx(4 / 6)
    assert result.metrics["exact_match"] == pytest.approx(4 / 6)
    assert result.cost["lm_calls"] == 2 and result.cost["retrievals"] == 1
    assert len(seen) == 6 and all("metrics" in r for r in seen)
    assert [r["id"] for r in result.records] == [ex.id for ex in examples]
    first = result.records[0]
    assert first["prediction"] == examples[0].answers[0]
    assert first["tokens"]["lm_invocations"] == 2 and first["tokens"]["requests"] == 2
    assert first["retrieval_recall"] == pytest.approx(1 / len(examples[0].gold_passage_ids))
    assert [e["stage"] for e in first["trace"]] == ["answer"]
    lines = (tmp_path / RECORDS).read_text().splitlines()
    assert sorted(json.loads(line)["id"] for line in lines) == sorted(ex.id for ex in examples)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["metrics"]["accuracy"] == pytest.approx(4 / 6) and summary["complete"]
    table = (tmp_path / "table.md").read_text()
    assert "| Acc | F1 | EM |" in table and "| 66.7 | 66.7 | 66.7 |" in table
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["program"] == "two-call" and manifest["knobs"] == {"top_k": 1}


def test_examples_run_concurrently(examples):
    active, peak, lock = [0], [0], threading.Lock()

    def slow(request):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return gold_responder(examples)(request)

    with dspy.context(lm=ScriptedLM(slow)):
        result = evaluate(program_for(examples), examples, dataset="hotpotqa", threads=4, progress=False)
    assert result.metrics["accuracy"] == 1.0
    assert peak[0] >= 3


def test_tokens_come_from_the_server_usage(examples):
    with LocalOpenAIServer(gold_responder(examples)) as server:
        lm = build_lm("openai/scripted", api_base=server.api_base, cache=False, retries=0)
        with dspy.context(lm=lm):
            result = evaluate(
                program_for(examples), examples[:2], dataset="hotpotqa", threads=2, progress=False
            )
    for record in result.records:
        assert record["tokens"]["input"] > 50 and record["tokens"]["output"] > 3
        assert record["tokens"]["by_lm"]["openai/scripted"]["total_tokens"] == (
            record["tokens"]["input"] + record["tokens"]["output"]
        )
    assert result.cost["input_tokens"] == pytest.approx(sum(r["tokens"]["input"] for r in result.records) / 2)


def test_cache_hits_are_counted_apart(examples):
    dspy.configure_cache(enable_memory_cache=True, enable_disk_cache=False)
    try:
        with LocalOpenAIServer(gold_responder(examples)) as server:
            lm = build_lm("openai/scripted", api_base=server.api_base, cache=True, retries=0)
            with dspy.context(lm=lm):
                first = evaluate(program_for(examples), examples[:2], dataset="hotpotqa", progress=False)
                again = evaluate(program_for(examples), examples[:2], dataset="hotpotqa", progress=False)
            assert server.chat_requests == 4
    finally:
        dspy.configure_cache(enable_memory_cache=False, enable_disk_cache=False)
    assert first.cost["cache_hits"] == 0 and first.cost["lm_requests"] == 2
    assert again.cost["cache_hits"] == 2 and again.cost["lm_requests"] == 0
    # A cached answer costs what it cost when it was asked: never 0 (a cost objective must not favour it).
    assert again.cost["input_tokens"] == first.cost["input_tokens"] > 0
    assert again.cost["output_tokens"] == first.cost["output_tokens"] > 0
    assert again.records[0]["tokens"]["cached_input"] == again.records[0]["tokens"]["input"]
    assert first.records[0]["tokens"]["cached_input"] == 0
    assert again.records[0]["tokens"]["lm_invocations"] == 2


def test_the_cache_never_answers_for_another_endpoint(examples):
    """Two servers serve different models under one name: each run must see its own server's answers."""
    right, wrong = gold_responder(examples), gold_responder(examples, right=0)
    dspy.configure_cache(enable_memory_cache=True, enable_disk_cache=False)
    try:
        with LocalOpenAIServer(right) as good, LocalOpenAIServer(wrong) as other:
            scores = []
            for server in (good, other, good):
                lm = build_lm("openai/scripted", api_base=server.api_base, cache=True, retries=0)
                with dspy.context(lm=lm):
                    result = evaluate(program_for(examples), examples[:3], dataset="hotpotqa", progress=False)
                scores.append(result.metrics["exact_match"])
            # Two calls per question: the second server is asked itself, not served the first one's answers,
            # and the third run is served from the cache of its own endpoint.
            assert other.chat_requests == 6 and good.chat_requests == 6
    finally:
        dspy.configure_cache(enable_memory_cache=False, enable_disk_cache=False)
    assert scores == [1.0, 0.0, 1.0]


def test_failed_examples_are_recorded_apart_and_retried_on_resume(examples, tmp_path):
    bad = examples[1].question
    lm = ScriptedLM(gold_responder(examples, fail={bad}))
    with dspy.context(lm=lm):
        result = evaluate(
            program_for(examples), examples, dataset="hotpotqa", threads=2, out_dir=tmp_path, progress=False
        )
    assert result.errors == 1 and result.n == 5
    assert result.metrics["accuracy"] == 1.0  # a failure is not a wrong answer
    failed = next(r for r in result.records if r["error"])
    assert failed["id"] == examples[1].id and "scripted failure" in failed["error"]["message"]

    fixed = ScriptedLM(gold_responder(examples))
    with dspy.context(lm=fixed):
        again = evaluate(
            program_for(examples), examples, dataset="hotpotqa", threads=2, out_dir=tmp_path, progress=False
        )
    assert again.errors == 0 and again.n == 6
    assert {r.inputs["question"] for r in fixed.requests} == {bad}  # only the failed one ran again
    ids = [json.loads(line)["id"] for line in (tmp_path / RECORDS).read_text().splitlines()]
    assert sorted(ids) == sorted(ex.id for ex in examples)


def test_truncated_last_record_is_rerun(examples, tmp_path):
    with dspy.context(lm=ScriptedLM(gold_responder(examples))):
        evaluate(
            program_for(examples), examples, dataset="hotpotqa", threads=2, out_dir=tmp_path, progress=False
        )
    path = tmp_path / RECORDS
    data = path.read_bytes()
    last = data.rstrip(b"\n").rsplit(b"\n", 1)[1]
    path.write_bytes(data[: len(data) - len(last) // 2 - 1])  # a kill in the middle of the last write
    lost_id = json.loads(last)["id"]
    lm = ScriptedLM(gold_responder(examples))
    with dspy.context(lm=lm):
        result = evaluate(
            program_for(examples), examples, dataset="hotpotqa", threads=2, out_dir=tmp_path, progress=False
        )
    assert result.n == 6
    lost_question = next(ex.question for ex in examples if ex.id == lost_id)
    assert {r.inputs["question"] for r in lm.requests} == {lost_question}
    ids = [json.loads(line)["id"] for line in path.read_text().splitlines()]
    assert sorted(ids) == sorted(ex.id for ex in examples)


def test_corrupt_record_in_the_middle_is_skipped_named_and_kept(examples, tmp_path, caplog):
    with dspy.context(lm=ScriptedLM(gold_responder(examples))):
        evaluate(program_for(examples), examples[:2], dataset="hotpotqa", out_dir=tmp_path, progress=False)
    path = tmp_path / RECORDS
    path.write_text("garbage\n" + path.read_text())
    lm = ScriptedLM(gold_responder(examples))
    with dspy.context(lm=lm):
        result = evaluate(
            program_for(examples), examples[:2], dataset="hotpotqa", out_dir=tmp_path, progress=False
        )
    assert result.n == 2 and not lm.requests  # both records were kept: nothing ran again
    assert f"{path}:1: not valid JSON" in caplog.text
    assert (tmp_path / REJECTED).read_text() == "garbage\n"
    # Both records stay, in the order the first run finished them (threads: either order).
    assert sorted(json.loads(line)["id"] for line in path.read_text().splitlines()) == sorted(
        ex.id for ex in examples[:2]
    )


def test_changed_configuration_is_refused(examples, tmp_path):
    with dspy.context(lm=ScriptedLM(gold_responder(examples))):
        evaluate(program_for(examples), examples[:2], dataset="hotpotqa", out_dir=tmp_path, progress=False)
        with pytest.raises(ConfigError, match=r"knobs\.top_k: 1 -> 2"):
            evaluate(program_for(examples, top_k=2), examples[:2], dataset="hotpotqa", out_dir=tmp_path)
        with pytest.raises(ConfigError, match="examples_sha256"):
            evaluate(program_for(examples), examples[:3], dataset="hotpotqa", out_dir=tmp_path)


def test_max_errors_stops_cleanly(examples, tmp_path):
    lm = ScriptedLM(gold_responder(examples, fail={ex.question for ex in examples}))
    with dspy.context(lm=lm):
        result = evaluate(
            program_for(examples),
            examples,
            dataset="hotpotqa",
            threads=1,
            out_dir=tmp_path,
            progress=False,
            max_errors=2,
        )
    assert result.stopped == "max_errors=2 reached"
    assert result.errors == 2 and len(result.records) == 2
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["errors"] == 2 and summary["stopped"] == "max_errors=2 reached" and not summary["complete"]


class Prune(Exception):
    pass


def test_on_record_exception_stops_the_run_and_propagates(examples, tmp_path):
    def on_record(record):
        raise Prune

    with pytest.raises(Prune), dspy.context(lm=ScriptedLM(gold_responder(examples))):
        evaluate(
            program_for(examples),
            examples,
            dataset="hotpotqa",
            threads=2,
            out_dir=tmp_path,
            progress=False,
            on_record=on_record,
        )
    lines = (tmp_path / RECORDS).read_text().splitlines()
    assert 1 <= len(lines) <= 4  # workers run at most 2 * threads examples ahead of the caller


def test_fatal_lm_error_stops_with_a_clear_message(examples):
    with LocalOpenAIServer(gold_responder(examples)) as server:
        lm = build_lm("openai/missing-model", api_base=server.api_base, cache=False, retries=0)
        with pytest.raises(LMEndpointError, match="unknown model"), dspy.context(lm=lm):
            evaluate(program_for(examples), examples, dataset="hotpotqa", threads=1, progress=False)
        assert server.chat_requests == 1


def test_summaries_and_tables_for_other_datasets():
    record = {
        "id": "a",
        "error": None,
        "metrics": {"str_em": 0.5, "str_hit": 0.0},
        "tokens": {"requests": 2, "cache_hits": 0, "input": 100, "output": 20},
        "stats": {"lm_calls": 2, "retrievals": 1},
        "retrieval_recall": None,
    }
    summary = summarize(
        [record, {"id": "b", "error": {"type": "X", "message": "m"}}], dataset="asqa", total=3
    )
    assert summary["metrics"] == {"str_em": 0.5, "str_hit": 0.0}
    assert (summary["n"], summary["errors"], summary["complete"]) == (1, 1, False)
    table = format_table([{**summary, "program": "vanilla"}])
    assert "| STR-EM | STR-Hit |" in table and "| 1/3 | 1 | 50.0 | 0.0 |" in table and "| 120 |" in table


def test_a_malformed_reply_costs_two_requests_for_one_stage_call(examples):
    """DSPy asks again (JSON adapter) after a reply it cannot parse: calls and requests are counted apart."""
    from ragsuite.programs.baselines import NoRetrieval

    with LocalOpenAIServer(lambda request: "not the expected format at all") as server:
        lm = build_lm("openai/scripted", api_base=server.api_base, cache=False, retries=0)
        with dspy.context(lm=lm):
            result = evaluate(NoRetrieval(), examples[:1], dataset="hotpotqa", progress=False)
    record = result.records[0]
    assert record["stats"]["lm_calls"] == 1 and record["stats"]["fallbacks"] == 1
    assert record["tokens"]["requests"] == server.chat_requests == 2  # asked again by DSPy's JSON adapter
    assert "| 1.00 | 2.00 | 1.00 |" in format_table([result.summary])  # LM calls/q, requests/q, fallbacks/q


def test_daemon_thread_pool_runs_cancels_and_never_blocks_exit() -> None:
    from concurrent.futures import CancelledError

    from ragsuite.aio import DaemonThreadPool

    pool = DaemonThreadPool(2, name="test-pool")
    gate = threading.Event()
    try:
        blocked = [pool.submit(gate.wait, 30) for _ in range(2)]  # both workers busy
        queued = pool.submit(lambda: 1)
        assert pool.submit(lambda: 1 / 0) is not None
        time.sleep(0.05)
        workers = [t for t in threading.enumerate() if t.name.startswith("test-pool")]
        assert len(workers) == 2 and all(t.daemon for t in workers)
        assert not queued.done()
        pool.shutdown(wait=False, cancel_futures=True)
        assert queued.cancelled()
        with pytest.raises(CancelledError):
            queued.result()
    finally:
        gate.set()
    assert all(f.result(timeout=5) is True for f in blocked)
    for thread in workers:
        thread.join(timeout=5)
        assert not thread.is_alive()

    pool = DaemonThreadPool(1, name="test-pool")
    failed = pool.submit(lambda: 1 / 0)
    done = pool.submit(lambda x, *, y: x + y, 1, y=2)
    assert done.result(timeout=5) == 3
    assert isinstance(failed.exception(timeout=5), ZeroDivisionError)
    pool.shutdown(wait=True)


@pytest.mark.parametrize("engine", ["threads", "async"])
def test_max_errors_starts_no_example_after_the_last_failure(examples, engine) -> None:
    """Every example fails; with max_errors=2 and one slot, the run stops after exactly two."""
    started = []

    class Failing(RAGProgram):
        name: ClassVar[str] = "failing"

        def forward(self, question: str) -> dspy.Prediction:
            from ragsuite.errors import RetrievalError

            started.append(question)
            raise RetrievalError("the index is gone")

    with dspy.context(lm=ScriptedLM(lambda request: {"answer": "x"})):
        result = evaluate(
            Failing(),
            examples[:6],
            dataset="hotpotqa",
            threads=1,
            engine=engine,
            max_errors=2,
            progress=False,
        )
    assert result.stopped == "max_errors=2 reached"
    assert result.errors == 2 and len(started) == 2
