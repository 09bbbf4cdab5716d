"""The ``ragsuite`` command line. Each command lives in its own module exposing ``register(subparsers)``;
the handler it sets with ``set_defaults(func=...)`` takes the parsed namespace and returns an exit code.

:func:`main` builds only the parser of the command it runs (the others are listed by name and help line),
so ``ragsuite --help`` imports no command module and ``ragsuite CMD --help`` imports CMD's alone: neither
imports dspy or torch (``tests/cli/test_cli_startup.py``, ``benchmarks/cli_startup.py``).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from ragsuite import __version__
from ragsuite.errors import RagsuiteError
from ragsuite.offline import use_bundled_model_metadata
from ragsuite.redaction import install_log_redaction, redact

# (name, module, help line) in the order ``ragsuite --help`` lists them. Each help line repeats the one the
# module's register() gives; tests/cli/test_cli_startup.py keeps the two equal.
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("eval", "ragsuite.cli.eval", "evaluate a program on a dataset (parallel, resumable)"),
    (
        "report",
        "ragsuite.cli.report",
        "compare several eval runs in one table, or show a tune study's Pareto front",
    ),
    (
        "bench",
        "ragsuite.cli.bench",
        "run a paper's table (programs x datasets) and compare with the published numbers",
    ),
    ("compile", "ragsuite.cli.compile", "optimize a program's prompts and demos with a DSPy optimizer"),
    (
        "tune",
        "ragsuite.cli.tune",
        "search a program's knobs with Optuna (multi-objective, pruning, shared studies)",
    ),
    (
        "align",
        "ragsuite.cli.align",
        "build stage preference pairs (DeepNote's DNAlign) and DPO-train a model on them",
    ),
    (
        "classifier",
        "ragsuite.cli.classifier",
        "train Adaptive-RAG's query-complexity classifier from eval runs",
    ),
    (
        "index",
        "ragsuite.cli.index",
        "build the BM25 (or a ColBERTv2) index of a dataset's corpus or of --corpus FILE",
    ),
    ("retrieve-eval", "ragsuite.cli.retrieve_eval", "measure retrieval recall@k / all-gold@k on a dataset"),
    (
        "serve",
        "ragsuite.cli.serve",
        "start a vLLM server for an open model, or the embedded local LM (--local)",
    ),
    (
        "serve-retriever",
        "ragsuite.cli.serve_retriever",
        "serve a retriever over the ColBERTv2 HTTP protocol (GET/POST /api/search, GET /health)",
    ),
    (
        "data",
        "ragsuite.cli.data",
        "download the papers' datasets and corpora; list them and their sources; convert public files",
    ),
)
COMMAND_MODULES = tuple(module for _, module, _ in COMMANDS)

log = logging.getLogger("ragsuite")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``ragsuite`` parser.

    Args:
        only: Build the full parser of this command alone and list the others by name and help line
            (what :func:`main` does); ``""`` lists every command without building any. Default: all.
    """
    parser = argparse.ArgumentParser(
        prog="ragsuite",
        description="Run, compile and tune adaptive RAG programs (DeepNote, HANRAG, BlendFilter, ...).",
    )
    parser.add_argument("--version", action="version", version=f"ragsuite {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name, help_line in COMMANDS:
        if only is None or only == name:
            importlib.import_module(module_name).register(subparsers)
        else:
            subparsers.add_parser(name, help=help_line)
    return parser


def command_of(argv: Sequence[str]) -> str:
    """The command ``argv`` runs: its first word that is not an option (the top-level options take no
    value), or ``""`` when there is none."""
    return next((arg for arg in argv if not arg.startswith("-")), "")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    use_bundled_model_metadata()  # before any command imports DSPy: it would download a price map from GitHub
    parser = build_parser(only=command_of(argv))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    install_log_redaction()  # every library's log lines, not only ragsuite's, may quote a key or a URL
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except RagsuiteError as exc:
        print(f"error: {redact(str(exc))}", file=sys.stderr)
        return 2
    finally:
        # The local LM servers this command started (--lm local) end with it, also when main() is called
        # in-process; a command that never used the local LM never imported the module.
        local_servers = sys.modules.get("ragsuite.local_lm.server")
        if local_servers is not None:
            local_servers.stop_shared_servers()


if __name__ == "__main__":
    sys.exit(main())
