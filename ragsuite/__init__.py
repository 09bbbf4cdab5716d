"""ragsuite: declarative DSPy programs for adaptive retrieval-augmented question answering.

Importing this package is cheap and has no side effects: heavy dependencies (dspy, torch, colbert-ai, vllm)
are imported by the submodules that need them.

Example:
    >>> import ragsuite
    >>> ragsuite.__version__
    '0.1.0'
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "load"]

if TYPE_CHECKING:
    from ragsuite.programs.base import RAGProgram


def load(
    path: str | os.PathLike[str],
    *,
    dataset: str | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    **overrides: Any,
) -> RAGProgram:
    """Load a program saved with ``program.save(path)`` (see :mod:`ragsuite.programs.program_file`).

    Args:
        path: The JSON program file.
        dataset: Run it on this dataset instead of the one it was saved with: its retriever is built over
            that dataset's corpus (the saved kind: BM25 or dense) and it answers in that dataset's style.
            Each difference from the file (dataset, answer task, retriever, index) is logged as a warning;
            :func:`ragsuite.programs.program_file.load_for_data` returns them.
        data_dir: The data root holding the dataset's corpus (default ``$RAGSUITE_DATA``). Without
            ``dataset``, the root holding the saved dataset's corpus, checked against the saved sha256.
        **overrides: Run-time objects that are never stored, such as ``retriever=``; without ``dataset``,
            ``corpus=`` (where a saved corpus file is now, checked against the saved sha256); knob values
            that win over the saved ones.
    """
    if dataset is None:
        from ragsuite.programs.program_file import load_program

        return load_program(path, data_dir=data_dir, **overrides)
    import logging

    from ragsuite.programs.program_file import load_for_data

    loaded = load_for_data(path, dataset=dataset, data_dir=data_dir, **overrides)
    for difference in loaded.differences:
        logging.getLogger("ragsuite.programs.program_file").warning("%s: %s", path, difference)
    return loaded.program
