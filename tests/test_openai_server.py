"""The local OpenAI-compatible server drives the real dspy.LM client: answers, usage, faults and retries."""

from __future__ import annotations

import json
import time
import urllib.request

import dspy
import pytest
from dspy.utils.exceptions import (
    AdapterParseError,
    LMServerError,
    LMTransportError,
    LMUnsupportedModelError,
)

from ragsuite.lm import build_lm, explain_lm_error
from ragsuite.testing.openai_server import Fault, LocalOpenAIServer, word_count


def capital(request):
    return {"answer": "Paris" if "France" in request.inputs.get("question", "") else "unknown"}


def ask(lm, question: str = "Capital of France?"):
    with dspy.context(lm=lm):
        return dspy.Predict("question -> answer")(question=question)


def lm_for(server: LocalOpenAIServer, **options):
    return build_lm("openai/scripted", api_base=server.api_base, cache=False, **options)


def test_answers_lists_models_and_reports_usage():
    with LocalOpenAIServer(capital) as server:
        with urllib.request.urlopen(f"{server.api_base}/models", timeout=5) as reply:
            assert [m["id"] for m in json.load(reply)["data"]] == ["scripted"]
        lm = lm_for(server, retries=0)
        with dspy.context(track_usage=True):
            prediction = ask(lm)
            other = ask(lm, "Capital of Peru?")
        assert prediction.answer == "Paris"
        assert other.answer == "unknown"
        usage = prediction.get_lm_usage()["openai/scripted"]
        assert usage["completion_tokens"] == word_count("[[ ## answer ## ]]\nParis\n\n[[ ## completed ## ]]")
        assert usage["prompt_tokens"] > 20
        assert server.chat_requests == 2
        assert server.question_counts == {"Capital of France?": 1, "Capital of Peru?": 1}
        assert [r.inputs["question"] for r in server.requests] == ["Capital of France?", "Capital of Peru?"]


def test_rate_limit_is_retried_honouring_retry_after():
    with LocalOpenAIServer(capital) as server:
        server.inject(Fault("rate_limit", seconds=0.2))
        started = time.monotonic()
        assert ask(lm_for(server, retries=2)).answer == "Paris"
        assert time.monotonic() - started >= 0.2
        assert server.chat_requests == 2
        assert [f.kind for f in server.faults_served] == ["rate_limit"]


def test_server_error_is_retried_then_surfaces_when_retries_run_out():
    with LocalOpenAIServer(capital) as server:
        server.inject(Fault("server_error"))
        assert ask(lm_for(server, retries=1)).answer == "Paris"
        assert server.chat_requests == 2
        server.inject(Fault("server_error"))
        with pytest.raises(LMServerError):
            ask(lm_for(server, retries=0))
        assert server.chat_requests == 3


def test_timeout_is_retried():
    with LocalOpenAIServer(capital) as server:
        server.inject(Fault("delay", seconds=2.0))
        started = time.monotonic()
        assert ask(lm_for(server, retries=1, timeout=0.5)).answer == "Paris"
        assert server.chat_requests == 2
        assert time.monotonic() - started < 2.0 + 1.5  # the slow attempt was abandoned, not awaited
        server.inject(Fault("delay", seconds=1.5))
        with pytest.raises(LMTransportError, match="timed out"):
            ask(lm_for(server, retries=0, timeout=0.5))


def test_malformed_output_fails_both_adapters():
    with LocalOpenAIServer(capital) as server:
        server.inject(Fault("malformed", text="no headers here"), Fault("malformed", text="{not json"))
        with pytest.raises(AdapterParseError):
            ask(lm_for(server, retries=0))
        # ChatAdapter's failure makes DSPy retry once with JSONAdapter.
        assert server.chat_requests == 2


def test_unknown_model_and_dropped_connection():
    with LocalOpenAIServer(capital) as server:
        lm = build_lm("openai/not-served", api_base=server.api_base, cache=False, retries=0)
        with pytest.raises(LMUnsupportedModelError) as info:
            ask(lm)
        assert "unknown model" in explain_lm_error(info.value)
        server.inject(Fault("disconnect"))
        with pytest.raises(LMTransportError):
            ask(lm_for(server, retries=0))


def test_fault_fn_targets_one_question_and_server_stops_cleanly():
    def fault_fn(number, request):
        return Fault("server_error") if "Peru" in request.inputs.get("question", "") else None

    server = LocalOpenAIServer(capital, fault_fn=fault_fn).start()
    try:
        assert ask(lm_for(server, retries=0)).answer == "Paris"
        with pytest.raises(LMServerError):
            ask(lm_for(server, retries=0), "Capital of Peru?")
    finally:
        server.stop()
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.api_base
