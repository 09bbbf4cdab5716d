"""Planted worlds for the tests of the programs: a retriever that returns never-seen passages and a scripted
LM that replies to each output field from a queue, so that a test can count LM calls and retrievals exactly
(the reasoning baselines, Adaptive-RAG's router)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dspy
import pytest

from ragsuite.retrieval.base import Passage
from ragsuite.testing.retrievers import ListRetriever
from ragsuite.testing.scripted import ScriptedLM, ScriptedRequest

_QUESTION = "Where was the director of Jaws born?"
_CORPUS = [Passage(f"p{i}", f"T{i}", f"text {i}") for i in range(40)]


@pytest.fixture(scope="session")
def planted_question() -> str:
    """The question :func:`run` asks unless told otherwise."""
    return _QUESTION


@pytest.fixture(scope="session")
def planted_corpus() -> list[Passage]:
    """The 40 passages (``p0`` ... ``p39``) :func:`fresh` returns from."""
    return list(_CORPUS)


@pytest.fixture(scope="session")
def fresh() -> Callable[..., ListRetriever]:
    """``fresh(k=4)``: a retriever returning ``k`` never-seen passages per call, recording its queries."""

    def make(k: int = 4) -> ListRetriever:
        blocks = iter(range(10))

        def results(query: str, top_k: int) -> list[str]:
            block = next(blocks)
            return [f"p{block * k + j}" for j in range(top_k)]

        return ListRetriever(_CORPUS, results)

    return make


@pytest.fixture(scope="session")
def scripted() -> Callable[..., ScriptedLM]:
    """``scripted(**replies)``: a scripted LM answering each output field from a queue (or a constant). A raw
    reply (``"[[ ..."``) is malformed: DSPy retries it once with its JSON adapter, and the retry gets the same
    text. A field with no reply planted gets the answer "Cincinnati"."""

    def make(**replies: Any) -> ScriptedLM:
        queues = {
            k: iter(v) if isinstance(v, list) and k not in ("notes", "thoughts") else v
            for k, v in replies.items()
        }
        retrying: dict[str, str] = {}

        def respond(request: ScriptedRequest) -> dict[str, Any] | str:
            for name in request.output_fields:
                if name in retrying:
                    return retrying.pop(name)
                if name in queues:
                    value = queues[name]
                    value = next(value) if hasattr(value, "__next__") else value
                    if isinstance(value, str) and value.startswith("[["):
                        retrying[name] = value
                        return value
                    return {name: value}
            return {"answer": "Cincinnati"}

        return ScriptedLM(respond)

    return make


@pytest.fixture(scope="session")
def run() -> Callable[..., dspy.Prediction]:
    """``run(program, lm, question=planted_question)``: the program's prediction under ``lm``."""

    def ask(program: Any, lm: ScriptedLM, question: str = _QUESTION) -> dspy.Prediction:
        with dspy.context(lm=lm):
            return program(question=question)

    return ask


@pytest.fixture(scope="session")
def stage_requests() -> Callable[[ScriptedLM, str], list[ScriptedRequest]]:
    """``stage_requests(lm, field)``: the requests ``lm`` received that asked for the output ``field``."""

    def requests(lm: ScriptedLM, field: str) -> list[ScriptedRequest]:
        return [r for r in lm.requests if field in r.output_fields]

    return requests
