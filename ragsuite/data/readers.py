"""Readers for the public releases of the datasets, converting them to ragsuite's layout.

Each reader returns a :class:`ConvertedDataset` (passages + question rows) that :meth:`ConvertedDataset.write`
stores as ``corpus.jsonl`` / ``<split>.jsonl`` (see :mod:`ragsuite.data.datasets`), so that
``load_dataset(name, data_dir=...)`` and the BM25 index work on a user's full download exactly as on the
shipped dev samples.

Passage ids are ``sha1(title + "\\n" + text)[:16]`` (the scheme of the shipped corpora): stable across runs
and machines, and identical passages shared by several questions are stored once. Source ids (DPR
``passage_id``, ALCE doc ids) are not kept: they are not unique across the files a corpus is built from.

Every reader accepts a JSON array or JSON Lines in UTF-8 (a byte-order mark is allowed), and raises
:class:`~ragsuite.errors.DataError` naming the file, the record (``file:line`` for JSONL, ``file[index]`` for
an array) and what is wrong: malformed JSON, bytes that are not UTF-8, a UTF-16/UTF-32 file, an unpaired
``\\ud800``-style surrogate escape (not a character: it cannot be written as UTF-8), or a record longer than
:data:`MAX_RECORD_CHARS` characters (such a line would cost several times its size in memory to parse).

Fields read, per format:
    hotpotqa (``hotpot_dev_distractor_v1.json``): ``_id``, ``question``, ``answer``, ``type``,
        ``context`` = ``[[title, [sentence, ...]], ...]``,
        ``supporting_facts`` = ``[[title, sentence_index], ...]``.
        Each context paragraph is one passage (sentences concatenated); gold = paragraphs whose title is in
        ``supporting_facts``.
    2wikimultihopqa (``dev.json``): the HotpotQA fields; ``evidences``
        (``[[subject, relation, object], ...]``) is validated when present but not stored.
    musique (``musique_ans_v1.0_dev.jsonl`` / ``musique_full_v1.0_dev.jsonl``): ``id``, ``question``,
        ``answer``, ``answer_aliases``, ``answerable``,
        ``paragraphs`` = ``[{"idx", "title", "paragraph_text", "is_supporting"}]``.
        answers = answer + aliases; gold = supporting paragraphs; type = the id's prefix (``2hop``,
        ``3hop1``, ...). Unanswerable questions (the "full" release) are skipped unless
        ``include_unanswerable=True``.
    asqa (ALCE's ``asqa_eval_gtr_top100.json``; also the original ``ASQA.json`` with its ``train``/``dev``
        maps): ``sample_id``, ``question`` (or ``ambiguous_question``), ``qa_pairs[].short_answers``
        (one alias group per disambiguation), ``annotations[].long_answer`` (the answers),
        ``annotations[].knowledge[] = {"content", "wikipage"}`` (gold evidence) and
        ``docs[] = {"title", "text"}`` (retrieved passages, added to the corpus as non-gold).
    strategyqa (``strategyqa_train.json`` + ``strategyqa_train_paragraphs.json``): ``qid``, ``question``,
        ``answer`` (bool -> "yes"/"no"), ``evidence`` (per annotator, per decomposition step: lists of
        paragraph ids, or "operation" / "no_evidence"). The paragraphs file maps a paragraph id to
        ``{"title", "content", ...}``; every evidence paragraph becomes a gold passage. Without it the corpus
        is empty.
    nq (NQ-open ``NQ-open.dev.jsonl``; DPR's ``nq-dev.json``; FiD-style files with ``ctxs``): ``question``,
        ``answer`` or ``answers``, optional ``id``. Passages, when present: DPR ``positive_ctxs`` (gold),
        ``negative_ctxs`` / ``hard_negative_ctxs`` (non-gold), or ``ctxs`` (gold where ``has_answer`` is
        true). Plain NQ-open has no passages: the corpus is then empty.

Example:
    >>> from ragsuite.data.readers import convert
    >>> stats = convert("hotpotqa", "hotpot_dev_distractor_v1.json", "mydata/hotpotqa")  # doctest: +SKIP
    >>> # then: load_dataset("hotpotqa", data_dir="mydata")
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import ujson

from ragsuite.data.datasets import write_jsonl
from ragsuite.errors import DataError
from ragsuite.passages import Passage, passage_id

log = logging.getLogger("ragsuite.data.readers")

PathLike = str | os.PathLike[str]

MAX_RECORD_CHARS = 64 << 20
"""The longest record read: a JSON Lines line, or one item of a JSON array (64 Mi characters). The largest
record of the supported releases is well under 1 MB; parsing a line costs a few times its size in memory, so
a longer one is refused with an error instead. A file whose first line is not a whole JSON value is read as
one JSON document (the original ASQA.json, StrategyQA's paragraphs map), whole, and is not bounded."""

_RAW_SURROGATE = re.compile(r"[\ud800-\udfff]")
# In text decoded with errors="surrogateescape", a byte that is not UTF-8 reads as U+DC80..U+DCFF.
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
# A \ud800-\udfff escape: half of a UTF-16 pair; decoded alone it is no character.


@dataclass
class ConvertedDataset:
    """Passages and question rows in ragsuite's layout.

    Attributes:
        passages: The deduplicated corpus, in first-seen order.
        rows: One dict per question: ``id``, ``question``, ``answers``, ``type``, ``gold_passage_ids``
            and, for ASQA, ``short_answers``.
    """

    passages: list[Passage] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)

    def write(self, out_dir: PathLike, *, split: str = "dev") -> dict[str, Any]:
        """Write ``corpus.jsonl`` and ``<split>.jsonl`` under ``out_dir``, each atomically.

        Returns:
            ``{"questions", "passages", "corpus", "split"}`` (counts and the two file paths).
        """
        out = Path(out_dir)
        corpus_path = out / "corpus.jsonl"
        split_path = out / f"{split}.jsonl"
        n_passages = write_jsonl(
            corpus_path, ({"id": p.id, "title": p.title, "text": p.text} for p in self.passages)
        )
        n_rows = write_jsonl(split_path, self.rows)
        return {
            "questions": n_rows,
            "passages": n_passages,
            "corpus": str(corpus_path),
            "split": str(split_path),
        }


class _Corpus:
    """Collects passages, deduplicated by id."""

    def __init__(self) -> None:
        self._passages: dict[str, Passage] = {}

    def add(self, title: str, text: str) -> str:
        title, text = title.strip(), text.strip()
        pid = passage_id(title, text)
        self._passages.setdefault(pid, Passage(id=pid, title=title, text=text))
        return pid

    def passages(self) -> list[Passage]:
        return list(self._passages.values())


def _read_records(path: PathLike) -> Iterator[tuple[str, Any]]:
    """``(location, record)`` for a JSON array (``file[i]``) or a JSON Lines file (``file:line``)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} does not exist")
    with path.open("rb") as handle:
        head = handle.read(4096)
        _check_bytes_encoding(str(path), head)
        if not head.removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"["):
            # JSON Lines, or one JSON document: read incrementally, each line bounded.
            handle.seek(0)
            yield from iter_json_stream((str(path), handle))
            return
        handle.seek(0)
        data = handle.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataError(_not_utf8(f"{path}:{line}", data[exc.start])) from None
    del data
    try:
        records = _loads(text)
    except (ValueError, OverflowError, RecursionError) as exc:
        raise DataError(f"{path}: not valid JSON ({_reason(exc)})") from None
    escaped = _ESCAPED_SURROGATE.search(text) is not None
    del text
    for index, record in enumerate(records):
        where = f"{path}[{index}]"
        if escaped:
            _check_surrogates(where, record)
        yield where, record


def _not_utf8(where: str, byte: int) -> str:
    return (
        f"{where}: byte 0x{byte:02x} is not valid UTF-8; ragsuite reads UTF-8 files: re-save the file as "
        "UTF-8 (e.g. iconv -f LATIN1 -t UTF-8 IN > OUT, naming its real encoding)"
    )


def _utf16(name: str) -> str:
    return (
        f"{name}: the file is UTF-16 or UTF-32 encoded; ragsuite reads UTF-8: convert it first "
        "(e.g. iconv -f UTF-16 -t UTF-8 IN > OUT)"
    )


def _check_bytes_encoding(name: str, head: bytes) -> None:
    # A UTF-16/32 byte-order mark, or NUL bytes, which UTF-8 JSON never holds.
    if head.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in head[:4]:
        raise DataError(_utf16(name))


def _check_raw(where: str, text: str, pos: int = 0, endpos: int | None = None) -> None:
    """Refuse text decoded with ``surrogateescape`` that held a byte that is not UTF-8."""
    if text.isascii():  # O(1) in CPython
        return
    found = _RAW_SURROGATE.search(text, pos, len(text) if endpos is None else endpos)
    if found:
        code = ord(found.group())
        raise DataError(_not_utf8(where, code - 0xDC00 if 0xDC80 <= code <= 0xDCFF else code))


def _check_surrogates(where: str, record: Any) -> None:
    """Refuse a record holding a lone surrogate (from a ``\\ud800``-style escape): it is no character,
    and no UTF-8 file can hold it."""
    stack = [record]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if item.isascii():
                continue
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise DataError(
                    f"{where}: the escape \\u{ord(item[exc.start]):04x} is half of a UTF-16 surrogate pair, "
                    "not a character (the file was written by a broken encoder); fix or remove the record"
                ) from None
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _too_long(where: str) -> DataError:
    return DataError(
        f"{where}: a record longer than {MAX_RECORD_CHARS:,} characters (ragsuite's limit, "
        f"{MAX_RECORD_CHARS >> 20} Mi); no dataset release has one: the file is damaged, or is not JSON Lines"
    )


def _field(record: Any, key: str, kind: type | tuple[type, ...], where: str, *, required: bool = True) -> Any:
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if key not in record or record[key] is None:
        if required:
            raise DataError(f"{where}: missing {key!r}")
        return None
    value = record[key]
    if not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise DataError(f"{where}: {key!r} must be {names}, got {type(value).__name__}")
    return value


def _question(record: Any, where: str, key: str = "question") -> str:
    question = _field(record, key, str, where)
    if not question.strip():
        raise DataError(f"{where}: empty {key!r}")
    return question.strip()


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(item for item in items if item))


def _join_sentences(sentences: list[str]) -> str:
    # HotpotQA sentences carry their own leading space; insert one only where a sentence lacks it.
    text = ""
    for sentence in sentences:
        if text and not text[-1].isspace() and not sentence[:1].isspace():
            text += " "
        text += sentence
    return text.strip()


def read_hotpotqa(path: PathLike) -> ConvertedDataset:
    """Read HotpotQA's distractor-setting JSON (see the module docstring for the fields)."""
    return _read_hotpot_like(path, evidences=False)


def read_2wikimultihopqa(path: PathLike) -> ConvertedDataset:
    """Read 2WikiMultihopQA's JSON: HotpotQA's shape plus ``evidences`` triples."""
    return _read_hotpot_like(path, evidences=True)


def _read_hotpot_like(path: PathLike, *, evidences: bool) -> ConvertedDataset:
    corpus = _Corpus()
    rows = [_hotpot_row(where, record, corpus, evidences=evidences) for where, record in _read_records(path)]
    return ConvertedDataset(corpus.passages(), rows)


def _hotpot_row(where: str, record: Any, corpus: _Corpus, *, evidences: bool) -> dict[str, Any]:
    qid = str(_field(record, "_id", (str, int), where))
    where = f"{where} ({qid})"
    question = _question(record, where)
    answer = _field(record, "answer", str, where).strip()
    if not answer:
        raise DataError(f"{where}: empty 'answer'")
    facts = _field(record, "supporting_facts", list, where)
    if evidences:
        triples = _field(record, "evidences", list, where, required=False) or []
        if not all(isinstance(t, list) for t in triples):
            raise DataError(f"{where}: 'evidences' must be a list of [subject, relation, object] triples")
    by_title = {title: corpus.add(title, text) for title, text in _hotpot_context(record, where)}
    gold = []
    for fact in facts:
        if not isinstance(fact, list) or len(fact) != 2 or not isinstance(fact[0], str):
            raise DataError(f"{where}: 'supporting_facts' must be a list of [title, sentence_index] pairs")
        if fact[0] not in by_title:
            raise DataError(f"{where}: supporting fact title {fact[0]!r} is not in 'context'")
        gold.append(by_title[fact[0]])
    return {
        "id": qid,
        "question": question,
        "answers": [answer],
        "type": str(record.get("type") or ""),
        "gold_passage_ids": _unique(gold),
    }


def _hotpot_context(record: Any, where: str) -> Iterator[tuple[str, str]]:
    """``(title, paragraph text)`` for each ``[title, [sentence, ...]]`` pair of a record's ``context``."""
    for item in _field(record, "context", list, where):
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not isinstance(item[0], str)
            or not isinstance(item[1], list)
            or not all(isinstance(s, str) for s in item[1])
        ):
            raise DataError(f"{where}: 'context' must be a list of [title, [sentence, ...]] pairs")
        yield item[0], _join_sentences(item[1])


def read_musique(path: PathLike, *, include_unanswerable: bool = False) -> ConvertedDataset:
    """Read MuSiQue's JSONL (answerable or full release; see the module docstring for the fields).

    Args:
        path: The JSONL file.
        include_unanswerable: Keep questions marked ``answerable: false`` (their gold list is then empty).
    """
    corpus, rows, skipped = _Corpus(), [], 0
    for where, record in _read_records(path):
        row = _musique_row(where, record, corpus, include_unanswerable=include_unanswerable)
        if row is None:
            skipped += 1
        else:
            rows.append(row)
    if skipped:
        log.info("skipped %d unanswerable MuSiQue questions in %s", skipped, path)
    return ConvertedDataset(corpus.passages(), rows)


def _musique_row(
    where: str, record: Any, corpus: _Corpus, *, include_unanswerable: bool
) -> dict[str, Any] | None:
    """One question row, or ``None`` for an unanswerable question that is not kept."""
    qid = str(_field(record, "id", (str, int), where))
    where = f"{where} ({qid})"
    question = _question(record, where)
    if record.get("answerable") is False and not include_unanswerable:
        return None
    answer = _field(record, "answer", str, where)
    aliases = _field(record, "answer_aliases", list, where, required=False) or []
    answers = _unique([answer.strip(), *(str(a).strip() for a in aliases)])
    if not answers and record.get("answerable") is not False:
        raise DataError(f"{where}: empty 'answer' on an answerable question")
    gold = [pid for pid, supporting in _musique_paragraphs(record, where, corpus) if supporting]
    return {
        "id": qid,
        "question": question,
        "answers": answers,
        "type": qid.split("__", 1)[0] if "__" in qid else "",
        "gold_passage_ids": _unique(gold),
    }


def _musique_paragraphs(record: Any, where: str, corpus: _Corpus) -> Iterator[tuple[str, bool]]:
    """``(passage id, is supporting)`` for each of a MuSiQue record's ``paragraphs``."""
    for index, para in enumerate(_field(record, "paragraphs", list, where)):
        spot = f"{where} paragraphs[{index}]"
        pid = corpus.add(_field(para, "title", str, spot), _field(para, "paragraph_text", str, spot))
        yield pid, para.get("is_supporting") is True


def read_asqa(path: PathLike, *, split: str = "dev") -> ConvertedDataset:
    """Read ASQA in ALCE's JSON (a list) or the original ``ASQA.json`` (``{split: {sample_id: ...}}``).

    Args:
        path: The JSON file.
        split: Which split of the original ``ASQA.json`` to read; ignored for ALCE's list.
    """
    corpus, rows = _Corpus(), []
    for where, record in _read_records(path):
        if isinstance(record, dict) and "qa_pairs" not in record and split in record:
            # The original release: {"train": {id: item}, "dev": {id: item}}.
            items = _field(record, split, dict, where)
            for sample_id, item in items.items():
                rows.append(_asqa_row(f"{where}[{split}][{sample_id}]", item, corpus, str(sample_id)))
        elif isinstance(record, dict) and "qa_pairs" not in record:
            raise DataError(
                f"{where}: neither an ALCE ASQA item (no 'qa_pairs') nor a map with a {split!r} split"
            )
        else:
            rows.append(_asqa_row(where, record, corpus, None))
    return ConvertedDataset(corpus.passages(), rows)


def _asqa_row(where: str, record: Any, corpus: _Corpus, sample_id: str | None) -> dict[str, Any]:
    if sample_id is None:
        sample_id = str(_field(record, "sample_id", (str, int), where))
    where = f"{where} ({sample_id})"
    key = "question" if isinstance(record, dict) and "question" in record else "ambiguous_question"
    question = _question(record, where, key)
    groups = []
    for index, pair in enumerate(_field(record, "qa_pairs", list, where)):
        aliases = _field(pair, "short_answers", list, f"{where} qa_pairs[{index}]")
        groups.append([str(a) for a in aliases])
    answers, gold = [], []
    for index, note in enumerate(_field(record, "annotations", list, where)):
        spot = f"{where} annotations[{index}]"
        long_answer = _field(note, "long_answer", str, spot)
        if long_answer.strip():
            answers.append(long_answer.strip())
        for k, knowledge in enumerate(_field(note, "knowledge", list, spot, required=False) or []):
            content = _field(knowledge, "content", str, f"{spot} knowledge[{k}]")
            title = _field(knowledge, "wikipage", str, f"{spot} knowledge[{k}]", required=False) or ""
            gold.append(corpus.add(title, content))
    if not answers and isinstance(record.get("answer"), str):
        answers.append(record["answer"].strip())
    if not answers:
        raise DataError(f"{where}: no long answer in 'annotations'")
    for index, doc in enumerate(_field(record, "docs", list, where, required=False) or []):
        spot = f"{where} docs[{index}]"
        corpus.add(_field(doc, "title", str, spot, required=False) or "", _field(doc, "text", str, spot))
    return {
        "id": sample_id,
        "question": question,
        "answers": _unique(answers),
        "type": "long-form",
        "gold_passage_ids": _unique(gold),
        "short_answers": groups,
    }


def _evidence_ids(evidence: Any) -> Iterator[str]:
    # Nested lists (annotator -> step -> items); items are paragraph-id lists or "operation"/"no_evidence".
    if isinstance(evidence, str):
        if evidence not in ("operation", "no_evidence"):
            yield evidence
    elif isinstance(evidence, list):
        for item in evidence:
            yield from _evidence_ids(item)


def read_strategyqa(path: PathLike, *, paragraphs: PathLike | None = None) -> ConvertedDataset:
    """Read StrategyQA's JSON, resolving evidence paragraph ids through the paragraphs JSON.

    Args:
        path: ``strategyqa_train.json`` (or a split of it in the same shape).
        paragraphs: ``strategyqa_train_paragraphs.json``: ``{paragraph_id: {"title", "content", ...}}``.
            Without it the corpus is empty and questions have no gold passages.
    """
    table: dict[str, Any] = {}
    if paragraphs is not None:
        records = list(_read_records(paragraphs))
        if len(records) != 1 or not isinstance(records[0][1], dict):
            raise DataError(f"{paragraphs}: expected one JSON object mapping paragraph ids to paragraphs")
        table = records[0][1]
    else:
        log.warning("no StrategyQA paragraphs file given: the corpus will be empty")
    corpus = _Corpus()
    rows = [
        _strategyqa_row(where, record, corpus, table, str(paragraphs))
        for where, record in _read_records(path)
    ]
    return ConvertedDataset(corpus.passages(), rows)


def _strategyqa_row(
    where: str, record: Any, corpus: _Corpus, table: dict[str, Any], paragraphs: str
) -> dict[str, Any]:
    qid = str(_field(record, "qid", (str, int), where))
    where = f"{where} ({qid})"
    question = _question(record, where)
    answer = _field(record, "answer", (bool, str), where)
    if isinstance(answer, str):
        if answer.strip().lower() not in ("yes", "no", "true", "false"):
            raise DataError(f"{where}: 'answer' must be true/false or yes/no, got {answer!r}")
        answer = answer.strip().lower() in ("yes", "true")
    gold = []
    if table:
        for para_id in _unique(list(_evidence_ids(record.get("evidence") or []))):
            if para_id not in table:
                raise DataError(f"{where}: evidence paragraph {para_id!r} is not in {paragraphs}")
            spot = f"{paragraphs} ({para_id})"
            para = table[para_id]
            gold.append(corpus.add(_field(para, "title", str, spot), _field(para, "content", str, spot)))
    return {
        "id": qid,
        "question": question,
        "answers": ["yes" if answer else "no"],
        "type": "yes/no",
        "gold_passage_ids": _unique(gold),
    }


def read_nq(path: PathLike) -> ConvertedDataset:
    """Read NQ-open JSONL, DPR's retriever JSON or a FiD-style file with ``ctxs`` (see the module doc)."""
    corpus, rows = _Corpus(), []
    for index, (where, record) in enumerate(_read_records(path)):
        question = _question(record, where)
        answers = record.get("answer", record.get("answers")) if isinstance(record, dict) else None
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(answers, list) or not answers:
            raise DataError(f"{where}: 'answer' (or 'answers') must be a non-empty list of strings")
        qid = str(record.get("id") or f"nq-open-{index:04d}")
        gold = []
        for key, is_gold in (
            ("positive_ctxs", True),
            ("negative_ctxs", False),
            ("hard_negative_ctxs", False),
        ):
            for k, ctx in enumerate(_field(record, key, list, where, required=False) or []):
                pid = _ctx(ctx, f"{where} {key}[{k}]", corpus)
                if is_gold:
                    gold.append(pid)
        for k, ctx in enumerate(_field(record, "ctxs", list, where, required=False) or []):
            pid = _ctx(ctx, f"{where} ctxs[{k}]", corpus)
            if ctx.get("has_answer") is True:
                gold.append(pid)
        rows.append(
            {
                "id": qid,
                "question": question,
                "answers": _unique([str(a).strip() for a in answers]),
                "type": "single-hop",
                "gold_passage_ids": _unique(gold),
            }
        )
    return ConvertedDataset(corpus.passages(), rows)


def _ctx(ctx: Any, where: str, corpus: _Corpus) -> str:
    return corpus.add(_field(ctx, "title", str, where, required=False) or "", _field(ctx, "text", str, where))


READERS: dict[str, Callable[..., ConvertedDataset]] = {
    "hotpotqa": read_hotpotqa,
    "2wikimultihopqa": read_2wikimultihopqa,
    "musique": read_musique,
    "asqa": read_asqa,
    "strategyqa": read_strategyqa,
    "nq": read_nq,
}
FORMATS: tuple[str, ...] = tuple(READERS)


def read(fmt: str, path: PathLike, **options: Any) -> ConvertedDataset:
    """Read ``path`` in the public format ``fmt`` (one of :data:`FORMATS`).

    Args:
        fmt: The format name (same as the dataset name).
        path: The downloaded file.
        **options: Format options: ``paragraphs=`` (strategyqa), ``split=`` (asqa's original file),
            ``include_unanswerable=`` (musique).
    """
    try:
        reader = READERS[fmt]
    except KeyError:
        raise DataError(f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}") from None
    return reader(path, **options)


def convert(
    fmt: str, path: PathLike, out_dir: PathLike, *, split: str = "dev", **options: Any
) -> dict[str, Any]:
    """Read a public file and write ``out_dir/corpus.jsonl`` and ``out_dir/<split>.jsonl``.

    Nothing is written when reading fails. Returns the counts and paths of :meth:`ConvertedDataset.write`.
    """
    if fmt == "asqa":
        options.setdefault("split", split)
    dataset = read(fmt, path, **options)
    if not dataset.rows:
        raise DataError(f"{path}: no questions found in {fmt} format")
    return dataset.write(out_dir, split=split)


# --- streaming readers ---------------------------------------------------------------------------------
# ``ragsuite data download`` converts files of up to tens of GB: these read a binary stream record by record
# and yield output rows (question rows, or ``{"title", "text"}`` passages that the writer numbers and
# deduplicates), never holding the whole file.

Stream = tuple[str, IO[bytes]]
"""A named binary stream: ``(location used in messages, stream)``."""

_CHUNK = 1 << 22


class _PassageIds:
    """Stands in for :class:`_Corpus` when only the passage ids are needed (question files)."""

    def add(self, title: str, text: str) -> str:
        return passage_id(title.strip(), text.strip())


def iter_json_stream(stream: Stream) -> Iterator[tuple[str, Any]]:
    """``(location, record)`` for each item of a JSON array or each line of a JSON Lines stream, read
    incrementally; a single pretty-printed JSON document (a map) is yielded whole.

    Raises:
        DataError: malformed JSON, bytes that are not UTF-8, a UTF-16/32 stream, an unpaired surrogate
            escape, or a record above :data:`MAX_RECORD_CHARS`, naming ``name[index]`` or ``name:line``.
    """
    name, raw = stream
    # Bytes that are not UTF-8 read as U+DC80..U+DCFF, so the record holding one is named in the error.
    text = io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape")
    head = text.read(_CHUNK)
    if head.startswith(("\udcff\udcfe", "\udcfe\udcff")) or "\x00" in head[:4]:
        raise DataError(_utf16(name))
    head = head.removeprefix("\ufeff")
    # Read on until the first non-blank character (array or not) and, for JSON Lines, the first whole line.
    while _undecided(head):
        if len(head) > MAX_RECORD_CHARS:
            raise _too_long(f"{name}:1")
        more = text.read(_CHUNK)
        if not more:
            break
        head += more
    stripped = head.lstrip()
    if stripped.startswith("["):
        del head
        yield from _iter_json_array(name, text, stripped[1:])
        return
    newline = stripped.find("\n")
    first = stripped[:newline] if newline >= 0 else stripped
    # A first line that is not a whole JSON value starts one pretty-printed document. A long first line is
    # a record (a document's first line is short), and is not parsed twice.
    if stripped.startswith("{") and len(first) <= _LONG_LINE and not _parses(first):
        del first, stripped
        document = head + text.read()
        del head
        _check_raw(name, document)
        try:
            record = _loads(document)
        except (ValueError, OverflowError, RecursionError) as exc:
            raise DataError(f"{name}: not valid JSON ({_reason(exc)})") from None
        if _ESCAPED_SURROGATE.search(document):
            _check_surrogates(name, record)
        del document
        yield name, record
        return
    del first, stripped
    pending = [head]
    del head  # the line reader holds the only reference: a long first line is not kept twice
    yield from _iter_json_lines(name, text, pending)


_LONG_LINE = 1 << 20
"""Above this many characters a line is parsed by :mod:`json` (about 1x its size in memory) rather than ujson
(faster on short lines, about 6x on long ones)."""


def _loads(text: str) -> Any:
    return ujson.loads(text) if len(text) <= _LONG_LINE else json.loads(text)


def _parses(text: str) -> bool:
    try:
        _loads(text)
    except (ValueError, OverflowError, RecursionError):
        return False
    return True


def _reason(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc)


def _iter_json_lines(name: str, text: IO[str], pending: list[str]) -> Iterator[tuple[str, Any]]:
    buffer = pending.pop()
    lineno = 0
    tail: list[str] = []  # the pieces of a line that spans chunks
    tail_chars = 0
    eof = False
    while True:
        lines = buffer.split("\n")
        buffer = ""
        last = lines.pop()
        if lines:
            if tail:
                tail.append(lines[0])
                lines[0] = "".join(tail)
                tail, tail_chars = [], 0
            for index, line in enumerate(lines):
                lineno += 1
                if len(line) > MAX_RECORD_CHARS:
                    raise _too_long(f"{name}:{lineno}")
                lines[index] = ""  # parsed lines are not kept
                yield from _json_line(f"{name}:{lineno}", line)
                del line
        del lines
        if last:
            tail.append(last)
            tail_chars += len(last)
            if tail_chars > MAX_RECORD_CHARS:
                raise _too_long(f"{name}:{lineno + 1}")
        del last
        if eof:
            break
        buffer = text.read(_CHUNK)
        eof = not buffer
    if tail:
        yield from _json_line(f"{name}:{lineno + 1}", "".join(tail))


def _json_line(where: str, line: str) -> Iterator[tuple[str, Any]]:
    if not line or line.isspace():
        return
    _check_raw(where, line)
    try:
        record = _loads(line)
    except (ValueError, OverflowError, RecursionError) as exc:
        raise DataError(f"{where}: not valid JSON ({_reason(exc)})") from None
    if "\\u" in line and _ESCAPED_SURROGATE.search(line):
        _check_surrogates(where, record)
    yield where, record


def _undecided(head: str) -> bool:
    stripped = head.lstrip()
    return not stripped or (not stripped.startswith("[") and "\n" not in stripped)


def _iter_json_array(name: str, text: IO[str], buffer: str) -> Iterator[tuple[str, Any]]:
    decoder = json.JSONDecoder()
    index, pos, eof = 0, 0, False
    while True:
        while pos < len(buffer) and (buffer[pos].isspace() or buffer[pos] == ","):
            pos += 1
        if pos >= len(buffer):
            if eof:
                raise DataError(f"{name}[{index}]: the JSON array ends without ']' (truncated file?)")
            more = text.read(_CHUNK)
            eof = not more
            buffer, pos = buffer[pos:] + more, 0
            continue
        if buffer[pos] == "]":
            return
        where = f"{name}[{index}]"
        try:
            record, end = decoder.raw_decode(buffer, pos)
        except json.JSONDecodeError as exc:
            if eof:
                _check_raw(where, buffer, pos)
                raise DataError(f"{where}: not valid JSON ({exc.msg})") from None
            if len(buffer) - pos > MAX_RECORD_CHARS:
                raise _too_long(where) from None
            # The item may continue in the next chunk: read more and parse it again.
            more = text.read(_CHUNK)
            eof = not more
            buffer, pos = buffer[pos:] + more, 0
            continue
        except (ValueError, RecursionError) as exc:  # e.g. an integer of more than 4300 digits
            raise DataError(f"{where}: not valid JSON ({type(exc).__name__}: {exc})") from None
        _check_raw(where, buffer, pos, end)
        if _ESCAPED_SURROGATE.search(buffer, pos, end):
            _check_surrogates(where, record)
        yield where, record
        index += 1
        buffer, pos = buffer[end:], 0


def stream_hotpot_like(inputs: list[Iterable[Stream]], *, evidences: bool) -> Iterator[dict[str, Any]]:
    """Question rows of HotpotQA / 2WikiMultihopQA JSON (see :func:`read_hotpotqa`)."""
    ids = _PassageIds()
    for stream in _chain(inputs):
        for where, record in iter_json_stream(stream):
            yield _hotpot_row(where, record, ids, evidences=evidences)  # type: ignore[arg-type]


def stream_musique(inputs: list[Iterable[Stream]]) -> Iterator[dict[str, Any]]:
    """Answerable question rows of MuSiQue JSONL (see :func:`read_musique`)."""
    ids = _PassageIds()
    for stream in _chain(inputs):
        for where, record in iter_json_stream(stream):
            row = _musique_row(where, record, ids, include_unanswerable=False)  # type: ignore[arg-type]
            if row is not None:
                yield row


def stream_asqa(inputs: list[Iterable[Stream]]) -> Iterator[dict[str, Any]]:
    """Question rows of ALCE's ASQA JSON array (see :func:`read_asqa`); its ``docs`` are not kept."""
    ids = _PassageIds()
    for stream in _chain(inputs):
        for where, record in iter_json_stream(stream):
            yield _asqa_row(where, record, ids, None)  # type: ignore[arg-type]


def stream_strategyqa(inputs: list[Iterable[Stream]]) -> Iterator[dict[str, Any]]:
    """Question rows of StrategyQA: ``inputs`` = [questions JSON, paragraphs JSON] (the paragraphs map is
    one JSON object and is read whole: it is the lookup table for every question's evidence)."""
    if len(inputs) != 2:
        raise DataError("strategyqa needs two inputs: the questions JSON and the paragraphs JSON")
    table_name, table = "", None
    for name, record in (item for stream in inputs[1] for item in iter_json_stream(stream)):
        if not isinstance(record, dict) or table is not None:
            raise DataError(f"{name}: expected one JSON object mapping paragraph ids to paragraphs")
        table_name, table = name, record
    if table is None:
        raise DataError("the StrategyQA paragraphs file is empty")
    ids = _PassageIds()
    for stream in inputs[0]:
        for where, record in iter_json_stream(stream):
            yield _strategyqa_row(where, record, ids, table, table_name)  # type: ignore[arg-type]


def stream_ircot(inputs: list[Iterable[Stream]]) -> Iterator[dict[str, Any]]:
    """Question rows of IRCoT's processed JSONL (``test_subsampled.jsonl``): ``question_id``,
    ``question_text``, ``answers_objects`` (``[{"spans": [...], ...}]``) and ``contexts``
    (``[{"title", "paragraph_text", "is_supporting"}]``, the gold paragraphs flagged)."""
    ids = _PassageIds()
    for stream in _chain(inputs):
        for where, record in iter_json_stream(stream):
            qid = str(_field(record, "question_id", (str, int), where))
            where = f"{where} ({qid})"
            question = _question(record, where, "question_text")
            answers = []
            for index, obj in enumerate(_field(record, "answers_objects", list, where)):
                spans = _field(obj, "spans", list, f"{where} answers_objects[{index}]", required=False)
                answers.extend(str(span).strip() for span in spans or [])
            if not _unique(answers):
                raise DataError(f"{where}: no answer span in 'answers_objects'")
            gold = []
            for index, para in enumerate(_field(record, "contexts", list, where, required=False) or []):
                spot = f"{where} contexts[{index}]"
                pid = ids.add(
                    _field(para, "title", str, spot, required=False) or "",
                    _field(para, "paragraph_text", str, spot),
                )
                if para.get("is_supporting") is True:
                    gold.append(pid)
            yield {
                "id": qid,
                "question": question,
                "answers": _unique(answers),
                "type": str(record.get("type") or (qid.split("__", 1)[0] if "__" in qid else "")),
                "gold_passage_ids": _unique(gold),
            }


def stream_flashrag(inputs: list[Iterable[Stream]]) -> Iterator[dict[str, Any]]:
    """Question rows of FlashRAG's JSONL: ``id``, ``question``, ``golden_answers`` (no passages)."""
    for stream in _chain(inputs):
        for where, record in iter_json_stream(stream):
            qid = str(_field(record, "id", (str, int), where))
            where = f"{where} ({qid})"
            question = _question(record, where)
            answers = _unique([str(a).strip() for a in _field(record, "golden_answers", list, where)])
            if not answers:
                raise DataError(f"{where}: empty 'golden_answers'")
            yield {
                "id": qid,
                "question": question,
                "answers": answers,
                "type": "single-hop",
                "gold_passage_ids": [],
            }


def stream_hotpot_contexts(inputs: list[Iterable[Stream]]) -> Iterator[dict[str, str]]:
    """Passages: every context paragraph of HotpotQA-shaped JSON files (IRCoT's 2WikiMultihopQA corpus)."""
    for stream in _chain(inputs):
        for where, record in iter_json_stream(stream):
            for title, text in _hotpot_context(record, where):
                yield {"title": title, "text": text}


def stream_musique_paragraphs(inputs: list[Iterable[Stream]]) -> Iterator[dict[str, str]]:
    """Passages: every paragraph of MuSiQue JSONL files (IRCoT's MuSiQue corpus)."""
    for stream in _chain(inputs):
        for where, record in iter_json_stream(stream):
            for index, para in enumerate(_field(record, "paragraphs", list, where)):
                spot = f"{where} paragraphs[{index}]"
                yield {
                    "title": _field(para, "title", str, spot),
                    "text": _field(para, "paragraph_text", str, spot),
                }


def stream_wiki_abstracts(inputs: list[Iterable[Stream]]) -> Iterator[dict[str, str]]:
    """Passages: HotpotQA's Wikipedia abstracts (JSON Lines ``{"title", "text": [sentence, ...]}``), each
    abstract one passage with its sentences stripped and joined by a space, as IRCoT indexes them."""
    for stream in _chain(inputs):
        for where, record in iter_json_stream(stream):
            sentences = _field(record, "text", list, where)
            if not all(isinstance(s, str) for s in sentences):
                raise DataError(f"{where}: 'text' must be a list of sentences")
            yield {
                "title": _field(record, "title", str, where),
                "text": " ".join(s.strip() for s in sentences),
            }


def stream_dpr_tsv(inputs: list[Iterable[Stream]]) -> Iterator[dict[str, str]]:
    """Passages of DPR's ``psgs_w100.tsv``: a header row ``id text title``, then one passage per row."""
    for name, raw in _chain(inputs):
        reader = csv.reader(io.TextIOWrapper(raw, encoding="utf-8", newline=""), delimiter="\t")
        rows = _tsv_rows(name, reader)
        header = next(rows, None)
        if header != ["id", "text", "title"]:
            raise DataError(f"{name}:1: expected the header 'id<TAB>text<TAB>title', got {header!r}")
        for row in rows:
            if len(row) != 3:
                raise DataError(
                    f"{name}:{reader.line_num}: expected 3 tab-separated fields (id, text, title), "
                    f"got {len(row)}"
                )
            yield {"title": row[2], "text": row[1]}


def _tsv_rows(name: str, reader: Any) -> Iterator[list[str]]:
    """The rows of a ``csv.reader``; a field above csv's size limit (131,072 characters: a DPR passage is
    about 600) or bytes that are not UTF-8 raise a :class:`DataError` naming the line."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise DataError(
                f"{name}:{reader.line_num}: {exc}; a passage is about 100 words: the file is damaged, or "
                "an unbalanced '\"' makes a field run on across lines"
            ) from None
        except UnicodeDecodeError as exc:
            raise DataError(
                _not_utf8(f"{name}: after line {reader.line_num}", exc.object[exc.start])
            ) from None
        yield row


def _chain(inputs: list[Iterable[Stream]]) -> Iterator[Stream]:
    for streams in inputs:
        yield from streams


STREAM_CONVERTERS: dict[str, Callable[[list[Iterable[Stream]]], Iterator[dict[str, Any]]]] = {
    "hotpotqa": lambda inputs: stream_hotpot_like(inputs, evidences=False),
    "2wikimultihopqa": lambda inputs: stream_hotpot_like(inputs, evidences=True),
    "musique": stream_musique,
    "asqa": stream_asqa,
    "strategyqa": stream_strategyqa,
    "ircot": stream_ircot,
    "flashrag": stream_flashrag,
    "hotpot_contexts": stream_hotpot_contexts,
    "musique_paragraphs": stream_musique_paragraphs,
    "wiki_abstracts": stream_wiki_abstracts,
    "dpr_tsv": stream_dpr_tsv,
}
"""Streaming converters by name (:attr:`ragsuite.data.sources.Source.converter`)."""
