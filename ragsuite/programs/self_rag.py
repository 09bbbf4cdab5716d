"""Self-RAG, prompted (after Asai et al., 2024, "Self-RAG"), a baseline of DeepNote's and HANRAG's tables.

Self-RAG is a model trained to emit reflection tokens: [Retrieve] (is retrieval needed?), then for each
retrieved passage a candidate segment with [IsREL] (is the passage relevant?), [IsSUP] (is the segment
supported: fully, partially, not at all) and [IsUSE] (usefulness, 1-5); the candidates are ranked by a
weighted sum of the critique scores and the best is kept. A real Self-RAG checkpoint reads these from token
probabilities; this variant, labelled *prompted*, asks any LM to state them:

1. ``RetrievalNeed`` stands for [Retrieve]: without retrieval the LM answers from its own knowledge.
2. With retrieval, ``top_k`` passages are retrieved and, for each, ``CritiquedAnswer`` writes an answer and
   its three critiques (one call per passage, run concurrently).
3. Each candidate scores ``w_rel * IsREL + w_sup * IsSUP + w_use * IsUSE``, with IsSUP 1 / 0.5 / 0 and IsUSE
   mapped from 1-5 to 0-1 (the paper's inference weights are 1.0, 1.0 and 0.5); the best candidate's answer,
   in the task's style, is the answer. Ties keep the retrieval order; an unparsable critique scores 0.
"""

from __future__ import annotations

from typing import Any, ClassVar

import dspy

from ragsuite.aio import concurrently
from ragsuite.data.datasets import Task
from ragsuite.errors import ConfigError
from ragsuite.programs.base import RAGProgram, register
from ragsuite.programs.pipeline import aretrieve_recorded, arun_answer, check_int
from ragsuite.retrieval.base import Retriever
from ragsuite.signatures.answer import answer_signature
from ragsuite.signatures.reasoning import CritiquedAnswer, RetrievalNeed

_SUPPORT = {"fully": 1.0, "partially": 0.5, "no": 0.0}
CRITIQUE_FALLBACK: dict[str, Any] = {"answer": "", "relevant": False, "supported": "no", "usefulness": 1}


def _weight(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"{name} must be a non-negative number, not {value!r}")
    return float(value)


@register
class SelfRAGPrompted(RAGProgram):
    """Self-RAG's decide-retrieve-critique-select loop with prompted reflection (see the module docstring).

    Stage predictors: ``decide``, ``critique``, ``direct``, ``answer``.

    Args:
        retriever: Any :class:`~ragsuite.retrieval.base.Retriever`.
        task: Answer style: ``short``, ``long`` or ``yesno``.
        top_k: Passages retrieved, one candidate each (the paper's 5).
        w_rel, w_sup, w_use: Critique weights (the paper's 1.0, 1.0, 0.5).

    Example:
        >>> from ragsuite import programs
        >>> programs.get("self-rag-prompted").default_knobs()
        {'top_k': 5, 'w_rel': 1.0, 'w_sup': 1.0, 'w_use': 0.5}
    """

    name: ClassVar[str] = "self-rag-prompted"
    KNOBS: ClassVar[tuple[str, ...]] = ("top_k", "w_rel", "w_sup", "w_use")

    def __init__(
        self,
        *,
        retriever: Retriever | None = None,
        task: Task = "short",
        top_k: int = 5,
        w_rel: float = 1.0,
        w_sup: float = 1.0,
        w_use: float = 0.5,
    ) -> None:
        super().__init__(retriever=retriever, task=task)
        self.top_k = check_int("top_k", top_k, minimum=1)
        self.w_rel, self.w_sup, self.w_use = (
            _weight("w_rel", w_rel),
            _weight("w_sup", w_sup),
            _weight("w_use", w_use),
        )
        self.decide = dspy.Predict(RetrievalNeed)
        self.critique = dspy.Predict(CritiquedAnswer)
        self.direct = dspy.Predict(answer_signature(task, "none"))
        self.answer = dspy.Predict(answer_signature(task, "note"))

    @classmethod
    def search_space(cls, trial: Any) -> dict[str, Any]:
        return {
            "top_k": trial.suggest_int("top_k", 2, 8),
            "w_rel": trial.suggest_float("w_rel", 0.0, 2.0),
            "w_sup": trial.suggest_float("w_sup", 0.0, 2.0),
            "w_use": trial.suggest_float("w_use", 0.0, 2.0),
        }

    def score(self, critique: Any) -> float:
        """The weighted critique score of one candidate."""
        try:
            use = (min(max(int(critique.usefulness), 1), 5) - 1) / 4
        except (TypeError, ValueError):
            use = 0.0
        relevant = 1.0 if critique.relevant is True else 0.0
        return (
            self.w_rel * relevant + self.w_sup * _SUPPORT.get(str(critique.supported), 0.0) + self.w_use * use
        )

    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        decided = await self.acall_stage(
            ledger, "decide", self.decide, fallback={"needs_retrieval": True}, question=question
        )
        if decided.needs_retrieval is False:
            ledger.record("decide", retrieve=False)
            answer = await arun_answer(self, ledger, source="none", predictor=self.direct, question=question)
            return self.finish(ledger, answer, [])
        ledger.record("decide", retrieve=True)
        passages = await aretrieve_recorded(self, ledger, question, self.top_k)
        ledger.count_step()
        critiques = await concurrently(
            lambda p: self.acall_stage(
                ledger,
                "critique",
                self.critique,
                fallback=CRITIQUE_FALLBACK,
                question=question,
                passage=p.render(),
            ),
            passages,
        )
        scores = [self.score(c) for c in critiques]
        for passage, critique, score in zip(passages, critiques, scores, strict=True):
            ledger.record(
                "critique",
                passage_id=passage.id,
                candidate=str(critique.answer or ""),
                relevant=critique.relevant is True,
                supported=str(critique.supported),
                usefulness=critique.usefulness,
                score=round(score, 4),
            )
        if not passages:
            answer = await arun_answer(self, ledger, source="none", predictor=self.direct, question=question)
            return self.finish(ledger, answer, [])
        best = max(range(len(passages)), key=lambda i: (scores[i], -i))
        note = f"{passages[best].render()}\nCandidate answer: {critiques[best].answer or ''}"
        answer = await arun_answer(self, ledger, source="note", question=question, note=note)
        return self.finish(
            ledger, answer, [passages[best]], candidates=[str(c.answer or "") for c in critiques]
        )


__all__ = ["SelfRAGPrompted"]
