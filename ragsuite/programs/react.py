"""ReAct (Yao et al., 2023; the authors' code, github.com/ysymyth/ReAct, ``hotpotqa.ipynb``) with a retrieval
tool, a baseline of DeepNote's Table 1, built on ``dspy.ReAct``.

Each turn the LM writes a thought and picks an action: ``search(query)`` retrieves ``top_k`` passages and
returns them as the observation; ``finish`` ends the episode. After at most ``max_iters`` turns (the authors'
7 for HotpotQA), DSPy's extraction step answers from the question and the whole trajectory, in the task's
answer style.

A turn whose reply cannot be split into a thought and an action gets the authors' fallback: the first line
of the reply is kept as the thought and the LM is asked, in one more call, for the action alone (``act``);
the episode goes on. An action that still cannot be read is an invalid action: its observation says so and
the episode goes on, as the authors' environment answers "Invalid action".

Accounting: one LM call per turn, one more per fallback action call, plus the extraction; each fallback is
recorded in the trace and ``stats["fallbacks"]``. ReAct feeds tool exceptions back to the LM as observations:
a retrieval failure is re-raised after the episode instead, so it is never mistaken for an empty result.

Differences from the original:

* Tools. The authors' environment searches Wikipedia for an entity's first paragraph and offers
  ``lookup[keyword]``; here ``search`` returns ``top_k`` passages from the configured retriever and there
  is no lookup. Why: ragsuite's corpora are passage collections.
* The answer. The authors' answer is the argument of ``finish[answer]`` (empty when 7 turns pass without
  one); here DSPy's extraction call answers from the trajectory, one more LM call. Why: ``dspy.ReAct``'s
  structure, and the answer takes the task's answer style.
* Prompting. DSPy's ReAct instructions and output fields replace the authors' six few-shot trajectories.
  Why: every program here runs on any DSPy LM and can be optimised.
"""

from __future__ import annotations

import contextvars
from typing import Any, ClassVar

import dspy
from dspy.utils.exceptions import AdapterParseError

from ragsuite.aio import run_sync, synchronous
from ragsuite.data.datasets import Task
from ragsuite.errors import RetrievalError
from ragsuite.programs.base import RAGProgram, RunLedger, register
from ragsuite.programs.knobs import Ints, Knobs, integer
from ragsuite.retrieval.base import Passage, Retriever
from ragsuite.signatures.answer import answer_signature, format_passages

# The episode being run in this context: (program, ledger, passages seen, retrieval errors).
_EPISODE: contextvars.ContextVar[tuple[RAGProgram, RunLedger, dict[str, Passage], list[RetrievalError]]] = (
    contextvars.ContextVar("ragsuite_react_episode")
)


def search(query: str) -> Any:
    """Search the knowledge source: returns the passages most relevant to the query, '[i] title | text'."""
    # dspy.ReAct calls a tool synchronously in a synchronous run, and awaits what it returns in an
    # asynchronous one: the search is one coroutine, run to its end here or handed back to be awaited.
    found = _search(query)
    return run_sync(found) if synchronous() else found


async def _search(query: str) -> list[str]:
    program, ledger, seen, errors = _EPISODE.get()
    try:
        passages = await program.aretrieve(ledger, query, program.top_k)  # type: ignore[attr-defined]
    except RetrievalError as exc:
        errors.append(exc)
        raise
    ledger.count_step()
    ledger.record("search", query=query, passage_ids=[p.id for p in passages])
    for passage in passages:
        seen.setdefault(passage.id, passage)
    return format_passages(passages)


def _first_thought(reply: str) -> str:
    """The thought the authors keep from a reply they cannot split: its first line (here, of the thought
    field when the reply has one)."""
    text = str(reply or "")
    header = "[[ ## next_thought ## ]]"
    if header in text:
        text = text.split(header, 1)[1]
    lines = text.strip().splitlines()
    return lines[0].strip() if lines else ""


class _Agent(dspy.ReAct):
    """``dspy.ReAct`` with the authors' fallback for an unparsable turn: keep the reply's first line as the
    thought and ask for the action alone (``act``); an action that still cannot be read is an invalid action,
    observed as such, and the episode goes on."""

    def __init__(self, signature: Any, *, tools: list[Any], max_iters: int) -> None:
        super().__init__(signature, tools=tools, max_iters=max_iters)
        act = self.react.signature.delete("next_thought").append("next_thought", dspy.InputField(), type_=str)
        self.act = dspy.Predict(act)

    def _noted(self, exc: AdapterParseError) -> str:
        thought = _first_thought(exc.lm_response)
        _program, ledger, _seen, _errors = _EPISODE.get()
        ledger.count_lm_call()  # the action call
        with ledger._lock:
            ledger.fallbacks.append({"stage": "react", "used": "action call", "reason": "unparsable turn"})
        ledger.record("react", fallback="action call", thought=thought, reason=str(exc).splitlines()[0][:300])
        return thought

    @staticmethod
    def _turn(thought: str, action: Any) -> dspy.Prediction:
        if action is None:  # the authors' environment answers an unreadable action with "Invalid action"
            return dspy.Prediction(next_thought=thought, next_tool_name="invalid action", next_tool_args={})
        return dspy.Prediction(
            next_thought=thought, next_tool_name=action.next_tool_name, next_tool_args=action.next_tool_args
        )

    def _call_with_potential_trajectory_truncation(
        self, module: Any, trajectory: Any, **input_args: Any
    ) -> Any:
        try:
            return super()._call_with_potential_trajectory_truncation(module, trajectory, **input_args)
        except AdapterParseError as exc:
            if module is not self.react:
                raise
            thought = self._noted(exc)
        try:
            action = super()._call_with_potential_trajectory_truncation(
                self.act, trajectory, next_thought=thought, **input_args
            )
        except AdapterParseError:
            action = None
        return self._turn(thought, action)

    async def _async_call_with_potential_trajectory_truncation(
        self, module: Any, trajectory: Any, **input_args: Any
    ) -> Any:
        try:
            return await super()._async_call_with_potential_trajectory_truncation(
                module, trajectory, **input_args
            )
        except AdapterParseError as exc:
            if module is not self.react:
                raise
            thought = self._noted(exc)
        try:
            action = await super()._async_call_with_potential_trajectory_truncation(
                self.act, trajectory, next_thought=thought, **input_args
            )
        except AdapterParseError:
            action = None
        return self._turn(thought, action)


@register
class ReActRAG(RAGProgram):
    """ReAct over a retriever: thought, search, observation, until ``finish`` (see the module docstring).

    Stage predictors: ``agent.react`` (each turn), ``agent.act`` (the fallback action call),
    ``agent.extract`` (the answer).

    Args:
        retriever: Any :class:`~ragsuite.retrieval.base.Retriever`.
        task: Answer style: ``short``, ``long`` or ``yesno``.
        **knobs: Any of :attr:`KNOBS` by name (``max_iters=7``).

    Example:
        >>> from ragsuite import programs
        >>> programs.get("react").default_knobs()
        {'top_k': 3, 'max_iters': 7}
    """

    name: ClassVar[str] = "react"
    KNOBS: ClassVar[Knobs] = Knobs(
        integer("top_k", 3, minimum=1, search=Ints(1, 7), help="passages per search (ours: 3)"),
        integer(
            "max_iters", 7, minimum=1, search=Ints(2, 8), help="most turns (the authors' 7 for HotpotQA)"
        ),
    )

    def __init__(self, *, retriever: Retriever | None = None, task: Task = "short", **knobs: Any) -> None:
        super().__init__(retriever=retriever, task=task, **knobs)
        self.agent = _Agent(answer_signature(task, "none"), tools=[search], max_iters=self.max_iters)

    async def aforward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        seen: dict[str, Passage] = {}
        errors: list[RetrievalError] = []
        token = _EPISODE.set((self, ledger, seen, errors))
        try:
            result = await self.acall_stage(
                ledger, "answer", self.agent, fallback={"answer": "", "trajectory": {}}, question=question
            )
        finally:
            _EPISODE.reset(token)
        if errors:
            raise errors[0]
        trajectory = dict(result.get("trajectory") or {})
        turns = sum(key.startswith("thought_") for key in trajectory)
        finished = any(trajectory.get(f"tool_name_{i}") == "finish" for i in range(turns))
        # call_stage counted the extraction and the agent each fallback action call; add the turns.
        for _ in range(turns):
            ledger.count_lm_call()
        answer = " ".join(str(result.get("answer") or "").split())
        ledger.record("answer", source="trajectory", answer=answer, turns=turns, finished=finished)
        return self.finish(ledger, answer, list(seen.values()), trajectory=trajectory)


__all__ = ["ReActRAG", "search"]
