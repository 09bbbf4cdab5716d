"""Stages of the baselines the DeepNote and HANRAG papers compare against: IRCoT's interleaved reasoning step,
Adaptive-RAG's query-complexity classifier, Chain-of-Note's reading notes, and RAT's draft and revision.

The instructions restate each method's prompt in our own words. On an LM that holds replies to a JSON schema
(the local LM on llama.cpp), the free text of IRCoT, Chain-of-Note and RAT is held to ``TEXT_MAX_CHARS``
characters a field or list item and their lists to ``LIST_MAX_ITEMS`` items (see
:func:`~ragsuite.signatures.compact.bounded`); other LMs are bound by the token limit alone.

Example:
    >>> import dspy
    >>> from ragsuite.signatures.reasoning import NextThought
    >>> step = dspy.Predict(NextThought)
    >>> # step(question=q, passages=[...], thoughts=[]).thought  -> "Jaws was directed by Steven Spielberg."
"""

from __future__ import annotations

from typing import Literal

import dspy

from ragsuite.signatures.compact import LIST_MAX_ITEMS, TEXT_MAX_CHARS, bounded

#: Adaptive-RAG's three complexity classes: no retrieval, single-step retrieval, multi-step (IRCoT).
Complexity = Literal["A", "B", "C"]


class NextThought(dspy.Signature):
    """Continue the step-by-step reasoning that answers the question, using the passages. Write exactly one
    new sentence of reasoning that follows from the sentences written so far. When the reasoning reaches the
    answer, write the final sentence as "So the answer is: <answer>."."""

    question: str = dspy.InputField()
    passages: list[str] = dspy.InputField(desc="passages collected so far, '[i] title | text'")
    thoughts: list[str] = dspy.InputField(desc="the reasoning sentences written so far, in order")
    thought: str = bounded(dspy.OutputField(desc="one new sentence of reasoning"), maxLength=TEXT_MAX_CHARS)


class CoTReader(dspy.Signature):
    """Answer the question from the passages by reasoning step by step. End the reasoning with the sentence
    "So the answer is: <answer>.", the answer as short as possible."""

    question: str = dspy.InputField()
    passages: list[str] = dspy.InputField(desc="retrieved passages, '[i] title | text'")
    reasoning: str = bounded(
        dspy.OutputField(desc='step-by-step reasoning ending in "So the answer is: <answer>."'),
        maxLength=TEXT_MAX_CHARS,
    )


class LookAhead(dspy.Signature):
    """Write the next sentence of the answer to the question, continuing the answer written so far and using
    the passages. If you are not confident about a fact the sentence needs, also write a search query that
    would find it; otherwise leave the query empty. When the answer is complete, write its last sentence as
    "So the answer is: <answer>."."""

    question: str = dspy.InputField()
    passages: list[str] = dspy.InputField(
        desc="passages retrieved so far for this sentence, '[i] title | text'"
    )
    answer_so_far: str = dspy.InputField(desc="the sentences written so far")
    search_query: str = dspy.OutputField(desc="a search query for what you are unsure of, or empty")
    sentence: str = dspy.OutputField(desc="the next sentence")


class NextSentence(dspy.Signature):
    """Write the next sentence of the answer to the question, continuing the answer written so far and using
    the passages. When the answer is complete, write its last sentence as "So the answer is: <answer>."."""

    question: str = dspy.InputField()
    passages: list[str] = dspy.InputField(desc="passages retrieved for this sentence, '[i] title | text'")
    answer_so_far: str = dspy.InputField(desc="the sentences written so far")
    sentence: str = dspy.OutputField(desc="the next sentence")


class QueryComplexity(dspy.Signature):
    """Classify how much retrieval the question needs.

    A: it can be answered from general knowledge, with no retrieval.
    B: one retrieval of documents about the question is enough (a single-hop question).
    C: it needs several retrieval and reasoning steps, each building on the previous one (a multi-hop
       question)."""

    question: str = dspy.InputField()
    complexity: Complexity = dspy.OutputField(desc="A, B or C")


class RetrievalNeed(dspy.Signature):
    """Decide whether you can answer the question reliably from your own knowledge. Say that retrieval is
    needed when the question asks about a little-known entity, a specific detail you are not sure of, or
    anything you might misremember; say it is not needed only for widely known facts."""

    question: str = dspy.InputField()
    needs_retrieval: bool = dspy.OutputField(desc="true when documents must be retrieved to answer reliably")


class CritiquedAnswer(dspy.Signature):
    """Answer the question from the passage, then critique your own answer as Self-RAG's reflection tokens do:
    is the passage relevant to the question (IsREL); is the answer supported by the passage, fully,
    partially or not at all (IsSUP); and how useful is the answer to the question, from 1 (not at all) to 5
    (complete and helpful) (IsUSE)."""

    question: str = dspy.InputField()
    passage: str = dspy.InputField(desc="one retrieved passage, 'title | text'")
    answer: str = dspy.OutputField(desc="the answer the passage supports, as short as possible")
    relevant: bool = dspy.OutputField(desc="IsREL: the passage is relevant to the question")
    supported: Literal["fully", "partially", "no"] = dspy.OutputField(
        desc="IsSUP: how the passage supports it"
    )
    usefulness: int = dspy.OutputField(desc="IsUSE: 1 to 5")


class ReadingNotes(dspy.Signature):
    """Read the retrieved passages one at a time and write a reading note for each: what the passage says that
    bears on the question, and whether it is relevant, answers the question directly, or only gives useful
    context. Passages that are irrelevant get a note saying so. The notes should make clear which passages
    can be trusted to answer the question, and whether the answer must come from general knowledge instead."""

    question: str = dspy.InputField()
    passages: list[str] = dspy.InputField(desc="retrieved passages, '[i] title | text'")
    notes: list[str] = bounded(
        dspy.OutputField(desc="one reading note per passage, in order"),
        maxItems=LIST_MAX_ITEMS,
        items={"maxLength": TEXT_MAX_CHARS},
    )


class DraftThoughts(dspy.Signature):
    """Think step by step and answer the question from your own knowledge. Write the reasoning as a list of
    short paragraphs, one step each, ending with the answer."""

    question: str = dspy.InputField()
    thoughts: list[str] = bounded(
        dspy.OutputField(desc="the reasoning steps, in order"),
        maxItems=LIST_MAX_ITEMS,
        items={"maxLength": TEXT_MAX_CHARS},
    )


class ReviseThought(dspy.Signature):
    """Revise one step of a draft reasoning with the retrieved passages: correct what the passages contradict,
    add the facts they provide that the step needs, and keep the step's role in the reasoning. If the
    passages are irrelevant, return the step unchanged."""

    question: str = dspy.InputField()
    previous_steps: list[str] = dspy.InputField(desc="the steps before this one, already revised")
    step: str = dspy.InputField(desc="the draft step to revise")
    passages: list[str] = dspy.InputField(desc="passages retrieved for this step, '[i] title | text'")
    revised_step: str = bounded(dspy.OutputField(desc="the revised step"), maxLength=TEXT_MAX_CHARS)


__all__ = [
    "CoTReader",
    "Complexity",
    "CritiquedAnswer",
    "DraftThoughts",
    "LookAhead",
    "NextSentence",
    "NextThought",
    "QueryComplexity",
    "ReadingNotes",
    "RetrievalNeed",
    "ReviseThought",
]
