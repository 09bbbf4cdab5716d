"""Probability-backed decisions: a decision is P(yes) >= threshold (DSPy's Noul outputs with a per-field
threshold), thresholds are knobs in the programs' search spaces, and Optuna finds a planted threshold."""

from __future__ import annotations

from typing import Any, ClassVar

import dspy
import pytest

from ragsuite.errors import ConfigError
from ragsuite.optimizers import tune
from ragsuite.programs.base import RAGProgram
from ragsuite.programs.deepnote import DeepNote
from ragsuite.programs.hanrag import HANRAG
from ragsuite.programs.pipeline import decision_predictor, decision_value
from ragsuite.retrieval.base import Passage
from ragsuite.signatures.hanrag import Filter
from ragsuite.testing.retrievers import ListRetriever
from ragsuite.testing.scripted import ScriptedLM

CORPUS = [Passage(f"p{i}", f"T{i}", f"text {i}") for i in range(40)]


def fresh():
    blocks = iter(range(10))

    def results(query: str, k: int) -> list[str]:
        block = next(blocks)
        return [f"p{block * 5 + j}" for j in range(k)]

    return ListRetriever(CORPUS, results)


def note_world(probabilities: list[float]):
    """A DeepNote LM whose NoteCompare states the given probabilities, step by step."""
    stated = iter(probabilities)

    def respond(request):
        if "better" in request.output_fields:
            return {"better": {"noul": next(stated)}}
        if "queries" in request.output_fields:
            return {"queries": ["q"]}
        if "updated_note" in request.output_fields:
            return {"updated_note": "updated"}
        if "note" in request.output_fields:
            return {"note": "first"}
        return {"answer": "x"}

    return ScriptedLM(respond)


def test_note_compare_accepts_at_or_above_its_threshold():
    program = DeepNote(
        retriever=fresh(), max_step=3, max_failure=3, decisions="probability", compare_threshold=0.75
    )
    lm = note_world([0.7, 0.8, 0.75])
    with dspy.context(lm=lm):
        prediction = program(question="Where?")
    steps = [e for e in prediction.trace if e["stage"] == "step"]
    assert [e["accepted"] for e in steps] == [False, True, True]
    assert [e["better_probability"] for e in steps] == [0.7, 0.8, 0.75]
    compare = next(r for r in lm.requests if "better" in r.output_fields)
    assert "noul" in compare.system  # the LM is asked for a probability, not a yes/no


def test_generate_mode_is_todays_yes_or_no():
    program = DeepNote(retriever=fresh())
    lm = ScriptedLM(
        lambda r: {"better": True} if "better" in r.output_fields else note_world([0.9]).responder(r)
    )
    with dspy.context(lm=lm):
        prediction = program(question="Where?")
    compare = next(r for r in lm.requests if "better" in r.output_fields)
    assert "noul" not in compare.system
    assert all("better_probability" not in e for e in prediction.trace)


def test_end_check_and_filter_thresholds():
    relevant = {"p0": 0.9, "p1": 0.6, "p2": 0.4}

    def respond(request):
        if "relevant" in request.output_fields:
            pid = next(p for p in relevant if f"text {p[1:]}" in request.inputs["passage"])
            return {"relevant": {"noul": relevant[pid]}}
        return {"answer": "x"}

    for threshold, kept in ((0.5, ["p0", "p1"]), (0.7, ["p0"])):
        program = HANRAG(
            retriever=ListRetriever(CORPUS, default=["p0", "p1", "p2"]),
            decisions="probability",
            filter_threshold=threshold,
        )
        with dspy.context(lm=ScriptedLM(respond)):
            ledger = program.start("q")
            assert [p.id for p in program.filter(program, ledger, "q", CORPUS[:3])] == kept


def test_bad_thresholds_are_refused():
    with pytest.raises(ConfigError, match="probability between 0 and 1"):
        DeepNote(retriever=fresh(), compare_threshold=1.5)
    with pytest.raises(ConfigError, match="decisions must be"):
        HANRAG(retriever=fresh(), decisions="sometimes")


def test_thresholds_are_in_the_search_spaces():
    import optuna

    for cls, names in (
        (DeepNote, {"decisions", "compare_threshold"}),
        (HANRAG, {"filter_threshold", "end_threshold"}),
    ):
        study = optuna.create_study()
        # HANRAG's filter threshold is suggested where its filter uses it: per passage, probability-backed.
        study.enqueue_trial({"filter_mode": "per_passage", "decisions": "probability"})
        knobs = cls.search_space(study.ask())
        assert names <= set(knobs)
        assert all(0.05 <= knobs[n] <= 0.95 for n in names if n.endswith("threshold"))


# ----------------------------------------------------------------------------- a planted threshold
class RelevanceGate(RAGProgram):
    """One probability-backed relevance decision per passage; answers from what it keeps."""

    name: ClassVar[str] = "relevance-gate"
    KNOBS: ClassVar[tuple[str, ...]] = ("threshold",)

    def __init__(self, *, retriever: Any = None, task: str = "short", threshold: float = 0.5) -> None:
        super().__init__(retriever=retriever, task=task)
        self.threshold = threshold
        self.judge = decision_predictor(Filter, "relevant", mode="probability", threshold=threshold)

    @classmethod
    def search_space(cls, trial: Any) -> dict[str, Any]:
        return {"threshold": trial.suggest_float("threshold", 0.05, 0.95)}

    def forward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        kept = []
        for passage in self.retrieve(ledger, question, 4):
            verdict = self.call_stage(
                ledger, "judge", self.judge, question=question, passage=passage.render()
            )
            if decision_value(verdict, "relevant")[0]:
                kept.append(passage)
        ledger.count_step()
        answer = "gold" if kept and all(p.id.startswith("gold") for p in kept) else "wrong"
        return self.finish(ledger, answer, kept)


def test_tuning_finds_a_planted_threshold(tmp_path):
    """Gold passages get P(relevant) = 0.8, distractors 0.65: only thresholds in (0.65, 0.8] answer right."""
    passages = [Passage("gold-a", "A", "gold a"), Passage("gold-b", "B", "gold b")]
    passages += [Passage("noise-a", "C", "noise a"), Passage("noise-b", "D", "noise b")]
    retriever = ListRetriever(passages, default=[p.id for p in passages])

    def respond(request):
        return {"relevant": {"noul": 0.8 if "gold" in request.inputs["passage"] else 0.65}}

    examples = [
        dspy.Example(id=f"q{i}", question=f"question {i}?", answers=["gold"]).with_inputs("question")
        for i in range(3)
    ]
    result = tune(
        RelevanceGate,
        dataset="hotpotqa",
        valset=examples,
        retriever=retriever,
        lm=ScriptedLM(respond),
        trials=20,
        out_dir=tmp_path,
        seed=0,
        threads=1,
    )
    best = result.best_knobs["threshold"]
    assert 0.65 < best <= 0.8, best
    assert result.study.best_value == 1.0
    default = next(t for t in result.study.trials if t.number == 0)
    assert default.params["threshold"] == 0.5 and default.values[0] == 0.0  # the default keeps the noise


# ----------------------------------------------------------------------------- HANRAG's weighted route
ROUTE_PROBABILITIES = {"straightforward": 0.1, "single-step": 0.45, "compound": 0.15, "complex": 0.3}


def route_world(route_reply: Any = None):
    """Every HANRAG stage answered; the router states ROUTE_PROBABILITIES (or ``route_reply``)."""

    def respond(request):
        fields = request.output_fields
        if "category" in fields:
            if route_reply is not None:
                return route_reply
            return {"category": {"probabilities": ROUTE_PROBABILITIES, "confidence": 0.5}}
        if "sub_questions" in fields:
            return {"sub_questions": ["a?", "b?"]}
        if "seed_question" in fields:
            return {"seed_question": "seed?"}
        if "enough" in fields:
            return {"enough": {"noul": 0.9}} if "noul" in request.system else {"enough": True}
        if "relevant" in fields:
            return {"relevant": {"noul": 0.9}} if "noul" in request.system else {"relevant": True}
        return {"answer": "x"}

    return ScriptedLM(respond)


@pytest.mark.parametrize(
    "weights",
    [
        {},
        {"complex": 2.0},
        {"single-step": 0.5, "complex": 0.8},
        {"single-step": 0.2, "complex": 0.2, "compound": 1.0},
        {"straightforward": 5.0},
    ],
)
def test_route_is_the_weighted_argmax_of_the_stated_probabilities(weights):
    full = {route: weights.get(route, 1.0) for route in ROUTE_PROBABILITIES}
    expected = max(ROUTE_PROBABILITIES, key=lambda r: full[r] * ROUTE_PROBABILITIES[r])
    knobs = {f"route_weight_{r.replace('-', '_')}": w for r, w in weights.items()}
    program = HANRAG(retriever=fresh(), decisions="probability", max_hops=1, **knobs)
    lm = route_world()
    with dspy.context(lm=lm):
        prediction = program(question="Which?")
    assert prediction.route == expected
    event = next(e for e in prediction.trace if e["stage"] == "route")
    assert event["weights_applied"] is True
    assert event["probabilities"] == ROUTE_PROBABILITIES
    assert event["weights"] == full
    routed = next(r for r in lm.requests if "category" in r.output_fields)
    assert "probabilities" in routed.system  # the LM is asked for a probability per route


def test_planted_weights_change_the_route():
    """Equal weights take the LM's most probable route; a weight moves it, as weight x probability says."""
    routes = {}
    for weight in (1.0, 1.4, 1.6):
        program = HANRAG(retriever=fresh(), decisions="probability", max_hops=1, route_weight_complex=weight)
        with dspy.context(lm=route_world()):
            routes[weight] = program(question="Which?").route
    # 0.3 x 1.4 = 0.42 < 0.45 (single-step) < 0.3 x 1.6 = 0.48
    assert routes == {1.0: "single-step", 1.4: "single-step", 1.6: "complex"}


def test_without_probabilities_the_generated_route_is_used():
    program = HANRAG(retriever=fresh(), max_hops=1, route_weight_complex=3.0)
    lm = route_world({"category": "compound"})
    with dspy.context(lm=lm):
        prediction = program(question="Which?")
    assert prediction.route == "compound"
    event = next(e for e in prediction.trace if e["stage"] == "route")
    assert event["weights_applied"] is False and "probabilities" not in event
    assert "probabilities" not in next(r for r in lm.requests if "category" in r.output_fields).system
    # The paper's plain router with default weights traces as before.
    with dspy.context(lm=route_world({"category": "compound"})):
        plain = HANRAG(retriever=fresh(), max_hops=1)(question="Which?")
    assert next(e for e in plain.trace if e["stage"] == "route") == {"stage": "route", "category": "compound"}
    # A reply without probabilities in probability mode: the named type, marked as unweighted.
    program = HANRAG(retriever=fresh(), decisions="probability", max_hops=1, route_weight_compound=0.1)
    with dspy.context(lm=route_world("[[ ## category ## ]]\ncomplex question\n\n[[ ## completed ## ]]")):
        salvaged = program(question="Which?")
    event = next(e for e in salvaged.trace if e["stage"] == "route")
    assert salvaged.route == "complex"
    assert event["weights_applied"] is False and event.get("salvaged") is True


def test_bad_route_weights_are_refused():
    with pytest.raises(ConfigError, match="route_weight_complex must be a number >= 0"):
        HANRAG(retriever=fresh(), route_weight_complex=-1)
    with pytest.raises(ConfigError, match="at least one route_weight"):
        HANRAG(retriever=fresh(), **{f"route_weight_{r}": 0.0 for r in ROUTE_KNOB_SUFFIXES})


ROUTE_KNOB_SUFFIXES = ("straightforward", "single_step", "compound", "complex")


def test_route_weights_are_knobs_saved_and_searched(tmp_path):
    import optuna

    from ragsuite.optimizers import load_program, save_program

    knobs = HANRAG.search_space(optuna.create_study().ask())
    for suffix in ROUTE_KNOB_SUFFIXES:
        assert 0.25 <= knobs[f"route_weight_{suffix}"] <= 4.0
        assert HANRAG.default_knobs()[f"route_weight_{suffix}"] == 1.0
    program = HANRAG(retriever=fresh(), decisions="probability", route_weight_complex=0.6)
    path = save_program(program, tmp_path / "hanrag.json")
    loaded = load_program(path, retriever=fresh())
    assert loaded.route_weight_complex == 0.6
    assert loaded.route.fields["category"]["weights"]["complex"] == 0.6


def test_saved_thresholds_reach_the_loaded_predictors(tmp_path):
    from ragsuite.optimizers import load_program, save_program

    program = HANRAG(retriever=fresh(), decisions="probability", filter_threshold=0.7, end_threshold=0.3)
    loaded = load_program(save_program(program, tmp_path / "h.json"), retriever=fresh())
    assert loaded.filter.per_passage.fields["relevant"]["threshold"] == 0.7
    assert loaded.end_check.fields["enough"]["threshold"] == 0.3


@pytest.mark.parametrize(
    ("probabilities", "reason"),
    [
        ({"simple": 1.0}, "failed to parse"),
        (
            {"straightforward": 0.0, "single-step": 0.0, "compound": 0.0, "complex": 0.0},
            "Invalid Choice answer",
        ),
        ({"straightforward": 0.0, "single-step": 1.0, "compound": 0.0, "complex": 0.0}, "no positive"),
    ],
)
def test_a_distribution_the_router_cannot_choose_from_falls_back(probabilities, reason):
    """Unknown labels, no mass at all, or all of it on a route weighted 0: the fallback route, recorded, not a
    crash."""
    program = HANRAG(retriever=fresh(), decisions="probability", max_hops=1, route_weight_single_step=0.0)
    with dspy.context(lm=route_world({"category": {"probabilities": probabilities, "confidence": 0.5}})):
        prediction = program(question="Which?")
    assert prediction.route == "single-step"
    assert prediction.stats["fallbacks"] == 1
    fallback, event = [e for e in prediction.trace if e["stage"] == "route"]
    assert fallback["fallback"] == {"category": "single-step"} and reason in fallback["reason"]
    assert event["weights_applied"] is False
