"""Where the examples of an evaluation run at once. Both engines take ``submit(example, ex_id)`` and return a
:class:`concurrent.futures.Future` of the example's record, so the run loop (:mod:`ragsuite.evaluation.loop`)
is the same for both:

* ``threads``: a pool of ``threads`` worker threads, each example in a copy of the caller's context, the
  program driven synchronously (``program(...)``, through :func:`ragsuite.aio.run_sync`).
* ``async``: one event loop in its own thread, each example a task awaiting ``program.acall(...)``, at most
  ``threads`` at once (an :class:`asyncio.Semaphore`), handed over with
  :func:`asyncio.run_coroutine_threadsafe`.

Before an example starts, its worker checks the run's :class:`Halt`; a failure that reaches ``max_errors`` or
a fatal LM error sets it from the worker itself, so no further example starts while the caller's thread is
still persisting records. An example that did not start because of it has a future holding None.

Worker threads are daemons: an interrupted run drops the examples in flight (they run again on resume)
instead of keeping the process alive until they finish.

Example:
    >>> import dspy
    >>> from ragsuite.data.datasets import load_dataset
    >>> from ragsuite.testing.scripted import ScriptedLM
    >>> example = load_dataset("hotpotqa")[0]
    >>> program = dspy.Predict("question -> answer")
    >>> runner = ExampleRunner(program, dataset="hotpotqa", halt=Halt(max_errors=None))
    >>> with dspy.context(lm=ScriptedLM(lambda request: {"answer": "Rush"})):
    ...     engine = start_engine("threads", runner, threads=4, context=contextvars.copy_context())
    >>> engine.submit(example, "q1").result()["metrics"]
    {'accuracy': 1.0, 'f1': 1.0, 'exact_match': 1.0}
    >>> engine.close(wait=True)
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import dspy

from ragsuite.aio import DaemonThreadPool, Engine, run_sync
from ragsuite.evaluation.example import arun_example, may_hit_cache

Record = dict[str, Any]


class Halt:
    """Set once no further example may start: ``max_errors`` failures, a fatal LM error, or the caller's stop.

    Args:
        max_errors: Failures that set it (None: failures never do).
    """

    def __init__(self, *, max_errors: int | None) -> None:
        self.max_errors = max_errors
        self._event = threading.Event()
        self._failures = 0
        self._lock = threading.Lock()

    def is_set(self) -> bool:
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()

    def count(self, record: Record) -> None:
        """Count ``record`` if it failed, and set the halt at the ``max_errors``-th failure."""
        if record["error"] and self.max_errors is not None:
            with self._lock:
                self._failures += 1
                if self._failures >= self.max_errors:
                    self._event.set()


class ExampleRunner:
    """Runs one example of a run unless it is halted (:func:`~ragsuite.evaluation.example.arun_example`).

    The context's LM and whether any LM can hit the cache are read once, in the caller's thread.
    """

    def __init__(self, program: Callable[..., Any], *, dataset: str, halt: Halt) -> None:
        self.program = program
        self.dataset = dataset
        self.halt = halt
        self.model_hint = getattr(dspy.settings.get("lm"), "model", None)
        self.count_cache_hits = may_hit_cache(program)

    async def __call__(self, example: Any, ex_id: str) -> Record | None:
        if self.halt.is_set():
            return None
        try:
            record = await arun_example(
                self.program,
                example,
                ex_id,
                dataset=self.dataset,
                model_hint=self.model_hint,
                count_cache_hits=self.count_cache_hits,
            )
        except BaseException:  # FatalLMError, or a bug in the harness: stop everyone
            self.halt.set()
            raise
        self.halt.count(record)
        return record


class ThreadEngine:
    """``threads`` worker threads, each example driven synchronously in a copy of ``context``."""

    def __init__(self, runner: ExampleRunner, *, threads: int, context: contextvars.Context) -> None:
        self._runner = runner
        self._context = context
        self._pool = DaemonThreadPool(threads, name="ragsuite-eval")

    def submit(self, example: Any, ex_id: str) -> Future[Record | None]:
        return self._pool.submit(self._context.copy().run, self._drive, example, ex_id)

    def _drive(self, example: Any, ex_id: str) -> Record | None:
        return run_sync(self._runner(example, ex_id))

    def close(self, *, wait: bool) -> None:
        """Stop the workers; ``wait=False`` cancels the examples not started and leaves the running ones."""
        self._pool.shutdown(wait=wait, cancel_futures=not wait)


class AsyncEngine:
    """One event loop in a daemon thread (run in a copy of ``context``), at most ``threads`` examples at once.

    Retrievers and DSPy's own LM-call bookkeeping run in ``asyncio.to_thread``: the loop gets
    ``min(threads, 64)`` threads for them.
    """

    def __init__(self, runner: ExampleRunner, *, threads: int, context: contextvars.Context) -> None:
        self._runner = runner
        self._context = context
        self._threads = threads
        self._ready = threading.Event()
        self._thread = threading.Thread(
            target=context.copy().run,
            args=(asyncio.run, self._serve()),
            name="ragsuite-eval-loop",
            daemon=True,
        )
        self._thread.start()
        self._ready.wait()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.set_default_executor(
            ThreadPoolExecutor(max_workers=min(self._threads, 64), thread_name_prefix="ragsuite-eval-io")
        )
        self._slots = asyncio.Semaphore(self._threads)
        self._closing = asyncio.Event()
        self._ready.set()
        await self._closing.wait()  # asyncio.run then cancels what is left and shuts the loop's threads down

    async def _one(self, example: Any, ex_id: str) -> Record | None:
        async with self._slots:
            return await self._runner(example, ex_id)

    def submit(self, example: Any, ex_id: str) -> Future[Record | None]:
        # The task copies the context current at submission: the caller's, as for the thread engine.
        return self._context.run(asyncio.run_coroutine_threadsafe, self._one(example, ex_id), self._loop)

    def close(self, *, wait: bool) -> None:
        """Stop the loop; ``wait=False`` cancels the examples in flight without waiting for them."""
        self._loop.call_soon_threadsafe(self._closing.set)
        if wait:
            self._thread.join()


def start_engine(
    engine: Engine, runner: ExampleRunner, *, threads: int, context: contextvars.Context
) -> ThreadEngine | AsyncEngine:
    """The engine named ``engine`` (``"threads"`` or ``"async"``), started."""
    if engine == "async":
        return AsyncEngine(runner, threads=threads, context=context)
    return ThreadEngine(runner, threads=threads, context=context)


__all__ = ["AsyncEngine", "ExampleRunner", "Halt", "ThreadEngine", "start_engine"]
