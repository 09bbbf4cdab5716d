"""Tuning studies over their life: configuration checks on resume, per-study files, failed questions,
resumed sampling, the compiled program's score, the optimization metric, damaged journals, concurrent
creation, named objectives and trials orphaned by killed workers."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import dspy
import optuna
import pytest
from optuna.trial import TrialState

from ragsuite.cli.tune import format_front
from ragsuite.errors import ConfigError, RetrievalError
from ragsuite.optimizers import optimization_metric, tune
from ragsuite.optimizers.tuning import objective_values, resolve_storage
from ragsuite.processes import stop_process
from ragsuite.testing import toys
from ragsuite.testing.responders import grounded_responder


def _tune(tmp_path: Path, **kwargs: Any):
    options = toys.tune_options(tmp_path, **kwargs)
    return tune(options.pop("program"), **options)


def _stop(process: subprocess.Popen) -> None:
    stop_process(process, timeout=5)


# ------------------------------------------------------------------------------- configuration and files
def test_resume_with_another_configuration_is_refused_listing_each_difference(tmp_path):
    first = _tune(tmp_path, run_config={"split_seed": 0})
    before = first.files["program"].read_bytes()
    hotter = toys.scripted_lm()
    hotter.kwargs["temperature"] = 0.9
    with pytest.raises(ConfigError) as refused:
        _tune(
            tmp_path,
            trials=4,
            valset=toys.examples(3),
            lm=hotter,
            quality_metric="exact_match",
            run_config={"split_seed": 1},
        )
    message = str(refused.value)
    for difference in (
        "valset.size: 4 -> 3",
        'quality_metric: "f1" -> "exact_match"',
        "split_seed: 0 -> 1",
        "lm.temperature:",
    ):
        assert difference in message
    assert "--study NAME" in message
    # Nothing was added to the study, and its program file is untouched.
    assert len(first.study.trials) == 2
    study = optuna.load_study(study_name=first.study.study_name, storage=resolve_storage(None, tmp_path))
    assert len(study.trials) == 2
    assert first.files["program"].read_bytes() == before
    # The same configuration resumes.
    assert len(_tune(tmp_path, trials=3, run_config={"split_seed": 0}).study.trials) == 3


def test_two_studies_in_one_out_dir_keep_their_own_files(tmp_path):
    a = _tune(tmp_path, study_name="a", trials=2)
    a_best = a.files["program"].read_bytes()
    b = _tune(tmp_path, study_name="b", objectives=("quality", "lm_calls"), trials=3)
    assert a.files["program"] == tmp_path / "a" / "best.json"
    assert b.files["program"] == tmp_path / "b" / "best.json"
    assert set(b.files) >= {"pareto_json", "trials"} and b.files["trials"].parent == tmp_path / "b"
    assert a.files["program"].read_bytes() == a_best
    assert len(json.loads(a.files["trials"].read_text())) == 2
    assert len(json.loads(b.files["trials"].read_text())) == 3


# ------------------------------------------------------------------------------- failed questions
class _FailingRetriever(toys.ToyRetriever):
    """Fails every retrieval for the odd-numbered questions."""

    def __call__(self, query: str, k: int):
        if any(toys.question(i) in query for i in (1, 3)):
            raise RetrievalError("retriever down for this question")
        return super().__call__(query, k)


def test_failed_questions_score_zero_and_count_as_errors(tmp_path):
    # The first trial runs the defaults, here the optimum: 2 of 4 questions right, the other 2 failed.
    result = _tune(tmp_path, program=_OptimumToy, retriever=_FailingRetriever(), trials=1)
    assert result.trial.user_attrs["metrics"]["f1"] == 1.0  # the mean over answered questions only
    assert result.trial.values == [0.5]
    listed = json.loads(result.files["trials"].read_text())
    assert listed[0]["errors"] == 2 and listed[0]["asked"] == 4
    assert json.loads(result.files["program"].read_text())["metadata"]["tuning"]["values"] == [0.5]


class _OptimumToy(toys.ToyProgram):
    """The toy program whose defaults are the search space's optimum."""

    name = "toy-optimum"

    def __init__(self, *, retriever: Any = None, task: str = "short", top_k: int = 5, max_step: int = 2):
        super().__init__(retriever=retriever, task=task, top_k=top_k, max_step=max_step)


def test_failed_questions_never_make_a_trial_look_cheaper():
    records = [
        {"error": None, "stats": {"lm_calls": 2, "retrievals": 1}, "tokens": {"input": 10, "output": 5}},
        {"error": None, "stats": {"lm_calls": 6, "retrievals": 3}, "tokens": {"input": 30, "output": 5}},
        {"error": {"type": "RetrievalError", "message": "down"}, "tokens": {"input": 0, "output": 0}},
    ]
    result = types.SimpleNamespace(
        metrics={"f1": 1.0},
        cost={"lm_calls": 4.0, "retrievals": 2.0, "input_tokens": 20.0, "output_tokens": 5.0},
        n=2,
        errors=1,
        records=records,
    )
    values = objective_values(("quality", "lm_calls", "tokens", "retrievals"), "f1", result, asked=3)
    # The failed question scores 0 and costs as much as the dearest answered one.
    assert values == pytest.approx([2 / 3, (2 + 6 + 6) / 3, (15 + 35 + 35) / 3, (1 + 3 + 3) / 3])


# ------------------------------------------------------------------------------- resumed sampling
class _WideToy(toys.ToyProgram):
    """A search space too wide for two honest draws to coincide."""

    name = "toy-wide"

    @classmethod
    def search_space(cls, trial: Any) -> dict[str, Any]:
        return {
            "top_k": trial.suggest_int("top_k", 1, 10**6),
            "max_step": trial.suggest_int("max_step", 1, 10**6),
        }


def _knob_score(program: Any, examples: Any, **_: Any) -> Any:
    """A deterministic scripted objective: a function of the knobs alone."""
    score = ((program.top_k * 7919 + program.max_step) % 1000) / 1000
    records = [{"error": None, "stats": {"lm_calls": 1}} for _ in examples]
    return types.SimpleNamespace(
        metrics={"f1": score, "accuracy": score}, cost={"lm_calls": 1.0}, n=len(examples), records=records
    )


def test_a_resumed_study_does_not_replay_the_first_runs_draws(tmp_path):
    first = _tune(tmp_path, program=_WideToy, trials=3, evaluate_fn=_knob_score)
    first_params = [tuple(sorted(t.params.items())) for t in first.study.trials]
    resumed = _tune(tmp_path, program=_WideToy, trials=6, evaluate_fn=_knob_score)
    params = [tuple(sorted(t.params.items())) for t in resumed.study.trials]
    assert len(params) == 6
    assert params[:3] == first_params
    assert len(set(params)) == 6, params


# ------------------------------------------------------------------------------- compile after the search
def _demo_score(program: Any, examples: Any, **_: Any) -> Any:
    """Scores 0.3 without demos and 0.8 with them, whatever the knobs."""
    demos = sum(len(p.demos) for _, p in program.named_predictors())
    records = [{"error": None, "stats": {"lm_calls": 1}} for _ in examples]
    return types.SimpleNamespace(
        metrics={"f1": 0.8 if demos else 0.3, "accuracy": 0.8 if demos else 0.3},
        cost={"lm_calls": 1.0},
        n=len(examples),
        records=records,
    )


def _tune_compiled(tmp_path: Path, evaluate_fn: Any):
    """A study whose program is compiled with bootstrap (2 demos, from 4 toy questions), every program it
    scores scored by ``evaluate_fn`` on 4 other questions."""
    examples = toys.examples(8)
    return _tune(
        tmp_path,
        valset=examples[4:],
        trainset=examples[:4],
        compile="bootstrap",
        compile_options={"max_labeled_demos": 2},
        evaluate_fn=evaluate_fn,
    )


def test_tune_with_compile_reports_the_score_of_the_saved_program(tmp_path):
    result = _tune_compiled(tmp_path, _demo_score)
    assert result.trial.values == [0.3]
    saved = json.loads(result.files["program"].read_text())
    assert saved["metadata"]["tuning"]["values"] == [0.8]
    assert result.saved_values == [0.8]
    assert saved["metadata"]["tuning"]["trial_values"] == [0.3]
    assert saved["metadata"]["metrics"]["f1"] == 0.8
    assert "scored again: quality 80.0" in format_front(result)


def test_a_compiled_program_that_cannot_be_scored_is_saved_and_reported(tmp_path):
    def down_once_compiled(program: Any, examples: Any, **kwargs: Any) -> Any:
        result = _demo_score(program, examples, **kwargs)
        if result.metrics["f1"] == 0.8:  # the compiled program: every question fails
            failed = [{"error": {"type": "LMError", "message": "server down"}} for _ in examples]
            return types.SimpleNamespace(metrics={}, cost={}, n=0, records=failed)
        return result

    with pytest.raises(
        ConfigError, match=r"every example failed in trial 0 \(compiled\).*server down.*saved"
    ):
        _tune_compiled(tmp_path, down_once_compiled)
    saved = json.loads((tmp_path / "toy-opt-hotpotqa-quality" / "best.json").read_text())
    assert any(state["demos"] for state in saved["predictors"].values())
    assert saved["metadata"]["tuning"]["values"] is None and saved["metadata"]["metrics"] is None


# ------------------------------------------------------------------------------- optimization metric
def test_optimization_metric_cannot_be_gamed_by_hedging():
    assert optimization_metric("hotpotqa") == "f1"
    assert optimization_metric("2wikimultihopqa") == "f1"
    assert optimization_metric("musique") == "f1"
    assert optimization_metric("strategyqa") == "yes_no_accuracy"
    assert optimization_metric("nq") == "exact_match"
    assert optimization_metric("asqa") == "str_em"


def test_tune_does_not_reward_unknown_for_gold_no(tmp_path):
    # The toy answers "unknown" with its default knobs; substring accuracy finds gold "no" inside it.
    valset = [ex.copy(answers=["no"]) for ex in toys.examples(2)]
    result = _tune(tmp_path, valset=valset, trials=1)
    assert result.trial.user_attrs["metrics"]["accuracy"] == 1.0
    assert result.trial.values == [0.0]
    saved = json.loads(result.files["program"].read_text())
    assert saved["metadata"]["tuning"]["quality_metric"] == "f1"


def test_compile_program_defaults_to_the_optimization_metric():
    from ragsuite.optimizers import compile_program

    program = toys.ToyProgram(retriever=toys.ToyRetriever(), top_k=3, max_step=1)  # answers "unknown"
    train = [ex.copy(answers=["no"]) for ex in toys.examples(3)]
    with dspy.context(lm=toys.scripted_lm()):
        compiled = compile_program(program, train, optimizer="bootstrap", dataset="hotpotqa")
    # Under substring accuracy every "unknown" run passed for gold "no" and became a demo.
    assert all(not p.demos for _, p in compiled.named_predictors())


# ------------------------------------------------------------------------------- storage faults
def test_a_torn_journal_tail_is_dropped_with_a_warning(tmp_path, caplog):
    journal = tmp_path / "study.log"
    storage = f"journal:{journal}"
    _tune(tmp_path, storage=storage, study_name="j", trials=2)
    torn = b'{"op_code": 5, "worker_id": "dead", "trial_id": 1, "sta'
    with open(journal, "ab") as f:
        f.write(torn)
    with caplog.at_level(logging.WARNING, logger="ragsuite.optimizers.tuning"):
        result = _tune(tmp_path, storage=storage, study_name="j", trials=4)
    assert f"journal {journal} ended with a torn record" in caplog.text
    assert f"dropped its {len(torn)} bytes" in caplog.text
    assert len([t for t in result.study.trials if t.state == TrialState.COMPLETE]) == 4
    # The file reads back whole for every other worker.
    assert journal.read_bytes().endswith(b"\n")
    for line in journal.read_bytes().splitlines():
        json.loads(line)
    again = optuna.load_study(study_name="j", storage=resolve_storage(storage, None))
    assert len(again.trials) == 4


def test_a_damaged_journal_record_is_refused_naming_the_fix(tmp_path):
    journal = tmp_path / "study.log"
    _tune(tmp_path, storage=f"journal:{journal}", study_name="j", trials=1)
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(lines[0] + b"{not json\n" + b"".join(lines[1:]))
    with pytest.raises(ConfigError, match=r"unreadable record.*--storage journal:NEW_FILE"):
        resolve_storage(f"journal:{journal}", None)


def test_three_workers_create_one_fresh_sqlite_study_at_once(tmp_path):
    storage = str(tmp_path / "shared.db")
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "DSPY_CACHEDIR": str(tmp_path / "cache")}
    code = (
        "import sys; from ragsuite.testing import toys; "
        "toys.run_worker(sys.argv[1], int(sys.argv[2]), 6, sys.argv[3], workers=3)"
    )
    workers = []
    try:
        for seed in (1, 2, 3):
            workers.append(
                subprocess.Popen(
                    [sys.executable, "-c", code, storage, str(seed), str(tmp_path)],
                    env=env,
                    stderr=subprocess.PIPE,
                )
            )
        for worker in workers:
            _, err = worker.communicate(timeout=240)
            assert worker.returncode == 0, err.decode()[-3000:]
    finally:
        for worker in workers:
            _stop(worker)
    study = optuna.load_study(study_name="shared", storage=resolve_storage(storage, None))
    assert len([t for t in study.trials if t.state == TrialState.COMPLETE]) >= 6
    assert all(t.state == TrialState.COMPLETE for t in study.trials)  # no trial run twice, none lost
    assert sum(1 for t in study.trials if t.system_attrs.get("fixed_params")) == 1  # defaults queued once


# ------------------------------------------------------------------------------- dashboard and orphans
def test_objectives_are_named_for_the_dashboard(tmp_path):
    result = _tune(tmp_path, objectives=("quality", "lm_calls"), trials=1)
    study = optuna.load_study(study_name=result.study.study_name, storage=resolve_storage(None, tmp_path))
    assert study.metric_names == ["f1", "lm_calls"]


@pytest.mark.parametrize("journal", [False, True], ids=["sqlite", "journal"])
def test_trials_of_dead_workers_on_this_host_are_failed_on_resume(tmp_path, journal):
    storage = f"journal:{tmp_path / 'study.log'}" if journal else None
    first = _tune(tmp_path, trials=1, storage=storage)
    study = optuna.load_study(study_name=first.study.study_name, storage=resolve_storage(storage, tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        owners = {
            "dead": f"{socket.gethostname()}:{dead.pid}",
            "alive": f"{socket.gethostname()}:{alive.pid}",
            "remote": "some-other-host:1",
        }
        numbers = {}
        for label, owner in owners.items():
            trial = study.ask()
            trial.set_user_attr("worker", owner)
            numbers[label] = trial.number
        resumed = _tune(tmp_path, trials=2, storage=storage)
    finally:
        _stop(alive)
    states = {t.number: t.state for t in resumed.study.trials}
    assert states[numbers["dead"]] == TrialState.FAIL
    assert states[numbers["alive"]] == TrialState.RUNNING
    assert states[numbers["remote"]] == TrialState.RUNNING


# ------------------------------------------------------------------------------- the command line
def _tiny_dataset(root: Path, n: int = 6) -> Path:
    """A data directory holding a hotpotqa dev split of ``n`` questions and a corpus of their answers."""
    folder = root / "hotpotqa"
    folder.mkdir(parents=True)
    questions = [
        {"id": f"t{i}", "question": f"What is the code name of project {i}?", "answers": [f"Answer{i}"]}
        for i in range(n)
    ]
    passages = [
        {"id": f"p{i}", "title": f"Project {i}", "text": f"Project {i} is code-named Answer{i}."}
        for i in range(n)
    ]
    (folder / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in questions))
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in passages))
    return root


def test_cli_tune_refuses_a_resume_with_another_temperature_or_split(tmp_path, capsys):
    from ragsuite.cli import main
    from ragsuite.testing.openai_server import LocalOpenAIServer

    data = _tiny_dataset(tmp_path / "data")
    out = tmp_path / "tune"
    gold = {f"What is the code name of project {i}?": f"Answer{i}" for i in range(6)}
    with LocalOpenAIServer(grounded_responder(gold)) as server:
        base = ["tune", "--program", "vanilla", "--dataset", "hotpotqa", "--data-dir", str(data)]
        rest = ["--train", "2", "--val", "2", "--threads", "1", "--out", str(out), "--lm", "openai/scripted"]
        rest += ["--api-base", server.api_base, "--no-cache"]
        assert main([*base, "--trials", "1", *rest]) == 0
        best = out / "vanilla-hotpotqa-quality" / "best.json"
        before = best.read_bytes()
        capsys.readouterr()
        code = main([*base, "--trials", "2", "--temperature", "0.7", "--split-seed", "3", *rest])
        err = capsys.readouterr().err
        assert code == 2
        assert "lm.temperature: 0.1 -> 0.7" in err
        assert "split_seed: 0 -> 3" in err
        assert "valset.ids:" in err
        assert best.read_bytes() == before
        assert main([*base, "--trials", "2", *rest]) == 0
    assert len(json.loads((best.parent / "trials.json").read_text())) == 2


def test_workers_with_their_own_seed_share_one_study(tmp_path, capsys):
    """`tune --help` tells each worker of a shared study to pass its own --seed, which also seeds the LM's
    sampling; the second worker was refused with `lm.seed: 1 -> 0` as a changed configuration."""
    from ragsuite.cli import main
    from ragsuite.testing.openai_server import LocalOpenAIServer

    data = _tiny_dataset(tmp_path / "data")
    storage = f"journal:{tmp_path / 'shared.log'}"
    gold = {f"What is the code name of project {i}?": f"Answer{i}" for i in range(6)}
    with LocalOpenAIServer(grounded_responder(gold)) as server:
        base = ["tune", "--program", "vanilla", "--dataset", "hotpotqa", "--data-dir", str(data)]
        base += [
            "--train",
            "2",
            "--val",
            "2",
            "--threads",
            "1",
            "--storage",
            storage,
            "--lm",
            "openai/scripted",
        ]
        base += ["--api-base", server.api_base, "--no-cache"]
        assert main([*base, "--trials", "1", "--seed", "1", "--out", str(tmp_path / "w1")]) == 0
        capsys.readouterr()
        code = main([*base, "--trials", "2", "--seed", "0", "--out", str(tmp_path / "w2")])
        assert code == 0, capsys.readouterr().err
        # A setting that does change the answers is still refused.
        code = main(
            [*base, "--trials", "3", "--seed", "2", "--temperature", "0.7", "--out", str(tmp_path / "w3")]
        )
        assert code == 2 and "lm.temperature: 0.1 -> 0.7" in capsys.readouterr().err
        assert {request.sampling.get("seed") for request in server.requests} == {0, 1}
    trials = json.loads((tmp_path / "w2" / "vanilla-hotpotqa-quality" / "trials.json").read_text())
    assert [t["lm_seed"] for t in trials] == [1, 0]  # each trial records the seed its worker sent


def test_a_study_saved_with_an_lm_seed_resumes_under_another_seed(tmp_path):
    """Studies of earlier versions stored the LM's seed in their configuration: it is not compared."""
    seeded = toys.scripted_lm()
    seeded.kwargs["seed"] = 1
    first = _tune(tmp_path, lm=seeded, trials=1)
    config = dict(first.study.user_attrs["config"])
    assert "seed" not in config["lm"]
    first.study.set_user_attr("config", {**config, "lm": {**config["lm"], "seed": 1}})
    other = toys.scripted_lm()
    other.kwargs["seed"] = 0
    assert len(_tune(tmp_path, lm=other, trials=2).study.trials) == 2
