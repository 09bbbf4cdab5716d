"""A deterministic synthetic corpus of any size with the word statistics of real passages.

    python benchmarks/synthetic_corpus.py 1000000 /tmp/synthetic-1M.jsonl [--seed 0] [--data-dir DIR]

Word statistics come from every ``*/corpus.jsonl`` under ``--data-dir`` (by default the committed test
fixtures, ``tests/fixtures/data``; the published scale figures used the dev samples' corpora):

* passage and title lengths are drawn from the empirical length distributions;
* 92% of words are drawn from the empirical word distribution (surface forms, case and punctuation kept, so
  the tokenizer, stopword list and stemmer see what real text gives them);
* 8% are drawn from an unbounded Zipf (a = 1.5) over pseudo-words, so the vocabulary keeps growing with the
  corpus as real vocabularies do (Heaps' law), instead of saturating at the dev corpora's vocabulary.

The same ``(n, seed)`` always writes the same file, so a benchmark run can be repeated anywhere.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "data"
NOVEL_SHARE = 0.08
NOVEL_ZIPF_A = 1.5
_LETTERS = np.array(list("bcdfghjklmnprstvwz"))
_VOWELS = np.array(list("aeiou"))


def source_passages(data_dir: Path = FIXTURES) -> list[dict]:
    """Every passage of the corpora under ``data_dir``."""
    files = sorted(Path(data_dir).glob("*/corpus.jsonl"))
    if not files:
        raise SystemExit(f"no */corpus.jsonl under {data_dir}; pass --data-dir")
    rows = []
    for file in files:
        with file.open(encoding="utf-8") as handle:
            rows.extend(json.loads(line) for line in handle if line.strip())
    return rows


def _pseudo_word(n: int) -> str:
    """A pronounceable word for integer ``n`` (consonant-vowel syllables), distinct for distinct ``n``."""
    syllables = []
    n += 1
    while n:
        n, r = divmod(n, len(_LETTERS) * len(_VOWELS))
        syllables.append(_LETTERS[r // len(_VOWELS)] + _VOWELS[r % len(_VOWELS)])
    return "".join(syllables)


class Generator:
    """Draws passages with the statistics of ``rows``."""

    def __init__(self, rows: list[dict], seed: int) -> None:
        words: Counter[str] = Counter()
        text_lengths, title_lengths = [], []
        for row in rows:
            text = row.get("text") or ""
            tokens = text.split()
            words.update(tokens)
            text_lengths.append(len(tokens))
            title_lengths.append(len((row.get("title") or "").split()))
            words.update((row.get("title") or "").split())
        self.vocab = np.array(list(words), dtype=object)
        counts = np.array(list(words.values()), dtype=np.float64)
        self.cumulative = np.cumsum(counts / counts.sum())
        self.text_lengths = np.array(text_lengths)
        self.title_lengths = np.array([t for t in title_lengths if t] or [2])
        self.rng = np.random.default_rng(seed)
        self._novel: dict[int, str] = {}

    def _words(self, n: int) -> list[str]:
        rng = self.rng
        picks = self.vocab[np.minimum(np.searchsorted(self.cumulative, rng.random(n)), len(self.vocab) - 1)]
        novel = rng.random(n) < NOVEL_SHARE
        if novel.any():
            ranks = rng.zipf(NOVEL_ZIPF_A, int(novel.sum()))
            novel_words = self._novel
            picks[novel] = [
                novel_words.get(r) or novel_words.setdefault(int(r), _pseudo_word(int(r))) for r in ranks
            ]
        return picks.tolist()

    def passages(self, n: int, *, chunk: int = 20_000):
        """``n`` passages as dicts with ``id``, ``title``, ``text``."""
        rng = self.rng
        made = 0
        while made < n:
            size = min(chunk, n - made)
            text_lengths = rng.choice(self.text_lengths, size)
            title_lengths = rng.choice(self.title_lengths, size)
            words = self._words(int(text_lengths.sum() + title_lengths.sum()))
            at = 0
            for i in range(size):
                title = " ".join(words[at : at + title_lengths[i]])
                at += title_lengths[i]
                text = " ".join(words[at : at + text_lengths[i]])
                at += text_lengths[i]
                yield {"id": f"s{made + i}", "title": title, "text": text}
            made += size


def write_corpus(n: int, path: Path, *, seed: int = 0, data_dir: Path = FIXTURES) -> Path:
    """Write the ``n``-passage corpus for ``seed`` and the statistics of ``data_dir``'s corpora to ``path``
    (skipped when a complete one made from the same source is there)."""
    done = path.with_suffix(path.suffix + ".done")
    marker = f"{n} {seed} {Path(data_dir).resolve()}"
    if path.is_file() and done.is_file() and done.read_text() == marker:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    generator = Generator(source_passages(data_dir), seed)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        for row in generator.passages(n):
            handle.write(json.dumps(row, ensure_ascii=False))
            handle.write("\n")
    tmp.replace(path)
    done.write_text(marker)
    return path


def parse_count(text: str) -> int:
    """``100k`` / ``1M`` / ``2500`` -> int."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmM]?)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a passage count: {text!r} (e.g. 100k, 1M, 5M)")
    scale = {"": 1, "k": 1_000, "m": 1_000_000}[match.group(2).lower()]
    return int(float(match.group(1)) * scale)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("n", type=parse_count)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=FIXTURES,
        help="datasets whose corpora give the word statistics (default: the committed fixtures)",
    )
    args = parser.parse_args(argv)
    write_corpus(args.n, args.out, seed=args.seed, data_dir=args.data_dir)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
