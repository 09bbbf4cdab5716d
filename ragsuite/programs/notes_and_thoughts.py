"""Chain-of-Note and RAT, two baselines of DeepNote's Table 1, and DeepNote's two ablations.

Chain-of-Note (Yu et al., 2023): retrieve ``top_k`` passages; write one reading note per passage that says
what it contributes to the question and whether it is relevant (``ReadingNotes``); answer from the notes in
the task's style. An unparsable notes reply falls back to the passages themselves as the notes.

Differences from the original (Chain-of-Note; the authors released no code):

* The paper's model writes the notes and the answer in one output; here they are two calls. Why: the answer
  uses the same task-specific answer prompts as every other program.
* The paper fine-tunes LLaMa-2 on notes written by ChatGPT; here any LM writes them from the instruction.
  Why: ragsuite's baselines run on the LM under comparison.
* On an LM that holds replies to a JSON schema (the local LM on llama.cpp), the notes are at most
  ``LIST_MAX_ITEMS`` (50) of at most ``TEXT_MAX_CHARS`` (2,000) characters each; the paper bounds them by the
  token limit alone, as ragsuite does on other LMs. Why: a small model that repeats itself would write to
  the token limit and leave its JSON cut, and the notes would fall back to the passages.

RAT (Wang et al., 2024, "Retrieval Augmented Thoughts"; the authors' code, github.com/CraftJarvis/RAT,
``app/gradio_app.py`` and ``creative.ipynb``): draft a chain of thought without retrieval
(``DraftThoughts``, the authors' draft and split into paragraphs), drop pieces of 5 characters or fewer (the
app's ``split_draft`` keeps ``len(para) > 5``), and revise the draft chunk by chunk: for chunk i, retrieve
``top_k`` passages for the question and the chunk, and revise the chunk with them given the already revised
chunks (``ReviseThought``): one retrieval and one revision per chunk. At most ``max_thoughts`` chunks are
revised (default 3; later chunks are dropped); an unparsable revision keeps the draft chunk. The reader
answers from the revised chain in the task's style. An empty or unparsable draft makes no step, as in the
app: its loop over the draft's paragraphs runs over none, so nothing is retrieved or revised and the answer
is "" (the reader is not called).

Differences from the original (RAT):

* How many chunks. The paper revises every thought step; the notebook revises every paragraph of the draft,
  with no cap; the app's split prompt asks the LM for "less than 4" paragraphs (``NUM_PARAGRAPHS = 4``) but
  revises as many as come back; ragsuite revises at most ``max_thoughts`` chunks, 3 by default, and drops
  the rest. Why: a fixed bound on the LM calls per question (the app's request, kept when the LM writes
  more); ``max_thoughts`` is a knob for those who want more.
* Query. The authors ask the LM for a search query per chunk (``get_query``); here the draft chunk joined
  with the question is the query. Why: one LM call fewer per chunk, and a passage retriever takes the
  chunk's words directly.
* What is revised. The authors append chunk i to the answer so far and revise that whole text with each of
  up to 2 pieces of one retrieved web page (``LIMIT = 2``); ragsuite revises chunk i alone, given the
  revised chunks before it, with the ``top_k`` passages in one call. Why: a passage retriever returns
  passages, not a page to cut into pieces; one call per chunk keeps the cost the paper reports per step.
* Ending. The authors end with a "reflect" call that adds titles to the long answer; ragsuite answers the
  question from the revised chain with the task's reader. Why: the QA tables score a short answer.
* Free-text length. The authors bound the draft and each revision by the token limit alone; on an LM that
  holds replies to a JSON schema (the local LM on llama.cpp), ragsuite holds the draft to ``LIST_MAX_ITEMS``
  (50) steps and each step, drafted or revised, to ``TEXT_MAX_CHARS`` (2,000) characters; other LMs are
  bound by the token limit alone. Why: a small model that repeats itself would write to the token limit and
  leave its JSON cut, and the draft would make no step or the revision keep the draft chunk.

DeepNote's ablations (its Table 2) are presets: ``deepnote-no-adaptive`` answers from the initial note
(``max_step=0``); ``deepnote-no-adaptive-no-note`` is vanilla RAG over the same first retrieval.
"""

from __future__ import annotations

from typing import Any, ClassVar

import dspy

from ragsuite.data.datasets import Task
from ragsuite.programs.base import RAGProgram, register
from ragsuite.programs.baselines import VanillaRAG
from ragsuite.programs.deepnote import DeepNote
from ragsuite.programs.knobs import Ints, Knobs, OneOf, integer
from ragsuite.programs.pipeline import aretrieve_recorded, arun_answer, merge_passages
from ragsuite.programs.stages import join_query
from ragsuite.retrieval.base import Retriever
from ragsuite.signatures.answer import answer_signature, format_passages
from ragsuite.signatures.reasoning import DraftThoughts, ReadingNotes, ReviseThought


@register
class ChainOfNote(RAGProgram):
    """Chain-of-Note: a reading note per retrieved passage, then the answer from the notes.

    Stage predictors: ``reading_notes``, ``answer``.

    Args:
        retriever: Any :class:`~ragsuite.retrieval.base.Retriever`.
        task: Answer style: ``short``, ``long`` or ``yesno``.
        **knobs: Any of :attr:`KNOBS` by name.

    Example:
        >>> from ragsuite import programs
        >>> programs.get("con").default_knobs()
        {'top_k': 5}
    """

    name: ClassVar[str] = "con"
    KNOBS: ClassVar[Knobs] = VanillaRAG.KNOBS.replace(
        "top_k", help="passages retrieved (DeepNote's baselines: 5)"
    )

    def __init__(self, *, retriever: Retriever | None = None, task: Task = "short", **knobs: Any) -> None:
        super().__init__(retriever=retriever, task=task, **knobs)
        self.reading_notes = dspy.Predict(ReadingNotes)
        self.answer = dspy.Predict(answer_signature(task, "note"))

    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        passages = await aretrieve_recorded(self, ledger, question, self.top_k)
        ledger.count_step()
        rendered = format_passages(passages)
        written = await self.acall_stage(
            ledger,
            "reading_notes",
            self.reading_notes,
            fallback={"notes": rendered},
            question=question,
            passages=rendered,
        )
        notes = [" ".join(str(n).split()) for n in (written.notes or []) if str(n).strip()]
        ledger.record("reading_notes", notes=notes)
        note = "\n".join(f"Note {i}: {text}" for i, text in enumerate(notes, start=1)) or "nothing"
        answer = await arun_answer(self, ledger, source="note", question=question, note=note)
        return self.finish(ledger, answer, passages, notes=notes)


@register
class RAT(RAGProgram):
    """RAT: draft a chain of thought, revise each step with passages retrieved for it, answer from the
    revised chain (see the module docstring).

    Stage predictors: ``draft``, ``revise``, ``answer``.

    Args:
        retriever: Any :class:`~ragsuite.retrieval.base.Retriever`.
        task: Answer style: ``short``, ``long`` or ``yesno``.
        **knobs: Any of :attr:`KNOBS` by name.

    Example:
        >>> from ragsuite import programs
        >>> programs.get("rat").default_knobs()
        {'top_k': 3, 'max_thoughts': 3}
    """

    name: ClassVar[str] = "rat"
    KNOBS: ClassVar[Knobs] = Knobs(
        integer("top_k", 3, minimum=1, search=Ints(1, 7), help="passages retrieved per chunk (ours: 3)"),
        integer(
            "max_thoughts",
            3,
            minimum=1,
            search=Ints(1, 8),
            help="most draft chunks revised (3: the app asks its LM for fewer than 4 paragraphs; the "
            "notebook has no cap); later chunks are dropped",
        ),
    )

    def __init__(self, *, retriever: Retriever | None = None, task: Task = "short", **knobs: Any) -> None:
        super().__init__(retriever=retriever, task=task, **knobs)
        self.draft = dspy.Predict(DraftThoughts)
        self.revise = dspy.Predict(ReviseThought)
        self.answer = dspy.Predict(answer_signature(task, "note"))

    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        drafted = await self.acall_stage(
            ledger, "draft", self.draft, fallback={"thoughts": []}, question=question
        )
        pieces = [str(t) for t in (drafted.thoughts or [])]
        # The authors' split_draft keeps pieces longer than 5 characters (stray headings, "##", blanks).
        draft = [" ".join(t.split()) for t in pieces if len(t) > 5 and t.strip()]
        short = [t for t in pieces if len(t) <= 5 and t.strip()]
        ledger.record(
            "draft",
            thoughts=draft,
            **({"dropped": draft[self.max_thoughts :]} if len(draft) > self.max_thoughts else {}),
            **({"too_short": short} if short else {}),
        )
        draft = draft[: self.max_thoughts]
        if not draft:  # the authors' loop over no paragraphs: nothing retrieved or revised, the answer ""
            ledger.record("answer", source="none", answer="")
            return self.finish(ledger, "", [], thoughts=[])
        revised: list[str] = []
        evidence = []
        for step, thought in enumerate(draft, start=1):
            passages = await self.aretrieve(ledger, join_query(question, thought), self.top_k)
            ledger.count_step()
            output = await self.acall_stage(
                ledger,
                "revise",
                self.revise,
                fallback={"revised_step": thought},
                question=question,
                previous_steps=list(revised),
                step=thought,
                passages=format_passages(passages),
            )
            revised.append(" ".join(str(output.revised_step or thought).split()))
            evidence.append(passages)
            ledger.record(
                "revise", step=step, draft=thought, revised=revised[-1], passage_ids=[p.id for p in passages]
            )
        note = "\n".join(f"Step {i}: {text}" for i, text in enumerate(revised, start=1))
        answer = await arun_answer(self, ledger, source="note", question=question, note=note)
        return self.finish(ledger, answer, merge_passages(evidence), thoughts=revised)


@register
class DeepNoteWithoutAdaptiveRetrieval(DeepNote):
    """DeepNote's ablation "w/o Adap. Retrieval" (Table 2): the initial note alone, no refinement loop.

    Example:
        >>> from ragsuite import programs
        >>> programs.get("deepnote-no-adaptive").default_knobs()["max_step"]
        0
    """

    name: ClassVar[str] = "deepnote-no-adaptive"
    # Only the first retrieval varies: the ablation has no loop to tune.
    KNOBS: ClassVar[Knobs] = (
        DeepNote.KNOBS.override(max_step=0).replace("top_k", search=OneOf((3, 5, 7, 10))).tuned("top_k")
    )

    def __init__(self, *, retriever: Retriever | None = None, task: Task = "short", **knobs: Any) -> None:
        # The ablation takes no stages: the paper's Table 2 runs it on plain retrieval.
        super().__init__(retriever=retriever, task=task, **knobs)


@register
class DeepNoteWithoutAdaptiveRetrievalOrNote(VanillaRAG):
    """DeepNote's ablation "w/o Adap. Retrieval & Init. Note" (Table 2): no note at all, i.e. vanilla RAG
    over the first ``top_k`` passages (the paper compares it with the initial note).

    Example:
        >>> from ragsuite import programs
        >>> programs.get("deepnote-no-adaptive-no-note").default_knobs()
        {'top_k': 5}
    """

    name: ClassVar[str] = "deepnote-no-adaptive-no-note"


__all__ = ["RAT", "ChainOfNote", "DeepNoteWithoutAdaptiveRetrieval", "DeepNoteWithoutAdaptiveRetrievalOrNote"]
