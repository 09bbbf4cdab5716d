"""Answer and note-stage signatures: fields, types, instructions, and a round trip through a scripted LM."""

from __future__ import annotations

import typing

import dspy
import pytest

import ragsuite.signatures as signatures
from ragsuite.errors import ConfigError
from ragsuite.retrieval.base import Passage
from ragsuite.signatures.answer import answer_signature, format_passages
from ragsuite.signatures.deepnote import NoteCompare, NoteInit, NoteUpdate, QueryRefine
from ragsuite.testing.scripted import ScriptedLM

TASKS = ("short", "long", "yesno")
SOURCES = {"note": {"question", "note"}, "passages": {"question", "passages"}, "none": {"question"}}


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("source", list(SOURCES))
def test_answer_signature_table(task: str, source: str) -> None:
    signature = answer_signature(task, source)
    assert set(signature.input_fields) == SOURCES[source]
    assert list(signature.output_fields) == ["answer"]
    annotation = signature.output_fields["answer"].annotation
    if task == "yesno":
        assert typing.get_origin(annotation) is typing.Literal
        assert set(typing.get_args(annotation)) == {"yes", "no"}
        assert "yes or no" in signature.instructions
    else:
        assert annotation is str
    if task == "short":
        assert "answer only" in signature.instructions
    if task == "long":
        assert "journalistic" in signature.instructions
    if source == "passages":
        assert signature.input_fields["passages"].annotation == list[str]
    # Every answer signature is re-exported by the package.
    assert getattr(signatures, signature.__name__) is signature


def test_answer_signatures_are_distinct() -> None:
    assert len({answer_signature(t, s) for t in TASKS for s in SOURCES}) == 9


@pytest.mark.parametrize(("task", "source"), [("essay", "note"), ("short", "web"), ("", "")])
def test_unknown_answer_signature_is_a_config_error(task: str, source: str) -> None:
    with pytest.raises(ConfigError, match="short"):
        answer_signature(task, source)


def test_format_passages() -> None:
    passages = [Passage("a", "Stettin", "A city on the Oder."), Passage("b", "", "Untitled text.")]
    assert format_passages(passages) == ["[1] Stettin | A city on the Oder.", "[2] Untitled text."]
    assert format_passages([]) == []


def test_note_stage_fields_and_types() -> None:
    assert set(NoteInit.input_fields) == {"question", "passages"}
    assert list(NoteInit.output_fields) == ["note"]
    assert set(QueryRefine.input_fields) == {"question", "best_note", "asked_queries"}
    assert QueryRefine.input_fields["asked_queries"].annotation == list[str]
    assert QueryRefine.output_fields["queries"].annotation == list[str]
    assert set(NoteUpdate.input_fields) == {"question", "best_note", "passages"}
    assert list(NoteUpdate.output_fields) == ["updated_note"]
    assert set(NoteCompare.input_fields) == {"question", "best_note", "updated_note"}
    assert NoteCompare.output_fields["better"].annotation is bool
    for signature in (NoteInit, QueryRefine, NoteUpdate, NoteCompare):
        assert getattr(signatures, signature.__name__) is signature


def test_note_stage_instructions_carry_the_papers_rules() -> None:
    refine = QueryRefine.instructions
    assert "two new questions" in refine and "already asked" in refine
    update = NoteUpdate.instructions
    assert "not yet in the note" in update and "direct excerpts" in update
    compare = NoteCompare.instructions.lower()
    for criterion in ("key information", "aspects", "detail", "practicality", "redundant", "not better"):
        assert criterion in compare
    assert "faithful" in NoteInit.instructions


def test_typed_outputs_parse_through_a_scripted_lm() -> None:
    replies = {
        "queries": {"queries": ["Who was Anna of Pomerania's father?", "Where did Bogislaw XIII die?"]},
        "better": {"better": "true"},
        "answer": {"answer": "no"},
    }

    def responder(request):
        field = next(f for f in replies if request.asks_for(f))
        return replies[field]

    with dspy.context(lm=ScriptedLM(responder)):
        queries = dspy.Predict(QueryRefine)(question="q", best_note="n", asked_queries=["old"]).queries
        better = dspy.Predict(NoteCompare)(question="q", best_note="a", updated_note="b").better
        answer = dspy.Predict(answer_signature("yesno", "note"))(question="q", note="n").answer
    assert queries == ["Who was Anna of Pomerania's father?", "Where did Bogislaw XIII die?"]
    assert better is True
    assert answer == "no"
