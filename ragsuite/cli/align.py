"""``ragsuite align``: build DeepNote's DNAlign preference pairs for a program's stages, and DPO-train a model
on them (:mod:`ragsuite.align`).

Example:
    ragsuite align build --program deepnote --dataset 2wikimultihopqa --split train --samples 15000 \\
        --lm vllm:meta-llama/Llama-3.1-8B-Instruct --judge-lm openai/gpt-4o-mini --out runs/dnalign
    ragsuite align train runs/dnalign --model meta-llama/Llama-3.1-8B-Instruct --out models/llama-dnalign
"""

from __future__ import annotations

import argparse
import hashlib
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from ragsuite.errors import ConfigError, DataError, Terminated

# The programs with a preference-pair recipe (the keys of ragsuite.align.builder.RECIPES), named here so that
# ``--help`` need not import the builder (and dspy); tests/cli/test_cli_startup.py keeps the two equal.
RECIPE_PROGRAMS = ("deepnote", "adaptive-note", "hanrag", "hanrag-oracle")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "align",
        help="build stage preference pairs (DeepNote's DNAlign) and DPO-train a model on them",
        description="Build chosen/rejected pairs for a program's stages from training questions (DeepNote "
        "Appendix D), then train a model on them with DPO (TRL; the train extra).",
    )
    actions = parser.add_subparsers(dest="align_command", metavar="ACTION")
    _register_build(actions)
    _register_train(actions)
    parser.set_defaults(func=lambda args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _register_build(actions: argparse._SubParsersAction) -> None:
    from ragsuite.cli.args import add_data_arguments, add_lm_arguments
    from ragsuite.cli.help_text import add_stage_argument
    from ragsuite.retrieval.spec import SPEC_HELP as RETRIEVER_HELP

    build = actions.add_parser(
        "build",
        help="sample a program's stages on training questions and build preference pairs (resumable)",
        description="For each sampled question, run the program's stages under nine (temperature, top_p) "
        "settings and build one chosen/rejected pair per stage: the judge LM picks the best and worst notes "
        "and query sets, NoteCompare labels note updates, the task metric labels vanilla-RAG answers "
        "(DeepNote Appendix D). The nine settings replace --temperature/--top-p for the sampled stages. "
        "Records are saved as each question finishes; rerunning resumes. Writes OUT/train.jsonl in TRL's "
        "preference format.",
    )
    build.add_argument("--program", help=f"program with a pair recipe: {', '.join(RECIPE_PROGRAMS)}")
    build.add_argument(
        "--program-file", type=Path, help="a compiled program (its prompts and demos are the ones sampled)"
    )
    add_data_arguments(build)
    for action in build._actions:
        if action.dest == "split":
            action.default = "train"
            action.help = "split file <split>.jsonl to read (default train: pairs need training questions)"
    build.add_argument(
        "--samples", type=int, help="questions drawn at random from the split (the paper: 15000; default all)"
    )
    build.add_argument(
        "--counts",
        metavar="STAGE=N,...",
        help="pairs kept per stage, e.g. note_init=1900,query_refine=1900,note_update=1900,answer=300 "
        "(DeepNote's defaults; 'all' keeps every pair; stages not named keep their default)",
    )
    build.add_argument(
        "--top-k",
        default="3,5,7",
        metavar="K,K,...",
        help="top-k values, one drawn per question (default 3,5,7, the paper's)",
    )
    build.add_argument("--threads", type=int, default=4, help="questions built at once (default 4)")
    build.add_argument(
        "--set", action="append", default=[], metavar="KNOB=VALUE", help="override a knob (repeatable)"
    )
    add_stage_argument(build)
    build.add_argument("--retriever", default=None, help=RETRIEVER_HELP)
    build.add_argument("--max-errors", type=int, help="stop cleanly after N failed questions")
    build.add_argument("--seed", type=int, default=0, help="question sample, draws and LM seed (default 0)")
    build.add_argument("--cache-dir", help="where retrieval indexes are kept (default $RAGSUITE_CACHE)")
    build.add_argument(
        "--no-progress", action="store_true", help="no progress bar (shown on a terminal only)"
    )
    build.add_argument("--out", required=True, type=Path, help="build directory (created; reused to resume)")
    add_lm_arguments(build)
    for action in build._actions:
        if action.dest == "max_tokens":
            action.help = "completion budget per sampled reply (default 1024, the official data script's)"
    judge = build.add_argument_group("judge LM (judges notes and queries, runs NoteCompare)")
    judge.add_argument(
        "--judge-lm",
        metavar="SPEC",
        help="e.g. openai/gpt-4o-mini (the paper's); needed by deepnote's recipe",
    )
    judge.add_argument("--judge-api-base", metavar="URL", help="the judge's OpenAI-compatible server, if any")
    judge.add_argument("--judge-api-key-env", metavar="NAME", help="environment variable holding its key")
    # The official data script's judge call (utils.call_gpt): temperature 1, top_p 0.9, 1280 tokens.
    judge.add_argument(
        "--judge-temperature",
        type=float,
        default=1.0,
        help="the judge's temperature (default 1.0, the script's)",
    )
    judge.add_argument("--judge-top-p", type=float, default=0.9, help="the judge's top_p (default 0.9)")
    judge.add_argument(
        "--judge-max-tokens", type=int, default=1280, help="the judge's reply budget (default 1280)"
    )
    build.set_defaults(func=run_build)


def _register_train(actions: argparse._SubParsersAction) -> None:
    from ragsuite.align.trainer import FULL_LEARNING_RATE, LORA_LEARNING_RATE, DPOSettings

    defaults = DPOSettings()
    train = actions.add_parser(
        "train",
        help="DPO-train a model on an align build's pairs (needs the train extra)",
        description="Train MODEL with DPO (TRL's DPOTrainer) on DIR/train.jsonl with the paper's settings "
        "(lr 5e-7, beta 0.1, 1 epoch, batch 8; float32 weights, bf16 autocast on a GPU that has it), save it "
        "to --out, ready for `ragsuite serve --model OUT`. "
        "Needs: pip install -e '.[train]'.",
    )
    train.add_argument(
        "data", type=Path, metavar="DIR", help="an `align build` directory, or a TRL JSONL file"
    )
    train.add_argument("--model", required=True, help="model name or path (a chat/instruct model)")
    train.add_argument("--out", required=True, type=Path, help="where to save the trained model")
    train.add_argument(
        "--learning-rate",
        type=float,
        default=None,
        help=f"default {FULL_LEARNING_RATE:g} (the paper's), {LORA_LEARNING_RATE:g} with --lora",
    )
    train.add_argument("--beta", type=float, default=defaults.beta, help="DPO beta (default 0.1)")
    train.add_argument("--epochs", type=float, default=defaults.epochs, help="default 1")
    train.add_argument(
        "--batch-size", type=int, default=defaults.batch_size, help="effective batch (default 8)"
    )
    train.add_argument(
        "--per-device-batch-size", type=int, default=defaults.per_device_batch_size, help="default 1"
    )
    train.add_argument(
        "--max-length", type=int, default=defaults.max_length, help="max prompt+reply tokens (default 8192)"
    )
    train.add_argument("--max-steps", type=int, default=-1, help="stop after N optimizer steps")
    train.add_argument("--stages", help="train on these stages only, comma-separated (default all)")
    train.add_argument(
        "--lora", action="store_true", help="train a LoRA adapter (peft) instead of all weights"
    )
    train.add_argument("--lora-r", type=int, default=defaults.lora_r, help="LoRA rank (default 16)")
    train.add_argument("--lora-alpha", type=int, default=defaults.lora_alpha, help="LoRA alpha (default 32)")
    train.add_argument(
        "--no-merge", action="store_true", help="save the LoRA adapter alone instead of the merged model"
    )
    train.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compute in bfloat16 (autocast) over float32 weights; default: when the GPU supports it",
    )
    train.add_argument("--gradient-checkpointing", action="store_true", help="less memory, more compute")
    train.add_argument("--seed", type=int, default=0, help="training seed (default 0)")
    train.set_defaults(func=run_train)


# ---------------------------------------------------------------------------- build
def available_splits(dataset: str, data_dir: str | None) -> list[str]:
    """The question splits installed for ``dataset`` (``<split>.jsonl`` files other than the corpus)."""
    from ragsuite.data.datasets import get_dataset_info, resolve_data_dir

    folder = resolve_data_dir(data_dir) / get_dataset_info(dataset).name
    return sorted(p.stem for p in folder.glob("*.jsonl") if p.name != "corpus.jsonl")


def training_examples(args: argparse.Namespace) -> list[Any]:
    """``--questions FILE``, else the dataset's ``--split``; a split that is not installed is an error that
    names the installed ones and how to get training questions."""
    from ragsuite.cli.args import examples_from_args

    if args.questions is not None or not args.dataset:
        return examples_from_args(args)
    splits = available_splits(args.dataset, args.data_dir)
    if args.split not in splits:
        get = (
            f"`ragsuite data download {args.dataset} --subset train --corpus none` installs "
            "2WikiMultihopQA's train questions (the paper's source; the ircot corpus already holds "
            "their passages)"
            if args.dataset == "2wikimultihopqa"
            else "convert the dataset's train file with `ragsuite data convert` into the data dir"
        )
        raise ConfigError(
            f"{args.dataset} has no {args.split!r} split installed "
            f"(installed: {', '.join(splits) or 'none'}). "
            f"{get}, or pass your own training questions with --questions FILE. Building pairs from the "
            "dev/test questions you evaluate on would leak them into training."
        )
    try:
        return examples_from_args(args)
    except DataError as exc:
        raise ConfigError(str(exc)) from None


def _top_ks(text: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ConfigError(f"--top-k expects integers separated by commas, not {text!r}") from None
    if not values or any(k < 1 for k in values):
        raise ConfigError(f"--top-k values must be integers >= 1, not {text!r}")
    return values


def _judge_lm(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    from ragsuite.cli.args import local_options
    from ragsuite.lm import build_lm, check_endpoint, parse_lm_spec, redact, resolve_endpoint

    local = local_options(args)
    parsed = parse_lm_spec(
        args.judge_lm, api_base=args.judge_api_base, api_key_env=args.judge_api_key_env, local_options=local
    )
    parsed = resolve_endpoint(parsed)  # the local LM's server starts here, once
    lm = build_lm(
        parsed,
        temperature=args.judge_temperature,
        top_p=args.judge_top_p,
        max_tokens=args.judge_max_tokens,
        timeout=args.timeout,
        retries=args.retries,
        cache=not args.no_cache,
        seed=args.seed,
        max_retry_wait=args.max_retry_wait,
    )
    check_endpoint(parsed, timeout=min(args.timeout or 10.0, 10.0))
    public = {
        "spec": redact(args.judge_lm),
        **parsed.public(),
        "temperature": args.judge_temperature,
        "top_p": args.judge_top_p,
        "max_tokens": args.judge_max_tokens,
    }
    return lm, public


def run_build(args: argparse.Namespace) -> int:
    """Build; SIGTERM stops like Ctrl-C (finished questions kept, summary written on the next run)."""
    on_term = signal.getsignal(signal.SIGTERM)
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return _build(args)
    except KeyboardInterrupt as exc:
        print(
            f"stopped: the finished questions are kept in {args.out / 'records.jsonl'}; rerun the same "
            "command to finish the build",
            file=sys.stderr,
        )
        return 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, on_term)


#: Tokens each sampled stage reply may take (the official data script's ``max_tokens``).
GENERATION_MAX_TOKENS = 1024


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


def _build(args: argparse.Namespace) -> int:
    import dspy

    from ragsuite import __version__
    from ragsuite.align.builder import (
        build_preferences,
        default_build_manifest,
        format_build_table,
        recipe_for,
        sample_questions,
    )
    from ragsuite.align.pairs import parse_counts
    from ragsuite.cli.args import answer_style, build_lms, build_program, data_source, show_progress
    from ragsuite.data.datasets import get_dataset_info
    from ragsuite.evaluation import example_id, git_revision, package_versions
    from ragsuite.lm import set_stage_lms

    if args.threads < 1:
        raise ConfigError("--threads must be >= 1")
    top_ks = _top_ks(args.top_k)
    style = answer_style(args)
    info = get_dataset_info(style)
    examples = sample_questions(training_examples(args), args.samples, seed=args.seed)
    program, retriever_description = build_program(args, info.task)
    recipe = recipe_for(program.name)
    if recipe.USES_JUDGE and not args.judge_lm:
        raise ConfigError(
            f"the {program.name} recipe needs a judge LM: pass --judge-lm SPEC "
            "(the paper: openai/gpt-4o-mini)"
        )
    if args.max_tokens is None:
        args.max_tokens = GENERATION_MAX_TOKENS  # the data script's, not the program's inference budget
    main_lm, stage_lms, lm_public = build_lms(args)
    judge_lm, judge_public = _judge_lm(args) if args.judge_lm else (None, None)
    if stage_lms:
        set_stage_lms(program, stage_lms)
    counts: dict[str, int | None] = {stage: recipe.DEFAULT_COUNTS.get(stage) for stage in recipe.STAGES}
    counts.update(parse_counts(args.counts, recipe.STAGES))
    from ragsuite.align.builder import SAMPLING_GRID

    ids = [example_id(ex, i) for i, ex in enumerate(examples)]
    manifest = {
        **default_build_manifest(program, recipe, style, ids, SAMPLING_GRID, top_ks, args.seed),
        **lm_public,
        "judge_lm": judge_public,
        "program_file": str(args.program_file) if args.program_file else None,
        "program_file_sha256": hashlib.sha256(args.program_file.read_bytes()).hexdigest()
        if args.program_file
        else None,
        "split": args.split if args.questions is None else data_source(args),
        "samples": args.samples,
        "retriever": retriever_description,
        "versions": package_versions(),
        "ragsuite_version": __version__,
        "git": git_revision(),
    }
    with dspy.context(lm=main_lm):
        result = build_preferences(
            program,
            examples,
            dataset=style,
            judge_lm=judge_lm,
            out_dir=args.out,
            recipe=recipe,
            top_ks=top_ks,
            counts=counts,
            seed=args.seed,
            threads=args.threads,
            progress=show_progress(args),
            manifest=manifest,
            max_errors=args.max_errors,
        )
    summary = result.summary
    print(format_build_table(summary))
    cost = summary["cost"]
    print(
        f"\n{summary['questions']} of {summary['total']} questions built, {summary['errors']} failed; "
        f"LM calls {cost['lm_calls']} (requests {cost['lm_requests']}, cache hits {cost['cache_hits']}), "
        f"tokens in {cost['input_tokens']} out {cost['output_tokens']}, unparsable replies "
        f"{cost['unparsable_replies']}"
    )
    print(
        f"pairs: {result.train_file}  records: {args.out / 'records.jsonl'}  "
        f"summary: {args.out / 'summary.json'}"
    )
    for line in summary["short_of_counts"]:
        print(f"warning: fewer pairs than asked: {line}", file=sys.stderr)
    if summary.get("stopped"):
        print(f"stopped early: {summary['stopped']}", file=sys.stderr)
        return 1
    if result.errors:
        print(f"{result.errors} question(s) failed; rerun the same command to retry them", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------- train
def run_train(args: argparse.Namespace) -> int:
    from ragsuite.align.trainer import DPOSettings, require_train_extra, train_dpo

    require_train_extra(lora=args.lora)  # before reading anything: say what to install first
    settings = DPOSettings(
        learning_rate=args.learning_rate,
        beta=args.beta,
        epochs=args.epochs,
        batch_size=args.batch_size,
        per_device_batch_size=args.per_device_batch_size,
        max_length=args.max_length,
        lora=args.lora,
        lora_r=args.lora_r,
        lora_alpha=args.lora_alpha,
        merge_lora=not args.no_merge,
        bf16=args.bf16,
        gradient_checkpointing=args.gradient_checkpointing,
        max_steps=args.max_steps,
        seed=args.seed,
    )
    stages = [s.strip() for s in args.stages.split(",") if s.strip()] if args.stages else None
    result = train_dpo(args.data, model=args.model, out=args.out, settings=settings, stages=stages)
    first = f"{result.losses[0]:.4f}" if result.losses else "–"
    last = f"{result.losses[-1]:.4f}" if result.losses else "–"
    print(f"trained on {result.pairs} pairs, {result.steps} steps; DPO loss {first} -> {last}")
    print(f"model: {result.out_dir}")
    if args.lora and args.no_merge:
        print("the LoRA adapter was saved alone; merge it into the base model before serving with vLLM")
    else:
        print(f"serve it: ragsuite serve --model {result.out_dir}")
    return 0
