"""Optuna tuning: known optimum, defaults first, resume, Pareto outputs, pruning, shared journal studies."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import optuna
import pytest
from optuna.trial import TrialState

import ragsuite
from ragsuite.errors import ConfigError
from ragsuite.optimizers import tune
from ragsuite.optimizers.tuning import redact_storage, resolve_storage
from ragsuite.processes import stop_process
from ragsuite.testing import toys
from ragsuite.testing.responders import grounded_responder

#: The Pareto plot needs the plot extra; without it only pareto.json is written.
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None

OPTIMUM = {"top_k": 5, "max_step": 2}


@pytest.fixture(autouse=True)
def registered_toy():
    """Tuning writes program files of the toy program; loading them needs it registered."""
    with toys.registered():
        yield


def _tune(tmp_path, **kwargs):
    options = toys.tune_options(tmp_path, **{"trials": 16, "threads": 2, **kwargs})
    return tune(options.pop("program"), **options)


def test_single_objective_finds_the_optimum_defaults_first_and_resumes(tmp_path):
    result = _tune(tmp_path)
    assert result.knobs == OPTIMUM
    assert result.trial.values == [1.0]
    trials = result.study.trials
    assert len(trials) == 16
    assert trials[0].params == toys.ToyProgram.default_knobs() == {"top_k": 3, "max_step": 1}
    assert trials[0].values == [0.0]
    assert trials[0].user_attrs["cost"]["lm_calls"] == 2.0  # one hop + the answer, from the cost ledger
    assert (tmp_path / "study.db").is_file()

    # The written program file loads and reproduces the trial's score.
    loaded = ragsuite.load(str(result.files["program"]), retriever=toys.ToyRetriever())
    assert loaded.knobs() == OPTIMUM
    assert loaded.optimization["tuning"]["trial"] == result.trial.number
    import dspy

    with dspy.context(lm=toys.scripted_lm()):
        assert [loaded(question=toys.question(i)).answer for i in range(2)] == ["Answer0", "Answer1"]
    listed = json.loads(result.files["trials"].read_text())
    assert [t["number"] for t in listed] == list(range(16))
    assert all(isinstance(t["seconds"], float) and t["seconds"] >= 0 for t in listed)  # wall times

    # Re-running resumes the same study: only the missing trials run.
    again = _tune(tmp_path, trials=18)
    assert len(again.study.trials) == 18
    assert len(_tune(tmp_path, trials=18).study.trials) == 18


def test_multi_objective_writes_pareto_json_and_png(tmp_path):
    result = _tune(tmp_path, objectives=("quality", "lm_calls"), trials=12)
    front = json.loads(result.files["pareto_json"].read_text())
    assert front["objectives"] == ["quality", "lm_calls"]
    points = [tuple(t["values"]) for t in front["front"]]
    assert points and points == sorted(points, key=lambda v: (-v[0], v[1]))
    done = [t for t in result.study.trials if t.state == TrialState.COMPLETE]
    for q, calls in points:  # nothing completed dominates a front point
        assert not any(
            t.values[0] >= q and t.values[1] <= calls and tuple(t.values) != (q, calls) for t in done
        )
    if HAS_MATPLOTLIB:
        assert result.files["pareto_png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "pareto_png" not in result.files
    # Without --pick, the highest-quality Pareto point is written.
    assert result.trial.values[0] == max(t.values[0] for t in done)

    cheapest = front["front"][-1]
    picked = _tune(tmp_path, objectives=("quality", "lm_calls"), trials=12, pick=cheapest["number"])
    assert json.loads(picked.files["program"].read_text())["knobs"] == cheapest["knobs"]
    assert picked.knobs == cheapest["knobs"]


def test_prune_stops_hopeless_trials(tmp_path):
    # Most toy trials score 0, so the median never beats them; keep only the top quarter instead.
    pruner = optuna.pruners.PercentilePruner(25.0, n_startup_trials=3)
    result = _tune(
        tmp_path, valset=toys.examples(8), prune=True, prune_every=2, pruner=pruner, trials=14, threads=1
    )
    states = [t.state for t in result.study.trials]
    pruned = [t for t in result.study.trials if t.state == TrialState.PRUNED]
    assert pruned, states
    assert all(t.user_attrs["pruned_at"]["examples"] < 8 for t in pruned)
    assert result.knobs == OPTIMUM


def test_two_workers_share_a_journal_study(tmp_path):
    storage = f"journal:{tmp_path / 'study.log'}"
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "DSPY_CACHEDIR": str(tmp_path / "cache")}
    code = (
        "import sys; from ragsuite.testing import toys; "
        "toys.run_worker(sys.argv[1], int(sys.argv[2]), 10, sys.argv[3])"
    )
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", code, storage, str(seed), str(tmp_path)],
            env=env,
            stderr=subprocess.PIPE,
        )
        for seed in (1, 2)
    ]
    try:
        for worker in workers:
            _, err = worker.communicate(timeout=240)
            assert worker.returncode == 0, err.decode()[-3000:]
    finally:
        for worker in workers:
            stop_process(worker)
    study = optuna.load_study(study_name="shared", storage=resolve_storage(storage, None))
    finished = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert 10 <= len(finished) <= 11  # a worker may start one trial while the other finishes the last
    assert len({t.number for t in study.trials}) == len(study.trials)
    assert len({t.user_attrs["worker"] for t in finished}) == 2  # both processes ran trials
    assert sum(1 for t in finished if t.params == {"top_k": 3, "max_step": 1}) >= 1
    assert study.trials[0].params == {"top_k": 3, "max_step": 1}
    assert {t.system_attrs.get("fixed_params") is not None for t in study.trials}.issuperset({True})
    assert sum(1 for t in study.trials if t.system_attrs.get("fixed_params")) == 1  # defaults enqueued once


def test_bad_settings_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="declares no search space"):
        tune(toys.NoSpaceProgram, dataset="hotpotqa", valset=toys.examples(2), out_dir=tmp_path)
    with pytest.raises(ConfigError, match="objectives must be"):
        _tune(tmp_path, objectives=("lm_calls",))
    with pytest.raises(ConfigError, match="single objective"):
        _tune(tmp_path, objectives=("quality", "tokens"), prune=True)
    with pytest.raises(ConfigError, match="needs a trainset"):
        _tune(tmp_path, compile="bootstrap")
    with pytest.raises(ConfigError, match="unrecognized --storage"):
        resolve_storage("somewhere", None)
    with pytest.raises(
        ConfigError, match="'str_em' is not one of hotpotqa's metrics; choose one of: accuracy"
    ):
        _tune(tmp_path / "other", quality_metric="str_em")
    assert not (tmp_path / "other" / "study.db").exists()  # refused before a study was made
    with pytest.raises(ConfigError, match="not a completed trial"):
        _tune(tmp_path, trials=2, pick=99)


def test_storage_specs(tmp_path):
    assert resolve_storage(None, tmp_path) == f"sqlite:///{(tmp_path / 'study.db').resolve()}"
    assert resolve_storage(None, None) is None
    assert resolve_storage("postgresql://u:pw@db/optuna", None) == "postgresql://u:pw@db/optuna"
    assert redact_storage("postgresql://u:pw@db/optuna") == "postgresql://u:***@db/optuna"
    assert isinstance(resolve_storage(str(tmp_path / "s.journal"), None), optuna.storages.JournalStorage)
    assert resolve_storage(str(tmp_path / "s.db"), None).startswith("sqlite:///")


def test_compile_after_search_keeps_tuned_knobs(tmp_path):
    examples = toys.examples(8)
    result = _tune(
        tmp_path,
        valset=examples[4:],
        trainset=examples[:4],
        compile="bootstrap",
        compile_options={"max_labeled_demos": 0},
        trials=16,
    )
    saved = json.loads(result.files["program"].read_text())
    assert saved["knobs"] == OPTIMUM
    assert saved["metadata"]["optimizer"] == "bootstrap"
    assert len(saved["predictors"]["answer.predict"]["demos"]) == 4
    assert result.program.knobs() == OPTIMUM


def test_a_trial_where_every_example_fails_stops_the_study(tmp_path):
    with pytest.raises(ConfigError, match="every example failed in trial 0"):
        _tune(tmp_path, retriever=None, trials=3)


@pytest.mark.slow
def test_cli_tune_then_eval_the_written_program(tmp_path, capsys, eval_args):
    from ragsuite.cli import main
    from ragsuite.data.datasets import load_dataset
    from ragsuite.testing.openai_server import LocalOpenAIServer

    gold = {ex.question: ex.answers[0] for ex in load_dataset("hotpotqa")}
    out = tmp_path / "tune"
    with LocalOpenAIServer(grounded_responder(gold)) as server:
        lm = ["--lm", "openai/scripted", "--api-base", server.api_base, "--no-cache"]
        args = ["tune", "--program", "deepnote", "--dataset", "hotpotqa", "--trials", "4", "--val", "3"]
        assert (
            main([*args, "--objectives", "quality,lm_calls", "--threads", "2", "--out", str(out), *lm]) == 0
        )
        printed = capsys.readouterr().out
        assert "Pareto front of study 'deepnote-hotpotqa-quality+lm_calls' (4 complete" in printed
        study_dir = out / "deepnote-hotpotqa-quality+lm_calls"
        assert (study_dir / "pareto.png").is_file() == HAS_MATPLOTLIB and (out / "study.db").is_file()
        saved = json.loads((study_dir / "best.json").read_text())
        trials = json.loads((study_dir / "trials.json").read_text())
        from ragsuite.programs.deepnote import DeepNote

        assert trials[0]["knobs"] == {k: DeepNote.default_knobs()[k] for k in trials[0]["knobs"]}
        assert {"top_k", "max_step", "max_failure", "max_passages"} <= set(trials[1]["knobs"])
        assert saved["metadata"]["tuning"]["trial"] in [t["number"] for t in trials]
        assert server.api_base not in (study_dir / "best.json").read_text()
        # A second run of the same command resumes: nothing left to do.
        assert (
            main([*args, "--objectives", "quality,lm_calls", "--threads", "2", "--out", str(out), *lm]) == 0
        )
        assert len(json.loads((study_dir / "trials.json").read_text())) == 4
        code = main(eval_args(server, tmp_path / "run", "--limit", "2", program_file=study_dir / "best.json"))
        assert code == 0
        manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
        assert manifest["knobs"] == saved["knobs"]


def test_a_compiled_program_file_is_tuned_with_its_demos_over_the_knobs_searched(tmp_path):
    import dspy

    from ragsuite.evaluation import evaluate
    from ragsuite.programs.program_file import save_program

    compiled = toys.KnobbedToy(retriever=toys.ToyRetriever(), top_k=5)
    compiled.hop.demos = [dspy.Example(question="Which demo?", note="DEMO NOTE").with_inputs("question")]
    holdout = {"holdout": {"train_ids": ["q7"], "val_ids": ["q6"]}}
    path = save_program(compiled, tmp_path / "compiled.json", metadata=holdout)
    seen = []

    def recording(program, examples, **kwargs):
        seen.append((program.knobs(), [demo["note"] for demo in program.hop.demos]))
        return evaluate(program, examples, **kwargs)

    result = _tune(
        tmp_path / "tune", program=toys.KnobbedToy, program_file=path, search=["max_step"], trials=5,
        evaluate_fn=recording,
    )  # fmt: skip
    assert seen[0] == ({"top_k": 5, "max_step": 1}, ["DEMO NOTE"])  # the file's knobs first
    assert all(knobs["top_k"] == 5 and notes == ["DEMO NOTE"] for knobs, notes in seen)
    assert all(set(t.params) == {"max_step"} for t in result.study.trials)
    assert result.knobs == {"max_step": 2} and result.trial.values == [1.0]
    saved = json.loads(result.files["program"].read_text())
    assert saved["knobs"] == {"top_k": 5, "max_step": 2}
    assert [demo["note"] for demo in saved["predictors"]["hop"]["demos"]] == ["DEMO NOTE"]
    assert saved["metadata"]["holdout"] == holdout["holdout"]  # the compile's examples stay held out
    assert saved["metadata"]["tuning"]["searched"] == ["max_step"]
    assert saved["metadata"]["tuning"]["started_from"]["file"] == "compiled.json"
    loaded = ragsuite.load(str(result.files["program"]), retriever=toys.ToyRetriever())
    with dspy.context(lm=toys.scripted_lm()):
        assert loaded(question=toys.question(1)).answer == "Answer1"


@pytest.mark.slow
def test_cli_tunes_a_compiled_program_file_keeping_its_demos_and_what_it_held_out(tmp_path, capsys):
    import dspy

    from ragsuite.cli import main
    from ragsuite.data.datasets import load_dataset
    from ragsuite.programs.deepnote import DeepNote
    from ragsuite.programs.program_file import save_program
    from ragsuite.testing.openai_server import LocalOpenAIServer

    compiled = DeepNote(max_step=2)
    demo = dspy.Example(question="DEMO QUESTION?", note="A demo note.", answer="DEMO ANSWER")
    compiled.answer.demos = [demo]
    path = save_program(
        compiled, tmp_path / "compiled.json", metadata={"holdout": {"train_ids": ["seen-in-compile"]}}
    )
    gold = {ex.question: ex.answers[0] for ex in load_dataset("hotpotqa")}
    out = tmp_path / "tune"
    with LocalOpenAIServer(grounded_responder(gold)) as server:
        code = main([
            "tune", "--program-file", str(path), "--dataset", "hotpotqa", "--search", "max_step,max_failure",
            "--set", "top_k=3", "--trials", "2", "--train", "3", "--val", "2", "--threads", "2",
            "--out", str(out), "--lm", "openai/scripted", "--api-base", server.api_base, "--no-cache",
        ])  # fmt: skip
        assert code == 0
        answers = [r for r in server.requests if "answer" in r.output_fields]
        assert answers and all("DEMO QUESTION?" in json.dumps(r.messages) for r in answers)
    study_dir = out / "deepnote-hotpotqa-quality"
    trials = json.loads((study_dir / "trials.json").read_text())
    assert trials[0]["knobs"] == {"max_step": 2, "max_failure": 2}  # the file's knobs first
    assert all(set(t["knobs"]) == {"max_step", "max_failure"} for t in trials)
    saved = json.loads((study_dir / "best.json").read_text())
    assert saved["knobs"]["top_k"] == 3
    assert [demo["answer"] for demo in saved["predictors"]["answer"]["demos"]] == ["DEMO ANSWER"]
    holdout = saved["metadata"]["holdout"]
    assert holdout["train_ids"] == ["seen-in-compile"] and len(holdout["val_ids"]) == 2
    capsys.readouterr()
    code = main(["tune", "--program", "vanilla", "--program-file", str(path), "--dataset", "hotpotqa",
                 "--trials", "1", "--out", str(out / "other")])  # fmt: skip
    assert code == 2 and "compiled.json holds program 'deepnote', not 'vanilla'" in capsys.readouterr().err


def test_compile_each_compiles_every_trial_and_keeps_the_chosen_one(tmp_path):
    examples = toys.examples(8)
    result = _tune(
        tmp_path, valset=examples[4:], trainset=examples[:4], compile="bootstrap", compile_each=True, trials=3
    )
    study_dir = result.files["program"].parent
    assert study_dir == tmp_path / "toy-opt-hotpotqa-quality"
    files = sorted(p.name for p in (study_dir / "trials").glob("*.json"))
    assert files == ["trial-0.json", "trial-1.json", "trial-2.json"]
    saved = json.loads(result.files["program"].read_text())
    assert saved["knobs"] == result.knobs
    assert saved["metadata"]["tuning"]["compile_each"] is True
    chosen = json.loads((study_dir / "trials" / f"trial-{result.trial.number}.json").read_text())
    assert saved["predictors"] == chosen["predictors"]


def test_progress_shows_a_trial_bar_only_when_asked(tmp_path, capsys):
    _tune(tmp_path / "quiet", trials=2)
    assert "/2" not in capsys.readouterr().err
    _tune(tmp_path / "shown", trials=2, progress=True)
    err = capsys.readouterr().err
    assert "2/2" in err and "Best trial" in err  # Optuna's bar: trials done and the best value so far
