"""FLARE, the instruct variant (Jiang et al., 2023, "Active Retrieval Augmented Generation", FLARE-instruct),
a baseline of DeepNote's Table 1.

Generation proceeds sentence by sentence. For each next sentence the LM looks ahead (``LookAhead``): it writes
the sentence and, when it is not confident about a fact the sentence needs, a search query. With a query,
``top_k`` passages are retrieved for it and the sentence is written again from them (FLARE regenerates the
look-ahead sentence with the retrieved documents); without one, the look-ahead sentence is kept. It stops when
a sentence says "answer is" or after ``max_steps`` sentences; the final answer, in the task's style, is read
from the generated text.

FLARE-direct decides by token probabilities (retrieve when any token of the look-ahead sentence is below a
threshold, with the low-confidence tokens masked in the query); it needs an LM that returns log
probabilities and is not implemented here: the instruct variant is what LMs without them run.
"""

from __future__ import annotations

from typing import Any, ClassVar

import dspy

from ragsuite.data.datasets import Task
from ragsuite.programs.base import RAGProgram, register
from ragsuite.programs.ircot import ANSWER_IS
from ragsuite.programs.pipeline import arun_answer, check_int, merge_passages
from ragsuite.retrieval.base import Retriever
from ragsuite.signatures.answer import answer_signature, format_passages
from ragsuite.signatures.reasoning import LookAhead


@register
class FlareInstruct(RAGProgram):
    """FLARE-instruct: look ahead one sentence at a time, retrieve when the LM asks, regenerate from what was
    found (see the module docstring).

    Stage predictors: ``look_ahead`` (both the look-ahead and the regenerated sentence), ``answer``.

    Args:
        retriever: Any :class:`~ragsuite.retrieval.base.Retriever`.
        task: Answer style: ``short``, ``long`` or ``yesno``.
        top_k: Passages per retrieval (ours: 3).
        max_steps: Most sentences (ours: 5).

    Example:
        >>> from ragsuite import programs
        >>> programs.get("flare-instruct").default_knobs()
        {'top_k': 3, 'max_steps': 5}
    """

    name: ClassVar[str] = "flare-instruct"
    KNOBS: ClassVar[tuple[str, ...]] = ("top_k", "max_steps")

    def __init__(
        self, *, retriever: Retriever | None = None, task: Task = "short", top_k: int = 3, max_steps: int = 5
    ) -> None:
        super().__init__(retriever=retriever, task=task)
        self.top_k = check_int("top_k", top_k, minimum=1)
        self.max_steps = check_int("max_steps", max_steps, minimum=1)
        self.look_ahead = dspy.Predict(LookAhead)
        self.answer = dspy.Predict(answer_signature(task, "note"))

    @classmethod
    def search_space(cls, trial: Any) -> dict[str, Any]:
        return {"top_k": trial.suggest_int("top_k", 1, 7), "max_steps": trial.suggest_int("max_steps", 2, 8)}

    async def _sentence(
        self, ledger: Any, question: str, passages: list[Any], sentences: list[str]
    ) -> dspy.Prediction:
        return await self.acall_stage(
            ledger,
            "look_ahead",
            self.look_ahead,
            fallback={"search_query": "", "sentence": ""},
            question=question,
            passages=format_passages(passages),
            answer_so_far=" ".join(sentences) or "nothing yet",
        )

    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        sentences: list[str] = []
        evidence = []
        reason = "max_steps"
        for step in range(1, self.max_steps + 1):
            ahead = await self._sentence(ledger, question, [], sentences)
            query = " ".join(str(ahead.search_query or "").split())
            sentence = " ".join(str(ahead.sentence or "").split())
            retrieved = []
            if query:
                retrieved = await self.aretrieve(ledger, query, self.top_k)
                ledger.count_step()
                evidence.append(retrieved)
                again = await self._sentence(ledger, question, retrieved, sentences)
                sentence = " ".join(str(again.sentence or "").split()) or sentence
            ledger.record(
                "sentence", step=step, query=query, passage_ids=[p.id for p in retrieved], sentence=sentence
            )
            if not sentence:
                reason = "no_sentence"
                break
            sentences.append(sentence)
            if ANSWER_IS.search(sentence):
                reason = "answer"
                break
        ledger.record("stop", reason=reason, sentences=len(sentences))
        text = " ".join(sentences) or "nothing"
        answer = await arun_answer(self, ledger, source="note", question=question, note=text)
        return self.finish(ledger, answer, merge_passages(evidence), generated=text)


__all__ = ["FlareInstruct"]
