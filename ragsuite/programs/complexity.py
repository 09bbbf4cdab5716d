"""A trainable query-complexity classifier for Adaptive-RAG.

Adaptive-RAG (Jeong et al., 2024, "Adaptive-RAG: Learning to Adapt Retrieval-Augmented Large Language Models
through Question Complexity", §3.2-3.3) routes each question by a small classifier trained on labels that
are collected automatically:

1. Run the three strategies on training questions: no retrieval, single-step retrieval, multi-step (IRCoT).
2. Label each question with the simplest strategy that answers it correctly: ``A`` when no retrieval does,
   else ``B`` when single-step does, else ``C`` when multi-step does.
3. A question no strategy answers takes its dataset's inductive bias: ``B`` for single-hop datasets, ``C``
   for multi-hop ones.
4. Train the classifier on (question, label) pairs; at inference the predicted class picks the strategy.

The paper fine-tunes T5-Large. Here the classifier is multinomial logistic regression over hashed word
unigrams and bigrams of the question (plus its first word, the question type), trained by full-batch gradient
descent in NumPy: it needs no extra install, trains in seconds on a CPU and is deterministic. It is saved as a
JSON description beside a ``.npy`` weight matrix, read without pickle: a classifier file holds numbers only.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragsuite.data.datasets import file_sha256
from ragsuite.errors import ConfigError

#: Adaptive-RAG's classes: A no retrieval, B single-step, C multi-step.
COMPLEXITY_LABELS: tuple[str, ...] = ("A", "B", "C")
FORMAT = "ragsuite-complexity-classifier"
FORMAT_VERSION = 1
CONFIG_NAME = "classifier.json"
WEIGHTS_NAME = "weights.npy"
_WORD = re.compile(r"\w+", re.UNICODE)


def complexity_label(*, no_retrieval: bool, single_step: bool, multi_step: bool, multi_hop: bool) -> str:
    """Adaptive-RAG's training label: the simplest strategy that answered, else the dataset's bias.

    Example:
        >>> complexity_label(no_retrieval=False, single_step=True, multi_step=True, multi_hop=True)
        'B'
        >>> complexity_label(no_retrieval=False, single_step=False, multi_step=False, multi_hop=True)
        'C'
    """
    if no_retrieval:
        return "A"
    if single_step:
        return "B"
    if multi_step:
        return "C"
    return "C" if multi_hop else "B"


def question_features(question: str, *, dims: int) -> list[int]:
    """Hashed feature ids of a question: a bias, its first word, its unigrams and bigrams (each once)."""
    words = _WORD.findall(question.lower())
    names = ["<bias>"]
    if words:
        names.append(f"first={words[0]}")
    names.extend(words)
    names.extend(f"{a} {b}" for a, b in itertools.pairwise(words))
    # crc32 is stable across processes and Python versions, unlike hash().
    return sorted({zlib.crc32(name.encode("utf-8", "surrogatepass")) % dims for name in names})


class ComplexityClassifier:
    """Multinomial logistic regression over hashed question n-grams, predicting A / B / C.

    Args:
        dims: Number of hashed feature slots (2**18 keeps collisions rare for questions).
        weights: A ``(dims, 3)`` float32 matrix; zeros (uniform predictions) when omitted.

    Example:
        >>> clf = ComplexityClassifier(dims=1024).fit(
        ...     ["who wrote hamlet", "which film came out first, x or y"], ["A", "C"], epochs=50
        ... )
        >>> clf.predict("which album came out first, a or b")
        'C'
    """

    def __init__(self, *, dims: int = 2**18, weights: np.ndarray | None = None) -> None:
        if not isinstance(dims, int) or dims < 2:
            raise ConfigError(f"dims must be an integer >= 2, not {dims!r}")
        self.dims = dims
        shape = (dims, len(COMPLEXITY_LABELS))
        self.weights = np.zeros(shape, dtype=np.float32) if weights is None else weights
        if self.weights.shape != shape:
            raise ConfigError(f"classifier weights have shape {self.weights.shape}, expected {shape}")
        self.training: dict[str, Any] = {}

    def __deepcopy__(self, memo: dict[int, Any]) -> ComplexityClassifier:
        # Read-only once trained: optimizers copy programs many times, so copies share the weights.
        return self

    def _design(self, questions: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Feature ids of every question, flattened, and the row each id belongs to."""
        rows: list[int] = []
        ids: list[int] = []
        for row, question in enumerate(questions):
            features = question_features(question, dims=self.dims)
            ids.extend(features)
            rows.extend([row] * len(features))
        return np.asarray(ids, dtype=np.int64), np.asarray(rows, dtype=np.int64)

    def _probabilities(self, ids: np.ndarray, rows: np.ndarray, count: int) -> np.ndarray:
        logits = np.zeros((count, len(COMPLEXITY_LABELS)), dtype=np.float64)
        np.add.at(logits, rows, self.weights[ids])
        logits -= logits.max(axis=1, keepdims=True)
        exp = np.exp(logits)
        return exp / exp.sum(axis=1, keepdims=True)

    def fit(
        self,
        questions: Sequence[str],
        labels: Sequence[str],
        *,
        epochs: int = 200,
        learning_rate: float = 0.5,
        l2: float = 1e-4,
        balanced: bool = True,
    ) -> ComplexityClassifier:
        """Train by full-batch gradient descent on the mean cross-entropy (plus L2), from zero weights.

        Args:
            questions: Training questions.
            labels: Their classes, each one of ``A``, ``B``, ``C``.
            epochs: Gradient steps over the whole set.
            learning_rate: Step size.
            l2: Weight decay.
            balanced: Weigh each class inversely to its frequency, so a rare class is not ignored.
        """
        if len(questions) != len(labels) or not questions:
            raise ConfigError(
                f"need as many labels as questions (and at least one): {len(questions)} questions, "
                f"{len(labels)} labels"
            )
        unknown = sorted(set(labels) - set(COMPLEXITY_LABELS))
        if unknown:
            raise ConfigError(
                f"unknown complexity labels {unknown}; labels are {', '.join(COMPLEXITY_LABELS)}"
            )
        target = np.array([COMPLEXITY_LABELS.index(label) for label in labels])
        onehot = np.eye(len(COMPLEXITY_LABELS))[target]
        counts = np.bincount(target, minlength=len(COMPLEXITY_LABELS))
        if balanced:
            per_class = np.where(
                counts > 0, len(target) / (len(COMPLEXITY_LABELS) * np.maximum(counts, 1)), 0
            )
            sample_weight = per_class[target]
        else:
            sample_weight = np.ones(len(target))
        sample_weight = sample_weight / sample_weight.sum()
        ids, rows = self._design(questions)
        weights = np.zeros((self.dims, len(COMPLEXITY_LABELS)), dtype=np.float64)
        self.weights = weights
        for _ in range(epochs):
            probs = self._probabilities(ids, rows, len(questions))
            error = (probs - onehot) * sample_weight[:, None]
            gradient = np.zeros_like(weights)
            np.add.at(gradient, ids, error[rows])
            weights -= learning_rate * (gradient + l2 * weights)
        self.weights = weights.astype(np.float32)
        predicted = self._probabilities(ids, rows, len(questions)).argmax(axis=1)
        self.training = {
            "examples": len(questions),
            "labels": {label: int(counts[i]) for i, label in enumerate(COMPLEXITY_LABELS)},
            "train_accuracy": float((predicted == target).mean()),
            "epochs": epochs,
            "learning_rate": learning_rate,
            "l2": l2,
            "balanced": balanced,
        }
        return self

    def predict_proba(self, question: str) -> dict[str, float]:
        """The probability of each class for one question."""
        ids, rows = self._design([question])
        probs = self._probabilities(ids, rows, 1)[0]
        return {label: float(p) for label, p in zip(COMPLEXITY_LABELS, probs, strict=True)}

    def predict(self, question: str) -> str:
        """The most probable class (ties go to the simpler strategy)."""
        probs = self.predict_proba(question)
        return max(COMPLEXITY_LABELS, key=lambda label: (probs[label], -COMPLEXITY_LABELS.index(label)))

    def accuracy(self, questions: Sequence[str], labels: Sequence[str]) -> float | None:
        """Share of ``questions`` classified as ``labels`` (None for no questions)."""
        if not questions:
            return None
        return sum(self.predict(q) == y for q, y in zip(questions, labels, strict=True)) / len(questions)

    # ------------------------------------------------------------------------------------------ files
    def save(self, directory: str | Path) -> Path:
        """Write ``classifier.json`` and ``weights.npy`` into ``directory`` (created)."""
        from ragsuite.files import atomic_open, atomic_write_text

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with atomic_open(directory / WEIGHTS_NAME, "wb") as handle:
            np.save(handle, self.weights, allow_pickle=False)
        config = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "kind": "hashed-logistic-regression",
            "labels": list(COMPLEXITY_LABELS),
            "dims": self.dims,
            "weights_sha256": file_sha256(directory / WEIGHTS_NAME),
            "training": self.training,
        }
        atomic_write_text(directory / CONFIG_NAME, json.dumps(config, indent=2) + "\n")
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> ComplexityClassifier:
        """Read a classifier saved by :meth:`save`, checking its format, checksum and weights."""
        directory = Path(directory)
        config_path = directory / CONFIG_NAME
        hint = "train one with `ragsuite classifier train`"
        if not config_path.is_file():
            raise ConfigError(f"no complexity classifier at {directory} (no {CONFIG_NAME}); {hint}")
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"{config_path} is not a readable classifier description ({exc}); {hint}"
            ) from exc
        if not isinstance(config, Mapping) or config.get("format") != FORMAT:
            raise ConfigError(f"{config_path} is not a ragsuite complexity classifier; {hint}")
        if config.get("version") != FORMAT_VERSION or config.get("labels") != list(COMPLEXITY_LABELS):
            raise ConfigError(
                f"{config_path} has version {config.get('version')!r} / labels {config.get('labels')!r}; "
                f"this ragsuite reads version {FORMAT_VERSION} with labels {list(COMPLEXITY_LABELS)}; {hint}"
            )
        weights_path = directory / WEIGHTS_NAME
        if not weights_path.is_file() or file_sha256(weights_path) != config.get("weights_sha256"):
            raise ConfigError(f"{weights_path} is missing or does not match {config_path}'s checksum; {hint}")
        try:
            weights = np.load(weights_path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{weights_path} is not a readable weight matrix ({exc}); {hint}") from exc
        dims = config.get("dims")
        if not isinstance(dims, int) or weights.dtype != np.float32 or not np.isfinite(weights).all():
            raise ConfigError(f"{weights_path} holds no finite float32 weights for {dims!r} features; {hint}")
        classifier = cls(dims=dims, weights=weights)
        classifier.training = dict(config.get("training") or {})
        return classifier


def log_loss(classifier: ComplexityClassifier, questions: Sequence[str], labels: Sequence[str]) -> float:
    """Mean negative log-likelihood of ``labels`` (for reports; lower is better)."""
    total = 0.0
    for question, label in zip(questions, labels, strict=True):
        total -= math.log(max(classifier.predict_proba(question)[label], 1e-12))
    return total / max(len(questions), 1)


__all__ = [
    "COMPLEXITY_LABELS",
    "ComplexityClassifier",
    "complexity_label",
    "log_loss",
    "question_features",
]
