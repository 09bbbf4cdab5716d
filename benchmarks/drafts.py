"""Self-speculative decoding on the local LM: llama.cpp's n-gram drafts against none, on the same requests.

DeepNote's notes copy phrases from the passages in their prompts, and llama-server can draft the next tokens
of a reply from its own prompt (``--spec-type ngram-simple``: find the reply's last N tokens earlier in the
prompt or reply, propose the M that followed them, keep what the model agrees with). Checking a draft of M
tokens is one batched step, and on a CPU a batched token costs a fraction of a generated one, so each accepted
draft token saves most of a step; a rejected draft costs its batch for nothing.

The script records every LM request of DeepNote (``--lm local`` with no flag) on ``--questions`` dev
questions, then replays the recorded requests, in order and two at a time as the run sent them, on one server
per arm of :data:`ARMS`; ``--passes`` rounds, the arms in a rotated order each round, so that all see the same
machine.
Each replay reads the server's own counters (``/metrics``): generated tokens and the seconds spent generating
them, prompt tokens and seconds, draft tokens proposed and accepted. The requests keep their sampling
settings (temperature 0.1), so replies differ between arms as they would between two runs; tokens per
second of generation, not the replies, is what is compared. Rows go to ``--out`` (``drafts.jsonl``), and the
report is rendered from them alone.

Example:
    python benchmarks/drafts.py --data-dir DATA --questions 3 --passes 2 --out benchmarks/results/drafts
    python benchmarks/drafts.py --out benchmarks/results/drafts --report
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from real_lm import append_jsonl, generation, read_jsonl, write_between_markers  # noqa: E402


def ngram_flags(n: int, m: int) -> list[str]:
    """llama-server's flags for drafts of the ``m`` tokens that followed the reply's last ``n`` tokens where
    those last appeared in the prompt or reply."""
    return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(n),
            "--spec-ngram-simple-size-m", str(m)]  # fmt: skip


#: Arm -> llama-server flags added to ragsuite's own.
ARMS: dict[str, list[str]] = {"none": [], "ngram-4-8": ngram_flags(4, 8), "ngram-3-16": ngram_flags(3, 16)}
#: The server counters a replay reads (``llamacpp:NAME`` in ``/metrics``).
COUNTERS = (
    "prompt_tokens_total",
    "prompt_seconds_total",
    "tokens_predicted_total",
    "tokens_predicted_seconds_total",
    "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total",
)


def start_server(model_name: str, flags: list[str]) -> Any:
    from ragsuite.local_lm import LocalServer, resolve_model

    class FlaggedServer(LocalServer):
        def command(self) -> list[str]:
            return [*super().command(), *flags]

    server = FlaggedServer(resolve_model(model_name), engine="llama.cpp")
    return server.start()


def counters(server: Any) -> dict[str, float]:
    """The server's :data:`COUNTERS` now (0 for one this build does not report)."""
    url = server.api_base.removesuffix("/v1") + "/metrics"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {server.api_key}"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        text = reply.read().decode()
    values = dict(re.findall(r"^llamacpp:(\w+) ([-+.\deE]+)$", text, flags=re.M))
    return {name: float(values.get(name, 0.0)) for name in COUNTERS}


def record(args: argparse.Namespace, server: Any) -> list[tuple[tuple, dict]]:
    """Run DeepNote on the questions through ``server`` and return the (args, kwargs) of every request the
    LM sent, in the order they were sent."""
    import dspy

    from ragsuite import programs
    from ragsuite.data.datasets import load_dataset
    from ragsuite.evaluation import evaluate
    from ragsuite.lm import build_lm
    from ragsuite.retrieval.spec import build_retriever

    os.environ["RAGSUITE_DATA"] = str(args.data_dir)
    examples = load_dataset(args.dataset, split="dev")[: args.questions]
    lm = build_lm(args.model, api_base=server.api_base, cache=False, **generation(args.program))
    sent: list[tuple[tuple, dict]] = []
    send, asend = lm.forward, lm.aforward

    def forward(*a: Any, **kw: Any) -> Any:
        sent.append((a, kw))
        return send(*a, **kw)

    async def aforward(*a: Any, **kw: Any) -> Any:
        sent.append((a, kw))
        return await asend(*a, **kw)

    lm.forward, lm.aforward = forward, aforward
    program = programs.get(args.program)(retriever=build_retriever(f"bm25:{args.dataset}"))
    with dspy.context(lm=lm):
        evaluate(program, examples, dataset=args.dataset, threads=2, progress=False)
    return sent


def replay(args: argparse.Namespace, server: Any, sent: list[tuple[tuple, dict]]) -> dict[str, Any]:
    """Send the recorded requests to ``server`` two at a time, in order; the server's counters over it."""
    from ragsuite.lm import build_lm

    lm = build_lm(args.model, api_base=server.api_base, cache=False, **generation(args.program))
    before = counters(server)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(lm.forward, *a, **kw) for a, kw in sent]:
            done.result()
    wall = time.perf_counter() - started
    after = counters(server)
    return {"wall": wall, "requests": len(sent), **{k: after[k] - before[k] for k in COUNTERS}}


def report(out: Path) -> str:
    """The replays of ``out`` side by side: wall seconds of each pass (the first on a cold prompt cache, the
    later ones on the prompts the same server already read), their mean over the no-draft arm's, the seconds
    the server's slots spent reading prompts and generating (summed over slots, per replay), and its
    generation speed, tokens and drafts over the passes."""
    rows = read_jsonl(out / "drafts.jsonl")
    if not rows:
        raise SystemExit(f"{out} holds no replays (drafts.jsonl)")
    arms = list(dict.fromkeys(row["arm"] for row in rows))
    passes = sorted({row["pass"] for row in rows})
    mean_wall = {arm: statistics.mean(r["wall"] for r in rows if r["arm"] == arm) for arm in arms}
    base = mean_wall.get("none")
    command = (out / "command.txt").read_text(encoding="utf-8").strip()
    lines = [
        f"DeepNote's {rows[0]['requests']} recorded requests (its run on `--lm local`, no flag), replayed "
        f"two at a time on one server per arm, {len(passes)} passes (the arms in a rotated order each pass). "
        f"Command: `{command}`.",
        "",
        "| arm | "
        + " | ".join(f"wall s, pass {p + 1}" + (" (cold cache)" if p == 0 else "") for p in passes)
        + " | mean over none | slot s reading / generating | generated tok/s | completion tokens/replay"
        " | drafted/replay | accepted |",
        "|---|" + "---|" * (len(passes) + 6),
    ]
    for arm in arms:
        mine = [row for row in rows if row["arm"] == arm]
        walls = {row["pass"]: row["wall"] for row in mine}
        predicted = sum(r["tokens_predicted_total"] for r in mine)
        seconds = sum(r["tokens_predicted_seconds_total"] for r in mine)
        drafted = sum(r["spec_decode_num_draft_tokens_total"] for r in mine)
        accepted = sum(r["spec_decode_num_accepted_tokens_total"] for r in mine)
        cells = [
            arm,
            *(f"{walls[p]:.0f}" if p in walls else "-" for p in passes),
            f"{mean_wall[arm] / base:.2f}" if base else "-",
            f"{sum(r['prompt_seconds_total'] for r in mine) / len(mine):.0f} / {seconds / len(mine):.0f}",
            f"{predicted / seconds:.1f}" if seconds else "-",
            f"{predicted / len(mine):,.0f}",
            f"{drafted / len(mine):,.0f}",
            f"{accepted / drafted:.0%}" if drafted else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT / "tests" / "fixtures" / "data")
    parser.add_argument("--dataset", default="hotpotqa")
    parser.add_argument("--program", default="deepnote")
    parser.add_argument("--model", default="local")
    parser.add_argument("--questions", type=int, default=3, help="dev questions recorded (default 3)")
    parser.add_argument("--passes", type=int, default=2, help="replays per arm (default 2)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--report", action="store_true", help="print the report of --out and run nothing")
    parser.add_argument("--docs", type=Path, help="also write the report between the page's drafts markers")
    args = parser.parse_args(argv)
    if not args.report:
        if (args.out / "drafts.jsonl").exists():
            raise SystemExit(f"{args.out} holds an earlier run's replays: use another --out, or --report")
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "command.txt").write_text(
            "python benchmarks/drafts.py " + " ".join(argv if argv is not None else sys.argv[1:]) + "\n",
            encoding="utf-8",
        )
        # The run is recorded on a server of its own: every arm's server starts with an empty prompt cache.
        recorder = start_server(args.model, [])
        try:
            sent = record(args, recorder)
        finally:
            recorder.stop()
        print(f"# recorded {len(sent)} requests", flush=True)
        servers = {arm: start_server(args.model, ARMS[arm]) for arm in args.arms}
        try:
            for turn in range(args.passes):
                order = args.arms[turn % len(args.arms) :] + args.arms[: turn % len(args.arms)]
                for arm in order:
                    row = {"pass": turn, "arm": arm, **replay(args, servers[arm], sent)}
                    append_jsonl(args.out / "drafts.jsonl", [row])
                    print(f"# pass {turn} {arm}: {row['wall']:.0f} s", flush=True)
        finally:
            for server in servers.values():
                server.stop()
    text = report(args.out)
    print(text)
    if args.docs:
        write_between_markers(args.docs, "drafts", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
