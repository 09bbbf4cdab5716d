"""``ragsuite compile``: optimize a program's prompts with a DSPy optimizer and save it as a program file.

Train and validation examples are disjoint slices of the dataset's dev split after a seeded shuffle
(``--split-seed``): the first ``--train`` examples, then ``--val`` more. The held-out test splits are not
shipped, so evaluate the result on dev examples outside both slices (or on your own test split).

The optimizer maximizes token F1 on datasets whose table metric is substring accuracy (HotpotQA, 2Wiki,
MuSiQue: "unknown" contains gold "no", which an optimizer would learn to exploit), else the dataset's
primary metric. The before/after scores count a failed question as 0; when no question could be scored,
the command stops with an error (exit 2).

GEPA's budget defaults to 15 metric calls (scored program runs) per train + val example, 450 for 10 + 20
(``--max-metric-calls`` overrides it). GEPA is offered only the predictors that ran when the program was
run once over the train slice (the others keep their instructions; they are listed on stderr). GEPA keeps its
state in OUT's folder as OUT_STEM.gepa/ (``--option log_dir=DIR`` moves it): after a kill, the same command
resumes; one with another program, knobs, slices, seed, options or LM model is refused.

A stopped compile resumes: every LM reply is recorded as it arrives in OUT's folder as OUT_STEM.lm-cache/
(keyed by request and endpoint; the local LM by its model file's sha256 and engine), and the same command
run again replays the finished calls from there and sends only the rest (the optimizers are seeded, so the
replay takes the same path). A compile with another program, knobs, optimizer, options, slices, seed or LM is
refused there. With --no-cache nothing is recorded or replayed, and a stopped compile starts over.

Example:
    ragsuite compile --program vanilla --dataset hotpotqa --optimizer mipro --lm openai/gpt-4o-mini \\
        --train 20 --val 30 --out vanilla-mipro.json
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from ragsuite.cli.args import (
    OPTIMIZER_HELP,
    add_lm_arguments,
    add_training_arguments,
    build_lms,
    build_retriever_for,
    build_teacher,
    load_splits,
    parse_knob_settings,
    program_stages,
)
from ragsuite.cli.help_text import plain, programs_epilog
from ragsuite.errors import ConfigError, RagsuiteError

log = logging.getLogger("ragsuite.cli.compile")

#: GEPA's default budget per train + val example (as ``ragsuite.optimizers.compile.GEPA_CALLS_PER_EXAMPLE``,
#: which a test checks; kept here so that ``--help`` does not import DSPy).
GEPA_CALLS_PER_EXAMPLE = 15


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compile",
        help="optimize a program's prompts and demos with a DSPy optimizer",
        description=plain(__doc__.split("Example:")[0]),
        epilog=programs_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_training_arguments(parser, train=20, val=30)
    parser.add_argument("--optimizer", required=True, choices=_optimizers(), help=OPTIMIZER_HELP)
    parser.add_argument(
        "--set", action="append", default=[], metavar="KNOB=VALUE", help="program knob (repeatable)"
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="optimizer option (repeatable; JSON values), e.g. --option max_metric_calls=200 "
        "--option num_candidate_programs=4",
    )
    parser.add_argument(
        "--max-metric-calls",
        type=int,
        metavar="N",
        help="GEPA's budget in metric calls, each one scored program run (default "
        f"{GEPA_CALLS_PER_EXAMPLE} x (train + val): 450 for 10 + 20)",
    )
    parser.add_argument("--no-eval", action="store_true", help="skip scoring before/after on the val slice")
    parser.add_argument("--out", required=True, type=Path, help="program file to write (JSON)")
    from ragsuite.cli.mlflow_tracking import add_mlflow_argument

    add_mlflow_argument(parser)
    add_lm_arguments(parser)
    parser.set_defaults(func=run)


def _optimizers() -> tuple[str, ...]:
    return ("bootstrap", "bootstrap-rs", "mipro", "gepa", "simba", "reanchor")


def parse_options(items: list[str]) -> dict[str, Any]:
    """``["max_metric_calls=200", "auto=light"]`` -> ``{"max_metric_calls": 200, "auto": "light"}``."""
    options: dict[str, Any] = {}
    for item in items:
        key, eq, raw = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--option expects KEY=VALUE, not {item!r}")
        try:
            options[key.strip()] = json.loads(raw)
        except ValueError:
            options[key.strip()] = raw
    return options


def gepa_log_dir(out: Path) -> Path:
    """Where ``compile --out OUT`` keeps GEPA's state: ``OUT_STEM.gepa/`` beside the program file."""
    return out.with_name(f"{out.stem}.gepa")


def lm_cache_dir(out: Path) -> Path:
    """Where ``compile --out OUT`` records its LM replies: ``OUT_STEM.lm-cache/`` beside the program file."""
    return out.with_name(f"{out.stem}.lm-cache")


def gepa_options(
    args: argparse.Namespace, options: dict[str, Any], *, train: int, val: int
) -> dict[str, Any]:
    """``options`` with GEPA's budget (``--max-metric-calls``, else the default) and log directory."""
    from ragsuite.optimizers.compile import gepa_budget

    if args.optimizer != "gepa":
        if args.max_metric_calls is not None:
            raise ConfigError("--max-metric-calls is GEPA's budget; it needs --optimizer gepa")
        return options
    options = dict(options)
    budgets = {"max_metric_calls", "max_full_evals", "auto"} & set(options)
    if args.max_metric_calls is not None:
        if budgets:
            given = sorted(budgets)[0]
            raise ConfigError(f"give either --max-metric-calls or --option {given}=..., not both")
        if args.max_metric_calls < 1:
            raise ConfigError("--max-metric-calls must be >= 1")
        options["max_metric_calls"] = args.max_metric_calls
    elif not budgets:
        options["max_metric_calls"] = gepa_budget(train, val)
    options.setdefault("log_dir", str(gepa_log_dir(args.out)))
    return options


def run(args: argparse.Namespace) -> int:
    """Compile; with ``--mlflow`` the compile is one MLflow run (see :mod:`ragsuite.cli.mlflow_tracking`)."""
    import dspy

    from ragsuite import programs
    from ragsuite.cli.args import answer_style, holdout_metadata
    from ragsuite.cli.mlflow_tracking import mlflow_run, numeric_metrics, require_mlflow
    from ragsuite.data.datasets import get_dataset_info
    from ragsuite.lm import set_stage_lms
    from ragsuite.optimizers import compile_program, optimization_metric, save_program

    if args.train < 1:
        raise ConfigError("--train must be >= 1")
    if args.threads < 1:
        raise ConfigError("--threads must be >= 1")
    if args.mlflow is not None:
        require_mlflow()
    info = get_dataset_info(answer_style(args))
    cls = programs.get(args.program)
    knobs = parse_knob_settings(args.set, cls.KNOBS, args.program)
    options = parse_options(args.option)
    trainset, valset = load_splits(args, train=args.train)
    options = gepa_options(args, options, train=len(trainset), val=len(valset))
    main_lm, stage_lms, lm_public = build_lms(args)
    teacher = build_teacher(args)
    stages = program_stages(args, cls)
    program = cls(retriever=build_retriever_for(args, cls), task=info.task, **knobs, **stages)
    if stage_lms:
        set_stage_lms(program, stage_lms)
    metrics: dict[str, Any] = {}
    metric = optimization_metric(info.name)
    metadata = {
        "lm": lm_public["lm"].get("model"),
        "teacher_lm": args.teacher_lm.partition("@")[0] if args.teacher_lm else None,
        "dataset": info.name,
        "split_seed": args.split_seed,
        "metrics": metrics,
        **holdout_metadata(args, train=trainset, val=valset),
    }
    run_name = f"compile {args.program} {args.optimizer} {info.name}"
    with mlflow_run(args.mlflow, run_name=run_name, command="compile") as tracking:
        if tracking is not None:
            tracking.log_params(_run_params(args, program, lm_public, options, info.name, trainset, valset))
            tags = {"ragsuite.out": str(args.out.resolve())}
            if options.get("log_dir"):
                tags["ragsuite.gepa_log_dir"] = str(Path(options["log_dir"]).resolve())
            tracking.set_tags(tags)
        description = _run_description(args, program, lm_public, options, metadata)
        with _recording(args, description), dspy.context(lm=main_lm):
            if not args.no_eval and valset:
                metrics["baseline"] = _score(
                    program, valset, args, metric=metric, label="the program before compiling"
                )
            compiled = compile_program(
                program,
                trainset,
                valset or None,
                optimizer=args.optimizer,
                dataset=info.name,
                teacher_lm=teacher,
                threads=args.threads,
                seed=args.seed,
                **options,
            )
            if not args.no_eval and valset:
                try:
                    metrics["compiled"] = _score(
                        compiled, valset, args, metric=metric, label="the compiled program"
                    )
                except RagsuiteError:
                    # The compile is paid for: keep it, then report that it could not be scored.
                    save_program(compiled, args.out, metadata=metadata)
                    log.error("the compiled program was saved to %s unscored", args.out)
                    raise
        path = save_program(compiled, args.out, metadata=metadata)
        predictors = compiled.named_predictors()
        demos = sum(len(p.demos) for _, p in predictors)
        if tracking is not None:
            scores = {
                label: {key: scored[key] for key in ("score", "metrics", "cost", "n", "errors")}
                for label, scored in metrics.items()
            }
            tracking.log_metrics(
                {**numeric_metrics(scores), "demos": float(demos), "predictors": float(len(predictors))}
            )
            tracking.log_artifact(path, artifact_path="program")
    print(
        f"compiled {args.program} with {args.optimizer} on {len(trainset)} train examples: "
        f"{demos} demos across {len(predictors)} predictors"
    )
    fitted = compiled.optimization.get("fitted") or {}
    if fitted:
        print("  fitted knobs: " + ", ".join(f"{knob}={value:g}" for knob, value in fitted.items()))
    for label in ("baseline", "compiled"):
        if label in metrics:
            scored = metrics[label]
            failed = f", {scored['errors']} failed (scored 0)" if scored["errors"] else ""
            print(f"  {label:9s} {metric} on {len(valset)} val examples: {100 * scored['score']:.1f}{failed}")
    print(f"program file: {path}")
    if not args.no_cache:
        print(f"LM calls: {lm_cache_dir(args.out)} (the same command replays them; delete it to start over)")
    if options.get("log_dir"):
        print(f"GEPA log: {options['log_dir']} (the same command resumes from it)")
    return 0


def _recording(args: argparse.Namespace, description: dict[str, Any]) -> Any:
    """Record the compile's LM replies beside the program file, so a stopped compile resumes; nothing is
    recorded or replayed with ``--no-cache`` (its LMs bypass every cache)."""
    import contextlib

    from ragsuite.optimizers.run_cache import recording_lm_calls

    if args.no_cache:
        log.warning("--no-cache: the LM calls are not recorded, so a stopped compile starts over")
        return contextlib.nullcontext()
    return recording_lm_calls(lm_cache_dir(args.out), description=description, label="compile")


def _run_description(
    args: argparse.Namespace,
    program: Any,
    lm_public: dict[str, Any],
    options: dict[str, Any],
    metadata: dict[str, Any],
) -> dict[str, Any]:
    """What a compile's recorded LM replies belong to: a rerun with anything else must not replay them.

    LMs appear as the manifest records them (model, endpoint without credentials; the local LM by its
    file's sha256 and engine), never with a key. Threads are left out: they change no request.
    """
    from ragsuite.lm import redact

    return {
        "command": "compile",
        "program": args.program,
        "stage": list(getattr(args, "stage", None) or []),
        "knobs": program.knobs(),
        "optimizer": args.optimizer,
        "options": {k: v for k, v in options.items() if k != "log_dir"},
        "seed": args.seed,
        "retriever": args.retriever,
        "lm": lm_public,
        "teacher_lm": redact(args.teacher_lm) if args.teacher_lm else None,
        **{k: v for k, v in metadata.items() if k not in ("metrics", "lm", "teacher_lm")},
    }


def _run_params(
    args: argparse.Namespace,
    program: Any,
    lm_public: dict[str, Any],
    options: dict[str, Any],
    dataset: str,
    trainset: list[Any],
    valset: list[Any],
) -> dict[str, Any]:
    """The compile's parameters for MLflow (LM endpoints without credentials; knobs, options as groups)."""
    from ragsuite.cli.mlflow_tracking import lm_params
    from ragsuite.lm import redact

    return {
        "program": args.program,
        "optimizer": args.optimizer,
        "dataset": dataset,
        "train": len(trainset),
        "val": len(valset),
        "split_seed": args.split_seed,
        "seed": args.seed,
        "threads": args.threads,
        "retriever": args.retriever,
        **lm_params(lm_public),
        "teacher_lm": redact(args.teacher_lm.partition("@")[0]) if args.teacher_lm else None,
        "knob": program.knobs(),
        "option": options,
    }


def _score(
    program: Any, examples: list[Any], args: argparse.Namespace, *, metric: str, label: str
) -> dict[str, Any]:
    """Evaluate on the val slice; ``score`` is ``metric``'s mean over every question, failed ones as 0.

    Raises:
        RagsuiteError: when no question could be scored (the first error is quoted).
    """
    from ragsuite.cli.args import answer_style, show_progress
    from ragsuite.evaluation import evaluate

    result = evaluate(
        program, examples, dataset=answer_style(args), threads=args.threads, progress=show_progress(args)
    )
    if not result.n:
        first = next((r["error"] for r in result.records if r.get("error")), None)
        reason = f"{first['type']}: {first['message']}" if first else result.stopped or "no record"
        raise RagsuiteError(
            f"none of the {len(examples)} val examples could be scored for {label} ({reason}); "
            "check the LM (--lm, --api-base) and the retriever, or pass --no-eval to skip scoring"
        )
    errors = len(examples) - result.n
    return {
        "score": result.metrics[metric] * result.n / len(examples),
        "metric": metric,
        "metrics": result.metrics,
        "cost": result.cost,
        "n": result.n,
        "errors": errors,
    }
