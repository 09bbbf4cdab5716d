"""Loading the shipped datasets and the data-directory resolution."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import ujson

import ragsuite.paths
from ragsuite.data import (
    dataset_names,
    get_dataset_info,
    load_corpus,
    load_corpus_file,
    load_dataset,
    load_examples_file,
    write_jsonl,
)
from ragsuite.errors import DataError
from ragsuite.paths import data_dir as resolve_data_dir

# (dev questions, corpus passages) of the shipped dev splits.
# The committed fixtures (tests/fixtures/make_fixtures.py): 40 questions per dataset, 400 passages per corpus.
SHIPPED = {
    "hotpotqa": (40, 400),
    "2wikimultihopqa": (40, 400),
    "musique": (40, 400),
    "strategyqa": (40, 400),
    "asqa": (40, 400),
    "nq": (40, 400),
    "triviaqa": (40, None),
}


def test_registry_knows_every_dataset() -> None:
    assert set(dataset_names()) == set(SHIPPED)
    assert get_dataset_info("strategyqa").task == "yesno"
    assert get_dataset_info("asqa").task == "long"
    assert get_dataset_info("hotpotqa").primary_metric in get_dataset_info("hotpotqa").metrics
    with pytest.raises(DataError, match=r"unknown dataset 'hotpot'.*hotpotqa"):
        get_dataset_info("hotpot")


@pytest.mark.parametrize("name", list(SHIPPED))
def test_shipped_dataset_loads(name: str, data_dir: Path) -> None:
    n_questions, n_passages = SHIPPED[name]
    examples = load_dataset(name, data_dir=data_dir)
    assert len(examples) == n_questions
    assert len({ex.id for ex in examples}) == n_questions
    for ex in examples:
        assert set(ex.inputs().keys()) == {"question"}
        assert ex.question.strip() and ex.answers and all(isinstance(a, str) for a in ex.answers)
        assert isinstance(ex.gold_passage_ids, list)
    if n_passages is None:
        assert not get_dataset_info(name).has_corpus
        with pytest.raises(DataError, match="ships no corpus"):
            load_corpus(name, data_dir=data_dir)
        return
    corpus = load_corpus(name, data_dir=data_dir)
    assert len(corpus) == n_passages
    ids = {p.id for p in corpus}
    # Every gold passage is in the corpus; questions without one are rare (one ASQA question).
    for ex in examples:
        assert set(ex.gold_passage_ids) <= ids, ex.id
    assert sum(not ex.gold_passage_ids for ex in examples) == (1 if name == "asqa" else 0)


def test_asqa_short_answers_and_task_labels(data_dir: Path) -> None:
    asqa = load_dataset("asqa", data_dir=data_dir)
    first = asqa[0]
    assert first.question == "How many times have the lakers won the finals?"
    assert first.short_answers == [["16"], ["16"], ["16"]]
    assert all(ex.short_answers and all(group for group in ex.short_answers) for ex in asqa)
    assert "short_answers" not in load_dataset("hotpotqa", data_dir=data_dir)[0]
    assert {ex.answers[0] for ex in load_dataset("strategyqa", data_dir=data_dir)} == {"yes", "no"}


def _write_dataset(root: Path, name: str, rows: list[dict], corpus: list[dict] | None = None) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "dev.jsonl").write_text("".join(ujson.dumps(r) + "\n" for r in rows), encoding="utf-8")
    if corpus is not None:
        (folder / "corpus.jsonl").write_text("".join(ujson.dumps(r) + "\n" for r in corpus), encoding="utf-8")


ROW = {"id": "q1", "question": "Who?", "answers": ["Rush"], "type": "bridge", "gold_passage_ids": ["p1"]}


def test_data_dir_resolution_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    arg, env, home = tmp_path / "arg", tmp_path / "env", tmp_path / "home-data"
    _write_dataset(arg, "hotpotqa", [{**ROW, "answers": ["from-arg"]}])
    _write_dataset(env, "hotpotqa", [{**ROW, "answers": ["from-env"]}])
    _write_dataset(home, "hotpotqa", [{**ROW, "answers": ["from-default"]}])
    monkeypatch.setattr(ragsuite.paths, "DEFAULT_DATA_DIR", home)
    monkeypatch.setenv("RAGSUITE_DATA", str(env))

    assert load_dataset("hotpotqa", data_dir=arg)[0].answers == ["from-arg"]
    assert load_dataset("hotpotqa")[0].answers == ["from-env"]
    monkeypatch.delenv("RAGSUITE_DATA")
    assert load_dataset("hotpotqa")[0].answers == ["from-default"]
    assert ragsuite.paths.download_root() == home

    # A directory that was asked for but is missing is an error, not a fall-through.
    with pytest.raises(DataError, match="does not exist"):
        resolve_data_dir(tmp_path / "nowhere")
    monkeypatch.setenv("RAGSUITE_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="RAGSUITE_DATA"):
        resolve_data_dir()


def test_without_data_the_error_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ragsuite.paths, "DEFAULT_DATA_DIR", tmp_path / "nothing-yet")
    monkeypatch.delenv("RAGSUITE_DATA", raising=False)
    with pytest.raises(DataError) as info:
        load_dataset("hotpotqa")
    message = str(info.value)
    assert str(tmp_path / "nothing-yet") in message
    assert "ragsuite data download" in message and "--data-dir" in message and "RAGSUITE_DATA" in message
    # A data folder without that dataset names the command that installs it.
    _write_dataset(tmp_path / "some", "nq", [ROW])
    with pytest.raises(DataError, match="ragsuite data download hotpotqa"):
        load_dataset("hotpotqa", data_dir=tmp_path / "some")
    with pytest.raises(DataError, match="ragsuite data download nq"):
        load_corpus("nq", data_dir=tmp_path / "some")


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"id": "q2", "question": "Why?", "answers": ["x"]', "not valid JSON"),
        ('["a list"]', "expected a JSON object"),
        ('{"id": "q2", "answers": ["x"]}', "missing or empty 'question'"),
        ('{"id": "q2", "question": "Why?", "answers": "x"}', "'answers' must be a list"),
        ('{"id": "q2", "question": "Why?", "answers": ["x"], "gold_passage_ids": "p1"}', "gold_passage_ids"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path: Path, line: str, problem: str) -> None:
    folder = tmp_path / "musique"
    folder.mkdir()
    # Line 2 is blank and line 3 is the bad one: the reported number is the file's line number.
    (folder / "dev.jsonl").write_text(ujson.dumps(ROW) + "\n\n" + line + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=problem) as info:
        load_dataset("musique", data_dir=tmp_path)
    assert f"{folder / 'dev.jsonl'}:3:" in str(info.value)


def test_a_byte_that_is_not_utf8_names_file_line_and_fix(tmp_path: Path, capsys) -> None:
    """A Latin-1 byte in a dataset, questions or corpus file was a UnicodeDecodeError traceback (exit 1).
    The bad line comes after 2,000 good ones: the reader decodes ahead, so its position is not the line."""
    from ragsuite.cli import main

    good = "".join(ujson.dumps({**ROW, "id": f"q{i}"}) + "\n" for i in range(2000)).encode()
    folder = tmp_path / "musique"
    folder.mkdir()
    dev = folder / "dev.jsonl"
    dev.write_bytes(good + '{"id": "bad", "question": "Caf\u00e9?", "answers": ["x"]}\n'.encode("latin-1"))
    expected = (
        rf"{re.escape(str(dev))}:2001: not valid UTF-8 \(byte 0xe9 at column 31\); save the file as UTF-8"
    )
    with pytest.raises(DataError, match=expected):
        load_dataset("musique", data_dir=tmp_path)
    questions = tmp_path / "q.csv"
    questions.write_bytes(b"id,question,answers\nq1,Who?,Rush\nq2,Caf\xe9?,x\n")
    with pytest.raises(DataError, match=r"q.csv:3: not valid UTF-8 \(byte 0xe9 at column 7\)"):
        load_examples_file(questions)
    corpus = tmp_path / "c.tsv"
    corpus.write_bytes(b"id\ttitle\ttext\np1\tA\tna\xefve\n")
    with pytest.raises(DataError, match=r"c.tsv:2: not valid UTF-8 \(byte 0xef at column 8\)"):
        load_corpus_file(corpus)
    # On the command line: one line naming the file and line, exit 2, before any LM is asked.
    argv = ["eval", "--program", "no-retrieval", "--dataset", "musique", "--data-dir", str(tmp_path)]
    argv += ["--out", str(tmp_path / "run")]
    code = main([*argv, "--retriever", "none", "--lm", "openai/x", "--api-base", "http://127.0.0.1:9/v1"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {dev}:2001: not valid UTF-8 (byte 0xe9"), err
    assert "Traceback" not in err


def test_malformed_asqa_groups_and_missing_split(tmp_path: Path) -> None:
    _write_dataset(tmp_path, "asqa", [{**ROW, "short_answers": ["16", "17"]}])
    with pytest.raises(DataError, match=r"dev.jsonl:1: 'short_answers' must be a list of alias lists"):
        load_dataset("asqa", data_dir=tmp_path)
    with pytest.raises(DataError, match=r"train.jsonl does not exist"):
        load_dataset("asqa", split="train", data_dir=tmp_path)


def test_corpus_errors(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        '{"id": "p1", "title": "T", "text": "a"}\n{"id": "p1", "text": "b"}\n', encoding="utf-8"
    )
    with pytest.raises(DataError, match=r"corpus.jsonl:2: duplicate passage id 'p1'"):
        load_corpus_file(corpus)
    corpus.write_text('{"id": "p1", "title": "T"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"corpus.jsonl:1: a corpus line needs 'id' and 'text'"):
        load_corpus_file(corpus)


def test_write_jsonl_is_atomic_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "out" / "dev.jsonl"
    rows = [{**ROW, "question": "Qué? “quoted” / slash", "short_answers": [["a", "b"]]}]
    assert write_jsonl(path, rows) == 1
    loaded = load_examples_file(path)
    assert loaded[0].question == rows[0]["question"]
    assert loaded[0].short_answers == [["a", "b"]]

    def failing():
        yield {**ROW, "id": "new"}
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        write_jsonl(path, failing())
    # The old file is intact and no temporary file is left behind.
    assert [ex.id for ex in load_examples_file(path)] == ["q1"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["dev.jsonl"]


def test_a_missing_split_names_the_download_that_writes_it_or_the_split_to_pass(tmp_path):
    from ragsuite.data.datasets import load_dataset

    (tmp_path / "hotpotqa").mkdir()
    with pytest.raises(DataError, match=r"ragsuite data download hotpotqa --subset dev` writes it"):
        load_dataset("hotpotqa", split="dev", data_dir=tmp_path)
    (tmp_path / "nq").mkdir()
    with pytest.raises(
        DataError, match=r"no download writes dev\.jsonl for nq; they write test\.jsonl.*--split test"
    ):
        load_dataset("nq", split="dev", data_dir=tmp_path)
