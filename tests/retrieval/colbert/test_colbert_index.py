"""The real colbert-ai path on CPU: a tiny checkpoint built here, a PLAID index of a few hundred passages from
the shipped StrategyQA corpus, search, reload, the spec, the CLI, corrupt indexes and the transformers shim.

The first run compiles colbert-ai's C++ extensions (about 2-3 minutes on 2 cores) into TORCH_EXTENSIONS_DIR.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ragsuite.errors import ConfigError, RetrievalError, install_hint

pytest.importorskip("colbert", reason="needs the colbert extra: " + install_hint("colbert"))
pytest.importorskip("torch", reason="needs the colbert extra: " + install_hint("colbert"))

N_PASSAGES = 300


@pytest.fixture(scope="module")
def corpus(data_dir):
    from ragsuite.data.datasets import load_corpus

    return load_corpus("strategyqa", data_dir=data_dir)[:N_PASSAGES]


@pytest.fixture(scope="module")
def built(tmp_path_factory, corpus):
    """A tiny checkpoint and an index built through ``ragsuite index --retriever colbert``."""
    from ragsuite.cli import main
    from ragsuite.retrieval.colbert.checkpoint import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("colbert")
    checkpoint = build_tiny_checkpoint(corpus, root / "ckpt", seed=1)
    data = root / "data" / "strategyqa"
    data.mkdir(parents=True)
    with (data / "corpus.jsonl").open("w") as handle:
        for p in corpus:
            handle.write(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n")
    index_dir = root / "index"
    argv = ["index", "--retriever", "colbert", "--checkpoint", str(checkpoint), "--dataset", "strategyqa"]
    argv += ["--data-dir", str(root / "data"), "--index-dir", str(index_dir)]
    argv += ["--doc-maxlen", "150", "--kmeans-niters", "3", "--index-bsize", "32"]  # PLAID settings as flags
    assert main(argv) == 0
    return checkpoint, index_dir


@pytest.fixture(scope="module")
def index(built):
    from ragsuite.retrieval.colbert.index import ColBERTv2Index

    return ColBERTv2Index.load(built[1])


@pytest.mark.slow
def test_tiny_checkpoint_is_a_colbert_checkpoint(built):
    checkpoint, _ = built
    vocab = (checkpoint / "vocab.txt").read_text().split("\n")
    assert "[unused0]" in vocab and "[unused1]" in vocab and 1000 < len(vocab) <= 8001
    metadata = json.loads((checkpoint / "artifact.metadata").read_text())
    assert metadata["dim"] == 64
    assert json.loads((checkpoint / "config.json").read_text())["hidden_size"] == 64


@pytest.mark.slow
def test_exact_text_finds_its_passage(index, corpus):
    sample = corpus[::15]  # 20 passages
    firsts = [index(p.render(), 3) for p in sample]
    hits = sum(result[0].id == p.id for result, p in zip(firsts, sample, strict=True))
    assert hits >= 0.8 * len(sample), (
        f"only {hits}/{len(sample)} exact-text queries ranked their passage first"
    )
    top = firsts[0][0]
    assert top.title == sample[0].title and top.text == sample[0].text and top.score > 0
    assert len(index(sample[1].text, 7)) == 7
    assert [p.score for p in firsts[2]] == sorted((p.score for p in firsts[2]), reverse=True)
    # batch() gives the same rankings as single queries.
    batched = index.batch([p.render() for p in sample[:4]], 3)
    assert [[p.id for p in r] for r in batched] == [[p.id for p in r] for r in firsts[:4]]
    # A larger k than the corpus returns every passage at most once.
    everything = index("river", 500)
    assert len({p.id for p in everything}) == len(everything) <= N_PASSAGES


@pytest.mark.slow
def test_spec_describe_and_reload(index, built, corpus):
    from ragsuite.retrieval.spec import build_retriever

    described = index.describe()
    assert described["spec"] == f"colbert-index:{built[1].resolve()}"
    assert described["n_passages"] == N_PASSAGES
    again = build_retriever(described["spec"])
    query = corpus[42].render()
    assert [p.id for p in again(query, 5)] == [p.id for p in index(query, 5)]


@pytest.mark.slow
def test_served_over_http(index, corpus):
    from ragsuite.retrieval.colbert.client import ColBERTv2Client
    from ragsuite.retrieval.server import RetrieverServer

    with RetrieverServer(index) as server:
        passages = ColBERTv2Client(server.url, retries=0)(corpus[7].render(), 2)
    assert [p.id for p in passages] == [p.id for p in index(corpus[7].render(), 2)]
    assert passages[0].title == index(corpus[7].render(), 1)[0].title


@pytest.mark.slow
def test_refuses_to_overwrite_and_bad_inputs(built, corpus, tmp_path):
    from ragsuite.retrieval.colbert.index import build_colbert_index

    checkpoint, index_dir = built
    with pytest.raises(ConfigError, match="already holds"):
        build_colbert_index(corpus[:10], checkpoint=checkpoint, index_dir=index_dir)
    with pytest.raises(ConfigError, match="empty"):
        build_colbert_index([], checkpoint=checkpoint, index_dir=tmp_path / "x")
    with pytest.raises(ConfigError, match="unique"):
        build_colbert_index([corpus[0], corpus[0]], checkpoint=checkpoint, index_dir=tmp_path / "x")
    with pytest.raises(ConfigError, match="does not exist"):
        build_colbert_index(corpus[:5], checkpoint=str(tmp_path / "nope"), index_dir=tmp_path / "x")


@pytest.mark.slow
def test_missing_and_corrupt_indexes(built, tmp_path):
    from ragsuite.retrieval.colbert.index import MANIFEST, PASSAGES, ColBERTv2Index

    with pytest.raises(ConfigError, match="no ColBERT index"):
        ColBERTv2Index.load(tmp_path / "absent")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="missing"):
        ColBERTv2Index.load(empty)

    def damaged(name: str) -> Path:
        copy = tmp_path / name
        shutil.copytree(built[1], copy)
        return copy

    bad_manifest = damaged("manifest")
    (bad_manifest / MANIFEST).write_text("{not json")
    with pytest.raises(RetrievalError, match="corrupt"):
        ColBERTv2Index.load(bad_manifest)

    short = damaged("short")
    lines = (short / PASSAGES).read_text().splitlines()
    (short / PASSAGES).write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(RetrievalError, match="corrupt"):
        ColBERTv2Index.load(short)

    broken = damaged("plaid")
    (broken / "plaid" / "ivf.pid.pt").write_bytes(b"garbage")
    with pytest.raises(RetrievalError, match="cannot open ColBERT index"):
        ColBERTv2Index.load(broken)

    moved = damaged("moved")
    manifest = json.loads((moved / MANIFEST).read_text())
    manifest["checkpoint"] = str(tmp_path / "gone")
    (moved / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="is gone"):
        ColBERTv2Index.load(moved)
    assert len(ColBERTv2Index.load(moved, checkpoint=built[0])) == N_PASSAGES


def test_transformers5_shim():
    """The init_weights wrapper runs post_init first when all_tied_weights_keys is missing (as in
    transformers 5)."""
    from ragsuite.retrieval.colbert.compat import needs_tied_weights_shim, patch_model_class

    assert needs_tied_weights_shim("5.0.1") and not needs_tied_weights_shim("4.57.6")
    calls = []

    class Model:  # mimics transformers 5: init_weights needs the attribute post_init sets
        def __init__(self) -> None:
            self.init_weights()

        def post_init(self) -> None:
            calls.append("post_init")
            self.all_tied_weights_keys = {}
            self.init_weights()

        def init_weights(self) -> None:
            calls.append("init_weights")
            assert hasattr(self, "all_tied_weights_keys"), "'HF_ColBERT' object has no attribute ..."

    with pytest.raises(AssertionError):
        Model()
    calls.clear()
    patch_model_class(Model)
    patch_model_class(Model)  # idempotent
    Model()
    assert calls == ["post_init", "init_weights"]


def test_shim_is_inactive_on_transformers_4():
    import transformers

    from ragsuite.retrieval.colbert.compat import patch_colbert_for_transformers

    if transformers.__version__.startswith("4."):
        assert patch_colbert_for_transformers() is False


@pytest.mark.slow
def test_cli_reindex_needs_overwrite(built, corpus, tmp_path, capsys):
    from ragsuite.cli import main
    from ragsuite.retrieval.colbert.index import PASSAGES

    checkpoint, index_dir = built
    index_copy = tmp_path / "index"
    shutil.copytree(index_dir, index_copy)
    data = tmp_path / "data" / "strategyqa"
    data.mkdir(parents=True)
    with (data / "corpus.jsonl").open("w") as handle:
        for p in corpus[:40]:
            handle.write(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n")
    argv = ["index", "--retriever", "colbert", "--checkpoint", str(checkpoint), "--dataset", "strategyqa"]
    argv += ["--data-dir", str(tmp_path / "data"), "--index-dir", str(index_copy)]
    assert main(argv) == 2
    assert "already holds" in capsys.readouterr().err
    assert len((index_copy / PASSAGES).read_text().splitlines()) == N_PASSAGES
    assert main([*argv, "--overwrite"]) == 0
    assert len((index_copy / PASSAGES).read_text().splitlines()) == 40
    assert main(["index", "--dataset", "strategyqa", "--overwrite"]) == 2


@pytest.mark.slow
def test_late_interaction_scores_rerank_any_pool(index, corpus):
    from ragsuite.retrieval.base import Passage, Reranker

    assert isinstance(index, Reranker)
    # Scoring needs no index lookup: a passage under an id the index does not know is scored like any other.
    unknown = Passage("not-in-the-index", corpus[200].title, corpus[200].text)
    pool = [*corpus[40:52], unknown]
    ranked_first = []
    for target in pool:
        scores = index.score(target.render(), pool)
        assert len(scores) == len(pool)
        ranked_first.append(max(range(len(pool)), key=scores.__getitem__) == pool.index(target))
    assert sum(ranked_first) >= 0.8 * len(pool), ranked_first
    assert index.score("anything", []) == []
    with pytest.raises(ConfigError):
        index.score("", pool)


@pytest.mark.slow
def test_plaid_flags_reach_the_index(built):
    manifest = json.loads((built[1] / "ragsuite-colbert.json").read_text())
    assert (manifest["doc_maxlen"], manifest["kmeans_niters"], manifest["index_bsize"]) == (150, 3, 32)
    assert manifest["nbits"] == 2
