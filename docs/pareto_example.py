"""Reproduce docs/pareto.png: a ``ragsuite tune`` run against a scripted LM, no real model involved.

The scripted LM is served over the OpenAI API on 127.0.0.1 by ``ragsuite.testing.openai_server``. It is
"grounded": it answers a question correctly only when the gold answer appears in the evidence (passages or
notes) the prompt shows it, accepts a DeepNote note update only when the update contains the gold answer,
and writes notes that copy the evidence. Retrieval is real (BM25 over the HotpotQA dev corpus), so the knobs
change both quality and cost; the scores say nothing about any real LM.

Usage:
    python docs/pareto_example.py [--trials 30] [--val 30] [--out runs/pareto-example]
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path
from typing import Any

from ragsuite.cli import main
from ragsuite.data.datasets import load_dataset
from ragsuite.testing.openai_server import LocalOpenAIServer
from ragsuite.testing.scripted import ScriptedRequest

_OUTPUT_FIELD = re.compile(r"^\d+\. `(\w+)` \((.*)\):", re.MULTILINE)


def grounded_responder(gold: dict[str, str]):
    def respond(request: ScriptedRequest) -> dict[str, Any]:
        kinds = dict(_OUTPUT_FIELD.findall(request.system.split("Your output fields are:", 1)[-1]))
        answer = gold.get(request.inputs.get("question", ""), "")
        evidence = " ".join(v for k, v in request.inputs.items() if k != "question").lower()
        values: dict[str, Any] = {}
        for name in request.output_fields:
            kind = kinds.get(name, "str")
            if kind.startswith("Literal["):
                values[name] = re.findall(r"'([^']*)'", kind)[-1]
            elif kind == "bool":
                values[name] = str(bool(answer) and answer.lower() in evidence)
            elif kind.startswith("list"):
                # Refined queries: the titles in the note so far (a crude bridge-entity guess).
                titles = re.findall(r"\[\d+\] ([^|]{3,60}) \|", evidence)
                values[name] = [", ".join(dict.fromkeys(titles))[:200] or "background"]
            elif name == "answer":
                values[name] = answer if answer and answer.lower() in evidence else "unknown"
            else:
                values[name] = evidence[:3000] or "nothing yet"
        return values

    return respond


def run() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("Usage:")[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--val", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("runs/pareto-example"))
    args = parser.parse_args()
    gold = {ex.question: ex.answers[0] for ex in load_dataset("hotpotqa")}
    with LocalOpenAIServer(grounded_responder(gold)) as server:
        code = main(
            [
                "tune", "--program", "deepnote", "--dataset", "hotpotqa",
                "--lm", "openai/scripted", "--api-base", server.api_base, "--no-cache",
                "--trials", str(args.trials), "--objectives", "quality,tokens",
                "--val", str(args.val), "--threads", "4", "--seed", "0", "--out", str(args.out),
            ]
        )  # fmt: skip
    if code == 0:
        target = Path(__file__).resolve().parent / "pareto.png"
        shutil.copyfile(args.out / "pareto.png", target)
        print(f"copied the plot to {target}")
    return code


if __name__ == "__main__":
    raise SystemExit(run())
