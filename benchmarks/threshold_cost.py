"""LM requests of a threshold-only tuning trial, next to the first trial, with DSPy's response cache on.

A threshold decides from probabilities the LM has already stated, so a trial that changes only thresholds
(same integer and categorical knobs) repeats the requests of an earlier trial up to the first decision that
flips; DSPy's cache answers those, and only the requests after a flipped decision reach the LM. This script
measures how many that leaves, counted where they arrive: at the local OpenAI-compatible server
(``ragsuite.testing.openai_server``), which answers a scripted HANRAG world through the real ``dspy.LM``
HTTP client.

The world: each question has 2 gold passages and 3 distractors; the router states probabilities that route
half the questions single-step and half to the complex loop; the filter states P(relevant) 0.8 for gold
passages and 0.55-0.65 for distractors; EndCheck states P(enough) 0.35 after one hop and 0.65 after two.
One study runs ``ragsuite.optimizers.tune`` (the build-and-evaluate path of ``ragsuite tune``) with HANRAG in
probability mode:

1. the first trial: filter_threshold 0.5, end_threshold 0.5 (the LM's own verdicts);
2. a threshold-only trial: filter_threshold 0.7, end_threshold 0.3 (same top_k, keep, max_hops, filter_mode);
3. the first trial's knobs again (every request should be a cache hit).

Then the first two trials run again on a fresh study with the cache off, for the requests they cost without
it. Tune's first trial holds the program's default knobs, so the first trial here has the default thresholds.

Usage:
    python benchmarks/threshold_cost.py [--questions 20] [--threads 4]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, ClassVar

# Hermetic: litellm's offline cost map, and DSPy's disk cache in a fresh folder (set before DSPy is imported).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ["DSPY_CACHEDIR"] = tempfile.mkdtemp(prefix="threshold-cost-cache-")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FIXED = {"top_k": 5, "keep": 3, "max_hops": 3, "filter_mode": "per_passage", "decisions": "probability"}
FIRST = {"filter_threshold": 0.5, "end_threshold": 0.5}
THRESHOLD_ONLY = {"filter_threshold": 0.7, "end_threshold": 0.3}
_NUMBER = re.compile(r"question (\d+)")


def _number(text: str) -> int:
    found = _NUMBER.search(text)
    return int(found.group(1)) if found else 0


def world(questions: int) -> tuple[list[Any], Any, Any]:
    """Examples, a retriever and a responder for the scripted HANRAG world (see the module docstring)."""
    import dspy

    from ragsuite.retrieval.base import Passage
    from ragsuite.testing.retrievers import ListRetriever

    corpus = []
    for i in range(questions):
        gold = [Passage(f"g{i}{s}", f"Gold {i}{s}", f"question {i} gold fact {s}: answer{i}") for s in "ab"]
        corpus += gold
        corpus += [Passage(f"n{i}{s}", f"Noise {i}{s}", f"question {i} distractor {s}") for s in "abc"]
    order = {i: [f"g{i}a", f"n{i}a", f"n{i}b", f"g{i}b", f"n{i}c"] for i in range(questions)}
    retriever = ListRetriever(corpus, lambda query, k: order[_number(query)][:k])
    distractor = {"a": 0.55, "b": 0.6, "c": 0.65}

    def respond(request: Any) -> dict[str, Any]:
        fields = request.output_fields
        inputs = request.inputs
        i = _number(inputs.get("question", ""))
        if "category" in fields:
            complex_first = i % 2 == 1
            probabilities = {
                "straightforward": 0.05,
                "single-step": 0.25 if complex_first else 0.6,
                "compound": 0.1,
                "complex": 0.6 if complex_first else 0.25,
            }
            return {"category": {"probabilities": probabilities, "confidence": 0.6}}
        if "relevant" in fields:
            passage = inputs["passage"]
            gold = "gold fact" in passage
            return {"relevant": {"noul": 0.8 if gold else distractor[passage.split("distractor ")[1][0]]}}
        if "seed_question" in fields:
            hop = inputs.get("steps", "").count("Seed question") + 1
            return {"seed_question": f"question {i} seed {hop}"}
        if "enough" in fields:
            hops = inputs.get("steps", "").count("Seed question")
            return {"enough": {"noul": 0.35 if hops <= 1 else 0.65}}
        if "sub_questions" in fields:
            return {"sub_questions": [f"question {i} part 1", f"question {i} part 2"]}
        shown = " ".join(v for k, v in inputs.items() if k != "question")
        right = f"answer{i}" in shown and "distractor" not in shown
        return {"answer": f"answer{i}" if right else "unknown"}

    examples = [
        dspy.Example(id=f"q{i}", question=f"What does question {i} ask?", answers=[f"answer{i}"]).with_inputs(
            "question"
        )
        for i in range(questions)
    ]
    return examples, retriever, respond


def planned(plan: list[dict[str, Any]]) -> type:
    """HANRAG whose trial ``n`` takes the thresholds ``plan[n]``: each trial enqueues the next one's (trial 0
    is tune's own enqueued trial at the defaults, which ``plan[0]`` must be)."""
    from ragsuite.programs.hanrag import HANRAG

    class PlannedHANRAG(HANRAG):
        name: ClassVar[str] = "hanrag"

        @classmethod
        def search_space(cls, trial: Any) -> dict[str, Any]:
            if trial.number + 1 < len(plan):
                trial.study.enqueue_trial(plan[trial.number + 1])
            knobs = {k: trial.suggest_float(k, 0.05, 0.95) for k in plan[trial.number]}
            if knobs != plan[trial.number]:
                raise RuntimeError(f"trial {trial.number} took {knobs}, not the planned {plan[trial.number]}")
            return knobs

    return PlannedHANRAG


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=20, help="validation questions (default 20)")
    parser.add_argument("--threads", type=int, default=4, help="examples evaluated at once (default 4)")
    args = parser.parse_args()
    if args.questions < 1 or args.threads < 1:
        parser.error("--questions and --threads must be >= 1")

    import dspy
    import optuna

    from ragsuite.lm import build_lm
    from ragsuite.optimizers import tune
    from ragsuite.testing.openai_server import LocalOpenAIServer

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    examples, retriever, respond = world(args.questions)
    plan = [FIRST, THRESHOLD_ONLY, FIRST]

    def run(server: Any, knobs: list[dict[str, Any]], *, cache: bool) -> list[tuple[int, float]]:
        """(requests at the server, quality) per trial of one study."""
        lm = build_lm("openai/scripted", api_base=server.api_base, cache=cache, retries=0)
        counts: list[int] = []

        def evaluate_counting(*a: Any, **kw: Any) -> Any:
            from ragsuite.evaluation import evaluate

            before = server.chat_requests
            result = evaluate(*a, **kw)
            counts.append(server.chat_requests - before)
            return result

        result = tune(
            planned(knobs),
            dataset="hotpotqa",
            valset=examples,
            retriever=retriever,
            lm=lm,
            trials=len(knobs),
            threads=args.threads,
            evaluate_fn=evaluate_counting,
            program_kwargs=FIXED,  # held, not tuned: every trial has the same integer knobs
            quality_metric="f1",
        )
        qualities = [t.values[0] for t in sorted(result.study.trials, key=lambda t: t.number)]
        return list(zip(counts, qualities, strict=True))

    with LocalOpenAIServer(respond) as server:
        cached = run(server, plan, cache=True)
    with LocalOpenAIServer(respond) as server:
        uncached = run(server, plan[:2], cache=False)

    (first, q_first), (threshold_only, q_threshold), (repeat, _) = cached
    print(f"scripted HANRAG world, {args.questions} questions, {FIXED}, DSPy cache on (in memory)")
    print(f"first trial           {FIRST}: {first} LM requests at the server (F1 {q_first:.2f})")
    print(
        f"threshold-only trial  {THRESHOLD_ONLY}: {threshold_only} LM requests "
        f"({threshold_only / first:.1%} of the first trial's) (F1 {q_threshold:.2f})"
    )
    print(f"  with the cache off, the same two trials send {uncached[0][0]} and {uncached[1][0]} LM requests")
    print(f"first trial's knobs again: {repeat} LM requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
