"""compile_program with each DSPy optimizer on a tiny scripted program; metric wrappers; GEPA feedback."""

from __future__ import annotations

import json
import re

import dspy
import pytest

from ragsuite.errors import ConfigError
from ragsuite.optimizers import compile_program, feedback_metric, optimizer_metric, split_dev
from ragsuite.optimizers.feedback import describe_outcome
from ragsuite.retrieval.base import Passage
from ragsuite.testing import toys
from ragsuite.testing.responders import grounded_responder


@pytest.fixture
def lm():
    return toys.scripted_lm()


def _program(**knobs):
    return toys.ToyProgram(retriever=toys.ToyRetriever(), **knobs)


def _accuracy(program, examples):
    return sum(toys.exact(ex, program(question=ex.question)) for ex in examples) / len(examples)


def test_bootstrap_collects_demos_from_passing_runs_and_keeps_knobs(lm):
    program = _program(top_k=5, max_step=2)
    train = toys.examples()[:4]
    with dspy.context(lm=lm):
        compiled = compile_program(
            program, train, optimizer="bootstrap", metric=toys.exact, max_labeled_demos=0
        )
    assert type(compiled) is toys.ToyProgram
    assert compiled.knobs() == {"top_k": 5, "max_step": 2}
    assert compiled.retriever is program.retriever
    demos = dict(compiled.named_predictors())["answer.predict"].demos
    assert len(demos) == 4
    assert {d["answer"] for d in demos} == {f"Answer{i}" for i in range(4)}
    # The caller's program is untouched and the compile is recorded for the saved file.
    assert all(not p.demos for _, p in program.named_predictors())
    assert compiled.optimization["optimizer"] == "bootstrap"


def test_bootstrap_rejects_failing_runs_as_demos(lm):
    program = _program(top_k=3, max_step=1)  # never correct: the gold passage is ranked 5th
    with dspy.context(lm=lm):
        compiled = compile_program(
            program, toys.examples()[:4], optimizer="bootstrap", metric=toys.exact, max_labeled_demos=0
        )
    assert all(not p.demos for _, p in compiled.named_predictors())


def test_bootstrap_random_search_runs(lm):
    examples = toys.examples()
    with dspy.context(lm=lm):
        compiled = compile_program(
            _program(top_k=5, max_step=2),
            examples[:4],
            examples[4:],
            optimizer="bootstrap-rs",
            metric=toys.exact,
            num_candidate_programs=2,
            threads=1,
        )
        assert _accuracy(compiled, examples[4:]) == 1.0


def test_mipro_runs_to_completion(lm):
    examples = toys.examples()
    with dspy.context(lm=lm):
        compiled = compile_program(
            _program(top_k=5, max_step=1),
            examples[:4],
            examples[4:],
            optimizer="mipro",
            metric=toys.exact,
            num_candidates=2,
            num_trials=3,
            minibatch=False,
            threads=1,
        )
    assert type(compiled) is toys.ToyProgram
    assert compiled.knobs() == {"top_k": 5, "max_step": 1}
    # MIPROv2 asked the scripted LM for instruction proposals.
    assert any("proposed_instruction" in r.output_fields for r in lm.requests)


def test_gepa_reflects_with_feedback_and_improves(lm):
    examples = toys.examples()
    program = _program(top_k=5, max_step=1)  # wrong (one note only) until the instruction is rewritten
    with dspy.context(lm=lm):
        assert _accuracy(program, examples[4:]) == 0.0
        compiled = compile_program(
            program,
            examples[:4],
            examples[4:],
            optimizer="gepa",
            metric=toys.exact,
            reflection_lm=lm,
            max_metric_calls=30,
            threads=1,
        )
        assert _accuracy(compiled, examples[4:]) == 1.0
    instruction = dict(compiled.named_predictors())["answer.predict"].signature.instructions
    assert instruction.startswith("Scripted new_instruction")
    # The reflection prompt carried our textual feedback.
    reflections = [r for r in lm.requests if "new_instruction" in r.output_fields]
    assert reflections and "missed the gold answer" in reflections[0].user
    assert "gold passages were retrieved" in reflections[0].user


def test_simba_runs_to_completion(lm):
    with dspy.context(lm=lm):
        compiled = compile_program(
            _program(top_k=5, max_step=2),
            toys.examples()[:4],
            optimizer="simba",
            metric=toys.exact,
            bsize=2,
            num_candidates=2,
            max_steps=1,
            threads=1,
        )
    assert compiled.knobs() == {"top_k": 5, "max_step": 2}


def test_bad_arguments_are_clear(lm):
    program = _program()
    with pytest.raises(ConfigError, match="unknown optimizer"):
        compile_program(program, toys.examples(), optimizer="adam", metric=toys.exact)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="no option 'bogus'"):
        compile_program(program, toys.examples(), optimizer="bootstrap", metric=toys.exact, bogus=1)
    with pytest.raises(ConfigError, match="reflection LM"):
        compile_program(program, toys.examples(), optimizer="gepa", metric=toys.exact, max_metric_calls=5)
    with pytest.raises(ConfigError, match="empty"):
        compile_program(program, [], metric=toys.exact)
    with pytest.raises(ConfigError, match="metric= or dataset="):
        compile_program(program, toys.examples())


def test_a_compile_job_checks_and_derives_its_settings_without_running_anything():
    from ragsuite.optimizers.compile import compile_job, gepa_budget

    program, examples = _program(), toys.examples()
    teacher = toys.scripted_lm()
    job = compile_job(
        program, examples[:4], examples[4:6], optimizer="gepa", metric=toys.exact, teacher_lm=teacher
    )
    # GEPA reflects with the teacher unless told otherwise; its budget is filled in and recorded.
    assert job.reflection_lm is teacher and job.opts == {"max_metric_calls": gepa_budget(4, 2)}
    assert job.trainset == examples[:4] and job.valset == examples[4:6]
    assert compile_job(program, examples[:4], optimizer="gepa", metric=toys.exact, teacher_lm=teacher,
                       opts={"auto": "light"}).opts == {"auto": "light"}  # fmt: skip
    plain = compile_job(program, examples[:4], [], optimizer="bootstrap", metric=toys.exact, opts={"a": 1})
    assert plain.valset is None and plain.opts == {"a": 1} and plain.reflection_lm is None
    assert teacher.history == []  # nothing ran


def test_finish_compile_restores_knobs_keeps_the_retriever_and_records_the_run():
    from ragsuite.optimizers.compile import compile_job, finish_compile

    program = _program(top_k=5, max_step=2)
    program.optimization = {"earlier": "kept"}
    job = compile_job(program, toys.examples()[:3], optimizer="bootstrap", metric=toys.exact,
                      seed=7, opts={"max_rounds": 2, "log_dir": "x", "teacher": object()})  # fmt: skip
    rebuilt = _program(top_k=1, max_step=1)  # as if an optimizer had rebuilt the program
    rebuilt.retriever = None
    compiled = finish_compile(job, rebuilt, knobs=program.knobs(), recorded={"note": 1})
    assert compiled.knobs() == {"top_k": 5, "max_step": 2} and compiled.retriever is program.retriever
    assert compiled.optimization == {
        "earlier": "kept",
        "note": 1,
        "optimizer": "bootstrap",
        "trainset_size": 3,
        "valset_size": 0,
        "seed": 7,
        "options": {"max_rounds": 2},  # not the log directory, nor what a file cannot hold
    }
    # Knobs a run fitted (ReAnchor) are kept, not restored.
    fitted = _program(top_k=9, max_step=2)
    kept = finish_compile(job, fitted, knobs=program.knobs(), recorded={"fitted": {"top_k": 9}})
    assert kept.knobs() == {"top_k": 9, "max_step": 2}
    with pytest.raises(ConfigError, match="returned a Module, not a ToyProgram"):
        finish_compile(job, dspy.Module(), knobs={}, recorded={})


def test_optimizer_metric_is_float_when_scoring_and_bool_under_trace():
    metric = optimizer_metric(lambda ex, pred, trace=None: 0.5)
    example = toys.examples()[0]
    pred = dspy.Prediction(answer="x", trace=[{"stage": "answer"}], passages=[], stats={})
    assert metric(example, pred) == 0.5 and isinstance(metric(example, pred), float)
    assert metric(example, pred, []) is False
    assert optimizer_metric(lambda ex, pred, trace=None: 1.0)(example, pred, [("p", {}, {})]) is True


def test_a_right_answer_from_an_unsound_trace_is_no_demo():
    """While bootstrapping, the program's sound_demo_trace has the last word over a full-credit answer;
    while scoring it has none. compile_job hands the program's own check to the optimizer."""
    example = toys.examples()[0]
    pred = dspy.Prediction(answer="x", trace=[], passages=[], stats={})
    seen = []

    def unsound(trace):
        seen.append(trace)
        return False

    metric = optimizer_metric(lambda ex, pred, trace=None: 1.0, sound_trace=unsound)
    assert metric(example, pred, [("p", {}, {})]) is False and seen == [[("p", {}, {})]]
    assert metric(example, pred) == 1.0 and len(seen) == 1  # scoring never asks
    from ragsuite.optimizers.compile import compile_job

    program = _program()
    program.sound_demo_trace = unsound
    job = compile_job(
        program, toys.examples()[:2], optimizer="bootstrap", metric=lambda ex, pred, trace=None: 1.0
    )
    assert job.scoring(example, pred, []) is False


def test_feedback_names_missed_answer_and_retrieval():
    example = dspy.Example(question="q", answers=["Paris"], gold_passage_ids=["p1", "p2"]).with_inputs(
        "question"
    )
    pred = dspy.Prediction(
        answer="Lyon",
        trace=[{"stage": "retrieve", "passage_ids": ["p1", "x"]}],
        passages=[Passage("x", "", "t")],
        stats={},
    )
    metric = feedback_metric(lambda ex, p, trace=None: float(p.answer in ex.answers))
    out = metric(example, pred, None, "answer.predict", None)
    assert out.score == 0.0
    assert "missed the gold answer 'Paris'" in out.feedback
    assert "1 of 2 gold passages were retrieved" in out.feedback
    assert "Never retrieved: p2" in out.feedback
    assert "Retrieved but not used as evidence: p1" in out.feedback
    assert out.feedback.startswith("[stage answer.predict]")
    right = describe_outcome(example, dspy.Prediction(answer="Paris", passages=[], trace=[]), 1.0)
    assert right.startswith("Correct")


def test_split_dev_is_seeded_and_disjoint():
    examples = toys.examples()
    train, val = split_dev(examples, train=3, val=4, seed=1)
    assert len(train) == 3 and len(val) == 4
    assert not {e.id for e in train} & {e.id for e in val}
    assert [e.id for e in split_dev(examples, train=3, val=4, seed=1)[0]] == [e.id for e in train]
    orders = {tuple(e.id for e in split_dev(examples, train=8, val=0, seed=s)[0]) for s in range(4)}
    assert len(orders) > 1
    with pytest.raises(ConfigError, match="has 8"):
        split_dev(examples, train=5, val=5)


@pytest.mark.slow
def test_cli_compile_writes_a_program_file_eval_accepts(tmp_path, eval_args):
    from ragsuite.cli import main
    from ragsuite.data.datasets import load_dataset
    from ragsuite.testing.openai_server import LocalOpenAIServer

    gold = {ex.question: ex.answers[0] for ex in load_dataset("hotpotqa")}
    out = tmp_path / "vanilla.json"
    with LocalOpenAIServer(grounded_responder(gold)) as server:
        lm = ["--lm", "openai/scripted", "--api-base", server.api_base, "--no-cache"]
        args = ["compile", "--program", "vanilla", "--dataset", "hotpotqa", "--optimizer", "bootstrap"]
        code = main(
            [
                *args,
                "--train",
                "6",
                "--val",
                "4",
                "--set",
                "top_k=7",
                "--threads",
                "2",
                "--out",
                str(out),
                *lm,
            ]
        )
        assert code == 0
        saved = json.loads(out.read_text())
        assert saved["program"] == "vanilla" and saved["knobs"]["top_k"] == 7
        assert saved["metadata"]["optimizer"] == "bootstrap"
        assert set(saved["metadata"]["metrics"]) == {"baseline", "compiled"}
        assert server.api_base not in out.read_text()
        demos = [d for state in saved["predictors"].values() for d in state["demos"]]
        assert demos and all(d["answer"] != "unknown" for d in demos)  # only passing runs became demos
        code = main(eval_args(server, tmp_path / "run", "--limit", "2", program_file=out))
        assert code == 0
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["n"] == 2


def test_program_copies_share_the_retriever_but_not_predictors():
    import copy

    program = _program(top_k=5)
    clone = copy.deepcopy(program)
    assert clone.retriever is program.retriever
    assert clone.answer is not program.answer and clone.knobs() == program.knobs()
    clone.answer.predict.demos.append({"question": "q", "answer": "a"})
    assert program.answer.predict.demos == []


def test_default_metric_is_the_datasets_primary_metric(lm):
    program = _program(top_k=5, max_step=2)
    with dspy.context(lm=lm):
        compiled = compile_program(program, toys.examples()[:3], optimizer="bootstrap", dataset="hotpotqa")
        gepa = compile_program(
            _program(top_k=5, max_step=1),
            toys.examples()[:3],
            optimizer="gepa",
            dataset="hotpotqa",
            reflection_lm=lm,
            max_metric_calls=20,
            threads=1,
        )
    assert len(dict(compiled.named_predictors())["answer.predict"].demos) == 3
    assert dict(gepa.named_predictors())["answer.predict"].signature.instructions.startswith("Scripted")


def test_cli_compile_fails_clearly_when_no_question_can_be_scored(
    tmp_path, capsys, tiny_dataset, compile_args
):
    from ragsuite.cli import main
    from ragsuite.testing.openai_server import Fault, LocalOpenAIServer

    data = tiny_dataset(tmp_path / "data")
    out = tmp_path / "compiled.json"
    # Every LM call fails with HTTP 500 (no retries), so every question fails.
    always_down = lambda number, request: Fault("server_error")  # noqa: E731
    with LocalOpenAIServer(grounded_responder({}), fault_fn=always_down) as server:
        code = main(compile_args(data, out, server=server))
    captured = capsys.readouterr()
    assert code != 0
    assert "none of the 3 val examples could be scored for the program before compiling" in captured.err
    assert "--no-eval" in captured.err
    assert "baseline" not in captured.out
    assert not out.exists()  # nothing was compiled, so nothing is claimed


def test_cli_compile_scores_failed_questions_as_zero(tmp_path, capsys, tiny_dataset, compile_args):
    from ragsuite.cli import main
    from ragsuite.testing.openai_server import Fault, LocalOpenAIServer

    data = tiny_dataset(tmp_path / "data")
    out = tmp_path / "compiled.json"

    def odd_questions_fail(number, request):
        asked = re.fullmatch(r"Is tiny (\d+) answered no\?", str(request.inputs.get("question", "")))
        return Fault("server_error") if asked and int(asked.group(1)) % 2 else None

    with LocalOpenAIServer(lambda request: {"answer": "no"}, fault_fn=odd_questions_fail) as server:
        code = main(compile_args(data, out, "--split-seed", "0", val=4, server=server))
    printed = capsys.readouterr().out
    assert code == 0
    saved = json.loads(out.read_text())["metadata"]["metrics"]["baseline"]
    assert saved["metric"] == "f1"
    answered, failed = saved["n"], saved["errors"]
    assert answered + failed == 4 and failed > 0 and answered > 0
    assert saved["score"] == pytest.approx(answered / 4)
    assert f"baseline  f1 on 4 val examples: {100 * answered / 4:.1f}, {failed} failed (scored 0)" in printed


def test_cli_compile_keeps_a_compiled_program_it_cannot_score(tmp_path, capsys, tiny_dataset, compile_args):
    from ragsuite.cli import main
    from ragsuite.testing.openai_server import Fault, LocalOpenAIServer

    data = tiny_dataset(tmp_path / "data")
    out = tmp_path / "compiled.json"

    def down_once_compiled(number, request):
        # The compiled program's prompts carry demos (more than one user turn); the LM is down for them.
        return Fault("server_error") if len(request.messages) > 2 else None

    with LocalOpenAIServer(lambda request: {"answer": "no"}, fault_fn=down_once_compiled) as server:
        code = main(compile_args(data, out, server=server))
    captured = capsys.readouterr()
    assert code != 0
    assert "none of the 3 val examples could be scored for the compiled program" in captured.err
    saved = json.loads(out.read_text())  # the paid-for compile is kept
    assert any(state["demos"] for state in saved["predictors"].values())
    assert saved["metadata"]["metrics"]["baseline"]["score"] == 1.0
    assert "compiled" not in saved["metadata"]["metrics"]
