"""The documentation runs: the getting-started page's marked commands and Python snippets, and the README's.

A fenced block preceded by ``<!-- docs-test: run -->`` is run here, on a fresh clone's view of the repository
(a temporary working directory holding only ``tests/fixtures/data``), in the order the page shows it.
Wherever a block names the embedded local LM (``--lm local``, ``build_lm("local")``), a scripted
OpenAI-compatible server stands in for it: these tests check that the documented commands run and produce
what the page says, not what a real model answers (the ``real_lm`` tests do that).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import shlex
from pathlib import Path

import pytest

from ragsuite.cli import main
from ragsuite.data.datasets import load_dataset
from ragsuite.errors import install_hint
from ragsuite.testing.openai_server import LocalOpenAIServer
from ragsuite.testing.responders import grounded_responder

MARK = "<!-- docs-test: run -->"
_BLOCK = re.compile(r"^" + re.escape(MARK) + r"\s*\n```(\w+)\n(.*?)\n```", re.MULTILINE | re.DOTALL)
_LOCAL_LM_PY = 'build_lm("local")'


def marked_blocks(path: Path) -> list[tuple[str, str]]:
    """Every ``(language, code)`` block the page marks to run, in page order."""
    return _BLOCK.findall(path.read_text(encoding="utf-8"))


def shell_commands(code: str) -> list[list[str]]:
    """The commands of a bash block: one per line, ``\\`` continuations joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.split("#", 1)[0].strip()]


def with_scripted_lm(argv: list[str], api_base: str) -> list[str]:
    """``--lm local`` pointed at the scripted server (the only substitution made)."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg == "--lm" and out[i + 1] == "local":
            out[i + 1 : i + 2] = ["openai/scripted", "--api-base", api_base]
            break
    return out


@pytest.fixture
def clone(tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory that looks like a fresh clone's root: the committed fixtures and nothing else."""
    (tmp_path / "tests" / "fixtures").mkdir(parents=True)
    (tmp_path / "tests" / "fixtures" / "data").symlink_to(data_dir, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_blocks(blocks: list[tuple[str, str]], server: LocalOpenAIServer) -> list[str]:
    """Run every block; return what each printed. A command that fails fails the test with its output."""
    printed = []
    for language, code in blocks:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if language == "bash":
                for argv in shell_commands(code):
                    assert argv[0] == "ragsuite", f"a documented command that is not ragsuite's: {argv}"
                    code_ = main(
                        with_scripted_lm(argv[1:], server.api_base)
                        + ["--no-progress"] * _takes_progress(argv)
                    )
                    assert code_ == 0, f"{shlex.join(argv)} exited {code_}:\n{err.getvalue()}"
            elif language == "python":
                source = code.replace(
                    _LOCAL_LM_PY, f'build_lm("openai/scripted", api_base="{server.api_base}")'
                )
                exec(compile(source, "<docs>", "exec"), {"__name__": "__docs__"})
            else:
                raise AssertionError(f"a block marked to run in {language}, which this test cannot run")
        printed.append(out.getvalue())
    return printed


def _takes_progress(argv: list[str]) -> int:
    """1 for the commands that draw progress bars on a terminal (hidden here so the output stays readable)."""
    return int(argv[1:2] == ["eval"])


def test_getting_started_runs_on_a_fresh_clone(clone: Path, data_dir: Path, repo_root) -> None:
    blocks = marked_blocks(repo_root / "docs" / "getting-started.md")
    languages = [language for language, _ in blocks]
    assert languages.count("bash") >= 3 and "python" in languages, languages
    gold = {ex.question: ex.answers[0] for ex in load_dataset("hotpotqa", data_dir=data_dir)}
    with LocalOpenAIServer(grounded_responder(gold)) as server:
        printed = run_blocks(blocks, server)
        assert server.chat_requests > 0  # the evals and the snippet reached the stand-in, not a real model

    # What the page says the commands leave behind.
    for name in ("vanilla-local", "deepnote-local"):
        run = clone / "runs" / name
        records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
        assert len(records) == 5 and not any(r.get("error") for r in records)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["n"] == 5
        assert json.loads((run / "manifest.json").read_text())["dataset"] == "hotpotqa"
    assert (clone / "runs" / "compare.html").read_text().lstrip().lower().startswith("<!doctype html")
    assert "hotpotqa" in printed[0]  # data list
    assert "| 5 |" in printed[1] and "recall@k" in printed[1]  # retrieve-eval
    # The snippet prints the answer, the stats and the trace's stages, DeepNote's loop among them.
    snippet = printed[-1]
    assert "'lm_calls'" in snippet and "note_init" in snippet


def test_readme_snippet_runs_and_its_links_exist(clone: Path, repo_root) -> None:
    readme = (repo_root / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (repo_root / target).is_file(), f"README links to {target}, which does not exist"
    assert "../shared" not in readme
    blocks = marked_blocks(repo_root / "README.md")
    assert [language for language, _ in blocks] == ["python"]
    with LocalOpenAIServer(grounded_responder({})) as server:
        (printed,) = run_blocks(blocks, server)
    assert "'lm_calls'" in printed


def test_the_readme_and_getting_started_give_the_same_set_up_command(repo_root) -> None:
    def first_command(path: Path) -> str:
        return re.search(r"```bash\n(python3 -m venv .*?)\n```", path.read_text(encoding="utf-8")).group(1)

    assert first_command(repo_root / "README.md") == first_command(repo_root / "docs" / "getting-started.md")


def set_up_problems(readme: str, ci_script: str) -> list[str]:
    """What is wrong with the README's set-up section: each command alone in its block, what it prints in a
    text block right under it, the test command exactly ``.ci/run``'s, no measurements in between."""
    setup = readme.split("## Set up and run", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)\n```", setup, re.DOTALL)
    problems = []
    main_job = (
        "ragsuite eval --program-file examples/compiled/deepnote-hotpotqa-local.json --compare-uncompiled"
    )
    for command in ("pip install", "ragsuite serve --local --build", main_job):
        found = [i for i, (language, code) in enumerate(blocks) if language == "bash" and command in code]
        if not found:
            problems.append(f"no command with {command!r}")
            continue
        i = found[0]
        if "&& .venv/bin/ragsuite" in blocks[i][1] or len(blocks[i][1].splitlines()) != 1:
            problems.append(f"{command!r} shares its line or block with another command")
        if i + 1 >= len(blocks) or blocks[i + 1][0] != "text":
            problems.append(f"no output shown right under {command!r}")
    test_command = re.search(r"^(\.venv/bin/python -m pytest.*)$", ci_script, re.MULTILINE).group(1)
    if ("bash", test_command) not in blocks:
        problems.append(f"the test command is not .ci/run's ({test_command})")
    if re.search(r"\bMeasured\b|\d+ s per", setup):
        problems.append("measurements in the set-up section (they belong in the docs)")
    return problems


def test_the_readme_shows_each_set_up_command_with_what_it_prints(repo_root) -> None:
    readme = (repo_root / "README.md").read_text(encoding="utf-8")
    assert set_up_problems(readme, (repo_root / ".ci" / "run").read_text(encoding="utf-8")) == []


def test_the_pareto_example_runs_on_the_fixtures_and_writes_only_under_out(tmp_path: Path, repo_root) -> None:
    pytest.importorskip("matplotlib", reason="the plot needs the plot extra: " + install_hint("plot"))
    committed = repo_root / "docs" / "pareto.png"
    before = committed.read_bytes()
    spec = importlib.util.spec_from_file_location("pareto_example", repo_root / "docs" / "pareto_example.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = tmp_path / "out"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert example.run(["--trials", "2", "--val", "5", "--out", str(out)]) == 0
    plot = out / "deepnote-hotpotqa-quality+tokens" / "pareto.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"the plot: {plot}" in printed.getvalue()
    assert committed.read_bytes() == before  # the committed picture is never overwritten


def test_every_program_module_is_shown_on_a_program_page(repo_root) -> None:
    from ragsuite import programs

    shown = set()
    for page in (repo_root / "docs" / "programs").glob("*.md"):
        shown.update(re.findall(r"^::: ([\w.]+)$", page.read_text(encoding="utf-8"), re.MULTILINE))
    modules = {programs.get(name).__module__ for name in programs.names()}
    assert modules and modules <= shown, f"no program page shows the docstring of {sorted(modules - shown)}"


def test_every_docs_page_is_in_the_site_nav(repo_root) -> None:
    nav = (repo_root / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:", 1)[1]
    pages = {str(p.relative_to(repo_root / "docs")) for p in (repo_root / "docs").rglob("*.md")}
    assert pages, "no docs pages"
    missing = sorted(page for page in pages if not re.search(rf"(^|[\s:]){re.escape(page)}\s*$", nav, re.M))
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


def test_the_programs_table_states_every_programs_defaults(repo_root) -> None:
    from ragsuite import programs

    text = (repo_root / "docs" / "programs" / "index.md").read_text(encoding="utf-8")
    table = text.split("| name | what it does | knobs (defaults) |", 1)[1].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z-]+)` \| .* \| ([^|]*) \|$", table, re.MULTILINE))
    assert set(rows) == set(programs.names())

    def stated(cell: str) -> dict[str, str]:
        """``as `X`, `k=v`` / ``k=v`, others as `X``: X's defaults with the listed ones over them."""
        base = re.search(r"as `([a-z-]+)`", cell)
        knobs = dict(rows_knobs(rows[base.group(1)])) if base else {}
        knobs.update(rows_knobs(re.sub(r"as `[a-z-]+`", "", cell)))
        return knobs

    def rows_knobs(cell: str) -> list[tuple[str, str]]:
        return re.findall(r"(\w+)=([^,`]+)", cell)

    def shown(value: object) -> str:
        return ("true" if value else "false") if isinstance(value, bool) else str(value)

    for name, cell in rows.items():
        defaults = {k: shown(v) for k, v in programs.get(name).default_knobs().items()}
        assert stated(cell) == defaults, f"{name}: the table says {cell}"


def test_benchmarks_read_the_committed_fixtures_by_default(
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    repo_root,
    load_benchmark,
) -> None:
    # No data directory from the environment: what a fresh clone's shell has.
    monkeypatch.delenv("RAGSUITE_DATA", raising=False)
    assert load_benchmark("bm25_parity").main(["--datasets", "strategyqa"]) == 0
    fixture_questions = len(load_dataset("strategyqa", data_dir=data_dir))
    assert f"| strategyqa | 400 | {fixture_questions} | {fixture_questions}/{fixture_questions} /" in (
        capsys.readouterr().out
    )
    fixture_passages = sum(
        1 for path in data_dir.glob("*/corpus.jsonl") for line in path.open(encoding="utf-8") if line.strip()
    )
    assert len(load_benchmark("synthetic_corpus").source_passages()) == fixture_passages
    for script in (repo_root / "benchmarks").glob("*.py"):
        text = script.read_text(encoding="utf-8")
        assert "../shared" not in text and '/ "shared"' not in text, f"{script.name} reads ../shared"


def test_every_benchmark_script_is_on_the_benchmarks_page(repo_root) -> None:
    page = (repo_root / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    missing = [p.name for p in (repo_root / "benchmarks").glob("*.py") if f"`benchmarks/{p.name}" not in page]
    assert not missing, f"docs/benchmarks.md does not list {missing}"
