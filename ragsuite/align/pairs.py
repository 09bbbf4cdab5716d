"""Preference pairs: what one sampled LM reply is, how a chosen/rejected pair is kept, how per-stage counts
are selected, and how the pairs are written in TRL's preference format.

A pair's prompt is the exact chat the program sends its LM for that stage (DSPy's formatted system and user
messages, demos included), and its chosen/rejected completions are the LM's raw replies, field headers and
all. A model trained on them is therefore trained on the very prompts ``ragsuite eval`` later sends it.

The written rows use TRL's conversational preference format::

    {"prompt": [{"role": "system", ...}, {"role": "user", ...}],
     "chosen": [{"role": "assistant", "content": ...}],
     "rejected": [{"role": "assistant", "content": ...}],
     "stage": "note_init", "id": "..."}

Example:
    >>> pair = PreferencePair(stage="note_init", question_id="q1", prompt=[{"role": "user", "content": "hi"}],
    ...                       chosen="good", rejected="bad", label="judge")
    >>> trl_row(pair)["chosen"]
    [{'role': 'assistant', 'content': 'good'}]
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ragsuite.errors import ConfigError

#: The file ``align build`` writes for ``align train``.
TRAIN_FILE = "train.jsonl"


@dataclass
class Sample:
    """One reply of a stage's LM under one sampling setting.

    Attributes:
        setting: ``(temperature, top_p)`` the reply was sampled with.
        messages: The chat sent to the LM (role/content dicts).
        completion: The LM's raw reply text.
        values: The output fields parsed from the reply (empty when it could not be parsed).
        error: Why the reply is unusable (unparsable, no LM call seen), or None.
    """

    setting: tuple[float, float]
    messages: list[dict[str, str]] = field(default_factory=list)
    completion: str = ""
    values: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.messages) and bool(self.completion.strip())


@dataclass
class PreferencePair:
    """A chosen and a rejected reply to one prompt of one stage.

    Attributes:
        stage: The program stage (``note_init``, ``query_refine``, ``note_update``, ``answer``, ...).
        question_id: The dataset question the pair was built from.
        prompt: The chat both replies answer.
        chosen: The preferred reply (raw text).
        rejected: The dispreferred reply (raw text).
        label: What decided the preference (``judge``, ``note_compare``, ``metric:accuracy``, ...).
        chosen_setting: ``(temperature, top_p)`` of the chosen reply.
        rejected_setting: ``(temperature, top_p)`` of the rejected reply.
    """

    stage: str
    question_id: str
    prompt: list[dict[str, str]]
    chosen: str
    rejected: str
    label: str
    chosen_setting: tuple[float, float] | None = None
    rejected_setting: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["chosen_setting"] = list(self.chosen_setting) if self.chosen_setting else None
        data["rejected_setting"] = list(self.rejected_setting) if self.rejected_setting else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PreferencePair:
        return cls(
            stage=str(data["stage"]),
            question_id=str(data["question_id"]),
            prompt=[dict(m) for m in data["prompt"]],
            chosen=str(data["chosen"]),
            rejected=str(data["rejected"]),
            label=str(data.get("label", "")),
            chosen_setting=tuple(data["chosen_setting"]) if data.get("chosen_setting") else None,  # type: ignore[arg-type]
            rejected_setting=tuple(data["rejected_setting"]) if data.get("rejected_setting") else None,  # type: ignore[arg-type]
        )


def pair_of(stage: str, question_id: str, chosen: Sample, rejected: Sample, *, label: str) -> PreferencePair:
    """A pair from two samples of the same prompt."""
    return PreferencePair(
        stage=stage,
        question_id=question_id,
        prompt=chosen.messages,
        chosen=chosen.completion,
        rejected=rejected.completion,
        label=label,
        chosen_setting=chosen.setting,
        rejected_setting=rejected.setting,
    )


def trl_row(pair: PreferencePair) -> dict[str, Any]:
    """The pair as a row of TRL's conversational preference format (plus ``stage`` and ``id``)."""
    return {
        "prompt": [{"role": m["role"], "content": m["content"]} for m in pair.prompt],
        "chosen": [{"role": "assistant", "content": pair.chosen}],
        "rejected": [{"role": "assistant", "content": pair.rejected}],
        "stage": pair.stage,
        "id": f"{pair.stage}-{pair.question_id}",
    }


def parse_counts(text: str | None, stages: Sequence[str]) -> dict[str, int | None]:
    """``"note_init=1900,answer=all"`` -> ``{"note_init": 1900, "answer": None}`` (``all``: every pair).

    Only the stages named are returned; the caller keeps its defaults for the others.

    Raises:
        ConfigError: a malformed item, an unknown stage (the message lists the program's), a negative count.
    """
    counts: dict[str, int | None] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, eq, raw = item.strip().partition("=")
        name, raw = name.strip(), raw.strip()
        if not eq or not name:
            raise ConfigError(f"--counts expects STAGE=N[,STAGE=N...], not {item!r}")
        if name not in stages:
            raise ConfigError(f"--counts names stage {name!r}; the program's stages are: {', '.join(stages)}")
        if raw == "all":
            counts[name] = None
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ConfigError(f"--counts {name}={raw!r}: the count must be an integer or 'all'") from None
        if value < 0:
            raise ConfigError(f"--counts {name}={value}: the count must be >= 0")
        counts[name] = value
    return counts


def select_pairs(
    pairs: Iterable[PreferencePair], counts: Mapping[str, int | None], *, seed: int
) -> tuple[list[PreferencePair], dict[str, dict[str, int | None]]]:
    """Draw at most ``counts[stage]`` pairs of each stage at random (seeded; every pair when ``None``), then
    shuffle the stages together, as the official selection script does.

    Returns:
        The selected pairs and, per stage, ``{"available", "asked", "selected"}``.
    """
    by_stage: dict[str, list[PreferencePair]] = {stage: [] for stage in counts}
    for pair in pairs:
        by_stage.setdefault(pair.stage, []).append(pair)
    rng = random.Random(seed)
    chosen: list[PreferencePair] = []
    report: dict[str, dict[str, int | None]] = {}
    for stage in sorted(by_stage):
        # A fixed order first (by question, then setting) so that the draw does not depend on thread timing.
        found = sorted(by_stage[stage], key=lambda p: (p.question_id, str(p.chosen_setting), p.chosen))
        rng.shuffle(found)
        asked = counts.get(stage)
        take = found if asked is None else found[:asked]
        chosen.extend(take)
        report[stage] = {"available": len(found), "asked": asked, "selected": len(take)}
    rng.shuffle(chosen)
    return chosen, report


def write_trl(pairs: Sequence[PreferencePair], path: str | Path) -> Path:
    """Write ``pairs`` as TRL preference rows, one JSON object a line, atomically."""
    from ragsuite.files import atomic_write_text

    lines = [json.dumps(trl_row(pair), ensure_ascii=False) for pair in pairs]
    return atomic_write_text(Path(path), "".join(line + "\n" for line in lines))


def read_trl(path: str | Path) -> list[dict[str, Any]]:
    """Read a TRL preference file written by :func:`write_trl`, checking every row's shape.

    Raises:
        ConfigError: a missing file, a line that is not JSON, or a row without a chat ``prompt`` and
            assistant ``chosen``/``rejected`` messages (the message names ``file:line``).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path} does not exist; build it first with `ragsuite align build ... --out DIR`")
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{path}:{lineno}: not valid JSON ({exc})") from None
        for key in ("prompt", "chosen", "rejected"):
            value = row.get(key) if isinstance(row, dict) else None
            if not (isinstance(value, list) and value and all(isinstance(m, dict) for m in value)):
                raise ConfigError(f"{path}:{lineno}: {key!r} must be a non-empty list of chat messages")
        rows.append(row)
    if not rows:
        raise ConfigError(f"{path} holds no preference pairs; build more questions (--samples) first")
    return rows


__all__ = [
    "TRAIN_FILE",
    "PreferencePair",
    "Sample",
    "pair_of",
    "parse_counts",
    "read_trl",
    "select_pairs",
    "trl_row",
    "write_trl",
]
