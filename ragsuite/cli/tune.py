"""``ragsuite tune``: search a program's knobs with Optuna on a validation slice of the dev split.

Examples are the slices ``ragsuite compile`` uses: after a seeded shuffle of the dev split
(``--split-seed``), the first ``--train`` examples (compiled on with ``--compile``) and the ``--val`` after
them (every trial is scored on these), whether or not ``--compile`` is given. The study lives in
``OUT/study.db`` unless ``--storage`` names a shared one (``journal:PATH``, ``postgresql://...``); start
the same command on several machines (each with its own ``--seed``, which seeds that worker's sampler and LM
requests; it is not part of the study, and ``trials.json`` records each trial's ``lm_seed``) to share the
work. ``--trials`` is the study's total: re-running resumes, with new sampler draws; a resume with another
LM, temperature, dataset, program, retriever, validation slice, split seed, metric or objectives is refused
with the differences listed. Trials left running by a killed process on this host are marked failed on
resume and queued again with the same knobs. Every LM reply is recorded as it arrives in OUT/lm-cache/ (keyed
by request and endpoint; a folder of another LM is refused), so a rerun after a kill replays the calls the
killed trial had finished and sends only the rest; with --no-cache nothing is recorded, and a stopped trial
starts over. The chosen trial is written to ``OUT/STUDY/best.json`` (with ``trials.json`` and the Pareto
files; STUDY is the study name), which ``ragsuite eval --program-file`` and ``ragsuite.load`` accept.

Quality is token F1 on datasets whose table metric is substring accuracy (HotpotQA, 2Wiki, MuSiQue), which
"unknown" would game for gold "no"; else the dataset's primary metric. A failed question scores 0 in
quality and is charged the cost of the trial's dearest answered question.

Cost: every trial is one evaluation of ``--val`` examples. ``--compile OPT`` adds one compile after the
search; ``--compile-each`` compiles in every trial (trials x one compile, e.g. 30 MIPROv2 runs).

A compiled program is tuned as it is: ``--program-file FILE`` starts every trial from the file (its prompts,
demos and knobs; the trial's knobs replace its own), and the first trial runs the file's knobs. ``--search
KNOB,KNOB`` narrows the search to those knobs, ``--set KNOB=VALUE`` fixes one for every trial. The written
program still holds out the examples the file's compile saw.

Thresholds and choice weights (``*_threshold``, HANRAG's ``route_weight_*``; the decision ones act with
``decisions=probability``, diverse-rerank's ``score_threshold`` with ``rerank_by=lm``) are continuous knobs
of the search spaces, listed below. A trial that changes only
them repeats earlier requests up to the first flipped decision, which DSPy's cache answers (unless
``--no-cache``); benchmarks/threshold_cost.py counts what is left.

Example:
    ragsuite tune --program deepnote --dataset hotpotqa --lm openai/gpt-4o-mini --trials 30 \\
        --objectives quality,lm_calls --val 50 --threads 8 --out runs/tune-deepnote
    ragsuite tune --program-file deepnote-compiled.json --dataset hotpotqa --search max_step,max_failure \\
        --trials 8 --train 30 --val 10 --out runs/tune-compiled
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from ragsuite.cli.help_text import plain, programs_epilog
from ragsuite.errors import ConfigError

log = logging.getLogger("ragsuite.cli.tune")

#: The folder in ``--out`` that records the tune's LM replies.
LM_CACHE_DIR = "lm-cache"


def register(subparsers: argparse._SubParsersAction) -> None:
    from ragsuite.cli.args import OPTIMIZER_HELP, add_lm_arguments, add_training_arguments

    parser = subparsers.add_parser(
        "tune",
        help="search a program's knobs with Optuna (multi-objective, pruning, shared studies)",
        description=plain(__doc__.split("Example:")[0]),
        epilog=programs_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_training_arguments(parser, train=20, val=50, program_help="optional with --program-file")
    parser.add_argument(
        "--program-file",
        type=Path,
        help="tune a saved (compiled) program: every trial keeps its prompts and demos, with the trial's "
        "knobs; the first trial runs the file's knobs",
    )
    parser.add_argument(
        "--search",
        metavar="KNOB,KNOB",
        help="search only these knobs (default: every knob with a search space, listed below)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="fix a knob for every trial, out of the search (repeatable)",
    )
    parser.add_argument("--trials", type=int, required=True, help="total trials in the study")
    parser.add_argument(
        "--objectives",
        default="quality",
        help="quality, then costs to minimize: quality[,lm_calls|lm_requests|tokens|retrievals]",
    )
    parser.add_argument(
        "--quality-metric",
        help="metric maximized as quality (default: f1 where the dataset's table metric is substring "
        "accuracy, else the dataset's primary metric)",
    )
    parser.add_argument(
        "--storage",
        help="shared study storage: journal:PATH (or a .log/.journal file), an SQLite file, or a database "
        "URL such as postgresql://user@host/db (default: OUT/study.db)",
    )
    parser.add_argument("--study", help="study name (default PROGRAM-DATASET-OBJECTIVES)")
    parser.add_argument("--sampler", choices=("tpe", "nsga2"), default="tpe", help="default tpe (seeded)")
    parser.add_argument("--prune", action="store_true", help="prune trials on their running score")
    parser.add_argument(
        "--tune-retriever",
        action="store_true",
        help="also search a hybrid --retriever's fusion weights, rrf_k, norm and depth",
    )
    parser.add_argument("--prune-every", type=int, help="examples between pruning checks (default val/4)")
    parser.add_argument(
        "--compile",
        choices=("bootstrap", "bootstrap-rs", "mipro", "gepa", "simba"),
        help="also compile prompts: " + OPTIMIZER_HELP,
    )
    parser.add_argument("--compile-each", action="store_true", help="compile inside every trial (costly)")
    parser.add_argument("--pick", type=int, metavar="TRIAL", help="write this trial instead of the best")
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    from ragsuite.cli.mlflow_tracking import add_mlflow_argument

    add_mlflow_argument(parser)
    add_lm_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ragsuite import programs
    from ragsuite.cli.args import (
        answer_style,
        build_lms,
        build_retriever_for,
        build_teacher,
        holdout_metadata,
        load_splits,
        parse_knob_settings,
        program_stages,
        show_progress,
        with_earlier_holdout,
    )
    from ragsuite.cli.mlflow_tracking import mlflow_run, require_mlflow
    from ragsuite.files import lock_directory
    from ragsuite.optimizers import save_program, tune
    from ragsuite.programs.program_file import read_program_file

    if args.threads < 1:
        raise ConfigError("--threads must be >= 1")
    if args.val < 1:
        raise ConfigError("--val must be >= 1")
    if args.mlflow is not None:
        require_mlflow()
    cls = programs.get(_program_name(args))
    objectives = tuple(o.strip() for o in args.objectives.split(",") if o.strip())
    search = [name.strip() for name in args.search.split(",") if name.strip()] if args.search else None
    program_kwargs: dict[str, Any] = {
        **program_stages(args, cls),
        **parse_knob_settings(args.set, cls.KNOBS, cls.name),
    }
    trainset, valset = load_splits(args, train=args.train)
    main_lm, stage_lms, lm_public = build_lms(args)
    retriever = build_retriever_for(args, cls)
    if args.program_file is not None:
        _log_differences(args, retriever)
    run_name = f"tune {cls.name} {answer_style(args)}"
    # One tune per output directory: two would overwrite each other's best.json and pareto files.
    with (
        lock_directory(args.out),
        _recording(args, lm_public),
        mlflow_run(args.mlflow, run_name=run_name, command="tune") as tracking,
    ):
        if tracking is not None:
            tracking.log_params(_run_params(args, cls.name, objectives, lm_public, trainset, valset))
            tracking.set_tags({"ragsuite.out": str(args.out.resolve())})
        result = tune(
            cls,
            dataset=answer_style(args),
            valset=valset,
            retriever=retriever,
            lm=main_lm,
            trials=args.trials,
            objectives=objectives,
            quality_metric=args.quality_metric,
            out_dir=args.out,
            storage=args.storage,
            study_name=args.study,
            sampler=args.sampler,
            seed=args.seed,
            threads=args.threads,
            prune=args.prune,
            prune_every=args.prune_every,
            compile=args.compile,
            compile_each=args.compile_each,
            trainset=trainset if args.compile else None,
            teacher_lm=build_teacher(args),
            pick=args.pick,
            program_kwargs=program_kwargs,
            stage_lms=stage_lms or None,
            run_config={"split_seed": args.split_seed},
            progress=show_progress(args),
            tune_retriever=args.tune_retriever,
            search=search,
            program_file=args.program_file,
        )
        if "program" in result.files:
            # Record what the search saw (and a program file's compile saw), so `eval --program-file` leaves
            # it out.
            holdout = holdout_metadata(args, train=trainset if args.compile else [], val=valset)
            saved = read_program_file(result.files["program"]).get("metadata") or {}
            holdout = with_earlier_holdout(saved, holdout)
            save_program(result.program, result.files["program"], metadata={**saved, **holdout})
        if tracking is not None:
            _log_study(tracking, result)
    print(format_front(result))
    for label, path in result.files.items():
        print(f"{label}: {path}")
    return 0


def _program_name(args: argparse.Namespace) -> str:
    """``--program``, else the program ``--program-file`` holds (they must agree when both are given)."""
    from ragsuite.programs.program_file import read_program_file

    if args.program_file is None:
        if not args.program:
            raise ConfigError("give --program NAME or --program-file FILE")
        return str(args.program)
    saved = read_program_file(args.program_file).get("program")
    if not isinstance(saved, str):
        raise ConfigError(f"{args.program_file} names no program")
    if args.program and args.program != saved:
        raise ConfigError(f"{args.program_file} holds program {saved!r}, not {args.program!r}")
    return saved


def _log_differences(args: argparse.Namespace, retriever: Any) -> None:
    """Warn of each way the tune runs other than what ``--program-file`` was saved with (dataset, answer
    task, retriever)."""
    from ragsuite.cli.args import answer_style
    from ragsuite.data.datasets import get_dataset_info
    from ragsuite.programs.program_file import program_file_differences, read_program_file

    describe = getattr(retriever, "describe", None)
    style = answer_style(args)
    for line in program_file_differences(
        read_program_file(args.program_file),
        dataset=args.dataset,
        task=get_dataset_info(style).task,
        retriever=describe() if callable(describe) else None,
    ):
        log.warning("%s: %s", args.program_file, line)


def _recording(args: argparse.Namespace, lm_public: dict[str, Any]) -> Any:
    """Record the tune's LM replies in ``OUT/lm-cache/``, so a trial stopped part-way replays what it had
    finished; nothing with ``--no-cache`` (its LMs bypass every cache).

    The folder belongs to the LMs (model, endpoint without credentials; the local LM by its file's sha256
    and engine); studies of several programs in one OUT share it, since a reply is keyed by its request.
    """
    import contextlib

    from ragsuite.lm import redact
    from ragsuite.optimizers.run_cache import recording_lm_calls

    if args.no_cache:
        log.warning("--no-cache: the LM calls are not recorded, so a stopped trial starts over")
        return contextlib.nullcontext()
    description = {
        "command": "tune",
        "lm": lm_public,
        "teacher_lm": redact(args.teacher_lm) if args.teacher_lm else None,
    }
    return recording_lm_calls(args.out / LM_CACHE_DIR, description=description, label="tune")


def _run_params(
    args: argparse.Namespace,
    program: str,
    objectives: tuple[str, ...],
    lm_public: dict[str, Any],
    trainset: list[Any],
    valset: list[Any],
) -> dict[str, Any]:
    """The tune's parameters for MLflow (LM endpoints without credentials)."""
    from ragsuite.cli.args import answer_style
    from ragsuite.cli.mlflow_tracking import lm_params

    return {
        "program": program,
        "program_file": str(args.program_file) if args.program_file else None,
        "search": args.search,
        "set": ",".join(args.set) or None,
        "dataset": answer_style(args),
        "trials": args.trials,
        "objectives": ",".join(objectives),
        "quality_metric": args.quality_metric,
        "sampler": args.sampler,
        "prune": args.prune,
        "study": args.study,
        "train": len(trainset) if args.compile else None,
        "val": len(valset),
        "split_seed": args.split_seed,
        "seed": args.seed,
        "threads": args.threads,
        "retriever": args.retriever,
        "compile": args.compile,
        "compile_each": args.compile_each,
        **lm_params(lm_public),
    }


def _log_study(tracking: Any, result: Any) -> None:
    """Each complete trial's objectives as ``trial.NAME`` at step = trial number; the written trial's knobs
    as ``knob.NAME`` and its scores as ``written.NAME``; the study's files as artifacts."""
    objectives = list(result.objectives)
    for trial in result.study.trials:
        if trial.state.name == "COMPLETE" and trial.values is not None:
            values = dict(zip(objectives, trial.values, strict=False))
            tracking.log_metrics({f"trial.{k}": float(v) for k, v in values.items()}, step=trial.number)
    tracking.log_params({"written_trial": result.trial.number, "knob": result.knobs})
    written = result.saved_values if result.saved_values is not None else result.trial.values
    if written is not None:
        tracking.log_metrics({f"written.{k}": float(v) for k, v in zip(objectives, written, strict=False)})
    for path in result.files.values():
        tracking.log_artifact(path, artifact_path="study")


def format_front(result: Any) -> str:
    """The Pareto front (or the best trial) as a text table, scores in percent."""
    objectives = list(result.objectives)
    header = ["trial", *objectives, "knobs"]
    rows = []
    for point in result.pareto:
        values = point["values"] or []
        cells = [f"#{point['number']}"]
        for name, value in zip(objectives, values, strict=False):
            cells.append(f"{100 * value:.1f}" if name == "quality" else f"{value:.2f}")
        cells.append(", ".join(f"{k}={v}" for k, v in point["knobs"].items()))
        rows.append(cells)
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]
    ]
    tuning = (getattr(result.program, "optimization", None) or {}).get("tuning", {})
    if tuning.get("compile") and not tuning.get("compile_each") and result.saved_values is not None:
        saved = ", ".join(
            f"{name} {100 * value:.1f}" if name == "quality" else f"{name} {value:.2f}"
            for name, value in zip(objectives, result.saved_values, strict=False)
        )
        lines.append(f"written program (trial #{result.trial.number} compiled), scored again: {saved}")
    done = sum(1 for t in result.study.trials if t.state.name == "COMPLETE")
    pruned = sum(1 for t in result.study.trials if t.state.name == "PRUNED")
    title = "Pareto front" if len(objectives) > 1 else "best trial"
    lines.insert(
        0,
        f"{title} of study {result.study.study_name!r} ({done} complete, {pruned} pruned); "
        f"written: trial #{result.trial.number}",
    )
    return "\n".join(lines)
