"""The ``ragsuite`` command line. Each command lives in its own module exposing ``register(subparsers)``;
the handler it sets with ``set_defaults(func=...)`` takes the parsed namespace and returns an exit code."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from ragsuite import __version__
from ragsuite.errors import RagsuiteError
from ragsuite.redaction import install_log_redaction, redact

# In the order ``ragsuite --help`` lists them.
COMMAND_MODULES = (
    "ragsuite.cli.eval",
    "ragsuite.cli.report",
    "ragsuite.cli.bench",
    "ragsuite.cli.compile",
    "ragsuite.cli.tune",
    "ragsuite.cli.align",
    "ragsuite.cli.classifier",
    "ragsuite.cli.index",
    "ragsuite.cli.retrieve_eval",
    "ragsuite.cli.serve",
    "ragsuite.cli.serve_retriever",
    "ragsuite.cli.data",
)

log = logging.getLogger("ragsuite")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragsuite",
        description="Run, compile and tune adaptive RAG programs (DeepNote, HANRAG, BlendFilter, ...).",
    )
    parser.add_argument("--version", action="version", version=f"ragsuite {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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


if __name__ == "__main__":
    sys.exit(main())
