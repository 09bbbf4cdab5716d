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
from ragsuite.programs.knobs import Floats, Ints, Knobs, OneOf, choice, integer, number, probability
from ragsuite.programs.pipeline import (
    ANSWER_FALLBACK,
    DECISION_MODES,
    aretrieve_recorded,
    choice_predictor,
    choice_value,
    decision_predictor,
    decision_value,
    merge_passages,
    salvage_yes_no,
)
from ragsuite.programs.stages import FILTER_MODES, FilterStage
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
        **knobs: Any of :attr:`KNOBS` by name (``top_k=10``), each declared there once with its default,
            values and meaning. ``filter_threshold`` is the per-passage filter's only: with
            ``filter_mode="batch"`` another value is refused; at least one route weight must be above 0.

    Example:
        >>> import dspy
        >>> from ragsuite import programs
        >>> from ragsuite.retrieval.bm25 import BM25Retriever
        >>> retriever = BM25Retriever.from_dataset("musique")  # doctest: +SKIP
        >>> program = programs.get("hanrag")(retriever=retriever)  # doctest: +SKIP
        >>> with dspy.context(lm=dspy.LM("openai/gpt-4o-mini")):  # doctest: +SKIP
        ...     prediction = program(question="Who succeeded the first President of Namibia?")
        >>> prediction.route, prediction.stats["steps"]  # doctest: +SKIP
        ('complex', 2)
    """

    name: ClassVar[str] = "hanrag"
    KNOBS: ClassVar[Knobs] = Knobs(
        integer(
            "top_k",
            10,
            minimum=1,
            search=Ints(5, 20, step=5),
            help="passages retrieved per ANRAG call (paper: 10)",
        ),
        integer(
            "keep",
            3,
            minimum=1,
            search=Ints(1, 5),
            help="most kept passages given to the generator (paper: 3)",
        ),
        integer(
            "max_hops",
            5,
            minimum=1,
            search=Ints(1, 6),
            help="most seeds in the complex loop; most sub-questions run for a compound question (the "
            "paper's step limit: without the ending discriminator it averages 4.56 steps, Table 6)",
        ),
        choice(
            "filter_mode",
            "per_passage",
            FILTER_MODES,
            search=OneOf(FILTER_MODES),
            help="`per_passage` (paper: one LM call per passage, run concurrently) or `batch` (one call per "
            "retrieval, far cheaper)",
        ),
        choice(
            "decisions",
            "generate",
            DECISION_MODES,
            search=OneOf(DECISION_MODES),
            help="`generate` (Filter and EndCheck answer yes or no) or `probability` (they state the "
            "probability of yes, compared with the thresholds; the batch filter keeps generating its list)",
        ),
        probability(
            "filter_threshold",
            0.5,
            # Only where the filter uses it: the batch filter states no per-passage probability.
            search=Floats(0.05, 0.95, when={"filter_mode": "per_passage", "decisions": "probability"}),
            help="per-passage relevance threshold in `probability` mode (0.5: the LM's own verdict)",
        ),
        probability(
            "end_threshold",
            0.5,
            search=Floats(0.05, 0.95),
            help="EndCheck threshold in `probability` mode",
        ),
        *(
            number(
                knob,
                1.0,
                minimum=0.0,
                # Log scale: halving a weight matters as much as doubling it.
                search=Floats(0.25, 4.0, log=True),
                help=f"the {route} route's weight in `probability` mode: the router takes the route "
                "with the largest weight x probability (in `generate` mode the weights do not apply)",
            )
            for route, knob in ROUTE_WEIGHT_KNOBS.items()
        ),
    )

    def __init__(self, *, retriever: Retriever | None = None, task: Task = "short", **knobs: Any) -> None:
        super().__init__(retriever=retriever, task=task, **knobs)
        if self.filter_mode == "batch" and self.filter_threshold != 0.5:
            raise ConfigError(
                f"filter_threshold={self.filter_threshold} is the per-passage filter's; the batch filter "
                "states no per-passage probability: use filter_mode=per_passage or leave filter_threshold out"
            )
        if not any(self.route_weights.values()):
            raise ConfigError("at least one route_weight_* must be > 0, or no route could be chosen")
        self.route = choice_predictor(Route, "category", mode=self.decisions, weights=self.route_weights)
        self.decompose = dspy.Predict(Decompose)
        self.refine_seed = dspy.Predict(RefineSeed)
        self.end_check = decision_predictor(
            EndCheck, "enough", mode=self.decisions, threshold=self.end_threshold
        )
        per_passage = self.filter_mode == "per_passage"
        self.filter = FilterStage(
            mode=self.filter_mode,
            keep=self.keep,
            decisions=self.decisions if per_passage else "generate",
            threshold=self.filter_threshold if per_passage else None,
        )
        self.answer = HANRAGAnswer(task)

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
