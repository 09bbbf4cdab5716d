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

The paper fine-tunes T5-Large. Two classifiers are offered:

- :class:`ComplexityClassifier` (the default): multinomial logistic regression over hashed word unigrams and
  bigrams of the question (plus its first word, the question type), trained by full-batch gradient descent in
  NumPy. It needs no extra install, trains in seconds on a CPU and is deterministic.
- :class:`TransformerComplexityClassifier`: the paper's kind, a pretrained language model fine-tuned as a
  three-way sequence classifier (T5, BERT, ... through ``transformers``; the ``train`` extra).

Either is saved as a directory with ``classifier.json`` (kind, labels, training report, the sha256 of every
other file) beside numbers only: a ``.npy`` matrix read without pickle, or safetensors weights loaded without
remote code. A file that does not match its checksum is refused, and so is any file that cannot be read as
what it claims to be (a crafted ``.npy`` header, a corrupt tokenizer or safetensors file), in one line.
A loaded classifier's ``sha256`` (that of ``classifier.json``, which holds the sha256 of every other file)
identifies its content: an eval run records it, so that resuming after the classifier was retrained in place
is refused like any other change of configuration.
"""

from __future__ import annotations

import hashlib
import itertools
import json
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
MODEL_DIR = "model"
HINT = "train one with `ragsuite classifier train`"
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


class _Classifier:
    """What both classifiers share: the class choice, accuracy, copying, and checked files."""

    kind: str = ""
    training: dict[str, Any]
    #: sha256 of the ``classifier.json`` it was loaded from (None until saved and loaded).
    sha256: str | None = None

    def predict_proba(self, question: str) -> dict[str, float]:
        raise NotImplementedError

    def predict(self, question: str) -> str:
        """The most probable class (ties go to the simpler strategy)."""
        probs = self.predict_proba(question)
        return max(COMPLEXITY_LABELS, key=lambda label: (probs[label], -COMPLEXITY_LABELS.index(label)))

    def accuracy(self, questions: Sequence[str], labels: Sequence[str]) -> float | None:
        """Share of ``questions`` classified as ``labels`` (None for no questions)."""
        if not questions:
            return None
        return sum(self.predict(q) == y for q, y in zip(questions, labels, strict=True)) / len(questions)

    def __deepcopy__(self, memo: dict[int, Any]) -> _Classifier:
        # Read-only once trained: optimizers copy programs many times, so copies share the model.
        return self

    def _write_config(self, directory: Path, **extra: Any) -> None:
        """``classifier.json`` with the sha256 of every other file in ``directory``, written last."""
        from ragsuite.files import atomic_write_text

        files = {
            str(path.relative_to(directory)): file_sha256(path)
            for path in sorted(directory.rglob("*"))
            if path.is_file() and path.name != CONFIG_NAME
        }
        config = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "kind": self.kind,
            "labels": list(COMPLEXITY_LABELS),
            **extra,
            "files": files,
            "training": self.training,
        }
        atomic_write_text(directory / CONFIG_NAME, json.dumps(config, indent=2) + "\n")


def _check_labels(questions: Sequence[str], labels: Sequence[str]) -> None:
    if len(questions) != len(labels) or not questions:
        raise ConfigError(
            f"need as many labels as questions (and at least one): {len(questions)} questions, "
            f"{len(labels)} labels"
        )
    unknown = sorted(set(labels) - set(COMPLEXITY_LABELS))
    if unknown:
        raise ConfigError(f"unknown complexity labels {unknown}; labels are {', '.join(COMPLEXITY_LABELS)}")


def _balanced_weights(target: np.ndarray) -> np.ndarray:
    """Per-example weights inversely proportional to class frequency, summing to 1: a rare class counts."""
    counts = np.bincount(target, minlength=len(COMPLEXITY_LABELS))
    per_class = np.where(counts > 0, len(target) / (len(COMPLEXITY_LABELS) * np.maximum(counts, 1)), 0.0)
    weights = per_class[target]
    return weights / weights.sum()


def _training_report(target: np.ndarray, predicted: np.ndarray, **settings: Any) -> dict[str, Any]:
    counts = np.bincount(target, minlength=len(COMPLEXITY_LABELS))
    return {
        "examples": len(target),
        "labels": {label: int(counts[i]) for i, label in enumerate(COMPLEXITY_LABELS)},
        "train_accuracy": float((predicted == target).mean()),
        **settings,
    }


class ComplexityClassifier(_Classifier):
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

    kind = "hashed-logistic-regression"

    def __init__(self, *, dims: int = 2**18, weights: np.ndarray | None = None) -> None:
        if not isinstance(dims, int) or dims < 2:
            raise ConfigError(f"dims must be an integer >= 2, not {dims!r}")
        self.dims = dims
        shape = (dims, len(COMPLEXITY_LABELS))
        self.weights = np.zeros(shape, dtype=np.float32) if weights is None else weights
        if self.weights.shape != shape:
            raise ConfigError(f"classifier weights have shape {self.weights.shape}, expected {shape}")
        self.training: dict[str, Any] = {}

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
        _check_labels(questions, labels)
        target = np.array([COMPLEXITY_LABELS.index(label) for label in labels])
        onehot = np.eye(len(COMPLEXITY_LABELS))[target]
        sample_weight = _balanced_weights(target) if balanced else np.full(len(target), 1 / len(target))
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
        self.training = _training_report(
            target, predicted, epochs=epochs, learning_rate=learning_rate, l2=l2, balanced=balanced
        )
        return self

    def predict_proba(self, question: str) -> dict[str, float]:
        """The probability of each class for one question."""
        ids, rows = self._design([question])
        probs = self._probabilities(ids, rows, 1)[0]
        return {label: float(p) for label, p in zip(COMPLEXITY_LABELS, probs, strict=True)}

    # ------------------------------------------------------------------------------------------ files
    def save(self, directory: str | Path) -> Path:
        """Write ``weights.npy`` and ``classifier.json`` into ``directory`` (created)."""
        from ragsuite.files import atomic_open

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with atomic_open(directory / WEIGHTS_NAME, "wb") as handle:
            np.save(handle, self.weights, allow_pickle=False)
        self._write_config(directory, dims=self.dims)
        return directory

    @classmethod
    def _from_files(cls, directory: Path, config: Mapping[str, Any]) -> ComplexityClassifier:
        weights_path = directory / WEIGHTS_NAME
        try:
            weights = np.load(weights_path, allow_pickle=False)
        except (
            Exception
        ) as exc:  # a crafted header can fail numpy's parser in many ways; none is ours to show
            raise ConfigError(
                f"{weights_path} is not a readable weight matrix ({type(exc).__name__}: {exc}); {HINT}"
            ) from exc
        if not isinstance(weights, np.ndarray):  # np.load returns an archive for zip data, whatever the name
            raise ConfigError(f"{weights_path} is not a .npy weight matrix; {HINT}")
        dims = config.get("dims")
        if (
            isinstance(dims, bool)
            or not isinstance(dims, int)
            or weights.dtype != np.float32
            or not np.isfinite(weights).all()
        ):
            raise ConfigError(f"{weights_path} holds no finite float32 weights for {dims!r} features; {HINT}")
        return cls(dims=dims, weights=weights)


class TransformerComplexityClassifier(_Classifier):
    """A pretrained language model fine-tuned as Adaptive-RAG's three-way classifier (the paper: T5-Large).

    Needs the ``train`` extra (torch, transformers). Any checkpoint that ``transformers`` can load as a
    sequence classifier works (T5, BERT, DeBERTa, ...); remote code is never run.

    Args:
        model: A local checkpoint directory or a Hugging Face Hub name (downloaded once by ``transformers``).
        max_length: Question tokens kept.

    Example:
        >>> clf = TransformerComplexityClassifier("google-t5/t5-small")  # doctest: +SKIP
        >>> clf.fit(questions, labels, epochs=3).save("classifiers/t5-small")  # doctest: +SKIP
    """

    kind = "transformers"

    def __init__(
        self, model: str | Path, *, max_length: int = 64, local_only: bool = False, seed: int = 0
    ) -> None:
        try:
            import torch
            from transformers import AutoModelForSequenceClassification, AutoTokenizer
        except ImportError as exc:
            from ragsuite.errors import install_hint

            raise ConfigError(
                f"a transformers complexity classifier needs torch and transformers: {install_hint('train')}"
            ) from exc
        self.source = str(model)
        self.max_length = max_length
        options: dict[str, Any] = {"trust_remote_code": False, "local_files_only": local_only}
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(self.source, **options)
            # The new classification head is initialised at random: from ``seed``, without touching the
            # caller's global generator.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self.model = AutoModelForSequenceClassification.from_pretrained(
                    self.source,
                    num_labels=len(COMPLEXITY_LABELS),
                    id2label=dict(enumerate(COMPLEXITY_LABELS)),
                    label2id={label: i for i, label in enumerate(COMPLEXITY_LABELS)},
                    **options,
                )
        except Exception as exc:  # a corrupt tokenizer or safetensors file raises its own types
            raise ConfigError(
                f"cannot load {self.source!r} as a sequence classifier ({type(exc).__name__}: {exc})"
            ) from exc
        if self.tokenizer.pad_token is None:  # decoder-only checkpoints have none
            self.tokenizer.pad_token = self.tokenizer.eos_token
            self.model.config.pad_token_id = self.tokenizer.eos_token_id
        self.model.eval()
        self.training = {}

    def _encode(self, questions: Sequence[str]) -> Any:
        return self.tokenizer(
            list(questions), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )

    def fit(
        self,
        questions: Sequence[str],
        labels: Sequence[str],
        *,
        epochs: int = 3,
        learning_rate: float = 3e-5,
        batch_size: int = 16,
        seed: int = 0,
        balanced: bool = True,
    ) -> TransformerComplexityClassifier:
        """Fine-tune with AdamW on the (class-balanced) cross-entropy, shuffling each epoch with ``seed``
        (dropout draws from torch's global generator: seed it too for an exactly repeatable run)."""
        import torch

        _check_labels(questions, labels)
        target = np.array([COMPLEXITY_LABELS.index(label) for label in labels])
        weights = _balanced_weights(target) if balanced else np.full(len(target), 1 / len(target))
        generator = torch.Generator().manual_seed(seed)
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=learning_rate)
        self.model.train()
        epoch_losses = []
        for _ in range(epochs):
            total = 0.0
            order = torch.randperm(len(questions), generator=generator).tolist()
            for start in range(0, len(order), batch_size):
                batch = order[start : start + batch_size]
                logits = self.model(**self._encode([questions[i] for i in batch])).logits
                losses = torch.nn.functional.cross_entropy(
                    logits, torch.tensor(target[batch]), reduction="none"
                )
                batch_weights = torch.tensor(weights[batch], dtype=losses.dtype)
                loss = (losses * batch_weights).sum() / batch_weights.sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += float(loss.detach()) * len(batch)
            epoch_losses.append(total / len(order))
        self.model.eval()
        predicted = np.array([COMPLEXITY_LABELS.index(self.predict(q)) for q in questions])
        self.training = _training_report(
            target,
            predicted,
            base_model=self.source,
            epochs=epochs,
            learning_rate=learning_rate,
            batch_size=batch_size,
            seed=seed,
            balanced=balanced,
            first_epoch_loss=epoch_losses[0] if epoch_losses else None,
            last_epoch_loss=epoch_losses[-1] if epoch_losses else None,
        )
        return self

    def predict_proba(self, question: str) -> dict[str, float]:
        """The probability of each class for one question."""
        import torch

        with torch.no_grad():
            probs = torch.softmax(self.model(**self._encode([question])).logits[0].float(), dim=-1)
        return {label: float(p) for label, p in zip(COMPLEXITY_LABELS, probs.tolist(), strict=True)}

    def save(self, directory: str | Path) -> Path:
        """Write the fine-tuned model and tokenizer (safetensors) under ``directory/model`` and
        ``classifier.json``."""
        directory = Path(directory)
        (directory / MODEL_DIR).mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory / MODEL_DIR, safe_serialization=True)
        self.tokenizer.save_pretrained(directory / MODEL_DIR)
        self._write_config(directory, max_length=self.max_length)
        return directory

    @classmethod
    def _from_files(cls, directory: Path, config: Mapping[str, Any]) -> TransformerComplexityClassifier:
        if not any(name.endswith(".safetensors") for name in config.get("files", {})):
            raise ConfigError(f"{directory} holds no safetensors weights; {HINT}")
        max_length = config.get("max_length")
        if not isinstance(max_length, int) or max_length < 1:
            raise ConfigError(f"{directory / CONFIG_NAME} has no valid max_length; {HINT}")
        return cls(directory / MODEL_DIR, max_length=max_length, local_only=True)


CLASSIFIER_KINDS: dict[str, type[_Classifier]] = {
    ComplexityClassifier.kind: ComplexityClassifier,
    TransformerComplexityClassifier.kind: TransformerComplexityClassifier,
}


def load_classifier(directory: str | Path) -> ComplexityClassifier | TransformerComplexityClassifier:
    """Read a classifier saved by either kind's ``save``, checking its format and every file's checksum.

    Raises:
        ConfigError: when the directory holds no classifier, another format, or a file that does not match.
    """
    directory = Path(directory)
    config_path = directory / CONFIG_NAME
    if not config_path.is_file():
        raise ConfigError(f"no complexity classifier at {directory} (no {CONFIG_NAME}); {HINT}")
    try:
        raw = config_path.read_bytes()
        config = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{config_path} is not a readable classifier description ({exc}); {HINT}") from exc
    if not isinstance(config, Mapping) or config.get("format") != FORMAT:
        raise ConfigError(f"{config_path} is not a ragsuite complexity classifier; {HINT}")
    if config.get("version") != FORMAT_VERSION or config.get("labels") != list(COMPLEXITY_LABELS):
        raise ConfigError(
            f"{config_path} has version {config.get('version')!r} / labels {config.get('labels')!r}; "
            f"this ragsuite reads version {FORMAT_VERSION} with labels {list(COMPLEXITY_LABELS)}; {HINT}"
        )
    kind = CLASSIFIER_KINDS.get(str(config.get("kind")))
    files = config.get("files")
    if kind is None or not isinstance(files, Mapping) or not files:
        raise ConfigError(f"{config_path} names no known classifier kind and files; {HINT}")
    for name, digest in files.items():
        path = (directory / str(name)).resolve()
        if directory.resolve() not in path.parents:  # a listed name may not point outside the directory
            raise ConfigError(f"{config_path} lists a file outside its directory: {name!r}")
        if not path.is_file() or file_sha256(path) != digest:
            raise ConfigError(f"{path} is missing or does not match {config_path}'s checksum; {HINT}")
    classifier = kind._from_files(directory, config)
    training = config.get("training")
    classifier.training = dict(training) if isinstance(training, Mapping) else {}
    classifier.sha256 = hashlib.sha256(raw).hexdigest()
    return classifier


__all__ = [
    "COMPLEXITY_LABELS",
    "ComplexityClassifier",
    "TransformerComplexityClassifier",
    "complexity_label",
    "load_classifier",
    "question_features",
]
