"""``ragsuite data download`` end to end against a local HTTP server (127.0.0.1) that serves tiny fixture
files in each source's original format, at the catalogue's own URLs: official hosts through
``RAGSUITE_MIRROR`` (``GET /<host>/<path>``), Hub files through ``HF_ENDPOINT`` (the Hub's resolve endpoint,
with the metadata headers ``huggingface_hub`` reads)."""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import hashlib
import io
import json
import logging
import random
import re
import socket
import tarfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from ragsuite.cli import main
from ragsuite.data import download as dl
from ragsuite.data.datasets import load_corpus, load_corpus_file, load_dataset
from ragsuite.data.readers import passage_id
from ragsuite.data.sources import CATALOGUE, Catalogue, Input, Source
from ragsuite.errors import ConfigError, DataError

# --- fixture files in the sources' formats ------------------------------------------------------------


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _tar(members: dict[str, bytes], mode: str = "w") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def _json(data) -> bytes:
    return json.dumps(data, indent=1).encode()


PARAS = {
    "Scott Derrickson": "Scott Derrickson is an American director.",
    "Ed Wood": "Ed Wood was an American filmmaker.",
    "Kiss and Tell": "Kiss and Tell is a 1945 comedy film.",
    "Shirley Temple": "Shirley Temple was an American actress.",
}


def _ircot_row(qid: str, question: str, answer: str, gold: list[str], other: str) -> dict:
    contexts = [
        {"idx": i, "title": t, "paragraph_text": PARAS[t], "is_supporting": True} for i, t in enumerate(gold)
    ]
    contexts.append({"idx": 9, "title": other, "paragraph_text": PARAS[other], "is_supporting": False})
    answers = [{"number": "", "date": {"day": "", "month": "", "year": ""}, "spans": [answer]}]
    return {"question_id": qid, "question_text": question, "answers_objects": answers, "contexts": contexts}


IRCOT_ROWS = [
    _ircot_row(
        "q1",
        "Were Scott Derrickson and Ed Wood of the same nationality?",
        "yes",
        ["Scott Derrickson", "Ed Wood"],
        "Kiss and Tell",
    ),
    _ircot_row(
        "2hop__7_8",
        "Who starred in Kiss and Tell?",
        "Shirley Temple",
        ["Kiss and Tell", "Shirley Temple"],
        "Ed Wood",
    ),
]


def _hotpot_record(qid: str, titles: list[str], answer: str = "yes") -> dict:
    return {
        "_id": qid,
        "question": f"Question {qid}?",
        "answer": answer,
        "type": "comparison",
        "context": [[t, [PARAS[t]]] for t in titles],
        "supporting_facts": [[titles[0], 0]],
        "evidences": [],
    }


def _musique_record(qid: str, titles: list[str], answerable: bool = True) -> dict:
    return {
        "id": qid,
        "question": f"Question {qid}?",
        "answer": "Shirley Temple",
        "answer_aliases": ["Shirley Jane Temple"],
        "answerable": answerable,
        "paragraphs": [
            {"idx": i, "title": t, "paragraph_text": PARAS[t], "is_supporting": i == 0}
            for i, t in enumerate(titles)
        ],
    }


def _dpr_tsv(n: int) -> bytes:
    rng = random.Random(7)
    words = [f"w{rng.randrange(10_000)}" for _ in range(4000)]
    lines = ["id\ttext\ttitle"]
    for i in range(1, n + 1):
        text = " ".join(rng.choice(words) for _ in range(30))
        lines.append(f'{i}\t"{text} ""quoted"""\tTitle {i % 50}')
    return gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)


DPR_ROWS = 3000

ASQA = [
    {
        "sample_id": f"-{k}",
        "question": f"Who played in film {k}?",
        "qa_pairs": [{"short_answers": ["Ann", "Anne"]}, {"short_answers": ["Bob"]}],
        "annotations": [
            {"long_answer": "Ann and Bob.", "knowledge": [{"content": "Ann played.", "wikipage": "Film"}]}
        ],
        "docs": [{"title": "Film", "text": "A film."}],
    }
    for k in range(3)
]
STRATEGY = [
    {
        "qid": f"s{k}",
        "question": f"Is {k} even?",
        "answer": k % 2 == 0,
        "evidence": [[[f"P-{k}"], "operation"]],
    }
    for k in range(5)
]
STRATEGY_PARAS = {
    f"P-{k}": {"title": f"Number {k}", "content": f"{k} is a number.", "section": ""} for k in range(5)
}
FLASHRAG = [
    {"id": f"test_{k}", "question": f"who is {k}", "golden_answers": [f"A{k}", f"B{k}"], "metadata": {}}
    for k in range(4)
]


def _fixture_files() -> dict[str, bytes]:
    """Remote filename (as in the catalogue) -> bytes in the source's original format."""
    abstracts = "".join(
        json.dumps({"id": i, "url": "", "title": t, "text": [" " + PARAS[t]]}) + "\n"
        for i, t in enumerate(PARAS)
    ).encode()
    return {
        "ircot_processed_data.zip": _zip(
            {
                f"processed_data/{d}/test_subsampled.jsonl": _jsonl(IRCOT_ROWS)
                for d in ("hotpotqa", "2wikimultihopqa", "musique")
            }
            | {"processed_data/hotpotqa/dev_subsampled.jsonl": _jsonl(IRCOT_ROWS[:1])}
        ),
        "hotpot_dev_distractor_v1.json": _json(
            [_hotpot_record("h1", ["Ed Wood", "Kiss and Tell"]), _hotpot_record("h2", ["Shirley Temple"])]
        ),
        "enwiki-20171001-pages-meta-current-withlinks-abstracts.tar.bz2": _tar(
            {
                "enwiki-20171001-pages-meta-current-withlinks-abstracts/AA/wiki_00.bz2": bz2.compress(
                    abstracts
                )
            },
            "w:bz2",
        ),
        "2wikimultihopqa_data_ids.zip": _zip(
            {
                "data_ids/train.json": _json([_hotpot_record("t1", ["Scott Derrickson", "Ed Wood"])]),
                "data_ids/dev.json": _json([_hotpot_record("d1", ["Kiss and Tell", "Shirley Temple"])]),
                "data_ids/test.json": _json([_hotpot_record("x1", ["Kiss and Tell", "Ed Wood"])]),
                "data_ids/id_aliases.json": b"{}",
            }
        ),
        "musique_v1.0.zip": _zip(
            {
                f"data/musique_{v}_v1.0_{s}.jsonl": _jsonl(
                    [
                        _musique_record(
                            f"2hop__{v}{s}",
                            ["Kiss and Tell", "Shirley Temple", "Scott Derrickson", "Ed Wood"],
                            v == "ans",
                        )
                    ]
                )
                for v in ("ans", "full")
                for s in ("dev", "test", "train")
            }
        ),
        "ALCE-data.tar": _tar(
            {
                "ALCE-data/asqa_eval_gtr_top100.json": _json(ASQA),
                "ALCE-data/eli5_eval_bm25_top100.json": b"[]",
            }
        ),
        "strategyqa_dataset.zip": _zip(
            {
                "strategyqa_train.json": _json(STRATEGY),
                "strategyqa_train_paragraphs.json": _json(STRATEGY_PARAS),
            }
        ),
        "flashrag_nq_test.jsonl": _jsonl(FLASHRAG),
        "flashrag_triviaqa_test.jsonl": _jsonl(FLASHRAG[:3]),
        "psgs_w100.tsv.gz": _dpr_tsv(DPR_ROWS),
    }


# Rows each fixture source holds, in place of the real counts.
ROWS = {
    "ircot-test-500": 2,
    ("hotpotqa", "dev"): 2,
    ("2wikimultihopqa", "dev"): 1,
    ("musique", "dev"): 1,
    "alce-948": 3,
    "sample-500": 3,
    ("nq", "test"): 4,
    ("triviaqa", "test"): 3,
    "wiki18-100w": DPR_ROWS,
}


def fixture_catalogue(overrides: dict | None = None) -> Catalogue:
    """The real catalogue (same URLs, members, converters) with the fixtures' row counts."""
    sources = []
    for source in CATALOGUE:
        rows = ROWS.get((source.dataset, source.name), ROWS.get(source.name))
        changes = {"expected_rows": rows}
        if source.sample is not None:
            changes["sample"] = 3
        changes.update((overrides or {}).get((source.dataset, source.name), {}))
        sources.append(dataclasses.replace(source, **changes))
    return Catalogue(tuple(sources))


# --- the server ----------------------------------------------------------------------------------------


def _git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Server:
    """Serves the fixture files at their mirror / Hub paths; can drop a connection mid-body."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.routes: dict[str, bytes] = {}
        self.hub_headers: dict[str, dict[str, str]] = {}
        for file in {inp.file for source in CATALOGUE for inp in source.inputs}:
            data = files[file.filename]
            if file.hub_repo:
                path = f"/datasets/{file.hub_repo}/resolve/{file.hub_revision}/{file.hub_path}"
                small = (
                    len(data) < 10_000
                )  # the Hub stores small files in git (etag = blob sha1), big ones in LFS
                self.hub_headers[path] = (
                    {"ETag": f'"{_git_sha1(data)}"'}
                    if small
                    else {
                        "X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"',
                        "X-Linked-Size": str(len(data)),
                    }
                )
            else:
                parts = urlsplit(file.url)
                path = f"/{parts.netloc}{parts.path}" + (f"?{parts.query}" if parts.query else "")
            self.routes[path] = data
        self.drop_after: dict[str, int] = {}
        self.ignore_range = False  # answer every GET with the whole file (200), as servers without Range do
        self.ignore_if_range = False  # answer Range with 206 whatever If-Range says, as broken servers do
        self.validators = True  # send ETag and Last-Modified
        self.log: list[tuple[str, str, str | None]] = []
        self.if_range: list[str | None] = []  # the If-Range header of each GET
        self.authorization: list[str] = []  # Authorization headers received (a token must never be sent)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                server.log.append(("HEAD", self.path, None))
                server.authorization += self.headers.get_all("Authorization") or []
                if self.path not in server.routes:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(server.routes[self.path])))
                self.send_header("X-Repo-Commit", "0" * 40)
                for key, value in server.hub_headers.get(self.path, {}).items():
                    self.send_header(key, value)
                self.end_headers()

            def do_GET(self) -> None:
                rng = self.headers.get("Range")
                server.log.append(("GET", self.path, rng))
                server.authorization += self.headers.get_all("Authorization") or []
                server.if_range.append(self.headers.get("If-Range"))
                data = server.routes.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                etag = server.etag(data)
                start = int(rng.split("=")[1].rstrip("-")) if rng and not server.ignore_range else 0
                if_range = self.headers.get("If-Range")
                if if_range is not None and if_range != etag and not server.ignore_if_range:
                    start = 0  # another version than the client's part: the whole file (RFC 9110 13.1.5)
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                if server.validators:
                    self.send_header("ETag", etag)
                    self.send_header("Last-Modified", "Mon, 02 Nov 2026 10:00:00 GMT")
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                body = data[start:]
                cut = server.drop_after.pop(self.path, None)
                if cut is not None:
                    self.wfile.write(body[:cut])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)  # the connection drops mid-body
                    return
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @staticmethod
    def etag(data: bytes) -> str:
        return '"' + hashlib.sha256(data).hexdigest()[:20] + '"'

    def replace(self, filename: str, data: bytes) -> None:
        """Serve ``data`` as ``filename`` from now on (a Hub file's published checksum and size follow)."""
        file = next(inp.file for s in CATALOGUE for inp in s.inputs if inp.file.filename == filename)
        if not file.hub_repo:
            self.routes[self.path_of(filename)] = data
            return
        path = f"/datasets/{file.hub_repo}/resolve/{file.hub_revision}/{file.hub_path}"
        self.routes[path] = data
        if "ETag" in self.hub_headers[path]:
            self.hub_headers[path] = {"ETag": f'"{_git_sha1(data)}"'}
        else:
            self.hub_headers[path] = {
                "X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"',
                "X-Linked-Size": str(len(data)),
            }

    def path_of(self, filename: str) -> str:
        file = next(inp.file for s in CATALOGUE for inp in s.inputs if inp.file.filename == filename)
        parts = urlsplit(file.url)
        return f"/{parts.netloc}{parts.path}" + (f"?{parts.query}" if parts.query else "")

    def gets(self, filename: str) -> list[str | None]:
        path = self.path_of(filename)
        return [rng for method, p, rng in self.log if method == "GET" and p == path]


@pytest.fixture
def server(monkeypatch):
    srv = Server(_fixture_files())
    srv.thread.start()
    try:
        monkeypatch.setenv("RAGSUITE_MIRROR", srv.url)
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        monkeypatch.delenv("RAGSUITE_DATA", raising=False)
        yield srv
    finally:
        srv.httpd.shutdown()
        srv.httpd.server_close()
        srv.thread.join(timeout=10)


def _hotpot_dev(data_dir: Path, catalogue: Catalogue | None = None, **options) -> list:
    """Downloads HotpotQA's dev questions alone (no corpus) into ``data_dir``, quietly, from ``catalogue`` (by
    default the fixtures' catalogue)."""
    catalogue = fixture_catalogue() if catalogue is None else catalogue
    return dl.download(
        ["hotpotqa"],
        data_dir=data_dir,
        subset="dev",
        corpus="none",
        quiet=True,
        catalogue=catalogue,
        **options,
    )


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# --- tests ---------------------------------------------------------------------------------------------


def test_every_dataset_downloads_and_converts_to_the_layout_the_loaders_read(server, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_not_for_public_files")
    root = tmp_path / "data"
    catalogue = fixture_catalogue()
    for name in catalogue.datasets():
        dl.download([name], data_dir=root, quiet=True, catalogue=catalogue)
    for name in ("hotpotqa", "2wikimultihopqa", "musique"):
        dl.download([name], data_dir=root, subset="dev", corpus="none", quiet=True, catalogue=catalogue)

    # The IRCoT subsets: exact rows, gold ids that are passages of the IRCoT corpora.
    for name in ("hotpotqa", "2wikimultihopqa", "musique"):
        examples = load_dataset(name, split="test", data_dir=root)
        assert [ex.id for ex in examples] == ["q1", "2hop__7_8"]
        assert examples[1].answers == ["Shirley Temple"] and examples[1].type == "2hop"
        corpus_ids = {p.id for p in load_corpus(name, data_dir=root)}
        for ex in examples:
            assert len(ex.gold_passage_ids) == 2 and set(ex.gold_passage_ids) <= corpus_ids
    assert {p.title for p in load_corpus("hotpotqa", data_dir=root)} == set(PARAS)
    hotpot_passage = next(p for p in load_corpus("hotpotqa", data_dir=root) if p.title == "Ed Wood")
    assert (
        hotpot_passage.id == passage_id("Ed Wood", PARAS["Ed Wood"])
        and hotpot_passage.text == PARAS["Ed Wood"]
    )
    assert len(load_corpus("musique", data_dir=root)) == 4  # six files, deduplicated
    assert len(load_corpus("2wikimultihopqa", data_dir=root)) == 4

    # The full dev sets through the existing readers' row logic.
    assert [ex.id for ex in load_dataset("hotpotqa", data_dir=root)] == ["h1", "h2"]
    assert [ex.id for ex in load_dataset("2wikimultihopqa", data_dir=root)] == ["d1"]
    assert load_dataset("musique", data_dir=root)[0].answers == ["Shirley Temple", "Shirley Jane Temple"]

    asqa = load_dataset("asqa", data_dir=root)
    assert [ex.id for ex in asqa] == ["-0", "-1", "-2"]
    assert asqa[0].short_answers == [["Ann", "Anne"], ["Bob"]]

    strategy = load_dataset("strategyqa", data_dir=root)
    chosen = sorted((s["qid"] for s in STRATEGY), key=lambda q: hashlib.sha1(q.encode()).hexdigest())[:3]
    assert [ex.id for ex in strategy] == chosen
    assert all(ex.answers == ["yes" if int(ex.id[1:]) % 2 == 0 else "no"] for ex in strategy)

    nq = load_dataset("nq", split="test", data_dir=root)
    assert [(ex.id, ex.answers) for ex in nq] == [(r["id"], r["golden_answers"]) for r in FLASHRAG]
    assert len(load_dataset("triviaqa", split="test", data_dir=root)) == 3

    # The Wikipedia corpus is converted once and linked into each dataset that uses it.
    wiki = load_corpus_file(root / "nq" / "corpus.jsonl")
    assert len(wiki) == DPR_ROWS
    assert wiki[0].title == "Title 1" and wiki[0].text.endswith(' "quoted"')
    for name in ("asqa", "strategyqa", "triviaqa"):
        assert (root / name / "corpus.jsonl").resolve() == (root / "corpora" / "wiki18-100w.jsonl").resolve()
    assert server.gets("psgs_w100.tsv.gz") == [None]  # fetched once for four datasets

    coverage = {
        (c.dataset, c.questions.name): (c.found, c.gold)
        for c in dl.gold_coverage(catalogue.datasets(), data_dir=root)
    }
    assert coverage[("hotpotqa", "test.jsonl")] == (4, 4) and coverage[("musique", "test.jsonl")] == (4, 4)
    assert coverage[("2wikimultihopqa", "dev.jsonl")] == (1, 1)
    assert ("nq", "test.jsonl") not in coverage  # the shared Wikipedia corpus is not scanned
    assert server.authorization == []  # public files: no token goes to the Hub endpoint or a mirror

    # Installed again: nothing is fetched, the manifest answers.
    before = len(server.log)
    again = dl.download(["hotpotqa", "nq"], data_dir=root, quiet=True, catalogue=catalogue)
    assert all(item.skipped for item in again) and len(server.log) == before


def test_interrupted_download_resumes_with_a_range_request_and_gives_the_same_file(server, tmp_path):
    catalogue = fixture_catalogue()
    clean = tmp_path / "clean"
    dl.download(["nq"], data_dir=clean, subset="none", quiet=True, catalogue=catalogue)

    # The server drops the connection halfway through the body: the next attempt asks for the rest.
    size = len(server.routes[server.path_of("psgs_w100.tsv.gz")])
    server.drop_after[server.path_of("psgs_w100.tsv.gz")] = size // 2
    server.log.clear()
    resumed = tmp_path / "resumed"
    dl.download(["nq"], data_dir=resumed, subset="none", quiet=True, catalogue=catalogue)
    assert server.gets("psgs_w100.tsv.gz") == [None, f"bytes={size // 2}-"]
    assert (resumed / ".downloads" / "psgs_w100.tsv.gz").read_bytes() == (
        clean / ".downloads" / "psgs_w100.tsv.gz"
    ).read_bytes()
    assert (resumed / "corpora" / "wiki18-100w.jsonl").read_bytes() == (
        clean / "corpora" / "wiki18-100w.jsonl"
    ).read_bytes()
    assert not (resumed / ".downloads" / "psgs_w100.tsv.gz.part").exists()

    # A .part left by a killed process is resumed by the next run, for the version its validator names.
    again = tmp_path / "again"
    (again / ".downloads").mkdir(parents=True)
    full = (clean / ".downloads" / "psgs_w100.tsv.gz").read_bytes()
    (again / ".downloads" / "psgs_w100.tsv.gz.part").write_bytes(full[:1000])
    (again / ".downloads" / "psgs_w100.tsv.gz.part.validator").write_text(server.etag(full) + "\n")
    server.log.clear()
    server.if_range.clear()
    dl.download(["nq"], data_dir=again, subset="none", quiet=True, catalogue=catalogue)
    assert server.gets("psgs_w100.tsv.gz") == ["bytes=1000-"] and server.if_range == [server.etag(full)]
    assert (again / ".downloads" / "psgs_w100.tsv.gz").read_bytes() == full
    assert not (again / ".downloads" / "psgs_w100.tsv.gz.part.validator").exists()

    # A .part with no validator (an older ragsuite's) may hold another version: downloaded from byte 0.
    older = tmp_path / "older"
    (older / ".downloads").mkdir(parents=True)
    (older / ".downloads" / "psgs_w100.tsv.gz.part").write_bytes(full[:1000])
    server.log.clear()
    dl.download(["nq"], data_dir=older, subset="none", quiet=True, catalogue=catalogue)
    assert server.gets("psgs_w100.tsv.gz") == [None]
    assert (older / ".downloads" / "psgs_w100.tsv.gz").read_bytes() == full

    # A server that ignores Range sends the whole file again: it replaces the partial one, not appends.
    server.ignore_range = True
    plain = tmp_path / "plain"
    (plain / ".downloads").mkdir(parents=True)
    (plain / ".downloads" / "psgs_w100.tsv.gz.part").write_bytes(full[:1000])
    dl.download(["nq"], data_dir=plain, subset="none", quiet=True, catalogue=catalogue)
    assert (plain / ".downloads" / "psgs_w100.tsv.gz").read_bytes() == full


def test_checksum_mismatch_is_refused_and_the_partial_file_deleted(server, tmp_path):
    root = tmp_path / "data"
    # The Hub publishes a sha256 (LFS) that the bytes do not match.
    alce = "/datasets/princeton-nlp/ALCE-data/resolve/main/ALCE-data.tar"
    server.hub_headers[alce]["X-Linked-Etag"] = '"' + "0" * 64 + '"'
    with pytest.raises(
        DataError,
        match=r"ALCE-data.tar .*not the published file: sha256 [0-9a-f]{64}, expected 0{64}.*deleted",
    ):
        dl.download(["asqa"], data_dir=root, corpus="none", quiet=True, catalogue=fixture_catalogue())
    assert not (root / ".downloads" / "ALCE-data.tar.part").exists()
    assert not (root / ".downloads" / "ALCE-data.tar").exists()
    assert not (root / "asqa" / "dev.jsonl").exists()

    # A small Hub file (git blob sha1) and an official file with a size recorded in the catalogue.
    nq = "/datasets/RUC-NLPIR/FlashRAG_datasets/resolve/main/nq/test.jsonl"
    server.hub_headers[nq]["ETag"] = '"' + "1" * 40 + '"'
    with pytest.raises(DataError, match=r"git blob sha1 .*expected 1{40}"):
        dl.download(["nq"], data_dir=root, corpus="none", quiet=True, catalogue=fixture_catalogue())
    assert not list((root / ".downloads").glob("flashrag_nq*"))

    sized = dataclasses.replace(CATALOGUE.find("hotpotqa", "questions", "dev").inputs[0].file, size=12)
    catalogue = fixture_catalogue({("hotpotqa", "dev"): {"inputs": (Input(sized),)}})
    with pytest.raises(DataError, match=r"bytes, expected 12"):
        _hotpot_dev(root, catalogue)
    assert not list((root / ".downloads").glob("hotpot_dev*"))


def test_a_malformed_source_writes_nothing_and_names_file_record_and_problem(server, tmp_path):
    root = tmp_path / "data"
    catalogue = fixture_catalogue()
    dl.download(["musique"], data_dir=root, corpus="none", quiet=True, catalogue=catalogue)
    before = (root / "musique" / "test.jsonl").read_bytes()

    bad = [IRCOT_ROWS[0], {**IRCOT_ROWS[1], "question_text": 42}]
    path = server.path_of("ircot_processed_data.zip")
    server.routes[path] = _zip(
        {
            f"processed_data/{d}/test_subsampled.jsonl": _jsonl(bad)
            for d in ("hotpotqa", "2wikimultihopqa", "musique")
        }
    )
    for leftover in (root / ".downloads").iterdir():
        leftover.unlink()
    with pytest.raises(DataError) as caught:
        dl.download(["musique"], data_dir=root, corpus="none", quiet=True, catalogue=catalogue, force=True)
    message = str(caught.value)
    assert "ircot_processed_data.zip!processed_data/musique/test_subsampled.jsonl:2" in message
    assert "'question_text' must be str" in message
    assert (root / "musique" / "test.jsonl").read_bytes() == before  # the installed file is untouched
    assert sorted(p.name for p in (root / "musique").iterdir()) == [".ragsuite-sources.json", "test.jsonl"]

    # Fewer rows than the source must hold: refused, nothing written.
    short = fixture_catalogue({("hotpotqa", "dev"): {"expected_rows": 7405}})
    with pytest.raises(DataError, match=r"holds 2 questions, expected 7405.*Nothing was written"):
        _hotpot_dev(root, short)
    assert not (root / "hotpotqa").exists() or not (root / "hotpotqa" / "dev.jsonl").exists()


def test_a_file_the_downloader_did_not_write_is_never_replaced_without_force(server, tmp_path):
    mine = tmp_path / "hotpotqa" / "dev.jsonl"
    mine.parent.mkdir(parents=True)
    mine.write_text('{"id": "own", "question": "q?", "answers": ["a"]}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"dev.jsonl exists and was not installed by .*Pass --force"):
        dl.download(["hotpotqa"], data_dir=tmp_path, subset="dev", quiet=True, catalogue=fixture_catalogue())
    assert server.log == [] and mine.read_text(encoding="utf-8").startswith('{"id": "own"')
    _hotpot_dev(tmp_path, force=True)
    assert [ex.id for ex in load_dataset("hotpotqa", data_dir=tmp_path)] == ["h1", "h2"]


def test_unknown_subset_or_dataset_fails_before_any_request(server, tmp_path):
    with pytest.raises(DataError, match="nq has no --subset 'dev'; choose one of: test"):
        dl.download(
            ["hotpotqa", "nq"], data_dir=tmp_path, subset="dev", quiet=True, catalogue=fixture_catalogue()
        )
    with pytest.raises(DataError, match="unknown dataset 'squad'"):
        dl.download(["squad"], data_dir=tmp_path, quiet=True)
    assert server.log == [] and not (tmp_path / ".downloads").exists()


def test_unreachable_host_and_http_errors_name_the_url_and_the_fix(server, tmp_path, monkeypatch):
    del server.routes[server.path_of("hotpot_dev_distractor_v1.json")]
    with pytest.raises(
        DataError, match=r"curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json failed: HTTP 404"
    ):
        _hotpot_dev(tmp_path)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    monkeypatch.setenv("RAGSUITE_MIRROR", f"http://user:secret@127.0.0.1:{port}")
    with pytest.raises(DataError, match=r"cannot reach .*RAGSUITE_MIRROR") as caught:
        _hotpot_dev(tmp_path)
    assert "secret" not in str(caught.value)


def test_mirror_rewrites_official_urls_and_rejects_a_bad_mirror(monkeypatch):
    monkeypatch.setenv("RAGSUITE_MIRROR", "http://10.0.0.5:8080/")
    assert dl.mirrored("https://dl.fbaipublicfiles.com/dpr/wikipedia_split/psgs_w100.tsv.gz") == (
        "http://10.0.0.5:8080/dl.fbaipublicfiles.com/dpr/wikipedia_split/psgs_w100.tsv.gz"
    )
    assert (
        dl.mirrored("https://www.dropbox.com/s/x/data_ids.zip?dl=1")
        == "http://10.0.0.5:8080/www.dropbox.com/s/x/data_ids.zip?dl=1"
    )
    monkeypatch.setenv("RAGSUITE_MIRROR", "10.0.0.5:8080")
    with pytest.raises(ConfigError, match=r"RAGSUITE_MIRROR=10.0.0.5:8080 must look like http://host:port"):
        dl.mirrored("https://example.org/x")
    monkeypatch.delenv("RAGSUITE_MIRROR")
    assert dl.mirrored("https://example.org/x") == "https://example.org/x"


def test_cli_download_sources_and_list(server, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(dl, "CATALOGUE", fixture_catalogue())
    root = tmp_path / "data"
    # Without any data: what can be downloaded, nothing installed.
    assert main(["data", "list", "--data-dir", str(root), "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    hotpot = {(d["kind"], d["name"]): d for d in listing["downloadable"] if d["dataset"] == "hotpotqa"}
    assert (
        hotpot[("questions", "ircot-test-500")]["default"]
        and hotpot[("questions", "ircot-test-500")]["installed_rows"] is None
    )
    assert {d["dataset"] for d in listing["downloadable"]} == {
        "hotpotqa",
        "2wikimultihopqa",
        "musique",
        "asqa",
        "strategyqa",
        "nq",
        "triviaqa",
    }

    code = main(
        [
            "data",
            "download",
            "hotpotqa",
            "--subset",
            "ircot-test-500",
            "--corpus",
            "none",
            "--data-dir",
            str(root),
            "--quiet",
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert (
        f"hotpotqa: {root / 'hotpotqa' / 'test.jsonl'} (2 rows, from ircot-test-500) installed"
        in capsys.readouterr().out
    )
    assert main(["data", "list", "--data-dir", str(root)]) == 0
    out = capsys.readouterr().out
    assert any(
        line.split()[:3] == ["hotpotqa", "questions", "ircot-test-500*"] and line.endswith("yes (2 rows)")
        for line in out.splitlines()
    )

    # The corpus words one gold paragraph differently: the coverage line says so, with a warning.
    abstracts = "".join(
        json.dumps({"title": t, "text": [PARAS[t] + (" (director)" if t == "Ed Wood" else "")]}) + "\n"
        for t in PARAS
    ).encode()
    server.routes[server.path_of("enwiki-20171001-pages-meta-current-withlinks-abstracts.tar.bz2")] = _tar(
        {"x/AA/wiki_00.bz2": bz2.compress(abstracts)}, "w:bz2"
    )
    assert main(["data", "download", "hotpotqa", "--data-dir", str(root), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "(2 rows, from ircot-test-500) already installed" in captured.out
    assert "hotpotqa: 3 of 4 gold passages of test.jsonl are in corpus.jsonl (75.0%)" in captured.out
    assert "1 gold passages are worded differently" in captured.err

    assert main(["data", "download", "hotpotqa", "--subset", "nope", "--data-dir", str(root)]) == 2
    assert "choose one of: ircot-test-500, dev" in capsys.readouterr().err

    assert main(["data", "sources", "--json"]) == 0
    described = json.loads(capsys.readouterr().out)
    wiki = next(d for d in described if d["dataset"] == "nq" and d["kind"] == "corpus")
    assert wiki["files"][0]["origin"] == "https://dl.fbaipublicfiles.com/dpr/wikipedia_split/psgs_w100.tsv.gz"
    assert wiki["files"][0]["checksum"] == "none published" and wiki["expected_rows"] == 21_015_324
    alce = next(d for d in described if d["dataset"] == "asqa" and d["kind"] == "questions")
    assert alce["files"][0]["checksum"].startswith("checksum published by the Hub")
    strategy = next(d for d in described if d["dataset"] == "strategyqa" and d["kind"] == "questions")
    assert strategy["paper_subset"] is False


def test_the_real_catalogue_offers_every_dataset_and_the_papers_subsets():
    for name in ("hotpotqa", "2wikimultihopqa", "musique", "asqa", "strategyqa", "nq", "triviaqa"):
        assert CATALOGUE.find(name, "questions", None) is not None
        assert CATALOGUE.find(name, "corpus", None) is not None
    for name in ("hotpotqa", "2wikimultihopqa", "musique"):
        subset = CATALOGUE.find(name, "questions", "ircot-test-500")
        assert subset.expected_rows == 500 and subset.split == "test" and subset.paper_subset
    assert CATALOGUE.find("asqa", "questions", "alce-948").expected_rows == 948
    for source in CATALOGUE:
        assert isinstance(source, Source) and source.license and source.origin
        for inp in source.inputs:
            assert inp.file.checksum_note  # says where the checksum comes from, or that none is published
            assert (
                inp.file.url.startswith("https://") or inp.file.url.startswith("http://") or inp.file.hub_repo
            )


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 22])
def test_streaming_json_reader_matches_json_loads_across_chunk_boundaries(monkeypatch, chunk):
    from ragsuite.data import readers

    monkeypatch.setattr(readers, "_CHUNK", chunk)
    records = [{"id": k, "text": "x" * (k * 13), "nested": {"a": [1, 2, {"b": "]},"}]}} for k in range(20)]
    as_array = json.dumps(records, indent=2).encode()
    as_lines = _jsonl(records) + b"\n\n" + json.dumps(records[0]).encode()  # blank lines, no final newline

    got = list(readers.iter_json_stream(("a.json", io.BytesIO(as_array))))
    assert [r for _, r in got] == records and got[3][0] == "a.json[3]"
    got = list(readers.iter_json_stream(("b.jsonl", io.BytesIO(as_lines))))
    assert [r for _, r in got] == [*records, records[0]] and got[-1][0] == "b.jsonl:23"

    cut = as_array.index(b'"id": 3')
    with pytest.raises(DataError, match=r"c\.json\[3\]: not valid JSON"):
        list(readers.iter_json_stream(("c.json", io.BytesIO(as_array[:cut]))))
    with pytest.raises(DataError, match=r"c\.json\[3\]: the JSON array ends without"):
        list(readers.iter_json_stream(("c.json", io.BytesIO(as_array[: as_array.rindex(b"{", 0, cut)]))))
    with pytest.raises(DataError, match=r"d\.jsonl:2: not valid JSON"):
        list(readers.iter_json_stream(("d.jsonl", io.BytesIO(b'{"a": 1}\n{"a": \n{"a": 3}\n'))))


# --- a file that changed on the server, and damaged or foreign files ----------------------------------


def _same_size_versions(n: int) -> tuple[bytes, bytes]:
    old = _json([_hotpot_record(f"h{k}", ["Ed Wood"], answer="old") for k in range(n)])
    new = _json([_hotpot_record(f"h{k}", ["Ed Wood"], answer="new") for k in range(n)])
    assert len(old) == len(new)
    return old, new


def _old_version_cut_halfway(server, monkeypatch) -> tuple[Catalogue, bytes, bytes, str]:
    """One attempt per file (as if the process was killed), and HotpotQA's dev file served in an old version
    whose connection drops halfway: the catalogue (40 rows), the old and new versions, the file's path."""
    monkeypatch.setattr(dl, "_ATTEMPTS", 1)
    catalogue = fixture_catalogue({("hotpotqa", "dev"): {"expected_rows": 40}})
    old, new = _same_size_versions(40)
    path = server.path_of("hotpot_dev_distractor_v1.json")
    server.routes[path] = old
    server.drop_after[path] = len(old) // 2
    return catalogue, old, new, path


def test_a_part_of_an_older_version_is_downloaded_again_not_spliced(server, tmp_path, monkeypatch):
    # The first run stops halfway through the old version (one attempt: as if the process was killed).
    catalogue, old, new, path = _old_version_cut_halfway(server, monkeypatch)
    with pytest.raises(DataError, match=r"interrupted 1 times.*partial file .* is kept"):
        _hotpot_dev(tmp_path, catalogue)
    part = tmp_path / ".downloads" / "hotpot_dev_distractor_v1.json.part"
    assert part.stat().st_size == len(old) // 2

    # The file changes on the server: the resumed request names the old version, the server sends the new
    # one whole, and every installed row is from it (spliced, half of them would be "old").
    server.routes[path] = new
    server.log.clear()
    server.if_range.clear()
    _hotpot_dev(tmp_path, catalogue)
    assert server.gets("hotpot_dev_distractor_v1.json") == [f"bytes={len(old) // 2}-"]
    assert server.if_range == [server.etag(old)]
    assert (tmp_path / ".downloads" / "hotpot_dev_distractor_v1.json").read_bytes() == new
    assert {ex.answers[0] for ex in load_dataset("hotpotqa", data_dir=tmp_path)} == {"new"}


def test_a_server_that_ignores_if_range_or_names_no_version_is_not_spliced(server, tmp_path, monkeypatch):
    # It answers 206 with the new version's ETag: the part is dropped and the next attempt starts over.
    catalogue, old, new, path = _old_version_cut_halfway(server, monkeypatch)
    with pytest.raises(DataError, match="interrupted"):
        _hotpot_dev(tmp_path / "a", catalogue)
    server.routes[path] = new
    server.ignore_if_range = True
    monkeypatch.setattr(dl, "_ATTEMPTS", 2)
    server.log.clear()
    _hotpot_dev(tmp_path / "a", catalogue)
    assert server.gets("hotpot_dev_distractor_v1.json") == [f"bytes={len(old) // 2}-", None]
    assert {ex.answers[0] for ex in load_dataset("hotpotqa", data_dir=tmp_path / "a")} == {"new"}

    # It sends neither ETag nor Last-Modified: nothing to send If-Range with, so no Range either.
    monkeypatch.setattr(dl, "_ATTEMPTS", 1)
    server.validators = False
    server.routes[path] = old
    server.drop_after[path] = len(old) // 2
    with pytest.raises(DataError, match="interrupted"):
        _hotpot_dev(tmp_path / "b", catalogue)
    assert not (tmp_path / "b" / ".downloads" / "hotpot_dev_distractor_v1.json.part.validator").exists()
    server.routes[path] = new
    server.log.clear()
    _hotpot_dev(tmp_path / "b", catalogue)
    assert server.gets("hotpot_dev_distractor_v1.json") == [None]
    assert {ex.answers[0] for ex in load_dataset("hotpotqa", data_dir=tmp_path / "b")} == {"new"}


def test_a_file_without_checksum_that_does_not_convert_is_deleted_not_reused(server, tmp_path):
    catalogue = fixture_catalogue()
    good = server.routes[server.path_of("hotpot_dev_distractor_v1.json")]
    server.replace("hotpot_dev_distractor_v1.json", b"<html><body>Too many requests</body></html>\n")
    with pytest.raises(DataError) as caught:
        _hotpot_dev(tmp_path, catalogue)
    message = str(caught.value)
    assert "hotpot_dev_distractor_v1.json:1: not valid JSON" in message
    assert "hotpot_dev_distractor_v1.json had no published checksum and could not be converted" in message
    assert "it was deleted: run the command again" in message
    assert list((tmp_path / ".downloads").iterdir()) == []  # neither the final name nor a leftover

    # The host serves the real file again: the next run downloads it (a reused bad file would fail again).
    server.replace("hotpot_dev_distractor_v1.json", good)
    server.log.clear()
    _hotpot_dev(tmp_path, catalogue)
    assert server.gets("hotpot_dev_distractor_v1.json") == [None]
    assert [ex.id for ex in load_dataset("hotpotqa", data_dir=tmp_path)] == ["h1", "h2"]
    assert sorted(p.name for p in (tmp_path / ".downloads").iterdir()) == ["hotpot_dev_distractor_v1.json"]

    # A complete download whose conversion was killed is converted by the next run, then promoted.
    again = tmp_path / "again"
    (again / ".downloads").mkdir(parents=True)
    (again / ".downloads" / "unverified").mkdir()
    (again / ".downloads" / "unverified" / "hotpot_dev_distractor_v1.json").write_bytes(good)
    server.log.clear()
    _hotpot_dev(again, catalogue)
    assert server.log == []
    assert sorted(p.name for p in (again / ".downloads").iterdir()) == ["hotpot_dev_distractor_v1.json"]


def _flip(data: bytes, old: bytes, new: bytes) -> bytes:
    """``data`` with the last ``old`` replaced by ``new`` (same length: offsets in an archive hold)."""
    assert len(old) == len(new) and old in data
    at = data.rindex(old)
    return data[:at] + new + data[at + len(old) :]


def _damaged() -> dict[str, tuple[list[str], str, bytes, str]]:
    """case -> (download arguments, remote filename, damaged bytes, what the one-line error must say)."""
    files = _fixture_files()
    tsv = gzip.decompress(files["psgs_w100.tsv.gz"])
    hotpot = files["hotpot_dev_distractor_v1.json"]
    return {
        "not gzip (BadGzipFile)": (
            ["nq", "--subset", "none"],
            "psgs_w100.tsv.gz",
            b"<html>quota exceeded</html>",
            r"psgs_w100\.tsv\.gz: cannot be read \(BadGzipFile",
        ),
        "truncated gzip (EOFError)": (
            ["nq", "--subset", "none"],
            "psgs_w100.tsv.gz",
            files["psgs_w100.tsv.gz"][: len(files["psgs_w100.tsv.gz"]) // 2],
            r"psgs_w100\.tsv\.gz: cannot be read \(EOFError: .*\(the file is truncated\)",
        ),
        "invalid UTF-8 in a TSV (UnicodeDecodeError)": (
            ["nq", "--subset", "none"],
            "psgs_w100.tsv.gz",
            gzip.compress(tsv.replace(b"Title 7\n", b"Title \xff\n", 1)),
            r"psgs_w100\.tsv\.gz: after line \d+: byte 0xff is not valid UTF-8",
        ),
        "a field over csv's limit": (
            ["nq", "--subset", "none"],
            "psgs_w100.tsv.gz",
            gzip.compress(tsv.replace(b"\tTitle 7\n", b"\tTitle " + b"7" * 140_000 + b"\n", 1)),
            r"psgs_w100\.tsv\.gz:\d+: field larger than field limit .*unbalanced",
        ),
        "invalid UTF-8 in JSON (UnicodeDecodeError)": (
            ["hotpotqa", "--subset", "dev", "--corpus", "none"],
            "hotpot_dev_distractor_v1.json",
            _flip(hotpot, b"Kiss and Tell", b"Kiss \xe9nd Tell"),
            r"hotpot_dev_distractor_v1\.json\[0\]: byte 0xe9 is not valid UTF-8",
        ),
        "a 5000-digit number (ValueError)": (
            ["hotpotqa", "--subset", "dev", "--corpus", "none"],
            "hotpot_dev_distractor_v1.json",
            hotpot.replace(b'"type": "comparison"', b'"type": ' + b"9" * 5000, 1),
            r"hotpot_dev_distractor_v1\.json\[0\]: not valid JSON \(ValueError: Exceeds the limit",
        ),
        "an unpaired surrogate escape": (
            ["hotpotqa", "--subset", "dev", "--corpus", "none"],
            "hotpot_dev_distractor_v1.json",
            hotpot.replace(b"Question h2?", b"Question \\ud800?", 1),
            r"hotpot_dev_distractor_v1\.json\[1\]: the escape \\ud800 is half of a UTF-16 surrogate pair",
        ),
        "UTF-16": (
            ["hotpotqa", "--subset", "dev", "--corpus", "none"],
            "hotpot_dev_distractor_v1.json",
            hotpot.decode().encode("utf-16"),
            r"hotpot_dev_distractor_v1\.json: the file is UTF-16 or UTF-32 encoded",
        ),
        "a bad CRC in a zip member (BadZipFile)": (
            ["musique", "--corpus", "none"],
            "ircot_processed_data.zip",
            _flip(files["ircot_processed_data.zip"], b"Shirley Temple was", b"Shirley Temple wax"),
            r"ircot_processed_data\.zip!processed_data/musique/test_subsampled\.jsonl: cannot be read "
            r"\(BadZipFile: Bad CRC-32",
        ),
        "a zip cut short (BadZipFile)": (
            ["musique", "--corpus", "none"],
            "ircot_processed_data.zip",
            files["ircot_processed_data.zip"][:-30],
            r"ircot_processed_data\.zip",
        ),
        "a bz2 member with bad data": (
            ["hotpotqa", "--subset", "none"],
            "enwiki-20171001-pages-meta-current-withlinks-abstracts.tar.bz2",
            _tar({"x/AA/wiki_00.bz2": b"BZh91AY&SY" + b"\x00" * 64}, "w:bz2"),
            r"wiki_00\.bz2: cannot be read \(OSError: Invalid data stream",
        ),
        "not a tar": (
            ["hotpotqa", "--subset", "none"],
            "enwiki-20171001-pages-meta-current-withlinks-abstracts.tar.bz2",
            b"<html>moved</html>",
            r"abstracts\.tar\.bz2: neither a zip nor a tar archive",
        ),
        "a tar cut short": (
            ["hotpotqa", "--subset", "none"],
            "enwiki-20171001-pages-meta-current-withlinks-abstracts.tar.bz2",
            files["enwiki-20171001-pages-meta-current-withlinks-abstracts.tar.bz2"][:200],
            r"abstracts\.tar\.bz2",
        ),
    }


@pytest.mark.parametrize("case", list(_damaged()))
def test_a_damaged_or_foreign_file_is_one_error_line_exit_2_and_deleted(
    server, tmp_path, monkeypatch, capsys, case
):
    monkeypatch.setattr(dl, "CATALOGUE", fixture_catalogue())
    argv, filename, data, expected = _damaged()[case]
    server.replace(filename, data)
    code = main(["data", "download", *argv, "--data-dir", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert re.search(expected, err), err
    # No published checksum: the file is deleted and the message says so; nothing is installed.
    assert f"{filename} had no published checksum" in err and "it was deleted" in err
    assert list((tmp_path / ".downloads").iterdir()) == []
    assert not any(p.suffix == ".jsonl" for p in tmp_path.rglob("*") if not p.is_symlink())


def test_a_hub_file_that_matches_its_checksum_but_does_not_convert_is_kept(server, tmp_path, capsys):
    catalogue = fixture_catalogue()
    server.replace("ALCE-data.tar", _tar({"ALCE-data/asqa_eval_gtr_top100.json": b'[{"sample_id": \xff}]'}))
    with pytest.raises(DataError) as caught:
        dl.download(["asqa"], data_dir=tmp_path, corpus="none", quiet=True, catalogue=catalogue)
    message = str(caught.value)
    assert "asqa_eval_gtr_top100.json[0]: byte 0xff is not valid UTF-8" in message
    assert "ALCE-data.tar is kept (it matched its published checksum" in message
    assert (tmp_path / ".downloads" / "ALCE-data.tar").is_file()


def test_a_hub_reply_of_size_0_is_one_error_line(server, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(dl, "CATALOGUE", fixture_catalogue())
    server.replace("flashrag_nq_test.jsonl", b"")
    code = main(["data", "download", "nq", "--corpus", "none", "--data-dir", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "gives its size as 0 bytes: that is not the published file. Check HF_ENDPOINT" in err


@pytest.mark.parametrize("name", [s for s in CATALOGUE.datasets()])
def test_offline_every_source_fails_with_one_line_and_exit_2(tmp_path, monkeypatch, capsys, caplog, name):
    import time

    # huggingface_hub retries a refused connection 5 times, sleeping 1+2+4+8+8 s: the retries still happen.
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    monkeypatch.setenv("RAGSUITE_MIRROR", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    code = main(["data", "download", name, "--data-dir", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert re.search(r"cannot reach|could not read the Hugging Face Hub's metadata", err), err
    # Nothing else reaches the log either (huggingface_hub warns once per retry: a dozen lines offline).
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_hub_client_errors_of_any_http_library_are_one_line(server, tmp_path, monkeypatch, capsys):
    import httpx
    import huggingface_hub

    # huggingface_hub >= 1.0 raises httpx errors, which are not OSError.
    def offline(url, **kwargs):
        raise httpx.ConnectError("[Errno 111] Connection refused")

    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", offline)
    monkeypatch.setattr(dl, "CATALOGUE", fixture_catalogue())
    for name in ("nq", "asqa", "triviaqa"):
        code = main(["data", "download", name, "--corpus", "none", "--data-dir", str(tmp_path), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "could not read the Hugging Face Hub's metadata" in err and "Connection refused" in err
