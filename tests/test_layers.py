"""Imports flow one way: no import circle among ragsuite's modules, and every layer imports only layers below
it (the drawing is in docs/architecture.md).

Checked on every ``import`` statement in the package: module-level, inside a function, or under
``TYPE_CHECKING``. ``from ragsuite.x import y`` counts as importing the module ``ragsuite.x.y`` when ``y`` is
one, else ``ragsuite.x``. Registries that import modules by name (the CLI's command list, the program
registry) are dispatch tables, not import statements, and are not followed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ragsuite"

#: The layers, lowest first: a module may import its own part of the package and the parts of lower layers,
#: never a part of its own layer or of a layer above. A part is a top-level module or subpackage of ragsuite.
LAYERS: list[set[str]] = [
    {"errors"},
    {"offline", "network"},
    {"paths", "redaction", "files", "processes", "passages", "aio", "stats", "tables", "lm_client", "assets"},
    {"data", "local_lm"},
    {"retrieval", "lm_replicas"},
    {"lm", "signatures"},
    {"programs", "report_plots"},
    {"evaluation"},
    {"optimizers", "align", "report_html", "bench"},
    {"cli", "testing"},
    {"__main__"},
]

#: Inside a part, modules that must stay below others of the same part: (lower, higher). The lower module
#: may not import the higher one, even inside a function.
WITHIN: list[tuple[str, str]] = [
    ("ragsuite.programs.program_format", "ragsuite.programs.base"),
    ("ragsuite.programs.base", "ragsuite.programs.program_file"),
    ("ragsuite.programs.stages", "ragsuite.programs.program_file"),
    ("ragsuite.programs.pipeline", "ragsuite.programs.program_file"),
    ("ragsuite.retrieval.bm25_numba", "ragsuite.retrieval.bm25_kernel"),
    ("ragsuite.cli.args", "ragsuite.cli.eval"),
    ("ragsuite.cli.args", "ragsuite.cli.compile"),
]


def module_files(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` (a package is its ``__init__.py``)."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """``name``, or the nearest enclosing module of the package (``ragsuite.x.Y`` -> ``ragsuite.x``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``module`` imports anywhere in its file."""
    path = modules[module]
    root = next(iter(modules)).split(".")[0]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == root or alias.name.startswith(root + "."):
                    found.add(_known(alias.name, modules) or root)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # a relative import
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source != root and not source.startswith(root + "."):
                continue
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in modules else (_known(source, modules) or root))
    found.discard(module)
    return found


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    modules = module_files(package)
    return {module: imports_of(module, modules) for module in modules}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle (``a -> b -> ... -> a``) per group of modules that import each other."""
    return [_circle_in(group, graph) for group in tangles(graph)]


def describe(graph: dict[str, set[str]]) -> str:
    """Each circle, then every import between the modules of its group (all of them need untangling)."""
    lines = []
    for group in tangles(graph):
        lines.append(" -> ".join(_circle_in(group, graph)))
        lines += [f"    {a} imports {b}" for a in sorted(group) for b in sorted(graph[a] & group)]
    return "\n".join(lines)


def tangles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def _circle_in(group: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from the group's first module back to itself, through the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & group):
                if target == start:
                    return [*paths[node], start]
                if target not in paths:
                    paths[target] = [*paths[node], target]
                    following.append(target)
        frontier = following
    raise AssertionError(f"no circle through {start}")  # Tarjan's group always holds one


def part_of(module: str) -> str:
    """``ragsuite.retrieval.bm25`` -> ``retrieval``; the root package is its own part, ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of(part: str) -> int:
    for level, layer in enumerate(LAYERS):
        if part in layer:
            return level
    raise KeyError(part)


# ------------------------------------------------------------------------------------- the package itself
def test_no_import_circle() -> None:
    graph = import_graph()
    assert not cycles(graph), "import circles:\n" + describe(graph)


def test_every_part_has_a_layer() -> None:
    parts = {part_of(module) for module in module_files(PACKAGE)} - {""}
    unplaced = sorted(part for part in parts if not any(part in layer for layer in LAYERS))
    assert not unplaced, f"place these parts of ragsuite in LAYERS (and docs/architecture.md): {unplaced}"


def test_no_layer_imports_its_own_layer_or_one_above() -> None:
    violations = []
    for module, targets in sorted(import_graph().items()):
        if not part_of(module):
            continue  # the root package: see test_the_root_package_is_a_thin_front
        for target in sorted(targets):
            if not part_of(target) or part_of(target) == part_of(module):
                continue
            if layer_of(part_of(target)) >= layer_of(part_of(module)):
                violations.append(f"{module} imports {target}")
    assert not violations, "imports against the layer order (LAYERS, lowest first):\n" + "\n".join(violations)


def test_the_root_package_is_a_thin_front() -> None:
    """``ragsuite/__init__.py`` holds ``__version__`` (which any module may import) and a lazy ``load``: it
    imports nothing of ragsuite when it is imported, so importing ``__version__`` drags in no layer."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    eager = [
        ast.unparse(node)
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ragsuite")
    ]
    assert not eager, eager
    modules = module_files(PACKAGE)
    for module in modules:
        for node in ast.walk(ast.parse(modules[module].read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "ragsuite":
                names = {alias.name for alias in node.names} - {"__version__"}
                assert all(f"ragsuite.{name}" in modules for name in names), (module, names)


def test_lower_modules_of_a_part_do_not_import_higher_ones() -> None:
    graph = import_graph()
    for lower, higher in WITHIN:
        assert lower in graph and higher in graph, (lower, higher)  # the rule names real modules
    violations = [f"{lower} imports {higher}" for lower, higher in WITHIN if higher in graph[lower]]
    assert not violations, "\n".join(violations)


def test_cli_commands_take_shared_flags_from_cli_args() -> None:
    """The shared flag groups and builders live in ragsuite.cli.args; no command module imports another
    command's module for them."""
    graph = import_graph()
    shared = {"ragsuite.cli.eval", "ragsuite.cli.compile"}
    importers = sorted(
        module for module, targets in graph.items() if targets & shared and module != "ragsuite.cli"
    )
    assert not importers, importers
    assert not {t for t in graph["ragsuite.cli.args"] if t.startswith("ragsuite.cli.")} - {
        "ragsuite.cli.help_text"
    }


def test_cli_commands_never_import_each_other() -> None:
    """A command module imports the shared modules of the CLI (args, help_text, ...), never another command:
    what two commands share moves down to ``ragsuite.cli.args`` or below the CLI."""
    from ragsuite.cli import COMMAND_MODULES

    graph = import_graph()
    commands = set(COMMAND_MODULES)
    assert commands <= set(graph), sorted(commands - set(graph))  # the dispatch table names real modules
    crossing = [
        f"{module} imports {target}"
        for module in sorted(commands)
        for target in sorted(graph[module] & commands)
    ]
    assert not crossing, "command modules importing each other:\n" + "\n".join(crossing)


def test_the_stage_kinds_the_base_names_are_the_stage_classes() -> None:
    """The program base names the stage kinds without importing the stages module above it."""
    from ragsuite.programs.base import STAGE_KINDS
    from ragsuite.programs.stages import STAGE_TYPES, BlendStage, FilterStage

    assert STAGE_TYPES == {"filter": FilterStage, "blend": BlendStage}
    assert tuple(STAGE_TYPES) == STAGE_KINDS


# ---------------------------------------------------------------------------------- the checker's own test
def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "ragsuite"


def test_a_circle_through_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    package = write_package(
        tmp_path,
        {
            "ragsuite/__init__.py": "",
            "ragsuite/low.py": "def f():\n    from ragsuite.high import g\n",
            "ragsuite/high.py": "from ragsuite import low\n",
            "ragsuite/pkg/__init__.py": "from ragsuite.pkg.a import A\n",
            "ragsuite/pkg/a.py": "A = 1\n",
            "ragsuite/pkg/b.py": "from ragsuite.pkg import A\n",
        },
    )
    graph = import_graph(package)
    assert graph["ragsuite.high"] == {"ragsuite.low"}  # `from ragsuite import low` is the module ragsuite.low
    assert graph["ragsuite.pkg.b"] == {"ragsuite.pkg"}  # a name from a package is the package's __init__
    assert cycles(graph) == [["ragsuite.high", "ragsuite.low", "ragsuite.high"]]


def test_a_circle_under_type_checking_or_relative_is_found(tmp_path: Path) -> None:
    package = write_package(
        tmp_path,
        {
            "ragsuite/__init__.py": "",
            "ragsuite/x/__init__.py": "",
            "ragsuite/x/one.py": "import typing\nif typing.TYPE_CHECKING:\n    from .two import T\n",
            "ragsuite/x/two.py": "import ragsuite.x.one\nT = 1\n",
        },
    )
    assert cycles(import_graph(package)) == [["ragsuite.x.one", "ragsuite.x.two", "ragsuite.x.one"]]


def test_help_lists_programs_knobs_and_datasets_without_markup(capsys) -> None:
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
