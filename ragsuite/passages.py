"""The unit of text every corpus holds and every retriever returns: :class:`Passage`, and its stable id.

It sits below both :mod:`ragsuite.data` (corpus readers build passages) and :mod:`ragsuite.retrieval`
(retrievers rank them), so neither has to import the other to name it.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, replace
from typing import Any

__all__ = ["Passage", "passage_id"]


def passage_id(title: str, text: str) -> str:
    """The stable id of a passage: the first 16 hex digits of ``sha1(title + "\\n" + text)`` (the scheme of
    ragsuite's corpora, so any source of the same passage gives the same id)."""
    return hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Passage:
    """One retrievable unit of text.

    Attributes:
        id: Stable identifier (the corpus ``id``; gold passage ids refer to it).
        title: Title of the source document, possibly empty.
        text: The passage body.
        score: Retrieval score for the query that returned it (higher is better); 0.0 when not retrieved.
    """

    id: str
    title: str
    text: str
    score: float = 0.0

    def render(self) -> str:
        """The passage as an LM sees it: ``"title | text"`` (the ColBERT server convention)."""
        return f"{self.title} | {self.text}" if self.title else self.text

    def with_score(self, score: float) -> Passage:
        return replace(self, score=float(score))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Passage:
        return cls(
            id=str(data["id"]),
            title=str(data.get("title") or ""),
            text=str(data.get("text") or ""),
            score=float(data.get("score") or 0.0),
        )
