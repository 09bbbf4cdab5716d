"""BlendFilter: three retrievals, per-set filtering against the question, the union, knobs, robustness."""

from __future__ import annotations

import json

import dspy
import pytest

from ragsuite import programs
from ragsuite.errors import ConfigError, RetrievalError
from ragsuite.programs.blendfilter import BlendFilter
from ragsuite.programs.stages import blend_query
from ragsuite.retrieval.base import Passage
from ragsuite.testing.retrievers import ListRetriever
from ragsuite.testing.scripted import ScriptedLM

QUESTION = "Which band did the singer of Highway Star later join?"
CORPUS = [Passage(pid, pid.title(), f"text about {pid}") for pid in ("a", "b", "c", "d", "e", "f")]
EXTERNAL = "Highway Star is by Deep Purple, sung by Ian Gillan. Black Sabbath"
INTERNAL = "Ian Gillan joined Black Sabbath in 1983."
EXTERNAL_QUERY = blend_query(
    QUESTION, "Highway Star is by Deep Purple, sung by Ian Gillan.", lead="Black Sabbath"
)
INTERNAL_QUERY = blend_query(QUESTION, INTERNAL)
RESULTS = {QUESTION: ["a", "b", "c"], EXTERNAL_QUERY: ["c", "d"], INTERNAL_QUERY: ["e", "a", "f"]}
RELEVANT = {"a", "c", "d", "e"}


def _id(rendered: str) -> str:
    return rendered.split("] ", 1)[-1].split(" |", 1)[0].lower()


def responder(request):
    fields = request.output_fields
    if "knowledge" in fields:
        return {"knowledge": INTERNAL}
    if fields == ["reasoning", "answer"]:
        return {"reasoning": "Highway Star is by Deep Purple, sung by Ian Gillan.", "answer": "Black Sabbath"}
    if "relevant" in fields and "passage" in request.inputs:
        return {"relevant": _id(request.inputs["passage"]) in RELEVANT}
    if "relevant" in fields:
        rendered = json.loads(request.inputs["passages"])
        return {"relevant": [i for i, text in enumerate(rendered, 1) if _id(text) in RELEVANT]}
    return {"answer": "Black Sabbath"}


def run(program, question=QUESTION, reply=responder):
    lm = ScriptedLM(reply)
    with dspy.context(lm=lm):
        return program(question=question), lm


def test_registered_with_paper_defaults() -> None:
    assert programs.get("blendfilter") is BlendFilter
    assert BlendFilter.default_knobs() == {
        "top_k": 5,
        "blend": "both",
        "filter_mode": "batch",
        "decisions": "generate",
        "filter_threshold": 0.5,
    }
    names = {
        name.split(".")[0] for name, _ in BlendFilter(retriever=ListRetriever(CORPUS)).named_predictors()
    }
    assert names == {"blend_external", "blend_internal", "filter", "answer"}


def test_three_retrievals_filtered_separately_then_union() -> None:
    retriever = ListRetriever(CORPUS, RESULTS)
    prediction, lm = run(BlendFilter(retriever=retriever, top_k=5))
    assert retriever.queries[0] == QUESTION
    assert sorted(retriever.queries[1:]) == sorted([EXTERNAL_QUERY, INTERNAL_QUERY])
    external = next(r for r in lm.requests if r.output_fields == ["reasoning", "answer"])
    assert "[1] A | text about a" in external.inputs["passages"]  # CoT over the question's passages
    filters = [r for r in lm.requests if "relevant" in r.output_fields]
    assert len(filters) == 3 and {r.inputs["question"] for r in filters} == {QUESTION}
    stats = prediction.stats
    assert stats["lm_calls"] == 2 + 3 + 1 and stats["retrievals"] == 3 and stats["steps"] == 2
    assert stats["unique_passages"] == 6
    # K_q' = a, c; K_qex' = c, d; K_qin' = e, a  -> union a, c, d, e in that order.
    assert [p.id for p in prediction.passages] == ["a", "c", "d", "e"]
    answer_request = lm.requests[-1]
    assert json.loads(answer_request.inputs["passages"])[3] == "[4] E | text about e"
    kinds = {e["query_kind"]: e["dropped"] for e in prediction.trace if e["stage"] == "filter"}
    assert kinds == {"question": ["b"], "external": [], "internal": ["f"]}
    assert prediction.answer == "Black Sabbath"


def test_per_passage_filter_judges_every_retrieved_passage() -> None:
    prediction, _ = run(BlendFilter(retriever=ListRetriever(CORPUS, RESULTS), filter_mode="per_passage"))
    assert prediction.stats["lm_calls"] == 2 + (3 + 2 + 3) + 1
    assert [p.id for p in prediction.passages] == ["a", "c", "d", "e"]


@pytest.mark.parametrize(
    ("blend", "queries", "lm_calls", "steps"),
    [
        ("external", [QUESTION, EXTERNAL_QUERY], 1 + 2 + 1, 2),
        ("internal", [QUESTION, INTERNAL_QUERY], 1 + 2 + 1, 1),
        ("none", [QUESTION], 0 + 1 + 1, 1),
    ],
)
def test_blend_choice_decides_the_extra_queries(blend, queries, lm_calls, steps) -> None:
    retriever = ListRetriever(CORPUS, RESULTS)
    prediction, _ = run(BlendFilter(retriever=retriever, blend=blend))
    assert retriever.queries == queries
    assert prediction.stats["lm_calls"] == lm_calls and prediction.stats["steps"] == steps


def test_empty_question_retrieval_still_blends_and_answers() -> None:
    retriever = ListRetriever(CORPUS, {EXTERNAL_QUERY: ["d"], INTERNAL_QUERY: ["e"]})
    prediction, _ = run(BlendFilter(retriever=retriever))
    assert prediction.stats["empty_retrievals"] == 1
    assert prediction.stats["lm_calls"] == 2 + 2 + 1  # no filtering call for the empty set
    assert [p.id for p in prediction.passages] == ["d", "e"]


def test_unparsable_filter_keeps_the_set_and_blend_fallback_uses_the_question() -> None:
    def reply(request):
        if "relevant" in request.output_fields or "knowledge" in request.output_fields:
            return "cannot say"
        return responder(request)

    retriever = ListRetriever(CORPUS, RESULTS)
    prediction, _ = run(BlendFilter(retriever=retriever), reply=reply)
    assert retriever.queries.count(QUESTION) == 2  # the internal query fell back to the bare question
    assert sorted(f["stage"] for f in prediction.trace if "fallback" in f) == [
        "blend_internal",
        "filter",
        "filter",
        "filter",
    ]
    assert [p.id for p in prediction.passages] == ["a", "b", "c", "d"]


def test_retriever_failure_names_the_question() -> None:
    retriever = ListRetriever(CORPUS, error=TimeoutError("colbert server timed out"))
    with pytest.raises(RetrievalError, match="Highway Star"):
        run(BlendFilter(retriever=retriever))


@pytest.mark.parametrize(
    "knobs",
    [
        {"top_k": 0},
        {"blend": "all"},
        {"filter_mode": "some"},
        {"decisions": "maybe"},
        {"filter_mode": "per_passage", "decisions": "probability", "filter_threshold": 1.5},
    ],
)
def test_bad_knobs_are_refused(knobs) -> None:
    with pytest.raises(ConfigError):
        BlendFilter(retriever=ListRetriever(CORPUS), **knobs)


def test_search_space_samples_valid_knobs_with_the_threshold_where_the_filter_uses_it() -> None:
    import optuna

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(40):
        knobs = BlendFilter.search_space(study.ask())
        assert set(knobs) <= set(BlendFilter.KNOBS)
        probability = knobs.get("decisions") == "probability"
        assert ("decisions" in knobs) == (knobs["filter_mode"] == "per_passage")
        assert ("filter_threshold" in knobs) == probability
        seen.add((knobs["filter_mode"], knobs.get("decisions")))
        program = BlendFilter(retriever=ListRetriever(CORPUS), **knobs)
        if probability:
            assert program.decision_knobs()["filter_threshold"].read() == knobs["filter_threshold"]
    assert seen == {("batch", None), ("per_passage", "generate"), ("per_passage", "probability")}


@pytest.mark.parametrize(
    "knobs",
    [
        {"decisions": "probability"},
        {"filter_threshold": 0.7},
        {"decisions": "probability", "filter_threshold": 0.3},
    ],
)
def test_batch_filter_refuses_a_threshold_it_cannot_use(knobs) -> None:
    with pytest.raises(ConfigError, match="filter_mode=per_passage"):
        BlendFilter(retriever=ListRetriever(CORPUS), **knobs)


def test_probability_backed_filter_keeps_passages_at_or_above_the_threshold() -> None:
    probability = {"a": 0.9, "b": 0.2, "c": 0.6, "d": 0.45, "e": 0.55, "f": 0.1}

    def reply(request):
        if "relevant" in request.output_fields and "passage" in request.inputs:
            return {"relevant": {"noul": probability[_id(request.inputs["passage"])]}}
        return responder(request)

    kept = {}
    for threshold in (0.5, 0.58):
        program = BlendFilter(
            retriever=ListRetriever(CORPUS, RESULTS),
            filter_mode="per_passage",
            decisions="probability",
            filter_threshold=threshold,
        )
        prediction, _ = run(program, reply=reply)
        kept[threshold] = [p.id for p in prediction.passages]
    assert kept[0.5] == ["a", "c", "e"]
    assert kept[0.58] == ["a", "c"]


LONG_KNOWLEDGE = " ".join(f"Fact {i}: Ian Gillan sang with Deep Purple and Black Sabbath." for i in range(15))


def long_knowledge(request):
    if "knowledge" in request.output_fields:
        return {"knowledge": LONG_KNOWLEDGE}
    if request.output_fields == ["reasoning", "answer"]:
        return {"reasoning": LONG_KNOWLEDGE, "answer": "Black Sabbath"}
    return responder(request)


def test_generated_knowledge_reaches_bm25_uncut() -> None:
    assert len(LONG_KNOWLEDGE) > 900
    retriever = ListRetriever(CORPUS, RESULTS, default=["f"])  # reads whole queries, as BM25 does
    run(BlendFilter(retriever=retriever), reply=long_knowledge)
    external, internal = retriever.queries[1:]
    # Every word of the generated text is searched for (a 500-character cut dropped 40% of it).
    assert external == f"{QUESTION}\nBlack Sabbath\n{LONG_KNOWLEDGE}"
    assert internal == f"{QUESTION}\n{LONG_KNOWLEDGE}"


def test_generated_knowledge_fits_colberts_token_window_after_the_question() -> None:
    retriever = ListRetriever(CORPUS, RESULTS, default=["f"])
    retriever.query_token_limit = 32  # what ColBERTv2 reads of a query
    run(BlendFilter(retriever=retriever), reply=long_knowledge)
    external, internal = retriever.queries[1:]
    for query in (external, internal):
        assert query.startswith(f"{QUESTION}\n") and len(query.split()) == 32
    assert external.split("\n")[1] == "Black Sabbath"  # the generated answer right after the question
    whole = f"{QUESTION}\n{LONG_KNOWLEDGE}"
    assert whole.startswith(internal) and internal.split() == whole.split()[:32]


def test_the_documented_difference_in_free_text_length_holds(tmp_path, stage_reply_bounds) -> None:
    """The module docstring lists the bounds on free text and on the filter's list for grammar-holding LMs;
    every free-text output of BlendFilter's stages holds the text bound in the reply schema sent, and the
    filter's list of numbers the list bound, also after the program is saved and loaded, while the final
    answer is left as it was."""
    import ragsuite
    import ragsuite.programs.blendfilter as module
    from ragsuite.signatures.compact import LIST_MAX_ITEMS, TEXT_MAX_CHARS, reply_bounds

    assert "``bounded_reasoning``" in module.__doc__ and "``BlendQueryInternal.knowledge``" in module.__doc__
    assert f"``TEXT_MAX_CHARS`` ({TEXT_MAX_CHARS:,})" in module.__doc__
    assert f"``LIST_MAX_ITEMS`` ({LIST_MAX_ITEMS})" in module.__doc__

    text = {"maxLength": TEXT_MAX_CHARS}
    bounded_text = {
        "blend_external.external.predict": {"reasoning": text, "answer": text},
        "blend_internal.internal": {"knowledge": text},
        "filter.batch.predict": {"reasoning": text, "relevant": {"maxItems": LIST_MAX_ITEMS}},
        "answer": {},  # the final answer: unbounded
    }
    program = BlendFilter(retriever=ListRetriever(CORPUS))
    assert stage_reply_bounds(program) == bounded_text
    program.save(str(tmp_path / "blendfilter.json"))
    loaded = ragsuite.load(str(tmp_path / "blendfilter.json"), retriever=ListRetriever(CORPUS))
    assert stage_reply_bounds(loaded) == bounded_text
    filter_reasoning = loaded.filter.batch.predict.signature.output_fields["reasoning"]
    assert reply_bounds(filter_reasoning) == {"maxLength": TEXT_MAX_CHARS}
