"""HybridRetriever: hand-computed interleave and RRF merges, concurrency, batch, failures, specs."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from ragsuite.errors import ConfigError, RetrievalError
from ragsuite.retrieval.base import Passage
from ragsuite.retrieval.hybrid import HybridRetriever


def P(pid: str, score: float = 0.0) -> Passage:
    return Passage(pid, f"T{pid}", f"text {pid}", score)


class Fixed:
    """Returns the same ranked ids for every query (truncated to k), optionally after a delay."""

    def __init__(self, ids: Sequence[str], *, name: str = "fixed", delay: float = 0.0) -> None:
        self.ids = list(ids)
        self.name = name
        self.delay = delay
        self.ks: list[int] = []
        self.threads: set[str] = set()

    def __call__(self, query: str, k: int) -> list[Passage]:
        self.ks.append(k)
        self.threads.add(threading.current_thread().name)
        time.sleep(self.delay)
        return [P(pid, 10.0 - i) for i, pid in enumerate(self.ids[:k])]

    def batch(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        return [self(q, k) for q in queries]

    def describe(self) -> dict:
        return {"kind": "fixed", "spec": self.name}


class Broken(Fixed):
    def __call__(self, query: str, k: int) -> list[Passage]:
        raise RetrievalError("server down")


class Sloppy(Fixed):
    def __call__(self, query: str, k: int) -> list[Passage]:
        raise KeyError("oops")


def ids(passages: Sequence[Passage]) -> list[str]:
    return [p.id for p in passages]


def test_interleave_hand_computed():
    sparse = Fixed(["a", "b", "c", "d"])
    dense = Fixed(["c", "a", "e", "f"])
    hybrid = HybridRetriever([sparse, dense], mode="interleave")
    # rank 1: a (sparse), c (dense); rank 2: b, a(dup); rank 3: c(dup), e; rank 4: d, f
    assert ids(hybrid("q", 4)) == ["a", "c", "b", "e"]
    assert ids(HybridRetriever([sparse, dense])("q", 6)) == ["a", "c", "b", "e", "d", "f"]
    # Member order decides who goes first.
    assert ids(HybridRetriever([dense, sparse])("q", 3)) == ["c", "a", "b"]
    # Each passage keeps the score of the list it was first taken from.
    assert [p.score for p in hybrid("q", 2)] == [10.0, 10.0]


def test_rrf_hand_computed():
    sparse = Fixed(["a", "b", "c"])
    dense = Fixed(["c", "d", "a"])
    hybrid = HybridRetriever([sparse, dense], mode="rrf", rrf_k=60)
    result = hybrid("q", 4)
    # a: 1/61 + 1/63, c: 1/63 + 1/61 (tie; a was seen first), b: 1/62, d: 1/62 (tie; b first)
    assert ids(result) == ["a", "c", "b", "d"]
    assert result[0].score == pytest.approx(1 / 61 + 1 / 63)
    assert result[2].score == pytest.approx(1 / 62)
    # With k=0 rank 1 dominates: a = 1 + 1/3, c = 1/3 + 1, b = 1/2, d = 1/2.
    assert ids(HybridRetriever([sparse, dense], mode="rrf", rrf_k=0)("q", 2)) == ["a", "c"]
    # Three lists: e appears in two at rank 2, beating singletons at rank 1? 2/62 > 1/61.
    third = Fixed(["x", "e"])
    fourth = Fixed(["y", "e"])
    assert ids(HybridRetriever([third, fourth], mode="rrf")("q", 3)) == ["e", "x", "y"]


def test_depth_asks_members_for_more():
    a, b = Fixed(list("abcdef")), Fixed(list("fedcba"))
    hybrid = HybridRetriever([a, b], mode="rrf", depth=6)
    assert len(hybrid("q", 2)) == 2
    assert a.ks == [6] and b.ks == [6]
    HybridRetriever([a, b])("q", 3)
    assert a.ks[-1] == 50  # the default fusion depth, whatever k is
    HybridRetriever([a, b], depth=2)("q", 3)
    assert a.ks[-1] == 3  # never fewer than k


def test_recall_at_k_is_one_number_whatever_else_is_asked():
    """RRF over members asked only k deep ranked differently for k=5 and k=10: fuse from a fixed depth."""
    # z is 6th in both lists: fused, it beats every passage only one member found (2/66 > 1/61).
    a = Fixed([f"a{i}" for i in range(5)] + ["z"] + [f"a{i}" for i in range(5, 12)])
    b = Fixed([f"b{i}" for i in range(5)] + ["z"] + [f"b{i}" for i in range(5, 12)])
    for mode in ("rrf", "interleave"):
        hybrid = HybridRetriever([a, b], mode=mode)
        top10 = ids(hybrid("q", 10))
        if mode == "rrf":
            assert top10[0] == "z"
        for k in (1, 3, 5):
            assert ids(hybrid("q", k)) == top10[:k], (mode, k)
        assert [ids(r) for r in hybrid.batch(["q"], 5)] == [top10[:5]]


def test_a_members_k_limit_caps_its_depth():
    limited = Fixed(list("abc"))
    limited.max_k = 20
    HybridRetriever([limited, Fixed(list("xyz"))])("q", 5)
    assert limited.ks[-1] == 20


def test_members_run_concurrently():
    members = [Fixed(["a"], delay=0.3), Fixed(["b"], delay=0.3), Fixed(["c"], delay=0.3)]
    hybrid = HybridRetriever(members)
    start = time.perf_counter()
    assert ids(hybrid("q", 3)) == ["a", "b", "c"]
    assert time.perf_counter() - start < 0.75
    assert len({name for m in members for name in m.threads}) == 3


def test_batch_matches_single_calls():
    hybrid = HybridRetriever([Fixed(["a", "b"]), Fixed(["b", "c"])], mode="rrf")
    results = hybrid.batch(["q1", "q2"], 3)
    assert [ids(r) for r in results] == [ids(hybrid("q1", 3))] * 2 == [["b", "a", "c"]] * 2
    assert hybrid.batch([], 3) == []


def test_failures_propagate():
    with pytest.raises(RetrievalError, match="server down"):
        HybridRetriever([Fixed(["a"]), Broken([])])("q", 2)
    with pytest.raises(RetrievalError, match=r"member 1 .*oops"):
        HybridRetriever([Fixed(["a"]), Sloppy([])]).batch(["q"], 2)


def test_validation():
    with pytest.raises(ConfigError):
        HybridRetriever([])
    with pytest.raises(ConfigError):
        HybridRetriever([Fixed([])], mode="max")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        HybridRetriever([Fixed([])], depth=0)
    with pytest.raises(ConfigError):
        HybridRetriever([Fixed([])])("q", 0)


def test_describe_spec():
    described = HybridRetriever(
        [Fixed([], name="bm25:nq"), Fixed([], name="colbert-index:/i")], mode="rrf"
    ).describe()
    assert described["spec"] == "hybrid:rrf:bm25:nq+colbert-index:/i"
    assert [m["spec"] for m in described["members"]] == ["bm25:nq", "colbert-index:/i"]


def test_spec_builds_hybrid_of_bm25_and_server(tmp_path):
    """hybrid:MODE:SPEC+SPEC through build_retriever, with a colbert-server member served by us."""
    from ragsuite.retrieval.bm25 import BM25Retriever
    from ragsuite.retrieval.colbert.client import ColBERTv2Client
    from ragsuite.retrieval.server import RetrieverServer
    from ragsuite.retrieval.spec import build_retriever

    corpus = [
        Passage("1", "Jaws", "Jaws is a 1975 film directed by Steven Spielberg."),
        Passage("2", "Alien", "Alien is a 1979 film directed by Ridley Scott."),
        Passage("3", "Duel", "Duel is a 1971 television film by Steven Spielberg."),
    ]
    with RetrieverServer(_CorpusFixed(corpus, ["2", "3"])) as server:
        bm25 = BM25Retriever(corpus, cache_dir=tmp_path)
        with pytest.raises(ConfigError):
            build_retriever(f"hybrid:interleave:bm25+colbert-server:{server.url}")  # bm25 needs a dataset
        hybrid = build_retriever("hybrid:rrf:colbert-server:" + server.url + "+colbert-server:" + server.url)
        assert isinstance(hybrid, HybridRetriever) and hybrid.mode == "rrf"
        assert all(isinstance(m, ColBERTv2Client) for m in hybrid.retrievers)
        assert ids(hybrid("anything", 2)) == ["2", "3"]
        merged = HybridRetriever([bm25, hybrid.retrievers[0]])("Spielberg Jaws", 3)
        assert ids(merged) == ["1", "2", "3"]
        assert merged[1].title == "Alien"
        assert build_retriever(hybrid.describe()["spec"]).describe()["spec"] == hybrid.describe()["spec"]
    with pytest.raises(ConfigError):
        build_retriever("hybrid:max:bm25")


class _CorpusFixed(Fixed):
    def __init__(self, corpus: Sequence[Passage], order: Sequence[str]) -> None:
        super().__init__(order, name="fixed")
        self.by_id = {p.id: p for p in corpus}

    def __call__(self, query: str, k: int) -> list[Passage]:
        return [self.by_id[pid].with_score(1.0 / (i + 1)) for i, pid in enumerate(self.ids[:k])]


# -- weighted fusion ----------------------------------------------------------------------------------------


class Scored(Fixed):
    """Returns the given (id, score) pairs for every query (truncated to k)."""

    def __init__(self, pairs: Sequence[tuple[str, float]], *, name: str = "scored", kind: str = "scored"):
        super().__init__([pid for pid, _ in pairs], name=name)
        self.scores = dict(pairs)
        self.kind = kind

    def __call__(self, query: str, k: int) -> list[Passage]:
        self.ks.append(k)
        return [P(pid, self.scores[pid]) for pid in self.ids[:k]]

    def describe(self) -> dict:
        return {"kind": self.kind, "spec": self.name}


def test_weighted_rrf_changes_the_ranking_as_the_weights_say():
    sparse, dense = Fixed(["a", "b", "c"]), Fixed(["c", "d", "a"])
    # Equal weights: a = c = 1/61 + 1/63, a seen first.
    assert ids(HybridRetriever([sparse, dense], mode="rrf", weights=[1, 1])("q", 4)) == ["a", "c", "b", "d"]
    # Dense weighted 3: c = 1/63 + 3/61, a = 1/61 + 3/63, d = 3/62, b = 1/62.
    weighted = HybridRetriever([sparse, dense], mode="rrf", weights=[1, 3])("q", 4)
    assert ids(weighted) == ["c", "a", "d", "b"]
    assert weighted[0].score == pytest.approx(1 / 63 + 3 / 61)
    assert weighted[2].score == pytest.approx(3 / 62)
    # Only ratios matter; a zero weight leaves that member's order only as a tie-break.
    assert ids(HybridRetriever([sparse, dense], mode="rrf", weights=[2, 6])("q", 4)) == ids(weighted)
    assert ids(HybridRetriever([sparse, dense], mode="rrf", weights=[0, 1])("q", 3)) == ["c", "d", "a"]


def test_linear_fusion_hand_computed_minmax_and_zscore():
    sparse = Scored([("a", 12.0), ("b", 8.0), ("c", 2.0)])  # minmax: a 1, b 0.6, c 0
    dense = Scored([("c", 0.9), ("d", 0.7), ("a", 0.4)])  # minmax: c 1, d 0.6, a 0
    # alpha = 0.7 (dense): a = .3, b = .18, c = .7, d = .42 (b gets dense's floor 0, d sparse's floor 0).
    fused = HybridRetriever([sparse, dense], mode="linear", weights=[0.3, 0.7])("q", 4)
    assert ids(fused) == ["c", "d", "a", "b"]
    assert [p.score for p in fused] == pytest.approx([0.7, 0.42, 0.3, 0.18])
    # alpha = 0.2: a = .8, b = .48, c = .2, d = .12.
    assert ids(HybridRetriever([sparse, dense], mode="linear", weights=[0.8, 0.2])("q", 4)) == list("abcd")
    # z-scores: sparse (12, 8, 2) -> (1.1355, 0.1622, -1.2978), other (.9, .8, .2) -> (0.8627, 0.5392,
    # -1.4018); a missing passage takes its list's lowest z-score: a -0.133, c -0.218, d -0.379, b -0.620.
    other = Scored([("c", 0.9), ("d", 0.8), ("a", 0.2)])
    z = HybridRetriever([sparse, other], mode="linear", norm="zscore", weights=[1, 1])("q", 4)
    assert ids(z) == ["a", "c", "d", "b"]
    assert [p.score for p in z] == pytest.approx([-0.13315, -0.21755, -0.3793, -0.6198], abs=1e-3)


def test_default_weights_come_from_the_member_kinds(monkeypatch):
    from ragsuite.retrieval import hybrid as hybrid_module

    monkeypatch.setitem(hybrid_module.DEFAULT_WEIGHTS, "rrf", {"sparse": 0.25, "dense": 0.75})
    members = [Scored([("a", 1.0)], kind="sparse"), Scored([("b", 1.0)], kind="dense"), Scored([("c", 1.0)])]
    assert HybridRetriever(members, mode="rrf").weights == [0.25, 0.75, 1.0]
    assert HybridRetriever(members, mode="rrf", weights=[1, 2, 3]).weights == [1.0, 2.0, 3.0]
    assert HybridRetriever(members, mode="interleave").weights is None
    # Members that would all get the same weight are simply unweighted.
    assert HybridRetriever(members[1:2] * 2, mode="rrf").weights == [1.0, 1.0]


def test_weight_validation():
    members = [Fixed(["a"]), Fixed(["b"])]
    for bad in ([1.0], [1.0, -1.0], [0.0, 0.0], [float("nan"), 1.0]):
        with pytest.raises(ConfigError, match="weights"):
            HybridRetriever(members, mode="rrf", weights=bad)
    with pytest.raises(ConfigError, match="interleave takes no weights"):
        HybridRetriever(members, mode="interleave", weights=[1, 2])
    with pytest.raises(ConfigError, match="norm"):
        HybridRetriever(members, mode="linear", norm="softmax")


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("hybrid:rrf:bm25:nq@0.3+dense:nq@0.7", ("rrf", ["bm25:nq", "dense:nq"], [0.3, 0.7], {})),
        ("hybrid:linear:bm25+dense:alpha=0.7", ("linear", ["bm25", "dense"], [0.3, 0.7], {})),
        (
            "hybrid:rrf:bm25+dense:nq:index=hnsw:rrf_k=20:depth=30",
            ("rrf", ["bm25", "dense:nq:index=hnsw"], None, {"rrf_k": 20, "depth": 30}),
        ),
        (
            "hybrid:linear:bm25@1+dense@3:norm=zscore",
            ("linear", ["bm25", "dense"], [1.0, 3.0], {"norm": "zscore"}),
        ),
        (
            "hybrid:interleave:colbert-server:http://u:p@host:8893/api/search+bm25",
            ("interleave", ["colbert-server:http://u:p@host:8893/api/search", "bm25"], None, {}),
        ),
    ],
)
def test_hybrid_specs_parse(spec, parsed):
    from ragsuite.retrieval.hybrid import parse_hybrid_spec

    assert parse_hybrid_spec(spec) == parsed


@pytest.mark.parametrize(
    "spec",
    [
        "hybrid:max:bm25",
        "hybrid:rrf:bm25@0.3+dense",  # every member weighted or none
        "hybrid:linear:bm25+dense+bm25:alpha=0.5",  # alpha is for two members
        "hybrid:linear:bm25@1+dense@2:alpha=0.5",
        "hybrid:rrf:bm25+dense:rrf_k=ten",
        "hybrid:rrf:bm25++dense",
    ],
)
def test_bad_hybrid_specs_are_clear_errors(spec):
    from ragsuite.retrieval.hybrid import parse_hybrid_spec

    with pytest.raises(ConfigError):
        parse_hybrid_spec(spec)


def test_describe_spec_carries_weights_and_settings():
    members = [Fixed([], name="bm25:nq"), Fixed([], name="dense:nq")]
    hybrid = HybridRetriever(members, mode="rrf", weights=[0.3, 0.7], rrf_k=20, depth=30)
    described = hybrid.describe()
    assert described["spec"] == "hybrid:rrf:bm25:nq@0.3+dense:nq@0.7:rrf_k=20:depth=30"
    assert described["weights"] == [0.3, 0.7]
    linear = HybridRetriever(members, mode="linear", weights=[1, 1], norm="zscore").describe()["spec"]
    assert linear == "hybrid:linear:bm25:nq+dense:nq:norm=zscore"
    # Weights are written exactly, so a rebuilt hybrid fuses the same.
    from ragsuite.retrieval.hybrid import parse_hybrid_spec

    odd = HybridRetriever(members, mode="linear", weights=[0.123456789123, 1 / 3]).describe()["spec"]
    assert parse_hybrid_spec(odd)[2] == [0.123456789123, 1 / 3]


def test_weighted_specs_round_trip_through_program_files(tmp_path, monkeypatch, data_dir):
    """A weighted hybrid saved in a program file is rebuilt with the same weights and settings, and ranks
    alike; one saved before hybrids had weights keeps weighing its members 1."""
    import ragsuite
    from ragsuite import programs
    from ragsuite.retrieval.spec import build_retriever

    monkeypatch.setenv("RAGSUITE_CACHE", str(tmp_path / "cache"))
    specs = [
        "hybrid:rrf:bm25:nq@0.25+bm25:hotpotqa@0.75:rrf_k=10:depth=20",
        "hybrid:linear:bm25:nq+bm25:hotpotqa:alpha=0.65:norm=zscore",
    ]
    for i, spec in enumerate(specs):
        retriever = build_retriever(spec, data_dir=data_dir)
        path = tmp_path / f"p{i}.json"
        programs.get("vanilla")(retriever=retriever, top_k=2).save(str(path))
        loaded = ragsuite.load(str(path), data_dir=data_dir).retriever
        assert loaded.describe() == retriever.describe()
        assert loaded.weights == retriever.weights and loaded.mode == retriever.mode
        query = "Who was the first president of the United States?"
        assert [(p.id, p.score) for p in loaded(query, 5)] == [(p.id, p.score) for p in retriever(query, 5)]
    assert build_retriever(specs[1], data_dir=data_dir).weights == [0.35, 0.65]

    # Saved before weights existed: no "weights" in the description, all members weighed 1.
    from ragsuite.retrieval import hybrid as hybrid_module
    from ragsuite.retrieval.spec import rebuild_retriever

    old = build_retriever("hybrid:rrf:bm25:nq+bm25:hotpotqa", data_dir=data_dir).describe()
    del old["weights"], old["norm"]
    monkeypatch.setattr(hybrid_module, "default_weights", lambda mode, members: [0.2, 0.8])
    assert build_retriever("hybrid:rrf:bm25:nq+bm25:hotpotqa", data_dir=data_dir).weights == [0.2, 0.8]
    assert rebuild_retriever(old, data_dir=data_dir).weights == [1.0, 1.0]
    # Its rrf_k and depth were kept in the description only: they are rebuilt from there.
    old = {**old, "rrf_k": 33, "depth": 40}
    rebuilt = rebuild_retriever(old, data_dir=data_dir)
    assert (rebuilt.rrf_k, rebuilt.depth, rebuilt.weights) == (33, 40, [1.0, 1.0])


def test_a_program_file_fuses_as_it_ran_after_the_defaults_are_refitted(tmp_path, monkeypatch, data_dir):
    """The spec leaves out the defaults of its day: a hybrid saved with equal weights, zscore and depth 50
    (the defaults then) reloads with them after the library ships other fitted defaults, and ranks alike."""
    import ragsuite
    from ragsuite import programs
    from ragsuite.retrieval import hybrid as hybrid_module
    from ragsuite.retrieval.spec import build_retriever

    monkeypatch.setenv("RAGSUITE_CACHE", str(tmp_path / "cache"))
    spec = "hybrid:linear:bm25:nq+bm25:hotpotqa"
    with monkeypatch.context() as then:
        then.setitem(hybrid_module.DEFAULT_SETTINGS, "linear", {"norm": "zscore", "depth": 50})
        saved = build_retriever(spec, data_dir=data_dir)
        assert (saved.weights, saved.norm, saved.depth) == ([1.0, 1.0], "zscore", 50)
        path = tmp_path / "then.json"
        programs.get("vanilla")(retriever=saved, top_k=3).save(str(path))
    monkeypatch.setattr(hybrid_module, "default_weights", lambda mode, members: [0.2, 0.8])
    now = build_retriever(spec, data_dir=data_dir)
    assert (now.weights, now.norm, now.depth) == ([0.2, 0.8], "minmax", 20)  # today's defaults differ
    loaded = ragsuite.load(str(path), data_dir=data_dir).retriever
    assert (loaded.weights, loaded.norm, loaded.depth) == ([1.0, 1.0], "zscore", 50)
    query = "Who was the first president of the United States?"
    assert [(p.id, p.score) for p in loaded(query, 5)] == [(p.id, p.score) for p in saved(query, 5)]


@pytest.mark.parametrize(
    "corrupt",
    [
        {"weights": ["x", 1]},
        {"weights": [1.0]},
        {"depth": "20:rrf_k=1+bm25:hotpotqa"},
        {"norm": "minmax+dense:http://127.0.0.1:9/v1"},
        {"rrf_k": True},
    ],
)
def test_corrupt_saved_fusion_settings_are_a_clear_error_never_part_of_the_spec(corrupt, data_dir):
    """A saved hybrid's weights and settings are written back into its spec only when well formed: a
    malformed value is a ConfigError naming it, never text spliced into the spec (a member, a URL)."""
    from ragsuite.retrieval.spec import build_retriever, rebuild_retriever

    saved = build_retriever("hybrid:linear:bm25:nq+bm25:hotpotqa", data_dir=data_dir).describe()
    with pytest.raises(ConfigError, match="cannot be rebuilt"):
        rebuild_retriever({**saved, **corrupt}, data_dir=data_dir)


def test_fuse_from_deeper_lists_matches_a_call():
    a = Scored([(f"a{i}", 10.0 - i) for i in range(8)] + [("z", 1.0)])
    b = Scored([(f"b{i}", 5.0 - 0.1 * i) for i in range(8)] + [("z", 4.0)])
    for mode, settings in (("rrf", {"weights": [1, 2], "rrf_k": 5}), ("linear", {"weights": [0.4, 0.6]})):
        hybrid = HybridRetriever([a, b], mode=mode, depth=4, **settings)
        deep = [m(query="q", k=9) for m in (a, b)]
        assert ids(hybrid.fuse(deep, 3)) == ids(hybrid("q", 3))
        assert ids(hybrid.with_fusion(depth=9).fuse(deep, 3)) == ids(hybrid.with_fusion(depth=9)("q", 3))


def test_fusion_search_suggests_and_restores_settings():
    import optuna

    from ragsuite.retrieval.hybrid import FusionSearch

    members = [Fixed(["a"], name="bm25:nq"), Fixed(["b"], name="dense:nq")]
    with pytest.raises(ConfigError, match="hybrid retriever"):
        FusionSearch(members[0])
    rrf_search = FusionSearch(HybridRetriever(members, mode="rrf", weights=[0.3, 0.7]))
    assert rrf_search.defaults() == {"fusion_depth": 50, "fusion_alpha": 0.7, "fusion_rrf_k": 60}
    chosen = rrf_search.suggest(
        optuna.trial.FixedTrial({"fusion_depth": 20, "fusion_alpha": 0.25, "fusion_rrf_k": 5})
    )
    assert (chosen.weights, chosen.rrf_k, chosen.depth, chosen.mode) == ([0.75, 0.25], 5, 20, "rrf")
    assert chosen.retrievers == members  # members are shared, not rebuilt
    linear = FusionSearch(HybridRetriever(members, mode="linear", weights=[1, 1]))
    assert linear.defaults() == {"fusion_depth": 50, "fusion_alpha": 0.5, "fusion_norm": "minmax"}
    three = FusionSearch(HybridRetriever([*members, Fixed(["c"])], mode="rrf", weights=[1, 2, 4]))
    assert three.defaults()["fusion_weight_0"] == 0.25
    # An Optuna study over the search space samples every knob in range.
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=1))
    study.enqueue_trial(rrf_search.defaults())
    study.optimize(lambda t: rrf_search.suggest(t).weights[1], n_trials=6)
    assert study.trials[0].params == rrf_search.defaults()
    assert all(
        0 <= t.params["fusion_alpha"] <= 1 and 0 <= t.params["fusion_rrf_k"] <= 100 for t in study.trials
    )


def test_sweep_fits_weights_on_gold_passages():
    """Members disagree; the gold passage is the second member's first: the sweep finds weights that put it
    on top, starting from the settings given."""
    from ragsuite.retrieval.hybrid import FusionSearch
    from ragsuite.retrieval.sweep import fused_metrics, sweep_fusion

    lists, golds = [], []
    for q in range(6):
        lists.append(
            [
                [P(f"x{q}-{i}", 10.0 - i) for i in range(4)],
                [P(f"g{q}", 0.9)] + [P(f"y{q}-{i}", 0.8 - 0.1 * i) for i in range(3)],
            ]
        )
        golds.append([f"g{q}"])
    hybrid = HybridRetriever([Fixed([]), Fixed([])], mode="rrf", weights=[0.9, 0.1])
    assert fused_metrics(hybrid, lists, golds, [1])["recall@1"] == 0.0
    result = sweep_fusion(FusionSearch(hybrid), lists, golds, metric="recall@1", ks=(1, 3), trials=25, seed=0)
    assert result.trials[0]["params"]["fusion_alpha"] == pytest.approx(0.1)
    assert result.metrics["recall@1"] == 1.0 and result.params["fusion_alpha"] > 0.5
    assert result.retriever.weights[1] > result.retriever.weights[0]
    assert set(result.metrics) == {"recall@1", "all_gold@1", "recall@3", "all_gold@3"}


def test_a_tune_study_searches_the_fusion_weights(tmp_path):
    """With tune_retriever, every trial's params hold the fusion knobs, the program of each trial retrieves
    through a hybrid with exactly those settings, the first trial is the hybrid as given, and the written
    program keeps the chosen trial's fusion."""
    import json

    from ragsuite.optimizers import tune
    from ragsuite.testing import toys

    seen: list[dict] = []

    def spy_evaluate(program, examples, **kwargs):
        seen.append(program.retriever.describe())
        return toys.toy_evaluate(program, examples, **kwargs)

    hybrid = HybridRetriever([toys.ToyRetriever(), toys.ToyRetriever()], mode="rrf", weights=[0.6, 0.4])
    with toys.registered():
        result = tune(
            toys.ToyProgram,
            dataset="hotpotqa",
            valset=toys.examples(2),
            retriever=hybrid,
            lm=toys.scripted_lm(),
            trials=5,
            out_dir=tmp_path,
            threads=1,
            seed=0,
            evaluate_fn=spy_evaluate,
            quality_metric="accuracy",
            tune_retriever=True,
        )
    trials = result.study.trials
    assert len(trials) == len(seen) == 5
    assert trials[0].params == {
        **toys.ToyProgram.default_knobs(),
        "fusion_alpha": 0.4,
        "fusion_rrf_k": 60,
        "fusion_depth": 50,
    }
    for trial, described in zip(trials, seen, strict=True):
        alpha = trial.params["fusion_alpha"]
        assert described["weights"] == pytest.approx([1 - alpha, alpha])
        assert (described["rrf_k"], described["depth"]) == (
            trial.params["fusion_rrf_k"],
            trial.params["fusion_depth"],
        )
    assert len({t.params["fusion_alpha"] for t in trials}) > 1  # the weights are searched, not fixed
    chosen = result.trial.params
    saved = json.loads(result.files["program"].read_text(encoding="utf-8"))["retriever"]
    assert saved["weights"] == pytest.approx([1 - chosen["fusion_alpha"], chosen["fusion_alpha"]])
    assert result.program.retriever.describe() == saved
    # Without the flag the retriever is shared untouched, and a non-hybrid cannot be searched.
    with toys.registered(), pytest.raises(ConfigError, match="hybrid retriever"):
        tune(
            toys.ToyProgram,
            dataset="hotpotqa",
            valset=toys.examples(2),
            retriever=toys.ToyRetriever(),
            lm=toys.scripted_lm(),
            trials=1,
            evaluate_fn=toys.toy_evaluate,
            quality_metric="accuracy",
            tune_retriever=True,
        )


def test_a_modes_default_settings_apply_and_specs_name_only_departures(monkeypatch):
    from ragsuite.retrieval import hybrid as hybrid_module
    from ragsuite.retrieval.hybrid import parse_hybrid_spec

    monkeypatch.setitem(hybrid_module.DEFAULT_SETTINGS, "linear", {"norm": "zscore", "depth": 30})
    monkeypatch.setitem(hybrid_module.DEFAULT_SETTINGS, "rrf", {"rrf_k": 5, "depth": 20})
    monkeypatch.setitem(hybrid_module.DEFAULT_WEIGHTS, "linear", {"sparse": 0.5, "dense": 0.5})
    members = [
        Scored([("a", 1.0)], name="bm25:nq", kind="sparse"),
        Scored([("b", 1.0)], name="dense:nq", kind="dense"),
    ]
    linear = HybridRetriever(members, mode="linear", weights=[1, 1])
    assert (linear.norm, linear.depth) == ("zscore", 30)
    assert linear.describe()["spec"] == "hybrid:linear:bm25:nq+dense:nq"
    other = HybridRetriever(members, mode="linear", weights=[1, 1], norm="minmax", depth=50)
    assert other.describe()["spec"] == "hybrid:linear:bm25:nq+dense:nq:norm=minmax:depth=50"
    assert parse_hybrid_spec(other.describe()["spec"])[3] == {"norm": "minmax", "depth": 50}
    # Settings fitted for some member kinds do not apply to others: general defaults there.
    unfitted = HybridRetriever([members[0], Fixed(["c"])], mode="linear", weights=[1, 1])
    assert (unfitted.norm, unfitted.depth) == ("minmax", 50)
    assert HybridRetriever(members, mode="rrf", weights=[1, 1]).depth == 50  # no rrf weights fitted here


def test_the_docs_fusion_tables_are_those_of_the_committed_run_and_its_defaults_are_shipped(
    load_benchmark, repo_root
):
    """docs/retrieval.md shows the tables ``benchmarks/retrieval.py --render`` draws from the committed
    records, and the library's default weights and settings are the ones that run fitted."""
    import json

    from ragsuite.retrieval.hybrid import DEFAULT_WEIGHTS, mode_defaults

    bench = load_benchmark("retrieval")
    run = json.loads((repo_root / "benchmarks" / "results" / "fusion.json").read_text(encoding="utf-8"))
    page = (repo_root / "docs" / "retrieval.md").read_text(encoding="utf-8")
    assert f"{bench.DOCS_START}\n{bench.fusion_markdown(run)}\n{bench.DOCS_END}" in page
    for mode in ("rrf", "linear"):
        fitted = run["defaults"][mode]
        alpha = fitted["alpha"]
        assert DEFAULT_WEIGHTS[mode] == pytest.approx({"bm25": 1 - alpha, "dense": alpha})
        shipped = mode_defaults(mode, ["bm25", "dense"])
        assert {k: shipped[k] for k in fitted["settings"]} == fitted["settings"]
        assert run["library_defaults"]["weights"][mode] == pytest.approx(DEFAULT_WEIGHTS[mode])
