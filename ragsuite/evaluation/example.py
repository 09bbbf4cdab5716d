"""Run one example and score it: the program's answer, the dataset's metrics, retrieval recall, and the cost
ledger (LM calls, calls that reached the provider, cache hits, tokens) counted in the example's own context.

The same coroutine serves both engines: the thread engine drives it with :func:`ragsuite.aio.run_sync`
(``program(...)``), the async engine awaits it (``await program.acall(...)``).

Example:
    >>> import dspy
    >>> from ragsuite.aio import run_sync
    >>> from ragsuite.data.datasets import load_dataset
    >>> from ragsuite.evaluation.example import arun_example
    >>> from ragsuite.testing.scripted import ScriptedLM
    >>> example = load_dataset("hotpotqa")[0]
    >>> program = dspy.Predict("question -> answer")
    >>> with dspy.context(lm=ScriptedLM(lambda request: {"answer": "Rush"})):
    ...     record = run_sync(arun_example(program, example, "q1", dataset="hotpotqa"))
    >>> record["metrics"]["accuracy"], record["tokens"]["requests"]
    (1.0, 1)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import dspy
from dspy.utils.callback import BaseCallback
from dspy.utils.usage_tracker import UsageTracker

from ragsuite.aio import invoke
from ragsuite.errors import RagsuiteError
from ragsuite.lm import describe_lm_failure, explain_lm_error, redact


class CallCounter(BaseCallback):
    """Counts every LM call made in one example's context, cached or not."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def on_lm_end(self, call_id: str, outputs: Any, exception: Exception | None = None) -> None:
        with self._lock:
            self.calls += 1


class TokenUsage(UsageTracker):
    """DSPy's usage tracker, also counting the calls that reached the provider, and the tokens of cache hits
    apart (a cached answer costs what its call cost; see :mod:`ragsuite.lm_client`)."""

    def __init__(self) -> None:
        super().__init__()
        self.requests = 0
        self.cached_prompt = 0
        self.cached_completion = 0
        self._lock = threading.Lock()

    def add_usage(self, lm: str, usage_entry: dict[str, Any]) -> None:
        with self._lock:
            self.requests += 1
            super().add_usage(lm, usage_entry)

    def add_cached_usage(self, lm: str, usage: dict[str, int]) -> None:
        with self._lock:
            self.cached_prompt += int(usage.get("prompt_tokens") or 0)
            self.cached_completion += int(usage.get("completion_tokens") or 0)

    def tokens(self) -> tuple[int, int, dict[str, dict[str, Any]]]:
        """Prompt and completion tokens of every call, cache hits included, and the provider's usage by LM."""
        with self._lock:
            by_lm = self.get_total_tokens()
            cached = self.cached_prompt, self.cached_completion
        prompt = sum(int(u.get("prompt_tokens") or 0) for u in by_lm.values()) + cached[0]
        completion = sum(int(u.get("completion_tokens") or 0) for u in by_lm.values()) + cached[1]
        return prompt, completion, by_lm


class FatalLMError(Exception):
    """An LM error that makes every further call pointless (bad key, unknown model, server gone)."""


def example_id(example: Any, index: int) -> str:
    """The example's ``id``, or ``#<index>`` when it has none."""
    value = example.get("id") if hasattr(example, "get") else getattr(example, "id", None)
    return str(value) if value not in (None, "") else f"#{index}"


def may_hit_cache(program: Any) -> bool:
    """Whether any LM the program would call (the context's or a stage's) uses DSPy's response cache."""
    lms = [dspy.settings.get("lm")]
    named = getattr(program, "named_predictors", None)
    if callable(named):
        lms += [getattr(predictor, "lm", None) for _, predictor in named()]
    return any(bool(getattr(lm, "cache", False)) for lm in lms if lm is not None)


async def arun_example(
    program: Callable[..., Any],
    example: Any,
    ex_id: str,
    *,
    dataset: str,
    model_hint: str | None = None,
    count_cache_hits: bool = True,
) -> dict[str, Any]:
    """Run ``program`` on one example and return its record (see the module docstring).

    An LM or retriever failure that outlived the retries is recorded in ``record["error"]`` (the example is
    not scored); an LM error no retry can fix raises :class:`FatalLMError`.

    Args:
        program: The program (called as ``program(question=..., **EXAMPLE_INPUTS)``).
        example: A ``dspy.Example`` with ``question`` and labels.
        ex_id: The example's id in the run (see :func:`example_id`).
        dataset: Dataset name (chooses the metrics).
        model_hint: The context LM's model name, for the message of a fatal LM error.
        count_cache_hits: Count LM calls with a callback, so that cache hits are counted (costlier).
    """
    from ragsuite.data.metrics import retrieval_recall, score_example

    # Cache hits never reach the usage tracker, so they are counted with a callback; callbacks make every
    # module, adapter and LM call costlier, hence only when some LM can hit the cache.
    counter = CallCounter() if count_cache_hits else None
    usage = TokenUsage()
    overrides: dict[str, Any] = {"track_usage": True, "usage_tracker": usage}
    if counter is not None:
        overrides["callbacks"] = [*dspy.settings.get("callbacks", []), counter]
    started = time.perf_counter()
    prediction = None
    error = None
    with dspy.context(**overrides):
        try:
            extra = {arg: example.get(field) for arg, field in getattr(program, "EXAMPLE_INPUTS", {}).items()}
            # program(...) in a synchronous run (thread engine), await program.acall(...) in the async one.
            prediction = await invoke(program, question=example.question, **extra)
        except RagsuiteError as exc:  # retrieval failures, refused questions: this example only
            error = {"type": type(exc).__name__, "message": redact(str(exc))[:2000]}
        except Exception as exc:
            fatal = explain_lm_error(exc, model=model_hint)
            if fatal is not None:
                raise FatalLMError(fatal) from exc
            message = describe_lm_failure(exc, lm=dspy.settings.lm) or redact(str(exc))
            error = {"type": type(exc).__name__, "message": message[:2000]}
    latency = time.perf_counter() - started
    prompt_tokens, completion_tokens, by_lm = usage.tokens()
    record: dict[str, Any] = {
        "id": ex_id,
        "question": example.question,
        "type": example.get("type") or None,
        "answers": list(example.get("answers") or []),
        "error": error,
        "latency_s": round(latency, 4),
        "tokens": {
            "input": prompt_tokens,
            "output": completion_tokens,
            "lm_invocations": counter.calls if counter is not None else usage.requests,
            "requests": usage.requests,
            "cache_hits": max(counter.calls - usage.requests, 0) if counter is not None else 0,
            # Of input/output, the tokens of answers served from the cache (what they cost when first asked).
            "cached_input": usage.cached_prompt,
            "cached_output": usage.cached_completion,
            "by_lm": by_lm,
        },
    }
    if prediction is None:
        return record
    answer = str(prediction.get("answer") or "")
    passages = list(prediction.get("passages") or [])
    passage_ids = [str(getattr(p, "id", p)) for p in passages]
    gold = list(example.get("gold_passage_ids") or [])
    # A program without a retriever has no retrieval recall to report (not a recall of 0).
    retrieves = bool(passage_ids) or getattr(program, "retriever", None) is not None
    record.update(
        prediction=answer,
        metrics=score_example(dataset, example, answer),
        retrieval_recall=retrieval_recall(passage_ids, gold, len(passage_ids))
        if gold and retrieves
        else None,
        passage_ids=passage_ids,
        gold_passage_ids=gold,
        stats=dict(prediction.get("stats") or {}),
        stage_calls=dict(prediction.get("stage_calls") or {}),
        trace=list(prediction.get("trace") or []),
    )
    return record
