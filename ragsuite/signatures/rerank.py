"""Knowledge-aware diverse reranking (LiveRAG 2025 winner): declare the knowledge a question needs against
each top document, summarize the declarations into two complementary knowledge queries, and (optionally)
score a passage's relevance with the LM when no reranking model is used.

Example:
    >>> import dspy
    >>> from ragsuite.signatures.rerank import KnowledgeDeclare
    >>> declare = dspy.Predict(KnowledgeDeclare)
    >>> # declare(question=q, passage=p.render()).required_knowledge
"""

from __future__ import annotations

import dspy


class KnowledgeDeclare(dspy.Signature):
    """Read the document to understand what the question is really about, then break the question down into
    the knowledge elements a complete answer needs, and list which of those elements the document already
    contains.

    Use the document to interpret the question's terms correctly (an ambiguous name may refer to a product,
    a person or a place). Each knowledge element is one short factual statement or question. The elements
    present in the document must be a subset of the required elements; list none if the document holds
    none."""

    question: str = dspy.InputField()
    passage: str = dspy.InputField(desc="a top-ranked document, 'title | text'")
    required_knowledge: list[str] = dspy.OutputField(desc="every knowledge element the answer needs")
    present_knowledge: list[str] = dspy.OutputField(desc="the required elements this document contains")


class KnowledgeSummarize(dspy.Signature):
    """Synthesize the knowledge declared from the top documents into two distinct, complementary knowledge
    descriptions. Both must be core to what the question asks, and together they should cover every aspect
    the answer needs: when the question has two sides (two entities compared, two aspects asked), give each
    description one side, so that searching with each finds different supporting documents."""

    question: str = dspy.InputField()
    declarations: list[str] = dspy.InputField(desc="per document: required and present knowledge elements")
    first_knowledge: str = dspy.OutputField(desc="the first knowledge description")
    second_knowledge: str = dspy.OutputField(desc="the second, complementary knowledge description")


class RelevanceScore(dspy.Signature):
    """Rate how useful the passage is for answering the question, with attention to the given knowledge
    focus: 0 means unrelated, 10 means it directly supplies the knowledge the focus describes."""

    question: str = dspy.InputField()
    focus: str = dspy.InputField(desc="the knowledge this ranking should favor")
    passage: str = dspy.InputField(desc="a candidate passage, 'title | text'")
    score: int = dspy.OutputField(desc="an integer from 0 to 10")


__all__ = ["KnowledgeDeclare", "KnowledgeSummarize", "RelevanceScore"]
