"""The evaluation datasets: what each one is, and loaders for the ``corpus.jsonl`` / ``<split>.jsonl`` layout.

Layout of ``<data_dir>/<name>/``:
    corpus.jsonl   {"id", "title", "text"} per line
    dev.jsonl      {"id", "question", "answers": [...], "type", "gold_passage_ids": [...],
                    "short_answers": [[alias, ...], ...]  (ASQA only)}
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import ujson

from ragsuite.errors import DataError
from ragsuite.files import atomic_open
from ragsuite.paths import data_dir as resolve_data_dir
from ragsuite.retrieval.base import Passage

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


def dataset_names() -> list[str]:
    """Names accepted by :func:`load_dataset`."""
    return list(DATASETS)


def get_dataset_info(name: str) -> DatasetInfo:
    try:
        return DATASETS[name]
    except KeyError:
        raise DataError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}") from None


def _read_jsonl(path: Path) -> list[tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line of a JSONL file."""
    if not path.is_file():
        raise DataError(f"{path} does not exist")
    rows = []
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = ujson.loads(line)
            except ValueError as exc:
                raise DataError(f"{path}:{lineno}: not valid JSON ({exc})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            rows.append((lineno, row))
    return rows


def load_dataset(name: str, split: str = "dev", data_dir: str | os.PathLike[str] | None = None) -> list:
    """Load a split as ``dspy.Example`` objects with ``question`` as the only input.

    Args:
        name: A dataset name (see :func:`dataset_names`).
        split: The split file to read (``<split>.jsonl``).
        data_dir: Dataset root; defaults to ``$RAGSUITE_DATA`` or ``../shared/data``.

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
    return load_examples_file(path, short_answers=info.name == "asqa", id_prefix=info.name)


def _string_list(value: object, path: Path, lineno: int, field: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise DataError(f"{path}:{lineno}: {field!r} must be a list, got {type(value).__name__}")
    return [str(item) for item in value]


def load_examples_file(
    path: str | os.PathLike[str], *, short_answers: bool | None = None, id_prefix: str | None = None
) -> list:
    """Load any file in the ``dev.jsonl`` layout (for instance one ``ragsuite data convert`` wrote).

    Args:
        path: The JSONL file.
        short_answers: Attach ``short_answers`` (ASQA alias groups) to every example; ``None`` attaches them
            when the first row has the field.
        id_prefix: Prefix of the ids of rows without one (``<prefix>-<line>``); the file stem by default.

    Returns:
        ``dspy.Example`` objects as :func:`load_dataset` returns them.
    """
    import dspy

    path = Path(path)
    rows = _read_jsonl(path)
    if short_answers is None:
        short_answers = bool(rows) and "short_answers" in rows[0][1]
    prefix = id_prefix or path.stem
    examples = []
    for lineno, row in rows:
        question = row.get("question")
        answers = row.get("answers")
        if not isinstance(question, str) or not question.strip():
            raise DataError(f"{path}:{lineno}: missing or empty 'question'")
        if not isinstance(answers, list):
            raise DataError(f"{path}:{lineno}: 'answers' must be a list")
        fields = {
            "id": str(row.get("id", f"{prefix}-{lineno}")),
            "question": question,
            "answers": [str(a) for a in answers],
            "gold_passage_ids": _string_list(row.get("gold_passage_ids"), path, lineno, "gold_passage_ids"),
            "type": str(row.get("type") or ""),
        }
        if short_answers:
            groups = row.get("short_answers") or []
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


def load_corpus(name: str, data_dir: str | os.PathLike[str] | None = None) -> list[Passage]:
    """Load a dataset's retrieval corpus (``corpus.jsonl``) as passages."""
    info = get_dataset_info(name)
    if not info.has_corpus:
        raise DataError(
            f"dataset {name!r} ships no corpus; retrieve from another dataset's corpus or a server"
        )
    path = resolve_data_dir(data_dir) / info.name / "corpus.jsonl"
    return load_corpus_file(path)


def load_corpus_file(path: str | os.PathLike[str]) -> list[Passage]:
    """Load any ``{"id", "title", "text"}`` JSONL file as passages; ids must be unique."""
    path = Path(path)
    passages: list[Passage] = []
    seen: set[str] = set()
    for lineno, row in _read_jsonl(path):
        if "id" not in row or "text" not in row:
            raise DataError(f"{path}:{lineno}: a corpus line needs 'id' and 'text'")
        pid = str(row["id"])
        if pid in seen:
            raise DataError(f"{path}:{lineno}: duplicate passage id {pid!r}")
        seen.add(pid)
        passages.append(Passage(id=pid, title=str(row.get("title") or ""), text=str(row["text"])))
    return passages
