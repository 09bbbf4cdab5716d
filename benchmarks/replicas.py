"""Eval throughput over 1, 2 and 4 LM replicas (LiteLLM's Router, ``ragsuite.lm_replicas``) against linear.

Each replica is a local OpenAI-compatible server in its own process (its CPU is not charged to the
client) that answers after ``--latency`` seconds and serves at most ``--capacity`` requests at once, queueing
the rest, as a GPU server saturates: one replica's throughput is ``capacity / latency`` requests per
second, whatever the number of client threads. ``ragsuite.evaluation`` runs the no-retrieval program (one LM
call per question) on ``--threads`` threads through the replica LM (``ragsuite.lm_replicas.ReplicaLM``,
what ``build_lm(..., api_base=[URLs])`` makes for two or more) and, for reference, one replica through the
plain client. Every configuration gets the same number of question rounds per serving slot, so its ideal
wall time is the same: ``rounds * latency``. Enough rounds keep the last, partly filled round (one replica
given a request or two more than another) a small part of the wall time.

Efficiency vs linear = throughput with R replicas / (R x throughput with 1 replica through the replica LM),
measured in one run.

Usage:
    python benchmarks/replicas.py [--replicas 1 2 4] [--latency 0.5] [--capacity 4] [--threads 64]
        [--rounds 24] [--routing least-busy|simple-shuffle]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _serve(latency: float, capacity: int, queue: Any, stop: Any, done: Any) -> None:
    from ragsuite.testing.openai_server import LocalOpenAIServer

    class Saturating(LocalOpenAIServer):
        """At most ``capacity`` requests in service; the others wait their turn, as on a busy GPU."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._slots = threading.BoundedSemaphore(capacity)

        def _complete(self, body: dict[str, Any], **kwargs: Any) -> Any:
            # Whatever else the server passes along (the endpoint: chat or text) goes through unchanged.
            with self._slots:
                return super()._complete(body, **kwargs)

    def respond(request: Any) -> dict[str, str]:
        return {name: "ok" for name in request.output_fields}

    with Saturating(respond, latency=latency) as server:
        queue.put(server.api_base)
        stop.wait()
        done.put((server.api_base, server.chat_requests))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--latency", type=float, default=0.5, help="seconds per request (default 0.5)")
    parser.add_argument("--capacity", type=int, default=4, help="requests one replica serves at once (4)")
    parser.add_argument("--threads", type=int, default=64, help="eval threads (default 64)")
    parser.add_argument("--rounds", type=int, default=24, help="questions per serving slot (default 24)")
    parser.add_argument(
        "--routing",
        default="least-busy",
        choices=["least-busy", "simple-shuffle"],
        help="the Router's routing_strategy (default least-busy, what ragsuite uses; simple-shuffle is "
        "LiteLLM's default, random choice)",
    )
    args = parser.parse_args(argv)

    import dspy

    import ragsuite.lm_replicas
    from ragsuite.evaluation import evaluate
    from ragsuite.lm import build_lm
    from ragsuite.lm_replicas import ReplicaLM
    from ragsuite.programs.baselines import NoRetrieval

    ragsuite.lm_replicas.ROUTING_STRATEGY = args.routing
    options: dict[str, Any] = {"cache": False, "retries": 0, "timeout": 60}

    def router_lm(urls: list[str]) -> Any:
        return ReplicaLM(
            "openai/scripted",
            replicas=urls,
            api_key="EMPTY",
            timeout=60,
            cache=False,
            num_retries=0,
            temperature=0.1,
            max_tokens=1024,
        )

    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    ctx = multiprocessing.get_context("spawn")
    stop, done, queue = ctx.Event(), ctx.Queue(), ctx.Queue()
    servers = [
        ctx.Process(target=_serve, args=(args.latency, args.capacity, queue, stop, done), daemon=True)
        for _ in range(max(args.replicas))
    ]
    for process in servers:
        process.start()
    bases = [queue.get(timeout=60) for _ in servers]
    program = NoRetrieval()
    # (label, replicas, LM): one server through the plain client, then 1, 2, 4 ... through the replica LM.
    setups: list[tuple[str, int, Any]] = []
    if 1 in args.replicas:
        setups.append(
            ("1, plain client", 1, lambda: build_lm("openai/scripted", api_base=bases[0], **options))
        )
    for count in args.replicas:
        setups.append((f"{count}, replicas", count, lambda count=count: router_lm(bases[:count])))
    rows = []
    try:
        for label, count, make_lm in setups:
            lm = make_lm()
            n = args.rounds * args.capacity * count
            examples = [
                dspy.Example(
                    id=f"{label}-{i}", question=f"question {label} {i}?", answers=["ok"]
                ).with_inputs("question")
                for i in range(n)
            ]
            with dspy.context(lm=lm):  # warm up: imports, connections, each replica's first call
                evaluate(
                    program, examples[: 2 * count], dataset="hotpotqa", threads=2 * count, progress=False
                )
                with tempfile.TemporaryDirectory() as out:
                    started, cpu_started = time.perf_counter(), time.process_time()
                    result = evaluate(
                        program,
                        examples,
                        dataset="hotpotqa",
                        threads=args.threads,
                        out_dir=out,
                        progress=False,
                    )
                    wall = time.perf_counter() - started
                    cpu = time.process_time() - cpu_started
            if result.errors:
                raise SystemExit(f"{result.errors} questions failed: {result.records[0]['error']}")
            if result.metrics.get("exact_match") != 1.0:
                raise SystemExit(f"wrong answers with {label}: {result.metrics}")
            rows.append((label, count, n, wall, n / wall, cpu / n))
    finally:
        stop.set()
        served = dict(done.get(timeout=30) for _ in servers)
        for process in servers:
            process.join(timeout=10)
    # Linear is measured against one replica through the same client (the replica LM).
    single = next((row[4] for row in rows if row[0] == "1, replicas"), None)
    print(
        f"latency {1000 * args.latency:.0f} ms/request, {args.capacity} requests at once per replica, "
        f"{args.threads} eval threads, {args.rounds} rounds per slot, routing {args.routing}, "
        f"cpus={os.cpu_count()}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(
        "| replicas, client | questions | ideal (s) | actual (s) | questions/s | vs 1 replica "
        "| efficiency vs linear | client CPU / question (ms) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    ideal = args.rounds * args.latency
    for label, count, n, wall, throughput, cpu in rows:
        speedup = f"{throughput / single:.2f}x" if single else "–"
        efficiency = f"{throughput / (count * single):.2f}" if single else "–"
        print(
            f"| {label} | {n} | {ideal:.2f} | {wall:.2f} | {throughput:.1f} | {speedup} | {efficiency} "
            f"| {1000 * cpu:.1f} |"
        )
    counts = [served.get(base) for base in bases]
    print(f"\nrequests answered per replica, in order, over the whole run (warm-ups included): {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
