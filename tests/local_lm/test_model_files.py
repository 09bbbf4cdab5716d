"""Model files that changed or were crafted: a damaged file is never served under the hash it had, partial
joins of killed processes are swept, and a hostile GGUF header is one error line, never a traceback."""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from ragsuite.local_lm.models import ModelFileError, PackagedModel, read_gguf_metadata, resolve_model
from ragsuite.processes import stop_process

NAMES = ["trust_model_part1", "trust_model_part2"]


@pytest.fixture
def packaged(cache: Path, install_packaged) -> PackagedModel:
    """A packaged model whose slices are installed under ``tmp_path/site``."""
    return install_packaged("trust-test-model", NAMES)


def _flip_a_byte_keeping_the_times(path: Path) -> None:
    """Change one byte of the header's model name, then put back the access and modification times (silent
    disk corruption, or an editor that restores them): size and mtime are what they were."""
    before = path.stat()
    data = bytearray(path.read_bytes())
    at = data.index(b"Tiny")
    data[at] ^= 0x01
    with path.open("r+b") as file:
        file.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_a_packaged_model_damaged_with_its_times_restored_is_joined_again(packaged: PackagedModel) -> None:
    first = resolve_model("local:trust-test-model")
    _flip_a_byte_keeping_the_times(first.path)
    again = resolve_model("local:trust-test-model")
    assert hashlib.sha256(again.path.read_bytes()).hexdigest() == packaged.sha256


def test_a_packaged_model_damaged_with_its_slices_gone_is_refused(
    packaged: PackagedModel, tmp_path: Path
) -> None:
    first = resolve_model("local:trust-test-model")
    _flip_a_byte_keeping_the_times(first.path)
    shutil.rmtree(tmp_path / "site" / NAMES[1])
    with pytest.raises(ModelFileError, match=r"trust-model-part2==1\.0 is missing"):
        resolve_model("local:trust-test-model")


def test_a_verified_packaged_model_is_not_read_again(packaged: PackagedModel, tmp_path: Path) -> None:
    first = resolve_model("local:trust-test-model")
    resolve_model("local:trust-test-model")  # a stamp written in the same clock tick is checked once more
    shutil.rmtree(tmp_path / "site" / NAMES[1])  # a join would now fail
    assert resolve_model("local:trust-test-model").path == first.path


def test_a_gguf_path_changed_with_its_times_restored_is_hashed_again(
    tmp_path: Path, cache: Path, tiny_model
) -> None:
    path = tiny_model(tmp_path / "mine.gguf")
    first = resolve_model(f"local:{path}")
    _flip_a_byte_keeping_the_times(path)
    again = resolve_model(f"local:{path}")
    assert again.sha256 == hashlib.sha256(path.read_bytes()).hexdigest() != first.sha256
    assert again.name != first.name  # a server started for the old file is not taken for this one


def test_a_gguf_path_replaced_by_a_copy_keeping_size_and_times_is_hashed_again(
    tmp_path: Path, cache: Path, tiny_model
) -> None:
    path = tiny_model(tmp_path / "mine.gguf")
    first = resolve_model(f"local:{path}")
    other = tmp_path / "other.gguf"
    shutil.copy2(path, other)
    _flip_a_byte_keeping_the_times(other)
    shutil.copy2(other, tmp_path / "staged.gguf")  # cp -p: content and mtime of the other file
    os.utime(tmp_path / "staged.gguf", ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    os.replace(tmp_path / "staged.gguf", path)
    assert resolve_model(f"local:{path}").sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert resolve_model(f"local:{path}").sha256 != first.sha256


def test_partial_joins_of_dead_processes_are_swept_and_live_ones_kept(
    packaged: PackagedModel, cache: Path
) -> None:
    models = cache / "models"
    models.mkdir(parents=True)
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()  # reaped: its pid names no process (until the system reuses it)
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        stem = f"{packaged.name}-{packaged.sha256[:12]}"
        dead = models / f"{stem}.part{ended.pid}"
        living = models / f"{stem}.part{live.pid}"
        other_model = models / f"another-model-0123456789ab.part{ended.pid}"
        for partial in (dead, living, other_model):
            partial.write_bytes(b"\0" * 4096)
        resolve_model("local:trust-test-model")
        assert not dead.exists() and not other_model.exists()
        assert living.exists()  # a join still in progress in another process
        resolve_model("local:trust-test-model")  # and on later calls, with the model already verified
        assert living.exists()
    finally:
        stop_process(live)


# Hostile GGUF headers, built here byte by byte (little-endian, as GGUF is).
def _gguf(*entries: bytes) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(entries)) + b"".join(entries)


def _key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


HUGE = 2**64 - 1
HOSTILE = {
    "uint32-array-of-2^64-1": _gguf(_key("a") + struct.pack("<IIQ", 9, 4, HUGE)),
    "string-array-of-2^64-1": _gguf(_key("a") + struct.pack("<IIQ", 9, 8, HUGE) + _key("x") * 4),
    "array-of-arrays-of-2^64-1": _gguf(
        _key("a") + struct.pack("<IIQ", 9, 9, HUGE) + struct.pack("<IQ", 4, 0)
    ),
    "5000-nested-arrays": _gguf(_key("a") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 5000),
    "2^64-1-entries": b"GGUF" + struct.pack("<IQQ", 3, 0, HUGE) + _key("a") + struct.pack("<II", 4, 1),
    "array-count-past-the-file": _gguf(_key("a") + struct.pack("<IIQ", 9, 12, 10**9) + bytes(64)),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_gguf_header_is_a_model_file_error_naming_the_file(tmp_path: Path, case: str) -> None:
    path = tmp_path / f"{case}.gguf"
    path.write_bytes(HOSTILE[case])
    with pytest.raises(ModelFileError, match="corrupt GGUF header") as raised:
        read_gguf_metadata(path)
    assert str(path.resolve()) in str(raised.value)


@pytest.mark.parametrize("case", ["uint32-array-of-2^64-1", "5000-nested-arrays"])
@pytest.mark.parametrize("command", ["eval", "serve"])
def test_eval_and_serve_on_a_hostile_gguf_print_one_error_line(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str], case: str, command: str
) -> None:
    from ragsuite.cli import main

    path = tmp_path / "hostile.gguf"
    path.write_bytes(HOSTILE[case])
    if command == "eval":
        argv = ["eval", "--program", "no-retrieval", "--dataset", "hotpotqa", "--lm", f"local:{path}",
                "--limit", "1", "--no-cache", "--no-progress", "--out", str(tmp_path / "run")]  # fmt: skip
    else:
        argv = ["serve", "--local", str(path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "hostile.gguf" in lines[0] and "corrupt GGUF header" in lines[0]
