"""ragsuite reaches no host the user did not name: the main job, run as a user runs it (no
``LITELLM_LOCAL_MODEL_COST_MAP`` in the environment), opens sockets to the ``--api-base`` server alone, and
DSPy and LiteLLM use the model price maps they ship instead of downloading them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragsuite.processes import stop_process
from ragsuite.testing.openai_server import LocalOpenAIServer

#: Loaded by the child interpreter at startup (``sitecustomize`` on PYTHONPATH): writes one line per address
#: the process resolves or connects to, whatever library does it.
AUDIT_HOOK = """
import os, sys

_LOG = os.environ["RAGSUITE_TEST_NETLOG"]


def _record(event, args):
    if event == "socket.getaddrinfo":
        host = args[0]
    elif event == "socket.connect":
        address = args[1]
        host = address[0] if isinstance(address, tuple) else "unix:" + str(address)
    else:
        return
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    with open(_LOG, "a") as log:  # "open" is an audit event too, and is not recorded
        log.write(f"{event} {host}\\n")


sys.addaudithook(_record)
"""

LOOPBACK = {"127.0.0.1", "::1", "localhost"}
#: DSPy's and LiteLLM's switch between their bundled price maps and a download from GitHub.
LOCAL_COST_MAP_ENV = "LITELLM_LOCAL_MODEL_COST_MAP"


def test_the_main_job_contacts_only_the_server_named_on_the_command_line(
    tmp_path: Path, data_dir: Path
) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(AUDIT_HOOK)
    netlog = tmp_path / "net.log"
    env = {k: v for k, v in os.environ.items() if k not in (LOCAL_COST_MAP_ENV, "LITELLM_MODEL_COST_MAP_URL")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook), env.get("PYTHONPATH")]))
    env["RAGSUITE_TEST_NETLOG"] = str(netlog)
    with LocalOpenAIServer(lambda request: {"answer": "Paris"}) as server:
        command = [sys.executable, "-m", "ragsuite", "eval", "--program", "no-retrieval",
                   "--dataset", "hotpotqa", "--data-dir", str(data_dir), "--lm", "openai/scripted",
                   "--api-base", server.api_base, "--limit", "2", "--no-progress",
                   "--out", str(tmp_path / "run")]  # fmt: skip
        process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            _, err = process.communicate(timeout=600)
        finally:
            stop_process(process)
        assert len(server.requests) >= 2  # the job ran against the named server
    assert process.returncode == 0, err
    assert "metadata refresh" not in err and "cost map" not in err, err
    lines = netlog.read_text().splitlines() if netlog.exists() else []
    hosts = {line.split(" ", 1)[1] for line in lines}
    assert lines and hosts <= LOOPBACK | {h for h in hosts if h.startswith("unix:")}, sorted(hosts)


def test_the_bundled_maps_are_chosen_unless_the_user_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    from ragsuite.offline import use_bundled_model_metadata

    monkeypatch.delenv(LOCAL_COST_MAP_ENV, raising=False)
    monkeypatch.delenv("LITELLM_MODEL_COST_MAP_URL", raising=False)
    use_bundled_model_metadata()
    assert os.environ[LOCAL_COST_MAP_ENV] == "True"
    monkeypatch.setenv(LOCAL_COST_MAP_ENV, "False")  # a user who wants the latest prices downloaded
    use_bundled_model_metadata()
    assert os.environ[LOCAL_COST_MAP_ENV] == "False"
    monkeypatch.delenv(LOCAL_COST_MAP_ENV)
    monkeypatch.setenv("LITELLM_MODEL_COST_MAP_URL", "http://prices.example/map.json")  # a host they named
    use_bundled_model_metadata()
    assert LOCAL_COST_MAP_ENV not in os.environ


def test_building_an_lm_in_a_library_chooses_the_bundled_maps(monkeypatch: pytest.MonkeyPatch) -> None:
    from ragsuite.lm import build_lm

    monkeypatch.delenv(LOCAL_COST_MAP_ENV, raising=False)
    monkeypatch.delenv("LITELLM_MODEL_COST_MAP_URL", raising=False)
    build_lm("openai/m", api_base="http://127.0.0.1:9/v1", cache=False)
    assert os.environ[LOCAL_COST_MAP_ENV] == "True"
