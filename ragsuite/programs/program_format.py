"""The program-file format: a program written as one JSON document, a document read and checked, and its
instructions and demos loaded into a program already built (``program.save(path)``, ``program.load(path)``).
The layout, and what loading trusts, are described in :mod:`ragsuite.programs.program_file`.

This module sits below :mod:`ragsuite.programs.base`, whose ``save`` and ``load`` use it, and imports no
program. Rebuilding a program by its saved name (registry, stages, retriever) is
:func:`ragsuite.programs.program_file.load_program`, above every program.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import logging
import os
import platform
from collections.abc import Iterable
from importlib import metadata as _metadata
from pathlib import Path
from typing import Any, ClassVar, Protocol

from ragsuite.errors import ConfigError
from ragsuite.files import atomic_write_text

# One logger for program-file messages, whichever of the two modules logs them.
log = logging.getLogger("ragsuite.programs.program_file")


class SavedProgram(Protocol):
    """What the format reads and sets on a program: a :class:`~ragsuite.programs.base.RAGProgram`, which
    builds on this module and so is named here, not imported."""

    name: ClassVar[str]
    KNOBS: ClassVar[tuple[str, ...]]
    task: str
    optimization: dict[str, Any]

    def knobs(self) -> dict[str, Any]: ...

    def stages(self) -> dict[str, dict[str, Any]]: ...

    def named_predictors(self) -> Iterable[tuple[str, Any]]: ...


FORMAT = "ragsuite.program"
FORMAT_VERSION = 1
_VERSIONED_PACKAGES = ("ragsuite", "dspy", "optuna")
#: Predictor state keys never written: ``lm`` may carry endpoints or credentials; ``fields`` (decision
#: thresholds) is rebuilt from the program's knobs.
_DROPPED_STATE_KEYS = ("lm", "fields")
#: The only top-level fields a program file may have.
DOCUMENT_KEYS = frozenset(
    {
        "format",
        "format_version",
        "program",
        "class",
        "task",
        "knobs",
        "retriever",
        "predictors",
        "versions",
        "metadata",
        "saved_at",
        "stages",
    }
)
#: The only predictor state keys that are loaded: prompts and examples. LM settings (``lm``, ``config``:
#: endpoints, keys, sampling) are refused, so a file cannot steer where a request, and its key, goes.
PREDICTOR_STATE_KEYS = frozenset({"signature", "demos", "traces", "train"})
_SIGNATURE_KEYS = frozenset({"instructions", "fields"})
_SIGNATURE_FIELD_KEYS = frozenset({"prefix", "description"})


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages a program file depends on (``None`` when not installed)."""
    versions: dict[str, str | None] = {}
    for package in _VERSIONED_PACKAGES:
        try:
            versions[package] = _metadata.version(package)
        except _metadata.PackageNotFoundError:
            versions[package] = None
    versions["python"] = platform.python_version()
    return versions


def _jsonable(value: Any) -> Any:
    """``json.dumps`` default: dataclasses (e.g. ``Passage``) and pydantic models become dicts."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if hasattr(value, "toDict"):
        return value.toDict()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _predictor_state(program: SavedProgram) -> dict[str, Any]:
    states: dict[str, Any] = {}
    for name, predictor in program.named_predictors():
        state = predictor.dump_state(json_mode=True)
        for key in _DROPPED_STATE_KEYS:
            state.pop(key, None)
        states[name] = state
    return states


def program_to_dict(program: SavedProgram, *, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document :func:`save_program` writes (laid out in :mod:`ragsuite.programs.program_file`)."""
    # RAGProgram builds on this module, so a program is recognized by what it has rather than its class.
    if not isinstance(getattr(type(program), "name", None), str) or not callable(
        getattr(program, "knobs", None)
    ):
        raise ConfigError(f"only ragsuite programs can be saved, not {type(program).__name__}")
    cls = type(program)
    retriever = getattr(program, "retriever", None)
    description = None
    if retriever is not None:
        describe = getattr(retriever, "describe", None)
        if describe is None:
            raise ConfigError(
                f"the retriever {type(retriever).__name__} has no describe(); it cannot be saved"
            )
        description = dict(describe())
    meta = dict(getattr(program, "optimization", None) or {})
    meta.update(metadata or {})
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "program": cls.name,
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "task": program.task,
        "knobs": program.knobs(),
        "stages": program.stages(),
        "retriever": description,
        "predictors": _predictor_state(program),
        "versions": package_versions(),
        "metadata": meta,
        "saved_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def save_program(
    program: SavedProgram, path: str | os.PathLike[str], *, metadata: dict[str, Any] | None = None
) -> Path:
    """Write ``program`` as a JSON program file, atomically (a reader never sees a half-written file).

    Args:
        program: A registered ragsuite program, compiled or not.
        path: Destination file; parent folders are created.
        metadata: Extra JSON-able facts to keep (optimizer, metric scores, tuning trial). Merged over the
            program's own ``optimization`` attribute, which :func:`~ragsuite.optimizers.compile_program` sets.

    Returns:
        The path written.

    Raises:
        ConfigError: when a knob, demo or metadata value cannot be written as JSON.
    """
    document = program_to_dict(program, metadata=metadata)
    try:
        text = json.dumps(document, indent=2, ensure_ascii=False, default=_jsonable)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"program {program.name!r} cannot be saved as JSON: {exc}") from exc
    path = atomic_write_text(Path(path).expanduser(), text + "\n")
    log.info("saved program %s to %s", program.name, path)
    return path


def read_program_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a program file without building the program.

    Raises:
        ConfigError: when the file is missing, not JSON, or not a ragsuite program file.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"program file {path} does not exist")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{path} is not a ragsuite program file (not valid JSON: {exc})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ConfigError(f'{path} is not a ragsuite program file (no "format": {FORMAT!r} field)')
    version = document.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ConfigError(
            f"{path} has program-file format version {version!r}; this ragsuite reads up to "
            f"{FORMAT_VERSION}. Upgrade ragsuite to load it."
        )
    for key, kind in (("program", str), ("class", str), ("knobs", dict), ("predictors", dict)):
        if not isinstance(document.get(key), kind):
            raise ConfigError(f"{path} is corrupt: field {key!r} is missing or not a {kind.__name__}")
    return document


def _refuse(path: Path, where: str, key: str, allowed: frozenset[str]) -> ConfigError:
    return ConfigError(
        f"{path}: {where} has key {key!r}, which program files may not set (LM settings, endpoints and "
        f"unknown keys are refused); allowed: {', '.join(sorted(allowed))}. Re-save the program with "
        "program.save(path) and choose LMs at run time (dspy.context(lm=...), --lm, --stage-lm)"
    )


def check_predictor_state(state: Any, *, path: Path, predictor: str) -> dict[str, Any]:
    """The loadable part of one saved predictor state: instructions, field prefixes and descriptions,
    demos. Anything else (``lm``, ``config`` with ``api_base``, unknown keys) is a :class:`ConfigError`
    naming the file, the predictor and the key."""
    where = f"predictor {predictor!r}"
    if not isinstance(state, dict):
        raise ConfigError(
            f"{path}: corrupt state for {where}: expected an object, not {type(state).__name__}"
        )
    for key, value in state.items():
        if key == "lm" and value is None:  # DSPy's own "no LM" marker carries nothing
            continue
        if key not in PREDICTOR_STATE_KEYS:
            raise _refuse(path, where, key, PREDICTOR_STATE_KEYS)
    for key in ("demos", "traces", "train"):
        if not isinstance(state.get(key, []), list):
            raise ConfigError(f"{path}: corrupt state for {where}: {key!r} is not a list")
    if not all(isinstance(demo, dict) for demo in state.get("demos", [])):
        raise ConfigError(f"{path}: corrupt state for {where}: every demo must be an object")
    signature = state.get("signature")
    if not isinstance(signature, dict):
        raise ConfigError(f"{path}: corrupt state for {where}: 'signature' is missing or not an object")
    for key in signature:
        if key not in _SIGNATURE_KEYS:
            raise _refuse(path, f"{where}'s signature", key, _SIGNATURE_KEYS)
    fields = signature.get("fields", [])
    if not isinstance(signature.get("instructions"), str) or not isinstance(fields, list):
        raise ConfigError(f"{path}: corrupt state for {where}: the signature needs instructions and fields")
    for field in fields:
        if not isinstance(field, dict):
            raise ConfigError(f"{path}: corrupt state for {where}: a signature field is not an object")
        for key, value in field.items():
            if key not in _SIGNATURE_FIELD_KEYS:
                raise _refuse(path, f"{where}'s signature field", key, _SIGNATURE_FIELD_KEYS)
            if not isinstance(value, str):
                raise ConfigError(f"{path}: corrupt state for {where}: field {key!r} is not text")
    return {
        "signature": {"instructions": signature["instructions"], "fields": fields},
        "demos": state.get("demos", []),
        "traces": state.get("traces", []),
        "train": state.get("train", []),
        "lm": None,
    }


def check_document(document: dict[str, Any], cls: type[SavedProgram], path: Path) -> None:
    """Refuse unknown top-level fields and knobs the program does not declare."""
    for key in document:
        if key not in DOCUMENT_KEYS:
            raise _refuse(path, "the program file", key, DOCUMENT_KEYS)
    for knob in document["knobs"]:
        if knob not in cls.KNOBS:
            raise ConfigError(
                f"{path}: knob {knob!r} is not a knob of program {cls.name!r} "
                f"(its knobs: {', '.join(cls.KNOBS) or '(none)'})"
            )
    for key in ("retriever", "versions", "metadata"):
        if document.get(key) is not None and not isinstance(document[key], dict):
            raise ConfigError(f"{path} is corrupt: field {key!r} is not an object")


def apply_predictor_states(program: SavedProgram, document: dict[str, Any], path: Path) -> None:
    """Load the file's checked instructions and demos into ``program``'s predictors."""
    predictors = dict(program.named_predictors())
    saved = document["predictors"]
    missing = sorted(set(saved) - set(predictors))
    if missing:
        raise ConfigError(
            f"{path}: saved state for predictor(s) {missing} that {type(program).__name__} does not have "
            f"(it has {sorted(predictors)}); pass the stage objects the program was built with "
            "(e.g. filter=...)"
        )
    # Check every predictor before loading any, so a refused file leaves the program untouched.
    states = {name: check_predictor_state(state, path=path, predictor=name) for name, state in saved.items()}
    for name, state in states.items():
        # The decision settings (thresholds, choice weights) come from the knobs the program was built with;
        # load_state would reset them to the type's defaults, since files do not carry them.
        decisions = dict(getattr(predictors[name], "fields", None) or {})
        try:
            predictors[name].load_state(state)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: corrupt state for predictor {name!r}: {exc}") from exc
        if decisions:
            predictors[name].fields = decisions
    unsaved = sorted(set(predictors) - set(saved))
    if unsaved:
        log.warning("%s has no saved state for predictor(s) %s; they keep their defaults", path, unsaved)


def warn_on_version_mismatch(document: dict[str, Any], path: Path) -> None:
    saved = document.get("versions") or {}
    current = package_versions()
    for package in _VERSIONED_PACKAGES:
        if package in saved and saved[package] != current.get(package):
            log.warning(
                "%s was saved with %s %s but %s is installed; prompts and demos load, behavior may differ",
                path,
                package,
                saved[package],
                current.get(package),
            )


def load_state_file(program: SavedProgram, path: str | os.PathLike[str]) -> SavedProgram:
    """Load a program file's instructions and demos into an existing ``program`` (``program.load(path)``).

    Knobs and task are constructor settings, not state: they must already match the file's.

    Raises:
        ConfigError: when the file is not a program file of this program, or its knobs or task differ
            (rebuild with :func:`load_program` then).
    """
    path = Path(path).expanduser()
    document = read_program_file(path)
    cls = type(program)
    if document["program"] != cls.name:
        raise ConfigError(
            f"{path} holds program {document['program']!r}, not {cls.name!r}; "
            "load it with ragsuite.load(path)"
        )
    check_document(document, cls, path)
    saved = {**document["knobs"], "task": document.get("task", "short")}
    current = {**program.knobs(), "task": program.task}
    differing = {key: value for key, value in saved.items() if current.get(key) != value}
    if differing:
        raise ConfigError(
            f"{path} was saved with {differing}, but this program has "
            f"{ {key: current.get(key) for key in differing} }; rebuild it with ragsuite.load(path) "
            "(ragsuite.programs.program_file.load_program)"
        )
    warn_on_version_mismatch(document, path)
    apply_predictor_states(program, document, path)
    program.optimization = dict(document.get("metadata") or {})
    return program
