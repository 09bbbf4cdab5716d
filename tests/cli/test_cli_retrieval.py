"""``ragsuite index`` and ``ragsuite retrieve-eval`` on a shipped dataset."""

from __future__ import annotations

import json
import statistics
import sys
import types
from pathlib import Path

import pytest
import ujson

from ragsuite.cli import main
from ragsuite.data.datasets import load_dataset
from ragsuite.data.metrics import all_gold, retrieval_recall
from ragsuite.retrieval.bm25 import BM25Retriever


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out  # exactly one JSON object on stdout
    return json.loads(out)


def test_retrieve_eval_json(capsys: pytest.CaptureFixture[str], tmp_path: Path, data_dir: Path) -> None:
    argv = ["retrieve-eval", "--dataset", "strategyqa", "--k", "5", "10", "--json"]
    result = run_json(capsys, [*argv, "--data-dir", str(data_dir), "--cache-dir", str(tmp_path)])
    assert set(result) == {"recall@5", "all_gold@5", "recall@10", "all_gold@10", "n"}
    examples = [ex for ex in load_dataset("strategyqa", data_dir=data_dir) if ex.gold_passage_ids]
    assert result["n"] == len(examples) == 40
    retriever = BM25Retriever.from_dataset("strategyqa", data_dir=data_dir, cache_dir=tmp_path)
    ranked = [[p.id for p in ps] for ps in retriever.batch([ex.question for ex in examples], 10)]
    for k in (5, 10):
        pairs = list(zip(ranked, examples, strict=True))
        assert result[f"recall@{k}"] == pytest.approx(
            statistics.fmean(retrieval_recall(ids, ex.gold_passage_ids, k) for ids, ex in pairs)
        )
        assert result[f"all_gold@{k}"] == pytest.approx(
            statistics.fmean(all_gold(ids, ex.gold_passage_ids, k) for ids, ex in pairs)
        )
    assert result["recall@5"] >= 0.7  # 0.761 on the fixture (plain bm25s is compared in test_bm25.py)
    assert result["recall@10"] >= result["recall@5"] >= result["all_gold@5"]


def test_retrieve_eval_table_limit_and_questions_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data_dir: Path
) -> None:
    common = ["--dataset", "nq", "--data-dir", str(data_dir), "--cache-dir", str(tmp_path)]
    assert main(["retrieve-eval", *common, "--k", "1", "3", "--limit", "20"]) == 0
    captured = capsys.readouterr()
    assert "nq: 20 questions, retriever bm25:nq" in captured.out
    assert "| 1 |" in captured.out and "| 3 |" in captured.out

    rows = [ujson.loads(line) for line in (data_dir / "nq" / "dev.jsonl").read_text().splitlines()[:6]]
    rows.append({"id": "no-gold", "question": "What is it?", "answers": ["x"], "gold_passage_ids": []})
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(ujson.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert main(["retrieve-eval", *common, "--questions", str(questions), "--k", "5", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["n"] == 6
    assert "skipping 1 of 7 questions" in captured.err


def test_retrieve_eval_without_gold_ids_is_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data_dir: Path
) -> None:
    common = ["--data-dir", str(data_dir), "--cache-dir", str(tmp_path), "--json"]
    assert main(["retrieve-eval", "--dataset", "triviaqa", "--retriever", "bm25:nq", *common]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "gold passage ids" in captured.err
    assert main(["retrieve-eval", "--dataset", "nq", "--k", "0", *common]) == 2


def test_index_builds_then_reuses(capsys: pytest.CaptureFixture[str], tmp_path: Path, data_dir: Path) -> None:
    argv = ["index", "--dataset", "strategyqa", "--data-dir", str(data_dir), "--cache-dir", str(tmp_path)]
    first = run_json(capsys, [*argv, "--json"])
    assert first["built"] is True and first["passages"] == 400
    assert Path(first["index_dir"]).is_dir() and first["index_dir"].endswith(first["index_key"])
    second = run_json(capsys, [*argv, "--json"])
    assert second["built"] is False and second["index_key"] == first["index_key"]
    assert main(argv) == 0
    assert f"index key: {first['index_key']}" in capsys.readouterr().out


def test_index_colbert_calls_build_colbert_index(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    # Only the command's wiring is under test here; the colbert-ai path has its own tests.
    fake = types.ModuleType("ragsuite.retrieval.colbert.index")
    fake.build_colbert_index = lambda corpus, **kw: calls.append((corpus, kw))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ragsuite.retrieval.colbert.index", fake)
    common = ["index", "--dataset", "strategyqa", "--data-dir", str(data_dir), "--retriever", "colbert"]
    assert main(common) == 2
    assert "--checkpoint" in capsys.readouterr().err
    index_dir = str(tmp_path / "idx")
    result = run_json(capsys, [*common, "--checkpoint", "/ckpt", "--index-dir", index_dir, "--json"])
    assert result["index_dir"] == index_dir and result["passages"] == 400
    [(corpus, kwargs)] = calls
    assert len(corpus) == 400
    assert kwargs == {
        "checkpoint": "/ckpt",
        "index_dir": index_dir,
        "overwrite": False,
        # PLAID's settings: ColBERTv2's defaults unless given as flags.
        "nbits": 2,
        "doc_maxlen": None,
        "kmeans_niters": 4,
        "index_bsize": 64,
    }


def test_retrieve_eval_sweeps_fusion_weights_and_the_frozen_spec_reproduces_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data_dir: Path
) -> None:
    """A hybrid of the NQ index and an unrelated one, weighted towards the unrelated one: the sweep moves the
    weight to the NQ member, and retrieve-eval with the spec it prints scores exactly what the sweep said."""
    common = ["--dataset", "nq", "--data-dir", str(data_dir), "--cache-dir", str(tmp_path), "--json"]
    given = "hybrid:rrf:bm25:nq@0.1+bm25:hotpotqa@0.9:rrf_k=10"
    swept = run_json(
        capsys, ["retrieve-eval", *common, "--retriever", given, "--sweep", "12", "--k", "5", "10"]
    )
    assert swept["metric"] == "recall@5" and swept["trials"] == 12
    assert swept["given"]["spec"] == "hybrid:rrf:bm25:nq@0.1+bm25:hotpotqa@0.9:rrf_k=10"
    assert swept["recall@5"] > swept["given"]["recall@5"]
    from ragsuite.retrieval.hybrid import parse_hybrid_spec

    _, members, weights, _ = parse_hybrid_spec(swept["spec"])
    assert members == ["bm25:nq", "bm25:hotpotqa"] and weights is not None and weights[0] > weights[1]
    frozen = run_json(capsys, ["retrieve-eval", *common, "--retriever", swept["spec"], "--k", "5", "10"])
    for key in ("recall@5", "recall@10", "all_gold@5", "all_gold@10", "n"):
        assert frozen[key] == pytest.approx(swept[key]), key
    # Only hybrids have fusion settings to sweep.
    assert main(["retrieve-eval", *common, "--sweep", "3"]) == 2
    assert "hybrid retriever" in capsys.readouterr().err
