"""FilterStage and BlendStage: call counts, kept/dropped bookkeeping, concurrency, fallbacks."""

from __future__ import annotations

import threading

import dspy
import pytest

from ragsuite.aio import run_sync
from ragsuite.errors import ConfigError
from ragsuite.programs.base import RAGProgram
from ragsuite.programs.pipeline import aretrieve_recorded
from ragsuite.programs.stages import BlendStage, FilterStage, join_query
from ragsuite.retrieval.base import Passage
from ragsuite.testing.retrievers import ListRetriever
from ragsuite.testing.scripted import ScriptedLM

PASSAGES = [
    Passage("p1", "Harold II", "Harold II married Edith Swan-neck."),
    Passage("p2", "Edith Pargeter", "Edith Pargeter was a novelist."),
    Passage("p3", "Edith Rigby", "Edith Rigby was a suffragette."),
]
QUESTION = "Which English king was married to Edith Swan-neck?"


class _Host(RAGProgram):
    """A bare program that only hosts stages, as vanilla or deepnote would."""

    name = ""

    def __init__(self, *, retriever=None, stage: dspy.Module | None = None) -> None:
        super().__init__(retriever=retriever)
        self.stage = stage


def _relevant(request) -> bool:
    return "Harold" in request.inputs.get("passage", "")


def test_per_passage_filter_calls_once_per_passage_and_records_kept_and_dropped() -> None:
    lm = ScriptedLM(lambda r: {"relevant": _relevant(r)})
    host = _Host(stage=FilterStage(mode="per_passage"))
    ledger = host.start(QUESTION)
    with dspy.context(lm=lm):
        kept = host.stage(host, ledger, QUESTION, PASSAGES, sub_question="q1")
    assert [p.id for p in kept] == ["p1"]
    assert len(lm.requests) == 3 and ledger.lm_calls == 3
    assert {r.inputs["passage"] for r in lm.requests} == {p.render() for p in PASSAGES}
    event = ledger.trace[-1]
    assert event["stage"] == "filter" and event["mode"] == "per_passage"
    assert event["kept"] == ["p1"] and event["dropped"] == ["p2", "p3"] and event["sub_question"] == "q1"


def test_per_passage_filter_calls_run_concurrently() -> None:
    barrier = threading.Barrier(3, timeout=5)  # breaks unless all three judgments are in flight together

    def responder(request):
        barrier.wait()
        return {"relevant": True}

    host = _Host(stage=FilterStage(mode="per_passage"))
    ledger = host.start(QUESTION)
    with dspy.context(lm=ScriptedLM(responder)):
        kept = host.stage(host, ledger, QUESTION, PASSAGES)
    assert [p.id for p in kept] == ["p1", "p2", "p3"]


def test_batch_filter_is_one_call_and_ignores_out_of_range_numbers() -> None:
    lm = ScriptedLM(lambda r: {"relevant": [3, 1, 7, 0]})
    host = _Host(stage=FilterStage(mode="batch"))
    ledger = host.start(QUESTION)
    with dspy.context(lm=lm):
        kept = host.stage(host, ledger, QUESTION, PASSAGES)
    assert [p.id for p in kept] == ["p1", "p3"]  # original order, not the LM's
    assert len(lm.requests) == 1 and ledger.lm_calls == 1
    assert lm.requests[0].inputs["passages"].count("[2] Edith Pargeter") == 1
    event = ledger.trace[-1]
    assert event["kept"] == ["p1", "p3"] and event["dropped"] == ["p2"] and event["invalid"] == [7, 0]


def test_unparsable_filter_keeps_the_passage_and_records_the_fallback() -> None:
    def responder(request):
        if "Pargeter" in request.inputs.get("passage", ""):
            return "I cannot decide."
        return {"relevant": _relevant(request)}

    host = _Host(stage=FilterStage(mode="per_passage"))
    ledger = host.start(QUESTION)
    with dspy.context(lm=ScriptedLM(responder)):
        kept = host.stage(host, ledger, QUESTION, PASSAGES)
    assert [p.id for p in kept] == ["p1", "p2"]
    assert [f["stage"] for f in ledger.fallbacks] == ["filter"]
    assert ledger.fallbacks[0]["used"] == {"relevant": True}
    assert ledger.stats()["fallbacks"] == 1


def test_unparsable_batch_filter_keeps_everything() -> None:
    host = _Host(stage=FilterStage(mode="batch"))
    ledger = host.start(QUESTION)
    with dspy.context(lm=ScriptedLM(lambda r: "none of them, really")):
        kept = host.stage(host, ledger, QUESTION, PASSAGES)
    assert [p.id for p in kept] == ["p1", "p2", "p3"]
    assert ledger.fallbacks and ledger.fallbacks[0]["stage"] == "filter"


def test_filter_of_nothing_makes_no_call() -> None:
    lm = ScriptedLM(lambda r: {"relevant": True})
    host = _Host(stage=FilterStage())
    ledger = host.start(QUESTION)
    with dspy.context(lm=lm):
        assert host.stage(host, ledger, QUESTION, []) == []
    assert lm.requests == [] and ledger.trace[-1]["kept"] == []


def test_filter_stage_predictors_are_named_after_the_filter_stage() -> None:
    host = _Host(stage=None)
    host.filter = FilterStage(mode="batch")
    # The batch filter reasons passage by passage (a ChainOfThought), so its predictor sits one level down.
    assert [name for name, _ in host.named_predictors()] == ["filter.batch.predict"]
    with pytest.raises(ConfigError, match="filter mode"):
        FilterStage(mode="each")  # type: ignore[arg-type]


def test_blend_stage_makes_external_then_internal_query_joined_with_the_question() -> None:
    def responder(request):
        if "passages" in request.inputs:
            assert "[1] Harold II | Harold II married Edith Swan-neck." in request.inputs["passages"]
            return {"reasoning": "Edith Swan-neck was Harold's wife.", "answer": "Harold II"}
        return {"knowledge": "Harold Godwinson, king of England in 1066."}

    lm = ScriptedLM(responder)
    host = _Host(stage=BlendStage(which="both"))
    ledger = host.start(QUESTION)
    with dspy.context(lm=lm):
        queries = host.stage(host, ledger, QUESTION, PASSAGES)
    assert queries == [
        f"{QUESTION}\nHarold II\nEdith Swan-neck was Harold's wife.",
        f"{QUESTION}\nHarold Godwinson, king of England in 1066.",
    ]
    assert ledger.lm_calls == 2 and len(lm.requests) == 2
    assert [e["variant"] for e in ledger.trace if e["stage"] == "blend"] == ["external", "internal"]


def test_blend_stage_single_variant_and_fallback_to_the_question() -> None:
    host = _Host(stage=BlendStage(which="internal"))
    ledger = host.start(QUESTION)
    with dspy.context(lm=ScriptedLM(lambda r: "garbage without fields")):
        queries = host.stage(host, ledger, QUESTION, [])
    assert queries == [QUESTION]
    assert [f["stage"] for f in ledger.fallbacks] == ["blend_internal"]
    assert BlendStage(which="external").variants == ["external"]
    with pytest.raises(ConfigError, match="blend must be"):
        BlendStage(which="neither")  # type: ignore[arg-type]


def test_join_query_puts_the_question_first_and_truncates() -> None:
    assert join_query("Q?", "  lots   of\ntext ") == "Q?\nlots of text"
    assert join_query("Q?", "") == "Q?"
    assert len(join_query("Q?", "x" * 900, max_chars=500)) == 500
    assert join_query("Q?", "reasoning", lead=" Stettin ") == "Stettin\nQ?\nreasoning"


def test_external_blend_query_keeps_the_answer_when_the_reasoning_is_long() -> None:
    # BlendFilter: q_ex = a_ex ⊕ q, and blending is "crucial" for sparse retrieval because it puts the
    # answer's keywords into the query; a long chain of thought reaches a retriever reading whole queries
    # uncut, and one with a token window (ColBERT) reads the question and the answer first.
    question = "Where did Anna of Pomerania's father die?"

    def responder(request):
        if "knowledge" in request.output_fields:
            return {"knowledge": "k " * 400}
        return {"reasoning": "long reasoning " * 60, "answer": "Stettin"}

    host = _Host(stage=BlendStage(which="external"))
    ledger = host.start(question)
    with dspy.context(lm=ScriptedLM(responder)):
        (query,) = host.stage(host, ledger, question, PASSAGES)
    assert query == f"{question}\nStettin\n" + " ".join(["long reasoning"] * 60)
    host.retriever = ListRetriever(PASSAGES)
    host.retriever.query_token_limit = 32
    with dspy.context(lm=ScriptedLM(responder)):
        (query,) = host.stage(host, host.start(question), question, PASSAGES)
    assert query.startswith(f"{question}\nStettin\nlong") and len(query.split()) == 32


def test_a_recorded_retrieval_records_ids_and_counts() -> None:
    host = _Host(retriever=ListRetriever(PASSAGES, {"q": ["p2", "p1"]}))
    ledger = host.start(QUESTION)
    passages = run_sync(aretrieve_recorded(host, ledger, "q", 5, hop=1))
    assert [p.id for p in passages] == ["p2", "p1"]
    assert ledger.trace[-1] == {"stage": "retrieve", "query": "q", "passage_ids": ["p2", "p1"], "hop": 1}
    assert run_sync(aretrieve_recorded(host, ledger, "unknown", 5)) == []
    assert ledger.retrievals == 2 and ledger.empty_retrievals == 1
    assert sum(e["stage"] == "retrieve" for e in ledger.trace) == 2  # the empty one recorded once
