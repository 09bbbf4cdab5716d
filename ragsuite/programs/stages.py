"""Swappable stages any program can plug in: an LM passage filter and BlendFilter's query blending.

Both are ``dspy.Module``s whose predictors become part of the program that holds them (so optimizers and
per-stage LMs see them), but they do their bookkeeping in the program's run: each call takes the running
``program`` (for :meth:`~ragsuite.programs.base.RAGProgram.call_stage`, which counts LM calls and applies the
parse-error fallbacks) and its :class:`~ragsuite.programs.base.RunLedger` (trace and cost stats).

Contract used by programs (``await stage.acall(...)`` in an asynchronous run; ``aforward`` is the one
definition, ``forward`` runs it synchronously)::

    kept: list[Passage] = filter_stage(program, ledger, question, passages)
    queries: list[str] = blend_stage(program, ledger, question, passages)

Combinations this enables: ``vanilla`` + ``FilterStage`` is HANRAG's ANRAG chain without routing (or
BlendFilter without blending); ``vanilla`` + ``BlendStage`` + ``FilterStage`` is BlendFilter; ``deepnote`` +
``FilterStage`` drops irrelevant passages before they reach a note.

Example:
    >>> from ragsuite.programs.stages import BlendStage, FilterStage
    >>> from ragsuite import programs
    >>> # vanilla = programs.get("vanilla")(retriever=r, filter=FilterStage(mode="batch"), blend=BlendStage())
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any, Literal

import dspy

from ragsuite.aio import concurrently, run_sync
from ragsuite.errors import ConfigError
from ragsuite.programs.base import STAGE_KINDS, RAGProgram, RunLedger
from ragsuite.programs.pipeline import (
    MAX_QUERY_CHARS,
    DecisionMode,
    check_decisions,
    check_threshold,
    decision_predictor,
)
from ragsuite.retrieval.base import Passage, query_token_limit
from ragsuite.signatures.answer import format_passages
from ragsuite.signatures.blendfilter import BlendQueryExternal, BlendQueryInternal
from ragsuite.signatures.compact import bounded_reasoning
from ragsuite.signatures.hanrag import Filter, FilterBatch

logger = logging.getLogger("ragsuite.programs.stages")

FilterMode = Literal["per_passage", "batch"]
#: The filter modes, in the order knobs and search spaces list them.
FILTER_MODES: tuple[str, ...] = ("per_passage", "batch")
BlendWhich = Literal["both", "external", "internal"]


def join_query(question: str, text: str, *, lead: str = "", max_chars: int = MAX_QUERY_CHARS) -> str:
    """A retrieval query: ``lead`` (e.g. a generated answer), the question, then generated ``text``, cut to
    ``max_chars``.

    What must survive the cut comes first: a short generated answer (BlendFilter's ``a_ex ⊕ q``: the
    answer's keywords are what blending adds), then the question; a long generated text is cut before
    either, so retrievers with short query windows (ColBERT encodes 32 query tokens) keep both.
    """
    parts = [" ".join(part.split()) for part in (lead, question, text)]
    return "\n".join(part for part in parts if part)[:max_chars]


def blend_query(question: str, text: str, *, lead: str = "", token_limit: int | None = None) -> str:
    """BlendFilter's augmented query (the question with generated knowledge, ``q ⊕ a``), cut to fit the
    retriever that reads it: the question, then ``lead`` (a short generated answer), then ``text``.

    A retriever that reads the whole query (BM25, dense: ``token_limit`` None) gets all of it, uncut. One
    that reads only its first ``token_limit`` tokens (ColBERT: 32) gets the question first and at most
    ``token_limit`` words: every word is at least one token, so nothing the encoder would read is cut.

    Example:
        >>> blend_query("Who?", "a b c", lead="X").split("\\n")
        ['Who?', 'X', 'a b c']
        >>> blend_query("Who is it?", "a b c", lead="X", token_limit=4).split("\\n")
        ['Who is it?', 'X']
    """
    parts = [" ".join(part.split()) for part in (question, lead, text)]
    query = "\n".join(part for part in parts if part)
    if token_limit is None:
        return query
    words = list(re.finditer(r"\S+", query))
    return query if len(words) <= token_limit else query[: words[token_limit - 1].end()]


class FilterStage(dspy.Module):
    """Keep only the passages the LM judges relevant to a question (HANRAG's relevance discriminator,
    BlendFilter's knowledge filter).

    Call as ``stage(program, ledger, question, passages) -> list[Passage]``: the kept passages in their
    original order, at most ``keep`` of them. One ``"filter"`` trace event records ``kept`` (judged
    relevant) and ``dropped`` ids, and ``used`` when ``keep`` cut the kept list.

    Modes:
        ``per_passage``: one :class:`~ragsuite.signatures.hanrag.Filter` call per passage, run concurrently
            (the HANRAG paper). An unparsable verdict keeps the passage; the fallback is recorded.
        ``batch``: one :class:`~ragsuite.signatures.hanrag.FilterBatch` call for the whole set, answering
            the numbers of the relevant passages (BlendFilter's prompt); far fewer LM calls. An unparsable
            reply keeps every passage (recorded); numbers outside ``1..len(passages)`` are ignored and listed
            in the event as ``invalid``. Its chain of thought is :func:`bounded_reasoning`: a schema-holding
            LM ends it at 2,000 characters and still gives the numbers.

    Args:
        mode: ``"per_passage"`` or ``"batch"``.
        keep: At most this many kept passages are returned, best-ranked first (HANRAG's ANRAG keeps 3;
            ``None`` keeps all).
        decisions: ``"generate"`` (the LM says relevant or not) or ``"probability"`` (per-passage mode: the LM
            states the probability that the passage is relevant, kept when it is >= ``threshold``). The batch
            filter states no per-passage probability: ``probability`` with ``batch`` is refused.
        threshold: The relevance threshold in ``probability`` mode (None: 0.5, the LM's own verdict); a batch
            filter given another threshold is refused, since it could not use it.
        max_workers: Threads for per-passage calls (``None``: one per passage).

    Example:
        >>> stage = FilterStage(mode="batch")
        >>> # kept = stage(program, ledger, "Who married Edith Swan-neck?", passages)
    """

    def __init__(
        self,
        *,
        mode: FilterMode = "per_passage",
        keep: int | None = None,
        max_workers: int | None = None,
        decisions: DecisionMode = "generate",
        threshold: float | None = None,
    ) -> None:
        super().__init__()
        if mode not in ("per_passage", "batch"):
            raise ConfigError(f"filter mode must be 'per_passage' or 'batch', not {mode!r}")
        if mode == "batch" and (decisions == "probability" or threshold not in (None, 0.5)):
            raise ConfigError(
                "the batch filter states no per-passage probability, so it cannot use "
                f"decisions={decisions!r} or threshold={threshold!r}; use mode='per_passage' for a "
                "probability-backed filter, or leave both out"
            )
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise ConfigError(f"keep must be an integer >= 1 or None, not {keep!r}")
        self.keep = keep
        if max_workers is not None and max_workers < 1:
            raise ConfigError(f"max_workers must be >= 1, not {max_workers}")
        self.mode: FilterMode = mode
        self.max_workers = max_workers
        # Only the active mode's predictor exists, so optimizers never tune an unused prompt; distinct names
        # keep a saved per-passage prompt from being loaded into the batch signature.
        self.decisions = check_decisions(decisions)
        self.threshold = check_threshold("threshold", 0.5 if threshold is None else threshold)
        if mode == "per_passage":
            self.per_passage = decision_predictor(
                Filter, "relevant", mode=self.decisions, threshold=self.threshold
            )
        else:
            # The batch prompt asks to reason passage by passage (BlendFilter's filter prompt): let it.
            self.batch = dspy.ChainOfThought(FilterBatch, rationale_field=bounded_reasoning())

    def describe(self) -> dict[str, Any]:
        """The settings that rebuild this stage (saved in program files)."""
        return {
            "mode": self.mode,
            "keep": self.keep,
            "max_workers": self.max_workers,
            "decisions": self.decisions,
            "threshold": self.threshold,
        }

    def forward(self, *args: Any, **kwargs: Any) -> list[Passage]:
        """:meth:`aforward`, synchronously."""
        return run_sync(self.aforward(*args, **kwargs))

    async def aforward(
        self,
        program: RAGProgram,
        ledger: RunLedger,
        question: str,
        passages: Sequence[Passage],
        **fields: Any,
    ) -> list[Passage]:
        """Filter ``passages`` for ``question``; extra ``fields`` go into the trace event."""
        passages = list(passages)
        invalid: list[Any] = []
        if not passages:
            verdicts: list[bool] = []
        elif self.mode == "per_passage":
            verdicts = await self._per_passage(program, ledger, question, passages)
        else:
            verdicts, invalid = await self._batch(program, ledger, question, passages)
        kept = [p for p, keep in zip(passages, verdicts, strict=True) if keep]
        dropped = [p for p, keep in zip(passages, verdicts, strict=True) if not keep]
        used = kept if self.keep is None else kept[: self.keep]
        event: dict[str, Any] = {
            "question": question,
            "mode": self.mode,
            "kept": [p.id for p in kept],
            "dropped": [p.id for p in dropped],
            **({"used": [p.id for p in used]} if len(used) < len(kept) else {}),
            **fields,
        }
        if invalid:
            event["invalid"] = invalid
        ledger.record("filter", **event)
        return used

    async def _per_passage(
        self, program: RAGProgram, ledger: RunLedger, question: str, passages: list[Passage]
    ) -> list[bool]:
        async def judge(passage: Passage) -> bool:
            prediction = await program.acall_stage(
                ledger,
                "filter",
                self.per_passage,
                fallback={"relevant": True},
                question=question,
                passage=passage.render(),
            )
            return bool(prediction.relevant)

        return await concurrently(judge, passages, max_workers=self.max_workers)

    async def _batch(
        self, program: RAGProgram, ledger: RunLedger, question: str, passages: list[Passage]
    ) -> tuple[list[bool], list[Any]]:
        everything = list(range(1, len(passages) + 1))
        prediction = await program.acall_stage(
            ledger,
            "filter",
            self.batch,
            fallback={"relevant": everything},
            question=question,
            passages=format_passages(passages),
        )
        chosen: set[int] = set()
        invalid: list[Any] = []
        for number in prediction.relevant or []:
            if isinstance(number, int) and not isinstance(number, bool) and 1 <= number <= len(passages):
                chosen.add(number)
            else:
                invalid.append(number)
        if invalid:
            logger.debug("filter: ignoring passage numbers %r outside 1..%d", invalid, len(passages))
        return [i in chosen for i in everything], invalid


class BlendStage(dspy.Module):
    """BlendFilter's query blending: new retrieval queries made of the question and generated knowledge.

    Call as ``stage(program, ledger, question, passages) -> list[str]``: the augmented queries, external
    first, each the question joined with the generated text and cut to fit the program's retriever (see
    :func:`blend_query`: uncut for BM25 and dense retrievers, ColBERT's token window with the question
    first). ``passages`` are the
    ones retrieved for the question; only the external variant reads them. The two variants run
    concurrently. One ``"blend"`` trace event per variant records the generated text and the query.

    Variants:
        ``external``: chain-of-thought answer over the passages
            (:class:`~ragsuite.signatures.blendfilter.BlendQueryExternal`); reasoning and answer are the
            generated text.
        ``internal``: the LM's own knowledge about the question
            (:class:`~ragsuite.signatures.blendfilter.BlendQueryInternal`).

    An unparsable reply falls back to an empty generation (recorded), leaving the question itself as the
    query. A schema-holding LM's generated text is bounded (the chain of thought by :func:`bounded_reasoning`,
    the answer and the knowledge by their signatures' bounds), so that a model repeating itself still
    replies with valid JSON.

    Args:
        which: ``"both"``, ``"external"`` or ``"internal"``.
        max_query_chars: An extra cap on each query's length in characters (None: only the retriever's fit).

    Example:
        >>> stage = BlendStage(which="both")
        >>> # queries = stage(program, ledger, question, passages)  -> [external query, internal query]
    """

    def __init__(self, *, which: BlendWhich = "both", max_query_chars: int | None = None) -> None:
        super().__init__()
        if which not in ("both", "external", "internal"):
            raise ConfigError(f"blend must be 'both', 'external' or 'internal', not {which!r}")
        if max_query_chars is not None and (
            isinstance(max_query_chars, bool) or not isinstance(max_query_chars, int) or max_query_chars < 1
        ):
            raise ConfigError(f"max_query_chars must be an integer >= 1 or None, not {max_query_chars!r}")
        self.which: BlendWhich = which
        self.max_query_chars = max_query_chars
        self.external = (
            dspy.ChainOfThought(BlendQueryExternal, rationale_field=bounded_reasoning())
            if which in ("both", "external")
            else None
        )
        self.internal = dspy.Predict(BlendQueryInternal) if which in ("both", "internal") else None

    def describe(self) -> dict[str, Any]:
        """The settings that rebuild this stage (saved in program files)."""
        return {"which": self.which, "max_query_chars": self.max_query_chars}

    @property
    def variants(self) -> list[str]:
        """The active variants, in the order their queries are returned."""
        return [name for name in ("external", "internal") if getattr(self, name) is not None]

    def forward(self, *args: Any, **kwargs: Any) -> list[str]:
        """:meth:`aforward`, synchronously."""
        return run_sync(self.aforward(*args, **kwargs))

    async def aforward(
        self, program: RAGProgram, ledger: RunLedger, question: str, passages: Sequence[Passage]
    ) -> list[str]:
        rendered = format_passages(passages)
        token_limit = query_token_limit(program.retriever)

        def fit(text: str, lead: str = "") -> str:
            query = blend_query(question, text, lead=lead, token_limit=token_limit)
            return query if self.max_query_chars is None else query[: self.max_query_chars]

        async def generate(variant: str) -> tuple[str, str]:
            if variant == "external":
                prediction = await program.acall_stage(
                    ledger,
                    "blend_external",
                    self.external,
                    fallback={"reasoning": "", "answer": ""},
                    question=question,
                    passages=rendered,
                )
                answer = str(prediction.answer or "").strip()
                reasoning = str(prediction.reasoning or "").strip()
                text = f"{reasoning} {answer}".strip()
                query = fit(reasoning, lead=answer)
            else:
                prediction = await program.acall_stage(
                    ledger, "blend_internal", self.internal, fallback={"knowledge": ""}, question=question
                )
                text = str(prediction.knowledge or "").strip()
                query = fit(text)
            return text, query

        generated = await concurrently(generate, self.variants)
        # Recorded after both finish, in variant order, so traces do not depend on which thread won.
        for variant, (text, query) in zip(self.variants, generated, strict=True):
            ledger.record("blend", variant=variant, text=text, query=query)
        return [query for _, query in generated]


#: The stages a program can be composed with, by constructor argument (the kinds are
#: :data:`~ragsuite.programs.base.STAGE_KINDS`).
STAGE_TYPES: dict[str, type[dspy.Module]] = dict(zip(STAGE_KINDS, (FilterStage, BlendStage), strict=True))
#: The setting ``--stage KIND=VALUE`` chooses for each kind.
_STAGE_MODE = {"filter": "mode", "blend": "which"}


def build_stage(kind: str, settings: dict[str, Any] | str) -> dspy.Module:
    """A stage from its saved settings (a dict) or a command-line mode (``"batch"``, ``"both"``).

    Raises:
        ConfigError: For an unknown kind or settings the stage refuses.
    """
    if kind not in STAGE_TYPES:
        raise ConfigError(f"unknown stage {kind!r}; stages: {', '.join(STAGE_TYPES)}")
    if isinstance(settings, str):
        settings = {_STAGE_MODE[kind]: settings}
    try:
        return STAGE_TYPES[kind](**settings)
    except TypeError as exc:
        raise ConfigError(f"bad settings for the {kind} stage {settings!r}: {exc}") from None


def parse_stage_flags(items: list[str]) -> dict[str, dspy.Module]:
    """``["filter=batch", "blend=both"]`` (the ``--stage`` flag) as stage objects by constructor argument."""
    stages: dict[str, dspy.Module] = {}
    for item in items:
        kind, eq, value = item.partition("=")
        if not eq or not value:
            raise ConfigError(f"--stage expects KIND=MODE (filter=batch, blend=both), not {item!r}")
        stages[kind.strip()] = build_stage(kind.strip(), value.strip())
    return stages


__all__ = [
    "FILTER_MODES",
    "STAGE_TYPES",
    "BlendStage",
    "FilterStage",
    "build_stage",
    "join_query",
    "parse_stage_flags",
]
