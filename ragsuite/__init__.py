"""ragsuite: declarative DSPy programs for adaptive retrieval-augmented question answering.

Importing this package is cheap and has no side effects: heavy dependencies (dspy, torch, colbert-ai, vllm)
are imported by the submodules that need them.

Example:
    >>> import ragsuite
    >>> ragsuite.__version__
    '0.1.0'
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "load"]

if TYPE_CHECKING:
    from ragsuite.programs.base import RAGProgram


def load(path: str, **overrides: Any) -> RAGProgram:
    """Load a program saved with ``program.save(path)`` (see :mod:`ragsuite.programs.program_file`).

    Args:
        path: The JSON program file.
        **overrides: Run-time objects that are never stored, such as ``retriever=``; ``data_dir=`` (the data
            root holding the saved dataset corpus, default ``$RAGSUITE_DATA``) and ``corpus=`` (where a saved
            corpus file is now), both checked against the saved corpus sha256.
    """
    from ragsuite.programs.program_file import load_program

    return load_program(path, **overrides)
