"""Every docstring example in the package runs, so a stale example fails here.

Each module of ``ragsuite`` is imported and its ``>>>`` examples run with :mod:`doctest`, in a temporary
working directory, with the committed fixtures as the data directory (``RAGSUITE_DATA``, set by conftest):
what a user with the datasets installed would see. An example that needs what a test cannot have (a
provider key, a GPU server, model weights, the papers' full corpora) is marked ``# doctest: +SKIP`` where
it is written. So that a missing mark fails fast instead of reaching out, connections beyond loopback are
refused and starting the local LM raises, both naming the mark.
"""

from __future__ import annotations

import doctest
import importlib
import io
import ipaddress
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragsuite.errors import MissingExtraError

PACKAGE = Path(__file__).resolve().parents[1] / "ragsuite"
_LOOPBACK = {"localhost", "127.0.0.1", "::1", "", None}
_MARK = "mark the example `# doctest: +SKIP`"

# Examples known to be stale in modules whose owners are changing them; strict, so that a fixed module fails
# here until its entry is removed.
KNOWN_STALE: dict[str, str] = {}


def module_names() -> list[str]:
    """Every module of the package, by its file (``__main__`` modules run the CLI on import: left out)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _needs_lookup(host: Any) -> bool:
    """Whether resolving ``host`` asks a name server (a loopback name or a numeric address does not)."""
    if host in _LOOPBACK:
        return False
    text = host.decode() if isinstance(host, bytes) else str(host)
    try:
        socket.inet_aton(text)  # also the short forms, such as "0.0"
        return False
    except OSError:
        pass
    try:
        ipaddress.ip_address(text.split("%", 1)[0])
        return False
    except ValueError:
        return True


def _refuse_remote(real_connect: Any, real_getaddrinfo: Any) -> tuple[Any, Any]:
    def connect(sock: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else None
        if sock.family in (socket.AF_INET, socket.AF_INET6) and host not in _LOOPBACK:
            raise AssertionError(f"a docstring example connected to {address}: {_MARK}")
        return real_connect(sock, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if _needs_lookup(host):
            raise AssertionError(f"a docstring example looked up {host!r}: {_MARK}")
        return real_getaddrinfo(host, *args, **kwargs)

    return connect, getaddrinfo


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A temporary working directory, no connection beyond loopback, no local LM, and the environment as it
    was afterwards (an example that sets OPENAI_API_KEY left it set, and a later test expecting "not set"
    reached for api.openai.com)."""
    from ragsuite.local_lm.server import LocalServer

    monkeypatch.chdir(tmp_path)
    connect, getaddrinfo = _refuse_remote(socket.socket.connect, socket.getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)

    def no_local_lm(self: LocalServer) -> LocalServer:
        raise AssertionError(f"a docstring example started the local LM: {_MARK}")

    monkeypatch.setattr(LocalServer, "start", no_local_lm)
    environment = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(environment)


def run_examples(name: str) -> tuple[doctest.TestResults, str]:
    """Import module ``name`` and run its examples; return the results and doctest's report."""
    try:
        module = importlib.import_module(name)
    except MissingExtraError as exc:
        pytest.skip(str(exc))
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "ragsuite":
            raise
        pytest.skip(f"{name} needs {exc.name}, an optional dependency that is not installed")
    report = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in doctest.DocTestFinder(exclude_empty=True).find(module, name):
        if test.examples:
            runner.run(test, out=report.write)
    return runner.summarize(verbose=False), report.getvalue()


@pytest.mark.usefixtures("sandbox")
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.xfail(reason=KNOWN_STALE[name], strict=True))
        if name in KNOWN_STALE
        else name
        for name in module_names()
    ],
)
def test_the_module_s_docstring_examples_run(name: str) -> None:
    results, report = run_examples(name)
    assert not results.failed, f"{results.failed} of {results.attempted} examples in {name} failed:\n{report}"


@pytest.mark.usefixtures("sandbox")
@pytest.mark.parametrize(
    "source",
    [
        'socket.create_connection(("192.0.2.1", 80), timeout=5)',
        'socket.getaddrinfo("example.com", 443)',
        'LocalServer(resolve_model("local")).start()',
    ],
)
def test_an_example_that_reaches_out_fails_naming_the_mark(source: str) -> None:
    from ragsuite.local_lm.models import resolve_model
    from ragsuite.local_lm.server import LocalServer

    globs = {"socket": socket, "LocalServer": LocalServer, "resolve_model": resolve_model}
    test = doctest.DocTestParser().get_doctest(f">>> {source}\n", globs, "reaching", None, 0)
    report = io.StringIO()
    runner = doctest.DocTestRunner()
    runner.run(test, out=report.write)
    assert runner.summarize(verbose=False).failed == 1
    assert "doctest: +SKIP" in report.getvalue()


def test_the_examples_are_found_and_a_stale_one_fails() -> None:
    assert len(module_names()) > 50 and "ragsuite.data.metrics" in module_names()
    assert "ragsuite.__main__" not in module_names()
    stale = doctest.DocTestParser().get_doctest(">>> 1 + 1\n3\n", {}, "stale", None, 0)
    runner = doctest.DocTestRunner()
    runner.run(stale, out=io.StringIO().write)
    assert runner.summarize(verbose=False).failed == 1


@pytest.mark.usefixtures("sandbox")
def test_an_example_s_environment_changes_end_with_it() -> None:
    """The redaction module's example sets OPENAI_API_KEY; after its run the variable is gone again (the
    sandbox fixture's teardown is checked by the test after this one)."""
    results, _ = run_examples("ragsuite.redaction")
    assert not results.failed and os.environ.get("OPENAI_API_KEY") == "sk-test-123456789012345"


def test_the_example_s_key_did_not_outlive_it() -> None:
    assert "OPENAI_API_KEY" not in os.environ
