"""``ragsuite --help`` and every subcommand's ``--help`` stay light: they import neither dspy nor torch, and
the programs epilog is read from a static catalog that must agree with the real registry."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from ragsuite.cli import COMMANDS

HEAVY = ("dspy", "torch", "litellm", "transformers", "optuna")

# Runs in a fresh interpreter: prints each command path's --help through main() in turn (the top level
# first) and reports, per path, which heavy modules and command modules were loaded by then; finally builds
# the full parser (every command registered) and reports again.
_PROBE = """
import contextlib, io, json, sys
from ragsuite.cli import build_parser, main

heavy, paths = json.loads(sys.argv[1]), json.loads(sys.argv[2])
report = []
for path in paths:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main([*path, "--help"])
        except SystemExit:
            pass
    loaded = [m for m in heavy if m in sys.modules]
    commands = sorted(m for m in sys.modules if m.startswith("ragsuite.cli."))
    report.append({"path": path, "loaded": loaded, "commands": commands, "help": out.getvalue()})
build_parser()
loaded = [m for m in heavy if m in sys.modules]
report.append({"path": ["(full parser)"], "loaded": loaded, "commands": [], "help": "usage: ragsuite"})
print(json.dumps(report))
"""


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[list[str]]:
    """Every command path of ``parser``: [], ["eval"], ["align", "build"], ..."""
    found = [list(prefix)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += command_paths(sub, (*prefix, name))
    return found


def test_help_of_every_command_imports_neither_dspy_nor_torch(repo_root) -> None:
    from ragsuite.cli import build_parser

    paths = command_paths(build_parser())
    # The walk reached the top level, every command and nested actions (align build, data list, ...).
    assert [] in paths and ["eval"] in paths and ["align", "build"] in paths and ["align", "train"] in paths
    assert len(paths) >= 14
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(HEAVY), json.dumps(paths)],
        capture_output=True,
        text=True,
        cwd=repo_root,
        timeout=120,
        check=True,
    )
    report = json.loads(done.stdout)
    for r in report:
        assert r["help"].startswith("usage: ragsuite"), r["path"]
    offenders = {" ".join(r["path"]) or "ragsuite": r["loaded"] for r in report if r["loaded"]}
    assert not offenders, f"--help imported heavy modules: {offenders}"
    # The top-level help builds no command's parser: it lists them from the static table.
    top = report[0]
    assert top["path"] == [] and top["commands"] == []
    for name, _, help_line in COMMANDS:
        assert name in top["help"] and help_line.split()[0] in top["help"]
    eval_help = next(r["help"] for r in report if r["path"] == ["eval"])
    assert "max_step=3" in eval_help and "DeepNote: collect knowledge in a note" in eval_help


def test_command_table_matches_each_commands_own_help_line() -> None:
    from ragsuite.cli import build_parser

    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    registered = [(choice.dest, choice.help) for choice in subparsers._choices_actions]
    assert registered == [(name, help_line) for name, _, help_line in COMMANDS]


def test_main_builds_only_the_command_it_runs() -> None:
    from ragsuite.cli import build_parser, command_of

    assert command_of(["-vv", "eval", "--program", "x"]) == "eval"
    assert command_of(["--help"]) == "" and command_of([]) == ""
    parser = build_parser(only="report")
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    # report is built in full; eval is listed only (no options of its own).
    assert any("--html" in a.option_strings for a in subparsers.choices["report"]._actions)
    assert not any("--program" in a.option_strings for a in subparsers.choices["eval"]._actions)


def test_python_m_ragsuite_help_imports_no_dspy(repo_root) -> None:
    """The entry point itself (``python -m ragsuite``), checked with ``-X importtime``'s list of imports."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ragsuite", "--help"],
        capture_output=True,
        text=True,
        cwd=repo_root,
        timeout=120,
        check=True,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    # No command's parser is built for the top-level help (the LM flags would import ragsuite.lm).
    assert "ragsuite.cli" in imported and "ragsuite.lm" not in imported
    assert not imported & set(HEAVY)


def test_catalog_matches_the_registry(repo_root) -> None:
    from ragsuite import programs
    from ragsuite.programs.catalog import (
        CATALOG,
        docstring_head,
        knob_defaults,
        overridden_defaults,
        package_programs,
        summary_fits,
        variant_base,
    )

    fix = "; rewrite the table with `python -m ragsuite.programs.catalog` (then ruff format it)"
    # The same programs (their order is the registration order of a fresh interpreter, which imports made by
    # other tests in this process may change).
    assert sorted(e.name for e in CATALOG) == sorted(package_programs()), "programs added or removed" + fix
    order = (
        "from ragsuite.programs.catalog import names, package_programs; print(names() == package_programs())"
    )
    fresh = subprocess.run(
        [sys.executable, "-c", order], capture_output=True, text=True, cwd=repo_root, timeout=120
    )
    assert fresh.stdout.strip() == "True", (
        "the catalog lists the programs in another order" + fix + fresh.stderr
    )
    for entry in CATALOG:
        cls = programs.get(entry.name)
        assert entry.target == f"{cls.__module__}:{cls.__qualname__}", entry.name + fix
        # A variant lists only what it changes from its base; resolved, the same knobs in the same order,
        # same values of the same types (1.0 is not 1 in a knob's help).
        assert entry.base == variant_base(entry.name), entry.name + fix
        defaults, resolved = cls.default_knobs(), knob_defaults(entry.name)
        saved = [(k, type(v), v) for k, v in resolved.items()]
        assert saved == [(k, type(v), v) for k, v in defaults.items()], (
            f"{entry.name}: catalog {resolved} != default_knobs() {defaults}{fix}"
        )
        if entry.base is not None:
            base = programs.get(entry.base).default_knobs()
            assert dict(entry.knobs) == overridden_defaults(defaults, base), entry.name + fix
        head = docstring_head(cls.__doc__)
        assert summary_fits(entry.summary, head), (
            f"{entry.name}: {entry.summary!r} does not begin {head!r}{fix}"
        )
    from ragsuite.cli.help_text import programs_epilog

    # --help says what a variant changes instead of repeating its base's knobs.
    assert "as deepnote, but max_failure=1\n" in programs_epilog() and "as hanrag\n" in programs_epilog()


def test_the_catalog_rewrites_itself_from_the_registry() -> None:
    """What ``python -m ragsuite.programs.catalog`` would write reads back as the registry's table."""
    from ragsuite import programs
    from ragsuite.programs import catalog

    namespace: dict = {}
    exec(
        compile(catalog._rewrite().replace("if __name__ == ", "if False and "), "catalog", "exec"), namespace
    )
    rewritten = {e.name: e for e in namespace["CATALOG"]}
    assert sorted(rewritten) == sorted(catalog.package_programs())
    for name, rewritten_entry in rewritten.items():
        knobs = programs.get(name).default_knobs()
        if rewritten_entry.base is not None:  # a variant: only the defaults it changes from its base's
            knobs = catalog.overridden_defaults(knobs, programs.get(rewritten_entry.base).default_knobs())
        assert dict(rewritten_entry.knobs) == knobs, name
    # The variants name their bases instead of repeating their tables.
    assert rewritten["hanrag-oracle"].base == "hanrag" and dict(rewritten["hanrag-oracle"].knobs) == {}
    assert rewritten["adaptive-note"].base == "deepnote" and dict(rewritten["adaptive-note"].knobs) == {
        "max_failure": 1
    }
    assert rewritten["adaptive-rag"].base is None  # it adds knobs to IRCoT's: a program of its own
    assert all(rewritten[e.name].summary == e.summary for e in catalog.CATALOG)  # fitting summaries kept
    head = catalog.docstring_head(programs.get("flare-direct").__doc__)
    assert len(head) > 120 and catalog.summary_fits(catalog._summary_from(head), head)


def test_align_recipe_names_match_the_builder() -> None:
    from ragsuite.align.builder import RECIPES
    from ragsuite.cli.align import RECIPE_PROGRAMS

    assert list(RECIPE_PROGRAMS) == list(RECIPES)


def test_lazy_packages_still_serve_their_names(repo_root) -> None:
    """``ragsuite.programs`` and ``ragsuite.align`` load their heavy parts on first use, not on import."""
    code = (
        "import sys; import ragsuite.programs, ragsuite.align, ragsuite.programs.catalog; "
        "import ragsuite.align.trainer; "
        "assert 'dspy' not in sys.modules, 'imported dspy'; "
        "from ragsuite.programs import RAGProgram, register; from ragsuite.align import RECIPES, TRAIN_FILE; "
        "assert 'dspy' in sys.modules and RAGProgram.__name__ == 'RAGProgram' and 'deepnote' in RECIPES; "
        "print(TRAIN_FILE)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=repo_root, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "train.jsonl"
