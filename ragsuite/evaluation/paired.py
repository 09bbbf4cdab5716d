"""Eval runs compared question by question: each run's scored questions, and every two runs of a dataset
compared metric by metric on the questions both scored (the paired difference, its 95% bootstrap interval
and the sign-flip p-value of :func:`ragsuite.stats.paired_test`). ``ragsuite report --paired`` and
``ragsuite eval --compare-uncompiled`` print these rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ragsuite.evaluation.store import RECORDS, read_records


def scored_questions(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Each finished question's metrics and type, by question id (failed questions are left out, as in the
    summary's means)."""
    if not (run_dir / RECORDS).is_file():
        return {}
    found = read_records(run_dir / RECORDS)
    return {
        qid: {"metrics": record["metrics"], "type": record.get("type") or "(no type)"}
        for qid, record in found.records.items()
        if not record.get("error") and isinstance(record.get("metrics"), dict)
    }


def run_label(row: dict[str, Any]) -> str:
    """``program [run folder]``: a run's name in a comparison."""
    return f"{row['program']} [{Path(row['dir']).name}]"


def paired_rows(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]], list[str]]:
    """Every two runs of the same dataset compared on the questions both scored, metric by metric."""
    from ragsuite.stats import paired_test

    header = ["A", "B", "metric", "n", "A", "B", "A - B", "95% CI", "p", "p < 0.05"]
    lines, notes = [], []
    scored = {row["dir"]: scored_questions(Path(row["dir"])) for row in rows}
    for i, a in enumerate(rows):
        for b in rows[i + 1 :]:
            if a["dataset"] != b["dataset"]:
                notes.append(f"{run_label(a)} and {run_label(b)} are on different datasets: not compared")
                continue
            common = sorted(scored[a["dir"]].keys() & scored[b["dir"]].keys())
            if not common:
                notes.append(f"{run_label(a)} and {run_label(b)} share no scored question: not compared")
                continue
            for metric in a.get("metrics") or {}:
                xs = [float(scored[a["dir"]][q]["metrics"].get(metric, 0.0)) for q in common]
                ys = [float(scored[b["dir"]][q]["metrics"].get(metric, 0.0)) for q in common]
                result = paired_test(xs, ys)
                lines.append(
                    [
                        run_label(a),
                        run_label(b),
                        metric,
                        str(result.n),
                        f"{100 * sum(xs) / len(xs):.1f}",
                        f"{100 * sum(ys) / len(ys):.1f}",
                        f"{100 * result.difference:+.1f}",
                        f"[{100 * result.low:+.1f}, {100 * result.high:+.1f}]",
                        f"{result.p_value:.3f}",
                        "*" if result.significant else "",
                    ]
                )
    return header, lines, notes
