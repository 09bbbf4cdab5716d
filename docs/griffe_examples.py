"""A griffe extension for the API reference: read a Google docstring's ``Example:`` section as ``Examples:``.

Griffe parses ``Examples:`` into doctest code blocks, but renders a singular ``Example:`` as a Markdown
admonition, where a doctest line such as ``>>> [p.id for p in interleave([a, b])]`` reads as a link
reference. ragsuite's docstrings say ``Example:``, as DSPy's do.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Rename every ``Example:`` section heading to ``Examples:`` before the docstring is parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
