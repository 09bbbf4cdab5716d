"""Every registered program answers questions of every dataset with a scripted LM and an in-memory
retriever: the registry, the task-specific answer styles and the Prediction contract, end to end."""

from __future__ import annotations

import dspy
import pytest

from ragsuite import programs
from ragsuite.data.datasets import dataset_names, get_dataset_info, load_corpus, load_dataset
from ragsuite.lm import build_lm
from ragsuite.retrieval.base import Passage
from ragsuite.testing import ScriptedLM
from ragsuite.testing.openai_server import LocalOpenAIServer
from ragsuite.testing.responders import grounded_responder
from ragsuite.testing.retrievers import KeywordRetriever

EXPECTED = {
    "no-retrieval",
    "vanilla",
    "deepnote",
    "adaptive-note",
    "hanrag",
    "blendfilter",
    "diverse-rerank",
    "ircot",
    "adaptive-rag",
    "con",
    "rat",
    "deepnote-no-adaptive",
    "deepnote-no-adaptive-no-note",
    "react",
    "hanrag-oracle",
    "adaptive-retrieval",
    "flare-instruct",
    "flare-direct",
    "self-rag-prompted",
    "self-rag",
}


def test_registry_lists_every_program() -> None:
    assert set(programs.names()) == EXPECTED
    assert {n for n in EXPECTED if programs.get(n).NEEDS_LOGPROBS} == {"flare-direct", "self-rag"}
    for name in EXPECTED:
        cls = programs.get(name)
        assert cls.name == name
        assert set(cls.default_knobs()) == set(cls.KNOBS)
    with pytest.raises(ValueError, match="unknown program"):
        programs.get("deep-note")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_program_answers_every_datasets_questions(name: str, data_dir) -> None:
    cls = programs.get(name)
    for dataset in dataset_names():
        info = get_dataset_info(dataset)
        corpus = load_corpus(dataset if info.has_corpus else "nq", data_dir)[:300]
        examples = load_dataset(dataset, data_dir=data_dir)[:2]
        responder = grounded_responder({ex.question: ex.answers[0] for ex in examples})
        # Programs that read token log probabilities run against the local OpenAI-compatible server (whose
        # replies carry them) rather than the in-process scripted LM (which has none).
        server = LocalOpenAIServer(responder).start() if cls.NEEDS_LOGPROBS else None
        try:
            if server is not None:
                lm = build_lm("openai/scripted", api_base=server.api_base, cache=False, retries=0)
            else:
                lm = ScriptedLM(responder)
            program = cls(retriever=KeywordRetriever(corpus), task=info.task)
            counted = 0
            for example in examples:
                with dspy.context(lm=lm):
                    prediction = program(question=example.question)
                context = (name, dataset, example.question)
                assert isinstance(prediction.answer, str) and prediction.answer, context
                if info.task == "yesno":
                    assert prediction.answer in ("yes", "no"), context
                elif info.task == "short":
                    # The grounded LM answers the gold only when the evidence shown contains it.
                    assert prediction.answer in (example.answers[0], "unknown"), context
                stats = prediction.stats
                assert stats["fallbacks"] == 0, (context, prediction.trace)
                counted += stats["lm_calls"]
                if name == "no-retrieval":
                    assert stats["retrievals"] == 0 and not prediction.passages
                else:
                    assert stats["retrievals"] >= 1 and stats["unique_passages"] >= 1, context
                assert all(isinstance(p, Passage) for p in prediction.passages)
                assert prediction.trace and prediction.trace[-1]["stage"] == "answer", context
            # Every reply parsed, so the ledger's LM calls are exactly the requests the LM received.
            received = len(server.requests if server is not None else lm.requests)
        finally:
            if server is not None:
                server.stop()
        assert counted == received, (name, dataset)
