"""The evaluation harness under its former module name: every public name of :mod:`ragsuite.evaluation`,
re-exported for code that imports ``ragsuite.evaluate``. New code imports from :mod:`ragsuite.evaluation`.

Example:
    >>> from ragsuite.evaluate import evaluate  # the same function as ragsuite.evaluation.evaluate
"""

from __future__ import annotations

from ragsuite.evaluation import *  # noqa: F403
from ragsuite.evaluation import __all__ as __all__
