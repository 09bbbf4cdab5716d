"""Hermetic test settings: no network, no shared caches. Environment is set before DSPy is imported."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

_TMP = Path(tempfile.mkdtemp(prefix="ragsuite-tests-"))
# litellm otherwise tries to download its model-cost map and stalls offline.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
# DSPy reads DSPY_CACHEDIR at import time; keep its disk cache out of the home directory.
os.environ["DSPY_CACHEDIR"] = str(_TMP / "dspy_cache")
# A llama-server built by `ragsuite serve --local --build` (the real-LM tests' fast engine) lives in the
# user's cache, which the tests replace by a temporary one: name it before that happens.
if not os.environ.get("RAGSUITE_LLAMA_SERVER"):
    from ragsuite.local_lm.build import built_llama_server  # imports neither dspy nor torch

    _built = built_llama_server()
    if _built is not None:
        os.environ["RAGSUITE_LLAMA_SERVER"] = str(_built)
os.environ.setdefault("RAGSUITE_CACHE", str(_TMP / "ragsuite_cache"))
# The committed fixtures (a slice of every dataset, cut by tests/fixtures/make_fixtures.py): a fresh clone has
# no other data, so no test may depend on any.
FIXTURE_DATA = Path(__file__).resolve().parent / "fixtures" / "data"
os.environ["RAGSUITE_DATA"] = str(FIXTURE_DATA)
# colbert-ai compiles C++ extensions on first use; one cache per virtual environment.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
_KEYS = ("OPENAI_API_KEY", "OPENAI_API_BASE", "OPENAI_BASE_URL", "RAGSUITE_LOCAL_API_KEY", "LLAMA_API_KEY")
for key in _KEYS:
    os.environ.pop(key, None)

import dspy  # noqa: E402
import pytest  # noqa: E402

dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The committed fixture datasets (tests/fixtures/data)."""
    return FIXTURE_DATA


@pytest.fixture(autouse=True)
def _own_redaction_registry(monkeypatch):
    """Each test starts with no registered secrets: the registry is process-wide, and a secret another test
    (or a docstring example) registered would otherwise decide what this one sees redacted."""
    from ragsuite import redaction

    monkeypatch.setattr(redaction, "_REGISTERED", set())
