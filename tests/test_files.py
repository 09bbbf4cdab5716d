"""atomic_open / atomic_write_text: a reader sees the old file or the new one, and nothing is left behind."""

from __future__ import annotations

import numpy as np
import pytest

from ragsuite.files import atomic_open, atomic_write_text


def test_write_replaces_and_leaves_no_temporary(tmp_path) -> None:
    target = tmp_path / "sub" / "out.json"
    atomic_write_text(target, "first")
    atomic_write_text(target, "second")
    assert target.read_text() == "second"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.json"]


def test_failure_keeps_the_old_file(tmp_path) -> None:
    target = tmp_path / "out.txt"
    atomic_write_text(target, "old")
    with pytest.raises(RuntimeError), atomic_open(target) as handle:
        handle.write("half of the new")
        raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_binary_mode(tmp_path) -> None:
    target = tmp_path / "emb.npy"
    with atomic_open(target, "wb") as handle:
        np.save(handle, np.arange(4))
    assert np.load(target).tolist() == [0, 1, 2, 3]
