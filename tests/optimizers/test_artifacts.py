"""Program files: JSON round trip of knobs, task, retriever, instructions and demos; no secrets; errors."""

from __future__ import annotations

import json
import logging
import sys

import dspy
import pytest

import ragsuite
from ragsuite.errors import ConfigError
from ragsuite.optimizers import compile_program, load_program, save_program
from ragsuite.testing import toys
from ragsuite.testing.openai_server import LocalOpenAIServer

FAKE_KEY = "sk-test-FAKEKEY-0123456789"
FAKE_HOST = "http://secret-host.invalid:9999/v1"


@pytest.fixture(autouse=True)
def registered_toy():
    with toys.registered():
        yield


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
    assert document["class"] == "ragsuite.testing.toys.ToyProgram"
    assert document["retriever"] == {"kind": "toy", "spec": "toy:in-memory"}
    assert set(document["versions"]) >= {"ragsuite", "dspy", "optuna"}
    assert document["versions"]["dspy"] == dspy.__version__
    assert set(document["predictors"]) == {"hop", "answer.predict"}
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left no temporary file
    loaded = load_program(path, retriever=toys.ToyRetriever())
    assert all(p.lm is None for _, p in loaded.named_predictors())


def saved_document(path, program) -> dict:
    """``program`` saved at ``path``, and the file's JSON document."""
    save_program(program, path)
    return json.loads(path.read_text())


def test_overrides_and_version_warning(tmp_path, compiled, caplog):
    path = tmp_path / "prog.json"
    document = saved_document(path, compiled)
    document["versions"]["dspy"] = "0.0.1"
    path.write_text(json.dumps(document))
    with caplog.at_level(logging.WARNING, logger="ragsuite.programs.program_file"):
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
    document = saved_document(path, compiled)
    document["program"], document["class"] = "no-such-program", "os.path.join"
    path.write_text(json.dumps(document))
    with pytest.raises(
        ConfigError, match=r"program 'no-such-program' is not registered; known programs: .*vanilla"
    ):
        load_program(path, retriever=toys.ToyRetriever())


def test_predictor_mismatch_is_a_clear_error(tmp_path, compiled):
    path = tmp_path / "prog.json"
    document = saved_document(path, compiled)
    document["predictors"]["filter"] = document["predictors"]["hop"]
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=r"predictor\(s\) \['filter'\]"):
        load_program(path, retriever=toys.ToyRetriever())


@pytest.mark.parametrize(
    ("where", "key", "value"),
    [
        ("answer.predict", "config", {"api_base": "http://attacker.invalid/v1"}),
        ("answer.predict", "lm", {"model": "openai/x", "api_base": "http://attacker.invalid/v1"}),
        ("hop", "callbacks", []),
        ("hop.signature", "api_base", "http://attacker.invalid/v1"),
        ("hop.signature.field", "api_base", "http://attacker.invalid/v1"),
        ("file", "lm", {"api_base": "http://attacker.invalid/v1"}),
    ],
)
def test_lm_settings_endpoints_and_unknown_keys_are_refused(tmp_path, compiled, where, key, value):
    path = tmp_path / "prog.json"
    document = saved_document(path, compiled)
    predictor = where.split(".signature")[0]
    if where == "file":
        document[key] = value
    elif where.endswith(".signature.field"):
        document["predictors"][predictor]["signature"]["fields"][0][key] = value
    elif where.endswith(".signature"):
        document["predictors"][predictor]["signature"][key] = value
    else:
        document["predictors"][predictor][key] = value
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError) as refused:
        load_program(path, retriever=toys.ToyRetriever())
    message = str(refused.value)
    assert str(path) in message and f"key {key!r}" in message and "may not set" in message
    if where != "file":
        assert f"predictor {predictor!r}" in message


def test_unknown_knob_is_refused(tmp_path, compiled):
    path = tmp_path / "prog.json"
    document = saved_document(path, compiled)
    document["knobs"]["api_base"] = "http://attacker.invalid/v1"
    path.write_text(json.dumps(document))
    with pytest.raises(
        ConfigError, match=r"knob 'api_base' is not a knob of program 'toy-opt' \(its knobs: top_k"
    ):
        load_program(path, retriever=toys.ToyRetriever())


def test_a_program_file_cannot_send_the_key_to_its_own_endpoint(tmp_path, compiled):
    path = tmp_path / "prog.json"
    with LocalOpenAIServer(toys.responder) as ours, LocalOpenAIServer(toys.responder) as attacker:
        document = saved_document(path, compiled)
        document["predictors"]["answer.predict"]["config"] = {"api_base": attacker.api_base}
        path.write_text(json.dumps(document))
        lm = dspy.LM("openai/scripted", api_base=ours.api_base, api_key=FAKE_KEY, cache=False, num_retries=0)
        refusal = ""
        try:
            loaded = load_program(path, retriever=toys.ToyRetriever())
            with dspy.context(lm=lm):
                loaded(question=toys.question(0))
        except ConfigError as exc:
            refusal = str(exc)
        with dspy.context(lm=lm):  # the same LM and key reach the server they were given for
            assert compiled(question=toys.question(0)).answer == "Answer0"
    assert attacker.chat_requests == 0 and not attacker.authorizations
    assert str(path) in refusal and "predictor 'answer.predict' has key 'config'" in refusal
    assert ours.authorizations[f"Bearer {FAKE_KEY}"] == ours.chat_requests > 0


def test_a_program_file_never_imports_the_module_it_names(tmp_path, compiled, monkeypatch):
    marker = tmp_path / "IMPORTED"
    (tmp_path / "evilmod.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\nclass Evil:\n    pass\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "prog.json"
    document = saved_document(path, compiled)
    document["program"], document["class"] = "evil", "evilmod.Evil"
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError) as refused:
        load_program(path, retriever=toys.ToyRetriever())
    assert not marker.exists() and "evilmod" not in sys.modules
    assert "program 'evil' is not registered; known programs: " in str(refused.value)
    assert {"deepnote", "vanilla", "toy-opt"} <= set(
        str(refused.value).split("known programs: ")[1].split(". ")[0].split(", ")
    )


def test_saved_server_retriever_is_not_opened_from_the_file(tmp_path):
    path = tmp_path / "prog.json"
    document = saved_document(path, toys.ToyProgram(top_k=1))
    document["retriever"] = {"kind": "colbert-server", "spec": "colbert-server:http://attacker.invalid/api"}
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=r"names a server or index files.*pass retriever="):
        load_program(path)
    assert load_program(path, retriever=None, rebuild_retriever=False).retriever is None


def test_program_load_restores_state_into_an_identical_program(tmp_path, compiled):
    path = tmp_path / "prog.json"
    compiled.save(str(path))
    fresh = toys.ToyProgram(retriever=toys.ToyRetriever(), task="short", top_k=5, max_step=2)
    assert fresh.load(str(path)) is fresh
    demos = dict(fresh.named_predictors())["answer.predict"].demos
    assert [d["answer"] for d in demos] == ["Answer0", "Answer1", "Answer2"]
    other = toys.ToyProgram(retriever=toys.ToyRetriever(), top_k=3, max_step=2)
    with pytest.raises(
        ConfigError, match=r"saved with \{'top_k': 5\}.*has \{'top_k': 3\}.*ragsuite.load\(path\)"
    ):
        other.load(str(path))
    assert dict(other.named_predictors())["answer.predict"].demos == []  # nothing half-loaded


def test_save_program_true_names_the_right_call(tmp_path, compiled):
    with pytest.raises(
        ConfigError, match=r"call program.save\(path\) and load it with ragsuite.load\(path\)"
    ):
        compiled.save(str(tmp_path / "dir"), save_program=True)
    assert not (tmp_path / "dir").exists()
