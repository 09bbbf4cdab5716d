"""The pipeline steps programs share: validating knobs, retrieving with a trace event, gathering (and
optionally blending and filtering) a first retrieval, merging ranked lists, and answering with the task's
fallbacks. Each program module then reads as its method alone.

The steps are coroutines (``arun_answer``, ``agather``, ...), awaited by the programs' ``aforward``; the
plain names run them synchronously (see :mod:`ragsuite.aio`)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

import dspy
from dspy.utils.exceptions import AdapterParseError

from ragsuite.aio import invoke, run_sync
from ragsuite.errors import ConfigError
from ragsuite.programs.base import RAGProgram, RunLedger
from ragsuite.retrieval.base import Passage, Retriever

logger = logging.getLogger("ragsuite.programs.pipeline")

#: What the answer stage yields when the LM's reply cannot be parsed: an empty answer (scored as wrong).
ANSWER_FALLBACK: dict[str, Any] = {"answer": ""}

#: DeepNote's official code caps a retrieval query at 500 characters; DeepNote's step queries and
#: :func:`~ragsuite.programs.stages.join_query` keep that cap.
MAX_QUERY_CHARS = 500


def check_int(name: str, value: Any, *, minimum: int) -> int:
    """Validate an integer knob (``bool`` is refused even though it is an ``int``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, not {value!r}")
    return value


#: How a program takes its yes/no decisions: the LM's word (``generate``), or DSPy's probability-backed
#: decision outputs (``probability``: the LM states P(yes) and the decision is ``P >= threshold``).
DecisionMode = Literal["generate", "probability"]
#: The decision modes, in the order the knobs and their search spaces list them.
DECISION_MODES: tuple[str, ...] = ("generate", "probability")


def check_decisions(value: Any) -> DecisionMode:
    if value not in DECISION_MODES:
        raise ConfigError(f"decisions must be 'generate' or 'probability', not {value!r}")
    return value


def check_threshold(name: str, value: Any) -> float:
    """Validate a decision threshold: a probability in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"{name} must be a probability between 0 and 1, not {value!r}")
    return float(value)


def decision_predictor(signature: Any, field: str, *, mode: DecisionMode, threshold: float) -> dspy.Predict:
    """A predictor for one yes/no decision: the plain boolean output in ``generate`` mode, else DSPy's
    probability-backed decision (``Noul``): the LM states the probability that the answer is yes, and the
    decision is ``probability >= threshold`` (a per-field threshold in ``Predict``)."""
    if mode == "generate":
        return dspy.Predict(signature)
    from dspy.adapters.types.decision import Noul

    predictor = dspy.Predict(signature.with_updated_fields(field, type_=Noul))
    predictor.fields = {field: {"threshold": threshold}}
    return predictor


def check_weight(name: str, value: Any) -> float:
    """Validate a choice weight: a finite number >= 0 (0 never picks the option)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0.0 <= float(value) < float("inf")
    ):
        raise ConfigError(f"{name} must be a number >= 0, not {value!r}")
    return float(value)


def choice_predictor(
    signature: Any, field: str, *, mode: DecisionMode, weights: dict[str, float]
) -> dspy.Predict:
    """A predictor for one categorical decision over a ``Literal`` output: the generated option in
    ``generate`` mode, else DSPy's probability-backed choice (``Choice``): the LM states a probability per
    option and the choice is the option with the largest ``weight * probability`` (per-option weights of the
    ``Predict``; equal weights pick the LM's most probable option).

    Example:
        >>> from ragsuite.signatures.hanrag import Route
        >>> route = choice_predictor(Route, "category", mode="probability", weights={"complex": 0.5})
        >>> route.fields["category"]["weights"]["complex"]
        0.5
    """
    if mode == "generate":
        return dspy.Predict(signature)
    from typing import get_args

    from dspy.adapters.types.decision import Choice

    labels = get_args(signature.output_fields[field].annotation)
    if not labels:
        raise ConfigError(f"the {field!r} output must be a Literal of options for a weighted choice")
    unknown = set(weights) - set(labels)
    if unknown:
        raise ConfigError(f"no option {sorted(unknown)[0]!r} in {field!r}; options: {', '.join(labels)}")
    kind = Choice[tuple((label, "") for label in labels)]
    predictor = dspy.Predict(signature.with_updated_fields(field, type_=kind))
    predictor.fields = {field: {"weights": {label: float(weights.get(label, 1.0)) for label in labels}}}
    return predictor


def choice_value(prediction: Any, field: str) -> tuple[Any, dict[str, float] | None]:
    """A choice and the LM's per-option probabilities behind it (None when the LM only named an option)."""
    value = prediction.get(field) if hasattr(prediction, "get") else getattr(prediction, field, None)
    probabilities = getattr(value, "probabilities", None)
    if hasattr(value, "confidence"):
        chosen = value.value
        return chosen, None if probabilities is None else {str(k): float(p) for k, p in probabilities.items()}
    return value, None


def decision_value(prediction: Any, field: str) -> tuple[bool, float | None]:
    """A decision and the probability behind it (None when the LM only said yes or no)."""
    value = prediction.get(field) if hasattr(prediction, "get") else getattr(prediction, field, None)
    probability = getattr(value, "probability", None)
    if probability is not None or hasattr(value, "confidence"):
        return bool(value), None if probability is None else float(probability)
    return value is True, None


def check_bool(name: str, value: Any) -> bool:
    """Validate a true/false knob (``0``/``1`` and strings are refused, so a typo cannot flip it)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, not {value!r}")
    return value


_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def salvage_yes_no(predictor: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a yes/no answer predictor so that a reply DSPy's strict ``Literal["yes", "no"]`` parsing refuses
    ("Yes", "no.", "Yes, because ...") still yields the first yes/no word in it, lowercased. The wrapper is
    a coroutine function calling the predictor as the run goes (:func:`ragsuite.aio.invoke`)."""

    async def call(**inputs: Any) -> dspy.Prediction:
        try:
            return await invoke(predictor, **inputs)
        except AdapterParseError as exc:
            match = _YES_NO.search(str(exc.lm_response or ""))
            if match is None:
                raise
            logger.debug("yes/no answer salvaged from an unparsable reply")
            return dspy.Prediction(answer=match.group(1).lower(), salvaged=True)

    call.__wrapped__ = predictor  # type: ignore[attr-defined]  # for stage_adapter: the predictor inside
    return call


async def arun_answer(
    program: RAGProgram,
    ledger: RunLedger,
    *,
    source: str,
    predictor: Callable[..., dspy.Prediction] | None = None,
    **evidence: Any,
) -> str:
    """Call ``predictor`` (default ``program.answer``) with ``evidence`` and record the answer; an unparsable
    reply gives ``""``.

    For yes/no tasks a reply that fails strict parsing but contains "yes" or "no" is read as that word
    (recorded as ``salvaged`` in the trace) before the empty fallback applies.
    """
    predictor = predictor or program.answer
    predictor = salvage_yes_no(predictor) if program.task == "yesno" else predictor
    prediction = await program.acall_stage(ledger, "answer", predictor, fallback=ANSWER_FALLBACK, **evidence)
    answer = str(prediction.answer or "").strip()
    if prediction.get("salvaged"):
        ledger.record("answer", source=source, answer=answer, salvaged=True)
    else:
        ledger.record("answer", source=source, answer=answer)
    return answer


def merge_passages(groups: Sequence[Sequence[Passage]]) -> list[Passage]:
    """Union of several ranked lists, first occurrence wins, order preserved."""
    seen: dict[str, Passage] = {}
    for group in groups:
        for passage in group:
            seen.setdefault(passage.id, passage)
    return list(seen.values())


async def aretrieve_recorded(
    program: RAGProgram,
    ledger: RunLedger,
    query: str,
    k: int,
    *,
    retriever: Retriever | None = None,
    **fields: Any,
) -> list[Passage]:
    """``program.aretrieve`` plus a ``"retrieve"`` trace event with the query and passage ids.

    An empty result is already recorded by ``program.aretrieve`` (with ``empty=True``), so it is not
    recorded twice. ``retriever`` overrides the program's own; extra ``fields`` (e.g. ``sub_question=...``)
    go into the event.
    """
    passages = await program.aretrieve(ledger, query, k, retriever=retriever)
    if passages:
        ledger.record("retrieve", query=query, passage_ids=[p.id for p in passages], **fields)
    return passages


async def agather(
    program: RAGProgram,
    ledger: RunLedger,
    question: str,
    k: int,
    *,
    filter: dspy.Module | None = None,
    blend: dspy.Module | None = None,
) -> list[Passage]:
    """Retrieve ``k`` passages for ``question``; with ``blend``, also ``k`` for each extra query it proposes
    (given the question's passages); with ``filter``, keep what it keeps of each non-empty retrieved set;
    return the union, first occurrence wins. Retrievals, blending and filtering are all traced.

    ``filter`` and ``blend`` are a :class:`~ragsuite.programs.stages.FilterStage` and a
    :class:`~ragsuite.programs.stages.BlendStage` (named, not imported: the stages module builds on this
    one)."""
    retrieved = [await aretrieve_recorded(program, ledger, question, k)]
    if blend is not None:
        for query in await invoke(blend, program, ledger, question, retrieved[0]):
            if query and query.strip():
                retrieved.append(await aretrieve_recorded(program, ledger, query, k))
    if filter is not None:
        retrieved = [
            list(await invoke(filter, program, ledger, question, group)) if group else group
            for group in retrieved
        ]
    return merge_passages(retrieved)


def gather(
    program: RAGProgram,
    ledger: RunLedger,
    question: str,
    k: int,
    *,
    filter: dspy.Module | None = None,
    blend: dspy.Module | None = None,
) -> list[Passage]:
    """:func:`agather`, synchronously."""
    return run_sync(agather(program, ledger, question, k, filter=filter, blend=blend))


__all__ = [
    "ANSWER_FALLBACK",
    "DECISION_MODES",
    "MAX_QUERY_CHARS",
    "DecisionMode",
    "agather",
    "aretrieve_recorded",
    "arun_answer",
    "check_bool",
    "check_decisions",
    "check_int",
    "check_threshold",
    "check_weight",
    "choice_predictor",
    "choice_value",
    "decision_predictor",
    "decision_value",
    "gather",
    "merge_passages",
    "salvage_yes_no",
]
