"""The Pareto plot of docs/optimizing.md: `ragsuite tune` against a scripted LM, no real model involved.

The scripted LM is served over the OpenAI API on 127.0.0.1 by ``ragsuite.testing.openai_server``. It is
"grounded": it answers a question correctly only when the gold answer appears in the evidence (passages or
notes) the prompt shows it, accepts a DeepNote note update only when the update contains the gold answer,
and writes notes that copy the evidence. Retrieval is real (BM25 over the HotpotQA dev corpus), so the knobs
change both quality and cost; the scores say nothing about any real LM.

Everything is written under ``--out``; the plot is ``OUT/<study>/pareto.png`` (the command prints its path).
``docs/pareto.png`` was made with ``--data-dir`` on a 300-question HotpotQA dev sample; on the committed
fixtures (the default, 40 questions) the front differs.

Usage:
    python docs/pareto_example.py [--trials 30] [--val 30] [--data-dir tests/fixtures/data]
        [--out runs/pareto-example]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ragsuite.cli import main
from ragsuite.data.datasets import load_dataset
from ragsuite.optimizers.tuning import study_dir_name
from ragsuite.testing.openai_server import LocalOpenAIServer
from ragsuite.testing.responders import grounded_responder

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "data"


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("Usage:")[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--val", type=int, default=30)
    parser.add_argument(
        "--data-dir", type=Path, default=FIXTURES, help="datasets (default: the test fixtures)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("runs/pareto-example"), help="the tune output folder"
    )
    args = parser.parse_args(argv)
    gold = {ex.question: ex.answers[0] for ex in load_dataset("hotpotqa", data_dir=args.data_dir)}
    with LocalOpenAIServer(grounded_responder(gold)) as server:
        code = main(
            [
                "tune", "--program", "deepnote", "--dataset", "hotpotqa", "--data-dir", str(args.data_dir),
                "--lm", "openai/scripted", "--api-base", server.api_base, "--no-cache",
                "--trials", str(args.trials), "--objectives", "quality,tokens",
                "--val", str(args.val), "--threads", "4", "--seed", "0", "--out", str(args.out),
            ]
        )  # fmt: skip
    plot = args.out / study_dir_name("deepnote-hotpotqa-quality+tokens") / "pareto.png"
    if code == 0 and plot.is_file():
        print(f"the plot: {plot}")
    return code


if __name__ == "__main__":
    raise SystemExit(run())
