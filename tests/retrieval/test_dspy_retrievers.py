"""Retrievers from the DSPy world: dspy.ColBERTv2 (against a served index), dspy.Retrieve with a configured
RM, and plain callables returning strings, dicts or Passages, adapted in one place, ids matching the
corpus's."""

from __future__ import annotations

import dspy
import pytest

from ragsuite import programs
from ragsuite.errors import ConfigError, RetrievalError
from ragsuite.retrieval.adapt import CallableRetriever, as_retriever, to_passage
from ragsuite.retrieval.base import Passage, passage_id
from ragsuite.retrieval.bm25 import BM25Retriever
from ragsuite.retrieval.server import RetrieverServer
from ragsuite.testing.retrievers import KeywordRetriever
from ragsuite.testing.scripted import ScriptedLM

CORPUS = [
    Passage(passage_id(t, x), t, x)
    for t, x in [
        ("Jaws (film)", "Jaws is a 1975 thriller film directed by Steven Spielberg."),
        ("Steven Spielberg", "Steven Spielberg was born in Cincinnati, Ohio, in 1946."),
        ("Rush (band)", "Rush was a Canadian rock band formed in Toronto."),
    ]
]
QUESTION = "Who directed the film Jaws?"


def answer_lm() -> ScriptedLM:
    return ScriptedLM(lambda request: {"answer": "Steven Spielberg"})


def test_dspy_colbertv2_against_a_served_index_keeps_corpus_ids() -> None:
    # Before: "'dotdict' object has no attribute 'render'".
    with RetrieverServer(BM25Retriever(CORPUS)) as server:
        colbert = dspy.ColBERTv2(url=server.url)
        program = programs.get("vanilla")(retriever=colbert, top_k=2)
        with dspy.context(lm=answer_lm()):
            prediction = program(question=QUESTION)
    assert prediction.answer == "Steven Spielberg"
    assert prediction.passages[0].id == CORPUS[0].id  # the same id the corpus (and gold ids) use
    assert prediction.passages[0].title == "Jaws (film)" and prediction.passages[0].text == CORPUS[0].text
    assert prediction.stats["retrievals"] == 1 and len(prediction.passages) == 2


def test_dspy_retrieve_uses_the_configured_rm() -> None:
    calls = []

    def rm(query, k, **kwargs):
        calls.append((query, k))
        return [dspy.Prediction(long_text=p.render()) for p in CORPUS[:k]]

    with dspy.context(rm=rm, lm=answer_lm()):
        prediction = programs.get("vanilla")(retriever=dspy.Retrieve(k=3), top_k=2)(question=QUESTION)
    assert calls == [(QUESTION, 2)]
    assert [p.id for p in prediction.passages] == [CORPUS[0].id, CORPUS[1].id]


@pytest.mark.parametrize(
    "items",
    [
        [p.render() for p in CORPUS],  # "title | text" strings
        [{"title": p.title, "text": p.text, "score": 3 - i} for i, p in enumerate(CORPUS)],  # dicts
        [{"contents": p.render()} for p in CORPUS],  # Search-R1 style hits
        list(CORPUS),  # Passages
    ],
)
def test_plain_callables_of_any_item_shape(items) -> None:
    retriever = as_retriever(lambda query, k: items[:k])
    passages = retriever(QUESTION, 2)
    assert [p.id for p in passages] == [CORPUS[0].id, CORPUS[1].id]
    if not isinstance(items[0], Passage):  # a Passage keeps its own score
        assert passages[0].score > passages[1].score
    assert retriever.describe() == {"kind": "callable", "spec": None, "name": "<lambda>"}
    with dspy.context(lm=answer_lm()):
        prediction = programs.get("deepnote")(retriever=lambda q, k: items[:k], max_step=0)(question=QUESTION)
    assert prediction.passages[0].id == CORPUS[0].id


def test_ragsuite_retrievers_pass_through_unchanged() -> None:
    keyword = KeywordRetriever(CORPUS)
    assert as_retriever(keyword) is keyword
    assert programs.get("vanilla")(retriever=keyword).retriever is keyword
    wrapped = as_retriever(lambda q, k: [])
    assert isinstance(wrapped, CallableRetriever) and as_retriever(wrapped) is wrapped


def test_bad_items_and_objects_are_clear_errors() -> None:
    with pytest.raises(RetrievalError, match="type int is not a passage"):
        to_passage(7, rank=0, n=1)
    with pytest.raises(RetrievalError, match="has no text"):
        to_passage({"title": "x"}, rank=0, n=1)
    program = programs.get("vanilla")(retriever=lambda q, k: [object()])
    with dspy.context(lm=answer_lm()), pytest.raises(RetrievalError, match="not a passage"):
        program(question=QUESTION)
    with pytest.raises(ConfigError, match="retriever must be callable"):
        programs.get("vanilla")(retriever="bm25")
