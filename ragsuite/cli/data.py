"""``ragsuite data``: list the datasets, and convert public releases to ragsuite's layout.

Examples:
    ragsuite data list
    ragsuite data convert --format hotpotqa hotpot_dev_distractor_v1.json mydata/hotpotqa
    ragsuite data convert --format strategyqa strategyqa_train.json mydata/strategyqa \\
        --paragraphs strategyqa_train_paragraphs.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    from ragsuite.data.readers import FORMATS

    parser = subparsers.add_parser(
        "data",
        help="list datasets; convert public dataset files to corpus.jsonl/dev.jsonl",
        description="List the datasets, or convert a public release to ragsuite's corpus/dev JSONL layout.",
    )
    actions = parser.add_subparsers(dest="data_command", metavar="ACTION")

    list_parser = actions.add_parser("list", help="each dataset's task, metrics and sizes")
    list_parser.add_argument("--data-dir", help="dataset root (default: $RAGSUITE_DATA or ../shared/data)")
    list_parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    list_parser.set_defaults(func=_list)

    convert = actions.add_parser(
        "convert",
        help="convert a public dataset file to OUT_DIR/corpus.jsonl and OUT_DIR/dev.jsonl",
        description=(
            "Convert a public dataset release to OUT_DIR/corpus.jsonl and OUT_DIR/<split>.jsonl (each "
            "written atomically). Put OUT_DIR at DATA_DIR/<dataset> and pass --data-dir DATA_DIR to "
            "other commands."
        ),
    )
    convert.add_argument("--format", required=True, choices=FORMATS, help="the input file's format")
    convert.add_argument("input", metavar="IN", help="the downloaded file (JSON or JSON Lines)")
    convert.add_argument("out_dir", metavar="OUT_DIR", help="folder to write corpus.jsonl and the split into")
    convert.add_argument("--paragraphs", help="strategyqa: the paragraphs JSON that evidence ids refer to")
    convert.add_argument(
        "--split", default="dev", help="name of the question file written (and the split read from ASQA.json)"
    )
    convert.add_argument(
        "--include-unanswerable", action="store_true", help="musique: keep questions marked unanswerable"
    )
    convert.set_defaults(func=_convert)

    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def _list(args: argparse.Namespace) -> int:
    from ragsuite.data.datasets import DATASETS
    from ragsuite.paths import data_dir

    root = data_dir(args.data_dir)
    rows = []
    for info in DATASETS.values():
        folder = root / info.name
        questions = _count_lines(folder / "dev.jsonl") if (folder / "dev.jsonl").is_file() else None
        corpus = folder / "corpus.jsonl"
        passages = _count_lines(corpus) if info.has_corpus and corpus.is_file() else None
        rows.append(
            {
                "name": info.name,
                "task": info.task,
                "metrics": list(info.metrics),
                "primary_metric": info.primary_metric,
                "questions": questions,
                "passages": passages,
            }
        )
    if args.json:
        print(json.dumps({"data_dir": str(root), "datasets": rows}, indent=2))
        return 0
    print(f"data directory: {root}")
    header = ("dataset", "task", "metrics (primary first)", "dev questions", "passages")
    table = [
        (
            r["name"],
            r["task"],
            ", ".join([r["primary_metric"], *(m for m in r["metrics"] if m != r["primary_metric"])]),
            "-" if r["questions"] is None else str(r["questions"]),
            "-" if r["passages"] is None else str(r["passages"]),
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in [header, *table]) for i in range(len(header))]
    for row in [header, *table]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def _count_lines(path: Path) -> int:
    with path.open(encoding="utf-8") as handle:
        return sum(1 for line in handle if line.strip())


def _convert(args: argparse.Namespace) -> int:
    from ragsuite.data.readers import convert
    from ragsuite.errors import ConfigError

    options: dict = {}
    if args.paragraphs:
        if args.format != "strategyqa":
            raise ConfigError("--paragraphs applies to --format strategyqa only")
        options["paragraphs"] = args.paragraphs
    if args.include_unanswerable:
        if args.format != "musique":
            raise ConfigError("--include-unanswerable applies to --format musique only")
        options["include_unanswerable"] = True
    stats = convert(args.format, args.input, args.out_dir, split=args.split, **options)
    print(f"wrote {stats['questions']} questions to {stats['split']}")
    print(f"wrote {stats['passages']} passages to {stats['corpus']}")
    return 0
