"""The BM25-against-bm25s benchmark's report (``benchmarks/retrieval.py --out`` / ``--report``): rendered
from a records file alone, and the manual's table is the report of the committed records, not a paste."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    """``benchmarks/retrieval.py`` as a module."""
    return load_benchmark("retrieval")


def _column(r5: float, r10: float, batch: list[float], one: list[float] | None = None) -> dict:
    column = {"recall@5": r5, "recall@10": r10, "qps_batch": sorted(batch)[len(batch) // 2]}
    column["qps_batch_runs"] = batch
    if one is not None:
        column["qps_one"], column["qps_one_runs"] = sorted(one)[len(one) // 2], one
    return column


def _spread(median: float) -> list[float]:
    """Three timing runs: the median and 20% either side of it."""
    return [0.8 * median, median, 1.2 * median]


@pytest.fixture(scope="module")
def records(run_facts) -> dict:
    """A synthetic records file: two datasets, three timing runs per column."""
    return run_facts(
        {"ragsuite": "0.1.0", "bm25s": "0.3.16", "numba": None},
        benchmark="retrieval",
        command="python benchmarks/retrieval.py --repeats 3 --data-dir DEV --out r.json",
        wall_s=150.0,
        settings={
            "datasets": ["hotpotqa", "nq"],
            "data_dir": "DEV",
            "repeats": 3,
            "k": 10,
            "columns": ["plain bm25s", "plain bm25s numba", "ragsuite BM25", "ragsuite BM25 ids"],
            "plain_bm25s": {
                "stemmer": "english",
                "stopwords": "en",
                "text": "title + text",
                "method": "lucene",
                "k1": 1.5,
                "b": 0.75,
            },
        },
        rows=[
            {
                "dataset": "hotpotqa",
                "passages": 7616,
                "questions": 300,
                "columns": {
                    "plain bm25s": _column(0.775, 0.8866, [4000.0, 5000.0, 6000.0], [2000.0, 2000.0, 2000.0]),
                    "plain bm25s numba": _column(0.775, 0.8866, [10000.0, 10000.0, 5000.0], [4000.0] * 3),
                    "ragsuite BM25": _column(
                        0.79, 0.892, [8000.0, 8000.0, 8000.0], [6000.0, 6000.0, 12000.0]
                    ),
                    "ragsuite BM25 ids": _column(0.79, 0.892, [20000.0, 20000.0, 20000.0]),
                },
            },
            {
                "dataset": "nq",
                "passages": 2588,
                "questions": 497,
                "columns": {
                    "plain bm25s": _column(0.92, 0.962, _spread(7000.0), _spread(3000.0)),
                    "plain bm25s numba": _column(0.92, 0.962, _spread(40000.0), _spread(6000.0)),
                    "ragsuite BM25": _column(0.94, 0.962, _spread(14000.0), _spread(9000.0)),
                    "ragsuite BM25 ids": _column(0.94, 0.962, _spread(44000.0)),
                },
            },
        ],
    )


def test_the_report_is_rendered_from_the_records_alone(tmp_path: Path, bench, records, capsys) -> None:
    path = tmp_path / "bm25-vs-bm25s.json"
    path.write_text(json.dumps(records))
    assert bench.main(["--report", str(path)]) == 0  # reads the file, runs nothing
    report = bench.report(json.loads(path.read_text()))
    assert capsys.readouterr().out.strip() == report
    lines = report.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| dataset |"))
    columns = [cell.strip() for cell in lines[header].strip("|").split("|")]
    assert columns[:7] == [
        "dataset", "passages", "questions", "R@5 plain", "R@5 ragsuite", "R@10 plain", "R@10 ragsuite"
    ]  # fmt: skip
    body = lines[header + 2 : header + 4]
    assert all(len(line.strip("|").split("|")) == len(columns) for line in body)
    # q/s are the medians; ratios: ids 20,000 / numba 10,000, passages 8,000 / 10,000, 1-by-1 6,000 / 2,000
    assert body[0] == (
        "| hotpotqa | 7616 | 300 | 0.775 | **0.790** | 0.887 | **0.892** | 5,000 | 10,000 | 20,000 | 2.00x "
        "| 8,000 | 0.80x | 2,000 | 4,000 | 6,000 | 3.00x |"
    )
    sentence = lines[0]
    assert f"`{records['command']}`" in sentence and "(2 min)" in sentence
    assert "2 cores (load average 1.2/1.0/0.5 at its start, nice 10" in sentence
    assert "ragsuite 0.1.0, bm25s 0.3.16)" in sentence  # a package that was not installed is left out
    assert "q/s the median of 3 interleaved timing runs" in sentence
    # The runs' spread around their medians: 5,000 against 10,000 is -50%, 12,000 against 6,000 +100%; of
    # the 42 runs, 24 are at their median and 16 are 20% off it.
    assert "single runs -50% to +100% off their median, 9 in 10 of them within 20%" in sentence
    assert (
        'Snowball "english" stemmer, bm25s\' "en" stopwords, title + text, method lucene, k1 = 1.5'
        in sentence
    )
    across = lines[-1]
    assert "Recall@5, ragsuite against plain bm25s: +1.5 to +2.0 points (higher on 2 of 2 datasets)" in across
    assert "recall@10: +0.0 to +0.5 points" in across  # nq's 0.962 against 0.962: no "-0.0"
    assert "ragsuite answers 3.00x as many queries per second as plain bm25s" in across
    assert "`batch_ids` answers 1.10 to 2.00x as many and `batch` 0.35 to 0.80x." in across


def test_the_printed_table_is_the_report_s_table(bench, records) -> None:
    """The table the script prints after a run and the report's are one function's output."""
    assert f"\n\n{bench.markdown(records['rows'])}\n\n" in bench.report(records)


def test_docs_go_with_report_and_need_the_page_s_markers(
    tmp_path: Path, bench, records, report_into_page
) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(records))
    assert report_into_page(bench.main, path, "bm25-vs-bm25s") == (
        f"a\n<!-- bm25-vs-bm25s:start -->\n{bench.report(records)}\n<!-- bm25-vs-bm25s:end -->\nb\n"
    )
    with pytest.raises(SystemExit) as refused:  # a measuring run does not write the page
        bench.main(["--datasets", "nq", "--docs", str(tmp_path / "page.md")])
    assert refused.value.code == 2


@pytest.mark.slow
def test_a_run_writes_records_its_report_renders(tmp_path: Path, bench, data_dir: Path, capsys) -> None:
    out = tmp_path / "out" / "bm25.json"
    argv = ["--datasets", "strategyqa", "--repeats", "2", "--data-dir", str(data_dir), "--out", str(out)]
    assert bench.main(argv) == 0
    printed = capsys.readouterr().out
    records = json.loads(out.read_text(encoding="utf-8"))
    assert records["command"] == "python benchmarks/retrieval.py " + " ".join(argv)
    assert records["settings"]["repeats"] == 2 and records["settings"]["k"] == bench.K
    assert records["settings"]["plain_bm25s"]["k1"] > 0 and records["machine"]["cpus"] >= 1
    assert records["machine"]["packages"]["bm25s"]
    [row] = records["rows"]
    assert row["dataset"] == "strategyqa" and row["questions"] == 40
    for column in row["columns"].values():
        assert len(column["qps_batch_runs"]) == 2 and 0 <= column["recall@5"] <= column["recall@10"] <= 1
    assert bench.markdown(records["rows"]) in printed
    assert bench.markdown(records["rows"]) in bench.report(records)


def test_the_docs_table_is_the_report_of_the_committed_records(bench, repo_root) -> None:
    """docs/retrieval.md shows the report rendered from benchmarks/results/bm25-vs-bm25s.json, not a paste."""
    records = repo_root / "benchmarks" / "results" / "bm25-vs-bm25s.json"
    page = (repo_root / "docs" / "retrieval.md").read_text(encoding="utf-8")
    shown = page.split("<!-- bm25-vs-bm25s:start -->\n", 1)[1].split("\n<!-- bm25-vs-bm25s:end -->", 1)[0]
    data = json.loads(records.read_text(encoding="utf-8"))
    assert shown == bench.report(data), (
        "rerun: python benchmarks/retrieval.py --report benchmarks/results/bm25-vs-bm25s.json "
        "--docs docs/retrieval.md"
    )
    assert {row["dataset"] for row in data["rows"]} == {
        "hotpotqa", "2wikimultihopqa", "musique", "strategyqa", "asqa", "nq"
    }  # fmt: skip
