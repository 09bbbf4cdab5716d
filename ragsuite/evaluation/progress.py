"""The progress bar of an evaluation: a tqdm bar on stderr with the running primary score, errors, LM calls
and tokens per question.

Example:
    >>> from ragsuite.evaluation.progress import ProgressBar
    >>> bar = ProgressBar(50, initial=0, dataset="hotpotqa", enabled=False)  # enabled: drawn on stderr
    >>> bar.add({"metrics": {"accuracy": 1.0}, "tokens": {"lm_invocations": 3, "input": 900, "output": 40}})
    >>> bar.close()
    >>> bar.scored, bar.calls, bar.tokens
    (1, 3, 940)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ragsuite.data.datasets import get_dataset_info


class ProgressBar:
    """A tqdm bar on stderr whose postfix shows the running primary score, errors, LM calls and tokens."""

    def __init__(self, total: int, *, initial: int, dataset: str, enabled: bool) -> None:
        self.metric = get_dataset_info(dataset).primary_metric
        self.scored = 0
        self.errors = 0
        self.score = 0.0
        self.calls = 0
        self.tokens = 0
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc="eval", unit="q", dynamic_ncols=True)

    def add(self, record: Mapping[str, Any], *, count: bool = True) -> None:
        if record.get("error"):
            self.errors += 1
        else:
            self.scored += 1
            self.score += float(record["metrics"].get(self.metric, 0.0))
        tokens = record.get("tokens", {})
        self.calls += int(tokens.get("lm_invocations", 0))
        self.tokens += int(tokens.get("input", 0)) + int(tokens.get("output", 0))
        if self.bar is not None:
            if count:
                self.bar.update(1)
            done = max(self.scored + self.errors, 1)
            self.bar.set_postfix_str(
                f"{self.metric}={100 * self.score / max(self.scored, 1):.1f}% err={self.errors} "
                f"calls/q={self.calls / done:.1f} tok/q={self.tokens / done:.0f}",
                refresh=False,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
