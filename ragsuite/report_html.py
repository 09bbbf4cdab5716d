"""One self-contained HTML file for one or two eval runs: the summary with 95% intervals, the manifest, a
searchable and filterable list of questions, and each question's trace as the papers' case-study tables show
it (DeepNote steps with their queries, passages and notes, accepted or not; HANRAG routes, sub-questions and
filters; any other event with all its fields). A DeepNote or Adaptive-Note step's note is shown as a
word-level diff against the best note the step set out to improve (computed in the browser, by longest common
subsequence, for the questions on screen only). With two runs on the same questions, a comparison view lists
where they disagree and which one is right, with a paired test per metric, and each run's accuracy against
its cost. For ``ragsuite tune`` studies, :func:`write_tune_report` draws every trial's quality against each
cost with the Pareto front marked, and lists the front's trials with their knobs.

No network: styles and the script are inline, records are embedded as JSON and rendered page by page in the
browser, so a run of thousands of questions opens in seconds.

Example:
    >>> from ragsuite.report_html import write_report  # doctest: +SKIP
    >>> write_report([load_run(Path("runs/deepnote-hotpotqa"))], Path("report.html"))  # doctest: +SKIP
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ragsuite.files import atomic_write_text
from ragsuite.report_plots import Study, run_scatters, study_scatters, svg_scatter
from ragsuite.stats import bootstrap_ci, paired_test


def _asset(name: str) -> str:
    from importlib import resources

    return resources.files("ragsuite.assets").joinpath(name).read_text(encoding="utf-8")


def _read_run(run_dir: Path, row: dict[str, Any]) -> dict[str, Any]:
    from ragsuite.data.datasets import get_dataset_info
    from ragsuite.evaluation import MANIFEST, RECORDS, read_records

    manifest = json.loads((run_dir / MANIFEST).read_text(encoding="utf-8"))
    records = list(read_records(run_dir / RECORDS).records.values()) if (run_dir / RECORDS).is_file() else []
    primary = get_dataset_info(row["dataset"]).primary_metric
    for record in records:
        record["primary"] = primary
    return {
        "label": f"{row['program']} [{run_dir.name}]",
        "row": row,
        "manifest": manifest,
        "records": records,
    }


def _summary_html(run: dict[str, Any]) -> str:
    row, records = run["row"], run["records"]
    scored = [r for r in records if not r.get("error") and isinstance(r.get("metrics"), dict)]
    lines = ["<table><tr><th>metric</th><th>mean</th><th>95% CI</th><th>n</th></tr>"]
    for metric in row.get("metrics") or {}:
        values = [float(r["metrics"].get(metric, 0.0)) for r in scored]
        if values:
            low, high = bootstrap_ci(values)
            mean = f"{100 * sum(values) / len(values):.1f}"
            interval = f"[{100 * low:.1f}, {100 * high:.1f}]"
        else:
            mean = interval = "–"
        lines.append(
            f"<tr><td>{html.escape(metric)}</td><td class=num>{mean}</td><td>{interval}</td>"
            f"<td class=num>{len(values)}</td></tr>"
        )
    lines.append("</table>")
    cost = row.get("cost") or {}
    cells = "".join(
        f"<tr><td>{html.escape(k)}</td><td class=num>{'–' if v is None else f'{v:.2f}'}</td></tr>"
        for k, v in cost.items()
        if isinstance(v, (int, float)) or v is None
    )
    lines.append(f"<table><tr><th>cost per question</th><th></th></tr>{cells}</table>")
    lines.append(f"<p>{len(scored)} scored, {row.get('errors', 0)} failed.</p>")
    lines.append(
        _histogram("steps per question", [float((r.get("stats") or {}).get("steps", 0)) for r in scored])
    )
    by_type: dict[str, list[float]] = {}
    primary = scored[0]["primary"] if scored else None
    for record in scored:
        by_type.setdefault(record.get("type") or "(no type)", []).append(
            float(record["metrics"].get(primary, 0))
        )
    if primary and len(by_type) > 1:
        rows = "".join(
            f"<tr><td>{html.escape(t)}</td><td class=num>{len(v)}</td>"
            f"<td class=num>{100 * sum(v) / len(v):.1f}</td>"
            f"<td><span class=bar style='width:{int(200 * sum(v) / len(v))}px'></span></td></tr>"
            for t, v in sorted(by_type.items())
        )
        lines.append(
            f"<table><tr><th>type</th><th>n</th><th>{html.escape(primary)}</th><th></th></tr>{rows}</table>"
        )
    manifest = html.escape(json.dumps(run["manifest"], indent=2, ensure_ascii=False))
    lines.append(f"<details><summary>manifest</summary><pre>{manifest}</pre></details>")
    return "\n".join(lines)


def _histogram(title: str, values: Sequence[float], *, axis: str = "steps") -> str:
    """An inline SVG bar chart of the counts of each value: each count above its bar, each value under it
    and ``axis`` naming the values, all inside the drawing (the counts' row and the labels' rows have their
    own room above and below the bars)."""
    if not values:
        return ""
    counts: dict[float, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    keys = sorted(counts)
    most = max(counts.values())
    slot = max(40, 8 + 6.6 * max(len(f"{k:g}") for k in keys))  # a bar per slot, its value fits under it
    base, tall = 108, 90  # the bars' baseline and the tallest bar's height; counts above, labels below

    def bar(i: int, k: float) -> str:
        h = tall * counts[k] / most
        middle = 5 + i * slot + slot / 2
        return (
            f"<rect x='{5 + i * slot + 5:.0f}' y='{base - h:.0f}' width='{slot - 10:.0f}' height='{h:.0f}' "
            f"fill='#69c'/><text class=count x='{middle:.0f}' y='{base - h - 3:.0f}' text-anchor='middle'>"
            f"{counts[k]}</text><text x='{middle:.0f}' y='{base + 14}' text-anchor='middle'>"
            f"{k:g}</text>"
        )

    width = max(10 + len(keys) * slot, 20 + 6.6 * len(axis))
    caption = (
        f"<text x='{width / 2:.0f}' y='{base + 30}' text-anchor='middle' fill='#555'>"
        f"{html.escape(axis)}</text>"
    )
    bars = "".join(bar(i, k) for i, k in enumerate(keys))
    return (
        f"<p>{html.escape(title)}</p><svg class=histogram width='{width:.0f}' height='{base + 36}' "
        f"role='img' aria-label='{html.escape(title)}'>{bars}{caption}</svg>"
    )


def _comparison_html(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Where two runs on the same questions disagree, which one is right, and a paired test per metric."""
    if a["row"]["dataset"] != b["row"]["dataset"]:
        return "<p>The two runs are on different datasets: no comparison.</p>"
    by_a = {r["id"]: r for r in a["records"] if not r.get("error")}
    by_b = {r["id"]: r for r in b["records"] if not r.get("error")}
    common = sorted(by_a.keys() & by_b.keys())
    if not common:
        return "<p>The two runs share no scored question.</p>"
    lines = [f"<p>{len(common)} questions scored by both.</p>"]
    lines.append("<table><tr><th>metric</th><th>A</th><th>B</th><th>A − B</th><th>95% CI</th><th>p</th></tr>")
    for metric in a["row"].get("metrics") or {}:
        xs = [float(by_a[q]["metrics"].get(metric, 0)) for q in common]
        ys = [float(by_b[q]["metrics"].get(metric, 0)) for q in common]
        test = paired_test(xs, ys)
        mark = " *" if test.significant else ""
        lines.append(
            f"<tr><td>{html.escape(metric)}</td><td class=num>{100 * sum(xs) / len(xs):.1f}</td>"
            f"<td class=num>{100 * sum(ys) / len(ys):.1f}</td>"
            f"<td class=num>{100 * test.difference:+.1f}{mark}</td>"
            f"<td>[{100 * test.low:+.1f}, {100 * test.high:+.1f}]</td>"
            f"<td class=num>{test.p_value:.3f}</td></tr>"
        )
    lines.append("</table>")
    primary = a["records"][0]["primary"] if a["records"] else None
    rows = []
    for q in common:
        ra, rb = by_a[q], by_b[q]
        if (ra.get("prediction") or "") == (rb.get("prediction") or ""):
            continue
        sa, sb = ra["metrics"].get(primary, 0), rb["metrics"].get(primary, 0)
        winner = "A" if sa > sb else "B" if sb > sa else "neither"
        rows.append(
            # Free text (class t) may break anywhere, so an answer with no space cannot widen the page.
            f"<tr><td>{html.escape(q)}</td><td class=t>{html.escape(ra['question'])}</td>"
            f"<td class=t>{html.escape(ra.get('prediction') or '')}</td>"
            f"<td class=t>{html.escape(rb.get('prediction') or '')}</td>"
            f"<td class=t>{html.escape(' | '.join(ra.get('answers') or []))}</td><td>{winner}</td></tr>"
        )
    lines.append(f"<h3>{len(rows)} questions where the answers differ</h3>")
    lines.append(
        "<table id=disagreements><tr><th>id</th><th>question</th><th>A</th><th>B</th><th>gold</th>"
        f"<th>right ({html.escape(str(primary))})</th></tr>{''.join(rows)}</table>"
    )
    return "\n".join(lines)


def _embed(data: Any) -> str:
    """JSON safe inside a <script> element: every '<' is written as \\u003c, so no text can close or open
    a tag there (JSON.parse reads it back unchanged)."""
    return json.dumps(data, ensure_ascii=False).replace("<", "\\u003c")


def write_report(rows: Sequence[dict[str, Any]], out: Path) -> int:
    """Write the report of one run (or a comparison of two) to ``out``; returns its size in bytes.

    Args:
        rows: Each run's summary row as ``ragsuite report`` loads it (with its ``dir``).
        out: The HTML file to write.
    """
    from ragsuite.redaction import redact

    runs = [_read_run(Path(row["dir"]), row) for row in rows]
    style, script = (
        f"<style>{_asset('report.css')}</style></head><body>",
        f"<script>{_asset('report.js')}</script>",
    )
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>ragsuite report: {html.escape(', '.join(r['label'] for r in runs))}</title>",
        style,
        f"<h1>ragsuite report: {html.escape(', '.join(r['label'] for r in runs))}</h1>",
    ]
    for run in runs:
        parts.append(f"<h2>{html.escape(run['label'])} on {html.escape(run['row']['dataset'])}</h2>")
        parts.append(_summary_html(run))
    if len(runs) == 2:
        parts.append("<h2>Comparison (A = first run, B = second)</h2>")
        parts.append(_comparison_html(runs[0], runs[1]))
    if len(runs) > 1:
        scatters = run_scatters([r["row"] for r in runs], [r["label"] for r in runs])
        parts.append("<h2>Accuracy vs cost</h2><p>Each run's mean per question; red: not beaten on both.</p>")
        parts.append(f"<div class=charts>{''.join(svg_scatter(s) for s in scatters)}</div>")
    parts.append(
        "<h2>Questions</h2><div id=controls><select id=run></select><input id=search placeholder='search'>"
        "<select id=status><option value=''>any outcome</option><option>right</option><option>wrong</option>"
        "<option>partial</option><option>failed</option>"
        "<option value=fallback>fallback used</option></select>"
        "<select id=type></select><button onclick='move(-1)'>previous</button><button onclick='move(1)'>next"
        "</button> <span id=count></span></div><div id=list></div>"
    )
    data = [{"label": r["label"], "records": r["records"]} for r in runs]
    parts.append(f"<script type='application/json' id=data>{_embed(data)}</script>")
    parts.append(f"{script}</body></html>")
    # Records are redacted when written; a run written by an older version, or an error quoting a secret
    # configured since, is redacted here as well. The inline assets are ragsuite's own, left as they are.
    text = "\n".join(part if part in (style, parts[-1]) else redact(part) for part in parts)
    atomic_write_text(out, text)
    return len(text.encode("utf-8"))


def _value(objective: str, value: float | None) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.1f}" if objective == "quality" else f"{value:.2f}"


def _knobs(knobs: dict[str, Any] | None) -> str:
    return html.escape(", ".join(f"{k}={v}" for k, v in (knobs or {}).items()))


def _study_html(study: Study) -> str:
    """One tune study: quality against each cost with the Pareto front marked, the front's trials with their
    knobs, and every trial (collapsed)."""
    states: dict[str, int] = {}
    for trial in study.trials:
        states[str(trial.get("state"))] = states.get(str(trial.get("state")), 0) + 1
    counts = ", ".join(f"{n} {state.lower()}" for state, n in sorted(states.items()))
    named = [f"quality ({study.quality_metric})" if o == "quality" else o for o in study.objectives]
    head = "".join(f"<th>{html.escape(o)}</th>" for o in named)
    by_number = {t["number"]: t for t in study.trials}

    def row(trial: dict[str, Any]) -> str:
        values = trial.get("values") or [None] * len(study.objectives)
        cells = "".join(
            f"<td class=num>{_value(o, v)}</td>" for o, v in zip(study.objectives, values, strict=False)
        )
        chosen = " (written to best.json)" if trial["number"] == study.chosen else ""
        return (
            f"<tr><td>#{trial['number']}{chosen}</td><td>{html.escape(str(trial.get('state')))}</td>{cells}"
            f"<td>{_knobs(trial.get('knobs'))}</td></tr>"
        )

    title = "Pareto front" if len(study.objectives) > 1 else "Best trial"
    front_rows = "".join(row(by_number[n]) for n in study.front if n in by_number)
    all_rows = "".join(row(t) for t in study.trials)
    table = f"<tr><th>trial</th><th>state</th>{head}<th>knobs</th></tr>"
    where = f" of {html.escape(study.program)}" if study.program else ""
    on = f" on {html.escape(study.dataset)}" if study.dataset else ""
    return "\n".join(
        [
            f"<h2>Study {html.escape(study.name)}{where}{on}</h2>",
            f"<p>{len(study.trials)} trials ({html.escape(counts)}); objectives: "
            f"{html.escape(', '.join(study.objectives))} "
            f"(quality = {html.escape(study.quality_metric)}, in %; "
            f"costs are means per question, lower is better). Folder: {html.escape(str(study.path))}</p>",
            f"<div class=charts>{''.join(svg_scatter(s) for s in study_scatters(study))}</div>",
            f"<h3>{title} ({len(study.front)} trials)</h3><table class=front>{table}{front_rows}</table>",
            f"<details><summary>all {len(study.trials)} trials</summary>"
            f"<table>{table}{all_rows}</table></details>",
        ]
    )


def write_tune_report(studies: Sequence[Study], out: Path) -> int:
    """Write the report of ``ragsuite tune`` studies to ``out``; returns its size in bytes."""
    names = html.escape(", ".join(s.name for s in studies))
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>ragsuite tune report: {names}</title>",
        f"<style>{_asset('report.css')}</style></head><body>",
        f"<h1>ragsuite tune report: {names}</h1>",
        *(_study_html(study) for study in studies),
        "</body></html>",
    ]
    text = "\n".join(parts)
    atomic_write_text(out, text)
    return len(text.encode("utf-8"))


__all__ = ["write_report", "write_tune_report"]
