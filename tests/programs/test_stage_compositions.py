"""Programs composed with stages (filter=, blend=) save and reload as compositions, and the CLI builds them
with --stage on eval, compile and tune."""

from __future__ import annotations

import json

import pytest

import ragsuite
from ragsuite.cli import main
from ragsuite.data.datasets import load_dataset
from ragsuite.errors import ConfigError
from ragsuite.programs.baselines import VanillaRAG
from ragsuite.programs.deepnote import DeepNote
from ragsuite.programs.stages import BlendStage, FilterStage, parse_stage_flags
from ragsuite.retrieval.base import Passage
from ragsuite.testing.openai_server import LocalOpenAIServer
from ragsuite.testing.responders import grounded_responder
from ragsuite.testing.retrievers import KeywordRetriever

CORPUS = [Passage("p1", "Rush", "Rush is a Canadian rock band."), Passage("p2", "Jaws", "Jaws is a film.")]


def test_a_composition_saves_and_reloads_without_passing_the_stages_again(tmp_path) -> None:
    program = VanillaRAG(
        retriever=KeywordRetriever(CORPUS),
        top_k=2,
        filter=FilterStage(mode="batch", keep=3),
        blend=BlendStage(which="external", max_query_chars=300),
    )
    program.filter.batch.predict.signature = program.filter.batch.predict.signature.with_instructions(
        "Keep only passages about bands."
    )
    path = tmp_path / "composed.json"
    program.save(str(path))
    assert json.loads(path.read_text())["stages"] == {
        "filter": {
            "mode": "batch",
            "keep": 3,
            "max_workers": None,
            "decisions": "generate",
            "threshold": 0.5,
        },
        "blend": {"which": "external", "max_query_chars": 300},
    }
    loaded = ragsuite.load(str(path), retriever=KeywordRetriever(CORPUS))
    assert (
        isinstance(loaded.filter, FilterStage) and loaded.filter.mode == "batch" and loaded.filter.keep == 3
    )
    assert isinstance(loaded.blend, BlendStage) and loaded.blend.variants == ["external"]
    assert loaded.filter.batch.predict.signature.instructions == "Keep only passages about bands."
    # A plain program saves no stages.
    VanillaRAG(retriever=KeywordRetriever(CORPUS)).save(str(tmp_path / "plain.json"))
    assert json.loads((tmp_path / "plain.json").read_text())["stages"] == {}


def test_a_file_cannot_give_a_program_a_stage_it_does_not_take(tmp_path) -> None:
    path = tmp_path / "p.json"
    DeepNote(retriever=KeywordRetriever(CORPUS)).save(str(path))
    document = json.loads(path.read_text())
    document["program"] = "hanrag"
    document["knobs"] = {}
    document["predictors"] = {}
    document["stages"] = {"blend": {"which": "both"}}
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match="takes no stage 'blend'"):
        ragsuite.load(str(path), retriever=KeywordRetriever(CORPUS))


def test_stage_flags() -> None:
    stages = parse_stage_flags(["filter=batch", "blend=both"])
    assert stages["filter"].mode == "batch" and stages["blend"].variants == ["external", "internal"]
    with pytest.raises(ConfigError, match="KIND=MODE"):
        parse_stage_flags(["filter"])
    with pytest.raises(ConfigError, match="unknown stage 'rerank'"):
        parse_stage_flags(["rerank=lm"])
    with pytest.raises(ConfigError, match="filter mode"):
        parse_stage_flags(["filter=sometimes"])


def test_cli_eval_compile_and_tune_build_the_composition(tmp_path, capsys) -> None:
    gold = {ex.question: ex.answers[0] for ex in load_dataset("hotpotqa")[:4]}
    with LocalOpenAIServer(grounded_responder(gold)) as server:
        lm = ["--lm", "openai/scripted", "--api-base", server.api_base, "--no-cache"]
        common = ["--program", "vanilla", "--dataset", "hotpotqa", "--stage", "filter=batch"]
        run = tmp_path / "run"
        assert main(["eval", *common, "--limit", "2", "--no-progress", "--out", str(run), *lm]) == 0
        records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
        assert all(any(e["stage"] == "filter" and e["mode"] == "batch" for e in r["trace"]) for r in records)
        compiled = tmp_path / "compiled.json"
        args = [
            "compile",
            *common,
            "--optimizer",
            "bootstrap",
            "--train",
            "2",
            "--val",
            "2",
            "--out",
            str(compiled),
        ]
        assert main([*args, *lm]) == 0
        assert json.loads(compiled.read_text())["stages"]["filter"]["mode"] == "batch"
        tuned = tmp_path / "tune"
        assert main(["tune", *common, "--trials", "2", "--val", "2", "--out", str(tuned), *lm]) == 0
        [best] = tuned.glob("*/best.json")
        assert json.loads(best.read_text())["stages"]["filter"]["mode"] == "batch"
        assert (
            main(
                [
                    "eval",
                    "--program",
                    "hanrag",
                    "--dataset",
                    "hotpotqa",
                    "--stage",
                    "blend=both",
                    "--out",
                    str(tmp_path / "bad"),
                    *lm,
                ]
            )
            == 2
        )
    assert "program 'hanrag' takes no blend stage" in capsys.readouterr().err
