"""`ragsuite report` on tune directories (the Pareto front as a table, in HTML, as PNG), `--png` for eval
runs, and the error when matplotlib is missing."""

from __future__ import annotations

import html
import importlib.util
import json
import re
import struct
import sys

import pytest

from ragsuite.cli import main
from ragsuite.errors import install_hint
from ragsuite.optimizers import tune
from ragsuite.report_plots import pareto_flags
from ragsuite.testing import toys

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
needs_matplotlib = pytest.mark.skipif(not HAS_MATPLOTLIB, reason="needs the plot extra (matplotlib)")


@pytest.fixture(scope="module")
def tune_dir(tmp_path_factory):
    """A finished two-objective study of the toy program (quality against LM calls)."""
    out = tmp_path_factory.mktemp("tune")
    with toys.registered():
        tune(
            toys.ToyProgram,
            dataset="hotpotqa",
            valset=toys.examples(4),
            retriever=toys.ToyRetriever(),
            lm=toys.scripted_lm(),
            trials=12,
            objectives=("quality", "lm_calls"),
            out_dir=out,
            threads=2,
            seed=0,
        )
    return out


def png_size(path) -> tuple[int, int]:
    """Width and height from a PNG file's header, after checking its signature and IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_pareto_flags_keeps_the_points_nothing_beats():
    # (cost, quality): the second is dearer and worse than the first; equal points both stay.
    assert pareto_flags([(1, 0.5), (2, 0.4), (2, 0.7), (2, 0.7), (0.5, 0.1)]) == [
        True,
        False,
        True,
        True,
        True,
    ]


def test_report_of_a_tune_dir_draws_every_trial_and_the_front(tune_dir, tmp_path, capsys, chromium, request):
    (study_dir,) = [p.parent for p in tune_dir.glob("*/trials.json")]
    trials = json.loads((study_dir / "trials.json").read_text())
    front = json.loads((study_dir / "pareto.json").read_text())["front"]
    done = [t for t in trials if t["state"] == "COMPLETE"]
    metric = json.loads((study_dir / "best.json").read_text())["metadata"]["tuning"]["quality_metric"]
    # The front tune wrote is exactly the set of trials no other trial beats on both objectives.
    flags = pareto_flags([(t["values"][1], t["values"][0]) for t in done])
    assert {t["number"] for t, f in zip(done, flags, strict=True) if f} == {t["number"] for t in front}

    out = tmp_path / "tune.html"
    assert main(["report", str(tune_dir), "--html", str(out)]) == 0  # the --out folder
    printed = capsys.readouterr().out
    assert (
        f"Pareto front of study '{study_dir.name}' ({len(done)} complete of {len(trials)} trials)" in printed
    )
    for trial in front:
        knobs = ", ".join(f"{k}={v}" for k, v in trial["knobs"].items())
        assert f"#{trial['number']}" in printed and knobs in printed

    page = out.read_text()
    assert "<script" not in page and "src=" not in page  # nothing to run, nothing fetched
    (chart,) = re.findall(r"<svg class=chart.*?</svg>", page, re.S)
    assert chart.count("<circle class=front") == len(front)
    assert chart.count("<circle ") == len(done)
    for trial in done:  # every trial's tooltip: its number, knobs and both objective values
        knobs = ", ".join(f"{k}={v}" for k, v in trial["knobs"].items())
        quality, calls = trial["values"]
        assert (
            f"#{trial['number']} ({knobs}): {metric} {100 * quality:.1f}, lm_calls per question {calls:.3g}"
            in (html.unescape(chart))
        )
    table = re.search(r"<table class=front>(.*?)</table>", page, re.S).group(1)
    rows = re.findall(r"<tr><td>#(\d+)", table)
    assert [int(n) for n in rows] == [t["number"] for t in front]  # highest quality first, as tune lists it
    for trial in front:
        assert html.escape(", ".join(f"{k}={v}" for k, v in trial["knobs"].items())) in table
    if chromium is not None:  # as a browser parses it: every point drawn, none swallowed by another element
        browser_dom, layout_at = request.getfixturevalue("browser_dom"), request.getfixturevalue("layout_at")
        dom = browser_dom(out, tmp_path / "tune.png")
        (drawn,) = re.findall(r'<svg class="chart".*?</svg>', dom, re.S)
        assert re.search(r"<polyline [^>]*></polyline>", drawn)
        assert drawn.count("<circle ") == len(done) and drawn.count('class="front"') == len(front)
        layout = layout_at(out, 1280)  # fits a 1,280-px window; every tick and label inside its chart
        assert layout["scroll"] <= layout["width"] and layout["overflowing"] == [] and layout["clipped"] == []
    # The study folder itself is a tune directory too.
    assert main(["report", str(study_dir), "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["front"] == [t["number"] for t in front] and listed["objectives"] == ["quality", "lm_calls"]


def test_report_refuses_mixing_runs_and_tune_dirs_and_unfinished_studies(tune_dir, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    assert main(["report", str(tune_dir), str(run)]) == 2
    assert "not a tune directory" in capsys.readouterr().err
    assert main(["report", str(tune_dir), "--paired"]) == 2
    assert "for eval runs" in capsys.readouterr().err
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "study.db").write_bytes(b"")
    assert main(["report", str(killed)]) == 2
    assert "run the same tune command again" in capsys.readouterr().err


@needs_matplotlib
def test_png_writes_the_pareto_plot_of_a_tune_dir(tune_dir, tmp_path, capsys):
    out = tmp_path / "plots"
    assert main(["report", str(tune_dir), "--png", str(out)]) == 0
    (study_dir,) = [p.parent for p in tune_dir.glob("*/trials.json")]
    written = sorted(out.iterdir())
    assert [p.name for p in written] == [f"pareto-{study_dir.name}.png"]
    width, height = png_size(written[0])
    assert width >= 400 and height >= 300 and written[0].stat().st_size > 5000
    assert f"wrote {written[0]}" in capsys.readouterr().err


@pytest.fixture(scope="module")
def eval_runs(tmp_path_factory, run_eval):
    from ragsuite.data.datasets import load_dataset
    from ragsuite.testing.openai_server import LocalOpenAIServer
    from ragsuite.testing.responders import grounded_responder

    root = tmp_path_factory.mktemp("runs")
    gold = {ex.question: ex.answers[0] for ex in load_dataset("hotpotqa")[:4]}
    with LocalOpenAIServer(grounded_responder(gold)) as server:
        return run_eval(server, root / "deepnote", "deepnote"), run_eval(server, root / "vanilla", "vanilla")


@needs_matplotlib
def test_png_writes_steps_histograms_and_accuracy_against_cost(eval_runs, tmp_path, capsys):
    deepnote, vanilla = eval_runs
    out = tmp_path / "plots"
    assert main(["report", str(deepnote), str(vanilla), "--png", str(out)]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["accuracy-vs-cost.png", "steps-deepnote.png", "steps-vanilla.png"]
    for name in names:
        width, height = png_size(out / name)
        assert width >= 400 and height >= 300 and (out / name).stat().st_size > 5000
    # Two panels side by side (tokens, LM calls): twice as wide as one.
    assert png_size(out / "accuracy-vs-cost.png")[0] > 1.8 * png_size(out / "steps-deepnote.png")[0]
    err = capsys.readouterr().err
    assert all(f"wrote {out / name}" in err for name in names)


def test_png_without_matplotlib_is_a_clear_error_and_writes_nothing(eval_runs, tmp_path, capsys, monkeypatch):
    for module in (
        "matplotlib",
        "matplotlib.figure",
        "matplotlib.backends",
        "matplotlib.backends.backend_agg",
    ):
        monkeypatch.setitem(sys.modules, module, None)  # `import` of a None entry raises ImportError
    deepnote, _ = eval_runs
    out, page = tmp_path / "plots", tmp_path / "report.html"
    assert main(["report", str(deepnote), "--png", str(out), "--html", str(page)]) == 2
    err = capsys.readouterr().err
    assert "ragsuite report --png needs the 'matplotlib' package" in err and install_hint("plot") in err
    assert "[plot]" in err
    assert not out.exists() and not page.exists()


def test_svg_axes_make_room_for_wide_ticks_and_cut_long_point_labels():
    """Without a browser: every tick label's estimated extent lies inside the drawing, and a front label
    longer than the room beside its point is cut with an ellipsis (its tooltip keeps it whole)."""
    from ragsuite.report_plots import Point, Scatter, svg_scatter

    name = "a-run-folder-with-a-very-long-name-" * 3
    points = (Point(1200.0, 0.5, name, True), Point(123456.0, 0.25, "b", False))
    svg = svg_scatter(Scatter("runs", "tokens per question", "accuracy", points), width=470)
    ticks = re.findall(r"<text x=([\d.]+) y=[\d.]+ text-anchor=(middle|end)>([^<]+)</text>", svg)
    assert ticks and "150,000" in [t for _, _, t in ticks]
    for x, anchor, text in ticks:
        half = 6.6 * len(text) / (2 if anchor == "middle" else 1)
        assert float(x) - half >= 0 and float(x) + (half if anchor == "middle" else 0) <= 470, text
    (label,) = re.findall(r"fill='#a02'>([^<]+)</text>", svg)
    assert label.endswith("…") and name.startswith(label[:-1]) and f"<title>{name}" in svg
