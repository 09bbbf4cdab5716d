"""Retrieval quality and speed: ragsuite's BM25Retriever against plain bm25s, side by side, on every dataset.

    python benchmarks/retrieval.py [--datasets hotpotqa nq ...] [--repeats 5] [--out results.json] [--hybrid]

For each dataset with a corpus, every column (retriever) answers the dev questions; the table reports
recall@5 / recall@10 of gold passages and queries per second, batched (one call for all questions) and one by
one. Timing runs of the columns are interleaved and repeated, and the median is kept, so that load from other
processes hits every column alike. "plain bm25s" is the reference configuration: Snowball English stemmer,
bm25s' English stopwords, title and text joined by a space, method lucene, k1 = 1.5, b = 0.75; its query time
includes ``bm25s.tokenize`` just as ragsuite's includes its own tokenizer. "plain bm25s numba" is the same
index with bm25s' numba backend, its fastest; batches of both bm25s columns and of ragsuite use every core.
A bm25s batch returns passage numbers, which the column maps to ids. "ragsuite BM25 ids" is the like-for-like
call, ``batch_ids`` (ids only); "ragsuite BM25" returns whole passages, title and text read from the index's
passage store, as a program gets them.

Adding a column: write ``def build_x(corpus, *, cache_dir) -> Column`` and list it in ``COLUMNS``.

``--hybrid`` adds recall-only columns: dense retrieval with all-MiniLM-L6-v2 (the ``dense`` extra; passage
embeddings are cached in ragsuite's cache directory, ``--dense-cache-dir``, because embedding every corpus
takes ~20 minutes on 2 CPU cores) and BM25 + dense merged by interleaving and by RRF (k = 60) from each
member's top 10, and prints a second table of recall@5.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ragsuite.data.datasets import dataset_names, get_dataset_info, load_corpus, load_dataset
from ragsuite.data.metrics import retrieval_recall
from ragsuite.retrieval.base import Passage

K = 10


@dataclass
class Column:
    """One retriever under test: ``batch`` and ``one`` return passage ids, best first."""

    name: str
    batch: Callable[[Sequence[str], int], list[list[str]]]
    one: Callable[[str, int], list[str]] | None  # None: only batches are timed
    timed: bool = True  # remote or slow retrievers can opt out of the speed columns


def build_plain_bm25s(corpus: list[Passage], *, cache_dir: Path, backend: str = "numpy") -> Column:
    import bm25s
    import numpy as np
    import Stemmer

    del cache_dir
    stemmer = Stemmer.Stemmer("english")
    retriever = bm25s.BM25(backend=backend)
    tokens = bm25s.tokenize(
        [f"{p.title} {p.text}" for p in corpus], stopwords="en", stemmer=stemmer, show_progress=False
    )
    retriever.index(tokens, show_progress=False)
    ids = np.array([p.id for p in corpus], dtype=object)

    def batch(queries: Sequence[str], k: int, threads: int = os.cpu_count() or 1) -> list[list[str]]:
        q = bm25s.tokenize(list(queries), stopwords="en", stemmer=stemmer, show_progress=False)
        docs, _ = retriever.retrieve(q, k=min(k, len(corpus)), show_progress=False, n_threads=threads)
        return [ids[row].tolist() for row in docs]

    def one(query: str, k: int) -> list[str]:
        return batch([query], k, threads=0)[0]  # one query: no thread pool

    return Column("plain bm25s" if backend == "numpy" else f"plain bm25s {backend}", batch, one)


def build_plain_bm25s_numba(corpus: list[Passage], *, cache_dir: Path) -> Column:
    """bm25s' numba backend (its fastest): compiled scoring and top-k, batches on every core."""
    return build_plain_bm25s(corpus, cache_dir=cache_dir, backend="numba")


def build_ragsuite_bm25(corpus: list[Passage], *, cache_dir: Path) -> Column:
    from ragsuite.retrieval.bm25 import BM25Retriever

    retriever = BM25Retriever(corpus, cache_dir=cache_dir)

    def batch(queries: Sequence[str], k: int) -> list[list[str]]:
        return [[p.id for p in ps] for ps in retriever.batch(queries, k)]

    def one(query: str, k: int) -> list[str]:
        return [p.id for p in retriever(query, k)]

    return Column("ragsuite BM25", batch, one)


def build_ragsuite_bm25_ids(corpus: list[Passage], *, cache_dir: Path) -> Column:
    """ragsuite's ``batch_ids``: the ids of the top k, no passage text read (what a bm25s batch returns)."""
    from ragsuite.retrieval.bm25 import BM25Retriever

    return Column("ragsuite BM25 ids", BM25Retriever(corpus, cache_dir=cache_dir).batch_ids, None)


# Reference column first: ratios are taken against it.
COLUMNS: list[Callable[..., Column]] = [
    build_plain_bm25s,
    build_plain_bm25s_numba,
    build_ragsuite_bm25,
    build_ragsuite_bm25_ids,
]

HYBRID_NAMES = ("dense MiniLM", "hybrid interleave", "hybrid rrf")


def hybrid_columns(dense_cache_dir: Path | None) -> list[Callable[..., Column]]:
    """Builders of the dense and BM25+dense hybrid columns; the three share one index per corpus."""
    from ragsuite.retrieval.base import Retriever

    members: dict[int, tuple[Retriever, Retriever]] = {}

    def shared(corpus: list[Passage], cache_dir: Path) -> tuple[Retriever, Retriever]:
        from ragsuite.retrieval.bm25 import BM25Retriever
        from ragsuite.retrieval.dense import DenseRetriever

        if id(corpus) not in members:
            members.clear()  # one dataset at a time
            dense = DenseRetriever(corpus, cache_dir=dense_cache_dir, progress=True)
            members[id(corpus)] = (BM25Retriever(corpus, cache_dir=cache_dir), dense)
        return members[id(corpus)]

    def column(name: str, pick: Callable[[Retriever, Retriever], Retriever]) -> Callable[..., Column]:
        def build(corpus: list[Passage], *, cache_dir: Path) -> Column:
            retriever = pick(*shared(corpus, cache_dir))

            def batch(queries: Sequence[str], k: int) -> list[list[str]]:
                return [[p.id for p in ps] for ps in retriever.batch(queries, k)]

            def one(query: str, k: int) -> list[str]:
                return [p.id for p in retriever(query, k)]

            return Column(name, batch, one, timed=False)

        return build

    from ragsuite.retrieval.hybrid import HybridRetriever

    return [
        column(HYBRID_NAMES[0], lambda bm25, dense: dense),
        # The README's table fuses the members' top-10 lists; the library default fuses from depth 50.
        column(
            HYBRID_NAMES[1], lambda bm25, dense: HybridRetriever([bm25, dense], mode="interleave", depth=10)
        ),
        column(HYBRID_NAMES[2], lambda bm25, dense: HybridRetriever([bm25, dense], mode="rrf", depth=10)),
    ]


def _qps(fn: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    fn()
    return n / (time.perf_counter() - start)


def bench_dataset(
    name: str,
    *,
    repeats: int,
    cache_dir: Path,
    data_dir: str | None,
    extra_columns: Sequence[Callable[..., Column]] = (),
) -> dict:
    corpus = load_corpus(name, data_dir=data_dir)
    examples = [ex for ex in load_dataset(name, data_dir=data_dir) if ex.gold_passage_ids]
    questions = [ex.question for ex in examples]
    columns = [build(corpus, cache_dir=cache_dir) for build in (*COLUMNS, *extra_columns)]
    row: dict = {"dataset": name, "passages": len(corpus), "questions": len(questions), "columns": {}}
    timing: dict[str, dict[str, list[float]]] = {c.name: {"batch": [], "one": []} for c in columns}
    for column in columns:
        ranked = column.batch(questions, K)
        row["columns"][column.name] = {
            f"recall@{k}": statistics.fmean(
                retrieval_recall(ids, ex.gold_passage_ids, k)
                for ids, ex in zip(ranked, examples, strict=True)
            )
            for k in (5, 10)
        }
        if column.one is not None:
            column.one(questions[0], K)  # warm-up
    for _ in range(repeats):
        for column in (c for c in columns if c.timed):
            timing[column.name]["batch"].append(_qps(lambda c=column: c.batch(questions, K), len(questions)))
            if column.one is not None:
                timing[column.name]["one"].append(
                    _qps(lambda c=column: [c.one(q, K) for q in questions], len(questions))
                )
    for column in (c for c in columns if c.timed):
        for mode, runs in timing[column.name].items():
            if runs:
                row["columns"][column.name][f"qps_{mode}"] = statistics.median(runs)
    return row


def markdown(rows: list[dict]) -> str:
    ref, fast, ours, ids = "plain bm25s", "plain bm25s numba", "ragsuite BM25", "ragsuite BM25 ids"
    lines = [
        "| dataset | passages | questions | R@5 plain | R@5 ragsuite | R@10 plain | R@10 ragsuite "
        "| q/s batch plain | q/s batch plain numba | q/s batch ragsuite ids | ratio to numba "
        "| q/s batch ragsuite passages | ratio to numba "
        "| q/s 1-by-1 plain | q/s 1-by-1 plain numba | q/s 1-by-1 ragsuite | ratio to plain |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        a, n, b, i = (row["columns"][name] for name in (ref, fast, ours, ids))
        lines.append(
            f"| {row['dataset']} | {row['passages']} | {row['questions']} "
            f"| {a['recall@5']:.3f} | **{b['recall@5']:.3f}** "
            f"| {a['recall@10']:.3f} | **{b['recall@10']:.3f}** "
            f"| {a['qps_batch']:,.0f} | {n['qps_batch']:,.0f} "
            f"| {i['qps_batch']:,.0f} | {i['qps_batch'] / n['qps_batch']:.2f}x "
            f"| {b['qps_batch']:,.0f} | {b['qps_batch'] / n['qps_batch']:.2f}x "
            f"| {a['qps_one']:,.0f} | {n['qps_one']:,.0f} | {b['qps_one']:,.0f} "
            f"| {b['qps_one'] / a['qps_one']:.2f}x |"
        )
    return "\n".join(lines)


def hybrid_markdown(rows: list[dict]) -> str:
    names = ("ragsuite BM25", *HYBRID_NAMES)
    lines = [
        "| dataset | R@5 BM25 | R@5 dense MiniLM | R@5 hybrid interleave | R@5 hybrid RRF |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        cells = [row["columns"][n]["recall@5"] for n in names]
        best = max(cells)
        shown = [f"**{c:.3f}**" if c == best else f"{c:.3f}" for c in cells]
        lines.append(f"| {row['dataset']} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    with_corpus = [n for n in dataset_names() if get_dataset_info(n).has_corpus]
    parser.add_argument("--datasets", nargs="+", default=with_corpus, choices=with_corpus)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timing runs per column (median)")
    parser.add_argument(
        "--data-dir",
        default=str(Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "data"),
        help="datasets (default: the committed fixtures, tests/fixtures/data)",
    )
    parser.add_argument(
        "--cache-dir", default=None, help="index cache (default: a fresh temporary directory)"
    )
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    parser.add_argument(
        "--hybrid", action="store_true", help="add dense (MiniLM) and BM25+dense hybrid recall columns"
    )
    parser.add_argument(
        "--dense-cache-dir", default=None, help="passage embedding cache (default: ragsuite's cache dir)"
    )
    args = parser.parse_args(argv)
    extra = (
        hybrid_columns(Path(args.dense_cache_dir) if args.dense_cache_dir else None) if args.hybrid else []
    )
    with tempfile.TemporaryDirectory(prefix="ragsuite-bench-") as tmp:
        cache_dir = Path(args.cache_dir or tmp)
        rows = []
        for name in args.datasets:
            print(f"benchmarking {name} ...", file=sys.stderr, flush=True)
            rows.append(
                bench_dataset(
                    name,
                    repeats=args.repeats,
                    cache_dir=cache_dir,
                    data_dir=args.data_dir,
                    extra_columns=extra,
                )
            )
    print(markdown(rows))
    if args.hybrid:
        print()
        print(hybrid_markdown(rows))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
