"""Reproduce a paper's table: a grid of programs x datasets (x retrievers x LMs) run as ordinary, resumable
``ragsuite eval`` runs, then one table in the paper's layout with the published numbers beside ours.

A spec is a TOML file::

    name = "deepnote-table1"
    table = "deepnote-table1"          # published numbers to compare with (ragsuite/data/published.json)
    programs = ["vanilla", "deepnote", "deepnote-top3"]
    datasets = ["hotpotqa", "musique"]
    retrievers = ["bm25"]              # optional; every spec --retriever accepts
    lms = ["openai/gpt-4o-mini"]       # optional when --lm is given on the command line
    backbone = "gpt-4o-mini"           # optional: whose published rows to show (default: matched to the LM)
    split = "dev"
    limit = 500
    threads = 8

    [variants.deepnote-top3]           # a row that runs a program with other knobs (or another retriever)
    program = "deepnote"
    set = {top_k = 3}

Each cell is a run directory ``OUT/[LM/][RETRIEVER/]ROW/DATASET`` written by ``ragsuite eval``: rerunning
the bench reuses finished questions and reruns only what is missing, so a killed bench resumes where it
stopped. Cells run one after another, each with ``threads`` questions in flight.

Published numbers are kept as the paper prints them (text, "49.12" stays "49.12") and shown as printed. A
published table lists its rows per backbone LM; the rows shown beside an LM are those of the backbone named by
``backbone`` / ``--backbone``, else of the one whose name the LM's model name contains, else none (a note says
so). Our "avg" is computed only where the paper's own average can be reproduced (the mean of the metrics it
averages); elsewhere the published average is shown and ours is left out, with the reason. Rows and columns of
the paper that the spec cannot run are listed under the table with their reasons.

Example:
    >>> from ragsuite.bench import load_spec, plan  # doctest: +SKIP
    >>> spec = load_spec("benchmarks/specs/deepnote-table1.toml")  # doctest: +SKIP
    >>> [cell.out_dir for cell in plan(spec, out="runs/bench")][:2]  # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ragsuite.errors import ConfigError
from ragsuite.stats import bootstrap_ci
from ragsuite.tables import TableFormat, render_table

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

_SPEC_KEYS = {
    "name",
    "table",
    "programs",
    "datasets",
    "retrievers",
    "lms",
    "backbone",
    "split",
    "splits",
    "limit",
    "threads",
    "set",
    "variants",
}
#: A spec name, row label or split: it becomes a directory or file name, so no separators and no "..".
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
#: Largest spec file read: a spec is a few lines; this bounds what a hostile one can cost.
MAX_SPEC_BYTES = 1 << 20


def _safe_name(value: str) -> bool:
    return bool(_SAFE_NAME.fullmatch(value)) and ".." not in value


@dataclass(frozen=True)
class Variant:
    """A row that runs a registered ``program`` with its own knobs (and, optionally, its own retriever)."""

    program: str
    knobs: Mapping[str, Any] = field(default_factory=dict)
    retriever: str | None = None


@dataclass(frozen=True)
class BenchSpec:
    """A parsed bench spec (see the module docstring)."""

    name: str
    programs: tuple[str, ...]
    datasets: tuple[str, ...]
    table: str | None = None
    retrievers: tuple[str, ...] = ("bm25",)
    lms: tuple[str, ...] = ()
    #: The published backbone whose rows are shown (None: matched to each LM's model name).
    backbone: str | None = None
    split: str = "dev"
    #: Per-dataset split: the papers' subsets (IRCoT's 500 test questions are test.jsonl, ALCE's ASQA dev).
    splits: Mapping[str, str] = field(default_factory=dict)
    limit: int | None = None
    threads: int = 8
    knobs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Rows that are a program with other knobs, by row label (the label is what ``programs`` lists).
    variants: Mapping[str, Variant] = field(default_factory=dict)

    def program_of(self, row: str) -> str:
        """The registered program a row runs."""
        return self.variants[row].program if row in self.variants else row


@dataclass(frozen=True)
class Cell:
    """One run of the grid; ``program`` is the row label (a registered program or a variant)."""

    program: str
    dataset: str
    retriever: str
    lm: str
    out_dir: Path


def load_spec(path: str | os.PathLike[str]) -> BenchSpec:
    """Read and validate a bench spec.

    Raises:
        ConfigError: Unreadable or too deeply nested TOML, unknown keys, unknown programs, datasets or
            published tables, a name or split that is not a plain file name.
    """
    from ragsuite import programs as registry
    from ragsuite.data.datasets import dataset_names

    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_SPEC_BYTES:
            raise ConfigError(f"bench spec {path} is {size:,} bytes; a spec is at most {MAX_SPEC_BYTES:,}")
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"bench spec {path} does not exist") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read bench spec {path}: {exc}") from exc
    except RecursionError:  # tomllib recurses once per nesting level
        raise ConfigError(f"cannot read bench spec {path}: its tables or arrays nest too deeply") from None
    unknown = sorted(set(raw) - _SPEC_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown keys {unknown}; a spec may set {sorted(_SPEC_KEYS)}")

    def is_names(value: Any) -> bool:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)

    variants: dict[str, Variant] = {}
    raw_variants = raw.get("variants", {})
    if not isinstance(raw_variants, dict):
        raise ConfigError(
            f'{path}: [variants.LABEL] tables hold program = "NAME" and optional set, retriever'
        )
    for label, entry in raw_variants.items():
        if not _safe_name(label) or label in registry.names():
            raise ConfigError(
                f"{path}: variant label {label!r} must be a plain name (letters, digits, . _ + -), not "
                "a registered program's"
            )
        if not isinstance(entry, dict) or set(entry) - {"program", "set", "retriever"}:
            raise ConfigError(
                f'{path}: [variants.{label}] holds program = "NAME" and optional set, retriever'
            )
        program, knobs, retriever = entry.get("program"), entry.get("set", {}), entry.get("retriever")
        if program not in registry.names():
            raise ConfigError(f"{path}: variant {label!r} names unknown program {program!r}")
        if not isinstance(knobs, dict) or (retriever is not None and not isinstance(retriever, str)):
            raise ConfigError(
                f"{path}: [variants.{label}] set is a table of knob = value, retriever a string"
            )
        variants[label] = Variant(program, knobs, retriever)

    def names(key: str, allowed: Sequence[str], *, required: bool = True) -> tuple[str, ...]:
        value = raw.get(key, [])
        if not is_names(value):
            raise ConfigError(f"{path}: {key} must be a list of names")
        if required and not value:
            raise ConfigError(f"{path}: {key} must name at least one")
        bad = [v for v in value if allowed and v not in allowed]
        if bad:
            raise ConfigError(f"{path}: unknown {key} {bad}; choose from {', '.join(allowed)}")
        return tuple(value)

    table = raw.get("table")
    if table is not None and table not in published_tables():
        raise ConfigError(f"{path}: no published table {table!r}; known: {', '.join(published_tables())}")
    backbone = raw.get("backbone")
    if backbone is not None:
        if table is None:
            raise ConfigError(f"{path}: backbone needs a published table")
        check_backbone(table, backbone)
    name = raw.get("name", _label(path.stem))
    if not isinstance(name, str) or not _safe_name(name):
        raise ConfigError(
            f"{path}: name {name!r} must be a plain name (letters, digits, . _ + -): it names the run "
            "directory runs/bench-NAME"
        )
    split = raw.get("split", "dev")
    splits = raw.get("splits", {})
    if not isinstance(splits, dict) or not all(isinstance(v, str) for v in splits.values()):
        raise ConfigError(f'{path}: [splits] holds dataset = "split" pairs')
    for value in (split, *splits.values()):
        if not isinstance(value, str) or not _safe_name(value):
            raise ConfigError(f"{path}: split {value!r} must be a plain name such as dev or test")
    knobs = raw.get("set", {})
    if not isinstance(knobs, dict) or not all(isinstance(v, dict) for v in knobs.values()):
        raise ConfigError(f"{path}: [set.PROGRAM] tables hold knob = value pairs")
    limit = raw.get("limit")
    threads = raw.get("threads", 8)
    for key, value in (("limit", limit), ("threads", threads)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{path}: {key} must be a positive integer, not {value!r}")
    return BenchSpec(
        name=name,
        table=table,
        programs=names("programs", [*registry.names(), *variants]),
        datasets=names("datasets", dataset_names()),
        retrievers=names("retrievers", [], required=False) or ("bm25",),
        lms=names("lms", [], required=False),
        backbone=backbone,
        split=split,
        splits=splits,
        limit=limit,
        threads=threads,
        knobs=knobs,
        variants=variants,
    )


def _label(text: str) -> str:
    """A directory-safe label for an LM or retriever spec (keys come from the environment, never specs)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_").lstrip(".") or "default"


def plan(spec: BenchSpec, *, out: str | os.PathLike[str], lms: Sequence[str] = ()) -> list[Cell]:
    """Every cell of the grid, in run order (LM, retriever, program, dataset). A variant with its own
    retriever runs once per LM, under the first retriever's directory.

    Raises:
        ConfigError: When neither the spec nor ``lms`` names an LM.
    """
    lms = tuple(lms) or spec.lms
    if not lms:
        raise ConfigError("no LM: pass --lm SPEC or list lms = [...] in the spec")
    root = Path(out)
    cells = []
    for lm in lms:
        for n, retriever in enumerate(spec.retrievers):
            base = (
                root
                / (_label(lm) if len(lms) > 1 else "")
                / (_label(retriever) if len(spec.retrievers) > 1 else "")
            )
            for program in spec.programs:
                own = spec.variants[program].retriever if program in spec.variants else None
                if own is not None and n:
                    continue
                cells += [
                    Cell(program, dataset, own or retriever, lm, base / program / dataset)
                    for dataset in spec.datasets
                ]
    return cells


def eval_argv(spec: BenchSpec, cell: Cell, extra: Sequence[str] = ()) -> list[str]:
    """The ``ragsuite eval`` command line of one cell; ``extra`` flags (``--api-base``, ``--temperature``,
    ...) go to every cell."""
    split = spec.splits.get(cell.dataset, spec.split)
    program = spec.program_of(cell.program)
    argv = ["eval", "--program", program, "--dataset", cell.dataset, "--split", split]
    argv += ["--lm", cell.lm, "--retriever", cell.retriever, "--threads", str(spec.threads)]
    argv += ["--out", str(cell.out_dir)]
    if spec.limit is not None:
        argv += ["--limit", str(spec.limit)]
    # The program's [set.PROGRAM] knobs, then the variant's own (a variant's row label is not a program).
    knobs = dict(spec.knobs.get(program, {}))
    if cell.program in spec.variants:
        knobs.update(spec.variants[cell.program].knobs)
    for knob, value in knobs.items():
        argv += ["--set", f"{knob}={json.dumps(value)}"]
    return [*argv, *extra]


def run(
    spec: BenchSpec,
    cells: Sequence[Cell],
    *,
    extra: Sequence[str] = (),
    run_eval: Callable[[list[str]], int],
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> dict[Cell, int]:
    """Run every cell through ``ragsuite eval`` (resuming what exists); returns each cell's exit code. A
    failed cell does not stop the others.

    ``run_eval`` runs one ``ragsuite eval`` command line (``ragsuite.cli.main``, which the ``bench`` command
    passes in): the CLI sits above this module, so it is handed down rather than imported here."""
    codes = {}
    for i, cell in enumerate(cells, start=1):
        where = f"{cell.program} on {cell.dataset} ({cell.lm}, {cell.retriever})"
        log(f"[{i}/{len(cells)}] {where} -> {cell.out_dir}")
        codes[cell] = run_eval(eval_argv(spec, cell, extra))
        if codes[cell] != 0:
            log(f"[{i}/{len(cells)}] failed with exit code {codes[cell]}; continuing with the next cell")
    return codes


# ------------------------------------------------------------------------------------------ published numbers
def _published_file() -> dict[str, Any]:
    text = resources.files("ragsuite.data").joinpath("published.json").read_text(encoding="utf-8")
    return json.loads(text)


def _published() -> dict[str, Any]:
    return _published_file()["tables"]


def published_tables() -> list[str]:
    """Ids of the tables whose published numbers ship with ragsuite."""
    return list(_published())


def published_table(table: str) -> dict[str, Any]:
    """One published table: its source (paper, table, retriever, evaluation), layout, backbones and rows."""
    try:
        return _published()[table]
    except KeyError:
        raise ConfigError(f"no published table {table!r}; known: {', '.join(published_tables())}") from None


def unrunnable_tables() -> list[dict[str, str]]:
    """The seed papers' tables no spec can run, each with the reason (paper, table, reason)."""
    return list(_published_file().get("not_runnable", []))


def check_backbone(table: str, backbone: str) -> str:
    """``backbone`` when ``table`` has published rows for it.

    Raises:
        ConfigError: Naming the table's backbones.
    """
    known = published_table(table)["backbones"]
    if backbone not in known:
        raise ConfigError(f"{table} has no published backbone {backbone!r}; choose from {', '.join(known)}")
    return backbone


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _model_name(lm: str) -> str:
    """The model part of an LM spec: ``vllm:NAME@URL`` and ``openai/NAME`` give NAME."""
    name = lm.split("@", 1)[0]
    name = name.split(":", 1)[1] if re.match(r"^[a-z0-9_-]+:", name) and "://" not in name else name
    return name.rsplit("/", 1)[-1] if "/" in name and not name.startswith(("/", ".")) else name


def backbone_for(table: str, lm: str, chosen: str | None = None) -> str | None:
    """The published backbone whose rows go beside ``lm``: ``chosen`` when given, else the backbone one of
    whose names the LM's model name contains (the longest such name), else ``None``."""
    if chosen is not None:
        return check_backbone(table, chosen)
    model = _squash(_model_name(lm))
    best: tuple[int, str | None] = (0, None)
    for backbone, info in published_table(table)["backbones"].items():
        for name in info.get("match", []):
            if _squash(name) and _squash(name) in model and len(_squash(name)) > best[0]:
                best = (len(_squash(name)), backbone)
    return best[1]


def published_rows(table: str, backbone: str | None) -> dict[str, Any]:
    """The published rows of ``table`` for ``backbone`` (rows shared by every backbone included); none for
    no backbone."""
    if backbone is None:
        return {}
    source = published_table(table)
    return {**source.get("rows", {}), **source["backbones"][backbone]["rows"]}


def _published_row_name(table: str, row: str) -> str:
    return published_table(table).get("compare", {}).get(row, row)


# ------------------------------------------------------------------------------------------ our numbers
def cell_scores(out_dir: Path) -> dict[str, Any] | None:
    """Per-metric means (percent), 95% bootstrap intervals and steps per question of a finished cell, or
    ``None`` when it has no summary. Failed questions score 0, so a failing cell cannot look better."""
    summary_path = out_dir / "summary.json"
    records_path = out_dir / "records.jsonl"
    if not summary_path.is_file() or not records_path.is_file():
        return None
    summary = json.loads(summary_path.read_text(encoding="utf-8"))
    latest: dict[str, dict[str, Any]] = {}  # a retried question's last record replaces its earlier ones
    with records_path.open(encoding="utf-8", errors="replace", newline="\n") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a torn last line from a kill: that question was not finished
            if isinstance(record, dict) and "id" in record:
                latest[str(record["id"])] = record
    if not latest:
        return None
    per_metric: dict[str, list[float]] = {}
    for record in latest.values():
        metrics = record.get("metrics") if not record.get("error") else None
        for name in summary.get("metrics", {}):
            per_metric.setdefault(name, []).append(float((metrics or {}).get(name, 0.0)))
    scores: dict[str, Any] = {"n": len(latest), "errors": summary.get("errors", 0)}
    for name, values in per_metric.items():
        low, high = bootstrap_ci(values)
        scores[name] = (100 * sum(values) / len(values), 100 * low, 100 * high)
    # Costs per answered question, as the eval summary reports them (None when nothing was answered).
    cost = summary.get("cost") or {}
    scores["cost"] = cost
    scores["steps"] = (cost.get("steps"), None, None)
    return scores


#: The cost columns printed beside quality: (label, summary cost keys summed).
COST_COLUMNS = (
    ("LM calls/q", ("lm_calls",)),
    ("requests/q", ("lm_requests",)),
    ("tokens/q", ("input_tokens", "output_tokens")),
    ("retr./q", ("retrievals",)),
    ("steps/q", ("steps",)),
)


def cost_table(spec: BenchSpec, cells: Sequence[Cell], *, fmt: TableFormat = "md") -> str:
    """Cost per answered question of every cell: LM calls, provider requests, tokens, retrievals, steps."""
    header = ["program", "dataset", *(label for label, _ in COST_COLUMNS)]
    several = len({(c.lm, c.retriever) for c in cells}) > 1
    rows = []
    for cell in cells:
        scores = cell_scores(cell.out_dir)
        cost = (scores or {}).get("cost") or {}
        label = f"{cell.program} ({cell.lm}, {cell.retriever})" if several else cell.program
        values = []
        for _, keys in COST_COLUMNS:
            parts = [cost.get(key) for key in keys]
            values.append(None if any(v is None for v in parts) else sum(parts))
        rows.append(
            [
                label,
                cell.dataset,
                *(_fmt(v, 0 if "tokens" in k[0] else 2) for v, k in zip(values, COST_COLUMNS, strict=True)),
            ]
        )
    return render_table(header, rows, fmt)


# ------------------------------------------------------------------------------------------ the table
def _fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _digits(source: Mapping[str, Any] | None, dataset: str, metric: str) -> int:
    """Decimals of a column: as many as the paper prints there (HANRAG: 49.12), else 1 (steps: 2)."""
    for info in [{"rows": (source or {}).get("rows", {})}, *(source or {}).get("backbones", {}).values()]:
        for row in info["rows"].values():
            printed = row.get(dataset, {}).get(metric)
            if printed is not None:
                return len(str(printed).partition(".")[2])
    return 2 if metric == "steps" else 1


def _lms(cells: Sequence[Cell]) -> list[str]:
    return list(dict.fromkeys(cell.lm for cell in cells))


def table(
    spec: BenchSpec,
    cells: Sequence[Cell],
    *,
    fmt: TableFormat = "md",
    with_ci: bool = False,
    backbone: str | None = None,
) -> str:
    """The grid as one table in the published table's layout (or every dataset metric without one): for each
    row and LM/retriever, our score, the published one as printed and the difference, per column.

    ``backbone`` (default: the spec's, else matched to each LM) picks the published rows shown."""
    source = published_table(spec.table) if spec.table else None
    chosen = backbone or spec.backbone
    from ragsuite.data.datasets import get_dataset_info

    columns: list[tuple[str, str]] = []
    for dataset in spec.datasets:
        metrics = (source or {}).get("layout", {}).get(dataset) or [
            *get_dataset_info(dataset).metrics,
            "steps",
        ]
        columns += [(dataset, m) for m in metrics]
    header = ["program", *(f"{d} {m}" for d, m in columns)]
    groups: dict[tuple[str, str, str], dict[str, Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.program, cell.lm, cell.retriever), {})[cell.dataset] = cell
    several = len({(c.lm, c.retriever) for c in cells}) > 1
    averages = (source or {}).get("averages", {})
    lines: list[list[str]] = []
    for (program, lm, retriever), by_dataset in groups.items():
        label = f"{program} ({lm}, {retriever})" if several else program
        which = backbone_for(spec.table, lm, chosen) if spec.table else None
        published = (
            published_rows(spec.table, which).get(_published_row_name(spec.table, program), {})
            if (spec.table)
            else {}
        )
        paper_label = (
            f"  published ({source['backbones'][which]['label']})" if source and which else "  published"
        )
        ours_row, paper_row, diff_row = [label], [paper_label], ["  difference"]
        for dataset, metric in columns:
            scores = cell_scores(by_dataset[dataset].out_dir) if dataset in by_dataset else None
            printed = published.get(dataset, {}).get(metric)
            # As many decimals as the paper prints in this cell (HANRAG: 49.12), else in this column.
            digits = (
                len(str(printed).partition(".")[2])
                if printed is not None
                else _digits(source, dataset, metric)
            )
            interval = None
            if metric == "avg":
                # Ours only where the paper's average is the mean of metrics it prints beside it.
                names = averages.get(dataset)
                ours = (
                    _mean([scores[m][0] for m in names])
                    if names and scores and all(m in scores for m in names)
                    else None
                )
            else:
                value = scores.get(metric) if scores else None
                ours, interval = (value[0], value[1:]) if value else (None, None)
            cell_text = _fmt(ours, digits)
            if with_ci and interval and interval[0] is not None:
                cell_text += f" [{_fmt(interval[0], digits)}, {_fmt(interval[1], digits)}]"
            ours_row.append(cell_text)
            paper_row.append("–" if printed is None else str(printed))
            diff_row.append(_fmt(None if ours is None or printed is None else ours - float(printed), digits))
        lines.append(ours_row)
        if spec.table:
            lines += [paper_row, diff_row]
    return render_table(header, lines, fmt)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def notes(spec: BenchSpec, cells: Sequence[Cell], *, backbone: str | None = None) -> list[str]:
    """What the table leaves out and why: LMs without published rows, averages of ours not computed, and
    the paper's rows and columns the spec does not run."""
    if not spec.table:
        return []
    source = published_table(spec.table)
    chosen = backbone or spec.backbone
    lines = []
    shown = {_published_row_name(spec.table, row) for row in spec.programs}
    listed = {entry["row"] for entry in source.get("not_run", []) if "row" in entry}
    for lm in _lms(cells):
        which = backbone_for(spec.table, lm, chosen)
        if which is None:
            lines.append(
                f"No published rows beside {lm}: its model name matches no backbone of {spec.table}; pass "
                f"--backbone with one of {', '.join(source['backbones'])} to compare with that one."
            )
            continue
        others = sorted(set(published_rows(spec.table, which)) - shown - listed)
        if others:
            lines.append(
                f"Published for {source['backbones'][which]['label']} but not in this spec: "
                f"{', '.join(others)}."
            )
    for dataset, reasons in source.get("not_computed", {}).items():
        if dataset in spec.datasets:
            for metric, reason in reasons.items():
                lines.append(f"Ours not computed: {dataset} {metric} ({reason}).")
    for entry in source.get("not_run", []):
        kind = "row" if "row" in entry else "column"
        lines.append(f"Not run: {kind} {entry[kind]} ({entry['reason']}).")
    return lines


def source_note(spec: BenchSpec) -> str:
    """Where the published column comes from (paper, table, retriever, evaluation set, backbones)."""
    if not spec.table:
        return ""
    source = published_table(spec.table)
    backbones = "; ".join(info["label"] for info in source["backbones"].values())
    remarks = "".join(f" Note: {remark}." for remark in source.get("remarks", []))
    return (
        f"Published: {source['paper']}, {source['table']}; retriever {source['retriever']}; evaluated on "
        f"{source['evaluation']}. Backbones with published rows: {backbones}.{remarks}"
    )


__all__ = [
    "BenchSpec",
    "Cell",
    "Variant",
    "backbone_for",
    "cell_scores",
    "check_backbone",
    "cost_table",
    "eval_argv",
    "load_spec",
    "notes",
    "plan",
    "published_rows",
    "published_table",
    "published_tables",
    "run",
    "source_note",
    "table",
    "unrunnable_tables",
]
