"""DenseRetriever with a tiny random BERT encoder built here (no downloaded weights): exact-text search,
the on-disk embedding cache, batch, spec, and its use in a hybrid."""

from __future__ import annotations

import pytest

from ragsuite.errors import ConfigError
from ragsuite.retrieval.base import Passage

CORPUS = [
    Passage(str(i), f"Title {i}", text)
    for i, text in enumerate(
        [
            "The Oder river flows through Szczecin into the Baltic Sea.",
            "Hamlet is a tragedy by William Shakespeare set in Denmark.",
            "Photosynthesis converts light energy into chemical energy in plants.",
            "The Eiffel Tower was completed in Paris in 1889 for the World's Fair.",
            "Mount Kilimanjaro is the highest mountain in Africa.",
            "Jazz originated in New Orleans in the late nineteenth century.",
            "The Great Barrier Reef lies off the coast of Queensland, Australia.",
            "Penicillin was discovered by Alexander Fleming in 1928.",
        ]
    )
]


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory, tiny_encoder):
    return tiny_encoder([p.render() for p in CORPUS], tmp_path_factory.mktemp("encoder"), vocab_size=500)


def test_exact_text_search_cache_and_batch(encoder_dir, tmp_path, caplog):
    from ragsuite.retrieval.dense import DenseRetriever

    retriever = DenseRetriever(CORPUS, model=encoder_dir, cache_dir=tmp_path, dataset="toy")
    hits = [retriever(p.render(), 3)[0].id for p in CORPUS]
    assert sum(h == p.id for h, p in zip(hits, CORPUS, strict=True)) >= 7
    ranked = retriever(CORPUS[2].render(), 8)
    assert len(ranked) == 8 and len({p.id for p in ranked}) == 8
    assert [p.score for p in ranked] == sorted((p.score for p in ranked), reverse=True)
    assert ranked[0].score == pytest.approx(1.0, abs=1e-4)  # cosine of a text with itself
    assert len(retriever("anything", 50)) == len(CORPUS)
    batched = retriever.batch([CORPUS[0].render(), CORPUS[5].render()], 2)
    assert [[p.id for p in r] for r in batched] == [
        [p.id for p in retriever(CORPUS[0].render(), 2)],
        [p.id for p in retriever(CORPUS[5].render(), 2)],
    ]
    # Embeddings are cached on disk and reused by a second instance.
    cached = list((tmp_path / "dense").glob("*.npy"))
    assert len(cached) == 1
    again = DenseRetriever(CORPUS, model=encoder_dir, cache_dir=tmp_path, dataset="toy")
    assert (again.embeddings == retriever.embeddings).all()
    assert retriever.describe()["spec"] == f"dense:toy:{encoder_dir}"
    with pytest.raises(ConfigError):
        retriever("x", 0)


def test_rejects_bad_settings(encoder_dir, tmp_path):
    from ragsuite.retrieval.dense import DenseRetriever

    with pytest.raises(ConfigError):
        DenseRetriever([], model=encoder_dir, cache_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"config\.json"):
        DenseRetriever(CORPUS, model=tmp_path, cache_dir=tmp_path)


def test_spec_and_hybrid(encoder_dir, tmp_path, data_dir):
    from ragsuite.data.datasets import load_corpus
    from ragsuite.retrieval.hybrid import HybridRetriever
    from ragsuite.retrieval.spec import build_retriever

    with pytest.raises(ConfigError):
        build_retriever("dense")  # no dataset
    dense = build_retriever(
        f"dense:strategyqa:{encoder_dir}", data_dir=data_dir, cache_dir=tmp_path, max_length=64
    )
    hybrid = build_retriever(
        f"hybrid:rrf:bm25+dense:strategyqa:{encoder_dir}",
        dataset="strategyqa",
        data_dir=data_dir,
        cache_dir=tmp_path,
    )
    assert isinstance(hybrid, HybridRetriever)
    assert [m.describe()["kind"] for m in hybrid.retrievers] == ["bm25", "dense"]
    passage = load_corpus("strategyqa", data_dir=data_dir)[10]
    assert hybrid(passage.render(), 5)[0].id == passage.id
    assert dense.describe()["spec"].startswith("dense:strategyqa:")


def test_dense_over_a_corpus_file_and_its_saved_spec(encoder_dir, tmp_path):
    import json

    from ragsuite.retrieval.spec import build_retriever, rebuild_retriever

    corpus = tmp_path / "mine.jsonl"
    corpus.write_text("".join(json.dumps(p.to_dict()) + "\n" for p in CORPUS), encoding="utf-8")
    dense = build_retriever(f"dense:{corpus}:{encoder_dir}", cache_dir=tmp_path)
    described = dense.describe()
    assert described["spec"] == f"dense:{corpus.resolve()}:{encoder_dir}"
    assert described["corpus_path"] == str(corpus.resolve()) and len(described["corpus_sha256"]) == 64
    assert dense(CORPUS[3].render(), 1)[0].id == CORPUS[3].id
    # A bare spec with --corpus indexes the file; the saved description rebuilds the same retriever.
    hybrid = build_retriever(f"hybrid:rrf:bm25+dense::{encoder_dir}", corpus=corpus, cache_dir=tmp_path)
    assert [m.describe()["corpus_path"] for m in hybrid.retrievers] == [str(corpus.resolve())] * 2
    assert rebuild_retriever(described).describe() == described


def test_fusion_benchmark_writes_records_and_the_docs_tables(
    encoder_dir, tmp_path, data_dir, capsys, load_benchmark
):
    """``benchmarks/retrieval.py --hybrid`` on a fixture dataset (the tiny encoder standing in for MiniLM):
    every column's recall and speed, the tuned settings and the fitted defaults in the records, and the docs
    page's fusion block replaced by the tables ``--render`` prints from those records."""
    import json

    bench = load_benchmark("retrieval")
    page = tmp_path / "page.md"
    page.write_text(f"before\n{bench.DOCS_START}\nold table\n{bench.DOCS_END}\nafter\n", encoding="utf-8")
    records = tmp_path / "out" / "fusion.json"
    argv = [
        "--hybrid",
        "--datasets",
        "strategyqa",
        "nq",
        "--data-dir",
        str(data_dir),
        "--dense-model",
        str(encoder_dir),
    ]
    argv += [
        "--dense-cache-dir",
        str(tmp_path / "dense"),
        "--cache-dir",
        str(tmp_path / "bm25"),
        "--trials",
        "4",
        "--repeats",
        "2",
    ]
    assert bench.main([*argv, "--records", str(records), "--docs", str(page)]) == 0
    printed = capsys.readouterr().out
    run = json.loads(records.read_text(encoding="utf-8"))
    record, other = run["datasets"]
    assert record["questions"] == record["fit_questions"] + record["held_out_questions"] == 40
    assert other["dataset"] == "nq"
    columns = record["columns"]
    names = {"bm25", "dense", "interleave", "rrf", "rrf tuned", "linear", "linear tuned"}
    assert set(columns) == names
    for name in names:
        assert 0 <= columns[name]["recall@5"] <= columns[name]["recall@10"] <= 1
        assert columns[name]["ms_per_query"] > 0 and "recall@5" in columns[name]["held_out"]
    assert columns["linear tuned"]["spec"].startswith("hybrid:linear:bm25:strategyqa")
    assert {"fusion_alpha", "fusion_depth", "fusion_norm"} <= set(columns["linear tuned"]["params"])
    assert {run["defaults"][mode]["alpha"] for mode in ("rrf", "linear")} <= set(bench.ALPHAS)
    for mode in ("rrf", "linear"):
        fitted = run["defaults"][mode]
        assert set(fitted["margins"]) == set(fitted["leave_one_out"]) == {"strategyqa", "nq"}
        # Left out, a dataset is scored with the fit made on the other one alone, from the same grid.
        for name in ("strategyqa", "nq"):
            left_out = fitted["leave_one_out"][name]
            assert left_out["alpha"] in bench.ALPHAS and left_out["settings"] in bench.FIT_GRID[mode]
            if (left_out["alpha"], left_out["settings"]) == (fitted["alpha"], fitted["settings"]):
                assert left_out["margin"] == fitted["margins"][name]
    table = bench.fusion_markdown(run)
    assert table in printed and "| strategyqa | 40 |" in table
    assert (
        page.read_text(encoding="utf-8") == f"before\n{bench.DOCS_START}\n{table}\n{bench.DOCS_END}\nafter\n"
    )
    assert bench.main(["--render", str(records)]) == 0
    assert capsys.readouterr().out.strip() == table
