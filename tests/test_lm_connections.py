"""An LM keeps as many requests in flight as its connection setting allows: past DSPy's own 100 when asked
(``build_lm(max_connections=N)``, ``--max-connections``), and by default enough for ``--threads``."""

from __future__ import annotations

import argparse
import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from ragsuite.errors import ConfigError
from ragsuite.lm import build_lm
from ragsuite.testing.openai_server import LocalOpenAIServer

# Long enough for a busy machine to deliver every request; reached only when a test is about to fail.
GATE_TIMEOUT = 10.0


class InFlight:
    """A responder that holds each request until ``target`` are in flight at once (or the gate's timeout),
    and records the most it saw at once."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.now = 0
        self.peak = 0
        self._lock = threading.Lock()
        self._reached = threading.Event()

    def __call__(self, request: object) -> dict[str, str]:
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
            if self.now >= self.target:
                self._reached.set()
        try:
            self._reached.wait(GATE_TIMEOUT)
            return {"answer": "ok"}
        finally:
            with self._lock:
                self.now -= 1


def lm_for(server: LocalOpenAIServer, **kwargs: object):
    return build_lm("openai/scripted", api_base=server.api_base, cache=False, retries=0, timeout=60, **kwargs)


def call_at_once(lm, count: int) -> list:
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda i: lm(f"q{i}"), range(count)))


def test_an_lm_keeps_more_than_100_requests_in_flight_when_asked():
    gate = InFlight(150)
    with LocalOpenAIServer(gate) as server:
        lm = lm_for(server, max_connections=150)
        try:
            outputs = call_at_once(lm, 150)
        finally:
            lm.close()
    assert len(outputs) == 150
    assert gate.peak == 150


def test_an_lm_keeps_no_more_requests_in_flight_than_its_connections():
    gate = InFlight(4)
    with LocalOpenAIServer(gate) as server:
        lm = lm_for(server, max_connections=4)
        try:
            call_at_once(lm, 8)
        finally:
            lm.close()
    assert gate.peak == 4


def test_async_calls_keep_more_than_100_requests_in_flight_when_asked():
    gate = InFlight(120)

    async def ask_all(lm) -> list:
        try:
            return await asyncio.gather(*(lm.acall(f"q{i}") for i in range(120)))
        finally:
            await lm.aclose()

    with LocalOpenAIServer(gate) as server:
        outputs = asyncio.run(ask_all(lm_for(server, max_connections=120)))
    assert len(outputs) == 120
    assert gate.peak == 120


def test_each_lm_has_its_own_connection_setting():
    """The setting belongs to the LM built with it: another LM, built without it, keeps DSPy's default."""
    narrow_gate, default_gate = InFlight(2), InFlight(6)
    with LocalOpenAIServer(narrow_gate) as server:
        narrow, default = lm_for(server, max_connections=2), lm_for(server)
        try:
            call_at_once(narrow, 6)
            server.responder = default_gate
            call_at_once(default, 6)
        finally:
            narrow.close()
            default.close()
    assert (narrow_gate.peak, default_gate.peak) == (2, 6)


@pytest.mark.parametrize("bad", [0, -5])
def test_a_connection_limit_below_one_is_refused(bad):
    with pytest.raises(ConfigError, match="max_connections must be >= 1"):
        build_lm("openai/scripted", api_base="http://127.0.0.1:9/v1", max_connections=bad)


@pytest.mark.parametrize(
    ("threads", "expected"),
    [(1, 100), (8, 100), (25, 100), (64, 256), (256, 1024)],
)
def test_the_default_connection_limit_follows_the_threads(threads, expected):
    from ragsuite.cli.args import default_max_connections

    assert default_max_connections(threads) == expected


def parse(argv: list[str]) -> argparse.Namespace:
    from ragsuite.cli.eval import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["eval", "--out", "unused", *argv])


def test_eval_builds_its_lms_with_connections_for_its_threads(monkeypatch):
    from ragsuite.cli import args as cli_args

    built: list[int | None] = []

    def fake_build_lm(spec, **kwargs):
        built.append(kwargs.get("max_connections"))
        return object()

    monkeypatch.setattr("ragsuite.lm.build_lm", fake_build_lm)
    monkeypatch.setattr("ragsuite.lm.check_endpoint", lambda *a, **k: None)
    common = ["--program", "vanilla", "--dataset", "hotpotqa", "--lm", "vllm:m@http://127.0.0.1:9/v1"]
    cli_args.build_lms(
        parse([*common, "--threads", "256", "--stage-lm", "answer=vllm:n@http://127.0.0.1:9/v1"])
    )
    cli_args.build_lms(parse([*common, "--threads", "256", "--max-connections", "40"]))
    assert built == [1024, 1024, 40]


@pytest.mark.parametrize("value", ["0", "many"])
def test_the_connection_flag_takes_a_whole_number_of_at_least_one(value, capsys):
    with pytest.raises(SystemExit):
        parse(["--program", "vanilla", "--max-connections", value])
    assert "--max-connections" in capsys.readouterr().err
