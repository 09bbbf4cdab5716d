"""The metrics the papers report, per example, each a float in [0, 1].

Text normalization (:func:`normalize_answer`) is the SQuAD v1.1 evaluation script's, which HotpotQA, ALCE
(ASQA) and DeepNote all reuse: lowercase, delete ASCII punctuation (``string.punctuation``), delete the
words "a", "an" and "the", collapse whitespace. Like the reference, it keeps accents and non-ASCII
punctuation (``"Beyoncé"`` does not match ``"Beyonce"``; a curly apostrophe is kept).

Answer metrics:
    - :func:`exact_match`: normalized prediction equals a normalized gold answer (max over golds).
    - :func:`f1`: SQuAD token-level F1 between normalized prediction and gold, max over golds.
    - :func:`accuracy`: DeepNote's "acc": some normalized gold answer is a substring of the normalized
      prediction (so "Rush" is found in "The band is Rush."; like the reference, "16" is found in "2016").
    - :func:`yes_no_accuracy`: StrategyQA: the first whole-word yes/no label in the prediction is a gold one.
    - :func:`str_em` / :func:`str_hit`: ALCE's ASQA metrics over short-answer groups (one group of aliases per
      disambiguated sub-question): the fraction of groups with an alias that is a substring of the normalized
      output, and 1.0 only when every group is hit.

Retrieval metrics: :func:`retrieval_recall` (fraction of gold passage ids in the top k) and :func:`all_gold`.

Degenerate inputs (chosen so that a mean over examples is never inflated by an example that has nothing to
find): no gold answers, no short-answer groups or no gold passage ids score 0.0. Gold answers or aliases
that normalize to the empty string are ignored by the containment metrics (``accuracy``, ``str_em``,
``str_hit``), since the empty string is contained in every prediction.

DSPy adapters: :func:`score_example` computes every metric a dataset reports; :func:`metric_for` returns the
``metric(example, prediction, trace=None)`` callable optimizers and ``dspy.Evaluate`` take.
"""

from __future__ import annotations

import operator
import re
import string
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ragsuite.errors import DataError

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)
YES_NO_LABELS: tuple[str, ...] = ("yes", "no")


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 normalization: lowercase, drop ASCII punctuation, drop articles, collapse whitespace.

    Example:
        >>> normalize_answer("The  Eiffel-Tower!")
        'eiffeltower'
    """
    text = str(text).lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _golds(answers: Sequence[str] | str) -> list[str]:
    # A bare string is one gold answer, not a sequence of one-character answers.
    if isinstance(answers, str):
        return [answers]
    return [str(a) for a in answers]


def exact_match(prediction: str, answers: Sequence[str]) -> float:
    """1.0 when the normalized prediction equals some normalized gold answer, else 0.0.

    Example:
        >>> exact_match("the Rush", ["Rush"])
        1.0
    """
    pred = normalize_answer(prediction or "")
    return float(any(pred == normalize_answer(gold) for gold in _golds(answers)))


def _f1_single(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        # Both empty is a match; one empty is a miss (the SQuAD 2.0 script's convention).
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1(prediction: str, answers: Sequence[str]) -> float:
    """SQuAD token F1 of the normalized prediction against each gold answer; the best one.

    Example:
        >>> round(f1("Rush band", ["Rush"]), 4)
        0.6667
    """
    return max((_f1_single(prediction or "", gold) for gold in _golds(answers)), default=0.0)


def accuracy(prediction: str, answers: Sequence[str]) -> float:
    """DeepNote's accuracy: 1.0 when some normalized gold answer is a substring of the normalized prediction.

    Normalization is :func:`normalize_answer` on both sides; golds that normalize to "" are ignored.

    Example:
        >>> accuracy("It was released by Rush in 1984.", ["Rush"])
        1.0
    """
    pred = normalize_answer(prediction or "")
    for gold in _golds(answers):
        norm = normalize_answer(gold)
        if norm and norm in pred:
            return 1.0
    return 0.0


def _first_label(prediction: str, labels: Iterable[str]) -> str | None:
    """The label occurring first in ``prediction`` as a whole word (case-insensitive), or None."""
    best: tuple[int, int, str] | None = None
    for label in labels:
        if not label:
            continue
        # Lookarounds instead of \b so labels that start or end with punctuation still match as words.
        pattern = re.compile(r"(?<!\w)" + re.escape(label) + r"(?!\w)", re.IGNORECASE)
        match = pattern.search(prediction)
        if match:
            # Earliest start wins; at the same start the longer label wins.
            key = (match.start(), -len(label), label)
            if best is None or key < best:
                best = key
    return None if best is None else best[2]


def yes_no_accuracy(prediction: str, answers: Sequence[str]) -> float:
    """StrategyQA accuracy: 1.0 when the first whole-word yes/no label in the prediction is a gold one.

    Labels are matched case-insensitively as whole words with regex-escaped patterns, so "Yes, it is" says
    yes, "the answer is no" says no, and "yesterday" or "nobody" say nothing. When the prediction holds both
    labels, the first one is the verdict ("Yes, there is no doubt" says yes). Gold labels other than yes/no
    (e.g. "true") are matched the same way.

    Example:
        >>> yes_no_accuracy("Yes, it is.", ["yes"])
        1.0
        >>> yes_no_accuracy("yesterday", ["yes"])
        0.0
    """
    golds = {gold.strip().lower() for gold in _golds(answers) if gold.strip()}
    if not golds:
        return 0.0
    verdict = _first_label(prediction or "", sorted(golds | set(YES_NO_LABELS)))
    return float(verdict is not None and verdict.lower() in golds)


def _group_hits(prediction: str, short_answer_groups: Sequence[Sequence[str]]) -> list[bool]:
    if isinstance(short_answer_groups, str):
        raise TypeError("short_answer_groups must be a list of alias lists, not a string")
    output = normalize_answer(prediction or "")
    hits = []
    for group in short_answer_groups:
        aliases = [normalize_answer(alias) for alias in _golds(group)]
        hits.append(any(alias and alias in output for alias in aliases))
    return hits


def str_em(prediction: str, short_answer_groups: Sequence[Sequence[str]]) -> float:
    """ALCE STR-EM: the fraction of short-answer groups with some normalized alias in the normalized output.

    Args:
        prediction: The long-form answer.
        short_answer_groups: One list of aliases per disambiguated sub-question (ASQA ``qa_pairs``).

    Example:
        >>> str_em("They won 16 titles by 2017 and 17 by 2020.", [["16", "sixteen"], ["17"], ["18"]])
        0.6666666666666666
    """
    hits = _group_hits(prediction, short_answer_groups)
    return sum(hits) / len(hits) if hits else 0.0


def str_hit(prediction: str, short_answer_groups: Sequence[Sequence[str]]) -> float:
    """ALCE STR-Hit: 1.0 when every short-answer group is hit (see :func:`str_em`), else 0.0."""
    hits = _group_hits(prediction, short_answer_groups)
    return float(bool(hits) and all(hits))


def _as_id(item: Any) -> str:
    # Accept Passage objects as well as bare ids.
    return str(getattr(item, "id", item))


def _top_k(retrieved_ids: Sequence[Any], gold_ids: Iterable[Any], k: int | None) -> tuple[set[str], set[str]]:
    retrieved = list(retrieved_ids)
    if k is not None:
        try:
            # operator.index accepts numpy integers and rejects floats.
            top = -1 if isinstance(k, bool) else operator.index(k)
        except TypeError:
            top = -1
        if top < 0:
            raise ValueError(f"k must be a non-negative integer or None, got {k!r}")
        retrieved = retrieved[:top]
    return {_as_id(item) for item in retrieved}, {_as_id(gold) for gold in gold_ids}


def retrieval_recall(retrieved_ids: Sequence[Any], gold_ids: Iterable[Any], k: int | None) -> float:
    """The fraction of distinct gold passage ids among the first ``k`` retrieved ids (0.0 when no gold).

    ``k=None`` counts every retrieved id; ``k=0`` (nothing retrieved) scores 0.0. Items may be ids or
    :class:`~ragsuite.passages.Passage` objects.

    Example:
        >>> retrieval_recall(["p1", "p9", "p2"], ["p1", "p2"], k=2)
        0.5
    """
    top, gold = _top_k(retrieved_ids, gold_ids, k)
    return len(gold & top) / len(gold) if gold else 0.0


def all_gold(retrieved_ids: Sequence[Any], gold_ids: Iterable[Any], k: int | None) -> float:
    """1.0 when every gold passage id is among the first ``k`` retrieved ids, else 0.0 (0.0 when no gold)."""
    top, gold = _top_k(retrieved_ids, gold_ids, k)
    return float(bool(gold) and gold <= top)


# Metrics scored against ``example.answers`` / against ``example.short_answers``.
ANSWER_METRICS: dict[str, Callable[[str, Sequence[str]], float]] = {
    "exact_match": exact_match,
    "f1": f1,
    "accuracy": accuracy,
    "yes_no_accuracy": yes_no_accuracy,
}
GROUP_METRICS: dict[str, Callable[[str, Sequence[Sequence[str]]], float]] = {
    "str_em": str_em,
    "str_hit": str_hit,
}
# Metrics whose per-example value is always 0.0 or 1.0.
BINARY_METRICS = frozenset({"exact_match", "accuracy", "yes_no_accuracy", "str_hit"})


def _label(example: Any, field: str) -> Any:
    getter = example.get if hasattr(example, "get") else lambda key: getattr(example, key, None)
    value = getter(field)
    if value is None:
        raise DataError(f"example {getter('id') or '?'} has no {field!r} label")
    return value


def score_metric(name: str, example: Any, answer: str) -> float:
    """One named metric of ``answer`` against ``example``'s labels."""
    if name in ANSWER_METRICS:
        return ANSWER_METRICS[name](answer or "", _label(example, "answers"))
    if name in GROUP_METRICS:
        return GROUP_METRICS[name](answer or "", _label(example, "short_answers"))
    raise DataError(
        f"unknown answer metric {name!r}; choose one of: {', '.join([*ANSWER_METRICS, *GROUP_METRICS])}"
    )


def score_example(dataset: str, example: Any, answer: str) -> dict[str, float]:
    """Every metric ``dataset`` reports, for one answer.

    Args:
        dataset: A dataset name (see :func:`ragsuite.data.dataset_names`).
        example: A ``dspy.Example`` (or dict) from :func:`ragsuite.data.load_dataset`.
        answer: The program's answer text.

    Returns:
        ``{metric name: score}`` in the dataset's table order.

    Example:
        >>> import dspy
        >>> ex = dspy.Example(question="q", answers=["Rush"]).with_inputs("question")
        >>> score_example("hotpotqa", ex, "Rush")
        {'accuracy': 1.0, 'f1': 1.0, 'exact_match': 1.0}
    """
    from ragsuite.data.datasets import get_dataset_info

    info = get_dataset_info(dataset)
    return {name: score_metric(name, example, answer) for name in info.metrics}


def _answer_text(prediction: Any) -> str:
    if prediction is None:
        return ""
    if isinstance(prediction, str):
        return prediction
    answer = prediction.get("answer") if hasattr(prediction, "get") else getattr(prediction, "answer", None)
    return "" if answer is None else str(answer)


class DatasetMetric:
    """A DSPy metric for one dataset: ``metric(example, prediction, trace=None)``.

    Returns the metric's float score normally. While an optimizer bootstraps demos (``trace`` is not None)
    it returns a bool: ``score >= threshold``. The default threshold is 1.0 for metrics that are 0/1 per
    example (accuracy, exact match, yes/no accuracy, STR-Hit: only correct answers become demos) and 0.5 for
    the graded ones (F1, STR-EM: at least half the tokens / answer groups right).

    Extra ``pred_name`` / ``pred_trace`` arguments (GEPA's metric signature) are accepted and ignored.

    Args:
        dataset: The dataset whose labels the examples carry.
        metric: Which metric; defaults to the dataset's primary metric.
        threshold: Pass mark under a trace; see above for the default.

    Example:
        >>> metric = DatasetMetric("hotpotqa")
        >>> import dspy
        >>> ex = dspy.Example(question="q", answers=["Rush"]).with_inputs("question")
        >>> metric(ex, dspy.Prediction(answer="Rush"))
        1.0
    """

    def __init__(self, dataset: str, *, metric: str | None = None, threshold: float | None = None) -> None:
        from ragsuite.data.datasets import get_dataset_info

        info = get_dataset_info(dataset)
        name = metric or info.primary_metric
        if name not in ANSWER_METRICS and name not in GROUP_METRICS:
            raise DataError(f"unknown answer metric {name!r} for dataset {dataset!r}")
        self.dataset = info.name
        self.metric = name
        self.threshold = float(threshold if threshold is not None else 1.0 if name in BINARY_METRICS else 0.5)
        self.__name__ = f"{self.dataset}_{name}"

    def __call__(
        self,
        example: Any,
        prediction: Any,
        trace: Any = None,
        pred_name: str | None = None,
        pred_trace: Any = None,
    ) -> float | bool:
        del pred_name, pred_trace
        score = score_metric(self.metric, example, _answer_text(prediction))
        if trace is not None:
            return score >= self.threshold
        return score

    def __repr__(self) -> str:
        return f"DatasetMetric({self.dataset!r}, metric={self.metric!r}, threshold={self.threshold})"


def metric_for(dataset: str, *, metric: str | None = None, threshold: float | None = None) -> DatasetMetric:
    """The DSPy metric of ``dataset``'s primary metric (or ``metric``): see :class:`DatasetMetric`.

    Example:
        >>> metric = metric_for("strategyqa")
        >>> metric.metric
        'yes_no_accuracy'
    """
    return DatasetMetric(dataset, metric=metric, threshold=threshold)
