"""One definition of each algorithm, run two ways: programs are written once as coroutines (``aforward``),
and ``forward`` drives the same coroutine synchronously.

A step of a program (an LM call, a retrieval, a group of concurrent sub-steps) is awaited through the helpers
here, which look at how the run was started:

* synchronous (``program(question=...)``, i.e. :func:`run_sync`): the predictor is called as
  ``predictor(...)``, the retriever in the calling thread, concurrent sub-steps on daemon threads
  (:class:`DaemonThreadPool`, each in a copy of the DSPy context). No step suspends the coroutine, so
  :func:`run_sync` finishes it in one ``send`` without an event loop: a synchronous call also works inside a
  running loop (a notebook, an async server).
* asynchronous (``await program.acall(question=...)``): the predictor is awaited with ``predictor.acall``,
  the (blocking) retriever runs in ``asyncio.to_thread``, concurrent sub-steps are ``asyncio.gather``-ed.

Example:
    >>> import asyncio
    >>> from ragsuite.aio import concurrently, in_thread, run_sync
    >>> async def double_all(items):
    ...     return await concurrently(lambda x: in_thread(lambda: 2 * x), items)
    >>> run_sync(double_all([1, 2, 3])), asyncio.run(double_all([1, 2, 3]))
    ([2, 4, 6], [2, 4, 6])
"""

from __future__ import annotations

import contextvars
import inspect
import queue
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from concurrent.futures import Executor, Future
from typing import Any, Literal, TypeVar

#: How an evaluation runs examples at once: worker threads calling ``program(...)``, or one event loop
#: awaiting ``program.acall(...)`` (``ragsuite.evaluation.evaluate``, ``ragsuite eval --engine``).
Engine = Literal["threads", "async"]
ENGINES: tuple[str, ...] = ("threads", "async")
#: The default engine (benchmarks/eval_engines.py compares the two).
DEFAULT_ENGINE: Engine = "threads"

T = TypeVar("T")
R = TypeVar("R")

# True while a coroutine is being driven by run_sync (inherited by the threads of its concurrent steps).
_SYNCHRONOUS: contextvars.ContextVar[bool] = contextvars.ContextVar("ragsuite_synchronous_run", default=False)


def synchronous() -> bool:
    """Whether the current step belongs to a synchronous run (:func:`run_sync`)."""
    return _SYNCHRONOUS.get()


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a program coroutine to its result in this thread, every step synchronously (no event loop).

    Raises:
        RuntimeError: when a step awaited something that really suspends (an ``asyncio`` future), which
            only the asynchronous run may do; the coroutine is closed.
    """
    token = _SYNCHRONOUS.set(True)
    try:
        try:
            coroutine.send(None)
        except StopIteration as done:
            return done.value
        raise RuntimeError(
            f"{getattr(coroutine, '__qualname__', coroutine)!s} suspended in a synchronous run: await steps "
            "through ragsuite.aio (invoke, in_thread, concurrently), not asyncio directly"
        )
    finally:
        coroutine.close()
        _SYNCHRONOUS.reset(token)


def _has_aforward(module: Any) -> bool:
    return callable(getattr(module, "acall", None)) and callable(getattr(module, "aforward", None))


async def invoke(module: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Call a DSPy module or predictor (or any callable) as the run goes.

    Synchronous run: ``module(...)``. Asynchronous run: ``await module.acall(...)`` for modules with an
    ``aforward``; a coroutine function is awaited; any other callable runs in ``asyncio.to_thread``. A
    returned awaitable is awaited in both.
    """
    if _SYNCHRONOUS.get():
        result = module(*args, **kwargs)
    elif _has_aforward(module):
        result = await module.acall(*args, **kwargs)  # type: ignore[attr-defined]
    elif inspect.iscoroutinefunction(module) or inspect.iscoroutinefunction(type(module).__call__):
        result = await module(*args, **kwargs)
    else:
        import asyncio  # here, not at the top: the CLI's --help reads ENGINES without paying for asyncio

        result = await asyncio.to_thread(module, *args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


async def in_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(...)``: in this thread for a synchronous run, in ``asyncio.to_thread`` (context copied) for an
    asynchronous one. For blocking work with no async interface: retrievers, index lookups, HTTP clients."""
    if _SYNCHRONOUS.get():
        return fn(*args, **kwargs)
    import asyncio

    return await asyncio.to_thread(fn, *args, **kwargs)


def _drive(fn: Callable[[T], Awaitable[R]], item: T) -> R:
    return run_sync(fn(item))  # type: ignore[arg-type]


class DaemonThreadPool(Executor):
    """A fixed pool of daemon worker threads.

    :class:`~concurrent.futures.ThreadPoolExecutor`'s workers are joined at interpreter exit, so a process
    interrupted while one of them waits on an LM or a server would stay alive until that request (and its
    retries) ended. Every pool that runs a program's steps or an evaluation's examples is this one instead.
    """

    def __init__(self, max_workers: int, *, name: str) -> None:
        self._max_workers = max_workers
        self._name = name
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None]
        self._work = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._work.put((future, fn, args) if not kwargs else (future, lambda: fn(*args, **kwargs), ()))
        with self._lock:  # one more worker per task until there are max_workers
            if len(self._workers) < self._max_workers:
                thread = threading.Thread(
                    target=self._serve, name=f"{self._name}-{len(self._workers)}", daemon=True
                )
                thread.start()
                self._workers.append(thread)
        return future

    def _serve(self) -> None:
        while (item := self._work.get()) is not None:
            future, fn, args = item
            if not future.set_running_or_notify_cancel():  # cancelled while queued
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if cancel_futures:
            while True:
                try:
                    item = self._work.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        with self._lock:
            workers, self._max_workers = list(self._workers), 0
        for _ in workers:
            self._work.put(None)
        if wait:
            for thread in workers:
                thread.join()


async def concurrently(
    fn: Callable[[T], Awaitable[R]], items: Iterable[T], *, max_workers: int | None = None
) -> list[R]:
    """``await fn(item)`` for every item at once; the results in input order.

    Synchronous run: one thread per item (at most ``max_workers``), each in a copy of the caller's context.
    Asynchronous run: ``asyncio.gather`` (at most ``max_workers`` at a time). Either way every item finishes
    before the first exception, in input order, is raised.
    """
    items = list(items)
    if max_workers is not None and max_workers < 1:
        raise ValueError(f"max_workers must be >= 1, not {max_workers}")
    if len(items) <= 1:
        return [await fn(item) for item in items]
    if _SYNCHRONOUS.get():
        with DaemonThreadPool(max_workers or len(items), name="ragsuite-step") as pool:
            futures = [pool.submit(contextvars.copy_context().run, _drive, fn, item) for item in items]
        outcomes: list[Any] = []
        for future in futures:
            error = future.exception()
            outcomes.append(error if error is not None else future.result())
    else:
        import asyncio

        limit = asyncio.Semaphore(max_workers) if max_workers else None

        async def one(item: T) -> R:
            if limit is None:
                return await fn(item)
            async with limit:
                return await fn(item)

        outcomes = await asyncio.gather(*(one(item) for item in items), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes


__all__ = [
    "DEFAULT_ENGINE",
    "ENGINES",
    "Engine",
    "concurrently",
    "in_thread",
    "invoke",
    "run_sync",
    "synchronous",
]
