"""colbert-ai's C++ extensions compiled once, ahead of the tests (CI runs
``python -m ragsuite.retrieval.colbert.extensions`` before pytest), into the folder where the tests and
``ragsuite index`` load them from."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ragsuite.errors import install_hint
from ragsuite.retrieval.colbert.extensions import EXTENSIONS, default_extensions_dir, use_extensions_dir


def test_the_extensions_folder_is_the_environment_s_unless_set(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    assert default_extensions_dir() == Path(sys.prefix) / "torch_extensions"
    if os.access(sys.prefix, os.W_OK):
        assert use_extensions_dir() == Path(sys.prefix) / "torch_extensions"
        assert os.environ["TORCH_EXTENSIONS_DIR"] == str(Path(sys.prefix) / "torch_extensions")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert use_extensions_dir() == tmp_path and default_extensions_dir() == tmp_path


def test_opening_an_index_loads_the_extensions_from_the_same_folder(monkeypatch):
    pytest.importorskip("colbert", reason="needs the colbert extra: " + install_hint("colbert"))
    from ragsuite.retrieval.colbert.index import _import_colbert

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    _import_colbert()
    if os.access(sys.prefix, os.W_OK):
        assert os.environ["TORCH_EXTENSIONS_DIR"] == str(Path(sys.prefix) / "torch_extensions")


@pytest.mark.slow
@pytest.mark.timeout(1800)  # compiles them when no earlier step did: minutes on a loaded machine
def test_the_build_step_compiles_every_extension_once(tmp_path):
    pytest.importorskip("colbert", reason="needs the colbert extra: " + install_hint("colbert"))
    folder = Path(
        os.environ["TORCH_EXTENSIONS_DIR"]
    )  # tests/conftest.py's: where the colbert tests load them
    command = [sys.executable, "-m", "ragsuite.retrieval.colbert.extensions"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=1700, env=os.environ.copy())
    assert first.returncode == 0, first.stderr[-3000:]
    libraries = {name: folder / name / f"{name}.so" for name in EXTENSIONS}
    assert all(path.is_file() for path in libraries.values()), sorted(os.listdir(folder))
    assert f"colbert-ai extensions ready in {folder}" in first.stdout
    assert all(name in first.stdout for name in EXTENSIONS), first.stdout
    built = {name: path.stat().st_mtime_ns for name, path in libraries.items()}
    again = subprocess.run(command, capture_output=True, text=True, timeout=600, env=os.environ.copy())
    assert again.returncode == 0, again.stderr[-3000:]
    assert {name: path.stat().st_mtime_ns for name, path in libraries.items()} == built  # loaded, not rebuilt
