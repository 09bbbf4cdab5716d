"""Ready-made responders for :class:`~ragsuite.testing.scripted.ScriptedLM` and the local OpenAI-compatible
server: replies that parse for any stage of any registered program, without a model."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from ragsuite.testing.scripted import Reply, ScriptedRequest, TokenLogprob

_OUTPUT_FIELD = re.compile(r"^\d+\. `(\w+)` \((.*)\):", re.MULTILINE)
_PASSAGE_TITLE = re.compile(r"\[\d+\] ([^|]{3,60}) \|")


#: Self-RAG's reflection tokens by the question each answers (a checkpoint's vocabulary spells them so).
REFLECTION_GROUPS: tuple[tuple[str, ...], ...] = (
    ("[Retrieval]", "[No Retrieval]", "[Continue to Use Evidence]"),
    ("[Relevant]", "[Irrelevant]"),
    ("[Fully supported]", "[Partially supported]", "[No support / Contradictory]"),
    tuple(f"[Utility:{i}]" for i in range(1, 6)),
)
_REFLECTION = re.compile(
    "(" + "|".join(re.escape(t) for group in REFLECTION_GROUPS for t in group) + r"|</?paragraph>)"
)


def self_rag_reply(text: str, probs: Mapping[str, float] | None = None) -> Reply:
    """A Self-RAG checkpoint's completion with scripted reflection-token probabilities.

    Each reflection token of ``text`` is one token; the words between are whitespace-led tokens of
    probability 1. At a reflection token's position the alternatives are the tokens of its group that
    ``probs`` names (the written token gets ``probs.get(token, 1.0)``).

    Example:
        >>> reply = self_rag_reply("[Relevant]Paris[Utility:5]", {"[Relevant]": 0.7, "[Irrelevant]": 0.3})
        >>> [t.token for t in reply.tokens]
        ['[Relevant]', 'Paris', '[Utility:5]']
    """
    probs = dict(probs or {})
    tokens = []
    for piece in _REFLECTION.split(text):
        if not piece:
            continue
        group = next((g for g in REFLECTION_GROUPS if piece in g), None)
        if group is None:
            tokens.extend(TokenLogprob(word, 0.0) for word in re.findall(r"\s*\S+|\s+", piece))
            continue
        top = tuple((t, math.log(probs[t])) for t in group if t in probs)
        tokens.append(TokenLogprob(piece, math.log(probs.get(piece, 1.0)), top=top))
    return Reply(text, tokens=tokens)


def _self_rag_respond(gold: dict[str, str], request: ScriptedRequest) -> Reply:
    """A Self-RAG checkpoint that knows nothing: it asks for retrieval, and a passage is relevant, supports
    the answer and answers it exactly when it contains the gold answer."""
    prompt = request.prompt or ""
    instruction = prompt.split("### Instruction:\n", 1)[-1].split("\n\n### Response:", 1)[0]
    question = instruction.split("## Input:\n\n")[-1]
    answer = gold.get(question, "")
    yes_no = "yes or no" in instruction
    if "<paragraph>" not in prompt:
        if prompt.endswith("[No Retrieval]"):
            return self_rag_reply("no" if yes_no else "unknown")
        return self_rag_reply("[Retrieval]", {"[Retrieval]": 0.9, "[No Retrieval]": 0.1})
    evidence = prompt.rsplit("<paragraph>", 1)[-1].lower()
    if answer and answer.lower() in evidence:
        return self_rag_reply(f"[Relevant]{answer}[Fully supported][Utility:5]")
    return self_rag_reply(
        f"[Irrelevant]{'no' if yes_no else 'unknown'}[No support / Contradictory][Utility:1]"
    )


def grounded_responder(gold: dict[str, str]) -> Callable[[ScriptedRequest], dict[str, Any]]:
    """A responder that answers every stage with a well-typed value and is right only when it could be.

    It answers a question with its gold answer only when that answer appears in the evidence the prompt
    shows (passages, notes, sub-answers), judges a passage or an update relevant/better only when it contains
    the gold answer, and writes notes that copy the evidence. Retrieval knobs therefore move both quality and
    cost, which makes it useful for tuning demos and end-to-end tests; its scores say nothing about a real LM.
    Raw completion prompts (``/v1/completions`` of the local server) are answered as a Self-RAG checkpoint
    would, with reflection tokens (see :func:`self_rag_reply`).

    Args:
        gold: Question text -> gold answer.

    Example:
        >>> lm = ScriptedLM(grounded_responder({"Who wrote Hamlet?": "Shakespeare"}))  # doctest: +SKIP
    """

    def respond(request: ScriptedRequest) -> dict[str, Any] | Reply:
        if request.prompt is not None:  # a raw completion: a Self-RAG checkpoint's prompt
            return _self_rag_respond(gold, request)
        kinds = dict(_OUTPUT_FIELD.findall(request.system.split("Your output fields are:", 1)[-1]))
        question = request.inputs.get("question", "")
        answer = gold.get(question, "")
        evidence = " ".join(v for k, v in request.inputs.items() if k != "question").lower()
        values: dict[str, Any] = {}
        # An agent turn (ReAct): search once with the question, then finish.
        searched = "observation_0" in request.inputs.get("trajectory", "")
        for name in request.output_fields:
            kind = kinds.get(name, "str")
            if name == "next_tool_name":
                values[name] = "finish" if searched else re.findall(r"'([^']*)'", kind)[0]
            elif name == "next_tool_args":
                values[name] = {} if searched else {"query": question}
            elif kind.startswith("Literal["):
                values[name] = re.findall(r"'([^']*)'", kind)[-1]
            elif name == "search_query":  # a look-ahead that is never sure: search for the question
                values[name] = question
            elif name == "needs_retrieval":  # it knows nothing beyond the evidence it is shown
                values[name] = str(not (answer and answer.lower() in evidence))
            elif kind == "bool":
                values[name] = str(bool(answer) and answer.lower() in evidence)
            elif kind == "NoulEvidence":  # a probability-backed yes/no decision
                values[name] = {"noul": 0.9 if answer and answer.lower() in evidence else 0.1}
            elif kind == "list[int]":
                values[name] = [1, 2]
            elif kind.startswith("list"):
                # New queries: the titles seen so far (a crude bridge-entity guess), else the question.
                titles = ", ".join(dict.fromkeys(_PASSAGE_TITLE.findall(evidence)))[:200]
                values[name] = [titles or f"{question} background"]
            elif kind in ("int", "float"):
                values[name] = "1"
            elif name == "answer":
                values[name] = answer if answer and answer.lower() in evidence else "unknown"
            else:
                values[name] = evidence[:3000] or "nothing yet"
        return values

    return respond


def sampling_tag(request: ScriptedRequest) -> str:
    """``t<temperature>p<top_p>``: the sampling settings a request asked for, to tag a reply with (a reply
    sampled at temperature 0.5, top_p 0.9 reads ``note t0.5p0.9``); ``None`` stands for a setting not sent.

    Example:
        >>> request = ScriptedRequest("", {}, ["note"], "", "", sampling={"temperature": 0.5, "top_p": 0.9})
        >>> sampling_tag(request)
        't0.5p0.9'
    """
    return f"t{request.sampling.get('temperature')}p{request.sampling.get('top_p')}"


def candidate_number(candidates: str, marker: str) -> int:
    """The 1-based number of the first candidate containing ``marker`` in a judge's input, a JSON list of
    candidates: how a scripted judge names the candidate it picks.

    Example:
        >>> candidate_number('["note t0.1p0.5", "note t0.9p0.1"]', "t0.9p0.1")
        2
    """
    items = json.loads(candidates)
    return next(i for i, item in enumerate(items, start=1) if marker in item)
