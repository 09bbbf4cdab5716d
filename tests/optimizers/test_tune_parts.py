"""The parts of ``tune``, each on its own: the checked configuration, the study's setup, the objective, the
choice of a trial and the files written. ``test_tune.py`` and ``test_tune_studies.py`` test the whole."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import types
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from ragsuite.errors import ConfigError
from ragsuite.optimizers.tuning import (
    ChosenProgram,
    TrialObjective,
    TrialPrograms,
    TuneConfig,
    choose_trial,
    fail_orphaned_trials,
    open_study,
    resolve_storage,
    run_trials,
    tuning_metadata,
    write_study_files,
)
from ragsuite.testing import toys


@pytest.fixture(autouse=True)
def registered_toy():
    with toys.registered():
        yield


def config(tmp_path: Any = None, **changes: Any) -> TuneConfig:
    return TuneConfig(**toys.tune_options(tmp_path, **{"trials": 3, **changes}))


def fake_result(quality: float, *, n: int = 4, lm_calls: float = 2.0) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        metrics={"f1": quality, "accuracy": quality}, cost={"lm_calls": lm_calls}, n=n, records=[]
    )


# ----------------------------------------------------------------------------------------- the configuration
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"objectives": ("lm_calls", "quality")}, "objectives must be 'quality' followed by"),
        ({"objectives": ("quality", "tokens"), "prune": True}, "pruning works with a single objective"),
        ({"trials": 0}, "trials must be >= 1"),
        ({"valset": []}, "the validation set is empty"),
        ({"compile": "nope", "trainset": toys.examples(2)}, "unknown optimizer 'nope'"),
        ({"compile": "bootstrap"}, "compile needs a trainset"),
        ({"compile_each": True}, "compile_each needs compile=OPTIMIZER"),
        ({"quality_metric": "rouge"}, "quality metric 'rouge' is not one of hotpotqa's metrics"),
        ({"program": toys.KnobbedToy, "search": ["nope"]}, "program 'toy-knobs' has no knob 'nope'"),
        ({"search": ["top_k"]}, "samples its own search space"),
        ({"program_kwargs": {"top_k": 5}}, "samples its own search space"),
        (
            {"program": toys.KnobbedToy, "program_kwargs": {"top_k": 5}, "search": ["top_k"]},
            "knob 'top_k' is both fixed and searched",
        ),
        (
            {"program": toys.KnobbedToy, "program_kwargs": {"top_k": 5, "max_step": 2}},
            "nothing is left to search: every knob of toy-knobs with a search space is fixed",
        ),
        (
            {"program": "deepnote", "search": ["dedupe_queries"]},
            "knob 'dedupe_queries' of deepnote has no search space; the knobs with one: top_k, max_step",
        ),
    ],
)
def test_a_configuration_is_refused_before_anything_opens(tmp_path, changes, message):
    with pytest.raises(ConfigError, match=message):
        config(tmp_path / "out", **changes)
    assert not (tmp_path / "out").exists()  # nothing created for a refused run


def test_a_configuration_derives_its_settings():
    checked = config(None, prune=True, seed=3, valset=toys.examples(8))
    assert checked.cls is toys.ToyProgram and checked.task == "short"
    assert checked.quality == "f1" and checked.name == "toy-opt-hotpotqa-quality"
    assert checked.directions == ["maximize"] and checked.report_every == 2
    assert isinstance(checked.pruner, optuna.pruners.MedianPruner)
    assert sorted(ex.id for ex in checked.examples) == sorted(ex.id for ex in checked.valset)
    assert [ex.id for ex in checked.examples] != [ex.id for ex in checked.valset]  # shuffled for pruning
    assert checked.files_dir is None
    pareto = config(None, objectives=("quality", "lm_calls"), study_name="s/1")
    assert pareto.directions == ["maximize", "minimize"]
    assert config("/tmp/x", study_name="s/1").files_dir.name == "s_1"


def test_the_study_configuration_masks_credentials_and_names_what_defines_it():
    class ServerRetriever(toys.ToyRetriever):
        def describe(self) -> dict[str, Any]:
            return {"spec": "colbert-server:http://u:secret@host/api", "timeout": 5}

    stored = config(None, retriever=ServerRetriever(), run_config={"split_seed": 1}).study_config()
    assert "secret" not in json.dumps(stored) and "timeout" not in stored["retriever"]
    assert stored["program"] == "toy-opt" and stored["valset"]["size"] == 4 and stored["split_seed"] == 1


def _saved_toy(path: Any, program: type = toys.KnobbedToy, **knobs: Any) -> Any:
    from ragsuite.programs.program_file import save_program

    return save_program(program(retriever=toys.ToyRetriever(), **knobs), path)


def test_a_program_file_is_checked_before_anything_opens(tmp_path):
    other = _saved_toy(tmp_path / "other.json", toys.ToyProgram)
    with pytest.raises(ConfigError, match=r"other\.json holds program 'toy-opt', not 'toy-knobs'"):
        config(tmp_path / "out", program=toys.KnobbedToy, program_file=other)
    mine = _saved_toy(tmp_path / "mine.json", top_k=7)
    with pytest.raises(ConfigError, match="a program file's trials keep its prompts and demos"):
        config(
            tmp_path / "out", program=toys.KnobbedToy, program_file=mine, compile="bootstrap",
            trainset=toys.examples(2),
        )  # fmt: skip
    mine.write_text("{not json")
    with pytest.raises(ConfigError, match=r"mine\.json"):
        config(tmp_path / "out", program=toys.KnobbedToy, program_file=mine)
    assert not (tmp_path / "out").exists()


def test_fixed_knobs_stay_out_of_the_search_and_every_trial_runs_them(tmp_path):
    seen: list[dict[str, Any]] = []

    def evaluate(program: Any, examples: list, **kwargs: Any) -> types.SimpleNamespace:
        seen.append(program.knobs())
        return fake_result(1.0)

    checked = config(tmp_path, program=toys.KnobbedToy, program_kwargs={"top_k": 7}, evaluate_fn=evaluate)
    assert checked.searched == ["max_step"] and checked.base_knobs == {"top_k": 7, "max_step": 1}
    study = open_study(checked)
    assert [t.system_attrs["fixed_params"] for t in study.trials] == [{"max_step": 1}]
    run_trials(study, TrialObjective(checked, TrialPrograms(checked)), checked)
    assert len(seen) == 3 and all(knobs["top_k"] == 7 for knobs in seen)
    assert all(set(t.params) == {"max_step"} for t in study.trials)
    assert checked.study_config()["program_kwargs"] == {"top_k": 7}  # a resume with another value is refused


def test_a_program_file_is_the_first_trial_and_its_knobs_bound_the_search(tmp_path):
    path = _saved_toy(tmp_path / "compiled.json", top_k=5, max_step=3)
    checked = config(tmp_path / "out", program=toys.KnobbedToy, program_file=path, search=["top_k"])
    assert checked.searched == ["top_k"] and checked.base_knobs == {"top_k": 5, "max_step": 3}
    assert checked.study_config()["search"] == ["top_k"]
    digest = checked.study_config()["program_file"]
    study = open_study(checked)
    assert [t.system_attrs["fixed_params"] for t in study.trials] == [{"top_k": 5}]
    _saved_toy(path, top_k=7)  # another file at the same path is another study
    assert (
        config(tmp_path / "out", program=toys.KnobbedToy, program_file=path).study_config()["program_file"]
        != digest
    )
    with pytest.raises(ConfigError, match="was run with another configuration"):
        open_study(config(tmp_path / "out", program=toys.KnobbedToy, program_file=path, search=["top_k"]))


# ----------------------------------------------------------------------------------------- the study
def test_a_new_study_queues_the_defaults_and_a_resumed_one_is_checked(tmp_path):
    study = open_study(config(tmp_path))
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"] for t in waiting] == [toys.ToyProgram.default_knobs()]
    assert study.metric_names == ["f1"] and (tmp_path / "study.db").is_file()
    again = open_study(config(tmp_path))
    assert len(again.trials) == 1  # the defaults are queued once
    with pytest.raises(ConfigError, match="was run with another configuration"):
        open_study(config(tmp_path, valset=toys.examples(3)))


def test_orphaned_trials_are_failed_through_the_public_api(tmp_path):
    storage = resolve_storage(f"journal:{tmp_path / 'j.log'}", None)
    study = optuna.create_study(study_name="orphans", storage=storage)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    owners = [f"{host}:{dead.pid}", f"{host}:{os.getpid()}", f"elsewhere:{dead.pid}"]
    for owner in owners:
        study.ask().set_user_attr("worker", owner)
    assert fail_orphaned_trials(study) == [0]
    states = [t.state for t in optuna.load_study(study_name="orphans", storage=storage).trials]
    assert states == [TrialState.FAIL, TrialState.RUNNING, TrialState.RUNNING]
    assert fail_orphaned_trials(study) == []  # nothing left to fail


def test_run_trials_stops_at_the_total_and_adds_only_the_missing_ones(tmp_path):
    checked = config(tmp_path, trials=2)
    study = open_study(checked)
    run_trials(study, lambda trial: float(trial.suggest_int("x", 0, 3)), checked)
    assert len(study.trials) == 2
    run_trials(study, lambda trial: pytest.fail("the study is full"), checked)
    assert len(study.trials) == 2


# ----------------------------------------------------------------------------------------- the objective
def test_the_objective_builds_scores_and_records_a_trial():
    seen: list[dict[str, Any]] = []

    def evaluate(program: Any, examples: list, **kwargs: Any) -> types.SimpleNamespace:
        seen.append({"knobs": program.knobs(), "n": len(examples), "threads": kwargs["threads"]})
        return fake_result(0.5, n=3)  # one of four questions failed

    checked = config(None, evaluate_fn=evaluate, objectives=("quality", "lm_calls"))
    objective = TrialObjective(checked, TrialPrograms(checked))
    study = optuna.create_study(directions=checked.directions)
    study.enqueue_trial({"top_k": 5, "max_step": 2})
    study.optimize(objective, n_trials=1)
    trial = study.trials[0]
    assert seen == [{"knobs": {"top_k": 5, "max_step": 2}, "n": 4, "threads": 1}]
    assert trial.values == [0.375, 2.0]  # the failed question scores 0
    assert trial.user_attrs["errors"] == 1 and trial.user_attrs["asked"] == 4
    assert trial.user_attrs["worker"] == f"{socket.gethostname()}:{os.getpid()}"
    assert trial.user_attrs["knobs"] == {"top_k": 5, "max_step": 2}


def test_the_search_space_is_one_method_a_subclass_can_extend():
    checked = config(None, evaluate_fn=lambda *a, **k: fake_result(1.0))

    class WithExtra(TrialObjective):
        def sample_knobs(self, trial: optuna.Trial) -> dict[str, Any]:
            return {**super().sample_knobs(trial), "max_step": 3}

    study = optuna.create_study()
    study.optimize(WithExtra(checked, TrialPrograms(checked)), n_trials=1)
    assert study.trials[0].user_attrs["knobs"]["max_step"] == 3


def test_a_trial_whose_every_question_failed_is_an_error_naming_it():
    failing = types.SimpleNamespace(metrics={"f1": 0.0}, cost={}, n=0, records=[{"error": "Timeout"}])
    checked = config(None, evaluate_fn=lambda *a, **k: failing)
    programs = TrialPrograms(checked)
    with pytest.raises(
        ConfigError, match=r"every example failed in trial 7 \(knobs \{'top_k': 1\}\): Timeout"
    ):
        programs.score(programs.build({"top_k": 1}), 7, {"top_k": 1})


# ----------------------------------------------------------------------------------------- choice and files
def test_the_choice_is_the_best_trial_or_the_one_picked(tmp_path):
    study = optuna.create_study(directions=["maximize", "minimize"])
    for values in ([0.5, 1.0], [0.9, 3.0], [0.4, 2.0]):
        study.add_trial(optuna.trial.create_trial(values=values, params={}, distributions={}))
    two = ("quality", "lm_calls")
    chosen, front = choose_trial(study, config(None, objectives=two))
    assert chosen.number == 1 and [t.number for t in front] == [1, 0]
    assert choose_trial(study, config(None, objectives=two, pick=2))[0].number == 2
    with pytest.raises(ConfigError, match="trial 5 is not a completed trial"):
        choose_trial(study, config(None, objectives=two, pick=5))
    with pytest.raises(ConfigError, match="has no completed trial"):
        choose_trial(optuna.create_study(), config(None))


def test_the_study_files_hold_the_program_the_trials_and_the_front(tmp_path):
    checked = config(tmp_path, objectives=("quality", "lm_calls"), study_name="files")
    study = optuna.create_study(directions=checked.directions)
    study.add_trial(optuna.trial.create_trial(values=[0.5, 2.0], params={}, distributions={}))
    chosen, _ = choose_trial(study, checked)
    final = ChosenProgram(
        TrialPrograms(checked).build({"top_k": 5}), [0.5, 2.0], {"f1": 0.5}, {"lm_calls": 2}
    )
    metadata = tuning_metadata(checked, chosen, final)
    files = write_study_files(checked, study, final.program, metadata, [{"number": 0}])
    assert {"program", "trials", "pareto_json"} <= set(files)
    assert all(path.parent == tmp_path / "files" for path in files.values())
    saved = json.loads(files["program"].read_text())
    assert saved["knobs"]["top_k"] == 5 and saved["metadata"]["tuning"]["values"] == [0.5, 2.0]
    assert json.loads(files["pareto_json"].read_text())["front"] == [{"number": 0}]
    assert metadata["tuning"]["storage"] == "sqlite (out dir)" and metadata["metrics"] == {"f1": 0.5}
