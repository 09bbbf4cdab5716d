"""``ragsuite eval``'s two engines side by side: worker threads (``program(...)``) against one event loop
(``await program.acall(...)``), at several numbers of concurrent questions.

A local OpenAI-compatible server, in its own process (its CPU time is not charged to the harness), answers
every LM call after a fixed latency. The program makes ``--calls`` sequential LM calls per question plus, in
the middle, ``--fanout`` concurrent ones (like HANRAG's per-passage filter), through the real ``dspy.LM``
HTTP client, the ChatAdapter, usage tracking and a run directory (records fsynced). Each (engine,
concurrency) runs in a fresh process, so its peak RSS (``resource.getrusage``) is its own.

Figures, per run:
    ideal (s): questions / concurrency * (calls + 1 if fanout else calls) * latency, the LM-bound wall time.
    efficiency: ideal / actual wall time of ``evaluate`` (1.0 = no overhead at all).
    CPU / LM call (ms): the harness process's CPU time (all threads) during ``evaluate`` / LM requests.
    peak RSS (MiB): the process's peak resident memory (imports included; ``base`` is the peak before
        ``evaluate`` started).
    threads: the process's most threads alive at once during the run (sampled every 50 ms).
    s / question: mean latency of one question (ideal: (calls + 1 if fanout else calls) * latency).

The LM is built as ``ragsuite eval`` builds it: its connection pool (``build_lm(max_connections=...)``)
is ``ragsuite eval``'s default for that many concurrent questions, 4 per question and at least 100;
``--max-connections N`` sets it instead (``--max-connections 100`` is DSPy's own limit, with which both
engines queue for a connection past 100 LM calls in flight). Several values run each setting in turn,
``default`` standing for ``ragsuite eval``'s: ``--max-connections 100 default``.

``--out FILE.json`` also writes the run's records: every row's raw figures, the settings, the machine (cores,
load average, nice value, Python and package versions) and the command. ``--report FILE.json`` runs nothing:
it prints the Markdown report of such a file, from the file alone, and with ``--docs PAGE`` writes it between
the page's ``<!-- eval-engines:start -->`` and ``<!-- eval-engines:end -->`` markers.

Usage:
    python benchmarks/eval_engines.py [--latency 1.0] [--calls 2] [--fanout 3] [--per-slot 2]
        [--concurrency 16 64 256] [--engines threads async] [--max-connections N|default ...]
        [--out FILE.json]
    python benchmarks/eval_engines.py --report FILE.json [--docs docs/evaluate.md]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parent.parent

#: The packages whose versions a records file keeps: the LM client's stack, from DSPy down to HTTP.
PACKAGES = ("ragsuite", "dspy", "litellm", "openai", "httpx", "aiohttp")
#: ``--per-slot``'s default, named in a report whose run used fewer questions.
PER_SLOT = 2
#: The page section a report is written into.
MARKERS = "eval-engines"


def _serve(latency: float, queue: Any, stop: Any, done: Any) -> None:
    from ragsuite.testing.openai_server import LocalOpenAIServer

    def respond(request: Any) -> dict[str, str]:
        return {name: "ok" for name in request.output_fields}

    with LocalOpenAIServer(respond, latency=latency) as server:
        queue.put(server.api_base)
        stop.wait()
        done.put(server.chat_requests)


def _program(calls: int, fanout: int) -> Any:
    import dspy

    from ragsuite.aio import concurrently
    from ragsuite.programs.base import RAGProgram

    class ChainFan(RAGProgram):
        """``calls`` sequential LM stages; after the first, ``fanout`` concurrent ones; no retrieval."""

        name: ClassVar[str] = "chain-fan"

        def __init__(self) -> None:
            super().__init__(task="short")
            self.steps = [dspy.Predict("question, previous -> answer") for _ in range(calls)]
            self.judge = dspy.Predict("question, item -> verdict")

        async def aforward(self, question: str) -> dspy.Prediction:
            ledger = self.start(question)
            answer = ""
            for i, step in enumerate(self.steps):
                prediction = await self.acall_stage(
                    ledger, f"step{i}", step, question=question, previous=answer
                )
                answer = prediction.answer
                if i == 0 and fanout:
                    await concurrently(
                        lambda item: self.acall_stage(
                            ledger, "judge", self.judge, question=question, item=item
                        ),
                        [f"item {j}" for j in range(fanout)],
                    )
            return self.finish(ledger, answer, [])

    return ChainFan()


def _peak_threads(stop: threading.Event, peak: list[int]) -> None:
    while not stop.wait(0.05):
        peak[0] = max(peak[0], threading.active_count())


def connections(args: argparse.Namespace) -> int:
    """The LM's connection pool: ``--max-connections``, else ``ragsuite eval``'s for the concurrency."""
    from ragsuite.cli.args import default_max_connections

    return args.max_connections or default_max_connections(args.concurrency)


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """One engine at one concurrency, in this (fresh) process."""
    import resource

    import dspy

    from ragsuite.evaluation import evaluate
    from ragsuite.lm import build_lm

    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    examples = [
        dspy.Example(id=f"q{i}", question=f"Question number {i}?", answers=["ok"]).with_inputs("question")
        for i in range(args.concurrency * args.per_slot)
    ]
    lm = build_lm(
        "openai/scripted",
        api_base=args.api_base,
        cache=False,
        retries=0,
        timeout=120,
        max_connections=connections(args),
    )
    program = _program(args.calls, args.fanout)
    with dspy.context(lm=lm):  # warm up: connections, imports, adapters (both paths)
        evaluate(program, examples[:4], dataset="hotpotqa", threads=4, engine=args.engine, progress=False)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = [threading.active_count()]
    stop = threading.Event()
    sampler = threading.Thread(target=_peak_threads, args=(stop, peak), daemon=True)
    sampler.start()
    with tempfile.TemporaryDirectory() as out, dspy.context(lm=lm):
        started, cpu_started = time.perf_counter(), time.process_time()
        result = evaluate(
            program,
            examples,
            dataset="hotpotqa",
            threads=args.concurrency,
            engine=args.engine,
            out_dir=out,
            progress=False,
        )
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
    stop.set()
    sampler.join()
    if result.errors:
        raise SystemExit(f"{result.errors} examples failed: {result.records[0]['error']}")
    requests = sum(r["tokens"]["requests"] for r in result.records)
    expected = len(examples) * (args.calls + args.fanout)
    if requests != expected:
        raise SystemExit(f"{requests} LM requests, expected {expected}")
    path = args.calls + (1 if args.fanout else 0)
    ideal = len(examples) / args.concurrency * path * args.latency
    return {
        "engine": args.engine,
        "concurrency": args.concurrency,
        "connections": connections(args),
        "questions": len(examples),
        "requests": requests,
        "ideal": ideal,
        "wall": wall,
        "cpu_per_call_ms": 1000 * cpu / requests,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "base_rss_mib": base_rss / 1024,
        "threads": peak[0],
        "question_s": sum(r["latency_s"] for r in result.records) / len(result.records),
    }


def pool_size(value: str) -> int | None:
    """One ``--max-connections`` value: a whole number >= 1, or ``default`` (None: ``ragsuite eval``'s)."""
    if value == "default":
        return None
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1 or 'default', not {value!r}")
    return count


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The Markdown table of the rows, as the script prints it."""
    lines = [
        "| engine | concurrent questions | LM connections | questions | LM calls | ideal (s) | actual (s) "
        "| efficiency | s / question | CPU / LM call (ms) | peak RSS (MiB) | base RSS (MiB) | peak threads |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['engine']} | {row['concurrency']} | {row['connections']} | {row['questions']} "
            f"| {row['requests']} "
            f"| {row['ideal']:.2f} | {row['wall']:.2f} | {row['ideal'] / row['wall']:.2f} "
            f"| {row['question_s']:.2f} | {row['cpu_per_call_ms']:.2f} | {row['peak_rss_mib']:.0f} "
            f"| {row['base_rss_mib']:.0f} | {row['threads']} |"
        )
    return lines


def machine(packages: tuple[str, ...] = PACKAGES) -> dict[str, Any]:
    """Facts about this machine and interpreter that a timing depends on, with the versions of ``packages``
    (None: not installed)."""
    from importlib import metadata

    versions = {}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "cpus": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "nice": os.nice(0),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": versions,
    }


def report(records: dict[str, Any]) -> str:
    """The Markdown report of a records file (``--out``), from the file alone: one sentence on what was run,
    where and how, then the table."""
    s, m = records["settings"], records["machine"]
    rows = records["rows"]
    path = s["calls"] + (1 if s["fanout"] else 0)
    questions = sorted({row["questions"] for row in rows})
    fewer = (
        f" (`--per-slot {s['per_slot']}`, fewer than the default {PER_SLOT}, to keep the run short)"
        if s["per_slot"] < PER_SLOT
        else ""
    )
    versions = ", ".join(f"{name} {version}" for name, version in m["packages"].items() if version)
    load = "/".join(f"{x:.1f}" for x in m["load_average"])
    took = f"{records['wall_s']:.0f} s" if records["wall_s"] < 120 else f"{records['wall_s'] / 60:.0f} min"
    sentence = (
        f"One run of `{records['command']}` ({took}) on {m['cpus']} cores "
        f"(load average {load} at its start, nice {m['nice']}; Python {m['python']}, {versions}): "
        f"each row is one engine in a fresh process answering {' or '.join(f'{n:,}' for n in questions)} "
        f"questions{fewer}, {s['per_slot']} per concurrent question, each making {s['calls']} sequential "
        f"LM calls and {s['fanout']} concurrent ones to a local server that answers after "
        f"{s['latency']:g} s; LM connections is the LM's pool (100 is DSPy's own, more is `ragsuite "
        f"eval`'s 4 per concurrent question), ideal the LM-bound wall time (questions / concurrent "
        f"questions × {path} calls on a question's path × {s['latency']:g} s), actual the measured one, "
        f"efficiency ideal / actual (1.00: no overhead), s / question a question's mean latency (ideal "
        f"{path * s['latency']:g} s), CPU / LM call the benchmark process's CPU time (all threads) per "
        f"LM call, peak and base RSS its most resident memory during the run and before it, and peak "
        f"threads its most threads alive at once."
    )
    return "\n".join([sentence, "", *table(rows)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--latency", type=float, default=1.0, help="seconds per LM call (default 1.0)")
    parser.add_argument("--calls", type=int, default=2, help="sequential LM calls per question (default 2)")
    parser.add_argument("--fanout", type=int, default=3, help="concurrent LM calls per question (default 3)")
    parser.add_argument("--per-slot", type=int, default=2, help="questions per concurrent slot (default 2)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--engines", nargs="+", default=["threads", "async"], choices=["threads", "async"])
    parser.add_argument(
        "--max-connections",
        type=pool_size,
        nargs="+",
        default=[None],
        help="the LM's connection pool; several values run each in turn (default: 'default', ragsuite "
        "eval's for the concurrency, 4 per question, at least 100)",
    )
    parser.add_argument("--out", type=Path, help="also write the run's records (JSON) to this file")
    parser.add_argument(
        "--report", type=Path, metavar="FILE.json", help="print the report of a records file; run nothing"
    )
    parser.add_argument(
        "--docs", type=Path, help=f"with --report: also write it between the page's {MARKERS} markers"
    )
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--api-base", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        args.concurrency = args.concurrency[0]
        args.max_connections = args.max_connections[0]
        print(json.dumps(run_one(args)))
        return 0
    if args.report:
        text = report(json.loads(args.report.read_text(encoding="utf-8")))
        print(text)
        if args.docs:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from real_lm import write_between_markers

            write_between_markers(args.docs, MARKERS, text)
        return 0
    if args.docs:
        parser.error("--docs goes with --report")
    command = shlex.join(["python", "benchmarks/eval_engines.py", *(sys.argv[1:] if argv is None else argv)])
    facts = machine()
    run_started = time.perf_counter()

    ctx = multiprocessing.get_context("spawn")
    queue, stop, done = ctx.Queue(), ctx.Event(), ctx.Queue()
    server = ctx.Process(target=_serve, args=(args.latency, queue, stop, done), daemon=True)
    server.start()
    rows = []
    try:
        api_base = queue.get(timeout=60)
        runs = [(c, pool, e) for c in args.concurrency for pool in args.max_connections for e in args.engines]
        for concurrency, pool, engine in runs:  # side by side: the engines alternate at each setting
            child_command = [
                sys.executable, __file__, "--one", "--engine", engine, "--api-base", api_base,
                "--concurrency", str(concurrency), "--latency", str(args.latency), "--calls",
                str(args.calls), "--fanout", str(args.fanout), "--per-slot", str(args.per_slot),
                *(["--max-connections", str(pool)] if pool else []),
            ]  # fmt: skip
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            }
            child = subprocess.run(child_command, capture_output=True, text=True, env=env, check=False)
            if child.returncode != 0:
                raise SystemExit(f"{engine} at {concurrency} failed:\n{child.stderr[-3000:]}")
            rows.append(json.loads(child.stdout.strip().splitlines()[-1]))
    finally:
        stop.set()
        server.join(timeout=30)
    print(
        f"latency {1000 * args.latency:.0f} ms/LM call; per question {args.calls} sequential + {args.fanout} "
        f"concurrent LM calls; {args.per_slot} questions per slot; cpus={os.cpu_count()}"
    )
    print("\n".join(table(rows)))
    if args.out:
        settings = {
            "latency": args.latency, "calls": args.calls, "fanout": args.fanout, "per_slot": args.per_slot,
            "concurrency": args.concurrency, "engines": args.engines, "max_connections": args.max_connections,
        }  # fmt: skip
        records = {
            "benchmark": "eval_engines",
            "command": command,
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "wall_s": time.perf_counter() - run_started,
            "settings": settings,
            "machine": facts,
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
            "rows": rows,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
