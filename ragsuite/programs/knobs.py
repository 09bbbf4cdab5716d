"""Knob declarations: each program states each of its knobs once, as a :class:`Knob` (name, default, type,
range, search space, one-line meaning), in its ``KNOBS``.

Everything else about a knob comes from that declaration: the constructor's validation and defaults
(:meth:`Knobs.check`), ``--set`` parsing (:meth:`Knobs.parse`), Optuna's search space (:meth:`Knobs.suggest`),
the catalog ``--help`` reads and the knob tables of the docs (:meth:`Knobs.markdown_table`). A variant program
overrides defaults, not signatures: ``KNOBS = DeepNote.KNOBS.override(max_failure=1)``.

This module imports neither dspy nor any program, so the catalog and the CLI's help can use it freely.

Example:
    >>> knobs = Knobs(
    ...     integer("max_step", 3, minimum=0, search=Ints(1, 5), help="Most refinement steps."),
    ...     integer("max_failure", 2, minimum=1, search=Ints(1, "max_step"), help="Most rejected updates."),
    ... )
    >>> knobs.defaults()
    {'max_step': 3, 'max_failure': 2}
    >>> knobs.override(max_failure=1).check({"max_step": 5})
    {'max_step': 5, 'max_failure': 1}
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ragsuite.errors import ConfigError

#: How a knob's value is read and checked.
KnobKind = Literal["int", "float", "bool", "choice", "path"]


# ----------------------------------------------------------------------------------------- search spaces
@dataclass(frozen=True)
class Ints:
    """Integers from ``low`` to ``high`` (inclusive) in steps of ``step``; ``high`` may name an earlier knob,
    whose sampled value is then the bound (``max_failure <= max_step``).

    Attributes:
        low: The smallest value.
        high: The largest value, or the name of the knob whose value is the largest.
        step: The spacing of the values.
        when: Tune the knob only when these knobs take these values (sampled, or their defaults).
    """

    low: int
    high: int | str
    step: int = 1
    when: Mapping[str, Any] = field(default_factory=dict)

    def suggest(self, trial: Any, name: str, values: Mapping[str, Any]) -> int:
        high = values[self.high] if isinstance(self.high, str) else self.high
        return int(trial.suggest_int(name, self.low, high, step=self.step))

    def describe(self) -> str:
        step = f" step {self.step}" if self.step != 1 else ""
        return f"{self.low}..{self.high}{step}"


@dataclass(frozen=True)
class Floats:
    """Numbers from ``low`` to ``high``, on a log scale with ``log=True``.

    Attributes:
        low: The smallest value.
        high: The largest value.
        log: Sample on a log scale (halving a weight matters as much as doubling it).
        when: Tune the knob only when these knobs take these values (sampled, or their defaults).
    """

    low: float
    high: float
    log: bool = False
    when: Mapping[str, Any] = field(default_factory=dict)

    def suggest(self, trial: Any, name: str, values: Mapping[str, Any]) -> float:
        return float(trial.suggest_float(name, self.low, self.high, log=self.log))

    def describe(self) -> str:
        return f"{self.low}..{self.high}" + (" (log)" if self.log else "")


@dataclass(frozen=True)
class OneOf:
    """One of the given options.

    Attributes:
        options: The options, in the order Optuna is given them.
        when: Tune the knob only when these knobs take these values (sampled, or their defaults).
    """

    options: tuple[Any, ...]
    when: Mapping[str, Any] = field(default_factory=dict)

    def suggest(self, trial: Any, name: str, values: Mapping[str, Any]) -> Any:
        return trial.suggest_categorical(name, list(self.options))

    def describe(self) -> str:
        return "{" + ", ".join(_shown(option) for option in self.options) + "}"


Search = Ints | Floats | OneOf


# ----------------------------------------------------------------------------------------------- knobs
@dataclass(frozen=True)
class Knob:
    """One knob: a constructor setting saved in program files, set with ``--set`` and tuned by Optuna.

    Attributes:
        name: The constructor keyword and attribute name.
        default: The paper's default.
        kind: ``int``, ``float``, ``bool``, ``choice`` or ``path`` (a file path, or None).
        help: What it does, one line (the docs tables show it).
        minimum: The smallest value of an ``int`` or ``float`` knob (None: unbounded).
        maximum: The largest value of a ``float`` knob (None: unbounded).
        choices: The options of a ``choice`` knob.
        search: Optuna's search space for it, or None when it is not tuned.
    """

    name: str
    default: Any
    kind: KnobKind
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[Any, ...] = ()
    search: Search | None = None

    def check(self, value: Any) -> Any:
        """``value``, checked (and numbers made ``float`` for a ``float`` knob); ConfigError if it is not one
        of the knob's values (``bool`` is no number here, so a typo cannot pass for ``1``)."""
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise ConfigError(f"{self.name} must be true or false, not {value!r}")
            return value
        if self.kind == "choice":
            if value not in self.choices or isinstance(value, bool) != isinstance(self.choices[0], bool):
                raise ConfigError(f"{self.name} must be {_options(self.choices)}, not {value!r}")
            return value
        if self.kind == "path":
            if isinstance(value, os.PathLike):
                value = os.fspath(value)  # saved and compared as text
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{self.name} must be a file path or null, not {value!r}")
            return value
        if self.kind == "int":
            low = self.minimum if self.minimum is not None else -math.inf
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{self.name} must be an integer >= {self.minimum}, not {value!r}")
            return value
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        low, high = self.minimum, self.maximum
        if not number or (low is not None and value < low) or (high is not None and value > high):
            raise ConfigError(f"{self.name} must be {self.describe_type()}, not {value!r}")
        return float(value)

    def parse(self, raw: str) -> Any:
        """A ``--set`` value (read as JSON where it is one, else as text), checked."""
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if self.kind == "path" and value is not None and not isinstance(value, str):
            value = raw  # a path is text, even one that reads as a number; a JSON string is its text
        return self.check(value)

    def describe_type(self) -> str:
        """The knob's values in words: ``an integer >= 1``, ``a probability between 0 and 1``, ..."""
        if self.kind == "int":
            return f"an integer >= {self.minimum}"
        if self.kind == "bool":
            return "true or false"
        if self.kind == "choice":
            return _options(self.choices)
        if self.kind == "path":
            return "a file path or null"
        if (self.minimum, self.maximum) == (0.0, 1.0):
            return "a probability between 0 and 1"
        if self.maximum is None:
            return "a number" if self.minimum is None else f"a number >= {self.minimum:g}"
        return f"a number from {self.minimum:g} to {self.maximum:g}"


def integer(name: str, default: int, *, minimum: int, help: str, search: Search | None = None) -> Knob:
    """An integer knob of at least ``minimum``."""
    return Knob(name, default, "int", help, minimum=minimum, search=search)


def number(
    name: str,
    default: float,
    *,
    help: str,
    minimum: float | None = None,
    maximum: float | None = None,
    search: Search | None = None,
) -> Knob:
    """A finite number knob, within ``minimum``..``maximum`` where given."""
    return Knob(name, float(default), "float", help, minimum=minimum, maximum=maximum, search=search)


def probability(name: str, default: float, *, help: str, search: Search | None = None) -> Knob:
    """A threshold knob: a probability in [0, 1]."""
    return number(name, default, help=help, minimum=0.0, maximum=1.0, search=search)


def flag(name: str, default: bool, *, help: str, search: Search | None = None) -> Knob:
    """A true/false knob."""
    return Knob(name, default, "bool", help, search=search)


def choice(
    name: str, default: Any, choices: tuple[Any, ...], *, help: str, search: Search | None = None
) -> Knob:
    """A knob taking one of ``choices``."""
    if default not in choices:
        raise ValueError(f"{name}'s default {default!r} is not one of {choices}")
    return Knob(name, default, "choice", help, choices=tuple(choices), search=search)


def path(name: str, *, help: str) -> Knob:
    """A knob holding a file path (None by default: no file)."""
    return Knob(name, None, "path", help)


class Knobs(Mapping[str, Knob]):
    """A program's knobs, in order: a mapping of name to :class:`Knob` (``"top_k" in KNOBS``, iterating gives
    the names).

    Args:
        *knobs: The knobs, in the order the catalog, the docs and program files list them.
    """

    def __init__(self, *knobs: Knob) -> None:
        self._knobs = {knob.name: knob for knob in knobs}
        if len(self._knobs) != len(knobs):
            raise ValueError(f"a knob is declared twice: {[k.name for k in knobs]}")
        for knob in knobs:
            knob.check(knob.default)  # a wrong default fails at import, not in a user's run
            for other in _references(knob):
                if other not in self._knobs:
                    raise ValueError(f"{knob.name}'s search space names {other!r}, which is no knob here")

    # ------------------------------------------------------------------ mapping
    def __getitem__(self, name: str) -> Knob:
        return self._knobs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._knobs)

    def __len__(self) -> int:
        return len(self._knobs)

    def __repr__(self) -> str:
        return f"Knobs({', '.join(self._knobs)})"

    # ------------------------------------------------------------------ deriving variants
    def override(self, **defaults: Any) -> Knobs:
        """The same knobs with other defaults (a variant program: Adaptive-Note, an ablation)."""
        return self._with({name: {"default": value} for name, value in defaults.items()})

    def replace(self, name: str, **fields: Any) -> Knobs:
        """The same knobs with ``fields`` of knob ``name`` changed (``search=...``, ``help=...``)."""
        return self._with({name: fields})

    def tuned(self, *names: str) -> Knobs:
        """The same knobs with only ``names`` in the search space."""
        self._known(names)
        return Knobs(*(k if k.name in names else replace(k, search=None) for k in self._knobs.values()))

    def __add__(self, other: Knobs) -> Knobs:
        return Knobs(*self._knobs.values(), *other.values())

    def _with(self, changes: Mapping[str, Mapping[str, Any]]) -> Knobs:
        self._known(changes)
        return Knobs(*(replace(k, **changes.get(k.name, {})) for k in self._knobs.values()))

    def _known(self, names: Any) -> None:
        unknown = [name for name in names if name not in self._knobs]
        if unknown:
            raise ValueError(f"no knob {unknown[0]!r}; the knobs: {', '.join(self._knobs)}")

    # ------------------------------------------------------------------ reading values
    def defaults(self) -> dict[str, Any]:
        """Each knob's default, in order."""
        return {name: knob.default for name, knob in self._knobs.items()}

    def check(self, values: Mapping[str, Any], *, program: str = "this program") -> dict[str, Any]:
        """Every knob's value: those given, checked, and the defaults of the others.

        Raises:
            ConfigError: for a name that is no knob (naming the knobs) or a value the knob does not take.
        """
        self.refuse_unknown(values, program=program)
        return {name: knob.check(values.get(name, knob.default)) for name, knob in self._knobs.items()}

    def parse(self, name: str, raw: str, *, program: str = "this program") -> Any:
        """A ``--set NAME=RAW`` value for knob ``name``, checked."""
        self.refuse_unknown([name], program=program)
        return self._knobs[name].parse(raw)

    def refuse_unknown(self, names: Any, *, program: str) -> None:
        """ConfigError naming the knobs when one of ``names`` is not one of them."""
        for name in names:
            if name not in self._knobs:
                raise ConfigError(
                    f"program {program!r} has no knob {name!r}; its knobs are: {', '.join(self) or '(none)'}"
                )

    # ------------------------------------------------------------------ search
    def searched(self) -> list[str]:
        """The knobs with a search space, in order."""
        return [name for name, knob in self._knobs.items() if knob.search is not None]

    def suggest(self, trial: Any, *, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Sample the searched knobs from an Optuna ``trial``, in declaration order; a knob whose bound or
        condition names another searched knob waits for it. A knob whose ``when`` does not hold is left out
        (the program then takes its base value).

        Args:
            trial: The Optuna trial.
            base: The values of the knobs not sampled, which bounds and conditions read (a program file's
                knobs, fixed ones); default: their defaults.
        """
        start = {name: knob.default for name, knob in self._knobs.items()} | dict(base or {})
        values: dict[str, Any] = {}
        pending = self.searched()
        while pending:
            # A knob reading another searched knob waits until that one is sampled (or left out).
            ready = next(n for n in pending if not set(_references(self._knobs[n])) & set(pending))
            pending.remove(ready)
            knob = self._knobs[ready]
            assert knob.search is not None
            current = {name: values.get(name, start[name]) for name in self._knobs}
            if all(current[k] == v for k, v in knob.search.when.items()):
                values[ready] = knob.search.suggest(trial, ready, current)
        return {name: values[name] for name in self._knobs if name in values}

    # ------------------------------------------------------------------ docs
    def markdown_table(self) -> str:
        """The knobs as a Markdown table: name, default, values, tuned over, meaning."""
        rows = ["| knob | default | values | tuned over | meaning |", "|---|---|---|---|---|"]
        for knob in self._knobs.values():
            search = knob.search
            tuned = "—" if search is None else search.describe()
            if search is not None and search.when:
                tuned += " when " + ", ".join(f"`{k}={_shown(v)}`" for k, v in search.when.items())
            default = f"`{_shown(knob.default)}`"
            rows.append(f"| `{knob.name}` | {default} | {knob.describe_type()} | {tuned} | {knob.help} |")
        return "\n".join(rows)


def _references(knob: Knob) -> list[str]:
    """The other knobs ``knob``'s search space reads: a bound, or a condition."""
    search = knob.search
    if search is None:
        return []
    bound = [search.high] if isinstance(search, Ints) and isinstance(search.high, str) else []
    return [*bound, *search.when]


def _shown(value: Any) -> str:
    """A value as the docs and ``--set`` spell it (``true``, ``null``, ``0.5``)."""
    return json.dumps(value) if isinstance(value, bool) or value is None else str(value)


def _options(choices: tuple[Any, ...]) -> str:
    """``'a', 'b' or 'c'``."""
    shown = [repr(c) for c in choices]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


__all__ = [
    "Floats",
    "Ints",
    "Knob",
    "KnobKind",
    "Knobs",
    "OneOf",
    "Search",
    "choice",
    "flag",
    "integer",
    "number",
    "path",
    "probability",
]
