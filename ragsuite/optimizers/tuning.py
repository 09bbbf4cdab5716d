"""Optuna search over a program's numeric and categorical knobs, scored on a validation split.

Each trial samples knobs from the program class's ``search_space(trial)``, builds the program, and runs it on
the validation examples through :func:`ragsuite.evaluation.evaluate` (threads, cost ledger). The first trial
of a new study is the paper's defaults (``cls.default_knobs()``). Objectives are ``quality`` (the dataset's
primary metric, maximized) optionally followed by costs to minimize: ``lm_calls``, ``tokens`` (input +
output) or ``retrievals`` per question; with several objectives the Pareto front is reported and plotted.

Storage: an SQLite file in ``out_dir`` by default; a JournalStorage file (``journal:PATH`` or a path ending
in ``.log``/``.journal``) or an RDB URL (``postgresql://...``, ``sqlite:///...``) lets several processes,
on one or several machines, share a study. ``trials`` is the study's total: re-running resumes and runs only
the trials still missing; give each concurrent worker its own ``seed`` so they do not propose the same
points.

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
    journal_path = None
    if spec.startswith("journal:"):
        journal_path = spec[len("journal:") :]
    elif "://" not in spec and spec.endswith((".log", ".journal", ".jsonl")):
        journal_path = spec
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
def _exclusive(storage: str | optuna.storages.BaseStorage | None) -> Any:
    """Hold a lock beside a local storage file (an SQLite or journal file) so that workers on this machine
    take turns; storages on a server are left unlocked."""
    path = None
    if isinstance(storage, str) and storage.startswith("sqlite:///"):
        path = storage[len("sqlite:///") :]
    elif isinstance(storage, optuna.storages.JournalStorage):
        path = getattr(getattr(storage, "_backend", None), "_file_path", None)
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
    """A JSON-able view of one trial: number, state, objective values, knobs, metrics, cost."""
    return {
        "number": trial.number,
        "state": trial.state.name,
        "values": list(trial.values) if trial.values else None,
        "knobs": trial.user_attrs.get("knobs", dict(trial.params)),
        "metrics": trial.user_attrs.get("metrics"),
        "cost": trial.user_attrs.get("cost"),
        "asked": trial.user_attrs.get("asked"),
        "errors": trial.user_attrs.get("errors"),
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


def _has_search_space(cls: type[RAGProgram]) -> bool:
    from ragsuite.programs.base import RAGProgram

    return cls.search_space.__func__ is not RAGProgram.search_space.__func__  # type: ignore[attr-defined]


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
    """Mark FAIL the RUNNING trials whose worker process on this host is gone (killed mid-trial).

    Trials of other hosts are left alone: whether their workers live cannot be told from here.
    """
    host = host or socket.gethostname()
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner_host, _, pid = str(trial.user_attrs.get("worker", "")).rpartition(":")
        if owner_host != host or not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        except (RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
            continue  # another worker got there first
        failed.append(trial.number)
    if failed:
        log.warning(
            "study %s: trials %s were left running by dead workers; marked FAIL", study.study_name, failed
        )
    return failed


# ------------------------------------------------------------------------------------------- tune
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
        program_kwargs: Fixed constructor arguments for every trial (not tuned).
        stage_lms: Per-stage LMs (``{"route": small_lm}``) given to every trial's program.
        evaluate_fn: Replacement for :func:`ragsuite.evaluation.evaluate` (same signature and result).
        run_config: Further settings that define the study (e.g. the split seed); stored with it like the
            program, dataset, validation examples, LMs, retriever, metric and objectives, and compared when
            the study is resumed.
        progress: Show Optuna's trial progress bar (trials done, elapsed, ETA, best value).

    Returns:
        :class:`TuneResult`.

    Raises:
        ConfigError: bad objectives, a program without a search space, a storage that cannot be opened, a
            picked trial that did not complete, a study whose trials all failed or were pruned, or a study
            that was run with another configuration.
    """
    from ragsuite.data.datasets import get_dataset_info

    cls = _program_class(program)
    if not _has_search_space(cls):
        raise ConfigError(
            f"program {cls.name!r} declares no search space; implement {cls.__name__}.search_space(trial)"
        )
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
    if trials < 1:
        raise ConfigError("trials must be >= 1")
    valset = list(valset)
    if not valset:
        raise ConfigError("the validation set is empty")
    if compile is not None:
        from ragsuite.optimizers.compile import OPTIMIZERS

        if compile not in OPTIMIZERS:
            raise ConfigError(f"unknown optimizer {compile!r}; choose one of: {', '.join(OPTIMIZERS)}")
        if not trainset:
            raise ConfigError("compile needs a trainset (examples disjoint from the validation set)")
    elif compile_each:
        raise ConfigError("compile_each needs compile=OPTIMIZER")
    from ragsuite.optimizers.compile import optimization_metric

    info = get_dataset_info(dataset)
    quality = quality_metric or optimization_metric(dataset)
    if quality not in info.metrics:
        raise ConfigError(
            f"quality metric {quality!r} is not one of {dataset}'s metrics; choose one of: "
            f"{', '.join(info.metrics)}"
        )
    if evaluate_fn is None:
        from ragsuite.evaluation import evaluate as evaluate_fn
    out = Path(out_dir).expanduser() if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    fixed = dict(program_kwargs or {})
    name = study_name or f"{cls.name}-{dataset}-{'+'.join(objectives)}"
    directions = ["maximize"] + ["minimize"] * (len(objectives) - 1)
    if prune and pruner is None:
        pruner = optuna.pruners.MedianPruner(n_startup_trials=3)
    files_dir = out / study_dir_name(name) if out is not None else None
    backing = resolve_storage(storage, out)
    study = _create_study(
        backing,
        name,
        directions,
        make_sampler(sampler, seed=seed, n_objectives=len(objectives)),
        pruner if prune else optuna.pruners.NopPruner(),
    )
    from ragsuite.evaluation import example_id, examples_fingerprint

    _check_study_config(
        study,
        _jsonable(
            {
                "program": cls.name,
                # Stage objects (filter=, blend=) enter the config as the settings that rebuild them.
                "program_kwargs": {
                    k: v.describe() if hasattr(v, "describe") else v for k, v in fixed.items()
                },
                "dataset": dataset,
                "valset": {
                    "size": len(valset),
                    "ids": examples_fingerprint([example_id(ex, i) for i, ex in enumerate(valset)]),
                },
                "quality_metric": quality,
                "objectives": list(objectives),
                "lm": _lm_config(lm if lm is not None else dspy.settings.lm),
                "stage_lms": {stage: _lm_config(stage_lm) for stage, stage_lm in (stage_lms or {}).items()},
                "retriever": _retriever_config(retriever),
                "compile": {"optimizer": compile, "each": compile_each} if compile else None,
                **(run_config or {}),
            }
        ),
    )
    metric_names = [quality, *objectives[1:]]
    if study.metric_names != metric_names:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(metric_names)
    fail_orphaned_trials(study)
    if study.trials:
        study.sampler = make_sampler(
            sampler, seed=_resumed_seed(seed, len(study.trials)), n_objectives=len(objectives)
        )
    examples = list(valset)
    if prune:
        random.Random(seed).shuffle(examples)
    every = prune_every or max(1, len(examples) // 4)

    def lm_scope() -> contextlib.AbstractContextManager[Any]:
        return dspy.context(lm=lm) if lm is not None else contextlib.nullcontext()

    def with_stage_lms(built: RAGProgram) -> RAGProgram:
        if stage_lms:
            from ragsuite.lm import set_stage_lms

            set_stage_lms(built, stage_lms)
        return built

    def build(knobs: dict[str, Any]) -> RAGProgram:
        try:
            # Each trial gets its own copy of any stage, so one trial's compiled prompts stay its own.
            own = {k: copy.deepcopy(v) if isinstance(v, dspy.Module) else v for k, v in fixed.items()}
            built = cls(retriever=retriever, task=info.task, **own, **knobs)
        except TypeError as exc:
            raise ConfigError(f"cannot build {cls.name} with knobs {knobs}: {exc}") from exc
        return with_stage_lms(built)

    def compile_for(built: RAGProgram) -> RAGProgram:
        from ragsuite.data.metrics import metric_for
        from ragsuite.optimizers.compile import compile_program

        return compile_program(
            built,
            list(trainset or []),
            valset,
            optimizer=compile,  # type: ignore[arg-type]
            metric=metric_for(dataset, metric=quality),
            dataset=dataset,
            teacher_lm=teacher_lm,
            seed=seed,
            threads=threads,
            **(compile_options or {}),
        )

    worker = f"{socket.gethostname()}:{os.getpid()}"
    # The worker's own LM sampling seed: not part of the study (see _WORKER_LM_SETTINGS), kept per trial.
    lm_seed = (getattr(lm if lm is not None else dspy.settings.lm, "kwargs", None) or {}).get("seed")

    def score(
        built: RAGProgram, trial_number: int | str, knobs: dict[str, Any], on_record: Any = None
    ) -> Any:
        result = evaluate_fn(
            built, examples, dataset=dataset, threads=threads, progress=False, on_record=on_record
        )
        if not getattr(result, "n", 1):
            first = next((r["error"] for r in result.records if r.get("error")), None)
            raise ConfigError(
                f"every example failed in trial {trial_number} (knobs {knobs}): {first or 'none was scored'}"
            )
        return result

    def objective(trial: optuna.Trial) -> list[float] | float:
        # First, so that a trial killed at any point can be traced to its (dead) worker.
        trial.set_user_attr("worker", worker)
        trial.set_user_attr("lm_seed", lm_seed)
        knobs = cls.search_space(trial)
        if not isinstance(knobs, dict) or not knobs:
            raise ConfigError(f"{cls.__name__}.search_space must return a non-empty dict of knobs")
        trial.set_user_attr("knobs", knobs)
        built = build(knobs)
        on_record = _PruneReporter(trial, quality, len(examples), every) if prune else None
        with lm_scope():
            if compile_each:
                built = compile_for(built)
                if files_dir is not None:
                    from ragsuite.programs.program_file import save_program

                    path = save_program(built, files_dir / "trials" / f"trial-{trial.number}.json")
                    trial.set_user_attr("program_file", str(path))
            result = score(built, trial.number, knobs, on_record)
        values = objective_values(objectives, quality, result, asked=len(examples))
        trial.set_user_attr("metrics", dict(result.metrics))
        trial.set_user_attr("cost", {k: float(v) for k, v in dict(result.cost).items()})
        trial.set_user_attr("asked", len(examples))
        trial.set_user_attr(
            "errors", len(examples) - min(int(getattr(result, "n", len(examples))), len(examples))
        )
        log.info("trial %d %s -> %s", trial.number, knobs, dict(zip(objectives, values, strict=True)))
        return values if len(values) > 1 else values[0]

    def counted(states: Sequence[TrialState]) -> int:
        return len(study.get_trials(deepcopy=False, states=tuple(states)))

    def stop_when_full(study_: optuna.Study, _trial: FrozenTrial) -> None:
        # Other workers' finished trials count too. Running ones do not: a worker killed mid-trial leaves its
        # trial RUNNING forever, which must not block the study. So W workers may end W-1 trials over.
        if counted(_FINISHED) >= trials:
            study_.stop()

    with _exclusive(backing):  # workers starting together would each find the study empty
        if not study.trials:
            defaults = {
                k: v
                for k, v in cls.default_knobs().items()
                if isinstance(v, (bool, int, float, str)) and k not in fixed
            }
            study.enqueue_trial(defaults, skip_if_exists=True)
    remaining = trials - counted(_FINISHED)
    if remaining > 0:
        log.info("study %s: running %d of %d trials", name, remaining, trials)
        study.optimize(
            objective,
            n_trials=remaining,
            callbacks=[stop_when_full],
            gc_after_trial=False,
            show_progress_bar=progress,
        )
    else:
        log.info("study %s already has %d finished trials; nothing to run", name, trials)

    completed = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not completed:
        raise ConfigError(f"study {name!r} has no completed trial (all pruned or failed)")
    front = pareto_front(study)
    if pick is not None:
        chosen = next((t for t in completed if t.number == pick), None)
        if chosen is None:
            raise ConfigError(f"trial {pick} is not a completed trial of study {name!r}")
    else:
        chosen = front[0]
    knobs = dict(chosen.user_attrs.get("knobs", chosen.params))
    files: dict[str, Path] = {}
    if "program_file" in chosen.user_attrs and Path(chosen.user_attrs["program_file"]).is_file():
        from ragsuite.programs.program_file import load_program

        best = with_stage_lms(load_program(chosen.user_attrs["program_file"], retriever=retriever, **fixed))
    else:
        best = build(knobs)
    saved_values: list[float] | None = list(chosen.values)
    saved_metrics, saved_cost = chosen.user_attrs.get("metrics"), chosen.user_attrs.get("cost")
    unscored: ConfigError | None = None
    if compile is not None and "program_file" not in chosen.user_attrs:
        # Compiling changes the program, so the trial's score is not the saved program's: score it again.
        with lm_scope():
            best = compile_for(best)
            try:
                result = score(best, f"{chosen.number} (compiled)", knobs)
            except ConfigError as exc:
                unscored = exc  # the compile is paid for: save it unscored, then report
        if unscored is None:
            saved_values = objective_values(objectives, quality, result, asked=len(examples))
            saved_metrics = dict(result.metrics)
            saved_cost = {k: float(v) for k, v in dict(result.cost).items()}
        else:
            saved_values = saved_metrics = saved_cost = None
    metadata = {
        "metrics": saved_metrics,
        "cost": saved_cost,
        "tuning": {
            "study": name,
            "storage": redact_storage(storage) if storage else ("sqlite (out dir)" if out else "memory"),
            "trial": chosen.number,
            "objectives": list(objectives),
            "values": saved_values,
            "trial_values": list(chosen.values),
            "quality_metric": quality,
            "dataset": dataset,
            "valset_size": len(valset),
            "trials": trials,
            "seed": seed,
            "compile": compile,
            "compile_each": compile_each,
        },
    }
    pareto = [summarize_trial(t) for t in front]
    if out is not None:
        from ragsuite.programs.program_file import save_program

        assert files_dir is not None
        files["program"] = save_program(best, files_dir / "best.json", metadata=metadata)
        files["trials"] = _write_json(files_dir / "trials.json", [summarize_trial(t) for t in study.trials])
        if len(objectives) > 1:
            files["pareto_json"] = _write_json(
                files_dir / "pareto.json",
                {"study": name, "objectives": list(objectives), "directions": directions, "front": pareto},
            )
            try:
                files["pareto_png"] = plot_pareto(
                    study,
                    objectives,
                    files_dir / "pareto.png",
                    title=f"{cls.name} on {dataset}: {len(completed)} trials",
                    quality=quality,
                )
            except MissingExtraError as exc:
                log.warning("%s; pareto.json was written without the plot", exc)
    best.optimization = {**dict(getattr(best, "optimization", None) or {}), **metadata}
    if unscored is not None:
        where = f"saved unscored to {files['program']}" if "program" in files else "not saved (no out_dir)"
        raise ConfigError(f"{unscored}; the compiled program was {where}") from unscored
    return TuneResult(study, objectives, chosen, knobs, best, pareto, files, saved_values)
