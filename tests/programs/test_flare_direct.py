"""FLARE-direct through the real dspy.LM client and the local server, with planted token probabilities: when
it retrieves, what it searches for (the low-probability tokens masked out) and what it costs."""

from __future__ import annotations

import dspy
import pytest

from ragsuite import programs
from ragsuite.errors import ConfigError
from ragsuite.lm import build_lm
from ragsuite.programs.flare import FlareDirect, field_token_probs, masked_query
from ragsuite.retrieval.base import Passage
from ragsuite.testing.openai_server import LocalOpenAIServer, Reply
from ragsuite.testing.retrievers import ListRetriever
from ragsuite.testing.scripted import ScriptedLM

QUESTION = "Where was the director of Jaws born?"
CORPUS = [Passage(f"p{i}", f"T{i}", f"text {i}") for i in range(40)]


def fresh() -> ListRetriever:
    """A retriever returning never-seen passages on each call, recording its queries."""
    blocks = iter(range(10))

    def results(query: str, top_k: int) -> list[str]:
        block = next(blocks)
        return [f"p{block * 4 + j}" for j in range(top_k)]

    return ListRetriever(CORPUS, results)


def responder(log: list[str]):
    """Look-ahead sentences with planted probabilities; the regenerated sentence (asked without logprobs)
    repeats the look-ahead, as a model given the right passage would."""

    def respond(request):
        if "sentence" not in request.output_fields:
            log.append("answer")
            return {"answer": "Cincinnati" if "Cincinnati" in request.inputs.get("note", "") else "unknown"}
        so_far = request.inputs["answer_so_far"]
        if so_far == "nothing yet":
            sentence, probs = "Jaws was directed by Steven Spielberg.", {"Steven": 0.3, "Spielberg.": 0.35}
            probs["directed"] = 0.6
        elif "born" not in so_far:
            sentence, probs = "Spielberg was born in Cincinnati.", {"Cincinnati.": 0.85}
        else:
            sentence, probs = "So the answer is: Cincinnati.", {"Cincinnati.": 0.9}
        if request.sampling.get("logprobs") is not True:
            log.append("regenerate")
            return {"sentence": sentence}
        log.append("look_ahead")
        return Reply({"sentence": sentence}, word_probs=probs)

    return respond


def run_flare(**knobs):
    log: list[str] = []
    retriever = fresh()
    with LocalOpenAIServer(responder(log)) as server:
        lm = build_lm("openai/scripted", api_base=server.api_base, cache=False, retries=0)
        with dspy.context(lm=lm):
            prediction = FlareDirect(retriever=retriever, **knobs)(question=QUESTION)
        requests = server.chat_requests
    return prediction, retriever, log, requests


def test_low_probability_token_triggers_retrieval_with_a_masked_query():
    prediction, retriever, log, requests = run_flare()
    # The question first, then sentence 1 (min p 0.3 < theta 0.8) with its tokens below beta 0.4 masked.
    assert retriever.queries == [QUESTION, "Jaws was directed by"]
    assert log == ["look_ahead", "regenerate", "look_ahead", "look_ahead", "answer"]
    assert prediction.stats["lm_calls"] == 5 == requests
    assert prediction.stats["retrievals"] == 2 and prediction.stats["steps"] == 2
    sentences = [e for e in prediction.trace if e["stage"] == "sentence"]
    assert [e["retrieved"] for e in sentences] == [True, False, False]
    assert [e["min_prob"] for e in sentences] == [0.3, 0.85, 0.9]
    assert sentences[0]["masked"] == ["Steven", "Spielberg."]
    assert sentences[0]["passage_ids"] == ["p4", "p5"]
    assert prediction.generated == (
        "Jaws was directed by Steven Spielberg. Spielberg was born in Cincinnati. "
        "So the answer is: Cincinnati."
    )
    assert prediction.answer == "Cincinnati"
    assert [p.id for p in prediction.passages] == ["p0", "p1", "p4", "p5"]


def test_threshold_knob_moves_retrieval():
    # theta below every planted probability: no sentence is doubted, only the question is searched.
    prediction, retriever, log, requests = run_flare(theta=0.25)
    assert retriever.queries == [QUESTION]
    assert prediction.stats["lm_calls"] == 4 == requests and "regenerate" not in log
    # theta above 0.85: sentence 2 is doubted too; beta 0.9 masks its "Cincinnati." (0.85) as well. Each
    # masked token leaves a space (the authors' mask_method="simple").
    prediction, retriever, log, requests = run_flare(theta=0.88, beta=0.9)
    assert retriever.queries == [QUESTION, "Jaws was  by", "Spielberg was born in"]
    assert prediction.stats["lm_calls"] == 6 == requests and prediction.stats["retrievals"] == 3


def test_lm_without_log_probabilities_is_told_to_use_flare_instruct():
    lm = ScriptedLM(lambda request: {"sentence": "Jaws is a film."})
    with dspy.context(lm=lm), pytest.raises(ConfigError, match="flare-instruct"):
        FlareDirect(retriever=fresh())(question=QUESTION)


def test_token_alignment_and_masking():
    content = [
        {"token": t, "logprob": lp}
        for t, lp in [("[[ ## sentence ## ]]\n", 0.0), ("Jaws", -0.1), (" is", 0.0), (" old.\n\n", -2.0)]
    ]
    tokens = field_token_probs({"content": content}, "Jaws is old.", field="sentence")
    assert [t for t, _ in tokens] == ["Jaws", " is", " old."]  # the trailing newlines are cut off
    assert tokens[2][1] == pytest.approx(0.1353, abs=1e-4)
    assert masked_query(tokens, 0.5) == "Jaws is"
    assert masked_query(tokens, 0.95) == "is"
    assert masked_query(tokens[2:], 0.5) == ""  # all masked: no query, so no retrieval
    assert masked_query(tokens, tokens[2][1]) == "Jaws is"  # a token at exactly beta is masked
    assert field_token_probs({"content": content}, "not there", field="sentence") is None


def scripted_world(look_aheads: list[tuple[str, dict[str, float]]], log: list[str]):
    """Look-ahead number i (by the sentences written so far) is ``look_aheads[i]``; a regeneration returns
    "Regenerated i."."""

    def respond(request):
        if "sentence" not in request.output_fields:
            log.append("answer")
            return {"answer": "Cincinnati"}
        so_far = request.inputs["answer_so_far"]
        index = 0 if so_far == "nothing yet" else so_far.count(".")
        if request.sampling.get("logprobs") is not True:
            log.append("regenerate")
            return {"sentence": f"Regenerated {index}. And more."}
        log.append("look_ahead")
        sentence, probs = look_aheads[index]
        return Reply({"sentence": sentence}, word_probs=probs)

    return respond


def run_world(look_aheads, **knobs):
    log: list[str] = []
    retriever = fresh()
    with LocalOpenAIServer(scripted_world(look_aheads, log)) as server:
        lm = build_lm("openai/scripted", api_base=server.api_base, cache=False, retries=0)
        with dspy.context(lm=lm):
            prediction = FlareDirect(retriever=retriever, **knobs)(question=QUESTION)
    return prediction, retriever, log


def test_look_ahead_is_judged_on_its_first_sentence_only():
    # The authors cut the look-ahead at its first sentence before judging it: an unsure token in a second
    # sentence neither triggers retrieval nor reaches the answer.
    prediction, retriever, log = run_world(
        [
            ("Jaws was directed by Spielberg. He was born in Ohio.", {"Ohio.": 0.1}),
            ("So the answer is: Cincinnati. Done.", {}),
        ]
    )
    assert retriever.queries == [QUESTION]
    assert log == ["look_ahead", "look_ahead", "answer"]
    assert prediction.generated == "Jaws was directed by Spielberg. So the answer is: Cincinnati."
    # An unsure token in the first sentence does trigger it, and the regeneration is cut too.
    prediction, retriever, log = run_world(
        [
            ("Jaws was directed by Spielberg. He was born in Ohio.", {"Spielberg.": 0.1}),
            ("So the answer is: x.", {}),
        ]
    )
    assert retriever.queries == [QUESTION, "Jaws was directed by"]
    assert log == ["look_ahead", "regenerate", "look_ahead", "answer"]
    assert prediction.generated == "Regenerated 0. So the answer is: x."


def test_an_all_masked_sentence_retrieves_nothing_and_is_kept():
    # use_as_query returns "" when every token is masked; the original then issues no query.
    prediction, retriever, log = run_world(
        [("Spielberg.", {"Spielberg.": 0.1}), ("So the answer is: x.", {})]
    )
    assert retriever.queries == [QUESTION]
    assert log == ["look_ahead", "look_ahead", "answer"]
    first = next(e for e in prediction.trace if e["stage"] == "sentence")
    assert first["retrieved"] is False and first["all_masked"] is True and first["sentence"] == "Spielberg."
    assert prediction.stats["retrievals"] == 1 and prediction.stats["steps"] == 1


def test_registered_with_paper_defaults_and_checked_knobs():
    assert programs.get("flare-direct") is FlareDirect
    assert FlareDirect.default_knobs() == {"top_k": 2, "max_steps": 5, "theta": 0.8, "beta": 0.4}
    with pytest.raises(ConfigError, match="theta"):
        FlareDirect(theta=1.5)
