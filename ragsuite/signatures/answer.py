"""Task-oriented answer signatures and the passage formatting every prompt shares.

Each task has its own answer style (DeepNote appendix B.1, Adaptive-Note's prompts): ``short`` asks for the
answer span only (multi-hop QA, NQ, TriviaQA), ``long`` for a concise journalistic paragraph (ASQA), ``yesno``
for a bare yes or no (StrategyQA). Each style exists for three sources of evidence: a note, a list of
passages, or nothing (the no-retrieval baseline). :func:`answer_signature` picks one.

Example:
    >>> import dspy
    >>> from ragsuite.signatures.answer import answer_signature, format_passages
    >>> answer = dspy.Predict(answer_signature("short", "passages"))
    >>> # answer(question="Where was Bogislaw XIII born?", passages=format_passages(passages)).answer
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import dspy

from ragsuite.errors import ConfigError
from ragsuite.retrieval.base import Passage

Source = Literal["note", "passages", "none"]


def format_passages(passages: Sequence[Passage]) -> list[str]:
    """Render passages for a prompt as ``"[i] title | text"``, numbered from 1 in the given order."""
    return [f"[{i}] {passage.render()}" for i, passage in enumerate(passages, start=1)]


# --------------------------------------------------------------------------- short span
class AnswerFromNote(dspy.Signature):
    """Answer the question using the given note. Reply with the answer only: a short span such as a name, a
    place, a date or a number, without explanation, restatement of the question, or any other words."""

    question: str = dspy.InputField()
    note: str = dspy.InputField(desc="knowledge collected for the question")
    answer: str = dspy.OutputField(desc="the answer span only")


class AnswerFromPassages(dspy.Signature):
    """Answer the question using the given passages. Reply with the answer only: a short span such as a name,
    a place, a date or a number, without explanation, restatement of the question, or any other words."""

    question: str = dspy.InputField()
    passages: list[str] = dspy.InputField(desc="retrieved passages, '[i] title | text'")
    answer: str = dspy.OutputField(desc="the answer span only")


class AnswerWithoutRetrieval(dspy.Signature):
    """Answer the question from your own knowledge. Reply with the answer only: a short span such as a name,
    a place, a date or a number, without explanation, restatement of the question, or any other words."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField(desc="the answer span only")


# --------------------------------------------------------------------------- long form (ASQA)
class LongAnswerFromNote(dspy.Signature):
    """Using only the given note, write an accurate, engaging and concise answer to the question in a
    neutral, journalistic tone."""

    question: str = dspy.InputField()
    note: str = dspy.InputField(desc="knowledge collected for the question")
    answer: str = dspy.OutputField(desc="a concise paragraph")


class LongAnswerFromPassages(dspy.Signature):
    """Using only the given passages, write an accurate, engaging and concise answer to the question in a
    neutral, journalistic tone."""

    question: str = dspy.InputField()
    passages: list[str] = dspy.InputField(desc="retrieved passages, '[i] title | text'")
    answer: str = dspy.OutputField(desc="a concise paragraph")


class LongAnswerWithoutRetrieval(dspy.Signature):
    """Write an accurate, engaging and concise answer to the question from your own knowledge, in a neutral,
    journalistic tone."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField(desc="a concise paragraph")


# --------------------------------------------------------------------------- yes / no (StrategyQA)
class YesNoFromNote(dspy.Signature):
    """Answer the yes/no question, reasoning from the given note. Reply with a single word: yes or no."""

    question: str = dspy.InputField()
    note: str = dspy.InputField(desc="knowledge collected for the question")
    answer: Literal["yes", "no"] = dspy.OutputField()


class YesNoFromPassages(dspy.Signature):
    """Answer the yes/no question, reasoning from the given passages. Reply with a single word: yes or no."""

    question: str = dspy.InputField()
    passages: list[str] = dspy.InputField(desc="retrieved passages, '[i] title | text'")
    answer: Literal["yes", "no"] = dspy.OutputField()


class YesNoWithoutRetrieval(dspy.Signature):
    """Answer the yes/no question from your own knowledge. Reply with a single word: yes or no."""

    question: str = dspy.InputField()
    answer: Literal["yes", "no"] = dspy.OutputField()


_TABLE: dict[tuple[str, str], type[dspy.Signature]] = {
    ("short", "note"): AnswerFromNote,
    ("short", "passages"): AnswerFromPassages,
    ("short", "none"): AnswerWithoutRetrieval,
    ("long", "note"): LongAnswerFromNote,
    ("long", "passages"): LongAnswerFromPassages,
    ("long", "none"): LongAnswerWithoutRetrieval,
    ("yesno", "note"): YesNoFromNote,
    ("yesno", "passages"): YesNoFromPassages,
    ("yesno", "none"): YesNoWithoutRetrieval,
}


def answer_signature(task: str, source: str) -> type[dspy.Signature]:
    """The answer signature for a task (``short``, ``long``, ``yesno``) and a source of evidence.

    Sources: ``note`` (input ``note: str``), ``passages`` (input ``passages: list[str]``, see
    :func:`format_passages`) or ``none`` (the question only). Every signature outputs ``answer``.

    Raises:
        ConfigError: for an unknown task or source.
    """
    try:
        return _TABLE[(task, source)]
    except KeyError:
        raise ConfigError(
            f"no answer signature for task={task!r}, source={source!r}; "
            "task is one of 'short', 'long', 'yesno' and source one of 'note', 'passages', 'none'"
        ) from None


__all__ = [
    "AnswerFromNote",
    "AnswerFromPassages",
    "AnswerWithoutRetrieval",
    "LongAnswerFromNote",
    "LongAnswerFromPassages",
    "LongAnswerWithoutRetrieval",
    "Source",
    "YesNoFromNote",
    "YesNoFromPassages",
    "YesNoWithoutRetrieval",
    "answer_signature",
    "format_passages",
]
