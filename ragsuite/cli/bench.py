"""``ragsuite bench SPEC.toml``: run a paper's grid as resumable eval runs and print its table with the
published numbers beside ours (:mod:`ragsuite.bench`).

Example:
    ragsuite bench benchmarks/specs/deepnote-table1.toml --lm openai/gpt-4o-mini --out runs/deepnote-table1
    ragsuite bench benchmarks/specs/hanrag-table2.toml --lm vllm:llama-8b@http://gpu:8000/v1 \\
        --eval-args='--seed 1'
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="run a paper's table (programs x datasets) and compare with the published numbers",
        description="Run every cell of a bench spec as a `ragsuite eval` run (finished questions are reused, "
        "so a killed bench resumes), then print the table in the paper's layout: ours, published, "
        "difference. --eval-args passes flags to every `ragsuite eval`.",
    )
    parser.add_argument(
        "spec", type=Path, help="a bench spec (TOML), e.g. benchmarks/specs/deepnote-table1.toml"
    )
    parser.add_argument(
        "--out", type=Path, help="root of the cells' run directories (default runs/bench-NAME)"
    )
    parser.add_argument(
        "--lm",
        action="append",
        default=[],
        metavar="SPEC",
        help="LM(s) to run (repeatable); default: the spec's lms",
    )
    parser.add_argument(
        "--backbone",
        metavar="NAME",
        help="whose published rows to show (e.g. gpt-4o-mini, qwen2.5-7b-instruct+dpo); default: the spec's, "
        "else the backbone the LM's model name matches",
    )
    parser.add_argument("--limit", type=int, help="override the spec's questions per dataset")
    parser.add_argument(
        "--format", choices=("md", "csv", "latex"), default="md", help="table format (default md)"
    )
    parser.add_argument("--ci", action="store_true", help="add 95%% bootstrap intervals to our scores")
    parser.add_argument(
        "--table-only", action="store_true", help="print the table from existing runs; run nothing"
    )
    parser.add_argument("--dry-run", action="store_true", help="list the cells' eval commands and stop")
    parser.add_argument(
        "--eval-args",
        default="",
        metavar="FLAGS",
        help="flags for every `ragsuite eval`, in one argument: --eval-args='--api-base URL --temperature 0'",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from ragsuite import bench
    from ragsuite.cli import main
    from ragsuite.errors import ConfigError

    spec = bench.load_spec(args.spec)
    if args.limit is not None:
        if args.limit < 1:
            raise ConfigError(f"--limit must be >= 1, not {args.limit}")
        spec = dataclasses.replace(spec, limit=args.limit)
    try:
        extra = shlex.split(args.eval_args)
    except ValueError as exc:  # an unbalanced quote
        raise ConfigError(f"--eval-args cannot be split into flags ({exc}); balance its quotes") from None
    if args.backbone is not None:
        if spec.table is None:
            raise ConfigError(f"--backbone needs a spec with a published table; {args.spec} names none")
        spec = dataclasses.replace(spec, backbone=bench.check_backbone(spec.table, args.backbone))
    out = args.out or Path("runs") / f"bench-{spec.name}"
    cells = bench.plan(spec, out=out, lms=args.lm)
    if args.dry_run:
        for cell in cells:
            print("ragsuite " + " ".join(bench.eval_argv(spec, cell, extra)))
        return 0
    failed = {}
    if not args.table_only:
        codes = bench.run(spec, cells, extra=extra, run_eval=main)
        failed = {cell: code for cell, code in codes.items() if code != 0}
    print(bench.table(spec, cells, fmt=args.format, with_ci=args.ci))
    left_out = bench.notes(spec, cells)
    if left_out:
        print("\n" + "\n".join(left_out))
    print("\nCost per answered question:\n")
    print(bench.cost_table(spec, cells, fmt=args.format))
    note = bench.source_note(spec)
    if note:
        print(f"\n{note}")
    if failed:
        names = ", ".join(f"{c.program}/{c.dataset}" for c in failed)
        print(
            f"error: {len(failed)} cell(s) failed ({names}); their columns show what finished. Rerun the "
            "same command to resume them.",
            file=sys.stderr,
        )
        return 1
    return 0
