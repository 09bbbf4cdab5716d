"""``ragsuite retrieve-eval``: recall@k and all-gold@k of a retriever on a dataset's questions; with
``--sweep N``, a search of a hybrid retriever's fusion settings on them (no LM)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from ragsuite.errors import ConfigError

log = logging.getLogger("ragsuite.cli.retrieve_eval")

# Queries per batch call: large enough to amortize, small enough for a live progress bar.
_BATCH = 64


def register(subparsers: argparse._SubParsersAction) -> None:
    from ragsuite.cli.args import add_data_arguments
    from ragsuite.retrieval.spec import SPEC_HELP

    parser = subparsers.add_parser(
        "retrieve-eval",
        help="measure retrieval recall@k / all-gold@k on a dataset",
        description="Retrieve for every question with gold passage ids and report recall@k (mean fraction "
        "of gold passages in the top k) and all_gold@k (share of questions with all gold passages in the "
        "top k).",
    )
    add_data_arguments(
        parser, task=False, dataset_help="dataset whose questions (and, for bm25, corpus) are used"
    )
    parser.add_argument("--retriever", default="bm25", help=SPEC_HELP)
    parser.add_argument("--k", type=int, nargs="+", default=[5, 10], help="cutoffs (default: 5 10)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N questions")
    parser.add_argument("--cache-dir", default=None, help="index cache root (default: $RAGSUITE_CACHE)")
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    parser.add_argument(
        "--sweep",
        type=int,
        default=None,
        metavar="TRIALS",
        help="search a hybrid retriever's fusion weights, rrf_k, norm and depth with Optuna over TRIALS "
        "trials (the first: the settings given) and report the best, with its spec to freeze it",
    )
    parser.add_argument(
        "--sweep-metric",
        default=None,
        help="the sweep's objective, recall@K or all_gold@K (default: recall@<first --k>)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the sweep's sampler seed (default: 0)")
    parser.set_defaults(func=run)


def evaluate_retrieval(
    retriever: Any, examples: Sequence[Any], ks: Sequence[int], *, progress: bool = False
) -> dict[str, float]:
    """Mean ``recall@k`` and ``all_gold@k`` for each k over examples that have gold passage ids.

    Returns:
        ``{"recall@5": ..., "all_gold@5": ..., ..., "n": number of scored examples}``.
    """
    from tqdm.auto import tqdm

    from ragsuite.data.metrics import all_gold, retrieval_recall
    from ragsuite.retrieval.base import ranked_ids

    scored = [ex for ex in examples if list(ex.get("gold_passage_ids") or [])]
    depth = max(ks)
    totals = {f"{name}@{k}": 0.0 for k in ks for name in ("recall", "all_gold")}
    with tqdm(
        total=len(scored), desc="retrieve-eval", unit="q", disable=not progress, file=sys.stderr
    ) as bar:
        for lo in range(0, len(scored), _BATCH):
            chunk = scored[lo : lo + _BATCH]
            rankings = ranked_ids(retriever, [ex.question for ex in chunk], depth)
            for ex, ids in zip(chunk, rankings, strict=True):
                for k in ks:
                    totals[f"recall@{k}"] += retrieval_recall(ids, ex.gold_passage_ids, k)
                    totals[f"all_gold@{k}"] += all_gold(ids, ex.gold_passage_ids, k)
            bar.update(len(chunk))
    n = len(scored)
    metrics: dict[str, float] = {key: (value / n if n else 0.0) for key, value in totals.items()}
    metrics["n"] = n
    return metrics


def run(args: argparse.Namespace) -> int:
    from ragsuite.cli.args import examples_from_args, retriever_from_args
    from ragsuite.data.datasets import get_dataset_info

    ks = sorted(set(args.k))
    if any(k < 1 for k in ks):
        raise ConfigError(f"--k values must be positive, got {args.k}")
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be positive, got {args.limit}")
    info = get_dataset_info(args.dataset) if args.dataset else None
    label = args.dataset or str(args.questions)
    examples = examples_from_args(args)
    if args.limit is not None:
        examples = examples[: args.limit]
    skipped = sum(1 for ex in examples if not list(ex.get("gold_passage_ids") or []))
    if skipped == len(examples):
        raise ConfigError(
            f"none of the {len(examples)} questions of {label} has gold passage ids, so recall cannot "
            "be measured (TriviaQA ships none)"
        )
    if skipped:
        print(
            f"note: skipping {skipped} of {len(examples)} questions without gold passage ids", file=sys.stderr
        )
    if args.retriever.strip() == "bm25" and args.corpus is None and info is not None and not info.has_corpus:
        raise ConfigError(
            f"{args.dataset} ships no corpus: pass --retriever bm25:DATASET, e.g. bm25:nq, or --corpus FILE"
        )
    retriever = retriever_from_args(args, args.retriever)
    if retriever is None:
        raise ConfigError("retrieve-eval measures a retriever: --retriever none has nothing to measure")
    if args.sweep is not None:
        return _sweep(args, retriever, examples, ks, label)
    metrics = evaluate_retrieval(retriever, examples, ks, progress=sys.stderr.isatty())
    if args.json:
        print(json.dumps(metrics))
        return 0
    spec = retriever.describe().get("spec", args.retriever)
    _print_table(label, metrics, spec, ks)
    return 0


def _print_table(label: str, metrics: dict[str, float], spec: str, ks: Sequence[int]) -> None:
    print(f"{label}: {metrics['n']} questions, retriever {spec}")
    print("| k | recall@k | all_gold@k |")
    print("|---:|---:|---:|")
    for k in ks:
        print(f"| {k} | {100 * metrics[f'recall@{k}']:.1f} | {100 * metrics[f'all_gold@{k}']:.1f} |")


def _sweep(
    args: argparse.Namespace, retriever: Any, examples: Sequence[Any], ks: Sequence[int], label: str
) -> int:
    """Fit the hybrid's fusion settings on these questions' gold passages; print the best and its spec."""
    from tqdm.auto import tqdm

    from ragsuite.retrieval.hybrid import FusionSearch
    from ragsuite.retrieval.sweep import fused_metrics, member_lists, parse_metric, sweep_fusion

    if args.sweep < 1:
        raise ConfigError(f"--sweep needs a positive number of trials, got {args.sweep}")
    metric = args.sweep_metric or f"recall@{ks[0]}"
    search = FusionSearch(retriever)
    scored = [ex for ex in examples if list(ex.get("gold_passage_ids") or [])]
    with tqdm(
        total=len(scored), desc="members", unit="q", disable=not sys.stderr.isatty(), file=sys.stderr
    ) as bar:
        lists = member_lists(
            search.retriever,
            [ex.question for ex in scored],
            depth=max(search.max_depth, *ks),
            on_batch=bar.update,
        )
    golds = [ex.gold_passage_ids for ex in scored]
    given = fused_metrics(search.retriever, lists, golds, sorted({*ks, parse_metric(metric)[1]}))
    result = sweep_fusion(search, lists, golds, metric=metric, ks=ks, trials=args.sweep, seed=args.seed)
    spec = result.retriever.describe()["spec"]
    metrics = {**result.metrics, "n": len(scored)}
    if args.json:
        print(
            json.dumps(
                {
                    **metrics,
                    "spec": spec,
                    "params": result.params,
                    "metric": metric,
                    "trials": len(result.trials),
                    "given": {"spec": search.retriever.describe()["spec"], **given},
                }
            )
        )
        return 0
    print(
        f"swept {len(result.trials)} fusion settings for {metric} on these questions: "
        f"{100 * given[metric]:.1f} as given -> {100 * result.metrics[metric]:.1f}"
    )
    _print_table(label, metrics, spec, ks)
    print(f"freeze it with --retriever '{spec}' (scores above are on the questions it was fitted on)")
    return 0
