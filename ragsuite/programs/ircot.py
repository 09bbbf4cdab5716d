"""IRCoT and Adaptive-RAG, the multi-step baselines of the HANRAG paper (Tables 1-2).

IRCoT (Trivedi et al., 2023, "Interleaving Retrieval with Chain-of-Thought Reasoning"):

1. Retrieve ``top_k`` passages for the question; they start the collection.
2. Repeat up to ``max_steps`` times: generate the next chain-of-thought sentence from the question, the
   collected passages and the sentences so far (``NextThought``); stop when the sentence says "answer is";
   otherwise retrieve ``top_k`` passages with that sentence as the query and add the new ones, keeping at most
   ``max_passages`` in the collection (the paper caps it at 15).
3. A reader answers the question from the collected passages, in the task's answer style.

Steps count retrievals (the question's and one per non-final sentence), the unit HANRAG reports.

Adaptive-RAG (Jeong et al., 2024): a query-complexity classifier routes each question to A: answer without
retrieval, B: one retrieval of ``top_k`` passages, or C: IRCoT. The paper trains a small classifier (T5-Large)
on labels from the three strategies' outcomes; ``classifier=DIR`` uses one trained that way by ``ragsuite
classifier train`` (:mod:`ragsuite.programs.complexity`), and without it the LM classifies
(``QueryComplexity``). An unparsable class from the LM falls back to B.

LM-output fallbacks (recorded in the trace and ``stats["fallbacks"]``): an unparsable reasoning sentence ends
the reasoning; an unparsable answer is empty.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import dspy
from dspy.utils.exceptions import AdapterParseError

from ragsuite.aio import invoke, run_sync
from ragsuite.data.datasets import Task
from ragsuite.programs.base import RAGProgram, RunLedger, register
from ragsuite.programs.complexity import load_classifier
from ragsuite.programs.pipeline import aretrieve_recorded, arun_answer, check_int
from ragsuite.retrieval.base import Passage, Retriever
from ragsuite.signatures.answer import answer_signature, format_passages
from ragsuite.signatures.reasoning import NextThought, QueryComplexity, RetrievalNeed

#: IRCoT's termination test: the reasoning has reached its answer.
ANSWER_IS = re.compile(r"\banswer is\b", re.IGNORECASE)
#: Route used when the classifier's reply cannot be read: one retrieval is the safe middle.
COMPLEXITY_FALLBACK = "B"
_CLASS = re.compile(r"\b([ABC])\b")


async def ainterleave_reasoning(
    program: RAGProgram,
    ledger: RunLedger,
    question: str,
    predictor: dspy.Predict,
    *,
    top_k: int,
    max_steps: int,
    max_passages: int,
) -> tuple[list[Passage], list[str]]:
    """IRCoT's retrieve-reason loop (module docstring, steps 1-2). Returns the collected passages and the
    reasoning sentences; records a ``step`` event per sentence and a ``stop`` event."""
    first = await aretrieve_recorded(program, ledger, question, top_k)
    collected = {p.id: p for p in first[:max_passages]}
    ledger.count_step()
    thoughts: list[str] = []
    reason = "max_steps"
    for step in range(1, max_steps + 1):
        output = await program.acall_stage(
            ledger,
            "next_thought",
            predictor,
            fallback={"thought": ""},
            question=question,
            passages=format_passages(list(collected.values())),
            thoughts=list(thoughts),
        )
        thought = " ".join(str(output.thought or "").split())
        if not thought:
            reason = "no_thought"
            break
        thoughts.append(thought)
        if ANSWER_IS.search(thought) or step == max_steps:
            reason = "answer" if ANSWER_IS.search(thought) else "max_steps"
            ledger.record("step", step=step, thought=thought, passage_ids=[])
            break
        hits = await program.aretrieve(ledger, thought, top_k)
        ledger.count_step()
        room = max(0, max_passages - len(collected))
        new = [p for p in hits if p.id not in collected][:room]
        collected.update((p.id, p) for p in new)
        ledger.record(
            "step",
            step=step,
            thought=thought,
            retrieved_ids=[p.id for p in hits],
            passage_ids=[p.id for p in new],
        )
    ledger.record("stop", reason=reason, thoughts=len(thoughts), passages=len(collected))
    return list(collected.values()), thoughts


def interleave_reasoning(
    program: RAGProgram,
    ledger: RunLedger,
    question: str,
    predictor: dspy.Predict,
    *,
    top_k: int,
    max_steps: int,
    max_passages: int,
) -> tuple[list[Passage], list[str]]:
    """:func:`ainterleave_reasoning`, synchronously."""
    return run_sync(
        ainterleave_reasoning(
            program, ledger, question, predictor, top_k=top_k, max_steps=max_steps, max_passages=max_passages
        )
    )


@register
class IRCoT(RAGProgram):
    """IRCoT: interleave chain-of-thought sentences with retrievals, then read (see the module docstring).

    Stage predictors: ``next_thought``, ``answer``.

    Args:
        retriever: Any :class:`~ragsuite.retrieval.base.Retriever`.
        task: Answer style: ``short``, ``long`` or ``yesno``.
        top_k: Passages per retrieval (the paper tunes K in {2, 4, 6, 8}; 4 here).
        max_steps: Most reasoning sentences (ours: 8).
        max_passages: Most passages collected (the paper's cap: 15).

    Example:
        >>> from ragsuite import programs
        >>> programs.get("ircot").default_knobs()
        {'top_k': 4, 'max_steps': 8, 'max_passages': 15}
    """

    name: ClassVar[str] = "ircot"
    KNOBS: ClassVar[tuple[str, ...]] = ("top_k", "max_steps", "max_passages")

    def __init__(
        self,
        *,
        retriever: Retriever | None = None,
        task: Task = "short",
        top_k: int = 4,
        max_steps: int = 8,
        max_passages: int = 15,
    ) -> None:
        super().__init__(retriever=retriever, task=task)
        self.top_k = check_int("top_k", top_k, minimum=1)
        self.max_steps = check_int("max_steps", max_steps, minimum=1)
        self.max_passages = check_int("max_passages", max_passages, minimum=1)
        self.next_thought = dspy.Predict(NextThought)
        self.answer = dspy.Predict(answer_signature(task, "passages"))

    @classmethod
    def search_space(cls, trial: Any) -> dict[str, Any]:
        return {
            "top_k": trial.suggest_categorical("top_k", [2, 4, 6, 8]),
            "max_steps": trial.suggest_int("max_steps", 2, 10),
            "max_passages": trial.suggest_int("max_passages", 5, 20),
        }

    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        passages, thoughts = await ainterleave_reasoning(
            self,
            ledger,
            question,
            self.next_thought,
            top_k=self.top_k,
            max_steps=self.max_steps,
            max_passages=self.max_passages,
        )
        answer = await arun_answer(
            self, ledger, source="passages", question=question, passages=format_passages(passages)
        )
        return self.finish(ledger, answer, passages, thoughts=thoughts)


def _salvage_complexity(predictor: dspy.Predict) -> Any:
    """Read a lone class letter from a reply strict parsing refuses ("C.", "Class: B")."""

    async def call(**inputs: Any) -> dspy.Prediction:
        try:
            return await invoke(predictor, **inputs)
        except AdapterParseError as exc:
            found = set(_CLASS.findall(str(exc.lm_response or "").split("]]")[-1]))
            if len(found) != 1:
                raise
            return dspy.Prediction(complexity=found.pop(), salvaged=True)

    return call


@register
class AdaptiveRAG(IRCoT):
    """Adaptive-RAG: classify the question's complexity, then answer without retrieval (A), with one
    retrieval (B) or with IRCoT (C).

    Stage predictors: ``classify``, ``direct`` (A), ``next_thought`` (C), ``answer`` (B and C).

    Args:
        retriever, task, top_k, max_steps, max_passages: as in :class:`IRCoT` (``top_k`` also for B).
        classifier: Directory of a trained complexity classifier (``ragsuite classifier train``); it routes
            without an LM call. None: the LM classifies (the ``classify`` stage).

    Example:
        >>> from ragsuite import programs
        >>> sorted(programs.get("adaptive-rag").default_knobs())
        ['classifier', 'max_passages', 'max_steps', 'top_k']
    """

    name: ClassVar[str] = "adaptive-rag"
    KNOBS: ClassVar[tuple[str, ...]] = (*IRCoT.KNOBS, "classifier")

    def __init__(
        self,
        *,
        retriever: Retriever | None = None,
        task: Task = "short",
        top_k: int = 4,
        max_steps: int = 8,
        max_passages: int = 15,
        classifier: str | None = None,
    ) -> None:
        super().__init__(
            retriever=retriever, task=task, top_k=top_k, max_steps=max_steps, max_passages=max_passages
        )
        self.classifier = None if classifier is None else str(classifier)
        # Loaded once here, so a missing or corrupt classifier fails before any question runs.
        self._trained = None if classifier is None else load_classifier(classifier)
        self.classify = dspy.Predict(QueryComplexity)
        self.direct = dspy.Predict(answer_signature(task, "none"))

    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        if self._trained is not None:
            probabilities = self._trained.predict_proba(question)
            complexity = self._trained.predict(question)
            ledger.record(
                "route",
                complexity=complexity,
                classifier="trained",
                probabilities={label: round(p, 4) for label, p in probabilities.items()},
            )
        else:
            classified = await self.acall_stage(
                ledger,
                "classify",
                _salvage_complexity(self.classify),
                fallback={"complexity": COMPLEXITY_FALLBACK},
                question=question,
            )
            complexity = (
                classified.complexity if classified.complexity in ("A", "B", "C") else COMPLEXITY_FALLBACK
            )
            ledger.record(
                "route", complexity=complexity, **({"salvaged": True} if classified.get("salvaged") else {})
            )
        if complexity == "A":
            answer = await arun_answer(self, ledger, source="none", predictor=self.direct, question=question)
            return self.finish(ledger, answer, [], route=complexity)
        if complexity == "B":
            passages = await aretrieve_recorded(self, ledger, question, self.top_k)
            ledger.count_step()
        else:
            passages, _ = await ainterleave_reasoning(
                self,
                ledger,
                question,
                self.next_thought,
                top_k=self.top_k,
                max_steps=self.max_steps,
                max_passages=self.max_passages,
            )
        answer = await arun_answer(
            self, ledger, source="passages", question=question, passages=format_passages(passages)
        )
        return self.finish(ledger, answer, passages, route=complexity)


@register
class AdaptiveRetrieval(RAGProgram):
    """Adaptive Retrieval (Mallen et al., 2023, "When Not to Trust Language Models"): retrieve only when the
    LM's own knowledge is not enough, else answer without retrieval.

    The paper decides by the popularity of the question's entity (Wikipedia page views below a threshold
    mean retrieve), a resource ragsuite does not ship. The closest faithful variant here asks the LM whether
    it can answer reliably from its own knowledge (``RetrievalNeed``), which is what popularity stands in
    for; an unparsable reply retrieves (recorded). With retrieval it answers from the top ``top_k`` passages.

    Stage predictors: ``decide``, ``direct``, ``answer``.

    Example:
        >>> from ragsuite import programs
        >>> programs.get("adaptive-retrieval").default_knobs()
        {'top_k': 5}
    """

    name: ClassVar[str] = "adaptive-retrieval"
    KNOBS: ClassVar[tuple[str, ...]] = ("top_k",)

    def __init__(self, *, retriever: Retriever | None = None, task: Task = "short", top_k: int = 5) -> None:
        super().__init__(retriever=retriever, task=task)
        self.top_k = check_int("top_k", top_k, minimum=1)
        self.decide = dspy.Predict(RetrievalNeed)
        self.direct = dspy.Predict(answer_signature(task, "none"))
        self.answer = dspy.Predict(answer_signature(task, "passages"))

    @classmethod
    def search_space(cls, trial: Any) -> dict[str, Any]:
        return {"top_k": trial.suggest_categorical("top_k", [3, 5, 7, 10])}

    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        decided = await self.acall_stage(
            ledger, "decide", self.decide, fallback={"needs_retrieval": True}, question=question
        )
        retrieve = decided.needs_retrieval is not False
        ledger.record("decide", retrieve=retrieve)
        if not retrieve:
            answer = await arun_answer(self, ledger, source="none", predictor=self.direct, question=question)
            return self.finish(ledger, answer, [])
        passages = await aretrieve_recorded(self, ledger, question, self.top_k)
        ledger.count_step()
        answer = await arun_answer(
            self, ledger, source="passages", question=question, passages=format_passages(passages)
        )
        return self.finish(ledger, answer, passages)


__all__ = [
    "ANSWER_IS",
    "AdaptiveRAG",
    "AdaptiveRetrieval",
    "IRCoT",
    "ainterleave_reasoning",
    "interleave_reasoning",
]
