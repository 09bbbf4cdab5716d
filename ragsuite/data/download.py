"""Download, verify and convert the catalogue's sources (``ragsuite data download``).

Each remote file is fetched into ``<data dir>/.downloads/<filename>.part`` with HTTP Range requests, so an
interrupted transfer (a dropped connection, or a killed process) resumes where it stopped. The version of the
file the part holds (the server's strong ``ETag``, else its ``Last-Modified``) is stored beside it in
``<filename>.part.validator`` and sent as ``If-Range``: a file changed on the server since is downloaded again
from byte 0, never spliced onto the old bytes. A part without a validator (the server sent none) is never
resumed. A checksum or size mismatch deletes the partial file.

A file that matches a published checksum is renamed to ``<filename>`` at once. A file with no published
checksum is kept as ``.downloads/unverified/<filename>`` until it has been converted: only then is it moved to
``<filename>``; if it cannot be converted it is deleted, and the error says so. A file at ``<filename>`` is
complete and is not fetched again.

Conversion streams the file (archive members included) row by row into ``<data dir>/<dataset>/<split>.jsonl``
or ``corpus.jsonl``, written atomically: a malformed or undecodable source (bad gzip/bz2/zip/tar data,
invalid UTF-8, a record above :data:`~ragsuite.data.readers.MAX_RECORD_CHARS`), or a row count other than the
one the source must have, raises :class:`~ragsuite.errors.DataError` and leaves the previous file (or none)
in place.

Where requests go:
    * Hugging Face Hub files: ``$HF_ENDPOINT`` (default ``https://huggingface.co``), through
      ``huggingface_hub`` for the URL and the published checksum and size. No token is sent: the files are
      public.
    * Files on their official hosts: the URL in the catalogue, or ``$RAGSUITE_MIRROR/<host>/<path>`` when
      ``RAGSUITE_MIRROR=http://host:port`` is set.

Example:
    >>> from ragsuite.data.download import download
    >>> download(["hotpotqa"], subset="ircot-test-500", corpus="none")  # doctest: +SKIP
"""

from __future__ import annotations

import bz2
import contextlib
import csv
import fnmatch
import gzip
import hashlib
import http.client
import io
import logging
import os
import re
import sys
import tarfile
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import ujson

from ragsuite import __version__
from ragsuite.data.readers import STREAM_CONVERTERS, Stream, passage_id
from ragsuite.data.sources import CATALOGUE, Catalogue, RemoteFile, Source
from ragsuite.errors import ConfigError, DataError
from ragsuite.files import atomic_open, atomic_write_text
from ragsuite.paths import download_root
from ragsuite.redaction import redact

log = logging.getLogger("ragsuite.data.download")

MIRROR_ENV = "RAGSUITE_MIRROR"
MANIFEST = ".ragsuite-sources.json"
"""Per dataset folder: which source each installed file came from (read by ``ragsuite data list``)."""
NONE = "none"
"""``--subset none`` / ``--corpus none``: skip the questions or the corpus."""

_BLOCK = 1 << 20
_ATTEMPTS = 5
_TIMEOUT_S = 60


@dataclass(frozen=True)
class Expected:
    """What a downloaded file must match; ``None`` fields are unknown."""

    sha256: str | None = None
    git_sha1: str | None = None
    size: int | None = None


@dataclass(frozen=True)
class Installed:
    """One file ``download`` installed (or found installed)."""

    dataset: str
    source: str
    path: Path
    rows: int
    skipped: bool = False


@dataclass(frozen=True)
class Fetched:
    """A downloaded file and whether its bytes are known to be the published ones.

    Attributes:
        path: The file to convert.
        confirmed: It matched a published checksum, or was converted before (``<filename>``); ``False`` for
            ``unverified/<filename>``, which only a successful conversion promotes.
    """

    path: Path
    confirmed: bool


class _Interrupted(Exception):
    """The connection dropped mid-body: the next attempt resumes with a Range request."""


UNVERIFIED = "unverified"
"""Folder (in ``.downloads``) of complete downloads with no published checksum, until they are converted."""
VALIDATOR = ".validator"
"""Suffix (after ``.part``) of the file holding the ``If-Range`` validator of a partial download."""


def _progress(quiet: bool, **options: Any):
    from tqdm import tqdm

    return tqdm(disable=quiet or not sys.stderr.isatty(), **options)


# --- where requests go ---------------------------------------------------------------------------------


def mirrored(url: str) -> str:
    """``url``, or ``$RAGSUITE_MIRROR/<host>/<path>?<query>`` when the mirror variable is set.

    Raises:
        ConfigError: the mirror is not an ``http(s)://host[:port]`` URL.
    """
    mirror = os.environ.get(MIRROR_ENV, "").strip()
    if not mirror:
        return url
    base = urlsplit(mirror)
    if base.scheme not in ("http", "https") or not base.netloc:
        raise ConfigError(f"{MIRROR_ENV}={redact(mirror)} must look like http://host:port")
    parts = urlsplit(url)
    return f"{mirror.rstrip('/')}/{parts.netloc}{parts.path}" + (f"?{parts.query}" if parts.query else "")


def resolve(file: RemoteFile) -> tuple[str, Expected]:
    """The URL to GET for ``file`` and what it must match (for Hub files: what the Hub publishes)."""
    if not file.hub_repo:
        return mirrored(file.url), Expected(sha256=file.sha256, size=file.size)
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    # huggingface_hub reads HF_ENDPOINT once, at import; read it per call so the variable always applies.
    endpoint = os.environ.get("HF_ENDPOINT") or None
    url = hf_hub_url(
        file.hub_repo, file.hub_path, repo_type="dataset", revision=file.hub_revision, endpoint=endpoint
    )
    try:
        with _quiet_hub_retries():
            meta = get_hf_file_metadata(url, token=False, endpoint=endpoint)
    except _hub_errors() as exc:
        # huggingface_hub raises httpx (>= 1.0) or requests (< 1.0) errors: one line either way.
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise DataError(
            f"could not read the Hugging Face Hub's metadata for {file.hub_repo}/{file.hub_path} "
            f"({redact(url)}): {reason}. Check the network, or set HF_ENDPOINT to a reachable Hub mirror."
        ) from None
    if not meta.size:
        raise DataError(
            f"the Hugging Face Hub's metadata for {file.hub_repo}/{file.hub_path} ({redact(url)}) gives its "
            f"size as {meta.size!r} bytes: that is not the published file. Check HF_ENDPOINT (it must be a "
            "Hub or a mirror that serves the file) and run the command again"
        )
    etag = (meta.etag or "").lower()
    return url, Expected(
        sha256=file.sha256 or (etag if re.fullmatch(r"[0-9a-f]{64}", etag) else None),
        git_sha1=etag if re.fullmatch(r"[0-9a-f]{40}", etag) else None,
        size=file.size if file.size is not None else meta.size,
    )


@contextlib.contextmanager
def _quiet_hub_retries() -> Iterator[None]:
    """Keep huggingface_hub's per-retry warnings (a dozen lines when offline) off stderr: the outcome is
    reported once, as a :class:`DataError`."""
    hub_http = logging.getLogger("huggingface_hub.utils._http")
    level = hub_http.level
    hub_http.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        hub_http.setLevel(level)


def _hub_errors() -> tuple[type[BaseException], ...]:
    """What ``get_hf_file_metadata`` raises for an unreachable or misbehaving endpoint."""
    errors: list[type[BaseException]] = [OSError, ValueError]
    with contextlib.suppress(ImportError):
        import httpx

        errors.append(httpx.HTTPError)
    with contextlib.suppress(ImportError):
        from huggingface_hub.errors import HfHubHTTPError

        errors.append(HfHubHTTPError)
    return tuple(errors)


# --- fetching ------------------------------------------------------------------------------------------


def fetch(file: RemoteFile, downloads: Path, *, quiet: bool = False) -> Fetched:
    """Download ``file`` into ``downloads`` (resuming a ``.part`` file of the same version) and verify it.

    Returns:
        ``<filename>`` (confirmed) when it matched a published checksum or is already installed, else
        ``unverified/<filename>``, for the caller to promote with :func:`promote` once it has been
        converted, or delete.

    Raises:
        DataError: HTTP error, unreachable host, repeated drops (the partial file is kept for the next
            run), or a checksum/size mismatch (the partial file is deleted).
    """
    dest = downloads / file.filename
    if dest.is_file():
        return Fetched(dest, confirmed=True)  # only a checksum-verified or converted file has this name
    pending = downloads / UNVERIFIED / file.filename
    if pending.is_file():
        return Fetched(pending, confirmed=False)  # complete, not yet converted (e.g. a killed conversion)
    downloads.mkdir(parents=True, exist_ok=True)
    url, expected = resolve(file)
    part = dest.with_name(dest.name + ".part")
    last = ""
    for _attempt in range(_ATTEMPTS):
        try:
            _transfer(url, part, expected, quiet=quiet, label=file.filename)
            break
        except _Interrupted as exc:
            last = str(exc)
            log.warning("download of %s interrupted (%s); resuming", file.filename, last)
    else:
        raise DataError(
            f"downloading {file.filename} from {redact(url)} was interrupted {_ATTEMPTS} times ({last}); "
            f"the partial file {part} is kept: run the command again to resume"
        )
    checked = _verify(part, expected, file)
    target = dest if checked else pending
    target.parent.mkdir(exist_ok=True)
    part.replace(target)
    _validator_file(part).unlink(missing_ok=True)
    return Fetched(target, confirmed=checked)


def promote(fetched: Fetched) -> Path:
    """Move a converted ``unverified/<filename>`` to ``<filename>``, so later runs reuse it."""
    if fetched.confirmed:
        return fetched.path
    final = fetched.path.parent.parent / fetched.path.name
    fetched.path.replace(final)
    _drop_empty(fetched.path.parent)
    return final


def _drop_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not empty: another file awaits its conversion
        folder.rmdir()


def _validator_file(part: Path) -> Path:
    return part.with_name(part.name + VALIDATOR)


def _validator_of(response: http.client.HTTPResponse) -> str | None:
    """The ``If-Range`` value naming the version ``response`` is of: a strong ETag, else Last-Modified."""
    etag = (response.headers.get("ETag") or "").strip()
    if etag and not etag.startswith("W/"):  # If-Range takes strong validators only (RFC 9110 13.1.5)
        return etag
    return (response.headers.get("Last-Modified") or "").strip() or None


def _read_validator(part: Path) -> str | None:
    try:
        text = _validator_file(part).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    # One header value; anything else (a damaged file) cannot be sent and is not trusted.
    return text if text and text.isprintable() else None


def _transfer(url: str, part: Path, expected: Expected, *, quiet: bool, label: str) -> None:
    have = part.stat().st_size if part.exists() else 0
    validator = _read_validator(part) if have else None
    if have and validator is None:
        # Written by an older ragsuite, or the server named no version: the bytes may be of another version
        # of the file, so they are not resumed.
        log.info("%s: the partial file names no version of the file; downloading from byte 0", label)
        have = 0
    if expected.size is not None and have and have == expected.size:
        return
    if expected.size is not None and have > expected.size:
        have = 0
    headers = {"User-Agent": f"ragsuite/{__version__}", "Accept-Encoding": "identity"}
    if have:
        headers["Range"] = f"bytes={have}-"
        headers["If-Range"] = validator  # type: ignore[assignment]
    try:
        response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=_TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:
            return  # the part already holds the whole file of this version; verification decides
        raise DataError(
            f"GET {redact(url)} failed: HTTP {exc.code} {exc.reason}. The file may have moved: see "
            f"`ragsuite data sources` for its origin, or set {MIRROR_ENV} / HF_ENDPOINT to a mirror"
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        raise DataError(
            f"cannot reach {redact(url)}: {getattr(exc, 'reason', exc)}. Check the network, or set "
            f"{MIRROR_ENV}=http://host:port (official hosts) / HF_ENDPOINT (Hugging Face Hub) to a mirror"
        ) from None
    with response:
        resumed = have > 0 and response.status == 206 and _range_start(response) == have
        served = _validator_of(response)
        if resumed and served is not None and served != validator:
            # A server that ignores If-Range sent the rest of another version: start again from byte 0.
            part.unlink(missing_ok=True)
            _validator_file(part).unlink(missing_ok=True)
            raise _Interrupted(f"{label} changed on the server ({validator} -> {served}); starting over")
        if not resumed:
            have = 0  # the whole file (a new version, or a server without Range): it replaces the part
            _validator_file(part).unlink(missing_ok=True)
        length = response.headers.get("Content-Length")
        total = have + int(length) if length and length.isdigit() else expected.size
        with (
            part.open("ab" if resumed else "wb") as out,
            _progress(
                quiet, total=total, initial=have, unit="B", unit_scale=True, unit_divisor=1024, desc=label
            ) as bar,
        ):
            if not resumed and served is not None:
                # Written after the part was emptied: a validator always names the bytes beside it.
                atomic_write_text(_validator_file(part), served + "\n")
            while True:
                try:
                    block = response.read(_BLOCK)
                except (http.client.IncompleteRead, ConnectionError, TimeoutError, OSError) as exc:
                    raise _Interrupted(f"{type(exc).__name__} after {out.tell()} bytes") from None
                if not block:
                    break
                out.write(block)
                bar.update(len(block))
            got = out.tell()
    if total is not None and got < total:
        raise _Interrupted(f"connection closed after {got} of {total} bytes")


def _range_start(response: http.client.HTTPResponse) -> int | None:
    match = re.match(r"bytes (\d+)-", response.headers.get("Content-Range", ""))
    return int(match.group(1)) if match else None


def _verify(part: Path, expected: Expected, file: RemoteFile) -> bool:
    """Check ``part`` against what is published; ``True`` when a checksum confirmed it."""
    size = part.stat().st_size if part.exists() else 0
    problems = []
    if expected.size is not None and size != expected.size:
        problems.append(f"{size} bytes, expected {expected.size}")
    if not problems and (expected.sha256 or expected.git_sha1):
        sha256, git_sha1 = hashlib.sha256(), hashlib.sha1(f"blob {size}\0".encode())
        with part.open("rb") as handle:
            for block in iter(lambda: handle.read(_BLOCK), b""):
                sha256.update(block)
                git_sha1.update(block)
        if expected.sha256 and sha256.hexdigest() != expected.sha256:
            problems.append(f"sha256 {sha256.hexdigest()}, expected {expected.sha256}")
        if expected.git_sha1 and git_sha1.hexdigest() != expected.git_sha1:
            problems.append(f"git blob sha1 {git_sha1.hexdigest()}, expected {expected.git_sha1}")
    if not problems and size == 0:
        problems.append("0 bytes")
    if problems:
        part.unlink(missing_ok=True)
        _validator_file(part).unlink(missing_ok=True)
        raise DataError(
            f"{file.filename} (from {file.origin}) is not the published file: {'; '.join(problems)}. "
            f"The partial download {part} was deleted; run the command again to download it afresh"
        )
    if not (expected.sha256 or expected.git_sha1 or expected.size is not None):
        log.info(
            "%s: no checksum or size is published; checked by complete transfer and row count", part.name
        )
    return bool(expected.sha256 or expected.git_sha1)


# --- reading archives ----------------------------------------------------------------------------------


def open_members(path: Path, patterns: Sequence[str]) -> Iterator[Stream]:
    """The streams to convert from ``path``: the file itself (gunzipped if ``.gz``), or the members of a
    zip/tar archive matching ``patterns`` (each decompressed if ``.bz2``/``.gz``).

    A stream that cannot be read (bad gzip/bz2/zip data, a truncated file) raises
    :class:`~ragsuite.errors.DataError` naming it.

    Raises:
        DataError: a pattern matches no member (the message lists some of the members), or the archive
            cannot be read.
    """
    if not patterns:
        with _decompressed(str(path), path.name, path.open("rb")) as stream:
            yield str(path), stream
        return
    if zipfile.is_zipfile(path):
        try:
            archive = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError, ValueError) as exc:
            raise DataError(f"{path}: not a readable zip archive ({_problem(exc)})") from None
        with archive:
            names = [n for n in archive.namelist() if not n.endswith("/") and "__MACOSX" not in n]
            for pattern in patterns:
                matched = sorted(n for n in names if fnmatch.fnmatch(n, pattern))
                if not matched:
                    _no_member(path, pattern, names)
                for name in matched:
                    location = f"{path}!{name}"
                    try:
                        member = archive.open(name)
                    except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError) as exc:
                        raise DataError(f"{location}: not a readable zip member ({_problem(exc)})") from None
                    with _decompressed(location, name, member) as stream:
                        yield location, stream
        return
    try:
        archive = tarfile.open(path, "r|*")  # streaming: members are read in archive order, once
    except (tarfile.TarError, *_UNREADABLE) as exc:
        raise DataError(f"{path}: neither a zip nor a tar archive ({_problem(exc)})") from None
    seen: list[str] = []
    hit = dict.fromkeys(patterns, False)
    with archive:
        for member in _tar_members(path, archive):
            seen.append(member.name)
            matches = [p for p in patterns if fnmatch.fnmatch(member.name, p)]
            if not member.isfile() or not matches:
                continue
            for pattern in matches:
                hit[pattern] = True
            location = f"{path}!{member.name}"
            raw = archive.extractfile(member)
            assert raw is not None  # a regular file
            # Members of a streamed tar cannot answer seekable(), which text and bz2 readers ask.
            with _decompressed(
                location, member.name, io.BufferedReader(_Guarded(raw, location), _BLOCK)
            ) as stream:
                yield location, stream
    for pattern, found in hit.items():
        if not found:
            _no_member(path, pattern, seen)


_UNREADABLE: tuple[type[Exception], ...] = (
    OSError,  # gzip.BadGzipFile, bz2 "Invalid data stream", a truncated file
    EOFError,  # a compressed stream that ends early
    zlib.error,
    zipfile.BadZipFile,  # a bad CRC or member header
    tarfile.TarError,
    ValueError,  # UnicodeDecodeError, and what a damaged archive makes its readers raise
    csv.Error,
)
"""What reading a damaged or foreign file raises, turned into a :class:`DataError` naming the file."""


def _problem(exc: BaseException) -> str:
    hint = " (the file is truncated)" if isinstance(exc, EOFError) else ""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}{hint}" if text else f"{type(exc).__name__}{hint}"


def _tar_members(path: Path, archive: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    iterator = iter(archive)
    while True:
        try:
            member = next(iterator)
        except StopIteration:
            return
        except DataError:
            raise
        except _UNREADABLE as exc:
            raise DataError(f"{path}: not a readable tar archive ({_problem(exc)})") from None
        yield member


def _no_member(path: Path, pattern: str, names: list[str]) -> None:
    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    raise DataError(f"{path}: no member matches {pattern!r} (members: {shown or 'none'})")


class _Guarded(io.RawIOBase):
    """A read-only, forward-only view of a stream whose read errors become a :class:`DataError` naming it."""

    def __init__(self, raw: IO[bytes], location: str) -> None:
        self._raw = raw
        self._location = location

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            data = self._raw.read(len(buffer))
        except DataError:
            raise
        except _UNREADABLE as exc:
            raise DataError(f"{self._location}: cannot be read ({_problem(exc)})") from None
        buffer[: len(data)] = data
        return len(data)


@contextlib.contextmanager
def _decompressed(location: str, name: str, raw: IO[bytes] | None) -> Iterator[IO[bytes]]:
    assert raw is not None
    with raw:
        if name.endswith(".bz2"):
            with bz2.open(raw) as stream:
                yield io.BufferedReader(_Guarded(stream, location), _BLOCK)
        elif name.endswith(".gz"):
            with gzip.open(raw) as stream:
                yield io.BufferedReader(_Guarded(stream, location), _BLOCK)
        else:
            yield io.BufferedReader(_Guarded(raw, location), _BLOCK)


# --- converting ----------------------------------------------------------------------------------------


def convert_source(source: Source, files: Sequence[Path], dest: Path, *, quiet: bool = False) -> int:
    """Stream ``files`` (one per input of ``source``) through its converter into ``dest`` atomically.

    Corpus rows get their passage id and are deduplicated by it. Returns the number of rows written.

    Raises:
        DataError: a malformed record (naming file, record and problem), or not the number of rows the
            source must have; ``dest`` is then left as it was.
    """
    inputs = [open_members(path, inp.members) for path, inp in zip(files, source.inputs, strict=True)]
    rows = _readable(STREAM_CONVERTERS[source.converter](inputs), files)
    corpus = source.kind == "corpus"
    if source.sample is not None:
        every = list(rows)
        if len(every) < source.sample:
            raise DataError(
                f"{source.dataset} {source.name}: {len(every)} questions, fewer than {source.sample}"
            )
        rows = iter(
            sorted(every, key=lambda row: hashlib.sha1(row["id"].encode()).hexdigest())[: source.sample]
        )
    # 64-bit keys: the id set of the 21M-passage corpus stays a fraction of the text's size.
    seen: set[int] = set()
    read = written = 0
    with (
        atomic_open(dest) as out,
        _progress(quiet, unit=" rows", desc=f"{source.dataset} {source.output}") as bar,
    ):
        for row in rows:
            read += 1
            if corpus:
                title, text = row["title"].strip(), row["text"].strip()
                pid = passage_id(title, text)
                key = int(pid, 16)
                if key in seen:
                    continue
                seen.add(key)
                row = {"id": pid, "title": title, "text": text}
            try:
                line = ujson.dumps(row, ensure_ascii=False, escape_forward_slashes=False)
            except (UnicodeError, OverflowError, ValueError) as exc:
                raise DataError(
                    f"{source.dataset} {source.name}: row {read} (id {row.get('id')!r}) of "
                    f"{', '.join(map(str, files))} cannot be written as JSON ({_problem(exc)})"
                ) from None
            out.write(line)
            out.write("\n")
            written += 1
            bar.update()
        count = read if corpus else written
        if source.expected_rows is not None and count != source.expected_rows:
            noun = "passages" if corpus else "questions"
            raise DataError(
                f"{source.dataset} {source.name}: the source holds {count} {noun}, expected "
                f"{source.expected_rows}; it is incomplete or not the published file. Nothing was written"
            )
        if written == 0:
            raise DataError(f"{source.dataset} {source.name}: no rows found in {', '.join(map(str, files))}")
    return written


def _readable(rows: Iterator[dict[str, Any]], files: Sequence[Path]) -> Iterator[dict[str, Any]]:
    """``rows``, with what reading a damaged file raises turned into a :class:`DataError` naming the files.

    Only the reading side is guarded: an error writing the output (a full disk) is not the source's fault.
    """
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except DataError:
            raise
        except _UNREADABLE as exc:
            raise DataError(f"{', '.join(map(str, files))}: cannot be read ({_problem(exc)})") from None
        yield row


# --- installing ----------------------------------------------------------------------------------------


def plan(
    names: Sequence[str],
    *,
    subset: str | None = None,
    corpus: str | None = None,
    catalogue: Catalogue | None = None,
) -> list[Source]:
    """The sources ``download`` would install, resolved before anything is fetched.

    Raises:
        DataError: an unknown dataset, subset or corpus (the message lists what exists).
    """
    catalogue = catalogue or CATALOGUE
    sources: list[Source] = []
    for name in names:
        for kind, choice in (("questions", subset), ("corpus", corpus)):
            if choice == NONE:
                continue
            found = catalogue.find(name, kind, choice)  # type: ignore[arg-type]
            if found is not None:
                sources.append(found)
    if not sources:
        raise DataError("nothing to download: every dataset was given --subset none and --corpus none")
    return sources


def download(
    names: Sequence[str],
    *,
    data_dir: str | os.PathLike[str] | None = None,
    subset: str | None = None,
    corpus: str | None = None,
    quiet: bool = False,
    force: bool = False,
    catalogue: Catalogue | None = None,
) -> list[Installed]:
    """Download and convert datasets into ``data_dir`` (``--data-dir`` > ``$RAGSUITE_DATA`` >
    ``~/.cache/ragsuite/data``).

    Args:
        names: Dataset names (see ``ragsuite data sources``).
        data_dir: The data root; created if missing.
        subset: The question set (``None``: each dataset's default; ``"none"``: no questions).
        corpus: The corpus (``None``: each dataset's default; ``"none"``: no corpus).
        quiet: No progress bars.
        force: Convert again even when the manifest says the file is installed from the same source, and
            replace files the downloader did not write (without it they stop the download before it starts).
        catalogue: The sources to choose from (default :data:`~ragsuite.data.sources.CATALOGUE`).

    Returns:
        One :class:`Installed` per file.
    """
    root = download_root(data_dir)
    sources = plan(names, subset=subset, corpus=corpus, catalogue=catalogue)
    for source in sources:
        target = root / source.dataset / source.output
        if not force and target.exists() and source.output not in read_manifest(target.parent):
            raise DataError(
                f"{target} exists and was not installed by `ragsuite data download`; nothing was downloaded. "
                "Pass --force to replace it, or choose another --data-dir"
            )
    installed = []
    for source in sources:
        installed.append(_install(source, root, quiet=quiet, force=force))
    return installed


def _install(source: Source, root: Path, *, quiet: bool, force: bool) -> Installed:
    folder = root / source.dataset
    dest = root / "corpora" / f"{source.name}.jsonl" if source.shared else folder / source.output
    manifest = read_manifest(folder)
    entry = manifest.get(source.output)
    if not force and entry and entry.get("source") == source.name and (folder / source.output).is_file():
        return Installed(
            source.dataset, source.name, folder / source.output, int(entry["rows"]), skipped=True
        )
    shared_done = source.shared and not force and dest.is_file() and _shared_rows(root, source) is not None
    if shared_done:
        rows = _shared_rows(root, source)
    else:
        fetched: dict[str, Fetched] = {}
        for inp in source.inputs:  # a file two inputs read is fetched once
            if inp.file.filename not in fetched:
                fetched[inp.file.filename] = fetch(inp.file, root / ".downloads", quiet=quiet)
        files = [fetched[inp.file.filename].path for inp in source.inputs]
        try:
            rows = convert_source(source, files, dest, quiet=quiet)
        except DataError as exc:
            raise _conversion_failed(exc, list(fetched.values())) from None
        for item in fetched.values():
            promote(item)
        if source.shared:
            atomic_write_text(dest.with_suffix(".rows"), f"{rows}\n")
    if source.shared:
        _link(folder / source.output, dest)
    manifest[source.output] = {"source": source.name, "rows": rows, "paper_subset": source.paper_subset}
    atomic_write_text(folder / MANIFEST, ujson.dumps(manifest, indent=2) + "\n")
    return Installed(source.dataset, source.name, folder / source.output, int(rows or 0))


def _conversion_failed(exc: DataError, fetched: list[Fetched]) -> DataError:
    """The conversion error, saying what became of the downloaded files: an unverified file is deleted
    (it is never reused), a checksum-verified one is kept."""
    unverified = [item.path for item in fetched if not item.confirmed]
    for path in unverified:
        path.unlink(missing_ok=True)
        _drop_empty(path.parent)
    notes = []
    if unverified:
        notes.append(
            f"{', '.join(p.name for p in unverified)} had no published checksum and could not be converted, "
            f"so it was deleted: run the command again to download it afresh; if the error persists, the "
            f"file at its origin is not the one ragsuite expects (see `ragsuite data sources`)"
        )
    kept = [item.path for item in fetched if item.confirmed]
    if kept:
        notes.append(
            f"{', '.join(str(p) for p in kept)} is kept (it matched its published checksum, or was converted "
            "before); delete it and run the command again if it was changed on disk"
        )
    return DataError(f"{exc}. {'; '.join(notes)}" if notes else str(exc))


def _shared_rows(root: Path, source: Source) -> int | None:
    marker = (root / "corpora" / f"{source.name}.jsonl").with_suffix(".rows")
    try:
        return int(marker.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def _link(link: Path, target: Path) -> None:
    """Point ``link`` at ``target`` (relative), replacing whatever ``link`` was, atomically."""
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.link")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(os.path.relpath(target, link.parent))
    os.replace(tmp, link)


def read_manifest(folder: Path) -> dict[str, Any]:
    """``{output file: {"source", "rows", "paper_subset"}}`` of a dataset folder (empty when none)."""
    try:
        data = ujson.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class Coverage:
    """How many of a question file's gold passage ids its dataset's corpus holds."""

    dataset: str
    questions: Path
    found: int
    gold: int


def gold_coverage(names: Sequence[str], *, data_dir: str | os.PathLike[str] | None = None) -> list[Coverage]:
    """For each dataset with its own (not shared) corpus installed, the gold ids of every installed question
    file that the corpus holds. Gold ids are ``sha1(title + "\\n" + text)[:16]`` of the question file's
    paragraphs: a paragraph worded differently in the corpus is missed, and retrieval recall against gold
    ids would then be understated. Shared corpora (Wikipedia) are not scanned: their datasets' gold
    passages (ASQA's annotator knowledge, StrategyQA's paragraphs) are not drawn from them.
    """
    root = download_root(data_dir)
    report = []
    for name in dict.fromkeys(names):
        folder = root / name
        corpus = folder / "corpus.jsonl"
        manifest = read_manifest(folder)
        if "corpus.jsonl" not in manifest or not corpus.is_file() or corpus.is_symlink():
            continue
        for output in manifest:
            questions = folder / output
            if output == "corpus.jsonl" or not questions.is_file():
                continue
            gold: set[str] = set()
            with questions.open(encoding="utf-8") as handle:
                for line in handle:
                    if line.strip():
                        gold.update(ujson.loads(line).get("gold_passage_ids") or [])
            if gold:
                report.append(Coverage(name, questions, len(gold & _corpus_ids(corpus, gold)), len(gold)))
    return report


def _corpus_ids(corpus: Path, wanted: set[str]) -> set[str]:
    found = set()
    with corpus.open(encoding="utf-8") as handle:
        for line in handle:
            # Lines we wrote start {"id":"<16 hex>": slice the id instead of parsing millions of rows.
            pid = line[7:23] if line.startswith('{"id":"') and line[23:24] == '"' else None
            if pid is None and line.strip():
                pid = str(ujson.loads(line).get("id"))
            if pid in wanted:
                found.add(pid)
    return found
