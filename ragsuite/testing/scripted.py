"""A scripted LM that answers DSPy ChatAdapter prompts through a Python function.

The responder sees which stage is asking (its instructions), the input field values and the output fields
requested, and returns the output field values (a dict) or raw text (to simulate malformed output).

Example:
    >>> import dspy
    >>> lm = ScriptedLM(lambda req: {"answer": req.inputs["question"].upper()})
    >>> dspy.configure(lm=lm)
    >>> dspy.Predict("question -> answer")(question="hi").answer
    'HI'
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dspy.utils.dummies import DummyLM

_HEADER = re.compile(r"\[\[ ## (\w+) ## \]\]")
_FIELD_LINE = re.compile(r"^\d+\. `(\w+)`", re.MULTILINE)


@dataclass
class ScriptedRequest:
    """One LM call as the responder sees it.

    Attributes:
        instructions: The signature's instructions (its docstring, or the optimized instruction).
        inputs: Input field name -> rendered value (text as DSPy formatted it; lists appear as JSON).
        output_fields: Output field names the prompt asks for, in order (``reasoning`` first for CoT).
        system: The whole system message.
        user: The last user message.
        messages: Every message, demos included.
        sampling: The request's sampling settings (``temperature``, ``top_p``, ``seed``, ``max_tokens`` or
            ``max_completion_tokens``) where the transport carries them (the local OpenAI-compatible server
            does; :class:`ScriptedLM` does not), and the log-probability settings (``logprobs``,
            ``top_logprobs``).
        prompt: The raw prompt of a ``/v1/completions`` request (None for chat requests).
    """

    instructions: str
    inputs: dict[str, str]
    output_fields: list[str]
    system: str
    user: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)
    prompt: str | None = None

    def asks_for(self, *names: str) -> bool:
        """Whether every one of ``names`` is among the requested output fields."""
        return all(name in self.output_fields for name in names)


def _split_fields(text: str) -> dict[str, str]:
    parts = _HEADER.split(text)
    values: dict[str, str] = {}
    for name, value in zip(parts[1::2], parts[2::2], strict=False):
        values[name] = value.strip()
    return values


def parse_chat_messages(messages: list[dict[str, Any]]) -> ScriptedRequest:
    """Recover instructions, inputs and requested outputs from ChatAdapter-formatted messages."""
    system = next((str(m.get("content") or "") for m in messages if m.get("role") == "system"), "")
    user = str(messages[-1].get("content") or "") if messages else ""
    outputs_section = system.split("Your output fields are:", 1)[-1].split("All interactions", 1)[0]
    output_fields = _FIELD_LINE.findall(outputs_section)
    instructions = system.split("your objective is:", 1)[-1].strip() if "your objective is:" in system else ""
    # The trailing "Respond with ..." sentence names the output headers; it is not an input.
    body = user.split("Respond with the corresponding output fields", 1)[0]
    inputs = {k: v for k, v in _split_fields(body).items() if k != "completed"}
    return ScriptedRequest(instructions, inputs, output_fields, system, user, list(messages))


def format_chat_reply(values: dict[str, Any]) -> str:
    """Render output field values the way ChatAdapter expects them back."""
    blocks = []
    for name, value in values.items():
        if isinstance(value, (list, dict)):
            import json

            value = json.dumps(value)
        blocks.append(f"[[ ## {name} ## ]]\n{value}")
    blocks.append("[[ ## completed ## ]]")
    return "\n\n".join(blocks)


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token with its log probability and the alternatives the server reports.

    Attributes:
        token: The token text.
        logprob: Its natural-log probability (``<= 0``).
        top: Alternatives as ``(token, logprob)`` pairs, most likely first; the chosen token is added to the
            reported ``top_logprobs`` where it is missing.
    """

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if not self.logprob <= 0.0:
            raise ValueError(f"the logprob of {self.token!r} must be <= 0, not {self.logprob!r}")


@dataclass(frozen=True)
class Reply:
    """A responder's answer with scripted log probabilities.

    Attributes:
        content: Output field values (rendered as ChatAdapter text) or raw text, as a plain responder returns.
        word_probs: Probability (``0 < p <= 1``) of the tokens whose stripped text is a key; other tokens get
            the server's ``default_logprob``.
        tokens: The exact tokens of the reply instead (their texts must concatenate to the rendered text).

    Example:
        >>> Reply({"answer": "Paris"}, word_probs={"Paris": 0.3})  # doctest: +SKIP
    """

    content: dict[str, Any] | str
    word_probs: Mapping[str, float] = field(default_factory=dict)
    tokens: Sequence[TokenLogprob] | None = None

    def __post_init__(self) -> None:
        for word, prob in self.word_probs.items():
            if not 0.0 < prob <= 1.0:
                raise ValueError(f"the probability of {word!r} must be in (0, 1], not {prob!r}")


Responder = Callable[[ScriptedRequest], "dict[str, Any] | str | Reply"]


def render_reply(request: ScriptedRequest, values: dict[str, Any] | str | Reply) -> str:
    """A responder's answer as ChatAdapter text: raw strings pass through verbatim; field values are put in
    the order the prompt asked for, with a placeholder ``reasoning`` when the prompt wants one. A
    :class:`Reply` renders its content (its log probabilities only reach clients of the local server)."""
    if isinstance(values, Reply):
        values = values.content
    if isinstance(values, str):
        return values
    values = dict(values)
    if "reasoning" in request.output_fields and "reasoning" not in values:
        values = {"reasoning": "scripted", **values}
    ordered = {name: values[name] for name in request.output_fields if name in values}
    ordered.update({k: v for k, v in values.items() if k not in ordered})
    return format_chat_reply(ordered)


class ScriptedLM(DummyLM):
    """A DSPy LM whose replies come from ``responder(request)``.

    Args:
        responder: Returns output field values (``reasoning`` may be omitted; it is filled in) or a raw
            string sent back verbatim (for malformed-output tests).

    Attributes:
        requests: Every request seen, in call order (thread-safe append).
    """

    def __init__(self, responder: Responder) -> None:
        super().__init__(answers=[])
        self.responder = responder
        self.requests: list[ScriptedRequest] = []
        self._lock = threading.Lock()
        self._install_engine()

    def _install_engine(self) -> None:
        from dspy.clients.engines.dummy_engine import AsyncDummyEngine, DummyEngine

        owner = self

        class _Engine(DummyEngine):
            def _complete_messages(self, messages):  # type: ignore[override]
                from dspy.lm15 import Message, Response, TextPart, Usage

                text = owner.reply(messages)
                return Response(
                    id=None,
                    model="scripted",
                    message=Message.assistant([TextPart(text)]),
                    finish_reason="stop",
                    usage=Usage(input_tokens=0, output_tokens=0, total_tokens=0),
                )

        self._engine_spec = _Engine(self)
        self._async_engine_spec = AsyncDummyEngine(self._engine_spec)

    def reply(self, messages: list[dict[str, Any]]) -> str:
        """The reply text for ``messages`` (also used by the local OpenAI-compatible test server)."""
        request = parse_chat_messages(messages)
        with self._lock:
            self.requests.append(request)
        return render_reply(request, self.responder(request))

    def copy(self, **kwargs: Any) -> ScriptedLM:
        copied = super().copy(**kwargs)
        copied._install_engine()
        return copied
