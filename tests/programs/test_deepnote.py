"""DeepNote / Adaptive-Note control flow with a scripted LM and in-memory retrievers: stop conditions with
exact LM-call and retrieval counts, the paper's case study replayed, answer styles, and robustness."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import dspy
import pytest

from ragsuite import programs
from ragsuite.errors import ConfigError, RetrievalError
from ragsuite.programs.base import MAX_QUESTION_CHARS
from ragsuite.programs.deepnote import AdaptiveNote, DeepNote, retrieval_text
from ragsuite.retrieval.base import Passage
from ragsuite.signatures.deepnote import NOTE_MAX_CHARS
from ragsuite.testing.retrievers import ListRetriever
from ragsuite.testing.scripted import ScriptedLM, ScriptedRequest

QUESTION = "Where was the place of death of Anna Of Pomerania's father?"


class Script:
    """A scripted LM for the note stages: each stage pops its next reply from a queue (or repeats a default).

    A reply may be a value, a callable of the request, or ``Raw`` (malformed output). DSPy retries a reply it
    cannot parse once with its JSON adapter; the retry gets the same malformed text without using up a reply.
    """

    def __init__(
        self,
        *,
        note: Any = "initial note",
        queries: list[Any] | None = None,
        updates: list[Any] | None = None,
        verdicts: list[Any] | None = None,
        answer: Any = "Stettin",
    ) -> None:
        self.queues: dict[str, Any] = {
            "note": note,
            "queries": iter(queries) if queries is not None else None,
            "updated_note": iter(updates) if updates is not None else None,
            "better": iter(verdicts) if verdicts is not None else None,
            "answer": answer,
        }
        self.counters = {field: itertools.count(1) for field in self.queues}
        self.retrying: dict[str, Raw] = {}
        self.calls: list[str] = []
        self.requests: dict[str, list[ScriptedRequest]] = {}
        self.lm = ScriptedLM(self)

    def _default(self, field: str) -> Any:
        n = next(self.counters[field])
        return {
            "queries": [f"query {n}a", f"query {n}b"],
            "updated_note": f"updated note {n}",
            "better": True,
        }[field]

    def __call__(self, request: ScriptedRequest) -> dict[str, Any] | str:
        field = next(
            f for f in ("queries", "updated_note", "better", "note", "answer") if request.asks_for(f)
        )
        if field in self.retrying:
            return self.retrying.pop(field).text
        self.calls.append(field)
        self.requests.setdefault(field, []).append(request)
        source = self.queues[field]
        if hasattr(source, "__next__"):
            value = next(source)
        elif source is None:
            value = self._default(field)
        else:
            value = source
        if callable(value) and not isinstance(value, Raw):
            value = value(request)
        if isinstance(value, Raw):
            self.retrying[field] = value
            return value.text
        return {field: value}


class Raw:
    """A malformed LM reply, sent back verbatim."""

    def __init__(self, text: str = "I cannot answer in that format.") -> None:
        self.text = text


def fresh_passages(n_blocks: int = 10, k: int = 5) -> tuple[list[Passage], Callable[[str, int], list[str]]]:
    """A corpus and a retrieval function returning ``k`` never-seen passages on every call."""
    corpus = [Passage(f"p{i}", f"Title {i}", f"text {i}") for i in range(n_blocks * k)]
    blocks = iter(range(n_blocks))

    def results(query: str, top_k: int) -> list[str]:
        b = next(blocks)
        return [f"p{b * k + j}" for j in range(top_k)]

    return corpus, results


def run(program: DeepNote, script: Script, question: str = QUESTION) -> dspy.Prediction:
    with dspy.context(lm=script.lm):
        return program(question=question)


def steps(prediction: dspy.Prediction) -> list[dict[str, Any]]:
    return [e for e in prediction.trace if e["stage"] == "step"]


def stop(prediction: dspy.Prediction) -> dict[str, Any]:
    return next(e for e in prediction.trace if e["stage"] == "stop")


# ----------------------------------------------------------------------------- registry and knobs
def test_registered_with_paper_defaults() -> None:
    assert programs.get("deepnote") is DeepNote
    assert programs.get("adaptive-note") is AdaptiveNote
    assert DeepNote.default_knobs() == {
        "top_k": 5,
        "max_step": 3,
        "max_failure": 2,
        "max_passages": 15,
        "dedupe_queries": False,
        "decisions": "generate",
        "compare_threshold": 0.5,
    }
    assert AdaptiveNote.default_knobs() == {
        "top_k": 5,
        "max_step": 3,
        "max_failure": 1,
        "max_passages": 15,
        "dedupe_queries": False,
        "decisions": "generate",
        "compare_threshold": 0.5,
    }
    program = DeepNote(retriever=ListRetriever([]), top_k=7, max_step=4, max_failure=3, max_passages=20)
    assert program.knobs() == {
        "top_k": 7,
        "max_step": 4,
        "max_failure": 3,
        "max_passages": 20,
        "dedupe_queries": False,
        "decisions": "generate",
        "compare_threshold": 0.5,
    }
    stages = {name.split(".")[0] for name, _ in program.named_predictors()}
    assert stages == {"note_init", "query_refine", "note_update", "note_compare", "answer"}


@pytest.mark.parametrize(
    "knobs",
    [
        {"top_k": 0},
        {"max_step": -1},
        {"max_failure": 0},
        {"max_passages": 0},
        {"top_k": 2.5},
        {"top_k": True},
    ],
)
def test_invalid_knobs_are_refused(knobs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        DeepNote(retriever=ListRetriever([]), **knobs)


def test_search_space_respects_failure_below_step() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(30):
        trial = study.ask()
        knobs = DeepNote.search_space(trial)
        assert knobs["top_k"] in (3, 5, 7)
        assert 1 <= knobs["max_step"] <= 5
        assert 1 <= knobs["max_failure"] <= knobs["max_step"]
        assert 10 <= knobs["max_passages"] <= 30
        DeepNote(retriever=ListRetriever([]), **knobs)  # every sampled point is a valid program
        study.tell(trial, 0.0)
    assert AdaptiveNote.search_space(optuna.trial.FixedTrial(dict(knobs))) == knobs


# ----------------------------------------------------------------------------- stop conditions
def test_stops_at_max_step_with_exact_counts() -> None:
    corpus, results = fresh_passages()
    retriever = ListRetriever(corpus, results)
    script = Script()
    prediction = run(DeepNote(retriever=retriever, max_passages=100), script)

    # init + 3 x (refine, update, compare) + answer
    assert prediction.stats["lm_calls"] == 11 == len(script.lm.requests)
    assert prediction.stats["retrievals"] == 4 == len(retriever.queries)
    assert prediction.stats["steps"] == 3
    assert prediction.stats["unique_passages"] == 20
    assert script.calls == ["note"] + ["queries", "updated_note", "better"] * 3 + ["answer"]
    assert stop(prediction)["reason"] == "max_step"
    # One retrieval per step, for the new queries joined with the question.
    assert retriever.queries[0] == QUESTION
    assert retriever.queries[1] == f"query 1a\nquery 1b\n{QUESTION}"
    assert [e["accepted"] for e in steps(prediction)] == [True, True, True]
    # The answer reads the last accepted note.
    assert script.requests["answer"][0].inputs["note"] == "updated note 3"
    assert prediction.note == "updated note 3"


def test_max_failure_counts_failures_cumulatively_not_consecutively() -> None:
    corpus, results = fresh_passages()
    retriever = ListRetriever(corpus, results)
    updates = ["rejected A", "accepted B", "rejected C", "never"]
    script = Script(updates=updates, verdicts=[False, True, False, True])
    prediction = run(DeepNote(retriever=retriever, max_step=5, max_failure=2, max_passages=100), script)

    assert [e["accepted"] for e in steps(prediction)] == [False, True, False]
    assert [e["failures"] for e in steps(prediction)] == [1, 1, 2]
    assert stop(prediction)["reason"] == "max_failure"
    assert prediction.stats["steps"] == 3
    assert prediction.stats["lm_calls"] == 1 + 3 * 3 + 1
    assert prediction.stats["retrievals"] == 4
    # A rejected update never becomes the best note; the accepted one does and is what later stages see.
    refine_notes = [r.inputs["best_note"] for r in script.requests["queries"]]
    assert refine_notes == ["initial note", "initial note", "accepted B"]
    compare_inputs = [(r.inputs["best_note"], r.inputs["updated_note"]) for r in script.requests["better"]]
    assert compare_inputs == [
        ("initial note", "rejected A"),
        ("initial note", "accepted B"),
        ("accepted B", "rejected C"),
    ]
    assert script.requests["answer"][0].inputs["note"] == "accepted B"


def test_adaptive_note_stops_at_the_first_failure() -> None:
    corpus, results = fresh_passages()
    retriever = ListRetriever(corpus, results)
    script = Script(verdicts=[True, False])
    prediction = run(AdaptiveNote(retriever=retriever), script)
    assert [e["accepted"] for e in steps(prediction)] == [True, False]
    assert stop(prediction)["reason"] == "max_failure"
    assert prediction.stats["lm_calls"] == 1 + 2 * 3 + 1
    assert prediction.stats["retrievals"] == 3


def test_passage_cap_is_checked_before_each_step() -> None:
    corpus, results = fresh_passages()
    retriever = ListRetriever(corpus, results)
    # 5 initial passages already exceed a cap of 4: no step at all.
    prediction = run(DeepNote(retriever=retriever, max_passages=4), Script())
    assert stop(prediction)["reason"] == "max_passages"
    assert prediction.stats["steps"] == 0
    assert prediction.stats["retrievals"] == 1
    assert prediction.stats["lm_calls"] == 2  # init + answer


def test_passage_cap_trims_the_overflowing_step_like_the_official_code() -> None:
    corpus, results = fresh_passages()
    retriever = ListRetriever(corpus, results)
    script = Script()
    prediction = run(DeepNote(retriever=retriever, max_step=5, max_passages=8), script)
    events = steps(prediction)
    # 5 noted; step 1 would overflow 8 -> only 3 new passages kept; 8 is not more than 8, so step 2 runs with
    # its full retrieval (13 noted); the check before step 3 stops the loop.
    assert [len(e["passage_ids"]) for e in events] == [3, 5]
    assert events[0]["retrieved_ids"] == ["p5", "p6", "p7", "p8", "p9"]
    assert events[0]["passage_ids"] == ["p5", "p6", "p7"]
    assert stop(prediction)["reason"] == "max_passages"
    assert stop(prediction)["noted_passages"] == 13
    assert prediction.stats["steps"] == 2
    assert prediction.stats["retrievals"] == 3
    assert prediction.stats["lm_calls"] == 1 + 2 * 3 + 1
    assert len(script.requests["updated_note"][0].inputs["passages"].split("[")) - 1 >= 3
    assert [p.id for p in prediction.passages][:8] == [f"p{i}" for i in range(8)]


def test_passage_cap_counts_distinct_passages() -> None:
    corpus = [Passage(f"p{i}", "", f"text {i}") for i in range(6)]
    # Every retrieval returns the same passages: the cap (5 < 6 distinct) is never exceeded.
    retriever = ListRetriever(corpus, default=["p0", "p1", "p2", "p3", "p4"])
    prediction = run(DeepNote(retriever=retriever, max_passages=5), Script())
    assert stop(prediction)["reason"] == "max_step"
    assert prediction.stats["unique_passages"] == 5
    assert prediction.stats["steps"] == 3


def test_max_step_zero_answers_from_the_initial_note() -> None:
    corpus, results = fresh_passages()
    script = Script()
    prediction = run(DeepNote(retriever=ListRetriever(corpus, results), max_step=0), script)
    assert script.calls == ["note", "answer"]
    assert prediction.stats["retrievals"] == 1 and prediction.stats["steps"] == 0
    assert script.requests["answer"][0].inputs["note"] == "initial note"


def test_refined_queries_are_retrieved_as_generated_like_the_official_code() -> None:
    # Official loop: the step retrieves with the new queries the LM wrote, repeats included; only the
    # prompt (the list of asked questions) discourages repeats.
    corpus, results = fresh_passages()
    retriever = ListRetriever(corpus, results)
    script = Script(
        queries=[["Who was her father?", "Anna father"], ["who was her  FATHER?", "Bogislaw XIII death"]]
    )
    prediction = run(DeepNote(retriever=retriever, max_step=2), script)
    asked = [r.inputs["asked_queries"] for r in script.requests["queries"]]
    assert asked == ["[]", '["Who was her father?", "Anna father"]']
    second = steps(prediction)[1]
    assert second["queries"] == ["who was her  FATHER?", "Bogislaw XIII death"]
    assert second["repeated_queries"] == []
    assert retriever.queries[2] == f"who was her  FATHER?\nBogislaw XIII death\n{QUESTION}"


def test_dedupe_queries_option_drops_repeats() -> None:
    corpus, results = fresh_passages()
    retriever = ListRetriever(corpus, results)
    script = Script(
        queries=[["Who was her father?", "Anna father"], ["who was her  FATHER?", "Bogislaw XIII death"]]
    )
    prediction = run(DeepNote(retriever=retriever, max_step=2, dedupe_queries=True), script)
    second = steps(prediction)[1]
    assert second["queries"] == ["Bogislaw XIII death"]
    assert second["repeated_queries"] == ["who was her  FATHER?"]
    assert retriever.queries[2] == f"Bogislaw XIII death\n{QUESTION}"


def test_query_refine_asks_for_two_new_questions() -> None:
    # Official prompt: the refinement stage asks the LM for two new questions, not keyword queries.
    corpus, results = fresh_passages()
    script = Script()
    run(DeepNote(retriever=ListRetriever(corpus, results), max_step=1), script)
    request = script.requests["queries"][0]
    assert "two new questions" in request.instructions
    assert "search queries" not in request.system


def test_adaptive_note_stops_when_the_cap_is_reached() -> None:
    # Adaptive-Note official src/main.py stops on ``>= max_top_k`` (paper: stop when RP >= T_RP); DeepNote
    # continues until the noted passages exceed the cap.
    corpus, results = fresh_passages()
    adaptive = run(
        AdaptiveNote(retriever=ListRetriever(corpus, results), max_step=5, max_failure=5, max_passages=8),
        Script(),
    )
    assert [len(e["passage_ids"]) for e in steps(adaptive)] == [3]  # 5 + 3 = 8 reaches the cap
    assert stop(adaptive)["reason"] == "max_passages" and stop(adaptive)["noted_passages"] == 8
    assert adaptive.stats["lm_calls"] == 1 + 1 * 3 + 1
    corpus, results = fresh_passages()
    deep = run(
        DeepNote(retriever=ListRetriever(corpus, results), max_step=5, max_failure=5, max_passages=8),
        Script(),
    )
    assert [len(e["passage_ids"]) for e in steps(deep)] == [3, 5]


def test_adaptive_note_with_initial_passages_at_the_cap_takes_no_step() -> None:
    corpus = [Passage(f"p{i}", "", f"text {i}") for i in range(6)]
    retriever = ListRetriever(corpus, default=["p0", "p1", "p2", "p3", "p4"])
    prediction = run(AdaptiveNote(retriever=retriever, max_passages=5), Script())
    assert stop(prediction)["reason"] == "max_passages"
    assert prediction.stats["steps"] == 0 and prediction.stats["lm_calls"] == 2


def test_passages_are_the_best_notes_evidence_and_rejected_ones_are_reported_apart() -> None:
    corpus, results = fresh_passages()
    script = Script(verdicts=[True, False, True])
    prediction = run(
        DeepNote(retriever=ListRetriever(corpus, results), max_failure=2, max_passages=100), script
    )
    assert [e["accepted"] for e in steps(prediction)] == [True, False, True]
    # initial p0-p4, accepted step 1 p5-p9, rejected step 2 p10-p14, accepted step 3 p15-p19
    assert [p.id for p in prediction.passages] == [f"p{i}" for i in [*range(10), *range(15, 20)]]
    assert [p.id for p in prediction.retrieved_passages] == [f"p{i}" for i in range(20)]


def test_retrieval_text_is_truncated_to_500_characters() -> None:
    long_query = "x" * 600
    assert retrieval_text([long_query], "q") == long_query[:500]
    assert retrieval_text(["a", "b"], "q") == "a\nb\nq"
    corpus, results = fresh_passages()
    retriever = ListRetriever(corpus, results)
    run(DeepNote(retriever=retriever, max_step=1), Script(queries=[[long_query, "other"]]))
    assert retriever.queries[1] == long_query[:500]


# ----------------------------------------------------------------------------- the paper's case study
CASE_CORPUS = [
    Passage(
        "film",
        "The Sins of the Father (film)",
        "The Sins of the Father is a 1928 British silent adventure film.",
    ),
    Passage(
        "sins", "Sins of the father", "The concept that children are punished for the sins of their father."
    ),
    Passage("birth", "Place of birth", "The place of birth is the place where a person was born."),
    Passage(
        "origin", "Place of origin", "In Swiss law, the place of origin denotes where a person is a citizen."
    ),
    Passage(
        "sophie",
        "Sophie of Pomerania, Duchess of Pomerania",
        "Sophie was the daughter of Bogislaw IX, Duke of Pomerania, who died in 1446.",
    ),
    Passage(
        "anna",
        "Anna of Pomerania",
        "Anna of Pomerania was the daughter of Bogislaw XIII, Duke of Pomerania, and Clara of Brunswick.",
    ),
    Passage(
        "bogislaw",
        "Bogislaw XIII, Duke of Pomerania",
        "Bogislaw XIII died on 7 March 1606 in Stettin (Szczecin). He was a prince of Stettin and Wolgast "
        "and a member of the Griffins.",
    ),
]
CASE_QUERIES = [
    [
        "Who was Anna Of Pomerania's father?",
        "What is known about the life and death of Anna Of Pomerania's father?",
    ],
    [
        "What is the name of Anna Of Pomerania's father and where did he die?",
        "Who was the parent of Anna Of Pomerania and what was his place of death?",
    ],
    [
        "What is known about the death of Bogislaw XIII, Duke of Pomerania?",
        "Where did Bogislaw XIII, Duke of Pomerania, die?",
    ],
]
CASE_NOTES = [
    "The documents contain no information about Anna of Pomerania's father or his place of death; they "
    "discuss a British silent adventure film, the sins of the father, and places of birth and origin.",
    "No information about Anna of Pomerania's father. Sophie of Pomerania's father was Bogislaw IX, Duke "
    "of Pomerania, who died in 1446; this is not related to Anna of Pomerania.",
    'From "Anna of Pomerania": Anna of Pomerania\'s father was Bogislaw XIII, Duke of Pomerania. The '
    "document does not mention his place of death.",
    'From "Bogislaw XIII, Duke of Pomerania": Anna of Pomerania\'s father was Bogislaw XIII, Duke of '
    "Pomerania. Bogislaw XIII died on 7 March 1606 in Stettin (also known as Szczecin).",
]


def test_case_study_anna_of_pomerania() -> None:
    """DeepNote appendix E (Table 19): a useless initial note, a rejected update, an accepted update that
    finds the father, a final accepted update that finds where he died, and the answer "Stettin"."""
    q = QUESTION
    retriever = ListRetriever(
        CASE_CORPUS,
        {
            q: ["film", "sins", "birth", "origin"],
            retrieval_text(CASE_QUERIES[0], q): ["sophie", "sins"],
            retrieval_text(CASE_QUERIES[1], q): ["anna", "sophie"],
            retrieval_text(CASE_QUERIES[2], q): ["bogislaw", "anna"],
        },
    )

    def update(request: ScriptedRequest) -> str:
        # The scripted LM only writes what the passages it was given support.
        passages = request.inputs["passages"]
        if "Stettin" in passages:
            return CASE_NOTES[3]
        if "Bogislaw XIII" in passages:
            return CASE_NOTES[2]
        return CASE_NOTES[1]

    def answer(request: ScriptedRequest) -> str:
        return "Stettin" if "Stettin" in request.inputs["note"] else "No information"

    script = Script(
        note=CASE_NOTES[0],
        queries=CASE_QUERIES,
        updates=[update] * 3,
        verdicts=[False, True, True],
        answer=answer,
    )
    prediction = run(DeepNote(retriever=retriever), script)

    init = next(e for e in prediction.trace if e["stage"] == "note_init")
    assert init["passage_ids"] == ["film", "sins", "birth", "origin"]
    assert "Bogislaw" not in init["note"]
    events = steps(prediction)
    assert [e["queries"] for e in events] == CASE_QUERIES
    assert [e["passage_ids"] for e in events] == [
        ["sophie", "sins"],
        ["anna", "sophie"],
        ["bogislaw", "anna"],
    ]
    assert [e["note"] for e in events] == CASE_NOTES[1:]
    assert [e["accepted"] for e in events] == [False, True, True]
    assert "Bogislaw XIII" in events[1]["note"] and "Stettin" not in events[1]["note"]
    assert "Stettin" in events[2]["note"]
    # The rejected update was never built upon: step 2 refines and updates from the initial note.
    assert script.requests["queries"][1].inputs["best_note"] == CASE_NOTES[0]
    assert script.requests["updated_note"][1].inputs["best_note"] == CASE_NOTES[0]
    assert script.requests["updated_note"][2].inputs["best_note"] == CASE_NOTES[2]
    assert script.requests["queries"][2].inputs["asked_queries"].count("?") == 4
    assert stop(prediction)["reason"] == "max_step"
    assert prediction.answer == "Stettin"
    assert prediction.note == CASE_NOTES[3]
    assert {p.id for p in prediction.passages} == {
        "film",
        "sins",
        "birth",
        "origin",
        "sophie",
        "anna",
        "bogislaw",
    }
    assert prediction.stats == {
        "lm_calls": 11,
        "retrievals": 4,
        "steps": 3,
        "unique_passages": 7,
        "empty_retrievals": 0,
        "fallbacks": 0,
    }
    assert [e["stage"] for e in prediction.trace] == [
        "retrieve",
        "note_init",
        "step",
        "step",
        "step",
        "stop",
        "answer",
    ]


# ----------------------------------------------------------------------------- answer styles
@pytest.mark.parametrize(
    ("task", "reply", "expected", "phrase"),
    [
        ("short", "Stettin", "Stettin", "answer only"),
        ("long", "Bogislaw XIII died in Stettin in 1606. He was duke of Pomerania.", None, "journalistic"),
        ("yesno", "yes", "yes", "yes or no"),
    ],
)
def test_answer_styles(task: str, reply: str, expected: str | None, phrase: str) -> None:
    corpus, results = fresh_passages()
    script = Script(answer=reply)
    prediction = run(DeepNote(retriever=ListRetriever(corpus, results), task=task, max_step=1), script)
    assert prediction.answer == (expected or reply)
    request = script.requests["answer"][0]
    assert phrase in request.instructions
    assert set(request.inputs) == {"question", "note"}


def test_yesno_answer_outside_the_literal_falls_back_to_empty() -> None:
    corpus, results = fresh_passages()
    script = Script(answer="perhaps")
    prediction = run(DeepNote(retriever=ListRetriever(corpus, results), task="yesno", max_step=0), script)
    assert prediction.answer == ""
    assert prediction.stats["fallbacks"] == 1
    assert any(e["stage"] == "answer" and "fallback" in e for e in prediction.trace)


# ----------------------------------------------------------------------------- robustness
def test_unparsable_note_compare_is_a_recorded_failure() -> None:
    corpus, results = fresh_passages()
    script = Script(verdicts=[Raw(), Raw(), Raw()])
    prediction = run(DeepNote(retriever=ListRetriever(corpus, results)), script)
    assert [e["accepted"] for e in steps(prediction)] == [False, False]
    assert stop(prediction)["reason"] == "max_failure"
    assert prediction.stats["fallbacks"] == 2
    assert prediction.stats["lm_calls"] == 1 + 2 * 3 + 1
    # DSPy retries a failed ChatAdapter parse once with the JSON adapter before giving up.
    assert len(script.lm.requests) == prediction.stats["lm_calls"] + 2
    fallbacks = [e for e in prediction.trace if e["stage"] == "note_compare"]
    assert len(fallbacks) == 2 and all(e["fallback"] == {"better": False} for e in fallbacks)
    assert prediction.note == "initial note"


def test_unparsable_query_refine_retrieves_for_the_question() -> None:
    corpus, results = fresh_passages()
    retriever = ListRetriever(corpus, results)
    script = Script(queries=[Raw(), ["good query"]])
    prediction = run(DeepNote(retriever=retriever, max_step=2), script)
    first, second = steps(prediction)
    assert first["queries"] == [] and first["retrieval_query"] == QUESTION
    assert retriever.queries[1] == QUESTION
    assert second["queries"] == ["good query"]
    assert any(e["stage"] == "query_refine" and e["fallback"] == {"queries": []} for e in prediction.trace)
    assert prediction.stats["fallbacks"] == 1


def test_unparsable_note_update_fails_the_step_without_comparing() -> None:
    corpus, results = fresh_passages()
    script = Script(updates=[Raw(), "fine"], verdicts=[True])
    prediction = run(DeepNote(retriever=ListRetriever(corpus, results), max_step=2), script)
    assert [e["accepted"] for e in steps(prediction)] == [False, True]
    assert script.calls.count("better") == 1
    assert prediction.stats["lm_calls"] == 1 + 2 + 3 + 1
    assert prediction.note == "fine"


def test_unparsable_note_init_keeps_the_passages_as_the_note() -> None:
    corpus, results = fresh_passages()
    script = Script(note=Raw())
    prediction = run(DeepNote(retriever=ListRetriever(corpus, results), max_step=0), script)
    note = script.requests["answer"][0].inputs["note"]
    assert note.startswith("[1] Title 0 | text 0")
    assert prediction.stats["fallbacks"] == 1


def test_empty_retrieval_still_answers_and_is_recorded() -> None:
    retriever = ListRetriever([], default=[])
    script = Script()
    prediction = run(DeepNote(retriever=retriever), script)
    assert prediction.answer == "Stettin"
    assert prediction.stats["empty_retrievals"] == 4
    assert prediction.stats["retrievals"] == 4
    assert prediction.passages == []
    empties = [e for e in prediction.trace if e["stage"] == "retrieve" and e.get("empty")]
    assert len(empties) == 4
    assert all(e["passage_ids"] == [] for e in steps(prediction))


def test_retriever_failure_propagates_with_the_question() -> None:
    retriever = ListRetriever([], error=ConnectionError("server down"))
    script = Script()
    with pytest.raises(RetrievalError, match="Anna Of Pomerania") as info:
        run(DeepNote(retriever=retriever), script)
    assert "server down" in str(info.value)
    assert script.calls == []


def test_retriever_failure_in_a_later_step_propagates() -> None:
    corpus = [Passage("p0", "", "t")]

    def results(query: str, k: int) -> list[str]:
        if query != QUESTION:
            raise TimeoutError("timed out")
        return ["p0"]

    with pytest.raises(RetrievalError, match="timed out"):
        run(DeepNote(retriever=ListRetriever(corpus, results)), Script())


@pytest.mark.parametrize("question", ["", "   ", "x" * (MAX_QUESTION_CHARS + 1)])
def test_empty_or_huge_question_is_refused(question: str) -> None:
    retriever = ListRetriever([], default=[])
    script = Script()
    with pytest.raises(ConfigError):
        run(DeepNote(retriever=retriever), script, question=question)
    assert retriever.queries == [] and script.calls == []


def test_missing_retriever_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="retriever"):
        run(DeepNote(), Script())


# ----------------------------------------------------------------------------- stage swapping
class KeepOdd:
    """A filter following the stage contract: keeps passages with an odd number, records what it did."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, program: Any, ledger: Any, question: str, passages: list[Passage]) -> list[Passage]:
        self.calls.append([p.id for p in passages])
        kept = [p for p in passages if int(p.id[1:]) % 2 == 1]
        ledger.record("filter", kept=[p.id for p in kept], dropped=[p.id for p in passages if p not in kept])
        return kept


def test_deepnote_with_a_filter_notes_only_kept_passages() -> None:
    corpus, results = fresh_passages()
    keep_odd = KeepOdd()
    script = Script()
    prediction = run(DeepNote(retriever=ListRetriever(corpus, results), max_step=2, filter=keep_odd), script)
    assert keep_odd.calls == [
        [f"p{i}" for i in range(5)],
        [f"p{i}" for i in range(5, 10)],
        [f"p{i}" for i in range(10, 15)],
    ]
    init = next(e for e in prediction.trace if e["stage"] == "note_init")
    assert init["passage_ids"] == ["p1", "p3"]
    assert [e["passage_ids"] for e in steps(prediction)] == [["p5", "p7", "p9"], ["p11", "p13"]]
    assert [p.id for p in prediction.passages] == ["p1", "p3", "p5", "p7", "p9", "p11", "p13"]
    assert script.requests["note"][0].inputs["passages"].count("Title") == 2


def test_deepnote_with_blend_initializes_from_the_merged_retrievals() -> None:
    corpus = [Passage(f"p{i}", "", f"text {i}") for i in range(8)]
    retriever = ListRetriever(
        corpus, {QUESTION: ["p0", "p1"], "external q": ["p1", "p2"], "internal q": ["p3"]}, default=["p7"]
    )
    seen: list[list[str]] = []

    def blend(program: Any, ledger: Any, question: str, passages: list[Passage]) -> list[str]:
        seen.append([p.id for p in passages])
        return ["external q", "internal q"]

    prediction = run(DeepNote(retriever=retriever, max_step=1, blend=blend), Script())
    assert seen == [["p0", "p1"]]
    assert retriever.queries[:3] == [QUESTION, "external q", "internal q"]
    init = next(e for e in prediction.trace if e["stage"] == "note_init")
    assert init["passage_ids"] == ["p0", "p1", "p2", "p3"]
    assert prediction.stats["retrievals"] == 4  # 3 initial + 1 step
    assert prediction.stats["steps"] == 1


def test_deepnote_with_the_library_filter_stage() -> None:
    from ragsuite.programs import stages

    corpus, results = fresh_passages()

    # The scripted filter keeps "[1] Title 0" of the first set and "[3] Title 7" of the second.
    def responder(request: ScriptedRequest) -> dict[str, Any]:
        if request.asks_for("relevant"):
            rendered = request.inputs["passages"]
            return {"relevant": [1] if "Title 0 " in rendered else [3] if "Title 7 " in rendered else []}
        return Script()(request)

    program = DeepNote(
        retriever=ListRetriever(corpus, results), max_step=1, filter=stages.FilterStage(mode="batch")
    )
    assert "filter" in {name.split(".")[0] for name, _ in program.named_predictors()}
    with dspy.context(lm=ScriptedLM(responder)):
        prediction = program(question=QUESTION)
    init = next(e for e in prediction.trace if e["stage"] == "note_init")
    assert init["passage_ids"] == ["p0"]
    assert steps(prediction)[0]["passage_ids"] == ["p7"]
    assert prediction.stats["lm_calls"] == 1 + 1 + 1 + 3 + 1  # filter, init, filter, step, answer


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (
            "[[ ## queries ## ]]\n1. Who was Anna's father?\n2. Where did he die?\n\n[[ ## completed ## ]]",
            None,
        ),
        ('{"queries": "- Who was Anna\'s father?\\n- Where did he die?"}', None),
        ('{"queries": ["Who was Anna\'s father?", "Where did he die?"]}', None),
        ("I would search for her father.", []),
        ("[[ ## answer ## ]]\nStettin", []),
    ],
)
def test_salvage_queries(reply: str, expected: list[str] | None) -> None:
    from ragsuite.programs.deepnote import salvage_queries

    wanted = ["Who was Anna's father?", "Where did he die?"] if expected is None else expected
    assert salvage_queries(reply) == wanted


def test_numbered_query_list_is_read_instead_of_discarded() -> None:
    corpus, results = fresh_passages()
    retriever = ListRetriever(corpus, results)
    numbered = Raw(
        "[[ ## queries ## ]]\n1. Who was Anna's father?\n2. Where did he die?\n\n[[ ## completed ## ]]"
    )
    prediction = run(DeepNote(retriever=retriever, max_step=1), Script(queries=[numbered]))
    step = steps(prediction)[0]
    assert step["queries"] == ["Who was Anna's father?", "Where did he die?"]
    assert step["queries_salvaged"] is True
    assert retriever.queries[1] == f"Who was Anna's father?\nWhere did he die?\n{QUESTION}"
    assert prediction.stats["fallbacks"] == 0


class _WindowedRetriever(ListRetriever):
    """Reads only the first ``query_token_limit`` words of a query, like a ColBERT encoder."""

    query_token_limit = 8

    def __call__(self, query: str, k: int) -> list[Passage]:
        return super().__call__(" ".join(query.split()[: self.query_token_limit]), k)


def test_question_survives_a_retrievers_query_window() -> None:
    # With ColBERT's 32 query tokens, "queries + newline + question" lost the question: different questions
    # retrieved identically. For a windowed retriever the question leads the retrieval text.
    corpus = [Passage(f"p{i}", "", f"text {i}") for i in range(10)]
    queries = ["a long refined question about the father of the duchess", "and another one"]
    seen: list[str] = []

    def results(query: str, k: int) -> list[str]:
        seen.append(query)
        return ["p0"]

    retriever = _WindowedRetriever(corpus, results)
    run(DeepNote(retriever=retriever, max_step=1), Script(queries=[queries]))
    assert seen[1].startswith("Where was the place of death")
    assert retrieval_text(queries, "Q?", token_limit=32) == f"Q?\n{queries[0]}\n{queries[1]}"
    assert retrieval_text(queries, "Q?") == f"{queries[0]}\n{queries[1]}\nQ?"  # official order otherwise


def test_query_token_limits_of_the_retrievers() -> None:
    from ragsuite.retrieval.base import query_token_limit
    from ragsuite.retrieval.colbert.client import ColBERTv2Client
    from ragsuite.retrieval.hybrid import HybridRetriever

    colbert = ColBERTv2Client("http://127.0.0.1:9/api/search")
    plain = ListRetriever([])
    assert query_token_limit(colbert) == 32
    assert query_token_limit(plain) is None
    assert query_token_limit(HybridRetriever([plain, colbert])) == 32
    assert query_token_limit(HybridRetriever([plain])) is None


def test_the_documented_difference_in_query_refinement_holds() -> None:
    """The module docstring lists the bound on refined queries for grammar-holding LMs, and the signature
    holds it."""
    import ragsuite.programs.deepnote as module
    from ragsuite.signatures.compact import reply_bounds
    from ragsuite.signatures.deepnote import QueryRefine

    assert "Differences from the original" in module.__doc__ and "``QueryRefine.queries``" in module.__doc__
    assert reply_bounds(QueryRefine.output_fields["queries"]) == {"maxItems": 2, "items": {"maxLength": 500}}


def test_the_documented_difference_in_note_length_holds() -> None:
    """The module docstring lists the bound on notes for grammar-holding LMs; both note-writing stages hold
    it, and the stage that judges notes writes none."""
    import ragsuite.programs.deepnote as module
    from ragsuite.signatures.compact import reply_bounds
    from ragsuite.signatures.deepnote import NOTE_MAX_CHARS, NoteCompare, NoteInit, NoteUpdate

    assert "``NoteInit.note``" in module.__doc__ and "``NoteUpdate.updated_note``" in module.__doc__
    assert f"({NOTE_MAX_CHARS:,})" in module.__doc__
    assert reply_bounds(NoteInit.output_fields["note"]) == {"maxLength": NOTE_MAX_CHARS}
    assert reply_bounds(NoteUpdate.output_fields["updated_note"]) == {"maxLength": NOTE_MAX_CHARS}
    assert reply_bounds(NoteCompare.output_fields["better"]) == {}


def test_a_trace_with_a_degenerate_step_becomes_no_demo() -> None:
    """A 0.5B model bootstrapped its own demos with a note looping to the 2,000-character bound, a query
    repeating itself and an unchanged note judged better, all on the way to a right yes/no answer."""
    program = DeepNote(retriever=None)
    question = "Are Eve Beglarian and Zach Bogosian both of Armenian descent?"
    note = "Eve Beglarian is an American composer. Zach Bogosian is an American ice hockey player."
    updated = note + " Both are Armenian."
    sound = [
        (program.note_init, {"question": question}, dspy.Prediction(note=note)),
        (program.query_refine, {"asked_queries": ["Who is Eve Beglarian?"]},
         dspy.Prediction(queries=["What is Zach Bogosian's descent?", "What is Eve Beglarian's descent?"])),
        (program.note_update, {"best_note": note}, dspy.Prediction(updated_note=updated)),
        (program.note_compare, {"best_note": note, "updated_note": updated},
         dspy.Prediction(better=True)),
        (program.answer, {"note": note}, dspy.Prediction(answer="yes")),
    ]  # fmt: skip
    assert program.sound_demo_trace(sound)
    looping = "They both have a long history of music. " * 3
    degenerate = {
        "note at the bound": (program.note_init, {}, dspy.Prediction(note="x" * NOTE_MAX_CHARS)),
        "note repeating a sentence": (program.note_update, {}, dspy.Prediction(updated_note=looping)),
        "query asked before": (program.query_refine, {"asked_queries": ["Who is  Eve Beglarian?"]},
                               dspy.Prediction(queries=["who is eve beglarian?"])),
        "the same query twice": (program.query_refine, {}, dspy.Prediction(queries=["Where?", "where?"])),
        "unchanged note judged better": (program.note_compare, {"best_note": note, "updated_note": note},
                                         dspy.Prediction(better=True)),
    }  # fmt: skip
    for name, step in degenerate.items():
        assert not program.sound_demo_trace([*sound, step]), name
    unchanged_not_better = (
        program.note_compare,
        {"best_note": note, "updated_note": note},
        dspy.Prediction(better=False),
    )
    assert program.sound_demo_trace([*sound, unchanged_not_better])
