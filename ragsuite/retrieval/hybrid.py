"""Several retrievers merged into one: alternating picks (LiveRAG's sparse+dense merge), weighted reciprocal
rank fusion, or a weighted mean of per-query normalized scores (``linear``). Members are queried
concurrently.

The spec of a hybrid (``hybrid:MODE:SPEC[@WEIGHT]+SPEC[@WEIGHT][:KEY=VALUE...]``) carries its weights and its
fusion settings, so a program file rebuilds the same fusion: ``hybrid:rrf:bm25@0.3+dense@0.7``,
``hybrid:linear:bm25+dense:alpha=0.7`` (two members: weights ``1 - alpha`` and ``alpha``),
``hybrid:rrf:bm25+dense:rrf_k=20:depth=30``, ``hybrid:linear:bm25+dense:norm=zscore``. Without weights a
member gets its kind's default weight for the mode (:data:`DEFAULT_WEIGHTS`, fitted on the dev splits; 1 for
kinds not listed there).

:class:`FusionSearch` turns a hybrid's weights, ``rrf_k``, ``depth`` and ``norm`` into Optuna knobs
(``ragsuite tune --tune-retriever``, ``ragsuite retrieve-eval --sweep``).
"""

from __future__ import annotations

import contextvars
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

from ragsuite.aio import DaemonThreadPool
from ragsuite.errors import ConfigError, RagsuiteError, RetrievalError
from ragsuite.retrieval.base import Passage, Retriever
from ragsuite.retrieval.merge import NORMS, interleave, linear, rrf

log = logging.getLogger("ragsuite.retrieval.hybrid")

T = TypeVar("T")
MergeMode = Literal["interleave", "rrf", "linear"]
MODES: tuple[str, ...] = ("interleave", "rrf", "linear")


#: Passages each member is asked for: fusion happens at this depth, whatever k the caller asks.
DEFAULT_DEPTH = 50
DEFAULT_RRF_K = 60
DEFAULT_NORM = "minmax"

#: A member's weight when the spec gives none, by fusion mode and member kind (``describe()["kind"]``);
#: kinds not listed weigh 1. Fitted on every question of the dev splits with gold passages, and checked on
#: each dataset against the fit made without it (``benchmarks/retrieval.py --hybrid``; docs/retrieval.md
#: shows the run).
DEFAULT_WEIGHTS: dict[str, dict[str, float]] = {
    "rrf": {"bm25": 0.3, "dense": 0.7},
    "linear": {"bm25": 0.4, "dense": 0.6},
}

#: A mode's settings when none are given, fitted with :data:`DEFAULT_WEIGHTS`: they apply over the general
#: defaults above to hybrids whose every member kind has a fitted weight (BM25 + dense), not to others.
DEFAULT_SETTINGS: dict[str, dict[str, Any]] = {
    "rrf": {"rrf_k": 0, "depth": DEFAULT_DEPTH},
    "linear": {"norm": "minmax", "depth": 20},
}


def mode_defaults(mode: str, kinds: Sequence[Any] = ()) -> dict[str, Any]:
    """``rrf_k``, ``norm`` and ``depth`` of a hybrid of ``mode`` over members of these kinds built without
    them: the mode's fitted settings where every kind has a fitted weight, else the general defaults."""
    defaults: dict[str, Any] = {"rrf_k": DEFAULT_RRF_K, "norm": DEFAULT_NORM, "depth": DEFAULT_DEPTH}
    fitted = DEFAULT_WEIGHTS.get(mode, {})
    if kinds and all(str(kind) in fitted for kind in kinds):
        defaults.update(DEFAULT_SETTINGS.get(mode, {}))
    return defaults


#: Fusion settings a spec may give after its members, as ``:KEY=VALUE``.
SPEC_OPTIONS = ("alpha", "rrf_k", "depth", "norm")


class HybridRetriever:
    """Query several retrievers for the same query and merge their ranked lists.

    Args:
        retrievers: The member retrievers, in priority order (interleave takes the first one's best first).
        mode: ``"interleave"`` alternates picks from each list, keeping each list's order and skipping
            duplicates; ``"rrf"`` ranks by weighted reciprocal rank fusion, sum of ``w / (rrf_k + rank)``;
            ``"linear"`` by the weighted mean of each member's scores normalized per query (``norm``).
        weights: One non-negative weight per member for ``rrf`` and ``linear`` (only their ratios matter);
            ``None``: each member's default for its kind (:data:`DEFAULT_WEIGHTS`). Interleave takes none.
        rrf_k: The RRF constant; ``None``: the mode's default (:func:`mode_defaults`).
        norm: ``linear``'s per-query normalization of a member's scores, ``minmax`` or ``zscore``; ``None``:
            the mode's default.
        depth: How many passages to ask each member for, whatever ``k`` is (``max(k, depth)``; a member
            with a ``max_k`` limit, like a ColBERT server, is asked for at most that). Fusing from a fixed
            depth makes the top 5 of ``retriever(q, 10)`` the same as ``retriever(q, 5)``, so recall@k is
            one number whatever else is asked. ``None``: the mode's default.

    Example:
        >>> from ragsuite.retrieval.base import Passage
        >>> from ragsuite.retrieval.bm25 import BM25Retriever
        >>> corpus = [
        ...     Passage("p1", "Stettin", "Stettin is a port city on the Oder."),
        ...     Passage("p2", "Oder", "The Oder is a river in Central Europe."),
        ...     Passage("p3", "Baltic Sea", "An arm of the Atlantic."),
        ... ]
        >>> stemmed = BM25Retriever(corpus, persist=False)
        >>> exact = BM25Retriever(corpus, persist=False, stemmer=None, title_weight=1)
        >>> hybrid = HybridRetriever([stemmed, exact], mode="rrf", weights=[0.4, 0.6])
        >>> [p.id for p in hybrid("Which river flows through Stettin?", 2)]
        ['p1', 'p2']
    """

    def __init__(
        self,
        retrievers: Sequence[Retriever],
        *,
        mode: MergeMode = "interleave",
        weights: Sequence[float] | None = None,
        rrf_k: int | None = None,
        norm: str | None = None,
        depth: int | None = None,
    ) -> None:
        if not retrievers:
            raise ConfigError("HybridRetriever needs at least one member retriever")
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        self._members = [r.describe() for r in retrievers]
        self.kinds = [m.get("kind") for m in self._members]
        defaults = mode_defaults(mode, self.kinds)
        rrf_k = defaults["rrf_k"] if rrf_k is None else rrf_k
        norm = defaults["norm"] if norm is None else norm
        depth = defaults["depth"] if depth is None else depth
        if isinstance(rrf_k, bool) or not isinstance(rrf_k, int) or rrf_k < 0:
            raise ConfigError(f"rrf_k must be an integer >= 0, not {rrf_k!r}")
        if norm not in NORMS:
            raise ConfigError(f"norm must be one of {', '.join(NORMS)}, not {norm!r}")
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ConfigError(f"depth must be an integer >= 1, not {depth!r}")
        self.retrievers = list(retrievers)
        self.mode: MergeMode = mode
        self.rrf_k = rrf_k
        self.norm = norm
        self.depth = depth
        if mode == "interleave":
            if weights is not None:
                raise ConfigError(
                    "interleave takes no weights; weigh members with hybrid:rrf or hybrid:linear"
                )
            self.weights: list[float] | None = None
        else:
            self.weights = _checked_weights(
                weights if weights is not None else default_weights(mode, self._members), len(self.retrievers)
            )

    def with_fusion(self, **changes: Any) -> HybridRetriever:
        """The same members fused with other settings (``mode``, ``weights``, ``rrf_k``, ``norm``,
        ``depth``); the members are shared, not rebuilt."""
        unknown = sorted(set(changes) - {"mode", "weights", "rrf_k", "norm", "depth"})
        if unknown:
            raise ConfigError(f"unknown fusion setting(s) {', '.join(unknown)}")
        current = {
            "mode": self.mode,
            "weights": self.weights,
            "rrf_k": self.rrf_k,
            "norm": self.norm,
            "depth": self.depth,
        }
        if changes.get("mode", self.mode) != self.mode and "weights" not in changes:
            current["weights"] = None  # another mode's defaults, not this one's weights
        return HybridRetriever(self.retrievers, **{**current, **changes})

    def _merge(self, lists: Sequence[Sequence[Passage]], k: int) -> list[Passage]:
        if self.mode == "rrf":
            return rrf(lists, k=self.rrf_k, limit=k, weights=self.weights)
        if self.mode == "linear":
            return linear(lists, weights=self.weights, norm=self.norm, limit=k)
        return interleave(lists, limit=k)

    def fuse(self, lists: Sequence[Sequence[Passage]], k: int) -> list[Passage]:
        """Fuse the members' ranked lists (one per member, in member order) into the top ``k``, each list
        cut to the depth this hybrid asks its member for: the lists fetched once at a larger depth give
        exactly what :meth:`__call__` would (used to sweep fusion settings without querying again)."""
        if len(lists) != len(self.retrievers):
            raise ConfigError(f"got {len(lists)} ranked lists for {len(self.retrievers)} members")
        cut = [list(ranked)[: self._depth(k, r)] for ranked, r in zip(lists, self.retrievers, strict=True)]
        return self._merge(cut, k)

    def _fan_out(self, call: Callable[[Retriever], T]) -> list[T]:
        """Run ``call`` on every member concurrently; the first failure is raised, naming its member."""

        def guarded(index: int, retriever: Retriever) -> T:
            try:
                return call(retriever)
            except RagsuiteError:  # already says what went wrong (e.g. k above a server's limit)
                raise
            except Exception as exc:  # a member that breaks the contract still must not pass silently
                raise RetrievalError(
                    f"hybrid member {index} ({type(retriever).__name__}) failed: {exc}"
                ) from exc

        if len(self.retrievers) == 1:
            return [guarded(0, self.retrievers[0])]
        with DaemonThreadPool(len(self.retrievers), name="hybrid") as pool:
            futures = [
                pool.submit(contextvars.copy_context().run, guarded, i, r)
                for i, r in enumerate(self.retrievers)
            ]
            return [f.result() for f in futures]

    def _depth(self, k: int, member: Retriever) -> int:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"k must be a positive integer, not {k!r}")
        limit = getattr(member, "max_k", None)
        depth = self.depth if not isinstance(limit, int) else min(self.depth, limit)
        return max(k, depth)

    def __call__(self, query: str, k: int) -> list[Passage]:
        return self._merge(self._fan_out(lambda r: r(query, self._depth(k, r))), k)

    def batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        queries = list(queries)
        per_member = self._fan_out(lambda r: r.batch(queries, self._depth(k, r)))
        for i, lists in enumerate(per_member):
            if len(lists) != len(queries):
                raise RetrievalError(
                    f"hybrid member {i} returned {len(lists)} result lists for {len(queries)} queries"
                )
        return [self._merge([lists[q] for lists in per_member], k) for q in range(len(queries))]

    def describe(self) -> dict[str, Any]:
        members = [r.describe() for r in self.retrievers]
        return {
            "kind": "hybrid",
            "spec": format_hybrid_spec(
                self.mode,
                [str(m.get("spec", "?")) for m in members],
                weights=self.weights,
                rrf_k=self.rrf_k,
                norm=self.norm,
                depth=self.depth,
                kinds=[m.get("kind") for m in members],
            ),
            "mode": self.mode,
            "weights": self.weights,
            "rrf_k": self.rrf_k,
            "norm": self.norm,
            "depth": self.depth,
            "members": members,
        }


def default_weights(mode: str, members: Sequence[Mapping[str, Any]]) -> list[float]:
    """Each member's default weight for ``mode``, by its description's ``kind`` (1 where none is fitted); all
    1 when they would all be equal (the same fusion, and a spec without weights)."""
    table = DEFAULT_WEIGHTS.get(mode, {})
    weights = [float(table.get(str(m.get("kind")), 1.0)) for m in members]
    return [1.0] * len(weights) if len(set(weights)) == 1 else weights


def _checked_weights(weights: Sequence[float], n: int) -> list[float]:
    try:
        values = [float(w) for w in weights]
    except (TypeError, ValueError):
        raise ConfigError(f"weights must be numbers, not {weights!r}") from None
    if len(values) != n:
        raise ConfigError(f"got {len(values)} weights for {n} members; give one per member")
    if any(not math.isfinite(w) or w < 0 for w in values) or not any(values):
        raise ConfigError(f"weights must be finite, >= 0 and not all 0, not {values}")
    return values


def _number(value: float) -> str:
    text = repr(float(value))  # exact: a program file must rebuild the very same weights
    return text[:-2] if text.endswith(".0") else text


def format_hybrid_spec(
    mode: str,
    members: Sequence[str],
    *,
    weights: Sequence[float] | None = None,
    rrf_k: int | None = None,
    norm: str | None = None,
    depth: int | None = None,
    kinds: Sequence[Any] = (),
) -> str:
    """The spec of a hybrid: weights as ``@W`` after each member unless they are all 1 and so are the
    defaults for the mode and these member kinds (:func:`default_weights`), then the settings that differ
    from the defaults (:func:`mode_defaults`) as ``:KEY=VALUE``. So the spec rebuilds the same fusion
    whatever defaults the library ships then.

    Example:
        >>> format_hybrid_spec("rrf", ["bm25:nq", "dense:nq"], weights=[0.3, 0.7], rrf_k=20)
        'hybrid:rrf:bm25:nq@0.3+dense:nq@0.7:rrf_k=20'
    """
    unit = [1.0] * len(members)
    defaults = default_weights(mode, [{"kind": kind} for kind in kinds]) if kinds else unit
    weighted = weights is not None and (any(float(w) != 1.0 for w in weights) or defaults != unit)
    parts = [
        f"{spec}@{_number(w)}" if weighted else spec
        for spec, w in zip(members, weights or [1.0] * len(members), strict=True)
    ]
    defaults = mode_defaults(mode, kinds)
    options = []
    if mode == "rrf" and rrf_k is not None and rrf_k != defaults["rrf_k"]:
        options.append(f"rrf_k={rrf_k}")
    if mode == "linear" and norm is not None and norm != defaults["norm"]:
        options.append(f"norm={norm}")
    if depth is not None and depth != defaults["depth"]:
        options.append(f"depth={depth}")
    return f"hybrid:{mode}:" + "+".join(parts) + "".join(f":{o}" for o in options)


def parse_hybrid_spec(spec: str) -> tuple[str, list[str], list[float] | None, dict[str, Any]]:
    """``hybrid:MODE:SPEC[@W]+SPEC[@W][:KEY=VALUE...]`` split into (mode, member specs, weights or None,
    fusion settings for :class:`HybridRetriever`: ``rrf_k``, ``norm``, ``depth``).

    ``alpha=A`` stands for the weights ``1 - A`` and ``A`` of two members. A trailing ``@W`` is a weight
    only when ``W`` is a number, so a URL with ``user@host`` stays a member.

    Example:
        >>> parse_hybrid_spec("hybrid:linear:bm25:nq+dense:nq:alpha=0.75")
        ('linear', ['bm25:nq', 'dense:nq'], [0.25, 0.75], {})
    """
    kind, _, rest = spec.strip().partition(":")
    mode, _, members = rest.partition(":")
    if kind != "hybrid" or mode not in MODES or not members:
        raise ConfigError(
            f"hybrid spec must look like hybrid:MODE:SPEC+SPEC with MODE one of {', '.join(MODES)}, "
            f"not {spec!r}"
        )
    options: dict[str, str] = {}
    while True:  # fusion settings come last; members' own options (dense:nq:index=hnsw) use other keys
        head, sep, tail = members.rpartition(":")
        key, eq, value = tail.partition("=")
        if not (sep and eq and key in SPEC_OPTIONS):
            break
        if key in options:
            raise ConfigError(f"hybrid option {key} given twice in {spec!r}")
        options[key] = value
        members = head
    names: list[str] = []
    weights: list[float | None] = []
    for member in members.split("+"):
        name, at, weight = member.rpartition("@")
        parsed = _float(weight) if at else None
        names.append(name if parsed is not None else member)
        weights.append(parsed)
    if any(not name for name in names):
        raise ConfigError(f"empty member in hybrid spec {spec!r}")
    settings: dict[str, Any] = {}
    try:
        if "rrf_k" in options:
            settings["rrf_k"] = int(options["rrf_k"])
        if "depth" in options:
            settings["depth"] = int(options["depth"])
    except ValueError:
        raise ConfigError(f"rrf_k and depth must be integers in {spec!r}") from None
    if "norm" in options:
        settings["norm"] = options["norm"]
    given = [w for w in weights if w is not None]
    if given and len(given) != len(weights):
        raise ConfigError(f"give every member a weight (SPEC@W) or none, in {spec!r}")
    resolved = [float(w) for w in given] if given else None
    if "alpha" in options:
        alpha = _float(options["alpha"])
        if resolved is not None or len(names) != 2 or alpha is None or not 0 <= alpha <= 1:
            raise ConfigError(
                f"alpha=A weighs two members 1 - A and A (0 <= A <= 1), without @weights; not {spec!r}"
            )
        resolved = [round(1.0 - alpha, 12), alpha]  # 1 - 0.7 is 0.30000000000000004
    return mode, names, resolved, settings


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class FusionSearch:
    """A hybrid's fusion settings as Optuna knobs: the member weights (two members: one knob,
    ``fusion_alpha``, the second member's share; more: ``fusion_weight_<i>`` each), ``fusion_rrf_k`` (rrf),
    ``fusion_norm`` (linear) and ``fusion_depth``. The mode stays the one the hybrid was built with.

    Args:
        retriever: The hybrid whose members are kept and whose settings the first trial tries
            (:meth:`defaults`).
        depths: The fusion depths to choose from.

    Example:
        >>> import optuna
        >>> from ragsuite.retrieval.base import Passage
        >>> from ragsuite.retrieval.bm25 import BM25Retriever
        >>> corpus = [Passage("p1", "Oder", "The Oder is a river."), Passage("p2", "Elbe", "A river.")]
        >>> stemmed, exact = (BM25Retriever(corpus, stemmer=s, persist=False) for s in ("english", None))
        >>> search = FusionSearch(HybridRetriever([stemmed, exact], mode="linear"))
        >>> search.defaults()
        {'fusion_depth': 20, 'fusion_alpha': 0.5, 'fusion_norm': 'minmax'}
        >>> def objective(trial):  # in practice: recall@k of search.suggest(trial) on dev questions
        ...     return 1.0 if search.suggest(trial)("Oder", 1)[0].id == "p1" else 0.0
        >>> study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
        >>> study.enqueue_trial(search.defaults())
        >>> study.optimize(objective, n_trials=3)
        >>> study.best_value
        1.0
    """

    WEIGHT_STEP = 0.05

    def __init__(self, retriever: Any, *, depths: Sequence[int] = (10, 20, 30, 50, 75, 100)) -> None:
        if not isinstance(retriever, HybridRetriever):
            raise ConfigError(
                "searching fusion settings needs a hybrid retriever, e.g. --retriever hybrid:rrf:bm25+dense"
            )
        self.retriever = retriever
        self.depths = sorted({int(d) for d in depths} | {retriever.depth})
        self.max_depth = self.depths[-1]

    def suggest(self, trial: Any) -> HybridRetriever:
        """The hybrid with the settings ``trial`` (an ``optuna.Trial`` or ``FixedTrial``) picks."""
        hybrid, n = self.retriever, len(self.retriever.retrievers)
        changes: dict[str, Any] = {"depth": trial.suggest_categorical("fusion_depth", self.depths)}
        if hybrid.mode != "interleave" and n == 2:
            alpha = round(trial.suggest_float("fusion_alpha", 0.0, 1.0, step=self.WEIGHT_STEP), 12)
            changes["weights"] = [round(1.0 - alpha, 12), alpha]
        elif hybrid.mode != "interleave":
            weights = [
                round(trial.suggest_float(f"fusion_weight_{i}", 0.0, 1.0, step=self.WEIGHT_STEP), 12)
                for i in range(n)
            ]
            changes["weights"] = weights if any(weights) else [1.0] * n
        if hybrid.mode == "rrf":
            changes["rrf_k"] = trial.suggest_int("fusion_rrf_k", 0, 100, step=5)
        if hybrid.mode == "linear":
            changes["norm"] = trial.suggest_categorical("fusion_norm", list(NORMS))
        return hybrid.with_fusion(**changes)

    def defaults(self) -> dict[str, Any]:
        """The knob values of the hybrid as built (for ``study.enqueue_trial``): weights snapped to the
        search's grid."""
        hybrid, n = self.retriever, len(self.retriever.retrievers)
        params: dict[str, Any] = {"fusion_depth": hybrid.depth}
        weights = hybrid.weights or [1.0] * n
        if hybrid.mode != "interleave" and n == 2:
            params["fusion_alpha"] = self._snap(weights[1] / sum(weights))
        elif hybrid.mode != "interleave":
            top = max(weights)
            params.update({f"fusion_weight_{i}": self._snap(w / top) for i, w in enumerate(weights)})
        if hybrid.mode == "rrf":
            params["fusion_rrf_k"] = min(100, 5 * round(hybrid.rrf_k / 5))
        if hybrid.mode == "linear":
            params["fusion_norm"] = hybrid.norm
        return params

    def _snap(self, value: float) -> float:
        return round(round(value / self.WEIGHT_STEP) * self.WEIGHT_STEP, 12)
