"""The baselines every paper compares against: answering without retrieval, and vanilla RAG (retrieve the
top-k passages once, answer from them)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import dspy

from ragsuite.data.datasets import Task
from ragsuite.programs.base import RAGProgram, register
from ragsuite.programs.knobs import Knobs, OneOf, integer
from ragsuite.programs.pipeline import agather, arun_answer
from ragsuite.retrieval.base import Retriever
from ragsuite.signatures.answer import answer_signature, format_passages

if TYPE_CHECKING:
    from ragsuite.programs.stages import BlendStage, FilterStage


@register
class NoRetrieval(RAGProgram):
    """Answer from the LM's own knowledge, with no retrieval (the "LLMs without retrieval" baseline).

    Args:
        retriever: Ignored; accepted so every program is built the same way.
        task: Answer style: ``short``, ``long`` (ASQA) or ``yesno`` (StrategyQA).

    Example:
        >>> import dspy
        >>> from ragsuite import programs
        >>> program = programs.get("no-retrieval")(task="short")
        >>> with dspy.context(lm=dspy.LM("openai/gpt-4o-mini")):  # doctest: +SKIP
        ...     print(program(question="Where did Bogislaw XIII die?").answer)
    """

    name: ClassVar[str] = "no-retrieval"

    def __init__(self, *, retriever: Retriever | None = None, task: Task = "short") -> None:
        super().__init__(retriever=retriever, task=task)
        self.answer = dspy.Predict(answer_signature(task, "none"))

    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        answer = await arun_answer(self, ledger, source="none", question=question)
        return self.finish(ledger, answer, [])


@register
class VanillaRAG(RAGProgram):
    """Vanilla RAG: retrieve the ``top_k`` passages for the question once and answer from them.

    Optional stages turn it into other pipelines without new code:

    * ``filter=FilterStage(...)``: the LM drops irrelevant passages before answering (HANRAG's ANRAG
      single-step chain when combined with a larger ``top_k``).
    * ``blend=BlendStage(...)``: extra queries (e.g. BlendFilter's external/internal knowledge queries) are
      retrieved too and their passages merged (union, first occurrence wins).
    * both: BlendFilter's pipeline — every retrieved set is filtered, then the kept passages are merged.

    Args:
        retriever: Any :class:`~ragsuite.retrieval.base.Retriever`.
        task: Answer style: ``short``, ``long`` (ASQA) or ``yesno`` (StrategyQA).
        filter: Optional filtering stage applied to each retrieved set.
        blend: Optional query-blending stage whose queries are retrieved as well.
        **knobs: Any of :attr:`KNOBS` by name (``top_k=5``).

    Example:
        >>> import dspy
        >>> from ragsuite import programs
        >>> from ragsuite.retrieval.bm25 import BM25Retriever
        >>> retriever = BM25Retriever.from_dataset("hotpotqa")  # doctest: +SKIP
        >>> program = programs.get("vanilla")(retriever=retriever, task="short", top_k=5)  # doctest: +SKIP
        >>> with dspy.context(lm=dspy.LM("openai/gpt-4o-mini")):  # doctest: +SKIP
        ...     prediction = program(question="Where did Anna of Pomerania's father die?")
        >>> prediction.answer, prediction.stats["retrievals"]  # doctest: +SKIP
        ('Stettin', 1)
    """

    name: ClassVar[str] = "vanilla"
    KNOBS: ClassVar[Knobs] = Knobs(
        integer(
            "top_k", 5, minimum=1, search=OneOf((3, 5, 7, 10)), help="passages retrieved per query (paper: 5)"
        ),
    )

    def __init__(
        self,
        *,
        retriever: Retriever | None = None,
        task: Task = "short",
        filter: FilterStage | None = None,
        blend: BlendStage | None = None,
        **knobs: Any,
    ) -> None:
        super().__init__(retriever=retriever, task=task, **knobs)
        self.filter = filter
        self.blend = blend
        self.answer = dspy.Predict(answer_signature(task, "passages"))

    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        passages = await agather(self, ledger, question, self.top_k, filter=self.filter, blend=self.blend)
        ledger.count_step()
        answer = await arun_answer(
            self, ledger, source="passages", question=question, passages=format_passages(passages)
        )
        return self.finish(ledger, answer, passages)


__all__ = ["NoRetrieval", "VanillaRAG"]
