"""Optuna search over a program's numeric and categorical knobs, scored on a validation split.

Each trial samples knobs from the program class's search space (its declared knobs, narrowed by ``search``,
less those fixed in ``program_kwargs``; or its own ``search_space(trial)``), builds the program (or loads
``program_file``'s, a compiled program, with the trial's knobs), and runs it on the validation examples
through :func:`ragsuite.evaluation.evaluate` (threads, cost ledger). The first trial of a new study is the
paper's defaults (``cls.default_knobs()``), or the program file's knobs. Objectives are ``quality`` (the
dataset's primary metric, maximized) optionally followed by costs to minimize: ``lm_calls``, ``tokens``
(input + output) or ``retrievals`` per question; with several objectives the Pareto front is reported and
plotted.

Storage: an SQLite file in ``out_dir`` by default; a JournalStorage file (``journal:PATH`` or a path ending
in ``.log``/``.journal``) or an RDB URL (``postgresql://...``, ``sqlite:///...``) lets several processes,
on one or several machines, share a study. ``trials`` is the study's total: re-running resumes and runs only
the trials still missing; give each concurrent worker its own ``seed`` so they do not propose the same
points.

:func:`tune` is :func:`run_tuning` of a :class:`TuneConfig` (the arguments, checked), in parts each usable
alone: :func:`open_study` (storage, resume checks, defaults queued), :class:`TrialObjective` (one trial; its
``sample_knobs`` is the search space), :func:`run_trials`, :func:`choose_trial`, :func:`chosen_program`
(rebuilt, compiled and re-scored when compiling after the search) and :func:`write_study_files`.

Example:
    >>> import dspy, ragsuite
    >>> from ragsuite.optimizers import split_dev, tune
    >>> _, val = split_dev(ragsuite.data.load_dataset("hotpotqa"), train=0, val=50)    # doctest: +SKIP
    >>> with dspy.context(lm=dspy.LM("openai/gpt-4o-mini")):                           # doctest: +SKIP
    ...     result = tune("deepnote", dataset="hotpotqa", valset=val, retriever=retriever,
    ...                   trials=30, objectives=("quality", "lm_calls"), out_dir="runs/tune-deepnote")
    >>> result.best_knobs                                                              # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import random
import re
import socket
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import dspy
import optuna
from optuna.trial import FrozenTrial, TrialState

from ragsuite.errors import ConfigError, MissingExtraError
from ragsuite.files import atomic_write_text

if TYPE_CHECKING:
    from ragsuite.programs.base import RAGProgram
    from ragsuite.programs.knobs import Knobs
    from ragsuite.retrieval.base import Retriever

log = logging.getLogger("ragsuite.optimizers.tuning")

Objective = Literal["quality", "lm_calls", "lm_requests", "tokens", "retrievals"]
#: lm_calls counts stage calls; lm_requests the requests that reached the provider (a malformed reply that
#: DSPy asks again costs two requests for one call; a cache hit costs none).
OBJECTIVES: tuple[str, ...] = ("quality", "lm_calls", "lm_requests", "tokens", "retrievals")
SamplerName = Literal["tpe", "nsga2"]
_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


@dataclass
class TuneResult:
    """What :func:`tune` returns.

    Attributes:
        study: The Optuna study (all workers' trials).
        objectives: The objectives, quality first.
        trial: The chosen trial: the best one, the highest-quality Pareto trial, or the one picked.
        knobs: Its knobs.
        program: The program built with those knobs (compiled when ``compile`` was given).
        pareto: Summaries of the Pareto-optimal trials (the best trial alone for one objective).
        files: Paths written in the study's folder of ``out_dir``: ``program``, ``trials``, ``pareto_json``,
            ``pareto_png``.
        saved_values: The objectives of the program written: the trial's values, or the compiled
            program's own scores when ``compile`` ran after the search.
    """

    study: optuna.Study
    objectives: tuple[str, ...]
    trial: FrozenTrial
    knobs: dict[str, Any]
    program: RAGProgram
    pareto: list[dict[str, Any]]
    files: dict[str, Path] = field(default_factory=dict)
    saved_values: list[float] | None = None

    @property
    def best_knobs(self) -> dict[str, Any]:
        return self.knobs


# ------------------------------------------------------------------------------------------- storage
def resolve_storage(spec: str | None, out_dir: Path | None) -> str | optuna.storages.BaseStorage | None:
    """The Optuna storage that ``spec`` names (see the module docstring); None with no out_dir = in memory."""
    if spec is None or not spec.strip():
        if out_dir is None:
            return None
        return f"sqlite:///{(out_dir / 'study.db').resolve()}"
    spec = spec.strip()
    journal_path = _journal_path(spec)
    if journal_path is not None:
        if not journal_path:
            raise ConfigError("journal storage needs a file path, e.g. journal:/shared/studies/deepnote.log")
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        path = Path(journal_path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        _drop_torn_journal_tail(path)
        try:
            return JournalStorage(JournalFileBackend(str(path)))
        except ValueError as exc:  # a damaged record inside the file, not just a torn tail
            raise ConfigError(
                f"journal {path} has an unreadable record ({exc}); restore it from a backup or start a new "
                "study with --storage journal:NEW_FILE"
            ) from exc
    if "://" in spec:
        return spec
    if spec.endswith((".db", ".sqlite", ".sqlite3")):
        path = Path(spec).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path.resolve()}"
    raise ConfigError(
        f"unrecognized --storage {spec!r}: use journal:PATH (or a .log/.journal file), an SQLite file "
        "(.db), or a database URL such as postgresql://user@host/db or sqlite:///path.db"
    )


def _journal_path(spec: str) -> str | None:
    """The journal file a storage spec names (``journal:PATH`` or a ``.log``/``.journal`` file), else None."""
    spec = spec.strip()
    if spec.startswith("journal:"):
        return spec[len("journal:") :]
    if "://" not in spec and spec.endswith((".log", ".journal", ".jsonl")):
        return spec
    return None


def _local_storage_file(backing: str | optuna.storages.BaseStorage | None, spec: str | None) -> str | None:
    """The file on this machine that holds a study (an SQLite database or a journal), None for a server or
    memory: read from the spec, never from the storage object's private attributes."""
    if isinstance(backing, str) and backing.startswith("sqlite:///"):
        return backing[len("sqlite:///") :]
    journal = _journal_path(spec) if spec else None
    return str(Path(journal).expanduser()) if journal else None


def _drop_torn_journal_tail(path: Path) -> int:
    """Cut a journal's last line when it has no newline (a worker died mid-write); return the bytes cut.

    Optuna skips such a line when reading but appends the next record right after it, which merges both into
    one unreadable line and breaks the study for every worker. The cut happens under the journal's own lock,
    so a live worker's append is never mistaken for a torn one.
    """
    from optuna.storages.journal import JournalFileSymlinkLock

    if not path.is_file() or path.stat().st_size == 0:
        return 0
    lock = JournalFileSymlinkLock(str(path))
    if not lock.acquire():
        return 0
    try:
        with open(path, "r+b") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 1))
            if f.read(1) == b"\n":
                return 0
            # Find the last complete line: read backwards in blocks until a newline shows up.
            end = size
            keep = 0
            while end > 0:
                start = max(0, end - 65536)
                f.seek(start)
                block = f.read(end - start)
                newline = block.rfind(b"\n")
                if newline >= 0:
                    keep = start + newline + 1
                    break
                end = start
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
    finally:
        lock.release()
    dropped = size - keep
    log.warning(
        "journal %s ended with a torn record (a worker died while writing it); dropped its %d bytes",
        path,
        dropped,
    )
    return dropped


def redact_storage(spec: str | None) -> str | None:
    """``spec`` without a password (``postgresql://user:secret@host`` -> ``postgresql://user:***@host``)."""
    from ragsuite.redaction import hide_url_passwords

    return None if spec is None else hide_url_passwords(spec)


def _locking_sqlite(url: str) -> optuna.storages.RDBStorage:
    """An SQLite storage whose transactions take the database's write lock when they begin.

    SQLite has no row locks, so Optuna's read-then-write updates race between processes: two workers can
    both pop the same queued trial (both read WAITING, both write RUNNING), and the second then fails to
    report it. ``BEGIN IMMEDIATE`` serializes those transactions; waiting writers block up to a minute.
    """
    from sqlalchemy import event

    storage = optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 60}})

    def leave_transactions_to_sqlalchemy(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    def begin_immediate(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    event.listen(storage.engine, "connect", leave_transactions_to_sqlalchemy)
    event.listen(storage.engine, "begin", begin_immediate)
    storage.engine.dispose()  # connections opened while creating the schema lack the listeners
    return storage


@contextlib.contextmanager
def _exclusive(path: str | None) -> Any:
    """Hold a lock beside a local storage file (an SQLite or journal file, see :func:`_local_storage_file`)
    so that workers on this machine take turns; storages on a server (``path`` None) are left unlocked."""
    if not path:
        yield
        return
    from optuna.storages.journal import JournalFileSymlinkLock

    # Not the journal's own lock file: appending to the journal takes that one.
    lock = JournalFileSymlinkLock(f"{path}.defaults")
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _create_study(
    storage: str | optuna.storages.BaseStorage | None,
    name: str,
    directions: list[str],
    sampler: optuna.samplers.BaseSampler,
    pruner: optuna.pruners.BasePruner | None,
    *,
    attempts: int = 8,
) -> optuna.Study:
    from sqlalchemy.exc import IntegrityError, OperationalError

    for attempt in range(attempts):
        try:
            return optuna.create_study(
                storage=_locking_sqlite(storage)
                if isinstance(storage, str) and storage.startswith("sqlite:")
                else storage,
                study_name=name,
                directions=directions,
                sampler=sampler,
                pruner=pruner,
                load_if_exists=True,
            )
        except (IntegrityError, OperationalError) as exc:
            # Workers started together race to create the schema and the study; the loser finds it made.
            if attempt == attempts - 1:
                raise ConfigError(
                    f"could not create or open study {name!r} after {attempts} attempts ({exc}); "
                    "check that the storage is writable and not locked by a stuck process"
                ) from exc
            time.sleep(0.05 * 2**attempt * (1 + random.random()))
        except ImportError as exc:
            raise ConfigError(
                f"the storage needs a database driver that is not installed ({exc}); for PostgreSQL: "
                "pip install psycopg2-binary"
            ) from exc
        except ValueError as exc:
            raise ConfigError(
                f"study {name!r} exists with other objectives ({exc}); pick another --study name"
            ) from exc
    raise AssertionError("unreachable")


# ------------------------------------------------------------------------------------------- samplers
def make_sampler(kind: SamplerName, *, seed: int, n_objectives: int) -> optuna.samplers.BaseSampler:
    """Seeded TPE (multivariate, grouped for conditional spaces) or NSGA-II (multi-objective)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if kind == "tpe":
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True)
        if kind == "nsga2":
            if n_objectives < 2:
                raise ConfigError("the nsga2 sampler is for several objectives; use tpe for one")
            return optuna.samplers.NSGAIISampler(seed=seed)
    raise ConfigError(f"unknown sampler {kind!r}; choose tpe or nsga2")


# ------------------------------------------------------------------------------------------- trials
def _record_cost(record: dict[str, Any], objective: str) -> float | None:
    """One answered question's cost in ``objective`` from an evaluation record, or None if not recorded."""
    if objective == "tokens":
        tokens = record.get("tokens") or {}
        if "input" not in tokens:
            return None
        return float(tokens["input"]) + float(tokens.get("output", 0))
    if objective == "lm_requests":
        requests = (record.get("tokens") or {}).get("requests")
        return None if requests is None else float(requests)
    stats = record.get("stats") or {}
    return float(stats[objective]) if objective in stats else None


def objective_values(objectives: Sequence[str], quality: str, result: Any, *, asked: int) -> list[float]:
    """The objectives of one evaluation of ``asked`` questions, failed questions included.

    A question that failed (or was never reached) scores 0 in quality: the mean is over every question
    asked. In each cost it is charged as much as the dearest answered question, so a trial never looks
    cheaper because its questions failed.
    """
    metrics, cost = dict(result.metrics), dict(result.cost)
    if quality not in metrics:
        raise ConfigError(f"the evaluation reported no {quality!r} metric (it has {sorted(metrics)})")
    answered = min(int(getattr(result, "n", asked)), asked)
    failed = asked - answered
    values = []
    for objective in objectives:
        if objective == "quality":
            values.append(float(metrics[quality]) * answered / asked)
            continue
        if objective == "tokens":
            mean = float(cost.get("input_tokens", 0.0)) + float(cost.get("output_tokens", 0.0))
        else:
            mean = float(cost.get(objective, 0.0))
        if failed:
            answered_costs = [
                c
                for r in getattr(result, "records", [])
                if not r.get("error") and (c := _record_cost(r, objective)) is not None
            ]
            dearest = max(answered_costs, default=mean)
            mean = (mean * answered + dearest * failed) / asked
        values.append(mean)
    return values


class _PruneReporter:
    """``on_record`` callback: reports the running mean quality every ``every`` examples and raises
    ``optuna.TrialPruned`` when the pruner says so."""

    def __init__(self, trial: optuna.Trial, quality: str, total: int, every: int) -> None:
        self.trial, self.quality, self.total, self.every = trial, quality, total, max(1, every)
        self.seen = 0
        self.score = 0.0
        self._lock = threading.Lock()

    def __call__(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.seen += 1
            # A failed example has no metrics; it counts as wrong for the running score.
            self.score += float((record.get("metrics") or {}).get(self.quality, 0.0))
            step, running = self.seen, self.score / self.seen
        if step % self.every and step != self.total:
            return
        self.trial.report(running, step)
        if step < self.total and self.trial.should_prune():
            self.trial.set_user_attr("pruned_at", {"examples": step, "running_quality": running})
            raise optuna.TrialPruned(
                f"running {self.quality} {running:.3f} after {step}/{self.total} examples"
            )


def summarize_trial(trial: FrozenTrial) -> dict[str, Any]:
    """A JSON-able view of one trial: number, state, objective values, knobs, metrics, cost, wall seconds."""
    return {
        "number": trial.number,
        "state": trial.state.name,
        "values": list(trial.values) if trial.values else None,
        "knobs": trial.user_attrs.get("knobs", dict(trial.params)),
        "metrics": trial.user_attrs.get("metrics"),
        "cost": trial.user_attrs.get("cost"),
        "asked": trial.user_attrs.get("asked"),
        "errors": trial.user_attrs.get("errors"),
        # Wall time of a finished trial; replies replayed from the LM cache cost none of it.
        "seconds": round(trial.duration.total_seconds(), 1) if trial.duration is not None else None,
        "worker": trial.user_attrs.get("worker"),
        "lm_seed": trial.user_attrs.get("lm_seed"),
        **({"pruned_at": trial.user_attrs["pruned_at"]} if "pruned_at" in trial.user_attrs else {}),
        **({"program_file": trial.user_attrs["program_file"]} if "program_file" in trial.user_attrs else {}),
    }


def pareto_front(study: optuna.Study) -> list[FrozenTrial]:
    """Pareto-optimal completed trials, highest quality first (quality is the first objective)."""
    front = study.best_trials if len(study.directions) > 1 else [study.best_trial]
    return sorted(front, key=lambda t: (-t.values[0], *t.values[1:], t.number))


def plot_pareto(
    study: optuna.Study, objectives: Sequence[str], path: Path, *, title: str = "", quality: str = "quality"
) -> Path:
    """Scatter every completed trial (quality against each cost objective) with the Pareto front drawn, by
    the same drawing as ``ragsuite report --png``.

    Raises:
        MissingExtraError: when matplotlib is not installed (``pip install -e '.[plot]'``).
    """
    from ragsuite.report_plots import Point, Scatter, png_scatters

    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    front = {t.number for t in pareto_front(study)}
    scatters = [
        Scatter(
            f"{quality} vs {cost}",
            f"{cost} per question (lower is better)",
            f"{quality} (higher is better)",
            tuple(Point(t.values[i], t.values[0], f"#{t.number}", t.number in front) for t in done),
        )
        for i, cost in enumerate(objectives[1:], start=1)
    ]
    return png_scatters(scatters, path, title=title, feature="the Pareto plot")


def _write_json(path: Path, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def _program_class(program: str | type[RAGProgram]) -> type[RAGProgram]:
    from ragsuite import programs
    from ragsuite.programs.base import RAGProgram

    if isinstance(program, str):
        return programs.get(program)
    if isinstance(program, type) and issubclass(program, RAGProgram):
        return program
    raise ConfigError(f"program must be a registered name or a RAGProgram subclass, not {program!r}")


def study_dir_name(study_name: str) -> str:
    """The folder in ``out_dir`` that holds one study's files (its name, made safe for a path)."""
    return re.sub(r"[^A-Za-z0-9._+=-]", "_", study_name).lstrip(".") or "study"


#: LM settings that are each worker's own, not the study's: ``ragsuite tune --seed`` seeds both the sampler
#: and the LM's sampling, and every worker of a shared study is told to use its own. Trials record theirs.
_WORKER_LM_SETTINGS = ("seed",)


def _lm_config(lm: Any) -> dict[str, Any] | None:
    """What decides an LM's answers across workers: model and sampling settings (never its address or key,
    nor the per-worker seed)."""
    if lm is None:
        return None
    kwargs = dict(getattr(lm, "kwargs", None) or {})
    settings = ("temperature", "max_tokens", "max_completion_tokens", "top_p", "reasoning_effort")
    return {
        "model": str(getattr(lm, "model", type(lm).__name__)),
        **{k: kwargs[k] for k in settings if k in kwargs},
    }


def _retriever_config(retriever: Any) -> Any:
    """What decides a retriever's passages: its description without client timeouts and retries."""
    if retriever is None or not hasattr(retriever, "describe"):
        return None if retriever is None else type(retriever).__name__

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("timeout", "retries")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(retriever.describe())


def _jsonable(value: Any) -> Any:
    # Optuna stores user attributes as JSON; credentials in URLs (a retriever server) are masked first.
    return json.loads(redact_storage(json.dumps(value, default=str, sort_keys=True)) or "null")


def _check_study_config(study: optuna.Study, config: dict[str, Any]) -> None:
    """Record the study's configuration, or refuse to add trials made under another one."""
    from ragsuite.evaluation import config_diff

    saved = study.user_attrs.get("config")
    if saved is None:
        study.set_user_attr("config", config)
        return
    saved = _without_worker_settings(saved)
    diffs = config_diff(saved, config, keys=sorted(set(saved) | set(config)))
    if diffs:
        raise ConfigError(
            f"study {study.study_name!r} was run with another configuration:\n  "
            + "\n  ".join(diffs)
            + "\nre-run with the study's settings to resume it, or start a new study (--study NAME or "
            "another --out)"
        )


def _without_worker_settings(config: dict[str, Any]) -> dict[str, Any]:
    """A saved study configuration without the per-worker LM settings that earlier versions stored."""

    def strip(lm: Any) -> Any:
        return {k: v for k, v in lm.items() if k not in _WORKER_LM_SETTINGS} if isinstance(lm, dict) else lm

    stage_lms = config.get("stage_lms")
    return {
        **config,
        "lm": strip(config.get("lm")),
        **({"stage_lms": {k: strip(v) for k, v in stage_lms.items()}} if isinstance(stage_lms, dict) else {}),
    }


def _resumed_seed(seed: int, trials_so_far: int) -> int:
    """The sampler seed for a run that finds ``trials_so_far`` trials: a resumed study continues with new
    points instead of replaying the ones the first run's seeded sampler proposed."""
    if trials_so_far == 0:
        return seed
    return random.Random(f"{seed}/{trials_so_far}").randrange(2**31)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def fail_orphaned_trials(study: optuna.Study, *, host: str | None = None) -> list[int]:
    """Mark FAIL the RUNNING trials whose worker process on this host is gone (killed mid-trial), and queue
    each again with the same knobs: with the run's LM replies recorded (``ragsuite tune``), the retry replays
    the calls the killed trial finished instead of paying for another point's.

    Trials of other hosts are left alone: whether their workers live cannot be told from here. The state is
    set through ``study.tell``, Optuna's public way to finish a trial by number.
    """
    host = host or socket.gethostname()
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner_host, _, pid = str(trial.user_attrs.get("worker", "")).rpartition(":")
        if owner_host != host or not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            study.tell(trial.number, state=TrialState.FAIL)
        except (RuntimeError, ValueError, optuna.exceptions.UpdateFinishedTrialError):
            continue  # another worker got there first
        failed.append(trial.number)
        if trial.params:
            study.enqueue_trial(dict(trial.params), user_attrs={"retry_of": trial.number})
    if failed:
        log.warning(
            "study %s: trials %s were left running by dead workers; marked FAIL and queued again",
            study.study_name,
            failed,
        )
    return failed


# ------------------------------------------------------------------------------------------- configuration
def _tunable_class(program: str | type[RAGProgram]) -> type[RAGProgram]:
    cls = _program_class(program)
    if not cls.has_search_space():
        raise ConfigError(
            f"program {cls.name!r} declares no search space: give a knob search=... in "
            f"{cls.__name__}.KNOBS, or implement {cls.__name__}.search_space(trial)"
        )
    return cls


def _checked_objectives(objectives: Sequence[str], *, prune: bool) -> tuple[str, ...]:
    objectives = tuple(objectives)
    unknown = [o for o in objectives if o not in OBJECTIVES]
    if unknown or not objectives or objectives[0] != "quality" or len(set(objectives)) != len(objectives):
        raise ConfigError(
            f"objectives must be 'quality' followed by distinct costs from {OBJECTIVES[1:]}, not {objectives}"
        )
    if prune and len(objectives) > 1:
        raise ConfigError(
            "pruning works with a single objective (quality) only; Optuna cannot prune Pareto studies"
        )
    return objectives


def _check_compile(optimizer: str | None, *, each: bool, trainset: Sequence[Any] | None) -> None:
    if optimizer is None:
        if each:
            raise ConfigError("compile_each needs compile=OPTIMIZER")
        return
    from ragsuite.optimizers.compile import OPTIMIZERS

    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {optimizer!r}; choose one of: {', '.join(OPTIMIZERS)}")
    if not trainset:
        raise ConfigError("compile needs a trainset (examples disjoint from the validation set)")


@dataclass
class TuneConfig:
    """One tuning run, checked when built: :func:`tune`'s arguments (same names and meanings) and the
    settings derived from them. Nothing is opened or written until :func:`open_study`.

    Attributes:
        cls: The program class (set from ``program``).
        task: The dataset's answer task.
        quality: The metric maximized as quality (``quality_metric`` or the dataset's default).
        examples: The validation examples in the order trials score them (seeded shuffle under pruning).
        base_knobs: The knobs a trial starts from: the defaults, then ``program_file``'s, then those fixed in
            ``program_kwargs``; the first trial of a new study runs them.
        program_file_sha256: The SHA-256 of ``program_file``'s bytes, read once when the run is checked: a
            resume with another file is another study.
        searched: The knobs each trial samples, in declaration order; None when the class samples its own
            search space (``search_space`` overridden, or knobs not declared as :class:`Knobs`).
    """

    program: str | type[RAGProgram]
    dataset: str
    valset: Sequence[dspy.Example]
    retriever: Retriever | None = None
    lm: dspy.LM | None = None
    trials: int = 20
    objectives: Sequence[str] = ("quality",)
    quality_metric: str | None = None
    out_dir: str | os.PathLike[str] | None = None
    storage: str | None = None
    study_name: str | None = None
    sampler: SamplerName = "tpe"
    seed: int = 0
    threads: int = 8
    prune: bool = False
    prune_every: int | None = None
    pruner: optuna.pruners.BasePruner | None = None
    compile: str | None = None
    compile_each: bool = False
    trainset: Sequence[dspy.Example] | None = None
    compile_options: dict[str, Any] | None = None
    teacher_lm: dspy.LM | None = None
    pick: int | None = None
    program_kwargs: dict[str, Any] | None = None
    stage_lms: dict[str, dspy.BaseLM] | None = None
    evaluate_fn: Callable[..., Any] | None = None
    run_config: dict[str, Any] | None = None
    progress: bool = False
    tune_retriever: bool = False
    search: Sequence[str] | None = None
    program_file: str | os.PathLike[str] | None = None
    cls: type[RAGProgram] = field(init=False)
    task: str = field(init=False)
    quality: str = field(init=False)
    examples: list[dspy.Example] = field(init=False)
    fusion: Any = field(init=False, default=None)
    base_knobs: dict[str, Any] = field(init=False)
    searched: list[str] | None = field(init=False)
    program_file_sha256: str | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        from ragsuite.data.datasets import get_dataset_info
        from ragsuite.optimizers.compile import optimization_metric

        self.cls = _tunable_class(self.program)
        self.objectives = _checked_objectives(self.objectives, prune=self.prune)
        if self.trials < 1:
            raise ConfigError("trials must be >= 1")
        self.valset = list(self.valset)
        if not self.valset:
            raise ConfigError("the validation set is empty")
        _check_compile(self.compile, each=self.compile_each, trainset=self.trainset)
        if self.program_file is not None and self.compile is not None:
            raise ConfigError(
                "a program file's trials keep its prompts and demos, which compiling would replace: tune the "
                "program by name to compile after the search"
            )
        info = get_dataset_info(self.dataset)
        self.task = info.task
        self.quality = self.quality_metric or optimization_metric(self.dataset)
        if self.quality not in info.metrics:
            raise ConfigError(
                f"quality metric {self.quality!r} is not one of {self.dataset}'s metrics; choose one of: "
                f"{', '.join(info.metrics)}"
            )
        if self.evaluate_fn is None:
            from ragsuite.evaluation import evaluate

            self.evaluate_fn = evaluate
        self.out_dir = Path(self.out_dir).expanduser() if self.out_dir is not None else None
        self.program_kwargs = dict(self.program_kwargs or {})
        self.base_knobs = self._base_knobs()
        self.searched = self._searched()
        if self.program_file is not None:
            from ragsuite.data.datasets import file_sha256

            self.program_file_sha256 = file_sha256(self.program_file)
        self.study_name = self.study_name or f"{self.cls.name}-{self.dataset}-{'+'.join(self.objectives)}"
        if self.prune and self.pruner is None:
            self.pruner = optuna.pruners.MedianPruner(n_startup_trials=3)
        self.examples = list(self.valset)
        if self.prune:
            random.Random(self.seed).shuffle(self.examples)
        if self.tune_retriever:
            from ragsuite.retrieval.hybrid import FusionSearch

            self.fusion = FusionSearch(self.retriever)  # a hybrid's weights, rrf_k, norm, depth as knobs

    def _declared(self) -> Knobs | None:
        """The class's declared knobs, when the tuner samples them (the class does not sample its own)."""
        from ragsuite.programs.base import RAGProgram
        from ragsuite.programs.knobs import Knobs

        own_space = self.cls.search_space.__func__ is not RAGProgram.search_space.__func__  # type: ignore[attr-defined]
        return self.cls.KNOBS if isinstance(self.cls.KNOBS, Knobs) and not own_space else None

    def _fixed(self) -> list[str]:
        """The knobs ``program_kwargs`` fixes for every trial."""
        return [name for name in self.program_kwargs or {} if name in self.cls.KNOBS]

    def _base_knobs(self) -> dict[str, Any]:
        base = self.cls.default_knobs()
        if self.program_file is not None:
            from ragsuite.programs.program_file import load_program

            # Checked whole here (class, knobs, demos), before any trial runs.
            saved = load_program(self.program_file, rebuild_retriever=False)
            if saved.name != self.cls.name:
                raise ConfigError(f"{self.program_file} holds program {saved.name!r}, not {self.cls.name!r}")
            base.update(saved.knobs())
        base.update({name: self.program_kwargs[name] for name in self._fixed()})  # type: ignore[index]
        return base

    def _searched(self) -> list[str] | None:
        declared, fixed = self._declared(), self._fixed()
        if declared is None:
            if self.search is not None or fixed:
                raise ConfigError(
                    f"{self.cls.__name__} samples its own search space (search_space), so no knob can be "
                    "fixed or chosen for the search; declare its knobs as Knobs"
                )
            return None
        names = list(self.search) if self.search is not None else declared.searched()
        declared.refuse_unknown(names, program=self.cls.name)
        unsearchable = [name for name in names if declared[name].search is None]
        if unsearchable:
            raise ConfigError(
                f"knob {unsearchable[0]!r} of {self.cls.name} has no search space; the knobs with one: "
                f"{', '.join(declared.searched())}"
            )
        both = [name for name in fixed if self.search is not None and name in names]
        if both:
            raise ConfigError(f"knob {both[0]!r} is both fixed and searched: give it one way")
        chosen = [name for name in declared.searched() if name in names and name not in fixed]
        if not chosen and not self.tune_retriever:
            raise ConfigError(
                f"nothing is left to search: every knob of {self.cls.name} with a search space is fixed"
            )
        return chosen

    @property
    def out(self) -> Path | None:
        return self.out_dir  # type: ignore[return-value]  # a Path once checked

    @property
    def name(self) -> str:
        return str(self.study_name)

    @property
    def directions(self) -> list[str]:
        return ["maximize"] + ["minimize"] * (len(self.objectives) - 1)

    @property
    def files_dir(self) -> Path | None:
        """The study's own folder in ``out_dir`` (program file, trials, Pareto front)."""
        return self.out / study_dir_name(self.name) if self.out is not None else None

    @property
    def report_every(self) -> int:
        """Examples between pruning reports."""
        return self.prune_every or max(1, len(self.examples) // 4)

    def run_lm(self) -> Any:
        """The LM trials run with: ``lm``, else the one in effect."""
        return self.lm if self.lm is not None else dspy.settings.lm

    def study_config(self) -> dict[str, Any]:
        """What defines the study, stored with it and compared when it is resumed (JSON, credentials
        masked)."""
        from ragsuite.evaluation import example_id, examples_fingerprint

        return _jsonable(
            {
                "program": self.cls.name,
                # Stage objects (filter=, blend=) enter the config as the settings that rebuild them.
                "program_kwargs": {
                    k: v.describe() if hasattr(v, "describe") else v
                    for k, v in (self.program_kwargs or {}).items()
                },
                "dataset": self.dataset,
                "valset": {
                    "size": len(self.valset),
                    "ids": examples_fingerprint([example_id(ex, i) for i, ex in enumerate(self.valset)]),
                },
                "quality_metric": self.quality,
                "objectives": list(self.objectives),
                "lm": _lm_config(self.run_lm()),
                "stage_lms": {stage: _lm_config(lm) for stage, lm in (self.stage_lms or {}).items()},
                "retriever": _retriever_config(self.retriever),
                "compile": {"optimizer": self.compile, "each": self.compile_each} if self.compile else None,
                **({"tune_retriever": True} if self.tune_retriever else {}),
                **({"search": list(self.searched)} if self.search is not None else {}),
                **({"program_file": self.program_file_sha256} if self.program_file is not None else {}),
                **(self.run_config or {}),
            }
        )


# ------------------------------------------------------------------------------------------- the study
def open_study(config: TuneConfig) -> optuna.Study:
    """Create the study, or resume it: check that it was run with the same configuration, fail the trials
    dead workers on this host left running, reseed the sampler past the trials it holds, and queue the
    program's defaults (or the program file's knobs) as the first trial of a new study."""
    if config.out is not None:
        config.out.mkdir(parents=True, exist_ok=True)
    backing = resolve_storage(config.storage, config.out)
    study = _create_study(
        backing,
        config.name,
        config.directions,
        make_sampler(config.sampler, seed=config.seed, n_objectives=len(config.objectives)),
        config.pruner if config.prune and config.pruner is not None else optuna.pruners.NopPruner(),
    )
    _check_study_config(study, config.study_config())
    metric_names = [config.quality, *config.objectives[1:]]
    if study.metric_names != metric_names:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(metric_names)
    fail_orphaned_trials(study)
    if study.trials:
        study.sampler = make_sampler(
            config.sampler,
            seed=_resumed_seed(config.seed, len(study.trials)),
            n_objectives=len(config.objectives),
        )
    with _exclusive(_local_storage_file(backing, config.storage)):  # workers starting together see it empty
        if not study.trials:
            start = {
                k: v
                for k, v in config.base_knobs.items()
                if isinstance(v, (bool, int, float, str))
                and k not in (config.program_kwargs or {})
                and (config.searched is None or k in config.searched)
            }
            start.update(config.fusion.defaults() if config.fusion is not None else {})
            study.enqueue_trial(start, skip_if_exists=True)
    return study


def _finished_trials(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=_FINISHED))


def run_trials(study: optuna.Study, objective: Callable[[optuna.Trial], Any], config: TuneConfig) -> None:
    """Run the trials the study still lacks to hold ``config.trials`` finished (or pruned) ones."""

    def stop_when_full(study_: optuna.Study, _trial: FrozenTrial) -> None:
        # Other workers' finished trials count too. Running ones do not: a worker killed mid-trial leaves its
        # trial RUNNING forever, which must not block the study. So W workers may end W-1 trials over.
        if _finished_trials(study_) >= config.trials:
            study_.stop()

    remaining = config.trials - _finished_trials(study)
    if remaining <= 0:
        log.info("study %s already has %d finished trials; nothing to run", config.name, config.trials)
        return
    log.info("study %s: running %d of %d trials", config.name, remaining, config.trials)
    study.optimize(
        objective,
        n_trials=remaining,
        callbacks=[stop_when_full],
        gc_after_trial=False,
        show_progress_bar=config.progress,
    )


# ------------------------------------------------------------------------------------------- the trials
class TrialPrograms:
    """Builds, compiles and scores the programs of a study's trials, under the run's LM and stage LMs."""

    def __init__(self, config: TuneConfig) -> None:
        self.config = config

    def lm_scope(self) -> contextlib.AbstractContextManager[Any]:
        return dspy.context(lm=self.config.lm) if self.config.lm is not None else contextlib.nullcontext()

    def _with_stage_lms(self, built: RAGProgram) -> RAGProgram:
        if self.config.stage_lms:
            from ragsuite.lm import set_stage_lms

            set_stage_lms(built, self.config.stage_lms)
        return built

    def build(self, knobs: dict[str, Any], retriever: Retriever | None = None) -> RAGProgram:
        """The program with ``knobs`` and the fixed constructor arguments (and ``retriever``, a trial's
        tuned one, instead of the run's): built new, or ``program_file``'s with its prompts and demos."""
        config = self.config
        retriever = retriever if retriever is not None else config.retriever
        try:
            # Each trial gets its own copy of any stage, so one trial's compiled prompts stay its own.
            own = {
                k: copy.deepcopy(v) if isinstance(v, dspy.Module) else v
                for k, v in (config.program_kwargs or {}).items()
            }
            if config.program_file is not None:
                from ragsuite.programs.program_file import load_program

                built = load_program(
                    config.program_file, retriever=retriever, rebuild_retriever=False, task=config.task,
                    **own, **knobs,
                )  # fmt: skip
            else:
                built = config.cls(retriever=retriever, task=config.task, **own, **knobs)
        except TypeError as exc:
            raise ConfigError(f"cannot build {config.cls.name} with knobs {knobs}: {exc}") from exc
        return self._with_stage_lms(built)

    def load(self, path: str | os.PathLike[str], retriever: Retriever | None = None) -> RAGProgram:
        """A trial's compiled program, from the program file it was saved to."""
        from ragsuite.programs.program_file import load_program

        fixed = self.config.program_kwargs or {}
        retriever = retriever if retriever is not None else self.config.retriever
        return self._with_stage_lms(load_program(path, retriever=retriever, **fixed))

    def compile(self, built: RAGProgram) -> RAGProgram:
        from ragsuite.data.metrics import metric_for
        from ragsuite.optimizers.compile import compile_program

        config = self.config
        return compile_program(
            built,
            list(config.trainset or []),
            config.valset,
            optimizer=config.compile,  # type: ignore[arg-type]
            metric=metric_for(config.dataset, metric=config.quality),
            dataset=config.dataset,
            teacher_lm=config.teacher_lm,
            seed=config.seed,
            threads=config.threads,
            **(config.compile_options or {}),
        )

    def score(self, built: RAGProgram, label: int | str, knobs: dict[str, Any], on_record: Any = None) -> Any:
        """Evaluate ``built`` on the validation examples; every example failing is an error."""
        config = self.config
        assert config.evaluate_fn is not None  # set when the configuration is checked
        result = config.evaluate_fn(
            built,
            config.examples,
            dataset=config.dataset,
            threads=config.threads,
            progress=False,
            on_record=on_record,
        )
        if not getattr(result, "n", 1):
            first = next((r["error"] for r in result.records if r.get("error")), None)
            raise ConfigError(
                f"every example failed in trial {label} (knobs {knobs}): {first or 'none was scored'}"
            )
        return result


def _result_attrs(result: Any, asked: int) -> dict[str, Any]:
    """What a trial keeps of its evaluation: metrics, mean costs, questions asked and failed."""
    return {
        "metrics": dict(result.metrics),
        "cost": {k: float(v) for k, v in dict(result.cost).items()},
        "asked": asked,
        "errors": asked - min(int(getattr(result, "n", asked)), asked),
    }


class TrialObjective:
    """The study's objective: a trial samples knobs, builds (and with ``compile_each`` compiles and saves)
    the program, scores it and returns the objective values."""

    def __init__(self, config: TuneConfig, programs: TrialPrograms) -> None:
        self.config, self.programs = config, programs
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        # The worker's own LM sampling seed: not part of the study (see _WORKER_LM_SETTINGS), kept per trial.
        self.lm_seed = (getattr(config.run_lm(), "kwargs", None) or {}).get("seed")

    def sample_knobs(self, trial: optuna.Trial) -> dict[str, Any]:
        """The search space: the knobs this trial tries."""
        config = self.config
        if config.searched is not None:
            space = config.cls.KNOBS.tuned(*config.searched)  # type: ignore[union-attr]  # declared Knobs
            return space.suggest(trial, base=config.base_knobs)
        knobs = config.cls.search_space(trial)
        if not isinstance(knobs, dict) or not knobs:
            raise ConfigError(
                f"{self.config.cls.__name__}.search_space must return a non-empty dict of knobs"
            )
        return knobs

    def __call__(self, trial: optuna.Trial) -> list[float] | float:
        config = self.config
        # First, so that a trial killed at any point can be traced to its (dead) worker.
        trial.set_user_attr("worker", self.worker)
        trial.set_user_attr("lm_seed", self.lm_seed)
        knobs = self.sample_knobs(trial)
        trial.set_user_attr("knobs", knobs)
        built = self.programs.build(
            knobs, config.fusion.suggest(trial) if config.fusion is not None else None
        )
        asked = len(config.examples)
        on_record = (
            _PruneReporter(trial, config.quality, asked, config.report_every) if config.prune else None
        )
        with self.programs.lm_scope():
            if config.compile_each:
                built = self.programs.compile(built)
                self._save(trial, built)
            result = self.programs.score(built, trial.number, knobs, on_record)
        values = objective_values(config.objectives, config.quality, result, asked=asked)
        for key, value in _result_attrs(result, asked).items():
            trial.set_user_attr(key, value)
        log.info("trial %d %s -> %s", trial.number, knobs, dict(zip(config.objectives, values, strict=True)))
        return values if len(values) > 1 else values[0]

    def _save(self, trial: optuna.Trial, built: RAGProgram) -> None:
        if self.config.files_dir is None:
            return
        from ragsuite.programs.program_file import save_program

        path = save_program(built, self.config.files_dir / "trials" / f"trial-{trial.number}.json")
        trial.set_user_attr("program_file", str(path))


# ------------------------------------------------------------------------------------------- the choice
def choose_trial(study: optuna.Study, config: TuneConfig) -> tuple[FrozenTrial, list[FrozenTrial]]:
    """The trial to write (``config.pick``, else the highest-quality Pareto trial) and the Pareto front."""
    completed = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not completed:
        raise ConfigError(f"study {config.name!r} has no completed trial (all pruned or failed)")
    front = pareto_front(study)
    if config.pick is None:
        return front[0], front
    chosen = next((t for t in completed if t.number == config.pick), None)
    if chosen is None:
        raise ConfigError(f"trial {config.pick} is not a completed trial of study {config.name!r}")
    return chosen, front


@dataclass
class ChosenProgram:
    """The chosen trial's program as it is written, and its scores.

    Attributes:
        program: Built with the trial's knobs (compiled when the run compiles).
        values: Its objective values: the trial's, or the compiled program's own; None when unscored.
        metrics: Its metrics, as ``values``.
        cost: Its mean costs, as ``values``.
        unscored: Why the compiled program could not be scored (it is written anyway), else None.
    """

    program: RAGProgram
    values: list[float] | None
    metrics: dict[str, Any] | None
    cost: dict[str, Any] | None
    unscored: ConfigError | None = None


def chosen_program(config: TuneConfig, programs: TrialPrograms, chosen: FrozenTrial) -> ChosenProgram:
    """Rebuild the chosen trial's program; compile it and score it again when the run compiles after the
    search (compiling changes the program, so the trial's score is not the saved program's)."""
    knobs = dict(chosen.user_attrs.get("knobs", chosen.params))
    saved_file = chosen.user_attrs.get("program_file")
    fixed = optuna.trial.FixedTrial(chosen.params)
    retriever = config.fusion.suggest(fixed) if config.fusion is not None else None
    if saved_file and Path(saved_file).is_file():
        best = programs.load(saved_file, retriever)
    else:
        best = programs.build(knobs, retriever)
    metrics, cost = chosen.user_attrs.get("metrics"), chosen.user_attrs.get("cost")
    if config.compile is None or saved_file:
        return ChosenProgram(best, list(chosen.values), metrics, cost)
    with programs.lm_scope():
        best = programs.compile(best)
        try:
            result = programs.score(best, f"{chosen.number} (compiled)", knobs)
        except ConfigError as exc:
            return ChosenProgram(best, None, None, None, unscored=exc)  # the compile is paid for: save it
    values = objective_values(config.objectives, config.quality, result, asked=len(config.examples))
    attrs = _result_attrs(result, len(config.examples))
    return ChosenProgram(best, values, attrs["metrics"], attrs["cost"])


def tuning_metadata(config: TuneConfig, chosen: FrozenTrial, final: ChosenProgram) -> dict[str, Any]:
    """What the program file records of the search: the written program's scores and the study."""
    storage = redact_storage(config.storage) if config.storage else None
    started_from = (
        {"file": Path(config.program_file).name, "sha256": config.program_file_sha256}
        if config.program_file is not None
        else None
    )
    return {
        "metrics": final.metrics,
        "cost": final.cost,
        "tuning": {
            "study": config.name,
            "storage": storage or ("sqlite (out dir)" if config.out is not None else "memory"),
            "trial": chosen.number,
            "objectives": list(config.objectives),
            "values": final.values,
            "trial_values": list(chosen.values),
            "quality_metric": config.quality,
            "dataset": config.dataset,
            "valset_size": len(config.valset),
            "trials": config.trials,
            "seed": config.seed,
            "compile": config.compile,
            "compile_each": config.compile_each,
            "searched": list(config.searched) if config.searched is not None else None,
            **({"started_from": started_from} if started_from is not None else {}),
        },
    }


# ------------------------------------------------------------------------------------------- the files
def write_study_files(
    config: TuneConfig,
    study: optuna.Study,
    program: RAGProgram,
    metadata: dict[str, Any],
    pareto: list[dict[str, Any]],
) -> dict[str, Path]:
    """Write the study's folder: ``best.json`` (the program file), ``trials.json``, and for several
    objectives ``pareto.json`` and ``pareto.png`` (left out, with a warning, without matplotlib)."""
    from ragsuite.programs.program_file import save_program

    files_dir = config.files_dir
    if files_dir is None:
        raise ConfigError("writing a study's files needs out_dir")
    files = {
        "program": save_program(program, files_dir / "best.json", metadata=metadata),
        "trials": _write_json(files_dir / "trials.json", [summarize_trial(t) for t in study.trials]),
    }
    if len(config.objectives) < 2:
        return files
    front = {"study": config.name, "objectives": list(config.objectives), "directions": config.directions}
    files["pareto_json"] = _write_json(files_dir / "pareto.json", {**front, "front": pareto})
    completed = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    try:
        files["pareto_png"] = plot_pareto(
            study,
            config.objectives,
            files_dir / "pareto.png",
            title=f"{config.cls.name} on {config.dataset}: {len(completed)} trials",
            quality=config.quality,
        )
    except MissingExtraError as exc:
        log.warning("%s; pareto.json was written without the plot", exc)
    return files


# ------------------------------------------------------------------------------------------- tune
def run_tuning(config: TuneConfig) -> TuneResult:
    """Run a checked tuning configuration: open the study, run its missing trials, choose a trial, rebuild
    (and compile) its program and write the study's files. See :func:`tune`."""
    study = open_study(config)
    programs = TrialPrograms(config)
    run_trials(study, TrialObjective(config, programs), config)
    chosen, front = choose_trial(study, config)
    final = chosen_program(config, programs, chosen)
    metadata = tuning_metadata(config, chosen, final)
    pareto = [summarize_trial(t) for t in front]
    files = (
        write_study_files(config, study, final.program, metadata, pareto) if config.out is not None else {}
    )
    final.program.optimization = {**dict(getattr(final.program, "optimization", None) or {}), **metadata}
    if final.unscored is not None:
        where = f"saved unscored to {files['program']}" if "program" in files else "not saved (no out_dir)"
        raise ConfigError(f"{final.unscored}; the compiled program was {where}") from final.unscored
    knobs = dict(chosen.user_attrs.get("knobs", chosen.params))
    return TuneResult(
        study, tuple(config.objectives), chosen, knobs, final.program, pareto, files, final.values
    )


def tune(
    program: str | type[RAGProgram],
    *,
    dataset: str,
    valset: Sequence[dspy.Example],
    retriever: Retriever | None = None,
    lm: dspy.LM | None = None,
    trials: int = 20,
    objectives: Sequence[str] = ("quality",),
    quality_metric: str | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    storage: str | None = None,
    study_name: str | None = None,
    sampler: SamplerName = "tpe",
    seed: int = 0,
    threads: int = 8,
    prune: bool = False,
    prune_every: int | None = None,
    pruner: optuna.pruners.BasePruner | None = None,
    compile: str | None = None,
    compile_each: bool = False,
    trainset: Sequence[dspy.Example] | None = None,
    compile_options: dict[str, Any] | None = None,
    teacher_lm: dspy.LM | None = None,
    pick: int | None = None,
    program_kwargs: dict[str, Any] | None = None,
    stage_lms: dict[str, dspy.BaseLM] | None = None,
    evaluate_fn: Callable[..., Any] | None = None,
    run_config: dict[str, Any] | None = None,
    progress: bool = False,
    tune_retriever: bool = False,
    search: Sequence[str] | None = None,
    program_file: str | os.PathLike[str] | None = None,
) -> TuneResult:
    """Search a program's knobs with Optuna; write the chosen program as a program file.

    Args:
        program: Registered program name or class; it must implement ``search_space(trial)``.
        dataset: Dataset name (metrics, task).
        valset: Validation examples every trial is scored on.
        retriever: Shared by every trial's program.
        lm: LM the trials run with; defaults to the one in effect (``dspy.context``).
        trials: Total trials the study should hold (finished or pruned); a re-run adds only the missing ones.
            With several workers sharing a study, each stops once the total is reached, so the study can
            end with up to (workers - 1) extra trials, the ones still running at that moment.
        objectives: ``quality`` first, then any of ``lm_calls``, ``tokens``, ``retrievals`` (minimized).
        quality_metric: Metric maximized as quality; defaults to
            :func:`~ragsuite.optimizers.compile.optimization_metric` (F1 where the papers' metric is the
            gameable substring accuracy). A failed question scores 0.
        out_dir: Where ``study.db`` (default storage) goes, and, in a folder named after the study,
            ``trials.json``, ``pareto.json``/``pareto.png`` and ``best.json`` (the program file). None keeps
            everything in memory.
        storage: See the module docstring.
        study_name: Defaults to ``<program>-<dataset>-<objectives>``.
        sampler: ``tpe`` (seeded, multivariate; multi-objective TPE for several objectives) or ``nsga2``.
        seed: Sampler seed (and the example order under pruning). Concurrent workers need distinct seeds.
        threads: Examples evaluated at once within a trial.
        prune: Single objective only: evaluate examples in a seeded shuffled order, report the running
            quality every ``prune_every`` examples and stop hopeless trials (``pruner``, default
            ``MedianPruner(n_startup_trials=3)``).
        prune_every: Examples between reports; default: a quarter of the validation set.
        pruner: An Optuna pruner to use instead of the default.
        compile: A :func:`~ragsuite.optimizers.compile_program` optimizer. Prompts are compiled once, for the
            chosen trial's knobs, after the search (one compile), or per trial with ``compile_each``
            (trials x compile cost: a MIPROv2 "light" run is hundreds of LM calls, every trial).
        compile_each: Compile inside every trial before scoring it.
        trainset: Examples to compile on (disjoint from ``valset``).
        compile_options: Extra options for ``compile_program``.
        teacher_lm: Teacher/reflection LM for compiling.
        pick: Write this trial (number) instead of the best one, e.g. a chosen Pareto point.
        program_kwargs: Fixed constructor arguments for every trial: stages, and knobs left out of the search.
        stage_lms: Per-stage LMs (``{"route": small_lm}``) given to every trial's program.
        evaluate_fn: Replacement for :func:`ragsuite.evaluation.evaluate` (same signature and result).
        run_config: Further settings that define the study (e.g. the split seed); stored with it like the
            program, dataset, validation examples, LMs, retriever, metric and objectives, and compared when
            the study is resumed.
        progress: Show Optuna's trial progress bar (trials done, elapsed, ETA, best value).
        tune_retriever: Also search the hybrid ``retriever``'s fusion weights, ``rrf_k``, ``norm`` and
            ``depth`` (:class:`~ragsuite.retrieval.hybrid.FusionSearch`); each trial's program retrieves
            through its own fusion, and the written program keeps the chosen one.
        search: The knobs to search (default: every knob with a search space). Knobs given in
            ``program_kwargs`` are fixed and never searched.
        program_file: A saved program (a compiled one) every trial starts from: its prompts, demos and
            knobs, the trial's knobs replacing its own. The first trial runs the file's knobs; the written
            program keeps the file's metadata (the examples its compile saw among them). Not with
            ``compile``.

    Returns:
        :class:`TuneResult`.

    Raises:
        ConfigError: bad objectives, a program without a search space, a storage that cannot be opened, a
            picked trial that did not complete, a study whose trials all failed or were pruned, or a study
            that was run with another configuration.
    """
    config = TuneConfig(
        program=program,
        dataset=dataset,
        valset=valset,
        retriever=retriever,
        lm=lm,
        trials=trials,
        objectives=objectives,
        quality_metric=quality_metric,
        out_dir=out_dir,
        storage=storage,
        study_name=study_name,
        sampler=sampler,
        seed=seed,
        threads=threads,
        prune=prune,
        prune_every=prune_every,
        pruner=pruner,
        compile=compile,
        compile_each=compile_each,
        trainset=trainset,
        compile_options=compile_options,
        teacher_lm=teacher_lm,
        pick=pick,
        program_kwargs=program_kwargs,
        stage_lms=stage_lms,
        evaluate_fn=evaluate_fn,
        run_config=run_config,
        progress=progress,
        tune_retriever=tune_retriever,
        search=search,
        program_file=program_file,
    )
    return run_tuning(config)
