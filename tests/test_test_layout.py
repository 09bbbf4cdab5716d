"""The tests are laid out like the package, and no test module imports another.

A test module lives in the folder of the subpackage it tests (``tests/programs/`` for
``ragsuite/programs/``, ``tests/retrieval/colbert/`` for ``ragsuite/retrieval/colbert/``); tests of the
``benchmarks/`` scripts live in ``tests/benchmarks/``, tests of the documentation in ``tests/docs/``. Tests
of a top-level module (``ragsuite/lm.py``, ...) and checks of the package as a whole stay at ``tests/``,
each named in :data:`ROOT_TESTS`.

Helpers shared by several test modules are fixtures of a ``conftest.py`` (the folder's, or the root's when
several folders share them) or part of :mod:`ragsuite.testing`; ``tests/`` holds no other Python module
than test modules and conftest files (and the fixture-cutting script under ``tests/fixtures/``).

pytest imports the test modules in its default (``prepend``) mode and ``tests/`` has no ``__init__.py``:
each module is imported under its file name, so two test modules may not share a name, even in different
folders.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "ragsuite"

#: The test modules at the root of tests/, each with what it tests: a top-level module of the package, or
#: the package (or the test suite) as a whole. A module testing a subpackage goes to that subpackage's folder.
ROOT_TESTS: dict[str, str] = {
    "test_async.py": "ragsuite/aio.py",
    "test_bench.py": "ragsuite/bench.py",
    "test_docstring_examples.py": "the package",
    "test_errors.py": "ragsuite/errors.py",
    "test_files.py": "ragsuite/files.py",
    "test_layers.py": "the package",
    "test_lm.py": "ragsuite/lm.py",
    "test_lm_connections.py": "ragsuite/lm.py",
    "test_offline.py": "ragsuite/offline.py",
    "test_package_shape.py": "the package",
    "test_replicas.py": "ragsuite/lm_replicas.py",
    "test_report_html.py": "ragsuite/report_html.py",
    "test_report_plots.py": "ragsuite/report_plots.py",
    "test_report_stats.py": "ragsuite/stats.py",
    "test_test_layout.py": "the test suite",
}

#: Folders of tests/ that do not mirror a subpackage.
OTHER_FOLDERS = {"benchmarks", "docs", "fixtures"}


def python_files(tests: Path) -> list[Path]:
    return sorted(p for p in tests.rglob("*.py") if "__pycache__" not in p.parts)


def cross_imports(tests: Path) -> list[str]:
    """Every import, anywhere in a module under ``tests`` (a function body included), of another module of
    ``tests``: ``tests.x``, ``conftest``, a relative import, or a bare name of a module file under it."""
    files = python_files(tests)
    local = {p.stem for p in files} | {"tests", "conftest"}
    found = []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = ["." * node.level + (node.module or "")]
            else:
                continue
            for name in names:
                if name.startswith(".") or name.split(".")[0] in local:
                    found.append(f"{path.relative_to(tests.parent)}:{node.lineno} imports {name}")
    return found


def loose_modules(tests: Path) -> list[str]:
    """Python files under ``tests`` that are neither test modules nor conftest files."""
    return [
        str(p.relative_to(tests.parent))
        for p in python_files(tests)
        if not (p.name.startswith("test_") or p.name == "conftest.py") and p.parent.name != "fixtures"
    ]


def test_no_test_module_imports_another_module_of_tests() -> None:
    found = cross_imports(TESTS)
    advice = "share helpers as conftest.py fixtures or in ragsuite.testing instead:\n"
    assert not found, advice + "\n".join(found)


def test_tests_holds_only_test_modules_and_conftest_files() -> None:
    loose = loose_modules(TESTS)
    assert not loose, f"move these helpers into a conftest.py (as fixtures) or ragsuite.testing: {loose}"


def test_every_folder_mirrors_a_subpackage() -> None:
    folders = {
        p.relative_to(TESTS)
        for p in TESTS.rglob("*")
        if p.is_dir() and "__pycache__" not in p.parts and p.relative_to(TESTS).parts[0] not in OTHER_FOLDERS
    }
    stray = sorted(str(f) for f in folders if not (PACKAGE / f / "__init__.py").is_file())
    assert not stray, f"folders of tests/ that name no subpackage of ragsuite: {stray}"


def test_root_test_modules_test_top_level_modules_or_the_whole_package() -> None:
    at_root = {p.name for p in TESTS.glob("test_*.py")}
    unplaced = sorted(at_root - set(ROOT_TESTS))
    assert not unplaced, (
        f"{unplaced} sit at the root of tests/: move each into the folder of the subpackage it tests "
        "(tests/<subpackage>/), or name it in ROOT_TESTS if it tests a top-level module or the package"
    )
    gone = sorted(set(ROOT_TESTS) - at_root)
    assert not gone, f"ROOT_TESTS names test modules that are not at the root of tests/: {gone}"
    tested = {target for target in ROOT_TESTS.values() if target.startswith("ragsuite/")}
    assert all((PACKAGE.parent / target).is_file() for target in tested), tested


def test_test_module_names_are_unique_and_tests_is_no_package() -> None:
    names = Counter(p.name for p in python_files(TESTS) if p.name.startswith("test_"))
    assert not [name for name, n in names.items() if n > 1], names.most_common(3)
    assert not list(TESTS.rglob("__init__.py")), "tests/ is no package: pytest imports modules by file name"


# ---------------------------------------------------------------------------------- the checks' own test
def test_the_checks_find_a_cross_import_and_a_loose_helper(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    files = {
        "conftest.py": "import pytest\n",
        "helpers.py": "X = 1\n",
        "a/test_one.py": "def test_it():\n    from tests.a.test_two import f\n",
        "a/test_two.py": "import helpers\nfrom conftest import pytest\n\ndef f():\n    pass\n",
        "a/test_three.py": "from . import test_two\nimport os\nfrom ragsuite.testing import toys\n",
        "fixtures/make_fixtures.py": "import json\n",
    }
    for name, text in files.items():
        (tests / name).parent.mkdir(parents=True, exist_ok=True)
        (tests / name).write_text(text)
    assert cross_imports(tests) == [
        "tests/a/test_one.py:2 imports tests.a.test_two",
        "tests/a/test_three.py:1 imports .",
        "tests/a/test_two.py:1 imports helpers",
        "tests/a/test_two.py:2 imports conftest",
    ]
    assert loose_modules(tests) == ["tests/helpers.py"]
