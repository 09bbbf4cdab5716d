"""The HTML report of a run, rendered by a real browser (headless Chromium): summary, questions, traces of a
DeepNote and a HANRAG run, each note step as a diff, the comparison view with accuracy against cost, and no
script injection from untrusted text."""

from __future__ import annotations

import html
import json
import re
import shutil

import pytest

from ragsuite.cli import main
from ragsuite.data.datasets import load_dataset
from ragsuite.testing.openai_server import LocalOpenAIServer
from ragsuite.testing.responders import grounded_responder


@pytest.fixture(scope="module")
def runs(tmp_path_factory, run_eval):
    root = tmp_path_factory.mktemp("runs")
    gold = {ex.question: ex.answers[0] for ex in load_dataset("hotpotqa")[:4]}
    with LocalOpenAIServer(grounded_responder(gold)) as server:
        return run_eval(server, root / "deepnote", "deepnote"), run_eval(server, root / "hanrag", "hanrag")


def test_report_html_is_self_contained_and_escapes_untrusted_text(runs, tmp_path, capsys):
    deepnote, _ = runs
    poisoned = tmp_path / "poisoned"
    shutil.copytree(deepnote, poisoned)
    lines = (poisoned / "records.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["prediction"] = "</script><script>window.INJECTED=1</script><img src=x onerror=alert(1)>"
    lines[0] = json.dumps(record)
    (poisoned / "records.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "report.html"
    assert main(["report", str(poisoned), "--html", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().err
    page = out.read_text()
    assert page.count("<script") == 2  # the data block and the report's own script, nothing injected
    # No asset is fetched from anywhere: no links, external scripts, images or imports.
    assert "<link" not in page and "src=" not in page.replace("src=x", "") and "@import" not in page
    assert "95% CI" in page and "steps per question" in page and "manifest" in page


def test_the_html_report_never_shows_a_secret_left_in_old_records(runs, tmp_path, monkeypatch):
    """A run written before echoed Basic tokens were recognised holds them in records.jsonl: the report
    redacts what it embeds, the page's own style and script untouched."""
    deepnote, _ = runs
    old = tmp_path / "old"
    shutil.copytree(deepnote, old)
    monkeypatch.setenv("VLLM_API_KEY", "vllm-key-0123456789abcdef")
    lines = (old / "records.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["error"] = {
        "type": "LMServerError",
        "message": "refused key=vllm-key-0123456789abcdef; Authorization: Basic YWxpY2U6czNjcmV0QHBhc3M=",
    }
    lines[0] = json.dumps(record)
    (old / "records.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "report.html"
    assert main(["report", str(old), "--html", str(out)]) == 0
    page = out.read_text()
    assert "vllm-key-0123456789abcdef" not in page and "YWxpY2U6czNjcmV0QHBhc3M=" not in page
    assert "refused key=***; Authorization: Basic ***" in page
    from ragsuite.report_html import _asset

    assert _asset("report.js") in page and _asset("report.css") in page


def test_a_browser_renders_the_traces_and_the_comparison(runs, tmp_path, browser_dom):
    deepnote, hanrag = runs
    single, both = tmp_path / "deepnote.html", tmp_path / "compare.html"
    assert main(["report", str(deepnote), "--html", str(single)]) == 0
    assert main(["report", str(deepnote), str(hanrag), "--html", str(both)]) == 0
    dom = browser_dom(single, tmp_path / "deepnote.png")
    first = json.loads((deepnote / "records.jsonl").read_text().splitlines()[0])
    assert f'data-id="{first["id"]}"' in dom  # the question list was rendered by the page's script
    assert "[note_init]" in dom and "[step]" in dom and "accepted" in dom  # DeepNote's case-study trace
    assert "4 questions, page 1 of 1" in dom
    compared = browser_dom(both, tmp_path / "compare.png")
    assert "Comparison (A = first run, B = second)" in compared and "questions scored by both" in compared
    assert (tmp_path / "deepnote.png").stat().st_size > 1000
    print(f"screenshots: {tmp_path / 'deepnote.png'}, {tmp_path / 'compare.png'}")


def card_of(dom: str, qid: str) -> str:
    """The rendered card of one question (up to the next card)."""
    start = dom.index(f'data-id="{qid}"')
    end = dom.find('<div class="q ', start)
    return dom[start : end if end != -1 else len(dom)]


def marked(html_text: str, tag: str) -> str:
    """All text inside ``<tag>`` elements of ``html_text``, joined by spaces."""
    return " ".join(re.findall(rf"<{tag}>(.*?)</{tag}>", html_text, flags=re.S))


def test_a_browser_shows_each_note_step_as_a_diff_against_the_best_note(runs, tmp_path, browser_dom):
    deepnote, _ = runs
    edited = tmp_path / "edited"
    shutil.copytree(deepnote, edited)
    lines = (edited / "records.jsonl").read_text().splitlines()

    def first_step_adds(record: dict) -> set[str]:
        """The words the first note update added to the initial note."""
        init = next(e for e in record["trace"] if e["stage"] == "note_init")
        step = next(e for e in record["trace"] if e["stage"] == "step" and isinstance(e.get("note"), str))
        return set(step["note"].split()) - set(init["note"].split())

    # A scripted question whose first update added passages to the note (records are in finishing order).
    where = next(i for i, line in enumerate(lines) if first_step_adds(json.loads(line)))
    real = json.loads(lines[where])
    # A second question with a known trace: step 1 rewrites a word and is rejected, so step 2 is compared with
    # the initial note again, not with the rejected one; step 3's update could not be parsed.
    other = (where + 1) % len(lines)
    known = json.loads(lines[other])
    known["trace"] = [
        {"stage": "note_init", "query": "q", "passage_ids": [], "note": "alpha beta gamma"},
        {"stage": "step", "step": 1, "note": "alpha delta gamma", "accepted": False, "failures": 1},
        {"stage": "step", "step": 2, "note": "alpha beta gamma epsilon", "accepted": True, "failures": 1},
        {"stage": "step", "step": 3, "note": None, "accepted": False, "failures": 2},
    ]
    lines[other] = json.dumps(known)
    (edited / "records.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "notes.html"
    assert main(["report", str(edited), "--html", str(out)]) == 0
    dom = browser_dom(out, tmp_path / "notes.png")

    steps = re.findall(r'<div class="notediff (acc|rej)">(.*?)</div></div>', card_of(dom, known["id"]), re.S)
    assert [kind for kind, _ in steps[:2]] == ["rej", "acc"]
    first, second = steps[0][1], steps[1][1]
    assert "note rejected" in first and marked(first, "del") == "beta" and marked(first, "ins") == "delta"
    assert "note accepted" in second and marked(second, "ins").strip() == "epsilon" and "<del>" not in second
    assert "+1 / −0 words" in second
    assert "no updated note (the update could not be parsed)" in card_of(dom, known["id"])

    # The scripted run's first question: every word its first step's note added is marked as inserted.
    init = next(e for e in real["trace"] if e["stage"] == "note_init")
    step = next(e for e in real["trace"] if e["stage"] == "step" and isinstance(e.get("note"), str))
    added = first_step_adds(real)
    real_steps = re.findall(
        r'<div class="notediff (?:acc|rej)">(.*?)</div></div>', card_of(dom, real["id"]), re.S
    )
    inserted = set(html.unescape(marked(real_steps[0], "ins")).split())
    assert added <= inserted
    assert f"+{len(step['note'].split()) - len(init['note'].split())} / −0 words" in real_steps[0]


def test_a_browser_shows_accuracy_against_cost_when_comparing_runs(runs, tmp_path, browser_dom):
    deepnote, hanrag = runs
    out = tmp_path / "compare.html"
    assert main(["report", str(deepnote), str(hanrag), "--html", str(out)]) == 0
    dom = browser_dom(out, tmp_path / "compare.png")
    assert "Accuracy vs cost" in dom
    summaries = [json.loads((run / "summary.json").read_text()) for run in (deepnote, hanrag)]
    charts = re.findall(r"<svg class=\"chart\".*?</svg>", dom, re.S)
    assert len(charts) == 2  # against tokens and against LM calls per question
    for chart in charts:
        assert len(re.findall(r"<circle ", chart)) == 2  # one point per run
    # A run that is both more accurate and no dearer dominates: only it is on the front.
    primary = summaries[0]["primary_metric"]
    (a, b) = (s["metrics"][primary] for s in summaries)
    (ta, tb) = (s["cost"]["input_tokens"] + s["cost"]["output_tokens"] for s in summaries)
    assert a > b and ta <= tb  # the scripted DeepNote run is right more often and cheaper than HANRAG
    assert charts[0].count('class="front"') == 1
    tip = f"{primary} {100 * a:.1f}, tokens per question {ta:,.0f}"
    assert tip in html.unescape(charts[0])


def test_a_report_fits_a_1280_px_window_with_readable_axes(runs, tmp_path, layout_at):
    """Two runs with non-default knobs, long folder names, costs in the hundred thousands and an answer with
    no space to break at: no horizontal scroll, every axis tick and label inside its drawing, the run
    selector inside the window, and labels that name only the knobs set away from the defaults."""
    deepnote, hanrag = runs
    first = tmp_path / "deepnote-on-hotpotqa-with-a-rather-long-run-folder-name-2026-11-26"
    second = tmp_path / "hanrag-on-hotpotqa-with-an-even-longer-run-folder-name-for-the-comparison"
    shutil.copytree(deepnote, first)
    shutil.copytree(hanrag, second)
    manifest = json.loads((second / "manifest.json").read_text())
    manifest["knobs"] = {**manifest["knobs"], "top_k": 7, "filter_threshold": 0.75}
    (second / "manifest.json").write_text(json.dumps(manifest))
    summary = json.loads((second / "summary.json").read_text())
    summary["cost"]["input_tokens"] = 123456.0
    (second / "summary.json").write_text(json.dumps(summary))
    lines = (first / "records.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["prediction"] = "x" * 400  # no space to wrap at
    lines[0] = json.dumps(record)
    (first / "records.jsonl").write_text("\n".join(lines) + "\n")

    out = tmp_path / "report.html"
    assert main(["report", str(first), str(second), "--html", str(out)]) == 0
    layout = layout_at(out, 1280)
    assert layout["labels"] == [
        f"deepnote [{first.name}]",
        f"hanrag (top_k=7, filter_threshold=0.75) [{second.name}]",
    ]
    assert layout["scroll"] <= layout["width"], layout["overflowing"]
    assert layout["overflowing"] == []
    assert layout["texts"] > 20 and layout["clipped"] == []
    assert layout["run"] <= layout["width"]


def test_a_run_label_names_only_the_knobs_changed_from_the_defaults(tmp_path):
    from ragsuite.evaluation import load_run
    from ragsuite.programs.catalog import entry

    run = tmp_path / "run"
    run.mkdir()
    defaults = dict(entry("hanrag").knobs)
    manifest = {"program": "hanrag", "dataset": "hotpotqa", "knobs": {**defaults, "keep": 4}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    row = load_run(run)
    assert row["program"] == "hanrag (keep=4)" and row["knobs"] == manifest["knobs"]
    manifest["knobs"] = defaults
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert load_run(run)["program"] == "hanrag"
    # A program the catalog does not know (registered by the user): every knob, since no default is known.
    manifest.update(program="mine", knobs={"depth": 2})
    (run / "manifest.json").write_text(json.dumps(manifest))
    assert load_run(run)["program"] == "mine (depth=2)"
