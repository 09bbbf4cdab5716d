"""Registered programs: ``get(name)`` returns the class, ``names()`` lists them.

Example:
    >>> from ragsuite import programs
    >>> "deepnote" in programs.names()
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ragsuite.errors import ConfigError

if TYPE_CHECKING:
    from ragsuite.programs.base import RAGProgram, RunLedger, register, run_concurrently

# Served from ragsuite.programs.base on first use: importing this package must stay free of dspy, so that
# ``ragsuite.programs.catalog`` (read by ``--help``) costs nothing.
_LAZY = frozenset({"RAGProgram", "RunLedger", "register", "run_concurrently"})


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from ragsuite.programs import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Importing the modules registers their programs.
_PROGRAM_MODULES = (
    "ragsuite.programs.baselines",
    "ragsuite.programs.deepnote",
    "ragsuite.programs.hanrag",
    "ragsuite.programs.hanrag_oracle",
    "ragsuite.programs.blendfilter",
    "ragsuite.programs.diverse_rerank",
    "ragsuite.programs.ircot",
    "ragsuite.programs.notes_and_thoughts",
    "ragsuite.programs.react",
    "ragsuite.programs.flare",
    "ragsuite.programs.self_rag",
)


def _load_all() -> None:
    import importlib

    for module in _PROGRAM_MODULES:
        importlib.import_module(module)


def names() -> list[str]:
    """Names of every registered program."""
    from ragsuite.programs.base import _REGISTRY

    _load_all()
    return list(_REGISTRY)


def get(name: str) -> type[RAGProgram]:
    """The program class registered under ``name``."""
    from ragsuite.programs.base import _REGISTRY

    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown program {name!r}; choose one of: {', '.join(_REGISTRY)}") from None


__all__ = ["RAGProgram", "RunLedger", "get", "names", "register", "run_concurrently"]
