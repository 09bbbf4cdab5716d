"""One DSPy Signature per stage; the docstring of each is the instruction the LM sees.

Example:
    >>> import dspy
    >>> from ragsuite.signatures import NoteInit
    >>> init = dspy.Predict(NoteInit)
"""

# A plain list of re-exports: every stage module adds its names here.
# ruff: noqa: F401

from ragsuite.signatures.answer import (
    AnswerFromNote,
    AnswerFromPassages,
    AnswerWithoutRetrieval,
    LongAnswerFromNote,
    LongAnswerFromPassages,
    LongAnswerWithoutRetrieval,
    YesNoFromNote,
    YesNoFromPassages,
    YesNoWithoutRetrieval,
    answer_signature,
    format_passages,
)
from ragsuite.signatures.blendfilter import BLEND_QUERY, BlendQueryExternal, BlendQueryInternal
from ragsuite.signatures.deepnote import NoteCompare, NoteInit, NoteUpdate, QueryRefine
from ragsuite.signatures.hanrag import Decompose, EndCheck, Filter, FilterBatch, RefineSeed, Route
from ragsuite.signatures.rerank import KnowledgeDeclare, KnowledgeSummarize, RelevanceScore
