"""`ragsuite bench`: a paper's grid run as resumable eval cells against the local OpenAI-compatible server,
the table with published numbers, bootstrap intervals and paired tests."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragsuite import bench
from ragsuite.cli import main
from ragsuite.errors import ConfigError
from ragsuite.processes import stop_process
from ragsuite.stats import bootstrap_ci, paired_test
from ragsuite.testing.openai_server import LocalOpenAIServer
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
        "--backbone",
        "gpt-4o-mini",
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


def test_hostile_specs_get_one_clean_line(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.toml"
    grid = 'programs = ["vanilla"]\ndatasets = ["hotpotqa"]\n'
    # A name with "../" would put runs/bench-NAME outside runs/.
    bad.write_text(f'name = "../../escaped"\n{grid}')
    with pytest.raises(ConfigError, match="must be a plain name"):
        bench.load_spec(bad)
    bad.write_text(f'{grid}[splits]\nhotpotqa = "../../../etc/x"\n')
    with pytest.raises(ConfigError, match=r"split .* must be a plain name"):
        bench.load_spec(bad)
    # 5,000 nested arrays: tomllib recurses once per level.
    bad.write_text(grid + "x = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match="nest too deeply"):
        bench.load_spec(bad)
    bad.write_text(f'{grid}[variants.vanilla]\nprogram = "vanilla"\n')
    with pytest.raises(ConfigError, match="not a registered program"):
        bench.load_spec(bad)
    bad.write_text(grid)
    argv = ["bench", str(bad), "--lm", "openai/x", "--dry-run", "--out", str(tmp_path / "o")]
    assert main([*argv, "--eval-args=--api-base 'http://x"]) == 2
    err = capsys.readouterr().err
    assert "balance its quotes" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main([*argv, "--backbone", "gpt-4o-mini"]) == 2
    assert "needs a spec with a published table" in capsys.readouterr().err
    # A top_k of 10**9 in a spec reaches eval as given; the retriever clamps it to the corpus.
    bad.write_text(f"{grid}[set.vanilla]\ntop_k = 1_000_000_000\n")
    assert main(argv) == 0
    assert "--set top_k=1000000000" in capsys.readouterr().out


def test_every_shipped_spec_loads_and_matches_its_published_layout() -> None:
    for path in sorted((ROOT / "benchmarks" / "specs").glob("*.toml")):
        spec = bench.load_spec(path)
        if spec.table is None:
            continue
        source = bench.published_table(spec.table)
        assert {"paper", "table", "retriever", "evaluation", "layout", "backbones", "not_run"} <= set(source)
        assert set(source["layout"]) == set(spec.datasets), path
        assert not {e.get("column") for e in source["not_run"]} & set(spec.datasets), path


def test_table_formats(tmp_path) -> None:
    spec = bench.BenchSpec(name="t", programs=("vanilla",), datasets=("hotpotqa",), table="deepnote-table1")
    cells = bench.plan(spec, out=tmp_path, lms=["openai/gpt-4o-mini"])
    md = bench.table(spec, cells)
    assert md.splitlines()[2] == "| vanilla | – | – | – | – |"  # nothing run: no number, not 0.0
    assert md.splitlines()[3] == "|   published (GPT-4o-mini) | 44.0 | 52.2 | 40.0 | 45.4 |"
    csv = bench.table(spec, cells, fmt="csv")
    assert csv.splitlines()[2] == "published (GPT-4o-mini),44.0,52.2,40.0,45.4"
    latex = bench.table(spec, cells, fmt="latex")
    assert r"hotpotqa exact\_match" in latex and r"\bottomrule" in latex


def write_cell(out_dir: Path, per_question: list[dict[str, float]]) -> None:
    """A finished eval cell as ``ragsuite eval`` leaves it: its summary and one record per question."""
    out_dir.mkdir(parents=True)
    metrics = {name: sum(q[name] for q in per_question) / len(per_question) for name in per_question[0]}
    (out_dir / "summary.json").write_text(json.dumps({"metrics": metrics, "errors": 0, "cost": {}}))
    records = [{"id": f"q{i}", "metrics": q} for i, q in enumerate(per_question)]
    (out_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def table_row(md: str, label: str, offset: int = 0) -> list[str]:
    lines = md.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in lines[row + offset].strip("|").split("|")]


def test_averages_are_the_papers_printed_cells_and_ours_only_where_the_paper_is_a_mean(tmp_path) -> None:
    """DeepNote's ASQA avg. is not the mean of its STR-EM and STR-Hit: 48.6 and 23.1 print 32.2, not 35.9."""
    spec = bench.BenchSpec(
        name="t", programs=("deepnote", "vanilla"), datasets=("hotpotqa", "asqa"), table="deepnote-table1"
    )
    cells = bench.plan(spec, out=tmp_path, lms=["openai/gpt-4o-mini"])
    write_cell(tmp_path / "deepnote" / "hotpotqa", [{"accuracy": 1.0, "f1": 0.5, "exact_match": 0.0}] * 2)
    write_cell(tmp_path / "deepnote" / "asqa", [{"str_em": 0.6, "str_hit": 0.2}] * 2)
    md = bench.table(spec, cells)
    header = [cell.strip() for cell in md.splitlines()[0].strip("|").split("|")]
    assert header[1:] == [
        "hotpotqa accuracy", "hotpotqa f1", "hotpotqa exact_match", "hotpotqa avg",
        "asqa str_em", "asqa str_hit", "asqa avg",
    ]  # fmt: skip
    ours, published, difference = (table_row(md, "deepnote", i)[1:] for i in range(3))
    assert published == ["56.8", "64.3", "50.2", "57.1", "48.6", "23.1", "32.2"]
    # HotpotQA's avg. is the mean of acc., F1, EM (56.8, 64.3, 50.2 -> 57.1): ours is computed the same way.
    assert ours[:4] == ["100.0", "50.0", "0.0", "50.0"] and difference[3] == "-7.1"
    # ASQA's is not reproducible from what the paper prints: ours and the difference are left out.
    assert ours[4:] == ["60.0", "20.0", "–"] and difference[6] == "–"
    assert table_row(md, "vanilla", 1)[1:] == ["44.0", "52.2", "40.0", "45.4", "44.3", "17.5", "24.5"]
    notes = bench.notes(spec, cells)
    assert any(line.startswith("Ours not computed: asqa avg") for line in notes)
    for backbone, row, printed in (
        ("gpt-4o-mini", "no-retrieval", "17.8"),
        ("gpt-4o-mini", "deepnote-no-adaptive", "27.8"),
        ("gpt-4o-mini", "deepnote-no-adaptive-no-note", "24.5"),
        ("qwen2.5-7b-instruct", "deepnote", "26.4"),
    ):
        assert bench.published_rows("deepnote-table1", backbone)[row]["asqa"]["avg"] == printed


def test_published_cells_are_shown_as_printed_with_their_decimals(tmp_path) -> None:
    """HANRAG prints two decimals (49.12, 1.00): the published column keeps them and ours follows."""
    spec = bench.BenchSpec(name="t", programs=("hanrag",), datasets=("nq",), table="hanrag-table1")
    cells = bench.plan(spec, out=tmp_path, lms=["vllm:meta-llama/Llama-3.1-8B-Instruct@http://gpu:8000/v1"])
    write_cell(tmp_path / "hanrag" / "nq", [{"exact_match": 0.5, "f1": 0.5, "accuracy": 0.5}] * 3)
    md = bench.table(spec, cells)
    assert table_row(md, "hanrag", 1)[1:] == ["56.40", "49.12", "69.20", "1.00"]
    assert table_row(md, "hanrag", 0)[1:4] == ["50.00", "50.00", "50.00"]
    assert table_row(md, "hanrag", 2)[2] == "0.88"
    # The same spec beside FLAN-T5-XL shows the HANRAG-Fair row.
    cells = bench.plan(spec, out=tmp_path, lms=["vllm:google/flan-t5-xl@http://gpu:8000/v1"])
    assert table_row(bench.table(spec, cells), "hanrag", 1)[1:3] == ["50.50", "54.40"]
    for table in bench.published_tables():
        source = bench.published_table(table)
        for info in [{"rows": source.get("rows", {})}, *source["backbones"].values()]:
            for row in info["rows"].values():
                for metrics in row.values():
                    assert all(isinstance(v, str) and re.fullmatch(r"\d+\.\d+", v) for v in metrics.values())


@pytest.mark.parametrize(
    ("lm", "backbone"),
    [
        ("openai/gpt-4o-mini", "gpt-4o-mini"),
        ("openai/gpt-4o-mini-2024-07-18", "gpt-4o-mini"),
        ("vllm:Qwen/Qwen2.5-7B-Instruct@http://gpu:8000/v1", "qwen2.5-7b-instruct"),
        ("vllm:meta-llama/Llama-3.1-8B-Instruct@http://gpu:8000/v1", "llama3.1-8b-instruct"),
        ("vllm:meta-llama/Llama-3.1-70B-Instruct@http://gpu:8000/v1", "llama3.1-70b-instruct"),
        ("openai/scripted", None),
    ],
)
def test_published_rows_follow_the_lm(lm, backbone) -> None:
    assert bench.backbone_for("deepnote-table1", lm) == backbone


def test_an_lm_without_published_rows_shows_none_and_says_how_to_pick_them(tmp_path) -> None:
    spec = bench.BenchSpec(name="t", programs=("deepnote",), datasets=("hotpotqa",), table="deepnote-table1")
    cells = bench.plan(spec, out=tmp_path, lms=["vllm:my-dnalign-model@http://gpu:8000/v1"])
    assert table_row(bench.table(spec, cells), "deepnote", 1)[1:] == ["–"] * 4
    assert any(
        "--backbone" in line and "qwen2.5-7b-instruct+dpo" in line for line in bench.notes(spec, cells)
    )
    aligned = bench.table(spec, cells, backbone="qwen2.5-7b-instruct+dpo")
    assert table_row(aligned, "deepnote", 1)[1:] == ["49.0", "58.1", "46.6", "51.2"]  # Table 1's +DPO row
    with pytest.raises(ConfigError, match="no published backbone 'gpt-5'"):
        bench.table(spec, cells, backbone="gpt-5")


def test_variants_run_a_program_with_its_own_knobs(tmp_path) -> None:
    spec = bench.load_spec(ROOT / "benchmarks" / "specs" / "deepnote-table6-7.toml")
    cells = {(c.program, c.dataset): c for c in bench.plan(spec, out=tmp_path, lms=["openai/gpt-4o-mini"])}
    argv = bench.eval_argv(spec, cells[("deepnote-top3", "musique")])
    assert argv[argv.index("--program") + 1] == "deepnote" and "top_k=3" in argv
    assert cells[("deepnote-top3", "musique")].out_dir == tmp_path / "deepnote-top3" / "musique"
    spec = bench.load_spec(ROOT / "benchmarks" / "specs" / "deepnote-table8.toml")
    by_row = {c.program: c for c in bench.plan(spec, out=tmp_path, lms=["openai/x"])}
    assert by_row["deepnote-bge-base"].retriever.startswith("dense:")
    assert by_row["deepnote-bm25"].retriever == "bm25"


def test_every_published_row_and_column_is_run_by_a_spec_or_listed_with_its_reason() -> None:
    specs = {path.name: bench.load_spec(path) for path in (ROOT / "benchmarks" / "specs").glob("*.toml")}
    by_table: dict[str, set[str]] = {}
    for spec in specs.values():
        if spec.table:
            by_table.setdefault(spec.table, set()).update(spec.programs)
    assert set(by_table) == set(bench.published_tables())
    for table, rows in by_table.items():
        source = bench.published_table(table)
        listed = {entry.get("row") for entry in source["not_run"]}
        for backbone in source["backbones"]:
            missing = set(bench.published_rows(table, backbone)) - rows - listed
            assert not missing, (table, backbone, missing)
        assert all(entry["reason"] for entry in source["not_run"])
    # A spec without a published table is one whose paper's numbers cannot be stored, and says why.
    unpublished = {entry.get("spec") for entry in bench.unrunnable_tables()}
    assert {name for name, spec in specs.items() if not spec.table} <= unpublished
    assert all(entry["reason"] for entry in bench.unrunnable_tables())


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
