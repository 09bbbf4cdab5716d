"""`ragsuite eval --program-file`: the command line's dataset, data dir and answer task win over the file."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from ragsuite import programs
from ragsuite.cli import build_parser, main
from ragsuite.cli.eval import build_program
from ragsuite.retrieval.spec import build_retriever
from ragsuite.testing.openai_server import LocalOpenAIServer
from ragsuite.testing.scripted import ScriptedRequest


def write_dataset(root: Path, name: str, topic: str) -> Path:
    """A two-question dataset whose corpus passages all mention ``topic``."""
    folder = root / name
    folder.mkdir(parents=True)
    corpus = [
        {"id": f"{topic}-{i}", "title": f"{topic} {i}", "text": f"{topic} fact number {i}."} for i in range(6)
    ]
    rows = [
        {
            "id": f"{name}-{i}",
            "question": f"Which {topic} fact is number {i}?",
            "answers": [f"fact {i}"],
            "gold_passage_ids": [f"{topic}-{i}"],
            "type": "",
            "short_answers": [[f"fact {i}"]],
        }
        for i in range(2)
    ]
    for file, lines in (("corpus.jsonl", corpus), ("dev.jsonl", rows)):
        (folder / file).write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root


@pytest.fixture
def tuned_on_hotpotqa(tmp_path, monkeypatch) -> Path:
    """A vanilla program file saved with BM25 over a small 'hotpotqa' corpus about rivers."""
    rivers = write_dataset(tmp_path / "rivers", "hotpotqa", "river")
    monkeypatch.setenv("RAGSUITE_DATA", str(rivers))
    monkeypatch.setenv("RAGSUITE_CACHE", str(tmp_path / "cache"))
    retriever = build_retriever("bm25", dataset="hotpotqa", data_dir=rivers)
    path = tmp_path / "vanilla.json"
    programs.get("vanilla")(retriever=retriever, task="short", top_k=2).save(str(path))
    return path


def eval_argv(program_file: Path, dataset: str, data_dir: Path, *extra: str) -> list[str]:
    return [
        "eval",
        "--program-file",
        str(program_file),
        "--dataset",
        dataset,
        "--data-dir",
        str(data_dir),
        "--out",
        str(program_file.parent / "run"),
        "--no-progress",
        "--no-cache",
        *extra,
    ]


def test_the_command_line_dataset_builds_the_retriever_and_sets_the_task(tmp_path, tuned_on_hotpotqa, caplog):
    mountains = write_dataset(tmp_path / "mountains", "asqa", "mountain")
    args = build_parser().parse_args([*eval_argv(tuned_on_hotpotqa, "asqa", mountains), "--lm", "openai/m"])
    with caplog.at_level(logging.WARNING, logger="ragsuite.cli.eval"):
        program, description = build_program(args, "long")

    assert program.task == "long" and program.knobs() == {"top_k": 2}
    assert description["spec"] == "bm25:asqa" and description["num_passages"] == 6
    assert {p.id for p in program.retriever("mountain fact number 1", 3)} <= {
        f"mountain-{i}" for i in range(6)
    }
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        f"{tuned_on_hotpotqa}: saved for dataset 'hotpotqa'; running on 'asqa' (--dataset wins)",
        f"{tuned_on_hotpotqa}: saved with answer task 'short'; using 'long', the task of 'asqa'",
        f"{tuned_on_hotpotqa}: saved with retriever 'bm25:hotpotqa'; using 'bm25:asqa'",
        lines[3],
    ]
    assert "the retrieval index changed: saved index_key" in lines[3]


def test_a_changed_corpus_under_the_same_dataset_is_reported(tmp_path, tuned_on_hotpotqa, caplog):
    saved_key = json.loads(tuned_on_hotpotqa.read_text())["retriever"]["index_key"]
    lakes = write_dataset(tmp_path / "lakes", "hotpotqa", "lake")
    args = build_parser().parse_args([*eval_argv(tuned_on_hotpotqa, "hotpotqa", lakes), "--lm", "openai/m"])
    with caplog.at_level(logging.WARNING, logger="ragsuite.cli.eval"):
        program, description = build_program(args, "short")
    assert program.retriever("lake fact", 1)[0].id.startswith("lake-")
    assert [record.getMessage() for record in caplog.records] == [
        f"{tuned_on_hotpotqa}: the retrieval index changed: saved index_key {saved_key}, built now "
        f"{description['index_key']} (different corpus or index settings)"
    ]


def test_same_dataset_and_corpus_run_quietly(tuned_on_hotpotqa, caplog):
    rivers = tuned_on_hotpotqa.parent / "rivers"
    args = build_parser().parse_args([*eval_argv(tuned_on_hotpotqa, "hotpotqa", rivers), "--lm", "openai/m"])
    with caplog.at_level(logging.WARNING, logger="ragsuite.cli.eval"):
        _, description = build_program(args, "short")
    assert description["spec"] == "bm25:hotpotqa" and caplog.records == []


def test_eval_cli_answers_from_the_command_line_corpus(tmp_path, tuned_on_hotpotqa, caplog):
    mountains = write_dataset(tmp_path / "mountains", "asqa", "mountain")

    def respond(request: ScriptedRequest) -> dict:
        return {name: "an answer" for name in request.output_fields}

    with LocalOpenAIServer(respond) as server:
        argv = eval_argv(
            tuned_on_hotpotqa, "asqa", mountains, "--lm", "openai/scripted", "--api-base", server.api_base
        )
        assert main(argv) == 0
        prompts = [str(request.inputs) for request in server.requests]
    err = caplog.text
    assert len(prompts) == 2 and all("mountain fact" in p and "river" not in p for p in prompts)
    assert "saved for dataset 'hotpotqa'; running on 'asqa' (--dataset wins)" in err
    assert "the retrieval index changed" in err
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["retriever"]["spec"] == "bm25:asqa" and manifest["dataset"] == "asqa"


# -- ragsuite.load on another machine: the corpus by name and hash, not by path -----------------------------


def test_a_program_file_keeps_the_corpus_hash_not_the_data_path(tmp_path, monkeypatch):
    """Saved over one data root, loaded over a copy of it elsewhere (another machine): the same corpus is
    found by dataset name and checked by sha256; other content is refused with the mismatch named."""
    import shutil

    import ragsuite
    from ragsuite.errors import ConfigError
    from ragsuite.retrieval.bm25 import BM25Retriever

    monkeypatch.setenv("RAGSUITE_CACHE", str(tmp_path / "cache"))
    here = write_dataset(tmp_path / "here", "hotpotqa", "river")
    program = programs.get("vanilla")(
        retriever=BM25Retriever.from_dataset("hotpotqa", data_dir=here, k1=0.9), task="short", top_k=2
    )
    path = tmp_path / "vanilla.json"
    program.save(str(path))
    text = path.read_text()
    saved = json.loads(text)["retriever"]
    assert str(here) not in text and str(tmp_path) not in text
    assert saved["dataset"] == "hotpotqa" and len(saved["corpus_sha256"]) == 64

    there = tmp_path / "there"
    shutil.copytree(here, there)
    shutil.rmtree(here)
    loaded = ragsuite.load(str(path), data_dir=there)
    assert loaded.retriever.describe() == program.retriever.describe()  # the same index, k1 included
    query = "Which river fact?"
    assert [p.id for p in loaded.retriever(query, 3)] == [p.id for p in program.retriever(query, 3)]
    monkeypatch.setenv("RAGSUITE_DATA", str(there))
    assert ragsuite.load(str(path)).retriever.describe()["k1"] == 0.9

    corpus = there / "hotpotqa" / "corpus.jsonl"
    corpus.write_text(corpus.read_text().replace("fact number 5", "fact number five"))
    with pytest.raises(ConfigError, match=r"corpus hash mismatch: .*corpus.jsonl has sha256 .* saved on a "):
        ragsuite.load(str(path), data_dir=there)
    with pytest.raises(ConfigError, match=r"the hotpotqa corpus it was built on is not under data_dir="):
        ragsuite.load(str(path), data_dir=tmp_path / "cache")
    # An explicit retriever accepts the new content.
    mine = BM25Retriever.from_dataset("hotpotqa", data_dir=there)
    assert ragsuite.load(str(path), retriever=mine).retriever is mine


def test_a_hybrid_with_settings_its_spec_cannot_carry_is_refused(tmp_path, monkeypatch):
    import ragsuite
    from ragsuite.errors import ConfigError
    from ragsuite.retrieval.bm25 import BM25Retriever
    from ragsuite.retrieval.hybrid import HybridRetriever

    monkeypatch.setenv("RAGSUITE_CACHE", str(tmp_path / "cache"))
    data = write_dataset(tmp_path / "data", "hotpotqa", "river")
    members = [BM25Retriever.from_dataset("hotpotqa", data_dir=data, k1=k1) for k1 in (0.9, 1.5)]
    path = tmp_path / "hybrid.json"
    programs.get("vanilla")(retriever=HybridRetriever(members, mode="rrf"), top_k=2).save(str(path))
    with pytest.raises(ConfigError, match=r"settings \{'k1': 0.9\} cannot be rebuilt from the spec"):
        ragsuite.load(str(path), data_dir=data)


def test_a_program_on_a_corpus_file_loads_where_the_file_is_now(tmp_path, monkeypatch):
    """A corpus file moved (another machine, another folder): corpus= names where it is now; its hash must be
    the saved one, a hybrid's members over that file follow it, and the hybrid's merge settings are kept."""
    import shutil

    import ragsuite
    from ragsuite.errors import ConfigError
    from ragsuite.retrieval.bm25 import BM25Retriever
    from ragsuite.retrieval.hybrid import HybridRetriever

    monkeypatch.setenv("RAGSUITE_CACHE", str(tmp_path / "cache"))
    first = write_dataset(tmp_path / "first", "hotpotqa", "river") / "hotpotqa" / "corpus.jsonl"
    retriever = HybridRetriever([BM25Retriever.from_file(first), BM25Retriever.from_file(first)], mode="rrf")
    path = tmp_path / "hybrid.json"
    programs.get("vanilla")(retriever=retriever, top_k=2).save(str(path))
    moved = tmp_path / "elsewhere" / "rivers.jsonl"
    moved.parent.mkdir()
    shutil.move(first, moved)
    with pytest.raises(ConfigError, match=r"no longer exists .*ragsuite.load\(path, corpus=NEW_PATH\)"):
        ragsuite.load(str(path))
    loaded = ragsuite.load(str(path), corpus=moved)
    assert loaded.retriever.describe()["spec"] == f"hybrid:rrf:bm25:{moved}+bm25:{moved}"
    query = "Which river fact?"
    assert [p.id for p in loaded.retriever(query, 2)] == [p.id for p in retriever(query, 2)]

    other = write_dataset(tmp_path / "other", "hotpotqa", "lake") / "hotpotqa" / "corpus.jsonl"
    with pytest.raises(ConfigError, match=r"corpus hash mismatch: .*lake|corpus hash mismatch: .*other"):
        ragsuite.load(str(path), corpus=other)

    # Merge settings travel in the spec and are rebuilt, not dropped.
    deeper = HybridRetriever([BM25Retriever.from_file(moved)], mode="rrf", rrf_k=10, depth=20)
    deeper_path = tmp_path / "deeper.json"
    programs.get("vanilla")(retriever=deeper, top_k=2).save(str(deeper_path))
    reloaded = ragsuite.load(str(deeper_path)).retriever
    assert (reloaded.rrf_k, reloaded.depth) == (10, 20)
    assert reloaded.describe()["spec"] == f"hybrid:rrf:bm25:{moved}:rrf_k=10:depth=20"


# -- the compiled program shipped for the local LM ----------------------------------------------------------


SHIPPED = sorted((Path(__file__).parents[2] / "examples" / "compiled").glob("*.json"))


@pytest.fixture(scope="module")
def shipped(repo_root):
    """The compiled vanilla program file shipped in examples/."""
    return repo_root / "examples" / "compiled" / "vanilla-nq-local.json"


def stage_replies(request: ScriptedRequest) -> dict:
    """A well-formed reply for any stage of the shipped programs: DeepNote's loop takes one step and stops."""
    replies = {"queries": ["a follow-up query"], "better": False}
    return {name: replies.get(name, "an answer") for name in request.output_fields}


@pytest.mark.parametrize("path", SHIPPED, ids=[path.stem for path in SHIPPED])
def test_each_shipped_compiled_program_names_the_default_local_model_and_its_demos_reach_the_prompts(
    tmp_path, data_dir, path
):
    """Every file in ``examples/compiled`` (docs/local-lm.md has each one's held-out scores) was compiled for
    the default local model: a change of default must compile it again. Each predictor's demos reach every
    prompt of that predictor, and eval leaves out the questions the file was compiled on."""
    from ragsuite.local_lm.models import PACKAGED_MODELS
    from ragsuite.programs.program_file import load_for_data

    default = PACKAGED_MODELS[0]
    document = json.loads(path.read_text())
    assert document["metadata"]["lm"] == f"local/{default.name}-{default.sha256[:12]}"  # the served name
    dataset = document["metadata"]["dataset"]
    program = load_for_data(path, dataset=dataset, data_dir=data_dir).program
    demo_questions = {  # a predictor's output fields -> the questions of its demos
        tuple(predictor.signature.output_fields): [demo["question"] for demo in predictor.demos]
        for _, predictor in program.named_predictors()
    }
    assert (
        sum(map(len, demo_questions.values()))
        == sum(len(state["demos"]) for state in document["predictors"].values())
        > 0
    )
    holdout = document["metadata"]["holdout"]
    seen = {*holdout["train_ids"], *holdout["val_ids"]}
    dev = (data_dir / dataset / "dev.jsonl").read_text().splitlines()
    fixture_ids = [json.loads(line)["id"] for line in dev]

    with LocalOpenAIServer(stage_replies) as server:
        argv = eval_argv(path, dataset, data_dir, "--lm", "openai/scripted", "--api-base", server.api_base)
        run = tmp_path / "run"
        argv[argv.index("--out") + 1] = str(run)
        assert main([*argv, "--limit", "3"]) == 0
        requests = list(server.requests)
    reached = set()
    for request in requests:
        (outputs,) = [o for o in demo_questions if set(o) <= set(request.output_fields)]
        prompt = json.dumps(request.messages)
        assert all(question in prompt for question in demo_questions[outputs]), outputs
        reached.add(outputs)
    assert reached == {outputs for outputs, questions in demo_questions.items() if questions}
    answered = [json.loads(line)["id"] for line in (run / "records.jsonl").read_text().splitlines()]
    assert sorted(answered) == sorted([i for i in fixture_ids if i not in seen][:3])  # in completion order


def test_compare_uncompiled_runs_the_file_without_its_demos_on_the_same_questions_and_prints_both(
    tmp_path, data_dir, shipped, capsys
):
    """``--compare-uncompiled``: the file's program answers, then the same program without its demos answers
    the same held-out questions into OUT/uncompiled; both rows and their paired difference are printed, and
    a rerun resumes both runs without a request."""
    demos = json.loads(shipped.read_text())["predictors"]["answer"]["demos"]

    def respond(request: ScriptedRequest) -> dict:
        return {name: "an answer" for name in request.output_fields}

    run = tmp_path / "run"
    with LocalOpenAIServer(respond) as server:
        argv = eval_argv(shipped, "nq", data_dir, "--lm", "openai/scripted", "--api-base", server.api_base)
        argv[argv.index("--out") + 1] = str(run)
        assert main([*argv, "--limit", "3", "--compare-uncompiled"]) == 0
        prompts = [json.dumps(request.messages) for request in server.requests]
        printed = capsys.readouterr().out
        assert main([*argv, "--limit", "3", "--compare-uncompiled"]) == 0  # resumed: both runs complete
        assert len(server.requests) == 6
    with_demos = [p for p in prompts if all(demo["question"] in p for demo in demos)]
    without = [p for p in prompts if not any(demo["question"] in p for demo in demos)]
    assert len(with_demos) == 3 and len(without) == 3 and prompts[:3] == with_demos  # the file's run first

    def ids(folder: Path) -> list[str]:
        return sorted(json.loads(line)["id"] for line in (folder / "records.jsonl").read_text().splitlines())

    assert len(ids(run)) == 3 and ids(run / "uncompiled") == ids(run)
    assert json.loads((run / "uncompiled" / "manifest.json").read_text())["demos"] == "removed"
    assert "| vanilla (compiled) | nq |" in printed and "| vanilla (no demos) | nq |" in printed
    assert "| compiled [run] | no demos [uncompiled] |" in printed  # the paired comparison, per metric
    assert "| A - B | 95% CI | p | p < 0.05 |" in printed
    assert f"records: {run / 'uncompiled' / 'records.jsonl'}" in printed


def test_compare_uncompiled_needs_a_program_file(tmp_path, data_dir, capsys) -> None:
    argv = ["eval", "--program", "vanilla", "--dataset", "nq", "--data-dir", str(data_dir), "--lm", "local",
            "--compare-uncompiled", "--out", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) == 2
    assert (
        "--compare-uncompiled compares a program file with itself without its demos"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "run").exists()


# -- one call from Python: ragsuite.load on another dataset -------------------------------------------------
def test_ragsuite_load_runs_a_saved_program_on_another_dataset_in_one_call(
    tmp_path, tuned_on_hotpotqa, caplog
):
    import ragsuite
    from ragsuite.errors import ConfigError
    from ragsuite.programs.program_file import load_for_data

    mountains = write_dataset(tmp_path / "mountains", "asqa", "mountain")
    with caplog.at_level(logging.WARNING):
        program = ragsuite.load(str(tuned_on_hotpotqa), dataset="asqa", data_dir=mountains)
    assert program.task == "long" and program.knobs() == {"top_k": 2}
    assert program.retriever.describe()["spec"] == "bm25:asqa"
    assert {p.id for p in program.retriever("mountain fact", 3)} <= {f"mountain-{i}" for i in range(6)}
    assert (
        f"{tuned_on_hotpotqa}: saved for dataset 'hotpotqa'; running on 'asqa' (--dataset wins)"
        in caplog.text
    )

    loaded = load_for_data(tuned_on_hotpotqa, dataset="asqa", data_dir=mountains, top_k=3)
    assert loaded.program.knobs() == {"top_k": 3}
    assert loaded.differences[:3] == [
        "saved for dataset 'hotpotqa'; running on 'asqa' (--dataset wins)",
        "saved with answer task 'short'; using 'long', the task of 'asqa'",
        "saved with retriever 'bm25:hotpotqa'; using 'bm25:asqa'",
    ]
    same = load_for_data(tuned_on_hotpotqa, dataset="hotpotqa", data_dir=tuned_on_hotpotqa.parent / "rivers")
    assert same.differences == [] and same.program.task == "short"
    with pytest.raises(ConfigError, match="holds program 'vanilla', not 'deepnote'"):
        load_for_data(tuned_on_hotpotqa, dataset="asqa", data_dir=mountains, program="deepnote")


def test_the_program_file_is_read_once_and_its_class_looked_up_once(tmp_path, tuned_on_hotpotqa, monkeypatch):
    from ragsuite.programs import program_file

    reads, lookups = [], []
    read, get = program_file.read_program_file, programs.get
    monkeypatch.setattr(program_file, "read_program_file", lambda path: reads.append(path) or read(path))
    monkeypatch.setattr(programs, "get", lambda name: lookups.append(name) or get(name))
    mountains = write_dataset(tmp_path / "mountains", "asqa", "mountain")
    args = build_parser().parse_args(
        [*eval_argv(tuned_on_hotpotqa, "asqa", mountains), "--lm", "openai/m", "--set", "top_k=4"]
    )
    program, _ = build_program(args, "long")
    assert program.knobs() == {"top_k": 4}
    assert len(reads) == 1 and lookups == ["vanilla"]


def test_a_program_tuned_again_holds_out_what_its_file_held_out_and_a_corrupt_holdout_adds_nothing():
    from ragsuite.cli.args import with_earlier_holdout

    new = {"holdout": {"dataset": "hotpotqa", "train_ids": [], "val_ids": ["v1", "v2"]}}
    earlier = {"holdout": {"train_ids": ["t1", 7, None, True, ["x"]], "val_ids": ["v1"]}}
    merged = with_earlier_holdout(earlier, new)
    assert merged == {"holdout": {"dataset": "hotpotqa", "train_ids": ["t1", "7"], "val_ids": ["v1", "v2"]}}
    assert with_earlier_holdout({"holdout": "garbage"}, new) == new
    assert with_earlier_holdout({"holdout": {"train_ids": "t1"}}, new) == new
