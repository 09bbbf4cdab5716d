"""The eval-engines benchmark's report: rendered from a records file alone, and the manual's table is the
report of the committed records, not a paste."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    """``benchmarks/eval_engines.py`` as a module."""
    return load_benchmark("eval_engines")


def _row(engine: str, connections: int, wall: float) -> dict:
    return {
        "engine": engine,
        "concurrency": 8,
        "connections": connections,
        "questions": 8,
        "requests": 40,
        "ideal": 3.0,
        "wall": wall,
        "cpu_per_call_ms": 4.25,
        "peak_rss_mib": 120.4,
        "base_rss_mib": 75.6,
        "threads": 42,
        "question_s": 3.5,
    }


@pytest.fixture(scope="module")
def records(run_facts) -> dict:
    """A synthetic records file: two settings, each engine at each."""
    return run_facts(
        {"dspy": "3.4.1", "litellm": "1.106.2", "aiohttp": None},
        benchmark="eval_engines",
        command="python benchmarks/eval_engines.py --concurrency 8 --per-slot 1 --max-connections 2 default",
        wall_s=42.0,
        settings={
            "latency": 1.0,
            "calls": 2,
            "fanout": 3,
            "per_slot": 1,
            "concurrency": [8],
            "engines": ["threads", "async"],
            "max_connections": [2, None],
        },
        rows=[
            _row("threads", 2, 12.0),
            _row("async", 2, 15.0),
            _row("threads", 100, 4.0),
            _row("async", 100, 6.0),
        ],
    )


def test_the_report_is_rendered_from_the_records_alone(tmp_path: Path, bench, records) -> None:
    path = tmp_path / "eval-engines.json"
    path.write_text(json.dumps(records))
    assert bench.main(["--report", str(path)]) == 0  # reads the file, runs nothing
    report = bench.report(json.loads(path.read_text()))
    lines = report.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| engine |"))
    columns = [cell.strip() for cell in lines[header].strip("|").split("|")]
    assert columns[:8] == [
        "engine", "concurrent questions", "LM connections", "questions", "LM calls", "ideal (s)",
        "actual (s)", "efficiency",
    ]  # fmt: skip
    assert lines[header + 1] == "|" + "---|" * len(columns)
    body = lines[header + 2 :]
    assert len(body) == 4 and all(len(line.strip("|").split("|")) == len(columns) for line in body)
    # efficiency = ideal / actual: 3 s / 12 s with 2 connections, 3 s / 4 s with 100
    assert body[0] == "| threads | 8 | 2 | 8 | 40 | 3.00 | 12.00 | 0.25 | 3.50 | 4.25 | 120 | 76 | 42 |"
    assert body[2].startswith("| threads | 8 | 100 | 8 | 40 | 3.00 | 4.00 | 0.75 |")
    assert body[3].split("|")[8].strip() == "0.50"
    sentence = lines[0]
    assert f"`{records['command']}`" in sentence and "(42 s)" in sentence
    assert "2 cores (load average 1.2/1.0/0.5 at its start, nice 10" in sentence
    assert "dspy 3.4.1, litellm 1.106.2)" in sentence  # a package that was not installed is left out
    assert "answering 8 questions (`--per-slot 1`, fewer than the default 2" in sentence
    assert "× 3 calls on a question's path × 1 s" in sentence and "(ideal 3 s)" in sentence


def test_the_printed_table_is_the_report_s_table(bench, records) -> None:
    """The table the script prints after a run and the report's are one function's output."""
    assert bench.report(records).endswith("\n".join(bench.table(records["rows"])))


def test_docs_without_markers_are_refused(tmp_path: Path, bench, records, report_into_page) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(records))
    assert (
        report_into_page(bench.main, path, "eval-engines")
        == f"a\n<!-- eval-engines:start -->\n{bench.report(records)}\n<!-- eval-engines:end -->\nb\n"
    )


def test_the_docs_table_is_the_report_of_the_committed_records(bench, repo_root) -> None:
    """docs/evaluate.md shows the report rendered from benchmarks/results/eval-engines.json, not a paste."""
    records = repo_root / "benchmarks" / "results" / "eval-engines.json"
    page = (repo_root / "docs" / "evaluate.md").read_text(encoding="utf-8")
    shown = page.split("<!-- eval-engines:start -->\n", 1)[1].split("\n<!-- eval-engines:end -->", 1)[0]
    report = bench.report(json.loads(records.read_text(encoding="utf-8")))
    assert shown == report, (
        "rerun: python benchmarks/eval_engines.py --report benchmarks/results/eval-engines.json "
        "--docs docs/evaluate.md"
    )
    data = json.loads(records.read_text(encoding="utf-8"))
    assert {(row["concurrency"], row["connections"]) for row in data["rows"]} == {(256, 100), (256, 1024)}
