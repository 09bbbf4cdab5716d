"""Package-wide shape checks: properties of the source itself rather than of any one module's behaviour."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ragsuite"
# A function longer than this no longer reads on one screen or two; split it into named parts.
MAX_FUNCTION_LINES = 150


def function_lengths(path: Path) -> list[tuple[str, int, int]]:
    """(qualified name, first line, length) of every function and method in ``path``, nested ones included;
    a function's length runs from its ``def`` line to its last line, decorators excluded."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                found.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), "")
    return found


def test_function_lengths_are_measured_without_decorators(tmp_path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "@decorate\n@another\ndef f():\n    x = 1\n    return x\n\n\n"
        "class C:\n    def g(self):\n        pass\n"
    )
    assert function_lengths(source) == [("f", 3, 3), ("C.g", 9, 2)]


def test_no_function_in_the_package_is_over_150_lines() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert modules, PACKAGE
    long = [
        f"{path.relative_to(PACKAGE.parent)}:{line} {name} ({length} lines)"
        for path in modules
        for name, line, length in function_lengths(path)
        if length > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)
