"""A griffe extension for the docs site: docstrings as ragsuite writes them, rendered by mkdocstrings.

- Griffe parses ``Examples:`` into doctest code blocks, but renders a singular ``Example:`` as a Markdown
  admonition, where a doctest line such as ``>>> [p.id for p in interleave([a, b])]`` reads as a link
  reference. ragsuite's docstrings say ``Example:``, as DSPy's do.
- Sphinx roles (``:class:`~ragsuite.retrieval.base.Reranker```, ``:func:`...```) would show their markup;
  they become code spans (the last name alone for ``~``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`(~?)([^`]+)`")


def _code_span(match: re.Match[str]) -> str:
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1]}`" if match.group(1) else f"`{target}`"


class ExampleSections(griffe.Extension):
    """Before a docstring is parsed: ``Example:`` sections become ``Examples:``, Sphinx roles code spans."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
            obj.docstring.value = _ROLE.sub(_code_span, text)
