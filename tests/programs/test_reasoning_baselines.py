"""The baselines of DeepNote's and HANRAG's tables: IRCoT, Adaptive-RAG, Chain-of-Note, RAT and DeepNote's
ablations, with exact LM-call and retrieval counts for planted reply sequences."""

from __future__ import annotations

from typing import Any

import pytest

from ragsuite import programs
from ragsuite.programs import notes_and_thoughts
from ragsuite.programs.ircot import AdaptiveRAG, IRCoT
from ragsuite.programs.notes_and_thoughts import RAT, ChainOfNote
from ragsuite.programs.stages import join_query
from ragsuite.retrieval.base import Passage
from ragsuite.testing.retrievers import ListRetriever
from ragsuite.testing.scripted import ScriptedLM, ScriptedRequest

# ----------------------------------------------------------------------------- bounds on free text


@pytest.mark.parametrize(
    ("name", "knobs", "entry", "bounds"),
    [
        ("ircot", {"reader": "cot"}, "``NextThought.thought``", {
            "next_thought": {"thought": {"maxLength": 2000}},
            "answer": {"reasoning": {"maxLength": 2000}},
        }),
        ("con", {}, "the notes are at most\n  ``LIST_MAX_ITEMS`` (50)", {
            "reading_notes": {"notes": {"maxItems": 50, "items": {"maxLength": 2000}}},
        }),
        ("rat", {}, "holds the draft to ``LIST_MAX_ITEMS``", {
            "draft": {"thoughts": {"maxItems": 50, "items": {"maxLength": 2000}}},
            "revise": {"revised_step": {"maxLength": 2000}},
        }),
    ],
)  # fmt: skip
def test_the_documented_difference_in_free_text_length_holds(
    name, knobs, entry, bounds, fresh, tmp_path, stage_reply_bounds
) -> None:
    """Each program's docstring lists the bounds a schema-holding LM holds its free text and lists to, and the
    reply schema sent for its stages carries them, also after a save and load; every other output stays
    unbounded."""
    import sys

    import ragsuite
    from ragsuite.signatures.compact import LIST_MAX_ITEMS, TEXT_MAX_CHARS

    assert (LIST_MAX_ITEMS, TEXT_MAX_CHARS) == (50, 2000)
    cls = programs.get(name)
    assert entry in sys.modules[cls.__module__].__doc__

    program = cls(retriever=fresh(), **knobs)
    expected = {stage: bounds.get(stage, {}) for stage, _ in program.named_predictors()}
    assert stage_reply_bounds(program) == expected
    program.save(str(tmp_path / f"{name}.json"))
    loaded = ragsuite.load(str(tmp_path / f"{name}.json"), retriever=fresh())
    assert stage_reply_bounds(loaded) == expected


# ----------------------------------------------------------------------------- IRCoT
def test_ircot_retrieves_with_each_sentence_until_the_answer_is_stated(
    fresh, scripted, run, stage_requests
) -> None:
    # IRCoT: "use the last generated CoT sentence as a query to retrieve more paragraphs ... until the
    # sentence contains 'answer is'".
    thoughts = [
        "Jaws was directed by Steven Spielberg.",
        "Spielberg was born in Cincinnati.",
        "So the answer is: Cincinnati.",
    ]
    retriever = fresh()
    lm = scripted(thought=list(thoughts))
    prediction = run(IRCoT(retriever=retriever), lm)
    # The authors' BM25 query drops wh-words ("Where") from the question and from each sentence.
    assert retriever.queries == ["was the director of Jaws born?", thoughts[0], thoughts[1]]
    assert prediction.stats["lm_calls"] == 3 + 1 and prediction.stats["retrievals"] == 3
    assert prediction.stats["steps"] == 3
    assert prediction.thoughts == thoughts and prediction.answer == "Cincinnati"
    # Each sentence sees every passage collected so far and the sentences before it.
    requests = stage_requests(lm, "thought")
    assert [r.inputs["thoughts"] for r in requests] == [
        "[]",
        f'["{thoughts[0]}"]',
        f'["{thoughts[0]}", "{thoughts[1]}"]',
    ]
    assert requests[2].inputs["passages"].count("[") - 1 == 12
    assert next(e for e in prediction.trace if e["stage"] == "stop")["reason"] == "answer"
    assert len(prediction.passages) == 12


def test_ircot_stops_at_max_steps_without_retrieving_after_the_last_sentence(fresh, run, scripted) -> None:
    retriever = fresh()
    prediction = run(IRCoT(retriever=retriever, max_steps=3), scripted(thought=["a.", "b.", "c.", "d."]))
    assert prediction.stats["lm_calls"] == 3 + 1 and prediction.stats["retrievals"] == 1 + 2
    assert next(e for e in prediction.trace if e["stage"] == "stop")["reason"] == "max_steps"


def test_ircot_caps_the_collected_passages(run, scripted, fresh) -> None:
    prediction = run(
        IRCoT(retriever=fresh(), max_passages=6), scripted(thought=["a.", "b.", "So the answer is x."])
    )
    assert [p.id for p in prediction.passages] == ["p0", "p1", "p2", "p3", "p4", "p5"]
    assert prediction.stats["retrievals"] == 3


def test_ircot_unparsable_sentence_ends_the_reasoning_and_is_recorded(scripted, run, fresh) -> None:
    lm = scripted(thought=["Jaws was directed by Spielberg.", "[[ ## nothing ## ]]"])
    prediction = run(IRCoT(retriever=fresh()), lm)
    assert prediction.stats["fallbacks"] == 1 and prediction.stats["retrievals"] == 2
    assert next(e for e in prediction.trace if e["stage"] == "stop")["reason"] == "no_thought"


def test_ircot_keeps_only_the_first_sentence_of_each_reply(fresh, scripted, run) -> None:
    # The authors keep the first (spaCy) sentence of each completion; the exit test sees only that sentence.
    # A two-sentence reply whose second sentence states the answer does not end the loop: its first
    # sentence is the next query.
    retriever = fresh()
    lm = scripted(
        thought=[
            "Spielberg was born in Cincinnati. So the answer is: Cincinnati.",
            "Answer is Cincinnati.",  # the exit test is case-sensitive and needs " answer is"
            "So the answer is: Cincinnati. It is in Ohio.",
        ]
    )
    prediction = run(IRCoT(retriever=retriever), lm)
    assert prediction.thoughts == [
        "Spielberg was born in Cincinnati.",
        "Answer is Cincinnati.",
        "So the answer is: Cincinnati.",
    ]
    assert retriever.queries == [
        "was the director of Jaws born?",
        "Spielberg was born in Cincinnati.",
        "Answer Cincinnati.",
    ]
    assert prediction.stats["retrievals"] == 3 and prediction.stats["lm_calls"] == 3 + 1
    stop = next(e for e in prediction.trace if e["stage"] == "stop")
    assert stop["reason"] == "answer" and stop["thoughts"] == 3
    assert prediction.answer == "Cincinnati"


def test_ircot_queries_with_the_last_sentence_that_is_not_a_conclusion(fresh, scripted, run) -> None:
    # is_reasoning_sentence: "So ...", "Thus ...", arithmetic steps are never queries.
    retriever = fresh()
    lm = scripted(
        thought=[
            "Jaws was directed by Spielberg.",
            "So Spielberg directed it.",
            "So the answer is: Cincinnati.",
        ]
    )
    run(IRCoT(retriever=retriever), lm)
    assert retriever.queries[1:] == ["Jaws was directed by Spielberg.", "Jaws was directed by Spielberg."]


def test_ircot_keeps_long_passages_and_drops_duplicates_by_id(run, scripted) -> None:
    # Listed difference: the authors skip paragraphs over 600 words and drop fuzzy near-duplicates; ragsuite
    # keeps every passage and drops a passage only when its id was collected already.
    corpus = [Passage("long", "Long", "word " * 700), Passage("a", "A", "x"), Passage("b", "A", "x")]
    retriever = ListRetriever(corpus, lambda query, k: ["long", "a"] if "Jaws" in query else ["a", "b"])
    prediction = run(IRCoT(retriever=retriever, top_k=2), scripted(thought=["Ohio.", "So the answer is: x."]))
    assert [p.id for p in prediction.passages] == ["long", "a", "b"]


def test_ircot_sentence_splitting_and_answer_extraction() -> None:
    from ragsuite.programs.ircot import extract_answer, first_sentence, is_reasoning_sentence

    assert first_sentence("St. Louis is in Missouri. It is big.") == "St. Louis is in Missouri."
    assert first_sentence("J. R. R. Tolkien wrote it in 1937. Yes.") == "J. R. R. Tolkien wrote it in 1937."
    assert first_sentence("It cost 3.5 dollars! Then more.") == "It cost 3.5 dollars!"
    assert first_sentence("no boundary here") == "no boundary here"
    assert extract_answer("Thus the answer is: Cincinnati, Ohio.") == "Cincinnati, Ohio"
    assert extract_answer("Cincinnati.") == "Cincinnati"  # match_all_on_failure
    assert is_reasoning_sentence("Therefore it is 3.") and is_reasoning_sentence("It is 1 + 2 = 3 years.")
    assert not is_reasoning_sentence("Sonia was born in Rome.")


def test_ircot_cot_reader_reads_the_answer_from_its_reasoning(scripted, run, fresh, stage_requests) -> None:
    # The authors' Codex/GPT configurations read with a CoT prompt and extract "answer is: X".
    lm = scripted(
        thought=["So the answer is: Ohio."],
        reasoning="Jaws was directed by Spielberg, born in Cincinnati. So the answer is: Cincinnati.",
    )
    prediction = run(IRCoT(retriever=fresh(), reader="cot"), lm)
    assert prediction.answer == "Cincinnati"
    assert stage_requests(lm, "reasoning")[0].inputs["passages"].count("[") - 1 == 4
    assert prediction.stats["lm_calls"] == 2
    with pytest.raises(Exception, match="reader must be"):
        IRCoT(reader="codex")


# ----------------------------------------------------------------------------- Adaptive-RAG
def test_adaptive_rag_single_step_reads_its_own_number_of_passages(planted_corpus, run, scripted) -> None:
    # The authors' single-step ("oner") runs read 15 passages; the multi-step route keeps top_k per step.
    asked: list[int] = []

    def results(query: str, k: int) -> list[str]:
        asked.append(k)
        return [f"p{j}" for j in range(k)]

    retriever = ListRetriever(planted_corpus, results)
    prediction = run(AdaptiveRAG(retriever=retriever, top_k=4), scripted(complexity="B"))
    assert asked == [15] and len(prediction.passages) == 15
    assert retriever.queries == ["was the director of Jaws born?"]
    asked.clear()
    run(AdaptiveRAG(retriever=retriever, top_k=4, single_k=6), scripted(complexity="B"))
    run(
        AdaptiveRAG(retriever=retriever, top_k=4, single_k=6),
        scripted(complexity="C", thought="So the answer is x."),
    )
    assert asked == [6, 4]
    assert programs.get("adaptive-rag").default_knobs()["single_k"] == 15


@pytest.mark.parametrize(
    ("reply", "route", "lm_calls", "retrievals"),
    [
        ("A", "A", 2, 0),  # no retrieval: classify + answer
        ("B", "B", 2, 1),  # single-step: one retrieval
        ("C", "C", 1 + 2 + 1, 2),  # IRCoT: two sentences, the second states the answer
        ("[[ ## complexity ## ]]\nClass: C.", "C", 1 + 2 + 1, 2),  # a lone letter in prose is read
        ("[[ ## complexity ## ]]\nhard to say", "B", 2, 1),  # unreadable: the single-step fallback
    ],
)
def test_adaptive_rag_routes_by_complexity(
    reply, route, lm_calls, retrievals, scripted, run, fresh, stage_requests
) -> None:
    lm = scripted(complexity=[reply], thought=["Spielberg directed Jaws.", "So the answer is Cincinnati."])
    prediction = run(AdaptiveRAG(retriever=fresh()), lm)
    assert prediction.route == route
    assert prediction.stats["lm_calls"] == lm_calls and prediction.stats["retrievals"] == retrievals
    assert prediction.stats["fallbacks"] == (1 if reply.endswith("hard to say") else 0)
    if route == "A":
        assert stage_requests(lm, "answer")[-1].inputs.keys() == {"question"}


# ----------------------------------------------------------------------------- Chain-of-Note
def test_chain_of_note_answers_from_one_note_per_passage(fresh, scripted, run, stage_requests) -> None:
    retriever = fresh(5)
    notes = [f"passage {i} is irrelevant" for i in range(4)] + [
        "passage 5 says Spielberg was born in Cincinnati"
    ]
    lm = scripted(notes=notes)
    prediction = run(ChainOfNote(retriever=retriever), lm)
    assert prediction.stats["lm_calls"] == 2 and prediction.stats["retrievals"] == 1
    assert stage_requests(lm, "notes")[0].inputs["passages"].count("[") - 1 == 5
    answer_note = stage_requests(lm, "answer")[0].inputs["note"]
    assert "Note 5: passage 5 says Spielberg was born in Cincinnati" in answer_note
    assert prediction.notes == notes


def test_chain_of_note_unparsable_notes_fall_back_to_the_passages(
    scripted, run, fresh, stage_requests
) -> None:
    lm = scripted(notes="[[ ## nothing ## ]]")
    prediction = run(ChainOfNote(retriever=fresh(2), top_k=2), lm)
    assert prediction.stats["fallbacks"] == 1
    assert "T0 | text 0" in stage_requests(lm, "answer")[0].inputs["note"]


# ----------------------------------------------------------------------------- RAT
def test_rat_revises_each_draft_step_with_passages_retrieved_for_it(
    fresh, scripted, run, stage_requests, planted_question
) -> None:
    # RAT: draft a CoT zero-shot, then for each thought retrieve with it and revise it given the revised
    # thoughts before it.
    retriever = fresh(3)
    draft = ["Jaws was directed by George Lucas.", "Lucas was born in Modesto."]
    revised = ["Jaws was directed by Steven Spielberg.", "Spielberg was born in Cincinnati."]
    lm = scripted(thoughts=draft, revised_step=list(revised))
    prediction = run(RAT(retriever=retriever), lm)
    assert retriever.queries == [
        join_query(planted_question, draft[0]),
        join_query(planted_question, draft[1]),
    ]
    assert prediction.stats["lm_calls"] == 1 + 2 + 1 and prediction.stats["retrievals"] == 2
    revisions = stage_requests(lm, "revised_step")
    assert [r.inputs["previous_steps"] for r in revisions] == ["[]", f'["{revised[0]}"]']
    assert "Step 2: Spielberg was born in Cincinnati." in stage_requests(lm, "answer")[0].inputs["note"]
    assert [p.id for p in prediction.passages] == [f"p{i}" for i in range(6)]


def test_rat_caps_the_revised_steps_and_keeps_a_draft_step_it_cannot_revise(scripted, run, fresh) -> None:
    lm = scripted(thoughts=["one one.", "two two.", "three."], revised_step=["[[ ## nothing ## ]]", "TWO."])
    prediction = run(RAT(retriever=fresh(1), top_k=1, max_thoughts=2), lm)
    assert prediction.thoughts == ["one one.", "TWO."]
    assert prediction.stats["retrievals"] == 2 and prediction.stats["fallbacks"] == 1
    assert next(e for e in prediction.trace if e["stage"] == "draft")["dropped"] == ["three."]


def test_rat_revises_at_most_the_authors_three_chunks_and_drops_short_pieces(
    fresh, scripted, run, planted_question, stage_requests
) -> None:
    # The authors split the draft into fewer than 4 paragraphs and keep pieces longer than 5 characters;
    # each kept chunk gets one retrieval and one revision.
    draft = ["## 1", "Jaws was directed by Spielberg.", "", "ok.", "He was born in Ohio."]
    draft += [f"Step number {i} of the draft." for i in range(3, 10)]
    retriever = fresh(1)
    lm = scripted(thoughts=draft, revised_step="revised")
    prediction = run(RAT(retriever=retriever, top_k=1), lm)
    assert retriever.queries == [
        join_query(planted_question, "Jaws was directed by Spielberg."),
        join_query(planted_question, "He was born in Ohio."),
        join_query(planted_question, "Step number 3 of the draft."),
    ]
    assert len(stage_requests(lm, "revised_step")) == 3 and prediction.stats["lm_calls"] == 1 + 3 + 1
    event = next(e for e in prediction.trace if e["stage"] == "draft")
    assert event["too_short"] == ["## 1", "ok."] and len(event["dropped"]) == 6


@pytest.mark.parametrize(
    "thoughts", [[], ["## 1", "ok."], "[[ ## nothing ## ]]"], ids=["empty", "only-short", "unparsable"]
)
def test_rat_without_a_draft_makes_no_step_and_answers_nothing(
    thoughts, fresh, scripted, run, stage_requests
) -> None:
    # The authors' loop runs over the draft's paragraphs: with none it retrieves and revises nothing and
    # the answer stays "".
    retriever = fresh(1)
    lm = scripted(thoughts=thoughts, revised_step="revised")
    prediction = run(RAT(retriever=retriever, top_k=1), lm)
    assert retriever.queries == [] and prediction.answer == "" and prediction.thoughts == []
    assert stage_requests(lm, "revised_step") == [] and stage_requests(lm, "answer") == []
    assert prediction.stats["retrievals"] == 0 and prediction.passages == []
    answer = next(e for e in prediction.trace if e["stage"] == "answer")
    assert answer == {"stage": "answer", "source": "none", "answer": ""}
    documented = " ".join(notes_and_thoughts.__doc__.split())
    assert "An empty or unparsable draft makes no step" in documented
    assert "the notebook revises every paragraph" in documented


# ----------------------------------------------------------------------------- DeepNote's ablations
def test_deepnote_ablation_presets(scripted, run, fresh) -> None:
    # DeepNote Table 2: "w/o Adap. Retrieval" answers from the initial note; "& Init. Note" is vanilla RAG.
    lm = scripted(note="initial note")
    prediction = run(programs.get("deepnote-no-adaptive")(retriever=fresh()), lm)
    assert prediction.stats["lm_calls"] == 2 and prediction.stats["retrievals"] == 1
    lm = ScriptedLM(lambda r: {"answer": "Cincinnati"})
    prediction = run(programs.get("deepnote-no-adaptive-no-note")(retriever=fresh()), lm)
    assert prediction.stats["lm_calls"] == 1 and prediction.stats["retrievals"] == 1
    assert len(prediction.passages) == 5


# ----------------------------------------------------------------------------- ReAct
def react_lm(turns, answer="Cincinnati"):
    """Turns are (tool, args) pairs or a raw malformed reply; then the extraction answers."""
    replies = iter(turns)

    def respond(request):
        if "next_tool_name" in request.output_fields:
            turn = next(replies)
            if isinstance(turn, str):
                return turn
            tool, args = turn
            reply = {"next_thought": f"use {tool}", "next_tool_name": tool, "next_tool_args": args}
            return {k: v for k, v in reply.items() if k in request.output_fields}
        return {"answer": answer}

    return ScriptedLM(respond)


def test_react_searches_until_finish_and_answers_from_the_trajectory(fresh, run) -> None:
    # ReAct: thought -> action (search[query] / finish) -> observation, repeated; DSPy extracts the answer.
    from ragsuite.programs.react import ReActRAG

    retriever = fresh(3)
    lm = react_lm(
        [
            ("search", {"query": "Jaws director"}),
            ("search", {"query": "Spielberg birthplace"}),
            ("finish", {}),
        ]
    )
    prediction = run(ReActRAG(retriever=retriever), lm)
    assert retriever.queries == ["Jaws director", "Spielberg birthplace"]
    assert prediction.stats["lm_calls"] == 3 + 1 == len(lm.requests)
    assert prediction.stats["retrievals"] == 2 and prediction.stats["steps"] == 2
    assert prediction.answer == "Cincinnati" and [p.id for p in prediction.passages] == [
        f"p{i}" for i in range(6)
    ]
    assert "T4 | text 4" in lm.requests[-1].user  # the extraction sees the observations


def test_react_stops_at_max_iters(run, fresh) -> None:
    from ragsuite.programs.react import ReActRAG

    lm = react_lm([("search", {"query": "a"})] * 2)
    prediction = run(ReActRAG(retriever=fresh(1), max_iters=2), lm)
    assert prediction.stats["lm_calls"] == 2 + 1 and prediction.stats["retrievals"] == 2
    assert ReActRAG.default_knobs()["max_iters"] == 7  # the authors' HotpotQA budget


def test_react_unparsable_turn_gets_the_authors_action_call_and_the_episode_goes_on(fresh, run) -> None:
    # hotpotqa.ipynb: a reply without "Action i:" keeps its first line as the thought and asks the LM for
    # the action alone; the episode continues.
    from ragsuite.programs.react import ReActRAG

    bad = "[[ ## next_thought ## ]]\nSpielberg directed it.\nMore.\n\n[[ ## next_tool_name ## ]]\nteleport"
    retriever = fresh(1)
    lm = react_lm(
        [
            ("search", {"query": "Jaws director"}),
            bad,
            bad,  # DSPy retries a malformed reply once (one LM call)
            ("search", {"query": "Spielberg birthplace"}),  # the action call
            ("finish", {}),
        ]
    )
    prediction = run(ReActRAG(retriever=retriever), lm)
    assert retriever.queries == ["Jaws director", "Spielberg birthplace"]
    assert prediction.stats["lm_calls"] == 3 + 1 + 1 and prediction.stats["fallbacks"] == 1
    assert prediction.trajectory["thought_1"] == "Spielberg directed it."
    act = [r for r in lm.requests if "next_thought" in r.inputs]
    assert len(act) == 1 and act[0].inputs["next_thought"] == "Spielberg directed it."
    assert act[0].output_fields == ["next_tool_name", "next_tool_args"]
    assert prediction.answer == "Cincinnati"
    # An action the LM still cannot give is an invalid action: observed, and the episode goes on.
    lm = react_lm([bad, bad, "nonsense", "nonsense", ("finish", {})])
    prediction = run(ReActRAG(retriever=fresh(1)), lm)
    assert "invalid action" in prediction.trajectory["observation_0"]
    assert prediction.trajectory["tool_name_1"] == "finish"
    assert prediction.stats["lm_calls"] == 2 + 1 + 1 and prediction.stats["fallbacks"] == 1


def test_react_does_not_hide_a_retrieval_failure_from_the_user(planted_corpus, run) -> None:
    from ragsuite.errors import RetrievalError
    from ragsuite.programs.react import ReActRAG

    broken = ListRetriever(planted_corpus, error=ConnectionError("retriever down"))
    lm = react_lm([("search", {"query": "a"}), ("finish", {})])
    with pytest.raises(RetrievalError, match="retriever down"):
        run(ReActRAG(retriever=broken), lm)


# ----------------------------------------------------------------------------- Adaptive Retrieval
@pytest.mark.parametrize(
    ("decision", "retrievals", "lm_calls"), [(False, 0, 2), (True, 1, 2), ("[[ ## x ## ]]", 1, 2)]
)
def test_adaptive_retrieval_retrieves_only_when_the_lm_needs_it(
    decision, retrievals, lm_calls, scripted, run, stage_requests, fresh
):
    # Mallen et al.: retrieve for what the LM does not know (the paper: less popular entities); the
    # self-knowledge decision is ragsuite's stand-in for the popularity threshold.
    from ragsuite.programs.ircot import AdaptiveRetrieval

    lm = scripted(needs_retrieval=decision)
    prediction = run(AdaptiveRetrieval(retriever=fresh(5)), lm)
    assert prediction.stats["retrievals"] == retrievals and prediction.stats["lm_calls"] == lm_calls
    assert prediction.stats["fallbacks"] == (1 if isinstance(decision, str) else 0)
    answer_request = stage_requests(lm, "answer")[0]
    assert ("passages" in answer_request.inputs) == (retrievals == 1)


# ----------------------------------------------------------------------------- FLARE-instruct
def test_flare_instruct_retrieves_when_the_look_ahead_asks_and_regenerates_the_sentence(
    fresh, run, planted_question
):
    # FLARE: retrieve for the input first; look ahead one sentence with the passages in hand; when it asks
    # for a search, retrieve with its query (the new passages replace the old) and write the sentence again.
    from ragsuite.programs.flare import FlareInstruct

    replies = iter(
        [
            {"search_query": "", "sentence": "Jaws is a 1975 film."},
            {"search_query": "director of Jaws birthplace", "sentence": "Its director was born in Ohio."},
            {
                "search_query": "Spielberg birthplace",  # ignored: no second search for one sentence
                "sentence": "Spielberg was born in Cincinnati.",
            },  # regenerated with passages
            {"search_query": "", "sentence": "So the answer is: Cincinnati."},
        ]
    )
    seen = []

    def respond(request):
        if "sentence" in request.output_fields:
            seen.append(request.inputs["passages"])
            return next(replies)
        return {"answer": "Cincinnati"}

    retriever = fresh(3)
    lm = ScriptedLM(respond)
    prediction = run(FlareInstruct(retriever=retriever), lm)
    assert retriever.queries == [planted_question, "director of Jaws birthplace"]
    # Calls per sentence: one, and one more for the sentence that searched (sentence 2); then the reader.
    assert len(seen) == 4 and prediction.stats["lm_calls"] == 4 + 1
    sentences = [e for e in prediction.trace if e["stage"] == "sentence"]
    assert [e["query"] for e in sentences] == ["", "director of Jaws birthplace", ""]
    assert prediction.stats["retrievals"] == 2
    assert (
        prediction.generated
        == "Jaws is a 1975 film. Spielberg was born in Cincinnati. So the answer is: Cincinnati."
    )
    # The question's passages are in hand from the first sentence; the search's replace them and stay in
    # hand for the sentences after it.
    assert "T0 | text 0" in seen[0] and "T0 | text 0" in seen[1]
    assert all("T3 | text 3" in s and "T0 | text 0" not in s for s in seen[2:])
    assert prediction.answer == "Cincinnati"
    assert [p.id for p in prediction.passages] == ["p0", "p1", "p2", "p3", "p4", "p5"]


# ----------------------------------------------------------------------------- Self-RAG, prompted
def _critiquing_lm(critiques: dict[str, Any]) -> ScriptedLM:
    """Prompted Self-RAG's LM: it always retrieves, critiques the candidate of the passage holding a key of
    ``critiques`` with its value, and answers "Spielberg" from a note naming him ("?" otherwise)."""

    def respond(request: ScriptedRequest) -> dict[str, Any] | str:
        if "needs_retrieval" in request.output_fields:
            return {"needs_retrieval": True}
        if "supported" in request.output_fields:
            return next(v for k, v in critiques.items() if k in request.inputs["passage"])
        return {"answer": "Spielberg" if "Spielberg" in request.inputs.get("note", "") else "?"}

    return ScriptedLM(respond)


def test_self_rag_prompted_keeps_the_best_critiqued_candidate(run, fresh):
    # Self-RAG: a candidate per passage, ranked by w_rel*IsREL + w_sup*IsSUP + w_use*IsUSE (1.0, 1.0, 0.5),
    # IsUSE 1-5 on the authors' -1..1 scale.
    from ragsuite.programs.self_rag import SelfRAGPrompted

    critiques = {
        "text 0": {"answer": "Lucas", "relevant": True, "supported": "partially", "usefulness": 5},  # 2.0
        "text 1": {"answer": "Spielberg", "relevant": True, "supported": "fully", "usefulness": 4},  # 2.25
        "text 2": {"answer": "Jaws", "relevant": False, "supported": "fully", "usefulness": 5},  # 1.5
    }

    lm = _critiquing_lm(critiques)
    prediction = run(SelfRAGPrompted(retriever=fresh(3), top_k=3), lm)
    assert prediction.answer == "Spielberg" and [p.id for p in prediction.passages] == ["p1"]
    assert prediction.stats["lm_calls"] == 1 + 3 + 1 and prediction.stats["retrievals"] == 1
    scores = [e["score"] for e in prediction.trace if e["stage"] == "critique"]
    assert scores == [2.0, 2.25, 1.5]
    # Other weights, another choice: usefulness alone picks the first.
    lm = _critiquing_lm(critiques)
    alone = run(SelfRAGPrompted(retriever=fresh(3), top_k=3, w_rel=0, w_sup=0, w_use=1), lm)
    assert [p.id for p in alone.passages] == ["p0"]


def test_self_rag_prompted_rates_usefulness_on_the_authors_minus_one_to_one_scale(run, fresh):
    # [Utility:1..5] count -1, -0.5, 0, 0.5, 1. A relevant, partly supported but useless candidate (1.5 - 0.5)
    # loses to an irrelevant, fully supported, useful one (1.0 + 0.25); on a 0..1 scale it would win.
    from ragsuite.programs.self_rag import SelfRAGPrompted

    critiques = {
        "text 0": {"answer": "Lucas", "relevant": True, "supported": "partially", "usefulness": 1},
        "text 1": {"answer": "Spielberg", "relevant": False, "supported": "fully", "usefulness": 4},
        "text 2": "[[ ## nothing ## ]]",  # unparsable: no critique, every score 0
    }

    prediction = run(SelfRAGPrompted(retriever=fresh(3), top_k=3), _critiquing_lm(critiques))
    scores = [e["score"] for e in prediction.trace if e["stage"] == "critique" and "score" in e]
    assert scores == [1.0, 1.25, 0.0]
    assert prediction.answer == "Spielberg" and [p.id for p in prediction.passages] == ["p1"]


def test_self_rag_prompted_answers_directly_when_retrieval_is_not_needed(scripted, run, fresh):
    from ragsuite.programs.self_rag import SelfRAGPrompted

    lm = scripted(needs_retrieval=False)
    prediction = run(SelfRAGPrompted(retriever=fresh(3)), lm)
    assert prediction.stats["retrievals"] == 0 and prediction.stats["lm_calls"] == 2
