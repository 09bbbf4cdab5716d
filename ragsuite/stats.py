"""Uncertainty for reported scores: percentile bootstrap confidence intervals of a mean and of a ratio of
paired sums (seconds under one setting over another), and a paired test between two runs on the same
questions (a paired bootstrap interval of the difference and a sign-flip permutation p-value).

Scores are per-question values (0/1 or F1 in [0, 1]); a run's score is their mean. Resampling is seeded, so a
report prints the same interval every time.

Example:
    >>> from ragsuite.stats import bootstrap_ci, paired_test
    >>> low, high = bootstrap_ci([1, 0, 1, 1, 0, 1, 1, 1])
    >>> result = paired_test([1, 1, 1, 0], [0, 1, 0, 0])
    >>> round(result.difference, 2)
    0.5
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Resamples used for intervals and permutations: enough for stable percentile bounds at 95%.
RESAMPLES = 5000


def bootstrap_ci(
    values: Sequence[float], *, level: float = 0.95, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """The percentile bootstrap interval of the mean of ``values``.

    Raises:
        ValueError: With no values (a mean of nothing has no interval) or a level outside (0, 1).
    """
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no values to bootstrap")
    if not 0 < level < 1:
        raise ValueError(f"level must be between 0 and 1, not {level}")
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(resamples, data.size))].mean(axis=1)
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def ratio_of_sums_ci(
    numerators: Sequence[float],
    denominators: Sequence[float],
    *,
    level: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """The percentile bootstrap interval of ``sum(numerators) / sum(denominators)``, resampling the pairs
    ``(numerators[i], denominators[i])`` together: a unit that was slow under both settings (a long question,
    a busy machine) moves both sums, so the machine's noise does not widen the interval of their ratio.

    Example:
        >>> ratio_of_sums_ci([5.0, 500.0], [10.0, 1000.0])
        (0.5, 0.5)

    Raises:
        ValueError: When the lists differ in length or are empty, or the level is outside (0, 1).
    """
    x, y = np.asarray(numerators, dtype=float), np.asarray(denominators, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"the ratio's sums must pair up: {x.size} vs {y.size} values")
    if x.size == 0:
        raise ValueError("no values to bootstrap")
    if not 0 < level < 1:
        raise ValueError(f"level must be between 0 and 1, not {level}")
    picks = np.random.default_rng(seed).integers(0, x.size, size=(resamples, x.size))
    ratios = x[picks].sum(axis=1) / y[picks].sum(axis=1)
    tail = (1 - level) / 2
    return float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1 - tail))


@dataclass(frozen=True)
class PairedResult:
    """A paired comparison of run A with run B on the same ``n`` questions.

    Attributes:
        n: Questions both runs scored.
        difference: mean(A) - mean(B).
        low, high: Bootstrap interval of the difference at the requested level.
        p_value: Two-sided sign-flip permutation p-value of "no difference".
        significant: ``p_value < 1 - level``.
    """

    n: int
    difference: float
    low: float
    high: float
    p_value: float
    significant: bool


def paired_test(
    a: Sequence[float], b: Sequence[float], *, level: float = 0.95, resamples: int = RESAMPLES, seed: int = 0
) -> PairedResult:
    """Compare two runs question by question (``a[i]`` and ``b[i]`` score the same question).

    Raises:
        ValueError: When the lists differ in length or are empty.
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired scores must align: {x.size} vs {y.size} questions")
    if x.size == 0:
        raise ValueError("no questions in common to compare")
    diffs = x - y
    observed = float(diffs.mean())
    low, high = bootstrap_ci(diffs, level=level, resamples=resamples, seed=seed)
    rng = np.random.default_rng(seed + 1)
    signs = rng.choice((-1.0, 1.0), size=(resamples, diffs.size))
    permuted = np.abs((signs * diffs).mean(axis=1))
    # The +1 counts the observed assignment itself, so p is never 0 from a finite sample.
    p_value = float((np.sum(permuted >= abs(observed) - 1e-12) + 1) / (resamples + 1))
    return PairedResult(int(x.size), observed, low, high, p_value, p_value < 1 - level)


__all__ = ["RESAMPLES", "PairedResult", "bootstrap_ci", "paired_test", "ratio_of_sums_ci"]
