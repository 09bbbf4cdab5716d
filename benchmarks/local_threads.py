"""The local LM's threads: how fast llama-server reads prompts and generates tokens with N threads for each.

Starts the built ``llama-server`` on the default local model once per setting, sends as many requests at once
as it has slots (the same long prompt, the prompt cache off, a fixed number of generated tokens), and prints
each setting's wall seconds and the server's own prompt and generation rates per slot. ``--busy N`` runs N
processes that spin on the CPU during the measurement, as other work on a shared machine does.

What it showed on 2 cores (two slots): quiet, generating on 1 thread was as fast as on 2 (10-11 tokens a
second per slot) while reading prompts on 2 threads was 1.7x faster than on 1; with other processes on the
cores, 2 generating threads fell under 1 token a second and 1 thread kept 12-16. Hence the default: prompts
read on every core, tokens generated on half of them (:func:`ragsuite.local_lm.server.plan_settings`).

Example:
    python benchmarks/local_threads.py --settings 2,2 1,2 1,1
    python benchmarks/local_threads.py --settings 2,2 1,1 --busy 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "Summarize: " + " ".join(
    f"The river number {i} flows to the sea past the town of Ville{i}." for i in range(40)
)


def spin(seconds: float) -> None:
    """Keep one core busy for ``seconds`` (a stand-in for other work on the machine)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def measure(
    executable: Path, model: Path, *, threads: int, batch_threads: int, slots: int, rounds: int
) -> dict:
    """One setting: ``rounds`` rounds of ``slots`` requests at once; wall seconds and per-slot rates."""
    from ragsuite.local_lm.server import free_port

    port = free_port()
    command = [
        str(executable), "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
        "--ctx-size", str(4096 * slots), "--parallel", str(slots), "--threads", str(threads),
        "--threads-batch", str(batch_threads), "--no-webui",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                urllib.request.urlopen(f"{base}/health", timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        walls, rates = [], []
        for round_ in range(rounds):
            timings: list[dict] = []

            def ask(k: int, round_: int = round_, timings: list[dict] = timings) -> None:
                body = {
                    "messages": [{"role": "user", "content": f"{PROMPT} ({round_}-{k})"}],
                    "max_tokens": 96, "temperature": 0, "cache_prompt": False, "ignore_eos": True,
                }  # fmt: skip
                request = urllib.request.Request(
                    f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
                    headers={"Content-Type": "application/json"},
                )  # fmt: skip
                with urllib.request.urlopen(request, timeout=900) as reply:
                    timings.append(json.loads(reply.read())["timings"])

            started = time.perf_counter()
            workers = [threading.Thread(target=ask, args=(k,)) for k in range(slots)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            walls.append(time.perf_counter() - started)
            rates += [(t["prompt_per_second"], t["predicted_per_second"]) for t in timings]
        return {
            "threads": threads, "batch_threads": batch_threads, "slots": slots,
            "wall_s": [round(w, 1) for w in walls],
            "prompt_tok_s": round(sum(r[0] for r in rates) / len(rates), 1),
            "generate_tok_s": round(sum(r[1] for r in rates) / len(rates), 1),
        }  # fmt: skip
    finally:
        process.terminate()
        process.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--settings", nargs="+", default=["2,2", "1,2", "1,1"],
        help="GENERATE,READ thread pairs, each measured in turn (default: 2,2 1,2 1,1)",
    )  # fmt: skip
    parser.add_argument("--slots", type=int, default=2, help="slots, and requests sent at once (default 2)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per setting (default 2)")
    parser.add_argument("--busy", type=int, default=0, help="processes spinning on the CPU meanwhile")
    parser.add_argument("--model", default="local", help="local, local:NAME or local:PATH (default local)")
    args = parser.parse_args(argv)
    from ragsuite.local_lm import resolve_model
    from ragsuite.local_lm.server import find_llama_server

    executable = find_llama_server()
    if executable is None:
        raise SystemExit("no llama-server: build it with `ragsuite serve --local --build`")
    model = resolve_model(args.model).path
    print(f"# {os.cpu_count()} cores, {args.slots} slots, {args.busy} busy processes", flush=True)
    spinners = [multiprocessing.Process(target=spin, args=(3600.0,), daemon=True) for _ in range(args.busy)]
    for spinner in spinners:
        spinner.start()
    try:
        for setting in args.settings:
            threads, batch_threads = (int(part) for part in setting.split(","))
            result = measure(
                executable, model, threads=threads, batch_threads=batch_threads, slots=args.slots,
                rounds=args.rounds,
            )  # fmt: skip
            print(json.dumps(result), flush=True)
    finally:
        for spinner in spinners:
            spinner.terminate()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
