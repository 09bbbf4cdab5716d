"""Adaptive-RAG's trainable query-complexity classifier: the paper's labelling rule, training, files that hold
numbers only, routing without an LM call, and ``ragsuite classifier train`` from eval runs."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from ragsuite.cli import main
from ragsuite.errors import ConfigError
from ragsuite.programs.complexity import (
    ComplexityClassifier,
    TransformerComplexityClassifier,
    complexity_label,
    load_classifier,
)
from ragsuite.programs.ircot import AdaptiveRAG

# Three question shapes whose class follows from their words, as the classifier must learn.
SIMPLE = ["what is the capital of {}", "what colour is the flag of {}", "what language is spoken in {}"]
SINGLE = ["who directed the film {} released", "when was the album {} recorded", "where is {} stadium"]
MULTI = [
    "which was founded first, {} university or the college its rival founded",
    "are the directors of {} and its sequel from the same country",
    "who is older, the author of {} or the author of its prequel",
]
NAMES = ["avalon", "brixton", "corvale", "dunmore", "elsinore", "falkirk", "galway", "harlow", "islay"]


def toy(names):
    questions, labels = [], []
    for label, shapes in (("A", SIMPLE), ("B", SINGLE), ("C", MULTI)):
        for shape in shapes:
            for name in names:
                questions.append(shape.format(name))
                labels.append(label)
    return questions, labels


@pytest.mark.parametrize(
    ("outcome", "multi_hop", "label"),
    [
        ((True, True, True), True, "A"),  # the simplest correct strategy wins
        ((True, False, False), True, "A"),
        ((False, True, True), True, "B"),
        ((False, True, False), False, "B"),
        ((False, False, True), False, "C"),
        ((False, False, False), True, "C"),  # unanswered: the multi-hop dataset's bias
        ((False, False, False), False, "B"),  # unanswered: the single-hop dataset's bias
    ],
)
def test_labels_follow_adaptive_rag(outcome, multi_hop, label) -> None:
    none, single, multi = outcome
    assert (
        complexity_label(no_retrieval=none, single_step=single, multi_step=multi, multi_hop=multi_hop)
        == label
    )


def test_classifier_learns_question_shapes_and_generalises_to_new_entities() -> None:
    questions, labels = toy(NAMES[:6])
    classifier = ComplexityClassifier(dims=4096).fit(questions, labels)
    assert classifier.training["train_accuracy"] == 1.0
    unseen, unseen_labels = toy(NAMES[6:])
    assert classifier.accuracy(unseen, unseen_labels) == 1.0
    probabilities = classifier.predict_proba(MULTI[0].format("zenith"))
    assert set(probabilities) == {"A", "B", "C"} and abs(sum(probabilities.values()) - 1) < 1e-9
    assert probabilities["C"] > 0.5
    assert ComplexityClassifier(dims=64).predict("anything") == "A"  # untrained: uniform, ties go simplest


def test_training_rejects_bad_labels() -> None:
    with pytest.raises(ConfigError, match="unknown complexity labels"):
        ComplexityClassifier(dims=64).fit(["q"], ["D"])
    with pytest.raises(ConfigError, match="as many labels"):
        ComplexityClassifier(dims=64).fit(["q", "r"], ["A"])


def test_saved_classifier_reloads_identically_and_corrupt_files_are_refused(tmp_path) -> None:
    questions, labels = toy(NAMES)
    classifier = ComplexityClassifier(dims=2048).fit(questions, labels, epochs=50)
    classifier.save(tmp_path / "clf")
    loaded = load_classifier(tmp_path / "clf")
    assert loaded.predict_proba(questions[0]) == classifier.predict_proba(questions[0])
    assert loaded.training["examples"] == len(questions)

    with pytest.raises(ConfigError, match="ragsuite classifier train"):
        load_classifier(tmp_path / "missing")
    weights = tmp_path / "clf" / "weights.npy"
    data = weights.read_bytes()
    weights.write_bytes(data[:-8] + bytes(b ^ 0xFF for b in data[-8:]))  # bit rot in the last values
    with pytest.raises(ConfigError, match="checksum"):
        load_classifier(tmp_path / "clf")
    # A pickled object array with a matching checksum is still refused: the file holds numbers only.
    np.save(weights, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    config = json.loads((tmp_path / "clf" / "classifier.json").read_text())
    from ragsuite.data.datasets import file_sha256

    config["files"]["weights.npy"] = file_sha256(weights)
    (tmp_path / "clf" / "classifier.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="not a readable weight matrix"):
        load_classifier(tmp_path / "clf")


def rewrite_checksums(directory) -> None:
    """Make classifier.json vouch for the files as they now are: a crafted directory, not bit rot."""
    from ragsuite.data.datasets import file_sha256

    config = json.loads((directory / "classifier.json").read_text())
    config["files"] = {name: file_sha256(directory / name) for name in config["files"]}
    (directory / "classifier.json").write_text(json.dumps(config))


def test_crafted_weight_files_give_one_clean_error(tmp_path) -> None:
    directory = ComplexityClassifier(dims=64).save(tmp_path / "clf")
    weights = directory / "weights.npy"
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 3), }"
    header += b" " * (117 - len(header)) + b"\n"
    crafted = {
        "zip archive named .npy": None,  # np.load returns an NpzFile for zip data, whatever the name
        "header claiming 2**62 rows": b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header,
        "header that is not a dict": b"\x93NUMPY\x01\x00\x06\x00[1,2]\n",
        "truncated magic": b"\x93NUM",
    }
    for name, data in crafted.items():
        if data is None:
            with weights.open("wb") as handle:
                np.savez(handle, a=np.zeros((64, 3), dtype=np.float32))
        else:
            weights.write_bytes(data)
        rewrite_checksums(directory)
        with pytest.raises(ConfigError, match="weight matrix") as caught:
            load_classifier(directory)
        assert "\n" not in str(caught.value), name
    np.save(weights, np.zeros((64, 3), dtype=np.float32))
    config = json.loads((directory / "classifier.json").read_text())
    config["dims"] = True  # a bool is an int to Python
    (directory / "classifier.json").write_text(json.dumps(config))
    rewrite_checksums(directory)
    with pytest.raises(ConfigError, match="finite float32 weights"):
        load_classifier(directory)


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("model.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}" + b"x" * 100),
        ("tokenizer.json", b'{"version": "1.0", "model": 5}'),
    ],
)
def test_a_corrupt_checkpoint_classifier_gives_one_clean_error(tmp_path, name, data, tiny_encoder) -> None:

    questions, _ = toy(NAMES)
    (tmp_path / "encoder").mkdir()
    encoder = tiny_encoder(questions, tmp_path / "encoder", vocab_size=200)
    directory = TransformerComplexityClassifier(encoder, local_only=True).save(tmp_path / "clf")
    (directory / "model" / name).write_bytes(data)
    rewrite_checksums(directory)
    with pytest.raises(ConfigError, match=r"cannot load .* as a sequence classifier"):
        load_classifier(directory)


def test_a_classifier_retrained_in_place_is_another_configuration(tmp_path, fresh) -> None:
    """Resuming an eval after retraining the classifier in place would mix two classifiers in one score."""
    from ragsuite.evaluation import RunStore
    from ragsuite.evaluation.manifest import default_manifest

    questions, labels = toy(NAMES)
    directory = ComplexityClassifier(dims=1024).fit(questions, labels, epochs=20).save(tmp_path / "clf")
    first = AdaptiveRAG(retriever=fresh(), classifier=str(directory))
    digest = first.artifacts()["classifier"]
    assert digest == load_classifier(directory).sha256 and len(digest) == 64
    store = RunStore(tmp_path / "run")
    store.check_manifest(default_manifest(first, "hotpotqa", ["q1"]))
    store.check_manifest(
        default_manifest(AdaptiveRAG(retriever=fresh(), classifier=str(directory)), "hotpotqa", ["q1"])
    )
    ComplexityClassifier(dims=1024).fit(questions, labels, epochs=40).save(
        directory
    )  # same path, new weights
    again = AdaptiveRAG(retriever=fresh(), classifier=str(directory))
    assert again.knobs() == first.knobs() and again.artifacts() != first.artifacts()
    with pytest.raises(ConfigError, match=r"artifacts\.classifier"):
        store.check_manifest(default_manifest(again, "hotpotqa", ["q1"]))
    # Without a trained classifier nothing is added: older runs' manifests still match.
    assert "artifacts" not in default_manifest(AdaptiveRAG(retriever=fresh()), "hotpotqa", ["q1"])


def test_eval_refuses_to_resume_after_the_classifier_was_retrained_in_place(
    tmp_path, capsys, universal_responder, eval_args
) -> None:
    from ragsuite.testing.openai_server import LocalOpenAIServer

    questions, labels = toy(NAMES)
    directory = ComplexityClassifier(dims=1024).fit(questions, labels, epochs=20).save(tmp_path / "clf")
    argv = ["--limit", "1", "--set", f"classifier={json.dumps(str(directory))}"]
    with LocalOpenAIServer(universal_responder({})) as server:
        out = tmp_path / "run"
        assert main(eval_args(server, out, *argv, program="adaptive-rag")) == 0
        saved = json.loads((out / "manifest.json").read_text())["artifacts"]["classifier"]
        assert saved == load_classifier(directory).sha256
        ComplexityClassifier(dims=1024).fit(questions, labels, epochs=40).save(directory)
        capsys.readouterr()
        assert main(eval_args(server, out, *argv, program="adaptive-rag")) == 2
    err = capsys.readouterr().err
    assert f'artifacts.classifier: "{saved}" -> "{load_classifier(directory).sha256}"' in err


def test_cli_train_refuses_a_list_manifest_and_a_file_as_out(tmp_path, capsys) -> None:
    runs = [write_run(tmp_path / name, "hotpotqa", {"q1": ("who", True)}) for name in ("a", "b", "c")]
    argv = ["classifier", "train", "--no-retrieval", str(runs[0]), "--single-step", str(runs[1])]
    argv += ["--multi-step", str(runs[2])]
    (tmp_path / "file").write_text("not a directory")
    assert main([*argv, "--out", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err
    assert "is a file" in err and "Traceback" not in err
    assert (tmp_path / "file").read_text() == "not a directory"
    (runs[1] / "manifest.json").write_text(json.dumps([{"dataset": "hotpotqa"}]))
    assert main([*argv, "--out", str(tmp_path / "clf")]) == 2
    assert "not an eval run's manifest" in capsys.readouterr().err


@pytest.fixture
def trained(tmp_path):
    questions, labels = toy(NAMES)
    return ComplexityClassifier(dims=4096).fit(questions, labels).save(tmp_path / "clf")


@pytest.mark.parametrize(
    ("question", "route", "lm_calls", "retrievals"),
    [
        (SIMPLE[0].format("zenith"), "A", 1, 0),  # only the answer: the classifier costs no LM call
        (SINGLE[0].format("zenith"), "B", 1, 1),
        (MULTI[1].format("zenith"), "C", 2 + 1, 2),  # IRCoT: two sentences, then the reader
    ],
)
def test_trained_classifier_routes_without_an_lm_call(
    trained, question, route, lm_calls, retrievals, scripted, run, stage_requests, fresh
) -> None:
    lm = scripted(complexity=["A"], thought=["Spielberg directed Jaws.", "So the answer is Cincinnati."])
    prediction = run(AdaptiveRAG(retriever=fresh(), classifier=str(trained)), lm, question=question)
    assert prediction.route == route
    assert prediction.stats["lm_calls"] == lm_calls and prediction.stats["retrievals"] == retrievals
    assert stage_requests(lm, "complexity") == []
    event = next(e for e in prediction.trace if e["stage"] == "route")
    assert (
        event["classifier"] == "trained"
        and max(event["probabilities"], key=event["probabilities"].get) == route
    )


def test_program_with_a_classifier_copies_cheaply_and_names_a_bad_path(trained, tmp_path, fresh) -> None:
    program = AdaptiveRAG(retriever=fresh(), classifier=str(trained))
    assert program.knobs()["classifier"] == str(trained)
    assert copy.deepcopy(program)._trained is program._trained
    with pytest.raises(ConfigError, match="no complexity classifier"):
        AdaptiveRAG(retriever=fresh(), classifier=str(tmp_path / "nowhere"))


def write_run(directory, dataset, outcomes):
    """An eval run directory as ``ragsuite eval`` leaves it: a manifest and one record per question."""
    directory.mkdir()
    (directory / "manifest.json").write_text(json.dumps({"dataset": dataset, "program": "x"}))
    lines = []
    for question_id, (question, correct) in outcomes.items():
        record = {"id": question_id, "question": question}
        if correct is None:
            record["error"] = "TimeoutError: the LM did not answer"
        else:
            record.update(
                metrics={"accuracy": float(correct), "f1": 0.5},
                tokens={"input": 10, "output": 2, "requests": 1, "cache_hits": 0},
                stats={},
            )
        lines.append(json.dumps(record))
    (directory / "records.jsonl").write_text("\n".join(lines) + "\n")
    return directory


def test_cli_trains_from_three_runs(tmp_path, capsys) -> None:
    questions, labels = toy(NAMES)
    # Plant outcomes that imply each question's toy label: A answered without retrieval, B by one retrieval,
    # C only by IRCoT. Every third C question is answered by no strategy (the multi-hop bias labels it C),
    # and some B questions' single-step runs failed: a failure does not answer, so IRCoT's success labels C.
    none, single, multi, expected = {}, {}, {}, []
    for i, (question, label) in enumerate(zip(questions, labels, strict=True)):
        failed = label == "B" and i % 5 == 0
        none[f"q{i}"] = (question, label == "A")
        single[f"q{i}"] = (question, None if failed else label in "AB")
        multi[f"q{i}"] = (question, not (label == "C" and i % 3 == 0))
        expected.append("C" if failed else label)
    names = (("none", none), ("one", single), ("ircot", multi))
    runs = [write_run(tmp_path / name, "hotpotqa", outcomes) for name, outcomes in names]
    with (runs[2] / "records.jsonl").open("a") as handle:
        handle.write('{"id": "torn"')  # a kill mid-write: named on stderr, and --json stays parseable
    out = tmp_path / "clf"
    argv = ["classifier", "train", "--no-retrieval", str(runs[0]), "--single-step", str(runs[1])]
    argv += ["--multi-step", str(runs[2]), "--out", str(out), "--json", "--holdout", "0.25"]
    assert main(argv) == 0
    printed = capsys.readouterr()
    report = json.loads(printed.out)
    assert "truncated last line" in printed.err and "skipped" in printed.err
    assert 0 < expected.count("C") - labels.count("C")
    assert report["labels"] == {label: expected.count(label) for label in "ABC"}
    assert report["metric"] == "accuracy" and report["hops"] == "multi"
    unanswered = sum(1 for i, y in enumerate(labels) if y == "C" and i % 3 == 0)
    assert report["labelled_by_dataset_bias"] == unanswered
    assert report["holdout"] == len(questions) // 4 and report["holdout_accuracy"] >= 0.8
    assert load_classifier(out).predict(MULTI[2].format("zenith")) == "C"


def test_cli_refuses_runs_on_different_datasets(tmp_path, capsys) -> None:
    a = write_run(tmp_path / "a", "hotpotqa", {"q1": ("who", True)})
    b = write_run(tmp_path / "b", "nq", {"q1": ("who", True)})
    argv = ["classifier", "train", "--no-retrieval", str(a), "--single-step", str(b), "--multi-step", str(a)]
    assert main([*argv, "--out", str(tmp_path / "clf")]) == 2
    assert "different datasets" in capsys.readouterr().err
    assert not (tmp_path / "clf").exists()


def test_a_config_naming_files_outside_its_directory_is_refused(tmp_path) -> None:
    directory = ComplexityClassifier(dims=64).save(tmp_path / "clf")
    (tmp_path / "secret").write_text("x")
    config = json.loads((directory / "classifier.json").read_text())
    from ragsuite.data.datasets import file_sha256

    config["files"]["../secret"] = file_sha256(tmp_path / "secret")
    (directory / "classifier.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="outside its directory"):
        load_classifier(directory)


def test_a_fine_tuned_checkpoint_classifies_reloads_and_routes(
    tmp_path, capsys, tiny_encoder, scripted, run, stage_requests, fresh
) -> None:
    """The paper's kind of classifier: a (tiny, random) pretrained encoder fine-tuned on the labels."""

    questions, labels = toy(NAMES)
    (tmp_path / "encoder").mkdir()
    encoder = tiny_encoder(questions, tmp_path / "encoder", vocab_size=200)
    before = TransformerComplexityClassifier(encoder, local_only=True).accuracy(questions, labels)
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)  # dropout's draws
    classifier = TransformerComplexityClassifier(encoder, local_only=True).fit(
        questions, labels, epochs=30, learning_rate=1e-3, batch_size=16
    )
    # A 1-layer, 32-wide random encoder is no T5: ask that fine-tuning learns, not that it is perfect.
    report = classifier.training
    assert report["last_epoch_loss"] < 0.5 * report["first_epoch_loss"]
    assert report["train_accuracy"] > before and report["train_accuracy"] >= 0.6

    saved = classifier.save(tmp_path / "clf")
    loaded = load_classifier(saved)
    assert isinstance(loaded, TransformerComplexityClassifier)
    question = MULTI[0].format("zenith")
    assert loaded.predict_proba(question) == pytest.approx(classifier.predict_proba(question), abs=1e-6)
    lm = scripted(complexity=["A"], thought=["Spielberg directed Jaws.", "So the answer is Cincinnati."])
    prediction = run(AdaptiveRAG(retriever=fresh(), classifier=str(saved)), lm, question=question)
    assert prediction.route == loaded.predict(question) and stage_requests(lm, "complexity") == []

    weights = next((saved / "model").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x01")
    with pytest.raises(ConfigError, match="checksum"):
        load_classifier(saved)
