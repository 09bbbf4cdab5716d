"""A tiny random BERT sentence encoder trained on a corpus, for dense tests without model weights."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from ragsuite.errors import install_hint


def build_tiny_encoder(texts: Iterable[str], out: Path, *, vocab_size: int) -> Path:
    """A WordPiece vocabulary trained on ``texts`` and a 1-layer, 32-wide random BERT saved in ``out``; skips
    the test (naming the dense extra) when transformers or torch is missing."""
    reason = "needs the dense extra: " + install_hint("dense")
    transformers = pytest.importorskip("transformers", reason=reason)
    torch = pytest.importorskip("torch", reason=reason)
    from tokenizers import BertWordPieceTokenizer

    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(
        list(texts), vocab_size=vocab_size, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    )
    wordpiece.save_model(str(out))
    transformers.BertTokenizerFast(vocab_file=str(out / "vocab.txt")).save_pretrained(str(out))
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=wordpiece.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
    )
    transformers.BertModel(config).save_pretrained(str(out))
    return out
