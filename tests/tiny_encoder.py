"""A tiny random BERT sentence encoder over a corpus' words, for dense tests without model weights."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest

from ragsuite.errors import install_hint

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_tiny_encoder(texts: Iterable[str], out: Path, *, vocab_size: int) -> Path:
    """A WordPiece vocabulary of ``texts`` and a 1-layer, 32-wide random BERT saved in ``out``, the same in
    every process; skips the test (naming the dense extra) when transformers or torch is missing.

    The vocabulary is not trained with ``tokenizers``: its trainer breaks ties in Rust hash-map order, seeded
    anew per process, so the token ids (and now and then the tokens) would change from run to run, and the
    embeddings with them. Here: the special tokens, every character alone and as a ``##`` continuation, then
    the most frequent words (ties alphabetical) up to ``vocab_size``.
    """
    reason = "needs the dense extra: " + install_hint("dense")
    transformers = pytest.importorskip("transformers", reason=reason)
    torch = pytest.importorskip("torch", reason=reason)
    from tokenizers.normalizers import BertNormalizer
    from tokenizers.pre_tokenizers import BertPreTokenizer

    normalizer, pre_tokenizer = BertNormalizer(lowercase=True), BertPreTokenizer()
    counts = Counter(
        word for text in texts for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))
    )
    chars = sorted({c for word in counts for c in word})
    vocab = [*SPECIAL_TOKENS, *chars, *(f"##{c}" for c in chars)]
    words = sorted((w for w in counts if len(w) > 1), key=lambda w: (-counts[w], w))
    vocab += words[: max(0, vocab_size - len(vocab))]
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    transformers.BertTokenizerFast(vocab_file=str(out / "vocab.txt")).save_pretrained(str(out))
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    transformers.BertModel(config).save_pretrained(str(out))
    return out
