"""One entry point for DSPy prompt optimizers over ragsuite programs.

Example:
    >>> import dspy, ragsuite
    >>> from ragsuite.optimizers import compile_program, split_dev
    >>> train, val = split_dev(ragsuite.data.load_dataset("hotpotqa"), train=20, val=30)  # doctest: +SKIP
    >>> with dspy.context(lm=dspy.LM("openai/gpt-4o-mini")):                              # doctest: +SKIP
    ...     compiled = compile_program(program, train, val, optimizer="mipro", dataset="hotpotqa")
    >>> compiled.save("vanilla-mipro.json")                                               # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import dspy

from ragsuite.errors import ConfigError
from ragsuite.optimizers.feedback import Metric, feedback_metric, optimizer_metric
from ragsuite.optimizers.run_cache import settings_differing

if TYPE_CHECKING:
    from ragsuite.programs.base import RAGProgram

log = logging.getLogger("ragsuite.optimizers.compile")

Optimizer = Literal["bootstrap", "bootstrap-rs", "mipro", "gepa", "simba", "reanchor"]
OPTIMIZERS: tuple[str, ...] = ("bootstrap", "bootstrap-rs", "mipro", "gepa", "simba", "reanchor")

#: GEPA's default budget, in metric calls (one scored program run each) per train + val example. A GEPA
#: iteration scores a reflection minibatch (3 examples) before and after its proposal, and the whole val slice
#: when the proposal wins; 15 per example gives about 25-60 proposals on 10 train + 20 val examples (450
#: calls), where DSPy's ``auto="light"`` asks for ~4,000 calls on a 10-predictor program.
GEPA_CALLS_PER_EXAMPLE = 15

#: The file in a GEPA log directory that records what the run there was started with.
GEPA_RUN_FILE = "ragsuite-gepa.json"


def split_dev(
    examples: Sequence[dspy.Example], *, train: int, val: int, seed: int = 0
) -> tuple[list[dspy.Example], list[dspy.Example]]:
    """Disjoint train and validation slices of a dev split after a seeded shuffle.

    The shipped splits are dev splits (the held-out test splits are not shipped), so optimization draws
    both its training and its validation examples from dev: ``train`` examples first, then ``val`` more.

    Raises:
        ConfigError: when the split has fewer than ``train + val`` examples.
    """
    if train < 0 or val < 0:
        raise ConfigError("train and val sizes must be >= 0")
    if train + val > len(examples):
        raise ConfigError(f"asked for {train} train + {val} val examples but the split has {len(examples)}")
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    shuffled = [examples[i] for i in order]
    return shuffled[:train], shuffled[train : train + val]


def optimization_metric(dataset: str) -> str:
    """The metric ``compile`` and ``tune`` maximize on ``dataset`` unless told otherwise.

    It is the dataset's primary metric, except where that is the papers' substring accuracy (a gold answer
    contained in the prediction): an optimizer learns to game it with long or hedging answers ("unknown" or
    "I don't know" contain gold "no"). Those datasets are optimized on token F1, which such answers do not
    earn; the tables keep reporting accuracy. Yes/no accuracy (StrategyQA), exact match and ALCE's STR-EM are
    kept as they are.

    Example:
        >>> optimization_metric("hotpotqa"), optimization_metric("strategyqa")
        ('f1', 'yes_no_accuracy')
    """
    from ragsuite.data.datasets import get_dataset_info

    info = get_dataset_info(dataset)
    if info.primary_metric == "accuracy" and "f1" in info.metrics:
        return "f1"
    return info.primary_metric


def _split_options(optimizer_cls: type, opts: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Route ``opts`` to the optimizer's constructor or its ``compile``; unknown names are an error."""
    init_params = set(inspect.signature(optimizer_cls.__init__).parameters) - {"self"}
    compile_params = set(inspect.signature(optimizer_cls.compile).parameters) - {"self", "student"}
    init_opts, compile_opts = {}, {}
    for key, value in opts.items():
        if key in init_params:
            init_opts[key] = value
        elif key in compile_params:
            compile_opts[key] = value
        else:
            raise ConfigError(
                f"{optimizer_cls.__name__} has no option {key!r}; it accepts "
                f"{', '.join(sorted((init_params | compile_params) - {'metric', 'trainset', 'valset'}))}"
            )
    return init_opts, compile_opts


def _teacher_settings(teacher_lm: Any) -> dict[str, Any] | None:
    return {"lm": teacher_lm} if teacher_lm is not None else None


def gepa_budget(train: int, val: int, *, per_example: int = GEPA_CALLS_PER_EXAMPLE) -> int:
    """GEPA's default ``max_metric_calls``: ``per_example`` x (``train`` + ``val``).

    Example:
        >>> gepa_budget(10, 20)
        450
    """
    if train < 1 or val < 0 or per_example < 1:
        raise ConfigError("gepa_budget needs train >= 1, val >= 0 and per_example >= 1")
    return per_example * (train + val)


def predictors_run_on(
    program: dspy.Module, examples: Sequence[dspy.Example], *, threads: int = 4
) -> list[str]:
    """Names of ``program``'s predictors that ran on at least one of ``examples``, in program order.

    Each example runs once with a DSPy trace (the LM in effect answers; cached replies are reused), the way
    GEPA traces a minibatch before it reflects. An example whose run fails counts for nothing.

    Raises:
        ConfigError: when the program fails on every example (the first error is quoted).

    Example:
        >>> with dspy.context(lm=lm):                                        # doctest: +SKIP
        ...     predictors_run_on(program, trainset)
        ['route.predict', 'answer.predict']
    """
    from dspy.utils.parallelizer import ParallelExecutor

    names = {id(predictor): name for name, predictor in program.named_predictors()}

    def run(example: dspy.Example) -> tuple[set[str], str | None]:
        with dspy.context(trace=[]):
            try:
                program(**example.inputs())
            except Exception as exc:  # counted below; one failing example is not the compile's failure
                return set(), f"{type(exc).__name__}: {exc}"
            return {names[id(entry[0])] for entry in dspy.settings.trace if id(entry[0]) in names}, None

    executor = ParallelExecutor(num_threads=threads, disable_progress_bar=True, timeout=0)
    results = executor.execute(run, list(examples))
    ran: set[str] = set()
    errors = [error for _, error in results if error]
    for found, _ in results:
        ran |= found
    if errors and len(errors) == len(results):
        from ragsuite.lm import redact

        raise ConfigError(
            f"the program failed on all {len(results)} train examples, so GEPA has nothing to reflect on "
            f"(first error: {redact(errors[0])[:500]}); check the LM (--lm, --api-base) and the retriever"
        )
    if errors:
        log.warning("%d of %d train examples failed in the trace run", len(errors), len(results))
    return [name for name in names.values() if name in ran]


class RanPredictorSelector:
    """GEPA component selector that offers only the named predictors (those that ran on the trainset).

    ``round_robin`` cycles through them in GEPA's own predictor order, keeping its position in GEPA's state
    (as GEPA's own round robin does, so a resumed run carries on where it stopped); ``all`` proposes for all
    of them at once.

    Example:
        >>> selector = RanPredictorSelector(["answer.predict"])
        >>> dspy.GEPA(metric=metric, reflection_lm=lm, component_selector=selector)  # doctest: +SKIP
    """

    def __init__(self, names: Sequence[str], *, mode: Literal["round_robin", "all"] = "round_robin") -> None:
        if mode not in ("round_robin", "all"):
            raise ConfigError(f"component_selector must be 'round_robin' or 'all', not {mode!r}")
        if not names:
            raise ConfigError("no predictor ran on the trainset, so GEPA has none to propose for")
        self.names = tuple(names)
        self.mode = mode

    def __call__(
        self,
        state: Any,
        trajectories: Any,
        subsample_scores: Any,
        candidate_idx: int,
        candidate: dict[str, str],
    ) -> list[str]:
        if self.mode == "all":
            return [name for name in candidate if name in self.names]
        order = list(state.list_of_named_predictors)
        positions = state.named_predictor_id_to_update_next_for_program_candidate
        start = positions[candidate_idx]
        for step in range(len(order)):
            pid = (start + step) % len(order)
            if order[pid] in self.names:
                positions[candidate_idx] = (pid + 1) % len(order)
                return [order[pid]]
        raise ConfigError(f"none of the predictors {', '.join(self.names)} is in GEPA's candidate")


def _gepa_run_description(
    program: RAGProgram,
    trainset: Sequence[dspy.Example],
    valset: Sequence[dspy.Example] | None,
    *,
    seed: int,
    options: dict[str, Any],
    dataset: str | None,
) -> dict[str, Any]:
    """What a GEPA run depends on, besides its budget and threads (a resume may change those)."""

    def digest(value: Any) -> str:
        text = json.dumps(value, sort_keys=True, default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def examples(items: Sequence[dspy.Example] | None) -> str:
        return digest([[item.get("id"), item.get("question")] for item in items or []])

    kept = {
        key: value
        for key, value in options.items()
        if isinstance(value, (str, int, float, bool, type(None)))
        and key not in {"max_metric_calls", "max_full_evals", "auto", "num_threads", "log_dir"}
    }
    selector = options.get("component_selector")
    kept["component_selector"] = getattr(selector, "mode", selector if isinstance(selector, str) else None)
    reflection = options.get("reflection_lm")
    return {
        "lm": getattr(dspy.settings.lm, "model", None),
        "reflection_lm": getattr(reflection, "model", None),
        "program": program.name,
        "knobs": digest(program.knobs()),
        "instructions": digest({n: p.signature.instructions for n, p in program.named_predictors()}),
        "demos": digest({n: len(p.demos) for n, p in program.named_predictors()}),
        "trainset": examples(trainset),
        "valset": examples(valset),
        "dataset": dataset,
        "seed": seed,
        "options": digest(kept),
    }


def _check_gepa_log_dir(
    log_dir: Path,
    program: RAGProgram,
    trainset: Sequence[dspy.Example],
    valset: Sequence[dspy.Example] | None,
    *,
    seed: int,
    options: dict[str, Any],
    dataset: str | None,
) -> None:
    """Record the run in ``log_dir``, or check that the run GEPA will resume there is this one."""
    description = _gepa_run_description(
        program, trainset, valset, seed=seed, options=options, dataset=dataset
    )
    record = log_dir / GEPA_RUN_FILE
    differs = settings_differing(record, description)
    if differs is not None:
        if differs:
            raise ConfigError(
                f"{log_dir} holds a GEPA run started with another {', '.join(differs)}; delete that folder "
                "to start over, or compile to another --out"
            )
        if (log_dir / "gepa_state.bin").is_file():
            log.warning("resuming the GEPA run in %s", log_dir)
        return
    if (log_dir / "gepa_state.bin").is_file():
        raise ConfigError(
            f"{log_dir} holds a GEPA run without {GEPA_RUN_FILE}, so it cannot be checked against this "
            "compile; delete that folder or compile to another --out"
        )
    log_dir.mkdir(parents=True, exist_ok=True)
    partial = record.with_name(record.name + ".tmp")
    partial.write_text(json.dumps(description, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(partial, record)


def reanchor_class() -> type:
    """DSPy's ``ReAnchor`` teleprompter (experimental in DSPy 3.4: ``dspy.experimental.ReAnchor``)."""
    found = getattr(dspy, "ReAnchor", None)
    if found is None:
        try:
            from dspy.teleprompt.reanchor import ReAnchor as found
        except ImportError as exc:
            raise ConfigError(
                f"the installed DSPy {dspy.__version__} has no ReAnchor; "
                "upgrade it (pip install 'dspy>=3.4.1')"
            ) from exc
    return found


def _reanchor(
    program: RAGProgram,
    trainset: list[dspy.Example],
    valset: list[dspy.Example] | None,
    scoring: Metric,
    *,
    threads: int,
    opts: dict[str, Any],
) -> tuple[RAGProgram, dict[str, Any]]:
    """Fit the program's decision knobs with DSPy's ReAnchor; returns the program and what was fitted.

    ReAnchor fits every decision output it finds (a threshold per yes/no output, a weight per option of a
    choice), reusing cached LM replies across candidate settings. Only settings a knob holds are kept, since
    a program file rebuilds its predictors from its knobs: a fit of another output (say, a yes/no answer's
    Literal) is undone and listed under ``not_kept``. The knobs are then read back from the predictors.
    """
    decision = program.decision_knobs()
    if not decision:
        if "decisions" in program.KNOBS and getattr(program, "decisions", None) != "probability":
            raise ConfigError(
                f"ReAnchor fits probability-backed decisions; run {program.name} with them: "
                "--set decisions=probability (decisions='probability')"
            )
        raise ConfigError(f"{program.name} has no decision thresholds or weights for ReAnchor to fit")
    teleprompter_cls = reanchor_class()
    init, comp = _split_options(teleprompter_cls, opts)
    init.setdefault("num_threads", threads)
    original = {name: dict(p.fields) for name, p in program.named_predictors()}
    teleprompter = teleprompter_cls(metric=scoring, **init)
    try:
        compiled = teleprompter.compile(program, trainset=trainset, valset=valset, **comp)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        cache = "cache" in str(exc)
        hint = " (on the command line: drop --no-cache, or --option require_cache=false)" if cache else ""
        raise ConfigError(f"ReAnchor: {exc}{hint}") from exc
    held = {(id(knob.predictor), knob.field) for knob in compiled.decision_knobs().values()}
    not_kept = []
    for name, predictor in compiled.named_predictors():
        for field in list(predictor.fields):
            if (id(predictor), field) in held or predictor.fields[field] == original[name].get(field):
                continue
            if field in original[name]:
                predictor.fields[field] = original[name][field]
            else:
                del predictor.fields[field]
            not_kept.append(f"{name}.{field}")
    if not_kept:
        log.warning("ReAnchor's fits of %s are not kept: no knob holds them", ", ".join(not_kept))
    fitted = {}
    for knob, where in compiled.decision_knobs().items():
        value = where.read()
        if value is not None:
            setattr(compiled, knob, value)
            fitted[knob] = value
    report = dict(teleprompter.report)
    rows = [
        {k: v for k, v in row.items() if isinstance(v, (str, int, float, bool, type(None)))}
        for row in report.get("fitted", [])
    ]
    summary: dict[str, Any] = {"fitted": fitted, "reanchor": rows}
    if not_kept:
        summary["not_kept"] = not_kept
    else:  # the report's scores are those of the returned program only when every fit was kept
        summary.update({k: v for k, v in report.items() if k.endswith("score") or k.endswith("score_before")})
    return compiled, summary


def compile_program(
    program: RAGProgram,
    trainset: Sequence[dspy.Example],
    valset: Sequence[dspy.Example] | None = None,
    *,
    optimizer: Optimizer = "bootstrap",
    metric: Metric | None = None,
    dataset: str | None = None,
    teacher_lm: dspy.LM | None = None,
    reflection_lm: dspy.LM | None = None,
    threads: int = 4,
    seed: int = 0,
    **opts: Any,
) -> RAGProgram:
    """Optimize a program's instructions and demos with a DSPy optimizer.

    The student LM is the one in effect (``dspy.context(lm=...)``). The result is a new program of the
    same class with the same knobs, retriever and task; ``program`` itself is left untouched.

    Args:
        program: A ragsuite program.
        trainset: Examples the optimizer learns from (``question`` input, ``answers`` label).
        valset: Examples it selects candidates on (bootstrap-rs, mipro, gepa); defaults to ``trainset``.
        optimizer: ``bootstrap`` (BootstrapFewShot), ``bootstrap-rs`` (BootstrapFewShotWithRandomSearch),
            ``mipro`` (MIPROv2, ``auto="light"`` unless ``num_candidates``/``num_trials`` are given),
            ``gepa`` (GEPA with textual feedback; see below), ``simba`` (SIMBA) or ``reanchor`` (DSPy's
            ReAnchor: fits the decision knobs, thresholds and choice weights, of a program run with
            ``decisions="probability"``; prompts and demos are left as they are; see :func:`_reanchor`).
        metric: ``metric(example, prediction, trace=None)``; defaults to ``dataset``'s
            :func:`optimization_metric`.
        dataset: Dataset name for the default metric.
        teacher_lm: LM that bootstraps demos (and, for MIPROv2/SIMBA, proposes instructions).
        reflection_lm: LM GEPA reflects with; defaults to ``teacher_lm``.
        threads: Parallel evaluations inside the optimizer.
        seed: Seed of the optimizer's random choices.
        **opts: Passed to the optimizer's constructor or its ``compile`` (e.g. ``max_bootstrapped_demos``,
            ``num_candidate_programs``, ``num_trials``, ``minibatch``, ``max_metric_calls``, ``bsize``).
            ``max_labeled_demos`` defaults to 0: dataset examples carry ``question``/``answers``, not the
            inputs and outputs of each stage, so only bootstrapped (traced) demos fit a stage's prompt.

    GEPA's budget defaults to :data:`GEPA_CALLS_PER_EXAMPLE` x (train + val) metric calls
    (:func:`gepa_budget`; ``max_metric_calls``, ``max_full_evals`` or ``auto`` override it). Before GEPA
    starts, the program runs once over the trainset with a trace, and GEPA is offered only the predictors that
    ran (:func:`predictors_run_on`): a predictor no train example reaches has no trace to reflect on. The
    others keep their instructions (logged). With ``log_dir`` GEPA keeps its state there, and the same call
    after a kill resumes it; a log_dir holding a run of another program, knobs, instructions, trainset,
    valset, dataset, seed, option, student or reflection LM model is refused.

    Returns:
        The compiled program; its ``optimization`` dict (saved as the file's metadata) names the optimizer.

    Raises:
        ConfigError: on an unknown optimizer or option, an empty trainset, GEPA without a reflection LM,
            a GEPA ``log_dir`` holding another run, or a program failing on every train example under GEPA.
    """
    job = compile_job(
        program,
        trainset,
        valset,
        optimizer=optimizer,
        metric=metric,
        dataset=dataset,
        teacher_lm=teacher_lm,
        reflection_lm=reflection_lm,
        threads=threads,
        seed=seed,
        opts=opts,
    )
    knobs = program.knobs()
    compiled, recorded = _RUNS[optimizer](job)
    return finish_compile(job, compiled, knobs=knobs, recorded=recorded)


@dataclass(frozen=True)
class CompileJob:
    """One compile's checked inputs and derived settings (:func:`compile_job`): what a run of an optimizer
    (``_RUNS``) takes and what :func:`finish_compile` records.

    Attributes:
        program: The program to optimize (left untouched).
        optimizer: One of :data:`OPTIMIZERS`.
        trainset: The examples the optimizer learns from (not empty).
        valset: The examples it selects candidates on, or None.
        metric: The dataset metric (``metric(example, prediction, trace=None)``), or None.
        scoring: ``metric`` as optimizers call it (:func:`ragsuite.optimizers.feedback.optimizer_metric`).
        dataset: The dataset name, or None.
        teacher_lm: LM that bootstraps demos and proposes instructions, or None.
        reflection_lm: LM GEPA reflects with (``teacher_lm`` when not given).
        threads: Parallel evaluations inside the optimizer.
        seed: Seed of the optimizer's random choices.
        opts: The optimizer's options, with GEPA's default budget filled in.
    """

    program: RAGProgram
    optimizer: str
    trainset: list[dspy.Example]
    valset: list[dspy.Example] | None
    metric: Metric | None
    scoring: Metric
    dataset: str | None
    teacher_lm: Any
    reflection_lm: Any
    threads: int
    seed: int
    opts: dict[str, Any]


def compile_job(
    program: RAGProgram,
    trainset: Sequence[dspy.Example],
    valset: Sequence[dspy.Example] | None = None,
    *,
    optimizer: str,
    metric: Metric | None = None,
    dataset: str | None = None,
    teacher_lm: Any = None,
    reflection_lm: Any = None,
    threads: int = 4,
    seed: int = 0,
    opts: dict[str, Any] | None = None,
) -> CompileJob:
    """Check :func:`compile_program`'s arguments and derive its settings, running nothing: the default
    metric for ``dataset``, GEPA's reflection LM and its default budget (:func:`gepa_budget`).

    Raises:
        ConfigError: not a ragsuite program, an unknown optimizer, an empty trainset, or GEPA without a
            reflection LM.
    """
    from ragsuite.programs.base import RAGProgram

    if not isinstance(program, RAGProgram):
        raise ConfigError(f"compile_program needs a ragsuite program, not {type(program).__name__}")
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {optimizer!r}; choose one of: {', '.join(OPTIMIZERS)}")
    trainset = list(trainset)
    valset = list(valset) if valset else None
    if not trainset:
        raise ConfigError("the trainset is empty")
    if metric is None and dataset:
        from ragsuite.data.metrics import metric_for

        metric = metric_for(dataset, metric=optimization_metric(dataset))
    opts = dict(opts or {})
    if optimizer == "gepa":
        reflection_lm = reflection_lm or teacher_lm
        if reflection_lm is None and "instruction_proposer" not in opts:
            raise ConfigError("GEPA needs a reflection LM: pass reflection_lm= (or --teacher-lm)")
        if not {"max_metric_calls", "max_full_evals", "auto"} & set(opts):
            # Recorded with the compile: the budget is part of what was run.
            opts["max_metric_calls"] = gepa_budget(len(trainset), len(valset or []))
    return CompileJob(
        program=program,
        optimizer=optimizer,
        trainset=trainset,
        valset=valset,
        metric=metric,
        scoring=optimizer_metric(metric, dataset=dataset, sound_trace=program.sound_demo_trace),
        dataset=dataset,
        teacher_lm=teacher_lm,
        reflection_lm=reflection_lm,
        threads=threads,
        seed=seed,
        opts=opts,
    )


# Each optimizer's run: (the compiled program, what its compile adds to the program file's metadata).
Run = tuple["RAGProgram", dict[str, Any]]


def _run_bootstrap(job: CompileJob) -> Run:
    from dspy import teleprompt as tp

    init, comp = _split_options(tp.BootstrapFewShot, job.opts)
    init.setdefault("max_labeled_demos", 0)
    init.setdefault("teacher_settings", _teacher_settings(job.teacher_lm))
    optimizer = tp.BootstrapFewShot(metric=job.scoring, **init)
    return optimizer.compile(job.program, trainset=job.trainset, **comp), {}


def _run_bootstrap_rs(job: CompileJob) -> Run:
    from dspy import teleprompt as tp

    init, comp = _split_options(tp.BootstrapFewShotWithRandomSearch, job.opts)
    init.setdefault("max_labeled_demos", 0)
    init.setdefault("teacher_settings", _teacher_settings(job.teacher_lm))
    init.setdefault("num_candidate_programs", 8)
    init.setdefault("num_threads", job.threads)
    # Its candidate seeds are fixed (-3..n); shuffling the trainset with our seed varies the draws.
    shuffled = list(job.trainset)
    random.Random(job.seed).shuffle(shuffled)
    optimizer = tp.BootstrapFewShotWithRandomSearch(metric=job.scoring, **init)
    return optimizer.compile(job.program, trainset=shuffled, valset=job.valset, **comp), {}


def _run_mipro(job: CompileJob) -> Run:
    from dspy import teleprompt as tp

    init, comp = _split_options(tp.MIPROv2, job.opts)
    init.setdefault("max_labeled_demos", 0)
    if "num_candidates" in init or "num_trials" in comp:
        init.setdefault("auto", None)
    init.setdefault("teacher_settings", _teacher_settings(job.teacher_lm))
    init.setdefault("prompt_model", job.teacher_lm)
    init.setdefault("num_threads", job.threads)
    init.setdefault("seed", job.seed)
    optimizer = tp.MIPROv2(metric=job.scoring, **init)
    return optimizer.compile(job.program, trainset=job.trainset, valset=job.valset, **comp), {}


def _run_reanchor(job: CompileJob) -> Run:
    return _reanchor(job.program, job.trainset, job.valset, job.scoring, threads=job.threads, opts=job.opts)


def _run_gepa(job: CompileJob) -> Run:
    from dspy import teleprompt as tp

    init, comp = _split_options(tp.GEPA, job.opts)
    init.setdefault("reflection_lm", job.reflection_lm)
    init.setdefault("num_threads", job.threads)
    init.setdefault("seed", job.seed)
    program, trainset = job.program, job.trainset
    ran = predictors_run_on(program, trainset, threads=job.threads)
    skipped = [name for name, _ in program.named_predictors() if name not in ran]
    if skipped:
        log.warning(
            "GEPA proposes instructions only for the %d predictor(s) that ran on the %d train examples; "
            "%d never ran and keep their instructions: %s",
            len(ran),
            len(trainset),
            len(skipped),
            ", ".join(skipped),
        )
    selector = init.get("component_selector", "round_robin")
    if isinstance(selector, str):
        init["component_selector"] = RanPredictorSelector(ran, mode=selector)  # type: ignore[arg-type]
    if init.get("log_dir") is not None:
        init["log_dir"] = str(init["log_dir"])
        _check_gepa_log_dir(
            Path(init["log_dir"]),
            program,
            trainset,
            job.valset,
            seed=job.seed,
            options=init,
            dataset=job.dataset,
        )
    optimizer = tp.GEPA(metric=feedback_metric(job.metric, dataset=job.dataset), **init)
    return optimizer.compile(program, trainset=trainset, valset=job.valset, **comp), {}


def _run_simba(job: CompileJob) -> Run:
    from dspy import teleprompt as tp

    init, comp = _split_options(tp.SIMBA, job.opts)
    init.setdefault("bsize", min(32, len(job.trainset)))
    init.setdefault("prompt_model", job.teacher_lm)
    init.setdefault("teacher_settings", _teacher_settings(job.teacher_lm))
    init.setdefault("num_threads", job.threads)
    comp.setdefault("seed", job.seed)
    optimizer = tp.SIMBA(metric=job.scoring, **init)
    return optimizer.compile(job.program, trainset=job.trainset, **comp), {}


_RUNS: dict[str, Callable[[CompileJob], Run]] = {
    "bootstrap": _run_bootstrap,
    "bootstrap-rs": _run_bootstrap_rs,
    "mipro": _run_mipro,
    "gepa": _run_gepa,
    "simba": _run_simba,
    "reanchor": _run_reanchor,
}


def finish_compile(
    job: CompileJob, compiled: RAGProgram, *, knobs: dict[str, Any], recorded: dict[str, Any]
) -> RAGProgram:
    """The compiled program as :func:`compile_program` returns it: of the program's class, with ``knobs``
    (and the knobs ``recorded["fitted"]`` names, from ReAnchor), the program's retriever, and an
    ``optimization`` dict (saved as the file's metadata) naming the optimizer, the split sizes, the seed, the
    plain options and ``recorded``.

    Raises:
        ConfigError: the optimizer returned a program of another class.
    """
    program = job.program
    if type(compiled) is not type(program):
        got, wanted = type(compiled).__name__, type(program).__name__
        raise ConfigError(f"the {job.optimizer} optimizer returned a {got}, not a {wanted}")
    knobs = {**knobs, **{knob: getattr(compiled, knob) for knob in recorded.get("fitted", {})}}
    if compiled.knobs() != knobs:
        # Optimizers copy the program, so this only happens if one rebuilt it; restore the caller's knobs.
        for name, value in knobs.items():
            setattr(compiled, name, value)
    compiled.retriever = program.retriever
    plain = (str, int, float, bool, type(None))
    compiled.optimization = {
        **dict(getattr(program, "optimization", None) or {}),
        **recorded,
        "optimizer": job.optimizer,
        "trainset_size": len(job.trainset),
        "valset_size": len(job.valset) if job.valset else 0,
        "seed": job.seed,
        "options": {k: v for k, v in job.opts.items() if isinstance(v, plain) and k != "log_dir"},
    }
    demos = sum(len(p.demos) for _, p in compiled.named_predictors())
    log.info("compiled %s with %s: %d demos in total", program.name, job.optimizer, demos)
    return compiled
