"""`ragsuite report` statistics: bootstrap intervals per metric, paired tests between runs on the same
questions, per-question-type breakdowns, and CSV/LaTeX output; the interval of a ratio of paired sums that
the benchmarks' seconds ratios use."""

from __future__ import annotations

import dspy
import pytest

from ragsuite.cli import main
from ragsuite.evaluation import evaluate
from ragsuite.programs.baselines import NoRetrieval
from ragsuite.stats import ratio_of_sums_ci
from ragsuite.testing.scripted import ScriptedLM

N = 60


def examples():
    return [
        dspy.Example(
            id=f"q{i}",
            question=f"question {i}?",
            answers=[f"gold{i}"],
            type="bridge" if i % 2 else "comparison",
        ).with_inputs("question")
        for i in range(N)
    ]


def make_run(path, right: set[int]):
    """A no-retrieval run answering exactly the questions in ``right``."""

    def respond(request):
        i = int(request.inputs["question"].split()[1].rstrip("?"))
        return {"answer": f"gold{i}" if i in right else "wrong"}

    with dspy.context(lm=ScriptedLM(respond)):
        evaluate(NoRetrieval(), examples(), dataset="hotpotqa", threads=2, out_dir=path, progress=False)
    return path


def test_report_intervals_paired_test_and_types(tmp_path, capsys) -> None:
    strong = make_run(tmp_path / "strong", set(range(0, 54)))  # 90%
    weak = make_run(tmp_path / "weak", set(range(0, 54, 2)))  # 45%: only the comparison questions (even ids)
    same = make_run(tmp_path / "same", set(range(6, 60)))  # 90% too, on other questions
    assert main(["report", str(strong), str(weak), str(same), "--ci", "--paired", "--by-type"]) == 0
    out = capsys.readouterr().out
    ci = next(
        line
        for line in out.splitlines()
        if line.startswith("| no-retrieval [strong] | hotpotqa | exact_match")
    )
    low, high = (float(x) for x in ci.split("[")[-1].rstrip(" |").rstrip("]").split(", "))
    assert low < 90.0 < high and high - low < 25
    pair = next(line for line in out.splitlines() if "[strong] | no-retrieval [weak] | exact_match" in line)
    cells = [c.strip() for c in pair.strip("|").split("|")]
    assert cells[3:7] == ["60", "90.0", "45.0", "+45.0"] and cells[-1] == "*"
    even = next(line for line in out.splitlines() if "[strong] | no-retrieval [same] | exact_match" in line)
    assert [c.strip() for c in even.strip("|").split("|")][-1] == ""  # 90 vs 90: not significant
    weak_types = [line for line in out.splitlines() if line.startswith("| no-retrieval [weak] | hotpotqa |")]
    by_type = {
        line.split(" | ")[2]: line.split(" | ")[4]
        for line in weak_types
        if " | bridge | " in line or " | comparison | " in line
    }
    assert by_type == {"bridge": "0.0", "comparison": "90.0"}


def test_report_formats(tmp_path, capsys) -> None:
    run = make_run(tmp_path / "run", set(range(30)))
    assert main(["report", str(run), "--format", "csv"]) == 0
    csv = capsys.readouterr().out.splitlines()
    assert csv[0].startswith("program,dataset,LM,n,errors,") and csv[1].startswith("no-retrieval,hotpotqa,")
    assert main(["report", str(run), "--format", "latex", "--ci"]) == 0
    latex = capsys.readouterr().out
    assert latex.count(r"\begin{tabular}") == 2 and r"exact\_match" in latex


def test_a_ratio_of_sums_resamples_its_pairs_together() -> None:
    # 40 over 50; a resample of the first pair alone gives 10/20, of the second alone 30/30.
    assert ratio_of_sums_ci([10.0, 30.0], [20.0, 30.0]) == (0.5, 1.0)
    # A pair slow under both settings moves both sums: the ratio holds at 0.5 whatever is resampled.
    assert ratio_of_sums_ci([5.0, 500.0], [10.0, 1000.0]) == (0.5, 0.5)
    low, high = ratio_of_sums_ci([1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0], level=0.5)
    assert 0.25 <= low < 1.0 < high <= 4.0


@pytest.mark.parametrize(
    ("numerators", "denominators", "message"),
    [([1.0], [1.0, 2.0], "must pair up: 1 vs 2"), ([], [], "no values")],
)
def test_a_ratio_of_sums_refuses_unpaired_or_empty_values(numerators, denominators, message) -> None:
    with pytest.raises(ValueError, match=message):
        ratio_of_sums_ci(numerators, denominators)
