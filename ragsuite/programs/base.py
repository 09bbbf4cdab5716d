"""What every ragsuite program shares: the run ledger (trace + cost stats), stage calls that survive
malformed LM output, retrieval with bookkeeping, concurrency that keeps DSPy's context, and the registry.

Each program's algorithm is written once, as ``async def aforward``; ``forward`` runs that same coroutine
synchronously (see :mod:`ragsuite.aio`), so ``program(question=...)`` and
``await program.acall(question=...)`` take the same steps."""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import threading
import typing
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, NamedTuple, TypeVar

import dspy
from dspy.utils.exceptions import AdapterParseError

from ragsuite.aio import DaemonThreadPool, in_thread, invoke, run_sync, synchronous
from ragsuite.data.datasets import Task
from ragsuite.errors import ConfigError, RetrievalError
from ragsuite.programs.knobs import Knobs
from ragsuite.retrieval.adapt import as_retriever
from ragsuite.retrieval.base import Passage, Retriever
from ragsuite.signatures.compact import CompactJSONAdapter

T = TypeVar("T")
R = TypeVar("R")

#: Generation settings of programs whose paper states none (0.1: the papers' temperature).
DEFAULT_GENERATION: dict[str, float | int] = {"temperature": 0.1, "max_tokens": 1024}

#: Questions longer than this are refused: no retriever or prompt budget is meant for them.
MAX_QUESTION_CHARS = 8000

#: The kinds of stage a program can be composed with, by constructor argument, in ``--stage`` order (the
#: classes are :data:`ragsuite.programs.stages.STAGE_TYPES`, a module above this one).
STAGE_KINDS = ("filter", "blend")


_SCHEMA_ADAPTER = CompactJSONAdapter()
_CURRENT_STAGE: contextvars.ContextVar[str | None] = contextvars.ContextVar("ragsuite_stage", default=None)


def current_stage() -> str | None:
    """The stage whose predictor is running in this context (``"note_compare"``, ``"filter"``, ...), or None
    outside a stage call: for LM wrappers and logs that attribute requests to stages."""
    return _CURRENT_STAGE.get()


def stage_adapter(predictor: Any) -> contextlib.AbstractContextManager[Any]:
    """The compact JSON adapter (:class:`~ragsuite.signatures.compact.CompactJSONAdapter`) for a stage whose
    LM holds replies to a JSON schema (``structured_outputs``: the local LM on llama.cpp) and whose outputs
    are all plain values, unless an adapter is configured; else nothing (DSPy's default chat adapter).

    Why: a small model often breaks the chat adapter's ``[[ ## field ## ]]`` format (every true/false stage
    of DeepNote and HANRAG, with the local 0.5B model), and each break costs a second request in DSPy's JSON
    fallback. Held to the signature's schema, the reply parses the first time, so the prompt need not teach
    the format: the compact adapter's prompt is the instruction and the inputs.
    """
    if dspy.settings.adapter is not None:
        return contextlib.nullcontext()
    predictors = _predictors(predictor)
    lm = next((p.lm for p in predictors if getattr(p, "lm", None) is not None), dspy.settings.lm)
    if getattr(lm, "structured_outputs", False) and predictors and all(map(_plain_outputs, predictors)):
        return dspy.context(adapter=_SCHEMA_ADAPTER)
    return contextlib.nullcontext()


def _predictors(predictor: Any) -> list[Any]:
    """The DSPy predictors a stage runs: the module's, or those of the one a salvaging wrapper calls
    (``__wrapped__``); none for an opaque callable."""
    while not hasattr(predictor, "predictors") and hasattr(predictor, "__wrapped__"):
        predictor = predictor.__wrapped__
    predictors = getattr(predictor, "predictors", None)
    return list(predictors()) if callable(predictors) else []


def _plain_outputs(predictor: Any) -> bool:
    """Whether every output of the predictor is a plain value (text, number, true/false, list, option):
    DSPy's own types (probability-backed decisions, tool calls, media) keep the adapter they were made for."""
    from dspy.adapters.types.base_type import Type

    signature = getattr(predictor, "signature", None)
    if signature is None:
        return False
    for field in signature.output_fields.values():
        annotation = field.annotation
        for part in (annotation, *typing.get_args(annotation)):
            if isinstance(part, type) and issubclass(part, Type):
                return False
    return True


class RunLedger:
    """Bookkeeping for one ``forward`` call. Thread-safe, so concurrent sub-chains can share it.

    Attributes:
        question: The question being answered (used in error messages).
        lm_calls: Stage (predictor) invocations made.
        retrievals: Retriever calls made.
        steps: Retrieval-generation cycles, as the papers count them.
        trace: One dict per event, in order (``{"stage": ..., ...}``).
        fallbacks: Stages whose LM output could not be parsed, with the default that was used instead.
        stage_calls: Stage (predictor) invocations per stage, so that fallbacks can be read as a share.
    """

    def __init__(self, question: str) -> None:
        self.question = question
        self.lm_calls = 0
        self.retrievals = 0
        self.steps = 0
        self.trace: list[dict[str, Any]] = []
        self.fallbacks: list[dict[str, Any]] = []
        self.stage_calls: dict[str, int] = {}
        self.empty_retrievals = 0
        self._seen: dict[str, Passage] = {}
        self._lock = threading.Lock()

    def record(self, stage: str, **fields: Any) -> dict[str, Any]:
        event = {"stage": stage, **fields}
        with self._lock:
            self.trace.append(event)
        return event

    def count_lm_call(self) -> None:
        with self._lock:
            self.lm_calls += 1

    def count_step(self) -> None:
        with self._lock:
            self.steps += 1

    def add_passages(self, passages: Iterable[Passage]) -> None:
        with self._lock:
            for passage in passages:
                self._seen.setdefault(passage.id, passage)

    @property
    def unique_passages(self) -> int:
        return len(self._seen)

    @property
    def seen(self) -> list[Passage]:
        """Every distinct passage retrieved so far, in first-seen order."""
        with self._lock:
            return list(self._seen.values())

    def stats(self) -> dict[str, Any]:
        return {
            "lm_calls": self.lm_calls,
            "retrievals": self.retrievals,
            "steps": self.steps,
            "unique_passages": self.unique_passages,
            "empty_retrievals": self.empty_retrievals,
            "fallbacks": len(self.fallbacks),
        }


class DecisionKnob(NamedTuple):
    """Where a knob's decision setting lives: ``predictor.fields[field][parameter]`` (``[label]`` for one
    option's weight of a choice)."""

    predictor: dspy.Predict
    field: str
    parameter: str
    label: str | None = None

    def read(self) -> float | None:
        """The predictor's current setting, or None when it has none (its decisions are generated)."""
        config = self.predictor.fields.get(self.field)
        if not config or self.parameter not in config:
            return None
        value = config[self.parameter]
        return float(value.get(self.label, 1.0) if self.label is not None else value)


class RAGProgram(dspy.Module):
    """Base class of the registered programs.

    Subclasses declare ``name`` (registry key) and ``KNOBS`` (numeric or categorical settings that are saved
    with the program and tuned by Optuna: a :class:`~ragsuite.programs.knobs.Knobs` declaring each knob once,
    from which the constructor's checks and defaults, ``--set`` and the search space come; a variant program
    overrides defaults, ``KNOBS = Parent.KNOBS.override(...)``), create their stage predictors in
    ``__init__`` under the stage's snake_case name (``self.route``, ``self.filter``, ``self.answer``, ...) so
    per-stage LMs can find them, and implement ``async def aforward(question)`` returning :meth:`finish`,
    awaiting its steps with :meth:`acall_stage`, :meth:`aretrieve` and :mod:`ragsuite.aio`'s
    ``concurrently``. ``forward`` (what ``program(question=...)`` runs) drives the same coroutine
    synchronously; ``acall`` awaits it.

    A subclass may instead implement a synchronous ``forward`` with :meth:`call_stage` and :meth:`retrieve`;
    its ``acall`` then runs ``forward`` in a worker thread.
    """

    name: ClassVar[str] = ""
    #: The knobs, each declared once. (A plain tuple of names, with the defaults in the constructor's
    #: signature, still works for programs written before declarations.)
    KNOBS: ClassVar[Knobs | tuple[str, ...]] = Knobs()
    #: The paper's generation settings (temperature, max_tokens, top_p); the CLI flags override them.
    GENERATION: ClassVar[dict[str, float | int]] = {}
    #: Keyword arguments of ``forward`` beyond the question -> the example field that fills them (the
    #: evaluation harness passes them; e.g. an oracle router reads the question type).
    EXAMPLE_INPUTS: ClassVar[dict[str, str]] = {}
    #: Whether the program reads token log probabilities, so its LM must return them (OpenAI, vLLM).
    NEEDS_LOGPROBS: ClassVar[bool] = False

    def __init__(self, *, retriever: Retriever | None = None, task: Task = "short", **knobs: Any) -> None:
        """Set the retriever, the task and every declared knob (``knobs`` given by name, the others at their
        defaults), each checked against its declaration.

        Raises:
            ConfigError: for an unknown task, an unknown knob (naming the knobs) or a value a knob refuses.
        """
        super().__init__()
        if task not in ("short", "long", "yesno"):
            raise ConfigError(f"task must be 'short', 'long' or 'yesno', not {task!r}")
        # dspy.ColBERTv2, dspy.Retrieve and plain functions work too, adapted in one place.
        self.retriever = as_retriever(retriever)
        self.task = task
        declared = self.KNOBS if isinstance(self.KNOBS, Knobs) else Knobs()
        for knob, value in declared.check(knobs, program=self.name or type(self).__name__).items():
            setattr(self, knob, value)

    # ----------------------------------------------------------------- configuration
    @classmethod
    def stage_arguments(cls) -> tuple[str, ...]:
        """The optional stages this program's constructor takes (``filter``, ``blend``)."""
        import inspect

        params = inspect.signature(cls.__init__).parameters
        return tuple(kind for kind in STAGE_KINDS if kind in params)

    def stages(self) -> dict[str, dict[str, Any]]:
        """The stages this program was composed with, as settings that rebuild them."""
        found = {}
        for kind in self.stage_arguments():
            stage = getattr(self, kind, None)
            if stage is not None:
                found[kind] = stage.describe()
        return found

    def knobs(self) -> dict[str, Any]:
        """The current values of the program's declared knobs."""
        return {knob: getattr(self, knob) for knob in self.KNOBS}

    def artifacts(self) -> dict[str, str]:
        """Content hashes of the files a knob points to (a trained classifier), by knob: a knob holds a path,
        and what matters to a run is the content found there. Eval runs record them as configuration."""
        return {}

    def sound_demo_trace(self, trace: Sequence[tuple[Any, dict[str, Any], Any]]) -> bool:
        """Whether a trace that reached a right answer may become demos. ``trace`` is DSPy's list of
        ``(predictor, inputs, outputs)`` calls, as a bootstrapping optimizer hands it to its metric. A program
        whose intermediate outputs can be degenerate while its answer is right (a small model's looping note)
        says no to those, so that demos do not teach them. Every trace is sound here."""
        return True

    def decision_knobs(self) -> dict[str, DecisionKnob]:
        """The knobs that hold a decision setting of a predictor (a threshold, a choice weight), each with
        where that setting lives, so that an optimizer fitting the predictors' settings (``compile
        --optimizer reanchor``) can write them back as knobs. Empty unless decisions are probability-backed.
        """
        return {}

    @classmethod
    def search_space(cls, trial: Any) -> dict[str, Any]:
        """Sample knob values from an Optuna ``trial``: the search spaces the knobs declare."""
        return cls.KNOBS.suggest(trial) if isinstance(cls.KNOBS, Knobs) else {}

    @classmethod
    def has_search_space(cls) -> bool:
        """Whether Optuna has anything to tune: a knob declares a search space, or the class samples one."""
        own = cls.search_space.__func__ is not RAGProgram.search_space.__func__  # type: ignore[attr-defined]
        return own or (isinstance(cls.KNOBS, Knobs) and bool(cls.KNOBS.searched()))

    @classmethod
    def default_knobs(cls) -> dict[str, Any]:
        """The paper defaults, as the knobs declare them."""
        if isinstance(cls.KNOBS, Knobs):
            return cls.KNOBS.defaults()
        import inspect

        params = inspect.signature(cls.__init__).parameters
        return {k: params[k].default for k in cls.KNOBS if k in params}

    def __deepcopy__(self, memo: dict[int, Any]) -> RAGProgram:
        """Copy predictors and settings but share retrievers: optimizers copy programs many times, and a
        retriever (an index, a client with locks) is read-only, thread-safe and often too big to copy."""
        import copy

        for value in self.__dict__.values():
            if isinstance(value, Retriever) and not isinstance(value, dspy.Module):
                memo[id(value)] = value
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            new.__dict__[name] = copy.deepcopy(value, memo)
        return new

    def save(
        self,
        path: str,
        save_program: bool = False,
        modules_to_serialize: list[Any] | None = None,
        *,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """Save knobs, retriever description, instructions and demos as one JSON program file.

        Load it back with ``ragsuite.load(path)``, or into an identically built program with
        ``program.load(path)``.

        Raises:
            ConfigError: for ``save_program=True`` / ``modules_to_serialize``: ragsuite never writes
                DSPy's cloudpickle program directories (loading one runs code).
        """
        if save_program or modules_to_serialize:
            raise ConfigError(
                "ragsuite programs are saved as a JSON program file, not a cloudpickle directory: call "
                "program.save(path) and load it with ragsuite.load(path)"
            )
        from ragsuite.programs.program_format import save_program as write_program_file

        write_program_file(self, path, metadata=metadata)

    def load(self, path: str, allow_pickle: bool = False, allow_unsafe_lm_state: bool = False) -> RAGProgram:  # type: ignore[override]
        """Load the instructions and demos of a program file saved by :meth:`save` into this program.

        To rebuild a program (class, knobs, task, retriever) from a file, use ``ragsuite.load(path)``.

        Raises:
            ConfigError: for pickles or LM state (program files hold neither), a file of another program,
                or saved knobs that differ from this program's.
        """
        if allow_pickle or allow_unsafe_lm_state:
            raise ConfigError(
                "ragsuite program files hold no pickles and no LM state; call program.load(path) without "
                "allow_pickle/allow_unsafe_lm_state, or ragsuite.load(path)"
            )
        from ragsuite.programs.program_format import load_state_file

        return load_state_file(self, path)

    # ----------------------------------------------------------------- running
    def start(self, question: str) -> RunLedger:
        """Validate the question and open a ledger for one run."""
        if not isinstance(question, str) or not question.strip():
            raise ConfigError("the question is empty")
        if len(question) > MAX_QUESTION_CHARS:
            raise ConfigError(
                f"the question has {len(question)} characters, more than the {MAX_QUESTION_CHARS} allowed"
            )
        return RunLedger(question)

    def forward(self, *args: Any, **kwargs: Any) -> dspy.Prediction:
        """Run :meth:`aforward` synchronously: LM calls and retrievals in this thread, concurrent sub-steps
        on threads."""
        if type(self).aforward is RAGProgram.aforward:
            raise NotImplementedError(f"{type(self).__name__} must implement aforward (or forward)")
        return run_sync(self.aforward(*args, **kwargs))

    async def aforward(self, *args: Any, **kwargs: Any) -> dspy.Prediction:
        """The program's algorithm (subclasses implement it); here: a synchronous ``forward`` of a subclass
        run in a worker thread."""
        if type(self).forward is RAGProgram.forward:
            raise NotImplementedError(f"{type(self).__name__} must implement aforward (or forward)")
        return await in_thread(self.forward, *args, **kwargs)

    async def acall_stage(
        self,
        ledger: RunLedger,
        stage: str,
        predictor: Callable[..., Any],
        *,
        fallback: dict[str, Any] | None = None,
        **inputs: Any,
    ) -> dspy.Prediction:
        """Run one stage predictor, counting the LM call (``predictor.acall`` in an asynchronous run).

        When the LM's output cannot be parsed and ``fallback`` is given, the fallback fields are returned
        and the event is recorded in the trace and ``ledger.fallbacks``; without a fallback the parse error
        propagates. LM transport errors (timeouts, 429/5xx after retries) always propagate.
        """
        ledger.count_lm_call()
        with ledger._lock:
            ledger.stage_calls[stage] = ledger.stage_calls.get(stage, 0) + 1
        token = _CURRENT_STAGE.set(stage)
        try:
            with stage_adapter(predictor):
                return await invoke(predictor, **inputs)
        except AdapterParseError as exc:
            if fallback is None:
                raise
            reason = str(exc).splitlines()[0][:300]
            with ledger._lock:
                ledger.fallbacks.append({"stage": stage, "used": fallback, "reason": reason})
            ledger.record(stage, fallback=fallback, reason=reason)
            return dspy.Prediction(**fallback)
        finally:
            _CURRENT_STAGE.reset(token)

    def call_stage(
        self,
        ledger: RunLedger,
        stage: str,
        predictor: Callable[..., Any],
        *,
        fallback: dict[str, Any] | None = None,
        **inputs: Any,
    ) -> dspy.Prediction:
        """:meth:`acall_stage`, synchronously (for programs written with a synchronous ``forward``)."""
        return run_sync(self.acall_stage(ledger, stage, predictor, fallback=fallback, **inputs))

    async def aretrieve(
        self, ledger: RunLedger, query: str, k: int, *, retriever: Retriever | None = None
    ) -> list[Passage]:
        """Retrieve ``k`` passages for ``query``, counting the call and noting an empty result. In an
        asynchronous run the retriever's ``async def acall(query, k)`` is awaited when it has one; otherwise
        the (blocking) retriever runs in a worker thread.

        ``retriever`` overrides ``self.retriever`` for programs that query several retrievers.

        Raises:
            RetrievalError: wrapping any retriever failure, with the question in the message.
        """
        retriever = as_retriever(retriever) if retriever is not None else self.retriever
        if retriever is None:
            raise ConfigError(f"program {self.name!r} needs a retriever; pass retriever=...")
        with ledger._lock:
            ledger.retrievals += 1
        native = getattr(retriever, "acall", None)
        try:
            if not synchronous() and inspect.iscoroutinefunction(native):
                passages = list(await native(query, k))  # the retriever's own async client
            else:
                passages = await in_thread(lambda: list(retriever(query, k)))
        except Exception as exc:
            raise RetrievalError(
                f"retrieval failed for question {ledger.question[:200]!r} (query {query[:200]!r}): {exc}"
            ) from exc
        if not passages:
            with ledger._lock:
                ledger.empty_retrievals += 1
            ledger.record("retrieve", query=query, passage_ids=[], empty=True)
        ledger.add_passages(passages)
        return passages

    def retrieve(
        self, ledger: RunLedger, query: str, k: int, *, retriever: Retriever | None = None
    ) -> list[Passage]:
        """:meth:`aretrieve`, synchronously."""
        return run_sync(self.aretrieve(ledger, query, k, retriever=retriever))

    def finish(
        self, ledger: RunLedger, answer: str, passages: Sequence[Passage], **extra: Any
    ) -> dspy.Prediction:
        """Package the run: ``answer``, ``trace``, ``passages`` (the evidence used), ``stats`` and
        ``stage_calls``."""
        return dspy.Prediction(
            answer=answer,
            trace=ledger.trace,
            passages=list(passages),
            stats=ledger.stats(),
            stage_calls=dict(ledger.stage_calls),
            **extra,
        )


def run_concurrently(fn: Callable[[T], R], items: Sequence[T], *, max_workers: int | None = None) -> list[R]:
    """Map ``fn`` over ``items`` in threads, each inheriting the caller's DSPy context (LM, adapter,
    usage tracker), and return results in input order. The first exception is re-raised."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    with DaemonThreadPool(max_workers or len(items), name="ragsuite-step") as pool:
        futures = [pool.submit(contextvars.copy_context().run, fn, item) for item in items]
        return [future.result() for future in futures]


# --------------------------------------------------------------------- registry
_REGISTRY: dict[str, type[RAGProgram]] = {}


def register(cls: type[RAGProgram]) -> type[RAGProgram]:
    """Class decorator adding a program to the registry under ``cls.name``."""
    if not cls.name:
        raise TypeError(f"{cls.__name__} must set a non-empty 'name' to be registered")
    _REGISTRY[cls.name] = cls
    return cls
