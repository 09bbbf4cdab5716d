"""The note-centric stages of DeepNote (§3.1-3.2) and Adaptive-Note: initialize a note, refine queries from
the best note, update the note with new passages, and judge whether the update is better.

The instructions follow the papers' prompts (DeepNote appendix B.1, the Adaptive-Note prompt files), restated.

Example:
    >>> import dspy
    >>> from ragsuite.signatures.deepnote import NoteCompare
    >>> compare = dspy.Predict(NoteCompare)
    >>> # compare(question=q, best_note=old, updated_note=new).better  -> True / False
"""

from __future__ import annotations

import dspy

from ragsuite.signatures.compact import TEXT_MAX_CHARS, bounded

#: The longest note a schema-holding LM may write (about 500 tokens): the notes the 0.5B local model writes in
#: earnest run to 700 characters, and one that reaches this bound is a model repeating itself, which would
#: otherwise run to the 1,280-token limit (a minute of generation on 2 cores) and leave JSON cut mid-string.
NOTE_MAX_CHARS = TEXT_MAX_CHARS


class NoteInit(dspy.Signature):
    """Write a note from the given passages that gathers everything in them that helps answer the question.

    Do not restrict the note to predefined aspects: include every piece of information from the passages that
    supports answering or reasoning about the question, keep it faithful to the original wording (quote the
    passages where possible), and organize it as one coherent paragraph. If the passages hold nothing useful,
    say so briefly."""

    question: str = dspy.InputField()
    passages: list[str] = dspy.InputField(desc="retrieved passages, '[i] title | text'")
    note: str = bounded(
        dspy.OutputField(desc="a coherent paragraph of the useful information"), maxLength=NOTE_MAX_CHARS
    )


class QueryRefine(dspy.Signature):
    """Using the note, ask two new questions whose answers would fill what the note still lacks for answering
    the original question.

    Each question will be used to search for passages: make it specific and name the entities and relations
    it is about. Each question must be new: do not repeat or merely rephrase any question in the list of
    questions already asked, and do not ask about what the note already establishes."""

    question: str = dspy.InputField(desc="the original question")
    best_note: str = dspy.InputField(desc="the best note collected so far")
    asked_queries: list[str] = dspy.InputField(desc="questions already asked; do not repeat them")
    # What a schema-holding LM (llama-server) is held to beyond the type: two queries, as the paper asks, of
    # at most 500 characters each, the most that retrieval reads of a step's text (the official code's cut).
    # Without it the 0.5B local model once wrote one 5,300-character "question" up to the token limit.
    queries: list[str] = bounded(
        dspy.OutputField(desc="exactly two new questions"), maxItems=2, items={"maxLength": 500}
    )


class NoteUpdate(dspy.Signature):
    """Update the note with the newly retrieved passages.

    Add only content that is not yet in the note and that helps answer the question; ignore passages that
    do not. Stay faithful to the passages: follow their wording and use direct excerpts wherever possible
    rather than your own knowledge. Include as much of the useful new information as you can, do not repeat
    what the note already says, and keep everything the note already holds. If nothing new and useful was
    retrieved, return the note unchanged."""

    question: str = dspy.InputField()
    best_note: str = dspy.InputField(desc="the current best note")
    passages: list[str] = dspy.InputField(desc="newly retrieved passages, '[i] title | text'")
    updated_note: str = bounded(
        dspy.OutputField(desc="the note with the new useful content added"), maxLength=NOTE_MAX_CHARS
    )


class NoteCompare(dspy.Signature):
    """Decide whether the updated note is better than the best note for answering the question.

    Judge on: (1) key information directly related to the question; (2) completeness: whether it covers the
    relevant aspects; (3) level of detail: enough to understand the matter in depth; (4) practicality:
    whether it actually helps answer the question. If the updated note adds no new meaningful content over
    the best note, or adds only redundant information, it is not better. Say it is better only when it is a
    significant improvement on these criteria."""

    question: str = dspy.InputField()
    best_note: str = dspy.InputField(desc="note 1: the best note so far")
    updated_note: str = dspy.InputField(desc="note 2: the candidate update")
    better: bool = dspy.OutputField(desc="true only if the updated note is significantly better")


__all__ = ["NoteCompare", "NoteInit", "NoteUpdate", "QueryRefine"]
