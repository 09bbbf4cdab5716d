"""``ragsuite classifier train``: Adaptive-RAG's query-complexity classifier from three eval runs.

Run the three strategies on the same training questions with ``ragsuite eval`` (``no-retrieval``,
``vanilla`` and ``ircot``), then train on the labels their records imply (see
:mod:`ragsuite.programs.complexity`) and use it with ``ragsuite eval --program adaptive-rag --set
classifier=DIR``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

from ragsuite.errors import ConfigError

#: Datasets whose questions need several hops: unanswered questions there are labelled C, elsewhere B.
MULTI_HOP_DATASETS = frozenset({"hotpotqa", "2wikimultihopqa", "musique"})
STRATEGIES = ("no_retrieval", "single_step", "multi_step")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "classifier",
        help="train Adaptive-RAG's query-complexity classifier from eval runs",
        description="Adaptive-RAG's query-complexity classifier (A: no retrieval, B: single-step, C: "
        "multi-step), trained on labels from three eval runs over the same questions.",
    )
    commands = parser.add_subparsers(dest="classifier_command", metavar="COMMAND", required=True)
    train = commands.add_parser(
        "train",
        help="label questions from three runs and train the classifier",
        description="Label each question with the simplest strategy that answered it correctly (A no "
        "retrieval, B single-step, C multi-step; unanswered: B on single-hop datasets, C on multi-hop ones), "
        "train the classifier and save it to --out. Use it with `ragsuite eval --program adaptive-rag --set "
        "classifier=DIR`.",
    )
    for strategy, example in zip(STRATEGIES, ("no-retrieval", "vanilla", "ircot"), strict=True):
        train.add_argument(
            f"--{strategy.replace('_', '-')}",
            required=True,
            type=Path,
            metavar="RUN_DIR",
            help=f"eval run of the {strategy.replace('_', '-')} strategy (e.g. --program {example})",
        )
    train.add_argument("--out", required=True, type=Path, help="directory to save the classifier in")
    train.add_argument(
        "--metric", help="record metric that says an answer is correct (default: the dataset's main metric)"
    )
    train.add_argument(
        "--correct-at", type=float, default=1.0, help="metric value counted as correct (default 1.0)"
    )
    train.add_argument(
        "--hops",
        choices=("single", "multi"),
        help="the dataset's inductive bias for unanswered questions (default: from the runs' dataset)",
    )
    train.add_argument(
        "--model",
        default="hashed",
        metavar="NAME",
        help="'hashed' (default: logistic regression over hashed n-grams, NumPy, seconds on a CPU) or a "
        "checkpoint to fine-tune as a sequence classifier, as the paper fine-tunes T5-Large: a local "
        "directory or a Hugging Face Hub name such as google-t5/t5-large (needs the train extra)",
    )
    train.add_argument(
        "--epochs", type=int, help="passes over the questions (default: 200 for hashed, 3 for a checkpoint)"
    )
    train.add_argument(
        "--learning-rate", type=float, help="step size (default: 0.5 for hashed, 3e-5 for a checkpoint)"
    )
    train.add_argument("--batch-size", type=int, default=16, help="questions per step of a checkpoint (16)")
    train.add_argument(
        "--holdout", type=float, default=0.2, help="share of labelled questions held out to report accuracy"
    )
    train.add_argument(
        "--seed", type=int, default=0, help="seed of the hold-out split and of fine-tuning (default 0)"
    )
    train.add_argument("--json", action="store_true", help="print the training report as JSON")
    train.set_defaults(func=run_train)


def _run(directory: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """A run's manifest and usable records; a run with none is refused."""
    from ragsuite.evaluation import MANIFEST, RECORDS, read_records

    records_path = directory / RECORDS
    if not records_path.is_file():
        raise ConfigError(
            f"{directory} is not an eval run (no {RECORDS}); run `ragsuite eval --out {directory}`"
        )
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{directory / MANIFEST} cannot be read ({exc})") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("dataset"), (str, type(None))):
        raise ConfigError(
            f"{directory / MANIFEST} is not an eval run's manifest (a JSON object naming its dataset); "
            "pass the directory `ragsuite eval --out` wrote"
        )
    log = read_records(records_path)
    for problem in log.problems:
        print(f"warning: {problem}; skipped", file=sys.stderr)  # stdout may be --json
    return manifest, log.records


def label_runs(
    runs: dict[str, Path], *, metric: str | None, correct_at: float, hops: str | None
) -> tuple[list[str], list[str], dict[str, Any]]:
    """Questions and labels from the three strategies' runs, and counts of how each label arose."""
    from ragsuite.data.datasets import DATASETS
    from ragsuite.programs.complexity import complexity_label

    loaded = {strategy: _run(path) for strategy, path in runs.items()}
    datasets = {manifest.get("dataset") for manifest, _ in loaded.values()}
    if len(datasets) != 1:
        raise ConfigError(f"the runs are on different datasets ({sorted(map(str, datasets))}); use one")
    dataset = datasets.pop()
    if metric is None:
        if dataset not in DATASETS:
            raise ConfigError(f"dataset {dataset!r} has no main metric; pass --metric")
        metric = DATASETS[dataset].primary_metric
    if hops is None:
        if dataset not in DATASETS:
            raise ConfigError(f"dataset {dataset!r} is not a known one; pass --hops single|multi")
        hops = "multi" if dataset in MULTI_HOP_DATASETS else "single"
    shared = set.intersection(*(set(records) for _, records in loaded.values()))
    if not shared:
        raise ConfigError("the three runs share no question ids; run them on the same questions")

    def correct(record: dict[str, Any]) -> bool:
        if record.get("error"):  # a failed run of a strategy did not answer
            return False
        if metric not in record["metrics"]:
            raise ConfigError(f"record {record['id']!r} has no metric {metric!r}; pass --metric")
        return float(record["metrics"][metric]) >= correct_at

    questions: list[str] = []
    labels: list[str] = []
    by_bias = 0
    for question_id in sorted(shared):
        outcome = {strategy: correct(records[question_id]) for strategy, (_, records) in loaded.items()}
        labels.append(complexity_label(**outcome, multi_hop=hops == "multi"))
        by_bias += not any(outcome.values())
        questions.append(str(loaded["no_retrieval"][1][question_id].get("question", "")))
    counts = {
        "dataset": dataset,
        "metric": metric,
        "hops": hops,
        "questions": len(shared),
        "not_in_every_run": len(set.union(*(set(r) for _, r in loaded.values()))) - len(shared),
        "labelled_by_dataset_bias": by_bias,
    }
    return questions, labels, counts


def run_train(args: argparse.Namespace) -> int:
    from ragsuite.programs.complexity import (
        COMPLEXITY_LABELS,
        ComplexityClassifier,
        TransformerComplexityClassifier,
    )

    if not 0 <= args.holdout < 1:
        raise ConfigError(f"--holdout must be in [0, 1), not {args.holdout}")
    if args.out.exists() and not args.out.is_dir():  # checked before training, not after
        raise ConfigError(
            f"--out {args.out} is a file; the classifier is saved as a directory: choose another path"
        )
    runs = {strategy: getattr(args, strategy) for strategy in STRATEGIES}
    questions, labels, report = label_runs(
        runs, metric=args.metric, correct_at=args.correct_at, hops=args.hops
    )
    order = list(range(len(questions)))
    random.Random(args.seed).shuffle(order)
    held = set(order[: int(len(order) * args.holdout)])
    train_q = [q for i, q in enumerate(questions) if i not in held]
    train_y = [y for i, y in enumerate(labels) if i not in held]
    if not train_q:
        raise ConfigError("no questions left to train on; lower --holdout or evaluate more questions")
    settings = {k: v for k, v in (("epochs", args.epochs), ("learning_rate", args.learning_rate)) if v}
    if args.model == "hashed":
        classifier = ComplexityClassifier().fit(train_q, train_y, **settings)
    else:
        classifier = TransformerComplexityClassifier(args.model, seed=args.seed).fit(
            train_q, train_y, batch_size=args.batch_size, seed=args.seed, **settings
        )
    held_q = [questions[i] for i in sorted(held)]
    held_y = [labels[i] for i in sorted(held)]
    held_accuracy = classifier.accuracy(held_q, held_y)
    majority = max(COMPLEXITY_LABELS, key=train_y.count)
    report.update(
        labels={label: labels.count(label) for label in COMPLEXITY_LABELS},
        train=len(train_q),
        holdout=len(held_q),
        train_accuracy=classifier.training["train_accuracy"],
        holdout_accuracy=held_accuracy,
        holdout_majority_accuracy=(sum(y == majority for y in held_y) / len(held_y)) if held_y else None,
    )
    classifier.training.update({k: report[k] for k in ("dataset", "metric", "hops", "holdout_accuracy")})
    try:
        classifier.save(args.out)
    except OSError as exc:
        raise ConfigError(
            f"cannot save the classifier to {args.out} ({exc}); choose a writable --out"
        ) from exc
    if args.json:
        print(json.dumps(report, indent=2))
        return 0

    def pct(value: float | None) -> str:
        return "–" if value is None else f"{100 * value:.1f}%"

    print(
        f"labelled {report['questions']} questions of {report['dataset']} by {report['metric']} >= "
        f"{args.correct_at}: "
        + ", ".join(f"{k} {v}" for k, v in report["labels"].items())
        + f" ({report['labelled_by_dataset_bias']} unanswered, labelled by the {report['hops']}-hop bias)"
    )
    print(
        f"trained on {report['train']}: train accuracy {pct(report['train_accuracy'])}; held out "
        f"{report['holdout']}: accuracy {pct(held_accuracy)} (always {majority}: "
        f"{pct(report['holdout_majority_accuracy'])})"
    )
    print(
        f"saved to {args.out}; use it with: ragsuite eval --program adaptive-rag --set classifier={args.out}"
    )
    return 0
