"""The evaluation datasets: what each one is, and loaders for the ``corpus.jsonl`` / ``<split>.jsonl`` layout.

Layout of ``<data_dir>/<name>/``:
    corpus.jsonl   {"id", "title", "text"} per line
    dev.jsonl      {"id", "question", "answers": [...], "type", "gold_passage_ids": [...],
                    "short_answers": [[alias, ...], ...]  (ASQA only)}

Your own question and corpus files may also be CSV, TSV or Parquet (Parquet needs pyarrow) with the same
columns. In CSV/TSV cells (and Parquet text columns) a list field is a JSON list (``["Rush", "rush"]``) or a
single value.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import ujson

from ragsuite.errors import DataError
from ragsuite.files import atomic_open
from ragsuite.passages import Passage
from ragsuite.paths import data_dir as resolve_data_dir

Task = Literal["short", "long", "yesno"]


@dataclass(frozen=True)
class DatasetInfo:
    """What a dataset asks of a program and how its paper scores it.

    Attributes:
        name: Registry name, also the folder name under the data directory.
        task: ``short`` (a short span), ``long`` (long-form, ASQA) or ``yesno`` (StrategyQA).
        metrics: Names of :mod:`ragsuite.data.metrics` functions reported for it, in table order.
        primary_metric: The metric optimizers maximize by default.
        has_corpus: Whether the dataset ships a retrieval corpus (TriviaQA here does not).
    """

    name: str
    task: Task
    metrics: tuple[str, ...]
    primary_metric: str
    has_corpus: bool = True


_SHORT = ("accuracy", "f1", "exact_match")
DATASETS: dict[str, DatasetInfo] = {
    info.name: info
    for info in (
        DatasetInfo("hotpotqa", "short", _SHORT, "accuracy"),
        DatasetInfo("2wikimultihopqa", "short", _SHORT, "accuracy"),
        DatasetInfo("musique", "short", _SHORT, "accuracy"),
        DatasetInfo("strategyqa", "yesno", ("yes_no_accuracy",), "yes_no_accuracy"),
        DatasetInfo("asqa", "long", ("str_em", "str_hit"), "str_em"),
        DatasetInfo("nq", "short", ("exact_match", "accuracy", "f1"), "exact_match"),
        DatasetInfo("triviaqa", "short", ("exact_match", "accuracy", "f1"), "exact_match", has_corpus=False),
    )
}


#: Answer styles for your own questions (``--task``): the metrics of the dataset family they resemble.
TASK_STYLES: dict[str, DatasetInfo] = {
    info.name: info
    for info in (
        DatasetInfo("short", "short", _SHORT, "accuracy", has_corpus=False),
        DatasetInfo("long", "long", ("str_em", "str_hit"), "str_em", has_corpus=False),
        DatasetInfo("yesno", "yesno", ("yes_no_accuracy",), "yes_no_accuracy", has_corpus=False),
    )
}


def dataset_names() -> list[str]:
    """Names accepted by :func:`load_dataset`."""
    return list(DATASETS)


def get_dataset_info(name: str) -> DatasetInfo:
    """A dataset's description, or the answer style ``short`` / ``long`` / ``yesno`` of your own questions."""
    info = DATASETS.get(name) or TASK_STYLES.get(name)
    if info is None:
        raise DataError(
            f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)} "
            f"(or an answer style for your own questions: {', '.join(TASK_STYLES)})"
        )
    return info


def file_sha256(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks (corpora can be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _stat_fingerprint(path: Path) -> dict[str, int]:
    st = path.stat()
    # ctime cannot be set by a program (unlike mtime), so any write to the file changes the fingerprint.
    return {
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
        "inode": st.st_ino,
        "device": st.st_dev,
    }


def file_sha256_cached(
    path: str | os.PathLike[str], *, cache_dir: str | os.PathLike[str] | None = None
) -> str:
    """:func:`file_sha256`, remembered per file while the file is unchanged.

    The hash is kept in ``<cache_dir>/file-sha256/`` with the file's size, mtime, ctime, inode and device;
    any write to the file, a rename over it or a copy in its place changes one of them, and the file is
    read again. This lets a 13 GB corpus be recognized without reading it on every command.
    """
    from ragsuite.paths import cache_dir as resolve_cache_dir

    resolved = Path(path).expanduser().resolve()
    record_path = (
        resolve_cache_dir(cache_dir)
        / "file-sha256"
        / (hashlib.sha256(str(resolved).encode("utf-8", "surrogatepass")).hexdigest()[:32] + ".json")
    )
    fingerprint = _stat_fingerprint(resolved)
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        if record.get("path") == str(resolved) and record.get("stat") == fingerprint:
            return str(record["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    digest = file_sha256(resolved)
    if _stat_fingerprint(resolved) == fingerprint:  # not changed while it was read
        try:
            record_path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_open(record_path) as handle:
                json.dump({"path": str(resolved), "stat": fingerprint, "sha256": digest}, handle)
        except OSError:
            pass  # only a cache: the next call hashes again
    return digest


#: Suffixes of the table formats :func:`read_table` reads.
TABLE_SUFFIXES = (".jsonl", ".csv", ".tsv", ".parquet")


def _utf8_error(path: Path, exc: UnicodeDecodeError) -> DataError:
    """The first line of ``path`` that is not UTF-8, named with its offending byte and the fix.

    Text readers decode ahead of the line they hand out, so the error's own position says nothing about
    the line: the file is scanned again, line by line, to find it."""
    with path.open("rb") as handle:
        for lineno, line in enumerate(handle, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as bad:
                byte = line[bad.start]
                return DataError(
                    f"{path}:{lineno}: not valid UTF-8 (byte 0x{byte:02x} at column {bad.start + 1}); "
                    "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                )
    return DataError(f"{path}: not valid UTF-8 ({exc.reason}); save the file as UTF-8")


def _iter_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line of a JSONL file, streamed."""
    with path.open(encoding="utf-8") as handle:
        try:
            for lineno, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    row = ujson.loads(line)
                except ValueError as exc:
                    raise DataError(f"{path}:{lineno}: not valid JSON ({exc})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
                yield lineno, row
        except UnicodeDecodeError as exc:
            raise _utf8_error(path, exc) from None


def _iter_delimited(path: Path, delimiter: str) -> Iterator[tuple[int, dict]]:
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle, delimiter=delimiter)
        try:
            for row in reader:
                if None in row:  # more cells than header columns
                    raise DataError(
                        f"{path}:{reader.line_num}: {len(reader.fieldnames or []) + len(row[None])} cells "
                        f"but the header names {len(reader.fieldnames or [])} columns"
                    )
                if not any((value or "").strip() for value in row.values()):
                    continue
                yield reader.line_num, {key: value for key, value in row.items() if value is not None}
        except csv.Error as exc:
            raise DataError(
                f"{path}:{reader.line_num}: not valid {path.suffix[1:].upper()} ({exc})"
            ) from None
        except UnicodeDecodeError as exc:
            raise _utf8_error(path, exc) from None


def _iter_parquet(path: Path) -> Iterator[tuple[int, dict]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"reading {path} (Parquet) needs pyarrow: pip install pyarrow") from None
    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=4096)
        row_number = 0  # rows are numbered from 1 like lines, so messages read "file:row"
        for batch in batches:
            for row in batch.to_pylist():
                row_number += 1
                yield row_number, row
    except DataError:
        raise
    except Exception as exc:  # pyarrow raises its own error types for damaged files
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None


def iter_table(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict]]:
    """Stream ``(line or row number, row)`` for every non-blank row of a JSONL, CSV, TSV or Parquet file.

    Raises:
        DataError: a missing or unreadable file, or an unknown suffix (messages name ``file:line``). An empty
            file yields nothing; :func:`read_table` is the variant that refuses it.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"{path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return _iter_jsonl(path)
    if suffix in (".csv", ".tsv"):
        return _iter_delimited(path, "," if suffix == ".csv" else "\t")
    if suffix == ".parquet":
        return _iter_parquet(path)
    raise DataError(f"{path}: unknown file type {suffix!r}; use one of {', '.join(TABLE_SUFFIXES)}")


def read_table(path: str | os.PathLike[str]) -> list[tuple[int, dict]]:
    """``(line or row number, row)`` for every non-blank row of a JSONL, CSV, TSV or Parquet file.

    Args:
        path: The file; its suffix (``.jsonl``, ``.csv``, ``.tsv``, ``.parquet``) picks the format.

    Raises:
        DataError: a missing, empty or unreadable file, or an unknown suffix (messages name ``file:line``).
    """
    rows = list(iter_table(path))
    if not rows:
        raise DataError(f"{Path(path).expanduser()} is empty: it has no rows")
    return rows


def count_table_rows(path: str | os.PathLike[str]) -> int:
    """About how many rows a table file holds, without parsing it (lines of a JSONL/CSV/TSV file, less the
    header; a Parquet file's recorded row count): a progress bar's total."""
    path = Path(path).expanduser()
    if path.suffix.lower() == ".parquet":
        try:
            import pyarrow.parquet as pq

            return int(pq.ParquetFile(path).metadata.num_rows)
        except Exception:  # the read itself reports a damaged file, with its line
            return 0
    lines = 0
    last = b"\n"
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 24), b""):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    lines += last != b"\n"
    return lines - (path.suffix.lower() in (".csv", ".tsv"))


def load_dataset(name: str, split: str = "dev", data_dir: str | os.PathLike[str] | None = None) -> list:
    """Load a split as ``dspy.Example`` objects with ``question`` as the only input.

    Args:
        name: A dataset name (see :func:`dataset_names`).
        split: The split file to read (``<split>.jsonl``).
        data_dir: Dataset root; defaults to ``$RAGSUITE_DATA`` or ``~/.cache/ragsuite/data``.

    Returns:
        Examples carrying ``question``, ``answers``, ``gold_passage_ids``, ``type``, ``id`` and, for ASQA,
        ``short_answers`` (a list of alias groups).

    Raises:
        DataError: unknown dataset, missing file, or a malformed line (the message names ``file:line``).

    Example:
        >>> examples = load_dataset("hotpotqa")
        >>> examples[0].question
        'Which Canadian rock band released a song called "Counterparts" ...'
    """
    info = get_dataset_info(name)
    path = resolve_data_dir(data_dir) / info.name / f"{split}.jsonl"
    if not path.is_file():
        raise DataError(f"{path} does not exist: {_download_hint(info.name, split)}")
    return load_examples_file(path, short_answers=info.name == "asqa", id_prefix=info.name)


def _download_hint(dataset: str, split: str) -> str:
    """Which download writes ``<split>.jsonl`` for ``dataset``, or else the splits the downloads write."""
    from ragsuite.data.sources import CATALOGUE

    offered = CATALOGUE.of(dataset, "questions")
    for source in sorted(offered, key=lambda source: not source.default):
        if source.split == split:
            flag = "" if source.default else f" --subset {source.name}"
            return f"`ragsuite data download {dataset}{flag}` writes it"
    written = sorted({f"{source.split}.jsonl (--subset {source.name})" for source in offered})
    if not written:
        return f"no download offers {dataset}'s questions; put your own {split}.jsonl there"
    example = offered[0].split
    return (
        f"no download writes {split}.jsonl for {dataset}; they write {', '.join(written)}: download one "
        f"and pass its split (e.g. --split {example})"
    )


def _string_list(value: object, path: Path, lineno: int, field: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str) and path.suffix.lower() != ".jsonl":
        # A text cell holds a JSON list or one value.
        text = value.strip()
        if not text:
            return []
        if not text.startswith("["):
            return [text]
        try:
            value = json.loads(text)
        except ValueError:
            raise DataError(f"{path}:{lineno}: {field!r} is not a valid JSON list: {text[:80]!r}") from None
    if not isinstance(value, list):
        raise DataError(f"{path}:{lineno}: {field!r} must be a list, got {type(value).__name__}")
    return [str(item) for item in value]


def load_examples_file(
    path: str | os.PathLike[str], *, short_answers: bool | None = None, id_prefix: str | None = None
) -> list:
    """Load a question file: the ``dev.jsonl`` layout as JSONL, CSV, TSV or Parquet.

    Args:
        path: The file; columns ``question`` and ``answers`` (required), ``id``, ``gold_passage_ids``,
            ``type``, ``short_answers`` (optional).
        short_answers: Attach ``short_answers`` (ASQA alias groups) to every example; ``None`` attaches them
            when the first row has the field.
        id_prefix: Prefix of the ids of rows without one (``<prefix>-<line>``); the file stem by default.

    Returns:
        ``dspy.Example`` objects as :func:`load_dataset` returns them.

    Raises:
        DataError: a missing or empty file, a missing column, a bad row or a repeated id (``file:line``).
    """
    import dspy

    path = Path(path).expanduser()
    rows = read_table(path)
    if short_answers is None:
        short_answers = "short_answers" in rows[0][1]
    prefix = id_prefix or path.stem
    examples = []
    seen: dict[str, int] = {}
    for lineno, row in rows:
        question = row.get("question")
        if not isinstance(question, str) or not question.strip():
            raise DataError(f"{path}:{lineno}: missing or empty 'question'")
        if "answers" not in row:
            raise DataError(
                f"{path}:{lineno}: no 'answers' (the accepted answers; columns found: {', '.join(row)})"
            )
        if path.suffix.lower() == ".jsonl" and not isinstance(row["answers"], list):
            raise DataError(f"{path}:{lineno}: 'answers' must be a list")
        raw_id = row.get("id")
        example_id = str(raw_id) if raw_id not in (None, "") else f"{prefix}-{lineno}"
        if example_id in seen:
            raise DataError(
                f"{path}:{lineno}: id {example_id!r} repeats line {seen[example_id]}; ids must be unique"
            )
        seen[example_id] = lineno
        fields = {
            "id": example_id,
            "question": question,
            "answers": _string_list(row["answers"], path, lineno, "answers"),
            "gold_passage_ids": _string_list(row.get("gold_passage_ids"), path, lineno, "gold_passage_ids"),
            "type": str(row.get("type") or ""),
        }
        if short_answers:
            groups = row.get("short_answers") or []
            if isinstance(groups, str) and groups.strip():
                try:
                    groups = json.loads(groups)
                except ValueError:
                    groups = None
            if not isinstance(groups, list) or not all(isinstance(group, list) for group in groups):
                raise DataError(f"{path}:{lineno}: 'short_answers' must be a list of alias lists")
            fields["short_answers"] = [[str(a) for a in group] for group in groups]
        examples.append(dspy.Example(**fields).with_inputs("question"))
    return examples


def write_jsonl(path: str | os.PathLike[str], rows: Iterable[dict]) -> int:
    """Write ``rows`` as JSONL atomically (a temporary file in the same folder, then a rename).

    Returns:
        The number of rows written.
    """
    count = 0
    with atomic_open(path) as handle:
        for row in rows:
            handle.write(ujson.dumps(row, ensure_ascii=False, escape_forward_slashes=False))
            handle.write("\n")
            count += 1
    return count


def corpus_path(name: str, data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The ``corpus.jsonl`` of a dataset, checked to exist."""
    info = get_dataset_info(name)
    if not info.has_corpus:
        raise DataError(
            f"dataset {name!r} ships no corpus; retrieve from another dataset's corpus or a server"
        )
    path = resolve_data_dir(data_dir) / info.name / "corpus.jsonl"
    if not path.is_file():
        raise DataError(f"{path} does not exist: `ragsuite data download {info.name}` installs its corpus")
    return path


def load_corpus(name: str, data_dir: str | os.PathLike[str] | None = None) -> list[Passage]:
    """Load a dataset's retrieval corpus (``corpus.jsonl``) as passages."""
    return load_corpus_file(corpus_path(name, data_dir))


def iter_corpus_file(path: str | os.PathLike[str]) -> Iterator[tuple[int, Passage]]:
    """Stream ``(line, passage)`` from a corpus file (JSONL, TSV, CSV or Parquet with ``id``, ``title``,
    ``text``), holding one row at a time. Repeated ids are not detected here (that needs every id):
    :func:`load_corpus_file` and the BM25 index build check them.

    Raises:
        DataError: a missing file, a missing column or an empty id (``file:line``).
    """
    path = Path(path).expanduser()
    for lineno, row in iter_table(path):
        if "id" not in row or "text" not in row:
            raise DataError(
                f"{path}:{lineno}: a corpus line needs 'id' and 'text' (columns found: {', '.join(row)})"
            )
        pid = "" if row["id"] is None else str(row["id"]).strip()
        if not pid:
            raise DataError(f"{path}:{lineno}: empty passage 'id'")
        yield lineno, Passage(id=pid, title=str(row.get("title") or ""), text=str(row["text"] or ""))


def load_corpus_file(path: str | os.PathLike[str]) -> list[Passage]:
    """Load a corpus file (JSONL, TSV, CSV or Parquet with ``id``, ``title``, ``text``) as passages.

    Raises:
        DataError: a missing or empty file, a missing column, an empty id or a repeated one (``file:line``).
    """
    path = Path(path).expanduser()
    passages: list[Passage] = []
    seen: dict[str, int] = {}
    for lineno, passage in iter_corpus_file(path):
        if passage.id in seen:
            raise DataError(
                f"{path}:{lineno}: duplicate passage id {passage.id!r} (first on line {seen[passage.id]})"
            )
        seen[passage.id] = lineno
        passages.append(passage)
    if not passages:
        raise DataError(f"{path} is empty: it has no rows")
    return passages


def load_corpus_source(path: str | os.PathLike[str]) -> tuple[list[Passage], dict[str, str]]:
    """A corpus file's passages and where they came from: ``{"corpus_path", "corpus_sha256"}``.

    The absolute path and content hash let a saved program find the same corpus again and notice when the
    file changed.
    """
    resolved = Path(path).expanduser().resolve()
    passages = load_corpus_file(resolved)
    return passages, {"corpus_path": str(resolved), "corpus_sha256": file_sha256_cached(resolved)}
