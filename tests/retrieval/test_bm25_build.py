"""The streaming BM25 build: bm25s' exact weights, any shard/block split, resume after SIGKILL, ids."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import bm25s
import numpy as np
import pytest

from ragsuite.data.datasets import load_corpus, load_dataset
from ragsuite.errors import ConfigError, DataError
from ragsuite.processes import stop_process
from ragsuite.retrieval import bm25_kernel
from ragsuite.retrieval.base import Passage
from ragsuite.retrieval.bm25 import BM25Retriever

METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")


def _corpus(data_dir: Path) -> list[Passage]:
    return load_corpus("strategyqa", data_dir=data_dir)


def _bm25s_arrays(retriever: BM25Retriever, passages: list[Passage], method: str) -> dict[str, np.ndarray]:
    """bm25s' own index over the same stems, its term ids renumbered to ours."""
    s = retriever.settings
    vocab: dict[str, int] = {}
    docs = [
        [vocab.setdefault(t, len(vocab)) for t in retriever._tokenize(retriever._document(p))]
        for p in passages
    ]
    terms = list(vocab)  # before bm25s, which may add its own empty token to the dict
    assert [retriever._index.vocabulary.term(i).decode() for i in range(len(terms))] == terms
    reference = bm25s.BM25(method=method, k1=s["k1"], b=s["b"], delta=s["delta"])
    reference.index((docs, vocab), show_progress=False)
    return {
        "indptr": reference.scores["indptr"],
        "indices": reference.scores["indices"],
        "weights": reference.scores["data"],
        "nonoccurrence": getattr(reference, "nonoccurrence_array", None),
    }


@pytest.mark.parametrize("method", METHODS)
def test_weights_equal_bm25s_bit_for_bit(tmp_path: Path, data_dir: Path, method: str) -> None:
    passages = _corpus(data_dir)
    ours = BM25Retriever(passages, cache_dir=tmp_path, method=method, shard_passages=97, block_postings=5000)
    expected = _bm25s_arrays(ours, passages, method)
    index = ours._index
    np.testing.assert_array_equal(np.asarray(index.indptr), expected["indptr"])
    np.testing.assert_array_equal(np.asarray(index.indices), expected["indices"])
    assert np.asarray(index.weights).tobytes() == np.asarray(expected["weights"], dtype=np.float32).tobytes()
    if method in ("bm25l", "bm25+"):
        assert np.asarray(index.nonoccurrence).tobytes() == expected["nonoccurrence"].tobytes()
    else:
        assert index.nonoccurrence is None


def _dense_reference(retriever: BM25Retriever, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
    """Every passage scored (a float64 bincount over the postings), sorted by (score desc, corpus order)."""
    index = retriever._index
    indptr, indices, weights = (np.asarray(a) for a in (index.indptr, index.indices, index.weights))
    n = len(retriever)
    results = []
    for query in queries:
        terms = retriever._term_ids(query)
        if not terms:
            results.append([])
            continue
        scores = np.zeros(n)
        for t in terms:
            scores += np.bincount(indices[indptr[t] : indptr[t + 1]], weights[indptr[t] : indptr[t + 1]], n)
        if index.nonoccurrence is not None:
            scores += np.asarray(index.nonoccurrence)[terms].sum()
        order = np.lexsort((np.arange(n), -scores))[:k]
        results.append([(int(i), float(scores[i])) for i in order])
    return results


needs_numba = pytest.mark.skipif(
    importlib.util.find_spec("numba") is None, reason="the compiled kernel needs: pip install -e '.[fast]'"
)


@pytest.mark.parametrize("mode", ["sparse", "dense"])
@pytest.mark.parametrize("kernel", ["numpy", pytest.param("numba", marks=needs_numba)])
@pytest.mark.parametrize("method", ["lucene", "bm25+", "robertson"])
def test_rankings_equal_scoring_every_passage(
    tmp_path: Path, data_dir: Path, method: str, kernel: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGSUITE_BM25_KERNEL", kernel)
    share = 0.0 if mode == "dense" else float("inf")  # every query scored densely, or none
    monkeypatch.setattr(bm25_kernel, "DENSE_POSTINGS_SHARE", {"numpy": share, "numba": share})
    assert bm25_kernel.kernel_name() == kernel
    passages = _corpus(data_dir)
    ids = {p.id: i for i, p in enumerate(passages)}
    questions = [ex.question for ex in load_dataset("strategyqa", data_dir=data_dir)]
    # Short and rare queries too: fewer matches than k, so passages scoring the base score fill the list.
    questions += ["Oder", "zzzunknownword Stettin", "the of and", "symphony symphony"]
    retriever = BM25Retriever(passages, cache_dir=tmp_path, method=method)
    for k in (1, 10, len(passages) + 5):
        expected = _dense_reference(retriever, questions, k)
        got = retriever.batch(questions, k)
        assert [[(ids[p.id], p.score) for p in row] for row in got] == expected
        if kernel == "numba":  # the same when spread over threads, one query a chunk
            retriever.threaded_postings, retriever.chunk_postings = 0, 1
            assert retriever.batch(questions, k) == got
            assert retriever.batch_ids(questions, k) == [[p.id for p in row] for row in got]
            del retriever.threaded_postings, retriever.chunk_postings


def test_any_shard_and_block_split_builds_the_same_index(tmp_path: Path, data_dir: Path) -> None:
    passages = _corpus(data_dir)
    whole = BM25Retriever(passages, cache_dir=tmp_path / "a", shard_passages=10**6)
    split = BM25Retriever(passages, cache_dir=tmp_path / "b", shard_passages=7, block_postings=400)
    for name in ("indptr.i64", "indices.i32", "weights.f32", "terms.bin", "passages.bin", "lengths.i32"):
        assert (whole.index_dir / name).read_bytes() == (split.index_dir / name).read_bytes(), name
    assert list(split.passages) == passages


def test_a_build_interrupted_by_an_error_resumes_where_it_stopped(tmp_path: Path, data_dir: Path) -> None:
    passages = _corpus(data_dir)
    file = tmp_path / "corpus.jsonl"
    file.write_text("".join(json.dumps(p.to_dict()) + "\n" for p in passages), encoding="utf-8")
    reference = BM25Retriever(passages, persist=False)

    calls = []

    class Flaky(BM25Retriever):
        def _document(self, passage: Passage) -> str:
            calls.append(passage.id)
            if fail_at is not None and len(calls) == fail_at:
                raise KeyboardInterrupt
            return super()._document(passage)

    fail_at: int | None = 250
    with pytest.raises(KeyboardInterrupt):
        Flaky.from_file(file, cache_dir=tmp_path, shard_passages=100)
    assert len(calls) == 250
    fail_at = None
    calls.clear()
    resumed = Flaky.from_file(file, cache_dir=tmp_path, shard_passages=100)
    assert len(calls) == len(passages) - 200  # the two finished shards are not tokenized again
    assert resumed.index_built
    questions = [ex.question for ex in load_dataset("strategyqa", data_dir=data_dir)]
    assert resumed.batch(questions, 10) == reference.batch(questions, 10)
    assert not any(p.name.endswith(".partial") for p in (tmp_path / "bm25").iterdir())


_KILLED_BUILD = """
import sys, time
from ragsuite.retrieval.bm25 import BM25Retriever
from ragsuite.retrieval.base import Passage

class Slow(BM25Retriever):
    def _document(self, passage):
        time.sleep(0.002)
        return super()._document(passage)

Slow.from_file(sys.argv[1], cache_dir=sys.argv[2], shard_passages=40)
"""


def test_a_killed_build_resumes_and_matches_a_fresh_one(tmp_path: Path, data_dir: Path) -> None:
    passages = _corpus(data_dir)
    file = tmp_path / "corpus.jsonl"
    file.write_text("".join(json.dumps(p.to_dict()) + "\n" for p in passages), encoding="utf-8")
    cache = tmp_path / "cache"
    process = subprocess.Popen([sys.executable, "-c", _KILLED_BUILD, str(file), str(cache)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list(cache.glob("bm25/*.partial/shards/000002.done")):
            time.sleep(0.02)
        assert process.poll() is None, "the build finished before it could be killed"
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        stop_process(process)
    (partial,) = cache.glob("bm25/*.partial")
    done_before = len(list(partial.glob("shards/*.done")))
    assert 3 <= done_before < len(passages) / 40
    resumed = BM25Retriever.from_file(file, cache_dir=cache, shard_passages=40)
    fresh = BM25Retriever(passages, persist=False)
    questions = [ex.question for ex in load_dataset("strategyqa", data_dir=data_dir)]
    assert resumed.index_built and resumed.batch(questions, 10) == fresh.batch(questions, 10)


def test_duplicate_ids_are_found_by_the_streaming_build(tmp_path: Path) -> None:
    rows = [{"id": f"p{i}", "title": "T", "text": f"passage number {i}"} for i in range(30)]
    rows.append({"id": "p7", "title": "U", "text": "a second p7"})
    file = tmp_path / "c.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(DataError, match=r"c.jsonl:31: duplicate passage id 'p7' \(first on line 8\)"):
        BM25Retriever.from_file(file, cache_dir=tmp_path, shard_passages=4)
    passages = [Passage(r["id"], r["title"], r["text"]) for r in rows]
    with pytest.raises(ConfigError, match=r"duplicate passage id 'p7' \(passages 8 and 31"):
        BM25Retriever(passages, persist=False)


def test_a_corpus_of_stopwords_only_builds_and_matches_nothing(tmp_path: Path) -> None:
    retriever = BM25Retriever([Passage("a", "", "the of and"), Passage("b", "", "it is")], persist=False)
    assert len(retriever) == 2 and retriever("Stettin", 3) == [] and retriever("", 3) == []
    assert retriever.passages[1] == Passage("b", "", "it is")


def test_passages_with_odd_text_round_trip(tmp_path: Path) -> None:
    odd = [
        Passage("p\x00nul", "tab\there", "line\nbreak é \ud800 lone surrogate"),
        Passage("2", "", ""),
        Passage("3", "Émile", "ÉMILE émile"),
    ]
    retriever = BM25Retriever(odd, cache_dir=tmp_path)
    assert list(retriever.passages) == odd
    assert retriever("emile", 3)[0].id == "3"


def test_accent_folding_equals_whole_text_nfkd(data_dir: Path) -> None:
    import random
    import unicodedata

    from ragsuite.retrieval.bm25 import _fold

    def whole_text(text: str) -> str:
        return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))

    texts = [
        p.title + " " + p.text for name in ("asqa", "musique") for p in load_corpus(name, data_dir=data_dir)
    ]
    rng = random.Random(0)
    ranges = [(0x20, 0x7F), (0xA0, 0x3000), (0x300, 0x370), (0xAC00, 0xD7A4), (0x1E00, 0x1F00)]
    for _ in range(3000):
        texts.append("".join(chr(rng.randrange(*rng.choice(ranges))) for _ in range(30)))
    assert [_fold(t) for t in texts] == [whole_text(t) for t in texts]


@needs_numba
def test_kernels_can_alternate_on_one_retriever(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    passages = _corpus(data_dir)
    questions = [ex.question for ex in load_dataset("strategyqa", data_dir=data_dir)]
    expected = BM25Retriever(passages, persist=False).batch(questions, 10)
    shared = BM25Retriever(passages, persist=False)
    for i, question in enumerate(questions * 2):
        monkeypatch.setenv("RAGSUITE_BM25_KERNEL", ("numba", "numpy")[i % 2])
        assert shared(question, 10) == expected[i % len(questions)]


def test_an_interrupted_query_never_leaves_scores_behind() -> None:
    pool = bm25_kernel.Workspaces(5)
    with pytest.raises(KeyboardInterrupt), pool.borrow() as workspace:
        workspace.scores[2] = 7.0  # a query stopped half-way through adding postings
        raise KeyboardInterrupt
    for _ in range(4):
        with pool.borrow() as workspace:
            assert not workspace.scores.any()


_RACING_BUILD = """
import sys, time
from ragsuite.retrieval.bm25 import BM25Retriever

class Slow(BM25Retriever):
    def _document(self, passage):
        time.sleep(0.001)
        return super()._document(passage)

r = Slow.from_file(sys.argv[1], cache_dir=sys.argv[2], shard_passages=100)
print(int(r.index_built), r.index_key, len(r))
"""


def test_two_processes_building_one_index_build_it_once(tmp_path: Path, data_dir: Path) -> None:
    passages = _corpus(data_dir)
    file = tmp_path / "corpus.jsonl"
    file.write_text("".join(json.dumps(p.to_dict()) + "\n" for p in passages), encoding="utf-8")
    cache = tmp_path / "cache"
    command = [sys.executable, "-c", _RACING_BUILD, str(file), str(cache)]
    processes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=120) for p in processes]
    finally:
        for process in processes:
            stop_process(process)
    assert [p.returncode for p in processes] == [0, 0], [err for _, err in outputs]
    built = sorted(out.split()[0] for out, _ in outputs)
    assert built == ["0", "1"]  # one built it, the other waited and opened it
    assert len({out.split()[1] for out, _ in outputs}) == 1
    assert any("waiting for it" in err for _, err in outputs)
    assert [p.name for p in (cache / "bm25").iterdir()] == [outputs[0][0].split()[1]]


@needs_numba
def test_the_float32_kernel_ranks_near_ties_by_their_exact_float64_sums(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Weights whose float32 sums tie (1 + tiny rounds to 1 in float32) while their float64 sums differ, and
    # exact ties broken by passage order: the compiled kernel must rank as the float64 fallback does.
    rng = np.random.default_rng(0)
    n = 5000
    tiny = np.float32(2.0**-30)
    columns = [
        (np.arange(n), np.ones(n, dtype=np.float32)),  # every passage: 1.0
        (np.sort(rng.choice(n, 800, replace=False)), (rng.integers(1, 4, 800) * tiny).astype(np.float32)),
        (np.sort(rng.choice(n, 300, replace=False)), rng.choice([0.5, 0.25], 300).astype(np.float32)),
        (np.sort(rng.choice(n, 50, replace=False)), np.full(50, 2.0**-20, dtype=np.float32)),
    ]
    indptr = np.zeros(len(columns) + 1, dtype=np.int64)
    np.cumsum([len(c[0]) for c in columns], out=indptr[1:])
    indices = np.concatenate([c[0] for c in columns]).astype(np.int32)
    weights = np.concatenate([c[1] for c in columns])
    queries = [
        np.array(q, dtype=np.int64) for q in ([0, 1], [1, 0], [0, 1, 3], [0, 2, 1, 3], [1, 1, 0], [3, 1])
    ]
    bases = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.25])
    terms, offsets = bm25_kernel.flatten(queries)
    for k in (1, 10, 600):
        expected = bm25_kernel.Rankings.empty(len(queries), k)
        got = bm25_kernel.Rankings.empty(len(queries), k)
        monkeypatch.setenv("RAGSUITE_BM25_KERNEL", "numpy")
        bm25_kernel.top_k_many(
            indptr, indices, weights, terms, offsets, bases, bm25_kernel.Workspace(n), expected
        )
        monkeypatch.setenv("RAGSUITE_BM25_KERNEL", "numba")
        bm25_kernel.top_k_many(indptr, indices, weights, terms, offsets, bases, bm25_kernel.Workspace(n), got)
        for q, (query, base) in enumerate(zip(queries, bases, strict=True)):
            (want_docs, want_scores), (docs, scores) = expected.row(q), got.row(q)
            assert docs.tolist() == want_docs.tolist() and scores.tolist() == want_scores.tolist()
            # and both are the float64 ranking of every passage, sums in query-term order
            dense = np.zeros(n)
            for t in query:
                span = slice(indptr[t], indptr[t + 1])
                dense[indices[span]] += weights[span].astype(np.float64)
            order = np.lexsort((np.arange(n), -dense))[:k]
            order = order[dense[order] > 0]
            assert docs.tolist() == order.tolist()
            assert scores.tolist() == (dense[order] + base).tolist()
        if k == 600:  # the float32 sums alone would not have separated these passages
            scores = got.row(0)[1]
            assert len(set(scores.tolist())) >= 3 and len(set(scores.astype(np.float32).tolist())) == 1
