"""Build a tiny, randomly initialised ColBERT checkpoint from a corpus, for smoke tests without model weights.

The checkpoint is a real colbert-ai checkpoint directory (``config.json``, weights, a WordPiece tokenizer and
``artifact.metadata``) that :class:`colbert.Indexer` and :class:`colbert.Searcher` load like a trained one.
Its ranking quality is that of random token embeddings: an exact-text query finds its passage, paraphrases
do not. Use a trained checkpoint (e.g. ``colbert-ir/colbertv2.0``) for real retrieval.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from ragsuite.errors import ConfigError, require
from ragsuite.retrieval.base import Passage

log = logging.getLogger("ragsuite.retrieval.colbert.checkpoint")

# BERT's special tokens plus ColBERT's query ([unused0]) and document ([unused1]) markers.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "[unused1]")


def build_tiny_checkpoint(
    texts: Iterable[str | Passage],
    out_dir: str | os.PathLike[str],
    *,
    vocab_size: int = 8000,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    dim: int = 64,
    doc_maxlen: int = 180,
    query_maxlen: int = 32,
    seed: int = 0,
) -> Path:
    """Train a WordPiece vocabulary on ``texts`` and save a small random BERT as a ColBERT checkpoint.

    Args:
        texts: Training text for the vocabulary (passages are rendered as ``"title | text"``).
        out_dir: Directory to create (existing files in it are overwritten).
        vocab_size: Upper bound on the WordPiece vocabulary size.
        hidden_size: BERT hidden size.
        num_layers: Number of transformer layers.
        num_heads: Attention heads (must divide ``hidden_size``).
        dim: ColBERT's per-token embedding size (the linear projection after BERT).
        doc_maxlen: Default document length in tokens, stored in the checkpoint's ColBERT config.
        query_maxlen: Default query length in tokens.
        seed: Seed of the random weights (the same seed and texts give the same checkpoint).

    Returns:
        The checkpoint directory.

    Example:
        >>> from ragsuite.data.datasets import load_corpus
        >>> corpus = load_corpus("strategyqa")[:500]
        >>> ckpt = build_tiny_checkpoint(corpus, "/tmp/tiny-colbert")  # doctest: +SKIP
    """
    if hidden_size % num_heads:
        raise ConfigError(f"hidden_size {hidden_size} must be a multiple of num_heads {num_heads}")
    tokenizers = require("tokenizers", extra="colbert", feature="Building a ColBERT checkpoint")
    torch = require("torch", extra="colbert", feature="Building a ColBERT checkpoint")
    transformers = require("transformers", extra="colbert", feature="Building a ColBERT checkpoint")
    require("colbert", extra="colbert", feature="Building a ColBERT checkpoint")
    from colbert.infra.config import ColBERTConfig

    from ragsuite.retrieval.colbert.compat import patch_colbert_for_transformers

    patch_colbert_for_transformers()
    # Looked up after patching, so that the transformers-5 shim applies here too.
    from colbert.modeling.hf_colbert import class_factory

    corpus = [t.render() if isinstance(t, Passage) else str(t) for t in texts]
    if not corpus:
        raise ConfigError("build_tiny_checkpoint needs some text to train its vocabulary on")
    out = Path(out_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)

    wordpiece = tokenizers.BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(
        corpus, vocab_size=vocab_size, min_frequency=1, special_tokens=list(SPECIAL_TOKENS)
    )
    wordpiece.save_model(str(out))
    wordpiece.save(str(out / "tokenizer.json"))
    # Wrapping the trained tokenizer file (not rebuilding a BertTokenizerFast from vocab.txt) gives the
    # same tokenizer under transformers 4 and 5, whose BERT tokenizer constructors differ.
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(out / "tokenizer.json"),
        unk_token="[UNK]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        mask_token="[MASK]",
    )
    tokenizer.save_pretrained(str(out))

    torch.manual_seed(seed)
    bert_config = transformers.BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        intermediate_size=hidden_size * 4,
        max_position_embeddings=max(512, doc_maxlen + 8),
    )
    transformers.BertModel(bert_config).save_pretrained(str(out))

    # Reload through colbert-ai's own model class so the projection layer is saved with the weights and every
    # later load (indexer, searcher) sees the same parameters.
    colbert_config = ColBERTConfig(dim=dim, doc_maxlen=doc_maxlen, query_maxlen=query_maxlen)
    hf_colbert = class_factory(str(out))
    torch.manual_seed(seed)
    model = hf_colbert.from_pretrained(str(out), colbert_config=colbert_config)
    model.save_pretrained(str(out))
    colbert_config.save_for_checkpoint(str(out))
    log.info("tiny ColBERT checkpoint (vocab %d, dim %d) written to %s", len(tokenizer), dim, out)
    return out
