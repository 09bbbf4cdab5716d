"""``ragsuite eval``: evaluate a program on a dataset with a real LM, resumably (:mod:`ragsuite.evaluation`).

Example:
    ragsuite eval --program deepnote --dataset hotpotqa --lm openai/gpt-4o-mini --limit 200 --threads 16 \\
        --out runs/deepnote-hotpotqa
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from ragsuite.aio import DEFAULT_ENGINE, ENGINES
from ragsuite.cli.args import add_data_arguments, add_lm_arguments, build_lms, build_program
from ragsuite.cli.help_text import add_stage_argument, program_choices, programs_epilog
from ragsuite.errors import ConfigError, Terminated

log = logging.getLogger("ragsuite.cli.eval")
#: Where ``--compare-uncompiled`` runs the program file without its demos, inside the run's folder.
UNCOMPILED = "uncompiled"


def register(subparsers: argparse._SubParsersAction) -> None:
    from ragsuite.retrieval.spec import SPEC_HELP as RETRIEVER_HELP

    parser = subparsers.add_parser(
        "eval",
        help="evaluate a program on a dataset (parallel, resumable)",
        description="Evaluate a program on a dataset with an LM. Records are saved as each example finishes; "
        "rerunning the same command resumes.",
        epilog=programs_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--program", help=f"program name: {program_choices()}; optional with --program-file")
    parser.add_argument(
        "--program-file",
        type=Path,
        help="a compiled program saved with program.save(); its retriever is rebuilt for "
        "--dataset/--data-dir (or --corpus) and it answers in that dataset's style (differences from the "
        "file are logged)",
    )
    add_data_arguments(parser)
    parser.add_argument(
        "--allow-overlap",
        action="store_true",
        help="keep examples the --program-file was compiled/tuned on (left out by default)",
    )
    parser.add_argument(
        "--compare-uncompiled",
        action="store_true",
        help="with --program-file: also run the file's program without its demos on the same examples (into "
        "OUT/uncompiled), then print both scores and their paired difference",
    )
    parser.add_argument("--limit", type=int, help="evaluate the first N (held-out) examples")
    parser.add_argument("--threads", type=int, default=8, help="examples run at once (default 8)")
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default=DEFAULT_ENGINE,
        help=f"run examples at once on worker threads (program(...)) or on one event loop (await "
        f"program.acall(...)); records and resuming are the same (default {DEFAULT_ENGINE})",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KNOB=VALUE", help="override a knob (repeatable)"
    )
    add_stage_argument(parser)
    parser.add_argument("--retriever", default=None, help=RETRIEVER_HELP + "; 'none' for no retriever")
    parser.add_argument("--max-errors", type=int, help="stop cleanly after N failed examples")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed sent to the LM (default 0)")
    parser.add_argument("--cache-dir", help="where retrieval indexes are kept (default $RAGSUITE_CACHE)")
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bars (they show on a terminal only)"
    )
    parser.add_argument("--out", required=True, type=Path, help="run directory (created; reused to resume)")
    parser.add_argument("--html", type=Path, metavar="OUT.html", help="also write the run's HTML report")
    from ragsuite.cli.mlflow_tracking import add_mlflow_argument

    add_mlflow_argument(parser)
    add_lm_arguments(parser)
    parser.set_defaults(func=run)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(args: argparse.Namespace) -> int:
    """Evaluate; SIGTERM stops the run as Ctrl-C does (finished records kept, summary written)."""
    on_term = signal.getsignal(signal.SIGTERM)
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return _run(args)
    except Terminated:
        print("terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, on_term)


def _run_params(manifest: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The run's parameters for MLflow: the manifest's settings (LMs with endpoints stripped of credentials,
    knobs as ``knob.NAME``), without package versions and example lists."""
    from ragsuite.cli.mlflow_tracking import lm_params

    kept = ("program", "program_file", "dataset", "split", "seed", "limit", "n_examples", "examples_sha256")
    return {
        **{key: manifest.get(key) for key in kept},
        **lm_params(manifest),
        "knob": manifest.get("knobs") or {},
        "retriever": (manifest.get("retriever") or {}).get("spec"),
        "threads": args.threads,
        "ragsuite_version": manifest.get("ragsuite_version"),
    }


def summary_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """A run summary's numbers as MLflow metrics: each dataset metric under its name, ``retrieval_recall``,
    ``cost.*`` (per question), ``n``, ``errors``, ``total`` and ``fallback_share``. A figure that does not
    exist (no scored question) is left out, never logged as 0."""
    from ragsuite.cli.mlflow_tracking import numeric_metrics

    return numeric_metrics(
        {
            **(summary.get("metrics") or {}),
            "retrieval_recall": summary.get("retrieval_recall"),
            "cost": summary.get("cost") or {},
            "n": summary.get("n"),
            "errors": summary.get("errors"),
            "total": summary.get("total"),
            "fallback_share": summary.get("fallback_share"),
        }
    )


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def _run(args: argparse.Namespace) -> int:
    from ragsuite import __version__
    from ragsuite.cli.args import answer_style, data_source, examples_from_args, exclude_holdout
    from ragsuite.data.datasets import get_dataset_info
    from ragsuite.evaluation import example_id, examples_fingerprint, git_revision, package_versions
    from ragsuite.evaluation.manifest import program_artifacts
    from ragsuite.lm import set_stage_lms

    if args.threads < 1:
        raise ConfigError("--threads must be >= 1")
    if args.limit is not None and args.limit < 1:
        raise ConfigError("--limit must be >= 1")
    if args.compare_uncompiled and args.program_file is None:
        raise ConfigError("--compare-uncompiled compares a program file with itself without its demos: give "
                          "--program-file FILE")  # fmt: skip
    if args.mlflow is not None:
        from ragsuite.cli.mlflow_tracking import require_mlflow

        require_mlflow()
    style = answer_style(args)
    info = get_dataset_info(style)
    examples = examples_from_args(args)
    main_lm, stage_lms, lm_public = build_lms(args)
    program, retriever_description = build_program(args, info.task)
    # Held-out examples first, then --limit: the run gets N examples the program has not seen.
    examples, excluded = exclude_holdout(program, examples, allow_overlap=args.allow_overlap)
    if args.limit is not None:
        examples = examples[: args.limit]
    if stage_lms:
        set_stage_lms(program, stage_lms)
    ids = [example_id(ex, i) for i, ex in enumerate(examples)]
    manifest = {
        "program": program.name,
        "program_file": str(args.program_file) if args.program_file else None,
        "program_file_sha256": _sha256(args.program_file) if args.program_file else None,
        "knobs": program.knobs(),
        **program_artifacts(program),
        **lm_public,
        "dataset": style,
        # Your own questions file (path and content hash) stands where the dataset split would.
        "split": args.split if args.questions is None else data_source(args),
        "seed": args.seed,
        "limit": args.limit,
        "retriever": retriever_description,
        "examples_sha256": examples_fingerprint(ids),
        "n_examples": len(ids),
        "holdout_excluded": excluded,
        "versions": package_versions(),
        "ragsuite_version": __version__,
        "git": git_revision(),
    }
    label = program.name + (" (compiled)" if args.compare_uncompiled else "")
    # Each run: its folder, its label in the table, and its result.
    runs = [(args.out, label, _evaluate(args, main_lm, program, examples, style, args.out, manifest, label))]
    if args.compare_uncompiled and not runs[0][2].stopped:
        # The file's run is over: the same program object, without its demos, is the uncompiled program.
        for _, predictor in program.named_predictors():
            predictor.demos = []
        folder, label = args.out / UNCOMPILED, f"{program.name} (no demos)"
        bare = {**manifest, "demos": "removed"}
        runs.append((folder, label, _evaluate(args, main_lm, program, examples, style, folder, bare, label)))
    return _show(runs, args, style)


def _show(runs: list[tuple[Path, str, Any]], args: argparse.Namespace, style: str) -> int:
    """Print the runs' table (and, for two, their paired comparison), where their records are, and their
    warnings; the exit status: 1 when a run stopped early or recorded failed examples."""
    from ragsuite.evaluation import format_table

    print(format_table([{**result.summary, "program": name} for _, name, result in runs]))
    if len(runs) == 2:
        print("\n" + paired_table(runs[0][0], runs[1][0], dataset=style))
    print()
    for folder, _, _ in runs:
        print(f"records: {folder / 'records.jsonl'}  summary: {folder / 'summary.json'}")
    if args.html is not None:
        from ragsuite.evaluation import load_run
        from ragsuite.report_html import write_report

        size = write_report([load_run(folder) for folder, _, _ in runs], args.html)
        print(f"report: {args.html} ({size / 1e6:.2f} MB)")
    code = 0
    for _, _, result in runs:
        for warning in result.summary["warnings"]:
            print(f"warning: {warning}", file=sys.stderr)
        if result.stopped:
            print(f"stopped early: {result.stopped}", file=sys.stderr)
            code = 1
        elif result.errors:
            print(
                f"{result.errors} example(s) failed and were recorded; rerun the same command to retry them",
                file=sys.stderr,
            )
            code = 1
    return code


def _evaluate(
    args: argparse.Namespace,
    lm: Any,
    program: Any,
    examples: list[Any],
    style: str,
    out: Path,
    manifest: dict[str, Any],
    label: str,
) -> Any:
    """One run of ``program`` with ``lm`` into ``out``, tracked in MLflow (as ``label``) when asked."""
    import dspy

    from ragsuite.cli.args import show_progress
    from ragsuite.cli.mlflow_tracking import mlflow_run
    from ragsuite.evaluation import evaluate

    with mlflow_run(args.mlflow, run_name=f"eval {label} {style}", command="eval") as tracking:
        if tracking is not None:
            tracking.log_params(_run_params(manifest, args))
            tracking.set_tags({"ragsuite.out": str(out.resolve())})
        try:
            with dspy.context(lm=lm):
                result = evaluate(
                    program,
                    examples,
                    dataset=style,
                    threads=args.threads,
                    engine=args.engine,
                    out_dir=out,
                    progress=show_progress(args),
                    max_errors=args.max_errors,
                    manifest=manifest,
                )
        except KeyboardInterrupt:
            print(
                f"stopped: the finished examples are kept in {out / 'records.jsonl'} and summarized in "
                f"{out / 'summary.json'}; rerun the same command to finish the run",
                file=sys.stderr,
            )
            raise
        if tracking is not None:
            tracking.log_metrics(summary_metrics(result.summary))
            for artifact in ("summary.json", "manifest.json"):
                tracking.log_artifact(out / artifact, artifact_path="run")
    return result


def paired_table(compiled: Path, uncompiled: Path, *, dataset: str) -> str:
    """The two runs compared on the questions both scored, per metric of the dataset: each mean, the
    difference with its paired 95% bootstrap interval and the sign-flip p-value (as ``ragsuite report
    --paired`` prints it)."""
    from ragsuite.evaluation import load_run
    from ragsuite.evaluation.paired import paired_rows
    from ragsuite.tables import render_table

    rows = [{**load_run(compiled), "program": "compiled"}, {**load_run(uncompiled), "program": "no demos"}]
    header, lines, notes = paired_rows(rows)
    if not lines:
        return "; ".join(notes) or f"no {dataset} question was scored by both runs"
    return render_table(header, lines)
