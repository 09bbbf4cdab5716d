"""Program files: one JSON document that restores a program's class, knobs, task, retriever and every
optimized instruction and demo. No pickle, no LM objects, no endpoints or keys.

Layout (``format_version`` 1)::

    {
      "format": "ragsuite.program", "format_version": 1,
      "program": "deepnote",                       # registry name
      "class": "ragsuite.programs.deepnote.DeepNote",  # informational: never imported
      "task": "short",
      "knobs": {"top_k": 5, "max_step": 3, ...},   # DSPy's own state save drops these
      "retriever": {"spec": "bm25:hotpotqa",       # retriever.describe(), or null: a dataset's corpus
                    "corpus_sha256": "7cfe...", ...},  # by name and hash, not the data path
      "predictors": {"answer.predict": {"signature": {"instructions": ..., "fields": [...]},
                                        "demos": [...], ...}},
      "versions": {"ragsuite": "0.1.0", "dspy": "3.4.1", "optuna": "5.0.0", "python": "3.11.9"},
      "metadata": {"optimizer": "mipro", "metrics": {...}, "tuning": {...}},
      "saved_at": "2025-01-01T00:00:00+00:00"
    }

Loading trusts nothing in the file to run code or route requests: the class comes from the program
registry by name, knobs must be ones the program declares, and each predictor's state may hold only its
signature's instructions and field prefixes/descriptions, demos, traces and train examples. LM settings
(``lm``, ``config`` with ``api_base`` ...) and unknown keys are refused with an error naming the file, the
predictor and the key. Only BM25 retrievers are rebuilt from a saved spec; servers, index directories and
models are opened only when the caller passes ``retriever=``. A dataset's corpus is found under the loading
machine's data root (``data_dir=``, else ``$RAGSUITE_DATA``) and must have the saved sha256.

The format itself (writing, reading and checking documents, loading state into a built program) is
:mod:`ragsuite.programs.program_format`, below the program base; this module adds what needs the
program registry, above every program: :func:`load_program` rebuilds a program by its saved name.

Example:
    >>> program.save("prog.json")                               # doctest: +SKIP
    >>> program = ragsuite.load("prog.json", retriever=my_retriever)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragsuite.errors import ConfigError
from ragsuite.programs.program_format import (
    DOCUMENT_KEYS,
    FORMAT,
    FORMAT_VERSION,
    PREDICTOR_STATE_KEYS,
    apply_predictor_states,
    check_document,
    check_predictor_state,
    load_state_file,
    package_versions,
    program_to_dict,
    read_program_file,
    save_program,
    warn_on_version_mismatch,
)

if TYPE_CHECKING:
    from ragsuite.programs.base import RAGProgram
    from ragsuite.retrieval.base import Retriever

log = logging.getLogger("ragsuite.programs.program_file")

#: Retriever kinds rebuilt from a file's saved spec; the others name a server or files to load, which a
#: program file must not choose.
_REBUILDABLE_RETRIEVERS = ("bm25",)


def _resolve_class(document: dict[str, Any], path: Path) -> type[RAGProgram]:
    """The registered class of the saved program. A file never names a module to import: programs
    defined outside ragsuite must be imported (and ``@register``-ed) by the caller first."""
    from ragsuite import programs

    name = document["program"]
    try:
        cls = programs.get(name)
    except ConfigError:
        raise ConfigError(
            f"{path}: program {name!r} is not registered; known programs: {', '.join(programs.names())}. "
            "A program defined outside ragsuite must be imported (registered with "
            "ragsuite.programs.register) before loading; its module is never imported from the file"
        ) from None
    saved_class = document["class"]
    actual_class = f"{cls.__module__}.{cls.__qualname__}"
    if saved_class != actual_class:
        log.warning("%s names class %s; program %r is now %s", path, saved_class, name, actual_class)
    return cls


def load_program(
    path: str | os.PathLike[str],
    *,
    retriever: Retriever | None = None,
    rebuild_retriever: bool = True,
    data_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    corpus: str | os.PathLike[str] | None = None,
    **overrides: Any,
) -> RAGProgram:
    """Rebuild a program saved with :func:`save_program`.

    Args:
        path: The program file.
        retriever: The retriever to use. When omitted, the saved description's ``spec`` is rebuilt with
            :func:`ragsuite.retrieval.spec.build_retriever` (e.g. the BM25 index of the saved dataset);
            only BM25 specs are rebuilt, a file never chooses a server, index directory or model to open.
        rebuild_retriever: ``False`` to keep ``retriever`` as given, even ``None``.
        data_dir: Dataset root holding the corpus a saved dataset retriever is rebuilt on (default
            ``$RAGSUITE_DATA``, else ``~/.cache/ragsuite/data``). Files keep the dataset name and the
            corpus's sha256, not the saving machine's path, so any copy of the same data works; other
            content is refused (a hash mismatch).
        cache_dir: Where a rebuilt index is kept (default ``$RAGSUITE_CACHE``, else ``~/.cache/ragsuite``).
        corpus: Where a saved retriever's corpus file is now, when it is no longer at the saved path (another
            machine); it must have the saved sha256.
        **overrides: Constructor arguments that win over the saved ones: knob values, or stage objects
            (``filter=``, ``blend=``) the program was built with.

    Returns:
        A program of the saved class with its knobs, task, instructions and demos restored. LMs are never
        stored: run it under ``dspy.context(lm=...)`` or set per-stage LMs.

    Raises:
        ConfigError: on a missing, corrupt or foreign file, an unknown program, or saved predictor state that
            does not fit the rebuilt program.
    """
    path = Path(path).expanduser()
    document = read_program_file(path)
    cls = _resolve_class(document, path)
    check_document(document, cls, path)
    warn_on_version_mismatch(document, path)
    if retriever is None and rebuild_retriever and document.get("retriever"):
        retriever = _rebuild_saved_retriever(
            document["retriever"], path, data_dir=data_dir, cache_dir=cache_dir, corpus=corpus
        )
    kwargs = {**document["knobs"], **_saved_stages(document, cls, path), **overrides}
    kwargs.setdefault("task", document.get("task", "short"))
    try:
        program = cls(retriever=retriever, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"{path}: cannot construct {cls.__name__} with the saved settings: {exc}") from exc
    apply_predictor_states(program, document, path)
    program.optimization = dict(document.get("metadata") or {})
    return program


def _saved_stages(document: dict[str, Any], cls: type[RAGProgram], path: Path) -> dict[str, Any]:
    """The stage objects a saved composition was built with (``filter=``/``blend=`` of vanilla, deepnote)."""
    from ragsuite.programs.stages import build_stage

    saved = document.get("stages") or {}
    if not isinstance(saved, dict):
        raise ConfigError(f"{path}: 'stages' must be an object of stage settings")
    allowed = cls.stage_arguments()
    stages = {}
    for kind, settings in saved.items():
        if kind not in allowed or not isinstance(settings, dict):
            raise ConfigError(f"{path}: program {cls.name!r} takes no stage {kind!r} (its stages: {allowed})")
        stages[kind] = build_stage(kind, settings)
    return stages


def _rebuildable(spec: str) -> bool:
    """Whether a saved spec names only embedded retrievers (a hybrid of them included)."""
    kind, _, rest = spec.partition(":")
    if kind == "hybrid":
        members = rest.partition(":")[2]
        return bool(members) and all(_rebuildable(member) for member in members.split("+"))
    return kind in _REBUILDABLE_RETRIEVERS


def _rebuild_saved_retriever(
    description: dict[str, Any],
    path: Path,
    *,
    data_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    corpus: str | os.PathLike[str] | None = None,
) -> Retriever:
    spec = description.get("spec")
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"{path}: the saved retriever has no spec to rebuild it from; pass retriever=")
    if not _rebuildable(spec):
        raise ConfigError(
            f"{path}: the saved retriever {spec!r} names a server or index files, which are not opened on "
            "a program file's word; build it yourself and pass retriever="
        )
    from ragsuite.retrieval.spec import rebuild_retriever

    try:
        # The corpus (a dataset's under data_dir, or a file) must still hold the content it was saved on.
        return rebuild_retriever(description, data_dir=data_dir, cache_dir=cache_dir, corpus=corpus)
    except Exception as exc:
        raise ConfigError(
            f"{path}: cannot rebuild the saved retriever {spec!r} ({exc}); pass retriever="
        ) from exc


__all__ = [
    "DOCUMENT_KEYS",
    "FORMAT",
    "FORMAT_VERSION",
    "PREDICTOR_STATE_KEYS",
    "apply_predictor_states",
    "check_document",
    "check_predictor_state",
    "load_program",
    "load_state_file",
    "package_versions",
    "program_to_dict",
    "read_program_file",
    "save_program",
]
