"""``ragsuite index``: build (or find cached) the retrieval index of a dataset's corpus or a corpus file."""

from __future__ import annotations

import argparse
import json
import time

from ragsuite.errors import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    from ragsuite.cli.args import add_data_arguments

    parser = subparsers.add_parser(
        "index",
        help="build the BM25 (or a ColBERTv2) index of a dataset's corpus or of --corpus FILE",
        description="Build the retrieval index of a dataset's corpus or of --corpus FILE. BM25 indexes are "
        "cached under the cache directory and reused by every command; a second run only loads the "
        "cached index.",
    )
    add_data_arguments(
        parser, questions=False, split=False, dataset_help="dataset whose corpus.jsonl is indexed"
    )
    parser.add_argument("--retriever", choices=("bm25", "colbert"), default="bm25", help="index kind")
    parser.add_argument(
        "--cache-dir",
        default=None,
        help="cache root for BM25 (default: $RAGSUITE_CACHE or ~/.cache/ragsuite)",
    )
    parser.add_argument(
        "--checkpoint", default=None, help="ColBERT checkpoint directory (--retriever colbert)"
    )
    parser.add_argument(
        "--index-dir", default=None, help="where the ColBERT index is written (--retriever colbert)"
    )
    plaid = parser.add_argument_group("ColBERT PLAID settings (--retriever colbert)")
    plaid.add_argument(
        "--nbits", type=int, default=2, choices=(1, 2, 4, 8), help="bits per residual dimension"
    )
    plaid.add_argument(
        "--doc-maxlen", type=int, default=None, help="passage length in tokens (default: the checkpoint's)"
    )
    plaid.add_argument("--kmeans-niters", type=int, default=4, help="k-means iterations for the centroids")
    plaid.add_argument("--index-bsize", type=int, default=64, help="passages encoded per batch")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing ColBERT index in --index-dir (--retriever colbert)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="BM25: check the sha256 of every file of an existing index before using it (by default only "
        "sizes are checked, and the sha256 of files whose mtime changed)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar while building (shown on a terminal)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if (args.dataset is None) == (args.corpus is None):
        raise ConfigError("give exactly one of --dataset NAME or --corpus FILE to say what to index")
    started = time.perf_counter()
    if args.retriever == "colbert":
        info = _index_colbert(args)
    else:
        if args.checkpoint or args.index_dir or args.overwrite:
            raise ConfigError("--checkpoint and --index-dir apply to --retriever colbert only")
        from ragsuite.cli.args import retriever_from_args

        retriever = retriever_from_args(args, "bm25", verify=args.verify)
        stats = retriever.index_stats()
        info = {
            "retriever": "bm25",
            "dataset": args.dataset,
            "corpus": retriever.describe().get("corpus_path"),
            "index_key": retriever.index_key,
            "index_dir": str(retriever.index_dir),
            "passages": len(retriever),
            "built": retriever.index_built,
            **stats,
        }
    info["seconds"] = round(time.perf_counter() - started, 3)
    if args.json:
        print(json.dumps(info))
    else:
        what = "built" if info.get("built", True) else "loaded cached"
        source = args.dataset or info["corpus"]
        print(
            f"{what} {info['retriever']} index of {source} ({info['passages']} passages) "
            f"in {info['seconds']:.2f}s"
        )
        if "index_key" in info:
            print(f"index key: {info['index_key']}")
        if "terms" in info:
            print(
                f"{info['terms']:,} terms, {info['postings']:,} postings, "
                f"{info['index_bytes'] / 2**20:,.1f} MiB on disk; query kernel: {info['kernel']}"
            )
        print(f"index dir: {info['index_dir']}")
    return 0


def _index_colbert(args: argparse.Namespace) -> dict:
    if not args.checkpoint:
        raise ConfigError("--retriever colbert needs --checkpoint PATH (a ColBERT checkpoint directory)")
    from ragsuite.data.datasets import load_corpus, load_corpus_source

    source = {"corpus_path": None}
    if args.corpus is not None:
        corpus, source = load_corpus_source(args.corpus)
        name = f"file-{source['corpus_sha256'][:16]}"  # a new index when the file's content changes
    else:
        corpus, name = load_corpus(args.dataset, data_dir=args.data_dir), args.dataset
    index_dir = args.index_dir
    if index_dir is None:
        from ragsuite.paths import cache_dir

        index_dir = str(cache_dir(args.cache_dir) / "colbert" / name)
    # Imported here: the colbert extra (torch, colbert-ai) is optional.
    from ragsuite.retrieval.colbert.index import build_colbert_index

    build_colbert_index(
        corpus,
        checkpoint=args.checkpoint,
        index_dir=index_dir,
        nbits=args.nbits,
        doc_maxlen=args.doc_maxlen,
        kmeans_niters=args.kmeans_niters,
        index_bsize=args.index_bsize,
        overwrite=args.overwrite,
    )
    return {
        "retriever": "colbert",
        "dataset": args.dataset,
        "corpus": source["corpus_path"],
        "index_dir": index_dir,
        "passages": len(corpus),
    }
