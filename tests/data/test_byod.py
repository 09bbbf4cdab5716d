"""Bring-your-own data: question and corpus files in several formats, corpus-file retriever specs that save
and reload, hold-out bookkeeping between compile/tune and eval, and ``eval --questions --corpus`` end to end
against the local OpenAI-compatible server."""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

import pytest

import ragsuite
from ragsuite.cli import main
from ragsuite.data.datasets import load_corpus_file, load_examples_file
from ragsuite.errors import ConfigError, DataError
from ragsuite.retrieval.bm25 import BM25Retriever
from ragsuite.retrieval.spec import build_retriever, is_corpus_path
from ragsuite.testing.openai_server import LocalOpenAIServer
from ragsuite.testing.responders import grounded_responder

ENTITIES = [
    "Aldorine", "Brevast", "Corvanth", "Dellmire", "Eskaval", "Fenmoor",
    "Galtrey", "Hollowind", "Istravel", "Jorvane", "Kestrum", "Lumbrell",
]  # fmt: skip
FOUNDERS = [
    "Mara Quill", "Odo Fenn", "Rhea Tarn", "Silas Vow", "Tamsin Reed", "Ulric Hale",
    "Vera Lusk", "Wendel Oak", "Xara Pike", "Yorick Dale", "Zelda Moor", "Piet Grau",
]  # fmt: skip


def question_rows() -> list[dict]:
    rows = [
        {
            "id": f"q{i}",
            "question": f"Who founded {entity}?",
            "answers": [FOUNDERS[i]],
            "gold_passage_ids": [f"p{i}"],
            "type": "bridge",
        }
        for i, entity in enumerate(ENTITIES)
    ]
    # One question with two gold passages (only one can be in a top-1 retrieval), one with none.
    rows[1]["gold_passage_ids"] = ["p1", "p11"]
    rows[2]["gold_passage_ids"] = []
    return rows


def corpus_rows() -> list[dict]:
    return [
        {"id": f"p{i}", "title": entity, "text": f"{entity} was founded by {FOUNDERS[i]} long ago."}
        for i, entity in enumerate(ENTITIES)
    ]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_delimited(path: Path, rows: list[dict], delimiter: str) -> Path:
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), delimiter=delimiter)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in row.items()})
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture
def data(tmp_path: Path) -> tuple[Path, Path]:
    return (
        write_jsonl(tmp_path / "questions.jsonl", question_rows()),
        write_jsonl(tmp_path / "corpus.jsonl", corpus_rows()),
    )


def gold() -> dict[str, str]:
    return {row["question"]: row["answers"][0] for row in question_rows()}


# -- loading --------------------------------------------------------------------------------------------


def _fields(examples: list) -> list[tuple]:
    return [(e.id, e.question, e.answers, e.gold_passage_ids, e.type) for e in examples]


def test_questions_load_alike_from_jsonl_csv_tsv_and_parquet(tmp_path: Path) -> None:
    rows = question_rows()
    expected = _fields(load_examples_file(write_jsonl(tmp_path / "q.jsonl", rows)))
    assert expected[1][3] == ["p1", "p11"] and expected[2][3] == []
    assert _fields(load_examples_file(write_delimited(tmp_path / "q.csv", rows, ","))) == expected
    assert _fields(load_examples_file(write_delimited(tmp_path / "q.tsv", rows, "\t"))) == expected
    assert _fields(load_examples_file(write_parquet(tmp_path / "q.parquet", rows))) == expected
    # A CSV cell may hold one plain answer instead of a JSON list; rows without an id get file-line ids.
    (tmp_path / "plain.csv").write_text("question,answers\nWho?,Rush\n", encoding="utf-8")
    [example] = load_examples_file(tmp_path / "plain.csv")
    assert (example.id, example.answers, example.gold_passage_ids) == ("plain-2", ["Rush"], [])


def test_corpus_loads_alike_from_jsonl_tsv_and_parquet(tmp_path: Path) -> None:
    rows = corpus_rows()
    expected = load_corpus_file(write_jsonl(tmp_path / "c.jsonl", rows))
    assert [p.id for p in expected] == [f"p{i}" for i in range(len(rows))]
    assert load_corpus_file(write_delimited(tmp_path / "c.tsv", rows, "\t")) == expected
    assert load_corpus_file(write_parquet(tmp_path / "c.parquet", rows)) == expected


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("q.csv", "question,answer\nWho?,Rush\n", r"q.csv:2: no 'answers' .*columns found: question, answer"),
        (
            "q.csv",
            'question,answers\nWho?,Rush\nWhy?,"[""x"",\n',
            r"q.csv:3: 'answers' is not a valid JSON list",
        ),
        ("q.csv", "question,answers\n,Rush\n", r"q.csv:2: missing or empty 'question'"),
        ("q.csv", "question,answers\n", r"q.csv is empty: it has no rows"),
        ("q.jsonl", "\n\n", r"q.jsonl is empty"),
        ("q.txt", "question\n", r"unknown file type '.txt'; use one of .jsonl, .csv, .tsv, .parquet"),
        (
            "q.jsonl",
            '{"id": "a", "question": "Who?", "answers": ["x"]}\n'
            '{"id": "a", "question": "Why?", "answers": []}\n',
            r"q.jsonl:2: id 'a' repeats line 1; ids must be unique",
        ),
        ("q.csv", "question,answers,extra\nWho?,Rush,1,2\n", r"q.csv:2: 4 cells but the header names 3"),
    ],
)
def test_bad_question_files_name_file_and_line(tmp_path: Path, name: str, text: str, problem: str) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=problem):
        load_examples_file(path)


def test_bad_corpus_files_name_file_and_line(tmp_path: Path) -> None:
    tsv = tmp_path / "c.tsv"
    tsv.write_text("id\ttitle\ttext\np1\tA\tone\np1\tB\ttwo\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"c.tsv:3: duplicate passage id 'p1' \(first on line 2\)"):
        load_corpus_file(tsv)
    tsv.write_text("id\ttitle\tbody\np1\tA\tone\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"c.tsv:2: a corpus line needs 'id' and 'text' \(columns found"):
        load_corpus_file(tsv)
    tsv.write_text("id\ttitle\ttext\n\tA\tone\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"c.tsv:2: empty passage 'id'"):
        load_corpus_file(tsv)


def test_parquet_without_pyarrow_names_the_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DataError, match=r"c.parquet \(Parquet\) needs pyarrow: pip install pyarrow"):
        load_corpus_file(path)


# -- retriever specs over corpus files -------------------------------------------------------------------


def test_corpus_paths_are_told_apart_from_dataset_names() -> None:
    assert is_corpus_path("data/corpus.jsonl") and is_corpus_path("./mine")
    assert is_corpus_path("corpus.tsv") and is_corpus_path("c.PARQUET") and is_corpus_path("c.csv")
    assert not is_corpus_path("hotpotqa") and not is_corpus_path("2wikimultihopqa")


def test_bm25_over_a_corpus_file_records_path_and_hash_and_caches_by_content(tmp_path: Path) -> None:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", corpus_rows())
    retriever = build_retriever(f"bm25:{corpus}", cache_dir=tmp_path / "cache")
    described = retriever.describe()
    assert described["spec"] == f"bm25:{corpus.resolve()}"
    assert described["corpus_path"] == str(corpus.resolve())
    import hashlib

    assert described["corpus_sha256"] == hashlib.sha256(corpus.read_bytes()).hexdigest()
    assert [p.id for p in retriever("Who founded Galtrey?", 1)] == ["p6"]
    # --corpus with a bare spec is the same index; a copy elsewhere is found in the cache by content.
    copy = tmp_path / "elsewhere" / "copy.jsonl"
    copy.parent.mkdir()
    shutil.copy(corpus, copy)
    again = build_retriever("bm25", corpus=copy, cache_dir=tmp_path / "cache")
    assert again.index_key == retriever.index_key and not again.index_built
    # Changed content is a different index, built afresh.
    write_jsonl(copy, [*corpus_rows(), {"id": "extra", "title": "New", "text": "Something new."}])
    changed = build_retriever(f"bm25:{copy}", cache_dir=tmp_path / "cache")
    assert changed.index_key != retriever.index_key and changed.index_built


def test_a_program_on_your_own_corpus_saves_and_reloads(tmp_path: Path) -> None:
    from ragsuite.programs.baselines import VanillaRAG

    corpus = write_jsonl(tmp_path / "corpus.jsonl", corpus_rows())
    program = VanillaRAG(retriever=BM25Retriever.from_file(corpus), top_k=2)
    path = tmp_path / "program.json"
    program.save(str(path))
    loaded = ragsuite.load(str(path))
    assert loaded.retriever.describe() == program.retriever.describe()
    assert [p.id for p in loaded.retriever("Who founded Brevast?", 1)] == ["p1"]

    moved = tmp_path / "moved.jsonl"
    corpus.rename(moved)
    with pytest.raises(ConfigError, match=r"corpus file .*corpus.jsonl it was built on no longer exists"):
        ragsuite.load(str(path))
    write_jsonl(corpus, corpus_rows()[:5])
    with pytest.raises(ConfigError, match=r"corpus.jsonl changed since the program was saved"):
        ragsuite.load(str(path))
    # A hybrid's members are checked the same way.
    hybrid = VanillaRAG(retriever=build_retriever(f"hybrid:rrf:bm25:{moved}+bm25:{moved}"), top_k=2)
    hybrid_path = tmp_path / "hybrid.json"
    hybrid.save(str(hybrid_path))
    write_jsonl(moved, corpus_rows()[:3])
    with pytest.raises(ConfigError, match=r"moved.jsonl changed since the program was saved"):
        ragsuite.load(str(hybrid_path))
    # An explicit retriever accepts the change.
    assert (
        ragsuite.load(str(path), retriever=BM25Retriever.from_file(corpus)).retriever.describe()[
            "num_passages"
        ]
        == 5
    )


# -- the CLI ------------------------------------------------------------------------------------------


def _lm(server: LocalOpenAIServer) -> list[str]:
    return ["--lm", "openai/x", "--api-base", server.api_base, "--no-cache"]


def _records(run: Path) -> dict[str, dict]:
    lines = (run / "records.jsonl").read_text().splitlines()
    return {record["id"]: record for record in map(json.loads, lines)}


def test_eval_on_your_own_questions_and_corpus(tmp_path: Path, data, capsys) -> None:
    questions, corpus = data
    run = tmp_path / "run"
    with LocalOpenAIServer(grounded_responder(gold()), model="x") as server:
        args = ["eval", "--program", "vanilla", "--questions", str(questions), "--corpus", str(corpus)]
        code = main([*args, "--set", "top_k=1", "--no-progress", "--out", str(run), *_lm(server)])
    assert code == 0, capsys.readouterr().err
    records = _records(run)
    assert len(records) == len(ENTITIES) and all(r["error"] is None for r in records.values())
    assert records["q0"]["passage_ids"] == ["p0"] and records["q0"]["retrieval_recall"] == 1.0
    assert records["q1"]["retrieval_recall"] == 0.5  # gold p1 and p11, one passage retrieved
    assert records["q2"]["retrieval_recall"] is None  # no gold passages: no figure
    assert records["q0"]["prediction"] == FOUNDERS[0]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["dataset"] == "short"
    assert manifest["split"]["questions"] == str(questions.resolve())
    assert manifest["retriever"]["corpus_path"] == str(corpus.resolve())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["metrics"]["exact_match"] == 1.0 and summary["n"] == len(ENTITIES)
    assert summary["retrieval_recall"] == pytest.approx(10.5 / 11)  # q2 has no gold ids: not counted


def test_task_picks_the_metrics_and_contradictions_are_refused(tmp_path: Path, data, capsys) -> None:
    questions, corpus = data
    with LocalOpenAIServer(grounded_responder({}), model="x") as server:
        base = ["eval", "--program", "vanilla", "--questions", str(questions), "--corpus", str(corpus)]
        code = main(
            [
                *base,
                "--task",
                "yesno",
                "--limit",
                "1",
                "--no-progress",
                "--out",
                str(tmp_path / "a"),
                *_lm(server),
            ]
        )
        assert code == 0
        summary = json.loads((tmp_path / "a" / "summary.json").read_text())
        assert list(summary["metrics"]) == ["yes_no_accuracy"]
        code = main(
            [*base, "--dataset", "hotpotqa", "--task", "yesno", "--out", str(tmp_path / "b"), *_lm(server)]
        )
        assert code == 2
        assert "--task yesno contradicts --dataset hotpotqa" in capsys.readouterr().err
        code = main(["eval", "--program", "vanilla", "--out", str(tmp_path / "c"), *_lm(server)])
        assert code == 2
        assert "--dataset NAME, or --questions FILE" in capsys.readouterr().err
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_compile_records_what_it_saw_and_eval_leaves_it_out(tmp_path: Path, data, capsys) -> None:
    questions, corpus = data
    program = tmp_path / "compiled.json"
    data_flags = ["--questions", str(questions), "--corpus", str(corpus)]
    with LocalOpenAIServer(grounded_responder(gold()), model="x") as server:
        code = main(
            [
                "compile", "--program", "vanilla", *data_flags, "--optimizer", "bootstrap",
                "--train", "3", "--val", "2", "--no-eval", "--out", str(program), *_lm(server),
            ]
        )  # fmt: skip
        assert code == 0, capsys.readouterr().err
        holdout = json.loads(program.read_text())["metadata"]["holdout"]
        seen = set(holdout["train_ids"]) | set(holdout["val_ids"])
        assert len(holdout["train_ids"]) == 3 and len(holdout["val_ids"]) == 2 and len(seen) == 5
        assert holdout["questions"] == str(questions.resolve()) and holdout["split_seed"] == 0
        capsys.readouterr()

        run = tmp_path / "held-out"
        eval_args = ["eval", "--program-file", str(program), *data_flags, "--no-progress"]
        assert main([*eval_args, "--out", str(run), *_lm(server)]) == 0
        assert f"excluded 5 of {len(ENTITIES)} examples the program was compiled/tuned on" in (
            capsys.readouterr().err
        )
        assert set(_records(run)) == {row["id"] for row in question_rows()} - seen
        assert json.loads((run / "manifest.json").read_text())["holdout_excluded"] == 5
        # The limit counts held-out examples.
        assert main([*eval_args, "--limit", "4", "--out", str(tmp_path / "limited"), *_lm(server)]) == 0
        assert len(_records(tmp_path / "limited")) == 4 and not set(_records(tmp_path / "limited")) & seen

        everything = tmp_path / "overlap"
        assert main([*eval_args, "--allow-overlap", "--out", str(everything), *_lm(server)]) == 0
        assert "5 of 12 examples were used to compile/tune this program" in capsys.readouterr().err
        assert len(_records(everything)) == len(ENTITIES)
        assert json.loads((everything / "manifest.json").read_text())["holdout_excluded"] == 0


def test_eval_refuses_when_nothing_is_held_out(tmp_path: Path, data, capsys) -> None:
    _questions, corpus = data
    program = tmp_path / "compiled.json"
    few = write_jsonl(tmp_path / "few.jsonl", question_rows()[:5])
    with LocalOpenAIServer(grounded_responder(gold()), model="x") as server:
        compile_args = ["compile", "--program", "vanilla", "--questions", str(few), "--corpus", str(corpus)]
        rest = ["--optimizer", "bootstrap", "--train", "3", "--val", "2", "--no-eval", "--out", str(program)]
        assert main([*compile_args, *rest, *_lm(server)]) == 0
        capsys.readouterr()
        code = main(
            [
                "eval",
                "--program-file",
                str(program),
                "--questions",
                str(few),
                "--corpus",
                str(corpus),
                "--no-progress",
                "--out",
                str(tmp_path / "run"),
                *_lm(server),
            ]
        )
    assert code == 2
    assert "all 5 examples were used to compile/tune this program" in capsys.readouterr().err


def test_tune_records_its_validation_ids_for_eval(tmp_path: Path, data, capsys) -> None:
    questions, corpus = data
    out = tmp_path / "tune"
    data_flags = ["--questions", str(questions), "--corpus", str(corpus)]
    with LocalOpenAIServer(grounded_responder(gold()), model="x") as server:
        code = main(
            [
                "tune",
                "--program",
                "vanilla",
                *data_flags,
                "--trials",
                "2",
                "--train",
                "3",
                "--val",
                "3",
                "--out",
                str(out),
                *_lm(server),
            ]
        )
        assert code == 0, capsys.readouterr().err
        [best] = out.glob("*/best.json")  # one study: OUT/<study>/best.json
        saved = json.loads(best.read_text())
        holdout = saved["metadata"]["holdout"]
        assert len(holdout["val_ids"]) == 3 and holdout["train_ids"] == []
        assert "tuning" in saved["metadata"]  # the tuning record is kept alongside
        capsys.readouterr()
        run = tmp_path / "run"
        eval_args = ["eval", "--program-file", str(best), *data_flags, "--no-progress"]
        assert main([*eval_args, "--out", str(run), *_lm(server)]) == 0
    assert "excluded 3 of 12 examples" in capsys.readouterr().err
    assert not set(_records(run)) & set(holdout["val_ids"])


def test_retrieve_eval_and_index_take_your_own_files(tmp_path: Path, data, capsys) -> None:
    questions, corpus = data
    cache = ["--cache-dir", str(tmp_path / "cache")]
    args = ["retrieve-eval", "--questions", str(questions), "--corpus", str(corpus), "--k", "1", "--json"]
    assert main([*args, *cache]) == 0
    metrics = json.loads(capsys.readouterr().out)
    # 11 questions have gold ids; q1's two gold passages cannot both be in a top-1.
    assert metrics["n"] == 11 and metrics["recall@1"] == pytest.approx(10.5 / 11)
    assert main(["index", "--corpus", str(corpus), "--json", *cache]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["corpus"] == str(corpus.resolve()) and info["passages"] == len(ENTITIES)
    assert not info["built"]  # retrieve-eval built it; the cache is keyed by content
    assert main(["index", "--json", *cache]) == 2
    assert "give exactly one of --dataset NAME or --corpus FILE" in capsys.readouterr().err


def test_serve_retriever_indexes_your_corpus_file(tmp_path: Path, data) -> None:
    from ragsuite.cli import build_parser
    from ragsuite.cli.serve_retriever import build_retriever_for

    _, corpus = data
    cache = ["--cache-dir", str(tmp_path / "cache")]
    for flags in (["--corpus", str(corpus)], ["--retriever", "bm25", "--corpus", str(corpus)]):
        args = build_parser().parse_args(["serve-retriever", *flags, *cache])
        retriever = build_retriever_for(args)
        assert retriever.describe()["spec"] == f"bm25:{corpus.resolve()}"
        assert [p.id for p in retriever("Who founded Kestrum?", 1)] == ["p10"]


def test_index_builds_show_progress_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = write_jsonl(tmp_path / "corpus.jsonl", corpus_rows())
    build_retriever(f"bm25:{corpus}", cache_dir=tmp_path / "quiet")
    assert "BM25 index" not in capsys.readouterr().err
    build_retriever(f"hybrid:rrf:bm25:{corpus}+bm25:{corpus}", cache_dir=tmp_path / "shown", progress=True)
    assert "BM25 index" in capsys.readouterr().err  # hybrid members are built with the bar too
