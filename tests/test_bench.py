"""`ragsuite bench`: a paper's grid run as resumable eval cells against the local OpenAI-compatible server,
the table with published numbers, bootstrap intervals and paired tests."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragsuite import bench
from ragsuite.cli import main
from ragsuite.errors import ConfigError
from ragsuite.stats import bootstrap_ci, paired_test
from ragsuite.testing.openai_server import LocalOpenAIServer
from ragsuite.testing.processes import stop_process
from ragsuite.testing.responders import grounded_responder

ROOT = Path(__file__).resolve().parent.parent
DEEPNOTE_SPEC = ROOT / "benchmarks" / "specs" / "deepnote-table1.toml"

# A few questions per dataset of DeepNote's Table 1, each with its own small corpus.
FACTS = [
    ("Jaws", "Jaws is a 1975 film directed by Steven Spielberg.", "Who directed Jaws?", "Steven Spielberg"),
    (
        "Steven Spielberg",
        "Steven Spielberg was born in Cincinnati, Ohio.",
        "Where was Spielberg born?",
        "Cincinnati",
    ),
    (
        "Rush",
        "Rush is a Canadian rock band that released Counterparts.",
        "Which band released Counterparts?",
        "Rush",
    ),
]


def _pid(title: str, text: str) -> str:
    return hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()[:16]


def write_datasets(root: Path) -> dict[str, str]:
    gold: dict[str, str] = {}
    for dataset in ("hotpotqa", "2wikimultihopqa", "musique", "asqa", "strategyqa"):
        folder = root / dataset
        folder.mkdir(parents=True)
        corpus = [{"id": _pid(t, x), "title": t, "text": x} for t, x, _, _ in FACTS]
        corpus += [
            {"id": f"filler{i}", "title": f"Filler {i}", "text": f"unrelated text number {i}"}
            for i in range(5)
        ]
        (folder / "corpus.jsonl").write_text("".join(json.dumps(p) + "\n" for p in corpus))
        rows = []
        for i, (title, text, question, answer) in enumerate(FACTS):
            question = f"{question} ({dataset})"
            row = {
                "id": f"{dataset}-{i}",
                "question": question,
                "type": "bridge",
                "gold_passage_ids": [_pid(title, text)],
            }
            if dataset == "strategyqa":
                row["answers"] = ["yes"]
            elif dataset == "asqa":
                row.update(answers=[f"It was {answer}."], short_answers=[[answer]])
            else:
                row["answers"] = [answer]
            gold[question] = row["answers"][0] if dataset != "asqa" else answer
            rows.append(row)
        # The shipped spec reads the papers' subsets: test.jsonl for multi-hop sets, dev.jsonl for the rest.
        for split in ("dev", "test"):
            (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return gold


def bench_argv(server: LocalOpenAIServer, out: Path, data: Path, *extra: str) -> list[str]:
    flags = f"--api-base {server.api_base} --no-cache --no-progress --data-dir {data}"
    return [
        "bench",
        str(DEEPNOTE_SPEC),
        "--lm",
        "openai/scripted",
        "--out",
        str(out),
        "--limit",
        "2",
        f"--eval-args={flags}",
        *extra,
    ]


@pytest.fixture
def datasets(tmp_path):
    data = tmp_path / "data"
    return data, write_datasets(data)


@pytest.mark.slow
def test_deepnote_table1_spec_runs_every_cell_and_prints_the_published_column(
    tmp_path, datasets, capsys
) -> None:
    data, gold = datasets
    out = tmp_path / "bench"
    spec = bench.load_spec(DEEPNOTE_SPEC)
    with LocalOpenAIServer(grounded_responder(gold)) as server:
        assert main(bench_argv(server, out, data)) == 0
        first = server.chat_requests
        printed = capsys.readouterr().out
        # Every cell is an ordinary eval run with its records.
        for program in spec.programs:
            for dataset in spec.datasets:
                records = (out / program / dataset / "records.jsonl").read_text().splitlines()
                assert len(records) == 2, (program, dataset)
        # The published column and the difference: DeepNote on HotpotQA, accuracy 56.8 (Table 1).
        lines = printed.splitlines()
        start = lines.index(
            next(line for line in lines if line.startswith("| program | hotpotqa accuracy |"))
        )
        row = start + lines[start:].index(
            next(line for line in lines[start:] if line.startswith("| deepnote |"))
        )
        assert lines[row + 1].split(" | ")[1] == "56.8"
        ours = bench.cell_scores(out / "deepnote" / "hotpotqa")["accuracy"][0]
        assert lines[row].split(" | ")[1] == f"{ours:.1f}"
        assert lines[row + 2].split(" | ")[1] == f"{ours - 56.8:.1f}"
        assert "Published: Wang et al., DeepNote" in printed
        # Cost beside quality: the cell's own summary, per answered question.
        cost_line = next(line for line in lines[row:] if line.startswith("| deepnote | hotpotqa |"))
        summary = json.loads((out / "deepnote" / "hotpotqa" / "summary.json").read_text())
        assert cost_line.split(" | ")[2] == f"{summary['cost']['lm_calls']:.2f}"
        assert cost_line.split(" | ")[6].rstrip(" |") == f"{summary['cost']['steps']:.2f}"
        # A second run reuses every finished cell: no LM request at all.
        assert main(bench_argv(server, out, data)) == 0
        assert server.chat_requests == first
    assert first > 0


def test_bench_resumes_after_a_kill(tmp_path, datasets) -> None:
    data, gold = datasets
    out = tmp_path / "bench"
    with LocalOpenAIServer(grounded_responder(gold), latency=0.2) as server:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        argv = [sys.executable, "-m", "ragsuite", *bench_argv(server, out, data)]
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        first_cell = out / "no-retrieval" / "hotpotqa" / "records.jsonl"
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (
                first_cell.is_file() and first_cell.read_text().count("\n") >= 1
            ):
                time.sleep(0.05)
            assert first_cell.is_file(), "the bench never finished a question"
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
        finally:
            stop_process(proc, timeout=5)
        finished = {
            json.loads(line)["id"] for line in first_cell.read_text().splitlines() if line.endswith("}")
        }
        server.latency = 0.0
        assert main(bench_argv(server, out, data)) == 0
    ids = [
        json.loads(line)["id"] for line in first_cell.read_text().splitlines() if line.strip().endswith("}")
    ]
    assert sorted(set(ids)) == ["hotpotqa-0", "hotpotqa-1"]
    assert all(ids.count(done) == 1 for done in finished)  # finished before the kill: never asked again


def test_spec_errors_name_the_fix(tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('programs = ["deep-note"]\ndatasets = ["hotpotqa"]\n')
    with pytest.raises(ConfigError, match="unknown programs"):
        bench.load_spec(bad)
    bad.write_text('programs = ["vanilla"]\ndatasets = ["hotpotqa"]\ntabel = "x"\n')
    with pytest.raises(ConfigError, match="unknown keys"):
        bench.load_spec(bad)
    bad.write_text('programs = ["vanilla"]\ndatasets = ["hotpotqa"]\n')
    with pytest.raises(ConfigError, match="no LM"):
        bench.plan(bench.load_spec(bad), out=tmp_path)
    bad.write_text("programs = [")
    with pytest.raises(ConfigError, match="cannot read bench spec"):
        bench.load_spec(bad)


def test_every_shipped_spec_loads_and_names_a_published_table() -> None:
    for path in sorted((ROOT / "benchmarks" / "specs").glob("*.toml")):
        spec = bench.load_spec(path)
        assert spec.table in bench.published_tables(), path
        source = bench.published_table(spec.table)
        assert {"paper", "table", "backbone", "retriever", "evaluation", "layout", "rows"} <= set(source)
        assert set(source["layout"]) == set(spec.datasets), path


def test_table_formats(tmp_path) -> None:
    spec = bench.BenchSpec(name="t", programs=("vanilla",), datasets=("hotpotqa",), table="deepnote-table1")
    cells = bench.plan(spec, out=tmp_path, lms=["openai/x"])
    md = bench.table(spec, cells)
    assert md.splitlines()[2] == "| vanilla | – | – | – | – |"  # nothing run: no number, not 0.0
    assert md.splitlines()[3] == "|   published | 44.0 | 52.2 | 40.0 | 45.4 |"
    csv = bench.table(spec, cells, fmt="csv")
    assert csv.splitlines()[2] == "published,44.0,52.2,40.0,45.4"
    latex = bench.table(spec, cells, fmt="latex")
    assert r"hotpotqa exact\_match" in latex and r"\bottomrule" in latex


# ----------------------------------------------------------------------------- statistics
def test_bootstrap_interval_brackets_the_mean_and_shrinks_with_more_questions() -> None:
    small = bootstrap_ci([1, 0] * 10)
    large = bootstrap_ci([1, 0] * 500)
    assert small[0] < 0.5 < small[1] and large[0] < 0.5 < large[1]
    assert large[1] - large[0] < (small[1] - small[0]) / 3
    assert bootstrap_ci([1, 1, 1]) == (1.0, 1.0)
    with pytest.raises(ValueError):
        bootstrap_ci([])


def test_paired_test_separates_a_real_difference_from_noise() -> None:
    better = paired_test([1] * 80 + [0] * 20, [1] * 50 + [0] * 50)
    assert better.difference == pytest.approx(0.3) and better.significant and better.p_value < 0.01
    assert better.low > 0
    same = paired_test([1, 0] * 50, [0, 1] * 50)
    assert same.difference == 0 and not same.significant and same.p_value > 0.5
    with pytest.raises(ValueError, match="align"):
        paired_test([1, 0], [1])


def test_per_dataset_splits_select_the_papers_subsets(tmp_path) -> None:
    spec = bench.load_spec(DEEPNOTE_SPEC)
    cells = {(c.program, c.dataset): c for c in bench.plan(spec, out=tmp_path, lms=["openai/x"])}
    argv = bench.eval_argv(spec, cells[("deepnote", "hotpotqa")])
    assert argv[argv.index("--split") + 1] == "test"  # IRCoT's 500 test questions
    argv = bench.eval_argv(spec, cells[("deepnote", "asqa")])
    assert argv[argv.index("--split") + 1] == "dev"  # ALCE's 948 questions
    assert "--limit" not in argv  # all 948 of them, not a 500-question cut
