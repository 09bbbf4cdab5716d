"""The catalogue of public sources ``ragsuite data download`` fetches, and how each maps to our layout.

A :class:`Source` is one thing a user can ask for: a question set (a split, or a paper's evaluation subset,
written to ``<name>/<split>.jsonl``) or a corpus (written to ``<name>/corpus.jsonl``). It names the remote
files it reads (:class:`RemoteFile`), the archive members inside them, the streaming converter that turns
them into rows (:data:`ragsuite.data.readers.STREAM_CONVERTERS`), and what is known to verify them.

Verification, per file, strongest first:
    * ``sha256`` + ``size`` recorded here (published by the host);
    * Hugging Face Hub files: the sha256 (LFS files) or git blob sha1 (small files) and the size the Hub
      publishes for the file, read at download time through ``huggingface_hub``;
    * official hosts that publish no checksum: ``size`` where published, else only a complete transfer
      (``Content-Length``) — and, for every source, the number of rows the converted file must have
      (``expected_rows``), which catches a truncated or substituted file.

Tests substitute their own :class:`Catalogue` (the real checksums cannot match tiny fixtures); the CLI uses
:data:`CATALOGUE`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from ragsuite.errors import DataError

Kind = Literal["questions", "corpus"]


@dataclass(frozen=True)
class RemoteFile:
    """One file on a public host or the Hugging Face Hub.

    Attributes:
        filename: Name of the downloaded file under ``<data dir>/.downloads/``.
        url: The official URL (fetched through ``$RAGSUITE_MIRROR`` when set). Empty for Hub files.
        hub_repo: ``owner/name`` of a Hub dataset repository (fetched through ``$HF_ENDPOINT`` when set).
        hub_path: The file's path in ``hub_repo``.
        hub_revision: Branch, tag or commit of ``hub_repo``.
        sha256: Published sha256 of the file, or ``None`` when none is published.
        size: Published size in bytes, or ``None`` when unknown.
        checksum_note: Where the checksum/size come from, or why there is none.
    """

    filename: str
    url: str = ""
    hub_repo: str = ""
    hub_path: str = ""
    hub_revision: str = "main"
    sha256: str | None = None
    size: int | None = None
    checksum_note: str = ""

    @property
    def origin(self) -> str:
        if self.hub_repo:
            return f"https://huggingface.co/datasets/{self.hub_repo}/blob/{self.hub_revision}/{self.hub_path}"
        return self.url


@dataclass(frozen=True)
class Input:
    """A remote file and, for an archive, the members read from it (``fnmatch`` patterns, in order)."""

    file: RemoteFile
    members: tuple[str, ...] = ()


@dataclass(frozen=True)
class Source:
    """A question set or corpus that ``ragsuite data download`` can install.

    Attributes:
        dataset: The dataset folder name (see :data:`ragsuite.data.datasets.DATASETS`).
        kind: ``questions`` or ``corpus``.
        name: The subset (questions) or corpus name users pass to ``--subset`` / ``--corpus``.
        inputs: The files (and archive members) the converter reads, in order.
        converter: Key of :data:`ragsuite.data.readers.STREAM_CONVERTERS`.
        split: The question file written (``<split>.jsonl``); unused for corpora.
        description: One line for ``ragsuite data sources``.
        origin: The repository or page that documents the files.
        license: The license the files are released under.
        format: The source format, in a few words.
        expected_rows: Rows the converted file must have (questions or passages); ``None`` when unknown.
        sample: Keep this many questions, chosen deterministically (lowest ``sha1(id)`` first).
        paper_subset: Whether the questions are exactly a paper's evaluation set (``False``: our own sample).
        download_bytes: Approximate download size (for ``ragsuite data list``); ``None`` when unknown.
        converted_bytes: Approximate size of the converted file; ``None`` when not measured.
        default: Whether ``ragsuite data download NAME`` installs it without ``--subset``/``--corpus``.
        shared: A corpus several datasets use: converted once to ``<data dir>/corpora/<name>.jsonl`` and
            linked as each dataset's ``corpus.jsonl``.
    """

    dataset: str
    kind: Kind
    name: str
    inputs: tuple[Input, ...]
    converter: str
    description: str
    origin: str
    license: str
    format: str
    split: str = "dev"
    expected_rows: int | None = None
    sample: int | None = None
    paper_subset: bool = True
    download_bytes: int | None = None
    converted_bytes: int | None = None
    default: bool = False
    shared: bool = False

    @property
    def output(self) -> str:
        """The file written under ``<data dir>/<dataset>/``."""
        return "corpus.jsonl" if self.kind == "corpus" else f"{self.split}.jsonl"


@dataclass(frozen=True)
class Catalogue:
    """An ordered set of sources, looked up by dataset and subset/corpus name."""

    sources: tuple[Source, ...] = field(default_factory=tuple)

    def __iter__(self) -> Iterator[Source]:
        return iter(self.sources)

    def datasets(self) -> list[str]:
        return list(dict.fromkeys(source.dataset for source in self.sources))

    def of(self, dataset: str, kind: Kind) -> list[Source]:
        return [s for s in self.sources if s.dataset == dataset and s.kind == kind]

    def find(self, dataset: str, kind: Kind, name: str | None) -> Source | None:
        """The named source, the dataset's default of that kind when ``name`` is ``None``, or ``None``
        when the dataset has no default of that kind.

        Raises:
            DataError: unknown dataset, or a name the dataset does not offer (the message lists them).
        """
        if dataset not in self.datasets():
            raise DataError(f"unknown dataset {dataset!r}; downloadable: {', '.join(self.datasets())}")
        candidates = self.of(dataset, kind)
        if name is None:
            return next((s for s in candidates if s.default), None)
        for source in candidates:
            if source.name == name:
                return source
        flag = "--subset" if kind == "questions" else "--corpus"
        offered = ", ".join(s.name for s in candidates) or "none"
        raise DataError(f"{dataset} has no {flag} {name!r}; choose one of: {offered}")


def _catalogue(sources: Iterable[Source]) -> Catalogue:
    return Catalogue(tuple(sources))


# --- the files -----------------------------------------------------------------------------------------

_NO_CHECKSUM = "no checksum or size is published for this file; verified by complete transfer and row count"

# IRCoT's processed data (test_subsampled.jsonl = the 500-question test subsets): the Google Drive archive
# that download/processed_data.sh of starsuzi/Adaptive-RAG (adapted from IRCoT's) fetches.
IRCOT_PROCESSED = RemoteFile(
    filename="ircot_processed_data.zip",
    url="https://drive.usercontent.google.com/download?id=1t2BjJtsejSIUZI54PKObMFG6_wMMG3bC&export=download&confirm=t",
    checksum_note=_NO_CHECKSUM,
)
HOTPOT_DEV = RemoteFile(
    filename="hotpot_dev_distractor_v1.json",
    url="http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json",
    checksum_note=_NO_CHECKSUM,
)
HOTPOT_ABSTRACTS = RemoteFile(
    filename="enwiki-20171001-pages-meta-current-withlinks-abstracts.tar.bz2",
    url="https://nlp.stanford.edu/projects/hotpotqa/enwiki-20171001-pages-meta-current-withlinks-abstracts.tar.bz2",
    checksum_note=_NO_CHECKSUM,
)
TWOWIKI = RemoteFile(
    filename="2wikimultihopqa_data_ids.zip",
    url="https://www.dropbox.com/s/7ep3h8unu2njfxv/data_ids.zip?dl=1",
    checksum_note=_NO_CHECKSUM,
)
MUSIQUE = RemoteFile(
    filename="musique_v1.0.zip",
    url="https://drive.usercontent.google.com/download?id=1tGdADlNjWFaHLeZZGShh2IRcpO6Lv24h&export=download&confirm=t",
    checksum_note=_NO_CHECKSUM,
)
ALCE_DATA = RemoteFile(
    filename="ALCE-data.tar",
    hub_repo="princeton-nlp/ALCE-data",
    hub_path="ALCE-data.tar",
    checksum_note="sha256 and size published by the Hugging Face Hub (LFS pointer), checked at download",
)
STRATEGYQA = RemoteFile(
    filename="strategyqa_dataset.zip",
    url="https://storage.googleapis.com/ai2i/strategyqa/data/strategyqa_dataset.zip",
    checksum_note=_NO_CHECKSUM,
)
FLASHRAG_NQ_TEST = RemoteFile(
    filename="flashrag_nq_test.jsonl",
    hub_repo="RUC-NLPIR/FlashRAG_datasets",
    hub_path="nq/test.jsonl",
    checksum_note="git blob sha1 and size published by the Hugging Face Hub (488 kB), checked at download",
)
FLASHRAG_TRIVIAQA_TEST = RemoteFile(
    filename="flashrag_triviaqa_test.jsonl",
    hub_repo="RUC-NLPIR/FlashRAG_datasets",
    hub_path="triviaqa/test.jsonl",
    checksum_note="checksum and size published by the Hugging Face Hub, checked at download",
)
DPR_WIKI = RemoteFile(
    filename="psgs_w100.tsv.gz",
    url="https://dl.fbaipublicfiles.com/dpr/wikipedia_split/psgs_w100.tsv.gz",
    checksum_note=(
        "DPR's download_data.py publishes no checksum or size; verified by complete transfer and by the "
        "passage count (21,015,324)"
    ),
)

_IRCOT_ORIGIN = (
    "https://github.com/StonyBrookNLP/ircot (retriever_server/build_index.py builds the corpora); archive id "
    "from https://github.com/starsuzi/Adaptive-RAG download/processed_data.sh"
)
_WIKI18_NOTE = "December-2018 English Wikipedia split into 100-word passages (DPR), 21,015,324 passages"


def _ircot_test(dataset: str) -> Source:
    return Source(
        dataset=dataset,
        kind="questions",
        name="ircot-test-500",
        inputs=(Input(IRCOT_PROCESSED, (f"*processed_data/{dataset}/test_subsampled.jsonl",)),),
        converter="ircot",
        split="test",
        description="IRCoT's 500-question test subset (the DeepNote and HANRAG evaluation set)",
        origin=_IRCOT_ORIGIN,
        license="as the original dataset (HotpotQA, MuSiQue: CC BY-SA 4.0; 2WikiMultihopQA: Apache-2.0)",
        format="zip of JSONL: question_id, question_text, answers_objects, contexts",
        expected_rows=500,
        default=True,
    )


def _wiki18(dataset: str) -> Source:
    return Source(
        dataset=dataset,
        kind="corpus",
        name="wiki18-100w",
        inputs=(Input(DPR_WIKI),),
        converter="dpr_tsv",
        description=_WIKI18_NOTE,
        origin=(
            "https://github.com/facebookresearch/DPR "
            "(dpr/data/download_data.py: data.wikipedia_split.psgs_w100)"
        ),
        license="CC BY-SA 3.0 (Wikipedia text)",
        format="gzipped TSV: id, text, title (with a header row)",
        expected_rows=21_015_324,
        default=True,
        shared=True,
    )


CATALOGUE = _catalogue(
    [
        _ircot_test("hotpotqa"),
        Source(
            dataset="hotpotqa",
            kind="questions",
            name="dev",
            inputs=(Input(HOTPOT_DEV),),
            converter="hotpotqa",
            description="the full HotpotQA dev set (distractor setting)",
            origin="https://hotpotqa.github.io",
            license="CC BY-SA 4.0",
            format="JSON array: _id, question, answer, type, context, supporting_facts",
            expected_rows=7405,
        ),
        Source(
            dataset="hotpotqa",
            kind="corpus",
            name="ircot",
            inputs=(Input(HOTPOT_ABSTRACTS, ("*/wiki_*.bz2",)),),
            converter="wiki_abstracts",
            description=(
                "IRCoT's HotpotQA corpus: first paragraphs of the October-2017 English Wikipedia (~5.2M)"
            ),
            origin=_IRCOT_ORIGIN + "; https://hotpotqa.github.io/wiki-readme.html",
            license="CC BY-SA 4.0",
            format="tar.bz2 of bz2 JSON Lines: title, text (sentences), url",
            default=True,
        ),
        _ircot_test("2wikimultihopqa"),
        Source(
            dataset="2wikimultihopqa",
            kind="questions",
            name="dev",
            inputs=(Input(TWOWIKI, ("*dev.json",)),),
            converter="2wikimultihopqa",
            description="the full 2WikiMultihopQA dev set",
            origin="https://github.com/Alab-NII/2wikimultihop",
            license="Apache-2.0",
            format="zip of JSON arrays: _id, question, answer, type, context, supporting_facts, evidences",
            expected_rows=12576,
        ),
        Source(
            dataset="2wikimultihopqa",
            kind="questions",
            name="train",
            inputs=(Input(TWOWIKI, ("*train.json",)),),
            converter="2wikimultihopqa",
            split="train",
            description="the full 2WikiMultihopQA train set (training questions, e.g. for `ragsuite align`)",
            origin="https://github.com/Alab-NII/2wikimultihop",
            license="Apache-2.0",
            format="zip of JSON arrays: _id, question, answer, type, context, supporting_facts, evidences",
            expected_rows=167454,
        ),
        Source(
            dataset="2wikimultihopqa",
            kind="corpus",
            name="ircot",
            inputs=(Input(TWOWIKI, ("*train.json", "*dev.json", "*test.json")),),
            converter="hotpot_contexts",
            description="IRCoT's 2WikiMultihopQA corpus: every context paragraph of train/dev/test (~430k)",
            origin=_IRCOT_ORIGIN,
            license="Apache-2.0",
            format="zip of JSON arrays; context = [[title, [sentence, ...]], ...]",
            default=True,
        ),
        _ircot_test("musique"),
        Source(
            dataset="musique",
            kind="questions",
            name="dev",
            inputs=(Input(MUSIQUE, ("*musique_ans_v1.0_dev.jsonl",)),),
            converter="musique",
            description="the full MuSiQue-Ans dev set",
            origin="https://github.com/StonyBrookNLP/musique",
            license="CC BY 4.0",
            format="zip of JSONL: id, question, answer, answer_aliases, paragraphs",
            expected_rows=2417,
        ),
        Source(
            dataset="musique",
            kind="corpus",
            name="ircot",
            inputs=(
                Input(
                    MUSIQUE,
                    tuple(
                        f"*musique_{variant}_v1.0_{split}.jsonl"
                        for variant in ("ans", "full")
                        for split in ("dev", "test", "train")
                    ),
                ),
            ),
            converter="musique_paragraphs",
            description="IRCoT's MuSiQue corpus: every paragraph of the six MuSiQue files (~140k)",
            origin=_IRCOT_ORIGIN,
            license="CC BY 4.0",
            format="zip of JSONL; paragraphs = [{title, paragraph_text}, ...]",
            default=True,
        ),
        Source(
            dataset="asqa",
            kind="questions",
            name="alce-948",
            inputs=(Input(ALCE_DATA, ("*asqa_eval_gtr_top100.json",)),),
            converter="asqa",
            description="ALCE's 948 ASQA questions (the ASQA dev set) with short-answer groups",
            origin="https://github.com/princeton-nlp/ALCE (download_data.sh)",
            license="Apache-2.0 (ASQA)",
            format="tar of a JSON array: sample_id, question, qa_pairs, annotations, docs",
            expected_rows=948,
            default=True,
        ),
        _wiki18("asqa"),
        Source(
            dataset="strategyqa",
            kind="questions",
            name="sample-500",
            inputs=(
                Input(STRATEGYQA, ("*strategyqa_train.json",)),
                Input(STRATEGYQA, ("*strategyqa_train_paragraphs.json",)),
            ),
            converter="strategyqa",
            description=(
                "500 questions of StrategyQA's train set (the only split with answers), ragsuite's "
                "deterministic sample (lowest sha1(qid)); no public list of the papers' 500 exists"
            ),
            origin="https://github.com/eladsegal/strategyqa",
            license="MIT",
            format="zip of JSON: qid, question, answer, evidence + a paragraphs map",
            expected_rows=500,
            sample=500,
            paper_subset=False,
            default=True,
        ),
        _wiki18("strategyqa"),
        Source(
            dataset="nq",
            kind="questions",
            name="test",
            inputs=(Input(FLASHRAG_NQ_TEST),),
            converter="flashrag",
            split="test",
            description="NQ-open test (3,610 questions), as packaged by FlashRAG",
            origin="https://huggingface.co/datasets/RUC-NLPIR/FlashRAG_datasets",
            license="CC BY-SA 3.0 (Natural Questions); FlashRAG packaging CC BY-SA 4.0",
            format="JSONL: id, question, golden_answers",
            expected_rows=3610,
            download_bytes=488_000,
            default=True,
        ),
        _wiki18("nq"),
        Source(
            dataset="triviaqa",
            kind="questions",
            name="test",
            inputs=(Input(FLASHRAG_TRIVIAQA_TEST),),
            converter="flashrag",
            split="test",
            description="TriviaQA (unfiltered) test as used by DPR/FlashRAG: 11,313 questions",
            origin="https://huggingface.co/datasets/RUC-NLPIR/FlashRAG_datasets",
            license="Apache-2.0 (TriviaQA); FlashRAG packaging CC BY-SA 4.0",
            format="JSONL: id, question, golden_answers",
            expected_rows=11313,
            default=True,
        ),
        _wiki18("triviaqa"),
    ]
)
