"""Fixtures of the ``align`` tests: the command line of an ``align build`` against a local scripted server."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ragsuite.testing.openai_server import LocalOpenAIServer


@pytest.fixture(scope="session")
def align_build_args() -> Callable[..., list[str]]:
    """``align_build_args(server, out, *extra, samples, program="deepnote", dataset="2wikimultihopqa")``: the
    argument list of an ``align build`` of ``samples`` dev questions of ``dataset`` writing to ``out``, its LM
    (and DeepNote's judge) the local ``server`` as ``openai/scripted``, without cache or retries, in two
    threads."""

    def args(
        server: LocalOpenAIServer,
        out: Path,
        *extra: str,
        samples: int,
        program: str = "deepnote",
        dataset: str = "2wikimultihopqa",
    ) -> list[str]:
        judge = (
            ["--judge-lm", "openai/scripted", "--judge-api-base", server.api_base]
            if program == "deepnote"
            else []
        )
        return [
            "align",
            "build",
            "--program",
            program,
            "--dataset",
            dataset,
            "--split",
            "dev",
            "--samples",
            str(samples),
            "--lm",
            "openai/scripted",
            "--api-base",
            server.api_base,
            *judge,
            "--no-cache",
            "--retries",
            "0",
            "--threads",
            "2",
            "--out",
            str(out),
            *extra,
        ]

    return args
