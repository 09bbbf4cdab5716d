"""``compile --optimizer reanchor``: DSPy's ReAnchor fits a program's decision knobs on the train slice, and
the fitted values come back as knobs (saved in program files). A scripted world plants the best threshold."""

from __future__ import annotations

import dspy
import pytest

from ragsuite.errors import ConfigError
from ragsuite.optimizers import compile_program, load_program, save_program
from ragsuite.programs.deepnote import DeepNote
from ragsuite.programs.hanrag import HANRAG
from ragsuite.retrieval.base import Passage
from ragsuite.testing.retrievers import ListRetriever
from ragsuite.testing.scripted import ScriptedLM

PASSAGES = [
    Passage("gold-a", "A", "gold fact a"),
    Passage("noise-a", "C", "noise a"),
    Passage("gold-b", "B", "gold fact b"),
    Passage("noise-b", "D", "noise b"),
]
#: The relevance probabilities the filter states: only a threshold in (0.65, 0.75] keeps gold alone.
GOLD, NOISE = 0.75, 0.65


def world() -> ScriptedLM:
    """HANRAG routes single-step; the answer is right only when every passage it is shown is gold."""

    def respond(request):
        fields = request.output_fields
        if "category" in fields:
            probabilities = {"straightforward": 0.05, "single-step": 0.8, "compound": 0.05, "complex": 0.1}
            return {"category": {"probabilities": probabilities, "confidence": 0.8}}
        if "relevant" in fields:
            return {"relevant": {"noul": GOLD if "gold" in request.inputs["passage"] else NOISE}}
        if "enough" in fields:
            return {"enough": {"noul": 0.9}}
        shown = request.inputs.get("passages", "")
        return {"answer": "gold" if "gold" in shown and "noise" not in shown else "wrong"}

    return ScriptedLM(respond)


def examples(n: int) -> list[dspy.Example]:
    return [
        dspy.Example(id=f"q{i}", question=f"question {i}?", answers=["gold"]).with_inputs("question")
        for i in range(n)
    ]


def hanrag(**knobs) -> HANRAG:
    return HANRAG(
        retriever=ListRetriever(PASSAGES, default=[p.id for p in PASSAGES]),
        top_k=4,
        keep=4,
        decisions="probability",
        **knobs,
    )


def test_reanchor_finds_the_planted_threshold(tmp_path):
    program = hanrag()
    lm = world()
    with dspy.context(lm=lm):
        compiled = compile_program(
            program,
            examples(6),
            examples(3),
            optimizer="reanchor",
            dataset="hotpotqa",
            threads=1,
            require_cache=False,
        )
        answer = compiled(question="question 9?").answer
    assert NOISE < compiled.filter_threshold <= GOLD, compiled.filter_threshold
    assert compiled.filter.per_passage.fields["relevant"]["threshold"] == compiled.filter_threshold
    assert program.filter_threshold == 0.5  # the student is left as it was
    assert answer == "gold"
    fitted = compiled.optimization["fitted"]
    assert fitted["filter_threshold"] == compiled.filter_threshold
    assert compiled.optimization["optimizer"] == "reanchor"
    assert compiled.optimization["train_score_before"] == 0.0 and compiled.optimization["train_score"] == 1.0
    # The fitted threshold is a knob: saved and rebuilt from the file.
    loaded = load_program(save_program(compiled, tmp_path / "fitted.json"), retriever=program.retriever)
    assert loaded.filter_threshold == compiled.filter_threshold
    assert loaded.filter.per_passage.fields["relevant"]["threshold"] == compiled.filter_threshold
    with dspy.context(lm=world()):
        assert loaded(question="question 7?").answer == "gold"


def test_reanchor_needs_probability_backed_decisions():
    with pytest.raises(ConfigError, match="decisions=probability"):
        compile_program(
            HANRAG(retriever=ListRetriever(PASSAGES)), examples(2), optimizer="reanchor", dataset="hotpotqa"
        )
    from ragsuite.programs.baselines import VanillaRAG

    with pytest.raises(ConfigError, match="no decision thresholds"):
        compile_program(
            VanillaRAG(retriever=ListRetriever(PASSAGES)),
            examples(2),
            optimizer="reanchor",
            dataset="hotpotqa",
        )


def test_decision_knobs_point_at_the_predictors_settings():
    program = hanrag(filter_threshold=0.6, route_weight_complex=0.5)
    knobs = {name: where.read() for name, where in program.decision_knobs().items()}
    assert knobs["filter_threshold"] == 0.6 and knobs["route_weight_complex"] == 0.5
    assert knobs["end_threshold"] == 0.5 and knobs["route_weight_single_step"] == 1.0
    assert hanrag(filter_mode="batch").decision_knobs().keys() == knobs.keys() - {"filter_threshold"}
    assert HANRAG(retriever=ListRetriever(PASSAGES)).decision_knobs() == {}
    deepnote = DeepNote(retriever=ListRetriever(PASSAGES), decisions="probability", compare_threshold=0.4)
    assert {k: v.read() for k, v in deepnote.decision_knobs().items()} == {"compare_threshold": 0.4}


@pytest.mark.slow
def test_cli_compile_reanchor_saves_the_fitted_knobs(tmp_path, capsys):
    import json

    from ragsuite.cli import main
    from ragsuite.data.datasets import load_dataset
    from ragsuite.testing.openai_server import LocalOpenAIServer
    from ragsuite.testing.responders import grounded_responder

    grounded = grounded_responder({ex.question: ex.answers[0] for ex in load_dataset("hotpotqa")})

    def respond(request):
        if "category" in request.output_fields:
            probabilities = {"straightforward": 0.1, "single-step": 0.6, "compound": 0.1, "complex": 0.2}
            return {"category": {"probabilities": probabilities, "confidence": 0.6}}
        return grounded(request)

    out = tmp_path / "hanrag.json"
    with LocalOpenAIServer(respond) as server:
        code = main(
            [
                "compile",
                "--program",
                "hanrag",
                "--dataset",
                "hotpotqa",
                "--optimizer",
                "reanchor",
                "--train",
                "3",
                "--val",
                "2",
                "--threads",
                "2",
                "--no-progress",
                "--set",
                "decisions=probability",
                "--set",
                "top_k=5",
                "--set",
                "keep=2",
                "--set",
                "max_hops=1",
                "--option",
                "require_cache=false",
                "--out",
                str(out),
                "--lm",
                "openai/scripted",
                "--api-base",
                server.api_base,
                "--no-cache",
            ]
        )
    assert code == 0
    saved = json.loads(out.read_text())
    assert saved["metadata"]["optimizer"] == "reanchor"
    fitted = saved["metadata"]["fitted"]
    assert set(fitted) == {"filter_threshold", "end_threshold"} | {
        f"route_weight_{r}" for r in ("straightforward", "single_step", "compound", "complex")
    }
    assert all(saved["knobs"][knob] == value for knob, value in fitted.items())
    assert "fitted knobs: " in capsys.readouterr().out
