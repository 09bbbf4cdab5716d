"""Throughput of ``ragsuite.evaluation``: wall time against the LM-bound ideal, and overhead per LM call.

A local OpenAI-compatible server (in its own process, so its CPU time is not charged to the harness) answers
every call after a fixed latency. A program makes a known number of sequential LM calls per question, through
the real ``dspy.LM`` HTTP client, the ChatAdapter, usage tracking and the run directory (records fsynced).
The ideal wall time is ``questions * calls * latency / threads``; efficiency = ideal / actual.

Usage:
    python benchmarks/eval_throughput.py [--latency 0.05] [--calls 3] [--threads 1 4 16] [--per-thread 16]
"""

from __future__ import annotations

import argparse
import contextvars
import multiprocessing
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _serve(latency: float, queue: Any, stop: Any, done: Any) -> None:
    from ragsuite.testing.openai_server import LocalOpenAIServer

    def respond(request: Any) -> dict[str, str]:
        return {name: "ok" for name in request.output_fields}

    with LocalOpenAIServer(respond, latency=latency) as server:
        cpu_started = time.process_time()  # after the imports, which are no per-request cost
        queue.put(server.api_base)
        stop.wait()
        done.put((time.process_time() - cpu_started, server.chat_requests))


def _program(calls: int) -> Any:
    import dspy

    from ragsuite.programs.base import RAGProgram

    class Chain(RAGProgram):
        """``calls`` sequential LM stages, no retrieval."""

        name: ClassVar[str] = "chain"

        def __init__(self) -> None:
            super().__init__(task="short")
            self.steps = [dspy.Predict("question, previous -> answer") for _ in range(calls)]

        def forward(self, question: str) -> dspy.Prediction:
            ledger = self.start(question)
            answer = ""
            for i, step in enumerate(self.steps):
                answer = self.call_stage(ledger, f"step{i}", step, question=question, previous=answer).answer
            return self.finish(ledger, answer, [])

    return Chain()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per LM call (default 0.05)")
    parser.add_argument("--calls", type=int, default=3, help="LM calls per question (default 3)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--per-thread", type=int, default=16, help="questions per thread (default 16)")
    parser.add_argument(
        "--data-dir",
        default=str(Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "data"),
        help="where HotpotQA's dev questions are read (default: the committed fixtures)",
    )
    args = parser.parse_args(argv)

    import dspy

    from ragsuite.data.datasets import load_dataset
    from ragsuite.evaluation import evaluate
    from ragsuite.lm import build_lm

    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    # The program is scripted, so only the count matters: a short dev file (the fixtures' 40) is cycled, each
    # repeat under its own id.
    dev = load_dataset("hotpotqa", data_dir=args.data_dir)
    needed = max(4, max(args.threads) * args.per_thread)
    questions = [
        dev[i % len(dev)] if i < len(dev) else dev[i % len(dev)].copy(id=f"{dev[i % len(dev)].id}-{i}")
        for i in range(needed)
    ]
    ctx = multiprocessing.get_context("spawn")
    queue, stop, done = ctx.Queue(), ctx.Event(), ctx.Queue()
    server = ctx.Process(target=_serve, args=(args.latency, queue, stop, done), daemon=True)
    server.start()
    api_base = queue.get(timeout=60)
    lm = build_lm("openai/scripted", api_base=api_base, cache=False, retries=0, timeout=30)
    program = _program(args.calls)
    rows = []
    try:
        with dspy.context(lm=lm):  # warm up: connections, imports, adapters
            evaluate(program, questions[:4], dataset="hotpotqa", threads=4, progress=False)
            for threads in args.threads:
                examples = questions[: threads * args.per_thread]
                with tempfile.TemporaryDirectory() as out:
                    started, cpu_started = time.perf_counter(), time.process_time()
                    result = evaluate(
                        program, examples, dataset="hotpotqa", threads=threads, out_dir=out, progress=False
                    )
                    wall = time.perf_counter() - started
                    cpu = time.process_time() - cpu_started
                if result.errors:
                    raise SystemExit(f"{result.errors} examples failed: {result.records[0]['error']}")
                calls = sum(r["tokens"]["requests"] for r in result.records)
                ideal = calls * args.latency / threads
                overhead = (wall * threads - calls * args.latency) / calls
                rows.append((threads, len(examples), calls, ideal, wall, ideal / wall, overhead, cpu / calls))
            # The same program on a bare thread pool: what the DSPy client costs without the harness.
            threads = max(args.threads)
            examples = questions[: threads * args.per_thread]
            contexts = [contextvars.copy_context() for _ in examples]
            with ThreadPoolExecutor(threads) as pool:
                started = time.perf_counter()
                list(pool.map(lambda c, e: c.run(program, question=e.question), contexts, examples))
                baseline = (threads, time.perf_counter() - started, len(examples) * args.calls)
    finally:
        stop.set()
        server_cpu, server_requests = done.get(timeout=30)
        server.join(timeout=10)
    print(f"latency {1000 * args.latency:.0f} ms/call, {args.calls} LM calls/question, cpus={os.cpu_count()}")
    print(
        f"server CPU per request: {1000 * server_cpu / server_requests:.2f} ms (not charged to the harness)"
    )
    print(
        "| threads | questions | LM calls | ideal (s) | actual (s) | efficiency "
        "| wall overhead / LM call (ms) "
        "| client CPU / LM call (ms) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for threads, n, calls, ideal, wall, eff, overhead, cpu in rows:
        print(
            f"| {threads} | {n} | {calls} | {ideal:.2f} | {wall:.2f} | {eff:.2f} | {1000 * overhead:.1f} "
            f"| {1000 * cpu:.2f} |"
        )
    threads, wall, calls = baseline
    ideal = calls * args.latency / threads
    print(
        f"\nbare thread pool, same program and client, {threads} threads: {wall:.2f} s, efficiency "
        f"{ideal / wall:.2f}; the harness adds {100 * (rows[-1][4] / wall - 1):+.1f}% wall time"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
