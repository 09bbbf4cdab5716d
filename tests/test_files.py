"""atomic_open / atomic_write_text: a reader sees the old file or the new one, and nothing is left behind."""

from __future__ import annotations

import os
import stat

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


@pytest.mark.parametrize(("umask", "expected"), [(0o022, 0o644), (0o002, 0o664)])
def test_new_files_follow_the_umask_like_open(tmp_path, umask, expected) -> None:
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "atomic.json", "{}")
        (tmp_path / "plain.jsonl").write_text("{}\n")
        with atomic_open(tmp_path / "emb.npy", "wb") as handle:
            handle.write(b"\0")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"atomic.json": expected, "plain.jsonl": expected, "emb.npy": expected}


def test_replacing_a_file_keeps_its_mode(tmp_path) -> None:
    target = tmp_path / "shared.json"
    target.write_text("old")
    target.chmod(0o640)
    atomic_write_text(target, "new")
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640


@pytest.mark.parametrize(("umask", "expected"), [(0o022, 0o644), (0o002, 0o664)])
def test_lock_files_and_faiss_indexes_follow_the_umask_too(tmp_path, umask, expected) -> None:
    """Lock files were created 0o644 and FAISS indexes 0o600 whatever the umask: under umask 002 another
    member of the group could not lock a shared run directory or read a shared index."""
    from ragsuite.files import lock_directory
    from ragsuite.retrieval.dense import _file_lock

    try:
        import faiss
    except ImportError:  # the dense extra is not installed: the lock files are still checked
        faiss = None
    old = os.umask(umask)
    try:
        with lock_directory(tmp_path / "run"):
            pass
        with _file_lock(tmp_path / "cache" / "index.lock"):
            pass
        if faiss is not None:
            from ragsuite.retrieval.dense_index import save_index

            save_index(faiss.IndexFlatIP(4), tmp_path / "cache" / "index.faiss")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "run" / ".lock").stat().st_mode) == expected
    assert stat.S_IMODE((tmp_path / "cache" / "index.lock").stat().st_mode) == expected
    if faiss is not None:
        assert stat.S_IMODE((tmp_path / "cache" / "index.faiss").stat().st_mode) == expected
