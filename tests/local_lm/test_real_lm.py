"""Every program with a real language model: the packaged local LM (``--lm local``), served once per module.

These tests assert what must hold for any model, however small: the run completes, its records and summary
are written, every stage's reply was parsed or its fallback recorded and counted, the token ledger equals the
server's own count, and a run killed midway resumes without losing or repeating a question. They are marked
``real_lm`` and skipped, with the install command, where the model is not installed. The engine is the
fastest found (llama.cpp's llama-server where built, else transformers); completions are capped at
``MAX_TOKENS`` so that the whole matrix fits CI's time on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ragsuite.cli import main
from ragsuite.errors import MissingExtraError
from ragsuite.local_lm.models import PACKAGED_MODELS, ModelFileError
from ragsuite.processes import stop_process

pytestmark = [pytest.mark.real_lm, pytest.mark.slow]

MAX_TOKENS = "128"


def _model_installed() -> str | None:
    try:
        PACKAGED_MODELS[0].slice_paths()
    except ModelFileError as exc:
        return str(exc)
    return None


_MISSING = _model_installed()
if _MISSING:
    pytest.skip(f"real-LM tests: {_MISSING}", allow_module_level=True)


@pytest.fixture(scope="module")
def server() -> Any:
    """The local server for the program matrix: llama.cpp, which ``ragsuite serve --local --build`` builds.
    The transformers engine runs it only when ``RAGSUITE_TEST_LOCAL_ENGINE=transformers`` asks (it takes
    several times as long)."""
    from ragsuite.local_lm import LocalServer, resolve_model
    from ragsuite.local_lm.server import find_llama_server

    engine = os.environ.get("RAGSUITE_TEST_LOCAL_ENGINE", "llama.cpp")
    if engine == "llama.cpp" and find_llama_server() is None:
        pytest.skip("real-LM tests: no llama-server; build it with `ragsuite serve --local --build`")
    try:
        local = LocalServer(resolve_model("local"), engine=engine)
    except MissingExtraError as exc:
        pytest.skip(f"real-LM tests: {exc}")
    with local:
        yield local


def server_totals(server: Any) -> tuple[int, int]:
    """(prompt tokens, generated tokens) the server has evaluated so far, from its own metrics.

    Prompt tokens it reused from a slot's cache (the shared start of DSPy's prompts) are not evaluated again,
    and llama-server does not always count them as cached: a request's usage can exceed the evaluated count
    by those, never fall below it."""
    base = server.api_base.removesuffix("/v1")
    request = urllib.request.Request(f"{base}/metrics", headers={"Authorization": f"Bearer {server.api_key}"})
    with urllib.request.urlopen(request, timeout=10) as reply:
        text = reply.read().decode()

    def total(name: str) -> int:
        match = re.search(rf"^llamacpp:{name}\s+([0-9.e+]+)$", text, re.MULTILINE)
        assert match, f"{name} missing from the server's metrics:\n{text}"
        return int(float(match.group(1)))

    return total("prompt_tokens_total"), total("tokens_predicted_total")


def eval_command(server: Any, out: Path, program: str, dataset: str, *extra: str) -> list[str]:
    return [
        "eval",
        "--program", program,
        "--dataset", dataset,
        "--lm", "local",
        "--api-base", server.api_base,
        "--max-tokens", MAX_TOKENS,
        "--no-cache",
        "--no-progress",
        "--out", str(out),
        *extra,
    ]  # fmt: skip


def _field(entry: Any, name: str) -> Any:
    return entry[name] if isinstance(entry, dict) else getattr(entry, name)


def records_of(out: Path) -> list[dict[str, Any]]:
    path = out / "records.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_local_model_answers_a_grounded_question_with_logprobs(server: Any) -> None:
    from ragsuite.lm import build_lm

    lm = build_lm("local", api_base=server.api_base, temperature=0.0, max_tokens=32, cache=False)
    before = server_totals(server)
    reply = lm(
        messages=[
            {"role": "system", "content": "Answer with a year only."},
            {"role": "user", "content": "The Eiffel Tower was completed in 1889. When was it completed?"},
        ],
        logprobs=True,
        top_logprobs=2,
    )
    after = server_totals(server)
    text = reply[0]["text"] if isinstance(reply[0], dict) else reply[0]
    assert "1889" in text
    assert after[0] > before[0] and after[1] > before[1]
    usage = lm.history[-1]["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
        after[0] - before[0],
        after[1] - before[1],
    )
    logprobs = reply[0]["logprobs"]  # DSPy hands them back beside the text when asked
    content = logprobs["content"] if isinstance(logprobs, dict) else logprobs.content
    assert content and all(_field(entry, "logprob") <= 0 for entry in content)


def test_the_transformers_engine_serves_the_same_file_with_usage_and_logprobs() -> None:
    from ragsuite.lm import build_lm
    from ragsuite.local_lm import LocalServer, resolve_model

    try:
        local = LocalServer(resolve_model("local"), engine="transformers")
    except MissingExtraError as exc:
        pytest.skip(f"transformers engine: {exc}")
    with local:
        lm = build_lm("local", api_base=local.api_base, temperature=0.0, max_tokens=16, cache=False)
        before = server_totals(local)
        reply = lm(
            messages=[
                {"role": "user", "content": "The Eiffel Tower was completed in 1889. When? Year only."}
            ],
            logprobs=True,
            top_logprobs=2,
        )
        after = server_totals(local)
    text = reply[0]["text"] if isinstance(reply[0], dict) else reply[0]
    assert "1889" in text
    usage = lm.history[-1]["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
        after[0] - before[0],
        after[1] - before[1],
    )
    logprobs = reply[0]["logprobs"]
    entries = logprobs["content"] if isinstance(logprobs, dict) else logprobs.content
    assert len(entries) == usage["completion_tokens"]
    assert all(len(_field(entry, "top_logprobs")) == 2 for entry in entries)


PROGRAMS = [
    ("no-retrieval", "hotpotqa"),
    ("vanilla", "hotpotqa"),
    ("deepnote", "hotpotqa"),
    ("adaptive-note", "hotpotqa"),
    ("deepnote-no-adaptive", "hotpotqa"),
    ("deepnote-no-adaptive-no-note", "hotpotqa"),
    ("hanrag", "hotpotqa"),
    ("blendfilter", "hotpotqa"),
    ("diverse-rerank", "hotpotqa"),
    ("ircot", "hotpotqa"),
    ("adaptive-retrieval", "hotpotqa"),
    ("con", "hotpotqa"),
    ("rat", "hotpotqa"),
    ("react", "hotpotqa"),
    ("flare-instruct", "asqa"),
    ("flare-direct", "asqa"),
    ("self-rag-prompted", "hotpotqa"),
    ("vanilla", "asqa"),
    ("vanilla", "strategyqa"),
]


#: Fewer steps and passages than the papers' defaults, so that the whole matrix fits CI's time on 2 cores;
#: every stage of each program still runs.
BOUNDED = {
    "deepnote": ["max_step=1", "top_k=2"],
    "adaptive-note": ["max_step=1", "top_k=2"],
    "deepnote-no-adaptive": ["top_k=2"],
    "hanrag": ["max_hops=1", "top_k=3", "keep=2"],
    "blendfilter": ["top_k=2"],
    "diverse-rerank": ["pool_k=6", "n=3", "declare_top=3"],
    "ircot": ["max_steps=2"],
    "con": ["top_k=2"],
    "rat": ["max_thoughts=2", "top_k=2"],
    "react": ["max_iters=3"],
    "flare-instruct": ["max_steps=2"],
    "flare-direct": ["max_steps=2"],
    "self-rag-prompted": ["top_k=2"],
}


#: Programs whose stages all have plain outputs: on llama.cpp each uses the JSON adapter with its schema.
HELD_TO_SCHEMA = {"no-retrieval", "vanilla", "deepnote", "adaptive-note", "hanrag", "blendfilter"}


@pytest.mark.parametrize(("program", "dataset"), PROGRAMS)
def test_every_program_completes_with_the_real_model(
    server: Any, program: str, dataset: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = server_totals(server)
    knobs = [flag for knob in BOUNDED.get(program, []) for flag in ("--set", knob)]
    code = main(eval_command(server, tmp_path, program, dataset, "--limit", "1", *knobs))
    after = server_totals(server)
    output = capsys.readouterr()
    records = records_of(tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(records) == 1 and summary["n"] == 1, output.err
    record = records[0]
    # The run completed: the question was answered, or its failure recorded (and the exit code says so).
    assert code == (1 if record.get("error") else 0), output.err
    assert not record.get("error"), f"{program}: {record.get('error')}"
    cost = summary["cost"]
    # The ledger holds every token the server generated for this run, no more and no fewer, and every
    # prompt token it evaluated (plus those it reused from its cache).
    assert cost["output_tokens"] == after[1] - before[1] > 0
    assert cost["input_tokens"] >= after[0] - before[0] > 0
    # Every stage reply was parsed, or its fallback recorded in the trace and counted.
    fallbacks = [step for step in record.get("trace", []) if "fallback" in step]
    assert record["stats"]["fallbacks"] == len(fallbacks)
    assert cost["fallbacks"] == record["stats"]["fallbacks"]
    calls = record["stage_calls"]
    assert sum(calls.values()) >= 1
    if program in HELD_TO_SCHEMA:
        # Each stage's reply is held to its schema on llama.cpp: DSPy never has to ask a second time.
        assert record["tokens"]["requests"] == sum(calls.values()), calls
    for stage, count in Counter(step["stage"] for step in fallbacks).items():
        assert count <= calls.get(stage, count), f"{stage}: more fallbacks than calls"


@pytest.mark.parametrize("route", ["straightforward", "single-step", "compound", "complex"])
def test_every_hanrag_route_completes_with_the_real_model(server: Any, route: str) -> None:
    import asyncio

    import dspy

    from ragsuite import programs
    from ragsuite.data.datasets import load_dataset
    from ragsuite.lm import build_lm
    from ragsuite.retrieval.spec import build_retriever

    example = load_dataset("hotpotqa", split="dev")[0]
    retriever = build_retriever("bm25:hotpotqa")
    program = programs.get("hanrag")(retriever=retriever, max_hops=1, top_k=3, keep=2)
    lm = build_lm("local", api_base=server.api_base, max_tokens=int(MAX_TOKENS), cache=False)
    with dspy.context(lm=lm):
        ledger = program.start(example.question)
        prediction = asyncio.run(program._run_route(ledger, example.question, route))
    assert prediction.route == route
    assert isinstance(prediction.answer, str)
    assert prediction.stats["lm_calls"] == sum(prediction.stage_calls.values()) >= 1
    # The straightforward route answers from the LM alone; every other route retrieves.
    assert (prediction.stats["retrievals"] == 0) == (route == "straightforward")


def test_a_run_killed_midway_resumes_without_losing_or_repeating_a_question(
    server: Any, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "ragsuite",
        *eval_command(server, out, "vanilla", "hotpotqa", "--limit", "3"),
    ]
    # Another process finds the server's key where `ragsuite serve --local` users put it.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAGSUITE_LOCAL_API_KEY": server.api_key}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 600
        # The event is the first record reaching the file; its appearance is polled with a deadline.
        while not records_of(out) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert records_of(out), "the run wrote no record"
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        stop_process(process)
    kept = records_of(out)
    assert 1 <= len(kept) <= 3
    assert main(eval_command(server, out, "vanilla", "hotpotqa", "--limit", "3")) == 0
    records = records_of(out)
    assert len(records) == 3 and len({r["id"] for r in records}) == 3
    assert records[: len(kept)] == kept  # what was written before the kill is kept as it was


def test_the_server_log_times_every_request_for_the_overhead_benchmark(
    server: Any, tmp_path: Path, load_benchmark
) -> None:
    """``benchmarks/real_lm.py overhead`` reads when a slot took and let go of each request from the
    timestamped log of llama-server: this one's log must give one interval per LM request, inside the run."""
    if server.engine != "llama.cpp":
        pytest.skip("the busy time comes from llama-server's log")
    bench = load_benchmark("real_lm")
    offset = server.log_file.stat().st_size
    started = time.perf_counter()
    assert main(eval_command(server, tmp_path, "vanilla", "nq", "--limit", "2")) == 0
    wall = time.perf_counter() - started
    busy, summed, served = bench.server_busy(server, offset)
    assert served == sum(record["tokens"]["requests"] for record in records_of(tmp_path)) == 2
    assert 0 < busy <= summed + 1e-6
    assert busy <= wall
