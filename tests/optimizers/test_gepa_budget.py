"""GEPA in compile: offered only the predictors that run on the trainset, a budget proportional to the data,
and a log directory (beside --out) that a killed compile resumes from."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import dspy
import pytest

from ragsuite.errors import ConfigError
from ragsuite.optimizers import compile_program
from ragsuite.optimizers.compile import (
    GEPA_CALLS_PER_EXAMPLE,
    GEPA_RUN_FILE,
    RanPredictorSelector,
    gepa_budget,
    predictors_run_on,
)
from ragsuite.testing import toys


class Fallback(dspy.Signature):
    """Never used: answer when there are no passages at all."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField()


class ToyWithIdlePredictor(toys.ToyProgram):
    """The toy program plus a predictor that only a retriever returning nothing would reach."""

    name = "toy-idle"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.fallback = dspy.Predict(Fallback)

    def forward(self, question: str) -> dspy.Prediction:
        ledger = self.start(question)
        if not self.retrieve(ledger, question, self.top_k):  # the toy retriever always finds passages
            reply = self.call_stage(ledger, "fallback", self.fallback, question=question)
            return self.finish(ledger, reply.answer, [])
        return super().forward(question)


def _program(**knobs):
    return ToyWithIdlePredictor(retriever=toys.ToyRetriever(), **knobs)


def _half(example, prediction, trace=None) -> float:
    """Half the toy's exact match: never a perfect score, so GEPA never skips a minibatch as solved and its
    round robin goes on through every predictor it is offered."""
    return 0.5 * toys.exact(example, prediction)


def _proposed_for(caplog) -> list[str]:
    """The predictor of every proposal GEPA made (DSPy's GEPA logs them)."""
    return re.findall(r"Proposed new text for (\S+):", caplog.text)


def test_predictors_run_on_finds_the_predictors_a_traced_run_reaches():
    examples = toys.examples()[:3]
    with dspy.context(lm=toys.scripted_lm()):
        assert predictors_run_on(_program(max_step=1), examples, threads=2) == ["hop", "answer.predict"]
        assert predictors_run_on(_program(max_step=0), examples, threads=1) == ["answer.predict"]


def test_gepa_proposes_only_for_predictors_that_ran(tmp_path, caplog):
    examples = toys.examples()
    lm = toys.scripted_lm()
    with dspy.context(lm=lm), caplog.at_level(logging.INFO):
        compiled = compile_program(
            _program(top_k=5, max_step=1),
            examples[:4],
            examples[4:],
            optimizer="gepa",
            metric=_half,
            reflection_lm=lm,
            max_metric_calls=80,
            threads=1,
        )
    proposed = _proposed_for(caplog)
    assert len(proposed) >= 4 and set(proposed) == {"hop", "answer.predict"}
    assert "Exception building reflective dataset" not in caplog.text
    assert dict(compiled.named_predictors())["fallback"].signature.instructions == Fallback.__doc__
    assert "1 never ran and keep their instructions: fallback" in caplog.text

    # DSPy's GEPA on its own, same program and budget, spends iterations on the predictor that never runs.
    from ragsuite.optimizers.feedback import feedback_metric

    caplog.clear()
    with dspy.context(lm=lm), caplog.at_level(logging.INFO):
        dspy.GEPA(
            metric=feedback_metric(_half), reflection_lm=lm, max_metric_calls=80, num_threads=1
        ).compile(_program(top_k=5, max_step=1), trainset=examples[:4], valset=examples[4:])
    assert "Exception building reflective dataset" in caplog.text
    assert "fallback" not in _proposed_for(caplog)


def test_round_robin_selector_skips_idle_predictors_and_keeps_its_place_in_gepa_state():
    class State:
        def __init__(self):
            self.list_of_named_predictors = ["hop", "answer.predict", "fallback"]
            self.named_predictor_id_to_update_next_for_program_candidate = [0, 2]

    state = State()
    selector = RanPredictorSelector(["hop", "answer.predict"])
    picks = [selector(state, [], [], 0, {}) for _ in range(4)]
    assert picks == [["hop"], ["answer.predict"], ["hop"], ["answer.predict"]]
    assert selector(state, [], [], 1, {}) == ["hop"]  # candidate 1 was due for 'fallback'
    assert state.named_predictor_id_to_update_next_for_program_candidate == [2, 1]
    every = RanPredictorSelector(["answer.predict"], mode="all")
    assert every(state, [], [], 0, {"hop": "", "answer.predict": "", "fallback": ""}) == ["answer.predict"]
    with pytest.raises(ConfigError, match="round_robin"):
        RanPredictorSelector(["hop"], mode="random")  # type: ignore[arg-type]


def test_default_budget_scales_with_the_data(caplog):
    assert gepa_budget(10, 20) == 450 == GEPA_CALLS_PER_EXAMPLE * 30
    assert gepa_budget(20, 40) == 2 * gepa_budget(10, 20)
    from ragsuite.cli import compile as cli_compile

    assert cli_compile.GEPA_CALLS_PER_EXAMPLE == GEPA_CALLS_PER_EXAMPLE  # what --help says
    examples = toys.examples()
    lm = toys.scripted_lm()
    budgets = {}
    for train, val in ((2, 2), (4, 4)):
        caplog.clear()
        with dspy.context(lm=lm), caplog.at_level(logging.INFO, logger="dspy.teleprompt.gepa.gepa"):
            compiled = compile_program(
                _program(top_k=5, max_step=1),
                examples[:train],
                examples[train : train + val],
                optimizer="gepa",
                metric=toys.exact,
                reflection_lm=lm,
                threads=1,
            )
        budgets[train + val] = compiled.optimization["options"]["max_metric_calls"]
        assert f"Running GEPA for approx {budgets[train + val]} metric calls" in caplog.text
    assert budgets == {4: 4 * GEPA_CALLS_PER_EXAMPLE, 8: 8 * GEPA_CALLS_PER_EXAMPLE}


def test_an_explicit_budget_wins():
    examples = toys.examples()
    lm = toys.scripted_lm()
    with dspy.context(lm=lm):
        compiled = compile_program(
            _program(top_k=5, max_step=1),
            examples[:2],
            examples[2:4],
            optimizer="gepa",
            metric=toys.exact,
            reflection_lm=lm,
            max_full_evals=2,
            threads=1,
        )
    assert "max_metric_calls" not in compiled.optimization["options"]
    assert compiled.optimization["options"]["max_full_evals"] == 2


def test_log_dir_resumes_the_same_run_and_refuses_another(tmp_path):
    examples = toys.examples()
    log_dir = tmp_path / "gepa"

    def run(train, lm, budget=40):
        with dspy.context(lm=lm):
            return compile_program(
                _program(top_k=5, max_step=1),
                train,
                examples[4:],
                optimizer="gepa",
                metric=_half,
                reflection_lm=lm,
                max_metric_calls=budget,
                threads=1,
                log_dir=log_dir,
            )

    def state():
        from gepa.core.state import GEPAState

        return GEPAState.load(str(log_dir))

    first_lm = toys.scripted_lm()
    first = run(examples[:4], first_lm)
    assert (log_dir / "gepa_state.bin").is_file()
    first_trace = state().full_program_trace
    assert 40 <= state().total_num_evals < 60
    recorded = json.loads((log_dir / GEPA_RUN_FILE).read_text())
    assert recorded["program"] == "toy-idle" and recorded["seed"] == 0
    assert any("new_instruction" in r.output_fields for r in first_lm.requests)

    # Rerun after the budget was spent: GEPA resumes its state, reflects no more, returns the same program.
    again_lm = toys.scripted_lm()
    again = run(examples[:4], again_lm)
    assert not any("new_instruction" in r.output_fields for r in again_lm.requests)
    assert {n: p.signature.instructions for n, p in again.named_predictors()} == {
        n: p.signature.instructions for n, p in first.named_predictors()
    }

    # A larger budget (a budget is no part of what must match) carries on from the saved state.
    run(examples[:4], toys.scripted_lm(), budget=80)
    resumed_trace = state().full_program_trace
    assert state().total_num_evals >= 80 and len(resumed_trace) > len(first_trace)
    assert resumed_trace[: len(first_trace)] == first_trace  # the first run's iterations, kept

    with pytest.raises(ConfigError, match="another trainset; delete that folder"):
        run(examples[1:4], toys.scripted_lm())
    other_model = toys.scripted_lm()
    other_model.model = "openai/another-model"
    with pytest.raises(ConfigError, match="another lm, reflection_lm;"):  # the scores there are another LM's
        run(examples[:4], other_model)


def test_a_log_dir_with_an_unrecorded_gepa_run_is_refused(tmp_path):
    (tmp_path / "gepa").mkdir()
    (tmp_path / "gepa" / "gepa_state.bin").write_bytes(b"\x80")
    lm = toys.scripted_lm()
    with dspy.context(lm=lm), pytest.raises(ConfigError, match="cannot be checked"):
        compile_program(
            _program(),
            toys.examples()[:2],
            optimizer="gepa",
            metric=toys.exact,
            reflection_lm=lm,
            log_dir=tmp_path / "gepa",
        )


@pytest.mark.slow
def test_cli_gepa_budget_and_log_dir_beside_the_program_file(
    tmp_path, capsys, tiny_dataset, answers_no, compile_args
):
    from ragsuite.cli import main
    from ragsuite.testing.openai_server import LocalOpenAIServer

    data = tiny_dataset(tmp_path / "data")
    out = tmp_path / "out" / "compiled.json"
    with LocalOpenAIServer(answers_no) as server:

        def gepa_args(out: Path, *extra: str) -> list[str]:
            gepa = ["--teacher-lm", "openai/scripted", "--no-eval", "--no-progress", *extra]
            return compile_args(data, out, *gepa, optimizer="gepa", server=server)

        assert main(gepa_args(out)) == 0
        printed = capsys.readouterr().out
        saved = json.loads(out.read_text())["metadata"]
        assert saved["options"]["max_metric_calls"] == GEPA_CALLS_PER_EXAMPLE * (2 + 3)
        log_dir = tmp_path / "out" / "compiled.gepa"
        assert (log_dir / "gepa_state.bin").is_file() and (log_dir / GEPA_RUN_FILE).is_file()
        assert f"GEPA log: {log_dir}" in printed
        assert "log_dir" not in saved["options"]  # a local path is no part of the program file

        other = tmp_path / "out" / "small.json"
        assert main(gepa_args(other, "--max-metric-calls", "12")) == 0
        assert json.loads(other.read_text())["metadata"]["options"]["max_metric_calls"] == 12

        code = main(gepa_args(other, "--max-metric-calls", "12", "--option", "auto=light"))
        assert code == 2 and "either --max-metric-calls or --option auto" in capsys.readouterr().err
        argv = gepa_args(other, "--max-metric-calls", "12")
        argv[argv.index("gepa")] = "bootstrap"
        assert main(argv) == 2 and "needs --optimizer gepa" in capsys.readouterr().err
