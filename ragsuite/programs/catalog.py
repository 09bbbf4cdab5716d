"""The registered programs as a static table: name, class, one-line summary and knob defaults.

``ragsuite --help`` and every subcommand's ``--help`` read this table instead of importing the programs (which
imports dspy, about a second of CPU), so help stays fast. It must not import dspy or any program module.
``tests/cli/test_cli_startup.py`` checks it against the real registry (:func:`ragsuite.programs.names`, each
class's ``default_knobs()``, which its ``KNOBS`` declarations give, and docstring); when a program is added or
a default changes, that test fails. Rewrite the table from the registry with
``python -m ragsuite.programs.catalog`` (then ``ruff format ragsuite/programs/catalog.py``); summaries that
still fit their docstrings are kept. A variant program (a subclass of another registered program that keeps
its knobs, ``KNOBS = Base.KNOBS.override(...)``) names its base and lists only the defaults it changes, so its
entry says what differs instead of repeating the base's table. The same command rewrites the knob tables of
the docs' program pages (between ``<!-- knobs:NAME:start -->`` and ``<!-- knobs:NAME:end -->``) from the
declarations.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ProgramEntry:
    """One registered program, described without importing it.

    Attributes:
        name: The registry name (``--program NAME``).
        target: Where the class lives, as ``module:QualifiedName``.
        summary: The start of the class docstring's first sentence, one line.
        knobs: The knob defaults, in the class's ``KNOBS`` order; for a variant, only the defaults it
            changes from its base's (all of them: :func:`knob_defaults`).
        base: For a variant program, the registered program whose knobs it keeps (see
            :func:`variant_base`); None for the others.
    """

    name: str
    target: str
    summary: str
    knobs: Mapping[str, Any]
    base: str | None = None


# In registration order (the order of ``ragsuite.programs.names()``).
CATALOG: tuple[ProgramEntry, ...] = (
    ProgramEntry(
        "no-retrieval",
        "ragsuite.programs.baselines:NoRetrieval",
        "Answer from the LM's own knowledge, with no retrieval",
        {},
    ),
    ProgramEntry(
        "vanilla",
        "ragsuite.programs.baselines:VanillaRAG",
        "Vanilla RAG: retrieve the `top_k` passages for the question once and answer from them",
        {"top_k": 5},
    ),
    ProgramEntry(
        "deepnote",
        "ragsuite.programs.deepnote:DeepNote",
        (
            "DeepNote: collect knowledge in a note, refine queries from the best note, keep an update "
            "only when the LM judges it better"
        ),
        {
            "top_k": 5,
            "max_step": 3,
            "max_failure": 2,
            "max_passages": 15,
            "dedupe_queries": False,
            "decisions": "generate",
            "compare_threshold": 0.5,
        },
    ),
    ProgramEntry(
        "adaptive-note",
        "ragsuite.programs.deepnote:AdaptiveNote",
        "Adaptive-Note: DeepNote's loop with Adaptive-Note's defaults",
        {"max_failure": 1},
        base="deepnote",
    ),
    ProgramEntry(
        "hanrag",
        "ragsuite.programs.hanrag:HANRAG",
        (
            "HANRAG: route, then answer directly, with one filtered retrieval, with concurrent filtered"
            " retrievals for decomposed sub-questions"
        ),
        {
            "top_k": 10,
            "keep": 3,
            "max_hops": 5,
            "filter_mode": "per_passage",
            "decisions": "generate",
            "filter_threshold": 0.5,
            "end_threshold": 0.5,
            "route_weight_straightforward": 1.0,
            "route_weight_single_step": 1.0,
            "route_weight_compound": 1.0,
            "route_weight_complex": 1.0,
        },
    ),
    ProgramEntry(
        "hanrag-oracle",
        "ragsuite.programs.hanrag_oracle:HANRAGOracle",
        "HANRAG whose route is the question's type",
        {},
        base="hanrag",
    ),
    ProgramEntry(
        "blendfilter",
        "ragsuite.programs.blendfilter:BlendFilter",
        "BlendFilter: query generation blending plus LM knowledge filtering",
        {
            "top_k": 5,
            "blend": "both",
            "filter_mode": "batch",
            "decisions": "generate",
            "filter_threshold": 0.5,
        },
    ),
    ProgramEntry(
        "diverse-rerank",
        "ragsuite.programs.diverse_rerank:DiverseRerank",
        (
            "Knowledge-aware diverse reranking: declare, summarize into two knowledge views, rerank by "
            "each, interleave"
        ),
        {"pool_k": 50, "declare_top": 5, "n": 10, "rerank_by": "auto", "score_threshold": 0.0},
    ),
    ProgramEntry(
        "ircot",
        "ragsuite.programs.ircot:IRCoT",
        "IRCoT: interleave chain-of-thought sentences with retrievals, then read",
        {"top_k": 4, "max_steps": 8, "max_passages": 15, "reader": "direct"},
    ),
    ProgramEntry(
        "adaptive-rag",
        "ragsuite.programs.ircot:AdaptiveRAG",
        (
            "Adaptive-RAG: classify the question's complexity, then answer without retrieval (A), with "
            "one retrieval (B) or with IRCoT (C)"
        ),
        {
            "top_k": 4,
            "max_steps": 8,
            "max_passages": 15,
            "reader": "direct",
            "single_k": 15,
            "classifier": None,
        },
    ),
    ProgramEntry(
        "adaptive-retrieval",
        "ragsuite.programs.ircot:AdaptiveRetrieval",
        (
            'Adaptive Retrieval (Mallen et al., 2023, "When Not to Trust Language Models"): retrieve '
            "only when the LM's own knowledge is not enough"
        ),
        {"top_k": 5},
    ),
    ProgramEntry(
        "con",
        "ragsuite.programs.notes_and_thoughts:ChainOfNote",
        "Chain-of-Note: a reading note per retrieved passage, then the answer from the notes",
        {"top_k": 5},
    ),
    ProgramEntry(
        "rat",
        "ragsuite.programs.notes_and_thoughts:RAT",
        (
            "RAT: draft a chain of thought, revise each step with passages retrieved for it, answer "
            "from the revised chain"
        ),
        {"top_k": 3, "max_thoughts": 3},
    ),
    ProgramEntry(
        "deepnote-no-adaptive",
        "ragsuite.programs.notes_and_thoughts:DeepNoteWithoutAdaptiveRetrieval",
        ('DeepNote\'s ablation "w/o Adap. Retrieval" (Table 2): the initial note alone, no refinement loop'),
        {"max_step": 0},
        base="deepnote",
    ),
    ProgramEntry(
        "deepnote-no-adaptive-no-note",
        "ragsuite.programs.notes_and_thoughts:DeepNoteWithoutAdaptiveRetrievalOrNote",
        (
            'DeepNote\'s ablation "w/o Adap. Retrieval & Init. Note" (Table 2): no note at all, i.e. '
            "vanilla RAG over the first `top_k` passages"
        ),
        {},
        base="vanilla",
    ),
    ProgramEntry(
        "react",
        "ragsuite.programs.react:ReActRAG",
        "ReAct over a retriever: thought, search, observation, until `finish`",
        {"top_k": 3, "max_iters": 7},
    ),
    ProgramEntry(
        "flare-instruct",
        "ragsuite.programs.flare:FlareInstruct",
        (
            "FLARE-instruct: look ahead one sentence at a time, retrieve when the LM asks, regenerate "
            "from what was found"
        ),
        {"top_k": 3, "max_steps": 5},
    ),
    ProgramEntry(
        "flare-direct",
        "ragsuite.programs.flare:FlareDirect",
        (
            "FLARE-direct: look ahead one sentence at a time and retrieve, with the unsure tokens "
            "masked out of the query"
        ),
        {"top_k": 2, "max_steps": 5, "theta": 0.8, "beta": 0.4},
    ),
    ProgramEntry(
        "self-rag-prompted",
        "ragsuite.programs.self_rag:SelfRAGPrompted",
        "Self-RAG's decide-retrieve-critique-select loop with prompted reflection",
        {"top_k": 5, "w_rel": 1.0, "w_sup": 1.0, "w_use": 0.5},
    ),
    ProgramEntry(
        "self-rag",
        "ragsuite.programs.self_rag:SelfRAG",
        (
            "Self-RAG with a real checkpoint: reflection tokens read from the token probabilities of a "
            "Self-RAG model served by vLLM"
        ),
        {
            "top_k": 5,
            "threshold": 0.2,
            "w_rel": 1.0,
            "w_sup": 1.0,
            "w_use": 0.5,
            "use_seqscore": True,
            "beam_width": 2,
            "max_depth": 7,
        },
    ),
)


def names() -> list[str]:
    """The program names, in registration order."""
    return [entry.name for entry in CATALOG]


def entry(name: str) -> ProgramEntry | None:
    """The entry of ``name``, or None when the catalog has none."""
    return next((e for e in CATALOG if e.name == name), None)


def knob_defaults(name: str) -> dict[str, Any] | None:
    """Program ``name``'s knob defaults, in its knob order: a variant's base's defaults with the ones it
    changes over them; None for a program the catalog does not know.

    Example:
        >>> knob_defaults("adaptive-note") == {**knob_defaults("deepnote"), "max_failure": 1}
        True
    """
    known = entry(name)
    if known is None:
        return None
    if known.base is None:
        return dict(known.knobs)
    base = knob_defaults(known.base)
    if base is None:
        raise ValueError(f"{name}'s base program {known.base!r} is not in the catalog")
    # A variant keeps its base's knobs in their order: its own entries only change values.
    return {**base, **known.knobs}


def changed_knobs(name: str, knobs: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs in ``knobs`` that differ from program ``name``'s defaults, in the program's knob order (all
    of them for a program the catalog does not know): what a run's label shows.

    Example:
        >>> changed_knobs("deepnote", {"max_step": 2, "top_k": 5, "max_failure": 1})
        {'max_step': 2, 'max_failure': 1}
    """
    defaults = knob_defaults(name)
    if defaults is None:
        return dict(knobs)
    order = {k: i for i, k in enumerate(defaults)}
    changed = [k for k, v in knobs.items() if k not in defaults or defaults[k] != v]
    return {k: knobs[k] for k in sorted(changed, key=lambda k: order.get(k, len(order)))}


def docstring_head(doc: str | None) -> str:
    """The first paragraph of a class docstring as one line of plain text (``code`` and :role:`x` markup
    reduced to the words), which a summary must begin."""
    import inspect

    first = inspect.cleandoc(doc or "").split("\n\n")[0]
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", first).replace("``", "`")
    return " ".join(text.split())


#: The longest summary; and the characters after which a docstring may be cut into one.
SUMMARY_MAX = 140
_CLAUSE_ENDS = ",;:.( "


def summary_fits(summary: str, head: str) -> bool:
    """Whether ``summary`` is ``head`` (see :func:`docstring_head`) cut at a clause boundary, on one line."""
    rest = head[len(summary) :]
    return (
        0 < len(summary) <= SUMMARY_MAX
        and "\n" not in summary
        and head.startswith(summary)
        and (not rest or rest[0] in _CLAUSE_ENDS)
    )


def _summary_from(head: str) -> str:
    """A new summary: ``head`` up to the last clause boundary that keeps it within 120 characters."""
    if len(head) <= 120:
        return head.rstrip(".")
    cut = max(head.rfind(c, 40, 120) for c in (", ", "; ", ": ", ". ", " ("))
    return head[: cut if cut > 0 else head.rfind(" ", 0, 120)]


def package_programs() -> list[str]:
    """The names of the programs ragsuite itself registers, in registration order (imports dspy); programs
    registered from elsewhere (a user's, a test's) are not in the catalog."""
    from ragsuite import programs

    return [n for n in programs.names() if programs.get(n).__module__.startswith("ragsuite.programs.")]


def variant_base(name: str) -> str | None:
    """The package program that program ``name`` is a variant of, or None (imports the programs).

    A variant's class inherits from another registered program's and keeps its knobs (same names, kinds and
    order), changing at most their defaults and search spaces: Adaptive-Note, the DeepNote ablations, the
    HANRAG oracle. Only the nearest registered ancestor counts: a subclass that adds knobs (Adaptive-RAG over
    IRCoT) is a program of its own.
    """
    from ragsuite import programs

    registered = {programs.get(n): n for n in package_programs()}
    cls = programs.get(name)
    parent = next((c for c in cls.__mro__[1:] if c in registered), None)
    if parent is None or _signature(parent.KNOBS) != _signature(cls.KNOBS):
        return None
    return registered[parent]


def _signature(knobs: Any) -> list[tuple[str, str | None]]:
    """Each knob's name and kind, in order (a legacy ``KNOBS`` tuple of names has no kinds)."""
    from ragsuite.programs.knobs import Knobs

    if isinstance(knobs, Knobs):
        return [(name, knob.kind) for name, knob in knobs.items()]
    return [(name, None) for name in knobs]


def overridden_defaults(defaults: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``defaults`` that differ from ``base``'s, in value or type (1.0 is not 1 in ``--help``).

    Example:
        >>> overridden_defaults({"top_k": 5, "max_failure": 1}, {"top_k": 5, "max_failure": 2})
        {'max_failure': 1}
    """
    return {k: v for k, v in defaults.items() if k not in base or (type(v), v) != (type(base[k]), base[k])}


def _literal(text: str) -> str:
    """``text`` as Python source: one literal, or short ones concatenated so that lines stay short."""
    import textwrap

    if len(text) <= 90:
        return repr(text)
    parts = textwrap.wrap(text, 90, drop_whitespace=False, break_long_words=False)
    return "(" + " ".join(repr(part) for part in parts) + ")"


def _rewrite() -> str:
    """The source of this module with :data:`CATALOG` rebuilt from the program registry (imports dspy)."""
    from pathlib import Path

    from ragsuite import programs

    lines = []
    for name in package_programs():
        cls = programs.get(name)
        head = docstring_head(cls.__doc__)
        old = entry(name)
        summary = old.summary if old is not None and summary_fits(old.summary, head) else _summary_from(head)
        defaults, base = cls.default_knobs(), variant_base(name)
        if base is not None:  # a variant lists what it changes, not its base's whole table again
            defaults = overridden_defaults(defaults, programs.get(base).default_knobs())
        knobs = ", ".join(f"{k!r}: {v!r}" for k, v in defaults.items())
        target = f"{cls.__module__}:{cls.__qualname__}"
        variant = f", base={base!r}" if base is not None else ""
        lines.append(f"    ProgramEntry({name!r}, {target!r}, {_literal(summary)}, {{{knobs}}}{variant}),")
    source = Path(__file__).read_text(encoding="utf-8")
    start = source.index("CATALOG: tuple[ProgramEntry, ...] = (\n") + len(
        "CATALOG: tuple[ProgramEntry, ...] = (\n"
    )
    end = source.index("\n)\n", start)
    return source[:start] + "\n".join(lines) + source[end:]


def knob_table_block(name: str) -> tuple[str, str]:
    """The markers around program ``name``'s knob table in a docs page."""
    return f"<!-- knobs:{name}:start -->", f"<!-- knobs:{name}:end -->"


_KNOB_BLOCK = re.compile(r"<!-- knobs:([a-z-]+):start -->\n.*?<!-- knobs:\1:end -->", re.DOTALL)


def rewrite_knob_tables(text: str) -> str:
    """``text`` (a docs page) with every knob table between its markers rebuilt from the program's knob
    declarations (imports the programs)."""
    from ragsuite import programs

    def table(match: re.Match[str]) -> str:
        start, end = knob_table_block(match.group(1))
        return f"{start}\n{programs.get(match.group(1)).KNOBS.markdown_table()}\n{end}"

    return _KNOB_BLOCK.sub(table, text)


def knob_table_pages() -> list[Path]:
    """The docs pages of a source checkout that hold knob tables (none in an installed package)."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    return sorted(p for p in docs.rglob("*.md") if "<!-- knobs:" in p.read_text(encoding="utf-8"))


__all__ = [
    "CATALOG",
    "ProgramEntry",
    "changed_knobs",
    "docstring_head",
    "entry",
    "knob_defaults",
    "knob_table_block",
    "knob_table_pages",
    "names",
    "overridden_defaults",
    "package_programs",
    "rewrite_knob_tables",
    "summary_fits",
    "variant_base",
]


if __name__ == "__main__":
    from pathlib import Path

    Path(__file__).write_text(_rewrite(), encoding="utf-8")
    print(f"rewrote {__file__}; now run: ruff format {__file__}")
    for page in knob_table_pages():
        page.write_text(rewrite_knob_tables(page.read_text(encoding="utf-8")), encoding="utf-8")
        print(f"rewrote the knob tables of {page}")
