"""Fixtures of the benchmark scripts' tests: synthetic records of a run, and a report written into a page."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def run_facts() -> Callable[..., dict]:
    """``run_facts(packages, **records)``: a benchmark's synthetic records, as its ``--out`` writes them:
    ``records`` (benchmark, command, wall_s, settings, rows) with a date and where the run ran: 2 cores,
    load average 1.25/1.0/0.5 at its start and 1.5/1.1/0.6 after, nice 10, Python 3.11.7, and ``packages``
    (name -> version; None: not installed)."""

    def make(packages: dict[str, str | None], **records: object) -> dict:
        machine = {
            "cpus": 2,
            "cpus_usable": 2,
            "load_average": [1.25, 1.0, 0.5],
            "nice": 10,
            "python": "3.11.7",
            "platform": "Linux",
            "packages": packages,
        }
        return {"date": "2026-01-01", **records, "machine": machine, "load_average_after": [1.5, 1.1, 0.6]}

    return make


@pytest.fixture
def report_into_page(tmp_path: Path) -> Callable[[Callable[[list[str]], int], Path, str], str]:
    """``report_into_page(main, records, name)``: the page ``main(["--report", records, "--docs", page])``
    writes from ``a``, ``name``'s markers around ``old``, and ``b``, once it refused a page without them."""

    def write(main: Callable[[list[str]], int], records: Path, name: str) -> str:
        page = tmp_path / "page.md"
        page.write_text("# no markers\n")
        with pytest.raises(SystemExit, match=f"{name}:start"):
            main(["--report", str(records), "--docs", str(page)])
        page.write_text(f"a\n<!-- {name}:start -->\nold\n<!-- {name}:end -->\nb\n")
        assert main(["--report", str(records), "--docs", str(page)]) == 0
        return page.read_text()

    return write
