"""BM25Retriever: agreement with plain bm25s, the on-disk cache, thread safety, edge cases, recall."""

from __future__ import annotations

import json
import logging
import os
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bm25s
import numpy as np
import pytest
import Stemmer

from ragsuite.data.datasets import load_corpus, load_dataset
from ragsuite.data.metrics import retrieval_recall
from ragsuite.errors import ConfigError, RetrievalError
from ragsuite.retrieval import bm25, bm25_kernel
from ragsuite.retrieval.base import Passage, ranked_ids
from ragsuite.retrieval.bm25 import BM25Retriever
from ragsuite.retrieval.spec import build_retriever

# Plain bm25s (stemmed English, English stopwords, title + text, default k1/b) on the dev splits.
RECALL_DATASETS = ("strategyqa", "nq")
BASELINE = {"title_weight": 1, "fold_accents": False}

CORPUS = [
    Passage("p0", "Stettin", "Stettin is a city on the Oder river, the capital of Pomerania."),
    Passage("p1", "Anna of Pomerania", "Anna of Pomerania was a duchess; her father was Bogislaw XIII."),
    Passage(
        "p2", "Bogislaw XIII", "Bogislaw XIII, Duke of Pomerania, was born in Barth and died in Stettin."
    ),
    Passage("p3", "Oder", "The Oder is a river in Central Europe flowing into the Baltic Sea."),
    Passage("p4", "Baltic Sea", "The Baltic Sea is an arm of the Atlantic Ocean."),
    Passage("p5", "Antonín Dvořák", "Antonín Dvořák was a Czech composer of symphonies and operas."),
    Passage("p6", "Symphony", "A symphony is an extended musical composition for orchestra."),
    Passage("p7", "Pulp Fiction", "Pulp Fiction is a 1994 crime film directed by Quentin Tarantino."),
    Passage("p8", "Quentin Tarantino", "Quentin Tarantino is an American film director and screenwriter."),
    Passage("p9", "Crime film", "Crime films depict criminals, detectives and the crimes they commit."),
]
QUERIES = [
    "Who was the father of Anna of Pomerania?",
    "Where did Bogislaw XIII die?",
    "which river flows into the Baltic Sea",
    "Who directed the 1994 crime film Pulp Fiction?",
    "Czech composers of symphonies",
    "the capital city of Pomerania on the Oder",
]


def plain_bm25s(passages: list[Passage]):
    stemmer = Stemmer.Stemmer("english")
    retriever = bm25s.BM25()
    tokens = bm25s.tokenize(
        [f"{p.title} {p.text}" for p in passages], stopwords="en", stemmer=stemmer, show_progress=False
    )
    retriever.index(tokens, show_progress=False)

    def search(queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        q = bm25s.tokenize(queries, stopwords="en", stemmer=stemmer, show_progress=False)
        return retriever.retrieve(q, k=k, show_progress=False)

    return search


def assert_same_ranking(ours: list[Passage], ref_ids: list[str], ref_scores: np.ndarray) -> None:
    """Same scores position by position; ids may differ only among passages tied at the cut-off score."""
    assert len(ours) == len(ref_ids)
    np.testing.assert_allclose([p.score for p in ours], ref_scores, rtol=1e-5, atol=1e-6)
    by_score: dict[float, set[str]] = {}
    for pid, score in zip(ref_ids, ref_scores, strict=True):
        by_score.setdefault(round(float(score), 4), set()).add(pid)
    cutoff = round(float(min(ref_scores)), 4)
    for p in ours:
        assert p.id in by_score[round(p.score, 4)] or round(p.score, 4) == cutoff


def test_matches_plain_bm25s_on_small_corpus(tmp_path: Path) -> None:
    ours = BM25Retriever(CORPUS, cache_dir=tmp_path, **BASELINE)
    docs, scores = plain_bm25s(CORPUS)(QUERIES, 5)
    for query, doc_row, score_row in zip(QUERIES, docs, scores, strict=True):
        result = ours(query, 5)
        assert_same_ranking(result, [CORPUS[i].id for i in doc_row], score_row)
        # Distinct top scores here: the order itself must match exactly.
        assert result[0].id == CORPUS[doc_row[0]].id


def test_matches_plain_bm25s_on_a_real_corpus(tmp_path: Path, data_dir: Path) -> None:
    corpus = load_corpus("strategyqa", data_dir=data_dir)
    questions = [ex.question for ex in load_dataset("strategyqa", data_dir=data_dir)]
    ours = BM25Retriever(corpus, cache_dir=tmp_path, **BASELINE)
    docs, scores = plain_bm25s(corpus)(questions, 10)
    for result, doc_row, score_row in zip(ours.batch(questions, 10), docs, scores, strict=True):
        assert_same_ranking(result, [corpus[i].id for i in doc_row], score_row)


def test_results_are_corpus_passages_with_scores(tmp_path: Path) -> None:
    retriever = BM25Retriever(CORPUS, cache_dir=tmp_path)
    result = retriever("Who directed the film Pulp Fiction?", 3)
    assert [p.id for p in result] == ["p7", "p9", "p8"]
    by_id = {p.id: p for p in CORPUS}
    for p in result:
        assert (p.title, p.text) == (by_id[p.id].title, by_id[p.id].text)
        assert p.score > 0
    assert result[0].score > result[1].score
    assert [p.score for p in result] == sorted((p.score for p in result), reverse=True)


def test_batch_equals_single_queries(tmp_path: Path) -> None:
    retriever = BM25Retriever(CORPUS, cache_dir=tmp_path)
    # Queries matching nothing sit between others: each result must stay with its own query.
    queries = ["", *QUERIES[:2], "the of and", *QUERIES[2:], ""]
    assert retriever.batch(queries, 4) == [retriever(q, 4) for q in queries]
    assert retriever.batch_ids(queries, 4) == [[p.id for p in retriever(q, 4)] for q in queries]
    assert retriever.batch([], 4) == [] and retriever.batch_ids([], 4) == []


def test_query_term_ids_come_from_the_tokenizer_memoized_or_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = [
        "Dvořák's symphonies", "", "running runners ran", "the of", "Stettin STETTIN stettin's",
        "zzzunknown Oder", "Who directed the film Pulp Fiction?", "Oder Oder",
    ]  # fmt: skip
    retriever = BM25Retriever(CORPUS, persist=False)
    vocabulary = retriever._index.vocabulary
    expected = [[i for t in retriever._tokenize(x) if (i := vocabulary.get(t)) is not None] for x in texts]
    assert expected[-1] and expected[-1][0] == expected[-1][1] and not expected[3]
    assert retriever._term_ids_many(texts) == expected  # every word new
    assert retriever._term_ids_many(texts) == expected  # every word memoized
    assert [retriever._term_ids(x) for x in texts] == expected
    assert retriever._word_terms["the"] == -1 and retriever._word_terms["zzzunknown"] == -1
    monkeypatch.setattr(bm25, "_WORD_MEMO_LIMIT", 0)  # a full memo: new words are looked up beside it
    full = BM25Retriever(CORPUS, persist=False)
    assert full._term_ids_many(texts) == expected and full._word_terms == {}


def test_a_failed_chunk_fails_the_batch_and_the_retriever_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    retriever = BM25Retriever(CORPUS, persist=False)
    retriever.threaded_postings, retriever.chunk_postings = 0, 1  # threads when numba is installed
    expected = retriever.batch(QUERIES, 3)
    real, calls = bm25_kernel.top_k_many, []

    def failing_second(*args: object, **kwargs: object) -> None:
        calls.append(1)
        if len(calls) == 2:  # a later chunk when the batch runs on threads, else the next call
            raise ValueError("injected")
        real(*args, **kwargs)

    monkeypatch.setattr(bm25_kernel, "top_k_many", failing_second)
    with pytest.raises(RetrievalError, match="BM25 batch search failed: injected"):
        retriever.batch(QUERIES, 3)
        retriever.batch(QUERIES, 3)
    calls.clear()
    with pytest.raises(RetrievalError, match="BM25 search failed for query 'Oder': injected"):
        retriever("Oder", 3)
        retriever("Oder", 3)
    assert retriever.batch(QUERIES, 3) == expected


def test_words_are_stemmed_and_batched_passage_reads_match_one_at_a_time(tmp_path: Path) -> None:
    tokenize = BM25Retriever(CORPUS, persist=False)._tokenize
    assert tokenize("running runners ran")[0] == "run"
    assert tokenize("running runners ran") == tokenize("running runners ran")  # now from the stem cache
    store = BM25Retriever(CORPUS, cache_dir=tmp_path).passages
    order = np.array([9, 0, 5, 5, 3], dtype=np.int64)
    scores = [4.0, 3.5, 2.0, 2.0, 0.25]
    assert store.get_many(order, scores) == [store.get(int(i), s) for i, s in zip(order, scores, strict=True)]
    assert store.get_many(order, scores)[2] == Passage("p5", "Antonín Dvořák", CORPUS[5].text, 2.0)
    assert store.get_many(np.zeros(0, dtype=np.int64), []) == []


def test_title_weight_and_accent_folding(tmp_path: Path) -> None:
    retriever = BM25Retriever(CORPUS, cache_dir=tmp_path)
    assert retriever("Dvorak", 1)[0].id == "p5"
    unfolded = BM25Retriever(CORPUS, cache_dir=tmp_path, fold_accents=False)
    assert unfolded("Dvorak", 1) == []
    # The title "Oder" outweighs the passage that only mentions the river in its text.
    assert retriever("Oder", 1)[0].id == "p3"


def test_k_larger_than_corpus_returns_whole_corpus(tmp_path: Path) -> None:
    retriever = BM25Retriever(CORPUS, cache_dir=tmp_path)
    result = retriever("Pomerania", 100)
    assert sorted(p.id for p in result) == sorted(p.id for p in CORPUS)
    assert [p.score for p in result] == sorted((p.score for p in result), reverse=True)
    assert result[-1].score == 0.0
    assert [len(r) for r in retriever.batch(["Pomerania", "film"], 100)] == [len(CORPUS)] * 2


def test_a_huge_k_costs_no_more_than_the_corpus(tmp_path: Path, monkeypatch) -> None:
    """A top_k of 10**9 (from a program file, --set or a bench spec) once allocated rankings 10**9 wide."""
    retriever = BM25Retriever(CORPUS, cache_dir=tmp_path)
    widths = []
    empty = bm25_kernel.Rankings.empty

    def bounded(n: int, k: int) -> bm25_kernel.Rankings:
        widths.append(k)
        if k > len(CORPUS):  # refuse here instead of allocating gigabytes on the test machine
            raise MemoryError(f"rankings {k} wide for a corpus of {len(CORPUS)}")
        return empty(n, k)

    monkeypatch.setattr(bm25_kernel.Rankings, "empty", staticmethod(bounded))
    assert len(retriever("Pomerania", 10**9)) == len(CORPUS)
    assert [len(r) for r in retriever.batch(["Pomerania", "film"], 10**9)] == [len(CORPUS)] * 2
    assert len(retriever.batch_ids(["Pomerania"], 10**9)[0]) == len(CORPUS)
    assert widths and max(widths) == len(CORPUS)


@pytest.mark.parametrize("query", ["", "   ", "the of and is", "zzzqqq xylophonic"])
def test_query_without_indexed_terms_matches_nothing(tmp_path: Path, query: str) -> None:
    assert BM25Retriever(CORPUS, cache_dir=tmp_path)(query, 5) == []


@pytest.mark.parametrize("k", [0, -1, 2.5, True])
def test_bad_k_is_a_config_error(tmp_path: Path, k: object) -> None:
    retriever = BM25Retriever(CORPUS, cache_dir=tmp_path)
    with pytest.raises(ConfigError):
        retriever("Stettin", k)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        retriever.batch(["Stettin"], k)  # type: ignore[arg-type]


def test_bad_settings_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        BM25Retriever([], cache_dir=tmp_path)
    with pytest.raises(ConfigError):
        BM25Retriever(CORPUS, cache_dir=tmp_path, method="bm99")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        BM25Retriever(CORPUS, cache_dir=tmp_path, stemmer="klingon")
    with pytest.raises(ConfigError):
        BM25Retriever(CORPUS, cache_dir=tmp_path, b=1.5)


def test_second_instance_loads_the_cached_index(tmp_path: Path) -> None:
    first = BM25Retriever(CORPUS, cache_dir=tmp_path)
    assert first.index_built
    assert first.index_dir is not None and first.index_dir.parent == tmp_path / "bm25"
    mtimes = {f.name: f.stat().st_mtime_ns for f in first.index_dir.iterdir()}
    second = BM25Retriever(CORPUS, cache_dir=tmp_path)
    assert not second.index_built
    assert second.index_key == first.index_key
    assert {f.name: f.stat().st_mtime_ns for f in second.index_dir.iterdir()} == mtimes
    assert [second(q, 5) for q in QUERIES] == [first(q, 5) for q in QUERIES]
    # No temporary build directories are left behind.
    assert [d.name for d in (tmp_path / "bm25").iterdir()] == [first.index_key]


def test_index_key_depends_on_corpus_and_settings(tmp_path: Path) -> None:
    base = BM25Retriever(CORPUS, cache_dir=tmp_path).index_key
    assert BM25Retriever(CORPUS, cache_dir=tmp_path, k1=1.2).index_key != base
    assert BM25Retriever(CORPUS, cache_dir=tmp_path, title_weight=1).index_key != base
    edited = [*CORPUS[:-1], Passage("p9", "Crime film", "Crime films are a genre.")]
    changed = BM25Retriever(edited, cache_dir=tmp_path)
    assert changed.index_key != base and changed.index_built
    assert BM25Retriever(CORPUS, cache_dir=tmp_path, persist=False).index_key == base


def _flip_last_bytes(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    for i in range(len(raw) - 8, len(raw)):
        raw[i] ^= 0x5A
    path.write_bytes(bytes(raw))


def _swap_offsets(path: Path) -> None:
    offsets = np.fromfile(path, dtype=np.int64)
    offsets[1], offsets[2] = offsets[2], offsets[1]
    offsets.tofile(path)


def _edit_meta(directory: Path, **changes) -> None:
    meta_path = directory / "ragsuite-meta.json"
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    meta.update(changes)
    meta_path.write_text(json.dumps(meta), encoding="utf-8")


def test_a_cache_directory_that_is_a_file_is_a_clear_error(tmp_path: Path) -> None:
    from ragsuite.errors import ConfigError

    blocker = tmp_path / "cache"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match="is a file; point --cache-dir or RAGSUITE_CACHE"):
        BM25Retriever(CORPUS, cache_dir=blocker)


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: (d / "weights.f32").write_bytes(b"not floats"),
        lambda d: (d / "terms.bin").unlink(),
        lambda d: (d / "ragsuite-meta.json").unlink(),
        lambda d: (d / "ragsuite-meta.json").write_text("{", encoding="utf-8"),
        lambda d: _edit_meta(d, num_postings=10**6),
        lambda d: _flip_last_bytes(d / "weights.f32"),  # same size: other scores
        lambda d: _swap_offsets(d / "indptr.i64"),  # same size, wrong postings
        lambda d: (d / "stray.npy").write_bytes(b"x"),
        lambda d: _edit_meta(d, format=1),
    ],
    ids=[
        "garbage-array",
        "missing-vocab",
        "partial-no-meta",
        "broken-meta",
        "inconsistent-counts",
        "flipped-score-bytes",
        "garbled-offsets",
        "stray-file",
        "older-format",
    ],
)
def test_damaged_index_is_rebuilt_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage
) -> None:
    first = BM25Retriever(CORPUS, cache_dir=tmp_path)
    expected = [first(q, 5) for q in QUERIES]
    damage(first.index_dir)
    with caplog.at_level(logging.WARNING, logger="ragsuite.retrieval.bm25"):
        again = BM25Retriever(CORPUS, cache_dir=tmp_path)
    assert again.index_built
    assert any("rebuilding" in r.getMessage() for r in caplog.records)
    assert [again(q, 5) for q in QUERIES] == expected
    # The rebuilt index was saved and is loaded by the next instance.
    assert not BM25Retriever(CORPUS, cache_dir=tmp_path).index_built


def test_concurrent_queries_match_sequential(tmp_path: Path, data_dir: Path) -> None:
    # A fresh instance so the stem cache is cold and threads stem concurrently.
    BM25Retriever.from_dataset("strategyqa", data_dir=data_dir, cache_dir=tmp_path)
    questions = [ex.question for ex in load_dataset("strategyqa", data_dir=data_dir)]
    shared = BM25Retriever.from_dataset("strategyqa", data_dir=data_dir, cache_dir=tmp_path)
    reference = BM25Retriever.from_dataset("strategyqa", data_dir=data_dir, cache_dir=tmp_path)
    expected = [reference(q, 10) for q in questions]
    work = questions * 6
    with ThreadPoolExecutor(max_workers=12) as pool:
        singles = list(pool.map(lambda q: shared(q, 10), work))
        batches = list(
            pool.map(lambda i: shared.batch(questions[i : i + 7], 10), range(0, len(questions), 7))
        )
    assert singles == expected * 6
    assert [r for chunk in batches for r in chunk] == expected


def test_describe_and_spec(tmp_path: Path, data_dir: Path) -> None:
    retriever = build_retriever("bm25", dataset="strategyqa", data_dir=data_dir, cache_dir=tmp_path)
    assert isinstance(retriever, BM25Retriever)
    info = retriever.describe()
    assert info["spec"] == "bm25:strategyqa"
    assert info["index_key"] == retriever.index_key
    assert info["title_weight"] == 3
    rebuilt = build_retriever(info["spec"], data_dir=data_dir, cache_dir=tmp_path)
    assert rebuilt.describe() == info and not rebuilt.index_built
    assert BM25Retriever(CORPUS, cache_dir=tmp_path).describe()["spec"] == "bm25"


@pytest.mark.parametrize("dataset", RECALL_DATASETS)
def test_recall_at_5_not_below_plain_bm25s(tmp_path: Path, data_dir: Path, dataset: str) -> None:
    corpus = load_corpus(dataset, data_dir=data_dir)
    retriever = BM25Retriever.from_dataset(dataset, data_dir=data_dir, cache_dir=tmp_path)
    examples = [ex for ex in load_dataset(dataset, data_dir=data_dir) if ex.gold_passage_ids]
    questions = [ex.question for ex in examples]
    plain_docs, _ = plain_bm25s(corpus)(questions, 5)

    def recall(ranked: list[list[str]]) -> float:
        return statistics.fmean(
            retrieval_recall(ids, ex.gold_passage_ids, 5) for ids, ex in zip(ranked, examples, strict=True)
        )

    ours = recall([[p.id for p in ps] for ps in retriever.batch(questions, 5)])
    plain = recall([[corpus[i].id for i in row] for row in plain_docs])
    assert ours >= plain  # the same questions over the same corpus


def test_opening_checks_sizes_and_rehashes_only_changed_files(tmp_path: Path) -> None:
    first = BM25Retriever(CORPUS, cache_dir=tmp_path)
    weights = first.index_dir / "weights.f32"
    stat = weights.stat()
    _flip_last_bytes(weights)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime: not re-hashed
    assert not BM25Retriever(CORPUS, cache_dir=tmp_path).index_built
    # verify=True hashes every file and catches it.
    assert BM25Retriever(CORPUS, cache_dir=tmp_path, verify=True).index_built


def test_opening_a_built_index_never_reads_the_corpus_file(tmp_path: Path, monkeypatch) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in CORPUS),
        encoding="utf-8",
    )
    built = BM25Retriever.from_file(corpus, cache_dir=tmp_path)
    assert built.index_built and built.describe()["num_passages"] == len(CORPUS)
    import ragsuite.data.datasets as datasets

    def no_reads(*_args, **_kwargs):
        raise AssertionError("the corpus file was read")

    monkeypatch.setattr(datasets, "file_sha256", no_reads)
    monkeypatch.setattr(datasets, "iter_table", no_reads)
    opened = BM25Retriever.from_file(corpus, cache_dir=tmp_path)
    assert not opened.index_built and opened.index_key == built.index_key
    assert [p.id for p in opened("Who directed Pulp Fiction?", 3)] == [
        p.id for p in built("Who directed Pulp Fiction?", 3)
    ]
    # A changed file is noticed from its metadata alone (size, mtime, ctime) and hashed again.
    monkeypatch.undo()
    with corpus.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"id": "p10", "title": "Oder", "text": "The Oder again."}) + "\n")
    changed = BM25Retriever.from_file(corpus, cache_dir=tmp_path)
    assert changed.index_built and changed.index_key != built.index_key and len(changed) == len(CORPUS) + 1


def test_ranked_ids_reads_ids_alone_when_the_retriever_can(tmp_path: Path) -> None:
    retriever = BM25Retriever(CORPUS, persist=False)
    expected = [[p.id for p in passages] for passages in retriever.batch(QUERIES, 3)]
    assert ranked_ids(retriever, QUERIES, 3) == expected

    class PassagesOnly:  # a retriever without batch_ids: the ids come from its passages
        def batch(self, queries: list[str], k: int) -> list[list[Passage]]:
            return retriever.batch(queries, k)

    assert ranked_ids(PassagesOnly(), QUERIES, 3) == expected  # type: ignore[arg-type]
