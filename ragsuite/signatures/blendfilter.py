"""BlendFilter's query blending (Wang et al.): augment the question with knowledge, externally
(chain-of-thought over passages retrieved for the question) or internally (the LM's own knowledge). The
generated text is joined with the question to form a new retrieval query. The knowledge filter reuses
:class:`ragsuite.signatures.hanrag.FilterBatch`.

Both variants are the BlendQuery stage; ``BLEND_QUERY`` maps the variant name to its signature.

Example:
    >>> import dspy
    >>> from ragsuite.signatures.blendfilter import BlendQueryInternal
    >>> internal = dspy.Predict(BlendQueryInternal)
    >>> # internal(question="Who directed the film that ...?").knowledge
"""

from __future__ import annotations

import dspy

from ragsuite.signatures.compact import TEXT_MAX_CHARS, bounded


class BlendQueryExternal(dspy.Signature):
    """Answer the question step by step using the retrieved passages: reason about what the passages say
    that bears on the question, naming the entities, dates and relations involved, then give the answer.
    The reasoning will be used to search for more knowledge, so keep the useful keywords in it."""

    question: str = dspy.InputField()
    passages: list[str] = dspy.InputField(desc="passages retrieved for the question, '[i] title | text'")
    answer: str = bounded(
        dspy.OutputField(desc="the answer the reasoning leads to"), maxLength=TEXT_MAX_CHARS
    )


class BlendQueryInternal(dspy.Signature):
    """Write a detailed response to the question from your own knowledge: state the facts you know about the
    entities it mentions and the relations between them that lead to the answer, then give the answer. The
    response will be used to search for supporting documents, so name the relevant entities explicitly."""

    question: str = dspy.InputField()
    knowledge: str = bounded(
        dspy.OutputField(desc="a detailed response drawn from your own knowledge"), maxLength=TEXT_MAX_CHARS
    )


#: The BlendQuery variants by name.
BLEND_QUERY: dict[str, type[dspy.Signature]] = {
    "external": BlendQueryExternal,
    "internal": BlendQueryInternal,
}

__all__ = ["BLEND_QUERY", "BlendQueryExternal", "BlendQueryInternal"]
