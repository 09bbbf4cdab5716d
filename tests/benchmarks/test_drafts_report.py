"""The drafting benchmark's parts: the report rendered from a run folder's replays alone, a run that never
appends to an earlier one, and flags the pinned llama-server takes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    """``benchmarks/drafts.py`` as a module."""
    return load_benchmark("drafts")


def _replay(arm: str, turn: int, wall: float, *, drafted: float = 0.0, accepted: float = 0.0) -> dict:
    return {
        "pass": turn, "arm": arm, "wall": wall, "requests": 10,
        "prompt_tokens_total": 1000.0, "prompt_seconds_total": 10.0,
        "tokens_predicted_total": 200.0, "tokens_predicted_seconds_total": 20.0 if arm == "none" else 10.0,
        "spec_decode_num_draft_tokens_total": drafted, "spec_decode_num_accepted_tokens_total": accepted,
    }  # fmt: skip


def test_the_report_sets_each_arm_s_passes_beside_the_no_draft_arm(tmp_path: Path, bench) -> None:
    rows = [
        _replay("none", 0, 100.0),
        _replay("ngram-4-8", 0, 80.0, drafted=150.0, accepted=120.0),
        _replay("ngram-4-8", 1, 40.0, drafted=150.0, accepted=90.0),
        _replay("none", 1, 60.0),
    ]
    (tmp_path / "drafts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "command.txt").write_text("python benchmarks/drafts.py --out X\n")
    lines = bench.report(tmp_path).splitlines()
    assert "10 recorded requests" in lines[0] and "2 passes" in lines[0]
    assert "Command: `python benchmarks/drafts.py --out X`" in lines[0]
    header, separator, none, drafts = lines[2:6]
    assert header.count("|") == separator.count("|") == none.count("|") == drafts.count("|")
    assert "pass 1 (cold cache)" in header
    # none: 100 and 60 s, 400 tokens in 40 s, no drafts; drafts: 60 s a replay (0.75x), 210 of 300 kept
    assert none == "| none | 100 | 60 | 1.00 | 10 / 20 | 10.0 | 200 | 0 | - |"
    assert drafts == "| ngram-4-8 | 80 | 40 | 0.75 | 10 / 10 | 20.0 | 200 | 150 | 70% |"


def test_a_missing_pass_is_shown_absent_and_no_replays_is_an_error(tmp_path: Path, bench) -> None:
    rows = [_replay("none", 0, 100.0), _replay("none", 1, 60.0), _replay("ngram-3-16", 0, 88.0)]
    (tmp_path / "drafts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "command.txt").write_text("cmd\n")
    assert bench.report(tmp_path).splitlines()[-1].startswith("| ngram-3-16 | 88 | - | 1.10 |")
    (tmp_path / "drafts.jsonl").write_text("")
    with pytest.raises(SystemExit, match="holds no replays"):
        bench.report(tmp_path)


def test_a_run_never_appends_to_an_earlier_run_s_replays(tmp_path: Path, bench) -> None:
    (tmp_path / "drafts.jsonl").write_text(json.dumps(_replay("none", 0, 1.0)) + "\n")
    with pytest.raises(SystemExit, match="earlier run"):
        bench.main(["--out", str(tmp_path)])
    assert len((tmp_path / "drafts.jsonl").read_text().splitlines()) == 1


def test_the_docs_table_is_the_report_of_the_committed_replays(bench, repo_root) -> None:
    """docs/local-lm.md shows the report rendered from benchmarks/results/drafts, not a paste."""
    page = (repo_root / "docs" / "local-lm.md").read_text(encoding="utf-8")
    shown = page.split("<!-- drafts:start -->\n", 1)[1].split("<!-- drafts:end -->", 1)[0]
    report = bench.report(repo_root / "benchmarks" / "results" / "drafts")
    assert shown.strip() == report, "rerun: python benchmarks/drafts.py --out ... --report --docs ..."


def test_the_pinned_llama_server_takes_every_arm_s_flags(bench) -> None:
    from ragsuite.local_lm.server import find_llama_server

    executable = find_llama_server()
    if executable is None:
        pytest.skip("no llama-server built (ragsuite serve --local --build)")
    shown = subprocess.run([str(executable), "--help"], capture_output=True, text=True, timeout=60).stdout
    for flags in bench.ARMS.values():
        for flag in flags:
            if flag.startswith("--"):
                assert f"{flag} " in shown or f"{flag}," in shown, flag
    assert "ngram-simple" in shown
