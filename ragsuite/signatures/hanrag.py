"""The Revelator stages of HANRAG (Sun et al.): route a question, decompose a compound question, refine the
next seed question of a complex one, decide when the steps suffice, and judge passage relevance.

The instructions restate the paper's prompts (appendix G, tables 10-13) in our own words. ``Filter`` is the
relevance discriminator, one passage per call as in the paper; ``FilterBatch`` judges a whole retrieved set in
one call (BlendFilter's knowledge filter, and HANRAG's cheap ``filter_mode="batch"``).

Example:
    >>> import dspy
    >>> from ragsuite.signatures.hanrag import Route
    >>> route = dspy.Predict(Route)
    >>> # route(question="Who succeeded the first President of Namibia?").category  -> "complex"
"""

from __future__ import annotations

from typing import Literal

import dspy

from ragsuite.signatures.compact import LIST_MAX_ITEMS, bounded

#: The four question types of HANRAG's router, in the paper's order.
RouteCategory = Literal["straightforward", "single-step", "compound", "complex"]


class Route(dspy.Signature):
    """Classify the question by how it must be answered. The four types:

    - straightforward: no external knowledge is needed; what you already know is enough to answer it
      (e.g. "Who is the first President of America?", "In which country was Einstein born?").
    - single-step: what you know cannot answer it, but looking up external knowledge once is enough
      (e.g. "Which company acquired Intime Department Store?").
    - compound: it is made of several sub-questions that are unrelated or only loosely related and need no
      complex reasoning; it must be split into sub-questions that are each answered with external knowledge
      (e.g. "What honors did Yao Ming win in the NBA? When did he retire from the NBA?").
    - complex: it is made of sub-questions nested by strong logical dependencies, so the answer to one
      sub-question is a prerequisite for asking the next (e.g. "What city is the person who broadened the
      doctrine of philosophy of language from?").

    Give the type only."""

    question: str = dspy.InputField()
    category: RouteCategory = dspy.OutputField(desc="the question type")


class Decompose(dspy.Signature):
    """Decompose the compound question into the independent sub-questions it consists of.

    Each sub-question must be a complete, self-contained question (name the entity instead of using a
    pronoun) that asks about one aspect of the original question. If the question cannot be decomposed,
    return it unchanged as the only sub-question."""

    question: str = dspy.InputField()
    sub_questions: list[str] = dspy.OutputField(desc="the sub-questions, one per aspect asked")


class RefineSeed(dspy.Signature):
    """Find the seed question: the next sub-question that must be answered to make progress on the question.

    For a complex question the seed is the first sub-question whose answer is a prerequisite for the rest.
    Use the steps already solved (seed questions and their answers): build on their answers, naming the
    entities they found, and do not ask again what they already answered. If the question is a simple
    single-step question, output it unchanged. Output the seed question only."""

    question: str = dspy.InputField(desc="the original complex question")
    steps: str = dspy.InputField(desc="seed questions answered so far with their answers, or 'nothing'")
    seed_question: str = dspy.OutputField(desc="the next seed question")


class EndCheck(dspy.Signature):
    """Decide whether the seed questions answered so far are enough to answer the original question, so that
    no further retrieval is needed. Say false when a sub-question whose answer the question depends on is
    still unanswered."""

    question: str = dspy.InputField(desc="the original complex question")
    steps: str = dspy.InputField(desc="seed questions answered so far with their answers")
    enough: bool = dspy.OutputField(desc="true when the steps suffice to answer the question")


#: The paper's relevance criterion (Table 13, rule 2); both filters state it word for word.
RELEVANCE_RULE = (
    "A passage is relevant if its content can be used to answer the question, whether it answers it directly "
    "or only serves as a reference toward the answer."
)


class Filter(dspy.Signature):
    """Judge whether the retrieved passage is relevant to the question.

    A passage is relevant if its content can be used to answer the question, whether it answers it directly
    or only serves as a reference toward the answer."""

    question: str = dspy.InputField()
    passage: str = dspy.InputField(desc="a retrieved passage, 'title | text'")
    relevant: bool = dspy.OutputField(desc="true if relevant, false if not")


class FilterBatch(dspy.Signature):
    """Among the retrieved passages, select those relevant to the question.

    A passage is relevant if its content can be used to answer the question, whether it answers it directly
    or only serves as a reference toward the answer. There may be several relevant passages, or none. Think
    it through passage by passage, then give the numbers of the relevant ones."""

    question: str = dspy.InputField()
    passages: list[str] = dspy.InputField(desc="numbered passages, '[i] title | text'")
    relevant: list[int] = bounded(
        dspy.OutputField(desc="the numbers [i] of the relevant passages; [] if none"),
        maxItems=LIST_MAX_ITEMS,  # a batch numbers one retrieval's passages (BlendFilter's K: 5)
    )


__all__ = ["Decompose", "EndCheck", "Filter", "FilterBatch", "RefineSeed", "Route", "RouteCategory"]
