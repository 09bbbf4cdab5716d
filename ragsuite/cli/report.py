"""``ragsuite report DIR [DIR ...]``: one comparison table over several ``ragsuite eval`` runs, or the Pareto
front of ``ragsuite tune`` studies; ``--html`` and ``--png`` draw them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ragsuite.errors import DataError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="compare several eval runs in one table, or show a tune study's Pareto front",
        description="Print one table (Markdown) over the run directories written by `ragsuite eval`, or the "
        "Pareto front of the studies in `ragsuite tune` output directories.",
    )
    parser.add_argument(
        "runs",
        nargs="+",
        type=Path,
        metavar="DIR",
        help="eval run directories, or tune directories (`ragsuite tune --out` or one study folder in it)",
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    parser.add_argument(
        "--format", choices=("md", "csv", "latex"), default="md", help="table format (default md)"
    )
    parser.add_argument(
        "--ci", action="store_true", help="95%% bootstrap confidence interval of every metric"
    )
    parser.add_argument(
        "--paired",
        action="store_true",
        help="paired test of every two runs on the questions both scored (bootstrap interval of the "
        "difference, sign-flip permutation p-value; * marks p < 0.05)",
    )
    parser.add_argument("--by-type", action="store_true", help="every metric per question type")
    parser.add_argument(
        "--html",
        type=Path,
        metavar="OUT.html",
        help="also write one self-contained HTML report (two runs: a comparison view; tune directories: "
        "quality vs cost of every trial with the Pareto front)",
    )
    parser.add_argument(
        "--png",
        type=Path,
        metavar="OUT_DIR",
        help="also write the plots as PNG files in OUT_DIR (needs matplotlib, the plot extra): "
        "steps-RUN.png per run and accuracy-vs-cost.png; pareto-STUDY.png per tune study",
    )
    parser.set_defaults(func=run)


def interval_rows(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """One line per run and metric: the mean and its 95% bootstrap interval, in percent."""
    from ragsuite.evaluation.paired import run_label, scored_questions
    from ragsuite.stats import bootstrap_ci

    header = ["run", "dataset", "metric", "n", "mean", "95% CI"]
    lines = []
    for row in rows:
        scored = scored_questions(Path(row["dir"]))
        for metric in row.get("metrics") or {}:
            values = [float(q["metrics"].get(metric, 0.0)) for q in scored.values()]
            if not values:
                lines.append([run_label(row), row["dataset"], metric, "0", "–", "–"])
                continue
            low, high = bootstrap_ci(values)
            mean = 100 * sum(values) / len(values)
            lines.append(
                [
                    run_label(row),
                    row["dataset"],
                    metric,
                    str(len(values)),
                    f"{mean:.1f}",
                    f"[{100 * low:.1f}, {100 * high:.1f}]",
                ]
            )
    return header, lines


def type_rows(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Every metric per question type (bridge/comparison, 2hop/3hop/4hop, ...), in percent."""
    from ragsuite.evaluation.paired import run_label, scored_questions

    metrics: list[str] = []
    for row in rows:
        metrics += [m for m in row.get("metrics") or {} if m not in metrics]
    header = ["run", "dataset", "type", "n", *metrics]
    lines = []
    for row in rows:
        by_type: dict[str, list[dict[str, float]]] = {}
        for question in scored_questions(Path(row["dir"])).values():
            by_type.setdefault(question["type"], []).append(question["metrics"])
        for kind in sorted(by_type):
            group = by_type[kind]
            cells = [
                f"{100 * sum(float(m.get(metric, 0.0)) for m in group) / len(group):.1f}"
                if metric in (row.get("metrics") or {})
                else "–"
                for metric in metrics
            ]
            lines.append([run_label(row), row["dataset"], kind, str(len(group)), *cells])
    return header, lines


def run(args: argparse.Namespace) -> int:
    from ragsuite.evaluation import format_table, load_run
    from ragsuite.evaluation.paired import paired_rows
    from ragsuite.report_plots import find_studies
    from ragsuite.tables import parse_markdown, render_table

    if args.png is not None:
        from ragsuite.report_plots import require_matplotlib

        require_matplotlib()  # before anything is written
    found = [find_studies(path) for path in args.runs]
    if any(studies is not None for studies in found):
        if not all(studies is not None for studies in found):
            runs = [str(p) for p, s in zip(args.runs, found, strict=True) if s is None]
            raise DataError(
                "give either eval run directories or tune directories, not both (not a tune directory: "
                f"{', '.join(runs)})"
            )
        return _report_studies([s for studies in found for s in studies or []], args)
    rows = [load_run(run_dir) for run_dir in args.runs]
    if args.html is not None and len(rows) > 2:
        raise DataError("--html compares at most two runs; give one or two run directories")
    if args.png is not None:
        for path in write_run_pngs(rows, args.png):
            print(f"wrote {path}", file=sys.stderr)
    if args.html is not None:
        from ragsuite.report_html import write_report

        size = write_report(rows, args.html)
        print(f"wrote {args.html} ({size / 1e6:.2f} MB)", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(render_table(*parse_markdown(format_table(rows)), args.format))
    if args.ci:
        print("\n" + render_table(*interval_rows(rows), args.format))
    if args.by_type:
        print("\n" + render_table(*type_rows(rows), args.format))
    if args.paired:
        header, lines, notes = paired_rows(rows)
        if lines:
            print("\n" + render_table(header, lines, args.format))
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    return 0


def write_run_pngs(rows: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """``steps-RUN.png`` (steps per scored question) for each run and ``accuracy-vs-cost.png`` (every run's
    primary metric against tokens and LM calls per question) in ``out_dir``."""
    from ragsuite.evaluation.paired import run_label
    from ragsuite.report_plots import png_histogram, png_scatters, run_scatters, safe_name

    written, used = [], set()
    for row in rows:
        name = safe_name(Path(row["dir"]).name)
        stem, i = f"steps-{name}", 2
        while stem in used:  # two runs in folders of the same name
            stem, i = f"steps-{name}-{i}", i + 1
        used.add(stem)
        steps = [float(q["stats"].get("steps", 0)) for q in _scored_stats(Path(row["dir"]))]
        written.append(png_histogram(f"steps per question: {run_label(row)}", steps, out_dir / f"{stem}.png"))
    scatters = run_scatters(rows, [run_label(row) for row in rows])
    written.append(png_scatters(scatters, out_dir / "accuracy-vs-cost.png"))
    return written


def _scored_stats(run_dir: Path) -> list[dict[str, Any]]:
    from ragsuite.evaluation import RECORDS, read_records

    if not (run_dir / RECORDS).is_file():
        return []
    return [
        {"stats": record.get("stats") or {}}
        for record in read_records(run_dir / RECORDS).records.values()
        if not record.get("error") and isinstance(record.get("metrics"), dict)
    ]


def _report_studies(studies: list[Any], args: argparse.Namespace) -> int:
    """Tune directories: the Pareto front (or best trial) of each study as a table; --html, --png, --json."""
    from ragsuite.report_plots import png_scatters, safe_name, study_scatters
    from ragsuite.tables import render_table

    if args.ci or args.paired or args.by_type:
        raise DataError(
            "--ci, --paired and --by-type are for eval runs; a tune directory has no per-question data"
        )
    if args.html is not None:
        from ragsuite.report_html import write_tune_report

        size = write_tune_report(studies, args.html)
        print(f"wrote {args.html} ({size / 1e6:.2f} MB)", file=sys.stderr)
    if args.png is not None:
        for study in studies:
            title = f"{study.name}: {len(study.complete)} complete trials"
            path = png_scatters(
                study_scatters(study), args.png / f"pareto-{safe_name(study.name)}.png", title=title
            )
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        front = [
            {
                "study": s.name,
                "dir": str(s.path),
                "objectives": s.objectives,
                "front": s.front,
                "chosen": s.chosen,
            }
            for s in studies
        ]
        print(json.dumps(front, indent=2))
        return 0
    for study in studies:
        by_number = {t["number"]: t for t in study.trials}
        named = [f"quality ({study.quality_metric})" if o == "quality" else o for o in study.objectives]
        header = ["trial", *named, "knobs"]
        lines = []
        for number in study.front:
            trial = by_number.get(number, {"values": None, "knobs": {}})
            values = trial.get("values") or [None] * len(study.objectives)
            cells = [
                "–" if v is None else f"{100 * v:.1f}" if o == "quality" else f"{v:.2f}"
                for o, v in zip(study.objectives, values, strict=False)
            ]
            knobs = ", ".join(f"{k}={v}" for k, v in (trial.get("knobs") or {}).items())
            lines.append([f"#{number}", *cells, knobs])
        title = "Pareto front" if len(study.objectives) > 1 else "best trial"
        print(
            f"{title} of study {study.name!r} ({len(study.complete)} complete of {len(study.trials)} trials)"
        )
        print(render_table(header, lines, args.format) + "\n")
    return 0
