"""The on-disk BM25 index ranks exactly as the in-memory bm25s index it replaced, on every dev question.

    python benchmarks/bm25_parity.py [--datasets hotpotqa nq ...] [--k 10] [--data-dir DIR]

The reference is what ragsuite did before the on-disk index: ``bm25s.BM25.index`` over ragsuite's own
tokenization (title weighting, accent folding, stemming), then every passage scored with one float64
``np.bincount`` over the query terms' postings and sorted by (score descending, corpus order). For every dev
question of every dataset with a corpus, the top-k passage ids and their scores must be equal (not close:
equal), with the compiled kernel and with the NumPy fallback. It also prints recall@5 and recall@10.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from ragsuite.data.datasets import dataset_names, get_dataset_info, load_corpus, load_dataset
from ragsuite.data.metrics import retrieval_recall
from ragsuite.retrieval.bm25 import BM25Retriever

ROOT = Path(__file__).resolve().parent.parent


def reference_ranking(retriever: BM25Retriever, passages: list, questions: list[str], k: int) -> list:
    """The previous implementation: bm25s' in-memory index, every passage scored."""
    import bm25s

    s = retriever.settings
    vocab: dict[str, int] = {}
    docs = [
        [vocab.setdefault(t, len(vocab)) for t in retriever._tokenize(retriever._document(p))]
        for p in passages
    ]
    index = bm25s.BM25(method=s["method"], k1=s["k1"], b=s["b"], delta=s["delta"])
    index.index((docs, vocab), show_progress=False)
    data = np.asarray(index.scores["data"], dtype=np.float64)
    indices = np.asarray(index.scores["indices"], dtype=np.int64)
    indptr = np.asarray(index.scores["indptr"], dtype=np.int64)
    n = len(passages)
    ranked = []
    for question in questions:
        terms = [vocab[t] for t in retriever._tokenize(question) if t in vocab and t != ""]
        if not terms:
            ranked.append([])
            continue
        positions = np.concatenate([np.arange(indptr[t], indptr[t + 1]) for t in terms])
        scores = np.bincount(indices[positions], weights=data[positions], minlength=n)
        order = np.lexsort((np.arange(n), -scores))[:k]
        ranked.append([(passages[i].id, float(scores[i])) for i in order])
    return ranked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    with_corpus = [n for n in dataset_names() if get_dataset_info(n).has_corpus]
    parser.add_argument("--datasets", nargs="+", default=with_corpus, choices=with_corpus)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument(
        "--data-dir",
        default=str(ROOT / "tests" / "fixtures" / "data"),
        help="datasets (default: the committed fixtures, tests/fixtures/data)",
    )
    args = parser.parse_args(argv)
    print("| dataset | passages | questions | identical top-k (numba / numpy) | R@5 | R@10 |")
    print("|---|---:|---:|---|---:|---:|")
    failures = 0
    with tempfile.TemporaryDirectory(prefix="ragsuite-parity-") as cache:
        for name in args.datasets:
            passages = load_corpus(name, data_dir=args.data_dir)
            examples = load_dataset(name, data_dir=args.data_dir)
            questions = [ex.question for ex in examples]
            retriever = BM25Retriever.from_dataset(name, data_dir=args.data_dir, cache_dir=cache)
            expected = reference_ranking(retriever, passages, questions, args.k)
            same = {}
            for kernel in ("numba", "numpy"):
                os.environ["RAGSUITE_BM25_KERNEL"] = kernel
                got = [[(p.id, p.score) for p in row] for row in retriever.batch(questions, args.k)]
                same[kernel] = sum(g == e for g, e in zip(got, expected, strict=True))
            failures += sum(len(questions) - v for v in same.values())
            gold = [(ex, [pid for pid, _ in row]) for ex, row in zip(examples, expected, strict=True)]
            gold = [(ex, ids) for ex, ids in gold if ex.gold_passage_ids]
            recall = {
                k: statistics.fmean(retrieval_recall(ids, ex.gold_passage_ids, k) for ex, ids in gold)
                if gold
                else float("nan")
                for k in (5, 10)
            }
            print(
                f"| {name} | {len(passages)} | {len(questions)} | {same['numba']}/{len(questions)} / "
                f"{same['numpy']}/{len(questions)} | {recall[5]:.3f} | {recall[10]:.3f} |"
            )
    os.environ.pop("RAGSUITE_BM25_KERNEL", None)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
