"""Asynchronous runs: ``await program.acall(...)`` takes the same steps as ``program(...)`` for every
registered program, concurrent sub-steps overlap on one event loop, and ``eval --engine async`` writes the
records the thread engine writes and resumes after a kill."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import dspy
import pytest

from ragsuite import programs
from ragsuite.aio import concurrently, in_thread, invoke, run_sync, synchronous
from ragsuite.data.datasets import get_dataset_info, load_corpus, load_dataset
from ragsuite.lm import build_lm
from ragsuite.programs.hanrag import HANRAG
from ragsuite.programs.stages import BlendStage, FilterStage
from ragsuite.retrieval.base import Passage
from ragsuite.signatures.blendfilter import BlendQueryExternal, BlendQueryInternal
from ragsuite.testing.openai_server import LocalOpenAIServer
from ragsuite.testing.responders import grounded_responder
from ragsuite.testing.retrievers import KeywordRetriever, ListRetriever
from ragsuite.testing.scripted import ScriptedLM, parse_chat_messages


def _stage(instructions: str) -> str:
    return " ".join(instructions.split())[:100]


class ProbeLM(ScriptedLM):
    """A scripted LM whose asynchronous calls take ``delay`` seconds on the event loop (``asyncio.sleep``),
    recording how many were in flight at once and, at each call's start, the stages (signature
    instructions) of the calls in flight with it."""

    def __init__(self, responder: Any, *, delay: float = 0.05) -> None:
        super().__init__(responder)
        self.delay = delay
        self.live: list[str] = []
        self.max_in_flight = 0
        self.together: list[list[str]] = []
        self.loop_threads: set[int] = set()

    async def acall(self, prompt: Any = None, *, messages: Any = None, **kwargs: Any) -> Any:
        stage = _stage(parse_chat_messages(messages or []).instructions)
        # Only the event loop's thread runs this part: no lock needed.
        self.loop_threads.add(threading.get_ident())
        self.live.append(stage)
        self.together.append(list(self.live))
        self.max_in_flight = max(self.max_in_flight, len(self.live))
        try:
            await asyncio.sleep(self.delay)
            return await super().acall(prompt, messages=messages, **kwargs)
        finally:
            self.live.remove(stage)


def _trace_key(trace: list[dict[str, Any]]) -> list[str]:
    """The trace as a multiset: concurrent sub-steps may record in either order in both runs."""
    return sorted(json.dumps(event, sort_keys=True, default=str) for event in trace)


def _run_both(
    make_program: Any, question: str, make_responder: Any, corpus: list[Passage]
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The same program and a fresh responder, run synchronously then with acall: what each run did."""
    results = []
    for mode in ("sync", "async"):
        retriever = KeywordRetriever(corpus)
        program = make_program(retriever)
        # A program that reads token log probabilities gets them from the local OpenAI-compatible server.
        server = LocalOpenAIServer(make_responder()).start() if program.NEEDS_LOGPROBS else None
        try:
            if server is not None:
                lm = build_lm("openai/scripted", api_base=server.api_base, cache=False, retries=0)
            else:
                lm = ScriptedLM(make_responder())
            with dspy.context(lm=lm):
                if mode == "sync":
                    prediction = program(question=question)
                else:
                    prediction = asyncio.run(program.acall(question=question))
            requests = server.requests if server is not None else lm.requests
        finally:
            if server is not None:
                server.stop()
        results.append(
            (
                prediction.answer,
                [p.id for p in prediction.passages],
                dict(prediction.stats),
                _trace_key(prediction.trace),
                len(requests),
                sorted(retriever.queries),
                prediction.get("route"),
            )
        )
    return results[0], results[1]


@pytest.mark.parametrize("dataset", ["hotpotqa", "strategyqa"])
@pytest.mark.parametrize("name", sorted(programs.names()))
def test_acall_takes_the_same_steps_as_a_synchronous_call(name: str, dataset: str, data_dir) -> None:
    info = get_dataset_info(dataset)
    corpus = load_corpus(dataset, data_dir)[:300]
    example = load_dataset(dataset, data_dir=data_dir)[0]
    cls = programs.get(name)
    sync, asynchronous = _run_both(
        lambda retriever: cls(retriever=retriever, task=info.task),
        example.question,
        lambda: grounded_responder({example.question: example.answers[0]}),
        corpus,
    )
    assert sync == asynchronous
    answer, _, stats, _, requests, queries, _ = asynchronous
    assert answer and stats["fallbacks"] == 0
    # Every reply parsed, so the ledger's LM calls are the requests the LM received, and its retrievals
    # the retriever's calls: the counts compared above are the real ones.
    assert stats["lm_calls"] == requests and stats["retrievals"] == len(queries)


CORPUS = [
    Passage("harold", "Harold II", "Harold II, the last crowned Anglo-Saxon king, married Edith Swan-neck."),
    Passage("pargeter", "Edith Pargeter", "Edith Pargeter was an English novelist."),
    Passage("phelps-born", "Michael Phelps", "Michael Phelps was born on June 30, 1985."),
    Passage("phelps-retire", "Michael Phelps", "Phelps retired after the 2016 Summer Olympics."),
    Passage("namibia", "Sam Nujoma", "Sam Nujoma was the first President of Namibia."),
    Passage("pohamba", "Hifikepunye Pohamba", "Hifikepunye Pohamba succeeded Sam Nujoma as President."),
]
IDS = [p.id for p in CORPUS]
SUBS = ["When was Michael Phelps born?", "When did Michael Phelps retire?"]
QUESTION = "When was Michael Phelps born? When did he retire?"


def hanrag_responder(route: str) -> Any:
    seeds = iter(["Who was the first President of Namibia?", "Who succeeded Sam Nujoma?"])

    def respond(request: Any) -> dict[str, Any]:
        fields = request.output_fields
        if "category" in fields:
            return {"category": route}
        if "sub_questions" in fields:
            return {"sub_questions": SUBS}
        if "seed_question" in fields:
            return {"seed_question": next(seeds, "Who succeeded Sam Nujoma?")}
        if "enough" in fields:
            return {"enough": "succeeded" in request.inputs.get("steps", "")}
        if "relevant" in fields and "passage" in request.inputs:
            passage = request.inputs["passage"]
            return {"relevant": "Phelps" in passage or "Nujoma" in passage}
        if "relevant" in fields:
            return {"relevant": [1]}
        if "knowledge" in fields:
            return {"knowledge": "Phelps swam for the United States."}
        return {"answer": f"answer to {request.inputs.get('question', '')[:40]}"}

    return respond


@pytest.mark.parametrize("route", ["straightforward", "single-step", "compound", "complex"])
@pytest.mark.parametrize("filter_mode", ["per_passage", "batch"])
def test_every_hanrag_route_takes_the_same_steps_async(route: str, filter_mode: str) -> None:
    sync, asynchronous = _run_both(
        lambda retriever: HANRAG(retriever=retriever, top_k=3, filter_mode=filter_mode),
        QUESTION,
        lambda: hanrag_responder(route),
        CORPUS,
    )
    assert sync == asynchronous and asynchronous[-1] == route


@pytest.mark.parametrize(
    "make",
    [
        lambda r: programs.get("vanilla")(
            retriever=r, top_k=3, filter=FilterStage(mode="per_passage"), blend=BlendStage(which="both")
        ),
        lambda r: programs.get("deepnote")(retriever=r, top_k=3, filter=FilterStage(mode="batch")),
        lambda r: programs.get("blendfilter")(retriever=r, top_k=3, filter_mode="per_passage"),
    ],
    ids=["vanilla+filter+blend", "deepnote+filter", "blendfilter-per-passage"],
)
def test_stage_compositions_take_the_same_steps_async(make: Any) -> None:
    sync, asynchronous = _run_both(make, QUESTION, lambda: hanrag_responder("single-step"), CORPUS)
    assert sync == asynchronous


# ---------------------------------------------------------------------------------- overlap on one loop
def _probe_run(program: Any, lm: ProbeLM, question: str = QUESTION) -> Any:
    with dspy.context(lm=lm):
        return asyncio.run(program.acall(question=question))


def test_hanrag_compound_sub_questions_overlap_on_the_event_loop() -> None:
    """Two sub-questions, each: retrieve, 3 per-passage filter calls, an answer. Run one after the other, at
    most 3 LM calls (one sub-question's filters) could be in flight; the compound chain has 6 at once."""
    retriever = ListRetriever(CORPUS, default=IDS, delay=0.05)
    program = HANRAG(retriever=retriever, top_k=3, filter_mode="per_passage")
    lm = ProbeLM(hanrag_responder("compound"))
    started = time.perf_counter()
    prediction = _probe_run(program, lm)
    elapsed = time.perf_counter() - started
    assert prediction.route == "compound" and prediction.stats["retrievals"] == 2
    assert lm.max_in_flight == 6
    assert len(lm.loop_threads) == 1  # one event loop, no thread per sub-question
    # route, decompose, (filters | answer) per sub-question at once, final answer: 5 LM delays, not 10.
    assert elapsed < 10 * lm.delay


def test_blendfilter_generations_and_filters_overlap_on_the_event_loop() -> None:
    retriever = ListRetriever(CORPUS, default=IDS)
    program = programs.get("blendfilter")(retriever=retriever, top_k=2, filter_mode="batch")
    lm = ProbeLM(hanrag_responder("single-step"))
    prediction = _probe_run(program, lm)
    assert [e["variant"] for e in prediction.trace if e["stage"] == "blend"] == ["external", "internal"]
    blends = {_stage(BlendQueryExternal.instructions), _stage(BlendQueryInternal.instructions)}
    # The external and internal generations were in flight together ...
    assert any(blends <= set(live) for live in lm.together)
    # ... and so were the three batch filters (question's, external's and internal's passages).
    assert lm.max_in_flight == 3 and prediction.stats["lm_calls"] == 2 + 3 + 1


def test_blend_stage_generations_overlap() -> None:
    """BlendStage's two variants (one stage, both generations) are gathered, not awaited in turn."""
    program = programs.get("vanilla")(
        retriever=ListRetriever(CORPUS, default=IDS), top_k=2, blend=BlendStage(which="both")
    )
    lm = ProbeLM(hanrag_responder("single-step"))
    prediction = _probe_run(program, lm)
    assert [e["variant"] for e in prediction.trace if e["stage"] == "blend"] == ["external", "internal"]
    assert lm.max_in_flight == 2
    blends = {_stage(BlendQueryExternal.instructions), _stage(BlendQueryInternal.instructions)}
    assert any(blends <= set(live) for live in lm.together)


def test_per_passage_filter_calls_overlap_and_max_workers_caps_them() -> None:
    passages = CORPUS[:5]
    for max_workers, expected in ((None, 5), (2, 2)):
        program = programs.get("vanilla")(
            retriever=ListRetriever(passages, default=[p.id for p in passages]),
            top_k=5,
            filter=FilterStage(mode="per_passage", max_workers=max_workers),
        )
        lm = ProbeLM(hanrag_responder("single-step"))
        prediction = _probe_run(program, lm)
        assert prediction.stats["lm_calls"] == 6
        assert lm.max_in_flight == expected


def test_retrievals_run_off_the_event_loop() -> None:
    """The compound sub-questions' retrievals meet at a barrier: only worker threads can both be waiting
    there; on the loop's thread the first would block the second and the barrier would break."""
    barrier = threading.Barrier(2, timeout=5)
    loop_thread: list[int] = []

    class BarrierRetriever(ListRetriever):
        def __call__(self, query: str, k: int) -> list[Passage]:
            assert threading.get_ident() not in loop_thread
            barrier.wait()
            return super().__call__(query, k)

    async def main() -> Any:
        loop_thread.append(threading.get_ident())
        program = HANRAG(retriever=BarrierRetriever(CORPUS, default=IDS), top_k=2, filter_mode="batch")
        return await program.acall(question=QUESTION)

    with dspy.context(lm=ScriptedLM(hanrag_responder("compound"))):
        prediction = asyncio.run(main())
    assert prediction.stats["retrievals"] == 2


def test_a_synchronous_call_works_inside_a_running_loop() -> None:
    """forward needs no event loop of its own, so it runs from async code (a notebook cell) too."""
    program = HANRAG(retriever=ListRetriever(CORPUS, default=IDS), top_k=2, filter_mode="per_passage")

    async def main() -> Any:
        with dspy.context(lm=ScriptedLM(hanrag_responder("compound"))):
            return program(question=QUESTION)

    prediction = asyncio.run(main())
    assert prediction.route == "compound" and prediction.stats["retrievals"] == 2


# ---------------------------------------------------------------------------------- ragsuite.aio
def test_run_sync_refuses_a_step_that_suspends() -> None:
    async def suspends() -> None:
        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="suspended in a synchronous run"):
        run_sync(suspends())


def test_helpers_follow_the_run_mode() -> None:
    seen: list[tuple[bool, int]] = []

    def work(x: int) -> int:
        seen.append((synchronous(), threading.get_ident()))
        return x * 10

    async def body() -> list[int]:
        return await concurrently(lambda x: in_thread(work, x), [1, 2, 3])

    main = threading.get_ident()
    assert run_sync(body()) == [10, 20, 30]
    assert all(mode for mode, _ in seen) and any(thread != main for _, thread in seen)
    seen.clear()
    assert asyncio.run(body()) == [10, 20, 30]
    assert not any(mode for mode, _ in seen)

    async def fails(x: int) -> int:
        if x:
            raise ValueError(f"item {x}")
        return x

    for runner in (run_sync, asyncio.run):
        with pytest.raises(ValueError, match="item 1"):
            runner(concurrently(fails, [0, 1, 2]))


def test_a_program_with_only_a_synchronous_forward_still_has_acall() -> None:
    class Legacy(programs.RAGProgram):
        name = ""

        def __init__(self) -> None:
            super().__init__(retriever=ListRetriever(CORPUS, default=IDS))
            self.answer = dspy.Predict("question, passages -> answer")

        def forward(self, question: str) -> dspy.Prediction:
            ledger = self.start(question)
            passages = self.retrieve(ledger, question, 2)
            prediction = self.call_stage(ledger, "answer", self.answer, question=question, passages=[])
            return self.finish(ledger, prediction.answer, passages)

    with dspy.context(lm=ScriptedLM(lambda r: {"answer": "42"})):
        sync = Legacy()(question="q?")
        asynchronous = asyncio.run(Legacy().acall(question="q?"))
    assert sync.answer == asynchronous.answer == "42"
    assert sync.stats == asynchronous.stats and sync.stats["lm_calls"] == 1

    class Nothing(programs.RAGProgram):
        name = ""

    with pytest.raises(NotImplementedError, match="aforward"):
        Nothing()(question="q?")
    with pytest.raises(NotImplementedError, match="aforward"):
        asyncio.run(Nothing().acall(question="q?"))


def test_invoke_awaits_modules_and_threads_plain_callables() -> None:
    predictor = dspy.Predict("question -> answer")
    lm = ProbeLM(lambda r: {"answer": "a"})

    async def main() -> tuple[Any, Any]:
        threads = []

        def plain(**_: Any) -> str:
            threads.append(threading.get_ident())
            return "plain"

        return await invoke(predictor, question="q"), (await invoke(plain), threads)

    with dspy.context(lm=lm):
        prediction, (plain, threads) = asyncio.run(main())
    assert prediction.answer == "a" and len(lm.loop_threads) == 1  # the async path of the LM was used
    assert plain == "plain" and threads and threads[0] not in lm.loop_threads


# ---------------------------------------------------------------------------------- eval --engine async
def _records(path: Any) -> dict[str, dict[str, Any]]:
    """Records by id, without what depends on timing (latency) or on which sub-step finished first (the
    order of a trace's concurrent events)."""
    records = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        record.pop("latency_s")
        record["trace"] = _trace_key(record["trace"])
        records[record["id"]] = record
    return records


@pytest.mark.parametrize("program", ["hanrag", "blendfilter", "deepnote"])
def test_eval_async_engine_writes_the_records_the_thread_engine_writes(program: str, tmp_path) -> None:
    from ragsuite.cli import main
    from ragsuite.testing.openai_server import LocalOpenAIServer

    examples = load_dataset("hotpotqa")[:4]
    gold = {ex.question: ex.answers[0] for ex in examples}
    with LocalOpenAIServer(grounded_responder(gold)) as server:
        for engine in ("threads", "async"):
            argv = [
                "eval", "--program", program, "--dataset", "hotpotqa", "--lm", "openai/scripted",
                "--api-base", server.api_base, "--limit", "4", "--threads", "3", "--engine", engine,
                "--no-cache", "--no-progress", "--out", str(tmp_path / engine),
            ]  # fmt: skip
            assert main(argv) == 0
    threads, asynchronous = (
        _records(tmp_path / "threads" / "records.jsonl"),
        _records(tmp_path / "async" / "records.jsonl"),
    )
    assert sorted(threads) == sorted(ex.id for ex in examples)
    assert threads == asynchronous
    assert all(
        r["error"] is None and r["tokens"]["requests"] == r["stats"]["lm_calls"] for r in threads.values()
    )
    summaries = [json.loads((tmp_path / e / "summary.json").read_text()) for e in ("threads", "async")]
    assert summaries[0]["metrics"] == summaries[1]["metrics"]


def _eval_process(server: Any, out: Any, *extra: str) -> Any:
    import os
    import subprocess
    import sys

    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    command = [
        sys.executable, "-m", "ragsuite", "eval", "--program", "no-retrieval", "--dataset", "hotpotqa",
        "--lm", "openai/scripted", "--api-base", server.api_base, "--limit", "8", "--engine", "async",
        "--timeout", "120", "--no-cache", "--no-progress", "--out", str(out), *extra,
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _ids(path: Any) -> list[str]:
    return (
        [json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()]
        if path.exists()
        else []
    )


@pytest.mark.slow
def test_eval_async_engine_resumes_after_kill_9(tmp_path) -> None:
    import os
    import signal

    from ragsuite.processes import stop_process
    from ragsuite.testing.openai_server import Fault, LocalOpenAIServer

    examples = load_dataset("hotpotqa")[:8]
    gold = {ex.question: ex.answers[0] for ex in examples}
    fast = 4
    out = tmp_path / "run"
    records = out / "records.jsonl"
    with LocalOpenAIServer(
        lambda r: {"answer": gold[r.inputs["question"]]},
        fault_fn=lambda number, request: Fault("delay", seconds=60) if number > fast else None,
    ) as server:
        process = _eval_process(server, out, "--threads", "2")
        try:
            deadline = time.monotonic() + 120
            while not (len(_ids(records)) == fast and server.chat_requests == fast + 2):
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "the run did not reach 4 records"
                time.sleep(0.1)
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        finally:
            stop_process(process)
        finished = _ids(records)
        before = records.read_bytes()
        server.fault_fn = None
        second = _eval_process(server, out, "--threads", "2")
        try:
            _, stderr = second.communicate(timeout=180)
        finally:
            stop_process(second)
        assert second.returncode == 0, stderr
    assert sorted(_ids(records)) == sorted(ex.id for ex in examples)  # every example exactly once
    assert records.read_bytes().startswith(before)  # the finished records kept as they were
    by_id = {ex.id: ex.question for ex in examples}
    assert all(server.question_counts[by_id[i]] == 1 for i in finished)  # never asked again
    assert sum(server.question_counts.values()) == 8 + 2  # the two in flight at the kill, asked again


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "code", "stopped"), [("SIGTERM", 143, "terminated (SIGTERM)"), ("SIGINT", 130, "interrupted")]
)
def test_eval_async_engine_sigterm_and_ctrl_c_keep_the_records_and_write_the_summary(
    tmp_path, signum: str, code: int, stopped: str
) -> None:
    import signal

    from ragsuite.processes import stop_process
    from ragsuite.testing.openai_server import LocalOpenAIServer

    examples = load_dataset("hotpotqa")[:8]
    gold = {ex.question: ex.answers[0] for ex in examples}
    out = tmp_path / "run"
    with LocalOpenAIServer(lambda r: {"answer": gold[r.inputs["question"]]}, latency=1.0) as server:
        process = _eval_process(server, out, "--threads", "1")
        try:
            deadline = time.monotonic() + 120
            while not _ids(out / "records.jsonl"):
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "no first record"
                time.sleep(0.05)
            process.send_signal(getattr(signal, signum))
            _, stderr = process.communicate(timeout=60)
        finally:
            stop_process(process)
    assert process.returncode == code, stderr
    assert "rerun the same command" in stderr
    summary = json.loads((out / "summary.json").read_text())
    kept = _ids(out / "records.jsonl")
    assert 1 <= len(kept) < 8 and summary["n"] == len(kept) and not summary["complete"]
    assert summary["stopped"] == stopped


def test_evaluate_refuses_an_unknown_engine() -> None:
    from ragsuite.errors import ConfigError
    from ragsuite.evaluation import evaluate

    with pytest.raises(ConfigError, match="engine must be one of threads, async"):
        evaluate(programs.get("no-retrieval")(), [], dataset="hotpotqa", engine="processes")  # type: ignore[arg-type]


def test_a_retriever_with_an_async_client_is_awaited_on_the_loop() -> None:
    calls: list[tuple[str, bool]] = []

    class AsyncClient(ListRetriever):
        def __call__(self, query: str, k: int) -> list[Passage]:
            calls.append(("sync", threading.current_thread() is threading.main_thread()))
            return super().__call__(query, k)

        async def acall(self, query: str, k: int) -> list[Passage]:
            calls.append(("async", threading.current_thread() is threading.main_thread()))
            await asyncio.sleep(0)
            return super().__call__(query, k)

    program = programs.get("vanilla")(retriever=AsyncClient(CORPUS, default=IDS), top_k=2)
    with dspy.context(lm=ScriptedLM(hanrag_responder("single-step"))):
        sync = program(question=QUESTION)
        asynchronous = asyncio.run(program.acall(question=QUESTION))
    assert calls == [("sync", True), ("async", True)]  # both in the caller's thread: no worker thread
    assert [p.id for p in sync.passages] == [p.id for p in asynchronous.passages] == IDS[:2]
