"""HANRAG (Sun et al., "Heuristic Accurate Noise-resistant RAG"): route each question to the cheapest chain
that can answer it, and filter retrieval noise before every generation.

Chains (the paper's Algorithm 2):

- ``straightforward``: answer from the LM's own knowledge; 0 steps.
- ``single-step``: ANRAG (Algorithm 1) — retrieve ``top_k``, judge each passage with the Filter stage, answer
  from at most ``keep`` of the kept passages; 1 step.
- ``compound``: Decompose into independent sub-questions, run ANRAG for each concurrently, answer the question
  from the (sub-question, answer) pairs; 1 step, as the paper counts its parallel retrieval (table 8).
- ``complex``: loop RefineSeed -> ANRAG on the seed -> EndCheck until the steps suffice or ``max_hops``
  seeds were answered, then answer from the (seed, answer) steps; one step per seed.

Steps count retrieval-generation cycles, the paper's efficiency measure.

The router's choice can be probability-backed (``decisions="probability"``; the paper's router is a fine-tuned
classifier): the LM states a probability per type (DSPy's ``Choice`` output), and the route is the type with
the largest ``weight * probability``, one weight knob per route (``route_weight_*``, 1.0 each: the LM's most
probable type). Tuning a weight below 1 makes its chain rarer, e.g. the costly complex loop.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import dspy
from dspy.utils.exceptions import AdapterParseError

from ragsuite.aio import concurrently, invoke
from ragsuite.data.datasets import Task
from ragsuite.errors import ConfigError
from ragsuite.programs.base import DecisionKnob, RAGProgram, RunLedger, register
from ragsuite.programs.pipeline import (
    ANSWER_FALLBACK,
    DecisionMode,
    aretrieve_recorded,
    check_decisions,
    check_int,
    check_threshold,
    check_weight,
    choice_predictor,
    choice_value,
    decision_predictor,
    decision_value,
    merge_passages,
    salvage_yes_no,
)
from ragsuite.programs.stages import FilterMode, FilterStage
from ragsuite.retrieval.base import Passage, Retriever
from ragsuite.signatures.answer import answer_signature, format_passages
from ragsuite.signatures.hanrag import Decompose, EndCheck, RefineSeed, Route

logger = logging.getLogger("ragsuite.programs.hanrag")

ROUTES = ("straightforward", "single-step", "compound", "complex")
#: The knob holding each route's weight in the probability-backed router.
ROUTE_WEIGHT_KNOBS = {route: f"route_weight_{route.replace('-', '_')}" for route in ROUTES}
#: The chain used when the router's reply cannot be parsed: one filtered retrieval is the safe middle.
ROUTE_FALLBACK = "single-step"
# The paper's router answers "complex question", "single-step question", ...: read the type from such text.
_ROUTE_WORD = re.compile(r"\b(straightforward|single[- ]step|compound|complex)\b", re.IGNORECASE)


def salvage_route(predictor: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap the router so that a reply strict ``Literal`` parsing refuses but that names one type (the
    paper's own format, "complex question") yields that type, marked ``salvaged``."""

    async def call(**inputs: Any) -> dspy.Prediction:
        try:
            return await invoke(predictor, **inputs)
        except AdapterParseError as exc:
            found = {m.lower().replace(" ", "-") for m in _ROUTE_WORD.findall(str(exc.lm_response or ""))}
            if len(found) != 1:
                raise  # no type, or several: not a reply to guess from
            return dspy.Prediction(category=found.pop(), salvaged=True)
        except ValueError as exc:
            # DSPy refuses stated probabilities it cannot choose from (other labels, all zero, or all mass on
            # zero-weight routes) with a ValueError: an unusable reply, so the router's fallback applies.
            raise AdapterParseError("DecisionAdapter", Route, "", message=str(exc)) from exc

    call.__wrapped__ = predictor  # type: ignore[attr-defined]  # for stage_adapter: the predictor inside
    return call


class HANRAGAnswer(dspy.Module):
    """The answer predictors of HANRAG, one per kind of evidence (all belong to the ``answer`` stage).

    Attributes:
        direct: the question alone (straightforward route), in the task's style.
        from_passages: the question and its kept passages (single-step route), in the task's style.
        sub_question: a sub-question or seed and its kept passages; always a short span, since it feeds
            the next step rather than the user.
        from_steps: the question and the (sub-question, answer) steps, in the task's style.
    """

    def __init__(self, task: Task) -> None:
        super().__init__()
        self.direct = dspy.Predict(answer_signature(task, "none"))
        self.from_passages = dspy.Predict(answer_signature(task, "passages"))
        self.sub_question = dspy.Predict(answer_signature("short", "passages"))
        self.from_steps = dspy.Predict(answer_signature(task, "note"))

    def forward(self, **kwargs: Any) -> dspy.Prediction:  # pragma: no cover - programs call the predictors
        raise TypeError("call one of HANRAGAnswer's predictors (direct, from_passages, ...) instead")


def format_steps(steps: Sequence[tuple[str, str]], *, label: str = "Sub-question") -> str:
    """Render (question, answer) pairs as the evidence of the final answer, or ``"nothing"`` when empty."""
    if not steps:
        return "nothing"
    return "\n".join(
        f"{label} {i}: {question}\nAnswer {i}: {answer or '(no answer found)'}"
        for i, (question, answer) in enumerate(steps, start=1)
    )


def _clean_questions(raw: Any) -> list[str]:
    """Non-empty, distinct (case-insensitive) strings from an LM list output, in order."""
    seen: set[str] = set()
    questions: list[str] = []
    for item in raw if isinstance(raw, (list, tuple)) else [raw]:
        text = " ".join(str(item or "").split())
        if text and text.lower() not in seen:
            seen.add(text.lower())
            questions.append(text)
    return questions


@register
class HANRAG(RAGProgram):
    """HANRAG: route, then answer directly, with one filtered retrieval, with concurrent filtered retrievals
    for decomposed sub-questions, or with an iterative seed-question loop.

    Args:
        retriever: Passage retriever.
        task: Answer style of the final answer: ``short``, ``long`` or ``yesno``.
        top_k: Passages retrieved per ANRAG call (the paper's top 10).
        keep: At most this many kept passages reach the generator (the paper's top 3).
        max_hops: Most seed questions in the complex loop, and most sub-questions run for a compound
            question. The paper's ablation without the ending discriminator averages 4.56 steps on MuSiQue,
            "the maximum retrieval step limit" (Table 6), so the limit is at least 5.
        filter_mode: ``"per_passage"`` (one relevance call per passage, as in the paper) or ``"batch"`` (one
            call per retrieval, far cheaper).
        decisions: ``"generate"`` (Filter and EndCheck answer yes or no) or ``"probability"`` (they state the
            probability of yes; a per-passage verdict is relevant, and the steps enough, at or above the
            threshold; the batch filter has no per-passage probability and keeps generating its list).
        filter_threshold: Filter's relevance threshold in ``probability`` mode (0.5: the LM's own verdict);
            the per-passage filter's only: with ``filter_mode="batch"`` another value is refused.
        end_threshold: EndCheck's threshold in ``probability`` mode.
        route_weight_straightforward, route_weight_single_step, route_weight_compound, route_weight_complex:
            In ``probability`` mode the router states a probability per route and takes the route with the
            largest weight x probability (equal weights: the LM's most probable route). In ``generate``
            mode the router names a route and the weights do not apply (the trace says so when they are set).

    Example:
        >>> import dspy
        >>> from ragsuite import programs
        >>> from ragsuite.retrieval.bm25 import BM25Retriever
        >>> retriever = BM25Retriever.from_dataset("musique")  # doctest: +SKIP
        >>> program = programs.get("hanrag")(retriever=retriever)
        >>> with dspy.context(lm=dspy.LM("openai/gpt-4o-mini")):  # doctest: +SKIP
        ...     prediction = program(question="Who succeeded the first President of Namibia?")
        >>> prediction.route, prediction.stats["steps"]  # doctest: +SKIP
        ('complex', 2)
    """

    name: ClassVar[str] = "hanrag"
    KNOBS: ClassVar[tuple[str, ...]] = (
        "top_k",
        "keep",
        "max_hops",
        "filter_mode",
        "decisions",
        "filter_threshold",
        "end_threshold",
        *ROUTE_WEIGHT_KNOBS.values(),
    )

    def __init__(
        self,
        *,
        retriever: Retriever | None = None,
        task: Task = "short",
        top_k: int = 10,
        keep: int = 3,
        max_hops: int = 5,
        filter_mode: FilterMode = "per_passage",
        decisions: DecisionMode = "generate",
        filter_threshold: float = 0.5,
        end_threshold: float = 0.5,
        route_weight_straightforward: float = 1.0,
        route_weight_single_step: float = 1.0,
        route_weight_compound: float = 1.0,
        route_weight_complex: float = 1.0,
    ) -> None:
        super().__init__(retriever=retriever, task=task)
        self.decisions = check_decisions(decisions)
        self.filter_threshold = check_threshold("filter_threshold", filter_threshold)
        self.end_threshold = check_threshold("end_threshold", end_threshold)
        self.top_k = check_int("top_k", top_k, minimum=1)
        self.keep = check_int("keep", keep, minimum=1)
        self.max_hops = check_int("max_hops", max_hops, minimum=1)
        if filter_mode not in ("per_passage", "batch"):
            raise ConfigError(f"filter_mode must be 'per_passage' or 'batch', not {filter_mode!r}")
        self.filter_mode: FilterMode = filter_mode
        if filter_mode == "batch" and self.filter_threshold != 0.5:
            raise ConfigError(
                f"filter_threshold={self.filter_threshold} is the per-passage filter's; the batch filter "
                "states no per-passage probability: use filter_mode=per_passage or leave filter_threshold out"
            )
        given = {
            "straightforward": route_weight_straightforward,
            "single-step": route_weight_single_step,
            "compound": route_weight_compound,
            "complex": route_weight_complex,
        }
        for route, weight in given.items():
            setattr(self, ROUTE_WEIGHT_KNOBS[route], check_weight(ROUTE_WEIGHT_KNOBS[route], weight))
        if not any(self.route_weights.values()):
            raise ConfigError("at least one route_weight_* must be > 0, or no route could be chosen")
        self.route = choice_predictor(Route, "category", mode=self.decisions, weights=self.route_weights)
        self.decompose = dspy.Predict(Decompose)
        self.refine_seed = dspy.Predict(RefineSeed)
        self.end_check = decision_predictor(
            EndCheck, "enough", mode=self.decisions, threshold=self.end_threshold
        )
        per_passage = filter_mode == "per_passage"
        self.filter = FilterStage(
            mode=filter_mode,
            keep=self.keep,
            decisions=self.decisions if per_passage else "generate",
            threshold=self.filter_threshold if per_passage else None,
        )
        self.answer = HANRAGAnswer(task)

    @classmethod
    def search_space(cls, trial: Any) -> dict[str, Any]:
        """HANRAG's knobs; ``filter_threshold`` only where the filter uses it (per-passage, probability)."""
        filter_mode = trial.suggest_categorical("filter_mode", ["per_passage", "batch"])
        decisions = trial.suggest_categorical("decisions", ["generate", "probability"])
        knobs = {
            "top_k": trial.suggest_int("top_k", 5, 20, step=5),
            "keep": trial.suggest_int("keep", 1, 5),
            "max_hops": trial.suggest_int("max_hops", 1, 6),
            "filter_mode": filter_mode,
            "decisions": decisions,
            "end_threshold": trial.suggest_float("end_threshold", 0.05, 0.95),
            # Log scale: halving a weight matters as much as doubling it.
            **{knob: trial.suggest_float(knob, 0.25, 4.0, log=True) for knob in ROUTE_WEIGHT_KNOBS.values()},
        }
        if filter_mode == "per_passage" and decisions == "probability":
            knobs["filter_threshold"] = trial.suggest_float("filter_threshold", 0.05, 0.95)
        return knobs

    def decision_knobs(self) -> dict[str, DecisionKnob]:
        if self.decisions != "probability":
            return {}
        knobs = {"end_threshold": DecisionKnob(self.end_check, "enough", "threshold")}
        if self.filter_mode == "per_passage":  # the batch filter states no per-passage probability
            knobs["filter_threshold"] = DecisionKnob(self.filter.per_passage, "relevant", "threshold")
        for route, knob in ROUTE_WEIGHT_KNOBS.items():
            knobs[knob] = DecisionKnob(self.route, "category", "weights", route)
        return knobs

    @property
    def route_weights(self) -> dict[str, float]:
        """Each route's weight in the probability-backed router."""
        return {route: getattr(self, knob) for route, knob in ROUTE_WEIGHT_KNOBS.items()}

    # ------------------------------------------------------------------ chains
    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        return await self._run_route(ledger, question, await self._route(ledger, question))

    async def _route(self, ledger: RunLedger, question: str) -> str:
        """The router's chain for ``question`` (the fallback when its reply cannot be read), recorded."""
        routed = await self.acall_stage(
            ledger,
            "route",
            salvage_route(self.route),
            fallback={"category": ROUTE_FALLBACK},
            question=question,
        )
        chosen, probabilities = choice_value(routed, "category")
        category = chosen if chosen in ROUTES else ROUTE_FALLBACK
        details: dict[str, Any] = {"salvaged": True} if routed.get("salvaged") else {}
        if probabilities is not None:
            weights = dict(self.route.fields["category"]["weights"])  # the weights the choice was made with
            details.update(probabilities=probabilities, weights=weights, weights_applied=True)
        elif self.decisions == "probability" or set(self.route_weights.values()) != {1.0}:
            # A named route (generate mode, a salvaged or fallback reply) has no probabilities to weigh.
            details["weights_applied"] = False
        ledger.record("route", category=category, **details)
        return category

    async def _run_route(self, ledger: RunLedger, question: str, category: str) -> dspy.Prediction:
        """Answer ``question`` down the ``category`` chain."""
        if category == "straightforward":
            answer = await self._answer(ledger, self.answer.direct, source="none", question=question)
            passages: list[Passage] = []
        elif category == "single-step":
            ledger.count_step()
            answer, passages = await self._anrag(ledger, question, self.answer.from_passages)
        elif category == "compound":
            answer, passages = await self._compound(ledger, question)
        else:
            answer, passages = await self._complex(ledger, question)
        return self.finish(ledger, answer, passages, route=category)

    async def _answer(self, ledger: RunLedger, predictor: dspy.Predict, *, source: str, **inputs: Any) -> str:
        # Sub-question answers are short spans; only answers in the task's style can be yes/no.
        yesno = self.task == "yesno" and predictor is not self.answer.sub_question
        call = salvage_yes_no(predictor) if yesno else predictor
        prediction = await self.acall_stage(ledger, "answer", call, fallback=ANSWER_FALLBACK, **inputs)
        answer = str(prediction.answer or "").strip()
        salvaged = {"salvaged": True} if prediction.get("salvaged") else {}
        ledger.record("answer", source=source, question=inputs["question"], answer=answer, **salvaged)
        return answer

    async def _anrag(
        self, ledger: RunLedger, query: str, predictor: dspy.Predict, **fields: Any
    ) -> tuple[str, list[Passage]]:
        """Algorithm 1: retrieve ``top_k`` for ``query``, filter, answer ``query`` from the first ``keep``
        kept passages. Returns the answer and the passages it was given."""
        retrieved = await aretrieve_recorded(self, ledger, query, self.top_k, **fields)
        kept = await invoke(self.filter, self, ledger, query, retrieved, **fields)
        answer = await self._answer(
            ledger,
            predictor,
            source="passages",
            question=query,
            passages=format_passages(kept),
        )
        ledger.record("anrag", question=query, answer=answer, passage_ids=[p.id for p in kept], **fields)
        return answer, kept

    async def _compound(self, ledger: RunLedger, question: str) -> tuple[str, list[Passage]]:
        decomposed = await self.acall_stage(
            ledger, "decompose", self.decompose, fallback={"sub_questions": [question]}, question=question
        )
        sub_questions = _clean_questions(decomposed.sub_questions) or [question]
        dropped = sub_questions[self.max_hops :]
        sub_questions = sub_questions[: self.max_hops]
        ledger.record("decompose", sub_questions=sub_questions, **({"dropped": dropped} if dropped else {}))
        # The sub-questions are independent: their retrievals run at once and count as one step.
        ledger.count_step()
        results = await concurrently(
            lambda sub: self._anrag(ledger, sub, self.answer.sub_question, sub_question=sub), sub_questions
        )
        steps = [(sub, answer) for sub, (answer, _) in zip(sub_questions, results, strict=True)]
        answer = await self._answer(
            ledger, self.answer.from_steps, source="steps", question=question, note=format_steps(steps)
        )
        return answer, merge_passages([kept for _, kept in results])

    async def _complex(self, ledger: RunLedger, question: str) -> tuple[str, list[Passage]]:
        steps: list[tuple[str, str]] = []
        evidence: list[list[Passage]] = []
        asked: set[str] = set()
        reason = "max_hops"
        for hop in range(1, self.max_hops + 1):
            refined = await self.acall_stage(
                ledger,
                "refine_seed",
                self.refine_seed,
                fallback={"seed_question": question},
                question=question,
                steps=format_steps(steps, label="Seed question"),
            )
            seed = " ".join(str(refined.seed_question or "").split()) or question
            if seed.lower() in asked:
                # Asking the same seed again would retrieve the same passages: the loop has stalled.
                reason = "repeated_seed"
                ledger.record("seed", hop=hop, seed=seed, repeated=True)
                break
            asked.add(seed.lower())
            ledger.record("seed", hop=hop, seed=seed)
            ledger.count_step()
            answer, kept = await self._anrag(ledger, seed, self.answer.sub_question, hop=hop, seed=seed)
            steps.append((seed, answer))
            evidence.append(kept)
            if hop == self.max_hops:
                break  # no further hop is allowed, so asking EndCheck would change nothing
            ended = await self.acall_stage(
                ledger,
                "end_check",
                self.end_check,
                fallback={"enough": False},
                question=question,
                steps=format_steps(steps, label="Seed question"),
            )
            enough, probability = decision_value(ended, "enough")
            ledger.record(
                "end_check",
                hop=hop,
                enough=enough,
                **({"probability": probability} if probability is not None else {}),
            )
            if enough:
                reason = "enough"
                break
        ledger.record("stop", reason=reason, hops=len(steps))
        answer = await self._answer(
            ledger,
            self.answer.from_steps,
            source="steps",
            question=question,
            note=format_steps(steps, label="Seed question"),
        )
        return answer, merge_passages(evidence)


__all__ = ["HANRAG", "HANRAGAnswer", "format_steps"]
