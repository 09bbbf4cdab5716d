"""Check every published cell that ``ragsuite bench`` prints against the papers' text.

Reads the DeepNote and HANRAG texts (Markdown-style tables for DeepNote, space-separated rows for HANRAG),
extracts each table's cells as printed, and compares them with ``ragsuite/data/published.json``, cell by cell,
as text (so "49.12" must stay "49.12" and "44.0" must not become "44"). Also checks that the DeepNote rows the
paper prints twice (Table 1 and Tables 2/5) agree.

    python benchmarks/check_published.py PAPERS_DIR     # the directory with deepnote.txt and hanrag.txt

Exits 1 naming every cell that differs or is missing, 0 when all match.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CELL = re.compile(r"\d+\.\d+")
DN_COLUMNS = [
    (d, m)
    for d in ("hotpotqa", "2wikimultihopqa", "musique")
    for m in ("accuracy", "f1", "exact_match", "avg")
]
DN_COLUMNS += [("asqa", "str_em"), ("asqa", "str_hit"), ("asqa", "avg"), ("strategyqa", "yes_no_accuracy")]
HN_METRICS = ("exact_match", "f1", "accuracy", "steps")
DN_BACKBONES = {
    "qwen2.5-7b-instruct": "Qwen2.5-7B-Instruct",
    "qwen2.5-7b-instruct+dpo": "Qwen2.5-7B-Instruct+DPO",
    "llama3.1-8b-instruct": "Llama3.1-8B-Instruct",
    "llama3.1-8b-instruct+dpo": "Llama3.1-8B-Instruct+DPO",
    "gpt-4o-mini": "GPT-4o-mini",
    "llama3.1-70b-instruct": "Llama3.1-70B-Instruct",
}


def cells(line: str) -> list[str]:
    return [part.strip() for part in line.strip().strip("|").split("|") if part.strip()]


def row(values: list[str], columns: list[tuple[str, str]]) -> dict[str, dict[str, str]]:
    if len(values) != len(columns) or not all(CELL.fullmatch(v) for v in values):
        raise ValueError(f"not a row of {len(columns)} cells: {values}")
    out: dict[str, dict[str, str]] = {}
    for (dataset, metric), value in zip(columns, values, strict=True):
        out.setdefault(dataset, {})[metric] = value
    return out


def deepnote(lines: list[str]) -> dict[str, dict[str, dict]]:
    """{table id: {backbone: {row: cells}}} from DeepNote's text."""
    found: dict[str, dict[str, dict]] = {"deepnote-table1": {}, "deepnote-table4": {}}
    first = next(i for i, line in enumerate(lines) if line.startswith("| LLMs without Retrieval"))
    section = ""
    order = ["qwen2.5-7b-instruct", "llama3.1-8b-instruct", "gpt-4o-mini", "llama3.1-70b-instruct"]
    # Table 1's DeepNote rows, in print order: Qwen, Qwen+DPO, Llama-8B, Llama-8B+DPO, GPT-4o-mini, Llama-70B.
    deepnote_rows = iter(
        [*order[:1], "qwen2.5-7b-instruct+dpo", order[1], "llama3.1-8b-instruct+dpo", *order[2:]]
    )
    names = {"FLARE": "FLARE", "Self-RAG": "self-rag-prompted", "CoN": "con", "RAT": "rat", "ReAct": "react"}
    t1 = found["deepnote-table1"]
    for line in lines[first:]:
        parts = cells(line)
        if not parts or line.startswith("4 Experimental"):
            break
        if len(parts) == 1:
            section = parts[0]
            continue
        if len(parts) != 17:
            continue
        label, values = parts[0], row(parts[1:], DN_COLUMNS)
        if section.startswith("LLMs without"):
            t1.setdefault(order[[DN_BACKBONES[b] for b in order].index(label)], {})["no-retrieval"] = values
        elif section.startswith("Vanilla"):
            t1[order[[DN_BACKBONES[b] for b in order].index(label)]]["vanilla"] = values
        elif section.startswith("Baselines"):
            t1["gpt-4o-mini"][names[label.split(" (")[0]]] = values
        else:
            t1.setdefault(next(deepnote_rows), {})["deepnote"] = values
    # Table 5 (every backbone's ablations; Table 2 repeats two of them).
    start = next(i for i, line in enumerate(lines) if line.startswith("| Qwen2.5-7B-instruct | |"))
    heads = {"Qwen2.5-7B-instruct": "qwen2.5-7b-instruct", **{v: k for k, v in DN_BACKBONES.items()}}
    ablations = {
        "DeepNote": "deepnote",
        "w/o Adap. Retrieval": "deepnote-no-adaptive",
        "w/o Adap. Retrieval & Init. Note": "deepnote-no-adaptive-no-note",
    }
    backbone = None
    for line in lines[start : start + 16]:
        parts = cells(line)
        if len(parts) == 1:
            backbone = heads[parts[0]]
            continue
        values = row(parts[1:], DN_COLUMNS)
        if t1[backbone].setdefault(ablations[parts[0]], values) != values:
            raise ValueError(f"Table 5's {parts[0]} row of {backbone} differs from Table 1's")
    # Table 4 (max step x max failure).
    start = next(i for i, line in enumerate(lines) if line.startswith("| LLMs | Max Step"))
    for line in lines[start + 3 : start + 39]:
        parts = cells(line)
        if parts[0] in heads:
            backbone, parts = heads[parts[0]], parts[1:]
        found["deepnote-table4"].setdefault(backbone, {})[f"deepnote-step{parts[0]}-failure{parts[1]}"] = row(
            parts[2:], DN_COLUMNS
        )
    # Tables 6-7 (top-k): GPT-4o-mini, then Llama3.1-70B-Instruct.
    found["deepnote-table6-7"] = {}
    starts = [i for i, line in enumerate(lines) if line.startswith("| Top- | Methods")]
    for backbone, start in zip(["gpt-4o-mini", "llama3.1-70b-instruct"], starts, strict=True):
        rows, k = {}, None
        for line in lines[start + 3 : start + 9]:
            parts = cells(line)
            if parts[0].startswith("Top-"):
                k, parts = parts[0][4:], parts[1:]
            rows[f"{'vanilla' if parts[0] == 'Vanilla RAG' else 'deepnote'}-top{k}"] = row(
                parts[1:], DN_COLUMNS
            )
        found["deepnote-table6-7"][backbone] = rows
    # Table 8 (retrievers, multi-hop sets only).
    start = next(i for i, line in enumerate(lines) if line.startswith("| Top- | Retrievers"))
    found["deepnote-table8"] = {
        "llama3.1-70b-instruct": {
            "deepnote-bm25": row(cells(lines[start + 3])[2:], DN_COLUMNS[:12]),
            "deepnote-bge-base": row(cells(lines[start + 4])[1:], DN_COLUMNS[:12]),
        }
    }
    return found


def hanrag(lines: list[str]) -> dict[str, dict[str, dict]]:
    """{table id: {group: {row: cells}}}; group "shared" or the backbone ("llama-3.1-8b-instruct" for the
    HANRAG and HANRAG-Oracle rows, "flan-t5-xl" for HANRAG-Fair)."""
    names = {
        "No retrieval": ("shared", "no-retrieval"),
        "Single-step Approach": ("shared", "vanilla"),
        "IRCoT (ACL 2023)": ("shared", "ircot"),
        "Adaptive Retrieval (ACL 2023)": ("shared", "adaptive-retrieval"),
        "Self-RAG (ICLR 2024)": ("shared", "Self-RAG"),
        "Adaptive-RAG (NAACL 2024)": ("shared", "adaptive-rag"),
        "HANRAG": ("llama-3.1-8b-instruct", "hanrag"),
        "HANRAG-Fair": ("flan-t5-xl", "hanrag"),
        "HANRAG-Oracle": ("llama-3.1-8b-instruct", "hanrag-oracle"),
    }
    tables = {
        "hanrag-table1": ("Table 1:", ["squad", "nq", "triviaqa"], ["nq", "triviaqa"]),
        "hanrag-table2": ("Table 2:", ["musique", "hotpotqa", "2wikimultihopqa"], None),
        "hanrag-table3": ("Table 3:", ["squad", "nq", "triviaqa"], ["nq", "triviaqa"]),
        "hanrag-table4": ("Table 4:", ["musique", "hotpotqa", "2wikimultihopqa"], None),
    }
    found: dict[str, dict[str, dict]] = {}
    for table, (caption, datasets, kept) in tables.items():
        start = next(i for i, line in enumerate(lines) if line.startswith(caption))
        columns = [(d, m) for d in datasets for m in HN_METRICS]
        for line in lines[start + 3 :]:
            label = next((n for n in sorted(names, key=len, reverse=True) if line.startswith(n + " ")), None)
            if label is None:
                break
            group, name = names[label]
            values = row(line[len(label) :].split()[: len(columns)], columns)
            found.setdefault(table, {}).setdefault(group, {})[name] = {d: values[d] for d in kept or datasets}
    return found


def compare(published: dict, table: str, expected: dict[str, dict], problems: list[str]) -> None:
    source = published["tables"][table]
    stored = {
        "shared": source.get("rows", {}),
        **{b: info["rows"] for b, info in source["backbones"].items()},
    }
    for group in sorted(set(expected) | set(stored)):
        ours, theirs = stored.get(group, {}), expected.get(group, {})
        if ours != theirs:
            for name in sorted(set(ours) | set(theirs)):
                if ours.get(name) != theirs.get(name):
                    problems.append(
                        f"{table} {group} {name}: stored {ours.get(name)} != paper {theirs.get(name)}"
                    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("papers", type=Path, help="directory with deepnote.txt and hanrag.txt")
    args = parser.parse_args(argv)
    published = json.loads((ROOT / "ragsuite" / "data" / "published.json").read_text(encoding="utf-8"))
    problems: list[str] = []
    dn = deepnote((args.papers / "deepnote.txt").read_text(encoding="utf-8").splitlines())
    for table, expected in dn.items():
        compare(published, table, expected, problems)
    hn = hanrag((args.papers / "hanrag.txt").read_text(encoding="utf-8").splitlines())
    for table, expected in hn.items():
        compare(published, table, expected, problems)
    checked = set(dn) | set(hn)
    problems += [
        f"{t}: no extraction from the paper checks it" for t in published["tables"] if t not in checked
    ]
    for problem in problems:
        print(problem)
    cells_checked = sum(
        len(m) for t in dn.values() for rows in t.values() for r in rows.values() for m in r.values()
    ) + sum(len(m) for t in hn.values() for rows in t.values() for r in rows.values() for m in r.values())
    print(f"{cells_checked} cells checked; {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
