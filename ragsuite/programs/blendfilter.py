"""BlendFilter (Wang et al.): blend the question with generated knowledge into extra retrieval queries, filter
each retrieved set with the LM, and answer from the union of what was kept.

Pipeline: retrieve ``top_k`` for the question q (K_q); the external query is q joined with a chain-of-thought
answer over K_q, the internal query is q joined with the LM's own knowledge (generated concurrently); retrieve
``top_k`` for each (K_qex, K_qin); filter each set against q (the paper filters the sets separately, not their
union, to keep each filtering prompt small); answer from K_q' ∪ K_qex' ∪ K_qin' (deduplicated by id, in that
order).

Each augmented query reaches the retriever whole when it reads whole queries (BM25, dense), and cut to its
token window with the question first when it reads only the first tokens (ColBERT's 32):
:func:`ragsuite.programs.stages.blend_query`.

The knowledge filter can be probability-backed, as DeepNote's NoteCompare and HANRAG's filter are
(``decisions="probability"``, with ``filter_mode="per_passage"``): the LM states the probability that each
passage is relevant, and the passage is kept at or above ``filter_threshold``, a knob of the Optuna search
space. The batch filter (the paper's prompt) lists the relevant passages and states no per-passage
probability, so ``probability`` or a ``filter_threshold`` with it is refused.

Differences from the original (paper says / code does / ragsuite does / why; no code was released):

* **query order**: the paper writes ``q_ex = a_ex ⊕ q`` (generated text, then the question) and cuts
  nothing / - / ragsuite puts the question first, then the generated answer, then the reasoning or
  knowledge, cut only for a retriever with a token window (ColBERT: its first 32 words) / with the paper's
  order ColBERT would read only the generated text; BM25 and dense retrievers read the same words either way.
* **per-passage and probability-backed filtering**: the paper filters each set with one prompt listing the
  relevant documents / - / ``filter_mode="per_passage"`` judges each passage alone, and with
  ``decisions="probability"`` by a tunable threshold; the default is the paper's batch filter / a tunable
  filter, like DeepNote's and HANRAG's decisions.
* **ablations as knobs**: the paper's ablations drop the external or internal query / - / ``blend`` selects
  them (``"none"`` is filtered vanilla RAG) / tuning and the ablation table.
* **free-text length on a grammar-holding LM**: the paper bounds a generation by nothing but the LM's token
  limit / - / on an LM that holds replies to a JSON schema (the local LM on llama.cpp) the external query's
  chain of thought and answer, the internal query's knowledge and the batch filter's chain of thought are held
  to ``TEXT_MAX_CHARS`` (2,000) characters each (``bounded_reasoning`` and the bounds of
  ``BlendQueryExternal.answer`` and ``BlendQueryInternal.knowledge``), and the batch filter's list of
  relevant passage numbers to ``LIST_MAX_ITEMS`` (50) numbers; other LMs are bound by the token limit
  alone / the 0.5B local model's chains of thought run to 650-1,250 characters in earnest, and one that
  repeats a sentence ran to the 1,024-token limit and left JSON cut mid-string: on 4 HotpotQA questions 8
  of 24 stage calls fell back, the filter then keeping every passage. With the text bounded, the filter still
  fell back on 4 of its 450 calls on 150 held-out questions; a reply held to the schema fails to parse only
  when the token limit cuts it, and the list, which needs no more numbers than the K passages it judges, was
  the one part of the filter's reply left unbounded.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar, Literal

import dspy

from ragsuite.aio import concurrently, invoke
from ragsuite.data.datasets import Task
from ragsuite.errors import ConfigError
from ragsuite.programs.base import DecisionKnob, RAGProgram, register
from ragsuite.programs.knobs import Floats, Ints, Knobs, OneOf, choice, integer, probability
from ragsuite.programs.pipeline import DECISION_MODES, aretrieve_recorded, arun_answer, merge_passages
from ragsuite.programs.stages import FILTER_MODES, BlendStage, FilterStage
from ragsuite.retrieval.base import Retriever
from ragsuite.signatures.answer import answer_signature, format_passages

logger = logging.getLogger("ragsuite.programs.blendfilter")

BlendChoice = Literal["both", "external", "internal", "none"]
BLEND_CHOICES: tuple[str, ...] = ("both", "external", "internal", "none")


@register
class BlendFilter(RAGProgram):
    """BlendFilter: query generation blending plus LM knowledge filtering.

    Args:
        retriever: Passage retriever (the paper used ColBERTv2 over 2017 Wikipedia abstracts).
        task: Answer style: ``short``, ``long`` or ``yesno``.
        **knobs: Any of :attr:`KNOBS` by name (``top_k=5``), each declared there once with its default,
            values and meaning. ``decisions="probability"`` and ``filter_threshold`` need
            ``filter_mode="per_passage"``: the batch filter states no per-passage probability.

    Steps: 2 when the external query is used (its chain of thought is a generation over a first retrieval,
    the paper's "two-hop" remark), else 1. Retrievals: 1 + the number of blended queries.

    Example:
        >>> import dspy
        >>> from ragsuite import programs
        >>> program = programs.get("blendfilter")(retriever=retriever)  # doctest: +SKIP
        >>> with dspy.context(lm=dspy.LM("openai/gpt-4o-mini")):  # doctest: +SKIP
        ...     print(program(question="Who was born first, Glenn Hughes or Ross Lynch?").answer)
    """

    name: ClassVar[str] = "blendfilter"
    KNOBS: ClassVar[Knobs] = Knobs(
        integer("top_k", 5, minimum=1, search=Ints(3, 10), help="passages per query (the paper's K = 5)"),
        choice(
            "blend",
            "both",
            BLEND_CHOICES,
            search=OneOf(BLEND_CHOICES),
            help="which augmented queries join the question's: `both` (the paper), `external`, `internal` or "
            "`none` (the paper's ablations; `none` is filtered vanilla RAG)",
        ),
        choice(
            "filter_mode",
            "batch",
            FILTER_MODES,
            search=OneOf(("batch", "per_passage")),
            help="`batch` (the paper filters a set in one prompt) or `per_passage` (one call per passage)",
        ),
        choice(
            "decisions",
            "generate",
            DECISION_MODES,
            # The batch filter lists passages; only the per-passage one can state probabilities.
            search=OneOf(DECISION_MODES, when={"filter_mode": "per_passage"}),
            help="`generate` (the filter says which passages are relevant) or `probability` (per-passage "
            "filter only: it states the probability that a passage is relevant)",
        ),
        probability(
            "filter_threshold",
            0.5,
            search=Floats(0.05, 0.95, when={"filter_mode": "per_passage", "decisions": "probability"}),
            help="relevance threshold in `probability` mode: a passage is kept at or above it (0.5: the LM's "
            "own verdict)",
        ),
    )

    def __init__(self, *, retriever: Retriever | None = None, task: Task = "short", **knobs: Any) -> None:
        super().__init__(retriever=retriever, task=task, **knobs)
        blend, filter_mode = self.blend, self.filter_mode
        if filter_mode == "batch" and (self.decisions == "probability" or self.filter_threshold != 0.5):
            raise ConfigError(
                "the batch filter lists the relevant passages and states no per-passage probability, so it "
                f"cannot use decisions={self.decisions!r} / filter_threshold={self.filter_threshold}: "
                "set filter_mode=per_passage for a probability-backed filter"
            )
        # One stage per variant, so each has its own stage name (blend_external / blend_internal).
        self.blend_external = BlendStage(which="external") if blend in ("both", "external") else None
        self.blend_internal = BlendStage(which="internal") if blend in ("both", "internal") else None
        self.filter = (
            FilterStage(mode=filter_mode, decisions=self.decisions, threshold=self.filter_threshold)
            if filter_mode == "per_passage"
            else FilterStage(mode=filter_mode)
        )
        self.answer = dspy.Predict(answer_signature(task, "passages"))

    def decision_knobs(self) -> dict[str, DecisionKnob]:
        if self.decisions != "probability":
            return {}
        return {"filter_threshold": DecisionKnob(self.filter.per_passage, "relevant", "threshold")}

    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        first = await aretrieve_recorded(self, ledger, question, self.top_k, query_kind="question")
        stages = [
            (kind, stage)
            for kind, stage in (("external", self.blend_external), ("internal", self.blend_internal))
            if stage is not None
        ]

        async def blend(kind: str, stage: BlendStage) -> tuple[str, str]:
            return kind, (await invoke(stage, self, ledger, question, first))[0]

        queries = await concurrently(lambda item: blend(*item), stages)
        extra = await concurrently(
            lambda item: aretrieve_recorded(self, ledger, item[1], self.top_k, query_kind=item[0]), queries
        )
        kinds = ["question", *(kind for kind, _ in queries)]
        retrieved = [first, *extra]
        # Each set is filtered against the original question, as the paper's K^f = M(K | q, K_q*).
        kept = await concurrently(
            lambda index: invoke(
                self.filter, self, ledger, question, retrieved[index], query_kind=kinds[index]
            ),
            list(range(len(retrieved))),
        )
        passages = merge_passages(kept)
        ledger.record("union", passage_ids=[p.id for p in passages])
        for _ in range(2 if self.blend_external is not None else 1):
            ledger.count_step()
        answer = await arun_answer(
            self, ledger, source="passages", question=question, passages=format_passages(passages)
        )
        return self.finish(ledger, answer, passages)


__all__ = ["BLEND_CHOICES", "BlendFilter"]
