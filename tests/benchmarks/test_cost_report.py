# ruff: noqa: E501  (rows of test records read best one to a line)
"""The DeepNote cost benchmark's parts: the official prompts' calls rebuilt from a record's trace, and the
report rendered from a run folder's records alone."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    """``benchmarks/real_lm.py`` as a module."""
    return load_benchmark("real_lm")


PASSAGES = {pid: SimpleNamespace(title=f"T{pid}", text=f"text {pid}") for pid in "abcdef"}
RECORD = {
    "id": "q1",
    "question": "Q?",
    "trace": [
        {"stage": "note_init", "passage_ids": ["a", "b"], "note": "N0"},
        {"stage": "step", "queries": ["x", "y"], "passage_ids": ["c"], "note": "N1", "accepted": True},
        {"stage": "step", "queries": ["z"], "passage_ids": ["d"], "note": None, "accepted": False},
        {"stage": "step", "queries": ["w"], "passage_ids": ["e"], "note": "N3", "accepted": False},
        {"stage": "answer", "answer": "A"},
    ],
}


def test_the_official_calls_follow_the_record_s_steps(bench) -> None:
    calls = bench.official_calls(RECORD, PASSAGES)
    assert [stage for stage, _ in calls] == [
        "note_init",
        "query_refine", "note_update", "note_compare",  # step 1: accepted, N1 becomes the best note
        "query_refine", "note_update",  # step 2: the update did not parse, so no comparison
        "query_refine", "note_update", "note_compare",
        "answer",
    ]  # fmt: skip
    filled = dict(enumerate(text for _, text in calls))
    assert (
        filled[0]
        == "Q?Passage #1 Title: Ta\nPassage #1 Text: text a \n\nPassage #2 Title: Tb\nPassage #2 Text: text b \n\n"
    )
    assert filled[1] == "Q?N0[]" and filled[3] == "Q?N0N1"
    assert filled[4] == "Q?N1['x\\ny']"  # the best note moved on; the asked list holds each step's reply
    assert filled[9] == "N1Q?"  # the answer reads the best note: step 3's update was rejected


def _write(folder: Path, name: str, rows: list[dict]) -> None:
    (folder / name).write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_the_report_is_rendered_from_the_records_of_chunks_both_arms_ran(tmp_path: Path, bench) -> None:
    server = {"parallel": 2, "ctx": 8192, "threads": 1, "batch_threads": 2}
    chunks = [
        {"arm": "before", "chunk": 0, "questions": 2, "wall": 100.0, "server": server, "official_prompt_tokens": [900, 1100]},
        {"arm": "after", "chunk": 0, "questions": 2, "wall": 40.0, "server": server, "official_prompt_tokens": [800, 1200]},
        {"arm": "before", "chunk": 2, "questions": 2, "wall": 999.0, "server": server, "official_prompt_tokens": [1, 1]},
    ]  # fmt: skip
    _write(tmp_path, "chunks.jsonl", chunks)
    for arm, prompt in (("before", 1500), ("after", 1000)):
        requests = [
            {"chunk": 0, "stage": "note_init", "prompt_tokens": prompt, "cached_tokens": 100, "completion_tokens": 50, "seconds": 5.0},
            {"chunk": 0, "stage": "answer", "prompt_tokens": prompt, "cached_tokens": 0, "completion_tokens": 10, "seconds": 1.0},
            {"chunk": 2, "stage": "answer", "prompt_tokens": 10**6, "cached_tokens": 0, "completion_tokens": 1, "seconds": 1.0},
        ]  # fmt: skip
        _write(tmp_path, f"{arm}.requests.jsonl", requests)
        records = [
            {"id": "q1", "metrics": {"accuracy": 1.0, "f1": 0.5}},
            {"id": "q2", "metrics": {"accuracy": 0.0, "f1": 0.0}},
        ]
        _write(
            tmp_path,
            f"{arm}.records.jsonl",
            records + ([{"id": "q3", "metrics": {"accuracy": 1.0, "f1": 1.0}}] if arm == "before" else []),
        )
    report = bench.cost_report(tmp_path, command="python benchmarks/real_lm.py cost --out X")
    lines = report.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("| settings | slots")))
    assert lines[header + 1].startswith("|---|")  # one table, with its separator row
    before, after = lines[header + 2], lines[header + 3]
    # Only chunk 0 counts (chunk 2 ran in one arm): 100 s over 2 questions; 3,000 prompt tokens for 2 questions
    # against 2,000 official ones.
    assert before.startswith("| before | 2, 1/2 | 50.0 | 1,500 | 3% | 1.50x | 30 | 1.0 | 50 [")
    assert after.startswith("| after | 2, 1/2 | 20.0 | 1,000 | 5% | 1.00x | 30 | 1.0 | 50 [")
    assert "after over before: **0.40**" in report
    assert "smoke run" in report and "`python benchmarks/real_lm.py cost --out X`" in report
    assert "| after | note_init | 0.5 | 1,000 | 10% | 50 (50) | 2.5 |" in report


def test_a_folder_without_a_chunk_run_by_every_arm_reports_nothing(tmp_path: Path, bench) -> None:
    _write(tmp_path, "chunks.jsonl", [{"arm": "before", "chunk": 0, "questions": 2, "wall": 1.0}])
    assert bench.cost_report(tmp_path) == "no chunk was run by every arm"
    # Without "before", the baseline every ratio is over, nothing is compared.
    _write(tmp_path, "chunks.jsonl", [
        {"arm": "after", "chunk": 0, "questions": 2, "wall": 1.0},
        {"arm": "compiled", "chunk": 0, "questions": 2, "wall": 1.0, "program_file": "p.json"},
    ])  # fmt: skip
    assert bench.cost_report(tmp_path) == "no chunk was run by every arm"
    # Arms that ran different chunks share none.
    _write(tmp_path, "chunks.jsonl", [
        {"arm": "before", "chunk": 0, "questions": 2, "wall": 1.0},
        {"arm": "tuned", "chunk": 2, "questions": 2, "wall": 1.0, "program_file": "p.json"},
    ])  # fmt: skip
    assert bench.cost_report(tmp_path) == "no chunk was run by every arm"


def test_a_compiled_file_is_a_third_arm_with_after_s_settings_and_its_own_ratio(
    tmp_path: Path, bench
) -> None:
    arms = bench.cost_arms(Path("deepnote.json"))
    assert list(arms) == ["before", "after", "compiled"]
    assert arms["compiled"]["server"] == arms["after"]["server"] and arms["compiled"]["adapter"] is None
    assert arms["compiled"]["program_file"] == Path("deepnote.json") and "program_file" not in arms["after"]
    assert list(bench.cost_arms(None)) == ["before", "after"]

    server = {"parallel": 2, "ctx": 8192, "threads": 1, "batch_threads": 2}
    walls = {"before": 100.0, "after": 60.0, "compiled": 30.0}
    _write(tmp_path, "chunks.jsonl", [
        {"arm": arm, "chunk": 0, "questions": 2, "wall": wall, "server": server, "official_prompt_tokens": [1, 1],
         "dataset": "2wikimultihopqa", "program_file": "runs/deepnote.json" if arm == "compiled" else None}
        for arm, wall in walls.items()
    ])  # fmt: skip
    for arm in walls:
        _write(tmp_path, f"{arm}.requests.jsonl", [
            {"chunk": 0, "stage": "answer", "prompt_tokens": 10, "cached_tokens": 0, "completion_tokens": 1, "seconds": 1.0},
        ])  # fmt: skip
        _write(tmp_path, f"{arm}.records.jsonl", [
            {"id": qid, "metrics": {"accuracy": 1.0, "f1": 1.0}} for qid in ("q1", "q2")
        ])  # fmt: skip
    report = bench.cost_report(tmp_path)
    assert report.startswith("DeepNote on 2 2wikimultihopqa dev questions, the 3 settings")
    assert "compiled: the program file `runs/deepnote.json` with after's settings." in report
    # One chunk: each interval is the ratio itself.
    assert "after over before: **0.60** [0.60, 0.60]; compiled over before: **0.30** [0.30, 0.30]" in report
    assert "| compiled | 2, 1/2 | 15.0 |" in report


def test_a_tuned_file_runs_beside_before_alone_with_after_s_settings(tmp_path: Path, bench) -> None:
    arms = bench.cost_arms(tuned=Path("best.json"), settings=("before",))
    assert list(arms) == ["before", "tuned"]
    assert arms["tuned"]["server"] == bench.COST_ARMS["after"]["server"] and arms["tuned"]["adapter"] is None
    assert arms["tuned"]["program_file"] == Path("best.json")
    # "before" is the baseline: it runs even when --settings leaves it out.
    assert list(bench.cost_arms(settings=("after",))) == ["before", "after"]
    assert list(bench.cost_arms(Path("c.json"), Path("t.json"))) == ["before", "after", "compiled", "tuned"]

    server = {"parallel": 2, "ctx": 8192, "threads": 1, "batch_threads": 2}
    walls = {"before": {0: 100.0, 2: 80.0}, "tuned": {0: 40.0, 2: 32.0}}
    _write(tmp_path, "chunks.jsonl", [
        {"arm": arm, "chunk": chunk, "questions": 2, "wall": wall, "server": server,
         "official_prompt_tokens": [1, 1], "dataset": "hotpotqa",
         "program_file": "runs/best.json" if arm == "tuned" else None}
        for arm, by_chunk in walls.items() for chunk, wall in by_chunk.items()
    ])  # fmt: skip
    for arm in walls:
        _write(tmp_path, f"{arm}.requests.jsonl", [
            {"chunk": chunk, "stage": "answer", "prompt_tokens": 10, "cached_tokens": 0, "completion_tokens": 1, "seconds": 1.0}
            for chunk in (0, 2)
        ])  # fmt: skip
        _write(tmp_path, f"{arm}.records.jsonl", [
            {"id": qid, "metrics": {"accuracy": 1.0, "f1": 1.0}} for qid in ("q1", "q2", "q3", "q4")
        ])  # fmt: skip
    report = bench.cost_report(tmp_path)
    assert report.startswith("DeepNote on 4 hotpotqa dev questions, the 2 settings")
    assert "tuned: the program file `runs/best.json` with after's settings." in report
    assert "compiled:" not in report and "| after |" not in report
    # Every chunk at 0.4 of before's: the interval cannot move.
    assert "tuned over before: **0.40** [0.40, 0.40]" in report
    assert "| tuned | 2, 1/2 | 18.0 |" in report


def test_the_seconds_ratio_s_interval_resamples_chunks_in_pairs(bench) -> None:
    # 40 s over 50 s; a resample of chunk 0 alone gives 10/20, of chunk 2 alone 30/30.
    assert bench.wall_ratio_ci({0: 10.0, 2: 30.0}, {0: 20.0, 2: 30.0}) == (0.5, 1.0)
    # A chunk slow for both settings moves both sums: the ratio holds at 0.5 whatever is resampled.
    assert bench.wall_ratio_ci({0: 5.0, 2: 500.0}, {0: 10.0, 2: 1000.0}) == (0.5, 0.5)


def test_a_report_of_another_folder_does_not_name_the_committed_run_s_command(
    tmp_path: Path, bench, capsys
) -> None:
    server = {"parallel": 2, "ctx": 8192, "threads": 1, "batch_threads": 2}
    _write(tmp_path, "chunks.jsonl", [
        {"arm": arm, "chunk": 0, "questions": 1, "wall": 1.0, "server": server, "official_prompt_tokens": [1]}
        for arm in ("before", "after")
    ])  # fmt: skip
    for arm in ("before", "after"):
        _write(tmp_path, f"{arm}.requests.jsonl", [
            {"chunk": 0, "stage": "answer", "prompt_tokens": 1, "cached_tokens": 0, "completion_tokens": 1, "seconds": 1.0},
        ])  # fmt: skip
        _write(tmp_path, f"{arm}.records.jsonl", [{"id": "q1", "metrics": {"accuracy": 1.0, "f1": 1.0}}])
    assert bench.main(["cost", "--report", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("DeepNote on 1 hotpotqa dev questions") and "Command:" not in printed
    assert bench.COST_COMMAND not in printed


def test_the_docs_table_is_the_report_of_the_committed_records(bench, repo_root) -> None:
    """docs/local-lm.md shows the cost report rendered from the committed records, not a paste."""
    page = (repo_root / "docs" / "local-lm.md").read_text(encoding="utf-8")
    shown = page.split("<!-- deepnote-cost:start -->\n", 1)[1].split("\n<!-- deepnote-cost:end -->", 1)[0]
    report = bench.cost_report(repo_root / bench.COST_OUT, command=bench.COST_COMMAND)
    assert "no chunk" not in report and "smoke run" not in report
    assert shown == report, (
        "rerun: " + bench.COST_COMMAND.split(" --data-dir")[0] + " --report --out ... --docs ..."
    )


def test_a_resumed_run_appends_to_the_committed_gzip_records_rather_than_beside_them(bench, tmp_path) -> None:
    import gzip

    chunks = tmp_path / "chunks.jsonl"
    packed = tmp_path / "chunks.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"arm": "before", "chunk": 0}\n'))
    bench.append_jsonl(chunks, [{"arm": "before", "chunk": 2}])
    assert not chunks.exists()
    assert [row["chunk"] for row in bench.read_jsonl(chunks)] == [0, 2]
    fresh = tmp_path / "fresh.jsonl"
    bench.append_jsonl(fresh, [{"arm": "after", "chunk": 0}])
    assert fresh.exists() and bench.read_jsonl(fresh) == [{"arm": "after", "chunk": 0}]


def test_plain_and_gzip_records_side_by_side_are_refused_rather_than_half_read(bench, tmp_path) -> None:
    import gzip

    (tmp_path / "chunks.jsonl").write_text('{"arm": "before", "chunk": 2}\n')
    (tmp_path / "chunks.jsonl.gz").write_bytes(gzip.compress(b'{"arm": "before", "chunk": 0}\n'))
    with pytest.raises(SystemExit, match=r"both .*chunks\.jsonl and chunks\.jsonl\.gz exist"):
        bench.read_jsonl(tmp_path / "chunks.jsonl")
