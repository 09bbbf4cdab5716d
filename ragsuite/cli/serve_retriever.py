"""``ragsuite serve-retriever``: serve a BM25 or ColBERT retriever over the ColBERTv2 HTTP protocol."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ragsuite.errors import ConfigError
from ragsuite.retrieval.base import Retriever
from ragsuite.retrieval.server import RetrieverServer
from ragsuite.retrieval.spec import SPEC_HELP, build_retriever

log = logging.getLogger("ragsuite.cli.serve_retriever")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve-retriever",
        help="serve a retriever over the ColBERTv2 HTTP protocol (GET/POST /api/search, GET /health)",
        description=(
            "Serve BM25 or a local ColBERT index over the protocol dspy.ColBERTv2 and "
            "`--retriever colbert-server:URL` speak. Examples:\n"
            "  ragsuite serve-retriever --backend bm25 --dataset hotpotqa --port 8893\n"
            "  ragsuite serve-retriever --backend colbert --index ~/indexes/hotpotqa\n"
            "  ragsuite serve-retriever --backend colbert --checkpoint colbertv2.0 --corpus corpus.jsonl "
            "--index ~/indexes/mine"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--backend", choices=("bm25", "colbert"), default="bm25", help="retriever to serve")
    parser.add_argument(
        "--retriever",
        metavar="SPEC",
        help=f"serve any retriever spec instead of --backend ({SPEC_HELP}); --dataset or --corpus names "
        "its corpus",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--dataset", help="index this dataset's corpus.jsonl")
    source.add_argument(
        "--corpus", type=Path, help="your own corpus: JSONL, TSV or Parquet with id, title, text columns"
    )
    parser.add_argument(
        "--index",
        type=Path,
        help="colbert: the index directory (loaded if it exists, else built there from --checkpoint)",
    )
    parser.add_argument("--checkpoint", help="colbert: checkpoint path, to build the index")
    parser.add_argument("--host", default="127.0.0.1", help="interface (default loopback; no authentication)")
    parser.add_argument("--port", type=int, default=8893, help="TCP port (0: any free port)")
    parser.add_argument("--max-k", type=int, default=100, help="largest k served (default 100, as upstream)")
    parser.add_argument(
        "--max-response-bytes", type=int, default=64_000_000, help="largest reply sent (default 64 MB)"
    )
    parser.add_argument("--max-query-chars", type=int, default=2000, help="longer queries get HTTP 413")
    parser.add_argument(
        "--data-dir", help="datasets folder (default $RAGSUITE_DATA, else ~/.cache/ragsuite/data)"
    )
    parser.add_argument("--cache-dir", help="where built indexes are kept (default $RAGSUITE_CACHE)")
    parser.set_defaults(func=run)


def _corpus(args: argparse.Namespace) -> list:
    from ragsuite.data.datasets import load_corpus, load_corpus_file

    if args.corpus is not None:
        return load_corpus_file(args.corpus)
    if args.dataset:
        return load_corpus(args.dataset, data_dir=args.data_dir)
    raise ConfigError("give --dataset NAME or --corpus FILE to say what to index")


def build_retriever_for(args: argparse.Namespace) -> Retriever:
    """The retriever the parsed flags describe."""
    if args.retriever:
        return build_retriever(
            args.retriever,
            dataset=args.dataset,
            corpus=args.corpus,
            data_dir=args.data_dir,
            cache_dir=args.cache_dir,
        )
    if args.backend == "bm25":
        from ragsuite.retrieval.bm25 import BM25Retriever

        if args.corpus is not None:
            return BM25Retriever.from_file(args.corpus, cache_dir=args.cache_dir)
        if not args.dataset:
            raise ConfigError("the bm25 backend needs --dataset NAME or --corpus FILE")
        return BM25Retriever.from_dataset(args.dataset, data_dir=args.data_dir, cache_dir=args.cache_dir)

    from ragsuite.retrieval.colbert.index import ColBERTv2Index, build_colbert_index, is_colbert_index

    if args.index is None:
        raise ConfigError("the colbert backend needs --index DIR (an existing index, or where to build one)")
    if is_colbert_index(args.index) and not args.checkpoint:
        return ColBERTv2Index.load(args.index)
    if not args.checkpoint:
        raise ConfigError(
            f"{args.index} holds no ColBERT index; give --checkpoint PATH and a corpus to build one"
        )
    return build_colbert_index(_corpus(args), checkpoint=args.checkpoint, index_dir=args.index)


def build_server(args: argparse.Namespace) -> RetrieverServer:
    return RetrieverServer(
        build_retriever_for(args),
        host=args.host,
        port=args.port,
        max_k=args.max_k,
        max_response_bytes=args.max_response_bytes,
        max_query_chars=args.max_query_chars,
    )


def run(args: argparse.Namespace) -> int:
    server = build_server(args)
    server.bind()
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s without authentication: anyone who can reach it can query it", args.host)
    # Warm before announcing the URL: the first search pays one-off costs (numba's kernel load: 1-3 s).
    warm_up_s = server.warm_up()
    warmed = f"warmed up in {warm_up_s:.2f} s" if warm_up_s is not None else "warm-up failed"
    print(
        f"serving {server.retriever.describe()['spec']} at {server.url} ({warmed}; Ctrl-C to stop)",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    return 0
