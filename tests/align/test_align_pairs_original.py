"""DNAlign pairs as the official data script (DeepNote's ``src/gen_dpo_data.py``, ``utils.py``) builds them,
on a planted world served by a local OpenAI-compatible server:

* a judge verdict without a pair (unparsable, a worst out of range) carries the stage's *last* reply forward
  and the question's chain goes on (``LLM_score_init_note`` / ``LLM_score_gen_new_query``'s except branch);
* an unparsable NoteCompare verdict is a negative, not a lost reply;
* answer pairs follow the script's string rules (``LLM_score_rag``) as well as the metric;
* judges see every reply, those that break the stage's format included;
* a reply parsed by DSPy's JSON-adapter retry keeps the prompt it answered, and a pair never mixes it with
  a reply to the stage's own prompt, chosen or rejected;
* the script's budgets: replies up to 1,024 tokens, the judge at temperature 1.0, top_p 0.9, 1,280 tokens.
"""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import dspy
import pytest

from ragsuite.align.builder import (
    MIXED_PROMPTS,
    Built,
    _draw_pair,
    official_answer_labels,
    sample_questions,
    sample_stage,
)
from ragsuite.align.pairs import PreferencePair, Sample
from ragsuite.cli import main
from ragsuite.data.datasets import load_dataset
from ragsuite.testing.openai_server import LocalOpenAIServer
from ragsuite.testing.responders import candidate_number, sampling_tag
from ragsuite.testing.scripted import ScriptedLM, ScriptedRequest

DATASET = "2wikimultihopqa"
N = 4
EXAMPLES = sample_questions(load_dataset(DATASET), N, seed=0)
#: Q_JUDGE_UNPARSABLE: the note judge replies with no numbers. Q_NO_WORST: the query judge names a worst
#: out of range; its answers contain the gold answer without equalling it. Q_LONG: every answer contains the
#: gold answer; a note parses only on DSPy's JSON retry and the judge prefers it; a query set parses only on
#: the retry and the judge names it the worst. Q_BROKEN: some replies break the stage's format.
Q_JUDGE_UNPARSABLE, Q_NO_WORST, Q_LONG, Q_BROKEN = (ex.question for ex in EXAMPLES)
GOLD = {ex.question: ex.answers[0] for ex in EXAMPLES}
BROKEN_NOTE = "BROKEN note written without its field header"
BROKEN_QUERIES = "BROKEN queries: who directed it, when was it released"
JSON_NOTE = "note from the JSON retry"


def is_json_retry(request: ScriptedRequest) -> bool:
    return "Outputs will be a JSON object" in request.system


def planted(request: ScriptedRequest) -> dict | str:
    """The reply values (or raw text) of every stage; the judge's picks and the broken replies planted."""
    fields, question = request.output_fields, request.inputs.get("question", "")
    setting = (request.sampling.get("temperature"), request.sampling.get("top_p"))
    if "best" in fields and "notes" in request.inputs:
        if question == Q_JUDGE_UNPARSABLE:
            return "All of these notes look fine to me."
        notes = request.inputs["notes"]
        worst = BROKEN_NOTE if question == Q_BROKEN else "note t0.9p0.1"
        best = JSON_NOTE if question == Q_LONG else "note t0.5p0.5"
        return {"best": candidate_number(notes, best), "worst": candidate_number(notes, worst)}
    if "best" in fields:
        candidates = request.inputs["candidates"]
        if question == Q_NO_WORST:
            return {"best": 2, "worst": 12}
        best = BROKEN_QUERIES if question == Q_BROKEN else "first query t0.1p0.5"
        return {
            "best": candidate_number(candidates, best),
            "worst": candidate_number(candidates, "first query t0.5p0.9"),
        }
    if "better" in fields:  # better at temperature 0.1; an unreadable verdict for every other update
        return {"better": True} if "updated t0.1" in request.inputs["updated_note"] else "hard to say"
    if "note" in fields:
        if question == Q_BROKEN and setting == (0.9, 0.1):
            return BROKEN_NOTE
        if question == Q_LONG and setting == (0.5, 0.9):
            return {"note": JSON_NOTE} if is_json_retry(request) else "a reply the chat format cannot read"
        return {"note": f"note {sampling_tag(request)}"}
    if "queries" in fields:
        if question == Q_BROKEN and setting == (0.1, 0.5):
            return BROKEN_QUERIES
        if question == Q_LONG and setting == (0.5, 0.9) and not is_json_retry(request):
            return "a reply the chat format cannot read"
        return {"queries": [f"first query {sampling_tag(request)}", f"second query {sampling_tag(request)}"]}
    if "updated_note" in fields:
        return {"updated_note": f"updated {sampling_tag(request)}"}
    if "answer" in fields:
        gold, temperature = GOLD[question], request.sampling["temperature"]
        if question == Q_NO_WORST:  # "Indiana": none equal, one contains it and is short
            return {
                "answer": {0.1: f"{gold}, USA", 0.5: f"It was in the state of {gold}, in the USA"}.get(
                    temperature, f"wrong {sampling_tag(request)}"
                )
            }
        if question == Q_LONG:  # every answer contains the gold one; the long ones are rejected
            long = f"{gold} is where he was born, a seaside town in the south west of England near Bristol"
            return {"answer": {0.1: gold, 0.5: long}.get(temperature, f"{gold}, England")}
        if question == Q_BROKEN and temperature == 0.9:
            return "I do not know."
        return {
            "answer": {0.1: gold, 0.5: f"it is {gold} I think"}.get(
                temperature, f"wrong {sampling_tag(request)}"
            )
        }
    raise AssertionError(f"unexpected request for {fields}")


def responder(request: ScriptedRequest) -> dict | str:
    reply = planted(request)
    # DSPy's JSON-adapter retry asks for a JSON object; planted values are sent that way, raw text as is.
    return json.dumps(reply) if is_json_retry(request) and isinstance(reply, dict) else reply


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, align_build_args) -> dict:
    out = tmp_path_factory.mktemp("align-original") / "dnalign"
    with LocalOpenAIServer(responder) as server:
        code = main(align_build_args(server, out, samples=N, dataset=DATASET))
        requests = server.requests
    lines = (out / "records.jsonl").read_text(encoding="utf-8").splitlines()
    records = {r["question"]: r for r in map(json.loads, lines)}
    return {"code": code, "records": records, "requests": requests}


def pairs(world: dict, question: str, stage: str) -> list[PreferencePair]:
    record = world["records"][question]
    assert record["error"] is None
    return [PreferencePair.from_dict(p) for p in record["pairs"] if p["stage"] == stage]


def test_pairs_per_stage_as_the_official_script_builds_them(world: dict) -> None:
    assert world["code"] == 0
    counts = {
        stage: sum(len(pairs(world, q, stage)) for q in GOLD)
        for stage in ("note_init", "query_refine", "note_update", "answer")
    }
    # Before: note_init 3, query_refine 1 (the unparsable verdict stopped Q_JUDGE_UNPARSABLE's chain),
    # note_update 0 (every negative verdict was unparsable), answer 2 (no rule-labelled pairs).
    # Q_LONG gives no note_init or query_refine pair: each mixed a reply to the JSON retry's prompt with one
    # to the stage's own.
    assert counts == {"note_init": 2, "query_refine": 1, "note_update": 4, "answer": 4}


def test_an_unparsable_judge_carries_the_last_note_forward_and_the_chain_goes_on(world: dict) -> None:
    record = world["records"][Q_JUDGE_UNPARSABLE]
    assert pairs(world, Q_JUDGE_UNPARSABLE, "note_init") == []
    assert record["dropped"]["note_init"] == "judge reply unparsable"
    (refine,) = pairs(world, Q_JUDGE_UNPARSABLE, "query_refine")
    (update,) = pairs(world, Q_JUDGE_UNPARSABLE, "note_update")
    # The official script's except branch: init_notes[-1], the reply sampled at (0.9, 0.9).
    assert "note t0.9p0.9" in refine.prompt[-1]["content"]
    assert "note t0.9p0.9" in update.prompt[-1]["content"]
    assert record["stats"]["retrievals"] == 2


def test_a_worst_out_of_range_carries_the_last_query_set_forward(world: dict) -> None:
    record = world["records"][Q_NO_WORST]
    assert pairs(world, Q_NO_WORST, "query_refine") == []
    assert record["dropped"]["query_refine"] == "judge named no valid worst"
    # The judge's best (set 2) is not used either: the script discards the whole verdict.
    (update,) = pairs(world, Q_NO_WORST, "note_update")
    assert update.label == "note_compare" and record["stats"]["retrievals"] == 2


def test_unparsable_note_compare_verdicts_are_negatives(world: dict) -> None:
    for question in GOLD:
        (update,) = pairs(world, question, "note_update")
        assert update.chosen_setting[0] == 0.1 and "updated t0.1" in update.chosen
        assert update.rejected_setting[0] != 0.1  # a reply whose verdict was unreadable
    compares = [r for r in world["requests"] if "better" in r.output_fields]
    assert compares and all(r.sampling["temperature"] == 1.0 for r in compares)


def test_answer_pairs_follow_the_official_string_rules(world: dict) -> None:
    # No answer equals "Indiana"; "Indiana, USA" contains it and is shorter than twice it: chosen.
    (contains,) = pairs(world, Q_NO_WORST, "answer")
    assert contains.chosen_setting[0] == 0.1 and "Indiana, USA" in contains.chosen
    assert contains.rejected_setting[0] == 0.9
    # Every answer contains the gold one: the ones longer than twice it are rejected.
    (long,) = pairs(world, Q_LONG, "answer")
    assert long.chosen_setting[0] == 0.1 and long.rejected_setting[0] == 0.5
    assert "south west of England" in long.rejected
    # A reply that breaks the answer format is read as raw text, and missing the gold answer, rejected.
    (broken,) = pairs(world, Q_BROKEN, "answer")
    assert broken.rejected == "I do not know." and broken.chosen_setting[0] == 0.1
    assert "official string rules" in broken.label


def test_the_judge_sees_every_reply_including_those_that_break_the_format(world: dict) -> None:
    judged = next(
        r for r in world["requests"] if "best" in r.output_fields and r.inputs.get("question") == Q_BROKEN
    )
    notes = json.loads(judged.inputs["notes"])
    assert len(notes) == 9 and any(BROKEN_NOTE in note for note in notes)
    (init,) = pairs(world, Q_BROKEN, "note_init")
    assert init.rejected == BROKEN_NOTE and init.rejected_setting == (0.9, 0.1)
    assert "note t0.5p0.5" in init.chosen
    # Chosen, a reply that breaks the format gives no pair (a listed difference) but is carried on as text.
    record = world["records"][Q_BROKEN]
    assert pairs(world, Q_BROKEN, "query_refine") == []
    assert record["dropped"]["query_refine"] == "the chosen reply breaks the stage's format"
    assert record["stats"]["unparsable"] >= 3  # the broken note, query set and answers are counted


def test_a_reply_parsed_on_the_json_retry_keeps_the_prompt_it_answered() -> None:
    def respond(request: ScriptedRequest) -> str:
        return json.dumps({"note": JSON_NOTE}) if is_json_retry(request) else "not the chat format"

    with dspy.context(lm=ScriptedLM(respond)):
        (sample,) = sample_stage(dspy.Predict("question -> note"), {"question": "q"}, [(0.5, 0.9)])
    assert sample.ok and json.loads(sample.completion) == {"note": JSON_NOTE}
    assert "Outputs will be a JSON object" in sample.messages[0]["content"]


def test_a_judged_pair_never_mixes_the_json_retry_s_prompt_with_the_stage_s_own(world: dict) -> None:
    record = world["records"][Q_LONG]
    # Chosen on the retry's prompt, rejected on the stage's own: no pair, and the chosen note goes on.
    assert pairs(world, Q_LONG, "note_init") == []
    assert record["dropped"]["note_init"] == MIXED_PROMPTS
    refined = [
        r for r in world["requests"] if "queries" in r.output_fields and r.inputs["question"] == Q_LONG
    ]
    assert refined and all(JSON_NOTE in r.inputs["best_note"] for r in refined)
    # Rejected on the retry's prompt (the judge's worst query set parsed only there): no pair either.
    assert pairs(world, Q_LONG, "query_refine") == []
    assert record["dropped"]["query_refine"] == MIXED_PROMPTS
    for question in GOLD:
        for pair in (PreferencePair.from_dict(p) for p in world["records"][question]["pairs"]):
            assert "Outputs will be a JSON object" not in pair.prompt[0]["content"]


def test_a_drawn_pair_takes_its_rejected_reply_on_the_chosen_reply_s_prompt() -> None:
    own, retry = [{"role": "user", "content": "own"}], [{"role": "user", "content": "retry"}]
    chosen = Sample(setting=(0.1, 0.1), messages=own, completion="good", values={"a": "good"})
    on_retry = Sample(setting=(0.5, 0.5), messages=retry, completion='{"a": "bad"}', values={"a": "bad"})
    on_own = Sample(setting=(0.9, 0.9), messages=own, completion="bad", values={"a": "bad"})
    for seed in range(8):
        built = Built()
        job = SimpleNamespace(rng=random.Random(seed), question_id="q1")
        _draw_pair("answer", job, [chosen], [on_retry, on_own], built, label="metric")
        (pair,) = built.pairs
        assert pair.prompt == own and pair.rejected == "bad"
    built = Built()
    _draw_pair(
        "answer",
        SimpleNamespace(rng=random.Random(0), question_id="q1"),
        [chosen],
        [on_retry],
        built,
        label="m",
    )
    assert built.pairs == [] and built.dropped == {"answer": MIXED_PROMPTS}


def test_the_official_sampling_budgets(world: dict) -> None:
    judge = [r for r in world["requests"] if {"best", "better"} & set(r.output_fields)]
    sampled = [r for r in world["requests"] if not {"best", "better"} & set(r.output_fields)]
    assert judge and sampled
    budget = "max_completion_tokens"  # what DSPy sends to an OpenAI-compatible chat endpoint
    assert {(r.sampling["temperature"], r.sampling["top_p"], r.sampling[budget]) for r in judge} == {
        (1.0, 0.9, 1280)
    }
    assert {r.sampling[budget] for r in sampled} == {1024}


def test_sample_stage_keeps_the_raw_reply_of_an_unparsable_sample() -> None:
    lm = ScriptedLM(lambda request: "no fields at all")
    with dspy.context(lm=lm):
        (sample,) = sample_stage(dspy.Predict("question -> note"), {"question": "q"}, [(0.1, 0.1)])
    assert sample.error == "unparsable reply" and sample.completion == "no fields at all"
    # The stage's own prompt (ChatAdapter's), not the JSON retry's.
    assert "[[ ## note ## ]]" in sample.messages[0]["content"]


def test_official_answer_labels() -> None:
    texts = ["Paris", "Paris, FR", "Lyon", "the capital is Paris, on the Seine"]
    assert official_answer_labels(texts, ["Paris"], set(), set()) == ({0}, {2})
    # No exact reply: a short one containing the answer; no reply missing it: a long one.
    assert official_answer_labels(texts[1:2] + texts[3:], ["Paris"], set(), set()) == ({0}, {1})
    # The metric's labels are kept.
    assert official_answer_labels(texts, ["Paris"], {1}, {3}) == ({0, 1}, {2, 3})
