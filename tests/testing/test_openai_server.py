"""The local OpenAI-compatible server drives the real dspy.LM client: answers, usage, faults and retries."""

from __future__ import annotations

import json
import math
import time
import urllib.error
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
from ragsuite.testing.openai_server import Fault, LocalOpenAIServer, Reply, TokenLogprob, word_count


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


# ---------------------------------------------------------------------------- log probabilities
def _post(server: LocalOpenAIServer, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{server.api_base}/{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_chat_logprobs_reach_dspy_lm_in_openai_format():
    def responder(request):
        return Reply({"answer": "Paris is nice"}, word_probs={"Paris": 0.25, "nice": 0.5})

    with LocalOpenAIServer(responder, default_logprob=-0.01) as server:
        lm = dspy.LM(
            "openai/scripted",
            api_base=server.api_base,
            api_key="unused",
            cache=False,
            logprobs=True,
            top_logprobs=3,
        )
        prediction = ask(lm)
        assert prediction.answer == "Paris is nice"
        content = prediction.logprobs["content"]
        text = "[[ ## answer ## ]]\nParis is nice\n\n[[ ## completed ## ]]"
        assert "".join(t["token"] for t in content) == text
        by_token = {t["token"].strip(): t for t in content}
        assert by_token["Paris"]["logprob"] == pytest.approx(math.log(0.25))
        assert by_token["nice"]["logprob"] == pytest.approx(math.log(0.5))
        assert by_token["is"]["logprob"] == pytest.approx(-0.01)
        assert by_token["Paris"]["bytes"] == list(by_token["Paris"]["token"].encode())
        assert by_token["Paris"]["top_logprobs"][0]["token"] == by_token["Paris"]["token"]
        assert server.requests[-1].sampling == {"logprobs": True, "top_logprobs": 3}
        # Without the flag the reply carries none and the prediction has no logprobs field.
        plain = ask(lm_for(server, retries=0))
        assert plain.answer == "Paris is nice" and "logprobs" not in plain.keys()


def test_chat_logprobs_wire_format_and_scripted_alternatives():
    tokens = [
        TokenLogprob("yes", math.log(0.6), top=(("yes", math.log(0.6)), ("no", math.log(0.3)))),
        TokenLogprob(" indeed", -0.5),
    ]

    with LocalOpenAIServer(lambda request: Reply("yes indeed", tokens=tokens)) as server:
        messages = [{"role": "user", "content": "well?"}]
        status, body = _post(
            server,
            "chat/completions",
            {"model": "scripted", "messages": messages, "logprobs": True, "top_logprobs": 2},
        )
        assert status == 200
        logprobs = body["choices"][0]["logprobs"]
        assert logprobs["refusal"] is None
        first, second = logprobs["content"]
        assert first == {
            "token": "yes",
            "logprob": pytest.approx(math.log(0.6)),
            "bytes": [121, 101, 115],
            "top_logprobs": [
                {"token": "yes", "logprob": pytest.approx(math.log(0.6)), "bytes": [121, 101, 115]},
                {"token": "no", "logprob": pytest.approx(math.log(0.3)), "bytes": [110, 111]},
            ],
        }
        # An unscripted alternative list holds the chosen token alone.
        assert [t["token"] for t in second["top_logprobs"]] == [" indeed"]
        status, body = _post(server, "chat/completions", {"model": "scripted", "messages": messages})
        assert status == 200 and body["choices"][0]["logprobs"] is None
        for bad, reason in (
            ({"top_logprobs": 2}, "requires 'logprobs': true"),
            ({"logprobs": True, "top_logprobs": 21}, "from 0 to 20"),
            ({"logprobs": "yes"}, "must be a boolean"),
        ):
            status, body = _post(
                server, "chat/completions", {"model": "scripted", "messages": messages, **bad}
            )
            assert status == 400 and reason in body["error"]["message"]

    def wrong_tokens(request):
        return Reply("yes indeed", tokens=[TokenLogprob("no", -1.0)])

    with LocalOpenAIServer(wrong_tokens) as server:
        status, body = _post(
            server,
            "chat/completions",
            {"model": "scripted", "messages": [{"role": "user", "content": "x"}], "logprobs": True},
        )
        assert status == 500 and "scripted tokens spell 'no'" in body["error"]["message"]


def test_text_completions_with_legacy_logprobs():
    import openai

    seen = []

    def responder(request):
        seen.append(request.prompt)
        return Reply(
            " [Retrieval]<paragraph>",
            tokens=[
                TokenLogprob(" [Retrieval]", math.log(0.7), top=(("[No Retrieval]", math.log(0.2)),)),
                TokenLogprob("<paragraph>", 0.0),
            ],
        )

    with LocalOpenAIServer(responder) as server:
        client = openai.OpenAI(base_url=server.api_base, api_key="unused", max_retries=0)
        reply = client.completions.create(
            model="scripted", prompt="### Instruction:\nQ\n\n### Response:\n", max_tokens=5, logprobs=2
        )
        choice = reply.choices[0]
        assert choice.text == " [Retrieval]<paragraph>"
        assert choice.logprobs.tokens == [" [Retrieval]", "<paragraph>"]
        assert choice.logprobs.token_logprobs == pytest.approx([math.log(0.7), 0.0])
        assert choice.logprobs.text_offset == [0, 12]
        assert choice.logprobs.top_logprobs[0] == pytest.approx(
            {" [Retrieval]": math.log(0.7), "[No Retrieval]": math.log(0.2)}
        )
        assert seen == ["### Instruction:\nQ\n\n### Response:\n"]
        assert reply.usage.completion_tokens == 1
        # A list of prompts gets one choice each; no logprobs unless asked.
        batch = client.completions.create(model="scripted", prompt=["a", "b"], max_tokens=5)
        assert [c.index for c in batch.choices] == [0, 1] and batch.choices[1].logprobs is None
        assert seen[-2:] == ["a", "b"]
        status, body = _post(server, "completions", {"model": "scripted", "prompt": "a", "logprobs": 21})
        assert status == 400 and "from 0 to 20" in body["error"]["message"]
    with LocalOpenAIServer(lambda request: {"answer": "fields"}) as server:
        status, body = _post(server, "completions", {"model": "scripted", "prompt": "a"})
        assert status == 500 and "must return text" in body["error"]["message"]
