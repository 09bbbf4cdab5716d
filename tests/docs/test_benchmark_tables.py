"""A table a benchmark script prints appears in the manual only as generated from committed records, between
``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` markers that the script's ``--docs`` option rewrites; a page
about a benchmark with no recorded run gives its command instead of pasted figures."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def columns(row: str) -> list[str]:
    """The cells of a Markdown table row, stripped."""
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def printed_headers() -> dict[str, list[list[str]]]:
    """Per benchmark script, the columns of every table header it prints (a string literal holding a
    Markdown row of three or more cells; implicitly concatenated literals count as one)."""
    headers: dict[str, list[list[str]]] = {}
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
            text = node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
            if text.lstrip().startswith("|") and "---" not in text and len(columns(text)) >= 3:
                headers.setdefault(script.name, []).append(columns(text))
    return headers


def tables_outside_markers(text: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, header columns) of every Markdown table of a page that no generated block holds (code
    fences are not tables)."""
    lines = text.split("\n")
    block, fence = None, False
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            fence = not fence
        marker = re.match(r"<!-- ([\w:-]+):(start|end) -->", line)
        if marker:
            block = marker.group(1) if marker.group(2) == "start" else None
        following = lines[number] if number < len(lines) else ""
        if not fence and block is None and line.startswith("|") and following.startswith("|-"):
            yield number, columns(line)


def pasted_tables(text: str, headers: dict[str, list[list[str]]]) -> list[tuple[int, str]]:
    """(line, script) of each table outside generated blocks whose columns are all columns of a header the
    script prints (a pasted table may have dropped some)."""
    return [
        (number, script)
        for number, shown in tables_outside_markers(text)
        for script, printed in headers.items()
        if any(set(shown) <= set(header) for header in printed)
    ]


def test_a_pasted_benchmark_table_is_found_and_a_generated_one_is_not() -> None:
    headers = {"bench.py": [["threads", "questions", "actual (s)", "efficiency"]]}
    table = "| threads | actual (s) | efficiency |\n|---|---|---|\n| 1 | 2.53 | 0.95 |\n"
    page = f"# P\n\n{table}\n<!-- bench:start -->\n{table}<!-- bench:end -->\n\n```\n{table}```\n"
    assert pasted_tables(page, headers) == [(3, "bench.py")]
    assert pasted_tables("| file | content |\n|---|---|\n| a | b |\n", headers) == []


def test_the_manual_holds_no_pasted_benchmark_table() -> None:
    headers = printed_headers()
    # The scan finds the scripts' printed headers (retrieval.py's: the table generated in docs/retrieval.md).
    assert {"replicas.py", "eval_throughput.py", "eval_engines.py", "retrieval.py"} <= set(headers)
    pasted = [
        f"docs/{page.relative_to(ROOT / 'docs')}:{number} from benchmarks/{script}"
        for page in sorted((ROOT / "docs").rglob("*.md"))
        for number, script in pasted_tables(page.read_text(encoding="utf-8"), headers)
    ]
    assert not pasted, (
        "tables pasted from benchmark output (generate them from committed records between markers, or give "
        "the command instead):\n" + "\n".join(pasted)
    )
