"""Self-RAG read from a checkpoint's reflection-token probabilities, against the local server's
/v1/completions with planted probabilities: the retrieval decision, the scoring and the choice of passage."""

from __future__ import annotations

import logging
import math
import time

import dspy
import openai
import pytest

from ragsuite import programs
from ragsuite.errors import ConfigError
from ragsuite.lm import build_lm, describe_lm_failure
from ragsuite.programs import self_rag
from ragsuite.programs.self_rag import SelfRAG, clean_generation
from ragsuite.retrieval.base import Passage
from ragsuite.testing import ScriptedLM
from ragsuite.testing.openai_server import Fault, LocalOpenAIServer
from ragsuite.testing.responders import self_rag_reply
from ragsuite.testing.retrievers import ListRetriever

QUESTION = "Who directed Jaws?"
PROMPT = "### Instruction:\nWho directed Jaws?\n\n### Response:\n"
CORPUS = [Passage(f"p{i}", f"T{i}", f"text {i}") for i in range(10)]

# Per passage: the checkpoint's generation and the probabilities planted at its reflection tokens.
CANDIDATES = {
    "text 0": (
        "[Relevant]Lucas[Partially supported][Utility:4]",
        {"[Relevant]": 0.9, "[Irrelevant]": 0.1, "[Fully supported]": 0.2, "[Partially supported]": 0.7}
        | {"[No support / Contradictory]": 0.1, "[Utility:4]": 0.6, "[Utility:5]": 0.4},
    ),
    "text 1": (
        "[Relevant]Steven Spielberg[Fully supported][Utility:5]",
        {"[Relevant]": 0.8, "[Irrelevant]": 0.2, "[Fully supported]": 0.9, "[Partially supported]": 0.1}
        | {"[Utility:5]": 0.9, "[Utility:4]": 0.1},
    ),
    "text 2": (
        "[Irrelevant]Jaws[No support / Contradictory][Utility:1]",
        {"[Relevant]": 0.1, "[Irrelevant]": 0.9, "[No support / Contradictory]": 0.8}
        | {"[Partially supported]": 0.2, "[Utility:1]": 1.0},
    ),
}


def checkpoint(p_retrieve: float):
    def respond(request):
        prompt = request.prompt
        if "<paragraph>" in prompt:
            text, probs = next(v for k, v in CANDIDATES.items() if f"\n{k}</paragraph>" in prompt)
            return self_rag_reply(text, probs)
        if prompt.endswith("[No Retrieval]"):
            return self_rag_reply("Steven Spielberg directed it.")
        written = "[Retrieval]" if p_retrieve >= 0.5 else "[No Retrieval]"
        return self_rag_reply(written, {"[Retrieval]": p_retrieve, "[No Retrieval]": 1 - p_retrieve})

    return respond


def run_self_rag(p_retrieve: float = 0.9, **knobs):
    retriever = ListRetriever(CORPUS, lambda query, k: [f"p{i}" for i in range(k)])
    with LocalOpenAIServer(checkpoint(p_retrieve), model="selfrag_llama2_7b") as server:
        lm = build_lm("openai/selfrag_llama2_7b", api_base=server.api_base, cache=False, retries=0)
        with dspy.context(lm=lm):
            prediction = SelfRAG(retriever=retriever, top_k=3, **knobs)(question=QUESTION)
        return prediction, retriever, server.requests


def expected_critique(text: str, probs: dict[str, float], w_rel=1.0, w_sup=1.0, w_use=0.5) -> float:
    """The official short-form scoring, computed by hand from the planted probabilities."""

    def p(name: str) -> float:
        return probs.get(name, 0.0)

    relevance = p("[Relevant]") / (p("[Relevant]") + p("[Irrelevant]"))
    supports = [p("[Fully supported]"), p("[Partially supported]"), p("[No support / Contradictory]")]
    support = (supports[0] + 0.5 * supports[1]) / sum(supports)
    levels = [p(f"[Utility:{i}]") for i in range(1, 6)]
    utility = sum(v * q for v, q in zip((-1, -0.5, 0, 0.5, 1), levels, strict=True)) / sum(levels)
    return w_rel * relevance + w_sup * support + w_use * utility


def sequence(text: str, probs: dict[str, float]) -> float:
    tokens = self_rag_reply(text, probs).tokens
    return math.exp(sum(t.logprob for t in tokens) / len(tokens))


def test_choice_of_passage_follows_the_planted_reflection_scores():
    prediction, retriever, requests = run_self_rag()
    assert retriever.queries == [QUESTION]
    assert prediction.stats["lm_calls"] == 4 == len(requests) and prediction.stats["retrievals"] == 1
    assert requests[0].prompt == PROMPT and requests[0].sampling["max_tokens"] == 1
    assert sorted(r.prompt for r in requests[1:]) == [
        f"{PROMPT}[Retrieval]<paragraph>T{i}\ntext {i}</paragraph>" for i in range(3)
    ]
    assert all(r.sampling["logprobs"] == 20 and r.sampling["temperature"] == 0.0 for r in requests)
    critiques = {e["passage_id"]: e for e in prediction.trace if e["stage"] == "critique"}
    for i, (text, probs) in enumerate(CANDIDATES.values()):
        want = expected_critique(text, probs) + sequence(text, probs)
        assert critiques[f"p{i}"]["score"] == pytest.approx(want, abs=1e-4)
    # p1: 0.8 + 0.95 + 0.5 * 0.95 = 2.225 (+0.90) beats p0: 0.9 + 0.55 + 0.5 * 0.7 = 1.8 (+0.78).
    assert prediction.answer == "Steven Spielberg" and [p.id for p in prediction.passages] == ["p1"]
    assert prediction.candidates == ["Lucas", "Steven Spielberg", "Jaws"]
    decide = next(e for e in prediction.trace if e["stage"] == "decide")
    assert decide == {"stage": "decide", "retrieve": True, "p_retrieve": 0.9}


def test_weights_are_knobs_that_change_the_choice():
    # Relevance alone, without the generation's probability: p0 (0.9) beats p1 (0.8).
    prediction, _, _ = run_self_rag(w_sup=0.0, w_use=0.0, use_seqscore=False)
    assert prediction.answer == "Lucas" and [p.id for p in prediction.passages] == ["p0"]
    critiques = [e["score"] for e in prediction.trace if e["stage"] == "critique"]
    assert critiques == pytest.approx([0.9, 0.8, 0.1], abs=1e-4)


def test_retrieval_is_skipped_when_p_retrieve_is_below_the_threshold():
    prediction, retriever, requests = run_self_rag(p_retrieve=0.15)  # 0.15 < delta 0.2
    assert retriever.queries == [] and prediction.stats["retrievals"] == 0
    assert prediction.stats["lm_calls"] == 2 == len(requests)
    assert requests[1].prompt == PROMPT + "[No Retrieval]"
    assert prediction.answer == "Steven Spielberg directed it." and prediction.passages == []
    # The same checkpoint under a lower threshold retrieves.
    prediction, retriever, requests = run_self_rag(p_retrieve=0.15, threshold=0.1)
    assert retriever.queries == [QUESTION] and len(requests) == 4


def test_neither_retrieval_token_among_the_alternatives_scores_both_as_missing_and_retrieves():
    # run_short_form.py gives a reflection token missing from the alternatives -100: both missing make
    # P([Retrieval]) 0.5, above delta 0.2, whatever the checkpoint wrote (here a word, no reflection token).
    def respond(request):
        if "<paragraph>" in request.prompt:
            return self_rag_reply(*CANDIDATES["text 1"])
        return self_rag_reply("Steven Spielberg")

    retriever = ListRetriever(CORPUS, lambda query, k: [f"p{i}" for i in range(k)])
    with LocalOpenAIServer(respond, model="selfrag_llama2_7b") as server:
        lm = build_lm("openai/selfrag_llama2_7b", api_base=server.api_base, cache=False, retries=0)
        with dspy.context(lm=lm):
            prediction = SelfRAG(retriever=retriever, top_k=2)(question=QUESTION)
            above = SelfRAG(retriever=retriever, top_k=2, threshold=0.6)(question=QUESTION)
    decide = next(e for e in prediction.trace if e["stage"] == "decide")
    assert decide == {"stage": "decide", "retrieve": True, "p_retrieve": 0.5}
    assert retriever.queries == [QUESTION] and prediction.answer == "Steven Spielberg"
    # The same 0.5 against a threshold above it: no retrieval.
    assert next(e for e in above.trace if e["stage"] == "decide")["retrieve"] is False
    assert above.stats["retrievals"] == 0
    documented = " ".join(self_rag.__doc__.split())
    assert "[No Retrieval] is among the alternatives, both get -100 and the retrieval probability is 0.5" in (
        documented
    )


def test_lm_that_is_not_a_served_checkpoint_is_refused_naming_the_prompted_variant():
    with (
        dspy.context(lm=ScriptedLM(lambda request: {"answer": "x"})),
        pytest.raises(ConfigError, match="self-rag-prompted"),
    ):
        SelfRAG(retriever=ListRetriever(CORPUS, lambda q, k: ["p0"]))(question=QUESTION)


def test_registered_with_the_papers_defaults():
    assert programs.get("self-rag") is SelfRAG
    assert SelfRAG.default_knobs() == {
        "top_k": 5,
        "threshold": 0.2,
        "w_rel": 1.0,
        "w_sup": 1.0,
        "w_use": 0.5,
        "use_seqscore": True,
        "beam_width": 2,  # the authors' long-form defaults
        "max_depth": 7,  # the README's ASQA command
    }
    # The README's commands: --max_new_tokens 100 (PopQA, TriviaQA), 50 (PubHealth, ARC), 300 (ASQA).
    assert SelfRAG().max_tokens == 100 and SelfRAG(task="yesno").max_tokens == 50
    assert SelfRAG(task="long").max_tokens == 300
    assert clean_generation("[Relevant]Paris[Fully supported][Utility:5]</s>") == "Paris"


def test_answers_are_post_processed_as_the_authors_do():
    # postprocess_answer_option_conditioned, then main()'s "drop one leading # or :".
    assert clean_generation("[Relevant]: Paris[Fully supported][Utility:5]</s>") == "Paris"
    assert clean_generation("#Paris\nFrance<|endoftext|>") == "ParisFrance"  # "\n" removed, not a space
    assert clean_generation("::Paris") == ":Paris"  # one character only
    # "[Continue to Use Evidence]" is not among the authors' control tokens: it stays.
    assert clean_generation("Paris[Continue to Use Evidence]") == "Paris[Continue to Use Evidence]"


def test_closed_tasks_sum_the_scores_of_candidates_with_the_same_answer():
    # run_short_form.py with closed=True (PubHealth, ARC): answer2score sums per post-processed answer.
    # Here two weaker "no" candidates outweigh one stronger "yes".
    NO = {"[Relevant]": 0.9, "[Irrelevant]": 0.1, "[Fully supported]": 0.8, "[Partially supported]": 0.2}
    candidates = {
        "text 0": (
            "[Relevant]yes[Fully supported][Utility:5]",
            {"[Relevant]": 1.0, "[Fully supported]": 1.0},
        ),
        "text 1": ("[Relevant]no[Fully supported][Utility:3]", NO),
        "text 2": ("[Relevant]no[Fully supported][Utility:3]", NO),
    }

    def respond(request):
        prompt = request.prompt
        if "<paragraph>" in prompt:
            text, probs = next(v for k, v in candidates.items() if f"\n{k}</paragraph>" in prompt)
            return self_rag_reply(text, probs)
        return self_rag_reply("[Retrieval]", {"[Retrieval]": 0.9, "[No Retrieval]": 0.1})

    retriever = ListRetriever(CORPUS, lambda query, k: [f"p{i}" for i in range(k)])
    with LocalOpenAIServer(respond, model="selfrag_llama2_7b") as server:
        lm = build_lm("openai/selfrag_llama2_7b", api_base=server.api_base, cache=False, retries=0)
        with dspy.context(lm=lm):
            closed = SelfRAG(retriever=retriever, top_k=3, task="yesno", use_seqscore=False)(
                question=QUESTION
            )
            opened = SelfRAG(retriever=retriever, top_k=3, use_seqscore=False)(question=QUESTION)
    scores = [e["score"] for e in closed.trace if e["stage"] == "critique"]
    assert scores[0] > scores[1] == scores[2] and 2 * scores[1] > scores[0]
    assert closed.answer == "no" and [p.id for p in closed.passages] == ["p1", "p2"]
    assert opened.answer == "yes" and [p.id for p in opened.passages] == ["p0"]
    with pytest.raises(ConfigError, match="threshold"):
        SelfRAG(threshold=2.0)


def test_an_eval_record_counts_every_checkpoint_completion_as_an_lm_invocation():
    """The completions bypass dspy.LM, but DSPy's callbacks see them as its calls: the record's invocations
    and requests both equal what the server received (none is counted as a free cache hit)."""
    from ragsuite.evaluation import evaluate

    retriever = ListRetriever(CORPUS, lambda query, k: [f"p{i}" for i in range(k)])
    example = dspy.Example(id="q1", question=QUESTION, answers=["Steven Spielberg"]).with_inputs("question")
    with LocalOpenAIServer(checkpoint(0.9), model="selfrag_llama2_7b") as server:
        lm = build_lm("openai/selfrag_llama2_7b", api_base=server.api_base, cache=True, retries=0)
        with dspy.context(lm=lm):
            result = evaluate(
                SelfRAG(retriever=retriever, top_k=3),
                [example],
                dataset="hotpotqa",
                threads=1,
                progress=False,
            )
        sent = len(server.requests)
    tokens = result.records[0]["tokens"]
    assert sent == 4
    assert tokens["lm_invocations"] == tokens["requests"] == sent and tokens["cache_hits"] == 0


# ------------------------------------------------------------------------------------------------ retries
def run_with_faults(*faults: Fault, retries: int, max_retry_wait: float = 0.05):
    """self-rag below its retrieval threshold (two completions, one after the other), the first one or more
    requests failing with ``faults``. Returns the answer or the error, the seconds taken and the server."""
    with LocalOpenAIServer(checkpoint(0.15), model="selfrag_llama2_7b") as server:
        server.inject(*faults)
        lm = build_lm(
            "openai/selfrag_llama2_7b",
            api_base=server.api_base,
            cache=False,
            retries=retries,
            max_retry_wait=max_retry_wait,
        )
        started = time.monotonic()
        try:
            with dspy.context(lm=lm):
                outcome = SelfRAG(retriever=ListRetriever(CORPUS, lambda q, k: ["p0"]))(question=QUESTION)
        except Exception as exc:  # the caller checks which error
            outcome = exc
        return outcome, time.monotonic() - started, server, lm


def retry_logs(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ragsuite.lm" and "retry" in r.getMessage()]


@pytest.mark.parametrize(
    "fault",
    [Fault("rate_limit", seconds=3600), Fault("rate_limit", retry_after="Fri, 31 Dec 2099 23:59:59 GMT")],
    ids=["an-hour", "an-http-date-in-2099"],
)
def test_a_retry_after_of_an_hour_is_capped_by_max_retry_wait_and_logged(fault, caplog):
    """The openai client used to retry on its own, uncapped and silently."""
    with caplog.at_level(logging.WARNING, logger="ragsuite.lm"):
        outcome, elapsed, server, _ = run_with_faults(fault, retries=2)
    assert not isinstance(outcome, Exception), outcome
    assert outcome.answer == "Steven Spielberg directed it."
    # The rate-limited request, its retry, then the generation.
    assert server.chat_requests == 3 and len(server.requests) == 2 and server.faults_served == [fault]
    assert elapsed < 5
    [message] = retry_logs(caplog)
    assert message.startswith("LM call failed (RateLimitError); retry 1 in 0.1 s"), message
    assert f"the server asked for {fault.retry_after or '3600'}; capped by --max-retry-wait" in message


@pytest.mark.parametrize(
    ("fault", "error"),
    [(Fault("server_error"), "InternalServerError"), (Fault("disconnect"), "APIConnectionError")],
    ids=["500", "dropped-connection"],
)
def test_a_server_error_or_dropped_connection_is_retried_once_with_capped_backoff(fault, error, caplog):
    with caplog.at_level(logging.WARNING, logger="ragsuite.lm"):
        outcome, _, server, _ = run_with_faults(fault, retries=2)
    assert not isinstance(outcome, Exception), outcome
    assert outcome.answer == "Steven Spielberg directed it."
    assert server.chat_requests == 3 and len(server.requests) == 2
    # Backoff would wait 1 s before the first retry; the cap (0.05 s) is shorter.
    assert retry_logs(caplog) == [f"LM call failed ({error}); retry 1 in 0.1 s (capped by --max-retry-wait)"]


def test_a_client_error_is_not_retried(caplog):
    with caplog.at_level(logging.WARNING, logger="ragsuite.lm"):
        outcome, _, server, _ = run_with_faults(Fault("not_found"), retries=2)
    assert isinstance(outcome, openai.NotFoundError) and outcome.status_code == 404
    assert server.chat_requests == 1 and server.requests == []
    assert retry_logs(caplog) == []


def test_without_retries_a_rate_limit_fails_at_once_naming_the_flags(caplog):
    with caplog.at_level(logging.WARNING, logger="ragsuite.lm"):
        outcome, elapsed, server, lm = run_with_faults(Fault("rate_limit", seconds=3600), retries=0)
    assert isinstance(outcome, openai.RateLimitError), outcome
    assert server.chat_requests == 1 and retry_logs(caplog) == [] and elapsed < 5
    message = describe_lm_failure(outcome, lm=lm)
    assert message is not None and "429 (rate limited) on 1 attempt(s)" in message
    assert "--retries" in message and "--max-retry-wait" in message


def test_the_last_attempts_error_is_raised_after_every_retry(caplog):
    faults = [Fault("server_error")] * 3
    with caplog.at_level(logging.WARNING, logger="ragsuite.lm"):
        outcome, _, server, _ = run_with_faults(*faults, retries=2)
    assert isinstance(outcome, openai.InternalServerError), outcome
    assert server.chat_requests == 3 and server.requests == []
    assert [m.split(" in ")[0] for m in retry_logs(caplog)] == [
        "LM call failed (InternalServerError); retry 1",
        "LM call failed (InternalServerError); retry 2",
    ]


def test_long_form_answers_by_segment_level_beam_search():
    # run_long_form_static.py: each beam path continues after each passage; path score = product of segment
    # scores; beam 2; a path goes on while its segment asks for [Retrieval] ("[No Retrieval]" re-read as
    # [Retrieval] when (P(Ret) + P(Cont)) / (P(Ret) + P(NoRet)) > threshold); the deepest level's best wins.
    good = {"[Relevant]": 0.9, "[Irrelevant]": 0.1, "[Fully supported]": 1.0}
    weak = {"[Relevant]": 0.6, "[Irrelevant]": 0.4, "[Fully supported]": 0.2, "[Partially supported]": 0.8}
    first = {
        "text 0": ("[Relevant]Jaws is a 1975 film.[Fully supported][Utility:4][Retrieval]", good),
        "text 1": ("[Relevant]Jaws is a shark movie.[Partially supported][Utility:3][Retrieval]", weak),
    }
    second = {
        "text 0": (
            "[Relevant]It was directed by Spielberg.[Fully supported][Utility:5][No Retrieval]",
            good | {"[No Retrieval]": 0.3, "[Retrieval]": 0.7},
        ),
        "text 1": ("[Relevant]It was shot in Maine.[Partially supported][Utility:3][Retrieval]", weak),
    }
    third = {
        "text 0": ("[Relevant]Spielberg was born in Cincinnati.[Fully supported][Utility:5]", good),
        "text 1": ("[Irrelevant]Maine is a state.[No support / Contradictory][Utility:1]", weak),
    }

    def respond(request):
        prompt = request.prompt
        if "<paragraph>" not in prompt:
            return self_rag_reply("[Retrieval]", {"[Retrieval]": 0.9, "[No Retrieval]": 0.1})
        so_far = prompt.split("### Response:\n", 1)[1].split("[Retrieval]<paragraph>", 1)[0]
        table = third if "Spielberg." in so_far else second if so_far else first
        text, probs = next(v for k, v in table.items() if f"\n{k}</paragraph>" in prompt)
        return self_rag_reply(text, probs)

    retriever = ListRetriever(CORPUS, lambda query, k: [f"p{i}" for i in range(k)])
    with LocalOpenAIServer(respond, model="selfrag_llama2_7b") as server:
        lm = build_lm("openai/selfrag_llama2_7b", api_base=server.api_base, cache=False, retries=0)
        with dspy.context(lm=lm):
            program = SelfRAG(retriever=retriever, top_k=2, task="long", use_seqscore=False, max_depth=4)
            prediction = program(question=QUESTION)
        requests = server.requests
    assert prediction.answer == (
        "Jaws is a 1975 film. It was directed by Spielberg. Spielberg was born in Cincinnati."
    )
    # 1 decision + 2 segments at depth 1 + 2 paths x 2 passages at depths 2 and 3.
    assert len(requests) == 1 + 2 + 4 + 4 == prediction.stats["lm_calls"]
    assert all(r.sampling["max_tokens"] == 300 for r in requests[1:])
    segments = [e for e in prediction.trace if e["stage"] == "segment"]
    assert [e["depth"] for e in segments] == [1, 1, 2, 2, 2, 2, 3, 3, 3, 3]
    # Scores: 2.15 and 1.2 at depth 1; the kept paths multiply them.
    assert [e["score"] for e in segments[:2]] == [2.15, 1.2]
    assert segments[2]["path_score"] == round(2.15 * 2.4, 4)
    # Each child is prompted with its parent's text, reflection tokens included.
    parent = "[Relevant]Jaws is a 1975 film.[Fully supported][Utility:4]"
    assert (
        sum(
            r.prompt.endswith("</paragraph>") and f"### Response:\n{parent}[Retrieval]<paragraph>" in r.prompt
            for r in requests
        )
        == 2
    )
    assert [p.id for p in prediction.passages] == ["p0"]
    # Beam width 1 keeps only the best path at each depth: 2 + 2 + 2 segment calls.
    with LocalOpenAIServer(respond, model="selfrag_llama2_7b") as server:
        lm = build_lm("openai/selfrag_llama2_7b", api_base=server.api_base, cache=False, retries=0)
        with dspy.context(lm=lm):
            narrow = SelfRAG(
                retriever=retriever, top_k=2, task="long", use_seqscore=False, max_depth=4, beam_width=1
            )
            narrow(question=QUESTION)
        assert len(server.requests) == 1 + 2 + 2 + 2
