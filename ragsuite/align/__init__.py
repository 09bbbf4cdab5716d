"""Preference alignment of program stages: DeepNote's DNAlign (DeepNote §3.4-3.5, Appendix D) for any program.

* :mod:`ragsuite.align.builder` samples a program's stages under nine (temperature, top_p) settings on
  training questions and builds chosen/rejected pairs per stage (judge LM, NoteCompare, task metric, or the
  dataset's labels), resumably, into TRL's preference format.
* :mod:`ragsuite.align.judge` is the best/worst judge (the paper's Appendix B.2 prompts, restated).
* :mod:`ragsuite.align.pairs` holds the pair types, the per-stage selection and the file format.
* :mod:`ragsuite.align.trainer` runs DPO with TRL's ``DPOTrainer`` (the ``train`` extra:
  ``pip install -e '.[train]'``); nothing else here imports torch or TRL.

Example:
    >>> from ragsuite.align import SAMPLING_GRID, recipe_for
    >>> recipe_for("deepnote").STAGES
    ('note_init', 'query_refine', 'note_update', 'answer')
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ragsuite.align.builder import (
        RECIPES,
        SAMPLING_GRID,
        TOP_KS,
        BuildResult,
        DeepNoteRecipe,
        HANRAGRecipe,
        build_preferences,
        recipe_for,
        sample_questions,
        sample_stage,
    )
    from ragsuite.align.pairs import TRAIN_FILE, PreferencePair, Sample, read_trl, select_pairs, write_trl

# Names served on first use: the builder imports dspy and the programs, and importing a light submodule
# (``ragsuite.align.trainer`` for ``align train --help``) runs this file first.
_PAIRS = {"TRAIN_FILE", "PreferencePair", "Sample", "read_trl", "select_pairs", "write_trl"}


def __getattr__(name: str) -> Any:
    if name in __all__:
        module = "ragsuite.align.pairs" if name in _PAIRS else "ragsuite.align.builder"
        return getattr(import_module(module), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "RECIPES",
    "SAMPLING_GRID",
    "TOP_KS",
    "TRAIN_FILE",
    "BuildResult",
    "DeepNoteRecipe",
    "HANRAGRecipe",
    "PreferencePair",
    "Sample",
    "build_preferences",
    "read_trl",
    "recipe_for",
    "sample_questions",
    "sample_stage",
    "select_pairs",
    "write_trl",
]
