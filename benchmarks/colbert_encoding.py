"""ColBERTv2 indexing rate on this machine's CPU, with a model of ColBERTv2's size (no download needed).

    python benchmarks/colbert_encoding.py [--passages 2000] [--work DIR] [--data-dir DIR]

A ColBERTv2 checkpoint (``colbert-ir/colbertv2.0``) is BERT-base (12 layers, hidden 768, 12 heads) with a
128-dimensional projection and ``doc_maxlen`` 180. Encoding speed depends on that shape, not on the weights,
so this builds a randomly initialised checkpoint of exactly that shape (``build_tiny_checkpoint`` with
BERT-base sizes) and measures, on real dev passages (HotpotQA's corpus under ``--data-dir``, by default the
committed test fixtures):

* the encoding rate alone (``Checkpoint.docFromText``, batches of 64), passages/s;
* with ``--build``, a whole ``build_colbert_index`` (encoding, k-means, residual compression, saving),
  passages/s.

It prints both and what they imply for the papers' corpora on this CPU. Needs the colbert extra.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "data"
CORPORA = {
    "HotpotQA abstracts": 5_233_329,
    "2Wiki / MuSiQue (IRCoT)": 430_225,
    "Wikipedia 2018 (DPR)": 21_015_324,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passages", type=int, default=2000)
    parser.add_argument("--build", action="store_true", help="also time a whole index build")
    parser.add_argument(
        "--work", type=Path, default=None, help="where the checkpoint and index go (temporary)"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=FIXTURES,
        help="datasets (default: the committed fixtures, tests/fixtures/data)",
    )
    args = parser.parse_args(argv)

    import torch

    from ragsuite.data.datasets import load_corpus
    from ragsuite.retrieval.colbert.checkpoint import build_tiny_checkpoint
    from ragsuite.retrieval.colbert.index import build_colbert_index

    passages = load_corpus("hotpotqa", data_dir=args.data_dir)[: args.passages]
    with tempfile.TemporaryDirectory(prefix="ragsuite-colbert-bench-", dir=args.work) as tmp:
        checkpoint = build_tiny_checkpoint(
            passages,
            Path(tmp) / "ckpt",
            vocab_size=30522,
            hidden_size=768,
            num_layers=12,
            num_heads=12,
            dim=128,
        )
        from colbert.infra import ColBERTConfig
        from colbert.modeling.checkpoint import Checkpoint

        model = Checkpoint(str(checkpoint), colbert_config=ColBERTConfig(doc_maxlen=180))
        texts = [p.render() for p in passages]
        model.docFromText(texts[:64], bsize=64)  # warm-up
        started = time.perf_counter()
        with torch.inference_mode():
            model.docFromText(texts, bsize=64)
        encode_rate = len(texts) / (time.perf_counter() - started)
        del model
        threads = torch.get_num_threads()
        rates = {"encoding only": encode_rate}
        print(
            f"ColBERTv2-sized model (BERT-base, dim 128, doc_maxlen 180) on {os.cpu_count()} CPUs, "
            f"{threads} torch threads; encoding: {encode_rate:.1f} passages/s",
            flush=True,
        )
        if args.build:
            started = time.perf_counter()
            build_colbert_index(
                passages, checkpoint=checkpoint, index_dir=Path(tmp) / "index", doc_maxlen=180
            )
            rates["whole index build"] = len(passages) / (time.perf_counter() - started)

    print(f"| step | passages/s | {' | '.join(CORPORA)} |")
    print(f"|---|---:|{'---:|' * len(CORPORA)}")
    for name, rate in rates.items():
        hours = [f"{n / rate / 3600:,.0f} h" for n in CORPORA.values()]
        print(f"| {name} ({len(passages)} passages) | {rate:.1f} | {' | '.join(hours)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
