"""Knob declarations: each knob is declared once, and the constructor's checks and defaults, variants'
defaults, ``--set`` values and Optuna's search space all come from that declaration."""

from __future__ import annotations

import optuna
import pytest

from ragsuite import programs
from ragsuite.errors import ConfigError
from ragsuite.programs.knobs import Floats, Ints, Knobs, OneOf, choice, flag, integer, path, probability

TOY = Knobs(
    integer("max_step", 3, minimum=0, search=Ints(1, 5), help="steps"),
    integer("max_failure", 2, minimum=1, search=Ints(1, "max_step"), help="failures"),
    choice("mode", "a", ("a", "b"), search=OneOf(("a", "b")), help="mode"),
    probability("threshold", 0.5, search=Floats(0.05, 0.95, when={"mode": "b"}), help="threshold"),
    flag("dedupe", False, help="dedupe"),
    path("classifier", help="a file"),
)


def test_check_fills_defaults_and_refuses_unknown_names_and_bad_values() -> None:
    assert TOY.check({"max_step": 5}) == {
        "max_step": 5,
        "max_failure": 2,
        "mode": "a",
        "threshold": 0.5,
        "dedupe": False,
        "classifier": None,
    }
    assert type(TOY.check({"threshold": 1})["threshold"]) is float
    with pytest.raises(ConfigError, match=r"has no knob 'max_steps'; its knobs are: max_step, max_failure"):
        TOY.check({"max_steps": 5}, program="toy")
    for name, value, words in [
        ("max_step", -1, "an integer >= 0"),
        ("max_step", True, "an integer >= 0"),
        ("max_failure", 1.0, "an integer >= 1"),
        ("mode", "c", "'a' or 'b'"),
        ("threshold", 1.5, "a probability between 0 and 1"),
        ("threshold", float("nan"), "a probability between 0 and 1"),
        ("dedupe", 1, "true or false"),
        ("classifier", 3, "a file path or null"),
    ]:
        with pytest.raises(ConfigError, match=f"{name} must be {words}, not"):
            TOY.check({name: value})


def test_set_values_are_read_by_the_knobs_type() -> None:
    assert TOY.parse("max_step", "4") == 4
    assert TOY.parse("dedupe", "true") is True
    assert TOY.parse("mode", "b") == "b"
    assert TOY.parse("classifier", "null") is None
    assert TOY.parse("classifier", "123") == "123"  # a path, even one that reads as a number
    with pytest.raises(ConfigError, match="max_step must be an integer >= 0, not 'many'"):
        TOY.parse("max_step", "many")


def test_variants_change_defaults_and_search_spaces_not_the_others() -> None:
    variant = TOY.override(max_failure=1).tuned("max_step")
    assert variant.defaults() == {**TOY.defaults(), "max_failure": 1}
    assert variant.searched() == ["max_step"] and TOY.searched() == [
        "max_step",
        "max_failure",
        "mode",
        "threshold",
    ]
    with pytest.raises(ValueError, match="no knob 'max_fail'"):
        TOY.override(max_fail=1)
    with pytest.raises(ConfigError, match="an integer >= 1"):
        TOY.override(max_failure=0)  # a wrong default fails where it is declared


def test_search_space_keeps_bounds_and_conditions_between_knobs() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen_modes = set()
    for _ in range(40):
        knobs = TOY.suggest(study.ask())
        assert 1 <= knobs["max_failure"] <= knobs["max_step"] <= 5
        assert ("threshold" in knobs) == (knobs["mode"] == "b")
        seen_modes.add(knobs["mode"])
        assert "dedupe" not in knobs and "classifier" not in knobs
    assert seen_modes == {"a", "b"}


def test_a_narrowed_search_reads_the_bounds_and_conditions_of_the_knobs_it_leaves_out() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5))
    narrowed = TOY.tuned("max_failure", "threshold")
    drawn = [narrowed.suggest(study.ask(), base={"max_step": 2, "mode": "b"}) for _ in range(30)]
    assert {k["max_failure"] for k in drawn} == {1, 2}  # bounded by the base max_step, not 3
    assert all(set(k) == {"max_failure", "threshold"} for k in drawn)  # the base mode lets threshold in
    assert all("threshold" not in narrowed.suggest(study.ask(), base={"mode": "a"}) for _ in range(5))
    # Without a base, the defaults bound them, as before.
    assert max(narrowed.suggest(study.ask())["max_failure"] for _ in range(30)) == 3


def test_programs_take_their_knobs_by_name_and_variants_only_override_defaults() -> None:
    deepnote, adaptive = programs.get("deepnote"), programs.get("adaptive-note")
    program = deepnote(max_step=5)
    assert program.max_step == 5 and program.max_failure == 2
    assert adaptive().max_failure == 1
    with pytest.raises(ConfigError, match="program 'adaptive-note' has no knob 'max_steps'"):
        adaptive(max_steps=5)
    # One constructor: the variant declares other defaults, not another signature.
    assert "__init__" not in vars(adaptive)
    assert adaptive.KNOBS.defaults() == {**deepnote.KNOBS.defaults(), "max_failure": 1}


def test_every_program_declares_its_knobs_and_their_defaults_pass_their_checks() -> None:
    for name in programs.names():
        cls = programs.get(name)
        assert isinstance(cls.KNOBS, Knobs), f"{name} declares its knobs as a plain tuple"
        assert cls.KNOBS.check({}) == cls.default_knobs()
        assert all(knob.help for knob in cls.KNOBS.values()), f"{name}: a knob without help"


def test_set_reads_each_value_by_its_declaration() -> None:
    from ragsuite.cli.args import parse_knob_settings

    adaptive_rag = programs.get("adaptive-rag").KNOBS
    assert parse_knob_settings(
        ["top_k=6", "classifier=2024", "reader=cot"], adaptive_rag, "adaptive-rag"
    ) == {
        "top_k": 6,
        "classifier": "2024",
        "reader": "cot",
    }
    with pytest.raises(ConfigError, match="reader must be 'direct' or 'cot', not 'cto'"):
        parse_knob_settings(["reader=cto"], adaptive_rag, "adaptive-rag")
    with pytest.raises(ConfigError, match="program 'adaptive-rag' has no knob 'readr'; its knobs are: top_k"):
        parse_knob_settings(["readr=cot"], adaptive_rag, "adaptive-rag")


def test_the_docs_knob_tables_are_generated_from_the_declarations() -> None:
    from ragsuite.programs.catalog import knob_table_block, knob_table_pages, rewrite_knob_tables

    fix = "; rewrite them with `python -m ragsuite.programs.catalog`"
    pages = knob_table_pages()
    shown = {}
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert rewrite_knob_tables(text) == text, (
            f"{page.name}: a knob table differs from the declarations{fix}"
        )
        for name in programs.names():
            start, end = knob_table_block(name)
            if start in text:
                shown[name] = text.split(start, 1)[1].split(end, 1)[0].strip()
    assert {"deepnote", "hanrag", "blendfilter", "diverse-rerank"} <= set(shown)
    for name, table in shown.items():
        assert table == programs.get(name).KNOBS.markdown_table()
        assert all(f"| `{knob}` |" in table for knob in programs.get(name).KNOBS)


def test_a_new_knob_is_one_declaration() -> None:
    """Declared once, a knob is a constructor argument with its check and default, a --set value, part of
    the search space, of the program file's knobs and of the docs table; a variant gets it too."""
    from ragsuite.cli.args import parse_knob_settings

    deepnote = programs.get("deepnote")

    class WithBudget(deepnote):
        KNOBS = deepnote.KNOBS + Knobs(
            integer("note_tokens", 400, minimum=1, search=Ints(100, 800), help="most tokens a note keeps")
        )

    class Variant(WithBudget):
        KNOBS = WithBudget.KNOBS.override(note_tokens=200)

    assert WithBudget(note_tokens=300).knobs()["note_tokens"] == 300
    assert WithBudget.default_knobs()["note_tokens"] == 400 and Variant().note_tokens == 200
    with pytest.raises(ConfigError, match="note_tokens must be an integer >= 1"):
        WithBudget(note_tokens=0)
    assert parse_knob_settings(["note_tokens=250"], WithBudget.KNOBS, "with-budget") == {"note_tokens": 250}
    assert "| `note_tokens` | `400` |" in WithBudget.KNOBS.markdown_table()
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    assert 100 <= WithBudget.search_space(trial)["note_tokens"] <= 800


#: The program modules whose docstring examples run without an LM (the others' examples are skipped).
PROGRAM_MODULES = "knobs catalog baselines deepnote notes_and_thoughts hanrag hanrag_oracle blendfilter"
PROGRAM_MODULES += " diverse_rerank ircot react flare self_rag"


@pytest.mark.parametrize("module", PROGRAM_MODULES.split())
def test_the_program_modules_examples_hold(module: str) -> None:
    """The docstring examples (default knobs among them) run and print what they show."""
    import doctest
    import importlib

    found = doctest.testmod(
        importlib.import_module(f"ragsuite.programs.{module}"), optionflags=doctest.ELLIPSIS
    )
    assert found.failed == 0, f"{found.failed} example(s) of ragsuite.programs.{module} fail"
