"""The judge that picks the best and the worst of a stage's sampled replies (DeepNote Appendix B.2, D.1-D.2).

DeepNote labels its note-initialization and query-refinement data with a stronger LM (GPT-4o-mini in the
paper): shown the question, the stage's evidence and the nine sampled replies, it names the best and the
worst. The instructions below restate the paper's two judging prompts (its Tables 17-18) in our own words:

* notes are judged on relevance, coherence, completeness for the question and accuracy against the passages;
  the best must be factually supported by the passages;
* follow-up queries are judged on relevance, specificity, keyword richness and non-redundancy with the
  queries already asked; the best must help retrieve what the question needs;
* when no reply is acceptable, or they hardly differ, the judge gives the same number twice, and the
  instance yields no pair (the paper drops instances without both a positive and a negative).

A verdict without a valid best *and* a valid, different worst names neither (the official data script's
``extract_best_worst``/``LLM_score_*`` rule: a tie, a missing or out-of-range number, or an unparsable reply
all end in its ``except`` branch); the caller then carries the last sampled reply forward.

Example:
    >>> import dspy
    >>> from ragsuite.testing.scripted import ScriptedLM
    >>> judge = ScriptedLM(lambda request: {"best": 2, "worst": 1})
    >>> judge_best_worst("notes", judge, question="q", context={"passages": ["[1] a | b"]},
    ...                  candidates=["note one", "note two"])
    (1, 0, None)
    >>> judge = ScriptedLM(lambda request: {"best": 2, "worst": 2})
    >>> judge_best_worst("notes", judge, question="q", context={"passages": ["[1] a | b"]},
    ...                  candidates=["note one", "note two"])
    (None, None, 'judge gave the same best and worst')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import dspy
from dspy.utils.exceptions import AdapterParseError


class JudgeNotes(dspy.Signature):
    """Several notes were written from the same passages to help answer the question. Judge their quality and
    name the best note and the worst note by number.

    A good note is relevant to the question, coherent, complete about what the question needs, and accurate:
    everything it states must be supported by the passages. The best note must be factually correct with
    respect to the passages. If no note is correct, or the notes hardly differ in quality, give the same
    number as both best and worst."""

    question: str = dspy.InputField()
    passages: list[str] = dspy.InputField(desc="the passages the notes were written from, '[i] title | text'")
    notes: list[str] = dspy.InputField(desc="the candidate notes, '[i] note'")
    best: int = dspy.OutputField(desc="the number [i] of the best note")
    worst: int = dspy.OutputField(desc="the number [i] of the worst note")


class JudgeQueries(dspy.Signature):
    """Several sets of new search questions were proposed from a note to find what is still missing for
    answering the original question. Judge their quality and name the best set and the worst set by number.

    A good set is relevant to the original question, specific, rich in the keywords (entities, relations,
    dates) a search needs, and not redundant with the questions already asked or with what the note already
    establishes. The best set must help retrieve information that answers the original question. If no set
    would retrieve useful information, or the sets hardly differ in quality, give the same number as both
    best and worst."""

    question: str = dspy.InputField(desc="the original question")
    note: str = dspy.InputField(desc="the note the new questions were proposed from")
    asked_queries: list[str] = dspy.InputField(desc="questions asked before; new ones should not repeat them")
    candidates: list[str] = dspy.InputField(desc="the candidate sets of new questions, '[i] q1 | q2'")
    best: int = dspy.OutputField(desc="the number [i] of the best set")
    worst: int = dspy.OutputField(desc="the number [i] of the worst set")


JudgeKind = Literal["notes", "queries"]
_SIGNATURES: dict[str, type[dspy.Signature]] = {"notes": JudgeNotes, "queries": JudgeQueries}
_CANDIDATE_FIELD = {"notes": "notes", "queries": "candidates"}


def judge_instructions() -> dict[str, str]:
    """The judge's instructions by kind (recorded in the build manifest)."""
    return {kind: signature.instructions for kind, signature in _SIGNATURES.items()}


def judge_best_worst(
    kind: JudgeKind,
    lm: Any,
    *,
    question: str,
    context: Mapping[str, Any],
    candidates: Sequence[str],
) -> tuple[int | None, int | None, str | None]:
    """Ask ``lm`` for the best and the worst of ``candidates``.

    Args:
        kind: ``notes`` (note initialization) or ``queries`` (query refinement).
        lm: The judge LM.
        question: The question the candidates serve.
        context: The other inputs of the judge's signature (``passages`` for notes; ``note`` and
            ``asked_queries`` for queries).
        candidates: The replies to judge, in order; they are shown numbered from 1.

    Returns:
        ``(best, worst, why_not)``: 0-based indices into ``candidates``, or ``(None, None, reason)`` when the
        verdict names no pair: the same number twice, a missing or out-of-range number, or an unparsable
        reply. A valid best alone is not kept either: the official script discards the whole verdict then.
    """
    signature = _SIGNATURES[kind]
    numbered = [f"[{i}] {text}" for i, text in enumerate(candidates, start=1)]
    inputs = {"question": question, **context, _CANDIDATE_FIELD[kind]: numbered}
    try:
        with dspy.context(lm=lm):
            verdict = dspy.Predict(signature)(**inputs)
    except AdapterParseError:
        return None, None, "judge reply unparsable"
    best, worst = _index(verdict.get("best"), len(candidates)), _index(verdict.get("worst"), len(candidates))
    if best is None:
        return None, None, "judge named no valid best"
    if worst is None:
        return None, None, "judge named no valid worst"
    if best == worst:
        return None, None, "judge gave the same best and worst"
    return best, worst, None


def _index(value: Any, n: int) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number - 1 if 1 <= number <= n else None


__all__ = ["JudgeNotes", "JudgeQueries", "judge_best_worst", "judge_instructions"]
