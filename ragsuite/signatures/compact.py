"""A compact prompt for LMs whose server holds each reply to the signature's JSON schema (llama-server).

DSPy's JSON adapter teaches the reply format inside the prompt: each field is described, then shown again in
a template of the inputs and the output object, then recalled at the end of the user message. A server that
turns the schema sent as ``response_format`` into a grammar makes every reply parse whatever the prompt says,
so that teaching costs tokens and buys nothing: about 150-250 tokens a call, paid on every stage call (a
DeepNote question makes about 11) by a CPU model that reads 90 tokens a second.

:class:`CompactJSONAdapter` writes what the papers' prompts hold: the stage's instruction, one line naming
each output field and its meaning, and the inputs under plain labels (``Question:``, ``Passages:`` one per
line). Replies, demos and ``response_format`` are DSPy's JSON adapter's: a compiled program's demos reach the
prompt as user/assistant turns, and a reply is parsed exactly as before.

Example:
    >>> import dspy
    >>> from ragsuite.signatures.compact import CompactJSONAdapter
    >>> from ragsuite.signatures.deepnote import NoteInit
    >>> messages = CompactJSONAdapter().format(NoteInit, [], {"question": "Who?", "passages": ["[1] A | b"]})
    >>> print(messages[1]["content"])
    Question:
    Who?
    <BLANKLINE>
    Passages (retrieved passages, '[i] title | text'):
    [1] A | b
"""

from __future__ import annotations

import copy
import json
import textwrap
import typing
from typing import Any

import dspy
import pydantic
from dspy.adapters.utils import format_field_value
from pydantic.fields import FieldInfo


def _label(name: str, field: FieldInfo) -> str:
    """``best_note`` -> ``Best note``, with the field's description when it has one of its own."""
    label = name.replace("_", " ").capitalize()
    desc = (field.json_schema_extra or {}).get("desc") if isinstance(field.json_schema_extra, dict) else None
    return f"{label} ({desc})" if desc and desc != f"${{{name}}}" else label


def _shape(annotation: Any) -> str:
    """How a value of this type looks in the reply: a JSON skeleton, or words where JSON has none."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:  # a constrained type (e.g. a string of bounded length)
        return _shape(typing.get_args(annotation)[0])
    if annotation is bool:
        return "true or false"
    if annotation in (int, float):
        return "a number"
    if origin is list:
        (item,) = typing.get_args(annotation) or (str,)
        return f"[{_shape(item)}, ...]"
    if origin is typing.Literal:
        return "one of " + ", ".join(json.dumps(option) for option in typing.get_args(annotation))
    return '"..."'


def _render(value: Any, field: FieldInfo) -> str:
    """An input value as the model reads it: a list one item per line, anything else as DSPy writes it."""
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return "\n".join(value) if value else "(none)"
    text = format_field_value(field_info=field, value=value)
    return text if isinstance(text, str) else str(text)


#: The key of an output field's ``json_schema_extra`` holding the JSON-schema bounds of its reply.
REPLY_SCHEMA_KEY = "reply_schema"

#: The longest free text (a note, a chain of thought, generated knowledge) a schema-holding LM may write in
#: one field, about 500 tokens. What the 0.5B local model writes in earnest runs to 700-1,300 characters; a
#: reply that reaches this bound is the model repeating a sentence, which would otherwise run to the token
#: limit (a minute or more of generation on 2 cores) and leave JSON cut mid-string, which no parser reads.
TEXT_MAX_CHARS = 2000

#: The most items a schema-holding LM may write in one list (passage numbers, reading notes, reasoning steps).
#: Each such list counts at most the passages of one retrieval or the steps of one draft, so a longer one can
#: only be the model counting on or repeating itself, which would run to the token limit and leave the JSON
#: cut mid-list.
LIST_MAX_ITEMS = 50


def bounded(field: FieldInfo, **schema: Any) -> FieldInfo:
    """``field`` with JSON-schema bounds (``maxLength=2000``, ``maxItems=2``, ``items={"maxLength": 500}``)
    that :class:`CompactJSONAdapter` adds to the reply schema it sends, so a server that holds replies to
    the schema (llama-server) holds them to these bounds too. Parsing is unchanged.

    The bounds live on the field, not the signature class: DSPy rebuilds a signature as a new class when an
    optimizer rewrites its instructions or a saved program is loaded, and keeps its fields.

    Example:
        >>> import dspy
        >>> note = bounded(dspy.OutputField(desc="a paragraph"), maxLength=2000)
        >>> reply_bounds(note)
        {'maxLength': 2000}
    """
    if not isinstance(field.json_schema_extra, dict):
        raise TypeError("bounded() takes a dspy.InputField/OutputField")
    # In place: pydantic rebuilds the field from the attributes it was created with, this dict among them.
    field.json_schema_extra[REPLY_SCHEMA_KEY] = schema
    return field


def bounded_reasoning() -> FieldInfo:
    """The ``reasoning`` field ``dspy.ChainOfThought`` adds, bounded to :data:`TEXT_MAX_CHARS`: pass it as
    ``rationale_field`` so that a chain of thought that repeats itself still ends as valid JSON, with the
    answer fields after it.

    Example:
        >>> import dspy
        >>> cot = dspy.ChainOfThought("question -> answer", rationale_field=bounded_reasoning())
        >>> reply_bounds(cot.predict.signature.output_fields["reasoning"])
        {'maxLength': 2000}
    """
    return bounded(dspy.OutputField(desc="${reasoning}"), maxLength=TEXT_MAX_CHARS)


def reply_bounds(field: FieldInfo) -> dict[str, Any]:
    """The bounds :func:`bounded` gave ``field`` (empty without)."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return dict(extra.get(REPLY_SCHEMA_KEY) or {})


def _merge(target: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value


class CompactJSONAdapter(dspy.JSONAdapter):
    """DSPy's JSON adapter with a prompt of the instruction, the output fields in one line and the labelled
    inputs (see the module docstring). For LMs that enforce ``response_format`` with a grammar."""

    def _prepare_response_format(self, lm: Any, lm_kwargs: dict[str, Any], signature: Any) -> None:
        """DSPy's schema for ``response_format``, with the output fields' :func:`bounded` bounds merged in
        (e.g. at most two queries of at most 500 characters): the grammar holds the reply to them.
        """
        super()._prepare_response_format(lm, lm_kwargs, signature)
        bounds = {name: reply_bounds(field) for name, field in signature.output_fields.items()}
        bounds = {name: extra for name, extra in bounds.items() if extra}
        model = lm_kwargs.get("response_format")
        if not bounds or not (isinstance(model, type) and issubclass(model, pydantic.BaseModel)):
            return
        schema = copy.deepcopy(model.model_json_schema())
        for name, extra in bounds.items():
            _merge(schema.get("properties", {}).setdefault(name, {}), extra)
        model.model_json_schema = lambda *args, **kwargs: schema  # as DSPy itself hands its schema over

    def format_system_message(self, signature: type[dspy.Signature]) -> str:
        instruction = textwrap.dedent(signature.instructions).strip()
        return f"{instruction}\n\n{self.format_field_structure(signature)}"

    def format_field_structure(self, signature: type[dspy.Signature]) -> str:
        fields = []
        for name, field in signature.output_fields.items():
            desc = (field.json_schema_extra or {}).get("desc")
            meaning = f" ({desc})" if desc and desc != f"${{{name}}}" else ""
            fields.append(f'"{name}": {_shape(field.annotation)}{meaning}')
        return "Reply with a JSON object: {" + ", ".join(fields) + "}"

    def format_user_message_content(
        self,
        signature: type[dspy.Signature],
        inputs: dict[str, Any],
        prefix: str = "",
        suffix: str = "",
        main_request: bool = False,
    ) -> str:
        parts = [prefix] if prefix else []
        for name, field in signature.input_fields.items():
            if name in inputs:
                parts.append(f"{_label(name, field)}:\n{_render(inputs[name], field)}")
        if suffix:
            parts.append(suffix)
        return "\n\n".join(parts).strip()


__all__ = [
    "LIST_MAX_ITEMS",
    "TEXT_MAX_CHARS",
    "CompactJSONAdapter",
    "bounded",
    "bounded_reasoning",
    "reply_bounds",
]
