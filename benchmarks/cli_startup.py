"""CPU cost of ``ragsuite --help`` and of every subcommand's ``--help``, beside ``import dspy``.

Each command runs in a fresh interpreter; its CPU time (user + system) is read from
``resource.getrusage(RUSAGE_CHILDREN)`` before and after it, so the figure is the child's own CPU whatever
the machine's load does to wall time. The commands run interleaved, ``--repeat`` rounds (after one warm-up
round that fills the OS file cache and Python's bytecode cache), and the table shows each command's median
and its ratio to the median of ``python -c "import dspy"``. The target: every help at most 0.3x.

    python benchmarks/cli_startup.py --repeat 7
    python benchmarks/cli_startup.py --max-ratio 0.3   # exit 1 when a help costs more
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "import dspy"


def help_paths() -> list[tuple[str, ...]]:
    """Every command path of the parser: (), ("eval",), ("align", "build"), ..."""
    sys.path.insert(0, str(ROOT))
    from ragsuite.cli import build_parser

    def walk(parser: argparse.ArgumentParser, prefix: tuple[str, ...]) -> list[tuple[str, ...]]:
        found = [prefix]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found += walk(sub, (*prefix, name))
        return found

    return walk(build_parser(), ())


def child_cpu(argv: list[str]) -> float:
    """CPU seconds (user + system) that running ``argv`` to completion cost."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="measured rounds (default 5)")
    parser.add_argument(
        "--max-ratio", type=float, help="exit 1 when a help costs more than this times import dspy"
    )
    args = parser.parse_args()

    python = sys.executable
    commands: dict[str, list[str]] = {BASELINE: [python, "-c", "import dspy"]}
    for path in help_paths():
        commands[" ".join(("ragsuite", *path, "--help"))] = [python, "-m", "ragsuite", *path, "--help"]
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # dspy's litellm must not go online

    for argv in commands.values():  # warm-up: file cache and bytecode, not measured
        child_cpu(argv)
    samples: dict[str, list[float]] = {label: [] for label in commands}
    for _ in range(args.repeat):
        for label, argv in commands.items():
            samples[label].append(child_cpu(argv))

    base = statistics.median(samples[BASELINE])
    print(f"{'command':40s} {'CPU median (ms)':>16s} {'min':>8s} {'max':>8s} {'x import dspy':>14s}")
    worst = 0.0
    for label, values in samples.items():
        ratio = statistics.median(values) / base
        if label != BASELINE:
            worst = max(worst, ratio)
        print(
            f"{label:40s} {1000 * statistics.median(values):16.0f} {1000 * min(values):8.0f} "
            f"{1000 * max(values):8.0f} {ratio:14.2f}"
        )
    print(f"\n{args.repeat} rounds, {python}; worst help: {worst:.2f}x import dspy")
    if args.max_ratio is not None and worst > args.max_ratio:
        print(f"FAIL: a help costs more than {args.max_ratio}x import dspy", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
