"""DeepNote and Adaptive-Note: note-centric adaptive retrieval.

The loop follows the paper (DeepNote §3) and the official code:

1. Retrieve ``top_k`` passages for the question; ``NoteInit`` writes the first note, which is the best note.
2. While ``step < max_step``:
   a. stop if more than ``max_passages`` distinct passages have entered the notes (checked before each step;
      Adaptive-Note stops once the count *reaches* the cap: ``>= max_top_k`` in its official ``src/main.py``,
      "RP >= T_RP" in the paper);
   b. ``QueryRefine(question, best note, asked queries)`` proposes two new questions; they join the asked list
      and are retrieved as generated, repeats included, as the official code does (``dedupe_queries=True``
      drops queries already asked, and retrieves the question alone when every one repeats);
   c. retrieve ``top_k`` passages ONCE for the new queries joined with the question (newline-separated,
      truncated to 500 characters) — the official code issues one retrieval per step, not one per query;
      for a retriever that reads only the first few query tokens (ColBERT: 32) the question goes first, so
      that it is not cut off;
   d. when this step's passages would overflow ``max_passages``, only not-yet-seen passages are kept, at most
      as many as the cap leaves room for (as the official code does; when the count sits exactly at the cap
      the step keeps its full retrieval and the next check stops the loop);
   e. ``NoteUpdate(best note, passages)`` gives an updated note; ``NoteCompare`` accepts it (it becomes the
      best note) or rejects it (one more failure; failures are cumulative, not consecutive);
   f. stop once failures reach ``max_failure``.
3. Answer from the best note with the task's answer signature.

The returned ``passages`` are the evidence behind the best note: the initial retrieval and the passages of
accepted steps. ``retrieved_passages`` holds every passage that was noted, rejected steps included (these
count against ``max_passages``), so retrieval recall is not inflated by passages the answer never saw.

LM-output fallbacks (each recorded in the trace and counted in ``stats["fallbacks"]``): an unparsable
QueryRefine gives no new query (the step retrieves for the question alone) unless its ``queries`` field
holds a plain numbered list, which is read as the queries; an unparsable NoteUpdate fails the step without
a NoteCompare call; an unparsable NoteCompare means "not better"; an unparsable NoteInit keeps the
passages themselves as the note; an unparsable answer is empty.

Differences from the original:

* Query refinement on a grammar-holding LM. The paper asks for two new questions and the official code takes
  the whole reply as the step's query text, cut with the question to 500 characters. On an LM that holds
  replies to a JSON schema (the local LM on llama.cpp) ragsuite asks for at most two queries of at most 500
  characters each (the bounds of ``QueryRefine.queries``). Why: what retrieval reads is the same, and a
  small model that rambles inside one "question" (the 0.5B local model wrote 5,300 characters, to the
  1,280-token limit) no longer spends minutes of generation and carries the ramble into every later prompt.
  Other LMs' replies are read as the official code reads them.
* Note length on a grammar-holding LM. The official code bounds a note only by the 1,280-token budget; on an
  LM that holds replies to a JSON schema ragsuite holds a note to ``NOTE_MAX_CHARS`` (2,000) characters
  (the bounds of ``NoteInit.note`` and ``NoteUpdate.updated_note``). Why: the 0.5B local model's notes run
  to 700 characters, and one past 2,000 is the model repeating a sentence until the budget ends (a minute
  of generation on 2 cores, and JSON cut mid-string that no parser reads); the bound ends it as a valid
  note. Other LMs are bound by the budget alone, as in the official code.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import dspy
from dspy.utils.exceptions import AdapterParseError

from ragsuite.aio import invoke
from ragsuite.data.datasets import Task
from ragsuite.programs.base import DecisionKnob, RAGProgram, RunLedger, register
from ragsuite.programs.knobs import Floats, Ints, Knobs, OneOf, choice, flag, integer, probability
from ragsuite.programs.pipeline import (
    DECISION_MODES,
    MAX_QUERY_CHARS,
    agather,
    arun_answer,
    decision_predictor,
    decision_value,
)
from ragsuite.retrieval.base import Passage, Retriever, query_token_limit
from ragsuite.signatures.answer import answer_signature, format_passages
from ragsuite.signatures.deepnote import NOTE_MAX_CHARS, NoteCompare, NoteInit, NoteUpdate, QueryRefine

if TYPE_CHECKING:
    from ragsuite.programs.stages import BlendStage, FilterStage

logger = logging.getLogger("ragsuite.programs.deepnote")

#: Unparsable QueryRefine output: no new query, so the step retrieves for the question alone.
QUERY_REFINE_FALLBACK: dict[str, Any] = {"queries": []}
#: Unparsable NoteCompare output: the update is not better (a failure).
NOTE_COMPARE_FALLBACK: dict[str, Any] = {"better": False}


_HEADER = re.compile(r"\[\[ ## (\w+) ## \]\]")
_BULLET = re.compile(r"^\s*(?:\d+[.):]|[-*\u2022])\s*")


def salvage_queries(response: str) -> list[str]:
    """Queries from a QueryRefine reply whose ``queries`` field is not a JSON list: the field's text (the
    ``[[ ## queries ## ]]`` section, or a JSON object's ``queries`` value) split into lines, numbering and
    bullets removed. A reply without a ``queries`` field gives ``[]``."""
    text = str(response or "")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and "queries" in data:
        value = data["queries"]
        if isinstance(value, list):
            return [str(q).strip() for q in value if str(q).strip()]
        text = str(value)
    else:
        parts = _HEADER.split(text)
        sections = dict(zip(parts[1::2], parts[2::2], strict=False))
        if "queries" not in sections:
            return []  # free prose is not taken for queries
        text = sections["queries"]
    lines = (_BULLET.sub("", line).strip().strip('"').strip() for line in text.splitlines())
    return [line for line in lines if line and not line.startswith(("[", "{", "]", "}"))]


def _salvage_refine(predictor: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap QueryRefine so that a numbered or bulleted list of queries is read rather than discarded."""

    async def call(**inputs: Any) -> dspy.Prediction:
        try:
            return await invoke(predictor, **inputs)
        except AdapterParseError as exc:
            queries = salvage_queries(exc.lm_response)
            if not queries:
                raise
            return dspy.Prediction(queries=queries, salvaged=True)

    call.__wrapped__ = predictor  # type: ignore[attr-defined]  # for stage_adapter: the predictor inside
    return call


def _normalize(query: str) -> str:
    return " ".join(query.lower().split())


def _split_repeats(proposed: list[str], asked: list[str]) -> tuple[list[str], list[str]]:
    """``proposed`` queries split into those new (to ``asked`` and to the ones before them) and those that
    repeat a query, both compared case- and space-insensitively."""
    seen = {_normalize(q) for q in asked}
    new, repeated = [], []
    for query in proposed:
        (repeated if _normalize(query) in seen else new).append(query)
        seen.add(_normalize(query))
    return new, repeated


def _repeats_a_sentence(text: str) -> bool:
    """Whether a sentence of 20 characters or more comes twice in ``text``: a small model looping."""
    sentences = [_normalize(part) for part in re.split(r"(?<=[.?!])\s+", text)]
    long = [sentence for sentence in sentences if len(sentence) >= 20]
    return len(set(long)) < len(long)


def _degenerate_step(inputs: dict[str, Any], outputs: Any) -> bool:
    """A stage call a demo must not teach (see :meth:`DeepNote.sound_demo_trace`)."""
    fields = dict(outputs.items()) if hasattr(outputs, "items") else {}
    notes = [fields[name] for name in ("note", "updated_note") if isinstance(fields.get(name), str)]
    if any(len(note) >= NOTE_MAX_CHARS or _repeats_a_sentence(note) for note in notes):
        return True
    queries = [str(q) for q in fields.get("queries") or []]
    _, repeated = _split_repeats(queries, [str(q) for q in inputs.get("asked_queries") or []])
    if repeated or any(map(_repeats_a_sentence, queries)):
        return True
    best, updated = (_normalize(str(inputs.get(name, ""))) for name in ("best_note", "updated_note"))
    return fields.get("better") is True and best == updated


def retrieval_text(queries: list[str], question: str, *, token_limit: int | None = None) -> str:
    """The text retrieved for one step, one item per line, cut to 500 characters: the new queries, then the
    question (the official order). A retriever that reads only ``token_limit`` query tokens (ColBERT: 32)
    would never see the question behind two queries, so for it the question comes first."""
    lines = [*queries, question] if token_limit is None else [question, *queries]
    return "\n".join(lines)[:MAX_QUERY_CHARS]


@register
class DeepNote(RAGProgram):
    """DeepNote: collect knowledge in a note, refine queries from the best note, keep an update only when
    the LM judges it better, and stop on the failure, step or passage limits (see the module docstring).

    Stage predictors: ``note_init``, ``query_refine``, ``note_update``, ``note_compare``, ``answer``.

    Optional stages (one constructor argument each):

    * ``filter=FilterStage(...)``: every retrieved set (initial and per step) is filtered before it reaches
      the note, so only passages the LM judges relevant are noted and counted against ``max_passages``.
    * ``blend=BlendStage(...)``: the initial retrieval also retrieves the blend queries (e.g. BlendFilter's
      external/internal knowledge queries) and the note is initialized from the merged passages.
    * both: BlendFilter's retrieval feeding DeepNote's note loop.

    Args:
        retriever: Any :class:`~ragsuite.retrieval.base.Retriever`.
        task: Answer style: ``short``, ``long`` (ASQA) or ``yesno`` (StrategyQA).
        filter: Optional filtering stage applied to every retrieved set.
        blend: Optional query-blending stage for the initial retrieval.
        **knobs: Any of :attr:`KNOBS` by name (``max_step=5``), each declared there once with its default,
            values and meaning.

    Returns (from ``forward``):
        ``dspy.Prediction(answer, trace, passages, retrieved_passages, stats, note)``: ``passages`` are those
        behind the best note (initial and accepted steps), ``retrieved_passages`` every noted one; the trace
        holds a ``note_init`` event, one ``step`` event per iteration (``queries``, ``retrieval_query``,
        ``passage_ids``, ``note``, ``accepted``, ``failures``), a ``stop`` event and the ``answer``.

    Example:
        >>> import dspy
        >>> from ragsuite import programs
        >>> from ragsuite.retrieval.bm25 import BM25Retriever
        >>> retriever = BM25Retriever.from_dataset("2wikimultihopqa")  # doctest: +SKIP
        >>> deepnote = programs.get("deepnote")(retriever=retriever, task="short")  # doctest: +SKIP
        >>> with dspy.context(lm=dspy.LM("openai/gpt-4o-mini", temperature=0.1)):  # doctest: +SKIP
        ...     prediction = deepnote(question="Where was the place of death of Anna of Pomerania's father?")
        >>> for event in prediction.trace:  # doctest: +SKIP
        ...     print(event["stage"], event.get("queries"), event.get("accepted"))
    """

    name: ClassVar[str] = "deepnote"
    KNOBS: ClassVar[Knobs] = Knobs(
        integer("top_k", 5, minimum=1, search=OneOf((3, 5, 7)), help="passages per retrieval (paper: 5)"),
        integer(
            "max_step",
            3,
            minimum=0,
            search=Ints(1, 5),
            help="most refinement steps, one retrieval each (0: the note from the first retrieval only)",
        ),
        integer(
            "max_failure",
            2,
            minimum=1,
            # The paper notes a failure limit above the step limit is meaningless.
            search=Ints(1, "max_step"),
            help="stop after this many rejected updates in total (cumulative, not consecutive)",
        ),
        integer(
            "max_passages",
            15,
            minimum=1,
            search=Ints(10, 30),
            help="stop before a step once more distinct passages than this have been noted",
        ),
        flag(
            "dedupe_queries",
            False,
            help="drop refined queries that repeat an asked one (not in the official code)",
        ),
        choice(
            "decisions",
            "generate",
            DECISION_MODES,
            search=OneOf(DECISION_MODES),
            help="`generate` (NoteCompare answers yes or no, as in the paper) or `probability` (it states "
            "the probability that the update is better; accepted at or above `compare_threshold`)",
        ),
        probability(
            "compare_threshold",
            0.5,
            search=Floats(0.05, 0.95),
            help="NoteCompare's threshold in `probability` mode (0.5: the LM's own verdict)",
        ),
    )
    #: The official code's generation settings (its LLM wrapper: max_tokens 1280, top_p 0.9, temperature 0.1).
    GENERATION: ClassVar[dict[str, float | int]] = {"temperature": 0.1, "max_tokens": 1280, "top_p": 0.9}
    #: DeepNote stops when the noted passages exceed the cap; Adaptive-Note when they reach it.
    CAP_REACHED_STOPS: ClassVar[bool] = False

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
        self.note_init = dspy.Predict(NoteInit)
        self.query_refine = dspy.Predict(QueryRefine)
        self.note_update = dspy.Predict(NoteUpdate)
        self.note_compare = decision_predictor(
            NoteCompare, "better", mode=self.decisions, threshold=self.compare_threshold
        )
        self.answer = dspy.Predict(answer_signature(task, "note"))

    def sound_demo_trace(self, trace: Sequence[tuple[Any, dict[str, Any], Any]]) -> bool:
        """A trace becomes demos only if no step was degenerate: no note cut at ``NOTE_MAX_CHARS`` or
        repeating a sentence, no refined query repeated (within the reply or from the asked list) or
        repeating a sentence, and no unchanged note judged better. A small model that loops can still end
        on a right answer (a yes/no question is a coin flip), and its demos then teach the loop to every
        prompt."""
        return not any(_degenerate_step(inputs, outputs) for _, inputs, outputs in trace)

    def decision_knobs(self) -> dict[str, DecisionKnob]:
        if self.decisions != "probability":
            return {}
        return {"compare_threshold": DecisionKnob(self.note_compare, "better", "threshold")}

    # ------------------------------------------------------------------ stages
    async def _refine(
        self, ledger: RunLedger, question: str, best_note: str, asked: list[str]
    ) -> dict[str, Any]:
        prediction = await self.acall_stage(
            ledger,
            "query_refine",
            _salvage_refine(self.query_refine),
            fallback=QUERY_REFINE_FALLBACK,
            question=question,
            best_note=best_note,
            asked_queries=list(asked),
        )
        proposed = [str(q).strip() for q in (prediction.queries or [])]
        if not self.dedupe_queries:
            salvaged = bool(prediction.get("salvaged"))
            return {"queries": [q for q in proposed if q], "repeated": [], "salvaged": salvaged}
        # Optional: enforce the prompt's no-repeat rule so a disobedient LM cannot loop on the same query.
        queries, repeated = _split_repeats([q for q in proposed if q], [*asked, question])
        return {"queries": queries, "repeated": repeated, "salvaged": bool(prediction.get("salvaged"))}

    async def _update(
        self, ledger: RunLedger, question: str, best_note: str, passages: list[Passage]
    ) -> str | None:
        """The updated note, or ``None`` when the LM's reply could not be parsed (the step then fails)."""
        prediction = await self.acall_stage(
            ledger,
            "note_update",
            self.note_update,
            fallback={"updated_note": None},
            question=question,
            best_note=best_note,
            passages=format_passages(passages),
        )
        return None if prediction.updated_note is None else str(prediction.updated_note)

    # ------------------------------------------------------------------ loop
    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        initial = await agather(self, ledger, question, self.top_k, filter=self.filter, blend=self.blend)
        noted: dict[str, Passage] = {p.id: p for p in initial}
        evidence: dict[str, Passage] = dict(noted)  # behind the best note: initial + accepted steps
        # An unparsable NoteInit falls back to the passages themselves: the most faithful note there is.
        init = await self.acall_stage(
            ledger,
            "note_init",
            self.note_init,
            fallback={"note": "\n".join(format_passages(initial))},
            question=question,
            passages=format_passages(initial),
        )
        best_note = str(init.note or "")
        ledger.record("note_init", query=question, passage_ids=[p.id for p in initial], note=best_note)

        asked: list[str] = []
        failures = 0
        step = 0
        stop_reason = "max_step"
        while step < self.max_step:
            if len(noted) > self.max_passages or (self.CAP_REACHED_STOPS and len(noted) >= self.max_passages):
                stop_reason = "max_passages"
                break
            # Room left under the cap; when a full retrieval would overflow it, keep only that many new ones.
            room = self.max_passages - len(noted)
            trim = len(noted) + self.top_k > self.max_passages and room > 0

            refined = await self._refine(ledger, question, best_note, asked)
            queries = refined["queries"]
            asked.extend(queries)
            text = retrieval_text(queries, question, token_limit=query_token_limit(self.retriever))
            retrieved = await self.aretrieve(ledger, text, self.top_k)
            ledger.count_step()
            kept = (
                list(await invoke(self.filter, self, ledger, question, retrieved))
                if self.filter is not None and retrieved
                else retrieved
            )
            if trim:
                kept = [p for p in kept if p.id not in noted][:room]
            for passage in kept:
                noted.setdefault(passage.id, passage)

            note = await self._update(ledger, question, best_note, kept)
            probability = None
            if note is None:
                accepted = False
            else:
                verdict = await self.acall_stage(
                    ledger,
                    "note_compare",
                    self.note_compare,
                    fallback=NOTE_COMPARE_FALLBACK,
                    question=question,
                    best_note=best_note,
                    updated_note=note,
                )
                accepted, probability = decision_value(verdict, "better")
            if accepted:
                best_note = note  # type: ignore[assignment]
                for passage in kept:
                    evidence.setdefault(passage.id, passage)
            else:
                failures += 1
            step += 1
            ledger.record(
                "step",
                step=step,
                queries=queries,
                repeated_queries=refined["repeated"],
                queries_salvaged=refined["salvaged"],
                retrieval_query=text,
                retrieved_ids=[p.id for p in retrieved],
                passage_ids=[p.id for p in kept],
                note=note,
                accepted=accepted,
                **({"better_probability": probability} if probability is not None else {}),
                failures=failures,
            )
            if failures >= self.max_failure:
                stop_reason = "max_failure"
                break
        ledger.record("stop", reason=stop_reason, steps=step, failures=failures, noted_passages=len(noted))
        logger.debug("deepnote stopped after %d steps (%s)", step, stop_reason)

        answer = await arun_answer(self, ledger, source="note", question=question, note=best_note)
        return self.finish(
            ledger, answer, list(evidence.values()), retrieved_passages=list(noted.values()), note=best_note
        )


@register
class AdaptiveNote(DeepNote):
    """Adaptive-Note: DeepNote's loop with Adaptive-Note's defaults (one failed update stops the loop) and
    its passage cap: the loop stops once the noted passages reach ``max_passages`` (official ``src/main.py``:
    ``>= max_top_k``), where DeepNote waits until they exceed it.

    Arguments and knobs as :class:`DeepNote`'s; only ``max_failure``'s default differs (1).

    Example:
        >>> from ragsuite import programs
        >>> programs.get("adaptive-note").default_knobs()["max_failure"]
        1
    """

    name: ClassVar[str] = "adaptive-note"
    CAP_REACHED_STOPS: ClassVar[bool] = True
    KNOBS: ClassVar[Knobs] = DeepNote.KNOBS.override(max_failure=1)


__all__ = ["AdaptiveNote", "DeepNote", "retrieval_text", "salvage_queries"]
