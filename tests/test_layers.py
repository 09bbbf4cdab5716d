"""Imports flow one way: signatures <- programs <- optimizers; retrieval and data below them; cli on top.
Checked on every import in the package, module-level or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ragsuite"

# layer -> the layers it must never import
FORBIDDEN = {
    "signatures": {"programs", "optimizers", "cli", "evaluate", "evaluation", "bench"},
    "programs": {"optimizers", "cli", "evaluate", "evaluation", "bench"},
    "optimizers": {"cli", "bench"},
    "align": {"cli", "bench"},
    "retrieval": {"signatures", "programs", "optimizers", "cli", "evaluate", "evaluation", "bench"},
    "data": {"signatures", "programs", "optimizers", "cli", "evaluate", "evaluation", "bench"},
}


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ragsuite."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.ImportFrom) and node.module == "ragsuite":
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("ragsuite."))
    return found


def test_no_layer_imports_a_layer_above_it() -> None:
    violations = []
    for layer, forbidden in FORBIDDEN.items():
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            bad = imports_of(path) & forbidden
            if bad:
                violations.append(f"{path.relative_to(PACKAGE)} imports {sorted(bad)}")
    assert not violations, "\n".join(violations)


def test_help_lists_programs_knobs_and_datasets_without_markup(capsys) -> None:
    import pytest

    from ragsuite import programs
    from ragsuite.cli import main

    for command in ("eval", "compile", "tune"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = capsys.readouterr().out
        assert "``" not in text and ":class:" not in text, command
        for name in programs.names():
            assert name in text, (command, name)
        assert "max_step=3" in text and "hotpotqa" in text and "2wikimultihopqa" in text, command
