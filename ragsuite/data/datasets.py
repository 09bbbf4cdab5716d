"""The evaluation datasets: what each one is, and loaders for the ``corpus.jsonl`` / ``<split>.jsonl`` layout.

Layout of ``<data_dir>/<name>/``:
    corpus.jsonl   {"id", "title", "text"} per line
    dev.jsonl      {"id", "question", "answers": [...], "type", "gold_passage_ids": [...],
                    "short_answers": [[alias, ...], ...]  (ASQA only)}
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import ujson

from ragsuite.errors import DataError
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


def _read_jsonl(path: Path) -> list[dict]:
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
            rows.append(row)
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

    Example:
        >>> examples = load_dataset("hotpotqa")
        >>> examples[0].question
        'Which Canadian rock band released a song called "Counterparts" ...'
    """
    import dspy

    info = get_dataset_info(name)
    path = resolve_data_dir(data_dir) / info.name / f"{split}.jsonl"
    examples = []
    for lineno, row in enumerate(_read_jsonl(path), 1):
        question = row.get("question")
        answers = row.get("answers")
        if not isinstance(question, str) or not question.strip():
            raise DataError(f"{path}:{lineno}: missing or empty 'question'")
        if not isinstance(answers, list):
            raise DataError(f"{path}:{lineno}: 'answers' must be a list")
        fields = {
            "id": str(row.get("id", f"{name}-{lineno}")),
            "question": question,
            "answers": [str(a) for a in answers],
            "gold_passage_ids": [str(p) for p in row.get("gold_passage_ids") or []],
            "type": str(row.get("type") or ""),
        }
        if info.name == "asqa":
            fields["short_answers"] = [[str(a) for a in group] for group in row.get("short_answers") or []]
        examples.append(dspy.Example(**fields).with_inputs("question"))
    return examples


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
    for lineno, row in enumerate(_read_jsonl(path), 1):
        if "id" not in row or "text" not in row:
            raise DataError(f"{path}:{lineno}: a corpus line needs 'id' and 'text'")
        pid = str(row["id"])
        if pid in seen:
            raise DataError(f"{path}:{lineno}: duplicate passage id {pid!r}")
        seen.add(pid)
        passages.append(Passage(id=pid, title=str(row.get("title") or ""), text=str(row["text"])))
    return passages
