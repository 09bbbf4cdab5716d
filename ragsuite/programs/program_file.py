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
program registry, above every program: :func:`load_program` rebuilds a program by its saved name, and
:func:`load_for_data` rebuilds it for other data (another dataset's corpus and answer task), returning how
that run differs from the file; both read the file once.

Example:
    >>> program.save("prog.json")                               # doctest: +SKIP
    >>> program = ragsuite.load("prog.json", retriever=my_retriever)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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
    saved = _SavedProgram.read(path)
    if retriever is None and rebuild_retriever and saved.document.get("retriever"):
        retriever = _rebuild_saved_retriever(
            saved.document["retriever"], saved.path, data_dir=data_dir, cache_dir=cache_dir, corpus=corpus
        )
    return saved.build(retriever, overrides)


@dataclass(frozen=True)
class LoadedProgram:
    """A saved program rebuilt for the data it now runs on.

    Attributes:
        program: The program: the file's class, knobs, instructions and demos, with the run's retriever and
            answer task.
        differences: One line per way the run differs from what the file was saved (tuned) with: dataset,
            answer task, retriever, index. Empty when it runs on what it was saved with.
    """

    program: RAGProgram
    differences: list[str]


def load_for_data(
    path: str | os.PathLike[str],
    *,
    dataset: str | None = None,
    questions: str | os.PathLike[str] | None = None,
    task: str | None = None,
    retriever: str | Retriever | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    corpus: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = False,
    program: str | None = None,
    overrides_for: Callable[[type[RAGProgram]], Mapping[str, Any]] | None = None,
    **overrides: Any,
) -> LoadedProgram:
    """Run a saved program on other data: read the file once, build its retriever for ``dataset`` (or
    ``corpus``) and answer in that data's style; say how that differs from what the file was saved with.

    Args:
        path: The program file.
        dataset: The dataset it now runs on: its corpus is indexed and its answer task used.
        questions: The questions file it runs on instead of a dataset's (named in the differences).
        task: The answer task; default: ``dataset``'s, else the saved one.
        retriever: A retriever, or a spec built over ``dataset``/``corpus`` (``bm25``, ``dense``, ``none``,
            ...); default: the saved retriever's kind (BM25 or dense), never a server or index the file names.
        data_dir: Dataset root holding ``dataset`` (default ``$RAGSUITE_DATA``, else
            ``~/.cache/ragsuite/data``).
        corpus: A corpus file to retrieve from instead of ``dataset``'s.
        cache_dir: Where a built index is kept (default ``$RAGSUITE_CACHE``, else ``~/.cache/ragsuite``).
        progress: Show a progress bar while an index is built.
        program: The registry name the file must hold (refused otherwise).
        overrides_for: Constructor arguments that depend on the saved class, such as knob values checked
            against its knobs or stages checked against the stages it takes; they win over the saved ones.
        **overrides: Constructor arguments that win over the saved ones.

    Returns:
        The program and its differences from the file (see :class:`LoadedProgram`).

    Raises:
        ConfigError: as :func:`load_program`, or when the file holds another program than ``program``.
    """
    saved = _SavedProgram.read(path)
    if program is not None and program != saved.name:
        raise ConfigError(f"{saved.path} holds program {saved.name!r}, not {program!r}")
    # Settings first: a mistyped knob is refused before an index is built.
    extra = {**(overrides_for(saved.cls) if overrides_for is not None else {}), **overrides}
    if retriever is None or isinstance(retriever, str):
        from ragsuite.retrieval.spec import build_retriever

        spec = retriever or saved.retriever_kind()
        options = {"dataset": dataset, "corpus": corpus, "data_dir": data_dir, "cache_dir": cache_dir}
        retriever = None if spec == "none" else build_retriever(spec, progress=progress, **options)
    if task is None and dataset is not None:
        from ragsuite.data.datasets import get_dataset_info

        task = get_dataset_info(dataset).task
    built = saved.build(retriever, {**({"task": task} if task is not None else {}), **extra})
    describe = getattr(retriever, "describe", None)
    running_on = dataset or (f"your questions ({questions})" if questions is not None else None)
    differences = program_file_differences(
        saved.document,
        dataset=running_on,
        task=built.task,
        retriever=describe() if callable(describe) else None,
    )
    return LoadedProgram(built, differences)


def program_file_differences(
    document: dict[str, Any], *, dataset: str | None, task: str, retriever: dict[str, Any] | None
) -> list[str]:
    """One line per way a run differs from what the program file was saved (tuned) with.

    Args:
        document: The program file's document.
        dataset: What the run answers (a dataset name, or a label for a questions file); None: not compared.
        task: The run's answer task.
        retriever: The run's retriever description (``describe()``), None for no retriever.
    """
    saved = document.get("retriever") if isinstance(document.get("retriever"), dict) else None
    metadata = document.get("metadata") if isinstance(document.get("metadata"), dict) else {}
    saved_dataset = metadata.get("dataset") or (saved or {}).get("dataset")
    lines = []
    if dataset is not None and saved_dataset and saved_dataset != dataset:
        lines.append(f"saved for dataset {saved_dataset!r}; running on {dataset!r} (--dataset wins)")
    if document.get("task") != task:
        lines.append(
            f"saved with answer task {document.get('task')!r}; using {task!r}, the task of {dataset!r}"
        )
    saved_spec = (saved or {}).get("spec", "none")
    spec = (retriever or {}).get("spec", "none")
    if saved_spec != spec:
        lines.append(f"saved with retriever {saved_spec!r}; using {spec!r}")
    saved_key, key = (saved or {}).get("index_key"), (retriever or {}).get("index_key")
    if saved_key and key and saved_key != key:
        lines.append(
            f"the retrieval index changed: saved index_key {saved_key}, built now {key} "
            "(different corpus or index settings)"
        )
    return lines


@dataclass(frozen=True)
class _SavedProgram:
    """A program file read and checked once: its document and the registered class it names."""

    path: Path
    document: dict[str, Any]
    cls: type[RAGProgram]

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> _SavedProgram:
        path = Path(path).expanduser()
        document = read_program_file(path)
        program_cls = _resolve_class(document, path)
        check_document(document, program_cls, path)
        warn_on_version_mismatch(document, path)
        return cls(path, document, program_cls)

    @property
    def name(self) -> str:
        return self.document["program"]

    def retriever_kind(self) -> str:
        """The saved retriever's kind, to build for other data (a file never names a server, index
        directory or model to load): ``none``, ``dense`` or ``bm25``."""
        saved = self.document.get("retriever")
        if not isinstance(saved, dict):
            return "none"
        return "dense" if saved.get("kind") == "dense" else "bm25"

    def build(self, retriever: Retriever | None, overrides: Mapping[str, Any]) -> RAGProgram:
        """The program with the saved knobs, stages, task, instructions and demos; ``overrides`` win."""
        kwargs = {**self.document["knobs"], **_saved_stages(self.document, self.cls, self.path), **overrides}
        kwargs.setdefault("task", self.document.get("task", "short"))
        try:
            program = self.cls(retriever=retriever, **kwargs)
        except TypeError as exc:
            raise ConfigError(
                f"{self.path}: cannot construct {self.cls.__name__} with the saved settings: {exc}"
            ) from exc
        apply_predictor_states(program, self.document, self.path)
        program.optimization = dict(self.document.get("metadata") or {})
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
    kind = spec.partition(":")[0]
    if kind == "hybrid":
        from ragsuite.retrieval.hybrid import parse_hybrid_spec

        try:
            members = parse_hybrid_spec(spec)[1]
        except ConfigError:
            return False
        return all(_rebuildable(member) for member in members)
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
    "LoadedProgram",
    "apply_predictor_states",
    "check_document",
    "check_predictor_state",
    "load_for_data",
    "load_program",
    "load_state_file",
    "package_versions",
    "program_file_differences",
    "program_to_dict",
    "read_program_file",
    "save_program",
]
