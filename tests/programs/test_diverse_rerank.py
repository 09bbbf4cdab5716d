"""Knowledge-aware diverse reranking: the interleave merge, the pool, declaration and summary, both rerank
modes, the final top n, and robustness."""

from __future__ import annotations

import dspy
import pytest

from ragsuite import programs
from ragsuite.errors import ConfigError, RetrievalError
from ragsuite.programs.diverse_rerank import DiverseRerank
from ragsuite.programs.stages import join_query
from ragsuite.retrieval.base import Passage
from ragsuite.retrieval.merge import interleave, rrf
from ragsuite.testing.retrievers import ListRetriever
from ragsuite.testing.scripted import ScriptedLM

QUESTION = "Who had more world titles, Muhammad Ali or Ramon Dekkers?"
CORPUS = [Passage(pid, pid.upper(), f"text {pid}") for pid in ("a", "b", "c", "d", "e", "f", "g", "x")]
ALI = "Muhammad Ali's world heavyweight titles"
DEKKERS = "Ramon Dekkers' Muay Thai world titles"


def ids(passages) -> list[str]:
    return [p.id for p in passages]


def P(pid: str) -> Passage:
    return next(p for p in CORPUS if p.id == pid)


# ----------------------------------------------------------------------------- merge
def test_interleave_alternates_preserving_order_without_duplicates() -> None:
    sparse = [P("a"), P("b"), P("c"), P("d")]
    dense = [P("b"), P("e"), P("a")]
    assert ids(interleave([sparse, dense])) == ["a", "b", "e", "c", "d"]
    assert ids(interleave([dense, sparse])) == ["b", "a", "e", "c", "d"]
    assert ids(interleave([sparse, dense], limit=3)) == ["a", "b", "e"]
    assert ids(interleave([sparse])) == ["a", "b", "c", "d"]
    assert interleave([]) == [] and interleave([[], []]) == []
    assert ids(interleave([[P("a"), P("a"), P("b")]])) == ["a", "b"]


def test_rrf_sums_reciprocal_ranks() -> None:
    fused = rrf([[P("a"), P("b")], [P("b"), P("c")]], k=60)
    assert ids(fused) == ["b", "a", "c"]
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61)
    assert ids(rrf([[P("a"), P("b")], [P("b"), P("c")]], limit=1)) == ["b"]


# ----------------------------------------------------------------------------- program
RERANK_A = join_query(QUESTION, ALI)
RERANK_B = join_query(QUESTION, DEKKERS)
TABLE = {
    QUESTION: ["a", "b", "c", "d"],
    RERANK_A: ["x", "d", "b"],  # x is outside the pool and must not appear
    RERANK_B: ["c", "a", "g"],
}


def responder(request):
    fields = request.output_fields
    if "required_knowledge" in fields:
        doc = request.inputs["passage"].split(" |")[0]
        return {"required_knowledge": [ALI, DEKKERS], "present_knowledge": [f"{doc} facts"]}
    if "first_knowledge" in fields:
        return {"first_knowledge": ALI, "second_knowledge": DEKKERS}
    if "score" in fields:
        doc = request.inputs["passage"].split(" |")[0].lower()
        ali = {"a": 9, "b": 2, "c": 5, "e": 7}
        dekkers = {"b": 8, "c": 3, "d": 6, "e": 1}
        table = ali if "Ali" in request.inputs["focus"] else dekkers
        return {"score": table.get(doc, 0)}
    return {"answer": "Ramon Dekkers"}


def run(program, reply=responder):
    lm = ScriptedLM(reply)
    with dspy.context(lm=lm):
        return program(question=QUESTION), lm


def test_registered_with_defaults_and_stage_names() -> None:
    assert programs.get("diverse-rerank") is DiverseRerank
    assert DiverseRerank.default_knobs() == {
        "pool_k": 50,
        "declare_top": 5,
        "n": 10,
        "rerank_by": "auto",
        "score_threshold": 0.0,
    }
    program = DiverseRerank(retriever=ListRetriever(CORPUS), rerank_by="lm")
    names = {name.split(".")[0] for name, _ in program.named_predictors()}
    assert names == {"knowledge_declare", "knowledge_summarize", "rerank", "answer"}


TEXTS = {
    "a": ("Ali", "Muhammad Ali's boxing career began in Louisville."),
    "b": ("Dekkers", "Ramon Dekkers fought Muay Thai in Breda."),
    "c": ("Weather", "Rain fell on Breda all week."),
    "d": ("Ali titles", "Muhammad Ali won the world heavyweight titles three times."),
    "e": ("Dekkers titles", "Ramon Dekkers won eight Muay Thai world titles."),
    "f": ("Other", "An unrelated passage about gardens."),
}
TEXT_CORPUS = [Passage(pid, title, text) for pid, (title, text) in TEXTS.items()]


def pool_bm25_order(query: str, pool: list[str]) -> list[str]:
    from ragsuite.retrieval.rerankers import PoolBM25

    passages = [next(p for p in TEXT_CORPUS if p.id == pid) for pid in pool]
    scores = PoolBM25().score(query, passages)
    return [pool[i] for i in sorted(range(len(pool)), key=lambda i: (-scores[i], i))]


def test_retriever_mode_reranks_the_whole_pool_first_and_for_each_knowledge_query() -> None:
    # The paper's order in every mode: rerank the merged pool for the question (§2.2.1), declare from the
    # top of that ranking (§2.2.2), score every candidate with question + knowledge (§2.2.4). Without a
    # reranking model, BM25 over the pool scores them: passages only the second retriever found included.
    sparse = ListRetriever(TEXT_CORPUS, {QUESTION: ["a", "c", "d"]})
    dense = ListRetriever(TEXT_CORPUS, {QUESTION: ["e", "f", "b"]})
    program = DiverseRerank(retriever=sparse, second_retriever=dense, pool_k=3, declare_top=2, n=4)
    assert program.rerank_by == "retriever"
    prediction, lm = run(program)
    assert sparse.queries == [QUESTION] and dense.queries == [QUESTION]  # no re-querying
    pool = next(e for e in prediction.trace if e["stage"] == "pool")["passage_ids"]
    assert pool == ["a", "e", "c", "f", "d", "b"]
    reranks = [e for e in prediction.trace if e["stage"] == "rerank"]
    assert [e["focus"] for e in reranks] == ["", ALI, DEKKERS]
    assert all(sorted(e["passage_ids"]) == sorted(pool) for e in reranks)  # the whole pool, every time
    initial = reranks[0]["passage_ids"]
    assert initial == pool_bm25_order(QUESTION, pool)
    assert set(initial[:2]) == {"d", "e"}  # the two passages with world titles, one from each retriever
    declared = [r.inputs["passage"] for r in lm.requests if "required_knowledge" in r.output_fields]
    assert sorted(declared) == sorted(P2(pid).render() for pid in initial[:2])
    ali, dekkers = reranks[1]["passage_ids"], reranks[2]["passage_ids"]
    assert ali == pool_bm25_order(RERANK_A, initial) and ali[0] == "d"
    assert dekkers == pool_bm25_order(RERANK_B, initial) and dekkers[0] == "e"
    assert ids(prediction.passages) == interleave_ids([ali, dekkers], 4)
    stats = prediction.stats
    assert stats["lm_calls"] == 2 + 1 + 1 and stats["retrievals"] == 2 and stats["steps"] == 1


def P2(pid: str) -> Passage:
    return next(p for p in TEXT_CORPUS if p.id == pid)


def interleave_ids(rankings: list[list[str]], limit: int) -> list[str]:
    return ids(interleave([[P2(pid) for pid in ranking] for ranking in rankings], limit=limit))


def test_retriever_mode_uses_the_retrievers_own_scores_when_it_has_them() -> None:
    class Scoring(ListRetriever):
        """A retriever that also scores given passages (as a ColBERT index does)."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.scored: list[tuple[str, list[str]]] = []

        def score(self, query, passages):
            self.scored.append((query, ids(passages)))
            return [{"c": 5.0, "b": 3.0}.get(p.id, 0.0) for p in passages]

    retriever = Scoring(TEXT_CORPUS, {QUESTION: ["a", "b", "c"]})
    prediction, _ = run(DiverseRerank(retriever=retriever, pool_k=3, n=2, declare_top=1))
    assert [query for query, _ in retriever.scored] == [QUESTION, RERANK_A, RERANK_B]
    assert all(sorted(scored) == ["a", "b", "c"] for _, scored in retriever.scored)
    assert ids(prediction.passages) == ["c", "b"] and retriever.queries == [QUESTION]


def test_lm_rerank_scores_every_pool_passage_per_knowledge_query() -> None:
    retriever = ListRetriever(CORPUS, {QUESTION: ["a", "b", "c", "d", "e"]})
    program = DiverseRerank(retriever=retriever, pool_k=5, declare_top=1, n=3, rerank_by="lm")
    prediction, lm = run(program)
    scores = [r for r in lm.requests if "score" in r.output_fields]
    # The initial reranking (question alone) and one per knowledge description, each over the whole pool.
    assert len(scores) == 3 * 5 and prediction.stats["lm_calls"] == 1 + 1 + 15 + 1
    assert prediction.stats["retrievals"] == 1
    # Initial (no focus, scored by the DEKKERS table): b8 d6 c3 e1 a0 -> KnowledgeDeclare reads b.
    declared = [r.inputs["passage"] for r in lm.requests if "required_knowledge" in r.output_fields]
    assert declared == [P("b").render()]
    # ALI: a9 e7 c5 b2 d0; DEKKERS: b8 d6 c3 e1 a0 -> a, b, e
    assert ids(prediction.passages) == ["a", "b", "e"]


@pytest.mark.parametrize(
    ("threshold", "initial", "passages", "score_calls"),
    [
        # 0 keeps every candidate: the ranking of the test above, 3 x 5 score calls.
        (0.0, ["b", "d", "c", "e", "a"], ["a", "b", "e"], 15),
        # Initial b8 d6 | c3 e1 a0 dropped; the descriptions score b, d only. ALI: b2 d0 -> b (the best,
        # kept below the threshold); DEKKERS: b8 d6 -> b, d.
        (5.0, ["b", "d"], ["b", "d"], 5 + 2 + 2),
        # Nothing reaches 9: each ranking keeps its best candidate alone.
        (9.0, ["b"], ["b"], 5 + 1 + 1),
    ],
)
def test_lm_rerank_score_threshold_drops_low_scored_candidates(threshold, initial, passages, score_calls):
    retriever = ListRetriever(CORPUS, {QUESTION: ["a", "b", "c", "d", "e"]})
    program = DiverseRerank(
        retriever=retriever, pool_k=5, declare_top=1, n=3, rerank_by="lm", score_threshold=threshold
    )
    prediction, lm = run(program)
    assert len([r for r in lm.requests if "score" in r.output_fields]) == score_calls
    first = next(e for e in prediction.trace if e["stage"] == "rerank")
    assert first["passage_ids"] == initial
    assert first.get("dropped", []) == [p for p in ["a", "b", "c", "d", "e"] if p not in initial]
    assert ids(prediction.passages) == passages


def test_declare_top_zero_summarizes_without_reading_documents() -> None:
    prediction, lm = run(DiverseRerank(retriever=ListRetriever(CORPUS, TABLE), declare_top=0))
    assert not any("required_knowledge" in r.output_fields for r in lm.requests)
    summarize = next(r for r in lm.requests if "first_knowledge" in r.output_fields)
    assert summarize.inputs["declarations"] in ("[]", "N/A")
    assert prediction.stats["lm_calls"] == 2


def test_unparsable_summary_falls_back_to_the_question_and_is_recorded() -> None:
    def reply(request):
        if "first_knowledge" in request.output_fields:
            return "no summary"
        return responder(request)

    retriever = ListRetriever(TEXT_CORPUS, {QUESTION: ["a", "b", "c", "d", "e"]})
    prediction, _ = run(DiverseRerank(retriever=retriever, n=2), reply=reply)
    assert [f["stage"] for f in prediction.trace if "fallback" in f] == ["knowledge_summarize"]
    reranks = [e for e in prediction.trace if e["stage"] == "rerank"]
    # Both knowledge rankings fall back to the question alone: the initial ranking, twice.
    assert [e["focus"] for e in reranks] == ["", "", ""]
    assert reranks[1]["passage_ids"] == reranks[2]["passage_ids"] == reranks[0]["passage_ids"]
    assert ids(prediction.passages) == reranks[0]["passage_ids"][:2]


def test_empty_pool_still_answers() -> None:
    prediction, lm = run(DiverseRerank(retriever=ListRetriever(CORPUS)))
    assert prediction.stats["lm_calls"] == 1 and prediction.stats["empty_retrievals"] == 1
    assert prediction.passages == [] and prediction.answer == "Ramon Dekkers"
    assert [r.output_fields for r in lm.requests] == [["answer"]]


def test_second_retriever_failure_names_the_question() -> None:
    broken = ListRetriever(CORPUS, error=ConnectionError("dense index unreachable"))
    program = DiverseRerank(retriever=ListRetriever(CORPUS, TABLE), second_retriever=broken)
    with pytest.raises(RetrievalError, match=r"Ramon Dekkers.*dense index unreachable"):
        run(program)


@pytest.mark.parametrize(
    "knobs",
    [
        {"pool_k": 0},
        {"declare_top": -1},
        {"n": 0},
        {"rerank_by": "cross-encoder"},
        {"score_threshold": 11},
        {"score_threshold": -0.5},
    ],
)
def test_bad_knobs_are_refused(knobs) -> None:
    with pytest.raises(ConfigError):
        DiverseRerank(retriever=ListRetriever(CORPUS), **knobs)


def test_search_space_samples_valid_knobs() -> None:
    import optuna

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2))
    for _ in range(5):
        knobs = DiverseRerank.search_space(study.ask())
        assert set(knobs) <= set(DiverseRerank.KNOBS)
        DiverseRerank(retriever=ListRetriever(CORPUS), **knobs)


class PlantedReranker:
    """A reranking model with planted scores: ``scores[query][passage id]`` (0 when absent)."""

    def __init__(self, scores: dict[str, dict[str, float]]) -> None:
        self.scores = scores
        self.calls: list[tuple[str, list[str]]] = []

    def score(self, query: str, passages) -> list[float]:
        self.calls.append((query, ids(passages)))
        return [self.scores.get(query, {}).get(p.id, 0.0) for p in passages]


def test_model_reranker_follows_the_papers_order_over_the_whole_pool() -> None:
    # §2.2.1: rerank the merged pool for the question; §2.2.2: declare from the top of THAT ranking;
    # §2.2.4: score every candidate with question + knowledge. A passage only the second retriever found
    # ("f") can come first.
    sparse = ListRetriever(CORPUS, {QUESTION: ["a", "b", "c"]})
    dense = ListRetriever(CORPUS, {QUESTION: ["e", "f"]})
    reranker = PlantedReranker(
        {
            QUESTION: {"c": 3, "f": 2, "a": 1},
            RERANK_A: {"f": 9, "b": 5},
            RERANK_B: {"e": 7, "a": 4},
        }
    )
    program = DiverseRerank(retriever=sparse, second_retriever=dense, reranker=reranker, declare_top=2, n=4)
    assert program.rerank_by == "model"
    prediction, lm = run(program)
    pool = ["a", "e", "b", "f", "c"]
    assert reranker.calls[0] == (QUESTION, pool)
    declared = [r.inputs["passage"] for r in lm.requests if "required_knowledge" in r.output_fields]
    assert sorted(declared) == sorted([P("c").render(), P("f").render()])  # top 2 of the initial rerank
    initial = ["c", "f", "a", "e", "b"]
    assert sorted(reranker.calls[1:]) == sorted([(RERANK_A, initial), (RERANK_B, initial)])
    assert sparse.queries == [QUESTION] and dense.queries == [QUESTION]  # no re-querying
    # ALI: f, b, c, a, e; DEKKERS: e, a, c, f, b -> f, e, b, a
    assert ids(prediction.passages) == ["f", "e", "b", "a"]


def test_model_rerank_needs_a_reranker_and_checks_its_scores() -> None:
    with pytest.raises(ConfigError, match="reranker="):
        DiverseRerank(retriever=ListRetriever(CORPUS), rerank_by="model")

    class Short:
        def score(self, query, passages):
            return [1.0]

    program = DiverseRerank(retriever=ListRetriever(CORPUS, TABLE), reranker=Short())
    with pytest.raises(RetrievalError, match="1 scores for 4 passages"):
        run(program)


# ----------------------------------------------------------------------------- the command line
def tiny_cross_encoder(path) -> None:
    """A 1-layer random BERT cross-encoder with a word-level tokenizer, built here (no weights downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *"who had more world titles ali dekkers".split()]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]"
    )
    config = BertConfig(
        vocab_size=len(words),
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=512,
        num_labels=1,
    )
    BertForSequenceClassification(config).save_pretrained(path)
    fast.save_pretrained(path)


def cli_responder(request):
    fields = request.output_fields
    if "required_knowledge" in fields:
        return {"required_knowledge": [ALI, DEKKERS], "present_knowledge": []}
    if "first_knowledge" in fields:
        return {"first_knowledge": ALI, "second_knowledge": DEKKERS}
    if "score" in fields:
        return {"score": 5}
    return {"answer": "yes"}


def test_the_reranker_is_reachable_from_the_command_line(tmp_path, capsys) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import json

    from ragsuite.cli import main
    from ragsuite.testing.openai_server import LocalOpenAIServer

    model = tmp_path / "cross-encoder"
    tiny_cross_encoder(model)
    by = {}
    with LocalOpenAIServer(cli_responder) as server:
        lm = ["--lm", "openai/scripted", "--api-base", server.api_base, "--no-cache", "--no-progress"]
        common = ["eval", "--program", "diverse-rerank", "--dataset", "hotpotqa", "--limit", "1"]
        common += ["--set", "pool_k=4", "--set", "declare_top=1"]
        for spec in (f"cross-encoder:{model}", "lm", None):
            out = tmp_path / f"run-{len(by)}"
            extra = ["--reranker", spec] if spec else []
            assert main([*common, *extra, "--out", str(out), *lm]) == 0
            (record,) = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
            reranks = [e for e in record["trace"] if e["stage"] == "rerank"]
            assert len(reranks) == 3 and len({len(e["passage_ids"]) for e in reranks}) == 1
            by[spec] = {e["by"] for e in reranks}
        assert by == {f"cross-encoder:{model}": {"model"}, "lm": {"lm"}, None: {"retriever"}}
        bad = ["--out", str(tmp_path / "bad"), *lm]
        assert main([*common, "--reranker", "jina", *bad]) == 2
        assert "unknown reranker 'jina'" in capsys.readouterr().err
        assert main([*common, "--reranker", f"cross-encoder:{tmp_path}", *bad]) == 2
        assert "has no config.json" in capsys.readouterr().err
        vanilla = ["eval", "--program", "vanilla", "--dataset", "hotpotqa", "--reranker", "lm", *bad]
        assert main(vanilla) == 2
        assert "takes no --reranker" in capsys.readouterr().err


def test_a_cross_encoder_scores_every_passage() -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import tempfile

    from ragsuite.retrieval.rerankers import CrossEncoderReranker

    with tempfile.TemporaryDirectory() as folder:
        tiny_cross_encoder(folder)
        scores = CrossEncoderReranker(folder, batch_size=2).score(QUESTION, TEXT_CORPUS[:5])
    assert len(scores) == 5 and all(isinstance(s, float) for s in scores) and len(set(scores)) > 1


@pytest.mark.slow
def test_a_colbert_checkpoint_reranks_from_the_command_line_spec(tmp_path) -> None:
    pytest.importorskip("colbert")
    from ragsuite.retrieval.colbert.checkpoint import build_tiny_checkpoint
    from ragsuite.retrieval.rerankers import ColBERTReranker, reranker_from_spec

    checkpoint = build_tiny_checkpoint(TEXT_CORPUS * 20, tmp_path / "ckpt", vocab_size=300)
    reranker = reranker_from_spec(f"colbert:{checkpoint}")
    assert isinstance(reranker, ColBERTReranker)
    exact = P2("e").render()  # a random checkpoint finds an exact-text query's passage
    scores = reranker.score(exact, TEXT_CORPUS)
    assert len(scores) == len(TEXT_CORPUS) and max(range(len(scores)), key=scores.__getitem__) == 4
