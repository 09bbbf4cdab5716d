"""DenseRetriever's FAISS indexes and its resumable embedding, with a tiny random BERT encoder built here (no
downloaded weights) over the 400 StrategyQA fixture passages: exact flat search equals the plain numpy
ranking; a tiny IVF-PQ and an HNSW index return sensible results and describe their parameters; length-sorted
batches give the corpus-order vectors; an interrupted build reuses its completed chunks and re-embeds corrupt
ones."""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest

from ragsuite.errors import ConfigError, MissingExtraError, install_hint

BATCH = 16
CHUNK = 64  # 4 batches per chunk; 400 passages = 6 full chunks (24 batches) + one of 16 passages (1 batch)
TOTAL_BATCHES = 25


@pytest.fixture(scope="module")
def corpus(data_dir):
    from ragsuite.data.datasets import load_corpus

    return load_corpus("strategyqa", data_dir=data_dir)


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory, corpus, tiny_encoder):
    pytest.importorskip("faiss", reason="needs the dense extra: " + install_hint("dense"))
    return tiny_encoder([p.render() for p in corpus], tmp_path_factory.mktemp("encoder"), vocab_size=2000)


def _dense(corpus, encoder_dir, cache_dir, **settings):
    from ragsuite.retrieval.dense import DenseRetriever

    settings.setdefault("max_length", 64)
    return DenseRetriever(
        corpus, model=encoder_dir, cache_dir=cache_dir, dataset="strategyqa", batch_size=BATCH, **settings
    )


def _numpy_ranking(embeddings: np.ndarray, query: np.ndarray, k: int) -> tuple[list[int], np.ndarray]:
    """The ranking DenseRetriever computed before FAISS: all scores, argpartition, stable sort."""
    scores = np.asarray(embeddings) @ query
    top = np.argpartition(-scores, k - 1)[:k]
    top = top[np.argsort(-scores[top], kind="stable")]
    return top.tolist(), scores[top]


def test_flat_faiss_equals_the_numpy_ranking(corpus, encoder_dir, tmp_path):
    retriever = _dense(corpus, encoder_dir, tmp_path)
    assert retriever.describe()["index"] == {"type": "flat", "factory": "Flat"}  # auto, 400 <= flat_max
    assert isinstance(retriever.embeddings, np.memmap) and retriever.embeddings.dtype == np.float32
    queries = [corpus[i].text[:80] for i in range(0, 400, 20)] + ["a question about rivers and the sea"]
    embedded = retriever._encode(queries)
    for query, vector, ranked in zip(queries, embedded, retriever.batch(queries, 10), strict=True):
        ids, scores = _numpy_ranking(retriever.embeddings, vector, 10)
        assert [p.id for p in ranked] == [corpus[i].id for i in ids], query
        assert [p.score for p in ranked] == pytest.approx(scores.tolist(), abs=1e-5)
    assert len(retriever("anything", 1000)) == len(corpus)


def test_ivfpq_and_hnsw_are_sensible_and_described(corpus, encoder_dir, tmp_path, monkeypatch, data_dir):
    import faiss

    from ragsuite.retrieval import dense_index
    from ragsuite.retrieval.spec import build_retriever

    exact = _dense(corpus, encoder_dir, tmp_path, index="flat")
    ivf = _dense(corpus, encoder_dir, tmp_path, index="ivfpq", nlist=4, nprobe=2, pq_m=8)
    described = ivf.describe()
    assert described["index"] == {
        "type": "ivfpq",
        "factory": "IVF4,PQ8x8",
        "nlist": 4,
        "nprobe": 2,
        "pq_m": 8,
        "pq_bits": 8,
        "rerank": 16,
    }
    assert described["spec"] == f"dense:strategyqa:{encoder_dir}:index=ivfpq:nlist=4:nprobe=2:pq_m=8"
    assert ivf.index.ntotal == len(corpus) and ivf.index.nlist == 4
    sample = list(range(0, 400, 8))
    own = [p.text for p in (corpus[i] for i in sample)]
    hits = [ranked[0].id for ranked in ivf.batch(own, 5)]
    # Two of four cells are probed: a passage in another cell is missed (1 of these 50; chance: 0).
    assert sum(h == corpus[i].id for h, i in zip(hits, sample, strict=True)) >= 0.9 * len(sample)
    # The build is reproducible: the same embeddings give the same trained index, byte for byte.
    rebuilt = dense_index.build_index(
        ivf.index_params,
        n=len(corpus),
        dim=ivf.embeddings.shape[1],
        batches=dense_index.array_batches(ivf.embeddings),
    )
    assert np.array_equal(faiss.serialize_index(rebuilt), faiss.serialize_index(ivf.index))
    # Against exact search: most of the top 10 agree, and re-scored scores are exact cosines, best first.
    overlap = []
    for a, b in zip(ivf.batch(own, 10), exact.batch(own, 10), strict=True):
        assert [p.score for p in a] == sorted((p.score for p in a), reverse=True)
        assert len({p.id for p in a}) == len(a) == 10
        scores = {p.id: p.score for p in b}
        assert all(p.score == pytest.approx(scores[p.id], abs=1e-5) for p in a if p.id in scores)
        overlap.append(len({p.id for p in a} & set(scores)) / 10)
    assert np.mean(overlap) >= 0.6
    # Without re-scoring the quantized scores come back, not exact ones.
    quantized = _dense(corpus, encoder_dir, tmp_path, index="ivfpq", nlist=4, nprobe=2, pq_m=8, rerank=1)
    assert quantized.describe()["index"]["rerank"] == 1
    assert quantized(own[0], 1)[0].score != pytest.approx(1.0, abs=1e-6)
    # The trained index was cached beside the embeddings and is loaded, not rebuilt (search options apart).
    assert len(list((tmp_path / "dense").glob(f"{ivf.key}.*.faiss"))) == 1
    monkeypatch.setattr(dense_index, "build_index", lambda *a, **kw: pytest.fail("index rebuilt"))
    again = build_retriever(described["spec"], data_dir=data_dir, cache_dir=tmp_path, max_length=64)
    assert again.describe() == described
    assert [p.id for p in again(own[3], 5)] == [p.id for p in ivf(own[3], 5)]
    monkeypatch.undo()

    hnsw = _dense(corpus, encoder_dir, tmp_path, index="hnsw", hnsw_m=8, ef_search=16)
    assert hnsw.describe()["index"] == {
        "type": "hnsw",
        "factory": "HNSW8,Flat",
        "hnsw_m": 8,
        "ef_construction": 80,
        "ef_search": 16,
    }
    hits = [ranked[0].id for ranked in hnsw.batch(own, 3)]
    assert sum(h == corpus[i].id for h, i in zip(hits, sample, strict=True)) >= 0.9 * len(sample)
    # auto switches to IVF-PQ above flat_max.
    auto = _dense(corpus, encoder_dir, tmp_path, flat_max=300, nlist=4, pq_m=8)
    assert auto.describe()["index"]["type"] == "ivfpq"


def test_bad_index_options_are_refused(corpus, encoder_dir, tmp_path, data_dir):
    from ragsuite.retrieval.spec import build_retriever, parse_dense_spec

    assert parse_dense_spec("") == ("", "", {})
    assert parse_dense_spec("nq:/models/x:index=hnsw:ef_search=99") == (
        "nq",
        "/models/x",
        {"index": "hnsw", "ef_search": "99"},
    )
    assert parse_dense_spec(":index=flat") == ("", "", {"index": "flat"})
    with pytest.raises(ConfigError, match="nprobe"):
        build_retriever("dense:strategyqa:nprobe=0", data_dir=data_dir, cache_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"known: .*ef_search"):
        build_retriever("dense:strategyqa:nprob=4", data_dir=data_dir, cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="integer"):
        build_retriever("dense:strategyqa:nlist=many", data_dir=data_dir, cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="index must be one of"):
        build_retriever("dense:strategyqa:index=annoy", data_dir=data_dir, cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="divide"):
        _dense(corpus, encoder_dir, tmp_path, index="ivfpq", pq_m=5)
    with pytest.raises(ConfigError, match="index=flat"):
        _dense(corpus[:100], encoder_dir, tmp_path, index="ivfpq", nlist=2)


def test_faiss_missing_names_the_dense_extra(monkeypatch, corpus):
    from ragsuite.retrieval.dense import DenseRetriever

    monkeypatch.setitem(sys.modules, "faiss", None)  # makes `import faiss` raise ImportError
    with pytest.raises(MissingExtraError, match=r"pip install .*\[dense\]"):
        DenseRetriever(corpus[:5])


def test_length_sorted_batches_give_the_corpus_order_vectors(corpus, encoder_dir, tmp_path):
    retriever = _dense(corpus, encoder_dir, tmp_path, persist=False)
    texts = [p.render() for p in corpus[:100]]
    seen: list[list[str]] = []
    tokenizer = retriever._tokenizer

    def recording(batch, **kwargs):
        seen.append(list(batch))
        return tokenizer(batch, **kwargs)

    retriever._tokenizer = recording
    try:
        plain = retriever._encode(texts, sort=False)
        assert seen[0] == texts[:BATCH]
        seen.clear()
        ordered = retriever._encode(texts)
    finally:
        retriever._tokenizer = tokenizer
    lengths = [len(t) for batch in seen for t in batch]
    assert lengths == sorted(lengths, reverse=True)  # longest first
    assert sorted(t for batch in seen for t in batch) == sorted(texts)
    np.testing.assert_allclose(ordered, plain, atol=1e-5)
    # The in-memory corpus build (persist=False) matches too.
    np.testing.assert_allclose(retriever.embeddings[:100], plain, atol=1e-5)


class _Killed(RuntimeError):
    pass


def _counting_encoder(monkeypatch, *, fail_after: int | None):
    """Count encoder batches; raise after ``fail_after`` of them, as a killed build would stop."""
    import transformers

    calls = {"n": 0}
    load = getattr(transformers.AutoModel.from_pretrained, "original", transformers.AutoModel.from_pretrained)

    class Counting:
        def __init__(self, model):
            self.model = model

        def eval(self):
            self.model.eval()
            return self

        def __call__(self, **batch):
            if fail_after is not None and calls["n"] >= fail_after:
                raise _Killed(f"killed after {fail_after} batches")
            calls["n"] += 1
            return self.model(**batch)

    def from_pretrained(*args, **kwargs):
        return Counting(load(*args, **kwargs))

    from_pretrained.original = load
    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", from_pretrained)
    return calls


def test_an_interrupted_build_resumes_from_its_completed_chunks(corpus, encoder_dir, tmp_path, monkeypatch):
    reference = _dense(corpus, encoder_dir, tmp_path, persist=False).embeddings
    calls = _counting_encoder(monkeypatch, fail_after=10)  # 2 chunks (8 batches) done, the third half-way
    with pytest.raises(_Killed):
        _dense(corpus, encoder_dir, tmp_path, chunk_size=CHUNK)
    parts = next((tmp_path / "dense").glob("*.parts"))
    assert sorted(p.name for p in parts.glob("chunk-*.npy")) == ["chunk-000000.npy", "chunk-000001.npy"]
    assert not list((tmp_path / "dense").glob("*.npy"))  # no final matrix from a partial build

    calls = _counting_encoder(monkeypatch, fail_after=None)
    retriever = _dense(corpus, encoder_dir, tmp_path, chunk_size=CHUNK)
    assert calls["n"] == TOTAL_BATCHES - 8  # the completed chunks were reused
    assert not parts.exists()  # assembled, then removed
    assert isinstance(retriever.embeddings, np.memmap)
    np.testing.assert_allclose(retriever.embeddings, reference, atol=1e-5)
    # The finished matrix is reused as it is.
    calls = _counting_encoder(monkeypatch, fail_after=None)
    _dense(corpus, encoder_dir, tmp_path, chunk_size=CHUNK)
    assert calls["n"] == 0


def test_a_corrupt_chunk_is_detected_and_embedded_again(corpus, encoder_dir, tmp_path, monkeypatch, caplog):
    reference = _dense(corpus, encoder_dir, tmp_path, persist=False).embeddings
    _counting_encoder(monkeypatch, fail_after=14)  # chunks 0, 1, 2 complete
    with pytest.raises(_Killed):
        _dense(corpus, encoder_dir, tmp_path, chunk_size=CHUNK)
    parts = next((tmp_path / "dense").glob("*.parts"))
    flipped = parts / "chunk-000001.npy"
    raw = bytearray(flipped.read_bytes())
    raw[-7] ^= 0x40  # a bit inside the float data: np.load alone would not notice
    flipped.write_bytes(bytes(raw))
    truncated = parts / "chunk-000002.npy"
    truncated.write_bytes(truncated.read_bytes()[:200])

    calls = _counting_encoder(monkeypatch, fail_after=None)
    with caplog.at_level(logging.WARNING, logger="ragsuite.retrieval.dense"):
        retriever = _dense(corpus, encoder_dir, tmp_path, chunk_size=CHUNK)
    assert calls["n"] == TOTAL_BATCHES - 4  # only chunk 0 was reused
    assert "chunk-000001.npy" in caplog.text and "chunk-000002.npy" in caplog.text
    np.testing.assert_allclose(retriever.embeddings, reference, atol=1e-5)


def test_other_chunking_discards_the_parts(corpus, encoder_dir, tmp_path, monkeypatch):
    _counting_encoder(monkeypatch, fail_after=10)
    with pytest.raises(_Killed):
        _dense(corpus, encoder_dir, tmp_path, chunk_size=CHUNK)
    calls = _counting_encoder(monkeypatch, fail_after=None)
    _dense(corpus, encoder_dir, tmp_path, chunk_size=2 * CHUNK)  # other chunk boundaries: nothing reusable
    assert calls["n"] == TOTAL_BATCHES
