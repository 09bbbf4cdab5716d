"""Readers of the public dataset releases, on small fixtures shaped like the real files."""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path

import pytest

from ragsuite.cli import main
from ragsuite.data import load_corpus, load_dataset
from ragsuite.data.metrics import score_example
from ragsuite.data.readers import FORMATS, convert, passage_id, read
from ragsuite.errors import DataError


def _json(path: Path, data: object, *, indent: int | None = None) -> Path:
    path.write_text(json.dumps(data, indent=indent), encoding="utf-8")
    return path


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


RUSH = ["Rush (band)", [" Rush is a Canadian rock band.", " Its drummer was Neil Peart."]]
PEART = ["Neil Peart", ["Neil Peart was a drummer.", "He was inducted into the Modern Drummer Hall of Fame."]]
TOTO = ["Toto", ["Toto is an American band."]]

HOTPOT = [
    {
        "_id": "5a7f6fd75542992e7d278cfa",
        "question": "Which Canadian band had a Hall of Fame drummer?",
        "answer": "Rush",
        "type": "bridge",
        "level": "hard",
        "supporting_facts": [["Rush (band)", 0], ["Neil Peart", 1], ["Neil Peart", 0]],
        "context": [RUSH, TOTO, PEART],
    },
    {
        "_id": "5ab48ec25542991779162cdc",
        "question": "Is Toto American?",
        "answer": "yes",
        "type": "comparison",
        "level": "easy",
        "supporting_facts": [["Toto", 0]],
        "context": [TOTO, RUSH],  # shared paragraphs are stored once
    },
]


def test_passage_id_matches_the_shipped_corpora(data_dir: Path) -> None:
    passage = load_corpus("hotpotqa", data_dir=data_dir)[0]
    assert passage_id(passage.title, passage.text) == passage.id
    assert passage_id("T", "x") == hashlib.sha1(b"T\nx").hexdigest()[:16]


@pytest.mark.parametrize("fmt", ["hotpotqa", "2wikimultihopqa"])
def test_hotpot_like(tmp_path: Path, fmt: str) -> None:
    records = [dict(r) for r in HOTPOT]
    if fmt == "2wikimultihopqa":
        records[0]["evidences"] = [["Rush", "member", "Neil Peart"]]
    data = read(fmt, _json(tmp_path / "in.json", records))
    assert [p.title for p in data.passages] == ["Rush (band)", "Toto", "Neil Peart"]
    rush = data.passages[0]
    # Sentences keep their own spacing; one space is inserted where a sentence has none.
    assert rush.text == "Rush is a Canadian rock band. Its drummer was Neil Peart."
    assert (
        data.passages[2].text
        == "Neil Peart was a drummer. He was inducted into the Modern Drummer Hall of Fame."
    )
    assert rush.id == passage_id("Rush (band)", rush.text)
    first, second = data.rows
    assert first == {
        "id": "5a7f6fd75542992e7d278cfa",
        "question": "Which Canadian band had a Hall of Fame drummer?",
        "answers": ["Rush"],
        "type": "bridge",
        "gold_passage_ids": [rush.id, data.passages[2].id],
    }
    assert second["gold_passage_ids"] == [data.passages[1].id]


def test_hotpot_errors_name_the_record(tmp_path: Path) -> None:
    bad = [HOTPOT[0], {**HOTPOT[1], "supporting_facts": [["Missing", 0]]}]
    with pytest.raises(
        DataError, match=r"in\.json\[1\] \(5ab48ec25542991779162cdc\): supporting fact title 'Missing'"
    ):
        read("hotpotqa", _json(tmp_path / "in.json", bad))
    with pytest.raises(DataError, match=r"\[0\] .*'context' must be a list of \[title, \[sentence"):
        read("hotpotqa", _json(tmp_path / "in.json", [{**HOTPOT[0], "context": [["Rush", "flat"]]}]))
    unlabelled = {k: v for k, v in HOTPOT[0].items() if k != "answer"}
    with pytest.raises(DataError, match="missing 'answer'"):
        read("hotpotqa", _json(tmp_path / "in.json", [unlabelled]))
    with pytest.raises(DataError, match="evidences"):
        read("2wikimultihopqa", _json(tmp_path / "in.json", [{**HOTPOT[0], "evidences": ["flat"]}]))
    (tmp_path / "broken.json").write_text('[{"_id": 1,', encoding="utf-8")
    with pytest.raises(DataError, match=r"broken\.json: not valid JSON"):
        read("hotpotqa", tmp_path / "broken.json")
    with pytest.raises(DataError, match="does not exist"):
        read("hotpotqa", tmp_path / "nope.json")
    with pytest.raises(DataError, match="unknown format"):
        read("squad", tmp_path / "in.json")


def _musique_paragraph(idx: int, title: str, text: str, supporting: bool) -> dict:
    return {"idx": idx, "title": title, "paragraph_text": text, "is_supporting": supporting}


MUSIQUE = [
    {
        "id": "2hop__150763_14904",
        "paragraphs": [
            _musique_paragraph(0, "APA", "The APA publishes the Journal of Psychotherapy Integration.", True),
            _musique_paragraph(1, "Kansas", "Kansas is a state.", False),
            _musique_paragraph(2, "G. Stanley Hall", "Hall was the first president of the APA.", True),
        ],
        "question": "Who was the first president of the association which published the journal?",
        "question_decomposition": [
            {"id": 150763, "question": "Journal >> publisher", "answer": "APA", "paragraph_support_idx": 0},
            {"id": 14904, "question": "first president of #1", "answer": "Hall", "paragraph_support_idx": 2},
        ],
        "answer": "G. Stanley Hall",
        "answer_aliases": ["Stanley Hall", "G. Stanley Hall"],
        "answerable": True,
    },
    {
        "id": "3hop1__1_2_3",
        "paragraphs": [_musique_paragraph(0, "Kansas", "Kansas is a state.", False)],
        "question": "An unanswerable question?",
        "question_decomposition": [],
        "answer": "",
        "answer_aliases": [],
        "answerable": False,
    },
]


def test_musique(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "musique.jsonl", MUSIQUE)
    data = read("musique", path)
    assert len(data.passages) == 3
    (row,) = data.rows
    assert row["answers"] == ["G. Stanley Hall", "Stanley Hall"]
    assert row["type"] == "2hop"
    ids = {p.title: p.id for p in data.passages}
    assert row["gold_passage_ids"] == [ids["APA"], ids["G. Stanley Hall"]]
    everything = read("musique", path, include_unanswerable=True)
    assert [r["type"] for r in everything.rows] == ["2hop", "3hop1"]
    assert everything.rows[1]["gold_passage_ids"] == []
    assert len(everything.passages) == 3  # "Kansas" is shared

    broken = [MUSIQUE[0], {**MUSIQUE[0], "paragraphs": [{"idx": 0, "title": "T"}]}]
    with pytest.raises(
        DataError, match=r"musique\.jsonl:2 \(2hop__150763_14904\) paragraphs\[0\]: missing 'paragraph_text'"
    ):
        read("musique", _jsonl(tmp_path / "musique.jsonl", broken))
    with pytest.raises(DataError, match=r"musique\.jsonl:1 \(2hop__150763_14904\): empty 'answer'"):
        read(
            "musique",
            _jsonl(tmp_path / "musique.jsonl", [{**MUSIQUE[0], "answer": " ", "answer_aliases": []}]),
        )
    (tmp_path / "musique.jsonl").write_text(json.dumps(MUSIQUE[0]) + "\n{oops\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"musique\.jsonl:2: not valid JSON"):
        read("musique", tmp_path / "musique.jsonl")


ALCE_ASQA = [
    {
        "question": "How many times have the lakers won the finals?",
        "answer": "The Lakers have won 17 titles.",
        "qa_pairs": [
            {
                "context": "...",
                "question": "By 2017?",
                "short_answers": ["16", "sixteen"],
                "wikipage": "Lakers",
            },
            {"context": "...", "question": "By 2020?", "short_answers": ["17"], "wikipage": "Lakers"},
        ],
        "wikipages": [
            {"title": "Los Angeles Lakers", "url": "https://en.wikipedia.org/wiki/Los_Angeles_Lakers"}
        ],
        "annotations": [
            {
                "knowledge": [
                    {"content": "The Lakers have won 17 championships.", "wikipage": "Los Angeles Lakers"}
                ],
                "long_answer": "As of 2017 they had won 16 titles; in 2020 they won their 17th.",
            },
            {"knowledge": [], "long_answer": "They won 16 by 2017 and 17 by 2020."},
        ],
        "sample_id": "-7464414779466400769",
        "docs": [
            {"id": "123", "title": "Los Angeles Lakers", "text": "The Lakers play in LA.", "score": 1.5},
            {"id": "124", "title": "Los Angeles Lakers", "text": "The Lakers have won 17 championships."},
        ],
    }
]


def test_asqa_alce_and_original(tmp_path: Path) -> None:
    data = read("asqa", _json(tmp_path / "asqa.json", ALCE_ASQA))
    (row,) = data.rows
    assert row["id"] == "-7464414779466400769"
    assert row["short_answers"] == [["16", "sixteen"], ["17"]]
    assert row["answers"] == [
        "As of 2017 they had won 16 titles; in 2020 they won their 17th.",
        "They won 16 by 2017 and 17 by 2020.",
    ]
    # The annotated knowledge is gold; the identical retrieved doc is the same passage; the other is not gold.
    assert len(data.passages) == 2
    gold = data.passages[0]
    assert (gold.title, gold.text) == ("Los Angeles Lakers", "The Lakers have won 17 championships.")
    assert row["gold_passage_ids"] == [gold.id]

    original = {"train": {}, "dev": {"-1": {**ALCE_ASQA[0], "ambiguous_question": "How many?"}}}
    for item in original["dev"].values():
        del item["question"], item["docs"], item["sample_id"]
    data = read("asqa", _json(tmp_path / "ASQA.json", original), split="dev")
    assert data.rows[0]["id"] == "-1" and data.rows[0]["question"] == "How many?"
    with pytest.raises(DataError, match="'qa_pairs'"):
        read("asqa", _json(tmp_path / "ASQA.json", original), split="test")
    broken = [{**ALCE_ASQA[0], "qa_pairs": [{"short_answers": "16"}]}]
    with pytest.raises(
        DataError,
        match=r"asqa\.json\[0\] \(-7464414779466400769\) qa_pairs\[0\]: 'short_answers' must be list",
    ):
        read("asqa", _json(tmp_path / "asqa.json", broken))


STRATEGY = [
    {
        "qid": "c69397b4341b65ed080f",
        "term": "Saint Vincent",
        "description": "island country",
        "question": "Is the language used in Saint Vincent rooted in English?",
        "answer": True,
        "facts": ["English is the official language."],
        "decomposition": ["What language is used?", "Is #1 rooted in English?"],
        "evidence": [
            [[["Saint Vincent-3"]], [["English language-1", "Saint Vincent-3"]]],
            [[["Saint Vincent-3"]], ["operation"]],
            [["no_evidence"], ["operation"]],
        ],
    },
    {
        "qid": "2047c0c34383f8014820",
        "question": "Can the Swiss Guard fill the assembly chairs?",
        "answer": False,
        "evidence": [[["no_evidence"]]],
    },
]
PARAGRAPHS = {
    "Saint Vincent-3": {"title": "Saint Vincent", "section": "Language", "headers": [], "para_index": 3,
                        "content": "English is the official language."},
    "English language-1": {"title": "English language", "section": "", "headers": [], "para_index": 1,
                           "content": "English is a West Germanic language."},
    "Unused-0": {"title": "Unused", "content": "Not evidence."},
}  # fmt: skip


def test_strategyqa(tmp_path: Path) -> None:
    questions = _json(tmp_path / "strategyqa_train.json", STRATEGY, indent=2)
    paragraphs = _json(tmp_path / "paragraphs.json", PARAGRAPHS, indent=2)  # one pretty-printed document
    data = read("strategyqa", questions, paragraphs=paragraphs)
    assert [p.title for p in data.passages] == ["Saint Vincent", "English language"]
    first, second = data.rows
    assert first["answers"] == ["yes"] and second["answers"] == ["no"]
    assert first["type"] == "yes/no"
    assert first["gold_passage_ids"] == [p.id for p in data.passages]
    assert second["gold_passage_ids"] == []
    bare = read("strategyqa", questions)
    assert bare.passages == [] and bare.rows[0]["gold_passage_ids"] == []

    missing = _json(tmp_path / "few.json", {"Saint Vincent-3": PARAGRAPHS["Saint Vincent-3"]})
    with pytest.raises(
        DataError, match=r"\(c69397b4341b65ed080f\): evidence paragraph 'English language-1' is not in"
    ):
        read("strategyqa", questions, paragraphs=missing)
    with pytest.raises(DataError, match="'answer' must be true/false"):
        read("strategyqa", _json(tmp_path / "q.json", [{**STRATEGY[1], "answer": "maybe"}]))
    with pytest.raises(DataError, match="mapping paragraph ids"):
        read("strategyqa", questions, paragraphs=_json(tmp_path / "list.json", [1, 2]))
    (tmp_path / "cut.json").write_text(json.dumps(PARAGRAPHS, indent=2)[:-20], encoding="utf-8")
    with pytest.raises(DataError, match=r"cut\.json: not valid JSON"):
        read("strategyqa", questions, paragraphs=tmp_path / "cut.json")


def test_nq_open_dpr_and_fid(tmp_path: Path) -> None:
    nq_open = _jsonl(
        tmp_path / "NQ-open.dev.jsonl",
        [
            {"question": "who sang i ran all the way home", "answer": ["The Impalas"]},
            {"question": "when was the first ipod released", "answer": ["October 23, 2001", "2001"]},
        ],
    )
    data = read("nq", nq_open)
    assert data.passages == []
    assert [r["id"] for r in data.rows] == ["nq-open-0000", "nq-open-0001"]
    assert data.rows[1]["answers"] == ["October 23, 2001", "2001"]

    positive = {"title": "The Impalas", "text": "The Impalas sang it.", "score": 1000, "passage_id": "1"}
    negative = {"title": "IPod", "text": "The iPod was released in 2001.", "passage_id": "2"}
    dpr = _json(
        tmp_path / "nq-dev.json",
        [
            {
                "dataset": "nq_dev_psgs_w100",
                "question": "who sang i ran all the way home",
                "answers": ["The Impalas"],
                "positive_ctxs": [positive],
                "negative_ctxs": [negative],
                "hard_negative_ctxs": [],
            }
        ],
    )
    data = read("nq", dpr)
    assert [p.title for p in data.passages] == ["The Impalas", "IPod"]
    assert data.rows[0]["gold_passage_ids"] == [data.passages[0].id]

    fid = _jsonl(
        tmp_path / "fid.jsonl",
        [
            {
                "id": "7",
                "question": "when was the first ipod released",
                "answers": ["2001"],
                "ctxs": [
                    {
                        "id": "9",
                        "title": "IPod",
                        "text": "The iPod was released in 2001.",
                        "has_answer": True,
                    },
                    {"id": "8", "title": "Apple", "text": "Apple makes computers.", "has_answer": False},
                ],
            }
        ],
    )
    data = read("nq", fid)
    assert data.rows[0]["id"] == "7"
    assert data.rows[0]["gold_passage_ids"] == [passage_id("IPod", "The iPod was released in 2001.")]
    with pytest.raises(DataError, match=r"bad\.jsonl:1: 'answer' \(or 'answers'\) must be a non-empty list"):
        read("nq", _jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": []}]))
    with pytest.raises(DataError, match=r"bad\.jsonl:1 ctxs\[0\]: missing 'text'"):
        read(
            "nq",
            _jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": ["a"], "ctxs": [{"title": "t"}]}]),
        )


def test_converted_files_load_like_shipped_data(tmp_path: Path) -> None:
    inputs = {
        "hotpotqa": _json(tmp_path / "hotpot.json", HOTPOT),
        "musique": _jsonl(tmp_path / "musique.jsonl", MUSIQUE),
        "asqa": _json(tmp_path / "asqa.json", ALCE_ASQA),
    }
    root = tmp_path / "data"
    for fmt, path in inputs.items():
        stats = convert(fmt, path, root / fmt)
        assert stats["questions"] >= 1 and stats["passages"] >= 1
    examples = load_dataset("hotpotqa", data_dir=root)
    corpus_ids = {p.id for p in load_corpus("hotpotqa", data_dir=root)}
    assert len(corpus_ids) == 3
    assert all(set(ex.gold_passage_ids) <= corpus_ids for ex in examples)
    (asqa,) = load_dataset("asqa", data_dir=root)
    assert score_example("asqa", asqa, "16 titles, then a 17th.") == {"str_em": 1.0, "str_hit": 1.0}
    assert load_dataset("musique", data_dir=root)[0].answers == ["G. Stanley Hall", "Stanley Hall"]


def test_cli_convert_and_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "data" / "strategyqa"
    questions = _json(tmp_path / "strategyqa_train.json", STRATEGY)
    paragraphs = _json(tmp_path / "paragraphs.json", PARAGRAPHS)
    code = main(
        [
            "data",
            "convert",
            "--format",
            "strategyqa",
            str(questions),
            str(out),
            "--paragraphs",
            str(paragraphs),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "wrote 2 questions" in printed and "wrote 2 passages" in printed
    assert sorted(p.name for p in out.iterdir()) == ["corpus.jsonl", "dev.jsonl"]  # no temporary files left
    assert [ex.answers for ex in load_dataset("strategyqa", data_dir=tmp_path / "data")] == [["yes"], ["no"]]

    assert main(["data", "list", "--data-dir", str(tmp_path / "data"), "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    by_name = {d["name"]: d for d in listing["datasets"]}
    assert set(by_name) >= set(FORMATS)
    assert by_name["strategyqa"] == {
        "name": "strategyqa",
        "task": "yesno",
        "metrics": ["yes_no_accuracy"],
        "primary_metric": "yes_no_accuracy",
        "questions": 2,
        "passages": 2,
    }
    assert by_name["hotpotqa"]["questions"] is None
    assert main(["data", "list", "--data-dir", str(tmp_path / "data")]) == 0
    assert re.search(r"^strategyqa +yesno +yes_no_accuracy +2 +2$", capsys.readouterr().out, re.MULTILINE)

    # A malformed input writes nothing and exits with an error naming the file.
    before = (out / "dev.jsonl").read_text(encoding="utf-8")
    bad = _json(tmp_path / "bad.json", [{**STRATEGY[0], "answer": "maybe"}])
    assert main(["data", "convert", "--format", "strategyqa", str(bad), str(out)]) == 2
    assert "bad.json[0]" in capsys.readouterr().err
    assert (out / "dev.jsonl").read_text(encoding="utf-8") == before
    assert (
        main(["data", "convert", "--format", "nq", str(bad), str(out), "--paragraphs", str(paragraphs)]) == 2
    )
    assert "--paragraphs applies to --format strategyqa only" in capsys.readouterr().err


# --- encodings and sizes: one error line naming file and record, never a traceback ------------------------


def _convert_cli(fmt: str, path: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["data", "convert", "--format", fmt, str(path), str(out)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (
            "jsonl invalid utf-8",
            r"musique\.jsonl:2: byte 0xe9 is not valid UTF-8; .*re-save the file as UTF-8",
        ),
        ("json invalid utf-8", r"hotpot\.json:\d+: byte 0xff is not valid UTF-8"),
        ("jsonl utf-16", r"musique\.jsonl: the file is UTF-16 or UTF-32 encoded; .*iconv -f UTF-16"),
        ("json utf-16 without bom", r"hotpot\.json: the file is UTF-16 or UTF-32 encoded"),
        ("jsonl lone surrogate", r"musique\.jsonl:1: the escape \\ud800 is half of a UTF-16 surrogate pair"),
        ("json lone surrogate", r"hotpot\.json\[1\]: the escape \\udc00 is half of a UTF-16 surrogate pair"),
    ],
)
def test_cli_convert_refuses_bad_encodings_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, expected: str
) -> None:
    musique = "".join(json.dumps(r) + "\n" for r in MUSIQUE)
    hotpot = json.dumps(HOTPOT, indent=1)
    if case == "jsonl invalid utf-8":
        path, fmt = tmp_path / "musique.jsonl", "musique"
        lines = musique.encode().split(b"\n")
        path.write_bytes(b"\n".join([lines[0], lines[1].replace(b"Kansas", b"K\xe9nsas", 1), *lines[2:]]))
    elif case == "json invalid utf-8":
        path, fmt = tmp_path / "hotpot.json", "hotpotqa"
        path.write_bytes(hotpot.encode().replace(b"Toto is", b"Toto \xff", 1))
    elif case == "jsonl utf-16":
        path, fmt = tmp_path / "musique.jsonl", "musique"
        path.write_bytes(musique.encode("utf-16"))
    elif case == "json utf-16 without bom":
        path, fmt = tmp_path / "hotpot.json", "hotpotqa"
        path.write_bytes(hotpot.encode("utf-16-le"))
    elif case == "jsonl lone surrogate":
        path, fmt = tmp_path / "musique.jsonl", "musique"
        path.write_text(musique.replace("Kansas", "Kansas \\ud800", 1), encoding="utf-8")
    else:
        path, fmt = tmp_path / "hotpot.json", "hotpotqa"
        path.write_text(hotpot.replace("Is Toto American?", "Is Toto \\udc00?"), encoding="utf-8")
    out = tmp_path / "out"
    code, err = _convert_cli(fmt, path, out, capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert re.search(expected, err), err
    assert not out.exists()  # nothing written


def test_a_utf8_byte_order_mark_and_valid_surrogate_pairs_are_read(tmp_path: Path) -> None:
    lines = "".join(json.dumps(r) + "\n" for r in MUSIQUE).replace("Kansas", "Kansas \\ud83d\\ude00", 1)
    jsonl = tmp_path / "musique.jsonl"
    jsonl.write_bytes(b"\xef\xbb\xbf" + lines.encode())
    data = read("musique", jsonl)
    assert any("Kansas \U0001f600" in p.text or "Kansas \U0001f600" in p.title for p in data.passages)
    array = tmp_path / "hotpot.json"
    array.write_bytes(b"\xef\xbb\xbf" + json.dumps(HOTPOT).encode())
    assert len(read("hotpotqa", array).rows) == 2


def test_a_record_above_the_size_limit_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragsuite.data import readers

    assert readers.MAX_RECORD_CHARS == 64 << 20  # the documented limit
    monkeypatch.setattr(readers, "MAX_RECORD_CHARS", 5000)
    monkeypatch.setattr(readers, "_CHUNK", 1024)  # the long line spans chunks
    path = tmp_path / "musique.jsonl"
    huge = {**MUSIQUE[0], "question": "x" * 6000}
    path.write_text("".join(json.dumps(r) + "\n" for r in [MUSIQUE[0], huge, MUSIQUE[0]]), encoding="utf-8")
    with pytest.raises(DataError, match=r"musique\.jsonl:2: a record longer than 5,000 characters"):
        read("musique", path)
    path.write_text(json.dumps(huge), encoding="utf-8")  # the first line, no newline at all
    with pytest.raises(DataError, match=r"musique\.jsonl:1: a record longer than 5,000 characters"):
        read("musique", path)
    # One item of a streamed JSON array.
    stream = io.BytesIO(json.dumps([HOTPOT[0], {**HOTPOT[1], "question": "y" * 6000}]).encode())
    with pytest.raises(DataError, match=r"a\.json\[1\]: a record longer than 5,000 characters"):
        list(readers.iter_json_stream(("a.json", stream)))
    # Below the limit, the same lines are read.
    monkeypatch.setattr(readers, "MAX_RECORD_CHARS", 7000)
    assert len(read("musique", tmp_path / "musique.jsonl").rows) == 1


def test_a_long_line_costs_about_twice_its_size_to_read() -> None:
    import tracemalloc

    from ragsuite.data.readers import iter_json_stream

    size = 8 << 20  # two read chunks
    data = json.dumps({"id": "a", "text": "x" * size}).encode() + b'\n{"id": "b"}\n'
    tracemalloc.start()
    try:
        ids = [record["id"] for _, record in iter_json_stream(("big.jsonl", io.BytesIO(data)))]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert ids == ["a", "b"]
    assert peak < 4 * size, f"{peak / size:.1f}x the line's size"  # ujson alone took 6x, the reader 9x


def test_a_tsv_field_over_csvs_limit_names_the_line(tmp_path: Path) -> None:
    from ragsuite.data.readers import stream_dpr_tsv

    text = "id\ttext\ttitle\n1\tA passage.\tA\n2\t" + "w " * 70_000 + "\tB\n3\tC.\tC\n"
    with pytest.raises(DataError, match=r"psgs\.tsv:3: field larger than field limit \(131072\)"):
        list(stream_dpr_tsv([[("psgs.tsv", io.BytesIO(text.encode()))]]))
    bad = "id\ttext\ttitle\n1\tA passage.\tA\n2\tB \xe9\tB\n".encode("latin-1")
    with pytest.raises(DataError, match=r"psgs\.tsv: after line \d+: byte 0xe9 is not valid UTF-8"):
        list(stream_dpr_tsv([[("psgs.tsv", io.BytesIO(bad))]]))
