"""Help text shared by the commands: the registered programs with their knobs, the dataset names, and
docstrings turned into plain text for ``--help``."""

from __future__ import annotations

import argparse
import re
import textwrap


def plain(doc: str) -> str:
    """A docstring as terminal text: ``code`` and :role:`target` markup reduced to the words."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", doc)
    return text.replace("``", "`")


def programs_epilog() -> str:
    """Every registered program with a one-line summary, then its knobs and their defaults (a variant's: the
    program it is a variant of and the defaults it changes), for an epilog.

    Read from :mod:`ragsuite.programs.catalog`, so ``--help`` imports no program (and no dspy).
    """
    from ragsuite.programs.catalog import CATALOG

    lines = ["programs (knobs and defaults; change one with --set KNOB=VALUE):"]
    for entry in CATALOG:
        summary = textwrap.wrap(entry.summary, 100 - 32)
        lines.append(f"  {entry.name:29s} {summary[0]}")
        lines.extend(" " * 32 + line for line in summary[1:])
        shown = ", ".join(f"{k}={v}" for k, v in entry.knobs.items())
        if entry.base is not None:  # a variant: what it changes, not its base's knobs again
            shown = f"as {entry.base}" + (f", but {shown}" if shown else "")
        shown = shown or "no knobs"
        lines.extend(textwrap.wrap(shown, 100, initial_indent=" " * 32, subsequent_indent=" " * 34))
    return "\n".join(lines)


def add_stage_argument(parser: argparse.ArgumentParser) -> None:
    """``--stage KIND=MODE``: compose a program with a filter or blend stage (vanilla, deepnote); and
    ``--reranker SPEC``, the reranking model of a program that takes one (diverse-rerank)."""
    parser.add_argument(
        "--stage",
        action="append",
        default=[],
        metavar="KIND=MODE",
        help="compose the program with a stage (repeatable): filter=per_passage|batch, "
        "blend=both|external|internal (vanilla, deepnote, adaptive-note); saved in program files",
    )
    from ragsuite.retrieval.rerankers import RERANKER_SPEC_HELP

    parser.add_argument(
        "--reranker",
        metavar="SPEC",
        help=f"diverse-rerank's reranker: {RERANKER_SPEC_HELP} (default: BM25 over the candidate pool)",
    )


def program_choices() -> str:
    """The registered program names, comma-separated (from the catalog: no program is imported)."""
    from ragsuite.programs.catalog import names

    return ", ".join(names())


def dataset_choices() -> str:
    """The dataset names, comma-separated."""
    from ragsuite.data.datasets import dataset_names

    return ", ".join(dataset_names())


__all__ = ["add_stage_argument", "dataset_choices", "plain", "program_choices", "programs_epilog"]
