"""ColBERTv2's document encoder in plain PyTorch: passages/s on a GPU or this CPU, and the hours it implies
for indexing the papers' corpora.

    python benchmarks/colbert_encoder_speed.py lengths --out lengths.npy [--passages 20000]
    python benchmarks/colbert_encoder_speed.py run [--lengths lengths.npy] [--device cuda] [--passages 50000]
                                                   [--bsize 64,256] [--check-colbert 128]

Encoding is most of a ColBERTv2 index build (``benchmarks/colbert_encoding.py`` measures colbert-ai's own
``docFromText`` on CPU). A GPU machine may not have colbert-ai (0.2.22 cannot load checkpoints under
transformers 5), so ``run`` rebuilds the encoder's computation with torch and transformers alone:
``colbert-ir/colbertv2.0`` is BERT-base (12 layers, hidden 768, 12 heads, vocabulary 30,522) with a 128-wide
linear projection, L2-normalized per token, ``doc_maxlen`` 180; colbert-ai sorts a chunk's passages by length,
pads each batch of ``index_bsize`` (default 64) to its longest passage, runs fp16 autocast on a GPU (fp32 on
CPU) and moves each passage's unpadded embeddings to the CPU. The cost depends on that shape and the token
counts, not on the weights, so the model is randomly initialised and nothing is downloaded.

Token counts: ``lengths`` tokenizes the dev passages (``"title | text"``, ``[CLS] [D] ... [SEP]``, cut at 180)
with a 30,522-piece WordPiece vocabulary trained on them (the ``tokenizers`` package; needs the colbert
extra). ``run`` reports two rows per batch size: those lengths, and every passage at the full 180 tokens, an
upper bound for Wikipedia's 100-word passages. ``--check-colbert N`` (CPU, colbert extra) also times
colbert-ai's ``docFromText`` on N HotpotQA passages, then the plain encoder on the token counts colbert-ai's
tokenizer gave those passages, so that the two costs are compared side by side.

k-means and residual compression, the rest of a build, are not timed here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "data"
DOC_MAXLEN = 180
VOCAB = 30_522
CORPORA = {
    "2Wiki / MuSiQue (IRCoT)": 430_225,
    "HotpotQA abstracts": 5_233_329,
    "Wikipedia 2018 (DPR)": 21_015_324,
}


def token_lengths(limit: int, data_dir: Path = FIXTURES) -> np.ndarray:
    """ColBERT document token counts of up to ``limit`` dev passages (every dataset's corpus, in turn)."""
    import json

    from tokenizers import BertWordPieceTokenizer

    files = sorted(Path(data_dir).glob("*/corpus.jsonl"))
    if not files:
        raise SystemExit(f"no */corpus.jsonl under {data_dir}; pass --data-dir")
    texts = []
    for path in files:
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    row = json.loads(line)
                    title, text = row.get("title") or "", row.get("text") or ""
                    texts.append(f"{title} | {text}" if title else text)
    texts = texts[:limit]
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(texts, vocab_size=VOCAB, min_frequency=1, show_progress=False)
    # + [D] marker; the tokenizer adds [CLS] and [SEP] itself.
    lengths = [len(encoding.ids) + 1 for encoding in wordpiece.encode_batch(texts)]
    return np.minimum(np.array(lengths, dtype=np.int32), DOC_MAXLEN)


class Encoder:
    """BERT-base + a 128-wide projection, normalized per token: the shape of ColBERTv2's document encoder."""

    def __init__(self, device: str) -> None:
        import torch
        import transformers

        torch.manual_seed(0)
        self.torch, self.device = torch, torch.device(device)
        self.bert = transformers.BertModel(transformers.BertConfig(vocab_size=VOCAB)).to(self.device).eval()
        self.linear = torch.nn.Linear(768, 128, bias=False).to(self.device)

    def encode(self, lengths: np.ndarray, bsize: int) -> None:
        """Encode passages of these token counts as colbert-ai does: by length, in padded batches."""
        torch = self.torch
        generator = torch.Generator().manual_seed(0)
        ordered = np.sort(lengths)[::-1]
        amp = torch.autocast("cuda", dtype=torch.float16, enabled=self.device.type == "cuda")
        with torch.inference_mode(), amp:
            for start in range(0, len(ordered), bsize):
                batch = ordered[start : start + bsize]
                width = int(batch[0])
                ids = torch.randint(1000, VOCAB, (len(batch), width), generator=generator)
                mask = torch.arange(width)[None, :] < torch.from_numpy(batch.copy())[:, None]
                ids, mask = ids.to(self.device), mask.to(self.device)
                hidden = self.bert(input_ids=ids, attention_mask=mask.long()).last_hidden_state
                embeddings = torch.nn.functional.normalize(self.linear(hidden), p=2, dim=2)
                embeddings[mask].half().cpu()  # each passage's unpadded token embeddings, on the CPU
        if self.device.type == "cuda":
            torch.cuda.synchronize()


def passages_per_second(encoder: Encoder, lengths: np.ndarray, bsize: int, repeats: int) -> float:
    encoder.encode(lengths[: bsize * 4], bsize)  # warm-up: kernels, allocator
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        encoder.encode(lengths, bsize)
        seconds.append(time.perf_counter() - started)
    return len(lengths) / statistics.median(seconds)


def colbert_ai_rate(n: int, bsize: int, data_dir: Path = FIXTURES) -> tuple[float, np.ndarray]:
    """colbert-ai's own ``Checkpoint.docFromText`` on CPU over the first ``n`` HotpotQA passages: passages/s,
    and the passages' token counts as its document tokenizer gives them."""
    from colbert.infra import ColBERTConfig
    from colbert.modeling.checkpoint import Checkpoint

    from ragsuite.data.datasets import load_corpus
    from ragsuite.retrieval.colbert.checkpoint import build_tiny_checkpoint

    passages = load_corpus("hotpotqa", data_dir=data_dir)
    with tempfile.TemporaryDirectory(prefix="ragsuite-colbert-speed-") as tmp:
        checkpoint = build_tiny_checkpoint(
            passages[:5000], Path(tmp) / "ckpt", vocab_size=VOCAB, hidden_size=768, num_layers=12,
            num_heads=12, dim=128,
        )  # fmt: skip
        model = Checkpoint(str(checkpoint), colbert_config=ColBERTConfig(doc_maxlen=DOC_MAXLEN))
        texts = [p.render() for p in passages[:n]]
        _, mask = model.doc_tokenizer.tensorize(texts)
        model.docFromText(texts[:bsize], bsize=bsize)
        started = time.perf_counter()
        model.docFromText(texts, bsize=bsize)
        return len(texts) / (time.perf_counter() - started), mask.sum(dim=1).numpy().astype(np.int32)


def run(args: argparse.Namespace) -> int:
    import torch

    measured = np.load(args.lengths) if args.lengths else token_lengths(args.passages, args.data_dir)
    measured = np.resize(measured, args.passages)  # cycled to the wanted count
    full = np.full(args.passages, DOC_MAXLEN, dtype=np.int32)
    if args.device == "cuda":
        name = torch.cuda.get_device_name()
    else:
        name = f"CPU, {torch.get_num_threads()} threads"
    print(f"# ColBERTv2-shaped encoder on {name}; torch {torch.__version__}; {args.passages} passages a run")
    print(f"mean tokens per passage: {measured.mean():.1f} (dev passages), {DOC_MAXLEN} (full)\n")
    encoder = Encoder(args.device)
    print(f"| batch | token counts | passages/s | {' | '.join(CORPORA)} |")
    print(f"|---:|---|---:|{'---:|' * len(CORPORA)}")
    for bsize in (int(b) for b in args.bsize.split(",")):
        for label, lengths in (("dev passages", measured), (f"all {DOC_MAXLEN}", full)):
            rate = passages_per_second(encoder, lengths, bsize, args.repeats)
            hours = [f"{n / rate / 3600:,.2f} h" for n in CORPORA.values()]
            print(f"| {bsize} | {label} | {rate:,.1f} | {' | '.join(hours)} |", flush=True)
    if args.check_colbert:
        theirs, lengths = colbert_ai_rate(args.check_colbert, 64, args.data_dir)
        plain = passages_per_second(encoder, lengths, 64, 1)
        print(f"\ncolbert-ai docFromText: {theirs:.1f} passages/s; plain encoder: {plain:.1f} passages/s "
              f"({plain / theirs:.2f}x), same {len(lengths)} passages, batch 64")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    lengths = commands.add_parser("lengths", help="write the dev passages' token counts")
    lengths.add_argument("--out", type=Path, required=True)
    lengths.add_argument("--passages", type=int, default=20_000)
    timing = commands.add_parser("run", help="time the encoder")
    timing.add_argument("--lengths", type=Path, help="token counts from `lengths` (default: computed here)")
    timing.add_argument("--device", default="cpu", help="cpu or cuda")
    timing.add_argument("--passages", type=int, default=2000, help="passages per timed run")
    timing.add_argument("--bsize", default="64", help="batch sizes, comma-separated (colbert-ai: 64)")
    timing.add_argument("--repeats", type=int, default=3, help="timed runs per row (median)")
    timing.add_argument("--check-colbert", type=int, default=0, metavar="N")
    for command in (lengths, timing):
        command.add_argument(
            "--data-dir",
            type=Path,
            default=FIXTURES,
            help="datasets (default: the committed fixtures, tests/fixtures/data)",
        )
    args = parser.parse_args(argv)
    if args.command == "lengths":
        np.save(args.out, token_lengths(args.passages, args.data_dir))
        print(args.out)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
