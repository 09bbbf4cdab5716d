"""Metrics on hand-computed cases."""

from __future__ import annotations

import dspy
import pytest

from ragsuite.data.metrics import (
    DatasetMetric,
    accuracy,
    all_gold,
    exact_match,
    f1,
    metric_for,
    normalize_answer,
    retrieval_recall,
    score_example,
    str_em,
    str_hit,
    yes_no_accuracy,
)
from ragsuite.errors import DataError
from ragsuite.retrieval.base import Passage


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The Beatles", "beatles"),
        ("A  tale of an apple", "tale of apple"),
        ("Theater", "theater"),  # "the" only as a whole word
        ("U.S.A.!", "usa"),
        ("  rock\t'n'\nroll ", "rock n roll"),
        ("Café ÉCLAIR", "café éclair"),  # unicode lowercased, accents kept
        ("Cassini’s Division", "cassini’s division"),  # non-ASCII punctuation kept, as in SQuAD
        ("", ""),
    ],
)
def test_normalize_answer(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


def test_exact_match_articles_punctuation_and_several_golds() -> None:
    assert exact_match("the Rush.", ["Rush"]) == 1.0
    assert exact_match("Rush band", ["Rush"]) == 0.0
    assert exact_match("Spurs", ["Tottenham", "spurs"]) == 1.0
    assert exact_match("Beyonce", ["Beyoncé"]) == 0.0
    assert exact_match("BEYONCÉ", ["Beyoncé"]) == 1.0
    assert exact_match("", ["Rush"]) == 0.0
    assert exact_match("Rush", []) == 0.0
    # A bare string is one gold answer, not a list of characters.
    assert exact_match("R", "Rush") == 0.0
    assert exact_match("Rush", "Rush") == 1.0


def test_f1_hand_computed() -> None:
    # pred tokens [rush, band], gold [rush]: p = 1/2, r = 1 -> 2/3
    assert f1("Rush band", ["Rush"]) == pytest.approx(2 / 3)
    # pred [new, york, city], gold [new, york]: p = 2/3, r = 1 -> 0.8; max over golds
    assert f1("New York City", ["Boston", "the New York"]) == pytest.approx(0.8)
    # repeated tokens count once per occurrence: pred [a_, a_] vs gold [a_] -> p 1/2, r 1
    assert f1("paris paris", ["Paris"]) == pytest.approx(2 / 3)
    assert f1("London", ["Paris"]) == 0.0
    assert f1("", ["Paris"]) == 0.0
    assert f1("the", ["a"]) == 1.0  # both normalize to nothing
    assert f1("Paris", []) == 0.0


def test_accuracy_is_containment_after_normalization() -> None:
    assert accuracy("The band was Rush, from Canada.", ["Rush"]) == 1.0
    assert accuracy("It was The Who", ["the who"]) == 1.0
    assert accuracy("Stettin (now Szczecin)", ["Szczecin", "Stettin"]) == 1.0
    assert accuracy("rus", ["Rush"]) == 0.0
    assert accuracy("In 2016.", ["16"]) == 1.0  # substring, as in the reference definition
    assert accuracy("", ["Rush"]) == 0.0
    # A gold that normalizes to nothing would be contained everywhere: ignored.
    assert accuracy("anything", ["the", "!!"]) == 0.0
    assert accuracy("anything", []) == 0.0


def test_regex_metacharacters_are_literal() -> None:
    assert exact_match("C++", ["c++"]) == 1.0  # both normalize to "c"
    assert accuracy("written in c++ mostly", ["C++"]) == 1.0
    assert accuracy("price (USD) $5", ["$5"]) == 1.0
    assert accuracy("axxb", ["a.*b"]) == 0.0  # as a regex it would match
    assert accuracy("axxb", ["a.*b", "[xy]"]) == 0.0
    assert yes_no_accuracy("the label is c++ here", ["c++"]) == 1.0
    assert yes_no_accuracy("the label is c here", ["c++"]) == 0.0
    assert yes_no_accuracy("answer: (yes)", ["(yes)"]) == 1.0
    assert str_em("the value is .* maybe", [[".*x"]]) == 0.0


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("Yes", "yes", 1.0),
        ("Yes, it is", "yes", 1.0),
        ("yes.", "yes", 1.0),
        ("YES!", "yes", 1.0),
        ("the answer is no", "no", 1.0),
        ("the answer is no", "yes", 0.0),
        ("No.", "no", 1.0),
        ("yesterday it rained", "yes", 0.0),
        ("nobody knows", "no", 0.0),
        ("eyes", "yes", 0.0),
        ("Yes, there is no doubt", "yes", 1.0),  # first label is the verdict
        ("No; yes would be wrong", "yes", 0.0),
        ("", "yes", 0.0),
        ("I cannot tell", "no", 0.0),
        ("yes", "", 0.0),
        (" Yes ", " YES ", 1.0),
    ],
)
def test_yes_no_accuracy(prediction: str, gold: str, expected: float) -> None:
    assert yes_no_accuracy(prediction, [gold]) == expected


# The first ASQA dev question, with the groups extended by hand.
LAKERS = [["16", "sixteen"], ["17th", "17"], ["Boston Celtics"]]


def test_str_em_and_str_hit_asqa_groups() -> None:
    full = "The Lakers won 16 titles by 2017 and their 17th in 2020, tying the Boston Celtics."
    assert str_em(full, LAKERS) == 1.0
    assert str_hit(full, LAKERS) == 1.0
    partial = "They have won sixteen championships; the 17th came in 2020."
    assert str_em(partial, LAKERS) == pytest.approx(2 / 3)
    assert str_hit(partial, LAKERS) == 0.0
    assert str_em("No idea.", LAKERS) == 0.0
    assert str_em("", LAKERS) == 0.0
    # Normalization applies to both sides: articles and punctuation do not matter.
    assert str_em("the boston-celtics", [["Boston Celtics", "The Boston celtics"]]) == 0.0
    assert str_em("the boston celtics!", [["The Boston Celtics"]]) == 1.0
    # Duplicate groups each count (ASQA repeats groups when annotators agree).
    assert str_em("16", [["16"], ["16"], ["17"]]) == pytest.approx(2 / 3)
    # Degenerate: no groups, or aliases that normalize to nothing.
    assert str_em("anything", []) == 0.0
    assert str_hit("anything", []) == 0.0
    assert str_em("anything", [["the"], ["anything"]]) == 0.5
    with pytest.raises(TypeError):
        str_em("x", "x")


def test_retrieval_recall_and_all_gold() -> None:
    ranked = ["p3", "p1", "p7", "p2", "p9"]
    assert retrieval_recall(ranked, ["p1", "p2"], k=2) == 0.5
    assert retrieval_recall(ranked, ["p1", "p2"], k=4) == 1.0
    assert retrieval_recall(ranked, ["p1", "p2", "p5"], k=5) == pytest.approx(2 / 3)
    assert retrieval_recall(ranked, ["p1", "p1"], k=2) == 1.0  # distinct gold ids
    assert all_gold(ranked, ["p1", "p2"], k=3) == 0.0
    assert all_gold(ranked, ["p1", "p2"], k=4) == 1.0
    assert retrieval_recall([], ["p1"], k=5) == 0.0
    assert retrieval_recall(ranked, [], k=5) == 0.0  # nothing to find: not counted as found
    assert all_gold(ranked, [], k=5) == 0.0
    passages = [Passage(id="p1", title="", text="x"), Passage(id="p2", title="", text="y")]
    assert retrieval_recall(passages, ["p2"], k=2) == 1.0
    assert retrieval_recall(ranked, ["p2"], k=None) == 1.0  # None: every retrieved id
    assert retrieval_recall([], ["p1"], k=0) == 0.0  # an empty retrieval scored at k=len(retrieved)
    assert all_gold(ranked, ["p1"], k=0) == 0.0
    for bad_k in (-1, 2.5, True):
        with pytest.raises(ValueError):
            retrieval_recall(ranked, ["p1"], k=bad_k)


def _ex(**labels) -> dspy.Example:
    return dspy.Example(question="q", **labels).with_inputs("question")


def test_score_example_uses_each_datasets_metrics() -> None:
    # "answer is rush" vs "rush": precision 1/3, recall 1 -> F1 0.5
    hotpot = score_example("hotpotqa", _ex(answers=["Rush"]), "The answer is Rush")
    assert hotpot == {"accuracy": 1.0, "f1": pytest.approx(0.5), "exact_match": 0.0}
    assert list(score_example("nq", _ex(answers=["x"]), "x")) == ["exact_match", "accuracy", "f1"]
    assert score_example("strategyqa", _ex(answers=["no"]), "No, it cannot.") == {"yes_no_accuracy": 1.0}
    asqa = score_example("asqa", _ex(answers=["long"], short_answers=LAKERS), "16 and 17")
    assert asqa == {"str_em": pytest.approx(2 / 3), "str_hit": 0.0}
    for value in [*hotpot.values(), *asqa.values()]:
        assert 0.0 <= value <= 1.0
    with pytest.raises(DataError, match="short_answers"):
        score_example("asqa", _ex(answers=["long"]), "16")
    with pytest.raises(DataError, match="unknown dataset"):
        score_example("nope", _ex(answers=["x"]), "x")


def test_metric_for_float_and_bool_under_trace() -> None:
    metric = metric_for("hotpotqa")
    assert isinstance(metric, DatasetMetric) and metric.metric == "accuracy" and metric.threshold == 1.0
    ex = _ex(answers=["Rush"])
    assert metric(ex, dspy.Prediction(answer="Rush, a band")) == 1.0
    assert metric(ex, dspy.Prediction(answer="Yes")) == 0.0
    assert metric(ex, dspy.Prediction(answer="Rush"), trace=[]) is True
    assert metric(ex, dspy.Prediction(answer="Toto"), trace=[]) is False
    assert metric(ex, "Rush") == 1.0  # a bare string answer is accepted
    assert metric(ex, dspy.Prediction(answer=None)) == 0.0
    # GEPA's five-argument call.
    assert metric(ex, dspy.Prediction(answer="Rush"), None, "answer", None) == 1.0

    asqa = metric_for("asqa")
    assert asqa.metric == "str_em" and asqa.threshold == 0.5
    ex = _ex(answers=["long"], short_answers=[["16"], ["17"], ["18"]])
    assert asqa(ex, dspy.Prediction(answer="16 and 17")) == pytest.approx(2 / 3)
    assert asqa(ex, dspy.Prediction(answer="16 and 17"), trace=[]) is True
    assert asqa(ex, dspy.Prediction(answer="16"), trace=[]) is False

    f1_metric = metric_for("nq", metric="f1", threshold=0.9)
    assert f1_metric(_ex(answers=["New York"]), dspy.Prediction(answer="New York City"), trace=[]) is False
    assert metric_for("strategyqa").__name__ == "strategyqa_yes_no_accuracy"
    with pytest.raises(DataError):
        metric_for("hotpotqa", metric="bleu")


def test_metric_works_with_dspy_evaluate() -> None:
    examples = [_ex(answers=["Rush"]), _ex(answers=["Toto"])]

    class Fixed(dspy.Module):
        def forward(self, question: str) -> dspy.Prediction:
            return dspy.Prediction(answer="Rush")

    result = dspy.Evaluate(devset=examples, metric=metric_for("hotpotqa"), display_progress=False)(Fixed())
    assert result.score == pytest.approx(50.0)
