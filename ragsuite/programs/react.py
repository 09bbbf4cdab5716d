"""ReAct (Yao et al., 2023) with a retrieval tool, a baseline of DeepNote's Table 1, built on ``dspy.ReAct``.

Each turn the LM writes a thought and picks a tool: ``search(query)`` retrieves ``top_k`` passages and
returns them as the observation; ``finish`` ends the episode. After at most ``max_iters`` turns, DSPy's
extraction step answers from the question and the whole trajectory, in the task's answer style.

Accounting follows ``dspy.ReAct``'s loop: one LM call per turn plus the extraction. ReAct ends the episode
quietly when a turn's reply cannot be parsed; that turn is counted and recorded as a fallback. ReAct also
feeds tool exceptions back to the LM as observations: a retrieval failure is re-raised after the episode
instead, so it is never mistaken for an empty result.
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
from ragsuite.programs.pipeline import check_int
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


class _Agent(dspy.ReAct):
    """``dspy.ReAct`` whose episode ends, rather than fails, at a turn whose reply cannot be parsed, as
    ReAct already does for an invalid tool choice (it ends the trajectory on a ``ValueError``)."""

    def _call_with_potential_trajectory_truncation(
        self, module: Any, trajectory: Any, **input_args: Any
    ) -> Any:
        try:
            return super()._call_with_potential_trajectory_truncation(module, trajectory, **input_args)
        except AdapterParseError as exc:
            if module is self.react:
                raise ValueError(f"unparsable turn: {exc}") from exc
            raise

    async def _async_call_with_potential_trajectory_truncation(
        self, module: Any, trajectory: Any, **input_args: Any
    ) -> Any:
        try:
            return await super()._async_call_with_potential_trajectory_truncation(
                module, trajectory, **input_args
            )
        except AdapterParseError as exc:
            if module is self.react:
                raise ValueError(f"unparsable turn: {exc}") from exc
            raise


@register
class ReActRAG(RAGProgram):
    """ReAct over a retriever: thought, search, observation, until ``finish`` (see the module docstring).

    Stage predictors: ``agent.react`` (each turn), ``agent.extract`` (the answer).

    Args:
        retriever: Any :class:`~ragsuite.retrieval.base.Retriever`.
        task: Answer style: ``short``, ``long`` or ``yesno``.
        top_k: Passages per search (ours: 3).
        max_iters: Most turns (ours: 5).

    Example:
        >>> from ragsuite import programs
        >>> programs.get("react").default_knobs()
        {'top_k': 3, 'max_iters': 5}
    """

    name: ClassVar[str] = "react"
    KNOBS: ClassVar[tuple[str, ...]] = ("top_k", "max_iters")

    def __init__(
        self, *, retriever: Retriever | None = None, task: Task = "short", top_k: int = 3, max_iters: int = 5
    ) -> None:
        super().__init__(retriever=retriever, task=task)
        self.top_k = check_int("top_k", top_k, minimum=1)
        self.max_iters = check_int("max_iters", max_iters, minimum=1)
        self.agent = _Agent(answer_signature(task, "none"), tools=[search], max_iters=self.max_iters)

    @classmethod
    def search_space(cls, trial: Any) -> dict[str, Any]:
        return {"top_k": trial.suggest_int("top_k", 1, 7), "max_iters": trial.suggest_int("max_iters", 2, 8)}

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
        # call_stage counted the extraction; add the turns, and the turn whose reply ended the episode.
        extra = turns + (0 if finished or turns == self.max_iters else 1)
        for _ in range(extra):
            ledger.count_lm_call()
        if not finished and turns < self.max_iters:
            with ledger._lock:
                ledger.fallbacks.append(
                    {"stage": "react", "used": "end of episode", "reason": "unparsable turn"}
                )
            ledger.record("react", fallback="end of episode", reason="a turn's reply could not be parsed")
        answer = " ".join(str(result.get("answer") or "").split())
        ledger.record("answer", source="trajectory", answer=answer, turns=turns)
        return self.finish(ledger, answer, list(seen.values()), trajectory=trajectory)


__all__ = ["ReActRAG", "search"]
