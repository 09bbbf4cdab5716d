"""``ragsuite data``: list the datasets, download them, and convert public releases to ragsuite's layout.

Examples:
    ragsuite data list
    ragsuite data sources
    ragsuite data download hotpotqa --subset ircot-test-500 --corpus none
    ragsuite data convert --format hotpotqa hotpot_dev_distractor_v1.json mydata/hotpotqa
    ragsuite data convert --format strategyqa strategyqa_train.json mydata/strategyqa \\
        --paragraphs strategyqa_train_paragraphs.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    from ragsuite.data.readers import FORMATS

    parser = subparsers.add_parser(
        "data",
        help="download the papers' datasets and corpora; list them and their sources; convert public files",
        description=(
            "Download the papers' datasets and corpora, list what is installed and on offer, show every "
            "source, or convert a public release to ragsuite's corpus/dev JSONL layout."
        ),
    )
    actions = parser.add_subparsers(dest="data_command", metavar="ACTION")

    list_parser = actions.add_parser(
        "list", help="what is installed (task, metrics, sizes) and what can be downloaded"
    )
    list_parser.add_argument(
        "--data-dir", help="datasets folder (default $RAGSUITE_DATA, else ~/.cache/ragsuite/data)"
    )
    list_parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    list_parser.set_defaults(func=_list)

    download = actions.add_parser(
        "download",
        help="download public datasets and corpora, verified, into DATA_DIR/<name>/",
        description=(
            "Download a dataset's questions and corpus from their public sources, verify them against the "
            "published checksum or size, and convert them by streaming to DATA_DIR/<name>/{dev,test}.jsonl "
            "and corpus.jsonl. Interrupted downloads resume, with If-Range: a file changed on the server "
            "since is downloaded again, never spliced. A file with no published checksum is kept once it has "
            "been converted, and deleted if it cannot be (docs/data.md). Official hosts are reached through "
            "$RAGSUITE_MIRROR=http://host:port when set (GET /<host>/<path>), the Hugging Face Hub through "
            "$HF_ENDPOINT."
        ),
    )
    download.add_argument("names", nargs="+", metavar="NAME", help="datasets (see `ragsuite data sources`)")
    download.add_argument(
        "--data-dir", help="where to install (default: $RAGSUITE_DATA, else ~/.cache/ragsuite/data)"
    )
    download.add_argument(
        "--subset",
        help="question set, e.g. ircot-test-500, dev, alce-948 (default: the paper's); 'none' skips",
    )
    download.add_argument(
        "--corpus", help="corpus, e.g. ircot, wiki18-100w (default: the paper's); 'none' skips the corpus"
    )
    download.add_argument("--force", action="store_true", help="convert again even if already installed")
    download.add_argument("--quiet", action="store_true", help="no progress bars")
    download.set_defaults(func=_download)

    sources = actions.add_parser("sources", help="where each downloadable file comes from, and its checksum")
    sources.add_argument("--json", action="store_true", help="print JSON instead of text")
    sources.set_defaults(func=_sources)

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
    from ragsuite.data.download import read_manifest
    from ragsuite.errors import DataError
    from ragsuite.paths import data_dir, download_root

    try:
        root = data_dir(args.data_dir)
    except DataError:
        root = download_root(args.data_dir)  # nothing installed yet: still list what can be downloaded
    downloadable = _downloadable(root, read_manifest)
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
        print(json.dumps({"data_dir": str(root), "datasets": rows, "downloadable": downloadable}, indent=2))
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
    print()
    print("downloadable (ragsuite data download NAME [--subset S] [--corpus C]; * = default):")
    header = ("dataset", "kind", "name", "writes", "download", "on disk", "installed")
    table = [
        (
            d["dataset"],
            d["kind"],
            d["name"] + ("*" if d["default"] else ""),
            d["writes"],
            _size(d["download_bytes"]),
            _size(d["converted_bytes"]),
            "-" if d["installed_rows"] is None else f"yes ({d['installed_rows']} rows)",
        )
        for d in downloadable
    ]
    _print_table(header, table)
    print("sizes are approximate; '-' = not known before downloading")
    return 0


def _print_table(header: tuple[str, ...], table: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in [header, *table]) for i in range(len(header))]
    for row in [header, *table]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _size(num: int | None) -> str:
    if num is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if num >= scale:
            return f"~{num / scale:.1f} {unit}"
    return f"~{num} B"


def _downloadable(root: Path, read_manifest) -> list[dict]:
    from ragsuite.data.sources import CATALOGUE

    rows = []
    for source in CATALOGUE:
        entry = read_manifest(root / source.dataset).get(source.output) or {}
        installed = entry.get("source") == source.name and (root / source.dataset / source.output).is_file()
        download_bytes = source.download_bytes
        if download_bytes is None:
            sizes = [inp.file.size for inp in source.inputs]
            download_bytes = sum(sizes) if all(size is not None for size in sizes) else None  # type: ignore[misc]
        rows.append(
            {
                "dataset": source.dataset,
                "kind": source.kind,
                "name": source.name,
                "default": source.default,
                "writes": source.output,
                "paper_subset": source.paper_subset,
                "download_bytes": download_bytes,
                "converted_bytes": source.converted_bytes,
                "installed_rows": int(entry["rows"]) if installed else None,
            }
        )
    return rows


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


def _download(args: argparse.Namespace) -> int:
    from ragsuite.data.download import download, gold_coverage

    for item in download(
        args.names,
        data_dir=args.data_dir,
        subset=args.subset,
        corpus=args.corpus,
        quiet=args.quiet,
        force=args.force,
    ):
        state = "already installed" if item.skipped else "installed"
        print(f"{item.dataset}: {item.path} ({item.rows} rows, from {item.source}) {state}")
    for cover in gold_coverage(args.names, data_dir=args.data_dir):
        share = f"{100 * cover.found / cover.gold:.1f}%"
        print(
            f"{cover.dataset}: {cover.found} of {cover.gold} gold passages of {cover.questions.name} "
            f"are in corpus.jsonl ({share})"
        )
        if cover.found < cover.gold:
            print(
                f"warning: {cover.dataset}: {cover.gold - cover.found} gold passages are worded differently "
                "in the corpus; retrieval recall against gold ids counts only the others",
                file=sys.stderr,
            )
    return 0


def _sources(args: argparse.Namespace) -> int:
    from ragsuite.data.sources import CATALOGUE

    described = []
    for source in CATALOGUE:
        files = []
        for inp in source.inputs:
            file = inp.file
            if file.sha256:
                check = f"sha256 {file.sha256}"
            elif file.hub_repo:
                check = "checksum published by the Hub, read at download"
            elif file.size is not None:
                check = f"size only ({file.size} bytes)"
            else:
                check = "none published"
            files.append(
                {
                    "filename": file.filename,
                    "origin": file.origin,
                    "members": list(inp.members),
                    "sha256": file.sha256,
                    "size": file.size,
                    "checksum": check,
                    "note": file.checksum_note,
                }
            )
        described.append(
            {
                "dataset": source.dataset,
                "kind": source.kind,
                "name": source.name,
                "default": source.default,
                "writes": source.output,
                "description": source.description,
                "paper_subset": source.paper_subset,
                "origin": source.origin,
                "license": source.license,
                "format": source.format,
                "expected_rows": source.expected_rows,
                "files": files,
            }
        )
    if args.json:
        print(json.dumps(described, indent=2))
        return 0
    for item in described:
        default = " (default)" if item["default"] else ""
        print(f"{item['dataset']} {item['kind']} {item['name']}{default} -> {item['writes']}")
        print(f"  {item['description']}")
        print(f"  origin: {item['origin']}  license: {item['license']}")
        print(f"  format: {item['format']}; rows: {item['expected_rows'] or '-'}")
        for file in item["files"]:
            members = f" [{', '.join(file['members'])}]" if file["members"] else ""
            print(f"  file: {file['origin']}{members}")
            print(f"    checksum: {file['checksum']}")
    return 0
