"""Knowledge-aware diverse reranking (Team Magikarp, SIGIR 2025 LiveRAG winner).

Pipeline, in the paper's order (§2.1-2.3):

1. Retrieve ``pool_k`` passages for the question from each retriever and merge the lists by alternating picks
   without duplicates (:func:`ragsuite.retrieval.merge.interleave`): the candidate pool.
2. Initial reranking (§2.2.1): the reranker scores every pool passage against the question.
3. KnowledgeDeclare (§2.2.2) reads each of the top ``declare_top`` passages *of that reranking* to list the
   knowledge elements the question needs and those the passage holds (concurrently).
4. KnowledgeSummarize (§2.2.3) turns the declarations into two complementary knowledge descriptions.
5. Knowledge-aware reranking (§2.2.4): the whole pool is reranked once per description, each candidate
   scored with "question + knowledge" as the query; the two rankings are interleaved; the answer is
   generated from the top ``n``.

Rerankers (the paper used the jina-reranker-m0 cross-encoder); every one scores every pool passage, for the
question (the initial reranking) and for each "question + knowledge" query:

- ``rerank_by="model"``: any :class:`~ragsuite.retrieval.base.Reranker` passed as ``reranker=``: a
  cross-encoder (:class:`~ragsuite.retrieval.rerankers.CrossEncoderReranker`), ColBERT late interaction
  (``ColBERTv2Index.score``) or your own. The paper's pipeline; what ``rerank_by="auto"`` (the default)
  picks when a reranker is given. From the command line: ``--reranker cross-encoder:PATH`` or
  ``--reranker colbert:DIR``.
- ``rerank_by="lm"``: the LM scores every pool passage 0-10 against the question (and the description)
  (:class:`~ragsuite.signatures.rerank.RelevanceScore`), concurrently; ties keep the pool order. Costs
  3 x pool size LM calls, so use a small ``pool_k`` (``--reranker lm`` on the command line).
  ``score_threshold`` (not in the paper) drops the candidates an LM ranking scores below it, but never the
  ranking's best one, so the answer always has evidence: passages the initial ranking drops are neither read
  by KnowledgeDeclare nor scored again for the knowledge descriptions (fewer LM calls). 0, the default, keeps
  every candidate.
- ``rerank_by="retriever"`` (``"auto"`` without a reranker; no model needed): the primary retriever's own
  ``score(query, passages)`` when it has one (a ColBERT index), else Okapi BM25 with the pool as the
  collection (:class:`~ragsuite.retrieval.rerankers.PoolBM25`), so that passages found only by the second
  retriever are scored too.

Differences from the original (paper says / code does / ragsuite does / why; no code was released):

* **reranking model**: the paper reranks with jina-reranker-m0 (Table 3) / - / ragsuite ships no reranking
  model: ``--reranker`` loads one, else the LM or BM25 over the pool scores the candidates / model weights
  are not part of the package.
* **score threshold**: not in the paper / - / ``score_threshold`` with ``rerank_by="lm"`` drops low-scored
  candidates (0, the default, keeps all) / fewer LM calls for a tunable cost.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import dspy

from ragsuite.aio import concurrently, in_thread
from ragsuite.data.datasets import Task
from ragsuite.errors import ConfigError, RetrievalError
from ragsuite.programs.base import RAGProgram, RunLedger, register
from ragsuite.programs.knobs import Floats, Ints, Knobs, choice, integer, number
from ragsuite.programs.pipeline import aretrieve_recorded, arun_answer
from ragsuite.programs.stages import join_query
from ragsuite.retrieval.adapt import as_retriever
from ragsuite.retrieval.base import Passage, Reranker, Retriever
from ragsuite.retrieval.merge import interleave
from ragsuite.retrieval.rerankers import PoolBM25
from ragsuite.signatures.answer import answer_signature, format_passages
from ragsuite.signatures.rerank import KnowledgeDeclare, KnowledgeSummarize, RelevanceScore

logger = logging.getLogger("ragsuite.programs.diverse_rerank")

RerankBy = Literal["auto", "model", "lm", "retriever"]
DECLARE_FALLBACK: dict[str, Any] = {"required_knowledge": [], "present_knowledge": []}
SUMMARIZE_FALLBACK: dict[str, Any] = {"first_knowledge": "", "second_knowledge": ""}


def format_declaration(index: int, passage: Passage, required: Sequence[str], present: Sequence[str]) -> str:
    """One document's declaration as KnowledgeSummarize sees it."""
    title = f" ({passage.title})" if passage.title else ""
    needed = "; ".join(required) or "none listed"
    held = "; ".join(present) or "none"
    return f"[{index}]{title} required: {needed} | present in this document: {held}"


def _dropped(candidates: Sequence[Passage], ranking: Sequence[Passage]) -> dict[str, list[str]]:
    """``{"dropped": ids}`` of the candidates a ranking left out (score threshold), or ``{}``."""
    kept = {p.id for p in ranking}
    dropped = [p.id for p in candidates if p.id not in kept]
    return {"dropped": dropped} if dropped else {}


def _as_list(value: Any) -> list[str]:
    items = value if isinstance(value, (list, tuple)) else ([value] if value else [])
    return [text for text in (" ".join(str(item).split()) for item in items) if text]


@register
class DiverseRerank(RAGProgram):
    """Knowledge-aware diverse reranking: declare, summarize into two knowledge views, rerank by each,
    interleave.

    Args:
        retriever: The primary retriever (also used for ``rerank_by="retriever"``).
        second_retriever: Optional second retriever (the paper's dense side); its results are interleaved
            with the primary's. With one retriever, its ranking is the pool.
        task: Answer style: ``short``, ``long`` or ``yesno``.
        reranker: The scoring model for ``rerank_by="model"`` (e.g. a cross-encoder or a ``ColBERTv2Index``).
        **knobs: Any of :attr:`KNOBS` by name (``pool_k=50``), each declared there once with its default,
            values and meaning.

    Example:
        >>> from ragsuite import programs
        >>> cls = programs.get("diverse-rerank")
        >>> program = cls(retriever=bm25, second_retriever=dense, reranker=colbert_index)  # doctest: +SKIP
    """

    name: ClassVar[str] = "diverse-rerank"
    KNOBS: ClassVar[Knobs] = Knobs(
        integer(
            "pool_k", 50, minimum=1, search=Ints(20, 100, step=10), help="passages per retriever in the pool"
        ),
        integer(
            "declare_top",
            5,
            minimum=0,
            search=Ints(0, 8),
            help="top passages read by KnowledgeDeclare (paper's best; 0 = summarize unread)",
        ),
        integer("n", 10, minimum=1, search=Ints(3, 15), help="passages given to the answer (paper's best)"),
        choice(
            "rerank_by",
            "auto",
            ("auto", "model", "lm", "retriever"),
            help="`model` (needs `reranker=`), `lm` or `retriever`; `auto` = `model` when a reranker is "
            "given, else `retriever`",
        ),
        number(
            "score_threshold",
            0.0,
            minimum=0.0,
            maximum=10.0,
            search=Floats(0.0, 10.0),
            help='`rerank_by="lm"` only: drop candidates scored below it (0-10), except the best; other '
            "rerankers' scores have no fixed scale",
        ),
    )

    def __init__(
        self,
        *,
        retriever: Retriever | None = None,
        second_retriever: Retriever | None = None,
        task: Task = "short",
        reranker: Reranker | None = None,
        **knobs: Any,
    ) -> None:
        super().__init__(retriever=retriever, task=task, **knobs)
        self.second_retriever = as_retriever(second_retriever)
        rerank_by = self.rerank_by
        if rerank_by == "auto":
            rerank_by = "model" if reranker is not None else "retriever"
        if rerank_by == "model" and not callable(getattr(reranker, "score", None)):
            raise ConfigError(
                "rerank_by='model' needs reranker=... with a score(query, passages) method (on the command "
                "line: --reranker cross-encoder:PATH or colbert:DIR); or use rerank_by='lm' or 'retriever'"
            )
        self.rerank_by: RerankBy = rerank_by
        self.reranker = reranker
        # The retriever mode's scorer: the retriever's own scoring of given passages, else BM25 over the pool.
        own = getattr(self.retriever, "score", None)
        self._pool_scorer: Reranker = self.retriever if callable(own) else PoolBM25()  # type: ignore[assignment]
        self.knowledge_declare = dspy.Predict(KnowledgeDeclare)
        self.knowledge_summarize = dspy.Predict(KnowledgeSummarize)
        self.rerank = dspy.Predict(RelevanceScore) if rerank_by == "lm" else None
        self.answer = dspy.Predict(answer_signature(task, "passages"))

    # ------------------------------------------------------------------ stages
    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        retrievers = [self.retriever] + ([self.second_retriever] if self.second_retriever is not None else [])
        lists = await concurrently(
            lambda item: aretrieve_recorded(
                self, ledger, question, self.pool_k, retriever=item[1], retriever_index=item[0]
            ),
            list(enumerate(retrievers)),
        )
        pool = interleave(lists)
        ledger.record("pool", passage_ids=[p.id for p in pool])
        ledger.count_step()
        if not pool:
            answer = await arun_answer(self, ledger, source="passages", question=question, passages=[])
            return self.finish(ledger, answer, [])

        # The paper's initial reranking: the declarations read the top of the pool ranked for the question.
        initial = await self._rerank(ledger, question, "", pool)
        ledger.record(
            "rerank",
            by=self.rerank_by,
            focus="",
            passage_ids=[p.id for p in initial],
            **_dropped(pool, initial),
        )
        declarations = await concurrently(
            lambda item: self._declare(ledger, question, *item),
            list(enumerate(initial[: self.declare_top], start=1)),
        )
        summary = await self.acall_stage(
            ledger,
            "knowledge_summarize",
            self.knowledge_summarize,
            fallback=SUMMARIZE_FALLBACK,
            question=question,
            declarations=declarations,
        )
        focuses = [
            " ".join(str(summary.first_knowledge or "").split()),
            " ".join(str(summary.second_knowledge or "").split()),
        ]
        ledger.record("knowledge_summarize", knowledge=focuses)

        rankings = await concurrently(lambda focus: self._rerank(ledger, question, focus, initial), focuses)
        for focus, ranking in zip(focuses, rankings, strict=True):
            ledger.record(
                "rerank",
                by=self.rerank_by,
                focus=focus,
                passage_ids=[p.id for p in ranking],
                **_dropped(initial, ranking),
            )
        passages = interleave(rankings, limit=self.n)
        ledger.record("select", passage_ids=[p.id for p in passages])
        answer = await arun_answer(
            self, ledger, source="passages", question=question, passages=format_passages(passages)
        )
        return self.finish(ledger, answer, passages)

    async def _declare(self, ledger: RunLedger, question: str, index: int, passage: Passage) -> str:
        declared = await self.acall_stage(
            ledger,
            "knowledge_declare",
            self.knowledge_declare,
            fallback=DECLARE_FALLBACK,
            question=question,
            passage=passage.render(),
        )
        required = _as_list(declared.required_knowledge)
        present = _as_list(declared.present_knowledge)
        ledger.record("knowledge_declare", passage_id=passage.id, required=required, present=present)
        return format_declaration(index, passage, required, present)

    async def _rerank(
        self, ledger: RunLedger, question: str, focus: str, pool: list[Passage]
    ) -> list[Passage]:
        """Every passage of ``pool`` scored for ``question`` + ``focus`` (the question alone when ``focus``
        is empty), best first; ties keep the pool order."""
        if self.rerank_by == "lm":
            scores = await concurrently(lambda passage: self._score(ledger, question, focus, passage), pool)
        else:
            scorer = self.reranker if self.rerank_by == "model" else self._pool_scorer
            # A cross-encoder is blocking compute: a worker thread in an asynchronous run.
            scores = await in_thread(self._model_scores, scorer, join_query(question, focus), pool)
        order = sorted(range(len(pool)), key=lambda i: (-scores[i], i))
        ranked = [pool[i].with_score(scores[i]) for i in order]
        if self.rerank_by == "lm" and self.score_threshold > 0:
            # The best candidate stays even below the threshold: an empty ranking would leave the answer
            # without evidence.
            return [ranked[0]] + [p for p in ranked[1:] if (p.score or 0.0) >= self.score_threshold]
        return ranked

    @staticmethod
    def _model_scores(scorer: Any, query: str, pool: list[Passage]) -> list[float]:
        scores = [float(score) for score in scorer.score(query, pool)]
        if len(scores) != len(pool):
            raise RetrievalError(f"the reranker returned {len(scores)} scores for {len(pool)} passages")
        return scores

    async def _score(self, ledger: RunLedger, question: str, focus: str, passage: Passage) -> float:
        scored = await self.acall_stage(
            ledger,
            "rerank",
            self.rerank,
            fallback={"score": 0},
            question=question,
            focus=focus or "(none)",
            passage=passage.render(),
        )
        try:
            return min(max(float(scored.score), 0.0), 10.0)
        except (TypeError, ValueError):
            return 0.0


__all__ = ["DiverseRerank", "format_declaration"]
