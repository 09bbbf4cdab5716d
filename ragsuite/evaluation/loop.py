"""Evaluate a program on a dataset: examples run concurrently, each record is persisted the moment it is
finished, and a run directory can be resumed after a crash or a kill.

The run loop keeps up to ``2 * threads`` examples submitted to an engine (:mod:`ragsuite.evaluation.engines`)
and handles each finished one in the caller's thread: append it to the run directory (fsynced), update the
progress bar, count failures, call ``on_record``. A stop (``max_errors``, ``on_record`` raising, a fatal LM
error) starts no further example and persists the ones in flight; Ctrl-C or SIGTERM drops the ones in flight
(they run again on resume) and still writes the summary of the finished ones.

:mod:`ragsuite.evaluation` shows :func:`evaluate` at work.
"""

from __future__ import annotations

import contextvars
import logging
import os
import queue
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ragsuite.aio import DEFAULT_ENGINE, ENGINES, Engine
from ragsuite.data.datasets import get_dataset_info
from ragsuite.errors import ConfigError, DataError, Terminated
from ragsuite.evaluation.engines import ExampleRunner, Halt, start_engine
from ragsuite.evaluation.example import FatalLMError, example_id
from ragsuite.evaluation.manifest import default_manifest
from ragsuite.evaluation.progress import ProgressBar
from ragsuite.evaluation.store import RunStore, read_records
from ragsuite.evaluation.summary import failure_message, format_table, summarize
from ragsuite.files import lock_directory
from ragsuite.lm import LMEndpointError

log = logging.getLogger("ragsuite.evaluation")


@dataclass
class EvalResult:
    """What :func:`evaluate` returns.

    Attributes:
        metrics: Mean of each dataset metric over the scored examples, in [0, 1]; None when none was scored.
        cost: Per-question means of lm_calls (stage calls), lm_requests (calls that reached the provider),
            cache_hits, input_tokens, output_tokens, retrievals, steps, fallbacks (stage calls whose reply
            could not be parsed) and latency_s; None when no example was scored.
        n: Examples scored (finished without error).
        errors: Examples that failed (recorded with their error, not counted as wrong).
        records: One record per finished example, in dataset order.
        total: Examples asked for.
        stopped: Why the run stopped early (``max_errors``, ``on_record``, a fatal LM error), or None.
        summary: The summary dict also written to ``summary.json``.
    """

    metrics: dict[str, float | None]
    cost: dict[str, float | None]
    n: int
    errors: int
    records: list[dict[str, Any]]
    total: int = 0
    stopped: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)


def evaluate(
    program: Callable[..., Any],
    examples: Sequence[Any],
    *,
    dataset: str,
    threads: int = 8,
    engine: Engine = DEFAULT_ENGINE,
    out_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
    on_record: Callable[[dict[str, Any]], None] | None = None,
    max_errors: int | None = None,
    manifest: Mapping[str, Any] | None = None,
) -> EvalResult:
    """Run ``program(question=...)`` on every example, concurrently, scoring each with the dataset's metrics.

    Args:
        program: A ragsuite program (or any module returning ``dspy.Prediction(answer=..., ...)``).
        examples: ``dspy.Example`` objects with ``question``, labels and ``id``.
        dataset: Dataset name (chooses the metrics).
        threads: Examples run at once (each in a copy of the caller's DSPy context).
        engine: ``"threads"``: one worker thread per concurrent example, running ``program(...)``.
            ``"async"``: one event loop (in one thread) awaiting ``program.acall(...)`` for up to
            ``threads`` examples at once; programs without ``aforward`` run in worker threads. Records,
            resuming and interrupts are the same for both.
        out_dir: Run directory to persist to and resume from (see :mod:`ragsuite.evaluation`); None keeps
            everything in memory. The directory is locked for the run: a second run on it is refused.
        progress: Show a progress bar with the running score, LM calls and tokens.
        on_record: Called in the caller's thread with each new record (``record["metrics"]`` holds the
            scores). An exception it raises (e.g. ``optuna.TrialPruned``) stops the run, after the examples
            in flight are persisted, and propagates.
        max_errors: Stop cleanly once this many examples have failed (the summary is still written).
        manifest: The run's description, saved as ``manifest.json``; resuming with a different
            configuration is refused. Defaults to program name, knobs, dataset and example ids.

    Returns:
        :class:`EvalResult`.

    A KeyboardInterrupt (Ctrl-C, or SIGTERM turned into :class:`~ragsuite.errors.Terminated`) stops the run:
    the examples in flight are dropped, the summary of the finished ones is written, and it propagates.

    Raises:
        ConfigError: bad arguments, ``out_dir`` holding a run with another configuration or records without
            a manifest, or another process running in ``out_dir``.
        LMEndpointError: an LM error that no retry can fix (bad key, unknown model, unreachable server).
    """
    if threads < 1:
        raise ConfigError(f"threads must be >= 1, not {threads}")
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if max_errors is not None and max_errors < 1:
        raise ConfigError(f"max_errors must be >= 1, not {max_errors}")
    get_dataset_info(dataset)
    ids = [example_id(ex, i) for i, ex in enumerate(examples)]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise DataError(f"example id {dup!r} appears more than once")
    options: dict[str, Any] = {
        "dataset": dataset,
        "threads": threads,
        "engine": engine,
        "progress": progress,
        "on_record": on_record,
        "max_errors": max_errors,
        "manifest": manifest,
    }
    if out_dir is None:
        return _execute(program, examples, ids, store=None, **options)
    with lock_directory(out_dir):
        store = RunStore(out_dir)
        try:
            store.check_manifest(
                manifest if manifest is not None else default_manifest(program, dataset, ids)
            )
            return _execute(program, examples, ids, store=store, **options)
        finally:
            store.close()


def _execute(
    program: Callable[..., Any],
    examples: Sequence[Any],
    ids: Sequence[str],
    *,
    store: RunStore | None,
    dataset: str,
    threads: int,
    engine: Engine,
    progress: bool,
    on_record: Callable[[dict[str, Any]], None] | None,
    max_errors: int | None,
    manifest: Mapping[str, Any] | None,
) -> EvalResult:
    """The run loop of :func:`evaluate`, once the arguments are checked and the run directory is held."""
    done = _resume(store, ids)
    todo: Iterator[tuple[Any, str]] = ((ex, i) for ex, i in zip(examples, ids, strict=True) if i not in done)
    halt = Halt(max_errors=max_errors)
    collector = _Collector(
        dataset=dataset, ids=ids, done=done, store=store, halt=halt, on_record=on_record,
        max_errors=max_errors, progress=progress,
    )  # fmt: skip
    runner = ExampleRunner(program, dataset=dataset, halt=halt)
    pool = start_engine(engine, runner, threads=threads, context=contextvars.copy_context())
    # Each future lands here when done (concurrent.futures.wait would lock every future in flight per call).
    finished: queue.SimpleQueue[Future[dict[str, Any] | None]] = queue.SimpleQueue()
    in_flight = 0
    try:
        while True:
            # At most 2 * threads examples ahead of the records handled here: a worker that finishes one
            # starts the next at once, and a stop asked by on_record takes effect quickly.
            while not halt.is_set() and in_flight < 2 * threads and (item := next(todo, None)):
                pool.submit(*item).add_done_callback(finished.put)
                in_flight += 1
            if not in_flight:
                break
            try:
                future = finished.get(timeout=0.5)  # a timeout keeps Ctrl-C responsive
            except queue.Empty:
                continue
            in_flight -= 1
            collector.take(future)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: drop the examples in flight, keep the finished
        halt.set()
        pool.close(wait=False)
        collector.interrupted(exc)
    except BaseException:
        halt.set()
        pool.close(wait=False)
        collector.bar.close()
        raise
    else:
        pool.close(wait=True)
    return collector.finish(program, manifest)


def _resume(store: RunStore | None, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The finished records of ``ids`` already in the run directory."""
    if store is None:
        return {}
    wanted = set(ids)
    done = {i: r for i, r in store.load_records().items() if i in wanted}
    if done:
        log.info("resuming %s: %d of %d examples already done", store.dir, len(done), len(ids))
    return done


class _Collector:
    """The caller's side of a run: persists, shows and hands on each record, then sums the run up."""

    def __init__(
        self,
        *,
        dataset: str,
        ids: Sequence[str],
        done: dict[str, dict[str, Any]],
        store: RunStore | None,
        halt: Halt,
        on_record: Callable[[dict[str, Any]], None] | None,
        max_errors: int | None,
        progress: bool,
    ) -> None:
        self.dataset, self.ids, self.done, self.store, self.halt = dataset, ids, done, store, halt
        self.on_record, self.max_errors = on_record, max_errors
        self.new: dict[str, dict[str, Any]] = {}
        self.errors = 0
        self.stopped: str | None = None
        self.deferred: BaseException | None = None  # raised once the summary is written
        self.bar = ProgressBar(len(ids), initial=len(done), dataset=dataset, enabled=progress)
        for record in done.values():
            self.bar.add(record, count=False)

    def take(self, future: Future[dict[str, Any] | None]) -> None:
        """Handle one finished example: a record, an exception raised in its worker, or nothing (not run)."""
        if future.cancelled():
            return
        raised = future.exception()
        if raised is not None:
            if self.deferred is None:
                if isinstance(raised, FatalLMError):
                    self.stopped, self.deferred = str(raised), LMEndpointError(str(raised))
                else:
                    self.stopped, self.deferred = f"{type(raised).__name__}: {raised}", raised
            return
        record = future.result()
        if record is None:  # the run was halted before it started
            return
        if self.store is not None:
            self.store.append(record)
        self.new[record["id"]] = record
        self.bar.add(record)
        if record["error"]:
            self.errors += 1
            log.warning("%s", failure_message(record))
            if self.max_errors is not None and self.errors >= self.max_errors and self.stopped is None:
                self.stopped = f"max_errors={self.max_errors} reached"
        if self.on_record is not None and self.deferred is None:
            try:
                self.on_record(record)
            except BaseException as exc:  # e.g. optuna.TrialPruned: stop, persist, then re-raise
                self.stopped, self.deferred = f"on_record raised {type(exc).__name__}", exc
                self.halt.set()

    def interrupted(self, exc: KeyboardInterrupt) -> None:
        self.stopped = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        self.deferred = exc

    def finish(self, program: Any, manifest: Mapping[str, Any] | None) -> EvalResult:
        """Write the summary of the finished records, and return them or raise what stopped the run."""
        self.bar.close()
        by_id = {**self.done, **self.new}
        if (
            self.store is not None
            and isinstance(self.deferred, KeyboardInterrupt)
            and self.store.records_path.exists()  # none when interrupted before the first record
        ):
            # The interrupt can land between writing a record and noting it: what is on disk is the truth.
            self.store.close()
            by_id = {**by_id, **read_records(self.store.records_path).records}
        records = [by_id[i] for i in self.ids if i in by_id]
        summary = summarize(records, dataset=self.dataset, total=len(self.ids))
        summary["stopped"] = self.stopped
        if manifest is not None:
            summary["program"] = manifest.get("program")
            summary["lm"] = (manifest.get("lm") or {}).get("spec")
        else:
            summary["program"] = getattr(program, "name", type(program).__name__)
        if self.store is not None:
            self.store.close()
            self.store.write_summary(summary, format_table([summary]))
        for warning in summary["warnings"]:
            log.warning("%s", warning)
        if self.stopped:
            log.warning("run stopped early: %s", self.stopped)
        result = EvalResult(
            metrics=summary["metrics"],
            cost=summary["cost"],
            n=summary["n"],
            errors=summary["errors"],
            records=records,
            total=len(self.ids),
            stopped=self.stopped,
            summary=summary,
        )
        if self.deferred is not None:
            raise self.deferred
        return result
