"""The compiled-on-the-local-LM study's parts: records appended once, and the report rendered from a run
folder's records alone, side by side over the questions every arm answered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark):
    """``benchmarks/compiled_local.py`` as a module."""
    return load_benchmark("compiled_local")


def _record(qid: str, accuracy: float, *, error: str | None = None) -> dict:
    return {
        "id": qid,
        "error": error,
        "metrics": {} if error else {"accuracy": accuracy, "exact_match": accuracy, "f1": accuracy},
        "tokens": {"input": 1000, "output": 100},
    }


def test_records_already_kept_are_not_appended_again(tmp_path: Path, bench) -> None:
    path = tmp_path / "hotpotqa.deepnote.records.jsonl.gz"
    bench.append_records(path, [_record("a", 1.0), _record("b", 0.0)])
    bench.append_records(
        path, [_record("b", 1.0), _record("c", 1.0)]
    )  # a chunk rerun after its records landed
    assert [(r["id"], r["metrics"]["accuracy"]) for r in bench.read_records(path)] == [
        ("a", 1.0),
        ("b", 0.0),
        ("c", 1.0),
    ]


def test_the_report_compares_the_arms_on_the_questions_all_of_them_answered(tmp_path: Path, bench) -> None:
    labels = [label for label, _, _ in bench.arms_of("deepnote")[:3]]  # the tuned arm has not run
    chunks = [
        {"dataset": "hotpotqa", "arm": label, "chunk": 0, "questions": 2, "wall": wall, "server": {}}
        for label, wall in zip(labels, (100.0, 60.0, 10.0), strict=True)
    ] + [{"dataset": "hotpotqa", "arm": labels[0], "chunk": 2, "questions": 2, "wall": 999.0, "server": {}}]
    (tmp_path / "chunks.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chunks))
    scores = {labels[0]: (1.0, 1.0), labels[1]: (0.0, 1.0), labels[2]: (0.0, 0.0)}
    for label, (q1, q2) in scores.items():
        rows = [
            _record("q1", q1),
            _record("q2", q2) if label != labels[2] else _record("q2", 0.0, error="timeout"),
        ]
        if label == labels[0]:
            rows += [_record("q3", 1.0), _record("q4", 1.0)]  # chunk 2: only this arm ran it
        bench.append_records(bench.records_path(tmp_path, "hotpotqa", label), rows)
    report = bench.report(tmp_path, command="python benchmarks/compiled_local.py --out X")
    lines = report.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("| program |")))
    assert lines[header].startswith("| program | accuracy [95% CI] | exact_match | f1 | failed |")
    assert lines[header + 1] == "|---|---|---|---|---|---|---|"
    # Chunk 0 only: 2 questions each; the failed question scores 0 and is counted.
    assert lines[header + 2].startswith(
        f"| {labels[0]} | 100.0 [100.0, 100.0] | 100.0 | 100.0 | 0 | 1,000/100 | 50.0 |"
    )
    assert lines[header + 3].startswith(f"| {labels[1]} | 50.0 [")
    assert lines[header + 4].startswith(f"| {labels[2]} | 0.0 [0.0, 0.0] | 0.0 | 0.0 | 1 | 1,000/100 | 5.0 |")
    compared = [line for line in lines if "−" in line]
    assert compared[0].startswith(f"| {labels[0]} − {labels[1]} | +50.0 [")
    assert compared[1].startswith(f"| {labels[0]} − {labels[2]} | +100.0 [+100.0, +100.0], p = ")
    assert "smoke run" in report and "2 held-out dev questions" in report
    assert "`python benchmarks/compiled_local.py --out X`" in report
    # Without a command given, the folder's own command.txt names it (each folder keeps the command it ran).
    (tmp_path / "command.txt").write_text("python benchmarks/compiled_local.py --teacher-lm T --out Y\n")
    assert bench.report(tmp_path).startswith(
        "Command: `python benchmarks/compiled_local.py --teacher-lm T --out Y`."
    )


@pytest.mark.parametrize(
    "markers", ["compiled-local", "compiled-local-blendfilter", "compiled-local-vs-1.5b"]
)
def test_the_docs_table_is_the_report_of_the_committed_records(bench, repo_root, markers: str) -> None:
    """docs/local-lm.md shows each held-out report rendered from its committed run folder (named as its
    markers are), not a paste."""
    page = (repo_root / "docs" / "local-lm.md").read_text(encoding="utf-8")
    shown = page.split(f"<!-- {markers}:start -->\n", 1)[1].split(f"<!-- {markers}:end -->", 1)[0]
    report = bench.report(repo_root / "benchmarks" / "results" / markers)
    assert shown.strip() == report, (
        f"rerun: python benchmarks/compiled_local.py --out benchmarks/results/{markers} --report "
        f"--docs docs/local-lm.md --markers {markers}"
    )


@pytest.mark.parametrize(
    ("shipped", "measured"),
    [
        ("deepnote-hotpotqa-local.json", "deepnote-hotpotqa-bootstrap.json"),
        ("deepnote-hotpotqa-local-tuned.json", "deepnote-hotpotqa-bootstrap-tuned.json"),
    ],
)
def test_each_shipped_deepnote_file_is_the_one_the_held_out_table_measured(
    repo_root, shipped: str, measured: str
) -> None:
    """The files in examples/compiled are the held-out run's files byte for byte: a shipped file changed
    without a new run would carry another program's scores."""
    held_out = repo_root / "benchmarks" / "results" / "compiled-local" / "programs" / measured
    assert (repo_root / "examples" / "compiled" / shipped).read_bytes() == held_out.read_bytes()


def test_token_counts_missing_from_a_record_are_shown_as_absent_not_zero(tmp_path: Path, bench) -> None:
    labels = [label for label, _, _ in bench.arms_of("deepnote")]  # every arm, the tuned one included
    chunks = [
        {"dataset": "hotpotqa", "arm": label, "chunk": 0, "questions": 1, "wall": 1.0} for label in labels
    ]
    (tmp_path / "chunks.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chunks))
    for label in labels:
        record = _record("q1", 1.0)
        if label == labels[1]:
            del record["tokens"]
        bench.append_records(bench.records_path(tmp_path, "hotpotqa", label), [record])
    rows = {line.split(" | ")[0]: line for line in bench.report(tmp_path, command="c").splitlines()}
    assert rows[f"| {labels[0]}"].endswith("| 0 | 1,000/100 | 1.0 |")
    assert rows[f"| {labels[1]}"].endswith("| 0 | – | 1.0 |")
    assert rows[f"| {labels[3]}"].endswith("| 0 | 1,000/100 | 1.0 |")  # a fourth arm, once it has run


def test_a_stopped_chunk_runs_again_whole_so_its_wall_time_covers_its_questions(
    tmp_path: Path, bench, monkeypatch
) -> None:
    import argparse
    import types

    import dspy

    import ragsuite.evaluation
    import ragsuite.lm

    arms = bench.arms_of("deepnote")[:3]
    labels = [label for label, _, _ in arms]
    stopped = tmp_path / "work" / "hotpotqa" / "deepnote-compiled" / "chunk-0000"
    stopped.mkdir(parents=True)
    (stopped / "records.jsonl").write_text(json.dumps(_record("q1", 1.0)) + "\n")  # its first question
    examples = [dspy.Example(id=f"q{i}", question=f"Q{i}?").with_inputs("question") for i in (1, 2)]
    found_stale = []

    def evaluate(program, chunk, *, out_dir, **kwargs):
        found_stale.append((out_dir / "records.jsonl").exists())
        return types.SimpleNamespace(records=[_record(ex.id, 1.0) for ex in chunk])

    monkeypatch.setattr(ragsuite.evaluation, "evaluate", evaluate)
    monkeypatch.setattr(ragsuite.lm, "build_lm", lambda *args, **kwargs: None)
    monkeypatch.setattr(bench, "held_out", lambda *args: ({label: None for label in labels}, examples))
    monkeypatch.setattr(bench, "present_arms", lambda *args: list(arms))
    server = types.SimpleNamespace(
        api_base="http://127.0.0.1:1/v1", settings=types.SimpleNamespace(parallel=2, public=lambda: {})
    )
    bench.score_chunks(argparse.Namespace(model="local", eval=["hotpotqa:2"], chunk=2), tmp_path, server)
    assert found_stale == [False, False, False]  # every arm ran its chunk from the start
    chunks = [json.loads(line) for line in (tmp_path / "chunks.jsonl").read_text().splitlines()]
    assert [(c["arm"], c["questions"]) for c in chunks] == [(label, 2) for label in labels]


def test_the_tune_report_shows_every_complete_trial_with_the_front_and_the_written_one(
    tmp_path: Path, bench
) -> None:
    study = tmp_path / "deepnote-hotpotqa-quality+tokens"
    study.mkdir()
    trials = [
        {"number": 0, "state": "COMPLETE", "knobs": {"max_step": 3}, "errors": 0, "seconds": 300.4,
         "metrics": {"f1": 0.25, "accuracy": 0.2, "exact_match": 0.1},
         "cost": {"input_tokens": 10000.0, "output_tokens": 400.0, "lm_calls": 8.0, "cache_hits": 2.5}},
        {"number": 1, "state": "FAIL", "knobs": {"max_step": 5}},
        {"number": 2, "state": "COMPLETE", "knobs": {"max_step": 1}, "errors": 1, "seconds": 20.0,
         "metrics": {"f1": 0.3, "accuracy": 0.3, "exact_match": 0.2}, "cost": {"input_tokens": 5000.0}},
    ]  # fmt: skip
    (study / "trials.json").write_text(json.dumps(trials))
    tuning = {
        "study": study.name,
        "trial": 2,
        "dataset": "hotpotqa",
        "valset_size": 10,
        "quality_metric": "f1",
    }
    (study / "best.json").write_text(json.dumps({"metadata": {"tuning": tuning}}))
    (study / "pareto.json").write_text(json.dumps({"front": [{"number": 2}]}))
    (tmp_path / "command.txt").write_text("ragsuite tune --program-file F --out X\n")
    lines = bench.tune_report(tmp_path).splitlines()
    assert lines[0] == "Command: `ragsuite tune --program-file F --out X`."
    assert "2 complete trials, each on the same 10 validation questions (a smoke run" in lines[2]
    table = [line for line in lines if line.startswith("|")]
    assert table[0] == (
        "| trial | max_step | f1 | accuracy | exact_match | failed | tokens in/out per question "
        "| LM calls per question (replayed) | wall s |"
    )
    assert set(table[1]) == set("|-")
    assert table[2:] == [
        "| 0 | 3 | 25.0 | 20.0 | 10.0 | 0 | 10,000/400 | 8.0 (2.5) | 300 |",
        "| 2 (written) * | 1 | 30.0 | 30.0 | 20.0 | 1 | – | – | 20 |",
    ]


def test_a_tuned_arm_joins_once_its_file_is_kept_and_the_report_names_the_knobs_it_changed(
    tmp_path: Path, bench
) -> None:
    import argparse

    args = argparse.Namespace(program="deepnote", dataset="hotpotqa", optimizer="bootstrap", tuned=None)
    compiled = {"program": "deepnote", "knobs": {"top_k": 5, "max_step": 3}, "predictors": {"answer": {}}}
    (tmp_path / "programs").mkdir()
    (tmp_path / "programs" / "deepnote-hotpotqa-bootstrap.json").write_text(json.dumps(compiled))
    assert [label for label, _, _ in bench.present_arms(tmp_path, args)] == ["deepnote compiled"]
    bench.keep_given_files(args, tmp_path)  # no --tuned: nothing kept
    tuned = tmp_path / "best.json"
    tuned.write_text(json.dumps({**compiled, "knobs": {"top_k": 5, "max_step": 1}}))
    args.tuned = tuned
    bench.keep_given_files(args, tmp_path)
    bench.keep_given_files(args, tmp_path)  # the same file again: resumed
    assert [label for label, _, _ in bench.present_arms(tmp_path, args)] == [
        "deepnote compiled",
        "deepnote tuned",
    ]
    assert bench.tuned_knobs(tmp_path) == ["deepnote (max_step 3 → 1)"]
    tuned.write_text(json.dumps({**compiled, "knobs": {"top_k": 3, "max_step": 1}}))
    with pytest.raises(SystemExit, match="holds another tuned program"):
        bench.keep_given_files(args, tmp_path)  # its records came from the first file


def test_another_program_is_compiled_and_scored_beside_compiled_vanilla(tmp_path: Path, bench) -> None:
    import argparse

    assert bench.arms_of("blendfilter") == (
        ("blendfilter compiled", "blendfilter", "compiled"),
        ("blendfilter", "blendfilter", "no-demos"),
        ("vanilla compiled", "vanilla", "compiled"),
        ("blendfilter tuned", "blendfilter", "tuned"),
    )
    args = argparse.Namespace(program="blendfilter", dataset="nq", optimizer="bootstrap", tuned=None)
    (tmp_path / "programs").mkdir()
    for name in ("blendfilter-nq-bootstrap", "vanilla-nq-bootstrap", "deepnote-nq-bootstrap-no-demos"):
        (tmp_path / "programs" / f"{name}.json").write_text("{}")
    labels = [label for label, _, _ in bench.present_arms(tmp_path, args)]
    assert labels == ["blendfilter compiled", "vanilla compiled"]  # another program's file is no arm


def test_the_docs_tune_table_is_the_report_of_the_committed_study(bench, repo_root) -> None:
    """docs/local-lm.md shows the trials rendered from benchmarks/results/tune-compiled-local, not a paste."""
    page = (repo_root / "docs" / "local-lm.md").read_text(encoding="utf-8")
    shown = page.split("<!-- tune-compiled-local:start -->\n", 1)[1].split(
        "<!-- tune-compiled-local:end -->"
    )[0]
    report = bench.tune_report(repo_root / "benchmarks" / "results" / "tune-compiled-local")
    assert shown.strip() == report, (
        "rerun: python benchmarks/compiled_local.py --report --tune ... --docs ..."
    )


def test_the_compiled_program_runs_beside_the_uncompiled_one_on_a_larger_lm_on_its_own_server(
    tmp_path: Path, bench, monkeypatch
) -> None:
    """``--compiled FILE --arms compiled larger --larger-lm MODEL``: the given file is kept, its demos are
    stripped for the larger LM's arm, each arm asks its own server's model, and the report names the
    model."""
    import argparse
    import types

    import dspy

    import ragsuite.evaluation
    import ragsuite.lm

    shipped = tmp_path / "shipped.json"
    shipped.write_text(
        json.dumps({"program": "deepnote", "knobs": {}, "predictors": {"answer": {"demos": [1]}}})
    )
    out = tmp_path / "run"
    args = argparse.Namespace(
        program="deepnote", dataset="hotpotqa", optimizer="bootstrap", tuned=None, compiled=shipped,
        arms=["compiled", "larger"], larger_lm="local:big", model="local", eval=["hotpotqa:2"], chunk=2,
    )  # fmt: skip
    bench.keep_given_files(args, out)
    bench.compile_programs(args, out, server=None)  # the file is there: nothing to compile
    assert [label for label, _, _ in bench.present_arms(out, args)] == [
        "deepnote compiled",
        "deepnote on the larger LM",
    ]  # the uncompiled small-model arm and vanilla were left out
    bare = json.loads((out / "programs" / "deepnote-hotpotqa-bootstrap-no-demos.json").read_text())
    assert bare["predictors"]["answer"]["demos"] == []

    asked = []
    monkeypatch.setattr(ragsuite.lm, "build_lm", lambda model, *, api_base, **kw: (model, api_base))
    examples = [dspy.Example(id=f"q{i}", question=f"Q{i}?").with_inputs("question") for i in (1, 2)]
    labels = ["deepnote compiled", "deepnote on the larger LM"]
    monkeypatch.setattr(bench, "held_out", lambda *a: ({label: None for label in labels}, examples))

    def evaluate(program, chunk, *, threads, **kwargs):
        asked.append((dspy.settings.lm, threads))
        return types.SimpleNamespace(records=[_record(ex.id, float(len(asked) == 1)) for ex in chunk])

    monkeypatch.setattr(ragsuite.evaluation, "evaluate", evaluate)

    def server(port: int, parallel: int):
        settings = types.SimpleNamespace(parallel=parallel, public=lambda: {"parallel": parallel})
        return types.SimpleNamespace(api_base=f"http://127.0.0.1:{port}/v1", settings=settings)

    bench.score_chunks(args, out, server(1, 2), server(2, 1))
    assert asked == [(("local", "http://127.0.0.1:1/v1"), 2), (("local:big", "http://127.0.0.1:2/v1"), 1)]
    chunks = [json.loads(line) for line in (out / "chunks.jsonl").read_text().splitlines()]
    assert [(c["arm"], c["model"]) for c in chunks] == [(labels[0], "local"), (labels[1], "local:big")]
    report = bench.report(out, command="c")
    assert "the uncompiled program (no demos) on `local:big`" in report
    assert "| deepnote compiled − deepnote on the larger LM | +100.0 [" in report

    other = tmp_path / "other.json"
    other.write_text(json.dumps({"program": "deepnote", "knobs": {"max_step": 1}, "predictors": {}}))
    args.compiled = other
    with pytest.raises(SystemExit, match="holds another compiled program"):
        bench.keep_given_files(args, out)  # the records came from the first file
