"""Program files: JSON round trip of knobs, task, retriever, instructions and demos; no secrets; errors."""

from __future__ import annotations

import json
import logging

import dspy
import optimizer_toys as toys
import pytest

import ragsuite
from ragsuite.errors import ConfigError
from ragsuite.optimizers import compile_program, load_program, save_program

FAKE_KEY = "sk-test-FAKEKEY-0123456789"
FAKE_HOST = "http://secret-host.invalid:9999/v1"


@pytest.fixture
def compiled():
    lm = toys.scripted_lm()
    program = toys.ToyProgram(retriever=toys.ToyRetriever(), task="short", top_k=5, max_step=2)
    with dspy.context(lm=lm):
        return compile_program(
            program, toys.examples()[:3], optimizer="bootstrap", metric=toys.exact, max_labeled_demos=0
        )


def test_round_trip_restores_knobs_demos_and_predictions(tmp_path, compiled):
    predictors = dict(compiled.named_predictors())
    predictors["hop"].signature = predictors["hop"].signature.with_instructions("Write a precise note.")
    path = tmp_path / "prog.json"
    compiled.save(str(path), metadata={"metrics": {"accuracy": 1.0}})
    loaded = ragsuite.load(str(path), retriever=toys.ToyRetriever())

    assert type(loaded) is toys.ToyProgram
    assert loaded.knobs() == {"top_k": 5, "max_step": 2} != toys.ToyProgram.default_knobs()
    assert loaded.task == "short"
    restored = dict(loaded.named_predictors())
    assert restored["hop"].signature.instructions == "Write a precise note."
    assert [d["answer"] for d in restored["answer.predict"].demos] == ["Answer0", "Answer1", "Answer2"]
    assert loaded.optimization["optimizer"] == "bootstrap"
    assert loaded.optimization["metrics"] == {"accuracy": 1.0}

    # Same predictions, and the prompts the loaded program sends are the compiled program's prompts.
    lm_a, lm_b = toys.scripted_lm(), toys.scripted_lm()
    questions = [toys.question(i) for i in range(3, 8)]
    with dspy.context(lm=lm_a):
        before = [compiled(question=q).answer for q in questions]
    with dspy.context(lm=lm_b):
        after = [loaded(question=q).answer for q in questions]
    assert before == after == [f"Answer{i}" for i in range(3, 8)]
    assert [r.messages for r in lm_a.requests] == [r.messages for r in lm_b.requests]
    assert any("Answer0" in str(r.messages) for r in lm_b.requests)  # the demos are in the prompt


def test_file_is_json_with_versions_and_no_secrets(tmp_path, compiled):
    secret_lm = dspy.LM("openai/some-model", api_key=FAKE_KEY, api_base=FAKE_HOST)
    for _, predictor in compiled.named_predictors():
        predictor.lm = secret_lm
    path = tmp_path / "prog.json"
    save_program(compiled, path)
    text = path.read_text()
    assert FAKE_KEY not in text and "secret-host" not in text
    document = json.loads(text)
    assert document["format"] == "ragsuite.program"
    assert document["program"] == "toy-opt"
    assert document["class"] == "optimizer_toys.ToyProgram"
    assert document["retriever"] == {"kind": "toy", "spec": "toy:in-memory"}
    assert set(document["versions"]) >= {"ragsuite", "dspy", "optuna"}
    assert document["versions"]["dspy"] == dspy.__version__
    assert set(document["predictors"]) == {"hop", "answer.predict"}
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left no temporary file
    loaded = load_program(path, retriever=toys.ToyRetriever())
    assert all(p.lm is None for _, p in loaded.named_predictors())


def test_overrides_and_version_warning(tmp_path, compiled, caplog):
    path = tmp_path / "prog.json"
    save_program(compiled, path)
    document = json.loads(path.read_text())
    document["versions"]["dspy"] = "0.0.1"
    path.write_text(json.dumps(document))
    with caplog.at_level(logging.WARNING, logger="ragsuite.optimizers.artifacts"):
        loaded = load_program(path, retriever=toys.ToyRetriever(), top_k=7)
    assert loaded.knobs() == {"top_k": 7, "max_step": 2}
    assert "saved with dspy 0.0.1" in caplog.text


def test_unbuildable_retriever_needs_an_explicit_one(tmp_path, compiled):
    path = tmp_path / "prog.json"
    save_program(compiled, path)
    with pytest.raises(ConfigError, match="pass retriever="):
        load_program(path)


def test_program_without_retriever_round_trips(tmp_path):
    program = toys.ToyProgram(top_k=1)
    save_program(program, tmp_path / "p.json")
    loaded = load_program(tmp_path / "p.json")
    assert loaded.retriever is None and loaded.knobs()["top_k"] == 1


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"foo": 1}', "not a ragsuite program file"),
        ('["a"]', "not a ragsuite program file"),
        ('{"format": "ragsuite.program", "format_version": 99}', "format version 99"),
        ('{"format": "ragsuite.program", "format_version": 1, "program": "x"}', "corrupt"),
    ],
)
def test_corrupt_or_foreign_files_are_clear_errors(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_program(path)


def test_missing_file_and_unknown_class(tmp_path, compiled):
    with pytest.raises(ConfigError, match="does not exist"):
        load_program(tmp_path / "nope.json")
    path = tmp_path / "prog.json"
    save_program(compiled, path)
    document = json.loads(path.read_text())
    document["program"], document["class"] = "no-such-program", "os.path.join"
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match="not a ragsuite program class"):
        load_program(path, retriever=toys.ToyRetriever())


def test_predictor_mismatch_is_a_clear_error(tmp_path, compiled):
    path = tmp_path / "prog.json"
    save_program(compiled, path)
    document = json.loads(path.read_text())
    document["predictors"]["filter"] = document["predictors"]["hop"]
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=r"predictor\(s\) \['filter'\]"):
        load_program(path, retriever=toys.ToyRetriever())
