"""The report's plots: quality against cost with the Pareto front marked (the trials of a ``ragsuite tune``
study, or several eval runs), and the steps-per-question histogram.

Each plot is built once as data (:class:`Scatter`, a list of values for a histogram) and drawn two ways: as
inline SVG for the HTML report (plain Python, no dependency) and as a PNG file with matplotlib (the ``plot``
extra) for ``ragsuite report --png``. A point is on the Pareto front when no other point has at least its
quality at no more than its cost and is strictly better in one of the two.

Example:
    >>> from ragsuite.report_plots import Point, Scatter, pareto_flags, svg_scatter
    >>> pareto_flags([(1.0, 0.5), (2.0, 0.4), (2.0, 0.7)])
    [True, False, True]
    >>> svg = svg_scatter(Scatter("runs", "tokens", "f1", (Point(1.0, 0.5, "a", True),)))
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragsuite.errors import DataError, require


@dataclass(frozen=True)
class Point:
    """One trial or run: ``x`` its cost, ``y`` its quality (a fraction), ``front`` whether it is
    Pareto-optimal; ``label`` is drawn next to a front point, ``detail`` only shown in its tooltip."""

    x: float
    y: float
    label: str
    front: bool = False
    detail: str = ""


@dataclass(frozen=True)
class Scatter:
    """Quality (y, a fraction shown in percent) against one cost (x, lower is better)."""

    title: str
    x_label: str
    y_label: str
    points: tuple[Point, ...]
    note: str = ""


def pareto_flags(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For each ``(cost, quality)`` point, whether no other point dominates it (quality up, cost down)."""
    return [
        not any(
            (qj >= qi and cj <= ci) and (qj > qi or cj < ci) for j, (cj, qj) in enumerate(points) if j != i
        )
        for i, (ci, qi) in enumerate(points)
    ]


# ------------------------------------------------------------------------------------------- SVG
def _ticks(low: float, high: float, count: int = 5) -> tuple[float, float, list[float]]:
    """A padded range and round tick values covering ``[low, high]``."""
    if not (math.isfinite(low) and math.isfinite(high)):
        low = high = 0.0
    if high - low < 1e-12:
        pad = abs(low) * 0.1 or 1.0
        low, high = low - pad, high + pad
    else:  # a margin, so that points on the extremes are not cut by the frame
        pad = 0.04 * (high - low)
        low, high = low - pad, high + pad
    raw = (high - low) / count
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if raw <= m * step)
    start, end = math.floor(low / step) * step, math.ceil(high / step) * step
    ticks = [start + i * step for i in range(round((end - start) / step) + 1)]
    return start, end, ticks


def _num(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


#: Width of one character of the charts' 11 px sans-serif text, a little above the average, so that an
#: estimate errs towards room to spare.
_CHAR_PX = 6.6


def _text_width(text: str) -> float:
    """The estimated width in pixels of ``text`` in the charts' font."""
    return _CHAR_PX * len(text)


def _fit(text: str, room: float) -> str:
    """``text``, cut to fit ``room`` pixels with an ellipsis when it is longer."""
    if _text_width(text) <= room:
        return text
    keep = max(1, int(room / _CHAR_PX) - 1)
    return text[:keep] + "…"


def svg_scatter(scatter: Scatter, *, width: int = 470, height: int = 320) -> str:
    """The scatter as an inline ``<svg>``: grey points, the Pareto front in red joined by a line and labelled,
    each point's label and values in its tooltip."""
    points = scatter.points
    if not points:
        return f"<p>{html.escape(scatter.title)}: nothing to plot. {html.escape(scatter.note)}</p>"
    x0, x1, xticks = _ticks(min(p.x for p in points), max(p.x for p in points))
    y0, y1, yticks = _ticks(min(p.y for p in points) * 100, max(p.y for p in points) * 100)
    # Margins wide enough for the tick labels: the y labels end 5 px left of the frame, after the rotated
    # axis title; the last x label is centred on the frame's right edge.
    left = max(56, 24 + 5 + _text_width(max((_num(t) for t in yticks), key=len)))
    right = max(14, 2 + _text_width(_num(xticks[-1])) / 2)
    top, bottom = 26, 44

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (width - left - right)

    def sy(y: float) -> float:
        return height - bottom - (100 * y - y0) / (y1 - y0) * (height - top - bottom)

    parts = [
        f"<svg class=chart width={width} height={height} role=img aria-label='{html.escape(scatter.title)}'>",
        f"<text x={left} y=14 font-weight=bold>{html.escape(scatter.title)}</text>",
        f"<rect x={left} y={top} width={width - left - right} height={height - top - bottom} fill=none "
        "stroke='#bbb'/>",
    ]
    for t in xticks:
        x = left + (t - x0) / (x1 - x0) * (width - left - right)
        parts.append(
            f"<line x1={x:.1f} x2={x:.1f} y1={top} y2={height - bottom} stroke='#eee'/>"
            f"<text x={x:.1f} y={height - bottom + 14} text-anchor=middle>{_num(t)}</text>"
        )
    for t in yticks:
        y = height - bottom - (t - y0) / (y1 - y0) * (height - top - bottom)
        parts.append(
            f"<line x1={left} x2={width - right} y1={y:.1f} y2={y:.1f} stroke='#eee'/>"
            f"<text x={left - 5} y={y + 4:.1f} text-anchor=end>{_num(t)}</text>"
        )
    parts.append(
        f"<text x={(left + width - right) / 2:.0f} y={height - 8} text-anchor=middle>"
        f"{html.escape(scatter.x_label)}</text>"
        f"<text transform='translate(13,{(top + height - bottom) / 2:.0f}) rotate(-90)' text-anchor=middle>"
        f"{html.escape(scatter.y_label)} (%)</text>"
    )
    front = sorted((p for p in points if p.front), key=lambda p: (p.x, -p.y))
    if len(front) > 1:
        path = " ".join(f"{sx(p.x):.1f},{sy(p.y):.1f}" for p in front)
        parts.append(f"<polyline points='{path}' fill=none stroke='#d1495b' stroke-width='1.5'/>")
    for p in sorted(points, key=lambda p: p.front):  # the front drawn last, on top
        name = f"{p.label} {p.detail}".strip()
        tip = html.escape(f"{name}: {scatter.y_label} {100 * p.y:.1f}, {scatter.x_label} {_num(p.x)}")
        color, radius, kind = ("#d1495b", 5, "front") if p.front else ("#9aa5b1", 4, "other")
        parts.append(
            f"<circle class={kind} cx={sx(p.x):.1f} cy={sy(p.y):.1f} r={radius} fill='{color}'>"
            f"<title>{tip}</title></circle>"
        )
    # Front points with the same scores share one label: "#13 (+2)".
    labels: dict[tuple[float, float], list[str]] = {}
    for p in front:
        labels.setdefault((p.x, p.y), []).append(p.label)
    for (x, y), names in labels.items():
        more = f" (+{len(names) - 1})" if len(names) > 1 else ""
        # Labels right of the middle are drawn to the left of their point, so they stay inside the chart;
        # one longer than the room there is cut short (the point's tooltip has it whole).
        anchor, dx = ("end", -6) if sx(x) > (left + width - right) / 2 else ("start", 6)
        room = sx(x) - 6 - 2 if anchor == "end" else width - sx(x) - 6 - 2
        text = _fit(names[0], room - _text_width(more)) + more
        parts.append(
            f"<text x={sx(x) + dx:.1f} y={sy(y) - 6:.1f} text-anchor={anchor} fill='#a02'>"
            f"{html.escape(text)}</text>"
        )
    parts.append("</svg>")
    note = f"<p class=note>{html.escape(scatter.note)}</p>" if scatter.note else ""
    return f"<figure>{''.join(parts)}{note}</figure>"


# ------------------------------------------------------------------------------------------- PNG
def require_matplotlib(feature: str = "ragsuite report --png") -> Any:
    """matplotlib's Figure and Agg canvas, or :class:`MissingExtraError` naming ``feature`` and the ``plot``
    extra."""
    figure = require("matplotlib.figure", extra="plot", feature=feature)
    backend = require("matplotlib.backends.backend_agg", extra="plot", feature=feature)
    return figure.Figure, backend.FigureCanvasAgg


def png_scatters(
    scatters: Sequence[Scatter], path: Path, *, title: str = "", feature: str = "ragsuite report --png"
) -> Path:
    """The scatters side by side in one PNG file (``feature`` names what needs matplotlib, for its error)."""
    figure_class, canvas = require_matplotlib(feature)
    figure = figure_class(figsize=(5.2 * len(scatters), 4.2), dpi=110)
    canvas(figure)  # the Agg canvas renders without touching pyplot's global backend
    axes = figure.subplots(1, len(scatters), squeeze=False)[0]
    for axis, scatter in zip(axes, scatters, strict=True):
        others = [p for p in scatter.points if not p.front]
        front = sorted((p for p in scatter.points if p.front), key=lambda p: (p.x, -p.y))
        axis.scatter([p.x for p in others], [100 * p.y for p in others], c="#9aa5b1", s=22, label="other")
        axis.plot(
            [p.x for p in front], [100 * p.y for p in front], "o-", c="#d1495b", ms=6, label="Pareto front"
        )
        labels: dict[tuple[float, float], list[str]] = {}
        for p in front:
            labels.setdefault((p.x, p.y), []).append(p.label)
        for (x, y), names in labels.items():
            text = names[0] + (f" (+{len(names) - 1})" if len(names) > 1 else "")
            axis.annotate(text, (x, 100 * y), textcoords="offset points", xytext=(5, 4), fontsize=8)
        axis.set_title(scatter.title, fontsize=9)
        axis.set_xlabel(scatter.x_label)
        axis.set_ylabel(f"{scatter.y_label} (%)")
        axis.grid(alpha=0.3)
        axis.legend(loc="best", fontsize=8)
    if title:
        figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


def png_histogram(title: str, values: Sequence[float], path: Path) -> Path:
    """A bar per distinct value with its count, as a PNG file."""
    figure_class, canvas = require_matplotlib()
    counts: dict[float, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    keys = sorted(counts)
    figure = figure_class(figsize=(5.2, 3.6), dpi=110)
    canvas(figure)
    axis = figure.subplots()
    bars = axis.bar([f"{k:g}" for k in keys], [counts[k] for k in keys], color="#69c")
    axis.bar_label(bars, fontsize=8)
    axis.set_title(title, fontsize=10)
    axis.set_xlabel("steps")
    axis.set_ylabel("questions")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


# ------------------------------------------------------------------------------------------- eval runs
def _tokens(cost: dict[str, Any]) -> float | None:
    if cost.get("input_tokens") is None or cost.get("output_tokens") is None:
        return None
    return float(cost["input_tokens"]) + float(cost["output_tokens"])


def run_scatters(rows: Sequence[dict[str, Any]], labels: Sequence[str]) -> list[Scatter]:
    """Each run's primary metric against tokens and against LM calls per question, one pair of scatters per
    dataset; runs without the figure (no question scored) are left out and named in the note. A point is
    labelled with its run's folder name; ``labels`` (program and knobs) go to its tooltip."""
    from ragsuite.data.datasets import get_dataset_info

    scatters = []
    datasets = list(dict.fromkeys(row["dataset"] for row in rows))
    for dataset in datasets:
        primary = get_dataset_info(dataset).primary_metric
        group = [(row, label) for row, label in zip(rows, labels, strict=True) if row["dataset"] == dataset]
        for cost_name, cost_of in (
            ("tokens per question", lambda c: _tokens(c)),
            ("LM calls per question", lambda c: c.get("lm_calls")),
        ):
            found, missing = [], []
            for row, label in group:
                quality, cost = (row.get("metrics") or {}).get(primary), cost_of(row.get("cost") or {})
                if quality is None or cost is None:
                    missing.append(label)
                else:
                    found.append((float(cost), float(quality), label, row))
            flags = pareto_flags([(c, q) for c, q, _, _ in found])
            points = tuple(
                Point(c, q, Path(row["dir"]).name, flag, label)
                for (c, q, label, row), flag in zip(found, flags, strict=True)
            )
            note = f"not plotted (no scored question): {', '.join(missing)}" if missing else ""
            title = f"{primary} vs {cost_name}" + (f" ({dataset})" if len(datasets) > 1 else "")
            scatters.append(Scatter(title, cost_name, primary, points, note))
    return scatters


# ------------------------------------------------------------------------------------------- tune studies
@dataclass
class Study:
    """The files ``ragsuite tune`` wrote for one study (its folder ``OUT/STUDY``)."""

    name: str
    path: Path
    objectives: list[str]
    quality_metric: str
    trials: list[dict[str, Any]]
    front: list[int]
    chosen: int | None = None
    program: str = ""
    dataset: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> list[dict[str, Any]]:
        return [t for t in self.trials if t.get("state") == "COMPLETE" and t.get("values")]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise DataError(
            f"{path} is not valid JSON ({exc}); rerun the tune command to write it again"
        ) from exc


def _load_study(folder: Path) -> Study:
    trials = _read_json(folder / "trials.json")
    if not isinstance(trials, list):
        raise DataError(f"{folder / 'trials.json'} is not a list of trials; is {folder} a tune study folder?")
    best = _read_json(folder / "best.json") if (folder / "best.json").is_file() else {}
    tuning = ((best.get("metadata") or {}).get("tuning") or {}) if isinstance(best, dict) else {}
    pareto = _read_json(folder / "pareto.json") if (folder / "pareto.json").is_file() else None
    objectives = list((pareto or {}).get("objectives") or tuning.get("objectives") or ["quality"])
    done = [t for t in trials if t.get("state") == "COMPLETE" and t.get("values")]
    if pareto is not None:
        front = [int(t["number"]) for t in pareto.get("front") or []]
    elif done:
        top = max(t["values"][0] for t in done)  # one objective: the best trial alone
        front = [min(t["number"] for t in done if t["values"][0] == top)]
    else:
        front = []
    return Study(
        name=str((pareto or {}).get("study") or tuning.get("study") or folder.name),
        path=folder,
        objectives=objectives,
        quality_metric=str(tuning.get("quality_metric") or "quality"),
        trials=trials,
        front=front,
        chosen=tuning.get("trial"),
        program=str(best.get("program", "")) if isinstance(best, dict) else "",
        dataset=str(tuning.get("dataset") or ""),
    )


def find_studies(path: Path) -> list[Study] | None:
    """The studies in a tune directory: a study folder (``OUT/STUDY``, with ``trials.json``) or a
    ``ragsuite tune --out`` directory holding study folders. None when ``path`` is neither."""
    if (path / "trials.json").is_file():
        return [_load_study(path)]
    folders = sorted(p.parent for p in path.glob("*/trials.json")) if path.is_dir() else []
    if folders:
        return [_load_study(folder) for folder in folders]
    if (path / "study.db").is_file():
        raise DataError(
            f"{path} holds a tune study but no trials.json: the files are written when `ragsuite tune` "
            "finishes; run the same tune command again (it resumes) to write them"
        )
    return None


def _knob_text(knobs: dict[str, Any] | None) -> str:
    return "(" + ", ".join(f"{k}={v}" for k, v in (knobs or {}).items()) + ")" if knobs else ""


def study_scatters(study: Study) -> list[Scatter]:
    """Quality against each cost objective, the Pareto front marked. A one-objective study is shown against
    tokens per question, with its best trial marked."""
    front = set(study.front)
    quality = f"{study.quality_metric}"
    scatters = []
    costs = study.objectives[1:]
    if costs:
        for i, cost in enumerate(costs, start=1):
            points = tuple(
                Point(
                    float(t["values"][i]),
                    float(t["values"][0]),
                    f"#{t['number']}",
                    t["number"] in front,
                    _knob_text(t.get("knobs")),
                )
                for t in study.complete
                if len(t["values"]) > i
            )
            scatters.append(Scatter(f"{quality} vs {cost}", f"{cost} per question", quality, points))
    else:
        found = [(t, _tokens(t.get("cost") or {})) for t in study.complete]
        points = tuple(
            Point(
                tokens,
                float(t["values"][0]),
                f"#{t['number']}",
                t["number"] in front,
                _knob_text(t.get("knobs")),
            )
            for t, tokens in found
            if tokens is not None
        )
        note = "one objective: the best trial is marked (there is no cost objective, so no Pareto front)"
        scatters.append(Scatter(f"{quality} vs tokens", "tokens per question", quality, points, note))
    return scatters


def safe_name(text: str) -> str:
    """``text`` made safe as part of a file name."""
    return re.sub(r"[^A-Za-z0-9._+=-]", "_", text).strip("._") or "plot"


__all__ = [
    "Point",
    "Scatter",
    "Study",
    "find_studies",
    "pareto_flags",
    "png_histogram",
    "png_scatters",
    "require_matplotlib",
    "run_scatters",
    "safe_name",
    "study_scatters",
    "svg_scatter",
]
