"""The no-retrieval and vanilla baselines with a scripted LM: counts, prompts, answer styles, stage swapping,
robustness."""

from __future__ import annotations

from typing import Any

import dspy
import pytest

from ragsuite.errors import ConfigError, RetrievalError
from ragsuite.programs.base import MAX_QUESTION_CHARS
from ragsuite.programs.baselines import NoRetrieval, VanillaRAG
from ragsuite.programs.pipeline import merge_passages
from ragsuite.retrieval.base import Passage
from ragsuite.testing.retrievers import KeywordRetriever, ListRetriever
from ragsuite.testing.scripted import ScriptedLM, ScriptedRequest

CORPUS = [
    Passage("anna", "Anna of Pomerania", "Anna was the daughter of Bogislaw XIII, Duke of Pomerania."),
    Passage("bogislaw", "Bogislaw XIII", "Bogislaw XIII died in Stettin in 1606."),
    Passage("film", "The Sins of the Father", "A 1928 British silent adventure film."),
    Passage("oder", "Oder", "The Oder flows past Stettin into the Baltic Sea."),
]
QUESTION = "In which city was it that Bogislaw XIII died?"


def scripted(answer: Any = "Stettin") -> tuple[ScriptedLM, list[ScriptedRequest]]:
    seen: list[ScriptedRequest] = []

    def responder(request: ScriptedRequest) -> dict[str, Any] | str:
        seen.append(request)
        return answer if isinstance(answer, str) and answer.startswith("RAW:") else {"answer": answer}

    return ScriptedLM(responder), seen


@pytest.mark.parametrize(
    ("task", "reply", "phrase"),
    [
        ("short", "Stettin", "answer only"),
        ("long", "Bogislaw XIII, Duke of Pomerania, died in Stettin in 1606.", "journalistic"),
        ("yesno", "no", "yes or no"),
    ],
)
def test_no_retrieval_answers_in_the_task_style(task: str, reply: str, phrase: str) -> None:
    lm, seen = scripted(reply)
    program = NoRetrieval(task=task)
    with dspy.context(lm=lm):
        prediction = program(question=QUESTION)
    assert prediction.answer == reply
    assert len(seen) == 1 and phrase in seen[0].instructions and "own knowledge" in seen[0].instructions
    assert set(seen[0].inputs) == {"question"}
    assert prediction.passages == []
    assert prediction.stats == {
        "lm_calls": 1,
        "retrievals": 0,
        "steps": 0,
        "unique_passages": 0,
        "empty_retrievals": 0,
        "fallbacks": 0,
    }
    assert prediction.trace == [{"stage": "answer", "source": "none", "answer": reply}]
    assert NoRetrieval.default_knobs() == {} and program.knobs() == {}


@pytest.mark.parametrize(
    ("task", "reply"), [("short", "Stettin"), ("long", "He died in Stettin."), ("yesno", "yes")]
)
def test_vanilla_retrieves_once_and_answers_from_numbered_passages(task: str, reply: str) -> None:
    retriever = KeywordRetriever(CORPUS)
    lm, seen = scripted(reply)
    with dspy.context(lm=lm):
        prediction = VanillaRAG(retriever=retriever, task=task, top_k=2)(question=QUESTION)
    assert prediction.answer == reply
    assert retriever.queries == [QUESTION]
    assert [p.id for p in prediction.passages] == ["bogislaw", "anna"]
    assert seen[0].inputs["passages"] == (
        '["[1] Bogislaw XIII | Bogislaw XIII died in Stettin in 1606.", '
        '"[2] Anna of Pomerania | Anna was the daughter of Bogislaw XIII, Duke of Pomerania."]'
    )
    assert prediction.stats["lm_calls"] == 1
    assert prediction.stats["retrievals"] == 1
    assert prediction.stats["steps"] == 1
    assert prediction.stats["unique_passages"] == 2
    assert [e["stage"] for e in prediction.trace] == ["retrieve", "answer"]
    assert prediction.trace[0]["passage_ids"] == ["bogislaw", "anna"]


def test_vanilla_knobs_and_search_space() -> None:
    import optuna

    assert VanillaRAG.default_knobs() == {"top_k": 5}
    assert VanillaRAG(retriever=KeywordRetriever(CORPUS), top_k=3).knobs() == {"top_k": 3}
    assert VanillaRAG.search_space(optuna.trial.FixedTrial({"top_k": 7})) == {"top_k": 7}
    for bad in (0, -1, 1.5, True, "5"):
        with pytest.raises(ConfigError):
            VanillaRAG(retriever=KeywordRetriever(CORPUS), top_k=bad)


def test_vanilla_with_empty_retrieval_still_answers() -> None:
    lm, seen = scripted("unknown")
    with dspy.context(lm=lm):
        prediction = VanillaRAG(retriever=KeywordRetriever(CORPUS))(question="zzz qqq")
    assert prediction.answer == "unknown"
    assert prediction.stats["empty_retrievals"] == 1
    assert prediction.passages == []
    assert seen[0].inputs["passages"] == "[]"
    assert prediction.trace[0] == {"stage": "retrieve", "query": "zzz qqq", "passage_ids": [], "empty": True}


def test_unparsable_answer_is_an_empty_recorded_fallback() -> None:
    lm, _ = scripted("RAW: no fields here")
    with dspy.context(lm=lm):
        prediction = VanillaRAG(retriever=KeywordRetriever(CORPUS))(question=QUESTION)
    assert prediction.answer == ""
    assert prediction.stats["fallbacks"] == 1
    assert any(e["stage"] == "answer" and e.get("fallback") == {"answer": ""} for e in prediction.trace)


@pytest.mark.parametrize(("reply", "expected"), [("Yes", "yes"), ("No.", "no"), ("Yes, it was.", "yes")])
def test_yes_no_reply_outside_the_literal_is_salvaged(reply: str, expected: str) -> None:
    lm, seen = scripted(reply)
    with dspy.context(lm=lm):
        prediction = NoRetrieval(task="yesno")(question="Is Stettin on the Oder?")
    assert prediction.answer == expected
    assert prediction.trace[-1]["salvaged"] is True
    assert prediction.stats["lm_calls"] == 1 and prediction.stats["fallbacks"] == 0
    assert len(seen) == 2  # DSPy's JSON-adapter retry came first


def test_yes_no_reply_without_yes_or_no_falls_back_to_empty() -> None:
    lm, _ = scripted("It depends on the season.")
    with dspy.context(lm=lm):
        prediction = NoRetrieval(task="yesno")(question="Is Stettin on the Oder?")
    assert prediction.answer == ""
    assert prediction.stats["fallbacks"] == 1


def test_retriever_failure_propagates_with_the_question() -> None:
    lm, seen = scripted()
    program = VanillaRAG(retriever=ListRetriever(CORPUS, error=OSError("connection refused")))
    with dspy.context(lm=lm), pytest.raises(RetrievalError, match="Bogislaw XIII") as info:
        program(question=QUESTION)
    assert "connection refused" in str(info.value)
    assert seen == []


@pytest.mark.parametrize("program_cls", [NoRetrieval, VanillaRAG])
@pytest.mark.parametrize("question", ["", " \n", "q" * (MAX_QUESTION_CHARS + 1), None])
def test_empty_or_huge_question_is_refused(program_cls: type, question: Any) -> None:
    lm, seen = scripted()
    with dspy.context(lm=lm), pytest.raises(ConfigError):
        program_cls(retriever=KeywordRetriever(CORPUS))(question=question)
    assert seen == []


def test_unknown_task_is_refused() -> None:
    with pytest.raises(ConfigError, match="task"):
        VanillaRAG(retriever=KeywordRetriever(CORPUS), task="essay")


def test_merge_passages_keeps_first_occurrence_order() -> None:
    a, b, c = CORPUS[:3]
    assert merge_passages([[a, b], [b, c], [a]]) == [a, b, c]


def test_vanilla_with_blend_and_filter_is_blendfilter_shaped() -> None:
    """blend adds queries whose retrievals are merged; filter applies to every retrieved set."""
    retriever = ListRetriever(
        CORPUS, {QUESTION: ["film", "bogislaw"], "ext": ["bogislaw", "anna"], "int": ["oder", "film"]}
    )
    filtered: list[list[str]] = []

    def blend(program: Any, ledger: Any, question: str, passages: list[Passage]) -> list[str]:
        assert [p.id for p in passages] == ["film", "bogislaw"]
        return ["ext", "int"]

    def drop_film(program: Any, ledger: Any, question: str, passages: list[Passage]) -> list[Passage]:
        filtered.append([p.id for p in passages])
        return [p for p in passages if p.id != "film"]

    lm, seen = scripted()
    with dspy.context(lm=lm):
        prediction = VanillaRAG(retriever=retriever, filter=drop_film, blend=blend)(question=QUESTION)
    assert retriever.queries == [QUESTION, "ext", "int"]
    assert filtered == [["film", "bogislaw"], ["bogislaw", "anna"], ["oder", "film"]]
    assert [p.id for p in prediction.passages] == ["bogislaw", "anna", "oder"]
    assert prediction.stats["retrievals"] == 3
    assert seen[0].inputs["passages"].count("[") == 4  # the list bracket + 3 numbered passages


def test_vanilla_with_the_library_stages() -> None:
    from ragsuite.programs import stages

    def responder(request: ScriptedRequest) -> dict[str, Any]:
        if request.asks_for("relevant"):
            return {"relevant": [1]}
        if request.asks_for("knowledge"):
            return {"knowledge": "Stettin"}
        return {"answer": "Stettin"}

    retriever = ListRetriever(CORPUS, {QUESTION: ["bogislaw", "film"]}, default=["oder", "anna"])
    program = VanillaRAG(
        retriever=retriever,
        filter=stages.FilterStage(mode="batch"),
        blend=stages.BlendStage(which="internal"),
    )
    with dspy.context(lm=ScriptedLM(responder)):
        prediction = program(question=QUESTION)
    assert len(retriever.queries) == 2 and retriever.queries[1].startswith(QUESTION)
    assert [p.id for p in prediction.passages] == ["bogislaw", "oder"]
    assert prediction.stats["lm_calls"] == 1 + 2 + 1  # blend, filter x 2, answer
    assert prediction.answer == "Stettin"


# ----------------------------------------------------------------------------- every dataset
def generic_responder(request: ScriptedRequest) -> dict[str, Any]:
    """Plausible replies for any note or answer stage, derived from the request's inputs."""
    question = request.inputs.get("question", "")
    if request.asks_for("queries"):
        words = question.split()
        return {"queries": [" ".join(words[:4]), " ".join(words[-4:])]}
    if request.asks_for("better"):
        return {"better": len(request.inputs["updated_note"]) > len(request.inputs["best_note"])}
    if request.asks_for("updated_note"):
        return {"updated_note": request.inputs["best_note"] + " " + request.inputs["passages"][:80]}
    if request.asks_for("note"):
        return {"note": request.inputs["passages"][:200]}
    if "yes or no" in request.instructions:
        return {"answer": "yes"}
    return {"answer": question.split()[-1]}


@pytest.mark.parametrize("name", ["no-retrieval", "vanilla", "deepnote", "adaptive-note"])
def test_every_program_answers_every_datasets_questions(name: str, data_dir: Any) -> None:
    from ragsuite.data.datasets import dataset_names, get_dataset_info, load_corpus, load_dataset
    from ragsuite.programs.deepnote import AdaptiveNote, DeepNote

    classes = {
        "no-retrieval": NoRetrieval,
        "vanilla": VanillaRAG,
        "deepnote": DeepNote,
        "adaptive-note": AdaptiveNote,
    }
    for dataset in dataset_names():
        info = get_dataset_info(dataset)
        corpus = load_corpus(dataset if info.has_corpus else "nq", data_dir)[:300]
        program = classes[name](retriever=KeywordRetriever(corpus), task=info.task)
        for example in load_dataset(dataset, data_dir=data_dir)[:2]:
            with dspy.context(lm=ScriptedLM(generic_responder)):
                prediction = program(question=example.question)
            assert prediction.answer, (dataset, example.question)
            if info.task == "yesno":
                assert prediction.answer == "yes"
            assert set(prediction.stats) >= {"lm_calls", "retrievals", "steps", "unique_passages"}
            assert prediction.stats["fallbacks"] == 0
            assert prediction.trace[-1]["stage"] == "answer"
            if name in ("deepnote", "adaptive-note"):
                assert prediction.stats["steps"] >= 1
