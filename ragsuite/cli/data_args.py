"""Which questions and which corpus a command uses: ``--dataset``, ``--questions``, ``--corpus``, ``--task``.

One place for the data-selection flags of ``eval``, ``compile``, ``tune``, ``index`` and ``retrieve-eval``,
and for the hold-out bookkeeping: ``compile`` and ``tune`` record the ids of the examples they trained and
validated on in the program file, and ``eval --program-file`` leaves those examples out.

A named ``--dataset`` supplies questions (``<split>.jsonl``), corpus and metrics. ``--questions FILE`` and
``--corpus FILE`` replace the dataset's questions or corpus; ``--dataset`` then only names the answer style
and metrics, or ``--task short|long|yesno`` does when no dataset is named (default ``short``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragsuite.errors import ConfigError

TASKS = ("short", "long", "yesno")
#: The program-file metadata key under which compile/tune record the examples they saw.
HOLDOUT_KEY = "holdout"


def add_data_arguments(
    parser: argparse.ArgumentParser,
    *,
    questions: bool = True,
    task: bool = True,
    corpus: bool = True,
    split: bool = True,
    dataset_help: str = "dataset name: its questions, corpus and metrics",
) -> None:
    """Add ``--dataset``, ``--task``, ``--questions``, ``--corpus``, ``--split`` and ``--data-dir``.

    Args:
        parser: The command's parser.
        questions: Whether the command reads questions (``--questions``).
        task: Whether it scores answers (``--task``, with ``questions``).
        corpus: Whether the command indexes a corpus (``--corpus``).
        split: Whether the command reads a dataset split (``--split``).
        dataset_help: Help text of ``--dataset`` for this command.
    """
    group = parser.add_argument_group("data")
    from ragsuite.cli.help_text import dataset_choices

    group.add_argument("--dataset", help=f"{dataset_help} ({dataset_choices()})")
    if questions:
        group.add_argument(
            "--questions",
            type=Path,
            metavar="FILE",
            help="your own questions: JSONL, CSV or Parquet with question, answers [, id, gold_passage_ids, "
            "type]; replaces the dataset's split",
        )
    if questions and task:
        group.add_argument(
            "--task",
            choices=TASKS,
            help="answer style and metrics of --questions when no --dataset is named (default short)",
        )
    if corpus:
        group.add_argument(
            "--corpus",
            type=Path,
            metavar="FILE",
            help="your own corpus: JSONL, TSV or Parquet with id, title, text; the retriever indexes it",
        )
    if split:
        group.add_argument("--split", default="dev", help="split file <split>.jsonl to read (default dev)")
    group.add_argument(
        "--data-dir", help="datasets folder (default $RAGSUITE_DATA, else ~/.cache/ragsuite/data)"
    )


def answer_style(args: argparse.Namespace) -> str:
    """The name that picks the metrics: ``--dataset``, else ``--task`` (default ``short``).

    Raises:
        ConfigError: when neither questions nor a dataset are given, or ``--task`` contradicts ``--dataset``.
    """
    from ragsuite.data.datasets import get_dataset_info

    task = getattr(args, "task", None)
    if args.dataset:
        info = get_dataset_info(args.dataset)
        if task and task != info.task:
            raise ConfigError(
                f"--task {task} contradicts --dataset {args.dataset} (a {info.task} dataset); --task applies "
                "only to --questions without --dataset"
            )
        return info.name
    if getattr(args, "questions", None) is None and getattr(args, "corpus", None) is None:
        raise ConfigError("say which data to use: --dataset NAME, or --questions FILE (and --corpus FILE)")
    return task or "short"


def examples_from_args(args: argparse.Namespace) -> list[Any]:
    """The questions: ``--questions FILE``, else ``--dataset``'s ``--split``.

    Raises:
        ConfigError: when neither is given.
    """
    from ragsuite.data.datasets import load_dataset, load_examples_file

    if getattr(args, "questions", None) is not None:
        return load_examples_file(args.questions)
    if not args.dataset:
        raise ConfigError("give --dataset NAME or --questions FILE")
    return load_dataset(args.dataset, split=getattr(args, "split", "dev"), data_dir=args.data_dir)


def retriever_from_args(args: argparse.Namespace, spec: str, **options: Any) -> Any:
    """The retriever ``spec`` names over ``--corpus`` or the dataset's corpus; ``None`` for ``none``.

    ``options`` go to the retriever's constructor. Index builds show a progress bar on a terminal unless
    ``--no-progress`` was given."""
    if spec == "none":
        return None
    from ragsuite.retrieval.spec import build_retriever

    options.setdefault("progress", show_progress(args))
    return build_retriever(
        spec,
        dataset=args.dataset,
        corpus=getattr(args, "corpus", None),
        data_dir=args.data_dir,
        cache_dir=getattr(args, "cache_dir", None),
        **options,
    )


def show_progress(args: argparse.Namespace) -> bool:
    """Progress bars go to a terminal only, and never under ``--no-progress``."""
    return sys.stderr.isatty() and not getattr(args, "no_progress", False)


def data_source(args: argparse.Namespace) -> dict[str, Any]:
    """Where the questions came from, for manifests and program files (paths absolute, files hashed)."""
    from ragsuite.data.datasets import file_sha256

    source: dict[str, Any] = {"dataset": args.dataset, "task": answer_style(args)}
    questions = getattr(args, "questions", None)
    if questions is not None:
        path = Path(questions).expanduser().resolve()
        source.update(questions=str(path), questions_sha256=file_sha256(path))
    else:
        source["split"] = getattr(args, "split", "dev")
    return source


def holdout_metadata(args: argparse.Namespace, *, train: Sequence[Any], val: Sequence[Any]) -> dict[str, Any]:
    """``{"holdout": ...}`` for a program file: the source and ids of the examples optimization saw."""
    from ragsuite.evaluation import example_id

    return {
        HOLDOUT_KEY: {
            **data_source(args),
            "split_seed": getattr(args, "split_seed", None),
            "train_ids": [example_id(ex, i) for i, ex in enumerate(train)],
            "val_ids": [example_id(ex, i) for i, ex in enumerate(val)],
        }
    }


def exclude_holdout(program: Any, examples: Sequence[Any], *, allow_overlap: bool) -> tuple[list[Any], int]:
    """Leave out the examples ``program`` was compiled or tuned on (recorded by :func:`holdout_metadata`).

    Returns:
        The examples to evaluate and how many were left out (0 with ``allow_overlap``; then a note says how
        many overlap).
    """
    from ragsuite.evaluation import example_id

    holdout = (getattr(program, "optimization", None) or {}).get(HOLDOUT_KEY) or {}
    seen = {str(i) for i in [*(holdout.get("train_ids") or []), *(holdout.get("val_ids") or [])]}
    if not seen:
        return list(examples), 0
    kept = [ex for i, ex in enumerate(examples) if example_id(ex, i) not in seen]
    overlap = len(examples) - len(kept)
    if allow_overlap:
        if overlap:
            print(
                f"note: {overlap} of {len(examples)} examples were used to compile/tune this program "
                "(--allow-overlap keeps them; scores on them are not held-out scores)",
                file=sys.stderr,
            )
        return list(examples), 0
    if overlap:
        print(
            f"excluded {overlap} of {len(examples)} examples the program was compiled/tuned on "
            "(--allow-overlap keeps them)",
            file=sys.stderr,
        )
    if not kept:
        raise ConfigError(
            f"all {len(examples)} examples were used to compile/tune this program, so none is held out; "
            "evaluate on other examples (a larger --limit, another --split or --questions) or pass "
            "--allow-overlap"
        )
    return kept, overlap
